//! The control API's own accept loop. `axum::serve` has no header read
//! timeout and no connection cap, so a thousand clients that never finished
//! their request head held the daemon's descriptors until it answered no
//! one (issue 14). Here each connection is served by hyper's HTTP/1 server
//! with a header read timeout and counted in a registry; when the count
//! reaches the cap, the connection that has waited longest with no request
//! in flight (an idle keep-alive, or a head that never completed) is closed
//! to make room, and busy ones (a handler running, an event stream) only
//! after those. Nothing is keyed by address: every local client comes from
//! loopback. Shutdown stops accepting, asks every connection to finish its
//! request, and closes what is left after a grace period.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

/// The largest request body (bytes); larger ones are answered 413.
pub const MAX_BODY: usize = 2 << 20;

/// How long shutdown waits for open requests before closing connections.
const GRACE: Duration = Duration::from_secs(5);

/// What the server tolerates from one client.
#[derive(Debug, Clone)]
pub struct Limits {
    /// A request head not complete within this is closed (no answer).
    pub header_timeout: Duration,
    /// A request body not complete within this is answered 408.
    pub body_timeout: Duration,
    /// Larger bodies are answered 413 (at once when declared).
    pub max_body: usize,
    /// Open connections at most; 0 derives it from the descriptor limit.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            max_body: MAX_BODY,
            max_connections: 0,
        }
    }
}

impl Limits {
    /// The defaults, with overrides from the environment for tests and
    /// tuning: `ADF_DAEMON_HEADER_TIMEOUT_MS`, `ADF_DAEMON_BODY_TIMEOUT_MS`,
    /// `ADF_DAEMON_MAX_CONNECTIONS`.
    pub fn from_env() -> Self {
        let num = |k: &str| std::env::var(k).ok().and_then(|v| v.trim().parse::<u64>().ok()).filter(|n| *n > 0);
        let mut l = Limits::default();
        if let Some(ms) = num("ADF_DAEMON_HEADER_TIMEOUT_MS") {
            l.header_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = num("ADF_DAEMON_BODY_TIMEOUT_MS") {
            l.body_timeout = Duration::from_millis(ms);
        }
        if let Some(n) = num("ADF_DAEMON_MAX_CONNECTIONS") {
            l.max_connections = n as usize;
        }
        l
    }

    /// The connection cap: as configured, else half the descriptors this
    /// process may open (the agents' files need the rest), 64 to 4,096.
    pub fn connections(&self) -> usize {
        if self.max_connections > 0 {
            return self.max_connections;
        }
        (nofile().0 / 2).clamp(64, 4096) as usize
    }
}

/// The soft and hard descriptor limits (1,024 each when unknown).
pub fn nofile() -> (u64, u64) {
    #[cfg(unix)]
    {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes into the struct we own.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } == 0 {
            // rlim_t is narrower than u64 on some targets.
            #[allow(clippy::unnecessary_cast)]
            return (l.rlim_cur as u64, l.rlim_max as u64);
        }
    }
    (1024, 1024)
}

/// Raise the soft descriptor limit to the hard one (a service starts with
/// 1,024). Returns the soft limit now in force.
pub fn raise_nofile() -> u64 {
    #[cfg(unix)]
    {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit on a struct we own.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
                let soft = l.rlim_cur;
                l.rlim_cur = l.rlim_max;
                if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                    // macOS refuses more than OPEN_MAX for an unlimited hard limit.
                    l.rlim_cur = soft.max(10_240.min(l.rlim_max));
                    libc::setrlimit(libc::RLIMIT_NOFILE, &l);
                }
            }
        }
    }
    nofile().0
}

fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Requests answered since start, and those in flight (event streams
/// excluded): the memory trimmer's signal that a burst is over.
pub static SERVED: AtomicU64 = AtomicU64::new(0);
pub static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// One connection as the registry sees it.
struct ConnState {
    /// Requests in flight (head read, response body not yet finished).
    busy: AtomicUsize,
    /// When a request last started or finished (or the connection opened).
    last: AtomicU64,
}

struct Entry {
    state: Arc<ConnState>,
    kill: Option<oneshot::Sender<()>>,
}

/// The open connections, so the cap can pick which one to close.
#[derive(Default)]
struct Registry {
    conns: Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
    /// Connection tasks still running (a shed one until it has let go).
    live: AtomicUsize,
    emptied: tokio::sync::Notify,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self) -> (u64, Arc<ConnState>, oneshot::Receiver<()>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnState { busy: AtomicUsize::new(0), last: AtomicU64::new(now_ms()) });
        let (tx, rx) = oneshot::channel();
        self.lock().insert(id, Entry { state: state.clone(), kill: Some(tx) });
        (id, state, rx)
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// A connection task has dropped its connection.
    fn done(&self) {
        if self.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.emptied.notify_waiters();
        }
    }

    /// Wait until no connection task runs, or the deadline.
    async fn drained(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            let emptied = self.emptied.notified();
            if self.live.load(Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, emptied).await.is_err() {
                return false;
            }
        }
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    /// Close one connection: the one idle (or header-incomplete) longest,
    /// else the one busy longest. False when there is none.
    fn shed_one(&self) -> bool {
        let mut conns = self.lock();
        let pick = |busy: bool| {
            conns
                .iter()
                .filter(|(_, e)| (e.state.busy.load(Ordering::Relaxed) > 0) == busy)
                .min_by_key(|(_, e)| e.state.last.load(Ordering::Relaxed))
                .map(|(id, _)| *id)
        };
        let Some(id) = pick(false).or_else(|| pick(true)) else { return false };
        if let Some(mut e) = conns.remove(&id)
            && let Some(kill) = e.kill.take()
        {
            let _ = kill.send(());
        }
        true
    }

    fn shed_all(&self) {
        for (_, mut e) in self.lock().drain() {
            if let Some(kill) = e.kill.take() {
                let _ = kill.send(());
            }
        }
    }
}

/// A request in flight on a connection, until its response body is done.
struct Busy {
    state: Arc<ConnState>,
    counted: bool,
}

impl Busy {
    fn begin(state: &Arc<ConnState>, counted: bool) -> Self {
        state.busy.fetch_add(1, Ordering::Relaxed);
        state.last.store(now_ms(), Ordering::Relaxed);
        if counted {
            ACTIVE.fetch_add(1, Ordering::Relaxed);
        }
        Busy { state: state.clone(), counted }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.state.busy.fetch_sub(1, Ordering::Relaxed);
        self.state.last.store(now_ms(), Ordering::Relaxed);
        if self.counted {
            ACTIVE.fetch_sub(1, Ordering::Relaxed);
        }
        SERVED.fetch_add(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request counted as in flight.
struct Tracked {
    inner: Body,
    _busy: Busy,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What the per-connection service answers.
type Answer = Pin<Box<dyn std::future::Future<Output = Result<hyper::Response<Body>, Infallible>> + Send>>;

/// Close the way a client can still read the answer: send FIN, then read
/// and discard what it is still sending (a body refused with 413) for a
/// moment, so the close does not reset the connection under its reader.
async fn linger(mut io: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = io.shutdown().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    let mut buf = vec![0u8; 16 << 10];
    let mut left: usize = 8 << 20;
    while left > 0 {
        match tokio::time::timeout_at(deadline, io.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => left = left.saturating_sub(n),
            _ => break,
        }
    }
}

/// Whether an accept error is about this one connection (try the next)
/// rather than the process (descriptors or memory exhausted).
fn per_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(e.kind(), K::ConnectionAborted | K::ConnectionRefused | K::ConnectionReset | K::Interrupted)
}

/// Serve `app` on `listener` until `closing` turns true.
pub async fn serve(listener: TcpListener, app: Router, limits: Limits, mut closing: watch::Receiver<bool>) {
    let cap = limits.connections();
    let registry = Arc::new(Registry::default());
    let service = TowerToHyperService::new(app);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = closing.wait_for(|c| *c) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) if per_connection(&e) => continue,
            Err(e) => {
                // Out of descriptors: make room, and do not spin.
                eprintln!("adf daemon: accept: {e}");
                registry.shed_one();
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        while registry.len() >= cap && registry.shed_one() {}
        let _ = stream.set_nodelay(true);
        let (id, state, mut kill) = registry.add();
        let service = service.clone();
        let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| -> Answer {
            let stream = req.uri().path().ends_with("/events");
            let busy = Busy::begin(&state, !stream);
            let fut = hyper::service::Service::call(&service, req);
            Box::pin(async move {
                let resp = fut.await?;
                Ok(resp.map(|inner| Body::new(Tracked { inner, _busy: busy })))
            })
        });
        let mut conn = http.serve_connection(TokioIo::new(stream), svc);
        let registry = registry.clone();
        let mut closing = closing.clone();
        registry.live.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            let finished = tokio::select! {
                r = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => r.is_ok(),
                _ = &mut kill => false,
                _ = async { drop(closing.wait_for(|c| *c).await) } => {
                    Pin::new(&mut conn).graceful_shutdown();
                    tokio::select! {
                        r = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => r.is_ok(),
                        _ = &mut kill => false,
                    }
                }
            };
            // The router (the daemon's state) is let go with the connection.
            let io = conn.into_parts().io.into_inner();
            if finished {
                tokio::select! {
                    _ = linger(io) => {}
                    _ = &mut kill => {}
                }
            }
            registry.remove(id);
            registry.done();
        });
    }
    drop(listener);
    let now = tokio::time::Instant::now();
    if !registry.drained(now + GRACE).await {
        registry.shed_all();
        registry.drained(now + GRACE + Duration::from_secs(1)).await;
    }
}
