//! Small dialogs that are more than one line: the new-agent form (a name,
//! a provider, a model, and what to start from: a blank agent, a template
//! or a clone of an agent file; `n` and `:new NAME`) and the first run's recovery
//! phrase (the owner's twelve words, shown once, in a dialog of its own
//! rather than in any agent's conversation). Each has its state, its keys
//! and its drawing here.

use crossterm::event::{KeyCode, KeyEvent};
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph, Wrap};

use super::app::App;
use super::readline::{Edit, LineEdit};
use super::ui::{centered, pane};

/// Providers a new agent can use, with a model to start from.
pub const PROVIDERS: &[(&str, &str)] = &[
    ("anthropic", "claude-sonnet-4-5"),
    ("openai", "gpt-5-mini"),
    ("openrouter", "anthropic/claude-sonnet-4.5"),
    ("ollama", "llama3.2"),
];

/// What a new agent starts from: the `from` choices of the form.
pub const STARTS: &[&str] = &["blank", "template", "clone"];

/// The new-agent form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAgentForm {
    /// The focused field: 0 name, 1 provider, 2 model, 3 from, 4 source
    /// (only when starting from a template or a clone).
    pub field: usize,
    pub name: LineEdit,
    /// An index into [`PROVIDERS`].
    pub provider: usize,
    pub model: LineEdit,
    /// An index into [`STARTS`].
    pub start: usize,
    /// The template or agent file to start from.
    pub source: LineEdit,
    pub error: Option<String>,
}

/// What a key did to the form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormKey {
    Stay,
    Cancel,
    Create { name: String, provider: String, model: String, from: Option<StartFrom> },
}

/// A new agent made from a file rather than blank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartFrom {
    Template(String),
    Clone(String),
}

impl NewAgentForm {
    /// A form with this name filled in (the provider field focused then).
    pub fn new(name: &str) -> NewAgentForm {
        NewAgentForm {
            field: if name.trim().is_empty() { 0 } else { 1 },
            name: LineEdit::new(name.trim()),
            provider: 0,
            model: LineEdit::new(PROVIDERS[0].1),
            start: 0,
            source: LineEdit::new(""),
            error: None,
        }
    }

    /// How many fields there are now (the source only with a template or clone).
    fn fields(&self) -> usize {
        if self.start == 0 { 4 } else { 5 }
    }

    fn cycle(&mut self, step: usize) {
        let before = PROVIDERS[self.provider].1;
        self.provider = (self.provider + step) % PROVIDERS.len();
        // The suggested model follows the provider until it is edited.
        if self.model.text == before || self.model.is_empty() {
            self.model = LineEdit::new(PROVIDERS[self.provider].1);
        }
    }

    pub fn key(&mut self, ev: &KeyEvent) -> FormKey {
        self.error = None;
        match ev.code {
            KeyCode::Esc => return FormKey::Cancel,
            KeyCode::Tab | KeyCode::Down => self.field = (self.field + 1) % self.fields(),
            KeyCode::BackTab | KeyCode::Up => self.field = (self.field + self.fields() - 1) % self.fields(),
            KeyCode::Enter => {
                let name = self.name.text.trim().to_string();
                if name.is_empty() {
                    self.field = 0;
                    self.error = Some("the agent needs a name".into());
                } else if name.chars().count() > 100 {
                    self.field = 0;
                    self.error = Some("a name is at most 100 characters".into());
                } else if self.start > 0 && self.source.text.trim().is_empty() {
                    self.field = 4;
                    self.error = Some(format!("which file to start from? (a path to the {} .adf)", STARTS[self.start]));
                } else {
                    let source = self.source.text.trim().to_string();
                    return FormKey::Create {
                        name,
                        provider: PROVIDERS[self.provider].0.to_string(),
                        model: self.model.text.trim().to_string(),
                        from: match self.start {
                            1 => Some(StartFrom::Template(source)),
                            2 => Some(StartFrom::Clone(source)),
                            _ => None,
                        },
                    };
                }
            }
            KeyCode::Right | KeyCode::Char(' ') if self.field == 1 => self.cycle(1),
            KeyCode::Left if self.field == 1 => self.cycle(PROVIDERS.len() - 1),
            KeyCode::Right | KeyCode::Char(' ') if self.field == 3 => self.start = (self.start + 1) % STARTS.len(),
            KeyCode::Left if self.field == 3 => self.start = (self.start + STARTS.len() - 1) % STARTS.len(),
            _ => {
                let line = match self.field {
                    0 => &mut self.name,
                    2 => &mut self.model,
                    4 => &mut self.source,
                    _ => return FormKey::Stay,
                };
                if line.key(ev) == Edit::Ignored {
                    return FormKey::Stay;
                }
            }
        }
        FormKey::Stay
    }
}

/// A line being typed, with its cursor.
fn typed(l: &LineEdit, focused: bool) -> Vec<Span<'static>> {
    let (a, b) = l.split();
    if focused {
        vec![Span::raw(a.to_string()), Span::raw("▏"), Span::raw(b.to_string())]
    } else {
        vec![Span::raw(l.text.clone())]
    }
}

pub fn draw_new_agent(f: &mut Frame, app: &App, form: &NewAgentForm, area: Rect) {
    let rows = 8 + u16::from(form.start > 0) + u16::from(form.error.is_some());
    let r = centered(area, 72, rows);
    f.render_widget(Clear, r);
    let block = pane(app, "New agent (tab next field · enter creates · esc)".into(), true);
    let inner = block.inner(r);
    f.render_widget(block, r);
    // The focused field is marked, not only coloured.
    let label = |i: usize, name: &str| {
        let mark = if form.field == i { ">" } else { " " };
        let style = if form.field == i { app.theme.get("selection") } else { app.theme.get("dim") };
        Span::styled(format!("{mark} {name:<9}"), style)
    };
    let mut providers = vec![label(1, "provider"), Span::raw(" ")];
    for (i, (p, _)) in PROVIDERS.iter().enumerate() {
        let text = if i == form.provider { format!("[{p}]") } else { format!(" {p} ") };
        let style = if i == form.provider { app.theme.get("accent") } else { app.theme.get("dim") };
        providers.push(Span::styled(text, style));
        providers.push(Span::raw(" "));
    }
    let file = match form.name.text.trim() {
        "" => "the file is named after the agent".to_string(),
        name => format!("file: {}.adf in the fleet folder", crate::store::create::slug(name)),
    };
    let mut starts = vec![label(3, "from"), Span::raw(" ")];
    for (i, s) in STARTS.iter().enumerate() {
        let text = if i == form.start { format!("[{s}]") } else { format!(" {s} ") };
        let style = if i == form.start { app.theme.get("accent") } else { app.theme.get("dim") };
        starts.push(Span::styled(text, style));
        starts.push(Span::raw(" "));
    }
    let mut lines = vec![
        Line::from([vec![label(0, "name"), Span::raw(" ")], typed(&form.name, form.field == 0)].concat()),
        Line::from(providers),
        Line::from([vec![label(2, "model"), Span::raw(" ")], typed(&form.model, form.field == 2)].concat()),
        Line::from(starts),
    ];
    if form.start > 0 {
        let what = if form.start == 1 { "template" } else { "agent" };
        let mut source = vec![label(4, what), Span::raw(" ")];
        source.extend(typed(&form.source, form.field == 4));
        if form.source.is_empty() && form.field != 4 {
            source.push(Span::styled("path to a .adf file", app.theme.get("dim")));
        }
        lines.push(Line::from(source));
    }
    lines.push(Line::styled(format!("  {file} · ←/→ picks a choice"), app.theme.get("dim")));
    if let Some(e) = &form.error {
        lines.push(Line::styled(format!("  {e}"), app.theme.get("error")));
    }
    f.render_widget(Paragraph::new(lines), inner);
}

pub fn draw_phrase(f: &mut Frame, app: &App, did: &str, phrase: &str, area: Rect) {
    let r = centered(area, 76, 10);
    f.render_widget(Clear, r);
    let block = pane(app, "Your recovery phrase (enter closes)".into(), true);
    let inner = block.inner(r);
    f.render_widget(block, r);
    let words: Vec<&str> = phrase.split_whitespace().collect();
    let mut lines = vec![
        Line::raw(format!("Your owner identity was created: {did}")),
        Line::default(),
        Line::raw("Recovery phrase, shown this once. Write it down:"),
    ];
    for (n, ws) in words.chunks(4).enumerate() {
        let cells: Vec<String> = ws.iter().enumerate().map(|(i, w)| format!("{:>2}. {w:<12}", n * 4 + i + 1)).collect();
        lines.push(Line::styled(format!("  {}", cells.join(" ")), app.theme.get("accent")));
    }
    lines.push(Line::default());
    lines.push(Line::styled("`adf identity show --phrase` shows it again.", app.theme.get("dim")));
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossterm::event::KeyModifiers;

    fn k(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    #[test]
    fn the_form_asks_a_name_a_provider_and_a_model() {
        let mut f = NewAgentForm::new("");
        assert_eq!(f.key(&k(KeyCode::Enter)), FormKey::Stay);
        assert_eq!(f.error.as_deref(), Some("the agent needs a name"));
        for c in "Research Bot".chars() {
            f.key(&k(KeyCode::Char(c)));
        }
        f.key(&k(KeyCode::Tab));
        f.key(&k(KeyCode::Right));
        assert_eq!(f.model.text, "gpt-5-mini", "the suggestion follows the provider");
        f.key(&k(KeyCode::Tab));
        f.key(&KeyEvent::new(KeyCode::Char('u'), KeyModifiers::CONTROL));
        for c in "gpt-4.1".chars() {
            f.key(&k(KeyCode::Char(c)));
        }
        assert_eq!(
            f.key(&k(KeyCode::Enter)),
            FormKey::Create {
                name: "Research Bot".into(),
                provider: "openai".into(),
                model: "gpt-4.1".into(),
                from: None
            }
        );
        assert_eq!(NewAgentForm::new("scout").field, 1, "a given name moves on to the provider");
        assert_eq!(f.key(&k(KeyCode::Esc)), FormKey::Cancel);
    }

    #[test]
    fn the_form_starts_from_a_template_or_a_clone_with_a_path() {
        let mut f = NewAgentForm::new("copy");
        f.key(&k(KeyCode::Tab));
        f.key(&k(KeyCode::Tab));
        assert_eq!(f.field, 3, "from");
        f.key(&k(KeyCode::Right));
        f.key(&k(KeyCode::Right));
        assert_eq!(STARTS[f.start], "clone");
        assert_eq!(f.key(&k(KeyCode::Enter)), FormKey::Stay, "a clone needs its source");
        assert_eq!(f.field, 4);
        for c in "scout.adf".chars() {
            f.key(&k(KeyCode::Char(c)));
        }
        assert!(
            matches!(f.key(&k(KeyCode::Enter)), FormKey::Create { from: Some(StartFrom::Clone(p)), .. } if p == "scout.adf")
        );
    }
}
