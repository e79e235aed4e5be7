//! Who is asking, and the structured denials protection rules produce. The
//! same rules serve the agent's tools, its code and the owner's CLI: the
//! caller decides which bypasses apply (format.md §5.2, §6.1; runtime.md §8.3).

use std::fmt;

use serde::Serialize;

/// The party performing a store operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The owner (CLI, UI, daemon): protection is the owner's to set and
    /// bypass, but the owner is told when a file is protected.
    Owner,
    /// The agent, from its loop or its code.
    Agent {
        /// Code running from an authorized file.
        authorized: bool,
        /// A human approved a one-time protection override.
        override_approved: bool,
    },
}

impl Caller {
    pub const AGENT: Caller = Caller::Agent { authorized: false, override_approved: false };

    /// Whether protection can be bypassed (with a bypass log).
    pub fn bypasses(self) -> bool {
        match self {
            Caller::Owner => false,
            Caller::Agent { authorized, override_approved } => authorized || override_approved,
        }
    }
}

/// The kind of protection that refused an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DenialKind {
    FileProtection,
    MetaProtection,
    ConfigLock,
}

impl fmt::Display for DenialKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DenialKind::FileProtection => "file_protection",
            DenialKind::MetaProtection => "meta_protection",
            DenialKind::ConfigLock => "config_lock",
        })
    }
}

/// A structured protection denial `{kind, target, level, description}`; a
/// human may approve a one-time override of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Denial {
    pub kind: DenialKind,
    pub target: String,
    pub level: String,
    pub description: String,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.description)
    }
}

impl Denial {
    pub fn new(kind: DenialKind, target: &str, level: &str, description: String) -> Self {
        Denial { kind, target: target.to_string(), level: level.to_string(), description }
    }
}
