//! The `.adf` file. A `Store` owns one SQLite connection to one agent file and
//! is the only code that reads or writes it: opening (with the integrity gate
//! of the clean-close marker, repair and the migration ladder), the writer
//! lock, and the typed operations on files, meta, config, loop rows, audit
//! and local tables. It is synchronous; the runtime calls it from a blocking
//! task that owns the file.

pub mod access;
pub mod audit;
pub mod cite;
pub mod compare;
pub mod config;
mod conn;
pub mod create;
pub mod defaults;
pub mod derive;
mod error;
pub mod files;
pub mod fork;
pub mod grants;
pub mod identity;
pub mod keyring;
pub mod lint;
pub mod lock;
pub mod logs;
pub mod loop_rows;
pub mod loops;
pub mod messages;
pub mod meta;
pub mod mime;
mod park;
mod registry;
pub mod repair;
pub mod revs;
pub mod schema;
pub mod spend;
mod sql_enforce;
pub mod sql_guard;
pub mod tables;
pub mod tasks;
pub mod template;
pub mod timers;

use std::io::Read;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

pub use access::{Caller, Denial, DenialKind};
pub use conn::{PRAGMAS, pragma_text, register_sqlite_vec};
pub use create::NewAgent;
use error::{Ctx, classify};
pub use error::{Result, StoreError};
pub use lock::{Holder, WriterLock, current_holder};
use park::FileSig;
pub use park::WAL_CHECKPOINT_FRAMES;
pub(crate) use registry::canonical;
use registry::{Registered, is_open_here, register, unregister};
pub use schema::{ADF_FORMAT_VERSION, ADF_SCHEMA_VERSION};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// ISO-8601 UTC with milliseconds, as the reference writes timestamps.
pub fn now_iso() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// Which integrity check ran when the file was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IntegrityCheck {
    Skipped,
    Quick,
    Full,
}

/// How a file is opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    /// Run the full `integrity_check` whatever the marker says.
    pub force_integrity: bool,
}

/// One open agent file.
pub struct Store {
    /// Empty after `finish`, and while parked (`park`): the next use opens
    /// it again.
    conn: std::cell::OnceCell<Connection>,
    path: PathBuf,
    /// `path` resolved once at open: the key of the process-wide maps
    /// (open files, envelope keys, pending reservations), so they are not
    /// resolved again (a `readlink` per component) on every lookup.
    canon: PathBuf,
    lock: Option<WriterLock>,
    read_only: bool,
    closed: bool,
    /// This open removed the clean-close marker, so closing writes it back.
    marker_taken: bool,
    schema_version: i64,
    integrity: IntegrityCheck,
    migrated_from: Option<i64>,
    warnings: Vec<String>,
    /// The parsed config document; this process is the only writer.
    config_cache: std::cell::RefCell<Option<serde_json::Value>>,
    /// Bumped by every config write, so holders of a parsed copy know when
    /// to refresh it.
    config_rev: std::cell::Cell<u64>,
    /// `PRAGMA data_version` when the config was cached: another
    /// connection of this process (a sibling) committed when it changes.
    data_version: std::cell::Cell<i64>,
    /// Change counters of the files and inbox tables.
    revs: revs::Revs,
    /// One data-version answer for the reads of a turn step.
    view: revs::View,
    /// Frames in the WAL after the last commit, when checkpoints are left
    /// to `checkpoint_if_due` (`defer_checkpoints`).
    wal_frames: Option<std::sync::Arc<std::sync::atomic::AtomicU32>>,
    /// The file's size and times when it was parked (see `park`).
    parked_sig: Option<FileSig>,
    /// Spend recorded with the next write (`spend_defer`).
    pending_spend: Vec<spend::Pending>,
    /// A read transaction is held open (`begin_reading`).
    reading: std::cell::Cell<bool>,
    /// What each scope spent, as of a UTC day, once read: the holder of
    /// the lock is the only writer, so a budget check is a lookup.
    spent_memo: std::sync::Mutex<std::collections::HashMap<String, (String, spend::Spent)>>,
}

/// Write the clean-close marker (the time of the close).
fn put_marker(conn: &Connection, path: &Path) -> Result<()> {
    conn.execute(
        "INSERT INTO adf_meta(key, value, protection) VALUES ('adf_clean_close', ?1, 'readonly')
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        [now_iso()],
    )
    .map(|_| ())
    .at(path)
}

/// Rolls back an open transaction when dropped (after a commit there is
/// none, and nothing happens).
struct RollbackGuard<'a>(&'a Connection);

impl Drop for RollbackGuard<'_> {
    fn drop(&mut self) {
        if !self.0.is_autocommit() {
            let _ = self.0.execute_batch("ROLLBACK");
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).field("read_only", &self.read_only).finish()
    }
}

const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// A path for a `file:` URI: `%`, `?` and `#` percent-encoded.
fn uri_path(path: &Path) -> String {
    let raw = path.to_string_lossy();
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        match c {
            '%' => out.push_str("%25"),
            '?' => out.push_str("%3f"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
    }
    out
}

fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Check the file looks like a whole SQLite database before SQLite touches
/// it, so foreign and truncated files are refused without a single write.
/// `canon` is the file's `canonical` path.
fn sniff(path: &Path, canon: &Path) -> Result<()> {
    if is_open_here(canon) {
        // Already open in this process, so already checked; reading it
        // through a new descriptor would drop SQLite's locks when closed.
        return Ok(());
    }
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => StoreError::NotFound { path: path.to_path_buf() },
        _ => StoreError::Io { path: path.to_path_buf(), source: e },
    })?;
    if meta.is_dir() {
        return Err(StoreError::Invalid(format!("{}: is a directory, not an agent file", path.display())));
    }
    let mut header = [0u8; 100];
    let mut f = std::fs::File::open(path).at(path)?;
    let n = read_up_to(&mut f, &mut header).at(path)?;
    if n == 0 {
        return Err(StoreError::NotAgent { path: path.to_path_buf() });
    }
    if n < 100 || &header[..16] != SQLITE_MAGIC {
        return Err(StoreError::NotSqlite {
            path: path.to_path_buf(),
            detail: if n < 100 && header[..n.min(16)] == SQLITE_MAGIC[..n.min(16)] {
                "header is cut short".into()
            } else {
                "no SQLite header".into()
            },
        });
    }
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65536u64,
        n => n as u64,
    };
    let pages = u32::from_be_bytes([header[28], header[29], header[30], header[31]]) as u64;
    let counter_valid = header[24..28] == header[92..96];
    // A checkpoint cut short (a crash, a full disk) writes the new header
    // before the pages that follow it; the WAL still holds them all and
    // SQLite replays it, so only a file without a WAL is truly short.
    let wal_len = std::fs::metadata(sidecar(path, "-wal")).map(|m| m.len()).unwrap_or(0);
    if counter_valid && pages > 0 && meta.len() < pages * page_size && wal_len == 0 {
        return Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: format!(
                "file is truncated: {} bytes on disk, its header says {} pages of {} bytes",
                meta.len(),
                pages,
                page_size
            ),
        });
    }
    Ok(())
}

fn read_up_to(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn has_table(conn: &Connection, path: &Path, name: &str) -> Result<bool> {
    conn.query_row("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1", [name], |_| Ok(()))
        .optional()
        .at(path)
        .map(|o| o.is_some())
}

fn run_check(conn: &Connection, path: &Path, pragma: &str) -> Result<Option<Vec<String>>> {
    let mut stmt = conn.prepare(&format!("PRAGMA {pragma}")).at(path)?;
    let rows: Vec<String> = stmt.query_map([], |r| r.get(0)).at(path)?.collect::<rusqlite::Result<_>>().at(path)?;
    if rows.len() == 1 && rows[0] == "ok" {
        return Ok(None);
    }
    // One problem a line; SQLite heads each database's list with a banner.
    Ok(Some(
        rows.iter()
            .flat_map(|r| r.lines())
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("*** in database"))
            .map(String::from)
            .collect(),
    ))
}

/// A damage report in one line: how many problems, the first, and what to
/// do (the full list is what `adf repair --check` prints).
pub(crate) fn damage_line(path: &Path, pragma: &str, problems: &[String]) -> String {
    let first = problems.first().map(String::as_str).unwrap_or("no detail");
    let first: String = first.chars().take(160).collect();
    let n = problems.len();
    let more = if n > 1 { format!(" and {} more", n - 1) } else { String::new() };
    format!(
        "{pragma} found {n} problem{} ({first}{more}); the file was not changed: `adf repair {}` keeps the original and recovers what it can (`adf repair --check` lists every problem)",
        if n == 1 { "" } else { "s" },
        path.display()
    )
}

impl Store {
    /// Open an existing agent file for writing (this process becomes its
    /// one writer).
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        Self::open_with(path, OpenOptions::default())
    }

    pub fn open_with(path: impl AsRef<Path>, opts: OpenOptions) -> Result<Store> {
        let path = path.as_ref().to_path_buf();
        let canon = canonical(&path);
        Self::open_inner(path, canon, opts)
    }

    /// `open`, for a caller that resolved the path already (`canon` must be
    /// `canonical(path)`): the fleet's load, which checked it against its
    /// loaded files.
    pub(crate) fn open_resolved(path: &Path, canon: PathBuf) -> Result<Store> {
        Self::open_inner(path.to_path_buf(), canon, OpenOptions::default())
    }

    fn open_inner(path: PathBuf, canon: PathBuf, opts: OpenOptions) -> Result<Store> {
        sniff(&path, &canon)?;
        let lock = WriterLock::acquire(&path)?;
        let sidecars = sidecar(&path, "-wal").exists() || sidecar(&path, "-shm").exists();
        let conn = conn::connect(&path, false, false)?;
        register(&canon);
        let registered = Registered(Some(canon.clone()));
        if !has_table(&conn, &path, "adf_meta")? {
            return Err(StoreError::NotAgent { path });
        }
        conn::apply_pragmas(&conn, &path, false)?;
        let marker: Option<String> = conn
            .query_row("SELECT value FROM adf_meta WHERE key = 'adf_clean_close'", [], |r| r.get(0))
            .optional()
            .at(&path)?;
        let integrity = if opts.force_integrity || marker.is_none() {
            IntegrityCheck::Full
        } else if sidecars {
            IntegrityCheck::Quick
        } else {
            IntegrityCheck::Skipped
        };
        let pragma = match integrity {
            IntegrityCheck::Full => Some("integrity_check"),
            IntegrityCheck::Quick => Some("quick_check"),
            IntegrityCheck::Skipped => None,
        };
        let warnings = Vec::new();
        if let Some(pragma) = pragma {
            // Repair is the owner's explicit step (`adf repair`), never a
            // side effect of opening: it must not cost the original.
            let problems = match run_check(&conn, &path, pragma) {
                Ok(p) => p,
                Err(StoreError::Corrupt { detail, .. }) => Some(vec![detail]),
                Err(e) => return Err(e),
            };
            if let Some(problems) = problems {
                return Err(StoreError::Corrupt { detail: damage_line(&path, pragma, &problems), path });
            }
        }
        registered.disarm();
        let mut store = Store {
            conn: conn.into(),
            path,
            canon,
            lock: Some(lock),
            read_only: false,
            closed: false,
            marker_taken: false,
            schema_version: 0,
            integrity,
            migrated_from: None,
            warnings,
            config_cache: Default::default(),
            config_rev: Default::default(),
            data_version: Default::default(),
            revs: Default::default(),
            view: Default::default(),
            wal_frames: None,
            parked_sig: None,
            pending_spend: Vec::new(),
            reading: Default::default(),
            spent_memo: Default::default(),
        };
        // A version that is not a number is no version this adf can climb
        // from: migrating it "from 0" would rewrite a file it does not know.
        if let Some((key, text)) = schema::version_text(store.conn()).at(&store.path)?
            && text.trim().parse::<i64>().is_err()
        {
            return Err(StoreError::Invalid(format!(
                "{}: adf_meta.{key} is {text:?}, not a schema version; adf will not migrate it (the file was not changed)",
                store.path.display()
            )));
        }
        // A file that was not closed cleanly gets its marker back on close,
        // now that it has been checked.
        store.marker_taken = marker.is_none();
        let version = schema::read_version(store.conn()).at(&store.path)?;
        store.schema_version = version;
        if version < ADF_SCHEMA_VERSION {
            // The marker goes in the migration's own transaction, so a failed
            // migration leaves the file exactly as it was.
            return store.migrate(version).map(|()| store);
        }
        if version > ADF_SCHEMA_VERSION {
            store.warnings.push(format!(
                "{}: schema version {version} is newer than {ADF_SCHEMA_VERSION}, which this adf knows; opened without migration",
                store.path.display()
            ));
        } else {
            if schema::identity_keys_loose(store.conn()).at(&store.path)? {
                store.touch()?;
                schema::force_identity_readonly(store.conn()).at(&store.path)?;
            }
        }
        Ok(store)
    }

    /// Open without taking the writer lock: no marker change, no migration,
    /// every write refused. Works while another process holds the file.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Store> {
        let path = path.as_ref().to_path_buf();
        let canon = canonical(&path);
        sniff(&path, &canon)?;
        // Sidecars already there belong to a writer (or a crash): read
        // through them and leave them be. Without them a read-only handle
        // would create a -wal and -shm it can never remove; a read-write
        // handle that cannot write (query_only) removes them when it closes
        // as the last connection, so a read leaves the folder as it was.
        let sidecars = sidecar(&path, "-wal").exists() || sidecar(&path, "-shm").exists();
        let tidy = !sidecars && !is_open_here(&canon);
        let checked = |c: Connection| -> Result<Connection> {
            if tidy {
                c.pragma_update(None, "query_only", true).at(&path)?;
            }
            has_table(&c, &path, "adf_meta").map(|_| c)
        };
        let conn = match conn::connect(&path, false, !tidy).and_then(checked) {
            Ok(c) => c,
            Err(_) => {
                // A read-only folder cannot hold the -shm file of a WAL
                // database: read the file as immutable instead.
                let uri = format!("file:{}?immutable=1", uri_path(&path));
                conn::connect(Path::new(&uri), false, true)?
            }
        };
        register(&canon);
        let registered = Registered(Some(canon.clone()));
        if !has_table(&conn, &path, "adf_meta")? {
            return Err(StoreError::NotAgent { path });
        }
        conn::apply_pragmas(&conn, &path, true)?;
        let version = schema::read_version(&conn).at(&path)?;
        registered.disarm();
        let mut warnings = Vec::new();
        if version > ADF_SCHEMA_VERSION {
            warnings.push(format!(
                "{}: schema version {version} is newer than {ADF_SCHEMA_VERSION}, which this adf knows; read without migration",
                path.display()
            ));
        } else if version < ADF_SCHEMA_VERSION {
            warnings.push(format!(
                "{}: schema version {version} is older than {ADF_SCHEMA_VERSION}; read as it is (opening it for writing migrates it)",
                path.display()
            ));
        }
        Ok(Store {
            conn: conn.into(),
            path,
            canon,
            lock: None,
            read_only: true,
            closed: false,
            marker_taken: false,
            schema_version: version,
            integrity: IntegrityCheck::Skipped,
            migrated_from: None,
            warnings,
            config_cache: Default::default(),
            config_rev: Default::default(),
            data_version: Default::default(),
            revs: Default::default(),
            view: Default::default(),
            wal_frames: None,
            parked_sig: None,
            pending_spend: Vec::new(),
            reading: Default::default(),
            spent_memo: Default::default(),
        })
    }

    /// A second connection to a file this process holds open for writing:
    /// code running beside the agent's turn (system-scope lambdas) writes
    /// through it. It shares the writer lock of the first, never migrates
    /// and leaves the clean-close marker alone; SQLite's WAL and busy
    /// timeout order the writes.
    pub fn sibling(path: &Path) -> Result<Store> {
        let canon = canonical(path);
        if !is_open_here(&canon) {
            return Err(StoreError::Invalid(format!("{}: not open for writing in this process", path.display())));
        }
        let conn = conn::connect(path, false, false)?;
        conn::apply_pragmas(&conn, path, false)?;
        let version = schema::read_version(&conn).at(path)?;
        register(&canon);
        Ok(Store {
            conn: conn.into(),
            path: path.to_path_buf(),
            canon,
            lock: None,
            read_only: false,
            closed: false,
            marker_taken: false,
            schema_version: version,
            integrity: IntegrityCheck::Skipped,
            migrated_from: None,
            warnings: Vec::new(),
            config_cache: Default::default(),
            config_rev: Default::default(),
            data_version: Default::default(),
            revs: Default::default(),
            view: Default::default(),
            wal_frames: None,
            parked_sig: None,
            pending_spend: Vec::new(),
            reading: Default::default(),
            spent_memo: Default::default(),
        })
    }

    fn migrate(&mut self, from: i64) -> Result<()> {
        let bak = sidecar(&self.path, ".bak");
        backup_to(self.conn(), &self.path, &bak)?;
        let path = self.path.clone();
        let outcome = (|| -> Result<std::result::Result<(), schema::StepFailure>> {
            let tx = self.conn_mut().transaction_with_behavior(TransactionBehavior::Immediate).at(&path)?;
            tx.execute("DELETE FROM adf_meta WHERE key = 'adf_clean_close'", []).at(&path)?;
            match schema::migrate(&tx, from) {
                Ok(()) => {
                    tx.commit().at(&path)?;
                    Ok(Ok(()))
                }
                Err(f) => Ok(Err(f)),
            }
        })()?;
        match outcome {
            Ok(()) => {
                let _ = std::fs::remove_file(&bak);
                self.marker_taken = true;
                self.migrated_from = Some(from);
                self.schema_version = ADF_SCHEMA_VERSION;
                Ok(())
            }
            Err(f) => Err(StoreError::Migration {
                path: self.path.clone(),
                version: f.version,
                detail: f.detail,
                backup: bak,
            }),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's path resolved when it was opened (see `canon`).
    pub(crate) fn canonical_path(&self) -> &Path {
        &self.canon
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    pub fn schema_version(&self) -> i64 {
        self.schema_version
    }

    pub fn integrity_check(&self) -> IntegrityCheck {
        self.integrity
    }

    /// The schema version the file was migrated from during this open.
    pub fn migrated_from(&self) -> Option<i64> {
        self.migrated_from
    }

    /// Warnings raised while opening (newer schema, advisory config issues…).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Bring adf's own `adfrs_*` tables up to date; features that store
    /// something beyond the ADF schema call this before their first write,
    /// so files that never need them (the reference's) stay untouched.
    pub fn ensure_own_schema(&mut self) -> Result<()> {
        if schema::own_is_current(self.conn()).at(&self.path)? {
            return Ok(());
        }
        let path = self.path.clone();
        self.write(|tx| schema::migrate_own(tx).at(&path))
    }

    /// Runtime-managed meta (`adf_*`, `runtime_*`): plain upsert, the
    /// protection applies only when the key is created.
    pub fn set_system_meta(&mut self, key: &str, value: &str, protection: meta::MetaProtection) -> Result<()> {
        let path = self.path.clone();
        self.write(|tx| Store::meta_put_system(tx, key, value, protection).at(&path))
    }

    /// Append a row to `adf_logs`.
    pub fn log(&mut self, level: &str, origin: &str, event: &str, message: &str) -> Result<()> {
        let path = self.path.clone();
        self.write(|tx| logs::insert(tx, level, origin, event, None, message).map(|_| ()).at(&path))
    }

    /// Give back what SQLite caches for this connection and can drop (an
    /// agent going idle; the file stays open).
    pub fn release_memory(&self) {
        // SAFETY: the handle is valid while `self` lives.
        unsafe {
            rusqlite::ffi::sqlite3_db_release_memory(self.conn().handle());
        }
        self.conn().flush_prepared_statement_cache();
    }

    /// The revision of a table the executor derives text from: equal
    /// numbers mean no row of it changed in between.
    pub fn rev(&mut self, table: revs::Table) -> u64 {
        let dv = self.view.data_version(self.conn());
        match self.conn.get_mut() {
            Some(c) => self.revs.rev(c, dv, table),
            None => u64::MAX,
        }
    }

    /// Hold one view of what other connections committed for a run of
    /// reads (`true`), or let every read ask again (`false`): see
    /// `revs::View`. A hold is for a short stretch of reads with no wait
    /// in it, such as a turn step's up to its model call.
    pub fn hold_view(&self, on: bool) {
        self.view.hold(on);
    }

    /// Hold one read transaction over a stretch of reads with no wait in
    /// it (a load's): otherwise each statement is a read transaction of its
    /// own, taking and giving back a lock of the WAL index (two `fcntl`s)
    /// and looking at its header. The reads see one snapshot of the file.
    /// `end_reading`, a write, a park or the close let it go.
    pub fn begin_reading(&self) -> Result<()> {
        let conn = self.conn();
        if self.reading.get() || !conn.is_autocommit() {
            return Ok(());
        }
        conn.prepare_cached("BEGIN").and_then(|mut st| st.execute([])).at(&self.path)?;
        self.reading.set(true);
        Ok(())
    }

    /// Let go of the read transaction of `begin_reading` (a no-op without
    /// one). Ending a transaction that only read cannot fail in a way that
    /// loses anything; SQLite rolls it back when the connection closes.
    pub fn end_reading(&self) {
        if self.reading.replace(false)
            && let Some(conn) = self.conn.get()
            && !conn.is_autocommit()
        {
            let _ = conn.prepare_cached("COMMIT").and_then(|mut st| st.execute([]));
        }
    }

    /// The current value of a pragma on this file's connection.
    pub fn pragma(&self, name: &str) -> Result<String> {
        pragma_text(self.conn(), name)
    }

    /// Direct access for read queries inside the crate.
    pub(crate) fn conn(&self) -> &Connection {
        self.conn.get_or_init(|| self.reopen())
    }

    pub(crate) fn conn_mut(&mut self) -> &mut Connection {
        self.conn();
        match self.conn.get_mut() {
            Some(c) => c,
            None => unreachable!("initialised just above"),
        }
    }

    pub(crate) fn writable(&self) -> Result<()> {
        if self.read_only { Err(StoreError::ReadOnly { path: self.path.clone() }) } else { Ok(()) }
    }

    /// Call before the first write of a session: removes the clean-close
    /// marker (committed before the write itself, so a crash in between
    /// only costs an integrity check). The reference removes it on open;
    /// adf waits for the first write, so a session that only reads, or a
    /// command that fails, leaves the file byte-for-byte unchanged.
    pub(crate) fn touch(&mut self) -> Result<()> {
        self.writable()?;
        if !self.marker_taken {
            self.conn().execute("DELETE FROM adf_meta WHERE key = 'adf_clean_close'", []).at(&self.path)?;
            self.marker_taken = true;
        }
        Ok(())
    }

    /// Run `f` in an IMMEDIATE transaction; commit on `Ok`, roll back on
    /// `Err`. `BEGIN` and `COMMIT` are cached statements: a turn commits
    /// a few times, and parsing them each time was a measurable part of it.
    pub(crate) fn write<T>(&mut self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        self.writable()?;
        self.end_reading();
        let take_marker = !self.marker_taken;
        let conn = self.conn.get_or_init(|| self.reopen());
        let path = &self.path;
        let step = |sql: &str| conn.prepare_cached(sql).and_then(|mut st| st.execute([])).map(|_| ()).at(path);
        step("BEGIN IMMEDIATE")?;
        // Rolls back on every way out but a commit (an error, a panic).
        let guard = RollbackGuard(conn);
        if take_marker {
            // In the same transaction: a write that fails changes nothing.
            conn.prepare_cached("DELETE FROM adf_meta WHERE key = 'adf_clean_close'")
                .and_then(|mut st| st.execute([]))
                .at(path)?;
        }
        // Spend deferred since the last write commits with this one.
        let pending = std::mem::take(&mut self.pending_spend);
        let done = f(conn).and_then(|out| spend::apply(conn, &pending).at(path).map(|()| out));
        let out = match done {
            Ok(out) => out,
            Err(e) => {
                self.pending_spend = pending;
                return Err(e);
            }
        };
        if let Err(e) = step("COMMIT") {
            // What was spent may or may not be in the file: read it again.
            self.spent_memo.lock().unwrap_or_else(|p| p.into_inner()).clear();
            return Err(e);
        }
        drop(guard);
        self.marker_taken = true;
        Ok(out)
    }

    /// Close cleanly: write the clean-close marker as the last write, let
    /// SQLite checkpoint the WAL into the file, release the writer lock.
    pub fn close(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.end_reading();
        if self.conn.get().is_some() {
            self.flush_spend()?;
        }
        let untouched = self.parked_untouched();
        self.closed = true;
        let Some(conn) = self.conn.take() else {
            // Parked: the marker was written when it parked, but a sibling
            // that wrote since may have taken it; put it back. A file no
            // one wrote to is opened only to let SQLite fold the park's
            // frames back (the bytes already there) and remove the WAL and
            // index the park kept (it does as the last connection closes).
            // A file moved away or replaced loses them first
            // (`drop_stale_wal`): the frames are a page of the file as it
            // was, and the file is whole without them.
            self.drop_stale_wal();
            if untouched {
                let kept = sidecar(&self.path, "-wal").exists() || sidecar(&self.path, "-shm").exists();
                if kept && self.path.exists() {
                    let _ = park::tidy(&self.path);
                }
                unregister(&self.canon);
                self.lock.take();
                return Ok(());
            }
            let marked = conn::open(&self.path, false, false).and_then(|c| {
                put_marker(&c, &self.path)?;
                c.close().map_err(|(_, e)| classify(&self.path, e))
            });
            unregister(&self.canon);
            self.lock.take();
            return marked;
        };
        // Only the connection holding the writer lock says the file was
        // closed cleanly; a sibling closes while its first is still open.
        if self.marker_taken && self.lock.is_some() {
            put_marker(&conn, &self.path)?;
        }
        let closed = conn.close().map_err(|(_, e)| classify(&self.path, e));
        unregister(&self.canon);
        self.lock.take();
        closed
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Copy the database with SQLite's online backup (after a TRUNCATE
/// checkpoint). A stale backup is renamed aside, never overwritten.
fn backup_to(conn: &Connection, path: &Path, bak: &Path) -> Result<()> {
    if bak.exists() {
        let aside = sidecar(path, &format!(".bak.{}", now_ms()));
        std::fs::rename(bak, &aside).at(bak)?;
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).at(path)?;
    conn.backup(rusqlite::MAIN_DB, bak, None::<fn(rusqlite::backup::Progress)>).at(bak)?;
    Ok(())
}
