//! Sending on Discord by REST: messages (split at Discord's 2,000
//! characters, the first one a reply to the message answered), files in
//! the same message (`payload_json` and `files[n]`, ten at most), forms as
//! buttons (components) and free-text questions answered by reply.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use reqwest::Method;
use serde_json::{Value, json};

use super::Rest;
use crate::channels::markup::pieces;
use crate::channels::{FORM_TYPE, Outbound, Outgoing};

pub(super) struct Sender {
    pub rest: Arc<Rest>,
}

fn reference(reply_to: Option<&str>) -> Value {
    match reply_to {
        Some(id) => json!({"message_id": id, "fail_if_not_exists": false}),
        None => Value::Null,
    }
}

impl Sender {
    async fn post(&self, chat: &str, mut body: Value, reply_to: Option<&str>) -> Result<String, String> {
        if reply_to.is_some() {
            body["message_reference"] = reference(reply_to);
        }
        let v = self
            .rest
            .call(Method::POST, &format!("/channels/{chat}/messages"), Some(&body))
            .await
            .map_err(|e| e.message)?;
        Ok(v["id"].as_str().unwrap_or("").to_string())
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
            let mut first = None;
            for (i, p) in pieces(text, 2000).into_iter().enumerate() {
                let id = self.post(chat, json!({"content": p}), reply_to.filter(|_| i == 0)).await?;
                first.get_or_insert(id);
            }
            first.ok_or_else(|| "nothing to send".to_string())
        })
    }

    fn send_message<'a>(&'a self, chat: &'a str, m: &'a Outgoing) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            if m.content_type == FORM_TYPE {
                let form: Value =
                    serde_json::from_str(&m.text).map_err(|e| format!("form content is not JSON: {e}"))?;
                return self.send_form(chat, &form, m.reply_to.as_deref()).await;
            }
            if m.files.is_empty() {
                return self.send(chat, &m.text, m.reply_to.as_deref()).await;
            }
            if m.files.len() > 10 {
                return Err("Discord takes at most 10 files in a message; nothing was sent".into());
            }
            // The text beyond what one message holds goes first on its own.
            let mut parts = pieces(&m.text, 2000);
            let last = parts.pop().unwrap_or_default();
            let mut reply_to = m.reply_to.as_deref();
            let mut first = None;
            for p in parts {
                first.get_or_insert(self.post(chat, json!({"content": p}), reply_to.take()).await?);
            }
            let attachments: Vec<Value> =
                m.files.iter().enumerate().map(|(i, f)| json!({"id": i, "filename": f.name})).collect();
            let mut payload = json!({"content": last, "attachments": attachments});
            if reply_to.is_some() {
                payload["message_reference"] = reference(reply_to);
            }
            let mut form = reqwest::multipart::Form::new().text("payload_json", payload.to_string());
            for (i, f) in m.files.iter().enumerate() {
                let part = crate::channels::part(f)?;
                form = form.part(format!("files[{i}]"), part);
            }
            let v = self.rest.upload(&format!("/channels/{chat}/messages"), form).await.map_err(|e| e.message)?;
            Ok(first.unwrap_or_else(|| v["id"].as_str().unwrap_or("").to_string()))
        })
    }

    /// Each choice question a message with buttons (five to a row,
    /// `f|form|question|option`; Done closes a multiple choice); each
    /// free-text question a message answered by reply.
    fn send_form<'a>(
        &'a self,
        chat: &'a str,
        form: &'a Value,
        reply_to: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let id = form["id"].as_str().unwrap_or("form").to_string();
            if let Ok(mut f) = self.rest.forms.lock() {
                f.insert(id.clone(), form.clone());
            }
            let mut first: Option<String> = None;
            for (i, q) in form["questions"].as_array().cloned().unwrap_or_default().iter().enumerate() {
                let qid = q["id"].as_str().unwrap_or("");
                let mut text = q["text"].as_str().unwrap_or("").to_string();
                if i == 0
                    && let Some(t) = form["title"].as_str()
                {
                    text = format!("**{t}**\n{text}");
                }
                let reply = if first.is_none() { reply_to } else { None };
                if q["type"] == "text" {
                    text.push_str("\n(reply to this message)");
                    let mid = self.post(chat, json!({"content": text}), reply).await?;
                    if let Ok(mut a) = self.rest.asks.lock() {
                        a.insert((chat.to_string(), mid.clone()), (id.clone(), qid.to_string()));
                    }
                    first.get_or_insert(mid);
                    continue;
                }
                let mut buttons: Vec<Value> = q["options"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|o| {
                        let opt = o["id"].as_str().unwrap_or("");
                        json!({"type": 2, "style": 1, "label": o["label"], "custom_id": format!("f|{id}|{qid}|{opt}")})
                    })
                    .collect();
                if q["type"] == "multi" {
                    buttons.push(
                        json!({"type": 2, "style": 2, "label": "Done", "custom_id": format!("f|{id}|{qid}|__done")}),
                    );
                }
                let rows: Vec<Value> = buttons.chunks(5).map(|c| json!({"type": 1, "components": c})).collect();
                let mid = self.post(chat, json!({"content": text, "components": rows}), reply).await?;
                first.get_or_insert(mid);
            }
            first.ok_or_else(|| "a form without questions".to_string())
        })
    }

    fn chat_info<'a>(&'a self, chat: &'a str, _limit: usize) -> BoxFuture<'a, Result<Value, String>> {
        Box::pin(async move {
            let c = self.rest.call(Method::GET, &format!("/channels/{chat}"), None).await.map_err(|e| e.message)?;
            let kind = match c["type"].as_u64() {
                Some(1) => "dm",
                Some(3) => "group_dm",
                Some(5) => "announcement",
                Some(11 | 12) => "thread",
                _ => "text",
            };
            let recipients: Vec<Value> = c["recipients"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|u| json!({"id": u["id"], "username": u["username"]}))
                .collect();
            Ok(json!({
                "supported": true, "adapter": "discord", "chat_id": chat, "type": kind,
                "title": c["name"], "description": c["topic"], "guild_id": c["guild_id"],
                "participants": recipients,
                "participants_scope": if kind == "dm" || kind == "group_dm" { "recipients" } else { "none (a server's members need a privileged intent)" },
            }))
        })
    }
}
