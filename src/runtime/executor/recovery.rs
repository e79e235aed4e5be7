//! The turn checkpoint and crash recovery (runtime.md §9.3): a turn writes
//! `in_progress` as it starts and its outcome as it ends; a load that finds
//! `in_progress` tells the agent what was interrupted and when, answers the
//! calls left without results, and settles orphaned tasks. An interrupt
//! closes the turn the same way, keeping what the model had written.

use serde_json::{Value, json};

use super::Executor;
use crate::protocol::kind;
use crate::store::StoreError;
use crate::store::meta::MetaProtection;

pub(super) const CHECKPOINT: &str = "adf_runtime_turn_checkpoint";

/// Ends the kept text of a reply an interrupt cut short.
pub const INTERRUPTED_MARK: &str = "\n\n[interrupted]";

/// The result of a call the runtime stopped in the middle of.
const INTERRUPTED_BY_STOP: &str =
    "[Tool execution interrupted — the runtime stopped before this call returned; its outcome is unknown]";

impl Executor {
    /// On load: a turn left `in_progress` means the last process died in
    /// it. Tell the agent (start, last progress, now, elapsed; the trigger
    /// was not replayed), fail running tasks, cancel executor-managed
    /// approvals (runtime.md §9.3).
    pub fn recover(&mut self) -> Result<bool, StoreError> {
        let mut recovered = false;
        let raw = self.store.meta_get(CHECKPOINT)?.map(|m| m.value);
        if let Some(raw) = raw {
            let now = crate::store::now_ms();
            match serde_json::from_str::<Value>(&raw) {
                Ok(cp) if cp["status"] == "in_progress" => {
                    let started = cp["started_at"].as_i64().unwrap_or(now);
                    let updated = cp["updated_at"].as_i64().unwrap_or(started);
                    let notice = format!(
                        "[System] The previous run of this agent stopped in the middle of a turn (scope {}, turn {}, trigger {}). \
                         It started at {} and last made progress at {}; it is now {}, {} after it started. \
                         The trigger of that turn was NOT replayed: check what was done, and account for the gap in anything time-sensitive.",
                        cp["scope"].as_str().unwrap_or("agent"),
                        cp["id"].as_str().unwrap_or("?"),
                        cp["event_type"].as_str().unwrap_or("?"),
                        iso(started),
                        iso(updated),
                        iso(now),
                        elapsed(now - started)
                    );
                    // Calls that never returned are answered first, so the
                    // history stays one the providers accept: every call
                    // followed by its result, results before any text.
                    self.answer_dangling(INTERRUPTED_BY_STOP)?;
                    self.user_text(&notice)?;
                    let mut cp = cp;
                    cp["status"] = json!("interrupted");
                    cp["replay"] = json!("not_replayed");
                    cp["reason"] = json!("stale_checkpoint_recovered_on_load");
                    cp["updated_at"] = json!(now);
                    self.checkpoint(&cp);
                    self.log("warn", "executor", "turn_checkpoint_recovered", &notice)?;
                    self.emit(kind::LOOP_RECOVERED, "system:executor", json!({"reason": "stale_checkpoint"}));
                    recovered = true;
                }
                Ok(_) => {}
                Err(_) => {
                    self.answer_dangling(INTERRUPTED_BY_STOP)?;
                    self.user_text(&format!(
                        "[System] A turn-progress record of this agent could not be read, so it may have stopped mid-turn \
                         at an unknown time (now {}). Nothing was replayed.",
                        iso(now)
                    ))?;
                    self.checkpoint(
                        &json!({"status": "interrupted", "reason": "malformed_checkpoint", "updated_at": now}),
                    );
                    self.emit(kind::LOOP_RECOVERED, "system:executor", json!({"reason": "malformed_checkpoint"}));
                    recovered = true;
                }
            }
        }
        let mut running = 0;
        let mut cancelled = 0;
        for t in self.store.task_list_in(&["running", "pending_approval"])? {
            if t.status == "running" {
                self.store.task_set(
                    &t.id,
                    "failed",
                    None,
                    Some("The runtime stopped while this task ran; outcome unknown."),
                )?;
                running += 1;
            } else if t.status == "pending_approval" && t.executor_managed && recovered {
                self.store.task_set(
                    &t.id,
                    "cancelled",
                    None,
                    Some("The turn waiting on this approval ended with the runtime."),
                )?;
                self.emit(
                    kind::HIL_RESOLVED,
                    "system:executor",
                    json!({"request_id": t.id, "task_id": t.id, "approved": false, "orphaned": true}),
                );
                cancelled += 1;
            }
        }
        if running + cancelled > 0 {
            self.emit(
                kind::LOOP_RECOVERED,
                "system:executor",
                json!({"reason": "orphaned_tasks", "running": running, "awaiting_approval": cancelled}),
            );
        }
        Ok(recovered || running + cancelled > 0)
    }

    /// Close a turn that was paused on the owner: pending approvals are
    /// denied and unanswered calls get placeholders, as an interrupt does.
    pub(super) fn settle_dangling(&mut self) -> Result<(), StoreError> {
        let uses = self.session()?.pending.clone();
        for (id, name) in uses {
            for t in self.store.task_list(Some("pending_approval"))? {
                if t.origin.as_deref() == Some(&format!("hil:{name}:{id}")) {
                    self.store.task_set(&t.id, "denied", None, Some("Rejected"))?;
                    self.emit(
                        kind::HIL_RESOLVED,
                        "system:executor",
                        json!({"request_id": t.id, "task_id": t.id, "approved": false}),
                    );
                }
            }
        }
        self.answer_dangling("[Tool execution cancelled — user interrupted the turn]")
    }

    /// Answer the calls of the last assistant row that have no result yet
    /// with `text` (an error result each), in one row.
    pub(super) fn answer_dangling(&mut self, text: &str) -> Result<(), StoreError> {
        let uses = self.session()?.pending.clone();
        if uses.is_empty() {
            return Ok(());
        }
        let results: Vec<Value> = uses
            .iter()
            .map(|(id, _)| json!({"type": "tool_result", "tool_use_id": id, "content": text, "is_error": true}))
            .collect();
        self.append("user", &Value::Array(results), None, None)?;
        Ok(())
    }

    /// After a running turn was dropped (an owner interrupt or state
    /// change): mark its checkpoint `interrupted` and say so on the bus.
    /// Calls left without results are answered when the next turn starts.
    pub fn interrupted(&mut self, reason: &str, state: &str) {
        // What the model had written when the turn was cut stays in the
        // loop, marked, so the owner and the model both see it.
        self.store.hold_view(false);
        let partial = std::mem::take(&mut self.partial);
        if !partial.trim().is_empty() {
            let text = format!("{partial}{INTERRUPTED_MARK}");
            let _ = self.append("assistant", &json!([{"type": "text", "text": text}]), None, None);
        }
        if let Some((id, started, event_type)) = self.current.take() {
            self.finish_checkpoint(&id, started, &event_type, "interrupted", Some(reason));
            self.emit(
                kind::TURN_COMPLETED,
                &format!("agent:{id}"),
                json!({"filePath": self.store.path().display().to_string(), "content": "", "targetState": state, "interrupted": true}),
            );
        }
        self.set_state(state);
    }

    pub(super) fn checkpoint(&mut self, v: &Value) {
        self.cp = Some(v.clone());
        self.cp_pending = false;
        // The file's checkpoint is the main loop's; a side loop's stays here.
        if self.loops.side.is_some() {
            return;
        }
        let _ = self.store.set_system_meta(CHECKPOINT, &v.to_string(), MetaProtection::Readonly);
    }

    pub(super) fn finish_checkpoint(
        &mut self,
        id: &str,
        started: i64,
        event_type: &str,
        status: &str,
        reason: Option<&str>,
    ) {
        let cp = closing(id, started, event_type, status, reason);
        self.checkpoint(&cp);
    }

    /// The closing checkpoint of the turn in progress.
    pub(super) fn closing_checkpoint(&self, status: &str, reason: Option<&str>) -> Option<Value> {
        let (id, started, event_type) = self.current.as_ref()?;
        Some(closing(id, *started, event_type, status, reason))
    }

    /// The current checkpoint with `updated_at` now (progress made), to be
    /// written with the row that made it.
    pub(super) fn touched_checkpoint(&mut self) -> Option<Value> {
        let mut cp = match self.cp.take() {
            Some(cp) => cp,
            None if self.loops.side.is_some() => return None,
            None => self.store.meta_get(CHECKPOINT).ok().flatten().and_then(|m| serde_json::from_str(&m.value).ok())?,
        };
        cp["updated_at"] = json!(crate::store::now_ms());
        Some(cp)
    }
}

pub(super) fn iso(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|d| d.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}

fn elapsed(ms: i64) -> String {
    let m = ms.max(0) / 60_000;
    match (m / 60, m % 60) {
        (0, 0) => format!("{}s", ms.max(0) / 1000),
        (0, m) => format!("{m}m"),
        (h, m) => format!("{h}h {m}m"),
    }
}

/// A turn's closing checkpoint.
fn closing(id: &str, started: i64, event_type: &str, status: &str, reason: Option<&str>) -> Value {
    let now = crate::store::now_ms();
    let mut cp = json!({"id": id, "status": status, "started_at": started, "updated_at": now,
        "completed_at": now, "event_type": event_type, "scope": "agent", "replay": "not_replayed"});
    if let Some(r) = reason {
        cp["reason"] = json!(r);
    }
    cp
}
