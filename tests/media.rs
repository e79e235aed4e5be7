//! Multimodal tool results end to end: the real binary, a real agent file
//! and a fake provider on loopback that refuses what the real APIs refuse.
//! An image `fs_read` or the shell's `cat` reaches goes to the model as an
//! image part (Anthropic: inside the tool result; OpenAI: a user message
//! after the tool messages) when the model takes images, is never stored
//! in the loop, leaves older messages, and a provider that refuses it gets
//! one retry without it.

mod common;

use std::path::Path;
use std::process::Output;

use adf::store::files::WriteOptions;
use adf::store::{Caller, Store};
use base64::Engine;
use common::fake_provider::*;
use common::*;
use serde_json::{Value, json};

/// A 1×1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4, 0x89, 0x00, 0x00, 0x00, 0x0d, 0x49,
    0x44, 0x41, 0x54, 0x78, 0xda, 0x63, 0xf8, 0xcf, 0xc0, 0xf0, 0x1f, 0x00, 0x05, 0x00, 0x02, 0x01, 0xa3, 0xf5, 0xa6,
    0xe3, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

fn b64() -> String {
    base64::engine::general_purpose::STANDARD.encode(PNG)
}

async fn chat(dir: &Path, base: &str, text: &str) -> Output {
    let (dir, base, text) = (dir.to_path_buf(), base.to_string(), text.to_string());
    tokio::task::spawn_blocking(move || adf_with_providers(&dir, &base, &["chat", "a.adf", &text])).await.unwrap()
}

/// An agent with the shell on, `pic.png` among its files and `cfg` set.
fn agent(dir: &Path, provider: &str, cfg: &[(&str, Value)]) -> std::path::PathBuf {
    ok(&adf(dir, &["new", "a.adf", "--provider", provider, "--model", "test-model"], None));
    let path = dir.join("a.adf");
    let mut s = Store::open(&path).unwrap();
    s.config_set(Caller::Owner, "tools", tools_enabled(&["adf_shell"])).unwrap();
    for (k, v) in cfg {
        s.config_set(Caller::Owner, k, v.clone()).unwrap();
    }
    s.file_write(Caller::Owner, "pic.png", PNG, &WriteOptions::default()).unwrap();
    drop(s);
    path
}

/// Every Anthropic image block of a request, wherever it sits.
fn anthropic_images(body: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for m in body["messages"].as_array().unwrap() {
        for b in m["content"].as_array().into_iter().flatten() {
            if b["type"] == "image" {
                out.push(b.clone());
            }
            for p in b["content"].as_array().into_iter().flatten() {
                if p["type"] == "image" {
                    out.push(p.clone());
                }
            }
        }
    }
    out
}

fn loop_text(path: &Path) -> String {
    let c = rusqlite::Connection::open(path).unwrap();
    let mut s = c.prepare("SELECT content_json FROM adf_loop ORDER BY seq").unwrap();
    s.query_map([], |r| r.get::<_, String>(0)).unwrap().map(Result::unwrap).collect::<Vec<_>>().join("\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_sees_images_from_fs_read_and_cat_and_the_loop_keeps_none() {
    let dir = tmp();
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_tool("toolu_1", "fs_read", r#"{"path":"pic.png"}"#)),
        Scripted::sse(anthropic_tool("toolu_2", "adf_shell", r#"{"command":"cat pic.png"}"#)),
        Scripted::sse(anthropic_tool("toolu_3", "adf_shell", r#"{"command":"echo one"}"#)),
        Scripted::sse(anthropic_tool("toolu_4", "adf_shell", r#"{"command":"echo two"}"#)),
        Scripted::sse(anthropic_text(&["A red dot."], 9, 3)),
    ])
    .await;
    let a = agent(dir.path(), "anthropic", &[("model.multimodal", json!({"image": true}))]);
    let out = chat(dir.path(), &fake.base_url, "what is in pic.png?").await;
    assert_eq!(ok(&out).trim(), "A red dot.");
    let reqs: Vec<Value> = fake.requests().into_iter().map(|(_, b)| b).collect();
    assert_eq!(reqs.len(), 5, "every request was accepted by the strict double");
    assert!(reqs[0]["system"].as_str().unwrap().contains("## Multimodal Perception"));
    // The fs_read result carries the image inside the tool result.
    let last = reqs[1]["messages"].as_array().unwrap().last().unwrap().clone();
    let result = &last["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert!(result["content"][0]["text"].as_str().unwrap().contains("[image: pic.png (image/png)]"), "{result}");
    assert_eq!(result["content"][1]["source"], json!({"type": "base64", "media_type": "image/png", "data": b64()}));
    // Both images are still there one step later...
    assert_eq!(anthropic_images(&reqs[2]).len(), 2, "fs_read's and cat's");
    assert_eq!(anthropic_images(&reqs[3]).len(), 1, "the older one left first");
    // ...and gone from older messages after that.
    assert!(anthropic_images(&reqs[4]).is_empty());
    // The loop keeps the text naming the file, never the bytes.
    let stored = loop_text(&a);
    assert!(!stored.contains(&b64()), "no image bytes in the loop");
    assert!(stored.contains("[image: pic.png (image/png)]"));
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_gets_the_image_as_a_user_part_after_the_tool_message() {
    let dir = tmp();
    let fake = FakeProvider::start(vec![
        Scripted::sse(openai_tool("call_1", "adf_shell", r#"{"command":"cat pic.png"}"#)),
        Scripted::sse(openai_text(&["Seen."], 9, 2)),
    ])
    .await;
    agent(dir.path(), "openai", &[("model.vision", json!(true))]);
    let out = chat(dir.path(), &fake.base_url, "look").await;
    assert_eq!(ok(&out).trim(), "Seen.");
    let (_, body) = &fake.requests()[1];
    let msgs = body["messages"].as_array().unwrap();
    let tool = msgs.iter().position(|m| m["role"] == "tool").unwrap();
    let shown: Value = serde_json::from_str(msgs[tool]["content"].as_str().unwrap()).unwrap();
    assert_eq!(shown["media"], json!([{"path": "pic.png", "mime_type": "image/png"}]));
    assert_eq!(
        msgs[tool + 1]["content"],
        json!([{"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", b64())}}])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_image_part_when_the_model_takes_none_or_the_file_is_too_big() {
    for cfg in [vec![], vec![("model.multimodal", json!({"image": true})), ("limits.max_image_size_bytes", json!(10))]]
    {
        let dir = tmp();
        let fake = FakeProvider::start(vec![
            Scripted::sse(anthropic_tool("toolu_1", "fs_read", r#"{"path":"pic.png"}"#)),
            Scripted::sse(anthropic_text(&["Cannot see it."], 9, 2)),
        ])
        .await;
        agent(dir.path(), "anthropic", &cfg);
        let out = chat(dir.path(), &fake.base_url, "look").await;
        assert_eq!(ok(&out).trim(), "Cannot see it.");
        let (_, body) = &fake.requests()[1];
        assert!(anthropic_images(body).is_empty(), "{cfg:?}");
        let last = body["messages"].as_array().unwrap().last().unwrap();
        assert!(last["content"][0]["content"].as_str().unwrap().contains("[image: pic.png (image/png)]"));
        assert_eq!(
            body["system"].as_str().unwrap().contains("## Multimodal Perception"),
            !cfg.is_empty(),
            "the perception section follows the config"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_image_is_removed_and_the_turn_retried_once() {
    let dir = tmp();
    let refusal = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Could not process image"}}"#;
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_tool("toolu_1", "fs_read", r#"{"path":"pic.png"}"#)),
        Scripted::error(400, refusal),
        Scripted::sse(anthropic_text(&["I could not view it; the file is 70 bytes."], 9, 2)),
    ])
    .await;
    let a = agent(dir.path(), "anthropic", &[("model.multimodal", json!({"image": true}))]);
    let out = chat(dir.path(), &fake.base_url, "look").await;
    assert_eq!(ok(&out).trim(), "I could not view it; the file is 70 bytes.");
    let reqs: Vec<Value> = fake.requests().into_iter().map(|(_, b)| b).collect();
    assert_eq!(reqs.len(), 3);
    assert_eq!(anthropic_images(&reqs[1]).len(), 1);
    assert!(anthropic_images(&reqs[2]).is_empty(), "the retry goes without the image");
    assert!(reqs[2].to_string().contains("[System notice: The previous assistant turn failed"));
    let logs = rusqlite::Connection::open(&a)
        .unwrap()
        .query_row("SELECT count(*) FROM adf_logs WHERE level = 'warn' AND event = 'turn_error'", [], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap();
    assert_eq!(logs, 1);

    // A second refusal in the same turn stops there: idle, with a notice.
    let dir = tmp();
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_tool("toolu_1", "fs_read", r#"{"path":"pic.png"}"#)),
        Scripted::error(400, refusal),
        Scripted::error(400, refusal),
    ])
    .await;
    let a = agent(dir.path(), "anthropic", &[("model.multimodal", json!({"image": true}))]);
    let out = chat(dir.path(), &fake.base_url, "look").await;
    assert!(!out.status.success());
    let stored = loop_text(&a);
    assert!(stored.contains("Recovery retry also failed"), "{stored}");
    let followup = rusqlite::Connection::open(&a)
        .unwrap()
        .query_row("SELECT level FROM adf_logs WHERE event = 'image_recovery_followup_error'", [], |r| {
            r.get::<_, String>(0)
        })
        .unwrap();
    assert_eq!(followup, "warn", "the agent stays idle, not in error");
}

/// An image `sys_fetch` brings back is saved under downloads/ and named,
/// not left as base64 in the context, and the model sees it.
#[tokio::test(flavor = "multi_thread")]
async fn a_fetched_image_is_saved_named_and_shown() {
    let app = axum::Router::new().route(
        "/img/cat.png",
        axum::routing::get(|| async { ([(axum::http::header::CONTENT_TYPE, "image/png")], PNG.to_vec()) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/img/cat.png", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let dir = tmp();
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_tool("toolu_1", "sys_fetch", &json!({"url": url}).to_string())),
        Scripted::sse(anthropic_text(&["A cat."], 9, 2)),
    ])
    .await;
    let a = agent(
        dir.path(),
        "anthropic",
        &[("model.multimodal", json!({"image": true})), ("security.allow_local_fetch", json!(true))],
    );
    let out = chat(dir.path(), &fake.base_url, "fetch the cat").await;
    assert_eq!(ok(&out).trim(), "A cat.");
    let (_, body) = &fake.requests()[1];
    let images = anthropic_images(body);
    assert_eq!(images.len(), 1, "{body}");
    assert_eq!(images[0]["source"]["data"], b64());
    let stored = loop_text(&a);
    assert!(stored.contains("downloads/cat.png (image/png, 70 bytes), saved from the response"), "{stored}");
    assert!(!stored.contains(&b64()));
    let (entry, bytes) = Store::open(&a).unwrap().file_read("downloads/cat.png").unwrap();
    assert_eq!(bytes, PNG);
    assert_eq!(entry.mime_type.as_deref(), Some("image/png"));
}
