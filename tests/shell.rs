//! `adf_shell` through scripted model turns on real agent files: each
//! command family, the gate's exit codes (conformance 60: 126 disabled,
//! 130 refused, 124 timeout, 1 parse error), output caps for the model and
//! full output for code, and every tool of the default config answering
//! (working, or saying why not here), never `Unknown tool`.

mod common;

use std::sync::{Arc, Mutex};

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::executor::{ApprovalRequest, Decision, Executor, Owner};
use adf::store::files::WriteOptions;
use adf::store::{Caller, NewAgent, Store};
use common::tool_results;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};

fn agent(dir: &std::path::Path, cfg: &[(&str, Value)]) -> Store {
    let (mut s, _) = Store::create(
        dir.join("a.adf"),
        &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    s.config_set(Caller::Owner, "tools", tools_with(&[("adf_shell", true, false)])).unwrap();
    for (k, v) in cfg {
        s.config_set(Caller::Owner, k, v.clone()).unwrap();
    }
    s
}

/// The default tools with some changed: (name, enabled, restricted).
fn tools_with(changes: &[(&str, bool, bool)]) -> Value {
    let mut t = adf::store::defaults::default_tools();
    for (name, enabled, restricted) in changes {
        let arr = t.as_array_mut().unwrap();
        match arr.iter_mut().find(|d| d["name"] == *name) {
            Some(d) => {
                d["enabled"] = json!(enabled);
                d["visible"] = json!(true);
                d["restricted"] = json!(restricted);
            }
            None => arr.push(json!({"name": name, "enabled": enabled, "visible": true, "restricted": restricted})),
        }
    }
    t
}

fn file(s: &mut Store, path: &str, text: &str) {
    s.file_write(Caller::Owner, path, text.as_bytes(), &WriteOptions::default()).unwrap();
}

/// An owner who answers approvals with a fixed decision and counts them.
struct Answers {
    approve: bool,
    asked: Mutex<Vec<String>>,
}

impl Owner for Answers {
    fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, Decision> {
        self.asked.lock().unwrap().push(req.tool.clone());
        let d = if self.approve { Decision::Approve { always: false } } else { Decision::Deny { feedback: None } };
        Box::pin(async move { d })
    }
    fn answer<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async { None })
    }
}

/// Run shell commands as one model step; each result parsed.
async fn shell_with(store: Store, owner: Arc<dyn Owner>, commands: &[&str]) -> (Vec<Value>, Executor) {
    let calls = commands.iter().map(|c| ("adf_shell".to_string(), json!({"command": c}))).collect();
    let provider = Arc::new(Scripted::new(vec![Reply::Tools(calls), Reply::Text("done".into())]));
    let mut ex = Executor::new(store, provider, Bus::new(), owner).unwrap();
    ex.chat("go").await.unwrap();
    let results = tool_results(&ex.store)
        .into_iter()
        .map(|(t, err)| {
            assert!(!err, "adf_shell is never an error result: {t}");
            serde_json::from_str::<Value>(&t).unwrap_or_else(|_| panic!("JSON result: {t}"))
        })
        .collect();
    (results, ex)
}

async fn shell(store: Store, commands: &[&str]) -> (Vec<Value>, Executor) {
    shell_with(store, Arc::new(Answers { approve: true, asked: Mutex::new(Vec::new()) }), commands).await
}

fn out(v: &Value) -> (i64, &str, &str) {
    (v["exit_code"].as_i64().unwrap(), v["stdout"].as_str().unwrap(), v["stderr"].as_str().unwrap())
}

#[tokio::test]
async fn files_and_text_family() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path(), &[]);
    file(&mut s, "notes.md", "# notes\ntodo: one\ndone: two\ntodo: three\n");
    file(&mut s, "data/b.csv", "name,n\nb,2\na,1\n");
    let (r, ex) = shell(
        s,
        &[
            "cat notes.md | grep todo | wc -l",
            "grep -n three notes.md && echo found || echo missing",
            "sed -n '2,3p' notes.md | sort -r",
            "tail -n +2 data/b.csv | sort -t , -k 2 -n | cut -d , -f 1 | tr a-z A-Z",
            "cat <<EOF > made.txt\nhello $AGENT_NAME\nEOF\ncat made.txt",
            "cp made.txt copy.txt && mv copy.txt moved.txt && ls | grep -c txt",
            "echo extra >> moved.txt; diff made.txt moved.txt; echo \"exit $?\"",
            "ls *.md data/*",
            "X=$(grep -c todo notes.md); echo \"count=$X\" | tee count.txt > /dev/null; cat count.txt",
            "sed -i 's/todo/TODO/g' notes.md && grep -c TODO notes.md",
            "touch empty.txt && du -s . | cut -f 2 && find -name '*.txt' | sort",
            "rm nope.txt; echo $?",
        ],
    )
    .await;
    assert_eq!(out(&r[0]), (0, "2\n", ""));
    assert_eq!(out(&r[1]).1, "4:todo: three\nfound\n");
    assert_eq!(out(&r[2]).1, "todo: one\ndone: two\n");
    assert_eq!(out(&r[3]).1, "A\nB\n");
    assert!(out(&r[4]).1.starts_with("hello "), "{:?}", r[4]);
    assert_eq!(out(&r[5]).1, "2\n");
    let (_, diff, _) = out(&r[6]);
    assert!(diff.contains("+extra") && diff.ends_with("exit 1\n"), "{diff}");
    assert_eq!(out(&r[7]).1, "README.md\nmind.md\nnotes.md\nsoul.md\ndata/b.csv\n", "globs match the agent's files");
    assert_eq!(out(&r[8]).1, "count=2\n");
    assert_eq!(out(&r[9]).1, "2\n");
    let (_, found, _) = out(&r[10]);
    assert!(found.contains("empty.txt\n") && found.contains("made.txt\n"), "{found}");
    // rm needs fs_delete, which the default config disables.
    assert_eq!(out(&r[11]).0, 126, "{:?}", r[11]);
    assert_eq!(ex.store.file_read_text("made.txt").unwrap().lines().count(), 1);
    assert!(ex.store.file_read_text("notes.md").unwrap().contains("TODO: one"));
}

#[tokio::test]
async fn p60_gate_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path(), &[("limits", json!({"execution_timeout_ms": 1500}))]);
    s.config_set(
        Caller::Owner,
        "tools",
        tools_with(&[("adf_shell", true, false), ("fs_write", true, true), ("db_execute", false, false)]),
    )
    .unwrap();
    file(&mut s, "a.txt", "a\n");
    let owner = Arc::new(Answers { approve: false, asked: Mutex::new(Vec::new()) });
    let (r, ex) = shell_with(
        s,
        owner.clone(),
        &[
            "rm a.txt",                           // fs_delete disabled → 126
            "echo x > b.txt; echo after",         // fs_write restricted, refused → 130, stops
            "sleep 5",                            // 124
            "echo 'open",                         // 1, parse error
            "if true; then echo; fi",             // 1, named refusal
            "sqlite3 'CREATE TABLE local_t (x)'", // db_execute disabled → 126
            "sqlite3 -json 'SELECT 1 AS one'",    // a read runs
        ],
    )
    .await;
    let (code, _, err) = out(&r[0]);
    assert_eq!(code, 126);
    assert!(err.contains("fs_delete is disabled"), "{err}");
    let (code, stdout, err) = out(&r[1]);
    assert_eq!((code, stdout), (130, ""), "a refused tool stops the invocation: {err}");
    assert!(err.contains("rejected"), "{err}");
    assert_eq!(owner.asked.lock().unwrap().as_slice(), ["fs_write"], "asked once, for the restricted tool");
    let (code, _, err) = out(&r[2]);
    assert_eq!(code, 124);
    assert!(err.contains("timed out after 1s"), "{err}");
    let (code, _, err) = out(&r[3]);
    assert_eq!(code, 1);
    assert!(err.starts_with("parse error:"), "{err}");
    let (code, _, err) = out(&r[4]);
    assert_eq!(code, 1);
    assert!(err.contains("`if`"), "{err}");
    assert_eq!(out(&r[5]).0, 126, "{:?}", r[5]);
    assert_eq!(out(&r[6]), (0, "[{\"one\":1}]\n", ""));
    assert!(ex.store.file_stat("b.txt").unwrap().is_none(), "nothing written after a refusal");
    assert!(ex.store.file_stat("a.txt").unwrap().is_some());
}

#[tokio::test]
async fn p60_restricted_tool_approved_runs() {
    let dir = tempfile::tempdir().unwrap();
    let s = agent(dir.path(), &[]);
    let mut s = s;
    s.config_set(Caller::Owner, "tools", tools_with(&[("adf_shell", true, false), ("fs_write", true, true)])).unwrap();
    let owner = Arc::new(Answers { approve: true, asked: Mutex::new(Vec::new()) });
    let (r, ex) = shell_with(s, owner.clone(), &["echo one > a.txt && echo two >> a.txt && cat a.txt"]).await;
    assert_eq!(out(&r[0]), (0, "one\ntwo\n", ""));
    assert_eq!(owner.asked.lock().unwrap().len(), 1, "one approval covers the invocation");
    let tasks = ex.store.task_list(None).unwrap();
    assert!(tasks.iter().any(|t| t.tool == "fs_write" && t.status == "completed"), "{tasks:?}");
}

#[tokio::test]
async fn data_family_jq_and_sqlite3() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path(), &[]);
    s.config_set(Caller::Owner, "tools", tools_with(&[("adf_shell", true, false), ("db_execute", true, false)]))
        .unwrap();
    file(&mut s, "people.json", r#"[{"name":"ada","age":36},{"name":"bob","age":20}]"#);
    let (r, _) = shell(s, &[
        "jq -r '.[] | select(.age > 30) | .name' people.json",
        "cat people.json | jq -c 'map(.age) | add'",
        "sqlite3 'CREATE TABLE local_t (k TEXT, v INTEGER)' && sqlite3 \"INSERT INTO local_t VALUES ('a', 1), ('b', 2)\"",
        "sqlite3 -header 'SELECT k, v FROM local_t ORDER BY v'",
        "echo 'SELECT count(*) AS n FROM local_t' | sqlite3 -json",
        "sqlite3 'SELECT * FROM adf_identity'",
        "sqlite3 .tables",
        "jq '.[' people.json",
    ])
    .await;
    assert_eq!(out(&r[0]), (0, "ada\n", ""));
    assert_eq!(out(&r[1]).1, "56\n");
    assert_eq!(out(&r[2]).0, 0, "{:?}", r[2]);
    assert_eq!(out(&r[3]).1, "k|v\na|1\nb|2\n");
    assert_eq!(out(&r[4]).1, "[{\"n\":2}]\n");
    let (code, _, err) = out(&r[5]);
    assert_eq!(code, 1, "the SQL guard refuses secrets: {err}");
    assert_eq!(out(&r[6]).1, "local_t\n");
    assert_eq!(out(&r[7]).0, 3);
}

#[tokio::test]
async fn agent_family_timers_state_code_and_tools() {
    let dir = tempfile::tempdir().unwrap();
    let s = agent(dir.path(), &[]);
    let (r, ex) = shell(
        s,
        &[
            "at +5m 'check the oven'",
            "echo '*/5 * * * * tidy up' | crontab > /dev/null && crontab -l | wc -l",
            "whoami | head -1",
            "node -e '6 * 7'",
            "adf fs_list '{}' | jq length",
            "adf no_such_tool '{}'",
            "curl -s http://127.0.0.1:9/x",
            "meta set mood calm && meta get mood",
            "config get model.model_id",
            "ps | head -1; date -d @0 +%Y",
            "help | grep -c '^'",
            "state idle",
        ],
    )
    .await;
    assert!(out(&r[0]).1.starts_with("timer 1 at "), "{:?}", r[0]);
    assert_eq!(out(&r[1]).1.trim(), "2", "{:?}", r[1]);
    assert_eq!(out(&r[2]).0, 0);
    assert!(out(&r[3]).1.contains("42"), "{:?}", r[3]);
    assert_eq!(out(&r[4]).0, 0, "{:?}", r[4]);
    assert_eq!(out(&r[5]).0, 127);
    let (code, _, err) = out(&r[6]);
    assert_eq!(code, 7, "the egress guard blocks loopback: {err}");
    assert!(err.to_lowercase().contains("block"), "{err}");
    assert!(out(&r[7]).1.contains("calm"), "{:?}", r[7]);
    assert_eq!(out(&r[8]).1, "m\n");
    assert_eq!(out(&r[9]).1, "ID\tSTATUS\tTOOL\tSTARTED\n1970\n");
    assert!(out(&r[10]).1.trim().parse::<usize>().unwrap() > 40);
    assert_eq!(r[11]["target_state"], "idle");
    assert_eq!(ex.state, "idle", "state idle ends the turn in idle");
    assert_eq!(ex.store.timer_list(false).unwrap().len(), 2);
}

#[tokio::test]
async fn caps_for_the_model_and_full_data_for_code() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path(), &[]);
    let big: String = (0..3000).map(|i| format!("line {i}\n")).collect();
    file(&mut s, "big.txt", &big);
    file(&mut s, "wide.txt", &format!("{}\n", "x".repeat(2000)));
    let (r, ex) = shell(s, &["cat big.txt", "cat wide.txt", "grep line big.txt"]).await;
    let (_, stdout, _) = out(&r[0]);
    assert_eq!(r[0]["truncated"], true);
    assert_eq!(stdout.lines().count(), adf::runtime::shell::MAX_LINES + 1);
    assert!(stdout.lines().last().unwrap().contains("sed -n '2001,4000p'"), "says how to read on");
    assert!(out(&r[1]).1.lines().next().unwrap().chars().count() < 520);
    assert_eq!(out(&r[2]).1.lines().count(), adf::runtime::shell::MAX_GREP_HITS + 1);
    // Code gets everything.
    let provider = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![(
            "sys_code".into(),
            json!({"code": "const r = await adf.adf_shell({command: 'cat big.txt | wc -l'}); const all = await adf.adf_shell({command: 'cat big.txt'}); return r.stdout.trim() + ' ' + all.stdout.split('\\n').length + ' ' + (all.truncated || false)"}),
        )]),
        Reply::Text("done".into()),
    ]));
    let store = ex.store;
    let mut ex =
        Executor::new(store, provider, Bus::new(), Arc::new(Answers { approve: true, asked: Mutex::new(vec![]) }))
            .unwrap();
    ex.chat("go").await.unwrap();
    let (text, _) = tool_results(&ex.store).pop().unwrap();
    assert!(text.contains("3000 3001 false"), "{text}");
}

/// Every tool of the default config, enabled, called once from the model:
/// it works or says why not here; never `Unknown tool`.
#[tokio::test]
async fn every_default_tool_answers() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path(), &[]);
    let names: Vec<&str> = adf::store::defaults::DEFAULT_TOOLS.iter().map(|t| t.0).collect();
    let all: Vec<(&str, bool, bool)> = names.iter().map(|n| (*n, true, false)).collect();
    s.config_set(Caller::Owner, "tools", tools_with(&all)).unwrap();
    let input = |n: &str| -> Value {
        match n {
            "fs_read" | "fs_delete" => json!({"path": "README.md"}),
            "fs_write" => json!({"mode": "write", "path": "x.txt", "content": "x"}),
            "msg_send" => json!({"recipient": "nobody", "content": "hi"}),
            "msg_update" => json!({"message_ids": "m1", "status": "read"}),
            "chat_info" => json!({"adapter": "telegram", "chat_id": "1"}),
            "sys_code" => json!({"code": "1"}),
            "sys_lambda" => json!({"source": "nope.js"}),
            "sys_set_timer" => json!({"schedule": {"type": "delay", "delay_ms": 60000}}),
            "sys_delete_timer" => json!({"id": 999}),
            "sys_update_config" => json!({"path": "description", "value": "d"}),
            "sys_create_adf" => json!({"name": "child"}),
            "db_query" => json!({"sql": "SELECT 1"}),
            "db_execute" => json!({"sql": "CREATE TABLE local_x (a)"}),
            "msg_delete" => json!({"source": "inbox", "filter": {}}),
            "say" => json!({"message": "hi"}),
            "sys_set_meta" => json!({"key": "k", "value": "v"}),
            "sys_delete_meta" => json!({"key": "k"}),
            "sys_fetch" => json!({"url": "http://127.0.0.1:9/"}),
            "adf_shell" => json!({"command": "echo hi"}),
            "ws_send" => json!({"connection_id": "c", "data": "d"}),
            "stream_bind" => json!({"a": {}, "b": {}}),
            "stream_unbind" => json!({"binding_id": "b"}),
            "fs_transfer" => json!({"from": "vfs", "to": "host", "path": "a"}),
            "compute_exec" => json!({"command": "ls"}),
            "mcp_restart" | "mcp_uninstall" => json!({"name": "x"}),
            _ => json!({}),
        }
    };
    // Tools that end the turn or ask go last / are skipped.
    let skip = ["ask", "sys_set_state", "loop_compact", "loop_clear"];
    let calls: Vec<(String, Value)> =
        names.iter().filter(|n| !skip.contains(n)).map(|n| (n.to_string(), input(n))).collect();
    let n = calls.len();
    let provider = Arc::new(Scripted::new(vec![Reply::Tools(calls.clone()), Reply::Text("done".into())]));
    let mut ex =
        Executor::new(s, provider, Bus::new(), Arc::new(Answers { approve: false, asked: Mutex::new(vec![]) }))
            .unwrap();
    ex.chat("go").await.unwrap();
    let results = tool_results(&ex.store);
    assert_eq!(results.len(), n);
    for ((name, _), (text, _)) in calls.iter().zip(&results) {
        assert!(!text.contains("Unknown tool"), "{name}: {text}");
    }
}

/// Conformance 57: `_async: true` from the model runs `adf_shell` (and the
/// other code tools) as a background task: `{task_id, status, tool}` at
/// once, the task row completed with the result later; a restricted tool
/// waits as `pending_approval`; other tools ignore `_async`.
#[tokio::test]
async fn p57_async_from_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path(), &[]);
    s.config_set(Caller::Owner, "tools", tools_with(&[("adf_shell", true, false), ("sys_fetch", true, true)])).unwrap();
    let provider = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![
            ("adf_shell".into(), json!({"command": "echo background", "_async": true})),
            ("sys_fetch".into(), json!({"url": "http://127.0.0.1:9/", "_async": "true"})),
            ("fs_list".into(), json!({"_async": true})),
        ]),
        Reply::Text("done".into()),
    ]));
    let owner = Arc::new(Answers { approve: true, asked: Mutex::new(vec![]) });
    let mut ex = Executor::new(s, provider, Bus::new(), owner.clone()).unwrap();
    ex.chat("go").await.unwrap();
    let results = tool_results(&ex.store);
    let shell: Value = serde_json::from_str(&results[0].0).unwrap();
    assert_eq!((shell["status"].as_str(), shell["tool"].as_str()), (Some("running"), Some("adf_shell")));
    let fetch: Value = serde_json::from_str(&results[1].0).unwrap();
    assert_eq!(fetch["status"], "pending_approval", "a restricted tool waits for the owner");
    assert!(owner.asked.lock().unwrap().is_empty(), "the turn did not block on the approval");
    assert!(results[2].0.contains("README.md"), "fs_list ignores _async and runs inline: {}", results[2].0);
    let task = ex.store.task_get(shell["task_id"].as_str().unwrap()).unwrap().unwrap();
    assert_eq!(task.status, "completed");
    assert!(task.result.unwrap().contains("background"));
    let waiting = ex.store.task_get(fetch["task_id"].as_str().unwrap()).unwrap().unwrap();
    assert_eq!(waiting.status, "pending_approval");
}

/// runtime.md §9.1: `fs_read` for the model cuts text over
/// `max_file_read_tokens` at whole lines with a footer saying how to read
/// on, and shows a long file's first 50 lines with its size.
#[tokio::test]
async fn fs_read_guards_for_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path(), &[("limits", json!({"max_file_read_tokens": 100}))]);
    let long: String = (1..=400).map(|i| format!("row {i}\n")).collect();
    file(&mut s, "long.txt", &long);
    let wide: String = (1..=40).map(|i| format!("{i:02} {}\n", "w".repeat(30))).collect();
    file(&mut s, "wide.txt", &wide);
    let provider = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![
            ("fs_read".into(), json!({"path": "wide.txt"})),
            ("fs_read".into(), json!({"path": "long.txt", "start_line": 1, "end_line": 20})),
        ]),
        Reply::Text("done".into()),
    ]));
    let mut ex =
        Executor::new(s, provider, Bus::new(), Arc::new(Answers { approve: true, asked: Mutex::new(vec![]) })).unwrap();
    ex.chat("go").await.unwrap();
    let r = tool_results(&ex.store);
    let wide: Value = serde_json::from_str(&r[0].0).unwrap();
    let text = wide["content"].as_str().unwrap();
    assert!(text.contains("--- TRUNCATED at ~100 tokens (file has 40 lines"), "{text}");
    assert!(text.contains("start_line: 12"), "11 whole lines fit 400 characters; says where to read on: {text}");
    assert_eq!(wide["path"], "wide.txt", "the JSON stays; only content changes");
    let ranged: Value = serde_json::from_str(&r[1].0).unwrap();
    assert_eq!(ranged["content"].as_str().unwrap().lines().count(), 20, "a range under the limit is whole");
    // Without a range, a long file shows its first 50 lines.
    let mut s = ex.store;
    s.config_set(Caller::Owner, "limits", json!({"max_file_read_tokens": 30000})).unwrap();
    let provider = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![("fs_read".into(), json!({"path": "long.txt"}))]),
        Reply::Text("done".into()),
    ]));
    let mut ex =
        Executor::new(s, provider, Bus::new(), Arc::new(Answers { approve: true, asked: Mutex::new(vec![]) })).unwrap();
    ex.chat("again").await.unwrap();
    let last: Value = serde_json::from_str(&tool_results(&ex.store).pop().unwrap().0).unwrap();
    let text = last["content"].as_str().unwrap();
    assert!(text.starts_with("[Large file: 400 lines"), "{text}");
    assert!(text.ends_with("row 50\n"), "{text}");
}
