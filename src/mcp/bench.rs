//! `adf bench mcp`: the MCP client's costs. A tool call's round trip to a
//! stdio server that does nothing (`adf mcp serve --echo`, so the figure is
//! the protocol and the client, not a server's work); what 20 live server
//! connections add to this process (the daemon side: the children's own
//! memory is theirs); and reconciling a listing of 100 tools into a config
//! (all new, then unchanged, then 10 changed). Reported, never asserted.

use std::time::Instant;

use serde::Serialize;
use serde_json::{Value, json};

use super::client::{ServerSpec, connect};
use super::reconcile::{ServerTool, reconcile};

#[derive(Debug, Serialize)]
pub struct Report {
    pub call_p50_ms: f64,
    pub call_p99_ms: f64,
    pub servers: usize,
    pub rss_added_mb: f64,
    pub reconcile_100_new_ms: f64,
    pub reconcile_100_unchanged_ms: f64,
    pub reconcile_100_changed_ms: f64,
}

use crate::runtime::shell::bench::pct;

/// Resident memory of this process, in bytes (Linux; 0 elsewhere).
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

fn tools(n: usize, variant: usize) -> Vec<ServerTool> {
    (0..n)
        .map(|i| ServerTool {
            name: format!("tool_{i}"),
            description: Some(format!("Does thing {i} with care{}", if i < variant { " (v2)" } else { "" })),
            input_schema: json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "where"},
                "limit": {"type": "integer", "minimum": 1},
                "flags": {"type": "array", "items": {"type": "string"}}
            }, "required": ["path"]}),
        })
        .collect()
}

fn reconcile_ms(n: usize) -> anyhow::Result<(f64, f64, f64)> {
    let base = json!({"tools": [], "mcp": {"servers": [{"name": "big", "transport": "stdio", "command": "x"}]}});
    let (mut new, mut same, mut changed) = (Vec::new(), Vec::new(), Vec::new());
    let (first, v2) = (tools(100, 0), tools(100, 10));
    for _ in 0..n {
        let mut cfg: Value = base.clone();
        let t = Instant::now();
        let o = reconcile(&mut cfg, "big", &first);
        new.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(o.new.len() == 100, "reconcile: {o:?}");
        let t = Instant::now();
        let o = reconcile(&mut cfg, "big", &first);
        same.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(!o.changed, "an unchanged listing changed the config");
        let t = Instant::now();
        let o = reconcile(&mut cfg, "big", &v2);
        changed.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(o.changed_tools.len() == 10, "reconcile: {o:?}");
    }
    Ok((pct(new, 0.5), pct(same, 0.5), pct(changed, 0.5)))
}

pub fn run(iterations: usize) -> anyhow::Result<Report> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(run_async(iterations.clamp(20, 10_000)))
}

async fn run_async(n: usize) -> anyhow::Result<Report> {
    let exe = std::env::current_exe()?;
    let spec = ServerSpec::from_config(&json!({"name": "echo", "command": exe.to_string_lossy(),
                                               "args": ["mcp", "serve", "--echo"]}))
    .map_err(anyhow::Error::msg)?;
    let scratch = std::env::temp_dir().join(format!("adf-bench-mcp-{}", std::process::id()));
    let conn = connect(&spec, &scratch.join("one")).await?;
    for _ in 0..20 {
        conn.call("echo", json!({"text": "warm"})).await;
    }
    let mut calls = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let (out, err) = conn.call("echo", json!({"text": format!("hi {i}")})).await;
        calls.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(!err && out == format!("hi {i}"), "echo answered {out:?}");
    }
    conn.close().await;
    // 20 servers (two for each of 10 agents), each used once.
    let before = rss();
    let mut live = Vec::new();
    for i in 0..20 {
        let c = connect(&spec, &scratch.join(format!("s{i}"))).await?;
        c.call("echo", json!({"text": "x"})).await;
        live.push(c);
    }
    let after = rss();
    for c in live {
        c.close().await;
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let (new, same, changed) = reconcile_ms(n.min(200))?;
    Ok(Report {
        call_p50_ms: pct(calls.clone(), 0.5),
        call_p99_ms: pct(calls, 0.99),
        servers: 20,
        rss_added_mb: after.saturating_sub(before) as f64 / (1 << 20) as f64,
        reconcile_100_new_ms: new,
        reconcile_100_unchanged_ms: same,
        reconcile_100_changed_ms: changed,
    })
}
