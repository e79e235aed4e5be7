//! Syntax highlighting through syntect, mapped to the terminal's 16 ANSI
//! colours (the default theme's promise: it works with `TERM=xterm` and no
//! truecolour). The syntax set loads once, on first use.

use std::sync::OnceLock;

use ratatui::style::{Color, Style};
use ratatui::text::Span;
use syntect::easy::HighlightLines;
use syntect::highlighting::{Theme, ThemeSet};
use syntect::parsing::SyntaxSet;

fn sets() -> &'static (SyntaxSet, Theme) {
    static SETS: OnceLock<(SyntaxSet, Theme)> = OnceLock::new();
    SETS.get_or_init(|| {
        let ss = SyntaxSet::load_defaults_newlines();
        let mut ts = ThemeSet::load_defaults();
        let theme = ts.themes.remove("base16-ocean.dark").unwrap_or_default();
        (ss, theme)
    })
}

/// The nearest of the 8 normal ANSI colours by hue (grey stays default).
fn ansi(c: syntect::highlighting::Color) -> Color {
    let (r, g, b) = (c.r as i32, c.g as i32, c.b as i32);
    let max = r.max(g).max(b);
    let min = r.min(g).min(b);
    if max - min < 40 {
        return if max < 100 { Color::DarkGray } else { Color::Reset };
    }
    let bit = |v: i32| v > (max + min) / 2;
    match (bit(r), bit(g), bit(b)) {
        (true, false, false) => Color::Red,
        (false, true, false) => Color::Green,
        (true, true, false) => Color::Yellow,
        (false, false, true) => Color::Blue,
        (true, false, true) => Color::Magenta,
        (false, true, true) => Color::Cyan,
        _ => Color::Reset,
    }
}

/// Highlight one line of `lang` (a fence tag or file extension); unknown
/// languages come back plain.
pub fn line(lang: &str, line: &str) -> Vec<Span<'static>> {
    text(lang, line, 1).pop().unwrap_or_default()
}

/// Highlight a whole text (a file preview), line by line with state kept.
pub fn text(lang: &str, text: &str, max_lines: usize) -> Vec<Vec<Span<'static>>> {
    let (ss, theme) = sets();
    let syntax = ss
        .find_syntax_by_token(lang)
        .or_else(|| ss.find_syntax_by_extension(lang))
        .unwrap_or_else(|| ss.find_syntax_plain_text());
    let mut h = HighlightLines::new(syntax, theme);
    text.lines()
        .take(max_lines)
        .map(|l| match h.highlight_line(l, ss) {
            Ok(parts) => parts
                .into_iter()
                .map(|(st, s)| Span::styled(s.to_string(), Style::default().fg(ansi(st.foreground))))
                .collect(),
            Err(_) => vec![Span::raw(l.to_string())],
        })
        .collect()
}
