//! `adf why` (issue 19): why an agent is awake, or stuck. Read from its
//! file: what started its last turn and how that turn ended (the turn
//! checkpoint), what waits on the owner (approvals, asks), a budget that
//! stopped it, the last error, and its next scheduled wake (timers and
//! scheduled side loops); with the live state when the daemon runs it.

use serde_json::{Value, json};

use crate::store::{Store, StoreError};

fn iso(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map(|d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string()).unwrap_or_default()
}

/// The explanation as JSON. `live` is the runtime's state of the agent,
/// when it is running somewhere.
pub fn explain(store: &Store, live: Option<&str>) -> Result<Value, StoreError> {
    let cp: Option<Value> =
        store.meta_get("adf_runtime_turn_checkpoint")?.and_then(|m| serde_json::from_str(&m.value).ok());
    let last_turn = cp.as_ref().map(|c| {
        json!({"woken_by": c["event_type"], "status": c["status"], "reason": c["reason"],
               "started_at": c["started_at"].as_i64().map(iso), "updated_at": c["updated_at"].as_i64().map(iso)})
    });
    let mut waiting = Vec::new();
    for t in store.task_list(Some("pending_approval"))? {
        waiting.push(json!({"what": "approval", "tool": t.tool, "task": t.id, "since": iso(t.created_at)}));
    }
    for t in store.task_list(Some("pending"))?.into_iter().filter(|t| t.tool == "ask") {
        waiting.push(json!({"what": "ask", "question": t.args["question"], "task": t.id, "since": iso(t.created_at)}));
    }
    if cp.as_ref().is_some_and(|c| c["status"] == "interrupted" && c["reason"] == "suspended") {
        waiting.push(json!({"what": "suspended", "detail": "limits.max_active_turns or a budget stopped the turn; the owner resumes it"}));
    }
    let budgets = super::budget::in_use(store)?;
    for b in &budgets {
        if let Some((which, f)) = b.tightest()
            && f >= 1.0
        {
            waiting.push(json!({"what": "budget", "scope": b.scope, "budget": which, "used": f}));
        }
    }
    let next_timer = store.timer_list(false)?.into_iter().filter(|t| !t.expired).min_by_key(|t| t.next_wake_at);
    let next_loop = store
        .loops_list()?
        .into_iter()
        .filter(|d| d.status != "paused")
        .filter_map(|d| d.next_run_at.map(|at| (at, d.name)))
        .min();
    let next_wake = match (next_timer, next_loop) {
        (Some(t), Some((at, _))) if t.next_wake_at <= at => {
            Some(json!({"at": iso(t.next_wake_at), "what": "timer", "timer": t.id, "payload": t.payload}))
        }
        (_, Some((at, name))) => Some(json!({"at": iso(at), "what": "side loop", "loop": name})),
        (Some(t), None) => {
            Some(json!({"at": iso(t.next_wake_at), "what": "timer", "timer": t.id, "payload": t.payload}))
        }
        (None, None) => None,
    };
    let last_error = store
        .log_list(&crate::store::logs::LogQuery { level: Some("error"), origin: None, after: 0, limit: 1 })?
        .pop()
        .map(|l| json!({"at": iso(l.created_at), "origin": l.origin, "event": l.event, "message": l.message}));
    Ok(json!({
        "state": live,
        "last_turn": last_turn,
        "waiting_on": waiting,
        "next_wake": next_wake,
        "last_error": last_error,
        "budgets": budgets,
    }))
}

/// The explanation for people, one fact a line.
pub fn text(v: &Value) -> Vec<String> {
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let mut out = Vec::new();
    out.push(match v["state"].as_str() {
        Some(st) => match v["state_since"].as_str() {
            Some(since) => format!("state: {st} since {since}"),
            None => format!("state: {st}"),
        },
        None => "state: not running here (the file alone)".into(),
    });
    match &v["last_turn"] {
        Value::Null => out.push("last turn: none yet".into()),
        t => out.push(format!(
            "last turn: woken by {} at {}, {}{}",
            s(&t["woken_by"]),
            s(&t["started_at"]),
            s(&t["status"]),
            t["reason"].as_str().map(|r| format!(" ({r})")).unwrap_or_default()
        )),
    }
    let waiting = v["waiting_on"].as_array().cloned().unwrap_or_default();
    if waiting.is_empty() {
        out.push("waiting on: nothing".into());
    }
    for w in waiting {
        out.push(match w["what"].as_str().unwrap_or("") {
            "approval" => format!(
                "waiting on: your approval of {} (task {}, since {})",
                s(&w["tool"]),
                s(&w["task"]),
                s(&w["since"])
            ),
            "ask" => format!("waiting on: your answer to \"{}\" (task {})", s(&w["question"]), s(&w["task"])),
            "budget" => format!("waiting on: a budget: {} {} is spent", s(&w["scope"]), s(&w["budget"])),
            "model" => format!("waiting on: a model call, for {} s", w["seconds"]),
            "tool" => format!("waiting on: the tool {}, for {} s", s(&w["tool"]), w["seconds"]),
            "provider_backoff" => {
                format!("waiting on: the provider, after an error; next try in {} s", w["in_seconds"])
            }
            "held" => format!("waiting on: its file, held by {}", s(&w["holder"])),
            "lane" => format!(
                "waiting on: the {} lane: {} running, {} queued (64 at most, then dropped)",
                s(&w["lane"]),
                w["running"],
                w["queued"]
            ),
            _ => format!("waiting on: {}", s(&w["detail"])),
        });
    }
    match &v["next_wake"] {
        Value::Null => out.push("next wake: none scheduled (a message or the owner wakes it)".into()),
        n if n["what"] == "timer" => out.push(format!("next wake: timer {} at {}", n["timer"], s(&n["at"]))),
        n => out.push(format!("next wake: side loop {} at {}", s(&n["loop"]), s(&n["at"]))),
    }
    if let Some(e) = v["last_error"].as_object() {
        out.push(format!("last error: {} {}: {}", s(&e["at"]), s(&e["event"]), s(&e["message"])));
    }
    out
}
