//! Agents that make agents (issue 15): `adf clone`, `adf template save` and
//! `adf new --template` on real files through the real binary, and
//! `sys_create_adf` through a scripted model turn (the reference's own
//! `.adf` file among the templates). Template locks hold in every child;
//! refused or failed creations leave no file, not even a hidden work file.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex, Once};

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::executor::{ApprovalRequest, Decision, Executor, Owner};
use adf::store::files::WriteOptions;
use adf::store::loop_rows::NewLoopRow;
use adf::store::{Caller, NewAgent, Store};
use adf::tools::{Ctx, execute};
use common::*;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};

/// In-process tests record reviews in settings: keep them in a scratch home.
fn scratch_home() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let home = std::env::temp_dir().join(format!("adf-spawn-test-home-{}", std::process::id()));
        std::fs::create_dir_all(&home).unwrap();
        // SAFETY: set once, before any test of this binary reads it.
        unsafe { std::env::set_var("ADF_HOME", home) };
    });
}

/// Hidden work files (`.NAME.creating-PID`) or template stages left in `dir`.
/// The tests that create children share the temporary folder (their
/// template copies live there while a child is made): one at a time, so
/// each one's check for leftovers sees only its own.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".creating-") || n.starts_with(".adf-template"))
        .collect()
}

fn meta(store: &Store, key: &str) -> String {
    store.meta_get(key).unwrap().map(|m| m.value).unwrap_or_default()
}

/// Count rows of a table with plain SQLite (read-only).
fn count(path: &Path, sql: &str) -> i64 {
    let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// A headless agent with one loop row, an extra file, a plain provider
/// key and a local table.
fn seeded_source(dir: &Path, file: &str) -> std::path::PathBuf {
    let path = dir.join(file);
    let (mut s, _) = Store::create(&path, &NewAgent { name: Some("Scout"), ..Default::default() }).unwrap();
    s.loop_append(&NewLoopRow { role: "user", content: &json!("hello"), model: None, tokens: None, ord: None })
        .unwrap();
    s.file_write(Caller::Owner, "notes/extra.md", b"extra", &WriteOptions::default()).unwrap();
    s.secret_set("provider:anthropic:apiKey", b"sk-source-secret", false).unwrap();
    s.close().unwrap();
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute_batch("CREATE TABLE local_notes(x TEXT); INSERT INTO local_notes VALUES ('n');").unwrap();
    drop(c);
    path
}

#[test]
fn clone_has_a_fresh_identity_names_its_source_and_never_writes_the_source() {
    let dir = tmp();
    let src = seeded_source(dir.path(), "src.adf");
    let before = snapshot(&src);
    let out = json(&adf(dir.path(), &["clone", "src.adf", "copy.adf", "--json"], None));
    assert_eq!(snapshot(&src), before, "the source's bytes (and sidecars) are unchanged");
    let s = Store::open_read_only(&src).unwrap();
    let c = Store::open_read_only(dir.path().join("copy.adf")).unwrap();
    let (src_did, copy_did) = (meta(&s, "adf_did"), meta(&c, "adf_did"));
    assert!(copy_did.starts_with("did:key:z6Mk") && copy_did != src_did, "fresh DID");
    assert_eq!(out["did"], copy_did);
    assert_ne!(c.config_value().unwrap()["id"], s.config_value().unwrap()["id"], "fresh config id");
    let atts = c.attestations().unwrap();
    let clone = atts.iter().find(|a| a["role"] == "clone").expect("a clone attestation");
    assert_eq!(clone["subject"], copy_did);
    assert_eq!(clone["scope"], src_did, "it names the source");
    let copy = dir.path().join("copy.adf");
    assert_eq!(count(&copy, "SELECT count(*) FROM adf_loop"), 0, "no history without --history");
    assert_eq!(count(&copy, "SELECT count(*) FROM adf_files WHERE path = 'notes/extra.md'"), 0);
    assert_eq!(count(&copy, "SELECT count(*) FROM adf_files WHERE path = 'soul.md'"), 1, "default documents kept");
    assert_eq!(count(&copy, "SELECT count(*) FROM sqlite_master WHERE name = 'local_notes'"), 0);
    assert_eq!(count(&copy, "SELECT count(*) FROM adf_identity WHERE purpose LIKE 'provider:%'"), 0, "no secrets");
    drop((s, c));

    ok(&adf(dir.path(), &["clone", "src.adf", "full.adf", "--history", "--files", "--tables"], None));
    assert_eq!(snapshot(&src), before);
    let full = dir.path().join("full.adf");
    assert_eq!(count(&full, "SELECT count(*) FROM adf_loop"), 1, "--history");
    assert_eq!(count(&full, "SELECT count(*) FROM adf_files WHERE path = 'notes/extra.md'"), 1, "--files");
    assert_eq!(count(&full, "SELECT count(*) FROM local_notes"), 1, "--tables");
    assert!(leftovers(dir.path()).is_empty());
}

#[test]
fn clone_refuses_an_existing_destination_and_a_missing_source_and_writes_nothing() {
    let dir = tmp();
    let src = seeded_source(dir.path(), "src.adf");
    std::fs::write(dir.path().join("taken.adf"), b"precious").unwrap();
    let before = snapshot(&src);
    fails(&adf(dir.path(), &["clone", "src.adf", "taken.adf"], None), &["taken.adf", "already exists"]);
    assert_eq!(std::fs::read(dir.path().join("taken.adf")).unwrap(), b"precious", "never overwritten");
    assert_eq!(snapshot(&src), before);
    fails(&adf(dir.path(), &["clone", "missing.adf", "new.adf"], None), &["missing.adf", "no such file"]);
    assert!(!dir.path().join("new.adf").exists());
    assert!(leftovers(dir.path()).is_empty(), "{:?}", leftovers(dir.path()));
}

/// `sys_update_config` as the agent itself would call it.
fn agent_update(path: &Path, key: &str, value: Value) -> adf::tools::ToolOutput {
    let mut store = Store::open(path).unwrap();
    let mut emit = |_: &'static str, _: Value| {};
    let mut ctx = Ctx { store: &mut store, caller: Caller::AGENT, from_code: false, full: false, emit: &mut emit };
    execute(&mut ctx, "sys_update_config", &json!({"path": key, "value": value}))
}

#[test]
fn template_save_drops_history_and_secrets_and_its_locks_hold_in_every_child() {
    let dir = tmp();
    seeded_source(dir.path(), "src.adf");
    let out = json(&adf(
        dir.path(),
        &["template", "save", "src.adf", "tpl.adf", "--lock", "model.model_id", "--lock", "tools.fs_write", "--json"],
        None,
    ));
    assert_eq!(out["locked_fields"], json!(["model.model_id"]));
    let tpl = dir.path().join("tpl.adf");
    for table in ["adf_loop", "adf_inbox", "adf_outbox", "adf_logs", "adf_tasks", "adf_timers", "adf_identity"] {
        assert_eq!(count(&tpl, &format!("SELECT count(*) FROM {table}")), 0, "{table} is empty in a template");
    }
    assert_eq!(count(&tpl, "SELECT count(*) FROM adf_meta WHERE key = 'adf_did'"), 0, "no DID");
    assert_eq!(count(&tpl, "SELECT count(*) FROM adf_files WHERE path = 'notes/extra.md'"), 1, "files kept");

    for child in ["one.adf", "two.adf"] {
        let made = json(&adf(dir.path(), &["new", child, "--template", "tpl.adf", "--json"], None));
        let path = dir.path().join(child);
        let s = Store::open_read_only(&path).unwrap();
        let cfg = s.config_value().unwrap();
        assert_eq!(cfg["locked_fields"], json!(["model.model_id"]), "{child} keeps the field lock");
        let fs_write = cfg["tools"].as_array().unwrap().iter().find(|t| t["name"] == "fs_write").unwrap();
        assert_eq!(fs_write["locked"], true, "{child} keeps the item lock");
        assert_eq!(meta(&s, "adf_did"), made["did"].as_str().unwrap(), "{child} has its own DID");
        assert_eq!(count(&path, "SELECT count(*) FROM adf_files WHERE path = 'notes/extra.md'"), 1);
        drop(s);
        let refused = agent_update(&path, "model.model_id", json!("other"));
        assert!(refused.is_error && refused.content.contains("locked"), "{}", refused.content);
        let refused = agent_update(&path, "tools.fs_write.enabled", json!(false));
        assert!(refused.is_error && refused.content.contains("locked"), "{}", refused.content);
        let allowed = agent_update(&path, "description", json!("free"));
        assert!(!allowed.is_error, "{}", allowed.content);
    }
    assert!(leftovers(dir.path()).is_empty());
}

#[test]
fn bad_templates_and_sources_give_one_clear_error_and_leave_nothing() {
    let dir = tmp();
    seeded_source(dir.path(), "src.adf");
    ok(&adf(dir.path(), &["template", "save", "src.adf", "tpl.adf"], None));
    std::fs::write(dir.path().join("notes.txt"), "just text, not an agent\n".repeat(10)).unwrap();
    let bytes = std::fs::read(dir.path().join("tpl.adf")).unwrap();
    std::fs::write(dir.path().join("damaged.adf"), &bytes[..50]).unwrap();
    let cases: [(&[&str], &[&str]); 5] = [
        (&["new", "a.adf", "--template", "notes.txt"], &["notes.txt", "not a SQLite database"]),
        (&["new", "a.adf", "--template", "damaged.adf"], &["damaged.adf", "cut short"]),
        (&["new", "a.adf", "--template", "absent.adf"], &["absent.adf", "no such file"]),
        (&["template", "save", "notes.txt", "a.adf"], &["notes.txt", "not a SQLite database"]),
        (&["template", "save", "src.adf", "a.adf", "--lock", "nonsense.path"], &["nonsense.path", "not a config path"]),
    ];
    for (args, needles) in cases {
        fails(&adf(dir.path(), args, None), needles);
        assert!(!dir.path().join("a.adf").exists(), "{args:?} wrote nothing");
    }
    assert!(leftovers(dir.path()).is_empty(), "{:?}", leftovers(dir.path()));
}

/// An owner who approves every call and counts them.
#[derive(Default)]
struct Yes(Mutex<Vec<String>>);

impl Owner for Yes {
    fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, Decision> {
        self.0.lock().unwrap().push(req.tool.clone());
        Box::pin(async { Decision::Approve { always: false } })
    }
    fn answer<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async { None })
    }
}

/// A parent agent with `sys_create_adf` enabled, a provider key of its own
/// and `template` stored among its files as `templates/t.adf`.
fn parent(dir: &Path, template: &[u8]) -> Store {
    let (mut s, _) = Store::create(
        dir.join("parent.adf"),
        &NewAgent { name: Some("Parent"), provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    s.config_set(Caller::Owner, "tools.sys_create_adf.enabled", json!(true)).unwrap();
    s.config_set(Caller::Owner, "tools.sys_create_adf.visible", json!(true)).unwrap();
    s.secret_set("provider:anthropic:apiKey", b"sk-parent-secret", false).unwrap();
    s.file_write(Caller::Owner, "templates/t.adf", template, &WriteOptions::default()).unwrap();
    s.file_write(Caller::Owner, "brief.md", b"# Brief\nFind things.", &WriteOptions::default()).unwrap();
    s
}

/// Run one scripted turn that calls `sys_create_adf` with `input`; the
/// tool's result text and the owner's approvals.
async fn create_turn(store: Store, input: Value) -> (String, Vec<String>, Executor) {
    let provider =
        Arc::new(Scripted::new([Reply::Tools(vec![("sys_create_adf".into(), input)]), Reply::Text("done".into())]));
    let owner = Arc::new(Yes::default());
    let mut ex = Executor::new(store, provider.clone(), Bus::new(), owner.clone()).unwrap();
    ex.chat("make a child").await.unwrap();
    let rows = ex.store.loop_rows(None).unwrap();
    let result = rows
        .iter()
        .map(|r| r.content.to_string())
        .find(|c| c.contains("Agent created successfully") || c.contains("Failed to create agent"))
        .unwrap_or_default();
    let asked = owner.0.lock().unwrap().clone();
    (result, asked, ex)
}

#[tokio::test]
async fn sys_create_adf_makes_a_child_from_the_reference_file_as_a_template() {
    let _one = SERIAL.lock().await;
    scratch_home();
    let dir = tmp();
    let reference = std::fs::read(fixture_copy(dir.path(), "fresh.adf")).unwrap();
    let store = parent(dir.path(), &reference);
    let parent_did = meta(&store, "adf_did");
    let input = json!({
        "name": "Research Bot #2",
        "location": "kids",
        "template": "templates/t.adf",
        "files": [{"parent_path": "brief.md", "child_path": "docs/brief.md"}],
        "instructions": "Research what the parent asks.",
        "limits": {"max_active_turns": 7},
    });
    std::fs::create_dir(dir.path().join("kids")).unwrap();
    let (result, asked, ex) = create_turn(store, input).await;
    assert_eq!(asked, vec!["sys_create_adf".to_string()], "restricted: the owner approved it");
    let child = dir.path().join("kids/Research_Bot__2.adf");
    assert!(result.contains("Agent created successfully."), "{result}");
    for line in ["Name: Research Bot #2", "Template: templates/t.adf", "Files injected: 1", "Autostarted: false"] {
        assert!(result.contains(line), "{line} in {result}");
    }
    assert!(result.contains("Path: ") && result.contains("kids/Research_Bot__2.adf"), "{result}");
    let c = Store::open_read_only(&child).unwrap();
    assert_eq!(meta(&c, "adf_parent_did"), parent_did, "adf_parent_did is the caller's DID");
    let did = meta(&c, "adf_did");
    assert!(did.starts_with("did:key:z6Mk") && did != parent_did, "fresh DID");
    assert!(result.contains(&format!("DID: {did}")));
    let cfg = c.config_value().unwrap();
    assert_eq!(cfg["name"], "Research Bot #2");
    assert_eq!(cfg["instructions"], "Research what the parent asks.");
    assert_eq!(cfg["limits"]["max_active_turns"], 7);
    assert_eq!(c.file_read("docs/brief.md").unwrap().1, b"# Brief\nFind things.");
    let rows = count(&child, "SELECT count(*) FROM adf_identity WHERE purpose NOT LIKE 'crypto:%'");
    assert_eq!(rows, 0, "no credentials: the reference's are sealed, the parent's are never copied");
    let reviewed = adf::review::reviewed();
    assert!(reviewed.contains(cfg["id"].as_str().unwrap()), "creation by the parent counts as review");
    drop(ex);
    assert!(leftovers(&dir.path().join("kids")).is_empty());
    assert!(leftovers(&std::env::temp_dir()).iter().all(|n| !n.contains(&format!("-{}-", std::process::id()))));
}

#[tokio::test]
async fn sys_create_adf_refuses_an_override_of_a_locked_field_and_creates_nothing() {
    let _one = SERIAL.lock().await;
    scratch_home();
    let dir = tmp();
    let src = seeded_source(dir.path(), "src.adf");
    let tpl = dir.path().join("tpl.adf");
    adf::store::derive::save_template(&src, &tpl, &["model.model_id".into(), "tools.fs_write".into()]).unwrap();
    let store = parent(dir.path(), &std::fs::read(&tpl).unwrap());
    let locked = json!({"name": "kid", "template": "templates/t.adf", "model": {"model_id": "other"}});
    let (result, _, ex) = create_turn(store, locked).await;
    assert!(result.contains("Failed to create agent:") && result.contains("model.model_id"), "{result}");
    assert!(!dir.path().join("kid.adf").exists(), "no file");
    let store = ex.store;
    let item = json!({"name": "kid", "template": "templates/t.adf", "tools": [{"name": "fs_write", "enabled": true}]});
    let (result, _, _ex) = create_turn(store, item).await;
    assert!(result.contains("Failed to create agent:") && result.contains("locked"), "{result}");
    assert!(!dir.path().join("kid.adf").exists(), "no file");
    assert!(leftovers(dir.path()).is_empty(), "{:?}", leftovers(dir.path()));
}

#[tokio::test]
async fn sys_create_adf_never_overwrites_an_existing_file() {
    let _one = SERIAL.lock().await;
    scratch_home();
    let dir = tmp();
    std::fs::write(dir.path().join("kid.adf"), b"precious").unwrap();
    let store = parent(dir.path(), b"unused");
    let (result, _, _ex) = create_turn(store, json!({"name": "kid"})).await;
    assert!(result.contains("Failed to create agent:") && result.contains("already exists"), "{result}");
    assert_eq!(std::fs::read(dir.path().join("kid.adf")).unwrap(), b"precious");
}
