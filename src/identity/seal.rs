//! The symmetric and key-agreement primitives every sealed thing in `adf`
//! is made of (identity.md §5–6, messaging.md §4): AES-256-GCM with a
//! random 12-byte IV laid out `IV ‖ ciphertext ‖ tag`, X25519 to an
//! ephemeral key with HKDF-SHA256 (salt = the ephemeral public key) for the
//! wrap key, scrypt for password slots, and the Ed25519 → X25519 maps that
//! let a message be encrypted to a `did:key`.

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use ed25519_dalek::{SigningKey, VerifyingKey};
use hkdf::Hkdf;
use sha2::Sha256;
use x25519_dalek::{PublicKey, StaticSecret};

/// What can go wrong opening or sealing something.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CryptoError {
    #[error("decryption failed (wrong key or tampered data)")]
    Decrypt,
    #[error("sealed data is too short")]
    Short,
    #[error("not a usable X25519 key (low-order point)")]
    LowOrder,
    #[error("invalid {0}")]
    Invalid(&'static str),
}

pub const IV_LEN: usize = 12;
pub const TAG_LEN: usize = 16;

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub fn unb64(s: &str) -> Result<Vec<u8>, CryptoError> {
    base64::engine::general_purpose::STANDARD.decode(s).map_err(|_| CryptoError::Invalid("base64"))
}

/// `IV ‖ AES-256-GCM(key, plain) ‖ tag` with a fresh random IV.
pub fn seal(key: &[u8; 32], plain: &[u8]) -> Vec<u8> {
    let iv: [u8; IV_LEN] = rand::random();
    let mut out = iv.to_vec();
    out.extend(encrypt(key, &iv, plain));
    out
}

/// Open what [`seal`] made.
pub fn open(key: &[u8; 32], sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
    if sealed.len() < IV_LEN + TAG_LEN {
        return Err(CryptoError::Short);
    }
    let (iv, rest) = sealed.split_at(IV_LEN);
    decrypt(key, iv, rest)
}

/// `ciphertext ‖ tag` under an explicit IV.
pub fn encrypt(key: &[u8; 32], iv: &[u8; IV_LEN], plain: &[u8]) -> Vec<u8> {
    let cipher = Aes256Gcm::new(&(*key).into());
    // Encryption with a 32-byte key and a 12-byte IV cannot fail.
    cipher.encrypt(&Nonce::from(*iv), plain).unwrap_or_default()
}

/// Open `ciphertext ‖ tag` under an explicit IV.
pub fn decrypt(key: &[u8; 32], iv: &[u8], ct_tag: &[u8]) -> Result<Vec<u8>, CryptoError> {
    let iv: [u8; IV_LEN] = iv.try_into().map_err(|_| CryptoError::Invalid("IV length"))?;
    if ct_tag.len() < TAG_LEN {
        return Err(CryptoError::Short);
    }
    Aes256Gcm::new(&(*key).into()).decrypt(&Nonce::from(iv), ct_tag).map_err(|_| CryptoError::Decrypt)
}

/// HKDF-SHA256 to 32 bytes.
pub fn hkdf32(ikm: &[u8], salt: &[u8], info: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    // 32 bytes is far below HKDF-SHA256's limit.
    let _ = Hkdf::<Sha256>::new(Some(salt), ikm).expand(info, &mut out);
    out
}

/// Agree on a wrap key with `recipient` through a fresh ephemeral key:
/// (ephemeral public key, key).
pub fn agree_to(recipient: &[u8; 32], info: &[u8]) -> Result<([u8; 32], [u8; 32]), CryptoError> {
    let eph = StaticSecret::from(rand::random::<[u8; 32]>());
    let eph_pub = PublicKey::from(&eph).to_bytes();
    let shared = eph.diffie_hellman(&PublicKey::from(*recipient));
    if !shared.was_contributory() {
        return Err(CryptoError::LowOrder);
    }
    Ok((eph_pub, hkdf32(shared.as_bytes(), &eph_pub, info)))
}

/// The recipient's side of [`agree_to`].
pub fn agree_from(secret: &StaticSecret, eph_pub: &[u8; 32], info: &[u8]) -> Result<[u8; 32], CryptoError> {
    let shared = secret.diffie_hellman(&PublicKey::from(*eph_pub));
    if !shared.was_contributory() {
        return Err(CryptoError::LowOrder);
    }
    Ok(hkdf32(shared.as_bytes(), eph_pub, info))
}

/// The X25519 public key of an Ed25519 one (libsodium
/// `crypto_sign_ed25519_pk_to_curve25519`).
pub fn x25519_public_of(key: &VerifyingKey) -> [u8; 32] {
    key.to_montgomery().to_bytes()
}

/// The X25519 secret of an Ed25519 signing key (libsodium
/// `crypto_sign_ed25519_sk_to_curve25519`: SHA-512 of the seed, first half;
/// X25519 clamps it).
pub fn x25519_secret_of(key: &SigningKey) -> StaticSecret {
    StaticSecret::from(key.to_scalar_bytes())
}

/// scrypt to 32 bytes. `log_n` is bounded by the caller.
pub fn scrypt32(password: &[u8], salt: &[u8], log_n: u8, r: u32, p: u32) -> Result<[u8; 32], CryptoError> {
    let params = scrypt::Params::new(log_n, r, p).map_err(|_| CryptoError::Invalid("scrypt parameters"))?;
    let mut out = [0u8; 32];
    scrypt::scrypt(password, salt, &params, &mut out).map_err(|_| CryptoError::Invalid("scrypt output"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_round_trip_and_layout() {
        let key = [7u8; 32];
        let s = seal(&key, b"secret");
        assert_eq!(s.len(), IV_LEN + 6 + TAG_LEN);
        assert_eq!(open(&key, &s).unwrap(), b"secret");
        let mut bad = s.clone();
        bad[IV_LEN] ^= 1;
        assert_eq!(open(&key, &bad), Err(CryptoError::Decrypt));
        assert_eq!(open(&[8u8; 32], &s), Err(CryptoError::Decrypt));
        assert_eq!(open(&key, &s[..10]), Err(CryptoError::Short));
    }

    #[test]
    fn ed25519_keys_agree_through_their_x25519_forms() {
        let a = SigningKey::from_bytes(&[1u8; 32]);
        let (eph, k1) = agree_to(&x25519_public_of(&a.verifying_key()), b"adf-msg-v1").unwrap();
        let k2 = agree_from(&x25519_secret_of(&a), &eph, b"adf-msg-v1").unwrap();
        assert_eq!(k1, k2);
        let other = SigningKey::from_bytes(&[2u8; 32]);
        assert_ne!(agree_from(&x25519_secret_of(&other), &eph, b"adf-msg-v1").unwrap(), k1);
        // Domain separation: another info string gives another key.
        assert_ne!(agree_from(&x25519_secret_of(&a), &eph, b"adf-envelope-v1:identity").unwrap(), k1);
    }

    #[test]
    fn low_order_points_are_refused() {
        assert_eq!(agree_to(&[0u8; 32], b"x"), Err(CryptoError::LowOrder));
    }

    #[test]
    fn hkdf_rfc5869_case_1_prefix() {
        // RFC 5869 A.1 (first 32 bytes of OKM).
        let ikm = [0x0bu8; 22];
        let salt: Vec<u8> = (0x00..=0x0c).collect();
        let info: Vec<u8> = (0xf0..=0xf9).collect();
        let okm = hkdf32(&ikm, &salt, &info);
        assert_eq!(hex(&okm), "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf");
    }

    #[test]
    fn scrypt_rfc7914_vector_prefix() {
        // RFC 7914 §12, "password"/"NaCl", N=1024, r=8, p=16.
        let k = scrypt32(b"password", b"NaCl", 10, 8, 16).unwrap();
        assert_eq!(hex(&k), "fdbabe1c9d3472007856e7190d01e9fe7c6ad7cbc8237830e77376634b373162");
    }

    use crate::identity::hex;
}
