//! The owner's slash commands (issue 18): `/compact [what to keep]`,
//! `/clear`, `/idle`, `/hibernate`, `/stop` reach a running agent through
//! its actor (so the app and a daemon's clients get them alike); `adf chat`
//! answers `/help` itself and says so before sending an unknown `/word`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::agent::{AgentCommand, spawn_with_tick, waiting_owner};
use adf::runtime::bus::Bus;
use adf::runtime::executor::Executor;
use adf::store::{NewAgent, Store};
use common::*;

#[tokio::test(flavor = "multi_thread")]
async fn slash_commands_reach_a_running_agent() {
    let dir = tmp();
    let (s, _) = Store::create(dir.path().join("a.adf"), &NewAgent::default()).unwrap();
    let provider = Arc::new(Scripted::new([
        Reply::Text("one".into()),
        Reply::Text("two".into()),
        Reply::Text("three".into()),
        // The compaction call.
        Reply::Text("summary of the talk".into()),
    ]));
    let owner = waiting_owner();
    let ex = Executor::new(s, provider.clone(), Bus::new(), owner.clone()).unwrap();
    let (h, task) = spawn_with_tick(ex, owner, Duration::from_millis(20));
    for m in ["a", "b", "c"] {
        h.send(AgentCommand::Chat(m.into()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.send(AgentCommand::Chat("/compact keep the numbers".into()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reqs = provider.requests();
    let ask = reqs.last().unwrap().messages[0].content[0]["text"].as_str().unwrap().to_string();
    assert!(ask.contains("<compaction_instructions>\nkeep the numbers"), "{ask}");
    h.send(AgentCommand::Chat("/hibernate".into()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.send(AgentCommand::Chat("/clear".into()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.send(AgentCommand::Chat("/stop".into()));
    // /stop turns the agent off: the actor ends by itself.
    let ex = tokio::time::timeout(Duration::from_secs(5), task).await.expect("stopped").unwrap();
    assert_eq!(ex.state, "off");
    assert_eq!(provider.call_count(), 4, "no command went to the model as a message");
    let rows = ex.store.loop_rows(None).unwrap();
    assert!(rows.iter().all(|r| !r.content.to_string().contains("summary of the talk")), "cleared after compacting");
    drop(h);
}

#[test]
fn adf_chat_answers_help_and_refuses_states_for_a_file_not_running() {
    let dir = tmp();
    ok(&adf(dir.path(), &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    let help = ok(&adf(dir.path(), &["chat", "a.adf", "/help"], None));
    for c in ["/compact [what to keep]", "/clear", "/idle", "/hibernate", "/stop"] {
        assert!(help.contains(c), "{help}");
    }
    let j = json(&adf(dir.path(), &["chat", "a.adf", "/help", "--json"], None));
    assert_eq!(j["commands"].as_array().unwrap().len(), adf::runtime::slash::COMMANDS.len());
    fails(&adf(dir.path(), &["chat", "a.adf", "/idle"], None), &["not running here", "adf daemon"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_word_is_sent_as_text_after_saying_so() {
    use common::fake_provider::{FakeProvider, Scripted as Wire, anthropic_text};
    let dir = tmp();
    ok(&adf(dir.path(), &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    let fake = FakeProvider::start(vec![Wire::sse(anthropic_text(&["ok"], 1, 1))]).await;
    let (d, base) = (dir.path().to_path_buf(), fake.base_url.clone());
    let out = tokio::task::spawn_blocking(move || {
        adf_with_providers(&d, &base, &["chat", "a.adf", "/frobnicate the widget"])
    })
    .await
    .unwrap();
    assert_eq!(ok(&out).trim(), "ok");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/frobnicate is not a command or an installed skill (see /help); sending it as text"),
        "{err}"
    );
    let (_, body) = &fake.requests()[0];
    assert!(body["messages"].to_string().contains("/frobnicate the widget"));
}

#[tokio::test(flavor = "multi_thread")]
async fn slash_commands_typed_to_a_side_loop_act_on_that_loop() {
    use adf::store::loops::LoopSpec;
    let dir = tmp();
    let (mut s, _) = Store::create(dir.path().join("a.adf"), &NewAgent::default()).unwrap();
    s.loop_create("crit", &LoopSpec::default()).unwrap();
    let provider = Arc::new(Scripted::new([
        Reply::Text("one".into()),
        Reply::Text("two".into()),
        Reply::Text("three".into()),
        Reply::Text("the crit summary".into()),
    ]));
    let owner = waiting_owner();
    let ex = Executor::new(s, provider.clone(), Bus::new(), owner.clone()).unwrap();
    let (h, task) = spawn_with_tick(ex, owner, Duration::from_millis(20));
    let say = |t: &str| AgentCommand::LoopChat { name: "crit".into(), text: t.into(), turn_id: None };
    for m in ["a", "b", "c"] {
        h.send(say(m));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.send(say("/compact keep the verdicts"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ask = provider.requests().last().unwrap().messages[0].content[0]["text"].as_str().unwrap().to_string();
    assert!(ask.contains("keep the verdicts"), "{ask}");
    h.send(AgentCommand::With(adf::runtime::agent::OwnerWork(Box::new(|ex| {
        let rows = ex.store.side_rows("crit").unwrap();
        assert!(rows.iter().any(|r| r.content.to_string().contains("the crit summary")), "compacted in the loop");
        assert!(ex.store.loop_rows(None).unwrap().is_empty(), "main untouched");
    }))));
    h.send(say("/clear"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.send(say("/hibernate"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(h);
    let ex = task.await.unwrap();
    assert!(ex.store.side_rows("crit").unwrap().is_empty(), "cleared");
    assert_eq!(ex.state, "hibernate", "a state command is the agent's");
    assert_eq!(provider.call_count(), 4);
}
