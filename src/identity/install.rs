//! This install's identity settings (identity.md §2, §10), kept in
//! `<config>/identity.json` (mode 0600, written atomically): the owner's
//! DID and X25519 public key (wrapping never needs the phrase), the phrase
//! itself (the terminal's stand-in for OS key storage), and the runtime's
//! own random keys with the owner's `runtime` delegation. Created on first
//! use; `restore` swaps the owner and keeps the runtime key.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ed25519_dalek::SigningKey;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use x25519_dalek::{PublicKey, StaticSecret};

use super::attest;
use super::owner::OwnerKeys;
use super::seal::{b64, unb64};
use crate::store::identity::did_key;

#[derive(Serialize, Deserialize)]
struct Saved {
    owner_did: String,
    owner_enc_public_key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner_phrase: Option<String>,
    #[serde(default)]
    phrase_shown: bool,
    runtime_id: String,
    runtime_did: String,
    runtime_signing_key: String,
    runtime_enc_private_key: String,
    runtime_enc_public_key: String,
    runtime_delegation: Value,
}

/// The owner and runtime as this install knows them.
pub struct Install {
    pub path: PathBuf,
    pub owner_did: String,
    pub owner_enc_public: [u8; 32],
    /// The owner's keys when the phrase is on this machine.
    pub owner: Option<OwnerKeys>,
    /// The phrase was shown to the person once.
    pub phrase_shown: bool,
    pub runtime_id: String,
    pub runtime_did: String,
    pub runtime_signing: SigningKey,
    pub runtime_enc: StaticSecret,
    pub delegation: Value,
}

impl std::fmt::Debug for Install {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Install")
            .field("owner_did", &self.owner_did)
            .field("runtime_did", &self.runtime_did)
            .finish_non_exhaustive()
    }
}

impl Install {
    pub fn runtime_enc_public(&self) -> [u8; 32] {
        PublicKey::from(&self.runtime_enc).to_bytes()
    }

    fn fresh(path: PathBuf, owner: OwnerKeys) -> Self {
        let runtime_signing = SigningKey::from_bytes(&rand::random());
        let runtime_did = did_key(&runtime_signing.verifying_key());
        let delegation = delegate(&owner, &runtime_did);
        Install {
            path,
            owner_did: owner.did.clone(),
            owner_enc_public: owner.encryption_public(),
            owner: Some(owner),
            phrase_shown: false,
            runtime_id: crate::store::create::nanoid(12),
            runtime_did,
            runtime_signing,
            runtime_enc: StaticSecret::from(rand::random::<[u8; 32]>()),
            delegation,
        }
    }

    fn to_saved(&self) -> Saved {
        Saved {
            owner_did: self.owner_did.clone(),
            owner_enc_public_key: b64(&self.owner_enc_public),
            owner_phrase: self.owner.as_ref().map(|o| o.phrase.clone()),
            phrase_shown: self.phrase_shown,
            runtime_id: self.runtime_id.clone(),
            runtime_did: self.runtime_did.clone(),
            runtime_signing_key: b64(&self.runtime_signing.to_bytes()),
            runtime_enc_private_key: b64(&self.runtime_enc.to_bytes()),
            runtime_enc_public_key: b64(&self.runtime_enc_public()),
            runtime_delegation: self.delegation.clone(),
        }
    }

    fn from_saved(path: PathBuf, s: Saved) -> Result<Self, String> {
        let key32 = |what: &str, v: &str| -> Result<[u8; 32], String> {
            unb64(v)
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| format!("{}: `{what}` is not 32 bytes of base64", path.display()))
        };
        let owner = match &s.owner_phrase {
            Some(p) => Some(OwnerKeys::from_phrase(p).map_err(|e| format!("{}: owner phrase: {e}", path.display()))?),
            None => None,
        };
        Ok(Install {
            owner_enc_public: key32("owner_enc_public_key", &s.owner_enc_public_key)?,
            runtime_signing: SigningKey::from_bytes(&key32("runtime_signing_key", &s.runtime_signing_key)?),
            runtime_enc: StaticSecret::from(key32("runtime_enc_private_key", &s.runtime_enc_private_key)?),
            path,
            owner_did: s.owner_did,
            owner,
            phrase_shown: s.phrase_shown,
            runtime_id: s.runtime_id,
            runtime_did: s.runtime_did,
            delegation: s.runtime_delegation,
        })
    }

    fn save(&self) -> Result<(), String> {
        let text = serde_json::to_string_pretty(&self.to_saved()).map_err(|e| e.to_string())?;
        write_private(&self.path, text.as_bytes())
    }
}

/// The owner's `runtime` delegation for `runtime_did`.
fn delegate(owner: &OwnerKeys, runtime_did: &str) -> Value {
    let now = crate::store::now_iso();
    attest::issue(
        &owner.signing,
        &attest::Claim {
            issuer: &owner.did,
            subject: runtime_did,
            role: "runtime",
            issued_at: &now,
            expires_at: None,
            scope: None,
        },
    )
}

/// Write a secret file: 0600, temp file then rename.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let tmp = path.with_extension("json.tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

fn cache() -> &'static Mutex<HashMap<PathBuf, Arc<Install>>> {
    static C: std::sync::OnceLock<Mutex<HashMap<PathBuf, Arc<Install>>>> = std::sync::OnceLock::new();
    C.get_or_init(Default::default)
}

pub fn file_in(config: &Path) -> PathBuf {
    config.join("identity.json")
}

/// Read the install's identity from `config`, if there is one.
pub fn load(config: &Path) -> Result<Option<Arc<Install>>, String> {
    let path = file_in(config);
    if let Some(i) = cache().lock().map_err(|_| "identity cache poisoned")?.get(&path) {
        return Ok(Some(i.clone()));
    }
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let saved: Saved = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let install = Arc::new(Install::from_saved(path.clone(), saved)?);
    cache().lock().map_err(|_| "identity cache poisoned")?.insert(path, install.clone());
    Ok(Some(install))
}

/// The install's identity, created (with a new owner phrase) on first use.
/// `true` when it was created now.
pub fn load_or_create(config: &Path) -> Result<(Arc<Install>, bool), String> {
    if let Some(i) = load(config)? {
        return Ok((i, false));
    }
    let install = Install::fresh(file_in(config), OwnerKeys::generate());
    install.save()?;
    let install = Arc::new(install);
    cache().lock().map_err(|_| "identity cache poisoned")?.insert(install.path.clone(), install.clone());
    Ok((install, true))
}

/// The identity of the default config folder.
pub fn current() -> Result<Arc<Install>, String> {
    load_or_create(&crate::paths::config_dir()).map(|(i, _)| i)
}

/// Make `phrase` the owner (the runtime key stays; a new delegation).
pub fn restore(config: &Path, phrase: &str) -> Result<Arc<Install>, String> {
    let owner = OwnerKeys::from_phrase(phrase)?;
    let install = match load(config)? {
        Some(old) => {
            let delegation = delegate(&owner, &old.runtime_did);
            Install {
                path: old.path.clone(),
                owner_did: owner.did.clone(),
                owner_enc_public: owner.encryption_public(),
                owner: Some(owner),
                phrase_shown: true,
                runtime_id: old.runtime_id.clone(),
                runtime_did: old.runtime_did.clone(),
                runtime_signing: old.runtime_signing.clone(),
                runtime_enc: old.runtime_enc.clone(),
                delegation,
            }
        }
        None => {
            let mut i = Install::fresh(file_in(config), owner);
            i.phrase_shown = true;
            i
        }
    };
    install.save()?;
    let install = Arc::new(install);
    cache().lock().map_err(|_| "identity cache poisoned")?.insert(install.path.clone(), install.clone());
    Ok(install)
}

/// Record that the phrase has been shown.
pub fn mark_shown(config: &Path) -> Result<(), String> {
    let Some(i) = load(config)? else { return Ok(()) };
    if i.phrase_shown {
        return Ok(());
    }
    let mut saved = i.to_saved();
    saved.phrase_shown = true;
    let updated = Arc::new(Install::from_saved(i.path.clone(), saved)?);
    updated.save()?;
    cache().lock().map_err(|_| "identity cache poisoned")?.insert(updated.path.clone(), updated);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_reloaded_and_restored() {
        let dir = tempfile::tempdir().unwrap();
        let (a, created) = load_or_create(dir.path()).unwrap();
        assert!(created);
        let (b, again) = load_or_create(dir.path()).unwrap();
        assert!(!again);
        assert_eq!(a.owner_did, b.owner_did);
        // A cold read of the file gives the same keys.
        cache().lock().unwrap().clear();
        let c = load(dir.path()).unwrap().unwrap();
        assert_eq!(c.runtime_did, a.runtime_did);
        assert_eq!(c.runtime_enc_public(), a.runtime_enc_public());
        assert_eq!(c.owner.as_ref().unwrap().did, a.owner_did);
        attest::verify(&c.delegation, Some(&c.runtime_did), chrono::Utc::now()).unwrap();
        assert_eq!(c.delegation["issuer"], a.owner_did.as_str());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(file_in(dir.path())).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let phrase = "legal winner thank year wave sausage worth useful legal winner thank yellow";
        let r = restore(dir.path(), phrase).unwrap();
        assert_eq!(r.runtime_did, a.runtime_did, "the runtime key stays");
        assert_eq!(r.owner_did, OwnerKeys::from_phrase(phrase).unwrap().did);
        attest::verify(&r.delegation, Some(&r.runtime_did), chrono::Utc::now()).unwrap();
        assert!(restore(dir.path(), "not a phrase").is_err());
        assert_eq!(load(dir.path()).unwrap().unwrap().owner_did, r.owner_did, "a bad restore changes nothing");
    }
}
