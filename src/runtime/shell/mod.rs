//! `adf_shell` (tools.md, runtime.md §8.8): a virtual shell over the
//! agent's own files and tools, and the shell targets of triggers and
//! timers (§5.8), on one parser and one executor. Text is parsed by a real
//! bash grammar (`parse`), words are expanded when their command runs
//! (`expand`), and every command is gated against the live config just
//! before it runs: a declared but disabled tool it needs → exit 126, a
//! restricted one → the owner is asked (from the model's loop; refused →
//! 130), undeclared tools run. Nothing touches the host: files are the
//! agent's `adf_files`, `sqlite3` is the agent's database behind the SQL
//! guard, `curl` goes through the egress guard, `at`/`crontab` are the
//! agent's timers, `node` runs in the sandbox.

mod agent;
pub mod bench;
mod cmds;
mod data;
mod expand;
mod files;
pub(crate) mod parse;
mod text;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use serde_json::{Value, json};

use super::executor::{Decision, Executor};
use crate::tools::ToolOutput;

pub use parse::Join;

/// What a shell run produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShellResult {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Check a script's syntax without running it: the number of pipelines,
/// or why it does not parse (the fuzz target's entry).
pub fn check_syntax(src: &str) -> Result<usize, String> {
    parse::parse(src).map(|s| s.len())
}

/// Caps on what the model sees (code gets everything).
pub const MAX_LINES: usize = 2_000;
pub const MAX_BYTES: usize = 50 * 1024;
pub const MAX_LINE_CHARS: usize = 500;
pub const MAX_GREP_HITS: usize = 200;
/// `$(…)` and script nesting.
const MAX_DEPTH: u32 = 16;

/// One command's outcome.
#[derive(Debug, Default)]
pub(crate) struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub(crate) fn ok(stdout: impl Into<String>) -> Out {
    Out { code: 0, stdout: stdout.into(), stderr: String::new() }
}

pub(crate) fn fail(code: i32, stderr: impl Into<String>) -> Out {
    let mut stderr = stderr.into();
    if !stderr.is_empty() && !stderr.ends_with('\n') {
        stderr.push('\n');
    }
    Out { code, stdout: String::new(), stderr }
}

/// The state of one shell invocation.
pub(crate) struct Sh {
    pub env: HashMap<String, String>,
    /// `$1`… of a script.
    pub args: Vec<String>,
    /// `$0`.
    pub name: String,
    /// `$?`.
    pub last: i32,
    /// An authorized `.sh` script: gates are skipped.
    pub authorized: bool,
    /// Run from the model's loop: restricted tools ask the owner.
    pub interactive: bool,
    /// Run from code: no output caps.
    pub full: bool,
    /// The tool call's id, for approvals.
    pub call_id: String,
    /// The whole command line, shown to approvers.
    pub command: String,
    pub depth: u32,
    /// `state idle|hibernate|off`, applied when the invocation returns.
    pub target_state: Option<String>,
    pub media: Vec<Value>,
    pub truncated: bool,
    /// Tools the owner approved during this invocation.
    pub approved: HashSet<String>,
    /// Deadline in ms since the epoch; an approval wait moves it.
    pub deadline: Arc<AtomicI64>,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Sh {
    fn new(env: HashMap<String, String>, authorized: bool, timeout_ms: u64) -> Sh {
        Sh {
            env,
            args: Vec::new(),
            name: "adf_shell".into(),
            last: 0,
            authorized,
            interactive: false,
            full: true,
            call_id: String::new(),
            command: String::new(),
            depth: 0,
            target_state: None,
            media: Vec::new(),
            truncated: false,
            approved: HashSet::new(),
            deadline: Arc::new(AtomicI64::new(now_ms() + timeout_ms as i64)),
        }
    }
}

impl Executor {
    /// Run a shell target of a trigger or timer: `authorized` is the
    /// script file's flag (a command line from config is not authorized).
    pub(crate) async fn run_shell(
        &mut self,
        src: &str,
        env: &HashMap<String, String>,
        authorized: bool,
    ) -> ShellResult {
        let cfg = self.store.config_value().unwrap_or(Value::Null);
        let mut sh = Sh::new(env.clone(), authorized, shell_timeout(&cfg));
        sh.command = src.to_string();
        let (r, _) = self.shell_invoke(&mut sh, src).await;
        if sh.target_state.is_some() {
            return ShellResult {
                exit_code: 1,
                stdout: r.stdout,
                stderr: format!("{}state: a trigger's script cannot change the agent's state\n", r.stderr),
            };
        }
        r
    }

    /// The `adf_shell` tool, from the model's loop (`interactive`) or from
    /// code. The result is never an error: the exit code says how it went.
    pub(crate) async fn adf_shell(
        &mut self,
        input: &Value,
        call_id: &str,
        interactive: bool,
        authorized: bool,
    ) -> ToolOutput {
        let command = input["command"].as_str().unwrap_or_default().to_string();
        let cfg = self.store.config_value().unwrap_or(Value::Null);
        let name = cfg["name"].as_str().map(str::to_string);
        let mut env = HashMap::new();
        env.insert("PWD".to_string(), "/".to_string());
        env.insert("HOME".to_string(), "/".to_string());
        env.insert("AGENT_NAME".to_string(), name.unwrap_or_default());
        env.insert("AGENT_STATE".to_string(), self.state.clone());
        let mut sh = Sh::new(env, authorized, shell_timeout(&cfg));
        sh.interactive = interactive;
        sh.full = !interactive;
        sh.call_id = call_id.to_string();
        sh.command = command.clone();
        let started = std::time::Instant::now();
        let (r, timed_out) = self.shell_invoke(&mut sh, &command).await;
        let ms = started.elapsed().as_millis() as u64;
        let _ = self.log(
            "info",
            "adf_shell",
            "execute",
            &format!(
                "exit {}{} in {ms} ms: {}",
                r.exit_code,
                if timed_out { " (timeout)" } else { "" },
                short(&command)
            ),
        );
        let mut stdout = r.stdout;
        let mut stderr = r.stderr;
        if !sh.full {
            sh.truncated |= cap_for_model(&mut stdout);
            cap_for_model(&mut stderr);
        }
        let mut v = json!({"exit_code": r.exit_code, "stdout": stdout, "stderr": stderr});
        if !sh.media.is_empty() {
            v["media"] = Value::Array(std::mem::take(&mut sh.media));
        }
        if sh.truncated {
            v["truncated"] = json!(true);
        }
        let mut out = ToolOutput::json(&v);
        if let Some(state) = sh.target_state.take() {
            v["target_state"] = json!(state);
            out = ToolOutput::json(&v);
            out.end_turn = true;
            out.target_state = Some(state);
        }
        out
    }

    /// Parse and run under the invocation's deadline: (result, timed out).
    async fn shell_invoke(&mut self, sh: &mut Sh, src: &str) -> (ShellResult, bool) {
        let script = match parse::parse(src) {
            Ok(s) => s,
            Err(e) => {
                return (
                    ShellResult { exit_code: 1, stdout: String::new(), stderr: format!("parse error: {e}\n") },
                    false,
                );
            }
        };
        let deadline = sh.deadline.clone();
        let limit_s = (deadline.load(Ordering::Relaxed) - now_ms()).max(0) / 1000;
        let mut result = ShellResult::default();
        let mut body = self.run_script(sh, &script, String::new(), &mut result);
        let finished = loop {
            let left = deadline.load(Ordering::Relaxed) - now_ms();
            if left <= 0 {
                break None;
            }
            tokio::select! {
                code = &mut body => break Some(code),
                _ = tokio::time::sleep(std::time::Duration::from_millis(left as u64)) => {}
            }
        };
        drop(body);
        match finished {
            Some(code) => {
                result.exit_code = code;
                (result, false)
            }
            None => {
                result.exit_code = 124;
                result.stderr.push_str(&format!("shell: command timed out after {limit_s}s\n"));
                (result, true)
            }
        }
    }

    /// Run a parsed script; stdout and stderr collect into `into`; the
    /// exit status of the last pipeline run is returned.
    fn run_script<'a>(
        &'a mut self,
        sh: &'a mut Sh,
        script: &'a parse::Script,
        stdin: String,
        into: &'a mut ShellResult,
    ) -> futures_util::future::BoxFuture<'a, i32> {
        Box::pin(async move {
            let mut stdin = Some(stdin);
            for (join, pipeline) in script {
                let run = match join {
                    Join::Seq => true,
                    Join::And => sh.last == 0,
                    Join::Or => sh.last != 0,
                };
                if !run {
                    continue;
                }
                let mut input = stdin.take().unwrap_or_default();
                let mut code = 0;
                for c in &pipeline.cmds {
                    let out = self.run_cmd(sh, c, std::mem::take(&mut input)).await;
                    into.stderr.push_str(&out.stderr);
                    code = out.code;
                    input = out.stdout;
                    if code == 126 || code == 130 {
                        break;
                    }
                }
                into.stdout.push_str(&input);
                sh.last = if pipeline.bang { i32::from(code == 0) } else { code };
                if code == 126 || code == 130 {
                    // A refused tool stops the invocation: do not retry around it.
                    return code;
                }
            }
            sh.last
        })
    }

    /// `$(…)`: run a script and return its stdout.
    pub(super) async fn substitute(&mut self, sh: &mut Sh, src: &str) -> Result<String, String> {
        if sh.depth >= MAX_DEPTH {
            return Err("command substitution nested too deeply".into());
        }
        let script = parse::parse(src)?;
        sh.depth += 1;
        let mut r = ShellResult::default();
        let saved = sh.last;
        let code = self.run_script(sh, &script, String::new(), &mut r).await;
        sh.depth -= 1;
        if code == 126 || code == 130 {
            return Err(r.stderr.trim_end().to_string());
        }
        sh.last = saved;
        Ok(r.stdout)
    }

    /// Run a nested script (`./x.sh`, `xargs`) with its own arguments.
    pub(super) async fn run_nested(&mut self, sh: &mut Sh, src: &str, args: Vec<String>, stdin: String) -> Out {
        if sh.depth >= MAX_DEPTH {
            return fail(1, "shell: scripts nested too deeply");
        }
        let script = match parse::parse(src) {
            Ok(s) => s,
            Err(e) => return fail(1, format!("parse error: {e}")),
        };
        let saved = std::mem::replace(&mut sh.args, args);
        sh.depth += 1;
        let mut r = ShellResult::default();
        let code = self.run_script(sh, &script, stdin, &mut r).await;
        sh.depth -= 1;
        sh.args = saved;
        Out { code, stdout: r.stdout, stderr: r.stderr }
    }

    /// One simple command: expand, gate, redirect, run.
    fn run_cmd<'a>(
        &'a mut self,
        sh: &'a mut Sh,
        c: &'a parse::Cmd,
        stdin: String,
    ) -> futures_util::future::BoxFuture<'a, Out> {
        Box::pin(async move {
            let mut words = Vec::new();
            for w in &c.words {
                match self.expand_word(sh, w).await {
                    Ok(mut f) => words.append(&mut f),
                    Err(e) => return fail(1, format!("shell: {e}")),
                }
            }
            let mut assigns = Vec::new();
            for (k, v) in &c.assigns {
                match self.expand_one(sh, v).await {
                    Ok(v) => assigns.push((k.clone(), v)),
                    Err(e) => return fail(1, format!("shell: {e}")),
                }
            }
            if words.is_empty() {
                // `X=1` alone sets a shell variable.
                for (k, v) in &assigns {
                    sh.env.insert(k.clone(), v.clone());
                }
                if c.redirects.is_empty() {
                    return ok("");
                }
            }
            // Redirect targets and heredocs.
            let mut stdin = stdin;
            let mut outs: Vec<(u32, String, bool)> = Vec::new();
            let mut both = false;
            let mut dups: Vec<(u32, u32)> = Vec::new();
            let mut tools: Vec<&'static str> = Vec::new();
            for r in &c.redirects {
                match r {
                    parse::Redir::In(w) => {
                        let p = match self.expand_one(sh, w).await {
                            Ok(p) => p,
                            Err(e) => return fail(1, format!("shell: {e}")),
                        };
                        tools.push("fs_read");
                        outs.push((0, p, false));
                    }
                    parse::Redir::Out { fd, target, append } => match self.expand_one(sh, target).await {
                        Ok(p) => {
                            if p != "/dev/null" {
                                tools.push("fs_write");
                            }
                            outs.push((*fd, p, *append));
                        }
                        Err(e) => return fail(1, format!("shell: {e}")),
                    },
                    parse::Redir::Both { target, append } => match self.expand_one(sh, target).await {
                        Ok(p) => {
                            if p != "/dev/null" {
                                tools.push("fs_write");
                            }
                            both = true;
                            outs.push((1, p, *append));
                        }
                        Err(e) => return fail(1, format!("shell: {e}")),
                    },
                    parse::Redir::Dup { from, to } => dups.push((*from, *to)),
                    parse::Redir::Here { body, expand } => {
                        stdin = if *expand {
                            match self.expand_heredoc(sh, body).await {
                                Ok(b) => b,
                                Err(e) => return fail(1, format!("shell: {e}")),
                            }
                        } else {
                            body.clone()
                        };
                    }
                    parse::Redir::HereString(w) => match self.expand_one(sh, w).await {
                        Ok(s) => stdin = format!("{s}\n"),
                        Err(e) => return fail(1, format!("shell: {e}")),
                    },
                }
            }
            let name = words.first().cloned().unwrap_or_default();
            let args: Vec<String> = words.iter().skip(1).cloned().collect();
            if !name.is_empty() {
                tools.extend(cmds::tools_for(&name, &args));
            }
            if let Err(out) = self.shell_gate(sh, &tools).await {
                return out;
            }
            for (fd, p, _) in &outs {
                if *fd == 0 {
                    match self.shell_read_text(sh, p) {
                        Ok(t) => stdin = t,
                        Err(e) => return fail(1, format!("shell: {e}")),
                    }
                }
            }
            // `X=1 cmd`: the variable for this command only.
            let saved: Vec<(String, Option<String>)> =
                assigns.iter().map(|(k, v)| (k.clone(), sh.env.insert(k.clone(), v.clone()))).collect();
            let mut out = if name.is_empty() { ok("") } else { self.run_command(sh, &name, &args, stdin).await };
            for (k, old) in saved {
                match old {
                    Some(v) => sh.env.insert(k, v),
                    None => sh.env.remove(&k),
                };
            }
            for (from, to) in dups {
                match (from, to) {
                    (2, 1) => out.stdout.push_str(&std::mem::take(&mut out.stderr)),
                    _ => out.stderr.push_str(&std::mem::take(&mut out.stdout)),
                }
            }
            if both {
                out.stdout.push_str(&std::mem::take(&mut out.stderr));
            }
            for (fd, p, append) in outs {
                if fd == 0 {
                    continue;
                }
                let body = if fd == 2 { std::mem::take(&mut out.stderr) } else { std::mem::take(&mut out.stdout) };
                if p == "/dev/null" {
                    continue;
                }
                if let Err(e) = self.shell_write(sh, &p, &body, append).await {
                    out.code = 1;
                    out.stderr.push_str(&format!("shell: {e}\n"));
                }
            }
            out
        })
    }

    /// Gate the tools a command needs, just before it runs (§8.8).
    pub(super) async fn shell_gate(&mut self, sh: &mut Sh, tools: &[&str]) -> Result<(), Out> {
        if sh.authorized {
            return Ok(());
        }
        let cfg = match self.store.config() {
            Ok(c) => c,
            Err(e) => return Err(fail(1, e.to_string())),
        };
        let mut seen = HashSet::new();
        for &tool in tools {
            if !seen.insert(tool) {
                continue;
            }
            let Some(d) = cfg.tool(tool) else { continue };
            if !d.is_enabled() && !d.is_restricted() {
                return Err(fail(
                    126,
                    format!(
                        "{tool} is disabled — this command needs the {tool} tool enabled in the agent's configuration"
                    ),
                ));
            }
            if d.is_restricted() && !sh.approved.contains(tool) {
                if !sh.interactive {
                    return Err(fail(
                        130,
                        format!("Tool \"{tool}\" needs approval and no one can approve it here; do not retry."),
                    ));
                }
                let asked = std::time::Instant::now();
                let input = json!({"command": sh.command, "tool": tool});
                let id = format!("{}:{tool}", sh.call_id);
                let decision = self.request_approval(tool, &id, &input, "shell_gate", None, None, "agent:shell").await;
                sh.deadline.fetch_add(asked.elapsed().as_millis() as i64, Ordering::Relaxed);
                match decision {
                    Ok((task_id, Decision::Approve { .. })) => {
                        let _ = self.store.task_set(&task_id, "completed", Some("approved"), None);
                        sh.approved.insert(tool.to_string());
                    }
                    Ok((task_id, Decision::Defer)) => {
                        let _ = self.store.task_set(&task_id, "denied", None, Some("No one could approve"));
                        return Err(fail(
                            130,
                            format!("Tool \"{tool}\" was not approved (no one could answer); do not retry."),
                        ));
                    }
                    Ok((_, Decision::Deny { .. })) => {
                        return Err(fail(130, format!("Tool \"{tool}\" was rejected by the user. Do not retry.")));
                    }
                    Err(e) => return Err(fail(130, format!("Tool \"{tool}\" could not be approved: {e}"))),
                }
            }
        }
        Ok(())
    }
}

/// Cap text for the model: lines at 500 characters, 2,000 lines, 50 KB.
/// True when anything was cut.
pub(crate) fn cap_for_model(s: &mut String) -> bool {
    if s.len() <= MAX_BYTES && s.lines().count() <= MAX_LINES && s.lines().all(|l| l.len() <= MAX_LINE_CHARS) {
        return false;
    }
    let total_lines = s.lines().count();
    let mut out = String::with_capacity(s.len().min(MAX_BYTES + 256));
    let mut cut = false;
    for (i, line) in s.lines().enumerate() {
        if i >= MAX_LINES || out.len() + line.len().min(MAX_LINE_CHARS) > MAX_BYTES {
            out.push_str(&format!(
                "[truncated: {i} of {total_lines} lines shown; read on with sed -n '{},{}p' FILE, head, tail or grep]\n",
                i + 1,
                i + MAX_LINES
            ));
            cut = true;
            break;
        }
        if line.chars().count() > MAX_LINE_CHARS {
            out.extend(line.chars().take(MAX_LINE_CHARS));
            out.push_str("…[line cut]\n");
            cut = true;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    *s = out;
    cut
}

/// `limits.execution_timeout_ms` (default 60 s).
fn shell_timeout(cfg: &Value) -> u64 {
    cfg.pointer("/limits/execution_timeout_ms").and_then(Value::as_u64).unwrap_or(60_000)
}

fn short(s: &str) -> String {
    let first = s.lines().next().unwrap_or("");
    if first.chars().count() > 120 || s.lines().nth(1).is_some() {
        format!("{}…", first.chars().take(120).collect::<String>())
    } else {
        first.to_string()
    }
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
