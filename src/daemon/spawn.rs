//! `adf --daemon`: start a daemon for the fleet in the background, in a
//! session of its own (so neither a closed terminal nor a dropped SSH
//! connection reaches it), and say where it listens once it does. The app
//! then attaches to it, and closing the app never stops the agents.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Whether the owner asked for the app to run its fleet in a daemon
/// (`"daemon": true` in settings.json).
pub fn wanted_by_settings() -> bool {
    crate::providers::accounts::load().is_ok_and(|s| s.extra.get("daemon").and_then(|v| v.as_bool()) == Some(true))
}

/// Start `adf daemon` for `fleet_dir` (and the folders and files named),
/// detached; its URL once it answers. Its log goes to `daemon.log` in the
/// config folder.
pub fn start(fleet_dir: &Path, paths: &[PathBuf]) -> anyhow::Result<String> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()?;
    let log_path = crate::paths::config_dir().join("daemon.log");
    if let Some(p) = log_path.parent() {
        std::fs::create_dir_all(p)?;
    }
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["daemon", "--port", "0"])
        .args(paths)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    // SAFETY: setsid is async-signal-safe and touches nothing of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(url) = super::discover(fleet_dir) {
            return Ok(url);
        }
        if let Some(status) = child.try_wait()? {
            let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
            let last = tail.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
            anyhow::bail!("the background daemon exited ({status}): {last} (log: {})", log_path.display());
        }
        if Instant::now() > deadline {
            anyhow::bail!("the background daemon did not start within 15 s (log: {})", log_path.display());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}
