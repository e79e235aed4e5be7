//! The Anthropic Messages API, streaming: request body, headers, and the
//! SSE event parser (`message_start`, `content_block_*`, `message_delta`,
//! `message_stop`, `error`).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::sse::{self, Parser, SseEvent};
use super::{Effort, ErrorKind, EventStream, ModelEvent, ModelRequest, Provider, ProviderError, Usage};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
const VERSION: &str = "2023-06-01";

pub struct Anthropic {
    pub id: String,
    pub base_url: String,
    pub api_key: String,
    client: reqwest::Client,
}

impl Anthropic {
    pub fn new(id: &str, base_url: &str, api_key: &str) -> Self {
        Self::on(id, base_url, api_key, super::http_client())
    }

    /// The provider on `client` (one a fleet's agents share).
    pub fn on(id: &str, base_url: &str, api_key: &str, client: reqwest::Client) -> Self {
        Anthropic {
            id: id.to_string(),
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key: api_key.to_string(),
            client,
        }
    }
}

/// The thinking budget for an effort level.
fn budget(effort: Effort) -> u64 {
    match effort {
        Effort::Minimal => 1024,
        Effort::Low => 2048,
        Effort::Medium => 8192,
        Effort::High => 16384,
        Effort::Xhigh => 32768,
    }
}

/// The request body.
pub fn body(req: &ModelRequest) -> Value {
    let mut b = json!({
        "model": req.model,
        "max_tokens": req.max_tokens,
        "messages": wire_media(req.messages_json()),
        "stream": true,
    });
    if !req.system.is_empty() {
        b["system"] = Value::String(req.system.to_string());
    }
    if !req.tools.is_empty() {
        b["tools"] = serde_json::to_value(&req.tools).unwrap_or(Value::Null);
    }
    let thinking = req.reasoning_tokens.or(req.effort.map(budget));
    match thinking {
        Some(t) => {
            // Thinking needs room beyond the budget, and no temperature.
            let t = t.max(1024);
            b["thinking"] = json!({"type": "enabled", "budget_tokens": t});
            if req.max_tokens <= t {
                b["max_tokens"] = json!(t + req.max_tokens);
            }
        }
        None => {
            if let Some(temp) = req.temperature {
                b["temperature"] = json!(temp);
            }
        }
    }
    b
}

/// Media blocks in Anthropic's form: an image (data URI) becomes a base64
/// `image` block, in its tool result when it came with one; sound and video
/// are not taken by this API and stay out (the result's text names them).
fn wire_media(mut msgs: Value) -> Value {
    fn convert(parts: &mut Vec<Value>) {
        parts.retain_mut(|p| {
            if !crate::providers::is_media(p) {
                return true;
            }
            let Some((mime, data)) = p["image_url"]["url"].as_str().and_then(split_data_uri) else { return false };
            *p = json!({"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}});
            true
        });
    }
    for m in msgs.as_array_mut().into_iter().flatten() {
        let Some(blocks) = m.get_mut("content").and_then(Value::as_array_mut) else { continue };
        if blocks.iter().any(crate::providers::is_media) {
            convert(blocks);
        }
        for b in blocks.iter_mut().filter(|b| b["type"] == "tool_result") {
            if let Some(parts) = b.get_mut("content").and_then(Value::as_array_mut)
                && parts.iter().any(crate::providers::is_media)
            {
                convert(parts);
            }
        }
    }
    msgs
}

/// `data:<mime>;base64,<data>` → (mime, data).
fn split_data_uri(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (mime, data) = rest.split_once(";base64,")?;
    Some((mime, data))
}

impl Provider for Anthropic {
    fn id(&self) -> &str {
        &self.id
    }

    fn stream(&self, req: ModelRequest) -> futures_util::future::BoxFuture<'_, Result<EventStream, ProviderError>> {
        Box::pin(async move {
            let http = self
                .client
                .post(format!("{}/v1/messages", self.base_url))
                .header("x-api-key", &self.api_key)
                .header("anthropic-version", VERSION)
                .header("accept", "text/event-stream")
                .json(&body(&req));
            let resp = sse::send(&self.id, http).await?;
            Ok(sse::parse(&self.id, resp, MessagesParser::new(&self.id)))
        })
    }
}

#[derive(Default)]
struct Block {
    kind: String,
    id: String,
    name: String,
    json: String,
}

/// Parser state for one Messages stream.
pub struct MessagesParser {
    provider: String,
    blocks: BTreeMap<u64, Block>,
    usage: Usage,
    stop_reason: Option<String>,
}

impl MessagesParser {
    pub fn new(provider: &str) -> Self {
        MessagesParser {
            provider: provider.to_string(),
            blocks: BTreeMap::new(),
            usage: Usage::default(),
            stop_reason: None,
        }
    }

    fn bad(&self, what: &str) -> ProviderError {
        ProviderError::new(&self.provider, ErrorKind::Transient, None, format!("malformed stream: {what}"))
    }
}

fn usage_of(u: &Value) -> Usage {
    let n = |k: &str| u.get(k).and_then(Value::as_u64);
    Usage {
        input: n("input_tokens").unwrap_or(0),
        output: n("output_tokens").unwrap_or(0),
        cache_read: n("cache_read_input_tokens"),
        cache_write: n("cache_creation_input_tokens"),
        reasoning: None,
        cost: None,
    }
}

impl Parser for MessagesParser {
    fn feed(&mut self, e: SseEvent) -> Result<Vec<ModelEvent>, ProviderError> {
        if e.data.is_empty() {
            return Ok(Vec::new());
        }
        let v: Value = serde_json::from_str(&e.data).map_err(|_| self.bad("an event is not JSON"))?;
        let ty = v.get("type").and_then(Value::as_str).unwrap_or(e.event.as_str()).to_string();
        let mut out = Vec::new();
        match ty.as_str() {
            "message_start" => {
                self.usage.merge(usage_of(&v["message"]["usage"]));
            }
            "content_block_start" => {
                let idx = v["index"].as_u64().ok_or_else(|| self.bad("block without index"))?;
                let cb = &v["content_block"];
                let kind = cb["type"].as_str().unwrap_or("").to_string();
                if kind == "text"
                    && let Some(t) = cb["text"].as_str().filter(|t| !t.is_empty())
                {
                    out.push(ModelEvent::TextDelta(t.to_string()));
                }
                self.blocks.insert(
                    idx,
                    Block {
                        kind,
                        id: cb["id"].as_str().unwrap_or("").to_string(),
                        name: cb["name"].as_str().unwrap_or("").to_string(),
                        json: String::new(),
                    },
                );
            }
            "content_block_delta" => {
                let idx = v["index"].as_u64().ok_or_else(|| self.bad("delta without index"))?;
                let d = &v["delta"];
                match d["type"].as_str().unwrap_or("") {
                    "text_delta" => out.push(ModelEvent::TextDelta(d["text"].as_str().unwrap_or("").to_string())),
                    "thinking_delta" => {
                        out.push(ModelEvent::ReasoningDelta(d["thinking"].as_str().unwrap_or("").to_string()))
                    }
                    "signature_delta" => {
                        out.push(ModelEvent::ReasoningSignature(d["signature"].as_str().unwrap_or("").to_string()))
                    }
                    "input_json_delta" => {
                        let part = d["partial_json"].as_str().unwrap_or("");
                        match self.blocks.get_mut(&idx) {
                            Some(b) => b.json.push_str(part),
                            None => return Err(self.bad("tool input for an unknown block")),
                        }
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                let idx = v["index"].as_u64().ok_or_else(|| self.bad("stop without index"))?;
                if let Some(b) = self.blocks.remove(&idx)
                    && b.kind == "tool_use"
                {
                    let input = if b.json.trim().is_empty() {
                        json!({})
                    } else {
                        // Arguments that are not JSON reach the executor as a
                        // string, which answers the model with an error.
                        serde_json::from_str(&b.json).unwrap_or(Value::String(b.json))
                    };
                    out.push(ModelEvent::ToolCall { id: b.id, name: b.name, input });
                }
            }
            "message_delta" => {
                if let Some(r) = v["delta"]["stop_reason"].as_str() {
                    self.stop_reason = Some(r.to_string());
                }
                self.usage.merge(usage_of(&v["usage"]));
            }
            "message_stop" => {
                out.push(ModelEvent::Usage(self.usage));
                out.push(ModelEvent::Stop(self.stop_reason.take().unwrap_or_else(|| "end_turn".into())));
            }
            "error" => {
                let et = v["error"]["type"].as_str().unwrap_or("error");
                let msg = v["error"]["message"].as_str().unwrap_or("provider error");
                let kind = match et {
                    "overloaded_error" | "rate_limit_error" | "api_error" | "timeout_error" => ErrorKind::Transient,
                    "authentication_error" | "permission_error" | "billing_error" => ErrorKind::Auth,
                    _ => ErrorKind::Structural,
                };
                return Err(ProviderError::new(&self.provider, kind, None, format!("{et}: {msg}")));
            }
            _ => {}
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(frames: &[(&str, &str)]) -> Result<Vec<ModelEvent>, ProviderError> {
        let mut p = MessagesParser::new("anthropic");
        let mut out = Vec::new();
        for (ev, data) in frames {
            out.extend(p.feed(SseEvent { event: ev.to_string(), data: data.to_string() })?);
        }
        Ok(out)
    }

    #[test]
    fn text_and_tool_use() {
        let out = feed_all(&[
            ("message_start", r#"{"type":"message_start","message":{"usage":{"input_tokens":25,"output_tokens":1,"cache_read_input_tokens":3}}}"#),
            ("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#),
            ("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me"}}"#),
            ("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" look."}}"#),
            ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
            ("content_block_start", r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"fs_read","input":{}}}"#),
            ("content_block_delta", r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"path\": \"RE"}}"#),
            ("content_block_delta", r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"ADME.md\"}"}}"#),
            ("content_block_stop", r#"{"type":"content_block_stop","index":1}"#),
            ("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":40}}"#),
            ("message_stop", r#"{"type":"message_stop"}"#),
        ])
        .unwrap();
        assert_eq!(out[0], ModelEvent::TextDelta("Let me".into()));
        assert_eq!(
            out[2],
            ModelEvent::ToolCall { id: "toolu_1".into(), name: "fs_read".into(), input: json!({"path": "README.md"}) }
        );
        assert_eq!(
            out[3],
            ModelEvent::Usage(Usage { input: 25, output: 40, cache_read: Some(3), ..Default::default() })
        );
        assert_eq!(out[4], ModelEvent::Stop("tool_use".into()));
    }

    #[test]
    fn error_events_are_classified() {
        let e =
            feed_all(&[("error", r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#)])
                .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Transient);
        assert!(feed_all(&[("message_start", "{not json")]).is_err());
    }

    #[test]
    fn body_maps_effort_to_a_budget() {
        let req = ModelRequest {
            model: "m".into(),
            system: "s".into(),
            messages: Default::default(),
            tools: Default::default(),
            max_tokens: 4096,
            temperature: Some(0.7),
            effort: Some(Effort::High),
            reasoning_tokens: None,
            trailing: None,
        };
        let b = body(&req);
        assert_eq!(b["thinking"]["budget_tokens"], 16384);
        assert_eq!(b["max_tokens"], 16384 + 4096);
        assert!(b.get("temperature").is_none());
    }
}
