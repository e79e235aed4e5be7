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
    pub locked: bool,
}

impl Store {
    /// Insert a timer; returns its id.
    pub fn timer_insert(&mut self, t: &NewTimer<'_>) -> Result<i64> {
        let schedule = serde_json::to_string(t.schedule).unwrap_or_default();
        let file = self.path().to_path_buf();
        self.write(|tx| {
            match t.scope {
                Some(scope) => tx.execute(
                    "INSERT INTO adf_timers(schedule_json, next_wake_at, payload, scope, lambda, locked, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![
                        schedule,
                        t.next_wake_at,
                        t.payload,
                        serde_json::to_string(scope).unwrap_or_default(),
                        t.lambda,
                        t.locked as i64,
                        now_ms()
                    ],
                ),
                None => tx.execute(
                    "INSERT INTO adf_timers(schedule_json, next_wake_at, payload, lambda, locked, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![schedule, t.next_wake_at, t.payload, t.lambda, t.locked as i64, now_ms()],
                ),
            }
            .at(&file)?;
            Ok(tx.last_insert_rowid())
        })
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
