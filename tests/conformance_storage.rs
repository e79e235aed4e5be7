//! Conformance points 1–21 of spec/index.md (storage; files, meta, config),
//! each checked on real agent files on disk.

mod common;

use adf::store::access::{Caller, DenialKind};
use adf::store::config::AgentConfig;
use adf::store::files::{Edit, Protection, WriteOptions};
use adf::store::loop_rows::NewLoopRow;
use adf::store::meta::MetaProtection;
use adf::store::timers::{NewTimer, Schedule};
use adf::store::{IntegrityCheck, NewAgent, Store, StoreError};
use common::*;
use serde_json::{Value, json};

fn new_agent(dir: &std::path::Path, handle: Option<&str>) -> (Store, std::path::PathBuf) {
    let path = dir.join("a.adf");
    let (s, _) = Store::create(&path, &NewAgent { name: Some("Agent A"), handle, ..Default::default() }).unwrap();
    (s, path)
}

fn raw(path: &std::path::Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).unwrap()
}

const AGENT_OVERRIDE: Caller = Caller::Agent { authorized: false, override_approved: true };

#[test]
fn p01_pragmas_and_sqlite_vec_on_every_connection() {
    let dir = tmp();
    let (mut s, path) = new_agent(dir.path(), None);
    assert_eq!(s.pragma("journal_mode").unwrap(), "wal");
    assert_eq!(s.pragma("synchronous").unwrap(), "1");
    assert_eq!(s.pragma("busy_timeout").unwrap(), "5000");
    assert_eq!(s.pragma("foreign_keys").unwrap(), "1");
    s.db_execute("CREATE VIRTUAL TABLE local_vec USING vec0(embedding float[3])", &[], false).unwrap();
    s.db_execute(
        "INSERT INTO local_vec(rowid, embedding) VALUES (1, ?1), (2, ?2)",
        &[json!("[0,0,1]"), json!("[1,0,0]")],
        false,
    )
    .unwrap();
    s.close().unwrap();
    // A second connection (a new open) still has vec0.
    let s = Store::open(&path).unwrap();
    let out = s
        .db_query("SELECT rowid FROM local_vec WHERE embedding MATCH ?1 AND k = 1", &[json!("[0.9,0,0.1]")], false)
        .unwrap();
    assert_eq!(out.rows[0]["rowid"], 2);
    let ro = Store::open_read_only(&path);
    assert!(matches!(ro, Ok(ref r) if r.pragma("busy_timeout").unwrap() == "5000"));
}

#[test]
fn p02_fresh_meta_rows_and_protections() {
    let dir = tmp();
    let (s, _) = new_agent(dir.path(), None);
    let prot = |k: &str| s.meta_get(k).unwrap().map(|m| (m.value, m.protection)).unwrap();
    assert_eq!(prot("adf_version"), ("0.2".into(), MetaProtection::Readonly));
    assert_eq!(prot("adf_schema_version"), ("28".into(), MetaProtection::Readonly));
    assert_eq!(prot("status"), ("".into(), MetaProtection::None));
    assert_eq!(prot("adf_name").1, MetaProtection::None);
    assert_eq!(prot("adf_updated_at").1, MetaProtection::None);
    assert_eq!(prot("adf_handle"), ("agent-a".into(), MetaProtection::Readonly));
    assert!(prot("adf_did").0.starts_with("did:key:z6Mk"));
    let dir2 = tmp();
    let (s2, _) = new_agent(dir2.path(), Some("given"));
    assert_eq!(s2.meta_get("adf_handle").unwrap().unwrap().protection, MetaProtection::None);
    assert_eq!(s2.config_value().unwrap()["handle"], "given");
}

#[test]
fn p03_fresh_files() {
    let dir = tmp();
    let (s, _) = new_agent(dir.path(), None);
    let files = s.file_list("").unwrap();
    let names: Vec<_> = files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(names, ["README.md", "mind.md", "mind/log.md", "soul.md"]);
    for f in &files {
        assert_eq!(f.mime_type.as_deref(), Some("text/markdown"));
        assert_eq!(f.protection, Protection::NoDelete);
    }
    let mind = s.file_read_text("mind.md").unwrap();
    assert!(mind.starts_with("# Mind\n") && mind.contains("## Always") && mind.contains("## Pages"));
    let soul = s.file_read_text("soul.md").unwrap();
    for h in ["# Soul", "## Voice", "## Taboos", "## Exemplars", "## Origin"] {
        assert!(soul.contains(h), "{h}");
    }
}

#[test]
fn p04_single_config_row_and_meta_mirrors() {
    let dir = tmp();
    let (mut s, path) = new_agent(dir.path(), None);
    let before = s.meta_get("adf_updated_at").unwrap().unwrap().value;
    std::thread::sleep(std::time::Duration::from_millis(5));
    s.config_set(Caller::Owner, "name", json!("Renamed")).unwrap();
    s.config_set(Caller::Owner, "handle", json!("renamed")).unwrap();
    assert_eq!(s.meta_get("adf_name").unwrap().unwrap().value, "Renamed");
    assert_eq!(s.meta_get("adf_handle").unwrap().unwrap().value, "renamed");
    let after = s.meta_get("adf_updated_at").unwrap().unwrap().value;
    assert!(after > before, "{after} > {before}");
    assert_eq!(s.config_value().unwrap()["metadata"]["updated_at"], after);
    s.close().unwrap();
    let c = raw(&path);
    let n: i64 = c.query_row("SELECT count(*) FROM adf_config", [], |r| r.get(0)).unwrap();
    assert_eq!(n, 1);
    let err = c.execute("INSERT INTO adf_config(id, config_json, updated_at) VALUES (2, '{}', 'x')", []).unwrap_err();
    assert!(err.to_string().contains("CHECK"), "{err}");
}

#[test]
fn p05_newer_schema_opens_with_warning_and_no_migration() {
    let dir = tmp();
    let (s, path) = new_agent(dir.path(), None);
    s.close().unwrap();
    raw(&path).execute("UPDATE adf_meta SET value = '32' WHERE key = 'adf_schema_version'", []).unwrap();
    let s = Store::open(&path).unwrap();
    assert_eq!(s.schema_version(), 32);
    assert!(s.warnings()[0].contains("newer"), "{:?}", s.warnings());
    assert_eq!(s.migrated_from(), None);
    s.close().unwrap();
    let v: String =
        raw(&path).query_row("SELECT value FROM adf_meta WHERE key='adf_schema_version'", [], |r| r.get(0)).unwrap();
    assert_eq!(v, "32");
}

/// Turn a fresh v28 file into what a v27 file looked like.
fn make_v27(path: &std::path::Path) {
    let c = raw(path);
    c.execute_batch(
        "ALTER TABLE adf_loop DROP COLUMN ord;
         DROP INDEX idx_adf_audit_source_start;
         DROP TABLE adf_audit;
         CREATE TABLE adf_audit (id INTEGER PRIMARY KEY AUTOINCREMENT, source TEXT NOT NULL, start_at INTEGER,
           end_at INTEGER, entry_count INTEGER NOT NULL, size_bytes INTEGER NOT NULL, data BLOB NOT NULL,
           created_at INTEGER NOT NULL);
         DELETE FROM adf_files WHERE path = 'mind/log.md';
         UPDATE adf_files SET content = CAST('  ' AS BLOB), size = 2 WHERE path = 'mind.md';
         UPDATE adf_meta SET value = '27' WHERE key = 'adf_schema_version';",
    )
    .unwrap();
    let blob = adf::store::audit::encode(&json!([{"seq": 3, "role": "user"}, {"seq": 7, "role": "assistant"}]));
    c.execute(
        "INSERT INTO adf_audit(source, start_at, end_at, entry_count, size_bytes, data, created_at) VALUES ('loop', 1, 2, 2, 10, ?1, 5)",
        [blob],
    )
    .unwrap();
    c.execute("INSERT INTO adf_loop(role, content_json, created_at) VALUES ('user', '[]', 1)", []).unwrap();
}

#[test]
fn p05_older_schema_migrates_forward() {
    let dir = tmp();
    let (s, path) = new_agent(dir.path(), None);
    s.close().unwrap();
    make_v27(&path);
    let s = Store::open(&path).unwrap();
    assert_eq!(s.migrated_from(), Some(27));
    assert_eq!(s.schema_version(), 28);
    assert_eq!(s.meta_get("adf_schema_version").unwrap().unwrap().value, "28");
    assert!(s.file_stat("mind/log.md").unwrap().is_some());
    assert!(s.file_read_text("mind.md").unwrap().starts_with("# Mind"));
    let audit = s.db_query("SELECT source, start_seq, end_seq FROM adf_audit", &[], false).unwrap();
    assert_eq!(audit.rows[0]["start_seq"], 3);
    assert_eq!(audit.rows[0]["end_seq"], 7);
    assert_eq!(s.loop_rows(None).unwrap().len(), 1);
    s.close().unwrap();
    assert!(!dir.path().join("a.adf.bak").exists(), "bak removed on success");
    let c = raw(&path);
    let cols: Vec<String> = c
        .prepare("SELECT name FROM pragma_table_info('adf_loop')")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(cols.contains(&"ord".to_string()));
}

#[test]
fn p05_failed_migration_keeps_bak_and_changes_nothing() {
    let dir = tmp();
    let (s, path) = new_agent(dir.path(), None);
    s.close().unwrap();
    // A v18 file whose adf_tasks is a view: the ladder cannot add columns.
    raw(&path)
        .execute_batch(
            "DROP TABLE adf_tasks; CREATE VIEW adf_tasks AS SELECT 1 AS id;
             UPDATE adf_meta SET value = '18' WHERE key = 'adf_schema_version';",
        )
        .unwrap();
    let before = std::fs::read(&path).unwrap();
    let err = Store::open(&path).unwrap_err();
    match &err {
        StoreError::Migration { backup, .. } => assert!(backup.exists()),
        other => panic!("expected a migration error, got {other}"),
    }
    assert!(err.to_string().contains("a.adf.bak"), "{err}");
    assert!(std::fs::read(&path).unwrap() == before, "file unchanged");
    let v: String =
        raw(&path).query_row("SELECT value FROM adf_meta WHERE key='adf_schema_version'", [], |r| r.get(0)).unwrap();
    assert_eq!(v, "18");
    // A second failing open renames the stale backup aside, never overwrites it.
    assert!(Store::open(&path).is_err());
    let baks = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains(".bak"))
        .count();
    assert_eq!(baks, 2);
}

#[test]
fn p06_clean_close_marker_and_integrity_gate() {
    let dir = tmp();
    let (mut s, path) = new_agent(dir.path(), None);
    // adf takes the marker out with the session's first write (the
    // reference does it on open): a session that writes nothing leaves the
    // file byte-for-byte as it was.
    assert!(s.meta_get("adf_clean_close").unwrap().is_some(), "untouched until the first write");
    s.meta_set(Caller::AGENT, "k", "v", None).unwrap();
    assert!(s.meta_get("adf_clean_close").unwrap().is_none(), "deleted once the file is written");
    s.close().unwrap();
    let marker = |p: &std::path::Path| -> i64 {
        raw(p).query_row("SELECT count(*) FROM adf_meta WHERE key='adf_clean_close'", [], |r| r.get(0)).unwrap()
    };
    assert_eq!(marker(&path), 1);
    let s = Store::open(&path).unwrap();
    assert_eq!(s.integrity_check(), IntegrityCheck::Skipped);
    s.close().unwrap();
    // Marker present with sidecars: quick_check.
    std::fs::write(dir.path().join("a.adf-wal"), b"").unwrap();
    let s = Store::open(&path).unwrap();
    assert_eq!(s.integrity_check(), IntegrityCheck::Quick);
    s.close().unwrap();
    // Marker absent (a crash): full integrity_check, and the marker is
    // back after a clean close even without writes.
    raw(&path).execute("DELETE FROM adf_meta WHERE key='adf_clean_close'", []).unwrap();
    let s = Store::open(&path).unwrap();
    assert_eq!(s.integrity_check(), IntegrityCheck::Full);
    drop(s);
    assert_eq!(marker(&path), 1, "dropping a store closes it cleanly too");
    // A session that only reads changes no byte of the file.
    let before = std::fs::read(&path).unwrap();
    let s = Store::open(&path).unwrap();
    s.file_list("").unwrap();
    s.close().unwrap();
    assert!(std::fs::read(&path).unwrap() == before);
}

#[test]
fn p07_loop_order_and_stable_seqs() {
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    let c = json!([{"type": "text", "text": "x"}]);
    let row = |ord| NewLoopRow { role: "user", content: &c, model: None, tokens: None, ord };
    let a = s.loop_append(&row(None)).unwrap();
    let b = s.loop_append(&row(None)).unwrap();
    let summary = s.loop_append(&row(Some(b - 1))).unwrap();
    let order: Vec<i64> = s.loop_rows(None).unwrap().iter().map(|r| r.seq).collect();
    assert_eq!(order, [a, summary, b]);
    s.db_execute("CREATE TABLE local_t(x)", &[], false).unwrap();
    let path = s.path().to_path_buf();
    s.close().unwrap();
    raw(&path).execute("DELETE FROM adf_loop WHERE seq = ?1", [summary]).unwrap();
    let mut s = Store::open(&path).unwrap();
    let next = s.loop_append(&row(None)).unwrap();
    assert!(next > summary, "seq {next} reused");
}

#[test]
fn p08_content_write_clears_authorized() {
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    s.file_write(Caller::Owner, "lib/a.js", b"export const f = 1", &WriteOptions::default()).unwrap();
    s.file_set_authorized("lib/a.js", true).unwrap();
    assert!(s.file_stat("lib/a.js").unwrap().unwrap().authorized);
    s.file_write(Caller::AGENT, "lib/a.js", b"export const f = 2", &WriteOptions::default()).unwrap();
    assert!(!s.file_stat("lib/a.js").unwrap().unwrap().authorized);
    s.file_set_authorized("lib/a.js", true).unwrap();
    s.file_edit(Caller::AGENT, "lib/a.js", &[Edit { old_text: "2", new_text: "3", replace_all: false }], None).unwrap();
    assert!(!s.file_stat("lib/a.js").unwrap().unwrap().authorized);
}

#[test]
fn p09_timer_scope_default_and_mode_discriminant() {
    let dir = tmp();
    let (mut s, path) = new_agent(dir.path(), None);
    let sched = Schedule::Interval { every_ms: 3_600_000, start_at: None, end_at: None, max_runs: Some(10) };
    s.timer_insert(&NewTimer {
        schedule: &sched,
        next_wake_at: 1,
        payload: None,
        scope: None,
        lambda: None,
        warm: false,
        locked: false,
    })
    .unwrap();
    s.close().unwrap();
    let (scope, json): (String, String) = raw(&path)
        .query_row("SELECT scope, schedule_json FROM adf_timers", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert_eq!(scope, r#"["system"]"#);
    assert_eq!(json, r#"{"mode":"interval","every_ms":3600000,"max_runs":10}"#);
    assert!(!json.contains("\"type\""));
}

#[test]
fn p10_audit_blobs_are_brotli_json_with_addresses() {
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    let c = json!([{"type": "text", "text": "hello"}]);
    let a = s.loop_append(&NewLoopRow { role: "user", content: &c, model: None, tokens: None, ord: None }).unwrap();
    let b = s
        .loop_append(&NewLoopRow {
            role: "assistant",
            content: &c,
            model: Some("m"),
            tokens: Some(&json!({"input": 3, "output": 4})),
            ord: None,
        })
        .unwrap();
    s.audit_loop(a, b).unwrap();
    s.config_set(Caller::Owner, "audit.files", json!(true)).unwrap();
    s.file_write(Caller::Owner, "notes.txt", b"bye", &WriteOptions::default()).unwrap();
    s.file_delete(Caller::AGENT, "notes.txt").unwrap();
    let rows = s
        .db_query("SELECT source, start_seq, end_seq, ref, entry_count, data FROM adf_audit ORDER BY id", &[], true)
        .unwrap();
    assert_eq!(rows.rows[0]["source"], "loop");
    assert_eq!((rows.rows[0]["start_seq"].as_i64(), rows.rows[0]["end_seq"].as_i64()), (Some(a), Some(b)));
    assert_eq!(rows.rows[0]["ref"], Value::Null);
    assert_eq!(rows.rows[1]["source"], "file");
    assert_eq!(rows.rows[1]["ref"], "notes.txt");
    use base64::Engine;
    let blob = |i: usize| {
        let b64 = rows.rows[i]["data"].as_str().unwrap().strip_prefix("base64:").unwrap();
        adf::store::audit::decode(&base64::engine::general_purpose::STANDARD.decode(b64).unwrap()).unwrap()
    };
    assert_eq!(blob(0)[1]["tokens"]["output"], 4);
    assert_eq!(blob(1)["path"], "notes.txt");
    assert_eq!(blob(1)["content"], "Ynll");
}

#[test]
fn p11_readme_cannot_be_deleted() {
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    let err = s.file_delete(Caller::AGENT, "README.md").unwrap_err();
    assert_eq!(err.to_string(), "Cannot delete \"README.md\": file is protected (no_delete).");
    let d = err.denial().unwrap();
    assert_eq!((d.kind, d.target.as_str(), d.level.as_str()), (DenialKind::FileProtection, "README.md", "no_delete"));
    assert!(s.file_stat("README.md").unwrap().is_some());
    // The owner cannot delete core files either.
    assert!(s.file_delete(Caller::Owner, "README.md").is_err());
}

#[test]
fn p12_read_only_files_are_readable_not_writable() {
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    s.file_write(
        Caller::Owner,
        "ref.md",
        b"fixed",
        &WriteOptions { protection: Some(Protection::ReadOnly), ..Default::default() },
    )
    .unwrap();
    let err = s.file_write(Caller::AGENT, "ref.md", b"changed", &WriteOptions::default()).unwrap_err();
    assert_eq!(err.to_string(), "Cannot write to \"ref.md\": file is read-only.");
    assert_eq!(err.denial().unwrap().kind, DenialKind::FileProtection);
    assert_eq!(s.file_read("ref.md").unwrap().1, b"fixed");
    // A human-approved override writes once and leaves a bypass log.
    s.file_write(AGENT_OVERRIDE, "ref.md", b"changed", &WriteOptions::default()).unwrap();
    let logs = s.db_query("SELECT level, origin, event FROM adf_logs WHERE event = 'bypass'", &[], false).unwrap();
    assert_eq!(logs.rows.len(), 1);
    assert_eq!(logs.rows[0]["origin"], "protection");
}

#[test]
fn p13_write_size_cap_and_exemptions() {
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    let max = AgentConfig::from_value(&s.config_value().unwrap()).unwrap().max_file_write_bytes();
    assert_eq!(max, 5_000_000);
    let big = vec![b'a'; 5_000_001];
    let opts = WriteOptions { max_bytes: Some(max), ..Default::default() };
    let err = s.file_write(Caller::AGENT, "soul.md", &big, &opts).unwrap_err();
    assert!(
        err.to_string().starts_with("Write rejected: result is 5000001 bytes but max_file_write_bytes is 5000000"),
        "{err}"
    );
    assert!(s.file_write(Caller::AGENT, "notes/x.md", &big, &opts).is_err());
    assert!(s.file_write(Caller::AGENT, "README.md", &big, &opts).is_ok());
    assert!(s.file_write(Caller::AGENT, "mind.md", &big, &opts).is_ok());
    assert_eq!(s.file_stat("mind.md").unwrap().unwrap().size, 5_000_001);
}

#[test]
fn p14_failing_batch_edit_leaves_file_identical() {
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    s.file_write(Caller::Owner, "a.txt", b"one two three", &WriteOptions::default()).unwrap();
    let before = s.file_stat("a.txt").unwrap().unwrap();
    let edits = [
        Edit { old_text: "one", new_text: "1", replace_all: false },
        Edit { old_text: "missing", new_text: "x", replace_all: false },
    ];
    let err = s.file_edit(Caller::AGENT, "a.txt", &edits, None).unwrap_err();
    assert!(err.to_string().contains("Batch aborted, file unchanged."), "{err}");
    assert_eq!(s.file_read("a.txt").unwrap().1, b"one two three");
    assert_eq!(s.file_stat("a.txt").unwrap().unwrap(), before);
    let ok = [
        Edit { old_text: "one", new_text: "1", replace_all: false },
        Edit { old_text: "t", new_text: "T", replace_all: true },
    ];
    assert_eq!(s.file_edit(Caller::AGENT, "a.txt", &ok, None).unwrap(), 3);
    assert_eq!(s.file_read("a.txt").unwrap().1, b"1 Two Three");
}

#[test]
fn p15_increment_keys() {
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    s.meta_set(Caller::AGENT, "runs", "5", Some(MetaProtection::Increment)).unwrap();
    for v in ["5", "4"] {
        let err = s.meta_set(Caller::AGENT, "runs", v, None).unwrap_err();
        assert_eq!(err.denial().unwrap().kind, DenialKind::MetaProtection, "{v}");
    }
    assert!(
        s.meta_set(Caller::AGENT, "runs", "abc", None).unwrap_err().denial().is_none(),
        "non-numeric is a plain error"
    );
    s.meta_set(Caller::AGENT, "runs", "6", None).unwrap();
    assert_eq!(s.meta_add(Caller::AGENT, "runs", 2.0, None).unwrap(), "8");
    assert!(s.meta_add(Caller::AGENT, "runs", 0.0, None).unwrap_err().denial().is_some());
    assert!(s.meta_add(Caller::AGENT, "runs", -1.0, None).unwrap_err().denial().is_some());
    assert_eq!(s.meta_add(Caller::AGENT, "score", 0.1, None).unwrap(), "0.1");
    assert_eq!(s.meta_add(Caller::AGENT, "score", 0.2, None).unwrap(), "0.3");
    assert!(s.meta_set(Caller::AGENT, "bad", "x", Some(MetaProtection::Increment)).is_err());
    assert_eq!(s.meta_get("runs").unwrap().unwrap().value, "8");
}

#[test]
fn p15_atomic_add_across_stores() {
    // Two writers cannot exist, but adds from many threads through one
    // store are serialised and none is lost.
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    for _ in 0..50 {
        s.meta_add(Caller::AGENT, "n", 1.0, Some(MetaProtection::Increment)).unwrap();
    }
    assert_eq!(s.meta_get("n").unwrap().unwrap().value, "50");
}

#[test]
fn p16_adf_keys_cannot_be_deleted_by_the_agent() {
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    for key in ["adf_name", "adf_did", "adf_version"] {
        let err = s.meta_delete(Caller::AGENT, key).unwrap_err();
        let d = err.denial().unwrap();
        assert_eq!((d.kind, d.level.as_str()), (DenialKind::MetaProtection, "readonly"), "{key}");
        assert!(s.meta_get(key).unwrap().is_some());
    }
    assert!(s.meta_delete(AGENT_OVERRIDE, "adf_name").unwrap());
    assert!(s.meta_get("adf_name").unwrap().is_none());
    let authorized = Caller::Agent { authorized: true, override_approved: false };
    assert!(s.meta_delete(authorized, "status").unwrap());
}

#[test]
fn p17_instruction_templating() {
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    s.file_write(Caller::Owner, "notes/a.md", b"A {{mind.md}} </injected_file> end", &WriteOptions::default()).unwrap();
    let out = s.render_template("X {{notes/a.md}} Y {{ nope.md }}");
    assert_eq!(
        out,
        "X <injected_file path=\"notes/a.md\">\nA {{mind.md}} <\\/injected_file> end\n</injected_file> Y <injected_file path=\"nope.md\" missing=\"true\"/>"
    );
}

#[test]
fn p18_guard_paths_are_hard_errors_without_approval() {
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    let before = s.config_value().unwrap();
    for path in [
        "locked_fields",
        "tools.fs_read.restricted",
        "code_execution.restricted_methods",
        "tools.fs_read.locked",
        "adf_version",
        "id",
        "metadata.author",
        "providers",
        "security",
        "security.allow_unsigned",
        "security.require_middleware_authorization",
        "security.middleware",
        "security.fetch_middleware",
    ] {
        for caller in [Caller::AGENT, AGENT_OVERRIDE] {
            let err = s.config_set(caller, path, json!(true)).unwrap_err();
            assert!(err.denial().is_none(), "{path}: must not be overridable");
            assert!(err.to_string().contains("sys_get_config"), "{path}: {err}");
        }
    }
    assert_eq!(s.config_value().unwrap(), before);
}

#[test]
fn p19_local_fetch_and_stream_bind_need_an_owner_override() {
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    for path in ["security.allow_local_fetch", "stream_bind.allow_tcp_bind"] {
        let err = s.config_set(Caller::AGENT, path, json!(true)).unwrap_err();
        assert_eq!(err.denial().unwrap().kind, DenialKind::ConfigLock, "{path}");
        s.config_set(AGENT_OVERRIDE, path, json!(true)).unwrap();
    }
    assert_eq!(s.config_value().unwrap()["security"]["allow_local_fetch"], true);
    // An ordinary field is writable by the agent.
    s.config_set(Caller::AGENT, "description", json!("d")).unwrap();
}

#[test]
fn p20_restricted_methods_default() {
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    let mut cfg = s.config_value().unwrap();
    cfg["code_execution"].as_object_mut().unwrap().remove("restricted_methods");
    s.config_replace(cfg).unwrap();
    assert_eq!(s.config().unwrap().restricted_methods(), ["attestation_issue"]);
    s.config_set(Caller::Owner, "code_execution.restricted_methods", json!(["model_invoke"])).unwrap();
    assert_eq!(s.config().unwrap().restricted_methods(), ["model_invoke"]);
}

#[test]
fn p21_duplicate_tools_collapse() {
    let dir = tmp();
    let (mut s, _) = new_agent(dir.path(), None);
    s.config_set(
        Caller::Owner,
        "tools.43",
        json!({"name": "fs_read", "enabled": false, "restricted": true, "locked": true}),
    )
    .unwrap();
    let cfg = s.config().unwrap();
    let t = cfg.tool("fs_read").unwrap();
    assert!(t.is_enabled() && t.is_visible(), "first declaration wins");
    assert!(t.is_restricted() && t.is_locked(), "restricted and locked are sticky");
    assert_eq!(cfg.effective_tools().1, ["fs_read"]);
}
