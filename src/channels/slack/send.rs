//! Sending on Slack through the Web API: `chat.postMessage` (a reply goes
//! in the thread of the message it answers, except in a DM), a user id
//! opened as a DM first, files by the external upload flow
//! (`files.getUploadURLExternal`, the bytes, `files.completeUploadExternal`
//! with the text as its comment), forms as interactive blocks.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{Value, json};

use super::Api;
use crate::channels::{FORM_TYPE, Outbound, Outgoing};

pub(super) struct Sender {
    pub api: Arc<Api>,
}

impl Sender {
    /// The conversation to post in: a user id (`U…`, `W…`) is opened as a DM.
    async fn channel(&self, chat: &str) -> Result<String, String> {
        if chat.starts_with('U') || chat.starts_with('W') {
            let v = self.api.call("conversations.open", &json!({"users": chat})).await.map_err(|e| e.message)?;
            return v["channel"]["id"].as_str().map(str::to_string).ok_or("conversations.open gave no channel".into());
        }
        Ok(chat.to_string())
    }

    /// Post a message; remember it as a thread the bot started.
    async fn post(&self, mut body: Value, thread: Option<&str>) -> Result<String, String> {
        if let Some(t) = thread {
            body["thread_ts"] = json!(t);
        }
        let v = self.api.call("chat.postMessage", &body).await.map_err(|e| e.message)?;
        let ts = v["ts"].as_str().unwrap_or("").to_string();
        if let Ok(mut th) = self.api.threads.lock() {
            th.insert(thread.map(str::to_string).unwrap_or_else(|| ts.clone()));
        }
        Ok(ts)
    }

    /// Upload files into a conversation, the text as their comment.
    async fn upload(&self, channel: &str, m: &Outgoing, thread: Option<&str>) -> Result<String, String> {
        let mut files = Vec::new();
        for f in &m.files {
            let v = self
                .api
                .call_form(
                    "files.getUploadURLExternal",
                    &[("filename", f.name.clone()), ("length", f.data.len().to_string())],
                )
                .await
                .map_err(|e| e.message)?;
            let (Some(url), Some(id)) = (v["upload_url"].as_str(), v["file_id"].as_str()) else {
                return Err("files.getUploadURLExternal gave no upload_url".into());
            };
            let sent = self
                .api
                .http
                .post(url)
                .header("content-type", f.mime.as_str())
                .body(f.data.clone())
                .timeout(Duration::from_secs(300))
                .send()
                .await
                .map_err(|e| format!("upload of {}: {}", f.name, crate::channels::without_url(&e)))?;
            if !sent.status().is_success() {
                return Err(format!("upload of {}: HTTP {}", f.name, sent.status()));
            }
            files.push(json!({"id": id, "title": f.name}));
        }
        let mut body = json!({"files": files, "channel_id": channel});
        if !m.text.trim().is_empty() {
            body["initial_comment"] = json!(crate::channels::markup::slack_mrkdwn(&m.text));
        }
        if let Some(t) = thread {
            body["thread_ts"] = json!(t);
        }
        let v = self.api.call("files.completeUploadExternal", &body).await.map_err(|e| e.message)?;
        let ids: Vec<&str> = v["files"].as_array().into_iter().flatten().filter_map(|f| f["id"].as_str()).collect();
        Ok(ids.join(","))
    }
}

/// The thread a reply goes in: the one the message replied to was in, or
/// that message itself; none in a DM.
fn thread(m: &Outgoing) -> Option<String> {
    if m.replied["channel_type"] == "im" {
        return None;
    }
    m.replied["thread_ts"].as_str().map(str::to_string).or_else(|| m.reply_to.clone()).filter(|t| is_ts(t))
}

/// A message's `ts` (`1700000000.000100`), not the id of a button press or
/// a slash command, which have no thread.
fn is_ts(t: &str) -> bool {
    t.split_once('.').is_some_and(|(a, b)| {
        !a.is_empty() && !b.is_empty() && a.bytes().all(|c| c.is_ascii_digit()) && b.bytes().all(|c| c.is_ascii_digit())
    })
}

/// A form as blocks: each choice question a row of buttons (`f|form|q|opt`,
/// plus Done for a multiple choice).
fn blocks(form: &Value) -> Vec<Value> {
    let id = form["id"].as_str().unwrap_or("form");
    let mut out = Vec::new();
    if let Some(t) = form["title"].as_str() {
        out.push(json!({"type": "header", "text": {"type": "plain_text", "text": t}}));
    }
    for q in form["questions"].as_array().into_iter().flatten().filter(|q| q["type"] != "text") {
        let qid = q["id"].as_str().unwrap_or("");
        out.push(json!({"type": "section", "text": {"type": "mrkdwn", "text": q["text"]}}));
        let mut buttons: Vec<Value> = q["options"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| {
                let opt = o["id"].as_str().unwrap_or("");
                json!({"type": "button", "text": {"type": "plain_text", "text": o["label"]}, "value": opt,
                    "action_id": format!("f|{id}|{qid}|{opt}")})
            })
            .collect();
        if q["type"] == "multi" {
            buttons.push(json!({"type": "button", "text": {"type": "plain_text", "text": "Done"}, "value": "__done",
                "action_id": format!("f|{id}|{qid}|__done")}));
        }
        out.push(json!({"type": "actions", "block_id": format!("{id}-{qid}"), "elements": buttons}));
    }
    out
}

impl Outbound for Sender {
    fn send<'a>(
        &'a self,
        chat: &'a str,
        text: &'a str,
        reply_to: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let channel = self.channel(chat).await?;
            let text = crate::channels::markup::slack_mrkdwn(text);
            self.post(json!({"channel": channel, "text": text}), reply_to.filter(|r| is_ts(r))).await
        })
    }

    fn send_message<'a>(&'a self, chat: &'a str, m: &'a Outgoing) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let channel = self.channel(chat).await?;
            let thread = thread(m);
            if m.content_type == FORM_TYPE {
                let form: Value =
                    serde_json::from_str(&m.text).map_err(|e| format!("form content is not JSON: {e}"))?;
                return self.send_form(&channel, &form, thread.as_deref()).await;
            }
            if !m.files.is_empty() {
                return self.upload(&channel, m, thread.as_deref()).await;
            }
            let text = crate::channels::markup::slack_mrkdwn(&m.text);
            self.post(json!({"channel": channel, "text": text}), thread.as_deref()).await
        })
    }

    /// Buttons for the choice questions in one message; each free-text
    /// question as its own message, answered by a reply in its thread.
    fn send_form<'a>(
        &'a self,
        chat: &'a str,
        form: &'a Value,
        reply_to: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let channel = self.channel(chat).await?;
            let id = form["id"].as_str().unwrap_or("form").to_string();
            if let Ok(mut f) = self.api.forms.lock() {
                f.insert(id.clone(), form.clone());
            }
            let mut first = None;
            let b = blocks(form);
            if b.iter().any(|x| x["type"] == "actions") {
                let fallback = crate::channels::form_text(form);
                first = Some(self.post(json!({"channel": channel, "text": fallback, "blocks": b}), reply_to).await?);
            }
            for q in form["questions"].as_array().into_iter().flatten().filter(|q| q["type"] == "text") {
                let text = format!("{} (reply in this thread)", q["text"].as_str().unwrap_or(""));
                let ts = self.post(json!({"channel": channel, "text": text}), reply_to).await?;
                if let Ok(mut a) = self.api.asks.lock() {
                    a.insert(ts.clone(), (id.clone(), q["id"].as_str().unwrap_or("").to_string()));
                }
                // A reply to it comes in its own thread.
                if let Ok(mut th) = self.api.threads.lock() {
                    th.insert(ts.clone());
                }
                first.get_or_insert(ts);
            }
            first.ok_or_else(|| "a form without questions".to_string())
        })
    }

    fn chat_info<'a>(&'a self, chat: &'a str, limit: usize) -> BoxFuture<'a, Result<Value, String>> {
        Box::pin(async move {
            let c = self.api.call("conversations.info", &json!({"channel": chat})).await.map_err(|e| e.message)?;
            let c = &c["channel"];
            let members = self
                .api
                .call("conversations.members", &json!({"channel": chat, "limit": limit.clamp(1, 1000)}))
                .await
                .ok();
            let roster: Vec<Value> = members
                .as_ref()
                .and_then(|m| m["members"].as_array())
                .into_iter()
                .flatten()
                .take(limit)
                .map(|id| json!({"id": id}))
                .collect();
            let more = members
                .as_ref()
                .and_then(|m| m["response_metadata"]["next_cursor"].as_str())
                .is_some_and(|c| !c.is_empty());
            let kind = if c["is_im"] == true {
                "im"
            } else if c["is_private"] == true {
                "private_channel"
            } else {
                "channel"
            };
            Ok(json!({
                "supported": true, "adapter": "slack", "chat_id": chat, "type": kind,
                "title": c["name"], "description": c["purpose"]["value"], "topic": c["topic"]["value"],
                "participant_count": c["num_members"], "participants": roster, "participants_scope": "members",
                "participants_truncated": more,
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_thread_except_in_a_dm_and_forms_become_buttons() {
        let mut m = Outgoing {
            reply_to: Some("1.1".into()),
            replied: json!({"channel_type": "channel"}),
            ..Default::default()
        };
        assert_eq!(thread(&m).as_deref(), Some("1.1"));
        m.replied["thread_ts"] = json!("0.5");
        assert_eq!(thread(&m).as_deref(), Some("0.5"), "into the thread it was in");
        m.replied["channel_type"] = json!("im");
        assert_eq!(thread(&m), None);
        let cmd = Outgoing { reply_to: Some("cmdT1".into()), ..Default::default() };
        assert_eq!(thread(&cmd), None, "a slash command has no thread");
        let form = json!({"id": "lunch", "title": "Lunch", "questions": [
            {"id": "q1", "type": "multi", "text": "Extras?", "options": [{"id": "d", "label": "Drink"}]},
            {"id": "q2", "type": "text", "text": "When?"}]});
        let b = blocks(&form);
        assert_eq!(b.len(), 3, "header, question, buttons; the text question goes on its own");
        assert_eq!(b[2]["elements"][0]["action_id"], "f|lunch|q1|d");
        assert_eq!(b[2]["elements"][1]["action_id"], "f|lunch|q1|__done");
    }
}
