//! A client of the daemon's control API: the CLI's daemon commands use it
//! (and the terminal app will, to attach). It finds the daemon (`--url`,
//! `ADF_DAEMON_URL`, the fleet's `.daemon.json`, then the default port),
//! sends the bearer token local clients read from the token file, and turns
//! failures into one clear line: no daemon (and how to start one), or the
//! API's own `error`.

use reqwest::Method;
use serde_json::Value;

pub mod remotes;
pub mod ssh;

pub const DEFAULT_URL: &str = "http://127.0.0.1:7385";

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "no daemon answers at {url} ({detail}); start one with `adf daemon`, or point --url / ADF_DAEMON_URL at one"
    )]
    Unreachable { url: String, detail: String },
    #[error("{0}")]
    Api(String),
    #[error("bad URL {0}")]
    BadUrl(String),
}

/// The remote `--remote` named: its URL, token and Host.
static REMOTE: std::sync::OnceLock<remotes::Fields> = std::sync::OnceLock::new();

#[derive(Clone)]
pub struct Client {
    pub base: String,
    token: Option<String>,
    /// The `Host` header to send (a daemon reached through a tunnel
    /// answers only to its own address).
    host: Option<String>,
    http: reqwest::Client,
}

impl Client {
    /// The daemon to talk to: an explicit URL, else the environment, else
    /// the one running for the default fleet, else the default address.
    pub fn find(url: Option<&str>) -> Client {
        let base = url
            .map(str::to_string)
            .or_else(|| std::env::var("ADF_DAEMON_URL").ok().filter(|u| !u.is_empty()))
            .or_else(|| crate::daemon::discover(&crate::paths::fleet_dir()))
            .unwrap_or_else(|| DEFAULT_URL.to_string());
        Client::new(&base)
    }

    pub fn new(base: &str) -> Client {
        let base = base.trim_end_matches('/').to_string();
        let (token, host) = match REMOTE.get() {
            Some(r) if r.url == base => (r.token.clone(), r.host.clone()),
            _ => (crate::daemon::token::for_client(), None),
        };
        Client { base, token, host, http: crate::providers::http_client() }
    }

    /// This process talks to a remote (`--remote NAME`): clients of its URL
    /// send its token (and, through a tunnel, its Host) instead of the
    /// local ones.
    pub fn use_remote(conn: &remotes::Connection) {
        let _ = REMOTE.set(conn.clone_fields());
    }

    /// Whether a daemon was named explicitly or is known to run here.
    pub fn configured(url: Option<&str>) -> bool {
        url.is_some()
            || std::env::var("ADF_DAEMON_URL").is_ok_and(|u| !u.is_empty())
            || crate::daemon::discover(&crate::paths::fleet_dir()).is_some()
    }

    /// A URL from path segments (each percent-encoded) and a query.
    pub fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Result<reqwest::Url, ClientError> {
        let mut u = reqwest::Url::parse(&self.base).map_err(|_| ClientError::BadUrl(self.base.clone()))?;
        {
            let mut p = u.path_segments_mut().map_err(|_| ClientError::BadUrl(self.base.clone()))?;
            p.pop_if_empty();
            for s in segments {
                p.push(s);
            }
        }
        if !query.is_empty() {
            u.query_pairs_mut().extend_pairs(query);
        }
        Ok(u)
    }

    pub fn request(&self, method: Method, url: reqwest::Url) -> reqwest::RequestBuilder {
        let mut r = self.http.request(method, url);
        // Through a tunnel: the name the far daemon answers to.
        if let Some(h) = &self.host {
            r = r.header(reqwest::header::HOST, h);
        }
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// One call; the JSON body, or the API's error as one line.
    pub async fn call(&self, method: Method, url: reqwest::Url, body: Option<&Value>) -> Result<Value, ClientError> {
        let mut r = self.request(method, url);
        if let Some(b) = body {
            r = r.json(b);
        }
        let resp =
            r.send().await.map_err(|e| ClientError::Unreachable { url: self.base.clone(), detail: root_cause(&e) })?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| ClientError::Api(e.to_string()))?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
        if !status.is_success() {
            let msg = v["error"].as_str().map(str::to_string).unwrap_or_else(|| format!("HTTP {status} {text}"));
            return Err(ClientError::Api(msg));
        }
        Ok(v)
    }

    pub async fn get(&self, segments: &[&str]) -> Result<Value, ClientError> {
        self.call(Method::GET, self.url(segments, &[])?, None).await
    }

    pub async fn post(&self, segments: &[&str], body: &Value) -> Result<Value, ClientError> {
        self.call(Method::POST, self.url(segments, &[])?, Some(body)).await
    }
}

pub(crate) fn root_cause(e: &reqwest::Error) -> String {
    let mut s: &dyn std::error::Error = e;
    while let Some(src) = s.source() {
        s = src;
    }
    s.to_string()
}

/// The daemon's event stream (one agent's, from a cursor).
pub async fn open_stream(c: &Client, agent: Option<&str>, since: Option<u64>) -> anyhow::Result<reqwest::Response> {
    let since = since.map(|s| s.to_string());
    let mut q: Vec<(&str, &str)> = Vec::new();
    if let Some(a) = agent {
        q.push(("agentId", a));
    }
    if let Some(s) = &since {
        q.push(("since", s));
    }
    let url = c.url(&["events"], &q)?;
    let resp = c
        .request(Method::GET, url)
        .send()
        .await
        .map_err(|e| ClientError::Unreachable { url: c.base.clone(), detail: e.to_string() })?;
    if !resp.status().is_success() {
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        anyhow::bail!("{}", v["error"].as_str().unwrap_or("the event stream was refused"));
    }
    Ok(resp)
}

/// The `data:` of each SSE frame of a response, as it arrives.
pub struct Frames {
    stream: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<axum::body::Bytes>> + Send>>,
    buf: String,
}

impl Frames {
    pub fn new(resp: reqwest::Response) -> Frames {
        Frames { stream: Box::pin(resp.bytes_stream()), buf: String::new() }
    }

    pub async fn next(&mut self) -> anyhow::Result<Option<String>> {
        use futures_util::StreamExt;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let frame: String = self.buf.drain(..end + 2).collect();
                match frame.lines().find_map(|l| l.strip_prefix("data: ")) {
                    Some(d) => return Ok(Some(d.to_string())),
                    None => continue,
                }
            }
            match self.stream.next().await {
                Some(chunk) => self.buf.push_str(&String::from_utf8_lossy(&chunk?)),
                None => return Ok(None),
            }
        }
    }
}
