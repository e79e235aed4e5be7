//! Served agents against real web peers (issue 21; `.ci/run` installs
//! them from Debian): headless Chromium loads an agent's site whose page
//! opens a WebSocket to the agent and turns green on the route lambda's
//! answer (the screenshot's pixels are checked), and `wrk` drives an API
//! route with 16 connections for a few seconds without one error, and
//! Python's `websockets` client talks to a WS route. Ignored by default;
//! `cargo test --test web_peers -- --ignored` with `chromium`, `wrk` and
//! `python3` (with `websockets`) on the PATH (`ADF_CHROMIUM`, `ADF_WRK`,
//! `ADF_PYTHON` name others).

mod common;

use adf::runtime::bus::Bus;
use adf::runtime::fleet::Fleet;
use common::*;
use serde_json::json;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An agent `site` with a page, a WS echo route and an API route, served on
/// a mesh server of its own; the server's address.
async fn site(d: &std::path::Path) -> (Fleet, String) {
    ok(&adf(d, &["new", "site.adf", "--name", "site", "--provider", "anthropic", "--model", "m"], None));
    let put = |path: &str, body: &[u8]| ok(&adf(d, &["files", "put", "site.adf", path], Some(body)));
    put(
        "public/index.html",
        br##"<!doctype html><html><body style="margin:0;background:#ff0000">
<div id="out" style="font:20px sans-serif">waiting</div>
<script>
const ws = new WebSocket(location.origin.replace(/^http/, "ws") + "/agents/site/chat");
ws.onopen = () => ws.send("hello");
ws.onmessage = (e) => {
  document.getElementById("out").textContent = e.data;
  if (e.data === "echo:hello") document.body.style.background = "#00ff00";
};
</script></body></html>"##,
    );
    put("ws.ts", b"export function on(ev) { return ev.type === 'message' ? 'echo:' + ev.data : null; }");
    put("api.ts", b"export function item(req) { return { status: 200, body: { id: req.params.id } }; }");
    let serving = json!({"public": {"enabled": true}, "api": [
        {"method": "WS", "path": "/chat", "lambda": "ws.ts:on"},
        {"method": "GET", "path": "/items/:id", "lambda": "api.ts:item", "warm": true}
    ]});
    ok(&adf(d, &["config", "set", "site.adf", "serving", &serving.to_string()], None));
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let mut fleet = Fleet::new(Bus::new(), quiet_model());
    fleet.load(&d.join("site.adf")).unwrap();
    let addr = adf::runtime::mesh::server::serve(fleet.mesh.clone(), "127.0.0.1", 0).await.unwrap().to_string();
    (fleet, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium (the CI installs it)"]
async fn chromium_loads_the_site_and_talks_to_the_agent_over_a_websocket() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    let (fleet, addr) = site(d).await;
    let chromium = std::env::var("ADF_CHROMIUM").unwrap_or_else(|_| "chromium".into());
    // The route answers before any browser asks (its lambda's realm is
    // made on the first frame): a test client's echo.
    {
        use futures_util::{SinkExt, StreamExt};
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/agents/site/chat")).await.unwrap();
        ws.send(tokio_tungstenite::tungstenite::Message::text("hello")).await.unwrap();
        let answer = tokio::time::timeout(std::time::Duration::from_secs(30), ws.next()).await.unwrap();
        assert_eq!(answer.unwrap().unwrap().into_text().unwrap().as_str(), "echo:hello");
        let _ = ws.close(None).await;
    }
    // Headless Chromium's screenshot comes at the end of its virtual time
    // budget, which does not wait for a WebSocket: a page whose answer came
    // a moment later is photographed red. Up to three loads; one green
    // screenshot shows the whole path (page, socket, lambda, answer).
    let mut last = Vec::new();
    for attempt in 0..3 {
        let shot = d.join(format!("shot-{attempt}.png"));
        let out = tokio::process::Command::new(&chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=400,300",
                "--virtual-time-budget=5000",
            ])
            .arg(format!("--user-data-dir={}", d.join(format!("profile-{attempt}")).display()))
            .arg(format!("--screenshot={}", shot.display()))
            .arg(format!("http://{addr}/agents/site/"))
            .output()
            .await
            .unwrap_or_else(|e| panic!("{chromium}: {e}"));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        // The page turned green: the socket opened, the lambda answered.
        let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        let channels = info.color_type.samples();
        let px = |x: usize, y: usize| {
            let i = (y * info.width as usize + x) * channels;
            (buf[i], buf[i + 1], buf[i + 2])
        };
        assert_eq!((info.width, info.height), (400, 300));
        last = [(390, 290), (200, 150), (10, 280)].iter().map(|&(x, y)| px(x, y)).collect();
        // Only red (waiting) or green (answered): anything else is a page
        // that did not load.
        assert!(last.iter().all(|p| *p == (255, 0, 0) || *p == (0, 255, 0)), "attempt {attempt}: {last:?}");
        if last.iter().all(|p| *p == (0, 255, 0)) {
            break;
        }
    }
    assert!(last.iter().all(|p| *p == (0, 255, 0)), "the page did not get the agent's answer in three loads: {last:?}");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs wrk (the CI installs it)"]
async fn wrk_drives_an_api_route_without_an_error() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let (fleet, addr) = site(dir.path()).await;
    let wrk = std::env::var("ADF_WRK").unwrap_or_else(|_| "wrk".into());
    let out = tokio::process::Command::new(&wrk)
        .args(["-t2", "-c16", "-d4s", "--latency"])
        .arg(format!("http://{addr}/agents/site/items/42"))
        .output()
        .await
        .unwrap_or_else(|e| panic!("{wrk}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("{text}");
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains("Non-2xx or 3xx responses"), "{text}");
    assert!(!text.contains("Socket errors"), "{text}");
    let requests: u64 = text
        .lines()
        .find(|l| l.contains("requests in"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(requests >= 100, "{text}");
    // The route still answers afterwards.
    let v: serde_json::Value =
        reqwest::get(format!("http://{addr}/agents/site/items/7")).await.unwrap().json().await.unwrap();
    assert_eq!(v, json!({"id": "7"}));
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs python3 with the websockets package (the CI installs it)"]
async fn a_python_websockets_client_talks_to_the_route() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let (fleet, addr) = site(dir.path()).await;
    let python = std::env::var("ADF_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = format!(
        r#"
import asyncio, websockets
async def main():
    async with websockets.connect("ws://{addr}/agents/site/chat") as ws:
        for word in ["one", "two", "three"]:
            await ws.send(word)
            print(await asyncio.wait_for(ws.recv(), 10))
    try:
        async with websockets.connect("ws://{addr}/agents/site/nowhere") as ws:
            await asyncio.wait_for(ws.recv(), 10)
    except websockets.exceptions.ConnectionClosed as e:
        print("closed", e.rcvd.code)
asyncio.run(main())
"#
    );
    let out = tokio::process::Command::new(&python).arg("-c").arg(script).output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.lines().collect::<Vec<_>>(), ["echo:one", "echo:two", "echo:three", "closed 4004"]);
    fleet.shutdown().await;
}
