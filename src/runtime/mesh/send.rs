//! Sending (messaging.md §5, tools.md §4): `msg_send` resolves the
//! recipient (reply by parent, local handle, DID, address), applies the
//! messaging mode and the sender's lists, reads attachments, builds the ALF
//! message, signs (and at level 2 encrypts) it, records an outbox row and
//! delivers it — to a mailbox of this runtime first, else by HTTP POST —
//! then records the outcome. Also `agent_discover`, and what happens when a
//! message lands (`message.received`, `on_inbox`).

use std::sync::Arc;

use base64::Engine;
use serde_json::{Map, Value, json};

use super::ingress::{self, Origin};
use super::{Mailbox, Mesh, ancestor_scope, card, permits};
use crate::channels::{OutFile, Outgoing};
use crate::identity::message::{self, strip_trust};
use crate::runtime::executor::Executor;
use crate::runtime::triggers::TriggerEvent;
use crate::store::messages::Direction;
use crate::tools::ToolOutput;

const FORM: &str = "application/vnd.adf.form+json";

/// A form's content must be JSON of the form schema (messaging.md §14).
fn check_form(content: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(content).map_err(|e| format!("form content is not JSON: {e}"))?;
    let id_ok = |s: &Value, max: usize| {
        s.as_str().is_some_and(|s| {
            !s.is_empty()
                && s.len() <= max
                && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        })
    };
    if !id_ok(&v["id"], 16) {
        return Err("form id must be 1–16 characters of [a-z0-9_-]".into());
    }
    let qs = v["questions"].as_array().ok_or("form needs questions")?;
    if qs.is_empty() || qs.len() > 10 {
        return Err("a form has 1 to 10 questions".into());
    }
    for q in qs {
        let ty = q["type"].as_str().unwrap_or("");
        if !["choice", "multi", "text"].contains(&ty) {
            return Err(format!("question type must be choice, multi or text, got \"{ty}\""));
        }
        let n = q["options"].as_array().map(Vec::len).unwrap_or(0);
        if ty != "text" && !(1..=12).contains(&n) {
            return Err("choice and multi questions have 1 to 12 options".into());
        }
    }
    if !["poll", "compact", "per_question"].contains(&v["render"].as_str().unwrap_or("")) {
        return Err("form render must be poll, compact or per_question".into());
    }
    Ok(())
}

fn s(v: &Value) -> Option<String> {
    v.as_str().filter(|s| !s.is_empty()).map(str::to_string)
}

impl Executor {
    pub fn set_mesh(&mut self, mesh: Arc<Mesh>) {
        self.mesh = Some(mesh);
    }

    /// Say on the bus that a row landed in the inbox.
    fn announce_received(&mut self, row: &Map<String, Value>, source: &str) {
        let meta: Value =
            row.get("meta").and_then(Value::as_str).and_then(|m| serde_json::from_str(m).ok()).unwrap_or_default();
        let size = row.get("content").and_then(Value::as_str).map(str::len).unwrap_or(0);
        self.emit(
            crate::protocol::kind::MESSAGE_RECEIVED,
            source,
            json!({"message_id": row.get("message_id"), "inbox_id": row.get("id"), "from": row.get("from"),
                "sender_alias": row.get("sender_alias"), "content_type": row.get("content_type"), "size": size,
                "subject": row.get("subject"), "source": row.get("source"),
                "verified": meta["message_verified"], "encrypted": meta["payload_encrypted"]}),
        );
    }

    /// Messages a channel brought in one batch (a catch-up): each is
    /// announced, and the agent is woken once for all of them.
    pub(crate) fn inbox_batch_arrived(&mut self, rows: Vec<Map<String, Value>>) {
        let n = rows.len();
        let Some(last) = rows.last().cloned() else { return };
        for row in &rows {
            self.announce_received(row, "system:adapter");
        }
        self.trigger(
            TriggerEvent {
                ty: "inbox",
                source: "system:adapter".into(),
                data: json!({"message": Value::Object(last), "batch": n}),
            },
            false,
        );
    }

    /// A row landed in the inbox (from any transport).
    pub(crate) fn inbox_arrived(&mut self, row: Map<String, Value>) {
        self.announce_received(&row, "system:mesh");
        self.trigger(
            TriggerEvent { ty: "inbox", source: "system:mesh".into(), data: json!({"message": Value::Object(row)}) },
            false,
        );
    }

    /// The agent-scope inbox wake (runtime.md §5.6), or `None` when nothing
    /// is unread any more (a system lambda already handled it).
    pub(crate) fn inbox_wake_text(&self) -> Option<String> {
        let c = self.store.inbox_counts().ok()?;
        if c["unread"].as_i64().unwrap_or(0) == 0 {
            return None;
        }
        let summary = json!({"unread": c["unread"], "read": c["read"], "unread_by_sender": c["unread_by_sender"]});
        Some(format!(
            "[Inbox notification] You have new messages in your inbox.\n{}\nUse msg_read to fetch and process your messages.",
            serde_json::to_string_pretty(&summary).unwrap_or_default()
        ))
    }

    fn handle_and_did(&self) -> (String, String) {
        let get = |k: &str| self.store.meta_get(k).ok().flatten().map(|m| m.value).unwrap_or_default();
        (get("adf_handle"), get("adf_did"))
    }

    /// The `chat_info` tool: a connected channel's chat, or why not (an
    /// answer, not an error).
    pub(crate) async fn chat_info(&mut self, input: &Value) -> ToolOutput {
        let adapter = input["adapter"].as_str().unwrap_or_default();
        let chat = input["chat_id"].as_str().map(str::to_string).unwrap_or_else(|| input["chat_id"].to_string());
        let limit = input["limit"].as_u64().unwrap_or(50).clamp(1, 100) as usize;
        let me = self.agent_id().to_string();
        let out = self.mesh.as_ref().and_then(|m| m.channels.outbound(&me, adapter));
        let Some(out) = out else {
            return ToolOutput::json(&json!({"supported": false,
                "reason": format!("no \"{adapter}\" channel adapter is connected to this agent")}));
        };
        match out.chat_info(&chat, limit).await {
            Ok(v) => ToolOutput::json(&v),
            Err(e) => ToolOutput::err(format!("chat_info on {adapter}: {e}")),
        }
    }

    /// The `msg_send` tool.
    pub(crate) async fn msg_send(&mut self, input: &Value) -> ToolOutput {
        match self.send_inner(input).await {
            Ok(t) => ToolOutput::ok(t),
            Err(e) => ToolOutput::err(e),
        }
    }

    /// The files `msg_send` names, read from the agent's files: each one's
    /// record (skipped with the reason when missing or over
    /// `max_file_write_bytes`) and, when read, its bytes.
    fn read_attachments(&self, paths: &Value, max: u64) -> Vec<(Value, Option<OutFile>)> {
        let mut out = Vec::new();
        for p in paths.as_array().map(Vec::as_slice).unwrap_or(&[]) {
            let path = p.as_str().unwrap_or_default();
            let filename = path.rsplit('/').next().unwrap_or(path).to_string();
            let skipped =
                |reason: String| json!({"filename": filename, "path": path, "skipped": true, "reason": reason});
            match self.store.file_stat(path) {
                Ok(Some(e)) if e.size > max => {
                    out.push((skipped(format!("larger than max_file_write_bytes ({max})")), None));
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    out.push((skipped(e.to_string()), None));
                    continue;
                }
            }
            match self.store.file_read(path) {
                Ok((entry, bytes)) => {
                    let mime = entry.mime_type.clone().unwrap_or_else(|| "application/octet-stream".into());
                    let d = json!({"filename": filename, "content_type": entry.mime_type, "transfer": "inline", "size_bytes": bytes.len()});
                    out.push((d, Some(OutFile { name: filename.clone(), mime, data: bytes })));
                }
                Err(e) => out.push((skipped(e.to_string()), None)),
            }
        }
        out
    }

    /// Send on a connected channel adapter and record it in the outbox.
    async fn send_on_channel(
        &mut self,
        mesh: &Arc<super::Mesh>,
        (kind, chat): (&str, &str),
        m: Outgoing,
        attachments: Vec<Value>,
        (parent, thread): (Option<String>, Option<String>),
    ) -> Result<String, String> {
        let me = self.agent_id().to_string();
        let out = mesh.channels.outbound(&me, kind).ok_or_else(|| {
            format!(
                "no {kind} channel adapter is connected for {kind}:{chat} (the owner adds one: adf adapters add FILE {kind})"
            )
        })?;
        let (handle, did) = self.handle_and_did();
        let mut row = Map::new();
        for (k, v) in [
            ("from", json!(did)),
            ("to", json!(format!("{kind}:{chat}"))),
            ("network", json!(kind)),
            ("thread_id", json!(thread)),
            ("parent_id", json!(parent)),
            ("subject", json!(m.subject)),
            ("content", json!(m.text)),
            ("content_type", json!(m.content_type)),
            ("sender_alias", json!(handle)),
            ("created_at", json!(crate::store::now_ms())),
            ("status", json!("pending")),
        ] {
            row.insert(k.into(), v);
        }
        if !attachments.is_empty() {
            row.insert("attachments".into(), Value::Array(attachments.clone()).to_string().into());
        }
        let out_id = self.store.outbox_insert(&row).map_err(|e| e.to_string())?;
        match out.send_message(chat, &m).await {
            Ok(sent) => {
                mesh.channels.sent(&me, kind);
                self.store.outbox_finish(&out_id, "delivered", None).map_err(|e| e.to_string())?;
                self.emit(
                    crate::protocol::kind::MESSAGE_SENT,
                    "system:mesh",
                    json!({"outbox_id": out_id, "to": format!("{kind}:{chat}"), "channel": kind, "platform_id": sent, "from": handle}),
                );
                let files = attachments.iter().filter(|a| a["skipped"] != true).count();
                let mut said = format!("Message sent to {kind}:{chat} (platform message {sent})");
                if files > 0 {
                    said.push_str(&format!(" with {files} attachment(s)"));
                }
                said.push('.');
                for a in attachments.iter().filter(|a| a["skipped"] == true) {
                    said.push_str(&format!(
                        " Not attached: {} ({}).",
                        a["path"].as_str().unwrap_or(""),
                        a["reason"].as_str().unwrap_or("")
                    ));
                }
                Ok(said)
            }
            Err(e) => {
                self.store.outbox_finish(&out_id, "failed", None).map_err(|e| e.to_string())?;
                let _ = self.log("warn", "adapter", "delivery_failed", &format!("{kind}:{chat}: {e}"));
                Err(format!("Delivery to {kind}:{chat} failed: {e}"))
            }
        }
    }

    async fn send_inner(&mut self, input: &Value) -> Result<String, String> {
        let mesh =
            self.mesh.clone().ok_or("messaging needs the runtime's mesh (this agent is not loaded in a fleet)")?;
        let cfg = self.store.config_value().map_err(|e| e.to_string())?;
        let content = input["content"].as_str().unwrap_or_default().to_string();
        let content_type = s(&input["content_type"]);
        if content_type.as_deref() == Some(FORM) {
            check_form(&content)?;
        }
        let mode = cfg["messaging"]["mode"].as_str().unwrap_or("proactive");
        if mode == "listen_only" {
            return Err("messaging.mode is listen_only: this agent does not send messages".into());
        }
        let mut recipient = s(&input["recipient"]);
        let mut address = s(&input["address"]);
        let mut thread = s(&input["thread_id"]);
        let parent = s(&input["parent_id"]);
        // The message replied to, read once: its sender, return path,
        // thread, and what a channel recorded about it.
        let mut parent_row = None;
        if let Some(pid) = &parent {
            let row = self
                .store
                .inbox_get(pid)
                .map_err(|e| e.to_string())?
                .ok_or(format!("No inbox message with id {pid}"))?;
            recipient = s(&row["from"]).or_else(|| s(&row["sender_alias"]));
            address = s(&row["return_path"]).or_else(|| s(&row["reply_to"])).filter(|a| a.starts_with("http"));
            thread = thread.or_else(|| s(&row["thread_id"])).or_else(|| Some(pid.clone()));
            parent_row = Some(row);
        } else if mode == "respond_only" {
            return Err("messaging.mode is respond_only: reply to an inbox message with parent_id".into());
        }
        // A channel address (`telegram:<chat>`), given or replied to: the
        // agent's adapter sends it, threaded under the message replied to.
        if let Some((kind, chat)) = recipient.as_deref().and_then(crate::channels::address) {
            // What the channel recorded about the message replied to.
            let mut replied = Value::Null;
            if let Some(row) = &parent_row {
                replied = row
                    .get("source_context")
                    .and_then(Value::as_str)
                    .and_then(|c| serde_json::from_str::<Value>(c).ok())
                    .filter(Value::is_object)
                    .unwrap_or_else(|| json!({}));
                if let Some(subject) = row.get("subject").filter(|v| v.is_string()) {
                    replied["subject"] = subject.clone();
                }
            }
            let max = cfg["limits"]["max_file_write_bytes"].as_u64().unwrap_or(5_000_000);
            let (records, files): (Vec<Value>, Vec<Option<OutFile>>) =
                self.read_attachments(&input["attachments"], max).into_iter().unzip();
            let mut hints = input["message_meta"].clone();
            strip_trust(&mut hints);
            let m = Outgoing {
                text: content,
                content_type: content_type.unwrap_or_else(|| "text/plain".into()),
                reply_to: replied["message_id"].as_str().map(str::to_string),
                replied,
                subject: s(&input["subject"]),
                hints,
                files: files.into_iter().flatten().collect(),
            };
            return self.send_on_channel(&mesh, (kind, chat), m, records, (parent, thread)).await;
        }
        let (handle, did) = self.handle_and_did();
        let my_dir = self.store.canonical_path().parent().map(std::path::Path::to_path_buf).unwrap_or_default();
        let mut local: Option<Arc<Mailbox>> = None;
        let mut to = recipient.clone().unwrap_or_default();
        if address.is_none() && parent.is_none() && !to.is_empty() && !to.contains(':') {
            let mb = mesh.find(&to).ok_or("No agent with matching handle or DID")?;
            let scope = ancestor_scope(&my_dir, &mb.dir);
            let vis = mb.with_store(|st| {
                st.config_value().map(|c| c["messaging"]["visibility"].as_str().unwrap_or("localhost").to_string())
            })?;
            let vis = vis.map_err(|e| e.to_string())?;
            if !permits(&vis, scope) {
                return Err(if vis == "off" {
                    "agent not accepting messages".into()
                } else {
                    "visibility tier mismatch".into()
                });
            }
            if !mb.did().is_empty() {
                to = mb.did();
            }
            local = Some(mb);
        } else if to.starts_with("did:") {
            local = mesh.find(&to);
        }
        if local.is_none()
            && let Some(a) = &address
        {
            local = mesh.local_for_address(a);
        }
        let me = self.agent_id().to_string();
        if local.is_none() && address.is_none() && mesh.sockets.to_did(&me, &to).is_none() {
            if to.contains(':') && !to.starts_with("did:") {
                return Err(format!("no channel adapter is connected for {to}"));
            }
            return Err("a mesh recipient needs an address (or a local handle, or parent_id)".into());
        }
        if to.is_empty() {
            to = local.as_ref().map(|m| m.did()).unwrap_or_default();
        }
        if to.starts_with("did:") {
            ingress::lists_admit(&cfg, &to).map_err(|e| format!("refused by this agent's lists: {e}"))?;
        }
        // Attachments: inline on the wire, recorded without data.
        let max = cfg["limits"]["max_file_write_bytes"].as_u64().unwrap_or(5_000_000);
        let mut wire_att = Vec::new();
        let mut stored_att = Vec::new();
        for (record, file) in self.read_attachments(&input["attachments"], max) {
            if let Some(f) = file {
                let mut w = record.clone();
                w["data"] = base64::engine::general_purpose::STANDARD.encode(&f.data).into();
                wire_att.push(w);
            }
            stored_att.push(record);
        }
        let base = mesh.base_url();
        let reply_to = s(&cfg["card"]["endpoints"]["inbox"])
            .or_else(|| s(&cfg["reply_to"]))
            .or_else(|| base.as_ref().map(|b| format!("{b}/agents/{handle}/inbox")))
            .unwrap_or_else(|| did.clone());
        let now = crate::store::now_iso();
        let id = crate::store::create::nanoid(20);
        let mut msg_meta = input["message_meta"].clone();
        strip_trust(&mut msg_meta);
        let mut meta = msg_meta.as_object().cloned().unwrap_or_default();
        if let Some(b) = &base {
            meta.insert("card".into(), format!("{b}/agents/{handle}/card").into());
        }
        let mut payload = Map::new();
        let mut pmeta = input["meta"].clone();
        strip_trust(&mut pmeta);
        if pmeta.is_object() {
            payload.insert("meta".into(), pmeta.clone());
        }
        payload.insert("sender_alias".into(), handle.clone().into());
        if let Some(l) = &local {
            payload.insert("recipient_alias".into(), l.handle.clone().into());
        }
        if let Some(t) = &thread {
            payload.insert("thread_id".into(), t.clone().into());
        }
        payload.insert("parent_id".into(), parent.clone().map(Value::String).unwrap_or(Value::Null));
        if let Some(sub) = s(&input["subject"]) {
            payload.insert("subject".into(), sub.into());
        }
        payload.insert("content".into(), content.clone().into());
        if let Some(ct) = &content_type {
            payload.insert("content_type".into(), ct.clone().into());
        }
        payload.insert("attachments".into(), Value::Array(wire_att));
        payload.insert("sent_at".into(), now.clone().into());
        let network = cfg["messaging"]["network"].as_str().unwrap_or("devnet").to_string();
        let mut msg = json!({"version": "1.0", "network": network, "id": id, "timestamp": now, "from": if did.is_empty() { handle.clone() } else { did.clone() },
            "to": to, "reply_to": reply_to, "meta": Value::Object(meta.clone()), "payload": Value::Object(payload)});
        // Outbox middleware (runtime.md §10): before signing; may rewrite the
        // message and its address, or reject.
        if cfg.pointer("/security/middleware/outbox").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
            let method = if local.is_some() { "local" } else { "http" };
            let data =
                json!({"message": msg, "transport": {"address": address, "method": method}, "agent": {"did": did}});
            match self.middleware_coded(&cfg, "outbox", "/security/middleware/outbox", data, Vec::new()).await {
                Ok(d) => {
                    if d["message"].is_object() {
                        msg = d["message"].clone();
                        strip_trust(&mut msg["meta"]);
                    }
                    if let Some(a) = d["transport"]["address"].as_str().filter(|a| Some(*a) != address.as_deref()) {
                        address = Some(a.to_string());
                        local = mesh.local_for_address(a);
                    }
                }
                Err((_, reason)) => return Err(format!("Rejected by outbox middleware: {reason}")),
            }
        }
        let level = cfg["security"]["level"].as_u64().unwrap_or(0).min(3) as u8;
        let key = self.store.signing_key().map_err(|e| e.to_string())?;
        // Same-runtime recipients decrypt with their key when it is open;
        // a locked one is handed the signed plaintext (it never leaves
        // this process).
        let encrypt = match &local {
            Some(mb) => mb.with_store(|st| st.signing_key().ok().flatten().is_some()).unwrap_or(false),
            None => true,
        };
        let original = msg.clone();
        message::egress(&mut msg, key.as_ref(), level, encrypt).map_err(|r| format!("{} ({})", r.error, r.status))?;
        // The outbox row, pending until the transport answers.
        let mut tomb = original;
        tomb["payload"]["content"] = "[flattened]".into();
        // The wire attachments (inline data) leave the tombstone; the
        // outbox audit may still want them.
        let sent_att = if stored_att.is_empty() {
            Value::Null
        } else {
            std::mem::replace(&mut tomb["payload"]["attachments"], "[flattened]".into())
        };
        let mut row = Map::new();
        for (k, v) in [
            ("message_id", json!(id)),
            ("from", msg["from"].clone()),
            ("to", json!(to)),
            ("address", json!(address.clone().unwrap_or_default())),
            ("reply_to", json!(reply_to)),
            ("network", json!(network)),
            ("thread_id", json!(thread)),
            ("parent_id", json!(parent)),
            ("subject", input["subject"].clone()),
            ("content", json!(content)),
            ("content_type", json!(content_type.clone().unwrap_or_else(|| "text/plain".into()))),
            ("meta", if pmeta.is_object() { json!(pmeta.to_string()) } else { Value::Null }),
            ("sender_alias", json!(handle)),
            ("recipient_alias", json!(local.as_ref().map(|l| l.handle.clone()))),
            ("card", meta.get("card").cloned().unwrap_or(Value::Null)),
            ("return_path", json!(reply_to)),
            ("created_at", json!(crate::store::now_ms())),
            ("status", json!("pending")),
            ("original_message", json!(tomb.to_string())),
        ] {
            row.insert(k.into(), v);
        }
        if !stored_att.is_empty() {
            row.insert("attachments".into(), Value::String(Value::Array(stored_att.clone()).to_string()));
        }
        // Outbox audit: the message as sent, with its attachments' data
        // inline even when the payload travels encrypted.
        if self.store.audit_on(Direction::Outbox) {
            let mut audited = msg.clone();
            if sent_att.as_array().is_some_and(|a| !a.is_empty()) && audited["payload"].is_object() {
                audited["payload"]["attachments"] = sent_att;
            }
            if let Err(e) = self.store.audit_message(Direction::Outbox, &audited) {
                let _ = self.store.log("warn", "mesh", "audit_failed", &format!("outbox audit row not written: {e}"));
            }
        }
        let out_id = self.store.outbox_insert(&row).map_err(|e| e.to_string())?;
        row.insert("id".into(), out_id.clone().into());
        let outcome: Result<Option<u16>, (Option<u16>, String)> = match local {
            Some(mb) => {
                let state = mesh.state_of(&mb.id);
                let scope = ancestor_scope(&my_dir, &mb.dir);
                match ingress::accept(state, mb, msg, Origin { scope, peer: None }).await {
                    Ok(_) => Ok(None),
                    Err((r, _)) => Err((Some(r.status), r.error)),
                }
            }
            // An open socket to the recipient's proven DID first
            // (messaging.md §5), then HTTP.
            None if let Some(sock) = mesh.sockets.to_did(&me, &to)
                && sock.send(crate::runtime::mesh::ws::Frame::Text(msg.to_string())).await.is_ok() =>
            {
                Ok(None)
            }
            None if address.is_none() => Err((None, format!("the socket to {to} closed and there is no address"))),
            None => {
                let url = address.clone().unwrap_or_default();
                match mesh.http.post(&url).json(&msg).send().await {
                    Ok(resp) if resp.status().is_success() => Ok(Some(resp.status().as_u16())),
                    Ok(resp) => {
                        let code = resp.status().as_u16();
                        let text = resp.text().await.unwrap_or_default();
                        let why =
                            serde_json::from_str::<Value>(&text).ok().and_then(|v| s(&v["error"])).unwrap_or(text);
                        Err((Some(code), why))
                    }
                    Err(e) => Err((None, format!("cannot reach {url}: {e}"))),
                }
            }
        };
        let atts = stored_att.iter().filter(|a| a["skipped"] != true).count();
        let with = if atts > 0 { format!(" with {atts} attachment(s)") } else { String::new() };
        match outcome {
            Ok(code) => {
                self.store.outbox_finish(&out_id, "delivered", code).map_err(|e| e.to_string())?;
                row.insert("status".into(), "delivered".into());
                self.emit(
                    crate::protocol::kind::MESSAGE_SENT,
                    "system:mesh",
                    json!({"message_id": id, "status_code": code, "to": to, "to_alias": row.get("recipient_alias"), "from": handle}),
                );
                self.trigger(
                    TriggerEvent {
                        ty: "outbox",
                        source: "system:mesh".into(),
                        data: json!({"message": Value::Object(row)}),
                    },
                    false,
                );
                let status = code.map(|c| c.to_string()).unwrap_or_else(|| "delivered".into());
                Ok(format!("Message sent to {to}. Status: {status}.{with}"))
            }
            Err((code, why)) => {
                self.store.outbox_finish(&out_id, "failed", code).map_err(|e| e.to_string())?;
                self.emit(
                    crate::protocol::kind::MESSAGE_DELIVERY_FAILED,
                    "system:mesh",
                    json!({"message_id": id, "status_code": code, "to": to, "to_alias": row.get("recipient_alias"), "error": why}),
                );
                let _ = self.log("warn", "egress", "delivery_failed", &format!("{to}: {why}"));
                let code = code.map(|c| format!(" ({c})")).unwrap_or_default();
                Err(format!("Delivery to {to} failed{code}: {why}"))
            }
        }
    }

    /// The `agent_discover` tool.
    pub(crate) async fn agent_discover(&mut self, input: &Value) -> ToolOutput {
        let Some(mesh) = self.mesh.clone() else {
            return ToolOutput::err("discovery needs the runtime's mesh (this agent is not loaded in a fleet)");
        };
        let me = self.agent_id().to_string();
        let my_dir = self.store.canonical_path().parent().map(std::path::Path::to_path_buf).unwrap_or_default();
        let inp = input.clone();
        let m2 = mesh.clone();
        let local = tokio::task::spawn_blocking(move || local_cards(&m2, &me, &my_dir, &inp)).await.unwrap_or_default();
        let mut cards = local;
        if input["scope"] == "all" {
            cards.extend(remote_cards(&mesh, input).await);
        }
        if cards.is_empty() {
            return ToolOutput::ok("No other agents are reachable from your current scope.");
        }
        ToolOutput::json(&Value::Array(cards))
    }
}

fn matches(card: &Value, input: &Value) -> bool {
    let has = |k: &str| {
        input[k]
            .as_str()
            .is_none_or(|needle| card[k].as_str().unwrap_or("").to_lowercase().contains(&needle.to_lowercase()))
    };
    let vis_ok =
        input["visibility"].as_array().is_none_or(|l| l.iter().any(|v| v.as_str() == card["visibility"].as_str()));
    has("handle") && has("description") && vis_ok
}

/// Cards of this runtime's agents reachable from `me`.
pub fn local_cards(mesh: &Mesh, me: &str, my_dir: &std::path::Path, input: &Value) -> Vec<Value> {
    let base = mesh.base_url().unwrap_or_else(|| "http://127.0.0.1:7295".into());
    let subdirs = input["include_subdirectories"].as_bool().unwrap_or(true);
    let mut out = Vec::new();
    for mb in mesh.mailboxes() {
        if mb.id == me {
            continue;
        }
        let Ok(Some((cfg, key, atts))) = mb.with_store(|st| {
            let cfg = st.config_value().ok()?;
            Some((cfg, st.signing_key().ok().flatten(), st.attestations().unwrap_or_default()))
        }) else {
            continue;
        };
        let vis = cfg["messaging"]["visibility"].as_str().unwrap_or("localhost").to_string();
        if !permits(&vis, ancestor_scope(my_dir, &mb.dir)) {
            continue;
        }
        let in_sub = mb.dir != my_dir && mb.dir.starts_with(my_dir);
        if in_sub && !subdirs {
            continue;
        }
        let mut c = card::build(&cfg, &mb.did(), &mb.handle, &atts, key.as_ref(), &base);
        c["in_subdirectory"] = in_sub.into();
        c["visibility"] = vis.into();
        c["source"] = "local-runtime".into();
        c["status"] = mesh.state_of(&mb.id).into();
        if matches(&c, input) {
            out.push(c);
        }
    }
    out
}

/// Cards from the manually listed peer runtimes, decorated.
async fn remote_cards(mesh: &Mesh, input: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for (peer, source) in mesh.peers() {
        let req = mesh.http.get(format!("{peer}/agents")).timeout(std::time::Duration::from_millis(2500));
        let Ok(resp) = req.send().await else { continue };
        let Ok(Value::Array(list)) = resp.json::<Value>().await else { continue };
        for mut c in list {
            c["source"] = source.into();
            c["card_verified"] = card::verify(&c).into();
            let owner = c["attestations"]
                .as_array()
                .and_then(|a| {
                    a.iter().find(|x| {
                        x["role"] == "owner"
                            && crate::identity::attest::verify(x, c["did"].as_str(), chrono::Utc::now()).is_ok()
                    })
                })
                .cloned();
            c["owner_attested"] = owner.is_some().into();
            if let Some(o) = &owner {
                c["attested_owner_did"] = o["issuer"].clone();
            }
            if c.get("visibility").is_none() {
                c["visibility"] = "lan".into();
            }
            if matches(&c, input) {
                out.push(c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_are_checked() {
        let ok = r#"{"id":"f1","questions":[{"id":"q","text":"?","type":"choice","options":[{"id":"a","label":"A"}]}],"render":"poll"}"#;
        check_form(ok).unwrap();
        assert!(check_form("not json").is_err());
        assert!(check_form(&ok.replace("poll", "grid")).is_err());
        assert!(check_form(&ok.replace("\"f1\"", "\"F1!\"")).is_err());
        assert!(check_form(&ok.replace(r#","options":[{"id":"a","label":"A"}]"#, "")).is_err());
    }
}
