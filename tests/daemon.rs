//! `adf daemon` as a process on loopback: the route groups with good and
//! bad input, authentication and cross-site refusals, one daemon per fleet,
//! the SSE stream with replay from a cursor and `Last-Event-ID`, and the
//! OpenAPI document checked against what the server serves.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::fake_provider::*;
use common::*;
use serde_json::{Value, json};

struct Daemon {
    child: Child,
    url: String,
    token: String,
    home: PathBuf,
    http: reqwest::Client,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(home: &Path, base: &str, extra: &[&str]) -> Daemon {
    let fleet = home.join("data/agents");
    // A daemon killed by an earlier step leaves its discovery file behind:
    // wait for this one's, not that.
    let _ = std::fs::remove_file(fleet.join(".daemon.json"));
    let child = Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(["daemon", "--port", "0"])
        .args(extra)
        .env("ADF_HOME", home)
        .env("ANTHROPIC_API_KEY", "sk-test")
        .env("ANTHROPIC_BASE_URL", base)
        .env_remove("ADF_DAEMON_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let v = daemon_info(&fleet, Duration::from_secs(20));
    let token = std::fs::read_to_string(home.join("config/daemon-token")).unwrap();
    Daemon {
        child,
        url: v["url"].as_str().unwrap().to_string(),
        token,
        home: home.to_path_buf(),
        http: adf::providers::http_client(),
    }
}

impl Daemon {
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut r = self.http.request(m, format!("{}{path}", self.url)).bearer_auth(&self.token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Stop the daemon and return what it said on stderr.
    fn stop_stderr(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut s = String::new();
        use std::io::Read;
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }

    async fn get(&self, path: &str) -> Value {
        let (s, v) = self.call("GET", path, None).await;
        assert_eq!(s, 200, "GET {path}: {v}");
        v
    }

    async fn raw(&self, path: &str, headers: &[(&str, &str)]) -> u16 {
        let mut r = self.http.get(format!("{}{path}", self.url));
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.send().await.unwrap().status().as_u16()
    }

    /// Wait until the agent's loop has a row containing `text`.
    async fn wait_loop(&self, agent: &str, text: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v = self.get(&format!("/agents/{agent}/loop?limit=500")).await;
            if v["entries"].to_string().contains(text) {
                return v;
            }
            assert!(Instant::now() < deadline, "no {text:?} in the loop: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn home_with(dir: &Path, names: &[&str]) -> PathBuf {
    let home = dir.join("home");
    let agents = home.join("data/agents");
    std::fs::create_dir_all(&agents).unwrap();
    for n in names {
        ok(&adf_home(&home, &agents, &["new", &format!("{n}.adf"), "--provider", "anthropic", "--model", "m"]));
    }
    home
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_host_origin_and_one_daemon_per_fleet() {
    let dir = tmp();
    let home = home_with(dir.path(), &["a"]);
    let d = start(&home, "http://127.0.0.1:9", &[]);
    assert_eq!(d.token.len(), 64);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(home.join("config/daemon-token")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert_eq!(d.raw("/health", &[]).await, 200, "health needs no token");
    assert_eq!(d.raw("/agents", &[]).await, 401);
    assert_eq!(d.raw("/agents", &[("authorization", "Bearer nope")]).await, 401);
    let bearer = format!("Bearer {}", d.token);
    assert_eq!(d.raw("/agents", &[("authorization", &bearer)]).await, 200);
    assert_eq!(d.raw("/agents", &[("authorization", &bearer), ("host", "evil.example:80")]).await, 403);
    assert_eq!(d.raw("/agents", &[("authorization", &bearer), ("origin", "https://evil.example")]).await, 403);
    assert_eq!(d.raw("/agents", &[("authorization", &bearer), ("sec-fetch-site", "cross-site")]).await, 403);
    let resp = d.http.get(format!("{}/agents", d.url)).bearer_auth(&d.token).send().await.unwrap();
    assert!(resp.headers().get("access-control-allow-origin").is_none(), "no CORS");
    // A second daemon on the same fleet says who holds it.
    let out = Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(["daemon", "--port", "0"])
        .env("ADF_HOME", &home)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a daemon already runs for this fleet (pid"), "{err}");
    // Beyond loopback without an explicit token: refuses to start.
    let out = Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(["daemon", "--host", "0.0.0.0", "--port", "0"])
        .env("ADF_HOME", dir.path().join("other"))
        .env_remove("ADF_DAEMON_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("without ADF_DAEMON_TOKEN"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_groups_with_good_and_bad_input() {
    let dir = tmp();
    let home = home_with(dir.path(), &["a", "b"]);
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_text(&["Hello ", "from the daemon."], 10, 5)),
        Scripted::sse(anthropic_tool(
            "toolu_1",
            "sys_update_config",
            r#"{"path":"description","value":"via api","_reason":"asked to"}"#,
        )),
        Scripted::sse(anthropic_text(&["Updated."], 4, 2)),
    ])
    .await;
    let d = start(&home, &fake.base_url, &[]);
    // Agents, by name, handle or id.
    let agents = d.get("/agents").await;
    assert_eq!(agents.as_array().unwrap().len(), 2);
    let id = agents.as_array().unwrap().iter().find(|a| a["name"] == "a").unwrap()["id"].as_str().unwrap().to_string();
    assert_eq!(d.get("/agents/a/status").await["id"], id.as_str());
    assert_eq!(d.get(&format!("/agents/{id}")).await["config"]["name"], "a");
    let (s, v) = d.call("GET", "/agents/nobody/status", None).await;
    assert_eq!((s, v["error"].as_str().unwrap()), (404, "Agent not found: nobody"));

    // Chat: 202, the reply lands in the loop; usage follows.
    let (s, v) = d.call("POST", "/agents/a/chat", Some(json!({"text": "hi"}))).await;
    assert_eq!(s, 202, "{v}");
    assert!(v["turnId"].as_str().unwrap().starts_with("turn_"));
    d.wait_loop("a", "from the daemon.").await;
    let (s, v) = d.call("POST", "/agents/a/chat", Some(json!({"text": ""}))).await;
    assert_eq!((s, v["error"].as_str().unwrap()), (400, "text is required"));
    let (s, v) = d.call("POST", "/agents/a/chat", None).await;
    assert_eq!(s, 400, "{v}");
    let resp =
        d.http.post(format!("{}/agents/a/chat", d.url)).bearer_auth(&d.token).body("{not json").send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().starts_with("malformed JSON body"), "{v}");
    let u = d.get("/agents/a/usage").await;
    assert_eq!(u["totals"]["input_tokens"], 10);
    assert_eq!(d.get("/agents/a/chat").await["chatHistory"]["version"], 1);

    // An approval through the API, then resolving it again is a conflict.
    d.call("POST", "/agents/a/chat", Some(json!({"text": "update your description"}))).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let task = loop {
        let t = d.get("/agents/a/tasks?status=pending_approval").await;
        if let Some(task) = t["tasks"].as_array().unwrap().first() {
            break task["id"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "no pending approval");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (s, v) = d.call("POST", &format!("/agents/a/tasks/{task}/resolve"), Some(json!({"action": "maybe"}))).await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = d.call("POST", &format!("/agents/a/tasks/{task}/resolve"), Some(json!({"action": "approve"}))).await;
    assert_eq!(s, 200, "{v}");
    d.wait_loop("a", "Updated.").await;
    assert_eq!(d.get("/agents/a/config").await["config"]["description"], "via api");
    let (s, v) = d.call("POST", &format!("/agents/a/tasks/{task}/resolve"), Some(json!({"action": "deny"}))).await;
    assert_eq!(s, 409, "{v}");
    let (s, _) = d.call("GET", "/agents/a/tasks/nope", None).await;
    assert_eq!(s, 404);
    assert!(d.get("/agents/a/asks").await["asks"].as_array().unwrap().is_empty());

    // Config: a bad value is refused and changes nothing.
    let before = d.get("/agents/b/config").await["config"].clone();
    let mut cfg = before.clone();
    cfg["context"]["compact_threshold"] = json!("lots");
    let (s, v) = d.call("PUT", "/agents/b/config", Some(cfg)).await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("compact_threshold"), "{v}");
    assert_eq!(d.get("/agents/b/config").await["config"], before);
    let (s, _) = d.call("PUT", "/agents/b/config", Some(json!([1, 2]))).await;
    assert_eq!(s, 400);

    // Files, document and mind.
    let (s, v) = d.call("PUT", "/agents/b/files/content?path=notes/a.md", Some(json!({"content": "# A\n"}))).await;
    assert_eq!(s, 200, "{v}");
    let f = d.get("/agents/b/files/content?path=notes/a.md").await;
    assert_eq!((f["encoding"].as_str(), f["content"].as_str()), (Some("utf-8"), Some("# A\n")));
    let (s, v) =
        d.call("PATCH", "/agents/b/files/authorized", Some(json!({"path": "notes/a.md", "authorized": true}))).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(d.get("/agents/b/files/content?path=notes/a.md").await["authorized"], json!(true));
    let (s, _) =
        d.call("PATCH", "/agents/b/files/authorized", Some(json!({"path": "nope.md", "authorized": true}))).await;
    assert_eq!(s, 404);
    let (s, _) = d.call("PATCH", "/agents/b/files/authorized", Some(json!({"path": "notes/a.md"}))).await;
    assert_eq!(s, 400, "authorized is required");
    let (s, _) = d.call("GET", "/agents/b/files/content", None).await;
    assert_eq!(s, 400, "path is required");
    let (s, _) = d.call("GET", "/agents/b/files/content?path=nope.md", None).await;
    assert_eq!(s, 404);
    let (s, v) = d.call("DELETE", "/agents/b/files/content?path=mind.md", None).await;
    assert_eq!(s, 403, "a protected file: {v}");
    d.call("PUT", "/agents/b/files/content?path=bin.dat", Some(json!({"content_base64": "AAEC"}))).await;
    assert_eq!(d.get("/agents/b/files/content?path=bin.dat").await["content_base64"], "AAEC");
    let (s, _) =
        d.call("POST", "/agents/b/files/rename", Some(json!({"oldPath": "notes/a.md", "newPath": "notes/b.md"}))).await;
    assert_eq!(s, 200);
    let files = d.get("/agents/b/files").await;
    assert!(files["files"].to_string().contains("notes/b.md"));
    d.call("PUT", "/agents/b/mind", Some(json!({"content": "remember tea"}))).await;
    assert_eq!(d.get("/agents/b/mind").await["content"], "remember tea");
    assert!(d.get("/agents/b/document").await["content"].as_str().unwrap().starts_with("# b"));

    // Meta.
    let (s, _) = d.call("PUT", "/agents/b/meta/colour", Some(json!({"value": "blue"}))).await;
    assert_eq!(s, 200);
    assert!(d.get("/agents/b/meta").await["entries"].to_string().contains("blue"));
    let (s, _) = d.call("PUT", "/agents/b/meta/colour", Some(json!({"value": 3}))).await;
    assert_eq!(s, 400, "value must be a string");
    assert_eq!(d.call("DELETE", "/agents/b/meta/colour", None).await.0, 200);
    assert_eq!(d.call("DELETE", "/agents/b/meta/colour", None).await.0, 404);

    // Tables, inbox, outbox, timers.
    assert!(d.get("/agents/b/tables").await["tables"].is_array());
    let (s, v) = d.call("GET", "/agents/b/tables/adf_meta", None).await;
    assert_eq!(s, 400, "{v}");
    assert!(d.get("/agents/b/tables/adf_audit").await["rows"].is_array());
    assert!(d.get("/agents/b/inbox").await["messages"].is_array());
    assert!(d.get("/agents/b/outbox?status=sent").await["messages"].is_array());
    let (s, v) = d.call("POST", "/agents/b/timers", Some(json!({"mode": "once_delay", "delay_ms": 3_600_000}))).await;
    assert_eq!(s, 200, "{v}");
    let timer = v["id"].as_i64().unwrap();
    let t = d.get("/agents/b/timers").await;
    assert_eq!(t["timers"][0]["scope"], json!(["agent"]), "the owner's default scope is agent");
    let (s, v) = d.call("POST", "/agents/b/timers", Some(json!({"mode": "sometime"}))).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(d.call("DELETE", &format!("/agents/b/timers/{timer}"), None).await.0, 200);
    assert_eq!(d.call("DELETE", "/agents/b/timers/x", None).await.0, 400);

    // Lifecycle: state, stop (unload), start loads it again.
    let (s, v) = d.call("POST", "/agents/b/state", Some(json!({"state": "dancing"}))).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(d.call("POST", "/agents/b/state", Some(json!({"state": "hibernate"}))).await.0, 200);
    assert_eq!(d.call("POST", "/agents/b/abort", None).await.0, 200);
    assert_eq!(d.call("POST", "/agents/b/stop", None).await.0, 200);
    assert_eq!(d.get("/agents").await.as_array().unwrap().len(), 1);
    let path = home.join("data/agents/b.adf");
    let (s, v) = d.call("POST", "/agents/load", Some(json!({"filePath": path}))).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(d.get("/agents").await.as_array().unwrap().len(), 2);
    let (s, _) = d.call("POST", "/agents/load", Some(json!({"filePath": "/nowhere.adf"}))).await;
    assert_eq!(s, 404);

    // Runtime diagnostics never carry a key.
    let p = d.get("/runtime/providers").await;
    assert!(!p.to_string().contains("sk-test"), "{p}");
    assert_eq!(d.get("/runtime").await["agents"].as_array().unwrap().len(), 2);
    assert!(d.get("/diagnostics").await["daemon"]["pid"].is_number());

    // A message sent as the agent, without a turn: checked like msg_send.
    let (s, v) = d.call("POST", "/agents/a/messages", Some(json!({"recipient": "b"}))).await;
    assert_eq!((s, v["error"].as_str().unwrap_or("")), (400, "`content` (a non-empty string) is required"));
    let (s, _) = d.call("POST", "/agents/nobody/messages", Some(json!({"recipient": "b", "content": "x"}))).await;
    assert_eq!(s, 404);
    let (s, v) = d.call("POST", "/agents/a/messages", Some(json!({"recipient": "no-such-peer", "content": "x"}))).await;
    assert_eq!((s, v["code"].as_str()), (422, Some("SEND_FAILED")), "{v}");

    // A sign-in made elsewhere is sealed only for the server's own URL.
    let mut cfg = d.get("/agents/a/config").await["config"].clone();
    cfg["mcp"] = json!({"servers": [{"name": "web", "transport": "http", "url": "http://127.0.0.1:9/mcp"}]});
    assert_eq!(d.call("PUT", "/agents/a/config", Some(cfg)).await.0, 200);
    let signed = |url: &str| json!({"oauth": json!({"url": url, "credentials": {"client_id": "c"}}).to_string()});
    let (s, _) = d.call("PUT", "/agents/a/mcp/nope/oauth", Some(signed("http://127.0.0.1:9/mcp"))).await;
    assert_eq!(s, 404);
    let (s, v) = d.call("PUT", "/agents/a/mcp/web/oauth", Some(signed("http://elsewhere.test/mcp"))).await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = d.call("PUT", "/agents/a/mcp/web/oauth", Some(signed("http://127.0.0.1:9/mcp"))).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(d.get("/agents/a/config").await["config"]["mcp"]["servers"][0]["auth"], "oauth");
    assert!(!d.get("/agents/a/mcp").await.to_string().contains("client_id"), "never in answers");
    let _ = d.home.clone();
}

/// Every SSE frame's data (JSON) that arrives within `within`.
async fn read_event_frames(resp: reqwest::Response, within: Duration) -> Vec<Value> {
    use futures_util::StreamExt;
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    while let Ok(Some(Ok(bytes))) = tokio::time::timeout_at(deadline, stream.next()).await {
        buf.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            if let Some(data) = frame.lines().find_map(|l| l.strip_prefix("data: ")) {
                out.push(serde_json::from_str(data).unwrap_or(Value::Null));
            }
        }
    }
    out
}

/// Read SSE frames until `n` events arrived (or a timeout).
async fn read_events(resp: reqwest::Response, n: usize) -> Vec<(u64, String)> {
    use futures_util::StreamExt;
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while out.len() < n {
        let chunk = tokio::time::timeout_at(deadline, stream.next()).await;
        let Ok(Some(Ok(bytes))) = chunk else { break };
        buf.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            let id = frame.lines().find_map(|l| l.strip_prefix("id: ")).and_then(|v| v.parse().ok());
            let ty = frame.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("").to_string();
            if let Some(id) = id {
                out.push((id, ty));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_replays_from_a_cursor_and_last_event_id() {
    let dir = tmp();
    let home = home_with(dir.path(), &["a"]);
    let fake = FakeProvider::start(vec![Scripted::sse(anthropic_text(&["one"], 1, 1))]).await;
    let d = start(&home, &fake.base_url, &[]);
    d.call("POST", "/agents/a/chat", Some(json!({"text": "go"}))).await;
    d.wait_loop("a", "one").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Everything in the ring, in cursor order.
    let resp = d.http.get(format!("{}/events", d.url)).bearer_auth(&d.token).send().await.unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream; charset=utf-8");
    let all = read_events(resp, 6).await;
    assert!(all.len() >= 6, "{all:?}");
    let cursors: Vec<u64> = all.iter().map(|e| e.0).collect();
    assert_eq!(cursors, (1..=cursors.len() as u64).collect::<Vec<_>>());
    // From a cursor: exactly what came after it.
    let k = cursors[2];
    let resp = d.http.get(format!("{}/events?since={k}", d.url)).bearer_auth(&d.token).send().await.unwrap();
    let after = read_events(resp, all.len() - 3).await;
    assert_eq!(after, all[3..].to_vec());
    // A reconnect with Last-Event-ID loses nothing.
    let resp = d
        .http
        .get(format!("{}/events", d.url))
        .bearer_auth(&d.token)
        .header("last-event-id", k.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(read_events(resp, all.len() - 3).await, all[3..].to_vec());
    let (s, _) = d.call("GET", "/events?since=soon", None).await;
    assert_eq!(s, 400);
    // What is ready goes out together: the replayed ring is one chunk after
    // `: connected`, not one chunk per event.
    let mut resp = d.http.get(format!("{}/events?since=0", d.url)).bearer_auth(&d.token).send().await.unwrap();
    assert_eq!(resp.chunk().await.unwrap().unwrap(), ": connected\n\n");
    let replay = String::from_utf8(resp.chunk().await.unwrap().unwrap().to_vec()).unwrap();
    assert!(replay.matches("\n\n").count() >= 6, "the ring in one chunk: {replay}");
    // One agent's stream: the same events, only that agent's.
    let resp = d.http.get(format!("{}/agents/a/events?since=0", d.url)).bearer_auth(&d.token).send().await.unwrap();
    let mine = read_events(resp, all.len() - 1).await;
    assert!(!mine.is_empty() && mine.iter().all(|(_, ty)| ty != "daemon.started"), "{mine:?}");
    assert_eq!(d.call("GET", "/agents/nobody/events", None).await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_matches_the_routes_served() {
    let dir = tmp();
    let home = home_with(dir.path(), &["a"]);
    let d = start(&home, "http://127.0.0.1:9", &[]);
    let doc = d.get("/openapi.json").await;
    assert_eq!(doc["openapi"], "3.0.3");
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() > 30);
    for (path, ops) in paths {
        for method in ops.as_object().unwrap().keys() {
            if path.ends_with("/events") {
                continue;
            }
            let concrete =
                path.replace("{id}", "a").replace("{key}", "k").replace("{table}", "local_x").replace("{timer}", "1");
            let concrete = concrete.replace("{task}", "t").replace("{request}", "r");
            let mut req = d
                .http
                .request(
                    reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap(),
                    format!("{}{concrete}", d.url),
                )
                .bearer_auth(&d.token);
            if ops[method].get("requestBody").is_some() {
                req = req.json(&json!({}));
            }
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap();
            assert_ne!(status, 405, "{method} {path} is documented but not served");
            if status == 404 {
                let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                assert!(v["error"].is_string(), "{method} {path}: {text}");
                assert_ne!(v["code"], "NO_ROUTE", "{method} {path}: a 404 from the router, not the route: {text}");
            }
            assert!(status < 500 || method != "get", "{method} {path}: {status} {text}");
        }
    }
}

/// Run the CLI against the daemon (found through the fleet's `.daemon.json`
/// and the token file, as a local user's `adf` does).
fn cli(home: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(args)
        .env("ADF_HOME", home)
        .env_remove("ADF_DAEMON_URL")
        .env_remove("ADF_DAEMON_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn cli_ok(home: &Path, args: &[&str]) -> String {
    let out = cli(home, args);
    assert!(out.status.success(), "adf {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_against_a_live_daemon() {
    let dir = tmp();
    let home = home_with(dir.path(), &["a"]);
    // Two agents named alike: a name that is not unique lists the candidates.
    let agents = home.join("data/agents");
    ok(&adf_home(&home, &agents, &["new", "twin1.adf", "--name", "twin", "--provider", "anthropic", "--model", "m"]));
    ok(&adf_home(&home, &agents, &["new", "twin2.adf", "--name", "twin", "--provider", "anthropic", "--model", "m"]));
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_text(&["Hi ", "from the CLI."], 3, 2)),
        Scripted::sse(anthropic_tool("toolu_9", "sys_update_config", r#"{"path":"description","value":"from cli"}"#)),
        Scripted::sse(anthropic_text(&["Done."], 3, 2)),
        Scripted::sse(anthropic_text(&["Later."], 3, 2)),
    ])
    .await;
    let d = start(&home, &fake.base_url, &[]);
    let h = home.clone();
    tokio::task::spawn_blocking(move || {
        let home = h;
        let list = cli_ok(&home, &["agents"]);
        assert!(list.starts_with("ID") && list.contains(" a ") && list.contains("twin"), "{list}");
        let v: Value = serde_json::from_str(&cli_ok(&home, &["agents", "--json"])).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 3);
        assert!(cli_ok(&home, &["status", "a"]).contains("runtimeState: idle"));
        // The reply streams to stdout as in-process `adf chat` does.
        let reply = cli_ok(&home, &["chat", "a", "hello", "there"]);
        assert_eq!(reply.trim(), "Hi from the CLI.");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cli_ok(&home, &["usage", "a"]).contains("m ") {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(cli_ok(&home, &["files", "a"]).contains("mind.md"));
        assert!(cli_ok(&home, &["file", "a", "mind.md"]).starts_with("# Mind"));
        let cfg: Value = serde_json::from_str(&cli_ok(&home, &["config", "a"])).unwrap();
        assert_eq!(cfg["name"], "a");
        // An approval answered from the CLI: the chat says what waits, exit 3.
        let out = cli(&home, &["chat", "a", "change", "it"]);
        assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("waits for you on task"));
        let task = loop {
            let v: Value = serde_json::from_str(&cli_ok(&home, &["tasks", "a", "--json"])).unwrap();
            let pending = v["tasks"].as_array().unwrap().iter().find(|t| t["status"] == "pending_approval").cloned();
            if let Some(t) = pending {
                break t["id"].as_str().unwrap().to_string();
            }
            assert!(Instant::now() < deadline, "{v}");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(cli_ok(&home, &["task", "a", &task]).contains("status: pending_approval"));
        assert_eq!(cli_ok(&home, &["approve", "a", &task]).trim(), "approved");
        let out = cli(&home, &["approve", "a", &task]);
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("not pending"), "resolved already");
        assert!(cli_ok(&home, &["asks", "a"]).starts_with("REQUEST"));
        // --no-wait answers with the id the turn's events carry.
        let turn = cli_ok(&home, &["chat", "a", "later", "--no-wait"]);
        assert!(turn.trim().starts_with("turn_"), "{turn}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v: Value = serde_json::from_str(&cli_ok(&home, &["usage", "a", "--json"])).unwrap();
            if v["byModel"]["m"]["calls"].as_u64() >= Some(4) {
                break;
            }
            assert!(Instant::now() < deadline, "{v}");
            std::thread::sleep(Duration::from_millis(50));
        }
        for args in [&["inbox", "a"][..], &["outbox", "a"], &["timers", "a"], &["runtime"], &["providers"], &["usage"]]
        {
            cli_ok(&home, args);
        }
        // Bad input: an unknown agent, an ambiguous name, one line each.
        let out = cli(&home, &["status", "nobody"]);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "adf: Agent not found: nobody");
        let out = cli(&home, &["status", "twin"]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("\"twin\" names 2 agents"), "{err}");
    })
    .await
    .unwrap();
    drop(d);
    // Without a daemon: how to start one.
    let out = cli(&home, &["status", "a"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("start one with `adf daemon`"), "{err}");
}

/// A file the owner did not create is loaded but not started until it is
/// reviewed; a reviewed one starts when flagged for autostart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreviewed_files_wait_for_a_review() {
    let dir = tmp();
    let home = home_with(dir.path(), &["mine"]);
    let agents = home.join("data/agents");
    // A file from elsewhere (the reference implementation wrote it), flagged
    // for autostart.
    let foreign = fixture_copy(&agents, "fresh-headless.adf");
    ok(&adf_home(&home, &agents, &["config", "set", foreign.to_str().unwrap(), "autostart", "true"]));
    let d = start(&home, "http://127.0.0.1:9", &[]);
    let started = |v: &Value, name: &str| {
        v.as_array().unwrap().iter().find(|a| a["filePath"].as_str().unwrap().ends_with(name)).unwrap()["started"]
            .clone()
    };
    let list = d.get("/agents").await;
    assert_eq!(list.as_array().unwrap().len(), 2, "every file is loaded");
    assert_eq!(started(&list, "fresh-headless.adf"), false, "unreviewed: not started");
    assert_eq!(started(&list, "mine.adf"), false, "not flagged for autostart");
    let q = format!("/agents/review?filePath={}", foreign.display());
    let r = d.get(&q).await;
    assert_eq!(r["reviewed"], false);
    assert!(r["summary"]["tools"].is_array(), "{r}");
    // Starting by hand is the owner's call.
    assert_eq!(d.call("POST", "/agents/mine/start", None).await.0, 200);
    assert_eq!(started(&d.get("/agents").await, "mine.adf"), true);
    drop(d);
    // `adf review` summarises and records; the next daemon starts it.
    let out = cli_ok(&home, &["review", foreign.to_str().unwrap()]);
    assert!(out.contains("tools") && out.contains("reviewed: the daemon will start this agent"), "{out}");
    let d = start(&home, "http://127.0.0.1:9", &[]);
    assert_eq!(started(&d.get("/agents").await, "fresh-headless.adf"), true);
    drop(d);
    // A file sealed to another owner loads (without its keys), and the
    // daemon says how to make it yours.
    fixture_copy(&agents, "fresh.adf");
    let mut d = start(&home, "http://127.0.0.1:9", &[]);
    assert_eq!(d.get("/agents").await.as_array().unwrap().len(), 3);
    let err = d.stop_stderr();
    assert!(err.contains("fresh.adf belongs to another owner") && err.contains("`adf claim "), "{err}");
    assert!(!err.contains("mine.adf belongs") && !err.contains("headless.adf belongs"), "{err}");
}

/// Every error answer is `{error, code?}` JSON: unknown routes, methods a
/// route does not serve, rejected path parameters and oversize bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_answer_is_json() {
    let dir = tmp();
    let home = home_with(dir.path(), &["a"]);
    let d = start(&home, "http://127.0.0.1:9", &["--no-mesh"]);
    let check = |what: &str, resp: &reqwest::Response| {
        let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        assert!(ct.starts_with("application/json"), "{what}: content-type {ct:?}");
    };
    let send = |m: &str, path: &str| {
        d.http
            .request(reqwest::Method::from_bytes(m.as_bytes()).unwrap(), format!("{}{path}", d.url))
            .bearer_auth(&d.token)
    };
    for (m, path, status) in [
        ("GET", "/no/such/route", 404),
        ("DELETE", "/agents", 405),
        ("PATCH", "/agents/a/status", 405),
        ("GET", "/agents/%FF%FE/status", 400),
    ] {
        let resp = send(m, path).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), status, "{m} {path}");
        check(&format!("{m} {path}"), &resp);
        if status == 405 {
            assert!(resp.headers().get("allow").is_some(), "{m} {path}: 405 names the allowed methods");
        }
        let v: Value = resp.json().await.unwrap();
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{m} {path}: {v}");
    }
    // A body over the limit (2 MiB), declared and sent.
    let resp = send("PUT", "/agents/a/mind").body(vec![b' '; 3 << 20]).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 413);
    check("PUT 3 MiB", &resp);
    // The rest of that body was never read: the connection closes, so the
    // next request goes on a fresh one (CI once saw it reuse this one).
    assert_eq!(resp.headers().get("connection").and_then(|v| v.to_str().ok()), Some("close"));
    // So does one the guard refuses before reading its body; a refusal
    // without a body keeps the connection.
    let resp = d
        .http
        .put(format!("{}/agents/a/mind", d.url))
        .bearer_auth("wrong")
        .body("x".repeat(1000))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    assert_eq!(resp.headers().get("connection").and_then(|v| v.to_str().ok()), Some("close"));
    let resp = send("GET", "/no/such/route").send().await.unwrap();
    assert!(resp.headers().get("connection").is_none(), "{:?}", resp.headers());
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"].is_string(), "{v}");
    // The document lists the answers a fuzzer will see.
    let doc = d.get("/openapi.json").await;
    let op = &doc["paths"]["/agents/{id}/mind"]["put"]["responses"];
    assert!(op["413"].is_object() && op["408"].is_object(), "{op}");
}

/// Bound beyond loopback, the daemon answers to its own addresses, its host
/// name and the names given with `--allow-host`; it needs a token of 16
/// characters or more there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_beyond_loopback_it_answers_to_its_own_names() {
    let dir = tmp();
    let home = home_with(dir.path(), &["a"]);
    let fleet = home.join("data/agents");
    let run = |token: &str, extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_adf"));
        c.args(["daemon", "--host", "0.0.0.0", "--port", "0", "--no-mesh"])
            .args(extra)
            .env("ADF_HOME", &home)
            .env("ADF_DAEMON_TOKEN", token)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    };
    // A short token is refused, in one line.
    let mut child = run("short-token", &[]).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "a short token must be refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("at least 16 characters"), "{err}");
    // `--allow-host` is documented.
    let help = Command::new(env!("CARGO_BIN_EXE_adf")).args(["daemon", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("--allow-host"));

    let token = "a-long-enough-token-1234";
    let _ = std::fs::remove_file(fleet.join(".daemon.json"));
    let child = run(token, &["--allow-host", "adf.example", "--allow-host", "box.lan:8080"]).spawn().unwrap();
    let mut d = Daemon {
        child,
        url: String::new(),
        token: token.into(),
        home: home.clone(),
        http: adf::providers::http_client(),
    };
    let v = daemon_info(&fleet, Duration::from_secs(20));
    d.url = v["url"].as_str().unwrap().to_string();
    let port = v["port"].as_u64().unwrap();
    let bearer = format!("Bearer {token}");
    let host_status = |host: String| {
        let (d, bearer) = (&d, bearer.clone());
        async move { (d.raw("/agents", &[("authorization", &bearer), ("host", &host)]).await, host) }
    };
    let name = gethostname::gethostname().to_string_lossy().to_string();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("{name}:{port}"),
        format!("adf.example:{port}"),
        format!("ADF.Example:{port}"),
        "box.lan:8080".to_string(),
    ] {
        assert_eq!(host_status(host.clone()).await, (200, host));
    }
    // The machine's own non-loopback address, when it has one.
    if let Ok(sock) = std::net::UdpSocket::bind("0.0.0.0:0")
        && sock.connect("192.0.2.1:9").is_ok()
        && let Ok(local) = sock.local_addr()
        && !local.ip().is_loopback()
        && !local.ip().is_unspecified()
    {
        let host = format!("{}:{port}", local.ip());
        assert_eq!(host_status(host.clone()).await, (200, host));
    }
    for host in [format!("evil.example:{port}"), format!("adf.example:{}", port + 1), "box.lan:8081".into()] {
        assert_eq!(host_status(host.clone()).await, (403, host));
    }
    let err = d.stop_stderr();
    assert!(!err.contains("panicked"), "{err}");
}

/// A file that fails to load is reported as not loaded, never as "loaded,
/// not started".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_fails_to_load_is_not_called_loaded() {
    let dir = tmp();
    let home = home_with(dir.path(), &["a"]);
    std::fs::write(home.join("data/agents/broken.adf"), b"this is not an agent file").unwrap();
    let mut d = start(&home, "http://127.0.0.1:9", &["--no-mesh"]);
    assert_eq!(d.get("/agents").await.as_array().unwrap().len(), 1);
    let err = d.stop_stderr();
    assert!(err.contains("not loaded"), "{err}");
    assert!(!err.lines().any(|l| l.contains("loaded, not started") && l.contains("broken.adf")), "{err}");
}

/// `adf events` names the agent beside its id on each line people read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adf_events_names_agents() {
    let dir = tmp();
    let home = home_with(dir.path(), &["scout"]);
    let d = start(&home, "http://127.0.0.1:9", &[]);
    let h = home.clone();
    tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_adf"))
            .args(["events"])
            .env("ADF_HOME", &h)
            .env_remove("ADF_DAEMON_URL")
            .env_remove("ADF_DAEMON_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let v: Value = serde_json::from_str(&cli_ok(&h, &["agents", "--json"])).unwrap();
        let id = v[0]["id"].as_str().unwrap().to_string();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        // The ring replays the agent's load: a line with the agent in it.
        let deadline = Instant::now() + Duration::from_secs(20);
        let found = loop {
            assert!(Instant::now() < deadline, "no event line named the agent");
            let Some(Ok(line)) = lines.next() else { panic!("the stream ended") };
            if line.contains(&id) {
                break line;
            }
        };
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains(&format!("scout ({id})")), "{found}");
    })
    .await
    .unwrap();
    drop(d);
}

/// Conformance 54 and 62: `POST /agents/:id/trigger` injects past the
/// trigger config, refuses the owner's voice and a missing `data`, and
/// `adf trigger` is the same route from the command line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p54_p62_trigger_injects_past_the_filters() {
    let dir = tmp();
    let home = home_with(dir.path(), &["a"]);
    let agents = home.join("data/agents");
    // on_inbox is switched off: the injection must not care.
    ok(&adf_home(&home, &agents, &["config", "set", "a.adf", "triggers.on_inbox.enabled", "false"]));
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_text(&["Seen the message."], 3, 2)),
        Scripted::sse(anthropic_text(&["Seen the timer."], 3, 2)),
    ])
    .await;
    let d = start(&home, &fake.base_url, &[]);
    let (s, v) = d
        .call(
            "POST",
            "/agents/a/trigger",
            Some(json!({"event": {"type": "inbox", "data": {"message": {"from": "did:key:zX", "content": "ping from afar"}}}})),
        )
        .await;
    assert_eq!(s, 202, "{v}");
    assert!(v["turnId"].as_str().unwrap().starts_with("trigger_"), "{v}");
    let loop_rows = d.wait_loop("a", "Seen the message.").await;
    assert!(loop_rows.to_string().contains("ping from afar"), "the event reached the model: {loop_rows}");
    // No inbox row is created by an injected inbox event.
    let inbox = d.get("/agents/a/inbox").await;
    assert_eq!(inbox["messages"].as_array().map(Vec::len).unwrap_or(0), 0, "{inbox}");
    for (body, needle) in [
        (
            json!({"event": {"type": "chat", "data": {"message": {"source": "user", "content": "I am the owner"}}}}),
            "owner",
        ),
        (json!({"event": {"type": "timer"}}), "data is required"),
        (json!({"event": {"type": "nonsense", "data": {}}}), "not one of"),
        (json!({"event": {"type": "inbox", "data": {}}, "scope": "system"}), "lambda"),
        (json!({}), "event is required"),
    ] {
        let (s, v) = d.call("POST", "/agents/a/trigger", Some(body.clone())).await;
        assert_eq!(s, 400, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(needle), "{body}: {v}");
    }
    // No such agent is a 404 whatever the body (schemathesis found a
    // schema-valid body answered 400 before the lookup).
    let (s, v) = d.call("POST", "/agents/nobody/trigger", Some(json!({"event": {"type": "inbox"}}))).await;
    assert_eq!(s, 404, "{v}");
    // The document says `data` may be left out only for startup.
    let doc = d.get("/openapi.json").await;
    let any_of = doc.to_string();
    assert!(any_of.contains(r#""anyOf":[{"required":["data"]}"#), "event schema: {any_of:.300}");
    // startup needs no data.
    let (s, _) = d
        .call(
            "POST",
            "/agents/a/trigger",
            Some(json!({"event": {"type": "startup"}, "scope": "system", "command": "echo up > started.txt"})),
        )
        .await;
    assert_eq!(s, 202);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let f = d.get("/agents/a/files").await;
        if f.to_string().contains("started.txt") {
            break;
        }
        assert!(Instant::now() < deadline, "the system command ran: {f}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let h = home.clone();
    tokio::task::spawn_blocking(move || {
        let out = cli_ok(&h, &["trigger", "a", "timer", r#"{"timer": {"id": 1, "payload": "tick"}}"#]);
        assert!(out.starts_with("accepted (trigger_"), "{out}");
        let bad = cli(&h, &["trigger", "a", "timer", "{not json"]);
        assert!(!bad.status.success());
        assert!(String::from_utf8_lossy(&bad.stderr).contains("not JSON"));
    })
    .await
    .unwrap();
    d.wait_loop("a", "Seen the timer.").await;
}

/// `sys_create_adf` with `autostart: true` in a daemon: the child file is
/// made, the daemon loads and starts it, and it answers chat like any
/// agent of the fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sys_create_adf_autostart_runs_the_child() {
    let dir = tmp();
    let home = home_with(dir.path(), &["a"]);
    let agents = home.join("data/agents");
    {
        let mut s = adf::store::Store::open(agents.join("a.adf")).unwrap();
        s.config_set(adf::store::Caller::Owner, "tools", tools_enabled(&["sys_create_adf"])).unwrap();
    }
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_tool(
            "toolu_1",
            "sys_create_adf",
            r#"{"name":"kid","model":{"provider":"anthropic","model_id":"m"},"autostart":true}"#,
        )),
        Scripted::sse(anthropic_text(&["Made kid."], 3, 2)),
        Scripted::sse(anthropic_text(&["Kid here."], 3, 2)),
    ])
    .await;
    let d = start(&home, &fake.base_url, &[]);
    let (s, v) = d.call("POST", "/agents/a/chat", Some(json!({"text": "make a child"}))).await;
    assert_eq!(s, 202, "{v}");
    let rows = d.wait_loop("a", "Made kid.").await;
    assert!(rows.to_string().contains("Autostarted: true"), "{rows}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let kid = loop {
        let list = d.get("/agents").await;
        if let Some(k) = list.as_array().unwrap().iter().find(|a| a["name"] == "kid" && a["started"] == true) {
            break k.clone();
        }
        assert!(Instant::now() < deadline, "the child was not started: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(kid["filePath"].as_str().unwrap().ends_with("kid.adf"), "{kid}");
    let (s, v) = d.call("POST", "/agents/kid/chat", Some(json!({"text": "hello kid"}))).await;
    assert_eq!(s, 202, "{v}");
    d.wait_loop("kid", "Kid here.").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_loops_through_the_daemon_and_the_cli_that_attaches_to_it() {
    // Issue 18: the loops API, a side loop's own turn (its rows, not
    // main's; its events tagged with the loop) and `adf loops` on a file
    // the daemon holds.
    let dir = tmp();
    let home = home_with(dir.path(), &["a"]);
    let fake = FakeProvider::start(vec![Scripted::sse(anthropic_text(&["side", " reply"], 1, 1))]).await;
    let d = start(&home, &fake.base_url, &[]);
    let (s, v) = d.call("POST", "/agents/a/loops", Some(json!({"name": "research", "goal": "Dig."}))).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["loop"]["mode"], "reactive");
    let (s, v) = d.call("POST", "/agents/a/loops", Some(json!({"name": "research"}))).await;
    assert_eq!((s, v["error"].as_str().unwrap().contains("already exists")), (409, true), "{v}");
    let (s, _) = d.call("POST", "/agents/a/loops/nope/chat", Some(json!({"text": "hi"}))).await;
    assert_eq!(s, 404);

    let (s, v) = d.call("POST", "/agents/a/loops/research/chat", Some(json!({"text": "look into it"}))).await;
    assert_eq!(s, 202, "{v}");
    let turn = v["turnId"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rows = d.get("/agents/a/loops/research/chat").await;
        if rows["rows"].to_string().contains("side reply") {
            assert!(rows["rows"].to_string().contains("look into it"));
            break;
        }
        assert!(Instant::now() < deadline, "no reply in the side loop: {rows}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let main = d.get("/agents/a/loop?limit=500").await;
    assert!(!main.to_string().contains("look into it"), "main's loop is untouched: {main}");
    let resp = d.http.get(format!("{}/agents/a/events?since=0", d.url)).bearer_auth(&d.token).send().await.unwrap();
    let frames = read_event_frames(resp, Duration::from_secs(2)).await;
    let done = frames
        .iter()
        .find(|e| e["event"]["event_type"] == "turn.completed" && e["event"]["source"] == format!("agent:{turn}"))
        .expect("the side turn's completion");
    assert_eq!(done["event"]["payload"]["loop"], "research");
    // One loop's stream: only what that loop did.
    let url = format!("{}/agents/a/loops/research/events?since=0", d.url);
    let resp = d.http.get(url).bearer_auth(&d.token).send().await.unwrap();
    let mine = read_event_frames(resp, Duration::from_secs(1)).await;
    assert!(mine.iter().any(|e| e["event"]["event_type"] == "turn.completed"), "{mine:?}");
    assert!(mine.iter().all(|e| e["event"]["payload"]["loop"] == "research"), "{mine:?}");
    let url = format!("{}/agents/a/loops/main/events?since=0", d.url);
    let resp = d.http.get(url).bearer_auth(&d.token).send().await.unwrap();
    let main = read_event_frames(resp, Duration::from_secs(1)).await;
    assert!(main.iter().all(|e| e["event"]["payload"].get("loop").is_none()), "{main:?}");
    assert_eq!(d.call("GET", "/agents/a/loops/nope/events", None).await.0, 404);

    // The CLI on the held file goes through the daemon.
    let agents = home.join("data/agents");
    let out = adf_home(&home, &agents, &["loops", "new", "a.adf", "crit", "--template", "critic"]);
    assert!(ok(&out).contains("created loop crit"));
    let ls = json(&adf_home(&home, &agents, &["loops", "ls", "a.adf", "--json"]));
    assert_eq!(ls["loops"].as_array().unwrap().len(), 3, "{ls}");
    let out = ok(&adf_home(&home, &agents, &["loops", "pause", "a.adf", "crit"]));
    assert!(out.contains("paused loop crit"));
    assert_eq!(d.get("/agents/a/loops").await["loops"][0]["status"], "paused");
    let (s, _) = d.call("POST", "/agents/a/loops/crit/chat", Some(json!({"text": "hi"}))).await;
    assert_eq!(s, 400, "a paused loop takes no turns");
    let out = ok(&adf_home(&home, &agents, &["loops", "rm", "a.adf", "research"]));
    assert!(out.contains("archived"), "{out}");
    let (s, _) = d.call("DELETE", "/agents/a/loops/research", None).await;
    assert_eq!(s, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_and_budgets_through_the_daemon() {
    let dir = tmp();
    let home = home_with(dir.path(), &["a"]);
    let agents = home.join("data/agents");
    ok(&adf_home(&home, &agents, &["config", "set", "a.adf", "limits.budget", r#"{"tokens_day": 1000}"#]));
    let d = start(&home, "http://127.0.0.1:9", &[]);
    let (s, v) = d.call("GET", "/agents/a/logs?level=loud", None).await;
    assert_eq!(s, 400, "{v}");
    let v = d.get("/agents/a/logs?limit=5").await;
    assert!(v["logs"].is_array(), "{v}");
    let b = d.get("/agents/a/budgets").await;
    assert_eq!(b["budgets"][0]["scope"], "agent");
    assert_eq!(b["budgets"][0]["budget"]["tokens_day"], 1000);
    let h = home.clone();
    let out = tokio::task::spawn_blocking(move || cli(&h, &["logs", "a", "--json"])).await.unwrap();
    let v = json(&out);
    assert!(v["logs"].is_array(), "{v}");
    // Why, with the live state the daemon knows.
    let w = d.get("/agents/a/why").await;
    assert!(w["state"].is_string() && w["waiting_on"].is_array(), "{w}");
    let h = home.clone();
    let out = tokio::task::spawn_blocking(move || cli(&h, &["why", "a"])).await.unwrap();
    assert!(ok(&out).starts_with("state: "), "{}", String::from_utf8_lossy(&out.stdout));
    // A file the daemon holds goes through it too.
    let h = home.clone();
    let f = agents.join("a.adf");
    let out = tokio::task::spawn_blocking(move || cli(&h, &["why", f.to_str().unwrap(), "--json"])).await.unwrap();
    assert!(json(&out)["state"].is_string(), "the live state, through the holder");
    // The compute panel's view (issue 22): the targets resolve would take
    // (no container engine for this install, host commands off: none).
    let h = home.clone();
    tokio::task::spawn_blocking(move || cli_ok(&h, &["compute", "engine", "none"])).await.unwrap();
    let c = d.get("/agents/a/compute").await;
    assert_eq!(c["compute"]["targets"], json!([]), "{c}");
    assert_eq!(c["compute"]["browser"], "off", "{c}");
    assert!(c["compute"]["commands"].as_array().is_some_and(Vec::is_empty), "{c}");
    let (s, _) = d.call("GET", "/agents/nobody/compute", None).await;
    assert_eq!(s, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_with_roles_may_do_what_their_role_says_and_get_403_on_the_rest() {
    let dir = tmp();
    let home = home_with(dir.path(), &["a"]);
    let agents = home.join("data/agents");
    let mint = |role: &str| -> (String, String) {
        let v = json(&adf_home(&home, &agents, &["token", "new", "--role", role, "--label", "test", "--json"]));
        (v["id"].as_str().unwrap().to_string(), v["token"].as_str().unwrap().to_string())
    };
    let (obs_id, observer) = mint("observer");
    let (_, approver) = mint("approver");
    // The text form prints the token as its last word.
    let text = ok(&adf_home(&home, &agents, &["token", "new", "--role", "observer"]));
    assert!(text.split_whitespace().last().unwrap().starts_with("adf_obs_"), "{text}");
    // An unknown role: a usage error, nothing minted.
    let before = std::fs::read(home.join("config/tokens.json")).unwrap();
    let out = adf_home(&home, &agents, &["token", "new", "--role", "admin"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("use owner, approver or observer"));
    assert_eq!(std::fs::read(home.join("config/tokens.json")).unwrap(), before);
    let listed = ok(&adf_home(&home, &agents, &["token", "ls"]));
    assert!(listed.contains(&obs_id) && listed.contains("approver") && !listed.contains(&observer), "{listed}");

    let d = start(&home, "http://127.0.0.1:9", &[]);
    let call = |token: String, method: &'static str, path: String, body: Option<Value>| {
        let (url, http) = (d.url.clone(), d.http.clone());
        async move {
            let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
            let mut r = http.request(m, format!("{url}{path}")).bearer_auth(token);
            if let Some(b) = body {
                r = r.json(&b);
            }
            let resp = r.send().await.unwrap();
            let s = resp.status().as_u16();
            (s, serde_json::from_str::<Value>(&resp.text().await.unwrap()).unwrap_or_default())
        }
    };
    let (s, v) = call(observer.clone(), "GET", "/whoami".into(), None).await;
    assert_eq!((s, v["role"].as_str()), (200, Some("observer")));
    assert_eq!(d.get("/whoami").await["role"], "owner");
    let (s, v) = call(observer.clone(), "GET", "/agents".into(), None).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = call(observer.clone(), "POST", "/agents/a/chat".into(), Some(json!({"text": "hi"}))).await;
    assert_eq!((s, v["code"].as_str()), (403, Some("FORBIDDEN_ROLE")), "{v}");
    assert!(v["error"].as_str().unwrap().contains("observer"), "{v}");
    let (s, _) =
        call(observer.clone(), "POST", "/agents/a/tasks/t1/resolve".into(), Some(json!({"action": "approve"}))).await;
    assert_eq!(s, 403, "observers do not answer approvals");
    // An approver answers approvals (no such task here: 404, not 403), but
    // does not lift gates, chat or change config.
    let (s, v) =
        call(approver.clone(), "POST", "/agents/a/tasks/t1/resolve".into(), Some(json!({"action": "approve"}))).await;
    assert_eq!(s, 404, "{v}");
    let (s, v) = call(
        approver.clone(),
        "POST",
        "/agents/a/tasks/t1/resolve".into(),
        Some(json!({"action": "approve", "always": true})),
    )
    .await;
    assert_eq!(s, 403, "{v}");
    let (s, _) =
        call(approver.clone(), "POST", "/agents/a/asks/r1/respond".into(), Some(json!({"answer": "yes"}))).await;
    assert_ne!(s, 403);
    let (s, _) = call(approver.clone(), "PUT", "/agents/a/config".into(), Some(json!({}))).await;
    assert_eq!(s, 403);
    let (s, _) = call(approver.clone(), "POST", "/agents/a/stop".into(), None).await;
    assert_eq!(s, 403);
    // Grants: the owner's to make; bad patterns are 400; listed and revoked.
    let (s, _) =
        call(approver.clone(), "POST", "/agents/a/grants".into(), Some(json!({"tool": "fs_write", "for": "30m"})))
            .await;
    assert_eq!(s, 403, "an approver answers one request, it does not grant ahead");
    let (s, v) = d.call("POST", "/agents/a/grants", Some(json!({"tool": "fs_write", "path": "../x"}))).await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = d.call("POST", "/agents/a/grants", Some(json!({"tool": "fs_write"}))).await;
    assert_eq!(s, 400, "{v}");
    let (s, v) =
        d.call("POST", "/agents/a/grants", Some(json!({"tool": "fs_write", "path": "notes", "for": "30m"}))).await;
    assert_eq!(s, 200, "{v}");
    let gid = v["grant"]["id"].as_str().unwrap().to_string();
    let (s, v) = call(observer.clone(), "GET", "/agents/a/grants".into(), None).await;
    assert_eq!((s, v["grants"][0]["path"].as_str()), (200, Some("notes")), "{v}");
    let (s, _) = d.call("DELETE", &format!("/agents/a/grants/{gid}"), None).await;
    assert_eq!(s, 200);
    let (s, _) = d.call("DELETE", &format!("/agents/a/grants/{gid}"), None).await;
    assert_eq!(s, 404);
    // The CLI with a lesser token says why it was refused.
    let (h, tok) = (home.clone(), observer.clone());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_adf"))
            .args(["stop", "a"])
            .env("ADF_HOME", &h)
            .env("ADF_DAEMON_TOKEN", tok)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("role is observer"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Revoked, refused from the next request.
    ok(&adf_home(&home, &agents, &["token", "rm", &obs_id]));
    let (s, _) = call(observer.clone(), "GET", "/agents".into(), None).await;
    assert_eq!(s, 401);
    fails(&adf_home(&home, &agents, &["token", "rm", &obs_id]), &["no token"]);
    let (s, _) = call("adf_obs_guess".into(), "GET", "/agents".into(), None).await;
    assert_eq!(s, 401);
}
