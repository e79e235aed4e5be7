//! The mesh: how agents reach each other (messaging.md §5–13). One `Mesh`
//! per runtime holds a mailbox for every loaded agent; a message for one of
//! them is taken in here (`ingress`) whether it came from a sibling agent
//! of this fleet or over HTTP (`server`), and the recipient's actor is told
//! so its `on_inbox` triggers fire. Sending (`msg_send`, `agent_discover`)
//! lives in `send.rs`; cards in `card.rs`.

pub mod api;
pub mod card;
pub mod forward;
pub mod ingress;
pub mod mdns;
pub mod peers;
pub mod send;
mod serve;
pub mod serve_bench;
pub mod server;
pub mod sweep;
pub mod ws;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::mpsc;

use super::agent::AgentCommand;
use super::bus::Bus;
use crate::store::Store;

/// Visibility tiers in rank order (messaging.md §8).
pub fn rank(tier: &str) -> Option<u8> {
    match tier {
        "directory" => Some(0),
        "localhost" => Some(1),
        "lan" => Some(2),
        "public" => Some(3),
        _ => None,
    }
}

/// May a requester in `scope` reach an agent of `visibility`?
pub fn permits(visibility: &str, scope: &str) -> bool {
    visibility != "off" && matches!((rank(visibility), rank(scope)), (Some(v), Some(s)) if s <= v)
}

/// The scope of a remote address (`classifyRemote`).
pub fn classify(ip: Option<IpAddr>) -> &'static str {
    let ip = match ip {
        None => return "localhost",
        Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        Some(ip) => ip,
    };
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            if o[0] == 127 {
                "localhost"
            } else if o[0] == 10
                || (o[0] == 172 && (16..32).contains(&o[1]))
                || (o[0] == 192 && o[1] == 168)
                || (o[0] == 169 && o[1] == 254)
                || (o[0] == 100 && (64..128).contains(&o[1]))
            {
                "lan"
            } else {
                "public"
            }
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            if v6.is_loopback() {
                "localhost"
            } else if (s[0] & 0xffc0) == 0xfe80 || (s[0] & 0xfe00) == 0xfc00 {
                "lan"
            } else {
                "public"
            }
        }
    }
}

/// Same-runtime scope: `directory` when the sender's folder is the
/// recipient's or one of its ancestors, else `localhost`.
pub fn ancestor_scope(sender_dir: &Path, recipient_dir: &Path) -> &'static str {
    if recipient_dir.starts_with(sender_dir) { "directory" } else { "localhost" }
}

/// A loaded agent as the mesh sees it.
pub struct Mailbox {
    pub id: String,
    pub handle: String,
    /// The agent's DID (changes when the file is claimed).
    did: RwLock<String>,
    pub path: PathBuf,
    /// The folder of the file (directory scope).
    pub dir: PathBuf,
    /// A second connection to the file for ingress (opened on first use).
    store: Mutex<Option<Store>>,
    /// The agent's actor, told about new inbox rows.
    tx: mpsc::WeakUnboundedSender<AgentCommand>,
    /// A runner executor on a second connection (inbox middleware).
    pub(crate) runner: Runner,
    /// Its API routes' runners, admission and cache (`api.rs`).
    pub(crate) serving: api::Serving,
}

/// Makes a runner executor for an agent's file.
pub type Runner = Box<dyn Fn() -> Option<super::executor::Executor> + Send + Sync>;

/// The names a loaded agent is known by, to register it in the mesh.
#[derive(Debug, Clone, Copy)]
pub struct AgentNames<'a> {
    pub id: &'a str,
    pub handle: &'a str,
    pub did: &'a str,
    /// The path it was loaded from.
    pub path: &'a Path,
    /// `path` resolved (the caller did it already); its folder is the
    /// agent's, for the ancestor scope of discovery and sends.
    pub canon: &'a Path,
}

impl Mailbox {
    pub fn did(&self) -> String {
        self.did.read().map(|d| d.clone()).unwrap_or_default()
    }

    pub fn set_did(&self, did: &str) {
        if let Ok(mut d) = self.did.write() {
            *d = did.to_string();
        }
    }

    /// Run `f` on the mailbox's connection to the file (blocking).
    pub fn with_store<T>(&self, f: impl FnOnce(&mut Store) -> T) -> Result<T, String> {
        let mut guard = self.store.lock().map_err(|_| "mailbox lock poisoned".to_string())?;
        if guard.is_none() {
            *guard = Some(Store::sibling(&self.path).map_err(|e| e.to_string())?);
        }
        match guard.as_mut() {
            Some(s) => Ok(f(s)),
            None => Err("mailbox store unavailable".into()),
        }
    }

    pub fn notify(&self, cmd: AgentCommand) {
        if let Some(tx) = self.tx.upgrade() {
            let _ = tx.send(cmd);
        }
    }
}

/// The runtime's mesh: mailboxes, the public base URL once the server
/// listens, known peers, and an HTTP client for delivery.
pub struct Mesh {
    boxes: RwLock<BTreeMap<String, Arc<Mailbox>>>,
    pub runtime_id: String,
    pub runtime_did: Option<String>,
    /// The key of `runtime_did` (proofs on `/ping`).
    runtime_key: std::sync::OnceLock<ed25519_dalek::SigningKey>,
    base_url: RwLock<Option<String>>,
    /// Peer runtimes (`http://host:port`), where they came from (`mdns`,
    /// `manual`, `tailnet`) and when they were last seen.
    peers: RwLock<peers::PeerTable>,
    /// The tailnet and manual-peer sweep (`sweep.rs`), one at a time.
    sweeper: tokio::sync::Mutex<sweep::Sweeper>,
    /// Agents that moved to another host: their messages are relayed.
    forwards: RwLock<Vec<forward::Forward>>,
    pub http: reqwest::Client,
    pub bus: Arc<Bus>,
    started: std::time::Instant,
    /// Live agent states, as the fleet follows them.
    states: Arc<Mutex<BTreeMap<String, String>>>,
    /// Files agents created and asked to start (`sys_create_adf` with
    /// autostart); the fleet that owns this mesh loads them.
    loads: Mutex<Option<mpsc::UnboundedSender<PathBuf>>>,
    /// Channel adapters of the loaded agents (Telegram, …).
    pub channels: crate::channels::Registry,
    /// Live WebSockets of the loaded agents, in and out (`ws/`).
    pub sockets: ws::Sockets,
    /// Stream bindings of the loaded agents (`runtime/streams`).
    pub bindings: crate::runtime::streams::Bindings,
    /// The running event taps of each agent (`runtime/taps.rs`).
    taps: Mutex<BTreeMap<String, tokio::task::AbortHandle>>,
}

impl Mesh {
    /// The mesh of this install's runtime (its id and DID from the
    /// install's identity, a fresh id when there is none).
    pub fn new(bus: Arc<Bus>, states: Arc<Mutex<BTreeMap<String, String>>>) -> Arc<Self> {
        let inst = crate::identity::install::load(&crate::paths::config_dir()).ok().flatten();
        let runtime = match &inst {
            Some(i) => (i.runtime_id.clone(), Some(i.runtime_did.clone())),
            None => (crate::store::create::nanoid(12), None),
        };
        let mesh = Self::with_runtime(bus, states, runtime);
        if let Some(i) = inst {
            let _ = mesh.runtime_key.set(i.runtime_signing.clone());
        }
        mesh
    }

    /// The runtime's signing key (its DID's), when this install has one.
    pub fn runtime_key(&self) -> Option<&ed25519_dalek::SigningKey> {
        self.runtime_key.get()
    }

    /// A mesh for a given runtime `(id, DID)`.
    pub fn with_runtime(
        bus: Arc<Bus>,
        states: Arc<Mutex<BTreeMap<String, String>>>,
        runtime: (String, Option<String>),
    ) -> Arc<Self> {
        // Manually listed peer runtimes (`meshPeers` in settings.json,
        // `ADF_MESH_PEERS`) are routes from the start; the sweep probes them.
        let mut table = peers::PeerTable::default();
        for url in sweep::manual_peers(server::DEFAULT_PORT).0 {
            table.upsert(&url, "manual", Default::default());
        }
        let http = crate::providers::client_builder()
            .timeout(std::time::Duration::from_secs(15))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_else(|_| crate::providers::http_client());
        Arc::new(Mesh {
            boxes: RwLock::new(BTreeMap::new()),
            runtime_id: runtime.0,
            runtime_did: runtime.1,
            runtime_key: Default::default(),
            base_url: RwLock::new(None),
            peers: RwLock::new(table),
            sweeper: Default::default(),
            forwards: Default::default(),
            http,
            bus,
            started: std::time::Instant::now(),
            states,
            loads: Mutex::new(None),
            channels: Default::default(),
            sockets: Default::default(),
            taps: Default::default(),
            bindings: Default::default(),
        })
    }

    /// Where load requests go (set by the fleet).
    pub fn set_loader(&self, tx: mpsc::UnboundedSender<PathBuf>) {
        if let Ok(mut l) = self.loads.lock() {
            *l = Some(tx);
        }
    }

    /// Ask the runtime to load and start an agent file; false when no
    /// fleet serves this mesh.
    pub fn request_load(&self, path: PathBuf) -> bool {
        self.loads.lock().ok().and_then(|l| l.as_ref().map(|tx| tx.send(path).is_ok())).unwrap_or(false)
    }

    /// Register a loaded agent under its names.
    pub fn register(&self, names: AgentNames<'_>, tx: mpsc::WeakUnboundedSender<AgentCommand>, runner: Runner) {
        let AgentNames { id, handle, did, path, canon } = names;
        let dir = canon.parent().or_else(|| path.parent()).map(Path::to_path_buf).unwrap_or_default();
        let mb = Mailbox {
            id: id.to_string(),
            handle: handle.to_string(),
            did: RwLock::new(did.to_string()),
            path: path.to_path_buf(),
            dir,
            store: Mutex::new(None),
            tx,
            runner,
            serving: Default::default(),
        };
        if let Ok(mut b) = self.boxes.write() {
            b.insert(id.to_string(), Arc::new(mb));
        }
    }

    /// Forget an agent (its ingress connection closes).
    pub fn unregister(&self, id: &str) {
        self.channels.stop_agent(id);
        self.sockets.stop_agent(id);
        self.stop_taps(id);
        self.bindings.stop_agent(id);
        crate::runtime::compute::release(id);
        let gone = self.boxes.write().ok().and_then(|mut b| b.remove(id));
        if let Some(mb) = &gone {
            mb.serving.close();
        }
        if let Some(mb) = gone
            && let Ok(mut s) = mb.store.lock()
            && let Some(store) = s.take()
        {
            let _ = store.close();
        }
    }

    pub fn mailboxes(&self) -> Vec<Arc<Mailbox>> {
        self.boxes.read().map(|b| b.values().cloned().collect()).unwrap_or_default()
    }

    /// Keep an agent's running taps (replacing, and stopping, earlier ones).
    pub fn set_taps(&self, id: &str, task: tokio::task::AbortHandle) {
        if let Ok(mut t) = self.taps.lock()
            && let Some(old) = t.insert(id.to_string(), task)
        {
            old.abort();
        }
    }

    pub fn stop_taps(&self, id: &str) {
        if let Some(t) = self.taps.lock().ok().and_then(|mut t| t.remove(id)) {
            t.abort();
        }
    }

    /// A mailbox by agent id, handle or DID.
    pub fn find(&self, key: &str) -> Option<Arc<Mailbox>> {
        let b = self.boxes.read().ok()?;
        b.get(key).or_else(|| b.values().find(|m| m.handle == key || (!key.is_empty() && m.did() == key))).cloned()
    }

    pub fn state_of(&self, id: &str) -> String {
        self.states.lock().ok().and_then(|s| s.get(id).cloned()).unwrap_or_else(|| "idle".into())
    }

    pub fn base_url(&self) -> Option<String> {
        self.base_url.read().ok().and_then(|b| b.clone())
    }

    pub fn set_base_url(&self, url: Option<String>) {
        if let Ok(mut b) = self.base_url.write() {
            *b = url;
        }
    }

    /// One route per known peer runtime: `(url, source)`.
    pub fn peers(&self) -> Vec<(String, &'static str)> {
        self.peers.read().map(|p| p.routes()).unwrap_or_default()
    }

    /// Every row of the peer table, each with the route that shadows it
    /// (another source's row for the same runtime), if any.
    pub fn peer_rows(&self) -> Vec<peers::Peer> {
        self.peers.read().map(|p| p.list()).unwrap_or_default()
    }

    /// The peer table as `adf peers` and `GET /peers` show it.
    pub async fn peers_report(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self
            .peers
            .read()
            .map(|t| {
                t.list()
                    .iter()
                    .map(|r| {
                        let mut v = serde_json::to_value(r).unwrap_or_default();
                        let by = t.shadowed_by(r);
                        v["route"] = by.is_none().into();
                        if let Some(o) = by {
                            v["shadowed_by"] = o.url.clone().into();
                        }
                        v
                    })
                    .collect()
            })
            .unwrap_or_default();
        let sw = self.sweeper.lock().await;
        serde_json::json!({
            "runtime_id": self.runtime_id,
            "peers": rows,
            "tailnet": sw.tailnet,
            "bad_manual": sw.bad_manual,
            "backing_off": sw.backing_off(),
            "last_sweep": sw.last_sweep,
        })
    }

    /// The agents that moved away from this runtime.
    pub fn forwards(&self) -> Vec<forward::Forward> {
        self.forwards.read().map(|f| f.clone()).unwrap_or_default()
    }

    pub fn set_forwards(&self, list: Vec<forward::Forward>) {
        if let Ok(mut f) = self.forwards.write() {
            *f = list;
        }
    }

    /// Where messages for a handle or DID that moved away go now.
    pub fn forward_for(&self, key: &str) -> Option<String> {
        let f = self.forwards.read().ok()?;
        f.iter().find(|f| f.handle == key || (!key.is_empty() && f.did == key)).map(|f| f.to.clone())
    }

    /// Change the peer table.
    pub fn with_peers<T>(&self, f: impl FnOnce(&mut peers::PeerTable) -> T) -> Option<T> {
        self.peers.write().ok().map(|mut t| f(&mut t))
    }

    /// Add a peer runtime found by `source`.
    pub fn add_peer(&self, url: &str, source: &'static str) {
        self.with_peers(|t| t.upsert(url, source, Default::default()));
    }

    /// Forget a peer that `source` found (it went away).
    pub fn remove_peer(&self, url: &str, source: &'static str) {
        self.with_peers(|t| t.remove(url, source));
    }

    /// The mesh server listens on `port`: the sweep probes tailnet
    /// machines there (and on the default port).
    pub fn set_sweep_port(&self, port: u16) {
        if let Ok(mut s) = self.sweeper.try_lock() {
            s.set_own_port(port);
        }
    }

    /// Sweep the tailnet and the manual entries now (`sweep.rs`).
    pub async fn sweep_now(&self) {
        self.sweeper.lock().await.sweep(self).await;
    }

    pub fn uptime_secs(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// The local mailbox an address points at (`<our base>/agents/<h>/inbox`).
    pub fn local_for_address(&self, address: &str) -> Option<Arc<Mailbox>> {
        let base = self.base_url()?;
        let rest = address.strip_prefix(&base)?.strip_prefix("/agents/")?;
        let handle = rest.strip_suffix("/inbox")?;
        self.find(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_and_scopes() {
        assert!(permits("localhost", "localhost"));
        assert!(permits("localhost", "directory"));
        assert!(!permits("localhost", "lan"), "a LAN origin exceeds a localhost agent");
        assert!(permits("lan", "lan"));
        assert!(!permits("lan", "public"));
        assert!(!permits("off", "directory"));
        assert!(!permits("directory", "localhost"));
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert_eq!(classify(None), "localhost");
        assert_eq!(classify(ip("127.0.0.9")), "localhost");
        assert_eq!(classify(ip("::1")), "localhost");
        assert_eq!(classify(ip("::ffff:127.0.0.1")), "localhost");
        assert_eq!(classify(ip("192.168.1.4")), "lan");
        assert_eq!(classify(ip("100.100.1.1")), "lan");
        assert_eq!(classify(ip("172.20.0.1")), "lan");
        assert_eq!(classify(ip("172.32.0.1")), "public");
        assert_eq!(classify(ip("fe80::1")), "lan");
        assert_eq!(classify(ip("fd00::1")), "lan");
        assert_eq!(classify(ip("8.8.8.8")), "public");
        assert_eq!(ancestor_scope(Path::new("/f"), Path::new("/f/team")), "directory");
        assert_eq!(ancestor_scope(Path::new("/f/team"), Path::new("/f")), "localhost");
    }
}
