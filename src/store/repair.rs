//! `adf repair FILE`: the owner's explicit repair of a damaged agent file.
//! Opening never repairs (a read or an open must not cost the original);
//! this does, and keeps the original under a name that is never reused.
//!
//! The copy is made from a read-only handle, so the damaged original (and
//! its WAL) stay byte for byte as they were: first by `VACUUM INTO`, and if
//! SQLite cannot read the whole file that way, table by table and row by
//! row, skipping what cannot be read. The report says what each table held
//! before (where that can still be counted) and after.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, OptionalExtension};
use serde::Serialize;

use super::error::{Ctx, Result, StoreError};
use super::{WriterLock, conn, run_check, sidecar};

/// What one table held before and after the repair.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TableOutcome {
    pub name: String,
    /// Rows the damaged file still reports, when it can be counted.
    pub rows_before: Option<i64>,
    pub rows_after: i64,
    /// What could not be read, if anything.
    pub lost: Option<String>,
}

/// The outcome of `adf repair`.
#[derive(Debug, Clone, Serialize)]
pub struct RepairReport {
    pub path: PathBuf,
    /// Every problem `integrity_check` reported before the repair.
    pub problems: Vec<String>,
    /// `none` (healthy, nothing done), `vacuum` or `table_copy`.
    pub method: &'static str,
    /// Where the damaged original (and its WAL) now are.
    pub original: Option<PathBuf>,
    pub tables: Vec<TableOutcome>,
    /// Indexes, triggers and views that could not be made again.
    pub schema_lost: Vec<String>,
}

impl RepairReport {
    /// Whether every table came through whole.
    pub fn complete(&self) -> bool {
        self.schema_lost.is_empty()
            && self.tables.iter().all(|t| t.lost.is_none() && t.rows_before.is_none_or(|b| b <= t.rows_after))
    }
}

/// A handle that reads and never writes, and leaves no sidecar that was
/// not there before (as `Store::open_read_only`).
fn reader(path: &Path) -> Result<Connection> {
    conn::register_sqlite_vec();
    let tidy = !sidecar(path, "-wal").exists() && !sidecar(path, "-shm").exists();
    let flags = OpenFlags::SQLITE_OPEN_NO_MUTEX
        | if tidy { OpenFlags::SQLITE_OPEN_READ_WRITE } else { OpenFlags::SQLITE_OPEN_READ_ONLY };
    let c = Connection::open_with_flags(path, flags).at(path)?;
    c.busy_timeout(std::time::Duration::from_secs(5)).at(path)?;
    if tidy {
        c.pragma_update(None, "query_only", true).at(path)?;
    }
    Ok(c)
}

/// Every problem `integrity_check` finds (empty when the file is sound).
/// Reads only.
pub fn check(path: &Path) -> Result<Vec<String>> {
    if !path.exists() {
        return Err(StoreError::NotFound { path: path.to_path_buf() });
    }
    let c = reader(path)?;
    match run_check(&c, path, "integrity_check") {
        Ok(p) => Ok(p.unwrap_or_default()),
        // A file too damaged to run the check is one problem, not an error.
        Err(StoreError::Corrupt { detail, .. }) => Ok(vec![detail]),
        Err(e) => Err(e),
    }
}

/// A name beside `path` that does not exist yet: `<file>.corrupt`, else
/// `<file>.corrupt.<epoch-ms>`, else with a counter.
fn fresh_name(path: &Path) -> PathBuf {
    let first = sidecar(path, ".corrupt");
    if !first.exists() && !sidecar(&first, "-wal").exists() {
        return first;
    }
    let ms = super::now_ms();
    let mut n = 0u32;
    loop {
        let candidate = sidecar(path, &if n == 0 { format!(".corrupt.{ms}") } else { format!(".corrupt.{ms}.{n}") });
        if !candidate.exists() {
            return candidate;
        }
        n += 1;
    }
}

/// Repair `path` in place, keeping the original. A sound file is left
/// exactly as it was.
pub fn repair(path: &Path) -> Result<RepairReport> {
    if !path.exists() {
        return Err(StoreError::NotFound { path: path.to_path_buf() });
    }
    // No agent may write while its file is replaced.
    let _lock = WriterLock::acquire(path)?;
    let problems = check(path)?;
    let mut report = RepairReport {
        path: path.to_path_buf(),
        problems,
        method: "none",
        original: None,
        tables: Vec::new(),
        schema_lost: Vec::new(),
    };
    if report.problems.is_empty() {
        return Ok(report);
    }
    let tmp = sidecar(path, &format!(".repairing-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let result = build_copy(path, &tmp, &mut report);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // The copy must itself be sound before it replaces anything.
    let fresh = conn::open(&tmp, false, false)?;
    if let Some(p) = run_check(&fresh, &tmp, "integrity_check")? {
        drop(fresh);
        let _ = std::fs::remove_file(&tmp);
        return Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: format!("the repaired copy is still damaged ({}); the original was not changed", p.join("; ")),
        });
    }
    fresh.close().map_err(|(_, e)| super::error::classify(&tmp, e))?;
    // Keep the original under a new name (hard links never clobber), its
    // WAL beside it; then the copy takes its place.
    let kept = fresh_name(path);
    std::fs::hard_link(path, &kept).at(&kept)?;
    for s in ["-wal", "-shm"] {
        let side = sidecar(path, s);
        if side.exists() {
            std::fs::hard_link(&side, sidecar(&kept, s)).at(&side)?;
            std::fs::remove_file(&side).at(&side)?;
        }
    }
    std::fs::rename(&tmp, path).at(path)?;
    for s in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(sidecar(&tmp, s));
    }
    report.original = Some(kept);
    Ok(report)
}

fn build_copy(path: &Path, tmp: &Path, report: &mut RepairReport) -> Result<()> {
    // Read-only by the open flag (VACUUM INTO is refused under query_only);
    // the original moves aside with whatever sidecars it has.
    conn::register_sqlite_vec();
    let src = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .at(path)?;
    src.busy_timeout(std::time::Duration::from_secs(5)).at(path)?;
    let tables = user_tables(&src);
    let before: Vec<(String, Option<i64>)> = tables.iter().map(|(n, _)| (n.clone(), count(&src, n))).collect();
    let target = tmp.to_string_lossy().into_owned();
    if src.execute("VACUUM INTO ?1", [&target]).is_ok() {
        report.method = "vacuum";
    } else {
        let _ = std::fs::remove_file(tmp);
        report.method = "table_copy";
        table_copy(&src, tmp, report)?;
    }
    let dst = reader(tmp)?;
    for (name, rows_before) in before {
        let rows_after = count(&dst, &name).unwrap_or(0);
        match report.tables.iter_mut().find(|t| t.name == name) {
            Some(t) => {
                t.rows_before = rows_before;
                t.rows_after = rows_after;
            }
            None => report.tables.push(TableOutcome { name, rows_before, rows_after, lost: None }),
        }
    }
    Ok(())
}

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn count(c: &Connection, table: &str) -> Option<i64> {
    c.query_row(&format!("SELECT count(*) FROM {}", quote(table)), [], |r| r.get(0)).ok()
}

/// Plain tables (name, sql) of the file, shadow tables included, as far as
/// the schema can be read.
fn user_tables(c: &Connection) -> Vec<(String, String)> {
    let q = "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND sql NOT LIKE 'CREATE VIRTUAL%' ORDER BY rowid";
    let Ok(mut stmt) = c.prepare(q) else { return Vec::new() };
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)));
    rows.map(|it| it.filter_map(|r| r.ok()).filter_map(|(n, s)| s.map(|s| (n, s))).collect()).unwrap_or_default()
}

/// Copy what can be read, table by table, row by row past damage.
fn table_copy(src: &Connection, tmp: &Path, report: &mut RepairReport) -> Result<()> {
    let dst = conn::open(tmp, true, false)?;
    let version: i64 = src.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap_or(0);
    let _ = dst.pragma_update(None, "user_version", version);
    for (name, sql) in user_tables(src) {
        if let Err(e) = dst.execute_batch(&sql) {
            report.schema_lost.push(format!("table {name}: {e}"));
            continue;
        }
        let lost = copy_rows(src, &dst, &name);
        report.tables.push(TableOutcome { name, rows_before: None, rows_after: 0, lost });
    }
    // Virtual tables point at their shadow tables, copied above as plain
    // tables; their schema rows are written as SQLite writes them.
    let others: Vec<(String, String, String, Option<String>)> = src
        .prepare("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE (type != 'table' OR sql LIKE 'CREATE VIRTUAL%') AND name NOT LIKE 'sqlite_%' ORDER BY rowid")
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?.collect::<rusqlite::Result<Vec<_>>>()
        })
        .unwrap_or_default();
    for (kind, name, tbl, sql) in others {
        let Some(sql) = sql else { continue };
        let made = if kind == "table" {
            dst.execute_batch("PRAGMA writable_schema = ON")
                .and_then(|()| {
                    dst.execute(
                        "INSERT INTO sqlite_master(type, name, tbl_name, rootpage, sql) VALUES ('table', ?1, ?2, 0, ?3)",
                        [&name, &tbl, &sql],
                    )
                })
                .and_then(|_| dst.execute_batch("PRAGMA writable_schema = OFF"))
        } else {
            dst.execute_batch(&sql)
        };
        if let Err(e) = made {
            report.schema_lost.push(format!("{kind} {name}: {e}"));
        }
    }
    dst.close().map_err(|(_, e)| super::error::classify(tmp, e))
}

/// Copy one table; returns what could not be read.
fn copy_rows(src: &Connection, dst: &Connection, table: &str) -> Option<String> {
    let q = quote(table);
    // The whole table at once when it reads cleanly.
    let all = dst.execute_batch("BEGIN").and_then(|()| {
        let mut read = src.prepare(&format!("SELECT * FROM {q}"))?;
        let n = read.column_count();
        let marks = vec!["?"; n].join(", ");
        let mut write = dst.prepare(&format!("INSERT INTO {q} VALUES ({marks})"))?;
        let mut rows = read.query([])?;
        while let Some(r) = rows.next()? {
            let vals: Vec<rusqlite::types::Value> = (0..n).map(|i| r.get(i)).collect::<rusqlite::Result<_>>()?;
            write.execute(rusqlite::params_from_iter(vals))?;
        }
        Ok(())
    });
    match all {
        Ok(()) => {
            let _ = dst.execute_batch("COMMIT");
            return None;
        }
        Err(_) => {
            let _ = dst.execute_batch("ROLLBACK");
        }
    }
    // Row by row, by rowid, jumping past what cannot be read.
    let has_rowid = src.query_row(&format!("SELECT rowid FROM {q} LIMIT 1"), [], |_| Ok(())).optional();
    if has_rowid.is_err() {
        return Some("the table could not be read".into());
    }
    let mut gaps = Vec::new();
    let mut next: i64 = i64::MIN;
    let _ = dst.execute_batch("BEGIN");
    for _attempt in 0..64 {
        let mut read = match src.prepare(&format!("SELECT rowid, * FROM {q} WHERE rowid >= ?1 ORDER BY rowid")) {
            Ok(s) => s,
            Err(_) => break,
        };
        let n = read.column_count();
        let marks = vec!["?"; n].join(", ");
        let cols: Vec<String> = read.column_names().skip(1).map(quote).collect();
        let Ok(mut write) =
            dst.prepare(&format!("INSERT OR IGNORE INTO {q} (rowid, {}) VALUES ({marks})", cols.join(", ")))
        else {
            break;
        };
        let Ok(mut rows) = read.query([next]) else { break };
        let mut last = None;
        let failed = loop {
            match rows.next() {
                Ok(Some(r)) => {
                    let vals: rusqlite::Result<Vec<rusqlite::types::Value>> = (0..n).map(|i| r.get(i)).collect();
                    match vals {
                        Ok(v) => {
                            if let rusqlite::types::Value::Integer(id) = v[0] {
                                last = Some(id);
                            }
                            let _ = write.execute(rusqlite::params_from_iter(v));
                        }
                        Err(_) => break true,
                    }
                }
                Ok(None) => break false,
                Err(_) => break true,
            }
        };
        if !failed {
            let _ = dst.execute_batch("COMMIT");
            return if gaps.is_empty() {
                None
            } else {
                Some(format!("rows unreadable after rowid {}", gaps.join(", ")))
            };
        }
        let from = last.unwrap_or(next);
        gaps.push(from.to_string());
        // Jump past the damaged page: the next rowid that can be sought.
        next = from.saturating_add(1 + 64 * (gaps.len() as i64));
    }
    let _ = dst.execute_batch("COMMIT");
    Some(format!("rows unreadable after rowid {}", gaps.join(", ")))
}
