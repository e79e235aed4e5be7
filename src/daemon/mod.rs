//! `adf daemon`: the runtime headless, behind an HTTP control API and an SSE
//! event stream (spec/daemon.md). One process per fleet (a lock in the
//! fleet folder says who holds it); every route but `/health` needs the
//! bearer token; the `Host` header must name this server (no DNS
//! rebinding) and cross-site requests are refused; there are no CORS
//! headers at all. Reads open the agent's file read-only beside its writer
//! (a few at once, on a capped blocking pool); writes go through the
//! agent's actor, as the terminal app's do. Hostile clients are the
//! business of `conn.rs` (accept loop, timeouts, connection cap) and
//! `body.rs` (body limits, JSON error answers).

pub mod bench;
pub mod body;
pub mod conn;
pub mod grants;
pub mod hosts;
pub mod inject;
pub mod local;
pub mod loops;
pub mod mcp;
pub mod memory;
pub mod moves;
pub mod openapi;
pub mod resources;
pub mod roles;
pub mod routes;
pub mod spawn;
pub mod sse;
pub mod token;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::runtime::agent::{AgentCommand, OwnerWork};
use crate::runtime::bus::Bus;
use crate::runtime::executor::Executor;
use crate::runtime::fleet::{Fleet, ProviderFactory};
use crate::store::Store;

/// The control API's default port.
pub const DEFAULT_PORT: u16 = 7385;

/// How the daemon starts.
#[derive(Debug, Clone)]
pub struct Options {
    pub host: String,
    pub port: u16,
    /// Fleet folders and agent files; the default fleet when empty.
    pub paths: Vec<PathBuf>,
    /// Interval of the SSE heartbeat comment.
    pub heartbeat: Duration,
    /// The agent-facing mesh server's port (probes the next 19 when taken);
    /// `None` keeps it off.
    pub mesh_port: Option<u16>,
    /// More names a `Host` header may give (`--allow-host`).
    pub allow_hosts: Vec<String>,
    /// Timeouts, body size and connection cap.
    pub limits: conn::Limits,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            host: "127.0.0.1".into(),
            port: DEFAULT_PORT,
            paths: Vec::new(),
            heartbeat: Duration::from_secs(30),
            mesh_port: Some(crate::runtime::mesh::server::DEFAULT_PORT),
            allow_hosts: Vec::new(),
            limits: conn::Limits::default(),
        }
    }
}

/// What every handler shares.
/// Load and start the agent files agents created with `autostart`
/// (`sys_create_adf`), until the fleet goes.
pub(crate) fn serve_load_requests(shared: &Arc<Shared>, rx: Option<tokio::sync::mpsc::UnboundedReceiver<PathBuf>>) {
    let Some(mut rx) = rx else { return };
    let weak = Arc::downgrade(shared);
    tokio::spawn(async move {
        while let Some(path) = rx.recv().await {
            let Some(shared) = weak.upgrade() else { break };
            if let Err(e) = shared.fleet.lock().await.load(&path) {
                eprintln!("adf: a created agent did not start: {e}");
            }
        }
    });
}

pub struct Shared {
    pub fleet: tokio::sync::Mutex<Fleet>,
    pub bus: Arc<Bus>,
    pub token: String,
    pub allowed_hosts: Vec<String>,
    pub started: Instant,
    pub heartbeat: Duration,
    pub fleet_dir: PathBuf,
    /// Turns true when the daemon shuts down: event streams end with it.
    pub closing: tokio::sync::watch::Receiver<bool>,
    /// Permits for SQLite reads at once (`memory::read_permits`).
    pub reads: Arc<tokio::sync::Semaphore>,
    /// Tokens the owner minted for others, with their roles.
    pub roles: roles::Registry,
}

pub type AppState = Arc<Shared>;

/// An error as the API answers it: `{error, code?}` with a status.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub error: String,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, error: impl Into<String>) -> Self {
        ApiError { status, error: error.into(), code: None }
    }
    pub fn bad(error: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, error)
    }
    pub fn not_found(error: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, error)
    }
    pub fn internal(error: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, error)
    }
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": self.error});
        if let Some(c) = self.code {
            body["code"] = json!(c);
        }
        (self.status, Json(body)).into_response()
    }
}

/// A store error as the API reports it: protection refusals are 403, a
/// missing file or key 404, bad input 400.
impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        use crate::store::StoreError as E;
        let msg = e.to_string();
        match e {
            E::Denied(_) => ApiError::new(StatusCode::FORBIDDEN, msg).with_code("PROTECTED"),
            E::Missing(_) | E::NotFound { .. } => ApiError::not_found(msg),
            E::Invalid(_) => ApiError::bad(msg),
            E::Conflict(_) => ApiError::new(StatusCode::CONFLICT, msg),
            _ => ApiError::internal(msg),
        }
    }
}

pub type ApiResult<T = Json<Value>> = Result<T, ApiError>;

use hosts::is_loopback;

/// The shortest `ADF_DAEMON_TOKEN` accepted for a bind beyond loopback.
pub const MIN_REMOTE_TOKEN: usize = 16;

/// Token, `Host`, `Origin` and `Sec-Fetch-Site` checks for every request.
async fn guard(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    if !s.allowed_hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
        return ApiError::new(StatusCode::FORBIDDEN, format!("Host \"{host}\" is not this daemon"))
            .with_code("BAD_HOST")
            .into_response();
    }
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|h| h.to_str().ok()) {
        let same = s.allowed_hosts.iter().any(|h| origin.eq_ignore_ascii_case(&format!("http://{h}")));
        if !same {
            return ApiError::new(StatusCode::FORBIDDEN, format!("cross-origin request from {origin} refused"))
                .with_code("CROSS_SITE")
                .into_response();
        }
    }
    if headers.get("sec-fetch-site").and_then(|h| h.to_str().ok()) == Some("cross-site") {
        return ApiError::new(StatusCode::FORBIDDEN, "cross-site request refused")
            .with_code("CROSS_SITE")
            .into_response();
    }
    if req.uri().path() == "/health" {
        return next.run(req).await;
    }
    let Some(role) = role_of(headers, &s) else {
        return ApiError::new(StatusCode::UNAUTHORIZED, "Missing or invalid Authorization: Bearer token.")
            .with_code("unauthorized")
            .into_response();
    };
    // The route the router matched (none: a 404 to come, allowed to say so).
    let pattern = req.extensions().get::<axum::extract::MatchedPath>().map(|m| m.as_str().to_string());
    if let Some(p) = &pattern
        && !role.allows(req.method(), p)
    {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "this token's role is {}: it may not {} {}{}",
                role.as_str(),
                req.method(),
                req.uri().path(),
                if role == roles::Role::Observer {
                    " (observers read only)"
                } else {
                    " (approvers read and answer approvals and asks)"
                }
            ),
        )
        .with_code("FORBIDDEN_ROLE")
        .into_response();
    }
    let mut req = req;
    req.extensions_mut().insert(role);
    next.run(req).await
}

/// The role of the request's bearer token: the install's own token is the
/// owner's; a minted one has its own; anything else is none.
fn role_of(headers: &HeaderMap, s: &Shared) -> Option<roles::Role> {
    let t = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))?
        .trim();
    if token::same(t, &s.token) {
        return Some(roles::Role::Owner);
    }
    s.roles.role_of(t)
}

/// Where the daemon of a fleet says how to reach it.
pub fn info_path(fleet_dir: &Path) -> PathBuf {
    fleet_dir.join(".daemon.json")
}

/// The URL of a daemon running for this fleet, if one answers.
pub fn discover(fleet_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(info_path(fleet_dir)).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    let url = v["url"].as_str()?.to_string();
    // A stale file (daemon gone) is ignored: the lock tells.
    crate::store::lock::current_holder(&fleet_dir.join(".daemon"))?;
    Some(url)
}

/// Run the daemon until SIGINT or SIGTERM.
pub fn run(opts: Options, factory: ProviderFactory) -> anyhow::Result<()> {
    // A service starts with 1,024 descriptors; every connection takes one.
    conn::raise_nofile();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(memory::MAX_BLOCKING_THREADS)
        .build()?;
    rt.block_on(serve(opts, factory, shutdown_signal()))
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// What a started daemon tells whoever embeds it (the benchmark).
pub struct Ready {
    pub addr: SocketAddr,
    pub bus: Arc<Bus>,
    pub token: String,
}

/// Serve until `stop` completes.
pub async fn serve(
    opts: Options,
    factory: ProviderFactory,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_with(opts, factory, stop, None).await
}

/// `serve`, saying when it listens (address, bus, token).
pub async fn serve_with(
    opts: Options,
    factory: ProviderFactory,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<Ready>>,
) -> anyhow::Result<()> {
    let env_token = token::from_env();
    if !is_loopback(&opts.host) {
        let Some(t) = &env_token else {
            anyhow::bail!(
                "refusing to listen on {} without ADF_DAEMON_TOKEN: a daemon reachable beyond this machine needs an explicit token",
                opts.host
            );
        };
        let n = t.chars().count();
        if n < MIN_REMOTE_TOKEN {
            anyhow::bail!(
                "refusing to listen on {} with a {n}-character ADF_DAEMON_TOKEN: beyond loopback it must be at least {MIN_REMOTE_TOKEN} characters",
                opts.host
            );
        }
    }
    let token = token::load_or_mint().map_err(anyhow::Error::msg)?;
    let (_, created) =
        crate::identity::install::load_or_create(&crate::paths::config_dir()).map_err(anyhow::Error::msg)?;
    if created {
        eprintln!(
            "adf daemon: created this install's owner identity; `adf identity show --phrase` shows its recovery phrase"
        );
    }
    let fleet_dir = opts.paths.iter().find(|p| p.is_dir()).cloned().unwrap_or_else(crate::paths::fleet_dir);
    let (mut files, _) = crate::cli::ensure_fleet(&fleet_dir)?;
    files.extend(opts.paths.iter().filter(|p| p.is_file()).cloned());
    for d in opts.paths.iter().filter(|p| p.is_dir() && **p != fleet_dir) {
        files.extend(crate::cli::scan(d));
    }
    // A file is never loaded twice, however it was named.
    let mut seen = std::collections::HashSet::new();
    files.retain(|f| seen.insert(std::fs::canonicalize(f).unwrap_or_else(|_| f.clone())));
    let _lock = crate::store::lock::WriterLock::acquire(&fleet_dir.join(".daemon")).map_err(|e| match e {
        crate::store::StoreError::Held { pid, host, since, .. } => anyhow::anyhow!(
            "{}: a daemon already runs for this fleet (pid {pid}, on {host}, since {since}); stop it first or use it",
            fleet_dir.display()
        ),
        other => anyhow::anyhow!(other),
    })?;
    let listener = tokio::net::TcpListener::bind((opts.host.as_str(), opts.port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}:{}: {e}", opts.host, opts.port))?;
    let addr: SocketAddr = listener.local_addr()?;
    crate::runtime::egress::set_daemon_port(addr.port());
    // Files this daemon holds name its API in their lock records, so a
    // command on one of them goes through here.
    let host = if opts.host == "0.0.0.0" || opts.host == "::" { "127.0.0.1" } else { opts.host.as_str() };
    crate::store::lock::set_api(&format!("http://{host}:{}", addr.port()));
    let bus = Bus::with_capacity(event_ring());
    let mut fleet = Fleet::new(bus.clone(), factory).stream_deltas(true).lenient(true);
    // Agents that moved to another host: their old inbox address relays.
    fleet.mesh.set_forwards(crate::runtime::mesh::forward::load_forwards(&fleet_dir));
    // Files named on the command line are the owner's choice; the fleet's
    // start only when the owner created or reviewed them.
    let canon = |p: &PathBuf| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
    let explicit: Vec<PathBuf> = opts.paths.iter().filter(|p| p.is_file()).map(canon).collect();
    let (mut started, mut skipped, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    let mut lan = false;
    let reviewed_ids = crate::review::reviewed();
    for f in &files {
        let cfg = Store::open_read_only(f).ok().and_then(|s| s.config_value().ok()).unwrap_or_default();
        let reviewed = cfg["id"].as_str().is_some_and(|id| reviewed_ids.contains(id));
        let flagged = cfg["autostart"].as_bool().unwrap_or(false);
        lan |= cfg["messaging"]["visibility"] == "lan";
        // Every agent is loaded (listed, readable, answering its owner);
        // only reviewed ones flagged for it are started (timers running).
        let reason = match (explicit.contains(&canon(f)), reviewed, flagged) {
            (true, _, _) | (false, true, true) => None,
            (false, false, _) => Some("unreviewed"),
            (false, true, false) => Some("not_autostart"),
        };
        let loaded = fleet.load_with(f, reason.is_none());
        if loaded.is_ok() && reason == Some("unreviewed") {
            eprintln!("adf daemon: loaded, not started (unreviewed): review it with `adf review {}`", f.display());
        }
        if let Ok(i) = &loaded
            && fleet.foreign().contains(&i.id)
        {
            eprintln!(
                "adf daemon: {} belongs to another owner (its keys and credentials stay sealed): \
                 `adf claim {}` re-keys it to you",
                f.display(),
                f.display()
            );
        }
        match loaded {
            Ok(i) if reason.is_none() => started.push(json!({"id": i.id, "filePath": f})),
            Ok(i) => skipped.push(json!({"id": i.id, "filePath": f, "reason": reason})),
            Err(e) => {
                eprintln!("adf daemon: not loaded: {e}");
                failed.push(json!({"filePath": f, "error": e}));
            }
        }
    }
    let report = json!({"scanned": files.len(), "started": started, "skipped": skipped, "failed": failed});
    // The mesh binds beyond loopback only when an agent asks for the LAN.
    let mut discovery = None;
    let mesh_url = match opts.mesh_port {
        Some(p) => {
            let host = if lan { "0.0.0.0" } else { "127.0.0.1" };
            match crate::runtime::mesh::server::serve(fleet.mesh.clone(), host, p).await {
                Ok(addr) => {
                    // Runtimes on the tailnet and the manual entries are
                    // swept for (every 45 s).
                    crate::runtime::mesh::sweep::start(&fleet.mesh, addr.port());
                    // LAN agents are announced, and other runtimes found, by mDNS.
                    if lan && crate::runtime::mesh::mdns::enabled() {
                        match crate::runtime::mesh::mdns::start(fleet.mesh.clone(), addr.port()) {
                            Ok(d) => discovery = Some(d),
                            Err(e) => eprintln!("adf daemon: no LAN discovery: {e}"),
                        }
                    }
                    fleet.mesh.base_url()
                }
                Err(e) => {
                    eprintln!("adf daemon: mesh server not started ({host}:{p} and the next 19 ports: {e})");
                    None
                }
            }
        }
        None => None,
    };
    let port = addr.port();
    let allowed_hosts = hosts::allowed(&opts.host, port, &opts.allow_hosts);
    let url = format!("http://{}:{port}", if opts.host == "0.0.0.0" { "127.0.0.1" } else { opts.host.as_str() });
    let info = json!({"url": url, "pid": std::process::id(), "port": port, "mesh": mesh_url});
    std::fs::write(info_path(&fleet_dir), info.to_string())?;
    let (closing_tx, closing) = tokio::sync::watch::channel(false);
    let load_requests = fleet.take_load_requests();
    let shared = Arc::new(Shared {
        fleet: tokio::sync::Mutex::new(fleet),
        bus: bus.clone(),
        token,
        allowed_hosts,
        started: Instant::now(),
        heartbeat: opts.heartbeat,
        fleet_dir: fleet_dir.clone(),
        closing: closing.clone(),
        reads: Arc::new(tokio::sync::Semaphore::new(memory::read_permits())),
        roles: roles::Registry::new(roles::tokens_path()),
    });
    serve_load_requests(&shared, load_requests);
    bus.publish(crate::protocol::Envelope::new(
        crate::protocol::kind::DAEMON_STARTED,
        None,
        "system:daemon",
        json!({"host": opts.host, "port": port, "settingsPath": crate::providers::accounts::settings_path()}),
    ));
    bus.publish(crate::protocol::Envelope::new(
        crate::protocol::kind::DAEMON_AUTOSTART_REPORT,
        None,
        "system:daemon",
        json!({"report": report}),
    ));
    eprintln!("adf daemon: listening on {url} (fleet {})", fleet_dir.display());
    if let Some(m) = &mesh_url {
        eprintln!("adf daemon: mesh (agent messaging) on {m}");
    }
    if let Some(r) = ready {
        let _ = r.send(Ready { addr, bus: bus.clone(), token: shared.token.clone() });
    }
    let app = app_router(&shared, &opts.limits);
    tokio::spawn(async move {
        stop.await;
        let _ = closing_tx.send(true);
    });
    tokio::spawn(memory::trimmer(closing.clone()));
    conn::serve(listener, app, opts.limits.clone(), closing).await;
    // Goodbye to the LAN before the agents go.
    drop(discovery);
    let _ = std::fs::remove_file(info_path(&fleet_dir));
    let fleet = Arc::try_unwrap(shared)
        .map(|s| s.fleet.into_inner())
        .map_err(|_| anyhow::anyhow!("the daemon's state is still shared at shutdown"));
    if let Ok(fleet) = fleet {
        for e in fleet.shutdown().await {
            eprintln!("adf daemon: {e}");
        }
    }
    Ok(())
}

/// The control API's routes with their layers, outermost first: error
/// answers as JSON, then the guard (token, `Host`, `Origin`), then the
/// body limits.
pub fn app_router(shared: &AppState, limits: &conn::Limits) -> axum::Router {
    let limits = Arc::new(limits.clone());
    routes::router(shared.clone())
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(limits, body::read_body))
        .layer(axum::middleware::from_fn_with_state(shared.clone(), guard))
        .layer(axum::middleware::from_fn(body::json_errors))
        .with_state(shared.clone())
}

impl Shared {
    /// Resolve an agent (id, handle or name) to its id and file.
    pub async fn agent(&self, key: &str) -> Result<(String, PathBuf), ApiError> {
        let fleet = self.fleet.lock().await;
        let id = fleet.resolve(key).map_err(|e| {
            if e.contains("names") { ApiError::bad(e) } else { ApiError::not_found(format!("Agent not found: {key}")) }
        })?;
        let path =
            fleet.list().into_iter().find(|a| a.id == id).map(|a| a.path).ok_or_else(|| ApiError::not_found(key))?;
        Ok((id, path))
    }

    /// Run a read on a fresh read-only connection, off the async workers.
    pub async fn read<T: Send + 'static>(
        &self,
        key: &str,
        f: impl FnOnce(&Store) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<(String, T), ApiError> {
        let (id, path) = self.agent(key).await?;
        let out = self.on_reader(path, f).await?;
        Ok((id, out))
    }

    /// A read whose answer is large (a loop page, a chat history): built
    /// and serialised on the blocking pool, under the read permit, so the
    /// async workers stay free to accept and answer everyone else. `f`
    /// gets the agent's id.
    pub async fn read_json(
        &self,
        key: &str,
        f: impl FnOnce(&Store, String) -> Result<Value, ApiError> + Send + 'static,
    ) -> Result<Response, ApiError> {
        let (id, path) = self.agent(key).await?;
        let bytes = self
            .on_reader(path, move |st| {
                let v = f(st, id)?;
                serde_json::to_vec(&v).map_err(|e| ApiError::internal(e.to_string()))
            })
            .await?;
        Ok(([(header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/json"))], bytes).into_response())
    }

    /// `f` on a fresh read-only connection to `path`, on the blocking pool,
    /// at most `memory::read_permits` at once.
    async fn on_reader<T: Send + 'static>(
        &self,
        path: PathBuf,
        f: impl FnOnce(&Store) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        // The permit goes with the work: a client that hangs up does not
        // free it while the read still runs.
        let permit = self.reads.clone().acquire_owned().await.map_err(|e| ApiError::internal(e.to_string()))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let store = Store::open_read_only(&path)?;
            f(&store)
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
    }

    /// Run owner work on the agent's actor (which owns the writer).
    pub async fn write<T: Send + 'static>(
        &self,
        key: &str,
        f: impl FnOnce(&mut Executor) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<(String, T), ApiError> {
        let (id, _) = self.agent(key).await?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let work = OwnerWork(Box::new(move |ex| {
            let _ = tx.send(f(ex));
        }));
        self.fleet.lock().await.send(&id, AgentCommand::With(work)).map_err(ApiError::internal)?;
        let out = rx.await.map_err(|_| ApiError::internal(format!("{key}: the agent stopped")))??;
        Ok((id, out))
    }
}

/// Events kept for replay (spec: 1,000). `ADF_EVENT_RING` keeps more (up to
/// 1,000,000), so an app that loses a host for longer misses nothing.
pub fn event_ring() -> usize {
    std::env::var("ADF_EVENT_RING")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map(|n| n.clamp(16, 1_000_000))
        .unwrap_or(crate::runtime::bus::RING)
}
