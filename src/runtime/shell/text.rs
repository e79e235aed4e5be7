//! The text commands of the shell, as pure functions over strings: `cat`
//! `head` `tail` `grep` `sed` `sort` `uniq` `wc` `cut` `tr` `rev` `tac`
//! `diff` `seq` `printf` `tee` `echo`. Files come through a `Vfs` (the
//! agent's own files); writes (`sed -i`, `tee`) come back as a list for the
//! shell to make through `fs_write`, so protections and events apply.
//! Regular expressions are the `regex` crate's; POSIX basic syntax (grep,
//! sed without `-E`) is translated to it, not approximated.

use std::collections::HashMap;
use std::fmt::Write as _;

use regex::{Regex, RegexBuilder};

use super::{MAX_GREP_HITS, Out, fail, ok};

/// The agent's files, as text.
pub(crate) trait Vfs {
    fn read(&mut self, path: &str) -> Result<String, String>;
    /// Paths under a prefix (`""` = all).
    fn list(&mut self, prefix: &str) -> Vec<String>;
}

/// A text command's outcome: output, files to write, and whether output
/// was capped for the model.
#[derive(Default)]
pub(crate) struct TextOut {
    pub out: Out,
    pub writes: Vec<(String, String, bool)>,
    pub truncated: bool,
}

impl From<Out> for TextOut {
    fn from(out: Out) -> Self {
        TextOut { out, ..Default::default() }
    }
}

/// Parsed options: short flags (combined `-rn`), values (`-n 5`, `-n5`,
/// `--lines=5`), positionals; `--` ends options, `-` is a positional.
#[derive(Debug, Default)]
pub(crate) struct Opts {
    pub flags: HashMap<String, Vec<String>>,
    pub pos: Vec<String>,
}

impl Opts {
    pub fn has(&self, f: &str) -> bool {
        self.flags.contains_key(f)
    }
    pub fn val(&self, f: &str) -> Option<&str> {
        self.flags.get(f).and_then(|v| v.last()).map(String::as_str)
    }
    pub fn vals(&self, f: &str) -> &[String] {
        self.flags.get(f).map(Vec::as_slice).unwrap_or(&[])
    }
}

/// `valued`: the short flags that take a value (e.g. "nemABC").
pub(crate) fn getopt(cmd: &str, args: &[String], valued: &str) -> Result<Opts, String> {
    let mut o = Opts::default();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if a == "--" {
            o.pos.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(long) = a.strip_prefix("--") {
            let (k, v) = match long.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (long.to_string(), None),
            };
            o.flags.entry(k).or_default().extend(v);
            continue;
        }
        if a.len() > 1 && a.starts_with('-') {
            let chars: Vec<char> = a[1..].chars().collect();
            let mut j = 0;
            while j < chars.len() {
                let c = chars[j];
                if valued.contains(c) {
                    let rest: String = chars[j + 1..].iter().collect();
                    let v = if !rest.is_empty() {
                        rest
                    } else if i < args.len() {
                        i += 1;
                        args[i - 1].clone()
                    } else {
                        return Err(format!("{cmd}: option -{c} needs a value"));
                    };
                    o.flags.entry(c.to_string()).or_default().push(v);
                    break;
                }
                o.flags.entry(c.to_string()).or_default();
                j += 1;
            }
            continue;
        }
        o.pos.push(a.clone());
    }
    Ok(o)
}

/// Lines of a text with their newline kept off; a trailing newline does
/// not make an empty last line.
fn lines(s: &str) -> Vec<&str> {
    s.lines().collect()
}

fn join(ls: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    let mut s = String::new();
    for l in ls {
        s.push_str(l.as_ref());
        s.push('\n');
    }
    s
}

/// Inputs of a command: the files named, or stdin.
fn inputs(cmd: &str, files: &[String], stdin: &str, fs: &mut dyn Vfs) -> Result<Vec<(String, String)>, Out> {
    if files.is_empty() {
        return Ok(vec![("-".into(), stdin.to_string())]);
    }
    let mut v = Vec::new();
    for f in files {
        if f == "-" {
            v.push(("-".into(), stdin.to_string()));
            continue;
        }
        match fs.read(f) {
            Ok(t) => v.push((f.clone(), t)),
            Err(e) => return Err(fail(1, format!("{cmd}: {e}"))),
        }
    }
    Ok(v)
}

/// POSIX basic regular expression → the regex crate's syntax.
pub(crate) fn bre_to_ere(p: &str) -> String {
    let mut out = String::with_capacity(p.len() + 8);
    let mut it = p.chars().peekable();
    while let Some(c) = it.next() {
        match c {
            '\\' => match it.next() {
                Some(n @ ('(' | ')' | '{' | '}' | '+' | '?' | '|')) => out.push(n),
                Some(n) => {
                    out.push('\\');
                    out.push(n);
                }
                None => out.push_str("\\\\"),
            },
            '(' | ')' | '{' | '}' | '+' | '?' | '|' => {
                out.push('\\');
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

fn build_regex(
    cmd: &str,
    pat: &str,
    ere: bool,
    fixed: bool,
    icase: bool,
    word: bool,
    line: bool,
) -> Result<Regex, Out> {
    let mut p = if fixed {
        regex::escape(pat)
    } else if ere {
        pat.to_string()
    } else {
        bre_to_ere(pat)
    };
    if word {
        p = format!(r"\b(?:{p})\b");
    }
    if line {
        p = format!("^(?:{p})$");
    }
    RegexBuilder::new(&p)
        .case_insensitive(icase)
        .size_limit(1 << 22)
        .build()
        .map_err(|e| fail(2, format!("{cmd}: bad pattern {pat:?}: {e}")))
}

/// Run a text command; `None` when `name` is not one.
pub(crate) fn run(name: &str, args: &[String], stdin: &str, fs: &mut dyn Vfs, full: bool) -> Option<TextOut> {
    let r = match name {
        "cat" => cat(args, stdin, fs),
        "head" | "tail" => head_tail(name, args, stdin, fs),
        "grep" => return Some(grep(args, stdin, fs, full)),
        "sed" => return Some(sed(args, stdin, fs)),
        "sort" => sort(args, stdin, fs),
        "uniq" => uniq(args, stdin, fs),
        "wc" => wc(args, stdin, fs),
        "cut" => cut(args, stdin, fs),
        "tr" => tr(args, stdin),
        "rev" => simple(name, args, stdin, fs, |t| join(lines(t).iter().map(|l| l.chars().rev().collect::<String>()))),
        "tac" => simple(name, args, stdin, fs, |t| join(lines(t).iter().rev())),
        "diff" => diff(args, fs),
        "seq" => seq(args),
        "printf" => printf(args),
        "echo" => echo(args),
        "tee" => return Some(tee(args, stdin)),
        _ => return None,
    };
    Some(r.into())
}

fn simple(name: &str, args: &[String], stdin: &str, fs: &mut dyn Vfs, f: impl Fn(&str) -> String) -> Out {
    match inputs(name, args, stdin, fs) {
        Ok(ins) => ok(ins.iter().map(|(_, t)| f(t)).collect::<String>()),
        Err(e) => e,
    }
}

fn echo(args: &[String]) -> Out {
    let mut newline = true;
    let mut escapes = false;
    let mut rest = args;
    while let Some(f) = rest.first() {
        match f.as_str() {
            "-n" => newline = false,
            "-e" => escapes = true,
            "-E" => escapes = false,
            "-ne" | "-en" => {
                newline = false;
                escapes = true;
            }
            _ => break,
        }
        rest = &rest[1..];
    }
    let mut s = rest.join(" ");
    if escapes {
        s = unescape(&s);
    }
    if newline {
        s.push('\n');
    }
    ok(s)
}

fn unescape(s: &str) -> String {
    backslashes(s, true)
}

/// C-style backslash escapes (`\n \t \r \0 \e \\`); an unknown escape
/// keeps its backslash (`echo -e`) or drops it (`$'…'`).
pub(crate) fn backslashes(s: &str, keep_unknown: bool) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some('0') => out.push('\0'),
            Some('e' | 'E') => out.push('\x1b'),
            Some(o) => {
                if keep_unknown {
                    out.push('\\');
                }
                out.push(o);
            }
            None => out.push('\\'),
        }
    }
    out
}

fn cat(args: &[String], stdin: &str, fs: &mut dyn Vfs) -> Out {
    let o = match getopt("cat", args, "") {
        Ok(o) => o,
        Err(e) => return fail(2, e),
    };
    let ins = match inputs("cat", &o.pos, stdin, fs) {
        Ok(i) => i,
        Err(e) => return e,
    };
    let all: String = ins.into_iter().map(|(_, t)| t).collect();
    if o.has("n") {
        let mut s = String::with_capacity(all.len() + 8 * 64);
        for (i, l) in all.lines().enumerate() {
            let _ = writeln!(s, "{:>6}\t{l}", i + 1);
        }
        return ok(s);
    }
    ok(all)
}

fn head_tail(name: &str, args: &[String], stdin: &str, fs: &mut dyn Vfs) -> Out {
    // `head -5` is `head -n 5`.
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            if a.len() > 1 && a.starts_with('-') && a[1..].chars().all(|c| c.is_ascii_digit()) {
                format!("-n{}", &a[1..])
            } else {
                a.clone()
            }
        })
        .collect();
    let o = match getopt(name, &args, "nc") {
        Ok(o) => o,
        Err(e) => return fail(2, e),
    };
    let spec = o.val("n").or(o.val("lines")).unwrap_or("10");
    let from_start = name == "tail" && spec.starts_with('+');
    let Ok(n) = spec.trim_start_matches('+').parse::<usize>() else {
        return fail(2, format!("{name}: invalid number of lines: {spec:?}"));
    };
    let ins = match inputs(name, &o.pos, stdin, fs) {
        Ok(i) => i,
        Err(e) => return e,
    };
    let many = ins.len() > 1;
    let mut s = String::new();
    for (i, (f, t)) in ins.iter().enumerate() {
        if many {
            let _ = writeln!(s, "{}==> {f} <==", if i > 0 { "\n" } else { "" });
        }
        if let Some(c) = o.val("c") {
            let Ok(c) = c.parse::<usize>() else { return fail(2, format!("{name}: invalid byte count")) };
            let b = t.as_bytes();
            let part = if name == "head" { &b[..c.min(b.len())] } else { &b[b.len().saturating_sub(c)..] };
            s.push_str(&String::from_utf8_lossy(part));
            continue;
        }
        let ls = lines(t);
        let part: &[&str] = if name == "head" {
            &ls[..n.min(ls.len())]
        } else if from_start {
            &ls[n.saturating_sub(1).min(ls.len())..]
        } else {
            &ls[ls.len().saturating_sub(n)..]
        };
        s.push_str(&join(part));
    }
    ok(s)
}

fn grep(args: &[String], stdin: &str, fs: &mut dyn Vfs, full: bool) -> TextOut {
    let o = match getopt("grep", args, "emABC") {
        Ok(o) => o,
        Err(e) => return fail(2, e).into(),
    };
    let mut pos = o.pos.clone();
    let pats: Vec<String> = if o.has("e") {
        o.vals("e").to_vec()
    } else if pos.is_empty() {
        return fail(2, "usage: grep [-ivnclrEFowxhq] [-e PATTERN] PATTERN [FILE…]").into();
    } else {
        vec![pos.remove(0)]
    };
    let pat = if pats.len() == 1 {
        pats[0].clone()
    } else {
        pats.iter().map(|p| format!("(?:{p})")).collect::<Vec<_>>().join("|")
    };
    let ere = o.has("E") || pats.len() > 1;
    let re = match build_regex("grep", &pat, ere, o.has("F"), o.has("i"), o.has("w"), o.has("x")) {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    let files: Vec<String> = if o.has("r") || o.has("R") {
        let roots = if pos.is_empty() { vec![String::new()] } else { pos.clone() };
        let mut all = Vec::new();
        for r in roots {
            let prefix = r.trim_start_matches("./").trim_start_matches('/').trim_end_matches('/').to_string();
            let prefix = if prefix == "." { String::new() } else { prefix };
            all.extend(fs.list(&prefix));
        }
        all
    } else {
        pos
    };
    let ins = match inputs("grep", &files, stdin, fs) {
        Ok(i) => i,
        Err(e) => return e.into(),
    };
    let show_name = (ins.len() > 1 || o.has("r")) && !o.has("h") || o.has("H");
    let limit = o.val("m").and_then(|m| m.parse::<usize>().ok());
    let mut s = String::new();
    let mut hits = 0usize;
    let mut truncated = false;
    'files: for (f, t) in &ins {
        let mut count = 0usize;
        for (i, l) in t.lines().enumerate() {
            let m = re.is_match(l);
            if m == o.has("v") {
                continue;
            }
            count += 1;
            hits += 1;
            if o.has("q") {
                return ok("").into();
            }
            if o.has("l") {
                let _ = writeln!(s, "{f}");
                continue 'files;
            }
            if !o.has("c") {
                if !full && hits > MAX_GREP_HITS {
                    truncated = true;
                    let _ = writeln!(s, "[truncated at {MAX_GREP_HITS} matches; narrow the pattern or add -m]");
                    break 'files;
                }
                let prefix = format!(
                    "{}{}",
                    if show_name { format!("{f}:") } else { String::new() },
                    if o.has("n") { format!("{}:", i + 1) } else { String::new() }
                );
                if o.has("o") && !o.has("v") {
                    for mm in re.find_iter(l) {
                        let _ = writeln!(s, "{prefix}{}", mm.as_str());
                    }
                } else {
                    let _ = writeln!(s, "{prefix}{l}");
                }
            }
            if limit.is_some_and(|m| count >= m) {
                break;
            }
        }
        if o.has("c") {
            if show_name {
                let _ = writeln!(s, "{f}:{count}");
            } else {
                let _ = writeln!(s, "{count}");
            }
        }
    }
    let code = if hits > 0 { 0 } else { 1 };
    TextOut { out: Out { code, stdout: s, stderr: String::new() }, writes: Vec::new(), truncated }
}

/// A sed address.
#[derive(Debug, Clone)]
enum Addr {
    Line(usize),
    Last,
    Re(Regex),
}

#[derive(Debug, Clone)]
enum SedCmd {
    Subst { re: Regex, rep: String, global: bool, nth: usize, print: bool },
    Delete,
    Print,
    Quit,
}

#[derive(Debug, Clone)]
struct SedOp {
    a1: Option<Addr>,
    a2: Option<Addr>,
    negate: bool,
    cmd: SedCmd,
}

fn sed_regex(p: &str, ere: bool, icase: bool) -> Result<Regex, String> {
    let p = if ere { p.to_string() } else { bre_to_ere(p) };
    RegexBuilder::new(&p)
        .case_insensitive(icase)
        .size_limit(1 << 22)
        .build()
        .map_err(|e| format!("sed: bad regex: {e}"))
}

/// Read up to an unescaped delimiter: (text, rest).
fn until_delim(s: &str, d: char) -> Result<(String, &str), String> {
    let mut out = String::new();
    let mut it = s.char_indices();
    while let Some((i, c)) = it.next() {
        if c == '\\' {
            if let Some((_, n)) = it.next() {
                if n == d {
                    out.push(n);
                } else {
                    out.push('\\');
                    out.push(n);
                }
            }
            continue;
        }
        if c == d {
            return Ok((out, &s[i + c.len_utf8()..]));
        }
        out.push(c);
    }
    Err(format!("sed: unterminated expression (missing `{d}`)"))
}

fn parse_addr(s: &str, ere: bool) -> Result<(Option<Addr>, &str), String> {
    let s = s.trim_start();
    if let Some(rest) = s.strip_prefix('$') {
        return Ok((Some(Addr::Last), rest));
    }
    if let Some(rest) = s.strip_prefix('/') {
        let (re, rest) = until_delim(rest, '/')?;
        return Ok((Some(Addr::Re(sed_regex(&re, ere, false)?)), rest));
    }
    let n: String = s.chars().take_while(char::is_ascii_digit).collect();
    if n.is_empty() {
        return Ok((None, s));
    }
    let line = n.parse().map_err(|_| "sed: bad line number".to_string())?;
    Ok((Some(Addr::Line(line)), &s[n.len()..]))
}

fn sed_script(src: &str, ere: bool) -> Result<Vec<SedOp>, String> {
    let mut ops = Vec::new();
    let mut s = src;
    loop {
        s = s.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
        if s.is_empty() {
            break;
        }
        let (a1, rest) = parse_addr(s, ere)?;
        s = rest;
        let mut a2 = None;
        if a1.is_some()
            && let Some(rest) = s.strip_prefix(',')
        {
            let (a, rest) = parse_addr(rest, ere)?;
            a2 = Some(a.ok_or("sed: a range needs a second address")?);
            s = rest;
        }
        s = s.trim_start();
        let negate = s.starts_with('!');
        if negate {
            s = &s[1..];
        }
        let mut chars = s.chars();
        let c = chars.next().ok_or("sed: missing command")?;
        s = chars.as_str();
        let cmd = match c {
            'd' => SedCmd::Delete,
            'p' => SedCmd::Print,
            'q' => SedCmd::Quit,
            's' => {
                let mut it = s.chars();
                let d = it.next().ok_or("sed: unterminated `s' command")?;
                let (pat, rest) = until_delim(it.as_str(), d)?;
                let (rep, rest) = until_delim(rest, d)?;
                let flags: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
                s = &rest[flags.len()..];
                let icase = flags.contains('i') || flags.contains('I');
                let nth: usize = flags.chars().filter(char::is_ascii_digit).collect::<String>().parse().unwrap_or(0);
                SedCmd::Subst {
                    re: sed_regex(&pat, ere, icase)?,
                    rep: sed_replacement(&rep),
                    global: flags.contains('g'),
                    nth,
                    print: flags.contains('p'),
                }
            }
            other => return Err(format!("sed: unknown command `{other}` (this sed knows s, d, p, q)")),
        };
        ops.push(SedOp { a1, a2, negate, cmd });
    }
    Ok(ops)
}

/// sed's `&` and `\1` → the regex crate's `${0}` and `${1}`.
fn sed_replacement(rep: &str) -> String {
    let mut out = String::new();
    let mut it = rep.chars();
    while let Some(c) = it.next() {
        match c {
            '&' => out.push_str("${0}"),
            '$' => out.push_str("$$"),
            '\\' => match it.next() {
                Some(d) if d.is_ascii_digit() => {
                    let _ = write!(out, "${{{d}}}");
                }
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('&') => out.push('&'),
                Some('$') => out.push_str("$$"),
                Some(o) => out.push(o),
                None => out.push('\\'),
            },
            _ => out.push(c),
        }
    }
    out
}

fn sed_apply(ops: &[SedOp], text: &str, quiet: bool) -> String {
    let ls = lines(text);
    let last = ls.len();
    let mut active = vec![false; ops.len()];
    let mut out = String::with_capacity(text.len());
    'lines: for (i, l) in ls.iter().enumerate() {
        let n = i + 1;
        let mut line = l.to_string();
        let hit = |a: &Addr, line: &str| match a {
            Addr::Line(k) => *k == n,
            Addr::Last => n == last,
            Addr::Re(r) => r.is_match(line),
        };
        for (k, op) in ops.iter().enumerate() {
            let mut sel = match (&op.a1, &op.a2) {
                (None, _) => true,
                (Some(a), None) => hit(a, &line),
                (Some(a), Some(b)) => {
                    if active[k] {
                        let end = match b {
                            Addr::Line(m) => n >= *m,
                            other => hit(other, &line),
                        };
                        if end {
                            active[k] = false;
                        }
                        true
                    } else if hit(a, &line) {
                        let ends_now = match b {
                            Addr::Line(m) => *m <= n,
                            _ => false,
                        };
                        active[k] = !ends_now;
                        true
                    } else {
                        false
                    }
                }
            };
            if op.negate {
                sel = !sel;
            }
            if !sel {
                continue;
            }
            match &op.cmd {
                SedCmd::Delete => continue 'lines,
                SedCmd::Print => {
                    out.push_str(&line);
                    out.push('\n');
                }
                SedCmd::Quit => {
                    if !quiet {
                        out.push_str(&line);
                        out.push('\n');
                    }
                    return out;
                }
                SedCmd::Subst { re, rep, global, nth, print } => {
                    let new = if *global {
                        re.replace_all(&line, rep.as_str()).into_owned()
                    } else if *nth > 1 {
                        let mut count = 0;
                        re.replace_all(&line, |c: &regex::Captures| {
                            count += 1;
                            let mut dst = String::new();
                            if count == *nth {
                                c.expand(rep, &mut dst);
                            } else {
                                dst.push_str(c.get(0).map(|m| m.as_str()).unwrap_or(""));
                            }
                            dst
                        })
                        .into_owned()
                    } else {
                        re.replace(&line, rep.as_str()).into_owned()
                    };
                    let changed = new != line;
                    line = new;
                    if changed && *print {
                        out.push_str(&line);
                        out.push('\n');
                    }
                }
            }
        }
        if !quiet {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

fn sed(args: &[String], stdin: &str, fs: &mut dyn Vfs) -> TextOut {
    let o = match getopt("sed", args, "e") {
        Ok(o) => o,
        Err(e) => return fail(2, e).into(),
    };
    let mut pos = o.pos.clone();
    let script = if o.has("e") {
        o.vals("e").join("\n")
    } else if pos.is_empty() {
        return fail(2, "usage: sed [-n] [-E] [-i] SCRIPT [FILE…]").into();
    } else {
        pos.remove(0)
    };
    let ere = o.has("E") || o.has("r");
    let ops = match sed_script(&script, ere) {
        Ok(ops) => ops,
        Err(e) => return fail(1, e).into(),
    };
    let quiet = o.has("n");
    if o.has("i") {
        if pos.is_empty() {
            return fail(1, "sed: -i needs a file").into();
        }
        let mut writes = Vec::new();
        for f in &pos {
            match fs.read(f) {
                Ok(t) => writes.push((f.clone(), sed_apply(&ops, &t, quiet), false)),
                Err(e) => return fail(1, format!("sed: {e}")).into(),
            }
        }
        return TextOut { out: ok(""), writes, truncated: false };
    }
    match inputs("sed", &pos, stdin, fs) {
        Ok(ins) => ok(ins.iter().map(|(_, t)| sed_apply(&ops, t, quiet)).collect::<String>()).into(),
        Err(e) => e.into(),
    }
}

/// The sort key of a line: field `k` (1-based) split by `sep` or blanks.
fn key(l: &str, k: Option<usize>, sep: Option<char>) -> &str {
    let Some(k) = k else { return l };
    let mut fields: Box<dyn Iterator<Item = &str>> = match sep {
        Some(c) => Box::new(l.split(c)),
        None => Box::new(l.split_whitespace()),
    };
    fields.nth(k.saturating_sub(1)).unwrap_or("")
}

fn num_prefix(s: &str) -> f64 {
    let t = s.trim_start();
    let end = t
        .char_indices()
        .take_while(|(i, c)| c.is_ascii_digit() || *c == '.' || (*i == 0 && (*c == '-' || *c == '+')))
        .map(|(i, c)| i + c.len_utf8())
        .last()
        .unwrap_or(0);
    t[..end].parse().unwrap_or(0.0)
}

fn sort(args: &[String], stdin: &str, fs: &mut dyn Vfs) -> Out {
    let o = match getopt("sort", args, "kto") {
        Ok(o) => o,
        Err(e) => return fail(2, e),
    };
    let ins = match inputs("sort", &o.pos, stdin, fs) {
        Ok(i) => i,
        Err(e) => return e,
    };
    let all: String =
        ins.into_iter().map(|(_, t)| if t.ends_with('\n') || t.is_empty() { t } else { t + "\n" }).collect();
    let mut ls = lines(&all);
    let k = o.val("k").and_then(|k| k.split([',', '.']).next().and_then(|n| n.parse().ok()));
    let sep = o.val("t").and_then(|t| t.chars().next());
    let (numeric, fold, rev) = (o.has("n") || o.has("g"), o.has("f"), o.has("r"));
    ls.sort_by(|a, b| {
        let (ka, kb) = (key(a, k, sep), key(b, k, sep));
        let ord = if numeric {
            num_prefix(ka).partial_cmp(&num_prefix(kb)).unwrap_or(std::cmp::Ordering::Equal)
        } else if fold {
            ka.to_lowercase().cmp(&kb.to_lowercase())
        } else {
            ka.cmp(kb)
        };
        if rev { ord.reverse() } else { ord }
    });
    if o.has("u") {
        ls.dedup_by(|a, b| key(a, k, sep) == key(b, k, sep));
    }
    ok(join(ls))
}

fn uniq(args: &[String], stdin: &str, fs: &mut dyn Vfs) -> Out {
    let o = match getopt("uniq", args, "") {
        Ok(o) => o,
        Err(e) => return fail(2, e),
    };
    let text = match o.pos.first() {
        Some(f) => match fs.read(f) {
            Ok(t) => t,
            Err(e) => return fail(1, format!("uniq: {e}")),
        },
        None => stdin.to_string(),
    };
    let icase = o.has("i");
    let mut groups: Vec<(&str, usize)> = Vec::new();
    for l in text.lines() {
        match groups.last_mut() {
            Some((g, n)) if if icase { g.eq_ignore_ascii_case(l) } else { *g == l } => *n += 1,
            _ => groups.push((l, 1)),
        }
    }
    let mut s = String::new();
    for (l, n) in groups {
        if (o.has("d") && n < 2) || (o.has("u") && n > 1) {
            continue;
        }
        if o.has("c") {
            let _ = writeln!(s, "{n:>7} {l}");
        } else {
            let _ = writeln!(s, "{l}");
        }
    }
    ok(s)
}

fn wc(args: &[String], stdin: &str, fs: &mut dyn Vfs) -> Out {
    let o = match getopt("wc", args, "") {
        Ok(o) => o,
        Err(e) => return fail(2, e),
    };
    let ins = match inputs("wc", &o.pos, stdin, fs) {
        Ok(i) => i,
        Err(e) => return e,
    };
    let any = o.has("l") || o.has("w") || o.has("c") || o.has("m");
    let count = |t: &str| {
        [
            (o.has("l") || !any).then(|| t.bytes().filter(|&b| b == b'\n').count()),
            (o.has("w") || !any).then(|| t.split_whitespace().count()),
            o.has("m").then(|| t.chars().count()),
            (o.has("c") || !any).then_some(t.len()),
        ]
    };
    let fmt = |c: [Option<usize>; 4], name: &str| {
        let nums: Vec<String> = c
            .iter()
            .flatten()
            .map(|n| if any && c.iter().flatten().count() == 1 { n.to_string() } else { format!("{n:>7}") })
            .collect();
        if name == "-" { format!("{}\n", nums.join(" ")) } else { format!("{} {name}\n", nums.join(" ")) }
    };
    let mut s = String::new();
    let mut total = [Some(0usize), Some(0), Some(0), Some(0)];
    for (f, t) in &ins {
        let c = count(t);
        for (tot, x) in total.iter_mut().zip(c.iter()) {
            *tot = tot.zip(*x).map(|(a, b)| a + b);
        }
        s.push_str(&fmt(c, f));
    }
    if ins.len() > 1 {
        let mask = count("");
        let t: [Option<usize>; 4] = std::array::from_fn(|i| mask[i].and(total[i]));
        s.push_str(&fmt(t, "total"));
    }
    ok(s)
}

/// `1,3-5,7-` → a membership test (1-based).
fn ranges(spec: &str) -> Result<Vec<(usize, usize)>, String> {
    spec.split(',')
        .map(|part| {
            let bad = || format!("cut: invalid list {spec:?}");
            match part.split_once('-') {
                Some((a, b)) => {
                    let a = if a.is_empty() { 1 } else { a.parse().map_err(|_| bad())? };
                    let b = if b.is_empty() { usize::MAX } else { b.parse().map_err(|_| bad())? };
                    Ok((a, b))
                }
                None => {
                    let n = part.parse().map_err(|_| bad())?;
                    Ok((n, n))
                }
            }
        })
        .collect()
}

fn cut(args: &[String], stdin: &str, fs: &mut dyn Vfs) -> Out {
    let o = match getopt("cut", args, "dfc") {
        Ok(o) => o,
        Err(e) => return fail(2, e),
    };
    let (spec, chars) = match (o.val("f"), o.val("c")) {
        (Some(f), _) => (f, false),
        (None, Some(c)) => (c, true),
        _ => return fail(2, "cut: say which fields (-f LIST) or characters (-c LIST)"),
    };
    let rs = match ranges(spec) {
        Ok(r) => r,
        Err(e) => return fail(2, e),
    };
    let inside = |i: usize| rs.iter().any(|(a, b)| i >= *a && i <= *b);
    let d = o.val("d").and_then(|d| d.chars().next()).unwrap_or('\t');
    let ins = match inputs("cut", &o.pos, stdin, fs) {
        Ok(i) => i,
        Err(e) => return e,
    };
    let mut s = String::new();
    for (_, t) in ins {
        for l in t.lines() {
            if chars {
                s.extend(l.chars().enumerate().filter(|(i, _)| inside(i + 1)).map(|(_, c)| c));
            } else if !l.contains(d) {
                if o.has("s") {
                    continue;
                }
                s.push_str(l);
            } else {
                let parts: Vec<&str> = l.split(d).enumerate().filter(|(i, _)| inside(i + 1)).map(|(_, p)| p).collect();
                s.push_str(&parts.join(&d.to_string()));
            }
            s.push('\n');
        }
    }
    ok(s)
}

/// A `tr` set: ranges, classes and escapes expanded.
fn tr_set(s: &str) -> Vec<char> {
    let s = s
        .replace("[:upper:]", "A-Z")
        .replace("[:lower:]", "a-z")
        .replace("[:digit:]", "0-9")
        .replace("[:alpha:]", "a-zA-Z")
        .replace("[:alnum:]", "a-zA-Z0-9")
        .replace("[:space:]", " \t\n\r")
        .replace("[:punct:]", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~");
    let raw: Vec<char> = unescape(&s).chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        if i + 2 < raw.len() && raw[i + 1] == '-' && raw[i] <= raw[i + 2] {
            out.extend(raw[i]..=raw[i + 2]);
            i += 3;
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    out
}

fn tr(args: &[String], stdin: &str) -> Out {
    let o = match getopt("tr", args, "") {
        Ok(o) => o,
        Err(e) => return fail(2, e),
    };
    let Some(a) = o.pos.first() else { return fail(2, "usage: tr [-d] [-s] SET1 [SET2]") };
    let set1 = tr_set(a);
    let mut s = String::with_capacity(stdin.len());
    if o.has("d") {
        s.extend(stdin.chars().filter(|c| !set1.contains(c)));
        return ok(s);
    }
    let set2 = o.pos.get(1).map(|b| tr_set(b)).unwrap_or_default();
    let map: HashMap<char, char> = if set2.is_empty() {
        HashMap::new()
    } else {
        set1.iter().enumerate().map(|(i, c)| (*c, *set2.get(i).or(set2.last()).unwrap_or(c))).collect()
    };
    let squeeze: &[char] = if set2.is_empty() { &set1 } else { &set2 };
    let mut last: Option<char> = None;
    for c in stdin.chars() {
        let c = *map.get(&c).unwrap_or(&c);
        if o.has("s") && last == Some(c) && squeeze.contains(&c) {
            continue;
        }
        s.push(c);
        last = Some(c);
    }
    ok(s)
}

fn diff(args: &[String], fs: &mut dyn Vfs) -> Out {
    let o = match getopt("diff", args, "U") {
        Ok(o) => o,
        Err(e) => return fail(2, e),
    };
    let [a, b] = o.pos.as_slice() else { return fail(2, "usage: diff [-u] FILE1 FILE2") };
    let (ta, tb) = match (fs.read(a), fs.read(b)) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => return fail(2, format!("diff: {e}")),
    };
    if ta == tb {
        return ok("");
    }
    let ctx = o.val("U").and_then(|n| n.parse().ok()).unwrap_or(3);
    let d = similar::TextDiff::from_lines(&ta, &tb);
    let s = d.unified_diff().context_radius(ctx).header(a, b).to_string();
    Out { code: 1, stdout: s, stderr: String::new() }
}

fn seq(args: &[String]) -> Out {
    let nums: Result<Vec<f64>, _> = args.iter().map(|a| a.parse::<f64>()).collect();
    let Ok(nums) = nums else { return fail(1, "seq: arguments must be numbers") };
    let (first, step, last) = match nums.as_slice() {
        [l] => (1.0, 1.0, *l),
        [f, l] => (*f, 1.0, *l),
        [f, s, l] => (*f, *s, *l),
        _ => return fail(1, "usage: seq [FIRST [STEP]] LAST"),
    };
    if step == 0.0 {
        return fail(1, "seq: the step cannot be zero");
    }
    let int = [first, step, last].iter().all(|x| x.fract() == 0.0);
    let mut s = String::new();
    let mut x = first;
    let mut n = 0;
    while (step > 0.0 && x <= last) || (step < 0.0 && x >= last) {
        if int {
            let _ = writeln!(s, "{}", x as i64);
        } else {
            let _ = writeln!(s, "{x}");
        }
        x += step;
        n += 1;
        if n > 1_000_000 {
            return fail(1, "seq: more than a million numbers");
        }
    }
    ok(s)
}

fn printf(args: &[String]) -> Out {
    let Some(fmt) = args.first() else { return fail(2, "usage: printf FORMAT [ARG…]") };
    let fmt = unescape(fmt);
    let mut rest = args[1..].iter();
    let mut s = String::new();
    loop {
        let mut used = false;
        let mut it = fmt.chars().peekable();
        while let Some(c) = it.next() {
            if c != '%' {
                s.push(c);
                continue;
            }
            let mut spec = String::new();
            while let Some(&n) = it.peek() {
                if n.is_ascii_digit() || n == '.' || n == '-' {
                    spec.push(n);
                    it.next();
                } else {
                    break;
                }
            }
            let conv = it.next().unwrap_or('%');
            if conv == '%' {
                s.push('%');
                continue;
            }
            used = true;
            let arg = rest.next().map(String::as_str).unwrap_or("");
            let (left, width, prec) = {
                let left = spec.starts_with('-');
                let spec = spec.trim_start_matches('-');
                let (w, p) = match spec.split_once('.') {
                    Some((w, p)) => (w.parse().unwrap_or(0), p.parse().ok()),
                    None => (spec.parse().unwrap_or(0), None),
                };
                (left, w, p)
            };
            let body = match conv {
                'd' | 'i' => num_prefix(arg).trunc().to_string(),
                'f' => format!("{:.*}", prec.unwrap_or(6), num_prefix(arg)),
                's' => match prec {
                    Some(p) => arg.chars().take(p).collect(),
                    None => arg.to_string(),
                },
                'x' => format!("{:x}", num_prefix(arg) as i64),
                'c' => arg.chars().next().map(String::from).unwrap_or_default(),
                other => format!("%{spec}{other}"),
            };
            if left {
                let _ = write!(s, "{body:<width$}");
            } else {
                let _ = write!(s, "{body:>width$}");
            }
        }
        if !used || rest.len() == 0 {
            break;
        }
    }
    ok(s)
}

fn tee(args: &[String], stdin: &str) -> TextOut {
    let o = match getopt("tee", args, "") {
        Ok(o) => o,
        Err(e) => return fail(2, e).into(),
    };
    let writes = o.pos.iter().map(|f| (f.clone(), stdin.to_string(), o.has("a"))).collect();
    TextOut { out: ok(stdin), writes, truncated: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mem(HashMap<String, String>);
    impl Vfs for Mem {
        fn read(&mut self, path: &str) -> Result<String, String> {
            self.0.get(path).cloned().ok_or_else(|| format!("{path}: No such file"))
        }
        fn list(&mut self, prefix: &str) -> Vec<String> {
            let mut v: Vec<String> = self.0.keys().filter(|k| k.starts_with(prefix)).cloned().collect();
            v.sort();
            v
        }
    }

    fn sh(cmd: &str, args: &[&str], stdin: &str) -> TextOut {
        let mut fs = Mem(HashMap::from([
            ("a.txt".to_string(), "one\ntwo\nthree\ntwo\n".to_string()),
            ("b.txt".to_string(), "one\n2\nthree\n".to_string()),
            ("dir/c.md".to_string(), "# title\ntodo: x\n".to_string()),
        ]));
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        run(cmd, &args, stdin, &mut fs, false).expect("a text command")
    }

    fn out(cmd: &str, args: &[&str], stdin: &str) -> String {
        sh(cmd, args, stdin).out.stdout
    }

    #[test]
    fn grep_family() {
        assert_eq!(out("grep", &["-n", "two", "a.txt"], ""), "2:two\n4:two\n");
        assert_eq!(out("grep", &["-c", "two", "a.txt"], ""), "2\n");
        assert_eq!(out("grep", &["-v", "t", "a.txt"], ""), "one\n");
        assert_eq!(out("grep", &["-i", "ONE"], "One\nx\n"), "One\n");
        assert_eq!(out("grep", &["-E", "^(one|three)$", "a.txt"], ""), "one\nthree\n");
        assert_eq!(out("grep", &["t\\(w\\|h\\)", "a.txt"], ""), "two\nthree\ntwo\n", "basic syntax groups");
        assert_eq!(out("grep", &["-F", "a.b"], "a.b\naxb\n"), "a.b\n");
        assert_eq!(out("grep", &["-rl", "todo"], ""), "dir/c.md\n");
        assert_eq!(out("grep", &["-o", "[0-9]+", "-E"], "a12b3\n"), "12\n3\n");
        assert_eq!(sh("grep", &["zzz", "a.txt"], "").out.code, 1);
        assert_eq!(sh("grep", &["x", "nope.txt"], "").out.code, 1);
        let many: String = (0..500).map(|i| format!("hit {i}\n")).collect();
        let capped = sh("grep", &["hit"], &many);
        assert!(capped.truncated);
        assert_eq!(capped.out.stdout.lines().count(), MAX_GREP_HITS + 1);
    }

    #[test]
    fn sed_family() {
        assert_eq!(out("sed", &["s/two/2/"], "two two\n"), "2 two\n");
        assert_eq!(out("sed", &["s/two/2/g"], "two two\n"), "2 2\n");
        assert_eq!(out("sed", &["s/t\\(w\\)o/[\\1&]/"], "two\n"), "[wtwo]\n");
        assert_eq!(out("sed", &["-E", "s/(o+)/<\\1>/2"], "foo boo\n"), "foo b<oo>\n");
        assert_eq!(out("sed", &["-n", "2,3p", "a.txt"], ""), "two\nthree\n");
        assert_eq!(out("sed", &["/two/d", "a.txt"], ""), "one\nthree\n");
        assert_eq!(out("sed", &["$d", "a.txt"], ""), "one\ntwo\nthree\n");
        assert_eq!(out("sed", &["2q", "a.txt"], ""), "one\ntwo\n");
        assert_eq!(out("sed", &["-e", "s/o/0/", "-e", "s/e/3/"], "one\n"), "0n3\n");
        assert_eq!(out("sed", &["s|/|_|g"], "a/b/c\n"), "a_b_c\n");
        let w = sh("sed", &["-i", "s/one/ONE/", "a.txt"], "");
        assert_eq!(w.writes, vec![("a.txt".to_string(), "ONE\ntwo\nthree\ntwo\n".to_string(), false)]);
        assert!(sh("sed", &["k"], "").out.stderr.contains("unknown command"));
    }

    #[test]
    fn sort_uniq_wc_cut_tr() {
        assert_eq!(out("sort", &["a.txt"], ""), "one\nthree\ntwo\ntwo\n");
        assert_eq!(out("sort", &["-u", "-r", "a.txt"], ""), "two\nthree\none\n");
        assert_eq!(out("sort", &["-n"], "10\n9\n-1\n"), "-1\n9\n10\n");
        assert_eq!(out("sort", &["-t", ",", "-k", "2", "-n"], "a,3\nb,1\nc,2\n"), "b,1\nc,2\na,3\n");
        assert_eq!(out("uniq", &["-c"], "a\na\nb\n"), "      2 a\n      1 b\n");
        assert_eq!(out("wc", &["-l", "a.txt"], ""), "4 a.txt\n");
        assert_eq!(out("wc", &["-l"], "x\ny\n"), "2\n");
        assert_eq!(out("wc", &[], "a b\n"), "      1       2       4\n");
        assert!(out("wc", &["-l", "a.txt", "b.txt"], "").ends_with("7 total\n"));
        assert_eq!(out("cut", &["-d", ",", "-f", "1,3"], "a,b,c\n"), "a,c\n");
        assert_eq!(out("cut", &["-c", "2-3"], "hello\n"), "el\n");
        assert_eq!(out("tr", &["a-z", "A-Z"], "hi\n"), "HI\n");
        assert_eq!(out("tr", &["-d", "[:digit:]"], "a1b2\n"), "ab\n");
        assert_eq!(out("tr", &["-s", " "], "a   b\n"), "a b\n");
    }

    #[test]
    fn head_tail_rev_tac_diff_seq_printf_echo() {
        assert_eq!(out("head", &["-n", "2", "a.txt"], ""), "one\ntwo\n");
        assert_eq!(out("head", &["-1", "a.txt"], ""), "one\n");
        assert_eq!(out("tail", &["-n", "1", "a.txt"], ""), "two\n");
        assert_eq!(out("tail", &["-n", "+3", "a.txt"], ""), "three\ntwo\n");
        assert_eq!(out("rev", &[], "abc\n"), "cba\n");
        assert_eq!(out("tac", &[], "1\n2\n"), "2\n1\n");
        let d = sh("diff", &["a.txt", "b.txt"], "");
        assert_eq!(d.out.code, 1);
        assert!(d.out.stdout.contains("--- a.txt") && d.out.stdout.contains("-two") && d.out.stdout.contains("+2"));
        assert_eq!(sh("diff", &["a.txt", "a.txt"], "").out.code, 0);
        assert_eq!(out("seq", &["3"], ""), "1\n2\n3\n");
        assert_eq!(out("seq", &["5", "-2", "1"], ""), "5\n3\n1\n");
        assert_eq!(out("printf", &["%s=%d\\n", "a", "1", "b", "2"], ""), "a=1\nb=2\n");
        assert_eq!(out("printf", &["%5.2f|%-3s|", "3.14159", "x"], ""), " 3.14|x  |");
        assert_eq!(out("echo", &["-n", "a", "b"], ""), "a b");
        assert_eq!(out("echo", &["-e", "a\\tb"], ""), "a\tb\n");
        assert_eq!(out("cat", &["-n", "b.txt"], ""), "     1\tone\n     2\t2\n     3\tthree\n");
    }

    #[test]
    fn getopt_forms() {
        let a: Vec<String> =
            ["-rn", "-m5", "-e", "x", "--color=never", "--", "-v"].iter().map(|s| s.to_string()).collect();
        let o = getopt("grep", &a, "me").unwrap();
        assert!(o.has("r") && o.has("n"));
        assert_eq!(o.val("m"), Some("5"));
        assert_eq!(o.val("e"), Some("x"));
        assert_eq!(o.val("color"), Some("never"));
        assert_eq!(o.pos, vec!["-v"]);
        assert!(getopt("head", &["-n".to_string()], "n").is_err());
    }
}
