//! Memory after bursts. 2,000 concurrent loop reads once took the daemon
//! from 68 MB to 1.12 GB, and 922 MB stayed: glibc keeps freed memory in
//! its arenas. The reads are now bounded (a semaphore around SQLite reads,
//! paged queries, a capped blocking pool); what a burst still allocates is
//! handed back by `malloc_trim` once the requests in flight are done.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::conn::{ACTIVE, SERVED};

/// SQLite reads at once: each holds a connection and its rows in memory.
pub fn read_permits() -> usize {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    (cores * 2).clamp(4, 16)
}

/// The blocking pool's ceiling (SQLite reads, file work, `block_in_place`).
pub const MAX_BLOCKING_THREADS: usize = 64;

/// Return freed heap to the OS (glibc only; other allocators do it
/// themselves).
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Trim after each burst: once a second, when requests were answered since
/// the last trim and none is in flight (event streams aside).
pub async fn trimmer(mut closing: tokio::sync::watch::Receiver<bool>) {
    let mut last = SERVED.load(Ordering::Relaxed);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = closing.wait_for(|c| *c) => return,
        }
        let served = SERVED.load(Ordering::Relaxed);
        if served != last && ACTIVE.load(Ordering::Relaxed) == 0 {
            last = served;
            let _ = tokio::task::spawn_blocking(trim).await;
        }
    }
}
