//! The terminal app's state machine, free of any terminal: keys and runtime
//! events go in, state changes and `Action`s (protocol commands, editor
//! round-trips) come out. Reads come from read-only connections to the
//! agents' files (WAL lets them run beside each agent's writer); every
//! change goes through the runtime, so the app keeps the agent's rules.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;

use ratatui_textarea::TextArea;
use serde_json::Value;

mod events;
mod fleet;

pub use fleet::{nest, serves};

use super::chat::{self, Block, Glyphs};
use super::forms::NewAgentForm;
use super::keys::Keymap;
use super::readline::LineEdit;
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
    /// Create a new agent in the fleet folder (the file named after it),
    /// blank or from a template or a clone of another agent file.
    NewAgent {
        name: String,
        provider: String,
        model: String,
        from: Option<super::forms::StartFrom>,
    },
    /// Give an agent a new name (its config's `name`; the file keeps its own).
    Rename {
        agent: String,
        name: String,
    },
    /// Edit an agent's config JSON in `$EDITOR`, validated before it is
    /// written.
    EditConfig {
        agent: String,
    },
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
    /// Read the agents again (a host came back, with what it has now).
    RefreshAgents,
    /// A change to an agent's MCP servers, run in the background; its
    /// answer comes back as a notice.
    Mcp(super::mcp::McpRequest),
    /// Mute or unmute one of an agent's skills (its `skills.muted`).
    MuteSkill {
        agent: String,
        name: String,
        on: bool,
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
    Mcp,
    Skills,
    /// The selected loop's context gauge and what takes the space.
    Context,
    /// The hottest agents by tokens a minute.
    Burn,
    /// Why the selected agent is awake or stuck.
    Why,
    /// The selected agent's logs (or tasks) with their payloads.
    Logs,
    /// The selected agent's scoped, time-boxed grants.
    Grants,
    /// The selected agent's channel adapters and how each is doing.
    Channels,
    /// Where the selected agent's commands run, its browser and desktop,
    /// its last commands.
    Compute,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Overlay {
    None,
    Palette {
        query: LineEdit,
        sel: usize,
    },
    CommandLine(LineEdit),
    /// The keys active now, scrolled this many lines.
    Help {
        scroll: usize,
    },
    /// Feedback typed for a rejection of one request or a batch:
    /// (agent, task id) each.
    Reject {
        targets: Vec<(String, String)>,
        text: LineEdit,
    },
    /// One event in full.
    Event(Box<Envelope>),
    /// A channel's token typed for an agent (shown masked, sent to the
    /// agent's API, never kept by the app).
    ChannelToken {
        agent: String,
        kind: String,
        token: String,
        /// What else the request carries (email: the address, servers).
        extra: serde_json::Value,
    },
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
    /// The owner's recovery phrase, shown once on the first run.
    Phrase {
        did: String,
        phrase: String,
    },
    /// A new agent: name, provider, model.
    NewAgent(NewAgentForm),
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
    /// The daemon it runs on, when the app is attached to several.
    pub host: String,
    /// Whether it was read from its source yet (a lazy source reads an
    /// agent when it is first shown).
    pub read: bool,
    pub folder: String,
    pub state: String,
    pub model: String,
    pub unread: usize,
    pub tokens: u64,
    /// Cost of the loop's calls where the price is known (USD).
    pub cost: f64,
    /// Input + output tokens of the last call: how much context it used.
    pub context_tokens: Option<u64>,
    /// The model's context window, where it is known (see `window`).
    pub window: Option<u64>,
    /// The last system lambda failure (`path:fn: message`), until that
    /// lambda next succeeds.
    pub lambda_error: Option<String>,
    /// The agent's DID and its parent's (`adf_parent_did`), from its file.
    pub did: String,
    pub parent_did: String,
    /// How deep under its parent it shows in the tree (0: top level).
    pub depth: usize,
    /// Its side loops (definitions and status), read with the agent.
    pub loops: Vec<Value>,
    /// Its budget nearest the limit, if it has one: (which, spent / limit).
    pub budget: Option<(&'static str, f64)>,
    /// Where it is served, when it serves (site, shared files or routes).
    pub serving: Option<String>,
}

/// Providers a key can be typed in for.
pub const CONNECT: &[&str] = &["anthropic", "openai", "openrouter", "local", "ollama"];

/// Whether `:connect` asks this provider for an endpoint (a local model
/// server) rather than a key.
pub fn connect_is_local(provider: &str) -> bool {
    matches!(provider, "local" | "ollama")
}

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
    /// Input + output tokens of this loop's last call (a side loop's
    /// gauge; main's is the agent's).
    pub context_tokens: Option<u64>,
}

impl ChatState {
    /// New rows of its loop: blocks added, the read position moved, and
    /// marked unseen when scrolled up.
    pub fn append(&mut self, rows: &[crate::store::loop_rows::LoopRow]) {
        if let Some(last) = rows.iter().map(|r| r.seq).max() {
            self.last_seq = last;
        }
        if !rows.is_empty() && self.top.is_some() {
            self.unseen = true;
        }
        chat::push_rows(&mut self.blocks, rows);
    }
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
    pub mcp: super::mcp::McpState,
    pub skills: super::skills::SkillsState,
    /// The side loop on screen per agent (absent: main).
    pub loop_sel: HashMap<String, String>,
    /// The context view's gauge (`adf context --json`'s shape) and the
    /// first part it shows (j/k scroll).
    pub context: Value,
    /// The why panel, the logs and tasks panel: what was read, the row
    /// under the cursor (also the leaderboard's), the row opened.
    pub why: Value,
    pub logs: Vec<Value>,
    pub tasks: Vec<Value>,
    pub logs_sel: usize,
    pub logs_open: Option<usize>,
    pub show_tasks: bool,
    pub grants: Vec<Value>,
    pub channels: Vec<Value>,
    /// The compute panel of the selected agent (`tui/compute.rs`).
    pub compute: Value,
    /// How pictures are drawn here (`images.rs`); none in ASCII mode or
    /// with `ADF_IMAGES=off`, and none until the terminal was set up.
    pub picker: Option<ratatui_image::picker::Picker>,
    /// The compute panel's newest screenshot, read when it changes.
    pub shot: Option<super::images::Shot>,
    pub context_top: usize,
    /// Answers of background work (MCP changes) for the status line.
    pub notices: tokio::sync::mpsc::UnboundedSender<String>,
    notices_rx: Option<tokio::sync::mpsc::UnboundedReceiver<String>>,
    pub events: VecDeque<Envelope>,
    /// The daemons the app is attached to, when several (`hosts.rs`).
    pub hosts: Vec<super::hosts::HostView>,
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
    /// Attached to a daemon: quitting leaves its agents running.
    pub attached: bool,
    /// What the token the app is attached with may do (in-process: owner).
    pub role: crate::daemon::roles::Role,
    /// The mesh server's base URL (served agents' links), from the source.
    pub mesh_url: Option<String>,
    /// `q` was pressed once while turns ran (the next one quits).
    pub(super) quit_armed: bool,
    pub now_ms: i64,
    /// Agents loaded without a model provider, by id, with why.
    pub unconfigured: HashMap<String, String>,
    /// Context windows a provider reported, by agent id (llama.cpp's
    /// `/props`); they win over the model table.
    pub windows: HashMap<String, u64>,
    /// Only the selected agent's events in the events pane.
    pub events_agent_only: bool,
    /// (time, agent id, tokens) of recent model calls, for the token burn.
    pub(super) burn: VecDeque<(i64, String, u64)>,
    /// Approvals marked for a batch answer (task ids), and how the queue
    /// is grouped.
    pub marked: std::collections::BTreeSet<String>,
    pub grouping: super::triage::Grouping,
    /// The fleet budget's tightest part: (which, spent / limit).
    pub fleet_budget: Option<(&'static str, f64)>,
    pub(super) prices: crate::providers::prices::Prices,
    /// settings.json's `model_windows` (the owner's context windows).
    pub(super) model_windows: Option<Value>,
    pub(super) source: Box<dyn Source>,
    /// The help overlay's length and visible height at the last frame
    /// (its scroll stops at the end).
    pub help_view: std::cell::Cell<(usize, usize)>,
    /// The first row the events pane showed at the last frame.
    pub events_top: std::cell::Cell<usize>,
    pub(super) preview_cache: std::cell::RefCell<Option<(String, Result<String, String>)>>,
}

impl App {
    pub fn new(keymap: Keymap, theme: Theme, glyphs: Glyphs) -> App {
        let (notices, notices_rx) = tokio::sync::mpsc::unbounded_channel();
        App {
            agents: Vec::new(),
            sel: 0,
            focus: Focus::Fleet,
            main: MainView::Chat,
            overlay: Overlay::None,
            chats: HashMap::new(),
            files: FilesState::default(),
            inbox: InboxState::default(),
            mcp: Default::default(),
            skills: Default::default(),
            loop_sel: HashMap::new(),
            context: Value::Null,
            why: Value::Null,
            logs: Vec::new(),
            tasks: Vec::new(),
            logs_sel: 0,
            logs_open: None,
            show_tasks: false,
            grants: Vec::new(),
            channels: Vec::new(),
            compute: Value::Null,
            picker: None,
            shot: None,
            context_top: 0,
            notices,
            notices_rx: Some(notices_rx),
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
            attached: false,
            role: crate::daemon::roles::Role::Owner,
            mesh_url: None,
            quit_armed: false,
            now_ms: crate::store::now_ms(),
            unconfigured: HashMap::new(),
            windows: HashMap::new(),
            events_agent_only: false,
            hosts: Vec::new(),
            burn: VecDeque::new(),
            fleet_budget: None,
            marked: Default::default(),
            grouping: Default::default(),
            model_windows: crate::providers::windows::overrides(),
            prices: crate::providers::accounts::load()
                .map(|s| crate::providers::prices::from_settings(&s))
                .unwrap_or_default(),
            source: Box::new(Local::default()),
            preview_cache: Default::default(),
            help_view: Default::default(),
            events_top: Default::default(),
        }
    }

    /// Read agents through another source (a daemon when attached).
    pub fn with_source(mut self, source: Box<dyn Source>) -> App {
        self.source = source;
        self
    }

    pub fn selected(&self) -> Option<&AgentEntry> {
        self.agents.get(self.sel)
    }

    pub(super) fn selected_id(&self) -> Option<String> {
        self.selected().map(|a| a.info.id.clone())
    }

    /// The receiving end of the notices (the event loop takes it once).
    pub fn take_notices(&mut self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        self.notices_rx.take()
    }

    pub fn refresh_mcp(&mut self) {
        let Some(id) = self.selected_id() else { return };
        self.mcp.servers = self.source.mcp(&id);
        self.mcp.sel = self.mcp.sel.min(self.mcp.rows().len().saturating_sub(1));
    }

    pub fn refresh_skills(&mut self) {
        let Some(id) = self.selected_id() else { return };
        self.skills.index = self.source.skills(&id);
        self.skills.sel = self.skills.sel.min(self.skills.len().saturating_sub(1));
    }

    pub fn refresh_inbox(&mut self) {
        let Some(id) = self.selected_id() else { return };
        self.inbox.rows = self.source.inbox(&id);
        self.inbox.sel = self.inbox.sel.min(self.inbox.rows.len().saturating_sub(1));
    }

    pub fn refresh_files(&mut self) {
        // The selection moved to an agent a lazy source has not read yet.
        if self.agents.get(self.sel).is_some_and(|a| !a.read) {
            self.read_agent(self.sel);
        }
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

    /// Agents without a model provider (id → why), for their notices.
    pub fn set_unconfigured(&mut self, why: HashMap<String, String>) {
        self.unconfigured = why;
    }

    /// A message for the owner with agent ids replaced by names, and the
    /// runtime's terse errors said as what to do.
    pub fn humanize(&self, msg: &str) -> String {
        let mut out = msg.to_string();
        for a in &self.agents {
            let stopped = out
                .strip_prefix(&format!("{}: ", a.info.id))
                .is_some_and(|rest| rest.starts_with("the agent has stopped"))
                || out.starts_with(&format!("{} has stopped", a.info.name));
            if stopped {
                return format!("{} has stopped; {} starts it", a.info.name, self.key_for("start"));
            }
            out = out.replace(&a.info.id, &a.info.name);
        }
        out
    }

    /// The first key bound to a command, in notation (or `:name`).
    pub fn key_for(&self, command: &str) -> String {
        self.keymap.keys_for(command).into_iter().next().unwrap_or_else(|| format!(":{command}"))
    }

    /// Pending items of the selected agent.
    pub fn pending_here(&self) -> Vec<&Pending> {
        let id = self.selected_id().unwrap_or_default();
        self.pending.iter().filter(|p| p.agent_id == id).collect()
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
