//! Rows of `adf_logs` written by the store itself (protection bypasses,
//! migrations), with the reference's amortised retention trim.

use rusqlite::{Connection, params};

use super::error::{Ctx, Result};

/// Insert one log row.
pub fn insert(
    conn: &Connection,
    level: &str,
    origin: &str,
    event: &str,
    target: Option<&str>,
    message: &str,
) -> rusqlite::Result<i64> {
    conn.execute(
        "INSERT INTO adf_logs(level, origin, event, target, message, data, created_at) VALUES (?1, ?2, ?3, ?4, ?5, NULL, ?6)",
        params![level, origin, event, target, message, super::now_ms()],
    )?;
    Ok(conn.last_insert_rowid())
}

/// Record a protection bypass (`warn/protection/bypass`).
pub fn bypass(conn: &Connection, target: &str, what: &str) -> Result<()> {
    insert(conn, "warn", "protection", "bypass", Some(target), &format!("⚠ protection override: {what} \"{target}\""))
        .at(std::path::Path::new(target))?;
    Ok(())
}

/// Keep at most `max_rows` rows: delete every id at or below the id found at
/// `OFFSET max_rows` counting down from the newest.
pub fn trim(conn: &Connection, max_rows: u64) -> rusqlite::Result<usize> {
    conn.execute(
        "DELETE FROM adf_logs WHERE id <= (SELECT id FROM adf_logs ORDER BY id DESC LIMIT 1 OFFSET ?1)",
        [max_rows as i64],
    )
}

/// One `adf_logs` row as read back.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LogRow {
    pub id: i64,
    pub level: String,
    pub origin: Option<String>,
    pub event: Option<String>,
    pub target: Option<String>,
    pub message: String,
    pub data: Option<String>,
    pub created_at: i64,
}

/// What `log_list` returns.
#[derive(Debug, Clone, Default)]
pub struct LogQuery<'a> {
    /// This level and the more severe ones (`debug` < `info` < `warn` < `error`).
    pub level: Option<&'a str>,
    /// Exactly this origin (`executor`, `protection`, `lambda`, …).
    pub origin: Option<&'a str>,
    /// Rows after this id (a follower).
    pub after: i64,
    /// The newest `limit` rows that match, in id order.
    pub limit: i64,
}

/// The levels from least to most severe.
pub const LEVELS: &[&str] = &["debug", "info", "warn", "error"];

impl super::Store {
    /// Log rows matching `q`, oldest first.
    pub fn log_list(&self, q: &LogQuery<'_>) -> Result<Vec<LogRow>> {
        let levels: Vec<&str> = match q.level {
            Some(l) => {
                let at = LEVELS.iter().position(|x| *x == l).ok_or_else(|| {
                    super::StoreError::Invalid(format!("log level {l:?} is not one of {}", LEVELS.join(", ")))
                })?;
                LEVELS[at..].to_vec()
            }
            None => Vec::new(),
        };
        let sql = "SELECT id, level, origin, event, target, message, data, created_at FROM (
                     SELECT * FROM adf_logs WHERE id > ?1
                       AND (?2 = '' OR level IN (SELECT value FROM json_each(?2)))
                       AND (?3 IS NULL OR origin = ?3)
                     ORDER BY id DESC LIMIT ?4) ORDER BY id";
        let lv = if levels.is_empty() { String::new() } else { serde_json::to_string(&levels).unwrap_or_default() };
        let mut st = self.conn().prepare_cached(sql).at(self.path())?;
        st.query_map(params![q.after, lv, q.origin, q.limit.max(1)], |r| {
            Ok(LogRow {
                id: r.get(0)?,
                level: super::error::text_lossy(r, 1)?,
                origin: super::error::opt_text_lossy(r, 2)?,
                event: super::error::opt_text_lossy(r, 3)?,
                target: super::error::opt_text_lossy(r, 4)?,
                message: super::error::text_lossy(r, 5)?,
                data: super::error::opt_text_lossy(r, 6)?,
                created_at: r.get(7)?,
            })
        })
        .at(self.path())?
        .collect::<rusqlite::Result<Vec<_>>>()
        .at(self.path())
    }
}
