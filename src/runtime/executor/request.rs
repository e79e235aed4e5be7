//! What a step sends to its model: the parsed config and the tools it
//! advertises (kept per config revision), the system prompt (kept while
//! the config, the agent's files and the fleet's skills stay the same),
//! the dynamic instructions, and the `[Context: …]` rows that record them.
//! Built once per step by `request`; nothing unchanged is rebuilt.

use std::sync::Arc;

use serde_json::{Value, json};

use super::gate::MSG_GATED;
use super::{Executor, compact_threshold, mcp, side};
use crate::protocol::kind;
use crate::providers::{ModelRequest, ToolSpec};
use crate::runtime::prompt;
use crate::store::StoreError;
use crate::store::config::AgentConfig;
use crate::tools;

impl Executor {
    /// Dynamic instructions for the next call (runtime.md §3.2): unread
    /// inbox hint, one-shot context warnings before compaction, the idle
    /// reminder of autonomous agents. Each part can be switched off in
    /// `context.dynamic_instructions`.
    pub(super) fn dynamic_instructions(&mut self, cfg: &Value) -> Result<Option<String>, StoreError> {
        let on = |k: &str| cfg["context"]["dynamic_instructions"][k].as_bool() != Some(false);
        let mut parts = Vec::new();
        if on("inbox_hints") && cfg["messaging"]["inbox_mode"].as_bool() != Some(false) {
            // Counted again only when the inbox changed.
            let rev = self.store.rev(crate::store::revs::Table::Inbox);
            let unread = match self.unread {
                Some((r, n)) if r == rev => n,
                _ => {
                    let n = self.store.inbox_unread().unwrap_or(0);
                    self.unread = Some((rev, n));
                    n
                }
            };
            if unread > 0 {
                parts.push(format!(
                    "You have {unread} unread message(s) in your inbox. Use msg_list and msg_read to read them."
                ));
            }
        }
        if on("context_warning") {
            let threshold = compact_threshold(cfg);
            let left = threshold.saturating_sub(self.token_count()?);
            if left > 0 && left <= 5_000 && self.warned < 2 {
                self.warned = 2;
                parts.push(format!("Context almost full: about {left} tokens left before your loop is compacted. Save what matters to your mind files now."));
            } else if left > 5_000 && left <= 15_000 && self.warned < 1 {
                self.warned = 1;
                parts.push(format!("Context filling up: about {left} tokens left before your loop is compacted. Consider saving what matters to your mind files."));
            }
        }
        if on("idle_reminder") && prompt::is_autonomous(cfg) {
            parts.push("When you have nothing left to do, call sys_set_state(\"idle\") to rest.".to_string());
        }
        Ok((!parts.is_empty()).then(|| parts.join("\n\n")))
    }

    /// `[Context: …]` rows (audit only, never replayed): the system prompt
    /// and the dynamic instructions, written when they change.
    pub(super) fn record_context(&mut self, system: &str, hash: u64, dynamic: Option<&str>) -> Result<(), StoreError> {
        if self.context_hash != Some(hash) {
            self.context_hash = Some(hash);
            self.user_text(&format!("[Context: system_prompt]\n{system}"))?;
            self.emit(
                kind::CONTEXT_INJECTED,
                "system:executor",
                json!({"category": "system_prompt", "bytes": system.len()}),
            );
        }
        if let Some(d) = dynamic
            && self.last_dynamic.as_deref() != Some(d)
        {
            self.last_dynamic = Some(d.to_string());
            self.user_text(&format!("[Context: dynamic_instructions]\n{d}"))?;
            self.emit(
                kind::CONTEXT_INJECTED,
                "system:executor",
                json!({"category": "dynamic_instructions", "bytes": d.len()}),
            );
        }
        Ok(())
    }

    /// The parsed config, the typed view and the advertised tools.
    pub(super) fn config(&mut self) -> Result<Arc<CachedConfig>, StoreError> {
        let main = self.main_config()?;
        Ok(if self.loops.side.is_some() { self.side_config(main) } else { main })
    }

    /// The main loop's config: the parsed file config and the tools it
    /// advertises (with `loop_send` and `loop_list` once the agent has side
    /// loops or may make them, unless the config declares them itself).
    pub(super) fn main_config(&mut self) -> Result<Arc<CachedConfig>, StoreError> {
        let rev = self.store.config_rev() ^ self.store.rev(crate::store::revs::Table::Loops).rotate_left(17);
        if let Some(c) = &self.cfg
            && c.rev == rev
        {
            return Ok(c.clone());
        }
        let mut value = self.store.config_value()?;
        if side::manages_loops(&value) || !self.store.loops_list()?.is_empty() {
            side::declare_loop_tools(&mut value);
        }
        let typed = AgentConfig::from_value(&value).unwrap_or_default();
        let tools = advertised_tools(&value, &typed);
        let changed = self.cfg.is_some();
        let c = Arc::new(CachedConfig::new(rev, value, typed, tools));
        self.cfg = Some(c.clone());
        // A config change may change what the runtime applies.
        if changed && let Err(e) = self.record_runtime_snapshot() {
            self.log("warn", "executor", "runtime_snapshot", &e.to_string())?;
        }
        Ok(c)
    }

    /// The system prompt for this request: rebuilt only when the config
    /// revision changed or (checked once a turn) the agent's files or the
    /// fleet's skills folder did. With it, its hash for `record_context`.
    pub(super) fn system_prompt(&mut self, c: &CachedConfig) -> (Arc<str>, u64) {
        use crate::knowledge::skills;
        let key = match &self.prompt {
            Some(p) if self.knowledge_checked => p.knowledge_key,
            _ => {
                self.knowledge_checked = true;
                (self.store.rev(crate::store::revs::Table::Files), skills::fleet_signature(&skills::fleet_root()))
            }
        };
        if let Some(p) = &self.prompt
            && p.cfg_rev == c.rev
            && p.knowledge_key == key
        {
            return (p.system.clone(), p.hash);
        }
        let knowledge = prompt::knowledge_sections(&self.store, &c.value);
        let mut system = prompt::system_prompt(&self.store, &c.value, &mut self.snapshot, knowledge.as_deref());
        if let Some(section) = self.side_prompt() {
            system.push_str("\n\n");
            system.push_str(&section);
        }
        let system: Arc<str> = system.into();
        let hash = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            system.hash(&mut h);
            h.finish()
        };
        self.prompt = Some(PromptCache { cfg_rev: c.rev, knowledge_key: key, system: system.clone(), hash });
        (system, hash)
    }

    /// The provider request for the current loop.
    pub(super) fn request(&mut self, c: &CachedConfig) -> Result<ModelRequest, StoreError> {
        let (cfg, typed) = (&c.value, &c.typed);
        let (system, hash) = self.system_prompt(c);
        self.session()?;
        self.drain_loop_mail()?;
        for inj in self.inject.drain() {
            self.transcript.push_injection(&inj.text);
        }
        let messages = self.transcript.view();
        let model = typed.model.clone().unwrap_or_default();
        let effort = cfg["model"]["reasoning"]["effort"].as_str().and_then(crate::providers::Effort::parse);
        let reasoning_tokens = (cfg["model"]["reasoning"]["enabled"] == true)
            .then(|| cfg["model"]["reasoning"]["max_tokens"].as_u64())
            .flatten();
        let trailing = self.dynamic_instructions(cfg)?;
        self.record_context(&system, hash, trailing.as_deref())?;
        Ok(ModelRequest {
            model: model.model_id.unwrap_or_default(),
            trailing,
            system,
            messages,
            tools: c.tools.clone(),
            max_tokens: model.max_tokens.flatten().unwrap_or(4096),
            temperature: model.temperature.flatten(),
            effort,
            reasoning_tokens,
        })
    }
}

/// The tools a config advertises to the model: enabled and visible,
/// runnable in this build, the messaging ones only when it receives.
pub(crate) fn advertised_tools(value: &Value, typed: &AgentConfig) -> Vec<ToolSpec> {
    let (decls, _) = typed.effective_tools();
    let receive = value["messaging"]["receive"].as_bool().unwrap_or(true);
    decls
        .iter()
        .filter(|d| d.is_enabled() && d.is_visible())
        .filter(|d| receive || !MSG_GATED.contains(&d.name.as_str()))
        .filter_map(|d| {
            if d.name.starts_with("mcp_") {
                return mcp::advertised(value, &d.name);
            }
            let def = tools::def(&d.name)?;
            Some(ToolSpec {
                name: d.name.clone(),
                description: def.description.into(),
                input_schema: tools::advertised_schema(&d.name)?,
            })
        })
        .collect()
}

/// The config as the executor uses it, for one config revision.
pub(super) struct CachedConfig {
    pub(super) rev: u64,
    pub(super) value: Value,
    pub(super) typed: AgentConfig,
    pub(super) tools: Arc<Vec<ToolSpec>>,
    /// Characters of the advertised tools (name, description, schema),
    /// for a budget's estimate of a request without serialising it.
    pub(super) tool_chars: usize,
}

impl CachedConfig {
    pub(super) fn new(rev: u64, value: Value, typed: AgentConfig, tools: Vec<ToolSpec>) -> Self {
        let tool_chars = tools.iter().map(ToolSpec::chars).sum();
        CachedConfig { rev, value, typed, tools: Arc::new(tools), tool_chars }
    }
}

/// The system prompt of the current session, kept while the config
/// revision and the knowledge sections' sources stay the same (the
/// template snapshot is fixed for a session, and a reset drops this).
pub(super) struct PromptCache {
    pub(super) cfg_rev: u64,
    pub(super) knowledge_key: (u64, u64),
    pub(super) system: Arc<str>,
    pub(super) hash: u64,
}
