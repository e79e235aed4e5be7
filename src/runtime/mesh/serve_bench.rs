//! `adf bench serve` (issue 21's figures): a static file from an agent's
//! `public/` through the mesh server on loopback — its latency one request
//! at a time, and requests per second with 16 clients at once; then an API
//! route answered by a lambda, warm (realm kept) and cold (a fresh realm
//! each request), one request at a time; a WebSocket echo through a lambda;
//! and the memory 1,000 open sockets take.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

#[derive(Debug, Serialize)]
pub struct Figures {
    pub file_bytes: usize,
    pub requests: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub clients: usize,
    pub requests_per_s: f64,
    /// A `warm` API route's round trip (lambda, runner, HTTP), p50 / p99.
    pub api_warm_p50_ms: f64,
    pub api_warm_p99_ms: f64,
    /// The same route without `warm`: a fresh realm each request.
    pub api_cold_p50_ms: f64,
    /// A text frame to a WS route's lambda and its answer back, p50 / p99.
    pub ws_echo_p50_ms: f64,
    pub ws_echo_p99_ms: f64,
    /// Open sockets held at once, and the memory they added (MB).
    pub sockets: usize,
    pub sockets_mb: f64,
    /// Issue 21's targets, for `--check`.
    pub targets: serde_json::Value,
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0)
}

pub fn run(requests: usize) -> anyhow::Result<Figures> {
    let dir = std::env::temp_dir().join(format!("adf-bench-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _clean = Cleanup(dir.clone());
    // SAFETY: set before the runtime starts any thread.
    unsafe { std::env::set_var("ADF_HOME", dir.join("home")) };
    let path = dir.join("site.adf");
    let page = format!("<!doctype html><h1>bench</h1>{}", "<p>lorem ipsum dolor sit amet</p>".repeat(28));
    {
        let (mut s, _) = crate::store::Store::create(
            &path,
            &crate::store::NewAgent { name: Some("site"), provider: Some("scripted"), ..Default::default() },
        )?;
        s.file_write(crate::store::Caller::Owner, "public/index.html", page.as_bytes(), &Default::default())?;
        s.file_write(
            crate::store::Caller::Owner,
            "api.ts",
            b"export function item(req) { return { status: 200, body: { id: req.params.id, q: req.query } }; }\n",
            &Default::default(),
        )?;
        s.file_write(
            crate::store::Caller::Owner,
            "ws.ts",
            b"export function on(ev) { return ev.type === 'message' ? 'echo:' + ev.data : null; }\n",
            &Default::default(),
        )?;
        let api = json!([
            {"method": "GET", "path": "/warm/:id", "lambda": "api.ts:item", "warm": true},
            {"method": "GET", "path": "/cold/:id", "lambda": "api.ts:item"},
            {"method": "WS", "path": "/echo", "lambda": "ws.ts:on"},
            {"method": "WS", "path": "/hold", "lambda": "adf:inbox"}
        ]);
        s.config_set(crate::store::Caller::Owner, "serving", json!({"public": {"enabled": true}, "api": api}))?;
        s.close()?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let factory: crate::runtime::fleet::ProviderFactory = Arc::new(|_| {
            Ok(Arc::new(
                crate::providers::scripted::Scripted::new([])
                    .with_fallback(|_| crate::providers::scripted::Reply::Text("ok".into())),
            ) as Arc<dyn crate::providers::Provider>)
        });
        let mut fleet = crate::runtime::fleet::Fleet::new(crate::runtime::bus::Bus::new(), factory);
        fleet.load(&path).map_err(anyhow::Error::msg)?;
        let addr = super::server::serve(fleet.mesh.clone(), "127.0.0.1", 0).await?;
        let url = format!("http://{addr}/agents/site/");
        let http = reqwest::Client::builder().http1_only().build()?;
        // Warm the connection and the file's page cache.
        for _ in 0..50 {
            http.get(&url).send().await?.bytes().await?;
        }
        let mut times = Vec::with_capacity(requests);
        for _ in 0..requests {
            let t = Instant::now();
            let r = http.get(&url).send().await?;
            anyhow::ensure!(r.status() == 200, "HTTP {}", r.status());
            r.bytes().await?;
            times.push(t.elapsed());
        }
        let clients = 16;
        let done = Arc::new(AtomicUsize::new(0));
        let until = Instant::now() + Duration::from_secs(2);
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let (http, url, done) = (http.clone(), url.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < until {
                    // Only a whole 200 counts.
                    if let Ok(r) = http.get(&url).send().await
                        && r.status() == 200
                        && r.bytes().await.is_ok()
                    {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        let rps = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
        let route = async |kind: &str, n: usize| -> anyhow::Result<Vec<Duration>> {
            let mut times = Vec::with_capacity(n);
            for i in 0..n + 20 {
                let t = Instant::now();
                let r = http.get(format!("http://{addr}/agents/site/{kind}/{i}?x=1")).send().await?;
                anyhow::ensure!(r.status() == 200, "{kind} route: HTTP {}", r.status());
                r.bytes().await?;
                // The first requests open the runner and start the realm.
                if i >= 20 {
                    times.push(t.elapsed());
                }
            }
            Ok(times)
        };
        let mut warm = route("warm", requests).await?;
        let mut cold = route("cold", (requests / 4).max(20)).await?;
        let (mut echo, sockets, sockets_mb) = sockets(&addr.to_string(), requests).await?;
        fleet.shutdown().await;
        Ok(Figures {
            file_bytes: page.len(),
            requests,
            p50_ms: pct(&mut times, 0.5),
            p99_ms: pct(&mut times, 0.99),
            clients,
            requests_per_s: rps,
            api_warm_p50_ms: pct(&mut warm, 0.5),
            api_warm_p99_ms: pct(&mut warm, 0.99),
            api_cold_p50_ms: pct(&mut cold, 0.5),
            ws_echo_p50_ms: pct(&mut echo, 0.5),
            ws_echo_p99_ms: pct(&mut echo, 0.99),
            sockets,
            sockets_mb,
            targets: json!({"p50_ms": {"max": 1.0}, "requests_per_s": {"min": 5000.0}, "api_warm_p50_ms": {"max": 2.0},
                "ws_echo_p50_ms": {"max": 2.0}, "sockets_mb": {"max": 50.0}}),
        })
    })
}

/// The echo's round trips, then 1,000 sockets held open: their memory.
async fn sockets(addr: &str, n: usize) -> anyhow::Result<(Vec<Duration>, usize, f64)> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    crate::daemon::conn::raise_nofile();
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/agents/site/echo")).await?;
    let mut times = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        ws.send(Message::Text(format!("m{i}").into())).await?;
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) if t.as_str() == format!("echo:m{i}") => break,
                Some(Ok(Message::Text(_) | Message::Ping(_) | Message::Pong(_))) => continue,
                other => anyhow::bail!("the echo socket ended: {other:?}"),
            }
        }
        if i >= 20 {
            times.push(t.elapsed());
        }
    }
    let _ = ws.close(None).await;
    let held = 1000;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = crate::daemon::bench::proc_rss_mb(std::process::id());
    let mut open = Vec::with_capacity(held);
    for _ in 0..held {
        let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/agents/site/hold")).await?;
        open.push(ws);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = crate::daemon::bench::proc_rss_mb(std::process::id());
    drop(open);
    // Both ends are in this process: the figure is the server side and the
    // bench's own client side together.
    Ok((times, held, after - before))
}
