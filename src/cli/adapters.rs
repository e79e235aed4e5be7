//! `adf adapters add|ls|rm FILE …` and `adf adapters status AGENT`: an
//! agent's channel adapters (`crate::channels`). A token or password is
//! read from stdin or the environment, never from the command line, and
//! kept in the agent's sealed credentials; config says which channels are
//! on, where their server is, and who may talk to the agent.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;

use anyhow::Context;
use serde_json::{Value, json};

use super::output::{Out, at, close, open_for_read};
use crate::store::Store;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum AdaptersCmd {
    /// Connect a channel: the token (email: the password; slack: the bot
    /// and app-level tokens) from stdin, or TELEGRAM_BOT_TOKEN /
    /// EMAIL_PASSWORD / SLACK_BOT_TOKEN + SLACK_APP_TOKEN /
    /// DISCORD_BOT_TOKEN, never from the command line. WhatsApp has no
    /// token: a QR code is drawn to scan with the phone (WhatsApp →
    /// Linked devices), and the link is sealed.
    Add {
        path: PathBuf,
        /// telegram, email, slack, discord or whatsapp
        #[arg(value_parser = ["telegram", "email", "slack", "discord", "whatsapp"])]
        kind: String,
        /// A self-hosted server (a local Bot API server, a test double);
        /// for email the IMAP server, as --imap; for WhatsApp a ws(s) URL.
        #[arg(long)]
        api_url: Option<String>,
        #[command(flatten)]
        email: Box<EmailArgs>,
        /// Direct messages from everyone, an allowlist, or nobody (default:
        /// all; for WhatsApp, a personal number, allowlist).
        #[arg(long, value_parser = ["all", "everyone", "allowlist", "none", "nobody"])]
        dm: Option<String>,
        /// Groups: every message, only when the agent is mentioned, or none.
        #[arg(long, default_value = "mention", value_parser = ["all", "everyone", "mention", "none", "nobody"])]
        group: String,
        /// Who the DM allowlist admits (platform id or @username; repeatable).
        #[arg(long = "allow", value_name = "ID")]
        allow: Vec<String>,
    },
    /// The agent's channels: on or off, server, policy (never credentials).
    Ls { path: PathBuf },
    /// Disconnect a channel: its config and its credentials go.
    Rm { path: PathBuf, kind: String },
    /// How each channel of a running agent is doing (through the daemon).
    Status { agent: String },
}

/// The email channel's own options.
#[derive(Debug, Clone, clap::Args)]
pub struct EmailArgs {
    /// email: the agent's address (its provider's servers are guessed
    /// from it: Gmail, iCloud, Outlook, Fastmail, Yahoo, else
    /// imap./smtp.<domain>).
    #[arg(long)]
    address: Option<String>,
    /// email: the login name, when it is not the address.
    #[arg(long)]
    username: Option<String>,
    /// email: the IMAP server, imaps://host[:993] (TLS) or
    /// imap://host[:143] (STARTTLS).
    #[arg(long, value_name = "URL")]
    imap: Option<String>,
    /// email: the SMTP server, smtps://host[:465] (TLS) or
    /// smtp://host[:587] (STARTTLS).
    #[arg(long, value_name = "URL")]
    smtp: Option<String>,
    /// email: a PEM file of CA certificates to trust besides the
    /// system's (a self-hosted server with its own CA).
    #[arg(long, value_name = "PATH")]
    ca_file: Option<PathBuf>,
}

fn word(w: &str) -> &str {
    match w {
        "everyone" => "all",
        "nobody" => "none",
        other => other,
    }
}

/// The token: the environment's, else one line of stdin (not a terminal:
/// it would echo; piping it in keeps it out of the shell's history).
fn read_token(kind: &str) -> anyhow::Result<String> {
    let what = match kind {
        "email" => "password",
        "slack" => "tokens",
        _ => "token",
    };
    // Slack has two: both in the environment, or both on stdin (one per
    // line or space-separated, in any order).
    if kind == "slack" {
        if let (Ok(b), Ok(a)) = (std::env::var("SLACK_BOT_TOKEN"), std::env::var("SLACK_APP_TOKEN"))
            && !b.trim().is_empty()
            && !a.trim().is_empty()
        {
            return Ok(format!("{} {}", b.trim(), a.trim()));
        }
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            anyhow::bail!(
                "the slack tokens come from stdin or SLACK_BOT_TOKEN and SLACK_APP_TOKEN: \
                 printf '%s\\n%s\\n' \"$BOT\" \"$APP\" | adf adapters add FILE slack"
            );
        }
        let mut all = String::new();
        std::io::Read::read_to_string(&mut stdin.lock(), &mut all).context("reading the tokens from stdin")?;
        if all.trim().is_empty() {
            anyhow::bail!("no slack tokens on stdin (nothing changed)");
        }
        return Ok(all.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    let env = match kind {
        "telegram" => "TELEGRAM_BOT_TOKEN",
        "email" => "EMAIL_PASSWORD",
        "discord" => "DISCORD_BOT_TOKEN",
        _ => "ADF_ADAPTER_TOKEN",
    };
    if let Ok(t) = std::env::var(env)
        && !t.trim().is_empty()
    {
        return Ok(t.trim().to_string());
    }
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        anyhow::bail!("the {kind} {what} comes from stdin or {env}: echo \"$SECRET\" | adf adapters add FILE {kind}");
    }
    let mut line = String::new();
    stdin.lock().read_line(&mut line).context("reading the token from stdin")?;
    let t = line.trim().to_string();
    if t.is_empty() {
        anyhow::bail!("no {kind} {what} on stdin (nothing changed)");
    }
    Ok(t)
}

/// A file this process opened, its credentials unlocked with the install.
fn unlocked(path: &std::path::Path, mut store: Store) -> anyhow::Result<Store> {
    let inst = crate::identity::install::current().map_err(anyhow::Error::msg)?;
    store.unlock(&inst).map_err(|e| at(path, e))?;
    Ok(store)
}

/// Where a channel's server is, for `ls`.
fn server(a: &Value) -> String {
    if let Some(s) = crate::channels::email::Server::of(&a["config"]["imap"]) {
        return format!("{} ({})", a["config"]["address"].as_str().unwrap_or(""), s);
    }
    a.pointer("/config/api_url").and_then(Value::as_str).unwrap_or("-").into()
}

pub fn run(out: &Out, url: Option<&str>, cmd: &AdaptersCmd) -> anyhow::Result<()> {
    match cmd {
        AdaptersCmd::Add { path, kind, api_url, email: e, dm, group, allow } => {
            let EmailArgs { address, username, imap, smtp, ca_file } = e.as_ref();
            let email = kind == "email";
            if !email
                && (address.is_some() || username.is_some() || imap.is_some() || smtp.is_some() || ca_file.is_some())
            {
                anyhow::bail!("--address, --username, --imap, --smtp and --ca-file are for the email channel");
            }
            if email && address.is_none() {
                anyhow::bail!("the email channel needs --address (the agent's email address)");
            }
            let ca_pem = match ca_file {
                Some(f) => Some(std::fs::read_to_string(f).with_context(|| format!("--ca-file {}", f.display()))?),
                None => None,
            };
            if let Some(u) = api_url.as_ref().filter(|_| !email) {
                let parsed = url::Url::parse(u).map_err(|e| anyhow::anyhow!("--api-url {u:?}: {e}"))?;
                let ws = kind == "whatsapp";
                if ws && !matches!(parsed.scheme(), "ws" | "wss") {
                    anyhow::bail!("--api-url {u:?}: use a ws or wss URL");
                }
                if !ws && !matches!(parsed.scheme(), "http" | "https") {
                    anyhow::bail!("--api-url {u:?}: use an http or https URL");
                }
            }
            // A WhatsApp link is the owner's own number: everyone who writes
            // to the owner would reach the agent, so who may is said.
            let dm = dm.as_deref().unwrap_or(if kind == "whatsapp" { "allowlist" } else { "all" });
            if word(dm) == "allowlist" && allow.is_empty() {
                if kind == "whatsapp" {
                    anyhow::bail!(
                        "whatsapp: say who may write to the agent: --allow NUMBER (repeatable), or --dm all \
                         (everyone who writes to this number)"
                    );
                }
                anyhow::bail!("--dm allowlist needs --allow ID (a platform id or @username; repeatable)");
            }
            let token = if kind == "whatsapp" { String::new() } else { read_token(kind)? };
            let mut input =
                json!({"type": kind, "token": token, "dm": word(dm), "groups": word(group), "allow_from": allow});
            for (k, v) in [
                ("api_url", api_url),
                ("address", address),
                ("username", username),
                ("imap", imap),
                ("smtp", smtp),
                ("ca_pem", &ca_pem),
            ] {
                if let Some(v) = v {
                    input[k] = json!(v);
                }
            }
            let mut store = match super::held::open_for_write(path)? {
                super::held::Target::Local(store) => {
                    let store = unlocked(path, store)?;
                    if kind == "whatsapp" {
                        // Linked here, before anything is written: a
                        // pairing that fails changes nothing.
                        let (link, account) = whatsapp_pair(out, api_url.as_deref())?;
                        use base64::Engine;
                        input["session"] = json!(base64::engine::general_purpose::STANDARD.encode(link));
                        input["account"] = json!(account);
                    }
                    store
                }
                // Held by the app or a daemon: connected through the agent there.
                super::held::Target::Held(via) => {
                    let v = via.call(reqwest::Method::POST, &["adapters"], &[], Some(&input))?;
                    if out.json {
                        return out.json(&json!({"kind": kind, "message": v["message"]}));
                    }
                    let said = v["message"].as_str().unwrap_or("");
                    return out.line(format!(
                        "{}: {kind} connected through the process that holds it: {said}",
                        path.display()
                    ));
                }
            };
            crate::channels::connect(&mut store, &input).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            let adapter = store.config_value().map_err(|e| at(path, e))?["adapters"][kind.as_str()].clone();
            close(store)?;
            if out.json {
                return out.json(&json!({"kind": kind, "adapter": adapter, "account": input["account"]}));
            }
            if let Some(account) = input["account"].as_str() {
                return out.line(format!(
                    "{}: whatsapp linked to {account} (starts with the agent; the link is sealed in its credentials)",
                    path.display()
                ));
            }
            out.line(format!(
                "{}: {kind} connected (starts with the agent; `adf adapters status` once it runs)",
                path.display()
            ))
        }
        AdaptersCmd::Ls { path } => {
            let store = open_for_read(path)?;
            let cfg = store.config_value().map_err(|e| at(path, e))?;
            close(store)?;
            let list = cfg["adapters"].as_object().cloned().unwrap_or_default();
            if out.json {
                return out.json(&Value::Object(list));
            }
            if list.is_empty() {
                return out.line("no channels (adf adapters add FILE telegram)");
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|(k, a)| {
                    vec![
                        k.clone(),
                        if a["enabled"].as_bool().unwrap_or(false) { "on".into() } else { "off".into() },
                        a["policy"]["dm"].as_str().unwrap_or("all").into(),
                        a["policy"]["groups"].as_str().unwrap_or("mention").into(),
                        server(a),
                    ]
                })
                .collect();
            out.table(&["CHANNEL", "STATE", "DM", "GROUPS", "SERVER"], &rows)
        }
        AdaptersCmd::Rm { path, kind } => {
            let mut store = match super::held::open_for_write(path)? {
                super::held::Target::Local(store) => unlocked(path, store)?,
                // Held by the app or a daemon: disconnected there, at once.
                super::held::Target::Held(via) => {
                    let v = via.call(reqwest::Method::DELETE, &["adapters", kind], &[], None)?;
                    return out.line(format!(
                        "{}: {}",
                        path.display(),
                        v["message"].as_str().unwrap_or("disconnected")
                    ));
                }
            };
            let said = crate::channels::disconnect(&mut store, kind)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            close(store)?;
            out.line(format!("{}: {said}", path.display()))
        }
        AdaptersCmd::Status { agent } => {
            let client = crate::client::Client::find(url);
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let v = rt.block_on(client.get(&["agents", agent, "adapters"]))?;
            if out.json {
                return out.json(&v);
            }
            let rows: Vec<Vec<String>> = v["adapters"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| {
                    let s = |k: &str| a[k].as_str().unwrap_or("-").to_string();
                    vec![
                        s("kind"),
                        s("state"),
                        s("account"),
                        a["received"].to_string(),
                        a["sent"].to_string(),
                        s("last_error"),
                    ]
                })
                .collect();
            if rows.is_empty() {
                return out.line(format!("{agent}: no channel running"));
            }
            out.table(&["CHANNEL", "STATE", "ACCOUNT", "IN", "OUT", "LAST ERROR"], &rows)?;
            // A channel waiting to be linked: its QR code, to scan now.
            for a in v["adapters"].as_array().into_iter().flatten() {
                if let Some(code) = a["qr"].as_str() {
                    let drawn = crate::channels::whatsapp::qr_text(code).unwrap_or_else(|e| e);
                    out.line(format!("\n{drawn}\n{}", crate::channels::whatsapp::SCAN))?;
                }
            }
            Ok(())
        }
    }
}

/// Link WhatsApp here: each QR code is drawn on stderr as it comes (with
/// `--json`, also a `{"qr": …}` line on stdout for a script to draw), until
/// the phone scans one and the device logs in (at most 3 minutes).
fn whatsapp_pair(out: &Out, api_url: Option<&str>) -> anyhow::Result<(Vec<u8>, String)> {
    let json = out.json;
    let show = move |code: &str| {
        use std::io::Write;
        if json {
            let mut o = std::io::stdout().lock();
            let _ = writeln!(o, "{}", json!({"qr": code}));
            let _ = o.flush();
        }
        let drawn = crate::channels::whatsapp::qr_text(code).unwrap_or_else(|e| e);
        eprintln!("{drawn}\n{}\n", crate::channels::whatsapp::SCAN);
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(crate::channels::whatsapp::pair(api_url, show, std::time::Duration::from_secs(180)))
        .map_err(|e| anyhow::anyhow!("whatsapp: {e}"))
}
