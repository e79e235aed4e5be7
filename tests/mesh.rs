//! Messaging between real agents (conformance 43–47): two `adf daemon`
//! processes on loopback, agents that send with `msg_send` from their
//! model's turn — to a sibling of the same fleet and to an agent of the
//! other daemon over HTTP — signed and encrypted (level 2), a reply routed
//! back by `parent_id`, one `on_inbox` wake for a burst; and the refusals
//! of the mesh server with their status codes (tampered, replayed, blocked,
//! beyond the visibility tier, agent off).

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use adf::store::identity::did_key;
use common::fake_provider::*;
use common::*;
use ed25519_dalek::SigningKey;
use serde_json::{Value, json};

struct Daemon {
    _child: common::KillOnDrop,
    url: String,
    mesh: String,
    token: String,
    http: reqwest::Client,
}

fn start(home: &Path, base: &str) -> Daemon {
    start_with(home, base, &[])
}

fn start_with(home: &Path, base: &str, env: &[(&str, &str)]) -> Daemon {
    let info = home.join("data/agents/.daemon.json");
    let _ = std::fs::remove_file(&info);
    let child = Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(["daemon", "--port", "0", "--mesh-port", "0"])
        .env("ADF_HOME", home)
        .env("ANTHROPIC_API_KEY", "sk-test")
        .env("ANTHROPIC_BASE_URL", base)
        .env_remove("ADF_DAEMON_TOKEN")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !info.exists() {
        assert!(Instant::now() < deadline, "the daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(50));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&info).unwrap()).unwrap();
    Daemon {
        _child: common::KillOnDrop(child),
        url: v["url"].as_str().unwrap().to_string(),
        mesh: v["mesh"].as_str().expect("the mesh server listens").to_string(),
        token: std::fs::read_to_string(home.join("config/daemon-token")).unwrap(),
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
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> Value {
        let (s, v) = self.call("GET", path, None).await;
        assert_eq!(s, 200, "GET {path}: {v}");
        v
    }

    async fn wait<F: Fn(&Value) -> bool>(&self, path: &str, what: &str, ok: F) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.get(path).await;
            if ok(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{what}: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The body of a GET as text, whatever its shape (for absence checks).
    async fn text(&self, path: &str) -> String {
        let r = self.http.get(format!("{}{path}", self.url)).bearer_auth(&self.token).send().await.unwrap();
        assert!(r.status().is_success(), "GET {path}: {}", r.status());
        r.text().await.unwrap()
    }

    /// Everything the event ring replays right now, as text.
    async fn events_text(&self) -> String {
        let mut r =
            self.http.get(format!("{}/events?since=0", self.url)).bearer_auth(&self.token).send().await.unwrap();
        let mut text = String::new();
        // The replay arrives at once; then the stream idles on live events.
        while let Ok(Ok(Some(chunk))) = tokio::time::timeout(Duration::from_millis(500), r.chunk()).await {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        assert!(text.contains("agent.loaded"), "the ring replayed: {text}");
        text
    }

    async fn inbox(&self, agent: &str) -> Vec<Value> {
        self.get(&format!("/agents/{agent}/inbox")).await["messages"].as_array().unwrap().clone()
    }

    async fn post_mesh(&self, handle: &str, msg: &Value) -> (u16, Value) {
        let resp = self.http.post(format!("{}/agents/{handle}/inbox", self.mesh)).json(msg).send().await.unwrap();
        let s = resp.status().as_u16();
        (s, resp.json().await.unwrap_or(Value::Null))
    }
}

fn fleet(dir: &Path, name: &str, agents: &[&str]) -> PathBuf {
    let home = dir.join(name);
    let fleet = home.join("data/agents");
    std::fs::create_dir_all(&fleet).unwrap();
    for a in agents {
        let f = format!("{a}.adf");
        ok(&adf_home(&home, &fleet, &["new", &f, "--provider", "anthropic", "--model", "m"]));
        ok(&adf_home(&home, &fleet, &["config", "set", &f, "security.level", "2"]));
    }
    home
}

fn did_of(home: &Path, agent: &str) -> String {
    let fleet = home.join("data/agents");
    let v = json(&adf_home(home, &fleet, &["inspect", &format!("{agent}.adf"), "--json"]));
    v["did"].as_str().unwrap().to_string()
}

fn meta(row: &Value) -> Value {
    serde_json::from_str(row["meta"].as_str().unwrap_or("{}")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_exchange_signed_and_encrypted_messages() {
    let dir = tmp();
    let h1 = fleet(dir.path(), "h1", &["a", "c"]);
    let h2 = fleet(dir.path(), "h2", &["b"]);
    let f1 = h1.join("data/agents");
    let f2 = h2.join("data/agents");
    // c does not wake on its inbox (daemon 1's fake model serves a only);
    // b wakes once per 600 ms window, however many messages arrive.
    ok(&adf_home(&h1, &f1, &["config", "set", "c.adf", "triggers.on_inbox.enabled", "false"]));
    ok(&adf_home(
        &h2,
        &f2,
        &["config", "set", "b.adf", "triggers.on_inbox.targets", r#"[{"scope":"agent","interval_ms":1500}]"#],
    ));
    let (a_did, b_did, c_did) = (did_of(&h1, "a"), did_of(&h2, "b"), did_of(&h1, "c"));
    // a calls its model with its own sealed key, not the environment's.
    let set = Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(["credentials", "set", "a.adf", "provider:anthropic:apiKey"])
        .current_dir(&f1)
        .env("ADF_HOME", &h1)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(b"sk-agent-a\n")?;
            c.wait()
        })
        .unwrap();
    assert!(set.success());
    let fake2 = FakeProvider::start(vec![Scripted::sse(anthropic_text(&["noted"], 5, 1))]).await;
    let d2 = start(&h2, &fake2.base_url);
    let to_b = json!({"recipient": b_did, "address": format!("{}/agents/b/inbox", d2.mesh), "content": "hello b", "subject": "hi"});
    let fake1 = FakeProvider::start(vec![
        Scripted::sse(anthropic_tool("t1", "msg_send", &json!({"recipient": "c", "content": "hello c"}).to_string())),
        Scripted::sse(anthropic_tool("t2", "msg_send", &to_b.to_string())),
        Scripted::sse(anthropic_tool("t3", "agent_discover", r#"{"scope":"all"}"#)),
        Scripted::sse(anthropic_text(&["done"], 5, 1)),
    ])
    .await;
    // Daemon 1 knows daemon 2 as a manually listed peer.
    let d1 = start_with(&h1, &fake1.base_url, &[("ADF_MESH_PEERS", &d2.mesh)]);
    let (s, v) = d1.call("POST", "/agents/a/chat", Some(json!({"text": "send them"}))).await;
    assert!(s < 300, "{v}");
    let a_loop = d1.wait("/agents/a/loop?limit=500", "a's turn ends", |v| v.to_string().contains("done")).await;
    let keys: Vec<String> =
        fake1.requests().iter().map(|(h, _)| h["x-api-key"].to_str().unwrap().to_string()).collect();
    assert!(!keys.is_empty() && keys.iter().all(|k| k == "sk-agent-a"), "{keys:?}");
    assert!(!a_loop.to_string().contains("sk-agent-a"), "the key never reaches the loop");
    // Nor the model (request bodies), the logs, the events or any answer of
    // the API; the file holds it sealed only.
    assert!(fake1.requests().iter().all(|(_, body)| !body.to_string().contains("sk-agent-a")));
    for path in [
        "/agents",
        "/agents/a",
        "/agents/a/config",
        "/agents/a/meta",
        "/agents/a/tables",
        "/agents/a/chat",
        "/agents/a/outbox",
        "/runtime",
        "/runtime/providers",
        "/diagnostics",
    ] {
        assert!(!d1.text(path).await.contains("sk-agent-a"), "{path} shows the key");
    }
    assert!(!d1.events_text().await.contains("sk-agent-a"), "an event shows the key");
    // The file and its WAL (loop, logs, audit, identity rows) hold it
    // sealed only.
    for f in ["a.adf", "a.adf-wal"] {
        let bytes = std::fs::read(f1.join(f)).unwrap_or_default();
        assert!(!bytes.windows(10).any(|w| w == b"sk-agent-a"), "{f} holds the key in the clear");
    }
    // agent_discover(all): c on this runtime, b from the listed peer with a
    // verified card.
    let found = a_loop["entries"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["content"].as_array().cloned().unwrap_or_default())
        .find(|b| b["tool_use_id"] == "t3")
        .expect("the discover result");
    let cards: Value = serde_json::from_str(found["content"].as_str().unwrap()).unwrap();
    let by = |h: &str| {
        cards.as_array().unwrap().iter().find(|c| c["handle"] == h).cloned().unwrap_or_else(|| panic!("{h} in {cards}"))
    };
    assert_eq!(by("c")["source"], "local-runtime");
    assert_eq!(by("b")["source"], "manual");
    assert_eq!(by("b")["card_verified"], true);
    assert_eq!(by("b")["did"], b_did.as_str());
    assert_eq!(by("b")["owner_attested"], false, "owner attestations are published only when the card says so");

    // Same fleet: delivered locally, signed and encrypted, stored plain.
    let c_in = d1.inbox("c").await;
    assert_eq!(c_in.len(), 1, "{c_in:?} {}", d1.get("/agents/a/loop?limit=500").await);
    assert_eq!(c_in[0]["content"], "hello c");
    assert_eq!(c_in[0]["from"], a_did.as_str());
    assert_eq!(c_in[0]["to"], c_did.as_str());
    let m = meta(&c_in[0]);
    assert_eq!(
        (m["message_verified"].clone(), m["payload_verified"].clone(), m["payload_encrypted"].clone()),
        (json!(true), json!(true), json!(true))
    );
    // Over HTTP to the other daemon: the same guarantees, a 202.
    let b_in = d2.wait("/agents/b/inbox", "b's inbox", |v| !v["messages"].as_array().unwrap().is_empty()).await;
    let b_row = b_in["messages"][0].clone();
    assert_eq!(b_row["content"], "hello b");
    assert_eq!(b_row["subject"], "hi");
    assert_eq!(b_row["from"], a_did.as_str());
    assert_eq!(b_row["sender_alias"], "a");
    let m = meta(&b_row);
    assert_eq!((m["message_verified"].clone(), m["payload_encrypted"].clone()), (json!(true), json!(true)));
    assert!(b_row["reply_to"].as_str().unwrap().starts_with(&d1.mesh), "{b_row}");
    let original: Value = serde_json::from_str(b_row["original_message"].as_str().unwrap()).unwrap();
    assert_eq!(original["payload"]["content"], "[flattened]");
    assert_eq!(original["payload"]["content_type"], "application/x-adf-encrypted", "it travelled encrypted");
    let out = d1.get("/agents/a/outbox").await["messages"].as_array().unwrap().clone();
    assert_eq!(out.len(), 2);
    let to_b_row = out.iter().find(|r| r["to"] == b_did.as_str()).unwrap();
    assert_eq!((to_b_row["status"].clone(), to_b_row["status_code"].clone()), (json!("delivered"), json!(202)));
    assert!(out.iter().all(|r| r["status"] == "delivered"));
    // b woke once for it.
    d2.wait("/agents/b/loop?limit=500", "b's inbox wake", |v| {
        let t = v.to_string();
        t.contains("[Inbox notification]") && t.contains("noted")
    })
    .await;

    // b replies by parent_id: routed to a's mesh URL, encrypted to a.
    let parent = b_row["id"].as_str().unwrap();
    fake2.push(Scripted::sse(anthropic_tool(
        "r1",
        "msg_send",
        &json!({"parent_id": parent, "content": "hi a"}).to_string(),
    )));
    fake2.push(Scripted::sse(anthropic_text(&["replied"], 5, 1)));
    let (s, _) = d2.call("POST", "/agents/b/chat", Some(json!({"text": "reply to a"}))).await;
    assert!(s < 300);
    let a_in = d1.wait("/agents/a/inbox", "a's inbox", |v| !v["messages"].as_array().unwrap().is_empty()).await;
    let reply = &a_in["messages"][0];
    assert_eq!(reply["content"], "hi a");
    assert_eq!(reply["from"], b_did.as_str());
    assert_eq!(reply["parent_id"], parent);
    assert_eq!(reply["thread_id"], parent, "the thread is the parent when it had none");
    assert_eq!(meta(reply)["payload_encrypted"], true);

    // The reply's turn ends (its second model call, after the send) before
    // the burst's calls are counted: a's inbox has the reply as soon as the
    // tool ran.
    d2.wait("/agents/b/loop?limit=500", "the reply turn's end", |v| v.to_string().contains("replied")).await;

    // A burst of three messages: one wake for all of them.
    let before = fake2.requests().len();
    fake2.push(Scripted::sse(anthropic_text(&["batch"], 5, 1)));
    let tester = SigningKey::from_bytes(&[42u8; 32]);
    for i in 0..3 {
        let (s, v) = d2.post_mesh("b", &message_from(&tester, &b_did, &format!("burst {i}"), 2)).await;
        assert_eq!(s, 202, "{v}");
        assert!(v["message_id"].is_string());
    }
    d2.wait("/agents/b/loop?limit=500", "the burst wake", |v| v.to_string().contains("batch")).await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    let calls: Vec<String> = fake2.requests()[before..]
        .iter()
        .map(|(_, b)| b["messages"].as_array().and_then(|m| m.last()).map(|m| m.to_string()).unwrap_or_default())
        .map(|t| t.chars().rev().take(300).collect::<String>().chars().rev().collect())
        .collect();
    assert_eq!(calls.len(), 1, "one model call for the burst: {calls:#?}");
    let last = fake2.requests().last().unwrap().1.to_string();
    assert!(last.contains(r#"\"tester\": 3"#), "one notification counting all three: {last}");
    assert_eq!(last.matches("[Inbox notification]").count(), 2, "the first wake and this one");

    // Refusals, with the spec's status codes.
    let m = message_from(&tester, &b_did, "once", 1);
    assert_eq!(d2.post_mesh("b", &m).await.0, 202);
    let (s, v) = d2.post_mesh("b", &m).await;
    assert_eq!(s, 409, "a replay: {v}");
    let mut t = message_from(&tester, &b_did, "tamper me", 1);
    t["payload"]["content"] = "tampered".into();
    let (s, v) = d2.post_mesh("b", &t).await;
    assert_eq!(s, 403, "{v}");
    assert!(v["error"].as_str().unwrap().contains("signature"));
    let to_c = message_from(&tester, &c_did, "not for b", 2);
    assert_eq!(d2.post_mesh("b", &to_c).await.0, 403, "encrypted to another agent");
    let (s, v) = d2.post_mesh("b", &message_from(&tester, &c_did, "signed for c", 1)).await;
    assert_eq!((s, v["error"].as_str()), (403, Some("message is addressed to another agent")));
    assert_eq!(d2.post_mesh("nobody", &m).await.0, 404);
    let resp = d2.http.post(format!("{}/agents/b/inbox", d2.mesh)).body("not json").send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let bad = json!({"from": "x", "payload": {"content": ""}});
    assert_eq!(d2.post_mesh("b", &bad).await.0, 400);
    // Nothing refused reached the inbox.
    let contents: Vec<String> =
        d2.inbox("b").await.iter().map(|r| r["content"].as_str().unwrap().to_string()).collect();
    assert!(!contents.iter().any(|c| c.contains("tamper") || c == "not for b"), "{contents:?}");
    assert_eq!(contents.iter().filter(|c| *c == "once").count(), 1);
    // The card is signed; /ping and /health answer.
    let card: Value = d2.http.get(format!("{}/agents/b/card", d2.mesh)).send().await.unwrap().json().await.unwrap();
    assert_eq!(card["did"], b_did.as_str());
    assert!(adf::runtime::mesh::card::verify(&card));
    let ping: Value = d2.http.get(format!("{}/ping", d2.mesh)).send().await.unwrap().json().await.unwrap();
    assert_eq!(ping["proto"], "alf/0.2");
    let health: Value = d2.http.get(format!("{}/health", d2.mesh)).send().await.unwrap().json().await.unwrap();
    assert_eq!(health["status"], "ok", "{health}");
    assert!(health["agents"].as_u64().is_some_and(|n| n >= 1) && health["uptime"].is_number(), "{health}");
    let h: Value = d2.http.get(format!("{}/agents/b/health", d2.mesh)).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        (h["status"].as_str(), h["did"].as_str(), h["handle"].as_str()),
        (Some("ok"), Some(b_did.as_str()), Some("b")),
        "{h}"
    );
    assert!(h["state"].is_string(), "{h}");
    let gone = d2.http.get(format!("{}/agents/nobody/health", d2.mesh)).send().await.unwrap();
    assert_eq!(gone.status().as_u16(), 404);
}

/// The mesh router in-process behind a chosen peer address, over a real
/// loopback socket.
async fn serve_as(mesh: Arc<adf::runtime::mesh::Mesh>, peer: &str) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let peer: SocketAddr = peer.parse().unwrap();
    let app = adf::runtime::mesh::server::router(mesh).layer(axum::extract::connect_info::MockConnectInfo(peer));
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_senders_visibility_tiers_and_off_agents_are_refused() {
    use adf::providers::scripted::{Reply, Scripted as Model};
    use adf::store::{Caller, NewAgent, Store};
    let dir = tmp();
    let blocked = SigningKey::from_bytes(&[7u8; 32]);
    let friend = SigningKey::from_bytes(&[8u8; 32]);
    for (name, cfg) in [
        ("b", json!({"visibility": "localhost", "block_list": [did_key(&blocked.verifying_key())]})),
        ("l", json!({"visibility": "lan"})),
        ("o", json!({"visibility": "localhost"})),
    ] {
        let (mut s, _) = Store::create(
            dir.path().join(format!("{name}.adf")),
            &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() },
        )
        .unwrap();
        s.config_set(Caller::Owner, "messaging", cfg).unwrap();
        s.config_set(Caller::Owner, "triggers.on_inbox.enabled", json!(false)).unwrap();
        s.close().unwrap();
    }
    let factory: adf::runtime::fleet::ProviderFactory =
        Arc::new(|_| Ok(Arc::new(Model::new(vec![Reply::Text("ok".into())])) as Arc<dyn adf::providers::Provider>));
    let mut fleet = adf::runtime::fleet::Fleet::new(adf::runtime::bus::Bus::new(), factory);
    let mut dids = std::collections::HashMap::new();
    for name in ["b", "l", "o"] {
        fleet.load(&dir.path().join(format!("{name}.adf"))).unwrap();
        let s = Store::open_read_only(dir.path().join(format!("{name}.adf"))).unwrap();
        dids.insert(name, s.meta_get("adf_did").unwrap().unwrap().value);
    }
    fleet.command(adf::protocol::Command::SetState { agent: "o".into(), state: "off".into() }).unwrap();
    let lan = serve_as(fleet.mesh.clone(), "192.168.1.20:5000").await;
    let local = serve_as(fleet.mesh.clone(), "127.0.0.1:5000").await;
    let http = adf::providers::http_client();
    let post = |base: String, handle: &'static str, m: Value| {
        let http = http.clone();
        async move {
            let r = http.post(format!("{base}/agents/{handle}/inbox")).json(&m).send().await.unwrap();
            let s = r.status().as_u16();
            (s, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // A LAN origin exceeds a localhost agent's tier; a lan agent takes it.
    let (s, v) = post(lan.clone(), "b", message_from(&friend, &dids["b"], "from the lan", 2)).await;
    assert_eq!(s, 403);
    assert_eq!(v, json!({"error": "visibility tier mismatch", "visibility": "localhost", "scope": "lan"}));
    let (s, v) = post(lan.clone(), "l", message_from(&friend, &dids["l"], "lan ok", 2)).await;
    assert_eq!(s, 202, "{v}");
    // A blocked DID is refused; another is taken.
    let (s, v) = post(local.clone(), "b", message_from(&blocked, &dids["b"], "let me in", 1)).await;
    assert_eq!(s, 403, "{v}");
    assert!(v["error"].as_str().unwrap().contains("blocked"));
    assert_eq!(post(local.clone(), "b", message_from(&friend, &dids["b"], "hello", 1)).await.0, 202);
    // An agent that is off answers 503 (once its state is known).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (s, _) = post(local.clone(), "o", message_from(&friend, &dids["o"], "anyone?", 1)).await;
        if s == 503 {
            break;
        }
        assert!(Instant::now() < deadline, "o never answered 503 (last {s})");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Directory listings follow the tiers too.
    let cards: Value = http.get(format!("{lan}/agents")).send().await.unwrap().json().await.unwrap();
    let handles: Vec<&str> = cards.as_array().unwrap().iter().map(|c| c["handle"].as_str().unwrap()).collect();
    assert_eq!(handles, ["l"]);
    let (s, _) = {
        let r = http.get(format!("{lan}/agents/b/card")).send().await.unwrap();
        (r.status().as_u16(), ())
    };
    assert_eq!(s, 403);
    assert_eq!(fleet.shutdown().await, Vec::<String>::new());
}

/// Two runtimes with LAN agents find each other by mDNS (on this machine's
/// multicast interface) and forget each other when one says goodbye.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lan_runtimes_find_each_other_by_mdns() {
    use adf::runtime::mesh::{Mesh, mdns};
    let m1 = Mesh::with_runtime(adf::runtime::bus::Bus::new(), Default::default(), ("mdnsone".into(), None));
    let m2 = Mesh::with_runtime(adf::runtime::bus::Bus::new(), Default::default(), ("mdnstwo".into(), None));
    assert_ne!(m1.runtime_id, m2.runtime_id);
    let d1 = mdns::start(m1.clone(), 17_301).expect("mDNS on this machine");
    let d2 = mdns::start(m2.clone(), 17_302).expect("mDNS on this machine");
    let found = |m: &Mesh, port: u16| m.peers().iter().any(|(u, s)| u.ends_with(&format!(":{port}")) && *s == "mdns");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !(found(&m1, 17_302) && found(&m2, 17_301)) {
        assert!(Instant::now() < deadline, "not found: {:?} / {:?}", m1.peers(), m2.peers());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!found(&m1, 17_301), "a runtime never lists itself");
    drop(d2);
    let deadline = Instant::now() + Duration::from_secs(15);
    while found(&m1, 17_302) {
        assert!(Instant::now() < deadline, "the goodbye was not heard: {:?}", m1.peers());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(d1);
}
