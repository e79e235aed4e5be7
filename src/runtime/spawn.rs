//! `sys_create_adf` (tools.md §6): an agent makes a child agent file beside
//! its own (or in a folder it names), optionally from a template `.adf`
//! among its files, with files copied from its own and config overrides.
//! The child is built by `store::derive` (fresh keys and DID, template
//! locks enforced, nothing left behind on failure) on a blocking thread,
//! so a large template never stalls the runtime; with `autostart` the
//! runtime that runs the parent loads and starts the child.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::executor::Executor;
use crate::store::create::{NewAgent, nanoid};
use crate::store::derive::{self, ChildSpec, Inject, Template};
use crate::tools::ToolOutput;

/// Parameters that are config sections of the child, passed as they are.
const CONFIG_KEYS: &[&str] = &[
    "instructions",
    "autonomous",
    "autostart",
    "start_in_state",
    "model",
    "context",
    "tools",
    "triggers",
    "security",
    "limits",
    "messaging",
    "audit",
    "code_execution",
    "logging",
    "mcp",
    "adapters",
    "serving",
    "providers",
    "ws_connections",
    "locked_fields",
    "card",
    "metadata",
];

/// `name` as a file name: `[^a-zA-Z0-9_-]` → `_`, plus `.adf`.
pub fn file_name(name: &str) -> String {
    let stem: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    format!("{stem}.adf")
}

/// A template's bytes written out to be opened as a file; removed (with
/// any sidecars) when dropped.
struct TempTemplate(PathBuf);

impl TempTemplate {
    fn write(bytes: &[u8]) -> std::io::Result<Self> {
        let path = std::env::temp_dir().join(format!(".adf-template-{}-{}.adf", std::process::id(), nanoid(10)));
        std::fs::write(&path, bytes)?;
        Ok(TempTemplate(path))
    }
}

impl Drop for TempTemplate {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut s = self.0.as_os_str().to_owned();
            s.push(suffix);
            let _ = std::fs::remove_file(PathBuf::from(s));
        }
    }
}

/// What the blocking part needs, owned.
struct Job {
    dest: PathBuf,
    name: String,
    handle: Option<String>,
    description: Option<String>,
    icon: Option<String>,
    template: Option<(String, Vec<u8>)>,
    files: Vec<Inject>,
    overrides: Map<String, Value>,
    parent_did: String,
}

struct Made {
    id: String,
    did: String,
}

fn build(job: Job) -> Result<Made, String> {
    let temp = match &job.template {
        Some((vpath, bytes)) => {
            Some(TempTemplate::write(bytes).map_err(|e| format!("template {vpath}: cannot stage it: {e}"))?)
        }
        None => None,
    };
    let template = match (&temp, &job.template) {
        (Some(t), Some((vpath, _))) => Some(Template::load(&t.0).map_err(|e| {
            // Name the template by its path among the agent's files.
            format!("template {vpath}: {}", e.to_string().replace(&t.0.display().to_string(), vpath))
        })?),
        _ => None,
    };
    let seal_to = crate::identity::install::load(&crate::paths::config_dir()).ok().flatten();
    let spec = ChildSpec {
        new: NewAgent {
            seal_to,
            name: Some(&job.name),
            handle: job.handle.as_deref(),
            description: job.description.as_deref(),
            icon: job.icon.as_deref(),
            provider: None,
            model: None,
        },
        template: template.as_ref(),
        overrides: job.overrides,
        files: job.files,
        parent_did: Some(job.parent_did),
    };
    let created = derive::create_child(&job.dest, &spec).map_err(|e| e.to_string())?;
    drop(temp);
    // The parent's creation counts as the owner's review of the child.
    crate::review::mark_reviewed(&created.id)
        .map_err(|e| format!("{}: recording the review: {e}", job.dest.display()))?;
    Ok(Made { id: created.id, did: created.did })
}

impl Executor {
    /// The `sys_create_adf` tool.
    pub(crate) async fn sys_create_adf(&mut self, input: &Value) -> ToolOutput {
        match self.create_adf(input).await {
            Ok(text) => ToolOutput::ok(text),
            Err(e) => ToolOutput::err(format!("Failed to create agent: {e}")),
        }
    }

    async fn create_adf(&mut self, input: &Value) -> Result<String, String> {
        let name = input["name"].as_str().map(str::trim).filter(|s| !s.is_empty()).ok_or("name is required")?;
        let own = self.store.canonical_path().to_path_buf();
        let own_dir = own.parent().map(Path::to_path_buf).unwrap_or_default();
        let dir = match input["location"].as_str().map(str::trim).filter(|l| !l.is_empty()) {
            Some(l) if Path::new(l).is_absolute() => PathBuf::from(l),
            Some(l) => own_dir.join(l),
            None => own_dir,
        };
        if !dir.is_dir() {
            return Err(format!("location {} is not an existing folder", dir.display()));
        }
        let dest = dir.join(file_name(name));
        if dest.exists() {
            return Err(format!("{}: a file already exists there (never overwritten)", dest.display()));
        }
        let template = match input["template"].as_str().filter(|t| !t.is_empty()) {
            Some(t) => {
                let (_, bytes) = self.store.file_read(t).map_err(|e| format!("template {t}: {e}"))?;
                Some((t.to_string(), bytes))
            }
            None => None,
        };
        let mut files = Vec::new();
        for f in input["files"].as_array().into_iter().flatten() {
            let (Some(from), Some(to)) = (f["parent_path"].as_str(), f["child_path"].as_str()) else {
                return Err("each files entry needs parent_path and child_path".into());
            };
            let (entry, content) = self.store.file_read(from).map_err(|e| format!("file {from}: {e}"))?;
            files.push(Inject { path: to.to_string(), content, mime: entry.mime_type.clone() });
        }
        let overrides: Map<String, Value> = CONFIG_KEYS
            .iter()
            .filter_map(|k| input.get(*k).filter(|v| !v.is_null()).map(|v| (k.to_string(), v.clone())))
            .collect();
        let parent_did = match self.store.meta_get("adf_did").ok().flatten().map(|m| m.value).filter(|d| !d.is_empty())
        {
            Some(did) => did,
            None => self.agent_id().to_string(),
        };
        let text = |k: &str| input[k].as_str().map(str::to_string);
        let job = Job {
            dest: dest.clone(),
            name: name.to_string(),
            handle: text("handle"),
            description: text("description"),
            icon: text("icon"),
            template: template.clone(),
            files,
            overrides,
            parent_did,
        };
        let injected = job.files.len();
        let made = tokio::task::spawn_blocking(move || build(job))
            .await
            .map_err(|e| format!("the create task failed: {e}"))??;
        let autostarted = input["autostart"].as_bool() == Some(true)
            && self.mesh.as_ref().is_some_and(|m| m.request_load(dest.clone()));
        let mut lines = vec![
            "Agent created successfully.".to_string(),
            format!("Name: {name}"),
            format!("ID: {}", made.id),
            format!("Path: {}", dest.display()),
        ];
        if !made.did.is_empty() {
            lines.push(format!("DID: {}", made.did));
        }
        if let Some((t, _)) = &template {
            lines.push(format!("Template: {t}"));
        }
        if injected > 0 {
            lines.push(format!("Files injected: {injected}"));
        }
        lines.push(format!("Autostarted: {autostarted}"));
        Ok(lines.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_file_names() {
        assert_eq!(file_name("Research Bot #2"), "Research_Bot__2.adf");
        assert_eq!(file_name("ok_name-1"), "ok_name-1.adf");
        assert_eq!(file_name("Été"), "_t_.adf");
    }
}
