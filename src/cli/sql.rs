//! `adf sql PATH SQL`: the owner's raw SQL, through the db_query/db_execute
//! guard. Reads print rows; writes print the change count.

use serde_json::{Value, json};

use super::config::parse_value;
use super::output::{Out, at, close, open, open_for_read};
use std::path::Path;

pub fn run(out: &Out, path: &Path, sql: &str, params: &[String]) -> anyhow::Result<()> {
    let params: Vec<Value> = params.iter().map(|p| parse_value(p)).collect::<anyhow::Result<_>>()?;
    let first = sql.split_whitespace().next().unwrap_or("").to_ascii_lowercase();
    if ["select", "with", "explain"].contains(&first.as_str()) {
        let store = open_for_read(path)?;
        let res = store.db_query(sql, &params, true).map_err(|e| at(path, e))?;
        close(store)?;
        if out.json {
            return out.json(&res.rows);
        }
        let header: Vec<String> = res.rows.first().map(|r| r.keys().cloned().collect()).unwrap_or_default();
        let rows: Vec<Vec<String>> = res
            .rows
            .iter()
            .map(|r| {
                r.values()
                    .map(|v| match v {
                        Value::String(s) => s.clone(),
                        v => v.to_string(),
                    })
                    .collect()
            })
            .collect();
        let header: Vec<&str> = header.iter().map(String::as_str).collect();
        out.table(&header, &rows)?;
        out.line(format!("({} row{})", res.total, if res.total == 1 { "" } else { "s" }))
    } else {
        let mut store = open(path)?;
        // The owner counts as authorized code for table protections.
        let n = store.db_execute(sql, &params, true).map_err(|e| at(path, e))?;
        close(store)?;
        if out.json { out.json(&json!({"changes": n})) } else { out.line(format!("{n} row(s) changed")) }
    }
}
