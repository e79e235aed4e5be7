//! Small dialogs that are more than one line: the new-agent form (a name,
//! a provider, a model; `n` and `:new NAME`) and the first run's recovery
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

/// The new-agent form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAgentForm {
    /// The focused field: 0 name, 1 provider, 2 model.
    pub field: usize,
    pub name: LineEdit,
    /// An index into [`PROVIDERS`].
    pub provider: usize,
    pub model: LineEdit,
    pub error: Option<String>,
}

/// What a key did to the form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormKey {
    Stay,
    Cancel,
    Create { name: String, provider: String, model: String },
}

impl NewAgentForm {
    /// A form with this name filled in (the provider field focused then).
    pub fn new(name: &str) -> NewAgentForm {
        NewAgentForm {
            field: if name.trim().is_empty() { 0 } else { 1 },
            name: LineEdit::new(name.trim()),
            provider: 0,
            model: LineEdit::new(PROVIDERS[0].1),
            error: None,
        }
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
            KeyCode::Tab | KeyCode::Down => self.field = (self.field + 1) % 3,
            KeyCode::BackTab | KeyCode::Up => self.field = (self.field + 2) % 3,
            KeyCode::Enter => {
                let name = self.name.text.trim().to_string();
                if name.is_empty() {
                    self.field = 0;
                    self.error = Some("the agent needs a name".into());
                } else if name.chars().count() > 100 {
                    self.field = 0;
                    self.error = Some("a name is at most 100 characters".into());
                } else {
                    return FormKey::Create {
                        name,
                        provider: PROVIDERS[self.provider].0.to_string(),
                        model: self.model.text.trim().to_string(),
                    };
                }
            }
            KeyCode::Right | KeyCode::Char(' ') if self.field == 1 => self.cycle(1),
            KeyCode::Left if self.field == 1 => self.cycle(PROVIDERS.len() - 1),
            _ => {
                let line = match self.field {
                    0 => &mut self.name,
                    2 => &mut self.model,
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
    let r = centered(area, 72, if form.error.is_some() { 8 } else { 7 });
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
    let mut lines = vec![
        Line::from([vec![label(0, "name"), Span::raw(" ")], typed(&form.name, form.field == 0)].concat()),
        Line::from(providers),
        Line::from([vec![label(2, "model"), Span::raw(" ")], typed(&form.model, form.field == 2)].concat()),
        Line::styled(format!("  {file} · ←/→ picks the provider"), app.theme.get("dim")),
    ];
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
            FormKey::Create { name: "Research Bot".into(), provider: "openai".into(), model: "gpt-4.1".into() }
        );
        assert_eq!(NewAgentForm::new("scout").field, 1, "a given name moves on to the provider");
        assert_eq!(f.key(&k(KeyCode::Esc)), FormKey::Cancel);
    }
}
