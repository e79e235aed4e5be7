//! The executor's events: every event an agent emits gets the next per-agent
//! seq (reserved in blocks whose high-water mark is kept in meta, so
//! numbering never goes back after a restart) and goes on the bus; file
//! changes, tool calls and log rows are offered to the agent's triggers
//! (runtime.md §5), which fire system lambdas or wake the agent.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Executor, clip};
use crate::protocol::{Envelope, kind};
use crate::runtime::triggers::{self, Dispatch, Dispatcher, Timing, TriggerEvent};

/// Events keep previews, not payloads: the bus ring holds a thousand of
/// them and every subscriber gets a copy.
pub(super) const EVENT_TEXT: usize = 4000;

/// Where the reserved high-water mark of event seqs is kept (daemon.md
/// §5.1: numbering resumes there after a restart; gaps, never reuse).
pub(super) const SEQ_KEY: &str = "runtime_umbilical_next_seq";

/// Seqs reserved at a time.
const SEQ_BLOCK: u64 = 1000;

impl Executor {
    /// Offer an event to the triggers; `system_only` leaves agent-scope
    /// targets to the caller (a chat already wakes the agent).
    pub fn trigger(&mut self, ev: TriggerEvent, system_only: bool) {
        if let Some((d, dispatches)) = self.dispatches(&ev) {
            self.fire(&d, dispatches, system_only, &ev.source);
        }
    }

    /// What the agent's triggers make of `ev`, when it has a dispatcher and
    /// something takes it.
    pub(super) fn dispatches(&self, ev: &TriggerEvent) -> Option<(Arc<Dispatcher>, Vec<Dispatch>)> {
        let d = self.dispatcher.clone()?;
        // The parsed config when a turn has built it; otherwise the raw
        // document, so an idle agent does not build (and keep) the
        // turn's view of its config just to look at its triggers.
        let rev = self.store.config_rev();
        let dispatches = match &self.cfg {
            Some(c) if c.rev == rev => triggers::evaluate(&c.value, &self.state, ev),
            _ => self.store.with_config(|v| triggers::evaluate(v, &self.state, ev)).ok()?,
        };
        (!dispatches.is_empty()).then_some((d, dispatches))
    }

    pub(super) fn fire(&mut self, d: &Dispatcher, dispatches: Vec<Dispatch>, system_only: bool, source: &str) {
        for dispatch in dispatches {
            if system_only && !dispatch.system {
                continue;
            }
            let payload = json!({"trigger_type": dispatch.trigger, "scope": if dispatch.system { "system" } else { "agent" },
                "target_lambda": dispatch.lambda});
            if dispatch.system || matches!(dispatch.timing, Timing::Now) {
                self.emit(kind::TRIGGER_FIRED, source, payload);
            }
            d.submit(dispatch);
        }
    }

    /// Offer a task to `on_task_create` / `on_task_complete`.
    pub(crate) fn task_event(&mut self, ty: &'static str, task_id: &str, source: &str) {
        if self.dispatcher.is_none() {
            return;
        }
        let Ok(Some(t)) = self.store.task_get(task_id) else { return };
        let task = serde_json::to_value(&t).unwrap_or(Value::Null);
        self.trigger(TriggerEvent { ty, source: source.to_string(), data: json!({"task": task}) }, false);
    }

    /// Publish an event with the next per-agent seq (reserved in blocks
    /// persisted to meta, so numbering never goes back after a restart).
    pub fn emit(&mut self, ty: &'static str, source: &str, payload: Value) {
        let e = Envelope::new(ty, Some(&self.agent_id), source, payload);
        self.publish(e);
    }

    /// `emit` for a type chosen at run time (`custom.*` from code).
    pub fn emit_owned(&mut self, ty: String, source: &str, payload: Value) {
        let mut e = Envelope::new("", Some(&self.agent_id), source, payload);
        e.event_type = std::borrow::Cow::Owned(ty);
        self.publish(e);
    }

    pub(super) fn publish(&mut self, mut e: Envelope) {
        if let Some(side) = &self.loops.side
            && let Some(o) = e.payload.as_object_mut()
        {
            o.entry("loop").or_insert_with(|| Value::String(side.def.name.clone()));
        }
        let before = e.payload.as_object_mut().and_then(|o| o.remove("_before"));
        let trig = match &*e.event_type {
            kind::FILE_WRITTEN | kind::FILE_DELETED if self.dispatcher.is_some() => {
                let op = if e.event_type == kind::FILE_DELETED {
                    "deleted"
                } else {
                    e.payload["operation"].as_str().unwrap_or("modified")
                };
                // What the dispatch carries (stat, diff) is read only when
                // a trigger takes the change: its filter needs the path.
                Some(file_change(e.payload["path"].as_str().unwrap_or(""), op, &e.source))
            }
            kind::LLM_COMPLETED if self.dispatcher.is_some() => {
                let mut data = e.payload.clone();
                data["source"] = e.payload["call_source"].clone();
                Some(TriggerEvent { ty: "llm_call", source: e.source.clone(), data })
            }
            kind::AGENT_STATE_CHANGED => {
                if let (Some(d), Some(st)) = (&self.dispatcher, e.payload["state"].as_str())
                    && let Ok(mut s) = d.state.lock()
                {
                    *s = st.to_string();
                }
                None
            }
            _ => None,
        };
        self.publish_only(e);
        if let Some(t) = trig {
            if t.ty == "file_change" {
                self.file_trigger(t, before);
            } else {
                self.trigger(t, false);
            }
        }
    }

    /// Whether a change to `path` by `source` would fire a trigger.
    pub(crate) fn file_change_wanted(&self, path: &str, source: &str) -> bool {
        self.dispatches(&file_change(path, "modified", source)).is_some()
    }

    /// A file change offered to the triggers; what a dispatch carries
    /// beyond the path is read only when one takes it.
    pub(super) fn file_trigger(&mut self, mut ev: TriggerEvent, before: Option<Value>) {
        let Some((d, mut dispatches)) = self.dispatches(&ev) else { return };
        let path = ev.data["path"].as_str().unwrap_or("").to_string();
        if let Some(b) = before.as_ref().and_then(Value::as_str)
            && let Ok(now) = self.store.file_read_text(&path)
        {
            ev.data["diff"] = json!(crate::runtime::diff::unified(&path, Some(b), &now));
            ev.data["_before"] = json!(b);
        }
        if let Some(f) = self.store.file_stat(&path).ok().flatten() {
            let data = &mut ev.data;
            data["mime_type"] = json!(f.mime_type);
            data["size"] = json!(f.size);
            data["protection"] = json!(f.protection);
            data["authorized"] = json!(f.authorized);
            data["created_at"] = json!(f.created_at);
            data["updated_at"] = json!(f.updated_at);
        }
        for dispatch in &mut dispatches {
            dispatch.event = ev.clone();
        }
        self.fire(&d, dispatches, false, &ev.source);
    }

    pub(super) fn publish_only(&mut self, mut e: Envelope) {
        if self.seq_next >= self.seq_limit {
            // Blocks are reserved atomically: runner executors on sibling
            // connections number the same agent's events.
            let start = if self.seq_later {
                self.store.meta_reserve_later(SEQ_KEY, SEQ_BLOCK, self.seq_next)
            } else {
                self.store.meta_reserve(SEQ_KEY, SEQ_BLOCK, self.seq_next)
            };
            let start = start.unwrap_or(self.seq_next.max(1));
            self.seq_limit = start + SEQ_BLOCK;
            self.seq_next = start;
        }
        e.seq = self.seq_next;
        self.seq_next += 1;
        self.bus.publish(e);
    }
}

/// A file change as the triggers first see it: the path, what happened,
/// who did it (`Executor::file_trigger` adds the rest for a taker).
fn file_change(path: &str, operation: &str, source: &str) -> TriggerEvent {
    TriggerEvent {
        ty: "file_change",
        source: source.to_string(),
        data: json!({"path": path, "operation": operation, "diff": null}),
    }
}

/// A tool input for an event: as is when small, else a truncated preview.
pub(super) fn event_preview(v: &Value) -> Value {
    let text = v.to_string();
    if text.len() <= EVENT_TEXT {
        return v.clone();
    }
    json!({"_truncated": true, "preview": clip(&text, EVENT_TEXT)})
}
