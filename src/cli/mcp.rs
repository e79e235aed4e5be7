//! `adf mcp …`: the MCP servers of an agent file. `add` connects first and
//! saves the server with its tools reconciled (new tools restricted), or
//! changes nothing and says why the server did not start; `ls` shows
//! servers and tool flags; `tool` flips one tool's flags; `rm` removes a
//! server and its tools.

use std::path::{Path, PathBuf};

use clap::Subcommand;
use serde_json::{Value, json};

use super::held::{Target, open_for_write};
use super::output::{Out, at, close, open_for_read};
use crate::mcp::client::{ServerSpec, connect};
use crate::mcp::reconcile::reconcile;

#[derive(Debug, Clone, Subcommand)]
pub enum McpCmd {
    /// Add a server: `adf mcp add FILE NAME -- COMMAND [ARGS…]` (stdio) or
    /// `adf mcp add FILE NAME --url URL [--header K=V]…` (Streamable HTTP).
    Add {
        path: PathBuf,
        name: String,
        #[arg(long)]
        url: Option<String>,
        /// A request header for an HTTP server (`K=V`, repeatable).
        #[arg(long = "header", value_name = "K=V")]
        headers: Vec<String>,
        /// Save without connecting (its tools are declared at the first call).
        #[arg(long)]
        no_connect: bool,
        /// The command and its arguments (after `--`).
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// List servers and their tools with flags and review status.
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
    /// Remove a server and every one of its tool declarations.
    Rm { path: PathBuf, name: String },
}

/// Change the config of a file, whether this process opens it or an app
/// or daemon holds it (then through the holder's API, which validates).
fn edit<T>(path: &Path, f: impl FnOnce(&mut Value) -> anyhow::Result<T>) -> anyhow::Result<T> {
    match open_for_write(path)? {
        Target::Local(mut store) => {
            let mut cfg = store.config_value().map_err(|e| at(path, e))?;
            let r = f(&mut cfg)?;
            store.config_replace(cfg).map_err(|e| at(path, e))?;
            close(store)?;
            Ok(r)
        }
        Target::Held(via) => {
            let mut cfg = via.call(reqwest::Method::GET, &["config"], &[], None)?["config"].take();
            let r = f(&mut cfg)?;
            via.call(reqwest::Method::PUT, &["config"], &[], Some(&cfg))?;
            Ok(r)
        }
    }
}

fn pairs(items: &[String], what: &str) -> anyhow::Result<serde_json::Map<String, Value>> {
    let mut m = serde_json::Map::new();
    for i in items {
        let (k, v) = i.split_once('=').ok_or_else(|| anyhow::anyhow!("{what} {i:?} is not K=V"))?;
        m.insert(k.to_string(), json!(v));
    }
    Ok(m)
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

pub fn run(out: &Out, cmd: McpCmd) -> anyhow::Result<()> {
    match cmd {
        McpCmd::Add { path, name, url, headers, no_connect, command } => {
            if !valid_name(&name) {
                anyhow::bail!("{}: server name {name:?}: use lowercase letters, digits, _ and -", path.display());
            }
            let mut entry = match (&url, command.split_first()) {
                (Some(u), None) => {
                    json!({"name": name, "transport": "http", "url": u, "headers": pairs(&headers, "header")?})
                }
                (None, Some((c, args))) => json!({"name": name, "transport": "stdio", "command": c, "args": args}),
                (Some(_), Some(_)) => anyhow::bail!("give either --url or a command after --, not both"),
                (None, None) => anyhow::bail!("give a command after -- (stdio) or --url (Streamable HTTP)"),
            };
            let spec = ServerSpec::from_config(&entry).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            {
                let store = open_for_read(&path)?;
                let cfg = store.config_value().map_err(|e| at(&path, e))?;
                close(store)?;
                let taken = cfg
                    .pointer("/mcp/servers")
                    .and_then(Value::as_array)
                    .is_some_and(|s| s.iter().any(|s| s["name"] == name.as_str()));
                if taken {
                    anyhow::bail!("{}: an MCP server named {name:?} is already configured", path.display());
                }
            }
            let tools = if no_connect {
                None
            } else {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                let scratch = std::env::temp_dir().join("adf-mcp").join("cli").join(&name);
                let conn =
                    rt.block_on(connect(&spec, &scratch)).map_err(|e| anyhow::anyhow!("{e}; nothing was saved"))?;
                let tools = conn.tools.clone();
                rt.block_on(conn.close());
                Some(tools)
            };
            if let Some(t) = &tools {
                entry["available_tools"] = serde_json::to_value(t)?;
            }
            let outcome = edit(&path, |cfg| {
                if !cfg["mcp"].is_object() {
                    cfg["mcp"] = json!({"servers": []});
                }
                if !cfg["mcp"]["servers"].is_array() {
                    cfg["mcp"]["servers"] = json!([]);
                }
                if let Some(a) = cfg["mcp"]["servers"].as_array_mut() {
                    a.push(entry.clone());
                }
                Ok(tools.as_ref().map(|t| reconcile(cfg, &name, t)))
            })?;
            if out.json {
                return out.json(&json!({"server": name, "tools": outcome.as_ref().map(|o| &o.new)}));
            }
            match outcome {
                Some(o) => out.line(format!(
                    "added {name}: {} tools, each restricted until you allow it (adf mcp tool {} {name} TOOL --allow)",
                    o.new.len(),
                    path.display()
                )),
                None => out.line(format!("added {name} (not connected; its tools are declared at the first call)")),
            }
        }
        McpCmd::Ls { path } => {
            let store = open_for_read(&path)?;
            let cfg = store.config_value().map_err(|e| at(&path, e))?;
            close(store)?;
            let servers: Vec<Value> = cfg
                .pointer("/mcp/servers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|s| {
                    let name = s["name"].as_str().unwrap_or("").to_string();
                    let prefix = format!("mcp_{name}_");
                    let tools: Vec<Value> = cfg["tools"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|d| d["name"].as_str().is_some_and(|n| n.starts_with(&prefix)))
                        .map(|d| {
                            json!({"name": d["name"].as_str().unwrap_or("").trim_start_matches(&prefix),
                                   "enabled": d["enabled"].as_bool().unwrap_or(false),
                                   "visible": d["visible"].as_bool().unwrap_or(false),
                                   "restricted": d["restricted"].as_bool().unwrap_or(false),
                                   "status": d["mcp_tool_status"]})
                        })
                        .collect();
                    let target = s["command"].as_str().map(|c| {
                        let args: Vec<&str> =
                            s["args"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                        format!("{c} {}", args.join(" ")).trim().to_string()
                    });
                    json!({"name": name, "transport": s["transport"].as_str().unwrap_or("stdio"),
                           "target": target.or_else(|| s["url"].as_str().map(str::to_string)), "tools": tools})
                })
                .collect();
            if out.json {
                return out.json(&servers);
            }
            if servers.is_empty() {
                return out.line(format!("{}: no MCP servers (adf mcp add FILE NAME -- COMMAND)", path.display()));
            }
            for s in &servers {
                out.line(format!(
                    "{} ({}: {})",
                    s["name"].as_str().unwrap_or(""),
                    s["transport"].as_str().unwrap_or(""),
                    s["target"].as_str().unwrap_or("")
                ))?;
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
            let flags = [
                (enable, "enabled", true),
                (disable, "enabled", false),
                (restrict, "restricted", true),
                (allow, "restricted", false),
                (hide, "visible", false),
                (show, "visible", true),
            ];
            if !flags.iter().any(|f| f.0) {
                anyhow::bail!("say what to change: --enable, --disable, --restrict, --allow, --hide or --show");
            }
            if (enable && disable) || (restrict && allow) || (hide && show) {
                anyhow::bail!("contradicting flags");
            }
            let declared = format!("mcp_{server}_{tool}");
            let d = edit(&path, |cfg| {
                let d = cfg["tools"]
                    .as_array_mut()
                    .and_then(|a| a.iter_mut().find(|d| d["name"] == declared.as_str()))
                    .ok_or_else(|| {
                        anyhow::anyhow!("{}: no MCP tool {tool:?} of server {server:?} (adf mcp ls)", path.display())
                    })?;
                if d["locked"] == true {
                    anyhow::bail!("{}: {declared} is locked", path.display());
                }
                for (on, key, value) in flags {
                    if on {
                        d[key] = json!(value);
                    }
                }
                // A reviewed tool is no longer new or changed.
                if let Some(o) = d.as_object_mut()
                    && o.get("mcp_tool_status").is_some_and(|s| s != "removed")
                {
                    o.remove("mcp_tool_status");
                }
                Ok(d.clone())
            })?;
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
            let prefix = format!("mcp_{name}_");
            let removed = edit(&path, |cfg| {
                let servers = cfg.pointer_mut("/mcp/servers").and_then(Value::as_array_mut);
                let Some(servers) = servers.filter(|s| s.iter().any(|s| s["name"] == name.as_str())) else {
                    anyhow::bail!("{}: no MCP server named {name:?}", path.display());
                };
                servers.retain(|s| s["name"] != name.as_str());
                let mut n = 0;
                if let Some(tools) = cfg["tools"].as_array_mut() {
                    let before = tools.len();
                    tools.retain(|d| !d["name"].as_str().is_some_and(|t| t.starts_with(&prefix)));
                    n = before - tools.len();
                }
                Ok(n)
            })?;
            if out.json {
                out.json(&json!({"removed": name, "tools": removed}))
            } else {
                out.line(format!("removed {name} and its {removed} tools"))
            }
        }
    }
}
