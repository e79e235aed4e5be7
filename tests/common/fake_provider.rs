//! A wire-level fake model provider: an HTTP server on loopback that answers
//! each request with the next scripted response (status, headers, SSE body
//! sent in chunks), records the requests it saw, and can cut a stream in
//! the middle the way a dropped connection does.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::Value;

#[derive(Clone, Debug)]
pub struct Scripted {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub chunks: Vec<String>,
    /// Abort the connection after the chunks instead of ending cleanly.
    pub cut: bool,
    /// Wait this long before answering.
    pub pause_ms: u64,
    /// Wait this long before each chunk after the first (a model that
    /// writes slowly).
    pub gap_ms: u64,
}

impl Scripted {
    pub fn sse(chunks: Vec<String>) -> Self {
        Scripted {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            chunks,
            cut: false,
            pause_ms: 0,
            gap_ms: 0,
        }
    }

    pub fn error(status: u16, body: &str) -> Self {
        Scripted {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            chunks: vec![body.into()],
            cut: false,
            pause_ms: 0,
            gap_ms: 0,
        }
    }
}

#[derive(Clone, Default)]
struct Shared {
    script: Arc<Mutex<VecDeque<Scripted>>>,
    seen: Arc<Mutex<Vec<(HeaderMap, Value)>>>,
}

pub struct FakeProvider {
    pub base_url: String,
    shared: Shared,
    _task: tokio::task::JoinHandle<()>,
}

impl FakeProvider {
    pub async fn start(script: Vec<Scripted>) -> Self {
        Self::start_on("127.0.0.1:0", script).await
    }

    /// Listening on `addr` (a test host's bridge, say).
    pub async fn start_on(addr: &str, script: Vec<Scripted>) -> Self {
        let shared = Shared { script: Arc::new(Mutex::new(script.into())), seen: Default::default() };
        let app = axum::Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeProvider { base_url: format!("http://{addr}"), shared, _task: task }
    }

    /// Requests received so far: headers and JSON body.
    pub fn requests(&self) -> Vec<(HeaderMap, Value)> {
        self.shared.seen.lock().unwrap().clone()
    }

    pub fn push(&self, s: Scripted) {
        self.shared.script.lock().unwrap().push_back(s);
    }

    /// Answers scripted and not yet used.
    pub fn pending(&self) -> usize {
        self.shared.script.lock().unwrap().len()
    }

    /// Drop the next scripted answer.
    pub fn pop(&self) -> Option<Scripted> {
        self.shared.script.lock().unwrap().pop_front()
    }
}

async fn handle(
    State(shared): State<Shared>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    // Refuse what the real API refuses, before the script is consumed.
    let violation = if uri.path().ends_with("/messages") {
        super::provider_rules::anthropic_violation(&json)
            .map(|m| serde_json::json!({"type": "error", "error": {"type": "invalid_request_error", "message": m}}))
    } else if uri.path().ends_with("/chat/completions") {
        super::provider_rules::openai_violation(&json)
            .map(|m| serde_json::json!({"error": {"message": m, "type": "invalid_request_error", "param": "messages"}}))
    } else {
        None
    };
    shared.seen.lock().unwrap().push((headers, json));
    if let Some(v) = violation {
        return Response::builder()
            .status(400)
            .header("content-type", "application/json")
            .body(Body::from(v.to_string()))
            .unwrap();
    }
    let next = shared.script.lock().unwrap().pop_front();
    if let Some(s) = &next
        && s.pause_ms > 0
    {
        tokio::time::sleep(std::time::Duration::from_millis(s.pause_ms)).await;
    }
    let Some(s) = next else {
        return Response::builder()
            .status(500)
            .body(Body::from("{\"error\":{\"message\":\"script exhausted\"}}"))
            .unwrap();
    };
    let mut b = Response::builder().status(StatusCode::from_u16(s.status).unwrap());
    for (k, v) in &s.headers {
        b = b.header(k, v);
    }
    let cut = s.cut;
    let chunks = s.chunks.clone();
    let stream = async_stream(chunks, cut, s.gap_ms);
    b.body(Body::from_stream(stream)).unwrap()
}

fn async_stream(
    chunks: Vec<String>,
    cut: bool,
    gap_ms: u64,
) -> impl futures_util::Stream<Item = Result<String, std::io::Error>> {
    use futures_util::StreamExt;
    let mut items: Vec<Result<String, std::io::Error>> = chunks.into_iter().map(Ok).collect();
    if cut {
        items.push(Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "cut")));
    }
    futures_util::stream::iter(items.into_iter().enumerate()).then(move |(n, i)| async move {
        let gap = if n > 0 { gap_ms } else { 0 };
        tokio::time::sleep(std::time::Duration::from_millis(2 + gap)).await;
        i
    })
}

/// Anthropic SSE frames for a text reply in several deltas.
pub fn anthropic_text(parts: &[&str], input_tokens: u64, output_tokens: u64) -> Vec<String> {
    let mut f = vec![
        frame(
            "message_start",
            &format!(
                r#"{{"type":"message_start","message":{{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-test","usage":{{"input_tokens":{input_tokens},"output_tokens":1}}}}}}"#
            ),
        ),
        frame(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
        frame("ping", r#"{"type":"ping"}"#),
    ];
    for p in parts {
        f.push(frame(
            "content_block_delta",
            &format!(
                r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":{}}}}}"#,
                serde_json::to_string(p).unwrap()
            ),
        ));
    }
    f.push(frame("content_block_stop", r#"{"type":"content_block_stop","index":0}"#));
    f.push(frame("message_delta", &format!(r#"{{"type":"message_delta","delta":{{"stop_reason":"end_turn","stop_sequence":null}},"usage":{{"output_tokens":{output_tokens}}}}}"#)));
    f.push(frame("message_stop", r#"{"type":"message_stop"}"#));
    f
}

/// Anthropic SSE frames for one tool call, its JSON split in two deltas.
pub fn anthropic_tool(id: &str, name: &str, input_json: &str) -> Vec<String> {
    let (a, b) = input_json.split_at(input_json.len() / 2);
    vec![
        frame(
            "message_start",
            r#"{"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","content":[],"model":"claude-test","usage":{"input_tokens":50,"output_tokens":1}}}"#,
        ),
        frame(
            "content_block_start",
            &format!(
                r#"{{"type":"content_block_start","index":0,"content_block":{{"type":"tool_use","id":"{id}","name":"{name}","input":{{}}}}}}"#
            ),
        ),
        frame(
            "content_block_delta",
            &format!(
                r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"input_json_delta","partial_json":{}}}}}"#,
                serde_json::to_string(a).unwrap()
            ),
        ),
        frame(
            "content_block_delta",
            &format!(
                r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"input_json_delta","partial_json":{}}}}}"#,
                serde_json::to_string(b).unwrap()
            ),
        ),
        frame("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
        frame(
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":30}}"#,
        ),
        frame("message_stop", r#"{"type":"message_stop"}"#),
    ]
}

/// OpenAI chat-completion SSE chunks for a text reply.
pub fn openai_text(parts: &[&str], prompt: u64, completion: u64) -> Vec<String> {
    let mut f = vec![data(
        r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
    )];
    for p in parts {
        f.push(data(&format!(r#"{{"id":"c1","object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{"content":{}}},"finish_reason":null}}]}}"#, serde_json::to_string(p).unwrap())));
    }
    f.push(data(
        r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
    ));
    f.push(data(&format!(r#"{{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{completion},"total_tokens":{}}}}}"#, prompt + completion)));
    f.push("data: [DONE]\n\n".into());
    f
}

/// OpenAI chunks for one tool call.
pub fn openai_tool(id: &str, name: &str, args: &str) -> Vec<String> {
    let (a, b) = args.split_at(args.len() / 2);
    vec![
        data(&format!(
            r#"{{"choices":[{{"index":0,"delta":{{"role":"assistant","tool_calls":[{{"index":0,"id":"{id}","type":"function","function":{{"name":"{name}","arguments":""}}}}]}}}}]}}"#
        )),
        data(&format!(
            r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":{}}}}}]}}}}]}}"#,
            serde_json::to_string(a).unwrap()
        )),
        data(&format!(
            r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":{}}}}}]}}}}]}}"#,
            serde_json::to_string(b).unwrap()
        )),
        data(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#),
        data(r#"{"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":12}}"#),
        "data: [DONE]\n\n".into(),
    ]
}

pub fn frame(event: &str, data: &str) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

pub fn data(d: &str) -> String {
    format!("data: {d}\n\n")
}
