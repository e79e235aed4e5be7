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

/// The skills and knowledge-bundle sections (`None`: neither exists). They
/// read the agent's files and the fleet's skills folder, so the executor
/// builds them once a turn, not for every model request.
pub fn knowledge_sections(store: &Store, cfg: &Value) -> Option<String> {
    let skills = crate::knowledge::skills::index(store, Some(&crate::knowledge::skills::fleet_root()), cfg);
    let bundles = crate::knowledge::okf::bundles(store);
    let parts: Vec<String> =
        [crate::knowledge::skills::prompt_section(&skills), crate::knowledge::okf::prompt_section(&bundles)]
            .into_iter()
            .flatten()
            .collect();
    (!parts.is_empty()).then(|| parts.join(SEP))
}

/// Build the system prompt. `snapshot` holds the session's file reads;
/// `knowledge` is `knowledge_sections`, appended as it is.
pub fn system_prompt(store: &Store, cfg: &Value, snapshot: &mut Snapshot, knowledge: Option<&str>) -> String {
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
    let media = super::executor::media::Modalities::of(cfg);
    if media.any() {
        parts.push(format!(
            "## Multimodal Perception\n\nYou have native {} perception. When fs_read or `cat` in adf_shell reaches such \
             a file, the runtime attaches it right after the tool's result so you perceive it directly; attachments \
             leave the conversation after about two steps, so write down what matters. Media you hold as base64 text \
             can be saved with fs_write (encoding \"base64\" and its mime_type) and read back with fs_read.",
            media.names().join(", ")
        ));
    }
    let joined = parts.join(SEP);
    let mut out = snapshot.render(&joined, |p| store.file_read_text(p).ok());
    // Skills and bundles come after the templating: their text is never
    // expanded as a template.
    if let Some(k) = knowledge {
        out.push_str(SEP);
        out.push_str(k);
    }
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
    crate::store::loop_rows::context_text_of(&r.role, &r.content)
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
    pair_up(&mut out, 0, true);
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
    pair_up(&mut out, 0, false);
    out
}

/// The result sent for a call whose result never reached the loop (a
/// history written before that was guaranteed, or damaged).
const NO_RESULT: &str = "[No result was recorded for this call; its outcome is unknown]";

fn uses_of(m: &Message) -> Vec<&str> {
    if m.role != Role::Assistant {
        return Vec::new();
    }
    m.content.iter().filter(|b| b["type"] == "tool_use").filter_map(|b| b["id"].as_str()).collect()
}

/// Both providers' pairing rules from message `from` on: an assistant
/// message with calls is followed by a user message whose first blocks are
/// one result per call, in call order (Anthropic refuses text before them;
/// OpenAI needs a tool message per call before anything else). A call
/// without a result gets an error result once its user message is closed
/// (another message follows it) or `close` says the history is final; a
/// call at the very end is left for the next row to answer.
fn pair_up(msgs: &mut Vec<Message>, from: usize, close: bool) {
    let mut i = from;
    while i + 1 < msgs.len() {
        let uses: Vec<String> = uses_of(&msgs[i]).into_iter().map(String::from).collect();
        if uses.is_empty() {
            i += 1;
            continue;
        }
        if msgs[i + 1].role == Role::Assistant {
            msgs.insert(i + 1, Message { role: Role::User, content: Vec::new() });
        }
        let closed = close || i + 2 < msgs.len();
        order_results(&mut msgs[i + 1], &uses, closed);
        i += 2;
    }
}

fn order_results(m: &mut Message, uses: &[String], closed: bool) {
    let first_other = m.content.iter().position(|b| b["type"] != "tool_result").unwrap_or(m.content.len());
    let in_order = m.content[first_other..].iter().all(|b| b["type"] != "tool_result")
        && m.content[..first_other].len() == uses.len()
        && m.content[..first_other].iter().zip(uses).all(|(b, id)| b["tool_use_id"].as_str() == Some(id));
    if in_order {
        return;
    }
    let (mut results, rest): (Vec<Value>, Vec<Value>) =
        std::mem::take(&mut m.content).into_iter().partition(|b| b["type"] == "tool_result");
    let mut out = Vec::with_capacity(uses.len() + rest.len());
    for id in uses {
        match results.iter().position(|b| b["tool_use_id"].as_str() == Some(id)) {
            Some(p) => out.push(results.swap_remove(p)),
            None if closed => out.push(serde_json::json!({"type": "tool_result", "tool_use_id": id,
                "content": NO_RESULT, "is_error": true})),
            None => {}
        }
    }
    out.extend(rest);
    m.content = out;
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
    /// Messages holding media blocks (in memory only), oldest first.
    with_media: Vec<usize>,
}

/// Media stays in this many trailing messages (about two model steps).
const MEDIA_KEPT: usize = 4;

impl Transcript {
    /// Build from a whole session.
    pub fn rebuild(&mut self, rows: &[LoopRow]) {
        self.msgs = Arc::new(build(rows));
        self.folded = rows.len();
        self.with_media.clear();
    }

    /// Fold in one appended row.
    pub fn push(&mut self, row: &LoopRow) {
        self.folded += 1;
        let Some(mut m) = row_message(row) else { return };
        let msgs = Arc::make_mut(&mut self.msgs);
        if m.role == Role::User {
            // Results must answer the assistant message just before (the
            // user message they join may already hold text).
            let n = msgs.len();
            let uses: Vec<&str> = match msgs.last() {
                Some(l) if l.role == Role::Assistant => uses_of(l),
                Some(_) if n >= 2 => uses_of(&msgs[n - 2]),
                _ => Vec::new(),
            };
            m.content.retain(|b| {
                b["type"] != "tool_result" || b["tool_use_id"].as_str().is_some_and(|id| uses.contains(&id))
            });
            if m.content.is_empty() {
                return;
            }
        }
        push(msgs, m);
        // Only the newest pairs can change; earlier ones are settled.
        let from = msgs.len().saturating_sub(4);
        pair_up(msgs, from, false);
        self.drop_old_media();
    }

    /// Show the model what a tool result pointed at: the media blocks join
    /// that result's content in the newest message (never stored).
    pub fn attach_media(&mut self, tool_use_id: &str, blocks: Vec<Value>) {
        if blocks.is_empty() {
            return;
        }
        let msgs = Arc::make_mut(&mut self.msgs);
        let Some(i) = msgs.len().checked_sub(1) else { return };
        let Some(result) = msgs[i]
            .content
            .iter_mut()
            .find(|b| b["type"] == "tool_result" && b["tool_use_id"].as_str() == Some(tool_use_id))
        else {
            return;
        };
        let mut parts = match result["content"].take() {
            Value::Array(a) => a,
            Value::String(t) => vec![serde_json::json!({"type": "text", "text": t})],
            Value::Null => Vec::new(),
            other => vec![serde_json::json!({"type": "text", "text": other.to_string()})],
        };
        parts.extend(blocks);
        result["content"] = Value::Array(parts);
        if self.with_media.last() != Some(&i) {
            self.with_media.push(i);
        }
    }

    /// Whether any message still carries media.
    pub fn has_media(&self) -> bool {
        !self.with_media.is_empty()
    }

    /// Take every media block out (a provider refused them).
    pub fn strip_media(&mut self) {
        let msgs = Arc::make_mut(&mut self.msgs);
        for i in std::mem::take(&mut self.with_media) {
            if let Some(m) = msgs.get_mut(i) {
                strip_media_of(m);
            }
        }
    }

    fn drop_old_media(&mut self) {
        let keep_from = self.msgs.len().saturating_sub(MEDIA_KEPT);
        if self.with_media.first().is_none_or(|&i| i >= keep_from) {
            return;
        }
        let msgs = Arc::make_mut(&mut self.msgs);
        self.with_media.retain(|&i| {
            if i < keep_from {
                if let Some(m) = msgs.get_mut(i) {
                    strip_media_of(m);
                }
                false
            } else {
                true
            }
        });
    }

    /// Add queued `loop_inject` context at a model boundary (its row is
    /// already in the loop, as an audit-only context row).
    pub fn push_injection(&mut self, text: &str) {
        let m = Message { role: Role::User, content: vec![serde_json::json!({"type": "text", "text": text})] };
        push(Arc::make_mut(&mut self.msgs), m);
        self.drop_old_media();
    }

    /// Rows folded in so far.
    pub fn rows(&self) -> usize {
        self.folded
    }

    /// The messages to send: shared, unless the last assistant message has
    /// calls without results (then a copy without them).
    pub fn view(&self) -> Arc<Vec<Message>> {
        let n = self.msgs.len();
        let dangling = self
            .msgs
            .last()
            .is_some_and(|m| m.role == Role::Assistant && m.content.iter().any(|b| b["type"] == "tool_use"));
        // The last calls' user message is still open in the transcript; the
        // model is called now, so what is missing there is missing for good.
        let open = n >= 2 && {
            let uses = uses_of(&self.msgs[n - 2]);
            let answered = self.msgs[n - 1]
                .content
                .iter()
                .filter(|b| b["type"] == "tool_result")
                .filter(|b| b["tool_use_id"].as_str().is_some_and(|id| uses.contains(&id)))
                .count();
            answered < uses.len()
        };
        if !dangling && !open {
            return self.msgs.clone();
        }
        let mut v = (*self.msgs).clone();
        pair_up(&mut v, n.saturating_sub(2), true);
        strip_dangling(&mut v);
        Arc::new(v)
    }

    /// Forget everything (compaction, clear).
    pub fn reset(&mut self) {
        *self = Transcript::default();
    }
}

/// Media blocks out of a message's tool results: the result's text is
/// what stays (it already names the file).
fn strip_media_of(m: &mut Message) {
    for b in m.content.iter_mut().filter(|b| b["type"] == "tool_result") {
        if let Value::Array(parts) = &mut b["content"] {
            parts.retain(|p| !crate::providers::is_media(p));
            if let [only] = parts.as_slice()
                && only["type"] == "text"
            {
                b["content"] = only["text"].clone();
            }
        }
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

    fn uses_answered_first(m: &[Message]) {
        for (i, w) in m.windows(2).enumerate() {
            let uses = uses_of(&w[0]);
            if uses.is_empty() {
                continue;
            }
            assert_eq!(w[1].role, Role::User, "message {i}: calls followed by a user message");
            let results: Vec<&str> =
                w[1].content.iter().take(uses.len()).filter_map(|b| b["tool_use_id"].as_str()).collect();
            assert_eq!(results, uses, "message {i}: one result per call, first, in call order");
            assert!(
                w[1].content[uses.len()..].iter().all(|b| b["type"] != "tool_result"),
                "message {i}: no result after the text"
            );
        }
    }

    /// Histories written by crashes before the recovery wrote results
    /// first: a notice before the results, a call never answered, results
    /// out of order. What is sent satisfies both providers' rules, built
    /// whole or row by row.
    #[test]
    fn broken_histories_are_sent_paired() {
        let use_ = |id: &str| json!({"type": "tool_use", "id": id, "name": "sys_code", "input": {}});
        let res = |id: &str| json!({"type": "tool_result", "tool_use_id": id, "content": "ok"});
        let text = |t: &str| json!({"type": "text", "text": t});
        let all = [
            row(1, "user", json!([text("go")])),
            row(2, "assistant", json!([use_("a"), use_("b")])),
            row(3, "user", json!([text("[System] The previous run stopped")])),
            row(4, "user", json!([res("b"), res("a")])),
            row(5, "assistant", json!([use_("c")])),
            row(6, "user", json!([text("[System] stopped again")])),
            row(7, "user", json!([text("are you there?")])),
            row(8, "assistant", json!([use_("d")])),
            row(9, "assistant", json!([text("odd: two assistant rows")])),
            row(10, "user", json!([text("next")])),
        ];
        let m = messages(&all);
        uses_answered_first(&m);
        assert_eq!(m[2].content[0]["tool_use_id"], "a");
        assert_eq!(m[2].content[1]["tool_use_id"], "b");
        assert_eq!(m[2].content[2]["text"], "[1970-01-01 00:00:00 UTC] [S3] [System] The previous run stopped");
        assert_eq!(m[4].content[0]["content"], NO_RESULT);
        for split in 1..all.len() {
            let mut t = Transcript::default();
            t.rebuild(&all[..split]);
            for end in split + 1..=all.len() {
                t.push(&all[end - 1]);
                let v = t.view();
                uses_answered_first(&v);
                assert_eq!(*v, messages(&all[..end]), "split {split} end {end}");
            }
        }
    }
}
