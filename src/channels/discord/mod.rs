//! Discord (issue 20): the gateway (a WebSocket: heartbeats, identify,
//! resume) for what arrives, REST for what the agent sends. The bot token
//! is the sealed credential `adapter:discord:DISCORD_BOT_TOKEN`;
//! `adapters.discord.config.api_url` points at another REST base (a test
//! double), and the gateway's address comes from it (`/gateway/bot`).
//!
//! A chat is a channel id (`discord:<id>`: a server channel or a DM).
//! Missed events come back by resuming the session; what arrived while
//! the agent was off is read back from the channels it has talked in, as
//! one batch. A slash command named after the bot (`/scout prompt:…`) is
//! registered when the gateway is ready.

mod gateway;
mod send;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use super::{Outbound, Policy, StatusCell, max_attachment, required_secret, without_url};
use crate::runtime::mesh::Mailbox;

const DEFAULT_API: &str = "https://discord.com/api/v10";
/// The bot token.
pub const TOKEN: &str = "adapter:discord:DISCORD_BOT_TOKEN";
/// Discord's epoch (ms): snowflakes count from it.
const EPOCH_MS: i64 = 1_420_070_400_000;

/// When a snowflake was made (ms since the Unix epoch).
pub(crate) fn snowflake_ms(id: &str) -> Option<i64> {
    id.parse::<u64>().ok().map(|n| (n >> 22) as i64 + EPOCH_MS)
}

/// The smallest snowflake of a time.
pub(crate) fn snowflake_at(ms: i64) -> u64 {
    ((ms - EPOCH_MS).max(0) as u64) << 22
}

/// A REST failure: what Discord said, and how long to wait when it was a
/// 429 (`retry_after`).
#[derive(Debug)]
pub(crate) struct ApiError {
    pub message: String,
    pub retry_after: Option<f64>,
}

/// REST, with the bot token; what the sender and the gateway share.
pub(crate) struct Rest {
    http: reqwest::Client,
    base: String,
    token: String,
    pub max_file: u64,
    /// The bot's user id and the application's, once ready.
    pub me: Mutex<String>,
    pub app: Mutex<String>,
    /// Forms sent, by id; free-text questions asked: (channel, message) →
    /// (form, question).
    pub forms: Mutex<HashMap<String, Value>>,
    pub asks: Mutex<HashMap<(String, String), (String, String)>>,
}

impl Rest {
    /// A REST call, retried after a 429 (three tries, waits up to 60 s).
    pub async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, ApiError> {
        for attempt in 0..3 {
            let mut req = self
                .http
                .request(method.clone(), format!("{}{path}", self.base))
                .header("authorization", format!("Bot {}", self.token))
                .timeout(Duration::from_secs(30));
            if let Some(b) = body {
                req = req.json(b);
            }
            match Self::answer(path, req.send().await).await {
                Err(ApiError { retry_after: Some(s), .. }) if attempt < 2 && s <= 60.0 => {
                    tokio::time::sleep(Duration::from_secs_f64(s)).await;
                }
                other => return other,
            }
        }
        Err(ApiError { message: format!("{path}: rate-limited three times"), retry_after: None })
    }

    /// A message with files: `payload_json` and `files[n]`.
    pub async fn upload(&self, path: &str, form: reqwest::multipart::Form) -> Result<Value, ApiError> {
        let req = self
            .http
            .post(format!("{}{path}", self.base))
            .header("authorization", format!("Bot {}", self.token))
            .multipart(form)
            .timeout(Duration::from_secs(300));
        Self::answer(path, req.send().await).await
    }

    async fn answer(path: &str, sent: reqwest::Result<reqwest::Response>) -> Result<Value, ApiError> {
        let resp = sent.map_err(|e| ApiError { message: format!("{path}: {}", without_url(&e)), retry_after: None })?;
        let status = resp.status();
        if status.as_u16() == 204 {
            return Ok(Value::Null);
        }
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(v);
        }
        let retry_after = (status.as_u16() == 429).then(|| v["retry_after"].as_f64().unwrap_or(1.0));
        let what = v["message"].as_str().unwrap_or("refused");
        Err(ApiError { message: format!("{path}: {what} (HTTP {})", status.as_u16()), retry_after })
    }

    /// A file from Discord's CDN (its URL is signed; no token).
    pub async fn download(&self, url: &str) -> Result<Vec<u8>, String> {
        let resp = self
            .http
            .get(url)
            .timeout(Duration::from_secs(120))
            .send()
            .await
            .map_err(|e| format!("download: {}", without_url(&e)))?;
        if !resp.status().is_success() {
            return Err(format!("download: HTTP {}", resp.status()));
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

    pub(crate) fn me(&self) -> String {
        self.me.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// Start the channel: the sender, and the gateway.
pub fn start(mb: Arc<Mailbox>, adapter: &Value, policy: Policy, status: StatusCell) -> Result<super::Started, String> {
    let token = required_secret(&mb, TOKEN, "bot token", "discord")?;
    let base = adapter.pointer("/config/api_url").and_then(Value::as_str).unwrap_or(DEFAULT_API);
    let rest = Arc::new(Rest {
        http: crate::providers::http_client(),
        base: base.trim_end_matches('/').to_string(),
        token,
        max_file: max_attachment(adapter),
        me: Mutex::default(),
        app: Mutex::default(),
        forms: Mutex::default(),
        asks: Mutex::default(),
    });
    let sender: Arc<dyn Outbound> = Arc::new(send::Sender { rest: rest.clone() });
    Ok((sender, Box::pin(gateway::run(rest, mb, policy, status))))
}

#[cfg(test)]
mod tests {
    #[test]
    fn snowflakes_carry_their_time() {
        let id = super::snowflake_at(1_764_547_200_000) + 5;
        assert_eq!(super::snowflake_ms(&id.to_string()), Some(1_764_547_200_000));
        assert_eq!(super::snowflake_ms("175928847299117063"), Some(1_462_015_105_796), "Discord's documented example");
    }
}
