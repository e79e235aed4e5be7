//! The owner's identity and a file's sealed secrets from the shell:
//! `adf identity show|restore`, `adf unlock`, `adf password set|remove`,
//! `adf credentials ls|set|rm`, `adf claim`, `adf attest ls|issue|add|verify`.
//! Secrets are read from the terminal without echo (or from stdin when it
//! is a pipe) and never printed, except the owner's phrase on request.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use clap::Subcommand;
use serde_json::{Value, json};

use super::output::{Out, at, close, open};
use crate::identity::envelope::{self, CREDENTIALS, IDENTITY};
use crate::identity::{attest, install};
use crate::paths;
use crate::store::Store;

#[derive(Debug, Clone, Subcommand)]
pub enum IdentityCmd {
    /// The owner and runtime DIDs of this install (created on first use).
    Show {
        /// Also print the 12-word recovery phrase (asks to confirm).
        #[arg(long)]
        phrase: bool,
        /// Do not ask before printing the phrase.
        #[arg(long)]
        yes: bool,
    },
    /// Make the owner of a recovery phrase (read from the terminal or
    /// stdin) this install's owner; files sealed to that owner open here.
    Restore,
}

#[derive(Debug, Clone, Subcommand)]
pub enum PasswordCmd {
    /// Add or change the password that opens the file's credentials (to
    /// share them); the identity is never shared.
    Set { path: std::path::PathBuf },
    /// Remove the password slot.
    Remove { path: std::path::PathBuf },
}

#[derive(Debug, Clone, Subcommand)]
pub enum CredentialsCmd {
    /// The file's secrets: purpose, how each is stored, size (never values).
    Ls { path: std::path::PathBuf },
    /// Store a secret (value from the terminal or stdin, never argv), e.g.
    /// `provider:anthropic:apiKey`.
    Set {
        path: std::path::PathBuf,
        purpose: String,
        /// Let the agent's code read it with `adf.get_identity`.
        #[arg(long)]
        code_access: bool,
    },
    /// Remove a secret.
    Rm { path: std::path::PathBuf, purpose: String },
}

/// `adf trust …`: headless trust (`store::keyring::trust`).
#[derive(Debug, Clone, Subcommand)]
pub enum TrustCmd {
    /// This machine's trust key: paste it into `adf trust grant` where the
    /// owner's agents' credentials open.
    Key,
    /// Let the runtime with this trust key open these agents' credentials.
    Grant {
        #[arg(long)]
        key: String,
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
    },
    /// Take that access away again (by the runtime's DID).
    Revoke {
        #[arg(long)]
        runtime: String,
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
    },
    /// The runtimes an agent's credentials open for.
    Ls { path: std::path::PathBuf },
}

pub fn trust(out: &Out, cmd: TrustCmd) -> anyhow::Result<()> {
    let inst = current()?;
    match cmd {
        TrustCmd::Key => {
            let key = crate::store::keyring::trust::trust_key(&inst);
            if out.json {
                return out.json(&json!({"runtime_did": inst.runtime_did, "key": key}));
            }
            out.line(key)
        }
        TrustCmd::Grant { key, paths } => {
            // The key first: a bad one changes no file.
            crate::store::keyring::trust::parse_trust_key(&key).map_err(anyhow::Error::msg)?;
            for path in &paths {
                let mut store = open(path)?;
                store.unlock(&inst).map_err(|e| at(path, e))?;
                let added = store.trust_runtime(&key).map_err(|e| at(path, e))?;
                close(store)?;
                out.line(format!(
                    "{}: credentials {} for that runtime",
                    path.display(),
                    if added { "now open" } else { "still open (slot refreshed)" }
                ))?;
            }
            Ok(())
        }
        TrustCmd::Revoke { runtime, paths } => {
            for path in &paths {
                let mut store = open(path)?;
                let removed = store.untrust_runtime(&runtime, &inst).map_err(|e| at(path, e))?;
                close(store)?;
                if !removed {
                    bail!("{}: runtime {runtime} had no access", path.display());
                }
                out.line(format!(
                    "{}: revoked; {runtime} can no longer open its credentials (rotate a key it may have read)",
                    path.display()
                ))?;
            }
            Ok(())
        }
        TrustCmd::Ls { path } => {
            let store = open(&path)?;
            let list = store.trusted_runtimes().map_err(|e| at(&path, e))?;
            close(store)?;
            if out.json {
                return out.json(&json!({"runtimes": list, "this_runtime": inst.runtime_did}));
            }
            for did in list {
                let mark = if did == inst.runtime_did { "  (this machine)" } else { "" };
                out.line(format!("{did}{mark}"))?;
            }
            Ok(())
        }
    }
}

#[derive(Debug, Clone, Subcommand)]
pub enum AttestCmd {
    /// The file's attestations, oldest first.
    Ls { path: std::path::PathBuf },
    /// Sign an attestation with the agent's key (printed, not stored).
    Issue {
        /// The issuing agent's file (its key signs).
        path: std::path::PathBuf,
        /// The DID the attestation is about.
        #[arg(long)]
        subject: String,
        /// What the issuer vouches for (e.g. `member`, `reviewer`; `owner`,
        /// `operator`, `runtime`, `clone` and `rotation` are reserved).
        #[arg(long)]
        role: String,
        /// What the role applies to (a DID, a group, a resource).
        #[arg(long)]
        scope: Option<String>,
        /// ISO-8601 expiry.
        #[arg(long)]
        expires_at: Option<String>,
    },
    /// Verify an attestation about this agent (JSON file) and store it.
    Add { path: std::path::PathBuf, file: std::path::PathBuf },
    /// Verify an attestation in a JSON file. Exit status 1 when it fails.
    Verify {
        file: std::path::PathBuf,
        /// The DID it must be about.
        #[arg(long)]
        subject: Option<String>,
    },
}

/// A secret from the terminal (no echo) or the first line of stdin.
fn read_secret(prompt: &str) -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        let mut line = String::new();
        stdin.lock().read_line(&mut line).context("reading stdin")?;
        return Ok(line.trim_end_matches(['\r', '\n']).to_string());
    }
    eprint!("{prompt}");
    std::io::stderr().flush().ok();
    let _echo = EchoOff::new();
    let mut line = String::new();
    stdin.lock().read_line(&mut line).context("reading the terminal")?;
    eprintln!();
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

/// Terminal echo off until dropped.
struct EchoOff(Option<libc::termios>);

impl EchoOff {
    fn new() -> Self {
        // SAFETY: tcgetattr/tcsetattr on fd 0 with a zeroed termios.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                return EchoOff(None);
            }
            let old = t;
            t.c_lflag &= !libc::ECHO;
            libc::tcsetattr(0, libc::TCSANOW, &t);
            EchoOff(Some(old))
        }
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        if let Some(t) = self.0 {
            // SAFETY: restoring the attributes read in `new`.
            unsafe {
                libc::tcsetattr(0, libc::TCSANOW, &t);
            }
        }
    }
}

fn confirm(question: &str) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        bail!("{question} — not asked without a terminal; pass --yes");
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush().ok();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}

fn current() -> anyhow::Result<std::sync::Arc<install::Install>> {
    install::current().map_err(anyhow::Error::msg)
}

pub fn identity(out: &Out, cmd: IdentityCmd) -> anyhow::Result<()> {
    let config = paths::config_dir();
    match cmd {
        IdentityCmd::Show { phrase, yes } => {
            let (inst, created) = install::load_or_create(&config).map_err(anyhow::Error::msg)?;
            let show = phrase && inst.owner.is_some() && (yes || confirm("Print the recovery phrase?")?);
            if show {
                install::mark_shown(&config).map_err(anyhow::Error::msg)?;
            }
            let phrase_text = inst.owner.as_ref().filter(|_| show).map(|o| o.phrase.clone());
            if out.json {
                return out.json(&json!({"owner_did": inst.owner_did, "runtime_did": inst.runtime_did,
                    "runtime_id": inst.runtime_id, "created": created, "phrase_on_this_machine": inst.owner.is_some(),
                    "phrase_shown": inst.phrase_shown || show, "delegation": inst.delegation, "phrase": phrase_text}));
            }
            if created {
                out.line("A new owner identity was created for this install.")?;
            }
            out.line(format!("owner    {}", inst.owner_did))?;
            out.line(format!("runtime  {}  (id {})", inst.runtime_did, inst.runtime_id))?;
            out.line(format!("file     {}", inst.path.display()))?;
            match phrase_text {
                Some(p) => out.line(format!("phrase   {p}"))?,
                None if inst.owner.is_none() => out.line("phrase   not on this machine (`adf identity restore`)")?,
                None if !inst.phrase_shown => {
                    out.line("phrase   never shown yet: `adf identity show --phrase` and write it down")?
                }
                None => {}
            }
            Ok(())
        }
        IdentityCmd::Restore => {
            let phrase = read_secret("Recovery phrase (12 words): ")?;
            let inst = install::restore(&config, &phrase).map_err(anyhow::Error::msg)?;
            if out.json {
                return out.json(&json!({"owner_did": inst.owner_did, "runtime_did": inst.runtime_did}));
            }
            out.line(format!("owner    {}", inst.owner_did))?;
            out.line("Files sealed to this owner open here from now on (a runtime slot is added on first open).")
        }
    }
}

fn states(store: &Store) -> anyhow::Result<Value> {
    let p = store.path().to_path_buf();
    let i = store.envelope(IDENTITY).map_err(|e| at(&p, e))?;
    let c = store.envelope(CREDENTIALS).map_err(|e| at(&p, e))?;
    Ok(json!({"identity": i.state, "credentials": c.state}))
}

pub fn unlock(out: &Out, path: &Path) -> anyhow::Result<()> {
    let inst = current()?;
    let mut store = open(path)?;
    let [id, cred] = store.unlock(&inst).map_err(|e| at(path, e))?;
    use crate::store::keyring::EnvState::*;
    let needs_password = cred == Locked || store.is_legacy_password().map_err(|e| at(path, e))?;
    let mut used_password = false;
    if needs_password {
        let pw = read_secret(&format!("Password for {}: ", path.display()))?;
        if !store.unlock_password(&pw, &inst).map_err(|e| at(path, e))? {
            bail!("{}: wrong password (nothing changed)", path.display());
        }
        used_password = true;
    }
    let st = states(&store)?;
    close(store)?;
    if out.json {
        return out.json(&json!({"path": path.display().to_string(), "states": st, "password_used": used_password}));
    }
    let _ = (id, cred);
    out.line(format!(
        "{}: identity {}, credentials {}",
        path.display(),
        st["identity"].as_str().unwrap_or("?"),
        st["credentials"].as_str().unwrap_or("?")
    ))?;
    if st["identity"] == "foreign" {
        out.line("  the identity belongs to another owner: `adf claim` gives the file a new DID owned by you")?;
    }
    Ok(())
}

pub fn password(out: &Out, cmd: PasswordCmd) -> anyhow::Result<()> {
    let inst = current()?;
    match cmd {
        PasswordCmd::Set { path } => {
            let mut store = open(&path)?;
            store.unlock(&inst).map_err(|e| at(&path, e))?;
            let pw = read_secret("New password: ")?;
            if std::io::stdin().is_terminal() && read_secret("Again: ")? != pw {
                bail!("the passwords differ (nothing changed)");
            }
            if pw.chars().count() < 8 {
                bail!("a share password needs at least 8 characters (nothing changed)");
            }
            store.password_set(&pw, envelope::PASSWORD_LOG_N).map_err(|e| at(&path, e))?;
            close(store)?;
            out.line(format!("{}: the credentials envelope now opens with this password too", path.display()))
        }
        PasswordCmd::Remove { path } => {
            let mut store = open(&path)?;
            store.unlock(&inst).map_err(|e| at(&path, e))?;
            let removed = store.password_remove().map_err(|e| at(&path, e))?;
            close(store)?;
            out.line(if removed { "password removed" } else { "there was no password" })
        }
    }
}

pub fn credentials(out: &Out, cmd: CredentialsCmd) -> anyhow::Result<()> {
    let inst = current()?;
    match cmd {
        CredentialsCmd::Ls { path } => {
            let mut store = open(&path)?;
            store.unlock_quietly(&inst).map_err(|e| at(&path, e))?;
            let rows = store.secrets().map_err(|e| at(&path, e))?;
            let st = states(&store)?;
            close(store)?;
            if out.json {
                return out.json(&json!({"states": st, "secrets": rows}));
            }
            out.line(format!("credentials envelope: {}", st["credentials"].as_str().unwrap_or("?")))?;
            for r in rows.iter().filter(|r| !r.purpose.starts_with("crypto:")) {
                let access = if r.code_access { "  code" } else { "" };
                out.line(format!("  {:<40} {:<16} {:>6} B{access}", r.purpose, r.encryption_algo, r.size))?;
            }
            Ok(())
        }
        CredentialsCmd::Set { path, purpose, code_access } => {
            let mut store = open(&path)?;
            store.unlock(&inst).map_err(|e| at(&path, e))?;
            let value = read_secret(&format!("Value for {purpose}: "))?;
            if value.is_empty() {
                bail!("empty value (nothing changed)");
            }
            store.secret_set(&purpose, value.as_bytes(), code_access).map_err(|e| at(&path, e))?;
            close(store)?;
            out.line(format!("{}: stored {purpose}", path.display()))
        }
        CredentialsCmd::Rm { path, purpose } => {
            let mut store = open(&path)?;
            let removed = store.secret_rm(&purpose).map_err(|e| at(&path, e))?;
            close(store)?;
            if !removed {
                bail!("{}: no secret named {purpose}", path.display());
            }
            out.line(format!("{}: removed {purpose}", path.display()))
        }
    }
}

/// Other agent files with this DID: in the file's folder and the fleet's
/// (the original a copy was made from).
pub fn same_did(path: &Path, did: &str) -> Vec<PathBuf> {
    if did.is_empty() {
        return Vec::new();
    }
    let me = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut dirs = vec![crate::paths::fleet_dir()];
    if let Some(d) = path.parent() {
        dirs.push(if d.as_os_str().is_empty() { PathBuf::from(".") } else { d.to_path_buf() });
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for dir in dirs {
        for p in super::fleet::scan(&dir) {
            let canon = std::fs::canonicalize(&p).unwrap_or_else(|_| p.clone());
            if canon == me || !seen.insert(canon) {
                continue;
            }
            let theirs = crate::store::Store::open_read_only(&p)
                .ok()
                .and_then(|s| s.meta_get("adf_did").ok().flatten().map(|m| m.value));
            if theirs.as_deref() == Some(did) {
                out.push(p);
            }
        }
    }
    out
}

pub fn claim(out: &Out, path: &Path, yes: bool) -> anyhow::Result<()> {
    let inst = current()?;
    let mut store = open(path)?;
    let old = store.meta_get("adf_did").map_err(|e| at(path, e))?.map(|m| m.value).unwrap_or_default();
    // A copy of an agent (another file here or in the fleet has its DID)
    // gets an identity of its own even though it opens for you.
    let twins = same_did(path, &old);
    let question = match twins.first() {
        Some(t) => format!(
            "{} is a copy of {} (one DID for two files): give the copy its own identity (a new DID and id)?",
            path.display(),
            t.display()
        ),
        None => format!("Give {} a new identity owned by you (the old DID is kept in its history)?", path.display()),
    };
    if !yes && !confirm(&question)? {
        bail!("not claimed");
    }
    let did = if twins.is_empty() { store.claim(&inst) } else { store.claim_copy(&inst) }.map_err(|e| at(path, e))?;
    let st = states(&store)?;
    close(store)?;
    if out.json {
        return out.json(&json!({"path": path.display().to_string(), "did": did, "previous_did": old, "states": st}));
    }
    out.line(format!("{}: claimed; new DID {did}", path.display()))?;
    out.line(format!("  previous {old}; credentials {}", st["credentials"].as_str().unwrap_or("?")))
}

fn read_json(file: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(file).with_context(|| format!("{}: cannot read", file.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not JSON", file.display()))
}

pub fn attest(out: &Out, cmd: AttestCmd) -> anyhow::Result<u8> {
    match cmd {
        AttestCmd::Ls { path } => {
            let store = open(&path)?;
            let list = store.attestations().map_err(|e| at(&path, e))?;
            close(store)?;
            if out.json {
                out.json(&list)?;
                return Ok(0);
            }
            for a in &list {
                let scope = a["scope"].as_str().map(|s| format!(" scope {s}")).unwrap_or_default();
                out.line(format!(
                    "{:<9} {} → {}{scope}  {}",
                    a["role"].as_str().unwrap_or("?"),
                    a["issuer"].as_str().unwrap_or("?"),
                    a["subject"].as_str().unwrap_or("?"),
                    a["issued_at"].as_str().unwrap_or("")
                ))?;
            }
            Ok(0)
        }
        AttestCmd::Issue { path, subject, role, scope, expires_at } => {
            if attest::RESERVED.contains(&role.as_str()) || role.is_empty() {
                bail!("role `{role}` is reserved for the runtime");
            }
            if crate::store::identity::did_public_key(&subject).is_none() {
                bail!("subject `{subject}` is not an Ed25519 did:key");
            }
            if let Some(e) = &expires_at {
                chrono::DateTime::parse_from_rfc3339(e).map_err(|_| anyhow!("--expires-at `{e}` is not ISO-8601"))?;
            }
            let inst = current()?;
            let mut store = open(&path)?;
            store.unlock_quietly(&inst).map_err(|e| at(&path, e))?;
            let key = store.signing_key().map_err(|e| at(&path, e))?;
            let did = store.meta_get("adf_did").map_err(|e| at(&path, e))?.map(|m| m.value).unwrap_or_default();
            close(store)?;
            let key = key.ok_or_else(|| anyhow!("{}: the signing key is locked or absent", path.display()))?;
            if subject == did {
                bail!("an agent does not attest itself");
            }
            let now = crate::store::now_iso();
            let att = attest::issue(
                &key,
                &attest::Claim {
                    issuer: &did,
                    subject: &subject,
                    role: &role,
                    issued_at: &now,
                    expires_at: expires_at.as_deref(),
                    scope: scope.as_deref(),
                },
            );
            out.line(serde_json::to_string_pretty(&att)?)?;
            Ok(0)
        }
        AttestCmd::Add { path, file } => {
            let att = read_json(&file)?;
            let role = att["role"].as_str().unwrap_or_default();
            if role.is_empty() || attest::RESERVED.contains(&role) {
                bail!("{}: role `{role}` is reserved for the runtime (nothing stored)", file.display());
            }
            let mut store = open(&path)?;
            let did = store.meta_get("adf_did").map_err(|e| at(&path, e))?.map(|m| m.value).unwrap_or_default();
            attest::verify(&att, Some(&did), chrono::Utc::now())
                .map_err(|e| anyhow!("{}: {e} (nothing stored)", file.display()))?;
            let added = store.attestation_store(&att).map_err(|e| at(&path, e))?;
            close(store)?;
            out.line(if added { "attestation stored" } else { "already stored" })?;
            Ok(0)
        }
        AttestCmd::Verify { file, subject } => {
            let att = read_json(&file)?;
            let r = attest::verify(&att, subject.as_deref(), chrono::Utc::now());
            if out.json {
                out.json(&json!({"ok": r.is_ok(), "error": r.as_ref().err()}))?;
            } else {
                out.line(match &r {
                    Ok(()) => "valid".to_string(),
                    Err(e) => format!("INVALID: {e}"),
                })?;
            }
            Ok(if r.is_ok() { 0 } else { 1 })
        }
    }
}
