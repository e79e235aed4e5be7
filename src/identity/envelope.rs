//! The two envelopes of a file (identity.md §5): a random 32-byte DEK per
//! envelope seals its rows, and the descriptor row `{"v":1,"slots":[…]}`
//! holds that DEK wrapped for each way in: to the owner's and this
//! install's X25519 keys (HKDF info `adf-envelope-v1:<name>`), or to a
//! password through scrypt (N = 2^17, r = 8, p = 1, 32-byte salt).

use serde::{Deserialize, Serialize};
use x25519_dalek::StaticSecret;

use super::seal::{self, CryptoError, b64, unb64};

pub const IDENTITY: &str = "identity";
pub const CREDENTIALS: &str = "credentials";

/// scrypt cost of new password slots: N = 2^17.
pub const PASSWORD_LOG_N: u8 = 17;
/// The largest N a file may ask us to spend (2^20, 1 GiB at r = 8).
const MAX_LOG_N: u8 = 20;

/// A data-encryption key, only ever in memory.
pub type Dek = [u8; 32];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KdfParams {
    #[serde(rename = "N")]
    pub n: u64,
    pub r: u32,
    pub p: u32,
}

/// One way to open an envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Slot {
    Owner(KeySlot),
    Runtime(KeySlot),
    Password { kdf: String, kdf_params: KdfParams, salt: String, iv: String, wrapped_dek: String },
}

/// A DEK wrapped to an X25519 public key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeySlot {
    pub recipient_did: String,
    pub ephemeral_pub: String,
    pub iv: String,
    pub wrapped_dek: String,
}

impl Slot {
    pub fn kind(&self) -> &'static str {
        match self {
            Slot::Owner(_) => "owner",
            Slot::Runtime(_) => "runtime",
            Slot::Password { .. } => "password",
        }
    }
}

/// The descriptor row's JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Descriptor {
    pub v: u32,
    pub slots: Vec<Slot>,
}

impl Descriptor {
    pub fn parse(bytes: &[u8]) -> Result<Self, CryptoError> {
        serde_json::from_slice(bytes).map_err(|_| CryptoError::Invalid("envelope descriptor"))
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn has(&self, kind: &str) -> bool {
        self.slots.iter().any(|s| s.kind() == kind)
    }

    /// Replace the slots of `kind` with `slot`.
    pub fn put(&mut self, slot: Slot) {
        let kind = slot.kind();
        self.slots.retain(|s| s.kind() != kind);
        self.slots.push(slot);
    }

    /// Try each key slot of a kind with `secret`.
    pub fn open_with_key(&self, envelope: &str, secret: &StaticSecret, kind: &str) -> Option<Dek> {
        self.open_for(envelope, secret, kind, "")
    }

    /// `open_with_key`, trying first the slots wrapped to `recipient` (a
    /// DID): a file that several installs opened holds a runtime slot for
    /// each, and every slot tried costs an X25519 agreement.
    pub fn open_for(&self, envelope: &str, secret: &StaticSecret, kind: &str, recipient: &str) -> Option<Dek> {
        let key_slots = || {
            self.slots.iter().filter(|s| s.kind() == kind).filter_map(|s| match s {
                Slot::Owner(k) | Slot::Runtime(k) => Some(k),
                Slot::Password { .. } => None,
            })
        };
        let (mine, others): (Vec<&KeySlot>, Vec<&KeySlot>) = key_slots().partition(|k| k.recipient_did == recipient);
        mine.into_iter().chain(others).find_map(|k| unwrap_key(k, envelope, secret).ok())
    }

    /// Try the password slot (slow: scrypt).
    pub fn open_with_password(&self, password: &str) -> Result<Dek, CryptoError> {
        let slot = self.slots.iter().find(|s| matches!(s, Slot::Password { .. }));
        match slot {
            Some(Slot::Password { kdf, kdf_params, salt, iv, wrapped_dek }) => {
                if kdf != "scrypt" {
                    return Err(CryptoError::Invalid("password slot KDF (only scrypt)"));
                }
                let log_n = log2_exact(kdf_params.n).filter(|n| *n <= MAX_LOG_N);
                let log_n = log_n.ok_or(CryptoError::Invalid("scrypt N"))?;
                let key = seal::scrypt32(password.as_bytes(), &unb64(salt)?, log_n, kdf_params.r, kdf_params.p)?;
                dek_of(seal::decrypt(&key, &unb64(iv)?, &unb64(wrapped_dek)?)?)
            }
            _ => Err(CryptoError::Invalid("envelope without a password slot")),
        }
    }
}

fn log2_exact(n: u64) -> Option<u8> {
    (n.is_power_of_two() && n > 1).then(|| n.trailing_zeros() as u8)
}

fn dek_of(bytes: Vec<u8>) -> Result<Dek, CryptoError> {
    bytes.try_into().map_err(|_| CryptoError::Invalid("DEK length"))
}

fn info(envelope: &str) -> Vec<u8> {
    format!("adf-envelope-v1:{envelope}").into_bytes()
}

/// Wrap `dek` to an X25519 public key.
pub fn wrap_key(dek: &Dek, envelope: &str, recipient: &[u8; 32], recipient_did: &str) -> Result<KeySlot, CryptoError> {
    let (eph, key) = seal::agree_to(recipient, &info(envelope))?;
    let iv: [u8; seal::IV_LEN] = rand::random();
    Ok(KeySlot {
        recipient_did: recipient_did.to_string(),
        ephemeral_pub: b64(&eph),
        iv: b64(&iv),
        wrapped_dek: b64(&seal::encrypt(&key, &iv, dek)),
    })
}

pub fn unwrap_key(slot: &KeySlot, envelope: &str, secret: &StaticSecret) -> Result<Dek, CryptoError> {
    let eph: [u8; 32] = unb64(&slot.ephemeral_pub)?.try_into().map_err(|_| CryptoError::Invalid("ephemeral key"))?;
    let key = seal::agree_from(secret, &eph, &info(envelope))?;
    dek_of(seal::decrypt(&key, &unb64(&slot.iv)?, &unb64(&slot.wrapped_dek)?)?)
}

/// A password slot for `dek` at cost 2^`log_n` (tests use small costs).
pub fn password_slot(dek: &Dek, password: &str, log_n: u8) -> Result<Slot, CryptoError> {
    let salt: [u8; 32] = rand::random();
    let key = seal::scrypt32(password.as_bytes(), &salt, log_n, 8, 1)?;
    let iv: [u8; seal::IV_LEN] = rand::random();
    Ok(Slot::Password {
        kdf: "scrypt".into(),
        kdf_params: KdfParams { n: 1 << log_n, r: 8, p: 1 },
        salt: b64(&salt),
        iv: b64(&iv),
        wrapped_dek: b64(&seal::encrypt(&key, &iv, dek)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use x25519_dalek::PublicKey;

    #[test]
    fn key_slots_open_only_for_their_key_and_envelope() {
        let dek: Dek = rand::random();
        let me = StaticSecret::from([3u8; 32]);
        let slot = wrap_key(&dek, IDENTITY, PublicKey::from(&me).as_bytes(), "did:key:zX").unwrap();
        assert_eq!(unwrap_key(&slot, IDENTITY, &me).unwrap(), dek);
        assert!(unwrap_key(&slot, CREDENTIALS, &me).is_err(), "the envelope name is bound in");
        assert!(unwrap_key(&slot, IDENTITY, &StaticSecret::from([4u8; 32])).is_err());
        let d = Descriptor { v: 1, slots: vec![Slot::Runtime(slot)] };
        let json: serde_json::Value = serde_json::from_slice(&d.to_bytes()).unwrap();
        assert_eq!(json["slots"][0]["type"], "runtime");
        assert_eq!(
            json["slots"][0].as_object().unwrap().keys().collect::<Vec<_>>(),
            ["type", "recipient_did", "ephemeral_pub", "iv", "wrapped_dek"]
        );
        assert_eq!(Descriptor::parse(&d.to_bytes()).unwrap(), d);
        assert_eq!(d.open_with_key(IDENTITY, &me, "runtime"), Some(dek));
        assert_eq!(d.open_with_key(IDENTITY, &me, "owner"), None);
    }

    #[test]
    fn password_slot_record_and_round_trip() {
        let dek: Dek = rand::random();
        let slot = password_slot(&dek, "hunter2", 10).unwrap();
        let d = Descriptor { v: 1, slots: vec![slot] };
        let json: serde_json::Value = serde_json::from_slice(&d.to_bytes()).unwrap();
        assert_eq!(json["slots"][0]["kdf_params"], serde_json::json!({"N": 1024, "r": 8, "p": 1}));
        assert_eq!(unb64(json["slots"][0]["salt"].as_str().unwrap()).unwrap().len(), 32);
        assert_eq!(d.open_with_password("hunter2").unwrap(), dek);
        assert_eq!(d.open_with_password("hunter3"), Err(CryptoError::Decrypt));
    }

    #[test]
    fn absurd_scrypt_costs_are_refused() {
        let mut d = Descriptor { v: 1, slots: vec![password_slot(&[0; 32], "x", 4).unwrap()] };
        if let Slot::Password { kdf_params, .. } = &mut d.slots[0] {
            kdf_params.n = 1 << 40;
        }
        assert_eq!(d.open_with_password("x"), Err(CryptoError::Invalid("scrypt N")));
    }
}
