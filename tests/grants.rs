//! Scoped, time-boxed grants (issue 19): a restricted tool approved ahead
//! of time for calls under a folder, on a host, or for a while. A call a
//! live grant covers runs without asking the owner; one it does not cover
//! asks as before; every grant made, used and revoked is in the audit
//! trail (`adf logs --origin grant`).

mod common;

use std::sync::{Arc, Mutex};

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::executor::{ApprovalRequest, Decision, Executor, Owner};
use adf::store::grants::NewGrant;
use adf::store::{NewAgent, Store};
use common::*;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};

/// An owner who answers from a list and panics when asked beyond it.
struct Strict {
    decisions: Mutex<Vec<Decision>>,
    asked: Mutex<Vec<String>>,
}

impl Owner for Strict {
    fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, Decision> {
        self.asked.lock().unwrap().push(req.input["path"].as_str().unwrap_or("").to_string());
        let d = self.decisions.lock().unwrap().remove(0);
        Box::pin(async move { d })
    }
    fn answer<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async { None })
    }
}

fn restricted_agent(dir: &std::path::Path) -> Store {
    let (mut s, _) = Store::create(
        dir.join("a.adf"),
        &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    let mut cfg = s.config_value().unwrap();
    for t in cfg["tools"].as_array_mut().unwrap() {
        if t["name"] == "fs_write" {
            t["restricted"] = json!(true);
        }
    }
    s.config_replace(cfg).unwrap();
    s
}

fn write(path: &str) -> Reply {
    Reply::Tools(vec![("fs_write".into(), json!({"mode": "write", "path": path, "content": "x"}))])
}

fn logs(s: &Store) -> Vec<(String, String)> {
    let c = rusqlite::Connection::open(s.path()).unwrap();
    let mut st = c.prepare("SELECT event, message FROM adf_logs WHERE origin = 'grant' ORDER BY id").unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().collect::<Result<_, _>>().unwrap()
}

#[tokio::test]
async fn a_grant_answers_for_the_owner_only_within_its_reach() {
    let dir = tmp();
    let mut s = restricted_agent(dir.path());
    let g = s
        .grant_add(NewGrant {
            tool: "fs_write".into(),
            path: Some("notes/".into()),
            for_ms: Some(30 * 60_000),
            note: "tidying notes".into(),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(g.path.as_deref(), Some("notes"));
    let owner =
        Arc::new(Strict { decisions: Mutex::new(vec![Decision::Deny { feedback: None }]), asked: Mutex::default() });
    let provider = Arc::new(Scripted::new([
        write("notes/today.md"),
        Reply::Text("done".into()),
        write("secrets.md"),
        Reply::Text("ok".into()),
        write("notes/../secrets.md"),
        Reply::Text("ok".into()),
    ]));
    let mut ex = Executor::new(s, provider, Bus::new(), owner.clone()).unwrap();
    ex.chat("write today's notes").await.unwrap();
    assert_eq!(ex.store.file_read_text("notes/today.md").unwrap(), "x", "written without asking");
    assert!(owner.asked.lock().unwrap().is_empty());
    ex.chat("and the secrets").await.unwrap();
    assert_eq!(owner.asked.lock().unwrap().as_slice(), ["secrets.md"], "outside the folder: asked");
    assert!(ex.store.file_read_text("secrets.md").is_err(), "denied");
    // A path that climbs out is not under the folder, whatever its text.
    owner.decisions.lock().unwrap().push(Decision::Deny { feedback: None });
    ex.chat("sneak").await.unwrap();
    assert_eq!(owner.asked.lock().unwrap().len(), 2);
    let list = ex.store.grant_list(false).unwrap();
    assert_eq!(list[0].uses, 1);
    let l = logs(&ex.store);
    let events: Vec<&str> = l.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(events, ["grant_added", "grant_used"], "{l:?}");
    assert!(l[0].1.contains("fs_write under notes/ until"), "{l:?}");
    // Revoked, it answers for nobody.
    assert!(ex.store.grant_remove(&g.id).unwrap());
    assert!(!ex.store.grant_remove(&g.id).unwrap());
    assert_eq!(logs(&ex.store).last().unwrap().0, "grant_removed");
}

#[test]
fn adf_grants_and_approve_with_a_scope_from_the_shell() {
    let dir = tmp();
    let d = dir.path();
    restricted_agent(d).close().unwrap();
    let before = snapshot(&d.join("a.adf"));
    for (args, says) in [
        (vec!["--path", "../etc"], "not a path pattern"),
        (vec!["--host", "exa mple.com"], "not a host"),
        (vec!["--for", "forever"], "not a duration"),
        (vec!["--for", "90d"], "longer than 30 days"),
        (vec![], "--for, --path or --host"),
    ] {
        let mut a = vec!["grants", "add", "a.adf", "fs_write"];
        a.extend(args);
        fails(&adf(d, &a, None), &[says]);
    }
    assert_eq!(snapshot(&d.join("a.adf")), before, "refused grants change nothing");
    let g = json(&adf(
        d,
        &["grants", "add", "a.adf", "web_fetch", "--host", "*.example.com", "--for", "2h", "--json"],
        None,
    ));
    let id = g["id"].as_str().unwrap().to_string();
    assert_eq!(g["host"], "*.example.com");
    let v = json(&adf(d, &["grants", "ls", "a.adf", "--json"], None));
    assert_eq!(v["grants"][0]["id"], Value::String(id.clone()));
    let text = ok(&adf(d, &["grants", "ls", "a.adf"], None));
    assert!(text.contains("web_fetch") && text.contains("min left"), "{text}");
    ok(&adf(d, &["grants", "rm", "a.adf", &id], None));
    fails(&adf(d, &["grants", "rm", "a.adf", &id], None), &["no grant"]);
    assert!(ok(&adf(d, &["grants", "ls", "a.adf"], None)).contains("no grants"));
    let audit = ok(&adf(d, &["logs", "a.adf", "--origin", "grant"], None));
    assert!(audit.contains("grant_added") && audit.contains("grant_removed"), "{audit}");
}
