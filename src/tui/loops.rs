//! Side loops in the app (issue 18): each agent's loops show under it in
//! the tree with their state and schedule; `]` and `[` move between the
//! selected agent's loops, and the chat and composer follow (a side loop's
//! chat is its own stream, its events are the ones tagged with it);
//! `:loop TEMPLATE [NAME]` makes one from a template, `:loop pause`,
//! `:loop resume` and `:loop rm` act on the selected one. Changes go
//! through the control API, as MCP changes do.

use ratatui::text::{Line, Span};
use serde_json::{Value, json};

use super::app::{Action, App};
use super::mcp::McpRequest;

/// The chat of agent `id`'s loop `lp` (`None`: main).
pub fn chat_key(id: &str, lp: Option<&str>) -> String {
    match lp {
        Some(l) => format!("{id}/{l}"),
        None => id.to_string(),
    }
}

impl App {
    /// The selected agent's selected side loop (`None`: main).
    pub fn current_loop(&self) -> Option<String> {
        let a = self.selected()?;
        let name = self.loop_sel.get(&a.info.id)?;
        a.loops.iter().any(|l| l["name"] == name.as_str()).then(|| name.clone())
    }

    /// The chat on screen: the selected agent's selected loop.
    pub fn selected_chat_key(&self) -> Option<String> {
        let a = self.selected()?;
        Some(chat_key(&a.info.id, self.current_loop().as_deref()))
    }

    /// Read agent `i`'s loops again, and the rows of its selected side loop.
    pub fn refresh_loops(&mut self, i: usize) {
        let Some(a) = self.agents.get_mut(i) else { return };
        a.loops = self.source.loops(&a.info.id);
        let id = a.info.id.clone();
        if let Some(name) = self.loop_sel.get(&id).cloned() {
            if a.loops.iter().any(|l| l["name"] == name.as_str()) {
                self.refresh_side_chat(&id, &name);
            } else {
                self.loop_sel.remove(&id);
            }
        }
    }

    /// New rows of a side loop's chat.
    pub fn refresh_side_chat(&mut self, id: &str, name: &str) {
        let chat = self.chats.entry(chat_key(id, Some(name))).or_default();
        let rows = self.source.side_after(id, name, chat.last_seq);
        if let Some(t) = rows.iter().rev().filter(|r| r.role == "assistant").find_map(|r| r.tokens.as_ref()) {
            let usage: crate::providers::Usage = serde_json::from_value(t.clone()).unwrap_or_default();
            chat.context_tokens = Some(usage.input + usage.output);
        }
        chat.append(&rows);
    }

    /// The `ctx` gauge of the selected side loop: its last call against
    /// its model's window (its own model when it has one).
    pub fn side_gauge(&self, a: &super::app::AgentEntry, name: &str) -> Option<String> {
        let chat = self.chats.get(&chat_key(&a.info.id, Some(name)))?;
        let def = a.loops.iter().find(|l| l["name"] == name)?;
        let window = match def["model"].as_str() {
            Some(m) => super::window::resolve(None, m, self.model_windows.as_ref(), None),
            None => a.window,
        };
        super::window::gauge(chat.context_tokens, window)
    }

    /// Move to the next (`step` 1) or previous (-1) loop of the selected
    /// agent: main, then its side loops by name, round.
    pub fn cycle_loop(&mut self, step: isize) {
        let Some(i) = self.agents.get(self.sel).map(|_| self.sel) else { return };
        self.refresh_loops(i);
        let a = &self.agents[i];
        let mut names: Vec<Option<String>> = vec![None];
        names.extend(a.loops.iter().filter_map(|l| l["name"].as_str().map(|n| Some(n.to_string()))));
        let id = a.info.id.clone();
        let now = self.loop_sel.get(&id).cloned();
        let at = names.iter().position(|n| *n == now).unwrap_or(0) as isize;
        let next = (at + step).rem_euclid(names.len() as isize) as usize;
        match &names[next] {
            Some(n) => {
                self.loop_sel.insert(id.clone(), n.clone());
                self.refresh_side_chat(&id, n);
            }
            None => {
                self.loop_sel.remove(&id);
            }
        }
        if names.len() == 1 {
            self.status =
                Some("no side loops here: :loop TEMPLATE [NAME] makes one (:loop lists the templates)".into());
        }
    }

    /// `:loop …`: `TEMPLATE [NAME]` creates one, `pause`, `resume` and `rm`
    /// act on the selected side loop; nothing lists the templates.
    pub fn loop_command(&mut self, rest: &str) -> Vec<Action> {
        let Some(agent) = self.selected_id() else {
            self.status = Some("no agent selected".into());
            return Vec::new();
        };
        let mut words = rest.split_whitespace();
        let first = words.next().unwrap_or("");
        let selected = self.current_loop();
        let on_selected = |verb: &str| -> Result<String, String> {
            selected
                .clone()
                .ok_or_else(|| format!(":loop {verb} acts on the selected side loop; pick one with ] first"))
        };
        let req = match first {
            "" => {
                let names: Vec<&str> = crate::runtime::loop_templates::TEMPLATES.iter().map(|(n, _)| *n).collect();
                self.status = Some(format!(":loop TEMPLATE [NAME] with a template of {}", names.join(", ")));
                return Vec::new();
            }
            "pause" | "resume" => on_selected(first).map(|name| McpRequest {
                agent,
                method: "PATCH",
                segments: vec!["loops".into(), name.clone()],
                body: Some(json!({"status": if first == "pause" { "paused" } else { "idle" }})),
                label: format!("{first} loop {name}"),
            }),
            "rm" | "delete" => on_selected(first).map(|name| McpRequest {
                agent,
                method: "DELETE",
                segments: vec!["loops".into(), name.clone()],
                body: None,
                label: format!("delete loop {name}"),
            }),
            template => match crate::runtime::loop_templates::spec(template) {
                Ok(_) => {
                    let name = words.next().unwrap_or(template).to_string();
                    Ok(McpRequest {
                        agent,
                        method: "POST",
                        segments: vec!["loops".into()],
                        body: Some(json!({"name": name, "template": template})),
                        label: format!("create loop {name} from {template}"),
                    })
                }
                Err(e) => Err(e),
            },
        };
        match req {
            Ok(r) => vec![Action::Mcp(r)],
            Err(e) => {
                self.status = Some(e);
                Vec::new()
            }
        }
    }
}

/// The tree lines of the selected agent's loops: main, then each side loop
/// with its state and schedule; the one on screen marked.
pub fn tree_lines(app: &App, a: &super::app::AgentEntry, indent: &str, width: usize) -> Vec<Line<'static>> {
    let here = app.loop_sel.get(&a.info.id);
    let mark = |on: bool| if on { format!(" {}", app.glyphs.here) } else { String::new() };
    let n = a.loops.len();
    let main_glyph = if n == 0 { app.glyphs.last } else { app.glyphs.branch };
    let mut out =
        vec![Line::styled(format!("{indent}  {main_glyph} main{}", mark(here.is_none())), app.theme.get("dim"))];
    for (k, l) in a.loops.iter().enumerate() {
        let name = l["name"].as_str().unwrap_or("");
        let status = l["status"].as_str().unwrap_or("idle");
        let g = if k + 1 == n { app.glyphs.last } else { app.glyphs.branch };
        let what = match (l["mode"].as_str(), l["schedule"].as_str()) {
            (Some("scheduled"), Some(s)) => format!("{status} · {s}"),
            // Continuous: the turns it takes a wake.
            (Some("continuous"), _) => match l["turn_limit"].as_u64() {
                Some(n) => format!("{status} · {n} turns"),
                None => format!("{status} · continuous"),
            },
            _ => status.to_string(),
        };
        let on = here.is_some_and(|h| h == name);
        let head = format!("{indent}  {g} {name}{}", mark(on));
        let room = width.saturating_sub(head.chars().count() + 1);
        let what: String = what.chars().take(room).collect();
        let style = match status {
            "error" => app.theme.get("error"),
            "active" => app.theme.get("accent"),
            _ => app.theme.get("dim"),
        };
        out.push(Line::from(vec![Span::styled(head, app.theme.get("dim")), Span::raw(" "), Span::styled(what, style)]));
    }
    out
}

/// Whether an event belongs to a side loop, and which.
pub fn event_loop(payload: &Value) -> Option<&str> {
    payload.get("loop").and_then(Value::as_str).filter(|l| *l != "main")
}
