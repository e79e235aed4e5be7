//! Slack (issue 20) by Socket Mode: events come over a WebSocket the app
//! opens with its app-level token (`xapp-…`, no public URL), and the agent
//! answers through the Web API with its bot token (`xoxb-…`). Both are
//! sealed credentials (`adapter:slack:SLACK_APP_TOKEN`,
//! `adapter:slack:SLACK_BOT_TOKEN`); `adapters.slack.config.api_url`
//! points at another Web API (a test double).
//!
//! A chat is a conversation id (`slack:C0123`, `slack:D0456` for a DM).
//! Each envelope is acknowledged once its message is in the inbox, so
//! what Slack redelivers (unacknowledged, or after a reconnect) is
//! de-duplicated by its conversation and `ts`. On every connect the
//! conversations the bot is in are read back to the newest message the
//! inbox holds: what arrived while the agent was off comes as one batch.

mod send;
mod socket;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::{Outbound, Policy, StatusCell, max_attachment, required_secret, without_url};
use crate::runtime::mesh::Mailbox;

const DEFAULT_API: &str = "https://slack.com/api";
/// The bot token (`xoxb-…`): the Web API.
pub const BOT_TOKEN: &str = "adapter:slack:SLACK_BOT_TOKEN";
/// The app-level token (`xapp-…`): Socket Mode.
pub const APP_TOKEN: &str = "adapter:slack:SLACK_APP_TOKEN";

/// A Web API failure: what Slack said, and how long to wait when it was a
/// 429 (`Retry-After`).
#[derive(Debug)]
pub(crate) struct ApiError {
    pub message: String,
    pub retry_after: Option<u64>,
}

/// The Web API, with the bot token.
pub(crate) struct Api {
    http: reqwest::Client,
    base: String,
    bot: String,
    /// The largest file taken in (bytes).
    pub max_file: u64,
    /// The bot's own user id (mentions, its own messages), once known.
    pub me: Mutex<String>,
    /// Forms sent, by id; the free-text questions asked, by the ts of the
    /// message asking (a thread reply to it answers); and the threads the
    /// bot started (a reply in one counts as a mention).
    pub forms: Mutex<HashMap<String, Value>>,
    pub asks: Mutex<HashMap<String, (String, String)>>,
    pub threads: Mutex<HashSet<String>>,
    names: Mutex<HashMap<String, String>>,
}

impl Api {
    /// A Web API method with JSON arguments, retried after a 429 (three
    /// tries at most, waits up to 60 s).
    pub async fn call(&self, method: &str, body: &Value) -> Result<Value, ApiError> {
        for attempt in 0..3 {
            let req = self.http.post(format!("{}/{method}", self.base)).bearer_auth(&self.bot).json(body);
            match Self::answer(method, req.timeout(Duration::from_secs(30)).send().await).await {
                Err(ApiError { retry_after: Some(s), .. }) if attempt < 2 && s <= 60 => {
                    tokio::time::sleep(Duration::from_secs(s)).await;
                }
                other => return other,
            }
        }
        Err(ApiError { message: format!("{method}: rate-limited three times"), retry_after: None })
    }

    /// A Web API method with form arguments (those that take no JSON).
    pub async fn call_form(&self, method: &str, form: &[(&str, String)]) -> Result<Value, ApiError> {
        let req = self.http.post(format!("{}/{method}", self.base)).bearer_auth(&self.bot).form(form);
        Self::answer(method, req.timeout(Duration::from_secs(30)).send().await).await
    }

    /// The socket's URL (`apps.connections.open`, with the app token).
    pub async fn open_socket(&self, app_token: &str) -> Result<String, ApiError> {
        let req = self.http.post(format!("{}/apps.connections.open", self.base)).bearer_auth(app_token);
        let v = Self::answer("apps.connections.open", req.timeout(Duration::from_secs(30)).send().await).await?;
        v["url"]
            .as_str()
            .map(str::to_string)
            .ok_or(ApiError { message: "apps.connections.open gave no url".into(), retry_after: None })
    }

    async fn answer(method: &str, sent: reqwest::Result<reqwest::Response>) -> Result<Value, ApiError> {
        let resp =
            sent.map_err(|e| ApiError { message: format!("{method}: {}", without_url(&e)), retry_after: None })?;
        let status = resp.status();
        if status.as_u16() == 429 {
            let wait = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1);
            return Err(ApiError { message: format!("{method}: rate-limited (429)"), retry_after: Some(wait) });
        }
        let v: Value = resp.json().await.map_err(|_| ApiError {
            message: format!("{method}: HTTP {status}, not a Web API answer"),
            retry_after: None,
        })?;
        if v["ok"].as_bool() == Some(true) {
            return Ok(v);
        }
        Err(ApiError { message: format!("{method}: {}", v["error"].as_str().unwrap_or("refused")), retry_after: None })
    }

    /// A user's name (`users.info`, remembered).
    pub async fn name(&self, user: &str) -> String {
        if let Some(n) = self.names.lock().ok().and_then(|n| n.get(user).cloned()) {
            return n;
        }
        let name = match self.call("users.info", &serde_json::json!({"user": user})).await {
            Ok(v) => v["user"]["name"].as_str().unwrap_or("").to_string(),
            Err(_) => String::new(),
        };
        if let Ok(mut n) = self.names.lock() {
            n.insert(user.to_string(), name.clone());
        }
        name
    }

    /// Download a shared file with the bot token: the bytes, or why not.
    pub async fn download(&self, url: &str, expect_html: bool) -> Result<Vec<u8>, String> {
        let resp = self
            .http
            .get(url)
            .bearer_auth(&self.bot)
            .timeout(Duration::from_secs(120))
            .send()
            .await
            .map_err(|e| format!("download: {}", without_url(&e)))?;
        if !resp.status().is_success() {
            return Err(format!("download: HTTP {} (the bot may lack the files:read scope)", resp.status()));
        }
        // Slack answers a token that cannot read files with its login page.
        let html =
            resp.headers().get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|c| c.contains("text/html"));
        if html && !expect_html {
            return Err("download: a login page instead of the file (the bot may lack the files:read scope)".into());
        }
        if resp.content_length().is_some_and(|l| l > self.max_file) {
            return Err(format!("over the {} byte limit", self.max_file));
        }
        let bytes = resp.bytes().await.map_err(|e| format!("download: {}", without_url(&e)))?;
        if bytes.len() as u64 > self.max_file {
            return Err(format!("over the {} byte limit", self.max_file));
        }
        Ok(bytes.to_vec())
    }
}

/// Start the channel: the sender, and the socket.
pub fn start(mb: Arc<Mailbox>, adapter: &Value, policy: Policy, status: StatusCell) -> Result<super::Started, String> {
    let bot = required_secret(&mb, BOT_TOKEN, "bot token", "slack")?;
    let app = required_secret(&mb, APP_TOKEN, "app-level token", "slack")?;
    let base = adapter.pointer("/config/api_url").and_then(Value::as_str).unwrap_or(DEFAULT_API);
    let api = Arc::new(Api {
        http: crate::providers::http_client(),
        base: base.trim_end_matches('/').to_string(),
        bot,
        max_file: max_attachment(adapter),
        me: Mutex::default(),
        forms: Mutex::default(),
        asks: Mutex::default(),
        threads: Mutex::default(),
        names: Mutex::default(),
    });
    let sender: Arc<dyn Outbound> = Arc::new(send::Sender { api: api.clone() });
    Ok((sender, Box::pin(socket::run(api, app, mb, policy, status))))
}

/// Split what `adf adapters add FILE slack` read into the two tokens, by
/// their prefixes (`xoxb-`, `xapp-`), in any order.
pub fn tokens(text: &str) -> Result<(String, String), String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let bot = words.iter().find(|w| w.starts_with("xoxb-"));
    let app = words.iter().find(|w| w.starts_with("xapp-"));
    match (bot, app) {
        (Some(b), Some(a)) => Ok((b.to_string(), a.to_string())),
        _ => Err("Slack needs two tokens: the bot token (xoxb-…) and the app-level token (xapp-…)".into()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_two_tokens_are_told_apart_by_prefix() {
        assert_eq!(super::tokens("xapp-1 \n xoxb-2").unwrap(), ("xoxb-2".into(), "xapp-1".into()));
        assert!(super::tokens("xoxb-2").unwrap_err().contains("app-level token"));
    }
}
