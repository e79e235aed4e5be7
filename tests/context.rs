//! The context gauge (issue 18): `adf context FILE [--loop NAME]` against
//! the model's real window (adf's table, extended in settings.json), with
//! what takes the space: the prompt's text, each templated file, the skills
//! section, each tool schema and the loop's history.

mod common;

use common::*;
use serde_json::{Value, json};

fn part<'a>(g: &'a Value, kind: &str, name: &str) -> Option<&'a Value> {
    g["parts"].as_array().unwrap().iter().find(|p| p["kind"] == kind && p["name"] == name)
}

#[test]
fn the_gauge_measures_a_loop_against_its_model_window() {
    let dir = tmp();
    let d = dir.path();
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "claude-sonnet-4-5"], None));
    ok(&adf(d, &["files", "put", "a.adf", "mind.md", "-"], Some("x".repeat(8000).as_bytes())));
    let g = json(&adf(d, &["context", "a.adf", "--json"], None));
    assert_eq!(
        (g["loop"].as_str(), g["window"].as_u64(), g["window_source"].as_str()),
        (Some("main"), Some(200_000), Some("table"))
    );
    let mind = part(&g, "memory", "mind.md").expect("mind.md is templated in");
    assert!(mind["tokens"].as_u64().unwrap() >= 2000, "{mind}");
    assert!(part(&g, "tool", "fs_read").is_some());
    assert!(part(&g, "system", "system prompt text").unwrap()["tokens"].as_u64().unwrap() > 50);
    let sum: u64 = g["parts"].as_array().unwrap().iter().map(|p| p["tokens"].as_u64().unwrap()).sum();
    assert_eq!(g["estimated"].as_u64().unwrap(), sum);
    let pct = g["percent"].as_f64().unwrap();
    // A self-hosted model nothing knows: tokens, not a percentage of a guess.
    assert!((pct - sum as f64 * 100.0 / 200_000.0).abs() < 0.1, "{pct}");
    assert!(g["reported_last_call"].is_null(), "no call yet");
    let sizes: Vec<u64> = g["parts"].as_array().unwrap().iter().map(|p| p["tokens"].as_u64().unwrap()).collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "largest first: {sizes:?}");

    // The owner's settings win over the table.
    let cfg = d.join(".adf-home/config");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(cfg.join("settings.json"), json!({"model_windows": {"claude-sonnet-4": 50000}}).to_string())
        .unwrap();
    let g = json(&adf(d, &["context", "a.adf", "--json"], None));
    assert_eq!((g["window"].as_u64(), g["window_source"].as_str()), (Some(50_000), Some("settings")));

    // A side loop: its tools, its model, its goal in the prompt.
    ok(&adf(
        d,
        &["loops", "new", "a.adf", "research", "--tools", "fs_read", "--model", "gpt-4o", "--goal", &"g".repeat(4000)],
        None,
    ));
    let s = json(&adf(d, &["context", "a.adf", "--loop", "research", "--json"], None));
    assert_eq!(
        (s["loop"].as_str(), s["model"].as_str(), s["window"].as_u64()),
        (Some("research"), Some("gpt-4o"), Some(128_000))
    );
    let tools: Vec<&str> = s["parts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "tool")
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["fs_read"]);
    let own = |g: &Value| part(g, "system", "system prompt text").unwrap()["tokens"].as_u64().unwrap();
    assert!(own(&s) >= own(&g) + 900, "the loop's goal is in its prompt");
    // Text for people: the header line and the breakdown.
    let text = ok(&adf(d, &["context", "a.adf"], None));
    assert!(
        text.contains("main · claude-sonnet-4-5")
            && text.contains("window from settings.json")
            && text.contains("KIND"),
        "{text}"
    );
    fails(&adf(d, &["context", "a.adf", "--loop", "nope"], None), &["no loop named \"nope\""]);
    ok(&adf(d, &["new", "b.adf", "--provider", "openai", "--model", "qwen2.5-7b"], None));
    let u = json(&adf(d, &["context", "b.adf", "--json"], None));
    assert!(u["window"].is_null() && u["percent"].is_null(), "{u}");
    assert!(ok(&adf(d, &["context", "b.adf"], None)).contains("window unknown"));
}
