//! Which provider an agent talks to, and with what key. Accounts live in
//! `settings.json` in the config folder (written with 0600 permissions);
//! the usual environment variables work too. Keys never leave this module
//! except inside a provider's HTTP request.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Provider;
use super::anthropic::Anthropic;
use super::openai::OpenAi;

/// Wire family of an account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Anthropic,
    Openai,
    OpenaiCompatible,
    Openrouter,
    Ollama,
}

/// One account in the settings file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Account {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: Kind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The key itself (the file is 0600)…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// …or the environment variable that holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_model: Option<String>,
}

/// The settings file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    #[serde(default)]
    pub accounts: Vec<Account>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

pub fn settings_path() -> PathBuf {
    crate::paths::config_dir().join("settings.json")
}

/// Load the settings (absent file = defaults).
pub fn load() -> Result<Settings, String> {
    let path = settings_path();
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Settings::default()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// A switch in settings.json that is on unless set to `false`
/// (`tailnetDiscovery`, `mdnsDiscovery`).
pub fn switched_on(key: &str) -> bool {
    load().ok().and_then(|s| s.extra.get(key).and_then(serde_json::Value::as_bool)) != Some(false)
}

/// Save the settings atomically with 0600 permissions.
pub fn save(s: &Settings) -> Result<(), String> {
    let text = serde_json::to_string_pretty(s).map_err(|e| e.to_string())?;
    write_private(&settings_path(), &text)
}

/// Write a file of the config folder atomically (a temporary file renamed
/// over it) with 0600 permissions.
pub fn write_private(path: &std::path::Path, text: &str) -> Result<(), String> {
    let dir = path.parent().map(PathBuf::from).unwrap_or_default();
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    {
        use std::io::Write;
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).map_err(|e| format!("{}: {e}", tmp.display()))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Where a resolved provider's key came from (never the key itself).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Resolved {
    pub id: String,
    pub kind: Kind,
    pub base_url: String,
    pub key_source: Option<String>,
}

/// Resolve a provider id (`anthropic`, `openai`, `openrouter`, `ollama` or
/// an account id) into a provider.
pub fn resolve(id: &str, settings: &Settings) -> Result<(Arc<dyn Provider>, Resolved), String> {
    resolve_keyed(id, settings, None)
}

/// [`resolve`] with the agent's own key (its `provider:<id>:apiKey`
/// credential), which wins over the owner's account and the environment.
fn resolve_keyed(
    id: &str,
    settings: &Settings,
    agent_key: Option<&str>,
) -> Result<(Arc<dyn Provider>, Resolved), String> {
    let (resolved, key) = locate_keyed(id, settings, agent_key)?;
    Ok((build(&resolved, key.as_deref(), None), resolved))
}

/// The provider of a resolved endpoint: on `client` when given (a fleet's
/// agents share one, and its connections), else on a client of its own.
fn build(r: &Resolved, key: Option<&str>, client: Option<&reqwest::Client>) -> Arc<dyn Provider> {
    let client = client.cloned().unwrap_or_else(super::http_client);
    match r.kind {
        Kind::Anthropic => Arc::new(Anthropic::on(&r.id, &r.base_url, key.unwrap_or(""), client)),
        _ => Arc::new(OpenAi::on(&r.id, &r.base_url, key, client)),
    }
}

/// Where a provider id leads and with which key, without building the
/// provider (what the runtime snapshot and the context probe need).
fn locate_keyed(id: &str, settings: &Settings, agent_key: Option<&str>) -> Result<(Resolved, Option<String>), String> {
    if id.is_empty() {
        return Err(format!(
            "no model provider is set: run `adf config set FILE model.provider anthropic` (or openai, openrouter, ollama) \
             and set its API key in the environment or in {}",
            settings_path().display()
        ));
    }
    let account = settings.accounts.iter().find(|a| a.id == id).cloned();
    let (kind, base, key, source) = match (&account, id) {
        (Some(a), _) => {
            let (key, source) = match (&a.api_key, &a.api_key_env) {
                (Some(k), _) => (Some(k.clone()), Some(format!("settings:{}", a.id))),
                (None, Some(var)) => (env(var), Some(format!("env:{var}"))),
                (None, None) => (None, None),
            };
            (a.kind, a.base_url.clone(), key, source)
        }
        (None, "anthropic") => {
            (Kind::Anthropic, env("ANTHROPIC_BASE_URL"), env("ANTHROPIC_API_KEY"), Some("env:ANTHROPIC_API_KEY".into()))
        }
        (None, "openai") => {
            (Kind::Openai, env("OPENAI_BASE_URL"), env("OPENAI_API_KEY"), Some("env:OPENAI_API_KEY".into()))
        }
        (None, "openrouter") => {
            (Kind::Openrouter, None, env("OPENROUTER_API_KEY"), Some("env:OPENROUTER_API_KEY".into()))
        }
        (None, "ollama") => (Kind::Ollama, env("OLLAMA_HOST").map(|h| ollama_base(&h)), None, None),
        (None, other) => {
            return Err(format!(
                "unknown provider \"{other}\": use anthropic, openai, openrouter, ollama, or an account id from {}",
                settings_path().display()
            ));
        }
    };
    let (key, source) = match agent_key {
        Some(k) => (Some(k.to_string()), Some(format!("agent credential provider:{id}:apiKey"))),
        None => (key, source),
    };
    let base = base.unwrap_or_else(|| {
        match kind {
            Kind::Anthropic => super::anthropic::DEFAULT_BASE_URL,
            Kind::Openai | Kind::OpenaiCompatible => super::openai::DEFAULT_BASE_URL,
            Kind::Openrouter => "https://openrouter.ai/api/v1",
            Kind::Ollama => "http://127.0.0.1:11434/v1",
        }
        .to_string()
    });
    // The hosted APIs need a key; the OpenAI wire pointed elsewhere (a
    // llama.cpp, vLLM or LM Studio behind OPENAI_BASE_URL) may not.
    let hosted = |host: &str| {
        url::Url::parse(&base).ok().and_then(|u| u.host_str().map(|h| h.eq_ignore_ascii_case(host))).unwrap_or(true)
    };
    let needs_key = match kind {
        Kind::Anthropic => true,
        Kind::Openai => hosted("api.openai.com"),
        Kind::Openrouter => hosted("openrouter.ai"),
        _ => false,
    };
    if needs_key && key.is_none() {
        let var = match kind {
            Kind::Anthropic => "ANTHROPIC_API_KEY",
            Kind::Openrouter => "OPENROUTER_API_KEY",
            _ => "OPENAI_API_KEY",
        };
        return Err(format!(
            "{id}: no API key: set {var} or add the key to an account in {}",
            settings_path().display()
        ));
    }
    let key_source = key.as_ref().and(source);
    Ok((Resolved { id: id.to_string(), kind, base_url: base, key_source }, key))
}

/// Resolve the provider an agent's config names. Entries of the agent's
/// own `providers[]` (owner-only: `{id, type, baseUrl}`) override the
/// endpoint; the key still comes from the owner's account of the same id
/// (or the environment), never from the file.
pub fn resolve_for(cfg: &serde_json::Value, settings: &Settings) -> Result<(Arc<dyn Provider>, Resolved), String> {
    resolve_for_on(cfg, settings, None)
}

/// [`resolve_for`], the provider on `client` when given.
pub fn resolve_for_on(
    cfg: &serde_json::Value,
    settings: &Settings,
    client: Option<&reqwest::Client>,
) -> Result<(Arc<dyn Provider>, Resolved), String> {
    let (resolved, key) = locate_for_keyed(cfg, settings)?;
    Ok((build(&resolved, key.as_deref(), client), resolved))
}

/// Where the provider an agent's config names leads ([`resolve_for`]
/// without building the provider).
pub fn locate_for(cfg: &serde_json::Value, settings: &Settings) -> Result<Resolved, String> {
    locate_for_keyed(cfg, settings).map(|(r, _)| r)
}

fn locate_for_keyed(cfg: &serde_json::Value, settings: &Settings) -> Result<(Resolved, Option<String>), String> {
    let id = cfg.pointer("/model/provider").and_then(|v| v.as_str()).unwrap_or("");
    // Put there in memory by the fleet from the agent's sealed credentials.
    let agent_key = cfg.pointer(AGENT_KEY_POINTER).and_then(|v| v.as_str());
    let entry = cfg
        .get("providers")
        .and_then(|p| p.as_array())
        .and_then(|list| list.iter().find(|p| p.get("id").and_then(|v| v.as_str()) == Some(id)));
    let Some(entry) = entry else { return locate_keyed(id, settings, agent_key) };
    let kind = match entry.get("type").and_then(|v| v.as_str()).unwrap_or("openai-compatible") {
        "anthropic" => Kind::Anthropic,
        "openai" => Kind::Openai,
        "openrouter" => Kind::Openrouter,
        _ => Kind::OpenaiCompatible,
    };
    let mut merged = settings.clone();
    let key_from = settings.accounts.iter().find(|a| a.id == id).cloned();
    merged.accounts.retain(|a| a.id != id);
    merged.accounts.push(Account {
        id: id.to_string(),
        kind,
        base_url: entry
            .get("baseUrl")
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .or(key_from.as_ref().and_then(|a| a.base_url.clone())),
        api_key: key_from.as_ref().and_then(|a| a.api_key.clone()),
        api_key_env: key_from.and_then(|a| a.api_key_env),
        default_model: entry.get("defaultModel").and_then(|v| v.as_str()).map(str::to_string),
    });
    locate_keyed(id, &merged, agent_key)
}

/// Why the provider an agent's config names is not one this install
/// knows (a built-in, an account of `settings.json`, or an entry of the
/// file's own `providers[]`); `None` when it is, or when none is set.
pub fn unknown_provider(cfg: &serde_json::Value, settings: &Settings) -> Option<String> {
    let id = cfg.pointer("/model/provider").and_then(|v| v.as_str()).unwrap_or("");
    let builtin = ["anthropic", "openai", "openrouter", "ollama"].contains(&id);
    let own = cfg
        .get("providers")
        .and_then(|p| p.as_array())
        .is_some_and(|list| list.iter().any(|p| p.get("id").and_then(|v| v.as_str()) == Some(id)));
    if id.is_empty() || builtin || own || settings.accounts.iter().any(|a| a.id == id) {
        return None;
    }
    Some(format!(
        "unknown provider \"{id}\": use anthropic, openai, openrouter, ollama, an account id from {} or an entry of the file's providers[]",
        settings_path().display()
    ))
}

/// Where the fleet puts an agent's own API key in the config copy it hands
/// the provider factory (in memory only, never written).
pub const AGENT_KEY_POINTER: &str = "/__credentials/apiKey";

/// `OLLAMA_HOST` may be `host:port` or a URL; its OpenAI API is under `/v1`.
pub fn ollama_base(host: &str) -> String {
    let h = host.trim_end_matches('/');
    let h = if h.contains("://") { h.to_string() } else { format!("http://{h}") };
    format!("{h}/v1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_win_and_errors_say_what_to_do() {
        let s = Settings {
            accounts: vec![Account {
                id: "local".into(),
                kind: Kind::OpenaiCompatible,
                base_url: Some("http://127.0.0.1:8080/v1".into()),
                api_key: None,
                api_key_env: None,
                default_model: None,
            }],
            extra: Default::default(),
        };
        let (_, r) = resolve("local", &s).unwrap();
        assert_eq!(r.base_url, "http://127.0.0.1:8080/v1");
        assert!(resolve("", &s).err().unwrap().contains("model.provider"));
        assert!(resolve("nope", &s).err().unwrap().contains("unknown provider"));
        assert_eq!(ollama_base("localhost:11434"), "http://localhost:11434/v1");
    }

    #[test]
    fn an_agents_own_key_wins() {
        let cfg = serde_json::json!({"model": {"provider": "openrouter"}, "__credentials": {"apiKey": "sk-agent"}});
        let (_, r) = resolve_for(&cfg, &Settings::default()).ok().unwrap();
        assert_eq!(r.key_source.as_deref(), Some("agent credential provider:openrouter:apiKey"));
        let bare = serde_json::json!({"model": {"provider": "openrouter"}});
        if std::env::var_os("OPENROUTER_API_KEY").is_none() {
            assert!(resolve_for(&bare, &Settings::default()).is_err(), "no key anywhere else");
        }
    }

    #[test]
    fn an_agents_own_provider_entry_sets_the_endpoint() {
        let cfg = serde_json::json!({"model": {"provider": "custom:lab"},
            "providers": [{"id": "custom:lab", "type": "openai-compatible", "baseUrl": "http://127.0.0.1:9/v1"}]});
        let (_, r) = resolve_for(&cfg, &Settings::default()).ok().unwrap();
        assert_eq!((r.kind, r.base_url.as_str()), (Kind::OpenaiCompatible, "http://127.0.0.1:9/v1"));
        let plain = serde_json::json!({"model": {"provider": "ollama"}});
        assert_eq!(resolve_for(&plain, &Settings::default()).ok().unwrap().1.kind, Kind::Ollama);
    }
}
