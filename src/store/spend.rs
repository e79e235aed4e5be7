//! What an agent and each of its loops spent, per UTC day (issue 19), so
//! budgets survive restarts: `adfrs_spend`, one row per (scope, day) with
//! dollars, tokens and calls. Scopes are `agent` and `loop:<name>`.
//!
//! A file adf makes has the table from the start, so its first spend
//! changes no schema: a schema change expires every prepared statement of
//! every connection to the file, and the agent's first turns would prepare
//! theirs twice. A file made elsewhere (the reference's) gets it with its
//! first spend, once.

use rusqlite::params;
use serde::{Deserialize, Serialize};

use super::Store;
use super::error::{Ctx, Result};

const DDL: &str = "CREATE TABLE IF NOT EXISTS adfrs_spend (
  scope TEXT NOT NULL,
  day TEXT NOT NULL,
  usd REAL NOT NULL DEFAULT 0,
  tokens INTEGER NOT NULL DEFAULT 0,
  calls INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (scope, day)
)";

/// Spent today and in total by one scope.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    pub usd_day: f64,
    pub tokens_day: u64,
    pub usd_total: f64,
    pub tokens_total: u64,
}

/// Today (UTC) as the day key.
pub fn today() -> String {
    chrono::Utc::now().format("%Y-%m-%d").to_string()
}

/// Spend waiting for the store's next write: (scope, day, usd, tokens).
pub(crate) type Pending = (String, String, f64, u64);

const UPSERT: &str = "INSERT INTO adfrs_spend(scope, day, usd, tokens, calls) VALUES (?1, ?2, ?3, ?4, 1)
         ON CONFLICT(scope, day) DO UPDATE SET usd = usd + excluded.usd,
           tokens = tokens + excluded.tokens, calls = calls + 1";

/// Make the table in a new file (inside the caller's transaction).
pub(crate) fn create_table(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    conn.execute_batch(DDL)
}

/// Write deferred spend inside the caller's transaction.
pub(crate) fn apply(tx: &rusqlite::Connection, pending: &[Pending]) -> rusqlite::Result<()> {
    if pending.is_empty() {
        return Ok(());
    }
    let mut up = match tx.prepare_cached(UPSERT) {
        Ok(st) => st,
        Err(e) if super::error::no_such_table(&e) => {
            create_table(tx)?;
            tx.prepare_cached(UPSERT)?
        }
        Err(e) => return Err(e),
    };
    for (scope, day, usd, tokens) in pending {
        up.execute(params![scope, day, usd, *tokens as i64])?;
    }
    Ok(())
}

impl Store {
    /// Add one call's spend to every scope, committed now.
    pub fn spend_add(&mut self, scopes: &[&str], usd: f64, tokens: u64) -> Result<()> {
        self.spend_defer(scopes, usd, tokens);
        self.flush_spend()
    }

    /// Add one call's spend to every scope with the next write (the turn's
    /// next row): no commit of its own. `spent` counts it at once.
    pub fn spend_defer(&mut self, scopes: &[&str], usd: f64, tokens: u64) {
        let day = today();
        let mut memo = self.spent_memo.lock().unwrap_or_else(|p| p.into_inner());
        for s in scopes {
            self.pending_spend.push((s.to_string(), day.clone(), usd, tokens));
            match memo.get_mut(*s) {
                Some((d, m)) if *d == day => {
                    m.usd_day += usd;
                    m.tokens_day += tokens;
                    m.usd_total += usd;
                    m.tokens_total += tokens;
                }
                _ => {
                    memo.remove(*s);
                }
            }
        }
    }

    /// Commit deferred spend now (before a park or a close).
    pub(crate) fn flush_spend(&mut self) -> Result<()> {
        if self.pending_spend.is_empty() || self.read_only {
            return Ok(());
        }
        self.write(|_| Ok(()))
    }

    /// What `scope` spent today and in total (nothing when nothing was).
    pub fn spent(&self, scope: &str) -> Result<Spent> {
        let day = today();
        if !self.read_only
            && let Some((d, s)) = self.spent_memo.lock().unwrap_or_else(|p| p.into_inner()).get(scope)
            && *d == day
        {
            return Ok(*s);
        }
        let s = self.spent_read(scope, &day)?;
        if !self.read_only {
            self.spent_memo.lock().unwrap_or_else(|p| p.into_inner()).insert(scope.to_string(), (day, s));
        }
        Ok(s)
    }

    fn spent_read(&self, scope: &str, day: &str) -> Result<Spent> {
        let sql = "SELECT COALESCE(SUM(CASE WHEN day = ?2 THEN usd END), 0), COALESCE(SUM(CASE WHEN day = ?2 THEN tokens END), 0),
                          COALESCE(SUM(usd), 0), COALESCE(SUM(tokens), 0)
                   FROM adfrs_spend WHERE scope = ?1";
        let stored = self.conn().prepare_cached(sql).and_then(|mut st| {
            st.query_row(params![scope, day], |r| {
                Ok(Spent {
                    usd_day: r.get(0)?,
                    tokens_day: r.get::<_, i64>(1)?.max(0) as u64,
                    usd_total: r.get(2)?,
                    tokens_total: r.get::<_, i64>(3)?.max(0) as u64,
                })
            })
        });
        let mut s = match stored {
            Ok(s) => s,
            Err(e) if super::error::no_such_table(&e) => Spent::default(),
            Err(e) => return Err(e).at(self.path()),
        };
        for (_, d, usd, tokens) in self.pending_spend.iter().filter(|p| p.0 == scope) {
            if d == day {
                s.usd_day += usd;
                s.tokens_day += tokens;
            }
            s.usd_total += usd;
            s.tokens_total += tokens;
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewAgent;

    fn schema_version(s: &Store) -> i64 {
        s.conn().query_row("PRAGMA schema_version", [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn a_new_files_first_spend_changes_no_schema() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::create(dir.path().join("a.adf"), &NewAgent::default()).unwrap();
        let before = schema_version(&s);
        s.spend_add(&["agent", "loop:main"], 0.25, 1_000).unwrap();
        s.spend_add(&["agent"], 0.5, 10).unwrap();
        assert_eq!(schema_version(&s), before, "the table was there from the start");
        let spent = s.spent_read("agent", &today()).unwrap();
        assert_eq!((spent.usd_day, spent.tokens_day, spent.tokens_total), (0.75, 1_010, 1_010));
        s.close().unwrap();
    }

    #[test]
    fn a_file_without_the_table_gets_it_with_its_first_spend() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.adf");
        let (s, _) = Store::create(&path, &NewAgent::default()).unwrap();
        s.conn().execute_batch("DROP TABLE adfrs_spend").unwrap();
        s.close().unwrap();
        let mut s = Store::open(&path).unwrap();
        assert_eq!(s.spent("agent").unwrap(), Spent::default(), "no table reads as nothing spent");
        s.spend_add(&["agent"], 1.5, 7).unwrap();
        s.spend_add(&["agent"], 0.5, 3).unwrap();
        let spent = s.spent_read("agent", &today()).unwrap();
        assert_eq!((spent.usd_total, spent.tokens_total), (2.0, 10));
        s.close().unwrap();
    }
}
