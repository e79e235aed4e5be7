//! The MCP client against real servers: the reference servers from the npm
//! registry over stdio (`.ci/mcp.sh` installs them; `ADF_MCP_MODULES`
//! names their node_modules), and processes that fail the ways servers
//! fail (exit at once, speak garbage, never answer).

use std::time::{Duration, Instant};

use adf::mcp::client::{ServerSpec, Transport, connect};
use adf::mcp::reconcile::reconcile;
use serde_json::{Value, json};

fn modules() -> String {
    std::env::var("ADF_MCP_MODULES").expect("ADF_MCP_MODULES (run .ci/mcp.sh)")
}

fn stdio(name: &str, command: &str, args: &[&str]) -> ServerSpec {
    ServerSpec::from_config(&json!({"name": name, "command": command, "args": args})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm MCP servers: see .ci/mcp.sh and ADF_MCP_MODULES"]
async fn server_everything_lists_calls_and_reconciles() {
    let dir = tempfile::tempdir().unwrap();
    let bin = format!("{}/.bin/mcp-server-everything", modules());
    // A secret of adf's own environment must not reach the server.
    // SAFETY: set before any server is spawned; no other thread reads it.
    unsafe { std::env::set_var("ANTHROPIC_API_KEY", "sk-must-not-leak") };
    let mut spec = stdio("ev", &bin, &["stdio"]);
    spec.env.push(("EV_MARK".into(), "given".into()));
    let c = connect(&spec, &dir.path().join("ev")).await.unwrap();
    let names: Vec<&str> = c.tools.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"echo"), "{names:?}");
    let t = Instant::now();
    let (text, err) = c.call("echo", json!({"message": "hello mcp"})).await;
    assert!(!err && text.contains("hello mcp"), "{text}");
    eprintln!("echo round trip {:?}", t.elapsed());
    // Reconcile: every tool lands enabled, visible and restricted.
    let mut cfg = json!({"tools": [], "mcp": {"servers": [{"name": "ev", "transport": "stdio", "command": bin}]}});
    let o = reconcile(&mut cfg, "ev", &c.tools);
    assert_eq!(o.new.len(), c.tools.len());
    assert!(cfg["tools"].as_array().unwrap().iter().all(|d| d["restricted"] == true && d["enabled"] == true));
    // An image comes back as the reference's JSON with the image data.
    let (text, err) = c.call("get-tiny-image", json!({})).await;
    assert!(!err, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["images"][0]["mimeType"], "image/png", "{v}");
    // Resource links are named in the text.
    let (text, _) = c.call("get-resource-links", json!({"count": 2})).await;
    assert!(text.contains("[Resource link: "), "{text}");
    // The environment the server sees: adf's secret is not there, the
    // server's own variable and a scratch HOME are.
    let (text, _) = c.call("get-env", json!({})).await;
    assert!(!text.contains("sk-must-not-leak"), "{text}");
    assert!(text.contains("EV_MARK") && text.contains(&dir.path().join("ev").display().to_string()), "{text}");
    // A tool error is a result flagged as an error, not a lost connection.
    let (text, err) = c.call("get-sum", json!({"a": "not a number"})).await;
    assert!(err, "{text}");
    assert!(!c.is_closed());
    c.close().await;
}

#[tokio::test]
async fn servers_that_fail_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let exits = stdio("dead", "sh", &["-c", "echo boom: no config >&2; exit 3"]);
    let e = connect(&exits, &dir.path().join("dead")).await.err().expect("an error");
    assert!(e.reason.contains("initialize"), "{e}");
    assert!(e.to_string().contains("boom: no config"), "the stderr tail is in the error: {e}");
    // Garbage on stdout is not JSON-RPC: the connection fails when the
    // server goes, or at the connect bound when it stays.
    let mut garbage = stdio("junk", "sh", &["-c", "echo this is not json-rpc; sleep 30"]);
    garbage.connect_timeout = Duration::from_millis(800);
    let t = Instant::now();
    let e = connect(&garbage, &dir.path().join("junk")).await.err().expect("an error");
    assert!(e.reason.contains("initialize"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "bounded by the connect timeout: {:?}", t.elapsed());
    let mut hangs = stdio("mute", "sleep", &["60"]);
    hangs.connect_timeout = Duration::from_millis(500);
    let e = connect(&hangs, &dir.path().join("mute")).await.err().expect("an error");
    assert!(e.reason.contains("no answer to initialize"), "{e}");
    let missing = stdio("none", "/nonexistent/mcp-server", &[]);
    let e = connect(&missing, &dir.path().join("none")).await.err().expect("an error");
    assert!(e.reason.contains("cannot start"), "{e}");
    assert!(matches!(missing.transport, Transport::Stdio { .. }));
}
