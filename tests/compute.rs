//! Host commands (issue 22): gated twice (the agent's `compute.host_access`
//! and the install's `compute.host` in settings.json, with its approved
//! programs), run in the agent's working folder with no secrets in their
//! environment, the process group killed on timeout (124), each output
//! stream kept to 512 KiB; `fs_transfer` between the agent's files and the
//! host workspace; `adf compute` for the owner, bad input changing nothing.

mod common;

use std::sync::Arc;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::executor::Executor;
use adf::store::{Caller, NewAgent, Store};
use common::*;
use serde_json::{Value, json};

fn agent(dir: &std::path::Path, name: &str, host_access: bool) -> Store {
    let (mut s, _) = Store::create(
        dir.join(format!("{name}.adf")),
        &NewAgent { name: Some(name), provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    let mut cfg = s.config_value().unwrap();
    enable_tools_where(&mut cfg, |n| matches!(n, "compute_exec" | "fs_transfer"));
    cfg["compute"]["host_access"] = json!(host_access);
    s.config_replace(cfg).unwrap();
    s
}

/// Run `calls` as one model step; each result, parsed when it is JSON.
async fn calls(store: Store, calls: Vec<(&str, Value)>) -> (Vec<(Value, bool)>, Executor, Arc<Approve>) {
    let replies =
        vec![Reply::Tools(calls.iter().map(|(n, v)| (n.to_string(), v.clone())).collect()), Reply::Text("done".into())];
    let owner = Arc::new(Approve::default());
    let mut ex = Executor::new(store, Arc::new(Scripted::new(replies)), Bus::new(), owner.clone()).unwrap();
    ex.chat("go").await.unwrap();
    let out = tool_results(&ex.store)
        .into_iter()
        .map(|(t, err)| (serde_json::from_str(&t).unwrap_or(Value::String(t)), err))
        .collect();
    (out, ex, owner)
}

/// The install's compute settings; `engine` "none" keeps containers out
/// of a host test on a machine that has an engine.
fn settings(home: &std::path::Path, host: Value, engine: &str) {
    let dir = home.join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let v = json!({"accounts": [], "compute": {"host": host, "engine": engine}});
    std::fs::write(dir.join("settings.json"), v.to_string()).unwrap();
}

/// Is a process with this exact command line alive?
fn running(cmdline: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " ").trim() == cmdline)
            .unwrap_or(false)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_commands_are_gated_twice_and_run_within_their_limits() {
    let dir = tmp();
    let d = dir.path();
    let home = d.join(".adf-home");
    unsafe {
        std::env::set_var("ADF_HOME", &home);
        std::env::set_var("ADF_TEST_SECRET_TOKEN", "s3cret-value");
    }
    settings(&home, json!({"enabled": true, "programs": ["printf", "cat", "sleep", "seq", "ls"]}), "none");
    let mut s = agent(d, "worker", true);
    s.file_write(Caller::Owner, "notes/plan.md", b"# plan", &Default::default()).unwrap();
    let (r, ex, owner) = calls(
        s,
        vec![
            ("compute_exec", json!({"command": "printf 'hello host' > a.txt && cat a.txt && echo && pwd"})),
            ("compute_exec", json!({"command": "ls && rm a.txt"})),
            ("compute_exec", json!({"command": "echo $(id)"})),
            ("compute_exec", json!({"command": "sleep 31.7 & sleep 31.7", "timeout_ms": 1000})),
            ("compute_exec", json!({"command": "seq 1 300000"})),
            ("compute_exec", json!({"command": "export -p"})),
            ("compute_exec", json!({"command": "ls", "target": "isolated"})),
            ("fs_transfer", json!({"from": "vfs", "to": "host", "path": "notes"})),
            ("compute_exec", json!({"command": "cat notes/plan.md && printf made > made.txt"})),
            ("fs_transfer", json!({"from": "host", "to": "vfs", "path": "made.txt", "save_as": "out/made.txt"})),
            ("fs_transfer", json!({"from": "host", "to": "vfs", "path": "../../etc/passwd"})),
        ],
    )
    .await;
    let id = ex.agent_id().to_string();
    let ws = adf::runtime::compute::workspace(&id);
    // 1: ran in the agent's own folder.
    assert_eq!(r[0].0["exit_code"], 0, "{:?}", r[0]);
    assert_eq!(r[0].0["stdout"].as_str().unwrap().lines().collect::<Vec<_>>(), ["hello host", ws.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "hello host");
    // 2, 3: a program not approved, and one the grammar cannot pin down.
    assert!(r[1].1 && r[1].0.as_str().unwrap().contains("`rm` is not an approved host program"), "{:?}", r[1]);
    assert!(ws.join("a.txt").exists(), "nothing ran of a refused command");
    assert!(r[2].1 && r[2].0.as_str().unwrap().contains("command substitution"), "{:?}", r[2]);
    // 4: the timeout kills the whole group (the background sleep too).
    assert_eq!((r[3].0["exit_code"].as_i64(), r[3].0["timed_out"].as_bool()), (Some(124), Some(true)), "{:?}", r[3]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!running("sleep 31.7"), "a process of the command outlived its timeout");
    // 5: the model gets a preview of a large output (tools.md §9.1); the
    // command's own result keeps 512 KiB of each stream.
    assert!(r[4].0.as_str().is_some_and(|t| t.starts_with("[TRUNCATED]")), "{:?}", r[4].0);
    let big =
        adf::runtime::compute::run_host(&id, "seq 1 300000; seq 1 300000 >&2", std::time::Duration::from_secs(20))
            .await
            .unwrap();
    assert_eq!(big["stdout"].as_str().map(str::len), Some(512 << 10));
    assert_eq!(big["stderr"].as_str().map(str::len), Some(512 << 10));
    assert_eq!((big["stdout_truncated"].as_bool(), big["exit_code"].as_i64()), (Some(true), Some(0)));
    // 6: no secrets in the environment.
    let env = r[5].0["stdout"].as_str().unwrap();
    assert!(env.contains("ADF_AGENT_ID") && !env.contains("s3cret-value") && !env.contains("ADF_HOME"), "{env}");
    // 7: containers fail closed.
    assert!(r[6].1 && r[6].0.as_str().unwrap().contains("Target 'isolated' is not available"), "{:?}", r[6]);
    // 8-10: transfers both ways; a path out of the workspace is refused.
    assert_eq!(r[7].0["files"], 1, "{:?}", r[7]);
    assert_eq!(r[8].0["stdout"], "# plan");
    assert_eq!(r[9].0["dest_path"], "out/made.txt", "{:?}", r[9]);
    assert_eq!(ex.store.file_read_text("out/made.txt").unwrap(), "made");
    assert!(r[10].1 && r[10].0.as_str().unwrap().contains("must stay inside the workspace"), "{:?}", r[10]);
    // compute_exec asked the owner (restricted by default); fs_transfer not.
    assert!(owner.0.lock().unwrap().iter().all(|t| t == "compute_exec"));
    assert!(!owner.0.lock().unwrap().is_empty());
    // Each command is in the agent's log with its exit code.
    let q = adf::store::logs::LogQuery { origin: Some("compute"), limit: 100, ..Default::default() };
    let logs: Vec<String> = ex.store.log_list(&q).unwrap().into_iter().map(|l| l.message).collect();
    assert!(logs.iter().any(|l| l.starts_with("host: exit 0 in")), "{logs:?}");
    assert!(logs.iter().any(|l| l.starts_with("host: exit 124 in")), "{logs:?}");
    ex.store.close().unwrap();

    // Either switch off: refused.
    let s = agent(d, "noaccess", false);
    let (r, ex, _) = calls(s, vec![("compute_exec", json!({"command": "ls", "target": "host"}))]).await;
    assert!(r[0].1 && r[0].0.as_str().unwrap().contains("compute.host_access is off"), "{:?}", r[0]);
    ex.store.close().unwrap();
    settings(&home, json!({"enabled": false, "programs": ["ls"]}), "none");
    let s = agent(d, "switchedoff", true);
    let (r, ex, _) = calls(s, vec![("compute_exec", json!({"command": "ls"}))]).await;
    assert!(r[0].1 && r[0].0.as_str().unwrap().contains("adf compute host on"), "{:?}", r[0]);
    ex.store.close().unwrap();

    // No engine: container targets fail closed, never onto the host, even
    // for an agent that has host access.
    settings(&home, json!({"enabled": true, "programs": ["ls"]}), "/nonexistent/podman");
    let s = agent(d, "noengine", true);
    let (r, ex, _) = calls(
        s,
        vec![
            ("compute_exec", json!({"command": "ls", "target": "shared"})),
            ("fs_transfer", json!({"from": "vfs", "to": "isolated", "path": "x"})),
            ("compute_exec", json!({"command": "ls", "target": "py-tools"})),
            ("compute_exec", json!({"command": "printf here"})),
        ],
    )
    .await;
    for (i, want) in [
        (0, "Target 'shared' is not available: no container engine runs here"),
        (1, "Target 'isolated' is not available"),
        (2, "Target 'py-tools' is not available: no such target"),
    ] {
        assert!(r[i].1 && r[i].0.as_str().unwrap().contains(want), "{i}: {:?}", r[i]);
    }
    assert!(r[0].0.as_str().unwrap().contains("/nonexistent/podman"), "the cause is named: {:?}", r[0]);
    assert!(r[0].0.as_str().unwrap().contains("Available: host."), "{:?}", r[0]);
    assert_eq!(r[3].0["target"], "host", "with no engine the least privileged left is the host: {:?}", r[3]);
    ex.store.close().unwrap();
}

#[test]
fn adf_compute_sets_the_install_switch_and_refuses_bad_names() {
    let dir = tmp();
    let d = dir.path();
    let v = serde_json::from_str::<Value>(&ok(&adf(d, &["compute", "--json"], None))).unwrap();
    assert_eq!(v["host"], json!({"enabled": false, "programs": []}));
    ok(&adf(d, &["compute", "host", "on"], None));
    ok(&adf(d, &["compute", "host", "allow", "git", "make", "/opt/x/run"], None));
    ok(&adf(d, &["compute", "host", "deny", "make"], None));
    let v = serde_json::from_str::<Value>(&ok(&adf(d, &["compute", "--json"], None))).unwrap();
    assert_eq!(v["host"], json!({"enabled": true, "programs": ["git", "/opt/x/run"]}));
    let path = v["settings"].as_str().unwrap().to_string();
    let before = std::fs::read(&path).unwrap();
    for bad in [
        ["compute", "host", "allow", "rm -rf"],
        ["compute", "host", "allow", "../sh"],
        ["compute", "host", "allow", "$(id)"],
    ] {
        let o = adf(d, &bad, None);
        assert!(!o.status.success(), "{bad:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("unchanged"), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert_eq!(std::fs::read(&path).unwrap(), before, "bad input changed settings.json");
    ok(&adf(d, &["compute", "host", "off"], None));
    assert_eq!(
        serde_json::from_str::<Value>(&ok(&adf(d, &["compute", "--json"], None))).unwrap()["host"]["enabled"],
        false
    );
}
