//! The terminal app's state machine, free of any terminal: keys and runtime
//! events go in, state changes and `Action`s (protocol commands, editor
//! round-trips) come out. Reads come from read-only connections to the
//! agents' files (WAL lets them run beside each agent's writer); every
//! change goes through the runtime, so the app keeps the agent's rules.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;

use ratatui_textarea::TextArea;
use serde_json::Value;

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

/// Does an agent's config serve anything (`serving`: public, shared or
/// API routes)?
pub fn serves(cfg: &Value) -> bool {
    let s = &cfg["serving"];
    // An agent whose visibility is off serves nothing, whatever it declares.
    cfg["messaging"]["visibility"] != "off"
        && (s["public"]["enabled"] == true
            || s["shared"]["enabled"] == true
            || s["api"].as_array().is_some_and(|a| !a.is_empty()))
}

/// An agent file's DID and parent DID (empty when unreadable).
fn lineage(path: &std::path::Path) -> (String, String) {
    let Ok(store) = crate::store::Store::open_read_only(path) else { return Default::default() };
    let get = |k: &str| store.meta_get(k).ok().flatten().map(|m| m.value).unwrap_or_default();
    (get("adf_did"), get("adf_parent_did"))
}

/// A task waiting on the owner as the queue shows it.
fn pending_from(agent_id: String, agent_name: String, t: crate::store::tasks::Task) -> Pending {
    // The model's `_reason`; else why the runtime asks (`restricted`,
    // `protection`).
    let reason =
        t.args["_reason"].as_str().or(t.approval_meta.as_ref().and_then(|m| m["reason"].as_str())).map(str::to_string);
    Pending {
        agent_id,
        agent_name,
        task_id: t.id,
        ask: t.tool == "ask",
        tool: t.tool,
        args: t.args,
        reason,
        since_ms: t.created_at,
    }
}

/// Children follow their parent (the agent whose DID is their
/// `adf_parent_did`), one level deeper; agents whose parent is not in the
/// fleet stay top level, in the order given.
pub fn nest(agents: Vec<AgentEntry>) -> Vec<AgentEntry> {
    let n = agents.len();
    let by_did: HashMap<&str, usize> =
        agents.iter().enumerate().filter(|(_, a)| !a.did.is_empty()).map(|(i, a)| (a.did.as_str(), i)).collect();
    let mut children = vec![Vec::new(); n];
    let mut roots = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        match by_did.get(a.parent_did.as_str()).copied().filter(|&p| p != i) {
            Some(p) => children[p].push(i),
            None => roots.push(i),
        }
    }
    let mut order = Vec::with_capacity(n);
    let mut seen = vec![false; n];
    fn visit(i: usize, depth: usize, children: &[Vec<usize>], seen: &mut [bool], order: &mut Vec<(usize, usize)>) {
        if seen[i] {
            return;
        }
        seen[i] = true;
        order.push((i, depth));
        for &c in &children[i] {
            visit(c, depth + 1, children, seen, order);
        }
    }
    for r in roots {
        visit(r, 0, &children, &mut seen, &mut order);
    }
    // A parent loop (two files naming each other) shows flat.
    for i in 0..n {
        visit(i, 0, &children, &mut seen, &mut order);
    }
    let mut slots: Vec<Option<AgentEntry>> = agents.into_iter().map(Some).collect();
    order
        .into_iter()
        .filter_map(|(i, depth)| {
            slots[i].take().map(|mut a| {
                a.depth = depth;
                a
            })
        })
        .collect()
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

const EVENTS_KEPT: usize = 2000;

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

    /// Set the fleet (agent ids, names, paths); each gets a reader.
    pub fn set_agents(&mut self, infos: Vec<AgentInfo>, root: &std::path::Path) {
        let multi = !self.hosts.is_empty();
        let mut agents: Vec<AgentEntry> = infos
            .into_iter()
            .map(|info| {
                let folder = info
                    .path
                    .parent()
                    .and_then(|p| p.strip_prefix(root).ok())
                    .map(|p| p.display().to_string())
                    .unwrap_or_default();
                // Attached to several daemons: the path starts with its host.
                let (host, folder) = match super::hosts::split(&info.id) {
                    Some((_, h)) if multi => {
                        let rest = folder.strip_prefix(h).unwrap_or(&folder).trim_start_matches('/').to_string();
                        (h.to_string(), rest)
                    }
                    _ => (String::new(), folder),
                };
                AgentEntry {
                    info,
                    host,
                    read: false,
                    folder,
                    state: "idle".into(),
                    model: String::new(),
                    unread: 0,
                    tokens: 0,
                    cost: 0.0,
                    context_tokens: None,
                    window: None,
                    lambda_error: None,
                    did: String::new(),
                    parent_did: String::new(),
                    depth: 0,
                    loops: Vec::new(),
                    budget: None,
                    serving: None,
                }
            })
            .collect();
        // An agent on another machine has no file here to read.
        if !multi {
            for a in agents.iter_mut() {
                (a.did, a.parent_did) = lineage(&a.info.path);
            }
        }
        agents.sort_by(|a, b| (&a.host, &a.folder, &a.info.name).cmp(&(&b.host, &b.folder, &b.info.name)));
        let agents = nest(agents);
        let infos: Vec<AgentInfo> = agents.iter().map(|a| a.info.clone()).collect();
        self.source.open(&infos);
        // The selection stays with its agent when the list changes.
        let selected = self.selected_id();
        self.agents = agents;
        self.sel = selected
            .and_then(|id| self.agents.iter().position(|a| a.info.id == id))
            .unwrap_or(self.sel)
            .min(self.agents.len().saturating_sub(1));
        // A source far away reads an agent when it is first shown (or
        // something happens to it); a local one reads them all now.
        let lazy = self.source.lazy();
        for i in 0..self.agents.len() {
            if !lazy || i == self.sel {
                self.read_agent(i);
            }
        }
        self.refresh_fleet();
        // A lazy source's queue comes in the background (`hosts.rs`); until
        // then, what was known of agents still here stays.
        if lazy {
            let here: std::collections::HashSet<&str> = self.agents.iter().map(|a| a.info.id.as_str()).collect();
            self.pending.retain(|p| here.contains(p.agent_id.as_str()));
        } else {
            self.refresh_pending();
        }
        self.refresh_files();
    }

    pub fn selected(&self) -> Option<&AgentEntry> {
        self.agents.get(self.sel)
    }

    pub(super) fn selected_id(&self) -> Option<String> {
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

    /// Everything the app shows of agent `i`, read (again).
    pub(super) fn read_agent(&mut self, i: usize) {
        self.refresh_agent(i);
        self.refresh_loops(i);
        self.refresh_budget(i);
    }

    /// Re-read one agent's summary and new loop rows.
    pub fn refresh_agent(&mut self, i: usize) {
        let Some(a) = self.agents.get_mut(i) else { return };
        a.read = true;
        let store = &self.source;
        let cfg = store.config(&a.info.id);
        if let Some(cfg) = &cfg {
            a.model = cfg.pointer("/model/model_id").and_then(Value::as_str).unwrap_or("").to_string();
            a.serving = serves(cfg).then(|| match &self.mesh_url {
                Some(base) => format!("{base}/agents/{}/", a.info.handle),
                None => format!("/agents/{}/ (no mesh server)", a.info.handle),
            });
        }
        a.window = super::window::resolve(
            cfg.as_ref(),
            &a.model,
            self.model_windows.as_ref(),
            self.windows.get(&a.info.id).copied(),
        );
        a.unread = store.inbox_unread(&a.info.id) as usize;
        let chat = self.chats.entry(a.info.id.clone()).or_default();
        let rows = store.loop_after(&a.info.id, chat.last_seq);
        {
            for r in &rows {
                if r.role == "assistant"
                    && let Some(t) = &r.tokens
                {
                    let usage: crate::providers::Usage = serde_json::from_value(t.clone()).unwrap_or_default();
                    a.tokens += usage.input + usage.output;
                    let model = r.model.as_deref().unwrap_or(&a.model);
                    a.cost += crate::providers::prices::cost(&self.prices, model, &usage).unwrap_or(0.0);
                    a.context_tokens = Some(usage.input + usage.output);
                }
            }
            chat.append(&rows);
        }
        // The side loop on screen follows too (the loops themselves are
        // read again when one changes: `loop.state.changed`, a `:loop`).
        let id = a.info.id.clone();
        if let Some(name) = self.loop_sel.get(&id).cloned() {
            self.refresh_side_chat(&id, &name);
        }
    }

    /// Read agent `i`'s budget use again (after a call, a stop).
    pub fn refresh_budget(&mut self, i: usize) {
        let Some(a) = self.agents.get(i) else { return };
        let uses = self.source.budgets(&a.info.id);
        self.agents[i].budget = uses.iter().find(|u| u.scope == "agent").and_then(|u| u.tightest());
    }

    /// Ask the source what the app's token may do.
    /// Learn where served agents are (the mesh server's URL).
    pub fn learn_mesh(&mut self) {
        self.mesh_url = self.source.mesh_url();
    }

    pub fn learn_role(&mut self) {
        self.role = self.source.role();
        self.mesh_url = self.source.mesh_url();
    }

    /// The fleet budget's gauge, and a ledger problem to tell the owner.
    pub fn refresh_fleet(&mut self) {
        let (fleet, notice) = self.source.fleet();
        self.fleet_budget = fleet.and_then(|u| u.tightest());
        if let Some(n) = notice {
            self.status = Some(format!("usage ledger: {n}"));
        }
    }

    /// Re-read the whole loop (after a compaction or a clear).
    pub(super) fn reload_chat(&mut self, i: usize) {
        if let Some(a) = self.agents.get(i) {
            self.chats.insert(a.info.id.clone(), ChatState::default());
            self.refresh_agent(i);
        }
    }

    /// Re-read what waits on the owner across the fleet, oldest first.
    pub fn refresh_pending(&mut self) {
        self.pending = self.agents.iter().flat_map(|a| self.pending_of(a)).collect();
        self.pending.sort_by_key(|p| p.since_ms);
    }

    /// What waits on the owner across the fleet, as (agent id, task).
    pub fn set_attention(&mut self, all: Vec<(String, crate::store::tasks::Task)>) {
        let names: HashMap<&str, &str> =
            self.agents.iter().map(|a| (a.info.id.as_str(), a.info.name.as_str())).collect();
        let mut out: Vec<Pending> = all
            .into_iter()
            .filter_map(|(id, t)| {
                let name = names.get(id.as_str())?.to_string();
                Some(pending_from(id, name, t))
            })
            .collect();
        out.sort_by_key(|p| p.since_ms);
        self.pending = out;
    }

    /// Re-read what one agent has waiting on the owner.
    pub fn refresh_pending_of(&mut self, i: usize) {
        let Some(a) = self.agents.get(i) else { return };
        let fresh = self.pending_of(a);
        let id = a.info.id.clone();
        self.pending.retain(|p| p.agent_id != id);
        self.pending.extend(fresh);
        self.pending.sort_by_key(|p| p.since_ms);
    }

    fn pending_of(&self, a: &AgentEntry) -> Vec<Pending> {
        let mut out = Vec::new();
        for status in ["pending_approval", "pending"] {
            for t in self.source.tasks(&a.info.id, status) {
                if status == "pending" && t.tool != "ask" {
                    continue;
                }
                out.push(pending_from(a.info.id.clone(), a.info.name.clone(), t));
            }
        }
        out
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

    /// A runtime event: update what it touches. Returns actions (a bell
    /// for requests on agents the owner is not looking at).
    pub fn on_event(&mut self, e: &Envelope) -> Vec<Action> {
        let mut actions = Vec::new();
        if e.event_type.starts_with("host.") {
            actions.extend(self.on_host_event(e));
        }
        let idx = e.agent_id.as_ref().and_then(|id| self.agents.iter().position(|a| &a.info.id == id));
        let ty = e.event_type.as_ref();
        if let Some(i) = idx {
            let id = self.agents[i].info.id.clone();
            // A side loop's events belong to its chat.
            let key = super::loops::chat_key(&id, super::loops::event_loop(&e.payload));
            match ty {
                "turn.delta" => {
                    let chat = self.chats.entry(key).or_default();
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
                "loop.compacted" | "loop.cleared" if key == id => self.reload_chat(i),
                "loop.compacted" | "loop.cleared" => {
                    self.chats.remove(&key);
                    self.refresh_loops(i);
                }
                "loop.state.changed" => self.refresh_loops(i),
                "hil.requested" | "ask.requested" | "hil.resolved" | "ask.resolved" => {
                    self.refresh_agent(i);
                    self.refresh_pending_of(i);
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
                    let chat = self.chats.entry(key).or_default();
                    chat.streaming.clear();
                    chat.thinking.clear();
                    chat.blocks.push(Block::Notice(format!("⚠ model call failed: {msg}")));
                    self.refresh_agent(i);
                    self.refresh_pending_of(i);
                }
                "suspend.requested" => {
                    self.refresh_budget(i);
                    self.refresh_fleet();
                }
                "llm.completed" => {
                    self.refresh_budget(i);
                    self.refresh_fleet();
                    let t = e.payload["input_tokens"].as_u64().unwrap_or(0)
                        + e.payload["output_tokens"].as_u64().unwrap_or(0);
                    self.burn.push_back((e.timestamp, id.clone(), t));
                    if let Some(chat) = self.chats.get_mut(&key) {
                        chat.streaming.clear();
                        chat.thinking.clear();
                    }
                    self.refresh_agent(i);
                }
                "tool.completed" | "tool.failed" | "turn.completed" | "tool.started" | "loop.recovered" => {
                    // A cut reply is kept in the loop by the runtime,
                    // marked, and comes back with the rows read now.
                    if let Some(chat) = self.chats.get_mut(&key) {
                        chat.streaming.clear();
                        chat.thinking.clear();
                    }
                    self.refresh_agent(i);
                    if ty == "turn.completed" {
                        self.refresh_pending_of(i);
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

    /// Tokens per minute of one agent (by id, so the badge stays with its
    /// agent when the list changes), or of the fleet, over the last minute.
    pub fn burn_per_min(&self, agent: Option<&str>) -> u64 {
        let since = self.now_ms - 60_000;
        self.burn.iter().filter(|(t, a, _)| *t >= since && agent.is_none_or(|id| id == a)).map(|(_, _, n)| n).sum()
    }

    /// A context window a provider reported for an agent.
    pub fn set_window(&mut self, agent: &str, window: u64) {
        self.windows.insert(agent.to_string(), window);
        if let Some(i) = self.agents.iter().position(|a| a.info.id == agent) {
            self.refresh_agent(i);
        }
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

    /// The clock ticked: forget old burn samples and re-read what waits on
    /// the owner (it may have been resolved elsewhere, by `adf approve` or
    /// another app).
    pub fn tick(&mut self, now_ms: i64) {
        self.now_ms = now_ms;
        // Ten minutes, for the sparklines (the rate reads the last one).
        let keep = super::control::SPARK_MINUTES as i64 * 60_000;
        while self.burn.front().is_some_and(|(t, _, _)| *t < now_ms - keep) {
            self.burn.pop_front();
        }
        if self.main == MainView::Why {
            self.refresh_why();
        }
        if self.main == MainView::Channels {
            self.refresh_channels();
        }
        if self.main == MainView::Compute {
            self.refresh_compute();
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
