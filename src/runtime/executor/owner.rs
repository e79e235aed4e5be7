//! What the owner does to an agent through its actor (the daemon's write
//! routes, the terminal app): clearing the loop, setting a timer with the
//! owner's schedule format. Kept apart from the turn loop.

use serde_json::{Value, json};

use super::Executor;
use crate::store::files::{FileEntry, WriteOptions};
use crate::store::{Caller, StoreError};
use crate::tools::{self, Ctx};

impl Executor {
    /// Write a file as the owner and announce it (`file.written`, source
    /// `system:owner`), so `on_file_change` targets see the owner's edits.
    pub fn owner_write(&mut self, path: &str, content: &[u8]) -> Result<FileEntry, StoreError> {
        self.owner_write_with(path, content, &WriteOptions::default())
    }

    pub fn owner_write_with(
        &mut self,
        path: &str,
        content: &[u8],
        opts: &WriteOptions<'_>,
    ) -> Result<FileEntry, StoreError> {
        let old = self.store.file_stat(path)?;
        // The text before is for a trigger's diff: read only when one takes
        // the change.
        let before = old
            .as_ref()
            .filter(|e| e.size <= crate::tools::DIFF_SOURCE_MAX && e.is_text())
            .filter(|_| self.file_change_wanted(path, "system:owner"))
            .and_then(|_| self.store.file_read_text(path).ok());
        let entry = self.store.file_write(Caller::Owner, path, content, opts)?;
        let operation = if old.is_some() { "modified" } else { "created" };
        let mut ev = json!({"path": path, "bytes": entry.size, "operation": operation});
        if let Some(b) = before {
            ev["_before"] = json!(b);
        }
        self.emit(crate::protocol::kind::FILE_WRITTEN, "system:owner", ev);
        Ok(entry)
    }

    /// `/compact [what to keep]`: summarise the loop now (keeping its last
    /// two rows), steered by the owner's words.
    pub async fn owner_compact(&mut self, instructions: Option<&str>) -> Result<super::TurnEnd, StoreError> {
        self.settle_dangling()?;
        let cfg = self.config()?.value.clone();
        let reason = match instructions {
            Some(i) => format!("owner /compact: {i}"),
            None => "owner /compact".into(),
        };
        self.compact(&cfg, instructions, 2, reason, "system:owner").await?;
        Ok(super::TurnEnd::Completed { text: String::new() })
    }

    /// Clear the whole loop as the owner (audited when loop audit is on).
    pub fn clear_loop_as_owner(&mut self) -> Result<(), StoreError> {
        let cfg = self.store.config_value()?;
        self.clear(&cfg, None, None, "system:owner").map(|_| ())
    }

    /// Set a timer from the control API's body (`mode: once_at |
    /// once_delay | interval | cron`, `at`, `delay_ms`, `every_ms`, …);
    /// returns the new timer's id.
    pub fn owner_set_timer(&mut self, v: &Value) -> Result<i64, String> {
        let mode =
            v.get("mode").and_then(Value::as_str).ok_or("mode is required (once_at, once_delay, interval, cron)")?;
        let kind = match mode {
            "once_at" | "once" => "once",
            "once_delay" | "delay" => "delay",
            "interval" => "interval",
            "cron" => "cron",
            other => return Err(format!("Invalid mode \"{other}\" (once_at, once_delay, interval, cron)")),
        };
        let mut schedule = json!({"type": kind});
        for k in ["at", "delay_ms", "every_ms", "start_at", "end_at", "max_runs", "cron"] {
            if let Some(x) = v.get(k) {
                schedule[k] = x.clone();
            }
        }
        let mut input = json!({"schedule": schedule});
        for k in ["scope", "lambda", "warm", "payload", "locked"] {
            if let Some(x) = v.get(k) {
                input[k] = x.clone();
            }
        }
        let mut emit = |_: &'static str, _: Value| {};
        let mut ctx =
            Ctx { store: &mut self.store, caller: Caller::Owner, from_code: false, full: false, emit: &mut emit };
        let out = tools::execute(&mut ctx, "sys_set_timer", &input);
        if out.is_error {
            return Err(out.content);
        }
        out.content
            .lines()
            .find_map(|l| l.strip_prefix("ID: ").and_then(|n| n.trim().parse().ok()))
            .ok_or_else(|| format!("timer set, but no id in: {}", out.content))
    }
}
