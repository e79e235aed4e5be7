//! WebSockets (issue 21): an agent's `WS` route on the mesh server answered
//! by its lambda (what it returns is sent back; the open and close events
//! too), a path without a route closed with 4004, a flood closed at the
//! frame rate limit while new connections are still taken; and two
//! runtimes whose agents authenticate each other by DID over a socket
//! that `ws_connect` opened, `msg_send` then preferring that socket to
//! HTTP, a forged handshake refused with 4001.

mod common;

use std::sync::Arc;
use std::time::Duration;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::fleet::Fleet;
use adf::store::{Caller, NewAgent, Store};
use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn agent(path: &std::path::Path, name: &str, set: &[(&str, Value)]) -> String {
    let (mut s, _) = Store::create(
        path,
        &NewAgent { name: Some(name), provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    for (k, v) in set {
        s.config_set(Caller::Owner, k, v.clone()).unwrap();
    }
    let did = s.meta_get("adf_did").unwrap().unwrap().value;
    s.close().unwrap();
    did
}

fn enable_tools(path: &std::path::Path, names: &[&str]) {
    let mut s = Store::open(path).unwrap();
    let mut cfg = s.config_value().unwrap();
    for t in cfg["tools"].as_array_mut().unwrap() {
        if names.contains(&t["name"].as_str().unwrap_or_default()) {
            t["enabled"] = json!(true);
            t["visible"] = json!(true);
        }
    }
    s.config_replace(cfg).unwrap();
    s.close().unwrap();
}

fn text_of(m: Message) -> String {
    match m {
        Message::Text(t) => t.to_string(),
        other => panic!("expected text, got {other:?}"),
    }
}

async fn next(
    ws: &mut (impl StreamExt<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin),
) -> Message {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("a frame within 10 s") {
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(m)) => return m,
            other => panic!("the socket ended: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ws_route_is_answered_by_its_lambda_and_floods_are_closed() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let path = d.join("echo.adf");
    agent(
        &path,
        "echo",
        &[(
            "serving",
            json!({"api": [
                {"method": "WS", "path": "/chat/:room", "lambda": "ws.ts:on", "max_frames_per_sec": 20},
                {"method": "WS", "path": "/guarded", "lambda": "ws.ts:on", "middleware": [{"lambda": "mw.ts:guard"}]}
            ]}),
        )],
    );
    {
        let mut s = Store::open(&path).unwrap();
        s.file_write(
            Caller::Owner,
            "ws.ts",
            br#"
let seen = 0;
export async function on(ev) {
  if (ev.type === "open") {
    await adf.ws_send({ connection_id: ev.connection_id, data: "welcome" });
    return JSON.stringify({ hello: ev.url_params.room, q: ev.url_params.q ?? null });
  }
  if (ev.type === "message") { seen += 1; return ev.binary ? { bytes: ev.data } : "echo:" + ev.data; }
  return null;
}
"#,
            &Default::default(),
        )
        .unwrap();
        s.file_write(
            Caller::Owner,
            "mw.ts",
            br#"export function guard(input) {
  if (input.data.query.key !== "ok") return { reject: { code: 401, reason: "no key" } };
  return { data: input.data };
}
"#,
            &Default::default(),
        )
        .unwrap();
        s.file_set_authorized("mw.ts", true).unwrap();
        s.close().unwrap();
    }
    enable_tools(&path, &["ws_send"]);
    let mut fleet = Fleet::new(Bus::new(), quiet_model());
    fleet.load(&path).unwrap();
    let id = fleet.list()[0].id.clone();
    let addr = adf::runtime::mesh::server::serve(fleet.mesh.clone(), "127.0.0.1", 0).await.unwrap().to_string();
    let url = format!("ws://{addr}/agents/echo/chat/r1?q=7");
    let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    // What the lambda sent with ws_send, then the open event's answer,
    // then each frame's.
    assert_eq!(text_of(next(&mut ws).await), "welcome");
    let v: Value = serde_json::from_str(&text_of(next(&mut ws).await)).unwrap();
    assert_eq!(v, json!({"hello": "r1", "q": "7"}));
    ws.send(Message::Text("hi".into())).await.unwrap();
    assert_eq!(text_of(next(&mut ws).await), "echo:hi");
    ws.send(Message::Binary(vec![0u8, 255, 1].into())).await.unwrap();
    let v: Value = serde_json::from_str(&text_of(next(&mut ws).await)).unwrap();
    assert_eq!(v, json!({"bytes": "AP8B"}));
    // The runtime lists it for the agent.
    let socks = fleet.mesh.sockets.of(&id);
    assert_eq!(socks.len(), 1);
    assert_eq!(socks[0].info()["direction"], "inbound");
    assert_eq!(socks[0].info()["target"], "/chat/r1");

    // Route middleware decides before the upgrade: refused, no socket.
    match tokio_tungstenite::connect_async(format!("ws://{addr}/agents/echo/guarded")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status().as_u16(), 401),
        other => panic!("expected a refused upgrade, got {other:?}"),
    }
    let (mut guarded, _) =
        tokio_tungstenite::connect_async(format!("ws://{addr}/agents/echo/guarded?key=ok")).await.unwrap();
    assert_eq!(text_of(next(&mut guarded).await), "welcome");
    guarded.close(None).await.unwrap();

    // No route at a path: closed with 4004.
    let (mut none, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/agents/echo/nothing")).await.unwrap();
    match next(&mut none).await {
        Message::Close(Some(c)) => assert_eq!(u16::from(c.code), 4004),
        other => panic!("expected a close, got {other:?}"),
    }

    // A flood: far more frames a second than a connection may send is
    // closed with 1008; the route still takes new connections.
    let (mut flood, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let _ = next(&mut flood).await;
    let _ = next(&mut flood).await;
    let (mut sink, mut stream) = flood.split();
    let sender = tokio::spawn(async move {
        for i in 0..3000 {
            if sink.send(Message::Text(format!("f{i}").into())).await.is_err() {
                break;
            }
        }
    });
    let code = loop {
        match tokio::time::timeout(Duration::from_secs(60), stream.next()).await.expect("closed within 60 s") {
            Some(Ok(Message::Close(Some(c)))) => break u16::from(c.code),
            Some(Ok(_)) => continue,
            other => panic!("ended without a close frame: {other:?}"),
        }
    };
    assert_eq!(code, 1008, "a flood is closed at the rate limit");
    sender.abort();
    ws.send(Message::Text("still here".into())).await.unwrap();
    assert_eq!(text_of(next(&mut ws).await), "echo:still here");
    let (mut again, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let _ = next(&mut again).await;
    let _ = next(&mut again).await;
    again.send(Message::Text("x".into())).await.unwrap();
    assert_eq!(text_of(next(&mut again).await), "echo:x");
    // Closing is seen; the listing forgets it.
    ws.close(None).await.unwrap();
    again.close(None).await.unwrap();
    wait("the sockets to be forgotten", || fleet.mesh.sockets.of(&id).is_empty()).await;
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_on_two_runtimes_authenticate_by_did_and_send_over_the_socket() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    // The hub takes signed peers only, into its inbox (a route without a lambda).
    let hub_path = d.join("hub.adf");
    let hub_did = agent(
        &hub_path,
        "hub",
        &[
            ("serving", json!({"api": [{"method": "WS", "path": "/mesh", "lambda": "adf:inbox"}]})),
            ("security.allow_unsigned", json!(false)),
            ("triggers.on_inbox.enabled", json!(false)),
        ],
    );
    let hub_rt = Fleet::new(Bus::new(), quiet_model());
    let mut hub_rt = hub_rt;
    hub_rt.load(&hub_path).unwrap();
    let hub_id = hub_rt.list()[0].id.clone();
    let hub_addr = adf::runtime::mesh::server::serve(hub_rt.mesh.clone(), "127.0.0.1", 0).await.unwrap().to_string();
    let url = format!("ws://{hub_addr}/agents/hub/mesh");

    // A peer that cannot sign for the DID it names is refused (4001).
    let (mut forged, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    forged
        .send(Message::Text(
            json!({"type": "auth", "did": hub_did, "nonce": "00", "timestamp": now, "signature": "ed25519:AAAA"})
                .to_string()
                .into(),
        ))
        .await
        .unwrap();
    let v: Value = serde_json::from_str(&text_of(next(&mut forged).await)).unwrap();
    assert_eq!((v["success"].as_bool(), v["error"].as_str()), (Some(false), Some("Invalid signature")));
    match next(&mut forged).await {
        Message::Close(Some(c)) => assert_eq!(u16::from(c.code), 4001),
        other => panic!("expected 4001, got {other:?}"),
    }

    // Alice, on another runtime, connects with the hub's DID expected and
    // sends it a message: no address, so only the socket can carry it.
    let alice_path = d.join("alice.adf");
    agent(&alice_path, "alice", &[("security.allow_local_fetch", json!(true))]);
    enable_tools(&alice_path, &["ws_connect", "ws_connections", "ws_send", "ws_disconnect"]);
    let script = vec![
        Reply::Tools(vec![(
            "ws_connect".into(),
            json!({"id": "hub", "url": url, "did": hub_did, "reconnect_delay_ms": 200}),
        )]),
        Reply::Tools(vec![("ws_connections".into(), json!({}))]),
        // The hub's HTTP address too: the open socket is still preferred.
        Reply::Tools(vec![(
            "msg_send".into(),
            json!({"recipient": hub_did, "address": format!("http://{hub_addr}/agents/hub/inbox"), "content": "over the socket"}),
        )]),
        Reply::Text("done".into()),
        Reply::Tools(vec![("ws_disconnect".into(), json!({"id": "hub"}))]),
        // No socket now: the address carries it (the mesh answers 202).
        Reply::Tools(vec![(
            "msg_send".into(),
            json!({"recipient": hub_did, "address": format!("http://{hub_addr}/agents/hub/inbox"), "content": "over http"}),
        )]),
        Reply::Tools(vec![("ws_connections".into(), json!({}))]),
        Reply::Text("closed".into()),
    ];
    let model = Arc::new(Scripted::new(script));
    let factory = model_factory(&model);
    let mut alice_rt = Fleet::new(Bus::new(), factory);
    alice_rt.load(&alice_path).unwrap();
    let alice_id = alice_rt.list()[0].id.clone();
    alice_rt
        .command(adf::protocol::Command::SendChat { agent: alice_id.clone(), r#loop: "main".into(), text: "go".into() })
        .unwrap();
    let hub_mb = hub_rt.mesh.find(&hub_id).unwrap();
    let inbox = || hub_mb.with_store(|s| s.inbox_list(None, None)).unwrap().unwrap_or_default();
    wait("the message in the hub's inbox", || !inbox().is_empty()).await;
    let row = Value::Object(inbox()[0].clone());
    assert_eq!(row["content"], "over the socket", "{row}");
    // The model saw the connection open and listed, with the hub's proven DID.
    let results = sent_results(&model, model.requests().len() - 1);
    assert!(results.iter().any(|r| r.contains("Connected. connection_id:")), "{results:?}");
    assert!(results.iter().any(|r| r.contains(&hub_did) && r.contains("outbound")), "{results:?}");
    assert!(
        results.iter().any(|r| r.contains("Message sent") && r.contains("Status: delivered.")),
        "over the socket, not HTTP: {results:?}"
    );
    // The hub sees an inbound socket from alice's proven DID.
    let alice_did = alice_rt.mesh.find(&alice_id).unwrap().did();
    let inbound = hub_rt.mesh.sockets.of(&hub_id);
    assert_eq!(inbound.len(), 1);
    assert_eq!(inbound[0].info()["remote_did"], alice_did);
    assert_eq!(inbound[0].info()["verified"], true);
    // The connection was kept for the next start (persist).
    let cfg = alice_rt.mesh.find(&alice_id).unwrap().with_store(|s| s.config_value()).unwrap().unwrap();
    assert_eq!(cfg["ws_connections"][0]["url"], url);
    assert_eq!(cfg["ws_connections"][0]["origin"], "agent");
    // ws_disconnect by config id closes it (and keeps it closed).
    alice_rt
        .command(adf::protocol::Command::SendChat {
            agent: alice_id.clone(),
            r#loop: "main".into(),
            text: "close".into(),
        })
        .unwrap();
    wait("the hub's socket to close", || hub_rt.mesh.sockets.of(&hub_id).is_empty()).await;
    wait("alice's second turn", || model.requests().len() >= 8).await;
    let last = sent_results(&model, 7);
    assert!(last.iter().any(|r| r.contains("Disconnected.")), "{last:?}");
    assert!(last.iter().any(|r| r.contains("Message sent") && r.contains("Status: 202.")), "then over HTTP: {last:?}");
    wait("the HTTP message in the hub's inbox", || inbox().iter().any(|r| r["content"] == "over http")).await;
    assert!(last.last().unwrap().contains("No active WebSocket connections."), "{last:?}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(hub_rt.mesh.sockets.of(&hub_id).is_empty(), "a disconnected config does not come back");
    // Unloading alice closes everything of hers.
    alice_rt.shutdown().await;
    wait("the hub's socket to close", || hub_rt.mesh.sockets.of(&hub_id).is_empty()).await;
    // Loaded again, alice connects by herself (the kept connection); when
    // the hub drops the socket, she reconnects (`ws.reconnecting`).
    let mut alice_rt = Fleet::new(Bus::new(), quiet_model());
    alice_rt.load(&alice_path).unwrap();
    wait("alice to connect again on her own", || {
        hub_rt.mesh.sockets.of(&hub_id).iter().any(|s| s.info()["remote_did"] == alice_did)
    })
    .await;
    let first = hub_rt.mesh.sockets.of(&hub_id)[0].id.clone();
    let mut reconnecting = alice_rt
        .bus
        .subscribe(None, adf::runtime::bus::Filter { agent_id: None, types: vec!["ws.reconnecting".into()] });
    hub_rt.mesh.sockets.get(&first).unwrap().close(1011, "the hub restarts");
    wait("alice to reconnect", || hub_rt.mesh.sockets.of(&hub_id).iter().any(|s| s.id != first)).await;
    match tokio::time::timeout(std::time::Duration::from_secs(5), reconnecting.next()).await.unwrap() {
        Some(adf::runtime::bus::Item::Event(e)) => {
            assert_eq!(
                (e.event.payload["config_id"].as_str(), e.event.payload["attempt"].as_u64()),
                (Some("hub"), Some(1))
            );
        }
        other => panic!("{other:?}"),
    }
    alice_rt.shutdown().await;
    wait("the hub's socket to close", || hub_rt.mesh.sockets.of(&hub_id).is_empty()).await;

    // An agent without allow_local_fetch cannot open a socket to loopback.
    let mallory_path = d.join("mallory.adf");
    agent(&mallory_path, "mallory", &[]);
    enable_tools(&mallory_path, &["ws_connect"]);
    let model = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![("ws_connect".into(), json!({"url": url}))]),
        Reply::Text("done".into()),
    ]));
    let factory = model_factory(&model);
    let mut mallory_rt = Fleet::new(Bus::new(), factory);
    mallory_rt.load(&mallory_path).unwrap();
    let mid = mallory_rt.list()[0].id.clone();
    mallory_rt
        .command(adf::protocol::Command::SendChat { agent: mid, r#loop: "main".into(), text: "go".into() })
        .unwrap();
    wait("mallory's turn", || model.requests().len() >= 2).await;
    let last = model.requests().last().unwrap().messages.last().unwrap().content[0].to_string();
    assert!(last.contains("ws_connect refused") && last.contains("127.0.0.1"), "{last}");
    assert!(hub_rt.mesh.sockets.of(&hub_id).is_empty());
    mallory_rt.shutdown().await;
    hub_rt.shutdown().await;
}

/// A peer that stops answering pings is found dead within the pong wait
/// (10 s), and the kept connection reconnects (`ws.reconnecting`), as it
/// does for a peer that drops. An `http:` URL means the same server's
/// WebSocket. A connection the agent writes into its config itself is its
/// own: it passes the egress guard whatever the entry says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peer_is_dropped_and_reconnected_and_agent_written_entries_are_guarded() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    // A server that completes the handshake, then never reads again (so
    // never answers a ping); it counts its accepts.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let accepts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n = accepts.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = l.accept().await {
            if let Ok(ws) = tokio_tungstenite::accept_async(tcp).await {
                n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(ws);
            }
        }
    });
    let path = d.join("listener.adf");
    agent(
        &path,
        "listener",
        &[(
            "ws_connections",
            json!([{"id": "feed", "url": format!("http://{addr}/feed"), "keepalive_interval_ms": 300,
                "reconnect_delay_ms": 100, "auth": "none"}]),
        )],
    );
    let mut rt = Fleet::new(Bus::new(), quiet_model());
    let mut reconnecting =
        rt.bus.subscribe(None, adf::runtime::bus::Filter { agent_id: None, types: vec!["ws.reconnecting".into()] });
    rt.load(&path).unwrap();
    wait("the first connection", || accepts.load(std::sync::atomic::Ordering::SeqCst) >= 1).await;
    let t0 = std::time::Instant::now();
    match tokio::time::timeout(Duration::from_secs(14), reconnecting.next()).await.expect("a reconnect within 14 s") {
        Some(adf::runtime::bus::Item::Event(e)) => assert_eq!(e.event.payload["config_id"], "feed"),
        other => panic!("{other:?}"),
    }
    let waited = t0.elapsed();
    assert!(waited < Duration::from_secs(13), "the dead peer was noticed late: {waited:?}");
    wait("the second connection", || accepts.load(std::sync::atomic::Ordering::SeqCst) >= 2).await;
    rt.shutdown().await;

    // An agent without allow_local_fetch writes a connection to loopback
    // into its own config, with no origin, and asks to connect it.
    let m_path = d.join("mallory.adf");
    agent(&m_path, "mallory", &[]);
    enable_tools(&m_path, &["ws_connect"]);
    {
        // The owner lifted the approval of config writes for this test.
        let mut s = Store::open(&m_path).unwrap();
        let mut cfg = s.config_value().unwrap();
        for t in cfg["tools"].as_array_mut().unwrap() {
            if t["name"] == "sys_update_config" {
                t["restricted"] = json!(false);
            }
        }
        s.config_replace(cfg).unwrap();
        s.close().unwrap();
    }
    let model = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![(
            "sys_update_config".into(),
            json!({"path": "ws_connections", "action": "append", "value": {"id": "sneak", "url": format!("ws://{addr}/x")}}),
        )]),
        Reply::Tools(vec![("ws_connect".into(), json!({"id": "sneak"}))]),
        Reply::Text("done".into()),
    ]));
    let mut rt = Fleet::new(Bus::new(), model_factory(&model));
    rt.load(&m_path).unwrap();
    let id = rt.list()[0].id.clone();
    let before = accepts.load(std::sync::atomic::Ordering::SeqCst);
    rt.command(adf::protocol::Command::SendChat { agent: id.clone(), r#loop: "main".into(), text: "go".into() })
        .unwrap();
    wait("mallory's turn", || model.requests().len() >= 3).await;
    let results = sent_results(&model, 2);
    assert!(
        results.last().unwrap().contains("ws_connect refused") && results.last().unwrap().contains("Blocked"),
        "{results:?}"
    );
    let cfg = rt.mesh.find(&id).unwrap().with_store(|s| s.config_value()).unwrap().unwrap();
    assert_eq!(cfg["ws_connections"][0]["origin"], "agent", "{cfg}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(accepts.load(std::sync::atomic::Ordering::SeqCst), before, "nothing reached the loopback server");
    rt.shutdown().await;
}
