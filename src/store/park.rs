//! Idle agents give their SQLite connection back (`park`) and open it
//! again on the next use, and WAL checkpoints wait for the actor between
//! pieces of its work (turns, owner writes) instead of landing in a turn's
//! commit. A parked store keeps its
//! file (writer lock, clean-close marker, place in the process) and its WAL
//! and WAL index, checkpointed and begun again with frames that change
//! nothing (so the file alone is still the whole agent, and waking makes no
//! files and syncs nothing), and can tell, from two `stat`s, whether
//! another connection wrote meanwhile.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension};

use super::error::{Ctx, classify};
use super::{Result, Store, conn, put_marker, sidecar};

/// WAL frames after which a deferred checkpoint runs (SQLite's own
/// automatic threshold).
pub const WAL_CHECKPOINT_FRAMES: u32 = 1000;

/// Count the WAL's frames after each commit; a connection with this hook
/// makes no automatic checkpoint (the hook replaces SQLite's).
pub(super) fn install_wal_hook(
    conn: &mut Connection,
    frames: &std::sync::Arc<std::sync::atomic::AtomicU32>,
) -> rusqlite::Result<()> {
    let f = frames.clone();
    conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: std::ffi::c_int| {
        f.store(pages.max(0) as u32, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }))
}

impl Store {
    /// Close the connection of an idle agent and keep the file (its writer
    /// lock, its place in this process): everything SQLite held for it
    /// (schema, caches, the mapped WAL index) is given back, and the next
    /// use opens it again; the WAL and index files stay, emptied
    /// (`keep_wal_on_close`). The clean-close marker is written first, so a crash
    /// while parked costs no full integrity check. `false` when there was
    /// nothing to park (a sibling, a read-only or closed store, or one
    /// already parked).
    pub fn park(&mut self) -> Result<bool> {
        if self.closed || self.read_only || self.lock.is_none() {
            return Ok(false);
        }
        self.end_reading();
        self.flush_spend()?;
        let Some(conn) = self.conn.take() else { return Ok(false) };
        if self.marker_taken
            && let Err(e) = put_marker(&conn, &self.path)
        {
            let _ = self.conn.set(conn);
            return Err(e);
        }
        // Best effort: without it the close empties the WAL (or, failing
        // that too, removes the two).
        if !start_next_wal(&conn, &self.path) {
            let _ = keep_wal_on_close(&conn);
        }
        if let Err((conn, e)) = conn.close() {
            let _ = self.conn.set(conn);
            return Err(classify(&self.path, e));
        }
        self.marker_taken = false;
        self.parked_sig = Some(FileSig::of(&self.path));
        self.config_cache.borrow_mut().take();
        self.config_rev.set(self.config_rev.get() + 1);
        self.data_version.set(0);
        self.revs.park();
        self.view.hold(false);
        Ok(true)
    }

    /// Leave WAL checkpoints to `checkpoint_if_due` instead of the commit
    /// that crosses SQLite's threshold (a checkpoint syncs the file: an
    /// agent's turn should not wait for one). Only the writer's own
    /// connection; a sibling keeps SQLite's automatic checkpoints.
    pub fn defer_checkpoints(&mut self) -> Result<()> {
        if self.lock.is_none() || self.read_only || self.wal_frames.is_some() {
            return Ok(());
        }
        let frames = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let path = self.path.clone();
        install_wal_hook(self.conn_mut(), &frames).at(&path)?;
        self.wal_frames = Some(frames);
        Ok(())
    }

    /// Whether `checkpoint_if_due` has work (cheap: no SQL).
    pub fn checkpoint_due(&self) -> bool {
        self.wal_frames.as_ref().is_some_and(|f| f.load(std::sync::atomic::Ordering::Relaxed) >= WAL_CHECKPOINT_FRAMES)
            && !self.is_parked()
    }

    /// Checkpoint the WAL (PASSIVE: readers are never waited for) once it
    /// holds `WAL_CHECKPOINT_FRAMES` frames, and when that folded all of it
    /// into the file, begin the WAL's next generation now (`begin_next_wal`);
    /// `true` when the checkpoint ran.
    pub fn checkpoint_if_due(&mut self) -> Result<bool> {
        if !self.checkpoint_due() {
            return Ok(false);
        }
        let folded = checkpoint_whole(self.conn()).at(&self.path);
        // Tried: a failed checkpoint is tried again after as many frames
        // more, not after every piece of work.
        if let Some(f) = &self.wal_frames {
            f.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        if folded? {
            self.begin_next_wal()?;
        }
        Ok(true)
    }

    /// Begin the WAL's next generation with a commit that changes nothing a
    /// reader sees (the file's user version written as it is: one frame of
    /// its first page), right after a checkpoint that folded the whole WAL
    /// into the file. SQLite begins a generation in the first commit after
    /// such a checkpoint, writing the WAL's header and syncing it: here,
    /// between pieces of the actor's work, instead of inside the next turn's
    /// commit. When a reader elsewhere still holds the old generation, the
    /// frame is appended and nothing else happens.
    fn begin_next_wal(&mut self) -> Result<()> {
        let conn = self.conn();
        let v: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).at(&self.path)?;
        conn.pragma_update(None, "user_version", v).at(&self.path)
    }

    /// Whether the connection is parked (closed until the next use).
    pub fn is_parked(&self) -> bool {
        !self.closed && self.conn.get().is_none()
    }

    /// Whether the store is parked and no connection wrote to its file
    /// since (the file's and the WAL's size and times are as they were):
    /// a check of two `stat`s, no SQL.
    pub fn parked_untouched(&self) -> bool {
        self.is_parked() && self.parked_sig.as_ref().is_some_and(|s| *s == FileSig::of(&self.path))
    }

    /// Open the connection of a parked store now, so a failure is an error
    /// here rather than a failed query later.
    pub fn unpark(&mut self) -> Result<()> {
        if self.is_parked() {
            let c = self.open_again()?;
            let _ = self.conn.set(c);
        }
        Ok(())
    }

    /// The file's connection opened again, set up as the first was
    /// (pragmas; the WAL hook that leaves checkpoints to the actor).
    fn open_again(&self) -> Result<Connection> {
        self.drop_stale_wal();
        let mut c = conn::open(&self.path, false, false)?;
        if let Some(f) = &self.wal_frames {
            install_wal_hook(&mut c, f).at(&self.path)?;
        }
        Ok(c)
    }

    /// Remove the WAL and index a park kept when the file itself changed
    /// while they did not: every write through SQLite touches the WAL
    /// first, so the file was replaced or written over from outside (a
    /// copy put in its place), and the park's frames, a page of the file as
    /// it was, must not be laid over what is there now. Not while a
    /// sibling here has the two open (it is using them; removing them
    /// under it would split the file's readers and writers).
    pub(super) fn drop_stale_wal(&self) {
        let Some(then) = &self.parked_sig else { return };
        if super::registry::open_here(&self.canon) > 1 {
            return;
        }
        let now = FileSig::of(&self.path);
        if now.0[1].is_some() && now.0[1] == then.0[1] && now.0[0] != then.0[0] {
            for s in ["-wal", "-shm"] {
                let _ = std::fs::remove_file(sidecar(&self.path, s));
            }
        }
    }

    /// A connection for a store whose own is gone: a parked store's file
    /// opened again, else (closed, or the file could not be opened) an
    /// empty in-memory database, on which every query fails with SQLite's
    /// own error instead of a panic.
    pub(super) fn reopen(&self) -> Connection {
        if !self.closed {
            match self.open_again() {
                Ok(c) => return c,
                Err(e) => eprintln!("adf: {}: could not open the file again: {e}", self.path.display()),
            }
        }
        Connection::open_in_memory().unwrap_or_else(|e| panic!("SQLite cannot open an in-memory database: {e}"))
    }
}

/// Checkpoint the WAL (PASSIVE: readers are never waited for); `true` when
/// that folded every frame into the file, so the next commit begins the
/// WAL's next generation (no reader kept a frame from the checkpoint).
fn checkpoint_whole(conn: &Connection) -> rusqlite::Result<bool> {
    let (busy, log, done): (i64, i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    Ok(busy == 0 && log == done)
}

/// Bytes of the WAL a park begins: its header (32) and two frames, each a
/// frame header (24) and a page.
fn begun_wal(page: u64) -> u64 {
    32 + 2 * (24 + page)
}

/// Checkpoint the whole WAL into the file and begin the WAL's next
/// generation now, and close without checkpointing what it holds: the
/// woken agent's first write then appends to a WAL already begun instead of
/// writing and syncing a new WAL's header (and the folder) in its turn.
/// What it holds changes nothing: the clean-close marker set to another
/// value of the same length and back, two frames of its page, the second
/// byte for byte the page in the file. So the file alone still holds
/// everything (a copy of it is the whole agent), and folding the frames
/// back at the close writes the bytes already there. `false` (nothing
/// changed that matters) when a reader kept the checkpoint from finishing
/// or the WAL could not begin again, and the close then checkpoints as it
/// always did.
fn start_next_wal(conn: &Connection, path: &Path) -> bool {
    let started = || -> rusqlite::Result<bool> {
        const SET: &str = "UPDATE adf_meta SET value = ?1 WHERE key = 'adf_clean_close'";
        let Some(mark) = conn
            .query_row("SELECT value FROM adf_meta WHERE key = 'adf_clean_close'", [], |r| r.get::<_, String>(0))
            .optional()?
        else {
            return Ok(false);
        };
        // Same length, so the row is rewritten in place.
        let Some(head) = mark.strip_suffix(|c: char| c.is_ascii()) else { return Ok(false) };
        let other = format!("{head}{}", if mark.ends_with('x') { 'y' } else { 'x' });
        // The restart's commit cuts the file to what the new generation holds.
        conn.pragma_update(None, "journal_size_limit", 0)?;
        if !checkpoint_whole(conn)? {
            return Ok(false);
        }
        conn.execute(SET, [&other])?;
        conn.execute(SET, [&mark])?;
        let page: u32 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
        // Two frames mean the WAL began again (a reader in another
        // connection keeps it from doing so, and the frames were appended).
        let len = std::fs::metadata(sidecar(path, "-wal")).map(|m| m.len()).unwrap_or(0);
        Ok(len == begun_wal(page.into()))
    };
    if !started().unwrap_or(false) {
        return false;
    }
    // SAFETY: the handle is this open connection's; the option takes an
    // int and a nullable out-pointer.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_db_config(
            conn.handle(),
            rusqlite::ffi::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            1i32,
            std::ptr::null_mut::<std::ffi::c_int>(),
        )
    };
    rc == rusqlite::ffi::SQLITE_OK
}

/// Let closing `conn` keep the file's WAL (checkpointed and emptied) and
/// its index instead of removing them, when it is the file's last
/// connection. A parked store's next use then opens the two instead of
/// creating them (two file creations, and the folder synced with the WAL's
/// first write); the store's close lets SQLite remove them.
fn keep_wal_on_close(conn: &Connection) -> rusqlite::Result<()> {
    // The kept WAL is truncated to nothing as the connection closes.
    conn.pragma_update(None, "journal_size_limit", 0)?;
    let mut on: std::ffi::c_int = 1;
    // SAFETY: the handle is this open connection's, "main" is a
    // NUL-terminated name, and SQLITE_FCNTL_PERSIST_WAL reads and writes
    // the one int it is given.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            rusqlite::ffi::SQLITE_FCNTL_PERSIST_WAL,
            (&raw mut on).cast(),
        )
    };
    if rc == rusqlite::ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rc), Some("keep the WAL on close".into())))
    }
}

/// Open and close a parked file that no one wrote to, so SQLite (when it
/// holds the file's last connection) removes the WAL and index the park
/// kept. What is written is the park's frames, the bytes already in the
/// file: the file does not change.
pub(super) fn tidy(path: &Path) -> Result<()> {
    // No pragmas: the file's header says WAL. Nothing is synced: no one
    // wrote since the park (the caller saw its files as the park left
    // them), so the WAL holds nothing or the park's frames, which write
    // the bytes already there, and a crash midway leaves the file as it is.
    let c = conn::connect(path, false, false)?;
    c.pragma_update(None, "synchronous", "OFF").at(path)?;
    // A read opens the WAL, which the close then removes.
    c.query_row("PRAGMA schema_version", [], |_| Ok(())).at(path)?;
    c.close().map_err(|(_, e)| classify(path, e))
}

/// Inode, size, modification and change times of a file and of its WAL:
/// another connection's commit changes one of them, and a file replaced
/// or written over changes the first.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct FileSig([Option<Stat>; 2]);

/// What a `stat` says of one file: inode, size, modification and change
/// times (seconds, nanoseconds).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Stat {
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileSig {
    pub(super) fn of(path: &Path) -> Self {
        use std::os::unix::fs::MetadataExt;
        let stat = |p: &Path| {
            std::fs::metadata(p).ok().map(|m| Stat {
                ino: m.ino(),
                len: m.len(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
            })
        };
        FileSig([stat(path), stat(&sidecar(path, "-wal"))])
    }
}
