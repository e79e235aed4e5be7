//! Reading mail (IMAP through async-imap): log in over TLS (implicit or
//! STARTTLS), read every unseen message of the folders as one batch, put
//! each in the inbox (policy, de-duplication by Message-ID), mark them
//! seen only then, and wait for more with IDLE where the server has it
//! (polling where it does not, or with several folders). The wait is at
//! most 30 s, so a dead connection is found and restarted with back-off.
//!
//! Mail is read as text (HTML converted, a plain part preferred), at most
//! `MAX_TEXT` characters of it; a message over `limits.max_message_size`
//! is read as its headers with a note, attachments over
//! `limits.max_attachment_size` are recorded as skipped: nothing arrives
//! silently changed or dropped.

use std::sync::Arc;
use std::time::Duration;

use async_imap::{Client, Session};
use base64::Engine;
use futures_util::TryStreamExt;
use mail_parser::{Address, MessageParser, MimeHeaders};
use serde_json::{Map, Value, json};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::{Account, Shared};
use crate::channels::{Inbound, Policy, StatusCell, deliver_one, fail, forms, notify, set_state};
use crate::runtime::mesh::Mailbox;

type Conn = Session<TlsStream<TcpStream>>;

/// The longest text taken from one message (characters).
const MAX_TEXT: usize = 100_000;
/// The longest a connection waits without a word from the server.
const HEALTH: Duration = Duration::from_secs(30);
/// Messages fetched per round trip.
const CHUNK: usize = 25;

/// A message as fetched: its whole source, or only its headers when it is
/// over the size limit (then its size).
pub(super) struct Fetched {
    pub uid: u32,
    pub raw: Vec<u8>,
    pub oversize: Option<u64>,
}

fn addresses(a: Option<&Address>) -> Vec<(String, Option<String>)> {
    a.into_iter()
        .flat_map(|a| a.iter())
        .filter_map(|x| Some((x.address()?.to_lowercase(), x.name().map(str::to_string))))
        .collect()
}

fn text_list(v: &mail_parser::HeaderValue) -> Vec<String> {
    match v {
        mail_parser::HeaderValue::Text(t) => vec![t.to_string()],
        mail_parser::HeaderValue::TextList(l) => l.iter().map(|t| t.to_string()).collect(),
        _ => Vec::new(),
    }
}

fn truncate(mut text: String) -> String {
    if let Some((cut, _)) = text.char_indices().nth(MAX_TEXT) {
        text.truncate(cut);
        text.push_str(&format!("\n[truncated: the message is longer than {MAX_TEXT} characters]"));
    }
    text
}

/// A fetched message in the framework's terms, or why it cannot be.
pub(super) fn parse(f: &Fetched, folder: &str, validity: u32, acct: &Account) -> Result<Inbound, String> {
    let msg = MessageParser::default().parse(&f.raw).ok_or("not a readable message")?;
    let (from, name) = addresses(msg.from()).into_iter().next().ok_or("no From address")?;
    let to = addresses(msg.to());
    let cc = addresses(msg.cc());
    let mut attachments = Vec::new();
    let mut text = match f.oversize {
        Some(size) => {
            format!("[a message of {size} bytes, over the {} byte limit: only its headers were read]", acct.max_message)
        }
        None => truncate(msg.body_text(0).map(|t| t.trim().to_string()).unwrap_or_default()),
    };
    if f.oversize.is_none() {
        for (n, part) in msg.attachments().enumerate() {
            let name = part.attachment_name().map(str::to_string).unwrap_or_else(|| format!("attachment-{}", n + 1));
            let mime = part
                .content_type()
                .map(|c| match c.subtype() {
                    Some(s) => format!("{}/{s}", c.ctype()),
                    None => c.ctype().to_string(),
                })
                .unwrap_or_else(|| "application/octet-stream".into());
            let data = part.contents();
            if data.len() as u64 > acct.max_file {
                attachments.push(json!({"filename": name, "content_type": mime, "skipped": true,
                    "reason": format!("{} bytes, over the {} byte limit", data.len(), acct.max_file)}));
            } else {
                attachments.push(json!({"filename": name, "content_type": mime, "transfer": "inline",
                    "size_bytes": data.len(), "data": base64::engine::general_purpose::STANDARD.encode(data)}));
            }
        }
    }
    if text.is_empty() {
        text = if attachments.is_empty() { "[an empty message]".into() } else { "[attachments]".into() };
    }
    let uid_id = format!("{folder}-{validity}-{}", f.uid);
    let message_id = msg.message_id().map(str::to_string).unwrap_or(uid_id);
    let in_reply_to = text_list(msg.in_reply_to()).into_iter().next();
    let references = text_list(msg.references());
    let subject = msg.subject().unwrap_or_default().to_string();
    let root = references.first().cloned().unwrap_or_else(|| message_id.clone());
    let list = |v: &[(String, Option<String>)]| v.iter().map(|(a, _)| a.clone()).collect::<Vec<_>>();
    let mut context = Map::new();
    for (k, v) in [
        ("to", json!(list(&to))),
        ("cc", json!(list(&cc))),
        ("in_reply_to", json!(in_reply_to)),
        ("references", json!(references)),
        ("subject", json!(subject)),
        ("name", json!(name)),
        ("folder", json!(folder)),
        ("uid", json!(f.uid)),
    ] {
        context.insert(k.into(), v);
    }
    let mut extra = Map::new();
    extra.insert("subject".into(), subject.clone().into());
    extra.insert("thread_id".into(), format!("email:{root}").into());
    // The visible recipients are the thread's participants.
    let everyone: Vec<&(String, Option<String>)> = to.iter().chain(cc.iter()).collect();
    if everyone.len() > 1 {
        let participants: Vec<Value> = everyone.iter().take(20).map(|(a, n)| json!({"id": a, "name": n})).collect();
        extra.insert(
            "meta".into(),
            json!({"group": {"platform": "email", "chat_id": format!("email:{root}"), "chat_type": "thread",
                "title": subject, "participants": participants, "participants_scope": "all"}}),
        );
    }
    let headers = String::from_utf8_lossy(&f.raw[..msg.root_part().raw_body_offset().min(f.raw.len() as u32) as usize])
        .chars()
        .take(64 * 1024)
        .collect::<String>();
    Ok(Inbound {
        kind: "email",
        chat_id: from.clone(),
        chat_type: "email".into(),
        group: false,
        mentioned: false,
        message_id,
        sender_id: from,
        sender_name: String::new(),
        text,
        reply_to_message_id: in_reply_to,
        sent_at_ms: msg.date().map(|d| d.to_timestamp() * 1000),
        raw: json!({"folder": folder, "uid": f.uid, "headers": headers}),
        context,
        attachments,
        extra,
    })
}

/// A reply to a form this channel sent, from whom it went to: its answers
/// (or why they are not answers) replace the text.
fn answer_form(m: &mut Inbound, shared: &Shared) {
    let mut replied: Vec<String> = m.reply_to_message_id.iter().cloned().collect();
    replied.extend(
        m.context
            .get("references")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string)),
    );
    if let Some(form) = shared.form_for(&m.sender_id, &replied) {
        forms::apply_reply(&form, m);
    }
}

async fn login(a: &Account) -> Result<Conn, String> {
    let s = &a.imap;
    let tcp = tokio::time::timeout(HEALTH, TcpStream::connect((s.host.as_str(), s.port)))
        .await
        .map_err(|_| format!("IMAP {s}: no answer in 30 s"))?
        .map_err(|e| format!("IMAP {s}: {e}"))?;
    // The roots are read at each connect: a machine without them fails
    // here, with the cause, and backs off.
    let config = super::tls::client_config(a.extra_roots.clone()).map_err(|e| format!("IMAP {s}: {e}"))?;
    let client = if s.implicit_tls {
        let tls = super::tls::wrap(&config, &s.host, tcp).await.map_err(|e| format!("IMAP {e}"))?;
        let mut c = Client::new(tls);
        c.read_response().await.map_err(|e| format!("IMAP {s}: {e}"))?.ok_or(format!("IMAP {s}: closed"))?;
        c
    } else {
        let mut c = Client::new(tcp);
        c.read_response().await.map_err(|e| format!("IMAP {s}: {e}"))?.ok_or(format!("IMAP {s}: closed"))?;
        c.run_command_and_check_ok("STARTTLS", None)
            .await
            .map_err(|e| format!("IMAP {s}: STARTTLS refused ({e}); adf does not read mail without TLS"))?;
        let tls = super::tls::wrap(&config, &s.host, c.into_inner()).await.map_err(|e| format!("IMAP {e}"))?;
        Client::new(tls)
    };
    client.login(&a.username, &a.password).await.map_err(|(e, _)| format!("IMAP login as {} refused: {e}", a.username))
}

/// Run the channel until it is stopped: connect, catch up, wait, and on
/// any failure say why and back off.
pub(super) async fn run(acct: Arc<Account>, shared: Arc<Shared>, mb: Arc<Mailbox>, policy: Policy, status: StatusCell) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let why = session(&acct, &shared, &mb, &policy, &status, &mut backoff).await;
        backoff = fail(&mb, &status, "email_error", &why, None, backoff).await;
    }
}

/// One connection's life; returns why it ended.
async fn session(
    acct: &Arc<Account>,
    shared: &Arc<Shared>,
    mb: &Arc<Mailbox>,
    policy: &Policy,
    status: &StatusCell,
    backoff: &mut Duration,
) -> String {
    let mut s = match login(acct).await {
        Ok(s) => s,
        Err(e) => return e,
    };
    let idle =
        acct.idle && acct.folders.len() == 1 && s.capabilities().await.map(|c| c.has_str("IDLE")).unwrap_or(false);
    loop {
        for folder in &acct.folders {
            if let Err(e) = catch_up(&mut s, folder, acct, shared, mb, policy, status).await {
                return e;
            }
        }
        set_state(status, "connected", None);
        *backoff = Duration::from_secs(1);
        if idle {
            let mut h = s.idle();
            if let Err(e) = h.init().await {
                return format!("IMAP IDLE: {e}");
            }
            let (wait, _stop) = h.wait_with_timeout(acct.poll.min(HEALTH));
            if let Err(e) = wait.await {
                return format!("IMAP IDLE: {e}");
            }
            s = match h.done().await {
                Ok(s) => s,
                Err(e) => return format!("IMAP IDLE: {e}"),
            };
        } else {
            let mut waited = Duration::ZERO;
            while waited < acct.poll {
                let step = (acct.poll - waited).min(HEALTH);
                tokio::time::sleep(step).await;
                waited += step;
                if let Err(e) = s.noop().await {
                    return format!("IMAP: {e}");
                }
            }
        }
    }
}

fn uid_set(uids: &[u32]) -> String {
    uids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Deliver a folder's unseen mail, then mark it seen; the agent is told
/// once for all of it.
#[allow(clippy::too_many_arguments)]
async fn catch_up(
    s: &mut Conn,
    folder: &str,
    acct: &Arc<Account>,
    shared: &Arc<Shared>,
    mb: &Arc<Mailbox>,
    policy: &Policy,
    status: &StatusCell,
) -> Result<(), String> {
    let mbox = s.select(folder).await.map_err(|e| format!("IMAP SELECT {folder}: {e}"))?;
    let validity = mbox.uid_validity.unwrap_or(0);
    let mut uids: Vec<u32> =
        s.uid_search("UNSEEN").await.map_err(|e| format!("IMAP SEARCH {folder}: {e}"))?.into_iter().collect();
    uids.sort_unstable();
    let mut rows = Vec::new();
    let mut failed = None;
    for chunk in uids.chunks(CHUNK) {
        let sizes: Vec<_> = fetch(s, &uid_set(chunk), "(UID RFC822.SIZE)").await?;
        let (mut small, mut big) = (Vec::new(), Vec::new());
        for f in &sizes {
            let (Some(uid), size) = (f.uid, f.size.unwrap_or(0) as u64) else { continue };
            if size > acct.max_message { big.push((uid, size)) } else { small.push(uid) }
        }
        let mut fetched = Vec::new();
        if !small.is_empty() {
            for f in fetch(s, &uid_set(&small), "(UID BODY.PEEK[])").await? {
                if let (Some(uid), Some(body)) = (f.uid, f.body()) {
                    fetched.push(Fetched { uid, raw: body.to_vec(), oversize: None });
                }
            }
        }
        if !big.is_empty() {
            let only: Vec<u32> = big.iter().map(|b| b.0).collect();
            for f in fetch(s, &uid_set(&only), "(UID BODY.PEEK[HEADER])").await? {
                if let (Some(uid), Some(h)) = (f.uid, f.header()) {
                    let size = big.iter().find(|b| b.0 == uid).map(|b| b.1);
                    fetched.push(Fetched { uid, raw: h.to_vec(), oversize: size });
                }
            }
        }
        fetched.sort_by_key(|f| f.uid);
        // Parse off the async workers (an unreadable one is logged), then
        // deliver each: who may write, the inbox middleware, the row.
        let (a, sh, m, fo) = (acct.clone(), shared.clone(), mb.clone(), folder.to_string());
        let parsed = tokio::task::spawn_blocking(move || {
            fetched
                .iter()
                .map(|f| {
                    let msg = parse(f, &fo, validity, &a).map(|mut msg| {
                        answer_form(&mut msg, &sh);
                        msg
                    });
                    if let Err(why) = &msg {
                        let note = format!("email:{fo} uid {}: {why}", f.uid);
                        let _ = m.with_store(|s| s.log("warn", "adapter", "message_unreadable", &note));
                    }
                    (f.uid, msg.ok())
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| e.to_string())?;
        let mut seen = Vec::new();
        for (uid, msg) in parsed {
            let Some(msg) = msg else {
                seen.push(uid);
                continue;
            };
            match deliver_one(mb, policy, status, msg).await {
                Ok(new) => {
                    rows.extend(new);
                    seen.push(uid);
                }
                Err(e) => {
                    failed = Some(format!("inbox: {e}"));
                    break;
                }
            }
        }
        if !seen.is_empty() {
            let flagged: Result<Vec<_>, _> = match s.uid_store(uid_set(&seen), "+FLAGS.SILENT (\\Seen)").await {
                Ok(stream) => stream.try_collect().await,
                Err(e) => Err(e),
            };
            if let Err(e) = flagged {
                failed.get_or_insert(format!("IMAP STORE \\Seen: {e}"));
            }
        }
        if failed.is_some() {
            break;
        }
    }
    notify(mb, rows);
    failed.map_or(Ok(()), Err)
}

async fn fetch(s: &mut Conn, set: &str, what: &str) -> Result<Vec<async_imap::types::Fetch>, String> {
    let stream = s.uid_fetch(set, what).await.map_err(|e| format!("IMAP FETCH: {e}"))?;
    stream.try_collect().await.map_err(|e| format!("IMAP FETCH: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account() -> Account {
        let (imap, smtp) = super::super::auto_settings("me@example.org");
        Account {
            address: "me@example.org".into(),
            username: "me".into(),
            password: "pw".into(),
            imap,
            smtp,
            extra_roots: Vec::new(),
            poll: Duration::from_secs(30),
            idle: true,
            folders: vec!["INBOX".into()],
            max_message: 1 << 20,
            max_file: 10,
        }
    }

    #[test]
    fn mail_becomes_an_inbound_message_with_its_thread_and_files() {
        let raw = b"From: Ann Smith <Ann@Example.org>\r\nTo: me@example.org, bob@example.org\r\nCc: cy@example.org\r\n\
Subject: Lunch?\r\nMessage-ID: <m2@example.org>\r\nIn-Reply-To: <m1@example.org>\r\nReferences: <m0@example.org> <m1@example.org>\r\n\
Date: Tue, 1 Dec 2026 10:00:00 +0000\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n\
--b\r\nContent-Type: text/html\r\n\r\n<p>Pizza <b>or</b> sushi?</p>\r\n\
--b\r\nContent-Type: text/plain; name=small.txt\r\nContent-Disposition: attachment; filename=small.txt\r\n\r\nhi\r\n\
--b\r\nContent-Type: application/pdf\r\nContent-Disposition: attachment; filename=big.pdf\r\n\r\n0123456789abcdef\r\n--b--\r\n";
        let m = parse(&Fetched { uid: 7, raw: raw.to_vec(), oversize: None }, "INBOX", 1, &account()).unwrap();
        assert_eq!((m.chat_id.as_str(), m.message_id.as_str()), ("ann@example.org", "m2@example.org"));
        assert!(m.text.contains("Pizza") && m.text.contains("sushi?") && !m.text.contains("<p>"), "{}", m.text);
        assert_eq!(m.reply_to_message_id.as_deref(), Some("m1@example.org"));
        assert_eq!(m.context["references"], json!(["m0@example.org", "m1@example.org"]));
        assert_eq!(m.context["cc"], json!(["cy@example.org"]));
        assert_eq!(m.extra["thread_id"], "email:m0@example.org");
        assert_eq!(m.extra["meta"]["group"]["participants"].as_array().unwrap().len(), 3);
        assert_eq!(m.sent_at_ms, Some(1_796_119_200_000));
        assert_eq!(m.attachments[0]["filename"], "small.txt");
        assert_eq!(m.attachments[0]["transfer"], "inline");
        assert_eq!(m.attachments[1]["skipped"], true, "over max_file: recorded, not dropped");
        // Headers only (over the size limit), no Message-ID: the uid names it.
        let h = b"From: x@y.org\r\nSubject: big\r\n\r\n";
        let m = parse(&Fetched { uid: 9, raw: h.to_vec(), oversize: Some(99) }, "INBOX", 4, &account()).unwrap();
        assert_eq!(m.message_id, "INBOX-4-9");
        assert!(m.text.contains("99 bytes, over the 1048576 byte limit"));
        assert!(
            parse(&Fetched { uid: 1, raw: b"Subject: x\r\n\r\nbody".to_vec(), oversize: None }, "INBOX", 1, &account())
                .unwrap_err()
                .contains("no From")
        );
    }

    #[test]
    fn an_html_bomb_is_read_as_bounded_text() {
        // 200,000 nested elements and 3 MB of text: read, cut, said so.
        let mut html = String::from("<html><body>");
        html.push_str(&"<div><span>".repeat(100_000));
        html.push_str(&"words and more words ".repeat(150_000));
        html.push_str(&"</span></div>".repeat(100_000));
        let raw = format!("From: x@y.org\r\nContent-Type: text/html\r\n\r\n{html}");
        let m = parse(&Fetched { uid: 1, raw: raw.into_bytes(), oversize: None }, "INBOX", 1, &account()).unwrap();
        assert!(m.text.starts_with("words and more words"), "{}", &m.text[..80]);
        assert!(m.text.ends_with("longer than 100000 characters]"));
        assert!(m.text.chars().count() < MAX_TEXT + 100);
    }

    #[test]
    fn a_reply_to_a_form_is_read_as_its_answers_only_from_its_recipient() {
        let shared = Shared::default();
        let form = json!({"id": "lunch", "questions": [{"id": "w", "type": "choice", "text": "Where?",
            "options": [{"id": "p", "label": "Pizza"}, {"id": "s", "label": "Sushi"}]}]});
        shared.remember_form("f1@example.org", "Ann@example.org", &form);
        let mut m = Inbound {
            sender_id: "ann@example.org".into(),
            text: "1b\n\nOn Tue Ann wrote:\n> 1. Where?".into(),
            reply_to_message_id: Some("f1@example.org".into()),
            ..Default::default()
        };
        answer_form(&mut m, &shared);
        assert_eq!(m.context["form_id"], "lunch");
        assert_eq!(m.text, "[form lunch] Where?: Sushi");
        let mut other = Inbound {
            sender_id: "eve@example.org".into(),
            text: "1a".into(),
            reply_to_message_id: Some("f1@example.org".into()),
            ..Default::default()
        };
        answer_form(&mut other, &shared);
        assert!(!other.context.contains_key("form_id"), "someone else's reply is a plain message");
        let mut wrong = Inbound { sender_id: "ann@example.org".into(), text: "1z".into(), ..Default::default() };
        wrong.context.insert("references".into(), json!(["f1@example.org"]));
        answer_form(&mut wrong, &shared);
        assert!(wrong.text.contains("[not an answer to form lunch: question 1: it has no option z]"), "{}", wrong.text);
    }
}
