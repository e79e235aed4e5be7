//! `adf` with no command: the terminal app. This module owns the terminal
//! (raw mode, the alternate screen or an inline viewport, restoring both on
//! every exit and on panics), runs the fleet in-process, and drives the app
//! state machine from three sources: keys, the runtime's event bus, and a
//! clock for the "waiting 2m" labels. Frames are drawn on demand, at most
//! 60 per second. Editor round-trips suspend the terminal, run `$VISUAL` /
//! `$EDITOR` / `vi` on a temporary copy, and write back through the agent.

pub mod app;
pub mod backend;
pub mod bench;
pub mod bench_hosts;
pub mod chat;
pub mod commands;
pub mod compute;
pub mod context;
pub mod control;
pub mod forms;
pub mod highlight;
pub mod hosts;
pub mod images;
pub mod inbox;
pub mod input;
pub mod keys;
pub mod loops;
pub mod mcp;
pub mod overlay;
pub mod readline;
pub mod skills;
pub mod source;
pub mod spawn;
pub mod theme;
pub mod triage;
pub mod ui;
pub mod window;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use crossterm::event::{Event, EventStream, KeyEventKind};
use crossterm::{execute, terminal};
use futures_util::StreamExt;
use ratatui::backend::CrosstermBackend;
use ratatui::{Terminal, TerminalOptions, Viewport};

use crate::protocol::Command;
use crate::runtime::bus::Bus;
use crate::runtime::fleet::{Fleet, ProviderFactory, accounts_factory};
use app::{Action, App};
use backend::Backend;

/// How the app starts.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Draw below the prompt instead of on the alternate screen.
    pub inline: bool,
    /// A built-in theme name or a theme file.
    pub theme: Option<String>,
    /// Force ASCII glyphs.
    pub ascii: bool,
    /// Extra agent files to load besides the fleet folder.
    pub files: Vec<PathBuf>,
    /// Folders and agent files to open instead of the default fleet
    /// (`adf DIR FILE.adf …`).
    pub paths: Vec<PathBuf>,
    /// Run the fleet in a background daemon (started when none runs) and
    /// attach to it, so closing the app never stops the agents.
    pub daemon: bool,
    /// Attach to the daemon at this URL instead of running the fleet here.
    pub url: Option<String>,
    /// Attach to these daemons at once (`--remote a --remote b`).
    pub remotes: Vec<crate::client::remotes::Remote>,
}

/// Whether the locale promises UTF-8 (else the ASCII glyphs).
pub fn utf8_locale() -> bool {
    ["LC_ALL", "LC_CTYPE", "LANG"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .map(|v| {
            let v = v.to_ascii_lowercase();
            v.contains("utf-8") || v.contains("utf8")
        })
        .unwrap_or(false)
}

/// Restore the terminal: leave raw mode and the alternate screen, show the
/// cursor. Safe to call more than once (the panic hook calls it too).
pub fn restore_terminal() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(std::io::stdout(), terminal::LeaveAlternateScreen, crossterm::cursor::Show);
}

struct Guard {
    inline: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Dropped before the terminal handle, whose own drop writes (and
        // `println!`/`eprintln!` panic on a terminal that hung up).
        if crate::runtime::signals::terminal_gone() {
            crate::runtime::signals::detach_from_terminal();
            return;
        }
        if self.inline {
            let _ = terminal::disable_raw_mode();
            let _ = execute!(std::io::stdout(), crossterm::cursor::Show);
            println!();
        } else {
            restore_terminal();
        }
    }
}

/// The owner's recovery phrase when it has not been shown yet (marked
/// shown now: it is shown once). `create` makes the identity on a first
/// run of the in-process fleet; an app attached to a daemon only reads it.
fn first_phrase(create: bool) -> anyhow::Result<Option<(String, String)>> {
    let config = crate::paths::config_dir();
    let inst = if create {
        Some(crate::identity::install::load_or_create(&config).map_err(anyhow::Error::msg)?.0)
    } else {
        crate::identity::install::load(&config).map_err(anyhow::Error::msg)?
    };
    let Some(inst) = inst else { return Ok(None) };
    let Some(owner) = inst.owner.as_ref().filter(|_| !inst.phrase_shown) else { return Ok(None) };
    crate::identity::install::mark_shown(&config).map_err(anyhow::Error::msg)?;
    Ok(Some((inst.owner_did.clone(), owner.phrase.clone())))
}

/// `NO_COLOR` (no-color.org): the monochrome theme, where the selection is
/// reverse video, unless a theme was asked for.
fn no_color() -> bool {
    std::env::var("NO_COLOR").is_ok_and(|v| !v.is_empty())
}

/// Run the app until the user quits.
pub fn run(opts: Options) -> anyhow::Result<()> {
    run_with(opts, accounts_factory())
}

pub fn run_with(opts: Options, factory: ProviderFactory) -> anyhow::Result<()> {
    let keymap = keys::Keymap::load(Some(&app::user_keymap())).map_err(anyhow::Error::msg)?;
    let theme = match &opts.theme {
        Some(t) => theme::Theme::load(t).map_err(anyhow::Error::msg)?,
        None if no_color() => theme::Theme::load("mono").map_err(anyhow::Error::msg)?,
        None => theme::Theme::default_theme(),
    };
    let glyphs = if opts.ascii || !utf8_locale() { chat::ASCII } else { chat::UTF8 };
    // Folders and files named on the command line, as `adf daemon` takes
    // them: the first folder (else the first file's) is the root.
    let dir = opts
        .paths
        .iter()
        .find(|p| p.is_dir())
        .cloned()
        .or_else(|| opts.paths.first().and_then(|p| p.parent()).map(|p| p.to_path_buf()))
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| if opts.paths.is_empty() { crate::paths::fleet_dir() } else { PathBuf::from(".") });
    for p in &opts.paths {
        if !p.exists() {
            anyhow::bail!("{}: no such file or folder", p.display());
        }
    }
    // A daemon named, or running for this fleet: attach to it. With
    // `--daemon` (or `"daemon": true` in settings.json) start one first.
    let multi = !opts.remotes.is_empty();
    let mut attach = opts.url.clone().or_else(|| if multi { None } else { crate::daemon::discover(&dir) });
    if attach.is_none() && !multi && (opts.daemon || crate::daemon::spawn::wanted_by_settings()) {
        attach = Some(crate::daemon::spawn::start(&dir, &opts.paths)?);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let main = async move {
        let mut problems = Vec::new();
        // The owner identity, made on first run; its phrase is shown once,
        // in a dialog (`adf identity show --phrase` again), attached or not.
        let phrase = first_phrase(attach.is_none() && !multi)?;
        let mut backend = match attach {
            _ if multi => Backend::Multi(hosts::Hosts::connect(opts.remotes.clone())),
            Some(url) => Backend::Remote(crate::client::Client::new(&url)),
            None => {
                let mut files = if opts.paths.is_empty() {
                    crate::cli::ensure_fleet(&dir)?.0
                } else {
                    let mut v = Vec::new();
                    for p in &opts.paths {
                        if p.is_dir() { v.extend(crate::cli::scan(p)) } else { v.push(p.clone()) }
                    }
                    v
                };
                files.extend(opts.files.iter().cloned());
                let mut seen = std::collections::HashSet::new();
                files.retain(|f| seen.insert(std::fs::canonicalize(f).unwrap_or_else(|_| f.clone())));
                // The app serves the control API over its fleet (so CLI
                // commands on its files go through it): the port first, so
                // every lock record names it.
                let bound = crate::daemon::local::bind().await?;
                let mut fleet = Fleet::new(Bus::new(), factory).stream_deltas(true).lenient(true);
                for f in &files {
                    if let Err(e) = fleet.load(f) {
                        problems.push(e);
                    }
                }
                // Agents of other runtimes reach this fleet's agents here;
                // a taken port range only means no inbound mesh.
                if let Ok(addr) = crate::runtime::mesh::server::serve(
                    fleet.mesh.clone(),
                    "127.0.0.1",
                    crate::runtime::mesh::server::DEFAULT_PORT,
                )
                .await
                {
                    crate::runtime::mesh::sweep::start(&fleet.mesh, addr.port());
                }
                Backend::Local(bound.serve(fleet, dir.clone())?)
            }
        };
        let (infos, root) = backend.agents().await?;
        // In-process, the tree is rooted where the app was opened.
        let root = if matches!(backend, Backend::Local(_)) { dir.clone() } else { root };
        let mut app = App::new(keymap, theme, glyphs);
        if let Backend::Multi(h) = &backend {
            app.attached = true;
            app.hosts = h.views();
            app = app.with_source(Box::new(source::Multi::new(h)));
            app.learn_role();
            let up = app.hosts.iter().filter(|h| h.status.connected).count();
            app.status = Some(format!(
                "attached to {up} of {} daemons (q leaves them running; a host that drops reconnects)",
                app.hosts.len()
            ));
        }
        if let Backend::Local(l) = &backend {
            app = app.with_source(Box::new(source::Local::with_api(crate::client::Client::new(&l.url))));
            app.learn_mesh();
        }
        if let Backend::Remote(c) = &backend {
            app.attached = true;
            app = app.with_source(Box::new(source::Remote::new(c.clone())));
            app.learn_role();
            let role = match app.role {
                crate::daemon::roles::Role::Owner => String::new(),
                r => format!(" with an {} token: the actions it may not take are hidden", r.as_str()),
            };
            app.status = Some(format!("attached to the daemon at {}{role} (q leaves it running)", c.base));
        }
        app.set_unconfigured(backend.unconfigured().await);
        app.set_agents(infos, &root);
        // Attached mid-turn: start from each agent's live state, not idle.
        if let Backend::Multi(h) = &backend {
            app.set_states(&h.states());
        }
        if let Backend::Remote(c) = &backend
            && let Ok(list) = c.get(&["agents"]).await
        {
            for x in list.as_array().into_iter().flatten() {
                if let (Some(id), Some(state)) = (x["id"].as_str(), x["state"].as_str())
                    && let Some(a) = app.agents.iter_mut().find(|a| a.info.id == id)
                {
                    a.state = state.to_string();
                }
            }
        }
        app.mark_foreign(&backend.foreign().await);
        if let Some((did, phrase)) = phrase {
            app.overlay = app::Overlay::Phrase { did, phrase };
        }
        if let Some(p) = problems.first() {
            app.status = Some(format!("not loaded: {p}"));
        } else if !app.attached {
            app.status =
                Some("agents run in this app and stop when it closes; `adf --daemon` keeps them running".to_string());
        }
        let result = event_loop(&mut app, &mut backend, &opts, &root).await;
        // The app's own read connections go first, so each agent's writer
        // closes its file last: it writes the marker and SQLite removes the
        // WAL and its index with it.
        drop(app);
        backend.shutdown().await;
        result
    };
    // On a worker thread, so reads from an attached daemon may block it
    // briefly (block_in_place) without stalling the runtime.
    rt.block_on(async move { tokio::spawn(main).await })?
}

fn setup(inline: bool) -> anyhow::Result<Terminal<CrosstermBackend<std::io::Stdout>>> {
    terminal::enable_raw_mode().context("the terminal app needs a terminal (try `adf agents` in scripts)")?;
    let backend = CrosstermBackend::new(std::io::stdout());
    let term = if inline {
        Terminal::with_options(backend, TerminalOptions { viewport: Viewport::Inline(20) })?
    } else {
        execute!(std::io::stdout(), terminal::EnterAlternateScreen)?;
        Terminal::new(backend)?
    };
    Ok(term)
}

const FRAME: Duration = Duration::from_millis(16);

/// Ask self-hosted servers for their agents' context windows, off the
/// loop; answers come back on the channel as (agent id, window).
fn probe_windows(app: &App, backend: &Backend) -> tokio::sync::mpsc::UnboundedReceiver<(String, u64)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    // An attached app's provider settings are the daemon's, not ours.
    if matches!(backend, Backend::Local(_)) {
        for a in &app.agents {
            let (id, cfg) = (a.info.id.clone(), app.source.config(&a.info.id));
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Some(cfg) = cfg
                    && let Some(n) = crate::providers::windows::probe(&cfg).await
                {
                    let _ = tx.send((id, n));
                }
            });
        }
    }
    rx
}

async fn event_loop(app: &mut App, backend: &mut Backend, opts: &Options, dir: &Path) -> anyhow::Result<()> {
    let out = event_loop_on(app, backend, opts, dir).await;
    // The terminal went away under the loop (a read or a draw failed with
    // it): nothing more may be written to it, or the clean shutdown that
    // follows would fail with it.
    if out.is_err() && crate::runtime::signals::terminal_gone() {
        crate::runtime::signals::detach_from_terminal();
    }
    out
}

async fn event_loop_on(app: &mut App, backend: &mut Backend, opts: &Options, dir: &Path) -> anyhow::Result<()> {
    let mut term = setup(opts.inline)?;
    let _guard = Guard { inline: opts.inline };
    // Before the keys are read: asking the terminal what pictures it
    // draws reads its answer from the same input.
    let (mode, bad) = images::Mode::from_env();
    app.picker = images::picker(mode, app.glyphs.ascii);
    if let Some(bad) = bad {
        app.status = Some(bad);
    }
    let mut keys = EventStream::new();
    let mut feed = backend.feed().await?;
    let mut windows = probe_windows(app, backend);
    let mut notices = app.take_notices().unwrap_or_else(|| tokio::sync::mpsc::unbounded_channel().1);
    // Attached to several daemons: their approval queues, read in the
    // background.
    let mut queues = match &*backend {
        Backend::Multi(h) => {
            h.load_attention();
            h.queue_updates()
        }
        _ => None,
    }
    .unwrap_or_else(|| tokio::sync::mpsc::unbounded_channel().1);
    let mut dirty = true;
    let mut last_draw = Instant::now() - FRAME;
    let mut clock = tokio::time::interval(Duration::from_secs(1));
    // A hangup (the SSH connection dropped) or a kill: leave the loop, so
    // every agent file is closed cleanly before the process ends.
    let mut stops = crate::runtime::signals::Stops::new();
    loop {
        if dirty {
            let wait = FRAME.saturating_sub(last_draw.elapsed());
            if wait.is_zero() {
                app.now_ms = crate::store::now_ms();
                term.draw(|f| ui::draw(f, app))?;
                last_draw = Instant::now();
                dirty = false;
            }
        }
        let frame_due = tokio::time::sleep(if dirty {
            FRAME.saturating_sub(last_draw.elapsed())
        } else {
            Duration::from_secs(3600)
        });
        let mut actions = Vec::new();
        tokio::select! {
            ev = keys.next() => match ev {
                Some(Ok(Event::Key(k))) if k.kind != KeyEventKind::Release => {
                    actions = app.key(k);
                    dirty = true;
                }
                Some(Ok(Event::Resize(..))) => {
                    term.autoresize()?;
                    dirty = true;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => break,
            },
            e = feed.next() => {
                if let Some(e) = e {
                    actions = app.on_event(&e);
                    dirty = true;
                }
            },
            Some(text) = notices.recv() => {
                app.status = Some(text);
                if app.main == app::MainView::Mcp {
                    app.refresh_mcp();
                }
                app.refresh_loops(app.sel);
                dirty = true;
            }
            Some(all) = queues.recv() => {
                app.set_attention(all);
                dirty = true;
            }
            Some((id, n)) = windows.recv() => {
                app.set_window(&id, n);
                dirty = true;
            }
            _ = clock.tick() => {
                app.tick(crate::store::now_ms());
                dirty = true;
            }
            _ = frame_due => {}
            sig = stops.next() => {
                if sig == "SIGHUP" {
                    crate::runtime::signals::detach_from_terminal();
                }
                break;
            }
        }
        for a in actions {
            // The editor owns the terminal's input while it runs: stop
            // reading keys (and answers to terminal queries) until it ends.
            let editor = matches!(a, Action::EditFile { .. } | Action::ComposeInEditor | Action::EditConfig { .. });
            if editor {
                drop(std::mem::replace(&mut keys, EventStream::new()));
            }
            if let Err(e) = perform(app, backend, &mut term, a, opts, dir).await {
                app.status = Some(app.humanize(&e.to_string()));
            }
            dirty = true;
        }
        if app.quit {
            break;
        }
    }
    Ok(())
}

/// The status line for an MCP change's answer.
fn mcp_answer(req: &mcp::McpRequest, v: &serde_json::Value) -> String {
    if req.segments.first().is_some_and(|s| s == "adapters") {
        return format!("{}: connecting; :channels shows how it goes", v["adapter"].as_str().unwrap_or("channel"));
    }
    if req.segments.first().is_some_and(|s| s == "loops") {
        let name = v["loop"]["name"].as_str().or(req.segments.get(1).map(String::as_str)).unwrap_or("");
        return match req.method {
            "POST" => format!(
                "created loop {name} ({}, {})",
                v["loop"]["mode"].as_str().unwrap_or(""),
                v["loop"]["status"].as_str().unwrap_or("")
            ),
            "DELETE" => format!("deleted loop {name} ({} rows archived to adf_audit)", v["archivedRows"]),
            _ => format!("loop {name}: {}", v["loop"]["status"].as_str().unwrap_or("done")),
        };
    }
    if v["success"] == false {
        let why = v["connection_error"].as_str().or(v["message"].as_str()).unwrap_or("it failed");
        return format!("{}: {why}", req.label);
    }
    match req.method {
        "POST" if req.segments.len() == 1 => format!(
            "added {}: {} tools, each asking you until you allow it (r)",
            v["server"].as_str().unwrap_or(""),
            v["tools"].as_array().map(Vec::len).unwrap_or(0)
        ),
        "POST" => format!("{}: connected, {} tools", req.segments[1], v["tools_discovered"]),
        "DELETE" => format!("removed {} and its {} tools", req.segments[1], v["tools_removed"]),
        _ => format!("{} done", req.label),
    }
}

/// Suspend the app, run the editor on `text`, resume; the edited text.
fn edit_text(
    term: &mut Terminal<CrosstermBackend<std::io::Stdout>>,
    inline: bool,
    name: &str,
    text: &str,
) -> anyhow::Result<String> {
    let dir = tempfile_dir()?;
    let file = dir.join(name.rsplit('/').next().unwrap_or("edit.md"));
    std::fs::write(&file, text)?;
    if !inline {
        execute!(std::io::stdout(), terminal::LeaveAlternateScreen, crossterm::cursor::Show)?;
    }
    terminal::disable_raw_mode()?;
    let editor = app::editor_command();
    let status =
        std::process::Command::new("sh").arg("-c").arg(format!("{editor} \"$1\"")).arg("adf-edit").arg(&file).status();
    *term = setup(inline)?;
    if !inline {
        // A fresh terminal redraws every cell on the cleared screen (no
        // cursor-position query, which some terminals never answer).
        execute!(std::io::stdout(), terminal::Clear(terminal::ClearType::All))?;
    }
    let status = status.with_context(|| format!("cannot run the editor \"{editor}\""))?;
    let out = std::fs::read_to_string(&file);
    let _ = std::fs::remove_dir_all(&dir);
    if !status.success() {
        anyhow::bail!("the editor \"{editor}\" exited with {status}; nothing was written");
    }
    Ok(out?)
}

/// `:config`: the agent's config JSON in the editor, checked before it is
/// written. A document that does not parse or brings new schema issues is
/// never written: the editor opens again on the owner's text with the
/// problems in `//` lines at its top (removed before parsing); saving it
/// empty or unchanged gives up.
async fn edit_config(
    app: &mut App,
    backend: &mut Backend,
    term: &mut Terminal<CrosstermBackend<std::io::Stdout>>,
    opts: &Options,
    dir: &Path,
    agent: &str,
) -> anyhow::Result<()> {
    let before = app.source.config(agent).ok_or_else(|| anyhow::anyhow!("{agent}: cannot read its config"))?;
    let original = serde_json::to_string_pretty(&before)?;
    let mut text = original.clone();
    let mut rejected: Option<(String, Vec<String>)> = None;
    loop {
        let edited = edit_text(term, opts.inline, "config.json", &text)?;
        let body: String = edited.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
        if body.trim().is_empty() || body.trim() == original.trim() {
            app.status = Some("config unchanged".into());
            return Ok(());
        }
        // Saved again without a change: give up, saying why.
        if let Some((last, problems)) = &rejected
            && last.trim() == body.trim()
        {
            app.status = Some(format!("config not saved: {}", problems.join("; ")));
            return Ok(());
        }
        let problems: Vec<String> = match serde_json::from_str::<serde_json::Value>(&body) {
            Err(e) => vec![format!("not JSON: {e}")],
            Ok(v) => match crate::store::config::new_issues(&before, &v) {
                issues if issues.is_empty() => {
                    backend.write_config(agent, v).await?;
                    app.set_agents(backend.agents().await?.0, dir);
                    app.set_unconfigured(backend.unconfigured().await);
                    let name = app.agents.iter().find(|a| a.info.id == agent).map(|a| a.info.name.clone());
                    app.status = Some(format!("{}: config saved", name.unwrap_or_default()));
                    return Ok(());
                }
                issues => issues.iter().map(ToString::to_string).collect(),
            },
        };
        let mut head =
            String::from("// adf: this config was NOT saved. Fix what follows, or empty the file to give up.\n");
        for p in &problems {
            head.push_str(&format!("// - {p}\n"));
        }
        text = format!("{head}{body}\n");
        rejected = Some((body, problems));
    }
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("adf-edit-{}-{}", std::process::id(), crate::store::now_ms()));
    std::fs::create_dir_all(&d)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(d)
}

/// Add or replace the provider's account in the settings file (written
/// 0600 by the accounts module); the key never reaches a log or event.
fn save_key(provider: &str, key: &str) -> anyhow::Result<()> {
    use crate::providers::accounts::{self, Account, Kind};
    let mut s = accounts::load().map_err(anyhow::Error::msg)?;
    // Local model servers: an endpoint, the key optional.
    if app::connect_is_local(provider) {
        let mut words = key.split_whitespace();
        let (kind, base_url, api_key) = if provider == "ollama" {
            let host = words.next().unwrap_or("127.0.0.1:11434");
            (Kind::Ollama, accounts::ollama_base(host), None)
        } else {
            let url = words.next().unwrap_or("");
            let parsed = url::Url::parse(url)
                .map_err(|e| anyhow::anyhow!("\"{url}\" is not a URL ({e}); e.g. http://127.0.0.1:8080/v1"))?;
            anyhow::ensure!(matches!(parsed.scheme(), "http" | "https"), "\"{url}\": use an http or https URL");
            (Kind::OpenaiCompatible, url.trim_end_matches('/').to_string(), words.next().map(str::to_string))
        };
        s.accounts.retain(|a| a.id != provider);
        s.accounts.push(Account {
            id: provider.to_string(),
            kind,
            base_url: Some(base_url),
            api_key,
            api_key_env: None,
            default_model: None,
        });
        return accounts::save(&s).map_err(anyhow::Error::msg);
    }
    let kind = match provider {
        "anthropic" => Kind::Anthropic,
        "openrouter" => Kind::Openrouter,
        _ => Kind::Openai,
    };
    // A base URL from the environment (a proxy, a local server) stays in use.
    let base_url = match kind {
        Kind::Anthropic => std::env::var("ANTHROPIC_BASE_URL").ok(),
        Kind::Openai => std::env::var("OPENAI_BASE_URL").ok(),
        _ => None,
    }
    .filter(|v| !v.is_empty());
    s.accounts.retain(|a| a.id != provider);
    s.accounts.push(Account {
        id: provider.to_string(),
        kind,
        base_url,
        api_key: Some(key.to_string()),
        api_key_env: None,
        default_model: None,
    });
    accounts::save(&s).map_err(anyhow::Error::msg)
}

async fn perform(
    app: &mut App,
    backend: &mut Backend,
    term: &mut Terminal<CrosstermBackend<std::io::Stdout>>,
    action: Action,
    opts: &Options,
    dir: &Path,
) -> anyhow::Result<()> {
    match action {
        Action::Run(Command::Start { agent }) => {
            backend.command(Command::Start { agent }).await?;
            app.set_agents(backend.agents().await?.0, dir);
            app.status = Some("started".into());
        }
        Action::Run(cmd) => backend.command(cmd).await?,
        Action::SaveKey { provider, key } => {
            save_key(&provider, &key)?;
            // A local model server: the selected agent, if it has no
            // provider yet, uses it.
            if app::connect_is_local(&provider)
                && let Some(a) = app.selected().map(|a| a.info.id.clone())
                && let Some(mut cfg) = app.source.config(&a)
                && cfg.pointer("/model/provider").and_then(|v| v.as_str()).unwrap_or("").is_empty()
            {
                cfg["model"]["provider"] = serde_json::json!(provider);
                if cfg.pointer("/model/model_id").and_then(|v| v.as_str()).unwrap_or("").is_empty() {
                    cfg["model"]["model_id"] = serde_json::json!(provider);
                }
                backend.write_config(&a, cfg).await?;
            }
            // Agents loaded without a provider take the new one up.
            backend.reload_all().await?;
            app.set_agents(backend.agents().await?.0, dir);
            app.set_unconfigured(backend.unconfigured().await);
            app.status = Some(if app::connect_is_local(&provider) {
                format!("{provider} connected (saved to the settings file)")
            } else {
                format!("{provider} connected; key saved (0600)")
            });
        }
        Action::EditFile { agent, path } => {
            if let Some(e) = app.file_entry(&agent, &path)
                && e.protection.as_str() == "read_only"
            {
                app.status = Some(format!("{path} is read_only: the owner can lift it with `adf files protect`"));
                return Ok(());
            }
            let base = app.read_file(&agent, &path);
            let mine = edit_text(term, opts.inline, &path, base.as_deref().unwrap_or(""))?;
            if let Some(text) = app.edited(&agent, &path, base.as_deref(), mine) {
                backend.write_file(&agent, &path, text).await?;
                app.status = Some(format!("{path} saved"));
                app.refresh_files();
            }
        }
        Action::WriteFile { agent, path, content } => {
            backend.write_file(&agent, &path, content).await?;
            app.status = Some(format!("{path} saved (your version)"));
            app.refresh_files();
        }
        Action::ComposeInEditor => {
            let current = app.composer.lines().join("\n");
            let text = edit_text(term, opts.inline, "message.md", &current)?;
            app.composer =
                ratatui_textarea::TextArea::from(text.trim_end().lines().map(str::to_string).collect::<Vec<_>>());
            app.focus = app::Focus::Composer;
        }
        Action::Unlock { agent, password } => match backend.unlock(&agent, password).await {
            Ok(()) => app.status = Some("credentials unlocked".into()),
            Err(e) => app.status = Some(format!("not unlocked: {e}")),
        },
        Action::Claim { agent } => match backend.claim(&agent).await {
            Ok(did) => app.status = Some(format!("claimed: the agent's new DID is {did}")),
            Err(e) => app.status = Some(format!("not claimed: {e}")),
        },
        Action::NewAgent { name, provider, model, from } => {
            // The file is named after the agent, as `adf new NAME.adf`
            // names the agent after its file: the name's slug, numbered
            // when taken.
            let stem = crate::store::create::slug(&name);
            let path = (1..)
                .map(|n| dir.join(if n == 1 { format!("{stem}.adf") } else { format!("{stem}-{n}.adf") }))
                .find(|p| !p.exists())
                .unwrap_or_else(|| dir.join(format!("{stem}.adf")));
            let seal_to = Some(crate::identity::install::current().map_err(anyhow::Error::msg)?);
            let new = crate::store::NewAgent {
                seal_to,
                name: Some(name.as_str()),
                provider: Some(provider.as_str()),
                model: Some(model.as_str()).filter(|m| !m.is_empty()),
                ..Default::default()
            };
            let id = spawn::create(&path, &name, new, from.as_ref(), dir)?;
            crate::review::mark_reviewed(&id).map_err(anyhow::Error::msg)?;
            backend.load(&path).await?;
            app.set_agents(backend.agents().await?.0, dir);
            app.set_unconfigured(backend.unconfigured().await);
            if let Some(i) = app.agents.iter().position(|a| a.info.path == path) {
                app.sel = i;
                app.refresh_files();
            }
            let file = path.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default();
            app.status = Some(format!("created {name} ({file}, {provider})"));
        }
        Action::Rename { agent, name } => {
            let mut cfg =
                app.source.config(&agent).ok_or_else(|| anyhow::anyhow!("{agent}: cannot read its config"))?;
            let old = cfg["name"].as_str().unwrap_or("").to_string();
            cfg["name"] = serde_json::Value::String(name.clone());
            backend.write_config(&agent, cfg).await?;
            app.set_agents(backend.agents().await?.0, dir);
            app.status = Some(format!("{old} is now {name} (the file keeps its name)"));
        }
        Action::EditConfig { agent } => edit_config(app, backend, term, opts, dir, &agent).await?,
        Action::MuteSkill { agent, name, on } => {
            let mut cfg =
                app.source.config(&agent).ok_or_else(|| anyhow::anyhow!("{agent}: cannot read its config"))?;
            crate::knowledge::skills::set_muted(&mut cfg, &name, on);
            backend.write_config(&agent, cfg).await?;
            app.refresh_skills();
            app.status = Some(if on {
                format!("{name} muted (kept, not offered to the model)")
            } else {
                format!("{name} offered again")
            });
        }
        Action::Mcp(req) => {
            let (client, id) = backend.api_for(&req.agent)?;
            let id = id.to_string();
            let tx = app.notices.clone();
            app.status = Some(format!("{}…", req.label));
            tokio::spawn(async move {
                let mut segs: Vec<&str> = vec!["agents", id.as_str()];
                segs.extend(req.segments.iter().map(String::as_str));
                let method = reqwest::Method::from_bytes(req.method.as_bytes()).unwrap_or(reqwest::Method::GET);
                let answer = match client.url(&segs, &[]) {
                    Ok(url) => client.call(method, url, req.body.as_ref()).await,
                    Err(e) => Err(e),
                };
                let _ = tx.send(match answer {
                    Ok(v) => mcp_answer(&req, &v),
                    Err(e) => format!("{}: {e}", req.label),
                });
            });
        }
        Action::RefreshAgents => {
            app.set_agents(backend.agents().await?.0, dir);
            if let Backend::Multi(h) = &*backend {
                app.hosts = h.views();
                app.set_states(&h.states());
                h.load_attention();
            }
            app.set_unconfigured(backend.unconfigured().await);
        }
        Action::Bell { agent, what } => {
            let mut out = std::io::stdout();
            // BEL, and OSC 9 (a desktop notification where the terminal has it).
            let _ = write!(out, "\x07\x1b]9;adf: {agent} waits for {what}\x07");
            let _ = out.flush();
        }
    }
    Ok(())
}
