//! Context windows of models: how many tokens a model reads in one call.
//! In order: the agent's own `model.context_window`; the owner's
//! `model_windows` in settings.json (exact ids or prefixes, the longest
//! matching prefix wins); what a self-hosted OpenAI-compatible server says
//! about itself (llama.cpp's `GET /props` reports the `n_ctx` it was
//! started with); a table of the hosted model families' published windows.
//! When none knows, the window is unknown: a gauge shows tokens used
//! rather than a percentage of a guess.

use std::time::Duration;

use serde_json::Value;

/// Published windows of hosted model families, by id prefix.
const KNOWN: &[(&str, u64)] = &[
    ("claude", 200_000),
    ("gpt-4o", 128_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-5", 400_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4", 200_000),
    ("gemini", 1_048_576),
];

/// Where a window figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The agent's `model.context_window`.
    Config,
    /// The owner's `model_windows` in settings.json.
    Settings,
    /// The model's server (llama.cpp's `/props`).
    Provider,
    /// adf's table of hosted models.
    Table,
}

fn longest<'a>(candidates: impl Iterator<Item = (&'a str, u64)>, model: &str) -> Option<u64> {
    // `anthropic/claude-…` on OpenRouter names the same model.
    let m = model.to_ascii_lowercase();
    let tail = m.rsplit('/').next().unwrap_or(&m).to_string();
    candidates
        .filter(|(p, _)| {
            let p = p.to_ascii_lowercase();
            m.starts_with(&p) || tail.starts_with(&p)
        })
        .max_by_key(|(p, _)| p.len())
        .map(|(_, w)| w)
}

/// The published window of a hosted model, by its id.
pub fn known(model: &str) -> Option<u64> {
    longest(KNOWN.iter().copied(), model)
}

/// The window of `model` and where it came from: `cfg` is the agent's
/// config, `overrides` settings.json's `model_windows`, `probed` what the
/// model's server reported. `None` when nothing knows.
pub fn resolve(
    cfg: Option<&Value>,
    model: &str,
    overrides: Option<&Value>,
    probed: Option<u64>,
) -> Option<(u64, Source)> {
    if let Some(w) = cfg.and_then(|c| c.pointer("/model/context_window")).and_then(Value::as_u64).filter(|n| *n > 0) {
        return Some((w, Source::Config));
    }
    if let Some(map) = overrides.and_then(Value::as_object) {
        let user = map.iter().filter_map(|(k, v)| Some((k.as_str(), v.as_u64().filter(|w| *w > 0)?)));
        if let Some(w) = longest(user, model) {
            return Some((w, Source::Settings));
        }
    }
    if let Some(w) = probed.filter(|n| *n > 0) {
        return Some((w, Source::Provider));
    }
    known(model).map(|w| (w, Source::Table))
}

/// settings.json's `model_windows`, if any.
pub fn overrides() -> Option<Value> {
    crate::providers::accounts::load().ok()?.extra.get("model_windows").cloned()
}

/// Whether an endpoint is one of the hosted APIs (whose windows the table
/// knows), not a server the owner runs.
fn hosted(base: &str) -> bool {
    ["api.anthropic.com", "api.openai.com", "openrouter.ai"].iter().any(|h| base.contains(h))
}

/// Ask a self-hosted OpenAI-compatible server for its context window:
/// llama.cpp's `/props` (`default_generation_settings.n_ctx`, or `n_ctx`).
/// `None` for hosted APIs, other servers, and anything that fails within
/// two seconds.
pub async fn probe(cfg: &Value) -> Option<u64> {
    let settings = crate::providers::accounts::load().ok()?;
    let r = crate::providers::accounts::locate_for(cfg, &settings).ok()?;
    if matches!(r.kind, crate::providers::accounts::Kind::Anthropic) || hosted(&r.base_url) {
        return None;
    }
    let base = r.base_url.trim_end_matches('/');
    let root = base.strip_suffix("/v1").unwrap_or(base);
    let client = crate::providers::client_builder().timeout(Duration::from_secs(2)).build().ok()?;
    let v: Value = client.get(format!("{root}/props")).send().await.ok()?.json().await.ok()?;
    v.pointer("/default_generation_settings/n_ctx").or_else(|| v.get("n_ctx")).and_then(Value::as_u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_then_settings_then_server_then_table() {
        assert_eq!(known("claude-sonnet-4-5"), Some(200_000));
        assert_eq!(known("anthropic/claude-opus-4"), Some(200_000));
        assert_eq!(known("gpt-4.1-mini"), Some(1_047_576));
        assert_eq!(known("qwen2.5-7b-instruct"), None, "self-hosted families vary: the server says");
        let cfg = json!({"model": {"context_window": 8192}});
        let o = json!({"claude-x": 64000, "qwen2.5": 32768, "bad": -1});
        assert_eq!(resolve(Some(&cfg), "claude-x", Some(&o), Some(4096)), Some((8192, Source::Config)));
        assert_eq!(resolve(None, "claude-x", Some(&o), Some(4096)), Some((64_000, Source::Settings)));
        assert_eq!(resolve(None, "qwen2.5-7b-instruct", Some(&o), None), Some((32_768, Source::Settings)));
        assert_eq!(resolve(None, "claude-y", Some(&o), Some(4096)), Some((4096, Source::Provider)));
        assert_eq!(resolve(None, "claude-y", None, None), Some((200_000, Source::Table)));
        assert_eq!(resolve(None, "bad", Some(&o), None), None);
        assert_eq!(resolve(None, "local-model", None, None), None);
    }
}
