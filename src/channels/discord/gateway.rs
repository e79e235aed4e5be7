//! The gateway connection: hello, heartbeats (a missing acknowledgement
//! is a dead connection), identify or resume, then dispatches. A resumed
//! session gets what it missed from Discord; a new one reads back the
//! channels the agent has talked in (REST, one batch). Reconnect requests
//! resume at once; an invalid session identifies again; a wrong token
//! (close 4004) or intents the bot may not use (4014) back off with the
//! cause, 1 s to 60 s.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{Map, Value, json};
use tokio_tungstenite::tungstenite::Message;

use super::{ApiError, Rest, snowflake_at, snowflake_ms};
use crate::channels::{Inbound, Policy, StatusCell, deliver_one, fail, forms, notify, set_state};
use crate::runtime::mesh::Mailbox;

/// Guilds, guild messages, direct messages, message content.
const INTENTS: u64 = (1 << 0) | (1 << 9) | (1 << 12) | (1 << 15);

/// A session to resume: its id, where, and the last sequence number seen.
#[derive(Default, Clone)]
struct Resume {
    session: String,
    url: String,
    seq: Option<u64>,
}

enum Ended {
    /// Connect again at once (resuming when there is a session).
    Again,
    Failed(ApiError),
}

fn failed(message: String) -> Ended {
    Ended::Failed(ApiError { message, retry_after: None })
}

pub(super) async fn run(rest: Arc<Rest>, mb: Arc<Mailbox>, policy: Policy, status: StatusCell) {
    let mut backoff = Duration::from_secs(1);
    let mut resume: Option<Resume> = None;
    loop {
        match session(&rest, &mb, &policy, &status, &mut resume, &mut backoff).await {
            Ended::Again => set_state(&status, "connecting", None),
            Ended::Failed(e) => {
                let wait = e.retry_after.map(Duration::from_secs_f64);
                backoff = fail(&mb, &status, "discord_error", &e.message, wait, backoff).await
            }
        }
    }
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn send(ws: &mut Ws, v: Value) -> Result<(), Ended> {
    ws.send(Message::Text(v.to_string().into())).await.map_err(|e| failed(format!("gateway: {e}")))
}

#[allow(clippy::too_many_arguments)]
async fn session(
    rest: &Arc<Rest>,
    mb: &Arc<Mailbox>,
    policy: &Policy,
    status: &StatusCell,
    resume: &mut Option<Resume>,
    backoff: &mut Duration,
) -> Ended {
    let url = match resume.as_ref().filter(|r| !r.url.is_empty()) {
        Some(r) => r.url.clone(),
        None => match rest.call(Method::GET, "/gateway/bot", None).await {
            Ok(v) => v["url"].as_str().unwrap_or("wss://gateway.discord.gg").to_string(),
            Err(e) => return Ended::Failed(e),
        },
    };
    let url = match url::Url::parse(&url) {
        Ok(mut u) => {
            u.set_query(Some("v=10&encoding=json"));
            u.to_string()
        }
        Err(e) => return failed(format!("gateway URL {url:?}: {e}")),
    };
    let connector = match crate::channels::ws_connector(&url) {
        Ok(c) => c,
        Err(e) => return failed(format!("gateway: {e}")),
    };
    let mut ws = match tokio::time::timeout(
        Duration::from_secs(30),
        tokio_tungstenite::connect_async_tls_with_config(url.as_str(), None, false, Some(connector)),
    )
    .await
    {
        Ok(Ok((ws, _))) => ws,
        Ok(Err(e)) => return failed(format!("gateway: {e}")),
        Err(_) => return failed("gateway: no answer in 30 s".into()),
    };
    // Hello: how often to beat.
    let interval = match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => {
            let v: Value = serde_json::from_str(&t).unwrap_or_default();
            match v["d"]["heartbeat_interval"].as_u64() {
                Some(i) if v["op"] == 10 => i,
                _ => return failed("gateway: no hello".into()),
            }
        }
        _ => return failed("gateway: no hello".into()),
    };
    let token = rest.token.clone();
    let hello = match resume.as_ref() {
        Some(r) => json!({"op": 6, "d": {"token": token, "session_id": r.session, "seq": r.seq}}),
        None => json!({"op": 2, "d": {"token": token, "intents": INTENTS,
            "properties": {"os": std::env::consts::OS, "browser": "adf", "device": "adf"}}}),
    };
    if let Err(e) = send(&mut ws, hello).await {
        return e;
    }
    let mut beat = tokio::time::interval(Duration::from_millis(interval.max(100)));
    beat.tick().await;
    let mut acked = true;
    loop {
        tokio::select! {
            _ = beat.tick() => {
                if !acked {
                    return failed("gateway: a heartbeat was not acknowledged".into());
                }
                acked = false;
                let seq = resume.as_ref().and_then(|r| r.seq);
                if let Err(e) = send(&mut ws, json!({"op": 1, "d": seq})).await {
                    return e;
                }
            }
            msg = ws.next() => {
                let text = match msg {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Close(frame))) => {
                        let code = frame.as_ref().map(|f| u16::from(f.code)).unwrap_or(1000);
                        return closed(code, frame.map(|f| f.reason.to_string()).unwrap_or_default(), resume);
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return failed(format!("gateway: {e}")),
                    None => return Ended::Again,
                };
                let Ok(v) = serde_json::from_str::<Value>(&text) else {
                    let _ = mb.with_store(|s| s.log("warn", "adapter", "discord_malformed", "a gateway frame that is not JSON"));
                    continue;
                };
                match v["op"].as_u64() {
                    Some(11) => acked = true,
                    Some(1) => {
                        let seq = resume.as_ref().and_then(|r| r.seq);
                        if let Err(e) = send(&mut ws, json!({"op": 1, "d": seq})).await {
                            return e;
                        }
                    }
                    Some(7) => return Ended::Again,
                    Some(9) => {
                        if v["d"] != true {
                            *resume = None;
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        return Ended::Again;
                    }
                    Some(0) => {
                        if let (Some(r), Some(s)) = (resume.as_mut(), v["s"].as_u64()) {
                            r.seq = Some(s);
                        }
                        match v["t"].as_str().unwrap_or("") {
                            "READY" => {
                                let d = &v["d"];
                                *resume = Some(Resume {
                                    session: d["session_id"].as_str().unwrap_or("").to_string(),
                                    url: d["resume_gateway_url"].as_str().unwrap_or("").to_string(),
                                    seq: v["s"].as_u64(),
                                });
                                let name = d["user"]["username"].as_str().unwrap_or("").to_string();
                                if let Ok(mut m) = rest.me.lock() { *m = d["user"]["id"].as_str().unwrap_or("").to_string(); }
                                if let Ok(mut a) = rest.app.lock() { *a = d["application"]["id"].as_str().unwrap_or("").to_string(); }
                                if let Ok(mut s) = status.lock() { s.account = Some(format!("@{name}")); }
                                set_state(status, "connected", None);
                                *backoff = Duration::from_secs(1);
                                register_command(rest, mb, &name).await;
                                if let Err(e) = catch_up(rest, mb, policy, status).await {
                                    return Ended::Failed(e);
                                }
                            }
                            "RESUMED" => {
                                set_state(status, "connected", None);
                                *backoff = Duration::from_secs(1);
                            }
                            "MESSAGE_CREATE" => {
                                if let Some(m) = inbound(rest, &v["d"], None).await {
                                    match deliver_one(mb, policy, status, m).await {
                                        Ok(rows) => notify(mb, rows),
                                        Err(e) => return failed(format!("inbox: {e}")),
                                    }
                                }
                            }
                            "INTERACTION_CREATE" => {
                                if let Some(m) = interaction(rest, &v["d"]).await {
                                    match deliver_one(mb, policy, status, m).await {
                                        Ok(rows) => notify(mb, rows),
                                        Err(e) => return failed(format!("inbox: {e}")),
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

/// What a close code means: resume, identify again, or stop with why.
fn closed(code: u16, reason: String, resume: &mut Option<Resume>) -> Ended {
    match code {
        4004 => failed("gateway: authentication failed (4004): the bot token is wrong or revoked".into()),
        4014 => failed(
            "gateway: disallowed intents (4014): enable MESSAGE CONTENT under Privileged Gateway Intents in the developer portal"
                .into(),
        ),
        4010..=4013 => failed(format!("gateway: closed ({code}) {reason}")),
        4007 | 4009 => {
            *resume = None;
            Ended::Again
        }
        _ => Ended::Again,
    }
}

/// `/<bot name> prompt:<text>`, registered for the application (a failure
/// is logged: messages still work).
async fn register_command(rest: &Rest, mb: &Arc<Mailbox>, bot: &str) {
    let app = rest.app.lock().map(|a| a.clone()).unwrap_or_default();
    if app.is_empty() {
        return;
    }
    let mut name: String =
        bot.to_lowercase().chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').take(32).collect();
    if name.is_empty() {
        name = "agent".into();
    }
    let body = json!([{"name": name, "type": 1, "description": "Ask the agent",
        "options": [{"type": 3, "name": "prompt", "description": "What to ask", "required": true}]}]);
    if let Err(e) = rest.call(Method::PUT, &format!("/applications/{app}/commands"), Some(&body)).await {
        let (mb, msg) = (mb.clone(), format!("slash command not registered: {}", e.message));
        let _ =
            tokio::task::spawn_blocking(move || mb.with_store(|s| s.log("warn", "adapter", "discord_command", &msg)))
                .await;
    }
}

/// Read back the channels the agent has talked in, from a second before
/// the newest message the inbox holds, as one batch.
async fn catch_up(rest: &Rest, mb: &Arc<Mailbox>, policy: &Policy, status: &StatusCell) -> Result<(), ApiError> {
    let m2 = mb.clone();
    let known = tokio::task::spawn_blocking(move || {
        m2.with_store(|s| {
            Ok::<_, crate::store::StoreError>((s.inbox_latest_sent("discord")?, s.inbox_chats("discord")?))
        })
    })
    .await
    .ok()
    .and_then(Result::ok)
    .and_then(Result::ok);
    let Some((Some(since), chats)) = known else { return Ok(()) };
    let after = snowflake_at(since - 1000);
    let mut rows = Vec::new();
    for chat in chats.iter().filter_map(|c| c.strip_prefix("discord:")) {
        let info = rest.call(Method::GET, &format!("/channels/{chat}"), None).await;
        // A DM is type 1 (3: a group DM).
        let dm = info.as_ref().map(|c| matches!(c["type"].as_u64(), Some(1 | 3))).unwrap_or(false);
        let page = rest.call(Method::GET, &format!("/channels/{chat}/messages?after={after}&limit=100"), None).await?;
        let mut messages = page.as_array().cloned().unwrap_or_default();
        messages.sort_by_key(|m| m["id"].as_str().and_then(|i| i.parse::<u64>().ok()).unwrap_or(0));
        for m in messages {
            if let Some(msg) = inbound(rest, &m, Some(!dm)).await {
                rows.extend(
                    deliver_one(mb, policy, status, msg)
                        .await
                        .map_err(|e| ApiError { message: format!("inbox: {e}"), retry_after: None })?,
                );
            }
        }
    }
    notify(mb, rows);
    Ok(())
}

/// A message in the framework's terms (`None`: a bot's, the bot's own, or
/// not a person's message). `guild` says whether it was in a server when
/// the message itself cannot (read back by REST).
async fn inbound(rest: &Rest, d: &Value, guild: Option<bool>) -> Option<Inbound> {
    let me = rest.me();
    let author = &d["author"];
    if author["bot"] == true || author["id"].as_str() == Some(me.as_str()) {
        return None;
    }
    // 0: a message, 19: a reply.
    if !matches!(d["type"].as_u64(), None | Some(0) | Some(19)) {
        return None;
    }
    let chat = d["channel_id"].as_str()?.to_string();
    let id = d["id"].as_str()?.to_string();
    let group = guild.unwrap_or(!d["guild_id"].is_null());
    let mentioned = d["mentions"].as_array().into_iter().flatten().any(|m| m["id"].as_str() == Some(me.as_str()))
        || d.pointer("/referenced_message/author/id").and_then(Value::as_str) == Some(me.as_str());
    let mut text = d["content"].as_str().unwrap_or("").to_string();
    if !me.is_empty() {
        text = text.replace(&format!("<@{me}>"), "").replace(&format!("<@!{me}>"), "").trim().to_string();
    }
    let reply_to = d.pointer("/message_reference/message_id").and_then(Value::as_str).map(str::to_string);
    let mut context = Map::new();
    context.insert("guild_id".into(), d["guild_id"].clone());
    // A reply to a form's free-text question answers it.
    let asked = reply_to.as_ref().and_then(|r| rest.asks.lock().ok()?.get(&(chat.clone(), r.clone())).cloned());
    if let Some((form_id, q)) = asked
        && let Some(form) = rest.forms.lock().ok().and_then(|f| f.get(&form_id).cloned())
        && let Some((ctx, shown)) = forms::control_answer(&form, &q, "__text", Some(&text))
    {
        context.extend(ctx);
        text = shown;
    }
    let mut attachments = Vec::new();
    for a in d["attachments"].as_array().into_iter().flatten() {
        let name = a["filename"].as_str().unwrap_or("file").to_string();
        let mime = a["content_type"].as_str().unwrap_or("application/octet-stream").to_string();
        let skipped = |why: String| json!({"filename": name, "content_type": mime, "skipped": true, "reason": why});
        let size = a["size"].as_u64().unwrap_or(0);
        if size > rest.max_file {
            attachments.push(skipped(format!("{size} bytes, over the {} byte limit", rest.max_file)));
            continue;
        }
        match a["url"].as_str() {
            Some(url) => match rest.download(url).await {
                Ok(b) => attachments.push(json!({"filename": name, "content_type": mime, "transfer": "inline",
                    "size_bytes": b.len(), "data": base64::engine::general_purpose::STANDARD.encode(&b)})),
                Err(why) => attachments.push(skipped(why)),
            },
            None => attachments.push(skipped("no URL".into())),
        }
    }
    if text.is_empty() {
        text = if attachments.is_empty() { "[message]".into() } else { "[file]".into() };
    }
    Some(Inbound {
        kind: "discord",
        chat_type: if group { "guild".into() } else { "dm".into() },
        chat_id: chat,
        group,
        mentioned,
        sent_at_ms: snowflake_ms(&id),
        message_id: id,
        sender_id: author["id"].as_str().unwrap_or("").to_string(),
        sender_name: author["username"].as_str().unwrap_or("").to_string(),
        text,
        reply_to_message_id: reply_to,
        raw: d.clone(),
        context,
        attachments,
        ..Default::default()
    })
}

/// A slash command or a form button: answered to Discord at once (it
/// wants an answer in 3 s), then an inbound message.
async fn interaction(rest: &Rest, d: &Value) -> Option<Inbound> {
    let user = if d["member"]["user"].is_object() { &d["member"]["user"] } else { &d["user"] };
    let chat = d["channel_id"].as_str()?.to_string();
    let callback = format!("/interactions/{}/{}/callback", d["id"].as_str()?, d["token"].as_str()?);
    let (text, context, answer) = match d["type"].as_u64()? {
        // A slash command: `/<name> prompt:<text>`.
        2 => {
            let prompt =
                d["data"]["options"].as_array().into_iter().flatten().find_map(|o| o["value"].as_str()).unwrap_or("");
            let text = format!("/{} {prompt}", d["data"]["name"].as_str().unwrap_or("")).trim().to_string();
            let mut ctx = Map::new();
            ctx.insert("command".into(), d["data"]["name"].clone());
            (text, ctx, json!({"type": 4, "data": {"content": "Received.", "flags": 64}}))
        }
        // A button: `f|form|question|option`.
        3 => {
            let mut parts = d["data"]["custom_id"].as_str()?.splitn(4, '|');
            let (Some("f"), Some(form_id), Some(q), Some(opt)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return None;
            };
            let form = rest.forms.lock().ok()?.get(form_id)?.clone();
            let (ctx, text) = forms::control_answer(&form, q, opt, None)?;
            (text, ctx, json!({"type": 6}))
        }
        _ => return None,
    };
    let _ = rest.call(Method::POST, &callback, Some(&answer)).await;
    Some(Inbound {
        kind: "discord",
        group: !d["guild_id"].is_null(),
        chat_type: if d["type"] == 2 { "command".into() } else { "component".into() },
        chat_id: chat,
        mentioned: true,
        message_id: format!("i{}", d["id"].as_str().unwrap_or("")),
        sender_id: user["id"].as_str().unwrap_or("").to_string(),
        sender_name: user["username"].as_str().unwrap_or("").to_string(),
        text,
        reply_to_message_id: d.pointer("/message/id").and_then(Value::as_str).map(str::to_string),
        sent_at_ms: Some(crate::store::now_ms()),
        raw: d.clone(),
        context,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_codes_say_whether_to_resume_identify_or_stop() {
        let mut r = Some(Resume { session: "S".into(), url: "u".into(), seq: Some(3) });
        assert!(
            matches!(closed(4004, String::new(), &mut r), Ended::Failed(e) if e.message.contains("authentication failed"))
        );
        assert!(
            matches!(closed(4014, String::new(), &mut r), Ended::Failed(e) if e.message.contains("MESSAGE CONTENT"))
        );
        assert!(matches!(closed(1001, String::new(), &mut r), Ended::Again));
        assert!(r.is_some(), "a going-away close resumes");
        assert!(matches!(closed(4009, String::new(), &mut r), Ended::Again));
        assert!(r.is_none(), "a timed-out session identifies again");
    }
}
