//! `adf` with no command: the terminal app. This module owns the terminal
//! (raw mode, the alternate screen or an inline viewport, restoring both on
//! every exit and on panics), runs the fleet in-process, and drives the app
//! state machine from three sources: keys, the runtime's event bus, and a
//! clock for the "waiting 2m" labels. Frames are drawn on demand, at most
//! 60 per second. Editor round-trips suspend the terminal, run `$VISUAL` /
//! `$EDITOR` / `vi` on a temporary copy, and write back through the agent.

pub mod app;
pub mod bench;
pub mod chat;
pub mod commands;
pub mod highlight;
pub mod keys;
pub mod theme;
pub mod ui;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use crossterm::event::{Event, EventStream, KeyEventKind};
use crossterm::{execute, terminal};
use futures_util::StreamExt;
use ratatui::backend::CrosstermBackend;
use ratatui::{Terminal, TerminalOptions, Viewport};

use crate::protocol::Command;
use crate::runtime::agent::{AgentCommand, OwnerWork};
use crate::runtime::bus::{Bus, Filter, Item};
use crate::runtime::fleet::{Fleet, ProviderFactory, accounts_factory};
use crate::store::Caller;
use crate::store::files::WriteOptions;
use app::{Action, App};

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
        if self.inline {
            let _ = terminal::disable_raw_mode();
            let _ = execute!(std::io::stdout(), crossterm::cursor::Show);
            println!();
        } else {
            restore_terminal();
        }
    }
}

/// How to connect a provider, when an agent was loaded without one.
fn provider_hint(fleet: &Fleet) -> Option<String> {
    let why = fleet.unconfigured().values().next()?;
    Some(format!(
        "No model provider is connected ({why}), so this agent cannot think yet; files, tables and events still \
         work. Type :connect to enter a key here (saved to {}, mode 0600), or set ANTHROPIC_API_KEY, \
         OPENAI_API_KEY, OPENROUTER_API_KEY or OLLAMA_HOST and restart.",
        crate::providers::accounts::settings_path().display()
    ))
}

/// Run the app until the user quits.
pub fn run(opts: Options) -> anyhow::Result<()> {
    run_with(opts, accounts_factory())
}

pub fn run_with(opts: Options, factory: ProviderFactory) -> anyhow::Result<()> {
    let keymap = keys::Keymap::load(Some(&app::user_keymap())).map_err(anyhow::Error::msg)?;
    let theme = match &opts.theme {
        Some(t) => theme::Theme::load(t).map_err(anyhow::Error::msg)?,
        None => theme::Theme::default_theme(),
    };
    let glyphs = if opts.ascii || !utf8_locale() { chat::ASCII } else { chat::UTF8 };
    let dir = crate::paths::fleet_dir();
    let (mut files, _) = crate::cli::ensure_fleet(&dir)?;
    files.extend(opts.files.iter().cloned());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let bus = Bus::new();
        let mut fleet = Fleet::new(bus.clone(), factory).stream_deltas(true).lenient(true);
        let mut problems = Vec::new();
        for f in &files {
            if let Err(e) = fleet.load(f) {
                problems.push(e);
            }
        }
        let mut app = App::new(keymap, theme, glyphs);
        app.provider_hint = provider_hint(&fleet);
        app.set_agents(fleet.list(), &dir);
        if let Some(p) = problems.first() {
            app.status = Some(format!("not loaded: {p}"));
        }
        let result = event_loop(&mut app, &mut fleet, &bus, &opts, &dir).await;
        for e in fleet.shutdown().await {
            eprintln!("adf: {e}");
        }
        result
    })
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

async fn event_loop(
    app: &mut App,
    fleet: &mut Fleet,
    bus: &Arc<Bus>,
    opts: &Options,
    dir: &Path,
) -> anyhow::Result<()> {
    let mut term = setup(opts.inline)?;
    let _guard = Guard { inline: opts.inline };
    let mut keys = EventStream::new();
    let mut sub = bus.subscribe(None, Filter::default());
    let mut dirty = true;
    let mut last_draw = Instant::now() - FRAME;
    let mut clock = tokio::time::interval(Duration::from_secs(1));
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
            item = sub.next() => {
                if let Some(Item::Event(e)) = item {
                    actions = app.on_event(&e.event);
                    dirty = true;
                }
            },
            _ = clock.tick() => {
                app.tick(crate::store::now_ms());
                dirty = true;
            }
            _ = frame_due => {}
        }
        for a in actions {
            // The editor owns the terminal's input while it runs: stop
            // reading keys (and answers to terminal queries) until it ends.
            let editor = matches!(a, Action::EditFile { .. } | Action::ComposeInEditor);
            if editor {
                drop(std::mem::replace(&mut keys, EventStream::new()));
            }
            if let Err(e) = perform(app, fleet, &mut term, a, opts, dir).await {
                app.status = Some(e.to_string());
            }
            dirty = true;
        }
        if app.quit {
            break;
        }
    }
    Ok(())
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

/// Write a file as the owner through the agent's actor (its writer).
async fn owner_write(fleet: &Fleet, agent: &str, path: &str, content: String) -> anyhow::Result<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let p = path.to_string();
    let work = OwnerWork(Box::new(move |ex| {
        let r = ex.store.file_write(Caller::Owner, &p, content.as_bytes(), &WriteOptions::default());
        let _ = tx.send(r.map(|_| ()).map_err(|e| e.to_string()));
    }));
    fleet.send(agent, AgentCommand::With(work)).map_err(anyhow::Error::msg)?;
    rx.await
        .map_err(|_| anyhow::anyhow!("{agent}: the agent stopped before writing {path}"))?
        .map_err(anyhow::Error::msg)
}

async fn perform(
    app: &mut App,
    fleet: &mut Fleet,
    term: &mut Terminal<CrosstermBackend<std::io::Stdout>>,
    action: Action,
    opts: &Options,
    dir: &Path,
) -> anyhow::Result<()> {
    match action {
        Action::Run(Command::Start { agent }) => {
            fleet.start(&agent).await.map_err(anyhow::Error::msg)?;
            app.set_agents(fleet.list(), dir);
            app.status = Some("started".into());
        }
        Action::Run(cmd) => fleet.command(cmd).map_err(anyhow::Error::msg)?,
        Action::SaveKey { provider, key } => {
            save_key(&provider, &key)?;
            // Agents loaded without a provider take the new one up.
            for a in fleet.list() {
                fleet.reload(&a.id).await.map_err(anyhow::Error::msg)?;
            }
            app.set_agents(fleet.list(), dir);
            app.provider_hint = provider_hint(fleet);
            app.status = Some(format!("{provider} connected; key saved (0600)"));
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
                owner_write(fleet, &agent, &path, text).await?;
                app.status = Some(format!("{path} saved"));
                app.refresh_files();
            }
        }
        Action::WriteFile { agent, path, content } => {
            owner_write(fleet, &agent, &path, content).await?;
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
        Action::NewAgent => {
            let mut n = 1;
            let path = loop {
                let p = dir.join(format!("agent-{n}.adf"));
                if !p.exists() {
                    break p;
                }
                n += 1;
            };
            crate::store::create::create_file(&path, &crate::store::NewAgent::default())?;
            fleet.load(&path).map_err(anyhow::Error::msg)?;
            app.set_agents(fleet.list(), dir);
            if let Some(i) = app.agents.iter().position(|a| a.info.path == path) {
                app.sel = i;
            }
            app.status = Some(format!("created {}", path.display()));
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
