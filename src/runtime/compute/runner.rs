//! The host's end of a container's command runner (`runner.py`): one
//! `podman exec -i CONTAINER python3 -u -c RUNNER` kept open per container,
//! requests and answers as JSON lines matched by id. A new `podman exec`
//! per command costs a quarter of a second; through the runner a command
//! costs a fork. A call dropped before its answer tells the runner to kill
//! the command's process group. When the runner ends, every waiting call
//! gets that as its error and the next call starts a new one.
//!
//! The runner says when it took a request, before it starts anything. A
//! call whose runner ended before that ran nothing ([`RunError::Untaken`]),
//! so the caller may send it again to a new runner: a container killed from
//! outside costs its next command no error. A call the runner took is never
//! sent again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::oneshot;

use super::engine::Engine;

const SCRIPT: &str = include_str!("runner.py");

/// A call waiting for its answer (or for why it has none), and whether
/// the runner took it.
struct Waiting {
    tx: oneshot::Sender<Result<Value, RunError>>,
    took: bool,
}

type Pending = Arc<Mutex<HashMap<u64, Waiting>>>;

/// Why a call to the runner failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// The runner ended (or could not be written to) before it took the
    /// request: nothing of it ran, and it may be sent to a new runner.
    #[error("the command runner ended before it took the command")]
    Untaken,
    /// Anything else, the runner's own error included.
    #[error("{0}")]
    Failed(String),
}

impl From<String> for RunError {
    fn from(e: String) -> Self {
        RunError::Failed(e)
    }
}

impl From<&str> for RunError {
    fn from(e: &str) -> Self {
        RunError::Failed(e.to_string())
    }
}

impl From<RunError> for String {
    fn from(e: RunError) -> Self {
        e.to_string()
    }
}

pub struct Runner {
    /// Lines to the runner, written in order by one task (a destructor can
    /// queue a kill without waiting, and lines never interleave).
    lines: tokio::sync::mpsc::UnboundedSender<String>,
    pending: Pending,
    next: AtomicU64,
    alive: Arc<AtomicBool>,
    _child: tokio::process::Child,
}

/// One command for the runner.
#[derive(Debug, Clone, Default)]
pub struct Exec {
    pub argv: Vec<String>,
    pub cwd: String,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub env: Vec<(String, String)>,
    pub stdin: Option<Vec<u8>>,
    pub cap: usize,
    pub timeout: Duration,
    /// RLIMIT_NPROC for the command's user (0: none).
    pub nproc: u32,
}

/// What a command did.
#[derive(Debug, Clone)]
pub struct Done {
    pub exit_code: i64,
    pub timed_out: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub ms: u64,
}

/// Tells the runner to kill a command whose call was dropped.
struct KillOnDrop<'a> {
    runner: &'a Runner,
    id: Option<u64>,
}

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            if let Ok(mut p) = self.runner.pending.lock() {
                p.remove(&id);
            }
            let _ = self.runner.lines.send(format!("{}\n", json!({"op": "kill", "target": id.to_string()})));
        }
    }
}

impl Runner {
    /// Start the runner in a running container (`user` for `--user`).
    pub async fn start(engine: &Engine, container: &str, user: Option<&str>) -> Result<Arc<Runner>, String> {
        let mut c = engine.command();
        c.arg("exec").arg("-i");
        if let Some(u) = user {
            c.args(["--user", u]);
        }
        c.args([container, "python3", "-u", "-c", SCRIPT])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().map_err(|e| format!("cannot run {}: {e}", engine.program.display()))?;
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        let mut stderr = child.stderr.take().ok_or("no stderr")?;
        let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
        match ready {
            Ok(Ok(Some(l))) if serde_json::from_str::<Value>(&l).is_ok_and(|v| v["ready"] == true) => {}
            _ => {
                let _ = child.start_kill();
                let mut err = String::new();
                let _ = tokio::time::timeout(
                    Duration::from_secs(2),
                    tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut err),
                )
                .await;
                let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("it ended").trim().to_string();
                return Err(format!(
                    "the command runner did not start in {container} (it needs python3 there): {last}"
                ));
            }
        }
        let pending: Pending = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        {
            let (pending, alive) = (pending.clone(), alive.clone());
            tokio::spawn(async move {
                while let Ok(Some(l)) = lines.next_line().await {
                    let Ok(v) = serde_json::from_str::<Value>(&l) else { continue };
                    let Some(id) = v["id"].as_str().and_then(|s| s.parse::<u64>().ok()) else { continue };
                    let Ok(mut p) = pending.lock() else { break };
                    if v["took"] == true {
                        if let Some(w) = p.get_mut(&id) {
                            w.took = true;
                        }
                    } else if let Some(w) = p.remove(&id) {
                        let _ = w.tx.send(Ok(v));
                    }
                }
                alive.store(false, Ordering::SeqCst);
                // Each waiting call learns whether its request was taken.
                if let Ok(mut p) = pending.lock() {
                    for (_, w) in p.drain() {
                        let _ = w.tx.send(Err(if w.took {
                            RunError::Failed("the command runner ended while the command ran".into())
                        } else {
                            RunError::Untaken
                        }));
                    }
                }
            });
            // Its stderr is read so a chatty runner never blocks on it.
            tokio::spawn(async move {
                let mut sink = tokio::io::sink();
                let _ = tokio::io::copy(&mut stderr, &mut sink).await;
            });
        }
        let (lines_tx, mut lines_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        {
            let alive = alive.clone();
            tokio::spawn(async move {
                while let Some(l) = lines_rx.recv().await {
                    if stdin.write_all(l.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                        alive.store(false, Ordering::SeqCst);
                        break;
                    }
                }
            });
        }
        Ok(Arc::new(Runner { lines: lines_tx, pending, next: AtomicU64::new(1), alive, _child: child }))
    }

    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Send a request and wait for its answer (at most `limit`).
    async fn call(&self, mut req: Value, limit: Duration, guard: &mut KillOnDrop<'_>) -> Result<Value, RunError> {
        if !self.alive() {
            return Err(RunError::Untaken);
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        req["id"] = json!(id.to_string());
        let (tx, rx) = oneshot::channel();
        self.pending.lock().map_err(|_| "runner poisoned")?.insert(id, Waiting { tx, took: false });
        if req["op"] == "exec" {
            guard.id = Some(id);
        }
        if self.lines.send(format!("{req}\n")).is_err() {
            guard.id = None;
            return Err(RunError::Untaken);
        }
        let v = tokio::time::timeout(limit, rx)
            .await
            .map_err(|_| "the command runner did not answer in time")?
            .map_err(|_| "the command runner ended")?;
        guard.id = None;
        let v = v?;
        match v["error"].as_str() {
            Some(e) => Err(RunError::Failed(e.to_string())),
            None => Ok(v),
        }
    }

    /// Run one command; killed with its group at its timeout or when this
    /// future is dropped.
    pub async fn exec(&self, e: &Exec) -> Result<Done, RunError> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let env: serde_json::Map<String, Value> = e.env.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        // No env or cwd: the container's own (an external container).
        let env = if e.env.is_empty() { Value::Null } else { Value::Object(env) };
        let cwd = if e.cwd.is_empty() { Value::Null } else { json!(e.cwd) };
        let mut req = json!({"op": "exec", "argv": e.argv, "cwd": cwd, "env": env, "cap": e.cap,
            "timeout_ms": e.timeout.as_millis() as u64, "nproc": e.nproc});
        if let (Some(u), Some(g)) = (e.uid, e.gid) {
            req["uid"] = json!(u);
            req["gid"] = json!(g);
        }
        if let Some(s) = &e.stdin {
            req["stdin"] = json!(b64.encode(s));
        }
        let mut guard = KillOnDrop { runner: self, id: None };
        // The runner keeps the deadline; this one only catches a runner
        // that stopped answering.
        let v = self.call(req, e.timeout + Duration::from_secs(15), &mut guard).await?;
        let bytes = |k: &str| b64.decode(v[k].as_str().unwrap_or_default()).unwrap_or_default();
        Ok(Done {
            exit_code: v["exit"].as_i64().unwrap_or(-1),
            timed_out: v["timed_out"] == true,
            stdout: bytes("stdout"),
            stderr: bytes("stderr"),
            stdout_truncated: v["stdout_truncated"] == true,
            stderr_truncated: v["stderr_truncated"] == true,
            ms: v["ms"].as_u64().unwrap_or(0),
        })
    }

    /// Make a folder owned by `uid` with `mode` (and a passwd line for
    /// `user` when given).
    pub async fn prepare(&self, path: &str, uid: u32, gid: u32, mode: u32, user: Option<&str>) -> Result<(), RunError> {
        let mut guard = KillOnDrop { runner: self, id: None };
        let req = json!({"op": "prepare", "path": path, "uid": uid, "gid": gid, "mode": mode, "name": user});
        self.call(req, Duration::from_secs(30), &mut guard).await.map(|_| ())
    }

    /// Kill every process of a user (an agent of the shared container
    /// stopped); how many there were.
    pub async fn kill_user(&self, uid: u32) -> Result<u64, RunError> {
        let mut guard = KillOnDrop { runner: self, id: None };
        let v = self.call(json!({"op": "killuid", "uid": uid}), Duration::from_secs(30), &mut guard).await?;
        Ok(v["killed"].as_u64().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::compute::engine::Kind;

    /// An "engine" whose `exec -i CONTAINER …` runs `body` on this machine.
    fn fake(dir: &std::path::Path, body: &str) -> Engine {
        let program = dir.join("engine");
        std::fs::write(&program, format!("#!/bin/sh\nshift 3\n{body}\n")).unwrap();
        std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        Engine { kind: Kind::Podman, program, global: Vec::new(), version: "test".into() }
    }

    fn command(argv: &[&str], timeout: Duration) -> Exec {
        Exec { argv: argv.iter().map(|s| s.to_string()).collect(), cap: 1 << 16, timeout, ..Default::default() }
    }

    #[tokio::test]
    async fn a_runner_that_ends_before_taking_a_command_ran_nothing() {
        let dir = tempfile::tempdir().unwrap();
        // Ready, then gone as the first request arrives: nothing was taken.
        let e = fake(dir.path(), "echo '{\"ready\":true}'; read l; exit 0");
        let r = Runner::start(&e, "c", None).await.unwrap();
        let err = r.exec(&command(&["true"], Duration::from_secs(5))).await.unwrap_err();
        assert_eq!(err, RunError::Untaken);
        assert!(!r.alive());
        // A call on a runner known to be gone is not sent at all.
        assert_eq!(r.exec(&command(&["true"], Duration::from_secs(5))).await.unwrap_err(), RunError::Untaken);
    }

    #[tokio::test]
    async fn a_runner_that_ends_after_taking_a_command_is_a_failure_not_a_retry() {
        let dir = tempfile::tempdir().unwrap();
        let e = fake(dir.path(), "echo '{\"ready\":true}'; read l; echo '{\"id\":\"1\",\"took\":true}'; exit 0");
        let r = Runner::start(&e, "c", None).await.unwrap();
        let err = r.exec(&command(&["true"], Duration::from_secs(5))).await.unwrap_err();
        assert_eq!(err, RunError::Failed("the command runner ended while the command ran".into()));
    }

    #[tokio::test]
    async fn the_real_runner_says_it_took_a_command_before_running_it() {
        let dir = tempfile::tempdir().unwrap();
        let e = fake(dir.path(), "exec \"$@\"");
        let r = Runner::start(&e, "c", None).await.unwrap();
        let d = r.exec(&command(&["sh", "-c", "echo hi; exit 3"], Duration::from_secs(10))).await.unwrap();
        assert_eq!((d.exit_code, d.stdout.as_slice()), (3, b"hi\n".as_slice()));
        // The runner killed while its command runs: the call fails and is
        // not marked as safe to send again.
        let mark = dir.path().join("started");
        let script = format!("touch {}; kill -9 $PPID; sleep 2", mark.display());
        let err = r.exec(&command(&["sh", "-c", &script], Duration::from_secs(20))).await.unwrap_err();
        assert!(mark.exists(), "the command started");
        assert_eq!(err, RunError::Failed("the command runner ended while the command ran".into()));
        assert!(!r.alive());
    }
}
