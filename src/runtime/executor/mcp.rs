//! MCP tools in the turn loop: a declared `mcp_<server>_<tool>` is offered
//! to the model with the schema the server last listed
//! (`mcp.servers[].available_tools`), and its first call connects the
//! server, reconciles its tools into the config (a tool whose schema
//! changed is disabled there and refused here), then calls it. Media in a
//! result is saved under `mcp/<server>/` and shown like any file.

use base64::Engine;
use serde_json::{Value, json};

use super::Executor;
use crate::mcp::client::{ServerSpec, connect};
use crate::mcp::creds;
use crate::mcp::owner::{install_entry, push_server, remove_server, server_entry};
use crate::mcp::reconcile::{Outcome, reconcile};
use crate::mcp::servers::{Live, ServerStatus};
use crate::providers::ToolSpec;
use crate::tools::ToolOutput;

/// Where adf runs a server, for `mcp_install`'s `location`.
const LOCATION: &str = "local process (scrubbed environment, own HOME and process group)";

/// A server that could not be reached, for the tool results.
struct ConnectFailure {
    message: String,
    stderr_tail: Vec<String>,
}

impl From<String> for ConnectFailure {
    fn from(message: String) -> Self {
        ConnectFailure { message, stderr_tail: Vec::new() }
    }
}

/// The configured server a declared tool belongs to (the longest name
/// whose prefix matches) and the tool's own name.
fn owner_of<'a>(cfg: &'a Value, declared: &str) -> Option<(&'a Value, String)> {
    cfg.pointer("/mcp/servers")?
        .as_array()?
        .iter()
        .filter_map(|s| {
            let name = s["name"].as_str()?;
            let tool = declared.strip_prefix(&format!("mcp_{name}_"))?;
            Some((name.len(), s, tool.to_string()))
        })
        .max_by_key(|(n, _, _)| *n)
        .map(|(_, s, t)| (s, t))
}

/// The spec the model gets for a declared MCP tool, from the server's last
/// listing; none when the server or the tool is not listed.
pub(super) fn advertised(cfg: &Value, declared: &str) -> Option<ToolSpec> {
    let (server, tool) = owner_of(cfg, declared)?;
    let listed = server["available_tools"].as_array()?.iter().find(|t| t["name"] == tool.as_str())?;
    let mut schema = listed["input_schema"].clone();
    if !schema.is_object() {
        schema = json!({"type": "object"});
    }
    let description = listed["description"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("MCP tool: {tool} (via {})", server["name"].as_str().unwrap_or("")));
    Some(ToolSpec { name: declared.to_string(), description, input_schema: std::sync::Arc::new(schema) })
}

impl Executor {
    /// A sealed value of this agent's credentials envelope, as text.
    fn secret_text(&self, purpose: &str) -> Option<String> {
        self.store.secret_get(purpose).ok().flatten().and_then(|b| String::from_utf8(b).ok())
    }

    /// Every configured server's status (the owner's view).
    pub fn mcp_status(&self) -> Vec<ServerStatus> {
        self.store.config_value().map(|cfg| self.mcp.statuses(&cfg)).unwrap_or_default()
    }

    /// Make sure `server` (an `mcp.servers[]` entry) is connected: start it
    /// (or start it again after it exited, unless it is backing off),
    /// reconcile its tools into the config and report. `Ok(Some(_))` when
    /// it connected just now.
    async fn mcp_ensure(&mut self, server: &Value) -> Result<Option<Outcome>, ConnectFailure> {
        let name = server["name"].as_str().unwrap_or("").to_string();
        match self.mcp.live(&name) {
            Live::Up(_) => return Ok(None),
            Live::Exited(tail) => {
                let last = tail.last().map(|l| format!("; last stderr: {l}")).unwrap_or_default();
                let _ = self.log("warn", "mcp", "server_exited", &format!("{name} exited{last}"));
            }
            Live::Down => {}
        }
        if let Err(wait) = self.mcp.may_start(&name) {
            let why = self.mcp.status(&name).and_then(|s| s.error.clone()).unwrap_or_else(|| "it failed".into());
            return Err(ConnectFailure {
                message: format!(
                    "MCP server \"{name}\" is not connected ({why}); it is tried again in {} s",
                    wait.as_secs().max(1)
                ),
                stderr_tail: Vec::new(),
            });
        }
        let spec = self.mcp_spec(server).map_err(ConnectFailure::from)?;
        let conn = match connect(&spec, &self.mcp_scratch(&name)).await {
            Ok(c) => c,
            Err(e) => {
                self.mcp_failed(&e);
                return Err(ConnectFailure { message: e.to_string(), stderr_tail: e.stderr_tail });
            }
        };
        Ok(Some(self.mcp_adopt(conn)))
    }

    /// How to start `server`, its sealed credentials resolved.
    pub fn mcp_spec(&self, server: &Value) -> Result<ServerSpec, String> {
        ServerSpec::with_secrets(server, |p| self.secret_text(p))
    }

    /// The server's own scratch folder (its HOME and working directory).
    pub fn mcp_scratch(&self, server: &str) -> std::path::PathBuf {
        std::env::temp_dir().join("adf-mcp").join(&self.agent_id).join(server)
    }

    /// Record a failed start (status, backoff, log).
    pub fn mcp_failed(&mut self, e: &crate::mcp::client::ConnectError) {
        self.mcp.failed(e);
        let _ = self.log("error", "mcp", "connect_failed", &e.to_string());
    }

    /// Take a fresh connection: reconcile its tools into the config as it
    /// is now, log, and keep it.
    pub fn mcp_adopt(&mut self, conn: crate::mcp::client::Connection) -> Outcome {
        let name = conn.name.clone();
        let mut outcome = Outcome::default();
        match self.store.config_value() {
            Ok(mut next) => {
                outcome = reconcile(&mut next, &name, &conn.tools);
                if outcome.changed
                    && let Err(e) = self.store.config_replace(next)
                {
                    let _ = self.log("warn", "mcp", "reconcile_failed", &e.to_string());
                }
            }
            Err(e) => {
                let _ = self.log("warn", "mcp", "reconcile_failed", &e.to_string());
            }
        }
        let _ = self.log(
            "info",
            "mcp",
            "connected",
            &format!(
                "{name}: {} tools ({} new, {} changed, {} removed)",
                conn.tools.len(),
                outcome.new.len(),
                outcome.changed_tools.len(),
                outcome.removed.len()
            ),
        );
        if let Some(sealed) = conn.refreshed_oauth() {
            self.seal_oauth(&name, &sealed);
        }
        self.mcp.connected(conn);
        outcome
    }

    /// Seal a server's OAuth tokens again after the SDK refreshed them.
    fn seal_oauth(&mut self, server: &str, sealed: &str) {
        let purpose = creds::purpose(server, crate::mcp::oauth::KEY);
        if let Err(e) = self.store.secret_set(&purpose, sealed.as_bytes(), false) {
            let _ = self.log("warn", "mcp", "oauth_not_saved", &format!("{server}: refreshed tokens not sealed: {e}"));
        }
    }

    /// Stop a running server (its process group is killed); it starts
    /// again at the next call or restart.
    pub fn mcp_stop(&mut self, name: &str) -> bool {
        self.mcp.stop(name)
    }

    /// Call a declared MCP tool (already gated as a tool).
    pub(super) async fn mcp_call(&mut self, declared: &str, input: &Value) -> ToolOutput {
        let cfg = match self.store.config_value() {
            Ok(c) => c,
            Err(e) => return ToolOutput::err(e.to_string()),
        };
        let Some((server, tool)) = owner_of(&cfg, declared) else {
            return ToolOutput::err(format!("No MCP server in mcp.servers offers \"{declared}\"."));
        };
        let server_name = server["name"].as_str().unwrap_or("").to_string();
        match self.mcp_ensure(server).await {
            Err(e) => return ToolOutput::err(e.message),
            Ok(Some(outcome)) if outcome.changed_tools.iter().any(|t| t == declared) => {
                return ToolOutput::err(format!(
                    "The MCP tool \"{declared}\" changed its schema since it was reviewed; it is disabled until the owner enables it again."
                ));
            }
            Ok(_) => {}
        }
        let Live::Up(conn) = self.mcp.live(&server_name) else {
            return ToolOutput::err(format!("MCP server \"{server_name}\" is not connected."));
        };
        if !conn.tools.iter().any(|t| t.name == tool) {
            return ToolOutput::err(format!("MCP server \"{server_name}\" no longer offers \"{tool}\"."));
        }
        let mut args = input.clone();
        if let Some(o) = args.as_object_mut() {
            o.retain(|k, _| !k.starts_with('_'));
        }
        let (content, is_error) = conn.call(&tool, args).await;
        if let Some(sealed) = conn.refreshed_oauth() {
            self.seal_oauth(&server_name, &sealed);
        }
        let content = if is_error { content } else { self.keep_mcp_media(&server_name, &tool, content).await };
        if is_error { ToolOutput::err(content) } else { ToolOutput::ok(content) }
    }

    /// Stop a server and connect it again now, whatever its backoff:
    /// `mcp_restart`, `adf mcp restart`, the daemon's restart route. The
    /// answer is tools.md's `{success, name, tools_discovered,
    /// connection_error?, stderr_tail?, message}`.
    pub async fn mcp_restart(&mut self, name: &str) -> Result<Value, String> {
        let cfg = self.store.config_value().map_err(|e| e.to_string())?;
        let server = server_entry(&cfg, name).ok_or_else(|| format!("no MCP server named \"{name}\""))?.clone();
        self.mcp.stop(name);
        Ok(match self.mcp_ensure(&server).await {
            Ok(_) => {
                let n = self.mcp.status(name).map(|s| s.tools).unwrap_or(0);
                json!({"success": true, "name": name, "tools_discovered": n, "location": LOCATION,
                       "message": format!("Server \"{name}\" reconnected: {n} tools; your tool choices are kept.")})
            }
            Err(e) => json!({"success": false, "name": name, "tools_discovered": 0, "location": LOCATION,
                             "connection_error": e.message, "stderr_tail": e.stderr_tail,
                             "message": format!("Server \"{name}\" could not reconnect.")}),
        })
    }

    /// Remove a server, its tool declarations and its sealed credentials;
    /// its process group goes with the connection. The number of tool
    /// declarations removed.
    pub fn mcp_remove(&mut self, name: &str) -> Result<usize, String> {
        let mut cfg = self.store.config_value().map_err(|e| e.to_string())?;
        let server = server_entry(&cfg, name).cloned().ok_or_else(|| format!("no MCP server named \"{name}\""))?;
        let removed = remove_server(&mut cfg, name);
        self.store.config_replace(cfg).map_err(|e| e.to_string())?;
        self.mcp.forget(name);
        let _ = creds::remove_sealed(&mut self.store, &server);
        let _ = self.log("info", "mcp", "removed", &format!("{name}: {removed} tool declarations"));
        Ok(removed)
    }

    /// `mcp_install` (tools.md §11): configure a server, seal its
    /// credentials, connect it and reconcile its tools (new ones enabled,
    /// visible and restricted).
    pub(super) async fn mcp_install_tool(&mut self, input: &Value) -> ToolOutput {
        let entry = match install_entry(input) {
            Ok(e) => e,
            Err(e) => return ToolOutput::json_err(&json!({"success": false, "error": e})),
        };
        let name = entry["name"].as_str().unwrap_or("").to_string();
        let mut cfg = match self.store.config_value() {
            Ok(c) => c,
            Err(e) => return ToolOutput::err(e.to_string()),
        };
        if server_entry(&cfg, &name).is_some() {
            return ToolOutput::json(&json!({"success": true, "already_installed": true, "name": name}));
        }
        for path in ["mcp.servers", "tools"] {
            if let Err(refusal) = crate::store::config::agent_write_policy(&cfg, path) {
                let why = match refusal {
                    crate::store::config::ConfigRefusal::Hard(m) => m,
                    crate::store::config::ConfigRefusal::Lock(d) => format!("{d:?}"),
                };
                return ToolOutput::json_err(&json!({"success": false, "error": "locked", "message": why}));
            }
        }
        if input["host"] == true {
            return ToolOutput::json_err(&json!({"success": false, "name": name, "host_denied": "not_supported",
                "error": "adf runs every MCP server as a scrubbed local process (its own HOME and process group); there is no separate host mode to ask for"}));
        }
        if input["auth"] == true {
            return ToolOutput::json_err(&json!({"success": false, "name": name, "error": "auth_not_supported",
                "message": "interactive sign-in is the owner's: ask them to add this server with `adf mcp add`"}));
        }
        for (k, v) in input["env"].as_object().into_iter().flatten() {
            let Some(v) = v.as_str() else { continue };
            if let Err(e) = self.store.secret_set(&creds::purpose(&name, k), v.as_bytes(), false) {
                return ToolOutput::json_err(&json!({"success": false, "name": name, "error": "credentials",
                    "message": format!("the credential {k} could not be sealed: {e}")}));
            }
        }
        push_server(&mut cfg, entry.clone());
        if let Err(e) = self.store.config_replace(cfg) {
            return ToolOutput::json_err(&json!({"success": false, "name": name, "error": e.to_string()}));
        }
        let source = entry["source"].clone();
        let kind = input["type"].as_str().unwrap_or("npm");
        match self.mcp_ensure(&entry).await {
            Ok(_) => {
                let n = self.mcp.status(&name).map(|s| s.tools).unwrap_or(0);
                ToolOutput::json(&json!({"success": true, "name": name, "type": kind, "source": source,
                    "location": LOCATION, "tools_discovered": n, "env_keys": entry["env_keys"],
                    "message": format!("Server \"{name}\" installed. {n} tools discovered, enabled, and protected by human approval.")}))
            }
            Err(e) => ToolOutput::json_err(&json!({"success": false, "configured": true, "name": name, "type": kind,
                "source": source, "location": LOCATION, "tools_discovered": 0, "error": e.message,
                "stderr_tail": e.stderr_tail,
                "message": format!("Server \"{name}\" was saved but could not become ready. Fix the runtime error, then use mcp_restart to reconnect.")})),
        }
    }

    pub(super) async fn mcp_restart_tool(&mut self, input: &Value) -> ToolOutput {
        let name = input["name"].as_str().unwrap_or("");
        match self.mcp_restart(name).await {
            Ok(v) if v["success"] == true => ToolOutput::json(&v),
            Ok(v) => ToolOutput::json_err(&v),
            Err(e) => {
                ToolOutput::json_err(&json!({"success": false, "name": name, "error": "not_found", "message": e}))
            }
        }
    }

    pub(super) fn mcp_uninstall_tool(&mut self, input: &Value) -> ToolOutput {
        let name = input["name"].as_str().unwrap_or("");
        let cfg = self.store.config_value().unwrap_or_default();
        if let Err(crate::store::config::ConfigRefusal::Hard(m)) =
            crate::store::config::agent_write_policy(&cfg, "mcp.servers")
        {
            return ToolOutput::json_err(&json!({"success": false, "name": name, "error": "locked", "message": m}));
        }
        match self.mcp_remove(name) {
            Ok(n) => ToolOutput::json(&json!({"success": true, "name": name,
                "message": format!("Server \"{name}\" removed with its {n} tools and credentials.")})),
            Err(e) => {
                ToolOutput::json_err(&json!({"success": false, "name": name, "error": "not_found", "message": e}))
            }
        }
    }

    /// Media in a result (`{text, images?, audio?, resources?}`) is saved
    /// as files through `fs_write`; the result names them and carries a
    /// `media` manifest for the model.
    async fn keep_mcp_media(&mut self, server: &str, tool: &str, content: String) -> String {
        let Ok(v) = serde_json::from_str::<Value>(&content) else { return content };
        if !v.is_object() || !(v["images"].is_array() || v["audio"].is_array() || v["resources"].is_array()) {
            return content;
        }
        let mut lines: Vec<String> =
            v["text"].as_str().filter(|t| !t.is_empty()).map(str::to_string).into_iter().collect();
        let mut media = Vec::new();
        let stamp = crate::store::now_ms();
        let items =
            ["images", "audio", "resources"].into_iter().flat_map(|k| v[k].as_array().cloned().unwrap_or_default());
        for (i, item) in items.enumerate() {
            let mime = item["mimeType"].as_str().unwrap_or("application/octet-stream").to_string();
            let Some(data) = item["data"].as_str() else { continue };
            if base64::engine::general_purpose::STANDARD.decode(data).is_err() {
                lines.push(format!("[{mime}: not valid base64, not saved]"));
                continue;
            }
            let ext = mime_guess::get_mime_extensions_str(&mime).and_then(|e| e.first()).copied().unwrap_or("bin");
            let path = format!("mcp/{server}/{tool}_{stamp}_{}.{ext}", i + 1);
            if let Err(e) = self.save_media("mcp", &path, data, &mime).await {
                lines.push(format!("[{mime}: not saved: {e}]"));
            } else {
                let kind = mime.split('/').next().unwrap_or("file");
                lines.push(format!("[{kind}: {path} ({mime})]"));
                media.push(json!({"path": path, "mime_type": mime}));
            }
        }
        let mut out = json!({"text": lines.join("\n")});
        if !media.is_empty() {
            out["media"] = Value::Array(media);
        }
        out.to_string()
    }
}
