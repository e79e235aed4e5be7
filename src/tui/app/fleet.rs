//! The fleet as the app shows it: the agents (nested under their parents
//! by DID), what the app reads of each (config, model, loop rows, unread
//! mail, tokens and cost, budget), and what waits on the owner across the
//! fleet.

use std::collections::HashMap;

use serde_json::Value;

use super::{AgentEntry, App, ChatState, Pending};
use crate::runtime::fleet::AgentInfo;
use crate::tui::chat::Block;

impl App {
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
                let (host, folder) = match crate::tui::hosts::split(&info.id) {
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
        a.window = crate::tui::window::resolve(
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

    /// Learn where served agents are (the mesh server's URL).
    pub fn learn_mesh(&mut self) {
        self.mesh_url = self.source.mesh_url();
    }

    /// Ask the source what the app's token may do (and where served
    /// agents are).
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

    pub(super) fn pending_of(&self, a: &AgentEntry) -> Vec<Pending> {
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

    /// A context window a provider reported for an agent.
    pub fn set_window(&mut self, agent: &str, window: u64) {
        self.windows.insert(agent.to_string(), window);
        if let Some(i) = self.agents.iter().position(|a| a.info.id == agent) {
            self.refresh_agent(i);
        }
    }
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
