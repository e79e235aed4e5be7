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
    /// 100 agents loaded as actors and left idle (parked): memory per
    /// agent, then the first turn of woken agents.
    Loaded,
    /// `overhead` with a token and a dollar budget on every agent: what
    /// the budget check before each call and its settlement add (compare
    /// its turn p50 with overhead's).
    Budgeted,
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
        Scenario::Budgeted => p(10, 0, 0.0, 5, 600.0, 120),
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
    /// One turn in a thousand is slower: what a rare cost (a WAL
    /// generation's first commit, a checkpoint) shows in.
    turn_p99_9_ms: f64,
    turn_max_ms: f64,
    /// Overhead per turn beyond the scripted model latency.
    overhead_p99_ms: f64,
    sched_lag_p99_ms: f64,
    sched_lag_max_ms: f64,
    rss_peak_mb: f64,
    rss_avg_mb: f64,
    /// `loaded`: memory the idle agents added, per agent (KiB).
    #[serde(skip_serializing_if = "Option::is_none")]
    idle_kb_per_agent: Option<f64>,
    /// `loaded`: the first turn of a parked agent woken by a message
    /// (message sent to turn completed), p50 and max over 10 agents.
    #[serde(skip_serializing_if = "Option::is_none")]
    woken_turn_p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    woken_turn_max_ms: Option<f64>,
    /// The targets for this scenario's figures (same units).
    targets: serde_json::Map<String, serde_json::Value>,
}

/// The targets a scenario's figures are held to (issue 17); a CI check
/// fails a figure past twice its target.
fn targets(s: Scenario) -> serde_json::Map<String, serde_json::Value> {
    let v = match s {
        Scenario::Overhead => {
            json!({"turn_p50_ms": {"max": 0.05}, "turn_p95_ms": {"max": 0.1}, "turn_p99_ms": {"max": 0.3}})
        }
        // No woken turn over 2 ms: its median is held too, so a regression
        // shows even while the maximum (one slow wake in ten) misses.
        Scenario::Loaded => json!({"idle_kb_per_agent": {"max": 20.0}, "woken_turn_p50_ms": {"max": 2.0},
            "woken_turn_max_ms": {"max": 2.0}}),
        _ => json!({}),
    };
    v.as_object().cloned().unwrap_or_default()
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
    check: &super::bench_check::Check,
) -> anyhow::Result<()> {
    let mut p = params(scenario);
    p.agents = agents.unwrap_or(p.agents);
    p.seconds = seconds.unwrap_or(p.seconds);
    if flat_out {
        p.turns_per_min = 0.0;
    }
    let dir = std::env::temp_dir().join(format!("adf-scenario-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = if matches!(scenario, Scenario::Loaded) { run_loaded(&dir, &p) } else { run_in(&dir, scenario, &p) };
    let _ = std::fs::remove_dir_all(&dir);
    let report = result?;
    let v = serde_json::to_value(&report)?;
    if out.json {
        out.json(&report)?;
        return super::bench_check::enforce(&v, check);
    }
    let rows: Vec<Vec<String>> = v
        .as_object()
        .map(|o| o.iter().map(|(k, v)| vec![k.clone(), v.to_string().trim_matches('"').to_string()]).collect())
        .unwrap_or_default();
    out.table(&["SCENARIO", "VALUE"], &rows)?;
    super::bench_check::enforce(&v, check)
}

fn run_in(dir: &std::path::Path, scenario: Scenario, p: &Params) -> anyhow::Result<Report> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut executors = Vec::with_capacity(p.agents);
    let bus = Bus::new();
    let mut providers = Vec::new();
    for i in 0..p.agents {
        let path = dir.join(format!("agent-{i}.adf"));
        create_file(&path, &NewAgent { provider: Some("scripted"), model: Some("mock"), ..Default::default() })?;
        if matches!(scenario, Scenario::Budgeted) {
            let mut s = crate::store::Store::open(&path)?;
            let mut cfg = s.config_value()?;
            cfg["limits"]["budget"] = json!({"tokens_day": 1_000_000_000_000u64, "usd_day": 1_000_000.0});
            s.config_replace(cfg)?;
            s.close()?;
        }
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
        let mut ex = Executor::new(store, provider, bus.clone(), Arc::new(Absent))?;
        if matches!(scenario, Scenario::Budgeted) {
            let price =
                crate::providers::prices::Price { input: 3.0, output: 15.0, cache_read: None, cache_write: None };
            ex.set_prices([("mock".to_string(), price)].into_iter().collect());
        }
        // Started as a runtime starts a loaded agent (`Fleet::load`, then
        // the actor's first step), so the turns measured are turns: the
        // session's first write, which begins the WAL with its syncs, is the
        // start's, as it is for every agent the daemon or the app runs.
        ex.prepare_loaded()?;
        ex.on_start();
        executors.push(ex);
    }
    let stop = Arc::new(AtomicBool::new(false));
    // (turn time, time beyond the scripted model latency) per turn.
    let samples = Arc::new(std::sync::Mutex::new(Vec::<(f64, f64)>::new()));
    // Memory is sampled on a thread of its own: reading /proc takes
    // longer than a turn, and on the runtime it would delay the turns it
    // measures.
    let sampler = std::thread::spawn({
        let stop = stop.clone();
        move || {
            let (mut sum, mut n) = (0.0, 0.0);
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                sum += rss().0;
                n += 1.0;
            }
            if n > 0.0 { sum / n } else { 0.0 }
        }
    });
    let lag = rt.spawn({
        let stop = stop.clone();
        async move {
            let mut lags = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                tokio::time::sleep(Duration::from_millis(10)).await;
                lags.push((t.elapsed().as_secs_f64() * 1000.0 - 10.0).max(0.0));
            }
            lags
        }
    });
    let deadline = Instant::now() + Duration::from_secs(p.seconds);
    let mut tasks = Vec::new();
    let burst = matches!(scenario, Scenario::Burst);
    let latency = p.latency_ms as f64;
    let mean_gap_ms = if p.turns_per_min > 0.0 { 60_000.0 / p.turns_per_min } else { 0.0 };
    for (i, mut ex) in executors.into_iter().enumerate() {
        let samples = samples.clone();
        let provider = providers[i].clone();
        tasks.push(rt.spawn(async move {
            let mut errors = 0;
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
                // What the actor does between pieces of work: a checkpoint
                // made due by the turns, which begins the next WAL generation.
                crate::runtime::agent::checkpoint_if_due(&mut ex);
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
        for t in tasks {
            if let Ok((ex, e)) = t.await {
                errors += e;
                done.push(ex);
            }
        }
    });
    stop.store(true, Ordering::Relaxed);
    let mut lags = rt.block_on(lag).unwrap_or_default();
    let rss_avg = sampler.join().unwrap_or(0.0);
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
        turn_p99_9_ms: pct(&turns, 0.999),
        turn_max_ms: turns.last().copied().unwrap_or(0.0),
        overhead_p99_ms: pct(&overhead, 0.99),
        sched_lag_p99_ms: pct(&lags, 0.99),
        sched_lag_max_ms: lags.last().copied().unwrap_or(0.0),
        rss_peak_mb: peak,
        rss_avg_mb: rss_avg,
        idle_kb_per_agent: None,
        woken_turn_p50_ms: None,
        woken_turn_max_ms: None,
        targets: targets(scenario),
    })
}

/// `loaded`: agents loaded as the daemon loads them (an actor each, with
/// its timer tick), left until their first tick parks them; the memory
/// they added, then ten of them woken by a message one after another
/// (message to `turn.completed`).
fn run_loaded(dir: &std::path::Path, p: &Params) -> anyhow::Result<Report> {
    use crate::runtime::agent::{AgentCommand, spawn, waiting_owner};
    use crate::runtime::bus::{Filter, Item};
    // Each loaded agent holds its lock file open, as in the daemon.
    crate::daemon::conn::raise_nofile();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let bus = Bus::new();
    let mut paths = Vec::with_capacity(p.agents);
    for i in 0..p.agents {
        let path = dir.join(format!("agent-{i}.adf"));
        create_file(&path, &NewAgent { provider: Some("scripted"), model: Some("mock"), ..Default::default() })?;
        paths.push(path);
    }
    let provider = Arc::new(Scripted::new([]).without_recording().with_fallback(|_| Reply::Text("ok".into())));
    // One agent loaded first, so the figure is per agent beyond the first
    // (the runtime's own tables and caches come with the first).
    let mut handles = Vec::with_capacity(p.agents);
    let mut tasks = Vec::with_capacity(p.agents);
    let _guard = rt.enter();
    let load = |path: &std::path::Path| -> anyhow::Result<_> {
        let owner = waiting_owner();
        let mut ex = Executor::new(Store::open(path)?, provider.clone(), bus.clone(), owner.clone())?;
        ex.prepare_loaded()?;
        Ok(spawn(ex, owner))
    };
    let (h, t) = load(&paths[0])?;
    handles.push(h);
    tasks.push(t);
    rt.block_on(tokio::time::sleep(Duration::from_millis(300)));
    let (base, _) = rss();
    for path in &paths[1..] {
        let (h, t) = load(path)?;
        handles.push(h);
        tasks.push(t);
    }
    rt.block_on(tokio::time::sleep(Duration::from_secs(p.seconds.max(1))));
    let (after, peak) = rss();
    let per_agent_kb = (after - base) * 1024.0 / (p.agents.saturating_sub(1).max(1)) as f64;
    let mut woken = Vec::new();
    for h in handles.iter().step_by((p.agents / 10).max(1)).take(10) {
        let mut sub = bus.subscribe(
            Some(bus.cursor()),
            Filter { agent_id: Some(h.agent_id.clone()), types: vec![crate::protocol::kind::TURN_COMPLETED.into()] },
        );
        let t = Instant::now();
        h.send(AgentCommand::Chat("wake".into()));
        let done = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), async {
                while let Some(item) = sub.next().await {
                    if matches!(item, Item::Event(_)) {
                        return true;
                    }
                }
                false
            })
            .await
            .unwrap_or(false)
        });
        anyhow::ensure!(done, "agent {} did not complete its turn", h.agent_id);
        woken.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    drop(handles);
    let mut errors = 0;
    rt.block_on(async {
        for t in tasks {
            match t.await {
                Ok(ex) => {
                    let _ = ex.store_into().close();
                }
                Err(_) => errors += 1,
            }
        }
    });
    woken.sort_by(f64::total_cmp);
    Ok(Report {
        scenario: Scenario::Loaded,
        agents: p.agents,
        latency_ms: 0,
        seconds: p.seconds,
        turns: woken.len(),
        errors,
        provider_calls: provider.call_count(),
        turn_p50_ms: pct(&woken, 0.5),
        turn_p95_ms: pct(&woken, 0.95),
        turn_p99_ms: pct(&woken, 0.99),
        turn_p99_9_ms: pct(&woken, 0.999),
        turn_max_ms: woken.last().copied().unwrap_or(0.0),
        overhead_p99_ms: 0.0,
        sched_lag_p99_ms: 0.0,
        sched_lag_max_ms: 0.0,
        rss_peak_mb: peak,
        rss_avg_mb: after,
        idle_kb_per_agent: Some(per_agent_kb),
        woken_turn_p50_ms: Some(pct(&woken, 0.5)),
        woken_turn_max_ms: woken.last().copied(),
        targets: targets(Scenario::Loaded),
    })
}

/// One size of `adf bench scale`.
#[derive(Debug, Serialize)]
struct ScalePoint {
    kind: &'static str,
    agents: usize,
    rss_mb: f64,
    /// Idle: memory per agent beyond the first (KiB).
    #[serde(skip_serializing_if = "Option::is_none")]
    kb_per_agent: Option<f64>,
    /// Idle: a woken agent's first turn; busy: every turn.
    turn_p50_ms: f64,
    turn_p99_ms: f64,
    /// Busy: turns run in the window, and the async runtime's scheduling
    /// lag (a 10 ms sleep's overshoot), which is what an event waits for a
    /// thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    turns: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sched_lag_p99_ms: Option<f64>,
}

/// `adf bench scale`: 10, 100, 1,000 and 10,000 idle agents (the last
/// left out of `--short`) and 1, 10 and 100 busy ones (the overhead
/// scenario's pacing, 5 s; 2 s short), so a user knows what one machine
/// holds.
pub fn scale(out: &Out, short: bool) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("adf-scale-{}", std::process::id()));
    let mut points = Vec::new();
    let idle: &[usize] = if short { &[10, 100, 1000] } else { &[10, 100, 1000, 10_000] };
    let result = (|| -> anyhow::Result<()> {
        for &n in idle {
            std::fs::create_dir_all(&dir)?;
            let p = Params { agents: n, seconds: 2, ..params(Scenario::Loaded) };
            let r = run_loaded(&dir, &p);
            let _ = std::fs::remove_dir_all(&dir);
            let r = r?;
            points.push(ScalePoint {
                kind: "idle",
                agents: n,
                rss_mb: r.rss_avg_mb,
                kb_per_agent: r.idle_kb_per_agent,
                turn_p50_ms: r.turn_p50_ms,
                turn_p99_ms: r.turn_max_ms,
                turns: None,
                sched_lag_p99_ms: None,
            });
        }
        for n in [1, 10, 100] {
            std::fs::create_dir_all(&dir)?;
            let p = Params { agents: n, seconds: if short { 2 } else { 5 }, ..params(Scenario::Overhead) };
            let r = run_in(&dir, Scenario::Overhead, &p);
            let _ = std::fs::remove_dir_all(&dir);
            let r = r?;
            points.push(ScalePoint {
                kind: "busy",
                agents: n,
                rss_mb: r.rss_peak_mb,
                kb_per_agent: None,
                turn_p50_ms: r.turn_p50_ms,
                turn_p99_ms: r.turn_p99_ms,
                turns: Some(r.turns),
                sched_lag_p99_ms: Some(r.sched_lag_p99_ms),
            });
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    if out.json {
        return out.json(&points);
    }
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            vec![
                p.kind.to_string(),
                p.agents.to_string(),
                format!("{:.1} MB", p.rss_mb),
                p.kb_per_agent.map(|k| format!("{k:.1} KB")).unwrap_or_default(),
                format!("{:.2} / {:.2} ms", p.turn_p50_ms, p.turn_p99_ms),
                p.sched_lag_p99_ms.map(|l| format!("{l:.2} ms")).unwrap_or_default(),
            ]
        })
        .collect();
    out.table(&["KIND", "AGENTS", "RSS", "PER AGENT", "TURN P50 / P99", "SCHED LAG P99"], &rows)
}
