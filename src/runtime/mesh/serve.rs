//! An agent's files on the web (issue 21, messaging.md §11): under
//! `/agents/{handle}/…` on the mesh server, `public/` files when
//! `serving.public.enabled` (a folder's index file for `/` and for a
//! folder), then files matching `serving.shared.patterns` when
//! `serving.shared.enabled`, else 404. The agent's visibility decides who
//! may see them, as for its card. Paths are checked segment by segment
//! (no `..`, `.`, empty or backslash segments, whatever their encoding):
//! nothing outside what is served can be named. Responses carry the
//! file's type, an ETag (`If-None-Match` → 304) and byte ranges (206,
//! 416).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Mesh, api, classify, ingress};
use crate::store::Store;

/// What a request resolves to.
enum Found {
    File {
        mime: String,
        etag: String,
        bytes: Vec<u8>,
    },
    /// A folder asked without its trailing slash.
    Folder,
    Nothing,
    Refused(u16, Value),
}

/// Is every segment of `rest` a plain name?
fn clean(rest: &str) -> bool {
    let trimmed = rest.strip_suffix('/').unwrap_or(rest);
    trimmed.is_empty()
        || trimmed.split('/').all(|s| !s.is_empty() && s != "." && s != ".." && !s.contains(['\\', '\0']))
}

fn etag(path: &str, size: u64, updated: &str) -> String {
    use sha2::Digest;
    let h = sha2::Sha256::digest(format!("{path}\0{size}\0{updated}").as_bytes());
    format!("\"{}\"", h[..8].iter().map(|b| format!("{b:02x}")).collect::<String>())
}

fn read(st: &Store, path: &str) -> Option<Found> {
    let (entry, bytes) = st.file_read(path).ok()?;
    let mime = entry
        .mime_type
        .clone()
        .unwrap_or_else(|| mime_guess::from_path(path).first_or_octet_stream().essence_str().to_string());
    Some(Found::File { etag: etag(path, entry.size, &entry.updated_at), mime, bytes })
}

/// Resolve a path under an agent to one of its files: `public/`, then
/// shared patterns (API routes are matched before and after, in `serve`).
fn resolve(st: &Store, cfg: &Value, rest: &str) -> Found {
    let serving = &cfg["serving"];
    if serving["public"]["enabled"] == true {
        let index = serving["public"]["index"].as_str().filter(|i| clean(i)).unwrap_or("index.html");
        let path = if rest.is_empty() || rest.ends_with('/') {
            format!("public/{rest}{index}")
        } else {
            format!("public/{rest}")
        };
        if let Some(f) = read(st, &path) {
            return f;
        }
        if !rest.is_empty()
            && !rest.ends_with('/')
            && st.file_stat(&format!("public/{rest}/{index}")).ok().flatten().is_some()
        {
            return Found::Folder;
        }
    }
    if serving["shared"]["enabled"] == true && !rest.is_empty() && !rest.ends_with('/') {
        let opts = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: true,
        };
        let shared = serving["shared"]["patterns"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter_map(|p| glob::Pattern::new(p).ok())
            .any(|p| p.matches_with(rest, opts));
        if shared && let Some(f) = read(st, rest) {
            return f;
        }
    }
    Found::Nothing
}

/// One byte range of `len` bytes (`bytes=a-b`, `a-`, `-n`); `None` when
/// the header asks for several or is not a byte range (the whole file is
/// sent), `Some(Err)` when it cannot be satisfied.
fn range(h: &str, len: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = h.strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    let r = match (a.is_empty(), b.is_empty()) {
        (true, false) => {
            let n: u64 = b.parse().ok()?;
            if n == 0 || len == 0 { Err(()) } else { Ok((len.saturating_sub(n), len - 1)) }
        }
        (false, _) => {
            let start: u64 = a.parse().ok()?;
            let end: u64 =
                if b.is_empty() { len.saturating_sub(1) } else { b.parse::<u64>().ok()?.min(len.saturating_sub(1)) };
            if start >= len || end < start { Err(()) } else { Ok((start, end)) }
        }
        _ => return None,
    };
    Some(r)
}

fn json_reply(status: u16, body: Value) -> Response {
    (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(body)).into_response()
}

pub(super) async fn root(
    s: State<Arc<Mesh>>,
    c: ConnectInfo<SocketAddr>,
    Path(handle): Path<String>,
    req: axum::extract::Request,
) -> Response {
    serve(s, c, Request::of(req), handle, String::new()).await
}

pub(super) async fn path(
    s: State<Arc<Mesh>>,
    c: ConnectInfo<SocketAddr>,
    Path((handle, rest)): Path<(String, String)>,
    req: axum::extract::Request,
) -> Response {
    serve(s, c, Request::of(req), handle, rest).await
}

/// `/agents/{handle}` → `/agents/{handle}/` (the query kept).
pub(super) async fn bare(Path(handle): Path<String>, uri: Uri) -> Response {
    let q = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let to =
        format!("/agents/{}/{q}", percent_encoding::utf8_percent_encode(&handle, percent_encoding::NON_ALPHANUMERIC));
    (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, to)]).into_response()
}

/// What `serve` needs of the request.
struct Request {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
    /// The rest of the head (a WebSocket upgrade takes it).
    parts: axum::http::request::Parts,
}

impl Request {
    fn of(req: axum::extract::Request) -> Request {
        let (parts, body) = req.into_parts();
        Request { method: parts.method.clone(), uri: parts.uri.clone(), headers: parts.headers.clone(), body, parts }
    }

    fn is_upgrade(&self) -> bool {
        self.method == Method::GET
            && self
                .headers
                .get(header::UPGRADE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
    }
}

/// What the file's side decided.
enum Step {
    Route(Box<api::Matched>, Value),
    /// A WebSocket route (or none: the upgrade is closed with 4004).
    Socket(Option<Box<api::Matched>>, Value),
    Done(Found),
    /// The path has routes, none for this method.
    Methods(Vec<String>),
}

/// Reserved first segments under a handle (messaging.md §11): their own
/// routes answer them; any other method there is not the agent's to serve.
const RESERVED: [&str; 3] = ["inbox", "card", "health"];

async fn serve(
    State(m): State<Arc<Mesh>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
    handle: String,
    rest: String,
) -> Response {
    // `//x` names an empty segment, refused like any other.
    if !clean(&rest) || rest.starts_with('/') {
        return json_reply(400, json!({"error": "a path segment that is empty, `.`, `..` or has a backslash"}));
    }
    if RESERVED.contains(&rest.split('/').next().unwrap_or("")) {
        return json_reply(
            404,
            json!({"error": format!("/{} is a reserved protocol path", rest.split('/').next().unwrap_or(""))}),
        );
    }
    // Routes see the path as sent, decoded segment by segment.
    let raw = req.uri.path().strip_prefix("/agents/").and_then(|r| r.split_once('/')).map_or("", |(_, r)| r);
    let Some(segments) = api::segments(raw) else {
        return json_reply(400, json!({"error": "a path segment that is not UTF-8"}));
    };
    let Some(mb) = m.find(&handle) else {
        return json_reply(404, json!({"error": "No agent with matching handle or DID"}));
    };
    let scope = classify(Some(peer.ip()));
    // HEAD is a GET without its body (the server drops it).
    let method = if req.method == Method::HEAD { "GET".to_string() } else { req.method.as_str().to_string() };
    let files = req.method == Method::GET || req.method == Method::HEAD;
    let upgrade = req.is_upgrade();
    let (r2, mb2) = (rest.clone(), mb.clone());
    let step = tokio::task::spawn_blocking(move || {
        mb2.with_store(|st| {
            let cfg = match st.config_value() {
                Ok(c) => c,
                Err(e) => return Step::Done(Found::Refused(500, json!({"error": e.to_string()}))),
            };
            if let Err((r, extra)) = ingress::visible(&cfg, scope) {
                return Step::Done(Found::Refused(r.status, ingress::body(&r, Some(extra))));
            }
            if upgrade {
                let m = api::find(&cfg, "WS", &segments, false).or_else(|| api::find(&cfg, "WS", &segments, true));
                return Step::Socket(m.map(Box::new), cfg);
            }
            // Exact and parameterised routes, then files, then wildcard routes.
            if let Some(m) = api::find(&cfg, &method, &segments, false) {
                return Step::Route(Box::new(m), cfg);
            }
            if files {
                let found = resolve(st, &cfg, &r2);
                if !matches!(found, Found::Nothing) {
                    return Step::Done(found);
                }
            }
            if let Some(m) = api::find(&cfg, &method, &segments, true) {
                return Step::Route(Box::new(m), cfg);
            }
            match api::methods_for(&cfg, &segments) {
                m if m.is_empty() => Step::Done(Found::Nothing),
                m => Step::Methods(m),
            }
        })
    })
    .await;
    let step = match step {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => return json_reply(500, json!({"error": e})),
        Err(e) => return json_reply(500, json!({"error": e.to_string()})),
    };
    let found = match step {
        Step::Done(f) => f,
        Step::Methods(allowed) => {
            let mut r =
                json_reply(405, json!({"error": format!("{} is not served here", req.method), "allow": allowed}));
            if let Ok(v) = HeaderValue::from_str(&allowed.join(", ")) {
                r.headers_mut().insert(header::ALLOW, v);
            }
            return r;
        }
        Step::Route(matched, cfg) => return route(mb, &cfg, *matched, req).await,
        Step::Socket(matched, cfg) => return socket(m, mb, peer, &cfg, matched.map(|m| *m), req).await,
    };
    match found {
        Found::Refused(s, b) => json_reply(s, b),
        Found::Nothing => json_reply(404, json!({"error": "not found", "path": rest})),
        Found::Folder => {
            let to = format!("/agents/{handle}/{rest}/");
            (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, to)]).into_response()
        }
        Found::File { mime, etag, bytes } => file(&req.headers, mime, etag, bytes),
    }
}

/// Upgrade to a WebSocket on the agent's `WS` route (messaging.md §12):
/// its lambda gets the frames, or without one they are ALF messages for
/// the inbox. No route: the upgrade is closed with 4004.
async fn socket(
    mesh: Arc<Mesh>,
    mb: Arc<super::Mailbox>,
    peer: SocketAddr,
    cfg: &Value,
    m: Option<api::Matched>,
    mut req: Request,
) -> Response {
    use super::ws::{self, Direction, Socket, conn};
    use axum::extract::FromRequestParts;
    use axum::extract::ws::{CloseFrame, Message, WebSocketUpgrade};
    let up = match WebSocketUpgrade::from_request_parts(&mut req.parts, &()).await {
        // A small read buffer: a thousand idle sockets stay small.
        Ok(u) => u.max_message_size(ws::MAX_FRAME).max_frame_size(ws::MAX_FRAME).read_buffer_size(8 << 10),
        Err(rejection) => return rejection.into_response(),
    };
    let Some(m) = m else {
        return up.on_upgrade(|mut socket| async move {
            let close = CloseFrame { code: 4004, reason: "No WebSocket route configured at this path".into() };
            let _ = socket.send(Message::Close(Some(close))).await;
        });
    };
    // Route middleware decides before the upgrade, as for any route.
    let path =
        format!("/{}", req.uri.path().strip_prefix("/agents/").and_then(|r| r.split_once('/')).map_or("", |(_, r)| r));
    if let Ok(v) = api::request_value("GET", &path, m.params.clone(), req.uri.query().unwrap_or(""), &req.headers, &[])
        && let Err(refused) = api::admit_socket(&mb, cfg, &m, v).await
    {
        return refused;
    }
    // `url_params`: the route's parameters, then the query's (first wins).
    let mut params = m.params.clone();
    for (k, v) in url::form_urlencoded::parse(req.uri.query().unwrap_or("").as_bytes()) {
        params.entry(k.into_owned()).or_insert(Value::String(v.into_owned()));
    }
    let mut headers = serde_json::Map::new();
    for name in req.headers.keys() {
        let joined = req.headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>().join(", ");
        headers.insert(name.as_str().to_string(), Value::String(joined));
    }
    let require = cfg["security"]["allow_unsigned"] == false;
    let high_water = m.high_water.map_or(ws::HIGH_WATER, |n| n.clamp(1024, 64 << 20) as usize);
    let handler = conn::Handler::of(&m.lambda);
    let rate = m.rate.unwrap_or(conn::RATE);
    let target =
        format!("/{}", req.uri.path().strip_prefix("/agents/").and_then(|r| r.split_once('/')).map_or("", |(_, r)| r));
    up.on_upgrade(move |socket| async move {
        let (sock, queue) =
            Socket::new(crate::store::create::nanoid(10), &mb.id, Direction::Inbound, None, target, high_water);
        let wire = ws::wire_server(socket, &sock, queue);
        let setup = conn::Setup {
            mesh,
            mb,
            sock,
            handler,
            role: conn::Role::Server { require },
            keepalive: std::time::Duration::from_secs(30),
            scope: classify(Some(peer.ip())),
            peer: Some(peer.ip()),
            open: json!({"url_params": params, "headers": headers}),
            ready: None,
            rate,
        };
        conn::drive(setup, wire).await;
    })
}

/// Read the body (at most `api::BODY_LIMIT`) and answer with the route.
async fn route(mb: Arc<super::Mailbox>, cfg: &Value, m: api::Matched, req: Request) -> Response {
    // The body is left unread: the connection closes with the answer, so
    // the client does not send its next request on it.
    let closing = |mut r: Response| {
        r.headers_mut().insert(header::CONNECTION, axum::http::HeaderValue::from_static("close"));
        r
    };
    let too_big = || {
        closing(json_reply(
            413,
            json!({"error": format!("the body is larger than a route takes ({} bytes)", api::BODY_LIMIT)}),
        ))
    };
    let declared =
        req.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > api::BODY_LIMIT as u64) {
        return too_big();
    }
    // A body that trickles in is not waited for past 30 s.
    let wait = crate::daemon::conn::Limits::from_env().body_timeout;
    let body = match tokio::time::timeout(wait, axum::body::to_bytes(req.body, api::BODY_LIMIT)).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return too_big(),
        Err(_) => {
            return closing(json_reply(
                408,
                json!({"error": format!("the request body did not arrive within {} ms", wait.as_millis())}),
            ));
        }
    };
    let path =
        format!("/{}", req.uri.path().strip_prefix("/agents/").and_then(|r| r.split_once('/')).map_or("", |(_, r)| r));
    let method = if req.method == Method::HEAD { "GET" } else { req.method.as_str() };
    let value =
        match api::request_value(method, &path, m.params.clone(), req.uri.query().unwrap_or(""), &req.headers, &body) {
            Ok(v) => v,
            Err(e) => return json_reply(400, json!({"error": e})),
        };
    api::answer(mb, cfg, m, value).await
}

fn file(h: &HeaderMap, mime: String, etag: String, bytes: Vec<u8>) -> Response {
    let mut headers = HeaderMap::new();
    let set = |hm: &mut HeaderMap, k: header::HeaderName, v: &str| {
        if let Ok(v) = HeaderValue::from_str(v) {
            hm.insert(k, v);
        }
    };
    set(&mut headers, header::ETAG, &etag);
    set(&mut headers, header::ACCEPT_RANGES, "bytes");
    set(&mut headers, header::CACHE_CONTROL, "no-cache");
    set(&mut headers, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    let text = mime.starts_with("text/") && !mime.contains("charset");
    set(&mut headers, header::CONTENT_TYPE, &if text { format!("{mime}; charset=utf-8") } else { mime });
    let matches = h.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(',').any(|t| {
            let t = t.trim();
            t == "*" || t.trim_start_matches("W/") == etag
        })
    });
    if matches {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    let len = bytes.len() as u64;
    let if_range_ok = h.get(header::IF_RANGE).and_then(|v| v.to_str().ok()).is_none_or(|v| v == etag);
    if let Some(r) =
        h.get(header::RANGE).and_then(|v| v.to_str().ok()).filter(|_| if_range_ok).and_then(|v| range(v, len))
    {
        return match r {
            Ok((a, b)) => {
                set(&mut headers, header::CONTENT_RANGE, &format!("bytes {a}-{b}/{len}"));
                let part = bytes[a as usize..=b as usize].to_vec();
                (StatusCode::PARTIAL_CONTENT, headers, Body::from(part)).into_response()
            }
            Err(()) => {
                set(&mut headers, header::CONTENT_RANGE, &format!("bytes */{len}"));
                (StatusCode::RANGE_NOT_SATISFIABLE, headers).into_response()
            }
        };
    }
    (StatusCode::OK, headers, Body::from(bytes)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_ranges_and_routes_are_read_strictly() {
        assert!(clean("") && clean("a/b.html") && clean("docs/"));
        for bad in ["../x", "a/../b", "a//b", "./a", "a\\b", "a/\0"] {
            assert!(!clean(bad), "{bad:?}");
        }
        assert_eq!(range("bytes=0-3", 10), Some(Ok((0, 3))));
        assert_eq!(range("bytes=7-", 10), Some(Ok((7, 9))));
        assert_eq!(range("bytes=-4", 10), Some(Ok((6, 9))));
        assert_eq!(range("bytes=5-100", 10), Some(Ok((5, 9))));
        assert_eq!(range("bytes=10-", 10), Some(Err(())));
        assert_eq!(range("bytes=0-1,3-4", 10), None, "several ranges: the whole file");
        assert_eq!(range("items=0-1", 10), None);
    }
}
