//! Self-service channel setup (issue 20): `adapter_setup`, with which an
//! agent the owner lets do so stores its own bot token and switches a
//! channel on. It always asks the owner first (approved once, whatever the
//! config says), the token goes only into the sealed credentials, and no
//! answer, event or task row repeats it.

use serde_json::{Value, json};

use super::Executor;
use crate::store::Caller;
use crate::tools::ToolOutput;

/// An input with its secret fields hidden, for task rows and events.
pub(super) fn redacted(name: &str, input: &Value) -> Value {
    let mut v = input.clone();
    if name == "adapter_setup"
        && let Some(o) = v.as_object_mut()
        && o.contains_key("token")
    {
        o.insert("token".into(), json!("[secret]"));
    }
    v
}

impl Executor {
    /// `adapter_setup` once the owner approved it.
    pub(super) async fn adapter_setup(&mut self, input: &Value) -> ToolOutput {
        // The agent's own setup admits nobody by accident: an allowlist
        // names who.
        let allowlist = input["dm"].as_str().unwrap_or("allowlist") == "allowlist";
        if allowlist && input["allow_from"].as_array().is_none_or(|a| a.is_empty()) {
            return ToolOutput::err("dm allowlist needs allow_from (platform ids or @usernames)");
        }
        match self.adapter_connect(input) {
            Ok(t) => ToolOutput::ok(t),
            Err(e) => ToolOutput::err(e),
        }
    }

    /// Connect a channel: check the request, seal the token, write
    /// `adapters.<type>`, start it in the running fleet. The owner's route
    /// (`POST /agents/{id}/adapters`) and the approved tool share it.
    pub fn adapter_connect(&mut self, input: &Value) -> Result<String, String> {
        let out = self.adapter_connect_inner(input);
        if out.is_error { Err(out.content) } else { Ok(out.content) }
    }

    fn adapter_connect_inner(&mut self, input: &Value) -> ToolOutput {
        let kind = input["type"].as_str().unwrap_or_default();
        if !crate::channels::KINDS.contains(&kind) {
            return ToolOutput::err(format!(
                "no \"{kind}\" channel in this build (channels: {})",
                crate::channels::KINDS.join(", ")
            ));
        }
        let token = input["token"].as_str().map(str::trim).unwrap_or_default();
        if token.is_empty() {
            return ToolOutput::err("a token is required");
        }
        let pick = |k: &str, allowed: &[&str], default: &str| -> Result<String, String> {
            let v = input[k].as_str().unwrap_or(default);
            if allowed.contains(&v) {
                Ok(v.to_string())
            } else {
                Err(format!("{k} must be one of {}", allowed.join(", ")))
            }
        };
        let (dm, groups) = match (
            pick("dm", &["all", "allowlist", "none"], "allowlist"),
            pick("groups", &["all", "mention", "none"], "mention"),
        ) {
            (Ok(d), Ok(g)) => (d, g),
            (Err(e), _) | (_, Err(e)) => return ToolOutput::err(e),
        };
        let allow: Vec<Value> = input["allow_from"].as_array().cloned().unwrap_or_default();
        // What the owner set before (a server, a poll time) stays unless
        // this request says otherwise.
        let before = self.store.config_value().ok().and_then(|c| c.pointer(&format!("/adapters/{kind}")).cloned());
        let mut adapter = json!({"enabled": true, "policy": {"dm": dm, "groups": groups, "allow_from": allow}});
        if let Some(c) = before.as_ref().and_then(|b| b.get("config")).filter(|c| c.is_object()) {
            adapter["config"] = c.clone();
        }
        if let Some(l) = before.as_ref().and_then(|b| b.get("limits")).filter(|l| l.is_object()) {
            adapter["limits"] = l.clone();
        }
        if let Some(u) = input["api_url"].as_str() {
            match url::Url::parse(u) {
                Ok(p) if matches!(p.scheme(), "http" | "https") => {
                    if !adapter["config"].is_object() {
                        adapter["config"] = json!({});
                    }
                    adapter["config"]["api_url"] = json!(u);
                }
                _ => return ToolOutput::err(format!("api_url {u:?} is not an http(s) URL")),
            }
        }
        if let Err(e) = self.store.secret_set(crate::channels::telegram::TOKEN, token.as_bytes(), false) {
            return ToolOutput::err(format!(
                "the token could not be sealed ({e}); the owner may need to unlock the file"
            ));
        }
        if let Err(e) = self.store.config_set(Caller::Owner, &format!("adapters.{kind}"), adapter) {
            return ToolOutput::err(format!("adapters.{kind} not written: {e}"));
        }
        let _ = self.log("info", "adapter", "adapter_connected", &format!("{kind} switched on"));
        let id = self.agent_id().to_string();
        if let (Some(mesh), Ok(cfg)) = (self.mesh.clone(), self.store.config_value())
            && let Some(mb) = mesh.find(&id)
        {
            mesh.channels.start(&mb, &cfg);
        }
        ToolOutput::ok(format!(
            "{kind} switched on ({dm} direct messages, groups: {groups}); it connects in the background. \
             The token is sealed in your credentials and will not be shown again."
        ))
    }
}
