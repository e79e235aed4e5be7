//! From text to the shell's own small plan, through a real bash grammar
//! (brush's parser): and/or lists, pipelines, simple commands with their
//! assignments and redirects, heredocs. Words stay unexpanded here: `$?`,
//! `$(…)` and globs take their values when the command runs. What the
//! virtual shell does not run (if/for/while/case, subshells, `{ }` groups,
//! functions, `[[ ]]`, process substitution) is refused at parse time with
//! a message naming it, never guessed at.

use brush_parser::ast;

/// How a pipeline joins the one before it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Join {
    Seq,
    And,
    Or,
}

/// One redirect, words unexpanded.
#[derive(Debug, Clone, PartialEq)]
pub enum Redir {
    /// `< file`
    In(String),
    /// `> file`, `>> file`, `2> file` (fd 1 or 2).
    Out {
        fd: u32,
        target: String,
        append: bool,
    },
    /// `&> file`, `&>> file`.
    Both {
        target: String,
        append: bool,
    },
    /// `2>&1` (from 2, to 1) or `>&2` (from 1, to 2).
    Dup {
        from: u32,
        to: u32,
    },
    /// A heredoc body (expand = the delimiter was unquoted) or `<<< word`.
    Here {
        body: String,
        expand: bool,
    },
    HereString(String),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cmd {
    /// `NAME=value` words before the command.
    pub assigns: Vec<(String, String)>,
    pub words: Vec<String>,
    pub redirects: Vec<Redir>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pipeline {
    pub bang: bool,
    pub cmds: Vec<Cmd>,
}

/// A script: pipelines with their joins, run left to right with bash's
/// and/or precedence (each `;`/newline item is its own and/or list).
pub type Script = Vec<(Join, Pipeline)>;

fn options() -> brush_parser::ParserOptions {
    brush_parser::ParserOptions { enable_extended_globbing: false, ..Default::default() }
}

/// The options used to split words into pieces at run time.
pub fn word_options() -> brush_parser::ParserOptions {
    options()
}

/// The longest script parsed (1 MiB).
pub const MAX_SCRIPT: usize = 1 << 20;
/// How deep `(` and `{` may nest.
pub const MAX_NESTING: usize = 8;
/// `(`, `{`, `[` and backquotes a script may hold.
pub const MAX_OPENERS: usize = 512;

/// Parse a script. A trailing `&` (background) runs in sequence.
pub fn parse(src: &str) -> Result<Script, String> {
    // The grammar's parser recurses per nesting level: bound the input
    // before it sees it, so no script can exhaust the stack.
    if src.len() > MAX_SCRIPT {
        return Err(format!("the script is {} bytes; the limit is {MAX_SCRIPT}", src.len()));
    }
    let openers = src.bytes().filter(|b| matches!(b, b'(' | b'{' | b'`' | b'[')).count();
    if openers > MAX_OPENERS {
        return Err(format!("the script opens {openers} groups or substitutions; the limit is {MAX_OPENERS}"));
    }
    // brush's parser unwraps the number of an `N>` redirect: a number that
    // does not fit a file descriptor is refused here instead.
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i < b.len() && matches!(b[i], b'<' | b'>') && src[start..i].parse::<i32>().is_err() {
                return Err(format!("file descriptor {} is too large", &src[start..i]));
            }
            continue;
        }
        i += 1;
    }
    // brush's tokenizer loops, allocating without bound, on a here-document
    // operator with no delimiter word at the end of a substitution
    // (`$(<<  `, `$(<<  \`: fuzz finds kept in the corpus). Bash refuses
    // such an operator anyway; refuse it first. Quotes are not tracked
    // here, so no quoting can hide one (a quoted `<<` followed by nothing
    // but blanks to the end of its line is refused too, and rare).
    // The check runs on the script as the grammar gets it: ending in a
    // newline (what the grammar expects; it changes no meaning), so a
    // trailing `\` is a line continuation there too.
    let terminated;
    let src = if src.ends_with('\n') {
        src
    } else {
        terminated = format!("{src}\n");
        terminated.as_str()
    };
    // The tokenizer reads a NUL as the end of input: a script holds none.
    if let Some(at) = src.find('\0') {
        return Err(format!("the script holds a NUL byte (byte {at})"));
    }
    match heredoc_problem(src) {
        Some(Heredoc::NoWord(at)) => {
            return Err(format!("a here-document operator needs a delimiter word after it (byte {at})"));
        }
        Some(Heredoc::Unterminated(at, tag)) => {
            return Err(format!("the here-document at byte {at} is not terminated: no line {tag:?} follows it"));
        }
        None => {}
    }
    // A panic in the grammar's parser is this script's error, not the
    // agent's crash.
    let opts = options();
    let tokens = crate::docs::contained(|| brush_parser::uncached_tokenize_str(src, &opts.tokenizer_options()))
        .map_err(|p| format!("the shell grammar could not read this script ({p})"))?
        .map_err(|e| e.to_string())?;
    // Nested groups make the grammar's parser backtrack exponentially
    // (`((((…` is arithmetic or subshells): bound the depth, measured on
    // the grammar's own tokens so quoting cannot hide a level.
    let deepest = nesting(&tokens);
    if deepest > MAX_NESTING {
        return Err(format!("parentheses and braces nest {deepest} deep; the limit is {MAX_NESTING}"));
    }
    let program = crate::docs::contained(|| brush_parser::parse_tokens(&tokens, &opts))
        .map_err(|p| format!("the shell grammar could not read this script ({p})"))?
        .map_err(|e| e.to_string())?;
    let mut script = Script::new();
    for list in program.complete_commands {
        for ast::CompoundListItem(and_or, _sep) in list.0 {
            script.push((Join::Seq, pipeline(&and_or.first)?));
            for next in &and_or.additional {
                match next {
                    ast::AndOr::And(p) => script.push((Join::And, pipeline(p)?)),
                    ast::AndOr::Or(p) => script.push((Join::Or, pipeline(p)?)),
                }
            }
        }
    }
    Ok(script)
}

/// What is wrong with a here-document, at its operator's byte offset.
enum Heredoc {
    NoWord(usize),
    Unterminated(usize, String),
}

fn trim_tabs(line: &[u8]) -> &[u8] {
    let n = line.iter().take_while(|&&c| c == b'\t').count();
    &line[n..]
}

/// A `<<`/`<<-` (not `<<<`) whose delimiter word is missing (blanks and
/// line continuations, then the end of the line or of the script, or an
/// operator), or whose body never ends on a line of that word.
fn heredoc_problem(src: &str) -> Option<Heredoc> {
    let b = src.as_bytes();
    let mut i = 0;
    while i + 1 < b.len() {
        // A run of `<` is read greedily, as the tokenizer reads it:
        // `<<<` here-strings first, then `<<` (a here-document) or `<`.
        if b[i] == b'<' && (i == 0 || b[i - 1] != b'<') {
            let run = b[i..].iter().take_while(|&&c| c == b'<').count();
            if run % 3 != 2 {
                i += run;
                continue;
            }
            let at = i + run - 2;
            let mut j = at + 2;
            if b.get(j) == Some(&b'-') {
                j += 1;
            }
            loop {
                match (b.get(j), b.get(j + 1)) {
                    (Some(b' ' | b'\t'), _) => j += 1,
                    (Some(b'\\'), Some(b'\n')) => j += 2,
                    _ => break,
                }
            }
            // A word must start here: not the end, any whitespace (the
            // tokenizer trims a tag's leading whitespace, `\r` included, to
            // nothing) or an operator.
            if b.get(j).is_none_or(|c| c.is_ascii_whitespace() || b";&|()<>".contains(c)) {
                return Some(Heredoc::NoWord(at));
            }
            // The word, read as the grammar reads it: quotes kept whole,
            // a backslash escaping the next byte; then its delimiter text.
            let (mut tag, mut quote) = (Vec::new(), None::<u8>);
            while let Some(&c) = b.get(j) {
                match quote {
                    Some(q) if c == q => quote = None,
                    Some(_) => tag.push(c),
                    None if c == b'\\' => {
                        if let Some(&n) = b.get(j + 1) {
                            tag.push(n);
                        }
                        j += 1;
                    }
                    None if c == b'\'' || c == b'"' => quote = Some(c),
                    None if c.is_ascii_whitespace() || b";&|()<>".contains(&c) => break,
                    None => tag.push(c),
                }
                j += 1;
            }
            // Its body must end on a line of exactly that text (leading
            // tabs stripped for `<<-`) somewhere after the operator's line.
            let tabs = b.get(at + 2) == Some(&b'-');
            let body_from = b[j.min(b.len())..].iter().position(|&c| c == b'\n').map(|p| j + p + 1);
            let ended = body_from.is_some_and(|from| {
                // Lines end at a newline; the nothing after the last one is
                // not a line (it would end an empty `<<''` tag).
                b[from..].split_inclusive(|&c| c == b'\n').any(|line| {
                    let line = line.strip_suffix(b"\n").unwrap_or(line);
                    let line = if tabs { trim_tabs(line) } else { line };
                    line == tag.as_slice()
                })
            });
            if !ended {
                return Some(Heredoc::Unterminated(at, String::from_utf8_lossy(&tag).into_owned()));
            }
            i = j.max(i + 2);
            continue;
        }
        i += 1;
    }
    None
}

/// How deep groups nest: `(`/`)` operators and `{`/`}` words, plus the
/// deepest `(`/`{` nesting inside any one word outside its quotes (a word's
/// quotes are balanced once the grammar has tokenized it; `$'…'` counts
/// conservatively).
fn nesting(tokens: &[brush_parser::Token]) -> usize {
    use brush_parser::Token;
    let (mut depth, mut deepest, mut in_word) = (0usize, 0usize, 0usize);
    for t in tokens {
        match t {
            Token::Operator(o, _) if o == "(" => depth += 1,
            Token::Operator(o, _) if o == ")" => depth = depth.saturating_sub(1),
            Token::Word(w, _) if w == "{" => depth += 1,
            Token::Word(w, _) if w == "}" => depth = depth.saturating_sub(1),
            Token::Word(w, _) => in_word = in_word.max(word_nesting(w)),
            _ => {}
        }
        deepest = deepest.max(depth);
    }
    deepest + in_word
}

fn word_nesting(w: &str) -> usize {
    #[derive(PartialEq)]
    enum Q {
        No,
        Single,
        Double,
    }
    let (mut q, mut esc) = (Q::No, false);
    let (mut depth, mut deepest) = (0usize, 0usize);
    for c in w.bytes() {
        if esc {
            esc = false;
            continue;
        }
        match (&q, c) {
            (Q::Single, b'\'') => q = Q::No,
            (Q::Single, _) => {}
            (_, b'\\') => esc = true,
            (Q::No, b'\'') => q = Q::Single,
            (Q::No, b'"') => q = Q::Double,
            (Q::Double, b'"') => q = Q::No,
            (_, b'(' | b'{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (_, b')' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

fn pipeline(p: &ast::Pipeline) -> Result<Pipeline, String> {
    if p.timed.is_some() {
        return Err("`time` is not supported".into());
    }
    let cmds = p.seq.iter().map(command).collect::<Result<Vec<_>, _>>()?;
    Ok(Pipeline { bang: p.bang, cmds })
}

fn command(c: &ast::Command) -> Result<Cmd, String> {
    let s = match c {
        ast::Command::Simple(s) => s,
        ast::Command::Compound(cc, _) => {
            let what = match cc {
                ast::CompoundCommand::Subshell(_) => "subshells `( … )`",
                ast::CompoundCommand::BraceGroup(_) => "`{ … }` groups",
                ast::CompoundCommand::Arithmetic(_) | ast::CompoundCommand::ArithmeticForClause(_) => {
                    "arithmetic `(( … ))`"
                }
                ast::CompoundCommand::ForClause(_) => "`for` loops",
                ast::CompoundCommand::CaseClause(_) => "`case`",
                ast::CompoundCommand::IfClause(_) => "`if`",
                ast::CompoundCommand::WhileClause(_) | ast::CompoundCommand::UntilClause(_) => "`while`/`until` loops",
                #[allow(unreachable_patterns)]
                _ => "compound commands",
            };
            return Err(format!(
                "{what} are not supported by this shell; run one command at a time, or use sys_code for logic"
            ));
        }
        ast::Command::Function(_) => return Err("function definitions are not supported by this shell".into()),
        ast::Command::ExtendedTest(..) => return Err("`[[ … ]]` tests are not supported by this shell".into()),
    };
    let mut cmd = Cmd::default();
    let mut items: Vec<&ast::CommandPrefixOrSuffixItem> = Vec::new();
    if let Some(p) = &s.prefix {
        items.extend(p.0.iter());
    }
    let mut words_started = false;
    for item in items {
        item_into(item, &mut cmd, &mut words_started)?;
    }
    if let Some(w) = &s.word_or_name {
        cmd.words.push(w.value.clone());
    }
    if let Some(sfx) = &s.suffix {
        words_started = true;
        for item in &sfx.0 {
            item_into(item, &mut cmd, &mut words_started)?;
        }
    }
    Ok(cmd)
}

fn item_into(item: &ast::CommandPrefixOrSuffixItem, cmd: &mut Cmd, words_started: &mut bool) -> Result<(), String> {
    match item {
        ast::CommandPrefixOrSuffixItem::IoRedirect(r) => cmd.redirects.push(redirect(r)?),
        ast::CommandPrefixOrSuffixItem::Word(w) => cmd.words.push(w.value.clone()),
        ast::CommandPrefixOrSuffixItem::AssignmentWord(a, w) => {
            if *words_started {
                // `cmd x=1`: an ordinary argument.
                cmd.words.push(w.value.clone());
            } else {
                let ast::AssignmentName::VariableName(name) = &a.name else {
                    return Err("array assignments are not supported".into());
                };
                let ast::AssignmentValue::Scalar(v) = &a.value else {
                    return Err("array assignments are not supported".into());
                };
                if a.append {
                    return Err("`+=` assignments are not supported".into());
                }
                cmd.assigns.push((name.clone(), v.value.clone()));
            }
        }
        ast::CommandPrefixOrSuffixItem::ProcessSubstitution(..) => {
            return Err("process substitution `<( … )` is not supported".into());
        }
    }
    Ok(())
}

fn fd_of(fd: &Option<ast::IoFd>, default: u32) -> Result<u32, String> {
    match fd {
        None => Ok(default),
        Some(n) => u32::try_from(*n).map_err(|_| format!("file descriptor {n} is not supported")),
    }
}

fn redirect(r: &ast::IoRedirect) -> Result<Redir, String> {
    use ast::{IoFileRedirectKind as K, IoFileRedirectTarget as T};
    Ok(match r {
        ast::IoRedirect::File(fd, kind, target) => match (kind, target) {
            (K::Read, T::Filename(w)) => {
                if fd_of(fd, 0)? != 0 {
                    return Err("input redirects other than stdin are not supported".into());
                }
                Redir::In(w.value.clone())
            }
            (K::Write | K::Clobber | K::Append, T::Filename(w)) => {
                let fd = fd_of(fd, 1)?;
                if fd != 1 && fd != 2 {
                    return Err(format!("redirecting file descriptor {fd} is not supported"));
                }
                Redir::Out { fd, target: w.value.clone(), append: matches!(kind, K::Append) }
            }
            (K::DuplicateOutput, T::Fd(to)) => dup(fd_of(fd, 1)?, *to)?,
            (K::DuplicateOutput, T::Duplicate(w)) => {
                let to: i32 = w.value.parse().map_err(|_| format!("`>&{}` is not supported", w.value))?;
                dup(fd_of(fd, 1)?, to)?
            }
            _ => return Err(format!("the redirect `{r}` is not supported")),
        },
        ast::IoRedirect::HereDocument(_, doc) => {
            Redir::Here { body: doc.doc.value.clone(), expand: doc.requires_expansion }
        }
        ast::IoRedirect::HereString(_, w) => Redir::HereString(w.value.clone()),
        ast::IoRedirect::OutputAndError(w, append) => Redir::Both { target: w.value.clone(), append: *append },
    })
}

fn dup(from: u32, to: ast::IoFd) -> Result<Redir, String> {
    match (from, to) {
        (2, 1) | (1, 2) => Ok(Redir::Dup { from, to: to as u32 }),
        _ => Err(format!("`{from}>&{to}` is not supported")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &Script) -> Vec<Vec<Vec<String>>> {
        s.iter().map(|(_, p)| p.cmds.iter().map(|c| c.words.clone()).collect()).collect()
    }

    #[test]
    fn lists_pipelines_and_precedence() {
        let s = parse("echo 'a  b' \"hi $NAME\"; false || echo ok && echo yes\ncat x | grep y | wc -l").unwrap();
        assert_eq!(
            s.iter().map(|(j, _)| *j).collect::<Vec<_>>(),
            vec![Join::Seq, Join::Seq, Join::Or, Join::And, Join::Seq]
        );
        let w = words(&s);
        assert_eq!(w[0][0], vec!["echo", "'a  b'", "\"hi $NAME\""]);
        assert_eq!(w[4].len(), 3);
    }

    #[test]
    fn redirects_heredocs_and_assignments() {
        let s = parse("X=1 Y=two cmd a > out.txt 2>&1\nls >> all.txt < in.txt\ncat <<EOF\nhello $X\nEOF\n").unwrap();
        let c = &s[0].1.cmds[0];
        assert_eq!(c.assigns, vec![("X".into(), "1".into()), ("Y".into(), "two".into())]);
        assert_eq!(c.words, vec!["cmd", "a"]);
        assert_eq!(
            c.redirects,
            vec![Redir::Out { fd: 1, target: "out.txt".into(), append: false }, Redir::Dup { from: 2, to: 1 }]
        );
        assert_eq!(
            s[1].1.cmds[0].redirects,
            vec![Redir::Out { fd: 1, target: "all.txt".into(), append: true }, Redir::In("in.txt".into())]
        );
        match &s[2].1.cmds[0].redirects[0] {
            Redir::Here { body, expand } => {
                assert_eq!(body, "hello $X\n");
                assert!(*expand);
            }
            other => panic!("{other:?}"),
        }
        let q = parse("cat <<'EOF'\n$X\nEOF\n").unwrap();
        assert!(matches!(&q[0].1.cmds[0].redirects[0], Redir::Here { expand: false, .. }));
    }

    #[test]
    fn what_does_not_run_is_refused_by_name() {
        for (bad, says) in [
            ("if true; then echo; fi", "`if`"),
            ("for f in a b; do echo $f; done", "`for`"),
            ("(cd x)", "subshells"),
            ("f() { echo; }", "function"),
            ("diff <(ls) <(ls)", "process substitution"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        for bad in ["echo 'open", "a &&", "| b", "echo >"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        // Found by the fuzz target: exponential backtracking on nested parens.
        let parens = format!("   <- <{}){}", "(".repeat(40), "(".repeat(40));
        assert!(parse(&parens).unwrap_err().contains("nest"));
        assert!(parse("echo a\0b").unwrap_err().contains("NUL"));
        assert!(parse("echo $(echo $(echo x))").is_ok(), "shallow nesting reaches the grammar");
        assert!(parse("echo '((((((((((((('").is_ok(), "quoted parens do not count");
        // Found by the fuzz target: brush unwraps an oversized fd number.
        assert!(parse("44444444444444444444442>|<p \0\0\x02+<").unwrap_err().contains("too large"));
        let big = parse("echo 2147483647>x").unwrap_err();
        assert!(big.contains("not supported"), "the largest descriptor reaches the grammar: {big}");
        let deep = format!("echo {}x{}", "$(".repeat(2000), ")".repeat(2000));
        assert!(parse(&deep).unwrap_err().contains("limit"), "deep nesting is refused before parsing");
    }

    /// Fault test: every input the fuzzer found (crash, timeout, unbounded
    /// allocation) is answered with a parse error, and so are the minimal
    /// forms of the here-document loop.
    #[test]
    fn fuzz_finds_are_parse_errors() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fuzz/corpus/shell");
        let mut finds = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if !name.starts_with("shell-") {
                continue;
            }
            finds += 1;
            let text = String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned();
            assert!(parse(&text).is_err(), "{name}");
        }
        assert!(finds >= 3, "the corpus keeps its finds");
        // Quoting cannot hide a level from the nesting bound, and quoted
        // parentheses are text.
        assert!(parse("echo '((((((((((' \"(((\" \\(\\(\\(\\(\\(\\(\\(\\(\\(").is_ok());
        for deep in ["((((((((((true", "echo \"\\'\" ((((((((((true", "echo $($($($($($($($($(true)))))))))"] {
            assert!(parse(deep).unwrap_err().contains("nest"), "{deep}");
        }
        for src in
            ["$(<<  ", "a $(b <<\t\t", "${x <<  ", "$(<<  \\", "cat <<- \\\n\nx", "$(<< >\\", "$(<<   )", "${<<\r\r|"]
        {
            let e = parse(src).unwrap_err();
            assert!(e.contains("delimiter word"), "{src:?}: {e}");
        }
        // A body that never reaches its delimiter line is refused by name;
        // quoted and escaped delimiters are read as the grammar reads them.
        assert!(parse("cat <<EOF\nno end").unwrap_err().contains("not terminated: no line \"EOF\""));
        assert!(parse("x=$(cat <<'E F'\nbody\nE F\n)").is_ok());
        assert!(parse("cat <<\\EOF\nbody\nEOF").is_ok());
        assert!(parse("cat <<A <<B\na\nA\nb\nB").is_ok());
        // An empty quoted delimiter ends at an empty line, and only there.
        assert!(parse("x=$(cat <<''\nbody\n\n)").is_ok());
        assert!(parse("x=$(cat <<''\nbody").unwrap_err().contains("not terminated"));
        // A run of `<` ends in a here-document when its length leaves two.
        assert!(parse("cat <<<<<<<<\r|").unwrap_err().contains("delimiter word"));
        // Here-strings and here-documents with a word are fine.
        assert!(parse("cat <<<  x").is_ok());
        assert!(parse("cat <<- 'EOF'\n\tx\nEOF").is_ok());
    }
}
