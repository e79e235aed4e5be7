//! Runtimes on separate hosts (issue 23): each daemon in a Linux network
//! namespace of its own, with its own address on a private bridge the test
//! makes (`common::hosts`), both on the default ports as on real machines.
//! The tailnet sweep reads a fake `tailscale` that prints the hosts'
//! addresses; a runtime it finds is messaged, signed and encrypted, across
//! the bridge. Needs root and iproute2: without them these tests say so and
//! pass, unless `ADF_REQUIRE_NETNS=1` (CI) makes that a failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::fake_provider::{FakeProvider, Scripted, anthropic_text, anthropic_tool};
use common::hosts::Lan;
use common::{adf_home, fails, json, ok, tmp};
use serde_json::{Value, json};

const TOKEN: &str = "hosts-test-token-0123456789abcdef";

/// Make the test hosts, or say why not (a failure where CI requires them).
fn lan(n: usize) -> Option<Lan> {
    match Lan::new(n) {
        Ok(l) => Some(l),
        Err(e) if std::env::var("ADF_REQUIRE_NETNS").is_ok_and(|v| v == "1") => panic!("test hosts: {e}"),
        Err(e) => {
            eprintln!("skipped: no network namespaces here ({e})");
            None
        }
    }
}

/// A daemon inside test host `i`, its API and mesh on the default ports of
/// that host's own address.
struct Host {
    _child: common::KillOnDrop,
    api: String,
    mesh: String,
    http: reqwest::Client,
}

fn spawn(lan: &Lan, i: usize, home: &Path, env: &[(&str, String)]) -> Host {
    let info = home.join("data/agents/.daemon.json");
    let _ = std::fs::remove_file(&info);
    let child = lan
        .command(i, Path::new(env!("CARGO_BIN_EXE_adf")))
        .args(["daemon", "--host", "0.0.0.0"])
        .env("ADF_HOME", home)
        .env("ADF_DAEMON_TOKEN", TOKEN)
        .env("ANTHROPIC_API_KEY", "sk-test")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let v = common::daemon_info(&home.join("data/agents"), Duration::from_secs(30));
    let mesh = v["mesh"].as_str().expect("the mesh server listens").to_string();
    assert!(mesh.ends_with(":7295"), "the mesh on its default port: {mesh}");
    Host {
        _child: common::KillOnDrop(child),
        api: format!("http://{}:7385", lan.addr(i)),
        mesh: format!("http://{}:7295", lan.addr(i)),
        http: adf::providers::http_client(),
    }
}

impl Host {
    async fn get(&self, path: &str) -> Value {
        let r = self.http.get(format!("{}{path}", self.api)).bearer_auth(TOKEN).send().await.unwrap();
        let s = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert!(s.is_success(), "GET {path}: {s} {v}");
        v
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let r = self.http.post(format!("{}{path}", self.api)).bearer_auth(TOKEN).json(&body).send().await.unwrap();
        let s = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert!(s.is_success(), "POST {path}: {s} {v}");
        v
    }

    async fn wait(&self, path: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.get(path).await;
            if ok(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{what}: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A fleet home with LAN agents (so its mesh listens beyond loopback).
fn home(dir: &Path, name: &str, agents: &[&str]) -> PathBuf {
    let home = dir.join(name);
    let fleet = home.join("data/agents");
    std::fs::create_dir_all(&fleet).unwrap();
    for a in agents {
        let f = format!("{a}.adf");
        ok(&adf_home(&home, &fleet, &["new", &f, "--provider", "anthropic", "--model", "m"]));
        ok(&adf_home(&home, &fleet, &["config", "set", &f, "messaging.visibility", "lan"]));
        ok(&adf_home(&home, &fleet, &["config", "set", &f, "security.level", "2"]));
    }
    home
}

fn did_of(home: &Path, agent: &str) -> String {
    let fleet = home.join("data/agents");
    json(&adf_home(home, &fleet, &["inspect", &format!("{agent}.adf"), "--json"]))["did"].as_str().unwrap().to_string()
}

/// A fake `tailscale` whose `status --json` prints `status` (rewritten by
/// the test as machines come and go); its folder goes first on PATH.
fn fake_tailscale(dir: &Path, status: &Value) -> (PathBuf, String) {
    let bin = dir.join("tsbin");
    std::fs::create_dir_all(&bin).unwrap();
    let file = dir.join("tailscale-status.json");
    std::fs::write(&file, status.to_string()).unwrap();
    let script = bin.join("tailscale");
    std::fs::write(
        &script,
        format!("#!/bin/sh\n[ \"$1 $2\" = \"status --json\" ] || exit 2\ncat '{}'\n", file.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (file, format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default()))
}

fn machine(host: &str, ip: &str, online: bool) -> Value {
    json!({"HostName": host, "DNSName": format!("{host}.tail0.ts.net."), "TailscaleIPs": [ip, "fd7a:115c:a1e0::99"], "Online": online})
}

fn row<'a>(peers: &'a Value, url: &str, source: &str) -> Option<&'a Value> {
    peers["peers"].as_array().unwrap().iter().find(|p| p["url"] == url && p["source"] == source)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tailnet_sweep_finds_a_runtime_on_another_host_and_its_agents_are_messaged_there() {
    let Some(lan) = lan(2) else { return };
    let dir = tmp();
    let (ha, hb) = (home(dir.path(), "a", &["a"]), home(dir.path(), "b", &["b"]));
    // b does not wake on its inbox (no model reaches host 1).
    ok(&adf_home(&hb, &hb.join("data/agents"), &["config", "set", "b.adf", "triggers.on_inbox.enabled", "false"]));
    let (a_did, b_did) = (did_of(&ha, "a"), did_of(&hb, "b"));
    // The tailnet as host 0 sees it: itself is not a peer; host 1 runs adf;
    // a machine nobody answers for; one offline (never probed).
    let status = json!({"Self": machine("ant", &lan.addr(0), true), "Peer": {
        "n1": machine("bee-box", &lan.addr(1), true),
        "n2": machine("ghost", &lan.nobody(), true),
        "n3": machine("sleeper", &format!("{}.251", lan.prefix), false),
        "n0": machine("ant-again", &lan.addr(0), true),
    }});
    let (status_file, path) = fake_tailscale(dir.path(), &status);
    // Host 0 does not use mDNS here (it would find host 1 across the
    // bridge and route through that: the next test).
    std::fs::create_dir_all(ha.join("config")).unwrap();
    std::fs::write(ha.join("config/settings.json"), r#"{"mdnsDiscovery": false}"#).unwrap();
    let b_host = spawn(&lan, 1, &hb, &[]);
    let to_b = json!({"recipient": b_did, "address": format!("{}/agents/b/inbox", b_host.mesh), "content": "hello across", "subject": "hosts"});
    let fake = FakeProvider::start_on(
        &format!("{}:0", lan.gateway()),
        vec![
            Scripted::sse(anthropic_tool("t1", "msg_send", &to_b.to_string())),
            Scripted::sse(anthropic_tool("t2", "agent_discover", r#"{"scope":"all"}"#)),
            Scripted::sse(anthropic_text(&["done"], 5, 1)),
        ],
    )
    .await;
    let a_host = spawn(&lan, 0, &ha, &[("PATH", path), ("ANTHROPIC_BASE_URL", fake.base_url.clone())]);

    // The sweep (at start, and now on request) found host 1 by its tailnet
    // address and nothing else.
    let peers = a_host.get("/peers?refresh=true").await;
    let b_url = b_host.mesh.clone();
    let b_row = row(&peers, &b_url, "tailnet").unwrap_or_else(|| panic!("host 1 in {peers}"));
    let b_runtime = b_row["runtime_id"].as_str().unwrap().to_string();
    assert!(!b_runtime.is_empty() && b_runtime != peers["runtime_id"], "{peers}");
    assert_eq!(
        (b_row["host"].clone(), b_row["route"].clone(), b_row["error"].clone()),
        (json!("bee-box"), json!(true), Value::Null)
    );
    assert!(b_row["last_seen"].as_i64().unwrap() > 0);
    assert_eq!(b_row["did_proven"], true, "it signed the probe's nonce with its DID's key: {peers}");
    let listed: Vec<&str> = peers["peers"].as_array().unwrap().iter().filter_map(|p| p["url"].as_str()).collect();
    assert!(
        listed.iter().all(|u| !u.contains(&lan.addr(0)) && !u.contains(&lan.nobody()) && !u.contains(".251")),
        "only runtimes that answered are listed (not itself, the silent or the offline machine): {peers}"
    );
    assert_eq!(peers["tailnet"]["state"], "ok");
    assert_eq!(peers["tailnet"]["machines"], 3, "the three online machines: {peers}");
    // The silent machine backs off 30 s, its own address five minutes.
    let quiet = |u: &str| {
        peers["backing_off"].as_array().unwrap().iter().find(|q| q["url"] == u).cloned().unwrap_or(Value::Null)
    };
    let ghost = quiet(&format!("http://{}:7295", lan.nobody()));
    assert!((1..=30).contains(&ghost["seconds"].as_u64().unwrap_or(0)), "{peers}");
    let itself = quiet(&format!("http://{}:7295", lan.addr(0)));
    assert!(itself["seconds"].as_u64().unwrap_or(0) > 240, "{peers}");
    assert_eq!(itself["why"], "this runtime");

    // a messages b on the other host, signed and encrypted, and finds it
    // with agent_discover(all) as a tailnet peer.
    a_host.post("/agents/a/chat", json!({"text": "write to b"})).await;
    let a_loop = a_host.wait("/agents/a/loop?limit=500", "a's turn ends", |v| v.to_string().contains("done")).await;
    let b_in = b_host.wait("/agents/b/inbox", "b's inbox", |v| !v["messages"].as_array().unwrap().is_empty()).await;
    let msg = &b_in["messages"][0];
    assert_eq!((msg["content"].clone(), msg["from"].clone()), (json!("hello across"), json!(a_did)));
    let meta: Value = serde_json::from_str(msg["meta"].as_str().unwrap_or("{}")).unwrap();
    assert_eq!((meta["message_verified"].clone(), meta["payload_encrypted"].clone()), (json!(true), json!(true)));
    let original: Value = serde_json::from_str(msg["original_message"].as_str().unwrap()).unwrap();
    assert_eq!(original["payload"]["content_type"], "application/x-adf-encrypted", "it crossed the bridge encrypted");
    let found = a_loop["entries"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["content"].as_array().cloned().unwrap_or_default())
        .find(|b| b["tool_use_id"] == "t2")
        .expect("the discover result");
    let cards: Value = serde_json::from_str(found["content"].as_str().unwrap()).unwrap();
    let b_card =
        cards.as_array().unwrap().iter().find(|c| c["handle"] == "b").unwrap_or_else(|| panic!("b in {cards}"));
    assert_eq!((b_card["source"].clone(), b_card["card_verified"].clone()), (json!("tailnet"), json!(true)));
    assert_eq!(b_card["did"], b_did.as_str());

    // Host 1 leaves the tailnet: still listed after one quiet sweep,
    // expired after the second.
    let mut gone = status.clone();
    gone["Peer"].as_object_mut().unwrap().remove("n1");
    std::fs::write(&status_file, gone.to_string()).unwrap();
    let once = a_host.get("/peers?refresh=true").await;
    assert!(row(&once, &b_url, "tailnet").is_some(), "one missed sweep keeps it: {once}");
    let twice = a_host.get("/peers?refresh=true").await;
    assert!(row(&twice, &b_url, "tailnet").is_none(), "two expire it: {twice}");
    // A tailscale that fails says so, and nothing else changes.
    std::fs::write(&status_file, "tailscaled is not running").unwrap();
    let broken = a_host.get("/peers?refresh=true").await;
    assert_eq!(broken["tailnet"]["state"], "error", "{broken}");
    assert!(broken["tailnet"]["detail"].as_str().unwrap().contains("not JSON"), "{broken}");
    drop(a_host);
    drop(b_host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mdns_across_the_bridge_wins_over_the_tailnet_route() {
    let Some(lan) = lan(2) else { return };
    let dir = tmp();
    let (ha, hb) = (home(dir.path(), "a", &["a"]), home(dir.path(), "b", &["b"]));
    let (_, path) = fake_tailscale(dir.path(), &json!({"Peer": {"n1": machine("bee-box", &lan.addr(1), true)}}));
    let b_host = spawn(&lan, 1, &hb, &[]);
    let a_host = spawn(&lan, 0, &ha, &[("PATH", path)]);
    let (b_tail, deadline) = (b_host.mesh.clone(), Instant::now() + Duration::from_secs(20));
    let peers = loop {
        let p = a_host.get("/peers?refresh=true").await;
        if p["peers"].as_array().unwrap().iter().any(|r| r["source"] == "mdns") && row(&p, &b_tail, "tailnet").is_some()
        {
            break p;
        }
        assert!(Instant::now() < deadline, "mDNS found nothing across the bridge: {p}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let m = peers["peers"].as_array().unwrap().iter().find(|r| r["source"] == "mdns").unwrap();
    let t = row(&peers, &b_tail, "tailnet").unwrap();
    assert_eq!(m["runtime_id"], t["runtime_id"], "one runtime, two sources: {peers}");
    assert_eq!((m["route"].clone(), t["route"].clone()), (json!(true), json!(false)), "{peers}");
    assert_eq!(t["shadowed_by"], m["url"]);
    assert_eq!(m["did_proven"], true, "the mDNS claim is proven over HTTP too: {peers}");
    assert!(m["url"].as_str().unwrap().contains(&lan.addr(1)), "its announced LAN address: {peers}");
    drop(a_host);
    drop(b_host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_peers_on_other_hosts_are_probed_and_listed_without_a_daemon() {
    let Some(lan) = lan(2) else { return };
    let dir = tmp();
    let (ha, hb) = (home(dir.path(), "a", &[]), home(dir.path(), "b", &["b"]));
    let b_host = spawn(&lan, 1, &hb, &[]);
    let fleet = ha.join("data/agents");
    // Three entries: the runtime on host 1; a port there nothing listens
    // on; an address nobody has.
    for p in [lan.addr(1), format!("{}:7999", lan.addr(1)), format!("http://{}:7295/", lan.nobody())] {
        ok(&adf_home(&ha, &fleet, &["peers", "add", &p]));
    }
    let run = lan
        .command(0, Path::new(env!("CARGO_BIN_EXE_adf")))
        .args(["peers", "--json"])
        .env("ADF_HOME", &ha)
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let peers = json(&run);
    assert!(peers["from"].is_null(), "no daemon: swept from here: {peers}");
    let b = row(&peers, &b_host.mesh, "manual").unwrap_or_else(|| panic!("{peers}"));
    assert!(b["runtime_id"].as_str().is_some_and(|r| !r.is_empty()) && b["last_seen"].as_i64().is_some(), "{peers}");
    let refused = row(&peers, &format!("http://{}:7999", lan.addr(1)), "manual").unwrap();
    assert_eq!((refused["error"].clone(), refused["route"].clone()), (json!("connection refused"), json!(true)));
    let silent = row(&peers, &format!("http://{}:7295", lan.nobody()), "manual").unwrap();
    assert_eq!(silent["error"], "timed out", "{peers}");
    assert_eq!(peers["tailnet"]["state"], "absent", "no tailscale on this PATH: {peers}");
    // mDNS across the bridge may have found host 1 too: then it carries the
    // traffic and the manual row says it is the same runtime.
    if let Some(m) = peers["peers"].as_array().unwrap().iter().find(|p| p["source"] == "mdns") {
        assert_eq!(m["runtime_id"], b["runtime_id"], "{peers}");
        assert_eq!(b["shadowed_by"], m["url"], "{peers}");
    }
    // The text table says the same to a person.
    let text = lan
        .command(0, Path::new(env!("CARGO_BIN_EXE_adf")))
        .args(["peers"])
        .env("ADF_HOME", &ha)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = ok(&text);
    assert!(
        text.contains("SOURCE") && text.contains("connection refused") && text.contains("no daemon runs"),
        "{text}"
    );
    drop(b_host);
}

#[test]
fn peers_add_and_rm_keep_settings_and_refuse_what_is_not_host_port() {
    let dir = tmp();
    let home = dir.path().join("h");
    std::fs::create_dir_all(&home).unwrap();
    let settings = home.join("config/settings.json");
    let added = json(&adf_home(&home, dir.path(), &["peers", "add", "box.tail0.ts.net", "--json"]));
    assert_eq!(added["meshPeers"], json!(["http://box.tail0.ts.net:7295"]));
    assert_eq!(added["changed"], true);
    let again = json(&adf_home(&home, dir.path(), &["peers", "add", "http://box.tail0.ts.net:7295/", "--json"]));
    assert_eq!(again["changed"], false, "the same entry written another way");
    let before = std::fs::read(&settings).unwrap();
    for bad in ["ftp://box", "box:99999", "box/agents", "user@box"] {
        fails(&adf_home(&home, dir.path(), &["peers", "add", bad]), &["settings.json unchanged"]);
    }
    fails(&adf_home(&home, dir.path(), &["peers", "rm", "other:7295"]), &["not a manual peer", "unchanged"]);
    assert_eq!(std::fs::read(&settings).unwrap(), before, "bad input changed nothing");
    let rm = json(&adf_home(&home, dir.path(), &["peers", "rm", "box.tail0.ts.net", "--json"]));
    assert_eq!(rm["meshPeers"], json!([]));
}

/// `adf` in the test's own network namespace, with `home`'s settings.
fn adf_at(home: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(args)
        .env("ADF_HOME", home)
        .env_remove("ADF_DAEMON_URL")
        .env_remove("ADF_DAEMON_TOKEN")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remotes_name_daemons_on_other_hosts_with_their_tokens() {
    let Some(lan) = lan(2) else { return };
    let dir = tmp();
    let (ha, hb) = (home(dir.path(), "a", &["ann"]), home(dir.path(), "b", &["bob", "bea"]));
    let (host_a, host_b) = (spawn(&lan, 0, &ha, &[]), spawn(&lan, 1, &hb, &[]));
    // The owner's own machine: a home of its own, the tokens in files.
    let me = dir.path().join("me");
    std::fs::create_dir_all(&me).unwrap();
    let token_file = me.join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let wrong = me.join("wrong");
    std::fs::write(&wrong, "not-the-token-at-all-0123456789").unwrap();
    let tf = token_file.to_str().unwrap();
    ok(&adf_at(&me, &["remote", "add", "ant", &host_a.api, "--token-file", tf], &[]));
    ok(&adf_at(&me, &["remote", "add", "bee", &host_b.api], &[]));
    ok(&adf_at(&me, &["remote", "add", "liar", &host_b.api, "--token-file", wrong.to_str().unwrap()], &[]));
    let down = format!("http://{}:7999", lan.addr(1));
    ok(&adf_at(&me, &["remote", "add", "down", &down], &[]));
    // Nothing of the token is in settings.json.
    let settings = std::fs::read_to_string(me.join("config/settings.json")).unwrap();
    assert!(!settings.contains(TOKEN) && settings.contains("tokenFile"), "{settings}");
    // bee's token from the environment.
    let env = [("ADF_DAEMON_TOKEN_BEE", TOKEN)];
    let ls = json(&adf_at(&me, &["remote", "ls", "--json"], &env));
    let by = |n: &str| ls["remotes"].as_array().unwrap().iter().find(|r| r["name"] == n).cloned().unwrap();
    assert_eq!((by("ant")["ok"].clone(), by("ant")["role"].clone()), (json!(true), json!("owner")), "{ls}");
    assert_eq!(by("ant")["token"], tf);
    assert_eq!((by("bee")["ok"].clone(), by("bee")["token"].clone()), (json!(true), json!("ADF_DAEMON_TOKEN_BEE")));
    assert_eq!(by("liar")["ok"], false, "a wrong token: {ls}");
    assert_eq!(by("down")["ok"], false, "nothing listens: {ls}");
    assert!(by("down")["status"].as_str().unwrap().contains("no daemon answers"), "{ls}");
    assert!(!ls.to_string().contains(TOKEN), "ls never shows a token");

    // One remote: a daemon command goes there with its token.
    let st = json(&adf_at(&me, &["--remote", "bee", "status", "bob", "--json"], &env));
    assert!(st.to_string().contains("bob") || st["state"].is_string(), "{st}");
    // Several: their agents side by side; a host that does not answer is
    // named, and the exit status says so.
    let both = adf_at(&me, &["--remote", "ant", "--remote", "bee", "agents", "--json"], &env);
    let v = json(&both);
    let names: Vec<(String, String)> = v["remotes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|h| {
            h["agents"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| (h["name"].as_str().unwrap().to_string(), a["name"].as_str().unwrap().to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(names.len(), 3, "{v}");
    assert!(names.contains(&("ant".into(), "ann".into())) && names.contains(&("bee".into(), "bea".into())), "{v}");
    let all = adf_at(&me, &["--remote", "all", "agents"], &env);
    assert_eq!(all.status.code(), Some(1), "liar and down fail");
    let text = String::from_utf8_lossy(&all.stdout);
    assert!(text.contains("REMOTE") && text.contains("bob"), "{text}");
    let err = String::from_utf8_lossy(&all.stderr);
    assert!(err.contains("remote down:") && err.contains("remote liar:"), "{err}");

    // Bad input: a clear line, settings unchanged.
    let before = std::fs::read(me.join("config/settings.json")).unwrap();
    fails(&adf_at(&me, &["--remote", "nope", "agents"], &[]), &["no remote named \"nope\""]);
    fails(&adf_at(&me, &["remote", "add", "ant", "http://x:1"], &[]), &["exists already"]);
    fails(&adf_at(&me, &["remote", "add", "All", "http://x:1"], &[]), &["remote name"]);
    fails(&adf_at(&me, &["remote", "add", "x", "x:1"], &[]), &["not a daemon URL"]);
    fails(
        &adf_at(&me, &["remote", "add", "y", "http://x:1", "--token-file", "/no/such/file"], &[]),
        &["/no/such/file"],
    );
    fails(&adf_at(&me, &["--remote", "ant", "--remote", "bee", "status", "bob"], &[]), &["name one remote"]);
    fails(&adf_at(&me, &["remote", "rm", "nope"], &[]), &["no remote named"]);
    assert_eq!(std::fs::read(me.join("config/settings.json")).unwrap(), before);
    ok(&adf_at(&me, &["remote", "rm", "liar"], &[]));
    // ant answered when it was added: its runtime is recorded; another
    // fleet's daemon at its address later is refused, not merged.
    let recorded: Value = serde_json::from_slice(&std::fs::read(me.join("config/settings.json")).unwrap()).unwrap();
    let ant = recorded["remotes"].as_array().unwrap().iter().find(|r| r["name"] == "ant").unwrap().clone();
    assert!(ant["runtimeId"].as_str().is_some_and(|r| !r.is_empty()), "{recorded}");
    drop(host_a);
    let hc = home(dir.path(), "c", &["cid"]);
    let _host_c = spawn(&lan, 0, &hc, &[]);
    fails(&adf_at(&me, &["--remote", "ant", "agents"], &[]), &["remote ant", "answers as runtime", "not"]);
    let ls = json(&adf_at(&me, &["remote", "ls", "--json"], &env));
    let ant = ls["remotes"].as_array().unwrap().iter().find(|r| r["name"] == "ant").unwrap().clone();
    assert_eq!(ant["ok"], false, "{ls}");
    assert!(ant["status"].as_str().unwrap().contains("answers as runtime"), "{ls}");
    let all = adf_at(&me, &["--remote", "ant", "--remote", "bee", "agents", "--json"], &env);
    assert_eq!(all.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&all.stdout).unwrap();
    assert!(!v.to_string().contains("\"cid\""), "nothing of the other fleet merged in: {v}");
    assert!(v.to_string().contains("\"bob\""), "the other hosts unaffected: {v}");
    drop(host_b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adf_move_takes_an_agent_to_another_host_and_its_old_address_relays() {
    let Some(lan) = lan(2) else { return };
    let dir = tmp();
    // Host 1 has a LAN agent of its own, so its mesh listens on its address.
    let (ha, hb) = (home(dir.path(), "a", &["mover", "stayer"]), home(dir.path(), "b", &["anchor"]));
    // One owner on both machines (the recovery phrase restored on host 1,
    // as people do), so the moved file's sealed key opens there.
    let shown = json(&adf_home(&ha, dir.path(), &["identity", "show", "--phrase", "--yes", "--json"]));
    let phrase = shown["phrase"].as_str().unwrap_or_else(|| panic!("{shown}")).to_string();
    let restore = std::process::Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(["identity", "restore"])
        .env("ADF_HOME", &hb)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(format!("{phrase}\n").as_bytes())?;
            c.wait()
        })
        .unwrap();
    assert!(restore.success());
    // mover keeps its messages for the test (no model on either host).
    ok(&adf_home(&ha, &ha.join("data/agents"), &["config", "set", "mover.adf", "triggers.on_inbox.enabled", "false"]));
    let did = did_of(&ha, "mover");
    let (host_a, host_b) = (spawn(&lan, 0, &ha, &[]), spawn(&lan, 1, &hb, &[]));
    // Host 0's owner names host 1 (token from the environment) and one
    // that does not answer.
    let adf0 = |args: &[&str]| {
        lan.command(0, Path::new(env!("CARGO_BIN_EXE_adf")))
            .args(args)
            .env("ADF_HOME", &ha)
            .env("ADF_DAEMON_TOKEN", TOKEN)
            .env("ADF_DAEMON_TOKEN_BEE", TOKEN)
            .env("ADF_DAEMON_TOKEN_DOWN", TOKEN)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    ok(&adf0(&["remote", "add", "bee", &host_b.api]));
    ok(&adf0(&["remote", "add", "down", &format!("http://{}:7999", lan.addr(1))]));
    let before = std::fs::read(ha.join("data/agents/mover.adf")).unwrap();

    // A remote that does not answer: nothing stops, nothing moves.
    fails(&adf0(&["move", "mover", "--to", "down"]), &["mover was not moved", "down"]);
    let here = host_a.get("/agents").await;
    assert!(here.to_string().contains("\"mover\""), "still here: {here}");

    let moved = json(&adf0(&["move", "mover", "--to", "bee", "--json"]));
    assert_eq!(moved["did"], did.as_str(), "{moved}");
    let relay = format!("http://{}:7295/agents/mover/inbox", lan.addr(1));
    assert_eq!(moved["relayFrom"], relay.as_str(), "{moved}");
    // It runs on host 1 with the same identity; host 0 lists it no more
    // and keeps its file aside, byte for byte what it was.
    let there = host_b.wait("/agents", "mover on host 1", |v| v.to_string().contains("\"mover\"")).await;
    let id =
        there.as_array().unwrap().iter().find(|a| a["name"] == "mover").unwrap()["id"].as_str().unwrap().to_string();
    let card = reqwest::get(format!("{}/agents/mover/card", host_b.mesh)).await.unwrap().json::<Value>().await.unwrap();
    assert_eq!(card["did"], did.as_str(), "{card}");
    let here = host_a.get("/agents").await;
    assert!(!here.to_string().contains("\"mover\"") && here.to_string().contains("\"stayer\""), "{here}");
    let kept = ha.join("data/agents/mover.adf.moved");
    assert_eq!(std::fs::read(&kept).unwrap(), before, "the file here is kept as it was");
    assert!(!ha.join("data/agents/mover.adf").exists());
    let fwd = host_a.get("/agents/forwards").await;
    assert_eq!(fwd["forwards"][0]["to"], relay.as_str(), "{fwd}");

    // A peer that still writes to the old address reaches it on host 1.
    let key = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]);
    let msg = common::message_from(&key, &did, "still finds you", 2);
    let r = adf::providers::http_client()
        .post(format!("{}/agents/mover/inbox", host_a.mesh))
        .json(&msg)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "relayed and taken: {}", r.text().await.unwrap_or_default());
    let inbox = host_b
        .wait(&format!("/agents/{id}/inbox"), "the relayed message", |v| {
            v["messages"].as_array().is_some_and(|m| !m.is_empty())
        })
        .await;
    assert_eq!(inbox["messages"][0]["content"], "still finds you");
    // What host 1 refuses, the old address refuses the same way.
    let r = adf::providers::http_client()
        .post(format!("{}/agents/mover/inbox", host_a.mesh))
        .json(&msg)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409, "a replay, refused by the new host");

    // The daemon here keeps relaying after a restart (`.moved.json`).
    drop(host_a);
    let host_a = spawn(&lan, 0, &ha, &[]);
    let again = common::message_from(&key, &did, "after a restart", 2);
    let r = adf::providers::http_client()
        .post(format!("{}/agents/mover/inbox", host_a.mesh))
        .json(&again)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    drop(host_a);
    drop(host_b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_takes_only_whole_agent_files_and_leaves_nothing_behind() {
    let dir = tmp();
    let home = dir.path().join("h");
    let fleet = home.join("data/agents");
    std::fs::create_dir_all(&fleet).unwrap();
    let (child, url, token) = common::spawn_daemon(&home, &["--no-mesh"], &[]);
    let _daemon = common::KillOnDrop(child);
    let http = adf::providers::http_client();
    let import = |name: &str, bytes: Vec<u8>| {
        let req = http
            .post(reqwest::Url::parse_with_params(&format!("{url}/agents/import"), &[("name", name)]).unwrap())
            .bearer_auth(&token)
            .header("content-type", "application/octet-stream")
            .body(bytes);
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // A real agent file, made elsewhere.
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    ok(&adf_home(&other, &other, &["new", "wanderer.adf"]));
    let good = std::fs::read(other.join("wanderer.adf")).unwrap();
    let mut damaged = good.clone();
    for b in &mut damaged[4096..8192] {
        *b = 0x5a;
    }
    for (name, bytes, status, says) in [
        ("../escape.adf", good.clone(), 400, "name must be"),
        ("wanderer.txt", good.clone(), 400, "name must be"),
        (".hidden.adf", good.clone(), 400, "name must be"),
        ("junk.adf", b"GIF89a not an agent".to_vec(), 400, "not an agent file"),
        ("empty.adf", Vec::new(), 400, "not an agent file"),
        ("damaged.adf", damaged, 400, "damaged"),
    ] {
        let (s, v) = import(name, bytes).await;
        assert_eq!(s, status, "{name}: {v}");
        assert!(v["error"].as_str().unwrap_or("").contains(says), "{name}: {v}");
    }
    let left: Vec<String> = std::fs::read_dir(&fleet)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.contains(".import-")
                || ["junk.adf", "empty.adf", "damaged.adf", "wanderer.txt", ".hidden.adf"].contains(&n.as_str())
        })
        .collect();
    assert!(left.is_empty(), "nothing left behind: {left:?}");
    assert!(!home.join("data/escape.adf").exists());
    let (s, v) = import("wanderer.adf", good.clone()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["name"], "wanderer");
    assert_eq!(std::fs::read(fleet.join("wanderer.adf")).unwrap().len(), good.len());
    // The same agent again, under another name: it runs here already.
    let (s, v) = import("twin.adf", good.clone()).await;
    assert_eq!((s, v["code"].clone()), (409, json!("AGENT_EXISTS")), "{v}");
    assert!(!fleet.join("twin.adf").exists());
    // Over a file that is there: refused.
    let (s, v) = import("wanderer.adf", good).await;
    assert_eq!((s, v["code"].clone()), (409, json!("FILE_EXISTS")), "{v}");
    // A forward may set aside only an agent file of this fleet.
    let fwd = |file: &str| {
        let body =
            json!({"handle": "gone", "did": "did:key:z6Mkabc", "to": "http://box/agents/gone/inbox", "filePath": file});
        let req = http.post(format!("{url}/agents/forwards")).bearer_auth(&token).json(&body);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    let outside = dir.path().join("outside.adf");
    std::fs::write(&outside, b"x").unwrap();
    assert_eq!(fwd(outside.to_str().unwrap()).await, 400);
    assert!(outside.exists(), "a file outside the fleet is never moved");
    assert_eq!(fwd("/no/such/file.adf").await, 404);
}

/// Write a file of `agent` on a host, through its API from inside it
/// (reachable while its wire to the others is out).
fn write_inside(lan: &Lan, i: usize, agent: &str, path: &str) {
    let out = lan
        .inside(i, "curl")
        .args(["-sf", "-X", "PUT", "-H", &format!("authorization: Bearer {TOKEN}")])
        .args(["-H", "content-type: application/json", "-d", r#"{"content":"x"}"#])
        .arg(format!("http://{}:7385/agents/{agent}/files/content?path={path}", lan.addr(i)))
        .output()
        .unwrap();
    assert!(out.status.success(), "PUT {path} on host {i}: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_over_three_hosts_loses_no_event_when_one_drops_or_restarts() {
    let Some(lan) = lan(3) else { return };
    let dir = tmp();
    let homes = [home(dir.path(), "a", &["ann"]), home(dir.path(), "b", &["bob"]), home(dir.path(), "c", &["cid"])];
    // cid's model asks for a restricted tool: an approval waits on cat.
    let fake = FakeProvider::start_on(
        &format!("{}:0", lan.gateway()),
        vec![
            Scripted::sse(anthropic_tool(
                "toolu_1",
                "sys_update_config",
                r#"{"path":"description","value":"approved across hosts","_reason":"asked on cat"}"#,
            )),
            Scripted::sse(anthropic_text(&["Updated."], 5, 2)),
        ],
    )
    .await;
    let mut hosts: Vec<Host> = (0..3)
        .map(|i| {
            let env = if i == 2 { vec![("ANTHROPIC_BASE_URL", fake.base_url.clone())] } else { Vec::new() };
            spawn(&lan, i, &homes[i], &env)
        })
        .collect();
    let cid = hosts[2].get("/agents").await[0]["id"].as_str().unwrap().to_string();
    hosts[2].post(&format!("/agents/{cid}/chat"), json!({"text": "update your description"})).await;
    let waiting =
        hosts[2].wait("/attention", "the approval on cat", |v| v["tasks"].as_array().unwrap().len() == 1).await;
    assert_eq!(
        (waiting["tasks"][0]["agentId"].as_str(), waiting["tasks"][0]["tool"].as_str()),
        (Some(cid.as_str()), Some("sys_update_config")),
        "{waiting}"
    );
    let me = dir.path().join("me");
    std::fs::create_dir_all(&me).unwrap();
    let token_file = me.join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    for (name, h) in ["ant", "bee", "cat"].iter().zip(&hosts) {
        ok(&adf_at(&me, &["remote", "add", name, &h.api, "--token-file", token_file.to_str().unwrap()], &[]));
    }
    let bob = hosts[1].get("/agents").await[0]["id"].as_str().unwrap().to_string();
    // Two that must not be merged: a wrong token, and ant's address
    // recorded as another runtime (another fleet answering there now).
    let wrong = me.join("wrong");
    std::fs::write(&wrong, "not-the-token-at-all-0123456789").unwrap();
    ok(&adf_at(&me, &["remote", "add", "liar", &hosts[0].api, "--token-file", wrong.to_str().unwrap()], &[]));
    ok(&adf_at(&me, &["remote", "add", "imp", &hosts[0].api, "--token-file", token_file.to_str().unwrap()], &[]));
    let settings = me.join("config/settings.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&settings).unwrap()).unwrap();
    for r in v["remotes"].as_array_mut().unwrap() {
        if r["name"] == "imp" {
            r["runtimeId"] = json!("rt-of-another-fleet");
        }
    }
    std::fs::write(&settings, v.to_string()).unwrap();

    // One app over them: agents under their hosts; the two refused, with
    // nothing of theirs shown, the others unaffected.
    let mut t = common::pty::Tui::start_with(&me, &[], &["--remote", "all"], 150, 60);
    let s = t.wait_for("cid");
    for want in ["ant · 1 agent", "bee · 1 agent", "cat · 1 agent", "ann", "bob", "imp · down", "liar · down"] {
        assert!(s.contains(want), "{want:?} on screen:\n{s}");
    }
    // cat's approval is in the app's queue (read from every host after
    // the first frame).
    t.wait_for("1 waiting on you");
    assert_eq!(s.matches("● ann").count(), 1, "ann only under ant:\n{s}");
    write_inside(&lan, 1, &bob, "seen-1.txt");
    t.wait_for("seen-1.txt");

    // bee's wire is pulled: it keeps running and writing; the app marks
    // it disconnected, the others unaffected, and once the wire is back
    // replays what it missed from its cursor.
    lan.link(1, false).unwrap();
    for n in 1..=3 {
        write_inside(&lan, 1, &bob, &format!("during-{n}.txt"));
    }
    let s = t.wait_for("bee · down, seen");
    assert!(s.contains("ant · 1 agent") && s.contains("cat · 1 agent"), "{s}");
    assert!(!s.contains("during-1.txt"), "nothing came through the pulled wire:\n{s}");
    lan.link(1, true).unwrap();
    let s = t.wait_for("during-3.txt");
    assert!(s.contains("during-1.txt") && s.contains("during-2.txt"), "every missed event replayed:\n{s}");
    t.wait_for("bee · 1 agent");

    // bee's daemon is killed and started again: a new process, whose
    // events from its start are replayed (its cursors began again at 1).
    drop(hosts.remove(1));
    t.wait_for("bee · down");
    hosts.insert(1, spawn(&lan, 1, &homes[1], &[]));
    write_inside(&lan, 1, &bob, "after-restart.txt");
    let s = t.wait_for("after-restart.txt");
    assert!(s.contains("bee · 1 agent") || t.wait_for("bee · 1 agent").contains("bob"), "{s}");
    // A command goes to the host its agent is on: bob is turned off on bee.
    // The tree's selection starts on the first agent (ann, on ant): down
    // one agent to bob, past bee's line.
    t.send("j");
    t.send(":stop\r");
    hosts[1].wait("/agents", "bob turned off on bee", |v| v[0]["state"] == "off").await;
    assert_ne!(hosts[0].get("/agents").await[0]["state"], "off", "ann on ant untouched");
    // Down to cid on cat: its approval, answered from here, lands there.
    t.send("j");
    t.wait_for("approval · sys_update_config");
    t.send("a");
    hosts[2]
        .wait(&format!("/agents/{cid}/config"), "the approved change on cat", |v| {
            v["config"]["description"] == "approved across hosts"
        })
        .await;
    t.wait_for("0 waiting on you");
    t.quit();
    // The daemons keep running after the app.
    assert_eq!(hosts[2].get("/agents").await[0]["name"], "cid");
}
