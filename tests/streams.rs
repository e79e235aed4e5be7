//! Stream bindings (issue 21): a browser-side socket bridged to a TCP
//! service by the route's own lambda (`adf.stream_bind` on open), a
//! process's output pumped into a TCP socket, the agent's events as NDJSON,
//! the owner's gates (a port not on the allowlist, host processes off, an
//! event stream as a sink), thresholds, and a declared binding that waits
//! for its target and is made once the target is there.

mod common;

use std::sync::Arc;
use std::time::Duration;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::{Bus, Filter, Item};
use adf::runtime::fleet::Fleet;
use adf::store::{Caller, NewAgent, Store};
use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

/// A TCP server that echoes what it gets.
async fn echo_server() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// The tests set ADF_HOME for the process: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn text(got: &Arc<std::sync::Mutex<Vec<u8>>>) -> String {
    String::from_utf8_lossy(&got.lock().unwrap()).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bindings_pump_bytes_between_sockets_processes_and_events_within_the_gates() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let echo = echo_server().await;
    let (out_port, out) = collector(None).await;
    let (events_port, events) = collector(None).await;
    // A port for the declared binding, free until the test listens on it.
    let later = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let later_port = later.local_addr().unwrap().port();
    drop(later);
    let denied = 1;

    let path = d.join("pipes.adf");
    {
        let (mut s, _) = Store::create(
            &path,
            &NewAgent { name: Some("pipes"), provider: Some("scripted"), model: Some("m"), ..Default::default() },
        )
        .unwrap();
        s.file_write(
            Caller::Owner,
            "bridge.ts",
            format!(
                r#"export async function on(ev) {{
  if (ev.type === "open") {{
    await adf.stream_bind({{ a: {{ kind: "ws", connection_id: ev.connection_id }}, b: {{ kind: "tcp", host: "127.0.0.1", port: {echo} }}, bidirectional: true }});
  }}
  return null;
}}"#
            )
            .as_bytes(),
            &Default::default(),
        )
        .unwrap();
        let allow = json!([{"host": "127.0.0.1", "port": echo}, {"host": "localhost", "ports": [out_port, events_port, later_port]}]);
        s.config_set(
            Caller::Owner,
            "stream_bind",
            json!({"allow_tcp_bind": true, "tcp_allowlist": allow, "host_process_bind": true}),
        )
        .unwrap();
        s.config_set(
            Caller::Owner,
            "serving",
            json!({"api": [{"method": "WS", "path": "/term", "lambda": "bridge.ts:on"}]}),
        )
        .unwrap();
        s.config_set(
            Caller::Owner,
            "stream_bindings",
            json!([{"id": "later", "a": {"kind": "process", "isolation": "host", "command": ["printf", "declared"]},
                    "b": {"kind": "tcp", "host": "localhost", "port": later_port}}]),
        )
        .unwrap();
        let mut cfg = s.config_value().unwrap();
        enable_tools_where(&mut cfg, |n| n.starts_with("stream_"));
        s.config_replace(cfg).unwrap();
        s.close().unwrap();
    }
    let model = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![(
            "stream_bind".into(),
            json!({"a": {"kind": "tcp", "host": "127.0.0.1", "port": denied}, "b": {"kind": "tcp", "host": "127.0.0.1", "port": echo}}),
        )]),
        Reply::Tools(vec![(
            "stream_bind".into(),
            json!({"a": {"kind": "tcp", "host": "127.0.0.1", "port": echo}, "b": {"kind": "umbilical"}}),
        )]),
        Reply::Tools(vec![(
            "stream_bind".into(),
            json!({"a": {"kind": "umbilical", "filter": {"event_types": ["tool.completed"]}},
                   "b": {"kind": "tcp", "host": "localhost", "port": events_port}}),
        )]),
        Reply::Tools(vec![(
            "stream_bind".into(),
            json!({"a": {"kind": "process", "command": ["sh", "-c", "printf 'hello from a process'"]},
                   "b": {"kind": "tcp", "host": "localhost", "port": out_port}, "options": {"flow_summary_interval_ms": 100}}),
        )]),
        Reply::Tools(vec![("stream_bindings".into(), json!({}))]),
        Reply::Text("done".into()),
    ]));
    let factory = model_factory(&model);
    let bus = Bus::new();
    let mut sub = bus.subscribe(None, Filter { agent_id: None, types: vec!["binding.*".into()] });
    let mut fleet = Fleet::new(bus.clone(), factory);
    fleet.load(&path).unwrap();
    let id = fleet.list()[0].id.clone();
    let addr = adf::runtime::mesh::server::serve(fleet.mesh.clone(), "127.0.0.1", 0).await.unwrap().to_string();

    // The declared binding waits for its target.
    wait("the declared binding to be pending", || {
        fleet
            .mesh
            .bindings
            .of(&id)
            .iter()
            .any(|b| b.info()["status"] == "pending" && b.info()["last_error"].is_string())
    })
    .await;

    // A socket bridged to the echo server by the route's lambda.
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/agents/pipes/term")).await.unwrap();
    wait("the bridge binding", || fleet.mesh.bindings.of(&id).iter().any(|b| b.info()["a"]["kind"] == "ws")).await;
    ws.send(Message::Text("ping over the bridge".into())).await.unwrap();
    let back = loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await.unwrap() {
            Some(Ok(Message::Text(t))) => break t.to_string(),
            Some(Ok(_)) => continue,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(back, "ping over the bridge");

    // The model's bindings, within the gates.
    fleet
        .command(adf::protocol::Command::SendChat { agent: id.clone(), r#loop: "main".into(), text: "go".into() })
        .unwrap();
    wait("the model's turn", || model.requests().len() >= 6).await;
    let results = sent_results(&model, 5);
    assert!(results[0].contains("not allow-listed: 127.0.0.1:1"), "{results:?}");
    assert!(results[1].contains("read-only and cannot appear as b"), "{results:?}");
    assert!(results[2].contains("binding_id"), "{results:?}");
    assert!(results[3].contains("binding_id"), "{results:?}");
    assert!(results[4].contains("\"origin\":\"imperative\"") || results[4].contains("imperative"), "{results:?}");
    wait("the process's output at the collector", || text(&out) == "hello from a process").await;
    wait("tool events as NDJSON", || {
        text(&events)
            .lines()
            .any(|l| serde_json::from_str::<Value>(l).is_ok_and(|v| v["event_type"] == "tool.completed"))
    })
    .await;

    // The process ended: its binding ended with it, said on the bus.
    let mut reasons = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !reasons.iter().any(|r: &String| r == "source_closed") {
        let item = tokio::time::timeout_at(deadline, sub.next()).await.expect("binding.terminated").unwrap();
        if let Item::Event(e) = item
            && e.event.event_type == "binding.terminated"
        {
            reasons.push(e.event.payload["reason"].as_str().unwrap_or_default().to_string());
        }
    }

    // The declared binding is made once its target listens.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", later_port)).await.unwrap();
    let (_, declared) = collector(Some(listener)).await;
    wait("the declared binding's bytes", || text(&declared) == "declared").await;
    let removed = fleet.mesh.bindings.unbind(&id, "nothing", "manual");
    assert!(!removed, "an unknown id is not found");
    fleet.shutdown().await;
    assert!(fleet_bindings_gone(&bus).await);
}

/// After shutdown every binding says it terminated (agent_stopped or its
/// own end).
async fn fleet_bindings_gone(bus: &Arc<Bus>) -> bool {
    let mut sub = bus
        .subscribe(None, Filter { agent_id: None, types: vec!["binding.created".into(), "binding.terminated".into()] });
    let (mut created, mut ended) = (std::collections::HashSet::new(), std::collections::HashSet::new());
    while let Some(Item::Event(e)) = sub.try_next() {
        let id = e.event.payload["binding_id"].as_str().unwrap_or_default().to_string();
        if e.event.event_type == "binding.created" {
            created.insert(id);
        } else {
            ended.insert(id);
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        while let Some(Item::Event(e)) = sub.try_next() {
            if e.event.event_type == "binding.terminated" {
                ended.insert(e.event.payload["binding_id"].as_str().unwrap_or_default().to_string());
            }
        }
        if created.iter().all(|c| ended.contains(c)) {
            return true;
        }
        if std::time::Instant::now() > deadline {
            eprintln!("created {created:?}, ended {ended:?}");
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A TCP server that writes `n` bytes to each connection, then waits.
async fn chatter(n: usize) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = s.write_all(&vec![b'x'; n]).await;
                tokio::time::sleep(Duration::from_secs(60)).await;
            });
        }
    });
    port
}

/// Thresholds end a binding (`max_bytes`, `idle_timeout_ms`), said on the
/// bus; `stream_unbind` by the id `stream_bind` gave (from code) ends one
/// and an unknown id is an error; host processes are refused while the
/// owner has not switched them on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thresholds_unbind_and_the_host_process_gate() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let loud = chatter(100_000).await;
    let quiet = chatter(0).await;
    let (sink, _) = collector(None).await;
    let path = d.join("limits.adf");
    {
        let (mut s, _) = Store::create(
            &path,
            &NewAgent { name: Some("limits"), provider: Some("scripted"), model: Some("m"), ..Default::default() },
        )
        .unwrap();
        s.file_write(
            Caller::Owner,
            "ctl.ts",
            format!(
                r#"export async function on(ev) {{
  if (ev.type !== "open") return null;
  const r = await adf.stream_bind({{ a: {{ kind: "tcp", host: "127.0.0.1", port: {quiet} }}, b: {{ kind: "tcp", host: "127.0.0.1", port: {sink} }} }});
  const id = (typeof r === "string" ? JSON.parse(r) : r).binding_id;
  const u = await adf.stream_unbind({{ binding_id: id }});
  let again;
  try {{ again = await adf.stream_unbind({{ binding_id: id }}); }} catch (e) {{ again = "error: " + (e.message || e); }}
  return JSON.stringify({{ id, unbound: u, again }});
}}"#
            )
            .as_bytes(),
            &Default::default(),
        )
        .unwrap();
        let allow = json!([{"host": "127.0.0.1", "ports": [loud, quiet, sink]}]);
        s.config_set(Caller::Owner, "stream_bind", json!({"allow_tcp_bind": true, "tcp_allowlist": allow})).unwrap();
        s.config_set(
            Caller::Owner,
            "serving",
            json!({"api": [{"method": "WS", "path": "/ctl", "lambda": "ctl.ts:on"}]}),
        )
        .unwrap();
        let mut cfg = s.config_value().unwrap();
        enable_tools_where(&mut cfg, |n| n.starts_with("stream_"));
        s.config_replace(cfg).unwrap();
        s.close().unwrap();
    }
    let model = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![
            (
                "stream_bind".into(),
                json!({"a": {"kind": "tcp", "host": "127.0.0.1", "port": loud}, "b": {"kind": "tcp", "host": "127.0.0.1", "port": sink},
                       "options": {"max_bytes": 1000}}),
            ),
            (
                "stream_bind".into(),
                json!({"a": {"kind": "tcp", "host": "127.0.0.1", "port": quiet}, "b": {"kind": "tcp", "host": "127.0.0.1", "port": sink},
                       "options": {"idle_timeout_ms": 300}}),
            ),
            (
                "stream_bind".into(),
                json!({"a": {"kind": "process", "command": ["true"]}, "b": {"kind": "tcp", "host": "127.0.0.1", "port": sink}}),
            ),
            ("stream_unbind".into(), json!({"binding_id": "no-such-binding"})),
        ]),
        Reply::Text("done".into()),
    ]));
    let bus = Bus::new();
    let mut sub = bus.subscribe(None, Filter { agent_id: None, types: vec!["binding.*".into()] });
    let mut fleet = Fleet::new(bus.clone(), model_factory(&model));
    fleet.load(&path).unwrap();
    let id = fleet.list()[0].id.clone();
    fleet
        .command(adf::protocol::Command::SendChat { agent: id.clone(), r#loop: "main".into(), text: "go".into() })
        .unwrap();
    wait("the model's turn", || model.requests().len() >= 2).await;
    let results = sent_results(&model, 1);
    assert!(results[0].contains("binding_id") && results[1].contains("binding_id"), "{results:?}");
    assert!(results[2].contains("Host process stream binding is not enabled"), "{results:?}");
    assert!(results[3].contains("Binding not found: no-such-binding"), "{results:?}");
    // Both end at their thresholds, each said with its reason.
    let mut seen: Vec<(String, String)> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !(seen.iter().any(|(t, _)| t == "max_bytes") && seen.iter().any(|(t, _)| t == "idle_timeout_ms")) {
        let item = tokio::time::timeout_at(deadline, sub.next()).await.expect("two thresholds within 10 s").unwrap();
        if let Item::Event(e) = item
            && e.event.event_type == "binding.threshold_exceeded"
        {
            let p = &e.event.payload;
            seen.push((p["threshold"].as_str().unwrap_or("").into(), p["observed"].to_string()));
        }
    }
    wait("both bindings gone", || fleet.mesh.bindings.of(&id).is_empty()).await;
    // From code: bind, unbind by the id it gave, then the same id again.
    let addr = adf::runtime::mesh::server::serve(fleet.mesh.clone(), "127.0.0.1", 0).await.unwrap().to_string();
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/agents/limits/ctl")).await.unwrap();
    let answer = loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await.unwrap() {
            Some(Ok(Message::Text(t))) => break t.to_string(),
            Some(Ok(_)) => continue,
            other => panic!("{other:?}"),
        }
    };
    let v: Value = serde_json::from_str(&answer).unwrap();
    assert!(v["id"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
    assert!(v["unbound"].to_string().contains("true"), "{v}");
    assert!(v["again"].to_string().contains("Binding not found"), "{v}");
    assert!(fleet.mesh.bindings.of(&id).is_empty());
    fleet.shutdown().await;
}
