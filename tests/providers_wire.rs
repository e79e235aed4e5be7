//! Both wire formats against a real HTTP server on loopback: streamed text
//! in several deltas, tool calls, usage, error statuses with their
//! classification, and cut or malformed streams that never yield a reply.

mod common;

use std::time::Duration;

use adf::providers::anthropic::Anthropic;
use adf::providers::openai::OpenAi;
use adf::providers::{ErrorKind, Message, ModelEvent, ModelRequest, Provider, Role, ToolSpec, collect};
use common::fake_provider::*;
use serde_json::json;

fn request() -> ModelRequest {
    ModelRequest {
        model: "test-model".into(),
        system: "You are a test.".into(),
        messages: std::sync::Arc::new(vec![Message {
            role: Role::User,
            content: vec![json!({"type": "text", "text": "hi"})],
        }]),
        tools: std::sync::Arc::new(vec![ToolSpec {
            name: "fs_read".into(),
            description: "Read a file".into(),
            input_schema: std::sync::Arc::new(
                json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
            ),
        }]),
        max_tokens: 256,
        temperature: Some(0.5),
        effort: None,
        reasoning_tokens: None,
        trailing: None,
    }
}

async fn run(p: &dyn Provider) -> (Result<adf::providers::Response, adf::providers::ProviderError>, usize) {
    let mut deltas = 0;
    let out = match p.stream(request()).await {
        Ok(s) => {
            collect(s, p.id(), |e| {
                if matches!(e, ModelEvent::TextDelta(_)) {
                    deltas += 1
                }
            })
            .await
        }
        Err(e) => Err(e),
    };
    (out, deltas)
}

#[tokio::test]
async fn anthropic_text_tool_and_request_shape() {
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_text(&["Hel", "lo ", "there."], 21, 9)),
        Scripted::sse(anthropic_tool("toolu_9", "fs_read", r#"{"path":"README.md"}"#)),
    ])
    .await;
    let p = Anthropic::new("anthropic", &fake.base_url, "sk-test");
    let (r, deltas) = run(&p).await;
    let r = r.unwrap();
    assert_eq!(r.text(), "Hello there.");
    assert!(deltas >= 3);
    assert_eq!((r.usage.input, r.usage.output), (21, 9));
    assert_eq!(r.stop_reason, "end_turn");
    let (r, _) = run(&p).await;
    let r = r.unwrap();
    let call = r.tool_calls().next().unwrap();
    assert_eq!(call["input"], json!({"path": "README.md"}));
    assert_eq!(call["id"], "toolu_9");
    let (headers, body) = &fake.requests()[0];
    assert_eq!(headers["x-api-key"], "sk-test");
    assert_eq!(headers["anthropic-version"], "2023-06-01");
    assert_eq!(body["stream"], true);
    assert_eq!(body["system"], "You are a test.");
    assert_eq!(body["tools"][0]["input_schema"]["required"][0], "path");
}

#[tokio::test]
async fn openai_text_tool_and_request_shape() {
    let fake = FakeProvider::start(vec![
        Scripted::sse(openai_text(&["One", ", two", ", three"], 30, 6)),
        Scripted::sse(openai_tool("call_1", "fs_read", r#"{"path":"a.md"}"#)),
    ])
    .await;
    let p = OpenAi::new("openai", &format!("{}/v1", fake.base_url), Some("sk-o"));
    let (r, deltas) = run(&p).await;
    let r = r.unwrap();
    assert_eq!(r.text(), "One, two, three");
    assert_eq!(deltas, 3);
    assert_eq!((r.usage.input, r.usage.output), (30, 6));
    let (r, _) = run(&p).await;
    let r = r.unwrap();
    assert_eq!(r.tool_calls().next().unwrap()["name"], "fs_read");
    let (headers, body) = &fake.requests()[0];
    assert_eq!(headers["authorization"], "Bearer sk-o");
    assert_eq!(body["messages"][0]["role"], "system");
    assert_eq!(body["tools"][0]["function"]["name"], "fs_read");
    assert_eq!(body["stream_options"]["include_usage"], true);
}

#[tokio::test]
async fn error_statuses_are_classified() {
    let mut rate =
        Scripted::error(429, r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#);
    rate.headers.push(("retry-after".into(), "7".into()));
    let fake = FakeProvider::start(vec![
        Scripted::error(
            401,
            r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
        ),
        rate,
        Scripted::error(500, r#"{"error":{"message":"boom"}}"#),
        Scripted::error(404, r#"{"type":"error","error":{"type":"not_found_error","message":"model: nope"}}"#),
    ])
    .await;
    let p = Anthropic::new("anthropic", &fake.base_url, "bad");
    let e = run(&p).await.0.unwrap_err();
    assert_eq!((e.kind, e.status), (ErrorKind::Auth, Some(401)));
    assert!(e.message.contains("invalid x-api-key"));
    let e = run(&p).await.0.unwrap_err();
    assert_eq!((e.kind, e.retry_after), (ErrorKind::Transient, Some(Duration::from_secs(7))));
    assert_eq!(run(&p).await.0.unwrap_err().kind, ErrorKind::Transient);
    assert_eq!(run(&p).await.0.unwrap_err().kind, ErrorKind::Structural);
}

#[tokio::test]
async fn cut_and_malformed_streams_never_yield_a_reply() {
    let mut cut = Scripted::sse(anthropic_text(&["partial"], 5, 5)[..4].to_vec());
    cut.cut = true;
    let clean_but_short = Scripted::sse(anthropic_text(&["partial"], 5, 5)[..4].to_vec());
    let malformed = Scripted::sse(vec![frame("message_start", "{not json")]);
    let fake = FakeProvider::start(vec![cut, clean_but_short, malformed]).await;
    let p = Anthropic::new("anthropic", &fake.base_url, "k");
    for _ in 0..3 {
        let e = run(&p).await.0.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    }
    // OpenAI: a stream that stops before any finish reason.
    let mut chunks = openai_text(&["a", "b"], 1, 1);
    chunks.truncate(2);
    let fake = FakeProvider::start(vec![Scripted::sse(chunks)]).await;
    let p = OpenAi::new("openai", &format!("{}/v1", fake.base_url), None);
    assert_eq!(run(&p).await.0.unwrap_err().kind, ErrorKind::Transient);
}

#[tokio::test]
async fn connection_refused_is_transient() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let p = OpenAi::new("openai", &format!("http://127.0.0.1:{port}/v1"), None);
    assert_eq!(run(&p).await.0.unwrap_err().kind, ErrorKind::Transient);
}

/// An OpenAI-wire server that counts the TCP connections it accepts and
/// answers every request of a connection (HTTP/1.1 keep-alive) with the
/// text "ok".
async fn counting_server() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    // One request: its head, then the body its length names.
                    let head = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match tcp.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let text = String::from_utf8_lossy(&buf[..head]).to_ascii_lowercase();
                    let len: usize = text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    while buf.len() < head + len {
                        match tcp.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..head + len);
                    let body = openai_text(&["ok"], 1, 1).concat();
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if tcp.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (base, accepted)
}

#[tokio::test]
async fn a_fleets_providers_share_one_client_and_its_connections() {
    // The providers one factory (one fleet) makes share a client: a second
    // agent's call reuses the first one's connection, and an idle agent
    // holds no client (and no TLS roots) of its own.
    let (base, accepted) = counting_server().await;
    let cfg = json!({"model": {"provider": "wire"},
                     "providers": [{"id": "wire", "type": "openai-compatible", "baseUrl": base}]});
    let factory = adf::runtime::fleet::accounts_factory();
    let (a, b) = (factory(&cfg).unwrap(), factory(&cfg).unwrap());
    for p in [&a, &b, &a, &b] {
        let (r, _) = run(p.as_ref()).await;
        assert_eq!(r.unwrap().text(), "ok");
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1, "four calls of two agents, one connection");
    // Another fleet's factory has a client of its own.
    let other = adf::runtime::fleet::accounts_factory()(&cfg).unwrap();
    let (r, _) = run(other.as_ref()).await;
    assert_eq!(r.unwrap().text(), "ok");
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
}
