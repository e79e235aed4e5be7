//! The terminal app without a terminal: frames rendered into ratatui's test
//! backend from real agent files (insta snapshots at 80×24 and 120×40), and
//! key sequences driven through the app's state machine (keys in, state and
//! actions out).

mod common;

use std::path::Path;
use std::sync::Arc;

use adf::protocol::{Command, Envelope};
use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::executor::{Absent, Executor};
use adf::runtime::fleet::AgentInfo;
use adf::store::files::WriteOptions;
use adf::store::{Caller, NewAgent, Store};
use adf::tui::app::{Action, App, Focus, MainView, Overlay};
use adf::tui::chat::{ASCII, UTF8};
use adf::tui::keys::Keymap;
use adf::tui::theme::Theme;
use adf::tui::ui;
use common::*;
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use serde_json::json;

/// Create an agent at `rel` and run `turns` (message, replies) through the
/// real executor with the scripted model and an absent owner.
async fn agent(root: &Path, rel: &str, name: &str, turns: Vec<(&str, Vec<Reply>)>) -> AgentInfo {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let (store, _) = Store::create(
        &path,
        &NewAgent { name: Some(name), provider: Some("scripted"), model: Some("mock-1"), ..Default::default() },
    )
    .unwrap();
    let replies: Vec<Reply> = turns.iter().flat_map(|(_, r)| r.clone()).collect();
    let mut ex = Executor::new(store, Arc::new(Scripted::new(replies)), Bus::new(), Arc::new(Absent)).unwrap();
    for (msg, _) in &turns {
        ex.chat(msg).await.unwrap();
    }
    let id = ex.agent_id().to_string();
    let handle = ex.store.meta_get("adf_handle").unwrap().map(|m| m.value).unwrap_or_default();
    ex.store.close().unwrap();
    AgentInfo { id, name: name.into(), handle, path }
}

async fn fleet(root: &Path) -> Vec<AgentInfo> {
    let research = agent(
        root,
        "research/research.adf",
        "research",
        vec![
            (
                "Summarise today's tickets into notes/today.md",
                vec![
                    Reply::Tools(vec![(
                        "fs_write".into(),
                        json!({"mode": "write", "path": "notes/today.md", "content": "# Today\n\n- 12 tickets, 3 urgent\n"}),
                    )]),
                    Reply::Text("Done: **12 tickets**, 3 urgent.\n\n```rust\nfn main() { println!(\"hi\"); }\n```\nThe summary is in `notes/today.md`.".into()),
                ],
            ),
            (
                "Raise the turn limit",
                vec![Reply::Tools(vec![(
                    "sys_update_config".into(),
                    json!({"path": "limits.max_active_turns", "value": 20, "_reason": "the nightly batch needs more turns"}),
                )])],
            ),
        ],
    )
    .await;
    let deployer = agent(root, "ops/deployer.adf", "deployer", vec![]).await;
    let scribe = agent(root, "scribe.adf", "scribe", vec![]).await;
    vec![research, deployer, scribe]
}

fn app() -> App {
    App::new(Keymap::load(None).unwrap(), Theme::default_theme(), UTF8)
}

fn render(app: &App, w: u16, h: u16) -> String {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| ui::draw(f, app)).unwrap();
    term.backend().to_string()
}

/// The cells drawn with a true-colour background (a picture in half
/// blocks), as (row, column, colour).
fn rgb_cells(app: &App, w: u16, h: u16) -> Vec<(u16, u16, (u8, u8, u8))> {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| ui::draw(f, app)).unwrap();
    let buf = term.backend().buffer().clone();
    let mut out = Vec::new();
    for y in 0..h {
        for x in 0..w {
            if let ratatui::style::Color::Rgb(r, g, b) = buf[(x, y)].bg {
                out.push((y, x, (r, g, b)));
            }
        }
    }
    out
}

/// Snapshot a screen at both sizes the issue names.
fn both(name: &str, app: &App) {
    insta::assert_snapshot!(format!("{name}_80x24"), render(app, 80, 24));
    insta::assert_snapshot!(format!("{name}_120x40"), render(app, 120, 40));
}

fn key(app: &mut App, code: KeyCode) -> Vec<Action> {
    app.key(KeyEvent::new(code, KeyModifiers::NONE))
}

fn keys(app: &mut App, s: &str) -> Vec<Action> {
    s.chars().flat_map(|c| key(app, KeyCode::Char(c))).collect()
}

fn ctrl(app: &mut App, c: char) -> Vec<Action> {
    app.key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL))
}

/// A fleet with history, one approval waiting (2 min 10 s), research selected.
async fn loaded(root: &Path) -> App {
    let infos = fleet(root).await;
    let mut a = app();
    a.set_agents(infos, root);
    a.sel = a.agents.iter().position(|x| x.info.name == "research").unwrap();
    a.now_ms = a.pending[0].since_ms + 130_000;
    a.focus = Focus::Main;
    a
}

fn event(app: &App, ty: &'static str, agent: &str, at: i64, payload: serde_json::Value) -> Envelope {
    let id = app.agents.iter().find(|a| a.info.name == agent).unwrap().info.id.clone();
    let mut e = Envelope::new(ty, Some(&id), "agent:t1", payload);
    e.timestamp = at;
    e
}

#[tokio::test]
async fn snapshots_of_the_fleet_chat_and_approval() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    assert_eq!(a.pending.len(), 1, "{:?}", a.pending);
    // The approval card, and the tool card collapsed above it.
    both("chat_with_approval", &a);
    // Tool card expanded: select the card and open it.
    a.run("top");
    a.run("down");
    a.run("open");
    both("tool_card_expanded", &a);
    a.focus = Focus::Fleet;
    both("fleet_tree", &a);
}

#[tokio::test]
async fn snapshot_of_a_chat_mid_stream_and_an_error() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    let base = 1_764_547_200_000; // 2025-12-01T00:00:00Z
    for (i, t) in ["Looking at the", " ticket table first.\nThere are ", "12 rows"].iter().enumerate() {
        let e = event(&a, "turn.delta", "research", base + i as i64, json!({"kind": "text", "text": t}));
        a.on_event(&e);
    }
    both("chat_mid_stream", &a);
    let e = event(&a, "llm.failed", "research", base + 5, json!({"error": "401 Unauthorized: invalid x-api-key"}));
    a.on_event(&e);
    both("chat_error", &a);
}

#[tokio::test]
async fn a_failing_lambda_marks_the_agent_until_it_succeeds() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    let base = 1_764_547_200_000;
    let p = json!({"lambda_path": "lib/digest.ts", "function_name": "main", "kind": "system_scope",
                   "error": "TypeError: cannot read property 'rows' of undefined"});
    let e = event(&a, "lambda.failed", "scribe", base, p);
    a.on_event(&e);
    let i = a.agents.iter().position(|x| x.info.name == "scribe").unwrap();
    assert_eq!(
        a.agents[i].lambda_error.as_deref(),
        Some("lib/digest.ts:main: TypeError: cannot read property 'rows' of undefined")
    );
    a.focus = Focus::Fleet;
    both("lambda_failed", &a);
    // A sys_code error the model saw is not the card's business.
    let e = event(&a, "lambda.failed", "scribe", base + 1, json!({"kind": "sys_code", "error": "x"}));
    a.on_event(&e);
    assert!(a.agents[i].lambda_error.as_deref().is_some_and(|m| m.starts_with("lib/digest.ts:main")));
    let e = event(
        &a,
        "lambda.completed",
        "scribe",
        base + 2,
        json!({"lambda_path": "lib/digest.ts", "function_name": "main", "kind": "system_scope"}),
    );
    a.on_event(&e);
    assert_eq!(a.agents[i].lambda_error, None, "cleared when it next succeeds");
}

#[tokio::test]
async fn snapshot_of_an_ask() {
    let dir = tmp();
    let info = agent(
        dir.path(),
        "helper.adf",
        "helper",
        vec![(
            "Plan the trip",
            vec![Reply::Tools(vec![("ask".into(), json!({"question": "Which city first, Oslo or Bergen?"}))])],
        )],
    )
    .await;
    let mut a = app();
    a.set_agents(vec![info], dir.path());
    assert!(a.pending[0].ask);
    a.now_ms = a.pending[0].since_ms + 5_000;
    both("ask", &a);
    // Sending from the composer answers the ask.
    key(&mut a, KeyCode::Char('i'));
    keys(&mut a, "Oslo");
    let acts = key(&mut a, KeyCode::Enter);
    assert!(matches!(&acts[..], [Action::Run(Command::Answer { text, .. })] if text == "Oslo"), "{acts:?}");
}

#[tokio::test]
async fn snapshots_of_files_events_palette_help() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    a.run("files");
    let i = a.files.entries.iter().position(|e| e.path == "notes/today.md").unwrap();
    a.files.sel = i;
    both("files_with_preview", &a);
    let base = 1_764_547_200_000;
    for (i, (ty, p)) in [
        ("tool.started", json!({"name": "fs_write", "input": {"path": "notes/today.md"}})),
        ("tool.completed", json!({"name": "fs_write", "result": "ok"})),
        ("hil.requested", json!({"tool": "sys_update_config"})),
    ]
    .into_iter()
    .enumerate()
    {
        let e = event(&a, ty, "research", base + i as i64 * 1500, p);
        a.on_event(&e);
    }
    a.run("chat");
    a.focus = Focus::Events;
    both("events_pane", &a);
    // enter shows one event in full; any key closes it.
    key(&mut a, KeyCode::Enter);
    assert!(matches!(&a.overlay, Overlay::Event(e) if e.event_type == "hil.requested"));
    both("event_details", &a);
    keys(&mut a, " ");
    // `/` filters the pane by type and text; `o` keeps one agent's events.
    keys(&mut a, "/fs_write");
    key(&mut a, KeyCode::Enter);
    assert_eq!(a.visible_events().len(), 2);
    a.focus = Focus::Main;
    ctrl(&mut a, 'p');
    keys(&mut a, "appr");
    both("palette", &a);
    key(&mut a, KeyCode::Esc);
    keys(&mut a, "?");
    both("help", &a);
}

#[test]
fn snapshot_of_the_first_run_in_ascii() {
    let dir = tmp();
    let mut a = App::new(Keymap::load(None).unwrap(), Theme::default_theme(), ASCII);
    a.set_agents(Vec::new(), dir.path());
    for (w, h) in [(80, 24), (120, 40)] {
        let frame = render(&a, w, h);
        assert!(frame.contains("No agents in the fleet folder yet."));
        assert!(frame.is_ascii(), "nothing but ASCII without a UTF-8 locale:\n{frame}");
        // The fleet folder depends on the machine; the rest is fixed.
        let frame: String = frame.lines().filter(|l| !l.contains('/')).collect::<Vec<_>>().join("\n");
        insta::assert_snapshot!(format!("first_run_{w}x{h}"), frame);
    }
}

#[tokio::test]
async fn keys_drive_the_state_machine() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    a.focus = Focus::Fleet;
    let research = a.sel;
    // j/k move in the tree (research is last: folders sort after the root).
    assert_eq!(research, 2);
    key(&mut a, KeyCode::Char('k'));
    assert_eq!(a.sel, 1);
    key(&mut a, KeyCode::Down);
    key(&mut a, KeyCode::Char('j'));
    assert_eq!(a.sel, research, "stops at the last agent");
    // tab cycles panes; esc goes back to the tree.
    key(&mut a, KeyCode::Tab);
    assert_eq!(a.focus, Focus::Main);
    key(&mut a, KeyCode::Esc);
    assert_eq!(a.focus, Focus::Fleet);
    // i, text, alt-enter, text, enter: one message with a newline.
    key(&mut a, KeyCode::Char('i'));
    assert_eq!(a.focus, Focus::Composer);
    keys(&mut a, "hello");
    a.key(KeyEvent::new(KeyCode::Enter, KeyModifiers::ALT));
    keys(&mut a, "world");
    let acts = key(&mut a, KeyCode::Enter);
    let id = a.agents[research].info.id.clone();
    assert_eq!(
        acts,
        vec![Action::Run(Command::SendChat { agent: id.clone(), r#loop: "main".into(), text: "hello\nworld".into() })]
    );
    assert!(a.composer.is_empty());
    key(&mut a, KeyCode::Esc);
    assert_eq!(a.focus, Focus::Main);
    // r opens the feedback box; enter sends the rejection with it.
    let task = a.pending[0].task_id.clone();
    key(&mut a, KeyCode::Char('r'));
    assert!(matches!(a.overlay, Overlay::Reject { .. }));
    keys(&mut a, "not tonight");
    let acts = key(&mut a, KeyCode::Enter);
    assert_eq!(
        acts,
        vec![Action::Run(Command::Deny {
            agent: id.clone(),
            task_id: task.clone(),
            feedback: Some("not tonight".into())
        })]
    );
    assert!(a.pending.is_empty(), "resolved here, gone here");
    // a / A approve the request (after a refresh finds it again).
    a.refresh_pending();
    let acts = keys(&mut a, "A");
    assert_eq!(acts, vec![Action::Run(Command::Approve { agent: id.clone(), task_id: task, always: true })]);
    assert!(keys(&mut a, "a").is_empty());
    assert_eq!(a.status.as_deref(), Some("nothing waits for approval here"));
    // : runs commands by name or alias; a typo says so.
    keys(&mut a, ":approvals");
    key(&mut a, KeyCode::Enter);
    assert_eq!(a.main, MainView::Approvals);
    keys(&mut a, ":qiut");
    key(&mut a, KeyCode::Enter);
    assert_eq!(a.status.as_deref(), Some("unknown command \"qiut\" (did you mean :quit?)"));
    // The palette runs what it finds.
    ctrl(&mut a, 'p');
    keys(&mut a, "emergency");
    assert_eq!(key(&mut a, KeyCode::Enter), vec![Action::Run(Command::EmergencyStop)]);
    // An approval arriving for an agent not on screen rings the bell;
    // tokens of a call count in that agent's burn and the fleet's.
    let deployer = a.agents.iter().position(|x| x.info.name == "deployer").unwrap();
    let e = event(&a, "hil.requested", "deployer", a.now_ms, json!({"tool": "fs_delete"}));
    assert_eq!(a.on_event(&e), vec![Action::Bell { agent: "deployer".into(), what: "an approval".into() }]);
    let e = event(&a, "hil.requested", "research", a.now_ms, json!({"tool": "fs_delete"}));
    assert!(a.on_event(&e).is_empty(), "no bell for the agent on screen");
    let e = event(&a, "llm.completed", "deployer", a.now_ms, json!({"input_tokens": 900, "output_tokens": 300}));
    a.on_event(&e);
    let (dep_id, res_id) = (a.agents[deployer].info.id.clone(), a.agents[research].info.id.clone());
    assert_eq!((a.burn_per_min(Some(&dep_id)), a.burn_per_min(Some(&res_id)), a.burn_per_min(None)), (1200, 0, 1200));
    assert!(render(&a, 120, 40).contains("1.2k/m"));
    // m edits mind.md; ctrl-c interrupts; s/x start and stop.
    a.run("chat");
    assert_eq!(keys(&mut a, "m"), vec![Action::EditFile { agent: id.clone(), path: "mind.md".into() }]);
    assert_eq!(ctrl(&mut a, 'c'), vec![Action::Run(Command::Interrupt { agent: id.clone() })]);
    assert_eq!(keys(&mut a, "x"), vec![Action::Run(Command::Stop { agent: id.clone() })]);
    assert!(keys(&mut a, "n").is_empty(), "n asks for a name first");
    assert!(matches!(a.overlay, Overlay::NewAgent(_)));
    key(&mut a, KeyCode::Esc);
    // ? shows help; esc (or q) closes it; q quits.
    keys(&mut a, "?");
    assert_eq!(a.overlay, Overlay::Help { scroll: 0 });
    keys(&mut a, "z");
    assert_eq!(a.overlay, Overlay::Help { scroll: 0 }, "other keys leave help up");
    key(&mut a, KeyCode::Esc);
    assert_eq!(a.overlay, Overlay::None);
    keys(&mut a, "q");
    assert!(a.quit);
}

#[tokio::test]
async fn a_key_typed_into_the_app_connects_a_provider() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    let scribe = a.agents.iter().find(|x| x.info.name == "scribe").unwrap().info.id.clone();
    let why = "anthropic: no API key: set ANTHROPIC_API_KEY or add the key to an account in settings.json";
    a.set_unconfigured([(scribe.clone(), why.to_string())].into());
    // Only the agent without a provider says so, naming its file.
    assert!(!render(&a, 80, 24).contains("API key"), "research has its provider");
    a.sel = a.agents.iter().position(|x| x.info.id == scribe).unwrap();
    both("no_provider", &a);
    let frame = render(&a, 80, 24);
    let notice: Vec<&str> = frame.lines().filter(|l| l.contains("scribe.adf") || l.contains(":connect")).collect();
    assert!(frame.contains("scribe.adf has no anthropic API key"), "{frame}");
    assert!(notice.len() <= 2, "two lines at most: {notice:?}");
    keys(&mut a, ":connect");
    key(&mut a, KeyCode::Enter);
    key(&mut a, KeyCode::Tab);
    keys(&mut a, "sk-secret");
    let frame = render(&a, 80, 24);
    assert!(!frame.contains("sk-secret"), "the key is masked");
    assert!(frame.contains("•••••••••"), "{frame}");
    assert_eq!(
        key(&mut a, KeyCode::Enter),
        vec![Action::SaveKey { provider: "openai".into(), key: "sk-secret".into() }]
    );
    assert_eq!(a.overlay, Overlay::None);
}

#[tokio::test]
async fn an_edit_that_raced_the_agent_asks_which_to_keep() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    let id = a.agents[a.sel].info.id.clone();
    let base = a.read_file(&id, "mind.md");
    // Unchanged: nothing to write.
    assert_eq!(a.edited(&id, "mind.md", base.as_deref(), base.clone().unwrap()), None);
    // Changed, file untouched meanwhile: write mine.
    assert_eq!(a.edited(&id, "mind.md", base.as_deref(), "mine".into()), Some("mine".into()));
    // The agent wrote the file meanwhile: both versions, the owner picks.
    let path = a.agents[a.sel].info.path.clone();
    let mut s = Store::open(&path).unwrap();
    s.file_write(Caller::Owner, "mind.md", b"theirs", &WriteOptions::default()).unwrap();
    s.close().unwrap();
    assert_eq!(a.edited(&id, "mind.md", base.as_deref(), "mine".into()), None);
    assert!(matches!(&a.overlay, Overlay::Conflict { theirs, .. } if theirs == "theirs"));
    let acts = keys(&mut a, "m");
    assert_eq!(acts, vec![Action::WriteFile { agent: id, path: "mind.md".into(), content: "mine".into() }]);
}

#[tokio::test]
async fn snapshot_of_an_inbox_and_who_talks_to_whom() {
    let dir = tmp();
    let infos = fleet(dir.path()).await;
    let base = 1_764_547_200_000;
    {
        let scribe = infos.iter().find(|i| i.name == "scribe").unwrap();
        let mut s = Store::open(&scribe.path).unwrap();
        let row = |from: &str,
                   alias: &str,
                   subject: Option<&str>,
                   content: &str,
                   status: &str,
                   meta: serde_json::Value,
                   at: i64| {
            let mut m = serde_json::Map::new();
            for (k, v) in [
                ("from", json!(from)),
                ("sender_alias", json!(alias)),
                ("subject", json!(subject)),
                ("content", json!(content)),
                ("status", json!(status)),
                ("meta", json!(meta.to_string())),
                ("received_at", json!(at)),
                ("source", json!("mesh")),
            ] {
                m.insert(k.into(), v);
            }
            m
        };
        let signed_enc = json!({"message_verified": true, "payload_encrypted": true});
        s.inbox_insert(&row(
            "did:key:z6MkhRPMqo95WVj533Sia67NMwvcbXQqFgNH8MA4NPzX5TNz",
            "research",
            Some("today's tickets"),
            "12 tickets, 3 urgent.\nThe summary is in notes/today.md.",
            "read",
            signed_enc.clone(),
            base,
        ))
        .unwrap();
        s.inbox_insert(&row(
            "did:key:z6MkiycNTBxMZjKxxHhcYykirqjnfvhQc16LjYFHZe2YxJTB",
            "deployer",
            None,
            "Deploy finished: v2.3 is live.",
            "unread",
            signed_enc,
            base + 60_000,
        ))
        .unwrap();
        s.inbox_insert(&row(
            "did:key:z6MkwZ2gf8ZUbVeJSKxJZYTr98cBN1eGdvHBiZx1bXYxXJqY",
            "",
            Some("hello"),
            "Unsigned hello from a stranger.",
            "unread",
            json!({"message_verified": false}),
            base + 120_000,
        ))
        .unwrap();
        s.close().unwrap();
    }
    let mut a = app();
    a.set_agents(infos, dir.path());
    a.sel = a.agents.iter().position(|x| x.info.name == "scribe").unwrap();
    a.now_ms = base + 180_000;
    assert_eq!(a.agents[a.sel].unread, 2, "the tree's badge counts unread messages");
    // `I` opens the inbox, newest first; j moves to the next message.
    a.focus = Focus::Fleet;
    keys(&mut a, "I");
    assert_eq!(a.main, MainView::Inbox);
    assert_eq!(a.inbox.rows.len(), 3);
    keys(&mut a, "j");
    both("inbox", &a);
    // Message events read as who talks to whom.
    for (i, (ty, agent, p)) in [
        ("message.sent", "deployer", json!({"to": "did:key:z6MkiycN", "to_alias": "scribe", "message_id": "m1"})),
        (
            "message.received",
            "scribe",
            json!({"from": "did:key:z6MkiycNTBxMZjKxxHhcYykirqjnfvhQc16LjYFHZe2YxJTB",
            "sender_alias": "deployer", "verified": true, "encrypted": true, "subject": "deploy"}),
        ),
        (
            "message.delivery_failed",
            "research",
            json!({"to": "did:key:z6MkwZ2gf8ZUbVeJSKxJZYTr98cBN1eGdvHBiZx1bXYxXJqY",
            "error": "visibility tier mismatch"}),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let e = event(&a, ty, agent, base + i as i64 * 1000, p);
        a.on_event(&e);
    }
    a.run("chat");
    a.focus = Focus::Events;
    let screen = render(&a, 120, 40);
    assert!(screen.contains("deployer → scribe  delivered"), "{screen}");
    assert!(screen.contains("deployer → scribe  (signed, encrypted)  \"deploy\""), "{screen}");
    assert!(screen.contains("research → z6MkwZ2g…XJqY  failed: visibility tier mismatch"), "{screen}");
    both("events_messages", &a);
}

fn shift_tab(app: &mut App) -> Vec<Action> {
    app.key(KeyEvent::new(KeyCode::BackTab, KeyModifiers::SHIFT))
}

/// Tab and shift-tab visit the panes on screen and never start writing; a
/// key typed in a list goes nowhere; in the composer tab moves on without
/// typing a tab, ctrl-c interrupts, esc leaves.
#[tokio::test]
async fn tab_cycles_panes_and_never_types() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    a.focus = Focus::Fleet;
    let mut seen = Vec::new();
    for _ in 0..3 {
        key(&mut a, KeyCode::Tab);
        seen.push(a.focus);
    }
    assert_eq!(seen, [Focus::Main, Focus::Events, Focus::Fleet]);
    shift_tab(&mut a);
    assert_eq!(a.focus, Focus::Events);
    shift_tab(&mut a);
    assert_eq!(a.focus, Focus::Main);
    // In every list, typing and enter send nothing and write nothing.
    for _ in 0..3 {
        let acts = [keys(&mut a, "hello"), key(&mut a, KeyCode::Enter)].concat();
        assert!(!acts.iter().any(|x| matches!(x, Action::Run(Command::SendChat { .. }))), "{acts:?}");
        assert!(a.composer.is_empty(), "{:?} typed into the composer", a.focus);
        assert_ne!(a.focus, Focus::Composer);
        a.overlay = Overlay::None;
        key(&mut a, KeyCode::Tab);
    }
    // Only i writes; there a tab is not typed, it moves on.
    a.run("chat");
    key(&mut a, KeyCode::Char('i'));
    assert_eq!(a.focus, Focus::Composer);
    keys(&mut a, "ab");
    key(&mut a, KeyCode::Tab);
    assert_eq!(a.composer.lines(), ["ab"], "no tab character");
    assert_ne!(a.focus, Focus::Composer, "tab leaves the composer");
    key(&mut a, KeyCode::Char('i'));
    let id = a.agents[a.sel].info.id.clone();
    assert_eq!(ctrl(&mut a, 'c'), vec![Action::Run(Command::Interrupt { agent: id })]);
    assert_eq!(a.focus, Focus::Composer, "ctrl-c interrupts the turn, not the writing");
    key(&mut a, KeyCode::Esc);
    assert_eq!(a.focus, Focus::Main);
}

/// Palette, `:` line and composer edit as a readline does.
#[tokio::test]
async fn typed_lines_edit_like_a_readline() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    ctrl(&mut a, 'p');
    keys(&mut a, "approve always");
    ctrl(&mut a, 'w');
    assert!(matches!(&a.overlay, Overlay::Palette { query, .. } if query.text == "approve "));
    ctrl(&mut a, 'u');
    assert!(matches!(&a.overlay, Overlay::Palette { query, .. } if query.text.is_empty()));
    keys(&mut a, "files");
    ctrl(&mut a, 'a');
    keys(&mut a, "x");
    ctrl(&mut a, 'e');
    keys(&mut a, "y");
    assert!(matches!(&a.overlay, Overlay::Palette { query, .. } if query.text == "xfilesy"));
    key(&mut a, KeyCode::Esc);
    // The `:` line: a typo fixed with ctrl-w, then run.
    keys(&mut a, ":fiels");
    ctrl(&mut a, 'w');
    keys(&mut a, "files");
    key(&mut a, KeyCode::Enter);
    assert_eq!(a.main, MainView::Files);
    keys(&mut a, ":chat");
    ctrl(&mut a, 'u');
    assert!(matches!(&a.overlay, Overlay::CommandLine(l) if l.is_empty()));
    key(&mut a, KeyCode::Esc);
    // The composer.
    a.run("chat");
    key(&mut a, KeyCode::Char('i'));
    keys(&mut a, "hello wrold");
    ctrl(&mut a, 'w');
    keys(&mut a, "world");
    ctrl(&mut a, 'a');
    keys(&mut a, "> ");
    ctrl(&mut a, 'e');
    keys(&mut a, "!");
    assert_eq!(a.composer.lines(), ["> hello world!"]);
    ctrl(&mut a, 'u');
    assert!(a.composer.is_empty());
}

/// Help at 80×24 scrolls through every key active now; esc and q close it.
#[tokio::test]
async fn help_scrolls_and_is_complete_at_80x24() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    keys(&mut a, "?");
    let mut seen = String::new();
    let mut last = String::new();
    for _ in 0..200 {
        let frame = render(&a, 80, 24);
        if frame == last {
            break;
        }
        seen.push_str(&frame);
        last = frame;
        keys(&mut a, "j");
    }
    for ctx in a.contexts() {
        for (k, c) in &a.keymap.maps[ctx] {
            let desc = adf::tui::commands::find(c).unwrap().description;
            let shown = desc.chars().take(20).collect::<String>();
            assert!(seen.contains(&format!("  {:<12}{shown}", k.to_string())), "{k} ({c}) never shown");
        }
    }
    assert!(seen.contains("Delete the word before the cursor"), "the typing keys are listed");
    assert!(seen.contains("esc q"), "how to close it is listed");
    let Overlay::Help { scroll } = a.overlay else { panic!("help closed") };
    assert!(scroll > 0);
    key(&mut a, KeyCode::PageUp);
    keys(&mut a, "g");
    assert_eq!(a.overlay, Overlay::Help { scroll: 0 });
    keys(&mut a, "G");
    assert_eq!(a.overlay, Overlay::Help { scroll });
    keys(&mut a, "q");
    assert_eq!(a.overlay, Overlay::None);
    assert!(!a.quit, "q closed help, it did not quit");
}

/// The row a list selects, in a frame drawn without colours.
fn reversed_rows(app: &App, w: u16, h: u16) -> Vec<String> {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| ui::draw(f, app)).unwrap();
    let buf = term.backend().buffer().clone();
    let mut out = Vec::new();
    for y in 0..h {
        let cells: Vec<_> = (0..w).map(|x| &buf[(x, y)]).collect();
        let reset = ratatui::style::Color::Reset;
        assert!(cells.iter().all(|c| c.fg == reset && c.bg == reset), "a colour without colours, row {y}");
        let text: String = cells
            .iter()
            .filter(|c| c.modifier.contains(ratatui::style::Modifier::REVERSED))
            .map(|c| c.symbol())
            .collect();
        if !text.trim().is_empty() {
            out.push(text);
        }
    }
    out
}

/// Without colour (NO_COLOR's theme) the selection is reverse video in
/// every list: the tree, files, the approvals queue, the inbox, the
/// palette and the events pane.
#[tokio::test]
async fn the_selection_shows_without_colour() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    a.theme = Theme::load("mono").unwrap();
    a.focus = Focus::Fleet;
    let has = |a: &App, text: &str| reversed_rows(a, 120, 40).iter().any(|r| r.contains(text));
    assert!(has(&a, "research"), "tree: {:?}", reversed_rows(&a, 120, 40));
    a.run("files");
    a.files.sel = a.files.entries.iter().position(|e| e.path == "notes/today.md").unwrap();
    assert!(has(&a, "today.md"), "files");
    a.run("approvals");
    assert!(has(&a, "sys_update_config"), "approvals");
    a.run("chat");
    ctrl(&mut a, 'p');
    assert!(has(&a, "quit"), "palette");
    key(&mut a, KeyCode::Esc);
    let base = 1_764_547_200_000;
    for i in 0..3 {
        let e = event(&a, "tool.started", "research", base + i, json!({"name": format!("tool_{i}")}));
        a.on_event(&e);
    }
    a.focus = Focus::Events;
    assert!(has(&a, "tool_2"), "events, following");
    keys(&mut a, "k");
    assert!(has(&a, "tool_1"), "events, paused");
}

/// `g` in the events pane draws the first page whole, `G` the last.
#[tokio::test]
async fn events_top_and_bottom_draw_a_whole_page() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    let base = 1_764_547_200_000;
    for i in 0..30 {
        let e = event(&a, "tool.started", "research", base + i, json!({"name": format!("tool_{i:02}")}));
        a.on_event(&e);
    }
    a.focus = Focus::Events;
    keys(&mut a, "g");
    let frame = render(&a, 120, 40);
    for i in 0..6 {
        assert!(frame.contains(&format!("tool_{i:02}")), "tool_{i:02} missing:\n{frame}");
    }
    keys(&mut a, "G");
    let frame = render(&a, 120, 40);
    for i in 24..30 {
        assert!(frame.contains(&format!("tool_{i:02}")), "tool_{i:02} missing:\n{frame}");
    }
    assert!(a.events_follow, "G follows again");
}

/// The token-burn badge belongs to its agent, not to a row of the tree.
#[tokio::test]
async fn the_burn_badge_stays_with_its_agent() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    let e = event(&a, "llm.completed", "deployer", a.now_ms, json!({"input_tokens": 900, "output_tokens": 300}));
    a.on_event(&e);
    // The tree's row of an agent (the tree is the first 30 columns).
    let row = |a: &App, name: &str| {
        let frame = render(a, 120, 40);
        let tree: Vec<String> = frame.lines().skip(1).map(|l| l.chars().take(30).collect()).collect();
        tree.into_iter().find(|l| l.contains(&format!(" {name} "))).unwrap()
    };
    assert!(row(&a, "deployer").contains("1.2k/m"));
    // A new agent sorts first; the badge does not move to it.
    let alpha = agent(dir.path(), "alpha.adf", "alpha", vec![]).await;
    let mut infos: Vec<_> = a.agents.iter().map(|x| x.info.clone()).collect();
    infos.push(alpha);
    a.set_agents(infos, dir.path());
    assert_eq!(a.agents[0].info.name, "alpha");
    assert_eq!(a.selected().unwrap().info.name, "research", "the selection stays with its agent too");
    assert!(!row(&a, "alpha").contains("/m"), "{}", row(&a, "alpha"));
    assert!(row(&a, "deployer").contains("1.2k/m"), "{}", row(&a, "deployer"));
}

/// A streamed reply shows as it is written, with its tokens counting; an
/// interrupt keeps what was written, marked.
#[tokio::test]
async fn a_stream_shows_as_written_and_an_interrupt_keeps_it() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    let base = 1_764_547_200_000;
    let e = event(&a, "turn.delta", "research", base, json!({"kind": "text", "text": "One paragraph with no end yet"}));
    a.on_event(&e);
    let frame = render(&a, 80, 24);
    assert!(frame.contains("One paragraph with no end yet"), "{frame}");
    assert!(frame.contains("· ~368 tok"), "360 and 8 being written: {frame}");
    // The runtime keeps the cut reply in the loop, marked, before it says
    // the turn ended; the app shows it from there.
    let path = a.agents[a.sel].info.path.clone();
    let mut s = adf::store::Store::open(&path).unwrap();
    let text = format!("One paragraph with no end yet{}", adf::tui::chat::INTERRUPTED_MARK);
    s.loop_append(&adf::store::loop_rows::NewLoopRow {
        role: "assistant",
        content: &json!([{"type": "text", "text": text}]),
        model: None,
        tokens: None,
        ord: None,
    })
    .unwrap();
    s.close().unwrap();
    let e = event(&a, "turn.completed", "research", base + 1, json!({"interrupted": true, "content": ""}));
    a.on_event(&e);
    let id = a.agents[a.sel].info.id.clone();
    assert_eq!(
        a.chats[&id].blocks.last(),
        Some(&adf::tui::chat::Block::Interrupted("One paragraph with no end yet".into()))
    );
    let frame = render(&a, 80, 24);
    assert!(frame.contains("One paragraph with no end yet"), "{frame}");
    assert!(frame.contains("[interrupted"), "{frame}");
    assert!(frame.contains("· 360 tok"), "{frame}");
}

/// The context gauge is against the model's window: a window a server
/// reported (llama.cpp's 4,096) gives 14 % for 589 tokens.
#[tokio::test]
async fn the_context_gauge_uses_the_models_window() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    let i = a.sel;
    let id = a.agents[i].info.id.clone();
    a.set_window(&id, 4096);
    a.agents[i].context_tokens = Some(589);
    assert_eq!(a.agents[i].window, Some(4096));
    assert!(render(&a, 120, 40).contains("ctx 14%"));
}

/// The recovery phrase is a dialog of its own, never a row of a chat.
#[tokio::test]
async fn the_recovery_phrase_is_a_dialog() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    let words = "abandon ability able about above absent absorb abstract absurd abuse access accident";
    a.overlay = Overlay::Phrase { did: "did:key:z6MkTEST".into(), phrase: words.into() };
    both("recovery_phrase", &a);
    let frame = render(&a, 80, 24);
    for w in words.split(' ') {
        assert!(frame.contains(w), "{w} missing:\n{frame}");
    }
    assert!(a.chats.values().all(|c| !c.blocks.iter().any(|b| format!("{b:?}").contains("abandon"))));
    keys(&mut a, "x");
    assert!(matches!(a.overlay, Overlay::Phrase { .. }), "a stray key does not close it");
    key(&mut a, KeyCode::Enter);
    assert_eq!(a.overlay, Overlay::None);
}

/// `n` asks for a name, a provider and a model; `:new NAME` fills the
/// name; `:rename` and `:config` act on the selected agent.
#[tokio::test]
async fn new_rename_and_config_commands() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    a.focus = Focus::Fleet;
    keys(&mut a, "n");
    both("new_agent_form", &a);
    keys(&mut a, "scout");
    key(&mut a, KeyCode::Tab);
    key(&mut a, KeyCode::Right);
    let acts = key(&mut a, KeyCode::Enter);
    assert_eq!(
        acts,
        vec![Action::NewAgent {
            name: "scout".into(),
            provider: "openai".into(),
            model: "gpt-5-mini".into(),
            from: None
        }]
    );
    keys(&mut a, ":new Night Owl");
    key(&mut a, KeyCode::Enter);
    assert!(matches!(&a.overlay, Overlay::NewAgent(f) if f.name.text == "Night Owl" && f.field == 1));
    key(&mut a, KeyCode::Esc);
    let id = a.agents[a.sel].info.id.clone();
    keys(&mut a, ":rename digest");
    assert_eq!(key(&mut a, KeyCode::Enter), vec![Action::Rename { agent: id.clone(), name: "digest".into() }]);
    keys(&mut a, ":rename");
    key(&mut a, KeyCode::Enter);
    assert!(matches!(&a.overlay, Overlay::CommandLine(l) if l.text == "rename research"));
    key(&mut a, KeyCode::Esc);
    keys(&mut a, ":config");
    assert_eq!(key(&mut a, KeyCode::Enter), vec![Action::EditConfig { agent: id.clone() }]);
    // Errors name agents, never ids.
    assert_eq!(a.humanize(&format!("{id}: the agent has stopped")), "research has stopped; s starts it");
    assert_eq!(a.humanize(&format!("{id}: not loaded")), "research: not loaded");
}

/// Every screen in ASCII mode: every cell ASCII, none of them a `?`
/// standing for a glyph the app forgot.
#[tokio::test]
async fn every_screen_in_ascii_mode_is_ascii() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    a.glyphs = ASCII;
    let base = 1_764_547_200_000;
    for (i, (ty, p)) in [
        ("tool.started", json!({"name": "fs_write"})),
        ("message.sent", json!({"to": "did:key:z6MkiycN", "to_alias": "scribe", "message_id": "m1"})),
        ("hil.requested", json!({"tool": "sys_update_config"})),
    ]
    .into_iter()
    .enumerate()
    {
        let e = event(&a, ty, "research", base + i as i64, p);
        a.on_event(&e);
    }
    let e = event(&a, "turn.delta", "research", base + 5, json!({"kind": "text", "text": "Partial\nreply"}));
    a.on_event(&e);
    let scribe = a.agents.iter().find(|x| x.info.name == "scribe").unwrap().info.id.clone();
    a.set_unconfigured([(scribe, "no model provider is set".to_string())].into());
    let _ = ui::ascii_misses();
    let mut screens: Vec<(String, String)> = Vec::new();
    let mut shot = |name: &str, a: &App| {
        for (w, h) in [(80, 24), (120, 40)] {
            screens.push((format!("{name} {w}x{h}"), render(a, w, h)));
        }
    };
    shot("chat", &a);
    a.run("top");
    a.run("down");
    a.run("open");
    shot("tool card", &a);
    a.focus = Focus::Fleet;
    shot("fleet", &a);
    a.run("files");
    shot("files", &a);
    a.run("approvals");
    shot("approvals", &a);
    a.run("inbox");
    shot("inbox", &a);
    a.run("chat");
    a.focus = Focus::Events;
    shot("events", &a);
    key(&mut a, KeyCode::Enter);
    shot("event", &a);
    key(&mut a, KeyCode::Esc);
    for (cmd, name) in [
        ("palette", "palette"),
        ("help", "help"),
        ("connect", "connect"),
        ("unlock", "unlock"),
        ("new_agent", "new agent"),
        ("command_line", "command line"),
    ] {
        a.run(cmd);
        keys(&mut a, "ab");
        shot(name, &a);
        a.overlay = Overlay::None;
    }
    a.run("reject");
    keys(&mut a, "no");
    shot("reject", &a);
    a.overlay = Overlay::Phrase { did: "did:key:z6Mk".into(), phrase: "one two three".into() };
    shot("phrase", &a);
    a.overlay = Overlay::Conflict { agent: "x".into(), path: "mind.md".into(), mine: "a".into(), theirs: "b".into() };
    shot("conflict", &a);
    a.overlay = Overlay::None;
    a.sel = a.agents.iter().position(|x| x.info.name == "scribe").unwrap();
    a.focus = Focus::Main;
    shot("no provider", &a);
    for (name, frame) in &screens {
        assert!(frame.is_ascii(), "{name}:\n{frame}");
    }
    assert_eq!(ui::ascii_misses(), 0, "a glyph without an ASCII stand-in was drawn as ?");
    assert!(screens[0].1.contains("adf > research > main"), "{}", screens[0].1);
}

#[tokio::test]
async fn snapshot_of_the_new_agent_form_starting_from_a_clone() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    a.focus = Focus::Fleet;
    keys(&mut a, "n");
    keys(&mut a, "twin");
    for _ in 0..3 {
        key(&mut a, KeyCode::Tab);
    }
    key(&mut a, KeyCode::Right);
    both("new_agent_from_template", &a);
    key(&mut a, KeyCode::Right);
    key(&mut a, KeyCode::Tab);
    keys(&mut a, "research.adf");
    both("new_agent_from_clone", &a);
    let acts = key(&mut a, KeyCode::Enter);
    assert!(
        matches!(&acts[..], [Action::NewAgent { name, from: Some(adf::tui::forms::StartFrom::Clone(p)), .. }]
            if name == "twin" && p == "research.adf"),
        "{acts:?}"
    );
}

/// An agent file made by `parent` (or by nobody), for the tree.
fn child_of(root: &Path, file: &str, name: &str, parent: Option<&str>) -> AgentInfo {
    let path = root.join(file);
    let spec = adf::store::derive::ChildSpec {
        new: NewAgent { name: Some(name), provider: Some("scripted"), model: Some("mock-1"), ..Default::default() },
        parent_did: parent.map(String::from),
        ..Default::default()
    };
    let made = adf::store::derive::create_child(&path, &spec).unwrap();
    AgentInfo { id: made.id, name: name.into(), handle: made.handle, path }
}

#[test]
fn children_show_under_their_parent_and_orphans_stay_top_level() {
    let dir = tmp();
    let root = dir.path();
    std::fs::create_dir(root.join("kids")).unwrap();
    let boss = child_of(root, "boss.adf", "boss", None);
    let boss_did = Store::open_read_only(&boss.path).unwrap().meta_get("adf_did").unwrap().unwrap().value;
    let worker = child_of(root, "kids/worker.adf", "worker", Some(&boss_did));
    let worker_did = Store::open_read_only(&worker.path).unwrap().meta_get("adf_did").unwrap().unwrap().value;
    let helper = child_of(root, "helper.adf", "helper", Some(&worker_did));
    let orphan = child_of(root, "orphan.adf", "orphan", Some("did:key:z6MkGone"));
    let alpha = child_of(root, "alpha.adf", "alpha", None);
    let mut a = app();
    a.set_agents(vec![orphan, helper, worker, boss, alpha], root);
    let order: Vec<(&str, usize)> = a.agents.iter().map(|x| (x.info.name.as_str(), x.depth)).collect();
    assert_eq!(order, [("alpha", 0), ("boss", 0), ("worker", 1), ("helper", 2), ("orphan", 0)]);
    a.focus = Focus::Fleet;
    both("tree_children_under_parents", &a);
}

/// `:mcp`: servers with their state, tools with their flags and review
/// status, the selected server's error and stderr; keys make the changes
/// (as background requests) and `:mcp_add` reads npm, PyPI, URLs and
/// commands.
#[tokio::test]
async fn snapshot_of_the_mcp_view_and_its_keys() {
    use adf::tui::mcp::McpRequest;
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    a.run("mcp");
    assert_eq!(a.main, MainView::Mcp);
    a.mcp.servers = vec![
        json!({"name": "ev", "transport": "stdio", "target": "npx -y @modelcontextprotocol/server-everything stdio",
               "state": "connected", "tools_listed": 3, "credentials": ["API_KEY"], "stderr_tail": [],
               "tools": [
                   {"name": "echo", "enabled": true, "visible": true, "restricted": false, "status": null},
                   {"name": "get-tiny-image", "enabled": true, "visible": true, "restricted": true, "status": "new"},
                   {"name": "sampleLLM", "enabled": false, "visible": false, "restricted": true, "status": "changed"}]}),
        json!({"name": "docs", "transport": "http", "target": "https://docs.example.com/mcp", "state": "failed",
               "error": "the server requires authorization (HTTP 401)", "retry_in_ms": 4000, "restarts": 2,
               "stderr_tail": ["listening", "token rejected"], "tools": []}),
    ];
    a.mcp.sel = 2;
    both("mcp", &a);
    let act = keys(&mut a, "r");
    let Some(Action::Mcp(McpRequest { method, segments, body, .. })) = act.first() else { panic!("{act:?}") };
    assert_eq!((*method, segments.join("/")), ("PATCH", "mcp/ev/tools/get-tiny-image".to_string()));
    assert_eq!(body, &Some(json!({"restricted": false})));
    keys(&mut a, "G");
    let act = keys(&mut a, "R");
    assert!(matches!(act.first(), Some(Action::Mcp(r)) if r.segments == ["mcp", "docs", "restart"]), "{act:?}");
    keys(&mut a, "e");
    assert_eq!(a.status.as_deref(), Some("select a tool of the server first"));
    // `/mcp` typed in the composer opens the view rather than messaging.
    a.run("chat");
    a.focus = Focus::Composer;
    keys(&mut a, "/mcp");
    assert!(key(&mut a, KeyCode::Enter).is_empty());
    assert_eq!((a.main, a.focus), (MainView::Mcp, Focus::Main));
    let act = a.command_line("mcp_add npm:@modelcontextprotocol/server-everything stdio");
    let Some(Action::Mcp(r)) = act.first() else { panic!("{act:?}") };
    assert_eq!(r.body.as_ref().unwrap()["name"], "everything");
    assert_eq!(r.method, "POST");
}

/// `:skills` (or `K`): the fleet's and the agent's skills, a replaced one
/// and a muted one marked, an invalid one with its reason; `m` asks to
/// mute the selected skill.
#[tokio::test]
async fn snapshot_of_the_skills_view() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    a.run("skills");
    assert_eq!(a.main, MainView::Skills);
    a.skills.index = json!({
        "skills": [
            {"name": "refunds", "description": "The fleet's old refunds.", "root": "fleet", "path": "skills/refunds/SKILL.md",
             "resources": [], "muted": false, "shadowed": true},
            {"name": "refunds", "description": "Handle refund requests within the 30-day window.", "root": "agent",
             "path": "skills/refunds/SKILL.md", "resources": ["references/policy.md"], "muted": false},
            {"name": "triage", "description": "Sort incoming mail by urgency.", "root": "fleet",
             "path": "skills/triage/SKILL.md", "resources": ["refs/levels.md"], "muted": true}
        ],
        "invalid": [{"root": "agent", "path": "skills/nameless/SKILL.md", "reason": "the frontmatter has no name"}]
    });
    a.skills.sel = 1;
    both("skills", &a);
    let act = keys(&mut a, "m");
    assert!(matches!(act.first(), Some(Action::MuteSkill { name, on: true, .. }) if name == "refunds"), "{act:?}");
    keys(&mut a, "j");
    let act = keys(&mut a, "m");
    assert!(matches!(act.first(), Some(Action::MuteSkill { on: false, .. })), "unmute: {act:?}");
    keys(&mut a, "g");
    assert!(keys(&mut a, "m").is_empty(), "a replaced fleet skill is not the one to mute");
    assert!(a.status.as_deref().unwrap_or("").contains("replaces it"));
}

#[tokio::test]
async fn side_loops_show_in_the_tree_with_their_own_chat_and_composer() {
    // Issue 18: an agent's loops under it with state and schedule; ] and [
    // move between them and the chat and composer follow; :loop makes,
    // pauses and removes them through the control API.
    let dir = tmp();
    let root = dir.path();
    let path = root.join("scribe.adf");
    let (mut store, _) = Store::create(
        &path,
        &NewAgent { name: Some("scribe"), provider: Some("scripted"), model: Some("mock-1"), ..Default::default() },
    )
    .unwrap();
    use adf::store::loops::{LoopMode, LoopSpec};
    store.loop_create("critic", &LoopSpec { goal: Some("Find the holes.".into()), ..Default::default() }).unwrap();
    let hourly = LoopSpec { mode: Some(LoopMode::Scheduled), schedule: Some("0 * * * *".into()), ..Default::default() };
    store.loop_create("mem", &hourly).unwrap();
    let drafting = LoopSpec { mode: Some(LoopMode::Continuous), max_turns: Some(5), ..Default::default() };
    store.loop_create("drafter", &drafting).unwrap();
    let replies =
        vec![Reply::Text("Main is fine.".into()), Reply::Text("Objection 1: the plan has no deadline.".into())];
    let mut ex = Executor::new(store, Arc::new(Scripted::new(replies)), Bus::new(), Arc::new(Absent)).unwrap();
    ex.chat("Plan the launch").await.unwrap();
    ex.side_turn("critic", Some("Review the plan"), "chat").await.unwrap();
    let id = ex.agent_id().to_string();
    ex.store_into().close().unwrap();
    let mut a = app();
    a.set_agents(vec![AgentInfo { id: id.clone(), name: "scribe".into(), handle: String::new(), path }], root);
    a.sel = 0;
    a.focus = Focus::Fleet;
    assert_eq!(a.agents[0].loops.len(), 3);
    assert_eq!(a.current_loop(), None);
    key(&mut a, KeyCode::Char(']'));
    assert_eq!(a.current_loop().as_deref(), Some("critic"));
    both("side_loop_chat", &a);
    let screen = render(&a, 120, 40);
    assert!(screen.contains("scribe · critic") && screen.contains("Objection 1"), "{screen}");
    assert!(screen.contains("mem") && screen.contains("0 * * * *"), "the schedule shows: {screen}");
    assert!(screen.contains("drafter idle · 5 turns"), "a continuous loop's turn limit shows: {screen}");
    assert!(!screen.contains("Main is fine."), "main's rows are not in the side loop's chat");
    // The composer writes to the loop on screen.
    a.focus = Focus::Main;
    a.run("focus_composer");
    keys(&mut a, "and the budget?");
    let acts = key(&mut a, KeyCode::Enter);
    assert!(matches!(&acts[..], [Action::Run(Command::SendChat { r#loop, .. })] if r#loop == "critic"), "{acts:?}");
    // A side loop's stream goes to its chat, not main's.
    a.focus = Focus::Main;
    let e = event(&a, "turn.delta", "scribe", a.now_ms, json!({"kind": "text", "text": "Also the", "loop": "critic"}));
    a.on_event(&e);
    assert!(render(&a, 120, 40).contains("Also the"));
    key(&mut a, KeyCode::Char('['));
    assert_eq!(a.current_loop(), None, "back to main");
    assert!(!render(&a, 120, 40).contains("Also the"));
    key(&mut a, KeyCode::Char('['));
    assert_eq!(a.current_loop().as_deref(), Some("mem"), "round the list");
    // The context view: the selected loop's gauge and what takes the space.
    a.run("context");
    assert_eq!(a.main, MainView::Context);
    assert_eq!(a.context["loop"], "mem");
    both("context_view", &a);
    let screen = render(&a, 120, 40);
    assert!(screen.contains("scribe · mem · context") && screen.contains("window unknown"), "{screen}");
    assert!(screen.contains("tool    fs_write") && screen.contains("system prompt text"), "{screen}");
    a.run("chat");
    // :loop makes, pauses and removes loops through the control API.
    let acts = a.command_line("loop researcher digger");
    match &acts[..] {
        [Action::Mcp(r)] => {
            assert_eq!((r.method, r.segments.clone()), ("POST", vec!["loops".to_string()]));
            assert_eq!(r.body.as_ref().unwrap(), &json!({"name": "digger", "template": "researcher"}));
        }
        other => panic!("{other:?}"),
    }
    let acts = a.command_line("loop pause");
    assert!(matches!(&acts[..], [Action::Mcp(r)] if r.method == "PATCH" && r.segments == ["loops", "mem"]), "{acts:?}");
    let acts = a.command_line("loop rm");
    assert!(matches!(&acts[..], [Action::Mcp(r)] if r.method == "DELETE"), "{acts:?}");
    assert!(a.command_line("loop nonsense").is_empty());
    assert!(a.status.as_deref().unwrap_or("").contains("no loop template"));
}

#[tokio::test]
async fn a_budget_shows_in_the_tree_and_the_chat_title() {
    // Issue 19: an agent's budget nearest its limit, as a share.
    let dir = tmp();
    let root = dir.path();
    let path = root.join("payer.adf");
    let (mut store, _) = Store::create(
        &path,
        &NewAgent { name: Some("payer"), provider: Some("scripted"), model: Some("mock-1"), ..Default::default() },
    )
    .unwrap();
    let mut cfg = store.config_value().unwrap();
    cfg["limits"]["budget"] = json!({"tokens_day": 1000, "usd_total": 10.0});
    store.config_replace(cfg).unwrap();
    store.spend_add(&["agent"], 0.5, 850).unwrap();
    let id = store.config_value().unwrap()["id"].as_str().unwrap().to_string();
    store.close().unwrap();
    let mut a = app();
    a.set_agents(vec![AgentInfo { id, name: "payer".into(), handle: String::new(), path }], root);
    a.sel = 0;
    assert_eq!(a.agents[0].budget, Some(("tokens_day", 0.85)));
    both("budget_gauge", &a);
    let screen = render(&a, 120, 40);
    assert!(screen.contains("85%$") && screen.contains("budget 85% (tokens_day)"), "{screen}");
}

/// Attached with an observer's or an approver's token, the app hides what
/// the token may not do: the palette leaves it out, its keys say why, and
/// a message typed is kept, not sent.
#[tokio::test]
async fn a_lesser_token_hides_what_it_may_not_do() {
    use adf::daemon::roles::Role;
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    a.role = Role::Observer;
    ctrl(&mut a, 'p');
    keys(&mut a, "appr");
    both("palette_as_observer", &a);
    key(&mut a, KeyCode::Esc);
    let hits: Vec<&str> = adf::tui::input::palette_hits("", Role::Observer).iter().map(|c| c.name).collect();
    assert!(hits.contains(&"approvals") && hits.contains(&"files"), "reading stays");
    for hidden in ["stop", "approve_once", "edit_mind", "new_agent", "emergency_stop"] {
        assert!(!hits.contains(&hidden), "{hidden} is hidden from an observer");
    }
    let approver: Vec<&str> = adf::tui::input::palette_hits("", Role::Approver).iter().map(|c| c.name).collect();
    assert!(
        approver.contains(&"approve_once") && approver.contains(&"reject") && !approver.contains(&"approve_always")
    );
    let actions = a.run("stop");
    assert!(actions.is_empty());
    assert!(a.status.as_deref().unwrap().contains("observer token: stop needs the owner's"), "{:?}", a.status);
    assert!(a.run("approve_once").is_empty(), "an observer does not approve");
    // An approver may approve once, but a chat message stays in the composer.
    a.role = Role::Approver;
    a.status = None;
    assert!(!a.run("approve_once").is_empty(), "an approver approves");
    a.run("focus_composer");
    keys(&mut a, "hello");
    key(&mut a, KeyCode::Enter);
    assert_eq!(a.composer.lines().join(""), "hello", "kept, not sent");
    assert!(a.status.as_deref().unwrap().contains("chatting needs the owner's"), "{:?}", a.status);
}

/// The approvals queue at fleet scale: several requests marked and
/// answered together, grouped by tool or agent, the selected call's
/// arguments in the preview, and a grant made from the queue.
#[tokio::test]
async fn batch_triage_marks_groups_previews_and_grants() {
    use adf::tui::app::Pending;
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    let base = a.pending[0].clone();
    let more = |task: &str, tool: &str, path: &str, age: i64| Pending {
        task_id: task.into(),
        tool: tool.into(),
        args: json!({"path": path, "content": "…"}),
        since_ms: base.since_ms + age,
        ..base.clone()
    };
    a.run("approvals");
    a.focus = Focus::Main;
    a.pending.push(more("t-2", "fs_write", "notes/b.md", 1_000));
    a.pending.push(more("t-3", "fs_delete", "notes/old.md", 2_000));
    a.pending.push(more("t-4", "fs_write", "notes/c.md", 3_000));
    // Grouped by tool, the cursor stays on the request it was on.
    key(&mut a, KeyCode::Char('o'));
    assert_eq!(a.grouping, adf::tui::triage::Grouping::Tool);
    both("approvals_grouped_with_preview", &a);
    // Mark two fs_write requests (space moves on) and approve them at once.
    let order = a.approvals_order();
    let writes: Vec<usize> = (0..order.len()).filter(|&pos| a.pending[order[pos]].tool == "fs_write").collect();
    a.files.sel = writes[0];
    key(&mut a, KeyCode::Char(' '));
    a.files.sel = writes[1];
    key(&mut a, KeyCode::Char(' '));
    assert_eq!(a.marked.len(), 2);
    let marked: Vec<String> = a.marked.iter().cloned().collect();
    let actions = keys(&mut a, "a");
    let approved: Vec<&str> = actions
        .iter()
        .filter_map(|x| match x {
            Action::Run(Command::Approve { task_id, always: false, .. }) => Some(task_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(approved.len(), 2, "{actions:?}");
    assert!(marked.iter().all(|m| approved.contains(&m.as_str())));
    assert!(a.marked.is_empty() && a.pending.len() == 2, "answered and gone");
    // Reject a marked batch with one feedback.
    a.files.sel = 0;
    key(&mut a, KeyCode::Char(' '));
    keys(&mut a, "r");
    assert!(matches!(&a.overlay, Overlay::Reject { targets, .. } if targets.len() == 1));
    keys(&mut a, "not now");
    let denied = key(&mut a, KeyCode::Enter);
    assert!(matches!(&denied[..], [Action::Run(Command::Deny { feedback: Some(f), .. })] if f == "not now"));
    // A grant from the queue: the tool granted on its agent, the call approved.
    assert_eq!(a.pending.len(), 1);
    let tool = a.pending[0].tool.clone();
    let actions = a.command_line("grant 30m path notes");
    let (grant, approve) = (&actions[0], &actions[1]);
    match grant {
        Action::Mcp(r) => {
            assert_eq!((r.method, r.segments.as_slice()), ("POST", &["grants".to_string()][..]));
            let b = r.body.as_ref().unwrap();
            assert_eq!(
                (b["tool"].as_str(), b["for"].as_str(), b["path"].as_str()),
                (Some(tool.as_str()), Some("30m"), Some("notes"))
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(approve, Action::Run(Command::Approve { always: false, .. })));
    // A pattern that does not parse changes nothing.
    a.pending.push(more("t-9", "fs_write", "x", 9_000));
    assert!(a.command_line("grant path ../etc").is_empty());
    assert!(a.status.as_deref().unwrap().contains("not a path pattern"), "{:?}", a.status);
    assert!(a.command_line("grant forever").is_empty());
    assert_eq!(a.pending.len(), 1, "nothing answered");
}

/// Live burn, why and logs in the app: the leaderboard of the hottest
/// agents with a ten-minute sparkline each (in the tree too), the why
/// panel, and the logs panel whose rows open to their payload.
#[tokio::test]
async fn burn_leaderboard_sparklines_why_and_logs_with_payloads() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    // A fixed clock: the events pane prints times.
    let now = 1_764_547_200_000;
    a.now_ms = now;
    // research burns hard now and a little before; scribe a bit, a while ago.
    for (agent, mins_ago, tokens) in
        [("research", 0, 900), ("research", 0, 300), ("research", 4, 200), ("scribe", 6, 150)]
    {
        let e = event(
            &a,
            "llm.completed",
            agent,
            now - mins_ago * 60_000,
            json!({"input_tokens": tokens, "output_tokens": 0}),
        );
        a.on_event(&e);
    }
    a.tick(now);
    let board: Vec<&str> = a.leaderboard().iter().map(|(i, _, _)| a.agents[*i].info.name.as_str()).collect();
    assert_eq!(&board[..2], ["research", "scribe"], "hottest first");
    let id = a.agents.iter().find(|x| x.info.name == "research").unwrap().info.id.clone();
    let spark = a.spark(&id);
    assert_eq!((spark[9], spark[5]), (1200, 200), "{spark:?}");
    assert_eq!(adf::tui::control::sparkline(&[0, 1, 4, 8]), " ▁▄█");
    a.run("burn");
    both("burn_leaderboard", &a);
    // Enter on a row goes to that agent.
    a.logs_sel = 1;
    key(&mut a, KeyCode::Enter);
    assert_eq!(a.agents[a.sel].info.name, "scribe");
    assert_eq!(a.main, MainView::Chat);
    a.sel = a.agents.iter().position(|x| x.info.name == "research").unwrap();
    a.run("why");
    assert_eq!(a.why["waiting_on"][0]["what"], "approval", "{}", a.why);
    let text = render(&a, 120, 40);
    assert!(text.contains("waiting on") || text.contains("waits on") || text.contains("approval"), "{text}");
    {
        let path = a.agents[a.sel].info.path.clone();
        let mut s = Store::open(&path).unwrap();
        s.log("warn", "executor", "budget_exceeded", "[Budget] limits.budget.usd_day of $1.00 reached").unwrap();
        s.close().unwrap();
    }
    a.run("logs");
    assert_eq!(a.main, MainView::Logs);
    let rows = a.logs.len();
    assert!(rows > 0, "the fleet fixture wrote logs");
    a.logs_sel = rows - 1;
    key(&mut a, KeyCode::Enter);
    assert_eq!(a.logs_open, Some(rows - 1));
    let open = render(&a, 120, 40);
    assert!(open.contains("message:") && open.contains("data:"), "{open}");
    key(&mut a, KeyCode::Char('t'));
    assert!(a.show_tasks);
    assert!(!a.tasks.is_empty(), "the approval's task");
    a.logs_sel = 0;
    key(&mut a, KeyCode::Enter);
    assert!(render(&a, 120, 40).contains("args:"));
}

/// The grants view lists the selected agent's grants; D revokes one.
#[tokio::test]
async fn the_grants_view_lists_and_revokes() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    let path = a.agents[a.sel].info.path.clone();
    let mut s = Store::open(&path).unwrap();
    let g = s
        .grant_add(adf::store::grants::NewGrant {
            tool: "fs_write".into(),
            path: Some("notes".into()),
            for_ms: Some(30 * 60_000),
            ..Default::default()
        })
        .unwrap();
    s.close().unwrap();
    a.run("grants");
    assert_eq!(a.grants.len(), 1);
    let frame = render(&a, 120, 40);
    assert!(frame.contains("fs_write") && frame.contains("notes") && frame.contains(" min "), "{frame}");
    let act = keys(&mut a, "D");
    match &act[..] {
        [Action::Mcp(r)] => assert_eq!((r.method, r.segments.clone()), ("DELETE", vec!["grants".to_string(), g.id])),
        other => panic!("{other:?}"),
    }
    assert!(a.grants.is_empty());
}

/// `:channels` with none running says how to connect one.
#[tokio::test]
async fn the_channels_view_says_how_to_connect_one() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    a.run("channels");
    assert_eq!(a.main, MainView::Channels);
    let frame = render(&a, 120, 40);
    assert!(frame.contains("channels (0)") && frame.contains("No channel runs"), "{frame}");
}

/// A WhatsApp channel waiting to be linked: `/channels` draws its QR code
/// (light modules white, dark ones black, whatever the terminal's colours),
/// the same code `adf adapters add` draws.
#[tokio::test]
async fn snapshot_of_the_channels_view_with_a_qr_code_to_scan() {
    let dir = tmp();
    let mut a = loaded(dir.path()).await;
    a.run("channels");
    // A code of a real pairing's length: the ref, then three keys.
    let key = "q83vEjRWeJq8FBqFJBAGsLe6pRsZ5i3HGuQmy8sxW0k=";
    let code = format!("2@{},{key},{key},{key}", "Gk7s2Yx9Qz".repeat(12));
    assert!(code.len() > 240, "{}", code.len());
    a.channels = vec![json!({"kind": "whatsapp", "state": "pairing", "received": 0, "sent": 0, "refused": 0,
        "account": null, "last_error": null, "qr": code})];
    let frame = render(&a, 120, 40);
    assert!(frame.contains("whatsapp") && frame.contains("pairing") && frame.contains("Linked devices"), "{frame}");
    let qr = adf::channels::whatsapp::qr_text(&code).unwrap();
    for line in qr.lines() {
        assert!(frame.contains(line), "the code's row {line:?} is drawn whole (the events pane gives way):\n{frame}");
    }
    // Where the whole code cannot fit, none of it: a cut code scans as nothing.
    let small = render(&a, 80, 24);
    assert!(small.contains("The code needs 61x31"), "{small}");
    assert!(!small.contains(qr.lines().nth(5).unwrap()), "{small}");
    both("channels_qr", &a);
    // Linked: no code.
    a.channels[0]["qr"] = serde_json::Value::Null;
    a.channels[0]["state"] = json!("connected");
    assert!(!render(&a, 120, 40).contains("Linked devices"));
}

/// An agent that serves (a site, shared files or routes) is marked in the
/// tree, and its URL is under its chat (issue 21).
#[tokio::test]
async fn snapshot_of_a_serving_agent() {
    let dir = tmp();
    let root = dir.path();
    let infos = fleet(root).await;
    {
        let path = &infos.iter().find(|i| i.name == "scribe").unwrap().path;
        let mut s = Store::open(path).unwrap();
        s.config_set(adf::store::Caller::Owner, "serving", json!({"public": {"enabled": true}})).unwrap();
        s.close().unwrap();
    }
    let mut a = app();
    a.mesh_url = Some("http://127.0.0.1:7295".into());
    a.set_agents(infos, root);
    a.sel = a.agents.iter().position(|x| x.info.name == "scribe").unwrap();
    assert_eq!(a.selected().unwrap().serving.as_deref(), Some("http://127.0.0.1:7295/agents/scribe/"));
    assert!(a.agents.iter().filter(|x| x.info.name != "scribe").all(|x| x.serving.is_none()));
    both("serving_agent", &a);
    let frame = render(&a, 120, 40);
    assert!(frame.contains("⌂ serving http://127.0.0.1:7295/agents/scribe/"), "{frame}");
    // Its visibility off: it serves nothing, and is not marked.
    let path = a.selected().unwrap().info.path.clone();
    let mut s = Store::open(&path).unwrap();
    s.config_set(adf::store::Caller::Owner, "messaging.visibility", json!("off")).unwrap();
    s.close().unwrap();
    let infos = a.agents.iter().map(|x| x.info.clone()).collect();
    a.set_agents(infos, root);
    assert!(a.agents.iter().all(|x| x.serving.is_none()), "an agent with visibility off is not marked as serving");
}

/// `:compute` shows where the agent's commands run, its last commands with
/// their exit codes, and its newest screenshot (issue 22).
#[tokio::test]
async fn snapshot_of_the_compute_panel() {
    let dir = tmp();
    let root = dir.path();
    let infos = fleet(root).await;
    let path = infos.iter().find(|i| i.name == "research").unwrap().path.clone();
    {
        let mut s = Store::open(&path).unwrap();
        s.config_set(adf::store::Caller::Owner, "compute", json!({"enabled": true, "host_access": true})).unwrap();
        s.file_write(adf::store::Caller::Owner, "screenshots/browser-1.png", b"\x89PNG", &Default::default()).unwrap();
        s.close().unwrap();
        // Log rows at fixed times, as compute_exec writes them.
        let c = rusqlite::Connection::open(&path).unwrap();
        for (at, msg) in [
            (1_767_225_600_000_i64, "isolated: exit 0 in 41 ms: python3 -c 'print(6*7)'"),
            (1_767_225_660_000, "shared: exit 2 in 8 ms: ls /nope"),
            (1_767_225_720_000, "host: exit 124 in 1000 ms: sleep 300"),
        ] {
            c.execute(
                "INSERT INTO adf_logs (level, origin, event, message, created_at) VALUES ('info', 'compute', 'exec', ?1, ?2)",
                rusqlite::params![msg, at],
            )
            .unwrap();
        }
    }
    let mut a = app();
    a.set_agents(infos, root);
    a.sel = a.agents.iter().position(|x| x.info.name == "research").unwrap();
    a.run("compute");
    assert_eq!(a.main, MainView::Compute);
    let frame = render(&a, 120, 40);
    // Host commands are off for this install: not a target.
    assert!(
        frame.contains("isolated · shared ") && !frame.contains("· host ") && frame.contains("browser  visible"),
        "{frame}"
    );
    assert!(frame.contains("00:02:00  host") && frame.contains("124") && frame.contains("sleep 300"), "{frame}");
    assert!(frame.contains("screenshots/browser-1.png"), "{frame}");
    both("compute_panel", &a);
    // What runs now, as the hosting process tells it: each container's state.
    a.compute["live"] = json!({"containers": {
        "isolated": {"container": "adf-research", "state": "running"},
        "shared": {"container": "adf-mcp", "state": "stopped", "uid": 20001}}, "display": 7});
    let frame = render(&a, 120, 40);
    assert!(frame.contains("now      isolated adf-research running · shared adf-mcp stopped · desktop :7"), "{frame}");
}

const BANDS: [[u8; 3]; 4] = [[200, 40, 40], [40, 200, 40], [40, 40, 200], [230, 230, 230]];

/// The cells of a 120×40 frame drawn in one of the bands' colours.
fn bands(app: &App) -> Vec<(u16, u16, (u8, u8, u8))> {
    let mut cells = rgb_cells(app, 120, 40);
    cells.retain(|c| BANDS.contains(&[c.2.0, c.2.1, c.2.2]));
    cells
}

/// A PNG of `w`×`h`: four colour bands, so half blocks show its shape.
fn bands_png(w: u32, h: u32) -> Vec<u8> {
    png_of(w, h, |x, _| BANDS[(x * 4 / w) as usize])
}

/// Where the terminal can draw pictures, the compute panel draws the
/// newest screenshot under its text (half blocks here, the protocol any
/// terminal can show); a screenshot the app cannot read says why instead.
#[tokio::test]
async fn snapshot_of_the_compute_panel_with_its_screenshot_drawn() {
    let dir = tmp();
    let root = dir.path();
    let infos = fleet(root).await;
    let path = infos.iter().find(|i| i.name == "research").unwrap().path.clone();
    let mut s = Store::open(&path).unwrap();
    s.config_set(adf::store::Caller::Owner, "compute", json!({"enabled": true})).unwrap();
    s.file_write(adf::store::Caller::Owner, "screenshots/browser-1.png", &bands_png(64, 40), &Default::default())
        .unwrap();
    s.close().unwrap();
    let mut a = app();
    a.picker = Some(ratatui_image::picker::Picker::halfblocks());
    a.set_agents(infos, root);
    a.sel = a.agents.iter().position(|x| x.info.name == "research").unwrap();
    a.run("compute");
    let frame = render(&a, 120, 40);
    assert!(frame.contains("screenshots/browser-1.png") && !frame.contains("not drawn"), "{frame}");
    // The four bands, left to right, in true colour under the text.
    let cells = bands(&a);
    let text_row = frame.lines().position(|l| l.contains("screenshots/browser-1.png")).unwrap() as u16;
    assert!(cells.len() > 400 && cells.iter().all(|c| c.0 > text_row), "{} cells", cells.len());
    let column_of = |want: (u8, u8, u8)| {
        let xs: Vec<u16> = cells.iter().filter(|c| c.2 == want).map(|c| c.1).collect();
        assert!(xs.len() > 50, "{want:?}: {}", xs.len());
        xs.iter().map(|x| *x as u32).sum::<u32>() / xs.len() as u32
    };
    let (r, g, b) = (column_of((200, 40, 40)), column_of((40, 200, 40)), column_of((40, 40, 200)));
    assert!(r < g && g < b, "bands in order: {r} {g} {b}");
    both("compute_panel_picture", &a);

    // A hostile screenshot: a valid PNG of 9,000 × 1 pixels (past the
    // 8,192 a side the app reads): named, not drawn, nothing else changes.
    let mut s = Store::open(&path).unwrap();
    s.file_write(adf::store::Caller::Owner, "screenshots/browser-1.png", &bands_png(9000, 1), &Default::default())
        .unwrap();
    s.close().unwrap();
    a.refresh_compute();
    let frame = render(&a, 120, 40);
    assert!(frame.contains("not drawn: larger than 8192×8192 pixels"), "{frame}");
    assert!(bands(&a).is_empty(), "{frame}");
    // With pictures off (ASCII, or ADF_IMAGES=off) nothing is read.
    a.picker = None;
    a.refresh_compute();
    assert!(a.shot.is_none());
}

#[test]
fn snapshot_of_a_tree_over_three_hosts_one_down_one_never_reached() {
    use adf::tui::hosts::{HostView, Status, key};
    let now = 1_796_000_000_000;
    let mut a = app();
    let view = |name: &str, connected: bool, seen: i64, error: Option<&str>| HostView {
        name: name.into(),
        url: format!("http://{name}.lan:7385"),
        status: Status { connected, last_seen_ms: seen, error: error.map(str::to_string) },
    };
    a.hosts = vec![
        view("alpha", true, now, None),
        view("beta", false, now - 125_000, Some("connection refused")),
        view("gamma", false, 0, Some("no answer in 3 s")),
    ];
    let info = |id: &str, host: &str, rel: &str, name: &str| AgentInfo {
        id: key(id, host),
        name: name.into(),
        handle: name.into(),
        path: Path::new(host).join(rel),
    };
    // The same agent id on two hosts (a copied file) stays two agents.
    a.set_agents(
        vec![
            info("A1", "alpha", "ops/deployer.adf", "deployer"),
            info("A2", "alpha", "scribe.adf", "scribe"),
            info("A2", "beta", "scribe.adf", "scribe"),
            info("B1", "beta", "research.adf", "research"),
        ],
        Path::new(""),
    );
    a.now_ms = now;
    assert_eq!(a.agents.len(), 4);
    let hosts: Vec<(&str, &str, &str)> =
        a.agents.iter().map(|x| (x.host.as_str(), x.folder.as_str(), x.info.name.as_str())).collect();
    assert_eq!(
        hosts,
        [("alpha", "", "scribe"), ("alpha", "ops", "deployer"), ("beta", "", "research"), ("beta", "", "scribe")]
    );
    // A host's events: down, then back (its agents read again).
    let ev = |ty: &'static str, payload: serde_json::Value| {
        let mut e = Envelope::new(ty, None, "system:hosts", payload);
        e.timestamp = now;
        e
    };
    let acts = a.on_event(&ev("host.connected", json!({"host": "beta", "last_seen_ms": now, "restarted": true})));
    assert!(matches!(acts.as_slice(), [Action::RefreshAgents]), "a host back reads its agents again");
    assert!(a.status.as_deref().unwrap().contains("beta is connected (it had restarted"), "{:?}", a.status);
    a.on_event(&ev(
        "host.disconnected",
        json!({"host": "beta", "last_seen_ms": now - 125_000, "error": "connection refused"}),
    ));
    assert!(a.status.as_deref().unwrap().contains("beta is disconnected: connection refused"));
    both("hosts_tree", &a);
}
