//! Row counts of the `adf_*` tables and the agent's own `local_*` tables.

use serde::Serialize;

use super::Store;
use super::error::{Ctx, Result};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableInfo {
    pub name: String,
    /// `adf` (spec), `local` (the agent's), `adfrs` (adf's own) or `other`.
    pub kind: &'static str,
    pub rows: i64,
}

fn kind(name: &str) -> &'static str {
    if name.starts_with("adf_") {
        "adf"
    } else if name.starts_with("local_") {
        "local"
    } else if name.starts_with("adfrs_") {
        "adfrs"
    } else {
        "other"
    }
}

impl Store {
    /// Every user-visible table with its row count, sorted by name. Shadow
    /// tables of virtual tables (`local_x_chunks`…) are listed under their own
    /// names; SQLite's internal tables are left out.
    pub fn tables(&self) -> Result<Vec<TableInfo>> {
        let mut stmt = self
            .conn()
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
            .at(self.path())?;
        let names: Vec<String> =
            stmt.query_map([], |r| r.get(0)).at(self.path())?.collect::<rusqlite::Result<_>>().at(self.path())?;
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let q = format!("SELECT count(*) FROM \"{}\"", name.replace('"', "\"\""));
            // A virtual table whose module is missing cannot be counted.
            let rows = self.conn().query_row(&q, [], |r| r.get(0)).unwrap_or(-1);
            out.push(TableInfo { kind: kind(&name), name, rows });
        }
        Ok(out)
    }
}

impl Store {
    /// Unread messages in the inbox (for the dynamic inbox hint).
    pub fn inbox_unread(&self) -> Result<u64> {
        let mut stmt =
            self.conn().prepare_cached("SELECT count(*) FROM adf_inbox WHERE status = 'unread'").at(self.path())?;
        stmt.query_row([], |r| r.get::<_, i64>(0)).map(|n| n.max(0) as u64).at(self.path())
    }
}
