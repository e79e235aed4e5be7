//! Skills and knowledge bundles in the turn loop: `/<skill> args` from the
//! owner runs as a user turn with the skill's body loaded, and `fs_read`
//! of `skills/<name>/…` reaches a fleet-wide skill (read-only) when the
//! agent has no file of its own there.

use std::borrow::Cow;

use serde_json::{Value, json};

use super::Executor;
use crate::knowledge::skills;
use crate::tools::ToolOutput;

impl Executor {
    /// The skills this agent sees now (the fleet's, then its own).
    pub fn skills(&self) -> skills::Index {
        let cfg = self.store.config_value().unwrap_or_default();
        skills::index(&self.store, Some(&skills::fleet_root()), &cfg)
    }

    /// An owner's `/<name> args` for an active skill, expanded; any other
    /// text as it is.
    pub(super) fn expand_skill<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let Some(rest) = text.strip_prefix('/') else { return Cow::Borrowed(text) };
        let (name, args) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        let index = self.skills();
        let Some(skill) = index.find(name) else { return Cow::Borrowed(text) };
        let body = match skill.root {
            skills::Root::Agent => self.store.file_read_text(&skill.path).ok(),
            skills::Root::Fleet => {
                skills::fleet_file(&skills::fleet_root(), &skill.path).and_then(|b| String::from_utf8(b).ok())
            }
        };
        match body.and_then(|b| skills::parse(&b).ok()) {
            Some((_, _, body)) => Cow::Owned(skills::invocation(name, &body, args)),
            None => Cow::Borrowed(text),
        }
    }

    /// `fs_read` of a fleet skill's file the agent does not have itself.
    pub(super) fn fleet_skill_read(&self, input: &Value) -> Option<ToolOutput> {
        let path = input["path"].as_str()?;
        if !path.starts_with("skills/") || self.store.file_stat(path).ok()?.is_some() {
            return None;
        }
        let name = path.strip_prefix("skills/")?.split('/').next()?;
        let index = self.skills();
        let skill = index.find(name).filter(|s| s.root == skills::Root::Fleet)?;
        let bytes = skills::fleet_file(&skills::fleet_root(), path)?;
        let text = String::from_utf8(bytes).ok()?;
        Some(ToolOutput::json(&json!({"path": path, "content": text, "source": "fleet skill (read-only)",
                                      "skill": skill.name})))
    }
}
