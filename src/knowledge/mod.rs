//! What an agent knows beyond its own notes: SKILL.md skills
//! (`skills.rs`: indexed from the fleet's folder and the agent's files,
//! offered by name and description, read on demand) and Open Knowledge
//! Format bundles (`okf.rs`: concepts with a type, linked into a graph).

pub mod okf;
pub mod skills;
