//! The MCP client against real servers: the reference servers from the npm
//! registry over stdio (`.ci/mcp.sh` installs them; `ADF_MCP_MODULES`
//! names their node_modules), and processes that fail the ways servers
//! fail (exit at once, speak garbage, never answer).

mod common;

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

/// An MCP tool in a turn: offered from the server's last listing, the
/// first call connects and reconciles (the rest of the server's tools land
/// restricted), and an image it returns is saved and shown to the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm MCP servers: see .ci/mcp.sh and ADF_MCP_MODULES"]
async fn a_turn_calls_an_mcp_tool_and_reconciles_the_rest() {
    use std::sync::Arc;

    use adf::providers::scripted::{Reply, Scripted};
    use adf::runtime::bus::Bus;
    use adf::runtime::executor::{Absent, Executor};
    use adf::store::{Caller, NewAgent, Store};

    let dir = tempfile::tempdir().unwrap();
    let bin = format!("{}/.bin/mcp-server-everything", modules());
    let (mut s, _) = Store::create(
        dir.path().join("a.adf"),
        &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    s.config_set(
        Caller::Owner,
        "mcp",
        json!({"servers": [{"name": "ev", "transport": "stdio", "command": bin, "args": ["stdio"],
            "available_tools": [{"name": "echo", "description": "Echoes back the input",
                                 "input_schema": {"type": "object", "properties": {"message": {"type": "string"}}}}]}]}),
    )
    .unwrap();
    let mut tools = adf::store::defaults::default_tools();
    tools
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "mcp_ev_echo", "enabled": true, "visible": true, "restricted": false}));
    s.config_set(Caller::Owner, "tools", tools).unwrap();
    let provider = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![("mcp_ev_echo".into(), json!({"message": "hi from adf", "_reason": "testing"}))]),
        Reply::Text("done".into()),
    ]));
    let mut ex = Executor::new(s, provider.clone(), Bus::new(), Arc::new(Absent)).unwrap();
    ex.chat("echo something").await.unwrap();
    // The tool was offered to the model with the listed schema.
    let offered = provider.requests();
    assert!(
        offered[0].tools.iter().any(|t| t.name == "mcp_ev_echo" && t.input_schema["properties"]["message"].is_object())
    );
    let rows = ex.store.loop_rows(None).unwrap();
    let result = rows
        .iter()
        .flat_map(|r| r.content.as_array().cloned().unwrap_or_default())
        .find(|b| b["type"] == "tool_result")
        .unwrap();
    assert!(result["content"].as_str().unwrap().contains("hi from adf"), "{result}");
    assert_ne!(result["is_error"], json!(true), "{result}");
    // Reconciled: echo kept its flags and got a hash; the others are new
    // and restricted; the listing is the server's own now.
    let cfg = ex.store.config_value().unwrap();
    let decl = |n: &str| cfg["tools"].as_array().unwrap().iter().find(|d| d["name"] == n).cloned().unwrap();
    assert_eq!(decl("mcp_ev_echo")["restricted"], false);
    assert!(decl("mcp_ev_echo")["mcp_tool_hash"].is_string());
    assert_eq!(decl("mcp_ev_get-tiny-image")["restricted"], true);
    assert_eq!(decl("mcp_ev_get-tiny-image")["mcp_tool_status"], "new");
    assert!(cfg["mcp"]["servers"][0]["available_tools"].as_array().unwrap().len() > 5);
}

fn adf_in(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(args)
        .current_dir(dir)
        .env("ADF_HOME", dir.join(".adf-home"))
        .output()
        .unwrap()
}

/// `adf mcp add` connects first: a server that does not start changes
/// nothing and says why (its stderr included); tool flags and removal of
/// what is not there are clear errors.
#[test]
fn adf_mcp_refuses_what_it_cannot_do_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    assert!(adf_in(dir.path(), &["new", "a.adf"]).status.success());
    let before = std::fs::read(dir.path().join("a.adf")).unwrap();
    let out = adf_in(dir.path(), &["mcp", "add", "a.adf", "bad", "--", "sh", "-c", "echo no token given >&2; exit 2"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no token given") && err.contains("nothing was saved"), "{err}");
    for (args, says) in [
        (vec!["mcp", "add", "a.adf", "Bad Name", "--", "x"], "server name"),
        (vec!["mcp", "add", "a.adf", "x"], "give a command"),
        (vec!["mcp", "add", "a.adf", "x", "--url", "ftp://h/mcp"], "not http"),
        (vec!["mcp", "tool", "a.adf", "ev", "echo", "--allow"], "no MCP tool"),
        (vec!["mcp", "tool", "a.adf", "ev", "echo"], "say what to change"),
        (vec!["mcp", "rm", "a.adf", "ev"], "no MCP server"),
        (vec!["mcp", "add", "a.adf", "x", "--oauth", "--", "srv"], "--oauth is for an HTTP server"),
        (vec!["mcp", "login", "a.adf", "nope"], "no HTTP MCP server"),
        (vec!["mcp", "restart", "a.adf", "nope"], "no MCP server"),
    ] {
        let out = adf_in(dir.path(), &args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(std::fs::read(dir.path().join("a.adf")).unwrap(), before, "the file is unchanged");
    let ls = adf_in(dir.path(), &["mcp", "ls", "a.adf", "--json"]);
    assert_eq!(String::from_utf8_lossy(&ls.stdout).trim(), "[]");
}

/// `adf mcp add` against the reference server: its tools are declared,
/// each restricted and marked new; `tool --allow` reviews one; `rm` takes
/// the server and its tools away.
#[test]
#[ignore = "needs the npm MCP servers: see .ci/mcp.sh and ADF_MCP_MODULES"]
fn adf_mcp_add_ls_tool_rm() {
    let dir = tempfile::tempdir().unwrap();
    let bin = format!("{}/.bin/mcp-server-everything", modules());
    assert!(adf_in(dir.path(), &["new", "a.adf"]).status.success());
    let out = adf_in(dir.path(), &["mcp", "add", "a.adf", "ev", "--", &bin, "stdio"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("each restricted"));
    let ls: Value = serde_json::from_slice(&adf_in(dir.path(), &["mcp", "ls", "a.adf", "--json"]).stdout).unwrap();
    let tools = ls[0]["tools"].as_array().unwrap();
    assert!(tools.len() > 5);
    assert!(tools.iter().all(|t| t["restricted"] == true && t["status"] == "new"), "{ls}");
    let out = adf_in(dir.path(), &["mcp", "tool", "a.adf", "ev", "echo", "--allow"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "mcp_ev_echo: enabled, shown, allowed");
    let ls: Value = serde_json::from_slice(&adf_in(dir.path(), &["mcp", "ls", "a.adf", "--json"]).stdout).unwrap();
    let echo = ls[0]["tools"].as_array().unwrap().iter().find(|t| t["name"] == "echo").unwrap().clone();
    assert_eq!((echo["restricted"].clone(), echo["status"].clone()), (json!(false), Value::Null));
    let out = adf_in(dir.path(), &["mcp", "rm", "a.adf", "ev"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("removed ev, its"));
    let cfg = adf_in(dir.path(), &["config", "get", "a.adf", "--json"]);
    assert!(!String::from_utf8_lossy(&cfg.stdout).contains("mcp_ev_"));
}

/// A stdio server's whole process tree goes when its connection does
/// (closed, or dropped with the agent): a grandchild it started is killed
/// with it, never left running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_process_tree_is_killed_with_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let alive = |pid: &str| std::path::Path::new(&format!("/proc/{pid}")).exists();
    for how in ["close", "drop"] {
        let pidfile = dir.path().join(format!("grandchild-{how}"));
        let script = format!(
            "sleep 300 & echo $! > '{}'; exec '{}' mcp serve --echo",
            pidfile.display(),
            env!("CARGO_BIN_EXE_adf")
        );
        let spec = stdio("tree", "sh", &["-c", &script]);
        let conn = connect(&spec, &dir.path().join(how)).await.unwrap_or_else(|e| panic!("{e}"));
        let (out, err) = conn.call("echo", json!({"text": "up"})).await;
        assert_eq!((out.as_str(), err), ("up", false));
        let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_string();
        assert!(alive(&pid), "the grandchild runs while the server does");
        match how {
            "close" => conn.close().await,
            _ => drop(conn),
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(&pid) && Instant::now() < deadline {
            // A killed process lingers as a zombie until reaped: count that as gone.
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if state.split_whitespace().nth(2) == Some("Z") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            state.is_empty() || state.split_whitespace().nth(2) == Some("Z"),
            "{how}: grandchild {pid} still runs: {state}"
        );
    }
}

/// The agent's `mcp_install`, `mcp_restart` and `mcp_uninstall` each ask
/// the owner first (whatever their declarations say); approved, they
/// install a server (its tools restricted), reconnect it and remove it;
/// denied, nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_mcp_tools_ask_the_owner_first() {
    use std::sync::{Arc, Mutex};

    use adf::providers::scripted::{Reply, Scripted};
    use adf::runtime::bus::Bus;
    use adf::runtime::executor::{ApprovalRequest, Decision, Executor, Owner};
    use adf::store::{Caller, NewAgent, Store};
    use futures_util::future::BoxFuture;

    struct Answers(bool, Mutex<Vec<String>>);
    impl Owner for Answers {
        fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, Decision> {
            self.1.lock().unwrap().push(req.tool.clone());
            let d = if self.0 { Decision::Approve { always: false } } else { Decision::Deny { feedback: None } };
            Box::pin(async move { d })
        }
        fn answer<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Option<String>> {
            Box::pin(async { None })
        }
    }

    let install = json!({"type": "custom", "package": env!("CARGO_BIN_EXE_adf"), "args": ["mcp", "serve", "--echo"],
                         "name": "echo", "env": {"ECHO_KEY": "k-123"}});
    for approve in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = Store::create(
            dir.path().join("a.adf"),
            &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() },
        )
        .unwrap();
        let mut tools = adf::store::defaults::default_tools();
        for t in tools.as_array_mut().unwrap() {
            if t["name"].as_str().is_some_and(|n| n.starts_with("mcp_")) {
                t["enabled"] = json!(true);
                t["visible"] = json!(true);
            }
        }
        s.config_set(Caller::Owner, "tools", tools).unwrap();
        let provider = Arc::new(Scripted::new(vec![
            Reply::Tools(vec![("mcp_install".into(), install.clone())]),
            Reply::Tools(vec![("mcp_restart".into(), json!({"name": "echo"}))]),
            Reply::Tools(vec![("mcp_uninstall".into(), json!({"name": "echo"}))]),
            Reply::Text("done".into()),
        ]));
        let owner = Arc::new(Answers(approve, Mutex::new(Vec::new())));
        let mut ex = Executor::new(s, provider, Bus::new(), owner.clone()).unwrap();
        ex.chat("install the echo server").await.unwrap();
        assert_eq!(*owner.1.lock().unwrap(), ["mcp_install", "mcp_restart", "mcp_uninstall"], "each asked");
        let r = common::tool_results(&ex.store);
        let cfg = ex.store.config_value().unwrap();
        if !approve {
            assert!(r.iter().all(|(t, err)| *err && t.contains("rejected")), "{r:?}");
            assert!(cfg["mcp"]["servers"].as_array().is_none_or(|a| a.is_empty()), "{cfg}");
            continue;
        }
        let installed: Value = serde_json::from_str(&r[0].0).unwrap();
        assert_eq!((installed["success"].clone(), installed["tools_discovered"].clone()), (json!(true), json!(1)));
        assert_eq!(installed["env_keys"], json!(["ECHO_KEY"]));
        let restarted: Value = serde_json::from_str(&r[1].0).unwrap();
        assert_eq!(restarted["success"], true, "{restarted}");
        let removed: Value = serde_json::from_str(&r[2].0).unwrap();
        assert_eq!(removed["success"], true, "{removed}");
        assert!(cfg["mcp"]["servers"].as_array().unwrap().is_empty());
        assert!(!cfg.to_string().contains("mcp_echo_echo"), "its tools went with it");
        assert!(ex.store.secrets().unwrap().iter().all(|s| !s.purpose.starts_with("mcp:echo:")), "and its credentials");
    }
}
