//! Reviewing an agent file before it runs unattended. A file can carry
//! tools, triggers, timers and network reach that act without anyone
//! watching, so the daemon only starts files the owner created on this
//! install or reviewed (`adf review PATH`): their ids are kept as
//! `reviewedAgents` in `settings.json`.

use std::path::Path;

use serde_json::{Value, json};

use crate::providers::accounts;
use crate::store::Store;

const KEY: &str = "reviewedAgents";

/// The ids the owner created or reviewed (read once per caller: the
/// daemon checks a whole fleet against it).
pub fn reviewed() -> std::collections::HashSet<String> {
    accounts::load()
        .ok()
        .and_then(|s| {
            s.extra
                .get(KEY)
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect())
        })
        .unwrap_or_default()
}

/// Record a review (or the owner's own creation).
pub fn mark_reviewed(id: &str) -> Result<(), String> {
    let mut s = accounts::load()?;
    let list = s.extra.entry(KEY.to_string()).or_insert_with(|| json!([]));
    if !list.is_array() {
        *list = json!([]);
    }
    if let Some(a) = list.as_array_mut()
        && !a.iter().any(|v| v == id)
    {
        a.push(json!(id));
    }
    accounts::save(&s)
}

/// What a file would do unattended: provider and model, enabled tools
/// (restricted ones marked), triggers, timers, network reach.
pub fn summary(path: &Path) -> Result<Value, String> {
    let store = Store::open_read_only(path).map_err(|e| e.to_string())?;
    let cfg = store.config_value().map_err(|e| e.to_string())?;
    let typed = crate::store::config::AgentConfig::from_value(&cfg).unwrap_or_default();
    let (tools, _) = typed.effective_tools();
    let enabled: Vec<Value> = tools
        .iter()
        .filter(|t| t.is_enabled())
        .map(|t| json!({"name": t.name, "restricted": t.is_restricted()}))
        .collect();
    let triggers: Vec<Value> = cfg
        .get("triggers")
        .and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .filter(|(_, v)| v.get("enabled").and_then(Value::as_bool).unwrap_or(true))
                .map(|(k, v)| json!({"type": k, "targets": v.get("targets").cloned().unwrap_or(Value::Null)}))
                .collect()
        })
        .unwrap_or_default();
    let timers = store.timer_list(false).map_err(|e| e.to_string())?;
    let id = cfg["id"].as_str().unwrap_or("").to_string();
    Ok(json!({
        "agentId": id,
        "filePath": path,
        "name": cfg["name"],
        "reviewed": reviewed().contains(&id),
        "provider": cfg.pointer("/model/provider"),
        "model": cfg.pointer("/model/model_id"),
        "autostart": cfg["autostart"].as_bool().unwrap_or(false),
        "tools": enabled,
        "triggers": triggers,
        "timers": timers.len(),
        "network": {
            "code_network": cfg.pointer("/code_execution/network").and_then(Value::as_bool).unwrap_or(false),
            "allow_local_fetch": cfg.pointer("/security/allow_local_fetch").and_then(Value::as_bool).unwrap_or(false),
            "messaging": cfg.pointer("/messaging/receive").and_then(Value::as_bool).unwrap_or(false),
            "mcp_servers": cfg.pointer("/mcp/servers").and_then(Value::as_array).map(|a| a.len()).unwrap_or(0),
        },
    }))
}
