//! `POST /agents/:id/trigger` (daemon.md §3, conformance 54 and 62): put
//! an event straight into an agent, past the trigger evaluator — no
//! enabled, filter, scope, state or timing checks. Agent scope wakes the
//! model with the event; system scope runs the named lambda or shell
//! command with the event envelope. The owner's voice is `/chat` only: an
//! event claiming `data.message.source = "user"` is refused.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde_json::{Value, json};

use super::routes::body;
use super::{ApiError, AppState};
use crate::runtime::agent::{AgentCommand, OwnerWork};
use crate::runtime::triggers::{TriggerEvent, wake_text};

/// The eleven event types (format.md §7.4), as the evaluator names them.
pub const EVENT_TYPES: &[&str] = &[
    "inbox",
    "outbox",
    "file_change",
    "chat",
    "timer",
    "tool_call",
    "task_create",
    "task_complete",
    "log_entry",
    "llm_call",
    "startup",
];

/// `on_<type>` as a static name (`on_logs` for `log_entry`).
fn trigger_name(ty: &str) -> &'static str {
    match ty {
        "inbox" => "on_inbox",
        "outbox" => "on_outbox",
        "file_change" => "on_file_change",
        "chat" => "on_chat",
        "timer" => "on_timer",
        "tool_call" => "on_tool_call",
        "task_create" => "on_task_create",
        "task_complete" => "on_task_complete",
        "log_entry" => "on_logs",
        "llm_call" => "on_llm_call",
        _ => "on_startup",
    }
}

/// One event of a request, checked.
fn event(v: &Value) -> Result<TriggerEvent, ApiError> {
    let ty = v.get("type").and_then(Value::as_str).ok_or_else(|| ApiError::bad("event.type is required"))?;
    let ty = match ty {
        "logs" => "log_entry",
        t => t,
    };
    let Some(ty) = EVENT_TYPES.iter().find(|t| **t == ty) else {
        return Err(ApiError::bad(format!("event.type {ty:?} is not one of: {}", EVENT_TYPES.join(", "))));
    };
    let data = match v.get("data") {
        Some(d) => d.clone(),
        None if *ty == "startup" => Value::Null,
        None => return Err(ApiError::bad(format!("event.data is required for {ty} (use null for no payload)"))),
    };
    if data.pointer("/message/source").and_then(Value::as_str) == Some("user") {
        return Err(ApiError::bad("data.message.source \"user\" is the owner's voice: use POST /agents/:id/chat"));
    }
    let source = v.get("source").and_then(Value::as_str).unwrap_or("daemon:http").to_string();
    Ok(TriggerEvent { ty, source, data })
}

pub async fn trigger(
    State(s): State<AppState>,
    Path(id): Path<String>,
    b: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    // The agent first: a request for no agent is a 404 whatever its body.
    let (id, _) = s.agent(&id).await?;
    let mut v = body(&b)?;
    if let Some(d) = v.get("dispatch").cloned() {
        v = d;
    }
    let target = v.get("target").cloned().unwrap_or(Value::Null);
    let field = |k: &str| v.get(k).or(target.get(k)).cloned();
    let events: Vec<TriggerEvent> = match v.get("events") {
        Some(Value::Array(a)) if !a.is_empty() => a.iter().map(event).collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::bad("events must be a non-empty array")),
        None => match v.get("event") {
            Some(e) => vec![event(e)?],
            None if v.get("type").is_some() => vec![event(&v)?],
            None => return Err(ApiError::bad("an event is required: {event: {type, data}}")),
        },
    };
    let scope = field("scope").and_then(|s| s.as_str().map(str::to_string)).unwrap_or_else(|| "agent".into());
    let lambda = field("lambda").and_then(|s| s.as_str().map(str::to_string));
    let command = field("command").and_then(|s| s.as_str().map(str::to_string));
    let warm = field("warm").and_then(|w| w.as_bool()).unwrap_or(false);
    let turn = format!("trigger_{}", crate::store::create::nanoid(12));
    let cmd = match scope.as_str() {
        // Not the event's own type: an injected inbox event has no inbox
        // row for the wake to read back.
        "agent" => AgentCommand::Wake { text: wake_text(&events), event_type: "injected".into() },
        "system" => {
            let is_command = lambda.is_none() && command.is_some();
            let Some(target) = lambda.or(command) else {
                return Err(ApiError::bad("system scope needs a lambda (path[:fn]) or a command"));
            };
            let event = if events.len() == 1 {
                events[0].envelope()
            } else {
                json!({"events": events.iter().map(TriggerEvent::envelope).collect::<Vec<_>>(),
                       "count": events.len(), "scope": "system", "lambda": target, "warm": warm})
            };
            let source = events[0].source.clone();
            let trigger = trigger_name(events[0].ty);
            AgentCommand::With(OwnerWork(Box::new(move |ex| {
                let job = crate::runtime::code::SystemJob { trigger, lambda: target, event, warm, source };
                match ex.dispatcher.clone() {
                    Some(d) if is_command => d.submit_command(job),
                    Some(d) => d.submit_job(job),
                    None => ex.system_queue.push(job),
                }
            })))
        }
        other => return Err(ApiError::bad(format!("scope {other:?} must be agent or system"))),
    };
    s.fleet.lock().await.send(&id, cmd).map_err(ApiError::internal)?;
    Ok((StatusCode::ACCEPTED, Json(json!({"accepted": true, "turnId": turn}))))
}
