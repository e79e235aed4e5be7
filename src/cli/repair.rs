//! `adf repair FILE [--check]`: check a damaged agent file and, unless only
//! checking, repair it, keeping the original under a name never reused.

use std::path::Path;

use super::output::{Out, at};
use crate::store::repair;

/// Returns the exit status: 0 sound or repaired whole, 1 damage found by
/// `--check` or rows that could not be recovered.
pub fn run(out: &Out, path: &Path, check_only: bool) -> anyhow::Result<u8> {
    if check_only {
        let problems = repair::check(path).map_err(|e| at(path, e))?;
        if out.json {
            out.json(&serde_json::json!({"path": path.display().to_string(), "ok": problems.is_empty(), "problems": problems}))?;
        } else if problems.is_empty() {
            out.line(format!("{}: integrity_check ok", path.display()))?;
        } else {
            out.line(format!("{}: integrity_check found {} problem(s):", path.display(), problems.len()))?;
            for p in &problems {
                out.line(format!("  {p}"))?;
            }
        }
        return Ok(if problems.is_empty() { 0 } else { 1 });
    }
    let report = repair::repair(path).map_err(|e| at(path, e))?;
    let whole = report.complete();
    if out.json {
        out.json(&serde_json::json!({
            "path": report.path.display().to_string(),
            "damaged": !report.problems.is_empty(),
            "problems": report.problems,
            "method": report.method,
            "original": report.original.as_ref().map(|p| p.display().to_string()),
            "tables": report.tables,
            "schema_lost": report.schema_lost,
            "complete": whole,
        }))?;
        return Ok(if whole { 0 } else { 1 });
    }
    if report.problems.is_empty() {
        out.line(format!("{}: integrity_check ok; nothing to repair, the file was not changed", path.display()))?;
        return Ok(0);
    }
    let first = report.problems.first().map(String::as_str).unwrap_or("");
    out.line(format!(
        "{}: {} problem(s) found (first: {first}); repaired by {}",
        path.display(),
        report.problems.len(),
        if report.method == "vacuum" { "VACUUM INTO" } else { "copying table by table" }
    ))?;
    if let Some(orig) = &report.original {
        out.line(format!("  the damaged original is kept at {}", orig.display()))?;
    }
    for t in &report.tables {
        let before = t.rows_before.map(|n| n.to_string()).unwrap_or_else(|| "?".into());
        let lost = match (&t.lost, t.rows_before) {
            (Some(l), _) => format!("  LOST: {l}"),
            (None, Some(b)) if b > t.rows_after => format!("  LOST: {} row(s)", b - t.rows_after),
            _ => String::new(),
        };
        if !lost.is_empty() || t.rows_before != Some(t.rows_after) {
            out.line(format!("  {:<24} {before} -> {} rows{lost}", t.name, t.rows_after))?;
        }
    }
    for s in &report.schema_lost {
        out.line(format!("  not recreated: {s}"))?;
    }
    out.line(if whole {
        "  every table came through whole".to_string()
    } else {
        "  some data could not be recovered (see above); the original keeps it all".to_string()
    })?;
    Ok(if whole { 0 } else { 1 })
}
