//! `adf why` (issue 19): why an agent is awake or stuck, from its file, or
//! through the daemon that runs it (with the live state).

mod common;

use std::sync::Arc;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::executor::{Absent, Executor, TurnEnd};
use adf::store::timers::{NewTimer, Schedule};
use adf::store::{NewAgent, Store};
use common::*;
use serde_json::json;

#[tokio::test]
async fn why_names_the_last_wake_what_waits_and_the_next_wake() {
    let dir = tmp();
    let path = dir.path().join("a.adf");
    let (mut s, _) =
        Store::create(&path, &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() }).unwrap();
    let at = adf::store::now_ms() + 3_600_000;
    s.timer_insert(&NewTimer {
        schedule: &Schedule::Once { at },
        next_wake_at: at,
        payload: Some("water the plants"),
        scope: Some(&["agent"]),
        lambda: None,
        warm: false,
        locked: false,
    })
    .unwrap();
    let mut cfg = s.config_value().unwrap();
    cfg["tools"] = tools_enabled(&["sys_update_config"]);
    for t in cfg["tools"].as_array_mut().unwrap() {
        if t["name"] == "sys_update_config" {
            t["restricted"] = json!(true);
        }
    }
    s.config_replace(cfg).unwrap();
    // A restricted call with no one to answer: the turn waits on the owner.
    let provider = Arc::new(Scripted::new([Reply::Tools(vec![(
        "sys_update_config".into(),
        json!({"path": "description", "value": "x"}),
    )])]));
    let mut ex = Executor::new(s, provider, Bus::new(), Arc::new(Absent)).unwrap();
    let end = ex.chat("change your description").await.unwrap();
    assert!(matches!(end, TurnEnd::AwaitingOwner { .. }), "{end:?}");
    ex.store_into().close().unwrap();

    let v = json(&adf(dir.path(), &["why", "a.adf", "--json"], None));
    assert!(v["state"].is_null(), "not running: the file alone");
    assert_eq!(v["last_turn"]["woken_by"], "chat");
    let waits = v["waiting_on"].as_array().unwrap();
    assert!(waits.iter().any(|w| w["what"] == "approval" && w["tool"] == "sys_update_config"), "{v}");
    assert_eq!(v["next_wake"]["what"], "timer");
    assert_eq!(v["next_wake"]["payload"], "water the plants");
    let text = ok(&adf(dir.path(), &["why", "a.adf"], None));
    assert!(text.contains("last turn: woken by chat"), "{text}");
    assert!(text.contains("waiting on: your approval of sys_update_config"), "{text}");
    assert!(text.contains("next wake: timer"), "{text}");
    fails(&adf(dir.path(), &["why", "nope.adf"], None), &["no such file"]);
}
