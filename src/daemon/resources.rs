//! Per-agent resources of the control API: config, the document and mind,
//! the loop, files, meta, local tables, inbox and outbox, timers, tasks
//! and approvals, asks, usage. Reads run on a read-only connection; writes
//! go through the agent's actor as the owner (spec/daemon.md §4.9–4.10).

use std::collections::BTreeMap;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post, put};
use base64::Engine;
use serde_json::{Value, json};

use super::routes::{Q, body, field, int};
use super::{ApiError, ApiResult, AppState};
use crate::protocol::Command;
use crate::store::Caller;
use crate::store::files::{Protection, WriteOptions};
use crate::store::meta::MetaProtection;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/agents/{id}/config", get(config).put(put_config))
        .route("/agents/{id}/document", get(document).put(put_document))
        .route("/agents/{id}/mind", get(mind).put(put_mind))
        .route("/agents/{id}/loop", get(loop_page))
        .route("/agents/{id}/usage", get(usage))
        .route("/agents/{id}/files", get(files))
        .route("/agents/{id}/files/content", get(file_get).put(file_put).delete(file_delete))
        .route("/agents/{id}/files/rename", post(file_rename))
        .route("/agents/{id}/files/protection", axum::routing::patch(file_protection))
        .route("/agents/{id}/files/authorized", axum::routing::patch(file_authorized))
        .route("/agents/{id}/meta", get(meta))
        .route("/agents/{id}/meta/{key}", put(meta_put).delete(meta_delete))
        .route("/agents/{id}/tables", get(tables))
        .route("/agents/{id}/tables/{table}", get(table))
        .route("/agents/{id}/inbox", get(inbox))
        .route("/agents/{id}/outbox", get(outbox))
        .route("/agents/{id}/timers", get(timers).post(timer_create))
        .route("/agents/{id}/timers/{timer}", axum::routing::delete(timer_delete))
        .route("/agents/{id}/tasks", get(tasks))
        .route("/agents/{id}/tasks/{task}", get(task))
        .route("/agents/{id}/tasks/{task}/resolve", post(resolve))
        .route("/agents/{id}/asks", get(asks))
        .route("/agents/{id}/asks/{request}/respond", post(respond))
}

async fn config(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, config) = s.read(&id, |st| Ok(st.config_value()?)).await?;
    Ok(Json(json!({"agentId": id, "config": config})))
}

async fn put_config(State(s): State<AppState>, Path(id): Path<String>, b: Bytes) -> ApiResult {
    let v = body(&b)?;
    if !v.is_object() {
        return Err(ApiError::bad("the config must be a JSON object"));
    }
    let (id, config) = s
        .write(&id, move |ex| {
            ex.store.config_replace(v)?;
            Ok(ex.store.config_value()?)
        })
        .await?;
    Ok(Json(json!({"agentId": id, "success": true, "config": config})))
}

async fn text_file(s: &AppState, id: &str, path: &'static str) -> ApiResult {
    let (id, content) = s
        .read(id, move |st| {
            let p = if path == "README.md" && st.file_stat("README.md")?.is_none() { "document.md" } else { path };
            Ok(st.file_read_text(p).unwrap_or_default())
        })
        .await?;
    Ok(Json(json!({"agentId": id, "content": content})))
}

async fn put_text_file(s: &AppState, id: &str, path: &'static str, b: &Bytes) -> ApiResult {
    let v = body(b)?;
    let content = field(&v, "content")?.to_string();
    let (id, _) = s.write(id, move |ex| Ok(ex.owner_write(path, content.as_bytes())?)).await?;
    Ok(Json(json!({"agentId": id, "success": true})))
}

async fn document(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    text_file(&s, &id, "README.md").await
}
async fn put_document(State(s): State<AppState>, Path(id): Path<String>, b: Bytes) -> ApiResult {
    put_text_file(&s, &id, "README.md", &b).await
}
async fn mind(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    text_file(&s, &id, "mind.md").await
}
async fn put_mind(State(s): State<AppState>, Path(id): Path<String>, b: Bytes) -> ApiResult {
    put_text_file(&s, &id, "mind.md", &b).await
}

pub fn row_json(r: &crate::store::loop_rows::LoopRow) -> Value {
    json!({"seq": r.seq, "role": r.role, "content": r.content, "model": r.model, "tokens": r.tokens,
        "created_at": r.created_at, "ord": r.ord})
}

/// `GET /agents/:id/loop?limit&offset` (default: the last page), or
/// `?after=SEQ`: the rows appended after a seq (a follower).
async fn loop_page(State(s): State<AppState>, Path(id): Path<String>, Query(q): Q) -> Result<Response, ApiError> {
    if q.contains_key("after") {
        let after = int(&q, "after", 0, i64::MIN, i64::MAX)?;
        let limit = int(&q, "limit", 5000, 1, 5000)?;
        return s
            .read_json(&id, move |st, id| {
                let entries: Vec<Value> = st.loop_rows_after_page(after, limit)?.iter().map(row_json).collect();
                Ok(json!({"agentId": id, "after": after, "limit": limit, "entries": entries}))
            })
            .await;
    }
    let limit = int(&q, "limit", 50, 1, 500)?;
    let offset = q.get("offset").map(|_| int(&q, "offset", 0, 0, i64::MAX)).transpose()?;
    s.read_json(&id, move |st, id| {
        let total = st.loop_count()?;
        let offset = offset.unwrap_or((total - limit).max(0));
        let entries: Vec<Value> = st.loop_page(offset, limit)?.iter().map(row_json).collect();
        Ok(json!({"agentId": id, "total": total, "limit": limit, "offset": offset, "entries": entries}))
    })
    .await
}

/// `GET /agents/:id/chat?limit`: the tail of the loop, for a chat view.
pub async fn chat_history(
    State(s): State<AppState>,
    Path(id): Path<String>,
    Query(q): Q,
) -> Result<Response, ApiError> {
    let limit = int(&q, "limit", 200, 1, 500)?;
    s.read_json(&id, move |st, id| {
        let total = st.loop_count()?.max(0) as usize;
        let skip = total.saturating_sub(limit as usize);
        let entries: Vec<Value> = st.loop_page(skip as i64, limit)?.iter().map(row_json).collect();
        let earlier = total.saturating_sub(entries.len());
        Ok(json!({"agentId": id, "chatHistory": {"version": 1, "uiLog": entries, "llmMessages": [], "total": total,
            "earlierCount": earlier}}))
    })
    .await
}

/// `DELETE /agents/:id/chat`: clear the loop (audited when loop audit is on).
pub async fn clear_loop(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, _) = s.write(&id, |ex| ex.clear_loop_as_owner().map_err(ApiError::from)).await?;
    Ok(Json(json!({"agentId": id, "success": true})))
}

pub async fn usage_of(s: &AppState, id: &str) -> ApiResult {
    let (id, (rows, budgets)) = s.read(id, |st| Ok((st.loop_rows(None)?, crate::runtime::budget::in_use(st)?))).await?;
    let prices =
        crate::providers::accounts::load().map(|s| crate::providers::prices::from_settings(&s)).unwrap_or_default();
    let mut by_model: BTreeMap<String, Value> = BTreeMap::new();
    let (mut input, mut output, mut cost, mut calls) = (0u64, 0u64, 0f64, 0u64);
    let mut usage_rows = 0;
    for r in rows.iter().filter(|r| r.role == "assistant") {
        let Some(t) = &r.tokens else { continue };
        usage_rows += 1;
        let u: crate::providers::Usage = serde_json::from_value(t.clone()).unwrap_or_default();
        let model = r.model.clone().unwrap_or_else(|| "(unknown)".into());
        let c = crate::providers::prices::cost(&prices, &model, &u);
        let e = by_model.entry(model).or_insert_with(|| json!({"calls": 0, "input_tokens": 0, "output_tokens": 0}));
        e["calls"] = json!(e["calls"].as_u64().unwrap_or(0) + 1);
        e["input_tokens"] = json!(e["input_tokens"].as_u64().unwrap_or(0) + u.input);
        e["output_tokens"] = json!(e["output_tokens"].as_u64().unwrap_or(0) + u.output);
        if let Some(c) = c {
            e["cost_usd"] = json!(e["cost_usd"].as_f64().unwrap_or(0.0) + c);
            cost += c;
        }
        input += u.input;
        output += u.output;
        calls += 1;
    }
    Ok(Json(json!({"agentId": id, "source": "adf_loop", "note": "token counts of the assistant rows of the loop",
        "loopRows": rows.len(), "usageRows": usage_rows,
        "totals": {"calls": calls, "input_tokens": input, "output_tokens": output, "cost_usd": cost},
        "byModel": by_model, "budgets": budgets})))
}

async fn usage(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    usage_of(&s, &id).await
}

async fn files(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, list) = s.read(&id, |st| Ok(st.file_list("")?)).await?;
    let files: Vec<Value> = list
        .iter()
        .map(|e| {
            json!({"path": e.path, "size": e.size, "mime_type": e.mime_type, "protection": e.protection.as_str(),
            "authorized": e.authorized, "created_at": e.created_at, "updated_at": e.updated_at})
        })
        .collect();
    Ok(Json(json!({"agentId": id, "files": files})))
}

fn path_param(q: &std::collections::HashMap<String, String>) -> Result<String, ApiError> {
    q.get("path").filter(|p| !p.is_empty()).cloned().ok_or_else(|| ApiError::bad("path is required (?path=…)"))
}

async fn file_get(State(s): State<AppState>, Path(id): Path<String>, Query(q): Q) -> ApiResult {
    let path = path_param(&q)?;
    let p2 = path.clone();
    let (id, (e, bytes)) = s
        .read(&id, move |st| match st.file_stat(&p2)? {
            None => Err(ApiError::not_found(format!("no file {p2}"))),
            Some(_) => Ok(st.file_read(&p2)?),
        })
        .await?;
    let mut out = json!({"agentId": id, "path": path, "mime_type": e.mime_type, "size": e.size,
        "protection": e.protection.as_str(), "authorized": e.authorized, "created_at": e.created_at,
        "updated_at": e.updated_at});
    match (e.is_text(), String::from_utf8(bytes)) {
        (true, Ok(text)) => {
            out["encoding"] = json!("utf-8");
            out["content"] = json!(text);
        }
        (_, Ok(text)) => {
            out["encoding"] = json!("base64");
            out["content_base64"] = json!(base64::engine::general_purpose::STANDARD.encode(text.as_bytes()));
        }
        (_, Err(e)) => {
            out["encoding"] = json!("base64");
            out["content_base64"] = json!(base64::engine::general_purpose::STANDARD.encode(e.as_bytes()));
        }
    }
    Ok(Json(out))
}

async fn file_put(State(s): State<AppState>, Path(id): Path<String>, Query(q): Q, b: Bytes) -> ApiResult {
    let v = body(&b)?;
    let path = match q.get("path") {
        Some(p) if !p.is_empty() => p.clone(),
        _ => field(&v, "path")?.to_string(),
    };
    let bytes = if let Some(t) = v.get("content").and_then(Value::as_str) {
        t.as_bytes().to_vec()
    } else if let Some(b64) = v.get("content_base64").or(v.get("contentBase64")).and_then(Value::as_str) {
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| ApiError::bad(format!("content_base64 is not base64: {e}")))?
    } else {
        return Err(ApiError::bad("content (a string) or content_base64 is required"));
    };
    let mime = v.get("mime_type").or(v.get("mimeType")).and_then(Value::as_str).map(str::to_string);
    let protection = match v.get("protection").and_then(Value::as_str) {
        Some(p) => Some(Protection::parse(p).map_err(ApiError::from)?),
        None => None,
    };
    let (id, _) = s
        .write(&id, move |ex| {
            let opts = WriteOptions { mime_type: mime.as_deref(), protection, max_bytes: None };
            Ok(ex.owner_write_with(&path, &bytes, &opts)?)
        })
        .await?;
    Ok(Json(json!({"agentId": id, "success": true})))
}

async fn file_delete(State(s): State<AppState>, Path(id): Path<String>, Query(q): Q) -> ApiResult {
    let path = path_param(&q)?;
    let (id, _) = s.write(&id, move |ex| Ok(ex.store.file_delete(Caller::Owner, &path)?)).await?;
    Ok(Json(json!({"agentId": id, "success": true})))
}

async fn file_rename(State(s): State<AppState>, Path(id): Path<String>, b: Bytes) -> ApiResult {
    let v = body(&b)?;
    let (from, to) = (field(&v, "oldPath")?.to_string(), field(&v, "newPath")?.to_string());
    let (id, _) = s.write(&id, move |ex| Ok(ex.store.file_rename(Caller::Owner, &from, &to)?)).await?;
    Ok(Json(json!({"agentId": id, "success": true})))
}

async fn file_protection(State(s): State<AppState>, Path(id): Path<String>, b: Bytes) -> ApiResult {
    let v = body(&b)?;
    let path = field(&v, "path")?.to_string();
    let level = Protection::parse(field(&v, "protection")?).map_err(ApiError::from)?;
    let (id, _) = s.write(&id, move |ex| Ok(ex.store.file_set_protection(Caller::Owner, &path, level)?)).await?;
    Ok(Json(json!({"agentId": id, "success": true})))
}

/// The owner marks a file as authorized code (or clears the mark).
async fn file_authorized(State(s): State<AppState>, Path(id): Path<String>, b: Bytes) -> ApiResult {
    let v = body(&b)?;
    let path = field(&v, "path")?.to_string();
    let on = v
        .get("authorized")
        .and_then(Value::as_bool)
        .ok_or_else(|| ApiError::bad("authorized is required (true or false)"))?;
    let (id, _) = s.write(&id, move |ex| Ok(ex.store.file_set_authorized(&path, on)?)).await?;
    Ok(Json(json!({"agentId": id, "success": true})))
}

async fn meta(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, list) = s.read(&id, |st| Ok(st.meta_list()?)).await?;
    let entries: Vec<Value> =
        list.iter().map(|m| json!({"key": m.key, "value": m.value, "protection": m.protection.as_str()})).collect();
    Ok(Json(json!({"agentId": id, "entries": entries})))
}

async fn meta_put(State(s): State<AppState>, Path((id, key)): Path<(String, String)>, b: Bytes) -> ApiResult {
    let v = body(&b)?;
    let value = field(&v, "value")?.to_string();
    let protection = match v.get("protection").and_then(Value::as_str) {
        Some(p) => Some(MetaProtection::parse(p).map_err(ApiError::from)?),
        None => None,
    };
    let (id, _) = s.write(&id, move |ex| Ok(ex.store.meta_set(Caller::Owner, &key, &value, protection)?)).await?;
    Ok(Json(json!({"agentId": id, "success": true})))
}

async fn meta_delete(State(s): State<AppState>, Path((id, key)): Path<(String, String)>) -> ApiResult {
    let (id, found) = s.write(&id, move |ex| Ok(ex.store.meta_delete(Caller::Owner, &key)?)).await?;
    if !found {
        return Err(ApiError::not_found("no such meta key"));
    }
    Ok(Json(json!({"agentId": id, "success": true})))
}

async fn tables(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, list) = s.read(&id, |st| Ok(st.tables()?)).await?;
    Ok(Json(json!({"agentId": id, "tables": list})))
}

async fn table(State(s): State<AppState>, Path((id, name)): Path<(String, String)>, Query(q): Q) -> ApiResult {
    let ok = name == "adf_audit"
        || name
            .strip_prefix("local_")
            .is_some_and(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    if !ok {
        return Err(ApiError::bad(format!("Invalid table name: {name} (local_* tables and adf_audit only)")));
    }
    let limit = int(&q, "limit", 100, 1, 1000)?;
    let offset = int(&q, "offset", 0, 0, i64::MAX)?;
    let (id, (columns, rows)) = s
        .read(&id, move |st| {
            let sql = format!("SELECT * FROM \"{name}\" LIMIT {limit} OFFSET {offset}");
            let out = st.owner_query(&sql)?;
            Ok(out)
        })
        .await?;
    Ok(Json(json!({"agentId": id, "columns": columns, "rows": rows})))
}

async fn message_list(
    s: &AppState,
    id: &str,
    table: &'static str,
    q: &std::collections::HashMap<String, String>,
) -> ApiResult {
    let status = q.get("status").cloned();
    let (id, (_, rows)) = s
        .read(id, move |st| {
            let sql = match &status {
                Some(v) => format!("SELECT * FROM {table} WHERE status = '{}' ORDER BY rowid", v.replace('\'', "''")),
                None => format!("SELECT * FROM {table} ORDER BY rowid"),
            };
            Ok(st.owner_query(&sql)?)
        })
        .await?;
    Ok(Json(json!({"agentId": id, "messages": rows})))
}

async fn inbox(State(s): State<AppState>, Path(id): Path<String>, Query(q): Q) -> ApiResult {
    message_list(&s, &id, "adf_inbox", &q).await
}
async fn outbox(State(s): State<AppState>, Path(id): Path<String>, Query(q): Q) -> ApiResult {
    message_list(&s, &id, "adf_outbox", &q).await
}

async fn timers(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, list) = s.read(&id, |st| Ok(st.timer_list(false)?)).await?;
    Ok(Json(json!({"agentId": id, "timers": list})))
}

async fn timer_create(State(s): State<AppState>, Path(id): Path<String>, b: Bytes) -> ApiResult {
    let mut v = body(&b)?;
    if v.get("scope").is_none() {
        v["scope"] = json!(["agent"]);
    }
    let (id, out) = s.write(&id, move |ex| ex.owner_set_timer(&v).map_err(ApiError::bad)).await?;
    Ok(Json(json!({"agentId": id, "success": true, "id": out})))
}

async fn timer_delete(State(s): State<AppState>, Path((id, timer)): Path<(String, String)>) -> ApiResult {
    let n: i64 = timer.parse().map_err(|_| ApiError::bad(format!("timer id must be an integer, got \"{timer}\"")))?;
    let (id, _) = s.write(&id, move |ex| Ok(ex.store.timer_delete(Caller::Owner, n)?)).await?;
    Ok(Json(json!({"agentId": id, "success": true})))
}

fn task_json(t: &crate::store::tasks::Task) -> Value {
    json!({"id": t.id, "tool": t.tool, "args": t.args, "status": t.status, "result": t.result, "error": t.error,
        "created_at": t.created_at, "completed_at": t.completed_at, "origin": t.origin,
        "requires_authorization": t.requires_authorization, "executor_managed": t.executor_managed,
        "approval_meta": t.approval_meta})
}

/// `GET /attention`: what waits on the owner across the fleet (approvals
/// and asks), in one answer: an app over many hosts asks each once instead
/// of once per agent.
pub async fn attention(State(s): State<AppState>) -> ApiResult {
    let ids: Vec<String> = s.fleet.lock().await.list().into_iter().map(|a| a.id).collect();
    let mut out = Vec::new();
    for id in ids {
        let read = s
            .read(&id, |st| {
                let mut l = st.task_list(Some("pending_approval"))?;
                l.extend(st.task_list(Some("pending"))?.into_iter().filter(|t| t.tool == "ask"));
                Ok(l.iter().map(task_json).collect::<Vec<_>>())
            })
            .await;
        // An agent unloaded meanwhile has nothing waiting.
        let Ok((id, tasks)) = read else { continue };
        for mut t in tasks {
            t["agentId"] = json!(id);
            out.push(t);
        }
    }
    Ok(Json(json!({"tasks": out})))
}

async fn tasks(State(s): State<AppState>, Path(id): Path<String>, Query(q): Q) -> ApiResult {
    let status = q.get("status").cloned();
    let limit = int(&q, "limit", 200, 1, 1000)? as usize;
    let (id, list) = s
        .read(&id, move |st| {
            let mut l = st.task_list(status.as_deref())?;
            if status.is_none() {
                l.sort_by_key(|t| std::cmp::Reverse(t.created_at));
                l.truncate(limit);
            }
            Ok(l.iter().map(task_json).collect::<Vec<_>>())
        })
        .await?;
    Ok(Json(json!({"agentId": id, "tasks": list})))
}

async fn get_task(s: &AppState, id: &str, task: &str) -> Result<(String, crate::store::tasks::Task), ApiError> {
    let t = task.to_string();
    s.read(id, move |st| st.task_get(&t)?.ok_or_else(|| ApiError::not_found(format!("no task {t}")))).await
}

async fn task(State(s): State<AppState>, Path((id, task)): Path<(String, String)>) -> ApiResult {
    let (id, t) = get_task(&s, &id, &task).await?;
    Ok(Json(json!({"agentId": id, "task": task_json(&t)})))
}

async fn resolve(
    State(s): State<AppState>,
    Path((id, task)): Path<(String, String)>,
    axum::Extension(role): axum::Extension<super::roles::Role>,
    b: Bytes,
) -> ApiResult {
    let v = body(&b)?;
    let action = field(&v, "action")?.to_string();
    if !["approve", "deny"].contains(&action.as_str()) {
        return Err(ApiError::bad(format!("action must be approve or deny, got \"{action}\"")));
    }
    // "Always" changes the agent's config: the owner's call alone.
    if v["always"].as_bool() == Some(true) && role != super::roles::Role::Owner {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("this token's role is {}: it may approve once, not lift the gate (always)", role.as_str()),
        )
        .with_code("FORBIDDEN_ROLE"));
    }
    let (id, t) = get_task(&s, &id, &task).await?;
    if t.status != "pending_approval" && t.status != "pending" {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("task {task} is {}, not pending", t.status)));
    }
    let cmd = if action == "approve" {
        Command::Approve { agent: id.clone(), task_id: task.clone(), always: v["always"].as_bool().unwrap_or(false) }
    } else {
        let feedback = v.get("reason").and_then(Value::as_str).map(str::to_string);
        Command::Deny { agent: id.clone(), task_id: task.clone(), feedback }
    };
    s.fleet.lock().await.command(cmd).map_err(ApiError::internal)?;
    let status = if action == "approve" { "approved" } else { "denied" };
    Ok(Json(json!({"agentId": id, "taskId": task, "resolution": {"task_id": task, "status": status},
        "task": task_json(&t)})))
}

async fn asks(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, list) = s
        .read(&id, |st| {
            Ok(st
                .task_list(Some("pending"))?
                .into_iter()
                .filter(|t| t.tool == "ask")
                .map(|t| json!({"requestId": t.id, "question": t.args["question"]}))
                .collect::<Vec<_>>())
        })
        .await?;
    Ok(Json(json!({"agentId": id, "asks": list})))
}

async fn respond(State(s): State<AppState>, Path((id, request)): Path<(String, String)>, b: Bytes) -> ApiResult {
    let v = body(&b)?;
    let answer = v
        .get("answer")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad("answer is required (a string)"))?
        .to_string();
    let (id, t) = get_task(&s, &id, &request).await?;
    if t.tool != "ask" || t.status != "pending" {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("{request} is not a pending ask")));
    }
    s.fleet
        .lock()
        .await
        .command(Command::Answer { agent: id.clone(), request_id: request.clone(), text: answer })
        .map_err(ApiError::internal)?;
    Ok(Json(json!({"agentId": id, "requestId": request, "answered": true})))
}
