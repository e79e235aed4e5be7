//! Checking an ALF message's signatures (messaging.md §2): the message
//! signature over the canonical message without `signature` and `transit`,
//! the payload signature over the canonical payload without `signature`,
//! both Ed25519 by the key inside the sender's `did:key`, encoded
//! `ed25519:<base64>`. Used by `adf msg verify` now and by ingress later.

use base64::Engine;
use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use serde::Serialize;
use serde_json::Value;

use super::canonical;
use crate::store::identity::did_public_key;

/// One signature's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    Valid,
    Invalid,
    /// No signature there.
    Missing,
    /// Not `ed25519:<base64 of 64 bytes>`.
    Malformed,
    /// Encrypted payload: its signature is inside the ciphertext.
    Encrypted,
}

/// What `adf msg verify` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub from: String,
    /// The sender is a `did:key` holding an Ed25519 key.
    pub sender_did: bool,
    pub message_signature: Check,
    pub payload_signature: Check,
}

impl Verdict {
    /// Every check passed (a message needs both signatures and a DID).
    pub fn ok(&self) -> bool {
        self.sender_did && self.message_signature == Check::Valid && self.payload_signature == Check::Valid
    }
}

fn check(key: Option<&VerifyingKey>, sig: Option<&Value>, signed: &str) -> Check {
    let Some(sig) = sig else { return Check::Missing };
    let Some(b64) = sig.as_str().and_then(|s| s.strip_prefix("ed25519:")) else { return Check::Malformed };
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(b64) else { return Check::Malformed };
    let Ok(sig) = Signature::from_slice(&bytes) else { return Check::Malformed };
    match key {
        Some(k) if k.verify(signed.as_bytes(), &sig).is_ok() => Check::Valid,
        _ => Check::Invalid,
    }
}

/// Check a parsed message.
pub fn verify(msg: &Value) -> Verdict {
    let from = msg["from"].as_str().unwrap_or("").to_string();
    let key = did_public_key(&from);
    let mut unsigned = msg.clone();
    if let Some(o) = unsigned.as_object_mut() {
        o.remove("signature");
        o.remove("transit");
    }
    let message_signature = check(key.as_ref(), msg.get("signature"), &canonical::to_string(&unsigned));
    let payload = &msg["payload"];
    let payload_signature = if payload["content_type"] == "application/x-adf-encrypted" {
        Check::Encrypted
    } else {
        let mut p = payload.clone();
        if let Some(o) = p.as_object_mut() {
            o.remove("signature");
        }
        check(key.as_ref(), payload.get("signature"), &canonical::to_string(&p))
    };
    Verdict { from, sender_did: key.is_some(), message_signature, payload_signature }
}
