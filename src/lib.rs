//! `adf`: run and manage AI agents that each live in one `.adf` file.
//!
//! The crate is one binary with a library behind it so that integration
//! tests and benchmarks drive the same code the binary runs. Seams:
//! `store` (the file), `docs` (office documents as text and rows), `runtime` (executors, fleet, bus), `sandbox` (agent
//! code in boa workers), `tools`, `providers`, `daemon`, `client`, `tui`,
//! `cli` (argument parsing and printing).

pub mod channels;
pub mod cli;
pub mod client;
pub mod daemon;
pub mod docs;
pub mod identity;
pub mod knowledge;
pub mod ledger;
pub mod mcp;
pub mod paths;
pub mod protocol;
pub mod providers;
pub mod review;
pub mod runtime;
pub mod sandbox;
pub mod store;
pub mod tools;
pub mod tui;
