//! Side loops (issue 18): up to 16 named loops beside `main`, stored where
//! a schema-28 reader does not see them, sharing one seq space; a side loop
//! gets its allowlist ∩ the agent's tools and never a forbidden or
//! restricted one; `loop_send` delivers at the target's next model
//! boundary and can wake it; deleting a loop archives its stream.

mod common;

use std::sync::Arc;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::executor::{Absent, Executor};
use adf::store::loops::{LoopMode, LoopSpec, MAX_SIDE_LOOPS};
use adf::store::{NewAgent, Store};
use common::*;
use serde_json::{Value, json};

fn agent(dir: &std::path::Path) -> Store {
    let path = dir.join("a.adf");
    let (mut s, _) = Store::create(&path, &NewAgent::default()).unwrap();
    let mut cfg = s.config_value().unwrap();
    cfg["tools"] = tools_enabled(&["fs_read", "fs_write", "db_query", "sys_update_config"]);
    // loop_manage is declared by the owner like any other tool.
    cfg["tools"].as_array_mut().unwrap().push(adf::store::defaults::tool_declaration("loop_manage", true, true, false));
    s.config_replace(cfg).unwrap();
    s
}

fn text_of(v: &Value) -> String {
    v.as_array()
        .map(|a| a.iter().filter_map(|b| b["text"].as_str().or(b["content"].as_str())).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}

#[test]
fn loops_are_stored_beside_main_in_one_seq_space_and_archived_on_delete() {
    let dir = tmp();
    let mut s = agent(dir.path());
    assert!(s.loops_list().unwrap().is_empty(), "a file without side loops has none (and no tables for them)");
    let tables = |s: &Store| -> i64 {
        let raw = rusqlite::Connection::open(s.path()).unwrap();
        raw.query_row("SELECT count(*) FROM sqlite_master WHERE name LIKE 'adfrs_loop%'", [], |r| r.get(0)).unwrap()
    };
    assert_eq!(tables(&s), 0);

    let d = s.loop_create("research", &LoopSpec { goal: Some("find things".into()), ..Default::default() }).unwrap();
    assert_eq!((d.mode, d.status.as_str(), d.next_run_at), (LoopMode::Reactive, "idle", None));
    assert!(s.loop_create("research", &LoopSpec::default()).unwrap_err().to_string().contains("already exists"));
    assert!(s.loop_create("main", &LoopSpec::default()).is_err());
    assert!(s.loop_create("Bad Name", &LoopSpec::default()).is_err());
    let bad = LoopSpec { mode: Some(LoopMode::Scheduled), ..Default::default() };
    assert!(s.loop_create("sched", &bad).unwrap_err().to_string().contains("needs a schedule"));
    let every = LoopSpec { mode: Some(LoopMode::Scheduled), schedule: Some("every 30m".into()), ..Default::default() };
    let d = s.loop_create("sched", &every).unwrap();
    assert!(d.next_run_at.unwrap() > adf::store::now_ms() + 29 * 60_000);
    for i in 2..MAX_SIDE_LOOPS {
        s.loop_create(&format!("l{i}"), &LoopSpec::default()).unwrap();
    }
    let err = s.loop_create("one-too-many", &LoopSpec::default()).unwrap_err().to_string();
    assert!(err.contains("at most 16"), "{err}");

    // One seq space: main and side rows interleave and never collide.
    let row = json!([{"type": "text", "text": "x"}]);
    fn new(c: &Value) -> adf::store::loop_rows::NewLoopRow<'_> {
        adf::store::loop_rows::NewLoopRow { role: "user", content: c, model: None, tokens: None, ord: None }
    }
    let m1 = s.loop_append(&new(&row)).unwrap();
    let s1 = s.side_append_row("research", &new(&row)).unwrap().seq;
    let m2 = s.loop_append(&new(&row)).unwrap();
    let s2 = s.side_append_row("research", &new(&row)).unwrap().seq;
    assert!(m1 < s1 && s1 < m2 && m2 < s2, "{m1} {s1} {m2} {s2}");
    // Deleting the newest main row does not free its seq for anyone.
    let last = s.loop_rows(None).unwrap().pop().unwrap();
    s.loop_replace(&[last], false, None).unwrap();
    let s3 = s.side_append_row("research", &new(&row)).unwrap().seq;
    let m3 = s.loop_append(&new(&row)).unwrap();
    assert!(s3 > s2 && m3 > s3);

    // A schema-28 reader (the reference) sees exactly main in adf_loop.
    let path = s.path().to_path_buf();
    s.close().unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    let seqs: Vec<i64> = raw
        .prepare("SELECT seq FROM adf_loop")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(seqs, vec![m1, m3]);
    drop(raw);

    // Deleting a loop archives its stream under loop:<name>.
    let mut s = Store::open(&path).unwrap();
    assert_eq!(s.loop_delete("research").unwrap(), 3);
    assert!(s.loop_get("research").unwrap().is_none());
    assert!(s.side_rows("research").unwrap().is_empty());
    let raw = rusqlite::Connection::open(&path).unwrap();
    let a: (i64, i64, i64) = raw
        .query_row("SELECT start_seq, end_seq, entry_count FROM adf_audit WHERE source = 'loop:research'", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!(a, (s1, s3, 3));
    drop(raw);
    assert!(s.loop_delete("research").is_err());
    s.close().unwrap();
}

#[tokio::test]
async fn a_side_loop_has_its_goal_its_tools_and_mail_at_the_boundary() {
    let dir = tmp();
    let mut s = agent(dir.path());
    s.loop_create(
        "research",
        &LoopSpec {
            goal: Some("Look things up.".into()),
            tools: Some(vec!["fs_read".into(), "sys_update_config".into(), "loop_send".into(), "fs_delete".into()]),
            model: Some("side-model".into()),
            ..Default::default()
        },
    )
    .unwrap();
    let provider = Arc::new(Scripted::new([
        // main: hand work to the side loop and wake it.
        Reply::Tools(vec![(
            "loop_send".into(),
            json!({"loop": "research", "message": "find the answer", "wake": true}),
        )]),
        Reply::Text("asked".into()),
        // research: tries a forbidden tool, then reports back to main.
        Reply::Tools(vec![
            ("sys_update_config".into(), json!({"path": "description", "value": "pwned"})),
            ("loop_send".into(), json!({"loop": "main", "message": "the answer is 42"})),
        ]),
        Reply::Text("done".into()),
        // main again.
        Reply::Text("thanks".into()),
    ]));
    let mut ex = Executor::new(s, provider.clone(), Bus::new(), Arc::new(Absent)).unwrap();
    ex.chat("research something").await.unwrap();
    assert_eq!(ex.take_loop_wakes(), vec!["research".to_string()]);

    ex.side_turn("research", None, "loop").await.unwrap();
    let reqs = provider.requests();
    let side = &reqs[2];
    assert_eq!(side.model, "side-model");
    assert!(side.system.contains("# Side loop: research") && side.system.contains("Look things up."));
    let mut names: Vec<&str> = side.tools.iter().map(|t| t.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["fs_read", "loop_send"], "allowlist ∩ enabled, never a forbidden tool");
    let last = side.messages.last().unwrap();
    assert!(text_of(&Value::Array(last.content.clone())).contains("[Message from loop main]\nfind the answer"));
    // The forbidden call was refused; the config is as it was.
    let rows = ex.store.side_rows("research").unwrap();
    let results: Vec<&Value> =
        rows.iter().flat_map(|r| r.content.as_array().unwrap()).filter(|b| b["type"] == "tool_result").collect();
    assert_eq!(results[0]["is_error"], json!(true));
    assert!(results[0]["content"].as_str().unwrap().contains("not enabled"));
    assert_ne!(ex.store.config_value().unwrap()["description"], json!("pwned"));
    // Main's loop has only main's rows; its checkpoint is main's turn.
    assert!(ex.store.loop_rows(None).unwrap().iter().all(|r| !text_of(&r.content).contains("find the answer")));
    assert_eq!(ex.state, "idle");

    // Main reads research's report at its next boundary.
    ex.chat("and?").await.unwrap();
    let main_req = provider.requests().pop().unwrap();
    let all: String = main_req.messages.iter().map(|m| text_of(&Value::Array(m.content.clone()))).collect();
    assert!(all.contains("[Message from loop research]\nthe answer is 42"), "{all}");
    let names: Vec<&str> = main_req.tools.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"loop_send") && names.contains(&"loop_list") && names.contains(&"loop_manage"));
    assert_eq!(ex.store.loop_mail_waiting("main").unwrap(), 0);
}

#[tokio::test]
async fn loop_manage_is_main_only_and_templates_fill_a_loop() {
    let dir = tmp();
    let s = agent(dir.path());
    let provider = Arc::new(Scripted::new([
        Reply::Tools(vec![
            ("loop_manage".into(), json!({"action": "create", "name": "mem", "template": "memory"})),
            (
                "loop_manage".into(),
                json!({"action": "create", "name": "crit", "template": "critic", "goal": "Be harsh."}),
            ),
            ("loop_list".into(), json!({})),
        ]),
        Reply::Text("made".into()),
        // crit (a side loop) tries to make a loop: refused.
        Reply::Tools(vec![("loop_manage".into(), json!({"action": "create", "name": "x"}))]),
        Reply::Text("ok".into()),
    ]));
    let mut ex = Executor::new(s, provider.clone(), Bus::new(), Arc::new(Absent)).unwrap();
    ex.chat("make loops").await.unwrap();
    let mem = ex.store.loop_get("mem").unwrap().unwrap();
    assert_eq!(
        (mem.mode, mem.schedule.as_deref(), mem.template.as_deref()),
        (LoopMode::Scheduled, Some("0 * * * *"), Some("memory"))
    );
    assert!(mem.next_run_at.is_some());
    let crit = ex.store.loop_get("crit").unwrap().unwrap();
    assert_eq!(crit.goal, "Be harsh.");
    let results = tool_results(&ex.store);
    assert!(results[2].0.contains("\"crit\"") && results[2].0.contains("\"main\""), "{:?}", results[2]);

    ex.side_turn("crit", Some("review this"), "chat").await.unwrap();
    let side = provider.requests()[2].clone();
    assert!(!side.tools.iter().any(|t| t.name == "loop_manage"), "never advertised to a side loop");
    let rows = ex.store.side_rows("crit").unwrap();
    let refused =
        rows.iter().flat_map(|r| r.content.as_array().unwrap().clone()).find(|b| b["type"] == "tool_result").unwrap();
    assert_eq!(refused["is_error"], json!(true));
    assert!(ex.store.loop_get("x").unwrap().is_none());
    // Due loops: the scheduled one, once its time has come.
    assert!(ex.due_loops(adf::store::now_ms()).is_empty());
    let due = ex.due_loops(mem.next_run_at.unwrap() + 1);
    assert_eq!(due, vec!["mem".to_string()]);
    assert!(ex.store.loop_get("mem").unwrap().unwrap().next_run_at.unwrap() > mem.next_run_at.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_makes_lists_talks_to_and_removes_a_side_loop() {
    use common::fake_provider::{FakeProvider, Scripted as Wire, anthropic_text};
    let dir = tmp();
    let d = dir.path();
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "test-model"], None));
    let out = ok(&adf(
        d,
        &["loops", "new", "a.adf", "research", "--goal", "Dig up facts.", "--tools", "fs_read,loop_send"],
        None,
    ));
    assert!(out.contains("created loop research"), "{out}");
    fails(&adf(d, &["loops", "new", "a.adf", "research"], None), &["already exists"]);
    fails(&adf(d, &["loops", "new", "a.adf", "x", "--template", "nope"], None), &["no loop template", "memory"]);
    fails(&adf(d, &["loops", "new", "a.adf", "y", "--mode", "sideways"], None), &["mode", "reactive"]);
    ok(&adf(d, &["loops", "new", "a.adf", "mem", "--template", "memory"], None));
    let ls = json(&adf(d, &["loops", "ls", "a.adf", "--json"], None));
    let names: Vec<&str> = ls["loops"].as_array().unwrap().iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["main", "mem", "research"]);
    assert_eq!(ls["loops"][1]["mode"], "scheduled");
    assert_eq!(ls["loops"][2]["tools"], json!(["fs_read", "loop_send"]));

    // A message to the side loop runs a turn there, not in main.
    let fake = FakeProvider::start(vec![Wire::sse(anthropic_text(&["Found ", "it."], 10, 3))]).await;
    let (dd, base) = (d.to_path_buf(), fake.base_url.clone());
    let out = tokio::task::spawn_blocking(move || {
        adf_with_providers(&dd, &base, &["chat", "a.adf", "what is up?", "--loop", "research"])
    })
    .await
    .unwrap();
    assert_eq!(ok(&out).trim(), "Found it.");
    let (_, body) = &fake.requests()[0];
    let system = body["system"].to_string();
    assert!(system.contains("Side loop: research") && system.contains("Dig up facts."), "{system}");
    let tools: Vec<&str> = body["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(tools, ["fs_read", "loop_send"]);
    let shown = ok(&adf(d, &["loops", "show", "a.adf", "research"], None));
    assert!(shown.contains("user: what is up?") && shown.contains("assistant: Found it."), "{shown}");
    let c = rusqlite::Connection::open(d.join("a.adf")).unwrap();
    let main_rows: i64 = c.query_row("SELECT count(*) FROM adf_loop", [], |r| r.get(0)).unwrap();
    assert_eq!(main_rows, 0, "main's loop is untouched");
    drop(c);

    fails(&adf(d, &["chat", "a.adf", "hi", "--loop", "nope"], None), &["no loop named \"nope\"", "adf loops ls"]);
    ok(&adf(d, &["loops", "pause", "a.adf", "research"], None));
    fails(&adf(d, &["chat", "a.adf", "hi", "--loop", "research"], None), &["paused"]);
    ok(&adf(d, &["loops", "resume", "a.adf", "research"], None));
    let out = ok(&adf(d, &["loops", "rm", "a.adf", "research"], None));
    // The question, the answer and the system prompt it saw ([Context: …]).
    assert!(out.contains("3 rows archived"), "{out}");
    fails(&adf(d, &["loops", "rm", "a.adf", "research"], None), &["no loop named"]);
    let t = ok(&adf(d, &["loops", "templates"], None));
    assert!(t.contains("researcher") && t.contains("reflector"));
}

fn visible_text(rows: &[adf::store::loop_rows::LoopRow]) -> String {
    rows.iter().map(|r| text_of(&r.content)).collect::<Vec<_>>().join("\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_actor_runs_woken_scheduled_and_continuous_loops() {
    use adf::runtime::agent::{AgentCommand, spawn_with_tick, waiting_owner};
    use std::time::Duration;
    let dir = tmp();
    let mut s = agent(dir.path());
    s.loop_create("research", &LoopSpec { tools: Some(vec!["loop_send".into()]), ..Default::default() }).unwrap();
    let every = LoopSpec { mode: Some(LoopMode::Scheduled), schedule: Some("every 1h".into()), ..Default::default() };
    s.loop_create("sched", &every).unwrap();
    // Due now: the first tick runs it.
    s.loop_set_status("sched", "idle", Some(adf::store::now_ms() - 1)).unwrap();
    s.loop_create("worker", &LoopSpec { mode: Some(LoopMode::Continuous), ..Default::default() }).unwrap();
    let provider = Arc::new(
        Scripted::new([
            // The scheduled loop, on the first tick.
            Reply::Text("scheduled work done".into()),
            // main, on the owner's chat: wake research.
            Reply::Tools(vec![("loop_send".into(), json!({"loop": "research", "message": "dig", "wake": true}))]),
            Reply::Text("sent".into()),
            // research, woken: report back and wake main.
            Reply::Tools(vec![("loop_send".into(), json!({"loop": "main", "message": "dug", "wake": true}))]),
            Reply::Text("done".into()),
            // main, woken by the report.
            Reply::Text("got it".into()),
        ])
        .with_fallback(|_| Reply::Text("working".into())),
    );
    let owner = waiting_owner();
    let ex = Executor::new(s, provider.clone(), Bus::new(), owner.clone()).unwrap();
    let (h, task) = spawn_with_tick(ex, owner, Duration::from_millis(30));
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.send(AgentCommand::Chat("go".into()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    h.send(AgentCommand::LoopChat { name: "worker".into(), text: "start".into(), turn_id: None });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(h);
    let ex = task.await.unwrap();

    let sched = visible_text(&ex.store.side_rows("sched").unwrap());
    assert!(sched.contains("[Scheduled run]") && sched.contains("scheduled work done"), "{sched}");
    let next = ex.store.loop_get("sched").unwrap().unwrap().next_run_at.unwrap();
    assert!(next > adf::store::now_ms() + 3_500_000, "the next run is an hour on");
    let research = visible_text(&ex.store.side_rows("research").unwrap());
    assert!(research.contains("[Message from loop main]\ndig") && research.contains("done"), "{research}");
    let main = visible_text(&ex.store.loop_rows(None).unwrap());
    assert!(main.contains("[Message from loop research]\ndug") && main.contains("got it"), "{main}");
    // Continuous: turns again after each completed turn, up to its limit.
    let worker = ex.store.side_rows("worker").unwrap();
    let turns = worker.iter().filter(|r| r.role == "assistant").count() as u32;
    assert_eq!(turns, adf::store::loops::DEFAULT_MAX_TURNS, "{}", visible_text(&worker));
    assert_eq!(ex.state, "idle");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_continuous_loop_stops_at_its_own_turn_limit_or_its_budget() {
    use adf::runtime::agent::{AgentCommand, spawn_with_tick, waiting_owner};
    use std::time::Duration;
    let dir = tmp();
    let mut s = agent(dir.path());
    let mut cfg = s.config_value().unwrap();
    cfg["model"]["max_tokens"] = json!(100);
    s.config_replace(cfg).unwrap();
    let continuous =
        |max_turns, budget| LoopSpec { mode: Some(LoopMode::Continuous), max_turns, budget, ..Default::default() };
    s.loop_create("capped", &continuous(Some(3), None)).unwrap();
    // A turn limit far off: the budget is what stops it.
    s.loop_create("spender", &continuous(Some(1000), Some(json!({"tokens_total": 6000})))).unwrap();
    for bad in [1001, u32::MAX] {
        let e = s.loop_create("over", &continuous(Some(bad), None)).unwrap_err().to_string();
        assert!(e.contains("1 to 1000"), "{e}");
    }
    assert!(s.loop_get("over").unwrap().is_none(), "nothing half-created");
    let provider = Arc::new(Scripted::new([]).with_fallback(|_| Reply::Text("working".into())));
    let owner = waiting_owner();
    let ex = Executor::new(s, provider.clone(), Bus::new(), owner.clone()).unwrap();
    let (h, task) = spawn_with_tick(ex, owner, Duration::from_millis(30));
    for name in ["capped", "spender"] {
        h.send(AgentCommand::LoopChat { name: name.into(), text: "start".into(), turn_id: None });
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    drop(h);
    let ex = task.await.unwrap();
    let turns = |name: &str| ex.store.side_rows(name).unwrap().iter().filter(|r| r.role == "assistant").count();
    assert_eq!(turns("capped"), 3, "{}", visible_text(&ex.store.side_rows("capped").unwrap()));
    let spent = turns("spender");
    assert!((2..1000).contains(&spent), "the budget stopped it after {spent} turns");
    let d = ex.store.loop_get("spender").unwrap().unwrap();
    assert_eq!(d.status, "paused", "paused at its budget until the owner raises it");
    assert!(visible_text(&ex.store.side_rows("spender").unwrap()).contains("budget.tokens_total of 6000 reached"));
    assert_eq!(ex.store.loop_get("capped").unwrap().unwrap().status, "idle");
    assert_eq!(adf::store::loops::to_json(&d)["turn_limit"], 1000);
}

#[test]
fn adf_loops_set_changes_a_loop_and_refuses_a_bad_turn_limit() {
    let dir = tmp();
    let d = dir.path();
    ok(&adf(d, &["new", "a.adf"], None));
    ok(&adf(d, &["loops", "new", "a.adf", "worker", "--mode", "continuous", "--max-turns", "5"], None));
    let ls = json(&adf(d, &["loops", "ls", "a.adf", "--json"], None));
    let worker = ls["loops"].as_array().unwrap().iter().find(|l| l["name"] == "worker").unwrap().clone();
    assert_eq!((worker["max_turns"].clone(), worker["turn_limit"].clone()), (json!(5), json!(5)));
    assert!(ok(&adf(d, &["loops", "ls", "a.adf"], None)).contains("continuous (5 turns)"));
    let before = std::fs::read(d.join("a.adf")).unwrap();
    fails(&adf(d, &["loops", "set", "a.adf", "worker", "--max-turns", "5000"], None), &["max_turns 5000", "1 to 1000"]);
    fails(&adf(d, &["loops", "set", "a.adf", "worker"], None), &["nothing to change"]);
    fails(&adf(d, &["loops", "set", "a.adf", "nope", "--max-turns", "3"], None), &["no loop named \"nope\""]);
    assert_eq!(std::fs::read(d.join("a.adf")).unwrap(), before, "refusals changed nothing");
    let set =
        json(&adf(d, &["loops", "set", "a.adf", "worker", "--max-turns", "0", "--goal", "keep going", "--json"], None));
    assert_eq!(
        (set["max_turns"].clone(), set["turn_limit"].clone(), set["goal"].clone()),
        (Value::Null, json!(20), json!("keep going"))
    );
}

#[test]
fn the_memory_log_takes_appends_and_refuses_rewrites() {
    use adf::store::Caller;
    use adf::store::files::WriteOptions;
    let dir = tmp();
    let mut s = agent(dir.path());
    let w = WriteOptions::default();
    // A new agent's log has its header; the agent only adds to it.
    let header = s.file_read_text("mind/log.md").unwrap();
    s.file_append(Caller::AGENT, "mind/log.md", "- 09:00 learned A [S1]\n", None).unwrap();
    s.file_append(Caller::AGENT, "mind/log.md", "- 10:00 learned B [S2]\n", None).unwrap();
    // A whole write that keeps every old byte is an append too.
    let kept = format!("{header}- 09:00 learned A [S1]\n- 10:00 learned B [S2]\n- 11:00 C\n");
    s.file_write(Caller::AGENT, "mind/log.md", kept.as_bytes(), &w).unwrap();
    let before = s.file_read_text("mind/log.md").unwrap();
    assert_eq!(before, kept);
    let rewritten = format!("{header}- 09:00 learned A [S1]\n- 10:00 forgot B\n- 11:00 C\n- 12:00 D\n");
    for bad in [&b"- 09:00 learned X [S1]\n"[..], b"", rewritten.as_bytes()] {
        let e = s.file_write(Caller::AGENT, "mind/log.md", bad, &w).unwrap_err().to_string();
        assert!(e.contains("append-only"), "{e}");
    }
    assert!(s.file_delete(Caller::AGENT, "mind/log.md").unwrap_err().to_string().contains("append-only"));
    assert!(s.file_rename(Caller::AGENT, "mind/log.md", "mind/old.md").is_err());
    assert!(s.file_rename(Caller::AGENT, "mind", "memory").is_err(), "moving its folder moves the log too");
    assert_eq!(s.file_read_text("mind/log.md").unwrap(), before, "refusals changed nothing");
    // Other pages are ordinary files; the owner may rewrite the log.
    s.file_write(Caller::AGENT, "mind/topic.md", b"v1", &w).unwrap();
    s.file_write(Caller::AGENT, "mind/topic.md", b"v2", &w).unwrap();
    s.file_write(Caller::Owner, "mind/log.md", b"- tidied by the owner\n", &w).unwrap();
}

#[tokio::test]
async fn citations_resolve_live_and_after_compaction_from_the_archive() {
    let dir = tmp();
    let mut s = agent(dir.path());
    let mut cfg = s.config_value().unwrap();
    cfg["context"]["audit"]["loop"] = json!(true);
    s.config_replace(cfg).unwrap();
    let provider = Arc::new(Scripted::new([
        Reply::Text("The capital is Paris.".into()),
        Reply::Tools(vec![("loop_compact".into(), json!({}))]),
        Reply::Text("(summary)".into()),
        Reply::Text("compacted".into()),
        Reply::Tools(vec![("memory_cite".into(), json!({"citation": "[S2]"}))]),
        Reply::Text("cited".into()),
    ]));
    let mut cfg = s.config_value().unwrap();
    for t in cfg["tools"].as_array_mut().unwrap() {
        if t["name"] == "loop_compact" {
            t["enabled"] = json!(true);
        }
    }
    s.config_replace(cfg).unwrap();
    let mut ex = Executor::new(s, provider, Bus::new(), Arc::new(Absent)).unwrap();
    ex.chat("what is the capital of France?").await.unwrap();
    let answer = ex.store.loop_rows(None).unwrap().into_iter().find(|r| text_of(&r.content).contains("Paris")).unwrap();
    let live = ex.store.cite(answer.seq).unwrap();
    assert_eq!((live.found_in.as_str(), live.loop_name.as_str()), ("live", "main"));
    ex.chat("compact now").await.unwrap();
    assert!(ex.store.loop_rows(None).unwrap().iter().all(|r| r.seq != answer.seq), "compacted away");
    let archived = ex.store.cite(answer.seq).unwrap();
    assert_eq!(archived.found_in, "audit");
    assert_eq!(archived.row, answer, "the very row, from the archive");
    assert!(ex.store.cite(999_999).unwrap_err().to_string().contains("resolves to nothing"));
    // The model's tool and the CLI resolve the same way.
    let path = ex.store.path().to_path_buf();
    ex.chat("cite S2").await.unwrap();
    let results = tool_results(&ex.store);
    let last = results.last().unwrap();
    assert!(!last.1, "{last:?}");
    ex.store_into().close().unwrap();
    let cli = json(&adf(dir.path(), &["cite", path.to_str().unwrap(), &format!("S{}", answer.seq), "--json"], None));
    assert_eq!(cli["found_in"], "audit");
    assert_eq!(cli["row"]["content"][0]["text"], "The capital is Paris.");
    fails(&adf(dir.path(), &["cite", path.to_str().unwrap(), "X1"], None), &["not a citation"]);
}
