//! The fleet: the agents found in the fleet folders (and files named on the
//! command line), each loaded as one actor that owns its file, all
//! publishing on one bus. Commands of the protocol are routed here by
//! agent id, handle or name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use super::agent::{AgentCommand, AgentHandle, waiting_owner};
use super::bus::Bus;
use super::executor::Executor;
use crate::protocol::Command;
use crate::providers::{Provider, accounts};
use crate::store::Store;

/// One loaded agent.
struct Loaded {
    path: PathBuf,
    /// `path` resolved (links, `..`), the key of `Fleet::files`.
    canon: PathBuf,
    name: String,
    handle: String,
    agent: AgentHandle,
    task: tokio::task::JoinHandle<Executor>,
    /// Started (timers running), or only loaded.
    started: Arc<std::sync::atomic::AtomicBool>,
    /// Its DID (empty: none yet).
    did: String,
    /// Another loaded file with the same DID: one of them is a copy.
    duplicate_of: Option<PathBuf>,
}

/// One row of the fleet's listing.
#[derive(Debug, Serialize)]
pub struct AgentSummary<'a> {
    pub id: &'a str,
    #[serde(rename = "filePath")]
    pub file_path: &'a Path,
    pub name: &'a str,
    pub handle: &'a str,
    pub state: String,
    pub started: bool,
    /// Another loaded file has this agent's DID (`adf claim` the copy).
    #[serde(rename = "duplicateOf", skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<&'a Path>,
}

/// What the fleet says about an agent.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AgentInfo {
    pub id: String,
    pub name: String,
    pub handle: String,
    pub path: PathBuf,
}

/// What an agent is doing, followed from its events.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Activity {
    pub state: String,
    pub state_since: i64,
    /// In a model call (or between calls of a turn) since.
    pub calling_since: Option<i64>,
    /// Running this tool since.
    pub tool: Option<(String, i64)>,
    /// The provider failed; the next try is at.
    pub retry_at: Option<i64>,
}

impl Activity {
    const TYPES: &'static [&'static str] = &[
        "agent.state.changed",
        "tool.started",
        "tool.completed",
        "tool.failed",
        "llm.completed",
        "llm.failed",
        "provider.retry_scheduled",
        "provider.retry_started",
    ];

    fn on(&mut self, ty: &str, at: i64, p: &serde_json::Value) {
        match ty {
            "agent.state.changed" => {
                self.state = p["state"].as_str().unwrap_or("").to_string();
                self.state_since = at;
                let active = self.state == "active";
                self.calling_since = active.then_some(at);
                if !active {
                    self.tool = None;
                    self.retry_at = None;
                }
            }
            "tool.started" => {
                self.tool = Some((p["name"].as_str().unwrap_or("").to_string(), at));
                self.calling_since = None;
            }
            "tool.completed" | "tool.failed" => {
                self.tool = None;
                self.calling_since = (self.state == "active").then_some(at);
            }
            "llm.completed" | "llm.failed" => self.calling_since = None,
            "provider.retry_scheduled" => {
                self.retry_at = p["next_retry_at"].as_i64();
                self.calling_since = None;
            }
            "provider.retry_started" => {
                self.retry_at = None;
                self.calling_since = Some(at);
            }
            _ => {}
        }
    }

    /// What it waits on, as `adf why` lists it.
    pub fn waiting(&self, now: i64) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        let secs = |t: i64| (now - t).max(0) / 1000;
        if let Some(t) = self.calling_since {
            out.push(serde_json::json!({"what": "model", "since_ms": t, "seconds": secs(t)}));
        }
        if let Some((name, t)) = &self.tool {
            out.push(serde_json::json!({"what": "tool", "tool": name, "since_ms": t, "seconds": secs(*t)}));
        }
        if let Some(at) = self.retry_at {
            out.push(serde_json::json!({"what": "provider_backoff", "retry_at_ms": at, "in_seconds": (at - now).max(0) / 1000}));
        }
        out
    }
}

/// Picks the provider for an agent's config (the accounts and environment
/// by default; a scripted one in tests and benchmarks).
pub type ProviderFactory = Arc<dyn Fn(&serde_json::Value) -> Result<Arc<dyn Provider>, String> + Send + Sync>;

/// The default factory: `model.provider` through the accounts.
///
/// The providers it makes share one HTTP client (made on first use): its
/// connections are reused across agents of one account, and an agent adds
/// no client of its own to what an idle fleet holds. One factory serves one
/// fleet, so the client's connections live on that fleet's runtime.
pub fn accounts_factory() -> ProviderFactory {
    let client = std::sync::OnceLock::new();
    Arc::new(move |cfg| {
        let settings = accounts::load()?;
        let client = client.get_or_init(crate::providers::http_client);
        accounts::resolve_for_on(cfg, &settings, Some(client)).map(|(p, _)| p)
    })
}

/// The config the provider factory sees for an agent: the agent's own
/// provider key, from its sealed credentials (when this install opened
/// them), rides in a copy, in memory only. Every path that runs a turn
/// (the fleet, `adf chat`) resolves the provider through this.
pub fn config_for_factory<'a>(store: &Store, cfg: &'a serde_json::Value) -> std::borrow::Cow<'a, serde_json::Value> {
    let pid = cfg.pointer("/model/provider").and_then(|v| v.as_str()).unwrap_or("");
    if !pid.is_empty()
        && let Ok(Some(k)) = store.secret_get(&format!("provider:{pid}:apiKey"))
    {
        let mut c = cfg.clone();
        c["__credentials"] = serde_json::json!({"apiKey": String::from_utf8_lossy(&k)});
        return std::borrow::Cow::Owned(c);
    }
    std::borrow::Cow::Borrowed(cfg)
}

pub struct Fleet {
    pub bus: Arc<Bus>,
    factory: ProviderFactory,
    agents: BTreeMap<String, Loaded>,
    /// The resolved paths of the loaded files: a second load of one is
    /// refused without looking at every agent.
    files: std::collections::HashSet<PathBuf>,
    /// Publish `turn.delta` events (front ends that render streams).
    stream_deltas: bool,
    /// Load agents whose provider cannot be set up, with a provider that
    /// explains why on each call (the terminal app), instead of refusing.
    lenient: bool,
    /// Agents loaded without a provider, with why (lenient loading).
    unconfigured: BTreeMap<String, String>,
    /// The live state of each agent, as its `agent.state.changed` events
    /// say (kept by a task following the bus).
    states: Arc<std::sync::Mutex<BTreeMap<String, String>>>,
    activity: Arc<std::sync::Mutex<BTreeMap<String, Activity>>>,
    /// Mailboxes of the loaded agents, for messaging and the mesh server.
    pub mesh: Arc<super::mesh::Mesh>,
    /// Agents whose identity is sealed to another owner (claimable).
    foreign: std::collections::BTreeSet<String>,
    /// Files agents created and asked to start (see `load_requested`).
    load_requests: Option<tokio::sync::mpsc::UnboundedReceiver<PathBuf>>,
}

impl Fleet {
    pub fn new(bus: Arc<Bus>, factory: ProviderFactory) -> Self {
        let states: Arc<std::sync::Mutex<BTreeMap<String, String>>> = Default::default();
        let activity: Arc<std::sync::Mutex<BTreeMap<String, Activity>>> = Default::default();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let filter =
                super::bus::Filter { types: Activity::TYPES.iter().map(|t| t.to_string()).collect(), agent_id: None };
            let mut sub = bus.subscribe(None, filter);
            let (st, act) = (Arc::downgrade(&states), Arc::downgrade(&activity));
            rt.spawn(async move {
                while let Some(item) = sub.next().await {
                    let (Some(states), Some(activity)) = (st.upgrade(), act.upgrade()) else { break };
                    let super::bus::Item::Event(e) = item else { continue };
                    let Some(id) = &e.event.agent_id else { continue };
                    if e.event.event_type == "agent.state.changed"
                        && let Some(state) = e.event.payload["state"].as_str()
                        && let Ok(mut m) = states.lock()
                    {
                        m.insert(id.clone(), state.to_string());
                    }
                    if let Ok(mut m) = activity.lock() {
                        m.entry(id.clone()).or_default().on(&e.event.event_type, e.event.timestamp, &e.event.payload);
                    }
                }
            });
        }
        let mesh = super::mesh::Mesh::new(bus.clone(), states.clone());
        let (load_tx, load_rx) = tokio::sync::mpsc::unbounded_channel();
        mesh.set_loader(load_tx);
        Fleet {
            mesh,
            load_requests: Some(load_rx),
            foreign: Default::default(),
            bus,
            factory,
            agents: BTreeMap::new(),
            files: Default::default(),
            stream_deltas: false,
            lenient: false,
            unconfigured: BTreeMap::new(),
            states,
            activity,
        }
    }

    /// How each channel adapter of an agent is doing.
    pub fn channel_status(&self, id: &str) -> Vec<(String, crate::channels::Status)> {
        self.mesh.channels.status(id)
    }

    /// System lambdas waiting in an agent's dispatch lanes.
    pub fn lane_waits(&self, id: &str) -> Vec<(String, usize, usize)> {
        self.agents.get(id).map(|l| l.agent.lane_waits()).unwrap_or_default()
    }

    /// What a running agent is doing now, for `adf why`: a model call, a
    /// tool, a provider back-off, with since when.
    pub fn activity(&self, id: &str) -> Option<Activity> {
        self.activity.lock().ok()?.get(id).cloned()
    }

    /// An agent's live state (`idle` until it says otherwise; `off` once
    /// its actor has ended).
    pub fn state(&self, id: &str) -> String {
        if self.is_stopped(id) {
            return "off".into();
        }
        self.states.lock().ok().and_then(|m| m.get(id).cloned()).unwrap_or_else(|| "idle".into())
    }

    /// Stop an agent and unload it (its file closed cleanly).
    pub async fn unload(&mut self, agent: &str) -> Result<(), String> {
        let id = self.resolve(agent)?;
        let l = self.agents.remove(&id).ok_or_else(|| format!("{agent}: not loaded"))?;
        self.files.remove(&l.canon);
        self.mesh.unregister(&id);
        drop(l.agent);
        let ex = l.task.await.map_err(|e| format!("{}: {e}", l.path.display()))?;
        ex.store.close().map_err(|e| e.to_string())?;
        self.bus.publish(crate::protocol::Envelope::new(
            crate::protocol::kind::AGENT_UNLOADED,
            Some(&id),
            "system:fleet",
            serde_json::json!({"filePath": l.path.display().to_string()}),
        ));
        Ok(())
    }

    /// The stream of files agents created with `autostart`, for an owner
    /// that serves it from its own task (the daemon); afterwards
    /// `load_requested` finds nothing.
    pub fn take_load_requests(&mut self) -> Option<tokio::sync::mpsc::UnboundedReceiver<PathBuf>> {
        self.load_requests.take()
    }

    /// Load (started) the files agents created with `autostart` since the
    /// last call; returns what loaded and what did not.
    pub fn load_requested(&mut self) -> Vec<Result<AgentInfo, String>> {
        let mut paths = Vec::new();
        if let Some(rx) = self.load_requests.as_mut() {
            while let Ok(p) = rx.try_recv() {
                paths.push(p);
            }
        }
        paths.iter().map(|p| self.load(p)).collect()
    }

    /// Loaded agents whose identity belongs to another owner.
    pub fn foreign(&self) -> &std::collections::BTreeSet<String> {
        &self.foreign
    }

    /// Re-key a foreign agent to this install's owner (a new DID, the old
    /// one kept in its history); runs on the agent's actor.
    pub async fn claim(&mut self, agent: &str) -> Result<String, String> {
        let id = self.resolve(agent)?;
        let inst = crate::identity::install::current()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let work = super::agent::OwnerWork(Box::new(move |ex: &mut Executor| {
            let _ = tx.send(ex.store.claim(&inst).map_err(|e| e.to_string()));
        }));
        self.send(&id, AgentCommand::With(work))?;
        let did = rx.await.map_err(|_| "the agent stopped before the claim ran".to_string())??;
        if let Some(mb) = self.mesh.find(&id) {
            mb.set_did(&did);
        }
        self.foreign.remove(&id);
        Ok(did)
    }

    /// Publish `turn.delta` events for every agent loaded from now on.
    pub fn stream_deltas(mut self, on: bool) -> Self {
        self.stream_deltas = on;
        self
    }

    /// Load agents even when their provider cannot be set up.
    pub fn lenient(mut self, on: bool) -> Self {
        self.lenient = on;
        self
    }

    /// Load one agent file as an actor (must run inside a tokio runtime).
    pub fn load(&mut self, path: &Path) -> Result<AgentInfo, String> {
        self.load_with(path, true)
    }

    /// Load an agent, started or only loaded (the daemon's agents that are
    /// not flagged for autostart, or not reviewed: they answer the owner,
    /// their timers wait for `start`).
    pub fn load_with(&mut self, path: &Path, started: bool) -> Result<AgentInfo, String> {
        self.load_inner(path, started).map(|(info, _)| info)
    }

    /// `load`, with the config the file was loaded with (the daemon's load
    /// answer, without opening the file a second time).
    pub fn load_config(&mut self, path: &Path) -> Result<(AgentInfo, serde_json::Value), String> {
        self.load_inner(path, true)
    }

    fn load_inner(&mut self, path: &Path, started: bool) -> Result<(AgentInfo, serde_json::Value), String> {
        let canon = crate::store::canonical(path);
        if self.files.contains(&canon) {
            return Err(format!("{}: already loaded", path.display()));
        }
        let mut store = Store::open_resolved(path, canon.clone()).map_err(|e| e.to_string())?;
        // The load's reads in one read transaction (a write, such as an
        // envelope adopting this install, ends it first).
        store.begin_reading().map_err(|e| e.to_string())?;
        // Open the envelopes this install can open (runtime slot, then the
        // owner's); a foreign or locked file still loads, without secrets.
        // Those its runtime slot opens wait for the first secret read: the
        // load pays no key agreement.
        let foreign_state = crate::store::keyring::EnvState::Foreign;
        let foreign = match crate::identity::install::load(&crate::paths::config_dir()) {
            Ok(Some(inst)) => store.unlock_lazily(&inst).map_err(|e| e.to_string())?[0] == foreign_state,
            _ => store.envelope(crate::identity::envelope::IDENTITY).is_ok_and(|e| e.state == foreign_state),
        };
        let cfg = store.config_value().map_err(|e| e.to_string())?;
        let for_factory = config_for_factory(&store, &cfg);
        let (provider, why) = match (self.factory)(&for_factory) {
            Ok(p) => (p, None),
            Err(e) if self.lenient => {
                (Arc::new(crate::providers::Unconfigured { why: e.clone() }) as Arc<dyn Provider>, Some(e))
            }
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let handle = store.meta_get("adf_handle").ok().flatten().map(|m| m.value).unwrap_or_default();
        let did = store.meta_get("adf_did").ok().flatten().map(|m| m.value).unwrap_or_default();
        store.end_reading();
        let name = cfg.get("name").and_then(|v| v.as_str()).unwrap_or("").to_string();
        let owner = waiting_owner();
        let runner_provider = provider.clone();
        let mut ex = Executor::new(store, provider, self.bus.clone(), owner.clone()).map_err(|e| e.to_string())?;
        ex.prepare_loaded().map_err(|e| e.to_string())?;
        ex.stream_deltas(self.stream_deltas);
        let id = ex.agent_id().to_string();
        if let Some(other) = self.agents.get(&id) {
            let same = if !did.is_empty() && other.did == did { " and DID" } else { "" };
            return Err(format!(
                "{}: a copy of {} (same id{same}), not loaded; give the copy its own identity: adf claim {}",
                path.display(),
                other.path.display(),
                path.display()
            ));
        }
        // One DID in two files: both run, but messages to that DID could
        // reach either; flag the newcomer with the fix.
        let duplicate_of = self.agents.values().find(|l| !did.is_empty() && l.did == did).map(|l| l.path.clone());
        if let Some(other) = &duplicate_of {
            ex.emit(
                crate::protocol::kind::AGENT_ERROR,
                "system:fleet",
                serde_json::json!({"error": format!(
                    "{} has the DID of {} ({did}): one of them is a copy; give it its own identity: adf claim {}",
                    path.display(), other.display(), path.display()), "duplicateOf": other.display().to_string()}),
            );
        }
        ex.emit(
            crate::protocol::kind::AGENT_LOADED,
            "system:fleet",
            serde_json::json!({"filePath": path.display().to_string(), "name": name, "handle": handle,
                "autostart": cfg.get("autostart").and_then(|v| v.as_bool()).unwrap_or(false)}),
        );
        match why {
            Some(w) => self.unconfigured.insert(id.clone(), w),
            None => self.unconfigured.remove(&id),
        };
        let started = Arc::new(std::sync::atomic::AtomicBool::new(started));
        ex.set_mesh(self.mesh.clone());
        let (agent, task) = super::agent::spawn_with(ex, owner, super::agent::TIMER_TICK, started.clone());
        let runner: super::mesh::Runner = {
            let (path, bus, provider) = (path.to_path_buf(), self.bus.clone(), runner_provider);
            // Weak: the mesh holds this closure (through the mailbox).
            let mesh = Arc::downgrade(&self.mesh);
            Box::new(move || {
                let store = Store::sibling(&path).ok()?;
                let mut ex =
                    Executor::new(store, provider.clone(), bus.clone(), Arc::new(super::executor::Absent)).ok()?;
                // Route and socket lambdas reach the agent's sockets and mail.
                if let Some(m) = mesh.upgrade() {
                    ex.set_mesh(m);
                }
                Some(ex)
            })
        };
        let names = super::mesh::AgentNames { id: &id, handle: &handle, did: &did, path, canon: &canon };
        self.mesh.register(names, agent.weak(), runner);
        // Its channels, once it runs (a loaded-only agent answers no one).
        if started.load(std::sync::atomic::Ordering::Relaxed)
            && let Some(mb) = self.mesh.find(&id)
        {
            self.mesh.channels.start(&mb, &cfg);
            super::mesh::ws::out::start_configured(&self.mesh, &mb, &cfg);
            super::taps::start(&self.mesh, &mb, &cfg);
            super::streams::start_declared(&self.mesh, &mb, &cfg);
        }
        if foreign {
            self.foreign.insert(id.clone());
        }
        let info = AgentInfo { id: id.clone(), name: name.clone(), handle: handle.clone(), path: path.to_path_buf() };
        self.files.insert(canon.clone());
        self.agents.insert(
            id,
            Loaded { path: path.to_path_buf(), canon, name, handle, agent, task, started, did, duplicate_of },
        );
        Ok((info, cfg))
    }

    /// Load every `.adf` file of a fleet folder and its direct subfolders;
    /// returns what loaded and what did not (with why).
    pub fn load_dir(&mut self, dir: &Path) -> (Vec<AgentInfo>, Vec<String>) {
        let mut ok = Vec::new();
        let mut failed = Vec::new();
        for path in crate::cli::scan(dir) {
            match self.load(&path) {
                Ok(i) => ok.push(i),
                Err(e) => failed.push(e),
            }
        }
        (ok, failed)
    }

    pub fn list(&self) -> Vec<AgentInfo> {
        self.agents
            .iter()
            .map(|(id, l)| AgentInfo {
                id: id.clone(),
                name: l.name.clone(),
                handle: l.handle.clone(),
                path: l.path.clone(),
            })
            .collect()
    }

    /// Every loaded agent with its live state, as `GET /agents` lists them:
    /// one pass over the fleet, the states' lock taken once.
    pub fn summaries(&self) -> Vec<AgentSummary<'_>> {
        let states = self.states.lock().ok();
        self.agents
            .iter()
            .map(|(id, l)| AgentSummary {
                id,
                file_path: &l.path,
                name: &l.name,
                handle: &l.handle,
                state: if l.task.is_finished() {
                    "off".into()
                } else {
                    states.as_ref().and_then(|m| m.get(id).cloned()).unwrap_or_else(|| "idle".into())
                },
                started: l.started.load(std::sync::atomic::Ordering::Relaxed),
                duplicate_of: l.duplicate_of.as_deref(),
            })
            .collect()
    }

    /// Find an agent by id, handle or name (names only when unique).
    pub fn resolve(&self, key: &str) -> Result<String, String> {
        if self.agents.contains_key(key) {
            return Ok(key.to_string());
        }
        let by = |f: &dyn Fn(&Loaded) -> bool| {
            self.agents.iter().filter(|(_, l)| f(l)).map(|(id, _)| id.clone()).collect::<Vec<_>>()
        };
        let handles = by(&|l| l.handle == key);
        if handles.len() == 1 {
            return Ok(handles[0].clone());
        }
        let names = by(&|l| l.name == key);
        match names.len() {
            1 => Ok(names[0].clone()),
            0 => Err(format!("no loaded agent is called \"{key}\"")),
            _ => {
                // The candidates, each by id and file, so the next try can be exact.
                let list: Vec<String> =
                    names.iter().map(|id| format!("{id} ({})", self.agents[id].path.display())).collect();
                Err(format!("\"{key}\" names {} agents; use an id: {}", names.len(), list.join(", ")))
            }
        }
    }

    /// Route one protocol command.
    pub fn command(&mut self, cmd: Command) -> Result<(), String> {
        let (agent, c) = match cmd {
            Command::EmergencyStop => {
                self.emergency_stop();
                return Ok(());
            }
            Command::SendChat { agent, r#loop, text } if r#loop != "main" => {
                (agent, AgentCommand::LoopChat { name: r#loop, text, turn_id: None })
            }
            Command::SendChat { agent, text, .. } => (agent, AgentCommand::Chat(text)),
            Command::Interrupt { agent } => (agent, AgentCommand::Interrupt),
            Command::Approve { agent, task_id, always } => (agent, AgentCommand::Approve { task_id, always }),
            Command::Deny { agent, task_id, feedback } => (agent, AgentCommand::Deny { task_id, feedback }),
            Command::Answer { agent, request_id, text } => (agent, AgentCommand::Answer { task_id: request_id, text }),
            Command::Stop { agent } => (agent, AgentCommand::SetState("off".into())),
            Command::SetState { agent, state } => {
                if !["idle", "hibernate", "off"].contains(&state.as_str()) {
                    return Err(format!("state \"{state}\" cannot be set by the owner (use idle, hibernate or off)"));
                }
                (agent, AgentCommand::SetState(state))
            }
            // Lifts a suspension; an agent that is off is started by loading it.
            Command::Start { agent } => (agent, AgentCommand::Resume),
        };
        self.send(&agent, c)
    }

    /// An owner message whose turn takes `turn_id`, so the sender can
    /// follow that turn's events (the daemon's chat route).
    pub fn chat_as(&mut self, agent: &str, text: String, turn_id: String) -> Result<(), String> {
        self.send(agent, AgentCommand::ChatAs { text, turn_id })
    }

    /// Send an actor command to one agent (by id, handle or name).
    pub fn send(&self, agent: &str, cmd: AgentCommand) -> Result<(), String> {
        let id = self.resolve(agent)?;
        let loaded = self.agents.get(&id).ok_or_else(|| format!("{agent} is not loaded"))?;
        let name = if loaded.name.is_empty() { agent } else { loaded.name.as_str() };
        if loaded.agent.send(cmd) {
            Ok(())
        } else {
            Err(format!("{name} has stopped; start it again (s in the app, or `adf start {name}`)"))
        }
    }

    /// Agents loaded without a working provider, and why.
    pub fn unconfigured(&self) -> &BTreeMap<String, String> {
        &self.unconfigured
    }

    /// Whether an agent was started (not only loaded).
    pub fn is_started(&self, id: &str) -> bool {
        self.agents.get(id).is_some_and(|l| l.started.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Whether an agent's actor has ended (it was turned off).
    pub fn is_stopped(&self, agent: &str) -> bool {
        self.resolve(agent).ok().and_then(|id| self.agents.get(&id)).is_some_and(|l| l.task.is_finished())
    }

    /// Stop an agent's actor, close its file and load it again (a stopped
    /// agent started again, or new provider settings taken up).
    pub async fn reload(&mut self, agent: &str) -> Result<AgentInfo, String> {
        let id = self.resolve(agent)?;
        let l = self.agents.remove(&id).ok_or_else(|| format!("{agent}: not loaded"))?;
        self.files.remove(&l.canon);
        // The actor ends when its last handle goes.
        drop(l.agent);
        match l.task.await {
            Ok(ex) => ex.store.close().map_err(|e| e.to_string())?,
            Err(e) => return Err(format!("{}: {e}", l.path.display())),
        }
        self.load(&l.path)
    }

    /// Start an agent: lift a suspension, or load again one that is off.
    pub async fn start(&mut self, agent: &str) -> Result<(), String> {
        if self.is_stopped(agent) {
            return self.reload(agent).await.map(|_| ());
        }
        self.command(Command::Start { agent: agent.to_string() })?;
        let Ok(id) = self.resolve(agent) else { return Ok(()) };
        // Its actor marks it started when it takes the command; said so
        // now, so a listing right after the answer agrees.
        if let Some(l) = self.agents.get(&id) {
            l.started.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        // Started now: its channels too, if they were not running.
        if self.mesh.channels.status(&id).is_empty()
            && let Some(mb) = self.mesh.find(&id)
            && let Ok(Ok(cfg)) = mb.with_store(|s| s.config_value())
        {
            self.mesh.channels.start(&mb, &cfg);
            super::mesh::ws::out::start_configured(&self.mesh, &mb, &cfg);
            super::taps::start(&self.mesh, &mb, &cfg);
            super::streams::start_declared(&self.mesh, &mb, &cfg);
        }
        Ok(())
    }

    /// Turn every agent off at once: running turns end now.
    pub fn emergency_stop(&mut self) {
        for l in self.agents.values() {
            l.agent.send(AgentCommand::SetState("off".into()));
        }
    }

    /// Stop every actor and close every file cleanly.
    pub async fn shutdown(mut self) -> Vec<String> {
        let mut errors = Vec::new();
        for (id, l) in std::mem::take(&mut self.agents) {
            self.mesh.unregister(&id);
            drop(l.agent);
            match l.task.await {
                Ok(ex) => {
                    if let Err(e) = ex.store.close() {
                        errors.push(e.to_string());
                    }
                }
                Err(e) => errors.push(format!("{}: {e}", l.path.display())),
            }
            // What a call still running made after the unregister goes too.
            crate::runtime::compute::release(&id);
        }
        // Dedicated containers stop with their agents before the runtime goes.
        crate::runtime::compute::containers::get().settle().await;
        errors
    }
}

#[cfg(test)]
mod activity_tests {
    use super::Activity;
    use serde_json::json;

    #[test]
    fn events_say_what_a_running_agent_waits_on() {
        let mut a = Activity::default();
        a.on("agent.state.changed", 1_000, &json!({"state": "active"}));
        assert_eq!(a.waiting(4_000), [json!({"what": "model", "since_ms": 1_000, "seconds": 3})]);
        a.on("tool.started", 5_000, &json!({"name": "fs_write"}));
        assert_eq!(a.waiting(7_000)[0]["what"], "tool");
        assert_eq!(a.waiting(7_000)[0]["tool"], "fs_write");
        a.on("tool.completed", 8_000, &json!({}));
        a.on("provider.retry_scheduled", 9_000, &json!({"next_retry_at": 19_000}));
        assert_eq!(a.waiting(10_000), [json!({"what": "provider_backoff", "retry_at_ms": 19_000, "in_seconds": 9})]);
        a.on("provider.retry_started", 19_000, &json!({}));
        assert_eq!(a.waiting(20_000)[0]["what"], "model");
        a.on("llm.completed", 21_000, &json!({}));
        a.on("agent.state.changed", 21_000, &json!({"state": "idle"}));
        assert!(a.waiting(30_000).is_empty(), "idle: nothing in flight");
    }
}
