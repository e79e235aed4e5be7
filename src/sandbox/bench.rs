//! `adf bench lambda`: what agent code costs. A cold lambda start (a fresh
//! realm in a spare worker), a warm call (same realm, module loaded), a
//! `sys_code` round trip through an executor with one `adf.*` call, and a
//! thousand system timers across a hundred agents due in the same tick.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::{ModuleReq, NoHost, RunReq};
use crate::runtime::bus::Bus;
use crate::runtime::executor::{Absent, Executor};
use crate::store::files::WriteOptions;
use crate::store::timers::{NewTimer, Schedule};
use crate::store::{Caller, NewAgent, Store};

#[derive(Debug, Serialize)]
pub struct Report {
    pub cold_start_p50_ms: f64,
    pub cold_start_p99_ms: f64,
    pub warm_call_p50_us: f64,
    pub warm_call_p99_us: f64,
    pub sys_code_p50_ms: f64,
    pub sys_code_p99_ms: f64,
    pub timers: usize,
    pub agents: usize,
    /// From the tick to the last timer's lambda finishing.
    pub timers_all_done_ms: f64,
    /// The latest any timer ran after it was due, in ticks (5 s).
    pub timers_max_late_ticks: f64,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0)
}

const LAMBDA: &str = "export function main(args) { return { sum: args.a + args.b }; }\n";

pub fn run() -> anyhow::Result<Report> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run_async())
}

async fn run_async() -> anyhow::Result<Report> {
    let p = super::prepare::module("bench.js", LAMBDA).map_err(anyhow::Error::msg)?;
    let req = || RunReq {
        module: Some(ModuleReq {
            path: "bench.js".into(),
            hash: p.hash.clone(),
            source: p.source.clone(),
            function: "main".into(),
        }),
        args: json!({"a": 1, "b": 2}),
        ..Default::default()
    };
    let t = Duration::from_secs(10);
    super::prewarm();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut cold = Vec::new();
    for _ in 0..60 {
        let s = Instant::now();
        super::run(req(), None, &mut NoHost, t).await?;
        cold.push(s.elapsed().as_secs_f64() * 1e3);
        // Between runs a worker readies its next realm, as in real use.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut warm = Vec::new();
    super::run(req(), Some("bench:warm"), &mut NoHost, t).await?;
    for _ in 0..1000 {
        let s = Instant::now();
        super::run(req(), Some("bench:warm"), &mut NoHost, t).await?;
        warm.push(s.elapsed().as_secs_f64() * 1e6);
    }
    let dir = tempfile_dir()?;
    let (store, _) = Store::create(dir.join("code.adf"), &NewAgent::default())?;
    let mut ex = Executor::new(
        store,
        Arc::new(crate::providers::Unconfigured { why: "bench".into() }),
        Bus::new(),
        Arc::new(Absent),
    )?;
    let mut code = Vec::new();
    for _ in 0..300 {
        let s = Instant::now();
        let out =
            ex.sys_code(&json!({"code": "(await adf.fs_read({path: 'mind.md'})).path", "clear_state": false})).await;
        code.push(s.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(!out.is_error, "sys_code failed: {}", out.content);
    }
    drop(ex);
    let (agents, per) = (100usize, 10usize);
    let now = crate::store::now_ms();
    let mut exs = Vec::new();
    for i in 0..agents {
        let (mut s, _) = Store::create(dir.join(format!("t{i}.adf")), &NewAgent::default())?;
        s.file_write(
            Caller::Owner,
            "tick.js",
            b"export async function main(e) { await adf.sys_set_meta({key: 'last', value: String(e.data.timer.run_count)}); }\n",
            &WriteOptions::default(),
        )?;
        for _ in 0..per {
            s.timer_insert(&NewTimer {
                schedule: &Schedule::Once { at: now },
                next_wake_at: now,
                payload: None,
                scope: Some(&["system"]),
                lambda: Some("tick.js"),
                warm: true,
                locked: false,
            })?;
        }
        exs.push(Executor::new(
            s,
            Arc::new(crate::providers::Unconfigured { why: "bench".into() }),
            Bus::new(),
            Arc::new(Absent),
        )?);
    }
    let tick = Instant::now();
    let tasks: Vec<_> = exs
        .into_iter()
        .map(|mut ex| {
            tokio::spawn(async move {
                let _ = ex.fire_timers(crate::store::now_ms());
                ex.run_system().await;
                (ex.last_lambda_error.take(), crate::store::now_ms())
            })
        })
        .collect();
    let mut latest = now;
    for t in tasks {
        let (err, done) = t.await?;
        anyhow::ensure!(err.is_none(), "a timer lambda failed: {err:?}");
        latest = latest.max(done);
    }
    let all_done = tick.elapsed().as_secs_f64() * 1e3;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Report {
        cold_start_p50_ms: pct(&mut cold, 0.5),
        cold_start_p99_ms: pct(&mut cold, 0.99),
        warm_call_p50_us: pct(&mut warm, 0.5),
        warm_call_p99_us: pct(&mut warm, 0.99),
        sys_code_p50_ms: pct(&mut code, 0.5),
        sys_code_p99_ms: pct(&mut code, 0.99),
        timers: agents * per,
        agents,
        timers_all_done_ms: all_done,
        timers_max_late_ticks: (latest - now) as f64 / 5_000.0,
    })
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("adf-bench-lambda-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
