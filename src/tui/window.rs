//! The chat's `ctx N%` gauge, against the window `providers::windows`
//! resolves (the agent's config, the owner's settings, the model's server,
//! the table of hosted models). When none knows the window the gauge shows
//! the tokens used (`ctx 589 tok`) rather than a percentage of a guess.

use serde_json::Value;

/// The window the config, the owner's settings, the server (`probed`) or
/// the table gives a model (see `providers::windows`).
pub fn resolve(cfg: Option<&Value>, model: &str, overrides: Option<&Value>, probed: Option<u64>) -> Option<u64> {
    crate::providers::windows::resolve(cfg, model, overrides, probed).map(|(w, _)| w)
}

/// The gauge: `ctx 14%` against a known window, else the tokens used.
pub fn gauge(tokens: Option<u64>, window: Option<u64>) -> Option<String> {
    let t = tokens?;
    Some(match window {
        Some(w) if w > 0 => format!("ctx {}%", t * 100 / w),
        _ => format!("ctx {t} tok"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_window_comes_from_config_server_or_table() {
        let cfg = json!({"model": {"context_window": 8192}});
        assert_eq!(resolve(Some(&cfg), "claude-x", None, Some(4096)), Some(8192), "the owner's setting wins");
        assert_eq!(resolve(None, "claude-x", None, Some(4096)), Some(4096), "then the server's");
        assert_eq!(resolve(None, "claude-x", None, None), Some(200_000));
        assert_eq!(resolve(None, "local-model", None, None), None);
        // llama.cpp's 4,096 window: 589 tokens are 14 %, not 0 %.
        assert_eq!(gauge(Some(589), Some(4096)).as_deref(), Some("ctx 14%"));
        assert_eq!(gauge(Some(589), None).as_deref(), Some("ctx 589 tok"));
        assert_eq!(gauge(None, Some(4096)), None);
    }
}
