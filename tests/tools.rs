//! The built-in tools on a real agent file: parameters, results, errors and
//! caps as tools.md gives them.

mod common;

use adf::store::{Caller, NewAgent, Store};
use adf::tools::{Ctx, Signal, ToolOutput, execute};
use common::*;
use serde_json::{Value, json};

struct Env {
    _dir: tempfile::TempDir,
    store: Store,
    events: Vec<(&'static str, Value)>,
}

impl Env {
    fn new() -> Self {
        let dir = tmp();
        let (store, _) = Store::create(dir.path().join("a.adf"), &NewAgent::default()).unwrap();
        Env { _dir: dir, store, events: Vec::new() }
    }

    fn call_as(&mut self, caller: Caller, from_code: bool, name: &str, input: Value) -> ToolOutput {
        let mut emitted = Vec::new();
        let out = {
            let mut emit = |k: &'static str, v: Value| emitted.push((k, v));
            let mut ctx = Ctx { store: &mut self.store, caller, from_code, full: from_code, emit: &mut emit };
            execute(&mut ctx, name, &input)
        };
        self.events.extend(emitted);
        out
    }

    fn call(&mut self, name: &str, input: Value) -> ToolOutput {
        self.call_as(Caller::AGENT, false, name, input)
    }
}

#[test]
fn fs_write_read_edit_append_list_delete() {
    let mut e = Env::new();
    let out = e.call(
        "fs_write",
        json!({"mode": "write", "path": "notes/a.md", "content": "line 1\nline 2\nline 3\n", "_reason": "test"}),
    );
    assert_eq!(out.content, "Successfully wrote \"notes/a.md\" (21 characters)");
    assert!(!out.is_error);
    let r: Value =
        serde_json::from_str(&e.call("fs_read", json!({"path": "notes/a.md", "start_line": 2, "end_line": 3})).content)
            .unwrap();
    assert_eq!(r["content"], "line 2\nline 3\n");
    assert_eq!(r["mime_type"], "text/markdown");
    assert_eq!(r["protection"], "none");
    let out = e.call("fs_write", json!({"mode": "append", "path": "notes/a.md", "content": "line 4\n"}));
    assert_eq!(out.content, "Appended 7 characters to \"notes/a.md\"");
    let out = e.call(
        "fs_write",
        json!({"mode": "edit", "path": "notes/a.md", "old_text": "line", "new_text": "row", "replace_all": true}),
    );
    assert_eq!(out.content, "Edited notes/a.md (4 replacement(s)).");
    let out = e.call("fs_write", json!({"mode": "edit", "path": "notes/a.md", "old_text": "row", "new_text": "x"}));
    assert!(out.is_error && out.content.contains("occurs 4 times"), "{}", out.content);
    let out = e.call("fs_write", json!({"mode": "edit", "path": "missing.md", "old_text": "a", "new_text": "b"}));
    assert!(out.is_error && out.content.contains("Use mode=\"write\""));
    let out = e.call("fs_write", json!({"mode": "write", "path": "bin/x.png", "content": "iVBORw0KGgo=", "encoding": "base64", "mime_type": "image/png"}));
    assert_eq!(out.content, "Successfully wrote \"bin/x.png\" (8 bytes, binary)");
    let r: Value = serde_json::from_str(&e.call("fs_read", json!({"path": "bin/x.png"})).content).unwrap();
    assert_eq!(r["content"], Value::Null, "binary content is not shown to the model");
    let r: Value =
        serde_json::from_str(&e.call_as(Caller::AGENT, true, "fs_read", json!({"path": "bin/x.png"})).content).unwrap();
    assert_eq!(r["content"], "iVBORw0KGgo=", "code gets base64");
    let list: Value = serde_json::from_str(&e.call("fs_list", json!({"prefix": "notes/"})).content).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1);
    let readme: Value = serde_json::from_str(&e.call("fs_read", json!({"path": "README.md"})).content).unwrap();
    assert_eq!((readme["protection"].as_str(), readme["created_at"].is_null()), (Some("no_delete"), true));
    let out = e.call("fs_delete", json!({"path": "README.md"}));
    assert_eq!(out.content, "Cannot delete \"README.md\": file is protected (no_delete).");
    assert_eq!(out.denial.unwrap().kind, adf::store::DenialKind::FileProtection);
    assert_eq!(e.call("fs_delete", json!({"path": "notes/a.md"})).content, "Deleted \"notes/a.md\".");
    assert_eq!(e.call("fs_read", json!({"path": "notes/a.md"})).content, "File not found: \"notes/a.md\"");
    let kinds: Vec<&str> = e.events.iter().map(|(k, _)| *k).collect();
    assert!(kinds.contains(&"file.written") && kinds.contains(&"file.read") && kinds.contains(&"file.deleted"));
}

#[test]
fn registry_errors() {
    let mut e = Env::new();
    assert_eq!(e.call("nope", json!({})).content, "Unknown tool: nope");
    let out = e.call("fs_write", json!({"path": "a"}));
    assert_eq!(out.content, "Invalid input for tool \"fs_write\": \"mode\" is required");
    let out = e.call("fs_read", json!("{not an object"));
    assert!(out.is_error && out.content.starts_with("Invalid input for tool \"fs_read\""));
    let out = e.call("sys_set_meta", json!({"key": "k", "value": "1", "delta": 1}));
    assert!(out.is_error && out.content.contains("exactly one of"), "{}", out.content);
}

#[test]
fn db_tools_and_caps() {
    let mut e = Env::new();
    assert!(e.call("db_execute", json!({"sql": "CREATE TABLE local_n(i INTEGER)"})).content.contains("changes"));
    for i in 0..600 {
        e.store.db_execute("INSERT INTO local_n VALUES (?1)", &[json!(i)], false).unwrap();
    }
    let out = e.call("db_query", json!({"sql": "SELECT i FROM local_n ORDER BY i"}));
    assert!(
        out.content.ends_with("--- TRUNCATED at 500 rows (query returned 600 rows) ---"),
        "{}",
        &out.content[out.content.len() - 80..]
    );
    let full = e.call_as(Caller::AGENT, true, "db_query", json!({"sql": "SELECT i FROM local_n", "_full": true}));
    assert_eq!(serde_json::from_str::<Value>(&full.content).unwrap().as_array().unwrap().len(), 600);
    assert_eq!(
        e.call("db_query", json!({"sql": "SELECT * FROM adf_meta"})).content,
        "Access to adf_meta, adf_config, and adf_identity is not allowed in db_query."
    );
    assert_eq!(e.call("db_query", json!({"sql": "SELECT 1; SELECT 2"})).content, "Multi-statement SQL is not allowed.");
    assert_eq!(e.call("db_execute", json!({"sql": "SELECT 1"})).content, "Use db_query for SELECT statements.");
    assert!(
        e.call("db_execute", json!({"sql": "DELETE FROM adf_logs"}))
            .content
            .starts_with("Cannot modify adf_* system tables.")
    );
    assert_eq!(
        e.call("db_execute", json!({"sql": "INSERT INTO local_n VALUES (?1)", "params": [7]})).content,
        "{\"changes\":1}"
    );
    let blob = e.call("db_query", json!({"sql": "SELECT content FROM adf_files WHERE path = 'README.md'"}));
    assert!(blob.content.contains("\"base64:"), "{}", blob.content);
}

#[test]
fn meta_tools() {
    let mut e = Env::new();
    assert_eq!(e.call("sys_set_meta", json!({"key": "k", "value": "v"})).content, "OK");
    assert_eq!(e.call("sys_get_meta", json!({"key": "k"})).content, "v");
    assert_eq!(e.call("sys_get_meta", json!({"key": "zz"})).content, "Key \"zz\" not found.");
    assert!(e.call("sys_get_meta", json!({})).content.contains("k\tv"));
    assert_eq!(e.call("sys_set_meta", json!({"key": "n", "delta": 2})).content, "OK: n = 2");
    assert_eq!(e.call("sys_delete_meta", json!({"key": "k"})).content, "OK");
    assert_eq!(e.call("sys_delete_meta", json!({"key": "k"})).content, "Key \"k\" not found.");
    let out = e.call("sys_delete_meta", json!({"key": "adf_did"}));
    assert!(out.is_error && out.denial.is_some());
}

#[test]
fn config_tools() {
    let mut e = Env::new();
    assert_eq!(
        e.call("sys_update_config", json!({"path": "tools.fs_delete.enabled", "value": "true"})).content,
        "Updated tools.fs_delete.enabled."
    );
    assert_eq!(e.store.config_value().unwrap()["tools"][3]["enabled"], true);
    assert_eq!(
        e.call("sys_update_config", json!({"path": "limits.max_active_turns", "value": "12"})).content,
        "Updated limits.max_active_turns."
    );
    assert_eq!(e.store.config_value().unwrap()["limits"]["max_active_turns"], 12);
    assert_eq!(
        e.call("sys_update_config", json!({"path": "locked_fields", "value": []})).content,
        "Cannot modify locking configuration. Use sys_get_config to see the current configuration."
    );
    let out = e.call("sys_update_config", json!({"path": "security.allow_local_fetch", "value": true}));
    assert_eq!(out.denial.unwrap().kind, adf::store::DenialKind::ConfigLock);
    let out = e.call(
        "sys_update_config",
        json!({"path": "tools", "action": "append", "value": {"name": "fs_read", "enabled": true}}),
    );
    assert!(out.is_error && out.content.contains("Duplicate name \"fs_read\""), "{}", out.content);
    let out = e.call(
        "sys_update_config",
        json!({"path": "tools", "action": "append", "value": {"name": "sys_update_config", "restricted": false}}),
    );
    assert!(out.is_error, "{}", out.content);
    let out = e.call("sys_update_config", json!({"path": "model.temperature", "value": 9}));
    assert!(
        out.is_error && out.content.contains("model.temperature") && out.content.ends_with("configuration."),
        "{}",
        out.content
    );
    let out = e.call("sys_update_config", json!({"path": "bogus.x", "value": 1}));
    assert!(out.is_error && out.content.contains("unknown section"));
    assert_eq!(
        e.call(
            "sys_update_config",
            json!({"path": "logging.rules", "action": "append", "value": {"origin": "mesh*", "min_level": "warn"}})
        )
        .content,
        "Appended to logging.rules."
    );
    assert_eq!(
        e.call("sys_update_config", json!({"path": "logging.rules", "action": "remove", "index": 0})).content,
        "Removed index 0 from logging.rules."
    );
    let cfg: Value = serde_json::from_str(&e.call("sys_get_config", json!({})).content).unwrap();
    assert_eq!(cfg["name"], "a");
    let tools: Value = serde_json::from_str(&e.call("sys_get_config", json!({"section": "tools"})).content).unwrap();
    let upd = tools["tools"].as_array().unwrap().iter().find(|t| t["name"] == "sys_update_config").unwrap();
    assert_eq!(upd["restricted"], true);
    let st = e.call("sys_set_state", json!({"state": "hibernate"}));
    assert_eq!(
        (st.end_turn, st.target_state.as_deref(), st.content.as_str()),
        (true, Some("hibernate"), "{\"target_state\":\"hibernate\"}")
    );
}

#[test]
fn timer_tools() {
    let mut e = Env::new();
    let out = e.call("sys_set_timer", json!({"schedule": {"type": "interval", "every_ms": 3600000, "max_runs": 10}, "payload": "check mail", "scope": ["agent"]}));
    assert!(
        out.content.starts_with("Timer set successfully.\nID: 1\nScope: [\"agent\"]\n[interval: 1.0h]"),
        "{}",
        out.content
    );
    assert!(
        e.call("sys_set_timer", json!({"schedule": {"type": "once", "at": 1000}}))
            .content
            .contains("must be in the future")
    );
    assert!(
        e.call("sys_set_timer", json!({"schedule": {"type": "cron", "cron": "nope"}})).content.contains("Invalid cron")
    );
    e.call("sys_set_timer", json!({"schedule": {"type": "cron", "cron": "*/5 * * * *"}, "locked": true}));
    let list = e.call("sys_list_timers", json!({})).content;
    assert!(
        list.contains("[interval: 1.0h]")
            && list.contains("[cron: */5 * * * *] [locked]")
            && list.contains("payload: check mail"),
        "{list}"
    );
    assert!(e.call("sys_delete_timer", json!({"id": 2})).content.contains("is locked"));
    assert_eq!(e.call("sys_delete_timer", json!({"id": 1})).content, "Timer 1 deleted.");
    assert_eq!(e.call("sys_delete_timer", json!({"id": 1})).content, "Timer 1 not found.");
    let stored: String =
        e.store.db_query("SELECT schedule_json FROM adf_timers", &[], false).unwrap().rows[0]["schedule_json"]
            .as_str()
            .unwrap()
            .to_string();
    assert_eq!(stored, r#"{"mode":"cron","cron":"*/5 * * * *"}"#);
}

#[test]
fn delay_and_once_timers_are_stored_as_once() {
    let mut e = Env::new();
    let before = adf::store::now_ms();
    assert!(
        e.call("sys_set_timer", json!({"schedule": {"type": "delay", "delay_ms": 60000}}))
            .content
            .starts_with("Timer set")
    );
    let at = before + 3_600_000;
    assert!(e.call("sys_set_timer", json!({"schedule": {"type": "once", "at": at}})).content.starts_with("Timer set"));
    let past = e.call("sys_set_timer", json!({"schedule": {"type": "once", "at": before - 1000}}));
    assert!(past.is_error, "a once timer in the past is refused: {}", past.content);
    let rows =
        e.store.db_query("SELECT schedule_json, next_wake_at FROM adf_timers ORDER BY id", &[], false).unwrap().rows;
    let delay: Value = serde_json::from_str(rows[0]["schedule_json"].as_str().unwrap()).unwrap();
    assert_eq!(delay["mode"], json!("once"), "delay collapses to once");
    let delay_at = delay["at"].as_i64().unwrap();
    assert!((before + 60_000..=adf::store::now_ms() + 60_000).contains(&delay_at));
    assert_eq!(rows[0]["next_wake_at"].as_i64(), Some(delay_at));
    assert_eq!(rows[1]["schedule_json"].as_str().unwrap(), format!(r#"{{"mode":"once","at":{at}}}"#));
}

#[test]
fn turn_tools_signal() {
    let mut e = Env::new();
    assert_eq!(e.call("say", json!({"message": "working"})).content, "ok");
    assert!(e.call("respond", json!({"message": "done"})).end_turn);
    assert_eq!(
        e.call("loop_compact", json!({"instructions": "keep todos"})).signal,
        Some(Signal::Compact { instructions: Some("keep todos".into()) })
    );
    assert_eq!(e.call("loop_clear", json!({"start": -2})).signal, Some(Signal::Clear { start: Some(-2), end: None }));
}
