//! Staying in control, in the app (issue 19): the burn leaderboard
//! (`:burn`, the hottest agents by tokens a minute with a ten-minute
//! sparkline each), the why panel (`:why`: the selected agent's state, what
//! woke it, what it waits on, its next wake, as `adf why`), and the logs and
//! tasks panel (`:logs`; `t` switches to tasks; enter opens a row's
//! payload). The tree shows each agent's sparkline too.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};
use serde_json::Value;
use unicode_width::UnicodeWidthStr;

use super::app::{App, Focus, MainView};
use super::chat::fit;
use super::ui::pane;

/// Minutes a sparkline covers (one bar each).
pub const SPARK_MINUTES: usize = 10;

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// Bars for `values` scaled to their largest (all zero: empty).
pub fn sparkline(values: &[u64]) -> String {
    let max = values.iter().copied().max().unwrap_or(0);
    if max == 0 {
        return String::new();
    }
    values.iter().map(|&v| if v == 0 { ' ' } else { BARS[(((v * 8 - 1) / max) as usize).min(7)] }).collect()
}

impl App {
    /// Tokens of `agent` in each of the last `SPARK_MINUTES` minutes,
    /// oldest first.
    pub fn spark(&self, agent: &str) -> [u64; SPARK_MINUTES] {
        let mut out = [0u64; SPARK_MINUTES];
        for (t, a, n) in &self.burn {
            if a != agent {
                continue;
            }
            let age = (self.now_ms - t).max(0) / 60_000;
            if let Some(slot) = (SPARK_MINUTES - 1).checked_sub(age as usize) {
                out[slot] += n;
            }
        }
        out
    }

    /// Agents by heat: (index, tokens last minute, tokens in ten minutes),
    /// hottest first; idle ones last, by name.
    pub fn leaderboard(&self) -> Vec<(usize, u64, u64)> {
        let mut rows: Vec<(usize, u64, u64)> = self
            .agents
            .iter()
            .enumerate()
            .map(|(i, a)| (i, self.burn_per_min(Some(&a.info.id)), self.spark(&a.info.id).iter().sum()))
            .collect();
        rows.sort_by(|x, y| {
            (y.1, y.2).cmp(&(x.1, x.2)).then_with(|| self.agents[x.0].info.name.cmp(&self.agents[y.0].info.name))
        });
        rows
    }

    /// Show one of the control views (`:burn`, `:why`, `:logs`, `:grants`,
    /// `:channels`) from its top, read afresh.
    pub(super) fn show_control(&mut self, view: MainView) -> Vec<super::app::Action> {
        self.main = view;
        self.focus = Focus::Main;
        (self.logs_sel, self.logs_open) = (0, None);
        match view {
            MainView::Why => self.refresh_why(),
            MainView::Logs => self.refresh_logs(),
            MainView::Grants => self.refresh_grants(),
            MainView::Channels => self.refresh_channels(),
            MainView::Compute => self.refresh_compute(),
            _ => {}
        }
        Vec::new()
    }

    /// Read the selected agent's why again.
    pub fn refresh_why(&mut self) {
        let Some(id) = self.selected_id() else { return };
        self.why = self.source.why(&id);
    }

    /// Read the selected agent's logs and tasks again.
    pub fn refresh_logs(&mut self) {
        let Some(id) = self.selected_id() else { return };
        self.logs = self.source.logs(&id);
        self.tasks = self.source.task_rows(&id);
        let n = self.control_rows().len();
        self.logs_sel = self.logs_sel.min(n.saturating_sub(1));
    }

    /// The rows the logs panel lists now (logs, or tasks after `t`).
    pub fn control_rows(&self) -> &[Value] {
        if self.show_tasks { &self.tasks } else { &self.logs }
    }

    /// Read the selected agent's grants again.
    pub fn refresh_grants(&mut self) {
        let Some(id) = self.selected_id() else { return };
        self.grants = self.source.grants(&id);
        self.logs_sel = self.logs_sel.min(self.grants.len().saturating_sub(1));
    }

    /// Read the selected agent's channels again.
    pub fn refresh_channels(&mut self) {
        let Some(id) = self.selected_id() else { return };
        self.channels = self.source.channels(&id);
    }

    /// Read the selected agent's compute panel again.
    pub fn refresh_compute(&mut self) {
        let Some(id) = self.selected_id() else { return };
        self.compute = self.source.compute(&id);
        self.refresh_shot(&id);
    }

    /// Read the newest screenshot again when it is another file or newer
    /// than the one shown (only where pictures are drawn at all).
    fn refresh_shot(&mut self, id: &str) {
        let shot = &self.compute["screenshot"];
        let Some(path) = shot["path"].as_str().filter(|_| self.picker.is_some()) else {
            self.shot = None;
            return;
        };
        let key = format!("{id}\n{path}\n{}\n{}", shot["at"], shot["bytes"]);
        if self.shot.as_ref().is_some_and(|s| s.key == key) {
            return;
        }
        let picture = match self.source.file_bytes(id, path) {
            Some(bytes) => super::images::decode(&bytes),
            None => Err("could not be read".into()),
        };
        self.shot = Some(super::images::Shot::new(key, picture));
    }

    /// Revoke the grant under the cursor.
    pub(super) fn revoke_grant(&mut self) -> Vec<super::app::Action> {
        let (Some(agent), Some(g)) = (self.selected_id(), self.grants.get(self.logs_sel)) else {
            self.status = Some("no grant selected".into());
            return Vec::new();
        };
        let gid = g["id"].as_str().unwrap_or("").to_string();
        let label = format!("revoke grant {gid} ({})", g["tool"].as_str().unwrap_or(""));
        self.grants.remove(self.logs_sel);
        self.logs_sel = self.logs_sel.min(self.grants.len().saturating_sub(1));
        vec![super::app::Action::Mcp(super::mcp::McpRequest {
            agent,
            method: "DELETE",
            segments: vec!["grants".into(), gid],
            body: None,
            label,
        })]
    }

    /// Enter on a row: open its payload, or close it.
    pub(super) fn toggle_payload(&mut self) {
        self.logs_open = if self.logs_open == Some(self.logs_sel) { None } else { Some(self.logs_sel) };
    }
}

fn when(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map(|t| t.format("%m-%d %H:%M:%S").to_string()).unwrap_or_default()
}

pub fn draw_burn(f: &mut Frame, app: &App, area: Rect) {
    let fleet = app.burn_per_min(None);
    let block = pane(app, format!("Burn · {fleet} tok/min fleet-wide"), app.focus == super::app::Focus::Main);
    let inner = block.inner(area);
    f.render_widget(block, area);
    let w = inner.width as usize;
    let mut lines = vec![Line::styled(
        format!("{:<18} {:>9} {:>10}  {:<10}  {}", "AGENT", "TOK/MIN", "10 MIN", "LAST 10m", "BUDGET"),
        app.theme.get("dim"),
    )];
    for (pos, (i, now, ten)) in app.leaderboard().into_iter().enumerate() {
        let a = &app.agents[i];
        let spark = sparkline(&app.spark(&a.info.id));
        let budget = a.budget.map(|(which, f)| format!("{:.0}% of {which}", f * 100.0)).unwrap_or_else(|| "-".into());
        let text = format!(
            "{:<18} {:>9} {:>10}  {:<10}  {budget}",
            fit(&a.info.name, 18),
            super::ui::short_count(now),
            super::ui::short_count(ten),
            spark
        );
        let l = Line::raw(fit(&text, w));
        lines.push(if pos == app.logs_sel { l.style(app.theme.get("selection")) } else { l });
    }
    f.render_widget(Paragraph::new(lines), inner);
}

pub fn draw_why(f: &mut Frame, app: &App, area: Rect) {
    let name = app.selected().map(|a| a.info.name.clone()).unwrap_or_default();
    let block = pane(app, format!("{name} · why"), app.focus == Focus::Main);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if app.why.is_null() {
        let hint = "Nothing to say: the agent's file could not be read.";
        f.render_widget(Paragraph::new(Span::styled(hint, app.theme.get("dim"))), inner);
        return;
    }
    let lines: Vec<Line> = crate::runtime::why::text(&app.why).into_iter().map(Line::raw).collect();
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}

fn log_line(v: &Value, w: usize) -> String {
    let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
    let text = format!(
        "{} {:<5} {:<10} {:<22} {}",
        when(v["created_at"].as_i64().unwrap_or(0)),
        s("level"),
        fit(&s("origin"), 10),
        fit(&s("event"), 22),
        s("message").replace('\n', " ")
    );
    fit(&text, w)
}

fn task_line(v: &Value, w: usize) -> String {
    let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
    let text = format!(
        "{} {:<16} {:<18} {}",
        when(v["created_at"].as_i64().unwrap_or(0)),
        fit(&s("status"), 16),
        fit(&s("tool"), 18),
        s("id")
    );
    fit(&text, w)
}

/// A row's payload, pretty: a log's data, a task's args and result.
fn payload(v: &Value, tasks: bool) -> Vec<String> {
    let pretty = |x: &Value| -> Vec<String> {
        let parsed = x.as_str().and_then(|t| serde_json::from_str::<Value>(t).ok()).unwrap_or_else(|| x.clone());
        match parsed {
            Value::Null => vec!["(none)".into()],
            Value::String(t) => t.lines().map(str::to_string).collect(),
            other => serde_json::to_string_pretty(&other).unwrap_or_default().lines().map(str::to_string).collect(),
        }
    };
    let mut out = Vec::new();
    if tasks {
        out.push("args:".into());
        out.extend(pretty(&v["args"]).into_iter().map(|l| format!("  {l}")));
        for k in ["result", "error"] {
            if !v[k].is_null() {
                out.push(format!("{k}:"));
                out.extend(pretty(&v[k]).into_iter().map(|l| format!("  {l}")));
            }
        }
    } else {
        out.push(format!("message: {}", v["message"].as_str().unwrap_or("")));
        if !v["target"].is_null() {
            out.push(format!("target: {}", v["target"].as_str().unwrap_or("")));
        }
        out.push("data:".into());
        out.extend(pretty(&v["data"]).into_iter().map(|l| format!("  {l}")));
    }
    out
}

pub fn draw_grants(f: &mut Frame, app: &App, area: Rect) {
    let name = app.selected().map(|a| a.info.name.clone()).unwrap_or_default();
    let block = pane(
        app,
        format!("{name} · grants ({}) · D revokes · :grant in the approvals queue makes one", app.grants.len()),
        app.focus == Focus::Main,
    );
    let inner = block.inner(area);
    f.render_widget(block, area);
    if app.grants.is_empty() {
        let hint =
            "No grants: every restricted call asks. Answer one with :grant 30m (or path DIR, host H) to make one.";
        f.render_widget(Paragraph::new(Span::styled(hint, app.theme.get("dim"))).wrap(Wrap { trim: false }), inner);
        return;
    }
    let w = inner.width as usize;
    let mut lines = vec![Line::styled(
        format!("{:<12} {:<18} {:<16} {:<20} {:>10} {:>5}", "ID", "TOOL", "PATH", "HOST", "LEFT", "USES"),
        app.theme.get("dim"),
    )];
    for (i, g) in app.grants.iter().enumerate() {
        let s = |k: &str| g[k].as_str().unwrap_or("-").to_string();
        let left = match g["expires_at"].as_i64() {
            Some(e) if e <= app.now_ms => "expired".to_string(),
            Some(e) => format!("{} min", (e - app.now_ms + 59_999) / 60_000),
            None => "until revoked".into(),
        };
        let text = format!(
            "{:<12} {:<18} {:<16} {:<20} {:>10} {:>5}",
            s("id"),
            fit(&s("tool"), 18),
            fit(&s("path"), 16),
            fit(&s("host"), 20),
            left,
            g["uses"]
        );
        let l = Line::raw(fit(&text, w));
        lines.push(if i == app.logs_sel { l.style(app.theme.get("selection")) } else { l });
    }
    f.render_widget(Paragraph::new(lines), inner);
}

pub fn draw_channels(f: &mut Frame, app: &App, area: Rect) {
    let name = app.selected().map(|a| a.info.name.clone()).unwrap_or_default();
    let block = pane(app, format!("{name} · channels ({})", app.channels.len()), app.focus == Focus::Main);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if app.channels.is_empty() {
        let hint = "No channel runs for this agent. Connect one from the shell: \
                    echo \"$TOKEN\" | adf adapters add FILE telegram [--dm allowlist --allow @you]";
        f.render_widget(Paragraph::new(Span::styled(hint, app.theme.get("dim"))).wrap(Wrap { trim: false }), inner);
        return;
    }
    let w = inner.width as usize;
    let mut lines = vec![Line::styled(
        fit(
            &format!(
                "{:<10} {:<12} {:<16} {:>6} {:>6} {:>8}  {}",
                "CHANNEL", "STATE", "ACCOUNT", "IN", "OUT", "REFUSED", "LAST ERROR"
            ),
            w,
        ),
        app.theme.get("dim"),
    )];
    for c in &app.channels {
        let s = |k: &str| c[k].as_str().unwrap_or("-").to_string();
        let text = format!(
            "{:<10} {:<12} {:<16} {:>6} {:>6} {:>8}  {}",
            s("kind"),
            s("state"),
            fit(&s("account"), 16),
            c["received"].to_string(),
            c["sent"].to_string(),
            c["refused"].to_string(),
            s("last_error")
        );
        let style = if c["state"] == "connected" { app.theme.get("dim") } else { app.theme.get("waiting") };
        lines.push(Line::styled(fit(&text, w), style));
    }
    // A channel waiting to be linked (WhatsApp): its QR code, to scan
    // with the phone, drawn in half blocks (light modules white, dark ones
    // black, whatever the terminal's colours).
    if let Some(code) = app.channels.iter().find_map(|c| c["qr"].as_str()) {
        lines.push(Line::raw(""));
        lines.push(Line::styled(
            "Link WhatsApp: on the phone, Settings → Linked devices → Link a device, and scan this.",
            app.theme.get("waiting"),
        ));
        match crate::channels::whatsapp::qr_text(code) {
            Ok(qr) => {
                // A code cut short cannot be scanned: whole, or why not.
                let (rows, cols) = (qr.lines().count(), qr.lines().map(|l| l.chars().count()).max().unwrap_or(0));
                let room = (inner.height as usize).saturating_sub(lines.len());
                if rows <= room && cols <= w {
                    lines.extend(qr.lines().map(|l| {
                        Line::styled(
                            l.to_string(),
                            ratatui::style::Style::default()
                                .fg(ratatui::style::Color::White)
                                .bg(ratatui::style::Color::Black),
                        )
                    }));
                } else {
                    lines.push(Line::styled(
                        format!(
                            "The code needs {cols}x{rows} cells and this pane has {w}x{room}: enlarge the terminal \
                             (or run `adf adapters status {name}` in a larger one)."
                        ),
                        app.theme.get("error"),
                    ));
                }
            }
            Err(e) => lines.push(Line::styled(e, app.theme.get("error"))),
        }
    }
    // The code's rows fit (checked); what says why may wrap.
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}

pub fn draw_logs(f: &mut Frame, app: &App, area: Rect) {
    let name = app.selected().map(|a| a.info.name.clone()).unwrap_or_default();
    let what = if app.show_tasks { "tasks" } else { "logs" };
    let other = if app.show_tasks { "logs" } else { "tasks" };
    let rows = app.control_rows();
    let block =
        pane(app, format!("{name} · {what} ({}) · t {other} · enter opens", rows.len()), app.focus == Focus::Main);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if rows.is_empty() {
        f.render_widget(Paragraph::new(Span::styled(format!("No {what}."), app.theme.get("dim"))), inner);
        return;
    }
    let w = inner.width as usize;
    let mut lines: Vec<Line> = Vec::new();
    let mut sel_line = 0;
    for (i, v) in rows.iter().enumerate() {
        let text = if app.show_tasks { task_line(v, w) } else { log_line(v, w) };
        let style = match v["level"].as_str() {
            Some("error") => app.theme.get("error"),
            Some("warn") => app.theme.get("waiting"),
            _ => ratatui::style::Style::default(),
        };
        if i == app.logs_sel {
            sel_line = lines.len();
        }
        let l = Line::styled(text, style);
        lines.push(if i == app.logs_sel { l.style(app.theme.get("selection")) } else { l });
        if app.logs_open == Some(i) {
            for p in payload(v, app.show_tasks) {
                let l = format!("    {p}");
                let cut = if l.width() > w { fit(&l, w) } else { l };
                lines.push(Line::styled(cut, app.theme.get("dim")));
            }
        }
    }
    let h = inner.height as usize;
    let top = (sel_line + 1).saturating_sub(h);
    f.render_widget(Paragraph::new(lines).scroll((top as u16, 0)), inner);
}
