//! Word expansion as bash does it, in bash's order, over brush's word
//! pieces: quotes, escapes, `~` (the flat filesystem's `/`), `$VAR`,
//! `${VAR}`, `${VAR:-default}`, `${#VAR}`, `$?`, `$1`…, `$(…)` and
//! backquotes (run by the shell itself, gated like any command), field
//! splitting of unquoted expansions, and globs matched against the agent's
//! own file paths (no match leaves the word as written). Arithmetic and the
//! rarer `${…}` forms are refused by name.

use brush_parser::word::{Parameter, ParameterExpr, ParameterTestType, SpecialParameter, WordPiece};
use futures_util::future::BoxFuture;

use super::Sh;
use super::parse::word_options;
use crate::runtime::executor::Executor;

/// One field being built.
#[derive(Default)]
struct Field {
    text: String,
    /// The same text as a glob pattern: quoted parts escaped.
    pattern: String,
    globbed: bool,
    /// Something quoted was in it: an empty result is still a field.
    quoted: bool,
}

impl Field {
    fn lit(&mut self, s: &str) {
        self.text.push_str(s);
        self.pattern.push_str(&glob::Pattern::escape(s));
    }
}

impl Executor {
    /// Expand one word into its fields.
    pub(super) fn expand_word<'a>(
        &'a mut self,
        sh: &'a mut Sh,
        word: &'a str,
    ) -> BoxFuture<'a, Result<Vec<String>, String>> {
        Box::pin(async move {
            let pieces = brush_parser::word::parse(word, &word_options()).map_err(|e| e.to_string())?;
            let mut fields: Vec<Field> = vec![Field::default()];
            let mut any = false;
            for p in pieces {
                match p.piece {
                    WordPiece::Text(t) => {
                        let f = fields.last_mut().ok_or("no field")?;
                        if t.contains(['*', '?', '[']) {
                            f.globbed = true;
                        }
                        f.text.push_str(&t);
                        f.pattern.push_str(&t);
                        any = true;
                    }
                    WordPiece::SingleQuotedText(t) => {
                        let f = fields.last_mut().ok_or("no field")?;
                        f.lit(&t);
                        f.quoted = true;
                    }
                    WordPiece::AnsiCQuotedText(t) => {
                        let f = fields.last_mut().ok_or("no field")?;
                        f.lit(&ansi_c(&t));
                        f.quoted = true;
                    }
                    WordPiece::EscapeSequence(e) => {
                        let f = fields.last_mut().ok_or("no field")?;
                        f.lit(e.strip_prefix('\\').unwrap_or(&e));
                        any = true;
                    }
                    WordPiece::DoubleQuotedSequence(inner) | WordPiece::GettextDoubleQuotedSequence(inner) => {
                        let mut s = String::new();
                        for ip in inner {
                            s.push_str(&self.joined(sh, ip.piece, true).await?);
                        }
                        let f = fields.last_mut().ok_or("no field")?;
                        f.lit(&s);
                        f.quoted = true;
                    }
                    WordPiece::TildeExpansion(_) => {
                        fields.last_mut().ok_or("no field")?.lit("/");
                        any = true;
                    }
                    other => {
                        // Unquoted expansion: split on blanks.
                        let v = self.joined(sh, other, false).await?;
                        let mut parts = v.split([' ', '\t', '\n']).filter(|s| !s.is_empty()).peekable();
                        let starts_blank = v.starts_with([' ', '\t', '\n']);
                        let ends_blank = v.ends_with([' ', '\t', '\n']);
                        if starts_blank && !fields.last().is_some_and(|f| f.text.is_empty() && !f.quoted) {
                            fields.push(Field::default());
                        }
                        while let Some(part) = parts.next() {
                            fields.last_mut().ok_or("no field")?.lit(part);
                            if parts.peek().is_some() {
                                fields.push(Field::default());
                            }
                        }
                        if ends_blank && !v.trim().is_empty() {
                            fields.push(Field::default());
                        }
                    }
                }
            }
            let mut out = Vec::new();
            for f in fields {
                if f.text.is_empty() && !f.quoted {
                    continue;
                }
                if f.globbed {
                    let hits = self.glob(&f.pattern);
                    if !hits.is_empty() {
                        out.extend(hits);
                        continue;
                    }
                }
                out.push(f.text);
            }
            if out.is_empty() && !any {
                return Ok(out);
            }
            Ok(out)
        })
    }

    /// Expand a word to one string (assignments, redirect targets).
    pub(super) async fn expand_one(&mut self, sh: &mut Sh, word: &str) -> Result<String, String> {
        Ok(self.expand_word(sh, word).await?.join(" "))
    }

    /// Expand a heredoc body: parameters and substitutions, quotes literal.
    pub(super) async fn expand_heredoc(&mut self, sh: &mut Sh, body: &str) -> Result<String, String> {
        let pieces = brush_parser::word::parse_heredoc(body, &word_options()).map_err(|e| e.to_string())?;
        let mut s = String::new();
        for p in pieces {
            s.push_str(&self.joined(sh, p.piece, true).await?);
        }
        Ok(s)
    }

    /// The text of one piece, without splitting.
    fn joined<'a>(
        &'a mut self,
        sh: &'a mut Sh,
        piece: WordPiece,
        quoted: bool,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            Ok(match piece {
                WordPiece::Text(t) | WordPiece::SingleQuotedText(t) => t,
                WordPiece::AnsiCQuotedText(t) => ansi_c(&t),
                WordPiece::EscapeSequence(e) => {
                    let c = e.strip_prefix('\\').unwrap_or(&e);
                    // Inside double quotes only \$ \` \" \\ lose the backslash.
                    if quoted && !matches!(c, "$" | "`" | "\"" | "\\" | "\n") { e.clone() } else { c.to_string() }
                }
                WordPiece::DoubleQuotedSequence(inner) | WordPiece::GettextDoubleQuotedSequence(inner) => {
                    let mut s = String::new();
                    for ip in inner {
                        s.push_str(&self.joined(sh, ip.piece, true).await?);
                    }
                    s
                }
                WordPiece::TildeExpansion(_) => "/".into(),
                WordPiece::ParameterExpansion(p) => self.parameter(sh, p).await?,
                WordPiece::CommandSubstitution(src) | WordPiece::BackquotedCommandSubstitution(src) => {
                    let out = self.substitute(sh, &src).await?;
                    out.trim_end_matches('\n').to_string()
                }
                WordPiece::ArithmeticExpression(_) => {
                    return Err("arithmetic $(( … )) is not supported by this shell".into());
                }
            })
        })
    }

    async fn parameter(&mut self, sh: &mut Sh, p: ParameterExpr) -> Result<String, String> {
        Ok(match p {
            ParameterExpr::Parameter { parameter, indirect: false } => sh.param(&parameter).unwrap_or_default(),
            ParameterExpr::UseDefaultValues { parameter, indirect: false, test_type, default_value } => {
                match sh.param(&parameter) {
                    Some(v) if !(v.is_empty() && matches!(test_type, ParameterTestType::UnsetOrNull)) => v,
                    _ => self.expand_one(sh, default_value.as_deref().unwrap_or("")).await?,
                }
            }
            ParameterExpr::AssignDefaultValues { parameter, indirect: false, test_type, default_value } => {
                match sh.param(&parameter) {
                    Some(v) if !(v.is_empty() && matches!(test_type, ParameterTestType::UnsetOrNull)) => v,
                    _ => {
                        let v = self.expand_one(sh, default_value.as_deref().unwrap_or("")).await?;
                        if let Parameter::Named(n) = &parameter {
                            sh.env.insert(n.clone(), v.clone());
                        }
                        v
                    }
                }
            }
            ParameterExpr::UseAlternativeValue { parameter, indirect: false, test_type, alternative_value } => {
                match sh.param(&parameter) {
                    Some(v) if !(v.is_empty() && matches!(test_type, ParameterTestType::UnsetOrNull)) => {
                        self.expand_one(sh, alternative_value.as_deref().unwrap_or("")).await?
                    }
                    _ => String::new(),
                }
            }
            ParameterExpr::ParameterLength { parameter, indirect: false } => {
                sh.param(&parameter).unwrap_or_default().chars().count().to_string()
            }
            other => return Err(format!("this ${{…}} form is not supported by this shell: {other:?}")),
        })
    }

    /// Paths of the agent's files a glob pattern matches, sorted.
    fn glob(&self, pattern: &str) -> Vec<String> {
        let pattern = pattern.trim_start_matches("./").trim_start_matches('/');
        let Ok(pat) = glob::Pattern::new(pattern) else { return Vec::new() };
        let opts = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: true,
        };
        let mut hits: Vec<String> = self
            .store
            .file_list("")
            .map(|files| files.into_iter().map(|f| f.path).filter(|p| pat.matches_with(p, opts)).collect())
            .unwrap_or_default();
        hits.sort();
        hits
    }
}

impl Sh {
    fn param(&self, p: &Parameter) -> Option<String> {
        match p {
            Parameter::Named(n) => self.env.get(n).cloned(),
            Parameter::Positional(0) => Some(self.name.clone()),
            Parameter::Positional(n) => self.args.get(*n as usize - 1).cloned(),
            Parameter::Special(SpecialParameter::LastExitStatus) => Some(self.last.to_string()),
            Parameter::Special(SpecialParameter::PositionalParameterCount) => Some(self.args.len().to_string()),
            Parameter::Special(SpecialParameter::AllPositionalParameters { .. }) => Some(self.args.join(" ")),
            Parameter::Special(SpecialParameter::ShellName) => Some(self.name.clone()),
            Parameter::Special(SpecialParameter::ProcessId) => Some("1".into()),
            Parameter::Special(_) => Some(String::new()),
            Parameter::NamedWithIndex { .. } | Parameter::NamedWithAllIndices { .. } => None,
        }
    }
}

/// `$'…'` escapes.
fn ansi_c(s: &str) -> String {
    super::text::backslashes(s, false)
}
