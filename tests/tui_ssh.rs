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
    let script = dir.join("run-adf.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexport ADF_HOME='{}' ANTHROPIC_API_KEY=sk-test ANTHROPIC_BASE_URL='{base}' LANG=C.UTF-8 TERM=xterm\nunset COLORTERM\nexec '{}'\n",
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
