//! Headless trust (issue 19, identity.md §5): the owner lets a daemon on
//! another machine open chosen agents' credentials, without the owner's
//! phrase ever going there. The daemon's install prints its runtime
//! encryption key as a trust key (`adf trust key`); the owner, where the
//! credentials open, adds a `runtime` slot wrapping the credentials DEK to
//! that key (`adf trust grant`), and removes it to revoke
//! (`adf trust revoke`). The identity envelope is never shared: a daemon
//! signs as itself, the agent's key stays with its owner's runtimes.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::{CREDENTIALS, put_descriptor};
use crate::identity::envelope::{self, Slot};
use crate::identity::install::Install;
use crate::store::Store;
use crate::store::error::{Ctx, Result, StoreError};

const PREFIX: &str = "adf-runtime:";

/// This install's trust key: its runtime DID and X25519 public key.
pub fn trust_key(inst: &Install) -> String {
    format!("{PREFIX}{}#{}", inst.runtime_did, URL_SAFE_NO_PAD.encode(inst.runtime_enc_public()))
}

/// A trust key's runtime DID and public key.
pub fn parse_trust_key(s: &str) -> std::result::Result<(String, [u8; 32]), String> {
    let bad =
        || format!("{s:?} is not a trust key: run `adf trust key` on the daemon's machine and paste what it prints");
    let rest = s.trim().strip_prefix(PREFIX).ok_or_else(bad)?;
    let (did, key) = rest.rsplit_once('#').ok_or_else(bad)?;
    if !did.starts_with("did:key:z") {
        return Err(bad());
    }
    let bytes = URL_SAFE_NO_PAD.decode(key).map_err(|_| bad())?;
    let key: [u8; 32] = bytes.try_into().map_err(|_| bad())?;
    Ok((did.to_string(), key))
}

impl Store {
    /// Runtimes whose slot opens the credentials (DIDs).
    pub fn trusted_runtimes(&self) -> Result<Vec<String>> {
        let Some(d) = self.descriptor(CREDENTIALS)? else { return Ok(Vec::new()) };
        Ok(d.slots
            .iter()
            .filter_map(|s| match s {
                Slot::Runtime(k) => Some(k.recipient_did.clone()),
                _ => None,
            })
            .collect())
    }

    /// Let the runtime with this trust key open the credentials. Needs them
    /// open here. `Ok(false)`: it already could (the slot is refreshed).
    pub fn trust_runtime(&mut self, key: &str) -> Result<bool> {
        let (did, public) = parse_trust_key(key).map_err(StoreError::Invalid)?;
        let (mut d, dek) = self.unlocked_credentials()?;
        let had = d.slots.iter().any(|s| matches!(s, Slot::Runtime(k) if k.recipient_did == did));
        d.slots.retain(|s| !matches!(s, Slot::Runtime(k) if k.recipient_did == did));
        let slot =
            envelope::wrap_key(&dek, CREDENTIALS, &public, &did).map_err(|e| StoreError::Invalid(e.to_string()))?;
        d.slots.push(Slot::Runtime(slot));
        let path = self.path().to_path_buf();
        self.write(|tx| put_descriptor(tx, CREDENTIALS, &d).at(&path))?;
        self.log("info", "trust", "runtime_trusted", &format!("credentials open for runtime {did}"))?;
        Ok(!had)
    }

    /// Take a runtime's slot away. `Ok(false)`: it had none. This install's
    /// own runtime cannot be revoked here (the owner's slot would re-add it).
    pub fn untrust_runtime(&mut self, did: &str, inst: &Install) -> Result<bool> {
        if did == inst.runtime_did {
            return Err(StoreError::Invalid(format!(
                "{did} is this machine's own runtime: revoke it from the machine that should keep access"
            )));
        }
        let Some(mut d) = self.descriptor(CREDENTIALS)? else { return Ok(false) };
        let before = d.slots.len();
        d.slots.retain(|s| !matches!(s, Slot::Runtime(k) if k.recipient_did == did));
        if d.slots.len() == before {
            return Ok(false);
        }
        let path = self.path().to_path_buf();
        self.write(|tx| put_descriptor(tx, CREDENTIALS, &d).at(&path))?;
        self.log("info", "trust", "runtime_revoked", &format!("credentials no longer open for runtime {did}"))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_keys_round_trip_and_garbage_is_refused() {
        let key = format!("{PREFIX}did:key:z6MkabcDEF#{}", URL_SAFE_NO_PAD.encode([7u8; 32]));
        assert_eq!(parse_trust_key(&key).unwrap(), ("did:key:z6MkabcDEF".to_string(), [7u8; 32]));
        for bad in [
            "",
            "did:key:z6Mk#AAAA",
            "adf-runtime:did:key:z6Mk",
            "adf-runtime:nope#AAAA",
            "adf-runtime:did:key:z6Mk#AAAA",
        ] {
            assert!(parse_trust_key(bad).unwrap_err().contains("not a trust key"), "{bad}");
        }
    }
}
