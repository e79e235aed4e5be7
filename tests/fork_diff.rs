//! Agents as documents (issue 19): `adf diff A B` says what differs
//! (config, files, meta, tables, loop rows) like git diff, and `adf fork
//! FILE --at S<seq> DST` copies an agent with its loop ending at a row and
//! a fresh identity, to retry from there.

mod common;

use std::sync::Arc;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::executor::{Absent, Executor};
use adf::store::files::WriteOptions;
use adf::store::{Caller, NewAgent, Store};
use common::*;
use serde_json::json;

/// An agent with three turns, the second with a tool call.
async fn history(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("a.adf");
    let (store, _) =
        Store::create(&path, &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() }).unwrap();
    let replies = vec![
        Reply::Text("first answer".into()),
        Reply::Tools(vec![("fs_write".into(), json!({"mode": "write", "path": "notes/x.md", "content": "x"}))]),
        Reply::Text("wrote it".into()),
        Reply::Text("third answer".into()),
    ];
    let mut ex = Executor::new(store, Arc::new(Scripted::new(replies)), Bus::new(), Arc::new(Absent)).unwrap();
    for m in ["one", "two", "three"] {
        ex.chat(m).await.unwrap();
    }
    ex.store_into().close().unwrap();
    path
}

fn rows(path: &std::path::Path) -> Vec<(i64, String, String)> {
    let s = Store::open_read_only(path).unwrap();
    s.loop_rows(None).unwrap().into_iter().map(|r| (r.seq, r.role, r.content.to_string())).collect()
}

#[tokio::test]
async fn a_fork_ends_its_loop_at_a_row_with_a_fresh_identity_and_goes_on_from_there() {
    let dir = tmp();
    let d = dir.path();
    let a = history(d).await;
    let all = rows(&a);
    let first_answer = all.iter().find(|r| r.2.contains("first answer")).unwrap().0;
    let call = all.iter().find(|r| r.2.contains("tool_use")).unwrap().0;
    // Between a tool call and its results: refused, no file left.
    fails(&adf(d, &["fork", "a.adf", "--at", &format!("S{call}"), "b.adf"], None), &["tool call", "may not end"]);
    fails(&adf(d, &["fork", "a.adf", "--at", "S9999", "b.adf"], None), &["no row S9999", "rows run"]);
    fails(&adf(d, &["fork", "a.adf", "--at", "yesterday", "b.adf"], None), &["not a loop row"]);
    assert!(!d.join("b.adf").exists());
    let v = json(&adf(d, &["fork", "a.adf", "--at", &format!("S{first_answer}"), "b.adf", "--json"], None));
    assert_eq!(v["at"], first_answer);
    assert_ne!(v["did"], v["source_did"], "a fresh identity");
    let forked = rows(&d.join("b.adf"));
    assert_eq!(forked.last().unwrap().0, first_answer);
    assert_eq!(forked[..], all[..forked.len()], "the rows up to the cut, as they were");
    fails(&adf(d, &["fork", "a.adf", "--at", &format!("S{first_answer}"), "b.adf"], None), &["exists"]);
    // The fork goes on from its past: a new turn on a loop that ends there.
    let s = Store::open(d.join("b.adf")).unwrap();
    let provider = Arc::new(Scripted::new([Reply::Text("another second answer".into())]));
    let mut ex = Executor::new(s, provider, Bus::new(), Arc::new(Absent)).unwrap();
    ex.chat("two, again").await.unwrap();
    let texts: Vec<String> = ex.store.loop_rows(None).unwrap().iter().map(|r| r.content.to_string()).collect();
    assert!(texts.last().unwrap().contains("another second answer"));
    assert!(!texts.iter().any(|t| t.contains("third answer")));
    ex.store_into().close().unwrap();
    // And the two read apart like git diff.
    let out = adf(d, &["diff", "a.adf", "b.adf"], None);
    assert_eq!(out.status.code(), Some(1), "they differ");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("--- a/loop") && text.contains("rows alike"), "{text}");
    assert!(text.contains("third answer") && text.contains("+S") && text.contains("another second answer"), "{text}");
    assert!(text.contains("-adf_did = ") && text.contains("+adf_did = "), "{text}");
    // Files are not versioned by row: the fork has them as they are now.
    assert!(!text.contains("notes/x.md"), "{text}");
}

#[tokio::test]
async fn adf_diff_shows_config_files_meta_and_tables() {
    let dir = tmp();
    let d = dir.path();
    let a = history(d).await;
    let out = adf(d, &["diff", "a.adf", "a.adf"], None);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no differences"));
    std::fs::copy(&a, d.join("c.adf")).unwrap();
    let mut c = Store::open(d.join("c.adf")).unwrap();
    c.file_write(Caller::Owner, "mind.md", b"# Mind\n\nremember the plan\nand more\n", &WriteOptions::default())
        .unwrap();
    c.file_write(Caller::Owner, "data/blob.bin", &[0, 159, 146, 150], &WriteOptions::default()).unwrap();
    let mut cfg = c.config_value().unwrap();
    cfg["model"]["model_id"] = json!("m2");
    c.config_replace(cfg).unwrap();
    c.meta_set(Caller::Owner, "project", "apollo", None).unwrap();
    c.close().unwrap();
    let raw = rusqlite::Connection::open(d.join("c.adf")).unwrap();
    raw.execute_batch(
        "CREATE TABLE local_notes(id INTEGER PRIMARY KEY, t TEXT); INSERT INTO local_notes(t) VALUES ('a')",
    )
    .unwrap();
    drop(raw);
    let out = adf(d, &["diff", "a.adf", "c.adf"], None);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("-model.model_id: \"m\"") && text.contains("+model.model_id: \"m2\""), "{text}");
    assert!(text.contains("--- a/mind.md") && text.contains("+remember the plan"), "{text}");
    assert!(text.contains("+++ b/data/blob.bin (4 bytes)"), "{text}");
    assert!(text.contains("+project = \"apollo\""), "{text}");
    assert!(text.contains(" local_notes: absent → 1 rows"), "{text}");
    let v: serde_json::Value =
        serde_json::from_slice(&adf(d, &["diff", "a.adf", "c.adf", "--json"], None).stdout).unwrap();
    assert_eq!(v["config"][0]["path"], "model.model_id");
    assert_eq!(v["loop"]["only_a"].as_array().unwrap().len(), 0);
    fails(&adf(d, &["diff", "a.adf", "nope.adf"], None), &["nope.adf", "no such file"]);
}
