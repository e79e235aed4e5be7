//! Connections out of an agent (`ws_connections`, `ws_connect`): connect
//! (to the address the egress guard checked, when it did; TLS for `wss:`),
//! drive the connection, and while `auto_reconnect` holds, connect again
//! after `reconnect_delay_ms × attempt` (five attempts; an opened
//! connection starts the count again), saying so with `ws.reconnecting`.
//! Closing it from our side (`ws_disconnect`, an unload) ends it for good.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::conn::{self, Auth, Handler, Role, Setup};
use super::{Direction, HIGH_WATER, MAX_FRAME, Socket, wire_client};
use crate::protocol::{Envelope, kind};
use crate::runtime::mesh::{Mailbox, Mesh, classify};

const MAX_ATTEMPTS: u32 = 5;

/// One `ws_connections` entry, read.
#[derive(Debug, Clone, PartialEq)]
pub struct OutConfig {
    pub id: String,
    pub url: String,
    pub did: Option<String>,
    pub lambda: Option<String>,
    pub auth: Auth,
    pub auto_reconnect: bool,
    pub reconnect_delay: Duration,
    pub keepalive: Duration,
    pub connect_timeout: Duration,
    pub high_water: usize,
    /// The agent made this connection (`origin: "agent"`): every connect
    /// passes the egress guard, with `security.allow_local_fetch`.
    pub guard: Option<bool>,
}

impl OutConfig {
    /// Read an entry (format.md §7.2 defaults); `Err` says what is wrong.
    pub fn from_value(v: &Value) -> Result<OutConfig, String> {
        Self::read(v, false)
    }

    /// `from_value` for an agent whose `allow_local_fetch` is `allow_local`.
    pub fn read(v: &Value, allow_local: bool) -> Result<OutConfig, String> {
        let id = v["id"].as_str().filter(|s| !s.is_empty()).ok_or("a WebSocket connection needs an id")?;
        let raw = v["url"].as_str().ok_or_else(|| format!("connection {id:?} has no url"))?;
        let mut parsed = url::Url::parse(raw).map_err(|e| format!("connection {id:?}: {raw:?} is not a URL: {e}"))?;
        // tools.md takes http(s) URLs too: the same server's WebSocket.
        let scheme = match parsed.scheme() {
            "ws" | "http" => "ws",
            "wss" | "https" => "wss",
            _ => return Err(format!("connection {id:?}: {raw} is not a ws:, wss:, http: or https: URL")),
        };
        if parsed.scheme() != scheme {
            parsed.set_scheme(scheme).map_err(|()| format!("connection {id:?}: {raw} cannot be a {scheme}: URL"))?;
        }
        let url = parsed.as_str();
        let ms = |k: &str, d: u64| Duration::from_millis(v[k].as_u64().unwrap_or(d).max(1));
        Ok(OutConfig {
            id: id.to_string(),
            url: url.to_string(),
            did: v["did"].as_str().filter(|s| !s.is_empty()).map(str::to_string),
            lambda: v["lambda"].as_str().filter(|s| !s.is_empty()).map(str::to_string),
            auth: Auth::parse(v["auth"].as_str()),
            auto_reconnect: v["auto_reconnect"].as_bool().unwrap_or(true),
            reconnect_delay: ms("reconnect_delay_ms", 5_000),
            keepalive: ms("keepalive_interval_ms", 30_000).max(Duration::from_millis(100)),
            connect_timeout: ms("connect_timeout_ms", 15_000),
            high_water: v["high_water_mark_bytes"].as_u64().map_or(HIGH_WATER, |n| n.clamp(1024, 64 << 20) as usize),
            guard: (v["origin"] == "agent").then_some(allow_local),
        })
    }
}

/// Connect the agent's enabled `ws_connections` (it started).
pub fn start_configured(mesh: &Arc<Mesh>, mb: &Arc<Mailbox>, cfg: &Value) {
    for entry in cfg["ws_connections"].as_array().into_iter().flatten() {
        if entry["enabled"] == false {
            continue;
        }
        let allow_local = cfg["security"]["allow_local_fetch"].as_bool().unwrap_or(false);
        match OutConfig::read(entry, allow_local) {
            // Started already (an agent started twice).
            Ok(c) if mesh.sockets.kept(&mb.id, &c.id) => {}
            Ok(c) => {
                let stop = mesh.sockets.keep(&mb.id, &c.id);
                tokio::spawn(keep_up(mesh.clone(), mb.clone(), c, None, stop, None));
            }
            Err(e) => {
                let _ = mb.with_store(|s| s.log("warn", "ws", "config_invalid", &e));
            }
        }
    }
}

/// Connect `c` now and keep it up: the connection id once its handshake
/// is done, or why the first attempt failed (then it is not retried).
/// `pin`: the address the egress guard checked, for an ad-hoc URL.
pub async fn connect(
    mesh: Arc<Mesh>,
    mb: Arc<Mailbox>,
    c: OutConfig,
    pin: Option<SocketAddr>,
) -> Result<String, String> {
    let stop = mesh.sockets.keep(&mb.id, &c.id);
    let (tx, rx) = oneshot::channel();
    tokio::spawn(keep_up(mesh, mb, c, pin, stop, Some(tx)));
    rx.await.unwrap_or_else(|_| Err("the connection ended before its handshake".into()))
}

type First = Option<oneshot::Sender<Result<String, String>>>;

async fn keep_up(
    mesh: Arc<Mesh>,
    mb: Arc<Mailbox>,
    c: OutConfig,
    pin: Option<SocketAddr>,
    stop: Arc<AtomicBool>,
    mut first: First,
) {
    let mut attempt = 0u32;
    loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let outcome = once(&mesh, &mb, &c, pin, &mut first).await;
        let (opened, again) = match outcome {
            Ok((ended, closing)) => {
                if !ended.opened {
                    let _ = mb
                        .with_store(|s| s.log("warn", "ws", "connect_failed", &format!("{}: {}", c.id, ended.reason)));
                }
                (ended.opened, !closing && ended.code != 1000)
            }
            // A `ws_connect` whose first attempt failed reports it instead.
            Err(e) if first.is_some() => {
                if let Some(tx) = first.take() {
                    let _ = tx.send(Err(e));
                }
                break;
            }
            Err(e) => {
                let _ = mb.with_store(|s| s.log("warn", "ws", "connect_failed", &format!("{}: {e}", c.id)));
                (false, true)
            }
        };
        if opened {
            attempt = 0;
        }
        if !again || !c.auto_reconnect || stop.load(Ordering::Relaxed) {
            break;
        }
        attempt += 1;
        if attempt > MAX_ATTEMPTS {
            let _ = mb.with_store(|s| {
                s.log("warn", "ws", "reconnect_gave_up", &format!("{}: {MAX_ATTEMPTS} attempts failed", c.id))
            });
            break;
        }
        let delay = c.reconnect_delay * attempt;
        mesh.bus.publish(Envelope::new(
            kind::WS_RECONNECTING,
            Some(&mb.id),
            "system:ws",
            json!({"config_id": c.id, "attempt": attempt, "max_attempts": MAX_ATTEMPTS, "delay_ms": delay.as_millis() as u64}),
        ));
        let until = tokio::time::Instant::now() + delay;
        while tokio::time::Instant::now() < until && !stop.load(Ordering::Relaxed) {
            tokio::time::sleep_until(until.min(tokio::time::Instant::now() + Duration::from_millis(200))).await;
        }
    }
    mesh.sockets.kept_ended(&mb.id, &c.id, &stop);
}

/// One connection: open, hand `first` its id once past the handshake,
/// drive it to its end. `Ok((how it ended, closed by us))`.
async fn once(
    mesh: &Arc<Mesh>,
    mb: &Arc<Mailbox>,
    c: &OutConfig,
    pin: Option<SocketAddr>,
    first: &mut First,
) -> Result<(conn::Ended, bool), String> {
    let (ws, addr) = open(c, pin).await?;
    let id = crate::store::create::nanoid(10);
    let (sock, queue) =
        Socket::new(id.clone(), &mb.id, Direction::Outbound, Some(c.id.clone()), c.url.clone(), c.high_water);
    let wire = wire_client(ws, &sock, queue);
    let setup = Setup {
        mesh: mesh.clone(),
        mb: mb.clone(),
        sock: sock.clone(),
        handler: Handler::of(c.lambda.as_deref().unwrap_or_default()),
        role: Role::Client { auth: c.auth, expect: c.did.clone() },
        keepalive: c.keepalive,
        scope: classify(Some(addr.ip())),
        peer: Some(addr.ip()),
        open: json!({"url": c.url, "config_id": c.id}),
        ready: None,
        rate: conn::RATE,
    };
    let (ready_tx, ready_rx) = oneshot::channel();
    let setup = Setup { ready: Some(ready_tx), ..setup };
    let drive = tokio::spawn(conn::drive(setup, wire));
    // Report the id once the handshake is through, or why it was not.
    if let Some(tx) = first.take() {
        if ready_rx.await.is_ok() {
            let _ = tx.send(Ok(id));
        } else {
            let ended = drive.await.map_err(|e| e.to_string())?;
            let _ = tx.send(Err(ended.reason.clone()));
            return Ok((ended, true));
        }
    }
    let ended = drive.await.map_err(|e| e.to_string())?;
    Ok((ended, sock.closing()))
}

type ClientStream = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// TCP (to `pin` when the guard checked the address), then the WebSocket
/// handshake, both within `connect_timeout`.
async fn open(c: &OutConfig, pin: Option<SocketAddr>) -> Result<(ClientStream, SocketAddr), String> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = url::Url::parse(&c.url).map_err(|e| e.to_string())?;
    let host = url.host_str().ok_or("the URL has no host")?.trim_matches(['[', ']']).to_string();
    let port = url.port_or_known_default().unwrap_or(80);
    let t = c.connect_timeout;
    let within = |what: &str| format!("Connect timeout after {} ms ({what})", t.as_millis());
    // The agent's own URL: checked again at every connect (a name may
    // point elsewhere now).
    let pin = match (pin, c.guard) {
        (None, Some(allow_local)) => {
            let mut http = url.clone();
            http.set_scheme(if url.scheme() == "wss" { "https" } else { "http" }).map_err(|_| "not a ws: URL")?;
            let t = crate::runtime::egress::check(&http, allow_local, &crate::runtime::egress::SystemResolver)
                .await
                .map_err(|e| format!("refused by the egress guard: {e}"))?;
            t.pin.map(|(_, a)| a).or_else(|| host.parse().ok().map(|ip| SocketAddr::new(ip, port)))
        }
        (p, _) => p,
    };
    let addr = match pin {
        Some(a) => a,
        None => tokio::time::timeout(t, tokio::net::lookup_host((host.as_str(), port)))
            .await
            .map_err(|_| within("resolving"))?
            .map_err(|e| format!("cannot resolve {host}: {e}"))?
            .next()
            .ok_or_else(|| format!("{host} has no addresses"))?,
    };
    let tcp = tokio::time::timeout(t, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| within("connecting"))?
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let req = c.url.as_str().into_client_request().map_err(|e| e.to_string())?;
    let connector = crate::channels::ws_connector(&c.url)?;
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME))
        .max_frame_size(Some(MAX_FRAME));
    let (ws, _) = tokio::time::timeout(
        t,
        tokio_tungstenite::client_async_tls_with_config(req, tcp, Some(config), Some(connector)),
    )
    .await
    .map_err(|_| within("the WebSocket handshake"))?
    .map_err(|e| format!("WebSocket handshake with {}: {e}", c.url))?;
    Ok((ws, addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_are_read_with_their_defaults_and_checked() {
        let c =
            OutConfig::from_value(&json!({"id": "feed", "url": "wss://example.org/ws", "lambda": "f.ts:on"})).unwrap();
        assert_eq!(c.reconnect_delay, Duration::from_secs(5));
        assert_eq!(c.keepalive, Duration::from_secs(30));
        assert_eq!(c.connect_timeout, Duration::from_secs(15));
        assert_eq!((c.auto_reconnect, c.auth, c.high_water), (true, Auth::Auto, HIGH_WATER));
        assert_eq!(c.lambda.as_deref(), Some("f.ts:on"));
        // http(s) mean the same server's WebSocket (tools.md).
        assert_eq!(
            OutConfig::from_value(&json!({"id": "x", "url": "http://example.org/a"})).unwrap().url,
            "ws://example.org/a"
        );
        assert_eq!(
            OutConfig::from_value(&json!({"id": "x", "url": "https://example.org"})).unwrap().url,
            "wss://example.org/"
        );
        assert!(
            OutConfig::from_value(&json!({"id": "x", "url": "ftp://example.org"})).unwrap_err().contains("not a ws:")
        );
        assert!(OutConfig::from_value(&json!({"url": "ws://a"})).is_err());
        assert!(OutConfig::from_value(&json!({"id": "x", "url": "no url"})).is_err());
    }
}
