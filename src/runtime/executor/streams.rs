//! The stream binding tools (tools.md §10): `stream_bind`, `stream_unbind`
//! and `stream_bindings` over the runtime's bindings (`runtime/streams`).
//! An agent sees and ends only its own.

use serde_json::{Value, json};

use super::Executor;
use crate::runtime::streams::{self, Spec};
use crate::tools::ToolOutput;

impl Executor {
    pub(crate) async fn stream_tool(&mut self, name: &str, input: &Value) -> ToolOutput {
        let Some(mesh) = self.mesh.clone() else {
            return ToolOutput::err(format!("{name} needs the runtime (this agent is not loaded in a fleet)"));
        };
        let me = self.agent_id().to_string();
        match name {
            "stream_bindings" => {
                ToolOutput::json(&Value::Array(mesh.bindings.of(&me).iter().map(|b| b.info()).collect()))
            }
            "stream_unbind" => {
                let id = input["binding_id"].as_str().unwrap_or_default();
                if mesh.bindings.unbind(&me, id, "manual") {
                    ToolOutput::json(&json!({"ok": true}))
                } else {
                    ToolOutput::err(format!("Binding not found: {id}"))
                }
            }
            "stream_bind" => {
                let Some(mb) = mesh.find(&me) else { return ToolOutput::err("this agent is not on the mesh") };
                let spec = Spec {
                    a: input["a"].clone(),
                    b: input["b"].clone(),
                    bidirectional: input["bidirectional"].as_bool().unwrap_or(false),
                    options: input["options"].clone(),
                };
                match streams::bind(&mesh, &mb, spec).await {
                    Ok(id) => ToolOutput::json(&json!({"binding_id": id})),
                    Err(e) => ToolOutput::err(e),
                }
            }
            _ => ToolOutput::err(format!("Unknown tool: {name}")),
        }
    }
}
