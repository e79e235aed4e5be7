//! The fleet from the shell: `adf new` and the agent list that `adf` prints
//! until the terminal app lands. On first run the fleet folder is created
//! with one example agent.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::output::{Out, at};
use crate::paths;
use crate::store::Store;
use crate::store::create::{NewAgent, create_file};

pub fn new(
    out: &Out,
    path: &Path,
    name: Option<String>,
    handle: Option<String>,
    provider: Option<String>,
    model: Option<String>,
    description: Option<String>,
) -> anyhow::Result<()> {
    let created = create_file(
        path,
        &NewAgent {
            name: name.as_deref(),
            handle: handle.as_deref(),
            description: description.as_deref(),
            icon: None,
            provider: provider.as_deref(),
            model: model.as_deref(),
            seal_to: Some(crate::identity::install::current().map_err(anyhow::Error::msg)?),
        },
    )
    .map_err(|e| at(path, e))?;
    // The owner made it: the daemon may start it without a review.
    crate::review::mark_reviewed(&created.id).map_err(anyhow::Error::msg)?;
    if out.json {
        return out.json(&created);
    }
    out.line(format!("created {}", created.path.display()))?;
    out.line(format!("  name    {}", created.name))?;
    out.line(format!("  handle  {}", created.handle))?;
    out.line(format!("  did     {}", created.did))
}

#[derive(Debug, Serialize)]
struct AgentRow {
    path: PathBuf,
    name: String,
    handle: String,
    state: String,
    provider: String,
    model: String,
    error: Option<String>,
}

/// The `.adf` files of a fleet folder and its direct subfolders.
pub fn scan(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Ok(sub) = std::fs::read_dir(&p) {
                out.extend(sub.flatten().map(|e| e.path()).filter(|p| is_agent_file(p)));
            }
        } else if is_agent_file(&p) {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn is_agent_file(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "adf") && p.is_file()
}

fn row(path: PathBuf) -> AgentRow {
    let mut r = AgentRow {
        path: path.clone(),
        name: String::new(),
        handle: String::new(),
        state: String::new(),
        provider: String::new(),
        model: String::new(),
        error: None,
    };
    match Store::open_read_only(&path).and_then(|s| {
        let cfg = s.config_value()?;
        let handle = s.meta_get("adf_handle")?.map(|m| m.value).unwrap_or_default();
        Ok((cfg, handle))
    }) {
        Ok((cfg, handle)) => {
            let s = |p: &str| cfg.pointer(p).and_then(|v| v.as_str()).unwrap_or("").to_string();
            r.name = s("/name");
            r.handle = handle;
            r.state = s("/state");
            r.provider = s("/model/provider");
            r.model = s("/model/model_id");
        }
        Err(e) => r.error = Some(e.to_string()),
    }
    r
}

/// The fleet folder's agents; on first run (no agents) the folder is
/// created with one example agent (then `true`).
pub fn ensure_fleet(dir: &Path) -> anyhow::Result<(Vec<PathBuf>, bool)> {
    let files = scan(dir);
    if !files.is_empty() {
        return Ok((files, false));
    }
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: cannot create fleet folder: {e}", dir.display()))?;
    let example = dir.join("example.adf");
    let created = create_file(
        &example,
        &NewAgent {
            name: Some("example"),
            description: Some("An example agent"),
            seal_to: Some(crate::identity::install::current().map_err(anyhow::Error::msg)?),
            ..Default::default()
        },
    )
    .map_err(|e| at(&example, e))?;
    crate::review::mark_reviewed(&created.id).map_err(anyhow::Error::msg)?;
    Ok((scan(dir), true))
}

/// `adf review PATH`: what the file would do unattended, then the review
/// recorded so the daemon starts it.
pub fn review(out: &Out, path: &Path) -> anyhow::Result<()> {
    let mut v = crate::review::summary(path).map_err(anyhow::Error::msg)?;
    let id = v["agentId"].as_str().unwrap_or("").to_string();
    crate::review::mark_reviewed(&id).map_err(anyhow::Error::msg)?;
    v["reviewed"] = serde_json::json!(true);
    if out.json {
        return out.json(&v);
    }
    let s = |x: &serde_json::Value| x.as_str().map(str::to_string).unwrap_or_else(|| x.to_string());
    out.line(format!("{} ({})", s(&v["name"]), id))?;
    out.line(format!("  provider   {} / {}", s(&v["provider"]), s(&v["model"])))?;
    let tools: Vec<String> = v["tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| format!("{}{}", s(&t["name"]), if t["restricted"] == true { " (asks you)" } else { "" }))
                .collect()
        })
        .unwrap_or_default();
    out.line(format!("  tools      {}", if tools.is_empty() { "none".into() } else { tools.join(", ") }))?;
    let triggers: Vec<String> =
        v["triggers"].as_array().map(|a| a.iter().map(|t| s(&t["type"])).collect()).unwrap_or_default();
    out.line(format!("  triggers   {}", if triggers.is_empty() { "none".into() } else { triggers.join(", ") }))?;
    out.line(format!("  timers     {}", v["timers"]))?;
    let n = &v["network"];
    out.line(format!(
        "  network    code network {}, local fetch {}, messaging {}, MCP servers {}",
        n["code_network"], n["allow_local_fetch"], n["messaging"], n["mcp_servers"]
    ))?;
    out.line(format!("  autostart  {}", v["autostart"]))?;
    out.line("reviewed: the daemon will start this agent")
}

pub fn agents(out: &Out) -> anyhow::Result<()> {
    let dir = paths::fleet_dir();
    let (files, created) = ensure_fleet(&dir)?;
    if created && !out.json {
        out.line(format!("created the fleet folder {} with one example agent", dir.display()))?;
    }
    let rows: Vec<AgentRow> = files.into_iter().map(row).collect();
    if out.json {
        return out.json(&rows);
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let model = match (r.provider.as_str(), r.model.as_str()) {
                ("", _) => "(no provider)".to_string(),
                (p, "") => p.to_string(),
                (p, m) => format!("{p}/{m}"),
            };
            let rel = r.path.strip_prefix(&dir).unwrap_or(&r.path).display().to_string();
            match &r.error {
                Some(e) => vec![rel, "-".into(), "-".into(), "-".into(), e.clone()],
                None => vec![rel, r.name.clone(), r.handle.clone(), r.state.clone(), model],
            }
        })
        .collect();
    let n = table.len();
    out.line(format!("fleet: {} ({n} agent{})", dir.display(), if n == 1 { "" } else { "s" }))?;
    out.table(&["FILE", "NAME", "HANDLE", "STATE", "MODEL"], &table)
}
