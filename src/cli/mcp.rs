//! `adf mcp …`: the MCP servers of an agent file, on the file itself or,
//! when an adf process holds it, through that process's API (which then
//! also knows each server's live status). `add` connects first and saves
//! the server with its tools reconciled (new tools restricted) and its env
//! and header values sealed, or changes nothing and says why the server
//! did not start; `ls` shows servers, status and tool flags; `tool` flips
//! one tool's flags; `rm` removes a server, its tools and credentials;
//! `restart` connects it again.

use std::path::{Path, PathBuf};

use clap::Subcommand;
use serde_json::{Value, json};

use super::held::{Target, open_for_write};
use super::output::{Out, at, close};
use crate::identity::install;
use crate::mcp::client::{ServerSpec, connect};
use crate::mcp::owner;
use crate::mcp::owner::{push_server, remove_server, server_entry};
use crate::mcp::reconcile::reconcile;

#[derive(Debug, Clone, Subcommand)]
pub enum McpCmd {
    /// Add a server: `adf mcp add FILE NAME [--env K=V]… -- COMMAND [ARGS…]`
    /// (stdio) or `adf mcp add FILE NAME --url URL [--header K=V]…`
    /// (Streamable HTTP). Env and header values are sealed in the file's
    /// credentials envelope, never written to its config.
    Add {
        path: PathBuf,
        name: String,
        #[arg(long)]
        url: Option<String>,
        /// A request header for an HTTP server (`K=V`, repeatable).
        #[arg(long = "header", value_name = "K=V")]
        headers: Vec<String>,
        /// An environment variable for a stdio server (`K=V`, repeatable).
        #[arg(long = "env", value_name = "K=V")]
        env: Vec<String>,
        /// Save without connecting (its tools are declared at the first call).
        #[arg(long)]
        no_connect: bool,
        /// Sign in with OAuth first (an HTTP server that requires it): the
        /// URL to open is printed; the tokens are sealed in the file.
        #[arg(long)]
        oauth: bool,
        /// The command and its arguments (after `--`).
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Sign in to an HTTP server again with OAuth (tokens sealed in the file).
    Login { path: PathBuf, name: String },
    /// Connect to a server without saving anything: list its tools, and
    /// call one with `--call TOOL [--args JSON]`.
    Probe {
        /// The server's URL (Streamable HTTP) …
        url: Option<String>,
        #[arg(long = "header", value_name = "K=V")]
        headers: Vec<String>,
        #[arg(long)]
        oauth: bool,
        /// Follow the authorization URL without a browser (servers that
        /// approve at once, as the MCP conformance suite's do).
        #[arg(long, hide = true)]
        headless_auth: bool,
        #[arg(long)]
        call: Option<String>,
        #[arg(long, default_value = "{}")]
        args: String,
        /// … or a command and its arguments (after `--`).
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// List servers (status, credentials by name) and their tools with
    /// flags and review status.
    Ls { path: PathBuf },
    /// Change one tool's flags.
    Tool {
        path: PathBuf,
        server: String,
        tool: String,
        #[arg(long)]
        enable: bool,
        #[arg(long)]
        disable: bool,
        /// Each call asks the owner.
        #[arg(long)]
        restrict: bool,
        /// Calls run without asking.
        #[arg(long)]
        allow: bool,
        #[arg(long)]
        hide: bool,
        #[arg(long)]
        show: bool,
    },
    /// Remove a server, its tool declarations and its sealed credentials.
    Rm { path: PathBuf, name: String },
    /// Connect a server again and rediscover its tools (your choices kept).
    Restart { path: PathBuf, name: String },
    /// Serve the fleet as an MCP server on stdio (for Claude Code, Codex or
    /// any MCP client): list agents, message them, read their files,
    /// answer their approvals. Uses the fleet's daemon, or runs one inside
    /// this process while it serves.
    Serve {
        fleet: Option<PathBuf>,
        /// Serve Streamable HTTP on 127.0.0.1:PORT/mcp instead of stdio
        /// (the daemon's bearer token required).
        #[arg(long, value_name = "PORT")]
        http: Option<u16>,
        /// Serve one `echo` tool and nothing else (what `adf bench mcp`
        /// measures the client against).
        #[arg(long, hide = true)]
        echo: bool,
        /// The name of the client's own identity and inbox in the fleet
        /// (an agent file made on first use).
        #[arg(long = "as", value_name = "NAME", default_value = "mcp-client")]
        me: String,
    },
}

fn anyhow_at(path: &Path, e: String) -> anyhow::Error {
    anyhow::anyhow!("{}: {e}", path.display())
}

fn tokio_rt() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

/// A file this process opens, its credentials envelope unlocked.
fn unlocked(path: &Path, mut store: crate::store::Store) -> anyhow::Result<crate::store::Store> {
    let inst = install::current().map_err(anyhow::Error::msg)?;
    store.unlock_quietly(&inst).map_err(|e| at(path, e))?;
    Ok(store)
}

/// Connect once to list a server's tools (no agent holds the file).
fn probe(spec: &ServerSpec, name: &str) -> anyhow::Result<Vec<crate::mcp::reconcile::ServerTool>> {
    let rt = tokio_rt()?;
    let scratch = std::env::temp_dir().join("adf-mcp").join("cli").join(name);
    let conn = rt.block_on(connect(spec, &scratch)).map_err(|e| anyhow::anyhow!("{e}"))?;
    let tools = conn.tools.clone();
    rt.block_on(conn.close());
    Ok(tools)
}

pub fn run(out: &Out, cmd: McpCmd) -> anyhow::Result<()> {
    match cmd {
        McpCmd::Serve { echo: true, .. } => crate::mcp::serve::run_echo(),
        McpCmd::Login { path, name } => {
            let store = match open_for_write(&path)? {
                Target::Local(store) => store,
                Target::Held(via) => {
                    // Sign in here, seal through the holder, reconnect there.
                    let servers = via.call(reqwest::Method::GET, &["mcp"], &[], None)?;
                    let url = servers["servers"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|s| s["name"] == name.as_str() && s["transport"] == "http")
                        .and_then(|s| s["target"].as_str())
                        .map(str::to_string)
                        .ok_or_else(|| anyhow::anyhow!("{}: no HTTP MCP server named {name:?}", path.display()))?;
                    let sealed = sign_in(&url, &name, false)?;
                    via.call(reqwest::Method::PUT, &["mcp", &name, "oauth"], &[], Some(&json!({"oauth": sealed})))?;
                    let r = via.call(reqwest::Method::POST, &["mcp", &name, "restart"], &[], None)?;
                    return out.line(format!("{name}: signed in, {} tools", r["tools_discovered"]));
                }
            };
            let mut cfg = store.config_value().map_err(|e| at(&path, e))?;
            let Some(url) = server_entry(&cfg, &name).and_then(|s| s["url"].as_str()).map(str::to_string) else {
                close(store)?;
                anyhow::bail!("{}: no HTTP MCP server named {name:?}", path.display());
            };
            let sealed = sign_in(&url, &name, false)?;
            let mut store = unlocked(&path, store)?;
            let purpose = crate::mcp::creds::purpose(&name, crate::mcp::oauth::KEY);
            let mut spec = ServerSpec::with_secrets(server_entry(&cfg, &name).unwrap_or(&Value::Null), |p| {
                store.secret_get(p).ok().flatten().and_then(|b| String::from_utf8(b).ok())
            })
            .map_err(|e| anyhow_at(&path, e))?;
            spec.oauth = Some(sealed.clone());
            let tools = probe(&spec, &name)?;
            store.secret_set(&purpose, sealed.as_bytes(), false).map_err(|e| at(&path, e))?;
            if let Some(s) = cfg
                .pointer_mut("/mcp/servers")
                .and_then(Value::as_array_mut)
                .and_then(|a| a.iter_mut().find(|s| s["name"] == name.as_str()))
            {
                s["auth"] = json!("oauth");
            }
            reconcile(&mut cfg, &name, &tools);
            store.config_replace(cfg).map_err(|e| at(&path, e))?;
            close(store)?;
            out.line(format!("{name}: signed in, {} tools (the tokens are sealed in {})", tools.len(), path.display()))
        }
        McpCmd::Probe { url, headers, oauth, headless_auth, call, args, command } => {
            let mut add = owner::AddServer {
                name: "probe".into(),
                command,
                url: url.clone(),
                headers: owner::pairs(&headers, "--header").map_err(anyhow::Error::msg)?,
                ..Default::default()
            };
            let args: Value = serde_json::from_str(&args).map_err(|e| anyhow::anyhow!("--args is not JSON: {e}"))?;
            let rt = tokio_rt()?;
            let scratch = std::env::temp_dir().join("adf-mcp").join("cli").join("probe");
            let spec_of = |add: &owner::AddServer| -> anyhow::Result<ServerSpec> {
                let (entry, sealed) = owner::entry(add).map_err(anyhow::Error::msg)?;
                ServerSpec::with_sealed(&entry, &sealed).map_err(anyhow::Error::msg)
            };
            // With --oauth, sign in only when the server asks for it.
            let conn = match rt.block_on(connect(&spec_of(&add)?, &scratch)) {
                Ok(c) => c,
                Err(e) if oauth && e.reason.contains("HTTP 401") => {
                    let u = url.as_deref().unwrap_or_default();
                    add.oauth = Some(sign_in(u, "probe", headless_auth)?);
                    rt.block_on(connect(&spec_of(&add)?, &scratch)).map_err(|e| anyhow::anyhow!("{e}"))?
                }
                Err(e) => anyhow::bail!("{e}"),
            };
            let result = call.as_ref().map(|t| rt.block_on(conn.call(t, args.clone())));
            let tools = conn.tools.clone();
            rt.block_on(conn.close());
            if out.json {
                return out.json(&json!({"tools": tools, "result": result.as_ref().map(|(r, e)| json!({"content": r, "is_error": e}))}));
            }
            for t in &tools {
                out.line(format!(
                    "{:<32} {}",
                    t.name,
                    t.description.as_deref().unwrap_or("").lines().next().unwrap_or("")
                ))?;
            }
            match result {
                Some((r, false)) => out.line(r),
                Some((r, true)) => anyhow::bail!("{}: {r}", call.unwrap_or_default()),
                None => Ok(()),
            }
        }
        McpCmd::Serve { fleet, http, me, .. } => {
            if !owner::valid_name(&me) {
                anyhow::bail!("--as {me:?}: use lowercase letters, digits, _ and -");
            }
            crate::mcp::serve::run(fleet, http, &me)
        }
        McpCmd::Add { path, name, url, headers, env, no_connect, oauth, command } => {
            let oauth = match (&url, oauth) {
                (Some(u), true) => Some(sign_in(u, &name, false)?),
                (None, true) => anyhow::bail!("--oauth is for an HTTP server (--url)"),
                _ => None,
            };
            let add = owner::AddServer {
                name: name.clone(),
                command,
                url,
                env: owner::pairs(&env, "--env").map_err(|e| anyhow_at(&path, e))?,
                headers: owner::pairs(&headers, "--header").map_err(|e| anyhow_at(&path, e))?,
                oauth: oauth.clone(),
            };
            let (entry, sealed) = owner::entry(&add).map_err(|e| anyhow_at(&path, e))?;
            let answer = match open_for_write(&path)? {
                Target::Held(via) => {
                    let body = json!({"name": name, "command": add.command, "url": add.url,
                        "env": add.env.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
                        "headers": add.headers.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
                        "oauth": oauth,
                        "connect": !no_connect});
                    let body = strip_nulls(body);
                    via.call(reqwest::Method::POST, &["mcp"], &[], Some(&body))?
                }
                Target::Local(store) => {
                    let mut cfg = store.config_value().map_err(|e| at(&path, e))?;
                    if server_entry(&cfg, &name).is_some() {
                        close(store)?;
                        anyhow::bail!("{}: an MCP server named {name:?} is already configured", path.display());
                    }
                    let spec = ServerSpec::with_sealed(&entry, &sealed).map_err(|e| anyhow_at(&path, e))?;
                    let tools = if no_connect {
                        None
                    } else {
                        match probe(&spec, &name) {
                            Ok(t) => Some(t),
                            Err(e) => {
                                close(store)?;
                                anyhow::bail!("{e}; nothing was saved");
                            }
                        }
                    };
                    // Unlocked only once there is something to seal.
                    let mut store = if sealed.is_empty() { store } else { unlocked(&path, store)? };
                    for (purpose, value) in &sealed {
                        store.secret_set(purpose, value.as_bytes(), false).map_err(|e| at(&path, e))?;
                    }
                    push_server(&mut cfg, entry);
                    let outcome = tools.as_ref().map(|t| reconcile(&mut cfg, &name, t));
                    store.config_replace(cfg).map_err(|e| at(&path, e))?;
                    close(store)?;
                    json!({"server": name, "connected": tools.is_some(),
                           "tools": outcome.map(|o| o.new).unwrap_or_default(), "sealed": sealed.len()})
                }
            };
            if out.json {
                return out.json(&answer);
            }
            let n = answer["tools"].as_array().map(Vec::len).unwrap_or(0);
            let sealed = answer["sealed"].as_u64().unwrap_or(0);
            let secrets =
                if sealed > 0 { format!("; {sealed} values sealed in its credentials") } else { String::new() };
            if answer["connected"] == true {
                out.line(format!(
                    "added {name}: {n} tools, each restricted until you allow it (adf mcp tool {} {name} TOOL --allow){secrets}",
                    path.display()
                ))
            } else {
                out.line(format!("added {name} (not connected; its tools are declared at the first call){secrets}"))
            }
        }
        McpCmd::Ls { path } => {
            let (servers, live) = match open_for_write(&path)? {
                Target::Held(via) => (via.call(reqwest::Method::GET, &["mcp"], &[], None)?["servers"].take(), true),
                Target::Local(store) => {
                    let cfg = store.config_value().map_err(|e| at(&path, e))?;
                    close(store)?;
                    (json!(owner::view(&cfg, &[])), false)
                }
            };
            if out.json {
                return out.json(&servers);
            }
            let servers = servers.as_array().cloned().unwrap_or_default();
            if servers.is_empty() {
                return out.line(format!("{}: no MCP servers (adf mcp add FILE NAME -- COMMAND)", path.display()));
            }
            for s in &servers {
                let state =
                    if live { s["state"].as_str().unwrap_or("idle") } else { "not running (no adf holds the file)" };
                let creds: Vec<&str> =
                    s["credentials"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                out.line(format!(
                    "{} ({}: {}) {state}{}",
                    s["name"].as_str().unwrap_or(""),
                    s["transport"].as_str().unwrap_or(""),
                    s["target"].as_str().unwrap_or(""),
                    if creds.is_empty() { String::new() } else { format!(" · credentials {}", creds.join(", ")) }
                ))?;
                if let Some(e) = s["error"].as_str() {
                    out.line(format!("  error: {e}"))?;
                }
                if let Some(ms) = s["retry_in_ms"].as_u64() {
                    out.line(format!("  next attempt in {} s", ms.div_ceil(1000)))?;
                }
                if s["state"] != "connected" {
                    for l in s["stderr_tail"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                        out.line(format!("  stderr: {l}"))?;
                    }
                }
                for t in s["tools"].as_array().into_iter().flatten() {
                    let flag =
                        |k: &str, on: &str, off: &str| if t[k] == true { on.to_string() } else { off.to_string() };
                    out.line(format!(
                        "  {:<32} {} {} {}{}",
                        t["name"].as_str().unwrap_or(""),
                        flag("enabled", "enabled ", "disabled"),
                        flag("visible", "shown ", "hidden"),
                        flag("restricted", "asks  ", "allowed"),
                        t["status"].as_str().map(|s| format!("  [{s}]")).unwrap_or_default()
                    ))?;
                }
            }
            Ok(())
        }
        McpCmd::Tool { path, server, tool, enable, disable, restrict, allow, hide, show } => {
            if !(enable || disable || restrict || allow || hide || show) {
                anyhow::bail!("say what to change: --enable, --disable, --restrict, --allow, --hide or --show");
            }
            if (enable && disable) || (restrict && allow) || (hide && show) {
                anyhow::bail!("contradicting flags");
            }
            let pick = |on: bool, off: bool| {
                if on {
                    Some(true)
                } else if off {
                    Some(false)
                } else {
                    None
                }
            };
            let flags = owner::Flags {
                enabled: pick(enable, disable),
                visible: pick(show, hide),
                restricted: pick(restrict, allow),
            };
            let declared = format!("mcp_{server}_{tool}");
            let d = match open_for_write(&path)? {
                Target::Held(via) => {
                    let body = strip_nulls(json!({"enabled": flags.enabled, "visible": flags.visible,
                                                  "restricted": flags.restricted}));
                    via.call(reqwest::Method::PATCH, &["mcp", &server, "tools", &tool], &[], Some(&body))?["tool"]
                        .take()
                }
                Target::Local(mut store) => {
                    let mut cfg = store.config_value().map_err(|e| at(&path, e))?;
                    let d = owner::set_tool_flags(&mut cfg, &server, &tool, flags)
                        .map_err(|e| anyhow_at(&path, format!("{e} (adf mcp ls)")))?;
                    store.config_replace(cfg).map_err(|e| at(&path, e))?;
                    close(store)?;
                    d
                }
            };
            if out.json {
                return out.json(&d);
            }
            let on = |k: &str| d[k] == true;
            out.line(format!(
                "{declared}: {}, {}, {}",
                if on("enabled") { "enabled" } else { "disabled" },
                if on("visible") { "shown" } else { "hidden" },
                if on("restricted") { "asks the owner" } else { "allowed" }
            ))
        }
        McpCmd::Rm { path, name } => {
            let removed = match open_for_write(&path)? {
                Target::Held(via) => via.call(reqwest::Method::DELETE, &["mcp", &name], &[], None)?["tools_removed"]
                    .as_u64()
                    .unwrap_or(0) as usize,
                Target::Local(store) => {
                    let mut store = unlocked(&path, store)?;
                    let mut cfg = store.config_value().map_err(|e| at(&path, e))?;
                    let Some(server) = server_entry(&cfg, &name).cloned() else {
                        close(store)?;
                        anyhow::bail!("{}: no MCP server named {name:?}", path.display());
                    };
                    let n = remove_server(&mut cfg, &name);
                    store.config_replace(cfg).map_err(|e| at(&path, e))?;
                    crate::mcp::creds::remove_sealed(&mut store, &server).map_err(|e| at(&path, e))?;
                    close(store)?;
                    n
                }
            };
            if out.json {
                out.json(&json!({"removed": name, "tools": removed}))
            } else {
                out.line(format!("removed {name}, its {removed} tools and its credentials"))
            }
        }
        McpCmd::Restart { path, name } => {
            let answer = match open_for_write(&path)? {
                Target::Held(via) => via.call(reqwest::Method::POST, &["mcp", &name, "restart"], &[], None)?,
                Target::Local(store) => {
                    let store = unlocked(&path, store)?;
                    let cfg = store.config_value().map_err(|e| at(&path, e))?;
                    let Some(server) = server_entry(&cfg, &name).cloned() else {
                        close(store)?;
                        anyhow::bail!("{}: no MCP server named {name:?}", path.display());
                    };
                    let spec = ServerSpec::with_secrets(&server, |p| {
                        store.secret_get(p).ok().flatten().and_then(|b| String::from_utf8(b).ok())
                    })
                    .map_err(|e| anyhow_at(&path, e))?;
                    let mut store = store;
                    match probe(&spec, &name) {
                        Ok(tools) => {
                            let mut cfg = cfg;
                            let o = reconcile(&mut cfg, &name, &tools);
                            if o.changed {
                                store.config_replace(cfg).map_err(|e| at(&path, e))?;
                            }
                            close(store)?;
                            json!({"success": true, "name": name, "tools_discovered": tools.len(),
                                   "new": o.new, "changed": o.changed_tools, "removed": o.removed})
                        }
                        Err(e) => {
                            close(store)?;
                            anyhow::bail!("{e}");
                        }
                    }
                }
            };
            if out.json {
                return out.json(&answer);
            }
            if answer["success"] != true {
                anyhow::bail!(
                    "{}: {}: {}",
                    path.display(),
                    answer["message"].as_str().unwrap_or("the server did not reconnect"),
                    answer["connection_error"].as_str().unwrap_or("")
                );
            }
            out.line(format!("{name}: connected, {} tools", answer["tools_discovered"]))
        }
    }
}

/// OAuth sign-in from the terminal: the URL to open goes to stderr (a user
/// on SSH opens it on their own machine and pastes back the address the
/// browser lands on if it cannot reach this one). The sealed text.
fn sign_in(url: &str, name: &str, headless: bool) -> anyhow::Result<String> {
    use crate::mcp::oauth::{Approver, seal_text, sign_in};
    let rt = tokio_rt()?;
    let mut tell = |auth: &str| {
        eprintln!(
            "Sign in to {name}: open this address in a browser (on this machine, or on yours over SSH):\n\n  {auth}\n\nWaiting for the sign-in… (if the browser cannot come back to this machine, paste the address it lands on here)"
        );
    };
    let approver = if headless { Approver::Headless } else { Approver::Person(&mut tell) };
    let creds = rt.block_on(sign_in(url, approver)).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    Ok(seal_text(url, &creds))
}

/// Drop the null members of a JSON body.
fn strip_nulls(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.retain(|_, v| !v.is_null());
    }
    v
}
