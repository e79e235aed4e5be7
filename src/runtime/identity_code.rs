//! The identity methods of the `adf` proxy (runtime.md §7.3, identity.md
//! §7): `identity_status`, `get_identity` (only rows the owner opened to
//! code, never `crypto:*`), `set_identity` (sealed, readable by code),
//! `attestation_list`, `attestation_add` (about this agent, not a reserved
//! role, valid and unexpired) and `attestation_issue` (signed by the agent,
//! returned, not stored).

use serde_json::{Value, json};

use super::executor::Executor;
use crate::identity::attest;
use crate::identity::envelope::{CREDENTIALS, IDENTITY};
use crate::store::keyring::code_forbidden;

type MethodResult = Result<Value, (&'static str, String)>;

fn bad(msg: impl Into<String>) -> (&'static str, String) {
    ("INVALID_INPUT", msg.into())
}

fn store_err(e: impl std::fmt::Display) -> (&'static str, String) {
    ("INTERNAL", e.to_string())
}

impl Executor {
    fn own_did(&self) -> String {
        self.store.meta_get("adf_did").ok().flatten().map(|m| m.value).unwrap_or_default()
    }

    pub(crate) fn identity_method(&mut self, method: &str, args: &Value) -> MethodResult {
        match method {
            "identity_status" => {
                let i = self.store.envelope(IDENTITY).map_err(store_err)?;
                let c = self.store.envelope(CREDENTIALS).map_err(store_err)?;
                let legacy = self.store.is_legacy_password().map_err(store_err)?;
                Ok(json!({"envelopes": {"identity": i.state, "credentials": c.state}, "password_protected": legacy,
                    "did": self.own_did()}))
            }
            "get_identity" => match args["purpose"].as_str() {
                None => {
                    let rows = self.store.secrets().map_err(store_err)?;
                    let list: Vec<Value> = rows
                        .iter()
                        .filter(|r| r.code_access && !code_forbidden(&r.purpose))
                        .map(|r| json!({"purpose": r.purpose, "encrypted": r.encryption_algo != "plain"}))
                        .collect();
                    Ok(Value::Array(list))
                }
                Some(p) if code_forbidden(p) => {
                    Err(("FORBIDDEN", format!("\"{p}\" is key material and never readable by code")))
                }
                Some(p) => {
                    let row = self.store.secrets().map_err(store_err)?.into_iter().find(|r| r.purpose == p);
                    match row {
                        None => Ok(Value::Null),
                        Some(r) if !r.code_access => {
                            Err(("FORBIDDEN", format!("\"{p}\" is not open to code (code_access is off)")))
                        }
                        Some(_) => match self.store.secret_get(p) {
                            Ok(Some(v)) => Ok(Value::String(String::from_utf8_lossy(&v).into_owned())),
                            Ok(None) => Ok(Value::Null),
                            Err(e) => Err(("LOCKED", e.to_string())),
                        },
                    }
                }
            },
            "set_identity" => {
                let p = args["purpose"].as_str().filter(|p| !p.is_empty()).ok_or_else(|| bad("purpose is required"))?;
                let v = args["value"].as_str().ok_or_else(|| bad("value must be a string"))?;
                if p.starts_with("crypto:") {
                    return Err(("FORBIDDEN", format!("\"{p}\" is managed by the runtime")));
                }
                self.store.secret_set(p, v.as_bytes(), true).map_err(|e| ("LOCKED", e.to_string()))?;
                Ok(json!({"success": true, "purpose": p}))
            }
            "attestation_list" => Ok(Value::Array(self.store.attestations().map_err(store_err)?)),
            "attestation_add" => {
                let att = args.get("attestation").cloned().unwrap_or(Value::Null);
                let role = att["role"].as_str().unwrap_or_default();
                if role.is_empty() || attest::RESERVED.contains(&role) {
                    return Err(("RESERVED_ROLE", format!("role \"{role}\" is reserved for the runtime")));
                }
                attest::verify(&att, Some(&self.own_did()), chrono::Utc::now())
                    .map_err(|e| ("INVALID_ATTESTATION", e))?;
                let added = self.store.attestation_store(&att).map_err(store_err)?;
                Ok(json!({"success": true, "added": added}))
            }
            "attestation_issue" => {
                let subject = args["subject"].as_str().unwrap_or_default();
                let role = args["role"].as_str().unwrap_or_default();
                if crate::store::identity::did_public_key(subject).is_none() {
                    return Err(bad(format!("subject \"{subject}\" is not an Ed25519 did:key")));
                }
                if role.is_empty() || attest::RESERVED.contains(&role) {
                    return Err(("RESERVED_ROLE", format!("role \"{role}\" is reserved for the runtime")));
                }
                let did = self.own_did();
                if subject == did {
                    return Err(bad("an agent does not attest itself"));
                }
                let expires = args["expires_at"].as_str();
                if let Some(e) = expires
                    && chrono::DateTime::parse_from_rfc3339(e).is_err()
                {
                    return Err(bad(format!("expires_at \"{e}\" is not ISO-8601")));
                }
                let key =
                    self.store.signing_key().map_err(store_err)?.ok_or_else(|| {
                        ("NOT_CONFIGURED", "this agent's signing key is locked or absent".to_string())
                    })?;
                let now = crate::store::now_iso();
                Ok(attest::issue(
                    &key,
                    &attest::Claim {
                        issuer: &did,
                        subject,
                        role,
                        issued_at: &now,
                        expires_at: expires,
                        scope: args["scope"].as_str(),
                    },
                ))
            }
            _ => Err(("NOT_FOUND", format!("no method {method}"))),
        }
    }
}
