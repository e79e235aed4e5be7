//! `adf inspect PATH`: what an agent file holds, without secrets: versions,
//! identity, meta, config summary, files, table row counts, pragmas.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::output::{self, Out, at, close, open_for_read};
use crate::identity::envelope::{CREDENTIALS, IDENTITY};
use crate::store::files::FileEntry;
use crate::store::meta::MetaEntry;
use crate::store::tables::TableInfo;
use crate::store::{IntegrityCheck, Store, config, pragma_text};

#[derive(Debug, Serialize)]
pub struct Report {
    pub path: String,
    pub read_only: bool,
    pub format_version: Option<String>,
    pub schema_version: i64,
    pub migrated_from: Option<i64>,
    pub integrity_check: IntegrityCheck,
    pub did: Option<String>,
    pub name: Option<String>,
    pub handle: Option<String>,
    pub warnings: Vec<String>,
    pub pragmas: serde_json::Map<String, Value>,
    pub summary: Value,
    pub config_issues: Vec<config::Issue>,
    pub meta: Vec<MetaEntry>,
    pub config: Value,
    pub files: Vec<FileEntry>,
    pub identity: Vec<IdentityRow>,
    pub envelopes: Vec<crate::store::keyring::EnvelopeInfo>,
    /// Where the signing key is and whether it opens here.
    pub signing_key: Value,
    pub tables: Vec<TableInfo>,
}

#[derive(Debug, Serialize)]
pub struct IdentityRow {
    pub purpose: String,
    pub encryption_algo: Option<String>,
    pub value_len: i64,
    pub code_access: bool,
}

fn report(store: &Store) -> crate::store::Result<Report> {
    let meta = store.meta_list()?;
    let get = |k: &str| meta.iter().find(|m| m.key == k).map(|m| m.value.clone());
    let mut warnings = store.warnings().to_vec();
    if get("adf_clean_close").is_none() && crate::store::current_holder(store.path()).is_none() {
        warnings.push(format!(
            "not closed cleanly: the next open runs integrity_check (`adf repair --check {}` runs it now)",
            store.path().display()
        ));
    }
    // A damaged config does not hide the rest of the file.
    let cfg = store.config_value().unwrap_or_else(|e| {
        warnings.push(e.to_string());
        Value::Null
    });
    let mut pragmas = serde_json::Map::new();
    for p in ["journal_mode", "synchronous", "busy_timeout", "foreign_keys", "page_size"] {
        pragmas.insert(p.into(), Value::String(pragma_text(store.conn(), p)?));
    }
    let typed = config::AgentConfig::from_value(&cfg).unwrap_or_default();
    let (tools, _) = typed.effective_tools();
    let s = |p: &str| cfg.pointer(p).cloned().unwrap_or(Value::Null);
    let summary = serde_json::json!({
        "state": s("/state"),
        "autonomous": s("/autonomous"),
        "autostart": s("/autostart"),
        "provider": s("/model/provider"),
        "model": s("/model/model_id"),
        "tools_enabled": tools.iter().filter(|t| t.is_enabled()).map(|t| t.name.clone()).collect::<Vec<_>>(),
        "tools_restricted": tools.iter().filter(|t| t.is_restricted()).map(|t| t.name.clone()).collect::<Vec<_>>(),
        "triggers_enabled": cfg.get("triggers").and_then(Value::as_object).map(|t| t.iter()
            .filter(|(_, v)| v.get("enabled").and_then(Value::as_bool) == Some(true))
            .map(|(k, _)| k.clone()).collect::<Vec<_>>()),
        "security_level": s("/security/level"),
        "visibility": s("/messaging/visibility"),
    });
    Ok(Report {
        path: store.path().display().to_string(),
        read_only: store.is_read_only(),
        format_version: get("adf_version"),
        schema_version: store.schema_version(),
        migrated_from: store.migrated_from(),
        integrity_check: store.integrity_check(),
        did: get("adf_did"),
        name: get("adf_name"),
        handle: get("adf_handle"),
        warnings,
        pragmas,
        summary,
        config_issues: config::validate(&cfg),
        meta,
        config: cfg,
        files: store.file_list("")?,
        identity: identity_rows(store)?,
        envelopes: vec![store.envelope(IDENTITY)?, store.envelope(CREDENTIALS)?],
        signing_key: signing_key(store)?,
        tables: store.tables()?,
    })
}

/// `{storage, envelope?, state?, locked}` for the signing key.
fn signing_key(store: &Store) -> crate::store::Result<Value> {
    let row = store.secrets()?.into_iter().find(|r| r.purpose == crate::store::identity::PURPOSE_PRIVATE);
    let Some(row) = row else { return Ok(serde_json::json!({"storage": "none", "locked": false})) };
    Ok(match row.encryption_algo.strip_prefix("env:") {
        Some(env) => {
            let state = store.envelope(if env == IDENTITY { IDENTITY } else { CREDENTIALS })?.state;
            serde_json::json!({"storage": "sealed", "envelope": env, "state": state,
                "locked": state != crate::store::keyring::EnvState::Unlocked})
        }
        None if row.encryption_algo == "plain" => serde_json::json!({"storage": "plain", "locked": false}),
        None => serde_json::json!({"storage": "legacy-password", "locked": true}),
    })
}

fn identity_rows(store: &Store) -> crate::store::Result<Vec<IdentityRow>> {
    let conn = store.conn();
    let mut stmt = conn
        .prepare("SELECT purpose, encryption_algo, length(value), code_access FROM adf_identity ORDER BY purpose")
        .map_err(|e| crate::store::StoreError::Invalid(e.to_string()))?;

    stmt.query_map([], |r| {
        Ok(IdentityRow {
            purpose: r.get(0)?,
            encryption_algo: r.get(1)?,
            value_len: r.get(2)?,
            code_access: r.get::<_, i64>(3)? != 0,
        })
    })
    .and_then(|it| it.collect::<rusqlite::Result<Vec<_>>>())
    .map_err(|e| crate::store::StoreError::Invalid(e.to_string()))
}

pub fn run(out: &Out, path: &Path) -> anyhow::Result<()> {
    let mut store = open_for_read(path)?;
    // Open what this install can open, writing nothing.
    if let Ok(Some(inst)) = crate::identity::install::load(&crate::paths::config_dir()) {
        store.unlock_quietly(&inst).map_err(|e| at(path, e))?;
    }
    let r = report(&store).map_err(|e| at(path, e))?;
    close(store)?;
    if out.json {
        return out.json(&r);
    }
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let held = crate::store::current_holder(path)
        .map(|h| format!("  (held by adf pid {} on {}, since {})", h.pid, h.host, h.since))
        .unwrap_or_default();
    out.line(format!("{}{held}", r.path))?;
    out.line(format!("  name      {}", opt(&r.name)))?;
    out.line(format!("  handle    {}", opt(&r.handle)))?;
    out.line(format!("  did       {}", opt(&r.did)))?;
    let migrated = r.migrated_from.map(|v| format!(" (migrated from {v})")).unwrap_or_default();
    out.line(format!("  format    {}  schema {}{migrated}", opt(&r.format_version), r.schema_version))?;
    let model = match (r.summary["provider"].as_str(), r.summary["model"].as_str()) {
        (Some(p), Some(m)) if !p.is_empty() => format!("{p}/{m}"),
        _ => "(no provider)".into(),
    };
    out.line(format!("  state     {}  model {model}", r.summary["state"].as_str().unwrap_or("-")))?;
    for w in &r.warnings {
        out.line(format!("  warning   {w}"))?;
    }
    for i in &r.config_issues {
        out.line(format!("  config    {i}"))?;
    }
    out.line("")?;
    print_identity(out, &r)?;
    out.line("")?;
    out.line(format!("files ({})", r.files.len()))?;
    for f in &r.files {
        out.line(format!("  {:<10} {:>9}  {}", f.protection.as_str(), output::size(f.size), f.path))?;
    }
    out.line("")?;
    out.line("tables")?;
    for t in &r.tables {
        out.line(format!("  {:<24} {}", t.name, t.rows))?;
    }
    Ok(())
}

fn print_identity(out: &Out, r: &Report) -> anyhow::Result<()> {
    out.line("identity")?;
    let k = &r.signing_key;
    let key = match k["storage"].as_str() {
        Some("sealed") => {
            let env = k["envelope"].as_str().unwrap_or("?");
            match k["state"].as_str() {
                Some("unlocked") => format!("sealed in the `{env}` envelope, unlocked here"),
                Some("foreign") => format!(
                    "sealed in the `{env}` envelope, locked: no slot opens for this owner or runtime \
                     (foreign file; `adf claim` re-keys it to you)"
                ),
                Some(s) => format!("sealed in the `{env}` envelope, {s} (`adf unlock` opens it)"),
                None => format!("sealed in the `{env}` envelope"),
            }
        }
        Some("plain") => "stored plain (no envelope)".into(),
        Some("legacy-password") => "encrypted with the legacy file password, locked (`adf unlock`)".into(),
        _ => "none".into(),
    };
    out.line(format!("  signing key  {key}"))?;
    for e in &r.envelopes {
        let slots = if e.slots.is_empty() { "-".to_string() } else { e.slots.join(", ") };
        out.line(format!("  {:<12} {:<9} {} sealed row(s); slots: {slots}", e.name, e.state.as_str(), e.sealed_rows))?;
    }
    for i in &r.identity {
        let algo = i.encryption_algo.as_deref().unwrap_or("plain");
        out.line(format!("  {:<34} {:<16} {:>6}", i.purpose, algo, output::size(i.value_len as u64)))?;
    }
    Ok(())
}
