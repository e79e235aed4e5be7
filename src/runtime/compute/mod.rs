//! Real computers (issue 22, tools.md `compute_exec` and `fs_transfer`):
//! where an agent's commands may run and what decides it. Four kinds of
//! target, least privileged first: its own dedicated container
//! (`isolated`, when `compute.enabled`), the install's shared container
//! (`shared`, a private workspace and user each), an external container the
//! owner registered (`settings.json` `compute.external`, only where the
//! agent's `allowed_targets` names it), and this machine (`host`, only when
//! the agent's `compute.host_access` and the install's `compute.host`
//! agree). Resolution fails closed: an unavailable target is an error, never
//! a redirect. On the host every program a command would start is read with
//! a real shell grammar (brush's, as `adf_shell` reads its scripts) and must
//! be approved; what the grammar cannot pin down is refused. Containers are
//! the sandbox themselves: no program list there.
//!
//! `host.rs` runs host commands, `engine.rs` finds Podman or Docker,
//! `containers.rs` keeps the managed containers and their runners
//! (`runner.rs`, `runner.py`), `image.rs` builds the image from Debian
//! packages.

pub mod browser;
pub mod containers;
pub mod display;
pub mod engine;
mod host;
pub mod image;
pub mod proxy;
pub mod runner;
pub mod summary;

pub use host::run_host;

use std::path::{Component, Path, PathBuf};

use serde_json::Value;

/// Each output stream is kept to this much.
pub const OUTPUT_CAP: usize = 512 << 10;
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
pub const MAX_TIMEOUT_MS: u64 = 120_000;

/// Shell builtins a host command may use without approval: they start no
/// program and reach nothing the command could not reach anyway.
const BUILTINS: &[&str] =
    &["cd", "echo", "printf", "pwd", "true", "false", "test", "[", "export", "unset", "set", "shift", "exit", ":"];
/// Builtins that run what the grammar cannot see: never allowed.
const OPAQUE: &[&str] =
    &["eval", "exec", "source", ".", "command", "builtin", "enable", "trap", "alias", "coproc", "time", "bash", "sh"];

/// The install's host switch (`settings.json` `compute.host`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostPolicy {
    pub enabled: bool,
    pub programs: Vec<String>,
}

impl HostPolicy {
    pub fn of(settings: &crate::providers::accounts::Settings) -> HostPolicy {
        let h = settings.extra.get("compute").map(|c| c["host"].clone()).unwrap_or(Value::Null);
        HostPolicy {
            enabled: h["enabled"] == true,
            programs: h["programs"]
                .as_array()
                .map(|a| a.iter().filter_map(|p| p.as_str().map(str::to_string)).collect())
                .unwrap_or_default(),
        }
    }

    pub fn load() -> HostPolicy {
        crate::providers::accounts::load().map(|s| HostPolicy::of(&s)).unwrap_or_default()
    }
}

/// An external container the owner registered (`settings.json`
/// `compute.external`): adf runs commands in it and never starts, stops,
/// rebuilds or removes it.
#[derive(Debug, Clone, PartialEq)]
pub struct External {
    /// The agent-facing name (`allowed_targets`, `target`).
    pub alias: String,
    /// The container's name or id, as the engine knows it.
    pub container: String,
    /// `podman` or `docker`; the detected engine when absent.
    pub engine: Option<String>,
    /// The working folder for commands (the container's own when absent).
    pub workspace: Option<String>,
    /// The user commands run as (the container's own when absent).
    pub user: Option<String>,
}

/// The install's compute settings (`settings.json` `compute`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    pub host: HostPolicy,
    /// `podman`, `docker`, a path to either, or `none` (no containers).
    pub engine: Option<String>,
    /// The managed containers' image (the built one when absent).
    pub image: Option<String>,
    pub external: Vec<External>,
}

impl Settings {
    pub fn of(settings: &crate::providers::accounts::Settings) -> Settings {
        let c = settings.extra.get("compute").cloned().unwrap_or(Value::Null);
        let s = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
        let external = c["external"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| {
                        Some(External {
                            alias: s(&e["alias"])?,
                            container: s(&e["container"])?,
                            engine: s(&e["engine"]),
                            workspace: s(&e["workspace"]),
                            user: s(&e["user"]),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        Settings { host: HostPolicy::of(settings), engine: s(&c["engine"]), image: s(&c["image"]), external }
    }

    pub fn load() -> Settings {
        crate::providers::accounts::load().map(|s| Settings::of(&s)).unwrap_or_default()
    }
}

/// Where a command runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    Host,
    Isolated,
    Shared,
    External(External),
}

impl Target {
    pub fn name(&self) -> &str {
        match self {
            Target::Host => "host",
            Target::Isolated => "isolated",
            Target::Shared => "shared",
            Target::External(e) => &e.alias,
        }
    }
}

/// The targets an agent may use, least privileged first (`isolated`,
/// `shared`, `host`; external ones only where `allowed_targets` names
/// them). `engine` says whether a container engine runs here.
pub fn available(cfg: &Value, settings: &Settings, engine: bool) -> Vec<String> {
    let c = &cfg["compute"];
    let mut built = Vec::new();
    if engine && c["enabled"] == true {
        built.push("isolated".to_string());
    }
    if engine {
        built.push("shared".to_string());
    }
    if c["host_access"] == true && settings.host.enabled {
        built.push("host".to_string());
    }
    let Some(allowed) = c["allowed_targets"].as_array() else { return built };
    let mut out: Vec<String> = Vec::new();
    for t in allowed.iter().filter_map(Value::as_str) {
        let ok = built.iter().any(|b| b == t) || (engine && settings.external.iter().any(|e| e.alias == t));
        if ok && !out.iter().any(|o| o == t) {
            out.push(t.to_string());
        }
    }
    out
}

/// Which target a call means (`asked`, else `default_target`, else the
/// least privileged available), or why none may serve it.
pub fn resolve(
    cfg: &Value,
    settings: &Settings,
    engine: Result<(), String>,
    asked: Option<&str>,
) -> Result<Target, String> {
    let c = &cfg["compute"];
    let avail = available(cfg, settings, engine.is_ok());
    let want = match asked.filter(|t| !t.is_empty()) {
        Some(t) => t.to_string(),
        None => match c["default_target"].as_str().filter(|t| !t.is_empty()) {
            Some(t) => t.to_string(),
            None => avail.first().cloned().ok_or_else(|| {
                let containers = match &engine {
                    Err(e) => format!("no container engine runs here ({e})"),
                    Ok(()) => "this agent's compute.allowed_targets names none that is available".into(),
                };
                let host = if c["host_access"] != true {
                    "this agent has no host access (compute.host_access)"
                } else {
                    "host commands are switched off for this install (the owner runs `adf compute host on`)"
                };
                format!("No compute environment available: {containers}, and {host}")
            })?,
        },
    };
    if avail.contains(&want) {
        return Ok(match want.as_str() {
            "host" => Target::Host,
            "isolated" => Target::Isolated,
            "shared" => Target::Shared,
            alias => match settings.external.iter().find(|e| e.alias == alias) {
                Some(e) => Target::External(e.clone()),
                None => return Err(format!("unknown compute target '{alias}'")),
            },
        });
    }
    let hint = match want.as_str() {
        "host" if c["host_access"] != true => "compute.host_access is off for this agent".to_string(),
        "host" => "host commands are switched off for this install (settings.json compute.host.enabled; the owner runs `adf compute host on`)".to_string(),
        "isolated" | "shared" => match &engine {
            Err(e) => format!("no container engine runs here: {e}"),
            Ok(()) if want == "isolated" && c["enabled"] != true => "compute.enabled is off for this agent (it has no container of its own)".to_string(),
            Ok(()) => "this agent's compute.allowed_targets does not name it".to_string(),
        },
        alias if settings.external.iter().any(|e| e.alias == alias) => match &engine {
            Err(e) => format!("no container engine runs here: {e}"),
            Ok(()) => "this agent's compute.allowed_targets does not name it".to_string(),
        },
        _ => "no such target (host, isolated, shared, or an external container the owner registered with `adf compute external add`)".to_string(),
    };
    let list = if avail.is_empty() { "none".to_string() } else { avail.join(", ") };
    Err(format!("Target '{want}' is not available: {hint}. Available: {list}."))
}

/// The agent stopped: its dedicated container stops, its processes in the
/// shared one are killed, its browser and desktop close.
/// (`containers::get().settle()` waits for the container stops.)
pub fn release(agent_id: &str) {
    containers::get().release(agent_id);
    // The browser closes (its profile written) before its display goes.
    match browser::stop(agent_id) {
        Some(closing) => {
            let agent = agent_id.to_string();
            if let Ok(h) = tokio::runtime::Handle::try_current() {
                containers::get().track(h.spawn(async move {
                    let _ = closing.await;
                    display::stop(&agent);
                }));
            } else {
                display::stop(agent_id);
            }
        }
        None => display::stop(agent_id),
    }
}

/// The agent's working folder on the host (made on first use).
pub fn workspace(agent_id: &str) -> PathBuf {
    crate::paths::data_dir().join("workspaces").join(agent_id)
}

/// The programs a command starts, read with the shell grammar; `Err` says
/// what cannot be read safely.
pub fn programs(command: &str) -> Result<Vec<String>, String> {
    use crate::runtime::shell::parse::{self, Redir};
    let script = parse::parse(command)?;
    let mut out = Vec::new();
    for (_, pipeline) in &script {
        for cmd in &pipeline.cmds {
            let words = cmd.words.iter().chain(cmd.assigns.iter().map(|(_, v)| v));
            let redirects = cmd.redirects.iter().map(|r| match r {
                Redir::In(t) | Redir::Out { target: t, .. } | Redir::Both { target: t, .. } | Redir::HereString(t) => {
                    t.as_str()
                }
                Redir::Here { body, expand } => {
                    if *expand {
                        body.as_str()
                    } else {
                        ""
                    }
                }
                Redir::Dup { .. } => "",
            });
            for w in words.map(String::as_str).chain(redirects) {
                if w.contains("$(") || w.contains('`') {
                    return Err(
                        "command substitution (`$(…)` or backquotes) runs programs that cannot be checked".into()
                    );
                }
            }
            // Variables that make an approved program load or run other code.
            let setting =
                cmd.assigns.iter().map(|(n, _)| n.as_str()).chain(match cmd.words.first().map(String::as_str) {
                    Some("export" | "unset" | "declare" | "readonly" | "local") => {
                        cmd.words[1..].iter().map(|w| w.split('=').next().unwrap_or("")).collect::<Vec<_>>()
                    }
                    _ => Vec::new(),
                });
            for name in setting {
                if code_variable(name) {
                    return Err(format!("setting {name} would let a program run code nobody approved"));
                }
            }
            let Some(first) = cmd.words.first() else { continue };
            if first.chars().any(|c| matches!(c, '$' | '*' | '?' | '[' | '{' | '~' | '\\' | '"' | '\'')) && first != "["
            {
                return Err(format!("{first:?}: a program name must be written out, not computed or quoted"));
            }
            if OPAQUE.contains(&first.as_str()) {
                return Err(format!("`{first}` runs what cannot be checked; write the program itself"));
            }
            out.push(first.clone());
        }
    }
    Ok(out)
}

/// A variable that makes programs load or run other code: the dynamic
/// loader's, the shell's start-up and search path, and the usual hooks of
/// git, ssh, editors and language runtimes.
fn code_variable(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    n.starts_with("LD_")
        || n.starts_with("DYLD_")
        || n.starts_with("GIT_")
        || n.ends_with("_COMMAND")
        || matches!(
            n.as_str(),
            "PATH"
                | "BASH_ENV"
                | "ENV"
                | "IFS"
                | "SHELLOPTS"
                | "BASHOPTS"
                | "PS4"
                | "CDPATH"
                | "EDITOR"
                | "VISUAL"
                | "PAGER"
                | "SHELL"
                | "PYTHONPATH"
                | "PYTHONSTARTUP"
                | "PYTHONHOME"
                | "NODE_OPTIONS"
                | "NODE_PATH"
                | "PERL5OPT"
                | "PERL5LIB"
                | "RUBYOPT"
                | "RUBYLIB"
                | "MAKEFLAGS"
                | "SSH_ASKPASS"
                | "HOME"
                | "XDG_CONFIG_HOME"
        )
}

/// May this command run on the host under `policy`? The programs it would
/// start must each be approved (builtins aside); a path must be approved
/// as written.
pub fn check_host(policy: &HostPolicy, command: &str) -> Result<(), String> {
    let progs = programs(command)?;
    for p in progs {
        if BUILTINS.contains(&p.as_str()) || policy.programs.contains(&p) {
            continue;
        }
        return Err(format!(
            "`{p}` is not an approved host program (approved: {}); the owner approves one with `adf compute host allow {p}`",
            if policy.programs.is_empty() { "none".to_string() } else { policy.programs.join(", ") }
        ));
    }
    Ok(())
}

/// A relative path with only plain parts (`fs_transfer`), else why not.
pub fn relative(path: &str) -> Result<PathBuf, String> {
    let p = Path::new(path.trim_start_matches("./"));
    if path.trim().is_empty() {
        return Err("path is empty".into());
    }
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return Err(format!("\"{path}\" must stay inside the workspace (no `..`, no absolute path)")),
        }
    }
    if out.as_os_str().is_empty() {
        return Err("path is empty".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_read_with_the_shell_grammar() {
        assert_eq!(programs("git status && ls -la | wc -l; echo done > out.txt").unwrap(), ["git", "ls", "wc", "echo"]);
        assert_eq!(programs("FOO=1 make -j2 2>&1").unwrap(), ["make"]);
        for bad in [
            "echo $(rm -rf /)",
            "ls `id`",
            "$PROG --help",
            "\"git\" status",
            "eval 'rm x'",
            "exec rm x",
            "bash -c 'rm x'",
            "cat <(ls)",
            "if true; then ls; fi",
            "(ls)",
            "echo hi > $(whoami)",
            "LD_PRELOAD=./x.so git status",
            "PATH=./bin git status",
            "export LD_PRELOAD=./x.so; git status",
            "export PATH=.:$PATH && git log",
            "GIT_SSH_COMMAND='sh -c id' git fetch",
            "BASH_ENV=./rc make",
        ] {
            assert!(programs(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn only_approved_programs_and_harmless_builtins_run() {
        let p = HostPolicy { enabled: true, programs: vec!["git".into(), "/opt/tool/run".into()] };
        assert!(check_host(&p, "cd repo && git log -1 && echo ok").is_ok());
        assert!(check_host(&p, "/opt/tool/run --x").is_ok());
        let e = check_host(&p, "git status | grep x").unwrap_err();
        assert!(
            e.contains("`grep` is not an approved host program") && e.contains("adf compute host allow grep"),
            "{e}"
        );
        assert!(check_host(&p, "/usr/bin/git status").is_err(), "a path is approved only as written");
        assert!(check_host(&p, "./git status").is_err());
    }

    #[test]
    fn targets_resolve_least_privileged_first_and_fail_closed() {
        let ext = External { alias: "dev".into(), container: "c".into(), engine: None, workspace: None, user: None };
        let on = Settings {
            host: HostPolicy { enabled: true, programs: vec![] },
            external: vec![ext.clone()],
            ..Default::default()
        };
        let cfg = |c: Value| serde_json::json!({"compute": c});
        let none = || Err("absent".to_string());
        let all = cfg(serde_json::json!({"enabled": true, "host_access": true}));
        assert_eq!(available(&all, &on, true), ["isolated", "shared", "host"]);
        assert_eq!(resolve(&all, &on, Ok(()), None), Ok(Target::Isolated));
        assert_eq!(resolve(&all, &on, Ok(()), Some("host")), Ok(Target::Host));
        // No engine: never redirected onto the host.
        let e = resolve(&all, &on, none(), Some("shared")).unwrap_err();
        assert!(
            e.contains("Target 'shared' is not available: no container engine runs here: absent")
                && e.ends_with("Available: host."),
            "{e}"
        );
        assert_eq!(resolve(&all, &on, none(), None), Ok(Target::Host));
        // A default that is unavailable is an error, not the next one.
        let d = cfg(serde_json::json!({"host_access": true, "default_target": "isolated"}));
        assert!(resolve(&d, &on, Ok(()), None).unwrap_err().contains("compute.enabled is off"));
        // External targets only where allowed_targets names them.
        assert!(
            resolve(&cfg(serde_json::json!({})), &on, Ok(()), Some("dev"))
                .unwrap_err()
                .contains("allowed_targets does not name it")
        );
        let a = cfg(serde_json::json!({"allowed_targets": ["dev", "host", "dev"]}));
        assert_eq!(available(&a, &on, true), ["dev"], "host needs host_access even when listed");
        assert_eq!(resolve(&a, &on, Ok(()), None), Ok(Target::External(ext)));
        assert!(resolve(&a, &on, Ok(()), Some("shared")).unwrap_err().contains("allowed_targets does not name it"));
        let off = Settings::default();
        let e = resolve(&cfg(serde_json::json!({"host_access": true})), &off, none(), None).unwrap_err();
        assert!(e.contains("adf compute host on"), "{e}");
        assert!(
            resolve(&cfg(serde_json::json!({})), &off, Ok(()), Some("moon")).unwrap_err().contains("no such target")
        );
    }

    #[test]
    fn transfer_paths_stay_inside() {
        assert_eq!(relative("a/b.txt").unwrap(), PathBuf::from("a/b.txt"));
        assert_eq!(relative("./a").unwrap(), PathBuf::from("a"));
        for bad in ["../x", "/etc/passwd", "a/../../x", "", "."] {
            assert!(relative(bad).is_err(), "{bad:?}");
        }
    }
}
