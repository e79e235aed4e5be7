//! The app-wide usage ledger and the fleet budget (issue 19): every call
//! any agent makes (turns, compactions) lands in one ledger outside the
//! files; `adf usage --by … --since …` reads it; `budget` in settings.json
//! stops a call that would cross it, whichever agent makes it; a corrupt
//! ledger is moved aside, never deleted.

mod common;

use std::sync::Arc;

use adf::ledger::{By, Ledger};
use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::budget::Budget;
use adf::runtime::bus::Bus;
use adf::runtime::executor::{Absent, Executor, TurnEnd};
use adf::store::{NewAgent, Store};
use common::fake_provider::*;
use common::*;
use serde_json::{Value, json};

fn agent(dir: &std::path::Path, name: &str) -> Store {
    let (mut s, _) = Store::create(
        dir.join(format!("{name}.adf")),
        &NewAgent { name: Some(name), provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    let mut cfg = s.config_value().unwrap();
    cfg["model"]["max_tokens"] = json!(100);
    s.config_replace(cfg).unwrap();
    s
}

fn executor(s: Store, ledger: &Arc<Ledger>, provider: &Arc<Scripted>) -> Executor {
    let mut ex = Executor::new(s, provider.clone(), Bus::new(), Arc::new(Absent)).unwrap();
    ex.set_ledger(Some(ledger.clone()));
    ex
}

#[tokio::test]
async fn the_fleet_budget_stops_a_call_whichever_agent_makes_it() {
    let dir = tmp();
    let ledger = Arc::new(Ledger::new(dir.path().join("usage.db"), None));
    let budget = |n| Some(Budget { tokens_day: Some(n), ..Default::default() });
    ledger.set_settings(Default::default(), budget(1_000_000));
    let provider = Arc::new(Scripted::new([]).with_fallback(|_| Reply::Text("ok".into())));
    let mut a = executor(agent(dir.path(), "a"), &ledger, &provider);
    let mut b = executor(agent(dir.path(), "b"), &ledger, &provider);
    assert!(matches!(a.chat("one").await.unwrap(), TurnEnd::Completed { .. }));
    assert_eq!(ledger.fleet_spent().tokens_day, 120, "the scripted call's 100 + 20, counted at once");
    assert!(matches!(b.chat("two").await.unwrap(), TurnEnd::Completed { .. }));
    assert_eq!(ledger.fleet_spent().tokens_day, 240);
    // 240 spent by the two; any worst case (the prompt plus 100 out)
    // crosses 300, for either agent.
    ledger.set_settings(Default::default(), budget(300));
    let calls = provider.call_count();
    assert!(matches!(a.chat("three").await.unwrap(), TurnEnd::Suspended));
    assert_eq!(provider.call_count(), calls, "the call was never sent");
    let rows = a.store.loop_rows(None).unwrap();
    let last = rows.last().unwrap().content.to_string();
    assert!(last.contains("the fleet's budget (settings.json).tokens_day of 300 reached: 240 spent today"), "{last}");
    assert!(last.contains("adf budget set"), "says how to raise it: {last}");
    // Each agent's own file has only its own spend.
    assert_eq!(a.store.spent("agent").unwrap().tokens_total, 120);
    let days = ledger.report(By::Agent, None).unwrap();
    let names: Vec<_> = days.iter().map(|r| (r.name.clone().unwrap_or_default(), r.calls)).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().all(|(_, calls)| *calls == 1), "{names:?}");
}

#[tokio::test]
async fn a_compaction_call_is_in_the_ledger_and_in_the_file_spend_after_its_rows_are_gone() {
    let dir = tmp();
    let ledger = Arc::new(Ledger::new(dir.path().join("usage.db"), None));
    let provider = Arc::new(Scripted::new([]).with_fallback(|_| Reply::Text("a summary or a reply".into())));
    let mut ex = executor(agent(dir.path(), "a"), &ledger, &provider);
    for t in ["one", "two", "three"] {
        assert!(matches!(ex.chat(t).await.unwrap(), TurnEnd::Completed { .. }));
    }
    ex.owner_compact(None).await.unwrap();
    let path = ex.store.path().to_path_buf();
    let spent = ex.store.spent("agent").unwrap();
    assert_eq!(spent.tokens_total, 4 * 120, "three turns and the summary call");
    ledger.flush();
    let conn = rusqlite::Connection::open(ledger.path()).unwrap();
    let sources: Vec<(String, i64)> = conn
        .prepare("SELECT call_source, count(*) FROM calls GROUP BY call_source ORDER BY call_source")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(sources, [("compaction".to_string(), 1), ("turn".to_string(), 3)]);
    assert_eq!(ledger.report(By::Day, None).unwrap()[0].calls, 4);
    ex.store_into().close().unwrap();
    // `adf usage FILE` says what the loop rows no longer show.
    let u = json(&adf(dir.path(), &["usage", path.to_str().unwrap(), "--json"], None));
    assert_eq!(u["recorded"]["tokens_total"], 480);
    let in_rows: u64 = u["models"]
        .as_object()
        .unwrap()
        .values()
        .map(|m| m["input_tokens"].as_u64().unwrap() + m["output_tokens"].as_u64().unwrap())
        .sum();
    assert!(in_rows < 480, "compaction removed rows: {u}");
    assert_eq!(u["compacted_tokens"].as_u64().unwrap(), 480 - in_rows);
}

/// An OpenAI-compatible reply whose usage carries the provider's own cost.
fn openai_with_cost(prompt: u64, completion: u64, cost: f64) -> Vec<String> {
    let mut f = openai_text(&["priced"], prompt, completion);
    let n = f.len();
    f[n - 2] = data(&format!(
        r#"{{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{completion},"cost":{cost}}}}}"#
    ));
    f
}

#[tokio::test]
async fn adf_usage_reads_the_ledger_by_day_model_and_agent_with_the_providers_cost_first() {
    let dir = tmp();
    let d = dir.path().to_path_buf();
    ok(&adf(&d, &["new", "a.adf", "--provider", "openai", "--model", "gpt-x"], None));
    let fake = FakeProvider::start(vec![
        fake_provider::Scripted::sse(openai_with_cost(1000, 50, 0.0123)),
        fake_provider::Scripted::sse(openai_text(&["unpriced"], 10, 5)),
    ])
    .await;
    let base = fake.base_url.clone();
    for text in ["hello", "again"] {
        let (d, base) = (d.clone(), base.clone());
        let out =
            tokio::task::spawn_blocking(move || adf_with_providers(&d, &base, &["chat", "a.adf", text])).await.unwrap();
        ok(&out);
    }
    let v = json(&adf(&d, &["usage", "--json"], None));
    assert_eq!(v["by"], "day");
    assert_eq!(v["rows"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["total"]["calls"], 2);
    assert_eq!(v["total"]["input_tokens"], 1010);
    assert_eq!(v["total"]["cost_usd"], 0.0123, "the provider's figure, no price list needed");
    assert_eq!(v["total"]["unpriced_calls"], 1);
    let v = json(&adf(&d, &["usage", "--by", "model", "--since", "today", "--json"], None));
    assert_eq!(v["rows"][0]["key"], "gpt-x");
    let v = json(&adf(&d, &["usage", "--by", "agent", "--json"], None));
    assert_eq!(v["rows"][0]["name"], "a");
    let text = ok(&adf(&d, &["usage", "--by", "provider"], None));
    assert!(text.contains("PROVIDER") && text.contains("TOTAL") && text.contains("$0.0123"), "{text}");
    assert!(text.contains("1 call(s) had no price"), "{text}");
    let future = ok(&adf(&d, &["usage", "--since", "2999-01-01"], None));
    assert!(future.contains("no model calls recorded yet"), "{future}");
    fails(&adf(&d, &["usage", "--since", "last tuesday"], None), &["--since \"last tuesday\" is not a day"]);
    let out = adf(&d, &["usage", "--by", "planet"], None);
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("planet"));
    // The calls are in the ledger: per-call rows with where the cost came from.
    let c = rusqlite::Connection::open(d.join(".adf-home/data/usage.db")).unwrap();
    let src: Option<String> =
        c.query_row("SELECT cost_source FROM calls WHERE cost_usd IS NOT NULL", [], |r| r.get(0)).unwrap();
    assert_eq!(src.as_deref(), Some("provider"));
}

#[test]
fn adf_budget_sets_checks_and_clears_the_fleet_budget_in_settings() {
    let dir = tmp();
    let d = dir.path();
    let settings = d.join(".adf-home/config/settings.json");
    ok(&adf(d, &["budget", "set", r#"{"usd_day": 5, "tokens_total": 1000000}"#], None));
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&settings).unwrap()).unwrap();
    assert_eq!(s["budget"], json!({"usd_day": 5.0, "tokens_total": 1000000}));
    let before = std::fs::read(&settings).unwrap();
    for (bad, says) in [
        (r#"{"usd_day": -1}"#, "usd_day"),
        (r#"{"usd_day": "two"}"#, "usd_day"),
        (r#"{"dollars": 2}"#, "is not a budget"),
        (r#"{"tokens_day": 1.5}"#, "tokens_day"),
        ("[1]", "not valid"),
        ("{", "is not JSON"),
    ] {
        let out = adf(d, &["budget", "set", bad], None);
        fails(&out, &[says]);
        assert_eq!(std::fs::read(&settings).unwrap(), before, "{bad} changed nothing");
    }
    let text = ok(&adf(d, &["budget"], None));
    assert!(text.contains("usd_day $0.0000 of $5.00") && text.contains("tokens_total 0 of 1000000"), "{text}");
    let v = json(&adf(d, &["usage", "--json"], None));
    assert_eq!(v["fleet"]["budget"]["usd_day"], 5.0);
    ok(&adf(d, &["budget", "clear"], None));
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&settings).unwrap()).unwrap();
    assert!(s.get("budget").is_none());
    assert!(ok(&adf(d, &["budget"], None)).contains("no fleet budget"));
}

#[test]
fn a_corrupt_ledger_is_moved_aside_and_adf_usage_says_so() {
    let dir = tmp();
    let d = dir.path();
    let data = d.join(".adf-home/data");
    std::fs::create_dir_all(&data).unwrap();
    let junk = vec![0x5a_u8; 8192];
    std::fs::write(data.join("usage.db"), &junk).unwrap();
    let out = adf(d, &["usage"], None);
    let text = ok(&out);
    assert!(text.contains("no model calls recorded yet"), "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("was corrupt") && err.contains("moved aside"), "{err}");
    let aside: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("usage.db.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1);
    assert_eq!(std::fs::read(aside[0].path()).unwrap(), junk, "kept as it was");
}
