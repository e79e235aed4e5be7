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
