//! SKILL.md skills and OKF bundles, end to end with the real binary: a
//! skill folder added from disk, the fleet's skills layered under the
//! agent's own, invalid ones listed with their reason, muting, the system
//! prompt offering names and descriptions only, `/<skill> args` loading the
//! body into the owner's turn, `fs_read` reaching a fleet skill's resource,
//! and `adf okf ls` over a bundle with a broken link.

mod common;

use std::path::Path;

use common::fake_provider::*;
use common::*;
use serde_json::{Value, json};

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn put(dir: &Path, vpath: &str, text: &str) {
    ok(&adf(dir, &["files", "put", "a.adf", vpath, "-"], Some(text.as_bytes())));
}

/// A fleet with `refunds` (replaced by the agent's own), `triage` and a
/// broken one; an agent with its own `refunds` and a SKILL.md without a
/// name.
fn setup(dir: &Path) {
    ok(&adf(dir, &["new", "a.adf", "--provider", "anthropic", "--model", "test-model"], None));
    let fleet = dir.join(".adf-home/data/skills");
    write(&fleet.join("refunds/SKILL.md"), "---\nname: refunds\ndescription: The fleet's old refunds.\n---\nold");
    write(
        &fleet.join("triage-folder/SKILL.md"),
        "---\nname: triage\ndescription: Sort incoming mail by urgency.\n---\n# Triage\nRead refs/levels.md first.",
    );
    write(&fleet.join("triage-folder/refs/levels.md"), "P0: now. P1: today.");
    write(&fleet.join("broken/SKILL.md"), "no frontmatter here");
    let src = dir.join("src-skill");
    write(
        &src.join("SKILL.md"),
        "---\nname: refunds\ndescription: Handle refund requests.\n---\n# Refunds\nCheck the 30-day window.",
    );
    write(&src.join("references/policy.md"), "# Policy\n30-day window applies.");
    write(&src.join(".git/HEAD"), "hidden, not copied");
    let out = ok(&adf(dir, &["skills", "add", "a.adf", src.to_str().unwrap()], None));
    assert_eq!(out.trim(), "added skill refunds (2 files under skills/refunds/)");
    put(dir, "skills/nameless/SKILL.md", "---\ndescription: no name\n---\nbody");
}

#[test]
fn skills_are_layered_listed_validated_and_muted() {
    let dir = tmp();
    setup(dir.path());
    let ls = json(&adf(dir.path(), &["skills", "ls", "a.adf", "--json"], None));
    let skills = ls["skills"].as_array().unwrap();
    let brief: Vec<(String, String, bool)> = skills
        .iter()
        .map(|s| (s["name"].as_str().unwrap().into(), s["root"].as_str().unwrap().into(), s["shadowed"] == true))
        .collect();
    assert_eq!(
        brief,
        [
            ("refunds".into(), "fleet".into(), true),
            ("refunds".into(), "agent".into(), false),
            ("triage".into(), "fleet".into(), false)
        ] as [(String, String, bool); 3]
    );
    assert_eq!(skills[1]["resources"], json!(["references/policy.md"]));
    assert_eq!(skills[2]["resources"], json!(["refs/levels.md"]));
    let invalid: Vec<(String, String)> = ls["invalid"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["path"].as_str().unwrap().into(), i["reason"].as_str().unwrap().into()))
        .collect();
    assert!(
        invalid.contains(&(
            "skills/broken/SKILL.md".into(),
            "no YAML frontmatter (--- name: … description: … ---)".into()
        ))
    );
    assert!(invalid.iter().any(|(p, r)| p == "skills/nameless/SKILL.md" && r.contains("no name")), "{invalid:?}");

    // Bad adds change nothing.
    let a = dir.path().join("a.adf");
    let before = snapshot(&a);
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    fails(&adf(dir.path(), &["skills", "add", "a.adf", empty.to_str().unwrap()], None), &["SKILL.md"]);
    let src = dir.path().join("src-skill");
    fails(&adf(dir.path(), &["skills", "add", "a.adf", src.to_str().unwrap()], None), &["already has a skill"]);
    fails(&adf(dir.path(), &["skills", "mute", "a.adf", "nope"], None), &["no skill named"]);
    assert_eq!(snapshot(&a), before);

    ok(&adf(dir.path(), &["skills", "mute", "a.adf", "triage"], None));
    let ls = json(&adf(dir.path(), &["skills", "ls", "a.adf", "--json"], None));
    let triage = ls["skills"].as_array().unwrap().iter().find(|s| s["name"] == "triage").unwrap().clone();
    assert_eq!(triage["muted"], true);
    let text = ok(&adf(dir.path(), &["skills", "ls", "a.adf"], None));
    assert!(text.contains("triage") && text.contains("(muted)"), "{text}");
    ok(&adf(dir.path(), &["skills", "unmute", "a.adf", "triage"], None));
    let ls = json(&adf(dir.path(), &["skills", "ls", "a.adf", "--json"], None));
    assert!(ls["skills"].as_array().unwrap().iter().all(|s| s["muted"] == false));
}

/// The model sees names and descriptions (not bodies, not muted or
/// replaced skills); `/refunds …` runs with the body loaded; `fs_read`
/// reaches the fleet skill's resource; an OKF bundle's index is offered.
#[tokio::test(flavor = "multi_thread")]
async fn the_model_gets_skills_by_name_and_bodies_on_demand() {
    let dir = tmp();
    setup(dir.path());
    put(dir.path(), "kb/index.md", "# Sales\n* [Orders](/tables/orders.md)");
    put(dir.path(), "kb/tables/orders.md", "---\ntype: BigQuery Table\ntitle: Orders\n---\nOne row per order.");
    ok(&adf(dir.path(), &["skills", "mute", "a.adf", "refunds"], None));
    ok(&adf(dir.path(), &["skills", "unmute", "a.adf", "refunds"], None));
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_tool("t1", "fs_read", r#"{"path":"skills/triage/refs/levels.md"}"#)),
        Scripted::sse(anthropic_text(&["sorted"], 10, 2)),
    ])
    .await;
    let (d, base) = (dir.path().to_path_buf(), fake.base_url.clone());
    let out = tokio::task::spawn_blocking(move || {
        adf_with_providers(&d, &base, &["chat", "a.adf", "/refunds order 42 arrived broken"])
    })
    .await
    .unwrap();
    assert_eq!(ok(&out).trim(), "sorted");
    let (_, first) = &fake.requests()[0];
    let system: String = match &first["system"] {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("\n"),
        _ => String::new(),
    };
    assert!(system.contains("## Skills"), "{system}");
    assert!(system.contains("- refunds: Handle refund requests. (skills/refunds/SKILL.md)"), "{system}");
    assert!(system.contains("- triage: Sort incoming mail by urgency."), "{system}");
    assert!(!system.contains("The fleet's old refunds") && !system.contains("Check the 30-day window"), "{system}");
    assert!(system.contains("- kb/index.md: Sales (1 concept)"), "{system}");
    let user = first["messages"][0].to_string();
    assert!(user.contains("[Skill: refunds]") && user.contains("Check the 30-day window."), "{user}");
    assert!(user.contains("order 42 arrived broken"), "{user}");
    let s = adf::store::Store::open_read_only(dir.path().join("a.adf")).unwrap();
    let results = tool_results(&s);
    assert!(results[0].0.contains("P0: now. P1: today.") && !results[0].1, "{results:?}");
    // A muted skill is neither offered nor expanded.
    drop(s);
    ok(&adf(dir.path(), &["skills", "mute", "a.adf", "triage"], None));
    let fake = FakeProvider::start(vec![Scripted::sse(anthropic_text(&["ok"], 10, 2))]).await;
    let (d, base) = (dir.path().to_path_buf(), fake.base_url.clone());
    let out = tokio::task::spawn_blocking(move || adf_with_providers(&d, &base, &["chat", "a.adf", "/triage now"]))
        .await
        .unwrap();
    ok(&out);
    let (_, req) = &fake.requests()[0];
    assert!(!req.to_string().contains("Sort incoming mail"), "muted: not offered");
    assert!(!req.to_string().contains("[Skill: triage]"), "muted: not expanded");
}

#[test]
fn okf_concepts_links_and_broken_links() {
    let dir = tmp();
    ok(&adf(dir.path(), &["new", "a.adf"], None));
    put(dir.path(), "kb/index.md", "# Sales\n* [Orders](/tables/orders.md)");
    put(
        dir.path(),
        "kb/tables/orders.md",
        "---\ntype: BigQuery Table\ntitle: Orders\ndescription: One row per order.\nowner: sales\n---\n\
         Joins [customers](customers.md) and [gone](../missing.md); see [docs](https://x.test/a.md).",
    );
    put(dir.path(), "kb/tables/customers.md", "---\ntype: BigQuery Table\n---\n# Customers\n");
    put(dir.path(), "kb/notes.md", "no frontmatter: not a concept");
    let list = json(&adf(dir.path(), &["okf", "ls", "a.adf", "kb", "--json"], None));
    assert_eq!(
        list,
        json!([
            {"id": "tables/customers", "type": "BigQuery Table", "title": "Customers", "links": []},
            {"id": "tables/orders", "type": "BigQuery Table", "title": "Orders", "description": "One row per order.",
             "links": ["tables/customers"], "broken_links": ["../missing.md"]}
        ])
    );
    let text = ok(&adf(dir.path(), &["okf", "ls", "a.adf", "kb"], None));
    assert!(text.contains("broken: ../missing.md"), "{text}");
    let none = ok(&adf(dir.path(), &["okf", "ls", "a.adf", "nowhere"], None));
    assert!(none.contains("no OKF concepts"), "{none}");
}
