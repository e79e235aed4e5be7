//! The SQL guard decided on SQLite's own view of a statement. The text
//! checks in `sql_guard` give the spec's messages for the common cases; this
//! is what holds: while a guarded statement is prepared and run, SQLite's
//! authorizer reports every table and column it reads or writes, every
//! virtual table module, pragma, function and attach, whatever the
//! spelling (`'adf_identity'`, `"ADF_META"`, a view, a CTE), and refuses
//! what the policy does not allow. The same window caps a value's length
//! (`SQLITE_LIMIT_LENGTH`) and the statement's running time (a progress
//! handler), so a hostile query fails cleanly and small.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use rusqlite::ffi;
use rusqlite::limits::Limit;
use serde_json::{Map, Value};

use super::error::StoreError;
use super::sql_guard::READ_TABLES;

/// SQLite's names for its schema table, which a guarded read may read
/// besides the tables of `sql_guard::READ_TABLES`.
const SCHEMA: &[&str] = &["sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"];

fn readable(table: &str) -> bool {
    let listed = |t: &&str| t.eq_ignore_ascii_case(table);
    Policy::local(table) || READ_TABLES.iter().filter(|t| **t != "local_").any(listed) || SCHEMA.iter().any(listed)
}

/// Virtual table modules an agent may create (its own tables only).
const MODULES: &[&str] = &["vec0", "fts5", "fts4", "fts3", "rtree", "rtree_i32"];

/// Functions that reach beyond the statement's data.
const FUNCTIONS: &[&str] = &["load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"];

/// Pragmas modules query while they work.
const INTERNAL_PRAGMAS: &[&str] = &["data_version", "page_size", "page_count"];

/// Longest string or blob a guarded statement may make or read.
pub const MAX_VALUE_BYTES: i32 = 64 << 20;

/// How long a guarded statement may run.
pub const MAX_RUN: Duration = Duration::from_secs(30);

/// What a guarded statement may do.
pub struct Policy {
    write: bool,
    protections: Map<String, Value>,
    authorized: bool,
    /// Why the first refused action was refused.
    refused: Option<String>,
    deadline: Instant,
    timed_out: bool,
}

impl Policy {
    /// `db_query`: reads of the allowed tables only.
    pub fn query() -> Box<Policy> {
        Box::new(Policy {
            write: false,
            protections: Map::new(),
            authorized: false,
            refused: None,
            deadline: Instant::now() + MAX_RUN,
            timed_out: false,
        })
    }

    /// `db_execute`: writes to `local_*` tables under their protections.
    pub fn execute(protections: Map<String, Value>, authorized: bool) -> Box<Policy> {
        Box::new(Policy { write: true, protections, authorized, ..*Policy::query() })
    }

    fn local(name: &str) -> bool {
        name.len() > 6 && name[..6].eq_ignore_ascii_case("local_")
    }

    fn protection(&self, table: &str) -> Option<&str> {
        self.protections.iter().find(|(k, _)| k.eq_ignore_ascii_case(table)).and_then(|(_, v)| v.as_str())
    }

    /// Whether a write of `verb` to `table` is allowed; the reason if not.
    fn write_to(&self, verb: &str, table: &str) -> Result<(), String> {
        if !self.write {
            return Err("Only read queries (SELECT/WITH/EXPLAIN) are allowed. Use db_execute for writes.".into());
        }
        if table.eq_ignore_ascii_case("sqlite_master") || table.eq_ignore_ascii_case("sqlite_schema") {
            // SQLite's own bookkeeping of a CREATE or DROP it authorized.
            return Ok(());
        }
        if !Policy::local(table) {
            return Err(format!("Cannot {verb} \"{table}\": write operations are only allowed on local_* tables."));
        }
        match self.protection(table) {
            Some("append_only") if matches!(verb, "update" | "delete" | "drop") => {
                Err(format!("Cannot {verb} \"{table}\": table is append-only."))
            }
            Some("authorized") if verb != "create" && !self.authorized => {
                Err(format!("Cannot write to \"{table}\": requires authorized code."))
            }
            _ => Ok(()),
        }
    }

    fn decide(&self, code: c_int, a: Option<&str>, b: Option<&str>) -> Result<(), String> {
        let a = a.unwrap_or("");
        let b = b.unwrap_or("");
        match code {
            ffi::SQLITE_SELECT | ffi::SQLITE_RECURSIVE => Ok(()),
            ffi::SQLITE_READ => {
                if readable(a) {
                    Ok(())
                } else {
                    Err(format!("Access to {a} is not allowed (only {}*).", READ_TABLES[..9].join(", ")))
                }
            }
            ffi::SQLITE_FUNCTION => {
                if FUNCTIONS.iter().any(|f| f.eq_ignore_ascii_case(b)) {
                    Err(format!("The function {b}() is not allowed."))
                } else {
                    Ok(())
                }
            }
            ffi::SQLITE_INSERT => self.write_to("insert into", a),
            ffi::SQLITE_UPDATE => self.write_to("update", a),
            ffi::SQLITE_DELETE => self.write_to("delete", a),
            ffi::SQLITE_CREATE_TABLE => self.write_to("create", a),
            ffi::SQLITE_DROP_TABLE => self.write_to("drop", a),
            // vec0 and fts5 index their shadow tables.
            ffi::SQLITE_CREATE_INDEX | ffi::SQLITE_DROP_INDEX => self.write_to("index", b),
            ffi::SQLITE_CREATE_VTABLE | ffi::SQLITE_DROP_VTABLE => {
                if !MODULES.iter().any(|m| m.eq_ignore_ascii_case(b)) {
                    return Err(format!("Virtual tables of module {b} are not allowed (only {}).", MODULES.join(", ")));
                }
                self.write_to(if code == ffi::SQLITE_CREATE_VTABLE { "create" } else { "drop" }, a)
            }
            // Modules run their own bookkeeping in savepoints.
            ffi::SQLITE_TRANSACTION | ffi::SQLITE_SAVEPOINT if self.write => Ok(()),
            // Modules (fts5) read these for their own bookkeeping; none
            // shows data, and none may be set.
            ffi::SQLITE_PRAGMA if b.is_empty() && INTERNAL_PRAGMAS.iter().any(|p| p.eq_ignore_ascii_case(a)) => Ok(()),
            ffi::SQLITE_PRAGMA => Err(format!("PRAGMA {a} is not allowed here.")),
            ffi::SQLITE_ATTACH | ffi::SQLITE_DETACH => Err("ATTACH and DETACH are not allowed.".into()),
            _ => Err("Only INSERT, UPDATE, DELETE, CREATE TABLE, and DROP TABLE statements are allowed.".into()),
        }
    }
}

fn text<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        None
    } else {
        // SAFETY: SQLite passes NUL-terminated strings valid for the call.
        unsafe { CStr::from_ptr(p) }.to_str().ok()
    }
}

extern "C" fn authorize(
    data: *mut c_void,
    code: c_int,
    a: *const c_char,
    b: *const c_char,
    _db: *const c_char,
    _trigger: *const c_char,
) -> c_int {
    // SAFETY: `data` is the `Policy` the `Enforced` guard owns; the
    // callback is removed before the guard drops it, and SQLite calls it
    // on the thread running the statement, never concurrently.
    let policy = unsafe { &mut *(data as *mut Policy) };
    match policy.decide(code, text(a), text(b)) {
        Ok(()) => ffi::SQLITE_OK,
        Err(why) => {
            policy.refused.get_or_insert(why);
            ffi::SQLITE_DENY
        }
    }
}

extern "C" fn progress(data: *mut c_void) -> c_int {
    // SAFETY: as in `authorize`.
    let policy = unsafe { &mut *(data as *mut Policy) };
    if Instant::now() > policy.deadline {
        policy.timed_out = true;
        1
    } else {
        0
    }
}

/// The policy in force on a connection until this is dropped.
pub struct Enforced<'c> {
    conn: &'c Connection,
    policy: *mut Policy,
    length: i32,
}

impl<'c> Enforced<'c> {
    pub fn install(conn: &'c Connection, policy: Box<Policy>) -> Result<Enforced<'c>, StoreError> {
        let policy = Box::into_raw(policy);
        let length = conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES).unwrap_or(1_000_000_000);
        // SAFETY: the handle is valid for `conn`'s life, which outlives
        // this guard; both hooks are cleared in `drop` before the policy
        // is freed.
        unsafe {
            ffi::sqlite3_set_authorizer(conn.handle(), Some(authorize), policy as *mut c_void);
            ffi::sqlite3_progress_handler(conn.handle(), 10_000, Some(progress), policy as *mut c_void);
        }
        Ok(Enforced { conn, policy, length })
    }

    /// The guard's reading of a failed statement: the refusal or the time
    /// limit when one caused it, else SQLite's own message.
    pub fn error(&self, e: rusqlite::Error) -> StoreError {
        // SAFETY: the policy lives until drop; no hook runs now.
        let policy = unsafe { &*self.policy };
        if let Some(why) = &policy.refused {
            return StoreError::Invalid(why.clone());
        }
        if policy.timed_out {
            return StoreError::Invalid(format!(
                "SQL error: the statement ran longer than {} s and was stopped.",
                MAX_RUN.as_secs()
            ));
        }
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::TooBig) {
            return StoreError::Invalid(format!(
                "SQL error: a value would exceed {} MiB, the limit here.",
                MAX_VALUE_BYTES >> 20
            ));
        }
        StoreError::Invalid(format!("SQL error: {e}"))
    }
}

impl Drop for Enforced<'_> {
    fn drop(&mut self) {
        // SAFETY: clearing the hooks; then nothing refers to the policy.
        unsafe {
            ffi::sqlite3_set_authorizer(self.conn.handle(), None, std::ptr::null_mut());
            ffi::sqlite3_progress_handler(self.conn.handle(), 0, None, std::ptr::null_mut());
            drop(Box::from_raw(self.policy));
        }
        let _ = self.conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, self.length);
    }
}
