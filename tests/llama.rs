//! Against a real model server: llama.cpp's `llama-server` with SmolLM2,
//! through both its OpenAI and its Anthropic endpoint. The model is tiny, so
//! these assert on protocol (streaming in pieces, usage, loop rows), never
//! on what it says. `.ci/run` builds the server (`.ci/llama.sh`), starts it
//! and runs these with `ADF_LLAMA_URL` set.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::*;
use serde_json::{Value, json};

fn url() -> String {
    std::env::var("ADF_LLAMA_URL").expect("ADF_LLAMA_URL (run .ci/llama.sh and start llama-server)")
}

fn setup(dir: &Path, account: Value) {
    let home = dir.join(".adf-home/config");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("settings.json"), json!({"accounts": [account]}).to_string()).unwrap();
    ok(&adf(dir, &["new", "a.adf", "--provider", account["id"].as_str().unwrap(), "--model", "smollm2"], None));
    for (k, v) in
        [("tools", "[]"), ("model.temperature", "0"), ("model.max_tokens", "24"), ("include_base_prompt", "false")]
    {
        ok(&adf(dir, &["config", "set", "a.adf", k, v], None));
    }
}

fn chat(dir: &Path) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(["chat", "a.adf", "Say hello in five words.", "--json"])
        .current_dir(dir)
        .env("ADF_HOME", dir.join(".adf-home"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    ok(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn check(dir: &Path, events: &[Value]) {
    let deltas = events.iter().filter(|e| e["event_type"] == "turn.delta").count();
    assert!(deltas >= 2, "text arrives in several deltas ({deltas})");
    let llm = events.iter().find(|e| e["event_type"] == "llm.completed").expect("llm.completed");
    assert!(llm["payload"]["input_tokens"].as_u64().unwrap() > 0);
    assert!(llm["payload"]["output_tokens"].as_u64().unwrap() > 0);
    let c = rusqlite::Connection::open(dir.join("a.adf")).unwrap();
    let rows: Vec<(String, String, Option<String>)> = c
        .prepare("SELECT role, content_json, tokens FROM adf_loop ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .filter(|(_, c, _): &(String, String, Option<String>)| !c.contains("[Context: system_prompt]"))
        .collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1].0, "assistant");
    let content: Value = serde_json::from_str(&rows[1].1).unwrap();
    assert_eq!(content[0]["type"], "text");
    assert!(!content[0]["text"].as_str().unwrap().is_empty());
    let tokens: Value = serde_json::from_str(rows[1].2.as_ref().unwrap()).unwrap();
    assert!(tokens["output"].as_u64().unwrap() > 0);
}

#[test]
#[ignore = "needs llama-server: see .ci/llama.sh and ADF_LLAMA_URL"]
fn openai_endpoint_streams_and_records_usage() {
    let dir = tmp();
    setup(dir.path(), json!({"id": "llama", "type": "openai-compatible", "base_url": format!("{}/v1", url())}));
    let events = chat(dir.path());
    check(dir.path(), &events);
}

#[test]
#[ignore = "needs llama-server: see .ci/llama.sh and ADF_LLAMA_URL"]
fn anthropic_endpoint_streams_and_records_usage() {
    let dir = tmp();
    setup(dir.path(), json!({"id": "llama-anthropic", "type": "anthropic", "base_url": url(), "api_key": "unused"}));
    let events = chat(dir.path());
    check(dir.path(), &events);
}
