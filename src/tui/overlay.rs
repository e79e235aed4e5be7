//! Keys while an overlay is up: the palette, the `:` line, help (which
//! scrolls), the rejection box, one event in full, the unlock and connect
//! boxes, the edit-conflict choice, the recovery phrase and the new-agent
//! form. Overlays see keys before anything else; `esc` closes each. Typed
//! lines edit as a readline does (`super::readline`).

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::app::{Action, App, CONNECT, Overlay};
use super::forms::FormKey;
use super::input::palette_hits;
use super::readline::Edit;
use crate::protocol::Command;

impl App {
    pub(super) fn overlay_key(&mut self, ev: KeyEvent) -> Vec<Action> {
        let ctrl = ev.modifiers.contains(KeyModifiers::CONTROL);
        match &mut self.overlay {
            Overlay::Help { scroll } => {
                let (total, height) = self.help_view.get();
                let last = total.saturating_sub(height);
                let page = height.saturating_sub(1).max(1);
                match (ev.code, ctrl) {
                    (KeyCode::Esc | KeyCode::Char('q') | KeyCode::Char('?'), _) => self.overlay = Overlay::None,
                    (KeyCode::Char('j') | KeyCode::Down, _) | (KeyCode::Char('n'), true) => {
                        *scroll = (*scroll + 1).min(last)
                    }
                    (KeyCode::Char('k') | KeyCode::Up, _) | (KeyCode::Char('p'), true) => {
                        *scroll = scroll.saturating_sub(1)
                    }
                    (KeyCode::PageDown | KeyCode::Char(' '), _) | (KeyCode::Char('d' | 'f'), true) => {
                        *scroll = (*scroll + page).min(last)
                    }
                    (KeyCode::PageUp, _) | (KeyCode::Char('u' | 'b'), true) => *scroll = scroll.saturating_sub(page),
                    (KeyCode::Char('g') | KeyCode::Home, _) => *scroll = 0,
                    (KeyCode::Char('G') | KeyCode::End, _) => *scroll = last,
                    _ => {}
                }
                Vec::new()
            }
            Overlay::Palette { query, sel } => match ev.code {
                KeyCode::Esc => {
                    self.overlay = Overlay::None;
                    Vec::new()
                }
                KeyCode::Enter => {
                    let hits = palette_hits(&query.text, self.role);
                    let name = hits.get(*sel).map(|c| c.name);
                    self.overlay = Overlay::None;
                    name.map(|n| self.run(n)).unwrap_or_default()
                }
                KeyCode::Down | KeyCode::Tab => {
                    *sel = (*sel + 1).min(palette_hits(&query.text, self.role).len().saturating_sub(1));
                    Vec::new()
                }
                KeyCode::Char('n') if ctrl => {
                    *sel = (*sel + 1).min(palette_hits(&query.text, self.role).len().saturating_sub(1));
                    Vec::new()
                }
                KeyCode::Up | KeyCode::BackTab => {
                    *sel = sel.saturating_sub(1);
                    Vec::new()
                }
                KeyCode::Char('p') if ctrl => {
                    *sel = sel.saturating_sub(1);
                    Vec::new()
                }
                _ => {
                    if query.key(&ev) == Edit::Changed {
                        *sel = 0;
                    }
                    Vec::new()
                }
            },
            Overlay::CommandLine(text) => match ev.code {
                KeyCode::Esc => {
                    self.overlay = Overlay::None;
                    Vec::new()
                }
                KeyCode::Enter => {
                    let line = text.text.trim().to_string();
                    self.overlay = Overlay::None;
                    self.command_line(&line)
                }
                // Backspace on an empty line leaves it, as in vi.
                KeyCode::Backspace if text.is_empty() => {
                    self.overlay = Overlay::None;
                    Vec::new()
                }
                _ => {
                    text.key(&ev);
                    Vec::new()
                }
            },
            Overlay::Reject { targets, text } => match ev.code {
                KeyCode::Esc => {
                    self.overlay = Overlay::None;
                    Vec::new()
                }
                KeyCode::Enter => {
                    let feedback = (!text.text.trim().is_empty()).then(|| text.text.trim().to_string());
                    let actions: Vec<Action> = targets
                        .iter()
                        .map(|(agent, task_id)| {
                            Action::Run(Command::Deny {
                                agent: agent.clone(),
                                task_id: task_id.clone(),
                                feedback: feedback.clone(),
                            })
                        })
                        .collect();
                    let ids: Vec<String> = targets.iter().map(|(_, t)| t.clone()).collect();
                    self.overlay = Overlay::None;
                    self.answered(&ids);
                    actions
                }
                _ => {
                    text.key(&ev);
                    Vec::new()
                }
            },
            Overlay::Phrase { .. } => {
                if matches!(ev.code, KeyCode::Enter | KeyCode::Esc) {
                    self.overlay = Overlay::None;
                }
                Vec::new()
            }
            Overlay::NewAgent(form) => match form.key(&ev) {
                FormKey::Stay => Vec::new(),
                FormKey::Cancel => {
                    self.overlay = Overlay::None;
                    Vec::new()
                }
                FormKey::Create { name, provider, model, from } => {
                    self.overlay = Overlay::None;
                    self.status = Some(format!("creating {name}…"));
                    vec![Action::NewAgent { name, provider, model, from }]
                }
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
            Overlay::ChannelToken { agent, kind, token, extra } => match ev.code {
                KeyCode::Esc => {
                    self.overlay = Overlay::None;
                    Vec::new()
                }
                KeyCode::Backspace => {
                    token.pop();
                    Vec::new()
                }
                KeyCode::Enter if !token.trim().is_empty() => {
                    let mut body = serde_json::json!({"type": kind.clone(), "token": token.trim()});
                    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
                        b.extend(e.clone());
                    }
                    let (agent, kind) = (agent.clone(), kind.clone());
                    self.overlay = Overlay::None;
                    self.connect_channel(agent, &kind, body)
                }
                KeyCode::Char(c) if !ctrl => {
                    token.push(c);
                    Vec::new()
                }
                _ => Vec::new(),
            },
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
                // Ollama's host may be left empty (its default address).
                KeyCode::Enter if !key.trim().is_empty() || CONNECT[*provider] == "ollama" => {
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
}
