//! Creating a new agent file: schema, meta, config, seeded documents and a
//! fresh Ed25519 identity, built in memory from a once-made image of the
//! empty schema, written into a hidden temporary file and linked into
//! place, so a failed create leaves nothing behind (format.md §9; the meta
//! protections reproduce the 0.4.2 outcome, §6.3).

use std::path::{Path, PathBuf};

use std::io::Write;

use rusqlite::{Connection, MAIN_DB, params};
use serde::Serialize;

use super::defaults::{self, ConfigSeed};
use super::error::{Ctx, Result, StoreError};
use super::meta::MetaProtection;
use super::{Store, conn, identity, keyring, now_iso, schema};
use crate::identity::envelope::Dek;

/// What to create.
#[derive(Debug, Clone, Default)]
pub struct NewAgent<'a> {
    /// Seal the signing key and credentials to this owner and install
    /// (envelopes with owner and runtime slots, owner/operator
    /// attestations); `None` writes a plain key, as headless files have.
    pub seal_to: Option<std::sync::Arc<crate::identity::install::Install>>,
    /// Display name; defaults to the file stem.
    pub name: Option<&'a str>,
    /// Mesh handle; slug of the name when absent.
    pub handle: Option<&'a str>,
    pub description: Option<&'a str>,
    pub icon: Option<&'a str>,
    pub provider: Option<&'a str>,
    pub model: Option<&'a str>,
}

/// What was created.
#[derive(Debug, Clone, Serialize)]
pub struct Created {
    pub path: PathBuf,
    pub id: String,
    pub name: String,
    pub handle: String,
    pub did: String,
}

/// Slug of a name: lowercase, runs of non-`[a-z0-9]` → `-`, trimmed,
/// `untitled` when empty.
pub fn slug(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut dash = false;
    for c in name.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
            dash = false;
        } else if !dash {
            out.push('-');
            dash = true;
        }
    }
    let s = out.trim_matches('-');
    let s: String = s.chars().take(64).collect();
    let s = s.trim_end_matches('-');
    if s.is_empty() { "untitled".to_string() } else { s.to_string() }
}

/// A 12-character id from `[A-Za-z0-9]`.
pub fn nanoid(len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..len).map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char).collect()
}

fn valid_handle(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 64
        && h.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && h.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Work done inside a new file's transaction, after the defaults are
/// written and before the identity is (a child's template and overrides).
pub(crate) type Finish<'f> = &'f dyn Fn(&rusqlite::Transaction<'_>, &Path) -> Result<()>;

/// Create a new agent file at `path` (which must not exist).
pub fn create_file(path: &Path, opts: &NewAgent<'_>) -> Result<Created> {
    create_file_with(path, opts, &|_, _| Ok(()))
}

/// Create a new agent file, running `finish` in its transaction: a failure
/// there leaves nothing behind either.
pub(crate) fn create_file_with(path: &Path, opts: &NewAgent<'_>, finish: Finish<'_>) -> Result<Created> {
    if path.exists() {
        return Err(StoreError::Exists { path: path.to_path_buf() });
    }
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("agent");
    let name = opts.name.unwrap_or(stem).trim();
    if name.is_empty() || name.chars().count() > 100 {
        return Err(StoreError::Invalid(format!("{}: name must be 1 to 100 characters", path.display())));
    }
    if let Some(h) = opts.handle
        && !valid_handle(h)
    {
        return Err(StoreError::Invalid(format!(
            "{}: handle \"{h}\" must match ^[a-z0-9][a-z0-9-]*$ (at most 64 characters)",
            path.display()
        )));
    }
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(StoreError::Invalid(format!("{}: folder {} does not exist", path.display(), dir.display())));
    }
    let handle = opts.handle.map(str::to_string).unwrap_or_else(|| slug(name));
    let keys = identity::AgentKeys::generate().map_err(StoreError::Invalid)?;
    let id = nanoid(12);
    let now = now_iso();
    let icon = opts
        .icon
        .map(str::to_string)
        .unwrap_or_else(|| defaults::ICONS[rand::random_range(0..defaults::ICONS.len())].to_string());
    sweep_abandoned(dir);
    // Hidden while it is built, and named by this process so a later create
    // can tell an abandoned one (its process gone) from one in progress.
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}{CREATING}{}", std::process::id()));
    let result: Result<Option<(Dek, Option<Dek>)>> = write_new(
        &tmp,
        &NewFile {
            name,
            handle: &handle,
            handle_given: opts.handle.is_some(),
            id: &id,
            now: &now,
            icon: &icon,
            description: opts.description.unwrap_or(""),
            provider: opts.provider.unwrap_or(""),
            model: opts.model.unwrap_or(""),
            keys: &keys,
            seal_to: opts.seal_to.as_deref(),
        },
        finish,
    )
    .and_then(|deks| {
        // No-clobber rename: a hard link fails if the target appeared meanwhile.
        std::fs::hard_link(&tmp, path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => StoreError::Exists { path: path.to_path_buf() },
                _ => StoreError::Io { path: path.to_path_buf(), source: e },
            })
            .map(|()| deks)
    });
    for suffix in ["", "-wal", "-shm"] {
        let mut s = tmp.as_os_str().to_owned();
        s.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(s));
    }
    // The work file is an implementation detail: errors name the agent file.
    let result = result.map_err(|e| match e {
        StoreError::DiskFull { .. } => StoreError::DiskFull { path: path.to_path_buf() },
        e => e,
    });
    if let Some((id, cred)) = result? {
        Store::remember_deks(path, id, cred);
    }
    Ok(Created { path: path.to_path_buf(), id, name: name.to_string(), handle, did: keys.did })
}

pub(crate) const CREATING: &str = ".creating-";

/// Remove what a killed `adf new` left in `dir`: hidden `.NAME.creating-PID`
/// files (and their sidecars) whose process is gone.
pub(crate) fn sweep_abandoned(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix('.') else { continue };
        let Some((_, tail)) = rest.rsplit_once(CREATING) else { continue };
        let pid = tail.trim_end_matches("-wal").trim_end_matches("-shm").trim_end_matches("-journal");
        let Ok(pid) = pid.parse::<i32>() else { continue };
        if pid as u32 == std::process::id() || process_alive(pid) {
            continue;
        }
        let _ = std::fs::remove_file(e.path());
    }
}

fn process_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

struct NewFile<'a> {
    name: &'a str,
    handle: &'a str,
    handle_given: bool,
    id: &'a str,
    now: &'a str,
    icon: &'a str,
    description: &'a str,
    provider: &'a str,
    model: &'a str,
    keys: &'a identity::AgentKeys,
    seal_to: Option<&'a crate::identity::install::Install>,
}

/// The empty schema as a database image, built once per process: a new
/// agent starts as a copy of it instead of running the DDL again.
fn empty_image() -> Result<&'static [u8]> {
    static IMAGE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    if let Some(image) = IMAGE.get() {
        return Ok(image);
    }
    let here = Path::new(":memory:");
    conn::register_sqlite_vec();
    let mut c = Connection::open_in_memory().at(here)?;
    schema::create(&c).at(here)?;
    let image = c.serialize(MAIN_DB).at(here)?.to_vec();
    Ok(IMAGE.get_or_init(|| image))
}

/// Offsets 18 and 19 of a SQLite header: the file format's read and write
/// versions, 1 for a rollback journal and 2 for WAL (SQLite's file format,
/// §1.3.3). Writing 2 is what `journal_mode = WAL` persists.
const FORMAT_VERSIONS: std::ops::Range<usize> = 18..20;
const WAL_FORMAT: [u8; 2] = [2, 2];

/// Build the new file in memory and write it in one go: the hidden work
/// file gets its bytes, one sync and no journal, WAL or lock traffic.
/// Atomicity comes from the rename into place, not from a journal, and the
/// file is in WAL mode from its first open, as every agent file is.
fn write_new(tmp: &Path, f: &NewFile<'_>, finish: Finish<'_>) -> Result<Option<(Dek, Option<Dek>)>> {
    let _ = std::fs::remove_file(tmp);
    let image = empty_image()?;
    let mut c = Connection::open_in_memory().at(tmp)?;
    c.deserialize_read_exact(MAIN_DB, image, image.len(), false).at(tmp)?;
    let deks = fill(&mut c, tmp, f, finish)?;
    let data = c.serialize(MAIN_DB).at(tmp)?;
    if data.len() < FORMAT_VERSIONS.end {
        return Err(StoreError::Invalid(format!("{}: the new database image is empty", tmp.display())));
    }
    let mut out = std::fs::OpenOptions::new().write(true).create_new(true).open(tmp).at(tmp)?;
    out.write_all(&data[..FORMAT_VERSIONS.start]).at(tmp)?;
    out.write_all(&WAL_FORMAT).at(tmp)?;
    out.write_all(&data[FORMAT_VERSIONS.end..]).at(tmp)?;
    out.sync_data().at(tmp)?;
    Ok(deks)
}

/// Everything a new agent holds beyond the empty schema, in one transaction.
fn fill(c: &mut Connection, tmp: &Path, f: &NewFile<'_>, finish: Finish<'_>) -> Result<Option<(Dek, Option<Dek>)>> {
    let tx = c.transaction().at(tmp)?;
    let put = |key: &str, value: &str, p: MetaProtection| Store::meta_put_system(&tx, key, value, p);
    put("adf_version", schema::ADF_FORMAT_VERSION, MetaProtection::Readonly).at(tmp)?;
    put("adf_schema_version", &schema::ADF_SCHEMA_VERSION.to_string(), MetaProtection::Readonly).at(tmp)?;
    let cfg = defaults::new_config(&ConfigSeed {
        id: f.id,
        name: f.name,
        description: f.description,
        icon: f.icon,
        handle: f.handle_given.then_some(f.handle),
        provider: f.provider,
        model_id: f.model,
        now: f.now,
    });
    super::config::write_config(&tx, &cfg, f.now).at(tmp)?;
    put("adf_name", f.name, MetaProtection::Readonly).at(tmp)?;
    put("adf_handle", f.handle, MetaProtection::Readonly).at(tmp)?;
    put("adf_parent_did", "", MetaProtection::Readonly).at(tmp)?;
    put("adf_created_at", f.now, MetaProtection::Readonly).at(tmp)?;
    put("adf_updated_at", f.now, MetaProtection::Readonly).at(tmp)?;
    put("status", "", MetaProtection::None).at(tmp)?;
    let date = &f.now[..10];
    for (path, text) in defaults::seeded_files(f.name, date) {
        tx.execute(
            "INSERT INTO adf_files(path, content, mime_type, size, protection, authorized, created_at, updated_at)
             VALUES (?1, ?2, 'text/markdown', ?3, 'no_delete', 0, ?4, ?4)",
            params![path, text.as_bytes(), text.len() as i64, f.now],
        )
        .at(tmp)?;
    }
    finish(&tx, tmp)?;
    let deks = match f.seal_to {
        Some(inst) => Some(keyring::provision(&tx, tmp, inst, f.keys, f.now, true)?),
        None => {
            for (purpose, value) in
                [(identity::PURPOSE_PRIVATE, &f.keys.private_der), (identity::PURPOSE_PUBLIC, &f.keys.public_der)]
            {
                tx.execute(
                    "INSERT INTO adf_identity(purpose, value, encryption_algo, code_access) VALUES (?1, ?2, 'plain', 0)",
                    params![purpose, value],
                )
                .at(tmp)?;
            }
            put("adf_did", &f.keys.did, MetaProtection::Readonly).at(tmp)?;
            None
        }
    };
    put("adf_clean_close", &now_iso(), MetaProtection::Readonly).at(tmp)?;
    tx.commit().at(tmp)?;
    Ok(deks)
}

impl Store {
    /// Create a new agent file and open it.
    pub fn create(path: impl AsRef<Path>, opts: &NewAgent<'_>) -> Result<(Store, Created)> {
        let created = create_file(path.as_ref(), opts)?;
        Ok((Store::open(path)?, created))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        assert_eq!(slug("Fresh Headless!"), "fresh-headless");
        assert_eq!(slug("  --  "), "untitled");
        assert_eq!(slug("Été 2026"), "t-2026");
        assert_eq!(nanoid(12).len(), 12);
    }

    #[test]
    fn a_new_file_is_whole_in_wal_mode_with_no_sidecars() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.adf");
        let created = create_file(&path, &NewAgent { name: Some("New"), ..Default::default() }).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..16], b"SQLite format 3\0");
        assert_eq!(bytes[FORMAT_VERSIONS], WAL_FORMAT);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("new.adf")], "nothing but the file");
        let s = Store::open(&path).unwrap();
        assert_eq!(s.integrity_check(), super::super::IntegrityCheck::Skipped, "created closed cleanly");
        assert_eq!(s.meta_get("adf_name").unwrap().unwrap().value, "New");
        s.close().unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("new.adf")], "an open and close leaves nothing either");
        // Inspected last: a read-only connection leaves the WAL it opened.
        {
            let c = Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
            let mode: String = c.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
            assert_eq!(mode, "wal");
            let ok: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
            assert_eq!(ok, "ok");
            let tables: i64 = c
                .query_row("SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name LIKE 'adf_%'", [], |r| {
                    r.get(0)
                })
                .unwrap();
            assert!(tables >= 12, "{tables} adf_ tables");
        }
        // Two files from one image are two agents.
        let other = dir.path().join("other.adf");
        let b = create_file(&other, &NewAgent::default()).unwrap();
        let a = Store::open_read_only(&other).unwrap();
        assert_eq!(a.meta_get("adf_did").unwrap().unwrap().value, b.did);
        assert_ne!(created.did, b.did);
    }
}
