//! `compute_exec` and `fs_transfer` (tools.md §2, §5) in the executor:
//! the target resolved and gated (fail closed, `runtime/compute`), then the
//! host (its programs checked with the shell grammar) or a container
//! (`compute/containers.rs`). Every command is logged (`compute`/`exec`)
//! with its target and exit code, which the app's compute panel reads.

use serde_json::{Value, json};

use super::Executor;
use crate::runtime::compute::{self, Settings, Target, containers};
use crate::store::Caller;
use crate::tools::ToolOutput;

/// Which target a call means, or why none can serve it.
async fn compute_target(cfg: &Value, settings: &Settings, asked: Option<&str>) -> Result<Target, String> {
    let engine = containers::engine_for(settings).await.map(|_| ());
    compute::resolve(cfg, settings, engine, asked)
}

impl Executor {
    pub(crate) async fn compute_tool(&mut self, name: &str, input: &Value) -> ToolOutput {
        let cfg = match self.store.config_value() {
            Ok(c) => c,
            Err(e) => return ToolOutput::err(e.to_string()),
        };
        match name {
            "compute_exec" => self.compute_exec(&cfg, input).await,
            "fs_transfer" => self.fs_transfer(&cfg, input).await,
            _ => ToolOutput::err(format!("Unknown tool: {name}")),
        }
    }

    async fn compute_exec(&mut self, cfg: &Value, input: &Value) -> ToolOutput {
        let command = input["command"].as_str().unwrap_or_default();
        if command.trim().is_empty() {
            return ToolOutput::err("command is required");
        }
        let settings = Settings::load();
        let target = match compute_target(cfg, &settings, input["target"].as_str()).await {
            Ok(t) => t,
            Err(e) => return ToolOutput::err(e),
        };
        if target == Target::Host
            && let Err(e) = compute::check_host(&settings.host, command)
        {
            let _ = self.log("warn", "compute", "refused", &format!("host: {e}"));
            return ToolOutput::err(e);
        }
        let limit = cfg["limits"]["execution_timeout_ms"].as_u64().unwrap_or(60_000);
        let ms = input["timeout_ms"]
            .as_u64()
            .unwrap_or(compute::DEFAULT_TIMEOUT_MS)
            .clamp(1, compute::MAX_TIMEOUT_MS)
            .min(limit.max(1_000));
        let timeout = std::time::Duration::from_millis(ms);
        let me = self.agent_id().to_string();
        let r = match &target {
            Target::Host => compute::run_host(&me, command, timeout).await,
            t => containers::get().exec(&settings, &me, t, command, timeout).await,
        };
        match r {
            Ok(v) => {
                let line = format!(
                    "{}: exit {} in {} ms: {}",
                    target.name(),
                    v["exit_code"],
                    v["duration_ms"],
                    command.chars().take(200).collect::<String>()
                );
                let _ = self.log(if v["exit_code"] == 0 { "info" } else { "warn" }, "compute", "exec", &line);
                ToolOutput::json(&v)
            }
            Err(e) => {
                let _ = self.log("warn", "compute", "exec", &format!("{}: failed: {e}", target.name()));
                ToolOutput::err(format!("compute_exec error: {e}"))
            }
        }
    }

    /// Copy between the agent's files (`vfs`) and a workspace: its host
    /// folder, its container's, or its own in the shared container.
    async fn fs_transfer(&mut self, cfg: &Value, input: &Value) -> ToolOutput {
        let (from, to) = (input["from"].as_str().unwrap_or_default(), input["to"].as_str().unwrap_or_default());
        if from == to {
            return ToolOutput::err(format!("'from' and 'to' must be different (both are '{from}')."));
        }
        if from != "vfs" && to != "vfs" {
            return ToolOutput::err("one side of a transfer is 'vfs' (your files)");
        }
        let settings = Settings::load();
        let side = if from == "vfs" { to } else { from };
        let target = match side {
            "host" | "isolated" | "shared" => match compute_target(cfg, &settings, Some(side)).await {
                Ok(t) => t,
                Err(e) => return ToolOutput::err(e),
            },
            other => return ToolOutput::err(format!("unknown endpoint '{other}' (vfs, isolated, shared or host)")),
        };
        let path = input["path"].as_str().unwrap_or_default();
        let save_as = input["save_as"].as_str().filter(|s| !s.is_empty()).unwrap_or(path);
        let (src, dst) = match (compute::relative(path), compute::relative(save_as)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return ToolOutput::err(e),
        };
        let max = cfg["limits"]["max_file_write_bytes"].as_u64();
        let me = self.agent_id().to_string();
        let result = match (&target, from == "vfs") {
            (Target::Host, true) => self.vfs_files(&src).and_then(|files| {
                let root = compute::workspace(&me);
                for (rel, bytes) in &files {
                    write_new(&under(&root.join(&dst), rel), bytes)?;
                }
                Ok(files.len())
            }),
            (Target::Host, false) => self.host_to_vfs(&compute::workspace(&me).join(&src), &dst, max),
            (t, true) => match self.vfs_files(&src) {
                Ok(files) => {
                    let files: Vec<_> = files.into_iter().map(|(rel, b)| (under(&dst, &rel), b)).collect();
                    containers::get().put(&settings, &me, t, &files).await.map(|()| files.len())
                }
                Err(e) => Err(e),
            },
            (t, false) => match containers::get().get(&settings, &me, t, &src).await {
                Ok(files) if files.is_empty() => Err(format!("no file at {path} in the {} workspace", t.name())),
                Ok(files) => self.files_to_vfs(files.into_iter().map(|(rel, b)| (under(&dst, &rel), b)).collect(), max),
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(n) => {
                let _ = self.log("info", "compute", "transfer", &format!("{from} -> {to}: {path} ({n} files)"));
                ToolOutput::json(
                    &json!({"from": from, "to": to, "path": path, "dest_path": dst.to_string_lossy(), "files": n}),
                )
            }
            Err(e) => ToolOutput::err(format!("fs_transfer error: {e}")),
        }
    }

    /// A VFS file (relative path "") or every file under a VFS folder
    /// (paths relative to it), with their bytes.
    fn vfs_files(&mut self, src: &std::path::Path) -> Result<Vec<(std::path::PathBuf, Vec<u8>)>, String> {
        let key = src.to_string_lossy().to_string();
        if let Ok((_, bytes)) = self.store.file_read(&key) {
            return Ok(vec![(std::path::PathBuf::new(), bytes)]);
        }
        let prefix = format!("{}/", key.trim_end_matches('/'));
        let files = self.store.file_list(&prefix).map_err(|e| e.to_string())?;
        if files.is_empty() {
            return Err(format!("No file or directory found in VFS at \"{key}\""));
        }
        let mut out = Vec::with_capacity(files.len());
        for f in &files {
            let (_, bytes) = self.store.file_read(&f.path).map_err(|e| e.to_string())?;
            let rest = f.path.strip_prefix(&prefix).unwrap_or(&f.path);
            out.push((compute::relative(rest)?, bytes));
        }
        Ok(out)
    }

    /// Write files into the VFS as the agent (protected files stay
    /// protected, the write limit holds).
    fn files_to_vfs(&mut self, files: Vec<(std::path::PathBuf, Vec<u8>)>, max: Option<u64>) -> Result<usize, String> {
        let caller = Caller::Agent { authorized: false, override_approved: false };
        for (to, bytes) in &files {
            let key = to.to_string_lossy().to_string();
            let opts = crate::store::files::WriteOptions { max_bytes: max, ..Default::default() };
            self.store.file_write(caller, &key, bytes, &opts).map_err(|e| format!("{key}: {e}"))?;
        }
        Ok(files.len())
    }

    /// A file, or every file under a folder, from the host into the VFS (as
    /// the agent: protected files stay protected; no links followed).
    fn host_to_vfs(&mut self, src: &std::path::Path, dst: &std::path::Path, max: Option<u64>) -> Result<usize, String> {
        let meta = std::fs::symlink_metadata(src)
            .map_err(|_| format!("nothing at {} in the host workspace", src.display()))?;
        let mut files = Vec::new();
        if meta.is_file() {
            files.push((src.to_path_buf(), dst.to_path_buf()));
        } else if meta.is_dir() {
            walk(src, dst, &mut files, 0)?;
        } else {
            return Err(format!("{} is not a file or folder (links are not followed)", src.display()));
        }
        let mut read = Vec::with_capacity(files.len());
        for (from, to) in files {
            read.push((to, std::fs::read(&from).map_err(|e| format!("{}: {e}", from.display()))?));
        }
        self.files_to_vfs(read, max)
    }
}

/// `rel` under `dst`; `dst` itself for the empty path (a single file).
fn under(dst: &std::path::Path, rel: &std::path::Path) -> std::path::PathBuf {
    if rel.as_os_str().is_empty() { dst.to_path_buf() } else { dst.join(rel) }
}

/// Files under a host folder (no links; at most 10,000, 16 deep).
fn walk(
    dir: &std::path::Path,
    dst: &std::path::Path,
    out: &mut Vec<(std::path::PathBuf, std::path::PathBuf)>,
    depth: usize,
) -> Result<(), String> {
    if depth > 16 || out.len() > 10_000 {
        return Err("the folder is too deep or holds too many files (16 levels, 10,000 files)".into());
    }
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let t = e.file_type().map_err(|e| e.to_string())?;
        let name = e.file_name();
        if t.is_dir() {
            walk(&e.path(), &dst.join(&name), out, depth + 1)?;
        } else if t.is_file() {
            out.push((e.path(), dst.join(&name)));
        }
    }
    Ok(())
}

/// Write a host file, making its folder; a link in its place is refused.
fn write_new(path: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(format!("{} is a link; not written through", path.display()));
    }
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}
