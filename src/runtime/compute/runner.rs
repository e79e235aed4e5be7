//! The host's end of a container's command runner (`runner.py`): one
//! `podman exec -i CONTAINER python3 -u -c RUNNER` kept open per container,
//! requests and answers as JSON lines matched by id. A new `podman exec`
//! per command costs a quarter of a second; through the runner a command
//! costs a fork. A call dropped before its answer tells the runner to kill
//! the command's process group. When the runner ends, every waiting call
//! gets that as its error and the next call starts a new one.

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

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

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
                    if let Some(tx) = pending.lock().ok().and_then(|mut p| p.remove(&id)) {
                        let _ = tx.send(v);
                    }
                }
                alive.store(false, Ordering::SeqCst);
                // Waiting calls see their sender dropped.
                if let Ok(mut p) = pending.lock() {
                    p.clear();
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
    async fn call(&self, mut req: Value, limit: Duration, guard: &mut KillOnDrop<'_>) -> Result<Value, String> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        req["id"] = json!(id.to_string());
        let (tx, rx) = oneshot::channel();
        self.pending.lock().map_err(|_| "runner poisoned")?.insert(id, tx);
        if req["op"] == "exec" {
            guard.id = Some(id);
        }
        self.lines.send(format!("{req}\n")).map_err(|_| "the command runner is gone".to_string())?;
        let v = tokio::time::timeout(limit, rx)
            .await
            .map_err(|_| "the command runner did not answer in time".to_string())?
            .map_err(|_| "the command runner ended".to_string())?;
        guard.id = None;
        match v["error"].as_str() {
            Some(e) => Err(e.to_string()),
            None => Ok(v),
        }
    }

    /// Run one command; killed with its group at its timeout or when this
    /// future is dropped.
    pub async fn exec(&self, e: &Exec) -> Result<Done, String> {
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
    pub async fn prepare(&self, path: &str, uid: u32, gid: u32, mode: u32, user: Option<&str>) -> Result<(), String> {
        let mut guard = KillOnDrop { runner: self, id: None };
        let req = json!({"op": "prepare", "path": path, "uid": uid, "gid": gid, "mode": mode, "name": user});
        self.call(req, Duration::from_secs(30), &mut guard).await.map(|_| ())
    }

    /// Kill every process of a user (an agent of the shared container
    /// stopped); how many there were.
    pub async fn kill_user(&self, uid: u32) -> Result<u64, String> {
        let mut guard = KillOnDrop { runner: self, id: None };
        let v = self.call(json!({"op": "killuid", "uid": uid}), Duration::from_secs(30), &mut guard).await?;
        Ok(v["killed"].as_u64().unwrap_or(0))
    }
}
