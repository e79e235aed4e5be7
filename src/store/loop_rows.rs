//! `adf_loop`: the conversation stream. Rows are appended with a lifetime
//! `seq` that is never reused or renumbered; everything reads them in the
//! order `COALESCE(ord, seq), seq` (format.md §3.3).

use rusqlite::params;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{Ctx, Result, opt_text_lossy, text_lossy};
use super::{Store, now_ms};

/// The ordering key of the loop, used everywhere rows are read.
pub const ORDER: &str = "COALESCE(ord, seq), seq";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopRow {
    pub seq: i64,
    pub role: String,
    pub content: Value,
    pub model: Option<String>,
    /// Usage JSON; legacy files may hold a bare integer or non-JSON text.
    pub tokens: Option<Value>,
    pub created_at: i64,
    pub ord: Option<i64>,
}

const INSERT: &str =
    "INSERT INTO adf_loop(role, content_json, model, tokens, created_at, ord) VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

/// A row to append.
#[derive(Debug, Clone)]
pub struct NewLoopRow<'a> {
    pub role: &'a str,
    pub content: &'a Value,
    pub model: Option<&'a str>,
    pub tokens: Option<&'a Value>,
    pub ord: Option<i64>,
}

impl NewLoopRow<'_> {
    /// The row as stored under `seq`.
    pub fn stored(&self, seq: i64, created_at: i64) -> LoopRow {
        LoopRow {
            seq,
            role: self.role.to_string(),
            content: self.content.clone(),
            model: self.model.map(str::to_string),
            tokens: self.tokens.cloned(),
            created_at,
            ord: self.ord,
        }
    }
}

impl Store {
    /// The history size of `main` (`None`) or a side loop (see
    /// `HistorySize`). Only a user row that may be a context row is parsed.
    pub fn history_size(&self, side: Option<&str>) -> Result<HistorySize> {
        let (table, filter) = match side {
            Some(_) => ("adfrs_loop_rows", "WHERE loop = ?1"),
            None => ("adf_loop", "WHERE ?1 IS NULL"),
        };
        let sql = format!(
            "SELECT role, length(CAST(content_json AS BLOB)),
                    CASE WHEN role = 'user' AND instr(content_json, '[Context: ') > 0 THEN content_json END
             FROM {table} {filter}"
        );
        let mut stmt = match self.conn().prepare_cached(&sql) {
            Ok(s) => s,
            Err(e) if super::error::no_such_table(&e) => return Ok(HistorySize::default()),
            Err(e) => return Err(e).at(self.path()),
        };
        let mut size = HistorySize::default();
        let mut rows = stmt.query([side]).at(self.path())?;
        while let Some(r) = rows.next().at(self.path())? {
            size.rows += 1;
            let len: i64 = r.get(1).at(self.path())?;
            if let Some(text) = r.get::<_, Option<String>>(2).at(self.path())? {
                let content = serde_json::from_str(&text).unwrap_or(Value::String(text));
                if context_text_of("user", &content).is_some() {
                    continue;
                }
            }
            size.chars += len.max(0) as usize;
        }
        drop(rows);
        let sql = format!(
            "SELECT tokens FROM {table} {filter} AND role = 'assistant' AND tokens IS NOT NULL
             ORDER BY COALESCE(ord, seq) DESC, seq DESC"
        );
        let mut stmt = self.conn().prepare_cached(&sql).at(self.path())?;
        let mut rows = stmt.query([side]).at(self.path())?;
        while let Some(r) = rows.next().at(self.path())? {
            let Ok(Some(t)) = r.get::<_, Option<String>>(0) else { continue };
            let Ok(t) = serde_json::from_str::<Value>(&t) else { continue };
            if let Some(input) = t.get("input").and_then(Value::as_u64) {
                size.last_input = Some(input + t.get("cache_read").and_then(Value::as_u64).unwrap_or(0));
                break;
            }
        }
        Ok(size)
    }

    /// Append one row; returns its `seq`.
    pub fn loop_append(&mut self, row: &NewLoopRow<'_>) -> Result<i64> {
        self.loop_append_at(row, now_ms())
    }

    /// Append one row and return it as stored.
    pub fn loop_append_row(&mut self, row: &NewLoopRow<'_>) -> Result<LoopRow> {
        self.loop_append_row_with(row, None)
    }

    /// Append one row and, in the same transaction, set a runtime meta key
    /// (the turn checkpoint moves with the row it describes: one commit,
    /// and never one without the other).
    pub fn loop_append_row_with(&mut self, row: &NewLoopRow<'_>, meta: Option<(&str, &str)>) -> Result<LoopRow> {
        let created_at = now_ms();
        let seq = match meta {
            None => self.loop_append_at(row, created_at)?,
            Some((key, value)) => {
                let path = self.path().to_path_buf();
                let content = serde_json::to_string(row.content).unwrap_or_else(|_| "[]".into());
                let tokens = row.tokens.map(|t| t.to_string());
                self.write(|tx| {
                    tx.prepare_cached(INSERT)
                        .and_then(|mut st| {
                            st.execute(params![row.role, content, row.model, tokens, created_at, row.ord])
                        })
                        .at(&path)?;
                    let seq = tx.last_insert_rowid();
                    Store::meta_put_system(tx, key, value, super::meta::MetaProtection::Readonly).at(&path)?;
                    Ok(seq)
                })?
            }
        };
        Ok(row.stored(seq, created_at))
    }

    fn loop_append_at(&mut self, row: &NewLoopRow<'_>, created_at: i64) -> Result<i64> {
        if !self.pending_spend.is_empty() {
            // Deferred spend goes in with this row.
            let path = self.path().to_path_buf();
            let content = serde_json::to_string(row.content).unwrap_or_else(|_| "[]".into());
            let tokens = row.tokens.map(|t| t.to_string());
            return self.write(|tx| {
                tx.prepare_cached(INSERT)
                    .and_then(|mut st| st.execute(params![row.role, content, row.model, tokens, created_at, row.ord]))
                    .at(&path)?;
                Ok(tx.last_insert_rowid())
            });
        }
        self.touch()?;
        let content = serde_json::to_string(row.content).unwrap_or_else(|_| "[]".into());
        let tokens = row.tokens.map(|t| t.to_string());
        let mut stmt = self.conn().prepare_cached(INSERT).at(self.path())?;
        stmt.execute(params![row.role, content, row.model, tokens, created_at, row.ord]).at(self.path())?;
        Ok(self.conn().last_insert_rowid())
    }

    /// Rows in loop order.
    pub fn loop_rows(&self, limit: Option<usize>) -> Result<Vec<LoopRow>> {
        let sql = format!(
            "SELECT seq, role, content_json, model, tokens, created_at, ord FROM adf_loop ORDER BY {ORDER} LIMIT ?1"
        );
        self.loop_query(&sql, [limit.map(|l| l as i64).unwrap_or(-1)])
    }

    /// How many rows the loop holds.
    pub fn loop_count(&self) -> Result<i64> {
        self.conn().query_row("SELECT COUNT(*) FROM adf_loop", [], |r| r.get(0)).at(self.path())
    }

    /// At most `limit` rows in loop order from `offset`: a page read as a
    /// page, not the whole loop.
    pub fn loop_page(&self, offset: i64, limit: i64) -> Result<Vec<LoopRow>> {
        let sql = format!(
            "SELECT seq, role, content_json, model, tokens, created_at, ord FROM adf_loop ORDER BY {ORDER} LIMIT ?1 OFFSET ?2"
        );
        self.loop_query(&sql, params![limit, offset])
    }

    /// At most `limit` rows appended after `seq`, in order.
    pub fn loop_rows_after_page(&self, seq: i64, limit: i64) -> Result<Vec<LoopRow>> {
        let sql = format!(
            "SELECT seq, role, content_json, model, tokens, created_at, ord FROM adf_loop WHERE seq > ?1 ORDER BY {ORDER} LIMIT ?2"
        );
        self.loop_query(&sql, params![seq, limit])
    }

    /// Rows appended after `seq` (a viewer following the loop), in order.
    pub fn loop_rows_after(&self, seq: i64) -> Result<Vec<LoopRow>> {
        let sql = format!(
            "SELECT seq, role, content_json, model, tokens, created_at, ord FROM adf_loop WHERE seq > ?1 ORDER BY {ORDER}"
        );
        self.loop_query(&sql, [seq])
    }

    fn loop_query(&self, sql: &str, args: impl rusqlite::Params) -> Result<Vec<LoopRow>> {
        let mut stmt = self.conn().prepare_cached(sql).at(self.path())?;
        stmt.query_map(args, row_from).at(self.path())?.collect::<rusqlite::Result<Vec<_>>>().at(self.path())
    }
}

/// The text of a `[Context: …]` row (the system prompt, dynamic
/// instructions, `loop_inject`: audit only, never replayed as history),
/// from its role and content.
pub fn context_text_of<'a>(role: &str, content: &'a Value) -> Option<&'a str> {
    if role != "user" {
        return None;
    }
    match content {
        Value::String(s) => Some(s.as_str()),
        Value::Array(a) => a.first().and_then(|b| b["text"].as_str()),
        _ => None,
    }
    .filter(|t| t.starts_with("[Context: "))
}

/// What the context gauge needs of a loop's history, read without taking
/// the rows whole: their count, the characters of all but `[Context: …]`
/// rows, and the input tokens the last call reported.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistorySize {
    pub rows: usize,
    pub chars: usize,
    pub last_input: Option<u64>,
}

/// A loop row from `seq, role, content_json, model, tokens, created_at, ord`.
pub(crate) fn row_from(r: &rusqlite::Row<'_>) -> rusqlite::Result<LoopRow> {
    let content = text_lossy(r, 2)?;
    let tokens: Option<rusqlite::types::Value> = r.get(4)?;
    Ok(LoopRow {
        seq: r.get(0)?,
        role: text_lossy(r, 1)?,
        content: serde_json::from_str(&content).unwrap_or(Value::String(content)),
        model: opt_text_lossy(r, 3)?,
        tokens: tokens.map(|t| match t {
            rusqlite::types::Value::Integer(i) => Value::from(i),
            rusqlite::types::Value::Text(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
            rusqlite::types::Value::Blob(b) => Value::String(String::from_utf8_lossy(&b).into_owned()),
            rusqlite::types::Value::Real(f) => Value::from(f),
            _ => Value::Null,
        }),
        created_at: r.get(5)?,
        ord: r.get(6)?,
    })
}

impl Store {
    /// Snapshot loop rows `start..=end` (by seq) into the audit archive as
    /// Brotli JSON addressed by `start_seq`/`end_seq`; returns the audit id.
    pub fn audit_loop(&mut self, start: i64, end: i64) -> Result<i64> {
        let rows: Vec<LoopRow> = self.loop_rows(None)?.into_iter().filter(|r| r.seq >= start && r.seq <= end).collect();
        let value = serde_json::to_value(&rows).unwrap_or(Value::Null);
        let file = self.path().to_path_buf();
        self.write(|tx| {
            super::audit::append(tx, "loop", super::audit::Address::Seqs { start, end }, rows.len(), &value).at(&file)
        })
    }
}

impl Store {
    /// Remove rows (archived first to `adf_audit` when `archive`) and
    /// optionally insert one row, all in one transaction: compaction and
    /// loop clears either happen whole or not at all. Returns the seq of
    /// the inserted row.
    pub fn loop_replace(
        &mut self,
        remove: &[LoopRow],
        archive: bool,
        insert: Option<&NewLoopRow<'_>>,
    ) -> Result<Option<i64>> {
        // Serialised once, straight from the rows the caller holds.
        let archived = (archive && !remove.is_empty()).then(|| serde_json::to_vec(remove).unwrap_or_default());
        let file = self.path().to_path_buf();
        self.write(|tx| {
            if let (Some(json), Some(start), Some(end)) =
                (&archived, remove.iter().map(|r| r.seq).min(), remove.iter().map(|r| r.seq).max())
            {
                super::audit::append_json(tx, "loop", super::audit::Address::Seqs { start, end }, remove.len(), json)
                    .at(&file)?;
            }
            let mut del = tx.prepare_cached("DELETE FROM adf_loop WHERE seq = ?1").at(&file)?;
            for r in remove {
                del.execute([r.seq]).at(&file)?;
            }
            let Some(row) = insert else { return Ok(None) };
            tx.execute(
                "INSERT INTO adf_loop(role, content_json, model, tokens, created_at, ord) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    row.role,
                    serde_json::to_string(row.content).unwrap_or_else(|_| "[]".into()),
                    row.model,
                    row.tokens.map(|t| t.to_string()),
                    now_ms(),
                    row.ord
                ],
            )
            .at(&file)?;
            Ok(Some(tx.last_insert_rowid()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The gauge's reading without the rows matches one that reads them.
    #[test]
    fn history_size_matches_reading_every_row() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::create(dir.path().join("a.adf"), &crate::store::NewAgent::default()).unwrap();
        s.loop_create("side", &crate::store::loops::LoopSpec::default()).unwrap();
        let rows = [
            ("user", json!([{"type": "text", "text": "hello é ✓"}]), None),
            ("user", json!([{"type": "text", "text": "[Context: the time is 09:00]"}]), None),
            ("user", json!([{"type": "text", "text": "quoting [Context: not at the start]"}]), None),
            ("assistant", json!([{"type": "text", "text": "hi"}]), Some(json!({"input": 40, "cache_read": 2}))),
            ("assistant", json!([{"type": "text", "text": "later"}]), Some(json!(7))),
        ];
        for (role, content, tokens) in &rows {
            let row = NewLoopRow { role, content, model: None, tokens: tokens.as_ref(), ord: None };
            s.loop_append(&row).unwrap();
            s.side_append_row("side", &row).unwrap();
        }
        let read = |rows: Vec<LoopRow>| {
            let chars = rows
                .iter()
                .filter(|r| context_text_of(&r.role, &r.content).is_none())
                .map(|r| r.content.to_string().len())
                .sum::<usize>();
            (rows.len(), chars)
        };
        let main = s.history_size(None).unwrap();
        let side = s.history_size(Some("side")).unwrap();
        let base = s.loop_rows(None).unwrap().len() - rows.len();
        assert_eq!((side.rows, side.chars), read(s.side_rows("side").unwrap()));
        assert_eq!((main.rows - base, main.chars), (rows.len(), read(s.loop_rows(None).unwrap()).1));
        assert_eq!((main.last_input, side.last_input), (Some(42), Some(42)), "the newest row that says its input");
        assert_eq!(s.history_size(Some("nope")).unwrap(), HistorySize::default());
    }
}
