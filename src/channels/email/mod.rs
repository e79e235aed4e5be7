//! Email (issue 20): IMAP for what arrives, SMTP for what the agent sends.
//! The login and password are the agent's sealed credentials
//! (`adapter:email:EMAIL_USERNAME`, `adapter:email:EMAIL_PASSWORD`);
//! `adapters.email.config` says the address, the servers (guessed from the
//! provider when not set, `settings.rs`), extra CA roots (`ca_pem`), the
//! poll interval (ms), whether to use IDLE and which folders to read.
//!
//! A chat is a correspondent's address: mail from ann@example.org lands
//! as `email:ann@example.org`, and `msg_send` to that address (or a reply
//! by `parent_id`) goes back by SMTP, threaded with `In-Reply-To` and
//! `References`. What arrived while the agent was off is the mailbox's
//! unseen mail: read at connect as one batch (one wake), then marked seen
//! once it is in the inbox, so a crash in between redelivers it and the
//! Message-ID de-duplicates it.

mod inbound;
mod outbound;
mod settings;
pub mod tls;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use serde_json::Value;

pub use settings::{Server, auto_settings, check_address, settings};

use super::{Outbound, Policy, StatusCell, max_attachment, required_secret, secret};
use crate::runtime::mesh::Mailbox;

/// The credential holding the login name (the address unless set).
pub const USERNAME: &str = "adapter:email:EMAIL_USERNAME";
/// The credential holding the password (an app password at most providers).
pub const PASSWORD: &str = "adapter:email:EMAIL_PASSWORD";

/// An account, ready to connect.
pub(crate) struct Account {
    pub address: String,
    pub username: String,
    pub password: String,
    pub imap: Server,
    pub smtp: Server,
    pub extra_roots: Vec<CertificateDer<'static>>,
    /// How often to look for mail without IDLE (and at most how long an
    /// IDLE lasts before the connection is checked).
    pub poll: Duration,
    pub idle: bool,
    pub folders: Vec<String>,
    /// Larger messages are read as headers only (bytes).
    pub max_message: u64,
    /// Larger attachments are recorded as skipped (bytes).
    pub max_file: u64,
}

/// What the sender and the reader share: the forms sent, by Message-ID, to
/// whom (a reply from that address answers it).
#[derive(Default)]
pub(crate) struct Shared {
    forms: Mutex<VecDeque<(String, String, Value)>>,
}

const FORMS_KEPT: usize = 256;

impl Shared {
    fn remember_form(&self, message_id: &str, to: &str, form: &Value) {
        if let Ok(mut f) = self.forms.lock() {
            if f.len() >= FORMS_KEPT {
                f.pop_front();
            }
            f.push_back((message_id.to_string(), to.to_lowercase(), form.clone()));
        }
    }

    /// The form a message from `sender` answers, by the ids it replies to.
    fn form_for(&self, sender: &str, replied: &[String]) -> Option<Value> {
        let f = self.forms.lock().ok()?;
        f.iter().rev().find(|(id, to, _)| to == sender && replied.contains(id)).map(|(_, _, form)| form.clone())
    }
}

impl Account {
    fn load(mb: &Mailbox, adapter: &Value) -> Result<Account, String> {
        let c = &adapter["config"];
        let address = check_address(c["address"].as_str().unwrap_or_default())
            .map_err(|e| format!("adapters.email.config.address: {e}"))?;
        let password = required_secret(mb, PASSWORD, "password", "email")?;
        let username = secret(mb, USERNAME)?.unwrap_or_else(|| address.clone());
        let (auto_imap, auto_smtp) = auto_settings(&address);
        let extra_roots = match c["ca_pem"].as_str() {
            Some(pem) => tls::roots(pem.as_bytes()).map_err(|e| format!("adapters.email.config.ca_pem: {e}"))?,
            None => Vec::new(),
        };
        let folders: Vec<String> =
            c["folders"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect();
        let limit = |k: &str, d: u64| adapter.pointer(&format!("/limits/{k}")).and_then(Value::as_u64).unwrap_or(d);
        Ok(Account {
            imap: Server::of(&c["imap"]).unwrap_or(auto_imap),
            smtp: Server::of(&c["smtp"]).unwrap_or(auto_smtp),
            extra_roots,
            poll: Duration::from_millis(c["poll_interval"].as_u64().unwrap_or(30_000).clamp(1_000, 3_600_000)),
            idle: c["idle"].as_bool().unwrap_or(true),
            folders: if folders.is_empty() { vec!["INBOX".into()] } else { folders },
            max_message: limit("max_message_size", 25 * 1024 * 1024),
            max_file: max_attachment(adapter),
            address,
            username,
            password,
        })
    }
}

/// Start the channel: the SMTP sender, and the IMAP reader.
pub fn start(mb: Arc<Mailbox>, adapter: &Value, policy: Policy, status: StatusCell) -> Result<super::Started, String> {
    let acct = Arc::new(Account::load(&mb, adapter)?);
    let shared = Arc::new(Shared::default());
    let sender: Arc<dyn Outbound> = Arc::new(outbound::Sender { acct: acct.clone(), shared: shared.clone() });
    if let Ok(mut s) = status.lock() {
        s.account = Some(acct.address.clone());
    }
    Ok((sender, Box::pin(inbound::run(acct, shared, mb, policy, status))))
}
