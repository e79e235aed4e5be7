//! Agent cards (messaging.md §10): what an agent publishes about itself,
//! signed by its key over the canonical JSON of an allowlist of fields.
//! Endpoints depend on where the request came in, so they are not signed.

use ed25519_dalek::SigningKey;
use serde_json::{Map, Value, json};

use crate::identity::{attest, canonical};

/// The fields the card signature covers.
const SIGNED: [&str; 12] = [
    "did",
    "public_key",
    "signed_at",
    "handle",
    "description",
    "icon",
    "resolution",
    "api_routes",
    "public",
    "shared",
    "attestations",
    "policies",
];

/// The canonical bytes a card's signature covers.
pub fn signed_bytes(card: &Value) -> String {
    let mut o = Map::new();
    for k in SIGNED {
        if let Some(v) = card.get(k) {
            let mut v = v.clone();
            if k == "resolution"
                && let Some(r) = v.as_object_mut()
            {
                r.remove("endpoint");
            }
            o.insert(k.to_string(), v);
        }
    }
    canonical::to_string(&Value::Object(o))
}

/// Build and sign a card. `base` is the mesh URL the requester used.
pub fn build(
    cfg: &Value,
    did: &str,
    handle: &str,
    attestations: &[Value],
    key: Option<&SigningKey>,
    base: &str,
) -> Value {
    let url = |leaf: &str| format!("{base}/agents/{handle}/{leaf}");
    let level = cfg["security"]["level"].as_u64().unwrap_or(0);
    let publish = cfg["card"]["publish_attestations"] == Value::Bool(true);
    let mut c = Map::new();
    if !did.is_empty() {
        c.insert("did".into(), did.into());
        c.insert("public_key".into(), did.trim_start_matches("did:key:").into());
    }
    c.insert("handle".into(), handle.into());
    c.insert("description".into(), cfg["description"].as_str().unwrap_or("").into());
    c.insert("icon".into(), cfg["icon"].as_str().unwrap_or("").into());
    let resolution = cfg["card"]["resolution"].as_object().cloned().map(Value::Object);
    c.insert("resolution".into(), resolution.unwrap_or_else(|| json!({"method": "self", "endpoint": url("card")})));
    c.insert("endpoints".into(), json!({"inbox": url("inbox"), "card": url("card"), "health": url("health")}));
    c.insert("public".into(), (cfg["serving"]["public"]["enabled"] == Value::Bool(true)).into());
    c.insert("shared".into(), json!([]));
    if publish {
        let now = chrono::Utc::now();
        let list: Vec<Value> = attestations
            .iter()
            .filter(|a| a["subject"] == did && attest::verify(a, Some(did), now).is_ok())
            .cloned()
            .collect();
        c.insert("attestations".into(), Value::Array(list));
    }
    let mut policies = Vec::new();
    if level >= 1 {
        policies.push(json!({"type": "signing", "standard": "ed25519", "send": "required", "receive": "required"}));
    }
    if publish {
        policies.push(json!({"type": "owner_attestation", "receive": "optional"}));
    }
    if !policies.is_empty() {
        c.insert("policies".into(), Value::Array(policies));
    }
    let mut card = Value::Object(c);
    if let Some(k) = key {
        card["signed_at"] = crate::store::now_iso().into();
        let sig = attest::sign_str(k, signed_bytes(&card).as_bytes());
        card["signature"] = sig.into();
    }
    card
}

/// A card's signature checks against its own `did`.
pub fn verify(card: &Value) -> bool {
    match (card["did"].as_str(), card["signature"].as_str()) {
        (Some(did), Some(sig)) => attest::verify_str(did, signed_bytes(card).as_bytes(), sig).is_ok(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::identity::did_key;

    #[test]
    fn endpoints_are_unsigned_everything_else_is() {
        let k = SigningKey::from_bytes(&[4u8; 32]);
        let did = did_key(&k.verifying_key());
        let cfg = json!({"description": "d", "icon": "🦊", "security": {"level": 1}});
        let card = build(&cfg, &did, "fox", &[], Some(&k), "http://127.0.0.1:7295");
        assert!(verify(&card));
        assert_eq!(card["public_key"].as_str().unwrap(), &did["did:key:".len()..]);
        assert_eq!(card["policies"][0]["type"], "signing");
        let mut moved = card.clone();
        moved["endpoints"]["inbox"] = "http://10.0.0.1:1/agents/fox/inbox".into();
        moved["resolution"]["endpoint"] = "http://elsewhere/card".into();
        assert!(verify(&moved), "endpoints are per requester");
        let mut forged = card.clone();
        forged["description"] = "evil".into();
        assert!(!verify(&forged));
    }
}
