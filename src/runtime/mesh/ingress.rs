//! Taking a message in (messaging.md §6): the recipient is on and visible
//! from the requester's scope, the crypto checks pass (verify message →
//! decrypt → verify payload, trust stamps re-made), the message is not a
//! replay, the sender passes the allow and block lists; then inline
//! attachments land in `imported/<sender>/`, the row is written and the
//! recipient's actor is told. Every refusal carries its HTTP status.

use std::net::IpAddr;
use std::sync::Arc;

use base64::Engine;
use serde_json::{Map, Value, json};

use super::{Mailbox, permits};
use crate::identity::message::{self, Policy, Refused, strip_trust};
use crate::runtime::agent::{AgentCommand, OwnerWork};
use crate::store::files::WriteOptions;
use crate::store::messages::Direction;
use crate::store::{Caller, Store};

/// Where a message came from.
#[derive(Debug, Clone, Copy)]
pub struct Origin {
    /// `directory`, `localhost`, `lan` or `public`.
    pub scope: &'static str,
    /// The peer's address (HTTP), for the return path.
    pub peer: Option<IpAddr>,
}

fn refuse(status: u16, error: impl Into<String>) -> Refused {
    Refused { status, error: error.into() }
}

/// A refusal's JSON body.
pub fn body(r: &Refused, extra: Option<Value>) -> Value {
    let mut b = json!({"error": r.error});
    if let (Some(Value::Object(x)), Some(o)) = (extra, b.as_object_mut()) {
        o.extend(x);
    }
    b
}

/// The visibility answer for a scope: `Err` with the 403 body's fields.
pub fn visible(cfg: &Value, scope: &str) -> Result<(), (Refused, Value)> {
    let vis = cfg["messaging"]["visibility"].as_str().unwrap_or("localhost");
    if permits(vis, scope) {
        return Ok(());
    }
    let error = if vis == "off" { "agent not accepting messages" } else { "visibility tier mismatch" };
    Err((refuse(403, error), json!({"visibility": vis, "scope": scope})))
}

/// Allow/block lists (DID-based): non-empty allow list ⇒ only those; else
/// a listed DID in the block list is refused; an unknown (non-DID) sender
/// with any list set is refused.
pub fn lists_admit(cfg: &Value, did: &str) -> Result<(), String> {
    let list = |k: &str| -> Vec<String> {
        cfg["messaging"][k]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    let (allow, block) = (list("allow_list"), list("block_list"));
    if allow.is_empty() && block.is_empty() {
        return Ok(());
    }
    if !did.starts_with("did:") {
        return Err(format!("{did} is not a DID and this agent keeps an allow or block list"));
    }
    if !allow.is_empty() {
        return if allow.iter().any(|a| a == did) { Ok(()) } else { Err(format!("{did} is not on the allow list")) };
    }
    if block.iter().any(|b| b == did) { Err(format!("{did} is blocked")) } else { Ok(()) }
}

fn iso_ms(s: Option<&str>) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(s?).ok().map(|t| t.timestamp_millis())
}

/// The message's `reply_to` with a loopback host replaced by the peer's
/// address (unless the peer is loopback itself).
pub fn return_path(reply_to: &str, peer: Option<IpAddr>) -> String {
    let Some(peer) = peer else { return reply_to.to_string() };
    let peer = match peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        p => p,
    };
    if peer.is_loopback() {
        return reply_to.to_string();
    }
    let Ok(mut url) = url::Url::parse(reply_to) else { return reply_to.to_string() };
    let loopback = match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(v4)) => v4.is_loopback(),
        Some(url::Host::Ipv6(v6)) => v6.is_loopback(),
        None => false,
    };
    if !loopback {
        return reply_to.to_string();
    }
    let host = match peer {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    if url.set_host(Some(&host)).is_err() {
        return reply_to.to_string();
    }
    url.to_string()
}

/// A file name safe as one path segment.
fn safe_name(s: &str) -> String {
    let n: String =
        s.chars().map(|c| if c.is_alphanumeric() || ".-_".contains(c) { c } else { '_' }).take(120).collect();
    let n = n.trim_start_matches('.');
    if n.is_empty() { "file".into() } else { n.to_string() }
}

/// Write inline attachments under `imported/<sender>/` (unique names).
pub(crate) fn import_attachments(store: &mut Store, sender: &str, list: &mut [Value]) {
    for a in list.iter_mut() {
        if a["transfer"] != "inline" {
            continue;
        }
        let Some(data) = a["data"].as_str() else { continue };
        let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(data) else {
            a["skipped"] = true.into();
            a["reason"] = "attachment data is not base64".into();
            continue;
        };
        let name = safe_name(a["filename"].as_str().unwrap_or("file"));
        let dir = format!("imported/{}", safe_name(sender));
        let (stem, ext) = match name.rsplit_once('.') {
            Some((s, e)) if !s.is_empty() => (s.to_string(), format!(".{e}")),
            _ => (name.clone(), String::new()),
        };
        let mut path = format!("{dir}/{name}");
        let mut n = 1;
        while store.file_stat(&path).ok().flatten().is_some() {
            path = format!("{dir}/{stem}-{n}{ext}");
            n += 1;
        }
        let opts = WriteOptions { mime_type: a["content_type"].as_str(), ..Default::default() };
        match store.file_write(Caller::Owner, &path, &bytes, &opts) {
            Ok(_) => {
                if let Some(o) = a.as_object_mut() {
                    o.remove("data");
                    o.insert("transfer".into(), "imported".into());
                    o.insert("path".into(), path.into());
                    o.insert("size_bytes".into(), bytes.len().into());
                }
            }
            Err(e) => {
                a["skipped"] = true.into();
                a["reason"] = e.to_string().into();
                if let Some(o) = a.as_object_mut() {
                    o.remove("data");
                }
            }
        }
    }
}

/// The inbox row of an accepted message (`flattenMessageToInbox`).
fn flatten(acc: &message::Accepted, original: &Value, return_path: String) -> Map<String, Value> {
    let m = &acc.message;
    let p = &m["payload"];
    let mut meta = p["meta"].clone();
    strip_trust(&mut meta);
    let mut meta = meta.as_object().cloned().unwrap_or_default();
    meta.insert("message_verified".into(), acc.message_verified.into());
    meta.insert("payload_verified".into(), acc.payload_verified.into());
    meta.insert("payload_encrypted".into(), acc.payload_encrypted.into());
    let s = |v: &Value| v.as_str().map(|x| Value::String(x.to_string())).unwrap_or(Value::Null);
    let mut row = Map::new();
    row.insert("message_id".into(), s(&m["id"]));
    row.insert("from".into(), s(&m["from"]));
    row.insert("to".into(), s(&m["to"]));
    row.insert("reply_to".into(), s(&m["reply_to"]));
    row.insert("network".into(), m["network"].as_str().unwrap_or("devnet").into());
    row.insert("thread_id".into(), s(&p["thread_id"]));
    row.insert("parent_id".into(), s(&p["parent_id"]));
    row.insert("subject".into(), s(&p["subject"]));
    let content = match &p["content"] {
        Value::String(t) => t.clone(),
        other => other.to_string(),
    };
    row.insert("content".into(), content.into());
    row.insert("content_type".into(), p["content_type"].as_str().unwrap_or("text/plain").into());
    if let Some(a) = p["attachments"].as_array().filter(|a| !a.is_empty()) {
        row.insert("attachments".into(), Value::String(Value::Array(a.clone()).to_string()));
    }
    row.insert("meta".into(), Value::String(Value::Object(meta).to_string()));
    let alias =
        p["sender_alias"].as_str().filter(|a| !["owner", "system", "user"].contains(&a.to_lowercase().as_str()));
    row.insert("sender_alias".into(), alias.map(Into::into).unwrap_or(Value::Null));
    row.insert("recipient_alias".into(), s(&p["recipient_alias"]));
    if acc.message_verified {
        row.insert("owner".into(), s(&m["meta"]["owner"]));
    }
    row.insert("card".into(), s(&m["meta"]["card"]));
    row.insert("return_path".into(), return_path.into());
    row.insert("source".into(), "mesh".into());
    row.insert("sent_at".into(), iso_ms(p["sent_at"].as_str()).map(Into::into).unwrap_or(Value::Null));
    row.insert("received_at".into(), crate::store::now_ms().into());
    row.insert("status".into(), "unread".into());
    let mut tomb = original.clone();
    tomb["payload"]["content"] = "[flattened]".into();
    if tomb["payload"]["attachments"].as_array().is_some_and(|a| !a.is_empty()) {
        tomb["payload"]["attachments"] = "[flattened]".into();
    }
    row.insert("original_message".into(), Value::String(tomb.to_string()));
    row
}

type Refusal = (Refused, Option<Value>);

fn blocking_failed(e: impl std::fmt::Display) -> Refusal {
    (refuse(500, format!("ingress task failed: {e}")), None)
}

/// Take `msg` into `mb`'s inbox: checks and crypto on the mailbox's
/// connection (off the async runtime), the inbox middleware on a runner of
/// the recipient, then attachments and the row. Returns the inbox row.
pub async fn accept(
    state: String,
    mb: Arc<Mailbox>,
    msg: Value,
    origin: Origin,
) -> Result<Map<String, Value>, Refusal> {
    if state == "off" {
        return Err((refuse(503, "Agent is off"), None));
    }
    let shape_ok = msg["from"].is_string()
        && msg["payload"].is_object()
        && match &msg["payload"]["content"] {
            Value::Null | Value::Bool(false) => false,
            Value::String(s) => !s.is_empty(),
            _ => true,
        };
    if !shape_ok {
        return Err((
            refuse(400, "a message is a JSON object with a string `from`, an object `payload` and `payload.content`"),
            None,
        ));
    }
    let original = msg.clone();
    let mb1 = mb.clone();
    let checked = tokio::task::spawn_blocking(move || {
        mb1.with_store(|store| -> Result<(Value, message::Accepted), Refusal> {
            let cfg = store.config_value().map_err(|e| (refuse(500, e.to_string()), None))?;
            visible(&cfg, origin.scope).map_err(|(r, extra)| (r, Some(extra)))?;
            let key = store.signing_key().ok().flatten();
            let acc = message::ingress(msg, key.as_ref(), Policy::of(&cfg["security"])).map_err(|r| (r, None))?;
            // A message signed for another agent is not this one's to take
            // (replaying it elsewhere would otherwise work).
            let to = acc.message["to"].as_str().unwrap_or_default();
            let mine = mb1.did();
            if to.starts_with("did:") && !mine.is_empty() && to != mine {
                return Err((refuse(403, "message is addressed to another agent"), None));
            }
            let from = acc.message["from"].as_str().unwrap_or_default();
            let id = acc.message["id"].as_str().unwrap_or_default();
            if !id.is_empty() && store.inbox_has(id, from).unwrap_or(false) {
                return Err((refuse(409, format!("message {id} was already received (replay)")), None));
            }
            lists_admit(&cfg, from).map_err(|e| (refuse(403, e), None))?;
            Ok((cfg, acc))
        })
    })
    .await
    .map_err(blocking_failed)?;
    let (cfg, mut acc) = checked.map_err(|e| (refuse(500, e), None))??;
    // Inbox middleware (runtime.md §10): may rewrite or reject.
    if cfg.pointer("/security/middleware/inbox").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
        let mut runner = (mb.runner)().ok_or_else(|| (refuse(500, "cannot run the inbox middleware"), None))?;
        let out =
            runner.middleware_coded(&cfg, "inbox", "/security/middleware/inbox", acc.message.clone(), Vec::new()).await;
        let _ = runner.store_into().close();
        match out {
            Ok(data) if data.is_object() => acc.message = data,
            Ok(_) => {}
            Err((code, reason)) => {
                return Err((refuse(code.unwrap_or(403), format!("rejected by inbox middleware: {reason}")), None));
            }
        }
    }
    let mb2 = mb.clone();
    let stored = tokio::task::spawn_blocking(move || {
        mb2.with_store(|store| -> Result<Map<String, Value>, Refusal> {
            let from = acc.message["from"].as_str().unwrap_or_default().to_string();
            let sender = acc.message["payload"]["sender_alias"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .unwrap_or_else(|| from.rsplit(':').next().unwrap_or("sender").chars().take(16).collect());
            // The whole message, inline attachment data included, is
            // archived first when inbox audit is on (best-effort, as in
            // the reference: a failed archive does not refuse the message).
            if store.audit_on(Direction::Inbox)
                && let Err(e) = store.audit_message(Direction::Inbox, &acc.message)
            {
                let _ = store.log("warn", "mesh", "audit_failed", &format!("inbox audit row not written: {e}"));
            }
            if let Some(list) = acc.message["payload"]["attachments"].as_array_mut() {
                import_attachments(store, &sender, list);
            }
            let rp = return_path(acc.message["reply_to"].as_str().unwrap_or_default(), origin.peer);
            let mut row = flatten(&acc, &original, rp);
            let inbox_id = store.inbox_insert(&row).map_err(|e| (refuse(500, e.to_string()), None))?;
            row.insert("id".into(), inbox_id.into());
            Ok(row)
        })
    })
    .await
    .map_err(blocking_failed)?;
    let row = stored.map_err(|e| (refuse(500, e), None))??;
    let told = row.clone();
    mb.notify(AgentCommand::With(OwnerWork(Box::new(move |ex| ex.inbox_arrived(told)))));
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_path_rewrites_only_loopback_for_remote_peers() {
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        let rt = "http://127.0.0.1:7295/agents/a/inbox";
        assert_eq!(return_path(rt, ip("192.168.1.9")), "http://192.168.1.9:7295/agents/a/inbox");
        assert_eq!(return_path(rt, ip("::ffff:10.0.0.2")), "http://10.0.0.2:7295/agents/a/inbox");
        assert_eq!(return_path(rt, ip("127.0.0.1")), rt);
        assert_eq!(return_path("http://localhost:1/x", ip("fd00::1")), "http://[fd00::1]:1/x");
        assert_eq!(return_path("http://example.com/x", ip("10.0.0.2")), "http://example.com/x");
    }

    #[test]
    fn lists() {
        let cfg = |allow: Value, block: Value| json!({"messaging": {"allow_list": allow, "block_list": block}});
        assert!(lists_admit(&cfg(Value::Null, Value::Null), "anyone").is_ok());
        assert!(lists_admit(&cfg(json!(["did:key:zA"]), Value::Null), "did:key:zA").is_ok());
        assert!(lists_admit(&cfg(json!(["did:key:zA"]), Value::Null), "did:key:zB").is_err());
        assert!(lists_admit(&cfg(json!([]), json!(["did:key:zB"])), "did:key:zB").unwrap_err().contains("blocked"));
        assert!(lists_admit(&cfg(json!([]), json!(["did:key:zB"])), "did:key:zC").is_ok());
        assert!(lists_admit(&cfg(json!([]), json!(["did:key:zB"])), "telegram:1").is_err());
    }

    /// Point 45: trust stamps are the runtime's, `owner` only when the
    /// message signature verified, reserved aliases dropped.
    #[test]
    fn the_inbox_row_keeps_only_what_was_verified() {
        let msg = json!({"id": "m1", "from": "did:key:zA", "to": "did:key:zB", "reply_to": "http://x/inbox",
            "meta": {"owner": "did:key:zOwner", "card": "http://x/card"},
            "payload": {"meta": {"message_verified": true, "k": 1}, "sender_alias": "Owner", "content": {"a": 1},
                "attachments": [], "sent_at": "2026-12-01T00:00:00.000Z"}});
        let acc = |verified| message::Accepted {
            message: msg.clone(),
            message_verified: verified,
            payload_verified: false,
            payload_encrypted: false,
        };
        let row = flatten(&acc(false), &msg, "http://x/inbox".into());
        assert!(row.get("owner").is_none(), "an unverified owner claim is dropped");
        assert_eq!(row["sender_alias"], Value::Null, "owner/system/user aliases are dropped");
        let meta: Value = serde_json::from_str(row["meta"].as_str().unwrap()).unwrap();
        assert_eq!(
            meta,
            json!({"k": 1, "message_verified": false, "payload_verified": false, "payload_encrypted": false})
        );
        assert_eq!(row["content"], r#"{"a":1}"#, "object content is stored as JSON text");
        assert_eq!(row["sent_at"], 1_796_083_200_000i64);
        let tomb: Value = serde_json::from_str(row["original_message"].as_str().unwrap()).unwrap();
        assert_eq!(tomb["payload"]["content"], "[flattened]");
        let row = flatten(&acc(true), &msg, "http://x/inbox".into());
        assert_eq!(row["owner"], "did:key:zOwner");
    }

    #[test]
    fn names_are_one_safe_segment() {
        assert_eq!(safe_name("../../etc/passwd"), "_.._etc_passwd");
        assert_eq!(safe_name(""), "file");
        assert_eq!(safe_name("report v2.pdf"), "report_v2.pdf");
    }
}
