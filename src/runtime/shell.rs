//! Shell targets of triggers and timers (runtime.md §5.8): one command line
//! (`command`) or a `.sh` file of the agent, run without the model over the
//! agent's own files. This is the subset of `adf_shell` that system targets
//! need: `;`, `&&`, `||`, pipes, `>`, `>>`, `<`, `2>&1`, quoting, `$VAR` and
//! `${VAR}`; the commands `echo`, `cat`, `ls`, `rm`, `grep`, `head`, `wc`,
//! `true`, `false`, `state`, and `adf <tool> '<json>'` for any tool. Every
//! tool a command uses is gated when it runs: declared but disabled → exit
//! 126, restricted (unauthorized script) → 130; undeclared tools run. What
//! it does not know (`$(…)`, heredocs, globs, subshells) is a parse error,
//! exit 1, never a guess.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::code::CodeCx;
use super::executor::Executor;

/// What a shell run produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShellResult {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Redirect {
    Out(String),
    Append(String),
    In(String),
    ErrToOut,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Cmd {
    words: Vec<String>,
    redirects: Vec<Redirect>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Join {
    Seq,
    And,
    Or,
}

/// `(how it joins the previous, pipeline)`.
type Script = Vec<(Join, Vec<Cmd>)>;

/// Check a script's syntax without running it: the number of pipelines,
/// or why it does not parse (the fuzz target's entry).
pub fn check_syntax(src: &str) -> Result<usize, String> {
    parse(src, &HashMap::new()).map(|s| s.len())
}

/// Parse a script (lines are joined with `;`; `#` starts a comment).
fn parse(src: &str, env: &HashMap<String, String>) -> Result<Script, String> {
    let mut script: Script = Vec::new();
    let mut pipeline: Vec<Cmd> = Vec::new();
    let mut cmd = Cmd::default();
    let mut join = Join::Seq;
    let mut word: Option<String> = None;
    let mut pending: Option<&'static str> = None;
    let chars: Vec<char> = src.chars().collect();
    let mut i = 0;
    let var = |chars: &[char], i: &mut usize| -> Result<String, String> {
        // At `$`.
        *i += 1;
        let braced = chars.get(*i) == Some(&'{');
        if braced {
            *i += 1;
        }
        if chars.get(*i) == Some(&'(') {
            return Err("$(…) command substitution is not supported here".into());
        }
        let start = *i;
        while chars.get(*i).is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_') {
            *i += 1;
        }
        let name: String = chars[start..*i].iter().collect();
        if braced {
            if chars.get(*i) != Some(&'}') {
                return Err("unclosed ${".into());
            }
            *i += 1;
        }
        if name.is_empty() {
            return Ok("$".into());
        }
        Ok(env.get(&name).cloned().unwrap_or_default())
    };
    macro_rules! end_word {
        () => {
            if let Some(w) = word.take() {
                match pending.take() {
                    Some(">") => cmd.redirects.push(Redirect::Out(w)),
                    Some(">>") => cmd.redirects.push(Redirect::Append(w)),
                    Some("<") => cmd.redirects.push(Redirect::In(w)),
                    _ => cmd.words.push(w),
                }
            }
        };
    }
    macro_rules! end_cmd {
        () => {
            end_word!();
            if pending.is_some() {
                return Err("a redirect needs a file name".into());
            }
            if !cmd.words.is_empty() || !cmd.redirects.is_empty() {
                pipeline.push(std::mem::take(&mut cmd));
            }
        };
    }
    while i < chars.len() {
        let c = chars[i];
        match c {
            '#' if word.is_none() => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            ' ' | '\t' => end_word!(),
            '\n' | ';' | '&' => {
                if c == '&' && chars.get(i + 1) == Some(&'&') {
                    end_cmd!();
                    if pipeline.is_empty() {
                        return Err("&& without a command before it".into());
                    }
                    script.push((join, std::mem::take(&mut pipeline)));
                    join = Join::And;
                    i += 2;
                    continue;
                }
                end_cmd!();
                if !pipeline.is_empty() {
                    script.push((join, std::mem::take(&mut pipeline)));
                }
                join = Join::Seq;
            }
            '|' => {
                end_cmd!();
                if chars.get(i + 1) == Some(&'|') {
                    if pipeline.is_empty() {
                        return Err("|| without a command before it".into());
                    }
                    script.push((join, std::mem::take(&mut pipeline)));
                    join = Join::Or;
                    i += 2;
                    continue;
                }
                if pipeline.is_empty() {
                    return Err("| without a command before it".into());
                }
            }
            '>' | '<' => {
                if word.as_deref() == Some("2")
                    && c == '>'
                    && chars.get(i + 1) == Some(&'&')
                    && chars.get(i + 2) == Some(&'1')
                {
                    word = None;
                    cmd.redirects.push(Redirect::ErrToOut);
                    i += 3;
                    continue;
                }
                end_word!();
                if c == '<' && chars.get(i + 1) == Some(&'<') {
                    return Err("heredocs are not supported here".into());
                }
                pending = Some(if c == '<' {
                    "<"
                } else if chars.get(i + 1) == Some(&'>') {
                    i += 1;
                    ">>"
                } else {
                    ">"
                });
            }
            '(' | ')' | '`' => return Err(format!("'{c}' (subshells and substitution) is not supported here")),
            '*' | '?' => {
                return Err("glob patterns are not supported here; name the file".into());
            }
            '\'' => {
                let end = chars[i + 1..].iter().position(|&x| x == '\'').ok_or("unclosed single quote")?;
                word.get_or_insert_with(String::new).extend(&chars[i + 1..i + 1 + end]);
                i += end + 2;
                continue;
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err("unclosed double quote".into()),
                        Some('"') => break,
                        Some('\\') if matches!(chars.get(i + 1), Some('"' | '\\' | '$')) => {
                            w.push(chars[i + 1]);
                            i += 2;
                        }
                        Some('$') => {
                            let v = var(&chars, &mut i)?;
                            w.push_str(&v);
                        }
                        Some(&ch) => {
                            w.push(ch);
                            i += 1;
                        }
                    }
                }
                i += 1;
                continue;
            }
            '\\' => {
                if let Some(&n) = chars.get(i + 1) {
                    word.get_or_insert_with(String::new).push(n);
                }
                i += 2;
                continue;
            }
            '$' => {
                let v = var(&chars, &mut i)?;
                word.get_or_insert_with(String::new).push_str(&v);
                continue;
            }
            _ => word.get_or_insert_with(String::new).push(c),
        }
        i += 1;
    }
    end_cmd!();
    if !pipeline.is_empty() {
        script.push((join, pipeline));
    } else if join != Join::Seq {
        return Err("the script ends with && or ||".into());
    }
    Ok(script)
}

/// One command's outcome inside a pipeline.
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn ok(stdout: String) -> Out {
    Out { code: 0, stdout, stderr: String::new() }
}

fn fail(code: i32, stderr: String) -> Out {
    Out { code, stdout: String::new(), stderr }
}

impl Executor {
    /// Run a shell target: `authorized` is the script file's flag (a
    /// command line from config is not authorized).
    pub(crate) async fn run_shell(
        &mut self,
        src: &str,
        env: &HashMap<String, String>,
        authorized: bool,
    ) -> ShellResult {
        let script = match parse(src, env) {
            Ok(s) => s,
            Err(e) => return ShellResult { exit_code: 1, stdout: String::new(), stderr: format!("parse error: {e}") },
        };
        let cx = CodeCx { authorized, source: "system:shell".into(), chain: Vec::new() };
        let mut result = ShellResult::default();
        let mut last = 0;
        for (join, pipeline) in script {
            let run = match join {
                Join::Seq => true,
                Join::And => last == 0,
                Join::Or => last != 0,
            };
            if !run {
                continue;
            }
            let mut input = String::new();
            for c in &pipeline {
                let out = self.shell_cmd(&cx, c, std::mem::take(&mut input)).await;
                result.stderr.push_str(&out.stderr);
                last = out.code;
                input = out.stdout;
                if last == 126 || last == 130 {
                    break;
                }
            }
            result.stdout.push_str(&input);
        }
        result.exit_code = last;
        result
    }

    /// A tool for a command, gated as the shell gates (§8.8).
    async fn shell_tool(&mut self, cx: &CodeCx, tool: &str, args: Value) -> Result<String, Out> {
        let cfg = self.store.config().map_err(|e| fail(1, format!("{e}\n")))?;
        if let Some(d) = cfg.tool(tool)
            && !cx.authorized
        {
            if !d.is_enabled() {
                return Err(fail(126, format!("{tool} is disabled — this command needs the {tool} tool enabled\n")));
            }
            if d.is_restricted() {
                return Err(fail(
                    130,
                    format!("Tool \"{tool}\" was rejected: a restricted tool needs an authorized script\n"),
                ));
            }
        }
        if crate::tools::EXCLUDED_FROM_CODE.contains(&tool) {
            return Err(fail(1, format!("{tool} cannot be used from the shell\n")));
        }
        let out = Box::pin(self.code_tool(cx, tool, &args, false)).await;
        if out.is_error {
            return Err(fail(1, format!("{}\n", out.content)));
        }
        Ok(out.content)
    }

    async fn shell_cmd(&mut self, cx: &CodeCx, c: &Cmd, mut stdin: String) -> Out {
        for r in &c.redirects {
            if let Redirect::In(p) = r {
                match self.shell_tool(cx, "fs_read", json!({"path": p})).await {
                    Ok(t) => stdin = file_text(&t),
                    Err(e) => return e,
                }
            }
        }
        let mut out = match c.words.first().map(String::as_str) {
            None => ok(String::new()),
            Some(name) => self.shell_builtin(cx, name, &c.words[1..], stdin).await,
        };
        for r in &c.redirects {
            match r {
                Redirect::ErrToOut => out.stdout.push_str(&std::mem::take(&mut out.stderr)),
                Redirect::Out(p) | Redirect::Append(p) => {
                    let mode = if matches!(r, Redirect::Out(_)) { "write" } else { "append" };
                    let body = std::mem::take(&mut out.stdout);
                    if let Err(e) =
                        self.shell_tool(cx, "fs_write", json!({"mode": mode, "path": p, "content": body})).await
                    {
                        return e;
                    }
                }
                Redirect::In(_) => {}
            }
        }
        out
    }

    async fn shell_builtin(&mut self, cx: &CodeCx, name: &str, args: &[String], stdin: String) -> Out {
        let lines = |s: &str| s.lines().map(str::to_string).collect::<Vec<_>>();
        match name {
            "true" => ok(String::new()),
            "false" => fail(1, String::new()),
            "echo" => {
                let (newline, rest) = match args.first().map(String::as_str) {
                    Some("-n") => (false, &args[1..]),
                    _ => (true, args),
                };
                ok(format!("{}{}", rest.join(" "), if newline { "\n" } else { "" }))
            }
            "cat" if args.is_empty() => ok(stdin),
            "cat" => {
                let mut s = String::new();
                for p in args {
                    match self.shell_tool(cx, "fs_read", json!({"path": p})).await {
                        Ok(t) => s.push_str(&file_text(&t)),
                        Err(e) => return e,
                    }
                }
                ok(s)
            }
            "ls" => {
                let mut a = json!({});
                if let Some(p) = args.first() {
                    a["prefix"] = json!(p);
                }
                match self.shell_tool(cx, "fs_list", a).await {
                    Ok(t) => {
                        let v: Value = serde_json::from_str(&t).unwrap_or(Value::Null);
                        let names: Vec<String> = v
                            .as_array()
                            .or(v["files"].as_array())
                            .map(|a| a.iter().filter_map(|f| f["path"].as_str().map(str::to_string)).collect())
                            .unwrap_or_else(|| lines(&t));
                        ok(names.iter().map(|n| format!("{n}\n")).collect())
                    }
                    Err(e) => e,
                }
            }
            "rm" => {
                for p in args {
                    if let Err(e) = self.shell_tool(cx, "fs_delete", json!({"path": p})).await {
                        return e;
                    }
                }
                ok(String::new())
            }
            "grep" => {
                let Some(pat) = args.first() else { return fail(2, "grep: a pattern is needed\n".into()) };
                let text = match args.get(1) {
                    Some(p) => match self.shell_tool(cx, "fs_read", json!({"path": p})).await {
                        Ok(t) => file_text(&t),
                        Err(e) => return e,
                    },
                    None => stdin,
                };
                let hits: String =
                    text.lines().filter(|l| l.contains(pat.as_str())).map(|l| format!("{l}\n")).collect();
                if hits.is_empty() { fail(1, String::new()) } else { ok(hits) }
            }
            "head" => {
                let n = match args {
                    [flag, n, ..] if flag == "-n" => n.parse().unwrap_or(10),
                    _ => 10,
                };
                ok(stdin.lines().take(n).map(|l| format!("{l}\n")).collect())
            }
            "wc" if args.first().map(String::as_str) == Some("-l") => ok(format!("{}\n", stdin.lines().count())),
            "state" if args.is_empty() => ok(format!("{}\n", self.state)),
            "state" => fail(1, "state: a trigger's script cannot change the agent's state\n".into()),
            "adf" => {
                let Some(tool) = args.first() else { return fail(2, "usage: adf <tool> '<json>'\n".into()) };
                let input = match args.get(1) {
                    Some(j) => match serde_json::from_str::<Value>(j) {
                        Ok(v) => v,
                        Err(e) => return fail(2, format!("adf {tool}: arguments are not JSON: {e}\n")),
                    },
                    None => json!({}),
                };
                match self.shell_tool(cx, tool, input).await {
                    Ok(t) => ok(if t.ends_with('\n') { t } else { format!("{t}\n") }),
                    Err(e) => e,
                }
            }
            other => fail(127, format!("{other}: command not found\n")),
        }
    }
}

/// The text of an `fs_read` result (JSON with `content`) or the result.
fn file_text(t: &str) -> String {
    serde_json::from_str::<Value>(t)
        .ok()
        .and_then(|v| v["content"].as_str().map(str::to_string))
        .unwrap_or_else(|| t.to_string())
}

/// Environment of a shell target for an event (§5.8).
pub fn event_env(event: &Value, agent_name: &str, state: &str) -> HashMap<String, String> {
    let mut env = HashMap::new();
    let s = |v: &Value| {
        v.as_str().map(str::to_string).unwrap_or_else(|| if v.is_null() { String::new() } else { v.to_string() })
    };
    let d = &event["data"];
    env.insert("EVENT_TYPE".into(), s(&event["type"]));
    env.insert("AGENT_NAME".into(), agent_name.into());
    env.insert("AGENT_STATE".into(), state.into());
    env.insert("PWD".into(), "/".into());
    match event["type"].as_str().unwrap_or("") {
        "inbox" => {
            env.insert("MSG_ID".into(), s(&d["message"]["id"]));
            env.insert("MSG_FROM".into(), s(&d["message"]["from"]));
            env.insert("MSG_CHANNEL".into(), s(&d["message"]["source"]));
        }
        "timer" => {
            env.insert("TIMER_ID".into(), s(&d["timer"]["id"]));
            env.insert("TIMER_PAYLOAD".into(), s(&d["timer"]["payload"]));
        }
        "task_create" | "task_complete" => {
            env.insert("TASK_ID".into(), s(&d["task"]["id"]));
            env.insert("TASK_TOOL".into(), s(&d["task"]["tool"]));
            env.insert("TASK_STATUS".into(), s(&d["task"]["status"]));
        }
        "file_change" => {
            env.insert("CHANGED_PATH".into(), s(&d["path"]));
        }
        "llm_call" => {
            for (k, f) in [
                ("LLM_PROVIDER", "provider"),
                ("LLM_MODEL", "model"),
                ("LLM_SOURCE", "source"),
                ("LLM_INPUT_TOKENS", "input_tokens"),
                ("LLM_OUTPUT_TOKENS", "output_tokens"),
                ("LLM_DURATION_MS", "duration_ms"),
                ("LLM_STOP_REASON", "stop_reason"),
                ("LLM_COST_USD", "cost_usd"),
            ] {
                env.insert(k.into(), s(&d[f]));
            }
        }
        _ => {}
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Script, String> {
        let env = HashMap::from([("NAME".to_string(), "world".to_string()), ("EMPTY".to_string(), String::new())]);
        parse(s, &env)
    }

    fn words(s: &Script) -> Vec<Vec<Vec<String>>> {
        s.iter().map(|(_, pl)| pl.iter().map(|c| c.words.clone()).collect()).collect()
    }

    #[test]
    fn quoting_variables_and_joins() {
        let s = p("echo 'a  b' \"hi $NAME\" ${NAME}x \\$NAME; false || echo ok && echo yes").unwrap();
        assert_eq!(
            words(&s),
            vec![
                vec![vec!["echo", "a  b", "hi world", "worldx", "$NAME"]],
                vec![vec!["false"]],
                vec![vec!["echo", "ok"]],
                vec![vec!["echo", "yes"]]
            ]
            .into_iter()
            .map(|pl| pl.into_iter().map(|c| c.into_iter().map(String::from).collect()).collect())
            .collect::<Vec<Vec<Vec<String>>>>()
        );
        assert_eq!(s.iter().map(|(j, _)| *j).collect::<Vec<_>>(), vec![Join::Seq, Join::Seq, Join::Or, Join::And]);
    }

    #[test]
    fn pipes_and_redirects() {
        let s = p("cat notes.md | grep todo > out.txt 2>&1\nls >> all.txt < in.txt # comment").unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].1.len(), 2);
        assert_eq!(s[0].1[1].redirects, vec![Redirect::Out("out.txt".into()), Redirect::ErrToOut]);
        assert_eq!(s[1].1[0].redirects, vec![Redirect::Append("all.txt".into()), Redirect::In("in.txt".into())]);
    }

    #[test]
    fn what_is_not_supported_is_an_error() {
        for bad in ["echo $(date)", "cat <<EOF", "(cd x)", "ls *.md", "echo 'open", "a &&", "| b", "echo >"] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert!(p("echo '*.md' \"?\"").is_ok(), "quoted globs are words");
    }
}
