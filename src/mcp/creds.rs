//! MCP credentials (format.md §7.2, the reference's rules): a server's
//! secret environment values and request headers live sealed in the
//! agent's credentials envelope as `mcp:<namespace>:<KEY>`, never in the
//! config. The config only names them (`env_keys`, `env_schema` with scope
//! `agent`, `header_env`, `bearer_token_env_var`). The namespace is the
//! server's npm or PyPI package when it has one, else its name, and a key
//! missing under the package is looked up under the name (as the reference
//! does). Values are resolved only when the process is spawned or the
//! request is made.

use serde_json::Value;

/// The purpose of one sealed value.
pub fn purpose(namespace: &str, key: &str) -> String {
    format!("mcp:{namespace}:{key}")
}

/// The server's credential namespace: its package, else its name.
pub fn namespace(server: &Value) -> String {
    server["npm_package"]
        .as_str()
        .or(server["pypi_package"].as_str())
        .or(server["name"].as_str())
        .unwrap_or("")
        .to_string()
}

/// Keys the server sources from the keystore: `env_schema` entries of
/// scope `agent`, then the legacy `env_keys`, each once.
pub fn env_keys(server: &Value) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    let schema = server["env_schema"].as_array().into_iter().flatten();
    let from_schema = schema.filter(|e| e["scope"] == "agent").filter_map(|e| e["key"].as_str());
    let legacy = server["env_keys"].as_array().into_iter().flatten().filter_map(Value::as_str);
    for k in from_schema.chain(legacy) {
        if !k.is_empty() && !keys.iter().any(|x| x == k) {
            keys.push(k.to_string());
        }
    }
    keys
}

/// A header whose value is a secret and so may not be stored in the
/// config as a static header (the reference's list).
pub fn is_sensitive_header(header: &str) -> bool {
    let h = header.trim().to_ascii_lowercase();
    matches!(
        h.as_str(),
        "authorization"
            | "proxy-authorization"
            | "x-api-key"
            | "api-key"
            | "apikey"
            | "x-auth-token"
            | "x-access-token"
    ) || h.contains("token")
        || h.contains("secret")
        || h.contains("credential")
}

/// The key a header's secret is kept under: `Authorization` →
/// `AUTHORIZATION`, `X-Api-Key` → `X_API_KEY`.
pub fn header_key(header: &str) -> String {
    header.trim().chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
}

/// Remove a server's sealed values (under its namespace and its name):
/// how many went.
pub fn remove_sealed(store: &mut crate::store::Store, server: &Value) -> crate::store::Result<usize> {
    let roots: Vec<String> = [namespace(server), server["name"].as_str().unwrap_or("").to_string()]
        .into_iter()
        .filter(|n| !n.is_empty())
        .map(|n| format!("mcp:{n}:"))
        .collect();
    let doomed: Vec<String> = store
        .secrets()?
        .into_iter()
        .map(|r| r.purpose)
        .filter(|p| roots.iter().any(|r| p.starts_with(r.as_str())))
        .collect();
    for p in &doomed {
        store.secret_rm(p)?;
    }
    Ok(doomed.len())
}

/// What a server is given at spawn or request time.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Resolved {
    pub env: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    /// Keys the config names that have no value anywhere.
    pub missing: Vec<String>,
}

/// Resolve a server's environment and headers. `secret` reads one purpose
/// from the credentials envelope.
pub fn resolve(server: &Value, secret: impl Fn(&str) -> Option<String>) -> Resolved {
    let mut out = Resolved::default();
    // Plain `env` values in the config (older files) come first; sealed
    // values win over them.
    if let Some(o) = server["env"].as_object() {
        for (k, v) in o {
            if let Some(v) = v.as_str() {
                out.env.push((k.clone(), v.to_string()));
            }
        }
    }
    let ns = namespace(server);
    let name = server["name"].as_str().unwrap_or("");
    let put = |env: &mut Vec<(String, String)>, k: &str, v: String| {
        env.retain(|(x, _)| x != k);
        env.push((k.to_string(), v));
    };
    for key in env_keys(server) {
        let v = secret(&purpose(&ns, &key)).or_else(|| (ns != name).then(|| secret(&purpose(name, &key))).flatten());
        match v {
            Some(v) => put(&mut out.env, &key, v),
            None if !out.env.iter().any(|(k, _)| *k == key) => out.missing.push(key),
            None => {}
        }
    }
    let lookup = |k: &str| out.env.iter().find(|(x, _)| x == k).map(|(_, v)| v.clone());
    if let Some(o) = server["headers"].as_object() {
        for (k, v) in o {
            if let Some(v) = v.as_str() {
                out.headers.push((k.clone(), v.to_string()));
            }
        }
    }
    let mut headers = std::mem::take(&mut out.headers);
    if let Some(var) = server["bearer_token_env_var"].as_str()
        && let Some(token) = lookup(var)
    {
        headers.retain(|(k, _)| !k.eq_ignore_ascii_case("authorization"));
        headers.push(("Authorization".into(), format!("Bearer {token}")));
    }
    for e in server["header_env"].as_array().into_iter().flatten() {
        let (Some(h), Some(var)) = (e["header"].as_str(), e["env"].as_str()) else { continue };
        match lookup(var) {
            Some(v) => {
                headers.retain(|(k, _)| !k.eq_ignore_ascii_case(h));
                headers.push((h.to_string(), v));
            }
            None if e["required"] == true && !out.missing.iter().any(|m| m == var) => out.missing.push(var.to_string()),
            None => {}
        }
    }
    out.headers = headers;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vault(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |p| m.iter().find(|(k, _)| k == p).map(|(_, v)| v.clone())
    }

    #[test]
    fn env_keys_resolve_under_the_package_then_the_name() {
        let s = json!({"name": "gh", "npm_package": "@x/gh", "env_keys": ["TOKEN", "OTHER", "NONE"],
                       "env_schema": [{"key": "TOKEN", "scope": "agent"}, {"key": "APP", "scope": "app"}],
                       "env": {"PLAIN": "p", "OTHER": "old"}});
        let r = resolve(&s, vault(&[("mcp:@x/gh:TOKEN", "t1"), ("mcp:gh:OTHER", "o2")]));
        assert_eq!(
            r.env,
            [("PLAIN".into(), "p".into()), ("TOKEN".into(), "t1".into()), ("OTHER".into(), "o2".into())]
                as [(String, String); 3]
        );
        assert_eq!(r.missing, ["NONE"]);
        assert_eq!(env_keys(&s), ["TOKEN", "OTHER", "NONE"], "app-scoped keys are not the agent's");
    }

    #[test]
    fn headers_come_from_sealed_values_never_the_config() {
        let s = json!({"name": "api", "headers": {"X-Team": "a", "Authorization": "stale"},
                       "env_keys": ["AUTHORIZATION", "K"], "bearer_token_env_var": "K",
                       "header_env": [{"header": "X-Api-Key", "env": "AUTHORIZATION"},
                                      {"header": "X-Need", "env": "GONE", "required": true}]});
        let r = resolve(&s, vault(&[("mcp:api:AUTHORIZATION", "sek"), ("mcp:api:K", "tok")]));
        assert_eq!(
            r.headers,
            [
                ("X-Team".into(), "a".into()),
                ("Authorization".into(), "Bearer tok".into()),
                ("X-Api-Key".into(), "sek".into())
            ] as [(String, String); 3]
        );
        assert_eq!(r.missing, ["GONE"]);
    }

    #[test]
    fn sensitive_headers_and_their_keys() {
        for h in ["Authorization", "x-api-key", "X-GitHub-Token", "Client-Secret", "X-Credential-Id"] {
            assert!(is_sensitive_header(h), "{h}");
        }
        for h in ["X-Team", "Accept", "MCP-Protocol-Version"] {
            assert!(!is_sensitive_header(h), "{h}");
        }
        assert_eq!(header_key("X-Api-Key"), "X_API_KEY");
        assert_eq!(namespace(&json!({"name": "n", "pypi_package": "p"})), "p");
    }
}
