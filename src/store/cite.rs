//! `[S<seq>]` citations (issue 18): a memory page cites the loop row a fact
//! came from, and the citation resolves for as long as the file lives —
//! from the live loop (main's or a side loop's), or, after compaction,
//! a clear or a deleted loop, from the audit archive that kept the row.

use rusqlite::params;
use serde::Serialize;
use serde_json::Value;

use super::Store;
use super::error::{Ctx, Result, StoreError};
use super::loop_rows::LoopRow;

/// Where a citation resolved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cited {
    pub seq: i64,
    /// `main` or the side loop's name.
    #[serde(rename = "loop")]
    pub loop_name: String,
    /// `live`, or `audit` with the archive row's id.
    pub found_in: String,
    pub audit_id: Option<i64>,
    pub row: LoopRow,
}

/// `S123`, `[S123]`, `s123` or `123` as a seq.
pub fn parse(citation: &str) -> std::result::Result<i64, String> {
    let t = citation.trim().trim_start_matches('[').trim_end_matches(']');
    let digits = t.strip_prefix('S').or_else(|| t.strip_prefix('s')).unwrap_or(t);
    digits
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{citation:?} is not a citation: expected S<seq> such as S123"))
}

impl Store {
    /// Resolve a seq to its loop row (see the module note); `Missing` when
    /// no loop and no archive holds it.
    pub fn cite(&self, seq: i64) -> Result<Cited> {
        let live = |loop_name: &str, row: LoopRow| Cited {
            seq,
            loop_name: loop_name.to_string(),
            found_in: "live".into(),
            audit_id: None,
            row,
        };
        if let Some(row) = self.loop_rows_after_page(seq - 1, 1)?.into_iter().find(|r| r.seq == seq) {
            return Ok(live("main", row));
        }
        for d in self.loops_list()? {
            if let Some(row) = self.side_rows_after(&d.name, seq - 1)?.into_iter().find(|r| r.seq == seq) {
                return Ok(live(&d.name, row));
            }
        }
        let mut stmt = self
            .conn()
            .prepare_cached(
                "SELECT id, source, data FROM adf_audit
                 WHERE (source = 'loop' OR source LIKE 'loop:%') AND start_seq <= ?1 AND end_seq >= ?1
                 ORDER BY id DESC",
            )
            .at(self.path())?;
        let hits = stmt
            .query_map(params![seq], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, Vec<u8>>(2)?)))
            .at(self.path())?
            .collect::<rusqlite::Result<Vec<_>>>()
            .at(self.path())?;
        for (id, source, blob) in hits {
            let Ok(Value::Array(rows)) = super::audit::decode(&blob) else { continue };
            let Some(v) = rows.into_iter().find(|r| r["seq"].as_i64() == Some(seq)) else { continue };
            let Ok(row) = serde_json::from_value::<LoopRow>(v) else { continue };
            let loop_name = source.strip_prefix("loop:").unwrap_or("main").to_string();
            return Ok(Cited { seq, loop_name, found_in: "audit".into(), audit_id: Some(id), row });
        }
        Err(StoreError::Missing(format!(
            "S{seq} resolves to nothing: no loop holds it and no audit snapshot kept it (turn on loop audit so compaction keeps what it removes)"
        )))
    }
}
