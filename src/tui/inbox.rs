//! The inbox view (an agent's messages, newest first, with the selected one
//! in full and its trust marks) and the events pane's one-line account of
//! message events: who wrote to whom, signed or not, encrypted or not.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use unicode_width::UnicodeWidthStr;

use super::app::{App, Focus};
use super::chat::fit;
use super::ui::{ago, pane};

/// Who a message is from, as a person reads it.
fn sender(row: &serde_json::Value) -> String {
    row["sender_alias"]
        .as_str()
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| short_did(row["from"].as_str().unwrap_or("?")))
}

/// `did:key:z6MkhRPM…5TNz` for a DID, anything else as it is.
pub fn short_did(did: &str) -> String {
    match did.strip_prefix("did:key:") {
        Some(k) if k.len() > 14 => format!("{}…{}", &k[..8], &k[k.len() - 4..]),
        _ => did.to_string(),
    }
}

/// The trust marks of an inbox row: signed (verified), encrypted.
fn marks(row: &serde_json::Value) -> (bool, bool) {
    let meta: serde_json::Value = row["meta"].as_str().and_then(|m| serde_json::from_str(m).ok()).unwrap_or_default();
    (meta["message_verified"] == true, meta["payload_encrypted"] == true)
}

pub fn draw(f: &mut Frame, app: &App, area: Rect) {
    let name = app.selected().map(|a| a.info.name.clone()).unwrap_or_default();
    let unread = app.inbox.rows.iter().filter(|r| r["status"] == "unread").count();
    let [list, detail] = Layout::horizontal([Constraint::Percentage(45), Constraint::Percentage(55)]).areas(area);
    let block = pane(app, format!("{name} · inbox ({unread} unread)"), app.focus == Focus::Main);
    let inner = block.inner(list);
    f.render_widget(block, list);
    if app.inbox.rows.is_empty() {
        f.render_widget(Paragraph::new(Span::styled("No messages.", app.theme.get("dim"))), inner);
    } else {
        let w = inner.width as usize;
        let lines: Vec<Line> = app
            .inbox
            .rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let dot = match r["status"].as_str() {
                    Some("unread") => app.glyphs.running,
                    Some("archived") => app.glyphs.off,
                    _ => " ",
                };
                let (signed, _) = marks(r);
                let flag = if signed { app.glyphs.signed } else { app.glyphs.warn };
                let when = ago(app.now_ms, r["received_at"].as_i64().unwrap_or(0));
                let what =
                    r["subject"].as_str().filter(|t| !t.is_empty()).map(str::to_string).unwrap_or_else(|| {
                        r["content"].as_str().unwrap_or("").lines().next().unwrap_or("").to_string()
                    });
                let who = match r["sender_alias"].as_str().filter(|a| !a.is_empty()) {
                    Some(a) => a.to_string(),
                    None => {
                        r["from"]
                            .as_str()
                            .unwrap_or("?")
                            .trim_start_matches("did:key:")
                            .chars()
                            .take(8)
                            .collect::<String>()
                            + "…"
                    }
                };
                let left = format!("{dot} {:<10} {what}", fit(&who, 10));
                let right = format!(" {flag} {when}");
                let room = w.saturating_sub(right.width());
                let style = if r["status"] == "unread" { app.theme.get("text") } else { app.theme.get("dim") };
                let mark = if signed { app.theme.get("dim") } else { app.theme.get("waiting") };
                let l = Line::from(vec![
                    Span::styled(format!("{:<room$}", fit(&left, room)), style),
                    Span::styled(right, mark),
                ]);
                if i == app.inbox.sel { l.style(app.theme.get("selection")) } else { l }
            })
            .collect();
        let top = app.inbox.sel.saturating_sub((inner.height as usize).saturating_sub(1));
        f.render_widget(Paragraph::new(lines).scroll((top as u16, 0)), inner);
    }
    let block = pane(app, "message".into(), false);
    let inner = block.inner(detail);
    f.render_widget(block, detail);
    let Some(r) = app.inbox.rows.get(app.inbox.sel) else { return };
    let (signed, enc) = marks(r);
    let trust = match (signed, enc) {
        (true, true) => "signature verified · was encrypted to this agent",
        (true, false) => "signature verified · sent in the clear",
        (false, true) => "unsigned · was encrypted",
        (false, false) => "unsigned (not verified)",
    };
    let field =
        |k: &str, v: String| Line::from(vec![Span::styled(format!("{k:<8}"), app.theme.get("dim")), Span::raw(v)]);
    let mut lines = vec![
        field("from", format!("{} {}", sender(r), short_did(r["from"].as_str().unwrap_or("")))),
        field("trust", trust.to_string()),
        field("status", r["status"].as_str().unwrap_or("").to_string()),
    ];
    if let Some(sub) = r["subject"].as_str().filter(|t| !t.is_empty()) {
        lines.push(field("subject", sub.to_string()));
    }
    if let Some(t) = r["thread_id"].as_str() {
        lines.push(field("thread", t.to_string()));
    }
    let atts: serde_json::Value =
        r["attachments"].as_str().and_then(|a| serde_json::from_str(a).ok()).unwrap_or_default();
    for a in atts.as_array().map(Vec::as_slice).unwrap_or(&[]) {
        let at = a["path"].as_str().or(a["filename"].as_str()).unwrap_or("?");
        lines.push(field("attached", at.to_string()));
    }
    lines.push(Line::raw(""));
    for l in r["content"].as_str().unwrap_or("").lines() {
        lines.push(Line::raw(l.to_string()));
    }
    f.render_widget(Paragraph::new(lines).wrap(ratatui::widgets::Wrap { trim: false }), inner);
}

/// Who talks to whom, for the message events: `a → b  ✓ enc  "subject"`.
pub fn message_line(app: &App, e: &crate::protocol::Envelope) -> Option<String> {
    let p = &e.payload;
    let here =
        e.agent_id.as_ref().and_then(|id| app.agents.iter().find(|a| &a.info.id == id)).map(|a| a.info.name.clone());
    let peer = |k: &str| p[k].as_str().map(short_did).unwrap_or_else(|| "?".into());
    let to = p["to_alias"].as_str().map(str::to_string).unwrap_or_else(|| peer("to"));
    match e.event_type.as_ref() {
        "message.received" => {
            let from = p["sender_alias"].as_str().map(str::to_string).unwrap_or_else(|| peer("from"));
            let trust = format!(
                "{}{}",
                if p["verified"] == true { "signed" } else { "unsigned" },
                if p["encrypted"] == true { ", encrypted" } else { "" }
            );
            let about = p["subject"].as_str().map(|s| format!("  \"{s}\"")).unwrap_or_default();
            Some(format!("{from} → {}  ({trust}){about}", here.unwrap_or_default()))
        }
        "message.sent" => Some(format!("{} → {to}  delivered", here.unwrap_or_default())),
        "message.delivery_failed" => {
            Some(format!("{} → {to}  failed: {}", here.unwrap_or_default(), p["error"].as_str().unwrap_or("?")))
        }
        _ => None,
    }
}
