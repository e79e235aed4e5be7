//! The WebSocket tools (tools.md §9): `ws_connect` (a configured
//! connection by `id`, or an ad-hoc `url` through the egress guard, kept
//! in `ws_connections` unless `persist` is false), `ws_send`,
//! `ws_connections` and `ws_disconnect`, over the runtime's sockets
//! (`mesh/ws`). An agent only sees and uses its own connections.

use serde_json::{Value, json};

use super::Executor;
use crate::runtime::mesh::ws::Frame;
use crate::runtime::mesh::ws::out::{self, OutConfig};
use crate::tools::ToolOutput;

/// Where a `ws:`/`wss:` URL goes, as the egress guard reads URLs.
fn as_http(url: &url::Url) -> Option<url::Url> {
    let scheme = match url.scheme() {
        "ws" => "http",
        "wss" => "https",
        _ => return None,
    };
    let mut u = url.clone();
    u.set_scheme(scheme).ok()?;
    Some(u)
}

impl Executor {
    pub(crate) async fn ws_tool(&mut self, name: &str, input: &Value) -> ToolOutput {
        let Some(mesh) = self.mesh.clone() else {
            return ToolOutput::err(format!("{name} needs the runtime's mesh (this agent is not loaded in a fleet)"));
        };
        let me = self.agent_id().to_string();
        match name {
            "ws_connections" => {
                let dir = input["direction"].as_str();
                let list: Vec<Value> = mesh
                    .sockets
                    .of(&me)
                    .iter()
                    .filter(|s| dir.is_none_or(|d| s.direction.as_str() == d))
                    .map(|s| s.info())
                    .collect();
                if list.is_empty() {
                    ToolOutput::ok("No active WebSocket connections.")
                } else {
                    ToolOutput::json(&Value::Array(list))
                }
            }
            "ws_send" => {
                let id = input["connection_id"].as_str().unwrap_or_default();
                let Some(sock) = mesh.sockets.get(id).filter(|s| s.agent_id == me) else {
                    return ToolOutput::err(format!("Connection not found: {id}"));
                };
                let frame = match (&input["data"], input["binary"] == true) {
                    (Value::String(s), true) => {
                        use base64::Engine;
                        match base64::engine::general_purpose::STANDARD.decode(s) {
                            Ok(b) => Frame::Binary(b),
                            Err(e) => return ToolOutput::err(format!("binary data is not base64: {e}")),
                        }
                    }
                    (Value::String(s), false) => Frame::Text(s.clone()),
                    (Value::Null, _) => return ToolOutput::err("data is required"),
                    (other, _) => Frame::Text(other.to_string()),
                };
                if let Frame::Text(t) = &frame
                    && t.len() > crate::runtime::mesh::ws::MAX_FRAME
                {
                    return ToolOutput::err(format!(
                        "a frame is at most {} bytes",
                        crate::runtime::mesh::ws::MAX_FRAME
                    ));
                }
                match sock.send(frame).await {
                    Ok(()) => ToolOutput::ok("Sent."),
                    Err(e) => ToolOutput::err(e),
                }
            }
            "ws_disconnect" => {
                if let Some(id) = input["connection_id"].as_str() {
                    return match mesh.sockets.get(id).filter(|s| s.agent_id == me) {
                        Some(s) => {
                            // A kept config would bring it back: stop that too.
                            match &s.config_id {
                                Some(c) => {
                                    mesh.sockets.stop_config(&me, c);
                                }
                                None => s.close(1000, "closed by the agent"),
                            }
                            ToolOutput::ok("Disconnected.")
                        }
                        None => ToolOutput::err(format!("Connection not found: {id}")),
                    };
                }
                match input["id"].as_str() {
                    Some(c) if mesh.sockets.stop_config(&me, c) => ToolOutput::ok("Disconnected."),
                    Some(c) => ToolOutput::err(format!("No live connection for config id \"{c}\"")),
                    None => ToolOutput::err("connection_id or id is required"),
                }
            }
            "ws_connect" => self.ws_connect(input).await,
            _ => ToolOutput::err(format!("Unknown tool: {name}")),
        }
    }

    async fn ws_connect(&mut self, input: &Value) -> ToolOutput {
        let Some(mesh) = self.mesh.clone() else { return ToolOutput::err("ws_connect needs the runtime's mesh") };
        let me = self.agent_id().to_string();
        let Some(mb) = mesh.find(&me) else { return ToolOutput::err("this agent is not on the mesh") };
        let cfg = match self.store.config_value() {
            Ok(c) => c,
            Err(e) => return ToolOutput::err(e.to_string()),
        };
        let stored = |id: &str| {
            cfg["ws_connections"].as_array().and_then(|a| a.iter().find(|c| c["id"].as_str() == Some(id))).cloned()
        };
        let (mut entry, adhoc) = match (input["id"].as_str(), input["url"].as_str()) {
            (Some(id), None) => match stored(id) {
                Some(e) => (e, false),
                None => return ToolOutput::err(format!("No WS connection config with id \"{id}\"")),
            },
            (id, Some(url)) => {
                let id = id.map(str::to_string).unwrap_or_else(|| crate::store::create::nanoid(10));
                let mut e = json!({"id": id, "url": url, "enabled": true, "origin": "agent"});
                for k in ["did", "lambda", "auto_reconnect", "reconnect_delay_ms", "keepalive_interval_ms"] {
                    if !input[k].is_null() {
                        e[k] = input[k].clone();
                    }
                }
                (e, true)
            }
            (None, None) => return ToolOutput::err("Either id or url is required."),
        };
        let allow_local = cfg["security"]["allow_local_fetch"].as_bool().unwrap_or(false);
        let c = match OutConfig::read(&entry, allow_local) {
            Ok(c) => c,
            Err(e) => return ToolOutput::err(e),
        };
        // The agent's own URLs pass the egress guard, every time they connect.
        let pin = if c.guard.is_some() {
            let Some(http) = url::Url::parse(&c.url).ok().as_ref().and_then(as_http) else {
                return ToolOutput::err(format!("{} is not a ws: or wss: URL", c.url));
            };
            match crate::runtime::egress::check(&http, allow_local, self.resolver.as_ref()).await {
                Ok(t) => t.pin.map(|(_, a)| a).or_else(|| {
                    let port = http.port_or_known_default().unwrap_or(80);
                    http.host_str()
                        .and_then(|h| h.trim_matches(['[', ']']).parse().ok())
                        .map(|ip| std::net::SocketAddr::new(ip, port))
                }),
                Err(e) => return ToolOutput::err(format!("ws_connect refused: {e}")),
            }
        } else {
            None
        };
        match out::connect(mesh, mb, c.clone(), pin).await {
            Ok(id) => {
                if adhoc && input["persist"] != false {
                    entry.as_object_mut().map(|o| o.remove("enabled"));
                    entry["enabled"] = json!(true);
                    if let Err(e) = self.persist_ws(entry) {
                        let _ = self.log("warn", "ws", "persist_failed", &e);
                    }
                }
                ToolOutput::ok(format!("Connected. connection_id: {id}"))
            }
            Err(e) => ToolOutput::err(format!("Could not connect to {}: {e}", c.url)),
        }
    }

    /// Keep an agent-made connection in `ws_connections` (replacing one
    /// with its id).
    fn persist_ws(&mut self, entry: Value) -> Result<(), String> {
        let mut cfg = self.store.config_value().map_err(|e| e.to_string())?;
        let list = cfg["ws_connections"].as_array().cloned().unwrap_or_default();
        let mut list: Vec<Value> = list.into_iter().filter(|c| c["id"] != entry["id"]).collect();
        list.push(entry);
        cfg["ws_connections"] = Value::Array(list);
        self.store.config_replace(cfg).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_urls_are_read_as_the_guard_reads_http() {
        let u = |s: &str| as_http(&url::Url::parse(s).unwrap()).map(|u| u.to_string());
        assert_eq!(u("ws://127.0.0.1:9/x").as_deref(), Some("http://127.0.0.1:9/x"));
        assert_eq!(u("wss://example.org/").as_deref(), Some("https://example.org/"));
        assert_eq!(u("ftp://example.org/"), None);
    }
}
