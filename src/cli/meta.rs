//! `adf meta …`: metadata keys from the shell. `adf_*` keys are the
//! runtime's and stay read-only here too.

use serde_json::json;

use super::MetaCmd;
use super::output::{Out, at, close, open, open_for_read};
use crate::store::Caller;
use crate::store::meta::MetaProtection;

pub fn run(out: &Out, cmd: MetaCmd) -> anyhow::Result<()> {
    match cmd {
        MetaCmd::Ls { path } => {
            let store = open_for_read(&path)?;
            let rows = store.meta_list().map_err(|e| at(&path, e))?;
            close(store)?;
            if out.json {
                return out.json(&rows);
            }
            let rows: Vec<Vec<String>> =
                rows.into_iter().map(|m| vec![m.key, m.protection.as_str().to_string(), m.value]).collect();
            out.table(&["KEY", "PROTECTION", "VALUE"], &rows)
        }
        MetaCmd::Get { path, key } => {
            let store = open_for_read(&path)?;
            let entry = store.meta_get(&key).map_err(|e| at(&path, e))?;
            close(store)?;
            let entry = entry.ok_or_else(|| anyhow::anyhow!("{}: meta key \"{key}\" not found", path.display()))?;
            if out.json { out.json(&entry) } else { out.line(entry.value) }
        }
        MetaCmd::Set { path, key, value, protection } => {
            let protection = protection.as_deref().map(MetaProtection::parse).transpose().map_err(|e| at(&path, e))?;
            let mut store = open(&path)?;
            store.meta_set(Caller::Owner, &key, &value, protection).map_err(|e| at(&path, e))?;
            let entry = store.meta_get(&key).map_err(|e| at(&path, e))?;
            close(store)?;
            if out.json { out.json(&entry) } else { out.line(format!("{key} = {value}")) }
        }
        MetaCmd::Add { path, key, delta } => {
            let mut store = open(&path)?;
            let v = store.meta_add(Caller::Owner, &key, delta, None).map_err(|e| at(&path, e))?;
            close(store)?;
            if out.json { out.json(&json!({"key": key, "value": v})) } else { out.line(format!("{key} = {v}")) }
        }
        MetaCmd::Rm { path, key } => {
            let mut store = open(&path)?;
            let existed = store.meta_delete(Caller::Owner, &key).map_err(|e| at(&path, e))?;
            close(store)?;
            if !existed {
                anyhow::bail!("{}: meta key \"{key}\" not found", path.display());
            }
            if out.json { out.json(&json!({"deleted": key})) } else { out.line(format!("deleted {key}")) }
        }
    }
}
