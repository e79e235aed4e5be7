//! Runtime events into the app's state: each live event updates what it
//! touches (an agent's state, its chat, the queue of what waits on the
//! owner, the events pane, the token burn), and the clock's tick ages what
//! is kept.

use super::{Action, App, MainView};
use crate::tui::chat::Block;

/// Events the pane keeps (the oldest go first).
const EVENTS_KEPT: usize = 2000;
use crate::protocol::Envelope;

impl App {
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
            let key = crate::tui::loops::chat_key(&id, crate::tui::loops::event_loop(&e.payload));
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

    /// The clock ticked: forget old burn samples and re-read what waits on
    /// the owner (it may have been resolved elsewhere, by `adf approve` or
    /// another app).
    pub fn tick(&mut self, now_ms: i64) {
        self.now_ms = now_ms;
        // Ten minutes, for the sparklines (the rate reads the last one).
        let keep = crate::tui::control::SPARK_MINUTES as i64 * 60_000;
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
}
