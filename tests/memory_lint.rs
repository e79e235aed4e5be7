//! The built-in memory linter (issue 18): dangling citations, broken
//! links, orphan and stale pages and contradicting facts, found without a
//! model; `adf lint`, the `memory_lint` tool, and the `lint` loop's
//! scheduled run that tells the owner and hands the model the report.

mod common;

use std::sync::Arc;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::executor::{Absent, Executor};
use adf::store::files::WriteOptions;
use adf::store::lint::LintOptions;
use adf::store::{Caller, NewAgent, Store};
use common::*;
use serde_json::{Value, json};

/// An agent with one real exchange (rows S1.. exist) and memory pages with
/// one finding of each kind.
async fn agent_with_memory(dir: &std::path::Path) -> (Store, i64) {
    let (s, _) = Store::create(dir.join("a.adf"), &NewAgent::default()).unwrap();
    let provider = Arc::new(Scripted::new([Reply::Text("Alice's email is a@example.com.".into())]));
    let mut ex = Executor::new(s, provider, Bus::new(), Arc::new(Absent)).unwrap();
    ex.chat("what is Alice's email?").await.unwrap();
    let mut s = ex.store_into();
    let seq = s.loop_rows(None).unwrap().last().unwrap().seq;
    let w = WriteOptions::default();
    let index = format!(
        "# Mind\n\n- [People](adf-file://mind/people.md) — who is who [S{seq}]\n- [Plans](mind/plans.md) — gone\n\
         - [Old](mind/old.md)\n\nSee also [S999999].\n\n```\n[S888888] in code is no citation\n```\n"
    );
    s.file_write(Caller::Owner, "mind.md", index.as_bytes(), &w).unwrap();
    let people =
        format!("# Alice\n\n- **Email**: a@example.com [S{seq}]\n- Team: core\n\nMore in [contacts](contacts.md).\n");
    s.file_write(Caller::AGENT, "mind/people.md", people.as_bytes(), &w).unwrap();
    s.file_write(Caller::AGENT, "mind/contacts.md", b"## Alice\n\n- Email: alice@old.example\n- Team: Core.\n", &w)
        .unwrap();
    s.file_write(Caller::AGENT, "mind/stray.md", b"# Stray\n\nLinked from nowhere.\n", &w).unwrap();
    s.file_write(Caller::AGENT, "mind/old.md", b"# Old\n\nWritten long ago.\n", &w).unwrap();
    s.file_append(Caller::AGENT, "mind/log.md", &format!("- learned Alice's email [S{seq}]\n"), None).unwrap();
    // mind/old.md was last changed 90 days before the agent's latest work.
    let long_ago = (chrono::Utc::now() - chrono::Duration::days(90)).to_rfc3339();
    s.close().unwrap();
    let c = rusqlite::Connection::open(dir.join("a.adf")).unwrap();
    c.execute("UPDATE adf_files SET updated_at = ?1 WHERE path = 'mind/old.md'", [long_ago]).unwrap();
    drop(c);
    (Store::open(dir.join("a.adf")).unwrap(), seq)
}

fn kinds(report: &Value) -> Vec<(String, String)> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["kind"].as_str().unwrap().to_string(), f["page"].as_str().unwrap().to_string()))
        .collect()
}

#[tokio::test]
async fn the_linter_finds_one_of_each_and_nothing_else() {
    let dir = tmp();
    let (s, _) = agent_with_memory(dir.path()).await;
    let r = serde_json::to_value(s.memory_lint(LintOptions::default()).unwrap()).unwrap();
    let mut got = kinds(&r);
    got.sort();
    let want: Vec<(String, String)> = [
        ("broken_link", "mind.md"),
        ("contradiction", "mind/contacts.md"),
        ("dangling_citation", "mind.md"),
        ("orphan_page", "mind/stray.md"),
        ("stale_page", "mind/old.md"),
    ]
    .iter()
    .map(|(k, p)| (k.to_string(), p.to_string()))
    .collect();
    assert_eq!(got, want, "{r:#}");
    let f = |k: &str| r["findings"].as_array().unwrap().iter().find(|f| f["kind"] == k).unwrap().clone();
    assert!(f("dangling_citation")["detail"].as_str().unwrap().contains("[S999999]"));
    assert_eq!(f("dangling_citation")["line"], 7);
    assert!(f("broken_link")["detail"].as_str().unwrap().contains("mind/plans.md"));
    let c = f("contradiction")["detail"].as_str().unwrap().to_string();
    assert!(c.contains("alice / email") && c.contains("a@example.com") && c.contains("alice@old.example"), "{c}");
    assert!(!c.contains("team"), "`core` and `Core.` say the same");
    assert!(f("stale_page")["detail"].as_str().unwrap().contains("90 days"));
    // A window past the page's age finds it fresh.
    let loose = s.memory_lint(LintOptions { stale_days: 120 }).unwrap();
    assert!(loose.findings.iter().all(|f| f.kind != "stale_page"));
    assert_eq!(r["citations"], 4, "index, people, log, and the one that dangles; not the code block");
}

#[tokio::test]
async fn adf_lint_exits_1_on_findings_and_0_on_clean_memory() {
    let dir = tmp();
    let d = dir.path();
    let (s, _) = agent_with_memory(d).await;
    s.close().unwrap();
    let before = std::fs::read(d.join("a.adf")).unwrap();
    let out = adf(d, &["lint", "a.adf", "--json"], None);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["counts"]["orphan_page"], 1);
    let text = String::from_utf8_lossy(&adf(d, &["lint", "a.adf"], None).stdout).to_string();
    assert!(text.contains("mind/stray.md: orphan page") && text.contains("mind.md:7: dangling citation"), "{text}");
    assert_eq!(std::fs::read(d.join("a.adf")).unwrap(), before, "linting reads only");
    let zero = adf(d, &["lint", "a.adf", "--stale-days", "0"], None);
    assert_eq!(zero.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&zero.stderr).contains("--stale-days"));
    fails(&adf(d, &["lint", "nope.adf"], None), &["nope.adf"]);
    ok(&adf(d, &["new", "fresh.adf"], None));
    let clean = ok(&adf(d, &["lint", "fresh.adf"], None));
    assert!(clean.contains("clean"), "{clean}");
}

#[tokio::test]
async fn the_lint_loop_tells_the_owner_and_opens_its_turn_with_the_report() {
    let dir = tmp();
    let (mut s, _) = agent_with_memory(dir.path()).await;
    let spec = adf::runtime::loop_templates::spec("lint").unwrap();
    s.loop_create("lint", &spec).unwrap();
    let provider = Arc::new(Scripted::new([
        Reply::Tools(vec![("memory_lint".into(), json!({"stale_days": 120}))]),
        Reply::Text("reported".into()),
    ]));
    let bus = Bus::new();
    let mut events = bus.subscribe(None, adf::runtime::bus::Filter::default());
    let mut ex = Executor::new(s, provider.clone(), bus, Arc::new(Absent)).unwrap();
    ex.side_turn("lint", Some("[Scheduled run]"), "schedule").await.unwrap();
    let first = &provider.requests()[0];
    let opened: String = first
        .messages
        .iter()
        .flat_map(|m| m.content.iter())
        .filter_map(|b| b["text"].as_str().map(str::to_string))
        .collect();
    assert!(opened.contains("[Scheduled run]") && opened.contains("built-in memory lint"), "{opened}");
    assert!(opened.contains("orphan page") && opened.contains("mind/stray.md"), "{opened}");
    let names: Vec<&str> = first.tools.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"memory_lint") && names.contains(&"memory_cite"), "{names:?}");
    // The model's own call ran the linter with its window.
    let result = ex
        .store
        .side_rows("lint")
        .unwrap()
        .iter()
        .flat_map(|r| r.content.as_array().cloned().unwrap_or_default())
        .find(|b| b["type"] == "tool_result")
        .unwrap();
    assert_ne!(result["is_error"], json!(true), "{result}");
    let r: Value = serde_json::from_str(result["content"].as_str().unwrap()).unwrap();
    assert!(r["counts"].get("stale_page").is_none() && r["counts"]["orphan_page"] == 1, "{r}");
    // The owner is told: a warning in the log, and on the bus.
    let all = adf::store::logs::LogQuery { limit: 1000, ..Default::default() };
    let logs = ex.store.log_list(&all).unwrap();
    let warn = logs.iter().find(|l| l.origin.as_deref() == Some("memory_lint")).unwrap();
    assert_eq!(warn.level, "warn");
    assert!(warn.message.contains("loop lint: memory lint: 6 pages") && warn.message.contains("1 orphan page"));
    let mut linted = None;
    while let Some(item) = events.try_next() {
        if let adf::runtime::bus::Item::Event(e) = item
            && e.event.event_type == "loop.memory_linted"
        {
            linted = Some(e.event.payload.clone());
        }
    }
    let linted = linted.expect("loop.memory_linted on the bus");
    assert_eq!((linted["loop"].clone(), linted["findings"].clone()), (json!("lint"), json!(5)));
    // Another loop's scheduled run and the lint loop's chat are not linted.
    let n = logs.iter().filter(|l| l.origin.as_deref() == Some("memory_lint")).count();
    ex.side_turn("lint", Some("what now?"), "chat").await.unwrap();
    assert_eq!(
        ex.store.log_list(&all).unwrap().iter().filter(|l| l.origin.as_deref() == Some("memory_lint")).count(),
        n
    );
}
