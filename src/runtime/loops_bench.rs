//! `adf bench loops` (issue 18): what side loops cost. Memory each warm
//! loop adds (16 loops on one agent; 100 agents with 4 loops each), the
//! time from a `loop_send` with `wake` to the woken loop's model call
//! (through the agent's actor, model time excluded: the model is instant),
//! and recomputing the context breakdown of a loop of 100 k tokens. Figures
//! are reported, never asserted: these machines are shared.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use crate::providers::scripted::{Reply, Scripted};
use crate::runtime::agent::{AgentCommand, spawn_with_tick, waiting_owner};
use crate::runtime::bus::Bus;
use crate::runtime::executor::{Absent, Executor};
use crate::runtime::shell::bench::pct;
use crate::store::loop_rows::NewLoopRow;
use crate::store::loops::LoopSpec;
use crate::store::{NewAgent, Store};

#[derive(Debug, Serialize)]
pub struct Report {
    /// Memory each warm side loop adds on agents of 16 loops (ten such
    /// agents, so the figure is not one allocator step).
    pub kb_per_loop_16: f64,
    /// The same over 100 agents with 4 loops each.
    pub kb_per_loop_100x4: f64,
    pub loop_send_samples: usize,
    /// `loop_send` (wake) returned to the woken loop's model call.
    pub loop_send_to_turn_p50_ms: f64,
    pub loop_send_to_turn_p99_ms: f64,
    /// Tokens in the measured loop, as the breakdown counts them.
    pub breakdown_tokens: u64,
    pub breakdown_p50_ms: f64,
    pub breakdown_p99_ms: f64,
}

fn rss_kb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| {
            t.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0.0)
}

fn instant() -> Arc<Scripted> {
    Arc::new(Scripted::new([]).with_fallback(|_| Reply::Text("ok".into())).without_recording())
}

fn agent(path: &std::path::Path, loops: usize) -> anyhow::Result<Store> {
    let (mut s, _) =
        Store::create(path, &NewAgent { provider: Some("scripted"), model: Some("mock"), ..Default::default() })?;
    for k in 0..loops {
        s.loop_create(&format!("side{k}"), &LoopSpec { goal: Some(format!("Side work {k}.")), ..Default::default() })?;
    }
    Ok(s)
}

/// KB each warm loop adds over `agents` agents of `loops` loops each: all
/// loaded and main turned once, then each side loop turned once.
async fn memory(dir: &std::path::Path, agents: usize, loops: usize) -> anyhow::Result<f64> {
    let mut exs = Vec::with_capacity(agents);
    for i in 0..agents {
        let s = agent(&dir.join(format!("m{agents}-{i}.adf")), loops)?;
        let mut ex = Executor::new(s, instant(), Bus::new(), Arc::new(Absent))?;
        ex.chat("hello").await?;
        exs.push(ex);
    }
    let before = rss_kb();
    for ex in exs.iter_mut() {
        for k in 0..loops {
            ex.side_turn(&format!("side{k}"), Some("hello"), "chat").await?;
        }
    }
    let after = rss_kb();
    drop(exs);
    Ok((after - before).max(0.0) / (agents * loops) as f64)
}

/// `loop_send` with wake from main to `side0`, through the actor: the time
/// from the model's call being handed back to the side loop's own call.
async fn loop_send(dir: &std::path::Path, n: usize) -> anyhow::Result<Vec<f64>> {
    let sent: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let woke: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let (s2, w2) = (sent.clone(), woke.clone());
    let provider = Arc::new(
        Scripted::new([])
            .with_fallback(move |req| {
                let side = req.system.contains("# Side loop: side0");
                let answered =
                    req.messages.last().is_some_and(|m| m.content.iter().any(|b| b["type"] == "tool_result"));
                if side {
                    let delivered = req
                        .messages
                        .iter()
                        .any(|m| m.content.iter().any(|b| text_of(b).contains("[Message from loop main]")));
                    if delivered && let Ok(mut w) = w2.lock() {
                        w.push(Instant::now());
                    }
                    Reply::Text("noted".into())
                } else if answered {
                    Reply::Text("sent".into())
                } else {
                    if let Ok(mut s) = s2.lock() {
                        s.push(Instant::now());
                    }
                    Reply::Tools(vec![("loop_send".into(), json!({"loop": "side0", "message": "look", "wake": true}))])
                }
            })
            .without_recording(),
    );
    let s = agent(&dir.join("send.adf"), 1)?;
    let owner = waiting_owner();
    let ex = Executor::new(s, provider, Bus::new(), owner.clone())?;
    let (h, task) = spawn_with_tick(ex, owner, Duration::from_millis(500));
    for i in 0..n {
        h.send(AgentCommand::Chat(format!("go {i}")));
        let deadline = Instant::now() + Duration::from_secs(10);
        while woke.lock().map(|w| w.len()).unwrap_or(0) <= i {
            anyhow::ensure!(Instant::now() < deadline, "loop_send {i}: side0 never started its turn");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        // Let the side loop's turn end before the next round.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drop(h);
    let _ = task.await;
    let (s, w) =
        (sent.lock().map(|v| v.clone()).unwrap_or_default(), woke.lock().map(|v| v.clone()).unwrap_or_default());
    Ok(s.iter().zip(w.iter()).map(|(a, b)| b.duration_since(*a).as_secs_f64() * 1e3).collect())
}

fn text_of(b: &Value) -> &str {
    b["text"].as_str().or(b["content"].as_str()).unwrap_or("")
}

/// The context breakdown of a side loop holding about 100 k tokens.
fn breakdown(dir: &std::path::Path, n: usize) -> anyhow::Result<(u64, Vec<f64>)> {
    let mut s = agent(&dir.join("ctx.adf"), 1)?;
    let para = "The agent read the report, compared the figures with last week's and wrote down what changed. ";
    let body: String = para.repeat(10);
    let content = json!([{"type": "text", "text": body}]);
    let mut rows = 0;
    loop {
        let role = if rows % 2 == 0 { "user" } else { "assistant" };
        s.side_append_row("side0", &NewLoopRow { role, content: &content, model: None, tokens: None, ord: None })?;
        rows += 1;
        if rows % 50 == 0 {
            let g = crate::runtime::context::measure(&s, Some("side0"), None, None)?;
            if g.estimated >= 100_000 {
                break;
            }
        }
    }
    let mut t = Vec::with_capacity(n);
    let mut tokens = 0;
    for _ in 0..n {
        let start = Instant::now();
        let g = crate::runtime::context::measure(&s, Some("side0"), None, None)?;
        t.push(start.elapsed().as_secs_f64() * 1e3);
        tokens = g.estimated;
    }
    Ok((tokens, t))
}

pub fn run(iterations: usize) -> anyhow::Result<Report> {
    let dir = std::env::temp_dir().join(format!("adf-bench-loops-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let result = rt.block_on(async {
        let kb16 = memory(&dir, 10, 16).await?;
        let kb100 = memory(&dir, 100, 4).await?;
        let sends = loop_send(&dir, iterations.clamp(20, 2_000)).await?;
        let (tokens, b) = breakdown(&dir, iterations.clamp(10, 1_000))?;
        Ok::<_, anyhow::Error>(Report {
            kb_per_loop_16: kb16,
            kb_per_loop_100x4: kb100,
            loop_send_samples: sends.len(),
            loop_send_to_turn_p50_ms: pct(sends.clone(), 0.5),
            loop_send_to_turn_p99_ms: pct(sends, 0.99),
            breakdown_tokens: tokens,
            breakdown_p50_ms: pct(b.clone(), 0.5),
            breakdown_p99_ms: pct(b, 0.99),
        })
    });
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
    result
}
