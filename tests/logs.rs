//! `adf logs` (issue 19): an agent's `adf_logs` with level and origin
//! filters, the newest N, following new rows, from the file or through the
//! daemon.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use adf::providers::scripted::Scripted;
use adf::runtime::bus::Bus;
use adf::runtime::executor::{Absent, Executor};
use adf::store::{NewAgent, Store};
use common::*;
use serde_json::Value;

fn with_logs(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("a.adf");
    let (s, _) = Store::create(&path, &NewAgent::default()).unwrap();
    let mut ex = Executor::new(s, Arc::new(Scripted::new([])), Bus::new(), Arc::new(Absent)).unwrap();
    ex.log("debug", "executor", "tick", "a quiet tick").unwrap();
    ex.log("info", "lambda", "ran", "on_timer ran").unwrap();
    ex.log("warn", "executor", "budget_exceeded", "[Budget] limits.budget.usd_day reached").unwrap();
    ex.log("error", "lambda", "failed", "on_timer threw").unwrap();
    ex.store_into().close().unwrap();
    path
}

fn events(v: &Value) -> Vec<&str> {
    v["logs"].as_array().unwrap().iter().map(|r| r["event"].as_str().unwrap()).collect()
}

#[test]
fn logs_filter_by_level_and_origin_and_take_the_newest() {
    let dir = tmp();
    let d = dir.path();
    with_logs(d);
    let all = json(&adf(d, &["logs", "a.adf", "--json"], None));
    let evs = events(&all);
    assert!(evs.ends_with(&["tick", "ran", "budget_exceeded", "failed"]), "{evs:?}");
    assert_eq!(
        events(&json(&adf(d, &["logs", "a.adf", "--level", "warn", "--json"], None))),
        ["budget_exceeded", "failed"]
    );
    assert_eq!(events(&json(&adf(d, &["logs", "a.adf", "--origin", "lambda", "--json"], None))), ["ran", "failed"]);
    assert_eq!(events(&json(&adf(d, &["logs", "a.adf", "--limit", "1", "--json"], None))), ["failed"]);
    let text = ok(&adf(d, &["logs", "a.adf", "--level", "error"], None));
    assert!(text.contains("ERROR") && text.contains("lambda") && text.contains("on_timer threw"), "{text}");
    fails(&adf(d, &["logs", "a.adf", "--level", "loud"], None), &["--level", "debug, info, warn, error"]);
}

#[test]
fn follow_prints_new_rows_as_they_are_written() {
    let dir = tmp();
    let path = with_logs(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(["logs", "a.adf", "--follow", "--json", "--limit", "1"])
        .current_dir(dir.path())
        .env("ADF_HOME", dir.path().join(".adf-home"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["event"], "failed");
    // Another process writes a row while the follower runs.
    let s = Store::open(&path).unwrap();
    let mut ex = Executor::new(s, Arc::new(Scripted::new([])), Bus::new(), Arc::new(Absent)).unwrap();
    ex.log("info", "owner", "later", "written while followed").unwrap();
    let next: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!((next["event"].as_str(), next["message"].as_str()), (Some("later"), Some("written while followed")));
    let _ = child.kill();
    let _ = child.wait();
    ex.store_into().close().unwrap();
}
