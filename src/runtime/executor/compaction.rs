//! Keeping a loop within its context window (runtime.md §4): the memory
//! flush grace turn, automatic and pre-flight compaction into one
//! `[Loop Compacted]` briefing written by the model, and `loop_clear`.
//! Split from the turn loop, which only asks `compaction_check` at the top
//! of each step.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use super::{Executor, clip, usage_json};
use crate::protocol::kind;
use crate::providers::ModelRequest;
use crate::store::StoreError;
use crate::store::loop_rows::{LoopRow, NewLoopRow};

impl Executor {
    /// Compaction at the top of an iteration (runtime.md §4): the first
    /// crossing gives a memory-flush grace turn, the next one compacts; the
    /// pre-flight guard compacts before sending when the session grew past
    /// the bound since the last call.
    pub(super) async fn compaction_check(&mut self, cfg: &Value, source: &str) -> Result<(), StoreError> {
        let threshold = compact_threshold(cfg);
        let count = self.token_count()?;
        if count >= threshold {
            if !self.flush_done {
                self.flush_done = true;
                self.user_text(MEMORY_FLUSH)?;
                self.emit(kind::CONTEXT_INJECTED, source, json!({"category": "memory_flush", "origin": "executor"}));
                return Ok(());
            }
            return self.compact(cfg, None, 0, format!("auto: {count} >= {threshold}"), source).await;
        }
        let est = count.max(self.session()?.chars / 4);
        let bound = if self.flush_done { (threshold + 30_000).min(threshold * 13 / 10) } else { threshold };
        if est >= bound {
            return self.compact(cfg, None, 0, format!("preflight: {est} >= {bound}"), source).await;
        }
        Ok(())
    }

    /// Summarise the session into one `[Loop Compacted]` row, keeping the
    /// last `preserve` rows after it (their seqs unchanged).
    pub(super) async fn compact(
        &mut self,
        cfg: &Value,
        instructions: Option<&str>,
        preserve: usize,
        reason: String,
        source: &str,
    ) -> Result<(), StoreError> {
        self.store.hold_view(false);
        let rows = self.loop_rows()?;
        let keep_from = rows.len().saturating_sub(preserve);
        let (summarise, kept) = rows.split_at(keep_from);
        if summarise.is_empty() {
            return Ok(());
        }
        let transcript = transcript_text(summarise);
        let mut ask = format!(
            "Here is a conversation transcript with {} entries. Produce a concise briefing that lets the agent continue: \
             goals, decisions, facts learned, work done, open questions and next steps. Keep [S<seq>] citations.",
            summarise.len()
        );
        if let Some(i) = instructions.filter(|i| !i.trim().is_empty()) {
            ask.push_str(&format!("\n\n<compaction_instructions>\n{i}\n</compaction_instructions>"));
        }
        ask.push_str(&format!("\n\n<transcript>\n{transcript}\n</transcript>"));
        let model = cfg.pointer("/model/model_id").and_then(Value::as_str).unwrap_or("").to_string();
        let req = ModelRequest {
            model: model.clone(),
            system: COMPACTION_PROMPT.into(),
            messages: Arc::new(vec![crate::providers::Message {
                role: crate::providers::Role::User,
                content: vec![json!({"type": "text", "text": ask})],
            }]),
            tools: Default::default(),
            max_tokens: 2048,
            temperature: Some(0.3),
            effort: None,
            reasoning_tokens: None,
            trailing: None,
        };
        let started = Instant::now();
        let provider = self.provider.clone();
        let result = match provider.stream(req).await {
            Ok(st) => crate::providers::collect(st, provider.id(), |_| {}).await,
            Err(e) => Err(e),
        };
        let (summary, tokens) = match &result {
            Ok(r) if r.text().trim().is_empty() => {
                ("(Summary generation produced empty output.)".to_string(), Some(usage_json(&r.usage)))
            }
            Ok(r) => (r.text(), Some(usage_json(&r.usage))),
            Err(_) => ("(Summary generation failed.)".to_string(), None),
        };
        if let Ok(r) = &result {
            self.settle_spend(cfg, &model, &r.usage, "compaction")?;
        }
        let ev = if result.is_ok() { kind::LLM_COMPLETED } else { kind::LLM_FAILED };
        self.emit(
            ev,
            source,
            json!({"provider": provider.id(), "model": model, "duration_ms": started.elapsed().as_millis() as u64,
            "call_source": "compaction"}),
        );
        let audited = crate::store::config::audit_enabled(cfg, "loop");
        let head = if audited { "[Loop Compacted, audited]" } else { "[Loop Compacted]" };
        let text = format!("{head} {summary}\n\n---\n{COMPACTION_FOOTER}");
        let ord = kept.iter().map(|r| r.ord.unwrap_or(r.seq)).min().map(|k| k - 1);
        let content = json!([{"type": "text", "text": text}]);
        self.replace_rows(
            summarise,
            audited,
            Some(&NewLoopRow { role: "user", content: &content, model: Some(&model), tokens: tokens.as_ref(), ord }),
        )?;
        self.reset_session();
        let new_count = self.session()?.chars / 4;
        self.emit(kind::LOOP_COMPACTED, source, json!({"reason": reason, "new_token_count": new_count}));
        Ok(())
    }

    /// `loop_clear`: a Python-style slice of the rows in display order
    /// (`end` exclusive, negative indices count from the end), or all rows.
    /// Returns true when the loop is now empty.
    pub(super) fn clear(
        &mut self,
        cfg: &Value,
        start: Option<i64>,
        end: Option<i64>,
        source: &str,
    ) -> Result<bool, StoreError> {
        let rows = self.loop_rows()?;
        let n = rows.len() as i64;
        let norm = |i: i64| if i < 0 { (n + i).max(0) } else { i.min(n) };
        let (a, b) = (norm(start.unwrap_or(0)), norm(end.unwrap_or(n)));
        let remove = if a < b { &rows[a as usize..b as usize] } else { &rows[..0] };
        let audited = crate::store::config::audit_enabled(cfg, "loop");
        self.replace_rows(remove, audited, None)?;
        self.reset_session();
        self.emit(kind::LOOP_CLEARED, source, json!({"method": "clear"}));
        Ok(self.session()?.rows == 0)
    }
}

/// The default compaction threshold in tokens.
const DEFAULT_COMPACT_THRESHOLD: u64 = 100_000;

/// The token count past which a loop is compacted: `context.compact_threshold`,
/// else the older `model.compact_threshold`, else 100 000.
pub fn compact_threshold(cfg: &Value) -> u64 {
    cfg["context"]["compact_threshold"]
        .as_u64()
        .or_else(|| cfg["model"]["compact_threshold"].as_u64())
        .unwrap_or(DEFAULT_COMPACT_THRESHOLD)
}

/// A plain user message (not a `[Context: …]` row): the model must see it.
const MEMORY_FLUSH: &str = "Context is about to be compacted: your context is nearly full. \
Before that happens, write anything you need to keep to mind.md (one line each) or to pages under mind/ \
with an entry in mind/log.md, citing the messages it came from as [S<seq>]. Then continue.";

const COMPACTION_PROMPT: &str = "You compress an agent's working conversation into a briefing it will continue \
from. Be concrete and complete about state, decisions and open questions; drop chatter.";

const COMPACTION_FOOTER: &str = "Your loop was compacted: the briefing above is what survived of the earlier \
conversation, open questions included. Continue from it.";

/// The transcript the summariser reads (last 100 000 characters).
fn transcript_text(rows: &[LoopRow]) -> String {
    let mut out = String::new();
    for r in rows {
        out.push_str(&format!("[{} S{}] ", r.role.to_uppercase(), r.seq));
        for b in r.content.as_array().into_iter().flatten() {
            match b["type"].as_str() {
                Some("text") => out.push_str(b["text"].as_str().unwrap_or("")),
                Some("tool_use") => out.push_str(&format!(
                    "[Called {}({})]",
                    b["name"].as_str().unwrap_or(""),
                    clip(&b["input"].to_string(), 200)
                )),
                Some("tool_result") => {
                    let c = match &b["content"] {
                        Value::String(s) => s.clone(),
                        v => v.to_string(),
                    };
                    out.push_str(&format!("[Result: {}]", clip(&c, 300)));
                }
                Some("thinking") => {
                    out.push_str(&format!("[Thinking: {}]", clip(b["thinking"].as_str().unwrap_or(""), 200)))
                }
                _ => {}
            }
            out.push(' ');
        }
        out.push('\n');
    }
    let n = out.chars().count();
    if n > 100_000 { out.chars().skip(n - 100_000).collect() } else { out }
}
