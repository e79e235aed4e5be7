//! The command table: which tools each command needs (the pre-flight gate
//! of runtime.md §8.8, refined by its arguments where they decide it), one
//! line of help per command, and dispatch to the families (`text`, `files`,
//! `data`, `agent`).

use super::text::{self, Vfs};
use super::{Out, Sh, fail, ok};
use crate::runtime::executor::Executor;

/// (name, tools, help).
pub(super) const COMMANDS: &[(&str, &[&str], &str)] = &[
    ("cat", &["fs_read"], "cat [-n] [--text] FILE…      print files (documents as text)"),
    ("ls", &["fs_list"], "ls [-l] [-a] [PREFIX]          list files"),
    ("rm", &["fs_delete"], "rm [-f] FILE…                 delete files"),
    ("cp", &["fs_read", "fs_write"], "cp SRC DST                    copy a file"),
    ("mv", &["fs_read", "fs_write"], "mv SRC DST                    rename a file"),
    ("touch", &["fs_write"], "touch FILE…                   create empty files"),
    ("mkdir", &[], "mkdir DIR                     folders exist as path prefixes (no-op)"),
    ("find", &[], "find [PREFIX] [-name GLOB] [-type f] [-size +N[k|M]]"),
    ("du", &[], "du [-h] [PREFIX]              sizes of files"),
    ("chmod", &["fs_write"], "chmod +p[=read_only|no_delete]|-p FILE   file protection"),
    ("head", &["fs_read"], "head [-n N] [FILE…]"),
    ("tail", &["fs_read"], "tail [-n N|+N] [FILE…]"),
    ("grep", &["fs_read"], "grep [-ivnclrEFowxhq] [-m N] [-e PAT] PAT [FILE…]"),
    ("sed", &["fs_read"], "sed [-n] [-E] [-i] 's/re/rep/g; /re/d; N,Mp; q' [FILE…]"),
    ("sort", &["fs_read"], "sort [-rnuf] [-t SEP] [-k N] [FILE…]"),
    ("uniq", &["fs_read"], "uniq [-cdui] [FILE]"),
    ("wc", &["fs_read"], "wc [-lwcm] [FILE…]"),
    ("cut", &["fs_read"], "cut -d SEP -f LIST | -c LIST [FILE…]"),
    ("tr", &[], "tr [-ds] SET1 [SET2]"),
    ("tee", &["fs_write"], "tee [-a] FILE…"),
    ("rev", &[], "rev [FILE…]"),
    ("tac", &[], "tac [FILE…]"),
    ("diff", &["fs_read"], "diff [-u] FILE1 FILE2           unified diff, exit 1 when they differ"),
    ("xargs", &[], "xargs [-n N] [-I {}] COMMAND…   run a command with stdin's words"),
    ("seq", &[], "seq [FIRST [STEP]] LAST"),
    ("printf", &[], "printf FORMAT [ARG…]"),
    ("jq", &[], "jq [-r] [-c] [-s] [-n] [--arg K V] FILTER [FILE]"),
    ("sqlite3", &["db_query"], "sqlite3 [-json|-csv|-header] [DB] 'SQL'   your own database, through the SQL guard"),
    ("unzip", &["fs_read"], "unzip [-l] ARCHIVE [-d DIR]     list or extract a zip among your files"),
    ("yq", &["fs_read"], "yq [-r] [FILTER] [FILE]        YAML as JSON, through a jq filter"),
    ("msg", &[], "msg send TO 'TEXT' | msg list | msg read [--all]"),
    ("who", &["agent_discover"], "who                            agents you can reach"),
    ("ping", &["agent_discover"], "ping AGENT                     is an agent reachable"),
    ("curl", &["sys_fetch"], "curl [-X M] [-H 'K: V'] [-d BODY] [-o FILE] [-s] [-i] URL"),
    ("wget", &["sys_fetch"], "wget [-O FILE] URL"),
    ("at", &["sys_set_timer"], "at TIME|+N[s|m|h|d] 'PAYLOAD'   a one-shot timer"),
    ("crontab", &["sys_list_timers"], "crontab -l | -r ID | 'CRON PAYLOAD' (stdin lines)"),
    ("node", &["sys_code"], "node -e 'CODE' | node ./file.js [ARGS]   run JavaScript in the sandbox"),
    ("ps", &[], "ps                             background tasks"),
    ("kill", &[], "kill TASK_ID                   cancel a background task"),
    ("wait", &[], "wait [TASK_ID…]                wait for background tasks"),
    ("whoami", &[], "whoami                         your name, handle and DID"),
    ("config", &["sys_get_config"], "config get [PATH] | config set PATH VALUE"),
    ("status", &["sys_get_config"], "status                         state, model, counts"),
    ("state", &[], "state [idle|hibernate|off]     read or change your state (ends the turn)"),
    ("meta", &["sys_get_meta"], "meta [get KEY] | meta set KEY VALUE | meta delete KEY"),
    ("env", &[], "env                            shell variables"),
    ("export", &[], "export NAME=VALUE              set a variable for this invocation"),
    ("pwd", &[], "pwd                            always / (a flat filesystem)"),
    ("cd", &[], "cd                             only / exists"),
    ("date", &[], "date [-u] [-I] [-d DATE] [+FORMAT]"),
    ("help", &[], "help [COMMAND]"),
    ("echo", &[], "echo [-n] [-e] TEXT…"),
    ("true", &[], "true"),
    ("false", &[], "false"),
    ("sleep", &[], "sleep SECONDS"),
    ("adf", &[], "adf TOOL '<json>'              call any of your tools"),
];

/// The tools a command needs before it runs.
pub(super) fn tools_for(name: &str, args: &[String]) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = COMMANDS.iter().find(|c| c.0 == name).map(|c| c.1.to_vec()).unwrap_or_default();
    let first = args.first().map(String::as_str);
    match name {
        "sed" if args.iter().any(|a| a == "-i") => v.push("fs_write"),
        "unzip" if !args.iter().any(|a| a == "-l") => v.push("fs_write"),
        "crontab" => match first {
            Some("-l") => {}
            Some("-r") => v = vec!["sys_delete_timer"],
            _ => v = vec!["sys_set_timer"],
        },
        "node" if first.is_some_and(|f| f != "-e" && f != "--eval") => v = vec!["sys_lambda"],
        "config" if first == Some("set") => v = vec!["sys_update_config"],
        "meta" => match first {
            Some("set") => v = vec!["sys_set_meta"],
            Some("delete" | "rm") => v = vec!["sys_delete_meta"],
            _ => {}
        },
        "msg" => match first {
            Some("send") => v.push("msg_send"),
            Some("list") => v.push("msg_list"),
            Some("read") => v.push("msg_read"),
            _ => {}
        },
        "state" if first.is_some() => v.push("sys_set_state"),
        "adf" => {
            if let Some(t) = first.and_then(crate::tools::def) {
                v.push(t.name);
            }
        }
        _ if name.starts_with("./") && [".js", ".ts", ".mjs"].iter().any(|e| name.ends_with(e)) => v.push("sys_lambda"),
        _ => {}
    }
    v
}

/// Text commands read through this.
pub(super) struct ShellFs<'a> {
    pub ex: &'a Executor,
    pub sh: &'a mut Sh,
}

impl Vfs for ShellFs<'_> {
    fn read(&mut self, path: &str) -> Result<String, String> {
        self.ex.shell_read_text(self.sh, path)
    }
    fn list(&mut self, prefix: &str) -> Vec<String> {
        self.ex.store.file_list(prefix).map(|v| v.into_iter().map(|f| f.path).collect()).unwrap_or_default()
    }
}

impl Executor {
    /// Run one command by name.
    pub(super) async fn run_command(&mut self, sh: &mut Sh, name: &str, args: &[String], stdin: String) -> Out {
        let full = sh.full;
        let text_out = {
            let mut fs = ShellFs { ex: self, sh };
            text::run(name, args, &stdin, &mut fs, full)
        };
        if let Some(t) = text_out {
            sh.truncated |= t.truncated;
            let mut out = t.out;
            for (path, body, append) in t.writes {
                if let Err(e) = self.shell_write(sh, &path, &body, append).await {
                    out.code = 1;
                    out.stderr.push_str(&format!("{name}: {e}\n"));
                }
            }
            return out;
        }
        match name {
            "cat" | "ls" | "rm" | "cp" | "mv" | "touch" | "mkdir" | "find" | "du" | "chmod" | "unzip" | "yq" => {
                self.files_cmd(sh, name, args, stdin).await
            }
            "jq" => match super::data::JqJob::new(args, &stdin, |p| self.shell_read_text(sh, p)) {
                Ok(job) => job.run_off_runtime().await,
                Err(out) => out,
            },
            "sqlite3" => self.sqlite3(sh, args, stdin).await,
            "xargs" => self.xargs(sh, args, stdin).await,
            "help" => help(args),
            "true" | ":" => ok(""),
            "false" => fail(1, ""),
            "pwd" => ok("/\n"),
            "cd" => match args.first().map(String::as_str) {
                None | Some("/" | "." | "~") => ok(""),
                Some(d) => fail(1, format!("cd: {d}: the filesystem is flat; paths are relative to /")),
            },
            _ if name.starts_with("./") || name.ends_with(".sh") => self.script(sh, name, args, stdin).await,
            _ => self.agent_cmd(sh, name, args, stdin).await,
        }
    }

    /// `xargs [-n N] [-I R] CMD ARGS…`: the command once per batch of
    /// stdin's words (each run gated on its own).
    async fn xargs(&mut self, sh: &mut Sh, args: &[String], stdin: String) -> Out {
        let mut i = 0;
        let mut per: Option<usize> = None;
        let mut replace: Option<String> = None;
        while i < args.len() {
            match args[i].as_str() {
                "-n" => {
                    per = args.get(i + 1).and_then(|n| n.parse().ok());
                    i += 2;
                }
                "-I" => {
                    replace = args.get(i + 1).cloned();
                    i += 2;
                }
                "-0" | "-r" | "--no-run-if-empty" => i += 1,
                _ => break,
            }
        }
        let cmd: Vec<String> = if i < args.len() { args[i..].to_vec() } else { vec!["echo".into()] };
        let items: Vec<String> = if replace.is_some() {
            stdin.lines().filter(|l| !l.is_empty()).map(str::to_string).collect()
        } else {
            stdin.split_whitespace().map(str::to_string).collect()
        };
        if items.is_empty() {
            return ok("");
        }
        let batches: Vec<Vec<String>> = match (&replace, per) {
            (Some(_), _) => items.into_iter().map(|x| vec![x]).collect(),
            (None, Some(n)) if n > 0 => items.chunks(n).map(<[String]>::to_vec).collect(),
            _ => vec![items],
        };
        let mut all = Out::default();
        for b in batches {
            let words: Vec<String> = match &replace {
                Some(r) => cmd.iter().map(|w| w.replace(r.as_str(), &b[0])).collect(),
                None => cmd.iter().cloned().chain(b).collect(),
            };
            let (name, rest) = (words[0].clone(), words[1..].to_vec());
            if let Err(e) = self.shell_gate(sh, &tools_for(&name, &rest)).await {
                all.stderr.push_str(&e.stderr);
                all.code = e.code;
                return all;
            }
            let out = Box::pin(self.run_command(sh, &name, &rest, String::new())).await;
            all.stdout.push_str(&out.stdout);
            all.stderr.push_str(&out.stderr);
            if out.code != 0 {
                all.code = 123;
            }
        }
        all
    }

    /// `./script.sh ARGS` (a shell file of the agent) or `./x.js`.
    async fn script(&mut self, sh: &mut Sh, name: &str, args: &[String], stdin: String) -> Out {
        let path = name.trim_start_matches("./");
        if path.ends_with(".js") || path.ends_with(".ts") || path.ends_with(".mjs") {
            return self.node_file(sh, path, args).await;
        }
        let src = match self.store.file_read_text(path) {
            Ok(t) => t,
            Err(_) => return fail(127, format!("{name}: no such file among your files")),
        };
        let authorized = self.file_authorized(path);
        let was = sh.authorized;
        sh.authorized = was || authorized;
        let saved_name = std::mem::replace(&mut sh.name, path.to_string());
        let out = self.run_nested(sh, &src, args.to_vec(), stdin).await;
        sh.name = saved_name;
        sh.authorized = was;
        out
    }
}

fn help(args: &[String]) -> Out {
    if let Some(c) = args.first() {
        return match COMMANDS.iter().find(|x| x.0 == c) {
            Some((_, tools, h)) => ok(format!(
                "{h}\n{}\n",
                if tools.is_empty() { "needs no tool".to_string() } else { format!("needs: {}", tools.join(", ")) }
            )),
            None => fail(1, format!("help: no command {c}")),
        };
    }
    let mut s = String::from(
        "A virtual shell over your own files and tools (flat filesystem, / is the root).\n\
         Pipes, && || ;, redirects (> >> < 2>&1 &>), $VAR, $(cmd), heredocs, globs.\n\
         No if/for/while, subshells or functions: use sys_code for logic.\n\n",
    );
    for (_, _, h) in COMMANDS {
        s.push_str(h);
        s.push('\n');
    }
    ok(s)
}
