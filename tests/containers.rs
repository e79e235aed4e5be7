//! Containers (issue 22) against the real engine: Podman with the image
//! `adf compute image build` made from Debian packages. `.ci/run` installs
//! Podman, builds the image and runs these (`--ignored`). A machine that
//! cannot run containers says so and skips them; with
//! `ADF_REQUIRE_CONTAINERS=1` (CI) that is a failure instead.
//!
//! Each target is driven end to end from a scripted model turn: the
//! dedicated container (Python, Node, uv and npm installs inside, files
//! both ways, the timeout killing the group, a flood truncated, a fork bomb
//! held, no secrets, stopped with its agent and kept), the shared one (a
//! private workspace and user per agent), an external container (used,
//! never started or stopped), and siblings that cannot reach each other.

mod common;

use std::sync::Arc;
use std::time::Duration;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::compute::{Settings, Target, containers};
use adf::runtime::executor::Executor;
use adf::store::{NewAgent, Store};
use common::*;
use serde_json::{Value, json};

fn agent(dir: &std::path::Path, name: &str, compute: Value) -> Store {
    let (mut s, _) = Store::create(
        dir.join(format!("{name}.adf")),
        &NewAgent { name: Some(name), provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    let mut cfg = s.config_value().unwrap();
    enable_tools_where(&mut cfg, |n| matches!(n, "compute_exec" | "fs_transfer"));
    cfg["compute"] = compute;
    cfg["limits"]["execution_timeout_ms"] = json!(120_000);
    s.config_replace(cfg).unwrap();
    s
}

/// Run `calls` as one model step; each result, parsed when it is JSON.
async fn calls(store: Store, calls: Vec<(&str, Value)>) -> (Vec<(Value, bool)>, Executor) {
    let replies =
        vec![Reply::Tools(calls.iter().map(|(n, v)| (n.to_string(), v.clone())).collect()), Reply::Text("done".into())];
    let mut ex =
        Executor::new(store, Arc::new(Scripted::new(replies)), Bus::new(), Arc::new(Approve::default())).unwrap();
    ex.chat("go").await.unwrap();
    let out = tool_results(&ex.store)
        .into_iter()
        .map(|(t, err)| (serde_json::from_str(&t).unwrap_or(Value::String(t)), err))
        .collect();
    (out, ex)
}

/// The engine's global arguments, as adf found them (`--runtime runc`).
static GLOBAL: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

fn podman(args: &[&str]) -> std::process::Output {
    let mut c = std::process::Command::new("podman");
    c.args(GLOBAL.get().into_iter().flatten()).args(args).output().unwrap()
}

/// Can containers run here? Why not, when they cannot.
async fn usable() -> Result<(), String> {
    let s = Settings::load();
    let e = containers::engine_for(&s).await?;
    let _ = GLOBAL.set(e.global.clone());
    let image = adf::runtime::compute::image::tag();
    if !e.image_exists(&image).await {
        return Err(format!("the image {image} is not built (adf compute image build)"));
    }
    Ok(())
}

async fn skip_unless_usable() -> bool {
    match usable().await {
        Ok(()) => false,
        Err(why) => {
            if std::env::var("ADF_REQUIRE_CONTAINERS").is_ok_and(|v| v == "1") {
                panic!("containers are required here (ADF_REQUIRE_CONTAINERS=1) but: {why}");
            }
            eprintln!("SKIPPED: containers cannot run on this machine: {why}");
            true
        }
    }
}

fn out(v: &(Value, bool)) -> &str {
    assert!(!v.1, "the call failed: {:?}", v.0);
    v.0["stdout"].as_str().unwrap_or_default()
}

fn running(name: &str) -> Option<bool> {
    let o = podman(&["container", "inspect", "--format", "{{.State.Running}}", name]);
    o.status.success().then(|| String::from_utf8_lossy(&o.stdout).trim() == "true")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Podman and the compute image (.ci/run)"]
async fn containers_run_agents_commands_in_their_own_places() {
    let dir = tmp();
    let d = dir.path();
    // The images and containers are the machine's; settings are this test's.
    unsafe {
        std::env::set_var("ADF_HOME", d.join(".adf-home"));
        std::env::set_var("ADF_TEST_SECRET_TOKEN", "s3cret-value");
    }
    if skip_unless_usable().await {
        return;
    }

    // An engine that refuses (no such image): a clear error, nothing made.
    let cfg_dir = d.join(".adf-home/config");
    std::fs::create_dir_all(&cfg_dir).unwrap();
    std::fs::write(
        cfg_dir.join("settings.json"),
        json!({"accounts": [], "compute": {"image": "localhost/adf-none:0"}}).to_string(),
    )
    .unwrap();
    let (r, ex) =
        calls(agent(d, "noimage", json!({"enabled": true})), vec![("compute_exec", json!({"command": "true"}))]).await;
    assert!(r[0].1 && r[0].0.as_str().unwrap().contains("localhost/adf-none:0 is not built"), "{:?}", r[0]);
    assert_eq!(running(&containers::isolated_name(ex.agent_id())), None, "no container was made");
    ex.store.close().unwrap();
    std::fs::remove_file(cfg_dir.join("settings.json")).unwrap();

    // The dedicated container, from a scripted model turn.
    let mut s = agent(d, "worker", json!({"enabled": true}));
    s.file_write(adf::store::Caller::Owner, "data/in.csv", b"a,b\n1,2\n", &Default::default()).unwrap();
    s.file_write(adf::store::Caller::Owner, "data/sub/note.txt", b"hi", &Default::default()).unwrap();
    let (r, ex) = calls(
        s,
        vec![
            ("compute_exec", json!({"command": "id -un; pwd; python3 -c 'print(6*7)'; node -e 'console.log(6*7)'; uv --version | cut -d' ' -f1; env"})),
            ("fs_transfer", json!({"from": "vfs", "to": "isolated", "path": "data"})),
            ("compute_exec", json!({"command": "cat data/in.csv data/sub/note.txt && stat -c %U data/in.csv && python3 -c 'import csv;print(sum(int(r[\"b\"]) for r in csv.DictReader(open(\"data/in.csv\"))))' > data/out.txt"})),
            ("fs_transfer", json!({"from": "isolated", "to": "vfs", "path": "data/out.txt", "save_as": "results/out.txt"})),
            ("fs_transfer", json!({"from": "isolated", "to": "vfs", "path": "../etc/passwd"})),
            ("compute_exec", json!({"command": "sleep 301 & sleep 302", "timeout_ms": 1500})),
            ("compute_exec", json!({"command": "ps -eo comm,args | grep -c '[s]leep 30' || true"})),
            ("compute_exec", json!({"command": "yes adf | head -c 3000000"})),
            ("compute_exec", json!({"command": "f(){ f | f & }; f; sleep 60", "timeout_ms": 4000})),
            ("compute_exec", json!({"command": "echo alive; ps -e --no-headers | wc -l"})),
        ],
    )
    .await;
    let id = ex.agent_id().to_string();
    let lines: Vec<&str> = out(&r[0]).lines().collect();
    assert_eq!(&lines[..5], ["agent", "/workspace", "42", "42", "uv"], "{:?}", r[0]);
    assert!(
        !out(&r[0]).contains("s3cret-value") && out(&r[0]).contains("ADF_AGENT_ID="),
        "no secrets in the environment"
    );
    assert_eq!(r[0].0["target"], "isolated", "least privileged first: {:?}", r[0]);
    assert_eq!(r[1].0["files"], 2, "{:?}", r[1]);
    assert_eq!(out(&r[2]), "a,b\n1,2\nhiagent\n", "{:?}", r[2]);
    assert_eq!(r[3].0["dest_path"], "results/out.txt", "{:?}", r[3]);
    assert_eq!(ex.store.file_read_text("results/out.txt").unwrap(), "2\n");
    assert!(r[4].1 && r[4].0.as_str().unwrap().contains("must stay inside the workspace"), "{:?}", r[4]);
    assert_eq!((r[5].0["exit_code"].as_i64(), r[5].0["timed_out"].as_bool()), (Some(124), Some(true)), "{:?}", r[5]);
    assert_eq!(out(&r[6]).trim(), "0", "the timeout killed the whole group: {:?}", r[6]);
    assert!(r[7].0.as_str().is_some_and(|t| t.starts_with("[TRUNCATED]")), "a flood is cut: {:?}", r[7].0);
    // Its stderr is long (fork retries), so the model got a preview.
    let bomb = r[8].0.as_str().map(str::to_string).unwrap_or_else(|| r[8].0.to_string());
    assert!(
        bomb.contains("\"exit_code\": 124") || bomb.contains("\"exit_code\":124"),
        "the fork bomb ends at its deadline: {bomb:.300}"
    );
    assert!(out(&r[9]).starts_with("alive\n"), "the container answers after the fork bomb: {:?}", r[9]);
    let procs: u32 = out(&r[9]).lines().nth(1).unwrap().trim().parse().unwrap();
    assert!(procs < 20, "the fork bomb left {procs} processes");
    let q = adf::store::logs::LogQuery { origin: Some("compute"), limit: 100, ..Default::default() };
    let logs: Vec<String> = ex.store.log_list(&q).unwrap().into_iter().map(|l| l.message).collect();
    assert!(logs.iter().any(|l| l.starts_with("isolated: exit 124 in")), "{logs:?}");

    // A direct call with the whole output: 512 KiB kept of each stream.
    let settings = Settings::load();
    let big = containers::get()
        .exec(
            &settings,
            &id,
            &Target::Isolated,
            "yes a | head -c 3000000; yes b | head -c 3000000 >&2",
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(big["stdout"].as_str().map(str::len), Some(512 << 10));
    assert_eq!((big["stdout_truncated"].as_bool(), big["stderr_truncated"].as_bool()), (Some(true), Some(true)));

    // Packages install inside: uv into a virtual environment, npm locally.
    let inst = containers::get()
        .exec(
            &settings,
            &id,
            &Target::Isolated,
            "uv venv -q v && uv pip install -q --python v/bin/python six && v/bin/python -c 'import six; print(\"six\", six.__name__)' && npm install --silent --no-audit --no-fund is-number >/dev/null && node -e 'console.log(require(\"is-number\")(5))'",
            Duration::from_secs(120),
        )
        .await
        .unwrap();
    assert_eq!(inst["stdout"], "six six\ntrue\n", "{inst}");

    // Stopped with its agent, and kept for the next start.
    let name = containers::isolated_name(&id);
    assert_eq!(running(&name), Some(true));
    // The compute panel's state of it, from what this process knows.
    let live = adf::runtime::compute::summary::live(&id);
    assert_eq!(live["containers"]["isolated"], json!({"container": name, "state": "running"}), "{live}");
    assert!(live["containers"].get("shared").is_none(), "it used no shared container: {live}");
    containers::get().release(&id);
    containers::get().settle().await;
    assert_eq!(running(&name), Some(false), "the dedicated container stops with its agent");
    let live = adf::runtime::compute::summary::live(&id);
    assert_eq!(live["containers"], json!({}), "a stopped agent's panel lists no container: {live}");
    let again = containers::get()
        .exec(&settings, &id, &Target::Isolated, "cat data/out.txt", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(again["stdout"], "2\n", "its state is kept: {again}");

    // Its processes killed from outside (a machine's sandbox torn down):
    // the engine still records it running. Then a stop of that leaves
    // Podman 4 saying `stopping` for good. Both times it is made again from
    // its own files, and its state is kept.
    let kill_outside = |name: &str| {
        let o = podman(&["container", "inspect", "--format", "{{.State.ConmonPid}} {{.State.Pid}}", name]);
        for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
            let _ = std::process::Command::new("kill").args(["-9", pid]).status();
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    kill_outside(&name);
    let back = containers::get()
        .exec(&settings, &id, &Target::Isolated, "cat data/out.txt", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(back["stdout"], "2\n", "a container killed from outside comes back with its state: {back}");
    kill_outside(&name);
    podman(&["stop", "-t", "1", &name]);
    let back = containers::get()
        .exec(&settings, &id, &Target::Isolated, "cat data/out.txt", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(back["stdout"], "2\n", "a container left stopping comes back with its state: {back}");
    assert_eq!(running(&name), Some(true));
    let images = podman(&["images", "--format", "{{.Repository}}:{{.Tag}}"]);
    let rescue = format!("adf-rescue:{}", name.to_ascii_lowercase());
    assert!(!String::from_utf8_lossy(&images.stdout).contains(&rescue), "no rescue image name is left");
    ex.store.close().unwrap();

    // The shared container: a private workspace and user per agent.
    let (r, a) = calls(
        agent(d, "ann", json!({})),
        vec![
            ("compute_exec", json!({"command": "whoami; pwd; printf secret > mine.txt; ls /workspace >/dev/null 2>&1 && echo listed || echo unlisted"})),
        ],
    )
    .await;
    let ann = a.agent_id().to_string();
    assert_eq!(r[0].0["target"], "shared", "{:?}", r[0]);
    let l: Vec<&str> = out(&r[0]).lines().collect();
    assert_eq!(l[1], format!("/workspace/{ann}"));
    assert_eq!(l[0], containers::shared_user(&ann).1);
    assert_eq!(l[2], "unlisted", "an agent cannot list the others' workspaces");
    let (r, b) = calls(
        agent(d, "bob", json!({})),
        vec![("compute_exec", json!({"command": format!("cat /workspace/{ann}/mine.txt; echo rc=$?")}))],
    )
    .await;
    assert!(
        out(&r[0]).contains("rc=1") && r[0].0["stderr"].as_str().unwrap().contains("Permission denied"),
        "{:?}",
        r[0]
    );
    // Ann stops: her processes in the shared container are killed.
    let sleeper = {
        let s = settings.clone();
        let ann = ann.clone();
        tokio::spawn(async move {
            containers::get().exec(&s, &ann, &Target::Shared, "sleep 120", Duration::from_secs(110)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    let count = |pat: &str| {
        let o = podman(&[
            "exec",
            containers::SHARED,
            "sh",
            "-c",
            &format!("ps -eo args | grep -c '^[{}]{}' || true", &pat[..1], &pat[1..]),
        ]);
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(count("sleep 120"), "1", "the command runs");
    // Dropping the call kills its group.
    sleeper.abort();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(count("sleep 120"), "0", "a dropped call's command was left running");
    // Stopping the agent kills the rest of its processes (one left in the
    // background by a command's own setsid escapes its group, not its user).
    let _ = containers::get()
        .exec(
            &settings,
            &ann,
            &Target::Shared,
            "setsid sleep 121 >/dev/null 2>&1 < /dev/null & sleep 0.5",
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(count("sleep 121"), "1", "the escaped process runs");
    containers::get().release(&ann);
    containers::get().settle().await;
    assert_eq!(count("sleep 121"), "0", "ann's process outlived her stop");
    assert_eq!(running(containers::SHARED), Some(true), "the shared container stays for the others");
    a.store.close().unwrap();
    b.store.close().unwrap();

    // Siblings cannot reach each other, nor this machine (its loopback or
    // any of its addresses), nor the cloud's metadata address.
    let host_port = {
        let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let p = l.local_addr().unwrap().port();
        std::thread::spawn(move || for _ in l.incoming() {});
        p
    };
    let sib_id = format!("sibling{}", std::process::id());
    let listener = {
        let (s, sib_id) = (settings.clone(), sib_id.clone());
        tokio::spawn(async move {
            containers::get()
                .exec(
                    &s,
                    &sib_id,
                    &Target::Isolated,
                    "python3 -m http.server 8765 --bind 0.0.0.0 >/dev/null 2>&1",
                    Duration::from_secs(12),
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let inspect = podman(&[
        "container",
        "inspect",
        "--format",
        "{{.NetworkSettings.IPAddress}}",
        &containers::isolated_name(&sib_id),
    ]);
    let mut addrs: Vec<String> =
        String::from_utf8_lossy(&inspect.stdout).split_whitespace().map(str::to_string).collect();
    addrs.extend(["10.0.2.100".into(), "10.0.2.2".into(), "127.0.0.1".into(), "169.254.169.254".into()]);
    let own: Vec<String> =
        adf::daemon::hosts::interface_addresses().iter().filter(|a| a.is_ipv4()).map(|a| a.to_string()).collect();
    assert!(!own.is_empty(), "this machine has an address to try");
    addrs.extend(own);
    let probe = format!(
        "import socket\nfor a in {addrs:?}:\n  for p in (8765, {host_port}):\n    s=socket.socket(); s.settimeout(1)\n    try:\n      s.connect((a,p)); print('reached', a, p)\n    except Exception as e:\n      print('refused', a, p)\n"
    );
    let reach = containers::get()
        .exec(
            &settings,
            &id,
            &Target::Isolated,
            &format!("python3 -c \"$(printf '%s' '{}' | base64 -d)\"", base64_of(&probe)),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let text = reach["stdout"].as_str().unwrap();
    assert!(!text.contains("reached"), "a sibling or the host's loopback was reachable:\n{text}");
    assert!(text.contains("refused"), "{reach}");
    let _ = listener.await;
    containers::get().release(&sib_id);
    containers::get().release(&id);
    containers::get().settle().await;

    // An external container: used as it is; never started or stopped by adf.
    let ext = format!("adf-test-external-{}", std::process::id());
    let image = adf::runtime::compute::image::tag();
    let made = podman(&[
        "run",
        "-d",
        "--name",
        &ext,
        "--ulimit",
        "nofile=4096:4096",
        "--ulimit",
        "nproc=4096:4096",
        &image,
        "sleep",
        "600",
    ]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    // Without python3 there is no runner: one exec per command, `timeout`
    // inside killing at the deadline.
    podman(&["exec", &ext, "sh", "-c", "rm -f /usr/bin/python3*"]);
    std::fs::write(
        cfg_dir.join("settings.json"),
        json!({"accounts": [], "compute": {"external": [{"alias": "dev-box", "container": ext, "workspace": "/tmp"}]}})
            .to_string(),
    )
    .unwrap();
    let (r, e) = calls(
        agent(d, "extern", json!({"allowed_targets": ["dev-box"]})),
        vec![
            ("compute_exec", json!({"command": "pwd; echo from-external"})),
            ("compute_exec", json!({"command": "sleep 303", "timeout_ms": 1500})),
        ],
    )
    .await;
    assert_eq!(out(&r[0]), "/tmp\nfrom-external\n", "{:?}", r[0]);
    assert_eq!((r[1].0["exit_code"].as_i64(), r[1].0["timed_out"].as_bool()), (Some(124), Some(true)), "{:?}", r[1]);
    let left = podman(&["exec", &ext, "sh", "-c", "ps -eo args | grep -c '^[s]leep 303' || true"]);
    assert_eq!(String::from_utf8_lossy(&left.stdout).trim(), "0", "the external command outlived its timeout");
    assert_eq!(
        (r[0].0["kind"].as_str(), r[0].0["target_name"].as_str()),
        (Some("external-container"), Some("dev-box"))
    );
    let eid = e.agent_id().to_string();
    containers::get().release(&eid);
    containers::get().settle().await;
    assert_eq!(running(&ext), Some(true), "adf never stops an external container");
    let (r, _) =
        calls(agent(d, "notallowed", json!({})), vec![("compute_exec", json!({"command": "ls", "target": "dev-box"}))])
            .await;
    assert!(r[0].1 && r[0].0.as_str().unwrap().contains("allowed_targets does not name it"), "{:?}", r[0]);
    podman(&["stop", "-t", "0", &ext]);
    let (r, _) = calls(
        agent(d, "stopped", json!({"allowed_targets": ["dev-box"]})),
        vec![("compute_exec", json!({"command": "ls"}))],
    )
    .await;
    assert!(
        r[0].1 && r[0].0.as_str().unwrap().contains("adf never starts a container it does not manage"),
        "{:?}",
        r[0]
    );
    assert_eq!(running(&ext), Some(false), "and it stays stopped");
    podman(&["rm", "-f", &ext]);
    e.store.close().unwrap();
    // A stream binding's process end in the agent's own container: its
    // output pumped to a TCP socket on the host; the shared container's is
    // refused without the owner's gate.
    let (port, got) = collector(None).await;
    let bpath = d.join("binder.adf");
    let mut bs = agent(d, "binder", json!({"enabled": true}));
    bs.config_set(
        adf::store::Caller::Owner,
        "stream_bind",
        json!({"allow_tcp_bind": true, "tcp_allowlist": [{"host": "127.0.0.1", "port": port}], "container_isolated_bind": true}),
    )
    .unwrap();
    let mut cfg = bs.config_value().unwrap();
    enable_tools_where(&mut cfg, |n| n == "stream_bind");
    bs.config_replace(cfg).unwrap();
    bs.close().unwrap();
    let model = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![
            (
                "stream_bind".into(),
                json!({"a": {"kind": "process", "isolation": "container_isolated", "command": ["sh", "-c", "printf \"from $(whoami) in $(pwd)\""]},
                       "b": {"kind": "tcp", "host": "127.0.0.1", "port": port}}),
            ),
            (
                "stream_bind".into(),
                json!({"a": {"kind": "process", "isolation": "container_shared", "command": ["true"]},
                       "b": {"kind": "tcp", "host": "127.0.0.1", "port": port}}),
            ),
        ]),
        Reply::Text("done".into()),
    ]));
    let mut fleet = adf::runtime::fleet::Fleet::new(Bus::new(), model_factory(&model));
    fleet.load(&bpath).unwrap();
    let bid = fleet.list()[0].id.clone();
    fleet
        .command(adf::protocol::Command::SendChat { agent: bid.clone(), r#loop: "main".into(), text: "go".into() })
        .unwrap();
    wait("the turn", || model.requests().len() >= 2).await;
    let results = sent_results(&model, 1);
    wait("the process's output from the container", || {
        String::from_utf8_lossy(&got.lock().unwrap()) == "from agent in /workspace"
    })
    .await;
    assert!(results[1].contains("container_shared process stream binding is not enabled"), "{results:?}");
    fleet.shutdown().await;
    assert_eq!(running(&containers::isolated_name(&bid)), Some(false), "its container stopped with it");
    podman(&["rm", "-f", &containers::isolated_name(&bid)]);
    for n in [containers::isolated_name(&id), containers::isolated_name(&sib_id)] {
        podman(&["rm", "-f", &n]);
    }
}

fn base64_of(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}
