//! The app's compute panel (`:compute`, issue 22), drawn from
//! `runtime::compute::summary`: where the selected agent's commands may
//! run, what runs now (its browser, desktop and the VNC address to watch
//! it), its last commands with target, exit code and time, and its newest
//! screenshot with the command that saves it, drawn below them where the
//! terminal can show pictures (`images.rs`).

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};
use serde_json::Value;

use super::app::{App, Focus};
use super::chat::fit;
use super::ui::pane;

fn when(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map(|t| t.format("%H:%M:%S").to_string()).unwrap_or_default()
}

pub fn draw(f: &mut Frame, app: &App, area: Rect) {
    let name = app.selected().map(|a| a.info.name.clone()).unwrap_or_default();
    let file = app
        .selected()
        .and_then(|a| a.info.path.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "FILE".into());
    let v = &app.compute;
    let block = pane(app, format!("{name} · compute"), app.focus == Focus::Main);
    let inner = block.inner(area);
    f.render_widget(block, area);
    let w = inner.width as usize;
    let dim = app.theme.get("dim");
    let mut lines: Vec<Line> = Vec::new();
    let targets: Vec<String> = v["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|t| if v["default_target"] == t { format!("{t} (default)") } else { t.to_string() })
        .collect();
    lines.push(Line::from(vec![
        Span::styled("targets  ", dim),
        Span::raw(if targets.is_empty() { "none".to_string() } else { targets.join(" · ") }),
        Span::styled("   browser  ", dim),
        Span::raw(v["browser"].as_str().unwrap_or("off").to_string()),
    ]));
    let live = &v["live"];
    if !live.is_null() {
        let mut parts = Vec::new();
        if let Some(cs) = live["containers"].as_object() {
            for (target, c) in cs {
                parts.push(format!(
                    "{target} {} {}",
                    c["container"].as_str().unwrap_or("?"),
                    c["state"].as_str().unwrap_or("?")
                ));
            }
        }
        if let Some(b) = live["browser"].as_str() {
            parts.push(format!("browser {b}"));
        }
        if let Some(n) = live["display"].as_u64() {
            parts.push(format!("desktop :{n}"));
        }
        if let Some(p) = live["vnc_port"].as_u64() {
            parts.push(format!("VNC 127.0.0.1:{p} (ssh -L {p}:127.0.0.1:{p})"));
        }
        let text = if parts.is_empty() { "nothing running".to_string() } else { parts.join(" · ") };
        lines.push(Line::from(vec![Span::styled("now      ", dim), Span::raw(fit(&text, w.saturating_sub(9)))]));
    }
    match v["screenshot"]["path"].as_str() {
        Some(p) => {
            lines.push(Line::from(vec![
                Span::styled("shot     ", dim),
                Span::raw(fit(&format!("{p} · adf files cat {file} {p} > shot.png"), w.saturating_sub(9))),
            ]));
            if let Some(Err(why)) = app.shot.as_ref().map(|s| &s.picture) {
                let text = format!("not drawn: {why}");
                lines.push(Line::from(vec![
                    Span::raw("         "),
                    Span::styled(fit(&text, w.saturating_sub(9)), app.theme.get("waiting")),
                ]));
            }
        }
        None => lines.push(Line::styled("shot     none yet", dim)),
    }
    lines.push(Line::raw(""));
    let commands = v["commands"].as_array().cloned().unwrap_or_default();
    if commands.is_empty() {
        let hint = if v["enabled"] == true || !targets.is_empty() {
            "No commands yet. The agent runs them with compute_exec; the owner sets where (adf compute)."
        } else {
            "No compute for this agent."
        };
        lines.push(Line::styled(hint, dim));
    } else {
        lines.push(Line::styled(
            format!("{:<8}  {:<10} {:>5} {:>7}  {}", "TIME", "TARGET", "EXIT", "MS", "COMMAND"),
            dim,
        ));
        for c in &commands {
            let code = c["exit_code"].as_i64();
            let text = format!(
                "{:<8}  {:<10} {:>5} {:>7}  {}",
                when(c["at"].as_i64().unwrap_or(0)),
                fit(c["target"].as_str().unwrap_or("?"), 10),
                code.map(|c| c.to_string()).unwrap_or_else(|| "fail".into()),
                c["ms"].as_u64().map(|m| m.to_string()).unwrap_or_default(),
                c["command"].as_str().unwrap_or("")
            );
            let style = if code == Some(0) { ratatui::style::Style::default() } else { app.theme.get("waiting") };
            lines.push(Line::styled(fit(&text, w), style));
        }
    }
    // The screenshot under the text, in what the panel has left (at least
    // four rows, else the line above naming it is all there is).
    let text = Paragraph::new(lines).wrap(Wrap { trim: false });
    let text_rows = (text.line_count(inner.width) as u16).min(inner.height);
    let picture = Rect { y: inner.y + text_rows + 1, height: inner.height.saturating_sub(text_rows + 1), ..inner };
    f.render_widget(text, Rect { height: text_rows, ..inner });
    if let (Some(picker), Some(shot)) = (&app.picker, &app.shot)
        && picture.height >= 4
    {
        shot.render(picker, picture, f.buffer_mut());
    }
}
