//! Self-service channel setup (issue 20): `adapter_setup`, with which an
//! agent the owner lets do so stores its own bot token and switches a
//! channel on. It always asks the owner first (approved once, whatever the
//! config says), the token goes only into the sealed credentials, and no
//! answer, event or task row repeats it.

use serde_json::{Value, json};

use super::Executor;
use crate::tools::ToolOutput;

/// An input with its secret fields hidden, for task rows and events.
pub(super) fn redacted(name: &str, input: &Value) -> Value {
    let mut v = input.clone();
    if name == "adapter_setup"
        && let Some(o) = v.as_object_mut()
    {
        for k in ["token", "app_token", "session"] {
            if o.contains_key(k) {
                o.insert(k.into(), json!("[secret]"));
            }
        }
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

    /// Connect a channel (`channels::connect`) and start it in the running
    /// fleet. The owner's route (`POST /agents/{id}/adapters`) and the
    /// approved tool share it.
    /// Disconnect a channel (`channels::disconnect`) and stop it.
    pub fn adapter_disconnect(&mut self, kind: &str) -> Result<String, String> {
        // Stopped first, so that nothing it keeps is written back after its
        // credentials are removed.
        if let Some(mesh) = self.mesh.clone() {
            mesh.channels.stop(self.agent_id(), kind);
        }
        crate::channels::disconnect(&mut self.store, kind)
    }

    pub fn adapter_connect(&mut self, input: &Value) -> Result<String, String> {
        let message = crate::channels::connect(&mut self.store, input)?;
        let id = self.agent_id().to_string();
        if let (Some(mesh), Ok(cfg)) = (self.mesh.clone(), self.store.config_value())
            && let Some(mb) = mesh.find(&id)
        {
            mesh.channels.start_only(&mb, &cfg, input["type"].as_str());
        }
        Ok(message)
    }
}
