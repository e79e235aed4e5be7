//! `adf meta …`: metadata keys from the shell. `adf_*` keys are the
//! runtime's and stay read-only here too.

use serde_json::json;

use super::MetaCmd;
use super::held::{Target, open_for_write};
use super::output::{Out, at, close, open_for_read};
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
            let entry = match open_for_write(&path)? {
                Target::Local(mut store) => {
                    store.meta_set(Caller::Owner, &key, &value, protection).map_err(|e| at(&path, e))?;
                    let entry = store.meta_get(&key).map_err(|e| at(&path, e))?;
                    close(store)?;
                    serde_json::to_value(entry)?
                }
                Target::Held(via) => {
                    let mut body = json!({"value": value});
                    if let Some(p) = protection {
                        body["protection"] = json!(p.as_str());
                    }
                    via.call(reqwest::Method::PUT, &["meta", &key], &[], Some(&body))?
                }
            };
            if out.json { out.json(&entry) } else { out.line(format!("{key} = {value}")) }
        }
        MetaCmd::Add { path, key, delta } => {
            let mut store = match open_for_write(&path)? {
                Target::Local(store) => store,
                Target::Held(via) => return Err(via.unsupported("an atomic add")),
            };
            let v = store.meta_add(Caller::Owner, &key, delta, None).map_err(|e| at(&path, e))?;
            close(store)?;
            if out.json { out.json(&json!({"key": key, "value": v})) } else { out.line(format!("{key} = {v}")) }
        }
        MetaCmd::Rm { path, key } => {
            let existed = match open_for_write(&path)? {
                Target::Local(mut store) => {
                    let existed = store.meta_delete(Caller::Owner, &key).map_err(|e| at(&path, e))?;
                    close(store)?;
                    existed
                }
                Target::Held(via) => {
                    via.call(reqwest::Method::DELETE, &["meta", &key], &[], None)?;
                    true
                }
            };
            if !existed {
                anyhow::bail!("{}: meta key \"{key}\" not found", path.display());
            }
            if out.json { out.json(&json!({"deleted": key})) } else { out.line(format!("deleted {key}")) }
        }
    }
}
