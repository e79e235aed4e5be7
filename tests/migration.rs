//! Opening damaged and legacy files: repair of a damaged file, and the whole
//! migration ladder from a pre-v14 layout, with unknown tables and columns
//! preserved.

mod common;

use adf::store::access::Caller;
use adf::store::files::WriteOptions;
use adf::store::meta::MetaProtection;
use adf::store::{IntegrityCheck, NewAgent, Store};
use common::*;
use serde_json::{Value, json};

fn raw(path: &std::path::Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).unwrap()
}

#[test]
fn a_damaged_file_is_refused_then_repaired_with_the_original_kept() {
    let dir = tmp();
    let path = dir.path().join("a.adf");
    let (mut s, _) = Store::create(&path, &NewAgent::default()).unwrap();
    s.db_execute("CREATE TABLE local_big(x)", &[], false).unwrap();
    for i in 0..300 {
        s.db_execute("INSERT INTO local_big VALUES (?1)", &[json!(format!("{i:0>200}"))], false).unwrap();
    }
    s.close().unwrap();
    // Orphan the pages of an index and forget the clean close: damage that
    // integrity_check reports and VACUUM INTO leaves behind.
    let c = raw(&path);
    c.execute_batch("CREATE INDEX local_big_i ON local_big(x);").unwrap();
    c.execute_batch("PRAGMA writable_schema = ON; DELETE FROM sqlite_master WHERE name = 'local_big_i'; PRAGMA writable_schema = OFF;")
        .unwrap();
    c.execute("DELETE FROM adf_meta WHERE key = 'adf_clean_close'", []).unwrap();
    drop(c);
    // Opening finds the damage and refuses, changing nothing; the repair
    // is the owner's explicit step and keeps the original.
    let before = std::fs::read(&path).unwrap();
    let e = Store::open(&path).unwrap_err().to_string();
    assert!(e.contains("integrity_check found") && e.contains("adf repair"), "{e}");
    assert!(std::fs::read(&path).unwrap() == before);
    let report = adf::store::repair::repair(&path).unwrap();
    assert_eq!(report.method, "vacuum");
    assert!(report.complete(), "{report:?}");
    let s = Store::open(&path).unwrap();
    assert_eq!(s.integrity_check(), IntegrityCheck::Full);
    assert_eq!(s.db_query("SELECT count(*) AS n FROM local_big", &[], false).unwrap().rows[0]["n"], 300);
    s.close().unwrap();
    assert!(std::fs::read(dir.path().join("a.adf.corrupt")).unwrap() == before);
    let ok: String = raw(&path).query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(ok, "ok");
}

/// Build a file laid out the way schema 13 left it.
fn legacy_v13(path: &std::path::Path) {
    let c = raw(path);
    let cfg = json!({
        "adf_version": "0.2", "id": "legacyid0001", "name": "Old Timer",
        "model": {"provider": "anthropic", "model_id": "m", "thinking_budget": 2048, "max_loop_messages": 50},
        "instructions": "be useful",
        "context": {"max_loop_messages": 10},
        "tools": [
            {"name": "fs_read", "enabled": true},
            {"name": "sys_update_config", "enabled": true, "require_approval": true},
            {"name": "container_exec", "enabled": false},
            {"name": "msg_list_agents", "enabled": true, "visible": true}
        ],
        "triggers": {"document": {"enabled": true}},
        "security": {"allow_unsigned": true, "require_authorized": ["model_invoke"]},
        "limits": {"max_loop_rows": 500, "max_daily_budget_usd": 3, "execution_timeout_ms": 1000},
        "messaging": {"receive": true},
        "mcp": {"servers": [{"name": "git", "transport": "stdio", "require_approval": true}]},
        "metadata": {"created_at": "2025-01-01T00:00:00.000Z", "updated_at": "2025-02-01T00:00:00.000Z"},
        "x_future_field": {"keep": [1, 2, 3]}
    });
    c.execute_batch(
        "CREATE TABLE adf_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
         CREATE TABLE adf_config (id INTEGER PRIMARY KEY CHECK (id = 1), config_json TEXT NOT NULL, updated_at TEXT NOT NULL);
         CREATE TABLE adf_loop (seq INTEGER PRIMARY KEY AUTOINCREMENT, role TEXT NOT NULL, content_json TEXT NOT NULL,
           model TEXT, tokens INTEGER, created_at INTEGER NOT NULL, agent_note TEXT);
         CREATE TABLE adf_files (path TEXT PRIMARY KEY, content BLOB NOT NULL, mime_type TEXT, size INTEGER NOT NULL,
           protection TEXT NOT NULL DEFAULT 'none', created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
         CREATE TABLE adf_timers (id INTEGER PRIMARY KEY AUTOINCREMENT, schedule_json TEXT NOT NULL, next_wake_at INTEGER NOT NULL,
           payload TEXT, scope TEXT NOT NULL DEFAULT '[\"system\"]', lambda TEXT, warm INTEGER NOT NULL DEFAULT 0,
           run_count INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL, last_fired_at INTEGER);
         CREATE TABLE adf_tasks (id TEXT PRIMARY KEY, tool TEXT NOT NULL, args TEXT NOT NULL DEFAULT '{}',
           status TEXT NOT NULL DEFAULT 'pending', result TEXT, error TEXT, created_at INTEGER NOT NULL,
           completed_at INTEGER, origin TEXT);
         CREATE TABLE adf_identity (purpose TEXT PRIMARY KEY, value BLOB NOT NULL, encryption_algo TEXT DEFAULT 'plain',
           salt BLOB, kdf_params TEXT, code_access INTEGER NOT NULL DEFAULT 0);
         CREATE TABLE adf_peers (did TEXT PRIMARY KEY, name TEXT);
         CREATE INDEX idx_adf_peers_did ON adf_peers(did);
         CREATE TABLE local_kept (a TEXT);
         INSERT INTO local_kept VALUES ('still here');
         INSERT INTO adf_meta VALUES ('format', 'adf'), ('schema_version', '13'), ('did', 'did:key:z6MkOld'),
           ('identity_salt', 'c2FsdA=='), ('adf_attestations',
           '[{\"issuer\":\"did:key:z6MkA\",\"subject\":\"did:key:z6MkOld\",\"role\":\"owner\",\"issued_at\":\"2025-01-01T00:00:00Z\",\"signature\":\"ed25519:x\"}]');
         INSERT INTO adf_loop(role, content_json, model, tokens, created_at, agent_note) VALUES ('user', '[]', NULL, 12, 1, 'n');
         INSERT INTO adf_files VALUES ('document.md', CAST('# Old' AS BLOB), 'text/markdown', 5, 'no_delete', 'x', 'x');
         INSERT INTO adf_files VALUES ('mind.md', CAST('' AS BLOB), 'text/markdown', 0, 'no_delete', 'x', 'x');",
    )
    .unwrap();
    c.execute("INSERT INTO adf_config VALUES (1, ?1, 'x')", [cfg.to_string()]).unwrap();
    c.execute_batch("PRAGMA journal_mode = WAL;").unwrap();
}

#[test]
fn the_whole_ladder_from_a_v13_file() {
    let dir = tmp();
    let path = dir.path().join("old.adf");
    legacy_v13(&path);
    let mut s = Store::open(&path).unwrap();
    assert_eq!(s.migrated_from(), Some(13));
    let meta = |s: &Store, k: &str| s.meta_get(k).unwrap().map(|m| (m.value, m.protection));
    assert_eq!(meta(&s, "adf_schema_version"), Some(("28".into(), MetaProtection::Readonly)));
    assert_eq!(meta(&s, "schema_version"), None);
    assert_eq!(meta(&s, "format"), None);
    assert_eq!(meta(&s, "adf_did"), Some(("did:key:z6MkOld".into(), MetaProtection::Readonly)));
    assert_eq!(meta(&s, "adf_name").unwrap().0, "Old Timer");
    assert_eq!(meta(&s, "adf_handle").unwrap().0, "old-timer");
    assert_eq!(meta(&s, "adf_created_at").unwrap().0, "2025-01-01T00:00:00.000Z");
    assert_eq!(meta(&s, "status"), Some(("".into(), MetaProtection::None)));
    assert_eq!(meta(&s, "identity_salt"), None);
    assert_eq!(meta(&s, "adf_attestations"), None);

    let cfg = s.config_value().unwrap();
    assert_eq!(cfg["model"]["reasoning"], json!({"enabled": true, "max_tokens": 2048}));
    assert!(cfg["model"].get("thinking_budget").is_none() && cfg["model"].get("max_loop_messages").is_none());
    assert!(cfg["context"].get("max_loop_messages").is_none());
    assert!(cfg["limits"].get("max_loop_rows").is_none() && cfg["limits"].get("max_daily_budget_usd").is_none());
    assert_eq!(cfg["limits"]["execution_timeout_ms"], 1000);
    assert_eq!(cfg["tools"][1], json!({"name": "sys_update_config", "enabled": true, "restricted": true}));
    assert_eq!(cfg["tools"][2]["name"], "compute_exec");
    assert_eq!(cfg["mcp"]["servers"][0]["restricted"], true);
    assert_eq!(cfg["code_execution"]["restricted_methods"], json!(["attestation_issue", "model_invoke"]));
    assert!(cfg["security"].get("require_authorized").is_none());
    assert_eq!(cfg["triggers"]["on_file_change"]["targets"][0]["filter"]["watch"], "README.*");
    assert!(cfg["triggers"].get("document").is_none());
    assert_eq!(cfg["x_future_field"], json!({"keep": [1, 2, 3]}), "unknown fields kept");

    // Files: README from document.md, the seeded soul and log, mind skeleton.
    assert_eq!(s.file_read_text("README.md").unwrap(), "# Old");
    assert!(s.file_stat("document.md").unwrap().is_none());
    assert!(s.file_read_text("soul.md").unwrap().starts_with("# Soul"));
    assert!(s.file_read_text("mind/log.md").unwrap().starts_with("# Mind Log"));
    assert!(s.file_read_text("mind.md").unwrap().starts_with("# Mind"));
    // Tables: the new ones exist, peers are gone, unknown ones are kept.
    let names: Vec<String> = s.tables().unwrap().into_iter().map(|t| t.name).collect();
    for t in ["adf_inbox", "adf_outbox", "adf_audit", "adf_attestations", "adf_logs", "local_kept"] {
        assert!(names.contains(&t.to_string()), "{t} in {names:?}");
    }
    assert!(!names.contains(&"adf_peers".to_string()));
    let att = s.db_query("SELECT * FROM adf_loop", &[], false).unwrap();
    assert_eq!(att.rows[0]["agent_note"], "n", "unknown column kept");
    assert_eq!(att.rows[0]["tokens"], 12);
    // Legacy integer tokens read back.
    assert_eq!(s.loop_rows(None).unwrap()[0].tokens, Some(Value::from(12)));
    // The migrated file works like any other.
    s.file_write(Caller::AGENT, "notes.md", b"ok", &WriteOptions::default()).unwrap();
    s.close().unwrap();
    let s = Store::open(&path).unwrap();
    assert_eq!(s.migrated_from(), None);
    let attestations: i64 = raw(&path).query_row("SELECT count(*) FROM adf_attestations", [], |r| r.get(0)).unwrap();
    assert_eq!(attestations, 1);
    let salt: Vec<u8> = raw(&path)
        .query_row("SELECT value FROM adf_identity WHERE purpose = 'crypto:kdf:salt'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(salt, b"c2FsdA==");
}

#[test]
fn folders_rename_as_a_whole() {
    let dir = tmp();
    let path = dir.path().join("a.adf");
    let (mut s, _) = Store::create(&path, &NewAgent::default()).unwrap();
    for f in ["lib/a.ts", "lib/sub/b.ts", "library.md"] {
        s.file_write(Caller::Owner, f, b"x", &WriteOptions::default()).unwrap();
    }
    s.file_rename(Caller::AGENT, "lib", "code").unwrap();
    let names: Vec<String> = s.file_list("").unwrap().into_iter().map(|f| f.path).collect();
    assert!(names.contains(&"code/a.ts".into()) && names.contains(&"code/sub/b.ts".into()));
    assert!(names.contains(&"library.md".into()), "only the folder moves");
    assert!(s.file_rename(Caller::AGENT, "mind", "brain").is_err(), "mind/log.md is no_delete");
    assert!(s.file_stat("mind/log.md").unwrap().is_some());
    assert!(s.file_rename(Caller::AGENT, "nothing", "x").is_err());
}
