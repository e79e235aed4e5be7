//! Agent files made from other agent files: a child from a template
//! (`sys_create_adf`, `adf new --template`), a clone with a fresh identity
//! (`adf clone`) and a template saved from an agent (`adf template save`).
//! Each is built in a hidden work file beside the destination and linked
//! into place only when complete, so a refused or failed derive leaves
//! nothing behind; the source is only ever read. Template locks
//! (`locked_fields`, `locked: true` items) are checked before anything is
//! written and travel into every child.

use std::path::{Path, PathBuf};

use rusqlite::{OptionalExtension, Transaction, params};
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::config::{self, get_path, write_config};
use super::create::{self, Created, NewAgent};
use super::error::{Ctx, Result, StoreError};
use super::identity::{AgentKeys, PURPOSE_PRIVATE, PURPOSE_PUBLIC};
use super::meta::MetaProtection;
use super::{Store, conn, keyring, now_iso};
use crate::identity::attest;
use crate::identity::install::Install;

/// The documents every agent is created with (kept by a clone without `--files`).
pub const DEFAULT_DOCUMENTS: [&str; 4] = ["README.md", "mind.md", "mind/log.md", "soul.md"];

/// Tables of what an agent did (left out of templates, and of clones
/// without `--history`).
const HISTORY: [&str; 6] = ["adf_loop", "adf_inbox", "adf_outbox", "adf_logs", "adf_tasks", "adf_audit"];

/// Config keys a template never passes on: the child has its own.
const OWN_KEYS: [&str; 5] = ["adf_version", "id", "metadata", "name", "handle"];

/// One file of the virtual filesystem, as copied between agents.
#[derive(Debug, Clone)]
pub struct FileRow {
    pub path: String,
    pub content: Vec<u8>,
    pub mime: Option<String>,
    pub protection: String,
}

/// What a child takes from a template file.
#[derive(Debug, Clone)]
pub struct Template {
    pub path: PathBuf,
    pub config: Value,
    pub files: Vec<FileRow>,
    /// Plaintext identity rows that are not keys: (purpose, value, code_access).
    pub identity: Vec<(String, Vec<u8>, bool)>,
}

impl Template {
    /// Read a template (any agent file), read-only.
    pub fn load(path: &Path) -> Result<Template> {
        let store = Store::open_read_only(path)?;
        let config = store.config_value()?;
        let files = read_files(store.conn(), path)?;
        let mut st = store
            .conn()
            .prepare("SELECT purpose, value, coalesce(encryption_algo, 'plain'), code_access FROM adf_identity")
            .at(path)?;
        let rows = st
            .query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?, r.get::<_, String>(2)?, r.get::<_, bool>(3)?))
            })
            .at(path)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .at(path)?;
        let identity = rows
            .into_iter()
            .filter(|(purpose, _, algo, _)| algo == "plain" && !purpose.starts_with("crypto:"))
            .map(|(p, v, _, c)| (p, v, c))
            .collect();
        Ok(Template { path: path.to_path_buf(), config, files, identity })
    }
}

fn read_files(c: &rusqlite::Connection, path: &Path) -> Result<Vec<FileRow>> {
    let mut st = c.prepare("SELECT path, content, mime_type, protection FROM adf_files ORDER BY path").at(path)?;
    let rows = st
        .query_map([], |r| {
            Ok(FileRow {
                path: r.get(0)?,
                content: r.get(1)?,
                mime: r.get(2)?,
                protection: r.get::<_, Option<String>>(3)?.unwrap_or_else(|| "none".into()),
            })
        })
        .at(path)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .at(path)?;
    Ok(rows)
}

// ---------------------------------------------------------------------------
// Config merging and locks.

/// Merge `over` onto `base` as format.md §9 merges options onto defaults:
/// tools by name, triggers per trigger type, `limits`, `security`,
/// `messaging` and `code_execution` shallowly, `locked_fields` unioned,
/// anything else replaced. Keys in `skip` are left alone.
pub fn merge_config(base: &mut Value, over: &Value, skip: &[&str]) {
    let (Some(b), Some(o)) = (base.as_object_mut(), over.as_object()) else { return };
    for (k, v) in o {
        if skip.contains(&k.as_str()) {
            continue;
        }
        let merged = match (k.as_str(), b.get_mut(k)) {
            ("tools", Some(Value::Array(tools))) => {
                for t in v.as_array().into_iter().flatten() {
                    let name = t.get("name").and_then(Value::as_str);
                    let at = tools.iter().position(|e| name.is_some() && e.get("name").and_then(Value::as_str) == name);
                    match at.and_then(|i| tools[i].as_object_mut()) {
                        Some(e) => {
                            for (f, x) in t.as_object().into_iter().flatten() {
                                e.insert(f.clone(), x.clone());
                            }
                        }
                        None => tools.push(t.clone()),
                    }
                }
                true
            }
            (
                "triggers" | "limits" | "security" | "messaging" | "code_execution" | "metadata",
                Some(Value::Object(m)),
            ) => {
                for (f, x) in v.as_object().into_iter().flatten() {
                    m.insert(f.clone(), x.clone());
                }
                true
            }
            ("locked_fields", Some(Value::Array(list))) => {
                for x in v.as_array().into_iter().flatten() {
                    if !list.contains(x) {
                        list.push(x.clone());
                    }
                }
                true
            }
            _ => false,
        };
        if !merged {
            b.insert(k.clone(), v.clone());
        }
    }
}

/// The dotted paths an override touches: leaves of objects, each field
/// of a named list item (`tools.fs_write.enabled`), whole lists otherwise.
fn touched(prefix: &str, v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                touched(&format!("{prefix}.{k}"), x, out);
            }
        }
        Value::Array(items)
            if !items.is_empty() && items.iter().all(|i| i.get("name").or_else(|| i.get("id")).is_some()) =>
        {
            for it in items {
                let id = it.get("name").or_else(|| it.get("id")).and_then(Value::as_str).unwrap_or("");
                match it.as_object() {
                    Some(m) if m.len() > 1 => {
                        for k in m.keys().filter(|k| *k != "name" && *k != "id") {
                            out.push(format!("{prefix}.{id}.{k}"));
                        }
                    }
                    _ => out.push(format!("{prefix}.{id}")),
                }
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

/// Why `path` may not be changed under `cfg`'s locks, if it may not.
pub fn lock_on(cfg: &Value, path: &str) -> Option<String> {
    let covered =
        |lock: &str| path == lock || path.starts_with(&format!("{lock}.")) || lock.starts_with(&format!("{path}."));
    if let Some(lock) = cfg
        .get("locked_fields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find(|l| covered(l))
    {
        return Some(format!("\"{path}\" is locked by the template (locked_fields: {lock})"));
    }
    let mut cur = cfg;
    let mut walked = Vec::new();
    for seg in path.split('.') {
        let Some(next) = get_path(cur, seg) else { break };
        walked.push(seg);
        if next.get("locked").and_then(Value::as_bool) == Some(true) {
            return Some(format!("\"{path}\" is locked by the template ({} has locked: true)", walked.join(".")));
        }
        cur = next;
    }
    None
}

/// The first override (config-shaped, by top-level key) that touches a
/// lock of `template`.
pub fn lock_conflict(template: &Value, overrides: &Map<String, Value>) -> Option<String> {
    let mut paths = Vec::new();
    for (k, v) in overrides {
        if k == "locked_fields" {
            // Adding locks is always allowed (they are unioned).
            continue;
        }
        touched(k, v, &mut paths);
    }
    paths.iter().find_map(|p| lock_on(template, p))
}

// ---------------------------------------------------------------------------
// A child.

/// A file to put into the child: (child path, bytes, MIME type).
#[derive(Debug, Clone)]
pub struct Inject {
    pub path: String,
    pub content: Vec<u8>,
    pub mime: Option<String>,
}

/// What a new child is made of.
#[derive(Default)]
pub struct ChildSpec<'a> {
    /// Name, handle, description, icon, provider, model, sealing.
    pub new: NewAgent<'a>,
    pub template: Option<&'a Template>,
    /// Config-shaped overrides (top-level keys), applied last.
    pub overrides: Map<String, Value>,
    pub files: Vec<Inject>,
    /// The creating agent's DID (or config id); empty for the owner.
    pub parent_did: Option<String>,
}

/// Create a child agent at `path`: defaults → template → overrides.
pub fn create_child(path: &Path, spec: &ChildSpec<'_>) -> Result<Created> {
    if let Some(t) = spec.template
        && let Some(why) = lock_conflict(&t.config, &spec.overrides)
    {
        return Err(StoreError::Invalid(format!("{}: {why}; nothing was created", path.display())));
    }
    if let Some(k) = spec.overrides.keys().find(|k| !config::TOP_LEVEL.contains(&k.as_str())) {
        return Err(StoreError::Invalid(format!("{}: unknown config section \"{k}\"", path.display())));
    }
    let finish = |tx: &Transaction<'_>, tmp: &Path| -> Result<()> {
        let now = now_iso();
        let text: String = tx.query_row("SELECT config_json FROM adf_config WHERE id = 1", [], |r| r.get(0)).at(tmp)?;
        let mut cfg: Value = serde_json::from_str(&text)
            .map_err(|e| StoreError::Invalid(format!("{}: new config: {e}", path.display())))?;
        let explicit = cfg.clone();
        if let Some(t) = spec.template {
            merge_config(&mut cfg, &t.config, &OWN_KEYS);
            // Given options win over the template's.
            let n = &spec.new;
            for (given, key) in [(n.description.is_some(), "description"), (n.icon.is_some(), "icon")] {
                if given {
                    cfg[key] = explicit[key].clone();
                }
            }
            if n.provider.is_some() {
                cfg["model"]["provider"] = explicit["model"]["provider"].clone();
            }
            if n.model.is_some() {
                cfg["model"]["model_id"] = explicit["model"]["model_id"].clone();
            }
        }
        let before = cfg.clone();
        merge_config(&mut cfg, &Value::Object(spec.overrides.clone()), &["adf_version", "id"]);
        let issues = config::new_issues(&before, &cfg);
        if let Some(i) = issues.first() {
            return Err(StoreError::Invalid(format!("{}: invalid config: {i}", path.display())));
        }
        write_config(tx, &cfg, &now).at(tmp)?;
        if let Some(t) = spec.template {
            for f in &t.files {
                let existing = protection_of(tx, tmp, &f.path)?;
                match existing.as_deref() {
                    Some("read_only") => {}
                    Some(p) => put_file(tx, tmp, &f.path, &f.content, f.mime.as_deref(), p, &now)?,
                    None => put_file(tx, tmp, &f.path, &f.content, f.mime.as_deref(), &f.protection, &now)?,
                }
            }
            for (purpose, value, code) in &t.identity {
                tx.execute(
                    "INSERT OR IGNORE INTO adf_identity(purpose, value, encryption_algo, code_access) VALUES (?1, ?2, 'plain', ?3)",
                    params![purpose, value, code],
                )
                .at(tmp)?;
            }
        }
        for f in &spec.files {
            let mime = f.mime.clone().or_else(|| Some(super::mime::for_path(&f.path)));
            match protection_of(tx, tmp, &f.path)?.as_deref() {
                Some("read_only") => {
                    return Err(StoreError::Invalid(format!(
                        "{}: file \"{}\" is read_only in the child and cannot be replaced",
                        path.display(),
                        f.path
                    )));
                }
                Some(p) => put_file(tx, tmp, &f.path, &f.content, mime.as_deref(), p, &now)?,
                None => put_file(tx, tmp, &f.path, &f.content, mime.as_deref(), "none", &now)?,
            }
        }
        if let Some(did) = &spec.parent_did {
            Store::meta_put_system(tx, "adf_parent_did", did, MetaProtection::Readonly).at(tmp)?;
        }
        Ok(())
    };
    create::create_file_with(path, &spec.new, &finish)
}

fn protection_of(tx: &Transaction<'_>, tmp: &Path, file: &str) -> Result<Option<String>> {
    tx.query_row("SELECT coalesce(protection, 'none') FROM adf_files WHERE path = ?1", [file], |r| r.get(0))
        .optional()
        .at(tmp)
}

fn put_file(
    tx: &Transaction<'_>,
    tmp: &Path,
    file: &str,
    content: &[u8],
    mime: Option<&str>,
    protection: &str,
    now: &str,
) -> Result<()> {
    tx.execute(
        "INSERT INTO adf_files(path, content, mime_type, size, protection, authorized, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, ?6)
         ON CONFLICT(path) DO UPDATE SET content = excluded.content, mime_type = excluded.mime_type,
           size = excluded.size, protection = excluded.protection, authorized = 0, updated_at = excluded.updated_at",
        params![file, content, mime, content.len() as i64, protection, now],
    )
    .at(tmp)?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Copies of a whole file: clones and templates.

/// What a clone carries besides config, identity-free meta and the
/// default documents.
#[derive(Debug, Clone, Copy, Default)]
pub struct CloneOptions {
    /// Loop, inbox, outbox, logs, tasks and audit rows.
    pub history: bool,
    /// Every file, not only the default documents.
    pub files: bool,
    /// The agent's own `local_*` tables.
    pub tables: bool,
}

/// What a clone or template save made.
#[derive(Debug, Clone, Serialize)]
pub struct Derived {
    pub path: PathBuf,
    pub source: PathBuf,
    pub id: String,
    pub name: String,
    /// The new DID (none for a template: it has no identity).
    pub did: Option<String>,
    /// The source's DID, named by the clone attestation.
    pub source_did: Option<String>,
    pub locked_fields: Vec<String>,
}

/// Copy `src` (read-only) into a hidden work file beside `dst`, let `edit`
/// change the copy in one transaction, then link it into place.
fn copy_then<T>(src: &Path, dst: &Path, edit: impl FnOnce(&Transaction<'_>, &Path) -> Result<T>) -> Result<T> {
    if dst.exists() {
        return Err(StoreError::Exists { path: dst.to_path_buf() });
    }
    let dir = dst.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(StoreError::Invalid(format!("{}: folder {} does not exist", dst.display(), dir.display())));
    }
    let source = Store::open_read_only(src)?;
    create::sweep_abandoned(dir);
    let name = dst.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}{}{}", create::CREATING, std::process::id()));
    let result = (|| -> Result<T> {
        let _ = std::fs::remove_file(&tmp);
        let mut c = conn::connect(&tmp, true, false)?;
        {
            let backup = rusqlite::backup::Backup::new(source.conn(), &mut c).at(&tmp)?;
            backup.run_to_completion(256, std::time::Duration::ZERO, None).at(&tmp)?;
        }
        conn::apply_pragmas(&c, &tmp, false)?;
        let tx = c.transaction().at(&tmp)?;
        let out = edit(&tx, &tmp)?;
        Store::meta_put_system(&tx, "adf_updated_at", &now_iso(), MetaProtection::None).at(&tmp)?;
        Store::meta_put_system(&tx, "adf_clean_close", &now_iso(), MetaProtection::Readonly).at(&tmp)?;
        tx.commit().at(&tmp)?;
        c.close().map_err(|(_, e)| super::error::classify(&tmp, e))?;
        std::fs::hard_link(&tmp, dst).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => StoreError::Exists { path: dst.to_path_buf() },
            _ => StoreError::Io { path: dst.to_path_buf(), source: e },
        })?;
        Ok(out)
    })();
    drop(source);
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut s = tmp.as_os_str().to_owned();
        s.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(s));
    }
    result.map_err(|e| match e {
        StoreError::DiskFull { .. } => StoreError::DiskFull { path: dst.to_path_buf() },
        e => e,
    })
}

fn read_cfg(tx: &Transaction<'_>, tmp: &Path, dst: &Path) -> Result<Value> {
    let text: String = tx.query_row("SELECT config_json FROM adf_config WHERE id = 1", [], |r| r.get(0)).at(tmp)?;
    serde_json::from_str(&text).map_err(|e| StoreError::Invalid(format!("{}: config is not JSON: {e}", dst.display())))
}

fn meta(tx: &Transaction<'_>, tmp: &Path, key: &str) -> Result<Option<String>> {
    tx.query_row("SELECT value FROM adf_meta WHERE key = ?1", [key], |r| r.get(0)).optional().at(tmp)
}

fn local_tables(tx: &Transaction<'_>, tmp: &Path) -> Result<Vec<String>> {
    let mut st = tx
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'local\\_%' ESCAPE '\\'")
        .at(tmp)?;
    let names = st.query_map([], |r| r.get(0)).at(tmp)?.collect::<rusqlite::Result<Vec<String>>>().at(tmp)?;
    Ok(names)
}

fn clear_history(tx: &Transaction<'_>, tmp: &Path, also_timers: bool) -> Result<()> {
    let mut tables: Vec<&str> = HISTORY.to_vec();
    if also_timers {
        tables.push("adf_timers");
    }
    for t in tables {
        let exists: bool = tx
            .query_row("SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1", [t], |r| r.get(0))
            .at(tmp)?;
        if exists {
            tx.execute(&format!("DELETE FROM {t}"), []).at(tmp)?;
        }
    }
    Ok(())
}

/// Drop every key, secret and attestation, and the identity meta.
fn strip_identity(tx: &Transaction<'_>, tmp: &Path) -> Result<()> {
    tx.execute("DELETE FROM adf_identity", []).at(tmp)?;
    tx.execute("DELETE FROM adf_attestations", []).at(tmp)?;
    tx.execute(
        "DELETE FROM adf_meta WHERE key IN ('adf_did', 'adf_owner_did', 'adf_runtime_did', 'adf_did_history')",
        [],
    )
    .at(tmp)?;
    Ok(())
}

/// Copy `src` to `dst` as a new agent: fresh keys, DID and config id, a
/// `clone` attestation naming the source's DID; history, extra files and
/// local tables only when asked for; no secrets (the source's credentials
/// are sealed to its own identity).
pub fn clone_file(src: &Path, dst: &Path, opts: CloneOptions, inst: Option<&Install>) -> Result<Derived> {
    clone_with(src, dst, opts, inst, |_, _| Ok(()))
}

/// `clone_file`, with a last change to the copy in the same transaction
/// (a fork's cut): it fails, no file is left.
pub(crate) fn clone_with(
    src: &Path,
    dst: &Path,
    opts: CloneOptions,
    inst: Option<&Install>,
    last: impl FnOnce(&Transaction<'_>, &Path) -> Result<()>,
) -> Result<Derived> {
    let keys = AgentKeys::generate().map_err(StoreError::Invalid)?;
    let (out, deks) = copy_then(src, dst, |tx, tmp| {
        let now = now_iso();
        let source_did = meta(tx, tmp, "adf_did")?.filter(|d| !d.is_empty());
        let mut cfg = read_cfg(tx, tmp, dst)?;
        let id = create::nanoid(12);
        cfg["id"] = json!(id);
        write_config(tx, &cfg, &now).at(tmp)?;
        if !opts.history {
            clear_history(tx, tmp, false)?;
        }
        if !opts.files {
            let keep = DEFAULT_DOCUMENTS.map(|d| format!("'{d}'")).join(", ");
            tx.execute(&format!("DELETE FROM adf_files WHERE path NOT IN ({keep})"), []).at(tmp)?;
        }
        if !opts.tables {
            for t in local_tables(tx, tmp)? {
                tx.execute(&format!("DROP TABLE IF EXISTS \"{}\"", t.replace('"', "\"\"")), []).at(tmp)?;
            }
        }
        let old = source_did.clone().unwrap_or_default();
        strip_identity(tx, tmp)?;
        if !old.is_empty() {
            Store::meta_put_system(tx, "adf_did_history", &json!([old]).to_string(), MetaProtection::Readonly)
                .at(tmp)?;
        }
        let deks = match inst {
            Some(inst) => Some(keyring::provision(tx, tmp, inst, &keys, &now, true)?),
            None => {
                for (purpose, value) in [(PURPOSE_PRIVATE, &keys.private_der), (PURPOSE_PUBLIC, &keys.public_der)] {
                    tx.execute(
                        "INSERT INTO adf_identity(purpose, value, encryption_algo, code_access) VALUES (?1, ?2, 'plain', 0)",
                        params![purpose, value],
                    )
                    .at(tmp)?;
                }
                Store::meta_put_system(tx, "adf_did", &keys.did, MetaProtection::Readonly).at(tmp)?;
                None
            }
        };
        // The owner vouches for the copy when there is one; else the new
        // agent states its own provenance.
        let (issuer_key, issuer) = match inst.and_then(|i| i.owner.as_ref().map(|o| (i, o))) {
            Some((i, o)) => (&o.signing, i.owner_did.clone()),
            None => (&keys.signing, keys.did.clone()),
        };
        let scope = source_did.clone().unwrap_or_else(|| format!("adf:{}", src.display()));
        let att = attest::issue(
            issuer_key,
            &attest::Claim {
                issuer: &issuer,
                subject: &keys.did,
                role: "clone",
                issued_at: &now,
                expires_at: None,
                scope: Some(&scope),
            },
        );
        keyring::insert_attestation(tx, &att).at(tmp)?;
        last(tx, tmp)?;
        let name = cfg["name"].as_str().unwrap_or_default().to_string();
        Ok((
            Derived {
                path: dst.to_path_buf(),
                source: src.to_path_buf(),
                id,
                name,
                did: Some(keys.did.clone()),
                source_did,
                locked_fields: string_list(&cfg["locked_fields"]),
            },
            deks,
        ))
    })?;
    if let Some((id, cred)) = deks {
        Store::remember_deks(dst, id, cred);
    }
    Ok(out)
}

fn string_list(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str).map(String::from).collect()
}

/// Remove secret values from a config (MCP env and headers, secret
/// params), rather than leaving placeholders a child would use.
fn strip_secrets(cfg: &Value) -> Value {
    const MARK: &str = "__redacted__";
    fn walk(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.retain(|_, x| x.as_str() != Some(MARK));
                m.values_mut().for_each(walk);
            }
            Value::Array(a) => {
                a.retain(|x| x.get("value").and_then(Value::as_str) != Some(MARK));
                a.iter_mut().for_each(walk);
            }
            _ => {}
        }
    }
    let mut c = crate::tools::redact(cfg);
    walk(&mut c);
    c
}

/// Save `src` as a template at `dst`: the config (secrets removed) with
/// `locks` added, files, meta and local tables; no history, timers,
/// keys, secrets or attestations. A lock `tools.NAME` or `triggers.NAME`
/// sets that item's `locked: true`; any other path joins `locked_fields`.
pub fn save_template(src: &Path, dst: &Path, locks: &[String]) -> Result<Derived> {
    for l in locks {
        let first = l.split('.').next().unwrap_or("");
        if l.split('.').any(str::is_empty) || !config::TOP_LEVEL.contains(&first) {
            return Err(StoreError::Invalid(format!(
                "--lock {l}: not a config path (it starts with one of: {})",
                config::TOP_LEVEL.join(", ")
            )));
        }
    }
    copy_then(src, dst, |tx, tmp| {
        let now = now_iso();
        let mut cfg = strip_secrets(&read_cfg(tx, tmp, dst)?);
        cfg["id"] = json!(create::nanoid(12));
        for l in locks {
            let segs: Vec<&str> = l.split('.').collect();
            let item = match segs.as_slice() {
                ["tools", name] => cfg["tools"]
                    .as_array_mut()
                    .and_then(|a| a.iter_mut().find(|t| t["name"] == *name))
                    .and_then(Value::as_object_mut),
                ["triggers", name] => cfg["triggers"].get_mut(*name).and_then(Value::as_object_mut),
                _ => None,
            };
            match item {
                Some(obj) => {
                    obj.insert("locked".into(), Value::Bool(true));
                }
                None => {
                    if !cfg["locked_fields"].is_array() {
                        cfg["locked_fields"] = json!([]);
                    }
                    if let Some(a) = cfg["locked_fields"].as_array_mut()
                        && !a.iter().any(|x| x == l.as_str())
                    {
                        a.push(json!(l));
                    }
                }
            }
        }
        write_config(tx, &cfg, &now).at(tmp)?;
        clear_history(tx, tmp, true)?;
        strip_identity(tx, tmp)?;
        Ok(Derived {
            path: dst.to_path_buf(),
            source: src.to_path_buf(),
            id: cfg["id"].as_str().unwrap_or_default().to_string(),
            name: cfg["name"].as_str().unwrap_or_default().to_string(),
            did: None,
            source_did: None,
            locked_fields: string_list(&cfg["locked_fields"]),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_follows_the_create_rules() {
        let mut base = json!({"tools": [{"name": "fs_read", "enabled": true}], "limits": {"a": 1, "b": 2},
            "locked_fields": ["x"], "instructions": "base", "id": "keep"});
        merge_config(
            &mut base,
            &json!({"tools": [{"name": "fs_read", "enabled": false}, {"name": "new"}], "limits": {"b": 3},
                "locked_fields": ["y", "x"], "instructions": "over", "id": "other"}),
            &["id"],
        );
        assert_eq!(base["tools"], json!([{"name": "fs_read", "enabled": false}, {"name": "new"}]));
        assert_eq!(base["limits"], json!({"a": 1, "b": 3}));
        assert_eq!(base["locked_fields"], json!(["x", "y"]));
        assert_eq!(base["instructions"], "over");
        assert_eq!(base["id"], "keep");
    }

    #[test]
    fn overrides_touching_locks_are_named() {
        let tpl = json!({"locked_fields": ["model.model_id"], "model": {"model_id": "m"},
            "tools": [{"name": "fs_write", "locked": true, "enabled": false}, {"name": "fs_read", "enabled": true}]});
        let ov = |v: Value| v.as_object().cloned().unwrap_or_default();
        assert!(lock_conflict(&tpl, &ov(json!({"model": {"model_id": "x"}}))).unwrap().contains("model.model_id"));
        assert!(lock_conflict(&tpl, &ov(json!({"model": {"temperature": 0.2}}))).is_none());
        assert!(lock_conflict(&tpl, &ov(json!({"tools": [{"name": "fs_write", "enabled": true}]}))).is_some());
        assert!(lock_conflict(&tpl, &ov(json!({"tools": [{"name": "fs_read", "enabled": false}]}))).is_none());
        assert!(lock_conflict(&tpl, &ov(json!({"locked_fields": ["tools"]}))).is_none());
    }
}
