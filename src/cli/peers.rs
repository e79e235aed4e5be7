//! `adf peers`: the other runtimes this one can message (messaging.md §13),
//! from the fleet's daemon when one runs (its peer table, kept by mDNS,
//! the tailnet sweep and the manual entries), else found here by one
//! sweep and a short mDNS browse. `add` and `rm` keep the manual
//! `host:port` entries in settings.json (`meshPeers`).

use serde_json::{Value, json};

use super::output::Out;
use crate::providers::accounts;
use crate::runtime::mesh::{Mesh, mdns, server, sweep};

#[derive(Debug, Clone, clap::Subcommand)]
pub enum PeersCmd {
    /// The peer table (the default).
    Ls,
    /// Add a manual entry: host, host:port or http://host:port (the mesh
    /// port 7295 when none is given).
    Add { peer: String },
    /// Remove a manual entry.
    Rm { peer: String },
}

/// How long `adf peers` listens for mDNS answers when no daemon runs.
const BROWSE: std::time::Duration = std::time::Duration::from_millis(1500);

pub fn run(out: &Out, url: Option<&str>, cmd: Option<&PeersCmd>, refresh: bool) -> anyhow::Result<u8> {
    match cmd {
        Some(PeersCmd::Add { peer }) => return edit(out, peer, true),
        Some(PeersCmd::Rm { peer }) => return edit(out, peer, false),
        Some(PeersCmd::Ls) | None => {}
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let report = if crate::client::Client::configured(url) {
        let c = crate::client::Client::find(url);
        let q: &[(&str, &str)] = if refresh { &[("refresh", "true")] } else { &[] };
        let mut v = rt.block_on(c.call(reqwest::Method::GET, c.url(&["peers"], q)?, None))?;
        v["from"] = c.base.clone().into();
        v
    } else {
        rt.block_on(async {
            let mesh = Mesh::new(crate::runtime::bus::Bus::new(), Default::default());
            mesh.set_sweep_port(server::DEFAULT_PORT);
            let browse = {
                let mesh = mesh.clone();
                tokio::task::spawn_blocking(move || mdns::browse_for(&mesh, BROWSE))
            };
            mesh.sweep_now().await;
            let mdns = browse.await.unwrap_or_else(|e| Err(e.to_string()));
            let mut v = mesh.peers_report().await;
            v["from"] = Value::Null;
            if let Err(e) = mdns {
                v["mdns"] = e.into();
            }
            v
        })
    };
    if out.json {
        out.json(&report)?;
        return Ok(0);
    }
    print(out, &report)?;
    Ok(0)
}

/// "12 s ago", "3 min ago", "never".
fn ago(ms: Option<i64>) -> String {
    let Some(ms) = ms else { return "never".into() };
    let s = (chrono::Utc::now().timestamp_millis() - ms).max(0) / 1000;
    match s {
        0..60 => format!("{s} s ago"),
        60..3600 => format!("{} min ago", s / 60),
        3600..86_400 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

fn print(out: &Out, v: &Value) -> anyhow::Result<()> {
    let text = |x: &Value| x.as_str().unwrap_or("-").to_string();
    let rows: Vec<Vec<String>> = v["peers"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    let note = match (&p["error"], &p["shadowed_by"]) {
                        (Value::String(e), _) => e.clone(),
                        (_, Value::String(by)) => format!("same runtime as {by}"),
                        _ => p["host"].as_str().unwrap_or("").to_string(),
                    };
                    vec![
                        text(&p["source"]),
                        text(&p["url"]),
                        text(&p["runtime_id"]),
                        ago(p["last_seen"].as_i64()),
                        note,
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    if rows.is_empty() {
        out.line("no peer runtimes known")?;
    } else {
        out.table(&["SOURCE", "URL", "RUNTIME", "LAST SEEN", "NOTE"], &rows)?;
    }
    let t = &v["tailnet"];
    let tailnet = match t["state"].as_str() {
        Some("ok") => format!("{} machine(s) online", t["machines"]),
        Some(_) => t["detail"].as_str().unwrap_or("not swept").to_string(),
        None => "not swept".into(),
    };
    out.line(format!("tailnet: {tailnet}"))?;
    for bad in v["bad_manual"].as_array().into_iter().flatten() {
        out.line(format!("settings.json meshPeers: {}", text(bad)))?;
    }
    match v["from"].as_str() {
        Some(d) => out.line(format!("from the daemon at {d} (last sweep {})", ago(v["last_sweep"].as_i64()))),
        None => {
            if let Some(e) = v["mdns"].as_str() {
                out.line(format!("mdns: {e}"))?;
            }
            out.line("no daemon runs: swept once from here (a daemon keeps the table, sweeping every 45 s)")
        }
    }
}

/// Add or remove a manual entry in settings.json; bad input changes nothing.
fn edit(out: &Out, peer: &str, add: bool) -> anyhow::Result<u8> {
    let url =
        sweep::manual_url(peer, server::DEFAULT_PORT).map_err(|e| anyhow::anyhow!("{e}; settings.json unchanged"))?;
    let mut s = accounts::load().map_err(anyhow::Error::msg)?;
    let list: Vec<String> = match s.extra.get("meshPeers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
        Some(_) => anyhow::bail!(
            "{}: meshPeers is not a list of host:port entries; fix it by hand first",
            accounts::settings_path().display()
        ),
    };
    let same = |e: &String| sweep::manual_url(e, server::DEFAULT_PORT).is_ok_and(|u| u == url);
    let present = list.iter().any(same);
    let next: Vec<String> = if add {
        if present { list } else { list.into_iter().chain([url.clone()]).collect() }
    } else {
        if !present {
            anyhow::bail!("{url} is not a manual peer (see adf peers); settings.json unchanged");
        }
        list.into_iter().filter(|e| !same(e)).collect()
    };
    let changed = add != present;
    if changed {
        s.extra.insert("meshPeers".into(), json!(next));
        accounts::save(&s).map_err(anyhow::Error::msg)?;
    }
    if out.json {
        out.json(&json!({"meshPeers": next, "changed": changed, "settings": accounts::settings_path()}))?;
    } else if !changed {
        out.line(format!("{url} is already a manual peer"))?;
    } else if add {
        out.line(format!("{url} added: a running daemon probes it at its next sweep (adf peers --refresh now)"))?;
    } else {
        out.line(format!("{url} removed"))?;
    }
    Ok(0)
}
