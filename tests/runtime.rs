//! The executor on real agent files with the in-process scripted provider:
//! runtime conformance points 22, 31, 32, 34, 36, 59 and the approval,
//! override and ask flows.

mod common;

use std::sync::{Arc, Mutex};

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::{Bus, Filter, Item};
use adf::runtime::executor::{Absent, ApprovalRequest, Decision, Executor, Owner, TurnEnd};
use adf::store::files::{Protection, WriteOptions};
use adf::store::{Caller, NewAgent, Store};
use common::*;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};

struct Owned {
    decisions: Mutex<Vec<Decision>>,
    answers: Mutex<Vec<String>>,
    seen: Mutex<Vec<ApprovalRequest>>,
}

impl Owned {
    fn new(decisions: Vec<Decision>, answers: Vec<&str>) -> Arc<Self> {
        Arc::new(Owned {
            decisions: Mutex::new(decisions),
            answers: Mutex::new(answers.into_iter().map(String::from).collect()),
            seen: Mutex::new(Vec::new()),
        })
    }
}

impl Owner for Owned {
    fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, Decision> {
        self.seen.lock().unwrap().push(req.clone());
        let d = self.decisions.lock().unwrap().remove(0);
        Box::pin(async move { d })
    }
    fn answer<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Option<String>> {
        let a = self.answers.lock().unwrap().pop();
        Box::pin(async move { a })
    }
}

fn agent(dir: &std::path::Path, cfg: &[(&str, Value)]) -> Store {
    let (mut s, _) = Store::create(
        dir.join("a.adf"),
        &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    for (k, v) in cfg {
        s.config_set(Caller::Owner, k, v.clone()).unwrap();
    }
    s
}

fn exec(store: Store, replies: Vec<Reply>, owner: Arc<dyn Owner>) -> (Executor, Arc<Scripted>, Arc<Bus>) {
    let provider = Arc::new(Scripted::new(replies));
    let bus = Bus::new();
    (Executor::new(store, provider.clone(), bus.clone(), owner).unwrap(), provider, bus)
}

fn texts(ex: &Executor) -> Vec<(String, String)> {
    visible(&ex.store)
        .iter()
        .map(|r| {
            let b = &r.content[0];
            let t =
                b["text"].as_str().map(String::from).unwrap_or_else(|| b["type"].as_str().unwrap_or("").to_string());
            (r.role.clone(), t)
        })
        .collect()
}

fn events(bus: &Bus) -> Vec<String> {
    let mut sub = bus.subscribe(None, Filter::default());
    let mut out = Vec::new();
    while let Some(Item::Event(e)) = sub.try_next() {
        out.push(e.event.event_type.to_string());
    }
    out
}

#[tokio::test]
async fn p22_interactive_text_ends_the_turn_autonomous_breaks_narration() {
    let dir = tmp();
    let (mut ex, p, _) = exec(agent(dir.path(), &[]), vec![Reply::Text("hello".into())], Arc::new(Absent));
    assert_eq!(ex.chat("hi").await.unwrap(), TurnEnd::Completed { text: "hello".into() });
    assert_eq!(p.call_count(), 1);
    let dir = tmp();
    let replies = (0..6).map(|i| Reply::Text(format!("thinking aloud {i}"))).collect();
    let (mut ex, p, _) = exec(agent(dir.path(), &[("autonomous", json!(true))]), replies, Arc::new(Absent));
    ex.chat("go").await.unwrap();
    assert_eq!(p.call_count(), 4, "forced to stop after 4 text-only replies");
    let nudges = texts(&ex)
        .iter()
        .filter(|(r, t)| r == "user" && t.starts_with("[Continue") || t.starts_with("[You replied"))
        .count();
    assert_eq!(nudges, 3);
    let logs =
        ex.store.db_query("SELECT event FROM adf_logs WHERE event = 'narration_loop_break'", &[], false).unwrap();
    assert_eq!(logs.rows.len(), 1);
    assert_eq!(ex.state, "idle");
}

#[tokio::test]
async fn p31_memory_flush_then_compaction() {
    let dir = tmp();
    let store = agent(dir.path(), &[("context.compact_threshold", json!(100))]);
    let replies = vec![
        Reply::Text("one".into()),
        Reply::Text("two".into()),
        Reply::Text("SUMMARY OF ALL".into()),
        Reply::Text("three".into()),
    ];
    let (mut ex, p, bus) = exec(store, replies, Arc::new(Absent));
    ex.chat("first").await.unwrap();
    ex.chat("second").await.unwrap();
    let t = texts(&ex);
    assert!(t.iter().any(|(_, x)| x.starts_with("Context is about to be compacted")), "grace turn first: {t:?}");
    assert!(!t.iter().any(|(_, x)| x.starts_with("[Loop Compacted")));
    ex.chat("third").await.unwrap();
    let t = texts(&ex);
    assert!(t[0].1.starts_with("[Loop Compacted, audited] SUMMARY OF ALL"), "{t:?}");
    assert_eq!(t.len(), 2, "automatic compaction keeps nothing but the summary: {t:?}");
    assert_eq!(t[1], ("assistant".into(), "three".into()));
    assert_eq!(p.call_count(), 4);
    let audit = ex.store.db_query("SELECT source, start_seq, end_seq FROM adf_audit", &[], false).unwrap();
    assert_eq!(audit.rows.len(), 1);
    assert_eq!(audit.rows[0]["start_seq"], 1);
    assert!(events(&bus).contains(&"loop.compacted".to_string()));
    // The compaction request had no tools and the transcript with seqs.
    let req = &p.requests()[2];
    assert!(req.tools.is_empty());
    assert!(req.messages[0].content[0]["text"].as_str().unwrap().contains("[USER S1] first"));
    // Seqs are never reused: the summary got a new one.
    let seqs: Vec<i64> = visible(&ex.store).iter().map(|r| r.seq).collect();
    assert!(seqs[0] > 6, "{seqs:?}");
}

#[tokio::test]
async fn p31_unaudited_summary_and_p59_voluntary_compaction_keeps_the_step() {
    let dir = tmp();
    let store = agent(
        dir.path(),
        &[
            ("tools.loop_compact.enabled", json!(true)),
            ("audit.loop", json!(false)),
            ("context.audit.loop", json!(false)),
        ],
    );
    let replies = vec![
        Reply::Text("ok".into()),
        Reply::Tools(vec![("loop_compact".into(), json!({"instructions": "keep the todo"}))]),
        Reply::Text("BRIEF".into()),
        Reply::Text("continuing".into()),
    ];
    let (mut ex, p, _) = exec(store, replies, Arc::new(Absent));
    ex.chat("a").await.unwrap();
    ex.chat("b").await.unwrap();
    let rows = visible(&ex.store);
    let t = texts(&ex);
    assert!(t[0].1.starts_with("[Loop Compacted] BRIEF"), "{t:?}");
    assert_eq!(t[1].1, "tool_use", "the calling step is kept");
    assert_eq!(t[2].1, "tool_result");
    assert_eq!(t[3].1, "continuing");
    assert_eq!(rows[0].ord, Some(rows[1].seq - 1), "summary sorts before the kept rows");
    assert!(
        p.requests()[2].messages[0].content[0]["text"]
            .as_str()
            .unwrap()
            .contains("<compaction_instructions>\nkeep the todo")
    );
    assert_eq!(ex.store.db_query("SELECT count(*) AS n FROM adf_audit", &[], false).unwrap().rows[0]["n"], 0);
}

#[tokio::test]
async fn p32_loop_tools_and_turn_tools_refused_from_code() {
    let dir = tmp();
    let mut store = agent(dir.path(), &[]);
    for name in ["loop_compact", "loop_clear", "say", "ask"] {
        let mut emit = |_: &'static str, _: Value| {};
        let mut ctx =
            adf::tools::Ctx { store: &mut store, caller: Caller::AGENT, from_code: true, full: false, emit: &mut emit };
        let out = adf::tools::execute(&mut ctx, name, &json!({"message": "x", "question": "y"}));
        assert!(out.is_error && out.content.starts_with("EXCLUDED_TOOL"), "{name}: {}", out.content);
    }
}

#[tokio::test]
async fn loop_clear_from_the_loop_ends_with_an_empty_loop() {
    let dir = tmp();
    let store = agent(dir.path(), &[("tools.loop_clear.enabled", json!(true))]);
    let (mut ex, p, bus) = exec(
        store,
        vec![Reply::Text("x".into()), Reply::Tools(vec![("loop_clear".into(), json!({}))])],
        Arc::new(Absent),
    );
    ex.chat("a").await.unwrap();
    ex.chat("clear it").await.unwrap();
    assert!(visible(&ex.store).is_empty());
    assert_eq!(p.call_count(), 2);
    assert!(events(&bus).contains(&"loop.cleared".to_string()));
    assert_eq!(
        ex.store.db_query("SELECT count(*) AS n FROM adf_audit WHERE source = 'loop'", &[], false).unwrap().rows[0]["n"],
        1
    );
}

#[tokio::test]
async fn p34_max_active_turns_suspends() {
    let dir = tmp();
    let store = agent(dir.path(), &[("limits.max_active_turns", json!(2))]);
    let tool = || Reply::Tools(vec![("fs_list".into(), json!({}))]);
    let (mut ex, p, bus) = exec(store, vec![tool(), tool(), tool()], Arc::new(Absent));
    assert_eq!(ex.chat("loop forever").await.unwrap(), TurnEnd::Suspended);
    assert_eq!(p.call_count(), 2);
    assert_eq!(ex.state, "suspended");
    assert!(events(&bus).contains(&"suspend.requested".to_string()));
}

#[tokio::test]
async fn p36_approvals_once_always_and_rejected_with_feedback() {
    let dir = tmp();
    let call = |d: &str| {
        Reply::Tools(vec![(
            "sys_update_config".into(),
            json!({"path": "description", "value": d, "_reason": "keep it current"}),
        )])
    };
    let owner = Owned::new(
        vec![
            Decision::Deny { feedback: Some("not now".into()) },
            Decision::Approve { always: false },
            Decision::Approve { always: true },
        ],
        vec![],
    );
    let replies = vec![
        call("one"),
        Reply::Text("ok".into()),
        call("two"),
        Reply::Text("ok".into()),
        call("three"),
        Reply::Text("ok".into()),
        call("four"),
        Reply::Text("ok".into()),
    ];
    let (mut ex, _, bus) = exec(agent(dir.path(), &[]), replies, owner.clone());
    ex.chat("1").await.unwrap();
    let rows = visible(&ex.store);
    assert_eq!(
        rows[2].content[0]["content"],
        "Tool call \"sys_update_config\" was rejected by authorizer. Feedback: not now"
    );
    assert_eq!(rows[2].content[0]["is_error"], true);
    let tasks = ex.store.task_list(None).unwrap();
    assert_eq!((tasks[0].status.as_str(), tasks[0].error.as_deref()), ("denied", Some("not now")));
    assert!(tasks[0].requires_authorization && tasks[0].executor_managed);
    assert!(tasks[0].origin.as_deref().unwrap().starts_with("hil:sys_update_config:toolu_"));
    assert_eq!(owner.seen.lock().unwrap()[0].justification.as_deref(), Some("keep it current"));
    ex.chat("2").await.unwrap();
    assert_eq!(ex.store.config_value().unwrap()["description"], "two");
    assert_eq!(ex.store.task_list(Some("completed")).unwrap().len(), 1);
    ex.chat("3").await.unwrap();
    assert_eq!(
        ex.store.config_value().unwrap()["tools"][16],
        json!({"name": "sys_update_config", "enabled": true, "visible": true, "restricted": false})
    );
    ex.chat("4").await.unwrap();
    assert_eq!(ex.store.config_value().unwrap()["description"], "four");
    assert_eq!(owner.seen.lock().unwrap().len(), 3, "approve always lifted the gate");
    let ev = events(&bus);
    assert!(ev.contains(&"hil.requested".to_string()) && ev.contains(&"hil.resolved".to_string()));
}

#[tokio::test]
async fn protection_overrides_and_asks() {
    let dir = tmp();
    let mut store = agent(dir.path(), &[]);
    store
        .file_write(
            Caller::Owner,
            "ref.md",
            b"v1",
            &WriteOptions { protection: Some(Protection::ReadOnly), ..Default::default() },
        )
        .unwrap();
    let write = || Reply::Tools(vec![("fs_write".into(), json!({"mode": "write", "path": "ref.md", "content": "v2"}))]);
    let owner = Owned::new(vec![Decision::Deny { feedback: None }, Decision::Approve { always: false }], vec!["blue"]);
    let replies = vec![
        write(),
        Reply::Text("ok".into()),
        write(),
        Reply::Text("ok".into()),
        Reply::Tools(vec![("ask".into(), json!({"question": "favourite colour?"}))]),
        Reply::Text("noted".into()),
    ];
    let (mut ex, _, _) = exec(store, replies, owner.clone());
    ex.chat("1").await.unwrap();
    let rows = visible(&ex.store);
    assert_eq!(
        rows[2].content[0]["content"],
        "Tool call \"fs_write\" was blocked (file_protection: \"ref.md\" is read_only) and the authorizer rejected the override. Do not retry."
    );
    assert_eq!(ex.store.file_read("ref.md").unwrap().1, b"v1");
    assert_eq!(owner.seen.lock().unwrap()[0].reason, "protection");
    ex.chat("2").await.unwrap();
    assert_eq!(ex.store.file_read("ref.md").unwrap().1, b"v2");
    let rows = visible(&ex.store);
    assert!(rows[6].content[0]["content"].as_str().unwrap().ends_with("⚠ protection override"));
    let done = ex.store.task_list(Some("completed")).unwrap();
    assert_eq!(done[0].result.as_deref(), Some("approved"));
    ex.chat("3").await.unwrap();
    let rows = visible(&ex.store);
    assert_eq!(rows[10].content[0]["content"], "Human answered: blue");
    let asks = ex.store.task_list(None).unwrap().into_iter().filter(|t| t.tool == "ask").collect::<Vec<_>>();
    assert_eq!((asks[0].status.as_str(), asks[0].result.as_deref()), ("completed", Some("blue")));
}

#[tokio::test]
async fn oversized_tool_results_are_truncated_for_the_model() {
    let dir = tmp();
    let mut store = agent(
        dir.path(),
        &[("limits.max_tool_result_tokens", json!(100)), ("limits.max_tool_result_preview_chars", json!(200))],
    );
    store.file_write(Caller::Owner, "big.txt", "x".repeat(5000).as_bytes(), &WriteOptions::default()).unwrap();
    let (mut ex, _, _) = exec(
        store,
        vec![Reply::Tools(vec![("fs_read".into(), json!({"path": "big.txt"}))]), Reply::Text("ok".into())],
        Arc::new(Absent),
    );
    ex.chat("read it").await.unwrap();
    let rows = visible(&ex.store);
    let c = rows[2].content[0]["content"].as_str().unwrap();
    assert!(c.starts_with("[TRUNCATED] Tool \"fs_read\" returned ~"), "{}", &c[..80]);
    assert!(c.len() < 1000, "{}", c.len());
    assert!(c.contains("characters omitted"));
}

#[tokio::test]
async fn events_carry_previews_not_whole_payloads() {
    let dir = tmp();
    let big = "y".repeat(50_000);
    let replies = vec![
        Reply::Tools(vec![("fs_write".into(), json!({"mode": "write", "path": "big.txt", "content": big}))]),
        Reply::Text("ok".into()),
    ];
    let (mut ex, _, bus) = exec(agent(dir.path(), &[]), replies, Arc::new(Absent));
    let mut sub = bus.subscribe(None, Filter { agent_id: None, types: vec!["tool.started".into()] });
    ex.chat("write it").await.unwrap();
    let Some(Item::Event(e)) = sub.try_next() else { panic!("no tool.started") };
    assert_eq!(e.event.payload["input"]["_truncated"], true);
    assert!(e.event.payload["input"]["preview"].as_str().unwrap().len() < 5000);
    assert_eq!(ex.store.file_stat("big.txt").unwrap().unwrap().size, 50_000, "the tool itself got everything");
}

/// The loop without its `[Context: …]` audit rows.
fn visible(store: &adf::store::Store) -> Vec<adf::store::loop_rows::LoopRow> {
    store.loop_rows(None).unwrap().into_iter().filter(|r| !adf::runtime::prompt::is_context_row(r)).collect()
}

#[tokio::test]
async fn context_rows_and_dynamic_instructions() {
    let dir = tmp();
    let store = agent(dir.path(), &[("context.compact_threshold", json!(10_000))]);
    let replies = (0..4).map(|_| Reply::Text("ok".into())).collect();
    let (mut ex, p, _) = exec(store, replies, Arc::new(Absent));
    ex.chat("one").await.unwrap();
    ex.chat("two").await.unwrap();
    let ctx = |ex: &Executor, what: &str| {
        ex.store
            .loop_rows(None)
            .unwrap()
            .iter()
            .filter(|r| r.content[0]["text"].as_str().is_some_and(|t| t.starts_with(what)))
            .count()
    };
    assert_eq!(ctx(&ex, "[Context: system_prompt]"), 1, "written once while it does not change");
    let reqs = p.requests();
    assert!(reqs[0].trailing.as_deref().unwrap().starts_with("Context filling up"), "{:?}", reqs[0].trailing);
    assert_eq!(reqs[1].trailing, None, "warning tiers are one-shot");
    assert_eq!(ctx(&ex, "[Context: dynamic_instructions]"), 1);
    ex.store.config_set(Caller::Owner, "instructions", json!("Be brief.")).unwrap();
    ex.chat("three").await.unwrap();
    assert_eq!(ctx(&ex, "[Context: system_prompt]"), 2, "a changed prompt is recorded again");
    assert!(p.requests()[2].system.contains("## Agent-Specific Instructions\n\nBe brief."));
    // The audit rows never reach the model.
    let sent = serde_json::to_string(&*p.requests()[2].messages).unwrap();
    assert!(!sent.contains("[Context: system_prompt]"));
    // Autonomous agents get the idle reminder on every call.
    let dir = tmp();
    let (mut ex, p, _) = exec(
        agent(dir.path(), &[("autonomous", json!(true))]),
        vec![Reply::Tools(vec![("sys_set_state".into(), json!({"state": "idle"}))])],
        Arc::new(Absent),
    );
    ex.chat("go").await.unwrap();
    assert!(p.requests()[0].trailing.as_deref().unwrap().contains("sys_set_state(\"idle\")"));
}

#[tokio::test]
async fn unread_inbox_messages_are_hinted() {
    let dir = tmp();
    let store = agent(dir.path(), &[]);
    let path = store.path().to_path_buf();
    let (mut ex, p, _) = exec(store, vec![Reply::Text("ok".into())], Arc::new(Absent));
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute(
        "INSERT INTO adf_inbox(id, \"from\", content, received_at) VALUES ('m1', 'did:key:z6Mkx', 'hello', 1)",
        [],
    )
    .unwrap();
    drop(c);
    ex.chat("anything new?").await.unwrap();
    assert!(p.requests()[0].trailing.as_deref().unwrap().contains("1 unread message(s)"));
}

/// Every text the model was sent in a request, in order.
fn sent_texts(req: &adf::providers::ModelRequest) -> Vec<String> {
    req.messages.iter().flat_map(|m| m.content.iter().filter_map(|b| b["text"].as_str().map(String::from))).collect()
}

/// Point 37: `loop_inject` rejects any role but `user`, writes the v2 row at
/// once and delivers it at the next model boundary; a key coalesces what is
/// pending; after a restart only the latest keyed entry is queued again.
#[tokio::test]
async fn p37_loop_inject() {
    let dir = tmp();
    let store = agent(dir.path(), &[]);
    let path = store.path().to_path_buf();
    let (mut ex, p, bus) = exec(store, vec![Reply::Text("a".into()), Reply::Text("b".into())], Arc::new(Absent));
    for role in ["assistant", "system", "tool"] {
        let e = ex.loop_inject(&json!({"content": "x", "role": role}), "code").unwrap_err();
        assert_eq!(e.code, "INVALID_INPUT", "{role}");
        assert!(e.message.contains("only supports role: \"user\""), "{e}");
    }
    let before = ex.store.loop_rows(None).unwrap().len();
    let big = "x".repeat(16_000 * 3 + 1);
    assert_eq!(ex.loop_inject(&json!({"content": big}), "code").unwrap_err().code, "INVALID_INPUT");
    assert_eq!(ex.store.loop_rows(None).unwrap().len(), before, "rejected calls write nothing");

    let ok = ex.loop_inject(&json!({"content": "plain note"}), "lambda:lib/w.js").unwrap();
    assert!(ok.starts_with("Queued loop_inject context for the next model boundary"), "{ok}");
    ex.loop_inject(&json!({"content": "20 C", "category": "weather", "key": "oslo"}), "lambda:lib/w.js").unwrap();
    ex.loop_inject(&json!({"content": "21 C", "category": "weather", "key": "oslo"}), "lambda:lib/w.js").unwrap();
    let rows: Vec<String> = ex
        .store
        .loop_rows(None)
        .unwrap()
        .iter()
        .filter_map(|r| r.content[0]["text"].as_str().map(String::from))
        .collect();
    assert!(rows.contains(&"[Context: loop_inject | loop_inject=v2 | origin=lambda:lib/w.js] plain note".to_string()));
    assert!(rows.contains(&"[Context: weather | loop_inject=v2 | origin=lambda:lib/w.js | key=oslo] 20 C".to_string()));
    assert!(rows.contains(&"[Context: weather | loop_inject=v2 | origin=lambda:lib/w.js | key=oslo] 21 C".to_string()));
    assert!(events(&bus).iter().filter(|t| *t == "context.injected").count() >= 3);

    ex.chat("hi").await.unwrap();
    let sent = sent_texts(&p.requests()[0]);
    assert!(sent.iter().any(|t| t.ends_with("] plain note")), "{sent:?}");
    assert!(sent.iter().any(|t| t.ends_with("key=oslo] 21 C")), "{sent:?}");
    assert!(!sent.iter().any(|t| t.ends_with("key=oslo] 20 C")), "a pending key is replaced: {sent:?}");
    ex.store.close().unwrap();

    // Restart: the keyed state comes back once, the one-shot notice does not.
    let store = Store::open(&path).unwrap();
    let (mut ex, p, _) = exec(store, vec![Reply::Text("c".into())], Arc::new(Absent));
    ex.chat("again").await.unwrap();
    let sent = sent_texts(&p.requests()[0]);
    assert_eq!(sent.iter().filter(|t| t.ends_with("key=oslo] 21 C")).count(), 1, "{sent:?}");
    assert!(!sent.iter().any(|t| t.contains("plain note") || t.ends_with("20 C")), "{sent:?}");

    // `code_execution.loop_inject: false` turns it off.
    ex.store.config_set(Caller::Owner, "code_execution.loop_inject", json!(false)).unwrap();
    assert_eq!(ex.loop_inject(&json!({"content": "x"}), "code").unwrap_err().code, "DISABLED");
}
