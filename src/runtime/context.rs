//! The context gauge (issue 18): how full a loop's next model call is
//! against the model's real window, and what takes the space — the system
//! prompt's own text, each file it templates in, the skills section, each
//! tool schema, and the loop's history. Figures are estimates at four
//! characters a token (what the executor's compaction check uses), except
//! the last call's input, which is what the provider reported.

use serde::Serialize;
use serde_json::Value;

use crate::providers::windows::{self, Source};
use crate::store::config::AgentConfig;
use crate::store::template::{Snapshot, injected, placeholders};
use crate::store::{Store, StoreError};

/// One thing that takes space.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Part {
    /// `system`, `file`, `memory`, `skills`, `tool` or `history`.
    pub kind: &'static str,
    pub name: String,
    pub tokens: u64,
}

/// A loop's gauge.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gauge {
    #[serde(rename = "loop")]
    pub loop_name: String,
    pub model: String,
    /// The model's window, when something knows it (see `providers::windows`).
    pub window: Option<u64>,
    pub window_source: Option<Source>,
    /// The estimate of the next call's input (the sum of the parts).
    pub estimated: u64,
    /// The input the provider reported for the loop's last call, if any.
    pub reported_last_call: Option<u64>,
    /// `estimated` against the window, when it is known.
    pub percent: Option<f64>,
    pub compact_threshold: u64,
    pub parts: Vec<Part>,
}

fn tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

/// Measure `loop_name` (`None`: main). `overrides` is settings.json's
/// `model_windows`, `probed` what the model's server said its window is.
pub fn measure(
    store: &Store,
    loop_name: Option<&str>,
    overrides: Option<&Value>,
    probed: Option<u64>,
) -> Result<Gauge, StoreError> {
    let mut main = store.config_value()?;
    if !store.loops_list()?.is_empty() || super::executor::side::manages_loops(&main) {
        super::executor::side::declare_loop_tools(&mut main);
    }
    let def = match loop_name {
        Some(n) => Some(store.loop_get(n)?.ok_or_else(|| StoreError::Missing(format!("no loop named {n:?}")))?),
        None => None,
    };
    let cfg = match &def {
        Some(d) => super::executor::side::side_value(&main, d),
        None => main,
    };
    let mut parts = Vec::new();
    let knowledge = super::prompt::knowledge_sections(store, &cfg);
    let mut system = super::prompt::system_prompt(store, &cfg, &mut Snapshot::new(), knowledge.as_deref());
    if let Some(d) = &def {
        system.push_str("\n\n");
        system.push_str(&super::executor::side::prompt_section(d));
    }
    // The files the prompt templates in, each once.
    let mut template = String::from(super::prompt::BASE_PROMPT);
    if let Some(i) = cfg.get("instructions").and_then(Value::as_str) {
        template.push_str(i);
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut files_chars = 0usize;
    for (_, path) in placeholders(&template) {
        if !seen.insert(path.to_string()) {
            continue;
        }
        let text = injected(path, store.file_read_text(path).ok().as_deref());
        files_chars += text.len();
        let kind = if path == "mind.md" || path.starts_with("mind/") { "memory" } else { "file" };
        parts.push(Part { kind, name: path.to_string(), tokens: tokens(text.len()) });
    }
    let skills_chars = knowledge.as_deref().map_or(0, str::len);
    if skills_chars > 0 {
        parts.push(Part { kind: "skills", name: "skills and bundles".into(), tokens: tokens(skills_chars) });
    }
    let own = system.len().saturating_sub(files_chars + skills_chars);
    parts.push(Part { kind: "system", name: "system prompt text".into(), tokens: tokens(own) });
    let typed = AgentConfig::from_value(&cfg).unwrap_or_default();
    for t in super::executor::advertised_tools(&cfg, &typed) {
        let chars = t.chars();
        parts.push(Part { kind: "tool", name: t.name, tokens: tokens(chars) });
    }
    let history = store.history_size(def.as_ref().map(|d| d.name.as_str()))?;
    parts.push(Part { kind: "history", name: format!("{} rows", history.rows), tokens: tokens(history.chars) });
    let reported_last_call = history.last_input;
    parts.sort_by(|a, b| b.tokens.cmp(&a.tokens).then_with(|| a.name.cmp(&b.name)));
    let estimated: u64 = parts.iter().map(|p| p.tokens).sum();
    let model = cfg.pointer("/model/model_id").and_then(Value::as_str).unwrap_or("").to_string();
    let known = windows::resolve(Some(&cfg), &model, overrides, probed);
    let (window, window_source) = (known.map(|k| k.0), known.map(|k| k.1));
    Ok(Gauge {
        loop_name: loop_name.unwrap_or("main").to_string(),
        percent: window.map(|w| (estimated as f64 * 1000.0 / w as f64).round() / 10.0),
        model,
        window,
        window_source,
        estimated,
        reported_last_call,
        compact_threshold: super::executor::compact_threshold(&cfg),
        parts,
    })
}
