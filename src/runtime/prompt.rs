//! Prompt assembly (runtime.md §3): the system prompt from the base prompt,
//! the agent's instructions and identity, templated over its files; and the
//! provider-bound messages built from loop rows, decorated with timestamps
//! and `[S<seq>]` citation markers that are never stored.

use std::sync::Arc;

use serde_json::Value;

use crate::providers::{Message, Role};
use crate::store::Store;
use crate::store::loop_rows::LoopRow;
use crate::store::template::Snapshot;

/// The default base prompt (an owner-editable setting later).
pub const BASE_PROMPT: &str = "You are an agent that lives in a single file. Your memory is your files: \
{{mind.md}} is your index, injected on every turn; keep it short and put details in pages under mind/. \
{{soul.md}} is your voice. Record what you learn as you go, cite loop messages as [S<seq>] when you do, \
and prefer small, verifiable steps. Use tools to act; plain text is your reply to your principal.";

const SEP: &str = "\n\n---\n\n";

/// Build the system prompt. `snapshot` holds the session's file reads.
pub fn system_prompt(store: &Store, cfg: &Value, snapshot: &mut Snapshot) -> String {
    let mut parts: Vec<String> = Vec::new();
    if cfg.get("include_base_prompt").and_then(Value::as_bool) != Some(false) {
        parts.push(BASE_PROMPT.to_string());
    }
    if let Some(i) = cfg.get("instructions").and_then(Value::as_str).filter(|i| !i.trim().is_empty()) {
        parts.push(format!("## Agent-Specific Instructions\n\n{i}"));
    }
    let s = |p: &str| cfg.pointer(p).and_then(Value::as_str).unwrap_or("");
    parts.push(format!(
        "## Your Identity\n\nName: {}\nProvider: {}\nModel: {}\nID: {}",
        s("/name"),
        s("/model/provider"),
        s("/model/model_id"),
        s("/id")
    ));
    let joined = parts.join(SEP);
    let mut out = snapshot.render(&joined, |p| store.file_read_text(p).ok());
    if is_autonomous(cfg) {
        out.push_str(SEP);
        out.push_str(
            "## Autonomous Mode\n\nYou work without waiting for replies. Keep going with tools until the work is done, \
             then call sys_set_state(\"idle\") to rest.",
        );
    }
    out
}

/// `loop_mode` wins over `autonomous` when present.
pub fn is_autonomous(cfg: &Value) -> bool {
    match cfg.get("loop_mode").and_then(Value::as_str) {
        Some(m) => m == "autonomous",
        None => cfg.get("autonomous").and_then(Value::as_bool).unwrap_or(false),
    }
}

/// Whether a row is a `[Context: …]` row (the system prompt, dynamic
/// instructions, `loop_inject`): audit only, never replayed as history.
pub fn is_context_row(r: &LoopRow) -> bool {
    context_text(r).is_some()
}

/// The text of a `[Context: …]` row.
pub fn context_text(r: &LoopRow) -> Option<&str> {
    if r.role != "user" {
        return None;
    }
    match &r.content {
        Value::String(s) => Some(s.as_str()),
        Value::Array(a) => a.first().and_then(|b| b["text"].as_str()),
        _ => None,
    }
    .filter(|t| t.starts_with("[Context: "))
}

fn stamp(created_at: i64) -> String {
    chrono::DateTime::from_timestamp_millis(created_at)
        .map(|d| d.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default()
}

/// One loop row as provider content, or `None` for rows never replayed.
fn row_message(r: &LoopRow) -> Option<Message> {
    if is_context_row(r) {
        return None;
    }
    let role = if r.role == "assistant" { Role::Assistant } else { Role::User };
    let mut content: Vec<Value> = match &r.content {
        Value::Array(a) => a.clone(),
        Value::String(s) => vec![serde_json::json!({"type": "text", "text": s})],
        _ => return None,
    };
    // Assistant text is left as the model wrote it: a timestamp there
    // invites the model to start imitating it.
    if role == Role::User
        && let Some(b) = content.iter_mut().find(|b| b["type"] == "text")
        && let Some(t) = b["text"].as_str()
    {
        b["text"] = Value::String(format!("[{}] [S{}] {t}", stamp(r.created_at), r.seq));
    }
    Some(Message { role, content })
}

/// Provider messages from loop rows: consecutive rows of the same role are
/// merged; the first text of a user row gets `[<time>] [S<seq>] `.
pub fn messages(rows: &[LoopRow]) -> Vec<Message> {
    let mut out = build(rows);
    strip_dangling(&mut out);
    out
}

/// Merged messages with orphaned results dropped; calls still waiting for
/// results at the end are kept (they may be answered by the next row).
fn build(rows: &[LoopRow]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::new();
    for m in rows.iter().filter_map(row_message) {
        push(&mut out, m);
    }
    drop_orphans(&mut out);
    out
}

fn push(out: &mut Vec<Message>, m: Message) {
    match out.last_mut() {
        Some(last) if last.role == m.role => last.content.extend(m.content),
        _ => out.push(m),
    }
}

/// The provider-bound transcript of a session, built once and extended as
/// rows are appended; each call shares it instead of copying the history.
#[derive(Debug, Default)]
pub struct Transcript {
    msgs: Arc<Vec<Message>>,
    folded: usize,
}

impl Transcript {
    /// Build from a whole session.
    pub fn rebuild(&mut self, rows: &[LoopRow]) {
        self.msgs = Arc::new(build(rows));
        self.folded = rows.len();
    }

    /// Fold in one appended row.
    pub fn push(&mut self, row: &LoopRow) {
        self.folded += 1;
        let Some(mut m) = row_message(row) else { return };
        let msgs = Arc::make_mut(&mut self.msgs);
        if m.role == Role::User {
            // Results must answer the assistant message just before.
            let uses: Vec<&str> = msgs
                .last()
                .filter(|l| l.role == Role::Assistant)
                .map(|l| {
                    l.content.iter().filter(|b| b["type"] == "tool_use").filter_map(|b| b["id"].as_str()).collect()
                })
                .unwrap_or_default();
            m.content.retain(|b| {
                b["type"] != "tool_result" || b["tool_use_id"].as_str().is_some_and(|id| uses.contains(&id))
            });
            if m.content.is_empty() {
                return;
            }
        }
        push(msgs, m);
    }

    /// Add queued `loop_inject` context at a model boundary (its row is
    /// already in the loop, as an audit-only context row).
    pub fn push_injection(&mut self, text: &str) {
        let m = Message { role: Role::User, content: vec![serde_json::json!({"type": "text", "text": text})] };
        push(Arc::make_mut(&mut self.msgs), m);
    }

    /// Rows folded in so far.
    pub fn rows(&self) -> usize {
        self.folded
    }

    /// The messages to send: shared, unless the last assistant message has
    /// calls without results (then a copy without them).
    pub fn view(&self) -> Arc<Vec<Message>> {
        let dangling = self
            .msgs
            .last()
            .is_some_and(|m| m.role == Role::Assistant && m.content.iter().any(|b| b["type"] == "tool_use"));
        if !dangling {
            return self.msgs.clone();
        }
        let mut v = (*self.msgs).clone();
        strip_dangling(&mut v);
        Arc::new(v)
    }

    /// Forget everything (compaction, clear).
    pub fn reset(&mut self) {
        *self = Transcript::default();
    }
}

/// Drop `tool_result` blocks whose `tool_use` is not in the previous
/// assistant message, and `tool_use` blocks left unanswered at the end, so
/// providers accept the history (runtime.md §9.4).
fn drop_orphans(msgs: &mut Vec<Message>) {
    let mut prev_uses: Vec<String> = Vec::new();
    for m in msgs.iter_mut() {
        match m.role {
            Role::Assistant => {
                prev_uses = m
                    .content
                    .iter()
                    .filter(|b| b["type"] == "tool_use")
                    .filter_map(|b| b["id"].as_str().map(String::from))
                    .collect();
            }
            Role::User => {
                m.content.retain(|b| {
                    b["type"] != "tool_result"
                        || b["tool_use_id"].as_str().is_some_and(|id| prev_uses.iter().any(|u| u == id))
                });
                prev_uses.clear();
            }
        }
    }
    msgs.retain(|m| !m.content.is_empty());
}

/// Calls at the very end that were never answered are not sent.
fn strip_dangling(msgs: &mut Vec<Message>) {
    if let Some(last) = msgs.last_mut()
        && last.role == Role::Assistant
    {
        last.content.retain(|b| b["type"] != "tool_use");
    }
    msgs.retain(|m| !m.content.is_empty());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(seq: i64, role: &str, content: Value) -> LoopRow {
        LoopRow { seq, role: role.into(), content, model: None, tokens: None, created_at: 0, ord: None }
    }

    #[test]
    fn decoration_merging_and_pairing() {
        let rows = vec![
            row(1, "user", json!([{"type": "text", "text": "hi"}])),
            row(2, "assistant", json!([{"type": "tool_use", "id": "t1", "name": "fs_list", "input": {}}])),
            row(
                3,
                "user",
                json!([{"type": "tool_result", "tool_use_id": "t1", "content": "[]"}, {"type": "tool_result", "tool_use_id": "zz", "content": "x"}]),
            ),
            row(4, "user", json!([{"type": "text", "text": "[Context: system_prompt] ..."}])),
            row(
                5,
                "assistant",
                json!([{"type": "text", "text": "done"}, {"type": "tool_use", "id": "t2", "name": "x", "input": {}}]),
            ),
        ];
        let m = messages(&rows);
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].content[0]["text"], "[1970-01-01 00:00:00 UTC] [S1] hi");
        assert_eq!(m[2].content.len(), 1, "orphan result dropped");
        assert_eq!(m[3].content.len(), 1, "dangling tool_use dropped");
    }

    #[test]
    fn incremental_transcript_equals_a_full_build() {
        let all = [
            row(1, "user", json!([{"type": "text", "text": "hi"}])),
            row(
                2,
                "assistant",
                json!([{"type": "text", "text": "let me look"}, {"type": "tool_use", "id": "t1", "name": "fs_list", "input": {}}]),
            ),
            row(3, "user", json!([{"type": "tool_result", "tool_use_id": "t1", "content": "[]"}])),
            row(4, "user", json!([{"type": "text", "text": "[Context: dynamic_instructions] x"}])),
            row(5, "assistant", json!([{"type": "text", "text": "done"}])),
            row(6, "user", json!([{"type": "text", "text": "next"}])),
            row(7, "user", json!([{"type": "tool_result", "tool_use_id": "zz", "content": "orphan"}])),
            row(8, "assistant", json!([{"type": "tool_use", "id": "t9", "name": "x", "input": {}}])),
        ];
        for split in 1..all.len() {
            let mut t = Transcript::default();
            t.rebuild(&all[..split]);
            for end in split + 1..=all.len() {
                t.push(&all[end - 1]);
                assert_eq!(*t.view(), messages(&all[..end]), "split {split} end {end}");
            }
            assert_eq!(t.rows(), all.len());
        }
    }
}
