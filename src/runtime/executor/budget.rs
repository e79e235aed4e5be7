//! Budgets in the turn loop (issue 19, see `runtime::budget`): before each
//! model call the call's worst case is checked against the agent's budget
//! and the running side loop's; a call that would cross one is not made and
//! the turn ends suspended with a notice naming the budget. Each call's real
//! spend is recorded per scope when a budget applies.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{CachedConfig, Executor, TurnEnd};
use crate::ledger::Entry;
use crate::protocol::kind;
use crate::providers::prices::Prices;
use crate::providers::{ModelRequest, Usage};
use crate::runtime::budget::{self, Budget, Exceeded};
use crate::store::StoreError;

impl Executor {
    /// The budgets that apply now: the fleet's (settings.json), the
    /// agent's, and the side loop's.
    pub(crate) fn budgets(&self, cfg: &Value) -> Vec<(String, Budget)> {
        let mut out = Vec::new();
        if let Some(b) = self.ledger.as_ref().and_then(|l| l.settings().1) {
            out.push((budget::FLEET.to_string(), b));
        }
        if let Some(b) = Budget::of(cfg) {
            out.push(("agent".to_string(), b));
        }
        if let Some(side) = &self.loops.side
            && let Some(b) = side.def.budget.as_ref().and_then(Budget::from_value)
        {
            out.push((format!("loop:{}", side.def.name), b));
        }
        out
    }

    /// The first budget this request's worst case would cross, if any (no
    /// budget set: no work at all).
    pub(super) fn over_budget(&mut self, c: &CachedConfig, req: &ModelRequest) -> Result<Option<Exceeded>, StoreError> {
        let budgets = self.budgets(&c.value);
        if budgets.is_empty() {
            return Ok(None);
        }
        let fresh = (self.session()?.chars as usize + req.system.len() + c.tool_chars).div_ceil(4) as u64;
        let input = fresh.max(self.token_count()?);
        self.check_budgets(budgets, &req.model, input, req.max_tokens)
    }

    /// The first of `budgets` a call of `input` tokens in and at most
    /// `max_out` out would cross.
    pub(crate) fn check_budgets(
        &mut self,
        budgets: Vec<(String, Budget)>,
        model: &str,
        input: u64,
        max_out: u64,
    ) -> Result<Option<Exceeded>, StoreError> {
        let worst = Usage { input, output: max_out, ..Default::default() };
        let usd = crate::providers::prices::cost(&self.price_list(), model, &worst);
        // A hold from a call that never settled (it failed) goes first.
        self.fleet_hold = None;
        let mut fleet = None;
        for (scope, b) in &budgets {
            if scope == budget::FLEET {
                fleet = Some(*b);
                continue;
            }
            let spent = self.store.spent(scope)?;
            if let Err(e) = budget::check(scope, b, &spent, usd, input + worst.output) {
                return Ok(Some(e));
            }
        }
        // The fleet's last: its worst case is held until the call settles.
        if let (Some(b), Some(l)) = (fleet, &self.ledger) {
            match l.reserve(&b, usd, input + worst.output) {
                Ok(hold) => self.fleet_hold = Some(hold),
                Err(e) => return Ok(Some(e)),
            }
        }
        Ok(None)
    }

    /// The price list: one set by hand, else settings.json's through the
    /// ledger.
    pub(super) fn price_list(&self) -> Arc<Prices> {
        match &self.ledger {
            Some(l) if self.prices.is_empty() => l.settings().0,
            _ => self.prices.clone(),
        }
    }

    /// Record a call's spend: in the file for the agent and the running
    /// side loop (what `adf usage FILE` and the budgets read, compaction or
    /// not), and in the app-wide ledger.
    pub(crate) fn settle_spend(
        &mut self,
        cfg: &Value,
        model: &str,
        usage: &Usage,
        call_source: &'static str,
    ) -> Result<(), StoreError> {
        let cost = crate::providers::prices::priced(&self.price_list(), model, usage);
        let tokens = usage.total();
        let mut scopes: Vec<&str> = vec!["agent"];
        let side = self.loops.side.as_ref().map(|s| s.def.name.clone());
        let side_scope = side.as_ref().map(|s| format!("loop:{s}"));
        if let Some(s) = &side_scope {
            scopes.push(s);
        }
        // Committed with the row this call produced: no commit of its own.
        self.store.spend_defer(&scopes, cost.map(|c| c.0).unwrap_or(0.0), tokens);
        if let Some(l) = &self.ledger {
            l.record(Entry {
                ts_ms: chrono::Utc::now().timestamp_millis(),
                agent_id: self.agent_id.clone(),
                agent: cfg.get("name").and_then(Value::as_str).unwrap_or("").to_string(),
                file: self.store.path().display().to_string(),
                loop_name: side.unwrap_or_else(|| "main".into()),
                provider: self.provider.id().to_string(),
                model: model.to_string(),
                call_source,
                usage: *usage,
                cost,
            });
        }
        // Settled: the real figure (recorded above) replaces the worst case.
        self.fleet_hold = None;
        Ok(())
    }

    /// The call is not made: say why in the loop, the log and on the bus,
    /// and end the turn suspended (a side loop is paused).
    pub(super) fn budget_stop(&mut self, e: &Exceeded, source: &str) -> Result<TurnEnd, StoreError> {
        let notice = e.notice(&self.store.path().display().to_string());
        self.user_text(&notice)?;
        self.log("warn", "executor", "budget_exceeded", &notice)?;
        self.emit(
            kind::SUSPEND_REQUESTED,
            source,
            json!({"reason": "budget", "budget": e.which, "scope": e.scope, "limit": e.limit, "spent": e.spent,
                   "need": e.need, "message": notice}),
        );
        if self.loops.side.is_some() {
            self.loops.budget_hit = true;
        }
        Ok(TurnEnd::Suspended)
    }
}
