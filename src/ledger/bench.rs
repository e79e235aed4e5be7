//! `adf bench control` (issue 19's figures): what a budget adds to a model
//! call (the worst-case check before it, the settlement after), `adf
//! usage --by day` over a million ledger entries, and `adf why` on each
//! agent of a 100-agent fleet.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::{By, Entry, Ledger};
use crate::providers::Usage;
use crate::runtime::budget::Budget;

#[derive(Debug, Serialize)]
pub struct Figures {
    /// The budget check before a call, three budgets (fleet, agent, loop
    /// absent): p50 / p99 in µs.
    pub check_p50_us: f64,
    pub check_p99_us: f64,
    /// Recording a call's spend (file and ledger): p50 in µs.
    pub settle_p50_us: f64,
    pub ledger_entries: u64,
    pub fill_s: f64,
    pub usage_by_day_ms: f64,
    pub usage_by_agent_since_ms: f64,
    pub why_agents: usize,
    pub why_p50_ms: f64,
    pub why_max_ms: f64,
}

fn pct(mut v: Vec<Duration>, p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).map(|d| d.as_secs_f64() * 1e6).unwrap_or(0.0)
}

/// A folder removed when the bench ends, however it ends.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run(iterations: usize, entries: u64) -> anyhow::Result<Figures> {
    let dir = Scratch(std::env::temp_dir().join(format!("adf-bench-control-{}", std::process::id())));
    std::fs::create_dir_all(dir.path())?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let guard = rt.enter();

    // The budget check and the settlement, on a real agent file.
    let ledger = Arc::new(Ledger::new(dir.path().join("usage.db"), None));
    let prices = [("m".to_string(), crate::providers::prices::Price { input: 1.0, output: 2.0, ..Default::default() })]
        .into_iter()
        .collect();
    ledger.set_settings(
        prices,
        Some(Budget { usd_day: Some(1e9), tokens_day: Some(u64::MAX / 4), ..Default::default() }),
    );
    let (mut store, _) = crate::store::Store::create(
        dir.path().join("b.adf"),
        &crate::store::NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )?;
    let mut cfg = store.config_value()?;
    cfg["limits"]["budget"] = json!({"usd_day": 1e9, "tokens_total": 1_000_000_000_000_000u64});
    store.config_replace(cfg.clone())?;
    let provider = Arc::new(crate::providers::scripted::Scripted::new([]));
    let bus = crate::runtime::bus::Bus::new();
    let mut ex =
        crate::runtime::executor::Executor::new(store, provider, bus, Arc::new(crate::runtime::executor::Absent))?;
    ex.set_ledger(Some(ledger.clone()));
    let usage = Usage { input: 1000, output: 100, ..Default::default() };
    let (mut check, mut settle) = (Vec::new(), Vec::new());
    for i in 0..iterations.max(10) * 10 {
        let t = Instant::now();
        let budgets = ex.budgets(&cfg);
        let over = ex.check_budgets(budgets, "m", 1000, 100)?;
        check.push(t.elapsed());
        anyhow::ensure!(over.is_none(), "the bench's budgets are never reached");
        let t = Instant::now();
        ex.settle_spend(&cfg, "m", &usage, "turn")?;
        settle.push(t.elapsed());
        // The turn's next row commits the spend, as in a turn.
        if i % 10 == 9 {
            ex.store.meta_set(crate::store::Caller::Owner, "bench", &i.to_string(), None)?;
        }
    }
    ledger.flush();
    drop(ex);
    drop(guard);
    drop(rt);

    // A million entries: 20 agents, 3 models, 2 providers over 180 days.
    let big = dir.path().join("big.db");
    let mut conn = super::db::open(&big)?.conn;
    let t = Instant::now();
    let day0 = chrono::Utc::now().timestamp_millis() - 180 * 86_400_000;
    let mut batch = Vec::with_capacity(10_000);
    for n in 0..entries {
        batch.push(Entry {
            ts_ms: day0 + (n as i64 * 180 * 86_400_000) / entries as i64,
            agent_id: format!("did:key:agent{}", n % 20),
            agent: format!("agent-{}", n % 20),
            file: String::new(),
            loop_name: "main".into(),
            provider: if n % 2 == 0 { "anthropic".into() } else { "openai".into() },
            model: format!("model-{}", n % 3),
            call_source: "turn",
            usage,
            cost: Some((0.0012, crate::providers::prices::SOURCE)),
        });
        if batch.len() == 10_000 {
            super::db::write(&mut conn, &batch)?;
            batch.clear();
        }
    }
    super::db::write(&mut conn, &batch)?;
    let fill_s = t.elapsed().as_secs_f64();
    drop(conn);
    let l = Ledger::new(big, None);
    let time = |by: By, since: Option<&str>| -> anyhow::Result<f64> {
        let mut v = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let rows = l.report(by, since)?;
            v.push(t.elapsed());
            anyhow::ensure!(!rows.is_empty());
        }
        Ok(pct(v, 0.5) / 1000.0)
    };
    let usage_by_day_ms = time(By::Day, None)?;
    let since = super::day_of(day0 + 90 * 86_400_000);
    let usage_by_agent_since_ms = time(By::Agent, Some(&since))?;

    // `adf why` on each of 100 agents (opened, explained, closed).
    let fleet = dir.path().join("fleet");
    std::fs::create_dir_all(&fleet)?;
    let mut paths = Vec::new();
    for i in 0..100 {
        let p = fleet.join(format!("a{i}.adf"));
        let (s, _) = crate::store::Store::create(&p, &crate::store::NewAgent::default())?;
        s.close()?;
        paths.push(p);
    }
    let mut why = Vec::new();
    for p in &paths {
        let t = Instant::now();
        let s = crate::store::Store::open_read_only(p)?;
        let v = crate::runtime::why::explain(&s, None)?;
        drop(s);
        why.push(t.elapsed());
        anyhow::ensure!(v.is_object());
    }
    let why_max_ms = why.iter().max().map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0);
    Ok(Figures {
        check_p50_us: pct(check.clone(), 0.5),
        check_p99_us: pct(check, 0.99),
        settle_p50_us: pct(settle, 0.5),
        ledger_entries: entries,
        fill_s,
        usage_by_day_ms,
        usage_by_agent_since_ms,
        why_agents: paths.len(),
        why_p50_ms: pct(why, 0.5) / 1000.0,
        why_max_ms,
    })
}
