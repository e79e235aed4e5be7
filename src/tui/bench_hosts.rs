//! `adf bench hosts`: the app over many daemons (issue 23). Ten real
//! `adf daemon` processes of 100 agents each on loopback; the app's own
//! state machine and renderer (ratatui's test backend at 120×40) attached
//! to all of them through the same code the terminal app runs: the time
//! from every host having answered to the first frame, and the app's memory
//! then. Then a host's stream is read again from a cursor 10,000 events
//! back (a reconnect after a drop), through the app's follower into the
//! app: the time until the last of them is applied.

use std::path::Path;
use std::time::{Duration, Instant};

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use serde::Serialize;
use serde_json::json;

use super::app::App;
use super::hosts::{self, Hosts};
use super::keys::Keymap;
use super::theme::Theme;
use super::{chat, source, ui};
use crate::client::remotes::Remote;

#[derive(Debug, Serialize)]
pub struct Report {
    pub hosts: usize,
    pub agents_per_host: usize,
    /// Every host's `/agents` (and identity) answered, asked at once.
    pub all_answer_ms: f64,
    /// From the answers to the first frame drawn (the tree, the selected
    /// agent's chat, the approvals across hosts).
    pub first_frame_ms: f64,
    /// Every host's approvals and asks, read after the first frame.
    pub queue_ms: f64,
    /// The app process's resident memory after the first frame.
    pub rss_mb: f64,
    /// Events missed while away, replayed on reconnect.
    pub replay_events: usize,
    pub replay_ms: f64,
    /// The targets: `{"max": x}` per figure.
    pub targets: serde_json::Value,
}

pub fn targets() -> serde_json::Value {
    json!({"first_frame_ms": {"max": 300.0}, "rss_mb": {"max": 60.0}, "replay_ms": {"max": 1000.0}})
}

fn rss_mb() -> f64 {
    crate::daemon::bench::proc_rss_mb(std::process::id())
}

struct Daemons(Vec<std::process::Child>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn run(short: bool) -> anyhow::Result<Report> {
    let dir = std::env::temp_dir().join(format!("adf-bench-hosts-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    // On a worker, as the app runs: its reads may block it briefly.
    let d = dir.clone();
    let result = rt.block_on(async move { tokio::spawn(run_in(d, short)).await })?;
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run_in(dir: std::path::PathBuf, short: bool) -> anyhow::Result<Report> {
    let (n_hosts, per_host, missed) = if short { (3, 30, 2_000) } else { (10, 100, 10_000) };
    let mut daemons = Daemons(Vec::new());
    let mut remotes = Vec::new();
    for h in 0..n_hosts {
        let hdir = dir.join(format!("h{h}"));
        let fleet = hdir.join("agents");
        std::fs::create_dir_all(&fleet)?;
        let files = crate::daemon::bench::agents(&fleet, per_host, 0)?;
        let ring = (missed * 2).to_string();
        let (child, url) =
            crate::daemon::bench::spawn_with(&hdir, &fleet, &files, &[("ADF_EVENT_RING", ring.as_str())]).await?;
        daemons.0.push(child);
        let token_file = hdir.join("home/config/daemon-token");
        remotes.push(Remote { name: format!("h{h}"), url, token_file: Some(token_file), runtime_id: None });
    }
    let before = rss_mb();
    let hosts = Hosts::connect(remotes);

    // Every host answers; then the app's first frame.
    let asked = Instant::now();
    let listed = hosts.agents().await;
    let all_answer_ms = asked.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        listed.len() == n_hosts * per_host,
        "{} of {} agents listed: {:?}",
        listed.len(),
        n_hosts * per_host,
        hosts.views().iter().map(|v| (&v.name, &v.status.error)).collect::<Vec<_>>()
    );
    let mut term = Terminal::new(TestBackend::new(120, 40))?;
    let t = Instant::now();
    let mut app = App::new(Keymap::load(None).map_err(anyhow::Error::msg)?, Theme::default_theme(), chat::UTF8);
    app.attached = true;
    app.hosts = hosts.views();
    app = app.with_source(Box::new(source::Multi::new(&hosts)));
    app.set_agents(listed.iter().map(|(a, _)| a.clone()).collect(), Path::new(""));
    app.set_states(&hosts.states());
    term.draw(|f| ui::draw(f, &app))?;
    let first_frame_ms = t.elapsed().as_secs_f64() * 1000.0;
    // The approvals queue across hosts, read in the background after it.
    let t = Instant::now();
    app.set_attention(hosts::attention(&hosts.hosts).await);
    let queue_ms = t.elapsed().as_secs_f64() * 1000.0;
    let rss = rss_mb().max(before);

    // A reconnect: host 0's stream read again from `missed` events back.
    let h0 = hosts.hosts[0].clone();
    let from = Hosts::resume_point(&h0).await?;
    let target = &listed[0].0;
    let (id, _) = hosts::split(&target.id).ok_or_else(|| anyhow::anyhow!("no key"))?;
    let c = h0.client()?.clone();
    let id = id.to_string();
    // Written 8 at a time, as fast as the daemon takes them.
    let writes = futures_util::stream::iter(0..missed).map(|i| {
        let (c, id) = (c.clone(), id.clone());
        async move {
            let url = c.url(&["agents", &id, "files", "content"], &[("path", &format!("r/{}.txt", i % 50))])?;
            c.call(reqwest::Method::PUT, url, Some(&json!({"content": i.to_string()}))).await?;
            Ok::<_, anyhow::Error>(())
        }
    });
    use futures_util::StreamExt;
    let done: Vec<_> = writes.buffer_unordered(8).collect().await;
    for d in done {
        d?;
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let t = Instant::now();
    let task = tokio::spawn(hosts::follow(h0, tx, Some(from)));
    let mut seen = 0;
    while seen < missed {
        let e = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .map_err(|_| anyhow::anyhow!("the replay stalled after {seen} events"))?
            .ok_or_else(|| anyhow::anyhow!("the follower ended"))?;
        if e.event_type == "file.written" {
            seen += 1;
        }
        app.on_event(&e);
    }
    let replay_ms = t.elapsed().as_secs_f64() * 1000.0;
    task.abort();
    Ok(Report {
        hosts: n_hosts,
        agents_per_host: per_host,
        all_answer_ms,
        first_frame_ms,
        queue_ms,
        rss_mb: rss,
        replay_events: missed,
        replay_ms,
        targets: targets(),
    })
}
