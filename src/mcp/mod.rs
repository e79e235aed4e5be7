//! MCP: the Model Context Protocol servers an agent connects to. Their tools
//! are declared in the agent's `tools[]` as `mcp_<server>_<tool>` and kept
//! in step with what each server offers (`reconcile.rs`); their secrets are
//! sealed in the credentials envelope (`creds.rs`); `servers.rs` tracks the
//! live ones, their failures and backoff; `serve.rs` is the other
//! direction, adf as an MCP server for a fleet.

pub mod bench;
pub mod client;
pub mod creds;
pub mod oauth;
pub mod owner;
pub mod reconcile;
pub mod serve;
pub mod servers;
