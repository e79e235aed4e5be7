//! One connection to an MCP server, through the official SDK (`rmcp`): a
//! child process speaking stdio, or a Streamable HTTP endpoint. The child
//! gets a scrubbed environment (an allowlist of adf's own variables, never
//! its keys or tokens, plus the server's configured ones), its own scratch
//! folder as `HOME` and working directory, and its own process group, which
//! is killed as a whole when the connection ends. Its stderr is kept (the
//! last lines) for the status an owner reads when a server fails.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use super::reconcile::ServerTool;

/// Lines of a server's stderr kept for its status.
const STDERR_KEPT: usize = 50;
/// How long `initialize` and the first `tools/list` may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A tool call's default bound (`tool_call_timeout_ms` overrides).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// Variables of adf's own environment a server may see.
const PASSED_ENV: &[&str] = &["PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "TMPDIR", "USER", "LOGNAME", "SHELL"];

/// How to reach a server, from `mcp.servers[]`.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    Stdio { command: String, args: Vec<String> },
    Http { url: String, headers: Vec<(String, String)> },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerSpec {
    pub name: String,
    pub transport: Transport,
    /// Environment for the child (already resolved, secrets included).
    pub env: Vec<(String, String)>,
    /// Credential keys the config names that have no value.
    pub missing: Vec<String>,
    /// The sealed OAuth sign-in (`mcp:<server>:oauth`), for an HTTP server.
    pub oauth: Option<String>,
    pub call_timeout: Duration,
    /// How long `initialize` and the first `tools/list` may take.
    pub connect_timeout: Duration,
}

impl ServerSpec {
    /// Read one `mcp.servers[]` entry without its sealed credentials.
    pub fn from_config(v: &Value) -> Result<ServerSpec, String> {
        Self::with_secrets(v, |_| None)
    }

    /// Read an entry whose sealed values are at hand (not yet in a file):
    /// `(purpose, value)` pairs, as `owner::entry` returns them.
    pub fn with_sealed(v: &Value, sealed: &[(String, String)]) -> Result<ServerSpec, String> {
        Self::with_secrets(v, |p| sealed.iter().find(|(k, _)| k == p).map(|(_, v)| v.clone()))
    }

    /// Read one `mcp.servers[]` entry, its env and headers resolved from
    /// the config and the sealed `mcp:<namespace>:<KEY>` values.
    pub fn with_secrets(v: &Value, secret: impl Fn(&str) -> Option<String>) -> Result<ServerSpec, String> {
        let name = v["name"].as_str().filter(|n| !n.is_empty()).ok_or("an MCP server needs a name")?.to_string();
        let strings = |k: &str| -> Vec<String> {
            v[k].as_array()
                .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
                .unwrap_or_default()
        };
        let oauth = secret(&super::creds::purpose(&name, super::oauth::KEY));
        let resolved = super::creds::resolve(v, secret);
        let transport = match v["transport"].as_str().unwrap_or("stdio") {
            "stdio" => match (v["command"].as_str().filter(|c| !c.is_empty()), v["npm_package"].as_str()) {
                (Some(c), _) => Transport::Stdio { command: c.to_string(), args: strings("args") },
                // An npm server saved by its package runs through npx.
                (None, Some(pkg)) if !pkg.is_empty() => {
                    let mut args = vec!["-y".to_string(), pkg.to_string()];
                    args.extend(strings("args"));
                    Transport::Stdio { command: "npx".into(), args }
                }
                _ => return Err(format!("MCP server {name:?}: a stdio server needs a command")),
            },
            "http" => {
                let url =
                    v["url"].as_str().ok_or_else(|| format!("MCP server {name:?}: an http server needs a url"))?;
                let parsed = url::Url::parse(url).map_err(|e| format!("MCP server {name:?}: url {url:?}: {e}"))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(format!("MCP server {name:?}: url {url:?} is not http(s)"));
                }
                Transport::Http { url: url.to_string(), headers: resolved.headers }
            }
            other => {
                return Err(format!(
                    "MCP server {name:?}: transport {other:?} is not stdio or http (SSE is not supported)"
                ));
            }
        };
        let call_timeout = v["tool_call_timeout_ms"].as_u64().map(Duration::from_millis).unwrap_or(CALL_TIMEOUT);
        Ok(ServerSpec {
            name,
            transport,
            env: resolved.env,
            missing: resolved.missing,
            oauth: if v["transport"] == "http" { oauth } else { None },
            call_timeout,
            connect_timeout: CONNECT_TIMEOUT,
        })
    }
}

/// Kills a stdio server's process group when dropped: the server may have
/// exited cleanly on its own (closing stdin asks it to), but what it
/// started must not outlive it.
struct GroupKill(Option<i32>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.filter(|p| *p > 1) {
            // SAFETY: killpg only sends a signal; a group that is gone
            // answers ESRCH, which is fine.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

/// A live connection and the tools the server listed.
pub struct Connection {
    pub name: String,
    pub tools: Vec<ServerTool>,
    service: RunningService<RoleClient, ()>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    call_timeout: Duration,
    /// Set when the transport failed under a call or the process closed
    /// its stderr (it exited): the SDK notices a moment later.
    gone: Arc<std::sync::atomic::AtomicBool>,
    /// The OAuth tokens in use (and whether the SDK refreshed them).
    oauth: Option<(String, super::oauth::Tokens)>,
    /// Last field: dropped after the service, so the group goes last.
    _group: GroupKill,
}

/// Why a connection failed, with the server's last words.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("MCP server {server:?}: {reason}{}", tail_text(.stderr_tail))]
pub struct ConnectError {
    pub server: String,
    pub reason: String,
    pub stderr_tail: Vec<String>,
}

fn tail_text(lines: &[String]) -> String {
    if lines.is_empty() { String::new() } else { format!(" (stderr: {})", lines.join(" | ")) }
}

fn tail(buf: &Arc<Mutex<VecDeque<String>>>) -> Vec<String> {
    buf.lock().map(|b| b.iter().rev().take(10).rev().cloned().collect()).unwrap_or_default()
}

/// Connect, initialize and list the server's tools. `scratch` is the
/// server's own folder (created if missing).
pub async fn connect(spec: &ServerSpec, scratch: &Path) -> Result<Connection, ConnectError> {
    let stderr: Arc<Mutex<VecDeque<String>>> = Arc::default();
    let hint = if spec.missing.is_empty() {
        String::new()
    } else {
        format!(
            " (no value for {}: seal one with `adf mcp add … --env KEY=VALUE` or `adf credentials set FILE mcp:{}:KEY`)",
            spec.missing.join(", "),
            spec.name
        )
    };
    let fail = |reason: String, stderr: &Arc<Mutex<VecDeque<String>>>| ConnectError {
        server: spec.name.clone(),
        reason: format!("{reason}{hint}"),
        stderr_tail: tail(stderr),
    };
    let mut reader: Option<tokio::task::JoinHandle<()>> = None;
    let gone: Arc<std::sync::atomic::AtomicBool> = Arc::default();
    let mut oauth: Option<(String, super::oauth::Tokens)> = None;
    let mut group = GroupKill(None);
    let started = match &spec.transport {
        Transport::Stdio { command, args } => {
            std::fs::create_dir_all(scratch).map_err(|e| fail(format!("scratch folder: {e}"), &stderr))?;
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(args).current_dir(scratch).env_clear();
            for k in PASSED_ENV {
                if let Ok(v) = std::env::var(k) {
                    cmd.env(k, v);
                }
            }
            cmd.env("HOME", scratch).envs(spec.env.iter().map(|(k, v)| (k, v)));
            let mut wrap = process_wrap::tokio::CommandWrap::from(cmd);
            wrap.wrap(process_wrap::tokio::ProcessGroup::leader()).wrap(process_wrap::tokio::KillOnDrop);
            let (proc, err) = rmcp::transport::TokioChildProcess::builder(wrap)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| fail(format!("cannot start {command:?}: {e}"), &stderr))?;
            // The server leads its own process group (ProcessGroup::leader).
            group = GroupKill(proc.id().and_then(|p| i32::try_from(p).ok()));
            if let Some(err) = err {
                let buf = stderr.clone();
                let gone = gone.clone();
                reader = Some(tokio::spawn(async move {
                    use tokio::io::AsyncBufReadExt;
                    let mut lines = tokio::io::BufReader::new(err).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        if let Ok(mut b) = buf.lock() {
                            if b.len() == STDERR_KEPT {
                                b.pop_front();
                            }
                            b.push_back(line.chars().take(500).collect());
                        }
                    }
                    gone.store(true, std::sync::atomic::Ordering::Relaxed);
                }));
            }
            tokio::time::timeout(spec.connect_timeout, ().serve(proc)).await
        }
        Transport::Http { url, headers } => {
            use rmcp::transport::StreamableHttpClientTransport;
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            let mut map = reqwest::header::HeaderMap::new();
            for (k, v) in headers {
                let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                    .map_err(|e| fail(format!("header {k:?}: {e}"), &stderr))?;
                let value = reqwest::header::HeaderValue::from_str(v)
                    .map_err(|e| fail(format!("header {k:?}: {e}"), &stderr))?;
                map.insert(name, value);
            }
            let client = crate::providers::client_builder()
                .default_headers(map)
                .build()
                .map_err(|e| fail(format!("http client: {e}"), &stderr))?;
            let config = StreamableHttpClientTransportConfig::with_uri(url.clone());
            match &spec.oauth {
                None => {
                    let transport = StreamableHttpClientTransport::with_client(client, config);
                    tokio::time::timeout(spec.connect_timeout, ().serve(transport)).await
                }
                Some(sealed) => {
                    let Some(creds) = super::oauth::unseal(sealed, url) else {
                        return Err(fail(
                            "the stored sign-in belongs to another URL: sign in again (adf mcp login FILE NAME)".into(),
                            &stderr,
                        ));
                    };
                    let tokens = super::oauth::Tokens::new(creds);
                    let auth =
                        super::oauth::authorized(url, client, tokens.clone()).await.map_err(|e| fail(e, &stderr))?;
                    oauth = Some((url.clone(), tokens));
                    let transport = StreamableHttpClientTransport::with_client(auth, config);
                    tokio::time::timeout(spec.connect_timeout, ().serve(transport)).await
                }
            }
        }
    };
    // A server that failed has usually said why on stderr just before:
    // give the reader a moment to take it in.
    if !matches!(started, Ok(Ok(_)))
        && let Some(h) = reader.take()
    {
        let _ = tokio::time::timeout(Duration::from_millis(500), h).await;
    }
    let service = match started {
        Err(_) => {
            return Err(fail(
                format!("no answer to initialize within {} ms", spec.connect_timeout.as_millis()),
                &stderr,
            ));
        }
        Ok(Err(e)) if e.to_string().contains("Auth required") => {
            return Err(fail(
                "the server requires authorization (HTTP 401): sign in with --oauth (adf mcp add … --url URL --oauth, or adf mcp login FILE NAME), or give a token with --header \"Authorization=Bearer …\"".into(),
                &stderr,
            ));
        }
        Ok(Err(e)) => return Err(fail(format!("initialize failed: {e}"), &stderr)),
        Ok(Ok(s)) => s,
    };
    let listed = match tokio::time::timeout(spec.connect_timeout, service.list_all_tools()).await {
        Err(_) => return Err(fail("no answer to tools/list".into(), &stderr)),
        Ok(Err(e)) => return Err(fail(format!("tools/list failed: {e}"), &stderr)),
        Ok(Ok(t)) => t,
    };
    let tools = listed
        .into_iter()
        .map(|t| ServerTool {
            name: t.name.to_string(),
            description: t.description.map(|d| d.to_string()),
            input_schema: Value::Object((*t.input_schema).clone()),
        })
        .collect();
    Ok(Connection {
        name: spec.name.clone(),
        tools,
        service,
        stderr,
        call_timeout: spec.call_timeout,
        gone,
        oauth,
        _group: group,
    })
}

impl Connection {
    /// The sealed text of OAuth tokens the SDK refreshed since the last
    /// call (to seal again), if any.
    pub fn refreshed_oauth(&self) -> Option<String> {
        let (url, tokens) = self.oauth.as_ref()?;
        tokens.refreshed().map(|c| super::oauth::seal_text(url, &c))
    }

    /// The last lines the server wrote to stderr.
    pub fn stderr_tail(&self) -> Vec<String> {
        tail(&self.stderr)
    }

    /// Whether the server has gone away.
    pub fn is_closed(&self) -> bool {
        self.gone.load(std::sync::atomic::Ordering::Relaxed) || self.service.is_closed()
    }

    /// Call a tool. The answer is the reference's: the text parts joined,
    /// or, when media came back, JSON `{text, images?, audio?, resources?}`
    /// (the runtime saves the media as files and shows it to the model).
    pub async fn call(&self, tool: &str, args: Value) -> (String, bool) {
        let arguments = match args {
            Value::Object(o) => Some(o),
            Value::Null => None,
            other => return (format!("MCP tool arguments must be an object, not {other}"), true),
        };
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = arguments;
        let result = match tokio::time::timeout(self.call_timeout, self.service.call_tool(params)).await {
            Err(_) => return (format!("MCP tool call timed out after {} ms", self.call_timeout.as_millis()), true),
            Ok(Err(e)) => {
                if matches!(e, rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_)) {
                    self.gone.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                return (format!("MCP tool call failed: {e}"), true);
            }
            Ok(Ok(r)) => r,
        };
        let is_error = result.is_error == Some(true);
        let blocks = serde_json::to_value(&result.content).unwrap_or(Value::Null);
        (render(&blocks, result.structured_content.as_ref()), is_error)
    }

    /// End the session; the process group goes with it.
    pub async fn close(self) {
        let _ = self.service.cancel().await;
    }
}

/// MCP content blocks as the tool result's text.
pub fn render(blocks: &Value, structured: Option<&Value>) -> String {
    let mut text: Vec<String> = Vec::new();
    let (mut images, mut audio, mut resources) = (Vec::new(), Vec::new(), Vec::new());
    for b in blocks.as_array().into_iter().flatten() {
        match b["type"].as_str().unwrap_or("") {
            "text" => text.extend(b["text"].as_str().map(str::to_string)),
            "image" => images.push(json!({"data": b["data"], "mimeType": b["mimeType"]})),
            "audio" => audio.push(json!({"data": b["data"], "mimeType": b["mimeType"]})),
            "resource" => {
                let r = &b["resource"];
                if let Some(t) = r["text"].as_str() {
                    text.push(format!("[Resource {}]\n{t}", r["uri"].as_str().unwrap_or("")));
                } else if r["blob"].is_string() {
                    resources.push(json!({"data": r["blob"], "uri": r["uri"],
                        "mimeType": r["mimeType"].as_str().unwrap_or("application/octet-stream")}));
                }
            }
            "resource_link" => {
                let name = b["name"].as_str().or(b["uri"].as_str()).unwrap_or("");
                let desc = b["description"].as_str().map(|d| format!(" — {d}")).unwrap_or_default();
                text.push(format!("[Resource link: {name}{desc} ({})]", b["uri"].as_str().unwrap_or("")));
            }
            other => text.push(format!("[Unsupported content type: {other}]")),
        }
    }
    if text.is_empty()
        && let Some(s) = structured
    {
        text.push(s.to_string());
    }
    if images.is_empty() && audio.is_empty() && resources.is_empty() {
        let t = text.join("\n");
        return if t.is_empty() { "(empty response)".into() } else { t };
    }
    let mut out = json!({"text": text.join("\n")});
    if !images.is_empty() {
        out["images"] = Value::Array(images);
    }
    if !audio.is_empty() {
        out["audio"] = Value::Array(audio);
    }
    if !resources.is_empty() {
        out["resources"] = Value::Array(resources);
    }
    out.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_from_config_and_their_errors() {
        let s = ServerSpec::from_config(&json!({"name": "ev", "command": "srv", "args": ["stdio"], "env": {"K": "v"}}))
            .unwrap();
        assert_eq!(s.transport, Transport::Stdio { command: "srv".into(), args: vec!["stdio".into()] });
        assert_eq!(s.env, [("K".to_string(), "v".to_string())]);
        let h = ServerSpec::from_config(&json!({"name": "h", "transport": "http", "url": "http://127.0.0.1:1/mcp",
                                                "headers": {"X-A": "1"}, "tool_call_timeout_ms": 5}))
        .unwrap();
        assert_eq!(h.call_timeout, Duration::from_millis(5));
        for (bad, says) in [
            (json!({"command": "x"}), "needs a name"),
            (json!({"name": "a"}), "needs a command"),
            (json!({"name": "a", "transport": "http"}), "needs a url"),
            (json!({"name": "a", "transport": "http", "url": "file:///x"}), "not http"),
            (json!({"name": "a", "transport": "sse", "url": "http://x"}), "SSE is not supported"),
        ] {
            assert!(ServerSpec::from_config(&bad).unwrap_err().contains(says), "{bad}");
        }
    }

    #[test]
    fn results_render_as_the_reference_does() {
        assert_eq!(render(&json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]), None), "a\nb");
        assert_eq!(render(&json!([]), None), "(empty response)");
        assert_eq!(render(&json!([]), Some(&json!({"n": 1}))), r#"{"n":1}"#);
        let v: Value = serde_json::from_str(&render(
            &json!([{"type": "text", "text": "see"}, {"type": "image", "data": "AAAA", "mimeType": "image/png"}]),
            None,
        ))
        .unwrap();
        assert_eq!(v, json!({"text": "see", "images": [{"data": "AAAA", "mimeType": "image/png"}]}));
        let link =
            render(&json!([{"type": "resource_link", "uri": "file:///a", "name": "a", "description": "d"}]), None);
        assert_eq!(link, "[Resource link: a — d (file:///a)]");
    }
}
