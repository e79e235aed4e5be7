//! Context windows of models: how many tokens a model reads in one call.
//! A built-in table by model-id prefix, which the owner extends or
//! overrides in `settings.json` (`"model_windows": {"my-model": 32768}`,
//! exact ids or prefixes). The longest matching prefix wins; a provider
//! route such as `openrouter`'s `vendor/model` matches on the model part too.

use serde_json::Value;

/// Prefix → window (tokens).
const TABLE: &[(&str, u64)] = &[
    ("claude-opus-4", 200_000),
    ("claude-sonnet-4", 200_000),
    ("claude-haiku-4", 200_000),
    ("claude-3-7", 200_000),
    ("claude-3-5", 200_000),
    ("claude-3", 200_000),
    ("claude", 200_000),
    ("gpt-5", 400_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    ("gemini-2.5", 1_048_576),
    ("gemini-2.0", 1_048_576),
    ("gemini-1.5-pro", 2_097_152),
    ("gemini-1.5-flash", 1_048_576),
    ("llama-3", 131_072),
    ("llama3", 131_072),
    ("qwen", 131_072),
    ("mistral", 131_072),
    ("deepseek", 131_072),
    ("smollm2", 8_192),
];

/// What a window figure is based on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The owner's `model_windows` in settings.json.
    Settings,
    /// adf's table.
    Table,
    /// Nothing known: a conservative default.
    Default,
}

/// The window assumed for a model nothing is known about.
pub const DEFAULT_WINDOW: u64 = 128_000;

fn longest(candidates: impl Iterator<Item = (String, u64)>, model: &str) -> Option<u64> {
    let tail = model.rsplit('/').next().unwrap_or(model);
    candidates
        .filter(|(p, _)| model.starts_with(p.as_str()) || tail.starts_with(p.as_str()))
        .max_by_key(|(p, _)| p.len())
        .map(|(_, w)| w)
}

/// The window of `model`, with where the figure came from. `overrides` is
/// the `model_windows` object of settings.json, if any.
pub fn window(model: &str, overrides: Option<&Value>) -> (u64, Source) {
    if let Some(map) = overrides.and_then(Value::as_object) {
        let user = map.iter().filter_map(|(k, v)| Some((k.clone(), v.as_u64().filter(|w| *w > 0)?)));
        if let Some(w) = longest(user, model) {
            return (w, Source::Settings);
        }
    }
    match longest(TABLE.iter().map(|(p, w)| (p.to_string(), *w)), model) {
        Some(w) => (w, Source::Table),
        None => (DEFAULT_WINDOW, Source::Default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn longest_prefix_and_settings_first() {
        assert_eq!(window("claude-sonnet-4-5-20250929", None), (200_000, Source::Table));
        assert_eq!(window("gpt-4o-mini", None), (128_000, Source::Table));
        assert_eq!(window("gpt-4", None), (8_192, Source::Table));
        assert_eq!(window("anthropic/claude-3-5-sonnet", None), (200_000, Source::Table));
        assert_eq!(window("mystery", None), (DEFAULT_WINDOW, Source::Default));
        let o = json!({"gpt-4o": 64000, "mystery": 4096, "bad": -1});
        assert_eq!(window("gpt-4o-mini", Some(&o)), (64_000, Source::Settings));
        assert_eq!(window("mystery-7b", Some(&o)), (4_096, Source::Settings));
        assert_eq!(window("bad", Some(&o)), (DEFAULT_WINDOW, Source::Default));
    }
}
