//! `sys_fetch` (tools.md §5): fetch middleware first, then the egress
//! guard on the URL that results, then the request with redirects followed
//! by hand (at most 5), every hop checked again and connected to the
//! address that was checked. The response comes back as JSON
//! `{status, statusText, headers, body, _body_encoding?}`.

use std::time::Duration;

use base64::Engine;
use futures_util::StreamExt;
use reqwest::{Method, Url};
use serde_json::{Map, Value, json};

use super::code::CodeCx;
use super::egress::{self, Resolve};
use super::executor::Executor;
use crate::tools::ToolOutput;

pub const MAX_REDIRECTS: usize = 5;
pub const MAX_BODY: usize = 25 << 20;

/// A request as middleware sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub url: String,
    pub method: String,
    pub headers: Map<String, Value>,
    pub body: Option<String>,
    pub timeout_ms: u64,
}

impl Request {
    pub fn from_args(args: &Value) -> Request {
        Request {
            url: args["url"].as_str().unwrap_or("").to_string(),
            method: args["method"].as_str().unwrap_or("GET").to_ascii_uppercase(),
            headers: args["headers"].as_object().cloned().unwrap_or_default(),
            body: args["body"].as_str().map(str::to_string),
            timeout_ms: args["timeout_ms"].as_u64().unwrap_or(30_000).clamp(1, 60_000),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({"url": self.url, "method": self.method, "headers": self.headers, "body": self.body, "timeout_ms": self.timeout_ms})
    }
}

fn error(msg: impl std::fmt::Display) -> ToolOutput {
    ToolOutput::err(json!({"error": msg.to_string()}).to_string())
}

fn is_text(content_type: Option<&str>) -> bool {
    let Some(ct) = content_type else { return true };
    let ct = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    ct.is_empty()
        || ct.starts_with("text/")
        || ct == "application/json"
        || ct == "application/xml"
        || ct.ends_with("+json")
        || ct.ends_with("+xml")
}

/// Perform a checked request (after middleware).
pub async fn fetch(req: &Request, allow_local: bool, resolver: &dyn Resolve) -> Result<Value, String> {
    let mut url = Url::parse(&req.url).map_err(|e| format!("Invalid URL \"{}\": {e}", req.url))?;
    let mut method = Method::from_bytes(req.method.as_bytes()).map_err(|_| format!("Invalid method {}", req.method))?;
    let mut body = req.body.clone();
    let mut headers = req.headers.clone();
    let timeout = Duration::from_millis(req.timeout_ms);
    let work = async {
        for hop in 0..=MAX_REDIRECTS {
            let target = egress::check(&url, allow_local, resolver).await.map_err(|e| e.to_string())?;
            let mut b = crate::providers::client_builder().redirect(reqwest::redirect::Policy::none()).no_proxy();
            if let Some((name, addr)) = &target.pin {
                b = b.resolve(name, *addr);
            }
            let client = b.build().map_err(|e| e.to_string())?;
            let mut rb = client.request(method.clone(), url.clone());
            for (k, v) in &headers {
                if let Some(v) = v.as_str() {
                    rb = rb.header(k.as_str(), v);
                }
            }
            if let Some(b) = &body {
                rb = rb.body(b.clone());
            }
            let resp = rb.send().await.map_err(|e| format!("Request failed: {e}"))?;
            let status = resp.status();
            if status.is_redirection()
                && let Some(loc) = resp.headers().get(reqwest::header::LOCATION).and_then(|l| l.to_str().ok())
            {
                if hop == MAX_REDIRECTS {
                    return Err(format!("Too many redirects (more than {MAX_REDIRECTS})"));
                }
                url = url.join(loc).map_err(|e| format!("Bad redirect location \"{loc}\": {e}"))?;
                let code = status.as_u16();
                if code == 303 || ((code == 301 || code == 302) && method != Method::HEAD) {
                    if method != Method::HEAD {
                        method = Method::GET;
                    }
                    body = None;
                    headers.retain(|k, _| !k.to_ascii_lowercase().starts_with("content-"));
                }
                continue;
            }
            return read(resp).await;
        }
        Err(format!("Too many redirects (more than {MAX_REDIRECTS})"))
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(format!("Request timed out after {}ms", req.timeout_ms)),
    }
}

async fn read(resp: reqwest::Response) -> Result<Value, String> {
    let status = resp.status();
    let mut headers = Map::new();
    for (k, v) in resp.headers() {
        headers.insert(k.as_str().to_string(), json!(v.to_str().unwrap_or("")));
    }
    let ct = resp.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
    let mut bytes = Vec::new();
    let mut truncated = false;
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("Reading the response failed: {e}"))?;
        let room = MAX_BODY - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            truncated = true;
            break;
        }
        bytes.extend_from_slice(&chunk);
    }
    let mut out =
        json!({"status": status.as_u16(), "statusText": status.canonical_reason().unwrap_or(""), "headers": headers});
    if is_text(ct.as_deref()) {
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if truncated {
            text.push_str(&format!("\n[TRUNCATED — the body was cut at {MAX_BODY} bytes]"));
        }
        out["body"] = json!(text);
    } else {
        out["body"] = json!(base64::engine::general_purpose::STANDARD.encode(&bytes));
        out["_body_encoding"] = json!("base64");
    }
    Ok(out)
}

impl Executor {
    /// The `sys_fetch` tool, from the loop (`cx` None) or from code.
    pub(crate) async fn sys_fetch(&mut self, args: &Value, cx: Option<&CodeCx>) -> ToolOutput {
        let cfg = self.store.config_value().unwrap_or(Value::Null);
        let allow_local = cfg.pointer("/security/allow_local_fetch").and_then(Value::as_bool).unwrap_or(false);
        let mut req = Request::from_args(args);
        let chain = cx.map(|c| c.chain.clone()).unwrap_or_default();
        match self.middleware(&cfg, "fetch", "/security/fetch_middleware", req.to_json(), chain).await {
            Ok(data) => {
                let mut merged = req.to_json();
                if let (Some(m), Some(d)) = (merged.as_object_mut(), data.as_object()) {
                    for (k, v) in d {
                        m.insert(k.clone(), v.clone());
                    }
                }
                req = Request::from_args(&merged);
            }
            Err(reason) => {
                let _ = self.log("warn", "sys_fetch", "rejected", &reason);
                return error(format!("Rejected by fetch middleware: {reason}"));
            }
        }
        let resolver = self.resolver.clone();
        match fetch(&req, allow_local, resolver.as_ref()).await {
            Ok(v) => ToolOutput::json(&v),
            Err(e) => {
                let (level, event) = if e.starts_with("Blocked") { ("warn", "blocked") } else { ("error", "error") };
                let _ = self.log(level, "sys_fetch", event, &format!("{}: {e}", req.url));
                error(e)
            }
        }
    }

    /// Run the middleware chain at `pointer` (runtime.md §10) on `data`;
    /// `Err(reason)` when one rejects. Unauthorized files are skipped with
    /// a warning while `security.require_middleware_authorization` holds.
    pub(crate) async fn middleware(
        &mut self,
        cfg: &Value,
        point: &str,
        pointer: &str,
        data: Value,
        chain: Vec<String>,
    ) -> Result<Value, String> {
        self.middleware_coded(cfg, point, pointer, data, chain).await.map_err(|(_, r)| r)
    }

    /// [`Self::middleware`] with the rejection's `code` (an inbox reject
    /// answers with it as the HTTP status).
    pub(crate) async fn middleware_coded(
        &mut self,
        cfg: &Value,
        point: &str,
        pointer: &str,
        mut data: Value,
        chain: Vec<String>,
    ) -> Result<Value, (Option<u16>, String)> {
        let refs: Vec<String> = cfg
            .pointer(pointer)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|r| r["lambda"].as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        let need_auth =
            cfg.pointer("/security/require_middleware_authorization").and_then(Value::as_bool).unwrap_or(true);
        let mut meta = json!({});
        for r in refs {
            let (path, func) = crate::sandbox::prepare::split_target(&r);
            if need_auth && !self.file_authorized(path) {
                let _ = self.log(
                    "warn",
                    "middleware",
                    "skipped_unauthorized",
                    &format!("{point} middleware {r} skipped: the file is not authorized"),
                );
                continue;
            }
            let timeout = self.code_timeout(None);
            let input = json!({"point": point, "data": data, "meta": meta});
            let out = self.lambda(path, func, input, None, chain.clone(), timeout, "middleware", None).await;
            let v = match out {
                Ok(o) => o.value.unwrap_or(Value::Null),
                Err(e) => return Err((None, format!("middleware {r} failed: {}", e.message))),
            };
            if let Some(rej) = v.get("reject").filter(|r| !r.is_null()) {
                let code = rej["code"].as_u64().and_then(|c| u16::try_from(c).ok()).filter(|c| (400..600).contains(c));
                return Err((code, rej["reason"].as_str().unwrap_or("rejected").to_string()));
            }
            if let Some(d) = v.get("data").filter(|d| !d.is_null()) {
                data = d.clone();
            }
            if let Some(m) = v.get("meta").filter(|m| !m.is_null()) {
                meta = m.clone();
            }
        }
        Ok(data)
    }
}
