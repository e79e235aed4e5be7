//! Attestations (identity.md §7): a statement "issuer says subject has role"
//! signed by the issuer's key over the canonical JSON of exactly
//! `issuer, subject, role, issued_at` plus `expires_at` / `scope` when
//! present. The runtime issues the reserved roles; agents may add others.

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier};
use serde_json::{Map, Value};

use super::canonical;
use super::seal::{b64, unb64};
use crate::store::identity::did_public_key;

/// Roles only the runtime issues or stores.
pub const RESERVED: [&str; 5] = ["owner", "operator", "runtime", "clone", "rotation"];

/// Roles replaced wholesale on re-issue (the rest are append-only).
pub const CURRENT_STATE: [&str; 2] = ["owner", "operator"];

const SIGNED: [&str; 6] = ["issuer", "subject", "role", "issued_at", "expires_at", "scope"];

/// What an attestation says, before signing.
pub struct Claim<'a> {
    pub issuer: &'a str,
    pub subject: &'a str,
    pub role: &'a str,
    pub issued_at: &'a str,
    pub expires_at: Option<&'a str>,
    pub scope: Option<&'a str>,
}

/// `ed25519:<base64>` of `key`'s signature over `bytes`.
pub fn sign_str(key: &SigningKey, bytes: &[u8]) -> String {
    format!("ed25519:{}", b64(&key.sign(bytes).to_bytes()))
}

/// Check an `ed25519:<base64>` signature by the key in `did`.
pub fn verify_str(did: &str, bytes: &[u8], sig: &str) -> Result<(), String> {
    let key = did_public_key(did).ok_or_else(|| format!("not an Ed25519 did:key: {did}"))?;
    let raw = sig.strip_prefix("ed25519:").ok_or("signature does not start with ed25519:")?;
    let raw = unb64(raw).map_err(|e| e.to_string())?;
    let sig = Signature::from_slice(&raw).map_err(|_| "signature is not 64 bytes")?;
    key.verify(bytes, &sig).map_err(|_| "signature does not verify".to_string())
}

/// Sign `claim` with `key` (the issuer's).
pub fn issue(key: &SigningKey, claim: &Claim<'_>) -> Value {
    let mut o = Map::new();
    o.insert("issuer".into(), claim.issuer.into());
    o.insert("subject".into(), claim.subject.into());
    o.insert("role".into(), claim.role.into());
    o.insert("issued_at".into(), claim.issued_at.into());
    if let Some(e) = claim.expires_at {
        o.insert("expires_at".into(), e.into());
    }
    if let Some(s) = claim.scope {
        o.insert("scope".into(), s.into());
    }
    let sig = sign_str(key, canonical::to_string(&Value::Object(o.clone())).as_bytes());
    o.insert("signature".into(), sig.into());
    Value::Object(o)
}

/// The bytes an attestation's signature covers.
fn signed_bytes(att: &Map<String, Value>) -> String {
    let o: Map<String, Value> = SIGNED
        .iter()
        .filter_map(|k| att.get(*k).filter(|v| !v.is_null()).map(|v| (k.to_string(), v.clone())))
        .collect();
    canonical::to_string(&Value::Object(o))
}

/// Verify an attestation: shape, optional subject, not expired at `now`,
/// a decodable issuer DID, the signature.
pub fn verify(att: &Value, subject: Option<&str>, now: chrono::DateTime<chrono::Utc>) -> Result<(), String> {
    let o = att.as_object().ok_or("an attestation is a JSON object")?;
    for k in ["issuer", "subject", "role", "issued_at", "signature"] {
        if o.get(k).and_then(Value::as_str).is_none_or(str::is_empty) {
            return Err(format!("attestation field `{k}` is missing or not a string"));
        }
    }
    if let Some(want) = subject
        && o["subject"] != want
    {
        return Err(format!("attestation subject is {}, not {want}", o["subject"]));
    }
    if let Some(exp) = o.get("expires_at").filter(|v| !v.is_null()) {
        let exp = exp.as_str().and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok());
        match exp {
            None => return Err("attestation expires_at is not an ISO-8601 time".into()),
            Some(t) if t <= now => return Err("attestation has expired".into()),
            Some(_) => {}
        }
    }
    let issuer = o["issuer"].as_str().unwrap_or_default();
    verify_str(issuer, signed_bytes(o).as_bytes(), o["signature"].as_str().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::identity::did_key;

    fn claim<'a>(issuer: &'a str, subject: &'a str, scope: Option<&'a str>) -> Claim<'a> {
        Claim { issuer, subject, role: "reviewer", issued_at: "2026-12-01T00:00:00.000Z", expires_at: None, scope }
    }

    #[test]
    fn signature_covers_exactly_the_present_fields() {
        let key = SigningKey::from_bytes(&[9u8; 32]);
        let did = did_key(&key.verifying_key());
        let att = issue(&key, &claim(&did, "did:key:zSub", Some("docs")));
        let now = chrono::Utc::now();
        verify(&att, Some("did:key:zSub"), now).unwrap();
        let sig = att["signature"].as_str().unwrap();
        let want = r#"{"issued_at":"2026-12-01T00:00:00.000Z","issuer":"ISS","role":"reviewer","scope":"docs","subject":"did:key:zSub"}"#
            .replace("ISS", &did);
        verify_str(&did, want.as_bytes(), sig).unwrap();
        // Any change is caught; an unsigned extra field is ignored.
        for (k, v) in [("role", "owner"), ("scope", "all"), ("subject", "did:key:zOther"), ("issued_at", "2027")] {
            let mut t = att.clone();
            t[k] = v.into();
            assert!(verify(&t, None, now).is_err(), "{k}");
        }
        let mut extra = att.clone();
        extra["note"] = "x".into();
        verify(&extra, None, now).unwrap();
        assert!(verify(&att, Some("did:key:zElse"), now).unwrap_err().contains("subject"));
    }

    #[test]
    fn expiry_and_issuer_checks() {
        let key = SigningKey::from_bytes(&[5u8; 32]);
        let did = did_key(&key.verifying_key());
        let mut c = claim(&did, "did:key:zS", None);
        c.expires_at = Some("2026-12-02T00:00:00Z");
        let att = issue(&key, &c);
        let before = chrono::DateTime::parse_from_rfc3339("2026-12-01T12:00:00Z").unwrap().to_utc();
        let after = chrono::DateTime::parse_from_rfc3339("2026-12-03T00:00:00Z").unwrap().to_utc();
        verify(&att, None, before).unwrap();
        assert!(verify(&att, None, after).unwrap_err().contains("expired"));
        let mut bad = att.clone();
        bad["issuer"] = "alice".into();
        assert!(verify(&bad, None, before).unwrap_err().contains("did:key"));
    }
}
