//! The real `adf` binary in a real pseudo-terminal (portable-pty), its
//! screen read back through a terminal emulator (vt100), talking to the
//! wire-level fake provider: start and quit with the terminal restored, a
//! streamed reply, an approval with `a` and its effect in the file, a
//! rejection with feedback the model sees, `m` through `$EDITOR`, resize.

mod common;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fake_provider::*;
use common::pty::Tui;
use common::*;
use portable_pty::PtySize;
use serde_json::{Value, json};

fn home_with_agent(dir: &Path) -> std::path::PathBuf {
    let home = dir.join("home");
    let agents = home.join("data/agents");
    std::fs::create_dir_all(&agents).unwrap();
    ok(&adf_home(&home, &agents, &["new", "a.adf", "--provider", "anthropic", "--model", "test-model"]));
    // The recovery phrase seen once already (its dialog has its own tests).
    ok(&adf_home(&home, &agents, &["identity", "show", "--phrase", "--yes", "--json"]));
    home
}

/// As if the owner had never seen the recovery phrase: the next app shows it.
fn phrase_unseen(home: &Path) {
    let file = home.join("config/identity.json");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("\"phrase_shown\": true"), "{text}");
    std::fs::write(&file, text.replace("\"phrase_shown\": true", "\"phrase_shown\": false")).unwrap();
}

fn script(path: &Path, body: &str) {
    std::fs::write(path, body).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

fn sql(path: &Path, q: &str) -> String {
    let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    c.query_row(q, [], |r| r.get::<_, String>(0)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_chat_approve_reject_edit_resize_quit() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let fake =
        FakeProvider::start(vec![Scripted::sse(anthropic_text(&["Hello ", "from the ", "fake model.\n"], 12, 7))])
            .await;
    let editor = dir.path().join("editor.sh");
    std::fs::write(&editor, "#!/bin/sh\nprintf 'Remember: the owner likes tea.\\n' >> \"$1\"\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&editor, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let base = fake.base_url.clone();
    let home2 = home.clone();
    let fake = Arc::new(fake);
    let f2 = fake.clone();
    tokio::task::spawn_blocking(move || {
        let fake = f2;
        let mut t = Tui::start(&home2, &base, Some(&editor), 120, 40);
        t.wait_for("adf › a › main");
        // Send a message; the reply streams in.
        t.send("i");
        t.send("hi there");
        t.send("\r");
        t.wait_for("from the fake model.");
        assert!(t.screen().contains("you  hi there"));

        // A restricted tool call waits for approval; `a` approves it and
        // the change lands in the file.
        fake.push(Scripted::sse(anthropic_tool(
            "toolu_1",
            "sys_update_config",
            r#"{"path":"description","value":"approved from the tui","_reason":"keep it current"}"#,
        )));
        fake.push(Scripted::sse(anthropic_text(&["Updated."], 5, 2)));
        t.send("i");
        t.send("update your description");
        t.send("\r");
        t.wait_for("approval · sys_update_config");
        t.wait_for("reason: keep it current");
        t.send("\x1b"); // leave the composer
        t.send("a");
        t.wait_for("Updated.");
        let file = home2.join("data/agents/a.adf");
        assert_eq!(
            sql(&file, "SELECT json_extract(config_json, '$.description') FROM adf_config"),
            "approved from the tui"
        );

        // A rejection with feedback: the model sees it.
        fake.push(Scripted::sse(anthropic_tool(
            "toolu_2",
            "sys_update_config",
            r#"{"path":"description","value":"nope","_reason":"again"}"#,
        )));
        fake.push(Scripted::sse(anthropic_text(&["Understood."], 5, 2)));
        t.send("i");
        t.send("try again");
        t.send("\r");
        t.wait_for("reason: again");
        t.send("\x1b");
        t.send("r");
        t.wait_for("Reject");
        t.send("not today");
        t.send("\r");
        t.wait_for("Understood.");
        let sent = serde_json::to_string(&fake.requests().last().unwrap().1).unwrap();
        assert!(sent.contains("not today"), "{sent}");
        assert_eq!(
            sql(&file, "SELECT json_extract(config_json, '$.description') FROM adf_config"),
            "approved from the tui"
        );

        // m: mind.md through $EDITOR, written back through the agent.
        t.send("m");
        t.wait_for("mind.md saved");
        assert!(
            sql(&file, "SELECT CAST(content AS TEXT) FROM adf_files WHERE path = 'mind.md'")
                .ends_with("Remember: the owner likes tea.\n")
        );

        // Resize to 80×24: the layout follows.
        t.master.resize(PtySize { rows: 24, cols: 80, pixel_width: 0, pixel_height: 0 }).unwrap();
        t.parser.lock().unwrap().screen_mut().set_size(24, 80);
        t.send("\x0c"); // any key redraws too; the resize event comes first
        let s = t.wait_for("? help");
        assert!(s.lines().all(|l| l.chars().count() <= 80), "{s}");
        let out = t.quit();
        let tail = String::from_utf8_lossy(&out[out.len().saturating_sub(200)..]).to_string();
        assert!(tail.contains("\x1b[?1049l"), "the alternate screen is left on exit: {tail:?}");
    })
    .await
    .unwrap();
}

/// First run without a key: the app says how to connect, a key typed into
/// it is saved 0600 in the settings file, and the agent then talks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_a_provider_from_the_app() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let fake = Arc::new(
        FakeProvider::start(vec![Scripted::sse(anthropic_text(&["Connected ", "and talking.\n"], 3, 2))]).await,
    );
    let f2 = fake.clone();
    tokio::task::spawn_blocking(move || {
        let base = f2.base_url.clone();
        let mut t = Tui::start_with(&home, &[("ANTHROPIC_BASE_URL", &base)], &[], 120, 40);
        t.wait_for("a.adf has no anthropic API key");
        t.send(":connect\r");
        t.wait_for("Connect a provider");
        t.send("sk-typed-in-app\r");
        t.wait_for("anthropic connected");
        assert!(!t.screen().contains("sk-typed-in-app"), "the key is never shown");
        let settings = home.join("config/settings.json");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&settings).unwrap().permissions().mode() & 0o777, 0o600);
        }
        assert!(std::fs::read_to_string(&settings).unwrap().contains("sk-typed-in-app"));
        t.send("i");
        t.send("hello");
        t.send("\r");
        t.wait_for("and talking.");
        let (headers, _) = f2.requests().last().unwrap().clone();
        assert_eq!(headers["x-api-key"], "sk-typed-in-app");
        t.send("\x1b");
        let out = t.quit();
        assert!(!String::from_utf8_lossy(&out).contains("sk-typed-in-app"), "the key never reaches the screen");
    })
    .await
    .unwrap();
}

/// `--inline` draws below the prompt (no alternate screen); `x` turns the
/// agent off and `s` starts it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_stop_and_start() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let fake = FakeProvider::start(vec![Scripted::sse(anthropic_text(&["Back ", "again.\n"], 3, 2))]).await;
    let base = fake.base_url.clone();
    tokio::task::spawn_blocking(move || {
        let env = [("ANTHROPIC_API_KEY", "sk-test"), ("ANTHROPIC_BASE_URL", base.as_str())];
        let mut t = Tui::start_with(&home, &env, &["--inline"], 100, 30);
        t.wait_for("adf › a › main");
        t.send("x");
        t.wait_for("off");
        t.send("s");
        t.wait_for("started");
        t.send("i");
        t.send("are you there?");
        t.send("\r");
        t.wait_for("Back again.");
        t.send("\x1b");
        assert!(!t.raw().contains("\x1b[?1049h"), "inline mode never enters the alternate screen");
        t.quit();
    })
    .await
    .unwrap();
}

/// The app attached to a daemon: it finds the daemon of the fleet, two apps
/// see the same stream (an approval resolved in one leaves the other),
/// quitting leaves the agents running, and an app that detached while an
/// agent worked finds the reply when it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_to_a_daemon_detach_and_reattach() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let mut slow = Scripted::sse(anthropic_text(&["Finished ", "while you were away.\n"], 3, 2));
    slow.pause_ms = 4000;
    let fake = Arc::new(
        FakeProvider::start(vec![
            Scripted::sse(anthropic_text(&["Hello ", "through the daemon.\n"], 3, 2)),
            Scripted::sse(anthropic_tool(
                "toolu_5",
                "sys_update_config",
                r#"{"path":"description","value":"two apps","_reason":"shared"}"#,
            )),
            Scripted::sse(anthropic_text(&["Approved elsewhere.\n"], 3, 2)),
            slow,
        ])
        .await,
    );
    let base = fake.base_url.clone();
    let mut daemon = std::process::Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(["daemon", "--port", "0"])
        .env("ADF_HOME", &home)
        .env("ANTHROPIC_API_KEY", "sk-test")
        .env("ANTHROPIC_BASE_URL", &base)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    phrase_unseen(&home);
    let info = home.join("data/agents/.daemon.json");
    // A guard, not a timing: the suite runs many processes on two cores.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !info.exists() {
        assert!(Instant::now() < deadline, "the daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let h = home.clone();
    let result = tokio::task::spawn_blocking(move || {
        let home = h;
        // No provider key in the app's environment: the daemon has one.
        let mut a = Tui::start_with(&home, &[], &[], 120, 40);
        a.wait_for("attached to the daemon");
        // The first app of this owner shows the recovery phrase, attached too.
        a.wait_for("Your recovery phrase (enter closes)");
        a.send("\r");
        a.send("i");
        a.send("hello");
        a.send("\r");
        a.wait_for("through the daemon.");
        a.send("\x1b");
        // A second app on the same daemon.
        let mut b = Tui::start_with(&home, &[], &[], 120, 40);
        b.wait_for("through the daemon.");
        a.send("i");
        a.send("change it");
        a.send("\r");
        a.wait_for("approval · sys_update_config");
        b.wait_for("approval · sys_update_config");
        a.send("\x1b");
        b.send("a");
        b.wait_for("Approved elsewhere.");
        let deadline = Instant::now() + Duration::from_secs(10);
        while a.screen().contains("approval · sys_update_config") {
            assert!(Instant::now() < deadline, "resolved in one app, still shown in the other:\n{}", a.screen());
            std::thread::sleep(Duration::from_millis(50));
        }
        b.quit();
        // Detach while the agent works; come back to the reply.
        a.send("i");
        a.send("take your time");
        a.send("\r");
        a.send("\x1b");
        a.quit();
        let c = Tui::start_with(&home, &[], &[], 120, 40);
        // Attached mid-turn, the agent shows as working, not idle.
        c.wait_for("1 running");
        c.wait_for("while you were away.");
        c.quit();
    })
    .await;
    // The daemon kept running through all of it.
    let alive = daemon.try_wait().unwrap().is_none();
    let _ = daemon.kill();
    let _ = daemon.wait();
    result.unwrap();
    assert!(alive, "quitting attached apps leaves the daemon running");
}

/// A system timer whose lambda fails, in the real app: the agent is
/// marked in the tree and its chat says what failed, with no model call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_timer_lambda_shows_on_the_agent() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let file = home.join("data/agents/a.adf");
    {
        let mut s = adf::store::Store::open(&file).unwrap();
        s.file_write(
            adf::store::Caller::Owner,
            "lib/nightly.js",
            b"export function main(event) { throw new Error('the report table is missing'); }\n",
            &adf::store::files::WriteOptions::default(),
        )
        .unwrap();
        let now = adf::store::now_ms();
        s.timer_insert(&adf::store::timers::NewTimer {
            schedule: &adf::store::timers::Schedule::Interval {
                every_ms: 60_000,
                start_at: None,
                end_at: None,
                max_runs: None,
            },
            next_wake_at: now,
            payload: None,
            scope: Some(&["system"]),
            lambda: Some("lib/nightly.js"),
            warm: false,
            locked: false,
        })
        .unwrap();
    }
    let fake = FakeProvider::start(vec![]).await;
    let tui = Tui::start(&home, &fake.base_url, None, 100, 30);
    let screen = tui.wait_for("lambda lib/nightly.js:main failed: Error: the report table");
    assert!(screen.contains("⚠λ"), "the tree marks the agent:\n{screen}");
    assert!(fake.requests().is_empty(), "no model call");
    tui.quit();
}

/// One agent messages another from a chat in the real app: the events
/// pane says who wrote to whom, the tree badges the unread message, and
/// the recipient's inbox view shows it signed and encrypted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_between_agents_in_the_app() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let agents = home.join("data/agents");
    ok(&adf_home(&home, &agents, &["new", "b.adf", "--provider", "anthropic", "--model", "test-model"]));
    for f in ["a.adf", "b.adf"] {
        ok(&adf_home(&home, &agents, &["config", "set", f, "security.level", "2"]));
    }
    ok(&adf_home(&home, &agents, &["config", "set", "b.adf", "triggers.on_inbox.enabled", "false"]));
    let fake = FakeProvider::start(vec![
        Scripted::sse(anthropic_tool(
            "t1",
            "msg_send",
            r#"{"recipient":"b","content":"hello from a","subject":"greeting"}"#,
        )),
        Scripted::sse(anthropic_text(&["Sent."], 5, 2)),
    ])
    .await;
    let base = fake.base_url.clone();
    let phrase = json(&adf_home(&home, &agents, &["identity", "show", "--phrase", "--yes", "--json"]));
    let words = phrase["phrase"].as_str().unwrap().to_string();
    // Showing it on the command line does not count as the app's first run.
    phrase_unseen(&home);
    let home2 = home.clone();
    tokio::task::spawn_blocking(move || {
        let home = home2;
        let mut t = Tui::start(&home, &base, None, 120, 40);
        t.wait_for("adf › a › main");
        // First run: the owner's recovery phrase, once, in a dialog.
        let first = t.wait_for("Recovery phrase, shown this once");
        assert!(first.contains("Your recovery phrase (enter closes)"), "{first}");
        for w in words.split(' ') {
            assert!(first.contains(w), "{w} missing:\n{first}");
        }
        t.send("\r");
        let s = t.wait_gone("Recovery phrase, shown this once");
        assert!(!s.contains(&words), "not in the chat either:\n{s}");
        t.send("i");
        t.send("tell b hello");
        t.send("\r");
        t.wait_for("Sent.");
        let screen = t.wait_for("a → b  (signed, encrypted)");
        assert!(screen.contains("✉1"), "b's unread badge:\n{screen}");
        t.send("\x1b"); // leave the composer
        t.send("\x1b"); // to the fleet tree
        t.send("j");
        t.send("I");
        let screen = t.wait_for("b · inbox (1 unread)");
        assert!(screen.contains("greeting"), "{screen}");
        t.wait_for("signature verified · was encrypted to");
        t.quit();
    })
    .await
    .unwrap();
    let saved = std::fs::read_to_string(home.join("config/identity.json")).unwrap();
    assert!(saved.contains("\"phrase_shown\": true"), "shown once: {saved}");
}

/// A file sealed to someone else (the reference's fresh.adf) says so in
/// the app, and `:claim` re-keys it to this owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_file_offers_to_be_claimed() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let agents = home.join("data/agents");
    fixture_copy(&agents, "fresh.adf");
    let old = json(&adf_home(&home, &agents, &["inspect", "fresh.adf", "--json"]))["did"].as_str().unwrap().to_string();
    let fake = FakeProvider::start(vec![]).await;
    let base = fake.base_url.clone();
    let home2 = home.clone();
    tokio::task::spawn_blocking(move || {
        let mut t = Tui::start(&home2, &base, None, 120, 40);
        t.wait_for("adf › a › main");
        t.send("j");
        t.wait_for("sealed to another owner");
        t.send(":claim\r");
        t.wait_for("claimed: the agent's new DID is did:key:z6Mk");
        t.quit();
    })
    .await
    .unwrap();
    let v = json(&adf_home(&home, &agents, &["inspect", "fresh.adf", "--json"]));
    assert_ne!(v["did"].as_str().unwrap(), old);
    assert_eq!(v["envelopes"][0]["state"], "unlocked");
    let history = v["meta"].as_array().unwrap().iter().find(|m| m["key"] == "adf_did_history").unwrap().clone();
    assert!(history["value"].as_str().unwrap().contains(&old));
}

/// A shared file's credentials open in the app with their password: the
/// scrypt work runs off the app's thread and the install adopts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_a_shared_files_credentials_in_the_app() {
    let dir = tmp();
    let sender = dir.path().join("sender");
    std::fs::create_dir_all(&sender).unwrap();
    ok(&adf_home(&sender, dir.path(), &["new", "shared.adf"]));
    let put = |args: &[&str], input: &str| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_adf"))
            .args(args)
            .current_dir(dir.path())
            .env("ADF_HOME", &sender)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        assert!(c.wait().unwrap().success());
    };
    put(&["credentials", "set", "shared.adf", "svc:token"], "tok-123\n");
    put(&["password", "set", "shared.adf"], "open sesame\n");
    let home = home_with_agent(dir.path());
    let agents = home.join("data/agents");
    std::fs::copy(dir.path().join("shared.adf"), agents.join("shared.adf")).unwrap();
    let ls = json(&adf_home(&home, &agents, &["credentials", "ls", "shared.adf", "--json"]));
    assert_eq!(ls["states"]["credentials"], "locked");
    let fake = FakeProvider::start(vec![]).await;
    let base = fake.base_url.clone();
    let home2 = home.clone();
    tokio::task::spawn_blocking(move || {
        let mut t = Tui::start(&home2, &base, None, 120, 40);
        t.wait_for("adf › a › main");
        t.send("j");
        t.wait_for("adf › shared › main");
        t.send(":unlock\r");
        t.wait_for("Unlock shared's credentials");
        t.send("wrong one\r");
        t.wait_for("not unlocked: wrong password");
        t.send(":unlock\r");
        t.send("open sesame\r");
        t.wait_for("credentials unlocked");
        assert!(!t.screen().contains("open sesame"), "the password is never shown");
        t.quit();
    })
    .await
    .unwrap();
    let ls = json(&adf_home(&home, &agents, &["credentials", "ls", "shared.adf", "--json"]));
    assert_eq!(ls["states"]["credentials"], "unlocked", "this install adopted the credentials");
}

/// Keys and focus in the real app at 80×24: tab visits the panes and never
/// starts writing (nothing reaches the model), help scrolls to its end and
/// `q` closes it, the `:` line and the composer edit like a readline, a tab
/// in the composer types nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_focus_help_and_readline() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let fake = Arc::new(FakeProvider::start(vec![Scripted::sse(anthropic_text(&["Hello back.\n"], 3, 2))]).await);
    let f2 = fake.clone();
    tokio::task::spawn_blocking(move || {
        let mut t = Tui::start(&home, &f2.base_url, None, 80, 24);
        t.wait_for("adf › a › main");
        // Around the panes, typing as we go: nothing is written or sent.
        for _ in 0..3 {
            t.send("\t");
            t.send("hello");
        }
        t.send("\x1b[Z"); // shift-tab
        let s = t.wait_for("press i to write");
        assert!(s.contains("NORMAL"), "{s}");
        assert!(f2.requests().is_empty(), "a key typed in a list reached the model");
        // Help scrolls to its end; q closes it without quitting.
        t.send("?");
        let s = t.wait_for("Keys active now");
        assert!(s.contains("1-20/"), "{s}");
        t.send("G");
        t.wait_for("Delete the word before the cursor");
        t.wait_for("Close");
        t.send("q");
        t.wait_gone("Keys active now");
        // The `:` line: a typo deleted with ctrl-w.
        t.send(":fiels");
        t.send("\x17");
        t.send("files\r");
        t.wait_for("a · files");
        t.send("\x1b");
        // The composer: ctrl-w, ctrl-a, ctrl-e; tab leaves without typing.
        t.send("i");
        t.send("hello wrold");
        t.send("\x17");
        t.send("world");
        t.send("\t");
        t.wait_for("NORMAL");
        t.send("i");
        t.send("\x01> \x05!");
        t.send("\r");
        t.wait_for("Hello back.");
        assert!(t.screen().contains("you  > hello world!"), "{}", t.screen());
        let (_, body) = f2.requests().last().unwrap().clone();
        // One message, exactly what was typed (no tab, nothing from the lists).
        let msgs = body["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 1, "{body}");
        let text = msgs[0]["content"][0]["text"].as_str().unwrap();
        assert!(text.ends_with("] > hello world!"), "{text:?}");
        t.send("\x1b");
        t.quit();
    })
    .await
    .unwrap();
}

/// A self-hosted model (llama.cpp, OpenAI-compatible): the app asks the
/// server for its window, so 589 tokens of its 4,096 read `ctx 14%`. A
/// reply shows while the model writes it (no newline yet), its tokens
/// counting; ctrl-c in the composer interrupts it and the text stays,
/// marked. The agent without a provider says so; the other does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_interrupt_and_context_window() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let agents = home.join("data/agents");
    ok(&adf_home(&home, &agents, &["new", "l.adf", "--provider", "openai", "--model", "local-model"]));
    let props = Scripted::error(200, r#"{"default_generation_settings":{"n_ctx":4096},"total_slots":1}"#);
    let mut slow =
        Scripted::sse(openai_text(&["Thinking about ", "your question ", "slowly and ", "carefully.\n"], 9, 9));
    slow.gap_ms = 900;
    let fake = Arc::new(
        FakeProvider::start(vec![props, Scripted::sse(openai_text(&["Counted ", "tokens.\n"], 580, 9)), slow]).await,
    );
    let f2 = fake.clone();
    tokio::task::spawn_blocking(move || {
        let base = format!("{}/v1", f2.base_url);
        let env = [("OPENAI_API_KEY", "sk-local"), ("OPENAI_BASE_URL", base.as_str())];
        let mut t = Tui::start_with(&home, &env, &[], 120, 40);
        // a.adf has no key for its provider: it says so, naming its file.
        let s = t.wait_for("adf › a › main");
        assert!(s.contains("a.adf has no anthropic API key"), "{s}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while f2.requests().is_empty() {
            assert!(Instant::now() < deadline, "the server was never asked for its window");
            std::thread::sleep(Duration::from_millis(20));
        }
        t.send("j");
        let s = t.wait_for("adf › l › main");
        assert!(!s.contains("API key"), "l has its provider:\n{s}");
        t.send("i");
        t.send("count\r");
        t.wait_for("Counted tokens.");
        t.wait_for("ctx 14%");
        t.send("think\r");
        let s = t.wait_for("Thinking about your question");
        assert!(!s.contains("carefully"), "shown before the reply ends:\n{s}");
        let counting = s.split(" · ~").nth(1).and_then(|r| r.split(' ').next()?.parse::<u64>().ok());
        assert!(counting.is_some_and(|n| n > 589), "tokens count while streaming:\n{s}");
        t.send("\x03"); // ctrl-c, in the composer
        let s = t.wait_for("[interrupted");
        assert!(s.contains("Thinking about your question"), "the text stays:\n{s}");
        t.send("\x1b");
        t.quit();
    })
    .await
    .unwrap();
}

/// `n` asks a name, a provider and a model and names the file after the
/// agent; `:rename` renames it; `:config` opens its config in the editor
/// and an invalid one goes back to the editor with the problems, never
/// into the file; a stopped agent is named, never shown by id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_agent_rename_and_config_in_the_editor() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let editor = dir.path().join("editor.sh");
    let d = dir.path().display().to_string();
    script(
        &editor,
        &format!(
            "#!/bin/sh\nn=$(cat '{d}/edits' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '{d}/edits'\n\
             cp \"$1\" '{d}/seen-'$n.json\n\
             if [ $n = 1 ]; then sed -i 's/\"description\": \"[^\"]*\"/\"description\": 42/' \"$1\"; \
             else sed -i -e '/^\\/\\//d' -e 's/\"description\": 42/\"description\": \"edited in the app\"/' \"$1\"; fi\n"
        ),
    );
    let fake = FakeProvider::start(vec![]).await;
    let base = fake.base_url.clone();
    let home2 = home.clone();
    let dir2 = dir.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut t = Tui::start(&home2, &base, Some(&editor), 120, 40);
        t.wait_for("adf › a › main");
        t.send("n");
        t.wait_for("New agent");
        t.send("scout");
        t.send("\t");
        t.wait_for("[anthropic]");
        t.send("\r");
        t.wait_for("created scout (scout.adf, anthropic)");
        t.wait_for("adf › scout › main");
        let file = home2.join("data/agents/scout.adf");
        assert_eq!(sql(&file, "SELECT json_extract(config_json, '$.model.provider') FROM adf_config"), "anthropic");
        assert_eq!(
            sql(&file, "SELECT json_extract(config_json, '$.model.model_id') FROM adf_config"),
            "claude-sonnet-4-5"
        );
        t.send(":rename scouty\r");
        t.wait_for("scout is now scouty (the file keeps its name)");
        t.wait_for("adf › scouty › main");
        assert_eq!(sql(&file, "SELECT json_extract(config_json, '$.name') FROM adf_config"), "scouty");
        t.send(":config\r");
        t.wait_for("scouty: config saved");
        let second = std::fs::read_to_string(dir2.join("seen-2.json")).unwrap();
        assert!(second.starts_with("// adf: this config was NOT saved"), "{second}");
        assert!(second.contains("description"), "{second}");
        assert_eq!(
            sql(&file, "SELECT json_extract(config_json, '$.description') FROM adf_config"),
            "edited in the app"
        );
        // Stopped, then written to: the agent is named.
        t.send("x");
        t.wait_for("· off ·");
        t.send("i");
        t.send("hello\r");
        let s = t.wait_for("scouty has stopped; s starts it");
        let id = sql(&file, "SELECT json_extract(config_json, '$.id') FROM adf_config");
        assert!(!s.contains(&id), "{s}");
        t.send("\x1b");
        t.quit();
    })
    .await
    .unwrap();
}

/// `--ascii` leaves no glyph outside ASCII; under NO_COLOR the selected
/// row is reverse video.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ascii_mode_and_no_color() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let fake = FakeProvider::start(vec![]).await;
    let base = fake.base_url.clone();
    tokio::task::spawn_blocking(move || {
        let env = [("ANTHROPIC_API_KEY", "sk-test"), ("ANTHROPIC_BASE_URL", base.as_str())];
        let mut t = Tui::start_with(&home, &env, &["--ascii"], 80, 24);
        let s = t.wait_for("adf > a > main");
        assert!(s.is_ascii(), "{s}");
        t.send("?");
        let s = t.wait_for("Keys active now");
        assert!(s.is_ascii(), "{s}");
        t.send("\x1b");
        t.quit();
        let env = [("ANTHROPIC_API_KEY", "sk-test"), ("ANTHROPIC_BASE_URL", base.as_str()), ("NO_COLOR", "1")];
        let t = Tui::start_with(&home, &env, &[], 80, 24);
        let s = t.wait_for("adf › a › main");
        let row = s.lines().position(|l| l.contains("● a ")).unwrap_or_else(|| panic!("{s}")) as u16;
        {
            let p = t.parser.lock().unwrap();
            let cell = p.screen().cell(row, 3).unwrap();
            assert!(cell.inverse(), "the selected agent is reverse video:\n{s}");
            assert_eq!(cell.bgcolor(), vt100::Color::Default, "and no colour");
        }
        t.quit();
    })
    .await
    .unwrap();
}

/// While the app runs the fleet, CLI commands on its files go through the
/// app's control API (named in the files' lock records) instead of failing
/// with "held by another adf process"; a hangup in the middle of a turn
/// closes every file cleanly within a couple of seconds: the turn
/// checkpointed as interrupted, the clean-close marker written, no sidecar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_goes_through_the_app_and_a_hangup_closes_cleanly() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let mut slow = Scripted::sse(anthropic_text(&["never ", "finished"], 3, 2));
    slow.pause_ms = 20_000;
    let fake = Arc::new(
        FakeProvider::start(vec![Scripted::sse(anthropic_text(&["Through ", "the app.\n"], 3, 2)), slow]).await,
    );
    let f2 = fake.clone();
    tokio::task::spawn_blocking(move || {
        let base = f2.base_url.clone();
        let agents = home.join("data/agents");
        let file = agents.join("a.adf");
        let mut t = Tui::start(&home, &base, None, 120, 40);
        t.wait_for("adf › a › main");
        let cli = |args: &[&str], stdin: Option<&[u8]>| {
            let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_adf"));
            cmd.args(args)
                .current_dir(&agents)
                .env("ADF_HOME", &home)
                .env_remove("ADF_DAEMON_URL")
                .stdin(if stdin.is_some() { std::process::Stdio::piped() } else { std::process::Stdio::null() })
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            let mut child = cmd.spawn().unwrap();
            if let Some(i) = stdin {
                child.stdin.take().unwrap().write_all(i).unwrap();
            }
            child.wait_with_output().unwrap()
        };
        let lock = std::fs::read_to_string(agents.join("a.adf.lock")).unwrap();
        assert!(lock.contains("\"api\":\"http://127.0.0.1:"), "{lock}");
        ok(&cli(&["config", "set", "a.adf", "description", "set while the app runs"], None));
        assert_eq!(ok(&cli(&["config", "get", "a.adf", "description"], None)).trim(), "set while the app runs");
        ok(&cli(&["files", "put", "a.adf", "notes/cli.md", "-"], Some(b"from the shell\n")));
        assert_eq!(ok(&cli(&["files", "cat", "a.adf", "notes/cli.md"], None)), "from the shell\n");
        ok(&cli(&["meta", "set", "a.adf", "x_note", "hello"], None));
        assert_eq!(ok(&cli(&["meta", "get", "a.adf", "x_note"], None)).trim(), "hello");
        // A chat on the file streams through the app, which shows it too.
        let reply = ok(&cli(&["chat", "a.adf", "hi", "from", "the", "shell"], None));
        assert_eq!(reply.trim(), "Through the app.");
        t.wait_for("Through the app.");
        // A turn in flight when the terminal goes away.
        t.send("i");
        t.send("a long one");
        t.send("\r");
        let deadline = Instant::now() + Duration::from_secs(20);
        while f2.requests().len() < 2 {
            assert!(Instant::now() < deadline, "the second turn never reached the model");
            std::thread::sleep(Duration::from_millis(20));
        }
        let pid = t.child.process_id().unwrap() as i32;
        let hup = Instant::now();
        unsafe { libc::kill(pid, libc::SIGHUP) };
        loop {
            if t.child.try_wait().unwrap().is_some() {
                break;
            }
            assert!(hup.elapsed() < Duration::from_secs(5), "the app did not end on SIGHUP");
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("closed {:?} after SIGHUP", hup.elapsed());
        for s in ["-wal", "-shm", ".lock"] {
            let side = agents.join(format!("a.adf{s}"));
            assert!(!side.exists(), "{} left behind", side.display());
        }
        let c = rusqlite::Connection::open(&file).unwrap();
        let marker: Option<String> =
            c.query_row("SELECT value FROM adf_meta WHERE key = 'adf_clean_close'", [], |r| r.get(0)).ok();
        assert!(marker.is_some(), "no clean-close marker");
        let cp: String = c
            .query_row("SELECT value FROM adf_meta WHERE key = 'adf_runtime_turn_checkpoint'", [], |r| r.get(0))
            .unwrap_or_default();
        assert!(cp.contains("\"interrupted\""), "{cp}");
    })
    .await
    .unwrap();
}

/// `adf DIR` opens the app on that folder instead of the default fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_opens_a_folder_named_on_the_command_line() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let other = dir.path().join("elsewhere");
    std::fs::create_dir_all(&other).unwrap();
    ok(&adf_home(&home, &other, &["new", "solo.adf", "--provider", "anthropic", "--model", "m"]));
    tokio::task::spawn_blocking(move || {
        let env = [("ANTHROPIC_API_KEY", "sk-test")];
        let path = other.display().to_string();
        let t = Tui::start_with(&home, &env, &[path.as_str()], 120, 40);
        let screen = t.wait_for("adf › solo › main");
        assert!(screen.contains("1 agent ·"), "only the folder's agent: {screen}");
        t.quit();
    })
    .await
    .unwrap();
}

/// `q` with a turn running asks first and says how to keep agents running;
/// `adf --daemon` starts a daemon for the fleet in the background and
/// attaches, so the turn finishes after the app is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quit_asks_while_turns_run_and_adf_daemon_keeps_them_running() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let mut slow = Scripted::sse(anthropic_text(&["cut ", "short"], 3, 2));
    slow.pause_ms = 20_000;
    let mut later = Scripted::sse(anthropic_text(&["Finished ", "after the app left.\n"], 3, 2));
    later.pause_ms = 2_000;
    let fake = Arc::new(FakeProvider::start(vec![slow, later]).await);
    let f2 = fake.clone();
    tokio::task::spawn_blocking(move || {
        let base = f2.base_url.clone();
        let env = [("ANTHROPIC_API_KEY", "sk-test"), ("ANTHROPIC_BASE_URL", base.as_str())];
        let mut t = Tui::start_with(&home, &env, &[], 120, 40);
        t.wait_for("adf --daemon");
        t.send("i");
        t.send("a long job");
        t.send("\r");
        t.send("\x1b");
        while f2.requests().is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
        t.send("q");
        t.wait_for("1 turn is running: quitting interrupts it");
        assert!(t.child.try_wait().unwrap().is_none(), "the first q only asks");
        t.quit();
        // In a daemon of its own: quitting the app leaves the turn running.
        let mut d = Tui::start_with(&home, &env, &["--daemon"], 120, 40);
        d.wait_for("attached to the daemon");
        d.send("i");
        d.send("take your time");
        d.send("\r");
        d.send("\x1b");
        while f2.requests().len() < 2 {
            std::thread::sleep(Duration::from_millis(20));
        }
        d.quit();
        let file = home.join("data/agents/a.adf");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = adf::store::Store::open_read_only(&file).unwrap();
            let done = s.loop_rows(None).unwrap().iter().any(|r| r.content.to_string().contains("after the app left"));
            s.close().unwrap();
            if done {
                break;
            }
            assert!(Instant::now() < deadline, "the turn did not finish after the app left");
            std::thread::sleep(Duration::from_millis(100));
        }
        let info = std::fs::read_to_string(home.join("data/agents/.daemon.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&info).unwrap();
        unsafe { libc::kill(v["pid"].as_i64().unwrap() as i32, libc::SIGTERM) };
    })
    .await
    .unwrap();
}

/// `:connect` connects a local model server: an OpenAI-compatible base
/// URL with no key (llama.cpp, vLLM, LM Studio); an agent without a
/// provider takes it up and talks at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_a_local_model_server_without_a_key() {
    let dir = tmp();
    let home = dir.path().join("home");
    let agents = home.join("data/agents");
    std::fs::create_dir_all(&agents).unwrap();
    ok(&adf_home(&home, &agents, &["new", "l.adf"]));
    ok(&adf_home(&home, &agents, &["identity", "show", "--phrase", "--yes", "--json"]));
    let fake =
        Arc::new(FakeProvider::start(vec![Scripted::sse(openai_text(&["Local ", "model here.\n"], 3, 2))]).await);
    let f2 = fake.clone();
    tokio::task::spawn_blocking(move || {
        let url = format!("{}/v1", f2.base_url);
        let mut t = Tui::start_with(&home, &[], &[], 120, 40);
        t.wait_for("adf › l › main");
        t.send(":connect\r");
        t.wait_for("Connect a provider");
        for _ in 0..3 {
            t.send("\t");
        }
        t.wait_for("OpenAI-compatible base URL");
        t.send(&url);
        t.send("\r");
        t.wait_for("local connected");
        let settings = std::fs::read_to_string(home.join("config/settings.json")).unwrap();
        assert!(settings.contains("\"local\"") && settings.contains(&url), "{settings}");
        t.send("i");
        t.send("hello");
        t.send("\r");
        t.wait_for("model here.");
        let (headers, body) = f2.requests().last().unwrap().clone();
        assert!(headers.get("authorization").is_none(), "no key was given, none is sent");
        assert_eq!(body["model"], "local");
        t.send("\x1b");
        t.quit();
    })
    .await
    .unwrap();
}

/// `n`, then "clone" and a source path: a copy of an agent with its own
/// identity, named as typed, in the fleet folder and the tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_agent_as_a_clone_in_the_app() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let fake = FakeProvider::start(vec![]).await;
    let base = fake.base_url.clone();
    let home2 = home.clone();
    tokio::task::spawn_blocking(move || {
        let mut t = Tui::start(&home2, &base, None, 120, 40);
        t.wait_for("adf › a › main");
        t.send("n");
        t.wait_for("New agent");
        t.send("twin");
        for _ in 0..3 {
            t.send("\t");
        }
        t.send("\x1b[C");
        t.send("\x1b[C");
        t.wait_for("[clone]");
        t.send("\t");
        t.send("a.adf");
        t.send("\r");
        t.wait_for("created twin (twin.adf");
        t.wait_for("adf › twin › main");
        let (src, twin) = (home2.join("data/agents/a.adf"), home2.join("data/agents/twin.adf"));
        let did = |p: &Path| sql(p, "SELECT value FROM adf_meta WHERE key = 'adf_did'");
        assert_ne!(did(&twin), did(&src), "a fresh identity");
        assert_eq!(sql(&twin, "SELECT scope FROM adf_attestations WHERE role = 'clone'"), did(&src));
        assert_eq!(sql(&twin, "SELECT json_extract(config_json, '$.name') FROM adf_config"), "twin");
        t.quit();
    })
    .await
    .unwrap();
}

/// `:mcp_add` in the app adds a server (connected first, in the
/// background), the view shows it live with its tool, `r` allows the tool,
/// `R` restarts the server and `D` removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_servers_in_the_app() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let agents = home.join("data/agents");
    let home2 = home.clone();
    tokio::task::spawn_blocking(move || {
        let home = home2;
        let mut t = Tui::start(&home, "http://127.0.0.1:9", None, 120, 40);
        t.wait_for("adf › a › main");
        t.send(":");
        t.send(&format!("mcp_add {} mcp serve --echo as echo", env!("CARGO_BIN_EXE_adf")));
        t.send("\r");
        t.wait_for("added echo: 1 tools");
        let s = t.wait_for("echo (stdio) connected");
        assert!(s.contains("on  vis ask [new]"), "{s}");
        t.send("j");
        t.send("r");
        t.wait_for("restricted → false done");
        let s = t.wait_for("on  vis ok");
        assert!(!s.contains("[new]"), "reviewed:\n{s}");
        t.send("R");
        t.wait_for("echo: connected, 1 tools");
        t.send("D");
        t.wait_for("removed echo and its 1 tools");
        t.wait_for("No MCP servers");
        t.quit();
    })
    .await
    .unwrap();
    let cfg = json(&adf_home(&home, &agents, &["config", "get", "a.adf", "--json"]));
    assert!(!cfg.to_string().contains("mcp_echo_"), "{cfg}");
}

/// `K` lists the agent's skills in the app; `m` mutes one (the file's
/// `skills.muted`) and `m` again offers it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_in_the_app() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let agents = home.join("data/agents");
    ok(&adf(
        &home,
        &["files", "put", "data/agents/a.adf", "skills/refunds/SKILL.md", "-"],
        Some(b"---\nname: refunds\ndescription: Handle refund requests.\n---\nbody"),
    ));
    let home2 = home.clone();
    tokio::task::spawn_blocking(move || {
        let home = home2;
        let mut t = Tui::start(&home, "http://127.0.0.1:9", None, 120, 40);
        t.wait_for("adf › a › main");
        t.send("K");
        let s = t.wait_for("a · skills (1)");
        assert!(s.contains("Handle refund requests."), "{s}");
        t.send("m");
        t.wait_for("refunds muted");
        t.wait_for("(muted)");
        t.send("m");
        t.wait_for("refunds offered again");
        t.quit();
    })
    .await
    .unwrap();
    let muted = json(&adf_home(&home, &agents, &["config", "get", "a.adf", "skills", "--json"]));
    assert_eq!(muted["muted"], serde_json::json!([]), "{muted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_loops_in_the_app() {
    // Issue 18 in the real binary: :loop makes a loop from a template, ]
    // shows it, a message there runs its own turn (its rows, not main's),
    // :loop pause and :loop rm act on it.
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let agents = home.join("data/agents");
    let fake = FakeProvider::start(vec![Scripted::sse(anthropic_text(&["Objection: no deadline."], 5, 4))]).await;
    let (home2, base) = (home.clone(), fake.base_url.clone());
    tokio::task::spawn_blocking(move || {
        let home = home2;
        let mut t = Tui::start(&home, &base, None, 120, 40);
        t.wait_for("adf › a › main");
        // The context view: what takes the space of main's next call.
        t.send(":");
        t.send("context\r");
        let s = t.wait_for("a · main · context");
        assert!(s.contains("window unknown") && s.contains("system prompt text"), "{s}");
        t.send(":");
        t.send("chat\r");
        t.send(":");
        t.send("loop critic crit\r");
        t.wait_for("created loop crit");
        t.send("]");
        t.wait_for("adf › a › crit");
        t.wait_for("a · crit");
        t.send("i");
        t.send("Review the plan\r");
        let s = t.wait_for("Objection: no deadline.");
        assert!(s.contains("Review the plan"), "{s}");
        t.send("\x1b");
        t.send(":");
        t.send("loop pause\r");
        t.wait_for("loop crit: paused");
        t.send(":");
        t.send("loop rm\r");
        t.wait_for("deleted loop crit");
        t.wait_for("adf › a › main");
        t.quit();
    })
    .await
    .unwrap();
    let (_, body) = &fake.requests()[0];
    assert!(body["system"].to_string().contains("Side loop: crit"), "the side loop's own prompt");
    let c = rusqlite::Connection::open_with_flags(agents.join("a.adf"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let main_rows: i64 = c.query_row("SELECT count(*) FROM adf_loop", [], |r| r.get(0)).unwrap();
    assert_eq!(main_rows, 0, "main's loop untouched");
    let archived: i64 =
        c.query_row("SELECT count(*) FROM adf_audit WHERE source = 'loop:crit'", [], |r| r.get(0)).unwrap();
    assert_eq!(archived, 1, "the deleted loop's stream is in the archive");
}

/// Staying in control in the real app (issue 19): the burn leaderboard,
/// why, logs, the approvals queue answered with a grant that then covers
/// the next call, and the grants view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burn_why_logs_triage_and_grants_in_the_app() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let call = |id: &str, v: &str| {
        Scripted::sse(anthropic_tool(id, "sys_update_config", &format!(r#"{{"path":"description","value":"{v}"}}"#)))
    };
    let fake = Arc::new(
        FakeProvider::start(vec![
            Scripted::sse(anthropic_text(&["Warm ", "reply.\n"], 1200, 300)),
            call("toolu_1", "one"),
            Scripted::sse(anthropic_text(&["First change made.\n"], 5, 2)),
            call("toolu_2", "two"),
            Scripted::sse(anthropic_text(&["Second change made.\n"], 5, 2)),
        ])
        .await,
    );
    let base = fake.base_url.clone();
    tokio::task::spawn_blocking(move || {
        let mut t = Tui::start(&home, &base, None, 120, 40);
        t.wait_for("adf › a › main");
        t.send("i");
        t.send("hello");
        t.send("\r");
        t.wait_for("Warm reply.");
        t.send("\x1b");
        t.send(":burn\r");
        let s = t.wait_for("Burn · ");
        assert!(s.contains("TOK/MIN") && s.contains("1.5k"), "{s}");
        t.send(":why\r");
        t.wait_for("a · why");
        t.send(":logs\r");
        t.wait_for("a · logs (");
        t.send("t");
        t.wait_for("a · tasks (");
        // An approval, answered from the queue with a grant.
        t.send("i");
        t.send("change it");
        t.send("\r");
        t.wait_for("approval · sys_update_config");
        t.send("\x1b");
        t.send(":approvals\r");
        t.wait_for("Waiting on you (1)");
        t.send(" ");
        t.wait_for("1 marked");
        t.send(":grant 30m\r");
        t.send(":chat\r");
        t.wait_for("First change made.");
        // The next call of that tool runs without asking: the grant covers it.
        t.send("i");
        t.send("change it again");
        t.send("\r");
        t.wait_for("Second change made.");
        assert!(!t.screen().contains("approval · sys_update_config"), "{}", t.screen());
        t.send("\x1b");
        t.send(":grants\r");
        let s = t.wait_for("a · grants (1)");
        assert!(s.contains("sys_update_config") && s.contains(" min "), "{s}");
        t.quit();
        let file = home.join("data/agents/a.adf");
        assert_eq!(sql(&file, "SELECT CAST(uses AS TEXT) FROM adfrs_grants"), "1");
        assert_eq!(sql(&file, "SELECT json_extract(config_json, '$.description') FROM adf_config"), "two");
    })
    .await
    .unwrap();
}

/// Attached with an observer's token, the app says so and hides what it
/// may not do; the daemon refuses the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attached_with_an_observer_token_the_app_reads_only() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let agents = home.join("data/agents");
    let minted = json(&adf_home(&home, &agents, &["token", "new", "--role", "observer", "--json"]));
    let token = minted["token"].as_str().unwrap().to_string();
    let (mut daemon, _, _) = spawn_daemon(&home, &[], &[]);
    let h = home.clone();
    let result = tokio::task::spawn_blocking(move || {
        let mut t = Tui::start_with(&h, &[("ADF_DAEMON_TOKEN", token.as_str())], &[], 120, 40);
        t.wait_for("with an observer token");
        t.wait_for("read only: this app's token is an observer's");
        t.send("x");
        t.wait_for("stop needs the owner's");
        t.send("\x10");
        t.send("stop");
        let s = t.wait_for("> stop");
        assert!(!s.contains("Turn the selected agent off"), "hidden from the palette: {s}");
        t.send("\x1b");
        t.quit();
    })
    .await;
    let _ = daemon.kill();
    let _ = daemon.wait();
    result.unwrap();
}

/// A Telegram channel connected from the real app: the token typed masked
/// (`:channel_add telegram`), sealed through the app's API; the agent's
/// adapter polls a fake Bot API on loopback and `:channels` shows it
/// connected as the bot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_telegram_channel_shows_connected_in_the_app() {
    async fn bot(axum::extract::Path((_, method)): axum::extract::Path<(String, String)>) -> axum::Json<Value> {
        match method.as_str() {
            "getMe" => axum::Json(json!({"ok": true, "result": {"id": 1, "is_bot": true, "username": "scout_bot"}})),
            "getUpdates" => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                axum::Json(json!({"ok": true, "result": []}))
            }
            _ => axum::Json(json!({"ok": false, "error_code": 404, "description": "Not Found"})),
        }
    }
    let app = axum::Router::new().route("/{token}/{method}", axum::routing::post(bot));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let agents = home.join("data/agents");
    // The server the channel talks to (the token is typed in the app).
    ok(&adf_home(
        &home,
        &agents,
        &[
            "config",
            "set",
            "a.adf",
            "adapters.telegram",
            &json!({"enabled": false, "config": {"api_url": api, "poll_timeout_s": 1}}).to_string(),
        ],
    ));
    let h = home.clone();
    tokio::task::spawn_blocking(move || {
        let mut t = Tui::start_with(&h, &[], &[], 120, 40);
        t.wait_for("adf › a › main");
        t.send(":channel_add telegram\r");
        t.wait_for("Connect telegram for a");
        t.send("1:TOKEN");
        let s = t.wait_for("bot token: •••••••");
        assert!(!s.contains("1:TOKEN"), "typed masked: {s}");
        t.send("\r");
        let s = t.wait_for("@scout_bot");
        assert!(s.contains("telegram") && s.contains("connected"), "{s}");
        t.quit();
        let file = h.join("data/agents/a.adf");
        assert_eq!(
            sql(&file, "SELECT CAST(json_extract(config_json, '$.adapters.telegram.enabled') AS TEXT) FROM adf_config"),
            "1"
        );
        let raw = std::fs::read(&file).unwrap();
        assert!(!raw.windows(7).any(|w| w == b"1:TOKEN"), "sealed, not in clear");
    })
    .await
    .unwrap();
}

/// An email channel connected from the real app against the real mail
/// servers of `.ci/mail.sh` (`ADF_MAIL_CA`): `:channel_add email ADDRESS
/// IMAP SMTP`, the password typed masked; `:channels` shows it connected
/// as the address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Dovecot and the SMTP server: see .ci/mail.sh and ADF_MAIL_CA"]
async fn an_email_channel_connects_from_the_app() {
    let ca = std::env::var("ADF_MAIL_CA").expect("ADF_MAIL_CA (run .ci/mail.sh DIR)");
    let pem = std::fs::read_to_string(ca).unwrap();
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let agents = home.join("data/agents");
    // The test CA (the address and servers are typed in the app).
    ok(&adf_home(
        &home,
        &agents,
        &[
            "config",
            "set",
            "a.adf",
            "adapters.email",
            &json!({"enabled": false, "config": {"ca_pem": pem}}).to_string(),
        ],
    ));
    let h = home.clone();
    tokio::task::spawn_blocking(move || {
        let mut t = Tui::start_with(&h, &[], &[], 120, 40);
        t.wait_for("adf › a › main");
        t.send(":channel_add email not-an-address\r");
        t.wait_for("is not an email address");
        t.send(":channel_add email ann@adf.test imaps://127.0.0.1:10993 smtp://127.0.0.1:10587\r");
        t.wait_for("Connect email as ann@adf.test for a");
        t.send("pw-ann");
        let s = t.wait_for("password: ••••••");
        assert!(!s.contains("pw-ann"), "typed masked: {s}");
        t.send("\r");
        let s = t.wait_for("connected");
        assert!(s.contains("email") && s.contains("ann@adf.test"), "{s}");
        t.quit();
        let file = h.join("data/agents/a.adf");
        assert_eq!(
            sql(
                &file,
                "SELECT CAST(json_extract(config_json, '$.adapters.email.config.imap.port') AS TEXT) FROM adf_config"
            ),
            "10993"
        );
        let raw = std::fs::read(&file).unwrap();
        assert!(!raw.windows(6).any(|w| w == b"pw-ann"), "sealed, not in clear");
    })
    .await
    .unwrap();
}

/// `:compute` in the real app: the agent's targets and its last commands
/// with their exit codes, read from its file (issue 22).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compute_panel_lists_the_last_commands() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let agents = home.join("data/agents");
    ok(&adf_home(&home, &agents, &["config", "set", "a.adf", "compute", r#"{"enabled": true, "host_access": true}"#]));
    ok(&adf_home(&home, &agents, &["compute", "host", "on"]));
    {
        let c = rusqlite::Connection::open(agents.join("a.adf")).unwrap();
        c.execute(
            "INSERT INTO adf_logs (level, origin, event, message, created_at) VALUES ('warn', 'compute', 'exec', 'isolated: exit 3 in 17 ms: make test', 1767225600000)",
            [],
        )
        .unwrap();
    }
    let h = home.clone();
    tokio::task::spawn_blocking(move || {
        let mut t = Tui::start_with(&h, &[], &[], 120, 40);
        t.wait_for("adf › a › main");
        t.send(":compute\r");
        let s = t.wait_for("make test");
        assert!(s.contains("a · compute") && s.contains("isolated · shared · host"), "{s}");
        assert!(s.contains("isolated") && s.contains(" 3 ") && s.contains("17"), "{s}");
        assert!(s.contains("shot     none yet") && !s.contains("▀"), "{s}");
        t.quit();
    })
    .await
    .unwrap();
}

/// The compute panel draws the agent's newest screenshot in the terminal:
/// half blocks in a terminal that names no graphics protocol (`xterm` here),
/// so over SSH and in tmux too; `ADF_IMAGES=off` draws none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compute_panel_draws_the_newest_screenshot() {
    let dir = tmp();
    let home = home_with_agent(dir.path());
    let agents = home.join("data/agents");
    ok(&adf_home(&home, &agents, &["config", "set", "a.adf", "compute", r#"{"enabled": true}"#]));
    {
        // A real PNG: a white page with a dark bar, as a browser shot.
        let png = png_of(320, 200, |_, y| if y < 40 { [30, 30, 60] } else { [250, 250, 250] });
        let mut s = adf::store::Store::open(agents.join("a.adf")).unwrap();
        s.file_write(adf::store::Caller::Owner, "screenshots/page.png", &png, &Default::default()).unwrap();
        s.close().unwrap();
    }
    let h = home.clone();
    tokio::task::spawn_blocking(move || {
        let mut t = Tui::start_with(&h, &[], &[], 120, 40);
        t.wait_for("adf › a › main");
        t.send(":compute\r");
        let s = t.wait_for("screenshots/page.png");
        assert!(!s.contains("not drawn"), "{s}");
        // The page's colours, drawn in true colour under the panel's text:
        // the dark bar above the white page.
        let deadline = Instant::now() + Duration::from_secs(10);
        let cells = loop {
            let cells = t.rgb_cells();
            if cells.iter().filter(|c| c.2 == (250, 250, 250)).count() > 200 || Instant::now() > deadline {
                break cells;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let near = |c: (u8, u8, u8), w: (u8, u8, u8)| {
            c.0.abs_diff(w.0) < 12 && c.1.abs_diff(w.1) < 12 && c.2.abs_diff(w.2) < 12
        };
        let dark: Vec<u16> = cells.iter().filter(|x| near(x.2, (30, 30, 60))).map(|x| x.0).collect();
        let light: Vec<u16> = cells.iter().filter(|x| near(x.2, (250, 250, 250))).map(|x| x.0).collect();
        assert!(dark.len() > 50 && light.len() > 200, "dark {} light {}: {s}", dark.len(), light.len());
        assert!(dark.iter().max() <= light.iter().min().map(|m| m + 1).as_ref(), "the bar is on top");
        let text_row = s.lines().position(|l| l.contains("screenshots/page.png")).unwrap() as u16;
        assert!(dark.iter().all(|r| *r > text_row), "the picture is under the text");
        t.quit();
        let mut t = Tui::start_with(&h, &[("ADF_IMAGES", "off")], &[], 120, 40);
        t.wait_for("adf › a › main");
        t.send(":compute\r");
        t.wait_for("screenshots/page.png");
        std::thread::sleep(Duration::from_millis(500));
        assert!(!t.rgb_cells().iter().any(|c| c.2 == (250, 250, 250)), "no picture with ADF_IMAGES=off");
        t.quit();
    })
    .await
    .unwrap();
}
