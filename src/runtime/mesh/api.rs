//! API routes (issue 21, messaging.md §11, runtime.md §7.1): a
//! `serving.api` entry (`method`, `path` with `:params` or a `*` tail,
//! `lambda`) answered by the agent's lambda on the mesh server. The lambda
//! receives `{method, path, params, query, headers, body}` and returns
//! `{status, headers, body}` (or a bare value, sent as the body): a string
//! goes out as text, any other value as JSON. Route middleware runs first
//! and may rewrite the request or refuse it. A route runs on a runner
//! executor (a second connection to the file) kept for the next request
//! while traffic lasts; `warm` keeps the lambda's realm too. Limits: a body
//! of at most 2 MiB (413), the agent's execution timeout capped at 30 s
//! (504), four requests of one agent at a time (others wait up to 5 s, then
//! 503), so a route that throws or loops never stops the others.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::Mailbox;
use crate::runtime::executor::Executor;

/// The largest request body a route takes.
pub const BODY_LIMIT: usize = 2 << 20;
/// The longest a route's lambda may run, whatever the agent's limit.
pub const ROUTE_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests of one agent run at once; more wait for a turn.
const CONCURRENT: usize = 4;
const QUEUE_WAIT: Duration = Duration::from_secs(5);
/// A runner executor unused this long is closed.
const RUNNER_IDLE: Duration = Duration::from_secs(60);
const CACHE_MAX: usize = 256;

/// A route that matched a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Matched {
    /// Its index in `serving.api` (the middleware's pointer).
    pub index: usize,
    pub lambda: String,
    pub warm: bool,
    pub cache_ttl_ms: u64,
    pub params: Map<String, Value>,
    /// A WS route's send high-water mark.
    pub high_water: Option<u64>,
    /// A WS route's frame rate limit (`max_frames_per_sec`, adf's own).
    pub rate: Option<f64>,
}

/// The first `serving.api` route for `method` matching the path's decoded
/// segments, among the wildcard routes or the others (exact and
/// parameterised routes are tried before files, wildcard ones after).
pub fn find(cfg: &Value, method: &str, segments: &[String], wildcard: bool) -> Option<Matched> {
    let routes = cfg["serving"]["api"].as_array()?;
    routes.iter().enumerate().find_map(|(index, r)| {
        let path = r["path"].as_str()?;
        if r["method"].as_str() != Some(method) || path.contains('*') != wildcard {
            return None;
        }
        let params = match_path(path, segments)?;
        Some(Matched {
            index,
            lambda: r["lambda"].as_str().unwrap_or_default().to_string(),
            warm: r["warm"].as_bool().unwrap_or(false),
            cache_ttl_ms: r["cache_ttl_ms"].as_u64().unwrap_or(0),
            params,
            high_water: r["high_water_mark_bytes"].as_u64(),
            rate: r["max_frames_per_sec"].as_f64().filter(|r| *r >= 1.0),
        })
    })
}

/// The methods of routes (of any kind) whose path matches: for a 405's
/// `Allow` when none has the method asked.
pub fn methods_for(cfg: &Value, segments: &[String]) -> Vec<String> {
    let mut m: Vec<String> = cfg["serving"]["api"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["path"].as_str().is_some_and(|p| match_path(p, segments).is_some()))
        .filter_map(|r| r["method"].as_str().filter(|m| *m != "WS").map(str::to_string))
        .collect();
    m.sort();
    m.dedup();
    m
}

/// `/users/:id/*` against decoded segments: the parameters, `*` the rest.
fn match_path(pattern: &str, segments: &[String]) -> Option<Map<String, Value>> {
    let parts: Vec<&str> = pattern.trim_start_matches('/').split('/').collect();
    let mut params = Map::new();
    for (i, p) in parts.iter().enumerate() {
        if *p == "*" {
            params.insert("*".into(), Value::String(segments.get(i..).unwrap_or_default().join("/")));
            return Some(params);
        }
        let s = segments.get(i)?;
        if let Some(name) = p.strip_prefix(':') {
            params.insert(name.to_string(), Value::String(s.clone()));
        } else if p != s {
            return None;
        }
    }
    (parts.len() == segments.len()).then_some(params)
}

/// The path below `/agents/{handle}/`, split and percent-decoded segment by
/// segment (so `%2F` stays inside its segment). `None` for a segment that
/// is not UTF-8 once decoded.
pub fn segments(raw_rest: &str) -> Option<Vec<String>> {
    if raw_rest.is_empty() {
        return Some(vec![String::new()]);
    }
    raw_rest
        .split('/')
        .map(|s| percent_encoding::percent_decode_str(s).decode_utf8().ok().map(|c| c.into_owned()))
        .collect()
}

/// The request as the lambda sees it (`HttpRequest`).
pub fn request_value(
    method: &str,
    path: &str,
    params: Map<String, Value>,
    query: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, String> {
    let mut q = Map::new();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        q.insert(k.into_owned(), Value::String(v.into_owned()));
    }
    let mut h = Map::new();
    for name in headers.keys() {
        let joined = headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>().join(", ");
        h.insert(name.as_str().to_string(), Value::String(joined));
    }
    let ctype = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let mut req = json!({"method": method, "path": path, "params": params, "query": q, "headers": h, "body": null});
    if !body.is_empty() {
        let essence = ctype.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        req["body"] = if essence == "application/json" || essence.ends_with("+json") {
            serde_json::from_slice(body).map_err(|e| format!("the body is not valid JSON: {e}"))?
        } else if let Ok(text) = std::str::from_utf8(body) {
            Value::String(text.to_string())
        } else {
            use base64::Engine;
            req["body_encoding"] = json!("base64");
            Value::String(base64::engine::general_purpose::STANDARD.encode(body))
        };
    }
    Ok(req)
}

/// A route's answer, shaped for the wire.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: axum::body::Bytes,
}

/// What a lambda returned, as a response: `{status?, headers?, body?}` or a
/// bare value for the body. `Err` for a status that is not one.
fn answer_of(v: Value) -> Result<(Answer, Control), String> {
    let is_response =
        v.as_object().is_some_and(|o| o.contains_key("body") || o.contains_key("status") || o.contains_key("headers"));
    let (status, headers, body) = if is_response {
        let mut o = match v {
            Value::Object(o) => o,
            _ => Map::new(),
        };
        let status = match o.remove("status") {
            None | Some(Value::Null) => 200,
            Some(s) => s
                .as_u64()
                .and_then(|s| u16::try_from(s).ok())
                .filter(|s| (100..=599).contains(s))
                .ok_or_else(|| format!("status {s} is not an HTTP status (100 to 599)"))?,
        };
        (status, o.remove("headers"), o.remove("body").unwrap_or(Value::Null))
    } else {
        (200, None, v)
    };
    let mut control = Control::default();
    let mut out = Vec::new();
    let mut typed = false;
    for (k, v) in headers.as_ref().and_then(Value::as_object).into_iter().flatten() {
        let value = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => continue,
        };
        let name = k.to_ascii_lowercase();
        match name.as_str() {
            "x-cache-invalidate" => control.invalidate = Some(value),
            "x-no-cache" => control.no_cache = true,
            // The server frames the body itself.
            "content-length" | "transfer-encoding" | "connection" | "keep-alive" | "upgrade" => {}
            _ => {
                if let (Ok(n), Ok(v)) = (HeaderName::try_from(name.as_str()), HeaderValue::try_from(value.as_str())) {
                    typed |= n == header::CONTENT_TYPE;
                    out.push((n, v));
                }
            }
        }
    }
    let (bytes, ctype) = match body {
        Value::Null => (Vec::new(), None),
        Value::String(s) => (s.into_bytes(), Some("text/plain; charset=utf-8")),
        other => (serde_json::to_vec(&other).map_err(|e| e.to_string())?, Some("application/json")),
    };
    if !typed && let Some(t) = ctype {
        out.push((header::CONTENT_TYPE, HeaderValue::from_static(t)));
    }
    Ok((Answer { status, headers: out, body: bytes.into() }, control))
}

/// Cache directives a route's answer carries (not sent on).
#[derive(Debug, Default)]
struct Control {
    invalidate: Option<String>,
    no_cache: bool,
}

impl Answer {
    fn response(&self, extra: Option<(&'static str, &'static str)>) -> Response {
        let mut r = (StatusCode::from_u16(self.status).unwrap_or(StatusCode::OK), Body::from(self.body.clone()))
            .into_response();
        let h = r.headers_mut();
        for (k, v) in &self.headers {
            h.append(k.clone(), v.clone());
        }
        h.entry(header::X_CONTENT_TYPE_OPTIONS).or_insert(HeaderValue::from_static("nosniff"));
        if let Some((k, v)) = extra {
            h.insert(k, HeaderValue::from_static(v));
        }
        r
    }
}

/// An agent's serving state on the mesh: runner executors kept between
/// requests, the admission of concurrent requests and the GET cache.
pub struct Serving {
    runners: Mutex<Vec<(Executor, Instant)>>,
    pub(crate) admit: tokio::sync::Semaphore,
    cache: Mutex<HashMap<String, (Instant, Answer)>>,
}

impl Default for Serving {
    fn default() -> Self {
        Serving {
            runners: Mutex::new(Vec::new()),
            admit: tokio::sync::Semaphore::new(CONCURRENT),
            cache: Default::default(),
        }
    }
}

impl Serving {
    pub(crate) fn take_runner(&self) -> Option<Executor> {
        let mut r = self.runners.lock().ok()?;
        // Runners left idle are closed (their connection and caches).
        let now = Instant::now();
        let (keep, old): (Vec<_>, Vec<_>) =
            std::mem::take(&mut *r).into_iter().partition(|(_, t)| now - *t < RUNNER_IDLE);
        *r = keep;
        drop(r);
        for (ex, _) in old {
            let _ = ex.store_into().close();
        }
        self.runners.lock().ok()?.pop().map(|(ex, _)| ex)
    }

    pub(crate) fn give_back(&self, ex: Executor) {
        if let Ok(mut r) = self.runners.lock()
            && r.len() < CONCURRENT
        {
            r.push((ex, Instant::now()));
            return;
        }
        let _ = ex.store_into().close();
    }

    /// Close every runner (the agent is unloaded).
    pub fn close(&self) {
        let all = self.runners.lock().map(|mut r| std::mem::take(&mut *r)).unwrap_or_default();
        for (ex, _) in all {
            let _ = ex.store_into().close();
        }
    }

    fn cached(&self, key: &str) -> Option<Answer> {
        let mut c = self.cache.lock().ok()?;
        match c.get(key) {
            Some((until, a)) if *until > Instant::now() => Some(a.clone()),
            Some(_) => {
                c.remove(key);
                None
            }
            None => None,
        }
    }

    fn store(&self, key: String, ttl: Duration, a: &Answer) {
        if let Ok(mut c) = self.cache.lock() {
            if c.len() >= CACHE_MAX {
                let now = Instant::now();
                c.retain(|_, (until, _)| *until > now);
                if c.len() >= CACHE_MAX {
                    return;
                }
            }
            c.insert(key, (Instant::now() + ttl, a.clone()));
        }
    }

    fn invalidate(&self, prefix: &str) -> usize {
        let Ok(mut c) = self.cache.lock() else { return 0 };
        let before = c.len();
        c.retain(|k, _| !k.split_once(' ').is_some_and(|(_, p)| p.starts_with(prefix)));
        before - c.len()
    }
}

fn refuse(status: u16, error: impl Into<String>) -> Response {
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(json!({"error": error.into()})),
    )
        .into_response()
}

/// Answer one request with the route's lambda.
pub async fn answer(mb: Arc<Mailbox>, cfg: &Value, m: Matched, req: Value) -> Response {
    let method = req["method"].as_str().unwrap_or("GET").to_string();
    let path = req["path"].as_str().unwrap_or("/").to_string();
    let label = format!("{method} {path}");
    let cache_key = (method == "GET" && m.cache_ttl_ms > 0).then(|| {
        let mut q: Vec<(String, String)> = req["query"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        q.sort();
        let q = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(q).finish();
        format!("GET {path}?{q}")
    });
    if let Some(k) = &cache_key
        && let Some(hit) = mb.serving.cached(k)
    {
        return hit.response(Some(("x-cache", "HIT")));
    }
    let Ok(Ok(_permit)) = tokio::time::timeout(QUEUE_WAIT, mb.serving.admit.acquire()).await else {
        let mut r = refuse(503, "the agent is answering as many requests as it takes; try again shortly");
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return r;
    };
    let Some(mut runner) = mb.serving.take_runner().or_else(|| (mb.runner)()) else {
        return refuse(503, "the agent's file cannot be opened to answer this route");
    };
    let started = Instant::now();
    let (status, response) = run(&mut runner, cfg, &m, req, &mb.id).await;
    let response = match response {
        Ok((a, control)) => {
            if let Some(prefix) = &control.invalidate {
                let n = mb.serving.invalidate(prefix);
                if n > 0 {
                    let _ = runner.log(
                        "info",
                        "serving",
                        "cache_invalidate",
                        &format!("{n} cached answers under {prefix}"),
                    );
                }
            }
            let cacheable = (200..300).contains(&a.status) && !control.no_cache;
            match &cache_key {
                Some(k) if cacheable => {
                    mb.serving.store(k.clone(), Duration::from_millis(m.cache_ttl_ms), &a);
                    a.response(Some(("x-cache", "MISS")))
                }
                _ => a.response(None),
            }
        }
        Err(r) => r,
    };
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let level = match status {
        500.. => "error",
        400.. => "warn",
        _ => "info",
    };
    let _ = runner.log(level, "serving", "api_response", &format!("{label} -> {status} ({ms:.1} ms) {}", m.lambda));
    mb.serving.give_back(runner);
    response
}

/// A WebSocket route's middleware, before the upgrade: `Err` is the
/// refusal to answer instead (the socket is never opened). A route
/// without middleware costs nothing.
pub async fn admit_socket(mb: &Arc<Mailbox>, cfg: &Value, m: &Matched, req: Value) -> Result<(), Response> {
    let pointer = format!("/serving/api/{}/middleware", m.index);
    if cfg.pointer(&pointer).and_then(Value::as_array).is_none_or(|a| a.is_empty()) {
        return Ok(());
    }
    let Ok(Ok(_permit)) = tokio::time::timeout(QUEUE_WAIT, mb.serving.admit.acquire()).await else {
        return Err(refuse(503, "the agent is answering as many requests as it takes; try again shortly"));
    };
    let Some(mut runner) = mb.serving.take_runner().or_else(|| (mb.runner)()) else {
        return Err(refuse(503, "the agent's file cannot be opened to answer this route"));
    };
    let r = runner.middleware_coded(cfg, "route", &pointer, req, Vec::new()).await;
    let out = match r {
        Ok(_) => Ok(()),
        Err((code, reason)) => {
            let code = code.unwrap_or(403);
            let _ = runner.log("warn", "serving", "ws_refused", &format!("{code} by route middleware: {reason}"));
            Err(refuse(code, format!("refused by route middleware: {reason}")))
        }
    };
    mb.serving.give_back(runner);
    out
}

/// The middleware, then the lambda: the status and the answer (or the
/// refusal to send).
async fn run(
    runner: &mut Executor,
    cfg: &Value,
    m: &Matched,
    req: Value,
    agent_id: &str,
) -> (u16, Result<(Answer, Control), Response>) {
    let pointer = format!("/serving/api/{}/middleware", m.index);
    let has_middleware = cfg.pointer(&pointer).and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    let mut req = req;
    if has_middleware {
        match runner.middleware_coded(cfg, "route", &pointer, req.clone(), Vec::new()).await {
            Ok(data) if data.is_object() => req = data,
            Ok(_) => {}
            Err((code, reason)) => {
                let code = code.unwrap_or(403);
                return (code, Err(refuse(code, format!("refused by route middleware: {reason}"))));
            }
        }
    }
    if m.lambda.is_empty() {
        return (500, Err(refuse(500, "this route names no lambda")));
    }
    let (path, func) = crate::sandbox::prepare::split_target(&m.lambda);
    let timeout = runner.code_timeout(None).min(ROUTE_TIMEOUT);
    let warm = m.warm.then(|| format!("{agent_id}:api"));
    match runner.lambda(path, func, req, None, Vec::new(), timeout, "api_route", warm).await {
        Ok(out) => match answer_of(out.value.unwrap_or(Value::Null)) {
            Ok((a, c)) => (a.status, Ok((a, c))),
            Err(e) => (500, Err(refuse(500, format!("{}: {e}", m.lambda)))),
        },
        Err(e) if e.code == "TIMEOUT" => {
            (504, Err(refuse(504, format!("{} took longer than {} ms", m.lambda, timeout.as_millis()))))
        }
        Err(e) if e.code == "NOT_FOUND" => (500, Err(refuse(500, e.message))),
        Err(e) => (500, Err(refuse(500, format!("{}: {}", m.lambda, e.message)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(s: &str) -> Vec<String> {
        segments(s).unwrap()
    }

    #[test]
    fn routes_match_by_method_params_and_tail() {
        let cfg = json!({"serving": {"api": [
            {"method": "GET", "path": "/hello/:name", "lambda": "api.ts:hello"},
            {"method": "POST", "path": "/items", "lambda": "api.ts:add", "warm": true},
            {"method": "GET", "path": "/files/*", "lambda": "api.ts:files", "cache_ttl_ms": 500},
            {"method": "WS", "path": "/chat", "lambda": "ws.ts:on"},
        ]}});
        let m = find(&cfg, "GET", &segs("hello/wor%2Fld"), false).unwrap();
        assert_eq!((m.index, m.lambda.as_str()), (0, "api.ts:hello"));
        assert_eq!(m.params["name"], "wor/ld", "a %2F stays inside its segment");
        assert!(find(&cfg, "GET", &segs("hello"), false).is_none());
        assert!(find(&cfg, "GET", &segs("hello/a/b"), false).is_none());
        assert!(find(&cfg, "POST", &segs("hello/x"), false).is_none());
        assert!(find(&cfg, "POST", &segs("items"), false).unwrap().warm);
        // Wildcards only in their own pass.
        assert!(find(&cfg, "GET", &segs("files/a/b.txt"), false).is_none());
        let w = find(&cfg, "GET", &segs("files/a/b.txt"), true).unwrap();
        assert_eq!(w.params["*"], "a/b.txt");
        assert_eq!(w.cache_ttl_ms, 500);
        assert_eq!(methods_for(&cfg, &segs("items")), vec!["POST"]);
        assert!(methods_for(&cfg, &segs("chat")).is_empty());
        assert!(segments("%FF").is_none(), "not UTF-8 once decoded");
    }

    #[test]
    fn requests_carry_query_headers_and_a_typed_body() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
        h.append("x-a", HeaderValue::from_static("1"));
        h.append("x-a", HeaderValue::from_static("2"));
        let r = request_value("POST", "/items", Map::new(), "q=a%20b&n=1", &h, br#"{"k": [1]}"#).unwrap();
        assert_eq!(r["query"], json!({"q": "a b", "n": "1"}));
        assert_eq!(r["headers"]["x-a"], "1, 2");
        assert_eq!(r["body"], json!({"k": [1]}));
        assert!(request_value("POST", "/", Map::new(), "", &h, b"{nope").unwrap_err().contains("not valid JSON"));
        let plain = HeaderMap::new();
        assert_eq!(request_value("POST", "/", Map::new(), "", &plain, b"hi").unwrap()["body"], "hi");
        let bin = request_value("POST", "/", Map::new(), "", &plain, &[0xff, 0x00]).unwrap();
        assert_eq!((bin["body"].as_str(), bin["body_encoding"].as_str()), (Some("/wA="), Some("base64")));
        assert_eq!(request_value("GET", "/", Map::new(), "", &plain, b"").unwrap()["body"], Value::Null);
    }

    #[test]
    fn answers_are_shaped_from_what_the_lambda_returned() {
        let (a, _) = answer_of(json!({"status": 201, "headers": {"X-Id": 7}, "body": {"ok": true}})).unwrap();
        assert_eq!(a.status, 201);
        assert_eq!(&a.body[..], br#"{"ok":true}"#);
        assert!(a.headers.iter().any(|(k, v)| k == "x-id" && v == "7"));
        assert!(a.headers.iter().any(|(k, v)| k == header::CONTENT_TYPE && v == "application/json"));
        let (a, _) = answer_of(json!("hello")).unwrap();
        assert_eq!((a.status, &a.body[..]), (200, &b"hello"[..]));
        assert!(a.headers.iter().any(|(_, v)| v == "text/plain; charset=utf-8"));
        let (a, _) = answer_of(json!({"items": [1, 2]})).unwrap();
        assert_eq!(&a.body[..], br#"{"items":[1,2]}"#, "an object without status, headers or body is the body");
        let (a, c) =
            answer_of(json!({"body": "<b>x</b>", "headers": {"content-type": "text/html", "content-length": "999",
                "x-cache-invalidate": "/items", "x-no-cache": "1", "bad name": "x"}}))
            .unwrap();
        assert_eq!(a.headers.len(), 1, "{:?}", a.headers);
        assert_eq!((c.invalidate.as_deref(), c.no_cache), (Some("/items"), true));
        assert!(answer_of(json!({"status": 99})).is_err());
        assert!(answer_of(json!({"status": "ok"})).is_err());
        let (a, _) = answer_of(json!({"status": 204})).unwrap();
        assert!(a.body.is_empty());
    }
}
