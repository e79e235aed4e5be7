//! The identity's lifecycle in a file (identity.md §8): provisioning a
//! new sealed identity with its attestations, claiming a file that belongs
//! to someone else, and converting the legacy whole-file password format to
//! envelopes.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use super::{EnvState, envelope_of, new_descriptor, put_descriptor, put_row};
use crate::identity::attest;
use crate::identity::envelope::{self, CREDENTIALS, Dek, IDENTITY};
use crate::identity::install::Install;
use crate::identity::seal;
use crate::store::error::{Ctx, Result, StoreError};
use crate::store::identity::{AgentKeys, PURPOSE_PRIVATE, PURPOSE_PUBLIC};
use crate::store::meta::MetaProtection;
use crate::store::{Store, now_iso};

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
    /// Re-key a foreign file to this owner (identity.md §8 "Claim"): a new
    /// DID (the old one goes to `adf_did_history`), a `clone` attestation,
    /// credentials kept only when a password can still open them.
    pub fn claim(&mut self, inst: &Install) -> Result<String> {
        self.rekey(inst, false)
    }

    /// Give a copy of an agent (a second file with its DID and id) its own
    /// identity: a new DID and a new config id, so both can run side by
    /// side; the copy keeps what opens for this install.
    pub fn claim_copy(&mut self, inst: &Install) -> Result<String> {
        self.rekey(inst, true)
    }

    fn rekey(&mut self, inst: &Install, copy: bool) -> Result<String> {
        self.unlock(inst)?;
        let id = self.envelope(IDENTITY)?;
        let opens = id.state == EnvState::Unlocked || (id.state == EnvState::Absent && self.signing_key()?.is_some());
        if opens && !copy {
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
            if copy {
                // The copy's config id too: two files with one id do not
                // load side by side.
                let text: String =
                    tx.query_row("SELECT config_json FROM adf_config WHERE id = 1", [], |r| r.get(0)).at(&path)?;
                let mut cfg: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| StoreError::Invalid(format!("{}: config is not JSON: {e}", path.display())))?;
                cfg["id"] = serde_json::json!(crate::store::create::nanoid(12));
                crate::store::config::write_config(tx, &cfg, &now).at(&path)?;
            }
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
        Store::remember_deks_at(self.canonical_path(), id_dek, cred_dek);
        Ok(keys.did)
    }

    /// Read a legacy whole-file-password file with `password`, reseal
    /// everything into envelopes (owner + runtime slots, and the same
    /// password on the credentials envelope) and drop `crypto:kdf:*`.
    pub(super) fn convert_legacy(&mut self, password: &str, inst: &Install) -> Result<bool> {
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
        Store::remember_deks_at(self.canonical_path(), id_dek, Some(cred_dek));
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
