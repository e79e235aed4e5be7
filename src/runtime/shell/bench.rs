//! `adf bench shell`: the shell's hot paths on a real agent file —
//! `cat | grep | wc` over 1 MB, `jq` over 1 MB of JSON, and `sqlite3`
//! through the SQL guard against the same query bare. Reported, never
//! asserted (shared machines are noisy).

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde_json::{Value, json};

use crate::runtime::bus::Bus;
use crate::runtime::executor::{Absent, Executor};
use crate::store::files::WriteOptions;
use crate::store::{Caller, NewAgent, Store};

#[derive(Debug, Serialize)]
pub struct Report {
    pub cat_grep_wc_1mb_p50_ms: f64,
    pub cat_grep_wc_1mb_p99_ms: f64,
    /// `map(select(…)) | length`: every element through a filter.
    pub jq_1mb_p50_ms: f64,
    pub jq_1mb_p99_ms: f64,
    /// `.[4242].name`: one lookup (reading the 1 MB dominates).
    pub jq_lookup_1mb_p50_ms: f64,
    pub sqlite3_p50_us: f64,
    pub bare_query_p50_us: f64,
    pub sqlite3_over_bare_us: f64,
}

/// The `p` quantile (0..=1) of samples.
pub(crate) fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

async fn time(ex: &mut Executor, cmd: &str, want: &str) -> anyhow::Result<f64> {
    let s = Instant::now();
    let out = ex.adf_shell(&json!({"command": cmd}), "bench", false, false).await;
    let ms = s.elapsed().as_secs_f64() * 1e3;
    let v: Value = serde_json::from_str(&out.content)?;
    anyhow::ensure!(v["stdout"].as_str().is_some_and(|s| s.contains(want)), "{cmd}: {}", out.content);
    Ok(ms)
}

pub fn run(iterations: usize) -> anyhow::Result<Report> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run_async(iterations.clamp(10, 10_000)))
}

async fn run_async(n: usize) -> anyhow::Result<Report> {
    let dir = std::env::temp_dir().join(format!("adf-bench-shell-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("shell.adf");
    let _ = std::fs::remove_file(&path);
    let (mut store, _) = Store::create(&path, &NewAgent::default())?;
    let text: String =
        (0..20_000).map(|i| format!("line {i:05} {}\n", if i % 7 == 0 { "todo" } else { "done" })).collect();
    store.file_write(
        Caller::Owner,
        "big.txt",
        &text.as_bytes()[..text.len().min(1 << 20)],
        &WriteOptions::default(),
    )?;
    // 22,000 rows of compact JSON: just over 1 MB, as the target says.
    let rows: Vec<Value> =
        (0..22_000).map(|i| json!({"id": i, "name": format!("item {i}"), "tags": ["a", "b"]})).collect();
    let rows = serde_json::to_string(&rows)?;
    anyhow::ensure!(rows.len() >= 1 << 20, "big.json is {} bytes, not 1 MB", rows.len());
    store.file_write(Caller::Owner, "big.json", rows.as_bytes(), &WriteOptions::default())?;
    store.db_execute("CREATE TABLE local_t (k INTEGER PRIMARY KEY, v TEXT)", &[], false)?;
    for i in 0..100 {
        store.db_execute("INSERT INTO local_t VALUES (?1, ?2)", &[json!(i), json!(format!("v{i}"))], false)?;
    }
    let mut ex = Executor::new(
        store,
        Arc::new(crate::providers::Unconfigured { why: "bench".into() }),
        Bus::new(),
        Arc::new(Absent),
    )?;
    let mut pipe = Vec::with_capacity(n);
    let mut jq = Vec::with_capacity(n);
    let mut lookup = Vec::with_capacity(n);
    let mut sql = Vec::with_capacity(n);
    for _ in 0..n {
        pipe.push(time(&mut ex, "cat big.txt | grep todo | wc -l", "\n").await?);
        jq.push(time(&mut ex, "jq -c 'map(select(.id % 100 == 0)) | length' big.json", "220").await?);
        lookup.push(time(&mut ex, "jq -r '.[4242].name' big.json", "item 4242").await?);
        sql.push(time(&mut ex, "sqlite3 'SELECT v FROM local_t WHERE k = 42'", "v42").await? * 1e3);
    }
    let mut bare = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Instant::now();
        let v: String = ex.store.conn().query_row("SELECT v FROM local_t WHERE k = 42", [], |r| r.get(0))?;
        anyhow::ensure!(v == "v42");
        bare.push(s.elapsed().as_secs_f64() * 1e6);
    }
    drop(ex);
    let _ = std::fs::remove_dir_all(&dir);
    let (s50, b50) = (pct(sql.clone(), 0.5), pct(bare.clone(), 0.5));
    Ok(Report {
        cat_grep_wc_1mb_p50_ms: pct(pipe.clone(), 0.5),
        cat_grep_wc_1mb_p99_ms: pct(pipe, 0.99),
        jq_1mb_p50_ms: pct(jq.clone(), 0.5),
        jq_1mb_p99_ms: pct(jq, 0.99),
        jq_lookup_1mb_p50_ms: pct(lookup, 0.5),
        sqlite3_p50_us: s50,
        bare_query_p50_us: b50,
        sqlite3_over_bare_us: s50 - b50,
    })
}
