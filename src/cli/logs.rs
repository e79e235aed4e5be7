//! `adf logs FILE|AGENT [--level L] [--origin O] [--limit N] [--follow]`:
//! an agent's `adf_logs`, read from its file (beside any writer) or, for
//! an agent's name, through the daemon. `--follow` keeps printing new rows
//! until interrupted; with `--json` each row is one JSON line.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::output::{Out, at, close, open_for_read};
use crate::client::Client;
use crate::store::logs::{LogQuery, LogRow};

/// What to show.
pub struct Opts<'a> {
    pub level: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub limit: i64,
    pub follow: bool,
}

fn line(r: &LogRow) -> String {
    let at = chrono::DateTime::from_timestamp_millis(r.created_at)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_default();
    let data = r.data.as_deref().map(|d| format!("  {d}")).unwrap_or_default();
    format!(
        "{at} {:<5} {:<10} {:<22} {}{data}",
        r.level.to_uppercase(),
        r.origin.as_deref().unwrap_or("-"),
        r.event.as_deref().unwrap_or("-"),
        r.message
    )
}

fn print(out: &Out, rows: &[LogRow], stream: bool) -> anyhow::Result<()> {
    if out.json && !stream {
        return out.json(&json!({"logs": rows}));
    }
    for r in rows {
        if out.json {
            out.line(serde_json::to_string(r)?)?;
        } else {
            out.line(line(r))?;
        }
    }
    Ok(())
}

/// The logs of an agent file.
pub fn file(out: &Out, path: &Path, o: &Opts<'_>) -> anyhow::Result<()> {
    let store = open_for_read(path)?;
    let q = LogQuery { level: o.level, origin: o.origin, after: 0, limit: o.limit };
    let rows = store.log_list(&q).map_err(|e| at(path, e));
    let rows = match rows {
        Ok(r) => r,
        Err(e) => {
            close(store)?;
            return Err(e);
        }
    };
    print(out, &rows, o.follow)?;
    if !o.follow {
        return close(store);
    }
    let mut last = rows.last().map_or(0, |r| r.id);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let q = LogQuery { level: o.level, origin: o.origin, after: last, limit: 1000 };
        let rows = store.log_list(&q).map_err(|e| at(path, e))?;
        if let Some(r) = rows.last() {
            last = r.id;
        }
        print(out, &rows, true)?;
    }
}

/// The logs of an agent the daemon runs.
pub fn remote(out: &Out, url: Option<&str>, agent: &str, o: &Opts<'_>) -> anyhow::Result<()> {
    let client = Client::find(url);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let get = |after: i64, limit: i64| -> anyhow::Result<Vec<LogRow>> {
        let (after, limit) = (after.to_string(), limit.to_string());
        let mut q = vec![("after", after.as_str()), ("limit", limit.as_str())];
        if let Some(l) = o.level {
            q.push(("level", l));
        }
        if let Some(g) = o.origin {
            q.push(("origin", g));
        }
        let url = client.url(&["agents", agent, "logs"], &q)?;
        let v = rt.block_on(client.call(reqwest::Method::GET, url, None))?;
        Ok(serde_json::from_value(v["logs"].clone())?)
    };
    let rows = get(0, o.limit)?;
    print(out, &rows, o.follow)?;
    if !o.follow {
        return Ok(());
    }
    let mut last = rows.last().map_or(0, |r| r.id);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let rows = get(last, 1000)?;
        if let Some(r) = rows.last() {
            last = r.id;
        }
        print(out, &rows, true)?;
    }
}
