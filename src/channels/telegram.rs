//! Telegram (issue 20) through the Bot API: long polling with
//! `getUpdates` (no public URL needed), `sendMessage` for replies. The bot
//! token is the agent's sealed credential `adapter:telegram:BOT_TOKEN`;
//! `adapters.telegram.config.api_url` points at a self-hosted Bot API
//! server (or a test double) instead of api.telegram.org.
//!
//! Catch-up is the platform's: updates wait on Telegram's side until a
//! later `getUpdates` confirms them (its `offset`), so what arrived while
//! the agent was off comes in the first poll, as one batch, and the agent
//! wakes once for it. A batch redelivered after a crash is de-duplicated
//! by its chat and message id. A failing poll backs off (1 s doubling to
//! 60 s, or what a 429's `retry_after` says) and the channel's status says
//! why; nothing received is lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::{Inbound, Outbound, Outgoing, Policy, StatusCell, fail, notify, set_state, without_url};
use crate::runtime::mesh::Mailbox;

const DEFAULT_API: &str = "https://api.telegram.org";
/// The credential holding the bot token.
pub const TOKEN: &str = "adapter:telegram:BOT_TOKEN";

/// A Telegram API failure: its description, and how long to wait when the
/// server said (429).
#[derive(Debug)]
struct ApiError {
    message: String,
    retry_after: Option<u64>,
}

struct Bot {
    http: reqwest::Client,
    /// `<api>/bot<token>` and `<api>/file/bot<token>`: never logged (the
    /// token is in them).
    base: String,
    files: String,
    api: String,
    /// The largest file taken in (bytes).
    max_file: u64,
    /// Forms sent, by id (answers are checked against them), and the
    /// messages asking a form's free-text question: (chat, message) →
    /// (form, question).
    forms: std::sync::Mutex<HashMap<String, Value>>,
    asks: std::sync::Mutex<HashMap<(String, String), (String, String)>>,
    /// Polls a form went out as: poll id → (chat, form, question).
    polls: std::sync::Mutex<HashMap<String, (String, String, String)>>,
}

/// Callback data of a form button: `f|<form>|<question>|<option>`.
fn button(form: &str, q: &str, opt: &str) -> String {
    format!("f|{form}|{q}|{opt}")
}

impl Bot {
    /// A form answer (`f|…` button, or a reply to a free-text question)
    /// checked against the form sent: the `source_context` fields and the
    /// text the agent reads, or `None` when it answers no form of ours.
    fn form_answer(
        &self,
        form_id: &str,
        q_id: &str,
        answer_id: &str,
        text: Option<&str>,
    ) -> Option<(Map<String, Value>, String)> {
        let form = self.forms.lock().ok()?.get(form_id)?.clone();
        super::forms::control_answer(&form, q_id, answer_id, text)
    }
}

/// The file of a message, if it has one: (file id, name, MIME type, size).
fn file_of(msg: &Value) -> Option<(String, String, String, Option<u64>)> {
    let id = msg["message_id"].to_string();
    let pick = |v: &Value, name: String, mime: &str| {
        Some((
            v["file_id"].as_str()?.to_string(),
            v["file_name"].as_str().map(str::to_string).unwrap_or(name),
            v["mime_type"].as_str().unwrap_or(mime).to_string(),
            v["file_size"].as_u64(),
        ))
    };
    if let Some(sizes) = msg["photo"].as_array() {
        // The largest of the sizes Telegram offers.
        return pick(sizes.last()?, format!("photo_{id}.jpg"), "image/jpeg");
    }
    for (k, name, mime) in [
        ("document", format!("document_{id}"), "application/octet-stream"),
        ("voice", format!("voice_{id}.ogg"), "audio/ogg"),
        ("audio", format!("audio_{id}.mp3"), "audio/mpeg"),
        ("video", format!("video_{id}.mp4"), "video/mp4"),
    ] {
        if msg.get(k).is_some() {
            return pick(&msg[k], name, mime);
        }
    }
    None
}

impl Bot {
    /// Fetch a message's file as an ALF-shaped attachment: inline data, or
    /// skipped with the reason (too large, gone) — never silently dropped.
    async fn attachment(&self, msg: &Value) -> Option<Value> {
        use base64::Engine;
        let (file_id, name, mime, size) = file_of(msg)?;
        let skipped =
            |why: String| Some(json!({"filename": name, "content_type": mime, "skipped": true, "reason": why}));
        if size.is_some_and(|s| s > self.max_file) {
            return skipped(format!("{} bytes, over the {} byte limit", size.unwrap_or(0), self.max_file));
        }
        let file = match self.call("getFile", &json!({"file_id": file_id}), Duration::from_secs(30)).await {
            Ok(f) => f,
            Err(e) => return skipped(e.message),
        };
        let Some(path) = file["file_path"].as_str() else { return skipped("getFile gave no file_path".into()) };
        let resp = match self.http.get(format!("{}/{path}", self.files)).timeout(Duration::from_secs(120)).send().await
        {
            Ok(r) if r.status().is_success() => r,
            Ok(r) => return skipped(format!("download: HTTP {}", r.status())),
            Err(e) => return skipped(format!("download: {}", without_url(&e))),
        };
        if resp.content_length().is_some_and(|l| l > self.max_file) {
            return skipped(format!("over the {} byte limit", self.max_file));
        }
        let bytes = match resp.bytes().await {
            Ok(b) if b.len() as u64 <= self.max_file => b,
            Ok(_) => return skipped(format!("over the {} byte limit", self.max_file)),
            Err(e) => return skipped(format!("download: {}", without_url(&e))),
        };
        Some(json!({"filename": name, "content_type": mime, "transfer": "inline",
            "size_bytes": bytes.len(), "data": base64::engine::general_purpose::STANDARD.encode(&bytes)}))
    }
}

impl Bot {
    /// A multipart call (a file upload).
    async fn upload(&self, method: &str, form: reqwest::multipart::Form) -> Result<Value, ApiError> {
        let resp = self
            .http
            .post(format!("{}/{method}", self.base))
            .multipart(form)
            .timeout(Duration::from_secs(300))
            .send()
            .await
            .map_err(|e| ApiError {
                message: format!("{} unreachable: {}", self.api, without_url(&e)),
                retry_after: None,
            })?;
        Self::answer(method, resp).await
    }

    async fn call(&self, method: &str, body: &Value, timeout: Duration) -> Result<Value, ApiError> {
        let resp = self.http.post(format!("{}/{method}", self.base)).json(body).timeout(timeout).send().await.map_err(
            |e| ApiError { message: format!("{} unreachable: {}", self.api, without_url(&e)), retry_after: None },
        )?;
        Self::answer(method, resp).await
    }

    /// A Bot API answer: its result, or its error.
    async fn answer(method: &str, resp: reqwest::Response) -> Result<Value, ApiError> {
        let status = resp.status();
        let v: Value = resp.json().await.map_err(|_| ApiError {
            message: format!("{method}: HTTP {status}, not a Bot API answer"),
            retry_after: None,
        })?;
        if v["ok"].as_bool() == Some(true) {
            return Ok(v["result"].clone());
        }
        Err(ApiError {
            message: format!(
                "{method}: {} ({})",
                v["description"].as_str().unwrap_or("refused"),
                v["error_code"].as_i64().unwrap_or(status.as_u16() as i64)
            ),
            retry_after: v.pointer("/parameters/retry_after").and_then(Value::as_u64),
        })
    }
}

struct Sender {
    bot: Arc<Bot>,
}

impl Sender {
    /// One message: Markdown sent as HTML, or as it is when Telegram cannot
    /// read the HTML; a 429 says when to try again (three tries at most).
    async fn message(&self, chat: &str, md: &str, reply_to: Option<&str>) -> Result<String, String> {
        let mut body = json!({"chat_id": chat, "text": super::markup::telegram_html(md), "parse_mode": "HTML"});
        if let Some(r) = reply_to.and_then(|r| r.parse::<i64>().ok()) {
            body["reply_parameters"] = json!({"message_id": r, "allow_sending_without_reply": true});
        }
        for attempt in 0..3 {
            match self.bot.call("sendMessage", &body, Duration::from_secs(30)).await {
                Ok(m) => return Ok(m["message_id"].to_string()),
                Err(ApiError { retry_after: Some(s), .. }) if attempt < 2 && s <= 60 => {
                    tokio::time::sleep(Duration::from_secs(s)).await;
                }
                Err(e) if e.message.contains("can't parse entities") && body.get("parse_mode").is_some() => {
                    if let Some(o) = body.as_object_mut() {
                        o.remove("parse_mode");
                        o.insert("text".into(), json!(md));
                    }
                }
                Err(e) => return Err(e.message),
            }
        }
        Err("sendMessage: rate-limited three times".into())
    }
}

impl Outbound for Sender {
    fn send<'a>(
        &'a self,
        chat: &'a str,
        text: &'a str,
        reply_to: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            // Markdown as Telegram's HTML, in pieces under its 4,096
            // characters; the first one threaded.
            let mut first = None;
            for (i, piece) in super::markup::pieces(text, 3500).iter().enumerate() {
                let reply = reply_to.filter(|_| i == 0);
                first.get_or_insert(self.message(chat, piece, reply).await?);
            }
            first.ok_or_else(|| "nothing to send".to_string())
        })
    }

    fn send_form<'a>(
        &'a self,
        chat: &'a str,
        form: &'a Value,
        reply_to: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let id = form["id"].as_str().unwrap_or("form").to_string();
            if let Ok(mut f) = self.bot.forms.lock() {
                f.insert(id.clone(), form.clone());
            }
            let mut first = None;
            let qs = form["questions"].as_array().cloned().unwrap_or_default();
            for (i, q) in qs.iter().enumerate() {
                let qid = q["id"].as_str().unwrap_or("");
                let mut text = q["text"].as_str().unwrap_or("").to_string();
                if i == 0
                    && let Some(t) = form["title"].as_str()
                {
                    text = format!("{t}\n\n{text}");
                }
                let options = q["options"].as_array().cloned().unwrap_or_default();
                // `render: poll`: a native poll (Telegram takes 2 to 10
                // options); anything else is buttons.
                if form["render"] == "poll" && q["type"] != "text" && (2..=10).contains(&options.len()) {
                    let body = json!({"chat_id": chat, "question": text.chars().take(300).collect::<String>(),
                        "options": options.iter().map(|o| json!({"text": o["label"]})).collect::<Vec<_>>(),
                        "is_anonymous": false, "allows_multiple_answers": q["type"] == "multi"});
                    let m = self.bot.call("sendPoll", &body, Duration::from_secs(30)).await.map_err(|e| e.message)?;
                    if let (Some(pid), Ok(mut p)) =
                        (m.pointer("/poll/id").and_then(Value::as_str), self.bot.polls.lock())
                    {
                        p.insert(pid.to_string(), (chat.to_string(), id.clone(), qid.to_string()));
                    }
                    first.get_or_insert(m["message_id"].to_string());
                    continue;
                }
                let markup = if q["type"] == "text" {
                    text.push_str("\n(reply to this message)");
                    json!({"force_reply": true, "selective": true})
                } else {
                    let mut rows: Vec<Value> = q["options"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|o| {
                            json!([{"text": o["label"], "callback_data": button(&id, qid, o["id"].as_str().unwrap_or(""))}])
                        })
                        .collect();
                    if q["type"] == "multi" {
                        rows.push(json!([{"text": "Done", "callback_data": button(&id, qid, "__done")}]));
                    }
                    json!({"inline_keyboard": rows})
                };
                let mut body = json!({"chat_id": chat, "text": text, "reply_markup": markup});
                if let Some(r) = reply_to.filter(|_| i == 0).and_then(|r| r.parse::<i64>().ok()) {
                    body["reply_parameters"] = json!({"message_id": r, "allow_sending_without_reply": true});
                }
                let m = self.bot.call("sendMessage", &body, Duration::from_secs(30)).await.map_err(|e| e.message)?;
                let mid = m["message_id"].to_string();
                if q["type"] == "text"
                    && let Ok(mut a) = self.bot.asks.lock()
                {
                    a.insert((chat.to_string(), mid.clone()), (id.clone(), qid.to_string()));
                }
                first.get_or_insert(mid);
            }
            first.ok_or_else(|| "a form without questions".to_string())
        })
    }

    /// Files go as photos (images up to 10 MB) or documents, the text as
    /// the first one's caption when it fits (1,024 characters), else as a
    /// message before them; the first is threaded under the reply.
    fn send_message<'a>(&'a self, chat: &'a str, m: &'a Outgoing) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            if m.files.is_empty() {
                if m.content_type == super::FORM_TYPE {
                    let v: Value =
                        serde_json::from_str(&m.text).map_err(|e| format!("form content is not JSON: {e}"))?;
                    return self.send_form(chat, &v, m.reply_to.as_deref()).await;
                }
                return self.send(chat, &m.text, m.reply_to.as_deref()).await;
            }
            let mut caption = Some(m.text.as_str()).filter(|t| !t.trim().is_empty());
            let mut reply_to = m.reply_to.as_deref();
            let mut first = None;
            if caption.is_some_and(|c| c.chars().count() > 1024) {
                first = Some(self.send(chat, &m.text, reply_to).await?);
                caption = None;
                reply_to = None;
            }
            for f in &m.files {
                let photo = f.mime.starts_with("image/") && f.mime != "image/svg+xml" && f.data.len() <= 10 << 20;
                let (method, field) = if photo { ("sendPhoto", "photo") } else { ("sendDocument", "document") };
                let part = super::part(f)?;
                let mut form = reqwest::multipart::Form::new().text("chat_id", chat.to_string()).part(field, part);
                if let Some(c) = caption.take() {
                    form = form.text("caption", c.to_string());
                }
                if let Some(r) = reply_to.take().and_then(|r| r.parse::<i64>().ok()) {
                    form = form.text(
                        "reply_parameters",
                        json!({"message_id": r, "allow_sending_without_reply": true}).to_string(),
                    );
                }
                let sent = self.bot.upload(method, form).await.map_err(|e| e.message)?;
                first.get_or_insert(sent["message_id"].to_string());
            }
            first.ok_or_else(|| "nothing to send".to_string())
        })
    }

    fn chat_info<'a>(&'a self, chat: &'a str, limit: usize) -> BoxFuture<'a, Result<Value, String>> {
        Box::pin(async move {
            let t = Duration::from_secs(30);
            let c = self.bot.call("getChat", &json!({"chat_id": chat}), t).await.map_err(|e| e.message)?;
            let count = self.bot.call("getChatMemberCount", &json!({"chat_id": chat}), t).await.ok();
            // Bots see the administrators of a group, not every member.
            let admins = if c["type"] != "private" {
                self.bot.call("getChatAdministrators", &json!({"chat_id": chat}), t).await.ok()
            } else {
                None
            };
            let roster: Vec<Value> = admins
                .as_ref()
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .take(limit)
                .map(|m| {
                    json!({"id": m["user"]["id"], "username": m["user"]["username"],
                    "name": m["user"]["first_name"], "role": m["status"]})
                })
                .collect();
            let truncated = admins.as_ref().and_then(Value::as_array).is_some_and(|a| a.len() > roster.len());
            Ok(json!({
                "supported": true, "adapter": "telegram", "chat_id": chat, "type": c["type"],
                "title": c["title"].as_str().or(c["username"].as_str()).or(c["first_name"].as_str()),
                "description": c["description"], "participant_count": count,
                "participants": roster, "participants_scope": "administrators",
                "participants_truncated": truncated,
            }))
        })
    }
}

/// The UTF-16 range `[offset, offset + length)` of `text` (how Telegram
/// counts entity offsets).
fn utf16_slice(text: &str, offset: usize, length: usize) -> Option<String> {
    let units: Vec<u16> = text.encode_utf16().collect();
    units.get(offset..offset.checked_add(length)?).map(String::from_utf16_lossy)
}

/// Does this message mention the bot (an @mention entity naming it, or a
/// reply to one of its messages)?
fn mentions(msg: &Value, bot: &str) -> bool {
    let bot = bot.trim_start_matches('@').to_lowercase();
    if bot.is_empty() {
        return false;
    }
    let text = msg["text"].as_str().or(msg["caption"].as_str()).unwrap_or("");
    let entities = msg["entities"].as_array().or(msg["caption_entities"].as_array());
    let named = entities.into_iter().flatten().any(|e| {
        e["type"] == "mention"
            && e["offset"]
                .as_u64()
                .zip(e["length"].as_u64())
                .and_then(|(o, l)| utf16_slice(text, o as usize, l as usize))
                .is_some_and(|m| m.trim_start_matches('@').to_lowercase() == bot)
    });
    named
        || msg
            .pointer("/reply_to_message/from/username")
            .and_then(Value::as_str)
            .is_some_and(|u| u.to_lowercase() == bot)
}

/// An update's message in the framework's terms (`None`: not a message).
fn inbound(update: &Value, bot: &str) -> Option<Inbound> {
    let msg = update.get("message").or(update.get("edited_message"))?;
    let chat = &msg["chat"];
    let chat_type = chat["type"].as_str().unwrap_or("private").to_string();
    let text = msg["text"].as_str().or(msg["caption"].as_str()).map(str::to_string).unwrap_or_else(|| {
        let kind = ["photo", "document", "voice", "audio", "video", "sticker", "location", "contact"]
            .into_iter()
            .find(|k| msg.get(*k).is_some())
            .unwrap_or("message");
        format!("[{kind}]")
    });
    Some(Inbound {
        kind: "telegram",
        chat_id: chat["id"].to_string(),
        group: chat_type != "private",
        mentioned: mentions(msg, bot),
        chat_type,
        message_id: msg["message_id"].to_string(),
        sender_id: msg["from"]["id"].to_string(),
        sender_name: msg["from"]["username"].as_str().unwrap_or("").to_string(),
        text,
        reply_to_message_id: msg.pointer("/reply_to_message/message_id").map(Value::to_string),
        sent_at_ms: msg["date"].as_i64().map(|d| d * 1000),
        raw: msg.clone(),
        context: Map::new(),
        attachments: Vec::new(),
        extra: Map::new(),
    })
}

/// A vote in a form's poll: the answer as an inbound message, or `None`
/// (a poll this bot did not send, or a vote taken back).
fn poll_answer(update: &Value, bot: &Bot) -> Option<Inbound> {
    let pa = update.get("poll_answer")?;
    let (chat, form, q) = bot.polls.lock().ok()?.get(pa["poll_id"].as_str()?)?.clone();
    let picked: Vec<usize> =
        pa["option_ids"].as_array()?.iter().filter_map(|i| i.as_u64().map(|i| i as usize)).collect();
    if picked.is_empty() {
        return None;
    }
    let ids: Vec<String> = {
        let forms = bot.forms.lock().ok()?;
        let opts = forms.get(&form)?["questions"].as_array()?.iter().find(|x| x["id"] == q.as_str())?["options"]
            .as_array()?
            .clone();
        picked.iter().filter_map(|i| opts.get(*i)?["id"].as_str().map(str::to_string)).collect()
    };
    let mut context = Map::new();
    let mut shown = Vec::new();
    for id in &ids {
        let (ctx, text) = bot.form_answer(&form, &q, id, None)?;
        context = ctx;
        shown.push(text);
    }
    if ids.len() > 1 {
        context.insert("answer_id".into(), ids.join(",").into());
        let values: Vec<String> = shown.iter().filter_map(|t| t.rsplit(": ").next().map(str::to_string)).collect();
        context.insert("answer_value".into(), values.join(", ").into());
    }
    let voter = &pa["user"];
    Some(Inbound {
        kind: "telegram",
        chat_id: chat,
        chat_type: "poll".into(),
        group: false,
        mentioned: false,
        message_id: format!("poll{}-{}-{}", pa["poll_id"].as_str().unwrap_or(""), voter["id"], ids.join(",")),
        sender_id: voter["id"].to_string(),
        sender_name: voter["username"].as_str().unwrap_or("").to_string(),
        text: shown.join("; "),
        reply_to_message_id: None,
        sent_at_ms: Some(crate::store::now_ms()),
        raw: pa.clone(),
        context,
        attachments: Vec::new(),
        extra: Map::new(),
    })
}

/// A button press on a form: the answer as an inbound message, or `None`
/// (not a form button, or a form this bot did not send).
fn callback(update: &Value, bot: &Bot) -> Option<Inbound> {
    let cb = update.get("callback_query")?;
    let data = cb["data"].as_str()?;
    let mut parts = data.splitn(4, '|');
    let (Some("f"), Some(form), Some(q), Some(opt)) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return None;
    };
    let (context, text) = bot.form_answer(form, q, opt, None)?;
    let msg = &cb["message"];
    let chat_type = msg["chat"]["type"].as_str().unwrap_or("private").to_string();
    Some(Inbound {
        kind: "telegram",
        chat_id: msg["chat"]["id"].to_string(),
        group: chat_type != "private",
        mentioned: false,
        chat_type,
        // One answer per press: the press's id keeps redelivery out.
        message_id: format!("cb{}", cb["id"].as_str().unwrap_or("")),
        sender_id: cb["from"]["id"].to_string(),
        sender_name: cb["from"]["username"].as_str().unwrap_or("").to_string(),
        text,
        reply_to_message_id: Some(msg["message_id"].to_string()),
        sent_at_ms: Some(crate::store::now_ms()),
        raw: cb.clone(),
        context,
        attachments: Vec::new(),
        extra: Map::new(),
    })
}

/// Start the channel: the sender, and the polling task.
pub fn start(mb: Arc<Mailbox>, adapter: &Value, policy: Policy, status: StatusCell) -> Result<super::Started, String> {
    let token = super::required_secret(&mb, TOKEN, "bot token", "telegram")?;
    let api = adapter.pointer("/config/api_url").and_then(Value::as_str).unwrap_or(DEFAULT_API).trim_end_matches('/');
    let poll = adapter.pointer("/config/poll_timeout_s").and_then(Value::as_u64).unwrap_or(25).min(50);
    let max_file = super::max_attachment(adapter);
    let bot = Arc::new(Bot {
        http: crate::providers::http_client(),
        base: format!("{api}/bot{token}"),
        files: format!("{api}/file/bot{token}"),
        api: api.to_string(),
        max_file,
        forms: Default::default(),
        asks: Default::default(),
        polls: Default::default(),
    });
    let sender: Arc<dyn Outbound> = Arc::new(Sender { bot: bot.clone() });
    Ok((sender, Box::pin(run(bot, mb, policy, status, poll))))
}

async fn run(bot: Arc<Bot>, mb: Arc<Mailbox>, policy: Policy, status: StatusCell, poll: u64) {
    let mut backoff = Duration::from_secs(1);
    let mut name = String::new();
    let mut offset: Option<i64> = None;
    loop {
        if name.is_empty() {
            match bot.call("getMe", &json!({}), Duration::from_secs(30)).await {
                Ok(me) => {
                    name = me["username"].as_str().unwrap_or("").to_string();
                    if let Ok(mut s) = status.lock() {
                        s.account = Some(format!("@{name}"));
                    }
                    // The token works and the server answers.
                    set_state(&status, "connected", None);
                }
                Err(e) => {
                    backoff = fail(
                        &mb,
                        &status,
                        "telegram_error",
                        &e.message,
                        e.retry_after.map(Duration::from_secs),
                        backoff,
                    )
                    .await;
                    continue;
                }
            }
        }
        let mut body =
            json!({"timeout": poll, "allowed_updates": ["message", "edited_message", "callback_query", "poll_answer"]});
        if let Some(o) = offset {
            body["offset"] = json!(o);
        }
        match bot.call("getUpdates", &body, Duration::from_secs(poll + 15)).await {
            Ok(updates) => {
                set_state(&status, "connected", None);
                backoff = Duration::from_secs(1);
                // A poll's messages go in together and wake the agent once.
                let mut batch = Vec::new();
                for u in updates.as_array().into_iter().flatten() {
                    let id = u["update_id"].as_i64().unwrap_or(0);
                    offset = Some(offset.map_or(id + 1, |o| o.max(id + 1)));
                    // A form button: acknowledge it (the spinner stops),
                    // then its answer goes in like a message.
                    if let Some(cb) = u.get("callback_query") {
                        let ack = json!({"callback_query_id": cb["id"], "text": "Answer received"});
                        let _ = bot.call("answerCallbackQuery", &ack, Duration::from_secs(10)).await;
                    }
                    let Some(mut m) = inbound(u, &name).or_else(|| callback(u, &bot)).or_else(|| poll_answer(u, &bot))
                    else {
                        continue;
                    };
                    // A reply to a form's free-text question is its answer.
                    let asked = m
                        .reply_to_message_id
                        .as_ref()
                        .and_then(|r| bot.asks.lock().ok()?.get(&(m.chat_id.clone(), r.clone())).cloned());
                    if let Some((form, q)) = asked
                        && let Some((ctx, text)) = bot.form_answer(&form, &q, "__text", Some(&m.text))
                    {
                        m.context = ctx;
                        m.text = text;
                    }
                    // Files only for what the policy admits.
                    if policy.admit(&m).is_ok()
                        && let Some(a) = bot.attachment(&m.raw).await
                    {
                        m.attachments.push(a);
                    }
                    // Who may talk, the inbox middleware, the row.
                    let err = match super::deliver_one(&mb, &policy, &status, m).await {
                        Ok(rows) => {
                            batch.extend(rows);
                            None
                        }
                        Err(e) => Some(e),
                    };
                    if let Some(e) = err {
                        // Not confirmed: the next poll brings it again.
                        offset = Some(id);
                        set_state(&status, "backing_off", Some(format!("inbox: {e}")));
                        tokio::time::sleep(backoff).await;
                        break;
                    }
                }
                notify(&mb, batch);
            }
            Err(e) => {
                backoff =
                    fail(&mb, &status, "telegram_error", &e.message, e.retry_after.map(Duration::from_secs), backoff)
                        .await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_are_read_from_entities_in_utf16_and_replies_to_the_bot() {
        let m = json!({"text": "👋 hi @Scout_bot, look", "entities": [{"type": "mention", "offset": 6, "length": 10}]});
        assert!(mentions(&m, "scout_bot"));
        assert!(!mentions(&m, "other_bot"));
        let spoofed = json!({"text": "hi @scout_bot", "entities": []});
        assert!(!mentions(&spoofed, "scout_bot"), "text alone is not a mention");
        let reply = json!({"text": "yes", "reply_to_message": {"from": {"username": "Scout_bot"}}});
        assert!(mentions(&reply, "scout_bot"));
    }

    #[test]
    fn updates_become_inbound_messages() {
        let u = json!({"update_id": 7, "message": {"message_id": 12, "date": 1_700_000_000,
            "from": {"id": 42, "username": "ann"}, "chat": {"id": -100, "type": "supergroup", "title": "Ops"},
            "photo": [{"file_id": "x"}], "caption": "look", "reply_to_message": {"message_id": 11}}});
        let m = inbound(&u, "scout_bot").unwrap();
        assert_eq!((m.chat_id.as_str(), m.message_id.as_str(), m.text.as_str()), ("-100", "12", "look"));
        assert!(m.group && !m.mentioned);
        assert_eq!(m.reply_to_message_id.as_deref(), Some("11"));
        assert_eq!(m.sent_at_ms, Some(1_700_000_000_000));
        let sticker =
            json!({"update_id": 8, "message": {"message_id": 1, "chat": {"id": 5, "type": "private"}, "sticker": {}}});
        assert_eq!(inbound(&sticker, "b").unwrap().text, "[sticker]");
        assert!(inbound(&json!({"update_id": 9, "callback_query": {}}), "b").is_none());
    }
}
