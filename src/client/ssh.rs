//! `ssh://[user@]host[:port]` remotes (issue 23): the daemon on a machine
//! reached over SSH, with the owner's own `ssh` (their `~/.ssh/config`, keys
//! and agent). One master connection asks the far side where its fleet's
//! daemon listens and for its token (the files `adf daemon` writes there:
//! `.daemon.json` and `daemon-token`, under `ADF_HOME` when the session
//! has it, else the XDG folders), then a local port is forwarded to that
//! daemon over the same connection (`ssh -O forward`). The tunnel lasts as
//! long as the [`Tunnel`] value; dropping it closes the connection.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// What the far side runs: the daemon's record, then its token, each on a
/// line, then it waits (the connection stays while our stdin is open).
const REMOTE: &str = r#"d="${ADF_HOME:+$ADF_HOME/data/agents}"; d="${d:-${XDG_DATA_HOME:-$HOME/.local/share}/adf/agents}"; c="${ADF_HOME:+$ADF_HOME/config}"; c="${c:-${XDG_CONFIG_HOME:-$HOME/.config}/adf}"; cat "$d/.daemon.json" 2>/dev/null; echo; cat "$c/daemon-token" 2>/dev/null; echo; exec cat >/dev/null"#;

/// How long the first answer may take (a password prompt is refused:
/// BatchMode).
const CONNECT: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error("{0:?} is not ssh://[user@]host[:port]")]
    BadUrl(String),
    #[error("ssh: {0}")]
    Spawn(String),
    #[error("ssh to {host} failed: {why}")]
    Failed { host: String, why: String },
    #[error("no daemon runs for the fleet on {0} (start `adf daemon` there)")]
    NoDaemon(String),
}

/// An `ssh://` URL as the ssh command's destination and port.
pub fn destination(url: &str) -> Result<(String, Option<u16>), SshError> {
    let bad = || SshError::BadUrl(url.to_string());
    let u = url::Url::parse(url).map_err(|_| bad())?;
    let host = u.host_str().filter(|h| !h.is_empty() && u.scheme() == "ssh").ok_or_else(bad)?;
    if !matches!(u.path(), "" | "/") || u.query().is_some() || u.password().is_some() {
        return Err(bad());
    }
    // Only what ssh itself would take as a user and host: never an option.
    let safe = |s: &str| !s.starts_with('-') && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-[]:".contains(&b));
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let user = u.username();
    if !safe(host) || (!user.is_empty() && !safe(user)) {
        return Err(bad());
    }
    let dest = if user.is_empty() { host.to_string() } else { format!("{user}@{host}") };
    Ok((dest, u.port()))
}

/// A live tunnel to a remote daemon.
pub struct Tunnel {
    master: Child,
    control: PathBuf,
    dest: String,
    /// `http://127.0.0.1:<local port>`.
    pub url: String,
    /// The far daemon's own address (`127.0.0.1:<its port>`), the `Host`
    /// it answers to.
    pub host: String,
    pub token: Option<String>,
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        let _ = Command::new("ssh")
            .arg("-S")
            .arg(&self.control)
            .args(["-O", "exit", &self.dest])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.master.kill();
        let _ = self.master.wait();
        let _ = std::fs::remove_file(&self.control);
    }
}

fn ssh_base(control: &std::path::Path, port: Option<u16>) -> Command {
    let mut c = Command::new("ssh");
    c.arg("-S").arg(control).args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=15"]);
    if let Some(p) = port {
        c.args(["-p", &p.to_string()]);
    }
    c
}

/// Open the connection, read the daemon's address and token, forward a
/// local port to it.
pub fn open(url: &str) -> Result<Tunnel, SshError> {
    let (dest, port) = destination(url)?;
    // The master's control socket: private to this process (ssh makes it
    // 0600), short enough for a socket path.
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let control = std::env::temp_dir().join(format!("adf-ssh-{}-{n}", std::process::id()));
    let _ = std::fs::remove_file(&control);
    let mut master = ssh_base(&control, port)
        .args(["-M", "-o", "ControlPersist=no", "--", &dest, REMOTE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| SshError::Spawn(e.to_string()))?;
    let failed = |master: &mut Child, why: String| {
        let _ = master.kill();
        let _ = master.wait();
        let _ = std::fs::remove_file(&control);
        SshError::Failed { host: dest.clone(), why }
    };
    // The two lines, read on a thread so a silent host times out.
    let stdout = master.stdout.take().ok_or_else(|| SshError::Spawn("no stdout".into()))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let (mut info, mut token) = (String::new(), String::new());
        let ok = r.read_line(&mut info).is_ok_and(|n| n > 0) && r.read_line(&mut token).is_ok_and(|n| n > 0);
        let _ = tx.send(ok.then_some((info, token)));
    });
    let (info, token) = match rx.recv_timeout(CONNECT) {
        Ok(Some(lines)) => lines,
        Ok(None) | Err(_) => {
            let _ = master.kill();
            let mut err = String::new();
            if let Some(mut e) = master.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            let why = err.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("no answer").trim().to_string();
            return Err(failed(&mut master, why));
        }
    };
    let info: serde_json::Value = match serde_json::from_str(info.trim()) {
        Ok(v) => v,
        Err(_) => {
            let _ = failed(&mut master, String::new());
            return Err(SshError::NoDaemon(dest));
        }
    };
    let far_port = info["port"].as_u64().and_then(|p| u16::try_from(p).ok()).filter(|p| *p > 0);
    let Some(far_port) = far_port else {
        let _ = failed(&mut master, String::new());
        return Err(SshError::NoDaemon(dest));
    };
    let local = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| failed(&mut master, format!("no local port: {e}")))?
        .port();
    let fwd = ssh_base(&control, port)
        .args(["-O", "forward", "-L", &format!("127.0.0.1:{local}:127.0.0.1:{far_port}"), "--", &dest])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| failed(&mut master, e.to_string()))?;
    if !fwd.status.success() {
        let why = format!("forwarding a port: {}", String::from_utf8_lossy(&fwd.stderr).trim());
        return Err(failed(&mut master, why));
    }
    let token = Some(token.trim().to_string()).filter(|t| !t.is_empty());
    Ok(Tunnel {
        master,
        control,
        dest,
        url: format!("http://127.0.0.1:{local}"),
        host: format!("127.0.0.1:{far_port}"),
        token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_are_user_and_host_and_never_an_option() {
        assert_eq!(destination("ssh://box").unwrap(), ("box".into(), None));
        assert_eq!(destination("ssh://me@box.tail0.ts.net:2222").unwrap(), ("me@box.tail0.ts.net".into(), Some(2222)));
        assert_eq!(destination("ssh://[fd00::1]:22").unwrap(), ("fd00::1".into(), Some(22)));
        for bad in ["ssh://-oProxyCommand=x", "ssh://box/path", "ssh://a:b@box", "http://box", "ssh://", "ssh://bo%20x"]
        {
            assert!(destination(bad).is_err(), "{bad:?}");
        }
    }
}
