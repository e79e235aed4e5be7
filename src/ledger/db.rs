//! The ledger's SQLite file: opening it (a corrupt one is moved aside,
//! never deleted), writing a batch of calls with their roll-ups in one
//! transaction, and the reports `adf usage` prints.
//!
//! Every call is one row of `calls`; the same transaction adds it to
//! `rollup`, one row per (dimension, UTC day, key) for the dimensions
//! `day`, `provider`, `model` and `agent`. Reports read the roll-ups, so
//! their cost follows the number of days and keys, not of calls. Writes are
//! increments inside SQLite transactions: two processes (the app and a
//! daemon) add to one ledger and neither overwrites the other.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use super::Entry;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS calls (
  id INTEGER PRIMARY KEY,
  ts INTEGER NOT NULL,
  agent_id TEXT NOT NULL,
  loop TEXT NOT NULL DEFAULT 'main',
  provider TEXT NOT NULL,
  model TEXT NOT NULL,
  call_source TEXT NOT NULL,
  input INTEGER NOT NULL,
  output INTEGER NOT NULL,
  cache_read INTEGER NOT NULL DEFAULT 0,
  cache_write INTEGER NOT NULL DEFAULT 0,
  cost_usd REAL,
  cost_source TEXT
);
CREATE TABLE IF NOT EXISTS rollup (
  dim TEXT NOT NULL,
  day TEXT NOT NULL,
  key TEXT NOT NULL,
  calls INTEGER NOT NULL DEFAULT 0,
  input INTEGER NOT NULL DEFAULT 0,
  output INTEGER NOT NULL DEFAULT 0,
  cache_read INTEGER NOT NULL DEFAULT 0,
  cache_write INTEGER NOT NULL DEFAULT 0,
  usd REAL NOT NULL DEFAULT 0,
  unpriced INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (dim, day, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS agents (
  agent_id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  file TEXT NOT NULL DEFAULT ''
);
";

/// What went wrong with the ledger file.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("usage ledger {path}: {source}")]
    Sqlite { path: String, source: rusqlite::Error },
    #[error("usage ledger {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// Is this error SQLite saying the file is not a sound database?
fn is_corrupt(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt))
}

/// An open ledger, and the notice to give when a corrupt file was moved
/// aside to open it.
pub struct Opened {
    pub conn: Connection,
    pub moved: Option<String>,
}

fn try_open(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

/// Open (making it and its folder if need be). A file SQLite calls corrupt
/// is renamed to `<name>.corrupt-<unix time>` with its WAL, and a new
/// ledger is started; `moved` says where the old one went.
pub fn open(path: &Path) -> Result<Opened, LedgerError> {
    let io = |source| LedgerError::Io { path: path.display().to_string(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    match try_open(path) {
        Ok(conn) => Ok(Opened { conn, moved: None }),
        Err(e) if is_corrupt(&e) => {
            let aside = move_aside(path).map_err(io)?;
            let conn =
                try_open(path).map_err(|source| LedgerError::Sqlite { path: path.display().to_string(), source })?;
            let moved = format!(
                "the usage ledger {} was corrupt ({e}); it was moved aside to {} and a new one started",
                path.display(),
                aside.display()
            );
            Ok(Opened { conn, moved: Some(moved) })
        }
        Err(source) => Err(LedgerError::Sqlite { path: path.display().to_string(), source }),
    }
}

/// Rename the file and its WAL and shared-memory files out of the way.
pub fn move_aside(path: &Path) -> std::io::Result<PathBuf> {
    let stamp = chrono::Utc::now().timestamp();
    let mut aside = PathBuf::from(format!("{}.corrupt-{stamp}", path.display()));
    let mut n = 1;
    while aside.exists() {
        aside = PathBuf::from(format!("{}.corrupt-{stamp}-{n}", path.display()));
        n += 1;
    }
    std::fs::rename(path, &aside)?;
    for ext in ["-wal", "-shm"] {
        let side = PathBuf::from(format!("{}{ext}", path.display()));
        if side.exists() {
            std::fs::rename(&side, PathBuf::from(format!("{}{ext}", aside.display())))?;
        }
    }
    Ok(aside)
}

/// Write calls and their roll-ups in one transaction.
pub fn write(conn: &mut Connection, entries: &[Entry]) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    {
        let mut call = tx.prepare_cached(
            "INSERT INTO calls(ts, agent_id, loop, provider, model, call_source, input, output, cache_read,
               cache_write, cost_usd, cost_source) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        )?;
        let mut roll = tx.prepare_cached(
            "INSERT INTO rollup(dim, day, key, calls, input, output, cache_read, cache_write, usd, unpriced)
             VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT(dim, day, key) DO UPDATE SET calls = calls + 1, input = input + excluded.input,
               output = output + excluded.output, cache_read = cache_read + excluded.cache_read,
               cache_write = cache_write + excluded.cache_write, usd = usd + excluded.usd,
               unpriced = unpriced + excluded.unpriced",
        )?;
        let mut agent = tx.prepare_cached(
            "INSERT INTO agents(agent_id, name, file) VALUES (?1, ?2, ?3)
             ON CONFLICT(agent_id) DO UPDATE SET name = excluded.name, file = excluded.file
             WHERE name <> excluded.name OR file <> excluded.file",
        )?;
        for e in entries {
            let u = &e.usage;
            let (cr, cw) = (u.cache_read.unwrap_or(0) as i64, u.cache_write.unwrap_or(0) as i64);
            let (usd, source) = match e.cost {
                Some((c, s)) => (Some(c), Some(s)),
                None => (None, None),
            };
            call.execute(params![
                e.ts_ms,
                e.agent_id,
                e.loop_name,
                e.provider,
                e.model,
                e.call_source,
                u.input as i64,
                u.output as i64,
                cr,
                cw,
                usd,
                source
            ])?;
            let day = super::day_of(e.ts_ms);
            for (dim, key) in [
                ("day", ""),
                ("provider", e.provider.as_str()),
                ("model", e.model.as_str()),
                ("agent", e.agent_id.as_str()),
            ] {
                roll.execute(params![
                    dim,
                    day,
                    key,
                    u.input as i64,
                    u.output as i64,
                    cr,
                    cw,
                    usd.unwrap_or(0.0),
                    usd.is_none() as i64
                ])?;
            }
            if !e.agent_id.is_empty() {
                agent.execute(params![e.agent_id, e.agent, e.file])?;
            }
        }
    }
    tx.commit()
}

/// One line of a report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Row {
    /// The day, provider, model or agent id.
    pub key: String,
    /// The agent's name (`--by agent`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    pub cost_usd: f64,
    /// Calls no price was known for (their cost is not in `cost_usd`).
    pub unpriced_calls: u64,
}

impl Row {
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens
    }
}

/// What to group a report by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum By {
    Day,
    Provider,
    Model,
    Agent,
}

impl By {
    fn dim(self) -> &'static str {
        match self {
            By::Day => "day",
            By::Provider => "provider",
            By::Model => "model",
            By::Agent => "agent",
        }
    }
}

/// Totals grouped by `by`, from the UTC day `since` on (all when `None`),
/// biggest spend first (by day: in date order).
pub fn report(conn: &Connection, by: By, since: Option<&str>) -> rusqlite::Result<Vec<Row>> {
    let since = since.unwrap_or("");
    let key = if by == By::Day { "day" } else { "key" };
    let order = if by == By::Day { "day" } else { "sum(usd) DESC, sum(input + output) DESC, key" };
    let sql = format!(
        "SELECT {key}, sum(calls), sum(input), sum(output), sum(cache_read), sum(cache_write), sum(usd),
           sum(unpriced), (SELECT name FROM agents WHERE agent_id = key)
         FROM rollup WHERE dim = ?1 AND day >= ?2 GROUP BY {key} ORDER BY {order}"
    );
    let mut st = conn.prepare(&sql)?;
    let rows = st.query_map(params![by.dim(), since], |r| {
        Ok(Row {
            key: r.get(0)?,
            name: if by == By::Agent { r.get(8)? } else { None },
            calls: r.get::<_, i64>(1)? as u64,
            input_tokens: r.get::<_, i64>(2)? as u64,
            output_tokens: r.get::<_, i64>(3)? as u64,
            cache_read_tokens: r.get::<_, i64>(4)? as u64,
            cache_write_tokens: r.get::<_, i64>(5)? as u64,
            cost_usd: r.get(6)?,
            unpriced_calls: r.get::<_, i64>(7)? as u64,
        })
    })?;
    rows.collect()
}

/// The fleet's spend today (`day`) and in total: (usd today, tokens today,
/// usd total, tokens total).
pub fn totals(conn: &Connection, day: &str) -> rusqlite::Result<(f64, u64, f64, u64)> {
    let tok = "input + output + cache_read + cache_write";
    let (ud, td): (Option<f64>, Option<i64>) = conn
        .query_row(&format!("SELECT usd, {tok} FROM rollup WHERE dim = 'day' AND day = ?1 AND key = ''"), [day], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?
        .unwrap_or((None, None));
    let (ut, tt): (Option<f64>, Option<i64>) =
        conn.query_row(&format!("SELECT sum(usd), sum({tok}) FROM rollup WHERE dim = 'day'"), [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    Ok((ud.unwrap_or(0.0), td.unwrap_or(0) as u64, ut.unwrap_or(0.0), tt.unwrap_or(0) as u64))
}
