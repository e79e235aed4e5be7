//! Budgets that stop spend before it happens (issue 19): `limits.budget`
//! in an agent's config (and a side loop's own), in dollars or tokens, per
//! day (UTC) and in total. Before each model call the executor prices the
//! call's worst case (the input as it stands plus `max_tokens` of output)
//! and checks it against every budget that applies; a call that would cross
//! one does not happen. Spent amounts are settled with the real usage and
//! kept in the file (`store::spend`), so they survive restarts.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::store::spend::Spent;

/// The scope of the fleet's budget (`budget` in settings.json).
pub const FLEET: &str = "fleet";

/// One budget (any part may be absent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usd_day: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usd_total: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_day: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_total: Option<u64>,
}

impl Budget {
    /// `limits.budget` of a config (`None`: no budget set).
    pub fn of(cfg: &Value) -> Option<Budget> {
        Self::from_value(cfg.get("limits")?.get("budget")?)
    }

    /// A budget as the owner typed it, checked as `limits.budget` is:
    /// dollars are numbers, tokens whole numbers, all at least 0, nothing
    /// else. `whose` names it in the error.
    pub fn parse(v: &Value, whose: &str) -> Result<Budget, String> {
        parse(v, whose)
    }

    pub fn from_value(v: &Value) -> Option<Budget> {
        let b: Budget = serde_json::from_value(v.clone()).ok()?;
        (b != Budget::default()).then_some(b)
    }

    fn wants_price(&self) -> bool {
        self.usd_day.is_some() || self.usd_total.is_some()
    }
}

/// A call that would cross a budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Exceeded {
    /// `agent` or `loop:<name>`.
    pub scope: String,
    /// `usd_day`, `usd_total`, `tokens_day`, `tokens_total`, or `usd` when
    /// the model has no price to check a dollar budget with.
    pub which: &'static str,
    pub limit: f64,
    pub spent: f64,
    pub need: f64,
}

impl Exceeded {
    /// The notice the owner and the loop see.
    pub fn notice(&self, file: &str) -> String {
        let whose = if self.scope == FLEET {
            "the fleet's budget (settings.json)".to_string()
        } else if self.scope == "agent" {
            "limits.budget".to_string()
        } else {
            format!("loop {}'s budget", self.scope.trim_start_matches("loop:"))
        };
        let raise = if self.scope == FLEET {
            format!("adf budget set '{{\"{}\": {}}}'", self.which, suggest(self.limit, self.need))
        } else if self.scope == "agent" {
            format!("adf config set {file} limits.budget '{{\"{}\": {}}}'", self.which, suggest(self.limit, self.need))
        } else {
            format!(
                "adf loops budget {file} {} '{{\"{}\": {}}}'",
                self.scope.trim_start_matches("loop:"),
                self.which,
                suggest(self.limit, self.need)
            )
        };
        if self.which == "usd" {
            return format!(
                "[Budget] {whose} is in dollars, but this model has no price, so the call's cost cannot be bounded; \
                 the call was not made. Add the model's price to settings.json (\"prices\") or set a token budget."
            );
        }
        let (unit, fmt) = if self.which.starts_with("usd") { ("$", 4) } else { ("", 0) };
        let per = if self.which.ends_with("_day") { " today" } else { " in total" };
        format!(
            "[Budget] {whose}.{} of {unit}{:.fmt$} reached: {unit}{:.fmt$} spent{per}, and this call could use up to \
             {unit}{:.fmt$} more, so it was not made. Raise it with: {raise}",
            self.which, self.limit, self.spent, self.need
        )
    }
}

/// See `Budget::parse`.
pub fn parse(b: &Value, whose: &str) -> Result<Budget, String> {
    let issues = crate::store::config::validate(&serde_json::json!({"limits": {"budget": b}}));
    let bad: Vec<String> = issues
        .into_iter()
        .filter(|i| i.path.starts_with("limits.budget"))
        .map(|i| format!("{} {}", i.path.replacen("limits.budget", "budget", 1), i.message))
        .collect();
    if !b.is_object() || !bad.is_empty() {
        return Err(format!(
            "{whose} {b} is not valid{}: use {{\"usd_day\", \"usd_total\", \"tokens_day\", \"tokens_total\"}}",
            if bad.is_empty() { String::new() } else { format!(" ({})", bad.join("; ")) }
        ));
    }
    serde_json::from_value(b.clone()).map_err(|e| format!("{whose} {b} is not valid: {e}"))
}

fn suggest(limit: f64, need: f64) -> String {
    let v = (limit * 2.0).max(limit + need);
    if v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v:.2}") }
}

/// Check a call costing at most `usd` (unknown: `None`) and `tokens`
/// against `budget` after what `scope` has `spent`.
pub fn check(scope: &str, budget: &Budget, spent: &Spent, usd: Option<f64>, tokens: u64) -> Result<(), Exceeded> {
    let over = |which, limit: f64, spent: f64, need: f64| {
        Err(Exceeded { scope: scope.to_string(), which, limit, spent, need })
    };
    if budget.wants_price() && usd.is_none() {
        return over("usd", budget.usd_day.or(budget.usd_total).unwrap_or(0.0), spent.usd_day, 0.0);
    }
    let usd = usd.unwrap_or(0.0);
    if let Some(l) = budget.usd_day
        && spent.usd_day + usd > l
    {
        return over("usd_day", l, spent.usd_day, usd);
    }
    if let Some(l) = budget.usd_total
        && spent.usd_total + usd > l
    {
        return over("usd_total", l, spent.usd_total, usd);
    }
    if let Some(l) = budget.tokens_day
        && spent.tokens_day + tokens > l
    {
        return over("tokens_day", l as f64, spent.tokens_day as f64, tokens as f64);
    }
    if let Some(l) = budget.tokens_total
        && spent.tokens_total + tokens > l
    {
        return over("tokens_total", l as f64, spent.tokens_total as f64, tokens as f64);
    }
    Ok(())
}

/// A budget that applies to the file and what its scope spent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BudgetUse {
    pub scope: String,
    pub budget: Budget,
    pub spent: crate::store::spend::Spent,
}

/// The agent's budget and each side loop's, with what they spent.
pub fn in_use(store: &crate::store::Store) -> Result<Vec<BudgetUse>, crate::store::StoreError> {
    let mut out = Vec::new();
    if let Some(b) = Budget::of(&store.config_value()?) {
        out.push(BudgetUse { scope: "agent".into(), budget: b, spent: store.spent("agent")? });
    }
    for d in store.loops_list()? {
        if let Some(b) = d.budget.as_ref().and_then(Budget::from_value) {
            let scope = format!("loop:{}", d.name);
            let spent = store.spent(&scope)?;
            out.push(BudgetUse { scope, budget: b, spent });
        }
    }
    Ok(out)
}

impl BudgetUse {
    /// The part nearest its limit: (name, spent / limit).
    pub fn tightest(&self) -> Option<(&'static str, f64)> {
        let (b, s) = (&self.budget, &self.spent);
        [
            ("usd_day", b.usd_day.map(|l| (s.usd_day, l))),
            ("usd_total", b.usd_total.map(|l| (s.usd_total, l))),
            ("tokens_day", b.tokens_day.map(|l| (s.tokens_day as f64, l as f64))),
            ("tokens_total", b.tokens_total.map(|l| (s.tokens_total as f64, l as f64))),
        ]
        .into_iter()
        .filter_map(|(k, p)| p.map(|(spent, limit)| (k, if limit > 0.0 { spent / limit } else { 1.0 })))
        .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_worst_case_is_checked_against_every_part() {
        let b = Budget::of(&json!({"limits": {"budget": {"usd_day": 2.0, "tokens_total": 10_000}}})).unwrap();
        let spent = Spent { usd_day: 1.9, tokens_day: 0, usd_total: 5.0, tokens_total: 9_000 };
        assert!(check("agent", &b, &spent, Some(0.05), 500).is_ok());
        let e = check("agent", &b, &spent, Some(0.2), 500).unwrap_err();
        assert_eq!((e.which, e.limit), ("usd_day", 2.0));
        assert!(e.notice("a.adf").contains("limits.budget.usd_day of $2.0000 reached"), "{}", e.notice("a.adf"));
        assert!(e.notice("a.adf").contains("adf config set a.adf limits.budget '{\"usd_day\": 4}'"));
        let fleet = check(FLEET, &b, &spent, Some(0.2), 1).unwrap_err().notice("a.adf");
        assert!(fleet.contains("the fleet's budget (settings.json).usd_day"), "{fleet}");
        assert!(fleet.contains("adf budget set '{\"usd_day\": 4}'"), "{fleet}");
        let e = check("loop:crit", &b, &spent, Some(0.01), 2_000).unwrap_err();
        assert_eq!(e.which, "tokens_total");
        assert!(e.notice("a.adf").contains("loop crit's budget"));
        assert_eq!(check("agent", &b, &spent, None, 1).unwrap_err().which, "usd", "no price, no dollar bound");
        let tokens_only = Budget { tokens_day: Some(100), ..Default::default() };
        assert!(check("agent", &tokens_only, &Spent::default(), None, 100).is_ok());
        assert!(check("agent", &tokens_only, &Spent::default(), None, 101).is_err());
        assert_eq!(Budget::of(&json!({"limits": {"budget": {}}})), None);
        assert_eq!(Budget::of(&json!({})), None);
    }
}
