//! The signals that end a session: SIGINT, SIGTERM and SIGHUP (the
//! terminal or the SSH connection went away). Whoever holds agent files
//! waits on them to close every file cleanly (turns checkpointed as
//! interrupted, the clean-close marker written, no sidecar left) instead
//! of dying with the files open.

/// SIGINT, SIGTERM and SIGHUP as one stream of names.
pub struct Stops {
    int: Option<tokio::signal::unix::Signal>,
    term: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
}

impl Stops {
    pub fn new() -> Stops {
        use tokio::signal::unix::{SignalKind, signal};
        Stops {
            int: signal(SignalKind::interrupt()).ok(),
            term: signal(SignalKind::terminate()).ok(),
            hup: signal(SignalKind::hangup()).ok(),
        }
    }

    /// The next of the three to arrive.
    pub async fn next(&mut self) -> &'static str {
        async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        tokio::select! {
            _ = recv(&mut self.int) => "SIGINT",
            _ = recv(&mut self.term) => "SIGTERM",
            _ = recv(&mut self.hup) => "SIGHUP",
        }
    }
}

impl Default for Stops {
    fn default() -> Self {
        Stops::new()
    }
}

/// After a hangup the terminal is gone, and writing to it fails (and
/// `eprintln!` panics on a failed write): point standard input, output and
/// error at `/dev/null` so the clean shutdown that follows can say what it
/// likes.
pub fn detach_from_terminal() {
    use std::os::fd::AsRawFd;
    let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") else { return };
    for fd in 0..3 {
        // SAFETY: dup2 onto the standard descriptors with a valid open fd.
        unsafe {
            libc::dup2(null.as_raw_fd(), fd);
        }
    }
}

/// Whether the controlling terminal has gone (a hangup): its attributes
/// can no longer be read.
pub fn terminal_gone() -> bool {
    // SAFETY: tcgetattr only fills the zeroed struct it is given.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        libc::tcgetattr(1, &mut t) != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EIO)
    }
}
