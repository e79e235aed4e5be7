//! The history rules the real model APIs enforce, so the fake provider can
//! refuse what they refuse (HTTP 400) instead of hiding the bug: every tool
//! call answered in the very next message, results first (Anthropic), one
//! tool message per call before anything else (OpenAI), and no result that
//! answers a call the previous message did not make.

use serde_json::Value;

fn ids(blocks: &[Value], kind: &str, key: &str) -> Vec<String> {
    blocks.iter().filter(|b| b["type"] == kind).filter_map(|b| b[key].as_str().map(String::from)).collect()
}

/// Why Anthropic's Messages API would refuse this request body, if it would.
pub fn anthropic_violation(body: &Value) -> Option<String> {
    let msgs = body["messages"].as_array()?;
    let content = |m: &Value| -> Vec<Value> {
        match &m["content"] {
            Value::Array(a) => a.clone(),
            Value::String(s) => vec![serde_json::json!({"type": "text", "text": s})],
            _ => Vec::new(),
        }
    };
    let mut prev_uses: Vec<String> = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let blocks = content(m);
        if let Some(e) = anthropic_block_violation(i, m["role"].as_str().unwrap_or(""), &blocks) {
            return Some(e);
        }
        match m["role"].as_str() {
            Some("assistant") => {
                if !prev_uses.is_empty() {
                    return Some(format!(
                        "messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: {}",
                        prev_uses.join(", ")
                    ));
                }
                prev_uses = ids(&blocks, "tool_use", "id");
                if i + 1 == msgs.len() {
                    prev_uses.clear();
                }
            }
            Some("user") => {
                let results = ids(&blocks, "tool_result", "tool_use_id");
                if let Some(r) = results.iter().find(|r| !prev_uses.contains(r)) {
                    return Some(format!(
                        "messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: {r}. \
                         Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                    ));
                }
                if let Some(missing) = prev_uses.iter().find(|u| !results.contains(u)) {
                    return Some(format!(
                        "messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: {missing}"
                    ));
                }
                let first_other = blocks.iter().position(|b| b["type"] != "tool_result").unwrap_or(blocks.len());
                if blocks[first_other..].iter().any(|b| b["type"] == "tool_result") {
                    return Some(format!(
                        "messages.{i}.content: `tool_result` blocks must come first in a user message, before any text"
                    ));
                }
                prev_uses.clear();
            }
            other => return Some(format!("messages.{i}.role: unexpected role {other:?}")),
        }
    }
    None
}

/// Block types Anthropic takes per role, and the shape of image blocks.
fn anthropic_block_violation(i: usize, role: &str, blocks: &[Value]) -> Option<String> {
    let allowed: &[&str] = match role {
        "assistant" => &["text", "tool_use", "thinking", "redacted_thinking"],
        _ => &["text", "image", "document", "tool_result"],
    };
    let tag = |j: usize, t: &str| {
        format!("messages.{i}.content.{j}: Input tag '{t}' found using 'type' does not match any of the expected tags")
    };
    let image = |path: String, b: &Value| -> Option<String> {
        let src = &b["source"];
        let ok_type = ["image/jpeg", "image/png", "image/gif", "image/webp"].contains(&src["media_type"].as_str()?);
        if src["type"] != "base64" || !ok_type || src["data"].as_str().is_none_or(str::is_empty) {
            return Some(format!(
                "{path}.source: an image needs a base64 source with a jpeg, png, gif or webp media_type"
            ));
        }
        None
    };
    for (j, b) in blocks.iter().enumerate() {
        let t = b["type"].as_str().unwrap_or("");
        if !allowed.contains(&t) {
            return Some(tag(j, t));
        }
        if t == "image"
            && let Some(e) = image(format!("messages.{i}.content.{j}"), b)
        {
            return Some(e);
        }
        if t == "tool_result"
            && let Some(parts) = b["content"].as_array()
        {
            for (k, p) in parts.iter().enumerate() {
                match p["type"].as_str().unwrap_or("") {
                    "text" => {}
                    "image" => {
                        if let Some(e) = image(format!("messages.{i}.content.{j}.content.{k}"), p) {
                            return Some(e);
                        }
                    }
                    other => {
                        return Some(format!(
                            "messages.{i}.content.{j}.content.{k}: Input tag '{other}' found using 'type' does not match any of the expected tags"
                        ));
                    }
                }
            }
        }
    }
    None
}

/// Content parts OpenAI takes: text only in tool messages; text, images
/// (URL or data URI) and wav/mp3 audio in user messages.
fn openai_content_violation(i: usize, m: &Value) -> Option<String> {
    let parts = m["content"].as_array()?;
    let role = m["role"].as_str().unwrap_or("");
    for (j, p) in parts.iter().enumerate() {
        let t = p["type"].as_str().unwrap_or("");
        let ok = match (role, t) {
            (_, "text") => p["text"].is_string(),
            ("user", "image_url") => p["image_url"]["url"]
                .as_str()
                .is_some_and(|u| u.starts_with("https://") || u.starts_with("http://") || u.starts_with("data:image/")),
            ("user", "input_audio") => {
                p["input_audio"]["data"].is_string()
                    && matches!(p["input_audio"]["format"].as_str(), Some("wav" | "mp3"))
            }
            _ => false,
        };
        if !ok {
            return Some(format!(
                "Invalid value: '{t}'. Supported values for messages[{i}].content[{j}].type in a {role} message are not this one."
            ));
        }
    }
    None
}

/// Why OpenAI's chat completions API would refuse this request body.
pub fn openai_violation(body: &Value) -> Option<String> {
    let msgs = body["messages"].as_array()?;
    let mut waiting: Vec<String> = Vec::new();
    let mut answerable: Vec<String> = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        if let Some(e) = openai_content_violation(i, m) {
            return Some(e);
        }
        match m["role"].as_str() {
            Some("tool") => {
                let id = m["tool_call_id"].as_str().unwrap_or("");
                if !answerable.iter().any(|a| a == id) {
                    return Some(format!(
                        "messages.[{i}].role: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'"
                    ));
                }
                waiting.retain(|w| w != id);
            }
            _ => {
                if !waiting.is_empty() {
                    return Some(format!(
                        "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. \
                         The following tool_call_ids did not have response messages: {}",
                        waiting.join(", ")
                    ));
                }
                answerable.clear();
                if m["role"] == "assistant" {
                    let calls: Vec<String> = m["tool_calls"]
                        .as_array()
                        .map(|c| c.iter().filter_map(|c| c["id"].as_str().map(String::from)).collect())
                        .unwrap_or_default();
                    waiting = calls.clone();
                    answerable = calls;
                }
            }
        }
    }
    if !waiting.is_empty() {
        return Some(format!("tool_call_ids without response messages: {}", waiting.join(", ")));
    }
    None
}
