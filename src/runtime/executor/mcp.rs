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
use crate::mcp::reconcile::reconcile;
use crate::providers::ToolSpec;
use crate::tools::ToolOutput;

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
    Some(ToolSpec { name: declared.to_string(), description, input_schema: schema })
}

impl Executor {
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
        if self.mcp.get(&server_name).is_none_or(|c| c.is_closed()) {
            let spec = match ServerSpec::from_config(server) {
                Ok(s) => s,
                Err(e) => return ToolOutput::err(e),
            };
            let scratch = std::env::temp_dir().join("adf-mcp").join(&self.agent_id).join(&server_name);
            let conn = match connect(&spec, &scratch).await {
                Ok(c) => c,
                Err(e) => {
                    let _ = self.log("error", "mcp", "connect_failed", &e.to_string());
                    return ToolOutput::err(format!(
                        "MCP server \"{server_name}\" is not connected: {e}. The server may have failed to start."
                    ));
                }
            };
            let mut next = cfg.clone();
            let outcome = reconcile(&mut next, &server_name, &conn.tools);
            if outcome.changed
                && let Err(e) = self.store.config_replace(next)
            {
                let _ = self.log("warn", "mcp", "reconcile_failed", &e.to_string());
            }
            let _ = self.log(
                "info",
                "mcp",
                "connected",
                &format!(
                    "{server_name}: {} tools ({} new, {} changed, {} removed)",
                    conn.tools.len(),
                    outcome.new.len(),
                    outcome.changed_tools.len(),
                    outcome.removed.len()
                ),
            );
            if outcome.changed_tools.iter().any(|t| t == declared) {
                self.mcp.insert(server_name.clone(), conn);
                return ToolOutput::err(format!(
                    "The MCP tool \"{declared}\" changed its schema since it was reviewed; it is disabled until the owner enables it again."
                ));
            }
            self.mcp.insert(server_name.clone(), conn);
        }
        let Some(conn) = self.mcp.get(&server_name) else {
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
        let content = if is_error { content } else { self.keep_mcp_media(&server_name, &tool, content).await };
        if is_error { ToolOutput::err(content) } else { ToolOutput::ok(content) }
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
