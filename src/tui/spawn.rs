//! The terminal app's `n` makes a blank agent, or one from a file: a child
//! of a template (its config, files and locks) or a clone of an agent (a
//! fresh identity, its files and tables, no history). The work is
//! `store::derive`'s; this only picks it and names the source file, a
//! relative path taken from the fleet folder when it is not found as typed.

use std::path::{Path, PathBuf};

use super::forms::StartFrom;
use crate::store::create::{NewAgent, create_file};
use crate::store::derive::{self, ChildSpec, CloneOptions, Template};
use crate::store::{Caller, Store};

/// Where a typed source path points: as typed, else under the fleet folder.
fn source(dir: &Path, typed: &str) -> PathBuf {
    let p = PathBuf::from(typed.trim());
    if p.is_relative() && !p.exists() { dir.join(p) } else { p }
}

/// Create the agent at `path`; returns its id.
pub fn create(
    path: &Path,
    name: &str,
    new: NewAgent<'_>,
    from: Option<&StartFrom>,
    dir: &Path,
) -> anyhow::Result<String> {
    match from {
        None => Ok(create_file(path, &new)?.id),
        Some(StartFrom::Template(t)) => {
            let t = source(dir, t);
            let template = Template::load(&t)?;
            // The template's provider and model stand (they may be locked).
            let new = NewAgent { provider: None, model: None, ..new };
            let spec = ChildSpec { new, template: Some(&template), ..Default::default() };
            Ok(derive::create_child(path, &spec)?.id)
        }
        Some(StartFrom::Clone(c)) => {
            let c = source(dir, c);
            let opts = CloneOptions { history: false, files: true, tables: true };
            let made = derive::clone_file(&c, path, opts, new.seal_to.as_deref())?;
            let mut store = Store::open(path)?;
            store.config_set(Caller::Owner, "name", serde_json::Value::String(name.to_string()))?;
            store.close()?;
            Ok(made.id)
        }
    }
}
