//! Faults found by a fault-injection run (issue 14), each reproduced on a
//! real file with the real binary: a healthy file is never refused, reading
//! changes nothing, repairing destroys nothing, hostile SQL is refused by
//! SQLite's own view of the statement and cannot exhaust memory, and the
//! small faults (pipes as input, damaged text, provider ids, the agent's
//! own key in `adf chat`).

mod common;

use std::path::{Path, PathBuf};

use adf::store::{NewAgent, Store};
use common::fake_provider::*;
use common::*;

fn raw(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).unwrap()
}

fn new_file(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let (s, _) = Store::create(&path, &NewAgent::default()).unwrap();
    s.close().unwrap();
    path
}

fn dir_listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".adf-home"))
        .collect();
    v.sort();
    v
}

/// A checkpoint cut short: the main file's header already claims the pages
/// the WAL still holds. SQLite reads it; so must adf.
#[test]
fn a_file_whose_pages_are_still_in_the_wal_opens() {
    let dir = tmp();
    let path = new_file(dir.path(), "a.adf");
    let c = raw(&path);
    c.execute_batch("PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0;").unwrap();
    c.execute_batch("CREATE TABLE local_big(x); WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) INSERT INTO local_big SELECT randomblob(300) FROM n;").unwrap();
    let pages: u32 = c.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
    // Keep the WAL: the connection is never closed (as after a crash).
    std::mem::forget(c);
    let mut bytes = std::fs::read(&path).unwrap();
    let on_disk = bytes.len() as u32 / 4096;
    assert!(pages > on_disk, "the WAL holds pages past the file ({pages} > {on_disk})");
    bytes[28..32].copy_from_slice(&pages.to_be_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let s = Store::open(&path).expect("a file SQLite reads is opened");
    let n = s.db_query("SELECT count(*) AS n FROM local_big", &[], false).unwrap();
    assert_eq!(n.rows[0]["n"], 2000);
    let ok: String = raw(&path).query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(ok, "ok");
}

/// Every read command leaves every byte of the file as it was and no
/// sidecar beside it, on a clean file, on one that lacks its clean-close
/// marker, and on one whose schema version is not a number.
#[test]
fn reading_changes_nothing() {
    let dir = tmp();
    let d = dir.path();
    let clean = new_file(d, "clean.adf");
    let unmarked = new_file(d, "unmarked.adf");
    raw(&unmarked).execute("DELETE FROM adf_meta WHERE key = 'adf_clean_close'", []).unwrap();
    let banana = new_file(d, "banana.adf");
    raw(&banana).execute("UPDATE adf_meta SET value = 'banana' WHERE key = 'adf_schema_version'", []).unwrap();
    let before = dir_listing(d);
    for f in [&clean, &unmarked, &banana] {
        let name = f.file_name().unwrap().to_str().unwrap();
        let bytes = std::fs::read(f).unwrap();
        for args in [
            vec!["inspect", name],
            vec!["inspect", name, "--json"],
            vec!["files", "ls", name],
            vec!["files", "cat", name, "README.md"],
            vec!["meta", "ls", name],
            vec!["meta", "get", name, "adf_name"],
            vec!["config", "get", name],
            vec!["config", "check", name],
            vec!["sql", name, "SELECT count(*) AS n FROM adf_loop"],
            vec!["usage", name],
            vec!["repair", "--check", name],
        ] {
            let out = adf(d, &args, None);
            assert!(out.status.success() || name == "banana.adf", "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
            assert!(std::fs::read(f).unwrap() == bytes, "{args:?} changed {name}");
            assert_eq!(dir_listing(d), before, "{args:?} left something beside {name}");
        }
    }
    // The fleet listing reads every agent of the fleet folder.
    let home = d.join(".adf-home");
    let fleet = home.join("data/agents");
    std::fs::create_dir_all(&fleet).unwrap();
    std::fs::copy(&clean, fleet.join("one.adf")).unwrap();
    std::fs::copy(&unmarked, fleet.join("two.adf")).unwrap();
    let bytes = (std::fs::read(fleet.join("one.adf")).unwrap(), std::fs::read(fleet.join("two.adf")).unwrap());
    let listed = ok(&adf_home(&home, d, &["agents"]));
    assert!(listed.contains("(2 agents)"), "{listed}");
    assert!(!listed.contains("not built yet"), "{listed}");
    assert_eq!((std::fs::read(fleet.join("one.adf")).unwrap(), std::fs::read(fleet.join("two.adf")).unwrap()), bytes);
    let mut left = dir_listing(&fleet);
    left.retain(|n| !n.starts_with('.'));
    assert_eq!(left, ["one.adf", "two.adf"]);
    // Opening for writing refuses a version that is not a number, and
    // changes nothing either.
    let bytes = std::fs::read(&banana).unwrap();
    let e = Store::open(&banana).unwrap_err().to_string();
    assert!(e.contains("\"banana\", not a schema version"), "{e}");
    assert!(std::fs::read(&banana).unwrap() == bytes);
}

/// Damage integrity_check reports and VACUUM INTO leaves behind: an index
/// whose schema row is gone.
fn damage(path: &Path) {
    let c = raw(path);
    c.execute_batch("CREATE TABLE IF NOT EXISTS local_big(x);").unwrap();
    for i in 0..300 {
        c.execute("INSERT INTO local_big VALUES (?1)", [format!("{i:0>200}")]).unwrap();
    }
    c.execute_batch("CREATE INDEX local_big_i ON local_big(x);").unwrap();
    c.execute_batch(
        "PRAGMA writable_schema = ON; DELETE FROM sqlite_master WHERE name = 'local_big_i'; PRAGMA writable_schema = OFF;",
    )
    .unwrap();
    c.execute("DELETE FROM adf_meta WHERE key = 'adf_clean_close'", []).unwrap();
}

/// Opening or inspecting a damaged file never repairs it behind the
/// owner's back; `adf repair` does, keeps the original under a name it
/// never reuses, and says what it recovered.
#[test]
fn repair_is_explicit_and_never_loses_the_original() {
    let dir = tmp();
    let d = dir.path();
    let path = new_file(d, "a.adf");
    damage(&path);
    let original = std::fs::read(&path).unwrap();
    let before = dir_listing(d);
    // Reads and opens leave it alone and say what to do, in one line.
    ok(&adf(d, &["inspect", "a.adf"], None));
    let e = Store::open(&path).unwrap_err().to_string();
    assert!(e.contains("integrity_check found") && e.contains("adf repair"), "{e}");
    assert_eq!(e.lines().count(), 1);
    let out = adf(d, &["config", "set", "a.adf", "description", "x"], None);
    fails(&out, &["a.adf", "adf repair"]);
    assert!(std::fs::read(&path).unwrap() == original);
    assert_eq!(dir_listing(d), before);
    let check = adf(d, &["repair", "--check", "a.adf"], None);
    assert_eq!(check.status.code(), Some(1));
    // The repair.
    let report = json(&adf(d, &["repair", "a.adf", "--json"], None));
    assert_eq!(report["damaged"], true);
    assert_eq!(report["complete"], true, "{report:#}");
    let kept = d.join(report["original"].as_str().unwrap());
    assert_eq!(kept, d.join("a.adf.corrupt"));
    assert!(std::fs::read(&kept).unwrap() == original, "the original bytes are kept");
    let big = report["tables"].as_array().unwrap().iter().find(|t| t["name"] == "local_big").cloned().unwrap();
    assert_eq!((big["rows_before"].as_i64(), big["rows_after"].as_i64()), (Some(300), Some(300)));
    let s = Store::open(&path).unwrap();
    assert_eq!(s.db_query("SELECT count(*) AS n FROM local_big", &[], false).unwrap().rows[0]["n"], 300);
    s.close().unwrap();
    // Damaged again and repaired again: the first original is not touched.
    damage(&path);
    let second = std::fs::read(&path).unwrap();
    let report = json(&adf(d, &["repair", "a.adf", "--json"], None));
    let kept2 = d.join(report["original"].as_str().unwrap());
    assert_ne!(kept2, kept);
    assert!(std::fs::read(&kept).unwrap() == original);
    assert!(std::fs::read(&kept2).unwrap() == second);
    // A sound file: nothing to do, nothing changed.
    let sound = std::fs::read(&path).unwrap();
    let text = ok(&adf(d, &["repair", "a.adf"], None));
    assert!(text.contains("nothing to repair"), "{text}");
    assert!(std::fs::read(&path).unwrap() == sound);
}

/// A killed `adf new` leaves its hidden work file; the next create in that
/// folder removes it, and a live one is never touched.
#[test]
fn an_abandoned_create_is_swept() {
    let dir = tmp();
    let d = dir.path();
    // A pid that is not running (pid_max is far below this).
    for s in ["", "-wal", "-shm"] {
        std::fs::write(d.join(format!(".x.adf.creating-999999999{s}")), b"half").unwrap();
    }
    let live = d.join(format!(".y.adf.creating-{}", std::process::id()));
    std::fs::write(&live, b"in progress").unwrap();
    ok(&adf(d, &["new", "b.adf"], None));
    let left = dir_listing(d);
    assert!(!left.iter().any(|n| n.contains("999999999")), "{left:?}");
    assert!(live.exists(), "a create in progress is left alone");
    assert!(left.contains(&"b.adf".to_string()));
}

/// Kill `adf new` at random moments: no visible half-made file, ever; the
/// next create sweeps what was left.
#[test]
fn killed_creates_leave_nothing_visible() {
    let dir = tmp();
    let d = dir.path();
    for i in 0..12u64 {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_adf"))
            .args(["new", &format!("k{i}.adf")])
            .current_dir(d)
            .env("ADF_HOME", d.join(".adf-home"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(i * 3));
        let _ = child.kill();
        let _ = child.wait();
        for n in dir_listing(d) {
            assert!(n.starts_with('.') || n.ends_with(".adf"), "visible leftover {n}");
            if n.ends_with(".adf") {
                // Whatever is visible is a whole agent file.
                Store::open_read_only(d.join(&n)).unwrap().close().unwrap();
            }
        }
    }
    ok(&adf(d, &["new", "last.adf"], None));
    assert!(!dir_listing(d).iter().any(|n| n.contains(".creating-")), "{:?}", dir_listing(d));
}

/// Conformance point 38 on SQLite's own view: quoted, cased and indirect
/// spellings of the protected tables are refused by `db_query`, by
/// `db_execute` and by `adf sql`; modules other than the allowed ones are
/// refused; a statement that would build a huge value fails small.
#[test]
fn conformance_38_the_sql_guard_holds_on_sqlites_view() {
    let dir = tmp();
    let path = new_file(dir.path(), "a.adf");
    let mut s = Store::open(&path).unwrap();
    s.db_execute("CREATE TABLE local_notes(t TEXT)", &[], false).unwrap();
    for q in [
        "SELECT *, 1 AS local_x FROM 'adf_identity'",
        "SELECT value, 1 AS local_x FROM 'adf_meta'",
        "SELECT config_json AS local_c FROM 'adf_config'",
        "SELECT * FROM \"ADF_META\" -- local_",
        "SELECT * FROM adf_loop JOIN 'adf_identity' ON 1",
        "SELECT * FROM dbstat, adf_loop",
        "SELECT (SELECT value FROM 'adf_meta' LIMIT 1) AS v FROM adf_loop",
        "WITH x AS (SELECT * FROM 'adf_identity') SELECT * FROM x, adf_loop",
        "SELECT * FROM local_notes, sqlite_sequence",
    ] {
        let e = s.db_query(q, &[], true).expect_err(q).to_string();
        assert!(!e.is_empty(), "{q}");
    }
    for w in [
        "CREATE TABLE local_copy AS SELECT * FROM 'adf_identity'",
        "CREATE VIRTUAL TABLE local_s USING dbstat",
        "INSERT INTO local_notes SELECT value FROM 'adf_meta'",
        "INSERT INTO local_notes SELECT config_json FROM 'adf_config'",
        "UPDATE local_notes SET t = (SELECT value FROM 'adf_identity')",
        "CREATE TABLE local_x AS SELECT * FROM sqlite_sequence",
    ] {
        let e = s.db_execute(w, &[], true).expect_err(w).to_string();
        assert!(!e.is_empty(), "{w}");
    }
    assert!(
        !s.db_query("SELECT name FROM sqlite_master WHERE name = 'local_copy'", &[], true)
            .unwrap()
            .rows
            .iter()
            .any(|_| true)
    );
    // Allowed things still work: vec0 and fts5 tables, reads of the loop.
    s.db_execute("CREATE VIRTUAL TABLE local_v USING vec0(embedding float[3])", &[], false).unwrap();
    s.db_execute("INSERT INTO local_v(rowid, embedding) VALUES (1, '[0.1,0.2,0.3]')", &[], false).unwrap();
    let hit =
        s.db_query("SELECT rowid FROM local_v WHERE embedding MATCH '[0.1,0.2,0.3]' AND k = 1", &[], false).unwrap();
    assert_eq!(hit.rows.len(), 1);
    s.db_execute("CREATE VIRTUAL TABLE local_f USING fts5(body)", &[], false).unwrap();
    s.db_execute("INSERT INTO local_f(body) VALUES ('hello world')", &[], false).unwrap();
    let fts = s.db_query("SELECT * FROM local_f WHERE local_f MATCH 'hello'", &[], false);
    assert_eq!(fts.as_ref().map(|r| r.rows.len()).map_err(|e| e.to_string()), Ok(1));
    s.db_query("SELECT seq, role FROM adf_loop", &[], false).unwrap();
    // Resource limits: a gigabyte value fails at once, small.
    let e = s.db_query("SELECT zeroblob(1000000000) AS z", &[], true).unwrap_err().to_string();
    assert!(e.contains("MiB"), "{e}");
    let e = s.db_execute("INSERT INTO local_notes VALUES (zeroblob(1000000000))", &[], true).unwrap_err().to_string();
    assert!(e.contains("MiB"), "{e}");
    s.close().unwrap();
    // The same through `adf sql`, as the owner.
    for q in ["SELECT *, 1 AS local_x FROM 'adf_identity'", "CREATE TABLE local_copy AS SELECT * FROM 'adf_identity'"] {
        let out = adf(dir.path(), &["sql", "a.adf", q], None);
        assert_eq!(out.status.code(), Some(1), "{q}");
    }
    let out = adf(dir.path(), &["sql", "a.adf", "SELECT length(zeroblob(1000000000)) AS n"], None);
    assert_eq!(out.status.code(), Some(1));
}

/// A flipped byte in a text cell: the rest of the row and the file still
/// read, the damaged character shows as U+FFFD.
#[test]
fn a_flipped_byte_in_text_still_reads() {
    let dir = tmp();
    let path = new_file(dir.path(), "a.adf");
    let c = raw(&path);
    c.execute(
        "INSERT INTO adf_loop(role, content_json, created_at) VALUES ('user', CAST(X'5B7B2274797065223A2274657874222C2274657874223A2268C328227D5D' AS TEXT), 1)",
        [],
    )
    .unwrap();
    c.execute("UPDATE adf_meta SET value = CAST(X'6BC328' AS TEXT) WHERE key = 'adf_name'", []).unwrap();
    drop(c);
    let s = Store::open_read_only(&path).unwrap();
    let rows = s.loop_rows(None).unwrap();
    assert!(rows[0].content.to_string().contains('\u{fffd}'), "{:?}", rows[0].content);
    assert!(s.meta_get("adf_name").unwrap().unwrap().value.contains('\u{fffd}'));
}

/// `adf files put` from a pipe or FIFO (`<(cmd)`): it has no length until
/// it ends, and is read whole.
#[test]
fn files_put_reads_a_pipe() {
    let dir = tmp();
    new_file(dir.path(), "a.adf");
    let out = adf(dir.path(), &["files", "put", "a.adf", "notes/piped.txt", "/dev/stdin"], Some(b"from a pipe\n"));
    ok(&out);
    assert_eq!(ok(&adf(dir.path(), &["files", "cat", "a.adf", "notes/piped.txt"], None)), "from a pipe\n");
}

/// A new agent and a reference-made file pass `adf config check`; a
/// provider id nobody knows does not.
#[test]
fn config_check_passes_new_and_reference_files_and_checks_provider_ids() {
    let dir = tmp();
    let d = dir.path();
    ok(&adf(d, &["new", "a.adf"], None));
    assert_eq!(ok(&adf(d, &["config", "check", "a.adf"], None)).trim(), "config is valid");
    fixture_copy(d, "fresh.adf");
    assert_eq!(ok(&adf(d, &["config", "check", "fresh.adf"], None)).trim(), "config is valid");
    ok(&adf(d, &["config", "set", "a.adf", "model.provider", "hibernate"], None));
    let text = ok(&adf(d, &["config", "check", "a.adf"], None));
    assert!(text.contains("model.provider: unknown provider \"hibernate\""), "{text}");
    // A provider entry of the file's own is known.
    ok(&adf(
        d,
        &[
            "config",
            "set",
            "a.adf",
            "providers",
            r#"[{"id":"custom:local","type":"openai-compatible","baseUrl":"http://127.0.0.1:9/v1"}]"#,
        ],
        None,
    ));
    ok(&adf(d, &["config", "set", "a.adf", "model.provider", "custom:local"], None));
    assert_eq!(ok(&adf(d, &["config", "check", "a.adf"], None)).trim(), "config is valid");
}

/// `adf chat FILE` resolves the provider as the daemon does: the agent's
/// own sealed key first, and its providers[] entry for a local endpoint
/// that needs no key (no account of that id, no key in the environment).
#[tokio::test(flavor = "multi_thread")]
async fn chat_uses_the_agents_own_key_and_its_provider_entry() {
    let dir = tmp();
    let d = dir.path().to_path_buf();
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_text(&["with my key"], 1, 1)),
        Scripted::sse(openai_text(&["local"], 1, 1)),
    ])
    .await;
    let base = fake.base_url.clone();
    let run = move |args: Vec<String>, stdin: Option<&'static [u8]>| {
        let d = d.clone();
        let base = base.clone();
        std::thread::spawn(move || {
            let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_adf"));
            cmd.args(&args)
                .current_dir(&d)
                .env("ADF_HOME", d.join(".adf-home"))
                .env("ANTHROPIC_BASE_URL", &base)
                .env_remove("ANTHROPIC_API_KEY")
                .env_remove("OPENAI_API_KEY")
                .env_remove("OPENAI_BASE_URL")
                .stdin(if stdin.is_some() { std::process::Stdio::piped() } else { std::process::Stdio::null() })
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            let mut child = cmd.spawn().unwrap();
            if let Some(i) = stdin {
                use std::io::Write;
                child.stdin.take().unwrap().write_all(i).unwrap();
            }
            child.wait_with_output().unwrap()
        })
    };
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    ok(&run(args(&["new", "a.adf", "--provider", "anthropic", "--model", "m"]), None).join().unwrap());
    ok(&run(args(&["credentials", "set", "a.adf", "provider:anthropic:apiKey"]), Some(b"sk-agent-own\n"))
        .join()
        .unwrap());
    let out = tokio::task::spawn_blocking({
        let r = run.clone();
        move || r(args(&["chat", "a.adf", "hi"]), None).join().unwrap()
    })
    .await
    .unwrap();
    assert!(ok(&out).contains("with my key"));
    let (h, _) = fake.requests()[0].clone();
    assert_eq!(h["x-api-key"], "sk-agent-own");
    // A file's own endpoint entry, no key anywhere.
    let entry = format!(r#"[{{"id":"custom:llama","type":"openai-compatible","baseUrl":"{}/v1"}}]"#, fake.base_url);
    ok(&run(args(&["config", "set", "a.adf", "providers", &entry]), None).join().unwrap());
    ok(&run(args(&["config", "set", "a.adf", "model.provider", "custom:llama"]), None).join().unwrap());
    let out =
        tokio::task::spawn_blocking(move || run(args(&["chat", "a.adf", "hi"]), None).join().unwrap()).await.unwrap();
    assert!(ok(&out).contains("local"));
}

/// `adf chat` on a file of a newer schema warns, as `inspect` does.
#[tokio::test(flavor = "multi_thread")]
async fn chat_warns_on_a_newer_schema() {
    let dir = tmp();
    let fake = FakeProvider::start(vec![Scripted::sse(anthropic_text(&["ok"], 1, 1))]).await;
    let d = dir.path().to_path_buf();
    ok(&adf(&d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    raw(&d.join("a.adf")).execute("UPDATE adf_meta SET value = '99' WHERE key = 'adf_schema_version'", []).unwrap();
    let base = fake.base_url.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_adf"))
            .args(["chat", "a.adf", "hi"])
            .current_dir(&d)
            .env("ADF_HOME", d.join(".adf-home"))
            .env("ANTHROPIC_BASE_URL", &base)
            .env("ANTHROPIC_API_KEY", "k")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("schema version 99 is newer"), "{err}");
}

/// `adf chat missing.adf hi` says the file is not there.
#[test]
fn chat_on_a_missing_file_says_so() {
    let dir = tmp();
    fails(&adf(dir.path(), &["chat", "missing.adf", "hi"], None), &["missing.adf: no such file"]);
}

/// A usage error is at most two lines.
#[test]
fn usage_errors_are_short() {
    let dir = tmp();
    for args in [vec!["files", "put"], vec!["--frobnicate"], vec!["config", "set", "a.adf"]] {
        let out = adf(dir.path(), &args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.trim_end().lines().count() <= 2, "{args:?}: {err}");
        assert!(err.starts_with("adf: "), "{err}");
    }
}
