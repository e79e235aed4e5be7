//! The terminal app's own control API. When the app runs the fleet itself
//! (no daemon), it serves the daemon's routes over that same fleet on a
//! loopback port with the install's token, and the files it holds name
//! that port in their lock records: `adf config set`, `adf files put`,
//! `adf chat FILE …` on them go through the app, with the agent's rules,
//! instead of failing with "held by another adf process".

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

use super::{AppState, Shared, conn, hosts, memory, token};
use crate::runtime::fleet::Fleet;

/// A loopback port taken before the fleet loads (its files' lock records
/// name it).
pub struct Bound {
    listener: TcpListener,
    pub url: String,
}

/// Take a loopback port for the app's API and say so to the lock records
/// of every file opened from now on.
pub async fn bind() -> anyhow::Result<Bound> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let url = format!("http://127.0.0.1:{}", listener.local_addr()?.port());
    crate::store::lock::set_api(&url);
    Ok(Bound { listener, url })
}

/// The app's fleet, shared with the API that serves it.
pub struct LocalApi {
    pub shared: AppState,
    pub url: String,
    closing: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Bound {
    /// Serve the daemon's routes over `fleet`.
    pub fn serve(self, fleet: Fleet, fleet_dir: PathBuf) -> anyhow::Result<LocalApi> {
        let token = token::load_or_mint().map_err(anyhow::Error::msg)?;
        let port = self.listener.local_addr()?.port();
        let (closing_tx, closing) = tokio::sync::watch::channel(false);
        let mut fleet = fleet;
        let load_requests = fleet.take_load_requests();
        let shared = Arc::new(Shared {
            bus: fleet.bus.clone(),
            fleet: tokio::sync::Mutex::new(fleet),
            token,
            allowed_hosts: hosts::allowed("127.0.0.1", port, &[]),
            started: Instant::now(),
            heartbeat: Duration::from_secs(30),
            fleet_dir,
            closing: closing.clone(),
            reads: Arc::new(tokio::sync::Semaphore::new(memory::read_permits())),
            roles: super::roles::Registry::new(super::roles::tokens_path()),
        });
        super::serve_load_requests(&shared, load_requests);
        let limits = conn::Limits::default();
        let app = super::app_router(&shared, &limits);
        let task = tokio::spawn(conn::serve(self.listener, app, limits, closing));
        Ok(LocalApi { shared, url: self.url, closing: closing_tx, task })
    }
}

impl LocalApi {
    /// The fleet, for the app's own calls.
    pub async fn fleet(&self) -> tokio::sync::MutexGuard<'_, Fleet> {
        self.shared.fleet.lock().await
    }

    /// Stop serving and hand the fleet back (to close its files).
    pub async fn stop(self) -> Option<Fleet> {
        let _ = self.closing.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(6), self.task).await;
        // Handlers still holding the state are gone once serving stopped.
        for _ in 0..100 {
            if Arc::strong_count(&self.shared) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Arc::try_unwrap(self.shared).ok().map(|s| s.fleet.into_inner())
    }
}
