//! Building, signing, encrypting and checking ALF messages (messaging.md
//! §1–4). Egress runs sign-payload → encrypt → sign-message; ingress runs
//! verify-message → decrypt → verify-payload and strips any trust stamps a
//! sender supplied before the runtime stamps what it checked itself.

use ed25519_dalek::SigningKey;
use serde_json::{Map, Value, json};

use super::alf::{self, Check};
use super::attest::sign_str;
use super::canonical;
use super::seal::{self, CryptoError, b64, unb64};
use crate::store::identity::did_public_key;

pub const ENCRYPTED: &str = "application/x-adf-encrypted";
pub const ALG: &str = "x25519-hkdf-aes256gcm";
const INFO: &[u8] = b"adf-msg-v1";

/// Stamps only the receiving runtime may set.
pub const TRUST_KEYS: [&str; 5] =
    ["message_verified", "payload_verified", "payload_encrypted", "identity_verified", "ws_remote_did"];

/// Remove wire- or agent-supplied trust stamps from a meta object.
pub fn strip_trust(meta: &mut Value) {
    if let Some(o) = meta.as_object_mut() {
        for k in TRUST_KEYS {
            o.remove(k);
        }
    }
}

fn without(v: &Value, keys: &[&str]) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        for k in keys {
            o.remove(*k);
        }
    }
    v
}

/// Sign `payload` (its `signature` replaced).
pub fn sign_payload(payload: &mut Value, key: &SigningKey) {
    let sig = sign_str(key, canonical::to_string(&without(payload, &["signature"])).as_bytes());
    if let Some(o) = payload.as_object_mut() {
        o.insert("signature".into(), sig.into());
    }
}

/// Sign the whole message (not `signature`, not `transit`).
pub fn sign_message(msg: &mut Value, key: &SigningKey) {
    let sig = sign_str(key, canonical::to_string(&without(msg, &["signature", "transit"])).as_bytes());
    if let Some(o) = msg.as_object_mut() {
        o.insert("signature".into(), sig.into());
    }
}

/// Encrypt a (signed) payload to the Ed25519 key in `recipient_did`.
pub fn encrypt_payload(payload: &Value, recipient_did: &str) -> Result<Value, CryptoError> {
    let key = did_public_key(recipient_did).ok_or(CryptoError::Invalid("recipient DID (not an Ed25519 did:key)"))?;
    let (epk, k) = seal::agree_to(&seal::x25519_public_of(&key), INFO)?;
    let plain = serde_json::to_vec(payload).map_err(|_| CryptoError::Invalid("payload"))?;
    let mut o = Map::new();
    o.insert("content".into(), b64(&seal::seal(&k, &plain)).into());
    o.insert("content_type".into(), ENCRYPTED.into());
    o.insert("meta".into(), json!({"enc": {"v": 1, "alg": ALG, "epk": b64(&epk)}}));
    if let Some(t) = payload.get("sent_at") {
        o.insert("sent_at".into(), t.clone());
    }
    Ok(Value::Object(o))
}

/// Decrypt a level-2 payload with the recipient's signing key.
pub fn decrypt_payload(payload: &Value, key: &SigningKey) -> Result<Value, CryptoError> {
    let enc = &payload["meta"]["enc"];
    if enc["v"] != 1 || enc["alg"] != ALG {
        return Err(CryptoError::Invalid("encryption header (meta.enc)"));
    }
    let epk: [u8; 32] = unb64(enc["epk"].as_str().unwrap_or_default())?
        .try_into()
        .map_err(|_| CryptoError::Invalid("ephemeral key"))?;
    let k = seal::agree_from(&seal::x25519_secret_of(key), &epk, INFO)?;
    let sealed = unb64(payload["content"].as_str().unwrap_or_default())?;
    let plain = seal::open(&k, &sealed)?;
    let inner: Value = serde_json::from_slice(&plain).map_err(|_| CryptoError::Invalid("decrypted payload"))?;
    if !inner.is_object() {
        return Err(CryptoError::Invalid("decrypted payload"));
    }
    Ok(inner)
}

/// How strict the receiver is (`security.*`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Policy {
    pub require_signature: bool,
    pub allow_unsigned: bool,
    pub require_payload_signature: bool,
}

impl Policy {
    pub fn of(security: &Value) -> Self {
        Policy {
            require_signature: security["require_signature"].as_bool().unwrap_or(false),
            allow_unsigned: security["allow_unsigned"].as_bool().unwrap_or(true),
            require_payload_signature: security["require_payload_signature"].as_bool().unwrap_or(false),
        }
    }
}

/// A message that passed ingress crypto: the payload is plaintext, the
/// sender's trust stamps are gone and ours are set on `meta`.
#[derive(Debug, Clone)]
pub struct Accepted {
    pub message: Value,
    pub message_verified: bool,
    pub payload_verified: bool,
    pub payload_encrypted: bool,
}

/// A refusal with its HTTP status.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub status: u16,
    pub error: String,
}

fn refuse(status: u16, error: impl Into<String>) -> Refused {
    Refused { status, error: error.into() }
}

/// Ingress crypto (messaging.md §2–4): `key` is the recipient's signing key
/// (needed only for encrypted payloads).
pub fn ingress(mut msg: Value, key: Option<&SigningKey>, policy: Policy) -> Result<Accepted, Refused> {
    // `get_mut`, not indexing: indexing would add `"meta": null` and
    // change what was signed.
    if let Some(m) = msg.get_mut("meta") {
        strip_trust(m);
    }
    if let Some(m) = msg.get_mut("payload").and_then(|p| p.get_mut("meta")) {
        strip_trust(m);
    }
    let verdict = alf::verify(&msg);
    let unsigned_ok = !policy.require_signature || policy.allow_unsigned;
    let message_verified = match verdict.message_signature {
        Check::Valid => true,
        Check::Missing if unsigned_ok => false,
        Check::Missing => return Err(refuse(403, "message is not signed and this agent requires signatures")),
        Check::Malformed => return Err(refuse(400, "unsupported signature format (expected ed25519:<base64>)")),
        _ if !verdict.sender_did && unsigned_ok => false,
        _ => return Err(refuse(403, "message signature is invalid")),
    };
    let mut payload_encrypted = false;
    if msg["payload"]["content_type"] == ENCRYPTED {
        let key = key.ok_or_else(|| refuse(500, "this agent has no unlocked key to decrypt with"))?;
        let inner = decrypt_payload(&msg["payload"], key).map_err(|_| refuse(403, "not encrypted to this agent"))?;
        msg["payload"] = inner;
        if let Some(m) = msg["payload"].get_mut("meta") {
            strip_trust(m);
        }
        payload_encrypted = true;
    }
    let payload_verified = match msg["payload"].get("signature") {
        None if policy.require_payload_signature => return Err(refuse(403, "payload is not signed")),
        None => false,
        Some(sig) => {
            let signed = canonical::to_string(&without(&msg["payload"], &["signature"]));
            let from = msg["from"].as_str().unwrap_or_default();
            match sig.as_str() {
                Some(s) if !s.starts_with("ed25519:") => {
                    return Err(refuse(400, "unsupported payload signature format"));
                }
                Some(s) if super::attest::verify_str(from, signed.as_bytes(), s).is_ok() => true,
                _ if !verdict.sender_did && unsigned_ok => false,
                _ => return Err(refuse(403, "payload signature is invalid")),
            }
        }
    };
    let meta = msg.as_object_mut().map(|o| o.entry("meta").or_insert_with(|| json!({})));
    if let Some(Value::Object(m)) = meta {
        m.insert("message_verified".into(), message_verified.into());
        m.insert("payload_verified".into(), payload_verified.into());
        m.insert("payload_encrypted".into(), payload_encrypted.into());
    }
    Ok(Accepted { message: msg, message_verified, payload_verified, payload_encrypted })
}

/// Egress crypto for `level`: sign the payload, encrypt it to `to` (level
/// ≥ 2 and a DID recipient, not same-runtime), sign the message.
pub fn egress(msg: &mut Value, key: Option<&SigningKey>, level: u8, encrypt: bool) -> Result<(), Refused> {
    if level == 0 {
        return Ok(());
    }
    let key =
        key.ok_or_else(|| refuse(500, "security level needs a signing key and this agent's is locked or absent"))?;
    sign_payload(&mut msg["payload"], key);
    let to = msg["to"].as_str().unwrap_or_default().to_string();
    if level >= 2 && encrypt && to.starts_with("did:") {
        msg["payload"] =
            encrypt_payload(&msg["payload"], &to).map_err(|e| refuse(500, format!("cannot encrypt: {e}")))?;
    }
    sign_message(msg, key);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::identity::did_key;

    fn keys(n: u8) -> (SigningKey, String) {
        let k = SigningKey::from_bytes(&[n; 32]);
        let d = did_key(&k.verifying_key());
        (k, d)
    }

    fn message(from: &str, to: &str) -> Value {
        json!({"version":"1.0","network":"devnet","id":"abcdefghij0123456789","timestamp":"2026-12-01T00:00:00.000Z",
               "from":from,"to":to,"reply_to":"http://127.0.0.1:7295/agents/a/inbox","meta":{"card":"x"},
               "payload":{"meta":{"n":1},"sender_alias":"a","parent_id":null,"content":"hello","attachments":[],
               "sent_at":"2026-12-01T00:00:00.000Z"}})
    }

    #[test]
    fn level_2_round_trip_in_the_spec_order() {
        let (a, ad) = keys(1);
        let (b, bd) = keys(2);
        let mut m = message(&ad, &bd);
        egress(&mut m, Some(&a), 2, true).unwrap();
        assert_eq!(m["payload"]["content_type"], ENCRYPTED);
        assert_eq!(m["payload"]["meta"]["enc"]["alg"], ALG);
        assert_eq!(m["payload"]["meta"]["enc"]["v"], 1);
        assert_eq!(m["payload"]["sent_at"], "2026-12-01T00:00:00.000Z");
        assert!(m["payload"].get("signature").is_none(), "the payload signature travels inside");
        assert!(!m.to_string().contains("hello"));
        let ok = ingress(m.clone(), Some(&b), Policy::default()).unwrap();
        assert!(ok.message_verified && ok.payload_verified && ok.payload_encrypted);
        assert_eq!(ok.message["payload"]["content"], "hello");
        assert_eq!(ok.message["meta"]["payload_encrypted"], true);
        // Not to this agent.
        let (c, _) = keys(3);
        assert_eq!(ingress(m.clone(), Some(&c), Policy::default()).unwrap_err().status, 403);
        // Tampered ciphertext breaks the message signature first.
        let mut t = m.clone();
        t["payload"]["meta"]["enc"]["epk"] = b64(&[9u8; 32]).into();
        assert_eq!(ingress(t, Some(&b), Policy::default()).unwrap_err().status, 403);
    }

    #[test]
    fn wire_trust_stamps_are_replaced() {
        let (a, ad) = keys(1);
        let mut m = message(&ad, "did:key:zB");
        m["meta"]["message_verified"] = true.into();
        m["payload"]["meta"]["payload_verified"] = true.into();
        m["meta"]["ws_remote_did"] = "did:key:zEvil".into();
        // Sent unsigned: the stamps must come out false, not as claimed.
        let ok = ingress(m.clone(), None, Policy { allow_unsigned: true, ..Default::default() }).unwrap();
        assert_eq!(ok.message["meta"]["message_verified"], false);
        assert!(ok.message["meta"].get("ws_remote_did").is_none());
        assert!(ok.message["payload"]["meta"].get("payload_verified").is_none());
        // Signed after the sender added stamps: still stripped (and the
        // signature was over the stamped copy, so it fails after stripping).
        egress(&mut m, Some(&a), 1, false).unwrap();
        assert_eq!(ingress(m, None, Policy::default()).unwrap_err().status, 403);
    }

    #[test]
    fn payloads_and_messages_without_meta_verify() {
        let (a, ad) = keys(1);
        let (b, bd) = keys(2);
        for level in [1, 2] {
            let mut m = message(&ad, &bd);
            m.as_object_mut().unwrap().remove("meta");
            m["payload"].as_object_mut().unwrap().remove("meta");
            egress(&mut m, Some(&a), level, true).unwrap();
            let ok = ingress(m, Some(&b), Policy::default()).unwrap();
            assert!(ok.message_verified && ok.payload_verified, "level {level}");
        }
    }

    #[test]
    fn level_0_sends_unsigned_and_receivers_decide() {
        let (_, ad) = keys(1);
        let mut m = message(&ad, "did:key:zB");
        egress(&mut m, None, 0, true).unwrap();
        assert!(m.get("signature").is_none() && m["payload"].get("signature").is_none());
        assert_eq!(m["payload"]["content"], "hello");
        let ok = ingress(m.clone(), None, Policy::default()).unwrap();
        assert_eq!(ok.message["meta"]["message_verified"], false);
        let strict = Policy { require_signature: true, allow_unsigned: false, require_payload_signature: false };
        assert_eq!(ingress(m, None, strict).unwrap_err().status, 403);
    }

    #[test]
    fn signature_policy() {
        let (a, ad) = keys(1);
        let strict = Policy { require_signature: true, allow_unsigned: false, require_payload_signature: true };
        let m = message(&ad, "did:key:zB");
        assert_eq!(ingress(m.clone(), None, strict).unwrap_err().status, 403);
        let lenient = ingress(m.clone(), None, Policy::default()).unwrap();
        assert!(!lenient.message_verified && !lenient.payload_verified);
        let mut s = m.clone();
        egress(&mut s, Some(&a), 1, true).unwrap();
        assert_eq!(s["payload"]["content"], "hello", "level 1 does not encrypt");
        let ok = ingress(s.clone(), None, strict).unwrap();
        assert!(ok.message_verified && ok.payload_verified && !ok.payload_encrypted);
        let mut bad = s.clone();
        bad["signature"] = "rsa:abc".into();
        assert_eq!(ingress(bad, None, strict).unwrap_err().status, 400);
        let mut tampered = s;
        tampered["payload"]["content"] = "hellO".into();
        assert_eq!(ingress(tampered, None, Policy::default()).unwrap_err().status, 403);
        assert_eq!(egress(&mut m.clone(), None, 1, false).unwrap_err().status, 500);
    }
}
