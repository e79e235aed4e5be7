//! Real computers, the host target (issue 22, tools.md `compute_exec` and
//! `fs_transfer`): an agent runs commands on this machine only when two
//! switches agree — its own `compute.host_access` and the install's
//! `compute.host` in `settings.json` (`enabled`, and `programs`, the
//! programs the owner approved). Every program a command would start is read
//! from it with a real shell grammar (brush's, as `adf_shell` reads its
//! scripts) and must be approved; what the grammar cannot pin down
//! (command substitution, a computed program name, `eval`, `exec`, compound
//! commands) is refused. The command then runs in bash in the agent's own
//! working folder with an environment stripped of secrets, in a process
//! group of its own that is killed whole on timeout (exit 124) or when the
//! call is dropped, and each output stream is kept to 512 KiB.

use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

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

/// Kills a process group when dropped (a call dropped mid-run, a timeout).
struct Group(Option<u32>);

impl Drop for Group {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(pid) = self.0.take() {
            // SAFETY: a plain kill(2) of the group we made; a group that is
            // gone already gets ESRCH, which is fine.
            unsafe {
                libc::kill(-(pid as i32), libc::SIGKILL);
            }
        }
    }
}

/// Read a stream to its end, keeping the first `OUTPUT_CAP` bytes.
async fn capped(mut r: impl tokio::io::AsyncRead + Unpin) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    let mut truncated = false;
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = OUTPUT_CAP.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                truncated |= n > room;
            }
        }
    }
    (kept, truncated)
}

/// The environment a host command gets: enough to find programs and keep
/// the user's own tool settings (`HOME`), no secrets.
fn environment(agent_id: &str) -> Vec<(String, String)> {
    let path = std::env::var("PATH")
        .unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into())
        .split(':')
        .filter(|p| !p.is_empty() && *p != "." && Path::new(p).is_absolute())
        .collect::<Vec<_>>()
        .join(":");
    let mut env =
        vec![("PATH".to_string(), path), ("TERM".into(), "dumb".into()), ("ADF_AGENT_ID".into(), agent_id.into())];
    for k in ["HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ"] {
        if let Ok(v) = std::env::var(k) {
            env.push((k.to_string(), v));
        }
    }
    env
}

/// Run a checked command on the host: `{target, exit_code, [timed_out,
/// timeout_ms], stdout, stderr, [stdout_truncated, stderr_truncated]}`.
pub async fn run_host(agent_id: &str, command: &str, timeout: Duration) -> Result<Value, String> {
    let dir = workspace(agent_id);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut cmd = tokio::process::Command::new("bash");
    cmd.args(["--noprofile", "--norc", "-c", command])
        .current_dir(&dir)
        .env_clear()
        .envs(environment(agent_id))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    #[cfg(unix)]
    cmd.process_group(0);
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("cannot start bash: {e}"))?;
    let group = Group(child.id());
    let (out, err) = (child.stdout.take(), child.stderr.take());
    let read_out = tokio::spawn(async move {
        match out {
            Some(o) => capped(o).await,
            None => (Vec::new(), false),
        }
    });
    let read_err = tokio::spawn(async move {
        match err {
            Some(e) => capped(e).await,
            None => (Vec::new(), false),
        }
    });
    let status = tokio::time::timeout(timeout, child.wait()).await;
    let timed_out = status.is_err();
    // The whole group goes: what the command left behind too.
    drop(group);
    let code = match status {
        Ok(Ok(s)) => s.code().unwrap_or(128 + unix_signal(&s)),
        Ok(Err(e)) => return Err(format!("waiting for the command: {e}")),
        Err(_) => {
            let _ = child.kill().await;
            124
        }
    };
    let ((stdout, out_cut), (stderr, err_cut)) =
        (read_out.await.unwrap_or_default(), read_err.await.unwrap_or_default());
    let mut v = json!({"target": "host", "exit_code": code, "stdout": String::from_utf8_lossy(&stdout),
        "stderr": String::from_utf8_lossy(&stderr), "duration_ms": started.elapsed().as_millis() as u64});
    if timed_out {
        v["timed_out"] = json!(true);
        v["timeout_ms"] = json!(timeout.as_millis() as u64);
    }
    if out_cut {
        v["stdout_truncated"] = json!(true);
    }
    if err_cut {
        v["stderr_truncated"] = json!(true);
    }
    Ok(v)
}

#[cfg(unix)]
fn unix_signal(s: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.signal().unwrap_or(0)
}

#[cfg(not(unix))]
fn unix_signal(_: &std::process::ExitStatus) -> i32 {
    0
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
    fn transfer_paths_stay_inside() {
        assert_eq!(relative("a/b.txt").unwrap(), PathBuf::from("a/b.txt"));
        assert_eq!(relative("./a").unwrap(), PathBuf::from("a"));
        for bad in ["../x", "/etc/passwd", "a/../../x", "", "."] {
            assert!(relative(bad).is_err(), "{bad:?}");
        }
    }
}
