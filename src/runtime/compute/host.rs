//! Host commands (`compute_exec` with `target: "host"`): bash in the agent's
//! own working folder, an environment stripped of secrets, a process group
//! of its own killed whole on timeout (exit 124) or when the call is
//! dropped, each output stream kept to `OUTPUT_CAP`. The checks that decide
//! whether a command may run at all are in `mod.rs`.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use super::{OUTPUT_CAP, workspace};

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

/// `capped` for a stream that may not be there.
pub(super) async fn capped_opt(r: Option<impl tokio::io::AsyncRead + Unpin>) -> (Vec<u8>, bool) {
    match r {
        Some(r) => capped(r).await,
        None => (Vec::new(), false),
    }
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
    // Programs it starts appear on the agent's desktop, when it has one.
    env.extend(super::display::env_for(agent_id));
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
    let read_out = tokio::spawn(capped_opt(out));
    let read_err = tokio::spawn(capped_opt(err));
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
