//! WebSockets (issue 21, messaging.md §12, tools.md §9): connections into
//! an agent (a `serving.api` route with method `WS`, upgraded on the mesh
//! server) and out of it (`ws_connections` and `ws_connect`), one registry
//! per runtime. Either kind is driven the same way (`conn.rs`): the DID
//! handshake, frames to the route's lambda (what it returns is sent back)
//! or, without a lambda, ALF messages into the inbox, keepalive, a frame
//! rate limit, and `ws.opened`/`ws.closed` on the bus. Sends wait for the
//! socket to drain above its high-water mark. Outbound connections
//! reconnect (`out.rs`). Both transports (axum's server socket and
//! tokio-tungstenite's client) are reduced to [`Frame`]s on channels here,
//! so the protocol code is written once.

pub mod conn;
pub mod out;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

/// The largest frame a connection takes (either way).
pub const MAX_FRAME: usize = 1 << 20;
/// Default send high-water mark (`high_water_mark_bytes`).
pub const HIGH_WATER: usize = 1 << 20;
/// How long a send waits for the socket to drain.
const DRAIN_WAIT: Duration = Duration::from_secs(30);

/// A frame, whichever library carried it.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(u16, String),
}

impl Frame {
    fn len(&self) -> usize {
        match self {
            Frame::Text(t) => t.len(),
            Frame::Binary(b) | Frame::Ping(b) | Frame::Pong(b) => b.len(),
            Frame::Close(_, r) => r.len() + 2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Inbound,
    Outbound,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Inbound => "inbound",
            Direction::Outbound => "outbound",
        }
    }
}

/// Byte chunks to a stream binding (or why the source failed).
pub type Chunks = mpsc::Sender<Result<Vec<u8>, String>>;

/// One live connection.
pub struct Socket {
    pub id: String,
    pub agent_id: String,
    pub direction: Direction,
    /// The `ws_connections` entry it came from (outbound).
    pub config_id: Option<String>,
    /// The route path (inbound) or URL (outbound), for listings.
    pub target: String,
    remote_did: RwLock<String>,
    /// The remote proved its DID (signed handshake).
    verified: AtomicBool,
    /// Past the handshake: listed, and sends go out.
    ready: AtomicBool,
    pub connected_at: i64,
    last_message_at: AtomicI64,
    out: mpsc::UnboundedSender<Frame>,
    pending: Arc<AtomicUsize>,
    drained: Arc<Notify>,
    pub high_water: usize,
    /// Closed by us (`ws_disconnect`, unload): no reconnect.
    closing: AtomicBool,
    /// A stream binding takes its frames instead of the lambda or inbox.
    bound: Mutex<Option<Chunks>>,
}

impl Socket {
    pub fn new(
        id: String,
        agent_id: &str,
        direction: Direction,
        config_id: Option<String>,
        target: String,
        high_water: usize,
    ) -> (Arc<Socket>, mpsc::UnboundedReceiver<Frame>) {
        let (out, rx) = mpsc::unbounded_channel();
        let s = Socket {
            id,
            agent_id: agent_id.to_string(),
            direction,
            config_id,
            target,
            remote_did: RwLock::new(String::new()),
            verified: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            connected_at: crate::store::now_ms(),
            last_message_at: AtomicI64::new(0),
            out,
            pending: Arc::new(AtomicUsize::new(0)),
            drained: Arc::new(Notify::new()),
            high_water,
            closing: AtomicBool::new(false),
            bound: Mutex::new(None),
        };
        (Arc::new(s), rx)
    }

    pub fn remote_did(&self) -> String {
        self.remote_did.read().map(|d| d.clone()).unwrap_or_default()
    }

    pub fn verified(&self) -> bool {
        self.verified.load(Ordering::Relaxed)
    }

    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    fn set_remote(&self, did: &str, verified: bool) {
        if let Ok(mut d) = self.remote_did.write() {
            *d = did.to_string();
        }
        self.verified.store(verified, Ordering::Relaxed);
    }

    fn touch(&self) {
        self.last_message_at.store(crate::store::now_ms(), Ordering::Relaxed);
    }

    /// Queue a frame without waiting (the driver's own answers).
    fn push(&self, f: Frame) -> bool {
        self.pending.fetch_add(f.len(), Ordering::Relaxed);
        self.out.send(f).is_ok()
    }

    /// Send a frame once the socket has drained below its high-water mark
    /// (waiting at most 30 s).
    pub async fn send(&self, f: Frame) -> Result<(), String> {
        if !self.ready() {
            return Err("Connection not open".into());
        }
        let wait = async {
            while self.pending.load(Ordering::Relaxed) >= self.high_water {
                let notified = self.drained.notified();
                if self.pending.load(Ordering::Relaxed) < self.high_water {
                    break;
                }
                notified.await;
            }
        };
        if tokio::time::timeout(DRAIN_WAIT, wait).await.is_err() {
            return Err(format!(
                "Send buffer did not drain within {} ms ({} bytes pending)",
                DRAIN_WAIT.as_millis(),
                self.pending.load(Ordering::Relaxed)
            ));
        }
        self.touch();
        if self.push(f) { Ok(()) } else { Err("Connection closed before the frame was sent".into()) }
    }

    /// Close from our side (no reconnect).
    pub fn close(&self, code: u16, reason: &str) {
        self.closing.store(true, Ordering::Relaxed);
        // Closing: no longer listed or sent on, at once.
        self.ready.store(false, Ordering::Relaxed);
        let _ = self.out.send(Frame::Close(code, reason.to_string()));
    }

    /// The connection died under us (no pong): unlisted at once and a close
    /// sent, but not a close of ours, so an outbound socket reconnects.
    pub fn drop_dead(&self, code: u16, reason: &str) {
        self.ready.store(false, Ordering::Relaxed);
        let _ = self.out.send(Frame::Close(code, reason.to_string()));
    }

    pub fn closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }

    /// Divert its frames to a stream binding: their bytes, until the
    /// socket ends. `None` when it is bound already.
    pub fn bind(&self) -> Option<mpsc::Receiver<Result<Vec<u8>, String>>> {
        let mut b = self.bound.lock().ok()?;
        if b.as_ref().is_some_and(|tx| !tx.is_closed()) {
            return None;
        }
        let (tx, rx) = mpsc::channel(64);
        *b = Some(tx);
        Some(rx)
    }

    /// Where a frame goes instead, while bound.
    fn bound_to(&self) -> Option<Chunks> {
        self.bound.lock().ok()?.as_ref().filter(|tx| !tx.is_closed()).cloned()
    }

    fn unbind(&self) {
        if let Ok(mut b) = self.bound.lock() {
            *b = None;
        }
    }

    /// `ws_connections`' entry.
    pub fn info(&self) -> Value {
        let last = self.last_message_at.load(Ordering::Relaxed);
        json!({"connection_id": self.id, "remote_did": self.remote_did(), "direction": self.direction.as_str(),
            "connected_at": self.connected_at, "last_message_at": if last > 0 { json!(last) } else { Value::Null },
            "verified": self.verified(), "config_id": self.config_id, "target": self.target})
    }
}

/// The runtime's live connections.
#[derive(Default)]
pub struct Sockets {
    map: RwLock<HashMap<String, Arc<Socket>>>,
    /// Outbound configs being kept up, by `(agent, config id)`: their stop
    /// flags (a `ws_disconnect` by config id, or an unload).
    kept: Mutex<HashMap<(String, String), Arc<AtomicBool>>>,
}

impl Sockets {
    pub fn insert(&self, s: Arc<Socket>) {
        // An outbound socket whose keeping was stopped while it was being
        // made (its agent unloaded mid-reconnect) is closed, not listed.
        if s.direction == Direction::Outbound
            && let Some(cfg) = &s.config_id
            && !self.kept(&s.agent_id, cfg)
        {
            s.close(1000, "agent stopped");
            return;
        }
        if let Ok(mut m) = self.map.write() {
            m.insert(s.id.clone(), s);
        }
    }

    pub fn remove(&self, id: &str) {
        if let Ok(mut m) = self.map.write() {
            m.remove(id);
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<Socket>> {
        self.map.read().ok()?.get(id).cloned()
    }

    /// An agent's connections past their handshake.
    pub fn of(&self, agent_id: &str) -> Vec<Arc<Socket>> {
        let mut v: Vec<Arc<Socket>> = self
            .map
            .read()
            .map(|m| m.values().filter(|s| s.agent_id == agent_id && s.ready()).cloned().collect())
            .unwrap_or_default();
        v.sort_by_key(|s| s.connected_at);
        v
    }

    /// The agent's open socket to a peer that proved `did` (the most
    /// recently active), for the mesh's transport choice.
    pub fn to_did(&self, agent_id: &str, did: &str) -> Option<Arc<Socket>> {
        self.of(agent_id)
            .into_iter()
            .filter(|s| s.verified() && s.remote_did() == did)
            .max_by_key(|s| s.last_message_at.load(Ordering::Relaxed))
    }

    pub fn count(&self) -> usize {
        self.map.read().map(|m| m.len()).unwrap_or(0)
    }

    /// Is a config of the agent being kept up already?
    pub fn kept(&self, agent_id: &str, config_id: &str) -> bool {
        self.kept.lock().is_ok_and(|k| k.contains_key(&(agent_id.to_string(), config_id.to_string())))
    }

    /// Keep an outbound config up until `stop_config`: its stop flag.
    fn keep(&self, agent_id: &str, config_id: &str) -> Arc<AtomicBool> {
        let flag = Arc::new(AtomicBool::new(false));
        if let Ok(mut k) = self.kept.lock()
            && let Some(old) = k.insert((agent_id.to_string(), config_id.to_string()), flag.clone())
        {
            old.store(true, Ordering::Relaxed);
        }
        flag
    }

    fn kept_ended(&self, agent_id: &str, config_id: &str, flag: &Arc<AtomicBool>) {
        if let Ok(mut k) = self.kept.lock() {
            let key = (agent_id.to_string(), config_id.to_string());
            if k.get(&key).is_some_and(|f| Arc::ptr_eq(f, flag)) {
                k.remove(&key);
            }
        }
    }

    /// Stop keeping a config up and close its connections; whether
    /// anything was open or pending.
    pub fn stop_config(&self, agent_id: &str, config_id: &str) -> bool {
        let flag = self.kept.lock().ok().and_then(|mut k| k.remove(&(agent_id.to_string(), config_id.to_string())));
        if let Some(f) = &flag {
            f.store(true, Ordering::Relaxed);
        }
        let live: Vec<Arc<Socket>> = self
            .map
            .read()
            .map(|m| {
                m.values()
                    .filter(|s| s.agent_id == agent_id && s.config_id.as_deref() == Some(config_id))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for s in &live {
            s.close(1000, "closed by the agent");
        }
        flag.is_some() || !live.is_empty()
    }

    /// Close everything of an agent (it is unloaded or stopped).
    pub fn stop_agent(&self, agent_id: &str) {
        if let Ok(mut k) = self.kept.lock() {
            k.retain(|(a, _), f| {
                if a == agent_id {
                    f.store(true, Ordering::Relaxed);
                }
                a != agent_id
            });
        }
        let all: Vec<Arc<Socket>> = self
            .map
            .read()
            .map(|m| m.values().filter(|s| s.agent_id == agent_id).cloned().collect())
            .unwrap_or_default();
        for s in all {
            s.close(1001, "agent stopped");
        }
    }
}

/// Frames of a transport as channels: what arrives, and a writer fed by
/// the socket's queue that counts the bytes it has sent.
pub struct Wire {
    pub rx: mpsc::Receiver<Frame>,
}

/// Pump a `Stream + Sink` of some library's messages through [`Frame`]s.
fn pump<S, M, E>(
    ws: S,
    mut queue: mpsc::UnboundedReceiver<Frame>,
    pending: Arc<AtomicUsize>,
    drained: Arc<Notify>,
    to_frame: fn(M) -> Option<Frame>,
    from_frame: fn(Frame) -> M,
) -> Wire
where
    S: futures_util::Stream<Item = Result<M, E>> + futures_util::Sink<M> + Send + 'static,
    M: Send + 'static,
    E: Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        // Once the driver is done, what still arrives is read and dropped
        // for a moment, so our close frame reaches a peer that is still
        // sending instead of a reset discarding it.
        let mut until: Option<tokio::time::Instant> = None;
        loop {
            let next = match until {
                Some(t) => match tokio::time::timeout_at(t, stream.next()).await {
                    Ok(n) => n,
                    Err(_) => break,
                },
                None => stream.next().await,
            };
            let Some(Ok(m)) = next else { break };
            let Some(f) = to_frame(m) else { continue };
            let close = matches!(f, Frame::Close(..));
            if until.is_none() && tx.send(f).await.is_err() {
                until = Some(tokio::time::Instant::now() + Duration::from_secs(2));
            }
            if close {
                break;
            }
        }
    });
    tokio::spawn(async move {
        while let Some(f) = queue.recv().await {
            let n = f.len();
            let close = matches!(f, Frame::Close(..));
            let ok = sink.send(from_frame(f)).await.is_ok();
            pending.fetch_sub(n.min(pending.load(Ordering::Relaxed)), Ordering::Relaxed);
            drained.notify_waiters();
            if !ok || close {
                break;
            }
        }
        let _ = sink.close().await;
        // Whatever was queued after the end is not coming.
        pending.store(0, Ordering::Relaxed);
        drained.notify_waiters();
    });
    Wire { rx }
}

/// `to_frame` and `from_frame` for a WebSocket library's `Message` (axum's
/// and tokio-tungstenite's have the same shape in different types).
macro_rules! frames {
    ($msg:ty, $close:ident, $code:expr, $extra:pat) => {
        fn to(m: $msg) -> Option<Frame> {
            type M = $msg;
            Some(match m {
                M::Text(t) => Frame::Text(t.to_string()),
                M::Binary(b) => Frame::Binary(b.to_vec()),
                M::Ping(b) => Frame::Ping(b.to_vec()),
                M::Pong(b) => Frame::Pong(b.to_vec()),
                M::Close(c) => {
                    c.map_or(Frame::Close(1005, String::new()), |c| Frame::Close(c.code.into(), c.reason.to_string()))
                }
                #[allow(unreachable_patterns)]
                $extra => return None,
            })
        }
        fn from(f: Frame) -> $msg {
            type M = $msg;
            match f {
                Frame::Text(t) => M::Text(t.into()),
                Frame::Binary(b) => M::Binary(b.into()),
                Frame::Ping(b) => M::Ping(b.into()),
                Frame::Pong(b) => M::Pong(b.into()),
                Frame::Close(code, reason) => M::Close(Some($close { code: $code(code), reason: reason.into() })),
            }
        }
    };
}

/// A server-side socket (axum) as a [`Wire`] fed by `sock`'s queue.
pub fn wire_server(ws: axum::extract::ws::WebSocket, sock: &Socket, queue: mpsc::UnboundedReceiver<Frame>) -> Wire {
    use axum::extract::ws::CloseFrame;
    frames!(axum::extract::ws::Message, CloseFrame, |c: u16| c, _);
    pump(ws, queue, sock.pending.clone(), sock.drained.clone(), to, from)
}

/// A client-side socket (tokio-tungstenite) as a [`Wire`].
pub fn wire_client<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    sock: &Socket,
    queue: mpsc::UnboundedReceiver<Frame>,
) -> Wire
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    frames!(tokio_tungstenite::tungstenite::Message, CloseFrame, |c: u16| c.into(), _);
    pump(ws, queue, sock.pending.clone(), sock.drained.clone(), to, from)
}
