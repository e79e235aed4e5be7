//! An agent's live MCP servers and what an owner sees of them: each
//! configured server is idle (not started yet: servers start at their first
//! tool call), connected, failed (with the reason and its stderr tail) or
//! exited (it went away under us). A server that failed or exited is tried
//! again on the next call, but not before its backoff has run out: a first
//! exit restarts at once, then 1 s, doubling to at most 60 s. The count
//! starts over only once a server has stayed up for `STABLE` (a server that
//! connects and dies at every call still backs off).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use super::client::{ConnectError, Connection};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Idle,
    Connected,
    Failed,
    Exited,
}

/// One server as the owner sees it (`adf mcp ls`, the daemon, the app).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerStatus {
    pub name: String,
    pub state: State,
    /// Tools the server listed at its last connect.
    pub tools: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub stderr_tail: Vec<String>,
    /// Times it was started again after exiting or failing.
    pub restarts: u32,
    /// Failures in a row (the backoff's exponent).
    pub failures: u32,
    /// While backing off: how long until the next attempt may start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_in_ms: Option<u64>,
    /// When it reached this state (Unix ms).
    pub since_ms: i64,
}

impl ServerStatus {
    fn new(name: &str) -> Self {
        ServerStatus {
            name: name.to_string(),
            state: State::Idle,
            tools: 0,
            error: None,
            stderr_tail: Vec::new(),
            restarts: 0,
            failures: 0,
            retry_in_ms: None,
            since_ms: crate::store::now_ms(),
        }
    }
}

/// How long a server must stay up before its failures are forgotten.
pub const STABLE: Duration = Duration::from_secs(30);

/// The backoff after `failures` failures in a row.
pub fn backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    Duration::from_secs(1u64 << (failures - 1).min(6)).min(Duration::from_secs(60))
}

/// What `live` found.
pub enum Live<'a> {
    Up(&'a Connection),
    /// It was connected and has gone: its last words.
    Exited(Vec<String>),
    Down,
}

#[derive(Default)]
pub struct Servers {
    conns: HashMap<String, (Connection, Instant)>,
    status: HashMap<String, (ServerStatus, Option<Instant>)>,
}

impl Servers {
    fn entry(&mut self, name: &str) -> &mut (ServerStatus, Option<Instant>) {
        self.status.entry(name.to_string()).or_insert_with(|| (ServerStatus::new(name), None))
    }

    /// The server's connection if it is still up; one that went away is
    /// dropped (its process group with it) and marked exited.
    pub fn live(&mut self, name: &str) -> Live<'_> {
        if self.conns.get(name).is_some_and(|(c, _)| c.is_closed()) {
            let gone = self.conns.remove(name);
            let stable = gone.as_ref().is_some_and(|(_, up)| up.elapsed() >= STABLE);
            let tail = gone.map(|(c, _)| c.stderr_tail()).unwrap_or_default();
            let (st, retry) = self.entry(name);
            st.state = State::Exited;
            st.error = Some("the server exited".into());
            st.stderr_tail = tail.clone();
            if stable {
                st.failures = 0;
            }
            st.failures += 1;
            st.since_ms = crate::store::now_ms();
            // The first exit restarts at once; a server that keeps dying
            // backs off.
            *retry = Some(Instant::now() + backoff(st.failures - 1));
            return Live::Exited(tail);
        }
        match self.conns.get(name) {
            Some((c, _)) => Live::Up(c),
            None => Live::Down,
        }
    }

    /// `Err(wait)` while the server is backing off.
    pub fn may_start(&self, name: &str) -> Result<(), Duration> {
        match self.status.get(name).and_then(|(_, r)| *r) {
            Some(at) if at > Instant::now() => Err(at - Instant::now()),
            _ => Ok(()),
        }
    }

    pub fn connected(&mut self, conn: Connection) {
        let name = conn.name.clone();
        let (st, retry) = self.entry(&name);
        if st.state != State::Idle {
            st.restarts += 1;
        }
        st.state = State::Connected;
        st.tools = conn.tools.len();
        st.error = None;
        st.since_ms = crate::store::now_ms();
        *retry = None;
        self.conns.insert(name, (conn, Instant::now()));
    }

    pub fn failed(&mut self, e: &ConnectError) {
        let (st, retry) = self.entry(&e.server);
        st.state = State::Failed;
        st.error = Some(e.reason.clone());
        st.stderr_tail = e.stderr_tail.clone();
        st.failures += 1;
        st.since_ms = crate::store::now_ms();
        *retry = Some(Instant::now() + backoff(st.failures));
    }

    /// Stop a server (restart, uninstall, the owner's stop): its process
    /// group is killed as the connection drops; the backoff is forgotten.
    pub fn stop(&mut self, name: &str) -> bool {
        let had = self.conns.remove(name).is_some();
        if let Some((st, retry)) = self.status.get_mut(name) {
            st.state = State::Idle;
            st.error = None;
            st.failures = 0;
            st.since_ms = crate::store::now_ms();
            *retry = None;
        }
        had
    }

    /// What is known of one server (none: never started).
    pub fn status(&self, name: &str) -> Option<&ServerStatus> {
        self.status.get(name).map(|(st, _)| st)
    }

    pub fn forget(&mut self, name: &str) {
        self.conns.remove(name);
        self.status.remove(name);
    }

    /// Every configured server's status, in config order (stderr tails of
    /// running servers read fresh).
    pub fn statuses(&self, cfg: &Value) -> Vec<ServerStatus> {
        let now = Instant::now();
        cfg.pointer("/mcp/servers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|s| s["name"].as_str())
            .map(|name| {
                let mut st = match self.status.get(name) {
                    Some((st, retry)) => {
                        let mut st = st.clone();
                        st.retry_in_ms = retry.filter(|r| *r > now).map(|r| (r - now).as_millis() as u64);
                        st
                    }
                    None => ServerStatus::new(name),
                };
                if let Some((c, up)) = self.conns.get(name) {
                    st.stderr_tail = c.stderr_tail();
                    if up.elapsed() >= STABLE {
                        st.failures = 0;
                    }
                }
                st
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn backoff_doubles_to_a_minute() {
        let secs: Vec<u64> = (0..10).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [0, 1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[test]
    fn a_failed_server_backs_off_and_a_stop_forgets_it() {
        let mut s = Servers::default();
        let e = ConnectError { server: "a".into(), reason: "boom".into(), stderr_tail: vec!["last".into()] };
        s.failed(&e);
        let wait = s.may_start("a").unwrap_err();
        assert!(wait <= Duration::from_secs(1) && wait > Duration::from_millis(500), "{wait:?}");
        let cfg = json!({"mcp": {"servers": [{"name": "a"}, {"name": "b"}]}});
        let st = s.statuses(&cfg);
        assert_eq!(st[0].state, State::Failed);
        assert_eq!(st[0].error.as_deref(), Some("boom"));
        assert_eq!(st[0].stderr_tail, ["last"]);
        assert!(st[0].retry_in_ms.is_some_and(|ms| ms <= 1000));
        assert_eq!(st[1].state, State::Idle);
        s.failed(&e);
        assert!(s.may_start("a").unwrap_err() > Duration::from_secs(1), "the second failure waits 2 s");
        s.stop("a");
        assert!(s.may_start("a").is_ok());
        assert_eq!(s.statuses(&cfg)[0].failures, 0);
    }
}
