//! `adf_timers` rows: the stored schedule document, whose discriminant is
//! `mode` (never `type`) with fields in the reference's order, and the scope
//! list that defaults to `["system"]` (format.md §3.6, tools.md §7).

use rusqlite::params;
use serde::{Deserialize, Serialize};

use super::error::{Ctx, Result};
use super::{Store, now_ms};

/// A resolved schedule as stored in `schedule_json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Schedule {
    Once {
        at: i64,
    },
    Interval {
        every_ms: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        start_at: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        end_at: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        max_runs: Option<i64>,
    },
    Cron {
        cron: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        end_at: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        max_runs: Option<i64>,
    },
}

/// A timer row to insert.
#[derive(Debug, Clone)]
pub struct NewTimer<'a> {
    pub schedule: &'a Schedule,
    pub next_wake_at: i64,
    pub payload: Option<&'a str>,
    /// `None` keeps the column default `["system"]`.
    pub scope: Option<&'a [&'a str]>,
    pub lambda: Option<&'a str>,
    pub warm: bool,
    pub locked: bool,
}

/// A stored timer.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TimerRow {
    pub id: i64,
    /// The parsed schedule, or the raw text if it does not parse.
    pub schedule: Result<Schedule, String>,
    pub next_wake_at: i64,
    pub payload: Option<String>,
    /// Scope list; legacy rows may hold a bare string.
    pub scope: Vec<String>,
    pub lambda: Option<String>,
    pub warm: bool,
    pub run_count: i64,
    pub created_at: i64,
    pub last_fired_at: Option<i64>,
    pub locked: bool,
    pub expired: bool,
}

fn parse_scope(s: &str) -> Vec<String> {
    serde_json::from_str::<Vec<String>>(s).unwrap_or_else(|_| vec![s.trim_matches('"').to_string()])
}

impl Store {
    /// Insert a timer; returns its id.
    pub fn timer_insert(&mut self, t: &NewTimer<'_>) -> Result<i64> {
        let schedule = serde_json::to_string(t.schedule).unwrap_or_default();
        let file = self.path().to_path_buf();
        self.write(|tx| {
            match t.scope {
                Some(scope) => tx.execute(
                    "INSERT INTO adf_timers(schedule_json, next_wake_at, payload, scope, lambda, warm, locked, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    params![
                        schedule,
                        t.next_wake_at,
                        t.payload,
                        serde_json::to_string(scope).unwrap_or_default(),
                        t.lambda,
                        t.warm as i64,
                        t.locked as i64,
                        now_ms()
                    ],
                ),
                None => tx.execute(
                    "INSERT INTO adf_timers(schedule_json, next_wake_at, payload, lambda, warm, locked, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![schedule, t.next_wake_at, t.payload, t.lambda, t.warm as i64, t.locked as i64, now_ms()],
                ),
            }
            .at(&file)?;
            Ok(tx.last_insert_rowid())
        })
    }
}

impl Store {
    /// Timers in listing order (`expired ASC, next_wake_at ASC`).
    pub fn timer_list(&self, include_expired: bool) -> Result<Vec<TimerRow>> {
        let mut stmt = self
            .conn()
            .prepare(
                "SELECT id, schedule_json, next_wake_at, payload, scope, lambda, warm, run_count, created_at,
                        last_fired_at, locked, expired
                 FROM adf_timers WHERE ?1 OR expired = 0 ORDER BY expired ASC, next_wake_at ASC",
            )
            .at(self.path())?;
        stmt.query_map([include_expired], |r| {
            let sched: String = r.get(1)?;
            let scope: String = r.get(4)?;
            Ok(TimerRow {
                id: r.get(0)?,
                schedule: serde_json::from_str(&sched).map_err(|_| sched),
                next_wake_at: r.get(2)?,
                payload: r.get(3)?,
                scope: parse_scope(&scope),
                lambda: r.get(5)?,
                warm: r.get::<_, i64>(6)? != 0,
                run_count: r.get(7)?,
                created_at: r.get(8)?,
                last_fired_at: r.get(9)?,
                locked: r.get::<_, i64>(10)? != 0,
                expired: r.get::<_, i64>(11)? != 0,
            })
        })
        .at(self.path())?
        .collect::<rusqlite::Result<Vec<_>>>()
        .at(self.path())
    }

    /// Delete a timer; locked timers are refused unless the caller may bypass.
    pub fn timer_delete(&mut self, caller: super::Caller, id: i64) -> Result<()> {
        let row = self.timer_list(true)?.into_iter().find(|t| t.id == id);
        let Some(row) = row else {
            return Err(super::StoreError::Missing(format!("Timer {id} not found.")));
        };
        if row.locked && caller != super::Caller::Owner && !caller.bypasses() {
            return Err(super::StoreError::Invalid(format!(
                "Timer {id} is locked and cannot be deleted by the agent; only the owner can remove it."
            )));
        }
        let file = self.path().to_path_buf();
        self.write(|tx| {
            tx.execute("DELETE FROM adf_timers WHERE id = ?1", [id]).at(&file)?;
            Ok(())
        })
    }
}

/// A timer that came due and was settled.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Fired {
    pub id: i64,
    pub scope: Vec<String>,
    pub payload: Option<String>,
    pub lambda: Option<String>,
    /// Keep the lambda's sandbox between runs.
    pub warm: bool,
    /// Total fires including this one.
    pub run_count: i64,
    /// When it was due.
    pub scheduled_at: i64,
    /// The next wake, or `None` when it expired.
    pub next: Option<i64>,
}

/// The next wake after a fire at `now` (runtime.md §6.2): once → none;
/// `max_runs` reached → none; interval → `now + every_ms` (from the fire,
/// so a missed timer fires once and reschedules from now); cron → the next
/// occurrence; past `end_at` → none.
pub fn renewal(s: &Schedule, run_count: i64, now: i64) -> Option<i64> {
    let (next, end_at, max_runs) = match s {
        Schedule::Once { .. } => return None,
        Schedule::Interval { every_ms, end_at, max_runs, .. } => (Some(now + every_ms), *end_at, *max_runs),
        Schedule::Cron { cron, end_at, max_runs } => (crate::tools::next_cron(cron, now).ok(), *end_at, *max_runs),
    };
    if max_runs.is_some_and(|m| run_count + 1 >= m) {
        return None;
    }
    next.filter(|n| end_at.is_none_or(|e| *n <= e))
}

impl Store {
    /// Settle every due timer before anything runs for it (so a crash
    /// never fires one twice): expired ones are kept as history, recurring
    /// ones move to their next wake. Returns what fired.
    /// Undo the settling of an exhausted timer whose dispatch was dropped
    /// (a full lane): it is due again at `at`. Recurring timers fire at
    /// their next wake anyway and are left alone.
    pub fn timer_rewind(&mut self, id: i64, at: i64) -> Result<bool> {
        let file = self.path().to_path_buf();
        self.write(|tx| {
            let n = tx
                .execute(
                    "UPDATE adf_timers SET expired = 0, next_wake_at = ?2, run_count = MAX(run_count - 1, 0) WHERE id = ?1 AND expired = 1",
                    params![id, at],
                )
                .at(&file)?;
            Ok(n > 0)
        })
    }

    pub fn timers_settle_due(&mut self, now: i64) -> Result<Vec<Fired>> {
        let due: Vec<TimerRow> =
            self.timer_list(false)?.into_iter().filter(|t| t.next_wake_at <= now && !t.expired).collect();
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let fired: Vec<Fired> = due
            .iter()
            .map(|t| Fired {
                id: t.id,
                scope: t.scope.clone(),
                payload: t.payload.clone(),
                lambda: t.lambda.clone(),
                warm: t.warm,
                run_count: t.run_count + 1,
                scheduled_at: t.next_wake_at,
                next: t.schedule.as_ref().ok().and_then(|s| renewal(s, t.run_count, now)),
            })
            .collect();
        let file = self.path().to_path_buf();
        self.write(|tx| {
            for f in &fired {
                match f.next {
                    Some(next) => tx.execute(
                        "UPDATE adf_timers SET next_wake_at = ?2, run_count = ?3, last_fired_at = ?4 WHERE id = ?1",
                        params![f.id, next, f.run_count, now],
                    ),
                    None => tx.execute(
                        "UPDATE adf_timers SET expired = 1, run_count = ?2, last_fired_at = ?3 WHERE id = ?1",
                        params![f.id, f.run_count, now],
                    ),
                }
                .at(&file)?;
            }
            Ok(())
        })?;
        Ok(fired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_shape_matches_the_reference() {
        let s = Schedule::Interval { every_ms: 3_600_000, start_at: None, end_at: None, max_runs: Some(10) };
        assert_eq!(serde_json::to_string(&s).unwrap(), r#"{"mode":"interval","every_ms":3600000,"max_runs":10}"#);
        assert_eq!(serde_json::to_string(&Schedule::Once { at: 5 }).unwrap(), r#"{"mode":"once","at":5}"#);
        let back: Schedule = serde_json::from_str(r#"{"mode":"cron","cron":"0 * * * *","extra":1}"#).unwrap();
        assert_eq!(back, Schedule::Cron { cron: "0 * * * *".into(), end_at: None, max_runs: None });
    }
}
