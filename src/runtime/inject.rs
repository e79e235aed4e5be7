//! `loop_inject` (runtime.md §7.3): code-authored user context for the model.
//!
//! The row is written to the loop at once (the audit trail), in the v2 wire
//! format `[Context: <category> | loop_inject=v2 | origin=<src>[ | key=<k>]] <content>`,
//! and the text waits in a queue until the next model boundary, where the
//! executor adds it to the transcript (never between a `tool_use` and its
//! result). A key coalesces what is still pending; after a restart only the
//! latest keyed entry of each key is queued again, unkeyed ones are one-shot
//! notices and are not replayed.

use std::sync::{Arc, Mutex};

use serde_json::Value;

/// One queued injection: the exact row text, its loop seq and its key.
#[derive(Debug, Clone, PartialEq)]
pub struct Injection {
    pub text: String,
    pub key: Option<String>,
    pub seq: i64,
}

/// The queue shared by the executor and whatever code queues context (the
/// sandbox's `adf.loop_inject`, triggers), so an injection made outside a
/// turn waits for the next one.
#[derive(Debug, Clone, Default)]
pub struct InjectQueue(Arc<Mutex<Vec<Injection>>>);

impl InjectQueue {
    /// Queue one; the same key replaces a pending one.
    pub fn push(&self, inj: Injection) {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = &inj.key {
            q.retain(|p| p.key.as_ref() != Some(k));
        }
        q.push(inj);
    }

    /// Everything pending, oldest first, leaving the queue empty.
    pub fn drain(&self) -> Vec<Injection> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.lock().map(|q| q.is_empty()).unwrap_or(true)
    }
}

/// A rejected call, with the code-call error code of runtime.md §7.3.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct InjectError {
    pub code: &'static str,
    pub message: String,
}

fn invalid(message: impl Into<String>) -> InjectError {
    InjectError { code: "INVALID_INPUT", message: message.into() }
}

fn category_ok(s: &str) -> bool {
    let mut c = s.chars();
    c.next().is_some_and(|f| f.is_ascii_lowercase())
        && s.len() <= 64
        && c.all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "_.-".contains(ch))
}

fn key_ok(s: &str) -> bool {
    (1..=128).contains(&s.len()) && s.chars().all(|ch| ch.is_ascii_alphanumeric() || "_.:-".contains(ch))
}

fn origin_ok(s: &str) -> bool {
    (1..=128).contains(&s.len()) && s.chars().all(|ch| ch.is_ascii_alphanumeric() || "_.:/-".contains(ch))
}

/// Check the arguments and build the row text (and the key). `max_chars` is
/// `max_tool_result_tokens × 3`; `origin` is derived by the runtime, never
/// taken from the caller.
pub fn build(args: &Value, max_chars: usize, origin: &str) -> Result<(String, Option<String>), InjectError> {
    let Some(obj) = args.as_object() else { return Err(invalid("loop_inject takes an object of arguments")) };
    let Some(content) = obj.get("content").and_then(Value::as_str) else {
        return Err(invalid("loop_inject requires a string \"content\""));
    };
    let chars = content.chars().count();
    if chars > max_chars {
        return Err(invalid(format!("loop_inject content exceeds the {max_chars} character limit ({chars} given)")));
    }
    match obj.get("role") {
        None | Some(Value::Null) => {}
        Some(Value::String(r)) if r == "user" => {}
        Some(_) => {
            return Err(invalid(
                "loop_inject only supports role: \"user\". Synthetic assistant, system, and tool-call messages are not supported.",
            ));
        }
    }
    let category = match obj.get("category") {
        None | Some(Value::Null) => "loop_inject",
        Some(Value::String(c)) if category_ok(c) => c,
        Some(_) => return Err(invalid("loop_inject category must match /^[a-z][a-z0-9_.-]{0,63}$/")),
    };
    let key = match obj.get("key") {
        None | Some(Value::Null) => None,
        Some(Value::String(k)) if key_ok(k) => Some(k.clone()),
        Some(_) => return Err(invalid("loop_inject key contains unsupported characters")),
    };
    let origin = if origin_ok(origin) { origin } else { "unknown" };
    let key_part = key.as_deref().map(|k| format!(" | key={k}")).unwrap_or_default();
    Ok((format!("[Context: {category} | loop_inject=v2 | origin={origin}{key_part}] {content}"), key))
}

/// A keyed v2 row read back from the loop (to queue again after a restart);
/// unkeyed and malformed rows give `None`.
pub fn parse_keyed(text: &str, seq: i64) -> Option<Injection> {
    let rest = text.strip_prefix("[Context: ")?;
    let (head, _content) = rest.split_once("] ")?;
    let mut parts = head.split(" | ");
    let category = parts.next()?;
    if !category_ok(category) || parts.next()? != "loop_inject=v2" {
        return None;
    }
    if !origin_ok(parts.next()?.strip_prefix("origin=")?) {
        return None;
    }
    let key = parts.next()?.strip_prefix("key=")?;
    if !key_ok(key) || parts.next().is_some() {
        return None;
    }
    Some(Injection { text: text.to_string(), key: Some(key.to_string()), seq })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn builds_the_v2_row() {
        let (t, k) = build(&json!({"content": "x"}), 10, "lambda:a.js").unwrap();
        assert_eq!(t, "[Context: loop_inject | loop_inject=v2 | origin=lambda:a.js] x");
        assert_eq!(k, None);
        let (t, k) = build(&json!({"content": "y", "category": "weather", "key": "city:oslo"}), 10, "code").unwrap();
        assert_eq!(t, "[Context: weather | loop_inject=v2 | origin=code | key=city:oslo] y");
        assert_eq!(k.as_deref(), Some("city:oslo"));
        assert_eq!(parse_keyed(&t, 4).unwrap().key.as_deref(), Some("city:oslo"));
        assert_eq!(parse_keyed("[Context: loop_inject | loop_inject=v2 | origin=code] z", 1), None);
    }

    #[test]
    fn rejects_bad_arguments() {
        for args in [
            json!({"content": "x", "role": "assistant"}),
            json!({"content": "x", "role": "system"}),
            json!({"content": "x", "category": "Bad"}),
            json!({"content": "x", "key": "a b"}),
            json!({"content": "x".repeat(11)}),
            json!({"role": "user"}),
        ] {
            assert_eq!(build(&args, 10, "code").unwrap_err().code, "INVALID_INPUT", "{args}");
        }
    }

    #[test]
    fn same_key_replaces_pending() {
        let q = InjectQueue::default();
        q.push(Injection { text: "a1".into(), key: Some("a".into()), seq: 1 });
        q.push(Injection { text: "n".into(), key: None, seq: 2 });
        q.push(Injection { text: "a2".into(), key: Some("a".into()), seq: 3 });
        let got: Vec<_> = q.drain().into_iter().map(|i| i.text).collect();
        assert_eq!(got, ["n", "a2"]);
        assert!(q.is_empty());
    }
}
