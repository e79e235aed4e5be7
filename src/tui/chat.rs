//! A loop as the chat pane shows it: rows become blocks (owner messages,
//! assistant text, reasoning, tool cards with their results joined by id),
//! and blocks become lines only when they are on screen. Markdown is
//! rendered line by line (headings, lists, fenced code through syntect), so
//! a streaming reply is shown by completed lines and never half-parsed.

use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use serde_json::Value;
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

use super::highlight;
use super::theme::Theme;
use crate::runtime::prompt::is_context_row;
use crate::store::loop_rows::LoopRow;

/// How the runtime marks the text of a reply an interrupt cut short.
pub const INTERRUPTED_MARK: &str = crate::runtime::executor::INTERRUPTED_MARK;

#[derive(Debug, Clone, PartialEq)]
pub enum Block {
    User(String),
    Assistant(String),
    Reasoning(String),
    Tool {
        id: String,
        name: String,
        input: Value,
        result: Option<(String, bool)>,
    },
    /// A notice of the runtime (`[System] …`, recovery notices).
    Notice(String),
    /// The text of a reply cut by an interrupt: streamed, shown, never part
    /// of the loop (the runtime keeps only whole responses).
    Interrupted(String),
}

/// Fold rows into blocks (appending to `out`, so a follower can add rows).
pub fn push_rows(out: &mut Vec<Block>, rows: &[LoopRow]) {
    for r in rows {
        if is_context_row(r) {
            continue;
        }
        let blocks: Vec<Value> = match &r.content {
            Value::Array(a) => a.clone(),
            Value::String(s) => vec![serde_json::json!({"type": "text", "text": s})],
            _ => continue,
        };
        for b in blocks {
            let text = || b["text"].as_str().unwrap_or("").to_string();
            match (r.role.as_str(), b["type"].as_str().unwrap_or("")) {
                // A reply cut by an interrupt is kept in the loop, marked.
                ("assistant", "text") => match text().strip_suffix(INTERRUPTED_MARK) {
                    Some(cut) => out.push(Block::Interrupted(cut.to_string())),
                    None => out.push(Block::Assistant(text())),
                },
                ("assistant", "thinking" | "reasoning") => {
                    let t = b["thinking"].as_str().or(b["text"].as_str()).unwrap_or("").to_string();
                    out.push(Block::Reasoning(t));
                }
                ("assistant", "tool_use") => out.push(Block::Tool {
                    id: b["id"].as_str().unwrap_or("").into(),
                    name: b["name"].as_str().unwrap_or("?").into(),
                    input: b["input"].clone(),
                    result: None,
                }),
                (_, "tool_result") => {
                    let id = b["tool_use_id"].as_str().unwrap_or("");
                    let content = match &b["content"] {
                        Value::String(s) => s.clone(),
                        Value::Array(a) => a.iter().filter_map(|x| x["text"].as_str()).collect::<Vec<_>>().join("\n"),
                        other => other.to_string(),
                    };
                    let err = b["is_error"].as_bool().unwrap_or(false);
                    if let Some(Block::Tool { result, .. }) =
                        out.iter_mut().rev().find(|x| matches!(x, Block::Tool { id: i, .. } if i == id))
                    {
                        *result = Some((content, err));
                    }
                }
                ("user", "text") => {
                    let t = text();
                    if t.starts_with("[System") || t.starts_with("[Loop Compacted") || t.starts_with("[Recovery") {
                        out.push(Block::Notice(t));
                    } else {
                        out.push(Block::User(t));
                    }
                }
                _ => {}
            }
        }
    }
}

/// The gist of a tool call's arguments on one line.
pub fn gist(input: &Value) -> String {
    let Some(obj) = input.as_object() else { return input.to_string() };
    for k in ["path", "sql", "query", "command", "message", "question", "state", "key", "url", "name"] {
        if let Some(v) = obj.get(k).and_then(Value::as_str) {
            return v.replace('\n', " ");
        }
    }
    obj.iter()
        .filter(|(k, _)| !k.starts_with('_'))
        .map(|(k, v)| format!("{k}: {}", v.to_string().trim_matches('"')))
        .collect::<Vec<_>>()
        .join("  ")
}

/// Cut a string to a display width, with an ellipsis when cut.
pub fn fit(s: &str, width: usize) -> String {
    if s.width() <= width {
        return s.to_string();
    }
    let mut out = String::new();
    let mut w = 0;
    for ch in s.chars() {
        let cw = ch.width().unwrap_or(0);
        if w + cw + 1 > width {
            break;
        }
        out.push(ch);
        w += cw;
    }
    out.push('…');
    out
}

/// Word-wrap one line of text to `width` columns (long words are broken).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut out = Vec::new();
    let mut line = String::new();
    let mut w = 0;
    for word in text.split_inclusive(' ') {
        let ww = word.trim_end().width();
        if w + ww > width && w > 0 {
            out.push(std::mem::take(&mut line).trim_end().to_string());
            w = 0;
        }
        if ww > width {
            for ch in word.chars() {
                let cw = ch.width().unwrap_or(0);
                if w + cw > width {
                    out.push(std::mem::take(&mut line));
                    w = 0;
                }
                line.push(ch);
                w += cw;
            }
            continue;
        }
        line.push_str(word);
        w += word.width();
    }
    out.push(line.trim_end().to_string());
    out
}

/// Markdown lines to styled, wrapped lines with a left gutter.
pub fn markdown(text: &str, width: usize, base: Style, theme: &Theme, gutter: &str) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    let inner = width.saturating_sub(gutter.width()).max(4);
    for raw in text.lines() {
        let trimmed = raw.trim_start();
        if let Some(rest) = trimmed.strip_prefix("```") {
            fence = match fence {
                Some(_) => None,
                None => Some(rest.trim().to_string()),
            };
            continue;
        }
        if let Some(lang) = &fence {
            let mut spans = vec![Span::raw(gutter.to_string())];
            spans.extend(highlight::line(lang, &fit(raw, inner)));
            out.push(Line::from(spans));
            continue;
        }
        let (style, body) = if let Some(h) = trimmed.strip_prefix('#') {
            (base.add_modifier(Modifier::BOLD), h.trim_start_matches('#').trim_start().to_string())
        } else if let Some(item) = trimmed.strip_prefix("- ").or_else(|| trimmed.strip_prefix("* ")) {
            (base, format!("• {item}"))
        } else {
            (base, raw.to_string())
        };
        for (i, l) in wrap(&body, inner).into_iter().enumerate() {
            let g = if i == 0 { gutter.to_string() } else { " ".repeat(gutter.width()) };
            let mut spans = vec![Span::raw(g)];
            spans.extend(styled_inline(&l, style, theme));
            out.push(Line::from(spans));
        }
    }
    if text.is_empty() {
        out.push(Line::from(gutter.to_string()));
    }
    out
}

/// A reply being streamed: its completed lines as markdown, the line being
/// written as plain wrapped text (so nothing is half-parsed, and a
/// one-paragraph reply shows before it ends).
pub fn streaming(text: &str, width: usize, base: Style, theme: &Theme, gutter: &str) -> Vec<Line<'static>> {
    let (done, partial) = match text.rfind('\n') {
        Some(i) => (&text[..i], &text[i + 1..]),
        None => ("", text),
    };
    let mut out = if done.is_empty() { Vec::new() } else { markdown(done, width, base, theme, gutter) };
    if !partial.is_empty() {
        let inner = width.saturating_sub(gutter.width()).max(4);
        for (i, l) in wrap(partial, inner).into_iter().enumerate() {
            let g = if i == 0 { gutter.to_string() } else { " ".repeat(gutter.width()) };
            out.push(Line::from(vec![Span::raw(g), Span::styled(l, base)]));
        }
    }
    out
}

/// `**bold**` and `` `code` `` inside a line.
fn styled_inline(line: &str, base: Style, theme: &Theme) -> Vec<Span<'static>> {
    let mut spans = Vec::new();
    let mut rest = line;
    while !rest.is_empty() {
        let next = [rest.find("**"), rest.find('`')].into_iter().flatten().min();
        let Some(at) = next else {
            spans.push(Span::styled(rest.to_string(), base));
            break;
        };
        if at > 0 {
            spans.push(Span::styled(rest[..at].to_string(), base));
        }
        let (marker, style) = if rest[at..].starts_with("**") {
            ("**", base.add_modifier(Modifier::BOLD))
        } else {
            ("`", theme.get("accent"))
        };
        let after = &rest[at + marker.len()..];
        match after.find(marker) {
            Some(end) => {
                spans.push(Span::styled(after[..end].to_string(), style));
                rest = &after[end + marker.len()..];
            }
            None => {
                spans.push(Span::styled(rest[at..].to_string(), base));
                break;
            }
        }
    }
    spans
}

/// Glyphs, with the ASCII fallback for terminals without UTF-8.
#[derive(Debug, Clone, Copy)]
pub struct Glyphs {
    pub collapsed: &'static str,
    pub expanded: &'static str,
    pub running: &'static str,
    pub waiting: &'static str,
    pub off: &'static str,
    pub warn: &'static str,
    pub here: &'static str,
    pub branch: &'static str,
    pub last: &'static str,
    /// A message whose signature verified.
    pub signed: &'static str,
    /// Between the parts of a path (`adf › research › main`).
    pub sep: &'static str,
    /// An agent that serves a site or routes on the mesh server.
    pub serving: &'static str,
    /// Only ASCII may be drawn (no half blocks for pictures either).
    pub ascii: bool,
}

pub const UTF8: Glyphs = Glyphs {
    collapsed: "▸",
    expanded: "▾",
    running: "●",
    waiting: "◆",
    off: "○",
    warn: "⚠",
    here: "◀",
    branch: "├",
    last: "└",
    signed: "✓",
    sep: "›",
    serving: "⌂",
    ascii: false,
};

pub const ASCII: Glyphs = Glyphs {
    collapsed: ">",
    expanded: "v",
    running: "*",
    waiting: "+",
    off: "o",
    warn: "!",
    here: "<",
    branch: "|",
    last: "`",
    signed: "v",
    sep: ">",
    serving: "@",
    ascii: true,
};

/// Lay out one block at `width`. `expanded` opens a tool card.
pub fn layout(
    block: &Block,
    width: usize,
    expanded: bool,
    selected: bool,
    theme: &Theme,
    g: &Glyphs,
) -> Vec<Line<'static>> {
    let mut lines = match block {
        Block::User(t) => {
            let mut l = markdown(t, width, theme.get("user"), theme, "you  ");
            if let Some(first) = l.first_mut()
                && let Some(s) = first.spans.first_mut()
            {
                s.style = theme.get("user").add_modifier(Modifier::BOLD);
            }
            l
        }
        Block::Assistant(t) => markdown(t, width, theme.get("assistant"), theme, "     "),
        Block::Interrupted(t) => {
            let mut l = markdown(t.trim_end(), width, theme.get("assistant"), theme, "     ");
            l.push(Line::styled("     [interrupted]".to_string(), theme.get("waiting")));
            l
        }
        Block::Reasoning(t) => {
            let dim = theme.get("reasoning").add_modifier(Modifier::ITALIC);
            let mut l = Vec::new();
            for (i, line) in t.lines().filter(|l| !l.trim().is_empty()).enumerate() {
                if i >= 3 && !expanded {
                    l.push(Line::styled("     …".to_string(), dim));
                    break;
                }
                for w in wrap(line, width.saturating_sub(5)) {
                    l.push(Line::styled(format!("     {w}"), dim));
                }
            }
            l
        }
        Block::Notice(t) => wrap(t, width.saturating_sub(5))
            .into_iter()
            .map(|w| Line::styled(format!("     {w}"), theme.get("dim")))
            .collect(),
        Block::Tool { name, input, result, .. } => {
            let mark = if expanded { g.expanded } else { g.collapsed };
            let status = match result {
                None => ("…".to_string(), theme.get("waiting")),
                Some((r, true)) => (format!("error: {}", fit(r.lines().next().unwrap_or(""), 30)), theme.get("error")),
                Some((r, false)) => (format!("{} B", r.len()), theme.get("dim")),
            };
            let head = format!("  {mark} {name}  ");
            let room = width.saturating_sub(head.width() + status.0.width() + 2);
            let mut l = vec![Line::from(vec![
                Span::styled(head, theme.get("tool")),
                Span::styled(format!("{:<room$}", fit(&gist(input), room)), theme.get("dim")),
                Span::raw("  "),
                Span::styled(status.0, status.1),
            ])];
            if expanded {
                let pretty = serde_json::to_string_pretty(input).unwrap_or_default();
                l.push(Line::styled("    arguments".to_string(), theme.get("dim")));
                for line in pretty.lines() {
                    let mut spans = vec![Span::raw("    ")];
                    spans.extend(highlight::line("json", &fit(line, width.saturating_sub(4))));
                    l.push(Line::from(spans));
                }
                if let Some((r, err)) = result {
                    l.push(Line::styled("    result".to_string(), theme.get("dim")));
                    let style = if *err { theme.get("error") } else { theme.get("text") };
                    for line in r.lines().take(200) {
                        for w in wrap(line, width.saturating_sub(4)) {
                            l.push(Line::styled(format!("    {w}"), style));
                        }
                    }
                }
            }
            l
        }
    };
    if selected && let Some(first) = lines.first_mut() {
        first.style = theme.get("selection");
    }
    lines.push(Line::default());
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(seq: i64, role: &str, content: Value) -> LoopRow {
        LoopRow { seq, role: role.into(), content, model: None, tokens: None, created_at: 0, ord: None }
    }

    #[test]
    fn rows_become_blocks_with_results_joined() {
        let rows = vec![
            row(1, "user", json!([{"type": "text", "text": "[Context: system_prompt]\nx"}])),
            row(2, "user", json!([{"type": "text", "text": "hello"}])),
            row(
                3,
                "assistant",
                json!([{"type": "text", "text": "hi"}, {"type": "tool_use", "id": "t1", "name": "fs_read", "input": {"path": "a.md"}}]),
            ),
            row(4, "user", json!([{"type": "tool_result", "tool_use_id": "t1", "content": "abc"}])),
        ];
        let mut b = Vec::new();
        push_rows(&mut b, &rows);
        assert_eq!(b.len(), 3);
        assert_eq!(b[0], Block::User("hello".into()));
        assert!(matches!(&b[2], Block::Tool { result: Some((r, false)), .. } if r == "abc"));
    }

    #[test]
    fn a_stream_shows_its_partial_line_plain_and_wrapped() {
        let theme = Theme::default_theme();
        let text = |ls: &[Line]| ls.iter().map(|l| l.to_string()).collect::<Vec<_>>();
        // One paragraph, no newline yet: shown, wrapped to the width.
        let l = streaming("one two three four **five", 16, Style::default(), &theme, "  ");
        assert_eq!(text(&l), ["  one two three", "  four **five"], "the open ** stays as typed");
        // Completed lines are markdown; the tail is plain.
        let l = streaming("# Title\n- item\nhalf **bo", 40, Style::default(), &theme, "");
        assert_eq!(text(&l), ["Title", "• item", "half **bo"]);
        assert!(streaming("", 40, Style::default(), &theme, "").is_empty());
    }

    #[test]
    fn wrapping_respects_width() {
        assert_eq!(wrap("aaa bbb ccc", 7), ["aaa bbb", "ccc"]);
        assert_eq!(wrap("abcdefghij", 4), ["abcd", "efgh", "ij"]);
        assert_eq!(fit("abcdef", 4), "abc…");
        for l in wrap("ünïcødé wörds ファイル ファイル", 6) {
            assert!(l.width() <= 6, "{l}");
        }
    }
}
