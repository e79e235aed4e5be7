//! The files this process has open, by canonical path. Closing any
//! descriptor of a file drops every POSIX lock the process holds on it,
//! SQLite's included, so an open must know whether another `Store` here is
//! using the file before it reads the header through a descriptor of its
//! own. A count per file: several connections (siblings) may hold one.

use std::path::{Path, PathBuf};

/// Connections per file. A map, so a fleet of thousands opens a file
/// without scanning them all.
static OPEN_FILES: std::sync::Mutex<Option<std::collections::HashMap<PathBuf, usize>>> = std::sync::Mutex::new(None);

/// The path with its links and `..` resolved, or as given when it cannot
/// be (the key of every process-wide map of files).
pub(crate) fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Count one more connection of this process to the file at `canon` (a
/// path from `canonical`, as are the next two functions').
pub(super) fn register(canon: &Path) {
    if let Ok(mut open) = OPEN_FILES.lock() {
        *open.get_or_insert_with(Default::default).entry(canon.to_path_buf()).or_insert(0) += 1;
    }
}

pub(super) fn unregister(canon: &Path) {
    if let Ok(mut open) = OPEN_FILES.lock()
        && let Some(map) = open.as_mut()
        && let Some(n) = map.get_mut(canon)
    {
        *n -= 1;
        if *n == 0 {
            map.remove(canon);
        }
    }
}

/// How many connections of this process hold the file at `canon`.
pub(super) fn open_here(canon: &Path) -> usize {
    OPEN_FILES.lock().map(|open| open.as_ref().and_then(|m| m.get(canon).copied()).unwrap_or(0)).unwrap_or(0)
}

pub(super) fn is_open_here(canon: &Path) -> bool {
    open_here(canon) > 0
}

/// Unregisters a path if an open fails before the `Store` exists.
pub(super) struct Registered(pub(super) Option<PathBuf>);

impl Registered {
    /// The `Store` now owns the registration.
    pub(super) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            unregister(p);
        }
    }
}
