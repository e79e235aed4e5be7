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
