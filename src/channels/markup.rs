//! The agent writes Markdown; each channel has its own markup. This turns
//! Markdown (parsed by pulldown-cmark, never by pattern) into Telegram's
//! HTML subset, Slack's mrkdwn, or an email's HTML part, escaping what
//! each requires so text can never be read as markup. Raw HTML in the
//! Markdown is shown as text.

use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};

/// How one channel writes each construct.
struct Dialect {
    bold: (&'static str, &'static str),
    italic: (&'static str, &'static str),
    strike: (&'static str, &'static str),
    code: (&'static str, &'static str),
    pre_close: &'static str,
    quote: (&'static str, &'static str),
    escape: fn(&str) -> String,
    pre_open: fn(&str) -> String,
    link_open: fn(&str) -> String,
    link_close: &'static str,
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn attr_escape(s: &str) -> String {
    html_escape(s).replace('"', "&quot;")
}

const TELEGRAM: Dialect = Dialect {
    bold: ("<b>", "</b>"),
    italic: ("<i>", "</i>"),
    strike: ("<s>", "</s>"),
    code: ("<code>", "</code>"),
    pre_close: "</code></pre>",
    quote: ("<blockquote>", "</blockquote>"),
    escape: html_escape,
    pre_open: |lang| {
        if lang.is_empty() {
            "<pre><code>".into()
        } else {
            format!("<pre><code class=\"language-{}\">", attr_escape(lang))
        }
    },
    link_open: |url| format!("<a href=\"{}\">", attr_escape(url)),
    link_close: "</a>",
};

/// Slack escapes only `&`, `<` and `>`; a link is `<url|text>`.
const SLACK: Dialect = Dialect {
    bold: ("*", "*"),
    italic: ("_", "_"),
    strike: ("~", "~"),
    code: ("`", "`"),
    pre_close: "```",
    quote: ("> ", ""),
    escape: html_escape,
    pre_open: |_| "```\n".into(),
    link_open: |url| format!("<{}|", html_escape(url).replace('|', "%7C")),
    link_close: ">",
};

fn render(md: &str, d: &Dialect) -> String {
    let mut out = String::with_capacity(md.len() + 16);
    let mut lists: Vec<Option<u64>> = Vec::new();
    for ev in Parser::new_ext(md, Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TABLES) {
        match ev {
            Event::Start(tag) => match tag {
                Tag::Strong => out.push_str(d.bold.0),
                Tag::Emphasis => out.push_str(d.italic.0),
                Tag::Strikethrough => out.push_str(d.strike.0),
                Tag::Heading { .. } => out.push_str(d.bold.0),
                Tag::BlockQuote(_) => out.push_str(d.quote.0),
                Tag::CodeBlock(kind) => {
                    let lang = match &kind {
                        CodeBlockKind::Fenced(l) => l.split_whitespace().next().unwrap_or("").to_string(),
                        CodeBlockKind::Indented => String::new(),
                    };
                    out.push_str(&(d.pre_open)(&lang));
                }
                Tag::List(start) => {
                    if !lists.is_empty() && !out.ends_with('\n') {
                        out.push('\n');
                    }
                    lists.push(start);
                }
                Tag::Item => {
                    let depth = lists.len().saturating_sub(1);
                    out.push_str(&"  ".repeat(depth));
                    match lists.last_mut() {
                        Some(Some(n)) => {
                            out.push_str(&format!("{n}. "));
                            *n += 1;
                        }
                        _ => out.push_str("• "),
                    }
                }
                Tag::Link { dest_url, .. } => out.push_str(&(d.link_open)(&dest_url)),
                Tag::Image { dest_url, .. } => out.push_str(&(d.link_open)(&dest_url)),
                _ => {}
            },
            Event::End(tag) => match tag {
                TagEnd::Strong => out.push_str(d.bold.1),
                TagEnd::Emphasis => out.push_str(d.italic.1),
                TagEnd::Strikethrough => out.push_str(d.strike.1),
                TagEnd::Heading(_) => {
                    out.push_str(d.bold.1);
                    out.push_str("\n\n");
                }
                TagEnd::Paragraph if lists.is_empty() => out.push_str("\n\n"),
                TagEnd::BlockQuote(_) => {
                    while out.ends_with('\n') {
                        out.pop();
                    }
                    out.push_str(d.quote.1);
                    out.push_str("\n\n");
                }
                TagEnd::CodeBlock => {
                    out.push_str(d.pre_close);
                    out.push_str("\n\n");
                }
                TagEnd::List(_) => {
                    lists.pop();
                    if lists.is_empty() {
                        out.push('\n');
                    }
                }
                TagEnd::Item if !out.ends_with('\n') => out.push('\n'),
                TagEnd::Link | TagEnd::Image => out.push_str(d.link_close),
                TagEnd::TableRow | TagEnd::TableHead => out.push('\n'),
                TagEnd::TableCell => out.push_str(" | "),
                TagEnd::Table => out.push('\n'),
                _ => {}
            },
            Event::Text(t) | Event::Html(t) | Event::InlineHtml(t) | Event::InlineMath(t) | Event::DisplayMath(t) => {
                out.push_str(&(d.escape)(&t))
            }
            Event::Code(t) => {
                out.push_str(d.code.0);
                out.push_str(&(d.escape)(&t));
                out.push_str(d.code.1);
            }
            Event::SoftBreak | Event::HardBreak => out.push('\n'),
            Event::Rule => out.push_str("———\n\n"),
            Event::TaskListMarker(done) => out.push_str(if done { "[x] " } else { "[ ] " }),
            Event::FootnoteReference(t) => out.push_str(&format!("[{}]", (d.escape)(&t))),
        }
    }
    out.trim_end().to_string()
}

/// Telegram's HTML (`parse_mode: HTML`).
pub fn telegram_html(md: &str) -> String {
    render(md, &TELEGRAM)
}

/// Slack's mrkdwn.
pub fn slack_mrkdwn(md: &str) -> String {
    render(md, &SLACK)
}

/// An email's HTML part: CommonMark's own HTML, raw HTML shown as text.
pub fn email_html(md: &str) -> String {
    let events = Parser::new_ext(md, Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TABLES).map(|e| match e {
        Event::Html(t) | Event::InlineHtml(t) => Event::Text(t),
        other => other,
    });
    let mut body = String::new();
    pulldown_cmark::html::push_html(&mut body, events);
    format!("<!DOCTYPE html><html><body>{body}</body></html>")
}

/// Text in pieces of at most `max` characters, cut at a line end where one
/// is in the second half.
pub fn pieces(text: &str, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest: Vec<char> = text.chars().collect();
    while rest.len() > max {
        let cut = rest[..max].iter().rposition(|c| *c == '\n').filter(|i| *i > max / 2).map(|i| i + 1).unwrap_or(max);
        out.push(rest[..cut].iter().collect());
        rest.drain(..cut);
    }
    out.push(rest.into_iter().collect());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_becomes_each_channels_markup_with_text_escaped() {
        let md = "# Plan\n\n**Bold** and _it_ and ~~old~~ and `a<b`.\n\n- one\n- [site](https://x.org/?a=1&b=2)\n\n```rust\nlet x = 1 < 2;\n```\n\n<script>x()</script>";
        assert_eq!(
            telegram_html(md),
            "<b>Plan</b>\n\n<b>Bold</b> and <i>it</i> and <s>old</s> and <code>a&lt;b</code>.\n\n• one\n• <a href=\"https://x.org/?a=1&amp;b=2\">site</a>\n\n<pre><code class=\"language-rust\">let x = 1 &lt; 2;\n</code></pre>\n\n&lt;script&gt;x()&lt;/script&gt;"
        );
        assert_eq!(
            slack_mrkdwn("**Bold** and [site](https://x.org) and 1 < 2\n\n1. a\n2. b"),
            "*Bold* and <https://x.org|site> and 1 &lt; 2\n\n1. a\n2. b"
        );
        let html = email_html("Hi **Ann**\n\n<img src=x onerror=y()>");
        assert!(html.contains("<strong>Ann</strong>") && html.contains("&lt;img"), "{html}");
    }

    #[test]
    fn long_text_is_cut_in_pieces_at_line_ends() {
        let text = format!("{}\n{}", "a".repeat(1500), "b".repeat(1500));
        let p = pieces(&text, 2000);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].len(), 1501, "cut after the line end");
        assert_eq!(pieces("hi", 2000), vec!["hi"]);
        assert!(pieces(&"x".repeat(4500), 2000).iter().all(|p| p.chars().count() <= 2000));
    }
}
