//! The terminal app's state machine, free of any terminal: keys and runtime
//! events go in, state changes and `Action`s (protocol commands, editor
//! round-trips) come out. Reads come from read-only connections to the
//! agents' files (WAL lets them run beside each agent's writer); every
//! change goes through the runtime, so the app keeps the agent's rules.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui_textarea::TextArea;
use serde_json::Value;

use super::chat::{self, Block, Glyphs};
use super::commands;
use super::keys::{Key, Keymap};
use super::source::{Local, Source};
use super::theme::Theme;
use crate::protocol::{Command, Envelope};
use crate::runtime::fleet::AgentInfo;
use crate::store::files::FileEntry;

/// What the runner must do for the app.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Run(Command),
    /// Open a file of an agent in `$EDITOR` and write it back if changed.
    EditFile {
        agent: String,
        path: String,
    },
    /// Write a file of an agent as the owner (through the agent's actor).
    WriteFile {
        agent: String,
        path: String,
        content: String,
    },
    /// Write the composer's text in `$EDITOR`.
    ComposeInEditor,
    /// Create a new agent in the fleet folder.
    NewAgent,
    /// Re-key the agent's file to this owner.
    Claim {
        agent: String,
    },
    /// Open the agent's credentials with a password (off the UI thread).
    Unlock {
        agent: String,
        password: String,
    },
    Bell {
        agent: String,
        what: String,
    },
    /// Save a provider key typed into the app (settings file, 0600) and
    /// reload the agents so they use it.
    SaveKey {
        provider: String,
        key: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Focus {
    Fleet,
    Main,
    Composer,
    Events,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MainView {
    Chat,
    Files,
    Approvals,
    Inbox,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Overlay {
    None,
    Palette {
        query: String,
        sel: usize,
    },
    CommandLine(String),
    Help,
    /// Feedback typed for a rejection.
    Reject {
        agent: String,
        task_id: String,
        text: String,
    },
    /// One event in full.
    Event(Box<Envelope>),
    /// The password that opens an agent's credentials (shown masked).
    Unlock {
        agent: String,
        password: String,
    },
    /// Connect a provider: pick one, type its key (shown masked).
    Connect {
        provider: usize,
        key: String,
    },
    /// Two versions of a file after an edit raced the agent.
    Conflict {
        agent: String,
        path: String,
        mine: String,
        theirs: String,
    },
}

/// An approval or ask waiting for the owner.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub agent_id: String,
    pub agent_name: String,
    pub task_id: String,
    pub ask: bool,
    pub tool: String,
    pub args: Value,
    pub reason: Option<String>,
    pub since_ms: i64,
}

/// One agent as the tree shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentEntry {
    pub info: AgentInfo,
    pub folder: String,
    pub state: String,
    pub model: String,
    pub unread: usize,
    pub tokens: u64,
    /// Cost of the loop's calls where the price is known (USD).
    pub cost: f64,
    /// Input + output tokens of the last call against the compaction
    /// threshold: how full the context is.
    pub context_pct: Option<u32>,
    /// The last system lambda failure (`path:fn: message`), until that
    /// lambda next succeeds.
    pub lambda_error: Option<String>,
}

/// Providers a key can be typed in for.
pub const CONNECT: &[&str] = &["anthropic", "openai", "openrouter"];

/// One agent's chat: blocks from its loop, the stream being written, the
/// view position.
#[derive(Debug, Default)]
pub struct ChatState {
    pub blocks: Vec<Block>,
    pub last_seq: i64,
    pub streaming: String,
    pub thinking: String,
    pub expanded: HashSet<usize>,
    /// The selected block (tool cards open with `enter`).
    pub sel: Option<usize>,
    /// The first line shown: (block, line within it); `None` follows the
    /// stream at the bottom. Only blocks on screen are ever laid out.
    pub top: Option<(usize, usize)>,
    /// Where the last frame started and its width, for scrolling from a
    /// followed view.
    pub drawn: std::cell::Cell<(usize, usize, usize)>,
    /// New lines arrived while scrolled up.
    pub unseen: bool,
}

/// The selected agent's inbox as the inbox view shows it.
#[derive(Debug, Default)]
pub struct InboxState {
    pub rows: Vec<Value>,
    pub sel: usize,
}

#[derive(Debug, Default)]
pub struct FilesState {
    pub entries: Vec<FileEntry>,
    pub sel: usize,
}

pub struct App {
    pub agents: Vec<AgentEntry>,
    pub sel: usize,
    pub focus: Focus,
    pub main: MainView,
    pub overlay: Overlay,
    pub chats: HashMap<String, ChatState>,
    pub files: FilesState,
    pub inbox: InboxState,
    pub events: VecDeque<Envelope>,
    pub events_follow: bool,
    pub events_sel: usize,
    pub events_filter: String,
    pub show_events: bool,
    pub composer: TextArea<'static>,
    pub pending: Vec<Pending>,
    pub keymap: Keymap,
    pub theme: Theme,
    pub glyphs: Glyphs,
    pub status: Option<String>,
    pub quit: bool,
    pub now_ms: i64,
    /// How to connect a provider, when none is configured.
    pub provider_hint: Option<String>,
    /// Only the selected agent's events in the events pane.
    pub events_agent_only: bool,
    /// (time, agent, tokens) of recent model calls, for the token burn.
    burn: VecDeque<(i64, usize, u64)>,
    prices: crate::providers::prices::Prices,
    source: Box<dyn Source>,
    preview_cache: std::cell::RefCell<Option<(String, Result<String, String>)>>,
}

const EVENTS_KEPT: usize = 2000;

impl App {
    pub fn new(keymap: Keymap, theme: Theme, glyphs: Glyphs) -> App {
        App {
            agents: Vec::new(),
            sel: 0,
            focus: Focus::Fleet,
            main: MainView::Chat,
            overlay: Overlay::None,
            chats: HashMap::new(),
            files: FilesState::default(),
            inbox: InboxState::default(),
            events: VecDeque::new(),
            events_follow: true,
            events_sel: 0,
            events_filter: String::new(),
            show_events: true,
            composer: TextArea::default(),
            pending: Vec::new(),
            keymap,
            theme,
            glyphs,
            status: None,
            quit: false,
            now_ms: crate::store::now_ms(),
            provider_hint: None,
            events_agent_only: false,
            burn: VecDeque::new(),
            prices: crate::providers::accounts::load()
                .map(|s| crate::providers::prices::from_settings(&s))
                .unwrap_or_default(),
            source: Box::new(Local::default()),
            preview_cache: Default::default(),
        }
    }

    /// Read agents through another source (a daemon when attached).
    pub fn with_source(mut self, source: Box<dyn Source>) -> App {
        self.source = source;
        self
    }

    /// Set the fleet (agent ids, names, paths); each gets a reader.
    pub fn set_agents(&mut self, infos: Vec<AgentInfo>, root: &std::path::Path) {
        let mut agents: Vec<AgentEntry> = infos
            .into_iter()
            .map(|info| {
                let folder = info
                    .path
                    .parent()
                    .and_then(|p| p.strip_prefix(root).ok())
                    .map(|p| p.display().to_string())
                    .unwrap_or_default();
                AgentEntry {
                    info,
                    folder,
                    state: "idle".into(),
                    model: String::new(),
                    unread: 0,
                    tokens: 0,
                    cost: 0.0,
                    context_pct: None,
                    lambda_error: None,
                }
            })
            .collect();
        agents.sort_by(|a, b| (&a.folder, &a.info.name).cmp(&(&b.folder, &b.info.name)));
        let infos: Vec<AgentInfo> = agents.iter().map(|a| a.info.clone()).collect();
        self.source.open(&infos);
        self.agents = agents;
        self.sel = self.sel.min(self.agents.len().saturating_sub(1));
        for i in 0..self.agents.len() {
            self.refresh_agent(i);
        }
        self.refresh_pending();
        self.refresh_files();
    }

    pub fn selected(&self) -> Option<&AgentEntry> {
        self.agents.get(self.sel)
    }

    fn selected_id(&self) -> Option<String> {
        self.selected().map(|a| a.info.id.clone())
    }

    /// Say in these agents' chats that their identity belongs to another
    /// owner, and how to claim them.
    pub fn mark_foreign(&mut self, ids: &[String]) {
        for id in ids {
            self.chats.entry(id.clone()).or_default().blocks.push(Block::Notice(
                "This file's identity is sealed to another owner: it cannot sign or open messages here. \
                 :claim gives it a new identity owned by you (the old DID stays in its history)."
                    .into(),
            ));
        }
    }

    /// Re-read one agent's summary and new loop rows.
    pub fn refresh_agent(&mut self, i: usize) {
        let Some(a) = self.agents.get_mut(i) else { return };
        let store = &self.source;
        let mut threshold = 100_000u64;
        if let Some(cfg) = store.config(&a.info.id) {
            a.model = cfg.pointer("/model/model_id").and_then(Value::as_str).unwrap_or("").to_string();
            threshold = cfg.pointer("/context/compact_threshold").and_then(Value::as_u64).unwrap_or(100_000).max(1);
        }
        a.unread = store.inbox_unread(&a.info.id) as usize;
        let chat = self.chats.entry(a.info.id.clone()).or_default();
        let rows = store.loop_after(&a.info.id, chat.last_seq);
        {
            if let Some(last) = rows.iter().map(|r| r.seq).max() {
                chat.last_seq = last;
            }
            for r in &rows {
                if r.role == "assistant"
                    && let Some(t) = &r.tokens
                {
                    let usage: crate::providers::Usage = serde_json::from_value(t.clone()).unwrap_or_default();
                    a.tokens += usage.input + usage.output;
                    let model = r.model.as_deref().unwrap_or(&a.model);
                    a.cost += crate::providers::prices::cost(&self.prices, model, &usage).unwrap_or(0.0);
                    a.context_pct = Some(((usage.input + usage.output) * 100 / threshold) as u32);
                }
            }
            if !rows.is_empty() && chat.top.is_some() {
                chat.unseen = true;
            }
            chat::push_rows(&mut chat.blocks, &rows);
        }
    }

    /// Re-read the whole loop (after a compaction or a clear).
    fn reload_chat(&mut self, i: usize) {
        if let Some(a) = self.agents.get(i) {
            self.chats.insert(a.info.id.clone(), ChatState::default());
            self.refresh_agent(i);
        }
    }

    /// Re-read what waits on the owner across the fleet, oldest first.
    pub fn refresh_pending(&mut self) {
        let mut out = Vec::new();
        for a in &self.agents {
            for status in ["pending_approval", "pending"] {
                for t in self.source.tasks(&a.info.id, status) {
                    let ask = t.tool == "ask";
                    if status == "pending" && !ask {
                        continue;
                    }
                    // The model's `_reason`; else why the runtime asks
                    // (`restricted`, `protection`).
                    let reason = t.args["_reason"]
                        .as_str()
                        .or(t.approval_meta.as_ref().and_then(|m| m["reason"].as_str()))
                        .map(str::to_string);
                    out.push(Pending {
                        agent_id: a.info.id.clone(),
                        agent_name: a.info.name.clone(),
                        task_id: t.id,
                        ask,
                        tool: t.tool,
                        args: t.args,
                        reason,
                        since_ms: t.created_at,
                    });
                }
            }
        }
        out.sort_by_key(|p| p.since_ms);
        self.pending = out;
    }

    pub fn refresh_inbox(&mut self) {
        let Some(id) = self.selected_id() else { return };
        self.inbox.rows = self.source.inbox(&id);
        self.inbox.sel = self.inbox.sel.min(self.inbox.rows.len().saturating_sub(1));
    }

    pub fn refresh_files(&mut self) {
        let Some(id) = self.selected_id() else { return };
        self.files.entries = self.source.files(&id);
        self.files.sel = self.files.sel.min(self.files.entries.len().saturating_sub(1));
    }

    /// A file's text (or a description of a binary one) for the preview.
    pub fn preview(&self) -> Option<(FileEntry, Result<String, String>)> {
        let id = self.selected_id()?;
        let e = self.files.entries.get(self.files.sel)?.clone();
        if !e.is_text() {
            let what = e.mime_type.clone().unwrap_or_else(|| "binary".into());
            return Some((e.clone(), Err(format!("{what}, {} bytes: not shown", e.size))));
        }
        // Frames come often; the file is read again only when it changed.
        let key = format!("{id}\u{0}{}\u{0}{}\u{0}{}", e.path, e.updated_at, e.size);
        if let Some((k, text)) = self.preview_cache.borrow().as_ref()
            && *k == key
        {
            return Some((e, text.clone()));
        }
        let text = self.source.file_text(&id, &e.path).ok_or_else(|| "cannot be read".to_string());
        *self.preview_cache.borrow_mut() = Some((key, text.clone()));
        Some((e, text))
    }

    /// Read a file's current text (the editor round-trip's base).
    pub fn read_file(&self, agent: &str, path: &str) -> Option<String> {
        self.source.file_text(agent, path)
    }

    pub fn file_entry(&self, agent: &str, path: &str) -> Option<FileEntry> {
        self.source.file_stat(agent, path)
    }

    /// A runtime event: update what it touches. Returns actions (a bell
    /// for requests on agents the owner is not looking at).
    pub fn on_event(&mut self, e: &Envelope) -> Vec<Action> {
        let mut actions = Vec::new();
        let idx = e.agent_id.as_ref().and_then(|id| self.agents.iter().position(|a| &a.info.id == id));
        let ty = e.event_type.as_ref();
        if let Some(i) = idx {
            let id = self.agents[i].info.id.clone();
            match ty {
                "turn.delta" => {
                    let chat = self.chats.entry(id).or_default();
                    let text = e.payload["text"].as_str().unwrap_or("");
                    if e.payload["kind"] == "thinking" {
                        chat.thinking.push_str(text);
                    } else {
                        chat.streaming.push_str(text);
                    }
                }
                "agent.state.changed" => {
                    self.agents[i].state = e.payload["state"].as_str().unwrap_or("idle").to_string();
                    self.refresh_agent(i);
                }
                "loop.compacted" | "loop.cleared" => self.reload_chat(i),
                "hil.requested" | "ask.requested" | "hil.resolved" | "ask.resolved" => {
                    self.refresh_agent(i);
                    self.refresh_pending();
                    if ty.ends_with("requested") && self.sel != i {
                        actions.push(Action::Bell {
                            agent: self.agents[i].info.name.clone(),
                            what: if ty == "ask.requested" { "a question" } else { "an approval" }.into(),
                        });
                    }
                }
                "file.written" | "file.deleted" if self.sel == i => self.refresh_files(),
                "message.received" => {
                    self.refresh_agent(i);
                    if self.sel == i && self.main == MainView::Inbox {
                        self.refresh_inbox();
                    }
                }
                "lambda.failed" => {
                    let at = format!(
                        "{}:{}",
                        e.payload["lambda_path"].as_str().unwrap_or("?"),
                        e.payload["function_name"].as_str().unwrap_or("main")
                    );
                    let msg = e.payload["error"].as_str().unwrap_or("failed");
                    // Code the model ran answers in the loop; only work the
                    // runtime ran on its own (triggers, timers) needs a flag.
                    if e.payload["kind"] == "system_scope" || e.payload["kind"] == "middleware" {
                        self.agents[i].lambda_error = Some(format!("{at}: {msg}"));
                        self.chats
                            .entry(id)
                            .or_default()
                            .blocks
                            .push(Block::Notice(format!("⚠ lambda {at} failed: {msg}")));
                    }
                }
                "lambda.completed" => {
                    let at = format!(
                        "{}:{}",
                        e.payload["lambda_path"].as_str().unwrap_or("?"),
                        e.payload["function_name"].as_str().unwrap_or("main")
                    );
                    if self.agents[i].lambda_error.as_ref().is_some_and(|err| err.starts_with(&format!("{at}: "))) {
                        self.agents[i].lambda_error = None;
                    }
                }
                "llm.failed" | "agent.error" => {
                    let msg = e.payload["error"].as_str().or(e.payload["message"].as_str()).unwrap_or("failed");
                    let chat = self.chats.entry(id).or_default();
                    chat.streaming.clear();
                    chat.thinking.clear();
                    chat.blocks.push(Block::Notice(format!("⚠ model call failed: {msg}")));
                    self.refresh_agent(i);
                    self.refresh_pending();
                }
                "llm.completed" => {
                    let t = e.payload["input_tokens"].as_u64().unwrap_or(0)
                        + e.payload["output_tokens"].as_u64().unwrap_or(0);
                    self.burn.push_back((e.timestamp, i, t));
                    if let Some(chat) = self.chats.get_mut(&id) {
                        chat.streaming.clear();
                        chat.thinking.clear();
                    }
                    self.refresh_agent(i);
                }
                "tool.completed" | "tool.failed" | "turn.completed" | "tool.started" | "loop.recovered" => {
                    if let Some(chat) = self.chats.get_mut(&id) {
                        chat.streaming.clear();
                        chat.thinking.clear();
                    }
                    self.refresh_agent(i);
                    if ty == "turn.completed" {
                        self.refresh_pending();
                    }
                }
                _ => {}
            }
        }
        if ty != "turn.delta" {
            self.events.push_back(e.clone());
            if self.events.len() > EVENTS_KEPT {
                self.events.pop_front();
                self.events_sel = self.events_sel.saturating_sub(1);
            }
            if self.events_follow {
                self.events_sel = self.events.len().saturating_sub(1);
            }
        }
        actions
    }

    /// `/`: filter the events pane by type and text; in a list, go to the
    /// first entry whose name contains the text.
    pub fn filter(&mut self, text: &str) {
        let t = text.to_lowercase();
        match (self.focus, self.main) {
            (Focus::Events, _) => {
                self.events_filter = text.to_string();
                self.events_follow = true;
            }
            (Focus::Main, MainView::Files) => {
                match self.files.entries.iter().position(|e| e.path.to_lowercase().contains(&t)) {
                    Some(i) => self.files.sel = i,
                    None => self.status = Some(format!("no file matches \"{text}\"")),
                }
            }
            _ => match self.agents.iter().position(|a| a.info.name.to_lowercase().contains(&t)) {
                Some(i) => {
                    self.sel = i;
                    self.refresh_files();
                }
                None => self.status = Some(format!("no agent matches \"{text}\"")),
            },
        }
    }

    /// Tokens per minute across the fleet, over the last minute.
    /// Tokens per minute of one agent (by index), or of the fleet.
    pub fn burn_per_min(&self, agent: Option<usize>) -> u64 {
        let since = self.now_ms - 60_000;
        self.burn.iter().filter(|(t, a, _)| *t >= since && agent.is_none_or(|i| i == *a)).map(|(_, _, n)| n).sum()
    }

    /// The clock ticked: forget old burn samples and re-read what waits on
    /// the owner (it may have been resolved elsewhere, by `adf approve` or
    /// another app).
    pub fn tick(&mut self, now_ms: i64) {
        self.now_ms = now_ms;
        while self.burn.front().is_some_and(|(t, _, _)| *t < now_ms - 60_000) {
            self.burn.pop_front();
        }
        let before: Vec<String> = self.pending.iter().map(|p| p.task_id.clone()).collect();
        self.refresh_pending();
        if self.pending.iter().map(|p| &p.task_id).ne(before.iter()) {
            for i in 0..self.agents.len() {
                self.refresh_agent(i);
            }
        }
    }

    /// Pending items of the selected agent.
    pub fn pending_here(&self) -> Vec<&Pending> {
        let id = self.selected_id().unwrap_or_default();
        self.pending.iter().filter(|p| p.agent_id == id).collect()
    }

    /// The events the pane shows (its filter applied).
    pub fn visible_events(&self) -> Vec<&Envelope> {
        let f = self.events_filter.to_lowercase();
        let only = if self.events_agent_only { self.selected_id() } else { None };
        self.events
            .iter()
            .filter(|e| only.is_none() || e.agent_id == only)
            .filter(|e| f.is_empty() || e.event_type.contains(&f) || e.payload.to_string().to_lowercase().contains(&f))
            .collect()
    }

    /// The contexts keys are looked up in, most specific first.
    pub fn contexts(&self) -> Vec<&'static str> {
        match self.focus {
            Focus::Composer => vec!["composer"],
            Focus::Fleet => vec!["list", "agent", "global"],
            Focus::Main if self.main == MainView::Files => vec!["files", "list", "agent", "global"],
            Focus::Main => vec!["list", "agent", "global"],
            Focus::Events => vec!["events", "list", "agent", "global"],
        }
    }

    /// One key press.
    pub fn key(&mut self, ev: KeyEvent) -> Vec<Action> {
        self.status = None;
        if !matches!(self.overlay, Overlay::None) {
            return self.overlay_key(ev);
        }
        let Some(key) = Key::from_event(&ev) else { return Vec::new() };
        let cmd = self.keymap.lookup(&self.contexts(), &key).map(str::to_string);
        match cmd {
            Some(c) => self.run(&c),
            None if self.focus == Focus::Composer => {
                self.composer.input(ev);
                Vec::new()
            }
            None => Vec::new(),
        }
    }

    fn overlay_key(&mut self, ev: KeyEvent) -> Vec<Action> {
        let ctrl = ev.modifiers.contains(KeyModifiers::CONTROL);
        match &mut self.overlay {
            Overlay::Help => {
                self.overlay = Overlay::None;
                Vec::new()
            }
            Overlay::Palette { query, sel } => match ev.code {
                KeyCode::Esc => {
                    self.overlay = Overlay::None;
                    Vec::new()
                }
                KeyCode::Enter => {
                    let hits = palette_hits(query);
                    let name = hits.get(*sel).map(|c| c.name);
                    self.overlay = Overlay::None;
                    name.map(|n| self.run(n)).unwrap_or_default()
                }
                KeyCode::Down => {
                    *sel += 1;
                    Vec::new()
                }
                KeyCode::Char('n') if ctrl => {
                    *sel += 1;
                    Vec::new()
                }
                KeyCode::Up => {
                    *sel = sel.saturating_sub(1);
                    Vec::new()
                }
                KeyCode::Char('p') if ctrl => {
                    *sel = sel.saturating_sub(1);
                    Vec::new()
                }
                KeyCode::Backspace => {
                    query.pop();
                    *sel = 0;
                    Vec::new()
                }
                KeyCode::Char(c) => {
                    query.push(c);
                    *sel = 0;
                    Vec::new()
                }
                _ => Vec::new(),
            },
            Overlay::CommandLine(text) => match ev.code {
                KeyCode::Esc => {
                    self.overlay = Overlay::None;
                    Vec::new()
                }
                KeyCode::Enter => {
                    let line = text.trim().to_string();
                    self.overlay = Overlay::None;
                    self.command_line(&line)
                }
                KeyCode::Backspace => {
                    if text.pop().is_none() {
                        self.overlay = Overlay::None;
                    }
                    Vec::new()
                }
                KeyCode::Char(c) => {
                    text.push(c);
                    Vec::new()
                }
                _ => Vec::new(),
            },
            Overlay::Reject { agent, task_id, text } => match ev.code {
                KeyCode::Esc => {
                    self.overlay = Overlay::None;
                    Vec::new()
                }
                KeyCode::Enter => {
                    let feedback = (!text.trim().is_empty()).then(|| text.trim().to_string());
                    let cmd = Command::Deny { agent: agent.clone(), task_id: task_id.clone(), feedback };
                    let id = task_id.clone();
                    self.overlay = Overlay::None;
                    self.pending.retain(|p| p.task_id != id);
                    vec![Action::Run(cmd)]
                }
                KeyCode::Backspace => {
                    text.pop();
                    Vec::new()
                }
                KeyCode::Char(c) => {
                    text.push(c);
                    Vec::new()
                }
                _ => Vec::new(),
            },
            Overlay::Conflict { agent, path, mine, .. } => match ev.code {
                // Keep mine: write it over the agent's version.
                KeyCode::Char('m') => {
                    let out =
                        vec![Action::WriteFile { agent: agent.clone(), path: path.clone(), content: mine.clone() }];
                    self.overlay = Overlay::None;
                    out
                }
                KeyCode::Char('t') | KeyCode::Esc => {
                    self.overlay = Overlay::None;
                    self.status = Some("kept the agent's version".into());
                    Vec::new()
                }
                _ => Vec::new(),
            },
            Overlay::Event(_) => {
                self.overlay = Overlay::None;
                Vec::new()
            }
            Overlay::Unlock { agent, password } => match ev.code {
                KeyCode::Esc => {
                    self.overlay = Overlay::None;
                    Vec::new()
                }
                KeyCode::Backspace => {
                    password.pop();
                    Vec::new()
                }
                KeyCode::Enter if !password.is_empty() => {
                    let a = Action::Unlock { agent: agent.clone(), password: std::mem::take(password) };
                    self.overlay = Overlay::None;
                    self.status = Some("unlocking…".into());
                    vec![a]
                }
                KeyCode::Char(c) if !ctrl => {
                    password.push(c);
                    Vec::new()
                }
                _ => Vec::new(),
            },
            Overlay::Connect { provider, key } => match ev.code {
                KeyCode::Esc => {
                    self.overlay = Overlay::None;
                    Vec::new()
                }
                KeyCode::Tab | KeyCode::Right | KeyCode::Down => {
                    *provider = (*provider + 1) % CONNECT.len();
                    Vec::new()
                }
                KeyCode::BackTab | KeyCode::Left | KeyCode::Up => {
                    *provider = (*provider + CONNECT.len() - 1) % CONNECT.len();
                    Vec::new()
                }
                KeyCode::Backspace => {
                    key.pop();
                    Vec::new()
                }
                KeyCode::Enter if !key.trim().is_empty() => {
                    let a = Action::SaveKey { provider: CONNECT[*provider].to_string(), key: key.trim().to_string() };
                    self.overlay = Overlay::None;
                    vec![a]
                }
                KeyCode::Char(c) if !ctrl => {
                    key.push(c);
                    Vec::new()
                }
                _ => Vec::new(),
            },
            Overlay::None => Vec::new(),
        }
    }

    /// `:` line: a command name or alias, with arguments for some.
    pub fn command_line(&mut self, line: &str) -> Vec<Action> {
        let mut parts = line.split_whitespace();
        let Some(name) = parts.next() else { return Vec::new() };
        if name == "filter" {
            let text = parts.collect::<Vec<_>>().join(" ");
            self.filter(&text);
            return Vec::new();
        }
        match commands::find(name) {
            Some(c) if c.palette => self.run(c.name),
            _ => {
                let hint = commands::closest(name).map(|c| format!(" (did you mean :{c}?)")).unwrap_or_default();
                self.status = Some(format!("unknown command \"{name}\"{hint}"));
                Vec::new()
            }
        }
    }

    fn first_pending(&self) -> Option<Pending> {
        match (self.main, self.focus) {
            (MainView::Approvals, Focus::Main) => {
                self.pending.get(self.files.sel.min(self.pending.len().saturating_sub(1))).cloned()
            }
            _ => self.pending_here().into_iter().find(|p| !p.ask).cloned(),
        }
    }

    fn agent_cmd(&mut self, f: impl FnOnce(String) -> Command) -> Vec<Action> {
        match self.selected_id() {
            Some(id) => vec![Action::Run(f(id))],
            None => {
                self.status = Some("no agent selected".into());
                Vec::new()
            }
        }
    }

    /// Run a command by name.
    pub fn run(&mut self, name: &str) -> Vec<Action> {
        let name = commands::find(name).map(|c| c.name).unwrap_or(name);
        match name {
            "quit" => {
                self.quit = true;
                Vec::new()
            }
            "help" => {
                self.overlay = Overlay::Help;
                Vec::new()
            }
            "palette" => {
                self.overlay = Overlay::Palette { query: String::new(), sel: 0 };
                Vec::new()
            }
            "command_line" => {
                self.overlay = Overlay::CommandLine(String::new());
                Vec::new()
            }
            "agents" | "chat" => {
                self.main = MainView::Chat;
                self.focus = if name == "agents" { Focus::Fleet } else { Focus::Main };
                Vec::new()
            }
            "approvals" => {
                self.main = MainView::Approvals;
                self.focus = Focus::Main;
                self.files.sel = 0;
                self.refresh_pending();
                Vec::new()
            }
            "files" => {
                self.main = MainView::Files;
                self.focus = Focus::Main;
                self.refresh_files();
                Vec::new()
            }
            "inbox" => {
                self.main = MainView::Inbox;
                self.focus = Focus::Main;
                self.inbox.sel = 0;
                self.refresh_inbox();
                Vec::new()
            }
            "events" => {
                self.show_events = !self.show_events;
                if self.show_events {
                    self.focus = Focus::Events;
                } else if self.focus == Focus::Events {
                    self.focus = Focus::Fleet;
                }
                Vec::new()
            }
            "follow" => {
                self.events_follow = !self.events_follow;
                if self.events_follow {
                    self.events_sel = self.events.len().saturating_sub(1);
                }
                Vec::new()
            }
            "filter" => {
                self.overlay = Overlay::CommandLine("filter ".into());
                Vec::new()
            }
            "connect" => {
                self.overlay = Overlay::Connect { provider: 0, key: String::new() };
                Vec::new()
            }
            "events_scope" => {
                self.events_agent_only = !self.events_agent_only;
                self.events_sel = self.visible_events().len().saturating_sub(1);
                Vec::new()
            }
            "next_pane" | "previous_pane" => {
                let order: Vec<Focus> = if self.show_events {
                    vec![Focus::Fleet, Focus::Main, Focus::Composer, Focus::Events]
                } else {
                    vec![Focus::Fleet, Focus::Main, Focus::Composer]
                };
                let i = order.iter().position(|f| *f == self.focus).unwrap_or(0);
                let n = order.len();
                self.focus = order[if name == "next_pane" { (i + 1) % n } else { (i + n - 1) % n }];
                Vec::new()
            }
            "back" => {
                if self.main != MainView::Chat {
                    self.main = MainView::Chat;
                } else {
                    self.focus = Focus::Fleet;
                }
                Vec::new()
            }
            "leave_composer" => {
                self.focus = Focus::Main;
                Vec::new()
            }
            "focus_composer" => {
                self.focus = Focus::Composer;
                self.main = MainView::Chat;
                Vec::new()
            }
            "down" | "up" | "page_down" | "page_up" | "top" | "bottom" => {
                self.move_sel(name);
                Vec::new()
            }
            "open" => self.open(),
            "send" => self.send(),
            "newline" => {
                self.composer.insert_newline();
                Vec::new()
            }
            "compose_in_editor" => vec![Action::ComposeInEditor],
            "interrupt" => self.agent_cmd(|agent| Command::Interrupt { agent }),
            "start" => self.agent_cmd(|agent| Command::Start { agent }),
            "stop" => self.agent_cmd(|agent| Command::Stop { agent }),
            "idle" | "hibernate" => {
                let state = name.to_string();
                self.agent_cmd(|agent| Command::SetState { agent, state })
            }
            "emergency_stop" => vec![Action::Run(Command::EmergencyStop)],
            "new_agent" => vec![Action::NewAgent],
            "unlock" => match self.selected_id() {
                Some(agent) => {
                    self.overlay = Overlay::Unlock { agent, password: String::new() };
                    Vec::new()
                }
                None => {
                    self.status = Some("no agent selected".into());
                    Vec::new()
                }
            },
            "claim" => match self.selected_id() {
                Some(agent) => vec![Action::Claim { agent }],
                None => {
                    self.status = Some("no agent selected".into());
                    Vec::new()
                }
            },
            "approve_once" | "approve_always" => match self.first_pending() {
                Some(p) => {
                    self.pending.retain(|x| x.task_id != p.task_id);
                    vec![Action::Run(Command::Approve {
                        agent: p.agent_id,
                        task_id: p.task_id,
                        always: name == "approve_always",
                    })]
                }
                None => {
                    self.status = Some("nothing waits for approval here".into());
                    Vec::new()
                }
            },
            "reject" => match self.first_pending() {
                Some(p) => {
                    self.overlay = Overlay::Reject { agent: p.agent_id, task_id: p.task_id, text: String::new() };
                    Vec::new()
                }
                None => {
                    self.status = Some("nothing waits for approval here".into());
                    Vec::new()
                }
            },
            "edit_mind" => match self.selected_id() {
                Some(agent) => vec![Action::EditFile { agent, path: "mind.md".into() }],
                None => Vec::new(),
            },
            "edit_file" => {
                let path = self.files.entries.get(self.files.sel).map(|e| e.path.clone());
                match (self.selected_id(), path) {
                    (Some(agent), Some(path)) if self.main == MainView::Files => vec![Action::EditFile { agent, path }],
                    _ => {
                        self.status = Some("select a file first (:files)".into());
                        Vec::new()
                    }
                }
            }
            other => {
                self.status = Some(format!("\"{other}\" does nothing here"));
                Vec::new()
            }
        }
    }

    fn move_sel(&mut self, how: &str) {
        let step = |cur: usize, len: usize| -> usize {
            if len == 0 {
                return 0;
            }
            match how {
                "down" => (cur + 1).min(len - 1),
                "up" => cur.saturating_sub(1),
                "page_down" => (cur + 10).min(len - 1),
                "page_up" => cur.saturating_sub(10),
                "top" => 0,
                _ => len - 1,
            }
        };
        match (self.focus, self.main) {
            (Focus::Fleet, _) => {
                let before = self.sel;
                self.sel = step(self.sel, self.agents.len());
                if before != self.sel {
                    self.files.sel = 0;
                    self.refresh_files();
                }
            }
            (Focus::Main, MainView::Files) => self.files.sel = step(self.files.sel, self.files.entries.len()),
            (Focus::Main, MainView::Approvals) => self.files.sel = step(self.files.sel, self.pending.len()),
            (Focus::Main, MainView::Inbox) => self.inbox.sel = step(self.inbox.sel, self.inbox.rows.len()),
            (Focus::Main, MainView::Chat) => {
                let Some(id) = self.selected_id() else { return };
                let (theme, glyphs) = (&self.theme, &self.glyphs);
                let chat = self.chats.entry(id).or_default();
                let len = chat.blocks.len();
                if len == 0 {
                    return;
                }
                let (b0, o0, width) = chat.drawn.get();
                let height_of = |chat: &ChatState, i: usize| {
                    chat::layout(&chat.blocks[i], width.max(20), chat.expanded.contains(&i), false, theme, glyphs).len()
                };
                match how {
                    "page_up" | "page_down" => {
                        // Ten lines at a time from where the view is.
                        let (mut b, mut o) = chat.top.unwrap_or((b0, o0));
                        if how == "page_up" {
                            let mut n = 10;
                            while n > 0 {
                                if o >= n {
                                    o -= n;
                                    n = 0;
                                } else if b == 0 {
                                    o = 0;
                                    n = 0;
                                } else {
                                    n -= o + 1;
                                    b -= 1;
                                    o = height_of(chat, b).saturating_sub(1);
                                }
                            }
                            chat.top = Some((b, o));
                        } else {
                            o += 10;
                            while b < len && o >= height_of(chat, b) {
                                o -= height_of(chat, b);
                                b += 1;
                            }
                            chat.top = if b >= len.saturating_sub(1) { None } else { Some((b, o)) };
                        }
                        chat.sel = None;
                    }
                    "bottom" => {
                        chat.top = None;
                        chat.sel = Some(len - 1);
                    }
                    "top" => {
                        chat.top = Some((0, 0));
                        chat.sel = Some(0);
                    }
                    _ => {
                        // Moving the block selection scrolls with it.
                        let cur = chat.sel.unwrap_or(if how == "up" { len } else { len - 1 });
                        let next = if how == "up" { cur.saturating_sub(1) } else { (cur + 1).min(len - 1) };
                        chat.sel = Some(next);
                        let first = chat.top.map(|t| t.0).unwrap_or(b0);
                        if next < first {
                            chat.top = Some((next, 0));
                        } else if chat.top.is_some() && how == "down" && next > first + 3 {
                            chat.top = Some((first + 1, 0));
                        }
                    }
                }
                if chat.top.is_none() || chat.sel == Some(len - 1) && how == "down" {
                    chat.top = if chat.sel == Some(len - 1) { None } else { chat.top };
                    chat.unseen = false;
                }
            }
            (Focus::Events, _) => {
                self.events_sel = step(self.events_sel, self.events.len());
                self.events_follow = self.events_sel + 1 >= self.events.len();
            }
            (Focus::Composer, _) => {}
        }
    }

    fn open(&mut self) -> Vec<Action> {
        match (self.focus, self.main) {
            (Focus::Fleet, _) => {
                self.focus = Focus::Main;
                self.main = MainView::Chat;
            }
            (Focus::Main, MainView::Chat) => {
                if let Some(id) = self.selected_id() {
                    let chat = self.chats.entry(id).or_default();
                    if let Some(s) = chat.sel
                        && !chat.expanded.remove(&s)
                    {
                        chat.expanded.insert(s);
                    }
                }
            }
            (Focus::Main, MainView::Files) => return self.run("edit_file"),
            (Focus::Events, _) => {
                let events = self.visible_events();
                let i = if self.events_follow { events.len().saturating_sub(1) } else { self.events_sel };
                if let Some(e) = events.get(i).map(|e| Box::new((*e).clone())) {
                    self.overlay = Overlay::Event(e);
                }
            }
            (Focus::Main, MainView::Approvals) => {
                if let Some(p) = self.pending.get(self.files.sel).cloned()
                    && let Some(i) = self.agents.iter().position(|a| a.info.id == p.agent_id)
                {
                    self.sel = i;
                    self.main = MainView::Chat;
                }
            }
            _ => {}
        }
        Vec::new()
    }

    /// Send the composer: answers a pending ask of the agent first.
    fn send(&mut self) -> Vec<Action> {
        let text = self.composer.lines().join("\n");
        if text.trim().is_empty() {
            return Vec::new();
        }
        let Some(id) = self.selected_id() else {
            self.status = Some("no agent selected".into());
            return Vec::new();
        };
        self.composer = TextArea::default();
        if let Some(ask) = self.pending_here().into_iter().find(|p| p.ask).cloned() {
            self.pending.retain(|p| p.task_id != ask.task_id);
            return vec![Action::Run(Command::Answer { agent: id, request_id: ask.task_id, text })];
        }
        if let Some(chat) = self.chats.get_mut(&id) {
            chat.top = None;
            chat.sel = None;
        }
        vec![Action::Run(Command::SendChat { agent: id, r#loop: "main".into(), text })]
    }

    /// Key hints for the bottom line, from the keymap.
    pub fn hints(&self) -> Vec<(String, &'static str)> {
        let names: &[&str] = match self.focus {
            Focus::Composer => &["send", "newline", "compose_in_editor", "leave_composer"],
            Focus::Main if self.main == MainView::Files => {
                &["down", "edit_file", "edit_mind", "back", "palette", "quit"]
            }
            Focus::Main if self.main == MainView::Inbox => &["down", "back", "command_line", "palette", "help", "quit"],
            _ => &[
                "down",
                "open",
                "focus_composer",
                "approve_once",
                "edit_mind",
                "command_line",
                "palette",
                "help",
                "quit",
            ],
        };
        names
            .iter()
            .filter_map(|n| {
                let k = self.keymap.keys_for(n);
                let c = commands::find(n)?;
                Some((k.first()?.clone(), short(c.name)))
            })
            .collect()
    }

    /// The editor round-trip's result: write back unless the agent changed
    /// the file meanwhile (then ask which version to keep).
    pub fn edited(&mut self, agent: &str, path: &str, base: Option<&str>, mine: String) -> Option<String> {
        if base == Some(mine.as_str()) {
            self.status = Some(format!("{path}: unchanged"));
            return None;
        }
        let now = self.read_file(agent, path);
        if now.as_deref() != base {
            self.overlay = Overlay::Conflict {
                agent: agent.to_string(),
                path: path.to_string(),
                mine,
                theirs: now.unwrap_or_default(),
            };
            return None;
        }
        Some(mine)
    }
}

fn short(name: &'static str) -> &'static str {
    match name {
        "down" => "move",
        "open" => "open",
        "focus_composer" => "write",
        "approve_once" => "approve",
        "edit_mind" => "mind",
        "edit_file" => "edit",
        "command_line" => "command",
        "palette" => "palette",
        "compose_in_editor" => "$EDITOR",
        "leave_composer" => "leave",
        other => other,
    }
}

/// Palette commands matching a query, best first (nucleo's fuzzy score).
pub fn palette_hits(query: &str) -> Vec<&'static commands::CommandDef> {
    use nucleo::pattern::{CaseMatching, Normalization, Pattern};
    let all: Vec<&commands::CommandDef> = commands::ALL.iter().filter(|c| c.palette).collect();
    if query.is_empty() {
        return all;
    }
    let mut matcher = nucleo::Matcher::new(nucleo::Config::DEFAULT);
    let pattern = Pattern::parse(query, CaseMatching::Ignore, Normalization::Smart);
    let mut scored: Vec<(u32, &commands::CommandDef)> = all
        .into_iter()
        .filter_map(|c| {
            let hay = format!("{} {}", c.name.replace('_', " "), c.description);
            let mut buf = Vec::new();
            pattern.score(nucleo::Utf32Str::new(&hay, &mut buf), &mut matcher).map(|s| (s, c))
        })
        .collect();
    scored.sort_by_key(|s| std::cmp::Reverse(s.0));
    scored.into_iter().map(|(_, c)| c).collect()
}

/// A file edited outside, to write back through the agent.
pub fn editor_command() -> String {
    std::env::var("VISUAL")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .or_else(|| std::env::var("EDITOR").ok().filter(|v| !v.trim().is_empty()))
        .unwrap_or_else(|| "vi".into())
}

/// Where the user's keymap lives.
pub fn user_keymap() -> PathBuf {
    crate::paths::config_dir().join("keymaps.toml")
}
