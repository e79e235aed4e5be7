//! `adf bench daemon`: the daemon measured in-process on loopback: start to
//! the first `/health` answer with 10 agents, RSS with 100 idle agents,
//! `POST /agents/load` latency, and 10 SSE clients following 5 000 events a
//! second (delivered, dropped, delivery latency).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::{Options, Ready, serve_with};
use crate::protocol::Envelope;
use crate::store::NewAgent;
use crate::store::create::create_file;

#[derive(Debug, Serialize)]
pub struct Report {
    pub start_to_health_ms: f64,
    pub rss_100_idle_agents_mb: f64,
    /// Idle agents in the daemon process for the memory figures.
    pub idle_agents: usize,
    pub rss_idle_agents_mb: f64,
    /// Memory each idle agent adds beyond the first ten (KiB).
    pub idle_kb_per_agent: f64,
    /// `GET /agents` with `idle_agents` agents loaded.
    pub list_p50_ms: f64,
    pub load_p50_ms: f64,
    pub load_p99_ms: f64,
    pub sse_clients: usize,
    pub sse_events_per_client: usize,
    pub sse_rate_per_sec: usize,
    pub sse_seconds: usize,
    pub sse_dropped: usize,
    pub sse_delivery_p50_ms: f64,
    pub sse_delivery_p99_ms: f64,
    /// Owner file writes (`PUT …/files/content`) on one agent, 8 clients.
    pub put_per_sec: f64,
    /// The targets: `{"max": x}` or `{"min": x}` per figure.
    pub targets: serde_json::Value,
}

/// The daemon's targets (issue 17).
pub fn targets() -> serde_json::Value {
    json!({
        "start_to_health_ms": {"max": 100.0},
        "idle_kb_per_agent": {"max": 20.0},
        "rss_idle_agents_mb": {"max": 60.0},
        "list_p50_ms": {"max": 1.0},
        "load_p50_ms": {"max": 0.5},
        "sse_dropped": {"max": 0.0},
        "sse_delivery_p99_ms": {"max": 2.0},
        "put_per_sec": {"min": 10000.0},
    })
}

/// Run `adf daemon` on the files (named, so no review is needed) with a
/// scratch home; its URL once it says where it listens.
async fn spawn(dir: &Path, fleet: &Path, files: &[PathBuf]) -> anyhow::Result<(std::process::Child, String)> {
    spawn_with(dir, fleet, files, &[]).await
}

/// `spawn` with more environment (`ADF_EVENT_RING`).
pub(crate) async fn spawn_with(
    dir: &Path,
    fleet: &Path,
    files: &[PathBuf],
    env: &[(&str, &str)],
) -> anyhow::Result<(std::process::Child, String)> {
    let info = super::info_path(fleet);
    let _ = std::fs::remove_file(&info);
    let child = std::process::Command::new(std::env::current_exe()?)
        .args(["daemon", "--port", "0"])
        .arg(fleet)
        .args(files)
        .envs(env.iter().copied())
        .env("ADF_HOME", dir.join("home"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = std::fs::read_to_string(&info)
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
            && let Some(u) = v["url"].as_str()
        {
            return Ok((child, u.to_string()));
        }
        anyhow::ensure!(Instant::now() < deadline, "the daemon did not start");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

pub(crate) fn proc_rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .map(|kb: f64| kb / 1024.0)
        .unwrap_or(0.0)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len().saturating_sub(1)) as f64 * p).round() as usize).copied().unwrap_or(0.0)
}

pub(crate) fn agents(dir: &Path, n: usize, from: usize) -> anyhow::Result<Vec<PathBuf>> {
    (from..from + n)
        .map(|i| {
            let p = dir.join(format!("agent-{i:03}.adf"));
            // A real provider kind (Ollama needs no key, and a load calls no
            // model), so a loaded agent costs what a user's does.
            create_file(&p, &NewAgent { provider: Some("ollama"), model: Some("bench"), ..Default::default() })?;
            Ok(p)
        })
        .collect()
}

/// Start a daemon on an ephemeral port over `paths`; stop it with the sender.
async fn start(
    dir: &Path,
    files: Vec<PathBuf>,
) -> anyhow::Result<(Ready, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>)> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let mut paths = vec![dir.to_path_buf()];
    paths.extend(files);
    let opts = Options {
        host: "127.0.0.1".into(),
        port: 0,
        paths,
        heartbeat: Duration::from_secs(30),
        mesh_port: None,
        ..Default::default()
    };
    let task = tokio::spawn(async move {
        let stop = async move {
            let _ = stop_rx.await;
        };
        if let Err(e) = serve_with(opts, crate::runtime::fleet::accounts_factory(), stop, Some(ready_tx)).await {
            eprintln!("adf bench: daemon: {e}");
        }
    });
    let ready = ready_rx.await.map_err(|_| anyhow::anyhow!("the daemon did not start"))?;
    Ok((ready, stop_tx, task))
}

/// `short`: the CI form (200 idle agents, 2 s of events) instead of the
/// full one (1,000 agents, 10 s).
pub fn run(short: bool) -> anyhow::Result<Report> {
    let dir = std::env::temp_dir().join(format!("adf-bench-daemon-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let r = rt.block_on(run_in(&dir, short));
    let _ = std::fs::remove_dir_all(&dir);
    r
}

async fn run_in(dir: &Path, short: bool) -> anyhow::Result<Report> {
    let http = crate::providers::http_client();
    // The daemon as its own process: start to /health with 10 agents, and
    // its resident memory with 100 idle agents.
    let ten = dir.join("ten");
    std::fs::create_dir_all(&ten)?;
    let files = agents(&ten, 10, 0)?;
    let t0 = Instant::now();
    let (mut child, url) = spawn(dir, &ten, &files).await?;
    while http.get(format!("{url}/health")).send().await.is_err() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let start_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let _ = child.kill();
    let _ = child.wait();

    // Idle memory: the daemon's RSS with 10 agents, then with many (their
    // first timer tick parks them), and `GET /agents` over the many.
    let rss_of = async |n: usize, files: &[PathBuf]| -> anyhow::Result<(f64, Option<f64>)> {
        // A fleet folder of its own, empty: only the named files load.
        let fleet = dir.join(format!("fleet-{n}"));
        std::fs::create_dir_all(&fleet)?;
        let (mut child, url) = spawn(dir, &fleet, &files[..n]).await?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let rss = proc_rss_mb(child.id());
        let mut list = Vec::new();
        if n > 100 {
            let token = std::fs::read_to_string(dir.join("home/config/daemon-token"))?;
            for _ in 0..200 {
                let t = Instant::now();
                let r = http.get(format!("{url}/agents")).bearer_auth(token.trim()).send().await?;
                anyhow::ensure!(r.status().is_success(), "GET /agents: {}", r.status());
                let body = r.bytes().await?;
                // The answer as received; parsing it is the client's cost.
                list.push(t.elapsed().as_secs_f64() * 1000.0);
                let v: serde_json::Value = serde_json::from_slice(&body)?;
                // An empty fleet folder gets its starter agent beside the named files.
                let listed = v.as_array().map_or(0, Vec::len);
                anyhow::ensure!(listed == n || listed == n + 1, "GET /agents listed {listed} of {n}");
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        Ok((rss, (!list.is_empty()).then(|| pct(&mut list, 0.5))))
    };
    let idle_n = if short { 200 } else { 1000 };
    let many = dir.join("many");
    std::fs::create_dir_all(&many)?;
    let files = agents(&many, idle_n, 0)?;
    let (rss10, _) = rss_of(10, &files).await?;
    let (rss, _) = rss_of(100, &files).await?;
    let (rss_many, list_p50) = rss_of(idle_n, &files).await?;
    let idle_kb = (rss_many - rss10) * 1024.0 / (idle_n - 10) as f64;

    // In-process from here (the bench publishes on the daemon's bus):
    // loads, then the SSE fan-out.
    let extra_dir = dir.join("extra");
    std::fs::create_dir_all(&extra_dir)?;
    let extra = agents(&extra_dir, 50, 100)?;
    let base_dir = dir.join("base");
    std::fs::create_dir_all(&base_dir)?;
    let (ready, stop, task) = start(&base_dir, Vec::new()).await?;
    let base = format!("http://{}", ready.addr);
    let mut loads = Vec::new();
    for p in &extra {
        let t = Instant::now();
        let r = http
            .post(format!("{base}/agents/load"))
            .bearer_auth(&ready.token)
            .json(&json!({"filePath": p}))
            .send()
            .await?;
        anyhow::ensure!(r.status().is_success(), "load failed: {}", r.text().await.unwrap_or_default());
        loads.push(t.elapsed().as_secs_f64() * 1000.0);
    }

    // Owner writes on one agent: 8 clients, each PUT waits for its answer.
    let put_per_sec = {
        let id = {
            let r = http.get(format!("{base}/agents")).bearer_auth(&ready.token).send().await?;
            let v: serde_json::Value = r.json().await?;
            v[0]["id"].as_str().unwrap_or_default().to_string()
        };
        let n_each = if short { 250 } else { 1000 };
        let t = Instant::now();
        let mut writers = Vec::new();
        for c in 0..8 {
            let (http, base, token, id) = (http.clone(), base.clone(), ready.token.clone(), id.clone());
            writers.push(tokio::spawn(async move {
                for i in 0..n_each {
                    let r = http
                        .put(format!("{base}/agents/{id}/files/content"))
                        .bearer_auth(&token)
                        .json(&json!({"path": format!("notes/{c}.md"), "content": format!("note {i}")}))
                        .send()
                        .await?;
                    anyhow::ensure!(r.status().is_success(), "PUT failed: {}", r.status());
                }
                anyhow::Ok(())
            }));
        }
        for w in writers {
            w.await??;
        }
        (8 * n_each) as f64 / t.elapsed().as_secs_f64()
    };

    // 10 SSE clients, 20 000 events a second.
    let (clients, rate, secs) = (10usize, 20_000usize, if short { 2usize } else { 10 });
    let total = rate * secs;
    let start_cursor = ready.bus.cursor();
    let mut readers = Vec::new();
    for _ in 0..clients {
        let resp = http
            .get(format!("{base}/events?since={start_cursor}&types=custom.bench"))
            .bearer_auth(&ready.token)
            .send()
            .await?;
        readers.push(tokio::spawn(async move {
            use futures_util::StreamExt;
            let mut stream = resp.bytes_stream();
            let mut buf = String::new();
            let mut lat = Vec::with_capacity(total);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(secs as u64 + 20);
            while lat.len() < total {
                let Ok(Some(Ok(chunk))) = tokio::time::timeout_at(deadline, stream.next()).await else { break };
                buf.push_str(&String::from_utf8_lossy(&chunk));
                let mut start = 0;
                while let Some(end) = buf[start..].find("\n\n") {
                    let frame = &buf[start..start + end];
                    start += end + 2;
                    // The payload's `sent_us`, without parsing the frame.
                    if let Some(at) = frame.find("\"sent_us\":")
                        && let Some(sent) = frame[at + 10..]
                            .split(|c: char| !c.is_ascii_digit())
                            .next()
                            .and_then(|n| n.parse::<u64>().ok())
                    {
                        lat.push(micros().saturating_sub(sent) as f64 / 1000.0);
                    }
                }
                buf.drain(..start);
            }
            lat
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // 20 events every millisecond.
    let batch = 20;
    let tick = Duration::from_micros(1_000_000 / rate as u64 * batch as u64);
    let mut next = tokio::time::Instant::now();
    let mut sent = 0;
    while sent < total {
        for _ in 0..batch {
            ready.bus.publish(Envelope::new(
                "custom.bench",
                None,
                "system:bench",
                json!({"n": sent, "sent_us": micros()}),
            ));
            sent += 1;
        }
        next += tick;
        tokio::time::sleep_until(next).await;
    }
    let mut all = Vec::new();
    let mut dropped = 0;
    for r in readers {
        let lat = r.await.unwrap_or_default();
        dropped += total.saturating_sub(lat.len());
        all.extend(lat);
    }
    let _ = stop.send(());
    let _ = task.await;
    Ok(Report {
        start_to_health_ms: start_ms,
        rss_100_idle_agents_mb: rss,
        idle_agents: idle_n,
        rss_idle_agents_mb: rss_many,
        idle_kb_per_agent: idle_kb,
        list_p50_ms: list_p50.unwrap_or(0.0),
        load_p50_ms: pct(&mut loads, 0.5),
        load_p99_ms: pct(&mut loads, 0.99),
        sse_clients: clients,
        sse_events_per_client: total,
        sse_rate_per_sec: rate,
        sse_seconds: secs,
        sse_dropped: dropped,
        sse_delivery_p50_ms: pct(&mut all, 0.5),
        sse_delivery_p99_ms: pct(&mut all, 0.99),
        put_per_sec,
        targets: targets(),
    })
}

fn micros() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}
