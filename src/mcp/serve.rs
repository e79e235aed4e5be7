//! `adf mcp serve`: adf as an MCP server, so Claude Code, Codex or any MCP
//! client can work with a fleet over stdio (or Streamable HTTP on loopback,
//! behind the daemon's token). It speaks to the fleet's daemon
//! through the control API (the one that runs, or one it starts inside this
//! process on a loopback port for as long as it serves), so every rule of
//! the runtime holds: the client acts as the owner, a message to an agent is
//! an owner chat whose reply comes back as the tool's result, and a turn
//! that waits for an approval says so, for `answer_approval` to settle.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServiceExt};
use serde_json::{Value, json};

use crate::client::{Client, Frames, open_stream};

/// How long `send_message` waits for the agent's turn by default.
const DEFAULT_WAIT: u64 = 300;

/// The tools offered to the client: (name, description, input schema).
fn catalog() -> Vec<(&'static str, &'static str, Value)> {
    let agent = json!({"type": "string", "description": "the agent's id, handle or name"});
    vec![
        ("list_agents", "The fleet's agents: id, name, handle and state.", json!({"type": "object", "properties": {}})),
        (
            "agent_status",
            "One agent's state, loop size and pending approvals.",
            json!({"type": "object", "properties": {"agent": agent}, "required": ["agent"]}),
        ),
        (
            "send_message",
            "Send a message to an agent as its owner and wait for its reply (the text of its turn). If the turn \
             waits for an approval, the answer names the task: settle it with answer_approval.",
            json!({"type": "object", "properties": {"agent": agent, "text": {"type": "string", "minLength": 1},
                   "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 3600}},
                   "required": ["agent", "text"]}),
        ),
        (
            "message_agent",
            "Send an ALF message from your own identity (see whoami) to an agent, as any peer would, and wait \
             for its reply in your inbox. The agent decides whether and how to answer.",
            json!({"type": "object", "properties": {"agent": agent, "text": {"type": "string", "minLength": 1},
                   "subject": {"type": "string"},
                   "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 3600}},
                   "required": ["agent", "text"]}),
        ),
        ("inbox", "Messages agents sent to you, newest first.", json!({"type": "object", "properties": {}})),
        ("whoami", "Your own identity in the fleet: name, handle, DID.", json!({"type": "object", "properties": {}})),
        (
            "list_files",
            "The files of an agent (path, size, mime type).",
            json!({"type": "object", "properties": {"agent": agent}, "required": ["agent"]}),
        ),
        (
            "read_file",
            "Read one file of an agent (text; binary files come back as base64).",
            json!({"type": "object", "properties": {"agent": agent, "path": {"type": "string", "minLength": 1}},
                   "required": ["agent", "path"]}),
        ),
        (
            "pending_approvals",
            "Tool calls waiting for the owner's approval, across the fleet or for one agent.",
            json!({"type": "object", "properties": {"agent": agent}}),
        ),
        (
            "answer_approval",
            "Approve or deny a pending tool call (the task id from pending_approvals or send_message).",
            json!({"type": "object", "properties": {"agent": agent, "task_id": {"type": "string"},
                   "approve": {"type": "boolean"}, "reason": {"type": "string"}},
                   "required": ["agent", "task_id", "approve"]}),
        ),
    ]
}

#[derive(Clone)]
pub struct FleetServer {
    client: Arc<Client>,
    /// The agent that is this client's own identity and inbox.
    me: Option<String>,
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s.into())])
}

fn failed(s: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(s.into())])
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

impl FleetServer {
    pub fn new(client: Client) -> Self {
        FleetServer { client: Arc::new(client), me: None }
    }

    /// Give the client its own identity: the agent `me` of the fleet.
    pub fn with_identity(mut self, me: &str) -> Self {
        self.me = Some(me.to_string());
        self
    }

    fn me(&self) -> Result<&str, String> {
        self.me.as_deref().ok_or_else(|| "this server has no identity of its own (adf mcp serve --as NAME)".into())
    }

    /// Inbox rows of the client's agent.
    async fn my_inbox(&self) -> Result<Vec<Value>, String> {
        let v = self.client.get(&["agents", self.me()?, "inbox"]).await.map_err(|e| e.to_string())?;
        Ok(v["messages"].as_array().cloned().unwrap_or_default())
    }

    /// An ALF message from the client's identity, then its answer.
    async fn message_agent(&self, a: &Value) -> Result<CallToolResult, String> {
        let to = a["agent"].as_str().filter(|s| !s.is_empty()).ok_or("`agent` is required")?;
        let said = a["text"].as_str().filter(|t| !t.trim().is_empty()).ok_or("`text` is required")?;
        let wait = Duration::from_secs(a["timeout_seconds"].as_u64().unwrap_or(DEFAULT_WAIT).clamp(1, 3600));
        let seen: std::collections::HashSet<String> =
            self.my_inbox().await?.iter().filter_map(|m| m["id"].as_str().map(str::to_string)).collect();
        let mut body = json!({"recipient": to, "content": said});
        if let Some(s) = a["subject"].as_str() {
            body["subject"] = json!(s);
        }
        self.client.post(&["agents", self.me()?, "messages"], &body).await.map_err(|e| e.to_string())?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let fresh: Vec<Value> = self
                .my_inbox()
                .await?
                .into_iter()
                .filter(|m| m["id"].as_str().is_some_and(|id| !seen.contains(id)))
                .collect();
            if let Some(m) = fresh.first() {
                let from = m["sender_alias"].as_str().or(m["from"].as_str()).unwrap_or("?");
                return Ok(text(format!("{from}: {}", m["content"].as_str().unwrap_or(""))));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(text(format!("sent; no reply within {} s (it may come later: see inbox)", wait.as_secs())));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn run_tool(&self, name: &str, a: &Value) -> Result<CallToolResult, String> {
        let c = &self.client;
        let agent = || a["agent"].as_str().filter(|s| !s.is_empty()).ok_or("`agent` is required");
        let e = |e: crate::client::ClientError| e.to_string();
        Ok(match name {
            "list_agents" => {
                let v = c.get(&["agents"]).await.map_err(e)?;
                let list: Vec<Value> = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|x| json!({"id": x["id"], "name": x["name"], "handle": x["handle"], "state": x["state"]}))
                    .collect();
                text(pretty(&json!(list)))
            }
            "agent_status" => text(pretty(&c.get(&["agents", agent()?, "status"]).await.map_err(e)?)),
            "list_files" => {
                let v = c.get(&["agents", agent()?, "files"]).await.map_err(e)?;
                text(pretty(&v["files"]))
            }
            "read_file" => {
                let path = a["path"].as_str().ok_or("`path` is required")?;
                let url = c.url(&["agents", agent()?, "files", "content"], &[("path", path)]).map_err(e)?;
                let v = c.call(reqwest::Method::GET, url, None).await.map_err(e)?;
                match v["content"].as_str() {
                    Some(t) => text(t),
                    None => text(pretty(&v)),
                }
            }
            "pending_approvals" => {
                let ids: Vec<String> = match a["agent"].as_str() {
                    Some(one) => vec![one.to_string()],
                    None => c
                        .get(&["agents"])
                        .await
                        .map_err(e)?
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|x| x["id"].as_str().map(str::to_string))
                        .collect(),
                };
                let mut out = Vec::new();
                for id in ids {
                    let url = c.url(&["agents", &id, "tasks"], &[("status", "pending_approval")]).map_err(e)?;
                    let v = c.call(reqwest::Method::GET, url, None).await.map_err(e)?;
                    for t in v["tasks"].as_array().or(v.as_array()).into_iter().flatten() {
                        out.push(json!({"agent": id, "task_id": t["id"], "tool": t["tool"], "args": t["args"]}));
                    }
                }
                text(pretty(&json!(out)))
            }
            "answer_approval" => {
                let task = a["task_id"].as_str().ok_or("`task_id` is required")?;
                let approve = a["approve"].as_bool().ok_or("`approve` (true or false) is required")?;
                let mut body = json!({"action": if approve { "approve" } else { "deny" }});
                if let Some(r) = a["reason"].as_str() {
                    body["reason"] = json!(r);
                }
                let v = c.post(&["agents", agent()?, "tasks", task, "resolve"], &body).await.map_err(e)?;
                text(pretty(&v))
            }
            "message_agent" => self.message_agent(a).await?,
            "inbox" => {
                let rows: Vec<Value> = self
                    .my_inbox()
                    .await?
                    .iter()
                    .rev()
                    .map(|m| {
                        json!({"id": m["id"], "from": m["sender_alias"].as_str().or(m["from"].as_str()),
                                    "subject": m["subject"], "content": m["content"], "status": m["status"]})
                    })
                    .collect();
                text(pretty(&json!(rows)))
            }
            "whoami" => {
                let v = c.get(&["agents", self.me()?]).await.map_err(e)?;
                let meta = c.get(&["agents", self.me()?, "meta"]).await.map_err(e)?;
                let did = meta["entries"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|m| m["key"] == "adf_did")
                    .map(|m| m["value"].clone())
                    .unwrap_or(Value::Null);
                text(pretty(&json!({"name": v["config"]["name"], "handle": v["config"]["handle"], "did": did,
                                    "id": v["id"]})))
            }
            "send_message" => {
                let msg = a["text"].as_str().filter(|t| !t.trim().is_empty()).ok_or("`text` is required")?;
                let wait = a["timeout_seconds"].as_u64().unwrap_or(DEFAULT_WAIT).clamp(1, 3600);
                self.send_message(agent()?, msg, Duration::from_secs(wait)).await?
            }
            other => return Err(format!("unknown tool {other:?}")),
        })
    }

    /// An owner chat, followed on the event stream until its turn ends.
    async fn send_message(&self, agent: &str, msg: &str, wait: Duration) -> Result<CallToolResult, String> {
        let c = &self.client;
        let status = c.get(&["agents", agent, "status"]).await.map_err(|e| e.to_string())?;
        let id = status["agentId"].as_str().or(status["id"].as_str()).unwrap_or(agent).to_string();
        if status["state"] == "off" {
            return Ok(failed(format!("{agent} is off; start it first (adf start {agent})")));
        }
        let turn = format!("turn_{}", crate::store::create::nanoid(12));
        let cursor = c.get(&["runtime"]).await.map_err(|e| e.to_string())?["eventCursor"].as_u64();
        let mut frames = Frames::new(open_stream(c, Some(&id), cursor).await.map_err(|e| e.to_string())?);
        c.post(&["agents", &id, "chat"], &json!({"text": msg, "turnId": turn})).await.map_err(|e| e.to_string())?;
        let source = format!("agent:{turn}");
        let mut reply = String::new();
        let mut last_error: Option<String> = None;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let data = match tokio::time::timeout_at(deadline, frames.next()).await {
                Ok(Ok(Some(d))) => d,
                Ok(Ok(None)) => return Ok(failed("the daemon closed the event stream before the turn ended")),
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => {
                    return Ok(failed(format!(
                        "no end of the turn within {} s; its reply so far: {reply}",
                        wait.as_secs()
                    )));
                }
            };
            let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
            let ev = &v["event"];
            if ev["source"].as_str() != Some(source.as_str()) {
                continue;
            }
            let p = &ev["payload"];
            match ev["event_type"].as_str().unwrap_or("") {
                "turn.delta" if p["kind"] == "text" => reply.push_str(p["text"].as_str().unwrap_or("")),
                "llm.failed" => last_error = p["error"].as_str().map(str::to_string),
                "hil.requested" | "ask.requested" => {
                    let task = p["task_id"].as_str().or(p["request_id"].as_str()).unwrap_or("").to_string();
                    let what = p["tool"].as_str().or(p["name"].as_str()).unwrap_or("a tool");
                    return Ok(text(
                        format!(
                            "{reply}\n\n[The agent waits for the owner: task {task} ({what}). Settle it with \
                         answer_approval {{agent: \"{id}\", task_id: \"{task}\", approve: true|false}}.]"
                        )
                        .trim_start()
                        .to_string(),
                    ));
                }
                "turn.completed" => {
                    if p["targetState"] == "error" {
                        return Ok(failed(format!(
                            "the turn failed: {}",
                            last_error.unwrap_or_else(|| "see adf events".into())
                        )));
                    }
                    return Ok(text(if reply.is_empty() { "(no reply text)".to_string() } else { reply }));
                }
                _ => {}
            }
        }
    }
}

/// A server that offers tools only, named `name`.
fn tools_only(name: &str) -> ServerConfig {
    let mut info = ServerConfig::default();
    info.capabilities = ServerCapabilities::builder().enable_tools().build();
    info.server_info = Implementation::new(name, env!("CARGO_PKG_VERSION"));
    info
}

/// A tools/list answer from (name, description, input schema).
fn listing(tools: impl IntoIterator<Item = (&'static str, &'static str, Value)>) -> ListToolsResult {
    let tools = tools
        .into_iter()
        .map(|(name, description, schema)| {
            let schema = match schema {
                Value::Object(o) => o,
                _ => serde_json::Map::new(),
            };
            Tool::new(name, description, Arc::new(schema))
        })
        .collect();
    ListToolsResult::with_all_items(tools)
}

impl ServerHandler for FleetServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = tools_only("adf");
        info.instructions = Some(
            "An adf fleet: agents that each live in one file. list_agents, then send_message to talk to one; \
             answer_approval settles the tool calls they wait on."
                .into(),
        );
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(listing(catalog()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = Value::Object(request.arguments.clone().unwrap_or_default());
        if !catalog().iter().any(|(n, _, _)| *n == request.name) {
            return Err(McpError::invalid_params(format!("unknown tool {:?}", request.name), None));
        }
        Ok(match self.run_tool(&request.name, &args).await {
            Ok(r) => r,
            Err(e) => failed(e),
        }
        .into())
    }
}

/// The agent that is the client's own identity and inbox (`<fleet>/<name>.adf`),
/// made on first use: owned by this install, reviewed, and never woken (it
/// has no model to run; the client reads its inbox).
fn ensure_identity(fleet: &std::path::Path, name: &str) -> anyhow::Result<PathBuf> {
    let path = fleet.join(format!("{name}.adf"));
    if path.exists() {
        return Ok(path);
    }
    std::fs::create_dir_all(fleet)?;
    let install = crate::identity::install::current().map_err(anyhow::Error::msg)?;
    let created = crate::store::create::create_file(
        &path,
        &crate::store::create::NewAgent {
            name: Some(name),
            description: Some("An MCP client's identity and inbox (adf mcp serve)"),
            seal_to: Some(install),
            ..Default::default()
        },
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    crate::review::mark_reviewed(&created.id).map_err(anyhow::Error::msg)?;
    let mut store = crate::store::Store::open(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    store
        .config_set(crate::store::Caller::Owner, "triggers.on_inbox.enabled", json!(false))
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    store.close().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(path)
}

/// Serve MCP for the fleet at `fleet` (the default fleet when none): on
/// stdio until the client hangs up, or with `http` on
/// `127.0.0.1:<port>/mcp` (Streamable HTTP, the daemon's bearer token
/// required, loopback `Host`s only) until interrupted.
pub fn run(fleet: Option<PathBuf>, http: Option<u16>, me: &str) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let fleet = fleet.unwrap_or_else(crate::paths::fleet_dir);
        let identity = ensure_identity(&fleet, me)?;
        let (client, embedded) = match crate::daemon::discover(&fleet) {
            Some(url) => {
                let c = Client::new(&url);
                // A running daemon loads the identity if it is new to it.
                let _ = c.post(&["agents", "load"], &json!({"filePath": identity})).await;
                (c, None)
            }
            None => {
                // No daemon runs for this fleet: one inside this process,
                // on loopback, for as long as the client stays.
                let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
                let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
                let opts = crate::daemon::Options {
                    host: "127.0.0.1".into(),
                    port: 0,
                    paths: vec![fleet.clone()],
                    mesh_port: None,
                    ..Default::default()
                };
                let task = tokio::spawn(crate::daemon::serve_with(
                    opts,
                    crate::runtime::fleet::accounts_factory(),
                    async move {
                        let _ = stop_rx.await;
                    },
                    Some(ready_tx),
                ));
                let ready = ready_rx.await.map_err(|_| anyhow::anyhow!("the fleet's daemon did not start"))?;
                (Client::new(&format!("http://{}", ready.addr)), Some((stop_tx, task)))
            }
        };
        let server = FleetServer::new(client).with_identity(me);
        let served = match http {
            None => serve_stdio(server).await,
            Some(port) => serve_http(server, port).await,
        };
        if let Some((stop, task)) = embedded {
            let _ = stop.send(());
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
        served
    })
}

/// A server with one `echo` tool and nothing behind it: what `adf bench
/// mcp` measures the client against, so the round trip is the protocol's
/// own cost (the server's time is next to nothing).
#[derive(Clone)]
pub struct EchoServer;

impl ServerHandler for EchoServer {
    fn get_info(&self) -> ServerConfig {
        tools_only("adf-echo")
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let schema = json!({"type": "object", "properties": {"text": {"type": "string"}}});
        Ok(listing([("echo", "Echo the text.", schema)]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let t = request.arguments.as_ref().and_then(|a| a.get("text")).and_then(Value::as_str).unwrap_or("");
        Ok(text(t).into())
    }
}

/// `adf mcp serve --echo`: the echo server on stdio.
pub fn run_echo() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let service = EchoServer.serve(rmcp::transport::stdio()).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        service.waiting().await.map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(())
    })
}

async fn serve_stdio(server: FleetServer) -> anyhow::Result<()> {
    let service = server.serve(rmcp::transport::stdio()).await.map_err(|e| anyhow::anyhow!("MCP over stdio: {e}"))?;
    service.waiting().await.map_err(|e| anyhow::anyhow!("MCP over stdio: {e}"))?;
    Ok(())
}

async fn serve_http(server: FleetServer, port: u16) -> anyhow::Result<()> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    let token = crate::daemon::token::load_or_mint().map_err(anyhow::Error::msg)?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on 127.0.0.1:{port}: {e}"))?;
    let addr = listener.local_addr()?;
    let config = StreamableHttpServerConfig::default().with_allowed_hosts([
        "localhost".to_string(),
        "127.0.0.1".into(),
        "::1".into(),
    ]);
    let service =
        StreamableHttpService::new(move || Ok(server.clone()), Arc::new(LocalSessionManager::default()), config);
    let token = Arc::new(token);
    let app = axum::Router::new().nest_service("/mcp", service).layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let token = token.clone();
            async move {
                let given = req
                    .headers()
                    .get(axum::http::header::AUTHORIZATION)
                    .and_then(|h| h.to_str().ok())
                    .and_then(|h| h.strip_prefix("Bearer "));
                if !given.is_some_and(|t| crate::daemon::token::same(t.trim(), &token)) {
                    use axum::response::IntoResponse;
                    return (
                        axum::http::StatusCode::UNAUTHORIZED,
                        [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
                        axum::Json(json!({"error": "Missing or invalid Authorization: Bearer token (the daemon's)."})),
                    )
                        .into_response();
                }
                next.run(req).await
            }
        },
    ));
    eprintln!(
        "adf mcp serve: http://{addr}/mcp (Authorization: Bearer <the token in {}>)",
        crate::daemon::token::token_path().display()
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
