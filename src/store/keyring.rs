//! A file's sealed secrets (identity.md §4–5, §8): the two envelopes'
//! states and the unlock cascade (this install's runtime slot, then the
//! owner's slot — which adds a runtime slot so the phrase is needed once
//! per machine — then a password), credentials sealed under the
//! credentials envelope, the signing key under the identity envelope,
//! password slots, provisioning a new identity, claiming a foreign file,
//! and converting the legacy whole-file password format. DEKs live in this
//! process's memory only, per file, shared by every connection to it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ed25519_dalek::SigningKey;
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde_json::Value;

use super::error::{Ctx, Result, StoreError};
use super::identity::{AgentKeys, PURPOSE_PRIVATE, PURPOSE_PUBLIC};
use super::meta::MetaProtection;
use super::{Store, now_iso};
use crate::identity::attest;
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

static KEYRINGS: Mutex<Option<HashMap<PathBuf, Deks>>> = Mutex::new(None);

fn key_of(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

fn deks(path: &Path) -> Deks {
    let key = key_of(path);
    KEYRINGS.lock().ok().and_then(|m| m.as_ref().and_then(|m| m.get(&key).copied())).unwrap_or_default()
}

fn set_dek(path: &Path, name: &str, dek: Option<Dek>) {
    let key = key_of(path);
    if let Ok(mut m) = KEYRINGS.lock() {
        let e = m.get_or_insert_with(HashMap::new).entry(key).or_default();
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

fn descriptor_in(conn: &Connection, name: &str) -> rusqlite::Result<Option<Descriptor>> {
    let v: Option<Vec<u8>> = conn
        .query_row("SELECT value FROM adf_identity WHERE purpose = ?1", [format!("crypto:envelope:{name}")], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(v.and_then(|b| Descriptor::parse(&b).ok()))
}

fn put_row(conn: &Connection, purpose: &str, value: &[u8], algo: &str, code_access: bool) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO adf_identity(purpose, value, encryption_algo, salt, kdf_params, code_access)
         VALUES (?1, ?2, ?3, NULL, NULL, ?4)
         ON CONFLICT(purpose) DO UPDATE SET value = excluded.value, encryption_algo = excluded.encryption_algo,
           salt = NULL, kdf_params = NULL",
        params![purpose, value, algo, code_access as i64],
    )?;
    Ok(())
}

fn put_descriptor(conn: &Connection, name: &str, d: &Descriptor) -> rusqlite::Result<()> {
    put_row(conn, &format!("crypto:envelope:{name}"), &d.to_bytes(), "plain", false)
}

/// A descriptor for a fresh DEK, wrapped to the owner and this install.
fn new_descriptor(inst: &Install, name: &str, dek: &Dek) -> std::result::Result<Descriptor, String> {
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

/// Insert an attestation; `owner` / `operator` replace their role.
pub(crate) fn insert_attestation(conn: &Connection, att: &Value) -> rusqlite::Result<()> {
    let role = att["role"].as_str().unwrap_or_default();
    if attest::CURRENT_STATE.contains(&role) {
        conn.execute("DELETE FROM adf_attestations WHERE role = ?1", [role])?;
    }
    conn.execute(
        "INSERT INTO adf_attestations(issuer, subject, role, issued_at, expires_at, scope, signature, raw_json)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            att["issuer"].as_str(),
            att["subject"].as_str(),
            role,
            att["issued_at"].as_str(),
            att["expires_at"].as_str(),
            att["scope"].as_str(),
            att["signature"].as_str(),
            att.to_string()
        ],
    )?;
    Ok(())
}

/// The owner and operator attestations for `did`.
fn stamp_attestations(conn: &Connection, inst: &Install, did: &str, now: &str) -> rusqlite::Result<()> {
    let claim = |issuer: &'static str| attest::Claim {
        issuer: if issuer == "owner" { &inst.owner_did } else { &inst.runtime_did },
        subject: did,
        role: issuer_role(issuer),
        issued_at: now,
        expires_at: None,
        scope: None,
    };
    if let Some(owner) = &inst.owner {
        insert_attestation(conn, &attest::issue(&owner.signing, &claim("owner")))?;
    }
    insert_attestation(conn, &attest::issue(&inst.runtime_signing, &claim("runtime")))
}

fn issuer_role(issuer: &str) -> &'static str {
    if issuer == "owner" { "owner" } else { "operator" }
}

/// Seal a new identity (and, unless `credentials` is kept, a new
/// credentials envelope) into the file, stamp the meta and attestations.
/// Runs inside the caller's transaction.
pub(crate) fn provision(
    conn: &Connection,
    path: &Path,
    inst: &Install,
    keys: &AgentKeys,
    now: &str,
    new_credentials: bool,
) -> std::result::Result<(Dek, Option<Dek>), StoreError> {
    let id_dek: Dek = rand::random();
    let d = new_descriptor(inst, IDENTITY, &id_dek).map_err(StoreError::Invalid)?;
    let cred = if new_credentials {
        let dek: Dek = rand::random();
        let d = new_descriptor(inst, CREDENTIALS, &dek).map_err(StoreError::Invalid)?;
        put_descriptor(conn, CREDENTIALS, &d).at(path)?;
        Some(dek)
    } else {
        None
    };
    let run = || -> rusqlite::Result<()> {
        put_descriptor(conn, IDENTITY, &d)?;
        put_row(conn, PURPOSE_PRIVATE, &seal::seal(&id_dek, &keys.private_der), "env:identity", false)?;
        put_row(conn, PURPOSE_PUBLIC, &keys.public_der, "plain", false)?;
        Store::meta_put_system(conn, "adf_did", &keys.did, MetaProtection::Readonly)?;
        Store::meta_put_system(conn, "adf_owner_did", &inst.owner_did, MetaProtection::Readonly)?;
        Store::meta_put_system(conn, "adf_runtime_did", &inst.runtime_did, MetaProtection::Readonly)?;
        stamp_attestations(conn, inst, &keys.did, now)
    };
    run().at(path)?;
    Ok((id_dek, cred))
}

impl Store {
    /// Remember DEKs made while creating this file.
    pub(crate) fn remember_deks(path: &Path, identity: Dek, credentials: Option<Dek>) {
        set_dek(path, IDENTITY, Some(identity));
        if credentials.is_some() {
            set_dek(path, CREDENTIALS, credentials);
        }
    }

    fn descriptor(&self, name: &str) -> Result<Option<Descriptor>> {
        descriptor_in(self.conn(), name).at(self.path())
    }

    fn dek(&self, name: &str) -> Option<Dek> {
        let d = deks(self.path());
        if name == IDENTITY { d.identity } else { d.credentials }
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
        let state = if self.dek(name).is_some() {
            EnvState::Unlocked
        } else if d.has("password") {
            EnvState::Locked
        } else {
            EnvState::Foreign
        };
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

    /// The unlock cascade for both envelopes with this install's keys.
    /// Returns the envelopes' states after it.
    pub fn unlock(&mut self, inst: &Install) -> Result<[EnvState; 2]> {
        self.unlock_with(inst, true)
    }

    /// The cascade without writing (no runtime slot added): for readers
    /// such as `adf inspect` that must leave the file as it was.
    pub fn unlock_quietly(&mut self, inst: &Install) -> Result<[EnvState; 2]> {
        self.unlock_with(inst, false)
    }

    fn unlock_with(&mut self, inst: &Install, write: bool) -> Result<[EnvState; 2]> {
        for name in [IDENTITY, CREDENTIALS] {
            if self.dek(name).is_some() {
                continue;
            }
            let Some(mut d) = self.descriptor(name)? else { continue };
            if let Some(dek) = d.open_with_key(name, &inst.runtime_enc, "runtime") {
                set_dek(self.path(), name, Some(dek));
            } else if let Some(owner) = &inst.owner
                && let Some(dek) = d.open_with_key(name, &owner.encryption, "owner")
            {
                set_dek(self.path(), name, Some(dek));
                if write && !self.is_read_only() {
                    adopt(&mut d, inst, name, &dek).map_err(StoreError::Invalid)?;
                    let path = self.path().to_path_buf();
                    self.write(|tx| put_descriptor(tx, name, &d).at(&path))?;
                }
            }
        }
        Ok([self.envelope(IDENTITY)?.state, self.envelope(CREDENTIALS)?.state])
    }

    /// Forget this file's DEKs (the file reads as locked or foreign again).
    pub fn lock_envelopes(&self) {
        for name in [IDENTITY, CREDENTIALS, "legacy"] {
            set_dek(self.path(), name, None);
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
        set_dek(self.path(), CREDENTIALS, Some(dek));
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

    /// Re-key a foreign file to this owner (identity.md §8 "Claim"): a new
    /// DID (the old one goes to `adf_did_history`), a `clone` attestation,
    /// credentials kept only when a password can still open them.
    pub fn claim(&mut self, inst: &Install) -> Result<String> {
        self.unlock(inst)?;
        let id = self.envelope(IDENTITY)?;
        if id.state == EnvState::Unlocked || (id.state == EnvState::Absent && self.signing_key()?.is_some()) {
            return Err(StoreError::Invalid(format!(
                "{}: this file's identity already opens for you; nothing to claim",
                self.path().display()
            )));
        }
        let cred = self.envelope(CREDENTIALS)?;
        let keep_credentials = match cred.state {
            EnvState::Unlocked => true,
            EnvState::Locked => cred.sealed_rows > 0,
            EnvState::Foreign | EnvState::Absent => false,
        };
        let old = self.meta_get("adf_did")?.map(|m| m.value).unwrap_or_default();
        let keys = AgentKeys::generate().map_err(StoreError::Invalid)?;
        let now = now_iso();
        let path = self.path().to_path_buf();
        let (id_dek, cred_dek) = self.write(|tx| {
            let run = || -> rusqlite::Result<()> {
                tx.execute(
                    "DELETE FROM adf_identity WHERE purpose IN (?1, ?2, 'crypto:envelope:identity')",
                    [PURPOSE_PRIVATE, PURPOSE_PUBLIC],
                )?;
                if !keep_credentials {
                    tx.execute(
                        "DELETE FROM adf_identity WHERE purpose = 'crypto:envelope:credentials'
                           OR encryption_algo = 'env:credentials'",
                        [],
                    )?;
                }
                push_history(tx, &old)
            };
            run().at(&path)?;
            let deks = provision(tx, &path, inst, &keys, &now, !keep_credentials)?;
            if let Some(owner) = &inst.owner {
                let clone = attest::issue(
                    &owner.signing,
                    &attest::Claim {
                        issuer: &inst.owner_did,
                        subject: &keys.did,
                        role: "clone",
                        issued_at: &now,
                        expires_at: None,
                        scope: Some(&old).filter(|o| !o.is_empty()).map(String::as_str),
                    },
                );
                insert_attestation(tx, &clone).at(&path)?;
            }
            Ok(deks)
        })?;
        Store::remember_deks(&path, id_dek, cred_dek);
        Ok(keys.did)
    }

    /// Read a legacy whole-file-password file with `password`, reseal
    /// everything into envelopes (owner + runtime slots, and the same
    /// password on the credentials envelope) and drop `crypto:kdf:*`.
    fn convert_legacy(&mut self, password: &str, inst: &Install) -> Result<bool> {
        let salt_hex: Vec<u8> = self
            .conn()
            .query_row("SELECT value FROM adf_identity WHERE purpose = 'crypto:kdf:salt'", [], |r| r.get(0))
            .optional()
            .at(self.path())?
            .ok_or_else(|| {
                StoreError::Invalid(format!("{}: legacy file without crypto:kdf:salt", self.path().display()))
            })?;
        let salt = hex_decode(std::str::from_utf8(&salt_hex).unwrap_or("").trim())
            .ok_or_else(|| StoreError::Invalid(format!("{}: crypto:kdf:salt is not hex", self.path().display())))?;
        let mut key = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<sha2::Sha512>(password.as_bytes(), &salt, 100_000, &mut key);
        let rows: Vec<LegacyRow> = {
            let mut st = self
                .conn()
                .prepare("SELECT purpose, value, salt, coalesce(encryption_algo, 'plain') FROM adf_identity")
                .at(self.path())?;
            let it = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))).at(self.path())?;
            it.collect::<rusqlite::Result<Vec<_>>>().at(self.path())?
        };
        let mut plain = Vec::new();
        for (purpose, value, iv, algo) in rows {
            if algo != "aes-256-gcm" {
                continue;
            }
            let iv = iv.unwrap_or_default();
            match seal::decrypt(&key, &iv, &value) {
                Ok(p) => plain.push((purpose, p)),
                Err(_) => return Ok(false),
            }
        }
        if plain.is_empty() {
            return Ok(false);
        }
        let id_dek: Dek = rand::random();
        let cred_dek: Dek = rand::random();
        let id_d = new_descriptor(inst, IDENTITY, &id_dek).map_err(StoreError::Invalid)?;
        let mut cred_d = new_descriptor(inst, CREDENTIALS, &cred_dek).map_err(StoreError::Invalid)?;
        cred_d.put(
            envelope::password_slot(&cred_dek, password, envelope::PASSWORD_LOG_N)
                .map_err(|e| StoreError::Invalid(e.to_string()))?,
        );
        let path = self.path().to_path_buf();
        self.write(|tx| {
            let run = || -> rusqlite::Result<()> {
                put_descriptor(tx, IDENTITY, &id_d)?;
                put_descriptor(tx, CREDENTIALS, &cred_d)?;
                for (purpose, p) in &plain {
                    let (v, algo) = match envelope_of(purpose) {
                        Some(IDENTITY) => (seal::seal(&id_dek, p), "env:identity"),
                        Some(_) => (seal::seal(&cred_dek, p), "env:credentials"),
                        None => (p.clone(), "plain"),
                    };
                    tx.execute(
                        "UPDATE adf_identity SET value = ?2, encryption_algo = ?3, salt = NULL, kdf_params = NULL
                         WHERE purpose = ?1",
                        params![purpose, v, algo],
                    )?;
                }
                tx.execute("DELETE FROM adf_identity WHERE purpose LIKE 'crypto:kdf:%'", [])?;
                Ok(())
            };
            run().at(&path)
        })?;
        Store::remember_deks(&path, id_dek, Some(cred_dek));
        Ok(true)
    }
}

/// A legacy row: purpose, value, IV (the `salt` column), algorithm.
type LegacyRow = (String, Vec<u8>, Option<Vec<u8>>, String);

fn push_history(conn: &Connection, did: &str) -> rusqlite::Result<()> {
    if did.is_empty() {
        return Ok(());
    }
    let cur: Option<String> =
        conn.query_row("SELECT value FROM adf_meta WHERE key = 'adf_did_history'", [], |r| r.get(0)).optional()?;
    let mut list: Vec<String> = cur.and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default();
    if !list.iter().any(|d| d == did) {
        list.push(did.to_string());
    }
    let text = serde_json::to_string(&list).unwrap_or_else(|_| "[]".into());
    Store::meta_put_system(conn, "adf_did_history", &text, MetaProtection::Readonly)
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}
