//! `compute_exec` and `fs_transfer` (tools.md §2, §5) in the executor:
//! the target resolved and gated (fail closed), the host through
//! `runtime/compute.rs`; containers are not driven by this build yet and
//! say so. Every command is logged (`compute`/`exec`) with its exit code,
//! which the app's compute view reads.

use serde_json::{Value, json};

use super::Executor;
use crate::runtime::compute::{self, HostPolicy};
use crate::store::Caller;
use crate::tools::ToolOutput;

/// Why a container target cannot be used here.
fn container_unavailable(target: &str) -> String {
    format!(
        "Target '{target}' is not available: containers (Podman or Docker) are not driven by this build of adf yet; use target 'host' where the owner allows it"
    )
}

impl Executor {
    /// Which target a call means, or why none can serve it.
    fn compute_target(&self, cfg: &Value, asked: Option<&str>) -> Result<String, String> {
        let c = &cfg["compute"];
        let target = match asked.filter(|t| !t.is_empty()) {
            Some(t) => t.to_string(),
            None => match c["default_target"].as_str() {
                Some(t) => t.to_string(),
                None if c["host_access"] == true => "host".into(),
                None => {
                    return Err("no compute target: this agent has no compute.default_target and no host access".into());
                }
            },
        };
        match target.as_str() {
            "host" => {
                if c["host_access"] != true {
                    return Err("Target 'host' is not available: compute.host_access is off for this agent".into());
                }
                if !HostPolicy::load().enabled {
                    return Err("Target 'host' is not available: host commands are switched off for this install (settings.json compute.host.enabled; the owner runs `adf compute host on`)".into());
                }
                Ok(target)
            }
            "isolated" | "shared" => Err(container_unavailable(&target)),
            other => Err(format!("unknown compute target '{other}' (host, isolated or shared)")),
        }
    }

    pub(crate) async fn compute_tool(&mut self, name: &str, input: &Value) -> ToolOutput {
        let cfg = match self.store.config_value() {
            Ok(c) => c,
            Err(e) => return ToolOutput::err(e.to_string()),
        };
        match name {
            "compute_exec" => self.compute_exec(&cfg, input).await,
            "fs_transfer" => self.fs_transfer(&cfg, input),
            _ => ToolOutput::err(format!("Unknown tool: {name}")),
        }
    }

    async fn compute_exec(&mut self, cfg: &Value, input: &Value) -> ToolOutput {
        let command = input["command"].as_str().unwrap_or_default();
        if command.trim().is_empty() {
            return ToolOutput::err("command is required");
        }
        let target = match self.compute_target(cfg, input["target"].as_str()) {
            Ok(t) => t,
            Err(e) => return ToolOutput::err(e),
        };
        if let Err(e) = compute::check_host(&HostPolicy::load(), command) {
            let _ = self.log("warn", "compute", "refused", &format!("{target}: {e}"));
            return ToolOutput::err(e);
        }
        let limit = cfg["limits"]["execution_timeout_ms"].as_u64().unwrap_or(60_000);
        let ms = input["timeout_ms"]
            .as_u64()
            .unwrap_or(compute::DEFAULT_TIMEOUT_MS)
            .clamp(1, compute::MAX_TIMEOUT_MS)
            .min(limit.max(1_000));
        let me = self.agent_id().to_string();
        match compute::run_host(&me, command, std::time::Duration::from_millis(ms)).await {
            Ok(v) => {
                let line = format!(
                    "{target}: exit {} in {} ms: {}",
                    v["exit_code"],
                    v["duration_ms"],
                    command.chars().take(200).collect::<String>()
                );
                let _ = self.log(if v["exit_code"] == 0 { "info" } else { "warn" }, "compute", "exec", &line);
                ToolOutput::json(&v)
            }
            Err(e) => ToolOutput::err(format!("compute_exec error: {e}")),
        }
    }

    /// Copy between the agent's files (`vfs`) and its host workspace.
    fn fs_transfer(&mut self, cfg: &Value, input: &Value) -> ToolOutput {
        let (from, to) = (input["from"].as_str().unwrap_or_default(), input["to"].as_str().unwrap_or_default());
        if from == to {
            return ToolOutput::err(format!("'from' and 'to' must be different (both are '{from}')."));
        }
        for side in [from, to] {
            match side {
                "vfs" => {}
                "host" if cfg["compute"]["host_access"] != true => {
                    return ToolOutput::err(
                        "Target 'host' is not available: compute.host_access is off for this agent",
                    );
                }
                "host" => {}
                "isolated" | "shared" => return ToolOutput::err(container_unavailable(side)),
                other => return ToolOutput::err(format!("unknown endpoint '{other}' (vfs, isolated, shared or host)")),
            }
        }
        let path = input["path"].as_str().unwrap_or_default();
        let save_as = input["save_as"].as_str().filter(|s| !s.is_empty()).unwrap_or(path);
        let (src, dst) = match (compute::relative(path), compute::relative(save_as)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return ToolOutput::err(e),
        };
        let root = compute::workspace(self.agent_id());
        let max = cfg["limits"]["max_file_write_bytes"].as_u64();
        let result = if from == "vfs" {
            self.vfs_to_host(&src, &root.join(&dst))
        } else {
            self.host_to_vfs(&root.join(&src), &dst, max)
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

    /// A file, or every file under a folder, from the VFS to the host.
    fn vfs_to_host(&mut self, src: &std::path::Path, dst: &std::path::Path) -> Result<usize, String> {
        let key = src.to_string_lossy().to_string();
        if let Ok((_, bytes)) = self.store.file_read(&key) {
            write_new(dst, &bytes)?;
            return Ok(1);
        }
        let prefix = format!("{}/", key.trim_end_matches('/'));
        let files = self.store.file_list(&prefix).map_err(|e| e.to_string())?;
        if files.is_empty() {
            return Err(format!("No file or directory found in VFS at \"{key}\""));
        }
        for f in &files {
            let (_, bytes) = self.store.file_read(&f.path).map_err(|e| e.to_string())?;
            let rest = f.path.strip_prefix(&prefix).unwrap_or(&f.path);
            write_new(&dst.join(compute::relative(rest)?), &bytes)?;
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
        let caller = Caller::Agent { authorized: false, override_approved: false };
        for (from, to) in &files {
            let bytes = std::fs::read(from).map_err(|e| format!("{}: {e}", from.display()))?;
            let key = to.to_string_lossy().to_string();
            let opts = crate::store::files::WriteOptions { max_bytes: max, ..Default::default() };
            self.store.file_write(caller, &key, &bytes, &opts).map_err(|e| format!("{key}: {e}"))?;
        }
        Ok(files.len())
    }
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
