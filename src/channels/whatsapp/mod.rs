//! WhatsApp (issue 20) as a linked device of a personal number, over the
//! multi-device protocol with the maintained `whatsapp-rust` client: Noise
//! to the server, Signal end to end. There is no token: the owner links the
//! agent by scanning a QR code with the phone (WhatsApp → Linked devices),
//! drawn in the terminal by `adf adapters add FILE whatsapp` and in the
//! app's `/channels` view. What the link is made of (keys, sessions) is
//! sealed in the agent's credentials (`store.rs`).
//!
//! A chat's address is `whatsapp:<user>` for a person (the phone number)
//! and `whatsapp:<id>@g.us` for a group. Replies quote the message they
//! answer. Messages that arrived while the agent was off come from the
//! server's offline queue when it connects, one wake for the batch; a
//! redelivered message is de-duplicated by its id. The client reconnects
//! by itself; the channel's status says when it is down and why.
//!
//! Nothing received is lost to a crash: the client keeps each decrypted
//! message in the sealed link until the agent's inbox has it ([`Durable`],
//! the client's inbound durability hook), and only then tells the server
//! it arrived. A message the inbox could not take (a full disk) stays
//! unacknowledged; the server delivers it again, and the client replays
//! it from the sealed copy.

pub mod store;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use whatsapp_rust::prelude::*;
use whatsapp_rust::wacore::types::events::InboundMessage;
use whatsapp_rust::waproto::whatsapp as wa;

use super::{Inbound, Outbound, Outgoing, Policy, StatusCell, deliver_one, notify, set_state};
use crate::runtime::mesh::Mailbox;
use store::{SESSION, SealedBackend};

/// WhatsApp's chat server.
pub const DEFAULT_API: &str = "wss://web.whatsapp.com/ws/chat";

/// The version a self-hosted server (or a test double) is spoken to with:
/// it has no `sw.js` to read the current one from.
const PINNED_VERSION: (u32, u32, u32) = (2, 3000, 1_023_000_000);

/// The client's HTTP (the current version's page, media) over reqwest.
/// With a self-hosted server, media comes from that server too (`media`:
/// its origin, `http` for `ws`, `https` for `wss`), whatever host it names.
struct Http(reqwest::Client, Option<url::Url>, u64);

/// The origin media is fetched from for a self-hosted chat server.
fn media_origin(api_url: &str) -> Option<url::Url> {
    let mut u = url::Url::parse(api_url).ok()?;
    let scheme = if u.scheme() == "wss" { "https" } else { "http" };
    u.set_scheme(scheme).ok()?;
    u.set_path("/");
    Some(u)
}

#[async_trait::async_trait]
impl whatsapp_rust::wacore::net::HttpClient for Http {
    async fn execute(
        &self,
        r: whatsapp_rust::wacore::net::HttpRequest,
    ) -> anyhow::Result<whatsapp_rust::wacore::net::HttpResponse> {
        let method = reqwest::Method::from_bytes(r.method.as_bytes())?;
        let mut url = url::Url::parse(&r.url)?;
        if let Some(o) = &self.1 {
            url.set_scheme(o.scheme()).map_err(|_| anyhow::anyhow!("bad media origin"))?;
            url.set_host(o.host_str())?;
            url.set_port(o.port()).map_err(|_| anyhow::anyhow!("bad media origin"))?;
        }
        let mut req = self.0.request(method, url).timeout(Duration::from_secs(120));
        for (k, v) in &r.headers {
            req = req.header(k, v);
        }
        if let Some(b) = r.body {
            req = req.body(b.to_vec());
        }
        let mut resp = req.send().await.map_err(|e| anyhow::anyhow!(super::without_url(&e)))?;
        let status_code = resp.status().as_u16();
        // What a sender declares is not what the server sends: a body is
        // read only up to the limit (a file's limit, and its MAC).
        let cap = self.2;
        if resp.content_length().is_some_and(|l| l > cap) {
            anyhow::bail!("over the {cap} byte limit");
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| anyhow::anyhow!(super::without_url(&e)))? {
            if (body.len() + chunk.len()) as u64 > cap {
                anyhow::bail!("over the {cap} byte limit");
            }
            body.extend_from_slice(&chunk);
        }
        Ok(whatsapp_rust::wacore::net::HttpResponse { status_code, body })
    }
}

/// The client's WebSocket, watched: a connection that fails says why, in
/// the channel's status (and to a pairing waiting on it), where the client
/// itself would only retry.
struct Watched {
    inner: whatsapp_rust::transport::TokioWebSocketTransportFactory,
    url: String,
    failed: Arc<dyn Fn(String) + Send + Sync>,
}

type TransportPair = (
    Arc<dyn whatsapp_rust::wacore::net::Transport>,
    async_channel::Receiver<whatsapp_rust::wacore::net::TransportEvent>,
);

#[async_trait::async_trait]
impl whatsapp_rust::wacore::net::TransportFactory for Watched {
    async fn create_transport(&self) -> anyhow::Result<TransportPair> {
        let made = self.inner.create_transport().await;
        if let Err(e) = &made {
            (self.failed)(format!("cannot reach the WhatsApp server at {}: {e:#}", self.url));
        }
        made
    }
}

fn watched(url: &str, failed: impl Fn(String) + Send + Sync + 'static) -> Watched {
    Watched {
        inner: whatsapp_rust::transport::TokioWebSocketTransportFactory::new().with_url(url),
        url: url.to_string(),
        failed: Arc::new(failed),
    }
}

/// The JID of a chat address's id: a phone number is a person.
pub fn jid_of(chat: &str) -> Result<Jid, String> {
    let full = if chat.contains('@') { chat.to_string() } else { format!("{chat}@s.whatsapp.net") };
    full.parse::<Jid>().map_err(|e| format!("{chat:?} is not a WhatsApp chat ({e})"))
}

/// A chat's address id: a person's phone number, a group's whole JID.
fn chat_id(jid: &Jid) -> String {
    if jid.server == Server::Pn { jid.user.to_string() } else { jid.to_string() }
}

struct Sender {
    client: Arc<Client>,
    forms: Forms,
}

/// The forms sent, newest last: (message id, chat, form). A reply quoting
/// one of them is read as its answers.
type Forms = Arc<Mutex<std::collections::VecDeque<(String, String, Value)>>>;

/// The form a message quoting `replied_to` in `chat` answers, if any.
fn form_for(forms: &Forms, chat: &str, replied_to: &str) -> Option<Value> {
    let f = forms.lock().ok()?;
    f.iter().rev().find(|(id, c, _)| id == replied_to && c == chat).map(|(_, _, form)| form.clone())
}

impl Sender {
    /// Send text, quoting the message replied to (its id, who wrote it and
    /// its text, as the channel recorded them) when there is one.
    async fn quoted(&self, chat: &str, text: &str, reply_to: Option<&str>, replied: &Value) -> Result<String, String> {
        let jid = jid_of(chat)?;
        let msg = match reply_to {
            Some(id) => {
                let author = replied["sender_jid"].as_str().map(str::to_string).unwrap_or_else(|| jid.to_string());
                let quoted = wa::Message::text(replied["text"].as_str().unwrap_or_default());
                let ctx = wa::ContextInfo {
                    stanza_id: Some(id.to_string()),
                    participant: Some(author),
                    quoted_message: whatsapp_rust::buffa::MessageField::some(quoted),
                    ..Default::default()
                };
                wa::Message::text_with_context(text, ctx)
            }
            None => wa::Message::text(text),
        };
        let sent = self.client.send_message(jid, msg).await.map_err(|e| format!("send: {e}"))?;
        Ok(sent.message_id.to_string())
    }
}

impl Outbound for Sender {
    fn send<'a>(
        &'a self,
        chat: &'a str,
        text: &'a str,
        reply_to: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(self.quoted(chat, text, reply_to, &Value::Null))
    }

    fn send_message<'a>(&'a self, chat: &'a str, m: &'a Outgoing) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            if !m.files.is_empty() {
                return Err("this channel does not send files yet; nothing was sent".into());
            }
            if m.content_type != super::FORM_TYPE {
                return self.quoted(chat, &m.text, m.reply_to.as_deref(), &m.replied).await;
            }
            // A form: a numbered list, answered by a reply quoting it.
            let form: Value = serde_json::from_str(&m.text).map_err(|e| format!("form content is not JSON: {e}"))?;
            let id = self.quoted(chat, &super::form_text(&form), m.reply_to.as_deref(), &m.replied).await?;
            if let Ok(mut f) = self.forms.lock() {
                if f.len() >= 64 {
                    f.pop_front();
                }
                f.push_back((id.clone(), chat_id(&jid_of(chat)?), form));
            }
            Ok(id)
        })
    }

    fn chat_info<'a>(&'a self, chat: &'a str, _limit: usize) -> BoxFuture<'a, Result<Value, String>> {
        Box::pin(async move {
            let jid = jid_of(chat)?;
            Ok(json!({"chat_id": chat_id(&jid), "type": if jid.server == Server::Pn { "private" } else { "group" }}))
        })
    }
}

/// An inbound WhatsApp message in the channel's terms; `None` for what is
/// not for the agent (its own messages, protocol messages with no text).
fn inbound(m: &wa::Message, info: &MessageInfo, own: &[Jid]) -> Option<Inbound> {
    use whatsapp_rust::wacore_binary::jid::JidExt;
    // Its own messages, contacts' Status posts and channels' posts are not
    // messages to the agent.
    let chat = &info.source.chat;
    if info.source.is_from_me || chat.is_status_broadcast() || chat.is_newsletter() {
        return None;
    }
    // Disappearing, view-once and captioned messages come wrapped.
    let m = m.get_base_message();
    let mut text = m.text_content().or_else(|| m.get_caption()).map(str::to_string).unwrap_or_default();
    let ctx = context_of(m);
    if text.is_empty() {
        // A file with no caption: what it is, for the agent to read.
        text = media_of(m, "")?.what;
    }
    let mentioned = ctx.is_some_and(|c| {
        c.mentioned_jid.iter().any(|j| own.iter().any(|o| j.split(['@', ':']).next() == Some(o.user.as_str())))
    });
    // Who wrote: their phone number where the server gives one beside a LID.
    let sender = match &info.source.sender_alt {
        Some(alt) if info.source.sender.server == Server::Lid && alt.server == Server::Pn => alt,
        _ => &info.source.sender,
    };
    let mut context = serde_json::Map::new();
    context.insert("jid".into(), info.source.chat.to_string().into());
    context.insert("sender_jid".into(), info.source.sender.to_non_ad().to_string().into());
    // What a reply quotes.
    context.insert("text".into(), text.chars().take(1000).collect::<String>().into());
    // A person writing from a LID is their number where it is known: one
    // address (and allowlist entry) a person.
    let chat_id = match chat.server {
        Server::Lid if !info.source.is_group && sender.server == Server::Pn => sender.user.to_string(),
        _ => chat_id(chat),
    };
    Some(Inbound {
        kind: "whatsapp",
        chat_id,
        chat_type: if info.source.is_group { "group" } else { "private" }.into(),
        group: info.source.is_group,
        mentioned,
        message_id: info.id.to_string(),
        sender_id: sender.user.to_string(),
        sender_name: info.push_name.clone(),
        text,
        reply_to_message_id: ctx.and_then(|c| c.stanza_id.clone()),
        sent_at_ms: Some(info.timestamp.timestamp_millis()),
        raw: json!({"id": info.id.to_string(), "chat": info.source.chat.to_string(),
            "sender": info.source.sender.to_string(), "push_name": info.push_name}),
        context,
        ..Default::default()
    })
}

/// A message's file.
struct Media<'a> {
    file: &'a dyn whatsapp_rust::download::Downloadable,
    name: String,
    mime: String,
    /// What the message says when it has no caption (`[voice note, 3 s]`).
    what: String,
    /// Its size, as the sender declares it.
    size: Option<u64>,
}

/// The context (quote, mentions) of a text or a file.
fn context_of(m: &wa::Message) -> Option<&wa::ContextInfo> {
    let c = m.extended_text_message.as_option().and_then(|e| e.context_info.as_option());
    c.or_else(|| m.image_message.as_option().and_then(|x| x.context_info.as_option()))
        .or_else(|| m.video_message.as_option().and_then(|x| x.context_info.as_option()))
        .or_else(|| m.audio_message.as_option().and_then(|x| x.context_info.as_option()))
        .or_else(|| m.document_message.as_option().and_then(|x| x.context_info.as_option()))
}

fn media_of<'a>(m: &'a wa::Message, id: &str) -> Option<Media<'a>> {
    if let Some(a) = m.audio_message.as_option() {
        let voice = a.ptt.unwrap_or(false);
        let mime = a.mimetype.clone().unwrap_or_else(|| "audio/ogg".into());
        let (name, what) =
            if voice { (format!("voice_{id}.ogg"), "voice note") } else { (format!("audio_{id}.ogg"), "audio") };
        let secs = a.seconds.map(|s| format!(", {s} s")).unwrap_or_default();
        return Some(Media { file: a, name, mime, what: format!("[{what}{secs}]"), size: a.file_length });
    }
    if let Some(i) = m.image_message.as_option() {
        let mime = i.mimetype.clone().unwrap_or_else(|| "image/jpeg".into());
        return Some(Media {
            file: i,
            name: format!("photo_{id}.jpg"),
            mime,
            what: "[photo]".into(),
            size: i.file_length,
        });
    }
    if let Some(v) = m.video_message.as_option() {
        let mime = v.mimetype.clone().unwrap_or_else(|| "video/mp4".into());
        return Some(Media {
            file: v,
            name: format!("video_{id}.mp4"),
            mime,
            what: "[video]".into(),
            size: v.file_length,
        });
    }
    if let Some(d) = m.document_message.as_option() {
        let name = d.file_name.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| format!("document_{id}"));
        let mime = d.mimetype.clone().unwrap_or_else(|| "application/octet-stream".into());
        return Some(Media {
            file: d,
            name: name.clone(),
            mime,
            what: format!("[document {name}]"),
            size: d.file_length,
        });
    }
    None
}

/// A message's file as an ALF-shaped attachment: downloaded and decrypted
/// inline, or skipped with why (too large, gone, tampered) — never dropped.
async fn attachment(client: &Client, m: &wa::Message, id: &str, max: u64) -> Option<Value> {
    use base64::Engine;
    let Media { file, name, mime, size, .. } = media_of(m.get_base_message(), id)?;
    let skipped = |why: String| Some(json!({"filename": name, "content_type": mime, "skipped": true, "reason": why}));
    if size.is_some_and(|s| s > max) {
        return skipped(format!("{} bytes, over the {max} byte limit", size.unwrap_or(0)));
    }
    match client.download(file).await {
        Ok(b) if b.len() as u64 > max => skipped(format!("over the {max} byte limit")),
        Ok(b) => Some(json!({"filename": name, "content_type": mime, "transfer": "inline", "size_bytes": b.len(),
            "data": base64::engine::general_purpose::STANDARD.encode(&b)})),
        Err(e) => skipped(format!("download: {e}")),
    }
}

/// Write the sealed copy of the link now (blocking). The copy is taken
/// under the agent's store lock, so the last write carries the newest link.
fn seal_now(mb: &Mailbox, backend: &SealedBackend) -> Result<(), String> {
    mb.with_store(|s| -> Result<(), String> {
        // A removed link stays removed: nothing to seal (and no failure).
        if backend.forgotten() {
            return Ok(());
        }
        let bytes = backend.snapshot()?;
        s.secret_set(SESSION, &bytes, false).map_err(|e| format!("the WhatsApp session could not be sealed ({e})"))
    })?
}

/// Start the channel: the client with the sealed link (or none yet: then
/// it asks to be paired, and the status carries the QR code).
pub fn start(mb: Arc<Mailbox>, adapter: &Value, policy: Policy, status: StatusCell) -> Result<super::Started, String> {
    let sealed = mb.with_store(|s| s.secret_get(SESSION))?.map_err(|e| e.to_string())?;
    let backend = Arc::new(SealedBackend::open(sealed.as_deref())?);
    let api = adapter.pointer("/config/api_url").and_then(Value::as_str).map(str::to_string);
    let url = api.clone().unwrap_or_else(|| DEFAULT_API.to_string());
    let (client_tx, client_rx) = tokio::sync::oneshot::channel::<Arc<Client>>();
    let conf = Conf {
        url,
        media: api.as_deref().and_then(media_origin),
        self_hosted: api.is_some(),
        policy,
        max: super::max_attachment(adapter),
        forms: Forms::default(),
    };
    let forms = conf.forms.clone();
    let keep = (mb.clone(), backend.clone());
    let run = Box::pin(run(mb, backend, conf, status, client_tx));
    let out: Arc<dyn Outbound> =
        Arc::new(Lazy(tokio::sync::OnceCell::new(), tokio::sync::Mutex::new(Some(client_rx)), forms, keep));
    Ok((out, run))
}

/// The sender, once the client is built.
struct Lazy(
    tokio::sync::OnceCell<Sender>,
    tokio::sync::Mutex<Option<tokio::sync::oneshot::Receiver<Arc<Client>>>>,
    Forms,
    /// The agent and the link, sealed when the channel stops.
    (Arc<Mailbox>, Arc<SealedBackend>),
);

impl Lazy {
    async fn get(&self) -> Result<&Sender, String> {
        self.0.get_or_try_init(|| async { Ok(Sender { client: answer(&self.1).await?, forms: self.2.clone() }) }).await
    }
}

/// What a one-shot receiver kept in a slot answers. The receiver stays in
/// its slot until it has answered: a wait given up (a send cancelled while
/// the client is being built) loses nothing for the next one.
async fn answer<T>(slot: &tokio::sync::Mutex<Option<tokio::sync::oneshot::Receiver<T>>>) -> Result<T, String> {
    let mut slot = slot.lock().await;
    let rx = slot.as_mut().ok_or("the WhatsApp client did not start")?;
    let got = rx.await;
    *slot = None;
    got.map_err(|_| "the WhatsApp client did not start".to_string())
}

impl Outbound for Lazy {
    fn send<'a>(
        &'a self,
        chat: &'a str,
        text: &'a str,
        reply_to: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move { self.get().await?.send(chat, text, reply_to).await })
    }

    fn chat_info<'a>(&'a self, chat: &'a str, limit: usize) -> BoxFuture<'a, Result<Value, String>> {
        Box::pin(async move { self.get().await?.chat_info(chat, limit).await })
    }

    fn send_message<'a>(&'a self, chat: &'a str, m: &'a Outgoing) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move { self.get().await?.send_message(chat, m).await })
    }

    /// Under the agent's store lock, which every seal holds while it
    /// writes: a seal under way has landed when this returns (the removal
    /// that follows takes it away), and any later one sees the flag.
    fn forget(&self) {
        let (mb, backend) = (&self.3.0, &self.3.1);
        if mb.with_store(|_| backend.forget()).is_err() {
            backend.forget();
        }
    }

    /// Seal the link now, while the agent's file is open (what stops the
    /// channel closes it next; the task's own guard may run after that).
    fn stopping(&self) {
        let _ = seal_now(&self.3.0, &self.3.1);
    }
}

/// Seals the link and disconnects the client when the channel's task ends
/// (its client stopped, or the task aborted; a stop seals first, through
/// `Outbound::stopping`). A link sealed late could miss the last ratchet
/// step, and the next start could not read what the sender writes next.
struct Guard {
    client: Arc<Client>,
    mb: Arc<Mailbox>,
    backend: Arc<SealedBackend>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = seal_now(&self.mb, &self.backend);
        let client = self.client.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { client.disconnect().await });
        }
    }
}

/// Where a channel connects and what it takes in.
struct Conf {
    url: String,
    media: Option<url::Url>,
    self_hosted: bool,
    policy: Policy,
    /// The largest file taken in (bytes).
    max: u64,
    forms: Forms,
}

async fn run(
    mb: Arc<Mailbox>,
    backend: Arc<SealedBackend>,
    conf: Conf,
    status: StatusCell,
    client_tx: tokio::sync::oneshot::Sender<Arc<Client>>,
) {
    let down = status.clone();
    let transport = watched(&conf.url, move |why| set_state(&down, "backing_off", Some(why)));
    let (seal_mb, seal_backend, seal_status) = (mb.clone(), Arc::downgrade(&backend), status.clone());
    backend.seal_with(Arc::new(move || {
        let Some(backend) = seal_backend.upgrade() else { return Ok(()) };
        seal_now(&seal_mb, &backend).inspect_err(|e| set_state(&seal_status, "backing_off", Some(e.clone())))
    }));
    let ctx = Arc::new(Ctx {
        backend: backend.clone(),
        mb: mb.clone(),
        policy: conf.policy,
        status: status.clone(),
        max: conf.max,
        forms: conf.forms,
        drained: Default::default(),
    });
    let mut builder = Bot::builder()
        .with_backend_arc(backend.clone())
        .with_transport_factory(transport)
        .with_http_client(Http(crate::providers::http_client(), conf.media, conf.max + 1024))
        .with_runtime(TokioRuntime)
        .with_inbound_durability_hook(Durable(ctx.clone()))
        .on_event(move |ev, client| on_event(ctx.clone(), ev, client));
    if conf.self_hosted {
        builder = builder.with_version(PINNED_VERSION);
    }
    let bot = match builder.build().await {
        Ok(b) => b,
        Err(e) => {
            set_state(&status, "stopped", Some(format!("the WhatsApp client did not start: {e}")));
            return;
        }
    };
    let client = bot.client();
    let _ = client_tx.send(client.clone());
    let _guard = Guard { client, mb: mb.clone(), backend: backend.clone() };
    let handle = bot.spawn();
    let sealer = async {
        loop {
            backend.changed.notified().await;
            // What may be sealed later: after a burst, one write, unless
            // a seal since has covered it (the sealer reports a failure).
            tokio::time::sleep(Duration::from_millis(300)).await;
            let _ = backend.persist().await;
        }
    };
    tokio::select! {
        _ = handle => {},
        _ = sealer => {},
    }
    // The guard seals the link as this returns (what was left for later).
    if let Ok(s) = status.lock()
        && s.state != "stopped"
    {
        drop(s);
        set_state(&status, "stopped", Some("the WhatsApp client stopped".into()));
    }
}

fn clear_qr(status: &StatusCell) {
    if let Ok(mut s) = status.lock() {
        s.qr = None;
    }
}

/// What the channel's event handler works with.
struct Ctx {
    backend: Arc<SealedBackend>,
    mb: Arc<Mailbox>,
    policy: Policy,
    status: StatusCell,
    /// The largest file taken in (bytes).
    max: u64,
    forms: Forms,
    /// The offline queue's rows held for one wake (see `Drain`).
    drained: Arc<Mutex<Drain>>,
}

/// How long the agent's wake for the offline queue waits for its last
/// rows: the client runs its handlers on tasks of their own, so the end
/// of the queue can be seen before the last messages are in (under load,
/// by tens of milliseconds), and each would otherwise wake the agent alone.
const DRAIN_GRACE: Duration = Duration::from_millis(250);

/// Rows of the offline queue delivered so far; whether the client said
/// the queue is drained; whether a wake for them is on its way.
#[derive(Default)]
struct Drain {
    rows: Vec<serde_json::Map<String, Value>>,
    done: bool,
    waking: bool,
}

impl Ctx {
    /// Rows of the offline queue: held until it is drained, then one wake
    /// (rows late for it join the next one, `DRAIN_GRACE` later).
    fn drained_rows(&self, mut rows: Vec<serde_json::Map<String, Value>>) {
        if rows.is_empty() {
            return;
        }
        let wake = match self.drained.lock() {
            Ok(mut d) => {
                d.rows.append(&mut rows);
                d.done && !std::mem::replace(&mut d.waking, true)
            }
            Err(_) => return notify(&self.mb, rows),
        };
        if wake {
            self.wake_later();
        }
    }

    /// The offline queue is drained (`true`): the agent is told of what it
    /// held once the last rows are in. A connection ended (`false`: the
    /// next one drains again): told at once, so nothing waits on a drain
    /// that will not end.
    fn drain_done(&self, done: bool) {
        let (rows, wake) = match self.drained.lock() {
            Ok(mut d) => {
                d.done = done;
                if done {
                    (Vec::new(), !std::mem::replace(&mut d.waking, true))
                } else {
                    (std::mem::take(&mut d.rows), false)
                }
            }
            Err(_) => return,
        };
        notify(&self.mb, rows);
        if wake {
            self.wake_later();
        }
    }

    /// One wake for the rows held, `DRAIN_GRACE` from now.
    fn wake_later(&self) {
        let (drain, mb) = (self.drained.clone(), self.mb.clone());
        tokio::spawn(async move {
            tokio::time::sleep(DRAIN_GRACE).await;
            let rows = match drain.lock() {
                Ok(mut d) => {
                    d.waking = false;
                    std::mem::take(&mut d.rows)
                }
                Err(_) => return,
            };
            notify(&mb, rows);
        });
    }
}

async fn on_event(ctx: Arc<Ctx>, ev: Arc<Event>, client: Arc<Client>) {
    let (mb, status) = (&ctx.mb, &ctx.status);
    match &*ev {
        Event::PairingQrCode(q) => {
            set_state(status, "pairing", None);
            if let Ok(mut s) = status.lock() {
                s.qr = Some(q.code.clone());
            }
        }
        Event::PairSuccess(p) => {
            if let Ok(mut s) = status.lock() {
                s.qr = None;
                s.account = Some(format!("+{}", p.id.user));
            }
            super::log(mb, "info", "whatsapp_linked", format!("linked to +{}", p.id.user)).await;
        }
        Event::Connected(_) => {
            set_state(status, "connected", None);
            if let Ok(mut s) = status.lock() {
                s.qr = None;
                s.account = client.pn().map(|j| format!("+{}", j.user));
            }
        }
        Event::Disconnected(d) => {
            // Never left waiting for a drain a lost connection ended.
            ctx.drain_done(false);
            set_state(status, "connecting", Some(format!("disconnected: {:?}; reconnecting", d.reason)));
        }
        Event::LoggedOut(_) => {
            // The link is dead: forgotten, so linking again starts afresh.
            // The status says why before the secret's removal is awaited:
            // the client ends as it logs out, and the channel's own
            // "client stopped" must not be what is left to read.
            ctx.backend.forget();
            clear_qr(status);
            set_state(
                status,
                "stopped",
                Some("the phone unlinked this device: adf adapters add FILE whatsapp to link it again".into()),
            );
            let m = mb.clone();
            let _ = tokio::task::spawn_blocking(move || m.with_store(|s| s.secret_rm(SESSION))).await;
        }
        Event::PairingQrCodesExhausted(_) => {
            clear_qr(status);
            set_state(
                status,
                "stopped",
                Some("no one scanned the QR code in time: adf adapters add FILE whatsapp to try again".into()),
            );
        }
        Event::UndecryptableMessage(u) => {
            // Not silently dropped: the client asks the sender to send it
            // again (a retry receipt); the log says what could not be read.
            let note = format!(
                "whatsapp:{}: message {} from {} could not be decrypted; the sender was asked to send it again",
                chat_id(&u.info.source.chat),
                u.info.id,
                u.info.source.sender.user
            );
            super::log(mb, "warn", "message_undecryptable", note).await;
        }
        Event::OfflineSyncCompleted(_) => ctx.drain_done(true),
        // What the hook committed is in the inbox already; only what it
        // never sees (recovered placeholders) is taken in here.
        Event::Messages(batch) if !batch.hook_committed => {
            let _ = commit(&ctx, &client, &batch.messages).await;
        }
        _ => {}
    }
}

/// The client's inbound durability hook: a batch of decrypted messages
/// goes into the agent's inbox before the server is told it arrived. An
/// error leaves the batch unacknowledged, to be delivered again (and the
/// inbox refuses what it already has, by id).
struct Durable(Arc<Ctx>);

#[async_trait::async_trait]
impl whatsapp_rust::InboundDurabilityHook for Durable {
    async fn on_messages(&self, client: Arc<Client>, batch: &[InboundMessage]) -> anyhow::Result<()> {
        commit(&self.0, &client, batch).await.map_err(anyhow::Error::msg)
    }
}

/// Messages into the agent's inbox (policy, files, forms), then the
/// agent told: at once, or once the offline queue is drained. The first
/// message that could not be written ends it with why (logged).
async fn commit(ctx: &Ctx, client: &Client, batch: &[InboundMessage]) -> Result<(), String> {
    let (mb, policy, status) = (&ctx.mb, &ctx.policy, &ctx.status);
    let own: Vec<Jid> = client.pn().into_iter().chain(client.lid()).collect();
    let (mut live, mut queued) = (Vec::new(), Vec::new());
    for m in batch {
        let Some(mut inb) = inbound(&m.message, &m.info, &own) else { continue };
        // Files of messages the policy refuses are never fetched.
        if policy.admit(&inb).is_ok()
            && let Some(a) = attachment(client, &m.message, &inb.message_id, ctx.max).await
        {
            inb.attachments.push(a);
        }
        // A reply quoting a form: its answers, checked, or why not.
        if let Some(form) = inb.reply_to_message_id.as_deref().and_then(|r| form_for(&ctx.forms, &inb.chat_id, r)) {
            super::forms::apply_reply(&form, &mut inb);
        }
        let id = inb.message_id.clone();
        match deliver_one(mb, policy, status, inb).await {
            Ok(mut r) if m.info.is_offline => queued.append(&mut r),
            Ok(mut r) => live.append(&mut r),
            Err(e) => {
                let why = format!("whatsapp: message {id} not written ({e}); the server will deliver it again");
                super::log(mb, "error", "message_not_delivered", why.clone()).await;
                ctx.drained_rows(queued);
                notify(mb, live);
                return Err(why);
            }
        }
    }
    ctx.drained_rows(queued);
    notify(mb, live);
    Ok(())
}

/// What to do with the code, wherever it is drawn.
pub const SCAN: &str = "Scan this with your phone: WhatsApp → Settings → Linked devices → Link a device.";

/// A QR code drawn in text, two rows a line (half blocks), with a quiet
/// zone of two modules: what a phone's camera reads from a terminal. Low
/// error correction (a screen is not a torn label) keeps a real pairing
/// code (about 240 characters) at 61 columns by 31 rows.
pub fn qr_text(code: &str) -> Result<String, String> {
    use qrcode::render::unicode::Dense1x2;
    let qr = qrcode::QrCode::with_error_correction_level(code.as_bytes(), qrcode::EcLevel::L)
        .map_err(|e| format!("no QR code for this pairing: {e}"))?;
    // Drawn with the standard four-module zone, then cut to two: the first
    // line (two rows) and two columns a side. A code has an odd number of
    // rows, so its last line is half zone; one more line closes the zone.
    let full = qr.render::<Dense1x2>().dark_color(Dense1x2::Light).light_color(Dense1x2::Dark).quiet_zone(true).build();
    let n = qr.width();
    let lines: Vec<String> =
        full.lines().skip(1).take(n.div_ceil(2) + 2).map(|l| l.chars().skip(2).take(n + 4).collect()).collect();
    Ok(lines.join("\n"))
}

/// Link a device here and now (`adf adapters add FILE whatsapp` on a file
/// no process holds): each QR code goes to `show` as it comes, until the
/// phone scans one and the device has logged in; the link to seal and the
/// account are returned.
pub async fn pair(
    api_url: Option<&str>,
    show: impl Fn(&str) + Send + Sync + 'static,
    deadline: Duration,
) -> Result<(Vec<u8>, String), String> {
    let backend = Arc::new(SealedBackend::open(None)?);
    let url = api_url.unwrap_or(DEFAULT_API).to_string();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Result<String, String>>();
    // A server that cannot be reached ends the pairing at once, with why.
    let down = tx.clone();
    let transport = watched(&url, move |why| {
        let _ = down.send(Err(format!("{why} (nothing changed)")));
    });
    let show = Arc::new(show);
    let mut builder = Bot::builder()
        .with_backend_arc(backend.clone())
        .with_transport_factory(transport)
        .with_http_client(Http(crate::providers::http_client(), None, 16 * 1024 * 1024))
        .with_runtime(TokioRuntime)
        .on_event(move |ev, client| {
            let (tx, show) = (tx.clone(), show.clone());
            async move {
                match &*ev {
                    Event::PairingQrCode(q) => show(&q.code),
                    Event::Connected(_) => {
                        let _ = tx.send(Ok(client.pn().map(|j| format!("+{}", j.user)).unwrap_or_default()));
                    }
                    Event::PairError(e) => {
                        let _ = tx.send(Err(format!("the pairing was refused ({}; nothing changed)", e.error)));
                    }
                    Event::PairingQrCodesExhausted(_) => {
                        let _ = tx.send(Err("no one scanned the QR code in time (nothing changed)".into()));
                    }
                    Event::LoggedOut(_) => {
                        let _ = tx.send(Err("WhatsApp refused the login (nothing changed)".into()));
                    }
                    _ => {}
                }
            }
        });
    if api_url.is_some() {
        builder = builder.with_version(PINNED_VERSION);
    }
    let bot = builder.build().await.map_err(|e| format!("the WhatsApp client did not start: {e}"))?;
    let handle = bot.spawn();
    let said = tokio::time::timeout(deadline, rx.recv()).await;
    let account = match said {
        Ok(Some(Ok(account))) => account,
        Ok(Some(Err(e))) => {
            handle.shutdown().await;
            return Err(e);
        }
        Ok(None) => {
            handle.shutdown().await;
            return Err("the WhatsApp client stopped before it was linked (nothing changed)".into());
        }
        Err(_) => {
            handle.shutdown().await;
            return Err(format!("not linked within {} s (nothing changed)", deadline.as_secs()));
        }
    };
    handle.shutdown().await;
    Ok((backend.snapshot()?, account))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_addresses_are_phone_numbers_and_group_jids() {
        let p = jid_of("15551234567").unwrap();
        assert_eq!(p.to_string(), "15551234567@s.whatsapp.net");
        assert_eq!(chat_id(&p), "15551234567");
        let g = jid_of("120363000000000001@g.us").unwrap();
        assert_eq!(chat_id(&g), "120363000000000001@g.us");
    }

    #[tokio::test]
    async fn a_wait_given_up_keeps_the_answer_for_the_next() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let slot = tokio::sync::Mutex::new(Some(rx));
        let gave_up = tokio::time::timeout(Duration::from_millis(20), answer(&slot)).await;
        assert!(gave_up.is_err(), "nothing yet");
        tx.send(7).unwrap();
        assert_eq!(answer(&slot).await, Ok(7));
        assert!(answer(&slot).await.unwrap_err().contains("did not start"), "answered once");
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        drop(tx);
        assert!(answer(&tokio::sync::Mutex::new(Some(rx))).await.is_err(), "a client that never came");
    }

    /// The code as drawn, read back by a QR decoder from the picture the
    /// terminal shows (light and dark cells, each half a module high).
    fn scan(drawn: &str) -> String {
        let rows: Vec<Vec<char>> = drawn.lines().map(|l| l.chars().collect()).collect();
        let w = rows[0].len();
        assert!(rows.iter().all(|r| r.len() == w), "every row as wide");
        // Each cell: (upper, lower) light? Light modules are drawn filled.
        let light = |c: char| match c {
            '█' => (true, true),
            '▀' => (true, false),
            '▄' => (false, true),
            ' ' => (false, false),
            other => panic!("{other:?} is not a half block"),
        };
        // A white margin around it, as a screen behind the terminal's.
        let (scale, pad) = (4, 16);
        let (iw, ih) = (w * scale + 2 * pad, rows.len() * 2 * scale + 2 * pad);
        let mut img = rqrr::PreparedImage::prepare_from_greyscale(iw, ih, |x, y| {
            if x < pad || y < pad || x >= iw - pad || y >= ih - pad {
                return 255;
            }
            let (cx, my) = ((x - pad) / scale, (y - pad) / scale);
            let (up, down) = light(rows[my / 2][cx]);
            let lit = if my % 2 == 0 { up } else { down };
            if lit { 255 } else { 0 }
        });
        let grids = img.detect_grids();
        assert_eq!(grids.len(), 1, "one code found");
        grids[0].decode().expect("the code reads").1
    }

    #[test]
    fn a_pairing_code_of_real_length_reads_back_and_fits_61_by_31() {
        let key = "q83vEjRWeJq8FBqFJBAGsLe6pRsZ5i3HGuQmy8sxW0k=";
        let code = format!("2@{},{key},{key},{key}", "Gk7s2Yx9Qz".repeat(12));
        let drawn = qr_text(&code).unwrap();
        assert_eq!(scan(&drawn), code);
        let (cols, rows) = (drawn.lines().next().unwrap().chars().count(), drawn.lines().count());
        assert!(cols <= 61 && rows <= 31, "{cols}x{rows}");
        // A short one too (an odd number of modules, its last row half light).
        assert_eq!(scan(&qr_text("2@short,a,b,c").unwrap()), "2@short,a,b,c");
    }
}
