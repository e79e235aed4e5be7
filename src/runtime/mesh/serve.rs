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
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Mesh, classify, ingress};
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

/// Resolve a path under an agent: its API routes first (not served yet),
/// then `public/`, then shared patterns.
fn resolve(st: &Store, cfg: &Value, method: &str, rest: &str) -> Found {
    let serving = &cfg["serving"];
    let routed =
        serving["api"].as_array().into_iter().flatten().any(|r| {
            r["path"].as_str().is_some_and(|p| route_matches(p, rest)) && r["method"].as_str() == Some(method)
        });
    if routed {
        return Found::Refused(
            501,
            json!({"error": "this path is an API route (serving.api); lambda-backed routes are not served by this version yet"}),
        );
    }
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

/// `/hello/:name` against a request path (no leading slash).
fn route_matches(route: &str, rest: &str) -> bool {
    let a: Vec<&str> = route.trim_matches('/').split('/').collect();
    let b: Vec<&str> = rest.trim_matches('/').split('/').collect();
    a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.starts_with(':') || x == y)
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
    h: HeaderMap,
    Path(handle): Path<String>,
) -> Response {
    serve(s, c, h, handle, String::new()).await
}

pub(super) async fn path(
    s: State<Arc<Mesh>>,
    c: ConnectInfo<SocketAddr>,
    h: HeaderMap,
    Path((handle, rest)): Path<(String, String)>,
) -> Response {
    serve(s, c, h, handle, rest).await
}

async fn serve(
    State(m): State<Arc<Mesh>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    h: HeaderMap,
    handle: String,
    rest: String,
) -> Response {
    let rest = rest.trim_start_matches('/').to_string();
    if !clean(&rest) || rest.starts_with('/') {
        return json_reply(400, json!({"error": "a path segment that is empty, `.`, `..` or has a backslash"}));
    }
    let Some(mb) = m.find(&handle) else {
        return json_reply(404, json!({"error": "No agent with matching handle or DID"}));
    };
    let scope = classify(Some(peer.ip()));
    let r2 = rest.clone();
    let found = tokio::task::spawn_blocking(move || {
        mb.with_store(|st| {
            let cfg = match st.config_value() {
                Ok(c) => c,
                Err(e) => return Found::Refused(500, json!({"error": e.to_string()})),
            };
            if let Err((r, extra)) = ingress::visible(&cfg, scope) {
                return Found::Refused(r.status, ingress::body(&r, Some(extra)));
            }
            resolve(st, &cfg, "GET", &r2)
        })
    })
    .await;
    let found = match found {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => return json_reply(500, json!({"error": e})),
        Err(e) => return json_reply(500, json!({"error": e.to_string()})),
    };
    match found {
        Found::Refused(s, b) => json_reply(s, b),
        Found::Nothing => json_reply(404, json!({"error": "not found", "path": rest})),
        Found::Folder => {
            let to = format!("/agents/{handle}/{rest}/");
            (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, to)]).into_response()
        }
        Found::File { mime, etag, bytes } => file(&h, mime, etag, bytes),
    }
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
        assert!(route_matches("/hello/:name", "hello/ann"));
        assert!(!route_matches("/hello/:name", "hello/ann/x"));
    }
}
