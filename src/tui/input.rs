//! Keys in, commands run: the contexts a key is looked up in (by focus),
//! focus moving between the visible panes (never into insert mode: only
//! `i` writes), the composer's keys, movement in every list, and every
//! command of the registry by name (`run`), from keys, the palette and the
//! `:` line alike.

use crossterm::event::{KeyCode, KeyEvent};
use ratatui_textarea::TextArea;

use super::app::{Action, App, ChatState, Focus, MainView, Overlay, Pending};
use super::chat;
use super::commands;
use super::forms::NewAgentForm;
use super::keys::Key;
use super::readline::{self, LineEdit};
use crate::protocol::Command;

impl App {
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

    /// The contexts keys are looked up in, most specific first.
    pub fn contexts(&self) -> Vec<&'static str> {
        match self.focus {
            Focus::Composer => vec!["composer"],
            Focus::Fleet => vec!["list", "agent", "global"],
            Focus::Main if self.main == MainView::Files => vec!["files", "list", "agent", "global"],
            Focus::Main if self.main == MainView::Mcp => vec!["mcp", "list", "agent", "global"],
            Focus::Main if self.main == MainView::Skills => vec!["skills", "list", "agent", "global"],
            Focus::Main if self.main == MainView::Approvals => vec!["approvals", "list", "agent", "global"],
            Focus::Main if self.main == MainView::Logs => vec!["logs", "list", "agent", "global"],
            Focus::Main if self.main == MainView::Grants => vec!["grants", "list", "agent", "global"],
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
                // Readline keys first; a tab is never typed into a message
                // (tab moves focus, and a stray one is dropped).
                if !readline::composer_key(&mut self.composer, &ev)
                    && !matches!(ev.code, KeyCode::Tab | KeyCode::BackTab)
                {
                    self.composer.input(ev);
                }
                Vec::new()
            }
            // A key no list binds is never sent anywhere.
            None => Vec::new(),
        }
    }

    /// `:` line: a command name or alias, with arguments for some.
    pub fn command_line(&mut self, line: &str) -> Vec<Action> {
        let mut parts = line.split_whitespace();
        let Some(name) = parts.next() else { return Vec::new() };
        let rest = parts.collect::<Vec<_>>().join(" ");
        let command = commands::find(name).map(|c| c.name);
        match command {
            Some("filter") => {
                self.filter(&rest);
                return Vec::new();
            }
            Some("new_agent") => {
                self.overlay = Overlay::NewAgent(NewAgentForm::new(&rest));
                return Vec::new();
            }
            Some("mcp_add") => {
                let Some(agent) = self.selected_id() else {
                    self.status = Some("no agent selected".into());
                    return Vec::new();
                };
                return match super::mcp::add_body(&rest) {
                    Ok(body) => {
                        let name = body["name"].as_str().unwrap_or("").to_string();
                        self.main = MainView::Mcp;
                        self.focus = Focus::Main;
                        vec![Action::Mcp(super::mcp::McpRequest {
                            agent,
                            method: "POST",
                            segments: vec!["mcp".into()],
                            body: Some(body),
                            label: format!("adding {name} (connecting first)"),
                        })]
                    }
                    Err(e) => {
                        self.status = Some(e);
                        Vec::new()
                    }
                };
            }
            Some("side_loop") => return self.loop_command(&rest),
            Some("grant") if commands::allowed(self.role, "grant") => return self.grant_command(&rest),
            Some("channel_add") if commands::allowed(self.role, "channel_add") => {
                let mut words = rest.split_whitespace();
                let kind = words.next().unwrap_or("telegram").to_string();
                if !crate::channels::KINDS.contains(&kind.as_str()) {
                    self.status =
                        Some(format!("no \"{kind}\" channel (channels: {})", crate::channels::KINDS.join(", ")));
                    return Vec::new();
                }
                // WhatsApp: no token; who may write is given (it is the
                // owner's own number), and the view shows the code to scan.
                if kind == "whatsapp" {
                    let who: Vec<&str> = words.collect();
                    if who.is_empty() {
                        self.status = Some(
                            "usage: channel_add whatsapp NUMBER… (who may write to the agent), or channel_add whatsapp all"
                                .into(),
                        );
                        return Vec::new();
                    }
                    let body = if who == ["all"] {
                        serde_json::json!({"type": "whatsapp", "token": "", "dm": "all"})
                    } else {
                        serde_json::json!({"type": "whatsapp", "token": "", "dm": "allowlist", "allow_from": who})
                    };
                    return match self.selected_id() {
                        Some(agent) => self.connect_channel(agent, &kind, body),
                        None => {
                            self.status = Some("no agent selected".into());
                            Vec::new()
                        }
                    };
                }
                // Email: `:channel_add email ADDRESS [IMAP_URL [SMTP_URL]]`.
                let mut extra = serde_json::json!({});
                if kind == "email" {
                    let Some(address) = words.next() else {
                        self.status = Some("usage: channel_add email ADDRESS [IMAP_URL [SMTP_URL]]".into());
                        return Vec::new();
                    };
                    if let Err(e) = crate::channels::email::check_address(address) {
                        self.status = Some(e);
                        return Vec::new();
                    }
                    extra["address"] = address.into();
                    for (k, proto) in [("imap", "imap"), ("smtp", "smtp")] {
                        if let Some(u) = words.next() {
                            if let Err(e) = crate::channels::email::Server::parse_url(u, proto) {
                                self.status = Some(format!("{k} {e}"));
                                return Vec::new();
                            }
                            extra[k] = u.into();
                        }
                    }
                }
                match self.selected_id() {
                    Some(agent) => self.overlay = Overlay::ChannelToken { agent, kind, token: String::new(), extra },
                    None => self.status = Some("no agent selected".into()),
                }
                return Vec::new();
            }
            Some("rename") if !rest.is_empty() => {
                return match self.selected_id() {
                    Some(agent) => vec![Action::Rename { agent, name: rest }],
                    None => {
                        self.status = Some("no agent selected".into());
                        Vec::new()
                    }
                };
            }
            _ => {}
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

    /// Connect a channel through the agent's API (its config and sealed
    /// credentials), and show the channels view, where it comes up.
    pub(super) fn connect_channel(&mut self, agent: String, kind: &str, body: serde_json::Value) -> Vec<Action> {
        self.main = super::app::MainView::Channels;
        vec![Action::Mcp(super::mcp::McpRequest {
            agent,
            method: "POST",
            segments: vec!["adapters".into()],
            body: Some(body),
            label: format!("connecting {kind}"),
        })]
    }

    fn first_pending(&self) -> Option<Pending> {
        match (self.main, self.focus) {
            (MainView::Approvals, Focus::Main) => self.selected_pending().cloned(),
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
        if !commands::allowed(self.role, name) {
            self.status = Some(format!(
                "this app is attached with an {} token: {} needs the owner's",
                self.role.as_str(),
                name.replace('_', " ")
            ));
            return Vec::new();
        }
        match name {
            "quit" => {
                // In-process, quitting ends running turns: say so first,
                // and how to keep agents running past the app.
                let running = self.agents.iter().filter(|a| a.state == "active").count();
                if running > 0 && !self.attached && !self.quit_armed {
                    self.quit_armed = true;
                    let (n, them) = if running == 1 { ("1 turn is", "it") } else { ("turns are", "them") };
                    let n = if running == 1 { n.to_string() } else { format!("{running} {n}") };
                    self.status = Some(format!(
                        "{n} running: quitting interrupts {them} (what was written is kept). {} again quits; \
                         `adf --daemon` keeps agents running after the app closes",
                        self.key_for("quit")
                    ));
                    return Vec::new();
                }
                self.quit = true;
                Vec::new()
            }
            "help" => {
                self.overlay = Overlay::Help { scroll: 0 };
                Vec::new()
            }
            "palette" => {
                self.overlay = Overlay::Palette { query: LineEdit::default(), sel: 0 };
                Vec::new()
            }
            "command_line" => {
                self.overlay = Overlay::CommandLine(LineEdit::default());
                Vec::new()
            }
            "next_loop" | "previous_loop" => {
                self.cycle_loop(if name == "next_loop" { 1 } else { -1 });
                Vec::new()
            }
            "side_loop" => self.loop_command(""),
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
            "mcp" => {
                self.main = MainView::Mcp;
                self.focus = Focus::Main;
                self.mcp.sel = 0;
                self.refresh_mcp();
                Vec::new()
            }
            "burn" => self.show_control(MainView::Burn),
            "why" => self.show_control(MainView::Why),
            "logs" => self.show_control(MainView::Logs),
            "grants" => self.show_control(MainView::Grants),
            "channels" => self.show_control(MainView::Channels),
            "compute" => self.show_control(MainView::Compute),
            "grant_revoke" if self.main == MainView::Grants => self.revoke_grant(),
            "channel_add" => self.command_line("channel_add telegram"),
            "toggle_tasks" => {
                self.show_tasks = !self.show_tasks;
                (self.logs_sel, self.logs_open) = (0, None);
                Vec::new()
            }
            "context" => {
                self.main = MainView::Context;
                self.focus = Focus::Main;
                self.context_top = 0;
                self.refresh_context();
                Vec::new()
            }
            "skills" => {
                self.main = MainView::Skills;
                self.focus = Focus::Main;
                self.skills.sel = 0;
                self.refresh_skills();
                Vec::new()
            }
            "skill_toggle_mute" => {
                let (Some(agent), Some(s)) = (self.selected_id(), self.skills.selected()) else {
                    self.status = Some("select a skill first (:skills)".into());
                    return Vec::new();
                };
                if s["root"] == "fleet" && s["shadowed"] == true {
                    self.status = Some("the agent's own skill of this name replaces it; mute that one".into());
                    return Vec::new();
                }
                let name = s["name"].as_str().unwrap_or("").to_string();
                vec![Action::MuteSkill { agent, on: s["muted"] != true, name }]
            }
            "mcp_add" => {
                self.status = Some(":mcp_add npm:PKG | pypi:PKG | URL | COMMAND ARGS… [as NAME]".into());
                Vec::new()
            }
            "mcp_restart" | "mcp_remove" | "mcp_toggle_enabled" | "mcp_toggle_restricted" | "mcp_toggle_visible" => {
                let Some(agent) = self.selected_id() else { return Vec::new() };
                if self.main != MainView::Mcp {
                    self.status = Some("open the MCP view first (:mcp)".into());
                    return Vec::new();
                }
                match super::mcp::request(&agent, &self.mcp, name) {
                    Ok(r) => vec![Action::Mcp(r)],
                    Err(e) => {
                        self.status = Some(e);
                        Vec::new()
                    }
                }
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
                self.overlay = Overlay::CommandLine(LineEdit::new("filter "));
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
                // The panes on screen; the composer is part of the main
                // pane, entered only with `i` (insert mode is never a
                // stop of the cycle).
                let mut order = vec![Focus::Fleet, Focus::Main];
                if self.show_events {
                    order.push(Focus::Events);
                }
                let here = if self.focus == Focus::Composer { Focus::Main } else { self.focus };
                let i = order.iter().position(|f| *f == here).unwrap_or(0);
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
            "new_agent" => {
                self.overlay = Overlay::NewAgent(NewAgentForm::new(""));
                Vec::new()
            }
            // Without a name: the `:` line, filled with the current one.
            "rename" => match self.selected().map(|a| a.info.name.clone()) {
                Some(name) => {
                    self.overlay = Overlay::CommandLine(LineEdit::new(&format!("rename {name}")));
                    Vec::new()
                }
                None => {
                    self.status = Some("no agent selected".into());
                    Vec::new()
                }
            },
            "edit_config" => match self.selected_id() {
                Some(agent) => vec![Action::EditConfig { agent }],
                None => {
                    self.status = Some("no agent selected".into());
                    Vec::new()
                }
            },
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
            "approve_once" | "approve_always"
                if self.main == MainView::Approvals && self.focus == Focus::Main && !self.marked.is_empty() =>
            {
                let batch = self.batch();
                let ids: Vec<String> = batch.iter().map(|p| p.task_id.clone()).collect();
                self.answered(&ids);
                self.status = Some(format!("{} approved", batch.len()));
                batch
                    .into_iter()
                    .map(|p| {
                        Action::Run(Command::Approve {
                            agent: p.agent_id,
                            task_id: p.task_id,
                            always: name == "approve_always",
                        })
                    })
                    .collect()
            }
            "reject" if self.main == MainView::Approvals && self.focus == Focus::Main && !self.marked.is_empty() => {
                let targets = self.batch().into_iter().map(|p| (p.agent_id, p.task_id)).collect();
                self.overlay = Overlay::Reject { targets, text: LineEdit::default() };
                Vec::new()
            }
            "mark" => {
                self.toggle_mark();
                Vec::new()
            }
            "group_by" => {
                self.cycle_grouping();
                Vec::new()
            }
            "grant" => self.grant_command(""),
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
                    self.overlay =
                        Overlay::Reject { targets: vec![(p.agent_id, p.task_id)], text: LineEdit::default() };
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
            (Focus::Main, MainView::Mcp) => self.mcp.sel = step(self.mcp.sel, self.mcp.rows().len()),
            (Focus::Main, MainView::Skills) => self.skills.sel = step(self.skills.sel, self.skills.len()),
            (Focus::Main, MainView::Chat) => {
                let Some(id) = self.selected_chat_key() else { return };
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
                // The selection indexes what the pane shows (its filter
                // and scope applied); following starts from the last.
                let len = self.visible_events().len();
                let cur = if self.events_follow { len.saturating_sub(1) } else { self.events_sel };
                self.events_sel = step(cur.min(len.saturating_sub(1)), len);
                self.events_follow = self.events_sel + 1 >= len;
            }
            (Focus::Main, MainView::Context) => {
                let n = self.context["parts"].as_array().map_or(0, Vec::len);
                self.context_top = step(self.context_top, n);
            }
            (Focus::Main, MainView::Burn) => self.logs_sel = step(self.logs_sel, self.agents.len()),
            (Focus::Main, MainView::Logs) => {
                self.logs_sel = step(self.logs_sel, self.control_rows().len());
                self.logs_open = None;
            }
            (Focus::Main, MainView::Why) => {}
            (Focus::Main, MainView::Grants) => self.logs_sel = step(self.logs_sel, self.grants.len()),
            (Focus::Main, MainView::Channels | MainView::Compute) => {}
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
                if let Some(id) = self.selected_chat_key() {
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
            (Focus::Main, MainView::Logs) => self.toggle_payload(),
            (Focus::Main, MainView::Burn) => {
                if let Some(&(i, _, _)) = self.leaderboard().get(self.logs_sel) {
                    self.sel = i;
                    self.main = MainView::Chat;
                    self.refresh_files();
                }
            }
            (Focus::Main, MainView::Approvals) => {
                if let Some(p) = self.selected_pending().cloned()
                    && let Some(i) = self.agents.iter().position(|a| a.info.id == p.agent_id)
                {
                    self.sel = i;
                    self.main = MainView::Chat;
                    self.refresh_files();
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
        // `/mcp` and `/skills` open their views (the app's own commands,
        // not a message); any other `/…` goes to the agent (a skill).
        if let Some(view) = ["mcp", "skills"].into_iter().find(|v| text.trim() == format!("/{v}")) {
            self.composer = TextArea::default();
            self.focus = Focus::Main;
            return self.run(view);
        }
        use crate::runtime::slash::{self, Slash};
        match slash::parse(&text) {
            Slash::Help => {
                self.composer = TextArea::default();
                self.refresh_skills();
                self.overlay = Overlay::Help { scroll: 0 };
                return Vec::new();
            }
            Slash::Other(word) => {
                self.refresh_skills();
                if !self.skills.active().any(|(n, _)| n == word) {
                    self.status = Some(slash::unknown_notice(word));
                }
            }
            _ => {}
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
        if self.role != crate::daemon::roles::Role::Owner {
            // Kept in the composer: nothing typed is lost.
            self.composer = TextArea::from(text.lines().map(str::to_string).collect::<Vec<_>>());
            self.status = Some(format!(
                "this app is attached with an {} token: it answers asks, and chatting needs the owner's",
                self.role.as_str()
            ));
            return Vec::new();
        }
        let lp = self.current_loop();
        if let Some(chat) = self.chats.get_mut(&super::loops::chat_key(&id, lp.as_deref())) {
            chat.top = None;
            chat.sel = None;
        }
        vec![Action::Run(Command::SendChat { agent: id, r#loop: lp.unwrap_or_else(|| "main".into()), text })]
    }

    /// Key hints for the bottom line, from the keymap.
    pub fn hints(&self) -> Vec<(String, &'static str)> {
        let names: &[&str] = match self.focus {
            Focus::Composer => &["send", "newline", "compose_in_editor", "interrupt", "leave_composer"],
            Focus::Main if self.main == MainView::Files => {
                &["down", "edit_file", "edit_mind", "back", "palette", "quit"]
            }
            Focus::Main if self.main == MainView::Inbox => &["down", "back", "command_line", "palette", "help", "quit"],
            Focus::Main if self.main == MainView::Skills => &["down", "skill_toggle_mute", "back", "palette", "quit"],
            Focus::Main if self.main == MainView::Mcp => {
                &["down", "mcp_toggle_enabled", "mcp_toggle_restricted", "mcp_restart", "back", "palette", "quit"]
            }
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
            .filter(|n| commands::allowed(self.role, n))
            .filter_map(|n| {
                let k = self.keymap.keys_for(n);
                let c = commands::find(n)?;
                Some((k.first()?.clone(), short(c.name)))
            })
            .collect()
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
        "mcp_toggle_enabled" => "on/off",
        "mcp_toggle_restricted" => "ask/allow",
        "mcp_restart" => "restart",
        "skill_toggle_mute" => "mute",
        "command_line" => "command",
        "palette" => "palette",
        "compose_in_editor" => "$EDITOR",
        "leave_composer" => "leave",
        other => other,
    }
}

/// Palette commands matching a query, best first (nucleo's fuzzy score).
pub fn palette_hits(query: &str, role: crate::daemon::roles::Role) -> Vec<&'static commands::CommandDef> {
    use nucleo::pattern::{CaseMatching, Normalization, Pattern};
    let all: Vec<&commands::CommandDef> =
        commands::ALL.iter().filter(|c| c.palette && commands::allowed(role, c.name)).collect();
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
