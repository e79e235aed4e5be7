//! One writer per file. A writer holds an exclusive OS lock on `<file>.lock`
//! beside the agent file, and writes who it is (pid, host, since) into it so
//! that a second process can say who holds the file. The kernel drops the lock
//! when the holder dies, so a stale holder is taken over without guesswork.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{Ctx, Result, StoreError};

/// Who holds (or last held) a file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub host: String,
    pub since: String,
    /// The control API of the holder (a daemon, or the terminal app), so
    /// a command on a held file can go through it instead of failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
}

/// The control API this process serves, named in the lock files it takes.
static API: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Say where this process serves its control API (before it opens the
/// files it will hold).
pub fn set_api(url: &str) {
    let _ = API.set(url.to_string());
}

impl Holder {
    fn me() -> Self {
        Holder {
            pid: std::process::id(),
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            since: super::now_iso(),
            api: API.get().cloned(),
        }
    }
}

/// The lock file's path for an agent file.
pub fn lock_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".lock");
    PathBuf::from(s)
}

/// An acquired writer lock; released (and the lock file removed) on drop.
#[derive(Debug)]
pub struct WriterLock {
    file: File,
    path: PathBuf,
}

impl WriterLock {
    /// Take the writer lock for `agent`, or report who holds it.
    pub fn acquire(agent: &Path) -> Result<Self> {
        let path = lock_path(agent);
        // A holder may unlink the lock file as it releases it; retry when the
        // file we locked is no longer the one at the path.
        for _ in 0..8 {
            let mut file =
                OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).at(&path)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    let holder = read_holder(&mut file).unwrap_or(Holder {
                        pid: 0,
                        host: "unknown".into(),
                        since: "unknown".into(),
                        api: None,
                    });
                    return Err(StoreError::Held {
                        path: agent.to_path_buf(),
                        pid: holder.pid,
                        host: holder.host,
                        since: holder.since,
                        hint: "stop it first, or use its daemon",
                    });
                }
                Err(TryLockError::Error(e)) => return Err(e).at(&path),
            }
            if !same_file(&file, &path) {
                continue;
            }
            let me = serde_json::to_vec(&Holder::me()).unwrap_or_default();
            write_holder(&mut file, &me).at(&path)?;
            return Ok(WriterLock { file, path });
        }
        Err(StoreError::Busy { path: agent.to_path_buf(), detail: "lock file keeps changing".into() })
    }
}

impl Drop for WriterLock {
    fn drop(&mut self) {
        // Unlink while still holding the lock; acquirers re-check the inode.
        let _ = std::fs::remove_file(&self.path);
        let _ = self.file.unlock();
    }
}

/// Who holds `agent` right now, if anyone.
pub fn current_holder(agent: &Path) -> Option<Holder> {
    let path = lock_path(agent);
    let mut file = OpenOptions::new().read(true).write(true).open(&path).ok()?;
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            None
        }
        Err(TryLockError::WouldBlock) => read_holder(&mut file),
        Err(TryLockError::Error(_)) => None,
    }
}

/// Write who holds the lock over what a gone holder left. Truncating to
/// zero first would be simpler, but ext4 then flushes the file as it is
/// closed (its replace-by-truncate heuristic) and the unlink that follows
/// waits for that write and for the discard of its block: most of a
/// read-only open and close. Shrink only what is longer than us.
fn write_holder(file: &mut File, me: &[u8]) -> std::io::Result<()> {
    let old = file.metadata()?.len();
    file.seek(SeekFrom::Start(0))?;
    file.write_all(me)?;
    if old > me.len() as u64 {
        file.set_len(me.len() as u64)?;
    }
    Ok(())
}

fn read_holder(file: &mut File) -> Option<Holder> {
    let mut buf = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut buf).ok()?;
    serde_json::from_str(&buf).ok()
}

#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_file: &File, path: &Path) -> bool {
    path.exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_in_same_process_reports_holder() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("a.adf");
        let first = WriterLock::acquire(&agent).unwrap();
        let err = WriterLock::acquire(&agent).unwrap_err();
        match err {
            StoreError::Held { pid, .. } => assert_eq!(pid, std::process::id()),
            other => panic!("unexpected {other}"),
        }
        assert_eq!(current_holder(&agent).unwrap().pid, std::process::id());
        drop(first);
        assert!(current_holder(&agent).is_none());
        assert!(!lock_path(&agent).exists());
        let _again = WriterLock::acquire(&agent).unwrap();
    }

    #[test]
    fn stale_lock_file_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("a.adf");
        std::fs::write(lock_path(&agent), r#"{"pid":999999,"host":"gone","since":"2020-01-01T00:00:00.000Z"}"#)
            .unwrap();
        let lock = WriterLock::acquire(&agent).unwrap();
        let text = std::fs::read_to_string(lock_path(&agent)).unwrap();
        assert!(text.contains(&std::process::id().to_string()));
        drop(lock);
    }

    #[test]
    fn a_longer_stale_holder_is_cut_to_ours() {
        // Written over in place, not truncated first: what was longer must
        // still be cut, or the holder would not parse.
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("a.adf");
        let long = format!(r#"{{"pid":999999,"host":"{}","since":"2020-01-01T00:00:00.000Z"}}"#, "h".repeat(500));
        std::fs::write(lock_path(&agent), long).unwrap();
        let lock = WriterLock::acquire(&agent).unwrap();
        let text = std::fs::read_to_string(lock_path(&agent)).unwrap();
        assert!(text.len() < 300, "{text}");
        assert_eq!(current_holder(&agent).unwrap().pid, std::process::id());
        drop(lock);
    }
}
