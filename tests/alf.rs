//! ALF signatures against the reference's own message (conformance 41,
//! 42): it verifies with the public key beside it, and any change to its
//! signed content is caught — in the library and through `adf msg verify`.

mod common;

use adf::identity::alf::{Check, verify};
use common::*;
use serde_json::{Value, json};

fn fixture() -> Value {
    let text = std::fs::read_to_string(fixtures().join("alf/msg-peer-to-rich-signed.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn keys() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("alf/public-keys.json")).unwrap()).unwrap()
}

#[test]
fn p41_p42_the_reference_message_verifies() {
    let msg = fixture();
    let v = verify(&msg);
    assert!(v.ok(), "{v:?}");
    let peer = &keys()["peer"];
    assert_eq!(msg["from"], peer["did"]);
    // The DID is did:key:z + base58btc(0xED 0x01 ‖ key), which starts z6Mk.
    let raw: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&peer["public_key_raw_hex"].as_str().unwrap()[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let key = ed25519_dalek::VerifyingKey::from_bytes(&raw.try_into().unwrap()).unwrap();
    assert_eq!(adf::store::identity::did_key(&key), peer["did"].as_str().unwrap());
    assert!(peer["did"].as_str().unwrap().starts_with("did:key:z6Mk"));
    // Transit annotations are not signed.
    let mut hop = msg.clone();
    hop["transit"] = json!({"route": [{"did": "did:key:z6Mkrelay", "name": "relay"}]});
    assert!(verify(&hop).ok());
}

/// Every leaf of the signed content, as a JSON pointer.
fn leaves(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                if k != "signature" {
                    leaves(x, format!("{at}/{k}"), out);
                }
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                leaves(x, format!("{at}/{i}"), out);
            }
        }
        _ => out.push(at),
    }
}

#[test]
fn any_change_to_signed_content_is_caught() {
    let msg = fixture();
    let mut paths = Vec::new();
    leaves(&msg, String::new(), &mut paths);
    assert!(paths.len() >= 12, "{paths:?}");
    for p in &paths {
        let mut m = msg.clone();
        let leaf = m.pointer_mut(p).unwrap();
        *leaf = match leaf.take() {
            Value::String(s) if !s.is_empty() => {
                // One character changed.
                let mut c: Vec<char> = s.chars().collect();
                c[0] = if c[0] == 'x' { 'y' } else { 'x' };
                Value::String(c.into_iter().collect())
            }
            Value::String(_) => json!("x"),
            Value::Null => json!("null"),
            Value::Bool(b) => json!(!b),
            Value::Number(n) => json!(n.as_f64().unwrap() + 1.0),
            other => other,
        };
        let v = verify(&m);
        assert!(!v.ok(), "changing {p} went unnoticed");
        if p.starts_with("/payload") {
            assert_eq!(v.payload_signature, Check::Invalid, "{p}");
        }
        assert_ne!(v.message_signature, Check::Valid, "{p}");
    }
    // A key added or removed counts too; so does a swapped signature.
    let mut m = msg.clone();
    m["payload"]["extra"] = json!(1);
    assert!(!verify(&m).ok());
    let mut m = msg.clone();
    m.as_object_mut().unwrap().remove("reply_to");
    assert!(!verify(&m).ok());
    let mut m = msg.clone();
    m["signature"] = msg["payload"]["signature"].clone();
    assert_eq!(verify(&m).message_signature, Check::Invalid);
    let mut m = msg.clone();
    m["signature"] = json!("rsa:abc");
    assert_eq!(verify(&m).message_signature, Check::Malformed);
    let mut m = msg;
    m["from"] = json!("peer");
    let v = verify(&m);
    assert!(!v.sender_did && !v.ok());
}

#[test]
fn adf_msg_verify_reports_and_exits_non_zero_on_failure() {
    let dir = tmp();
    let good = dir.path().join("good.json");
    std::fs::write(&good, serde_json::to_string(&fixture()).unwrap()).unwrap();
    let out = ok(&adf(dir.path(), &["msg", "verify", "good.json"], None));
    assert!(
        out.contains("message signature: valid")
            && out.contains("payload signature: valid")
            && out.ends_with("verified\n"),
        "{out}"
    );
    let mut m = fixture();
    m["payload"]["content"] = json!("Hello rich, this is peer (signed, level 2).");
    std::fs::write(dir.path().join("bad.json"), serde_json::to_string(&m).unwrap()).unwrap();
    let bad = adf(dir.path(), &["msg", "verify", "--json", "bad.json"], None);
    assert_eq!(bad.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&bad.stdout).unwrap();
    assert_eq!(v["ok"], json!(false));
    assert_eq!(v["verdict"]["payload_signature"], json!("invalid"));
    assert_eq!(v["verdict"]["message_signature"], json!("invalid"));
    std::fs::write(dir.path().join("junk.json"), "{not json").unwrap();
    fails(&adf(dir.path(), &["msg", "verify", "junk.json"], None), &["junk.json", "not a JSON message"]);
    fails(&adf(dir.path(), &["msg", "verify", "nope.json"], None), &["nope.json", "cannot read"]);
}
