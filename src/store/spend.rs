//! What an agent and each of its loops spent, per UTC day (issue 19), so
//! budgets survive restarts: `adfrs_spend`, made by the first call that
//! spends, one row per (scope, day) with dollars, tokens and calls. Scopes
//! are `agent` and `loop:<name>`.

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

impl Store {
    /// Add one call's spend to every scope, in one commit.
    pub fn spend_add(&mut self, scopes: &[&str], usd: f64, tokens: u64) -> Result<()> {
        let path = self.path().to_path_buf();
        let day = today();
        self.write(|tx| {
            tx.execute(DDL, []).at(&path)?;
            let mut up = tx
                .prepare_cached(
                    "INSERT INTO adfrs_spend(scope, day, usd, tokens, calls) VALUES (?1, ?2, ?3, ?4, 1)
                     ON CONFLICT(scope, day) DO UPDATE SET usd = usd + excluded.usd,
                       tokens = tokens + excluded.tokens, calls = calls + 1",
                )
                .at(&path)?;
            for s in scopes {
                up.execute(params![s, day, usd, tokens as i64]).at(&path)?;
            }
            Ok(())
        })
    }

    /// What `scope` spent today and in total (nothing when nothing was).
    pub fn spent(&self, scope: &str) -> Result<Spent> {
        let sql = "SELECT COALESCE(SUM(CASE WHEN day = ?2 THEN usd END), 0), COALESCE(SUM(CASE WHEN day = ?2 THEN tokens END), 0),
                          COALESCE(SUM(usd), 0), COALESCE(SUM(tokens), 0)
                   FROM adfrs_spend WHERE scope = ?1";
        match self.conn().query_row(sql, params![scope, today()], |r| {
            Ok(Spent {
                usd_day: r.get(0)?,
                tokens_day: r.get::<_, i64>(1)?.max(0) as u64,
                usd_total: r.get(2)?,
                tokens_total: r.get::<_, i64>(3)?.max(0) as u64,
            })
        }) {
            Ok(s) => Ok(s),
            Err(rusqlite::Error::SqliteFailure(_, Some(m))) if m.starts_with("no such table") => Ok(Spent::default()),
            Err(e) => Err(e).at(self.path()),
        }
    }
}
