//! Budgets in the turn loop (issue 19, see `runtime::budget`): before each
//! model call the call's worst case is checked against the agent's budget
//! and the running side loop's; a call that would cross one is not made and
//! the turn ends suspended with a notice naming the budget. Each call's real
//! spend is recorded per scope when a budget applies.

use serde_json::{Value, json};

use super::{CachedConfig, Executor, TurnEnd};
use crate::protocol::kind;
use crate::providers::{ModelRequest, Usage};
use crate::runtime::budget::{self, Budget, Exceeded};
use crate::store::StoreError;

impl Executor {
    /// The budgets that apply now: the agent's, and the side loop's.
    fn budgets(&self, cfg: &Value) -> Vec<(String, Budget)> {
        let mut out = Vec::new();
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
        let worst = Usage { input, output: req.max_tokens, ..Default::default() };
        let usd = crate::providers::prices::cost(&self.prices, &req.model, &worst);
        for (scope, b) in &budgets {
            let spent = self.store.spent(scope)?;
            if let Err(e) = budget::check(scope, b, &spent, usd, input + worst.output) {
                return Ok(Some(e));
            }
        }
        Ok(None)
    }

    /// Record a call's spend against every scope a budget watches.
    pub(super) fn settle_spend(&mut self, cfg: &Value, model: &str, usage: &Usage) -> Result<(), StoreError> {
        let budgets = self.budgets(cfg);
        if budgets.is_empty() {
            return Ok(());
        }
        let usd = crate::providers::prices::cost(&self.prices, model, usage).unwrap_or(0.0);
        let tokens = usage.input + usage.output + usage.cache_read.unwrap_or(0) + usage.cache_write.unwrap_or(0);
        let mut scopes: Vec<&str> = vec!["agent"];
        let side = self.loops.side.as_ref().map(|s| format!("loop:{}", s.def.name));
        if let Some(s) = &side {
            scopes.push(s);
        }
        // Committed with the row this call produced: no commit of its own.
        self.store.spend_defer(&scopes, usd, tokens);
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
