//! The app attached to several daemons at once (`adf --remote a --remote
//! b`, `adf --remote all`), the way k9s switches clusters but all on one
//! screen. Each host keeps its own connection (an SSH tunnel for an
//! `ssh://` remote), its own status and its own event stream; the app sees
//! one fleet whose agents are keyed `ID@HOST`, so two hosts holding copies
//! of one agent file never merge, and every command goes back to the host
//! its agent came from.
//!
//! A host that drops is marked disconnected with the time it was last
//! heard from; its follower reconnects and replays its stream from the
//! cursor it had, so no event of a host that stayed up is lost. A host
//! that restarted (a new process: its cursors start again at 1) is replayed
//! from the start of the new process's ring. A host that answers as
//! another runtime than the one it was added as is refused, and nothing of
//! it is shown.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::app::{Action, App};
use crate::client::Client;
use crate::client::remotes::{Answer, Connection, Remote};
use crate::protocol::Envelope;
use crate::runtime::fleet::AgentInfo;

/// A stream quiet this long has its host asked whether it is there.
const QUIET: Duration = Duration::from_secs(5);

/// How long one call to a host may take before it counts as down.
pub const CALL_LIMIT: Duration = Duration::from_secs(3);

/// The app's key of an agent on a host.
pub fn key(id: &str, host: &str) -> String {
    format!("{id}@{host}")
}

/// An app key split back into (agent id, host). Remote names cannot hold
/// `@` (`remotes::check_name`), agent ids neither.
pub fn split(key: &str) -> Option<(&str, &str)> {
    key.rsplit_once('@')
}

/// What the app knows of a host's connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    pub connected: bool,
    /// When it last answered (epoch ms; 0: never).
    pub last_seen_ms: i64,
    /// Why it is not connected.
    pub error: Option<String>,
}

/// One daemon the app is attached to.
pub struct Host {
    pub name: String,
    pub url: String,
    /// `None`: it could not even be reached (its SSH tunnel failed).
    client: Option<Client>,
    remote: Remote,
    status: Mutex<Status>,
    /// Its agents as last listed, with their states (kept while it is away).
    known: Mutex<Vec<(AgentInfo, String)>>,
    _conn: Option<Connection>,
}

impl Host {
    pub fn status(&self) -> Status {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn client(&self) -> anyhow::Result<&Client> {
        self.client.as_ref().ok_or_else(|| {
            anyhow::anyhow!("{}: {}", self.name, self.status().error.unwrap_or_else(|| "not reachable".into()))
        })
    }

    /// Record an answer or a failure; whether the connection state changed.
    fn mark(&self, ok: Result<(), String>) -> bool {
        let Ok(mut s) = self.status.lock() else { return false };
        let was = s.connected;
        match ok {
            Ok(()) => {
                s.connected = true;
                s.last_seen_ms = crate::store::now_ms();
                s.error = None;
            }
            Err(e) => {
                s.connected = false;
                s.error = Some(e);
            }
        }
        was != s.connected
    }

    /// Whether it answers as the runtime it was added as.
    async fn identity(&self, c: &Client) -> Result<(), String> {
        self.remote.whoami(c).await.map(|_| ()).map_err(|e| match e {
            Answer::Impostor(m) => format!("refused: {m}"),
            Answer::Failed(m) => m,
        })
    }

    /// Its identity checked (another fleet at its address is refused),
    /// then its agents, keyed for the app.
    async fn list(&self) -> Result<Vec<(AgentInfo, String)>, String> {
        let c = self.client.as_ref().ok_or_else(|| self.status().error.unwrap_or_default())?;
        let ask = async {
            self.identity(c).await?;
            let list = c.get(&["agents"]).await.map_err(|e| e.to_string())?;
            let rt = c.get(&["runtime"]).await.map_err(|e| e.to_string())?;
            Ok::<_, String>((list, rt))
        };
        let (list, rt) = tokio::time::timeout(CALL_LIMIT, ask).await.map_err(|_| "no answer in 3 s".to_string())??;
        let fleet_dir = PathBuf::from(rt["fleetDir"].as_str().unwrap_or(""));
        let agents =
            list.as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .filter_map(|x| {
                    let id = x["id"].as_str()?;
                    let file = PathBuf::from(x["filePath"].as_str().unwrap_or(""));
                    // Grouped under the host, then the folder it has there.
                    let rel = file.strip_prefix(&fleet_dir).map(PathBuf::from).unwrap_or_else(|_| {
                        PathBuf::from(file.file_name().map(|f| f.to_os_string()).unwrap_or_default())
                    });
                    let info = AgentInfo {
                        id: key(id, &self.name),
                        name: x["name"].as_str().unwrap_or("").to_string(),
                        handle: x["handle"].as_str().unwrap_or("").to_string(),
                        path: PathBuf::from(&self.name).join(rel),
                    };
                    Some((info, x["state"].as_str().unwrap_or("idle").to_string()))
                })
                .collect();
        Ok(agents)
    }
}

/// What waits on the owner across hosts, keyed for the app.
pub type Attention = Vec<(String, crate::store::tasks::Task)>;

/// Every host the app is attached to.
pub struct Hosts {
    pub hosts: Vec<Arc<Host>>,
    /// Approval queues read in the background come back here.
    queue: mpsc::UnboundedSender<Attention>,
    queue_rx: Mutex<Option<mpsc::UnboundedReceiver<Attention>>>,
}

impl Hosts {
    /// Where a host's stream stands now (its process, its cursor).
    pub async fn resume_point(host: &Host) -> anyhow::Result<Resume> {
        let rt = host.client()?.get(&["runtime"]).await?;
        Ok(Resume { pid: rt["pid"].as_u64().unwrap_or(0), cursor: rt["eventCursor"].as_u64().unwrap_or(0) })
    }

    /// Connect to each remote (SSH tunnels opened here); one that cannot
    /// be reached is kept, marked with why.
    pub fn connect(remotes: Vec<Remote>) -> Hosts {
        let hosts = remotes
            .into_iter()
            .map(|remote| {
                let (client, conn, error) = match remote.connect() {
                    Ok(c) => (Some(c.client()), Some(c), None),
                    Err(e) => (None, None, Some(e.to_string())),
                };
                Arc::new(Host {
                    name: remote.name.clone(),
                    url: remote.url.clone(),
                    client,
                    status: Mutex::new(Status { connected: false, last_seen_ms: 0, error }),
                    known: Mutex::new(Vec::new()),
                    remote,
                    _conn: conn,
                })
            })
            .collect();
        let (queue, rx) = mpsc::unbounded_channel();
        Hosts { hosts, queue, queue_rx: Mutex::new(Some(rx)) }
    }

    /// Read every host's approvals and asks in the background (the first
    /// frame never waits on them); they come on `queue_updates`.
    pub fn load_attention(self: &Hosts) {
        let hosts: Vec<Arc<Host>> = self.hosts.clone();
        let tx = self.queue.clone();
        tokio::spawn(async move {
            let _ = tx.send(attention(&hosts).await);
        });
    }

    /// Where the background reads of the queue arrive (taken once).
    pub fn queue_updates(&self) -> Option<mpsc::UnboundedReceiver<Attention>> {
        self.queue_rx.lock().ok()?.take()
    }

    /// The host of an app key, and the agent's id there.
    pub fn route<'a>(&self, key: &'a str) -> anyhow::Result<(&Host, &'a str)> {
        let (id, host) = split(key).ok_or_else(|| anyhow::anyhow!("{key}: not an agent of an attached host"))?;
        let h = self.hosts.iter().find(|h| h.name == host).ok_or_else(|| anyhow::anyhow!("{host}: no such host"))?;
        Ok((h, id))
    }

    /// Every host's agents, asked all at once: a host that answers is
    /// listed as it is now, one that does not with what it had.
    pub async fn agents(&self) -> Vec<(AgentInfo, String)> {
        let lists = futures_util::future::join_all(self.hosts.iter().map(|h| async move {
            match h.list().await {
                Ok(list) => {
                    h.mark(Ok(()));
                    if let Ok(mut k) = h.known.lock() {
                        k.clone_from(&list);
                    }
                    list
                }
                Err(e) => {
                    h.mark(Err(e));
                    h.known.lock().map(|k| k.clone()).unwrap_or_default()
                }
            }
        }))
        .await;
        lists.into_iter().flatten().collect()
    }

    /// One stream of every host's events, agent ids keyed for the app, with
    /// `host.connected`, `host.disconnected` and `host.gap` events of its own.
    pub fn feed(&self) -> mpsc::UnboundedReceiver<Envelope> {
        let (tx, rx) = mpsc::unbounded_channel();
        for h in &self.hosts {
            tokio::spawn(follow(h.clone(), tx.clone(), None));
        }
        rx
    }
}

/// What waits on the owner on every host that answers (`GET /attention`,
/// asked at once), keyed for the app.
pub async fn attention(hosts: &[Arc<Host>]) -> Attention {
    let asks = hosts.iter().filter(|h| h.status().connected).map(|h| async move {
        let c = h.client().ok()?;
        let v = tokio::time::timeout(CALL_LIMIT, c.get(&["attention"])).await.ok()?.ok()?;
        let tasks: Vec<_> = v["tasks"]
            .as_array()?
            .iter()
            .filter_map(|t| Some((key(t["agentId"].as_str()?, &h.name), super::source::task(t)?)))
            .collect();
        Some(tasks)
    });
    futures_util::future::join_all(asks).await.into_iter().flatten().flatten().collect()
}

/// A host as the app shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostView {
    pub name: String,
    pub url: String,
    pub status: Status,
}

impl Hosts {
    /// Each agent's state as its host last listed it, by app key.
    pub fn states(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for h in &self.hosts {
            if let Ok(k) = h.known.lock() {
                out.extend(k.iter().map(|(a, st)| (a.id.clone(), st.clone())));
            }
        }
        out
    }

    pub fn views(&self) -> Vec<HostView> {
        self.hosts.iter().map(|h| HostView { name: h.name.clone(), url: h.url.clone(), status: h.status() }).collect()
    }
}

impl App {
    /// Agents' live states (a host's listing), by key.
    pub fn set_states(&mut self, states: &[(String, String)]) {
        for (id, st) in states {
            if let Some(a) = self.agents.iter_mut().find(|a| &a.info.id == id) {
                a.state.clone_from(st);
            }
        }
    }

    /// A host's own event: its mark on the tree and a word on the status
    /// line; back again, its agents are read again (what changed while it
    /// was away).
    pub(super) fn on_host_event(&mut self, e: &Envelope) -> Option<Action> {
        let name = e.payload["host"].as_str()?;
        let v = self.hosts.iter_mut().find(|h| h.name == name)?;
        let seen = e.payload["last_seen_ms"].as_i64().unwrap_or(v.status.last_seen_ms);
        match e.event_type.as_ref() {
            "host.connected" => {
                v.status = Status { connected: true, last_seen_ms: seen, error: None };
                let how = match (e.payload["restarted"].as_bool(), e.payload["resumed_from"].as_u64()) {
                    (Some(true), _) => " (it had restarted: its events since replayed)".to_string(),
                    (_, Some(c)) => format!(" (its events after #{c} replayed)"),
                    _ => String::new(),
                };
                self.status = Some(format!("{name} is connected{how}"));
                Some(Action::RefreshAgents)
            }
            "host.disconnected" => {
                let why = e.payload["error"].as_str().unwrap_or("it stopped answering").to_string();
                v.status = Status { connected: false, last_seen_ms: seen, error: Some(why.clone()) };
                self.status = Some(format!("{name} is disconnected: {why}; reconnecting"));
                None
            }
            "host.gap" => {
                let gap = &e.payload["gap"];
                let missed = gap["missed"].as_u64().map(|n| n.to_string()).unwrap_or_else(|| {
                    let (a, b) =
                        (gap["requested_since"].as_u64().unwrap_or(0), gap["oldest_cursor"].as_u64().unwrap_or(0));
                    b.saturating_sub(a + 1).to_string()
                });
                self.status =
                    Some(format!("{name}: {missed} events were older than its replay window and are not shown"));
                Some(Action::RefreshAgents)
            }
            _ => None,
        }
    }
}

/// A host's line in the tree: its name, its agents, and when it is down,
/// when it was last heard from and why.
pub fn header(app: &App, h: &HostView, width: usize) -> ratatui::text::Line<'static> {
    use ratatui::text::{Line, Span};
    let n = app.agents.iter().filter(|a| a.host == h.name).count();
    let agents = if n == 1 { "1 agent".to_string() } else { format!("{n} agents") };
    if h.status.connected {
        return Line::from(vec![
            Span::styled(format!("{} {}", app.glyphs.expanded, h.name), app.theme.get("accent")),
            Span::styled(format!(" · {agents}"), app.theme.get("dim")),
        ]);
    }
    // Short, for a narrow tree: why is on the status line and in events.
    let mut text = match h.status.last_seen_ms {
        0 => " · down, never reached".to_string(),
        t => format!(" · down, seen {} ago", super::ui::ago(app.now_ms, t)),
    };
    if let Some(why) = h.status.error.as_deref().filter(|w| !w.is_empty()) {
        text.push_str(": ");
        text.push_str(why);
    }
    let room = width.saturating_sub(h.name.chars().count() + 2);
    let text: String = text.chars().take(room).collect();
    Line::from(vec![
        Span::styled(format!("{} {}", app.glyphs.warn, h.name), app.theme.get("error")),
        Span::styled(text, app.theme.get("dim")),
    ])
}

/// An event of the app's own about a host.
pub fn host_event(kind: &'static str, host: &Host, extra: Value) -> Envelope {
    let s = host.status();
    let mut payload = json!({"host": host.name, "url": host.url, "last_seen_ms": s.last_seen_ms});
    if let Some(e) = s.error {
        payload["error"] = json!(e);
    }
    if let (Some(p), Some(x)) = (payload.as_object_mut(), extra.as_object()) {
        p.extend(x.clone());
    }
    Envelope::new(kind, None, "system:hosts", payload)
}

/// Where a host's stream resumes: its process and the last cursor read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    pub pid: u64,
    pub cursor: u64,
}

/// The cursor to ask for after a (re)connection: where it stood, unless
/// the daemon is a new process (another pid, or a cursor behind ours): then
/// everything the new process still holds.
pub fn resume_from(last: Option<Resume>, pid: u64, cursor_now: u64) -> u64 {
    match last {
        None => cursor_now,
        Some(r) if r.pid == pid && cursor_now >= r.cursor => r.cursor,
        Some(_) => 0,
    }
}

/// Follow one host's event stream for as long as the app runs (from
/// `last`, as after a drop; `None`: from now).
pub(super) async fn follow(host: Arc<Host>, tx: mpsc::UnboundedSender<Envelope>, mut last: Option<Resume>) {
    use futures_util::StreamExt;
    let mut wait = Duration::from_millis(250);
    loop {
        if tx.is_closed() {
            return;
        }
        let Some(c) = host.client.as_ref() else { return };
        let start = async {
            // Another fleet at its address streams nothing into this one.
            host.identity(c).await?;
            let rt = c.get(&["runtime"]).await.map_err(|e| e.to_string())?;
            let pid = rt["pid"].as_u64().unwrap_or(0);
            let since = resume_from(last, pid, rt["eventCursor"].as_u64().unwrap_or(0));
            let url = c.url(&["events"], &[]).map_err(|e| e.to_string())?;
            let resp = c
                .request(reqwest::Method::GET, url)
                .header("last-event-id", since.to_string())
                .send()
                .await
                .map_err(|e| crate::client::root_cause(&e))?;
            if !resp.status().is_success() {
                return Err(format!("its event stream answered {}", resp.status()));
            }
            Ok((pid, since, resp))
        };
        let (pid, since, resp) = match tokio::time::timeout(CALL_LIMIT, start).await {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => {
                gone(&host, &tx, e);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
                continue;
            }
            Err(_) => {
                gone(&host, &tx, "no answer in 3 s".into());
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        wait = Duration::from_millis(250);
        let restarted = last.is_some_and(|r| r.pid != pid || since < r.cursor);
        let replay = last.map(|r| if restarted { 0 } else { r.cursor });
        last = Some(Resume { pid, cursor: since });
        if host.mark(Ok(())) {
            let extra = json!({"resumed_from": replay, "restarted": restarted});
            if tx.send(host_event("host.connected", &host, extra)).is_err() {
                return;
            }
        }
        let mut stream = resp.bytes_stream();
        let mut buf = String::new();
        let mut ended = "its event stream ended".to_string();
        loop {
            // A link that went quiet closes nothing: after a quiet spell
            // the host is asked directly, and one that does not answer is
            // taken as gone (its stream is read again from our cursor).
            let next = match tokio::time::timeout(QUIET, stream.next()).await {
                Ok(n) => n,
                Err(_) => {
                    let ping = async { c.get(&["health"]).await.map_err(|e| e.to_string()) };
                    match tokio::time::timeout(CALL_LIMIT, ping).await {
                        Ok(Ok(_)) => continue,
                        Ok(Err(e)) => ended = e,
                        Err(_) => ended = "no answer in 3 s".into(),
                    }
                    break;
                }
            };
            match next {
                Some(Ok(chunk)) => {
                    buf.push_str(&String::from_utf8_lossy(&chunk));
                    if let Ok(mut s) = host.status.lock() {
                        s.last_seen_ms = crate::store::now_ms();
                    }
                    while let Some(end) = buf.find("\n\n") {
                        let frame: String = buf.drain(..end + 2).collect();
                        if let Some(e) = frame_event(&host, &frame, &mut last)
                            && tx.send(e).is_err()
                        {
                            return;
                        }
                    }
                }
                Some(Err(e)) => {
                    ended = crate::client::root_cause(&e);
                    break;
                }
                None => break,
            }
        }
        gone(&host, &tx, ended);
        tokio::time::sleep(wait).await;
    }
}

/// Mark a host gone, telling the app once.
fn gone(host: &Host, tx: &mpsc::UnboundedSender<Envelope>, why: String) {
    if host.mark(Err(why)) {
        let _ = tx.send(host_event("host.disconnected", host, json!({})));
    }
}

/// One SSE frame of a host as an event for the app (agent ids keyed), its
/// cursor kept; a gap becomes `host.gap`.
fn frame_event(host: &Host, frame: &str, last: &mut Option<Resume>) -> Option<Envelope> {
    let data = frame.lines().find_map(|l| l.strip_prefix("data: "))?;
    let v: Value = serde_json::from_str(data).ok()?;
    if frame.lines().any(|l| l == "event: gap") {
        return Some(host_event("host.gap", host, json!({"gap": v})));
    }
    if let (Some(cur), Some(r)) = (v["cursor"].as_u64(), last.as_mut()) {
        r.cursor = cur;
    }
    let mut e: Envelope = serde_json::from_value(v["event"].clone()).ok()?;
    if let Some(id) = e.agent_id.take() {
        e.agent_id = Some(key(&id, &host.name));
    }
    Some(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_back_into_agent_and_host() {
        let k = key("aB3_x-9", "vps-1");
        assert_eq!(k, "aB3_x-9@vps-1");
        assert_eq!(split(&k), Some(("aB3_x-9", "vps-1")));
        assert_eq!(split("plain"), None);
    }

    #[test]
    fn a_stream_resumes_where_it_stood_unless_the_daemon_is_a_new_process() {
        assert_eq!(resume_from(None, 7, 500), 500, "first: from now");
        let r = Some(Resume { pid: 7, cursor: 420 });
        assert_eq!(resume_from(r, 7, 500), 420, "the same process: from our cursor");
        assert_eq!(resume_from(r, 7, 420), 420);
        assert_eq!(resume_from(r, 8, 9000), 0, "another pid: all it holds");
        assert_eq!(resume_from(r, 7, 10), 0, "its cursor went back: restarted");
    }

    fn host(name: &str) -> Host {
        let remote = Remote { name: name.into(), url: "http://127.0.0.1:9".into(), token_file: None, runtime_id: None };
        Host {
            name: name.into(),
            url: remote.url.clone(),
            client: None,
            remote,
            status: Mutex::new(Status::default()),
            known: Mutex::new(Vec::new()),
            _conn: None,
        }
    }

    #[test]
    fn frames_are_keyed_by_host_and_move_the_cursor() {
        let h = host("beta");
        let mut last = Some(Resume { pid: 1, cursor: 3 });
        let frame = "id: 4\nevent: turn.completed\ndata: {\"cursor\":4,\"event\":{\"seq\":9,\"event_type\":\"turn.completed\",\"timestamp\":1,\"source\":\"agent:t\",\"agent_id\":\"A1\",\"payload\":{}}}\n\n";
        let e = frame_event(&h, frame, &mut last).unwrap();
        assert_eq!(e.agent_id.as_deref(), Some("A1@beta"));
        assert_eq!(last.unwrap().cursor, 4);
        let gap = "event: gap\ndata: {\"reason\":\"replay_window\",\"requested_since\":1,\"oldest_cursor\":9}\n\n";
        let g = frame_event(&h, gap, &mut last).unwrap();
        assert_eq!(g.event_type, "host.gap");
        assert_eq!(g.payload["gap"]["oldest_cursor"], 9);
        assert_eq!(last.unwrap().cursor, 4, "a gap moves no cursor");
        assert!(frame_event(&h, ": heartbeat 1\n\n", &mut last).is_none());
    }

    #[test]
    fn a_change_of_connection_is_told_once() {
        let h = host("gamma");
        assert!(h.mark(Ok(())), "connected");
        assert!(!h.mark(Ok(())), "still");
        assert!(h.status().last_seen_ms > 0);
        assert!(h.mark(Err("refused".into())));
        assert!(!h.mark(Err("refused again".into())));
        assert_eq!(h.status().error.as_deref(), Some("refused again"));
        assert!(h.status().last_seen_ms > 0, "last seen is kept");
    }
}
