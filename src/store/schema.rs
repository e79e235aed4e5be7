//! The schema and its migrations. The ADF schema (format 0.2, version 28) is
//! created from `migrations/000_base_v28.sql`; older files climb the ladder of
//! numbered steps in `migrations/` (plus the Rust steps that rewrite JSON),
//! all in one transaction so a failure leaves the file as it was. adf's own
//! tables (`adfrs_*`) have a separate track and version record, so the file
//! keeps saying `adf_schema_version = 28` and the reference reads it.

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use super::{defaults, now_iso, now_ms};

/// The ADF storage schema version whose DDL adf knows and writes.
pub const ADF_SCHEMA_VERSION: i64 = 28;
/// The format/contract version (`adf_meta.adf_version`).
pub const ADF_FORMAT_VERSION: &str = "0.2";
/// The version of adf's own `adfrs_*` track.
pub const OWN_SCHEMA_VERSION: i64 = 1;

const BASE: &str = include_str!("../../migrations/000_base_v28.sql");

type RustStep = fn(&Connection) -> rusqlite::Result<()>;

struct Step {
    to: i64,
    sql: Option<&'static str>,
    rust: Option<RustStep>,
}

/// The ladder, in order. Steps before 14 are legacy history whose structure
/// the structure pass restores from the base DDL.
const LADDER: &[Step] = &[
    Step { to: 14, sql: Some(include_str!("../../migrations/014_meta_keys.sql")), rust: Some(step14_meta) },
    Step { to: 15, sql: Some(include_str!("../../migrations/015_meta_protection.sql")), rust: None },
    Step { to: 16, sql: Some(include_str!("../../migrations/016_timers_locked.sql")), rust: None },
    Step { to: 17, sql: Some(include_str!("../../migrations/017_files_authorized.sql")), rust: None },
    Step { to: 18, sql: Some(include_str!("../../migrations/018_tasks_requires_authorization.sql")), rust: None },
    Step { to: 19, sql: Some(include_str!("../../migrations/019_tasks_executor_managed.sql")), rust: None },
    Step { to: 20, sql: None, rust: Some(step20_restricted) },
    Step { to: 21, sql: Some(include_str!("../../migrations/021_drop_peers.sql")), rust: None },
    Step { to: 22, sql: Some(include_str!("../../migrations/022_readme.sql")), rust: Some(step22_watch) },
    Step { to: 23, sql: None, rust: Some(step23_config) },
    Step { to: 24, sql: None, rust: Some(step24_attestations) },
    Step { to: 25, sql: None, rust: Some(step25_soul) },
    Step { to: 26, sql: Some(include_str!("../../migrations/026_timers_expired.sql")), rust: None },
    Step { to: 27, sql: Some(include_str!("../../migrations/027_tasks_approval_meta.sql")), rust: None },
    Step { to: 28, sql: Some(include_str!("../../migrations/028_loop_ord.sql")), rust: Some(step28_audit_mind) },
];

const OWN: &[(i64, &str)] = &[(1, include_str!("../../migrations/adfrs_001_schema.sql"))];

/// Create every table of a new file (inside the caller's transaction).
pub fn create(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(BASE)?;
    migrate_own(conn)?;
    // Written in most turns: made now, so no turn changes the schema.
    super::spend::create_table(conn)
}

/// The file's ADF schema version: `adf_schema_version`, else legacy
/// `schema_version`, else 0.
pub fn read_version(conn: &Connection) -> rusqlite::Result<i64> {
    for key in ["adf_schema_version", "schema_version"] {
        let v: Option<String> =
            conn.query_row("SELECT value FROM adf_meta WHERE key = ?1", [key], |r| r.get(0)).optional()?;
        if let Some(v) = v {
            return Ok(v.trim().parse().unwrap_or(0));
        }
    }
    Ok(0)
}

/// The schema version as text, when the file records one, and under which key.
pub fn version_text(conn: &Connection) -> rusqlite::Result<Option<(&'static str, String)>> {
    for key in ["adf_schema_version", "schema_version"] {
        let v: Option<String> =
            conn.query_row("SELECT value FROM adf_meta WHERE key = ?1", [key], |r| r.get(0)).optional()?;
        if let Some(v) = v {
            return Ok(Some((key, v)));
        }
    }
    Ok(None)
}

/// A failed ladder step: the version it was climbing to and why.
#[derive(Debug)]
pub struct StepFailure {
    pub version: i64,
    pub detail: String,
}

/// Climb from `from` to the current version. The caller wraps this in one
/// transaction; nothing is committed when a step fails.
pub fn migrate(conn: &Connection, from: i64) -> Result<(), StepFailure> {
    let fail = |version: i64| move |e: rusqlite::Error| StepFailure { version, detail: e.to_string() };
    structure_pass(conn).map_err(fail(from.max(13) + 1))?;
    for step in LADDER.iter().filter(|s| s.to > from) {
        if let Some(sql) = step.sql {
            exec_idempotent(conn, sql).map_err(fail(step.to))?;
        }
        if let Some(rust) = step.rust {
            rust(conn).map_err(fail(step.to))?;
        }
        set_version(conn, step.to).map_err(fail(step.to))?;
    }
    ladder_tail(conn).map_err(fail(ADF_SCHEMA_VERSION))?;
    // Indexes last: they may name columns the steps added.
    structure_pass(conn).map_err(fail(ADF_SCHEMA_VERSION))?;
    migrate_own(conn).map_err(fail(ADF_SCHEMA_VERSION))
}

fn set_version(conn: &Connection, v: i64) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO adf_meta(key, value, protection) VALUES ('adf_schema_version', ?1, 'readonly')
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        [v.to_string()],
    )?;
    Ok(())
}

/// Bring adf's own `adfrs_*` track to its current version.
pub fn migrate_own(conn: &Connection) -> rusqlite::Result<()> {
    let has: bool = conn
        .query_row("SELECT 1 FROM sqlite_master WHERE type='table' AND name='adfrs_schema'", [], |_| Ok(true))
        .optional()?
        .unwrap_or(false);
    let current: i64 = if has {
        conn.query_row("SELECT version FROM adfrs_schema WHERE component='adfrs'", [], |r| r.get(0))
            .optional()?
            .unwrap_or(0)
    } else {
        0
    };
    for (v, sql) in OWN.iter().filter(|(v, _)| *v > current) {
        conn.execute_batch(sql)?;
        conn.execute(
            "INSERT INTO adfrs_schema(component, version) VALUES ('adfrs', ?1)
             ON CONFLICT(component) DO UPDATE SET version = excluded.version",
            [v],
        )?;
    }
    Ok(())
}

/// Whether adf's own track is behind (cheap check for the open fast path).
pub fn own_is_current(conn: &Connection) -> rusqlite::Result<bool> {
    let v: Option<i64> = conn
        .query_row("SELECT version FROM adfrs_schema WHERE component='adfrs'", [], |r| r.get(0))
        .optional()
        .or_else(|e| match e {
            e if super::error::no_such_table(&e) => Ok(None),
            e => Err(e),
        })?;
    Ok(v == Some(OWN_SCHEMA_VERSION))
}

// ---------------------------------------------------------------------------
// Structure pass: tables, columns and indexes of the base DDL that are missing.

struct TableDdl<'a> {
    name: &'a str,
    create: String,
    columns: Vec<(&'a str, &'a str)>,
}

fn base_tables() -> Vec<TableDdl<'static>> {
    let mut out = Vec::new();
    let mut lines = BASE.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix("CREATE TABLE IF NOT EXISTS ") else { continue };
        let name = rest.trim_end_matches(" (").trim();
        let mut create = String::from(line);
        let mut columns = Vec::new();
        for body in lines.by_ref() {
            create.push('\n');
            create.push_str(body);
            if body.starts_with(");") {
                break;
            }
            let def = body.trim().trim_end_matches(',');
            let (col, _) = def.split_once(' ').unwrap_or((def, ""));
            columns.push((col.trim_matches('"'), def));
        }
        out.push(TableDdl { name, create, columns });
    }
    out
}

fn structure_pass(conn: &Connection) -> rusqlite::Result<()> {
    for table in base_tables() {
        let existing = table_columns(conn, table.name)?;
        if existing.is_empty() {
            conn.execute_batch(&table.create)?;
            continue;
        }
        for (col, def) in &table.columns {
            if existing.iter().any(|c| c.eq_ignore_ascii_case(col)) || def.contains("PRIMARY KEY") {
                continue;
            }
            conn.execute_batch(&format!("ALTER TABLE {} ADD COLUMN {}", table.name, addable(def)))?;
        }
    }
    for body in statements(BASE) {
        if body.starts_with("CREATE INDEX") {
            conn.execute_batch(&body)?;
        }
    }
    Ok(())
}

/// SQLite cannot add a NOT NULL column without a default: give it one.
fn addable(def: &str) -> String {
    if def.contains("NOT NULL") && !def.contains("DEFAULT") {
        let default = if def.contains("INTEGER") { "0" } else { "''" };
        format!("{def} DEFAULT {default}")
    } else {
        def.to_string()
    }
}

/// The statements of a migration file: `--` comment lines dropped first (they
/// may hold a `;`), then split on `;`. Migration files keep `;` out of
/// string literals.
fn statements(sql: &str) -> Vec<String> {
    let code: Vec<&str> = sql.lines().filter(|l| !l.trim_start().starts_with("--")).collect();
    code.join("\n").split(';').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

pub(crate) fn table_columns(conn: &Connection, table: &str) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info(?1)")?;
    stmt.query_map([table], |r| r.get(0))?.collect()
}

/// Run a migration file statement by statement; `ALTER TABLE t ADD COLUMN c`
/// is skipped when the column exists, so every step is idempotent.
fn exec_idempotent(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    for body in statements(sql) {
        let words: Vec<&str> = body.split_whitespace().collect();
        if words.len() >= 6
            && words[0].eq_ignore_ascii_case("ALTER")
            && words[3].eq_ignore_ascii_case("ADD")
            && words[4].eq_ignore_ascii_case("COLUMN")
        {
            let cols = table_columns(conn, words[2])?;
            if cols.iter().any(|c| c.eq_ignore_ascii_case(words[5])) {
                continue;
            }
        }
        conn.execute_batch(&body)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Rust steps: the parts of the ladder that rewrite JSON or need defaults.

fn config(conn: &Connection) -> rusqlite::Result<Option<Value>> {
    let text: Option<String> =
        conn.query_row("SELECT config_json FROM adf_config WHERE id = 1", [], |r| r.get(0)).optional()?;
    Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
}

fn save_config(conn: &Connection, cfg: &Value) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE adf_config SET config_json = ?1 WHERE id = 1",
        [serde_json::to_string(cfg).unwrap_or_default()],
    )?;
    Ok(())
}

/// Apply `f` to the config; persist only when it changed something.
fn edit_config(conn: &Connection, f: impl FnOnce(&mut Value) -> bool) -> rusqlite::Result<()> {
    if let Some(mut cfg) = config(conn)?
        && f(&mut cfg)
    {
        save_config(conn, &cfg)?;
    }
    Ok(())
}

fn meta_insert_missing(conn: &Connection, key: &str, value: &str) -> rusqlite::Result<()> {
    conn.execute("INSERT OR IGNORE INTO adf_meta(key, value) VALUES (?1, ?2)", params![key, value])?;
    Ok(())
}

fn step14_meta(conn: &Connection) -> rusqlite::Result<()> {
    let cfg = config(conn)?.unwrap_or(Value::Null);
    let name = cfg.get("name").and_then(Value::as_str).unwrap_or("untitled");
    let handle =
        cfg.get("handle").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| super::create::slug(name));
    let created =
        cfg.pointer("/metadata/created_at").and_then(Value::as_str).map(str::to_string).unwrap_or_else(now_iso);
    let updated = cfg
        .pointer("/metadata/updated_at")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| created.clone());
    meta_insert_missing(conn, "adf_name", name)?;
    meta_insert_missing(conn, "adf_handle", &handle)?;
    meta_insert_missing(conn, "adf_parent_did", "")?;
    meta_insert_missing(conn, "adf_created_at", &created)?;
    meta_insert_missing(conn, "adf_updated_at", &updated)?;
    for (old, purpose) in [("identity_salt", "crypto:kdf:salt"), ("identity_kdf_params", "crypto:kdf:params")] {
        let v: Option<String> =
            conn.query_row("SELECT value FROM adf_meta WHERE key = ?1", [old], |r| r.get(0)).optional()?;
        if let Some(v) = v {
            conn.execute(
                "INSERT OR IGNORE INTO adf_identity(purpose, value, encryption_algo) VALUES (?1, ?2, 'plain')",
                params![purpose, v.as_bytes()],
            )?;
            conn.execute("DELETE FROM adf_meta WHERE key = ?1", [old])?;
        }
    }
    Ok(())
}

fn fold_require_approval(list: Option<&mut Value>) -> bool {
    let mut changed = false;
    if let Some(Value::Array(items)) = list {
        for item in items.iter_mut().filter_map(Value::as_object_mut) {
            if let Some(v) = item.remove("require_approval") {
                changed = true;
                if v.as_bool() == Some(true) {
                    item.insert("restricted".into(), Value::Bool(true));
                }
            }
        }
    }
    changed
}

fn step20_restricted(conn: &Connection) -> rusqlite::Result<()> {
    edit_config(conn, |cfg| {
        let mut changed = fold_require_approval(cfg.get_mut("tools"));
        changed |= fold_require_approval(cfg.pointer_mut("/mcp/servers"));
        let legacy =
            cfg.get_mut("security").and_then(Value::as_object_mut).and_then(|s| s.remove("require_authorized"));
        if let Some(legacy) = legacy {
            changed = true;
            if let Value::Array(methods) = legacy {
                let ce = cfg
                    .as_object_mut()
                    .map(|o| o.entry("code_execution").or_insert_with(|| Value::Object(Default::default())));
                if let Some(Value::Object(ce)) = ce {
                    let list =
                        ce.entry("restricted_methods").or_insert_with(|| serde_json::json!(["attestation_issue"]));
                    if let Value::Array(list) = list {
                        for m in methods {
                            if !list.contains(&m) {
                                list.push(m);
                            }
                        }
                    }
                }
            }
        }
        changed
    })
}

fn step22_watch(conn: &Connection) -> rusqlite::Result<()> {
    edit_config(conn, |cfg| {
        let mut changed = false;
        if let Some(Value::Array(targets)) = cfg.pointer_mut("/triggers/on_file_change/targets") {
            for t in targets {
                if let Some(w) = t.pointer_mut("/filter/watch")
                    && w.as_str() == Some("document.*")
                {
                    *w = Value::String("README.*".into());
                    changed = true;
                }
            }
        }
        changed
    })
}

fn step23_config(conn: &Connection) -> rusqlite::Result<()> {
    edit_config(conn, |cfg| {
        let mut changed = false;
        for (section, key) in [
            ("model", "max_loop_messages"),
            ("context", "max_loop_messages"),
            ("limits", "max_loop_rows"),
            ("limits", "max_daily_budget_usd"),
            ("limits", "compaction_threshold_tokens"),
        ] {
            if let Some(obj) = cfg.get_mut(section).and_then(Value::as_object_mut) {
                changed |= obj.remove(key).is_some();
            }
        }
        if let Some(obj) = cfg.as_object_mut() {
            changed |= obj.remove("max_loop_messages").is_some();
        }
        if let Some(model) = cfg.get_mut("model").and_then(Value::as_object_mut)
            && let Some(tb) = model.remove("thinking_budget")
        {
            changed = true;
            if let Some(n) = tb.as_i64().filter(|n| *n > 0) {
                model.insert("reasoning".into(), serde_json::json!({"enabled": true, "max_tokens": n}));
            }
        }
        changed
    })
}

fn step24_attestations(conn: &Connection) -> rusqlite::Result<()> {
    let legacy: Option<String> =
        conn.query_row("SELECT value FROM adf_meta WHERE key = 'adf_attestations'", [], |r| r.get(0)).optional()?;
    let Some(legacy) = legacy else { return Ok(()) };
    if let Ok(Value::Array(items)) = serde_json::from_str::<Value>(&legacy) {
        for a in items {
            let s = |k: &str| a.get(k).and_then(Value::as_str).map(str::to_string);
            conn.execute(
                "INSERT INTO adf_attestations(issuer, subject, role, issued_at, expires_at, scope, signature, raw_json)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    s("issuer").unwrap_or_default(),
                    s("subject").unwrap_or_default(),
                    s("role").unwrap_or_default(),
                    s("issued_at").unwrap_or_default(),
                    s("expires_at"),
                    a.get("scope").map(|v| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())),
                    s("signature").unwrap_or_default(),
                    a.to_string()
                ],
            )?;
        }
    }
    conn.execute("DELETE FROM adf_meta WHERE key = 'adf_attestations'", [])?;
    Ok(())
}

fn seed_file(conn: &Connection, path: &str, text: &str) -> rusqlite::Result<()> {
    let now = now_iso();
    conn.execute(
        "INSERT OR IGNORE INTO adf_files(path, content, mime_type, size, protection, authorized, created_at, updated_at)
         VALUES (?1, ?2, 'text/markdown', ?3, 'no_delete', 0, ?4, ?4)",
        params![path, text.as_bytes(), text.len() as i64, now],
    )?;
    Ok(())
}

fn step25_soul(conn: &Connection) -> rusqlite::Result<()> {
    seed_file(conn, "soul.md", defaults::SOUL_MD)
}

fn step28_audit_mind(conn: &Connection) -> rusqlite::Result<()> {
    let cols = table_columns(conn, "adf_audit")?;
    if cols.iter().any(|c| c == "start_at" || c == "end_at") {
        conn.execute_batch(
            "CREATE TABLE adf_audit_v28 (
               id INTEGER PRIMARY KEY AUTOINCREMENT, source TEXT NOT NULL, start_seq INTEGER,
               end_seq INTEGER, ref TEXT, entry_count INTEGER NOT NULL, size_bytes INTEGER NOT NULL,
               data BLOB NOT NULL, created_at INTEGER NOT NULL);
             INSERT INTO adf_audit_v28(id, source, entry_count, size_bytes, data, created_at)
               SELECT id, source, entry_count, size_bytes, data, created_at FROM adf_audit;
             DROP TABLE adf_audit;
             ALTER TABLE adf_audit_v28 RENAME TO adf_audit;",
        )?;
    }
    backfill_audit(conn)?;
    seed_file(conn, "mind/log.md", defaults::MIND_LOG_MD)?;
    let now = now_iso();
    conn.execute(
        "UPDATE adf_files SET content = ?1, size = ?2, updated_at = ?3, authorized = 0
         WHERE path = 'mind.md' AND trim(CAST(content AS TEXT), ' ' || char(9) || char(10) || char(13)) = ''",
        params![defaults::MIND_MD.as_bytes(), defaults::MIND_MD.len() as i64, now],
    )?;
    Ok(())
}

/// Fill `start_seq`/`end_seq` (loop snapshots) and `ref` (message and file
/// snapshots) from the compressed blobs where they are missing.
fn backfill_audit(conn: &Connection) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare(
        "SELECT id, source, data FROM adf_audit WHERE (source = 'loop' AND start_seq IS NULL)
         OR (source IN ('inbox_message','outbox_message','file') AND ref IS NULL)",
    )?;
    let rows: Vec<(i64, String, Vec<u8>)> =
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect::<rusqlite::Result<_>>()?;
    for (id, source, data) in rows {
        let Ok(json) = super::audit::decode(&data) else { continue };
        if source == "loop" {
            let seqs: Vec<i64> = json
                .as_array()
                .map(|a| a.iter().filter_map(|r| r.get("seq").and_then(Value::as_i64)).collect())
                .unwrap_or_default();
            if let (Some(min), Some(max)) = (seqs.iter().min(), seqs.iter().max()) {
                conn.execute("UPDATE adf_audit SET start_seq = ?1, end_seq = ?2 WHERE id = ?3", params![min, max, id])?;
            }
        } else {
            let key = if source == "file" { "path" } else { "id" };
            if let Some(r) = json.get(key).and_then(Value::as_str) {
                conn.execute("UPDATE adf_audit SET ref = ?1 WHERE id = ?2", params![r, id])?;
            }
        }
    }
    Ok(())
}

/// Always run at the end of a migration: identity keys readonly, the
/// `container_exec` tool renamed, legacy v1 trigger shapes replaced.
fn ladder_tail(conn: &Connection) -> rusqlite::Result<()> {
    force_identity_readonly(conn)?;
    edit_config(conn, |cfg| {
        let mut changed = false;
        if let Some(Value::Array(tools)) = cfg.get_mut("tools") {
            for t in tools {
                if t.get("name").and_then(Value::as_str) == Some("container_exec") {
                    t["name"] = Value::String("compute_exec".into());
                    changed = true;
                }
            }
        }
        if let Some(triggers) = cfg.get_mut("triggers").and_then(Value::as_object_mut)
            && (triggers.contains_key("document") || triggers.contains_key("agent"))
            && let Value::Object(d) = defaults::default_triggers()
        {
            *triggers = d;
            changed = true;
        }
        changed
    })?;
    let _ = now_ms();
    Ok(())
}

/// Whether any identity meta key lost its `readonly` protection.
pub fn identity_keys_loose(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT count(*) FROM adf_meta
         WHERE key IN ('adf_did','adf_owner_did','adf_runtime_did','adf_did_history') AND protection <> 'readonly'",
        [],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}

/// Re-assert `readonly` on the identity meta keys (checked on every open).
pub fn force_identity_readonly(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE adf_meta SET protection = 'readonly'
         WHERE key IN ('adf_did','adf_owner_did','adf_runtime_did','adf_did_history') AND protection <> 'readonly'",
        [],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_files_split_into_statements() {
        assert_eq!(statements("-- a; b\nSELECT 1;\n-- c;\nSELECT 2"), ["SELECT 1", "SELECT 2"]);
        for sql in LADDER.iter().filter_map(|s| s.sql) {
            for stmt in statements(sql) {
                assert!(!stmt.contains("--"), "{stmt}");
            }
        }
    }

    #[test]
    fn base_ddl_parses_into_all_tables() {
        let names: Vec<_> = base_tables().iter().map(|t| t.name).collect();
        assert_eq!(
            names,
            [
                "adf_meta",
                "adf_config",
                "adf_loop",
                "adf_inbox",
                "adf_outbox",
                "adf_timers",
                "adf_files",
                "adf_audit",
                "adf_identity",
                "adf_attestations",
                "adf_tasks",
                "adf_logs"
            ]
        );
        let inbox = base_tables().into_iter().find(|t| t.name == "adf_inbox").unwrap();
        assert!(inbox.columns.iter().any(|(c, _)| *c == "from"));
        assert_eq!(inbox.columns.len(), 24);
    }

    #[test]
    fn structure_pass_adds_missing_columns_and_keeps_unknown_ones() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE adf_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE adf_timers(id INTEGER PRIMARY KEY AUTOINCREMENT, schedule_json TEXT NOT NULL,
               next_wake_at INTEGER NOT NULL, extra_col TEXT);",
        )
        .unwrap();
        structure_pass(&conn).unwrap();
        let cols = table_columns(&conn, "adf_timers").unwrap();
        assert!(cols.contains(&"locked".to_string()));
        assert!(cols.contains(&"expired".to_string()));
        assert!(cols.contains(&"extra_col".to_string()));
        assert!(table_columns(&conn, "adf_meta").unwrap().contains(&"protection".to_string()));
        // Idempotent.
        structure_pass(&conn).unwrap();
    }
}
