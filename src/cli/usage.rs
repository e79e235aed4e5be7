//! `adf usage PATH`: the usage ledger of an agent file, from its loop rows:
//! calls and tokens per model, and the cost where the owner's price list
//! (`prices` in settings.json) knows the model.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::output::{Out, at, close, open_for_read};
use crate::providers::{Usage, accounts, prices};

#[derive(Debug, Default, Serialize)]
struct ModelUsage {
    calls: u64,
    input_tokens: u64,
    output_tokens: u64,
    cache_read_tokens: u64,
    cache_write_tokens: u64,
    cost_usd: Option<f64>,
}

pub fn run(out: &Out, path: &Path) -> anyhow::Result<()> {
    let store = open_for_read(path)?;
    let rows = store.loop_rows(None).map_err(|e| at(path, e))?;
    let budgets = crate::runtime::budget::in_use(&store).map_err(|e| at(path, e))?;
    close(store)?;
    let price_list = accounts::load().map(|s| prices::from_settings(&s)).unwrap_or_default();
    let mut by_model: BTreeMap<String, ModelUsage> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.role == "assistant") {
        let model = r.model.clone().unwrap_or_else(|| "(unknown)".into());
        let t = r.tokens.as_ref();
        let n = |k: &str| t.and_then(|t| t.get(k)).and_then(|v| v.as_u64()).unwrap_or(0);
        let u = Usage {
            input: n("input"),
            output: n("output"),
            cache_read: Some(n("cache_read")),
            cache_write: Some(n("cache_write")),
            reasoning: None,
        };
        let e = by_model.entry(model.clone()).or_default();
        e.calls += 1;
        e.input_tokens += u.input;
        e.output_tokens += u.output;
        e.cache_read_tokens += n("cache_read");
        e.cache_write_tokens += n("cache_write");
        if let Some(c) = prices::cost(&price_list, &model, &u) {
            e.cost_usd = Some(e.cost_usd.unwrap_or(0.0) + c);
        }
    }
    if out.json {
        return out.json(&serde_json::json!({"models": by_model, "cost_source": prices::SOURCE, "budgets": budgets}));
    }
    let rows: Vec<Vec<String>> = by_model
        .iter()
        .map(|(m, u)| {
            vec![
                m.clone(),
                u.calls.to_string(),
                u.input_tokens.to_string(),
                u.output_tokens.to_string(),
                u.cost_usd.map(|c| format!("${c:.4}")).unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    out.table(&["MODEL", "CALLS", "INPUT", "OUTPUT", "COST"], &rows)?;
    if by_model.values().any(|u| u.cost_usd.is_none()) {
        out.line(format!("(costs need prices for the model in {})", accounts::settings_path().display()))?;
    }
    if !budgets.is_empty() {
        out.line("")?;
        let rows: Vec<Vec<String>> = budgets
            .iter()
            .map(|b| {
                let part = |limit: Option<f64>, spent: f64, usd: bool| match limit {
                    Some(l) if usd => format!("${spent:.4} of ${l:.2}"),
                    Some(l) => format!("{spent:.0} of {l:.0}"),
                    None => "-".into(),
                };
                let (bud, sp) = (&b.budget, &b.spent);
                vec![
                    b.scope.clone(),
                    part(bud.usd_day, sp.usd_day, true),
                    part(bud.usd_total, sp.usd_total, true),
                    part(bud.tokens_day.map(|t| t as f64), sp.tokens_day as f64, false),
                    part(bud.tokens_total.map(|t| t as f64), sp.tokens_total as f64, false),
                ]
            })
            .collect();
        out.table(&["BUDGET", "USD TODAY", "USD TOTAL", "TOKENS TODAY", "TOKENS TOTAL"], &rows)?;
    }
    Ok(())
}
