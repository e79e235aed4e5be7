//! Budgets that stop spend before it happens (issue 19): `limits.budget`
//! in dollars or tokens, per day and in total, for the agent and for a side
//! loop. The call's worst case is checked first; a call that would cross a
//! budget is never sent, the turn ends suspended with a notice naming the
//! budget, and what was spent survives a restart.

mod common;

use std::sync::Arc;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::{Bus, Filter, Item};
use adf::runtime::executor::{Absent, Executor, TurnEnd};
use adf::store::loops::LoopSpec;
use adf::store::{NewAgent, Store};
use common::*;
use serde_json::{Value, json};

fn agent(dir: &std::path::Path, budget: Value) -> Store {
    let (mut s, _) = Store::create(
        dir.join("a.adf"),
        &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    let mut cfg = s.config_value().unwrap();
    cfg["model"]["max_tokens"] = json!(100);
    cfg["limits"]["budget"] = budget;
    s.config_replace(cfg).unwrap();
    s
}

fn prices(v: Value) -> adf::providers::prices::Prices {
    let settings: adf::providers::accounts::Settings = serde_json::from_value(json!({"prices": v})).unwrap();
    adf::providers::prices::from_settings(&settings)
}

fn texts(rows: &[adf::store::loop_rows::LoopRow]) -> String {
    rows.iter().map(|r| r.content.to_string()).collect::<Vec<_>>().join("\n")
}

#[tokio::test]
async fn a_token_budget_stops_the_call_that_would_cross_it_and_survives_a_restart() {
    let dir = tmp();
    let s = agent(dir.path(), json!({"tokens_day": 1_000_000}));
    let provider = Arc::new(Scripted::new([]).with_fallback(|_| Reply::Text("ok".into())));
    let bus = Bus::new();
    let mut sub = bus.subscribe(None, Filter { agent_id: None, types: vec!["suspend.requested".into()] });
    let mut ex = Executor::new(s, provider.clone(), bus, Arc::new(Absent)).unwrap();
    assert!(matches!(ex.chat("one").await.unwrap(), TurnEnd::Completed { .. }));
    let spent = ex.store.spent("agent").unwrap();
    assert_eq!((spent.tokens_day, spent.tokens_total), (120, 120), "the scripted call's 100 + 20");
    // Lower it under what the next call could use.
    let mut cfg = ex.store.config_value().unwrap();
    cfg["limits"]["budget"] = json!({"tokens_day": 200});
    ex.store.config_replace(cfg).unwrap();
    let calls = provider.call_count();
    assert!(matches!(ex.chat("two").await.unwrap(), TurnEnd::Suspended));
    assert_eq!(provider.call_count(), calls, "the call was never sent");
    let rows = ex.store.loop_rows(None).unwrap();
    let last = texts(&rows[rows.len() - 1..]);
    assert!(last.contains("[Budget] limits.budget.tokens_day of 200 reached: 120 spent today"), "{last}");
    assert!(last.contains("adf config set") && last.contains("limits.budget"), "says how to raise it: {last}");
    let Some(Item::Event(e)) = sub.try_next() else { panic!("no suspend.requested") };
    assert_eq!(
        (e.event.payload["reason"].as_str(), e.event.payload["budget"].as_str()),
        (Some("budget"), Some("tokens_day"))
    );
    let raw = rusqlite::Connection::open(ex.store.path()).unwrap();
    let n: i64 =
        raw.query_row("SELECT count(*) FROM adf_logs WHERE event = 'budget_exceeded'", [], |r| r.get(0)).unwrap();
    assert_eq!(n, 1);
    drop(raw);
    // The spend is in the file: a restart does not reset it.
    let path = ex.store.path().to_path_buf();
    ex.store_into().close().unwrap();
    let mut s = Store::open(&path).unwrap();
    assert_eq!(s.spent("agent").unwrap().tokens_day, 120);
    // Raised, the agent goes on.
    let mut cfg = s.config_value().unwrap();
    cfg["limits"]["budget"] = json!({"tokens_day": 1_000_000});
    s.config_replace(cfg).unwrap();
    let mut ex = Executor::new(s, provider.clone(), Bus::new(), Arc::new(Absent)).unwrap();
    assert!(matches!(ex.chat("three").await.unwrap(), TurnEnd::Completed { .. }));
    assert_eq!(ex.store.spent("agent").unwrap().tokens_day, 240);
}

#[tokio::test]
async fn dollar_budgets_need_a_price_and_count_the_worst_case() {
    let dir = tmp();
    let s = agent(dir.path(), json!({"usd_day": 0.0001}));
    let provider = Arc::new(Scripted::new([]).with_fallback(|_| Reply::Text("ok".into())));
    let mut ex = Executor::new(s, provider.clone(), Bus::new(), Arc::new(Absent)).unwrap();
    // No price for the model: a dollar budget cannot be checked, so no call.
    assert!(matches!(ex.chat("hi").await.unwrap(), TurnEnd::Suspended));
    assert_eq!(provider.call_count(), 0);
    assert!(texts(&ex.store.loop_rows(None).unwrap()).contains("has no price"));
    // $1 a million tokens: the worst case (the prompt + 100 output) is
    // about $0.003, past $0.0001; $1 a day lets it through and counts it.
    ex.set_prices(prices(json!({"m": {"input": 1.0, "output": 1.0}})));
    assert!(matches!(ex.chat("hi").await.unwrap(), TurnEnd::Suspended));
    assert_eq!(provider.call_count(), 0);
    assert!(texts(&ex.store.loop_rows(None).unwrap()).contains("limits.budget.usd_day of $0.0001 reached"));
    let mut cfg = ex.store.config_value().unwrap();
    cfg["limits"]["budget"] = json!({"usd_day": 1.0, "usd_total": 2.0});
    ex.store.config_replace(cfg).unwrap();
    assert!(matches!(ex.chat("hi").await.unwrap(), TurnEnd::Completed { .. }));
    let spent = ex.store.spent("agent").unwrap();
    assert!((spent.usd_day - 0.00012).abs() < 1e-9, "{spent:?}");
}

#[tokio::test]
async fn a_side_loop_stops_at_its_own_budget_and_is_paused() {
    let dir = tmp();
    let mut s = agent(dir.path(), Value::Null);
    s.loop_create("crit", &LoopSpec { budget: Some(json!({"tokens_total": 50})), ..Default::default() }).unwrap();
    assert!(s.loop_create("bad", &LoopSpec { budget: Some(json!({"usd_dya": 1})), ..Default::default() }).is_err());
    let provider = Arc::new(Scripted::new([]).with_fallback(|_| Reply::Text("ok".into())));
    let mut ex = Executor::new(s, provider.clone(), Bus::new(), Arc::new(Absent)).unwrap();
    assert!(matches!(ex.side_turn("crit", Some("review"), "chat").await.unwrap(), TurnEnd::Suspended));
    assert_eq!(provider.call_count(), 0);
    let d = ex.store.loop_get("crit").unwrap().unwrap();
    assert_eq!(d.status, "paused", "paused until the owner raises it");
    assert!(texts(&ex.store.side_rows("crit").unwrap()).contains("loop crit's budget.tokens_total of 50 reached"));
    assert_eq!(ex.state, "idle", "the agent is not suspended by a loop's budget");
    // Main has no budget and goes on; its spend is the agent's, not the
    // paused loop's.
    assert!(matches!(ex.chat("hello").await.unwrap(), TurnEnd::Completed { .. }));
    assert_eq!(ex.store.spent("agent").unwrap().tokens_total, 120);
    assert_eq!(ex.store.spent("loop:crit").unwrap().tokens_total, 0);
}

#[test]
fn budgets_are_checked_as_config_and_shown_by_adf_usage() {
    let dir = tmp();
    let d = dir.path();
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    fails(
        &adf(d, &["config", "set", "a.adf", "limits.budget", r#"{"usd_dya": 2}"#], None),
        &["usd_dya", "is not a budget"],
    );
    fails(&adf(d, &["config", "set", "a.adf", "limits.budget", r#"{"usd_day": -1}"#], None), &["usd_day"]);
    ok(&adf(d, &["config", "set", "a.adf", "limits.budget", r#"{"usd_day": 2, "tokens_total": 500000}"#], None));
    ok(&adf(d, &["loops", "new", "a.adf", "crit", "--budget", r#"{"tokens_day": 1000}"#], None));
    fails(&adf(d, &["loops", "budget", "a.adf", "crit", r#"{"nope": 1}"#], None), &["not valid"]);
    let u = json(&adf(d, &["usage", "a.adf", "--json"], None));
    let scopes: Vec<&str> = u["budgets"].as_array().unwrap().iter().map(|b| b["scope"].as_str().unwrap()).collect();
    assert_eq!(scopes, ["agent", "loop:crit"]);
    assert_eq!(u["budgets"][0]["budget"], json!({"usd_day": 2.0, "tokens_total": 500000}));
    let text = ok(&adf(d, &["usage", "a.adf"], None));
    assert!(text.contains("BUDGET") && text.contains("$0.0000 of $2.00") && text.contains("0 of 1000"), "{text}");
    ok(&adf(d, &["loops", "budget", "a.adf", "crit", "null"], None));
    let u = json(&adf(d, &["usage", "a.adf", "--json"], None));
    assert_eq!(u["budgets"].as_array().unwrap().len(), 1, "removed");
}

#[test]
fn deferred_spend_counts_at_once_and_commits_with_the_next_write_or_the_close() {
    let dir = tmp();
    let mut s = agent(dir.path(), Value::Null);
    let path = s.path().to_path_buf();
    let on_disk = |p: &std::path::Path| -> i64 {
        let c = rusqlite::Connection::open_with_flags(p, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        c.query_row("SELECT COALESCE(SUM(tokens), 0) FROM adfrs_spend WHERE scope = 'agent'", [], |r| r.get(0))
            .unwrap_or(0)
    };
    s.spend_defer(&["agent", "loop:x"], 0.25, 100);
    assert_eq!(s.spent("agent").unwrap().tokens_day, 100, "counted before it is written");
    assert_eq!(on_disk(&path), 0, "no commit of its own");
    // A refused write changes nothing; the next write takes it.
    assert!(s.meta_set(adf::store::Caller::AGENT, "adf_x", "1", None).is_err());
    s.meta_set(adf::store::Caller::Owner, "note", "1", None).unwrap();
    assert_eq!(on_disk(&path), 100, "went in with the next write");
    assert_eq!(s.spent("agent").unwrap().tokens_day, 100, "not counted twice");
    s.spend_defer(&["agent"], 0.0, 7);
    let remembered = s.spent("agent").unwrap();
    assert_eq!(remembered.tokens_total, 107, "the remembered figure follows each spend");
    s.close().unwrap();
    assert_eq!(on_disk(&path), 107, "a close writes what waits");
    assert_eq!(Store::open(&path).unwrap().spent("agent").unwrap(), remembered, "read back, the same");
}
