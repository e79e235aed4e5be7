//! The control API's routes: health, the agents and their lifecycle, chat,
//! and runtime diagnostics here; per-agent resources in `resources.rs`;
//! the event stream in `sse.rs`. Each maps one to one onto a runtime
//! command or a read of the agent's file.

use std::collections::HashMap;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::{ApiError, ApiResult, AppState, resources, sse};
use crate::protocol::Command;

pub type Q = Query<HashMap<String, String>>;

/// A JSON object body, or a 400 that says what is wrong with it.
pub fn body(bytes: &Bytes) -> Result<Value, ApiError> {
    if bytes.is_empty() {
        return Ok(json!({}));
    }
    let v: Value = serde_json::from_slice(bytes).map_err(|e| ApiError::bad(format!("malformed JSON body: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad("the body must be a JSON object"));
    }
    Ok(v)
}

/// A required string field of a body.
pub fn field<'a>(v: &'a Value, name: &str) -> Result<&'a str, ApiError> {
    v.get(name).and_then(Value::as_str).ok_or_else(|| ApiError::bad(format!("{name} is required (a string)")))
}

/// The largest integer a JSON client can hold exactly (2^53 − 1).
pub const MAX_SAFE: i64 = 9_007_199_254_740_991;

/// An integer query parameter: 0 to 2^53 − 1, then clamped to the route's
/// bounds.
pub fn int(q: &HashMap<String, String>, name: &str, default: i64, min: i64, max: i64) -> Result<i64, ApiError> {
    match q.get(name) {
        None => Ok(default),
        Some(s) => match s.parse::<i64>() {
            Ok(n) if (0..=MAX_SAFE).contains(&n) => Ok(n.clamp(min, max)),
            _ => Err(ApiError::bad(format!("{name} must be an integer from 0 to {MAX_SAFE}, got \"{s}\""))),
        },
    }
}

pub fn router(_s: AppState) -> Router<AppState> {
    Router::new()
        .route("/health", get(|| async { Json(json!({"ok": true})) }))
        .route("/openapi.json", get(|| async { Json(super::openapi::document()) }))
        .route("/events", get(sse::events))
        .route("/agents/{id}/events", get(sse::agent_events))
        .route("/agents", get(agents))
        .route("/agents/load", post(load))
        .route(super::moves::IMPORT, post(super::moves::import))
        .route("/agents/forwards", get(super::moves::list).post(super::moves::add))
        .route("/agents/review", get(review))
        .route("/agents/review/accept", post(review_accept))
        .route("/agents/{id}", get(agent))
        .route("/agents/{id}/status", get(status))
        .route("/agents/{id}/start", post(start))
        .route("/agents/{id}/stop", post(stop))
        .route("/agents/{id}/unload", post(stop))
        .route("/agents/{id}/abort", post(abort))
        .route("/agents/{id}/state", post(set_state))
        .route("/agents/{id}/trigger", post(super::inject::trigger))
        .route("/agents/{id}/chat", post(chat).get(resources::chat_history).delete(resources::clear_loop))
        .route("/runtime", get(runtime))
        .route("/runtime/providers", get(providers))
        .route("/runtime/usage", get(runtime_usage))
        .route("/usage", get(ledger_usage))
        .route("/whoami", get(whoami))
        .route("/peers", get(peers))
        .route("/attention", get(resources::attention))
        .route("/diagnostics", get(diagnostics))
        .merge(resources::router())
        .merge(super::mcp::router())
        .merge(super::loops::router())
        .merge(super::grants::router())
}

async fn agents(State(s): State<AppState>) -> ApiResult<axum::response::Response> {
    let fleet = s.fleet.lock().await;
    // Built straight into bytes from the fleet's memory: no file is read
    // and no intermediate JSON tree is made.
    let bytes = serde_json::to_vec(&fleet.summaries()).map_err(|e| ApiError::internal(e.to_string()))?;
    drop(fleet);
    Ok(([(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/json"))], bytes)
        .into_response())
}

async fn load(State(s): State<AppState>, b: Bytes) -> ApiResult {
    let v = body(&b)?;
    let path = std::path::PathBuf::from(field(&v, "filePath")?);
    if !path.is_file() {
        return Err(ApiError::not_found(format!("no agent file at {}", path.display())));
    }
    let mut fleet = s.fleet.lock().await;
    let (info, config) = fleet.load_config(&path).map_err(ApiError::bad)?;
    drop(fleet);
    Ok(Json(json!({"id": info.id, "filePath": info.path, "config": config})))
}

async fn review(Query(q): Q) -> ApiResult {
    let path = q.get("filePath").ok_or_else(|| ApiError::bad("filePath is required (?filePath=…)"))?;
    if !std::path::Path::new(path).is_file() {
        return Err(ApiError::not_found(format!("no agent file at {path}")));
    }
    let v = tokio::task::spawn_blocking({
        let p = path.clone();
        move || crate::review::summary(std::path::Path::new(&p))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(ApiError::bad)?;
    Ok(Json(json!({"agentId": v["agentId"], "filePath": path, "reviewed": v["reviewed"], "summary": v})))
}

async fn review_accept(b: Bytes) -> ApiResult {
    let v = body(&b)?;
    let path = field(&v, "filePath")?.to_string();
    if !std::path::Path::new(&path).is_file() {
        return Err(ApiError::not_found(format!("no agent file at {path}")));
    }
    let summary = tokio::task::spawn_blocking(move || crate::review::summary(std::path::Path::new(&path)))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(ApiError::bad)?;
    let id = summary["agentId"].as_str().unwrap_or("").to_string();
    crate::review::mark_reviewed(&id).map_err(ApiError::internal)?;
    Ok(Json(json!({"agentId": id, "reviewed": true})))
}

async fn agent(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (_, path) = s.agent(&id).await?;
    let (id, config) = s.read(&id, |st| Ok(st.config_value()?)).await?;
    Ok(Json(json!({"id": id, "filePath": path, "config": config})))
}

pub async fn status_of(s: &AppState, key: &str) -> ApiResult<Value> {
    let (id, path) = s.agent(key).await?;
    let fleet = s.fleet.lock().await;
    let a = fleet.list().into_iter().find(|a| a.id == id).ok_or_else(|| ApiError::not_found(key))?;
    let state = fleet.state(&id);
    let stopped = fleet.is_stopped(&id);
    drop(fleet);
    let (_, (autostart, loop_count, pending)) = s
        .read(&id, |st| {
            let cfg = st.config_value()?;
            let n = st.loop_count()?;
            let pending = st.task_list(Some("pending_approval"))?.len();
            Ok((cfg["autostart"].as_bool().unwrap_or(false), n, pending))
        })
        .await?;
    let runtime_state = if stopped {
        "stopped"
    } else if pending > 0 {
        "awaiting_approval"
    } else {
        match state.as_str() {
            "active" => "thinking",
            "error" => "error",
            "suspended" => "suspended",
            _ => "idle",
        }
    };
    let started = s.fleet.lock().await.is_started(&id);
    Ok(
        json!({"id": id, "filePath": path, "name": a.name, "handle": a.handle, "autostart": autostart, "started": started,
        "state": state, "runtimeState": runtime_state, "targetState": Value::Null, "loopCount": loop_count}),
    )
}

async fn status(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    status_of(&s, &id).await.map(Json)
}

async fn start(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, _) = s.agent(&id).await?;
    s.fleet.lock().await.start(&id).await.map_err(ApiError::internal)?;
    let agent = status_of(&s, &id).await?;
    Ok(Json(json!({"success": true, "loaded": true, "startupTriggered": false, "agent": agent})))
}

async fn stop(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, _) = s.agent(&id).await?;
    s.fleet.lock().await.unload(&id).await.map_err(ApiError::internal)?;
    Ok(Json(json!({"success": true})))
}

async fn abort(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, _) = s.agent(&id).await?;
    s.fleet.lock().await.command(Command::Interrupt { agent: id }).map_err(ApiError::internal)?;
    Ok(Json(json!({"success": true})))
}

async fn set_state(State(s): State<AppState>, Path(id): Path<String>, b: Bytes) -> ApiResult {
    let v = body(&b)?;
    let state = field(&v, "state")?.to_string();
    let (id, _) = s.agent(&id).await?;
    s.fleet
        .lock()
        .await
        .command(Command::SetState { agent: id.clone(), state: state.clone() })
        .map_err(ApiError::bad)?;
    Ok(Json(json!({"agentId": id, "success": true, "state": state})))
}

fn valid_turn_id(t: &str) -> bool {
    !t.is_empty() && t.len() <= 64 && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A chat body: its text and the turn id. The turn takes the id the client
/// chose (so it can follow the turn's events from before it starts), else
/// one made here; either way the id answered is the one the events carry.
pub fn chat_body(b: &Bytes) -> Result<(String, String), ApiError> {
    let v = body(b)?;
    let text = v.get("text").and_then(Value::as_str).filter(|t| !t.trim().is_empty());
    let Some(text) = text else { return Err(ApiError::bad("text is required")) };
    let turn = match v.get("turnId").and_then(Value::as_str) {
        Some(t) if valid_turn_id(t) => t.to_string(),
        Some(_) => return Err(ApiError::bad("turnId must be 1 to 64 characters of [A-Za-z0-9_-]")),
        None => format!("turn_{}", crate::store::create::nanoid(12)),
    };
    Ok((text.to_string(), turn))
}

async fn chat(State(s): State<AppState>, Path(id): Path<String>, b: Bytes) -> Result<impl IntoResponse, ApiError> {
    let (text, turn) = chat_body(&b)?;
    let (id, _) = s.agent(&id).await?;
    s.fleet.lock().await.chat_as(&id, text, turn.clone()).map_err(ApiError::internal)?;
    Ok((StatusCode::ACCEPTED, Json(json!({"accepted": true, "turnId": turn}))))
}

async fn runtime(State(s): State<AppState>) -> ApiResult {
    let fleet = s.fleet.lock().await;
    let agents: Vec<Value> = fleet
        .list()
        .into_iter()
        .map(|a| {
            json!({"id": a.id, "name": a.name, "state": fleet.state(&a.id), "stopped": fleet.is_stopped(&a.id),
            "provider_configured": !fleet.unconfigured().contains_key(&a.id)})
        })
        .collect();
    Ok(Json(json!({"pid": std::process::id(), "uptime_ms": s.started.elapsed().as_millis() as u64,
        "fleetDir": s.fleet_dir, "eventCursor": s.bus.cursor(), "agents": agents})))
}

/// Providers as metadata only: ids, kinds, endpoints and where the key
/// comes from, never the key.
async fn providers(State(_s): State<AppState>) -> ApiResult {
    let settings = crate::providers::accounts::load().map_err(ApiError::internal)?;
    let mut out: Vec<Value> = settings
        .accounts
        .iter()
        .map(|a| {
            json!({"id": a.id, "type": a.kind, "baseUrl": a.base_url, "defaultModel": a.default_model,
                "hasKey": a.api_key.is_some() || a.api_key_env.as_ref().is_some_and(|v| std::env::var(v).is_ok()),
                "keySource": if a.api_key.is_some() { "settings" } else if a.api_key_env.is_some() { "env" } else { "none" }})
        })
        .collect();
    for (id, var) in
        [("anthropic", "ANTHROPIC_API_KEY"), ("openai", "OPENAI_API_KEY"), ("openrouter", "OPENROUTER_API_KEY")]
    {
        if !settings.accounts.iter().any(|a| a.id == id) {
            out.push(
                json!({"id": id, "type": id, "hasKey": std::env::var(var).is_ok(), "keySource": format!("env:{var}")}),
            );
        }
    }
    Ok(Json(json!({"providers": out})))
}

async fn runtime_usage(State(s): State<AppState>) -> ApiResult {
    let ids: Vec<String> = s.fleet.lock().await.list().into_iter().map(|a| a.id).collect();
    let mut agents = Vec::new();
    for id in ids {
        if let Ok(Json(u)) = resources::usage_of(&s, &id).await {
            agents.push(u);
        }
    }
    Ok(Json(json!({"agents": agents})))
}

/// The role of the token this request came with (the app hides what the
/// role may not do).
/// Also where agents are served (`mesh`: the mesh server's base URL, or
/// null when it is not running), for the app's serving marks.
/// And which runtime answers (`runtime_id`, `runtime_did`): a remote
/// checks it is still the fleet it was added as.
async fn whoami(State(s): State<AppState>, axum::Extension(role): axum::Extension<super::roles::Role>) -> Json<Value> {
    let m = s.fleet.lock().await.mesh.clone();
    Json(json!({"role": role, "mesh": m.base_url(), "runtime_id": m.runtime_id, "runtime_did": m.runtime_did}))
}

/// The peer table: other runtimes found by mDNS, the tailnet sweep and
/// the manual entries, each with its source and when it was last seen;
/// `refresh=true` sweeps first (`adf peers --refresh`).
async fn peers(State(s): State<AppState>, Query(q): Q) -> ApiResult {
    let refresh = match q.get("refresh").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => return Err(ApiError::bad(format!("refresh must be true or false, got \"{other}\""))),
    };
    let mesh = s.fleet.lock().await.mesh.clone();
    if refresh {
        mesh.sweep_now().await;
    }
    Ok(Json(mesh.peers_report().await))
}

/// The app-wide ledger (`adf usage --by … --json` through the daemon).
async fn ledger_usage(Query(q): Q) -> ApiResult {
    let by = match q.get("by").map(String::as_str) {
        None | Some("day") => crate::ledger::By::Day,
        Some("provider") => crate::ledger::By::Provider,
        Some("model") => crate::ledger::By::Model,
        Some("agent") => crate::ledger::By::Agent,
        Some(other) => return Err(ApiError::bad(format!("by must be day, provider, model or agent, got \"{other}\""))),
    };
    let since = match q.get("since") {
        Some(s) => Some(crate::cli::usage_since(s).map_err(|e| ApiError::bad(e.to_string()))?),
        None => None,
    };
    let v = tokio::task::spawn_blocking(move || {
        let l = crate::ledger::enable();
        let rows = l.report(by, since.as_deref())?;
        let (_, budget) = l.settings();
        Ok::<_, crate::ledger::LedgerError>(json!({"by": by, "since": since, "rows": rows,
            "fleet": {"budget": budget, "spent": l.fleet_spent()}, "notice": l.take_notice()}))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(v))
}

async fn diagnostics(State(s): State<AppState>) -> ApiResult {
    let Json(rt) = runtime(State(s.clone())).await?;
    Ok(Json(
        json!({"daemon": {"uptime": s.started.elapsed().as_secs(), "pid": std::process::id()}, "agents": rt["agents"]}),
    ))
}
