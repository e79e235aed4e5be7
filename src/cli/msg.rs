//! `adf msg verify FILE`: the verdict on an ALF message stored as JSON,
//! one line per check (or `--json`), failing when any check fails.

use std::path::Path;

use anyhow::Context;
use serde_json::json;

use super::output::Out;
use crate::identity::alf::{self, Check};

pub fn verify(out: &Out, file: &Path) -> anyhow::Result<u8> {
    let text = std::fs::read_to_string(file).with_context(|| format!("{}: cannot read", file.display()))?;
    let msg: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not a JSON message", file.display()))?;
    anyhow::ensure!(msg.is_object(), "{}: not a JSON message (expected an object)", file.display());
    let v = alf::verify(&msg);
    let code = if v.ok() { 0 } else { 1 };
    if out.json {
        out.json(&json!({"file": file.display().to_string(), "ok": v.ok(), "verdict": v}))?;
        return Ok(code);
    }
    let word = |c: &Check| match c {
        Check::Valid => "valid",
        Check::Invalid => "INVALID",
        Check::Missing => "missing",
        Check::Malformed => "malformed",
        Check::Encrypted => "encrypted (checked after decryption)",
    };
    let from = if v.from.is_empty() { "(missing)" } else { &v.from };
    out.line(format!("from: {from} ({})", if v.sender_did { "did:key, Ed25519" } else { "not a did:key" }))?;
    out.line(format!("message signature: {}", word(&v.message_signature)))?;
    out.line(format!("payload signature: {}", word(&v.payload_signature)))?;
    out.line(if v.ok() { "verified" } else { "NOT verified" })?;
    Ok(code)
}
