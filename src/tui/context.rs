//! The context view (`:context`, issue 18): how full the selected loop's
//! next model call is against its model's window, and what takes the
//! space, largest first — the prompt's text, each file it templates in, the
//! skills, each tool schema, the history. The same figures as
//! `adf context` and `GET /agents/{id}/context`.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};
use serde_json::Value;

use super::app::{App, Focus};
use super::chat::fit;
use super::ui::pane;

impl App {
    /// Measure the selected agent's selected loop again.
    pub fn refresh_context(&mut self) {
        let Some(id) = self.selected_id() else { return };
        let lp = self.current_loop();
        self.context = self.source.context(&id, lp.as_deref());
    }
}

fn count(v: u64) -> String {
    if v >= 10_000 { format!("{:.1}k", v as f64 / 1000.0) } else { v.to_string() }
}

pub fn draw(f: &mut Frame, app: &App, area: Rect) {
    let name = app.selected().map(|a| a.info.name.clone()).unwrap_or_default();
    let g = &app.context;
    let lp = g["loop"].as_str().unwrap_or("main");
    let block = pane(app, format!("{name} · {lp} · context"), app.focus == Focus::Main);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if g.is_null() {
        let hint = "Nothing measured: the agent's file could not be read.";
        f.render_widget(Paragraph::new(Span::styled(hint, app.theme.get("dim"))).wrap(Wrap { trim: false }), inner);
        return;
    }
    let w = inner.width as usize;
    let est = g["estimated"].as_u64().unwrap_or(0);
    let model = g["model"].as_str().unwrap_or("");
    let mut lines = Vec::new();
    let head = match (g["window"].as_u64(), g["percent"].as_f64()) {
        (Some(win), Some(p)) => {
            format!(
                "{model} · {} of {} tokens ({p:.1}%) · window from {}",
                count(est),
                count(win),
                g["window_source"].as_str().unwrap_or("")
            )
        }
        _ => format!("{model} · {} tokens · window unknown (model_windows in settings.json)", count(est)),
    };
    lines.push(Line::styled(fit(&head, w), app.theme.get("text")));
    if let Some(p) = g["percent"].as_f64() {
        let bar_w = w.saturating_sub(2).min(60);
        let full = ((p.clamp(0.0, 100.0) / 100.0) * bar_w as f64).round() as usize;
        let style = if p >= 80.0 { app.theme.get("error") } else { app.theme.get("accent") };
        lines.push(Line::from(vec![
            Span::styled("█".repeat(full), style),
            Span::styled("░".repeat(bar_w - full), app.theme.get("dim")),
        ]));
    }
    let mut facts = format!("compacts at {}", count(g["compact_threshold"].as_u64().unwrap_or(0)));
    if let Some(r) = g["reported_last_call"].as_u64() {
        facts.push_str(&format!(" · last call: {} input tokens (reported)", count(r)));
    }
    lines.push(Line::styled(fit(&facts, w), app.theme.get("dim")));
    lines.push(Line::raw(""));
    let name_w = w.saturating_sub(24).max(10);
    for p in g["parts"].as_array().into_iter().flatten().skip(app.context_top) {
        let tokens = p["tokens"].as_u64().unwrap_or(0);
        let share = if est == 0 { 0.0 } else { tokens as f64 * 100.0 / est as f64 };
        let kind = p["kind"].as_str().unwrap_or("");
        lines.push(Line::from(vec![
            Span::styled(format!("{kind:<8}"), app.theme.get("dim")),
            Span::raw(format!("{:<name_w$}", fit(p["name"].as_str().unwrap_or(""), name_w))),
            Span::styled(format!("{:>8} {share:>5.1}%", count(tokens)), app.theme.get("accent")),
        ]));
    }
    f.render_widget(Paragraph::new(lines), inner);
}

/// The gauge JSON of a loop, from a store (the in-process app's readers).
pub fn measure(store: &crate::store::Store, lp: Option<&str>) -> Value {
    let overrides = crate::providers::windows::overrides();
    crate::runtime::context::measure(store, lp, overrides.as_ref(), None)
        .ok()
        .and_then(|g| serde_json::to_value(g).ok())
        .unwrap_or(Value::Null)
}
