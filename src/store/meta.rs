//! `adf_meta`: key/value metadata with per-key protection (`none`,
//! `readonly`, `increment`), the spec-governed `adf_*` namespace, and the
//! atomic numeric add (format.md §6, tools.md `sys_*_meta`).

use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use super::Store;
use super::access::{Caller, Denial, DenialKind};
use super::error::{Ctx, Result, StoreError, text_lossy};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MetaProtection {
    None,
    Readonly,
    Increment,
}

impl MetaProtection {
    pub fn as_str(self) -> &'static str {
        match self {
            MetaProtection::None => "none",
            MetaProtection::Readonly => "readonly",
            MetaProtection::Increment => "increment",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(MetaProtection::None),
            "readonly" => Ok(MetaProtection::Readonly),
            "increment" => Ok(MetaProtection::Increment),
            other => Err(StoreError::Invalid(format!(
                "unknown meta protection \"{other}\" (expected none, readonly or increment)"
            ))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MetaEntry {
    pub key: String,
    pub value: String,
    pub protection: MetaProtection,
}

/// Whether a key belongs to the spec-governed namespace.
pub fn is_system_key(key: &str) -> bool {
    key.starts_with("adf_")
}

fn parse_num(s: &str) -> Option<f64> {
    let t = s.trim();
    if t.is_empty() {
        return None;
    }
    t.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// Render a number as an integer when integral, else rounded to 10 decimals.
pub fn render_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 9.0e15 {
        format!("{}", n as i64)
    } else {
        let s = format!("{n:.10}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn denial(key: &str, level: &str, description: String) -> StoreError {
    StoreError::Denied(Denial::new(DenialKind::MetaProtection, key, level, description))
}

impl Store {
    pub fn meta_list(&self) -> Result<Vec<MetaEntry>> {
        let mut stmt =
            self.conn().prepare("SELECT key, value, protection FROM adf_meta ORDER BY key").at(self.path())?;

        stmt.query_map([], |r| {
            let p: String = r.get(2)?;
            Ok(MetaEntry {
                key: text_lossy(r, 0)?,
                value: text_lossy(r, 1)?,
                protection: MetaProtection::parse(&p).unwrap_or(MetaProtection::None),
            })
        })
        .at(self.path())?
        .collect::<rusqlite::Result<Vec<_>>>()
        .at(self.path())
    }

    pub fn meta_get(&self, key: &str) -> Result<Option<MetaEntry>> {
        self.conn()
            .query_row("SELECT key, value, protection FROM adf_meta WHERE key = ?1", [key], |r| {
                let p: String = r.get(2)?;
                Ok(MetaEntry {
                    key: text_lossy(r, 0)?,
                    value: text_lossy(r, 1)?,
                    protection: MetaProtection::parse(&p).unwrap_or(MetaProtection::None),
                })
            })
            .optional()
            .at(self.path())
    }

    /// The effective protection for a caller: `adf_*` keys are readonly to
    /// everyone but the runtime, whatever the row says.
    fn effective(existing: Option<&MetaEntry>, key: &str) -> Option<MetaProtection> {
        if is_system_key(key) {
            return Some(MetaProtection::Readonly);
        }
        existing.map(|e| e.protection)
    }

    /// Set a value. `protection` applies on creation, or (owner and
    /// authorized code only) changes an existing key's protection.
    pub fn meta_set(
        &mut self,
        caller: Caller,
        key: &str,
        value: &str,
        protection: Option<MetaProtection>,
    ) -> Result<()> {
        if key.is_empty() {
            return Err(StoreError::Invalid("meta key must not be empty".into()));
        }
        let existing = self.meta_get(key)?;
        let bypass = caller.bypasses();
        let may_change_protection = caller == Caller::Owner || bypass;
        if is_system_key(key) && !bypass {
            return Err(denial(
                key,
                "readonly",
                format!("Cannot set \"{key}\": adf_* keys are managed by the runtime (readonly)."),
            ));
        }
        match Self::effective(existing.as_ref(), key) {
            Some(MetaProtection::Readonly) if !bypass => {
                let changes_protection =
                    caller == Caller::Owner && protection.is_some_and(|p| p != MetaProtection::Readonly);
                if !changes_protection {
                    return Err(denial(key, "readonly", format!("Cannot set \"{key}\": key is readonly.")));
                }
            }
            Some(MetaProtection::Increment) if !bypass => {
                let changes_protection =
                    caller == Caller::Owner && protection.is_some_and(|p| p != MetaProtection::Increment);
                if !changes_protection {
                    let cur = existing.as_ref().map(|e| e.value.as_str()).unwrap_or("");
                    let (Some(old), Some(new)) = (parse_num(cur), parse_num(value)) else {
                        return Err(StoreError::Invalid(format!(
                            "Cannot set \"{key}\": increment keys hold numbers (current \"{cur}\", new \"{value}\")."
                        )));
                    };
                    if new <= old {
                        return Err(denial(
                            key,
                            "increment",
                            format!("Cannot set \"{key}\": increment key must grow (current {cur}, new {value})."),
                        ));
                    }
                }
            }
            _ => {}
        }
        let new_protection = match (&existing, protection) {
            (None, p) => p.unwrap_or(MetaProtection::None),
            (Some(e), Some(p)) if may_change_protection => p,
            (Some(e), _) => e.protection,
        };
        if existing.is_none() && new_protection == MetaProtection::Increment && parse_num(value).is_none() {
            return Err(StoreError::Invalid(format!(
                "Cannot create increment key \"{key}\": value \"{value}\" is not a number."
            )));
        }
        let file = self.path().to_path_buf();
        self.write(|tx| {
            tx.execute(
                "INSERT INTO adf_meta(key, value, protection) VALUES (?1, ?2, ?3)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value, protection = excluded.protection",
                params![key, value, new_protection.as_str()],
            )
            .at(&file)?;
            if bypass && existing.as_ref().is_some_and(|e| e.protection != MetaProtection::None) {
                super::logs::bypass(tx, key, "write to protected meta key")?;
            }
            Ok(())
        })
    }

    /// Atomically add `delta` (creating the key at `delta`); returns the new
    /// value as stored.
    pub fn meta_add(
        &mut self,
        caller: Caller,
        key: &str,
        delta: f64,
        protection: Option<MetaProtection>,
    ) -> Result<String> {
        if !delta.is_finite() {
            return Err(StoreError::Invalid(format!("Cannot add to \"{key}\": delta is not a number.")));
        }
        if is_system_key(key) && !caller.bypasses() {
            return Err(denial(
                key,
                "readonly",
                format!("Cannot set \"{key}\": adf_* keys are managed by the runtime (readonly)."),
            ));
        }
        let file = self.path().to_path_buf();
        self.write(|tx| {
            let row: Option<(String, String)> = tx
                .query_row("SELECT value, protection FROM adf_meta WHERE key = ?1", [key], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
                .at(&file)?;
            let (next, prot) = match row {
                None => (delta, protection.unwrap_or(MetaProtection::None)),
                Some((value, prot)) => {
                    let prot = MetaProtection::parse(&prot).unwrap_or(MetaProtection::None);
                    if !caller.bypasses() {
                        if prot == MetaProtection::Readonly {
                            return Err(denial(key, "readonly", format!("Cannot set \"{key}\": key is readonly.")));
                        }
                        if prot == MetaProtection::Increment && delta <= 0.0 {
                            return Err(denial(
                                key,
                                "increment",
                                format!(
                                    "Cannot add {delta} to \"{key}\": increment key only grows (delta must be > 0)."
                                ),
                            ));
                        }
                    }
                    let cur = parse_num(&value).ok_or_else(|| {
                        StoreError::Invalid(format!(
                            "Cannot add to \"{key}\": current value \"{value}\" is not a number."
                        ))
                    })?;
                    (cur + delta, prot)
                }
            };
            let rendered = render_number(next);
            tx.execute(
                "INSERT INTO adf_meta(key, value, protection) VALUES (?1, ?2, ?3)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, rendered, prot.as_str()],
            )
            .at(&file)?;
            Ok(rendered)
        })
    }

    /// Delete a key. Returns false when it did not exist.
    pub fn meta_delete(&mut self, caller: Caller, key: &str) -> Result<bool> {
        let Some(existing) = self.meta_get(key)? else { return Ok(false) };
        let bypass = caller.bypasses();
        if let Some(p) = Self::effective(Some(&existing), key)
            && p != MetaProtection::None
            && !bypass
        {
            return Err(denial(key, p.as_str(), format!("Cannot delete \"{key}\": key is {}.", p.as_str())));
        }
        let file = self.path().to_path_buf();
        self.write(|tx| {
            tx.execute("DELETE FROM adf_meta WHERE key = ?1", [key]).at(&file)?;
            if bypass && existing.protection != MetaProtection::None {
                super::logs::bypass(tx, key, "delete of protected meta key")?;
            }
            Ok(())
        })?;
        Ok(true)
    }

    /// Runtime-only upsert of a system key (plain upsert: protection only on
    /// first insert).
    /// Reserve `n` numbers from the counter kept in meta `key` (at least
    /// `floor`), atomically across this file's connections: returns the
    /// first; the key then holds the first number not reserved.
    pub fn meta_reserve(&mut self, key: &str, n: u64, floor: u64) -> Result<u64> {
        let file = self.path().to_path_buf();
        let floor = floor.max(pending::floor(self.canonical_path(), key));
        self.write(|tx| {
            let cur: Option<String> =
                tx.query_row("SELECT value FROM adf_meta WHERE key = ?1", [key], |r| r.get(0)).optional().at(&file)?;
            let start = cur.and_then(|v| v.parse::<u64>().ok()).unwrap_or(1).max(floor);
            Self::meta_put_system(tx, key, &(start + n).to_string(), MetaProtection::None).at(&file)?;
            Ok(start)
        })
    }

    /// `meta_reserve` without the write, for a load that answers before
    /// its first write (the first write after an open syncs the new WAL and
    /// its folder): the numbers come from the stored counter (a read), and
    /// until `meta_reserve_settle` writes it every reservation of this key
    /// on any connection to the file in this process starts above them.
    /// Another process cannot reserve meanwhile: it cannot write the file.
    pub fn meta_reserve_later(&mut self, key: &str, n: u64, floor: u64) -> Result<u64> {
        let cur: Option<String> = self
            .conn()
            .query_row("SELECT value FROM adf_meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .at(self.path())?;
        let start = cur
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1)
            .max(floor)
            .max(pending::floor(self.canonical_path(), key));
        pending::raise(self.canonical_path(), key, start + n);
        Ok(start)
    }

    /// Write what `meta_reserve_later` handed out (the counter becomes at
    /// least that), ending its in-process floor.
    pub fn meta_reserve_settle(&mut self, key: &str) -> Result<()> {
        let file = self.path().to_path_buf();
        let canon = self.canonical_path().to_path_buf();
        let floor = pending::floor(&canon, key);
        if floor == 0 {
            return Ok(());
        }
        self.write(|tx| {
            let cur: Option<String> =
                tx.query_row("SELECT value FROM adf_meta WHERE key = ?1", [key], |r| r.get(0)).optional().at(&file)?;
            if cur.and_then(|v| v.parse::<u64>().ok()).is_none_or(|c| c < floor) {
                Self::meta_put_system(tx, key, &floor.to_string(), MetaProtection::None).at(&file)?;
            }
            Ok(())
        })?;
        pending::clear(&canon, key, floor);
        Ok(())
    }

    pub(crate) fn meta_put_system(
        conn: &rusqlite::Connection,
        key: &str,
        value: &str,
        protection: MetaProtection,
    ) -> rusqlite::Result<()> {
        // An UPDATE of the row that is there is the common case (a turn's
        // checkpoint, twice a turn) and costs SQLite less than the upsert's
        // failed insert; a new key is inserted (protection only then).
        let updated =
            conn.prepare_cached("UPDATE adf_meta SET value = ?2 WHERE key = ?1")?.execute(params![key, value])?;
        if updated == 0 {
            conn.prepare_cached("INSERT INTO adf_meta(key, value, protection) VALUES (?1, ?2, ?3)")?
                .execute(params![key, value, protection.as_str()])?;
        }
        Ok(())
    }
}

/// Reservations handed out by `meta_reserve_later` and not yet written,
/// per file (canonical path) and key.
mod pending {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    type Floors = HashMap<(PathBuf, String), u64>;
    static FLOORS: Mutex<Option<Floors>> = Mutex::new(None);

    /// `canon`: the file's canonical path (`Store::canonical_path`).
    fn id(canon: &Path, key: &str) -> (PathBuf, String) {
        (canon.to_path_buf(), key.to_string())
    }

    /// The first number above every pending reservation (0: none).
    pub(super) fn floor(path: &Path, key: &str) -> u64 {
        let Ok(f) = FLOORS.lock() else { return 0 };
        match f.as_ref() {
            Some(m) if !m.is_empty() => m.get(&id(path, key)).copied().unwrap_or(0),
            _ => 0,
        }
    }

    pub(super) fn raise(path: &Path, key: &str, to: u64) {
        if let Ok(mut f) = FLOORS.lock() {
            let e = f.get_or_insert_with(Default::default).entry(id(path, key)).or_insert(0);
            *e = (*e).max(to);
        }
    }

    /// Forget the floor once written, unless a later reservation raised it.
    pub(super) fn clear(path: &Path, key: &str, written: u64) {
        if let Ok(mut f) = FLOORS.lock()
            && let Some(m) = f.as_mut()
        {
            let k = id(path, key);
            if m.get(&k).is_some_and(|v| *v <= written) {
                m.remove(&k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reservation handed out without a write is honoured by every other
    /// connection of the process until it is written, and then by the file.
    #[test]
    fn a_reservation_made_later_is_a_floor_until_settled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.adf");
        let (mut s, _) = Store::create(&path, &crate::store::NewAgent::default()).unwrap();
        s.meta_reserve("seq", 10, 0).unwrap();
        let before = std::fs::metadata(&path).unwrap().modified().unwrap();
        let wal = |p: &std::path::Path| std::fs::metadata(p.with_extension("adf-wal")).map(|m| m.len()).unwrap_or(0);
        let wal_before = wal(&path);
        let first = s.meta_reserve_later("seq", 100, 0).unwrap();
        assert_eq!(first, 11);
        // Nothing was written: the counter still says 11.
        assert_eq!(s.meta_get("seq").unwrap().unwrap().value, "11");
        assert_eq!(wal(&path), wal_before);
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), before);
        // A sibling connection reserving meanwhile starts above the pending block.
        let mut sib = Store::sibling(&path).unwrap();
        assert_eq!(sib.meta_reserve("seq", 5, 0).unwrap(), 111);
        // Settling keeps the higher counter the sibling wrote.
        s.meta_reserve_settle("seq").unwrap();
        assert_eq!(s.meta_get("seq").unwrap().unwrap().value, "116");
        // Settled alone, the counter becomes the pending block's end.
        assert_eq!(s.meta_reserve_later("seq", 50, 0).unwrap(), 116);
        s.meta_reserve_settle("seq").unwrap();
        assert_eq!(s.meta_get("seq").unwrap().unwrap().value, "166");
        assert_eq!(pending::floor(s.canonical_path(), "seq"), 0);
        assert_eq!(s.meta_reserve("seq", 1, 0).unwrap(), 166);
        drop(sib);
    }

    #[test]
    fn numbers_render_like_the_reference() {
        assert_eq!(render_number(3.0), "3");
        assert_eq!(render_number(0.1 + 0.2), "0.3");
        assert_eq!(render_number(-2.5), "-2.5");
        assert!(parse_num("").is_none());
        assert!(parse_num("abc").is_none());
    }
}
