//! `sys_set_timer`, `sys_list_timers`, `sys_delete_timer` (tools.md §7).
//! The input schedule is discriminated by `type`; the stored one by `mode`.

use serde_json::Value;

use super::{Ctx, ToolOutput};
use crate::store::now_ms;
use crate::store::timers::{NewTimer, Schedule};

fn iso(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|d| d.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// The next time a cron expression fires after `after` (epoch ms).
pub fn next_cron(expr: &str, after: i64) -> Result<i64, String> {
    let cron: croner::Cron = expr.parse().map_err(|e| format!("Invalid cron expression \"{expr}\": {e}"))?;
    let from = chrono::DateTime::from_timestamp_millis(after).unwrap_or_else(chrono::Utc::now);
    cron.find_next_occurrence(&from, false)
        .map(|d| d.timestamp_millis())
        .map_err(|e| format!("Cron expression \"{expr}\" never fires: {e}"))
}

fn describe(s: &Schedule) -> String {
    match s {
        Schedule::Once { .. } => "[once]".into(),
        Schedule::Interval { every_ms, .. } => format!("[interval: {}]", human_ms(*every_ms)),
        Schedule::Cron { cron, .. } => format!("[cron: {cron}]"),
    }
}

fn human_ms(ms: i64) -> String {
    let s = ms as f64 / 1000.0;
    if s < 60.0 {
        format!("{s:.1}s")
    } else if s < 3600.0 {
        format!("{:.1}m", s / 60.0)
    } else if s < 86400.0 {
        format!("{:.1}h", s / 3600.0)
    } else {
        format!("{:.1}d", s / 86400.0)
    }
}

pub fn set(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let now = now_ms();
    let sc = &input["schedule"];
    let n = |k: &str| sc.get(k).and_then(Value::as_i64);
    let (schedule, next) = match sc["type"].as_str().unwrap_or("") {
        "once" => {
            let Some(at) = n("at") else { return ToolOutput::err("schedule.at is required for type \"once\".") };
            if at <= now {
                return ToolOutput::err(format!("schedule.at ({}) must be in the future (now {}).", iso(at), iso(now)));
            }
            (Schedule::Once { at }, at)
        }
        "delay" => {
            let Some(d) = n("delay_ms") else {
                return ToolOutput::err("schedule.delay_ms is required for type \"delay\".");
            };
            (Schedule::Once { at: now + d }, now + d)
        }
        "interval" => {
            let Some(every) = n("every_ms") else {
                return ToolOutput::err("schedule.every_ms is required for type \"interval\".");
            };
            let first = n("start_at").unwrap_or(now + every);
            if first <= now {
                return ToolOutput::err("The first run (start_at) must be in the future.");
            }
            (
                Schedule::Interval {
                    every_ms: every,
                    start_at: n("start_at"),
                    end_at: n("end_at"),
                    max_runs: n("max_runs"),
                },
                first,
            )
        }
        _ => {
            let Some(expr) = sc.get("cron").and_then(Value::as_str) else {
                return ToolOutput::err("schedule.cron is required for type \"cron\".");
            };
            let next = match next_cron(expr, now) {
                Ok(t) => t,
                Err(e) => return ToolOutput::err(e),
            };
            (Schedule::Cron { cron: expr.to_string(), end_at: n("end_at"), max_runs: n("max_runs") }, next)
        }
    };
    let scope: Vec<&str> = input
        .get("scope")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_else(|| vec!["system"]);
    let new = NewTimer {
        schedule: &schedule,
        next_wake_at: next,
        payload: input.get("payload").and_then(Value::as_str),
        scope: Some(&scope),
        lambda: input.get("lambda").and_then(Value::as_str),
        warm: input.get("warm").and_then(Value::as_bool).unwrap_or(false),
        locked: input.get("locked").and_then(Value::as_bool).unwrap_or(false),
    };
    match ctx.store.timer_insert(&new) {
        Ok(id) => ToolOutput::ok(format!(
            "Timer set successfully.\nID: {id}\nScope: {}\n{} next fire {}",
            serde_json::to_string(&scope).unwrap_or_default(),
            describe(&schedule),
            iso(next)
        )),
        Err(e) => e.into(),
    }
}

pub fn list(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let all = input.get("include_expired").and_then(Value::as_bool).unwrap_or(false);
    let rows = match ctx.store.timer_list(all) {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    if rows.is_empty() {
        return ToolOutput::ok("No timers.");
    }
    let lines: Vec<String> = rows
        .iter()
        .map(|t| {
            let badge = t.schedule.as_ref().map(describe).unwrap_or_else(|raw| format!("[unknown: {raw}]"));
            let mut line = format!("ID {} {badge}", t.id);
            if t.locked {
                line.push_str(" [locked]");
            }
            if t.expired {
                line.push_str(&format!(" [expired] completed {}", iso(t.last_fired_at.unwrap_or(t.next_wake_at))));
            } else {
                line.push_str(&format!(" next {}", iso(t.next_wake_at)));
            }
            line.push_str(&format!(" runs {} scope {}", t.run_count, t.scope.join(",")));
            if let Ok(Schedule::Interval { end_at, max_runs, .. } | Schedule::Cron { end_at, max_runs, .. }) =
                &t.schedule
            {
                if let Some(e) = end_at {
                    line.push_str(&format!(" until {}", iso(*e)));
                }
                if let Some(m) = max_runs {
                    line.push_str(&format!(" max_runs {m}"));
                }
            }
            if let Some(p) = &t.payload {
                line.push_str(&format!(" payload: {p}"));
            }
            line
        })
        .collect();
    ToolOutput::ok(lines.join("\n"))
}

pub fn delete(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let id = input["id"].as_i64().unwrap_or(0);
    match ctx.store.timer_delete(ctx.caller, id) {
        Ok(()) => ToolOutput::ok(format!("Timer {id} deleted.")),
        Err(e) => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cron_next() {
        let t = next_cron("0 * * * *", 0).unwrap();
        assert_eq!(t, 3_600_000);
        assert!(next_cron("not cron", 0).is_err());
    }
}
