//! `adf_tasks`: approvals, asks and background work as rows, so they
//! survive a dropped session and can be answered from anywhere
//! (format.md §3.11, runtime.md §8.2).

use rusqlite::{OptionalExtension, params};
use serde::Serialize;
use serde_json::Value;

use super::error::{Ctx, Result};
use super::{Store, now_ms};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Task {
    pub id: String,
    pub tool: String,
    pub args: Value,
    pub status: String,
    pub result: Option<String>,
    pub error: Option<String>,
    pub created_at: i64,
    pub completed_at: Option<i64>,
    pub origin: Option<String>,
    pub requires_authorization: bool,
    pub executor_managed: bool,
    pub approval_meta: Option<Value>,
}

/// Statuses after which a task never changes.
pub const TERMINAL: &[&str] = &["completed", "failed", "denied", "cancelled"];

/// A new task.
pub struct NewTask<'a> {
    pub tool: &'a str,
    pub args: &'a Value,
    pub status: &'a str,
    pub origin: &'a str,
    pub requires_authorization: bool,
    pub executor_managed: bool,
    pub approval_meta: Option<&'a Value>,
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Task> {
    let args: String = r.get(2)?;
    let meta: Option<String> = r.get(11)?;
    Ok(Task {
        id: r.get(0)?,
        tool: r.get(1)?,
        args: serde_json::from_str(&args).unwrap_or(Value::String(args)),
        status: r.get(3)?,
        result: r.get(4)?,
        error: r.get(5)?,
        created_at: r.get(6)?,
        completed_at: r.get(7)?,
        origin: r.get(8)?,
        requires_authorization: r.get::<_, i64>(9)? != 0,
        executor_managed: r.get::<_, i64>(10)? != 0,
        approval_meta: meta.and_then(|m| serde_json::from_str(&m).ok()),
    })
}

const COLS: &str = "id, tool, args, status, result, error, created_at, completed_at, origin, requires_authorization, executor_managed, approval_meta";

impl Store {
    /// Insert a task; returns its id (`task_` + 12 characters).
    pub fn task_create(&mut self, t: &NewTask<'_>) -> Result<String> {
        let id = format!("task_{}", super::create::nanoid(12));
        let file = self.path().to_path_buf();
        self.write(|tx| {
            tx.execute(
                "INSERT INTO adf_tasks(id, tool, args, status, created_at, origin, requires_authorization, executor_managed, approval_meta)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    id,
                    t.tool,
                    t.args.to_string(),
                    t.status,
                    now_ms(),
                    t.origin,
                    t.requires_authorization as i64,
                    t.executor_managed as i64,
                    t.approval_meta.map(Value::to_string)
                ],
            )
            .at(&file)?;
            Ok(())
        })?;
        Ok(id)
    }

    pub fn task_get(&self, id: &str) -> Result<Option<Task>> {
        self.conn()
            .query_row(&format!("SELECT {COLS} FROM adf_tasks WHERE id = ?1"), [id], row)
            .optional()
            .at(self.path())
    }

    /// Tasks, newest first, optionally only those with a status.
    pub fn task_list(&self, status: Option<&str>) -> Result<Vec<Task>> {
        let mut stmt = self
            .conn()
            .prepare(&format!(
                "SELECT {COLS} FROM adf_tasks WHERE ?1 IS NULL OR status = ?1 ORDER BY created_at DESC, rowid DESC"
            ))
            .at(self.path())?;
        stmt.query_map([status], row).at(self.path())?.collect::<rusqlite::Result<Vec<_>>>().at(self.path())
    }

    /// The tasks in any of `statuses` (newest first), found through the
    /// status index: a load's recovery looks for unsettled tasks without
    /// reading every settled one an agent has kept.
    pub fn task_list_in(&self, statuses: &[&str]) -> Result<Vec<Task>> {
        let marks = (1..=statuses.len()).map(|i| format!("?{i}")).collect::<Vec<_>>().join(",");
        let mut stmt = self
            .conn()
            .prepare(&format!(
                "SELECT {COLS} FROM adf_tasks WHERE status IN ({marks}) ORDER BY created_at DESC, rowid DESC"
            ))
            .at(self.path())?;
        stmt.query_map(rusqlite::params_from_iter(statuses), row)
            .at(self.path())?
            .collect::<rusqlite::Result<Vec<_>>>()
            .at(self.path())
    }

    /// Move a task to `status`, with its result or error. Terminal tasks
    /// are left alone (returns false).
    pub fn task_set(&mut self, id: &str, status: &str, result: Option<&str>, error: Option<&str>) -> Result<bool> {
        let done = TERMINAL.contains(&status).then(now_ms);
        let file = self.path().to_path_buf();
        self.write(|tx| {
            let n = tx
                .execute(
                    "UPDATE adf_tasks SET status = ?2, result = COALESCE(?3, result), error = COALESCE(?4, error),
                       completed_at = COALESCE(?5, completed_at)
                     WHERE id = ?1 AND status NOT IN ('completed','failed','denied','cancelled')",
                    params![id, status, result, error, done],
                )
                .at(&file)?;
            Ok(n > 0)
        })
    }

    /// Latch `requires_authorization` (never cleared).
    pub fn task_require_authorization(&mut self, id: &str) -> Result<()> {
        let file = self.path().to_path_buf();
        self.write(|tx| {
            tx.execute("UPDATE adf_tasks SET requires_authorization = 1 WHERE id = ?1", params![id]).at(&file)?;
            Ok(())
        })
    }
}
