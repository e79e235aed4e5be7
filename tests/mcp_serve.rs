//! `adf mcp serve` driven by an MCP client (adf's own, on the official
//! SDK) over stdio, exactly as Claude Code or Codex would start it: it
//! lists the fleet, messages an agent and returns its reply, reads its
//! files, and settles an approval the agent waits on. No daemon runs, so
//! the server runs the fleet's daemon inside itself.

mod common;

use std::time::Duration;

use adf::mcp::client::{ServerSpec, connect};
use common::fake_provider::*;
use common::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_lists_messages_reads_and_approves() {
    let home = tmp();
    let fleet = home.path().join("data/agents");
    std::fs::create_dir_all(&fleet).unwrap();
    ok(&adf_home(home.path(), &fleet, &["new", "a.adf", "--name", "scout", "--provider", "anthropic", "--model", "m"]));
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_text(&["Hello from ", "scout."], 10, 3)),
        Scripted::sse(anthropic_tool("toolu_1", "sys_update_config", r#"{"path":"description","value":"x"}"#)),
        Scripted::sse(anthropic_text(&["Description set."], 10, 3)),
        // scout, woken by the client's message, answers it as a peer.
        Scripted::sse(anthropic_tool(
            "toolu_2",
            "msg_send",
            r#"{"recipient":"mcp-client","content":"pong from scout"}"#,
        )),
        Scripted::sse(anthropic_text(&["Replied."], 10, 3)),
    ])
    .await;
    let spec = ServerSpec::from_config(&json!({
        "name": "adf",
        "command": env!("CARGO_BIN_EXE_adf"),
        "args": ["mcp", "serve", fleet.to_str().unwrap()],
        "env": {"ADF_HOME": home.path().to_str().unwrap(), "ANTHROPIC_API_KEY": "sk-test",
                "ANTHROPIC_BASE_URL": fake.base_url},
        "tool_call_timeout_ms": 60000
    }))
    .unwrap();
    let conn = connect(&spec, &home.path().join("scratch")).await.unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = conn.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "list_agents",
            "agent_status",
            "send_message",
            "message_agent",
            "inbox",
            "whoami",
            "list_files",
            "read_file",
            "pending_approvals",
            "answer_approval"
        ]
    );

    let (listed, err) = conn.call("list_agents", json!({})).await;
    assert!(!err, "{listed}");
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let mut names: Vec<&str> = listed.as_array().unwrap().iter().filter_map(|a| a["name"].as_str()).collect();
    names.sort();
    assert_eq!(names, ["mcp-client", "scout"], "the client's own identity is one of the fleet: {listed}");

    let (reply, err) = conn.call("send_message", json!({"agent": "scout", "text": "hi"})).await;
    assert_eq!((reply.as_str(), err), ("Hello from scout.", false));

    let (files, _) = conn.call("list_files", json!({"agent": "scout"})).await;
    assert!(files.contains("mind.md"), "{files}");
    let (mind, err) = conn.call("read_file", json!({"agent": "scout", "path": "mind.md"})).await;
    assert!(!err, "{mind}");
    let (missing, err) = conn.call("read_file", json!({"agent": "scout", "path": "nope.md"})).await;
    assert!(err, "a missing file is an error: {missing}");

    // A restricted tool: the turn waits, the client settles it.
    let (waiting, err) = conn.call("send_message", json!({"agent": "scout", "text": "set your description"})).await;
    assert!(!err && waiting.contains("waits for the owner: task task_"), "{waiting}");
    let (pending, _) = conn.call("pending_approvals", json!({})).await;
    let pending: Value = serde_json::from_str(&pending).unwrap();
    let task = pending[0]["task_id"].as_str().unwrap_or_else(|| panic!("{pending}")).to_string();
    assert_eq!(pending[0]["tool"], "sys_update_config");
    let (answer, err) = conn.call("answer_approval", json!({"agent": "scout", "task_id": task, "approve": true})).await;
    assert!(!err, "{answer}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _) = conn.call("agent_status", json!({"agent": "scout"})).await;
        let (p, _) = conn.call("pending_approvals", json!({"agent": "scout"})).await;
        if p.trim() == "[]" && !status.contains("\"active\"") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the approval did not settle: {p} {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (bad, err) = conn.call("send_message", json!({"agent": "nobody", "text": "hi"})).await;
    assert!(err, "{bad}");

    // The client's own identity: an agent of the fleet with a DID and an
    // inbox, which agents answer as any peer.
    let (me, err) = conn.call("whoami", json!({})).await;
    assert!(!err && me.contains("\"mcp-client\"") && me.contains("did:key:"), "{me}");
    let (reply, err) =
        conn.call("message_agent", json!({"agent": "scout", "text": "ping", "timeout_seconds": 30})).await;
    assert!(!err && reply.ends_with("pong from scout"), "{reply}");
    let (inbox, _) = conn.call("inbox", json!({})).await;
    assert!(inbox.contains("pong from scout"), "{inbox}");
    conn.close().await;
    assert!(fleet.join("mcp-client.adf").is_file(), "the identity is a file of the fleet");
}

/// `--http PORT`: Streamable HTTP on loopback behind the daemon's token;
/// without the token the client is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_streamable_http_behind_the_token() {
    let home = tmp();
    let fleet = home.path().join("data/agents");
    std::fs::create_dir_all(&fleet).unwrap();
    ok(&adf_home(home.path(), &fleet, &["new", "a.adf", "--name", "scout"]));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(["mcp", "serve", fleet.to_str().unwrap(), "--http", &port.to_string()])
        .env("ADF_HOME", home.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "adf mcp serve --http did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let token = std::fs::read_to_string(home.path().join("config/daemon-token")).unwrap();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let spec = |auth: &str| {
        ServerSpec::from_config(&json!({"name": "adf", "transport": "http", "url": url,
                                        "headers": {"Authorization": auth}}))
        .unwrap()
    };
    let refused = connect(&spec("Bearer wrong"), &home.path().join("s1")).await.err().expect("refused");
    assert!(refused.reason.contains("requires authorization (HTTP 401)"), "{refused}");
    let conn = connect(&spec(&format!("Bearer {}", token.trim())), &home.path().join("s2")).await.unwrap();
    assert_eq!(conn.tools.len(), 10);
    let (listed, err) = conn.call("list_agents", json!({})).await;
    assert!(!err && listed.contains("scout"), "{listed}");
    conn.close().await;
    let _ = child.kill();
    let _ = child.wait();
}
