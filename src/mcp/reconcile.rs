//! Reconcile (tools.md §11): after every connect, the tools a server offers
//! are written into the agent's config so that the owner stays in charge.
//! A new tool lands enabled, visible and restricted (each call asks the
//! owner); a tool whose schema changed is disabled and hidden until it is
//! reviewed again; a tool the server dropped is hidden. The per-tool hash
//! is the reference's (`mcp_tool_hash`: the sorted-key JSON of `{name,
//! description, input_schema}`), so files move between adf and ADF Studio
//! without every tool looking changed.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A tool as a server lists it (`mcp.servers[].available_tools[]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerTool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default)]
    pub input_schema: Value,
}

/// The name a server's tool is declared under.
pub fn declared_name(server: &str, tool: &str) -> String {
    format!("mcp_{server}_{tool}")
}

/// The reference's hash of a tool: its sorted-key JSON text.
pub fn tool_hash(t: &ServerTool) -> String {
    let schema = if t.input_schema.is_null() { json!({}) } else { t.input_schema.clone() };
    crate::identity::canonical::stable_string(&json!({
        "name": t.name,
        "description": t.description.clone().unwrap_or_default(),
        "input_schema": schema,
    }))
}

/// What a reconcile changed, by declared tool name.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// Whether the config needs writing.
    pub changed: bool,
    pub new: Vec<String>,
    pub changed_tools: Vec<String>,
    pub removed: Vec<String>,
}

/// Bring `cfg` (the whole config document) in step with the tools `server`
/// offers now. Other servers' declarations are never touched, even when
/// their names share this server's prefix (`mcp_a_…` and `mcp_a_b_…`).
pub fn reconcile(cfg: &mut Value, server: &str, tools: &[ServerTool]) -> Outcome {
    let mut out = Outcome::default();
    let servers: Vec<String> = cfg
        .pointer("/mcp/servers")
        .and_then(Value::as_array)
        .map(|s| s.iter().filter_map(|s| s["name"].as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    if let Some(entry) = cfg
        .pointer_mut("/mcp/servers")
        .and_then(Value::as_array_mut)
        .and_then(|s| s.iter_mut().find(|s| s["name"] == server))
    {
        let listed = serde_json::to_value(tools).unwrap_or(Value::Null);
        let before = entry.get("available_tools").map(crate::identity::canonical::stable_string);
        if before.as_deref() != Some(crate::identity::canonical::stable_string(&listed).as_str()) {
            entry["available_tools"] = listed;
            out.changed = true;
        }
    }
    if !cfg["tools"].is_array() {
        cfg["tools"] = json!([]);
    }
    let Some(decls) = cfg["tools"].as_array_mut() else { return out };
    let index: HashMap<String, usize> =
        decls.iter().enumerate().filter_map(|(i, d)| d["name"].as_str().map(|n| (n.to_string(), i))).collect();
    let mut offered: Vec<String> = Vec::with_capacity(tools.len());
    for t in tools {
        let name = declared_name(server, &t.name);
        let hash = tool_hash(t);
        match index.get(&name) {
            None => {
                decls.push(json!({"name": name, "enabled": true, "visible": true, "restricted": true,
                                  "mcp_tool_hash": hash, "mcp_tool_status": "new"}));
                out.new.push(name.clone());
                out.changed = true;
            }
            Some(&i) => {
                let d = &mut decls[i];
                let old = d["mcp_tool_hash"].as_str().map(str::to_string);
                if old.as_deref().is_some_and(|h| h != hash) {
                    set(d, false, false, &hash, "changed");
                    out.changed_tools.push(name.clone());
                    out.changed = true;
                } else if d["mcp_tool_status"] == "removed" {
                    set(d, true, true, &hash, "new");
                    out.new.push(name.clone());
                    out.changed = true;
                } else if old.is_none() {
                    d["mcp_tool_hash"] = json!(hash);
                    out.changed = true;
                }
            }
        }
        offered.push(name);
    }
    let prefix = format!("mcp_{server}_");
    // A longer server name sharing the prefix owns its own tools.
    let others: Vec<String> = servers.iter().filter(|s| s.as_str() != server).map(|s| format!("mcp_{s}_")).collect();
    for d in decls.iter_mut() {
        let Some(name) = d["name"].as_str() else { continue };
        if !name.starts_with(&prefix)
            || offered.iter().any(|o| o == name)
            || others.iter().any(|o| o.len() > prefix.len() && name.starts_with(o.as_str()))
        {
            continue;
        }
        if d["mcp_tool_status"] == "removed" && d["enabled"] == false && d["visible"] == false {
            continue;
        }
        let name = name.to_string();
        d["enabled"] = json!(false);
        d["visible"] = json!(false);
        d["mcp_tool_status"] = json!("removed");
        out.removed.push(name);
        out.changed = true;
    }
    out
}

fn set(d: &mut Value, enabled: bool, visible: bool, hash: &str, status: &str) {
    d["enabled"] = json!(enabled);
    d["visible"] = json!(visible);
    d["restricted"] = json!(true);
    d["mcp_tool_hash"] = json!(hash);
    d["mcp_tool_status"] = json!(status);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tool(name: &str, desc: &str, schema: Value) -> ServerTool {
        ServerTool { name: name.into(), description: Some(desc.into()), input_schema: schema }
    }

    fn cfg(servers: &[&str]) -> Value {
        json!({"tools": [{"name": "fs_read", "enabled": true, "visible": true}],
               "mcp": {"servers": servers.iter().map(|s| json!({"name": s, "transport": "stdio"})).collect::<Vec<_>>()}})
    }

    fn decl<'a>(c: &'a Value, name: &str) -> &'a Value {
        c["tools"].as_array().unwrap().iter().find(|d| d["name"] == name).unwrap()
    }

    /// The hash is the reference's text: keys sorted, numbers as
    /// JavaScript prints them (`1.0` is `1`), a missing description empty.
    #[test]
    fn hash_is_the_references_stable_text() {
        let schema: Value =
            serde_json::from_str(r#"{"type":"object","properties":{"b":{"minimum":1.0},"a":{}}}"#).unwrap();
        let t = ServerTool { name: "echo".into(), description: None, input_schema: schema };
        assert_eq!(
            tool_hash(&t),
            r#"{"description":"","input_schema":{"properties":{"a":{},"b":{"minimum":1}},"type":"object"},"name":"echo"}"#
        );
        let t = ServerTool { name: "x".into(), description: Some("d".into()), input_schema: Value::Null };
        assert_eq!(tool_hash(&t), r#"{"description":"d","input_schema":{},"name":"x"}"#);
    }

    #[test]
    fn new_changed_removed_and_back() {
        let mut c = cfg(&["ev"]);
        let a = tool("echo", "Echo", json!({"type": "object"}));
        let b = tool("add", "Add", json!({"type": "object"}));
        let o = reconcile(&mut c, "ev", &[a.clone(), b.clone()]);
        assert_eq!(o.new, ["mcp_ev_echo", "mcp_ev_add"]);
        let d = decl(&c, "mcp_ev_echo");
        assert_eq!(
            (d["enabled"].clone(), d["visible"].clone(), d["restricted"].clone()),
            (json!(true), json!(true), json!(true))
        );
        assert_eq!(d["mcp_tool_status"], "new");
        assert_eq!(c["mcp"]["servers"][0]["available_tools"][1]["name"], "add");
        // The owner allows one; nothing else changes on a reconnect.
        c["tools"][1]["restricted"] = json!(false);
        let o = reconcile(&mut c, "ev", &[a.clone(), b.clone()]);
        assert!(!o.changed, "{o:?}");
        assert_eq!(decl(&c, "mcp_ev_echo")["restricted"], false, "the owner's choice is kept");
        // A schema change disables and hides the tool until it is reviewed.
        let a2 = tool("echo", "Echo", json!({"type": "object", "properties": {"x": {}}}));
        let o = reconcile(&mut c, "ev", std::slice::from_ref(&a2));
        assert_eq!(
            (o.changed_tools.as_slice(), o.removed.as_slice()),
            (&["mcp_ev_echo".to_string()][..], &["mcp_ev_add".to_string()][..])
        );
        let d = decl(&c, "mcp_ev_echo");
        assert_eq!(
            (d["enabled"].clone(), d["visible"].clone(), d["restricted"].clone()),
            (json!(false), json!(false), json!(true))
        );
        assert_eq!(d["mcp_tool_status"], "changed");
        assert_eq!(decl(&c, "mcp_ev_add")["mcp_tool_status"], "removed");
        assert_eq!(decl(&c, "mcp_ev_add")["enabled"], false);
        // A removed tool that comes back is new again (restricted).
        let o = reconcile(&mut c, "ev", &[a2, b]);
        assert_eq!(o.new, ["mcp_ev_add"]);
        assert_eq!(decl(&c, "mcp_ev_add")["restricted"], true);
        assert_eq!(decl(&c, "fs_read")["enabled"], true, "built-in tools are never touched");
    }

    #[test]
    fn a_declaration_without_a_hash_keeps_its_flags() {
        let mut c = cfg(&["ev"]);
        c["tools"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "mcp_ev_echo", "enabled": true, "visible": true, "restricted": false}));
        let o = reconcile(&mut c, "ev", &[tool("echo", "Echo", json!({}))]);
        assert!(o.changed && o.new.is_empty() && o.changed_tools.is_empty());
        let d = decl(&c, "mcp_ev_echo");
        assert_eq!(d["restricted"], false);
        assert!(d["mcp_tool_hash"].as_str().unwrap().contains("\"name\":\"echo\""));
    }

    #[test]
    fn a_longer_server_name_keeps_its_tools() {
        let mut c = cfg(&["a", "a_b"]);
        reconcile(&mut c, "a_b", &[tool("x", "", json!({}))]);
        let o = reconcile(&mut c, "a", &[tool("y", "", json!({}))]);
        assert!(o.removed.is_empty(), "{o:?}");
        assert_eq!(decl(&c, "mcp_a_b_x")["enabled"], true);
    }

    proptest! {
        /// Reconciling the same list twice changes nothing the second time,
        /// whatever the list.
        #[test]
        fn reconcile_is_idempotent(names in proptest::collection::hash_set("[a-z]{1,6}", 0..12), desc in ".{0,12}") {
            let tools: Vec<ServerTool> = names.iter().map(|n| tool(n, &desc, json!({"type": "object"}))).collect();
            let mut c = cfg(&["s"]);
            reconcile(&mut c, "s", &tools);
            let snapshot = c.clone();
            let o = reconcile(&mut c, "s", &tools);
            prop_assert!(!o.changed);
            prop_assert_eq!(c, snapshot);
        }
    }
}
