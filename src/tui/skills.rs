//! The skills view (`:skills`, `K`): the selected agent's SKILL.md skills,
//! the fleet's and its own (a fleet skill its own replaces is marked), muted
//! ones dimmed, invalid ones with the reason; the selected skill's
//! description, file and resources beside them. `m` mutes or unmutes it
//! (the agent's `skills.muted`), which keeps the files.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};
use serde_json::Value;

use super::app::{App, Focus};
use super::chat::fit;
use super::ui::pane;

#[derive(Debug, Default)]
pub struct SkillsState {
    /// `{skills: […], invalid: […]}` as `knowledge::skills::Index`.
    pub index: Value,
    pub sel: usize,
}

impl SkillsState {
    pub fn skills(&self) -> &[Value] {
        self.index["skills"].as_array().map(Vec::as_slice).unwrap_or(&[])
    }

    /// The skills a `/name` can run (not muted, not shadowed): (name, description).
    pub fn active(&self) -> impl Iterator<Item = (&str, &str)> {
        self.skills()
            .iter()
            .filter(|s| s["muted"] != serde_json::json!(true) && s["shadowed"] != serde_json::json!(true))
            .map(|s| (s["name"].as_str().unwrap_or(""), s["description"].as_str().unwrap_or("")))
    }

    pub fn invalid(&self) -> &[Value] {
        self.index["invalid"].as_array().map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn len(&self) -> usize {
        self.skills().len() + self.invalid().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The selected skill (not an invalid entry).
    pub fn selected(&self) -> Option<&Value> {
        self.skills().get(self.sel)
    }
}

pub fn draw(f: &mut Frame, app: &App, area: Rect) {
    let name = app.selected().map(|a| a.info.name.clone()).unwrap_or_default();
    let st = &app.skills;
    let [list, detail] = Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let block = pane(app, format!("{name} · skills ({})", st.skills().len()), app.focus == Focus::Main);
    let inner = block.inner(list);
    f.render_widget(block, list);
    if st.is_empty() {
        let hint = "No skills. Add one with `adf skills add FILE FOLDER`, or put skills/<name>/SKILL.md in its files.";
        f.render_widget(Paragraph::new(Span::styled(hint, app.theme.get("dim"))).wrap(Wrap { trim: false }), inner);
    } else {
        let w = inner.width as usize;
        let mut lines: Vec<Line> = Vec::new();
        for (i, s) in st.skills().iter().enumerate() {
            let mark = if s["shadowed"] == true {
                " (replaced)"
            } else if s["muted"] == true {
                " (muted)"
            } else {
                ""
            };
            let text =
                format!("{:<20} {:<5}{mark}", s["name"].as_str().unwrap_or(""), s["root"].as_str().unwrap_or(""));
            let style = if mark.is_empty() { app.theme.get("text") } else { app.theme.get("dim") };
            let l = Line::from(Span::styled(fit(&text, w), style));
            lines.push(if i == st.sel { l.style(app.theme.get("selection")) } else { l });
        }
        for (k, bad) in st.invalid().iter().enumerate() {
            let text = format!("{} invalid: {}", app.glyphs.warn, bad["path"].as_str().unwrap_or(""));
            let l = Line::from(Span::styled(fit(&text, w), app.theme.get("error")));
            lines.push(if st.skills().len() + k == st.sel { l.style(app.theme.get("selection")) } else { l });
        }
        let top = st.sel.saturating_sub((inner.height as usize).saturating_sub(1));
        f.render_widget(Paragraph::new(lines).scroll((top as u16, 0)), inner);
    }
    let block = pane(app, "skill".into(), false);
    let inner = block.inner(detail);
    f.render_widget(block, detail);
    let field =
        |k: &str, v: String| Line::from(vec![Span::styled(format!("{k:<10}"), app.theme.get("dim")), Span::raw(v)]);
    let mut lines = Vec::new();
    if let Some(s) = st.selected() {
        lines.push(Line::raw(s["description"].as_str().unwrap_or("").to_string()));
        lines.push(Line::raw(""));
        lines.push(field("file", s["path"].as_str().unwrap_or("").to_string()));
        lines.push(field("from", s["root"].as_str().unwrap_or("").to_string()));
        let res: Vec<&str> = s["resources"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        if !res.is_empty() {
            lines.push(field("resources", res.join(", ")));
        }
        lines.push(Line::raw(""));
        lines.push(Line::from(Span::styled(
            format!(
                "m {} · /{} ARGS in the composer runs it",
                if s["muted"] == true { "unmute" } else { "mute" },
                s["name"].as_str().unwrap_or("")
            ),
            app.theme.get("dim"),
        )));
    } else if let Some(bad) = st.invalid().get(st.sel.saturating_sub(st.skills().len())) {
        lines.push(field("file", bad["path"].as_str().unwrap_or("").to_string()));
        lines.push(Line::from(Span::styled(
            format!("not loaded: {}", bad["reason"].as_str().unwrap_or("")),
            app.theme.get("error"),
        )));
    }
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}
