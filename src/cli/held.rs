//! A change to a file another adf process holds (the terminal app, a
//! daemon) goes through that process's control API, named in the file's
//! lock record, instead of failing with "held by another adf process": the
//! holder applies it through the agent, with the same rules.

use std::path::{Path, PathBuf};

use reqwest::Method;
use serde_json::Value;

use super::output::at;
use crate::client::Client;
use crate::store::{Store, StoreError, current_holder};

/// Where a write goes. One lives for one command: its size is no cost.
#[allow(clippy::large_enum_variant)]
pub enum Target {
    /// This process opened the file for writing.
    Local(Store),
    /// The holder's API, for the agent with this id.
    Held(Via),
}

pub struct Via {
    pub client: Client,
    pub agent: String,
    pub path: PathBuf,
}

/// Open `path` for a change: as its writer, or through its holder.
pub fn open_for_write(path: &Path) -> anyhow::Result<Target> {
    match Store::open(path) {
        Ok(s) => Ok(Target::Local(s)),
        Err(e @ StoreError::Held { .. }) => match holder_api(path) {
            Some(via) => Ok(Target::Held(via)),
            None => Err(at(path, e)),
        },
        Err(e) => Err(at(path, e)),
    }
}

/// The holder's API and the agent's id, when the holder serves one.
pub fn holder_api(path: &Path) -> Option<Via> {
    let api = current_holder(path)?.api?;
    let store = Store::open_read_only(path).ok()?;
    let id = store.config_value().ok()?.get("id")?.as_str()?.to_string();
    Some(Via { client: Client::new(&api), agent: id, path: path.to_path_buf() })
}

impl Via {
    /// One call under `agents/<id>/…`, answered as JSON.
    pub fn call(
        &self,
        method: Method,
        rest: &[&str],
        query: &[(&str, &str)],
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let mut segs = vec!["agents", self.agent.as_str()];
        segs.extend_from_slice(rest);
        let url = self.client.url(&segs, query)?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(self.client.call(method, url, body))
            .map_err(|e| anyhow::anyhow!("{}: {e} (through the adf process that holds it)", self.path.display()))
    }

    /// A change this route table has no route for.
    pub fn unsupported(&self, what: &str) -> anyhow::Error {
        let holder = current_holder(&self.path).map(|h| format!("pid {} on {}", h.pid, h.host)).unwrap_or_default();
        anyhow::anyhow!(
            "{}: held by another adf process ({holder}), whose API has no route for {what}; do it there, or stop it first",
            self.path.display()
        )
    }
}
