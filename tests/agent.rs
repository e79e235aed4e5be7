//! Agents as actors: owner commands reach a running turn (approvals,
//! answers), an owner message interrupts it and starts a new one, a state
//! change ends it, `off` stops the agent.

mod common;

use std::sync::Arc;
use std::time::Duration;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::agent::{AgentCommand, spawn, waiting_owner};
use adf::runtime::bus::{Bus, Filter, Item, Subscription};
use adf::runtime::executor::Executor;
use adf::store::{NewAgent, Store};
use common::*;
use serde_json::json;

fn start(
    dir: &std::path::Path,
    provider: Scripted,
) -> (adf::runtime::agent::AgentHandle, tokio::task::JoinHandle<Executor>, Subscription, Arc<Scripted>) {
    let (store, _) = Store::create(
        dir.join("a.adf"),
        &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    let provider = Arc::new(provider);
    let bus = Bus::new();
    let sub = bus.subscribe(None, Filter::default());
    let owner = waiting_owner();
    let ex = Executor::new(store, provider.clone(), bus, owner.clone()).unwrap();
    let (h, task) = spawn(ex, owner);
    (h, task, sub, provider)
}

async fn wait_for(sub: &mut Subscription, ty: &str) -> serde_json::Value {
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(Item::Event(e)) = sub.next().await
                && e.event.event_type == ty
            {
                return e.event.payload.clone();
            }
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("no {ty} event"))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_owner_message_interrupts_the_running_turn() {
    let dir = tmp();
    let provider = Scripted::new([Reply::Text("too late".into()), Reply::Text("second answer".into())])
        .with_latency(Duration::from_millis(400));
    let (h, task, mut sub, p) = start(dir.path(), provider);
    h.send(AgentCommand::Chat("first".into()));
    wait_for(&mut sub, "agent.state.changed").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.send(AgentCommand::Chat("second".into()));
    let done = wait_for(&mut sub, "turn.completed").await;
    assert_eq!(done["interrupted"], true);
    let done = wait_for(&mut sub, "turn.completed").await;
    assert_eq!(done["content"], "second answer");
    drop(h);
    let ex = task.await.unwrap();
    let rows = visible(&ex.store);
    let texts: Vec<String> = rows.iter().map(|r| r.content[0]["text"].as_str().unwrap_or("").to_string()).collect();
    assert_eq!(texts, ["first", "second", "second answer"], "the interrupted call left no assistant row");
    assert_eq!(p.call_count(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn approvals_and_answers_arrive_as_commands() {
    let dir = tmp();
    let provider = Scripted::new([
        Reply::Tools(vec![("sys_update_config".into(), json!({"path": "description", "value": "by command"}))]),
        Reply::Tools(vec![("ask".into(), json!({"question": "ready?"}))]),
        Reply::Text("done".into()),
    ]);
    let (h, task, mut sub, _) = start(dir.path(), provider);
    h.send(AgentCommand::Chat("go".into()));
    let req = wait_for(&mut sub, "hil.requested").await;
    h.send(AgentCommand::Approve { task_id: req["task_id"].as_str().unwrap().into(), always: false });
    let ask = wait_for(&mut sub, "ask.requested").await;
    h.send(AgentCommand::Answer { task_id: ask["request_id"].as_str().unwrap().into(), text: "yes".into() });
    let done = wait_for(&mut sub, "turn.completed").await;
    assert_eq!(done["content"], "done");
    drop(h);
    let ex = task.await.unwrap();
    assert_eq!(ex.store.config_value().unwrap()["description"], "by command");
    let rows = visible(&ex.store);
    assert_eq!(rows[4].content[0]["content"], "Human answered: yes");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_owner_state_change_ends_the_turn_and_off_stops_the_agent() {
    let dir = tmp();
    let provider = Scripted::new([Reply::Text("never".into())]).with_latency(Duration::from_millis(2000));
    let (h, task, mut sub, _) = start(dir.path(), provider);
    h.send(AgentCommand::Chat("long job".into()));
    wait_for(&mut sub, "agent.state.changed").await;
    h.send(AgentCommand::SetState("off".into()));
    let done = wait_for(&mut sub, "turn.completed").await;
    assert_eq!((done["interrupted"].as_bool(), done["targetState"].as_str()), (Some(true), Some("off")));
    let ex = tokio::time::timeout(Duration::from_secs(5), task).await.expect("actor stopped").unwrap();
    assert_eq!(ex.state, "off");
    let rows = visible(&ex.store);
    assert_eq!(rows.last().unwrap().content[0]["text"], "[System] Turn ended by owner; state set to off.");
    let cp = ex.store.meta_get("adf_runtime_turn_checkpoint").unwrap().unwrap().value;
    assert!(cp.contains("\"interrupted\"") && cp.contains("owner_state_transition"), "{cp}");
}

fn start_with(
    dir: &std::path::Path,
    provider: Scripted,
    cfg: &[(&str, serde_json::Value)],
) -> (adf::runtime::agent::AgentHandle, tokio::task::JoinHandle<Executor>, Subscription) {
    let (mut store, _) = Store::create(
        dir.join("a.adf"),
        &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    for (k, v) in cfg {
        store.config_set(adf::store::Caller::Owner, k, v.clone()).unwrap();
    }
    let bus = Bus::new();
    let sub = bus.subscribe(None, Filter::default());
    let owner = waiting_owner();
    let ex = Executor::new(store, Arc::new(provider), bus, owner.clone()).unwrap();
    let (h, task) = spawn(ex, owner);
    (h, task, sub)
}

fn tools_forever() -> Scripted {
    Scripted::new([]).with_fallback(|_| Reply::Tools(vec![("fs_list".into(), json!({}))]))
}

#[tokio::test(flavor = "multi_thread")]
async fn p34_suspended_then_off_when_the_owner_stays_silent() {
    let dir = tmp();
    let cfg = [("limits.max_active_turns", json!(1)), ("limits.suspend_timeout_ms", json!(300))];
    let (h, task, mut sub) = start_with(dir.path(), tools_forever(), &cfg);
    h.send(AgentCommand::Chat("work".into()));
    assert_eq!(wait_for(&mut sub, "suspend.requested").await["reason"], "max_active_turns");
    let resolved = wait_for(&mut sub, "suspend.resolved").await;
    assert_eq!(resolved, json!({"resumed": false, "timed_out": true}));
    let ex = tokio::time::timeout(Duration::from_secs(5), task).await.expect("stopped").unwrap();
    assert_eq!(ex.state, "off");
    drop(h);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_suspension_can_be_lifted() {
    let dir = tmp();
    let cfg = [("limits.max_active_turns", json!(1))];
    let provider = tools_forever();
    let (h, task, mut sub) = start_with(dir.path(), provider, &cfg);
    h.send(AgentCommand::Chat("work".into()));
    wait_for(&mut sub, "suspend.requested").await;
    h.send(AgentCommand::Resume);
    assert_eq!(wait_for(&mut sub, "suspend.resolved").await["resumed"], true);
    wait_for(&mut sub, "suspend.requested").await;
    h.send(AgentCommand::SetState("off".into()));
    let ex = tokio::time::timeout(Duration::from_secs(5), task).await.expect("stopped").unwrap();
    assert_eq!(ex.state, "off");
    // Two model calls: one before the suspension, one after resuming.
    let calls = visible(&ex.store).iter().filter(|r| r.role == "assistant").count();
    assert_eq!(calls, 2);
    drop(h);
}

/// The loop without its `[Context: …]` audit rows.
fn visible(store: &adf::store::Store) -> Vec<adf::store::loop_rows::LoopRow> {
    store.loop_rows(None).unwrap().into_iter().filter(|r| !adf::runtime::prompt::is_context_row(r)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approval_given_later_resumes_the_paused_turn() {
    let dir = tmp();
    let path = dir.path().join("a.adf");
    let (store, _) =
        Store::create(&path, &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() }).unwrap();
    // First run: nobody is there to approve; the turn pauses.
    let call =
        Reply::Tools(vec![("sys_update_config".into(), json!({"path": "description", "value": "approved later"}))]);
    let mut ex =
        Executor::new(store, Arc::new(Scripted::new([call])), Bus::new(), Arc::new(adf::runtime::executor::Absent))
            .unwrap();
    let adf::runtime::executor::TurnEnd::AwaitingOwner { task_id } = ex.chat("tidy your description").await.unwrap()
    else {
        panic!("expected a pause")
    };
    ex.store.close().unwrap();
    // Later, as an actor: the owner approves and the turn goes on.
    let store = Store::open(&path).unwrap();
    let bus = Bus::new();
    let mut sub = bus.subscribe(None, Filter::default());
    let owner = waiting_owner();
    let ex =
        Executor::new(store, Arc::new(Scripted::new([Reply::Text("Done, it is tidy.".into())])), bus, owner.clone())
            .unwrap();
    let (h, task) = spawn(ex, owner);
    h.send(AgentCommand::Approve { task_id: task_id.clone(), always: false });
    let done = wait_for(&mut sub, "turn.completed").await;
    assert_eq!(done["content"], "Done, it is tidy.");
    drop(h);
    let ex = task.await.unwrap();
    assert_eq!(ex.store.config_value().unwrap()["description"], "approved later");
    assert_eq!(ex.store.task_get(&task_id).unwrap().unwrap().status, "completed");
    let rows: Vec<String> = ex
        .store
        .loop_rows(None)
        .unwrap()
        .iter()
        .filter(|r| !adf::runtime::prompt::is_context_row(r))
        .map(|r| r.content[0]["type"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(rows, ["text", "tool_use", "tool_result", "text"]);
    // An approval for nothing paused is refused and changes nothing.
    let store = ex.store;
    let mut ex =
        Executor::new(store, Arc::new(Scripted::new([])), Bus::new(), Arc::new(adf::runtime::executor::Absent))
            .unwrap();
    assert!(ex.resume_paused(&task_id, adf::runtime::executor::Decision::Approve { always: false }).await.is_err());
}
