//! The managed browser and the desktop (issue 22) against real peers:
//! Debian's Chromium over the DevTools protocol, Xvfb with Openbox, xdotool,
//! scrot, xclip and x11vnc. `.ci/run` installs them and runs these
//! (`--ignored`); a machine without them says so and skips.
//!
//! From scripted model turns: a page opened, typed into, clicked and read;
//! a screenshot that reaches the model as an image; a page that hangs
//! stopped at its timeout with the browser still usable; requests the
//! egress guard refuses (the metadata address, loopback without the
//! owner's leave); the profile sealed at close and restored from the
//! copied file under another data folder (cookies and storage back); the
//! visible browser on the agent's desktop, typed into with xdotool,
//! watched over VNC; nothing left running after the agent stops.

mod common;

use std::sync::Arc;
use std::time::Duration;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::executor::Executor;
use adf::store::{NewAgent, Store};
use common::*;
use serde_json::{Value, json};

const PAGE: &str = r#"<!doctype html><html><head><title>Form</title></head><body>
<h1>Hello form</h1><input id="name" onkeyup="document.getElementById('out').innerText='typed: '+this.value">
<button id="go" onclick="const v=document.getElementById('name').value; document.getElementById('out').innerText='Hello, '+v; document.cookie='seen='+v+'; max-age=86400'; localStorage.setItem('k', v);">Go</button>
<p id="out"></p></body></html>"#;

const WHOAMI: &str = r#"<!doctype html><html><body><p id="c"></p>
<script>document.getElementById('c').innerText = document.cookie + ' k=' + localStorage.getItem('k');</script></body></html>"#;

/// A page that reaches for the metadata address by a WebSocket and from a
/// worker: neither is a request the DevTools protocol pauses.
const SNEAK: &str = r#"<!doctype html><html><body><p id="s">sneak</p><script>
try { new WebSocket("ws://169.254.169.254/socket"); } catch (e) {}
const w = new Worker(URL.createObjectURL(new Blob(["fetch('http://169.254.169.254/from-worker').catch(()=>{})"], {type: "text/javascript"})));
</script></body></html>"#;

const META: &str =
    r#"<!doctype html><html><body><p>meta</p><img src="http://169.254.169.254/latest/meta-data/x.png"></body></html>"#;

async fn site() -> String {
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/", get(|| async { axum::response::Html(PAGE) }))
        .route("/whoami", get(|| async { axum::response::Html(WHOAMI) }))
        .route("/meta", get(|| async { axum::response::Html(META) }))
        .route("/sneak", get(|| async { axum::response::Html(SNEAK) }))
        .route(
            "/hang",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                "late"
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    url
}

fn agent(path: &std::path::Path, compute: Value, allow_local: bool) -> Store {
    let (mut s, _) = Store::create(
        path,
        &NewAgent { name: Some("surfer"), provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    let mut cfg = s.config_value().unwrap();
    let tools = cfg["tools"].as_array_mut().unwrap();
    for t in ["browser", "desktop"] {
        tools.push(json!({"name": t, "enabled": true, "visible": true}));
    }
    cfg["compute"] = compute;
    cfg["security"]["allow_local_fetch"] = json!(allow_local);
    cfg["model"]["multimodal"] = json!({"image": true});
    s.config_replace(cfg).unwrap();
    s
}

async fn calls(store: Store, calls: Vec<Value>) -> (Vec<(Value, bool)>, Executor, Arc<Scripted>) {
    let replies = vec![
        Reply::Tools(calls.iter().map(|v| (v["tool"].as_str().unwrap().to_string(), v["input"].clone())).collect()),
        Reply::Text("done".into()),
    ];
    let model = Arc::new(Scripted::new(replies));
    let before = tool_results(&store).len();
    let mut ex = Executor::new(store, model.clone(), Bus::new(), Arc::new(Approve::default())).unwrap();
    ex.chat("go").await.unwrap();
    // A copied file brings its earlier turns: only this one's results.
    let out = tool_results(&ex.store)
        .into_iter()
        .skip(before)
        .map(|(t, err)| (serde_json::from_str(&t).unwrap_or(Value::String(t)), err))
        .collect();
    (out, ex, model)
}

fn b(input: Value) -> Value {
    json!({"tool": "browser", "input": input})
}

fn dsk(input: Value) -> Value {
    json!({"tool": "desktop", "input": input})
}

fn good(r: &(Value, bool)) -> &Value {
    assert!(!r.1, "the call failed: {:?}", r.0);
    &r.0
}

/// Processes whose command line holds `needle`.
fn processes_with(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().chars().all(|c| c.is_ascii_digit()))
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " ").contains(needle))
                .unwrap_or(false)
        })
        .count()
}

fn skip(what: &[&str]) -> bool {
    let lack: Vec<&str> = what
        .iter()
        .copied()
        .filter(|p| {
            adf::runtime::compute::display::on_path(p).is_none()
                && !(*p == "chromium" && adf::runtime::compute::browser::executable().is_some())
        })
        .collect();
    if lack.is_empty() {
        return false;
    }
    if std::env::var("ADF_REQUIRE_BROWSER").is_ok_and(|v| v == "1") {
        panic!("the browser peers are required here but {lack:?} are missing");
    }
    eprintln!("SKIPPED: this machine lacks {lack:?}");
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium, Xvfb, xdotool, scrot, xclip, x11vnc (.ci/run)"]
async fn the_browser_and_the_desktop_work_for_the_agent_and_its_owner() {
    if skip(&["chromium", "Xvfb", "xauth", "xdotool", "scrot", "xclip", "x11vnc"]) {
        return;
    }
    let dir = tmp();
    let d = dir.path();
    unsafe { std::env::set_var("ADF_HOME", d.join("machine-a")) };
    let url = site().await;

    // A headless browser, from a scripted model turn.
    let file = d.join("surfer.adf");
    let s = agent(&file, json!({"enabled": true, "browser": false}), true);
    let (r, ex, model) = calls(
        s,
        vec![
            b(json!({"action": "open", "url": format!("{url}/")})),
            b(json!({"action": "type", "selector": "#name", "text": "Ann"})),
            b(json!({"action": "click", "selector": "#go"})),
            b(json!({"action": "read", "selector": "#out"})),
            b(json!({"action": "screenshot"})),
            b(json!({"action": "open", "url": format!("{url}/hang"), "timeout_ms": 1500})),
            b(json!({"action": "open", "url": format!("{url}/")})),
            b(json!({"action": "open", "url": format!("{url}/meta")})),
            b(json!({"action": "open", "url": "file:///etc/passwd"})),
            b(json!({"action": "click", "selector": "#nothing-here"})),
            b(json!({"action": "open", "url": format!("{url}/sneak")})),
            b(json!({"action": "read", "selector": "#s"})),
            b(json!({"action": "close"})),
        ],
    )
    .await;
    assert_eq!(good(&r[0])["title"], "Form", "{:?}", r[0]);
    assert_eq!(good(&r[3])["text"], "Hello, Ann", "{:?}", r[3]);
    let shot = good(&r[4]);
    let path = shot["path"].as_str().unwrap();
    assert_eq!((shot["width"].as_u64(), shot["height"].as_u64()), (Some(1280), Some(720)), "{shot}");
    let (_, png) = ex.store.file_read(path).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "the screenshot is a PNG in the agent's files");
    // The model took images: the screenshot went to it as one.
    let sent = serde_json::to_string(&model.requests()[1].messages).unwrap();
    assert!(
        sent.contains("\"image_url\"") && sent.contains("data:image/png;base64,"),
        "no image block was sent to the model"
    );
    assert!(
        r[5].1
            && r[5]
                .0
                .as_str()
                .unwrap()
                .contains("did not finish loading in 1500 ms; loading was stopped and a fresh page opened"),
        "{:?}",
        r[5]
    );
    assert_eq!(good(&r[6])["title"], "Form", "the browser is usable after a page that hangs: {:?}", r[6]);
    let blocked = good(&r[7])["blocked"].to_string();
    assert!(blocked.contains("169.254.169.254") && blocked.contains("metadata"), "{:?}", r[7]);
    assert!(r[8].1 && r[8].0.as_str().unwrap().contains("only http and https"), "{:?}", r[8]);
    assert!(r[9].1 && r[9].0.as_str().unwrap().contains("no element matches"), "{:?}", r[9]);
    let sneaked = format!(
        "{} {}",
        good(&r[10]).get("blocked").map(Value::to_string).unwrap_or_default(),
        good(&r[11]).get("blocked").map(Value::to_string).unwrap_or_default()
    );
    assert!(!sneaked.contains("cannot resolve"), "the browser's own lookups are not listed: {sneaked}");
    assert!(sneaked.contains("169.254.169.254:80"), "the WebSocket and the worker went through the guard: {sneaked}");
    assert!(good(&r[12])["profile_sealed_bytes"].as_u64().unwrap() > 100, "{:?}", r[12]);
    let profile = adf::runtime::compute::browser::profile_dir(ex.agent_id());
    let needle = format!("--user-data-dir={}", profile.display());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(processes_with(&needle), 0, "Chromium outlived close");
    assert!(ex.store.secret_get(adf::runtime::compute::browser::PROFILE_SECRET).unwrap().is_some());
    // Chromium was started with nothing of adf's environment.
    let launch =
        std::fs::read_to_string(d.join("machine-a/data/browser").join(format!("{}.launch", ex.agent_id()))).unwrap();
    assert!(launch.contains("env -i") && !launch.contains("ADF_HOME"), "{launch}");
    ex.store.close().unwrap();

    // Another machine: the file copied, another data folder; the sessions
    // come back from the sealed profile.
    let copy = d.join("copied.adf");
    std::fs::copy(&file, &copy).unwrap();
    unsafe { std::env::set_var("ADF_HOME", d.join("machine-b")) };
    let s = Store::open(&copy).unwrap();
    let (r, ex, _) = calls(
        s,
        vec![
            b(json!({"action": "open", "url": format!("{url}/whoami")})),
            b(json!({"action": "read", "selector": "#c"})),
        ],
    )
    .await;
    assert_eq!(good(&r[1])["text"], "seen=Ann k=Ann", "cookies and storage came with the file: {:?}", r[1]);
    let logs = ex
        .store
        .log_list(&adf::store::logs::LogQuery { origin: Some("compute"), limit: 50, ..Default::default() })
        .unwrap();
    assert!(logs.iter().any(|l| l.message.contains("profile restored")), "{logs:?}");
    adf::runtime::compute::release(ex.agent_id());
    adf::runtime::compute::containers::get().settle().await;
    ex.store.close().unwrap();

    // Without the owner's leave, this machine is out of reach.
    let s = agent(&d.join("closed.adf"), json!({"enabled": true, "browser": false}), false);
    let (r, ex, _) = calls(s, vec![b(json!({"action": "open", "url": format!("{url}/")}))]).await;
    assert!(r[0].1 && r[0].0.as_str().unwrap().contains("Blocked"), "{:?}", r[0]);
    adf::runtime::compute::release(ex.agent_id());
    adf::runtime::compute::containers::get().settle().await;
    ex.store.close().unwrap();

    // No compute: no browser.
    let s = agent(&d.join("nocompute.adf"), json!({"enabled": false}), true);
    let (r, ex, _) = calls(s, vec![b(json!({"action": "open", "url": format!("{url}/")}))]).await;
    assert!(r[0].1 && r[0].0.as_str().unwrap().contains("needs compute.enabled"), "{:?}", r[0]);
    ex.store.close().unwrap();

    // The visible browser on the agent's desktop.
    let s = agent(&d.join("desk.adf"), json!({"enabled": true}), true);
    let (r, ex, _) = calls(
        s,
        vec![
            b(json!({"action": "open", "url": format!("{url}/")})),
            b(json!({"action": "click", "selector": "#name"})),
            dsk(json!({"action": "type", "text": "Bob"})),
            b(json!({"action": "read", "selector": "#out"})),
            dsk(json!({"action": "screenshot"})),
            dsk(json!({"action": "clipboard_set", "text": "from the agent"})),
            dsk(json!({"action": "clipboard_get"})),
            dsk(json!({"action": "move", "x": 100, "y": 120})),
            dsk(json!({"action": "cursor"})),
            dsk(json!({"action": "click", "x": 5000, "y": 1})),
            b(json!({"action": "takeover", "reason": "a login"})),
            dsk(json!({"action": "key", "keys": "a exec sh"})),
            b(json!({"action": "click", "selector": "#name"})),
            dsk(json!({"action": "key", "keys": "ctrl+l"})),
            dsk(json!({"action": "type", "text": "file:///etc/hostname\n"})),
            b(json!({"action": "read"})),
        ],
    )
    .await;
    assert_eq!(good(&r[3])["text"], "typed: Bob", "xdotool typed into the visible browser: {:?}", r[3]);
    let shot = good(&r[4]);
    assert_eq!((shot["width"].as_u64(), shot["height"].as_u64()), (Some(1280), Some(800)), "{shot}");
    let (_, png_bytes) = ex.store.file_read(shot["path"].as_str().unwrap()).unwrap();
    let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let px = &buf[..info.buffer_size()];
    let colours: std::collections::BTreeSet<&[u8]> = px.chunks(info.color_type.samples()).step_by(97).collect();
    assert!(colours.len() > 5, "the desktop shows the browser ({} colours)", colours.len());
    assert_eq!(good(&r[6])["text"], "from the agent");
    assert_eq!((good(&r[8])["x"].as_i64(), good(&r[8])["y"].as_i64()), (Some(100), Some(120)));
    assert!(r[9].1 && r[9].0.as_str().unwrap().contains("off the 1280x800 screen"), "{:?}", r[9]);
    let t = good(&r[10]);
    let port = t["vnc_port"].as_u64().unwrap() as u16;
    assert!(t["how"].as_str().unwrap().contains("ssh -L"), "{t}");
    // A VNC viewer is greeted on loopback.
    let mut sock = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut hello = [0u8; 12];
    tokio::io::AsyncReadExt::read_exact(&mut sock, &mut hello).await.unwrap();
    assert!(hello.starts_with(b"RFB 003."), "{:?}", String::from_utf8_lossy(&hello));
    drop(sock);
    assert!(r[11].1 && r[11].0.as_str().unwrap().contains("\"exec\" is not a key name"), "{:?}", r[11]);
    let hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let seen = good(&r[15]);
    assert!(
        hostname.trim().is_empty() || !seen["text"].as_str().unwrap_or("").contains(hostname.trim()),
        "a file:// page loaded from the address bar: {seen}"
    );
    let display = adf::runtime::compute::display::get(ex.agent_id()).unwrap().number;
    let profile = adf::runtime::compute::browser::profile_dir(ex.agent_id());

    // The agent stops: its browser, desktop and VNC server go.
    adf::runtime::compute::release(ex.agent_id());
    adf::runtime::compute::containers::get().settle().await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(processes_with(&format!("--user-data-dir={}", profile.display())), 0, "Chromium outlived its agent");
    assert_eq!(processes_with(&format!("Xvfb :{display} ")), 0, "Xvfb outlived its agent");
    assert_eq!(processes_with(&format!("-rfbport {port}")), 0, "x11vnc outlived its agent");
    ex.store.close().unwrap();
}
