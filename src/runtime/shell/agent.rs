//! The shell's commands about the agent itself: messaging (`msg who
//! ping`), the network (`curl`/`wget` through `sys_fetch` and its egress
//! guard), timers (`at`, `crontab`), code (`node`), background tasks (`ps
//! kill wait`), identity and state (`whoami config status state meta env
//! export date sleep`), and `adf <tool> '<json>'` for any tool.

use std::fmt::Write as _;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use super::text::getopt;
use super::{Out, Sh, fail, ok};
use crate::runtime::executor::Executor;
use crate::store::tasks::TERMINAL;

fn line(s: &str) -> String {
    if s.ends_with('\n') || s.is_empty() { s.to_string() } else { format!("{s}\n") }
}

/// `+5m`, `+30s`, `+2h`, `+1d`, `now + 5 minutes`, an ISO time, or epoch
/// ms → epoch ms.
fn when(spec: &str, now: i64) -> Result<i64, String> {
    let s = spec.trim().trim_start_matches("now").trim();
    if let Some(rel) = s.strip_prefix('+') {
        let rel = rel.trim();
        let digits: String = rel.chars().take_while(char::is_ascii_digit).collect();
        let n: i64 = digits.parse().map_err(|_| format!("at: cannot read the time {spec:?}"))?;
        let unit = rel[digits.len()..].trim();
        let ms = match unit {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1_000,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000,
            "h" | "hour" | "hours" => 3_600_000,
            "d" | "day" | "days" => 86_400_000,
            other => return Err(format!("at: unknown unit {other:?} (s, m, h, d)")),
        };
        return Ok(now + n * ms);
    }
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|d| d.timestamp_millis())
        .or_else(|_| {
            chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M")
                .or_else(|_| chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M"))
                .map(|d| d.and_utc().timestamp_millis())
        })
        .map_err(|_| format!("at: cannot read the time {spec:?} (try +5m, +2h or 2026-12-01T09:00:00Z)"))
}

impl Executor {
    /// A tool from a shell command, its JSON result parsed when it is JSON.
    async fn tool_json(&mut self, sh: &mut Sh, tool: &str, input: Value) -> Result<Value, String> {
        let t = self.shell_tool_call(sh, tool, input).await?;
        Ok(serde_json::from_str(&t).unwrap_or(Value::String(t)))
    }

    pub(super) async fn agent_cmd(&mut self, sh: &mut Sh, name: &str, args: &[String], stdin: String) -> Out {
        let first = args.first().map(String::as_str);
        match name {
            "whoami" => {
                let cfg = self.store.config_value().unwrap_or(Value::Null);
                let did = self.store.meta_get("adf_did").ok().flatten().map(|m| m.value).unwrap_or_default();
                ok(format!(
                    "{}\nhandle: {}\nid: {}\ndid: {did}\n",
                    cfg["name"].as_str().unwrap_or(""),
                    cfg["handle"].as_str().unwrap_or(""),
                    cfg["id"].as_str().unwrap_or("")
                ))
            }
            "env" => {
                let mut v: Vec<_> = sh.env.iter().collect();
                v.sort();
                ok(v.into_iter().map(|(k, v)| format!("{k}={v}\n")).collect::<String>())
            }
            "export" => {
                for a in args {
                    match a.split_once('=') {
                        Some((k, v)) => {
                            sh.env.insert(k.to_string(), v.to_string());
                        }
                        None => return fail(1, format!("export: {a}: use NAME=VALUE")),
                    }
                }
                ok("")
            }
            "date" => date(args),
            "sleep" => {
                let secs: f64 = match first.and_then(|s| s.trim_end_matches('s').parse().ok()) {
                    Some(s) if s >= 0.0 => s,
                    _ => return fail(1, "usage: sleep SECONDS"),
                };
                tokio::time::sleep(Duration::from_secs_f64(secs.min(86_400.0))).await;
                ok("")
            }
            "state" => match first {
                None => ok(format!("{}\n", self.state)),
                Some(s @ ("idle" | "hibernate" | "off")) => {
                    sh.target_state = Some(s.to_string());
                    ok(format!("state will be {s} when this command returns\n"))
                }
                Some(other) => fail(1, format!("state: {other}: use idle, hibernate or off")),
            },
            "status" => self.status(sh).await,
            "config" => self.config_cmd(sh, args).await,
            "meta" => self.meta_cmd(sh, args).await,
            "msg" => self.msg_cmd(sh, args).await,
            "who" => match self.tool_json(sh, "agent_discover", json!({})).await {
                Ok(Value::Array(a)) => {
                    let mut s = String::new();
                    for c in a {
                        let _ = writeln!(
                            s,
                            "{}\t{}\t{}",
                            c["handle"].as_str().or(c["name"].as_str()).unwrap_or("?"),
                            c["source"].as_str().unwrap_or(""),
                            c["did"].as_str().unwrap_or("")
                        );
                    }
                    ok(s)
                }
                Ok(Value::String(t)) => ok(line(&t)),
                Ok(v) => ok(line(&v.to_string())),
                Err(e) => fail(1, format!("who: {e}")),
            },
            "ping" => {
                let Some(target) = first else { return fail(1, "usage: ping AGENT") };
                match self.tool_json(sh, "agent_discover", json!({})).await {
                    Ok(Value::Array(a)) => {
                        let hit = a
                            .iter()
                            .find(|c| [&c["handle"], &c["name"], &c["did"]].iter().any(|v| v.as_str() == Some(target)));
                        match hit {
                            Some(c) => ok(format!(
                                "{target} is reachable ({})\n",
                                c["source"].as_str().or(c["status"].as_str()).unwrap_or("known")
                            )),
                            None => fail(1, format!("ping: {target} is not reachable from here")),
                        }
                    }
                    Ok(_) => fail(1, format!("ping: {target} is not reachable from here")),
                    Err(e) => fail(1, format!("ping: {e}")),
                }
            }
            "curl" | "wget" => self.curl(sh, name, args).await,
            "at" => {
                let (Some(t), Some(payload)) = (
                    first,
                    args.get(1..)
                        .map(|r| r.join(" "))
                        .filter(|p| !p.is_empty())
                        .or_else(|| Some(stdin.trim().to_string()).filter(|s| !s.is_empty())),
                ) else {
                    return fail(1, "usage: at TIME 'PAYLOAD'   (TIME: +5m, +2h, 2026-12-01T09:00:00Z)");
                };
                let at = match when(t, chrono::Utc::now().timestamp_millis()) {
                    Ok(at) => at,
                    Err(e) => return fail(1, e),
                };
                let input = json!({"schedule": {"type": "once", "at": at}, "payload": payload});
                match self.shell_tool_call(sh, "sys_set_timer", input).await {
                    Ok(t) => ok(format!("timer {} at {}\n", timer_id(&t), iso(at))),
                    Err(e) => fail(1, format!("at: {e}")),
                }
            }
            "crontab" => self.crontab(sh, args, stdin).await,
            "node" => match first {
                Some("-e" | "--eval") => {
                    let code = args.get(1..).map(|r| r.join(" ")).unwrap_or_default();
                    let code = if code.is_empty() { stdin } else { code };
                    self.code_out(sh, "sys_code", json!({"code": code})).await
                }
                Some(p) => {
                    let p = super::files::vfs(p);
                    self.node_file(sh, &p, &args[1..]).await
                }
                None if !stdin.is_empty() => self.code_out(sh, "sys_code", json!({"code": stdin})).await,
                None => fail(1, "usage: node -e 'CODE' | node ./file.js [ARGS]"),
            },
            "ps" => {
                let all = first == Some("-a") || first == Some("aux");
                let tasks = self.store.task_list(None).unwrap_or_default();
                let mut s = String::from("ID\tSTATUS\tTOOL\tSTARTED\n");
                for t in tasks.iter().filter(|t| all || !TERMINAL.contains(&t.status.as_str())) {
                    let _ = writeln!(s, "{}\t{}\t{}\t{}", t.id, t.status, t.tool, iso(t.created_at));
                }
                ok(s)
            }
            "kill" => {
                if args.is_empty() {
                    return fail(1, "usage: kill TASK_ID…");
                }
                for id in args.iter().filter(|a| !a.starts_with('-')) {
                    match self.store.task_get(id) {
                        Ok(Some(t)) if !TERMINAL.contains(&t.status.as_str()) => {
                            let _ = self.store.task_set(id, "cancelled", None, Some("Cancelled from the shell"));
                        }
                        Ok(Some(t)) => return fail(1, format!("kill: {id} already {}", t.status)),
                        _ => return fail(1, format!("kill: {id}: no such task")),
                    }
                }
                ok("")
            }
            "wait" => {
                let ids: Vec<String> = if args.is_empty() {
                    self.store
                        .task_list(None)
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|t| t.status == "running")
                        .map(|t| t.id)
                        .collect()
                } else {
                    args.to_vec()
                };
                let mut s = String::new();
                let mut code = 0;
                for id in ids {
                    loop {
                        match self.store.task_get(&id) {
                            Ok(Some(t)) if TERMINAL.contains(&t.status.as_str()) => {
                                let _ = writeln!(s, "{id}\t{}\t{}", t.status, t.result.or(t.error).unwrap_or_default());
                                if t.status != "completed" {
                                    code = 1;
                                }
                                break;
                            }
                            Ok(Some(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
                            _ => return fail(127, format!("wait: {id}: no such task")),
                        }
                    }
                }
                Out { code, stdout: s, stderr: String::new() }
            }
            "adf" => {
                let Some(tool) = first else { return fail(2, "usage: adf <tool> '<json>'") };
                let input = match args.get(1) {
                    Some(j) => match serde_json::from_str::<Value>(j) {
                        Ok(v) => v,
                        Err(e) => return fail(2, format!("adf {tool}: arguments are not JSON: {e}")),
                    },
                    None if !stdin.trim().is_empty() => match serde_json::from_str::<Value>(&stdin) {
                        Ok(v) => v,
                        Err(e) => return fail(2, format!("adf {tool}: stdin is not JSON: {e}")),
                    },
                    None => json!({}),
                };
                if crate::tools::EXCLUDED_FROM_CODE.contains(&tool) {
                    return fail(1, format!("adf {tool}: {tool} cannot be used from the shell"));
                }
                if crate::tools::def(tool).is_none() {
                    return fail(127, format!("adf: {tool}: no such tool"));
                }
                if tool == "sys_set_state" {
                    let s = input["state"].as_str().unwrap_or("");
                    if !["idle", "hibernate", "off"].contains(&s) {
                        return fail(1, "adf sys_set_state: state must be idle, hibernate or off");
                    }
                    sh.target_state = Some(s.to_string());
                    return ok(format!("state will be {s} when this command returns\n"));
                }
                if tool == "adf_shell" {
                    let src = input["command"].as_str().unwrap_or("").to_string();
                    return self.run_nested(sh, &src, Vec::new(), String::new()).await;
                }
                match self.shell_tool_call(sh, tool, input).await {
                    Ok(t) => ok(line(&t)),
                    Err(e) => fail(1, line(&e)),
                }
            }
            other => fail(127, format!("{other}: command not found (help lists the commands)")),
        }
    }

    /// A code tool's text as a command's output.
    async fn code_out(&mut self, sh: &mut Sh, tool: &str, input: Value) -> Out {
        match self.shell_tool_call(sh, tool, input).await {
            Ok(t) => ok(line(&t)),
            Err(e) => fail(1, line(&e)),
        }
    }

    /// `node ./file.js ARGS` / `./file.js`: the file's `main` in the
    /// sandbox, with `{argv: [...]}`.
    pub(super) async fn node_file(&mut self, sh: &mut Sh, path: &str, args: &[String]) -> Out {
        if let Err(e) = self.shell_gate(sh, &["sys_lambda"]).await {
            return e;
        }
        self.code_out(sh, "sys_lambda", json!({"source": path, "args": {"argv": args}})).await
    }

    async fn status(&mut self, sh: &mut Sh) -> Out {
        let cfg = match self.tool_json(sh, "sys_get_config", json!({})).await {
            Ok(v) => v,
            Err(e) => return fail(1, format!("status: {e}")),
        };
        let files = self.store.file_list("").map(|f| f.len()).unwrap_or(0);
        let tasks = self.store.task_list(Some("running")).map(|t| t.len()).unwrap_or(0);
        let timers = self.store.timer_list(false).map(|t| t.len()).unwrap_or(0);
        ok(format!(
            "name: {}\nstate: {}\nmodel: {} / {}\nfiles: {files}\ntimers: {timers}\nrunning tasks: {tasks}\n",
            cfg["name"].as_str().unwrap_or(""),
            self.state,
            cfg.pointer("/model/provider").and_then(Value::as_str).unwrap_or(""),
            cfg.pointer("/model/model_id").and_then(Value::as_str).unwrap_or(""),
        ))
    }

    async fn config_cmd(&mut self, sh: &mut Sh, args: &[String]) -> Out {
        match args.first().map(String::as_str) {
            None | Some("get") => {
                let cfg = match self.tool_json(sh, "sys_get_config", json!({})).await {
                    Ok(v) => v,
                    Err(e) => return fail(1, format!("config: {e}")),
                };
                let v = match args.get(1) {
                    Some(p) => {
                        let ptr = format!("/{}", p.replace('.', "/"));
                        match cfg.pointer(&ptr) {
                            Some(v) => v.clone(),
                            None => return fail(1, format!("config: no {p} in your configuration")),
                        }
                    }
                    None => cfg,
                };
                match v {
                    Value::String(s) => ok(line(&s)),
                    other => ok(line(&serde_json::to_string_pretty(&other).unwrap_or_default())),
                }
            }
            Some("set") => {
                let (Some(path), Some(raw)) = (args.get(1), args.get(2)) else {
                    return fail(1, "usage: config set PATH VALUE");
                };
                let value = serde_json::from_str::<Value>(raw).unwrap_or_else(|_| Value::String(raw.clone()));
                match self.shell_tool_call(sh, "sys_update_config", json!({"path": path, "value": value})).await {
                    Ok(t) => ok(line(&t)),
                    Err(e) => fail(1, line(&e)),
                }
            }
            Some(other) => fail(1, format!("config: {other}: use config get [PATH] or config set PATH VALUE")),
        }
    }

    async fn meta_cmd(&mut self, sh: &mut Sh, args: &[String]) -> Out {
        let r = match args.first().map(String::as_str) {
            None | Some("list") => self.shell_tool_call(sh, "sys_get_meta", json!({})).await,
            Some("get") => match args.get(1) {
                Some(k) => self.shell_tool_call(sh, "sys_get_meta", json!({"key": k})).await,
                None => return fail(1, "usage: meta get KEY"),
            },
            Some("set") => match (args.get(1), args.get(2)) {
                (Some(k), Some(v)) => self.shell_tool_call(sh, "sys_set_meta", json!({"key": k, "value": v})).await,
                _ => return fail(1, "usage: meta set KEY VALUE"),
            },
            Some("delete" | "rm") => match args.get(1) {
                Some(k) => self.shell_tool_call(sh, "sys_delete_meta", json!({"key": k})).await,
                None => return fail(1, "usage: meta delete KEY"),
            },
            Some(k) => self.shell_tool_call(sh, "sys_get_meta", json!({"key": k})).await,
        };
        match r {
            Ok(t) => ok(line(&t)),
            Err(e) => fail(1, line(&e)),
        }
    }

    async fn msg_cmd(&mut self, sh: &mut Sh, args: &[String]) -> Out {
        let o = match getopt("msg", args, "sl") {
            Ok(o) => o,
            Err(e) => return fail(2, e),
        };
        let (tool, input) = match o.pos.first().map(String::as_str) {
            Some("send") => {
                let (Some(to), Some(text)) =
                    (o.pos.get(1), o.pos.get(2..).map(|r| r.join(" ")).filter(|t| !t.is_empty()))
                else {
                    return fail(1, "usage: msg send TO 'TEXT' [-s SUBJECT]");
                };
                let mut input = json!({"recipient": to, "content": text});
                if let Some(s) = o.val("s") {
                    input["subject"] = json!(s);
                }
                if let Err(e) = self.shell_gate(sh, &["msg_send"]).await {
                    return e;
                }
                ("msg_send", input)
            }
            Some("list") => ("msg_list", json!({})),
            Some("read") => {
                let mut input = json!({});
                if o.has("all") || o.has("a") {
                    input["status"] = json!("read");
                }
                if let Some(l) = o.val("l").and_then(|l| l.parse::<u64>().ok()) {
                    input["limit"] = json!(l);
                }
                ("msg_read", input)
            }
            _ => return fail(1, "usage: msg send TO 'TEXT' | msg list | msg read [--all] [-l N]"),
        };
        match self.shell_tool_call(sh, tool, input).await {
            Ok(t) => ok(line(&t)),
            Err(e) => fail(1, line(&e)),
        }
    }

    async fn curl(&mut self, sh: &mut Sh, name: &str, args: &[String]) -> Out {
        let o = match getopt(name, args, "XHdoOAm") {
            Ok(o) => o,
            Err(e) => return fail(2, e),
        };
        let Some(url) = o.pos.first() else { return fail(2, format!("usage: {name} [options] URL")) };
        let mut headers = serde_json::Map::new();
        for h in o.vals("H").iter().chain(o.vals("header")) {
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_string(), json!(v.trim()));
            }
        }
        if let Some(a) = o.val("A") {
            headers.insert("User-Agent".into(), json!(a));
        }
        let body = o.val("d").or(o.val("data")).or(o.val("data-raw")).map(str::to_string);
        let method = o.val("X").or(o.val("request")).map(str::to_uppercase).unwrap_or_else(|| {
            if o.has("I") {
                "HEAD".into()
            } else if body.is_some() {
                "POST".into()
            } else {
                "GET".into()
            }
        });
        let mut input = json!({"url": url, "method": method});
        if !headers.is_empty() {
            input["headers"] = Value::Object(headers);
        }
        if let Some(b) = body {
            input["body"] = json!(b);
        }
        if let Some(m) = o.val("m").and_then(|m| m.parse::<f64>().ok()) {
            input["timeout_ms"] = json!(((m * 1000.0) as u64).clamp(1, 60_000));
        }
        let v = match self.tool_json(sh, "sys_fetch", input).await {
            Ok(v) => v,
            Err(e) => {
                let msg = serde_json::from_str::<Value>(&e)
                    .ok()
                    .and_then(|v| v["error"].as_str().map(str::to_string))
                    .unwrap_or(e);
                return fail(if msg.contains("timed out") { 28 } else { 7 }, format!("{name}: {msg}"));
            }
        };
        let status = v["status"].as_u64().unwrap_or(0);
        let body = v["body"].as_str().unwrap_or("").to_string();
        let mut s = String::new();
        if o.has("i") || o.has("I") {
            let _ = writeln!(s, "HTTP {status} {}", v["statusText"].as_str().unwrap_or(""));
            if let Some(h) = v["headers"].as_object() {
                for (k, val) in h {
                    let _ = writeln!(s, "{k}: {}", val.as_str().unwrap_or(""));
                }
            }
            s.push('\n');
        }
        let out_file = if name == "wget" {
            Some(o.val("O").map(str::to_string).unwrap_or_else(|| {
                url.rsplit('/').next().filter(|b| !b.is_empty()).unwrap_or("index.html").to_string()
            }))
            .filter(|f| f != "-")
        } else {
            o.val("o").map(str::to_string)
        };
        if let Some(f) = out_file {
            let mut input = json!({"mode": "write", "path": super::files::vfs(&f), "content": body});
            if v["_body_encoding"] == "base64" {
                input["encoding"] = json!("base64");
            }
            if let Err(e) = self.shell_tool_call(sh, "fs_write", input).await {
                return fail(23, format!("{name}: {e}"));
            }
        } else if v["_body_encoding"] == "base64" {
            let n = base64::engine::general_purpose::STANDARD.decode(&body).map(|b| b.len()).unwrap_or(0);
            let _ = writeln!(s, "[binary body: {n} bytes — save it with -o FILE]");
        } else {
            s.push_str(&body);
        }
        if (o.has("f") || o.has("fail")) && status >= 400 {
            return Out { code: 22, stdout: String::new(), stderr: format!("{name}: the server answered {status}\n") };
        }
        ok(s)
    }

    async fn crontab(&mut self, sh: &mut Sh, args: &[String], stdin: String) -> Out {
        match args.first().map(String::as_str) {
            Some("-l") => match self.shell_tool_call(sh, "sys_list_timers", json!({})).await {
                Ok(t) if t == "No timers." => ok(""),
                Ok(t) => ok(line(&t)),
                Err(e) => fail(1, format!("crontab: {e}")),
            },
            Some("-r") => {
                let Some(id) = args.get(1).and_then(|i| i.parse::<i64>().ok()) else {
                    return fail(1, "usage: crontab -r TIMER_ID");
                };
                match self.shell_tool_call(sh, "sys_delete_timer", json!({"id": id})).await {
                    Ok(_) => ok(""),
                    Err(e) => fail(1, format!("crontab: {e}")),
                }
            }
            _ => {
                let src = if args.is_empty() { stdin } else { args.join(" ") };
                let mut s = String::new();
                for l in src.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
                    let parts: Vec<&str> = l.split_whitespace().collect();
                    if parts.len() < 6 {
                        return fail(1, format!("crontab: {l:?}: five schedule fields, then the payload"));
                    }
                    let cron = parts[..5].join(" ");
                    let payload = parts[5..].join(" ");
                    let input = json!({"schedule": {"type": "cron", "cron": cron}, "payload": payload});
                    match self.shell_tool_call(sh, "sys_set_timer", input).await {
                        Ok(t) => {
                            let _ = writeln!(s, "timer {} {cron}", timer_id(&t));
                        }
                        Err(e) => return fail(1, format!("crontab: {e}")),
                    }
                }
                ok(s)
            }
        }
    }
}

/// The id in `sys_set_timer`'s answer (`ID: 7`).
fn timer_id(text: &str) -> String {
    text.lines().find_map(|l| l.strip_prefix("ID: ")).unwrap_or("?").to_string()
}

fn iso(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map(|d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string()).unwrap_or_default()
}

fn date(args: &[String]) -> Out {
    let mut when = chrono::Utc::now();
    let mut fmt: Option<String> = None;
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        match a.as_str() {
            "-u" | "--utc" => {}
            "-I" | "--iso-8601" => fmt = Some("%Y-%m-%d".into()),
            "-R" => fmt = Some("%a, %d %b %Y %H:%M:%S +0000".into()),
            "-d" | "--date" => {
                let Some(d) = args.get(i + 1) else { return fail(1, "date: -d needs a date") };
                let parsed = if let Some(e) = d.strip_prefix('@') {
                    e.parse::<i64>().ok().and_then(|s| chrono::DateTime::from_timestamp(s, 0))
                } else {
                    chrono::DateTime::parse_from_rfc3339(d).map(|x| x.to_utc()).ok().or_else(|| {
                        chrono::NaiveDate::parse_from_str(d, "%Y-%m-%d")
                            .ok()
                            .and_then(|x| x.and_hms_opt(0, 0, 0))
                            .map(|x| x.and_utc())
                    })
                };
                let Some(p) = parsed else { return fail(1, format!("date: invalid date {d:?}")) };
                when = p;
                i += 1;
            }
            f if f.starts_with('+') => fmt = Some(f[1..].to_string()),
            other => return fail(1, format!("date: unknown option {other}")),
        }
        i += 1;
    }
    let fmt = fmt.unwrap_or_else(|| "%a %b %e %H:%M:%S UTC %Y".into());
    let mut s = String::new();
    if write!(s, "{}", when.format(&fmt)).is_err() {
        return fail(1, format!("date: bad format {fmt:?}"));
    }
    s.push('\n');
    ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_times() {
        assert_eq!(when("+5m", 1_000), Ok(301_000));
        assert_eq!(when("now + 2 hours", 0), Ok(7_200_000));
        assert_eq!(when("2026-12-01T09:00:00Z", 0), Ok(1_796_115_600_000));
        assert!(when("+5 weeks", 0).is_err());
        assert!(when("tomorrowish", 0).is_err());
    }

    #[test]
    fn date_formats() {
        assert_eq!(date(&["-d".into(), "@0".into(), "+%Y-%m-%d".into()]).stdout, "1970-01-01\n");
        assert_eq!(date(&["-d".into(), "2026-02-03".into(), "-I".into()]).stdout, "2026-02-03\n");
        assert_eq!(date(&["-d".into(), "nope".into()]).code, 1);
    }
}
