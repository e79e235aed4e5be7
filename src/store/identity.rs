//! An agent's own key pair and `did:key`. Headless files store the Ed25519
//! signing key plain: the private key as PKCS#8 v1 DER (48 bytes) and the
//! public key as SPKI DER (44 bytes), exactly as the headless reference does.
//! Sealed envelopes come with the identity work.

use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey, KeypairBytes};
use ed25519_dalek::{SigningKey, VerifyingKey};

/// Multicodec prefix of an Ed25519 public key (`0xED 0x01`).
const ED25519_MULTICODEC: [u8; 2] = [0xED, 0x01];

pub const PURPOSE_PRIVATE: &str = "crypto:signing:private_key";
pub const PURPOSE_PUBLIC: &str = "crypto:signing:public_key";

/// A freshly minted agent key pair with its encodings.
pub struct AgentKeys {
    pub signing: SigningKey,
    pub private_der: Vec<u8>,
    pub public_der: Vec<u8>,
    pub did: String,
}

impl AgentKeys {
    pub fn generate() -> Result<Self, String> {
        let seed: [u8; 32] = rand::random();
        Self::from_seed(&seed)
    }

    pub fn from_seed(seed: &[u8; 32]) -> Result<Self, String> {
        let signing = SigningKey::from_bytes(seed);
        let private_der = KeypairBytes { secret_key: *seed, public_key: None }
            .to_pkcs8_der()
            .map_err(|e| format!("encoding private key: {e}"))?
            .as_bytes()
            .to_vec();
        let verifying = signing.verifying_key();
        let public_der =
            verifying.to_public_key_der().map_err(|e| format!("encoding public key: {e}"))?.as_bytes().to_vec();
        let did = did_key(&verifying);
        Ok(AgentKeys { signing, private_der, public_der, did })
    }
}

/// `did:key:z` + base58btc(0xED 0x01 ‖ public key).
pub fn did_key(key: &VerifyingKey) -> String {
    let mut bytes = Vec::with_capacity(34);
    bytes.extend_from_slice(&ED25519_MULTICODEC);
    bytes.extend_from_slice(key.as_bytes());
    format!("did:key:z{}", bs58::encode(bytes).into_string())
}

/// The public key inside a `did:key`, if it is an Ed25519 one.
pub fn did_public_key(did: &str) -> Option<VerifyingKey> {
    let rest = did.strip_prefix("did:key:z")?;
    let bytes = bs58::decode(rest).into_vec().ok()?;
    let key: [u8; 32] = bytes.strip_prefix(&ED25519_MULTICODEC)?.try_into().ok()?;
    VerifyingKey::from_bytes(&key).ok()
}

/// The public key of an SPKI DER blob.
pub fn public_from_spki(der: &[u8]) -> Option<VerifyingKey> {
    use ed25519_dalek::pkcs8::DecodePublicKey;
    VerifyingKey::from_public_key_der(der).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn did_is_z6mk_and_round_trips() {
        let k = AgentKeys::generate().unwrap();
        assert!(k.did.starts_with("did:key:z6Mk"), "{}", k.did);
        assert_eq!(did_public_key(&k.did).unwrap(), k.signing.verifying_key());
        assert_eq!(k.private_der.len(), 48);
        assert_eq!(k.public_der.len(), 44);
        assert_eq!(public_from_spki(&k.public_der).unwrap(), k.signing.verifying_key());
    }

    #[test]
    fn reference_headless_key_matches_its_did() {
        // From fixtures/reference/fresh-headless.dump.json.
        let spki = hex("302a300506032b6570032100b034cf246e7f35798ac5aaf7e2bcaacff74734ec2334bc1fa8c8c7a8e1fbd65e");
        let pkcs8 =
            hex("302e020100300506032b65700422042088d7abcd6594f23c75a556fa426f7c178cd56212e2186619079b926af19f1c1a");
        let key = public_from_spki(&spki).unwrap();
        assert_eq!(did_key(&key), "did:key:z6MkrK6WExQsHSGZDfgmoaes4fQSdrsrk8TSMhwGGqoP7SnR");
        let seed: [u8; 32] = pkcs8[16..].try_into().unwrap();
        let ours = AgentKeys::from_seed(&seed).unwrap();
        assert_eq!(ours.private_der, pkcs8);
        assert_eq!(ours.public_der, spki);
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }
}
