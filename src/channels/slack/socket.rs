//! The Socket Mode connection: open it (`apps.connections.open`), catch
//! up from history, then read envelopes — events, button presses, slash
//! commands — each acknowledged once its message is in the inbox. Slack's
//! `disconnect` (a refresh) reconnects at once; silence for 30 s gets a
//! ping, and no answer to it, or any failure, backs off 1 s to 60 s (or
//! what a 429 says) with the cause in the channel's status.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Map, Value, json};
use tokio_tungstenite::tungstenite::Message;

use super::{Api, ApiError};
use crate::channels::{Inbound, Policy, StatusCell, deliver_one, fail, forms, notify, set_state};
use crate::runtime::mesh::Mailbox;

const HEALTH: Duration = Duration::from_secs(30);

/// Why a connection ended.
enum Ended {
    /// Slack asked for a new connection: no wait.
    Refresh,
    Failed(ApiError),
}

fn failed(message: String) -> Ended {
    Ended::Failed(ApiError { message, retry_after: None })
}

pub(super) async fn run(api: Arc<Api>, app: String, mb: Arc<Mailbox>, policy: Policy, status: StatusCell) {
    let mut backoff = Duration::from_secs(1);
    loop {
        match session(&api, &app, &mb, &policy, &status, &mut backoff).await {
            Ended::Refresh => set_state(&status, "connecting", None),
            Ended::Failed(e) => {
                let wait = e.retry_after.map(Duration::from_secs);
                backoff = fail(&mb, &status, "slack_error", &e.message, wait, backoff).await
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn session(
    api: &Arc<Api>,
    app: &str,
    mb: &Arc<Mailbox>,
    policy: &Policy,
    status: &StatusCell,
    backoff: &mut Duration,
) -> Ended {
    if api.me().is_empty() {
        match api.call("auth.test", &json!({})).await {
            Ok(me) => {
                if let Ok(mut m) = api.me.lock() {
                    *m = me["user_id"].as_str().unwrap_or("").to_string();
                }
                if let Ok(mut s) = status.lock() {
                    s.account = Some(format!("@{}", me["user"].as_str().unwrap_or("")));
                }
            }
            Err(e) => return Ended::Failed(e),
        }
    }
    let url = match api.open_socket(app).await {
        Ok(u) => u,
        Err(e) => return Ended::Failed(e),
    };
    let connector = match crate::channels::ws_connector(&url) {
        Ok(c) => c,
        Err(e) => return failed(format!("Socket Mode: {e}")),
    };
    let connected = tokio::time::timeout(
        HEALTH,
        tokio_tungstenite::connect_async_tls_with_config(url.as_str(), None, false, Some(connector)),
    )
    .await;
    let mut ws = match connected {
        Ok(Ok((ws, _))) => ws,
        Ok(Err(e)) => return failed(format!("Socket Mode: {e}")),
        Err(_) => return failed("Socket Mode: no answer in 30 s".into()),
    };
    if let Err(e) = catch_up(api, mb, policy, status).await {
        return Ended::Failed(e);
    }
    let mut pinged = false;
    loop {
        let msg = match tokio::time::timeout(HEALTH, ws.next()).await {
            Err(_) if pinged => return failed("Socket Mode: no answer to a ping in 30 s".into()),
            Err(_) => {
                pinged = true;
                if let Err(e) = ws.send(Message::Ping(Vec::new().into())).await {
                    return failed(format!("Socket Mode: {e}"));
                }
                continue;
            }
            Ok(None) => return failed("Socket Mode: the connection closed".into()),
            Ok(Some(Err(e))) => return failed(format!("Socket Mode: {e}")),
            Ok(Some(Ok(m))) => m,
        };
        pinged = false;
        let text = match msg {
            Message::Text(t) => t,
            Message::Close(_) => return failed("Socket Mode: closed by Slack".into()),
            _ => continue,
        };
        let Ok(env) = serde_json::from_str::<Value>(&text) else {
            let _ = mb.with_store(|s| s.log("warn", "adapter", "slack_malformed", "an envelope that is not JSON"));
            continue;
        };
        match env["type"].as_str() {
            Some("hello") => {
                set_state(status, "connected", None);
                *backoff = Duration::from_secs(1);
                continue;
            }
            Some("disconnect") => return Ended::Refresh,
            _ => {}
        }
        let Some(id) = env["envelope_id"].as_str() else { continue };
        let m = match env["type"].as_str() {
            Some("events_api") => inbound(api, &env["payload"]["event"]).await,
            Some("interactive") => action(api, &env["payload"]),
            Some("slash_commands") => command(&env["payload"], id),
            _ => None,
        };
        if let Some(m) = m {
            match deliver_one(mb, policy, status, m).await {
                Ok(rows) => notify(mb, rows),
                // Not acknowledged: Slack brings it again.
                Err(e) => return failed(format!("inbox: {e}")),
            }
        }
        if let Err(e) = ws.send(Message::Text(json!({"envelope_id": id}).to_string().into())).await {
            return failed(format!("Socket Mode: {e}"));
        }
    }
}

/// Read back the conversations the bot is in, from the newest message the
/// inbox holds (less a second: de-duplication takes the overlap), as one
/// batch. Nothing is read back before the channel's first message.
async fn catch_up(api: &Api, mb: &Arc<Mailbox>, policy: &Policy, status: &StatusCell) -> Result<(), ApiError> {
    let m2 = mb.clone();
    let since = tokio::task::spawn_blocking(move || m2.with_store(|s| s.inbox_latest_sent("slack")))
        .await
        .ok()
        .and_then(Result::ok)
        .and_then(Result::ok)
        .flatten();
    let Some(since) = since else { return Ok(()) };
    let oldest = format!("{:.6}", since as f64 / 1000.0 - 1.0);
    let list = api
        .call(
            "conversations.list",
            &json!({"types": "im,mpim,private_channel,public_channel", "exclude_archived": true, "limit": 200}),
        )
        .await?;
    let mut rows = Vec::new();
    for c in list["channels"].as_array().into_iter().flatten() {
        let im = c["is_im"].as_bool() == Some(true);
        if !im && c["is_member"].as_bool() != Some(true) {
            continue;
        }
        let Some(id) = c["id"].as_str() else { continue };
        let kind = if im {
            "im"
        } else if c["is_mpim"].as_bool() == Some(true) {
            "mpim"
        } else if c["is_private"].as_bool() == Some(true) {
            "group"
        } else {
            "channel"
        };
        let h = api.call("conversations.history", &json!({"channel": id, "oldest": oldest, "limit": 200})).await?;
        let mut messages: Vec<Value> = h["messages"].as_array().cloned().unwrap_or_default();
        messages.reverse();
        for mut ev in messages {
            ev["type"] = json!("message");
            ev["channel"] = json!(id);
            ev["channel_type"] = json!(kind);
            if let Some(m) = inbound(api, &ev).await {
                rows.extend(
                    deliver_one(mb, policy, status, m)
                        .await
                        .map_err(|e| ApiError { message: format!("inbox: {e}"), retry_after: None })?,
                );
            }
        }
    }
    notify(mb, rows);
    Ok(())
}

impl Api {
    pub(super) fn me(&self) -> String {
        self.me.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// A message event in the framework's terms (`None`: not a person's
/// message — the bot's own, another bot's, an edit or a join).
async fn inbound(api: &Api, ev: &Value) -> Option<Inbound> {
    if !matches!(ev["type"].as_str(), Some("message" | "app_mention")) || !ev["bot_id"].is_null() {
        return None;
    }
    if !matches!(ev["subtype"].as_str(), None | Some("file_share" | "thread_broadcast")) {
        return None;
    }
    let me = api.me();
    let user = ev["user"].as_str().filter(|u| *u != me)?;
    let channel = ev["channel"].as_str()?;
    let ts = ev["ts"].as_str()?;
    let kind = ev["channel_type"].as_str().unwrap_or(if channel.starts_with('D') { "im" } else { "channel" });
    let thread = ev["thread_ts"].as_str().filter(|t| *t != ts).map(str::to_string);
    let raw_text = ev["text"].as_str().unwrap_or("");
    let tag = format!("<@{me}>");
    let ours = thread.as_ref().is_some_and(|t| api.threads.lock().is_ok_and(|th| th.contains(t)));
    let mentioned = ev["type"] == "app_mention" || (!me.is_empty() && raw_text.contains(&tag)) || ours;
    let mut text =
        if me.is_empty() { raw_text.trim().to_string() } else { raw_text.replace(&tag, "").trim().to_string() };
    let mut context = Map::new();
    context.insert("thread_ts".into(), ev["thread_ts"].clone());
    context.insert("channel_type".into(), kind.into());
    context.insert("team_id".into(), ev["team"].clone());
    // A reply in the thread of a form's free-text question answers it.
    let asked = thread.as_ref().and_then(|t| api.asks.lock().ok()?.get(t).cloned());
    if let Some((form_id, q)) = asked
        && let Some(form) = api.forms.lock().ok().and_then(|f| f.get(&form_id).cloned())
        && let Some((ctx, shown)) = forms::control_answer(&form, &q, "__text", Some(&text))
    {
        context.extend(ctx);
        text = shown;
    }
    let mut attachments = Vec::new();
    for f in ev["files"].as_array().into_iter().flatten() {
        let name = f["name"].as_str().unwrap_or("file").to_string();
        let mime = f["mimetype"].as_str().unwrap_or("application/octet-stream").to_string();
        let skipped = |why: String| json!({"filename": name, "content_type": mime, "skipped": true, "reason": why});
        let size = f["size"].as_u64();
        let Some(url) = f["url_private_download"].as_str().or(f["url_private"].as_str()) else {
            attachments.push(skipped("no download URL".into()));
            continue;
        };
        if size.is_some_and(|s| s > api.max_file) {
            attachments.push(skipped(format!("{} bytes, over the {} byte limit", size.unwrap_or(0), api.max_file)));
            continue;
        }
        match api.download(url, mime.contains("html")).await {
            Ok(bytes) => attachments.push(json!({"filename": name, "content_type": mime, "transfer": "inline",
                "size_bytes": bytes.len(), "data": base64::engine::general_purpose::STANDARD.encode(&bytes)})),
            Err(why) => attachments.push(skipped(why)),
        }
    }
    if text.is_empty() {
        text = if attachments.is_empty() { "[message]".into() } else { "[file]".into() };
    }
    let mut extra = Map::new();
    if let Some(t) = &thread {
        extra.insert("thread_id".into(), format!("slack:{channel}:{t}").into());
    }
    Some(Inbound {
        kind: "slack",
        chat_id: channel.to_string(),
        chat_type: kind.to_string(),
        group: kind != "im",
        mentioned,
        message_id: ts.to_string(),
        sender_id: user.to_string(),
        sender_name: api.name(user).await,
        text,
        reply_to_message_id: thread,
        sent_at_ms: ts.parse::<f64>().ok().map(|t| (t * 1000.0) as i64),
        raw: ev.clone(),
        context,
        attachments,
        extra,
    })
}

/// A form button pressed (`block_actions`): its answer, checked against
/// the form sent, or `None`.
fn action(api: &Api, p: &Value) -> Option<Inbound> {
    if p["type"] != "block_actions" {
        return None;
    }
    let a = p["actions"].as_array()?.first()?;
    let mut parts = a["action_id"].as_str()?.splitn(4, '|');
    let (Some("f"), Some(form_id), Some(q), Some(opt)) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let form = api.forms.lock().ok()?.get(form_id)?.clone();
    let (context, text) = forms::control_answer(&form, q, opt, None)?;
    let chat = p["channel"]["id"].as_str()?.to_string();
    Some(Inbound {
        kind: "slack",
        group: !chat.starts_with('D'),
        chat_id: chat,
        chat_type: "action".into(),
        mentioned: true,
        message_id: format!("act{}", a["action_ts"].as_str().unwrap_or("")),
        sender_id: p["user"]["id"].as_str().unwrap_or("").to_string(),
        sender_name: p["user"]["username"].as_str().or(p["user"]["name"].as_str()).unwrap_or("").to_string(),
        text,
        reply_to_message_id: p["message"]["ts"].as_str().map(str::to_string),
        sent_at_ms: Some(crate::store::now_ms()),
        raw: p.clone(),
        context,
        ..Default::default()
    })
}

/// A slash command (`/ask …`) addressed to the agent.
fn command(p: &Value, envelope: &str) -> Option<Inbound> {
    let chat = p["channel_id"].as_str()?.to_string();
    let text =
        format!("{} {}", p["command"].as_str().unwrap_or(""), p["text"].as_str().unwrap_or("")).trim().to_string();
    let mut context = Map::new();
    context.insert("command".into(), p["command"].clone());
    Some(Inbound {
        kind: "slack",
        group: !chat.starts_with('D'),
        chat_id: chat,
        chat_type: "slash_command".into(),
        mentioned: true,
        message_id: format!("cmd{}", p["trigger_id"].as_str().unwrap_or(envelope)),
        sender_id: p["user_id"].as_str().unwrap_or("").to_string(),
        sender_name: p["user_name"].as_str().unwrap_or("").to_string(),
        text,
        sent_at_ms: Some(crate::store::now_ms()),
        raw: p.clone(),
        context,
        ..Default::default()
    })
}
