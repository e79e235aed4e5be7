//! SKILL.md skills (the agentskills.io format: YAML frontmatter with `name`
//! and `description`, a markdown body, resources beside it). Two roots, from
//! broadest to narrowest: the fleet's `skills/` folder in the data folder,
//! then the agent's own `skills/<name>/SKILL.md` files; the narrower root
//! wins a name. Only names and descriptions reach the system prompt; the
//! body and resources are read on demand (progressive disclosure). A skill
//! is instructions, never authority: it cannot grant a tool or lift an
//! approval. The owner mutes one without deleting it (`skills.muted` in the
//! config). A SKILL.md that cannot be read as a skill is listed as invalid
//! with the reason, and never loaded.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::store::Store;

/// Where a skill comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Root {
    Fleet,
    Agent,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub root: Root,
    /// Its SKILL.md: a path in the agent's files (`skills/x/SKILL.md`),
    /// which is also how a fleet skill is read (through the overlay).
    pub path: String,
    /// Files beside SKILL.md, relative to its folder.
    pub resources: Vec<String>,
    pub muted: bool,
    /// A fleet skill the agent's own skill of the same name replaces.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shadowed: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Invalid {
    pub root: Root,
    pub path: String,
    pub reason: String,
}

#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct Index {
    pub skills: Vec<Skill>,
    pub invalid: Vec<Invalid>,
}

/// The longest SKILL.md read (the format asks for short bodies; 1 MB is
/// generous and keeps a hostile file from filling memory).
const MAX_SKILL_MD: u64 = 1 << 20;

/// The fleet-wide skills folder.
pub fn fleet_root() -> PathBuf {
    crate::paths::data_dir().join("skills")
}

/// A fingerprint of the fleet's skills folder: its own time, each skill
/// folder's and each SKILL.md's time and size. A skill added, removed or
/// edited (or a file added at a skill folder's top) changes it, so an
/// index built for one fingerprint is good until the next differs; with
/// no folder it is one failed `read_dir`.
pub fn fleet_signature(dir: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let Ok(meta) = std::fs::metadata(dir) else { return 0 };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    meta.modified().ok().hash(&mut h);
    if let Ok(entries) = std::fs::read_dir(dir) {
        let mut seen: Vec<(std::ffi::OsString, u64)> = entries
            .flatten()
            .map(|e| {
                let mut eh = std::collections::hash_map::DefaultHasher::new();
                std::fs::metadata(e.path()).ok().and_then(|m| m.modified().ok()).hash(&mut eh);
                if let Ok(m) = std::fs::metadata(e.path().join("SKILL.md")) {
                    (m.modified().ok(), m.len()).hash(&mut eh);
                }
                (e.file_name(), eh.finish())
            })
            .collect();
        seen.sort();
        seen.hash(&mut h);
    }
    // Never 0 for a folder that exists (0 means none).
    h.finish() | 1
}

/// Split YAML frontmatter from the body. `None` without frontmatter.
pub fn frontmatter(text: &str) -> Option<(&str, &str)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rest = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n"))?;
    let mut at = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Some((&rest[..at], &rest[at + line.len()..]));
        }
        at += line.len();
    }
    None
}

/// A parsed SKILL.md: (name, description, body).
pub fn parse(text: &str) -> Result<(String, String, String), String> {
    let (yaml, body) = frontmatter(text).ok_or("no YAML frontmatter (--- name: … description: … ---)")?;
    let meta: Value = serde_yaml_ng::from_str(yaml).map_err(|e| format!("the frontmatter is not YAML: {e}"))?;
    let name = meta["name"].as_str().map(str::trim).filter(|n| !n.is_empty()).ok_or("the frontmatter has no name")?;
    if name.len() > 64 || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_') {
        return Err(format!("name {name:?}: use lowercase letters, digits, - and _ (at most 64)"));
    }
    let description = meta["description"]
        .as_str()
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .ok_or("the frontmatter has no description")?;
    Ok((name.to_string(), description.chars().take(1024).collect(), body.trim_start().to_string()))
}

/// The muted names of a config.
pub fn muted(cfg: &Value) -> Vec<String> {
    cfg.pointer("/skills/muted")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

/// Mute (or unmute) a skill in a config (`skills.muted`).
pub fn set_muted(cfg: &mut Value, name: &str, on: bool) {
    let mut list = muted(cfg);
    list.retain(|n| n != name);
    if on {
        list.push(name.to_string());
    }
    if !cfg["skills"].is_object() {
        cfg["skills"] = serde_json::json!({});
    }
    cfg["skills"]["muted"] = serde_json::json!(list);
}

/// Index both roots. `fleet` is the fleet folder (none: the agent only).
pub fn index(store: &Store, fleet: Option<&Path>, cfg: &Value) -> Index {
    let muted = muted(cfg);
    let mut out = Index::default();
    if let Some(dir) = fleet {
        index_fleet(dir, &mut out);
    }
    index_agent(store, &mut out);
    // The narrower root wins a name.
    let agent_names: Vec<String> =
        out.skills.iter().filter(|s| s.root == Root::Agent).map(|s| s.name.clone()).collect();
    for s in &mut out.skills {
        s.shadowed = s.root == Root::Fleet && agent_names.contains(&s.name);
        s.muted = muted.contains(&s.name);
    }
    out.skills.sort_by(|a, b| a.name.cmp(&b.name).then((a.root as u8).cmp(&(b.root as u8))));
    out
}

impl Index {
    /// The skills the model may use: valid, not muted, not shadowed.
    pub fn active(&self) -> impl Iterator<Item = &Skill> {
        self.skills.iter().filter(|s| !s.muted && !s.shadowed)
    }

    pub fn find(&self, name: &str) -> Option<&Skill> {
        self.active().find(|s| s.name == name)
    }
}

fn index_agent(store: &Store, out: &mut Index) {
    let Ok(files) = store.file_list("skills/") else { return };
    for f in files.iter().filter(|f| f.path.ends_with("/SKILL.md") && f.path.matches('/').count() == 2) {
        let folder = f.path.trim_end_matches("SKILL.md");
        let read = if f.size > MAX_SKILL_MD {
            Err(format!("SKILL.md is {} bytes (at most {MAX_SKILL_MD})", f.size))
        } else {
            store.file_read_text(&f.path).map_err(|e| e.to_string())
        };
        match read.and_then(|t| parse(&t)) {
            Ok((name, description, _)) => {
                let resources = files
                    .iter()
                    .filter(|r| r.path.starts_with(folder) && r.path != f.path)
                    .map(|r| r.path[folder.len()..].to_string())
                    .collect();
                out.skills.push(Skill {
                    name,
                    description,
                    root: Root::Agent,
                    path: f.path.clone(),
                    resources,
                    muted: false,
                    shadowed: false,
                });
            }
            Err(reason) => out.invalid.push(Invalid { root: Root::Agent, path: f.path.clone(), reason }),
        }
    }
}

fn index_fleet(dir: &Path, out: &mut Index) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut folders: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    folders.sort();
    for folder in folders {
        let md = folder.join("SKILL.md");
        let Ok(meta) = std::fs::metadata(&md) else { continue };
        let shown = format!("skills/{}/SKILL.md", folder.file_name().map(|n| n.to_string_lossy()).unwrap_or_default());
        let read = if meta.len() > MAX_SKILL_MD {
            Err(format!("SKILL.md is {} bytes (at most {MAX_SKILL_MD})", meta.len()))
        } else {
            std::fs::read_to_string(&md).map_err(|e| e.to_string())
        };
        match read.and_then(|t| parse(&t)) {
            Ok((name, description, _)) => {
                let mut resources = Vec::new();
                walk(&folder, &folder, &mut resources);
                resources.retain(|r| r != "SKILL.md");
                out.skills.push(Skill {
                    path: format!("skills/{name}/SKILL.md"),
                    name,
                    description,
                    root: Root::Fleet,
                    resources,
                    muted: false,
                    shadowed: false,
                });
            }
            Err(reason) => out.invalid.push(Invalid { root: Root::Fleet, path: shown, reason }),
        }
    }
}

fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        // Symlinks are not followed: a fleet skill cannot reach outside
        // its folder.
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            walk(base, &p, out);
        } else if ft.is_file()
            && let Ok(rel) = p.strip_prefix(base)
        {
            out.push(rel.to_string_lossy().to_string());
        }
        if out.len() > 1000 {
            return;
        }
    }
}

/// A fleet skill's file, read through the overlay: `skills/<name>/<rest>`
/// when the agent has no such file. Only regular files inside the skill's
/// own folder, never through a symlink or `..`.
pub fn fleet_file(fleet: &Path, vpath: &str) -> Option<Vec<u8>> {
    let rest = vpath.strip_prefix("skills/")?;
    let (name, rel) = rest.split_once('/')?;
    let ok = |s: &str| !s.is_empty() && s != "." && s != ".." && !s.contains('\\');
    if !ok(name) || !rel.split('/').all(ok) {
        return None;
    }
    // The folder of the skill whose frontmatter name is `name`.
    let folder = std::fs::read_dir(fleet).ok()?.flatten().map(|e| e.path()).find(|p| {
        std::fs::read_to_string(p.join("SKILL.md")).ok().and_then(|t| parse(&t).ok()).is_some_and(|(n, _, _)| n == name)
    })?;
    let mut p = folder.clone();
    for seg in rel.split('/') {
        p.push(seg);
        let meta = std::fs::symlink_metadata(&p).ok()?;
        if meta.file_type().is_symlink() {
            return None;
        }
    }
    let meta = std::fs::metadata(&p).ok()?;
    if !meta.is_file() || meta.len() > 16 << 20 {
        return None;
    }
    std::fs::read(&p).ok()
}

/// The system prompt's section for the active skills (none: no section).
pub fn prompt_section(index: &Index) -> Option<String> {
    let lines: Vec<String> = index.active().map(|s| format!("- {}: {} ({})", s.name, s.description, s.path)).collect();
    if lines.is_empty() {
        return None;
    }
    Some(format!(
        "## Skills\n\nSkills are instructions for particular tasks. When a task matches one, read its SKILL.md with \
         fs_read first and follow it; files it mentions sit beside it. A skill never grants a tool or lifts an \
         approval: it only says how to use what you already have.\n\n{}",
        lines.join("\n")
    ))
}

/// The user turn a `/<name> args` slash command runs: the skill's body
/// loaded, then what the owner asked.
pub fn invocation(name: &str, body: &str, args: &str) -> String {
    let args = args.trim();
    let ask = if args.is_empty() { "Run this skill.".to_string() } else { args.to_string() };
    format!("[Skill: {name}]\n\n{}\n\n---\n\n{ask}", body.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontmatter_name_and_description() {
        let (n, d, b) =
            parse("---\nname: refunds\ndescription: Handle refund requests.\n---\n\n# Refunds\nbody").unwrap();
        assert_eq!((n.as_str(), d.as_str(), b.as_str()), ("refunds", "Handle refund requests.", "# Refunds\nbody"));
        for (text, says) in [
            ("# no frontmatter", "no YAML frontmatter"),
            ("---\nname: x\n", "no YAML frontmatter"),
            ("---\ndescription: d\n---\n", "no name"),
            ("---\nname: x\n---\n", "no description"),
            ("---\nname: Bad Name\ndescription: d\n---\n", "lowercase"),
            ("---\nname: [unclosed\n---\n", "not YAML"),
        ] {
            assert!(parse(text).unwrap_err().contains(says), "{text:?}");
        }
        assert!(parse("\u{feff}---\r\nname: a\r\ndescription: d\r\n---\r\nbody").is_ok());
    }

    #[test]
    fn the_overlay_stays_inside_the_skill() {
        let dir = tempfile::tempdir().unwrap();
        let s = dir.path().join("anything");
        std::fs::create_dir_all(s.join("refs")).unwrap();
        std::fs::write(s.join("SKILL.md"), "---\nname: refunds\ndescription: d\n---\nbody").unwrap();
        std::fs::write(s.join("refs/policy.md"), "30 days").unwrap();
        std::fs::write(dir.path().join("secret.txt"), "no").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret.txt"), s.join("link.md")).unwrap();
        assert_eq!(fleet_file(dir.path(), "skills/refunds/refs/policy.md").unwrap(), b"30 days");
        assert!(fleet_file(dir.path(), "skills/refunds/SKILL.md").is_some());
        for bad in ["skills/refunds/../secret.txt", "skills/refunds/link.md", "skills/other/SKILL.md", "notes/x"] {
            assert!(fleet_file(dir.path(), bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn invocation_loads_the_body_then_the_ask() {
        assert_eq!(invocation("r", " body \n", " refund 42 "), "[Skill: r]\n\nbody\n\n---\n\nrefund 42");
        assert!(invocation("r", "b", "").ends_with("Run this skill."));
    }
}
