//! Sending mail (SMTP through lettre): a reply threads under the message
//! it answers (`In-Reply-To`, `References`, `Re:` subject), copies come
//! from `message_meta` (`cc`, `bcc`, `reply_all`: everyone the original
//! went to but the agent and the recipient), HTML goes with a text part,
//! forms go as a numbered list answered by reply, and files go in the
//! same message.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use lettre::message::header::ContentType;
use lettre::message::{Attachment, Mailbox as Addr, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use serde_json::{Value, json};

use super::{Account, Shared, check_address};
use crate::channels::{FORM_TYPE, Outbound, Outgoing, form_text};

const DEFAULT_SUBJECT: &str = "Message from your agent";

pub(super) struct Sender {
    pub acct: Arc<Account>,
    pub shared: Arc<Shared>,
}

impl Sender {
    /// The SMTP connection's settings, made at each send: the roots are
    /// read then, so a machine without them fails that send with the cause.
    fn transport(&self) -> Result<AsyncSmtpTransport<Tokio1Executor>, String> {
        let a = &self.acct;
        let mut params = TlsParameters::builder(a.smtp.host.clone());
        for root in &a.extra_roots {
            let cert = Certificate::from_der(root.to_vec()).map_err(|e| format!("ca_pem: {e}"))?;
            params = params.add_root_certificate(cert);
        }
        let params = params.build_rustls().map_err(|e| format!("SMTP {}: TLS: {e}", a.smtp))?;
        let tls = if a.smtp.implicit_tls { Tls::Wrapper(params) } else { Tls::Required(params) };
        Ok(AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(a.smtp.host.as_str())
            .port(a.smtp.port)
            .tls(tls)
            .credentials(Credentials::new(a.username.clone(), a.password.clone()))
            .timeout(Some(Duration::from_secs(60)))
            .build())
    }
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => s.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        Value::Array(a) => a.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        _ => Vec::new(),
    }
}

fn mailbox(a: &str, what: &str) -> Result<Addr, String> {
    a.trim().parse::<Addr>().map_err(|e| format!("{what} {a:?} is not an email address ({e})"))
}

/// The bare address of `Name <a@b>` or `a@b`, lowercased.
fn bare(a: &str) -> String {
    a.parse::<Addr>().map(|m| m.email.to_string()).unwrap_or_else(|_| a.trim().to_string()).to_lowercase()
}

/// The subject of a message: the one given, else `Re:` the one replied
/// to, else the default.
fn subject(m: &Outgoing) -> String {
    if let Some(s) = m.subject.as_deref().filter(|s| !s.trim().is_empty()) {
        return s.to_string();
    }
    match m.replied["subject"].as_str().map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) if s.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("re:")) => s.to_string(),
        Some(s) => format!("Re: {s}"),
        None => DEFAULT_SUBJECT.to_string(),
    }
}

impl Sender {
    /// Build and send one message; its Message-ID (without brackets).
    async fn mail(&self, to: &str, m: &Outgoing, text: &str) -> Result<String, String> {
        let to = check_address(to)?;
        let me = self.acct.address.to_lowercase();
        let domain = me.rsplit_once('@').map(|(_, d)| d.to_string()).unwrap_or_else(|| "localhost".into());
        let id = format!("{}@{domain}", crate::store::create::nanoid(24));
        let mut b = lettre::Message::builder()
            .from(mailbox(&self.acct.address, "the channel's address")?)
            .to(mailbox(&to, "the recipient")?)
            .subject(subject(m))
            .message_id(Some(format!("<{id}>")));
        let replied_id = m.reply_to.clone().or_else(|| m.replied["message_id"].as_str().map(str::to_string));
        if let Some(r) = replied_id.filter(|r| !r.is_empty()) {
            let mut refs = strings(&m.replied["references"]);
            if !refs.contains(&r) {
                refs.push(r.clone());
            }
            b = b.in_reply_to(format!("<{r}>"));
            let refs: Vec<String> = refs.iter().map(|x| format!("<{}>", x.trim_matches(['<', '>']))).collect();
            b = b.references(refs.join(" "));
        }
        let mut cc = strings(&m.hints["cc"]);
        if m.hints["reply_all"].as_bool() == Some(true) {
            let mut everyone = strings(&m.replied["to"]);
            everyone.extend(strings(&m.replied["cc"]));
            for a in everyone {
                let key = bare(&a);
                if key != me && key != to.to_lowercase() && !cc.iter().any(|c| bare(c) == key) {
                    cc.push(a);
                }
            }
        }
        for c in &cc {
            b = b.cc(mailbox(c, "cc")?);
        }
        for c in strings(&m.hints["bcc"]) {
            b = b.bcc(mailbox(&c, "bcc")?);
        }
        let html = m.content_type == "text/html";
        let alternative = || {
            let plain = mail_parser::decoders::html::html_to_text(text);
            MultiPart::alternative().singlepart(SinglePart::plain(plain)).singlepart(SinglePart::html(text.to_string()))
        };
        // Markdown goes as itself and as HTML; a form stays plain text.
        let markdown = || {
            MultiPart::alternative()
                .singlepart(SinglePart::plain(text.to_string()))
                .singlepart(SinglePart::html(crate::channels::markup::email_html(text)))
        };
        let form = m.content_type == FORM_TYPE;
        let message = match (html, form, m.files.is_empty()) {
            (false, true, true) => b.singlepart(SinglePart::plain(text.to_string())),
            (false, false, true) => b.multipart(markdown()),
            (true, _, true) => b.multipart(alternative()),
            (_, _, false) => {
                let mut all = if html {
                    MultiPart::mixed().multipart(alternative())
                } else if form {
                    MultiPart::mixed().singlepart(SinglePart::plain(text.to_string()))
                } else {
                    MultiPart::mixed().multipart(markdown())
                };
                for f in &m.files {
                    let ct = ContentType::parse(&f.mime)
                        .or_else(|_| ContentType::parse("application/octet-stream"))
                        .map_err(|e| format!("{}: {e}", f.name))?;
                    all = all.singlepart(Attachment::new(f.name.clone()).body(f.data.clone(), ct));
                }
                b.multipart(all)
            }
        }
        .map_err(|e| format!("the message could not be built: {e}"))?;
        self.transport()?.send(message).await.map_err(|e| format!("SMTP {}: {e}", self.acct.smtp))?;
        Ok(id)
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
            let m = Outgoing { text: text.to_string(), reply_to: reply_to.map(str::to_string), ..Default::default() };
            self.mail(chat, &m, text).await
        })
    }

    fn send_message<'a>(&'a self, chat: &'a str, m: &'a Outgoing) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            if m.content_type == FORM_TYPE {
                let form: Value =
                    serde_json::from_str(&m.text).map_err(|e| format!("form content is not JSON: {e}"))?;
                let id = self.mail(chat, m, &form_text(&form)).await?;
                self.shared.remember_form(&id, chat, &form);
                return Ok(id);
            }
            self.mail(chat, m, &m.text).await
        })
    }

    fn send_form<'a>(
        &'a self,
        chat: &'a str,
        form: &'a Value,
        reply_to: Option<&'a str>,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let m = Outgoing {
                text: form.to_string(),
                content_type: FORM_TYPE.into(),
                reply_to: reply_to.map(str::to_string),
                ..Default::default()
            };
            self.send_message(chat, &m).await
        })
    }

    fn chat_info<'a>(&'a self, chat: &'a str, _limit: usize) -> BoxFuture<'a, Result<Value, String>> {
        Box::pin(async move {
            let addr = check_address(chat)?;
            Ok(json!({
                "supported": true, "adapter": "email", "chat_id": addr, "type": "email", "title": addr,
                "participants": [{"id": addr}], "participants_scope": "address",
                "note": "email has no roster: who else a message went to is in its source_context (to, cc)",
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_thread_as_replies() {
        let mut m = Outgoing::default();
        assert_eq!(subject(&m), DEFAULT_SUBJECT);
        m.replied = json!({"subject": "Lunch"});
        assert_eq!(subject(&m), "Re: Lunch");
        m.replied = json!({"subject": "RE: Lunch"});
        assert_eq!(subject(&m), "RE: Lunch", "not Re: Re:");
        m.subject = Some("Plans".into());
        assert_eq!(subject(&m), "Plans");
        assert_eq!(strings(&json!("a@x, b@y")), vec!["a@x", "b@y"]);
        assert_eq!(bare("Ann <Ann@X.org>"), "ann@x.org");
    }
}
