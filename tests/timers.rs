//! Timers (runtime conformance 26–28): settled before anything runs,
//! missed timers fire once and reschedule from now, interval renewals are
//! counted from the fire, `max_runs` and `end_at` end them, `on_timer` is
//! the kill switch and its target scopes decide who is woken; an agent
//! actor wakes on its tick with the timer's payload.

mod common;

use std::sync::Arc;
use std::time::Duration;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::agent::{spawn_with_tick, waiting_owner};
use adf::runtime::bus::Bus;
use adf::runtime::executor::{Absent, Executor};
use adf::store::timers::{NewTimer, Schedule, renewal};
use adf::store::{Caller, NewAgent, Store};
use common::*;
use serde_json::json;

fn agent(dir: &std::path::Path) -> Store {
    Store::create(dir.join("a.adf"), &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() })
        .unwrap()
        .0
}

fn add(s: &mut Store, sched: &Schedule, next: i64, scope: &[&str], payload: Option<&str>) -> i64 {
    s.timer_insert(&NewTimer {
        schedule: sched,
        next_wake_at: next,
        payload,
        scope: Some(scope),
        lambda: None,
        warm: false,
        locked: false,
    })
    .unwrap()
}

fn every(ms: i64, max_runs: Option<i64>, end_at: Option<i64>) -> Schedule {
    Schedule::Interval { every_ms: ms, start_at: None, end_at, max_runs }
}

#[test]
fn p26_p27_renewal_rules() {
    let now = 1_000_000;
    assert_eq!(renewal(&Schedule::Once { at: 5 }, 0, now), None);
    assert_eq!(renewal(&every(60_000, None, None), 7, now), Some(now + 60_000), "from the fire, not the schedule");
    assert_eq!(renewal(&every(60_000, Some(3), None), 1, now), Some(now + 60_000));
    assert_eq!(renewal(&every(60_000, Some(3), None), 2, now), None, "max_runs counts total fires");
    assert_eq!(renewal(&every(60_000, None, Some(now + 59_999)), 0, now), None, "the next wake would pass end_at");
    assert_eq!(renewal(&every(60_000, None, Some(now + 60_000)), 0, now), Some(now + 60_000));
    let cron = Schedule::Cron { cron: "0 * * * *".into(), end_at: None, max_runs: None };
    assert_eq!(renewal(&cron, 0, 1_800_000), Some(3_600_000));
}

#[tokio::test]
async fn p26_settled_before_dispatch_and_a_missed_timer_fires_once() {
    let dir = tmp();
    let mut s = agent(dir.path());
    let now = adf::store::now_ms();
    let missed = add(&mut s, &every(60_000, None, None), now - 10 * 60_000, &["agent"], Some("catch up"));
    let once = add(&mut s, &Schedule::Once { at: now - 1 }, now - 1, &["agent"], None);
    let later = add(&mut s, &every(60_000, None, None), now + 60_000, &["agent"], None);
    let mut ex = Executor::new(s, Arc::new(Scripted::new([])), Bus::new(), Arc::new(Absent)).unwrap();
    let wakes = ex.fire_timers(now).unwrap();
    assert_eq!(wakes.len(), 2, "each due timer fires once, however much it missed");
    assert_eq!(wakes[0], "A scheduled timer has fired.\nPayload: catch up");
    assert_eq!(wakes[1], "A scheduled timer has fired.\nCheck your mind for context on what to do next.");
    let rows = ex.store.timer_list(true).unwrap();
    let get = |id| rows.iter().find(|t| t.id == id).unwrap();
    assert_eq!(
        (get(missed).next_wake_at, get(missed).run_count, get(missed).last_fired_at),
        (now + 60_000, 1, Some(now))
    );
    assert!(get(once).expired);
    assert_eq!(get(later).run_count, 0);
    assert!(ex.fire_timers(now).unwrap().is_empty(), "settled: no second fire");
}

#[tokio::test]
async fn p28_on_timer_is_the_kill_switch_and_scopes_must_match() {
    let dir = tmp();
    let mut s = agent(dir.path());
    let now = adf::store::now_ms();
    add(&mut s, &every(1000, None, None), now - 1, &["agent"], Some("a"));
    s.config_set(Caller::Owner, "triggers.on_timer.enabled", json!(false)).unwrap();
    let mut ex = Executor::new(s, Arc::new(Scripted::new([])), Bus::new(), Arc::new(Absent)).unwrap();
    assert!(ex.fire_timers(now).unwrap().is_empty(), "disabled on_timer silences timers");
    assert_eq!(ex.store.timer_list(false).unwrap()[0].run_count, 1, "but they still advance");
    ex.store
        .config_set(Caller::Owner, "triggers.on_timer", json!({"enabled": true, "targets": [{"scope": "system"}]}))
        .unwrap();
    assert!(ex.fire_timers(now + 2000).unwrap().is_empty(), "no agent target: the agent is not woken");
    ex.store.config_set(Caller::Owner, "triggers.on_timer.targets", json!([{"scope": "agent"}])).unwrap();
    assert_eq!(ex.fire_timers(now + 4000).unwrap().len(), 1);
    for state in ["error", "suspended", "off"] {
        ex.state = state.into();
        assert!(ex.fire_timers(now + 6000).unwrap().is_empty(), "{state}: timers do not wake the model (point 24)");
    }
    ex.state = "hibernate".into();
    assert_eq!(ex.fire_timers(now + 8000).unwrap().len(), 1, "hibernate: timers still wake it (point 23)");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_wakes_on_its_timer() {
    let dir = tmp();
    let mut s = agent(dir.path());
    let now = adf::store::now_ms();
    add(&mut s, &Schedule::Once { at: now + 150 }, now + 150, &["agent"], Some("water the plants"));
    let owner = waiting_owner();
    let ex = Executor::new(s, Arc::new(Scripted::new([Reply::Text("Watering.".into())])), Bus::new(), owner.clone())
        .unwrap();
    let (h, task) = spawn_with_tick(ex, owner, Duration::from_millis(50));
    tokio::time::sleep(Duration::from_millis(800)).await;
    drop(h);
    let ex = task.await.unwrap();
    let rows = visible(&ex.store);
    assert_eq!(rows[0].content[0]["text"], "A scheduled timer has fired.\nPayload: water the plants");
    assert_eq!(rows[1].content[0]["text"], "Watering.");
    assert!(ex.store.timer_list(true).unwrap()[0].expired);
    let cp = ex.store.meta_get("adf_runtime_turn_checkpoint").unwrap().unwrap().value;
    assert!(cp.contains("\"event_type\":\"timer\""), "{cp}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_agent_releases_its_memory() {
    let dir = tmp();
    let s = agent(dir.path());
    let owner = waiting_owner();
    let ex = Executor::new(s, Arc::new(Scripted::new([Reply::Text("hi".into())])), Bus::new(), owner.clone()).unwrap();
    let (h, task) = spawn_with_tick(ex, owner, Duration::from_millis(2));
    h.send(adf::runtime::agent::AgentCommand::Chat("hello".into()));
    tokio::time::sleep(Duration::from_millis(200 + 2 * adf::runtime::agent::PARK_AFTER_TICKS as u64 * 2)).await;
    drop(h);
    let ex = task.await.unwrap();
    assert!(!ex.is_loaded(), "after a quiet spell the caches are gone");
    assert!(ex.store.is_parked(), "and the file's connection is closed");
    assert_eq!(visible(&ex.store).len(), 2, "the turn ran, and the file opens again on use");
    assert!(!ex.store.is_parked());
}

/// The loop without its `[Context: …]` audit rows.
fn visible(store: &adf::store::Store) -> Vec<adf::store::loop_rows::LoopRow> {
    store.loop_rows(None).unwrap().into_iter().filter(|r| !adf::runtime::prompt::is_context_row(r)).collect()
}

/// A system-scope timer runs its lambda without the model, in hibernate
/// too, keeps a warm sandbox's state between runs when asked, and a
/// failing lambda is logged, emitted and kept for the agent's card.
#[tokio::test]
async fn system_timers_run_lambdas_without_the_model() {
    use adf::runtime::bus::{Filter, Item};
    use adf::store::files::WriteOptions;
    let dir = tmp();
    let mut s = agent(dir.path());
    let now = adf::store::now_ms();
    let lambda = "export async function tick(event) {\n\
                    globalThis.n = (globalThis.n || 0) + 1;\n\
                    const prev = await adf.fs_read({path: 'ticks.log'}).then(f => f.content, () => '');\n\
                    await adf.fs_write({mode: 'write', path: 'ticks.log', content: prev + event.type + ':' + event.data.timer.run_count + ':' + n + '\\n'});\n\
                  }\n\
                  export function broken() { throw new Error('no luck'); }\n";
    s.file_write(Caller::Owner, "lib/tick.js", lambda.as_bytes(), &WriteOptions::default()).unwrap();
    for (name, warm) in [("lib/tick.js:tick", true), ("lib/tick.js:broken", false)] {
        s.timer_insert(&NewTimer {
            schedule: &every(1000, None, None),
            next_wake_at: now - 1,
            payload: None,
            scope: Some(&["system"]),
            lambda: Some(name),
            warm,
            locked: false,
        })
        .unwrap();
    }
    let provider = Arc::new(Scripted::new([]));
    let bus = Bus::new();
    let mut ex = Executor::new(s, provider.clone(), bus.clone(), Arc::new(Absent)).unwrap();
    ex.state = "hibernate".into();
    for k in 0..2 {
        assert!(ex.fire_timers(now + k * 2000).unwrap().is_empty(), "no agent wake");
        ex.run_system().await;
    }
    assert_eq!(ex.store.file_read_text("ticks.log").unwrap(), "timer:1:1\ntimer:2:2\n", "warm state kept");
    assert_eq!(provider.call_count(), 0, "the model was never called");
    assert!(ex.last_lambda_error.as_deref().is_some_and(|e| e.contains("no luck")), "{:?}", ex.last_lambda_error);
    let mut sub = bus.subscribe(None, Filter::default());
    let mut kinds = Vec::new();
    while let Some(Item::Event(e)) = sub.try_next() {
        kinds.push(e.event.event_type.to_string());
    }
    assert!(kinds.iter().filter(|k| *k == "lambda.completed").count() >= 2, "{kinds:?}");
    assert!(kinds.iter().any(|k| k == "lambda.failed"), "{kinds:?}");
    assert!(kinds.iter().any(|k| k == "trigger.fired"), "{kinds:?}");
    // Off: nothing runs.
    ex.state = "off".into();
    ex.fire_timers(now + 10_000).unwrap();
    ex.run_system().await;
    assert_eq!(ex.store.file_read_text("ticks.log").unwrap().lines().count(), 2);
}

#[test]
fn cron_across_month_ends() {
    let at = |y, m, d, h, min| {
        chrono::NaiveDate::from_ymd_opt(y, m, d).unwrap().and_hms_opt(h, min, 0).unwrap().and_utc().timestamp_millis()
    };
    // The 31st at 10:30: from January 31st 11:00, February has none, so March 31st.
    assert_eq!(adf::tools::next_cron("30 10 31 * *", at(2027, 1, 31, 11, 0)), Ok(at(2027, 3, 31, 10, 30)));
    // Midnight on the first, from the last minute of a leap February.
    let first = Schedule::Cron { cron: "0 0 1 * *".into(), end_at: None, max_runs: None };
    assert_eq!(renewal(&first, 0, at(2028, 2, 29, 23, 59)), Some(at(2028, 3, 1, 0, 0)));
    // Across the year end, and stopped by end_at.
    assert_eq!(renewal(&first, 5, at(2027, 12, 31, 12, 0)), Some(at(2028, 1, 1, 0, 0)));
    let bounded = Schedule::Cron { cron: "0 0 1 * *".into(), end_at: Some(at(2027, 12, 31, 23, 0)), max_runs: None };
    assert_eq!(renewal(&bounded, 5, at(2027, 12, 31, 12, 0)), None);
    let capped = Schedule::Cron { cron: "0 0 1 * *".into(), end_at: None, max_runs: Some(3) };
    assert_eq!(renewal(&capped, 2, at(2027, 12, 31, 12, 0)), None, "the third fire was the last");
}
