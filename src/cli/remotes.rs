//! `adf remote ls|add|rm` (daemons on other machines, `client::remotes`)
//! and what `--remote` does before a command runs: one remote becomes the
//! daemon the command talks to, with that remote's token; several (or
//! `all`) list their agents side by side, each host with its status.

use std::path::PathBuf;

use serde_json::{Value, json};

use super::output::Out;
use crate::client::remotes::{self, Remote};

#[derive(Debug, Clone, clap::Subcommand)]
pub enum RemoteCmd {
    /// The remotes, each with where its token comes from and whether its
    /// daemon answers (and with which role).
    Ls,
    /// Add a remote: a name and the daemon's URL; its token from
    /// `ADF_DAEMON_TOKEN_<NAME>` or `--token-file` (never from argv).
    Add {
        name: String,
        url: String,
        /// A file holding the remote daemon's token (0600).
        #[arg(long)]
        token_file: Option<PathBuf>,
    },
    /// Remove a remote.
    Rm { name: String },
}

pub fn run(out: &Out, cmd: &RemoteCmd) -> anyhow::Result<u8> {
    match cmd {
        RemoteCmd::Add { name, url, token_file } => {
            let r = remotes::add(name, url, token_file.clone())?;
            if out.json {
                out.json(&r)?;
            } else {
                let token = match &r.token_file {
                    Some(p) => format!("its token from {}", p.display()),
                    None => format!("its token from ${} (none set: add --token-file)", remotes::token_var(&r.name)),
                };
                out.line(format!("remote {} added: {} ({token})", r.name, r.url))?;
            }
            Ok(0)
        }
        RemoteCmd::Rm { name } => {
            let r = remotes::remove(name)?;
            if out.json {
                out.json(&r)?;
            } else {
                out.line(format!("remote {} removed", r.name))?;
            }
            Ok(0)
        }
        RemoteCmd::Ls => {
            let list = remotes::list()?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            // Tunnels are opened first (ssh runs as a process of its own).
            let conns: Vec<_> = list.iter().map(|r| (r, r.connect())).collect();
            let states = rt.block_on(futures_util::future::join_all(conns.iter().map(|(r, c)| state(r, c))));
            if out.json {
                out.json(&json!({"remotes": states}))?;
                return Ok(0);
            }
            if states.is_empty() {
                out.line("no remotes (adf remote add NAME URL [--token-file F])")?;
                return Ok(0);
            }
            let rows: Vec<Vec<String>> = states
                .iter()
                .map(|s| {
                    let t = |k: &str| s[k].as_str().unwrap_or("-").to_string();
                    vec![t("name"), t("url"), t("token"), t("status")]
                })
                .collect();
            out.table(&["NAME", "URL", "TOKEN", "STATUS"], &rows)?;
            Ok(0)
        }
    }
}

/// One remote as `ls` shows it: its token's source (never the token) and
/// what its daemon answers.
async fn state(r: &Remote, conn: &Result<remotes::Connection, remotes::RemoteError>) -> Value {
    let mut v = json!({"name": r.name, "url": r.url});
    v["token"] = match r.token() {
        Ok(Some((_, from))) => from.into(),
        _ if r.url.starts_with("ssh:") => "over ssh".into(),
        _ => Value::Null,
    };
    let conn = match conn {
        Ok(c) => c,
        Err(e) => {
            v["ok"] = false.into();
            v["status"] = e.to_string().into();
            return v;
        }
    };
    let client = conn.client();
    let (ok, status) = match r.whoami(&client).await {
        Ok(w) => {
            let agents = client.get(&["agents"]).await.ok().and_then(|a| a.as_array().map(Vec::len));
            v["role"] = w["role"].clone();
            let n = agents.map(|n| format!(", {n} agent(s)")).unwrap_or_default();
            (true, format!("ok ({}{n})", w["role"].as_str().unwrap_or("?")))
        }
        Err(e) => (false, e.to_string()),
    };
    v["ok"] = ok.into();
    v["status"] = status.into();
    v
}

/// `adf --remote A --remote B agents`: every host's agents in one table,
/// a host that does not answer named with why (exit status 1 then).
pub fn agents(out: &Out, list: &[Remote]) -> anyhow::Result<u8> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let conns: Vec<_> = list.iter().map(|r| (r, r.connect())).collect();
    let answers = rt.block_on(futures_util::future::join_all(conns.iter().map(|(r, c)| async move {
        let got = match c {
            Ok(c) => {
                let client = c.client();
                match r.whoami(&client).await {
                    Ok(_) => client.get(&["agents"]).await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
            Err(e) => Err(e.to_string()),
        };
        (*r, got)
    })));
    let mut hosts = Vec::new();
    let mut rows = Vec::new();
    let mut failed = false;
    for (r, got) in answers {
        match got {
            Ok(agents) => {
                for a in agents.as_array().into_iter().flatten() {
                    let t = |k: &str| a[k].as_str().unwrap_or("-").to_string();
                    rows.push(vec![r.name.clone(), t("id"), t("name"), t("handle"), t("state")]);
                }
                hosts.push(json!({"name": r.name, "url": r.url, "ok": true, "agents": agents}));
            }
            Err(e) => {
                failed = true;
                hosts.push(json!({"name": r.name, "url": r.url, "ok": false, "error": e}));
            }
        }
    }
    if out.json {
        out.json(&json!({"remotes": hosts}))?;
    } else {
        out.table(&["REMOTE", "ID", "NAME", "HANDLE", "STATE"], &rows)?;
        for h in hosts.iter().filter(|h| h["ok"] == false) {
            eprintln!("adf: remote {}: {}", h["name"].as_str().unwrap_or("?"), h["error"].as_str().unwrap_or("?"));
        }
    }
    Ok(u8::from(failed))
}
