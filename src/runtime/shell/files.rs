//! The file commands of the shell over the agent's own files (`adf_files`,
//! a flat namespace where folders are path prefixes): reading as text
//! (documents become their text, images are attached for the model,
//! other binaries are named, not dumped), writing through `fs_write` so
//! protections, audit and `on_file_change` apply, and `ls rm cp mv touch
//! mkdir find du chmod unzip yq`.

use std::fmt::Write as _;

use base64::Engine as _;
use serde_json::{Value, json};

use super::text::getopt;
use super::{Out, Sh, fail, ok};
use crate::protocol::kind;
use crate::runtime::executor::{Decision, Executor};
use crate::store::Caller;
use crate::store::files::Protection;

/// A path as the shell names it → the file's path (`./a`, `/a` → `a`).
pub(super) fn vfs(p: &str) -> String {
    let p = p.trim_start_matches("./").trim_start_matches('/');
    if p == "." { String::new() } else { p.to_string() }
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 20 => format!("{:.1}M", n as f64 / (1 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1}K", n as f64 / 1024.0),
        n => n.to_string(),
    }
}

/// The text of a binary document (PDF, DOCX, spreadsheet, zip listing);
/// `None` for anything else (text files are shown as they are).
pub(super) fn document_text(path: &str, bytes: &[u8]) -> Option<Result<String, String>> {
    use crate::docs::DocKind;
    match crate::docs::kind_of(path, bytes)? {
        DocKind::Pdf | DocKind::Docx | DocKind::Spreadsheet | DocKind::Zip => {
            Some(crate::docs::to_text(path, bytes).map_err(|e| e.to_string()))
        }
        DocKind::Csv | DocKind::Yaml => None,
    }
}

impl Executor {
    fn shell_caller(sh: &Sh) -> Caller {
        Caller::Agent { authorized: sh.authorized, override_approved: false }
    }

    /// A file's text as the shell shows it.
    pub(super) fn shell_read_text(&self, sh: &mut Sh, path: &str) -> Result<String, String> {
        let path = vfs(path);
        let (entry, bytes) = match self.store.file_read(&path) {
            Ok(x) => x,
            Err(_) => return Err(format!("{path}: No such file")),
        };
        let mime = entry.mime_type.clone().unwrap_or_default();
        if let Some(text) = document_text(&path, &bytes) {
            return text;
        }
        if entry.is_text() || (!bytes.contains(&0) && std::str::from_utf8(&bytes).is_ok()) {
            return String::from_utf8(bytes).map_err(|_| format!("{path}: not UTF-8 text"));
        }
        if ["image/", "audio/", "video/"].iter().any(|m| mime.starts_with(m)) {
            if !sh.media.iter().any(|m| m["path"] == path.as_str()) {
                sh.media.push(json!({"path": path, "mime_type": mime}));
            }
            // Named as fs_read names it; the runtime attaches the file itself
            // when the model takes this kind of media.
            let kind = mime.split('/').next().unwrap_or("media");
            return Ok(format!("[{kind}: {path} ({mime}, {} bytes)]\n", bytes.len()));
        }
        Ok(format!("[binary: {path}, {} bytes, {mime} — not shown]\n", bytes.len()))
    }

    /// Write (or append) through `fs_write`.
    pub(super) async fn shell_write(
        &mut self,
        sh: &mut Sh,
        path: &str,
        body: &str,
        append: bool,
    ) -> Result<(), String> {
        let input = json!({"mode": if append { "append" } else { "write" }, "path": vfs(path), "content": body});
        self.shell_tool_call(sh, "fs_write", input).await.map(|_| ())
    }

    /// A tool call made by a command (already gated). A protection denial
    /// asks the owner once, from the model's loop.
    pub(super) async fn shell_tool_call(&mut self, sh: &mut Sh, tool: &str, input: Value) -> Result<String, String> {
        let cx =
            crate::runtime::code::CodeCx { authorized: sh.authorized, source: "adf_shell".into(), chain: Vec::new() };
        let out = Box::pin(self.code_tool(&cx, tool, &input, false)).await;
        if !out.is_error {
            return Ok(out.content);
        }
        let Some(d) = out.denial.clone().filter(|_| sh.interactive) else { return Err(out.content) };
        let id = format!("{}:{tool}:protection", sh.call_id);
        let asked = std::time::Instant::now();
        let r = self.request_approval(tool, &id, &input, "protection", Some(d), None, "agent:shell").await;
        sh.deadline.fetch_add(asked.elapsed().as_millis() as i64, std::sync::atomic::Ordering::Relaxed);
        match r {
            Ok((task_id, Decision::Approve { .. })) => {
                let out = Box::pin(self.code_tool(&cx, tool, &input, true)).await;
                let _ = self.store.task_set(&task_id, if out.is_error { "failed" } else { "completed" }, None, None);
                if out.is_error { Err(out.content) } else { Ok(out.content) }
            }
            _ => Err(format!("{} The owner did not approve an override.", out.content)),
        }
    }

    pub(super) async fn files_cmd(&mut self, sh: &mut Sh, name: &str, args: &[String], stdin: String) -> Out {
        match name {
            "ls" => self.ls(args),
            "find" => self.find(args),
            "du" => self.du(args),
            "mkdir" | "touch" if args.is_empty() => fail(1, format!("{name}: missing operand")),
            "mkdir" => ok(""),
            "touch" => {
                for p in args.iter().filter(|a| !a.starts_with('-')) {
                    let p = vfs(p);
                    if matches!(self.store.file_stat(&p), Ok(Some(_))) {
                        continue;
                    }
                    if let Err(e) = self.shell_write(sh, &p, "", false).await {
                        return fail(1, format!("touch: {e}"));
                    }
                }
                ok("")
            }
            "rm" => {
                let o = match getopt("rm", args, "") {
                    Ok(o) => o,
                    Err(e) => return fail(2, e),
                };
                if o.pos.is_empty() {
                    return fail(1, "rm: missing operand");
                }
                for p in &o.pos {
                    let p = vfs(p);
                    let targets: Vec<String> = if o.has("r") || o.has("R") {
                        let under = self.store.file_list(&format!("{}/", p.trim_end_matches('/'))).unwrap_or_default();
                        let mut t: Vec<String> = under.into_iter().map(|f| f.path).collect();
                        if matches!(self.store.file_stat(&p), Ok(Some(_))) {
                            t.push(p.clone());
                        }
                        t
                    } else {
                        vec![p.clone()]
                    };
                    if targets.is_empty() || !matches!(self.store.file_stat(&targets[0]), Ok(Some(_))) {
                        if o.has("f") {
                            continue;
                        }
                        return fail(1, format!("rm: cannot remove '{p}': No such file"));
                    }
                    for t in targets {
                        if let Err(e) = self.shell_tool_call(sh, "fs_delete", json!({"path": t})).await {
                            return fail(1, format!("rm: {e}"));
                        }
                    }
                }
                ok("")
            }
            "cp" | "mv" => {
                let pos: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
                let [src, dst] = pos.as_slice() else { return fail(1, format!("usage: {name} SRC DST")) };
                let (src, mut dst) = (vfs(src), vfs(dst));
                if dst.is_empty() || dst.ends_with('/') {
                    let base = src.rsplit('/').next().unwrap_or(&src).to_string();
                    dst = format!("{dst}{base}");
                }
                if name == "mv" {
                    let caller = Self::shell_caller(sh);
                    if matches!(self.store.file_stat(&dst), Ok(Some(_)))
                        && let Err(e) = self.shell_tool_call(sh, "fs_delete", json!({"path": dst})).await
                    {
                        return fail(1, format!("mv: {e}"));
                    }
                    return match self.store.file_rename(caller, &src, &dst) {
                        Ok(()) => {
                            self.emit(kind::FILE_DELETED, "agent:shell", json!({"path": src}));
                            self.emit(kind::FILE_WRITTEN, "agent:shell", json!({"path": dst}));
                            ok("")
                        }
                        Err(e) => fail(1, format!("mv: {e}")),
                    };
                }
                let (entry, bytes) = match self.store.file_read(&src) {
                    Ok(x) => x,
                    Err(_) => return fail(1, format!("cp: {src}: No such file")),
                };
                let mut input = json!({"mode": "write", "path": dst});
                match String::from_utf8(bytes) {
                    Ok(t) if entry.is_text() => input["content"] = json!(t),
                    Ok(t) => {
                        input["content"] = json!(base64::engine::general_purpose::STANDARD.encode(t.as_bytes()));
                        input["encoding"] = json!("base64");
                    }
                    Err(e) => {
                        input["content"] = json!(base64::engine::general_purpose::STANDARD.encode(e.as_bytes()));
                        input["encoding"] = json!("base64");
                    }
                }
                if let Some(m) = entry.mime_type {
                    input["mime_type"] = json!(m);
                }
                match self.shell_tool_call(sh, "fs_write", input).await {
                    Ok(_) => ok(""),
                    Err(e) => fail(1, format!("cp: {e}")),
                }
            }
            "chmod" => self.chmod(sh, args).await,
            "unzip" => self.unzip(sh, args).await,
            // `yq [-r] [-c] [FILTER] [FILE]`: YAML read as JSON, then a jq
            // filter (jaq) over it; one argument naming a file is the file.
            "yq" => {
                let (flags, mut pos): (Vec<String>, Vec<String>) =
                    args.iter().cloned().partition(|a| a.starts_with('-'));
                let file = match pos.len() {
                    0 => None,
                    1 if matches!(self.store.file_stat(&vfs(&pos[0])), Ok(Some(_))) => pos.pop(),
                    1 => None,
                    _ => Some(pos.remove(1)),
                };
                let text = match file {
                    Some(p) => match self.shell_read_text(sh, &p) {
                        Ok(t) => t,
                        Err(e) => return fail(1, format!("yq: {e}")),
                    },
                    None => stdin,
                };
                let json = match crate::docs::yaml_to_json(&text) {
                    Ok(v) => v.to_string(),
                    Err(e) => return fail(1, format!("yq: {e}")),
                };
                let mut jq_args = flags;
                jq_args.push(pos.pop().unwrap_or_else(|| ".".into()));
                let mut out = super::data::jq(&jq_args, &json, |p| Err(format!("{p}: yq reads one file")));
                out.stderr = out.stderr.replace("jq:", "yq:");
                out
            }
            _ => fail(127, format!("{name}: command not found")),
        }
    }

    fn ls(&self, args: &[String]) -> Out {
        let o = match getopt("ls", args, "") {
            Ok(o) => o,
            Err(e) => return fail(2, e),
        };
        let prefixes = if o.pos.is_empty() { vec![String::new()] } else { o.pos.iter().map(|p| vfs(p)).collect() };
        let mut s = String::new();
        for p in prefixes {
            let exact = self.store.file_stat(&p).ok().flatten();
            let files = match exact {
                Some(e) => vec![e],
                None => {
                    let pre = if p.is_empty() || p.ends_with('/') { p.clone() } else { format!("{p}/") };
                    let v = self.store.file_list(&pre).unwrap_or_default();
                    if v.is_empty() && !p.is_empty() {
                        return fail(2, format!("ls: cannot access '{p}': No such file or folder"));
                    }
                    v
                }
            };
            for f in files {
                if !o.has("a") && f.path.rsplit('/').next().is_some_and(|b| b.starts_with('.')) {
                    continue;
                }
                if o.has("l") {
                    let _ = writeln!(
                        s,
                        "{:<9} {:>8} {} {}",
                        f.protection.as_str(),
                        if o.has("h") { human(f.size) } else { f.size.to_string() },
                        f.updated_at.get(..19).unwrap_or(&f.updated_at),
                        f.path
                    );
                } else {
                    let _ = writeln!(s, "{}", f.path);
                }
            }
        }
        ok(s)
    }

    fn find(&self, args: &[String]) -> Out {
        let mut root = String::new();
        let mut name: Option<glob::Pattern> = None;
        let mut min: Option<u64> = None;
        let mut max: Option<u64> = None;
        let mut i = 0;
        while i < args.len() {
            let a = args[i].as_str();
            let v = args.get(i + 1);
            match a {
                "-name" | "-iname" => {
                    let Some(p) = v.and_then(|p| glob::Pattern::new(p).ok()) else {
                        return fail(1, "find: -name needs a pattern");
                    };
                    name = Some(p);
                    i += 2;
                }
                "-type" => i += 2,
                "-size" => {
                    let Some(s) = v else { return fail(1, "find: -size needs a size") };
                    let (sign, num) = s.split_at(if s.starts_with(['+', '-']) { 1 } else { 0 });
                    let mult = match num.chars().last() {
                        Some('k' | 'K') => 1024,
                        Some('M') => 1 << 20,
                        Some('G') => 1 << 30,
                        _ => 1,
                    };
                    let n: u64 = num.trim_end_matches(|c: char| c.is_alphabetic()).parse().unwrap_or(0) * mult;
                    match sign {
                        "+" => min = Some(n + 1),
                        "-" => max = Some(n.saturating_sub(1)),
                        _ => {
                            min = Some(n);
                            max = Some(n);
                        }
                    }
                    i += 2;
                }
                _ if a.starts_with('-') => return fail(1, format!("find: unknown predicate {a}")),
                _ => {
                    root = vfs(a);
                    i += 1;
                }
            }
        }
        let pre = if root.is_empty() || root.ends_with('/') { root.clone() } else { format!("{root}/") };
        let mut files = self.store.file_list(&pre).unwrap_or_default();
        if let Ok(Some(e)) = self.store.file_stat(&root) {
            files.push(e);
        }
        let mut s = String::new();
        for f in files {
            let base = f.path.rsplit('/').next().unwrap_or(&f.path);
            if name.as_ref().is_some_and(|p| !p.matches(base))
                || min.is_some_and(|m| f.size < m)
                || max.is_some_and(|m| f.size > m)
            {
                continue;
            }
            let _ = writeln!(s, "{}", f.path);
        }
        ok(s)
    }

    fn du(&self, args: &[String]) -> Out {
        let h = args.iter().any(|a| a.starts_with('-') && a.contains('h'));
        let summarize = args.iter().any(|a| a.starts_with('-') && a.contains('s'));
        let root = args.iter().find(|a| !a.starts_with('-')).map(|a| vfs(a)).unwrap_or_default();
        let files = self.store.file_list(&root).unwrap_or_default();
        let size = |n: u64| if h { human(n) } else { n.div_ceil(1024).to_string() };
        let mut s = String::new();
        let total: u64 = files.iter().map(|f| f.size).sum();
        if !summarize {
            for f in &files {
                let _ = writeln!(s, "{}\t{}", size(f.size), f.path);
            }
        }
        let _ = writeln!(s, "{}\t{}", size(total), if root.is_empty() { "." } else { &root });
        ok(s)
    }

    /// `chmod +p[=level] FILE` protects; `-p` unprotects. Adding a
    /// protection to an unprotected file is the agent's to do; changing or
    /// removing one needs the owner (approval from the loop).
    async fn chmod(&mut self, sh: &mut Sh, args: &[String]) -> Out {
        let [mode, files @ ..] = args else { return fail(1, "usage: chmod +p[=read_only|no_delete]|-p FILE…") };
        let level = match mode.as_str() {
            "+p" | "+p=read_only" => Protection::ReadOnly,
            "+p=no_delete" => Protection::NoDelete,
            "-p" | "+p=none" => Protection::None,
            other => return fail(1, format!("chmod: unknown mode {other}; use +p, +p=no_delete or -p")),
        };
        if files.is_empty() {
            return fail(1, "chmod: missing file");
        }
        for f in files {
            let p = vfs(f);
            let current = match self.store.file_stat(&p) {
                Ok(Some(e)) => e.protection,
                _ => return fail(1, format!("chmod: {p}: No such file")),
            };
            if current == level {
                continue;
            }
            let mut caller = Caller::Agent { authorized: true, override_approved: false };
            if current != Protection::None && !sh.authorized {
                if !sh.interactive {
                    return fail(130, format!("chmod: changing the protection of {p} needs the owner's approval"));
                }
                let id = format!("{}:chmod:{p}", sh.call_id);
                let input = json!({"path": p, "protection": level.as_str(), "command": sh.command});
                let r = self.request_approval("chmod", &id, &input, "protection", None, None, "agent:shell").await;
                match r {
                    Ok((task_id, Decision::Approve { .. })) => {
                        let _ = self.store.task_set(&task_id, "completed", Some("approved"), None);
                        caller = Caller::Agent { authorized: false, override_approved: true };
                    }
                    _ => return fail(130, format!("chmod: the owner did not approve changing {p}. Do not retry.")),
                }
            }
            if let Err(e) = self.store.file_set_protection(caller, &p, level) {
                return fail(1, format!("chmod: {e}"));
            }
        }
        ok("")
    }

    async fn unzip(&mut self, sh: &mut Sh, args: &[String]) -> Out {
        let o = match getopt("unzip", args, "d") {
            Ok(o) => o,
            Err(e) => return fail(2, e),
        };
        let Some(archive) = o.pos.first().map(|p| vfs(p)) else { return fail(1, "usage: unzip [-l] ARCHIVE [-d DIR]") };
        let bytes = match self.store.file_read(&archive) {
            Ok((_, b)) => b,
            Err(_) => return fail(1, format!("unzip: {archive}: No such file")),
        };
        if o.has("l") {
            return match crate::docs::zip_list(&archive, &bytes) {
                Ok(entries) => {
                    let mut s = String::new();
                    for e in entries {
                        let _ = writeln!(s, "{:>10}  {}", e.size, e.name);
                    }
                    ok(s)
                }
                Err(e) => fail(1, format!("unzip: {archive}: {e}")),
            };
        }
        let dest = o.val("d").map(vfs).unwrap_or_default();
        let entries = match crate::docs::zip_extract(&archive, &bytes, &crate::docs::ZipLimits::default()) {
            Ok(e) => e,
            Err(e) => return fail(1, format!("unzip: {archive}: {e}")),
        };
        let mut s = String::new();
        for (name, data) in entries {
            let path = if dest.is_empty() { name } else { format!("{}/{name}", dest.trim_end_matches('/')) };
            let mut input = json!({"mode": "write", "path": path});
            match String::from_utf8(data) {
                Ok(t) => input["content"] = json!(t),
                Err(e) => {
                    input["content"] = json!(base64::engine::general_purpose::STANDARD.encode(e.as_bytes()));
                    input["encoding"] = json!("base64");
                }
            }
            if let Err(e) = self.shell_tool_call(sh, "fs_write", input).await {
                return Out { code: 1, stdout: s, stderr: format!("unzip: {e}\n") };
            }
            let _ = writeln!(s, "  inflating: {path}");
        }
        ok(s)
    }
}
