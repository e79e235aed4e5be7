//! `adf bench tui`: frame times of the terminal app rendered into ratatui's
//! test backend at 120×40, from real agent files: a loop of 10 000 rows
//! scrolled end to end, a fleet of 200 agents walked top to bottom, and a
//! reply streaming at 50 deltas per second. Also the memory the scroll
//! costs, which must not grow with how far back the loop goes.

use std::path::Path;
use std::time::Instant;

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use serde::Serialize;
use serde_json::json;

use super::app::{App, Focus};
use super::keys::Keymap;
use super::theme::Theme;
use super::{chat, ui};
use crate::protocol::Envelope;
use crate::runtime::fleet::AgentInfo;
use crate::store::NewAgent;
use crate::store::create::create_file;
use crate::store::loop_rows::NewLoopRow;

#[derive(Debug, Serialize)]
pub struct Scenario {
    pub name: &'static str,
    pub frames: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub scenarios: Vec<Scenario>,
    /// RSS growth while scrolling the 10 000-row loop from the bottom to the
    /// top and back (MiB): independent of the loop's length when only
    /// visible rows are laid out.
    pub scroll_rss_growth_mb: f64,
}

fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| {
            t.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .map(|kb: f64| kb / 1024.0)
        .unwrap_or(0.0)
}

fn summarise(name: &'static str, mut t: Vec<f64>) -> Scenario {
    t.sort_by(f64::total_cmp);
    let at = |p: f64| t.get(((t.len().saturating_sub(1)) as f64 * p).round() as usize).copied().unwrap_or(0.0);
    Scenario { name, frames: t.len(), p50_ms: at(0.5), p99_ms: at(0.99), max_ms: t.last().copied().unwrap_or(0.0) }
}

fn info(path: &Path) -> anyhow::Result<AgentInfo> {
    let s = crate::store::Store::open_read_only(path)?;
    let cfg = s.config_value()?;
    Ok(AgentInfo {
        id: cfg["id"].as_str().unwrap_or("").to_string(),
        name: cfg["name"].as_str().unwrap_or("").to_string(),
        handle: String::new(),
        path: path.to_path_buf(),
    })
}

fn app() -> anyhow::Result<App> {
    Ok(App::new(Keymap::load(None).map_err(anyhow::Error::msg)?, Theme::default_theme(), chat::UTF8))
}

fn frame(term: &mut Terminal<TestBackend>, app: &App) -> anyhow::Result<f64> {
    let t = Instant::now();
    term.draw(|f| ui::draw(f, app))?;
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

/// Write a long loop: text, markdown with code, tool calls and results.
fn long_loop(path: &Path, rows: usize) -> anyhow::Result<()> {
    create_file(path, &NewAgent { name: Some("long"), ..Default::default() })?;
    let mut s = crate::store::Store::open(path)?;
    for i in 0..rows {
        let (role, content) = match i % 4 {
            0 => (
                "user",
                json!([{"type": "text", "text": format!("Message {i}: what changed in the tickets since the last run?")}]),
            ),
            1 => (
                "assistant",
                json!([
                    {"type": "text", "text": format!("Reading the table first ({i}).")},
                    {"type": "tool_use", "id": format!("t{i}"), "name": "db_query", "input": {"sql": "SELECT id, title FROM local_tickets"}}
                ]),
            ),
            2 => ("user", json!([{"type": "tool_result", "tool_use_id": format!("t{}", i - 1), "content": "12 rows"}])),
            _ => (
                "assistant",
                json!([{"type": "text", "text": "## Summary\n\n- **12** tickets, 3 urgent\n- see `notes/today.md`\n\n```rust\nfn main() { println!(\"done\"); }\n```\nAll set."}]),
            ),
        };
        s.loop_append(&NewLoopRow { role, content: &content, model: None, tokens: None, ord: None })?;
    }
    s.close()?;
    Ok(())
}

pub fn run() -> anyhow::Result<Report> {
    let dir = std::env::temp_dir().join(format!("adf-bench-tui-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run_in(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_in(dir: &Path) -> anyhow::Result<Report> {
    let mut term = Terminal::new(TestBackend::new(120, 40))?;
    let mut scenarios = Vec::new();

    // A loop of 10 000 rows, scrolled from the bottom to the top and back.
    let long = dir.join("long.adf");
    long_loop(&long, 10_000)?;
    let mut a = app()?;
    a.set_agents(vec![info(&long)?], dir);
    a.focus = Focus::Main;
    a.show_events = false;
    frame(&mut term, &a)?;
    let before = rss_mb();
    let mut times = Vec::new();
    let id = a.agents[0].info.id.clone();
    for _ in 0..100_000 {
        a.run("page_up");
        times.push(frame(&mut term, &a)?);
        if a.chats.get(&id).and_then(|c| c.top) == Some((0, 0)) {
            break;
        }
    }
    for _ in 0..100_000 {
        a.run("page_down");
        times.push(frame(&mut term, &a)?);
        if a.chats.get(&id).is_some_and(|c| c.top.is_none()) {
            break;
        }
    }
    let growth = (rss_mb() - before).max(0.0);
    scenarios.push(summarise("loop of 10 000 rows, scrolled end to end", times));
    drop(a);

    // A fleet of 200 agents, walked top to bottom.
    let fleet = dir.join("fleet");
    let mut infos = Vec::new();
    for i in 0..200 {
        let sub = fleet.join(format!("team-{}", i % 10));
        std::fs::create_dir_all(&sub)?;
        let p = sub.join(format!("agent-{i:03}.adf"));
        create_file(&p, &NewAgent::default())?;
        infos.push(info(&p)?);
    }
    let mut a = app()?;
    a.set_agents(infos, &fleet);
    a.focus = Focus::Fleet;
    let mut times = Vec::new();
    for _ in 0..200 {
        a.run("down");
        times.push(frame(&mut term, &a)?);
    }
    scenarios.push(summarise("fleet of 200 agents", times));
    drop(a);

    // A reply streaming at 50 deltas a second: one frame per delta (the
    // app coalesces to 60 fps, so this is the worst case).
    let mut a = app()?;
    a.set_agents(vec![info(&long)?], dir);
    a.focus = Focus::Main;
    let words = ["Reading ", "the ", "table ", "first; ", "12 ", "rows ", "came ", "back.\n"];
    let mut times = Vec::new();
    for i in 0..500 {
        let e = Envelope::new(
            "turn.delta",
            Some(&id),
            "agent:bench",
            json!({"kind": "text", "text": words[i % words.len()]}),
        );
        a.on_event(&e);
        times.push(frame(&mut term, &a)?);
    }
    scenarios.push(summarise("stream of 50 deltas per second", times));
    Ok(Report { scenarios, scroll_rss_growth_mb: growth })
}
