//! The offline CLI, driven as a user would: the real binary on real files.
//! Every bad input must fail with one line naming the file and the cause, a
//! non-zero status, and the file byte-for-byte unchanged.

mod common;

use adf::store::Store;
use common::*;
use serde_json::json;

fn agent(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("a.adf");
    ok(&adf(dir, &["new", "a.adf", "--name", "Agent A"], None));
    path
}

/// Run a failing command and prove it changed nothing.
fn fails_unchanged(dir: &std::path::Path, file: &std::path::Path, args: &[&str], needles: &[&str]) {
    let before = snapshot(file);
    let out = adf(dir, args, None);
    fails(&out, needles);
    assert!(snapshot(file) == before, "{args:?} changed {}", file.display());
    assert!(!adf::store::lock::lock_path(file).exists(), "lock file left behind");
}

#[test]
fn new_then_inspect() {
    let dir = tmp();
    let out = adf(
        dir.path(),
        &["new", "scout.adf", "--handle", "scout-1", "--provider", "anthropic", "--model", "claude-x", "--json"],
        None,
    );
    let created = json(&out);
    assert_eq!(created["handle"], "scout-1");
    assert!(created["did"].as_str().unwrap().starts_with("did:key:z6Mk"));
    let r = json(&adf(dir.path(), &["inspect", "scout.adf", "--json"], None));
    assert_eq!(r["did"], created["did"]);
    assert_eq!(r["summary"]["provider"], "anthropic");
    assert_eq!(r["summary"]["model"], "claude-x");
    assert_eq!(r["config"]["handle"], "scout-1");
    let text = ok(&adf(dir.path(), &["inspect", "scout.adf"], None));
    assert!(text.contains("scout-1") && text.contains("anthropic/claude-x") && text.contains("README.md"), "{text}");
    // Refuses to overwrite.
    fails_unchanged(dir.path(), &dir.path().join("scout.adf"), &["new", "scout.adf"], &["scout.adf", "already exists"]);
    fails(&adf(dir.path(), &["new", "x.adf", "--handle", "Bad Handle"], None), &["x.adf", "handle"]);
    assert!(!dir.path().join("x.adf").exists());
    fails(&adf(dir.path(), &["new", "nowhere/x.adf"], None), &["nowhere/x.adf", "does not exist"]);
}

#[test]
fn files_round_trip_exact_bytes() {
    let dir = tmp();
    let a = agent(dir.path());
    // Binary content larger than one chunk, from a local file and from stdin.
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(dir.path().join("blob.bin"), &data).unwrap();
    ok(&adf(dir.path(), &["files", "put", "a.adf", "data/blob.bin", "blob.bin"], None));
    let out = adf(dir.path(), &["files", "cat", "a.adf", "data/blob.bin"], None);
    assert!(out.status.success());
    assert!(out.stdout == data, "bytes differ");
    ok(&adf(dir.path(), &["files", "put", "a.adf", "notes/x.md"], Some(b"hello\n")));
    assert_eq!(adf(dir.path(), &["files", "cat", "a.adf", "notes/x.md"], None).stdout, b"hello\n");
    let list = json(&adf(dir.path(), &["files", "ls", "a.adf", "notes/", "--json"], None));
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["mime_type"], "text/markdown");
    assert_eq!(list[0]["protection"], "none");
    let all = json(&adf(dir.path(), &["files", "ls", "a.adf", "--json"], None));
    let bin = all.as_array().unwrap().iter().find(|f| f["path"] == "data/blob.bin").unwrap();
    assert_eq!(bin["size"], 3_000_000);
    assert_eq!(bin["mime_type"], "application/octet-stream");
    ok(&adf(dir.path(), &["files", "mv", "a.adf", "notes/x.md", "notes/y.md"], None));
    ok(&adf(dir.path(), &["files", "rm", "a.adf", "notes/y.md"], None));
    fails_unchanged(
        dir.path(),
        &a,
        &["files", "cat", "a.adf", "notes/y.md"],
        &["a.adf", "File not found: \"notes/y.md\""],
    );
    let text = ok(&adf(dir.path(), &["files", "ls", "a.adf"], None));
    assert!(text.lines().next().unwrap().starts_with("PROTECTION"));
}

#[test]
fn protection_is_enforced_from_the_cli() {
    let dir = tmp();
    let a = agent(dir.path());
    fails_unchanged(
        dir.path(),
        &a,
        &["files", "rm", "a.adf", "README.md"],
        &["a.adf", "Cannot delete \"README.md\": file is protected (no_delete)."],
    );
    ok(&adf(dir.path(), &["files", "put", "a.adf", "ref.md", "--protection", "read_only"], Some(b"keep")));
    let before = snapshot(&a);
    fails(&adf(dir.path(), &["files", "put", "a.adf", "ref.md"], Some(b"changed")), &["a.adf", "read-only"]);
    assert!(snapshot(&a) == before);
    fails_unchanged(dir.path(), &a, &["files", "rm", "a.adf", "ref.md"], &["protected (read_only)"]);
    fails_unchanged(dir.path(), &a, &["files", "protect", "a.adf", "soul.md", "none"], &["core file"]);
    fails_unchanged(dir.path(), &a, &["files", "protect", "a.adf", "ref.md", "locked"], &["unknown file protection"]);
    fails_unchanged(dir.path(), &a, &["files", "put", "a.adf", "../escape.md", "/dev/null"], &["invalid file path"]);
    ok(&adf(dir.path(), &["files", "protect", "a.adf", "ref.md", "none"], None));
    // The owner marks code as authorized; a write clears the mark.
    assert_eq!(ok(&adf(dir.path(), &["files", "authorize", "a.adf", "ref.md"], None)).trim(), "ref.md: authorized");
    assert!(
        ok(&adf(dir.path(), &["files", "ls", "a.adf"], None))
            .lines()
            .any(|l| l.contains("ref.md") && l.contains("authorized"))
    );
    ok(&adf(dir.path(), &["files", "put", "a.adf", "ref.md"], Some(b"edited")));
    assert!(
        !ok(&adf(dir.path(), &["files", "ls", "a.adf"], None))
            .lines()
            .any(|l| l.contains("ref.md") && l.contains("authorized"))
    );
    ok(&adf(dir.path(), &["files", "authorize", "a.adf", "ref.md"], None));
    assert_eq!(
        ok(&adf(dir.path(), &["files", "authorize", "a.adf", "ref.md", "--off"], None)).trim(),
        "ref.md: not authorized"
    );
    fails_unchanged(dir.path(), &a, &["files", "authorize", "a.adf", "nope.js"], &["nope.js"]);
    ok(&adf(dir.path(), &["files", "rm", "a.adf", "ref.md"], None));
}

#[test]
fn bad_files_are_refused_and_untouched() {
    let dir = tmp();
    let d = dir.path();
    std::fs::write(d.join("text.adf"), "just some text, not a database\n".repeat(10)).unwrap();
    fails_unchanged(d, &d.join("text.adf"), &["inspect", "text.adf"], &["text.adf", "not a SQLite database"]);
    std::fs::write(d.join("tiny.adf"), b"SQLite format 3\0").unwrap();
    fails_unchanged(d, &d.join("tiny.adf"), &["inspect", "tiny.adf"], &["tiny.adf", "not a SQLite database"]);
    // A truncated agent file.
    let whole = fixture_copy(d, "fresh.adf");
    let bytes = std::fs::read(&whole).unwrap();
    std::fs::write(d.join("cut.adf"), &bytes[..bytes.len() / 2]).unwrap();
    fails_unchanged(d, &d.join("cut.adf"), &["inspect", "cut.adf"], &["cut.adf", "truncated"]);
    fails_unchanged(d, &d.join("cut.adf"), &["files", "rm", "cut.adf", "x"], &["cut.adf", "truncated"]);
    // A SQLite file that is not an agent.
    let other = d.join("other.db");
    let c = rusqlite::Connection::open(&other).unwrap();
    c.execute_batch("CREATE TABLE notes(x); INSERT INTO notes VALUES (1);").unwrap();
    drop(c);
    fails_unchanged(d, &other, &["inspect", "other.db"], &["other.db", "not an ADF agent file"]);
    fails_unchanged(d, &other, &["meta", "set", "other.db", "k", "v"], &["other.db", "not an ADF agent file"]);
    // A missing file.
    fails(&adf(d, &["inspect", "missing.adf"], None), &["missing.adf", "no such file"]);
    assert!(!d.join("missing.adf").exists());
    // A folder.
    fails(&adf(d, &["inspect", "."], None), &["directory"]);
}

#[test]
fn newer_schema_warns_but_works() {
    let dir = tmp();
    let a = agent(dir.path());
    rusqlite::Connection::open(&a)
        .unwrap()
        .execute("UPDATE adf_meta SET value='31' WHERE key='adf_schema_version'", [])
        .unwrap();
    let out = adf(dir.path(), &["inspect", "a.adf", "--json"], None);
    let r = json(&out);
    assert_eq!(r["schema_version"], 31);
    assert!(r["warnings"][0].as_str().unwrap().contains("newer"));
    let text = ok(&adf(dir.path(), &["inspect", "a.adf"], None));
    assert!(text.contains("warning"), "{text}");
}

#[test]
fn a_held_file_names_its_holder() {
    let dir = tmp();
    let a = agent(dir.path());
    // This test process becomes the writer; the binary is a second process.
    let holder = Store::open(&a).unwrap();
    let out = adf(dir.path(), &["files", "rm", "a.adf", "soul.md"], None);
    let err = fails(&out, &["a.adf", "held by another adf process", &format!("pid {}", std::process::id())]);
    assert!(err.contains(&gethostname()), "{err}");
    // Reads still work, read-only.
    let r = json(&adf(dir.path(), &["inspect", "a.adf", "--json"], None));
    assert_eq!(r["read_only"], true);
    ok(&adf(dir.path(), &["files", "cat", "a.adf", "README.md"], None));
    drop(holder);
    ok(&adf(dir.path(), &["meta", "set", "a.adf", "k", "v"], None));
}

fn gethostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

#[test]
fn stale_lock_is_taken_over() {
    let dir = tmp();
    let a = agent(dir.path());
    std::fs::write(
        adf::store::lock::lock_path(&a),
        r#"{"pid":4000000,"host":"gone","since":"2020-01-01T00:00:00.000Z"}"#,
    )
    .unwrap();
    ok(&adf(dir.path(), &["meta", "set", "a.adf", "k", "v"], None));
}

#[test]
fn meta_commands() {
    let dir = tmp();
    let a = agent(dir.path());
    ok(&adf(dir.path(), &["meta", "set", "a.adf", "topic", "rust"], None));
    assert_eq!(ok(&adf(dir.path(), &["meta", "get", "a.adf", "topic"], None)), "rust\n");
    ok(&adf(dir.path(), &["meta", "set", "a.adf", "runs", "1", "--protection", "increment"], None));
    fails_unchanged(dir.path(), &a, &["meta", "set", "a.adf", "runs", "1"], &["increment key must grow"]);
    assert_eq!(json(&adf(dir.path(), &["meta", "add", "a.adf", "runs", "2", "--json"], None))["value"], "3");
    fails_unchanged(dir.path(), &a, &["meta", "set", "a.adf", "adf_name", "x"], &["adf_* keys"]);
    fails_unchanged(dir.path(), &a, &["meta", "rm", "a.adf", "adf_did"], &["Cannot delete \"adf_did\""]);
    fails_unchanged(
        dir.path(),
        &a,
        &["meta", "set", "a.adf", "k", "v", "--protection", "secret"],
        &["unknown meta protection"],
    );
    fails_unchanged(dir.path(), &a, &["meta", "get", "a.adf", "nope"], &["\"nope\" not found"]);
    ok(&adf(dir.path(), &["meta", "rm", "a.adf", "topic"], None));
    let list = json(&adf(dir.path(), &["meta", "ls", "a.adf", "--json"], None));
    let keys: Vec<&str> = list.as_array().unwrap().iter().map(|m| m["key"].as_str().unwrap()).collect();
    assert!(keys.contains(&"runs") && !keys.contains(&"topic") && keys.contains(&"adf_did"));
}

#[test]
fn config_commands() {
    let dir = tmp();
    let a = agent(dir.path());
    assert_eq!(ok(&adf(dir.path(), &["config", "get", "a.adf", "name"], None)), "Agent A\n");
    assert_eq!(
        json(&adf(dir.path(), &["config", "get", "a.adf", "tools.fs_read.enabled", "--json"], None)),
        json!(true)
    );
    ok(&adf(dir.path(), &["config", "set", "a.adf", "model.provider", "anthropic"], None));
    ok(&adf(dir.path(), &["config", "set", "a.adf", "tools.fs_delete.enabled", "true"], None));
    ok(&adf(dir.path(), &["config", "set", "a.adf", "limits.max_active_turns", "20"], None));
    let cfg = json(&adf(dir.path(), &["config", "get", "a.adf", "--json"], None));
    assert_eq!(cfg["model"]["provider"], "anthropic");
    assert_eq!(cfg["tools"][3]["enabled"], true);
    assert_eq!(cfg["limits"]["max_active_turns"], 20);
    fails_unchanged(
        dir.path(),
        &a,
        &["config", "set", "a.adf", "model.temperature", "5"],
        &["a.adf", "model.temperature", "between 0 and 2"],
    );
    fails_unchanged(dir.path(), &a, &["config", "set", "a.adf", "state", "\"sleepy\""], &["state", "must be one of"]);
    fails_unchanged(
        dir.path(),
        &a,
        &["config", "set", "a.adf", "modle.provider", "x"],
        &["unknown config section \"modle\""],
    );
    fails_unchanged(
        dir.path(),
        &a,
        &["config", "set", "a.adf", "tools.nope.enabled", "true"],
        &["no element named \"nope\""],
    );
    fails_unchanged(dir.path(), &a, &["config", "set", "a.adf", "limits", "{broken"], &["not valid JSON"]);
    fails_unchanged(dir.path(), &a, &["config", "get", "a.adf", "model.nothing"], &["config has no \"model.nothing\""]);
    // A new agent's config is valid (empty instructions, as the reference's).
    let issues = json(&adf(dir.path(), &["config", "check", "a.adf", "--json"], None));
    assert_eq!(issues, serde_json::json!([]));
    ok(&adf(dir.path(), &["config", "set", "a.adf", "description", "still editable"], None));
}

#[test]
fn sql_guard_from_the_cli() {
    let dir = tmp();
    let a = agent(dir.path());
    fails_unchanged(
        dir.path(),
        &a,
        &["sql", "a.adf", "SELECT * FROM adf_meta"],
        &["a.adf", "adf_meta, adf_config, and adf_identity"],
    );
    fails_unchanged(dir.path(), &a, &["sql", "a.adf", "DELETE FROM adf_files"], &["Cannot modify adf_* system tables"]);
    fails_unchanged(dir.path(), &a, &["sql", "a.adf", "UPDATE adf_files SET protection = 'none'"], &["adf_*"]);
    fails_unchanged(dir.path(), &a, &["sql", "a.adf", "SELECT 1; SELECT 2"], &["Multi-statement SQL is not allowed."]);
    fails_unchanged(
        dir.path(),
        &a,
        &["sql", "a.adf", "CREATE TABLE local_a(x); DROP TABLE local_b"],
        &["Multi-statement"],
    );
    fails_unchanged(dir.path(), &a, &["sql", "a.adf", "CREATE TABLE notes(x)"], &["local_ prefix"]);
    fails_unchanged(dir.path(), &a, &["sql", "a.adf", "SELECT nope FROM adf_files"], &["SQL error"]);
    ok(&adf(dir.path(), &["sql", "a.adf", "CREATE TABLE local_notes(id INTEGER PRIMARY KEY, body TEXT)"], None));
    let n = json(&adf(
        dir.path(),
        &["sql", "a.adf", "INSERT INTO local_notes(body) VALUES (?), (?)", "-p", "\"a\"", "-p", "b", "--json"],
        None,
    ));
    assert_eq!(n["changes"], 2);
    let rows = json(&adf(dir.path(), &["sql", "a.adf", "SELECT body FROM local_notes ORDER BY id", "--json"], None));
    assert_eq!(rows, json!([{"body": "a"}, {"body": "b"}]));
    let text = ok(&adf(dir.path(), &["sql", "a.adf", "SELECT path, size FROM adf_files ORDER BY path"], None));
    assert!(text.starts_with("path") && text.contains("README.md") && text.contains("(4 rows)"), "{text}");
}

#[test]
fn usage_errors_exit_2() {
    let dir = tmp();
    let out = adf(dir.path(), &["files"], None);
    assert_eq!(out.status.code(), Some(2));
    let out = adf(dir.path(), &["bogus"], None);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn first_run_creates_an_example_fleet() {
    let dir = tmp();
    let text = ok(&adf(dir.path(), &[], None));
    assert!(text.contains("example.adf"), "{text}");
    assert!(dir.path().join(".adf-home/data/agents/example.adf").exists());
    let list = json(&adf(dir.path(), &["agents", "--json"], None));
    assert_eq!(list[0]["name"], "example");
    assert_eq!(list.as_array().unwrap().len(), 1);
}

#[test]
fn inspect_survives_a_damaged_config() {
    let dir = tmp();
    let a = agent(dir.path());
    rusqlite::Connection::open(&a).unwrap().execute("UPDATE adf_config SET config_json = '{not json'", []).unwrap();
    let r = json(&adf(dir.path(), &["inspect", "a.adf", "--json"], None));
    assert!(r["warnings"][0].as_str().unwrap().contains("adf_config row 1 (config_json) is not valid JSON"), "{r}");
    assert_eq!(r["files"].as_array().unwrap().len(), 4);
    fails_unchanged(
        dir.path(),
        &a,
        &["config", "set", "a.adf", "name", "x"],
        &["a.adf", "(config_json) is not valid JSON"],
    );
}

#[test]
fn odd_file_names_work() {
    let dir = tmp();
    ok(&adf(dir.path(), &["new", "my agent #1?.adf"], None));
    let r = json(&adf(dir.path(), &["inspect", "my agent #1?.adf", "--json"], None));
    assert_eq!(r["handle"], "my-agent-1");
    ok(&adf(dir.path(), &["files", "put", "my agent #1?.adf", "ünïcødé/ファイル.md"], Some("héllo".as_bytes())));
    assert_eq!(
        adf(dir.path(), &["files", "cat", "my agent #1?.adf", "ünïcødé/ファイル.md"], None).stdout,
        "héllo".as_bytes()
    );
}

#[test]
fn bench_scenarios_drive_real_turns() {
    let dir = tmp();
    // Paced like the reference driver: one turn per agent per ~100 ms.
    let r = json(&adf(dir.path(), &["bench", "--scenario", "smoke", "--seconds", "1", "--json"], None));
    assert_eq!(r["errors"], 0, "{r}");
    let turns = r["turns"].as_u64().unwrap();
    assert!((3..=40).contains(&turns), "paced smoke runs a handful of turns: {r}");
    assert_eq!(r["provider_calls"], turns, "{r}");
    assert!(r["rss_peak_mb"].as_f64().unwrap() > 0.0, "{r}");
    // Mixed calls tools: more model calls than turns, and still no errors.
    let r = json(&adf(
        dir.path(),
        &["bench", "--scenario", "mixed", "--agents", "4", "--seconds", "1", "--flat-out", "--json"],
        None,
    ));
    assert_eq!(r["errors"], 0, "{r}");
    assert!(r["turns"].as_u64().unwrap() >= 1, "{r}");
}
