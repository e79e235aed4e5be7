//! Triggers on real files and real sandbox workers: system lanes
//! (conformance 29), self-changes (30), agent-scope wakes through the
//! actor, timing modifiers, and on_startup.

mod common;

use std::sync::Arc;
use std::time::Duration;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::agent::{AgentCommand, spawn_with_tick, waiting_owner};
use adf::runtime::bus::{Bus, Filter, Item};
use adf::runtime::executor::{Absent, Executor};
use adf::runtime::triggers::{Dispatch, Dispatcher, Timing, TriggerEvent};
use adf::store::files::WriteOptions;
use adf::store::{Caller, NewAgent, Store};
use common::*;
use serde_json::{Value, json};

fn agent(dir: &std::path::Path) -> Store {
    Store::create(dir.join("a.adf"), &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() })
        .unwrap()
        .0
}

fn write(s: &mut Store, path: &str, text: &str) {
    s.file_write(Caller::Owner, path, text.as_bytes(), &WriteOptions::default()).unwrap();
}

/// A `once` system timer due now, running `lambda`.
fn due_timer(s: &mut Store, lambda: &str) -> i64 {
    let now = adf::store::now_ms();
    s.timer_insert(&adf::store::timers::NewTimer {
        schedule: &adf::store::timers::Schedule::Once { at: now },
        next_wake_at: now,
        payload: None,
        scope: Some(&["system"]),
        lambda: Some(lambda),
        warm: false,
        locked: false,
    })
    .unwrap()
}

fn kinds(bus: &Bus) -> Vec<(String, Value)> {
    let mut sub = bus.subscribe(None, Filter::default());
    let mut out = Vec::new();
    while let Some(Item::Event(e)) = sub.try_next() {
        out.push((e.event.event_type.to_string(), e.event.payload.clone()));
    }
    out
}

async fn wait_for(mut f: impl FnMut() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p29_lanes_run_one_or_four_hold_64_and_drop_the_rest() {
    let dir = tmp();
    let mut s = agent(dir.path());
    write(&mut s, "slow.js", "export function main() { const t = Date.now(); while (Date.now() - t < 400) {} }\n");
    let path = s.path().to_path_buf();
    let bus = Bus::new();
    let provider: Arc<Scripted> = Arc::new(Scripted::new([]));
    let (p2, b2) = (provider.clone(), bus.clone());
    let factory = move || {
        let st = Store::sibling(&path).ok()?;
        Executor::new(st, p2.clone(), b2.clone(), Arc::new(Absent)).ok()
    };
    let d = Dispatcher::new("agent-x".into(), bus.clone(), Box::new(factory), Box::new(|_, _| {}));
    let job = |trigger: &str| Dispatch {
        trigger: trigger.into(),
        index: 0,
        system: true,
        lambda: Some("slow.js".into()),
        command: None,
        warm: false,
        timing: Timing::Now,
        event: TriggerEvent { ty: "tool_call", source: "agent:t".into(), data: json!({}) },
    };
    for _ in 0..70 {
        d.submit(job("on_tool_call"));
        d.submit(job("on_task_create"));
    }
    assert_eq!(d.lane("on_tool_call:slow.js"), (1, 64), "high-frequency: one at a time, 64 waiting");
    assert_eq!(d.lane("on_task_create:slow.js"), (4, 64), "work-shaped: four at a time");
    // What `adf why` lists: each lane with a queue, running and waiting.
    let waits = d.waiting();
    assert!(waits.contains(&("on_tool_call:slow.js".to_string(), 1, 64)), "{waits:?}");
    assert!(waits.contains(&("on_task_create:slow.js".to_string(), 4, 64)), "{waits:?}");
    let dropped = kinds(&bus).iter().filter(|(k, p)| k == "trigger.dropped" && p["reason"] == "lane_full").count();
    assert_eq!(dropped, 5 + 2);
    // A timer fire dropped from a full lane is rewound, not lost.
    let id = due_timer(&mut s, "slow.js");
    let now = adf::store::now_ms();
    assert_eq!(s.timers_settle_due(now).unwrap().len(), 1);
    assert!(s.timer_list(true).unwrap().iter().any(|t| t.id == id && t.expired));
    for _ in 0..69 {
        d.submit_job(adf::runtime::code::SystemJob {
            trigger: "on_timer",
            lambda: "slow.js".into(),
            event: json!({"type": "timer", "data": {"timer": {"id": id}}}),
            warm: false,
            source: "system:timer".into(),
        });
    }
    let t = s.timer_list(true).unwrap().into_iter().find(|t| t.id == id).unwrap();
    assert!(!t.expired && t.run_count == 0, "rewound: {t:?}");
    // The lanes drain.
    drop(s);
    d.shutdown();
}

/// An agent whose on_file_change runs a lambda: the owner's write fires
/// it, the agent's own write does not unless include_self, and the
/// lambda's own write never reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p30_file_changes_through_the_actor() {
    let dir = tmp();
    let mut s = agent(dir.path());
    write(
        &mut s,
        "lib/watch.js",
        "export async function seen(e) {\n\
           const prev = await adf.fs_read({path: 'seen.log'}).then(f => f.content, () => '');\n\
           await adf.fs_write({mode: 'write', path: 'seen.log', content: prev + e.data.operation + ' ' + e.data.path + ' by ' + e.source.split(':')[0] + '\\n'});\n\
         }\n",
    );
    s.config_set(
        Caller::Owner,
        "triggers.on_file_change",
        json!({"enabled": true, "targets": [
            {"scope": "system", "lambda": "lib/watch.js:seen", "filter": {"watch": "*.md"}},
            {"scope": "system", "lambda": "lib/watch.js:seen", "filter": {"watch": "self/*", "include_self": true}},
            {"scope": "system", "lambda": "lib/watch.js:seen", "filter": {"watch": "seen.log", "include_self": true}}
        ]}),
    )
    .unwrap();
    let replies = vec![
        Reply::Tools(vec![("fs_write".into(), json!({"mode": "write", "path": "notes.md", "content": "agent"}))]),
        Reply::Tools(vec![("fs_write".into(), json!({"mode": "write", "path": "self/x.txt", "content": "agent"}))]),
        Reply::Text("ok".into()),
    ];
    let bus = Bus::new();
    let owner = waiting_owner();
    let ex = Executor::new(s, Arc::new(Scripted::new(replies)), bus.clone(), owner.clone()).unwrap();
    let (h, task) = spawn_with_tick(ex, owner, Duration::from_millis(50));
    h.send(AgentCommand::Chat("write things".into()));
    let sub_bus = bus.clone();
    wait_for(move || kinds(&sub_bus).iter().filter(|(k, _)| k == "lambda.completed").count() >= 1).await;
    // The owner writes through the actor.
    h.send(AgentCommand::With(adf::runtime::agent::OwnerWork(Box::new(|ex: &mut Executor| {
        ex.owner_write("README.md", b"owner edit").unwrap();
    }))));
    let sub_bus = bus.clone();
    wait_for(move || kinds(&sub_bus).iter().filter(|(k, _)| k == "lambda.completed").count() >= 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(h);
    let ex = task.await.unwrap();
    let log = ex.store.file_read_text("seen.log").unwrap();
    assert_eq!(log, "created self/x.txt by agent\nmodified README.md by system\n", "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_scope_wakes_debounce_and_startup() {
    let dir = tmp();
    let mut s = agent(dir.path());
    s.config_set(
        Caller::Owner,
        "triggers.on_file_change",
        json!({"enabled": true, "targets": [{"scope": "agent", "filter": {"watch": "inbox/*"}, "debounce_ms": 400}]}),
    )
    .unwrap();
    s.config_set(Caller::Owner, "triggers.on_startup", json!({"enabled": true, "targets": [{"scope": "agent"}]}))
        .unwrap();
    let provider = Arc::new(Scripted::new([]).with_fallback(|_| Reply::Text("noted".into())));
    let bus = Bus::new();
    let owner = waiting_owner();
    let ex = Executor::new(s, provider.clone(), bus.clone(), owner.clone()).unwrap();
    let (h, task) = spawn_with_tick(ex, owner, Duration::from_millis(50));
    let p = provider.clone();
    wait_for(move || p.call_count() >= 1).await;
    for i in 0..5 {
        h.send(AgentCommand::With(adf::runtime::agent::OwnerWork(Box::new(move |ex: &mut Executor| {
            ex.owner_write(&format!("inbox/{i}.txt"), b"x").unwrap();
        }))));
    }
    let p = provider.clone();
    wait_for(move || p.call_count() >= 2).await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(provider.call_count(), 2, "five changes inside the debounce window wake the agent once");
    drop(h);
    let ex = task.await.unwrap();
    let texts: Vec<String> = ex
        .store
        .loop_rows(None)
        .unwrap()
        .iter()
        .filter(|r| r.role == "user")
        .filter_map(|r| r.content[0]["text"].as_str().map(str::to_string))
        .filter(|t| !t.starts_with("[Context"))
        .collect();
    assert_eq!(texts[0], "Agent started. Review your mind for context and take any startup actions.");
    assert_eq!(texts[1], "A file has been created: inbox/4.txt");
}

/// `on_logs` sees an error row (and the handler's own rows do not fire it
/// again); `on_task_create`/`on_task_complete` see a background call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_and_tasks_fire_their_triggers() {
    let dir = tmp();
    let mut s = agent(dir.path());
    write(
        &mut s,
        "lib/seen.js",
        "// Two lanes may run at once: append, never read-modify-write.\n\
         async function append(path, line) { await adf.fs_write({mode: 'append', path, content: line + '\\n'}); }\n\
         export async function log(e) { console.error('handler ran'); await append('errors.log', e.data.entry.origin + ': ' + e.data.entry.message); }\n\
         export async function task(e) { await append('tasks.log', e.type + ' ' + e.data.task.tool + ' ' + e.data.task.status); }\n",
    );
    s.config_set(
        Caller::Owner,
        "triggers.on_logs",
        json!({"enabled": true, "targets": [{"scope": "system", "lambda": "lib/seen.js:log", "filter": {"level": ["error"], "origin": ["sys_*"]}}]}),
    )
    .unwrap();
    for t in ["on_task_create", "on_task_complete"] {
        s.config_set(
            Caller::Owner,
            &format!("triggers.{t}"),
            json!({"enabled": true, "targets": [{"scope": "system", "lambda": "lib/seen.js:task"}]}),
        )
        .unwrap();
    }
    let replies = vec![
        Reply::Tools(vec![("sys_code".into(), json!({"code": "throw new Error('kaput')"}))]),
        Reply::Tools(vec![(
            "sys_code".into(),
            json!({"code": "await adf.fs_write({mode: 'write', path: 'bg.txt', content: 'x', _async: true})"}),
        )]),
        Reply::Text("ok".into()),
    ];
    let bus = Bus::new();
    let owner = waiting_owner();
    let ex = Executor::new(s, Arc::new(Scripted::new(replies)), bus.clone(), owner.clone()).unwrap();
    let path = ex.store.path().to_path_buf();
    let (h, task) = spawn_with_tick(ex, owner, Duration::from_millis(50));
    h.send(AgentCommand::Chat("go".into()));
    // Until the handlers' lines are in the file (read beside the agent, as
    // the app reads it), not for a fixed time: a loaded machine runs the
    // three lanes later, never differently.
    let read = |name: &str| {
        adf::store::Store::open_read_only(&path).ok().and_then(|s| s.file_read_text(name).ok()).unwrap_or_default()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !(read("errors.log").contains("kaput") && read("tasks.log").contains("task_complete")) {
        assert!(
            std::time::Instant::now() < deadline,
            "errors.log {:?}, tasks.log {:?}",
            read("errors.log"),
            read("tasks.log")
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // A while more: a handler's own log rows must not fire it again (one
    // line in errors.log, asserted below).
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(h);
    let ex = task.await.unwrap();
    assert_eq!(ex.store.file_read_text("errors.log").unwrap(), "sys_code: Error: kaput\n");
    let tasks = ex.store.file_read_text("tasks.log").unwrap();
    assert!(tasks.contains("task_create fs_write running\n"), "{tasks}");
    assert!(tasks.contains("task_complete fs_write completed\n"), "{tasks}");
}

/// A sibling connection writes beside the agent's own, reserves event
/// numbers without overlap, and never marks the file cleanly closed.
#[test]
fn siblings_share_the_file_but_not_its_clean_close() {
    let dir = tmp();
    let mut s = agent(dir.path());
    let path = s.path().to_path_buf();
    write(&mut s, "a.txt", "main");
    let mut sib = Store::sibling(&path).unwrap();
    let a = s.meta_reserve("seq_test", 1000, 0).unwrap();
    let b = sib.meta_reserve("seq_test", 1000, 0).unwrap();
    let c = s.meta_reserve("seq_test", 1000, 0).unwrap();
    assert_eq!((a, b, c), (1, 1001, 2001));
    sib.file_write(Caller::Owner, "b.txt", b"sibling", &WriteOptions::default()).unwrap();
    // The main connection sees the sibling's config change at once.
    sib.config_set(Caller::Owner, "description", json!("set by the sibling")).unwrap();
    assert_eq!(s.config_value().unwrap()["description"], json!("set by the sibling"));
    drop(sib);
    let marker = |s: &Store| s.meta_get("adf_clean_close").unwrap().is_some();
    assert!(!marker(&s), "a sibling's close is not the file's");
    assert_eq!(s.file_read_text("b.txt").unwrap(), "sibling");
    drop(s);
    let s = Store::open(&path).unwrap();
    assert_eq!(s.file_read_text("b.txt").unwrap(), "sibling", "the sibling's writes are in the file");
    assert!(Store::sibling(&dir.path().join("nope.adf")).is_err(), "only files open here");
}

/// Shell targets: a `.sh` timer lambda and `command` trigger targets run
/// without the model, with the event in their environment, and a command
/// that needs a disabled tool stops with exit 126.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_targets_run_scripts_and_commands() {
    let dir = tmp();
    let mut s = agent(dir.path());
    write(
        &mut s,
        "bin/tick.sh",
        "# count the ticks\necho \"tick $TIMER_ID $EVENT_TYPE\" >> ticks.log && cat ticks.log | wc -l > count.txt\n",
    );
    s.config_set(
        Caller::Owner,
        "triggers.on_file_change",
        json!({"enabled": true, "targets": [
            {"scope": "system", "command": "echo \"$CHANGED_PATH by $AGENT_NAME\" >> changes.log", "filter": {"watch": "docs/*"}},
            {"scope": "system", "command": "rm README.md", "filter": {"watch": "docs/*"}}
        ]}),
    )
    .unwrap();
    let id = due_timer(&mut s, "bin/tick.sh");
    let bus = Bus::new();
    let owner = waiting_owner();
    let provider = Arc::new(Scripted::new([]));
    let ex = Executor::new(s, provider.clone(), bus.clone(), owner.clone()).unwrap();
    let (h, task) = spawn_with_tick(ex, owner, Duration::from_millis(50));
    h.send(AgentCommand::With(adf::runtime::agent::OwnerWork(Box::new(|ex: &mut Executor| {
        ex.owner_write("docs/plan.md", b"plan").unwrap();
    }))));
    let b = bus.clone();
    wait_for(move || {
        let k = kinds(&b);
        k.iter().filter(|(t, _)| t == "lambda.completed").count() >= 2 && k.iter().any(|(t, _)| t == "lambda.failed")
    })
    .await;
    drop(h);
    let ex = task.await.unwrap();
    assert_eq!(ex.store.file_read_text("ticks.log").unwrap(), format!("tick {id} timer\n"));
    assert_eq!(ex.store.file_read_text("count.txt").unwrap(), "1\n");
    assert_eq!(ex.store.file_read_text("changes.log").unwrap(), "docs/plan.md by a\n");
    assert!(ex.store.file_stat("README.md").unwrap().is_some(), "fs_delete is disabled: nothing removed");
    let failed: Vec<Value> = kinds(&bus).into_iter().filter(|(t, _)| t == "lambda.failed").map(|(_, p)| p).collect();
    assert!(failed[0]["error"].as_str().unwrap().starts_with("exit 126: fs_delete is disabled"), "{failed:?}");
    assert_eq!(provider.call_count(), 0);
}

/// A change to a text file reaches the agent with its unified diff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_change_wakes_carry_the_diff() {
    let dir = tmp();
    let mut s = agent(dir.path());
    write(&mut s, "plan.md", "# Plan\n\n- write the spec\n- ship it\n");
    s.config_set(
        Caller::Owner,
        "triggers.on_file_change",
        json!({"enabled": true, "targets": [{"scope": "agent", "filter": {"watch": "plan.md"}}]}),
    )
    .unwrap();
    let provider = Arc::new(Scripted::new([]).with_fallback(|_| Reply::Text("seen".into())));
    let bus = Bus::new();
    let owner = waiting_owner();
    let ex = Executor::new(s, provider.clone(), bus.clone(), owner.clone()).unwrap();
    let (h, task) = spawn_with_tick(ex, owner, Duration::from_millis(50));
    h.send(AgentCommand::With(adf::runtime::agent::OwnerWork(Box::new(|ex: &mut Executor| {
        ex.owner_write("plan.md", b"# Plan\n\n- write the spec\n- test it\n- ship it\n").unwrap();
    }))));
    let p = provider.clone();
    wait_for(move || p.call_count() >= 1).await;
    drop(h);
    let ex = task.await.unwrap();
    let wake = ex
        .store
        .loop_rows(None)
        .unwrap()
        .iter()
        .filter_map(|r| r.content[0]["text"].as_str().map(str::to_string))
        .find(|t| t.starts_with("A file has been"))
        .unwrap();
    assert_eq!(
        wake,
        "A file has been modified: plan.md\n\nChanges:\n\n--- a/plan.md\n+++ b/plan.md\n@@ -1,4 +1,5 @@\n # Plan\n \n - write the spec\n+- test it\n - ship it\n\n\nUse fs_read to see the full file if you need more context."
    );
}
