//! Channel adapters (issue 20, messaging.md §14): agents reachable on
//! other platforms. One contract for every channel: an adapter runs as a
//! task per (agent, channel), turns what arrives into inbox rows with the
//! channel's address (`telegram:<chat>`), and sends what the agent writes to
//! such an address. This module is the framework: the registry the fleet
//! starts adapters in and `msg_send` finds them through, who may talk to
//! an agent (`adapters.<type>.policy`), delivery with de-duplication, and
//! each channel's status. The platforms are beside it (`telegram.rs`,
//! `email.rs`); form answers by reply are read here (`forms.rs`).
//!
//! Credentials live only in the agent's sealed credentials
//! (`adapter:<type>:<KEY>`); config says which channels are on and where
//! their server is (`config.api_url`, for a self-hosted server or a test
//! double; the IMAP and SMTP servers for email).

pub mod bench;
pub mod discord;
pub mod email;
pub mod forms;
pub mod markup;
pub mod slack;
pub mod telegram;
pub mod whatsapp;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use futures_util::future::BoxFuture;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::runtime::agent::{AgentCommand, OwnerWork};
use crate::runtime::mesh::Mailbox;

/// The channels this build has.
pub const KINDS: &[&str] = &["telegram", "email", "slack", "discord", "whatsapp"];

/// A file the agent sends with a message, read from its files.
#[derive(Debug, Clone)]
pub struct OutFile {
    pub name: String,
    pub mime: String,
    pub data: Vec<u8>,
}

/// A message the agent sends on a channel: `msg_send`'s fields as a
/// channel needs them.
#[derive(Debug, Clone, Default)]
pub struct Outgoing {
    pub text: String,
    /// `text/plain`, `text/html`, or a form (`FORM_TYPE`).
    pub content_type: String,
    /// The platform id of the message replied to.
    pub reply_to: Option<String>,
    /// What the channel recorded about the message replied to (its
    /// `source_context`, with the inbox row's `subject`); `Null` if none.
    pub replied: Value,
    pub subject: Option<String>,
    /// Routing hints from `message_meta`: `cc`, `bcc`, `reply_all`.
    pub hints: Value,
    pub files: Vec<OutFile>,
}

/// The form content type (messaging.md §14).
pub const FORM_TYPE: &str = "application/vnd.adf.form+json";

/// Sending on a connected channel.
pub trait Outbound: Send + Sync {
    /// Send `text` to `chat`, as a reply to a platform message when given;
    /// the platform's id of what was sent.
    fn send<'a>(
        &'a self,
        chat: &'a str,
        text: &'a str,
        reply_to: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, String>>;

    /// A chat's metadata (`chat_info`): title, description, counts, and
    /// as much of its roster as the platform shows, at most `limit`.
    fn chat_info<'a>(&'a self, chat: &'a str, limit: usize) -> BoxFuture<'a, Result<Value, String>>;

    /// Send a form (messaging.md §14, already validated). Without native
    /// forms: a numbered list answered by reply.
    fn send_form<'a>(
        &'a self,
        chat: &'a str,
        form: &'a Value,
        reply_to: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let text = form_text(form);
            self.send(chat, &text, reply_to).await
        })
    }

    /// The channel is about to stop, the agent's file still open: write
    /// down what must outlive it (WhatsApp seals its link). By default
    /// nothing.
    fn stopping(&self) {}

    /// The channel is being removed (`adapters rm`): keep nothing of it
    /// (WhatsApp seals its link no more). By default nothing.
    fn forget(&self) {}

    /// Send a whole message (files, subject, copies where the channel has
    /// them). By default: a form or text; files are refused, never dropped.
    fn send_message<'a>(&'a self, chat: &'a str, m: &'a Outgoing) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            if !m.files.is_empty() {
                return Err("this channel does not send files yet; nothing was sent".into());
            }
            if m.content_type == FORM_TYPE {
                let v: Value = serde_json::from_str(&m.text).map_err(|e| format!("form content is not JSON: {e}"))?;
                return self.send_form(chat, &v, m.reply_to.as_deref()).await;
            }
            self.send(chat, &m.text, m.reply_to.as_deref()).await
        })
    }
}

/// A form as plain text: its title, each question numbered, each option
/// lettered, and how to answer by reply.
pub fn form_text(form: &Value) -> String {
    if let Some(t) = form["fallback_text"].as_str().filter(|t| !t.is_empty()) {
        return t.to_string();
    }
    let mut out = String::new();
    if let Some(t) = form["title"].as_str() {
        out.push_str(t);
        out.push('\n');
    }
    for (i, q) in form["questions"].as_array().into_iter().flatten().enumerate() {
        out.push_str(&format!("{}. {}\n", i + 1, q["text"].as_str().unwrap_or("")));
        for (j, o) in q["options"].as_array().into_iter().flatten().enumerate() {
            let letter = (b'a' + j as u8) as char;
            out.push_str(&format!("   {letter}) {}\n", o["label"].as_str().unwrap_or("")));
        }
    }
    out.push_str("Reply with your answers, e.g. 1a, 2b, 3 free text.");
    out
}

/// How a channel is doing.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Status {
    /// `connecting`, `connected`, `backing_off`, `stopped`.
    pub state: String,
    pub since: i64,
    pub last_error: Option<String>,
    pub received: u64,
    pub sent: u64,
    pub refused: u64,
    /// Who the channel is on the platform (a bot's @name).
    pub account: Option<String>,
    /// While a channel waits to be linked (WhatsApp): the QR code's text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qr: Option<String>,
}

/// A channel's shared status.
pub type StatusCell = Arc<Mutex<Status>>;

pub fn set_state(s: &StatusCell, state: &str, error: Option<String>) {
    if let Ok(mut st) = s.lock() {
        if st.state != state {
            st.since = crate::store::now_ms();
        }
        st.state = state.to_string();
        if error.is_some() || state == "connected" {
            st.last_error = error;
        }
    }
}

/// A channel that could not start: sending says why.
struct NotStarted(String);

impl Outbound for NotStarted {
    fn send<'a>(&'a self, _: &'a str, _: &'a str, _: Option<&'a str>) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move { Err(format!("the channel did not start: {}", self.0)) })
    }

    fn chat_info<'a>(&'a self, _: &'a str, _: usize) -> BoxFuture<'a, Result<Value, String>> {
        Box::pin(async move { Err(format!("the channel did not start: {}", self.0)) })
    }

    fn send_message<'a>(&'a self, _: &'a str, _: &'a Outgoing) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move { Err(format!("the channel did not start: {}", self.0)) })
    }
}

/// A channel's running part, not yet spawned.
pub type Run = futures_util::future::BoxFuture<'static, ()>;

/// What a channel's `start` gives back: its sender, and what to spawn
/// once the sender is in the registry.
pub type Started = (Arc<dyn Outbound>, Run);

struct Running {
    out: Arc<dyn Outbound>,
    status: StatusCell,
    task: tokio::task::JoinHandle<()>,
}

/// Every running adapter of this runtime, by (agent id, channel).
#[derive(Default)]
pub struct Registry {
    running: RwLock<HashMap<(String, String), Running>>,
}

impl Registry {
    /// Start the channels an agent's config switches on (`adapters.<type>
    /// .enabled`); a channel it does not know is logged and skipped.
    pub fn start(&self, mb: &Arc<Mailbox>, cfg: &Value) {
        self.start_only(mb, cfg, None);
    }

    /// Start one channel (just connected), or all of them; the others
    /// keep their connections.
    pub fn start_only(&self, mb: &Arc<Mailbox>, cfg: &Value, only: Option<&str>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let Some(adapters) = cfg.get("adapters").and_then(Value::as_object) else { return };
        for (kind, a) in adapters {
            if !a["enabled"].as_bool().unwrap_or(false) || only.is_some_and(|o| o != kind) {
                continue;
            }
            // One running at a time: the one before writes down what it
            // keeps before the new one reads it.
            if let Ok(mut r) = self.running.write()
                && let Some(old) = r.remove(&(mb.id.clone(), kind.clone()))
            {
                old.out.stopping();
                old.task.abort();
            }
            let status: StatusCell = Arc::new(Mutex::new(Status { state: "connecting".into(), ..Default::default() }));
            let policy = Policy::of(a);
            let started = match kind.as_str() {
                "telegram" => telegram::start(mb.clone(), a, policy, status.clone()),
                "email" => email::start(mb.clone(), a, policy, status.clone()),
                "slack" => slack::start(mb.clone(), a, policy, status.clone()),
                "discord" => discord::start(mb.clone(), a, policy, status.clone()),
                "whatsapp" => whatsapp::start(mb.clone(), a, policy, status.clone()),
                other => {
                    let _ = mb.with_store(|s| {
                        s.log("warn", "adapter", "adapter_unknown", &format!("no \"{other}\" channel in this build"))
                    });
                    continue;
                }
            };
            let (out, run) = started.unwrap_or_else(|e| {
                let _ = mb.with_store(|s| s.log("error", "adapter", "adapter_start_failed", &format!("{kind}: {e}")));
                // Stopped, with why: `adapters status` and the app say it.
                set_state(&status, "stopped", Some(e.clone()));
                (Arc::new(NotStarted(e)) as Arc<dyn Outbound>, Box::pin(async {}) as Run)
            });
            // The channel runs once its sender is listed: what it takes in
            // can wake a turn that answers on it at once (spawned under the
            // lock, so that turn's lookup waits the moment it takes to
            // insert, and never finds the channel missing).
            let mut r = self.running.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            let task = rt.spawn(run);
            if let Some(old) = r.insert((mb.id.clone(), kind.clone()), Running { out, status, task }) {
                old.task.abort();
            }
        }
    }

    /// Stop one channel of an agent (disconnected).
    pub fn stop(&self, agent: &str, kind: &str) {
        if let Ok(mut r) = self.running.write()
            && let Some(run) = r.remove(&(agent.to_string(), kind.to_string()))
        {
            run.out.forget();
            run.task.abort();
        }
    }

    /// Stop every channel of an agent (unloaded, stopped).
    pub fn stop_agent(&self, agent: &str) {
        if let Ok(mut r) = self.running.write() {
            r.retain(|(a, _), run| {
                if a == agent {
                    run.out.stopping();
                    run.task.abort();
                    false
                } else {
                    true
                }
            });
        }
    }

    /// The sender of a connected channel.
    pub fn outbound(&self, agent: &str, kind: &str) -> Option<Arc<dyn Outbound>> {
        let r = self.running.read().ok()?;
        let run = r.get(&(agent.to_string(), kind.to_string()))?;
        Some(run.out.clone())
    }

    /// Count a message sent on a channel.
    pub fn sent(&self, agent: &str, kind: &str) {
        if let Ok(r) = self.running.read()
            && let Some(run) = r.get(&(agent.to_string(), kind.to_string()))
            && let Ok(mut s) = run.status.lock()
        {
            s.sent += 1;
        }
    }

    /// An agent's channels and how each is doing.
    pub fn status(&self, agent: &str) -> Vec<(String, Status)> {
        let Ok(r) = self.running.read() else { return Vec::new() };
        let mut out: Vec<(String, Status)> = r
            .iter()
            .filter(|((a, _), _)| a == agent)
            .map(|((_, k), run)| (k.clone(), run.status.lock().map(|s| s.clone()).unwrap_or_default()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// Who may talk to an agent on a channel (`adapters.<type>.policy`).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Direct messages: `all`, `allowlist` or `none`.
    pub dm: String,
    /// Groups: `all`, `mention` or `none`.
    pub groups: String,
    /// Senders a DM allowlist admits: platform ids or @usernames.
    pub allow_from: Vec<String>,
}

impl Policy {
    pub fn of(adapter: &Value) -> Policy {
        let p = &adapter["policy"];
        Policy {
            dm: p["dm"].as_str().unwrap_or("all").to_string(),
            groups: p["groups"].as_str().unwrap_or("mention").to_string(),
            allow_from: p["allow_from"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(|s| s.trim_start_matches('@').to_lowercase())
                .collect(),
        }
    }

    /// Admit a message, or say why not (logged, never answered).
    pub fn admit(&self, m: &Inbound) -> Result<(), String> {
        // An answer to a form the agent sent where it was asked.
        if m.context.contains_key("form_id") {
            return Ok(());
        }
        if m.group {
            return match self.groups.as_str() {
                "all" => Ok(()),
                "mention" if m.mentioned => Ok(()),
                "mention" => Err("a group message that does not mention the agent".into()),
                _ => Err("group messages are off for this channel".into()),
            };
        }
        match self.dm.as_str() {
            "all" => Ok(()),
            "allowlist" => {
                let ids = [m.sender_id.to_lowercase(), m.sender_name.trim_start_matches('@').to_lowercase()];
                if ids.iter().any(|i| !i.is_empty() && self.allow_from.contains(i)) {
                    Ok(())
                } else {
                    Err(format!("{} is not on the allowlist", m.sender_label()))
                }
            }
            _ => Err("direct messages are off for this channel".into()),
        }
    }
}

/// A message a channel received, in the channel's terms.
#[derive(Debug, Clone, Default)]
pub struct Inbound {
    pub kind: &'static str,
    pub chat_id: String,
    pub chat_type: String,
    pub group: bool,
    pub mentioned: bool,
    pub message_id: String,
    pub sender_id: String,
    pub sender_name: String,
    pub text: String,
    pub reply_to_message_id: Option<String>,
    pub sent_at_ms: Option<i64>,
    pub raw: Value,
    /// What more goes into `source_context` (a form answer's ids).
    pub context: Map<String, Value>,
    /// Files that came with it, ALF-shaped: inline (`data` base64) to be
    /// imported under `imported/<channel>-<chat>/`, or skipped with why.
    pub attachments: Vec<Value>,
    /// Inbox columns this channel fills beyond the common ones (`subject`,
    /// `thread_id`); a `meta` object here is merged into the row's meta.
    pub extra: Map<String, Value>,
}

impl Inbound {
    fn sender_label(&self) -> String {
        if self.sender_name.is_empty() { self.sender_id.clone() } else { format!("@{}", self.sender_name) }
    }

    /// The inbox row (messaging.md §14): `from` is the chat's address, so
    /// a reply goes back where the message came from.
    fn row(&self) -> Map<String, Value> {
        let mut row = Map::new();
        row.insert("message_id".into(), format!("{}:{}", self.chat_id, self.message_id).into());
        row.insert("from".into(), format!("{}:{}", self.kind, self.chat_id).into());
        row.insert("network".into(), self.kind.into());
        row.insert("content".into(), self.text.clone().into());
        row.insert("content_type".into(), "text/plain".into());
        row.insert("sender_alias".into(), Value::String(self.sender_label().chars().take(64).collect()));
        row.insert("source".into(), self.kind.into());
        let mut context = json!({"chat_id": self.chat_id, "message_id": self.message_id, "chat_type": self.chat_type,
                   "reply_to_message_id": self.reply_to_message_id, "sender_id": self.sender_id,
                   "username": self.sender_name});
        if let Some(o) = context.as_object_mut() {
            o.extend(self.context.clone());
        }
        row.insert("source_context".into(), context.to_string().into());
        let mut meta = json!({"channel": self.kind});
        for (k, v) in &self.extra {
            match (k.as_str(), v) {
                ("meta", Value::Object(m)) => meta.as_object_mut().into_iter().for_each(|o| o.extend(m.clone())),
                _ => {
                    row.insert(k.clone(), v.clone());
                }
            }
        }
        row.insert("meta".into(), meta.to_string().into());
        row.insert("sent_at".into(), self.sent_at_ms.map(Value::from).unwrap_or(Value::Null));
        row.insert("received_at".into(), crate::store::now_ms().into());
        row.insert("status".into(), "unread".into());
        row.insert("original_message".into(), self.raw.to_string().into());
        row
    }
}

/// What became of an inbound message.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivered {
    /// In the inbox now (the row, to tell the agent about).
    New(Map<String, Value>),
    /// Already in the inbox (a platform redelivered it).
    Duplicate,
    /// The policy refused it (logged).
    Refused,
}

/// Put an inbound message in the agent's inbox (policy first, then
/// de-duplication); the caller tells the agent (`notify`), once for a
/// batch. Blocking: run off the async workers.
pub fn deliver(mb: &Mailbox, policy: &Policy, m: &Inbound, status: &StatusCell) -> Result<Delivered, String> {
    if let Err(why) = policy.admit(m) {
        mb.with_store(|s| s.log("info", "adapter", "message_refused", &format!("{}:{}: {why}", m.kind, m.chat_id)))?
            .map_err(|e| e.to_string())?;
        if let Ok(mut st) = status.lock() {
            st.refused += 1;
        }
        return Ok(Delivered::Refused);
    }
    let row = m.row();
    let stored = mb.with_store(|s| -> Result<Option<Map<String, Value>>, String> {
        let (id, from) = (row["message_id"].as_str().unwrap_or(""), row["from"].as_str().unwrap_or(""));
        if s.inbox_has(id, from).map_err(|e| e.to_string())? {
            return Ok(None);
        }
        let mut row = row.clone();
        if !m.attachments.is_empty() {
            let mut list = m.attachments.clone();
            crate::runtime::mesh::ingress::import_attachments(s, &format!("{}-{}", m.kind, m.chat_id), &mut list);
            row.insert("attachments".into(), Value::Array(list).to_string().into());
        }
        let inbox_id = s.inbox_insert(&row).map_err(|e| e.to_string())?;
        row.insert("id".into(), inbox_id.into());
        Ok(Some(row))
    })??;
    let Some(row) = stored else { return Ok(Delivered::Duplicate) };
    if let Ok(mut st) = status.lock() {
        st.received += 1;
    }
    Ok(Delivered::New(row))
}

/// The agent's inbox middleware (runtime.md §10) over a channel message,
/// as for any other: it may rewrite the text (`payload.content`) or
/// refuse the message (logged as a refusal, never answered). `false`:
/// refused.
pub async fn middleware(mb: &Arc<Mailbox>, m: &mut Inbound, status: &StatusCell) -> Result<bool, String> {
    let m2 = mb.clone();
    let cfg = tokio::task::spawn_blocking(move || m2.with_store(|s| s.config_value()))
        .await
        .map_err(|e| e.to_string())??
        .map_err(|e| e.to_string())?;
    if cfg.pointer("/security/middleware/inbox").and_then(Value::as_array).is_none_or(|a| a.is_empty()) {
        return Ok(true);
    }
    let mut runner = (mb.runner)().ok_or("cannot run the inbox middleware")?;
    let msg = json!({"from": format!("{}:{}", m.kind, m.chat_id), "source": m.kind,
        "payload": {"content": m.text, "sender_alias": m.sender_label(), "content_type": "text/plain"},
        "meta": {"channel": m.kind}, "source_context": Value::Object(m.context.clone())});
    let out = runner.middleware_coded(&cfg, "inbox", "/security/middleware/inbox", msg, Vec::new()).await;
    let _ = runner.store_into().close();
    match out {
        Ok(data) => {
            if let Some(text) = data.pointer("/payload/content").and_then(Value::as_str) {
                m.text = text.to_string();
            }
            Ok(true)
        }
        Err((_, reason)) => {
            let (mb, note) = (mb.clone(), format!("{}:{}: rejected by inbox middleware: {reason}", m.kind, m.chat_id));
            tokio::task::spawn_blocking(move || mb.with_store(|s| s.log("info", "adapter", "message_refused", &note)))
                .await
                .map_err(|e| e.to_string())??
                .map_err(|e| e.to_string())?;
            if let Ok(mut st) = status.lock() {
                st.refused += 1;
            }
            Ok(false)
        }
    }
}

/// Deliver one message off the async workers — who may talk first, then
/// the inbox middleware, then de-duplication and the row: the rows to
/// tell the agent about (none for a duplicate or a refusal).
pub async fn deliver_one(
    mb: &Arc<Mailbox>,
    policy: &Policy,
    status: &StatusCell,
    mut m: Inbound,
) -> Result<Vec<Map<String, Value>>, String> {
    if policy.admit(&m).is_ok() && !middleware(mb, &mut m, status).await? {
        return Ok(Vec::new());
    }
    let (mb, p, s) = (mb.clone(), policy.clone(), status.clone());
    match tokio::task::spawn_blocking(move || deliver(&mb, &p, &m, &s)).await.map_err(|e| e.to_string())?? {
        Delivered::New(row) => Ok(vec![row]),
        _ => Ok(Vec::new()),
    }
}

/// Log a line in the agent's file, off the async workers (a failure to log
/// is not a channel's failure).
pub async fn log(mb: &Arc<Mailbox>, level: &'static str, event: &'static str, msg: String) {
    let mb = mb.clone();
    let _ = tokio::task::spawn_blocking(move || mb.with_store(|s| s.log(level, "adapter", event, &msg))).await;
}

/// A channel is down: say why in its status, log it once per change (as
/// `event`), wait (`retry_after` when the platform said, else `backoff`),
/// and give the next back-off (doubling to 60 s).
pub async fn fail(
    mb: &Arc<Mailbox>,
    status: &StatusCell,
    event: &'static str,
    why: &str,
    retry_after: Option<std::time::Duration>,
    backoff: std::time::Duration,
) -> std::time::Duration {
    let max = std::time::Duration::from_secs(60);
    let changed = status.lock().map(|s| s.last_error.as_deref() != Some(why)).unwrap_or(true);
    set_state(status, "backing_off", Some(why.to_string()));
    if changed {
        log(mb, "warn", event, why.to_string()).await;
    }
    tokio::time::sleep(retry_after.unwrap_or(backoff).min(max)).await;
    (backoff * 2).min(max)
}

/// A sealed credential of the agent, trimmed; `None` when absent or empty.
pub fn secret(mb: &Mailbox, name: &str) -> Result<Option<String>, String> {
    Ok(mb
        .with_store(|s| s.secret_get(name))?
        .map_err(|e| e.to_string())?
        .and_then(|b| String::from_utf8(b).ok())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty()))
}

/// A credential a channel cannot start without, or what to do about it.
pub fn required_secret(mb: &Mailbox, name: &str, what: &str, kind: &str) -> Result<String, String> {
    secret(mb, name)?.ok_or_else(|| {
        format!(
            "no {what} ({name} is not in the agent's credentials, or they are locked): adf adapters add FILE {kind}"
        )
    })
}

/// The largest file a channel takes in (`limits.max_attachment_size`,
/// 20 MB by default).
pub fn max_attachment(adapter: &Value) -> u64 {
    adapter.pointer("/limits/max_attachment_size").and_then(Value::as_u64).unwrap_or(20 * 1024 * 1024)
}

/// A reqwest error without its URL (which may carry a token).
pub fn without_url(e: &reqwest::Error) -> String {
    let mut e = e.to_string();
    if let Some(i) = e.find(" for url") {
        e.truncate(i);
    }
    e
}

/// How to open a WebSocket to `url`: TLS (the platform's roots, built at
/// each connect, so a machine without them fails here, with the cause, and
/// not at start) for `wss:`, plain for `ws:` (a test double on loopback).
pub fn ws_connector(url: &str) -> Result<tokio_tungstenite::Connector, String> {
    if url.starts_with("ws:") {
        return Ok(tokio_tungstenite::Connector::Plain);
    }
    Ok(tokio_tungstenite::Connector::Rustls(email::tls::client_config(Vec::new())?))
}

/// A file as a multipart part, its type kept when valid.
pub fn part(f: &OutFile) -> Result<reqwest::multipart::Part, String> {
    let p = || reqwest::multipart::Part::bytes(f.data.clone()).file_name(f.name.clone());
    p().mime_str(&f.mime).or_else(|_| p().mime_str("application/octet-stream")).map_err(|e| format!("{}: {e}", f.name))
}

/// Tell the agent about the rows a batch put in its inbox: one wake.
pub fn notify(mb: &Mailbox, rows: Vec<Map<String, Value>>) {
    if !rows.is_empty() {
        mb.notify(AgentCommand::With(OwnerWork(Box::new(move |ex| ex.inbox_batch_arrived(rows)))));
    }
}

/// The sealed credentials a channel keeps (`adf adapters rm` removes them).
pub fn secrets(kind: &str) -> Vec<String> {
    match kind {
        "email" => vec![email::USERNAME.to_string(), email::PASSWORD.to_string()],
        "slack" => vec![slack::BOT_TOKEN.to_string(), slack::APP_TOKEN.to_string()],
        "discord" => vec![discord::TOKEN.to_string()],
        "whatsapp" => vec![whatsapp::store::SESSION.to_string()],
        other => vec![format!("adapter:{other}:BOT_TOKEN")],
    }
}

/// Connect a channel on an agent's file: check the request (`type`,
/// `token` — an email password —, `dm`, `groups`, `allow_from`, `api_url`;
/// for email `address`, `username`, `imap`, `smtp`, `ca_pem`), seal the
/// credentials and write `adapters.<type>`, keeping the server, poll time
/// and limits set before unless the request says otherwise. The CLI, the
/// owner's route and the approved `adapter_setup` all come here; what runs
/// the agent starts the channel.
pub fn connect(store: &mut crate::store::Store, input: &Value) -> Result<String, String> {
    let kind = input["type"].as_str().unwrap_or_default();
    if !KINDS.contains(&kind) {
        return Err(format!("no \"{kind}\" channel in this build (channels: {})", KINDS.join(", ")));
    }
    let token = input["token"].as_str().map(str::trim).unwrap_or_default();
    // WhatsApp has no token: its link (`session`, base64) comes from a
    // pairing, or the channel asks for one when it starts.
    if token.is_empty() && kind != "whatsapp" {
        return Err(if kind == "email" { "a password is required" } else { "a token is required" }.into());
    }
    let pick = |k: &str, allowed: &[&str], default: &str| -> Result<String, String> {
        let v = input[k].as_str().unwrap_or(default);
        if allowed.contains(&v) { Ok(v.to_string()) } else { Err(format!("{k} must be one of {}", allowed.join(", "))) }
    };
    let dm = pick("dm", &["all", "allowlist", "none"], "allowlist")?;
    let groups = pick("groups", &["all", "mention", "none"], "mention")?;
    let allow: Vec<Value> = input["allow_from"].as_array().cloned().unwrap_or_default();
    let before = store.config_value().ok().and_then(|c| c.pointer(&format!("/adapters/{kind}")).cloned());
    let mut adapter = json!({"enabled": true, "policy": {"dm": dm, "groups": groups, "allow_from": allow}});
    for part in ["config", "limits"] {
        if let Some(v) = before.as_ref().and_then(|b| b.get(part)).filter(|v| v.is_object()) {
            adapter[part] = v.clone();
        }
    }
    if !adapter["config"].is_object() {
        adapter["config"] = json!({});
    }
    // A server of its own (email's `api_url` is its IMAP URL, read below).
    if kind != "email"
        && let Some(u) = input["api_url"].as_str()
    {
        let schemes: &[&str] = if kind == "whatsapp" { &["ws", "wss"] } else { &["http", "https"] };
        match url::Url::parse(u) {
            Ok(p) if schemes.contains(&p.scheme()) => adapter["config"]["api_url"] = json!(u),
            _ => return Err(format!("api_url {u:?} is not a {} URL", schemes.join(" or "))),
        }
    }
    let (sealed, said) = if kind == "email" {
        let (config, username) = email::settings(input, &adapter["config"])?;
        let said = format!(
            "email switched on for {} (IMAP {}, SMTP {}; {dm} direct messages); it connects in the background. \
             The password is sealed in your credentials and will not be shown again.",
            config["address"].as_str().unwrap_or(""),
            email::Server::of(&config["imap"]).map(|s| s.to_string()).unwrap_or_default(),
            email::Server::of(&config["smtp"]).map(|s| s.to_string()).unwrap_or_default(),
        );
        adapter["config"] = config;
        (vec![(email::USERNAME.to_string(), username), (email::PASSWORD.to_string(), token.to_string())], said)
    } else if kind == "slack" {
        // The bot token and the app-level token, in `token` (either order,
        // told apart by prefix) or `token` and `app_token`.
        let both = format!("{token} {}", input["app_token"].as_str().unwrap_or(""));
        let (bot, app) = slack::tokens(&both)?;
        let said = format!(
            "slack switched on ({dm} direct messages, channels: {groups}); it connects in the background. \
             The tokens are sealed in your credentials and will not be shown again."
        );
        (vec![(slack::BOT_TOKEN.to_string(), bot), (slack::APP_TOKEN.to_string(), app)], said)
    } else if kind == "whatsapp" {
        let mut sealed = Vec::new();
        if let Some(b64) = input["session"].as_str() {
            use base64::Engine;
            let link = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| format!("session is not base64: {e}"))?;
            if !whatsapp::store::SealedBackend::open(Some(&link))?.linked() {
                return Err("session is not a linked WhatsApp device".into());
            }
            let link = String::from_utf8(link).map_err(|_| "session is not a WhatsApp link".to_string())?;
            sealed.push((whatsapp::store::SESSION.to_string(), link));
        }
        let said = format!(
            "whatsapp switched on ({dm} direct messages, groups: {groups}); {}",
            if sealed.is_empty() {
                "it asks to be linked when it starts: scan the QR code (WhatsApp → Linked devices) \
                 in the app's /channels view or with adf adapters status AGENT"
            } else {
                "the link is sealed in your credentials"
            }
        );
        (sealed, said)
    } else {
        let said = format!(
            "{kind} switched on ({dm} direct messages, groups: {groups}); it connects in the background. \
             The token is sealed in your credentials and will not be shown again."
        );
        let name = if kind == "discord" { discord::TOKEN.to_string() } else { format!("adapter:{kind}:BOT_TOKEN") };
        (vec![(name, token.to_string())], said)
    };
    for (name, value) in &sealed {
        store
            .secret_set(name, value.as_bytes(), false)
            .map_err(|e| format!("the credentials could not be sealed ({e}); the owner may need to unlock the file"))?;
    }
    store
        .config_set(crate::store::Caller::Owner, &format!("adapters.{kind}"), adapter)
        .map_err(|e| format!("adapters.{kind} not written: {e}"))?;
    let _ = store.log("info", "adapter", "adapter_connected", &format!("{kind} switched on"));
    Ok(said)
}

/// Disconnect a channel on an agent's file: its config and its sealed
/// credentials go (the CLI, the owner's route). What runs the agent stops
/// the channel.
pub fn disconnect(store: &mut crate::store::Store, kind: &str) -> Result<String, String> {
    let mut cfg = store.config_value().map_err(|e| e.to_string())?;
    if cfg["adapters"].as_object_mut().and_then(|a| a.remove(kind)).is_none() {
        return Err(format!("no {kind} channel (adf adapters ls lists them)"));
    }
    store.config_replace(cfg).map_err(|e| format!("adapters.{kind} not removed: {e}"))?;
    for name in secrets(kind) {
        store.secret_rm(&name).map_err(|e| format!("the credentials could not be removed ({e})"))?;
    }
    let _ = store.log("info", "adapter", "adapter_disconnected", &format!("{kind} switched off"));
    Ok(format!("{kind} disconnected and its credentials removed"))
}

/// A channel address `type:id` split, when `type` is a channel this build has.
pub fn address(to: &str) -> Option<(&str, &str)> {
    let (kind, id) = to.split_once(':')?;
    (KINDS.contains(&kind) && !id.is_empty()).then_some((kind, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(group: bool, mentioned: bool, id: &str, name: &str) -> Inbound {
        Inbound {
            kind: "telegram",
            group,
            mentioned,
            sender_id: id.into(),
            sender_name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_policy_admits_by_dm_and_group_rules() {
        let p = Policy::of(&json!({"policy": {"dm": "allowlist", "groups": "mention", "allow_from": ["@Ann", "42"]}}));
        assert!(p.admit(&m(false, false, "7", "ann")).is_ok(), "by username, any case");
        assert!(p.admit(&m(false, false, "42", "")).is_ok(), "by id");
        assert!(p.admit(&m(false, false, "8", "bob")).unwrap_err().contains("@bob is not on the allowlist"));
        assert!(p.admit(&m(true, true, "8", "bob")).is_ok(), "mentioned in a group");
        assert!(p.admit(&m(true, false, "8", "bob")).is_err());
        let closed = Policy::of(&json!({"policy": {"dm": "none", "groups": "none"}}));
        assert!(closed.admit(&m(false, false, "42", "")).is_err());
        assert!(closed.admit(&m(true, true, "42", "")).is_err());
        let open = Policy::of(&json!({}));
        assert_eq!((open.dm.as_str(), open.groups.as_str()), ("all", "mention"), "the defaults");
        let form = json!({"title": "Lunch", "questions": [{"text": "Where?", "options": [{"label": "Pizza"}, {"label": "Sushi"}]},
            {"text": "Notes?"}]});
        assert_eq!(
            form_text(&form),
            "Lunch\n1. Where?\n   a) Pizza\n   b) Sushi\n2. Notes?\nReply with your answers, e.g. 1a, 2b, 3 free text."
        );
        assert_eq!(form_text(&json!({"fallback_text": "Pick one"})), "Pick one");
        assert_eq!(address("telegram:123"), Some(("telegram", "123")));
        assert_eq!(address("did:key:z6Mk"), None);
        assert_eq!(address("telegram:"), None);
    }
}
