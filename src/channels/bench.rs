//! `adf bench channels` (issue 20's figures): an inbound message to an
//! inbox row (policy, de-duplication, the row; the model excluded), a
//! thousand messages that waited caught up in one wake, and what ten idle
//! channels add to memory. Telegram's side is a fake Bot API on loopback.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

#[derive(Debug, Serialize)]
pub struct Figures {
    pub deliver_p50_ms: f64,
    pub deliver_p99_ms: f64,
    pub catch_up_messages: usize,
    pub catch_up_s: f64,
    pub catch_up_wakes: i64,
    pub idle_channels: usize,
    pub idle_rss_added_mb: f64,
}

type Pending = Arc<Mutex<VecDeque<Value>>>;

async fn fake(pending: Pending) -> String {
    use axum::extract::{Path, State};
    async fn bot(
        State(p): State<Pending>,
        Path((_, method)): Path<(String, String)>,
        body: axum::Json<Value>,
    ) -> axum::Json<Value> {
        match method.as_str() {
            "getMe" => axum::Json(json!({"ok": true, "result": {"id": 1, "username": "bench_bot"}})),
            "getUpdates" => {
                if let Some(o) = body["offset"].as_i64() {
                    p.lock().map(|mut q| q.retain(|u| u["update_id"].as_i64().unwrap_or(0) >= o)).ok();
                }
                let batch: Vec<Value> = p.lock().map(|q| q.iter().cloned().collect()).unwrap_or_default();
                if batch.is_empty() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                axum::Json(json!({"ok": true, "result": batch}))
            }
            _ => axum::Json(json!({"ok": true, "result": {"message_id": 1}})),
        }
    }
    let app = axum::Router::new().route("/{token}/{method}", axum::routing::post(bot)).with_state(pending);
    let Ok(l) = tokio::net::TcpListener::bind("127.0.0.1:0").await else { return String::new() };
    let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    format!("http://{addr}")
}

fn dm(update: i64, text: &str) -> Value {
    json!({"update_id": update, "message": {"message_id": update, "date": 1_764_547_200,
        "from": {"id": 42, "username": "ann"}, "chat": {"id": 42, "type": "private"}, "text": text}})
}

fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

fn pct(mut v: Vec<Duration>, p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0)
}

/// An agent with a Telegram channel pointed at `api` (sealed token).
fn agent(dir: &std::path::Path, name: &str, api: &str, channel: bool) -> anyhow::Result<std::path::PathBuf> {
    let (inst, _) =
        crate::identity::install::load_or_create(&crate::paths::config_dir()).map_err(anyhow::Error::msg)?;
    let path = dir.join(format!("{name}.adf"));
    let (mut s, _) = crate::store::Store::create(
        &path,
        &crate::store::NewAgent {
            name: Some(name),
            provider: Some("scripted"),
            seal_to: Some(inst.clone()),
            ..Default::default()
        },
    )?;
    if channel {
        s.unlock(&inst)?;
        s.secret_set(super::telegram::TOKEN, b"1:BENCH", false)?;
        s.config_set(
            crate::store::Caller::Owner,
            "adapters.telegram",
            json!({"enabled": true, "config": {"api_url": api, "poll_timeout_s": 1}, "policy": {"dm": "all"}}),
        )?;
    }
    s.close()?;
    Ok(path)
}

pub fn run(messages: usize) -> anyhow::Result<Figures> {
    let dir = std::env::temp_dir().join(format!("adf-bench-channels-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _clean = Cleanup(dir.clone());
    // This bench's own install, never the user's.
    // SAFETY: set before the runtime starts any thread.
    unsafe { std::env::set_var("ADF_HOME", dir.join("home")) };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let pending: Pending = Default::default();
        let api = fake(pending.clone()).await;
        let mut q: VecDeque<Value> = (1..=messages as i64).map(|i| dm(i, &format!("message {i}"))).collect();
        pending.lock().map(|mut p| p.append(&mut q)).ok();
        let path = agent(&dir, "catchup", &api, true)?;
        let factory: crate::runtime::fleet::ProviderFactory = Arc::new(|_| {
            Ok(Arc::new(
                crate::providers::scripted::Scripted::new([])
                    .with_fallback(|_| crate::providers::scripted::Reply::Text("ok".into())),
            ) as Arc<dyn crate::providers::Provider>)
        });
        let mut fleet = crate::runtime::fleet::Fleet::new(crate::runtime::bus::Bus::new(), factory.clone());
        let t = Instant::now();
        fleet.load(&path).map_err(anyhow::Error::msg)?;
        let count = |p: &std::path::Path| -> i64 {
            rusqlite::Connection::open_with_flags(p, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .and_then(|c| c.query_row("SELECT count(*) FROM adf_inbox", [], |r| r.get(0)))
                .unwrap_or(0)
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while count(&path) < messages as i64 {
            anyhow::ensure!(Instant::now() < deadline, "catch-up did not finish in 60 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let catch_up_s = t.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let wakes: i64 = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?
            .query_row("SELECT count(*) FROM adf_loop WHERE content_json LIKE '%Inbox notification%'", [], |r| {
                r.get(0)
            })?;

        // One message to its inbox row, through the channel's delivery.
        let id = fleet.list().first().map(|a| a.id.clone()).unwrap_or_default();
        let mb = fleet.mesh.find(&id).ok_or_else(|| anyhow::anyhow!("no mailbox"))?;
        let policy = super::Policy::of(&json!({"policy": {"dm": "all"}}));
        let status: super::StatusCell = Default::default();
        let mut times = Vec::new();
        for i in 0..200 {
            let m = super::Inbound {
                kind: "telegram",
                chat_id: "42".into(),
                chat_type: "private".into(),
                message_id: format!("bench{i}"),
                sender_id: "42".into(),
                sender_name: "ann".into(),
                text: format!("latency {i}"),
                raw: json!({}),
                ..Default::default()
            };
            let (mb, p, s) = (mb.clone(), policy.clone(), status.clone());
            let t = Instant::now();
            tokio::task::spawn_blocking(move || super::deliver(&mb, &p, &m, &s)).await?.map_err(anyhow::Error::msg)?;
            times.push(t.elapsed());
        }
        fleet.shutdown().await;

        // Ten idle agents without channels, then ten with one each: what
        // the channels add is the difference.
        let mut added = Vec::new();
        for channel in [false, true] {
            let before = rss_mb();
            let mut idle = crate::runtime::fleet::Fleet::new(crate::runtime::bus::Bus::new(), factory.clone());
            for i in 0..10 {
                let p = agent(&dir, &format!("idle{i}-{channel}"), &api, channel)?;
                idle.load(&p).map_err(anyhow::Error::msg)?;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            added.push(rss_mb() - before);
            idle.shutdown().await;
        }
        let idle_rss_added_mb = (added[1] - added[0]).max(0.0);
        Ok(Figures {
            deliver_p50_ms: pct(times.clone(), 0.5),
            deliver_p99_ms: pct(times, 0.99),
            catch_up_messages: messages,
            catch_up_s,
            catch_up_wakes: wakes,
            idle_channels: 10,
            idle_rss_added_mb,
        })
    })
}

struct Cleanup(std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
