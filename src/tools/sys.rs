//! `sys_get_meta`, `sys_set_meta`, `sys_delete_meta`, `sys_get_config`,
//! `sys_update_config`, `sys_set_state` (tools.md §6).

use serde_json::{Value, json};

use super::{Ctx, ToolOutput};
use crate::store::config::{self, ConfigRefusal, TOP_LEVEL, get_path, set_path};
use crate::store::meta::{MetaProtection, render_number};
use crate::store::{Caller, StoreError};

const HINT: &str = " Use sys_get_config to see the current configuration.";

pub fn get_meta(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    match input.get("key").and_then(Value::as_str) {
        Some(key) => match ctx.store.meta_get(key) {
            Ok(Some(m)) => ToolOutput::ok(m.value),
            Ok(None) => ToolOutput::ok(format!("Key \"{key}\" not found.")),
            Err(e) => e.into(),
        },
        None => match ctx.store.meta_list() {
            Ok(rows) if rows.is_empty() => ToolOutput::ok("No metadata entries."),
            Ok(rows) => {
                ToolOutput::ok(rows.iter().map(|m| format!("{}\t{}", m.key, m.value)).collect::<Vec<_>>().join("\n"))
            }
            Err(e) => e.into(),
        },
    }
}

pub fn set_meta(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let key = input["key"].as_str().unwrap_or_default();
    let protection = match input.get("protection").and_then(Value::as_str).map(MetaProtection::parse).transpose() {
        Ok(p) => p,
        Err(e) => return e.into(),
    };
    if let Some(delta) = input.get("delta").and_then(Value::as_f64) {
        return match ctx.store.meta_add(ctx.caller, key, delta, protection) {
            Ok(v) => ToolOutput::ok(ctx.marked(true, format!("OK: {key} = {v}"))),
            Err(e) => e.into(),
        };
    }
    let value = input["value"].as_str().unwrap_or_default();
    match ctx.store.meta_set(ctx.caller, key, value, protection) {
        Ok(()) => ToolOutput::ok(ctx.marked(true, "OK".into())),
        Err(e) => e.into(),
    }
}

pub fn delete_meta(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let key = input["key"].as_str().unwrap_or_default();
    match ctx.store.meta_delete(ctx.caller, key) {
        Ok(true) => ToolOutput::ok(ctx.marked(true, "OK".into())),
        Ok(false) => ToolOutput::ok(format!("Key \"{key}\" not found.")),
        Err(e) => e.into(),
    }
}

/// Whether a key names a secret (tools.md `sys_get_config`).
pub fn is_secret_key(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    if k == "credential_ref" {
        return false;
    }
    let contains = [
        "api_key",
        "api-key",
        "apikey",
        "access_token",
        "access-token",
        "auth_token",
        "auth-token",
        "secret",
        "password",
        "passwd",
        "private_key",
        "private-key",
        "credential",
        "bearer",
        "session_id",
        "session-id",
        "cookie",
    ];
    contains.iter().any(|c| k.contains(c)) || k == "token" || k == "authorization"
}

const REDACTED: &str = "__redacted__";

/// The config with secret values replaced by `__redacted__`.
pub fn redact(cfg: &Value) -> Value {
    let mut c = cfg.clone();
    if let Some(Value::Array(servers)) = c.pointer_mut("/mcp/servers") {
        for s in servers {
            for field in ["env", "headers"] {
                if let Some(Value::Object(m)) = s.get_mut(field) {
                    for v in m.values_mut() {
                        *v = Value::String(REDACTED.into());
                    }
                }
            }
        }
    }
    let redact_params = |list: Option<&mut Value>| {
        if let Some(Value::Array(params)) = list {
            for p in params {
                if p["key"].as_str().is_some_and(is_secret_key) {
                    p["value"] = Value::String(REDACTED.into());
                }
            }
        }
    };
    redact_params(c.pointer_mut("/model/params"));
    if let Some(Value::Object(pp)) = c.pointer_mut("/model/provider_params") {
        for (k, v) in pp.iter_mut() {
            if is_secret_key(k) {
                *v = Value::String(REDACTED.into());
            }
        }
    }
    if let Some(Value::Array(providers)) = c.get_mut("providers") {
        for p in providers {
            redact_params(p.get_mut("params"));
            if let Some(obj) = p.as_object_mut() {
                for (k, v) in obj.iter_mut() {
                    if is_secret_key(k) && !v.is_array() {
                        *v = Value::String(REDACTED.into());
                    }
                }
            }
        }
    }
    c
}

pub fn get_config(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let cfg = match ctx.store.config_value() {
        Ok(c) => c,
        Err(e) => return e.into(),
    };
    match input.get("section").and_then(Value::as_str).unwrap_or("config") {
        "limits" => ToolOutput::json(&json!({"limits": cfg.get("limits").cloned().unwrap_or(json!({}))})),
        "tools" => {
            let typed = config::AgentConfig::from_value(&cfg).unwrap_or_default();
            let (decls, _) = typed.effective_tools();
            let mut names: Vec<&str> = super::catalog().iter().map(|d| d.name).collect();
            for d in &decls {
                if !names.contains(&d.name.as_str()) {
                    names.push(&d.name);
                }
            }
            names.sort_unstable();
            let tools: Vec<Value> = names
                .iter()
                .map(|n| {
                    let d = decls.iter().find(|d| d.name == *n);
                    let def = super::def(n);
                    let flag = |f: fn(&config::ToolDeclaration) -> bool| d.map(f).unwrap_or(false);
                    json!({
                        "name": n,
                        "enabled": flag(config::ToolDeclaration::is_enabled),
                        "visible": flag(config::ToolDeclaration::is_visible),
                        "restricted": flag(config::ToolDeclaration::is_restricted),
                        "locked": flag(config::ToolDeclaration::is_locked),
                        "source": if n.starts_with("mcp_") { "mcp" } else { "builtin" },
                        "description": def.map(|d| d.description).unwrap_or(""),
                        "schema": def.map(|d| (d.schema)()).unwrap_or(Value::Null),
                        "restrictions": {"restricted": flag(config::ToolDeclaration::is_restricted), "locked": flag(config::ToolDeclaration::is_locked)},
                    })
                })
                .collect();
            ToolOutput::json(&json!({"tools": tools}))
        }
        "card" => ToolOutput::err("This agent is not served on the mesh, so it has no card yet."),
        "provider_status" => ToolOutput::ok("No rate-limit information is available for this provider."),
        _ => ToolOutput::json(&redact(&cfg)),
    }
}

/// Leaves that hold numbers, for string coercion (tools.md rule 1).
fn expects_number(leaf: &str) -> bool {
    const EXACT: &[&str] = &["temperature", "top_p", "level", "port", "chain_id", "max_rows", "max_events", "index"];
    const SUFFIX: &[&str] = &[
        "_ms",
        "_bytes",
        "_tokens",
        "_chars",
        "_count",
        "_rows",
        "_events",
        "_turns",
        "_threshold",
        "_budget",
        "_sec",
        "_size",
        "_runs",
        "_port",
        "_delay",
    ];
    EXACT.contains(&leaf) || SUFFIX.iter().any(|s| leaf.ends_with(s))
}

fn coerce(path: &str, v: Value) -> Value {
    let Value::String(s) = &v else { return v };
    let t = s.trim();
    if (t.starts_with('{') || t.starts_with('['))
        && let Ok(parsed) = serde_json::from_str::<Value>(t)
        && (parsed.is_object() || parsed.is_array())
    {
        return parsed;
    }
    match t {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    let leaf = path.rsplit('.').next().unwrap_or(path);
    if expects_number(leaf)
        && let Ok(n) = t.parse::<f64>()
    {
        return serde_json::from_str(&render_number(n)).unwrap_or(v);
    }
    v
}

fn fail(msg: impl std::fmt::Display) -> ToolOutput {
    let m = msg.to_string();
    if m.ends_with(HINT.trim_start()) { ToolOutput::err(m) } else { ToolOutput::err(format!("{m}{HINT}")) }
}

/// The effective `restricted`/`locked` of a declaration, current or default.
fn effective_flag(before: &Value, name: &str, flag: &str) -> bool {
    let current =
        before["tools"].as_array().into_iter().flatten().filter(|t| t["name"] == name).any(|t| t[flag] == true);
    let default =
        crate::store::defaults::DEFAULT_TOOLS.iter().any(|&(n, _, _, r)| n == name && flag == "restricted" && r);
    current || default
}

/// Declaration integrity (rule 10): unique names/ids, no lowering of
/// `restricted`/`locked`.
fn integrity(before: &Value, after: &Value) -> Result<(), String> {
    for (list, key) in [
        ("tools", "name"),
        ("serving.api", "path"),
        ("ws_connections", "id"),
        ("stream_bindings", "id"),
        ("umbilical_taps", "name"),
        ("mcp.servers", "name"),
    ] {
        let items = get_path(after, list).and_then(Value::as_array).cloned().unwrap_or_default();
        let mut seen = Vec::new();
        for it in &items {
            if let Some(id) = it.get(key).and_then(Value::as_str) {
                if seen.contains(&id) {
                    return Err(format!("Duplicate {key} \"{id}\" in {list}."));
                }
                seen.push(id);
            }
        }
    }
    let before_decl = |name: &str, flag: &str| {
        before["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["name"] == name)
            .map(|t| t[flag].clone())
            .collect::<Vec<_>>()
    };
    for t in after["tools"].as_array().into_iter().flatten() {
        let name = t["name"].as_str().unwrap_or("");
        for flag in ["restricted", "locked"] {
            // Only a write that sets `false` now is refused; an owner's
            // earlier "approve always" stays as it is.
            let already = before_decl(name, flag).contains(&Value::Bool(false));
            if t[flag] == false && !already && effective_flag(before, name, flag) {
                return Err(format!("Cannot set {flag}:false on \"{name}\": it is {flag}."));
            }
        }
    }
    Ok(())
}

/// WebSocket connections the agent adds or changes are its own
/// (`origin: "agent"`), so each connect passes the egress guard whatever
/// the entry says; the owner's entries it leaves as they were keep theirs.
fn mark_agent_connections(before: &Value, next: &mut Value) {
    let old = before["ws_connections"].as_array().cloned().unwrap_or_default();
    if let Some(list) = next.get_mut("ws_connections").and_then(Value::as_array_mut) {
        for e in list.iter_mut().filter(|e| e.is_object() && !old.contains(e)) {
            e["origin"] = json!("agent");
        }
    }
}

pub fn update_config(ctx: &mut Ctx<'_>, input: &Value) -> ToolOutput {
    let path = input["path"].as_str().unwrap_or_default();
    let action = input.get("action").and_then(Value::as_str).unwrap_or("set");
    let before = match ctx.store.config_value() {
        Ok(c) => c,
        Err(e) => return e.into(),
    };
    match config::agent_write_policy(&before, path) {
        Ok(()) => {}
        Err(ConfigRefusal::Hard(msg)) => return ToolOutput::err(msg),
        // Config locks yield only to the owner's approved override, never
        // to authorized code on its own.
        Err(ConfigRefusal::Lock(d)) if !matches!(ctx.caller, Caller::Agent { override_approved: true, .. }) => {
            return ToolOutput {
                content: d.description.clone(),
                is_error: true,
                denial: Some(d),
                ..Default::default()
            };
        }
        Err(ConfigRefusal::Lock(_)) => {}
    }
    let first = path.split('.').next().unwrap_or("");
    if action != "remove" && !TOP_LEVEL.contains(&first) {
        return fail(format!("Cannot create unknown section \"{first}\"."));
    }
    let mut next = before.clone();
    let done = match action {
        "remove" => {
            let Some(index) = input.get("index").and_then(Value::as_u64) else {
                return fail("action \"remove\" needs index.");
            };
            let Some(Value::Array(mut list)) = get_path(&next, path).cloned() else {
                return fail(format!("\"{path}\" is not a list."));
            };
            if index as usize >= list.len() {
                return fail(format!("index {index} is out of range for \"{path}\" ({} items).", list.len()));
            }
            list.remove(index as usize);
            if let Err(e) = set_path(&mut next, path, Value::Array(list)) {
                return fail(e);
            }
            format!("Removed index {index} from {path}.")
        }
        "append" => {
            let Some(value) = input.get("value").cloned() else { return fail("action \"append\" needs value.") };
            let value = coerce(path, value);
            let mut list = match get_path(&next, path) {
                Some(Value::Array(l)) => l.clone(),
                None => Vec::new(),
                Some(_) => return fail(format!("\"{path}\" is not a list.")),
            };
            list.push(value);
            if let Err(e) = set_path(&mut next, path, Value::Array(list)) {
                return fail(e);
            }
            format!("Appended to {path}.")
        }
        _ => {
            let Some(value) = input.get("value").cloned() else { return fail("action \"set\" needs value.") };
            let value = coerce(path, value);
            if path == "state" && !value.as_str().is_some_and(|s| ["active", "idle", "hibernate", "off"].contains(&s)) {
                return fail("state must be one of active, idle, hibernate, off.");
            }
            if let Err(e) = set_path(&mut next, path, value) {
                return fail(e);
            }
            format!("Updated {path}.")
        }
    };
    if let Err(e) = integrity(&before, &next) {
        return fail(e);
    }
    if !matches!(ctx.caller, Caller::Owner) {
        mark_agent_connections(&before, &mut next);
    }
    match ctx.store.config_replace(next) {
        Ok(()) => ToolOutput::ok(ctx.marked(true, done)),
        Err(StoreError::Invalid(m)) => fail(m),
        Err(e) => e.into(),
    }
}

pub fn set_state(input: &Value) -> ToolOutput {
    let state = input["state"].as_str().unwrap_or("idle").to_string();
    ToolOutput {
        content: json!({"target_state": state}).to_string(),
        end_turn: true,
        target_state: Some(state),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_the_agent_writes_are_its_own() {
        let before = json!({"ws_connections": [{"id": "owner", "url": "ws://127.0.0.1:9/"}]});
        let mut next = json!({"ws_connections": [
            {"id": "owner", "url": "ws://127.0.0.1:9/"},
            {"id": "mine", "url": "ws://127.0.0.1:8/", "origin": "owner"}
        ]});
        mark_agent_connections(&before, &mut next);
        assert_eq!(next["ws_connections"][0].get("origin"), None, "the owner's entry is left as it was");
        assert_eq!(next["ws_connections"][1]["origin"], "agent", "an entry the agent wrote is the agent's");
        let mut changed = json!({"ws_connections": [{"id": "owner", "url": "ws://10.0.0.1:9/"}]});
        mark_agent_connections(&before, &mut changed);
        assert_eq!(
            changed["ws_connections"][0]["origin"], "agent",
            "an owner's entry the agent changed is the agent's"
        );
    }

    #[test]
    fn coercion_rules() {
        assert_eq!(coerce("tools", json!("[1]")), json!([1]));
        assert_eq!(coerce("tools.fs_read.enabled", json!("true")), json!(true));
        assert_eq!(coerce("limits.max_active_turns", json!("20")), json!(20));
        assert_eq!(coerce("model.temperature", json!("0.5")), json!(0.5));
        assert_eq!(coerce("description", json!("20")), json!("20"));
    }

    #[test]
    fn secrets_are_redacted() {
        let cfg = json!({"mcp": {"servers": [{"name": "g", "env": {"TOKEN": "t"}, "headers": {"x": "y"}}]},
            "model": {"params": [{"key": "api_key", "value": "s"}, {"key": "top_k", "value": "3"}], "provider_params": {"secret": 1}}});
        let r = redact(&cfg);
        assert_eq!(r["mcp"]["servers"][0]["env"]["TOKEN"], REDACTED);
        assert_eq!(r["model"]["params"][0]["value"], REDACTED);
        assert_eq!(r["model"]["params"][1]["value"], "3");
        assert_eq!(r["model"]["provider_params"]["secret"], REDACTED);
        assert!(!is_secret_key("credential_ref"));
    }
}
