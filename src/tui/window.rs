//! A model's context window, for the chat's `ctx N%` gauge. In order: the
//! owner's `model.context_window` in the agent's config; what a
//! self-hosted OpenAI-compatible server says about itself (llama.cpp's
//! `GET /props` reports the `n_ctx` it was started with); a table of the
//! hosted model families' published windows. When none knows the window
//! the gauge shows the tokens used (`ctx 589 tok`) rather than a
//! percentage of a guess.

use std::time::Duration;

use serde_json::Value;

/// Published windows of hosted model families, by id prefix (the longest
/// matching prefix wins).
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

/// The window the config or the table gives a model (`probed` is what
/// its server reported, if anything).
pub fn resolve(cfg: Option<&Value>, model: &str, probed: Option<u64>) -> Option<u64> {
    let configured = cfg.and_then(|c| c.pointer("/model/context_window")).and_then(Value::as_u64).filter(|n| *n > 0);
    configured.or(probed.filter(|n| *n > 0)).or_else(|| known(model))
}

/// The published window of a hosted model, by its id.
pub fn known(model: &str) -> Option<u64> {
    // `anthropic/claude-…` on OpenRouter names the same model.
    let m = model.rsplit('/').next().unwrap_or(model).to_ascii_lowercase();
    KNOWN.iter().filter(|(p, _)| m.starts_with(p)).max_by_key(|(p, _)| p.len()).map(|(_, n)| *n)
}

/// The gauge: `ctx 14%` against a known window, else the tokens used.
pub fn gauge(tokens: Option<u64>, window: Option<u64>) -> Option<String> {
    let t = tokens?;
    Some(match window {
        Some(w) if w > 0 => format!("ctx {}%", t * 100 / w),
        _ => format!("ctx {t} tok"),
    })
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
    let (_, r) = crate::providers::accounts::resolve_for(cfg, &settings).ok()?;
    if matches!(r.kind, crate::providers::accounts::Kind::Anthropic) || hosted(&r.base_url) {
        return None;
    }
    let base = r.base_url.trim_end_matches('/');
    let root = base.strip_suffix("/v1").unwrap_or(base);
    crate::providers::install_crypto();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().ok()?;
    let v: Value = client.get(format!("{root}/props")).send().await.ok()?.json().await.ok()?;
    v.pointer("/default_generation_settings/n_ctx").or_else(|| v.get("n_ctx")).and_then(Value::as_u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_window_comes_from_config_server_or_table() {
        assert_eq!(known("claude-sonnet-4-5"), Some(200_000));
        assert_eq!(known("anthropic/claude-opus-4"), Some(200_000));
        assert_eq!(known("gpt-4.1-mini"), Some(1_047_576));
        assert_eq!(known("qwen2.5-7b-instruct"), None);
        let cfg = json!({"model": {"context_window": 8192}});
        assert_eq!(resolve(Some(&cfg), "claude-x", Some(4096)), Some(8192), "the owner's setting wins");
        assert_eq!(resolve(None, "claude-x", Some(4096)), Some(4096), "then the server's");
        assert_eq!(resolve(None, "claude-x", None), Some(200_000));
        assert_eq!(resolve(None, "local-model", None), None);
        // llama.cpp's 4,096 window: 589 tokens are 14 %, not 0 %.
        assert_eq!(gauge(Some(589), Some(4096)).as_deref(), Some("ctx 14%"));
        assert_eq!(gauge(Some(589), None).as_deref(), Some("ctx 589 tok"));
        assert_eq!(gauge(None, Some(4096)), None);
    }
}
