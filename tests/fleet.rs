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
