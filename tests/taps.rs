//! Event taps (issue 21): a lambda subscribed to its agent's events, with
//! its type filter and `when`, never fed its own events, held to its rate
//! (the rest dropped and logged) while the agent goes on; a wildcard tap
//! without `allow_wildcard` is not started.

mod common;

use std::sync::Arc;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::fleet::Fleet;
use adf::store::{Caller, NewAgent, Store};
use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taps_see_the_events_they_ask_for_and_not_their_own() {
    let dir = tmp();
    let d = dir.path();
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let path = d.join("tapped.adf");
    {
        let (mut s, _) = Store::create(
            &path,
            &NewAgent { name: Some("tapped"), provider: Some("scripted"), model: Some("m"), ..Default::default() },
        )
        .unwrap();
        s.file_write(
            Caller::Owner,
            "taps.ts",
            br#"
let seen = 0;
export async function on(ev) {
  seen += 1;
  await adf.fs_write({ mode: "write", path: "notes/tap-log.txt", content: `${seen} ${ev.event_type} ${ev.payload.path}` });
}
export async function flood(ev) {
  await adf.fs_write({ mode: "write", path: "flood.txt", content: String(ev.seq) });
}
"#,
            &Default::default(),
        )
        .unwrap();
        let taps = json!([
            {"name": "notes", "lambda": "taps.ts:on",
             "filter": {"event_types": ["file.written"], "when": "event.payload.path.startsWith('notes/')"}},
            {"name": "flood", "lambda": "taps.ts:flood", "filter": {"event_types": ["*"], "allow_wildcard": true},
             "exclude_own_origin": false, "max_rate_per_sec": 2},
            {"name": "sloppy", "lambda": "taps.ts:on", "filter": {"event_types": ["*"]}}
        ]);
        s.config_set(Caller::Owner, "umbilical_taps", taps).unwrap();
        s.close().unwrap();
    }
    let model = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![("fs_write".into(), json!({"mode": "write", "path": "notes/a.md", "content": "a"}))]),
        Reply::Tools(vec![("fs_write".into(), json!({"mode": "write", "path": "other/b.md", "content": "b"}))]),
        Reply::Text("done".into()),
    ]));
    let factory = model_factory(&model);
    let mut fleet = Fleet::new(Bus::new(), factory);
    fleet.load(&path).unwrap();
    let id = fleet.list()[0].id.clone();
    let mb = fleet.mesh.find(&id).unwrap();
    let read = |p: &str| mb.with_store(|s| s.file_read_text(p).ok()).unwrap();
    let logs = || {
        let q = adf::store::logs::LogQuery { limit: 1000, ..Default::default() };
        mb.with_store(|s| s.log_list(&q)).unwrap().unwrap()
    };
    // The wildcard tap without allow_wildcard was not started, and said so.
    assert!(logs().iter().any(|l| l.event.as_deref() == Some("register_failed") && l.message.contains("sloppy")));
    fleet
        .command(adf::protocol::Command::SendChat { agent: id.clone(), r#loop: "main".into(), text: "go".into() })
        .unwrap();
    wait("the notes tap to write its log", || read("notes/tap-log.txt").is_some()).await;
    // The flood tap feeds on its own writes: held to 2 a second, logged.
    wait("the flood tap to be throttled", || {
        logs().iter().any(|l| l.event.as_deref() == Some("rate_limited") && l.message.contains("Tap flood throttled"))
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    // One event matched: notes/a.md; other/b.md failed `when`, and the
    // tap's own write (under notes/ too) was not fed back to it.
    assert_eq!(read("notes/tap-log.txt").as_deref(), Some("1 file.written notes/a.md"));
    assert!(read("flood.txt").is_some(), "the flood tap ran");
    // The agent goes on answering.
    assert!(model.requests().len() >= 3);
    fleet.shutdown().await;
}
