//! `adf usage`: the app-wide ledger grouped by day, provider, model or
//! agent (`--by`, `--since`); `adf usage PATH`: one agent file, per model
//! from its loop rows, with what compaction summarised away taken from the
//! file's spend record; `adf budget`: the fleet's budget in settings.json.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::output::{Out, at, close, open_for_read};
use crate::ledger::{By, Row};
use crate::providers::{Usage, accounts, prices};
use crate::runtime::budget::Budget;
use crate::store::spend::Spent;

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
    let recorded = store.spent("agent").map_err(|e| at(path, e))?;
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
            cost: None,
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
    // The file's spend record counts every call (compaction summaries
    // included); the loop rows only what compaction left.
    let in_rows: u64 =
        by_model.values().map(|u| u.input_tokens + u.output_tokens + u.cache_read_tokens + u.cache_write_tokens).sum();
    let compacted = recorded.tokens_total.saturating_sub(in_rows);
    if out.json {
        return out.json(&serde_json::json!({"models": by_model, "cost_source": prices::SOURCE, "budgets": budgets,
            "recorded": recorded, "compacted_tokens": compacted}));
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
    let mut rows = rows;
    if compacted > 0 {
        rows.push(vec!["(summarised away)".into(), "-".into(), format!("{compacted} tokens"), "-".into(), "-".into()]);
    }
    out.table(&["MODEL", "CALLS", "INPUT", "OUTPUT", "COST"], &rows)?;
    if recorded.tokens_total > 0 {
        out.line(format!(
            "recorded in the file: {} tokens, ${:.4} in total; {} tokens, ${:.4} today",
            recorded.tokens_total, recorded.usd_total, recorded.tokens_day, recorded.usd_day
        ))?;
    }
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

/// `--since`: a UTC day (`YYYY-MM-DD`), `today`, or `N` days back (`7d`).
pub fn since_day(s: &str) -> anyhow::Result<String> {
    let today = chrono::Utc::now().date_naive();
    let t = s.trim();
    if t == "today" {
        return Ok(today.format("%Y-%m-%d").to_string());
    }
    if let Some(n) = t.strip_suffix('d').and_then(|n| n.parse::<u32>().ok()) {
        let d = today - chrono::Days::new(u64::from(n));
        return Ok(d.format("%Y-%m-%d").to_string());
    }
    // A day as a lower bound: 2026-02-31 is still after 2026-02-30.
    let shaped = |t: &str| {
        let b = t.as_bytes();
        let num = |r: std::ops::Range<usize>| t.get(r).and_then(|x| x.parse::<u32>().ok());
        b.len() == 10
            && b[4] == b'-'
            && b[7] == b'-'
            && t.bytes().enumerate().all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
            && num(5..7).is_some_and(|m| (1..=12).contains(&m))
            && num(8..10).is_some_and(|d| (1..=31).contains(&d))
    };
    if shaped(t) {
        return Ok(t.to_string());
    }
    chrono::NaiveDate::parse_from_str(t, "%Y-%m-%d")
        .map(|d| d.format("%Y-%m-%d").to_string())
        .map_err(|_| anyhow::anyhow!("--since {s:?} is not a day: use YYYY-MM-DD, \"today\" or N days back (\"7d\")"))
}

/// `adf usage [--by …] [--since …]`: the app-wide ledger.
pub fn ledger(out: &Out, by: By, since: Option<&str>) -> anyhow::Result<()> {
    let since = since.map(since_day).transpose()?;
    let l = crate::ledger::enable();
    let rows = l.report(by, since.as_deref())?;
    if let Some(n) = l.take_notice() {
        eprintln!("adf: {n}");
    }
    let (_, fleet_budget) = l.settings();
    let spent = l.fleet_spent();
    let total = rows.iter().fold(Row::default(), |mut t, r| {
        t.calls += r.calls;
        t.input_tokens += r.input_tokens;
        t.output_tokens += r.output_tokens;
        t.cache_read_tokens += r.cache_read_tokens;
        t.cache_write_tokens += r.cache_write_tokens;
        t.cost_usd += r.cost_usd;
        t.unpriced_calls += r.unpriced_calls;
        t
    });
    if out.json {
        return out.json(&serde_json::json!({
            "by": by, "since": since, "rows": rows, "total": total, "ledger": l.path(),
            "fleet": {"budget": fleet_budget, "spent": spent},
        }));
    }
    let head = match by {
        By::Day => "DAY",
        By::Provider => "PROVIDER",
        By::Model => "MODEL",
        By::Agent => "AGENT",
    };
    let line = |key: String, r: &Row| {
        vec![
            key,
            r.calls.to_string(),
            r.input_tokens.to_string(),
            r.output_tokens.to_string(),
            (r.cache_read_tokens + r.cache_write_tokens).to_string(),
            if r.unpriced_calls == r.calls && r.calls > 0 { "-".into() } else { format!("${:.4}", r.cost_usd) },
        ]
    };
    let mut table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let key = match (&r.name, by) {
                (Some(n), By::Agent) if !n.is_empty() => format!("{n} ({})", short_id(&r.key)),
                _ if r.key.is_empty() => "(none)".into(),
                _ => r.key.clone(),
            };
            line(key, r)
        })
        .collect();
    if rows.is_empty() {
        out.line(format!("no model calls recorded yet (ledger: {})", l.path().display()))?;
    } else {
        table.push(line("TOTAL".into(), &total));
        out.table(&[head, "CALLS", "INPUT", "OUTPUT", "CACHE", "COST"], &table)?;
        if total.unpriced_calls > 0 {
            out.line(format!(
                "({} call(s) had no price: add the model to \"prices\" in {})",
                total.unpriced_calls,
                accounts::settings_path().display()
            ))?;
        }
    }
    if let Some(b) = fleet_budget {
        out.line(format!("fleet budget: {}", budget_line(&b, &spent)))?;
    }
    Ok(())
}

fn short_id(id: &str) -> &str {
    let tail = id.len().saturating_sub(8);
    id.get(tail..).unwrap_or(id)
}

/// "usd_day $1.20 of $5.00 · tokens_total 12000 of 100000".
fn budget_line(b: &Budget, s: &Spent) -> String {
    let mut parts = Vec::new();
    if let Some(l) = b.usd_day {
        parts.push(format!("usd_day ${:.4} of ${l:.2}", s.usd_day));
    }
    if let Some(l) = b.usd_total {
        parts.push(format!("usd_total ${:.4} of ${l:.2}", s.usd_total));
    }
    if let Some(l) = b.tokens_day {
        parts.push(format!("tokens_day {} of {l}", s.tokens_day));
    }
    if let Some(l) = b.tokens_total {
        parts.push(format!("tokens_total {} of {l}", s.tokens_total));
    }
    parts.join(" · ")
}

/// `adf budget …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum BudgetCmd {
    /// The fleet's budget and what the fleet spent (the default).
    Show,
    /// Set it: '{"usd_day": 20, "tokens_total": 50000000}'.
    Set { budget: String },
    /// Remove it.
    Clear,
}

pub fn budget(out: &Out, cmd: Option<&BudgetCmd>) -> anyhow::Result<()> {
    let path = accounts::settings_path();
    match cmd {
        Some(BudgetCmd::Set { budget }) => {
            let v: serde_json::Value = serde_json::from_str(budget).map_err(|e| {
                anyhow::anyhow!(
                    "the fleet budget is not JSON: {e} (e.g. '{{\"usd_day\": 20}}'); settings.json unchanged"
                )
            })?;
            let b = Budget::parse(&v, "the fleet budget")
                .map_err(|e| anyhow::anyhow!("{e}; {} unchanged", path.display()))?;
            let mut s = accounts::load().map_err(anyhow::Error::msg)?;
            s.extra.insert("budget".into(), serde_json::to_value(b)?);
            accounts::save(&s).map_err(anyhow::Error::msg)?;
        }
        Some(BudgetCmd::Clear) => {
            let mut s = accounts::load().map_err(anyhow::Error::msg)?;
            if s.extra.remove("budget").is_some() {
                accounts::save(&s).map_err(anyhow::Error::msg)?;
            }
        }
        Some(BudgetCmd::Show) | None => {}
    }
    let s = accounts::load().map_err(anyhow::Error::msg)?;
    let b = s.extra.get("budget").and_then(Budget::from_value);
    let spent = crate::ledger::enable().fleet_spent();
    if out.json {
        return out.json(&serde_json::json!({"budget": b, "spent": spent, "settings": path}));
    }
    match b {
        Some(b) => out.line(format!("fleet budget: {}", budget_line(&b, &spent))),
        None => out.line(format!(
            "no fleet budget (spent ${:.4} / {} tokens today, ${:.4} / {} tokens in total); set one with: adf budget set '{{\"usd_day\": 20}}'",
            spent.usd_day, spent.tokens_day, spent.usd_total, spent.tokens_total
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_day_today_or_days_back_and_refuses_the_rest() {
        assert_eq!(since_day("2026-03-04").unwrap(), "2026-03-04");
        assert_eq!(since_day("2026-02-31").unwrap(), "2026-02-31", "a lower bound, compared as text");
        let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
        assert_eq!(since_day("today").unwrap(), today);
        assert_eq!(since_day("0d").unwrap(), today);
        assert!(since_day("7d").unwrap() < today);
        assert_eq!(since_day("2026-1-1").unwrap(), "2026-01-01", "written out");
        for bad in ["yesterday", "2026-13-01", "-3d", "", "2026-03-04x"] {
            let e = since_day(bad).unwrap_err().to_string();
            assert!(e.contains("is not a day"), "{bad}: {e}");
        }
    }
}
