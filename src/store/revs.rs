//! Change counters for the tables a turn derives text from (the agent's
//! files, its inbox and its side loops), so the executor rebuilds the system prompt's
//! skills and bundles sections or counts unread mail only when something
//! changed. SQLite says what changed: an update hook on this connection
//! counts row changes per table, and `PRAGMA data_version` says when
//! another connection (a sibling of this process, or any other writer)
//! committed, which bumps every counter. The hook is installed on first
//! use, so a store nobody asks never pays for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::Connection;

/// The tables counted.
#[derive(Debug, Clone, Copy)]
pub enum Table {
    Files,
    Inbox,
    /// adf's side loops (`adfrs_loops`).
    Loops,
    /// Mail between loops (`adfrs_loop_mail`).
    LoopMail,
}

#[derive(Default)]
pub(crate) struct Revs {
    counters: Option<Arc<[AtomicU64; 4]>>,
    /// Foreign commits seen (data_version changes), added to every counter.
    foreign: u64,
    data_version: i64,
}

impl Revs {
    /// The revision of `table`: equal numbers mean no row of it changed
    /// in between (through this connection or any other).
    pub(crate) fn rev(&mut self, conn: &mut Connection, dv: rusqlite::Result<i64>, table: Table) -> u64 {
        if self.counters.is_none() {
            let c: Arc<[AtomicU64; 4]> =
                Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
            let hook = c.clone();
            let installed = conn.update_hook(Some(move |_action, _db: &str, table: &str, _rowid| {
                let i = match table {
                    "adf_files" => 0,
                    "adf_inbox" => 1,
                    "adfrs_loops" => 2,
                    "adfrs_loop_mail" => 3,
                    _ => return,
                };
                hook[i].fetch_add(1, Ordering::Relaxed);
            }));
            if installed.is_ok() {
                self.counters = Some(c);
            }
        }
        let Some(counters) = &self.counters else {
            // No hook: every answer is a change, never "unchanged".
            self.foreign += 1;
            return self.foreign << 32;
        };
        match dv {
            Ok(v) if v != self.data_version => {
                self.data_version = v;
                self.foreign += 1;
            }
            Ok(_) => {}
            // Unknown: count it as a change, never as "unchanged".
            Err(_) => self.foreign += 1,
        }
        counters[table as usize].load(Ordering::Relaxed) + (self.foreign << 32)
    }
}

/// `PRAGMA data_version` is a read transaction of its own (file locks
/// taken and given back). The reads a turn step makes before its model
/// call (the config, the side loops, the files, the inbox, the loop mail)
/// each ask whether another connection committed; while the executor
/// holds a view (`Store::hold_view`), the first answer serves them all,
/// and a commit by another connection is seen at the next step.
#[derive(Default)]
pub(crate) struct View {
    held: std::cell::Cell<bool>,
    answer: std::cell::Cell<Option<i64>>,
}

impl View {
    pub(crate) fn hold(&self, on: bool) {
        self.held.set(on);
        self.answer.set(None);
    }

    /// The connection's data version: asked of SQLite, or the answer
    /// already given in the view held.
    pub(crate) fn data_version(&self, conn: &Connection) -> rusqlite::Result<i64> {
        if self.held.get()
            && let Some(v) = self.answer.get()
        {
            return Ok(v);
        }
        let v = conn.prepare_cached("PRAGMA data_version").and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))?;
        if self.held.get() {
            self.answer.set(Some(v));
        }
        Ok(v)
    }
}

impl Revs {
    /// The connection closed (a parked store): its hook went with it. The
    /// next connection starts new counters, so every revision moves on.
    pub(crate) fn park(&mut self) {
        self.counters = None;
        self.data_version = 0;
        self.foreign += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_own_and_foreign_changes_per_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let mut a = Connection::open(&path).unwrap();
        a.execute_batch(
            "PRAGMA journal_mode=WAL; CREATE TABLE adf_files(path TEXT PRIMARY KEY, x); CREATE TABLE adf_inbox(id, s);
             CREATE TABLE other(x);",
        )
        .unwrap();
        let mut revs = Revs::default();
        let view = View::default();
        let rev = |revs: &mut Revs, c: &mut Connection, t: Table| {
            let dv = view.data_version(c);
            revs.rev(c, dv, t)
        };
        let f0 = rev(&mut revs, &mut a, Table::Files);
        let i0 = rev(&mut revs, &mut a, Table::Inbox);
        assert_eq!(rev(&mut revs, &mut a, Table::Files), f0, "nothing changed");
        a.execute("INSERT INTO other VALUES (1)", []).unwrap();
        assert_eq!(rev(&mut revs, &mut a, Table::Files), f0, "another table");
        a.execute("INSERT INTO adf_files VALUES ('a', 1)", []).unwrap();
        let f1 = rev(&mut revs, &mut a, Table::Files);
        assert_ne!(f1, f0);
        assert_eq!(rev(&mut revs, &mut a, Table::Inbox), i0, "files only");
        a.execute("UPDATE adf_inbox SET s = 1", []).unwrap();
        assert_eq!(rev(&mut revs, &mut a, Table::Inbox), i0, "no row changed");
        a.execute("INSERT INTO adf_inbox VALUES (1, 'unread')", []).unwrap();
        assert_ne!(rev(&mut revs, &mut a, Table::Inbox), i0);
        // Another connection's commit is seen through data_version.
        let b = Connection::open(&path).unwrap();
        b.execute("DELETE FROM adf_files", []).unwrap();
        assert_ne!(rev(&mut revs, &mut a, Table::Files), f1);
    }

    #[test]
    fn a_held_view_asks_once_and_sees_another_commit_after_it_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let a = Connection::open(&path).unwrap();
        a.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE adf_files(path TEXT PRIMARY KEY, x);").unwrap();
        let b = Connection::open(&path).unwrap();
        let view = View::default();
        let v0 = view.data_version(&a).unwrap();
        // Not held: every answer is SQLite's own.
        b.execute("INSERT INTO adf_files VALUES ('a', 1)", []).unwrap();
        let v1 = view.data_version(&a).unwrap();
        assert_ne!(v1, v0, "another connection's commit is seen at once");
        // Held: the first answer serves every read after it.
        view.hold(true);
        assert_eq!(view.data_version(&a).unwrap(), v1);
        b.execute("INSERT INTO adf_files VALUES ('b', 1)", []).unwrap();
        assert_eq!(view.data_version(&a).unwrap(), v1, "the held answer");
        // Let go: the commit made meanwhile is seen.
        view.hold(false);
        let v2 = view.data_version(&a).unwrap();
        assert_ne!(v2, v1);
        // A new hold asks again.
        b.execute("INSERT INTO adf_files VALUES ('c', 1)", []).unwrap();
        view.hold(true);
        assert_ne!(view.data_version(&a).unwrap(), v2, "a new hold starts with a fresh answer");
    }
}
