//! `adf chat` end to end: the real binary, a real agent file, and a fake
//! provider speaking the real wire formats on loopback.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::fake_provider::*;
use common::*;
use serde_json::{Value, json};

fn adf_env(dir: &Path, base: &str, args: &[&str]) -> Output {
    adf_with_providers(dir, base, args)
}

async fn run(dir: &Path, base: &str, args: &[&str]) -> Output {
    let (dir, base) = (dir.to_path_buf(), base.to_string());
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        adf_env(&dir, &base, &a)
    })
    .await
    .unwrap()
}

fn new_agent(dir: &Path, provider: &str) -> std::path::PathBuf {
    ok(&adf(dir, &["new", "a.adf", "--provider", provider, "--model", "test-model"], None));
    dir.join("a.adf")
}

fn rows(path: &Path) -> Vec<(String, Value, Option<String>)> {
    let c = rusqlite::Connection::open(path).unwrap();
    let mut s = c.prepare("SELECT role, content_json, tokens FROM adf_loop ORDER BY COALESCE(ord, seq), seq").unwrap();
    s.query_map([], |r| {
        let content: String = r.get(1)?;
        Ok((r.get(0)?, serde_json::from_str(&content).unwrap(), r.get(2)?))
    })
    .unwrap()
    .map(Result::unwrap)
    .filter(|(_, c, _): &(String, Value, Option<String>)| !is_context(c))
    .collect()
}

/// `[Context: system_prompt|dynamic_instructions]` rows are audit records.
fn is_context(c: &Value) -> bool {
    c[0]["text"]
        .as_str()
        .is_some_and(|t| t.starts_with("[Context: system_prompt]") || t.starts_with("[Context: dynamic_instructions]"))
}

fn query(path: &Path, sql: &str) -> Vec<Vec<String>> {
    let c = rusqlite::Connection::open(path).unwrap();
    let mut s = c.prepare(sql).unwrap();
    let n = s.column_count();
    s.query_map([], |r| {
        Ok((0..n).map(|i| r.get::<_, rusqlite::types::Value>(i).map(|v| format!("{v:?}")).unwrap()).collect())
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_text_reply_streams_and_is_recorded() {
    let dir = tmp();
    let fake =
        FakeProvider::start(vec![Scripted::sse(anthropic_text(&["Hello", " from", " the model."], 42, 7))]).await;
    let a = new_agent(dir.path(), "anthropic");
    let out = run(dir.path(), &fake.base_url, &["chat", "a.adf", "hi there"]).await;
    assert_eq!(ok(&out).trim(), "Hello from the model.");
    let r = rows(&a);
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].0, "user");
    assert_eq!(r[0].1[0]["text"], "hi there");
    assert_eq!(r[1].0, "assistant");
    assert_eq!(r[1].1[0]["text"], "Hello from the model.");
    assert_eq!(serde_json::from_str::<Value>(r[1].2.as_ref().unwrap()).unwrap(), json!({"input": 42, "output": 7}));
    let (_, body) = &fake.requests()[0];
    let sent = body["messages"][0]["content"][0]["text"].as_str().unwrap();
    assert!(sent.contains("[S1] hi there"), "{sent}");
    assert!(body["system"].as_str().unwrap().contains("<injected_file path=\"mind.md\">"));
    assert!(body["tools"].as_array().unwrap().iter().any(|t| t["name"] == "fs_write"));
    assert!(body["tools"][0]["input_schema"]["properties"]["_reason"].is_object());
    let cp = query(&a, "SELECT value FROM adf_meta WHERE key = 'adf_runtime_turn_checkpoint'");
    assert!(cp[0][0].contains("completed"), "{cp:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_tool_turn_changes_the_file() {
    let dir = tmp();
    let fake = FakeProvider::start(vec![
        Scripted::sse(openai_tool(
            "call_1",
            "fs_write",
            r#"{"mode":"write","path":"notes/today.md","content":"3 urgent"}"#,
        )),
        Scripted::sse(openai_text(&["Done: ", "notes written."], 80, 5)),
    ])
    .await;
    let a = new_agent(dir.path(), "openai");
    let out = run(dir.path(), &fake.base_url, &["chat", "a.adf", "write today's notes"]).await;
    assert_eq!(ok(&out).trim(), "Done: notes written.");
    assert!(String::from_utf8_lossy(&out.stderr).contains("▸ fs_write"));
    assert_eq!(adf(dir.path(), &["files", "cat", "a.adf", "notes/today.md"], None).stdout, b"3 urgent");
    let r = rows(&a);
    let roles: Vec<&str> = r.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"]);
    assert_eq!(r[1].1[0]["type"], "tool_use");
    assert_eq!(r[2].1[0]["type"], "tool_result");
    assert_eq!(r[2].1[0]["content"], "Successfully wrote \"notes/today.md\" (8 characters)");
    // The second request carried the tool result back in OpenAI's shape.
    let (_, body) = &fake.requests()[1];
    let msgs = body["messages"].as_array().unwrap();
    assert!(msgs.iter().any(|m| m["role"] == "tool" && m["tool_call_id"] == "call_1"));
}

#[tokio::test(flavor = "multi_thread")]
async fn restricted_tool_without_a_terminal_exits_3_and_leaves_a_pending_task() {
    let dir = tmp();
    let fake = FakeProvider::start(vec![Scripted::sse(anthropic_tool(
        "toolu_1",
        "sys_update_config",
        r#"{"path":"description","value":"x","_reason":"tidy up"}"#,
    ))])
    .await;
    let a = new_agent(dir.path(), "anthropic");
    let out = run(dir.path(), &fake.base_url, &["chat", "a.adf", "change your description"]).await;
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("waiting for the owner on task task_"));
    let t = query(
        &a,
        "SELECT tool, status, requires_authorization, executor_managed, origin, approval_meta FROM adf_tasks",
    );
    assert_eq!(t.len(), 1);
    assert_eq!(t[0][0], "Text(\"sys_update_config\")");
    assert_eq!(t[0][1], "Text(\"pending_approval\")");
    assert_eq!((t[0][2].as_str(), t[0][3].as_str()), ("Integer(1)", "Integer(1)"));
    assert_eq!(t[0][4], "Text(\"hil:sys_update_config:toolu_1\")");
    assert!(t[0][5].contains("restricted"));
    // The description did not change.
    assert_eq!(ok(&adf(dir.path(), &["config", "get", "a.adf", "description"], None)), "\n");
    // A new message closes the paused turn: the approval is denied and the
    // dangling call answered before the new turn runs.
    fake.push(Scripted::sse(anthropic_text(&["Understood."], 10, 2)));
    ok(&run(dir.path(), &fake.base_url, &["chat", "a.adf", "never mind"]).await);
    let t = query(&a, "SELECT status FROM adf_tasks");
    assert_eq!(t[0][0], "Text(\"denied\")");
    let r = rows(&a);
    assert_eq!(r[2].1[0]["type"], "tool_result");
    assert_eq!(r[2].1[0]["is_error"], true);
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_errors_set_state_and_leave_no_half_turn() {
    let dir = tmp();
    let fake = FakeProvider::start(vec![Scripted::error(
        401,
        r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
    )])
    .await;
    let a = new_agent(dir.path(), "anthropic");
    let out = run(dir.path(), &fake.base_url, &["chat", "a.adf", "hello"]).await;
    let err = fails(&out, &["a.adf", "invalid x-api-key", "agent is now error"]);
    assert!(!err.contains("sk-test"), "the key never appears");
    assert_eq!(rows(&a).len(), 1, "only the user row");
    let logs = query(&a, "SELECT level, origin, event FROM adf_logs");
    assert!(logs.iter().any(|l| l[2] == "Text(\"provider_credentials_invalid\")"), "{logs:?}");
    // A cut stream is transient: retried (quickly here), then the agent is idle.
    ok(&adf(
        dir.path(),
        &[
            "config",
            "set",
            "a.adf",
            "recovery",
            r#"{"auto_retry":true,"max_attempts":2,"base_delay_ms":10,"max_delay_ms":50}"#,
        ],
        None,
    ));
    let mut cut = Scripted::sse(anthropic_text(&["par", "tial"], 5, 5)[..4].to_vec());
    cut.cut = true;
    fake.push(cut.clone());
    fake.push(cut);
    let out = run(dir.path(), &fake.base_url, &["chat", "a.adf", "again"]).await;
    fails(&out, &["agent is now idle"]);
    assert_eq!(rows(&a).len(), 2, "two user rows, no partial assistant row");
    let warns = query(&a, "SELECT event FROM adf_logs WHERE level = 'warn'");
    assert!(warns.iter().any(|w| w[0] == "Text(\"provider_error\")"), "{warns:?}");
    // 429 then success: retried and recorded.
    let mut rate = Scripted::error(429, r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow"}}"#);
    rate.headers.push(("retry-after".into(), "0".into()));
    fake.push(rate);
    fake.push(Scripted::sse(anthropic_text(&["ok"], 1, 1)));
    assert_eq!(ok(&run(dir.path(), &fake.base_url, &["chat", "a.adf", "third"]).await).trim(), "ok");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_tool_calls_are_answered_not_fatal() {
    let dir = tmp();
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_tool("toolu_1", "no_such_tool", r#"{"a":1}"#)),
        Scripted::sse(anthropic_tool("toolu_2", "fs_write", r#"{"mode":"write","path":"x"}"#)),
        Scripted::sse(anthropic_tool("toolu_3", "fs_read", r#"{"path": "README.md""#)),
        Scripted::sse(anthropic_text(&["Sorry."], 1, 1)),
    ])
    .await;
    let a = new_agent(dir.path(), "anthropic");
    let out = run(dir.path(), &fake.base_url, &["chat", "a.adf", "do things", "--json"]).await;
    let stdout = ok(&out);
    let types: Vec<String> = stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["event_type"].as_str().unwrap().to_string())
        .collect();
    assert!(
        types.contains(&"tool.failed".to_string())
            && types.contains(&"turn.completed".to_string())
            && types.contains(&"turn.delta".to_string()),
        "{types:?}"
    );
    let r = rows(&a);
    assert_eq!(
        r[2].1[0]["content"],
        "Tool \"no_such_tool\" is not enabled. Check your agent configuration to enable it."
    );
    assert_eq!(r[4].1[0]["content"], "content is required for mode \"write\".");
    assert!(
        r[6].1[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("Invalid input for tool \"fs_read\": arguments must be a JSON object")
    );
    assert_eq!(r[7].1[0]["text"], "Sorry.");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_turn_is_recovered_on_the_next_run() {
    let dir = tmp();
    let mut slow = Scripted::sse(anthropic_text(&["never"], 1, 1));
    slow.pause_ms = 60_000;
    let fake = FakeProvider::start(vec![slow]).await;
    let a = new_agent(dir.path(), "anthropic");
    let mut child = Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(["chat", "a.adf", "start the long job"])
        .current_dir(dir.path())
        .env("ADF_HOME", dir.path().join(".adf-home"))
        .env("ANTHROPIC_API_KEY", "k")
        .env("ANTHROPIC_BASE_URL", &fake.base_url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if !fake.requests().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(fake.requests().len(), 1, "the turn reached the provider");
    child.kill().unwrap();
    child.wait().unwrap();
    fake.push(Scripted::sse(anthropic_text(&["Back."], 1, 1)));
    ok(&run(dir.path(), &fake.base_url, &["chat", "a.adf", "are you there?"]).await);
    let r = rows(&a);
    let texts: Vec<String> = r.iter().map(|x| x.1[0]["text"].as_str().unwrap_or("").to_string()).collect();
    assert_eq!(texts[0], "start the long job");
    assert!(
        texts[1].starts_with("[System] The previous run of this agent stopped in the middle of a turn"),
        "{texts:?}"
    );
    assert!(texts[1].contains("NOT replayed") && texts[1].contains("It started at"));
    assert_eq!(texts[2], "are you there?");
    let logs = query(&a, "SELECT event FROM adf_logs WHERE level = 'warn'");
    assert!(logs.iter().any(|l| l[0] == "Text(\"turn_checkpoint_recovered\")"));
    // The provider saw the notice and the new message, not the old trigger twice.
    let (_, body) = fake.requests().last().cloned().unwrap();
    let users = body["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "user").count();
    assert_eq!(users, 1, "consecutive user rows merge into one message");
}

/// Run `adf` under a pseudo-terminal (util-linux `script`), typing `input`.
async fn run_tty(dir: &Path, base: &str, args: &[&str], input: &str) -> Output {
    let (dir, base, input) = (dir.to_path_buf(), base.to_string(), input.to_string());
    let cmd = std::iter::once(env!("CARGO_BIN_EXE_adf").to_string())
        .chain(args.iter().map(|a| format!("'{a}'")))
        .collect::<Vec<_>>()
        .join(" ");
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .current_dir(&dir)
            .env("ADF_HOME", dir.join(".adf-home"))
            .env("ANTHROPIC_API_KEY", "sk-test")
            .env("ANTHROPIC_BASE_URL", &base)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn approvals_and_asks_are_answered_at_the_terminal() {
    let dir = tmp();
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_tool(
            "toolu_1",
            "sys_update_config",
            r#"{"path":"description","value":"approved at the tty"}"#,
        )),
        Scripted::sse(anthropic_tool("toolu_2", "ask", r#"{"question":"Which colour?"}"#)),
        Scripted::sse(anthropic_text(&["All ", "set."], 3, 2)),
    ])
    .await;
    let a = new_agent(dir.path(), "anthropic");
    let out = run_tty(dir.path(), &fake.base_url, &["chat", "a.adf", "configure yourself"], "a\nteal\n").await;
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{screen}");
    assert!(screen.contains("approval needed: sys_update_config"), "{screen}");
    assert!(screen.contains("? Which colour?"), "{screen}");
    assert!(screen.contains("All set."), "{screen}");
    assert_eq!(ok(&adf(dir.path(), &["config", "get", "a.adf", "description"], None)).trim(), "approved at the tty");
    let r = rows(&a);
    assert_eq!(r[4].1[0]["content"], "Human answered: teal");
    let t = query(&a, "SELECT tool, status FROM adf_tasks ORDER BY created_at");
    assert_eq!(t.len(), 2);
    assert!(t.iter().all(|x| x[1] == "Text(\"completed\")"), "{t:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_ledger_with_the_owners_prices() {
    let dir = tmp();
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_text(&["one"], 1_000_000, 100_000)),
        Scripted::sse(anthropic_text(&["two"], 1_000_000, 100_000)),
    ])
    .await;
    new_agent(dir.path(), "anthropic");
    let cfg = dir.path().join(".adf-home/config");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(cfg.join("settings.json"), r#"{"prices": {"test-model": {"input": 3.0, "output": 15.0}}}"#).unwrap();
    let out = run(dir.path(), &fake.base_url, &["chat", "a.adf", "hi", "--json"]).await;
    let llm: Value = ok(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["event_type"] == "llm.completed")
        .unwrap();
    assert!((llm["payload"]["cost_usd"].as_f64().unwrap() - 4.5).abs() < 1e-9);
    assert_eq!(llm["payload"]["cost_source"], "settings.json prices");
    ok(&run(dir.path(), &fake.base_url, &["chat", "a.adf", "again"]).await);
    let usage = json(&adf(dir.path(), &["usage", "a.adf", "--json"], None));
    let m = &usage["models"]["test-model"];
    assert_eq!(
        (m["calls"].as_u64(), m["input_tokens"].as_u64(), m["output_tokens"].as_u64()),
        (Some(2), Some(2_000_000), Some(200_000))
    );
    assert!((m["cost_usd"].as_f64().unwrap() - 9.0).abs() < 1e-9);
    std::fs::remove_file(cfg.join("settings.json")).unwrap();
    let text = ok(&adf(dir.path(), &["usage", "a.adf"], None));
    assert!(text.contains("test-model") && text.contains("costs need prices"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_turn_is_approved_or_denied_later_from_the_cli() {
    let dir = tmp();
    let call = |v: &str| {
        Scripted::sse(anthropic_tool(
            "toolu_7",
            "sys_update_config",
            &format!(r#"{{"path":"description","value":"{v}"}}"#),
        ))
    };
    let fake = FakeProvider::start(vec![call("first"), Scripted::sse(anthropic_text(&["Updated."], 3, 2))]).await;
    let a = new_agent(dir.path(), "anthropic");
    let out = run(dir.path(), &fake.base_url, &["chat", "a.adf", "update it"]).await;
    assert_eq!(out.status.code(), Some(3));
    let task =
        query(&a, "SELECT id FROM adf_tasks")[0][0].trim_start_matches("Text(\"").trim_end_matches("\")").to_string();
    let out = run(dir.path(), &fake.base_url, &["approve", "a.adf", &task]).await;
    assert_eq!(ok(&out).trim(), "Updated.");
    assert_eq!(ok(&adf(dir.path(), &["config", "get", "a.adf", "description"], None)).trim(), "first");
    assert_eq!(query(&a, "SELECT status FROM adf_tasks")[0][0], "Text(\"completed\")");
    fails(
        &run(dir.path(), &fake.base_url, &["approve", "a.adf", &task]).await,
        &["a.adf", "not waiting on a paused turn"],
    );
    // Deny with a reason the model sees.
    fake.push(call("second"));
    fake.push(Scripted::sse(anthropic_text(&["Fine, leaving it."], 3, 2)));
    assert_eq!(run(dir.path(), &fake.base_url, &["chat", "a.adf", "again"]).await.status.code(), Some(3));
    let task = query(&a, "SELECT id FROM adf_tasks WHERE status = 'pending_approval'")[0][0]
        .trim_start_matches("Text(\"")
        .trim_end_matches("\")")
        .to_string();
    assert_eq!(
        ok(&run(dir.path(), &fake.base_url, &["deny", "a.adf", &task, "keep it short"]).await).trim(),
        "Fine, leaving it."
    );
    let r = rows(&a);
    let last_result = r.iter().rev().find(|x| x.1[0]["type"] == "tool_result").unwrap();
    assert_eq!(
        last_result.1[0]["content"],
        "Tool call \"sys_update_config\" was rejected by authorizer. Feedback: keep it short"
    );
    assert_eq!(ok(&adf(dir.path(), &["config", "get", "a.adf", "description"], None)).trim(), "first");
}

/// Kill `adf chat` while a tool of the turn runs (a `sys_code` busy loop),
/// then chat again: the history the provider gets must satisfy its rules
/// (the strict fake answers 400 otherwise), the call answered before the
/// recovery notice, results first.
async fn killed_in_a_tool_then_valid(provider: &str) {
    let dir = tmp();
    let code = r#"{"code":"const t = Date.now(); while (Date.now() - t < 60000) {}","timeout":120000}"#;
    let first = if provider == "anthropic" {
        anthropic_tool("toolu_slow", "sys_code", code)
    } else {
        openai_tool("call_slow", "sys_code", code)
    };
    let fake = FakeProvider::start(vec![Scripted::sse(first)]).await;
    let a = new_agent(dir.path(), provider);
    let mut child = Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(["chat", "a.adf", "run the slow job"])
        .current_dir(dir.path())
        .env("ADF_HOME", dir.path().join(".adf-home"))
        .env("ANTHROPIC_API_KEY", "k")
        .env("ANTHROPIC_BASE_URL", &fake.base_url)
        .env("OPENAI_API_KEY", "k")
        .env("OPENAI_BASE_URL", format!("{}/v1", fake.base_url))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The assistant row with the call is in the loop: the tool is running.
    let mut called = false;
    for _ in 0..400 {
        if rows(&a).iter().any(|r| r.0 == "assistant") {
            called = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(called, "the model's call reached the loop");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    child.kill().unwrap();
    child.wait().unwrap();
    let reply = if provider == "anthropic" { anthropic_text(&["Back."], 1, 1) } else { openai_text(&["Back."], 1, 1) };
    fake.push(Scripted::sse(reply));
    let out = run(dir.path(), &fake.base_url, &["chat", "a.adf", "did it finish?"]).await;
    let (_, body) = fake.requests().last().cloned().unwrap();
    let violation = if provider == "anthropic" {
        common::provider_rules::anthropic_violation(&body)
    } else {
        common::provider_rules::openai_violation(&body)
    };
    assert_eq!(violation, None, "{body:#}");
    ok(&out);
    let r = rows(&a);
    // call, its placeholder result, then the notice and the new message.
    let roles: Vec<&str> = r.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(roles[..3], ["user", "assistant", "user"], "{r:?}");
    assert_eq!(r[2].1[0]["type"], "tool_result", "{r:?}");
    assert!(r[2].1[0]["content"].as_str().unwrap().contains("interrupted"), "{r:?}");
    assert!(r[3].1[0]["text"].as_str().unwrap().starts_with("[System] The previous run"), "{r:?}");
    assert_eq!(r.last().unwrap().1[0]["text"], "Back.");
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_in_a_tool_the_next_anthropic_turn_is_valid() {
    killed_in_a_tool_then_valid("anthropic").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_in_a_tool_the_next_openai_turn_is_valid() {
    killed_in_a_tool_then_valid("openai").await;
}
