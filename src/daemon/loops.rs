//! The control API of side loops (issue 18): list, create, change, pause
//! and delete an agent's loops, talk to one and read its stream. Changes
//! go through the agent's actor, like every other write.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use super::routes::{Q, body, field, int};
use super::{ApiError, ApiResult, AppState};
use crate::runtime::agent::AgentCommand;
use crate::store::loops;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/agents/{id}/loops", get(list).post(create))
        .route("/agents/{id}/loops/{name}", axum::routing::patch(update).delete(remove))
        .route("/agents/{id}/loops/{name}/chat", post(chat).get(history))
        .route("/agents/{id}/loops/{name}/events", get(events))
        .route("/agents/{id}/context", get(context))
        .route("/agents/{id}/budgets", get(budgets))
        .route("/agents/{id}/logs", get(logs))
        .route("/agents/{id}/why", get(why))
}

async fn list(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, (list, waiting)) = s.read(&id, |st| Ok((st.loops_list()?, st.loop_mail_counts()?))).await?;
    let waiting: std::collections::HashMap<String, i64> = waiting.into_iter().collect();
    let loops: Vec<Value> = list
        .iter()
        .map(|d| {
            let mut v = loops::to_json(d);
            v["waiting"] = json!(waiting.get(&d.name).copied().unwrap_or(0));
            v
        })
        .collect();
    Ok(Json(json!({"agentId": id, "max": loops::MAX_SIDE_LOOPS, "loops": loops})))
}

async fn create(State(s): State<AppState>, Path(id): Path<String>, b: Bytes) -> ApiResult {
    let v = body(&b)?;
    let name = field(&v, "name")?.to_string();
    let spec = crate::runtime::executor::side::spec_from(&v).map_err(ApiError::bad)?;
    let (id, def) = s
        .write(&id, move |ex| {
            let def = ex.store.loop_create(&name, &spec).map_err(ApiError::from)?;
            ex.loops_changed(&name, "created");
            Ok(def)
        })
        .await?;
    Ok(Json(json!({"agentId": id, "loop": loops::to_json(&def)})))
}

/// Change a loop's definition, or pause (`"status": "paused"`) and resume
/// (`"status": "idle"`) it.
async fn update(State(s): State<AppState>, Path((id, name)): Path<(String, String)>, b: Bytes) -> ApiResult {
    let v = body(&b)?;
    let status = match v.get("status").map(|s| s.as_str()) {
        None => None,
        Some(Some(st @ ("paused" | "idle"))) => Some(st.to_string()),
        Some(_) => return Err(ApiError::bad("status is \"paused\" or \"idle\"")),
    };
    let spec = crate::runtime::executor::side::spec_from(&v).map_err(ApiError::bad)?;
    let (id, def) = s
        .write(&id, move |ex| {
            let mut def = ex.store.loop_update(&name, &spec).map_err(ApiError::from)?;
            if let Some(st) = status {
                ex.store.loop_set_status(&name, &st, def.next_run_at).map_err(ApiError::from)?;
                def.status = st;
            }
            ex.loops_changed(&name, &def.status);
            Ok(def)
        })
        .await?;
    Ok(Json(json!({"agentId": id, "loop": loops::to_json(&def)})))
}

async fn remove(State(s): State<AppState>, Path((id, name)): Path<(String, String)>) -> ApiResult {
    let (id, n) = s
        .write(&id, move |ex| {
            let n = ex.delete_loop(&name).map_err(ApiError::from)?;
            ex.loops_changed(&name, "deleted");
            Ok(n)
        })
        .await?;
    Ok(Json(json!({"agentId": id, "success": true, "archivedRows": n})))
}

async fn chat(
    State(s): State<AppState>,
    Path((id, name)): Path<(String, String)>,
    b: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let (text, turn) = super::routes::chat_body(&b)?;
    let (id, def) = s
        .read(&id, {
            let name = name.clone();
            move |st| Ok(st.loop_get(&name)?)
        })
        .await?;
    let Some(def) = def else { return Err(ApiError::not_found(format!("no loop named {name:?}"))) };
    if def.status == "paused" {
        return Err(ApiError::bad(format!("loop {name:?} is paused; resume it first")));
    }
    let cmd = AgentCommand::LoopChat { name, text, turn_id: Some(turn.clone()) };
    s.fleet.lock().await.send(&id, cmd).map_err(ApiError::internal)?;
    Ok((StatusCode::ACCEPTED, Json(json!({"accepted": true, "turnId": turn}))))
}

async fn history(State(s): State<AppState>, Path((id, name)): Path<(String, String)>, Query(q): Q) -> ApiResult {
    let after = int(&q, "after", 0, 0, super::routes::MAX_SAFE)?;
    let (id, rows) = s
        .read(&id, move |st| {
            if st.loop_get(&name)?.is_none() {
                return Err(ApiError::not_found(format!("no loop named {name:?}")));
            }
            Ok(st.side_rows_after(&name, after)?)
        })
        .await?;
    let rows: Vec<Value> = rows.iter().map(super::resources::row_json).collect();
    Ok(Json(json!({"agentId": id, "rows": rows})))
}

/// `GET /agents/{id}/loops/{name}/events`: the agent's event stream, only
/// what that loop did.
async fn events(
    State(s): State<AppState>,
    Path((id, name)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    Query(mut q): Q,
) -> Result<axum::response::Response, ApiError> {
    let (id, def) = s
        .read(&id, {
            let name = name.clone();
            move |st| Ok(st.loop_get(&name)?)
        })
        .await?;
    if def.is_none() && name != "main" {
        return Err(ApiError::not_found(format!("no loop named {name:?}")));
    }
    q.insert("agentId".into(), id);
    q.insert("loop".into(), name);
    super::sse::events(State(s), headers, Query(q)).await
}

/// `GET /agents/{id}/budgets`: the agent's and its loops' budgets with
/// what they spent (no loop rows read).
async fn budgets(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, b) = s.read(&id, |st| Ok(crate::runtime::budget::in_use(st)?)).await?;
    Ok(Json(json!({"agentId": id, "budgets": b})))
}

/// `GET /agents/{id}/logs?level&origin&after&limit`: `adf_logs` rows,
/// oldest first (the newest `limit` that match, after id `after`).
async fn logs(State(s): State<AppState>, Path(id): Path<String>, Query(q): Q) -> ApiResult {
    let after = int(&q, "after", 0, 0, super::routes::MAX_SAFE)?;
    let limit = int(&q, "limit", 100, 1, 1000)?;
    let level = q.get("level").cloned();
    if let Some(l) = &level
        && !crate::store::logs::LEVELS.contains(&l.as_str())
    {
        return Err(ApiError::bad(format!("level {l:?} is not one of {}", crate::store::logs::LEVELS.join(", "))));
    }
    let origin = q.get("origin").cloned();
    let (id, rows) = s
        .read(&id, move |st| {
            let lq = crate::store::logs::LogQuery { level: level.as_deref(), origin: origin.as_deref(), after, limit };
            Ok(st.log_list(&lq)?)
        })
        .await?;
    Ok(Json(json!({"agentId": id, "logs": rows})))
}

/// `GET /agents/{id}/why`: `adf why` with the live state.
async fn why(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, _) = s.agent(&id).await?;
    let (live, activity, lanes) = {
        let f = s.fleet.lock().await;
        (f.state(&id), f.activity(&id), f.lane_waits(&id))
    };
    let (id, mut v) = s.read(&id, |st| Ok(crate::runtime::why::explain(st, None)?)).await?;
    v["state"] = json!(live);
    // What the runtime is doing now comes first: the file cannot say.
    if let Some(a) = &activity
        && a.state_since > 0
    {
        v["state_since"] = json!(
            chrono::DateTime::from_timestamp_millis(a.state_since).map(|d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        );
    }
    if let Some(list) = v["waiting_on"].as_array_mut() {
        let now = crate::store::now_ms();
        let live = activity.map(|a| a.waiting(now)).unwrap_or_default();
        let lanes = lanes
            .into_iter()
            .map(|(lane, running, queued)| json!({"what": "lane", "lane": lane, "running": running, "queued": queued}));
        for (i, w) in live.into_iter().chain(lanes).enumerate() {
            list.insert(i, w);
        }
    }
    v["agentId"] = json!(id);
    Ok(Json(v))
}

/// `GET /agents/{id}/context?loop=NAME`: the context gauge of a loop.
async fn context(State(s): State<AppState>, Path(id): Path<String>, Query(q): Q) -> ApiResult {
    let lp = q.get("loop").cloned().filter(|l| l != "main");
    let overrides = crate::providers::windows::overrides();
    let (_, cfg) = s.read(&id, |st| Ok(st.config_value()?)).await?;
    let probed = crate::providers::windows::probe(&cfg).await;
    let (id, g) = s
        .read(&id, move |st| Ok(crate::runtime::context::measure(st, lp.as_deref(), overrides.as_ref(), probed)?))
        .await?;
    let mut v = serde_json::to_value(&g).map_err(|e| ApiError::internal(e.to_string()))?;
    v["agentId"] = json!(id);
    Ok(Json(v))
}
