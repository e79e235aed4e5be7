//! The code sandbox (runtime.md §7): agent JavaScript and TypeScript runs in
//! worker processes (`adf __sandbox`, see `worker.rs`) holding a boa realm.
//! A process per sandbox gives hard walls an in-process engine cannot: a
//! wall-clock timeout that stops even `while (true) {}` or a runaway promise
//! job (the worker is killed), a memory cap, and a crash that costs only the
//! worker. Cold runs take a pre-started spare worker; warm sandboxes keep
//! their worker (and its realm) for the next run under the same id.

pub mod bench;
pub mod prepare;
pub mod wire;
pub mod worker;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use std::io::{BufRead, Write};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::Value;
use tokio::sync::mpsc;

pub use wire::{CallError, ModuleReq, RunReq};
use wire::{FromWorker, ToWorker};

/// Hard ceiling on any run (runtime.md §7.2).
pub const MAX_TIMEOUT_MS: u64 = 300_000;
/// How long a warm sandbox stays without use, and a spare cold one.
pub const WARM_TTL: Duration = Duration::from_secs(300);
pub const SPARE_TTL: Duration = Duration::from_secs(60);
const SPARES: usize = 2;

/// Serves `adf.*` calls for code while it runs.
pub trait Host: Send {
    fn call<'a>(&'a mut self, method: &'a str, args: Value) -> BoxFuture<'a, Result<Value, CallError>>;
}

/// A host that refuses everything (tests, code with no agent).
pub struct NoHost;

impl Host for NoHost {
    fn call<'a>(&'a mut self, method: &'a str, _: Value) -> BoxFuture<'a, Result<Value, CallError>> {
        Box::pin(async move { Err(CallError::new("NOT_FOUND", format!("adf.{method} is not available here"))) })
    }
}

/// What a run produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub value: Option<Value>,
    pub error: Option<CallError>,
    pub logs: Vec<String>,
    pub duration: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("Execution timed out after {0}ms")]
    Timeout(u64),
    #[error("the sandbox stopped: {0}")]
    Crashed(String),
    #[error("cannot start the sandbox worker ({exe}): {source}")]
    Spawn { exe: String, source: std::io::Error },
}

impl SandboxError {
    pub fn code(&self) -> &'static str {
        match self {
            SandboxError::Timeout(_) => "TIMEOUT",
            _ => "INTERNAL_ERROR",
        }
    }
}

/// The `adf` binary that serves `__sandbox`: `ADF_SANDBOX_EXE`, this
/// executable, or (in a test binary under `target/*/deps`) the `adf` beside
/// its folder.
pub fn worker_exe() -> PathBuf {
    if let Some(p) = std::env::var_os("ADF_SANDBOX_EXE") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("adf"));
    if exe.file_stem().is_some_and(|s| s == "adf") {
        return exe;
    }
    let name = format!("adf{}", std::env::consts::EXE_SUFFIX);
    exe.parent().and_then(|d| d.parent()).map(|d| d.join(&name)).filter(|p| p.exists()).unwrap_or(exe)
}

/// One worker process. Its output is read by a plain thread, so a worker
/// does not belong to any one tokio runtime (tests run many).
pub struct Worker {
    child: Arc<Mutex<std::process::Child>>,
    /// Written directly: the worker reads whenever it waits on us (a run
    /// request, a call's reply), so a write never waits long.
    to: std::process::ChildStdin,
    from: mpsc::UnboundedReceiver<Result<FromWorker, String>>,
    next: u64,
    idle_since: Instant,
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(mut c) = self.child.lock() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Worker {
    pub async fn spawn() -> Result<Worker, SandboxError> {
        let exe = worker_exe();
        let spawn_err = |source| SandboxError::Spawn { exe: exe.display().to_string(), source };
        let mut child = std::process::Command::new(&exe)
            .arg("__sandbox")
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(spawn_err)?;
        let (Some(to), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(SandboxError::Crashed("no pipes to the worker".into()));
        };
        let child = Arc::new(Mutex::new(child));
        let (tx, from) = mpsc::unbounded_channel();
        let reaper = child.clone();
        std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(stdout).lines();
            while let Some(Ok(line)) = lines.next() {
                if let Ok(m) = serde_json::from_str(&line)
                    && tx.send(Ok(m)).is_err()
                {
                    return;
                }
            }
            let _ = tx.send(Err(exit_reason(&reaper)));
        });
        let mut w = Worker { child, to, from, next: 0, idle_since: Instant::now() };
        match tokio::time::timeout(Duration::from_secs(10), w.recv()).await {
            Ok(Ok(FromWorker::Ready)) => Ok(w),
            Ok(Ok(other)) => Err(SandboxError::Crashed(format!("unexpected first message {other:?}"))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(SandboxError::Crashed("the worker did not start within 10 s".into())),
        }
    }

    async fn recv(&mut self) -> Result<FromWorker, SandboxError> {
        match self.from.recv().await {
            Some(Ok(m)) => Ok(m),
            Some(Err(why)) => Err(SandboxError::Crashed(why)),
            None => Err(SandboxError::Crashed("the worker closed its output".into())),
        }
    }

    fn send(&mut self, msg: &ToWorker) -> Result<(), SandboxError> {
        let mut line = serde_json::to_vec(msg).map_err(|e| SandboxError::Crashed(e.to_string()))?;
        line.push(b'\n');
        self.to.write_all(&line).map_err(|_| SandboxError::Crashed("the worker closed its input".into()))
    }

    /// Run one request to completion, serving calls through `host`, within
    /// `timeout`. On any error the worker must be dropped (it is killed).
    pub async fn run(
        &mut self,
        mut req: RunReq,
        host: &mut dyn Host,
        timeout: Duration,
    ) -> Result<Outcome, SandboxError> {
        let started = Instant::now();
        self.next += 1;
        req.id = self.next;
        let id = req.id;
        let work = async {
            self.send(&ToWorker::Run(req))?;
            loop {
                match self.recv().await? {
                    FromWorker::Call { call, method, args } => {
                        let reply = match host.call(&method, args).await {
                            Ok(v) => ToWorker::Reply { call, ok: Some(v), err: None },
                            Err(e) => ToWorker::Reply { call, ok: None, err: Some(e) },
                        };
                        self.send(&reply)?;
                    }
                    FromWorker::Done { id: done, value, error, logs } if done == id => {
                        return Ok(Outcome { value, error, logs, duration: started.elapsed() });
                    }
                    _ => {}
                }
            }
        };
        let out = tokio::time::timeout(timeout, work).await;
        self.idle_since = Instant::now();
        match out {
            Ok(r) => r,
            Err(_) => {
                if let Ok(mut c) = self.child.lock() {
                    let _ = c.kill();
                }
                Err(SandboxError::Timeout(timeout.as_millis() as u64))
            }
        }
    }
}

/// Why a worker's output ended.
fn exit_reason(child: &Mutex<std::process::Child>) -> String {
    use std::os::unix::process::ExitStatusExt;
    let Ok(mut c) = child.lock() else { return "the worker stopped".into() };
    let deadline = Instant::now() + Duration::from_secs(2);
    let status = loop {
        match c.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => break None,
        }
    };
    match status {
        Some(s) => match s.signal() {
            Some(6) | Some(9) => "out of memory or killed (the worker exceeded its memory limit)".into(),
            Some(11) => "the worker crashed (stack overflow or fault)".into(),
            Some(sig) => format!("the worker died of signal {sig}"),
            None => format!("the worker exited with status {}", s.code().unwrap_or(-1)),
        },
        None => "the worker closed its output".into(),
    }
}

/// Workers of this process: spares for cold runs, and warm ones by id.
#[derive(Default)]
struct Pool {
    spare: Vec<Worker>,
    /// Warm workers by sandbox id: as many as have run at once under it
    /// (up to `WARM_PER_ID`), so concurrent runs of one warm route each
    /// find a warm realm instead of starting cold ones that then replace
    /// each other. State is per worker, as with any pool of instances.
    warm: HashMap<String, Vec<Worker>>,
}

/// Warm workers kept per sandbox id.
const WARM_PER_ID: usize = 4;

fn pool() -> &'static Mutex<Pool> {
    static P: OnceLock<Mutex<Pool>> = OnceLock::new();
    P.get_or_init(Default::default)
}

fn sweep(p: &mut Pool) {
    p.spare.retain(|w| w.idle_since.elapsed() < SPARE_TTL);
    p.warm.retain(|_, ws| {
        ws.retain(|w| w.idle_since.elapsed() < WARM_TTL);
        !ws.is_empty()
    });
}

/// Start spare workers so the next cold run does not wait for a process.
pub fn prewarm() {
    let need = pool().lock().map(|p| SPARES.saturating_sub(p.spare.len())).unwrap_or(0);
    for _ in 0..need {
        tokio::spawn(async {
            if let Ok(w) = Worker::spawn().await
                && let Ok(mut p) = pool().lock()
                && p.spare.len() < SPARES
            {
                p.spare.push(w);
            }
        });
    }
}

/// Forget the warm sandbox `id` (its state is reset on next use).
pub fn reset(id: &str) {
    if let Ok(mut p) = pool().lock() {
        p.warm.remove(id);
    }
}

/// Run `req` in the warm sandbox `warm` (state kept from earlier runs under
/// that id) or, with `None`, in a fresh realm.
pub async fn run(
    req: RunReq,
    warm: Option<&str>,
    host: &mut dyn Host,
    timeout: Duration,
) -> Result<Outcome, SandboxError> {
    let timeout = timeout.min(Duration::from_millis(MAX_TIMEOUT_MS));
    let (reused, spare) = {
        let mut p = pool().lock().map_err(|_| SandboxError::Crashed("sandbox pool poisoned".into()))?;
        sweep(&mut p);
        let reused = warm.and_then(|id| p.warm.get_mut(id).and_then(Vec::pop));
        let spare = if reused.is_none() { p.spare.pop() } else { None };
        (reused, spare)
    };
    let fresh = reused.is_none();
    let mut worker = match reused.or(spare) {
        Some(w) => w,
        None => Worker::spawn().await?,
    };
    if fresh {
        prewarm();
    }
    let mut req = req;
    req.fresh = fresh;
    let out = worker.run(req, host, timeout).await?;
    if let Ok(mut p) = pool().lock() {
        match warm {
            Some(id) => {
                let ws = p.warm.entry(id.to_string()).or_default();
                if ws.len() < WARM_PER_ID {
                    ws.push(worker);
                }
            }
            None if p.spare.len() < SPARES => p.spare.push(worker),
            None => {}
        }
    }
    Ok(out)
}
