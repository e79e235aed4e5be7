//! The agent runtime: the event bus, the fleet of loaded agents and each
//! agent's executor.

pub mod bus;
