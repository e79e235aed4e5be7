//! Drawing the app: header, fleet tree, the main pane (chat with inline
//! approval and ask cards, files with a preview, the attention queue), the
//! composer, the events pane, the key-hint line and overlays (palette, `:`
//! line, help, rejection feedback, edit conflicts). Pure functions of the
//! app's state, so frames snapshot in tests.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph, Wrap};
use unicode_width::UnicodeWidthStr;

use super::app::{App, Focus, MainView, Overlay, Pending};
use super::chat::{self, fit};
use super::commands;
use super::input::palette_hits;

pub(super) fn ago(now: i64, then: i64) -> String {
    let s = ((now - then).max(0) / 1000) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, (s % 3600) / 60),
    }
}

pub(super) fn pane<'a>(app: &App, title: String, focused: bool) -> Block<'a> {
    let style = if focused { app.theme.get("focus_border") } else { app.theme.get("border") };
    let b = Block::default().borders(Borders::ALL).border_style(style).title(Span::styled(
        format!(" {title} "),
        if focused { style.add_modifier(Modifier::BOLD) } else { app.theme.get("text") },
    ));
    if app.glyphs.collapsed == "▸" { b.border_type(BorderType::Plain) } else { b.border_set(ASCII_BORDER) }
}

/// Borders where the locale is not UTF-8.
const ASCII_BORDER: ratatui::symbols::border::Set = ratatui::symbols::border::Set {
    top_left: "+",
    top_right: "+",
    bottom_left: "+",
    bottom_right: "+",
    vertical_left: "|",
    vertical_right: "|",
    horizontal_top: "-",
    horizontal_bottom: "-",
};

pub fn draw(f: &mut Frame, app: &App) {
    let area = f.area();
    // A WhatsApp code to scan takes the events pane's rows: a real code
    // needs about 31 of them, and the phone needs all of it.
    let scanning = app.main == MainView::Channels && app.channels.iter().any(|c| c["qr"].is_string());
    let events_h =
        if app.show_events && !scanning && (area.height >= 30 || app.focus == Focus::Events) { 8 } else { 0 };
    let [header, body, events, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(5),
        Constraint::Length(events_h),
        Constraint::Length(1),
    ])
    .areas(area);
    draw_header(f, app, header);
    if app.agents.is_empty() {
        draw_first_run(f, app, body);
    } else {
        let left = if area.width >= 100 { 30 } else { 20 };
        let [tree, main] = Layout::horizontal([Constraint::Length(left), Constraint::Min(20)]).areas(body);
        draw_tree(f, app, tree);
        match app.main {
            MainView::Chat => draw_chat(f, app, main),
            MainView::Files => draw_files(f, app, main),
            MainView::Approvals => draw_approvals(f, app, main),
            MainView::Inbox => super::inbox::draw(f, app, main),
            MainView::Mcp => super::mcp::draw(f, app, main),
            MainView::Skills => super::skills::draw(f, app, main),
            MainView::Context => super::context::draw(f, app, main),
            MainView::Burn => super::control::draw_burn(f, app, main),
            MainView::Why => super::control::draw_why(f, app, main),
            MainView::Logs => super::control::draw_logs(f, app, main),
            MainView::Grants => super::control::draw_grants(f, app, main),
            MainView::Channels => super::control::draw_channels(f, app, main),
            MainView::Compute => super::compute::draw(f, app, main),
        }
    }
    if events_h > 0 {
        draw_events(f, app, events);
    }
    draw_footer(f, app, footer);
    draw_overlay(f, app, area);
    if app.glyphs.collapsed != "▸" {
        asciify(f.buffer_mut());
    }
    // Without colour nothing is coloured, highlighted code included.
    if app.theme.name == "mono" {
        for cell in f.buffer_mut().content.iter_mut() {
            cell.fg = ratatui::style::Color::Reset;
            cell.bg = ratatui::style::Color::Reset;
        }
    }
}

thread_local! {
    static ASCII_MISSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many cells ASCII frames drawn on this thread had no stand-in for
/// (drawn as `?`) since the last call. Every glyph the app itself draws has
/// one; a test keeps it so.
pub fn ascii_misses() -> usize {
    ASCII_MISSES.with(|c| c.replace(0))
}

/// Where the locale is not UTF-8, nothing but ASCII reaches the terminal:
/// drawing glyphs get their ASCII stand-ins, other characters a `?`.
fn asciify(buf: &mut ratatui::buffer::Buffer) {
    for cell in buf.content.iter_mut() {
        let sym = cell.symbol();
        if sym.is_ascii() {
            continue;
        }
        let rep = match sym {
            "›" | "→" => ">",
            "←" => "<",
            "✓" => "v",
            "—" | "–" => "-",
            "─" | "━" | "╌" => "-",
            "│" | "┃" | "▏" | "▍" => "|",
            "┌" | "┐" | "└" | "┘" | "├" | "┤" | "┬" | "┴" | "┼" | "╭" | "╮" | "╰" | "╯" => {
                "+"
            }
            "·" | "•" => "*",
            "…" => ".",
            "✉" => "m",
            "λ" => "L",
            "⚠" => "!",
            "↓" => "v",
            "▸" => ">",
            "▾" => "v",
            "●" => "*",
            "◆" => "+",
            "○" => "o",
            "◀" => "<",
            _ => {
                ASCII_MISSES.with(|c| c.set(c.get() + 1));
                "?"
            }
        };
        cell.set_symbol(rep);
    }
}

fn draw_header(f: &mut Frame, app: &App, area: Rect) {
    let running = app.agents.iter().filter(|a| a.state == "active").count();
    let waiting = app.pending.len();
    let path = match app.selected() {
        Some(a) => format!(
            " adf {sep} {} {sep} {}",
            a.info.name,
            app.current_loop().as_deref().unwrap_or("main"),
            sep = app.glyphs.sep
        ),
        None => " adf".to_string(),
    };
    let burn = short_count(app.burn_per_min(None));
    let fleet = app.fleet_budget.map(|(_, f)| format!(" · fleet {:.0}%$", (f * 100.0).min(999.0))).unwrap_or_default();
    let right = if area.width >= 100 {
        let n = app.agents.len();
        let s = if n == 1 { "" } else { "s" };
        format!("{n} agent{s} · {running} running · {waiting} waiting on you · {burn} tok/min{fleet}   ? help ")
    } else if waiting > 0 {
        format!("{} {waiting} waiting · ? help ", app.glyphs.warn)
    } else {
        "? help ".to_string()
    };
    let pad = (area.width as usize).saturating_sub(path.width() + right.width());
    let style = if waiting > 0 { app.theme.get("waiting") } else { app.theme.get("dim") };
    f.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled(path, app.theme.get("accent").add_modifier(Modifier::BOLD)),
            Span::raw(" ".repeat(pad)),
            Span::styled(right, style),
        ])),
        area,
    );
}

/// 950, 1.2k, 34.5k.
pub(super) fn short_count(n: u64) -> String {
    if n >= 1000 { format!("{:.1}k", n as f64 / 1000.0) } else { n.to_string() }
}

fn state_glyph(app: &App, state: &str, waiting: bool) -> (&'static str, Style) {
    let g = &app.glyphs;
    if waiting {
        return (g.waiting, app.theme.get("waiting"));
    }
    match state {
        "active" => (g.running, app.theme.get("running")),
        "error" => (g.warn, app.theme.get("error")),
        "off" | "suspended" => (g.off, app.theme.get("off")),
        _ => (g.running, app.theme.get("dim")),
    }
}

fn draw_tree(f: &mut Frame, app: &App, area: Rect) {
    let block = pane(app, "Fleet".into(), app.focus == Focus::Fleet);
    let inner = block.inner(area);
    f.render_widget(block, area);
    let w = inner.width as usize;
    let mut lines: Vec<Line> = Vec::new();
    let mut folder: Option<&str> = None;
    let mut host: Option<&str> = None;
    let mut root_indent = "";
    // Attached to several daemons: agents under their host, then folder.
    let under_host = if app.hosts.is_empty() { "" } else { "  " };
    for (i, a) in app.agents.iter().enumerate() {
        if !app.hosts.is_empty() && host != Some(a.host.as_str()) {
            host = Some(a.host.as_str());
            folder = None;
            if let Some(h) = app.hosts.iter().find(|h| h.name == a.host) {
                lines.push(super::hosts::header(app, h, w));
            }
        }
        // Children show under their parent, wherever their folder.
        if a.depth == 0 && folder != Some(a.folder.as_str()) {
            folder = Some(a.folder.as_str());
            if !a.folder.is_empty() {
                lines.push(Line::styled(
                    format!("{under_host}{} {}/", app.glyphs.expanded, a.folder),
                    app.theme.get("dim"),
                ));
            }
        }
        let waiting = app.pending.iter().filter(|p| p.agent_id == a.info.id).count();
        let (g, gs) = state_glyph(app, &a.state, waiting > 0);
        let badge = if waiting > 0 {
            format!("{}{waiting}", app.glyphs.warn)
        } else if a.lambda_error.is_some() {
            format!("{}λ", app.glyphs.warn)
        } else if a.unread > 0 {
            format!("✉{}", a.unread)
        } else {
            match app.burn_per_min(Some(&a.info.id)) {
                0 => a.state.clone(),
                n => format!("{}/m", short_count(n)),
            }
        };
        if a.depth == 0 {
            root_indent = match (under_host.is_empty(), a.folder.is_empty()) {
                (true, true) => "",
                (true, false) | (false, true) => "  ",
                (false, false) => "    ",
            };
        }
        let indent = if a.depth == 0 {
            root_indent.to_string()
        } else {
            format!("{root_indent}{}{} ", "  ".repeat(a.depth - 1), app.glyphs.last)
        };
        // A budget shows as its tightest part's share: `37%$`.
        let spend = a.budget.map(|(_, f)| format!(" {:.0}%$", (f * 100.0).min(999.0))).unwrap_or_default();
        // Ten minutes of burn in five bars, where the name still fits.
        let spark = {
            let m = app.spark(&a.info.id);
            let pairs: Vec<u64> = m.chunks(2).map(|c| c.iter().sum()).collect();
            let s = super::control::sparkline(&pairs);
            let room = w.saturating_sub(indent.width() + 3 + badge.width() + spend.width() + a.info.name.width());
            if s.is_empty() || room < s.width() + 1 { String::new() } else { format!(" {s}") }
        };
        // Served on the mesh server: a mark after the name (the URL is
        // under the chat).
        let serves = if a.serving.is_some() { format!(" {}", app.glyphs.serving) } else { String::new() };
        let name_w =
            w.saturating_sub(indent.width() + 3 + badge.width() + spend.width() + spark.width() + serves.width());
        let mut line = Line::from(vec![
            Span::raw(indent.clone()),
            Span::styled(format!("{g} "), gs),
            Span::raw(format!("{:<name_w$}", fit(&a.info.name, name_w))),
            Span::styled(serves, app.theme.get("accent")),
            Span::styled(spark, app.theme.get("accent")),
            Span::styled(
                format!(" {badge}"),
                if waiting > 0 {
                    app.theme.get("waiting")
                } else if a.lambda_error.is_some() {
                    app.theme.get("error")
                } else {
                    app.theme.get("dim")
                },
            ),
            Span::styled(
                spend,
                match a.budget {
                    Some((_, f)) if f >= 0.8 => app.theme.get("error"),
                    _ => app.theme.get("dim"),
                },
            ),
        ]);
        if i == app.sel {
            line = line.style(if app.focus == Focus::Fleet {
                app.theme.get("selection")
            } else {
                Style::default().add_modifier(Modifier::BOLD)
            });
        }
        lines.push(line);
        if i == app.sel {
            lines.extend(super::loops::tree_lines(app, a, &indent, w));
        }
    }
    // Hosts with no agent to show still show, with how they are.
    for h in app.hosts.iter().filter(|h| !app.agents.iter().any(|a| a.host == h.name)) {
        lines.push(super::hosts::header(app, h, w));
    }
    f.render_widget(Paragraph::new(lines), inner);
}

fn pending_card(app: &App, p: &Pending, width: usize) -> Vec<Line<'static>> {
    let w = width.saturating_sub(2).max(20);
    let title = if p.ask { "ask".to_string() } else { format!("approval · {}", p.tool) };
    let waited = format!(" waiting {} ", ago(app.now_ms, p.since_ms));
    let style = app.theme.get("waiting");
    let top_fill = w.saturating_sub(title.width() + waited.width() + 4);
    let mut out = vec![Line::styled(format!("╭ {title} {}{waited}╮", "─".repeat(top_fill)), style)];
    let mut body: Vec<String> = Vec::new();
    if p.ask {
        body.extend(chat::wrap(p.args["question"].as_str().unwrap_or(""), w.saturating_sub(4)));
        body.push("type the answer below and press enter".into());
    } else {
        if let Some(obj) = p.args.as_object() {
            for (k, v) in obj.iter().filter(|(k, _)| !k.starts_with('_')) {
                body.push(fit(&format!("{k}: {}", v.to_string().trim_matches('"')), w.saturating_sub(4)));
            }
        }
        if let Some(r) = &p.reason {
            body.extend(chat::wrap(&format!("reason: {r}"), w.saturating_sub(4)));
        }
        body.push(if w >= 64 {
            "[a] approve once   [A] always   [r] reject with feedback".into()
        } else {
            "[a] once  [A] always  [r] reject".into()
        });
    }
    for b in body {
        let fill = w.saturating_sub(b.width() + 4);
        out.push(Line::from(vec![
            Span::styled("│ ", style),
            Span::raw(format!("{b}{}", " ".repeat(fill))),
            Span::styled(" │", style),
        ]));
    }
    out.push(Line::styled(format!("╰{}╯", "─".repeat(w.saturating_sub(2))), style));
    if app.glyphs.collapsed != "▸" {
        for l in &mut out {
            for s in &mut l.spans {
                let t: String = s
                    .content
                    .chars()
                    .map(|c| match c {
                        '╭' | '╮' | '╰' | '╯' => '+',
                        '─' => '-',
                        '│' => '|',
                        c => c,
                    })
                    .collect();
                s.content = t.into();
            }
        }
    }
    out
}

fn draw_chat(f: &mut Frame, app: &App, area: Rect) {
    let Some(agent) = app.selected() else { return };
    let [log_area, composer_area] = Layout::vertical([Constraint::Min(3), Constraint::Length(4)]).areas(area);
    let lp = app.current_loop();
    let ctx = app.chats.get(&super::loops::chat_key(&agent.info.id, lp.as_deref()));
    // While a reply streams, its tokens count up (about four characters
    // each until the call's usage arrives): `~373 tok`.
    let writing = ctx.map(|c| (c.streaming.len() + c.thinking.len()).div_ceil(4) as u64).unwrap_or(0);
    let total = agent.tokens + writing;
    let tokens = format!(
        "{}{} tok",
        if writing > 0 { "~" } else { "" },
        if total >= 10_000 { format!("{:.1}k", total as f64 / 1000.0) } else { total.to_string() }
    );
    let cost = if agent.cost > 0.0 { format!(" · ${:.3}", agent.cost) } else { String::new() };
    let gauge = match &lp {
        None => super::window::gauge(agent.context_tokens, agent.window),
        Some(name) => app.side_gauge(agent, name),
    };
    let mut ctx_used = gauge.map(|g| format!(" · {g}")).unwrap_or_default();
    if let Some((which, f)) = agent.budget {
        ctx_used.push_str(&format!(" · budget {:.0}% ({which})", f * 100.0));
    }
    let right = format!(
        " {} · {} · {tokens}{cost}{ctx_used} ",
        if agent.model.is_empty() { "no model" } else { &agent.model },
        agent.state,
    );
    let mut block =
        pane(app, format!("{} · {}", agent.info.name, lp.as_deref().unwrap_or("main")), app.focus == Focus::Main)
            .title_top(Line::from(right).right_aligned());
    if let Some(url) = &agent.serving {
        block =
            block.title_bottom(Line::styled(format!(" {} serving {url} ", app.glyphs.serving), app.theme.get("dim")));
    }
    let inner = block.inner(log_area);
    f.render_widget(block, log_area);
    let width = inner.width as usize;
    let height = inner.height as usize;
    // Lay out from the bottom up, only as far as the view reaches.
    let mut tail: Vec<Line> = Vec::new();
    if let Some(why) = app.unconfigured.get(&agent.info.id) {
        for l in provider_notice(app, agent, why, width.saturating_sub(2)) {
            tail.push(Line::styled(format!(" {l}"), app.theme.get("waiting")));
        }
    }
    if let Some(c) = ctx {
        if !c.thinking.is_empty() {
            for l in c.thinking.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev() {
                tail.push(Line::styled(
                    format!("     {}", fit(l, width.saturating_sub(5))),
                    app.theme.get("reasoning"),
                ));
            }
        }
        tail.extend(chat::streaming(&c.streaming, width, app.theme.get("assistant"), &app.theme, "     "));
        if !c.streaming.is_empty() || !c.thinking.is_empty() {
            tail.push(Line::styled("     ▍".to_string(), app.theme.get("accent")));
        }
    }
    for p in app.pending.iter().filter(|p| p.agent_id == agent.info.id) {
        tail.extend(pending_card(app, p, width));
    }
    let lay = |c: &super::app::ChatState, i: usize| {
        chat::layout(
            &c.blocks[i],
            width,
            c.expanded.contains(&i),
            c.sel == Some(i) && app.focus == Focus::Main,
            &app.theme,
            &app.glyphs,
        )
    };
    let mut view: Vec<Line> = Vec::with_capacity(height);
    match ctx {
        // Scrolled: from the anchor down, as far as the view reaches.
        Some(c) if c.top.is_some_and(|(b, _)| b < c.blocks.len()) => {
            let (b, mut skip) = c.top.unwrap_or_default();
            c.drawn.set((b, skip, width));
            for i in b..c.blocks.len() {
                for l in lay(c, i) {
                    if skip > 0 {
                        skip -= 1;
                    } else if view.len() < height {
                        view.push(l);
                    }
                }
                if view.len() >= height {
                    break;
                }
            }
            view.extend(tail.into_iter().take(height.saturating_sub(view.len())));
            if c.unseen
                && let Some(last) = view.last_mut()
            {
                *last = Line::styled("  ↓ new".to_string(), app.theme.get("accent"));
            }
        }
        // Following: from the bottom up, only as far as the view reaches.
        _ => {
            let mut above: Vec<Vec<Line>> = Vec::new();
            let mut count = tail.len();
            let mut first = (0, 0);
            if let Some(c) = ctx {
                for i in (0..c.blocks.len()).rev() {
                    if count >= height {
                        break;
                    }
                    let l = lay(c, i);
                    count += l.len();
                    first = (i, count.saturating_sub(height));
                    above.push(l);
                }
            }
            let mut lines: Vec<Line> = above.into_iter().rev().flatten().collect();
            lines.extend(tail);
            let start = lines.len().saturating_sub(height);
            view = lines.split_off(start);
            if let Some(c) = ctx {
                c.drawn.set((first.0, first.1, width));
            }
        }
    }
    f.render_widget(Paragraph::new(view), inner);

    let hint = " enter send · alt-enter newline · ctrl-g $EDITOR ";
    let focused = app.focus == Focus::Composer;
    let cblock =
        pane(app, "message".into(), focused).title_bottom(Line::styled(hint, app.theme.get("dim")).right_aligned());
    let cinner = cblock.inner(composer_area);
    f.render_widget(cblock, composer_area);
    let mut ta = app.composer.clone();
    ta.set_cursor_line_style(Style::default());
    if !focused {
        ta.set_cursor_style(Style::default());
    }
    if app.composer.is_empty() && !focused {
        let ask = app.pending.iter().any(|p| p.agent_id == agent.info.id && p.ask);
        use crate::daemon::roles::Role;
        let placeholder = match (app.role, ask) {
            (Role::Observer, _) => "read only: this app's token is an observer's",
            (Role::Approver, false) => "approvals and asks only: this app's token is an approver's",
            (_, true) => "press i to answer the question",
            (Role::Owner, false) => "press i to write",
        };
        f.render_widget(Paragraph::new(Span::styled(placeholder, app.theme.get("dim"))), cinner);
    } else {
        f.render_widget(&ta, cinner);
    }
}

/// The notice on an agent without a model provider: its file, and what to
/// do, in at most two lines.
fn provider_notice(app: &App, agent: &super::app::AgentEntry, why: &str, width: usize) -> Vec<String> {
    let file = agent.info.path.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default();
    let missing = match why.split_once(": no API key") {
        Some((p, _)) => format!("has no {p} API key"),
        None if why.contains("no model provider is set") => "names no model provider".to_string(),
        None => format!("has no model provider ({})", fit(why, 40)),
    };
    let text = format!(
        "{} {file} {missing}, so it cannot think: :connect adds a key; :config edits its provider.",
        app.glyphs.warn
    );
    let mut lines = chat::wrap(&text, width);
    if lines.len() > 2 {
        lines.truncate(2);
        lines[1] = fit(&format!("{}…", lines[1]), width);
    }
    lines
}

fn human(n: u64) -> String {
    match n {
        0..1024 => format!("{n} B"),
        1024..1_048_576 => format!("{:.1} KB", n as f64 / 1024.0),
        _ => format!("{:.1} MB", n as f64 / 1_048_576.0),
    }
}

fn draw_files(f: &mut Frame, app: &App, area: Rect) {
    let name = app.selected().map(|a| a.info.name.clone()).unwrap_or_default();
    let [list, preview] = Layout::horizontal([Constraint::Percentage(40), Constraint::Percentage(60)]).areas(area);
    let block = pane(app, format!("{name} · files"), app.focus == Focus::Main);
    let inner = block.inner(list);
    f.render_widget(block, list);
    let w = inner.width as usize;
    // Files in path order, with a row for each folder where it starts.
    let mut lines: Vec<Line> = Vec::new();
    let mut sel_line = 0;
    let mut open: Vec<&str> = Vec::new();
    for (i, e) in app.files.entries.iter().enumerate() {
        let dirs: Vec<&str> = e.path.split('/').collect();
        let (fname, dirs) = dirs.split_last().map(|(f, d)| (*f, d.to_vec())).unwrap_or((e.path.as_str(), Vec::new()));
        let common = open.iter().zip(&dirs).take_while(|(a, b)| a == b).count();
        open.truncate(common);
        for (d, dir) in dirs.iter().enumerate().skip(common) {
            lines.push(Line::styled(format!("{}{} {dir}/", "  ".repeat(d), app.glyphs.expanded), app.theme.get("dim")));
            open.push(dir);
        }
        let badge = match e.protection.as_str() {
            "none" => "",
            "read_only" => " ro",
            "no_delete" => " nd",
            other => other,
        };
        let size = human(e.size);
        let left = format!("{}{fname}", "  ".repeat(dirs.len()));
        let room = w.saturating_sub(size.width() + badge.width() + 1);
        let l = Line::from(vec![
            Span::raw(format!("{:<room$}", fit(&left, room))),
            Span::styled(badge.to_string(), app.theme.get("waiting")),
            Span::styled(format!(" {size}"), app.theme.get("dim")),
        ]);
        if i == app.files.sel {
            sel_line = lines.len();
            lines.push(l.style(app.theme.get("selection")));
        } else {
            lines.push(l);
        }
    }
    let top = sel_line.saturating_sub((inner.height as usize).saturating_sub(1));
    f.render_widget(Paragraph::new(lines).scroll((top as u16, 0)), inner);

    let (title, body) = match app.preview() {
        Some((e, Ok(text))) => {
            let ext = e.path.rsplit('.').next().unwrap_or("txt").to_string();
            let spans = super::highlight::text(&ext, &text, preview.height as usize);
            (e.path.clone(), spans.into_iter().map(Line::from).collect::<Vec<_>>())
        }
        Some((e, Err(why))) => (e.path.clone(), vec![Line::styled(why, app.theme.get("dim"))]),
        None => ("preview".into(), vec![Line::styled("no file", app.theme.get("dim"))]),
    };
    let block = pane(app, title, false);
    let inner = block.inner(preview);
    f.render_widget(block, preview);
    f.render_widget(Paragraph::new(body), inner);
}

fn draw_approvals(f: &mut Frame, app: &App, area: Rect) {
    let mut title = format!("Waiting on you ({})", app.pending.len());
    if !app.marked.is_empty() {
        title.push_str(&format!(" · {} marked", app.marked.len()));
    }
    if app.grouping != super::triage::Grouping::None {
        title.push_str(&format!(" · {}", app.grouping.label()));
    }
    let block = pane(app, title, app.focus == Focus::Main);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if app.pending.is_empty() {
        f.render_widget(Paragraph::new(Span::styled("Nothing waits for you.", app.theme.get("dim"))), inner);
        return;
    }
    // The list above, the selected call in full below when there is room.
    let (list_area, preview_area) = if inner.height >= 12 {
        let [a, b] = Layout::vertical([Constraint::Percentage(55), Constraint::Min(5)]).areas(inner);
        (a, Some(b))
    } else {
        (inner, None)
    };
    let w = list_area.width as usize;
    let order = app.approvals_order();
    let sel = app.files.sel.min(order.len().saturating_sub(1));
    let mut lines: Vec<Line> = Vec::new();
    let mut group: Option<String> = None;
    let mut sel_line = 0;
    for (pos, &i) in order.iter().enumerate() {
        let p = &app.pending[i];
        let key = app.grouping.key(p);
        if !key.is_empty() && group.as_deref() != Some(key.as_str()) {
            let n = order.iter().filter(|&&j| app.grouping.key(&app.pending[j]) == key).count();
            lines.push(Line::styled(format!("{key} ({n})"), app.theme.get("accent")));
            group = Some(key);
        }
        let what = if p.ask {
            format!("ask  {}", p.args["question"].as_str().unwrap_or(""))
        } else {
            format!("{}  {}", p.tool, chat::gist(&p.args))
        };
        let mark = if app.marked.contains(&p.task_id) {
            "[x] "
        } else if p.ask {
            "    "
        } else {
            "[ ] "
        };
        let waited = ago(app.now_ms, p.since_ms);
        let left = format!("{mark}{:<12} {what}", fit(&p.agent_name, 12));
        let room = w.saturating_sub(waited.width() + 1);
        let l = Line::from(vec![
            Span::raw(format!("{:<room$}", fit(&left, room))),
            Span::styled(format!(" {waited}"), app.theme.get("waiting")),
        ]);
        if pos == sel {
            sel_line = lines.len();
        }
        lines.push(if pos == sel { l.style(app.theme.get("selection")) } else { l });
    }
    let h = list_area.height as usize;
    let top = (sel_line + 1).saturating_sub(h);
    f.render_widget(Paragraph::new(lines).scroll((top as u16, 0)), list_area);
    if let (Some(area), Some(p)) = (preview_area, app.selected_pending()) {
        let block = Block::default().borders(Borders::TOP).title(Span::styled(
            format!(" {} · {} ", if p.ask { "ask" } else { p.tool.as_str() }, p.agent_name),
            app.theme.get("dim"),
        ));
        let inner = block.inner(area);
        f.render_widget(block, area);
        let mut text: Vec<Line> = Vec::new();
        if let Some(r) = p.reason.as_deref().filter(|r| !r.is_empty()) {
            text.push(Line::from(vec![Span::styled("why  ", app.theme.get("dim")), Span::raw(r.to_string())]));
        }
        let args = serde_json::to_string_pretty(&p.args).unwrap_or_default();
        text.extend(args.lines().map(|l| Line::raw(l.to_string())));
        f.render_widget(Paragraph::new(text).wrap(Wrap { trim: false }), inner);
    }
}

fn draw_events(f: &mut Frame, app: &App, area: Rect) {
    let mode = if app.events_follow { "follow" } else { "paused" };
    let filter =
        if app.events_filter.is_empty() { String::new() } else { format!(" · filter: {}", app.events_filter) };
    let block = pane(app, format!("Events · {mode}{filter}"), app.focus == Focus::Events);
    let inner = block.inner(area);
    f.render_widget(block, area);
    let events = app.visible_events();
    let h = inner.height as usize;
    let len = events.len();
    // The selection stays on screen and the rest of the page is drawn
    // around it (`g` shows the first page whole, `G` the last).
    let sel = if app.events_follow { len.saturating_sub(1) } else { app.events_sel.min(len.saturating_sub(1)) };
    let mut start = app.events_top.get();
    if app.events_follow || sel >= start + h {
        start = (sel + 1).saturating_sub(h);
    } else if sel < start {
        start = sel;
    }
    start = start.min(len.saturating_sub(h));
    app.events_top.set(start);
    let end = (start + h).min(len);
    let w = inner.width as usize;
    let marked = app.focus == Focus::Events || !app.events_follow;
    let lines: Vec<Line> = events[start..end]
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let t = chrono::DateTime::from_timestamp_millis(e.timestamp)
                .map(|d| d.format("%H:%M:%S%.3f").to_string())
                .unwrap_or_default();
            let who = e
                .agent_id
                .as_ref()
                .and_then(|id| app.agents.iter().find(|a| &a.info.id == id))
                .map(|a| a.info.name.clone())
                .unwrap_or_else(|| "fleet".into());
            let payload = super::inbox::message_line(app, e).unwrap_or_else(|| e.payload.to_string());
            let text = format!("{t}  {:<20} {:<10} {payload}", e.event_type, fit(&who, 10));
            let style = if e.event_type.ends_with("failed") || e.event_type.ends_with("error") {
                app.theme.get("error")
            } else if e.event_type.starts_with("hil.") || e.event_type.starts_with("ask.") {
                app.theme.get("waiting")
            } else {
                app.theme.get("text")
            };
            let l = Line::styled(fit(&text, w), style);
            if marked && start + i == sel { l.style(app.theme.get("selection")) } else { l }
        })
        .collect();
    f.render_widget(Paragraph::new(lines), inner);
}

fn draw_footer(f: &mut Frame, app: &App, area: Rect) {
    let line = match (&app.overlay, &app.status) {
        (Overlay::CommandLine(t), _) => {
            let (a, b) = t.split();
            Line::from(vec![
                Span::styled(":", app.theme.get("accent")),
                Span::raw(a.to_string()),
                Span::raw("▏"),
                Span::raw(b.to_string()),
            ])
        }
        (_, Some(s)) => Line::styled(format!(" {s}"), app.theme.get("waiting")),
        _ => {
            let mode = if app.focus == Focus::Composer { " INSERT " } else { " NORMAL " };
            let mut spans = vec![Span::styled(mode, app.theme.get("selection")), Span::raw(" ")];
            for (i, (k, what)) in app.hints().into_iter().enumerate() {
                if i > 0 {
                    spans.push(Span::styled(" · ", app.theme.get("dim")));
                }
                spans.push(Span::styled(k, app.theme.get("accent")));
                spans.push(Span::raw(format!(" {what}")));
            }
            Line::from(spans)
        }
    };
    f.render_widget(Paragraph::new(line), area);
}

pub(super) fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width.saturating_sub(2));
    let h = h.min(area.height.saturating_sub(2));
    Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h }
}

fn draw_overlay(f: &mut Frame, app: &App, area: Rect) {
    match &app.overlay {
        Overlay::None | Overlay::CommandLine(_) => {}
        Overlay::Palette { query, sel } => {
            let r = centered(area, 70, 16);
            f.render_widget(Clear, r);
            let block = pane(app, "Commands".into(), true);
            let inner = block.inner(r);
            f.render_widget(block, r);
            let hits = palette_hits(&query.text, app.role);
            let (a, b) = query.split();
            let mut lines = vec![Line::from(vec![
                Span::styled("> ", app.theme.get("accent")),
                Span::raw(a.to_string()),
                Span::raw("▏"),
                Span::raw(b.to_string()),
            ])];
            let w = inner.width as usize;
            let sel = (*sel).min(hits.len().saturating_sub(1));
            for (i, c) in hits.iter().take(inner.height as usize - 1).enumerate() {
                let keys = app.keymap.keys_for(c.name).join(" ");
                // A marker as well as the colour: the row reads without it.
                let mark = if i == sel { ">" } else { " " };
                let left = format!("{mark}{:<16} {}", c.name, c.description);
                let room = w.saturating_sub(keys.width() + 1);
                let l = Line::from(vec![
                    Span::raw(format!("{:<room$}", fit(&left, room))),
                    Span::styled(format!(" {keys}"), app.theme.get("accent")),
                ]);
                lines.push(if i == sel { l.style(app.theme.get("selection")) } else { l });
            }
            f.render_widget(Paragraph::new(lines), inner);
        }
        Overlay::Help { scroll } => {
            let r = centered(area, 76, 30);
            f.render_widget(Clear, r);
            let lines = help_lines(app, r.width.saturating_sub(2) as usize);
            let h = r.height.saturating_sub(2) as usize;
            let top = (*scroll).min(lines.len().saturating_sub(h));
            app.help_view.set((lines.len(), h));
            let shown = format!("{}-{}/{}", top + 1, (top + h).min(lines.len()), lines.len());
            let block = pane(app, format!("Keys active now · j/k scroll · esc closes · {shown}"), true);
            let inner = block.inner(r);
            f.render_widget(block, r);
            f.render_widget(Paragraph::new(lines).scroll((top as u16, 0)), inner);
        }
        Overlay::Reject { text, targets } => {
            let r = centered(area, 70, 5);
            f.render_widget(Clear, r);
            let what = if targets.len() == 1 { "Reject".to_string() } else { format!("Reject {}", targets.len()) };
            let block = pane(app, format!("{what} · feedback the model will see (enter sends, esc cancels)"), true);
            let inner = block.inner(r);
            f.render_widget(block, r);
            let (a, b) = text.split();
            f.render_widget(Paragraph::new(format!("{a}▏{b}")).wrap(Wrap { trim: false }), inner);
        }
        Overlay::Event(e) => {
            let r = centered(area, 100, 30);
            f.render_widget(Clear, r);
            let block = pane(app, format!("{} · seq {} · {} (any key closes)", e.event_type, e.seq, e.source), true);
            let inner = block.inner(r);
            f.render_widget(block, r);
            let body = serde_json::to_string_pretty(&e.payload).unwrap_or_default();
            let lines: Vec<Line> =
                super::highlight::text("json", &body, inner.height as usize).into_iter().map(Line::from).collect();
            f.render_widget(Paragraph::new(lines), inner);
        }
        Overlay::ChannelToken { agent, kind, token, extra } => {
            let r = centered(area, 70, 7);
            f.render_widget(Clear, r);
            let name = app.agents.iter().find(|a| &a.info.id == agent).map(|a| a.info.name.clone()).unwrap_or_default();
            let who = extra["address"].as_str().map(|a| format!(" as {a}")).unwrap_or_default();
            let block = pane(app, format!("Connect {kind}{who} for {name} (enter · esc)"), true);
            let inner = block.inner(r);
            f.render_widget(block, r);
            let masked = "•".repeat(token.chars().count().min(48));
            let label = match kind.as_str() {
                "email" => "password: ",
                "slack" => "bot token and app token (xoxb-… xapp-…): ",
                _ => "bot token: ",
            };
            let lines = vec![
                Line::from(vec![Span::raw(label), Span::raw(masked), Span::raw("▏")]),
                Line::default(),
                Line::styled("sealed in the agent's credentials; the app does not keep it", app.theme.get("dim")),
            ];
            f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
        }
        Overlay::Unlock { agent, password } => {
            let r = centered(area, 70, 7);
            f.render_widget(Clear, r);
            let name = app.agents.iter().find(|a| &a.info.id == agent).map(|a| a.info.name.clone()).unwrap_or_default();
            let block = pane(app, format!("Unlock {name}'s credentials (enter · esc)"), true);
            let inner = block.inner(r);
            f.render_widget(block, r);
            let masked = "•".repeat(password.chars().count().min(48));
            let lines = vec![
                Line::from(vec![Span::raw("password: "), Span::raw(masked), Span::raw("▏")]),
                Line::default(),
                Line::styled("checked off the app's thread (scrypt, about a third of a second)", app.theme.get("dim")),
            ];
            f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
        }
        Overlay::Connect { provider, key } => {
            let r = centered(area, 70, 8);
            f.render_widget(Clear, r);
            let block = pane(app, "Connect a provider (tab: next provider · enter saves · esc)".into(), true);
            let inner = block.inner(r);
            f.render_widget(block, r);
            let mut choices = vec![Span::raw("provider: ")];
            for (i, p) in super::app::CONNECT.iter().enumerate() {
                let st = if i == *provider { app.theme.get("selection") } else { app.theme.get("dim") };
                choices.push(Span::styled(format!(" {p} "), st));
                choices.push(Span::raw(" "));
            }
            let chosen = super::app::CONNECT[*provider];
            let (label, shown, hint) = match chosen {
                "local" => (
                    "URL:      ",
                    key.clone(),
                    "an OpenAI-compatible base URL (llama.cpp, vLLM, LM Studio), then a key if it wants one",
                ),
                "ollama" => ("host:     ", key.clone(), "empty: 127.0.0.1:11434; no key"),
                _ => ("key:      ", "•".repeat(key.chars().count().min(48)), ""),
            };
            let lines = vec![
                Line::from(choices),
                Line::default(),
                Line::from(vec![Span::raw(label), Span::raw(shown), Span::raw("▏")]),
                Line::styled(hint.to_string(), app.theme.get("dim")),
                Line::styled(
                    format!("saved to {} (mode 0600)", crate::providers::accounts::settings_path().display()),
                    app.theme.get("dim"),
                ),
            ];
            f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
        }
        Overlay::Phrase { did, phrase } => super::forms::draw_phrase(f, app, did, phrase, area),
        Overlay::NewAgent(form) => super::forms::draw_new_agent(f, app, form, area),
        Overlay::Conflict { path, mine, theirs, .. } => {
            let r = centered(area, 90, 20);
            f.render_widget(Clear, r);
            let block =
                pane(app, format!("{path} changed while you edited: [m] keep mine · [t] keep the agent's"), true);
            let inner = block.inner(r);
            f.render_widget(block, r);
            let [a, b] = Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(inner);
            f.render_widget(
                Paragraph::new(mine.clone()).block(Block::default().borders(Borders::RIGHT).title("mine")),
                a,
            );
            f.render_widget(Paragraph::new(theirs.clone()).block(Block::default().title("the agent's")), b);
        }
    }
}

/// Everything help shows: the keys of the contexts active now, then the
/// fixed line-editing keys, one line each, cut to `width`.
pub fn help_lines(app: &App, width: usize) -> Vec<Line<'static>> {
    let head = |t: &str| Line::styled(t.to_string(), app.theme.get("dim").add_modifier(Modifier::BOLD));
    let row = |k: &str, desc: &str| {
        Line::from(vec![
            Span::styled(format!("  {k:<12}"), app.theme.get("accent")),
            Span::raw(fit(desc, width.saturating_sub(14))),
        ])
    };
    let mut lines = Vec::new();
    for ctx in app.contexts() {
        let Some(map) = app.keymap.maps.get(ctx) else { continue };
        lines.push(head(ctx));
        for (k, c) in map {
            lines.push(row(&k.to_string(), commands::find(c).map(|d| d.description).unwrap_or(c.as_str())));
        }
    }
    lines.push(head("typing (the composer, the palette, the : line, forms)"));
    for (k, d) in [
        ("ctrl-a home", "Go to the start of the line"),
        ("ctrl-e end", "Go to the end of the line"),
        ("ctrl-u", "Delete to the start of the line (clears it)"),
        ("ctrl-k", "Delete to the end of the line"),
        ("ctrl-w", "Delete the word before the cursor"),
        ("left right", "Move by a character (ctrl-b, ctrl-f too)"),
    ] {
        lines.push(row(k, d));
    }
    lines.push(head("slash commands (type them in the composer)"));
    let slash_row = |k: &str, desc: &str| {
        Line::from(vec![
            Span::styled(format!("  {k:<26}"), app.theme.get("accent")),
            Span::raw(fit(desc, width.saturating_sub(28))),
        ])
    };
    for (k, d) in crate::runtime::slash::COMMANDS {
        lines.push(slash_row(k, d));
    }
    lines.push(slash_row("/mcp /skills", "Open the MCP servers or the skills view"));
    for (name, desc) in app.skills.active() {
        lines.push(slash_row(&format!("/{name} [args]"), desc));
    }
    lines.push(head("this help"));
    lines.push(row("j k", "Scroll a line (arrows too)"));
    lines.push(row("pgdn pgup", "Scroll a page (space too); g, G: top, bottom"));
    lines.push(row("esc q", "Close"));
    lines
}

fn draw_first_run(f: &mut Frame, app: &App, area: Rect) {
    let block = pane(app, "Welcome".into(), true);
    let inner = block.inner(area);
    f.render_widget(block, area);
    let text = vec![
        Line::styled("No agents in the fleet folder yet.", app.theme.get("text").add_modifier(Modifier::BOLD)),
        Line::default(),
        Line::raw("Press n (or :new) to create one, or put .adf files in the fleet folder:"),
        Line::styled(format!("  {}", crate::paths::fleet_dir().display()), app.theme.get("accent")),
    ];
    f.render_widget(Paragraph::new(text).wrap(Wrap { trim: false }), inner);
}
