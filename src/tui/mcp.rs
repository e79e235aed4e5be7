//! The MCP view (`:mcp`): the selected agent's servers with their live
//! status and tools (enabled, shown, asking or allowed; new, changed or
//! removed), the selected server's error and stderr tail beside them, and
//! the owner's changes: a tool's flags (`e`, `r`, `v`), a restart (`R`),
//! removal (`D`), and `:mcp_add npm:PKG | pypi:PKG | URL | COMMAND ARGS…
//! [as NAME]`. Changes go through the control API in the background; the
//! answer comes back on the status line and the view reloads.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};
use serde_json::{Value, json};

use super::app::{App, Focus};
use super::chat::fit;
use super::ui::pane;

#[derive(Debug, Default)]
pub struct McpState {
    pub servers: Vec<Value>,
    pub sel: usize,
}

/// A line of the list: a server, or one of its tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Row {
    Server(usize),
    Tool(usize, usize),
}

impl McpState {
    pub fn rows(&self) -> Vec<Row> {
        let mut out = Vec::new();
        for (i, s) in self.servers.iter().enumerate() {
            out.push(Row::Server(i));
            for j in 0..s["tools"].as_array().map(Vec::len).unwrap_or(0) {
                out.push(Row::Tool(i, j));
            }
        }
        out
    }

    pub fn selected(&self) -> Option<Row> {
        self.rows().get(self.sel).copied()
    }

    fn server_of(&self, row: Row) -> &Value {
        match row {
            Row::Server(i) | Row::Tool(i, _) => &self.servers[i],
        }
    }
}

/// A change for the control API, under `agents/<agent>/`.
#[derive(Debug, Clone, PartialEq)]
pub struct McpRequest {
    pub agent: String,
    pub method: &'static str,
    pub segments: Vec<String>,
    pub body: Option<Value>,
    /// What the status line says while it runs.
    pub label: String,
}

/// The request a view command makes on the selection.
pub fn request(agent: &str, st: &McpState, cmd: &str) -> Result<McpRequest, String> {
    let row = st.selected().ok_or("no MCP server here (:mcp_add npm:PKG)")?;
    let server = st.server_of(row)["name"].as_str().unwrap_or("").to_string();
    let req = |method, segments: Vec<String>, body, label| McpRequest {
        agent: agent.to_string(),
        method,
        segments,
        body,
        label,
    };
    match cmd {
        "mcp_restart" => {
            Ok(req("POST", vec!["mcp".into(), server.clone(), "restart".into()], None, format!("restarting {server}")))
        }
        "mcp_remove" => Ok(req("DELETE", vec!["mcp".into(), server.clone()], None, format!("removing {server}"))),
        flag => {
            let Row::Tool(i, j) = row else { return Err("select a tool of the server first".into()) };
            let t = &st.servers[i]["tools"][j];
            let name = t["name"].as_str().unwrap_or("").to_string();
            let (key, now) = match flag {
                "mcp_toggle_enabled" => ("enabled", t["enabled"] == true),
                "mcp_toggle_restricted" => ("restricted", t["restricted"] == true),
                _ => ("visible", t["visible"] == true),
            };
            Ok(req(
                "PATCH",
                vec!["mcp".into(), server.clone(), "tools".into(), name.clone()],
                Some(json!({key: !now})),
                format!("{name}: {key} → {}", !now),
            ))
        }
    }
}

/// `:mcp_add` arguments as the add route's body: `npm:PKG`, `pypi:PKG`,
/// an `http(s)://` URL, or a command with its arguments; `as NAME` at the
/// end names it (else the name comes from the package or host).
pub fn add_body(arg: &str) -> Result<Value, String> {
    let mut words: Vec<&str> = arg.split_whitespace().collect();
    let name = match words.len() {
        n if n >= 3 && words[n - 2] == "as" => {
            let n = words.pop().unwrap_or_default().to_string();
            words.pop();
            Some(n)
        }
        _ => None,
    };
    let Some(first) = words.first().copied() else {
        return Err("say what to add: npm:PKG, pypi:PKG, a URL, or a command".into());
    };
    let derive = |p: &str, kind: &str| crate::mcp::owner::derive_name(p, kind);
    let mut body = if let Some(pkg) = first.strip_prefix("npm:") {
        let args: Vec<&str> = ["-y", pkg].into_iter().chain(words[1..].iter().copied()).collect();
        json!({"name": derive(pkg, "npm"), "command": "npx", "args": args})
    } else if let Some(pkg) = first.strip_prefix("pypi:") {
        let args: Vec<&str> = std::iter::once(pkg).chain(words[1..].iter().copied()).collect();
        json!({"name": derive(pkg, "pypi"), "command": "uvx", "args": args})
    } else if first.starts_with("http://") || first.starts_with("https://") {
        json!({"name": derive(first, "http"), "url": first})
    } else {
        let base = std::path::Path::new(first).file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default();
        json!({"name": derive(&base, "custom"), "command": first, "args": &words[1..]})
    };
    if let Some(n) = name {
        body["name"] = json!(n);
    }
    Ok(body)
}

pub fn draw(f: &mut Frame, app: &App, area: Rect) {
    let name = app.selected().map(|a| a.info.name.clone()).unwrap_or_default();
    let st = &app.mcp;
    let [list, detail] = Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)]).areas(area);
    let block = pane(app, format!("{name} · MCP servers ({})", st.servers.len()), app.focus == Focus::Main);
    let inner = block.inner(list);
    f.render_widget(block, list);
    let rows = st.rows();
    if rows.is_empty() {
        let hint =
            "No MCP servers. :mcp_add npm:@modelcontextprotocol/server-everything (or pypi:PKG, a URL, a command)";
        f.render_widget(Paragraph::new(Span::styled(hint, app.theme.get("dim"))).wrap(Wrap { trim: false }), inner);
    } else {
        let w = inner.width as usize;
        let lines: Vec<Line> = rows
            .iter()
            .enumerate()
            .map(|(k, row)| {
                let l = match *row {
                    Row::Server(i) => {
                        let s = &st.servers[i];
                        let state = s["state"].as_str().unwrap_or("idle");
                        let style = match state {
                            "connected" => app.theme.get("text"),
                            "failed" | "exited" => app.theme.get("error"),
                            _ => app.theme.get("dim"),
                        };
                        let dot = match state {
                            "connected" => app.glyphs.running,
                            "failed" | "exited" => app.glyphs.warn,
                            _ => app.glyphs.off,
                        };
                        let text = format!(
                            "{dot} {} ({}) {state}",
                            s["name"].as_str().unwrap_or(""),
                            s["transport"].as_str().unwrap_or("")
                        );
                        Line::from(Span::styled(fit(&text, w), style))
                    }
                    Row::Tool(i, j) => {
                        let t = &st.servers[i]["tools"][j];
                        let on = |k: &str, yes: &'static str, no: &'static str| if t[k] == true { yes } else { no };
                        let review = t["status"].as_str().map(|s| format!(" [{s}]")).unwrap_or_default();
                        let flags = format!(
                            "{} {} {}{review}",
                            on("enabled", "on ", "off"),
                            on("visible", "vis", "hid"),
                            on("restricted", "ask", "ok ")
                        );
                        let room = w.saturating_sub(flags.chars().count() + 1);
                        let style = if t["enabled"] == true { app.theme.get("text") } else { app.theme.get("dim") };
                        Line::from(vec![
                            Span::styled(
                                format!("{:<room$} ", fit(&format!("    {}", t["name"].as_str().unwrap_or("")), room)),
                                style,
                            ),
                            Span::styled(flags, app.theme.get("dim")),
                        ])
                    }
                };
                if k == st.sel { l.style(app.theme.get("selection")) } else { l }
            })
            .collect();
        let top = st.sel.saturating_sub((inner.height as usize).saturating_sub(1));
        f.render_widget(Paragraph::new(lines).scroll((top as u16, 0)), inner);
    }
    let block = pane(app, "server".into(), false);
    let inner = block.inner(detail);
    f.render_widget(block, detail);
    let Some(row) = st.selected() else { return };
    let s = st.server_of(row);
    let field =
        |k: &str, v: String| Line::from(vec![Span::styled(format!("{k:<12}"), app.theme.get("dim")), Span::raw(v)]);
    let mut lines = vec![
        field("target", s["target"].as_str().unwrap_or("").to_string()),
        field("state", s["state"].as_str().unwrap_or("idle").to_string()),
    ];
    if let Some(n) = s["tools_listed"].as_u64() {
        lines.push(field("listed", format!("{n} tools")));
    }
    let creds: Vec<&str> = s["credentials"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if !creds.is_empty() {
        lines.push(field("credentials", format!("{} (sealed)", creds.join(", "))));
    }
    if s["restarts"].as_u64().is_some_and(|r| r > 0) {
        lines.push(field("restarts", s["restarts"].to_string()));
    }
    if let Some(e) = s["error"].as_str() {
        lines.push(Line::from(Span::styled(format!("error: {e}"), app.theme.get("error"))));
    }
    if let Some(ms) = s["retry_in_ms"].as_u64() {
        lines.push(field("next try", format!("in {} s", ms.div_ceil(1000))));
    }
    let tail: Vec<&str> = s["stderr_tail"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if !tail.is_empty() {
        lines.push(Line::raw(""));
        lines.push(Line::from(Span::styled("stderr", app.theme.get("dim"))));
        for l in tail {
            lines.push(Line::raw(l.to_string()));
        }
    }
    lines.push(Line::raw(""));
    lines.push(Line::from(Span::styled(
        "e on/off · r ask/ok · v vis/hid · R restart · D remove · :mcp_add",
        app.theme.get("dim"),
    )));
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_arguments() {
        assert_eq!(
            add_body("npm:@modelcontextprotocol/server-everything stdio").unwrap(),
            json!({"name": "everything", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything", "stdio"]})
        );
        assert_eq!(
            add_body("pypi:mcp-server-time as clock").unwrap(),
            json!({"name": "clock", "command": "uvx", "args": ["mcp-server-time"]})
        );
        assert_eq!(add_body("https://mcp.example.com/mcp").unwrap()["name"], "mcp_example_com");
        assert_eq!(
            add_body("/usr/bin/my-server --x").unwrap(),
            json!({"name": "my_server", "command": "/usr/bin/my-server", "args": ["--x"]})
        );
        assert!(add_body("  ").is_err());
    }

    #[test]
    fn requests_follow_the_selection() {
        let st = McpState {
            servers: vec![json!({"name": "ev", "tools": [{"name": "echo", "enabled": true, "restricted": true}]})],
            sel: 1,
        };
        let r = request("a1", &st, "mcp_toggle_restricted").unwrap();
        assert_eq!((r.method, r.segments.join("/")), ("PATCH", "mcp/ev/tools/echo".to_string()));
        assert_eq!(r.body, Some(json!({"restricted": false})));
        let st0 = McpState { sel: 0, ..st };
        assert!(request("a1", &st0, "mcp_toggle_enabled").unwrap_err().contains("select a tool"));
        assert_eq!(request("a1", &st0, "mcp_restart").unwrap().segments, ["mcp", "ev", "restart"]);
        assert!(request("a1", &McpState::default(), "mcp_remove").is_err());
    }
}
