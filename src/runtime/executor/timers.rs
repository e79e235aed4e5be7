//! Due timers (runtime.md §6.2): settled in the file, then turned into the
//! agent's wake messages or queued as system-scope lambda runs.

use serde_json::{Value, json};

use super::Executor;
use super::recovery::iso;
use crate::protocol::kind;
use crate::store::StoreError;

impl Executor {
    /// Settle the timers that are due and return the wake messages of those
    /// that fire for the agent scope now (runtime.md §6.2): `on_timer` must
    /// be enabled with a target of that scope, and the state must allow it
    /// (not `suspended`, `error` or `off`). System-scope fires queue the
    /// timer's own lambda for `run_system` (every state but `off`).
    pub fn fire_timers(&mut self, now: i64) -> Result<Vec<String>, StoreError> {
        let fired = self.store.timers_settle_due(now)?;
        if fired.is_empty() {
            return Ok(Vec::new());
        }
        let cfg = self.store.config_value()?;
        let on_timer = cfg.pointer("/triggers/on_timer");
        let enabled = on_timer.and_then(|t| t.get("enabled")).and_then(Value::as_bool).unwrap_or(false);
        let has_target = |scope: &str| {
            on_timer
                .and_then(|t| t.get("targets"))
                .and_then(Value::as_array)
                .is_some_and(|ts| ts.iter().any(|t| t["scope"] == scope))
        };
        let agent_ok = !matches!(self.state.as_str(), "suspended" | "error" | "off");
        let mut wakes = Vec::new();
        for f in fired {
            if !enabled {
                continue;
            }
            for scope in &f.scope {
                if !has_target(scope) {
                    continue;
                }
                let payload =
                    json!({"timer_id": f.id, "scope": scope, "run_count": f.run_count, "scheduled_at": f.scheduled_at});
                match scope.as_str() {
                    "agent" if agent_ok => {
                        self.emit(kind::TIMER_FIRED, "system:timer", payload);
                        wakes.push(match &f.payload {
                            Some(p) if !p.is_empty() => format!("A scheduled timer has fired.\nPayload: {p}"),
                            _ => "A scheduled timer has fired.\nCheck your mind for context on what to do next.".into(),
                        });
                    }
                    "system" if self.state != "off" => {
                        self.emit(kind::TIMER_FIRED, "system:timer", payload);
                        let Some(lambda) = f.lambda.clone().filter(|l| !l.is_empty()) else {
                            let _ = self.log(
                                "warn",
                                "timer",
                                "no_lambda",
                                &format!("timer {} fired for the system scope but has no lambda", f.id),
                            );
                            continue;
                        };
                        let timer = json!({"id": f.id, "scope": f.scope, "payload": f.payload, "lambda": lambda,
                            "run_count": f.run_count, "last_fired_at": now, "next_wake_at": f.next});
                        let event = json!({"id": crate::store::create::nanoid(16), "type": "timer", "source": "system:timer",
                            "time": iso(now), "data": {"timer": timer}});
                        self.emit(
                            kind::TRIGGER_FIRED,
                            "system:timer",
                            json!({"trigger_type": "on_timer", "scope": "system", "target_lambda": lambda}),
                        );
                        let job = crate::runtime::code::SystemJob {
                            trigger: "on_timer",
                            lambda,
                            event,
                            warm: f.warm,
                            source: "system:timer".into(),
                        };
                        match &self.dispatcher {
                            Some(d) => d.submit_job(job),
                            None => self.system_queue.push(job),
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(wakes)
    }
}
