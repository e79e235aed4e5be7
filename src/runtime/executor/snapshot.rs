//! The effective runtime snapshot (format.md §"Known from the seeds",
//! issue 19): what the runtime actually applied on top of the agent's
//! config — the provider and where it was reached, the model, the prompt,
//! the compute policy, the MCP servers registered — with keys named by
//! source only, never their values. Kept in the file as read-only meta
//! `adfrs_runtime_snapshot`, written on start and when it changes (a config
//! change, a provider switch), so a file says how it last ran.

use serde_json::{Value, json};

use super::Executor;
use crate::store::StoreError;
use crate::store::meta::MetaProtection;

/// Where the snapshot is kept.
pub const KEY: &str = "adfrs_runtime_snapshot";

/// The snapshot of `cfg` run with the provider `provider_id`.
pub fn effective(cfg: &Value, provider_id: &str) -> Value {
    let resolved =
        crate::providers::accounts::load().ok().and_then(|s| crate::providers::accounts::locate_for(cfg, &s).ok());
    let instructions = cfg["instructions"].as_str().unwrap_or("");
    let digest: String = {
        use sha2::{Digest, Sha256};
        crate::identity::hex(&Sha256::digest(instructions.as_bytes())[..8])
    };
    let mcp: Vec<Value> = cfg
        .pointer("/mcp/servers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|s| {
            json!({"name": s["name"], "transport": if s.get("url").is_some() { "http" } else { "stdio" },
                   "enabled": s["enabled"].as_bool().unwrap_or(true)})
        })
        .collect();
    json!({
        "provider": provider_id,
        "kind": resolved.as_ref().map(|r| json!(r.kind)),
        "base_url": resolved.as_ref().map(|r| r.base_url.clone()),
        "key_source": resolved.as_ref().and_then(|r| r.key_source.clone()),
        "model": cfg.pointer("/model/model_id"),
        "prompt": {"instructions_chars": instructions.chars().count(), "instructions_sha256": digest,
                   "autonomous": cfg["autonomous"].as_bool().unwrap_or(false)},
        "compute": cfg.get("code_execution").cloned().unwrap_or(Value::Null),
        "mcp": mcp,
    })
}

impl Executor {
    /// Write the snapshot when it differs from the one in the file.
    pub fn record_runtime_snapshot(&mut self) -> Result<(), StoreError> {
        if self.store.is_read_only() {
            return Ok(());
        }
        let pid = self.provider.id();
        let now = self.store.with_config(|cfg| effective(cfg, pid))?;
        let stored: Option<Value> =
            self.store.meta_get(KEY)?.and_then(|m| serde_json::from_str::<Value>(&m.value).ok()).map(|mut v| {
                if let Some(o) = v.as_object_mut() {
                    o.remove("recorded_at");
                }
                v
            });
        if stored.as_ref() == Some(&now) {
            return Ok(());
        }
        let mut v = now;
        v["recorded_at"] = json!(crate::store::now_iso());
        let text = v.to_string();
        let path = self.store.path().to_path_buf();
        self.store.write(|tx| {
            crate::store::Store::meta_put_system(tx, KEY, &text, MetaProtection::Readonly)
                .map_err(|e| StoreError::Invalid(format!("{}: {e}", path.display())))
        })
    }
}
