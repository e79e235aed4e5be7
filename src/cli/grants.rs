//! `adf grants ls|add|rm` and `adf approve … --for/--path/--host`: scoped,
//! time-boxed grants (`store::grants`) on a file, through the process that
//! holds it, or on an agent of the daemon by name.

use std::path::{Path, PathBuf};

use reqwest::Method;
use serde_json::{Value, json};

use super::held::{Target, Via, open_for_write};
use super::output::{Out, at, close, open_for_read};
use crate::client::Client;
use crate::store::grants::{NewGrant, parse_duration};

#[derive(Debug, Clone, clap::Subcommand)]
pub enum GrantsCmd {
    /// An agent's live grants (with --all, the expired too).
    Ls {
        /// An agent file, or an agent's name through the daemon.
        path: PathBuf,
        #[arg(long)]
        all: bool,
    },
    /// Approve a restricted tool ahead of time: for a while, for paths
    /// under a folder, for URLs on a host, or a mix.
    Add {
        path: PathBuf,
        tool: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// Revoke a grant by id.
    Rm { path: PathBuf, id: String },
}

/// How far a grant reaches.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Scope {
    /// How long it lasts: 30m, 2h, 1d (at most 30 days).
    #[arg(long = "for", value_name = "DURATION")]
    pub for_: Option<String>,
    /// Only calls whose path is this folder or under it.
    #[arg(long = "path", id = "path_scope", value_name = "FOLDER")]
    pub path: Option<String>,
    /// Only calls whose URL is on this host (*.example.com for subdomains).
    #[arg(long, value_name = "HOST")]
    pub host: Option<String>,
    /// Why, for the audit trail.
    #[arg(long, default_value = "")]
    pub note: String,
}

impl Scope {
    pub fn is_set(&self) -> bool {
        self.for_.is_some() || self.path.is_some() || self.host.is_some()
    }

    fn body(&self, tool: &str) -> anyhow::Result<Value> {
        let for_ms = self.for_.as_deref().map(parse_duration).transpose().map_err(anyhow::Error::msg)?;
        // Checked here too, so a bad pattern is refused before anything is sent.
        NewGrant {
            tool: tool.into(),
            path: self.path.clone(),
            host: self.host.clone(),
            for_ms,
            note: self.note.clone(),
        }
        .check()
        .map_err(anyhow::Error::msg)?;
        Ok(json!({"tool": tool, "path": self.path, "host": self.host, "for": self.for_, "note": self.note}))
    }
}

/// Where grants of `path` are read and written.
enum Where {
    File(PathBuf),
    Api(Via),
}

fn locate(url: Option<&str>, path: &Path) -> Where {
    if path.is_file() {
        return Where::File(path.to_path_buf());
    }
    let name = path.display().to_string();
    Where::Api(Via { client: Client::find(url), agent: name, path: path.to_path_buf() })
}

fn show(out: &Out, grants: &Value) -> anyhow::Result<()> {
    if out.json {
        return out.json(&json!({"grants": grants}));
    }
    let list = grants.as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        return out.line("no grants");
    }
    let now = chrono::Utc::now().timestamp_millis();
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|g| {
            let s = |k: &str| g[k].as_str().unwrap_or("-").to_string();
            let until = match g["expires_at"].as_i64() {
                Some(e) if e <= now => "expired".to_string(),
                Some(e) => format!("{} min left", (e - now + 59_999) / 60_000),
                None => "until revoked".into(),
            };
            vec![s("id"), s("tool"), s("path"), s("host"), until, g["uses"].to_string(), s("note")]
        })
        .collect();
    out.table(&["ID", "TOOL", "PATH", "HOST", "FOR", "USES", "NOTE"], &rows)
}

/// Add a grant; returns it as JSON.
pub fn add(url: Option<&str>, path: &Path, tool: &str, scope: &Scope) -> anyhow::Result<Value> {
    let body = scope.body(tool)?;
    match locate(url, path) {
        Where::File(p) => match open_for_write(&p)? {
            Target::Local(mut store) => {
                let for_ms = scope.for_.as_deref().map(parse_duration).transpose().map_err(anyhow::Error::msg)?;
                let g = store
                    .grant_add(NewGrant {
                        tool: tool.into(),
                        path: scope.path.clone(),
                        host: scope.host.clone(),
                        for_ms,
                        note: scope.note.clone(),
                    })
                    .map_err(|e| at(&p, e))?;
                close(store)?;
                Ok(serde_json::to_value(g)?)
            }
            Target::Held(via) => Ok(via.call(Method::POST, &["grants"], &[], Some(&body))?["grant"].clone()),
        },
        Where::Api(via) => Ok(via.call(Method::POST, &["grants"], &[], Some(&body))?["grant"].clone()),
    }
}

/// The tool a pending task is for.
pub fn task_tool(url: Option<&str>, path: &Path, task_id: &str) -> anyhow::Result<String> {
    let tool = match locate(url, path) {
        Where::File(p) => {
            let store = open_for_read(&p)?;
            let t = store.task_get(task_id).map_err(|e| at(&p, e))?;
            close(store)?;
            t.map(|t| t.tool)
        }
        Where::Api(via) => via.call(Method::GET, &["tasks", task_id], &[], None)?["tool"].as_str().map(str::to_string),
    };
    tool.ok_or_else(|| anyhow::anyhow!("{}: no task {task_id}", path.display()))
}

/// Revoke through an API: false when it has no such grant.
fn delete(via: &Via, id: &str) -> anyhow::Result<bool> {
    match via.call(Method::DELETE, &["grants", id], &[], None) {
        Ok(_) => Ok(true),
        Err(e) if e.to_string().contains("no grant") => Ok(false),
        Err(e) => Err(e),
    }
}

pub fn run(out: &Out, url: Option<&str>, cmd: &GrantsCmd) -> anyhow::Result<()> {
    match cmd {
        GrantsCmd::Ls { path, all } => {
            let list = match locate(url, path) {
                Where::File(p) => {
                    let store = open_for_read(&p)?;
                    let l = store.grant_list(*all).map_err(|e| at(&p, e))?;
                    close(store)?;
                    serde_json::to_value(l)?
                }
                Where::Api(via) => {
                    let q: &[(&str, &str)] = if *all { &[("all", "true")] } else { &[] };
                    via.call(Method::GET, &["grants"], q, None)?["grants"].clone()
                }
            };
            show(out, &list)
        }
        GrantsCmd::Add { path, tool, scope } => {
            let g = add(url, path, tool, scope)?;
            if out.json {
                return out.json(&g);
            }
            out.line(format!("grant {} added for {tool}", g["id"].as_str().unwrap_or("")))
        }
        GrantsCmd::Rm { path, id } => {
            let removed = match locate(url, path) {
                Where::File(p) => match open_for_write(&p)? {
                    Target::Local(mut store) => {
                        let r = store.grant_remove(id).map_err(|e| at(&p, e))?;
                        close(store)?;
                        r
                    }
                    Target::Held(via) => delete(&via, id)?,
                },
                Where::Api(via) => delete(&via, id)?,
            };
            if !removed {
                anyhow::bail!("{}: no grant {id} (adf grants ls lists them)", path.display());
            }
            if out.json {
                out.json(&json!({"id": id, "removed": true}))
            } else {
                out.line(format!("grant {id} revoked"))
            }
        }
    }
}
