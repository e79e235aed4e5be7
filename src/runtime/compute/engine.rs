//! The container engine on this machine: Podman or Docker, found once per
//! process and asked through its own CLI (its API answers the same
//! questions but would need a client for each engine). Podman is tried
//! first; Docker only counts when its server answers (a bare client is no
//! engine). On a kernel with cgroup v1 and v2 mounted side by side (hybrid)
//! crun cannot run containers, so runc is used there when it is installed:
//! the decision comes from the engine's own report and the kernel's
//! mounts, not from an error message.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Podman,
    Docker,
}

/// A container's state in the engine's records (Podman's and Docker's
/// status words). The record can outlive the truth: a container whose
/// processes were killed from outside stays `running` with a dead pid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Absent,
    /// Running, with its main process as the host sees it (0: unknown).
    Running(u32),
    /// Made or exited: `start` starts it.
    Startable,
    Paused,
    /// Between states (`stopping`, `removing`, `restarting`) or broken
    /// (`dead`, a word this code does not know).
    Other(String),
}

impl State {
    fn parse(out: &str) -> State {
        let mut f = out.split_whitespace();
        let status = f.next().unwrap_or_default().to_ascii_lowercase();
        let pid = f.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        match status.as_str() {
            "running" => State::Running(pid),
            "created" | "configured" | "initialized" | "exited" | "stopped" => State::Startable,
            "paused" => State::Paused,
            _ => State::Other(status),
        }
    }
}

/// Whether a process of this machine is alive: there, and not a zombie
/// (a container's main process killed with its monitor stays one, with no
/// namespaces left to enter).
pub fn alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|st| st != "Z" && st != "X"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        // No /proc to read: the kernel says whether it is there.
        Err(_) => {
            let Ok(pid) = i32::try_from(pid) else { return false };
            // SAFETY: signal 0 only checks that the process exists.
            let r = unsafe { libc::kill(pid, 0) };
            r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
        }
    }
}

#[derive(Debug, Clone)]
pub struct Engine {
    pub kind: Kind,
    pub program: PathBuf,
    /// Global arguments before every subcommand (`--runtime runc`).
    pub global: Vec<String>,
    pub version: String,
}

/// A failed probe is tried again after this long.
const RETRY: Duration = Duration::from_secs(30);

/// When it was probed, for which choice, and what was found.
type Probe = (Instant, Option<String>, Result<Engine, String>);

static FOUND: Mutex<Option<Probe>> = Mutex::new(None);

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The engine `choice` names (`podman`, `docker`, a path to either, `none`),
/// or the first that runs here. Cached per process; a failure is probed
/// again after 30 s.
pub async fn detect(choice: Option<&str>) -> Result<Engine, String> {
    let key = choice.map(str::to_string);
    if let Ok(g) = FOUND.lock()
        && let Some((at, k, r)) = &*g
        && *k == key
        && (r.is_ok() || at.elapsed() < RETRY)
    {
        return r.clone();
    }
    let r = probe(choice).await;
    if let Ok(mut g) = FOUND.lock() {
        *g = Some((Instant::now(), key, r.clone()));
    }
    r
}

/// Whether the last probe found an engine (`None`: none was made yet).
pub fn cached_ok() -> Option<bool> {
    FOUND.lock().ok()?.as_ref().map(|(_, _, r)| r.is_ok())
}

async fn probe(choice: Option<&str>) -> Result<Engine, String> {
    let candidates: Vec<PathBuf> = match choice {
        Some("none") => {
            return Err(
                "containers are switched off for this install (settings.json compute.engine is \"none\")".into()
            );
        }
        Some(c) if c.contains('/') => vec![PathBuf::from(c)],
        Some(c @ ("podman" | "docker")) => on_path(c).into_iter().collect(),
        Some(other) => {
            return Err(format!("settings.json compute.engine {other:?} is not podman, docker, a path or none"));
        }
        None => ["podman", "docker"].iter().filter_map(|n| on_path(n)).collect(),
    };
    if candidates.is_empty() {
        return Err(match choice {
            Some(c) => format!("{c} is not installed (not on PATH)"),
            None => "neither Podman nor Docker is installed (apt-get install podman)".into(),
        });
    }
    let mut why = Vec::new();
    for program in candidates {
        let podman = program.file_name().is_some_and(|n| n.to_string_lossy().contains("podman"));
        let r = if podman { probe_podman(&program).await } else { probe_docker(&program).await };
        match r {
            Ok(e) => return Ok(e),
            Err(e) => why.push(format!("{}: {e}", program.display())),
        }
    }
    Err(why.join("; "))
}

async fn output(program: &Path, args: &[&str], limit: Duration) -> Result<String, String> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).stdin(std::process::Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(limit, cmd.output())
        .await
        .map_err(|_| format!("no answer in {} s", limit.as_secs()))?
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("failed").trim().to_string())
    }
}

async fn probe_podman(program: &Path) -> Result<Engine, String> {
    let info: Value =
        serde_json::from_str(&output(program, &["info", "--format", "json"], Duration::from_secs(20)).await?)
            .map_err(|e| format!("podman info is not JSON: {e}"))?;
    let host = &info["host"];
    let runtime = host["ociRuntime"]["name"].as_str().unwrap_or_default();
    let mut global = Vec::new();
    // crun refuses a hybrid cgroup layout (v1 controllers beside a v2
    // mount); runc takes it.
    if runtime == "crun"
        && host["cgroupVersion"] == "v1"
        && hybrid_cgroups()
        && let Some(runc) = on_path("runc")
    {
        global = vec!["--runtime".into(), runc.to_string_lossy().into_owned()];
    }
    let version = info["version"]["Version"].as_str().unwrap_or("?").to_string();
    Ok(Engine { kind: Kind::Podman, program: program.to_path_buf(), global, version })
}

/// cgroup v1 controllers with the v2 hierarchy mounted beside them.
fn hybrid_cgroups() -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else { return false };
    let (mut v1, mut v2) = (false, false);
    for l in mounts.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.get(2) {
            Some(&"cgroup") => v1 = true,
            Some(&"cgroup2") => v2 = true,
            _ => {}
        }
    }
    v1 && v2
}

async fn probe_docker(program: &Path) -> Result<Engine, String> {
    let v = output(program, &["version", "--format", "{{.Server.Version}}"], Duration::from_secs(10))
        .await
        .map_err(|e| format!("the Docker server does not answer ({e})"))?;
    let version = v.trim().to_string();
    if version.is_empty() {
        return Err("the Docker server does not answer".into());
    }
    Ok(Engine { kind: Kind::Docker, program: program.to_path_buf(), global: Vec::new(), version })
}

impl Engine {
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Podman => "podman",
            Kind::Docker => "docker",
        }
    }

    /// A command for the engine with its global arguments.
    pub fn command(&self) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.program);
        c.args(&self.global).stdin(std::process::Stdio::null()).kill_on_drop(true);
        c
    }

    /// Run a subcommand; its stdout, or its last line of stderr.
    pub async fn run(&self, args: &[&str], limit: Duration) -> Result<String, String> {
        let mut c = self.command();
        c.args(args);
        self.finish(c, args, limit).await
    }

    /// Like `run`, for a command that changes a container's state (start,
    /// stop, remove, commit): it is not killed when the caller gives up or
    /// its process group is signalled, since Podman 4 leaves a container it
    /// was stopping marked `stopping` for good when its stop is killed.
    pub async fn run_through(&self, args: &[&str], limit: Duration) -> Result<String, String> {
        let mut c = self.command();
        c.kill_on_drop(false).process_group(0).args(args);
        self.finish(c, args, limit).await
    }

    async fn finish(&self, mut c: tokio::process::Command, args: &[&str], limit: Duration) -> Result<String, String> {
        let what = args.first().unwrap_or(&"");
        let out = tokio::time::timeout(limit, c.output())
            .await
            .map_err(|_| format!("{} {what} gave no answer in {} s", self.name(), limit.as_secs()))?
            .map_err(|e| format!("cannot run {}: {e}", self.program.display()))?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("failed").trim();
        Err(format!("{} {what}: {last}", self.name()))
    }

    /// The container's state as the engine records it.
    pub async fn status(&self, name: &str) -> Result<State, String> {
        let mut c = self.command();
        c.args(["container", "inspect", "--format", "{{.State.Status}} {{.State.Pid}}", name]);
        let out = tokio::time::timeout(Duration::from_secs(20), c.output())
            .await
            .map_err(|_| format!("{} container inspect gave no answer", self.name()))?
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Ok(State::Absent);
        }
        Ok(State::parse(&String::from_utf8_lossy(&out.stdout)))
    }

    /// Is the container there, and running (as recorded)? `None` when
    /// there is none.
    pub async fn state(&self, name: &str) -> Result<Option<bool>, String> {
        Ok(match self.status(name).await? {
            State::Absent => None,
            State::Running(_) => Some(true),
            _ => Some(false),
        })
    }

    pub async fn image_exists(&self, image: &str) -> bool {
        let mut c = self.command();
        c.args(["image", "inspect", "--format", "{{.Id}}", image])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        matches!(tokio::time::timeout(Duration::from_secs(20), c.status()).await, Ok(Ok(s)) if s.success())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_words_of_both_engines_are_read() {
        assert_eq!(State::parse("running 4242\n"), State::Running(4242));
        assert_eq!(State::parse("Exited 0"), State::Startable);
        assert_eq!(State::parse("configured 0"), State::Startable);
        assert_eq!(State::parse("paused 12"), State::Paused);
        assert_eq!(State::parse("stopping 12"), State::Other("stopping".into()));
        assert_eq!(State::parse("dead 0"), State::Other("dead".into()));
        assert_eq!(State::parse(""), State::Other(String::new()));
    }

    #[test]
    fn a_process_is_alive_until_it_is_reaped() {
        assert!(alive(std::process::id()));
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        // Ended but not reaped: a zombie is not alive.
        while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z")) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!alive(pid), "a zombie");
        c.wait().unwrap();
        assert!(!alive(pid));
        assert!(!alive(0));
        assert!(!alive(u32::MAX));
    }

    #[tokio::test]
    async fn a_named_engine_that_is_absent_or_switched_off_is_an_error() {
        let e = probe(Some("none")).await.unwrap_err();
        assert!(e.contains("switched off"), "{e}");
        let e = probe(Some("/nonexistent/podman")).await.unwrap_err();
        assert!(e.contains("/nonexistent/podman"), "{e}");
        let e = probe(Some("kubectl")).await.unwrap_err();
        assert!(e.contains("not podman, docker"), "{e}");
    }
}
