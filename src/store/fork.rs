//! `adf fork FILE --at S<seq> DST` (issue 19): a copy of an agent whose
//! loop ends at one of its rows, to retry from a point in the past. The
//! copy is a clone (fresh keys, DID and id, a `clone` attestation naming
//! the source) with its whole history, files and tables; the cut happens
//! in the same transaction that makes it, so a refused fork leaves no file.
//!
//! A cut must leave a loop a provider accepts: it may not fall between a
//! model's tool call and that call's results.

use std::path::Path;

use rusqlite::{OptionalExtension, Transaction};

use super::Store;
use super::derive::{CloneOptions, Derived, clone_with};
use super::error::{Ctx, Result, StoreError};
use crate::identity::install::Install;

/// `S123`, `s123` or `123` as a seq.
pub fn parse_seq(s: &str) -> std::result::Result<i64, String> {
    let t = s.trim();
    let digits = t.strip_prefix('S').or_else(|| t.strip_prefix('s')).unwrap_or(t);
    digits
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{s:?} is not a loop row: use S<seq>, as citations print it (S42)"))
}

/// Why the loop cannot end at `seq`, if it cannot.
fn check_cut(src: &Store, seq: i64) -> Result<()> {
    let rows = src.loop_rows(None)?;
    let Some(pos) = rows.iter().position(|r| r.seq == seq) else {
        let (first, last) = (rows.first().map(|r| r.seq), rows.last().map(|r| r.seq));
        return Err(StoreError::Invalid(match (first, last) {
            (Some(f), Some(l)) => format!("the main loop has no row S{seq} (its rows run S{f} to S{l})"),
            _ => "the main loop has no rows to fork at".into(),
        }));
    };
    let row = &rows[pos];
    let calls =
        row.role == "assistant" && row.content.as_array().is_some_and(|b| b.iter().any(|b| b["type"] == "tool_use"));
    if calls {
        let next =
            rows.get(pos + 1).map(|r| format!("S{} (its results)", r.seq)).unwrap_or_else(|| "a later row".into());
        return Err(StoreError::Invalid(format!(
            "S{seq} is the model's tool call: a loop may not end before its results; fork at {next} or before S{seq}"
        )));
    }
    Ok(())
}

/// Make `dst` from `src` with the main loop ending at `seq`.
pub fn fork_file(src: &Path, dst: &Path, seq: i64, inst: Option<&Install>) -> Result<Derived> {
    {
        let s = Store::open_read_only(src)?;
        check_cut(&s, seq)?;
    }
    let full = CloneOptions { history: true, files: true, tables: true };
    clone_with(src, dst, full, inst, |tx, tmp| cut(tx, tmp, seq))
}

fn cut(tx: &Transaction<'_>, tmp: &Path, seq: i64) -> Result<()> {
    let cut_at: Option<i64> =
        tx.query_row("SELECT created_at FROM adf_loop WHERE seq = ?1", [seq], |r| r.get(0)).optional().at(tmp)?;
    tx.execute("DELETE FROM adf_loop WHERE seq > ?1", [seq]).at(tmp)?;
    let side: bool = tx
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'adfrs_loop_rows'",
            [],
            |r| r.get(0),
        )
        .at(tmp)?;
    if side {
        tx.execute("DELETE FROM adfrs_loop_rows WHERE seq > ?1", [seq]).at(tmp)?;
    }
    // What the turns past the cut were doing is not the fork's: no turn in
    // flight, no approval waiting on a call that is no longer there.
    tx.execute("DELETE FROM adf_meta WHERE key = 'adf_runtime_turn_checkpoint'", []).at(tmp)?;
    if let Some(t) = cut_at {
        tx.execute("DELETE FROM adf_tasks WHERE status IN ('pending', 'pending_approval') AND created_at > ?1", [t])
            .at(tmp)?;
    }
    Ok(())
}
