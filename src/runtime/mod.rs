//! The agent runtime: the event bus, prompt assembly and each agent's
//! executor (the turn loop).

pub mod agent;
pub mod background;
pub mod budget;
pub mod bus;
pub mod code;
pub mod compute;
pub mod context;
pub mod diff;
pub mod docs_code;
pub mod egress;
pub mod executor;
pub mod fetch;
pub mod fleet;
pub mod identity_code;
pub mod inject;
pub mod loop_templates;
pub mod loops_bench;
pub mod mesh;
pub mod prompt;
pub mod shell;
pub mod signals;
pub mod slash;
pub mod spawn;
pub mod streams;
pub mod taps;
pub mod triggers;
pub mod why;
