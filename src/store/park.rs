//! Idle agents give their SQLite connection back (`park`) and open it
//! again on the next use, and WAL checkpoints wait for the actor between
//! turns instead of landing in a turn's commit. A parked store keeps its
//! file (writer lock, clean-close marker, place in the process) and can
//! tell, from two `stat`s, whether another connection wrote meanwhile.

use std::path::Path;

use rusqlite::Connection;

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
    /// (schema, caches, the WAL index) is given back, and the next use
    /// opens it again. The clean-close marker is written first, so a crash
    /// while parked costs no integrity check. `false` when there was
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
    /// holds `WAL_CHECKPOINT_FRAMES` frames; `true` when it ran.
    pub fn checkpoint_if_due(&mut self) -> Result<bool> {
        if !self.checkpoint_due() {
            return Ok(false);
        }
        self.conn().query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())).at(&self.path)?;
        if let Some(f) = &self.wal_frames {
            f.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(true)
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
        let mut c = conn::open(&self.path, false, false)?;
        if let Some(f) = &self.wal_frames {
            install_wal_hook(&mut c, f).at(&self.path)?;
        }
        Ok(c)
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

/// Size and modification time of a file and of its WAL: another
/// connection's commit changes one of them.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct FileSig([Option<(u64, std::time::SystemTime)>; 2]);

impl FileSig {
    pub(super) fn of(path: &Path) -> Self {
        let stat = |p: &Path| std::fs::metadata(p).ok().and_then(|m| Some((m.len(), m.modified().ok()?)));
        FileSig([stat(path), stat(&sidecar(path, "-wal"))])
    }
}
