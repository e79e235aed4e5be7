//! MCP: the Model Context Protocol servers an agent connects to. Their tools
//! are declared in the agent's `tools[]` as `mcp_<server>_<tool>` and kept
//! in step with what each server offers (`reconcile.rs`).

pub mod client;
pub mod reconcile;
