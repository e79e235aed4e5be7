//! The owner: a human's keys, all derived from a 12-word BIP-39 phrase
//! (identity.md §2). The signing key is SLIP-0010 `m/44'/0'/0'` used as an
//! Ed25519 seed, the encryption key `m/44'/0'/1'` used as an X25519 scalar;
//! the same phrase anywhere gives the same owner DID.

use ed25519_dalek::SigningKey;
use x25519_dalek::{PublicKey, StaticSecret};

use super::slip10;
use crate::store::identity::did_key;

/// The owner's keys. The phrase stays with them so it can be shown again.
pub struct OwnerKeys {
    pub phrase: String,
    pub signing: SigningKey,
    pub encryption: StaticSecret,
    pub did: String,
}

/// Shows the DID only: the phrase and keys never reach a log.
impl std::fmt::Debug for OwnerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerKeys").field("did", &self.did).finish_non_exhaustive()
    }
}

impl OwnerKeys {
    /// A new owner with a fresh 128-bit phrase.
    pub fn generate() -> Self {
        let entropy: [u8; 16] = rand::random();
        // 16 bytes is a valid BIP-39 entropy length.
        let phrase = bip39::Mnemonic::from_entropy(&entropy).map(|m| m.to_string()).unwrap_or_default();
        Self::from_phrase(&phrase).unwrap_or_else(|_| unreachable_owner())
    }

    /// The owner of `phrase` (trimmed, lower-cased, whitespace collapsed).
    pub fn from_phrase(phrase: &str) -> Result<Self, String> {
        let normal = phrase.trim().to_lowercase().split_whitespace().collect::<Vec<_>>().join(" ");
        let m = bip39::Mnemonic::parse_normalized(&normal).map_err(|e| format!("not a BIP-39 phrase: {e}"))?;
        if m.word_count() != 12 {
            return Err(format!("an owner phrase has 12 words, this one has {}", m.word_count()));
        }
        let seed = m.to_seed_normalized("");
        let (sign, _) = slip10::derive(&seed, &slip10::OWNER_SIGNING).ok_or("key derivation failed")?;
        let (enc, _) = slip10::derive(&seed, &slip10::OWNER_ENCRYPTION).ok_or("key derivation failed")?;
        let signing = SigningKey::from_bytes(&sign);
        let did = did_key(&signing.verifying_key());
        Ok(OwnerKeys { phrase: normal, signing, encryption: StaticSecret::from(enc), did })
    }

    /// The X25519 public key envelopes are wrapped to.
    pub fn encryption_public(&self) -> [u8; 32] {
        PublicKey::from(&self.encryption).to_bytes()
    }
}

#[cold]
fn unreachable_owner() -> OwnerKeys {
    // from_entropy(16 bytes) always yields a valid 12-word phrase; keep a
    // non-panicking path anyway.
    let signing = SigningKey::from_bytes(&rand::random());
    let did = did_key(&signing.verifying_key());
    OwnerKeys { phrase: String::new(), signing, encryption: StaticSecret::from(rand::random::<[u8; 32]>()), did }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PHRASE: &str =
        "abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon about";

    #[test]
    fn same_phrase_same_owner_and_normalisation() {
        let a = OwnerKeys::from_phrase(PHRASE).unwrap();
        let b = OwnerKeys::from_phrase(&format!("  {}  ", PHRASE.to_uppercase().replace(' ', "   "))).unwrap();
        assert_eq!(a.did, b.did);
        assert!(a.did.starts_with("did:key:z6Mk"));
        assert_eq!(a.encryption_public(), b.encryption_public());
        assert_ne!(a.signing.to_bytes(), a.encryption.to_bytes(), "two paths, two keys");
        let g = OwnerKeys::generate();
        assert_eq!(g.phrase.split(' ').count(), 12);
        assert_eq!(OwnerKeys::from_phrase(&g.phrase).unwrap().did, g.did);
    }

    #[test]
    fn bad_phrases_say_why() {
        assert!(OwnerKeys::from_phrase("abandon abandon").unwrap_err().contains("BIP-39"));
        let wrong_checksum = PHRASE.replace("about", "abandon");
        assert!(OwnerKeys::from_phrase(&wrong_checksum).is_err());
    }

    #[test]
    fn standard_bip39_seed_feeds_the_derivation() {
        // BIP-39 reference vector: entropy 0x00…00, empty passphrase has
        // seed 5eb00bbd…; SLIP-0010 then fixes the owner key.
        let m = bip39::Mnemonic::parse_normalized(PHRASE).unwrap();
        let seed = m.to_seed_normalized("");
        assert_eq!(seed[..4], [0x5e, 0xb0, 0x0b, 0xbd]);
    }
}
