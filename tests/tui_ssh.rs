//! The terminal app as people use it: over a real SSH connection
//! (a throw-away sshd on loopback, `.ci/sshd.sh`) inside tmux, with
//! `TERM=xterm`, asserting on `tmux capture-pane`. Ignored unless
//! `ADF_SSH_PORT` and `ADF_SSH_KEY` say where the sshd is (`.ci/run` sets
//! them): `cargo test --test tui_ssh -- --ignored`.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::fake_provider::*;
use common::*;

struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux").arg("-L").arg(&self.socket).args(args).output().expect("tmux");
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    fn alive(&self) -> bool {
        Command::new("tmux")
            .args(["-L", &self.socket, "has-session", "-t", "adf"])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "adf"])
    }

    fn wait_for(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let s = self.screen();
            if s.contains(text) {
                return s;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {text:?}; pane:\n{s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "adf"];
        args.extend_from_slice(keys);
        self.run(&args);
        std::thread::sleep(Duration::from_millis(150));
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", &self.socket, "kill-server"]).status();
    }
}

fn wrapper(dir: &Path, home: &Path, base: &str) -> std::path::PathBuf {
    wrapper_with(dir, home, base, "run-adf.sh", "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the sshd of .ci/sshd.sh (ADF_SSH_PORT, ADF_SSH_KEY)"]
async fn chat_over_ssh_in_tmux() {
    let port = std::env::var("ADF_SSH_PORT").expect("ADF_SSH_PORT");
    let key = std::env::var("ADF_SSH_KEY").expect("ADF_SSH_KEY");
    let user = std::env::var("ADF_SSH_USER").unwrap_or_else(|_| "root".into());
    let dir = tmp();
    let home = dir.path().join("home");
    let agents = home.join("data/agents");
    std::fs::create_dir_all(&agents).unwrap();
    ok(&adf(&agents, &["new", "a.adf", "--provider", "anthropic", "--model", "test-model"], None));
    let fake = FakeProvider::start(vec![Scripted::sse(anthropic_text(&["Hello ", "over ", "SSH.\n"], 9, 4))]).await;
    let script = wrapper(dir.path(), &home, &fake.base_url);
    let agent_file = agents.join("a.adf");
    tokio::task::spawn_blocking(move || {
        let tmux = Tmux { socket: format!("adf-test-{}", std::process::id()) };
        let ssh = format!(
            "ssh -tt -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -i {key} -p {port} {user}@127.0.0.1 {}",
            script.display()
        );
        tmux.run(&["-f", "/dev/null", "new-session", "-d", "-s", "adf", "-x", "100", "-y", "30", &ssh]);
        let s = tmux.wait_for("adf › a › main");
        assert!(s.contains("┌ Fleet"), "box drawing over ssh with a UTF-8 locale:\n{s}");
        // A fresh ADF_HOME: the owner's recovery phrase comes first, once.
        tmux.wait_for("Your recovery phrase (enter closes)");
        tmux.keys(&["Enter"]);
        tmux.keys(&["i"]);
        tmux.keys(&["-l", "hello over ssh"]);
        tmux.keys(&["Enter"]);
        let s = tmux.wait_for("Hello over SSH.");
        assert!(s.contains("you  hello over ssh"), "{s}");
        // The reply is in the file too.
        tmux.keys(&["Escape"]);
        // Resize the window: the app redraws at the new size.
        tmux.run(&["resize-window", "-t", "adf", "-x", "80", "-y", "24"]);
        std::thread::sleep(Duration::from_millis(500));
        let s = tmux.wait_for("? help");
        assert!(s.lines().all(|l| l.chars().count() <= 80), "{s}");
        tmux.keys(&["q"]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while tmux.alive() {
            assert!(Instant::now() < deadline, "adf did not quit over ssh:\n{}", tmux.screen());
            std::thread::sleep(Duration::from_millis(100));
        }
        let c = rusqlite::Connection::open(&agent_file).unwrap();
        let n: i64 = c
            .query_row("SELECT count(*) FROM adf_loop WHERE content_json LIKE '%Hello over SSH.%'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
    })
    .await
    .unwrap();
}

fn ssh_command(script: &Path) -> String {
    let port = std::env::var("ADF_SSH_PORT").expect("ADF_SSH_PORT");
    let key = std::env::var("ADF_SSH_KEY").expect("ADF_SSH_KEY");
    let user = std::env::var("ADF_SSH_USER").unwrap_or_else(|_| "root".into());
    format!(
        "ssh -tt -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -i {key} -p {port} {user}@127.0.0.1 {}",
        script.display()
    )
}

/// The wrapper with extra arguments for `adf`.
fn wrapper_with(dir: &Path, home: &Path, base: &str, name: &str, args: &str) -> std::path::PathBuf {
    let script = dir.join(name);
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexport ADF_HOME='{}' ANTHROPIC_API_KEY=sk-test ANTHROPIC_BASE_URL='{base}' LANG=C.UTF-8 TERM=xterm\nunset COLORTERM\nexec '{}' {args}\n",
            home.display(),
            env!("CARGO_BIN_EXE_adf")
        ),
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    script
}

/// A meta value, read without leaving sidecars (an immutable read: call it
/// only when no process has the file open).
fn meta(file: &Path, key: &str) -> Option<String> {
    let uri = format!("file:{}?immutable=1", file.display());
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI;
    let c = rusqlite::Connection::open_with_flags(uri, flags).ok()?;
    c.query_row("SELECT value FROM adf_meta WHERE key = ?1", [key], |r| r.get(0)).ok()
}

/// The SSH connection drops while a turn runs. Without a daemon, the app
/// gets the hangup and closes the file cleanly (turn interrupted, marker,
/// no sidecar). With `adf --daemon`, the turn goes on in the daemon, and
/// an app attached again over SSH mid-turn shows the agent working, then
/// the reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the sshd of .ci/sshd.sh (ADF_SSH_PORT, ADF_SSH_KEY)"]
async fn a_dropped_ssh_connection_mid_turn() {
    let dir = tmp();
    let home = dir.path().join("home");
    let agents = home.join("data/agents");
    std::fs::create_dir_all(&agents).unwrap();
    ok(&adf(&agents, &["new", "a.adf", "--provider", "anthropic", "--model", "test-model"], None));
    ok(&adf_home(&home, &agents, &["identity", "show", "--phrase", "--yes", "--json"]));
    let mut cut = Scripted::sse(anthropic_text(&["never ", "seen"], 3, 2));
    cut.pause_ms = 30_000;
    let mut slow = Scripted::sse(anthropic_text(&["Done ", "in the daemon.\n"], 3, 2));
    slow.pause_ms = 6_000;
    let fake = std::sync::Arc::new(FakeProvider::start(vec![cut, slow]).await);
    let plain = wrapper_with(dir.path(), &home, &fake.base_url, "plain.sh", "");
    let daemon = wrapper_with(dir.path(), &home, &fake.base_url, "daemon.sh", "--daemon");
    let file = agents.join("a.adf");
    let f2 = fake.clone();
    tokio::task::spawn_blocking(move || {
        let wait_requests = |n: usize| {
            let deadline = Instant::now() + Duration::from_secs(30);
            while f2.requests().len() < n {
                assert!(Instant::now() < deadline, "the turn never reached the model");
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        // 1. No daemon: the hangup ends the app, which closes the file.
        let tmux = Tmux { socket: format!("adf-drop-{}", std::process::id()) };
        tmux.run(&["-f", "/dev/null", "new-session", "-d", "-s", "adf", "-x", "100", "-y", "30", &ssh_command(&plain)]);
        tmux.wait_for("adf › a › main");
        tmux.keys(&["i"]);
        tmux.keys(&["-l", "a long job"]);
        tmux.keys(&["Enter"]);
        wait_requests(1);
        // The connection drops: the ssh client is killed with its pane.
        tmux.run(&["kill-server"]);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let closed = ["-wal", "-shm", ".lock"].iter().all(|s| !agents.join(format!("a.adf{s}")).exists())
                && meta(&file, "adf_clean_close").is_some();
            if closed {
                break;
            }
            assert!(Instant::now() < deadline, "the file was not closed cleanly after the SSH connection dropped");
            std::thread::sleep(Duration::from_millis(100));
        }
        let cp = meta(&file, "adf_runtime_turn_checkpoint").unwrap_or_default();
        assert!(cp.contains("\"interrupted\""), "{cp}");
        // 2. With a daemon: the turn outlives the connection.
        let tmux = Tmux { socket: format!("adf-drop2-{}", std::process::id()) };
        tmux.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "adf",
            "-x",
            "100",
            "-y",
            "30",
            &ssh_command(&daemon),
        ]);
        tmux.wait_for("attached to the daemon");
        tmux.keys(&["i"]);
        tmux.keys(&["-l", "take your time"]);
        tmux.keys(&["Enter"]);
        wait_requests(2);
        tmux.run(&["kill-server"]);
        // 3. Back over SSH while it still works: the agent shows as running.
        let tmux = Tmux { socket: format!("adf-drop3-{}", std::process::id()) };
        tmux.run(&["-f", "/dev/null", "new-session", "-d", "-s", "adf", "-x", "100", "-y", "30", &ssh_command(&plain)]);
        tmux.wait_for("attached to the daemon");
        tmux.wait_for("1 running");
        tmux.wait_for("Done in the daemon.");
        tmux.keys(&["q"]);
        let info = std::fs::read_to_string(agents.join(".daemon.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&info).unwrap();
        unsafe { libc::kill(v["pid"].as_i64().unwrap() as i32, libc::SIGTERM) };
    })
    .await
    .unwrap();
}

/// `adf` with `home` as its ADF_HOME and `path` first on PATH.
fn adf_via(home: &Path, path: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(args)
        .env("ADF_HOME", home)
        .env("PATH", format!("{}:{}", path.display(), std::env::var("PATH").unwrap_or_default()))
        .env_remove("ADF_DAEMON_URL")
        .env_remove("ADF_DAEMON_TOKEN")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

#[test]
#[ignore = "needs the sshd of .ci/sshd.sh (ADF_SSH_PORT, ADF_SSH_KEY)"]
fn an_ssh_remote_reaches_the_far_daemon_through_a_tunnel_with_its_token() {
    let port = std::env::var("ADF_SSH_PORT").expect("ADF_SSH_PORT");
    let key = std::env::var("ADF_SSH_KEY").expect("ADF_SSH_KEY");
    let user = std::env::var("ADF_SSH_USER").unwrap_or_else(|_| "root".into());
    let started = std::time::SystemTime::now();
    let dir = tmp();
    // The far side: a fleet with a daemon (on this machine, reached through
    // the sshd as if it were another).
    let far = dir.path().join("far");
    let fleet = far.join("data/agents");
    std::fs::create_dir_all(&fleet).unwrap();
    ok(&adf_home(&far, &fleet, &["new", "scout.adf"]));
    let (daemon, _, _) = spawn_daemon(&far, &["--no-mesh"], &[]);
    let _daemon = KillOnDrop(daemon);
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    // The owner's ssh config names the hosts (ssh reads ~/.ssh of the
    // passwd entry, so a wrapper hands it this config instead).
    let cfg = dir.path().join("ssh_config");
    let host = |name: &str, adf_home: &Path| {
        format!(
            "Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {key}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  SetEnv ADF_HOME={}\n",
            adf_home.display()
        )
    };
    std::fs::write(&cfg, format!("{}{}", host("farbox", &far), host("emptybox", &empty))).unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("ssh"), format!("#!/bin/sh\nexec /usr/bin/ssh -F '{}' \"$@\"\n", cfg.display())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(bin.join("ssh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let me = dir.path().join("me");
    std::fs::create_dir_all(&me).unwrap();
    ok(&adf_via(&me, &bin, &["remote", "add", "far", "ssh://farbox"]));
    ok(&adf_via(&me, &bin, &["remote", "add", "void", "ssh://emptybox"]));
    let ls = json(&adf_via(&me, &bin, &["remote", "ls", "--json"]));
    let by = |n: &str| ls["remotes"].as_array().unwrap().iter().find(|r| r["name"] == n).cloned().unwrap();
    assert_eq!(
        (by("far")["ok"].clone(), by("far")["role"].clone()),
        (serde_json::json!(true), serde_json::json!("owner")),
        "{ls}"
    );
    assert_eq!(by("far")["token"], "over ssh");
    assert_eq!(by("void")["ok"], false);
    assert!(by("void")["status"].as_str().unwrap().contains("no daemon runs"), "{ls}");
    let agents = json(&adf_via(&me, &bin, &["--remote", "far", "agents", "--json"]));
    assert!(agents.to_string().contains("scout"), "{agents}");
    fails(&adf_via(&me, &bin, &["--remote", "void", "agents"]), &["remote void", "no daemon runs"]);
    // Nothing is left behind: no ssh master, no control socket.
    let left = Command::new("pgrep").args(["-f", "ssh -S .*adf-ssh-"]).output().unwrap();
    assert!(left.stdout.is_empty(), "an ssh master outlived the command: {}", String::from_utf8_lossy(&left.stdout));
    let sockets: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("adf-ssh-"))
        .filter(|e| e.metadata().and_then(|m| m.modified()).is_ok_and(|t| t >= started))
        .collect();
    assert!(sockets.is_empty(), "control sockets left: {sockets:?}");
}
