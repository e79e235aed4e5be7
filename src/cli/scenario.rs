//! `adf bench --scenario …`: the reference harness's scenarios, driving real
//! agent files through the real executor with an in-process scripted
//! provider (its latency and tool-call mix per scenario). Reports turns,
//! errors, turn latency percentiles, scheduling lag of the async runtime,
//! RSS (peak and average) and provider calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::output::Out;
use crate::providers::scripted::{Reply, Scripted};
use crate::runtime::bus::Bus;
use crate::runtime::executor::{Absent, Executor};
use crate::store::Store;
use crate::store::create::{NewAgent, create_file};

#[derive(Debug, Clone, Copy, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// 1 agent, 0 ms model latency, 3 s.
    Smoke,
    /// 10 agents, 0 ms, 5 s: the runtime's own overhead.
    Overhead,
    /// 50 agents, 800 ms, 15 s.
    Idle,
    /// 20 agents, 1200 ms, 40 % tool calls, 15 s.
    Mixed,
    /// 30 agents, 800 ms, 10 s, all starting at once.
    Burst,
    /// 100 agents loaded and idle: memory only.
    Loaded,
}

struct Params {
    agents: usize,
    latency_ms: u64,
    tool_ratio: f64,
    seconds: u64,
    /// Target turns per agent per minute, as the reference's load driver:
    /// after a turn ends the agent waits `60 000 / rate` ms ±50 % jitter.
    turns_per_min: f64,
    /// Approximate output tokens of a reply (the reply has tokens / 1.3 words).
    tokens: usize,
}

fn params(s: Scenario) -> Params {
    let p = |agents, latency_ms, tool_ratio, seconds, turns_per_min, tokens| Params {
        agents,
        latency_ms,
        tool_ratio,
        seconds,
        turns_per_min,
        tokens,
    };
    // Rates and reply sizes are the reference harness's (scenarios.ts);
    // agents, latency, tool mix and durations are the issue's.
    match s {
        Scenario::Smoke => p(1, 0, 0.0, 3, 600.0, 120),
        Scenario::Overhead => p(10, 0, 0.0, 5, 600.0, 120),
        Scenario::Idle => p(50, 800, 0.0, 15, 0.2, 60),
        Scenario::Mixed => p(20, 1200, 0.4, 15, 2.0, 200),
        Scenario::Burst => p(30, 800, 0.0, 10, 120.0, 100),
        Scenario::Loaded => p(100, 0, 0.0, 2, 0.0, 0),
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    scenario: Scenario,
    agents: usize,
    latency_ms: u64,
    seconds: u64,
    turns: usize,
    errors: usize,
    provider_calls: usize,
    turn_p50_ms: f64,
    turn_p95_ms: f64,
    turn_p99_ms: f64,
    turn_max_ms: f64,
    /// Overhead per turn beyond the scripted model latency.
    overhead_p99_ms: f64,
    sched_lag_p99_ms: f64,
    sched_lag_max_ms: f64,
    rss_peak_mb: f64,
    rss_avg_mb: f64,
}

/// (current RSS, peak RSS) in MiB from /proc.
fn rss() -> (f64, f64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kb("VmRSS:") / 1024.0, kb("VmHWM:") / 1024.0)
}

/// A reply of about `tokens` output tokens (tokens / 1.3 words), as the
/// reference's mock provider makes them.
fn reply_text(tokens: usize) -> String {
    const WORDS: [&str; 8] = ["the", "agent", "noted", "a", "result", "and", "moved", "on"];
    let n = ((tokens as f64 / 1.3) as usize).max(1);
    let mut s = String::with_capacity(n * 6);
    for i in 0..n {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[i % WORDS.len()]);
    }
    s.push('.');
    s
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

pub fn run(
    out: &Out,
    scenario: Scenario,
    agents: Option<usize>,
    seconds: Option<u64>,
    flat_out: bool,
) -> anyhow::Result<()> {
    let mut p = params(scenario);
    p.agents = agents.unwrap_or(p.agents);
    p.seconds = seconds.unwrap_or(p.seconds);
    if flat_out {
        p.turns_per_min = 0.0;
    }
    let dir = std::env::temp_dir().join(format!("adf-scenario-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run_in(&dir, scenario, &p);
    let _ = std::fs::remove_dir_all(&dir);
    let report = result?;
    if out.json {
        return out.json(&report);
    }
    let v = serde_json::to_value(&report)?;
    let rows: Vec<Vec<String>> = v
        .as_object()
        .map(|o| o.iter().map(|(k, v)| vec![k.clone(), v.to_string().trim_matches('"').to_string()]).collect())
        .unwrap_or_default();
    out.table(&["SCENARIO", "VALUE"], &rows)
}

fn run_in(dir: &std::path::Path, scenario: Scenario, p: &Params) -> anyhow::Result<Report> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut executors = Vec::with_capacity(p.agents);
    let bus = Bus::new();
    let mut providers = Vec::new();
    for i in 0..p.agents {
        let path = dir.join(format!("agent-{i}.adf"));
        create_file(&path, &NewAgent { provider: Some("scripted"), model: Some("mock"), ..Default::default() })?;
        let ratio = p.tool_ratio;
        let reply = reply_text(p.tokens);
        let provider = Arc::new(
            Scripted::new([]).without_recording().with_latency(Duration::from_millis(p.latency_ms)).with_fallback(
                move |req| {
                    // At most two tool calls in a row (the reference's
                    // `maxToolCallStreak`), each with the scenario's probability.
                    let streak = req
                        .messages
                        .iter()
                        .rev()
                        .take_while(|m| m.content.iter().any(|b| b["type"] == "tool_result" || b["type"] == "tool_use"))
                        .filter(|m| m.content.iter().any(|b| b["type"] == "tool_use"))
                        .count();
                    if streak < 2 && rand::random::<f64>() < ratio {
                        Reply::Tools(vec![("fs_list".into(), json!({}))])
                    } else {
                        Reply::Text(reply.clone())
                    }
                },
            ),
        );
        providers.push(provider.clone());
        let store = Store::open(&path)?;
        executors.push(Executor::new(store, provider, bus.clone(), Arc::new(Absent))?);
    }
    let (_, rss_loaded) = rss();
    let stop = Arc::new(AtomicBool::new(false));
    // (turn time, time beyond the scripted model latency) per turn.
    let samples = Arc::new(std::sync::Mutex::new(Vec::<(f64, f64)>::new()));
    let lag = rt.spawn({
        let stop = stop.clone();
        async move {
            let mut lags = Vec::new();
            let mut rss_sum = 0.0;
            let mut n = 0.0;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                tokio::time::sleep(Duration::from_millis(10)).await;
                lags.push((t.elapsed().as_secs_f64() * 1000.0 - 10.0).max(0.0));
                rss_sum += rss().0;
                n += 1.0;
            }
            (lags, if n > 0.0 { rss_sum / n } else { 0.0 })
        }
    });
    let deadline = Instant::now() + Duration::from_secs(p.seconds);
    let mut tasks = Vec::new();
    let burst = matches!(scenario, Scenario::Burst);
    let loaded = matches!(scenario, Scenario::Loaded);
    let latency = p.latency_ms as f64;
    let mean_gap_ms = if p.turns_per_min > 0.0 { 60_000.0 / p.turns_per_min } else { 0.0 };
    for (i, mut ex) in executors.into_iter().enumerate() {
        let samples = samples.clone();
        let provider = providers[i].clone();
        tasks.push(rt.spawn(async move {
            let mut errors = 0;
            if loaded {
                return (ex, errors);
            }
            if !burst {
                // Spread the starts over the first second.
                tokio::time::sleep(Duration::from_millis((i as u64 * 1000) / 64)).await;
            }
            while Instant::now() < deadline {
                let t = Instant::now();
                let calls = provider.call_count();
                match ex.chat("tick").await {
                    Ok(crate::runtime::executor::TurnEnd::Completed { .. }) => {
                        let ms = t.elapsed().as_secs_f64() * 1000.0;
                        let model = (provider.call_count() - calls) as f64 * latency;
                        if let Ok(mut s) = samples.lock() {
                            s.push((ms, (ms - model).max(0.0)));
                        }
                    }
                    _ => errors += 1,
                }
                if mean_gap_ms > 0.0 {
                    let gap = mean_gap_ms * (1.0 + (rand::random::<f64>() * 2.0 - 1.0) * 0.5);
                    let until = (Instant::now() + Duration::from_secs_f64(gap / 1000.0)).min(deadline);
                    tokio::time::sleep_until(until.into()).await;
                }
            }
            (ex, errors)
        }));
    }
    let mut errors = 0;
    let mut done = Vec::new();
    rt.block_on(async {
        if loaded {
            tokio::time::sleep(Duration::from_secs(p.seconds)).await;
        }
        for t in tasks {
            if let Ok((ex, e)) = t.await {
                errors += e;
                done.push(ex);
            }
        }
    });
    stop.store(true, Ordering::Relaxed);
    let (mut lags, rss_avg) = rt.block_on(lag).unwrap_or_default();
    let (_, peak) = rss();
    for ex in done {
        let _ = ex.store.close();
    }
    let pairs = samples.lock().map(|s| s.clone()).unwrap_or_default();
    let mut turns: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let mut overhead: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    turns.sort_by(f64::total_cmp);
    overhead.sort_by(f64::total_cmp);
    lags.sort_by(f64::total_cmp);
    let calls = providers.iter().map(|p| p.call_count()).sum();
    Ok(Report {
        scenario,
        agents: p.agents,
        latency_ms: p.latency_ms,
        seconds: p.seconds,
        turns: turns.len(),
        errors,
        provider_calls: calls,
        turn_p50_ms: pct(&turns, 0.50),
        turn_p95_ms: pct(&turns, 0.95),
        turn_p99_ms: pct(&turns, 0.99),
        turn_max_ms: turns.last().copied().unwrap_or(0.0),
        overhead_p99_ms: pct(&overhead, 0.99),
        sched_lag_p99_ms: pct(&lags, 0.99),
        sched_lag_max_ms: lags.last().copied().unwrap_or(0.0),
        rss_peak_mb: if loaded { rss_loaded.max(peak) } else { peak },
        rss_avg_mb: rss_avg,
    })
}
