//! What the owner does to an agent's MCP servers, as pure changes on the
//! config document, shared by `adf mcp …`, the daemon's routes and the app:
//! the entry an added server gets (its env and header values kept out of
//! it, to be sealed), a tool's flags, and the view of servers with their
//! status and tools.

use serde_json::{Value, json};

use super::creds;
use super::servers::ServerStatus;

/// How the owner asks for a server.
#[derive(Debug, Clone, Default)]
pub struct AddServer {
    pub name: String,
    /// A stdio command and its arguments …
    pub command: Vec<String>,
    /// … or a Streamable HTTP endpoint.
    pub url: Option<String>,
    /// Environment values for the process (sealed, never in the config).
    pub env: Vec<(String, String)>,
    /// Request headers (sealed, never in the config).
    pub headers: Vec<(String, String)>,
    /// A finished OAuth sign-in (`oauth::seal_text`), sealed as
    /// `mcp:<server>:oauth`.
    pub oauth: Option<String>,
}

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// The config entry for `add` and the sealed values it needs, as
/// `(purpose, value)`. Env keys become `env_keys`; each header becomes a
/// `header_env` entry naming a sealed key (`Authorization` →
/// `AUTHORIZATION`).
pub fn entry(add: &AddServer) -> Result<(Value, Vec<(String, String)>), String> {
    if !valid_name(&add.name) {
        return Err(format!("server name {:?}: use lowercase letters, digits, _ and - (at most 64)", add.name));
    }
    let mut e = match (&add.url, add.command.split_first()) {
        (Some(u), None) => json!({"name": add.name, "transport": "http", "url": u, "source": format!("http:{u}")}),
        (None, Some((c, args))) => {
            json!({"name": add.name, "transport": "stdio", "command": c, "args": args, "source": "custom"})
        }
        (Some(_), Some(_)) => return Err("give either a URL or a command, not both".into()),
        (None, None) => return Err("give a command (stdio) or a URL (Streamable HTTP)".into()),
    };
    if add.url.is_none() && !add.headers.is_empty() {
        return Err("headers are for an HTTP server (--url)".into());
    }
    let mut keys: Vec<String> = Vec::new();
    let mut sealed = Vec::new();
    for (k, v) in &add.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(format!("environment variable name {k:?} is not valid"));
        }
        keys.retain(|x| x != k);
        keys.push(k.clone());
        sealed.retain(|(p, _): &(String, String)| *p != creds::purpose(&add.name, k));
        sealed.push((creds::purpose(&add.name, k), v.clone()));
    }
    let mut header_env = Vec::new();
    for (h, v) in &add.headers {
        reqwest::header::HeaderName::from_bytes(h.as_bytes()).map_err(|e| format!("header {h:?}: {e}"))?;
        reqwest::header::HeaderValue::from_str(v).map_err(|e| format!("header {h:?}: {e}"))?;
        let key = creds::header_key(h);
        if !keys.contains(&key) {
            keys.push(key.clone());
        }
        sealed.push((creds::purpose(&add.name, &key), v.clone()));
        header_env.push(json!({"header": h, "env": key, "required": true}));
    }
    if !keys.is_empty() {
        e["env_keys"] = json!(keys);
        e["env_schema"] = Value::Array(keys.iter().map(|k| json!({"key": k, "scope": "agent"})).collect());
    }
    if !header_env.is_empty() {
        e["header_env"] = Value::Array(header_env);
    }
    if let Some(o) = &add.oauth {
        if add.url.is_none() {
            return Err("OAuth is for an HTTP server (--url)".into());
        }
        e["auth"] = json!("oauth");
        sealed.push((creds::purpose(&add.name, super::oauth::KEY), o.clone()));
    }
    Ok((e, sealed))
}

/// Which flags to change on one tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct Flags {
    pub enabled: Option<bool>,
    pub visible: Option<bool>,
    pub restricted: Option<bool>,
}

impl Flags {
    pub fn from_json(v: &Value) -> Result<Flags, String> {
        let get = |k: &str| -> Result<Option<bool>, String> {
            match &v[k] {
                Value::Null => Ok(None),
                Value::Bool(b) => Ok(Some(*b)),
                other => Err(format!("`{k}` must be true or false, not {other}")),
            }
        };
        let f = Flags { enabled: get("enabled")?, visible: get("visible")?, restricted: get("restricted")? };
        if f.enabled.is_none() && f.visible.is_none() && f.restricted.is_none() {
            return Err("say what to change: enabled, visible or restricted".into());
        }
        Ok(f)
    }
}

/// Change one MCP tool's flags; a reviewed tool is no longer `new` or
/// `changed`. The declaration as it is now.
pub fn set_tool_flags(cfg: &mut Value, server: &str, tool: &str, f: Flags) -> Result<Value, String> {
    let declared = super::reconcile::declared_name(server, tool);
    let d = cfg["tools"]
        .as_array_mut()
        .and_then(|a| a.iter_mut().find(|d| d["name"] == declared.as_str()))
        .ok_or_else(|| format!("no MCP tool {tool:?} of server {server:?}"))?;
    if d["locked"] == true {
        return Err(format!("{declared} is locked"));
    }
    for (k, v) in [("enabled", f.enabled), ("visible", f.visible), ("restricted", f.restricted)] {
        if let Some(v) = v {
            d[k] = json!(v);
        }
    }
    if let Some(o) = d.as_object_mut()
        && o.get("mcp_tool_status").is_some_and(|s| s != "removed")
    {
        o.remove("mcp_tool_status");
    }
    Ok(d.clone())
}

/// Servers with their status, target and tools (flags and review status),
/// in config order. Env and header values are never part of it, only the
/// names of the keys.
pub fn view(cfg: &Value, statuses: &[ServerStatus]) -> Vec<Value> {
    let servers = cfg.pointer("/mcp/servers").and_then(Value::as_array).cloned().unwrap_or_default();
    servers
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
                           "locked": d["locked"].as_bool().unwrap_or(false),
                           "status": d["mcp_tool_status"]})
                })
                .collect();
            let target = match s["command"].as_str() {
                Some(c) => {
                    let args: Vec<&str> =
                        s["args"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                    Some(format!("{c} {}", args.join(" ")).trim().to_string())
                }
                None => s["url"]
                    .as_str()
                    .map(str::to_string)
                    .or_else(|| s["npm_package"].as_str().map(|p| format!("npx -y {p}"))),
            };
            let status = statuses.iter().find(|st| st.name == name);
            let mut out = json!({"name": name, "transport": s["transport"].as_str().unwrap_or("stdio"),
                "target": target, "credentials": creds::env_keys(&s), "tools": tools});
            let o = out.as_object_mut().expect("an object");
            match status.map(serde_json::to_value) {
                Some(Ok(Value::Object(st))) => {
                    for (k, v) in st {
                        if k != "name" && k != "tools" {
                            o.insert(k, v);
                        }
                    }
                    o.insert("tools_listed".into(), json!(status.map(|s| s.tools)));
                }
                _ => {
                    o.insert("state".into(), json!("idle"));
                }
            }
            out
        })
        .collect()
}

/// Parse `K=V` pairs (CLI flags).
pub fn pairs(items: &[String], what: &str) -> Result<Vec<(String, String)>, String> {
    items
        .iter()
        .map(|i| {
            i.split_once('=')
                .filter(|(k, _)| !k.is_empty())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| format!("{what} {i:?} is not K=V"))
        })
        .collect()
}

/// `{"K": "V"}` of a JSON body as pairs.
pub fn object_pairs(v: &Value, what: &str) -> Result<Vec<(String, String)>, String> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(format!("{what} {k:?} must be a string, not {other}")),
            })
            .collect(),
        other => Err(format!("{what} must be an object of strings, not {other}")),
    }
}

/// The `mcp.servers[]` entry named `name`.
pub fn server_entry<'a>(cfg: &'a Value, name: &str) -> Option<&'a Value> {
    cfg.pointer("/mcp/servers")?.as_array()?.iter().find(|s| s["name"] == name)
}

/// Append a server entry, creating `mcp.servers` as needed.
pub fn push_server(cfg: &mut Value, entry: Value) {
    if !cfg["mcp"].is_object() {
        cfg["mcp"] = json!({"servers": []});
    }
    if !cfg["mcp"]["servers"].is_array() {
        cfg["mcp"]["servers"] = json!([]);
    }
    if let Some(a) = cfg["mcp"]["servers"].as_array_mut() {
        a.push(entry);
    }
}

/// Remove a server and its `mcp_<name>_*` declarations (only its own: a
/// longer server name sharing the prefix keeps its tools). The number of
/// declarations removed.
pub fn remove_server(cfg: &mut Value, name: &str) -> usize {
    let others: Vec<String> = cfg
        .pointer("/mcp/servers")
        .and_then(Value::as_array)
        .map(|s| s.iter().filter_map(|s| s["name"].as_str()).filter(|n| *n != name).map(str::to_string).collect())
        .unwrap_or_default();
    if let Some(servers) = cfg.pointer_mut("/mcp/servers").and_then(Value::as_array_mut) {
        servers.retain(|s| s["name"] != name);
    }
    let prefix = format!("mcp_{name}_");
    let mine = |t: &str| {
        t.starts_with(&prefix) && !others.iter().any(|o| o.len() > name.len() && t.starts_with(&format!("mcp_{o}_")))
    };
    let Some(tools) = cfg["tools"].as_array_mut() else { return 0 };
    let before = tools.len();
    tools.retain(|d| !d["name"].as_str().is_some_and(mine));
    before - tools.len()
}

/// A server name from a package or URL (the reference's rule):
/// `@modelcontextprotocol/server-github` → `github`.
pub fn derive_name(package: &str, kind: &str) -> String {
    let lower_clean = |s: &str| -> String {
        s.to_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
    };
    if kind == "custom" {
        return lower_clean(package);
    }
    let base = if kind == "http" {
        url::Url::parse(package).ok().and_then(|u| u.host_str().map(str::to_string)).unwrap_or(package.to_string())
    } else {
        package.rsplit('/').next().unwrap_or(package).to_string()
    };
    let mut b = base.as_str();
    for p in ["mcp-server-", "server-", "mcp-"] {
        if let Some(r) = b.strip_prefix(p) {
            b = r;
            break;
        }
    }
    for sfx in ["-mcp", "-server"] {
        if let Some(r) = b.strip_suffix(sfx) {
            b = r;
            break;
        }
    }
    lower_clean(b)
}

/// The `mcp.servers[]` entry `mcp_install` saves for its input. Secret
/// values never land here: `env` values are sealed by the caller and only
/// their keys are named; a secret-looking static header is refused.
pub fn install_entry(input: &Value) -> Result<Value, String> {
    let kind = input["type"].as_str().unwrap_or("npm");
    let package = input["package"].as_str().unwrap_or("").trim();
    let strings = |k: &str| -> Vec<String> {
        input[k].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect()
    };
    let url = input["url"].as_str().unwrap_or("").trim();
    let source_of = match kind {
        "npm" | "pypi" | "custom" if package.is_empty() => return Err(format!("a {kind} server needs `package`")),
        "http" if url.is_empty() => return Err("an http server needs `url`".into()),
        "npm" | "pypi" | "custom" => package,
        "http" => url,
        other => return Err(format!("type {other:?} is not npm, pypi, custom or http")),
    };
    let name = match input["name"].as_str().map(str::trim).filter(|n| !n.is_empty()) {
        Some(n) => n.to_string(),
        None => derive_name(source_of, kind),
    };
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-') {
        return Err(format!("server name {name:?}: use lowercase letters, digits, _ and -"));
    }
    let mut e = json!({"name": name, "transport": if kind == "http" { "http" } else { "stdio" }});
    let args = strings("args");
    match kind {
        "npm" => {
            e["npm_package"] = json!(package);
            e["source"] = json!(format!("npm:{package}"));
            if !args.is_empty() {
                e["args"] = json!(args);
            }
        }
        "pypi" => {
            e["pypi_package"] = json!(package);
            e["source"] = json!(format!("uvx:{package}"));
            e["command"] = json!("uvx");
            e["args"] = json!(if args.is_empty() { vec![package.to_string()] } else { args });
        }
        "custom" => {
            e["command"] = json!(package);
            e["args"] = json!(args);
            e["source"] = json!("custom");
        }
        _ => {
            let parsed = url::Url::parse(url).map_err(|err| format!("url {url:?}: {err}"))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(format!("url {url:?} is not http(s)"));
            }
            e["url"] = json!(url);
            e["source"] = json!(format!("http:{url}"));
            let headers = input["headers"].as_object().cloned().unwrap_or_default();
            let secret: Vec<&String> = headers.keys().filter(|h| creds::is_sensitive_header(h)).collect();
            if !secret.is_empty() {
                return Err(format!(
                    "Secret-bearing HTTP headers must use header_env or bearer_token_env_var: {}",
                    secret.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                ));
            }
            if !headers.is_empty() {
                e["headers"] = Value::Object(headers);
            }
            if input["header_env"].is_array() {
                e["header_env"] = input["header_env"].clone();
            }
            if let Some(b) = input["bearer_token_env_var"].as_str() {
                e["bearer_token_env_var"] = json!(b);
            }
        }
    }
    let mut keys = strings("env_keys");
    let named = input["header_env"].as_array().into_iter().flatten().filter_map(|h| h["env"].as_str());
    let sealed = input["env"].as_object().into_iter().flat_map(|o| o.keys().map(String::as_str));
    for k in named.chain(input["bearer_token_env_var"].as_str()).chain(sealed) {
        if !keys.iter().any(|x| x == k) {
            keys.push(k.to_string());
        }
    }
    if !keys.is_empty() {
        e["env_keys"] = json!(keys);
        e["env_schema"] = Value::Array(keys.iter().map(|k| json!({"key": k, "scope": "agent"})).collect());
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_reach_the_entry() {
        let add = AddServer {
            name: "api".into(),
            url: Some("https://example.test/mcp".into()),
            env: vec![("TOKEN".into(), "s3cret".into())],
            headers: vec![("Authorization".into(), "Bearer hidden".into())],
            ..Default::default()
        };
        let (e, sealed) = entry(&add).unwrap();
        let text = e.to_string();
        assert!(!text.contains("s3cret") && !text.contains("hidden"), "{text}");
        assert_eq!(e["env_keys"], json!(["TOKEN", "AUTHORIZATION"]));
        assert_eq!(e["header_env"], json!([{"header": "Authorization", "env": "AUTHORIZATION", "required": true}]));
        assert_eq!(
            sealed,
            [("mcp:api:TOKEN".into(), "s3cret".into()), ("mcp:api:AUTHORIZATION".into(), "Bearer hidden".into())]
                as [(String, String); 2]
        );
        // The entry, resolved with those sealed values, sends the header.
        let r = creds::resolve(&e, |p| sealed.iter().find(|(k, _)| k == p).map(|(_, v)| v.clone()));
        assert_eq!(r.headers, [("Authorization".to_string(), "Bearer hidden".to_string())]);
    }

    #[test]
    fn bad_adds_are_refused() {
        let stdio = |name: &str| AddServer { name: name.into(), command: vec!["srv".into()], ..Default::default() };
        assert!(entry(&stdio("Bad Name")).unwrap_err().contains("lowercase"));
        let mut a = stdio("a");
        a.headers = vec![("X".into(), "1".into())];
        assert!(entry(&a).unwrap_err().contains("HTTP"));
        let mut b = AddServer { name: "b".into(), url: Some("http://x".into()), ..Default::default() };
        b.headers = vec![("Bad Header".into(), "1".into())];
        assert!(entry(&b).unwrap_err().contains("Bad Header"));
        assert!(pairs(&["=v".into()], "--env").is_err());
        assert!(object_pairs(&json!({"K": 1}), "env").unwrap_err().contains("string"));
    }

    #[test]
    fn flags_and_review_status() {
        let mut cfg = json!({"tools": [{"name": "mcp_s_t", "enabled": false, "visible": true, "restricted": true,
                                        "mcp_tool_status": "changed"},
                                       {"name": "mcp_s_l", "locked": true}]});
        let f = Flags::from_json(&json!({"enabled": true, "restricted": false})).unwrap();
        let d = set_tool_flags(&mut cfg, "s", "t", f).unwrap();
        assert_eq!(d, json!({"name": "mcp_s_t", "enabled": true, "visible": true, "restricted": false}));
        assert!(set_tool_flags(&mut cfg, "s", "l", f).unwrap_err().contains("locked"));
        assert!(set_tool_flags(&mut cfg, "s", "nope", f).is_err());
        assert!(Flags::from_json(&json!({})).is_err());
        assert!(Flags::from_json(&json!({"enabled": "yes"})).is_err());
    }
}
