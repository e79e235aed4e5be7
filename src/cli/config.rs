//! `adf config …`: read and change the config document by dotted path.

use serde_json::{Value, json};

use super::ConfigCmd;
use super::held::{Target, open_for_write};
use super::output::{Out, at, close, open_for_read};
use crate::store::Caller;
use crate::store::config::{get_path, validate};

/// Parse a value given on the command line: JSON, or a bare string.
pub fn parse_value(s: &str) -> anyhow::Result<Value> {
    match serde_json::from_str::<Value>(s) {
        Ok(v) => Ok(v),
        Err(e) => {
            let t = s.trim_start();
            if t.starts_with(['{', '[', '"']) {
                anyhow::bail!("value is not valid JSON: {e}")
            }
            Ok(Value::String(s.to_string()))
        }
    }
}

pub fn run(out: &Out, cmd: ConfigCmd) -> anyhow::Result<()> {
    match cmd {
        // Handled before: the daemon's view of an agent.
        ConfigCmd::Agent(_) => Ok(()),
        ConfigCmd::Get { path, key } => {
            let store = open_for_read(&path)?;
            let cfg = store.config_value().map_err(|e| at(&path, e))?;
            close(store)?;
            let v = match &key {
                Some(k) => {
                    get_path(&cfg, k).ok_or_else(|| anyhow::anyhow!("{}: config has no \"{k}\"", path.display()))?
                }
                None => &cfg,
            };
            match v {
                Value::String(s) if !out.json => out.line(s),
                v => out.json(v),
            }
        }
        ConfigCmd::Set { path, key, value } => {
            let v = parse_value(&value).map_err(|e| anyhow::anyhow!("{}: {key}: {e}", path.display()))?;
            match open_for_write(&path)? {
                Target::Local(mut store) => {
                    store.config_set(Caller::Owner, &key, v.clone()).map_err(|e| at(&path, e))?;
                    close(store)?;
                }
                Target::Held(via) => {
                    // The holder validates the whole document it is given.
                    let mut cfg = via.call(reqwest::Method::GET, &["config"], &[], None)?["config"].take();
                    crate::store::config::set_path(&mut cfg, &key, v.clone()).map_err(|e| at(&path, e))?;
                    via.call(reqwest::Method::PUT, &["config"], &[], Some(&cfg))?;
                }
            }
            if out.json { out.json(&json!({"path": key, "value": v})) } else { out.line(format!("{key} = {v}")) }
        }
        ConfigCmd::Check { path } => {
            let store = open_for_read(&path)?;
            let cfg = store.config_value().map_err(|e| at(&path, e))?;
            close(store)?;
            let mut issues = validate(&cfg);
            let settings = crate::providers::accounts::load().map_err(|e| anyhow::anyhow!(e))?;
            if let Some(why) = crate::providers::accounts::unknown_provider(&cfg, &settings) {
                issues.push(crate::store::config::Issue { path: "model.provider".into(), message: why });
            }
            if out.json {
                return out.json(&issues);
            }
            if issues.is_empty() {
                return out.line("config is valid");
            }
            for i in &issues {
                out.line(i.to_string())?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bare_words_are_strings() {
        assert_eq!(parse_value("anthropic").unwrap(), json!("anthropic"));
        assert_eq!(parse_value("true").unwrap(), json!(true));
        assert_eq!(parse_value("{\"a\":1}").unwrap(), json!({"a": 1}));
        assert!(parse_value("{broken").is_err());
    }

    proptest! {
        #[test]
        fn json_values_parse_back(n in any::<i64>(), s in "[a-z]{1,8}") {
            prop_assert_eq!(parse_value(&n.to_string()).unwrap(), json!(n));
            prop_assert_eq!(parse_value(&json!(s).to_string()).unwrap(), json!(s));
        }
    }
}
