//! Errors of the store layer. Every variant carries enough context (file, path,
//! key) for the CLI to print one line that says what went wrong and where.

use std::path::PathBuf;

use super::access::Denial;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: no such file")]
    NotFound { path: PathBuf },
    #[error("{path}: not a SQLite database ({detail})")]
    NotSqlite { path: PathBuf, detail: String },
    #[error("{path}: SQLite database but not an ADF agent file (no adf_meta table)")]
    NotAgent { path: PathBuf },
    #[error("{path}: corrupt: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("{path}: no space left on the device; the change was not made (free some space and try again)")]
    DiskFull { path: PathBuf },
    #[error("{path}: file is locked by another connection, try again ({detail})")]
    Busy { path: PathBuf, detail: String },
    #[error("{path}: held by another adf process (pid {pid} on {host}, since {since}); {hint}")]
    Held { path: PathBuf, pid: u32, host: String, since: String, hint: &'static str },
    #[error("{path}: migration to schema version {version} failed: {detail} (the original is kept at {backup})")]
    Migration { path: PathBuf, version: i64, detail: String, backup: PathBuf },
    #[error("{path}: already exists (adf never overwrites an agent file)")]
    Exists { path: PathBuf },
    #[error("{path}: opened read-only, writes are refused")]
    ReadOnly { path: PathBuf },
    #[error("{0}")]
    Denied(Denial),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Missing(String),
    /// The change conflicts with what is there (a name in use, a limit).
    #[error("{0}")]
    Conflict(String),
    #[error("{path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// The structured protection denial, when this error is one.
    pub fn denial(&self) -> Option<&Denial> {
        match self {
            StoreError::Denied(d) => Some(d),
            _ => None,
        }
    }
}

/// Attach the file path to low-level errors.
pub(crate) trait Ctx<T> {
    fn at(self, path: &std::path::Path) -> Result<T>;
}

impl<T> Ctx<T> for std::result::Result<T, rusqlite::Error> {
    fn at(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|source| classify(path, source))
    }
}

impl<T> Ctx<T> for std::result::Result<T, std::io::Error> {
    fn at(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|source| match source.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => StoreError::DiskFull { path: path.to_path_buf() },
            _ => StoreError::Io { path: path.to_path_buf(), source },
        })
    }
}

/// Turn SQLite's error codes into the cases a user can act on.
pub(crate) fn classify(path: &std::path::Path, source: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode as C;
    let path = path.to_path_buf();
    match source.sqlite_error_code() {
        Some(C::NotADatabase) => StoreError::NotSqlite { path, detail: "file is not a database".into() },
        Some(C::DatabaseCorrupt) => StoreError::Corrupt { path, detail: source.to_string() },
        Some(C::DiskFull) => StoreError::DiskFull { path },
        // A write into the WAL or its index that the kernel refused for
        // lack of space comes back as an I/O error: say which it was.
        Some(C::SystemIoFailure) if disk_full_at(&path) => StoreError::DiskFull { path },
        Some(C::DatabaseBusy) | Some(C::DatabaseLocked) => StoreError::Busy { path, detail: source.to_string() },
        _ => StoreError::Sqlite { path, source },
    }
}

/// A text cell read as well as it can be: invalid UTF-8 (a flipped byte)
/// becomes U+FFFD instead of failing the whole read, so one damaged row
/// does not hide the rest of the file.
pub(crate) fn text_lossy(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<String> {
    use rusqlite::types::ValueRef;
    Ok(match r.get_ref(i)? {
        ValueRef::Text(b) | ValueRef::Blob(b) => String::from_utf8_lossy(b).into_owned(),
        ValueRef::Null => String::new(),
        ValueRef::Integer(n) => n.to_string(),
        ValueRef::Real(f) => f.to_string(),
    })
}

/// [`text_lossy`] keeping NULL apart.
pub(crate) fn opt_text_lossy(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Option<String>> {
    if matches!(r.get_ref(i)?, rusqlite::types::ValueRef::Null) { Ok(None) } else { text_lossy(r, i).map(Some) }
}

/// Whether the filesystem holding `path` has (next to) no space left.
pub(crate) fn disk_full_at(path: &std::path::Path) -> bool {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else { return false };
    // SAFETY: a zeroed statvfs is a valid out-parameter; `c` is a valid
    // NUL-terminated path for the call.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return false;
    }
    (s.f_bavail as u64).saturating_mul(s.f_frsize as u64) < 1 << 20
}

/// Whether SQLite refused a statement for naming a table the file does not
/// have (adf's own tables are made on first use; reading before is empty).
pub(crate) fn no_such_table(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(_, Some(m)) if m.starts_with("no such table"))
}

/// A statement named a column the table (from an older adf) lacks. SQLite
/// reports it where in the statement the name stands, so it may come as an
/// input error with that offset.
pub(crate) fn no_such_column(e: &rusqlite::Error) -> bool {
    match e {
        rusqlite::Error::SqliteFailure(_, Some(m)) => m.starts_with("no such column"),
        rusqlite::Error::SqlInputError { msg, .. } => msg.starts_with("no such column"),
        _ => false,
    }
}
