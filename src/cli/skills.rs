//! `adf skills …` and `adf okf …`: an agent's SKILL.md skills (the fleet's
//! and its own; valid, muted, shadowed or invalid with the reason), adding
//! a skill folder from disk (checked first: a folder without a valid
//! SKILL.md changes nothing), muting without deleting; and the concepts of
//! an Open Knowledge Format bundle in its files.

use std::path::{Path, PathBuf};

use base64::Engine;
use clap::Subcommand;
use serde_json::json;

use super::held::{Target, open_for_write};
use super::output::{Out, at, close, open_for_read};
use crate::knowledge::{okf, skills};
use crate::store::files::WriteOptions;
use crate::store::{Caller, Store};

#[derive(Debug, Clone, Subcommand)]
pub enum SkillsCmd {
    /// List skills: name, where from, muted, description; invalid ones
    /// with the reason.
    Ls {
        path: PathBuf,
    },
    /// Copy a skill folder (SKILL.md and its resources) into the agent's
    /// files as skills/<name>/.
    Add {
        path: PathBuf,
        folder: PathBuf,
        /// Replace the agent's skill of the same name.
        #[arg(long)]
        force: bool,
    },
    /// Keep a skill from the model without deleting it.
    Mute {
        path: PathBuf,
        name: String,
    },
    Unmute {
        path: PathBuf,
        name: String,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum OkfCmd {
    /// Concepts {id, type, title, description, links} of the bundle at
    /// PREFIX (a folder of the agent's files; all of them by default).
    Ls { path: PathBuf, prefix: Option<String> },
}

/// The most files and bytes one skill folder may bring.
const MAX_FILES: usize = 500;
const MAX_BYTES: u64 = 50 << 20;

fn files_of(folder: &Path) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>, total: &mut u64) -> anyhow::Result<()> {
        let mut entries: Vec<_> =
            std::fs::read_dir(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with('.') {
                continue;
            }
            let ft = e.file_type()?;
            let p = e.path();
            if ft.is_dir() {
                walk(base, &p, out, total)?;
            } else if ft.is_file() {
                let bytes = std::fs::read(&p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
                *total += bytes.len() as u64;
                let rel = p.strip_prefix(base)?.to_string_lossy().to_string();
                out.push((rel, bytes));
                if out.len() > MAX_FILES || *total > MAX_BYTES {
                    anyhow::bail!(
                        "{}: more than {MAX_FILES} files or {} MB; a skill should be small",
                        base.display(),
                        MAX_BYTES >> 20
                    );
                }
            }
            // Symlinks are skipped: a skill brings its own files only.
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(folder, folder, &mut out, &mut 0)?;
    Ok(out)
}

fn index_of(store: &Store, path: &Path) -> anyhow::Result<skills::Index> {
    let cfg = store.config_value().map_err(|e| at(path, e))?;
    Ok(skills::index(store, Some(&skills::fleet_root()), &cfg))
}

pub fn run(out: &Out, cmd: SkillsCmd) -> anyhow::Result<()> {
    match cmd {
        SkillsCmd::Ls { path } => {
            let store = open_for_read(&path)?;
            let index = index_of(&store, &path)?;
            close(store)?;
            if out.json {
                return out.json(&index);
            }
            if index.skills.is_empty() && index.invalid.is_empty() {
                return out.line(format!("{}: no skills (adf skills add FILE FOLDER)", path.display()));
            }
            for s in &index.skills {
                let mark = if s.shadowed {
                    " (replaced by the agent's own)"
                } else if s.muted {
                    " (muted)"
                } else {
                    ""
                };
                let root = match s.root {
                    skills::Root::Fleet => "fleet",
                    skills::Root::Agent => "agent",
                };
                out.line(format!("{:<24} {root:<5} {}{mark}", s.name, s.description))?;
            }
            for i in &index.invalid {
                out.line(format!("invalid: {} — {}", i.path, i.reason))?;
            }
            Ok(())
        }
        SkillsCmd::Add { path, folder, force } => {
            let md = std::fs::read_to_string(folder.join("SKILL.md")).map_err(|e| {
                anyhow::anyhow!("{}: {e} (a skill folder holds a SKILL.md)", folder.join("SKILL.md").display())
            })?;
            let (name, _, _) =
                skills::parse(&md).map_err(|e| anyhow::anyhow!("{}: {e}", folder.join("SKILL.md").display()))?;
            let files = files_of(&folder)?;
            let prefix = format!("skills/{name}/");
            let n = files.len();
            match open_for_write(&path)? {
                Target::Local(mut store) => {
                    let existing = store.file_list(&prefix).map_err(|e| at(&path, e))?;
                    if !existing.is_empty() && !force {
                        close(store)?;
                        anyhow::bail!("{}: already has a skill named {name:?} (--force replaces it)", path.display());
                    }
                    for e in existing {
                        store.file_delete(Caller::Owner, &e.path).map_err(|err| at(&path, err))?;
                    }
                    for (rel, bytes) in &files {
                        store
                            .file_write(Caller::Owner, &format!("{prefix}{rel}"), bytes, &WriteOptions::default())
                            .map_err(|e| at(&path, e))?;
                    }
                    close(store)?;
                }
                Target::Held(via) => {
                    let listed = via.call(reqwest::Method::GET, &["files"], &[], None)?;
                    let taken = listed["files"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|f| f["path"].as_str().is_some_and(|p| p.starts_with(&prefix)));
                    if taken && !force {
                        anyhow::bail!("{}: already has a skill named {name:?} (--force replaces it)", path.display());
                    }
                    for (rel, bytes) in &files {
                        let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
                        let body = json!({"path": format!("{prefix}{rel}"), "content_base64": b64});
                        via.call(reqwest::Method::PUT, &["files", "content"], &[], Some(&body))?;
                    }
                }
            }
            if out.json {
                return out.json(&json!({"skill": name, "files": n}));
            }
            out.line(format!("added skill {name} ({n} files under {prefix})"))
        }
        SkillsCmd::Mute { path, name } => mute(out, &path, &name, true),
        SkillsCmd::Unmute { path, name } => mute(out, &path, &name, false),
    }
}

fn mute(out: &Out, path: &Path, name: &str, on: bool) -> anyhow::Result<()> {
    {
        let store = open_for_read(path)?;
        let index = index_of(&store, path)?;
        close(store)?;
        if on && !index.skills.iter().any(|s| s.name == name) {
            anyhow::bail!("{}: no skill named {name:?} (adf skills ls)", path.display());
        }
    }
    match open_for_write(path)? {
        Target::Local(mut store) => {
            let mut cfg = store.config_value().map_err(|e| at(path, e))?;
            skills::set_muted(&mut cfg, name, on);
            store.config_replace(cfg).map_err(|e| at(path, e))?;
            close(store)?;
        }
        Target::Held(via) => {
            let mut cfg = via.call(reqwest::Method::GET, &["config"], &[], None)?["config"].take();
            skills::set_muted(&mut cfg, name, on);
            via.call(reqwest::Method::PUT, &["config"], &[], Some(&cfg))?;
        }
    }
    if out.json {
        return out.json(&json!({"skill": name, "muted": on}));
    }
    out.line(format!("{name}: {}", if on { "muted (kept, not offered to the model)" } else { "offered again" }))
}

pub fn okf(out: &Out, cmd: OkfCmd) -> anyhow::Result<()> {
    match cmd {
        OkfCmd::Ls { path, prefix } => {
            let store = open_for_read(&path)?;
            let prefix = prefix.unwrap_or_default();
            let list = okf::concepts(&store, prefix.trim_start_matches('/')).map_err(|e| at(&path, e))?;
            close(store)?;
            if out.json {
                return out.json(&list);
            }
            if list.is_empty() {
                return out.line(format!("{}: no OKF concepts under {:?}", path.display(), prefix));
            }
            for c in &list {
                out.line(format!("{:<32} {:<20} {}", c.id, c.kind, c.title))?;
                if let Some(d) = &c.description {
                    out.line(format!("    {d}"))?;
                }
                if !c.links.is_empty() {
                    out.line(format!("    → {}", c.links.join(", ")))?;
                }
                if !c.broken_links.is_empty() {
                    out.line(format!("    broken: {}", c.broken_links.join(", ")))?;
                }
            }
            Ok(())
        }
    }
}
