//! The virtual filesystem in `adf_files`: flat slash-separated paths with
//! protection levels, the `authorized` code-trust flag (cleared by every
//! content write), MIME types, the write-size cap, atomic multi-edits, and
//! streamed reads and writes of large contents through SQLite's incremental
//! blob I/O (format.md §5, tools.md §2).

use std::io::{Read, Write};

use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use super::access::{Caller, Denial, DenialKind};
use super::error::{Ctx, Result, StoreError};
use super::{Store, mime, now_iso};

/// Files that always exist and can never be deleted.
pub const CORE_FILES: &[&str] = &["README.md", "mind.md", "soul.md"];
/// Files exempt from `max_file_write_bytes`.
pub const SIZE_EXEMPT: &[&str] = &["README.md", "document.md", "mind.md"];
/// Default `limits.max_file_write_bytes`.
pub const DEFAULT_MAX_WRITE: u64 = 5_000_000;
const CHUNK: usize = 1 << 20;

/// Protection of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protection {
    ReadOnly,
    NoDelete,
    None,
}

impl Protection {
    pub fn as_str(self) -> &'static str {
        match self {
            Protection::ReadOnly => "read_only",
            Protection::NoDelete => "no_delete",
            Protection::None => "none",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "read_only" => Ok(Protection::ReadOnly),
            "no_delete" => Ok(Protection::NoDelete),
            "none" => Ok(Protection::None),
            other => Err(StoreError::Invalid(format!(
                "unknown file protection \"{other}\" (expected read_only, no_delete or none)"
            ))),
        }
    }
}

/// A file's metadata (everything but the content).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileEntry {
    pub path: String,
    pub size: u64,
    pub mime_type: Option<String>,
    pub protection: Protection,
    pub authorized: bool,
    pub created_at: String,
    pub updated_at: String,
}

impl FileEntry {
    pub fn is_text(&self) -> bool {
        mime::is_text(self.mime_type.as_deref())
    }
}

/// Options of a whole-content write.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions<'a> {
    /// MIME type; guessed from the path when absent (new files only keep
    /// their old type otherwise).
    pub mime_type: Option<&'a str>,
    /// Protection, applied only when the file is created.
    pub protection: Option<Protection>,
    /// Enforce `max_file_write_bytes` (agent text writes).
    pub max_bytes: Option<u64>,
}

/// One replacement of a batch edit.
#[derive(Debug, Clone)]
pub struct Edit<'a> {
    pub old_text: &'a str,
    pub new_text: &'a str,
    pub replace_all: bool,
}

const COLS: &str = "path, size, mime_type, protection, authorized, created_at, updated_at";

fn entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<FileEntry> {
    let prot: String = r.get(3)?;
    Ok(FileEntry {
        path: r.get(0)?,
        size: r.get::<_, i64>(1)?.max(0) as u64,
        mime_type: r.get(2)?,
        protection: Protection::parse(&prot).unwrap_or(Protection::None),
        authorized: r.get::<_, i64>(4)? != 0,
        created_at: r.get(5)?,
        updated_at: r.get(6)?,
    })
}

fn not_found(path: &str) -> StoreError {
    StoreError::Missing(format!("File not found: \"{path}\""))
}

/// Reject paths that cannot name a VFS file.
pub fn validate_path(path: &str) -> Result<()> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path.ends_with('/')
        || path.contains('\0')
        || path.contains('\\')
        || path.split('/').any(|seg| seg.is_empty() || seg == "." || seg == "..");
    if bad {
        return Err(StoreError::Invalid(format!(
            "invalid file path \"{path}\": use a relative path like notes/today.md (no leading /, no . or .. segments)"
        )));
    }
    Ok(())
}

impl Store {
    /// Files whose path starts with `prefix`, sorted by path.
    pub fn file_list(&self, prefix: &str) -> Result<Vec<FileEntry>> {
        let mut stmt = self
            .conn()
            .prepare_cached(&format!(
                "SELECT {COLS} FROM adf_files WHERE substr(path, 1, length(?1)) = ?1 ORDER BY path"
            ))
            .at(self.path())?;

        stmt.query_map([prefix], entry).at(self.path())?.collect::<rusqlite::Result<Vec<_>>>().at(self.path())
    }

    pub fn file_stat(&self, path: &str) -> Result<Option<FileEntry>> {
        self.conn()
            .query_row(&format!("SELECT {COLS} FROM adf_files WHERE path = ?1"), [path], entry)
            .optional()
            .at(self.path())
    }

    /// A file's metadata and content.
    pub fn file_read(&self, path: &str) -> Result<(FileEntry, Vec<u8>)> {
        let e = self.file_stat(path)?.ok_or_else(|| not_found(path))?;
        let mut buf = Vec::with_capacity(e.size as usize);
        self.copy_content(path, &mut buf)?;
        Ok((e, buf))
    }

    /// A text file's content as a string (lossy for invalid UTF-8).
    pub fn file_read_text(&self, path: &str) -> Result<String> {
        let (_, bytes) = self.file_read(path)?;
        Ok(String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    /// Stream a file's exact bytes into `out`, a chunk at a time.
    pub fn file_read_to(&self, path: &str, out: &mut dyn Write) -> Result<FileEntry> {
        let e = self.file_stat(path)?.ok_or_else(|| not_found(path))?;
        self.copy_content(path, out)?;
        Ok(e)
    }

    fn copy_content(&self, path: &str, out: &mut dyn Write) -> Result<()> {
        let rowid: i64 = self
            .conn()
            .query_row("SELECT rowid FROM adf_files WHERE path = ?1", [path], |r| r.get(0))
            .at(self.path())?;
        let mut blob = self.conn().blob_open(rusqlite::MAIN_DB, "adf_files", "content", rowid, true).at(self.path())?;
        let mut buf = vec![0u8; CHUNK.min(blob.len().max(1))];
        loop {
            let n = blob.read(&mut buf).at(self.path())?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n]).at(self.path())?;
        }
        Ok(())
    }

    /// The memory log's current bytes when this write must only add to it
    /// (the agent writing `mind/log.md` that exists; the owner and an
    /// approved override may rewrite it).
    fn append_only(&self, caller: Caller, path: &str, existing: Option<&FileEntry>) -> Result<Option<Vec<u8>>> {
        if path != MEMORY_LOG || existing.is_none() || caller == Caller::Owner || caller.bypasses() {
            return Ok(None);
        }
        self.file_read(path).map(|(_, b)| Some(b))
    }

    fn check_write(&self, caller: Caller, path: &str, existing: Option<&FileEntry>) -> Result<bool> {
        if let Some(e) = existing
            && e.protection == Protection::ReadOnly
        {
            if caller.bypasses() {
                return Ok(true);
            }
            return Err(StoreError::Denied(Denial::new(
                DenialKind::FileProtection,
                path,
                "read_only",
                format!("Cannot write to \"{path}\": file is read-only."),
            )));
        }
        Ok(false)
    }

    fn check_size(path: &str, len: u64, max: Option<u64>) -> Result<()> {
        if let Some(max) = max
            && len > max
            && !SIZE_EXEMPT.contains(&path)
        {
            return Err(StoreError::Invalid(format!(
                "Write rejected: result is {len} bytes but max_file_write_bytes is {max}."
            )));
        }
        Ok(())
    }

    /// Write a whole file (create or replace). Returns the new metadata.
    pub fn file_write(
        &mut self,
        caller: Caller,
        path: &str,
        content: &[u8],
        opts: &WriteOptions<'_>,
    ) -> Result<FileEntry> {
        self.file_write_stream(caller, path, &mut &content[..], content.len() as u64, opts)
    }

    /// Write a whole file from a reader of known length, in chunks.
    pub fn file_write_stream(
        &mut self,
        caller: Caller,
        path: &str,
        reader: &mut dyn Read,
        len: u64,
        opts: &WriteOptions<'_>,
    ) -> Result<FileEntry> {
        validate_path(path)?;
        self.writable()?;
        let existing = self.file_stat(path)?;
        let bypass = self.check_write(caller, path, existing.as_ref())?;
        let log = self.append_only(caller, path, existing.as_ref())?;
        if let Some(old) = &log
            && len < old.len() as u64
        {
            return Err(log_rewrite());
        }
        Self::check_size(path, len, opts.max_bytes)?;
        let now = now_iso();
        let file = self.path().to_path_buf();
        self.write(|tx| {
            match &existing {
                Some(_) => {
                    tx.execute(
                        "UPDATE adf_files SET content = zeroblob(?2), size = ?2,
                           mime_type = COALESCE(?3, mime_type), updated_at = ?4, authorized = 0
                         WHERE path = ?1",
                        params![path, len as i64, opts.mime_type, now],
                    )
                    .at(&file)?;
                }
                None => {
                    let mime = opts.mime_type.map(str::to_string).unwrap_or_else(|| mime::for_path(path));
                    let prot = opts.protection.unwrap_or(Protection::None);
                    tx.execute(
                        "INSERT INTO adf_files(path, content, mime_type, size, protection, authorized, created_at, updated_at)
                         VALUES (?1, zeroblob(?2), ?3, ?2, ?4, 0, ?5, ?5)",
                        params![path, len as i64, mime, prot.as_str(), now],
                    )
                    .at(&file)?;
                }
            }
            let rowid: i64 = tx
                .query_row("SELECT rowid FROM adf_files WHERE path = ?1", [path], |r| r.get(0))
                .at(&file)?;
            let mut blob = tx.blob_open(rusqlite::MAIN_DB, "adf_files", "content", rowid, false).at(&file)?;
            let mut buf = vec![0u8; CHUNK.min(len.max(1) as usize)];
            let mut written = 0u64;
            loop {
                let n = reader.read(&mut buf).at(&file)?;
                if n == 0 {
                    break;
                }
                if written + n as u64 > len {
                    return Err(StoreError::Invalid(format!("{path}: input is longer than {len} bytes")));
                }
                // The memory log keeps what it had: the new bytes must
                // start with the old ones.
                if let Some(old) = &log
                    && (written as usize) < old.len()
                {
                    let from = written as usize;
                    let upto = (from + n).min(old.len());
                    if buf[..upto - from] != old[from..upto] {
                        return Err(log_rewrite());
                    }
                }
                blob.write_all(&buf[..n]).at(&file)?;
                written += n as u64;
            }
            if written != len {
                return Err(StoreError::Invalid(format!("{path}: input ended after {written} of {len} bytes")));
            }
            if bypass {
                super::logs::bypass(tx, path, "write to read_only file")?;
            }
            Ok(())
        })?;
        self.file_stat(path)?.ok_or_else(|| not_found(path))
    }

    /// Append text (creates the file when absent).
    pub fn file_append(&mut self, caller: Caller, path: &str, text: &str, max_bytes: Option<u64>) -> Result<FileEntry> {
        let current = match self.file_stat(path)? {
            Some(_) => self.file_read(path)?.1,
            None => Vec::new(),
        };
        let mut next = current;
        next.extend_from_slice(text.as_bytes());
        self.file_write(caller, path, &next, &WriteOptions { max_bytes, ..Default::default() })
    }

    /// Apply edits in order, all or nothing. Returns the replacement count.
    pub fn file_edit(
        &mut self,
        caller: Caller,
        path: &str,
        edits: &[Edit<'_>],
        max_bytes: Option<u64>,
    ) -> Result<usize> {
        let existing = self.file_stat(path)?.ok_or_else(|| {
            StoreError::Missing(format!("File not found: \"{path}\". Use mode=\"write\" to create it."))
        })?;
        self.check_write(caller, path, Some(&existing))?;
        let mut text = self.file_read_text(path)?;
        let batch = edits.len() > 1;
        let mut count = 0;
        for (i, e) in edits.iter().enumerate() {
            let fail = |msg: String| {
                StoreError::Invalid(if batch {
                    format!("Edit {} failed: {msg} Batch aborted, file unchanged.", i + 1)
                } else {
                    msg
                })
            };
            if e.old_text.is_empty() {
                return Err(fail("old_text must not be empty.".into()));
            }
            if e.old_text == e.new_text {
                return Err(fail("old_text and new_text are identical.".into()));
            }
            let n = text.matches(e.old_text).count();
            if n == 0 {
                return Err(fail(format!("old_text not found in \"{path}\".")));
            }
            if n > 1 && !e.replace_all {
                return Err(fail(format!(
                    "old_text occurs {n} times in \"{path}\"; add context to make it unique or set replace_all."
                )));
            }
            text = if e.replace_all {
                text.replace(e.old_text, e.new_text)
            } else {
                text.replacen(e.old_text, e.new_text, 1)
            };
            count += if e.replace_all { n } else { 1 };
        }
        self.file_write(caller, path, text.as_bytes(), &WriteOptions { max_bytes, ..Default::default() })?;
        Ok(count)
    }

    /// Delete a file, honouring protection; snapshots it to the audit first
    /// when file audit is on.
    pub fn file_delete(&mut self, caller: Caller, path: &str) -> Result<()> {
        let e = self.file_stat(path)?.ok_or_else(|| not_found(path))?;
        if path == MEMORY_LOG && caller != Caller::Owner && !caller.bypasses() {
            return Err(log_rewrite());
        }
        if CORE_FILES.contains(&path) && caller == Caller::Owner {
            return Err(StoreError::Denied(Denial::new(
                DenialKind::FileProtection,
                path,
                "no_delete",
                format!("Cannot delete \"{path}\": file is protected (no_delete)."),
            )));
        }
        let bypass = if e.protection != Protection::None {
            if !caller.bypasses() {
                return Err(StoreError::Denied(Denial::new(
                    DenialKind::FileProtection,
                    path,
                    e.protection.as_str(),
                    format!("Cannot delete \"{path}\": file is protected ({}).", e.protection.as_str()),
                )));
            }
            true
        } else {
            false
        };
        let audit = self.config_value().ok().is_some_and(|c| super::config::audit_enabled(&c, "files"));
        let snapshot = if audit { Some(self.file_read(path)?) } else { None };
        let file = self.path().to_path_buf();
        self.write(|tx| {
            if let Some((e, bytes)) = &snapshot {
                use base64::Engine;
                let v = serde_json::json!({
                    "path": e.path, "content": base64::engine::general_purpose::STANDARD.encode(bytes), "mime_type": e.mime_type, "size": e.size,
                    "protection": e.protection.as_str(), "created_at": e.created_at, "updated_at": e.updated_at
                });
                super::audit::append(tx, "file", super::audit::Address::Ref(path), 1, &v).at(&file)?;
            }
            tx.execute("DELETE FROM adf_files WHERE path = ?1", [path]).at(&file)?;
            if bypass {
                super::logs::bypass(tx, path, "delete of protected file")?;
            }
            Ok(())
        })
    }

    /// Rename a file, or a folder (every `from/…` path) when `from` names
    /// no file. Fails when a target exists. Protected and core files keep
    /// their names unless the caller may bypass protection.
    pub fn file_rename(&mut self, caller: Caller, from: &str, to: &str) -> Result<()> {
        let from = from.trim_end_matches('/');
        let to = to.trim_end_matches('/');
        validate_path(to)?;
        let moves: Vec<(FileEntry, String)> = match self.file_stat(from)? {
            Some(e) => vec![(e, to.to_string())],
            None => self
                .file_list(&format!("{from}/"))?
                .into_iter()
                .map(|e| {
                    let dest = format!("{to}{}", &e.path[from.len()..]);
                    (e, dest)
                })
                .collect(),
        };
        if moves.is_empty() {
            return Err(not_found(from));
        }
        if caller != Caller::Owner
            && !caller.bypasses()
            && moves.iter().any(|(e, dest)| e.path == MEMORY_LOG || dest == MEMORY_LOG)
        {
            return Err(log_rewrite());
        }
        for (e, dest) in &moves {
            if self.file_stat(dest)?.is_some() {
                return Err(StoreError::Invalid(format!("Cannot rename \"{}\": \"{dest}\" already exists.", e.path)));
            }
            if (e.protection != Protection::None || CORE_FILES.contains(&e.path.as_str())) && !caller.bypasses() {
                return Err(StoreError::Denied(Denial::new(
                    DenialKind::FileProtection,
                    &e.path,
                    e.protection.as_str(),
                    format!("Cannot rename \"{}\": file is protected ({}).", e.path, e.protection.as_str()),
                )));
            }
        }
        let now = now_iso();
        let file = self.path().to_path_buf();
        self.write(|tx| {
            for (e, dest) in &moves {
                tx.execute(
                    "UPDATE adf_files SET path = ?2, updated_at = ?3 WHERE path = ?1",
                    params![e.path, dest, now],
                )
                .at(&file)?;
            }
            Ok(())
        })
    }

    /// Change a file's protection (owner, or authorized code).
    pub fn file_set_protection(&mut self, caller: Caller, path: &str, level: Protection) -> Result<()> {
        let e = self.file_stat(path)?.ok_or_else(|| not_found(path))?;
        if caller != Caller::Owner && !caller.bypasses() {
            return Err(StoreError::Denied(Denial::new(
                DenialKind::FileProtection,
                path,
                e.protection.as_str(),
                format!("Cannot change the protection of \"{path}\": only the owner can."),
            )));
        }
        if CORE_FILES.contains(&path) && level != Protection::NoDelete {
            return Err(StoreError::Invalid(format!("\"{path}\" is a core file: its protection stays no_delete.")));
        }
        let file = self.path().to_path_buf();
        self.write(|tx| {
            tx.execute("UPDATE adf_files SET protection = ?2 WHERE path = ?1", params![path, level.as_str()])
                .at(&file)?;
            Ok(())
        })
    }

    /// Mark a file as owner-trusted code (or clear the mark).
    pub fn file_set_authorized(&mut self, path: &str, authorized: bool) -> Result<()> {
        self.file_stat(path)?.ok_or_else(|| not_found(path))?;
        let file = self.path().to_path_buf();
        self.write(|tx| {
            tx.execute("UPDATE adf_files SET authorized = ?2 WHERE path = ?1", params![path, authorized as i64])
                .at(&file)?;
            Ok(())
        })
    }
}

/// The agent's memory log: appends only (issue 18). Its index is `mind.md`,
/// its topic pages `mind/<topic>.md`.
pub const MEMORY_LOG: &str = "mind/log.md";

fn log_rewrite() -> StoreError {
    StoreError::Denied(Denial::new(
        DenialKind::FileProtection,
        MEMORY_LOG,
        "append_only",
        format!("Cannot rewrite \"{MEMORY_LOG}\": the memory log is append-only; add to it with fs_write mode=append."),
    ))
}
