//! `adf compute`: the install's side of host commands (issue 22). The owner
//! switches host commands on or off for the whole install and approves the
//! programs agents may start (`compute.host` in `settings.json`); an agent
//! also needs its own `compute.host_access`. Bad input changes nothing.

use clap::Subcommand;
use serde_json::{Value, json};

use super::output::Out;
use crate::providers::accounts;
use crate::runtime::compute::HostPolicy;

#[derive(Debug, Clone, Subcommand)]
pub enum ComputeCmd {
    /// What agents may run on this machine (the default).
    Status,
    /// Host commands: `on`, `off`, `allow PROGRAM…`, `deny PROGRAM…`.
    Host {
        #[command(subcommand)]
        cmd: HostCmd,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum HostCmd {
    /// Allow host commands for this install (agents still need their own
    /// `compute.host_access`).
    On,
    /// Refuse every host command.
    Off,
    /// Approve programs (names found on PATH, or exact absolute paths).
    Allow {
        #[arg(required = true)]
        programs: Vec<String>,
    },
    /// Withdraw approval of programs.
    Deny {
        #[arg(required = true)]
        programs: Vec<String>,
    },
}

/// A program name an owner may approve: a bare name, or an absolute path.
fn program_ok(p: &str) -> Result<(), String> {
    let bare = !p.is_empty() && !p.contains('/') && p != "." && p != "..";
    let path = p.starts_with('/')
        && std::path::Path::new(p).components().all(|c| !matches!(c, std::path::Component::ParentDir));
    let clean = !p.chars().any(|c| c.is_whitespace() || c.is_control() || "$`;&|<>(){}*?[]\\\"'~".contains(c));
    if (bare || path) && clean {
        Ok(())
    } else {
        Err(format!("{p:?} is not a program name (a bare name such as git, or an absolute path)"))
    }
}

pub fn run(out: &Out, cmd: Option<&ComputeCmd>) -> anyhow::Result<()> {
    let path = accounts::settings_path();
    if let Some(ComputeCmd::Host { cmd }) = cmd {
        if let HostCmd::Allow { programs } | HostCmd::Deny { programs } = cmd {
            for p in programs {
                program_ok(p).map_err(|e| anyhow::anyhow!("{e}; {} unchanged", path.display()))?;
            }
        }
        let mut s = accounts::load().map_err(anyhow::Error::msg)?;
        let mut compute = s.extra.get("compute").cloned().unwrap_or_else(|| json!({}));
        if !compute.is_object() {
            anyhow::bail!("settings.json compute is not an object; {} unchanged", path.display());
        }
        let mut host = compute["host"].clone();
        if !host.is_object() {
            host = json!({"enabled": false, "programs": []});
        }
        let mut programs: Vec<String> = HostPolicy::of(&s).programs;
        match cmd {
            HostCmd::On => host["enabled"] = json!(true),
            HostCmd::Off => host["enabled"] = json!(false),
            HostCmd::Allow { programs: add } => {
                for p in add {
                    if !programs.contains(p) {
                        programs.push(p.clone());
                    }
                }
            }
            HostCmd::Deny { programs: drop } => programs.retain(|p| !drop.contains(p)),
        }
        host["programs"] = json!(programs);
        compute["host"] = host;
        s.extra.insert("compute".into(), compute);
        accounts::save(&s).map_err(anyhow::Error::msg)?;
    }
    let p = HostPolicy::load();
    if out.json {
        return out.json(&json!({"host": {"enabled": p.enabled, "programs": p.programs}, "settings": path,
            "containers": Value::Null}));
    }
    out.line(format!(
        "host commands: {} · approved programs: {}",
        if p.enabled { "on" } else { "off (adf compute host on)" },
        if p.programs.is_empty() { "none (adf compute host allow git …)".to_string() } else { p.programs.join(", ") }
    ))?;
    out.line(
        "an agent runs them only with its own compute.host_access (adf config set FILE compute.host_access true)",
    )?;
    out.line("containers: not driven by this build of adf yet")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_program_names_are_approved() {
        for ok in ["git", "python3", "/usr/local/bin/tool", "cargo-nextest"] {
            assert!(program_ok(ok).is_ok(), "{ok}");
        }
        for bad in ["", "rm -rf", "a;b", "./x", "../x", "/usr/../bin/sh", "$(id)", "x*", "a/b"] {
            assert!(program_ok(bad).is_err(), "{bad:?}");
        }
    }
}
