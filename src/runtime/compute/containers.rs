//! The containers adf manages, and commands in them (issue 22). An agent
//! with `compute.enabled` has a dedicated container (`adf-<agent id>`,
//! workspace `/workspace`, user `agent`); every agent may use the install's
//! shared container (`adf-mcp`, tools.md), where its workspace is
//! `/workspace/<agent id>`, private to a user of its own. An external
//! container the owner registered is used as it is: adf never starts, stops,
//! rebuilds or removes it, and a stopped one fails closed.
//!
//! Managed containers are made from the locally built image (`image.rs`)
//! with no capabilities beyond what the runner needs to switch to the
//! agent's user, no new privileges, a process cap (a fork bomb ends at it),
//! and a network of their own: Podman gives each its own user-mode stack
//! (slirp4netns), so a sibling container has no address to reach it at;
//! Docker puts them on a bridge without inter-container traffic. A
//! dedicated container stops when its agent stops and keeps its state for
//! the next start; in the shared one, the agent's processes are killed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::engine::{self, Engine, Kind, State};
use super::runner::{Done, Exec, RunError, Runner};
use super::{External, OUTPUT_CAP, Settings, Target};

/// The shared container's name (tools.md `fs_transfer`).
pub const SHARED: &str = "adf-mcp";
/// Processes one agent's commands may have at once in the shared container.
const AGENT_NPROC: u32 = 512;
/// Processes a managed container may have in all.
const PIDS_LIMIT: &str = "2048";
/// The largest transfer in either direction.
pub const TRANSFER_CAP: usize = 64 << 20;

/// The dedicated container of an agent.
pub fn isolated_name(agent_id: &str) -> String {
    let id: String = agent_id.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').collect();
    format!("adf-{id}")
}

/// An agent's user in the shared container: the first uid it tries (from
/// its id, above people's accounts and within the 65,536 a rootless engine
/// maps) and its name. A uid another agent holds is skipped for the next.
pub fn shared_user(agent_id: &str) -> (u32, String) {
    use sha2::Digest;
    let d = sha2::Sha256::digest(agent_id.as_bytes());
    let n = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
    let short: String = agent_id.chars().filter(char::is_ascii_alphanumeric).take(12).collect();
    (20_000 + n % 40_000, format!("a-{}", short.to_ascii_lowercase()))
}

/// Where a managed target's commands run, as whom.
struct Place {
    container: String,
    workspace: String,
    uid: u32,
    user: String,
}

fn place(agent_id: &str, target: &Target) -> Option<Place> {
    match target {
        Target::Isolated => Some(Place {
            container: isolated_name(agent_id),
            workspace: "/workspace".into(),
            uid: 1000,
            user: "agent".into(),
        }),
        Target::Shared => {
            let (uid, user) = shared_user(agent_id);
            Some(Place { container: SHARED.into(), workspace: format!("/workspace/{agent_id}"), uid, user })
        }
        _ => None,
    }
}

/// What an agent used, to undo when it stops.
#[derive(Default)]
struct Used {
    isolated: bool,
    shared_uid: Option<u32>,
}

#[derive(Default)]
pub struct Containers {
    runners: Mutex<HashMap<String, Arc<Runner>>>,
    starting: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    used: Mutex<HashMap<String, Used>>,
    /// The uid each agent holds in the shared container.
    shared_uids: Mutex<HashMap<String, u32>>,
    stops: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

static CONTAINERS: LazyLock<Containers> = LazyLock::new(Containers::default);

pub fn get() -> &'static Containers {
    &CONTAINERS
}

/// The engine the install's settings name (or the first that runs here).
pub async fn engine_for(settings: &Settings) -> Result<Engine, String> {
    engine::detect(settings.engine.as_deref()).await
}

/// Our own hard limit of a resource (what the engine may give a container).
fn hard_limit(res: libc::__rlimit_resource_t, cap: u64) -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct we own.
    if unsafe { libc::getrlimit(res, &mut r) } != 0 {
        return 1024;
    }
    r.rlim_max.min(cap)
}

fn environment(agent_id: &str, home: &str, user: &str) -> Vec<(String, String)> {
    let ca = "/etc/ssl/certs/ca-certificates.crt";
    [
        ("PATH", format!("{home}/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")),
        ("HOME", home.into()),
        ("USER", user.into()),
        ("LOGNAME", user.into()),
        ("LANG", "C.UTF-8".into()),
        ("TERM", "dumb".into()),
        ("ADF_AGENT_ID", agent_id.into()),
        ("SSL_CERT_FILE", ca.into()),
        ("NODE_EXTRA_CA_CERTS", ca.into()),
        ("UV_NATIVE_TLS", "1".into()),
        ("PIP_BREAK_SYSTEM_PACKAGES", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The JSON a command's result is (tools.md `compute_exec`).
fn result(target: &Target, engine: &Engine, d: &Done, timeout: Duration) -> Value {
    let mut v = json!({"target": target.name(), "exit_code": d.exit_code,
        "stdout": String::from_utf8_lossy(&d.stdout), "stderr": String::from_utf8_lossy(&d.stderr),
        "duration_ms": d.ms});
    if let Target::External(e) = target {
        v["kind"] = json!("external-container");
        v["engine"] = json!(engine.name());
        v["target_name"] = json!(e.alias);
    }
    if d.timed_out {
        v["timed_out"] = json!(true);
        v["timeout_ms"] = json!(timeout.as_millis() as u64);
    }
    if d.stdout_truncated {
        v["stdout_truncated"] = json!(true);
    }
    if d.stderr_truncated {
        v["stderr_truncated"] = json!(true);
    }
    v
}

impl Containers {
    fn lock_for(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(name.to_string()).or_default().clone()
    }

    fn cached(&self, name: &str) -> Option<Arc<Runner>> {
        let m = self.runners.lock().ok()?;
        m.get(name).filter(|r| r.alive()).cloned()
    }

    /// The state of the agent's containers as this process knows it (no
    /// call to the engine: the panel reads this every second): `running`
    /// while a runner is alive in it, `stopped` when one was used and its
    /// runner is gone, absent when the agent has not used it.
    pub fn states(&self, agent_id: &str) -> Value {
        // Copied out, so no two of this file's locks are ever held at once.
        let (used_isolated, shared_uid) = self
            .used
            .lock()
            .ok()
            .and_then(|u| u.get(agent_id).map(|u| (u.isolated, u.shared_uid)))
            .unwrap_or((false, None));
        let state = |name: &str, was_used: bool| {
            if self.cached(name).is_some() {
                Some("running")
            } else if was_used {
                Some("stopped")
            } else {
                None
            }
        };
        let mut out = serde_json::Map::new();
        let isolated = isolated_name(agent_id);
        if let Some(st) = state(&isolated, used_isolated) {
            out.insert("isolated".into(), json!({"container": isolated, "state": st}));
        }
        if let Some(uid) = shared_uid
            && let Some(st) = state(SHARED, true)
        {
            out.insert(
                "shared".into(),
                json!({"container": SHARED, "state": st, "uid": uid, "workspace": format!("/workspace/{agent_id}")}),
            );
        }
        Value::Object(out)
    }

    fn forget(&self, name: &str) {
        if let Ok(mut m) = self.runners.lock() {
            m.remove(name);
        }
    }

    /// The runner of a managed container, making or starting it first.
    async fn managed(
        &self,
        engine: &Engine,
        settings: &Settings,
        agent_id: &str,
        p: &Place,
        target: &Target,
    ) -> Result<Arc<Runner>, String> {
        if let Some(r) = self.cached(&p.container) {
            return Ok(r);
        }
        let lock = self.lock_for(&p.container);
        let _g = lock.lock().await;
        if let Some(r) = self.cached(&p.container) {
            return Ok(r);
        }
        let name = p.container.as_str();
        match settled(engine, name).await? {
            State::Running(pid) if engine::alive(pid) => {}
            State::Startable => {
                if let Err(e) = engine.run_through(&["start", name], Duration::from_secs(60)).await {
                    if !matches!(engine.status(name).await?, State::Other(_) | State::Running(_)) {
                        return Err(e);
                    }
                    self.remake(engine, settings, agent_id, name, target, &e).await?;
                }
            }
            State::Paused => {
                engine.run_through(&["unpause", name], Duration::from_secs(60)).await?;
            }
            State::Absent => self.create(engine, settings, agent_id, name, target, None).await?,
            State::Running(pid) => {
                let why = format!("recorded as running, but its process {pid} is gone");
                self.remake(engine, settings, agent_id, name, target, &why).await?;
            }
            State::Other(s) => {
                let why = format!("left `{s}`");
                self.remake(engine, settings, agent_id, name, target, &why).await?;
            }
        }
        // No command runs in a container whose network is not fenced off
        // this machine and its networks.
        if let Err(e) = fence(engine, name).await {
            let _ = engine.run_through(&["stop", "-t", "1", name], Duration::from_secs(60)).await;
            return Err(e);
        }
        let r = Runner::start(engine, &p.container, None).await?;
        if matches!(target, Target::Shared) {
            // The parent lets each agent reach its own folder, not list others.
            r.prepare("/workspace", 0, 0, 0o711, None).await?;
        }
        if let Ok(mut m) = self.runners.lock() {
            m.insert(p.container.clone(), r.clone());
        }
        Ok(r)
    }

    /// A managed container the engine's records got wrong (its processes
    /// were killed from outside, so it stays `running` with nothing in it,
    /// or `stopping` for good) is made again from itself: committed to an
    /// image, removed, and created from that image with the same settings,
    /// so the workspaces in it are kept.
    async fn remake(
        &self,
        engine: &Engine,
        settings: &Settings,
        agent_id: &str,
        name: &str,
        target: &Target,
        why: &str,
    ) -> Result<(), String> {
        let keep = format!("localhost/adf-rescue:{}", name.to_ascii_lowercase());
        let long = Duration::from_secs(600);
        engine
            .run_through(&["commit", name, &keep], long)
            .await
            .map_err(|e| format!("the container {name} is broken ({why}) and its files could not be kept: {e}"))?;
        // A container recorded as running is told to stop first: without
        // its monitor the engine waits for an exit record that never comes,
        // and a removal would wait for it too.
        let _ = engine.run_through(&["stop", "-t", "0", name], Duration::from_secs(60)).await;
        let made = match engine.run_through(&["rm", "-f", name], Duration::from_secs(60)).await {
            Ok(_) => self.create(engine, settings, agent_id, name, target, Some(keep.clone())).await,
            Err(e) => Err(e),
        };
        // The new container holds the image; only its name goes.
        let untag: &[&str] = match engine.kind {
            Kind::Podman => &["untag", &keep],
            Kind::Docker => &["image", "rm", "-f", &keep],
        };
        let _ = engine.run(untag, Duration::from_secs(20)).await;
        made
    }

    async fn create(
        &self,
        engine: &Engine,
        settings: &Settings,
        agent_id: &str,
        name: &str,
        target: &Target,
        from: Option<String>,
    ) -> Result<(), String> {
        let image = from.or_else(|| settings.image.clone()).unwrap_or_else(super::image::tag);
        if !engine.image_exists(&image).await {
            return Err(format!(
                "the compute image {image} is not built on this machine: the owner runs `adf compute image build` (it is made from Debian packages, a few minutes)"
            ));
        }
        let role = if matches!(target, Target::Shared) { "shared" } else { "isolated" };
        let nofile = hard_limit(libc::RLIMIT_NOFILE, 65_536);
        // Some kernels refuse a container more (seen: 65,536 refused with a
        // hard limit of 96,368); one agent needs far fewer.
        let nproc = hard_limit(libc::RLIMIT_NPROC, 16_384);
        let mut args: Vec<String> = vec![
            "run".into(),
            "-d".into(),
            "--name".into(),
            name.into(),
            "--hostname".into(),
            name.into(),
            "--label".into(),
            "adf.managed=true".into(),
            "--label".into(),
            format!("adf.role={role}"),
            "--pids-limit".into(),
            PIDS_LIMIT.into(),
            "--ulimit".into(),
            format!("nofile={nofile}:{nofile}"),
            "--ulimit".into(),
            format!("nproc={nproc}:{nproc}"),
            "--cap-drop".into(),
            "ALL".into(),
            "--cap-add".into(),
            "CHOWN,DAC_OVERRIDE,FOWNER,SETUID,SETGID,KILL".into(),
            "--security-opt".into(),
            "no-new-privileges".into(),
        ];
        if matches!(target, Target::Isolated) {
            args.extend(["--label".into(), format!("adf.agent={agent_id}")]);
        }
        match engine.kind {
            // A user-mode network stack of its own: no address a sibling
            // could reach, and not the host's loopback either.
            Kind::Podman => args.extend(["--network".into(), "slirp4netns:allow_host_loopback=false".into()]),
            Kind::Docker => {
                ensure_docker_network(engine).await?;
                args.extend(["--network".into(), DOCKER_NET.into()]);
            }
        }
        args.push(image);
        args.extend([
            "sh".into(),
            "-c".into(),
            "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done".into(),
        ]);
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        engine.run_through(&a, Duration::from_secs(120)).await.map(|_| ())
    }

    /// The agent's workspace and user in the shared container made ready:
    /// its uid (the first one free from its own) set in `p`.
    async fn ready_shared(&self, r: &Runner, agent_id: &str, p: &mut Place) -> Result<(), RunError> {
        if let Some(uid) = self.shared_uids.lock().ok().and_then(|m| m.get(agent_id).copied()) {
            p.uid = uid;
            return Ok(());
        }
        let (first, name) = shared_user(agent_id);
        let mut last = String::new();
        for uid in (first..first + 32).map(|u| 20_000 + (u - 20_000) % 40_000) {
            match r.prepare(&p.workspace, uid, uid, 0o700, Some(&name)).await {
                Ok(()) => {
                    p.uid = uid;
                    if let Ok(mut m) = self.shared_uids.lock() {
                        m.insert(agent_id.to_string(), uid);
                    }
                    return Ok(());
                }
                Err(RunError::Failed(e)) if e.contains("belongs to") => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(format!("no free uid for this agent in the shared container ({last})").into())
    }

    /// Run the command `make` builds for the place in a managed target, as
    /// the agent's user, the container made ready first. When the cached
    /// runner ended before it took the command (the container was killed
    /// from outside and the runner had not noticed yet), nothing ran: the
    /// command goes once more to a new runner in a container made ready
    /// again. A command the runner took is never sent twice.
    async fn run_managed(
        &self,
        engine: &Engine,
        settings: &Settings,
        agent_id: &str,
        target: &Target,
        mut p: Place,
        make: impl Fn(&Place) -> Exec,
    ) -> Result<Done, String> {
        let mut again = true;
        loop {
            let r = self.managed(engine, settings, agent_id, &p, target).await?;
            let tried = async {
                if matches!(target, Target::Shared) {
                    self.ready_shared(&r, agent_id, &mut p).await?;
                }
                self.note(agent_id, target, p.uid);
                r.exec(&make(&p)).await
            }
            .await;
            match tried {
                Ok(d) => return Ok(d),
                Err(e) => {
                    if !r.alive() {
                        self.forget(&p.container);
                    }
                    if e == RunError::Untaken && std::mem::take(&mut again) {
                        continue;
                    }
                    return Err(e.into());
                }
            }
        }
    }

    /// Run a command in a container target.
    pub async fn exec(
        &self,
        settings: &Settings,
        agent_id: &str,
        target: &Target,
        command: &str,
        timeout: Duration,
    ) -> Result<Value, String> {
        let engine = engine_for(settings).await?;
        if let Target::External(x) = target {
            return self.exec_external(&engine, x, target, command, timeout).await;
        }
        let p = place(agent_id, target).ok_or("not a container target")?;
        let make = |p: &Place| Exec {
            argv: vec!["bash".into(), "--noprofile".into(), "--norc".into(), "-c".into(), command.into()],
            cwd: p.workspace.clone(),
            uid: Some(p.uid),
            gid: Some(p.uid),
            env: environment(agent_id, &p.workspace, &p.user),
            stdin: None,
            cap: OUTPUT_CAP,
            timeout,
            nproc: AGENT_NPROC,
        };
        let d = self.run_managed(&engine, settings, agent_id, target, p, make).await?;
        Ok(result(target, &engine, &d, timeout))
    }

    /// An external container: never started or changed by adf; the runner
    /// where it has python3, else one `exec` per command under `timeout`.
    async fn exec_external(
        &self,
        engine: &Engine,
        x: &External,
        target: &Target,
        command: &str,
        timeout: Duration,
    ) -> Result<Value, String> {
        let engine = match &x.engine {
            Some(name) if name != engine.name() => engine::detect(Some(name)).await?,
            _ => engine.clone(),
        };
        match engine.state(&x.container).await? {
            Some(true) => {}
            Some(false) => {
                return Err(format!(
                    "Target '{}' is not available: its container {} is stopped, and adf never starts a container it does not manage",
                    x.alias, x.container
                ));
            }
            None => {
                return Err(format!(
                    "Target '{}' is not available: no container {} in {}",
                    x.alias,
                    x.container,
                    engine.name()
                ));
            }
        }
        // One runner per container and user: another alias of the same
        // container may run as someone else.
        let key = format!("external:{}:{}:{}", engine.name(), x.container, x.user.as_deref().unwrap_or(""));
        let e = Exec {
            argv: vec!["sh".into(), "-c".into(), command.into()],
            cwd: x.workspace.clone().unwrap_or_default(),
            cap: OUTPUT_CAP,
            timeout,
            ..Default::default()
        };
        // A cached runner that ended before it took the command ran
        // nothing: the command goes once more, to a new one.
        let mut again = true;
        let d = loop {
            let runner = match self.cached(&key) {
                Some(r) => Some(r),
                None => match Runner::start(&engine, &x.container, x.user.as_deref()).await {
                    Ok(r) => {
                        if let Ok(mut m) = self.runners.lock() {
                            m.insert(key.clone(), r.clone());
                        }
                        Some(r)
                    }
                    Err(_) => None,
                },
            };
            let Some(r) = runner else { break exec_once(&engine, x, command, timeout).await? };
            match r.exec(&e).await {
                Ok(d) => break d,
                Err(RunError::Untaken) if std::mem::take(&mut again) => self.forget(&key),
                Err(err) => return Err(err.into()),
            }
        };
        Ok(result(target, &engine, &d, timeout))
    }

    fn note(&self, agent_id: &str, target: &Target, uid: u32) {
        if let Ok(mut u) = self.used.lock() {
            let e = u.entry(agent_id.to_string()).or_default();
            match target {
                Target::Isolated => e.isolated = true,
                Target::Shared => e.shared_uid = Some(uid),
                _ => {}
            }
        }
    }

    /// Start a long-lived process in a managed target, its stdin and stdout
    /// piped (a stream binding's end), as the agent's user in its
    /// workspace. The process leads a group of its own inside the
    /// container; the returned stopper kills that group.
    pub async fn spawn(
        &self,
        settings: &Settings,
        agent_id: &str,
        target: &Target,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<(tokio::process::Child, Stopper), String> {
        let engine = engine_for(settings).await?;
        let mut p =
            place(agent_id, target).ok_or("a process binding runs in the shared or the agent's own container")?;
        let r = self.managed(&engine, settings, agent_id, &p, target).await?;
        if matches!(target, Target::Shared) {
            self.ready_shared(&r, agent_id, &mut p).await?;
        }
        self.note(agent_id, target, p.uid);
        let uid = p.uid.to_string();
        let mut c = engine.command();
        c.args(["exec", "-i", "--user", &format!("{uid}:{uid}"), "--workdir", &p.workspace]);
        for (k, v) in environment(agent_id, &p.workspace, &p.user).iter().chain(env) {
            c.args(["--env", &format!("{k}={v}")]);
        }
        // setsid -w: its own group (whose id it says first on stderr), and
        // setsid waits for it (a group leader would fork and leave at once).
        c.args([p.container.as_str(), "setsid", "-w", "sh", "-c", "echo $$ >&2; exec \"$@\"", "sh"]).args(argv);
        c.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        let mut child = c.spawn().map_err(|e| format!("cannot run {}: {e}", engine.program.display()))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stderr));
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .map_err(|_| "the process did not start in the container within 30 s".to_string())?
            .map_err(|e| e.to_string())?;
        let pid: u32 = first
            .as_deref()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| format!("the process did not start in the container: {}", first.unwrap_or_default()))?;
        // What it writes on stderr after that is read and dropped.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok((child, Stopper { engine, container: p.container, pid }))
    }

    /// Copy files into a managed target's workspace (as the agent's user).
    pub async fn put(
        &self,
        settings: &Settings,
        agent_id: &str,
        target: &Target,
        files: &[(PathBuf, Vec<u8>)],
    ) -> Result<(), String> {
        let engine = engine_for(settings).await?;
        let p = place(agent_id, target).ok_or("external containers are not transfer endpoints")?;
        let mut b = tar::Builder::new(Vec::new());
        for (path, bytes) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            h.set_mtime(crate::store::now_ms() as u64 / 1000);
            b.append_data(&mut h, path, bytes.as_slice()).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        let archive = b.into_inner().map_err(|e| e.to_string())?;
        if archive.len() > TRANSFER_CAP {
            return Err(format!("the transfer is over {} MiB", TRANSFER_CAP >> 20));
        }
        let make = |p: &Place| Exec {
            // The image's own tar, not one the agent put on its PATH.
            argv: ["/usr/bin/tar", "-x", "-f", "-", "--no-same-owner", "--no-same-permissions", "-C", &p.workspace]
                .map(String::from)
                .to_vec(),
            cwd: p.workspace.clone(),
            uid: Some(p.uid),
            gid: Some(p.uid),
            env: environment(agent_id, &p.workspace, &p.user),
            stdin: Some(archive.clone()),
            cap: 64 << 10,
            timeout: Duration::from_secs(120),
            nproc: AGENT_NPROC,
        };
        let d = self.run_managed(&engine, settings, agent_id, target, p, make).await?;
        if d.exit_code != 0 {
            return Err(format!("writing in the container failed: {}", String::from_utf8_lossy(&d.stderr).trim()));
        }
        Ok(())
    }

    /// Read a file or folder from a managed target's workspace: each
    /// regular file under `src`, as a path relative to it ("" for `src`
    /// itself when it is a file), with its bytes. Links are not followed.
    pub async fn get(
        &self,
        settings: &Settings,
        agent_id: &str,
        target: &Target,
        src: &Path,
    ) -> Result<Vec<(PathBuf, Vec<u8>)>, String> {
        let engine = engine_for(settings).await?;
        let p = place(agent_id, target).ok_or("external containers are not transfer endpoints")?;
        let s = src.to_string_lossy().into_owned();
        let make = |p: &Place| Exec {
            argv: ["/usr/bin/tar", "-c", "-f", "-", "-C", &p.workspace, "--", &s].map(String::from).to_vec(),
            cwd: p.workspace.clone(),
            uid: Some(p.uid),
            gid: Some(p.uid),
            env: environment(agent_id, &p.workspace, &p.user),
            stdin: None,
            cap: TRANSFER_CAP,
            timeout: Duration::from_secs(120),
            nproc: AGENT_NPROC,
        };
        let d = self.run_managed(&engine, settings, agent_id, target, p, make).await?;
        if d.exit_code != 0 {
            let err = String::from_utf8_lossy(&d.stderr);
            return Err(if err.contains("No such file") {
                format!("nothing at {s} in the {} workspace", target.name())
            } else {
                format!("reading in the container failed: {}", err.trim())
            });
        }
        if d.stdout_truncated {
            return Err(format!("the transfer is over {} MiB", TRANSFER_CAP >> 20));
        }
        let mut out = Vec::new();
        let mut a = tar::Archive::new(d.stdout.as_slice());
        for entry in a.entries().map_err(|e| e.to_string())? {
            let mut entry = entry.map_err(|e| e.to_string())?;
            if entry.header().entry_type() != tar::EntryType::Regular {
                continue;
            }
            let path = entry.path().map_err(|e| e.to_string())?.into_owned();
            // Only plain names under what was asked for.
            let Ok(rest) = path.strip_prefix(src) else { continue };
            let rest = if rest.as_os_str().is_empty() {
                rest.to_path_buf()
            } else {
                super::relative(&rest.to_string_lossy())?
            };
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut bytes).map_err(|e| e.to_string())?;
            out.push((rest, bytes));
        }
        Ok(out)
    }

    /// The agent stopped: its dedicated container stops (kept for the next
    /// start), its processes in the shared one are killed.
    pub fn release(&'static self, agent_id: &str) {
        // Without a runtime nothing can be stopped: the record stays.
        let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
        let Some(used) = self.used.lock().ok().and_then(|mut u| u.remove(agent_id)) else { return };
        let agent = agent_id.to_string();
        let task = handle.spawn(async move {
            let settings = Settings::load();
            let Ok(engine) = engine_for(&settings).await else { return };
            if used.isolated {
                let name = isolated_name(&agent);
                self.forget(&name);
                let _ = engine.run_through(&["stop", "-t", "2", &name], Duration::from_secs(60)).await;
            }
            if let Some(uid) = used.shared_uid {
                // A runner that died is started again for this.
                let r = match self.cached(SHARED) {
                    Some(r) => Some(r),
                    None if engine.state(SHARED).await == Ok(Some(true)) => {
                        Runner::start(&engine, SHARED, None).await.ok()
                    }
                    None => None,
                };
                if let Some(r) = r {
                    let _ = r.kill_user(uid).await;
                }
            }
        });
        if let Ok(mut s) = self.stops.lock() {
            s.retain(|t| !t.is_finished());
            s.push(task);
        }
    }

    /// Keep a stop task for `settle` to wait for.
    pub fn track(&self, task: tokio::task::JoinHandle<()>) {
        if let Ok(mut s) = self.stops.lock() {
            s.push(task);
        }
    }

    /// Wait for the stops `release` started (the runtime is shutting down).
    pub async fn settle(&self) {
        let tasks: Vec<_> = self.stops.lock().map(|mut s| std::mem::take(&mut *s)).unwrap_or_default();
        for t in tasks {
            let _ = t.await;
        }
    }

    /// The managed containers (`adf compute`, the app's compute panel).
    pub async fn list(&self, engine: &Engine) -> Result<Vec<Value>, String> {
        let out = engine
            .run(
                &[
                    "ps",
                    "-a",
                    "--filter",
                    "label=adf.managed=true",
                    "--format",
                    "{{.Names}}\t{{.State}}\t{{.Image}}\t{{.Labels}}",
                ],
                Duration::from_secs(20),
            )
            .await?;
        Ok(out
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                let name = *f.first()?;
                let role = if name == SHARED { "shared" } else { "isolated" };
                let agent = f.get(3).and_then(|l| l.split([',', ' ', '[', ']', '{', '}']).find_map(|kv| kv.strip_prefix("adf.agent=").or_else(|| kv.strip_prefix("adf.agent:"))));
                Some(json!({"name": name, "state": f.get(1).copied().unwrap_or(""), "image": f.get(2).copied().unwrap_or(""),
                    "role": role, "agent_id": agent}))
            })
            .collect())
    }
}

/// Where a container may not connect: this machine's own addresses, the
/// private, shared, link-local (the cloud's metadata) and multicast ranges.
/// Its DNS server stays reachable on port 53.
fn fence_script(pid: u32) -> Result<String, String> {
    let mut nets: Vec<String> = [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "0.0.0.0/8",
        "224.0.0.0/4",
        "240.0.0.0/4",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut nets6: Vec<String> =
        ["fc00::/7", "fe80::/10", "::1/128", "ff00::/8"].iter().map(|s| s.to_string()).collect();
    for a in crate::daemon::hosts::interface_addresses() {
        match a {
            std::net::IpAddr::V4(v4) => nets.push(format!("{v4}/32")),
            std::net::IpAddr::V6(v6) => nets6.push(format!("{v6}/128")),
        }
    }
    // The container's resolvers (slirp4netns answers on 10.0.2.3).
    let resolv = std::fs::read_to_string(format!("/proc/{pid}/root/etc/resolv.conf")).unwrap_or_default();
    let mut dns: Vec<std::net::IpAddr> = resolv
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse().ok())
        .collect();
    dns.push("10.0.2.3".parse().map_err(|_| "address")?);
    let mut s = String::from("set -e\n");
    for (cmd, list, v6) in [("iptables", &nets, false), ("ip6tables", &nets6, true)] {
        if v6 {
            s.push_str("command -v ip6tables >/dev/null 2>&1 || exit 0\n");
        }
        s.push_str(&format!("{cmd} -w -N ADF 2>/dev/null || {cmd} -w -F ADF\n"));
        s.push_str(&format!("{cmd} -w -C OUTPUT -j ADF 2>/dev/null || {cmd} -w -I OUTPUT 1 -j ADF\n"));
        s.push_str(&format!("{cmd} -w -A ADF -o lo -j RETURN\n"));
        for d in dns.iter().filter(|d| d.is_ipv6() == v6) {
            for proto in ["udp", "tcp"] {
                s.push_str(&format!("{cmd} -w -A ADF -d {d} -p {proto} --dport 53 -j RETURN\n"));
            }
        }
        for n in list.iter() {
            s.push_str(&format!("{cmd} -w -A ADF -d {n} -j REJECT\n"));
        }
    }
    Ok(s)
}

/// Put the fence into a running container's network namespace: the rules
/// are set from outside it (the container has no capability to change
/// them), and set again whenever adf finds it running.
/// The container's state once a change under way has ended: a state
/// between two (`stopping`, `restarting`) is waited out for 10 s.
async fn settled(engine: &Engine, name: &str) -> Result<State, String> {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = engine.status(name).await?;
        if !matches!(s, State::Other(_)) || std::time::Instant::now() >= until {
            return Ok(s);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn fence(engine: &Engine, name: &str) -> Result<(), String> {
    let pid: u32 = engine
        .run(&["container", "inspect", "--format", "{{.State.Pid}}", name], Duration::from_secs(20))
        .await?
        .trim()
        .parse()
        .map_err(|_| format!("no process for container {name}"))?;
    if super::display::on_path("iptables").is_none() && !std::path::Path::new("/usr/sbin/iptables").exists() {
        return Err("containers need iptables on this machine to fence their network off it and its LAN (apt-get install iptables)".into());
    }
    let script = fence_script(pid)?;
    // SAFETY: geteuid has no preconditions.
    let mut c = if unsafe { libc::geteuid() } == 0 {
        tokio::process::Command::new("nsenter")
    } else {
        // A rootless engine's namespaces are entered through it.
        let mut c = engine.command();
        c.args(["unshare", "nsenter"]);
        c
    };
    let pid_s = pid.to_string();
    c.args(["-t", &pid_s, "-n", "sh", "-c", &script])
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(30), c.output())
        .await
        .map_err(|_| "setting the container's network fence took over 30 s".to_string())?
        .map_err(|e| format!("cannot enter the container's network: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "the container's network fence could not be set ({}); no command runs there without it",
            err.lines().last().unwrap_or("failed").trim()
        ));
    }
    Ok(())
}

/// Kills a process group that runs inside a container.
pub struct Stopper {
    engine: Engine,
    container: String,
    pid: u32,
}

impl Stopper {
    pub async fn stop(self) {
        let group = format!("-{}", self.pid);
        let _ =
            self.engine.run(&["exec", &self.container, "kill", "-KILL", "--", &group], Duration::from_secs(20)).await;
    }
}

const DOCKER_NET: &str = "adf-isolated";

/// Docker: a bridge without traffic between its containers.
async fn ensure_docker_network(engine: &Engine) -> Result<(), String> {
    if engine.run(&["network", "inspect", DOCKER_NET], Duration::from_secs(20)).await.is_ok() {
        return Ok(());
    }
    engine
        .run(
            &["network", "create", "--opt", "com.docker.network.bridge.enable_icc=false", DOCKER_NET],
            Duration::from_secs(60),
        )
        .await
        .map(|_| ())
}

/// One `exec` for an external container without python3: `timeout` inside
/// it kills the command's group where the container has `timeout`; the
/// client is killed at the deadline either way.
async fn exec_once(engine: &Engine, x: &External, command: &str, timeout: Duration) -> Result<Done, String> {
    let secs = timeout.as_secs_f64().max(0.001);
    let wrap =
        r#"if command -v timeout >/dev/null 2>&1; then exec timeout -s KILL "$1" sh -c "$2"; else exec sh -c "$2"; fi"#;
    let mut c = engine.command();
    c.arg("exec");
    if let Some(u) = &x.user {
        c.args(["--user", u]);
    }
    if let Some(w) = &x.workspace {
        c.args(["--workdir", w]);
    }
    c.args([x.container.as_str(), "sh", "-c", wrap, "adf", &format!("{secs:.3}"), command])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let started = std::time::Instant::now();
    let mut child = c.spawn().map_err(|e| format!("cannot run {}: {e}", engine.program.display()))?;
    let (out, err) = (child.stdout.take(), child.stderr.take());
    let ro = tokio::spawn(async move { super::host::capped_opt(out).await });
    let re = tokio::spawn(async move { super::host::capped_opt(err).await });
    let status = tokio::time::timeout(timeout + Duration::from_secs(5), child.wait()).await;
    let timed_out_client = status.is_err();
    if timed_out_client {
        let _ = child.kill().await;
    }
    let ((stdout, ocut), (stderr, ecut)) = (ro.await.unwrap_or_default(), re.await.unwrap_or_default());
    let code = match status {
        Ok(Ok(s)) => s.code().unwrap_or(-1) as i64,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => 124,
    };
    let elapsed = started.elapsed();
    let timed_out = timed_out_client || (code == 137 && elapsed >= timeout);
    Ok(Done {
        exit_code: if timed_out { 124 } else { code },
        timed_out,
        stdout,
        stderr,
        stdout_truncated: ocut,
        stderr_truncated: ecut,
        ms: elapsed.as_millis() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_get_their_own_names_and_users() {
        assert_eq!(isolated_name("Ab3_x-9"), "adf-Ab3_x-9");
        assert_eq!(isolated_name("a/../b"), "adf-ab");
        let (u1, n1) = shared_user("AgentOne123456789");
        let (u2, _) = shared_user("AgentTwo123456789");
        assert_ne!(u1, u2);
        assert!((20_000..60_000).contains(&u1));
        assert_eq!(n1, "a-agentone1234");
        assert_eq!(shared_user("AgentOne123456789").0, u1, "the same agent is the same user");
    }
}
