//! The reference implementation's own files open in adf: `adf inspect --json`
//! reports what their `.dump.json` says, and after adf has opened and closed
//! a copy it still has every table and column of the reference schema.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use adf::store::Store;
use common::*;
use serde_json::Value;

fn dump(name: &str) -> Value {
    let text = std::fs::read_to_string(fixtures().join(format!("{name}.dump.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn check_inspect_matches_dump(name: &str) {
    let dir = tmp();
    let file = fixture_copy(dir.path(), &format!("{name}.adf"));
    let report = json(&adf(dir.path(), &["inspect", file.to_str().unwrap(), "--json"], None));
    let d = dump(name);

    assert_eq!(report["schema_version"], 28);
    assert_eq!(report["format_version"], "0.2");
    assert_eq!(report["migrated_from"], Value::Null);
    // The reference closed it cleanly and left no sidecars: no check needed.
    assert_eq!(report["integrity_check"], "skipped");

    // Meta: every row of the dump, the clean-close marker included (adf
    // removes it only when it first writes).
    let ours: BTreeMap<String, (Value, Value)> = report["meta"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["key"].as_str().unwrap().to_string(), (m["value"].clone(), m["protection"].clone())))
        .collect();
    let theirs: BTreeMap<String, (Value, Value)> = d["adf_meta"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["key"].as_str().unwrap().to_string(), (m["value"].clone(), m["protection"].clone())))
        .collect();
    assert_eq!(ours, theirs);
    assert_eq!(report["did"], ours["adf_did"].0);

    // Config: identical document.
    assert_eq!(report["config"], d["adf_config"]["config"]);

    // Files: path, MIME, size, protection, authorized flag, timestamps.
    let files = report["files"].as_array().unwrap();
    let expected = d["adf_files"].as_array().unwrap();
    assert_eq!(files.len(), expected.len());
    for (f, e) in files.iter().zip(expected) {
        for k in ["path", "mime_type", "size", "protection", "created_at", "updated_at"] {
            assert_eq!(f[k], e[k], "{name}: {k} of {}", e["path"]);
        }
        assert_eq!(f["authorized"].as_bool().unwrap(), e["authorized"].as_i64().unwrap() != 0);
    }
    // First bytes of each file, read back exactly.
    for e in expected {
        let path = e["path"].as_str().unwrap();
        let out = adf(dir.path(), &["files", "cat", file.to_str().unwrap(), path], None);
        assert!(out.status.success());
        let head: String =
            out.stdout.iter().take(e["head_hex"].as_str().unwrap().len() / 2).map(|b| format!("{b:02x}")).collect();
        assert_eq!(head, e["head_hex"], "{path}");
    }

    // Row counts of every adf_ table.
    let counts: BTreeMap<String, i64> = report["tables"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"] == "adf")
        .map(|t| (t["name"].as_str().unwrap().to_string(), t["rows"].as_i64().unwrap()))
        .collect();
    for (table, n) in d["table_counts"].as_object().unwrap() {
        assert_eq!(counts.get(table), n.as_i64().as_ref(), "{name}: rows of {table}");
    }

    // Identity rows: purposes, algorithms and lengths (values never printed).
    let ids: Vec<(Value, Value, Value)> = report["identity"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["purpose"].clone(), i["encryption_algo"].clone(), i["value_len"].clone()))
        .collect();
    let want: Vec<(Value, Value, Value)> = d["adf_identity"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["purpose"].clone(), i["encryption_algo"].clone(), i["value_len"].clone()))
        .collect();
    assert_eq!(ids, want);
    assert!(
        !String::from_utf8_lossy(&adf(dir.path(), &["inspect", file.to_str().unwrap(), "--json"], None).stdout)
            .contains("plain_value")
    );

    // After open and close, the reference schema is intact.
    assert_schema_contains(&file, &fixtures().join(format!("{name}.schema.sql")));
    // Inspecting wrote nothing: the copy is byte-for-byte the original.
    assert!(std::fs::read(&file).unwrap() == std::fs::read(fixtures().join(format!("{name}.adf"))).unwrap());
    // Writing through adf keeps the reference schema and closes cleanly.
    ok(&adf(dir.path(), &["meta", "set", file.to_str().unwrap(), "touched", "yes"], None));
    assert_schema_contains(&file, &fixtures().join(format!("{name}.schema.sql")));
    // And it is closed cleanly again, with no sidecars left behind.
    let conn = rusqlite::Connection::open(&file).unwrap();
    let marker: i64 = conn
        .query_row("SELECT count(*) FROM adf_meta WHERE key = 'adf_clean_close' AND protection = 'readonly'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(marker, 1);
    drop(conn);
    assert!(!dir.path().join(format!("{name}.adf-wal")).exists());
}

/// Every table, column (name, type, not-null, default) and index of the
/// reference's `.schema.sql` exists in `file`.
fn assert_schema_contains(file: &Path, schema_sql: &Path) {
    let reference = rusqlite::Connection::open_in_memory().unwrap();
    let sql = std::fs::read_to_string(schema_sql).unwrap();
    let sql = sql.replace("CREATE TABLE sqlite_sequence(name,seq);", "");
    reference.execute_batch(&sql).unwrap();
    let ours = rusqlite::Connection::open(file).unwrap();
    let objects = |c: &rusqlite::Connection| -> Vec<(String, String)> {
        let mut s =
            c.prepare("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name").unwrap();
        s.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
    };
    let have = objects(&ours);
    for (ty, name) in objects(&reference) {
        assert!(have.contains(&(ty.clone(), name.clone())), "missing {ty} {name}");
        if ty == "table" {
            let cols = |c: &rusqlite::Connection| -> Vec<(String, String, i64, Option<String>)> {
                let mut s = c.prepare("SELECT name, type, \"notnull\", dflt_value FROM pragma_table_info(?1)").unwrap();
                s.query_map([&name], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            };
            let mine = cols(&ours);
            for col in cols(&reference) {
                assert!(mine.contains(&col), "{name}: missing column {col:?}");
            }
        }
    }
}

#[test]
fn fresh_desktop_file_inspects_as_dumped() {
    check_inspect_matches_dump("fresh");
}

#[test]
fn fresh_headless_file_inspects_as_dumped() {
    check_inspect_matches_dump("fresh-headless");
}

#[test]
fn headless_identity_rows_are_the_plain_der_keys_of_its_did() {
    let dir = tmp();
    let file = fixture_copy(dir.path(), "fresh-headless.adf");
    let conn = rusqlite::Connection::open(&file).unwrap();
    let spki: Vec<u8> = conn
        .query_row("SELECT value FROM adf_identity WHERE purpose = 'crypto:signing:public_key'", [], |r| r.get(0))
        .unwrap();
    let did: String = conn.query_row("SELECT value FROM adf_meta WHERE key = 'adf_did'", [], |r| r.get(0)).unwrap();
    let key = adf::store::identity::public_from_spki(&spki).unwrap();
    assert_eq!(adf::store::identity::did_key(&key), did);
}

#[test]
fn files_written_by_adf_have_the_reference_schema() {
    let dir = tmp();
    let file = dir.path().join("mine.adf");
    let (store, _) = Store::create(&file, &Default::default()).unwrap();
    store.close().unwrap();
    assert_schema_contains(&file, &fixtures().join("fresh-headless.schema.sql"));
}

#[test]
fn adf_fresh_file_matches_the_reference_shape() {
    // Same config keys in the same order, same meta keys and protections
    // (handle slug-derived), same files and protections as fresh-headless.
    let dir = tmp();
    let file = dir.path().join("fresh-headless.adf");
    let out =
        adf(dir.path(), &["new", file.to_str().unwrap(), "--description", "Headless benchmark agent", "--json"], None);
    ok(&out);
    let ours = json(&adf(dir.path(), &["inspect", file.to_str().unwrap(), "--json"], None));
    let d = dump("fresh-headless");
    let keys = |v: &Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&ours["config"]), keys(&d["adf_config"]["config"]));
    for section in ["model", "context", "security", "limits", "messaging", "code_execution", "logging", "serving"] {
        assert_eq!(keys(&ours["config"][section]), keys(&d["adf_config"]["config"][section]), "{section}");
    }
    assert_eq!(ours["config"]["tools"], d["adf_config"]["config"]["tools"]);
    assert_eq!(ours["config"]["triggers"], d["adf_config"]["config"]["triggers"]);
    let meta = |v: &Value, key: &str| -> Vec<(String, String)> {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["key"] != "adf_clean_close")
            .map(|m| (m["key"].as_str().unwrap().into(), m["protection"].as_str().unwrap().into()))
            .collect()
    };
    // `adf new` seals the key to the owner and this install, as the Studio
    // does: its meta keys are those of `fresh` (owner and runtime DIDs).
    assert_eq!(meta(&ours, "meta"), meta(&dump("fresh"), "adf_meta"));
    let files = |v: &Value, key: &str| -> Vec<(Value, Value, Value)> {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f["path"].clone(), f["mime_type"].clone(), f["protection"].clone()))
            .collect()
    };
    assert_eq!(files(&ours, "files"), files(&d, "adf_files"));
    let readme = adf(dir.path(), &["files", "cat", file.to_str().unwrap(), "README.md"], None);
    let text = String::from_utf8(readme.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "# fresh-headless");
    assert_eq!(lines[1], "");
    assert!(lines[2].starts_with("Created: 20"));
    assert_eq!(lines[3], "Status: New agent, self-configuring.");
    assert!(text.ends_with('\n'));
}

#[test]
fn originals_open_read_only_in_place_without_a_write() {
    // The shared fixtures folder has no write bits: read-only access falls
    // back to an immutable open, and nothing next to the file is created.
    let original = fixtures().join("fresh.adf");
    let before = std::fs::read(&original).unwrap();
    let s = Store::open_read_only(&original).unwrap();
    assert!(s.is_read_only());
    assert_eq!(s.meta_get("adf_name").unwrap().unwrap().value, "fresh");
    assert_eq!(s.file_list("").unwrap().len(), 4);
    s.close().unwrap();
    assert!(std::fs::read(&original).unwrap() == before);
}

#[test]
fn own_tables_are_added_only_when_needed() {
    let dir = tmp();
    let file = fixture_copy(dir.path(), "fresh-headless.adf");
    let mut s = Store::open(&file).unwrap();
    assert!(s.tables().unwrap().iter().all(|t| t.kind != "adfrs"));
    s.ensure_own_schema().unwrap();
    let own: Vec<_> = s.tables().unwrap().into_iter().filter(|t| t.kind == "adfrs").collect();
    assert_eq!(own.len(), 1);
    assert_eq!(own[0].name, "adfrs_schema");
    assert_eq!(s.meta_get("adf_schema_version").unwrap().unwrap().value, "28");
    s.close().unwrap();
    assert_schema_contains(&file, &fixtures().join("fresh-headless.schema.sql"));
}
