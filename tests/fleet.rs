//! The fleet: agents loaded from a folder as actors on one bus, commands
//! routed by id, handle or unique name, emergency stop, clean shutdown.

mod common;

use std::sync::Arc;
use std::time::Duration;

use adf::protocol::Command;
use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::{Bus, Filter, Item};
use adf::runtime::fleet::{Fleet, ProviderFactory};
use adf::store::NewAgent;
use adf::store::create::create_file;
use common::*;

fn scripted() -> ProviderFactory {
    Arc::new(|_| {
        Ok(Arc::new(Scripted::new([]).with_fallback(|_| Reply::Text("hi".into()))) as Arc<dyn adf::providers::Provider>)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn load_route_stop_and_close() {
    let dir = tmp();
    let d = dir.path();
    std::fs::create_dir(d.join("ops")).unwrap();
    create_file(&d.join("scout.adf"), &NewAgent { name: Some("Scout"), ..Default::default() }).unwrap();
    create_file(&d.join("ops/deployer.adf"), &NewAgent { name: Some("Deployer"), ..Default::default() }).unwrap();
    create_file(&d.join("ops/twin.adf"), &NewAgent { name: Some("Scout"), handle: Some("twin"), ..Default::default() })
        .unwrap();
    std::fs::write(d.join("broken.adf"), "not a database").unwrap();
    let bus = Bus::new();
    let mut sub = bus.subscribe(
        None,
        Filter {
            agent_id: None,
            types: vec!["turn.completed".into(), "agent.state.changed".into(), "agent.loaded".into()],
        },
    );
    let mut fleet = Fleet::new(bus.clone(), scripted());
    let (loaded, failed) = fleet.load_dir(d);
    assert_eq!(loaded.len(), 3);
    assert_eq!(failed.len(), 1);
    assert!(failed[0].contains("broken.adf") && failed[0].contains("not a SQLite database"), "{failed:?}");
    assert!(fleet.resolve("deployer").is_ok(), "by handle");
    assert!(fleet.resolve("Deployer").is_ok(), "by name");
    let err = fleet.resolve("Scout").unwrap_err();
    assert!(err.contains("names 2 agents"), "{err}");
    assert_eq!(fleet.resolve("twin").unwrap(), loaded.iter().find(|a| a.handle == "twin").unwrap().id);
    fleet
        .command(Command::SendChat { agent: "deployer".into(), r#loop: "main".into(), text: "status?".into() })
        .unwrap();
    let turn = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Some(Item::Event(e)) = sub.next().await
                && e.event.event_type == "turn.completed"
            {
                return e;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(turn.event.payload["content"], "hi");
    assert!(fleet.command(Command::SetState { agent: "deployer".into(), state: "active".into() }).is_err());
    fleet.command(Command::EmergencyStop).unwrap();
    let mut offs = 0;
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while offs < 3 {
            if let Some(Item::Event(e)) = sub.next().await
                && e.event.event_type == "agent.state.changed"
                && e.event.payload["state"] == "off"
            {
                offs += 1;
            }
        }
    })
    .await;
    assert_eq!(offs, 3, "every agent turned off");
    assert!(fleet.shutdown().await.is_empty());
    for f in ["scout.adf", "ops/deployer.adf", "ops/twin.adf"] {
        let c = rusqlite::Connection::open(d.join(f)).unwrap();
        let n: i64 =
            c.query_row("SELECT count(*) FROM adf_meta WHERE key = 'adf_clean_close'", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1, "{f} closed cleanly");
    }
}

/// Identity hygiene (issue 19): a copied file is named as a copy with the
/// fix, a file with another's DID is flagged, and `adf claim` gives the
/// copy an identity of its own so both load.
#[tokio::test(flavor = "multi_thread")]
async fn a_copy_is_named_a_copy_with_the_fix_and_loads_once_claimed() {
    let dir = tmp();
    let d = dir.path();
    ok(&adf(d, &["new", "a.adf"], None));
    std::fs::copy(d.join("a.adf"), d.join("b.adf")).unwrap();
    std::fs::copy(d.join("a.adf"), d.join("c.adf")).unwrap();
    // c: the same DID under another config id (edited by hand).
    let raw = rusqlite::Connection::open(d.join("c.adf")).unwrap();
    raw.execute("UPDATE adf_config SET config_json = json_set(config_json, '$.id', 'other-id-123')", []).unwrap();
    drop(raw);
    let mut fleet = Fleet::new(Bus::new(), scripted());
    fleet.load(&d.join("a.adf")).unwrap();
    let e = fleet.load(&d.join("b.adf")).unwrap_err();
    assert!(e.contains("a copy of") && e.contains("same id and DID") && e.contains("adf claim"), "{e}");
    fleet.load(&d.join("c.adf")).unwrap();
    let flagged: Vec<_> = fleet
        .summaries()
        .iter()
        .filter_map(|s| s.duplicate_of.map(|p| (s.file_path.to_path_buf(), p.to_path_buf())))
        .collect();
    assert_eq!(flagged, [(d.join("c.adf"), d.join("a.adf"))]);
    let listed = serde_json::to_value(fleet.summaries()).unwrap();
    assert!(listed.to_string().contains("duplicateOf"), "{listed}");
    fleet.shutdown().await;
    // The fix the message names.
    let v = json(&adf(d, &["claim", "b.adf", "--yes", "--json"], None));
    let did = |p: &str| {
        let s = adf::store::Store::open_read_only(d.join(p)).unwrap();
        (s.meta_get("adf_did").unwrap().unwrap().value, s.config_value().unwrap()["id"].clone())
    };
    assert_eq!(v["did"].as_str().unwrap(), did("b.adf").0);
    assert_ne!(did("a.adf"), did("b.adf"), "its own DID and id");
    let mut fleet = Fleet::new(Bus::new(), scripted());
    fleet.load(&d.join("a.adf")).unwrap();
    fleet.load(&d.join("b.adf")).unwrap();
    fleet.shutdown().await;
}

/// The effective runtime snapshot: what the runtime applied (provider,
/// model, prompt, MCP), keys by source only, written on start and again
/// when a config change changes it; the agent cannot rewrite it.
#[tokio::test(flavor = "multi_thread")]
async fn the_runtime_snapshot_is_recorded_on_start_and_on_a_config_change() {
    use adf::runtime::executor::{Absent, Executor};
    use adf::store::{Caller, Store};
    let dir = tmp();
    let path = dir.path().join("a.adf");
    create_file(&path, &NewAgent { provider: Some("scripted"), model: Some("m1"), ..Default::default() }).unwrap();
    let mut fleet = Fleet::new(Bus::new(), scripted());
    fleet.load(&path).unwrap();
    fleet.shutdown().await;
    let snap = |s: &Store| -> serde_json::Value {
        serde_json::from_str(&s.meta_get("adfrs_runtime_snapshot").unwrap().expect("recorded").value).unwrap()
    };
    let s = Store::open(&path).unwrap();
    let v = snap(&s);
    assert_eq!((v["provider"].as_str(), v["model"].as_str()), (Some("scripted"), Some("m1")), "{v}");
    assert!(v["prompt"]["instructions_sha256"].is_string() && v["recorded_at"].is_string(), "{v}");
    let first = v["recorded_at"].clone();
    let provider = Arc::new(Scripted::new([]).with_fallback(|_| Reply::Text("ok".into())));
    let mut ex = Executor::new(s, provider, Bus::new(), Arc::new(Absent)).unwrap();
    ex.chat("one").await.unwrap();
    assert_eq!(snap(&ex.store)["recorded_at"], first, "unchanged: not written again");
    let mut cfg = ex.store.config_value().unwrap();
    cfg["model"]["model_id"] = serde_json::json!("m2");
    ex.store.config_replace(cfg).unwrap();
    ex.chat("two").await.unwrap();
    assert_eq!(snap(&ex.store)["model"], "m2", "the config change is in the snapshot");
    assert!(ex.store.meta_set(Caller::AGENT, "adfrs_runtime_snapshot", "{}", None).is_err(), "read-only to the agent");
}

/// A file loaded through a link is the same agent as by its real path: the
/// second load is refused by either name, and once unloaded it loads again.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_loaded_through_a_link_is_loaded_once() {
    let dir = tmp();
    let d = dir.path();
    std::fs::create_dir(d.join("real")).unwrap();
    std::os::unix::fs::symlink(d.join("real"), d.join("link")).unwrap();
    create_file(&d.join("real/scout.adf"), &NewAgent { name: Some("Scout"), ..Default::default() }).unwrap();
    let mut fleet = Fleet::new(Bus::new(), scripted());
    let a = fleet.load(&d.join("link/scout.adf")).unwrap();
    let err = fleet.load(&d.join("real/scout.adf")).unwrap_err();
    assert!(err.contains("already loaded"), "{err}");
    let err = fleet.load(&d.join("real/../link/scout.adf")).unwrap_err();
    assert!(err.contains("already loaded"), "{err}");
    fleet.unload(&a.id).await.unwrap();
    let b = fleet.load(&d.join("real/scout.adf")).unwrap();
    assert_eq!(a.id, b.id, "the same agent");
    assert!(fleet.shutdown().await.is_empty());
}

/// Conformance 33, its tasks: after a process died mid-turn, the next load
/// fails the `running` tasks and cancels the executor-managed approvals,
/// leaves the owner's own approvals open and the settled tasks as they
/// were, and says how many it settled. The load finds them through the
/// status index, among many settled tasks it does not read.
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_mid_turn_settles_its_orphaned_tasks_on_the_next_load() {
    use adf::store::Store;
    use adf::store::meta::MetaProtection;
    use adf::store::tasks::NewTask;
    let dir = tmp();
    let path = dir.path().join("a.adf");
    create_file(&path, &NewAgent::default()).unwrap();
    let args = serde_json::json!({"path": "notes.md"});
    let (running, managed, owners, settled) = {
        let mut s = Store::open(&path).unwrap();
        let mut task = |status: &str, executor_managed: bool| {
            s.task_create(&NewTask {
                tool: "fs_write",
                args: &args,
                status,
                origin: "agent",
                requires_authorization: false,
                executor_managed,
                approval_meta: None,
            })
            .unwrap()
        };
        let settled: Vec<String> = (0..500).map(|i| task(["completed", "failed", "denied"][i % 3], false)).collect();
        let ids = (task("running", false), task("pending_approval", true), task("pending_approval", false), settled);
        let now = adf::store::now_ms();
        let cp = serde_json::json!({"id": "t1", "status": "in_progress", "started_at": now - 5_000,
            "updated_at": now - 4_000, "event_type": "chat", "scope": "agent", "replay": "not_attempted"});
        s.set_system_meta("adf_runtime_turn_checkpoint", &cp.to_string(), MetaProtection::Readonly).unwrap();
        s.close().unwrap();
        ids
    };
    let bus = Bus::new();
    let mut sub = bus.subscribe(None, Filter { agent_id: None, types: vec!["loop.recovered".into()] });
    let mut fleet = Fleet::new(bus.clone(), scripted());
    fleet.load(&path).unwrap();
    let mut reasons = Vec::new();
    while let Ok(Some(Item::Event(e))) = tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
        reasons.push(e.event.payload.clone());
    }
    fleet.shutdown().await;
    assert!(reasons.iter().any(|p| p["reason"] == "stale_checkpoint"), "{reasons:?}");
    assert!(
        reasons.iter().any(|p| p["reason"] == "orphaned_tasks" && p["running"] == 1 && p["awaiting_approval"] == 1),
        "{reasons:?}"
    );
    let s = Store::open(&path).unwrap();
    let status = |id: &str| s.task_get(id).unwrap().unwrap();
    let r = status(&running);
    assert_eq!(r.status, "failed");
    assert!(r.error.as_deref().is_some_and(|e| e.contains("outcome unknown")), "{r:?}");
    assert_eq!(status(&managed).status, "cancelled");
    assert_eq!(status(&owners).status, "pending_approval", "the owner's approval is still open");
    let kept = settled.iter().filter(|id| ["completed", "failed", "denied"].contains(&status(id).status.as_str()));
    assert_eq!(kept.count(), 500, "settled tasks are left as they were");
    assert!(settled.iter().all(|id| status(id).error.is_none()), "no settled task was touched");
    // Only the unsettled ones come back from the status index.
    let open = s.task_list_in(&["running", "pending_approval"]).unwrap();
    assert_eq!(open.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), vec![owners.as_str()]);
}
