//! The app's compute panel (`:compute`, issue 22): where the selected
//! agent's commands may run (its targets, the default first), what runs now
//! when the app hosts the agent itself (its container, browser, desktop and
//! the VNC address to watch it), the last commands with their target, exit
//! code and time (read from its `compute` log rows, so the same from a
//! daemon), and its newest screenshot as a path with the command that
//! saves it.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};
use serde_json::{Value, json};

use super::app::{App, Focus};
use super::chat::fit;
use super::ui::pane;
use crate::store::files::FileEntry;

/// Commands the panel lists at most.
const SHOWN: usize = 50;

/// The panel's content from what any source can read: the agent's config,
/// its logs (newest first) and its files; `live` from the runtime when the
/// app hosts the agent (null otherwise).
pub fn view(cfg: &Value, logs: &[Value], files: &[FileEntry], live: Value) -> Value {
    let c = &cfg["compute"];
    let mut targets: Vec<String> = Vec::new();
    match c["allowed_targets"].as_array() {
        Some(a) => targets.extend(a.iter().filter_map(|t| t.as_str().map(str::to_string))),
        None => {
            if c["enabled"] == true {
                targets.push("isolated".into());
            }
            targets.push("shared".into());
            if c["host_access"] == true {
                targets.push("host".into());
            }
        }
    }
    let mut rows: Vec<&Value> = logs.iter().filter(|l| l["origin"] == "compute" && l["event"] == "exec").collect();
    // Newest first, whatever order the source gave.
    rows.sort_by_key(|l| std::cmp::Reverse(l["created_at"].as_i64().unwrap_or(0)));
    let commands: Vec<Value> = rows
        .into_iter()
        .take(SHOWN)
        .map(|l| {
            let m = l["message"].as_str().unwrap_or_default();
            // "<target>: exit <code> in <ms> ms: <command>" or "<target>: failed: <why>"
            let (target, rest) = m.split_once(": ").unwrap_or(("?", m));
            let (code, ms, command) = match rest.strip_prefix("exit ").and_then(|r| r.split_once(" in ")) {
                Some((code, r)) => {
                    let (ms, cmd) = r.split_once(" ms: ").unwrap_or((r, ""));
                    (json!(code.parse::<i64>().ok()), json!(ms.parse::<u64>().ok()), cmd.to_string())
                }
                None => (Value::Null, Value::Null, rest.to_string()),
            };
            json!({"at": l["created_at"], "target": target, "exit_code": code, "ms": ms, "command": command})
        })
        .collect();
    let shot = files
        .iter()
        .filter(|f| f.path.starts_with("screenshots/") && f.path.ends_with(".png"))
        .max_by(|a, b| a.updated_at.cmp(&b.updated_at).then_with(|| a.path.cmp(&b.path)));
    json!({
        "enabled": c["enabled"] == true,
        "targets": targets,
        "default_target": c["default_target"],
        "browser": if c["enabled"] != true { "off" } else if c["browser"] == false { "headless" } else { "visible" },
        "live": live,
        "commands": commands,
        "screenshot": shot.map(|f| json!({"path": f.path, "bytes": f.size, "at": f.updated_at})),
    })
}

/// What runs now for an agent this process hosts.
pub fn live(agent_id: &str) -> Value {
    use crate::runtime::compute::{browser, display};
    let d = display::get(agent_id);
    json!({
        "browser": browser::get(agent_id).map(|s| if s.visible { "open (visible)" } else { "open (headless)" }),
        "display": d.as_ref().map(|d| d.number),
        "vnc_port": d.as_ref().and_then(|d| d.vnc_now().map(|v| v.port)),
    })
}

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
        Some(p) => lines.push(Line::from(vec![
            Span::styled("shot     ", dim),
            Span::raw(fit(&format!("{p} · adf files cat {file} {p} > shot.png"), w.saturating_sub(9))),
        ])),
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
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_reads_targets_commands_and_the_newest_screenshot() {
        let cfg = json!({"compute": {"enabled": true, "host_access": true, "default_target": "host"}});
        let logs = vec![
            json!({"origin": "compute", "event": "exec", "created_at": 2, "message": "host: exit 124 in 1000 ms: sleep 9"}),
            json!({"origin": "compute", "event": "exec", "created_at": 1, "message": "isolated: exit 0 in 12 ms: ls -la: x"}),
            json!({"origin": "compute", "event": "exec", "created_at": 0, "message": "shared: failed: no engine"}),
            json!({"origin": "compute", "event": "transfer", "created_at": 0, "message": "vfs -> host"}),
        ];
        let file = |p: &str, at: &str| FileEntry {
            path: p.into(),
            size: 10,
            mime_type: None,
            protection: crate::store::files::Protection::None,
            authorized: false,
            created_at: at.into(),
            updated_at: at.into(),
        };
        let files =
            [file("screenshots/a.png", "2026-01-01"), file("screenshots/b.png", "2026-02-01"), file("b.txt", "2027")];
        let v = view(&cfg, &logs, &files, Value::Null);
        assert_eq!(v["targets"], json!(["isolated", "shared", "host"]));
        assert_eq!(v["browser"], "visible");
        assert_eq!(v["commands"].as_array().unwrap().len(), 3);
        assert_eq!(
            v["commands"][0],
            json!({"at": 2, "target": "host", "exit_code": 124, "ms": 1000, "command": "sleep 9"})
        );
        let mut reversed = logs.clone();
        reversed.reverse();
        assert_eq!(view(&cfg, &reversed, &files, Value::Null)["commands"][0]["at"], 2, "newest first either way");
        assert_eq!(v["commands"][1]["command"], "ls -la: x");
        assert_eq!(v["commands"][2]["exit_code"], Value::Null);
        assert_eq!(v["screenshot"]["path"], "screenshots/b.png");
    }
}
