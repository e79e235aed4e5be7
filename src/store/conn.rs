//! Opening SQLite connections the way the format requires: sqlite-vec
//! registered once per process (so `vec0` tables work in every file), then the
//! four pragmas of the spec applied on every connection, in order.

use std::path::Path;
use std::sync::Once;

use rusqlite::{Connection, OpenFlags};

use super::error::{Ctx, Result, StoreError};

static VEC_INIT: Once = Once::new();

/// Register sqlite-vec as an auto-extension: every connection opened after this
/// has `vec0` and `vec_*` functions.
pub fn register_sqlite_vec() {
    VEC_INIT.call_once(|| {
        // SAFETY: sqlite-vec's binding declares its entry point without
        // arguments; the real C symbol has the standard extension signature
        // that sqlite3_auto_extension expects, so the transmute only restores
        // the true type. Registration happens once per process.
        unsafe {
            let init: rusqlite::auto_extension::RawAutoExtension =
                std::mem::transmute(sqlite_vec::sqlite3_vec_init as *const ());
            // Registration can only fail on out-of-memory; a connection
            // without vec0 still works for everything else.
            let _ = rusqlite::auto_extension::register_auto_extension(init);
            // Past this much heap SQLite gives back cache pages before it
            // takes more; what one statement may make is capped per
            // statement by the SQL guard.
            rusqlite::ffi::sqlite3_soft_heap_limit64(512 << 20);
        }
    });
}

/// The pragmas of format.md §2, in order.
pub const PRAGMAS: &[(&str, &str)] =
    &[("journal_mode", "WAL"), ("synchronous", "NORMAL"), ("busy_timeout", "5000"), ("foreign_keys", "ON")];

/// Open a connection with the spec's setup. `create` allows a new file.
pub fn open(path: &Path, create: bool, read_only: bool) -> Result<Connection> {
    let conn = connect(path, create, read_only)?;
    apply_pragmas(&conn, path, read_only)?;
    Ok(conn)
}

/// Open without applying the pragmas yet, to look at a file before
/// changing anything in it (`journal_mode = WAL` rewrites the header).
pub fn connect(path: &Path, create: bool, read_only: bool) -> Result<Connection> {
    register_sqlite_vec();
    let mut flags = OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    if read_only {
        flags |= OpenFlags::SQLITE_OPEN_READ_ONLY;
    } else {
        flags |= OpenFlags::SQLITE_OPEN_READ_WRITE;
        if create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
    }
    let conn = Connection::open_with_flags(path, flags).at(path)?;
    small_lookaside(&conn);
    Ok(conn)
}

/// A fleet keeps one mostly idle connection per agent open: give each a
/// small lookaside (16 slots of 256 bytes instead of SQLite's 100 of 1200),
/// which is most of an idle connection's private memory.
fn small_lookaside(conn: &Connection) {
    // SAFETY: the handle is valid for the connection's life; lookaside may
    // be reconfigured while no lookaside memory is in use, which holds
    // right after the open. SQLite allocates the buffer itself (null).
    unsafe {
        rusqlite::ffi::sqlite3_db_config(
            conn.handle(),
            rusqlite::ffi::SQLITE_DBCONFIG_LOOKASIDE,
            std::ptr::null_mut::<std::ffi::c_void>(),
            256i32,
            16i32,
        );
    }
}

/// Apply the spec's pragmas, in order.
pub fn apply_pragmas(conn: &Connection, path: &Path, read_only: bool) -> Result<()> {
    // busy_timeout first in practice would be nicer, but the spec fixes the
    // order; journal_mode on a read-only handle can only be queried.
    for (name, value) in PRAGMAS {
        if read_only && *name == "journal_mode" {
            let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).at(path)?;
            let _ = mode;
            continue;
        }
        let sql = format!("PRAGMA {name} = {value}");
        // journal_mode and busy_timeout return a row; the others do not.
        let mut stmt = conn.prepare(&sql).at(path)?;
        let mut rows = stmt.query([]).at(path)?;
        while rows.next().at(path)?.is_some() {}
    }
    Ok(())
}

/// Read the value of a pragma as text (for inspection and tests).
pub fn pragma_text(conn: &Connection, name: &str) -> Result<String, StoreError> {
    conn.query_row(&format!("PRAGMA {name}"), [], |r| {
        let v: rusqlite::types::Value = r.get(0)?;
        Ok(match v {
            rusqlite::types::Value::Integer(i) => i.to_string(),
            rusqlite::types::Value::Text(t) => t,
            rusqlite::types::Value::Real(f) => f.to_string(),
            _ => String::new(),
        })
    })
    .map_err(|e| StoreError::Invalid(format!("pragma {name}: {e}")))
}
