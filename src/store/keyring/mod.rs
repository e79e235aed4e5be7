//! A file's sealed secrets (identity.md §4–5, §8): the two envelopes'
//! states and the unlock cascade (this install's runtime slot, then the
//! owner's slot — which adds a runtime slot so the phrase is needed once
//! per machine — then a password), credentials sealed under the
//! credentials envelope, the signing key under the identity envelope,
//! password slots; provisioning, claiming and the legacy conversion are in
//! `lifecycle.rs`. DEKs live in this process's memory only, per file,
//! shared by every connection to it; a fleet's load leaves the envelopes
//! this install's runtime slot opens waiting, and the first read of a
//! secret opens them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ed25519_dalek::SigningKey;
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde_json::Value;

use super::Store;
use super::error::{Ctx, Result, StoreError};
use super::identity::PURPOSE_PRIVATE;
use crate::identity::envelope::{self, CREDENTIALS, Dek, Descriptor, IDENTITY, Slot};
use crate::identity::install::Install;
use crate::identity::seal;

/// An envelope's state (identity.md §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvState {
    Unlocked,
    Locked,
    Foreign,
    Absent,
}

impl EnvState {
    pub fn as_str(self) -> &'static str {
        match self {
            EnvState::Unlocked => "unlocked",
            EnvState::Locked => "locked",
            EnvState::Foreign => "foreign",
            EnvState::Absent => "absent",
        }
    }
}

/// What `adf inspect` and the API say about an envelope.
#[derive(Debug, Clone, Serialize)]
pub struct EnvelopeInfo {
    pub name: &'static str,
    pub state: EnvState,
    /// `owner did:key:…`, `runtime did:key:…`, `password`.
    pub slots: Vec<String>,
    /// Rows sealed under it.
    pub sealed_rows: i64,
}

/// One `adf_identity` row, without its value.
#[derive(Debug, Clone, Serialize)]
pub struct SecretRow {
    pub purpose: String,
    pub encryption_algo: String,
    pub size: i64,
    pub code_access: bool,
}

#[derive(Default, Clone, Copy)]
struct Deks {
    identity: Option<Dek>,
    credentials: Option<Dek>,
    /// The legacy password key, between unlock and conversion.
    legacy: Option<Dek>,
}

mod lifecycle;
pub mod trust;

pub(crate) use lifecycle::{insert_attestation, provision};

static KEYRINGS: Mutex<Option<HashMap<PathBuf, Deks>>> = Mutex::new(None);

/// Envelopes this install can open by its runtime slot, not opened yet (by
/// file: the install, and which of identity / credentials wait). The X25519
/// agreement that opens one costs about 80 µs: a fleet's load marks them
/// here and the first read of a secret opens them, so loading an agent
/// (and starting a daemon over many) does not pay for keys it may never
/// use.
type Waiting = (std::sync::Arc<Install>, [bool; 2]);
static PENDING: Mutex<Option<HashMap<PathBuf, Waiting>>> = Mutex::new(None);

fn slot_index(name: &str) -> Option<usize> {
    match name {
        IDENTITY => Some(0),
        CREDENTIALS => Some(1),
        _ => None,
    }
}

fn is_pending(canon: &Path, name: &str) -> bool {
    let Some(i) = slot_index(name) else { return false };
    PENDING.lock().ok().is_some_and(|m| m.as_ref().and_then(|m| m.get(canon)).is_some_and(|w| w.1[i]))
}

fn forget_pending(canon: &Path) {
    if let Ok(mut m) = PENDING.lock()
        && let Some(m) = m.as_mut()
    {
        m.remove(canon);
    }
}

/// Mark envelope `i` of a file waiting for this install's runtime slot.
fn mark_pending(canon: &Path, inst: &std::sync::Arc<Install>, i: usize) {
    if let Ok(mut m) = PENDING.lock() {
        let w = m
            .get_or_insert_with(HashMap::new)
            .entry(canon.to_path_buf())
            .and_modify(|w| w.0 = inst.clone())
            .or_insert_with(|| (inst.clone(), [false, false]));
        w.1[i] = true;
    }
}

/// Open an envelope with this install's keys: its runtime slot, else the
/// owner's (a restored phrase); whether the owner's opened it.
fn open_by(d: &Descriptor, name: &str, inst: &Install) -> Option<(Dek, bool)> {
    if let Some(dek) = d.open_for(name, &inst.runtime_enc, "runtime", &inst.runtime_did) {
        return Some((dek, false));
    }
    let owner = inst.owner.as_ref()?;
    d.open_for(name, &owner.encryption, "owner", &inst.owner_did).map(|dek| (dek, true))
}

/// A file's DEK for an envelope, as kept (identity, else credentials).
fn kept(canon: &Path, name: &str) -> Option<Dek> {
    let d = deks(canon);
    if name == IDENTITY { d.identity } else { d.credentials }
}

/// The keys of a file, by its canonical path (`Store::canonical_path`).
fn deks(canon: &Path) -> Deks {
    KEYRINGS.lock().ok().and_then(|m| m.as_ref().and_then(|m| m.get(canon).copied())).unwrap_or_default()
}

pub(super) fn set_dek(canon: &Path, name: &str, dek: Option<Dek>) {
    if let Ok(mut m) = KEYRINGS.lock() {
        let e = m.get_or_insert_with(HashMap::new).entry(canon.to_path_buf()).or_default();
        match name {
            IDENTITY => e.identity = dek,
            CREDENTIALS => e.credentials = dek,
            _ => e.legacy = dek,
        }
    }
}

/// Which envelope a purpose belongs to (None: stays plain).
pub fn envelope_of(purpose: &str) -> Option<&'static str> {
    if purpose == PURPOSE_PRIVATE {
        Some(IDENTITY)
    } else if purpose.starts_with("crypto:") {
        None
    } else {
        Some(CREDENTIALS)
    }
}

/// Purposes code may never read, whatever `code_access` says.
pub fn code_forbidden(purpose: &str) -> bool {
    ["crypto:signing:", "crypto:envelope:", "crypto:kdf:"].iter().any(|p| purpose.starts_with(p))
}

pub(super) fn descriptor_in(conn: &Connection, name: &str) -> rusqlite::Result<Option<Descriptor>> {
    let v: Option<Vec<u8>> = conn
        .query_row("SELECT value FROM adf_identity WHERE purpose = ?1", [format!("crypto:envelope:{name}")], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(v.and_then(|b| Descriptor::parse(&b).ok()))
}

pub(super) fn put_row(
    conn: &Connection,
    purpose: &str,
    value: &[u8],
    algo: &str,
    code_access: bool,
) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO adf_identity(purpose, value, encryption_algo, salt, kdf_params, code_access)
         VALUES (?1, ?2, ?3, NULL, NULL, ?4)
         ON CONFLICT(purpose) DO UPDATE SET value = excluded.value, encryption_algo = excluded.encryption_algo,
           salt = NULL, kdf_params = NULL",
        params![purpose, value, algo, code_access as i64],
    )?;
    Ok(())
}

pub(super) fn put_descriptor(conn: &Connection, name: &str, d: &Descriptor) -> rusqlite::Result<()> {
    put_row(conn, &format!("crypto:envelope:{name}"), &d.to_bytes(), "plain", false)
}

/// A descriptor for a fresh DEK, wrapped to the owner and this install.
pub(super) fn new_descriptor(inst: &Install, name: &str, dek: &Dek) -> std::result::Result<Descriptor, String> {
    let owner = envelope::wrap_key(dek, name, &inst.owner_enc_public, &inst.owner_did).map_err(|e| e.to_string())?;
    let runtime =
        envelope::wrap_key(dek, name, &inst.runtime_enc_public(), &inst.runtime_did).map_err(|e| e.to_string())?;
    Ok(Descriptor { v: 1, slots: vec![Slot::Owner(owner), Slot::Runtime(runtime)] })
}

/// Add (or refresh) this install's runtime slot and the owner's slot.
fn adopt(d: &mut Descriptor, inst: &Install, name: &str, dek: &Dek) -> std::result::Result<(), String> {
    let fresh = new_descriptor(inst, name, dek)?;
    d.slots.retain(|s| match s {
        Slot::Owner(k) => k.recipient_did != inst.owner_did,
        Slot::Runtime(k) => k.recipient_did != inst.runtime_did,
        Slot::Password { .. } => true,
    });
    d.slots.extend(fresh.slots);
    Ok(())
}

impl Store {
    /// Remember DEKs made while creating this file.
    pub(crate) fn remember_deks(path: &Path, identity: Dek, credentials: Option<Dek>) {
        Self::remember_deks_at(&super::canonical(path), identity, credentials);
    }

    /// `remember_deks` for a file known by its canonical path.
    pub(crate) fn remember_deks_at(canon: &Path, identity: Dek, credentials: Option<Dek>) {
        set_dek(canon, IDENTITY, Some(identity));
        if credentials.is_some() {
            set_dek(canon, CREDENTIALS, credentials);
        }
    }

    fn descriptor(&self, name: &str) -> Result<Option<Descriptor>> {
        descriptor_in(self.conn(), name).at(self.path())
    }

    /// The envelope's DEK: kept, else opened now if it was left waiting.
    fn dek(&self, name: &str) -> Option<Dek> {
        kept(self.canonical_path(), name).or_else(|| self.open_waiting(name))
    }

    /// The envelope opens (its DEK is kept or waits to be opened).
    fn dek_known(&self, name: &str) -> bool {
        kept(self.canonical_path(), name).is_some() || is_pending(self.canonical_path(), name)
    }

    /// Open an envelope left waiting: this install's runtime slot, then
    /// (restored phrase) the owner's. The map stays locked meanwhile, so two
    /// connections to one file open it once. A slot that no longer opens
    /// leaves the envelope closed (it then reads as foreign or locked);
    /// the next full unlock adopts it again.
    fn open_waiting(&self, name: &str) -> Option<Dek> {
        let i = slot_index(name)?;
        let canon = self.canonical_path();
        let mut guard = PENDING.lock().ok()?;
        let map = guard.as_mut()?;
        if let Some(k) = kept(canon, name) {
            return Some(k);
        }
        let waiting = map.get_mut(canon).filter(|w| w.1[i])?;
        waiting.1[i] = false;
        let inst = waiting.0.clone();
        if waiting.1 == [false, false] {
            map.remove(canon);
        }
        let d = descriptor_in(self.conn(), name).ok()??;
        let (dek, _) = open_by(&d, name, &inst)?;
        set_dek(canon, name, Some(dek));
        Some(dek)
    }

    /// An envelope's state and slots.
    pub fn envelope(&self, name: &'static str) -> Result<EnvelopeInfo> {
        let sealed_rows: i64 = self
            .conn()
            .query_row("SELECT count(*) FROM adf_identity WHERE encryption_algo = ?1", [format!("env:{name}")], |r| {
                r.get(0)
            })
            .at(self.path())?;
        let Some(d) = self.descriptor(name)? else {
            return Ok(EnvelopeInfo { name, state: EnvState::Absent, slots: Vec::new(), sealed_rows });
        };
        let state = self.state_with(name, &d);
        let slots = d
            .slots
            .iter()
            .map(|s| match s {
                Slot::Owner(k) | Slot::Runtime(k) => format!("{} {}", s.kind(), k.recipient_did),
                Slot::Password { .. } => "password".to_string(),
            })
            .collect();
        Ok(EnvelopeInfo { name, state, slots, sealed_rows })
    }

    /// The state of an envelope that has this descriptor.
    fn state_with(&self, name: &str, d: &Descriptor) -> EnvState {
        if self.dek_known(name) {
            EnvState::Unlocked
        } else if d.has("password") {
            EnvState::Locked
        } else {
            EnvState::Foreign
        }
    }

    /// The unlock cascade for both envelopes with this install's keys.
    /// Returns the envelopes' states after it.
    pub fn unlock(&mut self, inst: &Install) -> Result<[EnvState; 2]> {
        self.unlock_with(inst, true, None)
    }

    /// The cascade without writing (no runtime slot added): for readers
    /// such as `adf inspect` that must leave the file as it was.
    pub fn unlock_quietly(&mut self, inst: &Install) -> Result<[EnvState; 2]> {
        self.unlock_with(inst, false, None)
    }

    /// `unlock`, leaving an envelope that this install's runtime slot
    /// names waiting, to be opened by the first read that needs it (a
    /// fleet's load). An envelope only the owner's slot opens is opened
    /// and adopted now, as `unlock` does.
    pub fn unlock_lazily(&mut self, inst: &std::sync::Arc<Install>) -> Result<[EnvState; 2]> {
        self.unlock_with(inst, true, Some(inst))
    }

    /// The cascade for both envelopes, with `write` (adopt an owner-opened
    /// envelope) and `wait` (leave those this install's runtime slot names
    /// waiting). The states come from the one descriptor read each takes.
    fn unlock_with(
        &mut self,
        inst: &Install,
        write: bool,
        wait: Option<&std::sync::Arc<Install>>,
    ) -> Result<[EnvState; 2]> {
        let mut states = [EnvState::Absent; 2];
        for (i, name) in [IDENTITY, CREDENTIALS].into_iter().enumerate() {
            let Some(d) = self.descriptor(name)? else { continue };
            // The eager cascade opens a waiting envelope here (`dek`).
            let known = if wait.is_some() { self.dek_known(name) } else { self.dek(name).is_some() };
            if !known {
                let named = |s: &Slot| matches!(s, Slot::Runtime(k) if k.recipient_did == inst.runtime_did);
                match wait.filter(|_| d.slots.iter().any(named)) {
                    Some(arc) => mark_pending(self.canonical_path(), arc, i),
                    None => self.unlock_one(name, d.clone(), inst, write)?,
                }
            }
            states[i] = self.state_with(name, &d);
        }
        Ok(states)
    }

    /// The cascade for one envelope: this install's runtime slot, else the
    /// owner's (then, with `write`, a runtime slot for this install).
    fn unlock_one(&mut self, name: &'static str, mut d: Descriptor, inst: &Install, write: bool) -> Result<()> {
        if let Some((dek, by_owner)) = open_by(&d, name, inst) {
            set_dek(self.canonical_path(), name, Some(dek));
            if by_owner && write && !self.is_read_only() {
                adopt(&mut d, inst, name, &dek).map_err(StoreError::Invalid)?;
                let path = self.path().to_path_buf();
                self.write(|tx| put_descriptor(tx, name, &d).at(&path))?;
            }
        }
        Ok(())
    }

    /// Forget this file's DEKs (the file reads as locked or foreign again).
    pub fn lock_envelopes(&self) {
        forget_pending(self.canonical_path());
        for name in [IDENTITY, CREDENTIALS, "legacy"] {
            set_dek(self.canonical_path(), name, None);
        }
    }

    /// The file uses the legacy whole-file password format.
    pub fn is_legacy_password(&self) -> Result<bool> {
        let n: i64 = self
            .conn()
            .query_row(
                "SELECT count(*) FROM adf_identity WHERE encryption_algo IS NOT NULL
                   AND encryption_algo <> 'plain' AND encryption_algo NOT LIKE 'env:%'",
                [],
                |r| r.get(0),
            )
            .at(self.path())?;
        Ok(n > 0)
    }

    /// Open with a password: the credentials envelope's password slot (then
    /// adopted by this owner and install), or a legacy file (then converted
    /// to envelopes). Slow by design (scrypt / PBKDF2): call it off the
    /// async runtime. `Ok(false)`: wrong password.
    pub fn unlock_password(&mut self, password: &str, inst: &Install) -> Result<bool> {
        if self.is_legacy_password()? {
            return self.convert_legacy(password, inst);
        }
        let Some(mut d) = self.descriptor(CREDENTIALS)? else {
            return Err(StoreError::Invalid(format!(
                "{}: this file has no credentials envelope",
                self.path().display()
            )));
        };
        if !d.has("password") {
            return Err(StoreError::Invalid(format!(
                "{}: the credentials envelope has no password",
                self.path().display()
            )));
        }
        let dek = match d.open_with_password(password) {
            Ok(k) => k,
            Err(seal::CryptoError::Decrypt) => return Ok(false),
            Err(e) => return Err(StoreError::Invalid(format!("{}: {e}", self.path().display()))),
        };
        set_dek(self.canonical_path(), CREDENTIALS, Some(dek));
        if !self.is_read_only() {
            adopt(&mut d, inst, CREDENTIALS, &dek).map_err(StoreError::Invalid)?;
            let path = self.path().to_path_buf();
            self.write(|tx| put_descriptor(tx, CREDENTIALS, &d).at(&path))?;
        }
        Ok(true)
    }

    /// Add (or replace) the credentials envelope's password slot at cost
    /// 2^`log_n`. Needs the envelope unlocked.
    pub fn password_set(&mut self, password: &str, log_n: u8) -> Result<()> {
        if password.is_empty() {
            return Err(StoreError::Invalid("the password is empty".into()));
        }
        let (mut d, dek) = self.unlocked_credentials()?;
        d.put(envelope::password_slot(&dek, password, log_n).map_err(|e| StoreError::Invalid(e.to_string()))?);
        let path = self.path().to_path_buf();
        self.write(|tx| put_descriptor(tx, CREDENTIALS, &d).at(&path))
    }

    /// Remove the password slot. `Ok(false)`: there was none.
    pub fn password_remove(&mut self) -> Result<bool> {
        let (mut d, _) = self.unlocked_credentials()?;
        if !d.has("password") {
            return Ok(false);
        }
        d.slots.retain(|s| s.kind() != "password");
        let path = self.path().to_path_buf();
        self.write(|tx| put_descriptor(tx, CREDENTIALS, &d).at(&path))?;
        Ok(true)
    }

    fn unlocked_credentials(&self) -> Result<(Descriptor, Dek)> {
        let d = self.descriptor(CREDENTIALS)?.ok_or_else(|| {
            StoreError::Invalid(format!("{}: this file has no credentials envelope", self.path().display()))
        })?;
        let dek = self.dek(CREDENTIALS).ok_or_else(|| self.locked_error(CREDENTIALS))?;
        Ok((d, dek))
    }

    fn locked_error(&self, name: &'static str) -> StoreError {
        let state = self.envelope(name).map(|e| e.state).unwrap_or(EnvState::Foreign);
        let hint = match state {
            EnvState::Locked => "unlock it with `adf unlock`",
            _ => "it belongs to another owner; `adf claim` re-keys the file to you",
        };
        StoreError::Invalid(format!("{}: the {name} envelope is {} ({hint})", self.path().display(), state.as_str()))
    }

    /// The agent's signing key: `Ok(None)` when there is none or it is
    /// sealed in an envelope this process has not opened.
    pub fn signing_key(&self) -> Result<Option<SigningKey>> {
        let row: Option<(Vec<u8>, String)> = self
            .conn()
            .query_row(
                "SELECT value, coalesce(encryption_algo, 'plain') FROM adf_identity WHERE purpose = ?1",
                [PURPOSE_PRIVATE],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .at(self.path())?;
        let Some((value, algo)) = row else { return Ok(None) };
        let der = match algo.as_str() {
            "plain" => value,
            "env:identity" => match self.dek(IDENTITY).map(|k| seal::open(&k, &value)) {
                Some(Ok(p)) => p,
                Some(Err(e)) => {
                    return Err(StoreError::Invalid(format!("{}: signing key: {e}", self.path().display())));
                }
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
        let seed: Option<[u8; 32]> = der.get(16..48).and_then(|s| s.try_into().ok());
        Ok(seed.filter(|_| der.len() == 48).map(|s| SigningKey::from_bytes(&s)))
    }

    /// Every `adf_identity` row, without values.
    pub fn secrets(&self) -> Result<Vec<SecretRow>> {
        let mut st = self
            .conn()
            .prepare(
                "SELECT purpose, coalesce(encryption_algo, 'plain'), length(value), code_access
                 FROM adf_identity ORDER BY purpose",
            )
            .at(self.path())?;
        let rows = st
            .query_map([], |r| {
                Ok(SecretRow {
                    purpose: r.get(0)?,
                    encryption_algo: r.get(1)?,
                    size: r.get(2)?,
                    code_access: r.get::<_, i64>(3)? != 0,
                })
            })
            .at(self.path())?;
        rows.collect::<rusqlite::Result<Vec<_>>>().at(self.path())
    }

    /// A secret's plaintext (credentials envelope opened as needed).
    pub fn secret_get(&self, purpose: &str) -> Result<Option<Vec<u8>>> {
        let row: Option<(Vec<u8>, String)> = self
            .conn()
            .query_row(
                "SELECT value, coalesce(encryption_algo, 'plain') FROM adf_identity WHERE purpose = ?1",
                [purpose],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .at(self.path())?;
        let Some((value, algo)) = row else { return Ok(None) };
        match algo.as_str() {
            "plain" => Ok(Some(value)),
            "env:credentials" | "env:identity" => {
                let name = if algo == "env:identity" { IDENTITY } else { CREDENTIALS };
                let dek = self.dek(name).ok_or_else(|| self.locked_error(name))?;
                seal::open(&dek, &value)
                    .map(Some)
                    .map_err(|e| StoreError::Invalid(format!("{}: {purpose}: {e}", self.path().display())))
            }
            other => Err(StoreError::Invalid(format!(
                "{}: {purpose} is encrypted with {other}; unlock the file with its password first",
                self.path().display()
            ))),
        }
    }

    /// Store a secret, sealed in its envelope when the file has one.
    /// `code_access` applies only when the row is created.
    pub fn secret_set(&mut self, purpose: &str, value: &[u8], code_access: bool) -> Result<()> {
        if purpose.is_empty() || purpose.starts_with("crypto:") {
            return Err(StoreError::Invalid(format!("purpose `{purpose}` is reserved or empty")));
        }
        let (stored, algo) = match self.descriptor(CREDENTIALS)? {
            Some(_) => {
                let dek = self.dek(CREDENTIALS).ok_or_else(|| self.locked_error(CREDENTIALS))?;
                (seal::seal(&dek, value), "env:credentials")
            }
            None => (value.to_vec(), "plain"),
        };
        let path = self.path().to_path_buf();
        self.write(|tx| {
            tx.execute(
                "INSERT INTO adf_identity(purpose, value, encryption_algo, salt, kdf_params, code_access)
                 VALUES (?1, ?2, ?3, NULL, NULL, ?4)
                 ON CONFLICT(purpose) DO UPDATE SET value = excluded.value, encryption_algo = excluded.encryption_algo",
                params![purpose, stored, algo, code_access as i64],
            )
            .at(&path)
            .map(|_| ())
        })
    }

    /// Remove a secret. `Ok(false)`: there was none.
    pub fn secret_rm(&mut self, purpose: &str) -> Result<bool> {
        if purpose.starts_with("crypto:") {
            return Err(StoreError::Invalid(format!("purpose `{purpose}` is managed by the runtime")));
        }
        let path = self.path().to_path_buf();
        self.write(|tx| tx.execute("DELETE FROM adf_identity WHERE purpose = ?1", [purpose]).at(&path)).map(|n| n > 0)
    }

    /// Attestations, oldest first (their `raw_json`).
    pub fn attestations(&self) -> Result<Vec<Value>> {
        let mut st = self.conn().prepare("SELECT raw_json FROM adf_attestations ORDER BY id").at(self.path())?;
        let rows = st.query_map([], |r| r.get::<_, String>(0)).at(self.path())?;
        let raw = rows.collect::<rusqlite::Result<Vec<_>>>().at(self.path())?;
        Ok(raw.iter().filter_map(|s| serde_json::from_str(s).ok()).collect())
    }

    /// Store a verified attestation (duplicates by signature are a no-op).
    pub fn attestation_store(&mut self, att: &Value) -> Result<bool> {
        let sig = att["signature"].as_str().unwrap_or_default().to_string();
        let path = self.path().to_path_buf();
        self.write(|tx| {
            let seen: i64 = tx
                .query_row("SELECT count(*) FROM adf_attestations WHERE signature = ?1", [&sig], |r| r.get(0))
                .at(&path)?;
            if seen > 0 {
                return Ok(false);
            }
            insert_attestation(tx, att).at(&path)?;
            Ok(true)
        })
    }
}

#[cfg(test)]
mod tests;
