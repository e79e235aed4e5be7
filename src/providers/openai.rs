//! OpenAI chat completions, streaming, and every endpoint that speaks it
//! (OpenRouter, Ollama, llama.cpp, vLLM, LM Studio, Groq, Together…): the
//! conversion from loop-row blocks to chat messages, and the delta parser.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::sse::{self, Parser, SseEvent};
use super::{Effort, ErrorKind, EventStream, Message, ModelEvent, ModelRequest, Provider, ProviderError, Role, Usage};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

pub struct OpenAi {
    pub id: String,
    pub base_url: String,
    pub api_key: Option<String>,
    client: reqwest::Client,
}

impl OpenAi {
    pub fn new(id: &str, base_url: &str, api_key: Option<&str>) -> Self {
        Self::on(id, base_url, api_key, super::http_client())
    }

    /// The provider on `client` (one a fleet's agents share).
    pub fn on(id: &str, base_url: &str, api_key: Option<&str>, client: reqwest::Client) -> Self {
        OpenAi {
            id: id.to_string(),
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key: api_key.map(str::to_string),
            client,
        }
    }
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Loop-row messages as chat messages: tool results become `tool` messages,
/// tool uses become `tool_calls`, reasoning blocks stay out.
pub fn messages(system: &str, msgs: &[Message]) -> Vec<Value> {
    let mut out = Vec::with_capacity(msgs.len() + 1);
    if !system.is_empty() {
        out.push(json!({"role": "system", "content": system}));
    }
    for m in msgs {
        match m.role {
            Role::User => {
                let mut text = Vec::new();
                // A tool message carries text only: media a result showed
                // follows in a user message of its own.
                let mut media: Vec<Value> = Vec::new();
                for b in &m.content {
                    match b["type"].as_str() {
                        Some("tool_result") => {
                            out.push(json!({
                                "role": "tool",
                                "tool_call_id": b["tool_use_id"],
                                "content": text_of(&b["content"]),
                            }));
                            if let Some(parts) = b["content"].as_array() {
                                media.extend(parts.iter().filter(|p| crate::providers::is_media(p)).cloned());
                            }
                        }
                        Some("text") => text.push(b["text"].as_str().unwrap_or("").to_string()),
                        _ if crate::providers::is_media(b) => media.push(b.clone()),
                        _ => {}
                    }
                }
                if !media.is_empty() {
                    let mut parts: Vec<Value> = text.iter().map(|t| json!({"type": "text", "text": t})).collect();
                    parts.extend(media);
                    out.push(json!({"role": "user", "content": parts}));
                } else if !text.is_empty() {
                    out.push(json!({"role": "user", "content": text.join("\n")}));
                }
            }
            Role::Assistant => {
                let text: String =
                    m.content.iter().filter(|b| b["type"] == "text").filter_map(|b| b["text"].as_str()).collect();
                let calls: Vec<Value> = m
                    .content
                    .iter()
                    .filter(|b| b["type"] == "tool_use")
                    .map(|b| {
                        json!({
                            "id": b["id"],
                            "type": "function",
                            "function": {"name": b["name"], "arguments": b["input"].to_string()},
                        })
                    })
                    .collect();
                let mut msg = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { Value::String(text) }});
                if !calls.is_empty() {
                    msg["tool_calls"] = Value::Array(calls);
                }
                out.push(msg);
            }
        }
    }
    out
}

fn with_trailing(mut msgs: Vec<Value>, trailing: Option<&str>) -> Vec<Value> {
    if let Some(t) = trailing {
        msgs.push(json!({"role": "user", "content": t}));
    }
    msgs
}

fn effort_name(e: Effort) -> &'static str {
    match e {
        Effort::Minimal => "minimal",
        Effort::Low => "low",
        Effort::Medium => "medium",
        Effort::High | Effort::Xhigh => "high",
    }
}

/// The request body.
pub fn body(req: &ModelRequest) -> Value {
    let mut b = json!({
        "model": req.model,
        "messages": with_trailing(messages(&req.system, &req.messages), req.trailing.as_deref()),
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": req.max_tokens,
    });
    if !req.tools.is_empty() {
        b["tools"] = Value::Array(
            req.tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}})
                })
                .collect(),
        );
    }
    if let Some(t) = req.temperature {
        b["temperature"] = json!(t);
    }
    if let Some(e) = req.effort {
        b["reasoning_effort"] = json!(effort_name(e));
    }
    b
}

impl Provider for OpenAi {
    fn id(&self) -> &str {
        &self.id
    }

    fn stream(&self, req: ModelRequest) -> futures_util::future::BoxFuture<'_, Result<EventStream, ProviderError>> {
        Box::pin(async move {
            let mut http = self.client.post(format!("{}/chat/completions", self.base_url)).json(&body(&req));
            if let Some(key) = &self.api_key {
                http = http.bearer_auth(key);
            }
            let resp = sse::send(&self.id, http).await?;
            Ok(sse::parse(&self.id, resp, ChatParser::new(&self.id)))
        })
    }
}

#[derive(Default)]
struct Call {
    id: String,
    name: String,
    args: String,
}

/// Parser state for one chat-completions stream.
pub struct ChatParser {
    provider: String,
    calls: BTreeMap<u64, Call>,
    finish: Option<String>,
    usage: Option<Usage>,
    done: bool,
}

impl ChatParser {
    pub fn new(provider: &str) -> Self {
        ChatParser { provider: provider.to_string(), calls: BTreeMap::new(), finish: None, usage: None, done: false }
    }

    fn complete(&mut self) -> Vec<ModelEvent> {
        if self.done {
            return Vec::new();
        }
        self.done = true;
        let mut out: Vec<ModelEvent> = std::mem::take(&mut self.calls)
            .into_values()
            .map(|c| {
                let input = if c.args.trim().is_empty() {
                    json!({})
                } else {
                    serde_json::from_str(&c.args).unwrap_or(Value::String(c.args))
                };
                ModelEvent::ToolCall { id: c.id, name: c.name, input }
            })
            .collect();
        if let Some(u) = self.usage {
            out.push(ModelEvent::Usage(u));
        }
        out.push(ModelEvent::Stop(self.finish.take().unwrap_or_else(|| "stop".into())));
        out
    }
}

impl Parser for ChatParser {
    fn feed(&mut self, e: SseEvent) -> Result<Vec<ModelEvent>, ProviderError> {
        let data = e.data.trim();
        if data.is_empty() {
            return Ok(Vec::new());
        }
        if data == "[DONE]" {
            return Ok(self.complete());
        }
        let v: Value = serde_json::from_str(data).map_err(|_| {
            ProviderError::new(&self.provider, ErrorKind::Transient, None, "malformed stream: a chunk is not JSON")
        })?;
        if let Some(err) = v.get("error") {
            let msg = err["message"].as_str().unwrap_or("provider error").to_string();
            return Err(ProviderError::new(&self.provider, ErrorKind::Structural, None, msg));
        }
        let mut out = Vec::new();
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let n = |p: &str| u.pointer(p).and_then(Value::as_u64);
            self.usage = Some(Usage {
                input: n("/prompt_tokens").unwrap_or(0),
                output: n("/completion_tokens").unwrap_or(0),
                cache_read: n("/prompt_tokens_details/cached_tokens"),
                cache_write: None,
                reasoning: n("/completion_tokens_details/reasoning_tokens"),
                cost: u.get("cost").and_then(Value::as_f64).filter(|c| c.is_finite() && *c >= 0.0),
            });
        }
        for choice in v["choices"].as_array().into_iter().flatten() {
            let d = &choice["delta"];
            for key in ["reasoning_content", "reasoning"] {
                if let Some(r) = d[key].as_str().filter(|r| !r.is_empty()) {
                    out.push(ModelEvent::ReasoningDelta(r.to_string()));
                }
            }
            if let Some(t) = d["content"].as_str().filter(|t| !t.is_empty()) {
                out.push(ModelEvent::TextDelta(t.to_string()));
            }
            for tc in d["tool_calls"].as_array().into_iter().flatten() {
                let idx = tc["index"].as_u64().unwrap_or(0);
                let call = self.calls.entry(idx).or_default();
                if let Some(id) = tc["id"].as_str() {
                    call.id = id.to_string();
                }
                if let Some(n) = tc["function"]["name"].as_str() {
                    call.name.push_str(n);
                }
                if let Some(a) = tc["function"]["arguments"].as_str() {
                    call.args.push_str(a);
                }
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                self.finish = Some(f.to_string());
            }
        }
        Ok(out)
    }

    fn end(&mut self) -> Vec<ModelEvent> {
        // Some servers stop without `[DONE]`: a finish reason is enough.
        if self.finish.is_some() { self.complete() } else { Vec::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(p: &mut ChatParser, data: &str) -> Vec<ModelEvent> {
        p.feed(SseEvent { event: String::new(), data: data.into() }).unwrap()
    }

    #[test]
    fn text_tool_calls_usage_done() {
        let mut p = ChatParser::new("openai");
        assert_eq!(
            feed(&mut p, r#"{"choices":[{"delta":{"role":"assistant","content":"Hi"}}]}"#),
            [ModelEvent::TextDelta("Hi".into())]
        );
        feed(
            &mut p,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"fs_read","arguments":""}}]}}]}"#,
        );
        feed(&mut p, r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\":"}}]}}]}"#);
        feed(&mut p, r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"a.md\"}"}}]}}]}"#);
        feed(&mut p, r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#);
        feed(&mut p, r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7}}"#);
        let end = feed(&mut p, "[DONE]");
        assert_eq!(
            end,
            [
                ModelEvent::ToolCall { id: "call_1".into(), name: "fs_read".into(), input: json!({"path": "a.md"}) },
                ModelEvent::Usage(Usage { input: 12, output: 7, ..Default::default() }),
                ModelEvent::Stop("tool_calls".into()),
            ]
        );
        assert!(p.end().is_empty());
    }

    #[test]
    fn no_finish_no_response() {
        let mut p = ChatParser::new("openai");
        feed(&mut p, r#"{"choices":[{"delta":{"content":"cut"}}]}"#);
        assert!(p.end().is_empty());
    }

    #[test]
    fn loop_rows_become_chat_messages() {
        let msgs = vec![
            Message { role: Role::User, content: vec![json!({"type":"text","text":"hi"})] },
            Message {
                role: Role::Assistant,
                content: vec![
                    json!({"type":"thinking","thinking":"…"}),
                    json!({"type":"tool_use","id":"t1","name":"fs_read","input":{"path":"a"}}),
                ],
            },
            Message {
                role: Role::User,
                content: vec![json!({"type":"tool_result","tool_use_id":"t1","content":"data"})],
            },
        ];
        let m = messages("sys", &msgs);
        assert_eq!(m[0], json!({"role":"system","content":"sys"}));
        assert_eq!(m[1], json!({"role":"user","content":"hi"}));
        assert_eq!(m[2]["content"], Value::Null);
        assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], "{\"path\":\"a\"}");
        assert_eq!(m[3], json!({"role":"tool","tool_call_id":"t1","content":"data"}));
    }
}
