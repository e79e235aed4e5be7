//! Printing: aligned text tables for people, JSON for scripts, and the
//! path-prefixed error lines.

use std::io::Write;
use std::path::Path;

use anyhow::anyhow;
use serde::Serialize;

use crate::store::{Store, StoreError};

/// Where a command prints, and how.
pub struct Out {
    pub json: bool,
}

impl Out {
    pub fn new(json: bool) -> Self {
        Out { json }
    }

    /// Print a value as pretty JSON.
    pub fn json<T: Serialize + ?Sized>(&self, v: &T) -> anyhow::Result<()> {
        let mut s = serde_json::to_string_pretty(v)?;
        s.push('\n');
        std::io::stdout().lock().write_all(s.as_bytes())?;
        Ok(())
    }

    /// Print a line of text.
    pub fn line(&self, s: impl AsRef<str>) -> anyhow::Result<()> {
        let mut o = std::io::stdout().lock();
        o.write_all(s.as_ref().as_bytes())?;
        o.write_all(b"\n")?;
        Ok(())
    }

    /// Print rows as columns aligned on the widest cell (last column free).
    pub fn table(&self, header: &[&str], rows: &[Vec<String>]) -> anyhow::Result<()> {
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for r in rows {
            for (i, c) in r.iter().enumerate() {
                if i < widths.len() {
                    widths[i] = widths[i].max(c.chars().count());
                }
            }
        }
        let fmt = |cells: Vec<&str>| {
            let mut line = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    line.push_str(c);
                } else {
                    line.push_str(c);
                    line.push_str(&" ".repeat(widths[i] - c.chars().count() + 2));
                }
            }
            line.trim_end().to_string()
        };
        let mut o = std::io::stdout().lock();
        writeln!(o, "{}", fmt(header.to_vec()))?;
        for r in rows {
            writeln!(o, "{}", fmt(r.iter().map(String::as_str).collect()))?;
        }
        Ok(())
    }
}

/// Name the file in an error that does not already.
pub fn at(path: &Path, e: StoreError) -> anyhow::Error {
    let msg = e.to_string();
    let p = path.display().to_string();
    if msg.starts_with(&p) { anyhow!(msg) } else { anyhow!("{p}: {msg}") }
}

/// Open an agent file for writing.
pub fn open(path: &Path) -> anyhow::Result<Store> {
    Store::open(path).map_err(|e| at(path, e))
}

/// Open for reading, beside a writer if one holds the file.
pub fn open_for_read(path: &Path) -> anyhow::Result<Store> {
    // Never the writer's open: reading takes no lock, removes no marker,
    // migrates and repairs nothing, and leaves no sidecar behind.
    Store::open_read_only(path).map_err(|e| at(path, e))
}

/// Close the file. What the command did is committed by now, so a failure
/// here (a full disk refusing the clean-close marker) is a warning that
/// says so, not a failure of the command.
pub fn close(store: Store) -> anyhow::Result<()> {
    let path = store.path().to_path_buf();
    if let Err(e) = store.close() {
        eprintln!(
            "adf: warning: {}: the change was saved, but the file could not be closed cleanly ({}); the next open checks it",
            path.display(),
            match &e {
                StoreError::DiskFull { .. } => "no space left on the device".to_string(),
                other => other.to_string(),
            }
        );
    }
    Ok(())
}

/// Human-readable byte size.
pub fn size(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[u]) }
}
