//! Approvals at fleet scale (issue 19): the `:approvals` queue with batch
//! triage. Mark several requests (space), approve (a) or reject (r) them
//! together, group the queue by tool or by agent (o), read the selected
//! call's arguments and reason in the preview, and answer one with a grant
//! that covers the next calls like it (`:grant 30m`, `:grant path notes`,
//! `:grant host api.example.com`).

use serde_json::json;

use super::app::{Action, App, MainView, Pending};
use super::mcp::McpRequest;

/// How the approvals queue is grouped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Grouping {
    #[default]
    None,
    Tool,
    Agent,
}

impl Grouping {
    pub fn label(self) -> &'static str {
        match self {
            Grouping::None => "oldest first",
            Grouping::Tool => "by tool",
            Grouping::Agent => "by agent",
        }
    }

    /// The group a request falls in (empty: no groups).
    pub fn key(self, p: &Pending) -> String {
        match self {
            Grouping::None => String::new(),
            Grouping::Tool if p.ask => "ask".into(),
            Grouping::Tool => p.tool.clone(),
            Grouping::Agent => p.agent_name.clone(),
        }
    }
}

impl App {
    /// The order the queue is shown in: by group, then oldest first.
    pub fn approvals_order(&self) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..self.pending.len()).collect();
        idx.sort_by(|&a, &b| {
            let (pa, pb) = (&self.pending[a], &self.pending[b]);
            (self.grouping.key(pa), pa.since_ms).cmp(&(self.grouping.key(pb), pb.since_ms))
        });
        idx
    }

    /// The request under the cursor of the approvals view.
    pub fn selected_pending(&self) -> Option<&Pending> {
        let order = self.approvals_order();
        let i = *order.get(self.files.sel.min(order.len().saturating_sub(1)))?;
        self.pending.get(i)
    }

    /// What a batch answer acts on: the marked approvals (asks need their
    /// own words), else the one under the cursor.
    pub(super) fn batch(&self) -> Vec<Pending> {
        let marked: Vec<Pending> =
            self.pending.iter().filter(|p| !p.ask && self.marked.contains(&p.task_id)).cloned().collect();
        if !marked.is_empty() {
            return marked;
        }
        self.selected_pending().filter(|p| !p.ask).cloned().into_iter().collect()
    }

    pub(super) fn toggle_mark(&mut self) {
        if self.main != MainView::Approvals {
            self.status = Some("marks are for the approvals queue (:approvals)".into());
            return;
        }
        let Some(p) = self.selected_pending().cloned() else { return };
        if p.ask {
            self.status = Some("an ask is answered in words, one at a time (enter opens it)".into());
            return;
        }
        if !self.marked.remove(&p.task_id) {
            self.marked.insert(p.task_id);
        }
        // Move on, as a file manager's mark does.
        self.files.sel = (self.files.sel + 1).min(self.pending.len().saturating_sub(1));
    }

    pub(super) fn cycle_grouping(&mut self) {
        let keep = self.selected_pending().map(|p| p.task_id.clone());
        self.grouping = match self.grouping {
            Grouping::None => Grouping::Tool,
            Grouping::Tool => Grouping::Agent,
            Grouping::Agent => Grouping::None,
        };
        // The cursor stays on the request it was on.
        if let Some(id) = keep {
            let order = self.approvals_order();
            if let Some(pos) = order.iter().position(|&i| self.pending[i].task_id == id) {
                self.files.sel = pos;
            }
        }
        self.status = Some(format!("approvals {}", self.grouping.label()));
    }

    /// Forget answered requests and marks of requests no longer waiting.
    pub(super) fn answered(&mut self, ids: &[String]) {
        self.pending.retain(|p| !ids.contains(&p.task_id));
        let live: std::collections::HashSet<&String> = self.pending.iter().map(|p| &p.task_id).collect();
        self.marked.retain(|id| live.contains(id));
        self.files.sel = self.files.sel.min(self.pending.len().saturating_sub(1));
    }

    /// `:grant 30m | path FOLDER | host HOST [30m]`: approve the request
    /// under the cursor (or the marked ones) and grant each one's tool
    /// ahead of time on its agent.
    pub(super) fn grant_command(&mut self, rest: &str) -> Vec<Action> {
        let words: Vec<&str> = rest.split_whitespace().collect();
        let mut body = json!({"note": "granted from the approvals queue"});
        let mut i = 0;
        while i < words.len() {
            match (words[i], words.get(i + 1)) {
                ("path", Some(p)) => {
                    body["path"] = json!(p);
                    i += 2;
                }
                ("host", Some(h)) => {
                    body["host"] = json!(h);
                    i += 2;
                }
                (d, _) if crate::store::grants::parse_duration(d).is_ok() => {
                    body["for"] = json!(d);
                    i += 1;
                }
                (w, _) => {
                    let why = crate::store::grants::parse_duration(w).err().unwrap_or_default();
                    self.status = Some(format!("usage: :grant 30m | path FOLDER | host HOST ({why})"));
                    return Vec::new();
                }
            }
        }
        if words.is_empty() {
            self.status = Some("usage: :grant 30m | path FOLDER | host HOST (a mix narrows it more)".into());
            return Vec::new();
        }
        let check = crate::store::grants::NewGrant {
            tool: "t".into(),
            path: body["path"].as_str().map(str::to_string),
            host: body["host"].as_str().map(str::to_string),
            for_ms: body["for"].as_str().and_then(|d| crate::store::grants::parse_duration(d).ok()),
            note: String::new(),
        }
        .check();
        if let Err(e) = check {
            self.status = Some(e);
            return Vec::new();
        }
        let batch = self.batch();
        if batch.is_empty() {
            self.status = Some("nothing waits for approval here".into());
            return Vec::new();
        }
        let mut actions = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for p in &batch {
            // One grant per (agent, tool), then each request approved once.
            if seen.insert((p.agent_id.clone(), p.tool.clone())) {
                let mut b = body.clone();
                b["tool"] = json!(p.tool);
                actions.push(Action::Mcp(McpRequest {
                    agent: p.agent_id.clone(),
                    method: "POST",
                    segments: vec!["grants".into()],
                    body: Some(b),
                    label: format!("grant {} on {}", p.tool, p.agent_name),
                }));
            }
            actions.push(Action::Run(crate::protocol::Command::Approve {
                agent: p.agent_id.clone(),
                task_id: p.task_id.clone(),
                always: false,
            }));
        }
        let ids: Vec<String> = batch.iter().map(|p| p.task_id.clone()).collect();
        self.answered(&ids);
        actions
    }
}
