//! The control API of scoped, time-boxed grants (issue 19,
//! `store::grants`): list, add and revoke an agent's grants; and of its
//! channel adapters (issue 20): how each is doing, connecting one. Writes
//! go through the agent, like every other; only the owner's token may make
//! them (an approver answers one approval at a time).

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde_json::{Value, json};

use super::routes::{Q, body, field};
use super::{ApiError, ApiResult, AppState};
use crate::store::grants::{NewGrant, parse_duration};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/agents/{id}/grants", get(list).post(add))
        .route("/agents/{id}/grants/{grant}", delete(remove))
        .route("/agents/{id}/adapters", get(adapters).post(adapter_add))
        .route("/agents/{id}/adapters/{kind}", delete(adapter_remove))
        .route("/agents/{id}/compute", get(compute))
}

/// Where the agent's commands run, what runs now, its last commands.
async fn compute(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let q = crate::store::logs::LogQuery { level: None, origin: Some("compute"), after: 0, limit: 200 };
    let (id, (cfg, logs, files)) = s
        .read(&id, move |st| {
            let logs: Vec<Value> = st.log_list(&q)?.into_iter().filter_map(|r| serde_json::to_value(r).ok()).collect();
            Ok((st.config_value()?, logs, st.file_list("screenshots/")?))
        })
        .await?;
    let live = crate::runtime::compute::summary::live(&id);
    let settings = crate::runtime::compute::Settings::load();
    let engine = crate::runtime::compute::containers::engine_for(&settings).await.is_ok();
    let v = crate::runtime::compute::summary::view(&cfg, &settings, engine, &logs, &files, live);
    Ok(Json(json!({"agentId": id, "compute": v})))
}

/// Connect a channel (the owner's): the token sealed, never answered back.
async fn adapter_add(State(s): State<AppState>, Path(id): Path<String>, b: Bytes) -> ApiResult {
    let mut v = body(&b)?;
    let kind = field(&v, "type")?.to_string();
    field(&v, "token")?;
    // The owner's default: direct messages from everyone.
    if v.get("dm").is_none() {
        v["dm"] = json!("all");
    }
    let (id, out) = s.write(&id, move |ex| Ok(ex.adapter_connect(&v))).await?;
    let message = out.map_err(ApiError::bad)?;
    Ok(Json(json!({"agentId": id, "adapter": kind, "message": message})))
}

/// Disconnect a channel (the owner's): config and credentials go.
async fn adapter_remove(State(s): State<AppState>, Path((id, kind)): Path<(String, String)>) -> ApiResult {
    let k = kind.clone();
    let (id, out) = s.write(&id, move |ex| Ok(ex.adapter_disconnect(&k))).await?;
    let message = out.map_err(ApiError::not_found)?;
    Ok(Json(json!({"agentId": id, "adapter": kind, "message": message})))
}

/// How each channel of a running agent is doing.
async fn adapters(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, _) = s.agent(&id).await?;
    let list = s.fleet.lock().await.channel_status(&id);
    let v: Vec<Value> = list
        .into_iter()
        .map(|(kind, st)| {
            let mut v = serde_json::to_value(st).unwrap_or_default();
            v["kind"] = json!(kind);
            v
        })
        .collect();
    Ok(Json(json!({"agentId": id, "adapters": v})))
}

async fn list(State(s): State<AppState>, Path(id): Path<String>, Query(q): Q) -> ApiResult {
    let all = match q.get("all").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => return Err(ApiError::bad(format!("all must be true or false, got \"{other}\""))),
    };
    let (id, list) = s.read(&id, move |st| Ok(st.grant_list(all)?)).await?;
    Ok(Json(json!({"agentId": id, "grants": list})))
}

async fn add(State(s): State<AppState>, Path(id): Path<String>, b: Bytes) -> ApiResult {
    // An unknown agent is that, whatever the body says.
    s.agent(&id).await?;
    let v = body(&b)?;
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let for_ms = match v.get("for") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(parse_duration(d).map_err(ApiError::bad)?),
        Some(other) => return Err(ApiError::bad(format!("for must be a duration like \"30m\", got {other}"))),
    };
    let g = NewGrant {
        tool: field(&v, "tool")?.to_string(),
        path: text("path"),
        host: text("host"),
        for_ms,
        note: text("note").unwrap_or_default(),
    }
    .check()
    .map_err(ApiError::bad)?;
    let (id, grant) = s.write(&id, move |ex| Ok(ex.store.grant_add(g)?)).await?;
    Ok(Json(json!({"agentId": id, "grant": grant})))
}

async fn remove(State(s): State<AppState>, Path((id, grant)): Path<(String, String)>) -> ApiResult {
    let g = grant.clone();
    let (id, found) = s.write(&id, move |ex| Ok(ex.store.grant_remove(&g)?)).await?;
    if !found {
        return Err(ApiError::not_found(format!("no grant {grant}")));
    }
    Ok(Json(json!({"agentId": id, "removed": grant})))
}
