//! The owner's MCP routes: an agent's servers with their live status and
//! tools, adding one (connected first, its env and header values sealed in
//! the agent's credentials, never echoed back), a tool's flags, a restart,
//! removal. A server starts outside the agent's actor (a slow `initialize`
//! never holds a turn up) and the actor then takes the connection. The
//! agent's skills are read here too.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, patch, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use super::routes::body;
use super::{ApiError, ApiResult, AppState};
use crate::mcp::client::{ConnectError, Connection, ServerSpec, connect};
use crate::mcp::owner::{self, AddServer, Flags, push_server, server_entry};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/agents/{id}/mcp", get(list).post(add))
        .route("/agents/{id}/mcp/{name}", delete(remove))
        .route("/agents/{id}/mcp/{name}/restart", post(restart))
        .route("/agents/{id}/mcp/{name}/oauth", axum::routing::put(oauth_put))
        .route("/agents/{id}/mcp/{name}/tools/{tool}", patch(tool))
        .route("/agents/{id}/skills", get(skills))
        .route("/agents/{id}/messages", post(send_message))
}

/// Send an ALF message as the agent, without a turn (its messaging rules
/// apply as to `msg_send`): `{recipient, content, subject?, thread_id?}`.
async fn send_message(State(s): State<AppState>, Path(id): Path<String>, b: Bytes) -> ApiResult {
    let (id, _) = s.agent(&id).await?;
    let v = body(&b)?;
    for k in ["recipient", "content"] {
        if v[k].as_str().is_none_or(|t| t.trim().is_empty()) {
            return Err(ApiError::bad(format!("`{k}` (a non-empty string) is required")));
        }
    }
    let mut input = serde_json::Map::new();
    for k in ["recipient", "content", "subject", "thread_id", "parent_id"] {
        if let Some(t) = v[k].as_str() {
            input.insert(k.into(), json!(t));
        }
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let cmd = crate::runtime::agent::AgentCommand::Send { input: Value::Object(input), reply: tx };
    s.fleet.lock().await.send(&id, cmd).map_err(ApiError::internal)?;
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), rx)
        .await
        .map_err(|_| ApiError::internal("the agent did not send within 120 s"))?
        .map_err(|_| ApiError::internal("the agent stopped"))?;
    if out.is_error {
        return Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, out.content).with_code("SEND_FAILED"));
    }
    Ok(Json(json!({"agentId": id, "success": true, "result": out.content})))
}

/// The agent's skills (the fleet's and its own), invalid ones with the
/// reason.
async fn skills(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, index) = s
        .read(&id, |st| {
            let cfg = st.config_value()?;
            Ok(crate::knowledge::skills::index(st, Some(&crate::knowledge::skills::fleet_root()), &cfg))
        })
        .await?;
    Ok(Json(json!({"agentId": id, "skills": index.skills, "invalid": index.invalid})))
}

fn unprocessable(e: &ConnectError) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, format!("{e}; nothing was saved")).with_code("MCP_CONNECT_FAILED")
}

async fn list(State(s): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (id, servers) = s
        .write(&id, |ex| {
            let cfg = ex.store.config_value()?;
            Ok(owner::view(&cfg, &ex.mcp_status()))
        })
        .await?;
    Ok(Json(json!({"agentId": id, "servers": servers})))
}

async fn add(State(s): State<AppState>, Path(id): Path<String>, b: Bytes) -> ApiResult {
    // No agent is a 404 whatever the body says.
    let (id, cfg) = s.read(&id, |st| Ok(st.config_value()?)).await?;
    let v = body(&b)?;
    let name = v["name"].as_str().ok_or_else(|| ApiError::bad("`name` is required"))?.to_string();
    let command: Vec<String> = match &v["command"] {
        Value::Null => Vec::new(),
        Value::String(c) => std::iter::once(c.clone())
            .chain(v["args"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string))
            .collect(),
        Value::Array(a) => a.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        other => return Err(ApiError::bad(format!("`command` must be a string or an array, not {other}"))),
    };
    let add = AddServer {
        name: name.clone(),
        command,
        url: v["url"].as_str().map(str::to_string),
        env: owner::object_pairs(&v["env"], "env").map_err(ApiError::bad)?,
        headers: owner::object_pairs(&v["headers"], "headers").map_err(ApiError::bad)?,
        oauth: match &v["oauth"] {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            other => return Err(ApiError::bad(format!("`oauth` must be a string, not {other}"))),
        },
    };
    let (entry, sealed) = owner::entry(&add).map_err(ApiError::bad)?;
    let spec = ServerSpec::with_sealed(&entry, &sealed).map_err(ApiError::bad)?;
    if server_entry(&cfg, &name).is_some() {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("an MCP server named {name:?} is already configured"))
            .with_code("MCP_EXISTS"));
    }
    let conn = if v["connect"] == false {
        None
    } else {
        let scratch = s.write(&id, move |ex| Ok(ex.mcp_scratch(&add.name))).await?.1;
        Some(connect(&spec, &scratch).await.map_err(|e| unprocessable(&e))?)
    };
    let connected = conn.is_some();
    let sealed_count = sealed.len();
    let (id, new) = s
        .write(&id, move |ex| {
            let mut cfg = ex.store.config_value()?;
            if server_entry(&cfg, &name).is_some() {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    format!("an MCP server named {name:?} is already configured"),
                ));
            }
            for (purpose, value) in &sealed {
                ex.store.secret_set(purpose, value.as_bytes(), false)?;
            }
            push_server(&mut cfg, entry);
            ex.store.config_replace(cfg)?;
            Ok(conn.map(|c| ex.mcp_adopt(c).new).unwrap_or_default())
        })
        .await?;
    Ok(Json(json!({"agentId": id, "success": true, "server": v["name"], "connected": connected,
                   "tools": new, "sealed": sealed_count})))
}

async fn remove(State(s): State<AppState>, Path((id, name)): Path<(String, String)>) -> ApiResult {
    let (id, n) = s
        .write(&id, move |ex| {
            let cfg = ex.store.config_value()?;
            if server_entry(&cfg, &name).is_none() {
                return Err(ApiError::not_found(format!("no MCP server named {name:?}")));
            }
            ex.mcp_remove(&name).map_err(ApiError::internal)
        })
        .await?;
    Ok(Json(json!({"agentId": id, "success": true, "tools_removed": n})))
}

/// A finished OAuth sign-in for an HTTP server (`adf mcp login` on a held
/// file): sealed as `mcp:<server>:oauth` if it belongs to the server's URL;
/// the server starts with it at the next call or restart.
async fn oauth_put(State(s): State<AppState>, Path((id, name)): Path<(String, String)>, b: Bytes) -> ApiResult {
    let (id, _) = s.agent(&id).await?;
    let v = body(&b)?;
    let sealed =
        v["oauth"].as_str().ok_or_else(|| ApiError::bad("`oauth` (the sealed sign-in) is required"))?.to_string();
    let (id, _) = s
        .write(&id, move |ex| {
            let mut cfg = ex.store.config_value()?;
            let url = server_entry(&cfg, &name)
                .and_then(|e| e["url"].as_str())
                .map(str::to_string)
                .ok_or_else(|| ApiError::not_found(format!("no HTTP MCP server named {name:?}")))?;
            if crate::mcp::oauth::unseal(&sealed, &url).is_none() {
                return Err(ApiError::bad(format!("the sign-in is not for {url}")));
            }
            let purpose = crate::mcp::creds::purpose(&name, crate::mcp::oauth::KEY);
            ex.store.secret_set(&purpose, sealed.as_bytes(), false)?;
            if let Some(e) = cfg
                .pointer_mut("/mcp/servers")
                .and_then(Value::as_array_mut)
                .and_then(|a| a.iter_mut().find(|e| e["name"] == name.as_str()))
            {
                e["auth"] = json!("oauth");
            }
            ex.store.config_replace(cfg)?;
            ex.mcp_stop(&name);
            Ok(())
        })
        .await?;
    Ok(Json(json!({"agentId": id, "success": true})))
}

/// Stop the server, start it again outside the actor, hand it back.
async fn restart(State(s): State<AppState>, Path((id, name)): Path<(String, String)>) -> ApiResult {
    let n = name.clone();
    let (id, (spec, scratch)) = s
        .write(&id, move |ex| {
            let cfg = ex.store.config_value()?;
            let server = server_entry(&cfg, &n)
                .cloned()
                .ok_or_else(|| ApiError::not_found(format!("no MCP server named {n:?}")))?;
            ex.mcp_stop(&n);
            Ok((ex.mcp_spec(&server).map_err(ApiError::bad)?, ex.mcp_scratch(&n)))
        })
        .await?;
    let started: Result<Connection, ConnectError> = connect(&spec, &scratch).await;
    let (id, answer) = s
        .write(&id, move |ex| {
            Ok(match started {
                Ok(conn) => {
                    let tools = conn.tools.len();
                    let o = ex.mcp_adopt(conn);
                    json!({"success": true, "name": name, "tools_discovered": tools, "new": o.new,
                           "changed": o.changed_tools, "removed": o.removed,
                           "message": format!("Server \"{name}\" reconnected: {tools} tools; your tool choices are kept.")})
                }
                Err(e) => {
                    ex.mcp_failed(&e);
                    json!({"success": false, "name": name, "tools_discovered": 0, "connection_error": e.reason,
                           "stderr_tail": e.stderr_tail,
                           "message": format!("Server \"{name}\" could not reconnect.")})
                }
            })
        })
        .await?;
    let mut out = answer;
    out["agentId"] = json!(id);
    Ok(Json(out))
}

async fn tool(
    State(s): State<AppState>,
    Path((id, server, tool)): Path<(String, String, String)>,
    b: Bytes,
) -> ApiResult {
    let (id, _) = s.read(&id, |_| Ok(())).await?;
    let flags = Flags::from_json(&body(&b)?).map_err(ApiError::bad)?;
    let (id, d) = s
        .write(&id, move |ex| {
            let mut cfg = ex.store.config_value()?;
            let d = owner::set_tool_flags(&mut cfg, &server, &tool, flags).map_err(|e| {
                if e.contains("locked") { ApiError::new(StatusCode::FORBIDDEN, e) } else { ApiError::not_found(e) }
            })?;
            ex.store.config_replace(cfg)?;
            Ok(d)
        })
        .await?;
    Ok(Json(json!({"agentId": id, "success": true, "tool": d})))
}
