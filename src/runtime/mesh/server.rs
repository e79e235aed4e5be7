//! The mesh HTTP server (messaging.md §11): agent-facing, apart from the
//! owner's control API. `/health`, `/ping`, `/agents` (cards visible from
//! the requester's scope), `/agents/{handle}/card|health`, and
//! `POST /agents/{handle}/inbox` (202 `{message_id}` or the refusal's status
//! and reason). Binds loopback unless an agent is `lan`; probes up to 20
//! ports when the configured one is taken.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use serde_json::{Value, json};

use super::ingress::{self, Origin};
use super::{Mesh, card, classify};

pub const DEFAULT_PORT: u16 = 7295;
/// Largest message body (inline attachments included).
const BODY_LIMIT: usize = 32 * 1024 * 1024;

type S = State<Arc<Mesh>>;
type Peer = ConnectInfo<SocketAddr>;

fn reply(status: u16, body: Value) -> Response {
    (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), Json(body)).into_response()
}

/// The base URL as the requester addressed us (for card endpoints).
fn base_for(mesh: &Mesh, headers: &HeaderMap) -> String {
    match headers.get("host").and_then(|h| h.to_str().ok()) {
        Some(h) => format!("http://{h}"),
        None => mesh.base_url().unwrap_or_default(),
    }
}

async fn health(State(m): S) -> Json<Value> {
    let port = m.base_url().and_then(|b| b.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()));
    Json(json!({"status": "ok", "uptime": m.uptime_secs(), "agents": m.mailboxes().len(), "port": port}))
}

/// Who this runtime is; with `?nonce=…` (1 to 128 characters) also a
/// `proof` that it holds the key of the DID it names (`sweep.rs` checks it).
async fn ping(
    State(m): S,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Json<Value> {
    let mut v = json!({"runtime_id": m.runtime_id, "proto": "alf/0.2"});
    if let Some(d) = &m.runtime_did {
        v["runtime_did"] = d.clone().into();
    }
    if let (Some(nonce), Some(key)) = (q.get("nonce").filter(|n| (1..=128).contains(&n.len())), m.runtime_key()) {
        v["proof"] = crate::identity::attest::sign_str(key, &super::sweep::proof_bytes(nonce, &m.runtime_id)).into();
    }
    Json(v)
}

/// A refusal: status and JSON body.
type Refusal = (u16, Value);

/// The card of one mailbox if visible from `scope`.
fn card_of(m: &Mesh, handle: &str, scope: &str, base: &str) -> Result<Value, Refusal> {
    let mb = m.find(handle).ok_or_else(|| (404, json!({"error": "No agent with matching handle or DID"})))?;
    let got = mb.with_store(|st| -> Result<Value, Refusal> {
        let cfg = st.config_value().map_err(|e| (500, json!({"error": e.to_string()})))?;
        ingress::visible(&cfg, scope).map_err(|(r, extra)| (r.status, ingress::body(&r, Some(extra))))?;
        let key = st.signing_key().ok().flatten();
        let atts = st.attestations().unwrap_or_default();
        let mut c = card::build(&cfg, &mb.did(), &mb.handle, &atts, key.as_ref(), base);
        c["visibility"] = cfg["messaging"]["visibility"].clone();
        Ok(c)
    });
    got.map_err(|e| (500, json!({"error": e})))?
}

async fn agents(State(m): S, ConnectInfo(peer): Peer, headers: HeaderMap) -> Json<Value> {
    let scope = classify(Some(peer.ip()));
    let base = base_for(&m, &headers);
    let m2 = m.clone();
    let list = tokio::task::spawn_blocking(move || {
        m2.mailboxes().iter().filter_map(|mb| card_of(&m2, &mb.id, scope, &base).ok()).collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    Json(Value::Array(list))
}

async fn agent_card(State(m): S, ConnectInfo(peer): Peer, headers: HeaderMap, Path(handle): Path<String>) -> Response {
    let scope = classify(Some(peer.ip()));
    let base = base_for(&m, &headers);
    match tokio::task::spawn_blocking(move || card_of(&m, &handle, scope, &base)).await {
        Ok(Ok(c)) => Json(c).into_response(),
        Ok(Err((s, b))) => reply(s, b),
        Err(e) => reply(500, json!({"error": e.to_string()})),
    }
}

async fn agent_health(
    State(m): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(handle): Path<String>,
) -> Response {
    let scope = classify(Some(peer.ip()));
    let base = base_for(&m, &headers);
    let m2 = m.clone();
    let h2 = handle.clone();
    match tokio::task::spawn_blocking(move || card_of(&m2, &h2, scope, &base)).await {
        Ok(Ok(c)) => {
            let state = m.find(&handle).map(|mb| m.state_of(&mb.id)).unwrap_or_default();
            Json(json!({"status": "ok", "handle": c["handle"], "did": c["did"], "state": state})).into_response()
        }
        Ok(Err((s, b))) => reply(s, b),
        Err(e) => reply(500, json!({"error": e.to_string()})),
    }
}

async fn inbox(State(m): S, ConnectInfo(peer): Peer, Path(handle): Path<String>, body: axum::body::Bytes) -> Response {
    let Some(mb) = m.find(&handle) else {
        // An agent that moved to another host: on to its new inbox.
        if let Some(to) = m.forward_for(&handle) {
            return super::forward::relay(&m.http, &to, body).await;
        }
        return reply(404, json!({"error": "No agent with matching handle or DID"}));
    };
    let msg: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return reply(400, json!({"error": "the body is not a JSON object"})),
    };
    let origin = Origin { scope: classify(Some(peer.ip())), peer: Some(peer.ip()) };
    let state = m.state_of(&mb.id);
    match ingress::accept(state, mb, msg, origin).await {
        Ok(row) => reply(202, json!({"message_id": row.get("id")})),
        Err((r, extra)) => reply(r.status, ingress::body(&r, extra)),
    }
}

pub fn router(mesh: Arc<Mesh>) -> axum::Router {
    axum::Router::new()
        .route("/health", get(health))
        .route("/ping", get(ping))
        .route("/agents", get(agents))
        .route("/agents/{handle}/card", get(agent_card))
        .route("/agents/{handle}/health", get(agent_health))
        .route("/agents/{handle}/inbox", post(inbox))
        // The agent's site and shared files (`serve.rs`).
        .route("/agents/{handle}/", any(super::serve::root))
        // Without its slash, a site's relative links would miss it.
        .route("/agents/{handle}", get(super::serve::bare))
        .route("/agents/{handle}/{*rest}", any(super::serve::path))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(mesh)
}

/// Bind `host:port` (or one of the next 19 ports) and serve until the
/// runtime ends; the mesh learns its base URL.
pub async fn serve(mesh: Arc<Mesh>, host: &str, port: u16) -> std::io::Result<SocketAddr> {
    let mut last = None;
    for p in port..port.saturating_add(20) {
        match tokio::net::TcpListener::bind((host, p)).await {
            Ok(l) => {
                let addr = l.local_addr()?;
                let shown =
                    if addr.ip().is_unspecified() { format!("127.0.0.1:{}", addr.port()) } else { addr.to_string() };
                mesh.set_base_url(Some(format!("http://{shown}")));
                // The daemon's limits (and their ADF_DAEMON_* overrides).
                tokio::spawn(accept(l, router(mesh), crate::daemon::conn::Limits::from_env()));
                return Ok(addr);
            }
            Err(e) => last = Some(e),
        }
        if port == 0 {
            break;
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no port")))
}

/// The mesh server's accept loop: hyper's HTTP/1 with a header read timeout
/// and upgrades (WebSockets), each connection told its peer's address, at
/// most as many connections at once as the daemon's cap (new ones beyond
/// it are closed at once). `axum::serve` has neither limit.
async fn accept(l: tokio::net::TcpListener, app: axum::Router, limits: crate::daemon::conn::Limits) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let cap = Arc::new(tokio::sync::Semaphore::new(limits.connections()));
    let service = hyper_util::service::TowerToHyperService::new(app);
    loop {
        let (stream, peer) = match l.accept().await {
            Ok(a) => a,
            Err(e)
                if matches!(e.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset) =>
            {
                continue;
            }
            Err(_) => {
                // Out of descriptors: do not spin.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = cap.clone().try_acquire_owned() else { continue };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let header_timeout = limits.header_timeout;
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                hyper::service::Service::call(&service, req)
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new()).header_read_timeout(header_timeout).keep_alive(true);
            let _ = http.serve_connection(TokioIo::new(stream), svc).with_upgrades().await;
            drop(permit);
        });
    }
}
