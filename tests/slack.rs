//! The Slack channel (issue 20) against a wire-level fake of Slack on
//! loopback, written from its public API reference: the Web API (`ok` /
//! `error` answers, `invalid_auth` for a wrong token, 429 with
//! `Retry-After`), `apps.connections.open` with the app-level token, and
//! Socket Mode over a WebSocket: `hello`, envelopes that come again until
//! acknowledged (with `retry_attempt`), `disconnect` for a refresh. The
//! external upload flow and private file downloads (a login page for a
//! token that cannot read files) are checked as Slack does.

mod common;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::fleet::{Fleet, ProviderFactory};
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use common::*;
use serde_json::{Value, json};

#[derive(Default)]
struct Fake {
    addr: String,
    /// Envelopes to push, and those pushed but not acknowledged.
    queue: VecDeque<Value>,
    unacked: Vec<Value>,
    acks: Vec<String>,
    /// Web API calls that post (postMessage bodies, completed uploads).
    posted: Vec<Value>,
    history: HashMap<String, Vec<Value>>,
    uploads: HashMap<String, (String, Vec<u8>)>,
    connections: usize,
    throttle_once: bool,
    disconnect: bool,
    next_ts: u64,
}

type Shared = Arc<Mutex<Fake>>;

/// The fleet reads the install from `ADF_HOME`: one test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn bearer(h: &HeaderMap) -> String {
    h.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").trim_start_matches("Bearer ").to_string()
}

fn err(e: &str) -> Response {
    axum::Json(json!({"ok": false, "error": e})).into_response()
}

async fn api(State(f): State<Shared>, Path(method): Path<String>, h: HeaderMap, body: axum::body::Bytes) -> Response {
    let token = bearer(&h);
    if method == "apps.connections.open" {
        if token != "xapp-T" {
            return err("invalid_auth");
        }
        let addr = f.lock().unwrap().addr.clone();
        return axum::Json(json!({"ok": true, "url": format!("ws://{addr}/socket")})).into_response();
    }
    if token != "xoxb-T" {
        return err("invalid_auth");
    }
    let form = h
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
    if method == "files.getUploadURLExternal" {
        // Form arguments only, as Slack takes them for this method.
        if !form {
            return err("invalid_arguments");
        }
        let args: HashMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
        let (Some(name), Some(len)) = (args.get("filename"), args.get("length")) else {
            return err("invalid_arguments");
        };
        let mut g = f.lock().unwrap();
        let id = format!("F{}", g.uploads.len() + 1);
        g.uploads.insert(id.clone(), (name.clone(), format!("expect {len}").into_bytes()));
        let addr = g.addr.clone();
        return axum::Json(json!({"ok": true, "upload_url": format!("http://{addr}/upload/{id}"), "file_id": id}))
            .into_response();
    }
    let b: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
    let mut g = f.lock().unwrap();
    match method.as_str() {
        "auth.test" => axum::Json(json!({"ok": true, "user_id": "UBOT", "user": "scout", "team_id": "T1", "bot_id": "B1"})).into_response(),
        "users.info" => {
            let name = match b["user"].as_str() {
                Some("U_ANN") => "ann",
                Some("U_BOB") => "bob",
                Some(_) => "someone",
                None => return err("user_not_found"),
            };
            axum::Json(json!({"ok": true, "user": {"id": b["user"], "name": name}})).into_response()
        }
        "chat.postMessage" => {
            if b["channel"].as_str().is_none_or(str::is_empty) {
                return err("channel_not_found");
            }
            if b["text"].as_str().is_none_or(str::is_empty) && b["blocks"].is_null() {
                return err("no_text");
            }
            if g.throttle_once {
                g.throttle_once = false;
                return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], "").into_response();
            }
            g.next_ts += 1;
            let ts = format!("1800000000.{:06}", g.next_ts);
            let mut rec = b.clone();
            rec["method"] = json!("chat.postMessage");
            rec["ts"] = json!(ts);
            g.posted.push(rec);
            axum::Json(json!({"ok": true, "channel": b["channel"], "ts": ts})).into_response()
        }
        "files.completeUploadExternal" => {
            let files = b["files"].as_array().cloned().unwrap_or_default();
            for file in &files {
                let id = file["id"].as_str().unwrap_or("");
                match g.uploads.get(id) {
                    Some((_, bytes)) if !bytes.starts_with(b"expect ") => {}
                    _ => return err("file_upload_not_found"),
                }
            }
            let mut rec = b.clone();
            rec["method"] = json!("files.completeUploadExternal");
            rec["bytes"] = json!(files.iter().map(|f| String::from_utf8_lossy(&g.uploads[f["id"].as_str().unwrap()].1).to_string()).collect::<Vec<_>>());
            g.posted.push(rec);
            axum::Json(json!({"ok": true, "files": files})).into_response()
        }
        "conversations.list" => axum::Json(json!({"ok": true, "channels": [
            {"id": "D_ANN", "is_im": true},
            {"id": "C_OPS", "is_channel": true, "is_member": true},
            {"id": "C_ELSE", "is_channel": true, "is_member": false}]})).into_response(),
        "conversations.history" => {
            let Some(ch) = b["channel"].as_str() else { return err("channel_not_found") };
            let oldest: f64 = b["oldest"].as_str().and_then(|o| o.parse().ok()).unwrap_or(0.0);
            let mut msgs: Vec<Value> = g.history.get(ch).cloned().unwrap_or_default().into_iter()
                .filter(|m| m["ts"].as_str().unwrap().parse::<f64>().unwrap() > oldest).collect();
            msgs.reverse();
            axum::Json(json!({"ok": true, "messages": msgs})).into_response()
        }
        "conversations.info" => axum::Json(json!({"ok": true, "channel": {"id": b["channel"], "name": "ops", "is_private": false,
            "num_members": 2, "purpose": {"value": "ops talk"}, "topic": {"value": ""}}})).into_response(),
        "conversations.members" => axum::Json(json!({"ok": true, "members": ["U_ANN", "UBOT"], "response_metadata": {"next_cursor": ""}})).into_response(),
        "conversations.open" => axum::Json(json!({"ok": true, "channel": {"id": format!("D_{}", b["users"].as_str().unwrap_or("").trim_start_matches("U_"))}})).into_response(),
        _ => err("unknown_method"),
    }
}

async fn upload(State(f): State<Shared>, Path(id): Path<String>, body: axum::body::Bytes) -> StatusCode {
    let mut g = f.lock().unwrap();
    match g.uploads.get_mut(&id) {
        Some((_, bytes)) if *bytes == format!("expect {}", body.len()).into_bytes() => {
            *bytes = body.to_vec();
            StatusCode::OK
        }
        _ => StatusCode::BAD_REQUEST,
    }
}

/// A private file: the bytes with the bot token, Slack's login page without.
async fn file(Path(name): Path<String>, h: HeaderMap) -> Response {
    if bearer(&h) != "xoxb-T" {
        return ([("content-type", "text/html")], "<html>sign in</html>").into_response();
    }
    ([("content-type", "text/plain")], format!("contents of {name}")).into_response()
}

async fn socket(State(f): State<Shared>, ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(move |s| pump(f, s))
}

/// Socket Mode: hello, then the envelopes; unacknowledged ones come again
/// on the next connection; `disconnect` when asked.
async fn pump(f: Shared, mut s: WebSocket) {
    let redeliver: Vec<Value> = {
        let mut g = f.lock().unwrap();
        g.connections += 1;
        g.unacked.drain(..).collect()
    };
    let _ = s.send(Message::Text(json!({"type": "hello", "num_connections": 1}).to_string().into())).await;
    for mut e in redeliver {
        e["retry_attempt"] = json!(e["retry_attempt"].as_u64().unwrap_or(0) + 1);
        f.lock().unwrap().unacked.push(e.clone());
        let _ = s.send(Message::Text(e.to_string().into())).await;
    }
    loop {
        let (next, bye) = {
            let mut g = f.lock().unwrap();
            let bye = std::mem::take(&mut g.disconnect);
            let next = if bye { None } else { g.queue.pop_front() };
            if let Some(e) = &next {
                g.unacked.push(e.clone());
            }
            (next, bye)
        };
        if bye {
            let _ = s
                .send(Message::Text(json!({"type": "disconnect", "reason": "refresh_requested"}).to_string().into()))
                .await;
            let _ = s.send(Message::Close(None)).await;
            return;
        }
        if let Some(e) = next {
            if s.send(Message::Text(e.to_string().into())).await.is_err() {
                return;
            }
            continue;
        }
        match tokio::time::timeout(Duration::from_millis(50), s.recv()).await {
            Ok(Some(Ok(Message::Text(t)))) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                let id = v["envelope_id"].as_str().unwrap().to_string();
                let mut g = f.lock().unwrap();
                g.unacked.retain(|e| e["envelope_id"] != id.as_str());
                g.acks.push(id);
            }
            Ok(Some(Ok(_))) | Err(_) => {}
            Ok(None) | Ok(Some(Err(_))) => return,
        }
    }
}

async fn serve(f: Shared) -> String {
    let app = axum::Router::new()
        .route("/api/{method}", axum::routing::post(api))
        .route("/upload/{id}", axum::routing::post(upload))
        .route("/files/{name}", axum::routing::get(file))
        .route("/socket", axum::routing::get(socket))
        .with_state(f.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    f.lock().unwrap().addr = addr.clone();
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    format!("http://{addr}/api")
}

fn message(envelope: &str, channel: &str, kind: &str, user: &str, ts: &str, text: &str) -> Value {
    json!({"envelope_id": envelope, "type": "events_api", "accepts_response_payload": false, "retry_attempt": 0,
        "payload": {"type": "event_callback", "event_id": format!("Ev{envelope}"),
            "event": {"type": "message", "channel": channel, "channel_type": kind, "user": user, "ts": ts, "text": text}}})
}

/// What the fake saw, for a timed-out wait.
fn told(fake: &Shared) -> impl FnOnce() -> String + '_ {
    move || {
        let f = fake.lock().unwrap();
        format!("connections {} acks {:?}\nunacked {:?}\nposted {:?}", f.connections, f.acks, f.unacked, f.posted)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_admits_by_policy_acks_threads_replies_and_catches_up_after_a_refresh() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    let fake: Shared = Arc::new(Mutex::new(Fake { throttle_once: true, ..Default::default() }));
    let api_url = serve(fake.clone()).await;
    {
        let mut f = fake.lock().unwrap();
        f.queue.push_back(message("e1", "D_ANN", "im", "U_ANN", "1700000001.000100", "hello"));
        f.queue.push_back(message("e2", "D_BOB", "im", "U_BOB", "1700000002.000100", "let me in"));
        f.queue.push_back(message("e3", "C_OPS", "channel", "U_BOB", "1700000003.000100", "no mention"));
        f.queue.push_back(message("e4", "C_OPS", "channel", "U_ANN", "1700000004.000100", "<@UBOT> status?"));
        f.history.insert(
            "D_ANN".into(),
            vec![json!({"type": "message", "user": "U_ANN", "ts": "1700000001.000100", "text": "hello"})],
        );
    }
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    let before = snapshot(&d.join("a.adf"));
    fails(&adf(d, &["adapters", "add", "a.adf", "slack"], Some(b"xoxb-T\n")), &["two tokens", "xapp-"]);
    assert_eq!(snapshot(&d.join("a.adf")), before, "nothing changed");
    ok(&adf(
        d,
        &[
            "adapters",
            "add",
            "a.adf",
            "slack",
            "--api-url",
            &api_url,
            "--dm",
            "allowlist",
            "--allow",
            "U_ANN",
            "--group",
            "mention",
        ],
        Some(b"xapp-T\nxoxb-T\n"),
    ));
    let raw = std::fs::read(d.join("a.adf")).unwrap();
    assert!(!raw.windows(6).any(|w| w == b"xoxb-T" || w == b"xapp-T"), "the tokens are sealed");

    let path = d.join("a.adf");
    let (n, p2) = (Arc::new(Mutex::new(0)), path.clone());
    let factory: ProviderFactory = Arc::new(move |_| {
        let (n, p) = (n.clone(), p2.clone());
        Ok(Arc::new(Scripted::new([]).with_fallback(move |_| {
            // Once the mention is in: reply to it.
            let mut n = n.lock().unwrap();
            if *n == 0
                && let Some(ops) = inbox_rows(&p).into_iter().find(|r| r["from"] == "slack:C_OPS")
            {
                *n += 1;
                return Reply::Tools(vec![(
                    "msg_send".into(),
                    json!({"parent_id": ops["id"], "content": "All green."}),
                )]);
            }
            Reply::Text("done".into())
        })) as Arc<dyn adf::providers::Provider>)
    });
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let mut fleet = Fleet::new(Bus::new(), factory);
    fleet.load(&path).unwrap();
    let id = fleet.list()[0].id.clone();
    wait_or_tell("four acknowledgements", &path, || fake.lock().unwrap().acks.len() >= 4, told(&fake)).await;
    let rows = inbox_rows(&path);
    let from: Vec<&str> = rows.iter().map(|r| r["from"].as_str().unwrap()).collect();
    assert_eq!(from, ["slack:D_ANN", "slack:C_OPS"], "Ann's DM and the mention; Bob and the unmentioned refused");
    assert_eq!(rows[1]["content"], "status?", "the mention is taken out of the text");
    assert!(fake.lock().unwrap().unacked.is_empty(), "refused ones are acknowledged too");

    // The reply goes in the thread of the message, after one 429.
    wait_or_tell("the reply", &path, || !fake.lock().unwrap().posted.is_empty(), told(&fake)).await;
    let post = fake.lock().unwrap().posted[0].clone();
    assert_eq!(
        (post["channel"].as_str(), post["thread_ts"].as_str(), post["text"].as_str()),
        (Some("C_OPS"), Some("1700000004.000100"), Some("All green.")),
        "{post}"
    );

    // A redelivered event is not a second row; a reply in the bot's thread
    // counts as a mention; a file comes with its bytes.
    {
        let mut f = fake.lock().unwrap();
        f.queue.push_back(message("e1b", "D_ANN", "im", "U_ANN", "1700000001.000100", "hello"));
        let mut t = message("e5", "C_OPS", "channel", "U_ANN", "1700000005.000100", "thanks");
        t["payload"]["event"]["thread_ts"] = json!("1700000004.000100");
        f.queue.push_back(t);
        let mut file = message("e6", "D_ANN", "im", "U_ANN", "1700000006.000100", "");
        file["payload"]["event"]["subtype"] = json!("file_share");
        let addr = f.addr.clone();
        file["payload"]["event"]["files"] = json!([{"id": "F9", "name": "notes.txt", "mimetype": "text/plain", "size": 20,
            "url_private_download": format!("http://{addr}/files/notes.txt")}]);
        f.queue.push_back(file);
    }
    wait_or_tell("the thread reply and the file", &path, || inbox_rows(&path).len() == 4, told(&fake)).await;
    let rows = inbox_rows(&path);
    assert_eq!(rows[2]["content"], "thanks");
    let att: Value = serde_json::from_str(rows[3]["attachments"].as_str().unwrap()).unwrap();
    assert_eq!(att[0]["transfer"], "imported", "{att}");
    let cat = ok(&adf(d, &["files", "cat", "a.adf", att[0]["path"].as_str().unwrap()], None));
    assert_eq!(cat, "contents of notes.txt");

    // A refresh: Slack says disconnect; the channel reconnects and reads
    // back what it missed (one new message in the DM's history).
    {
        let mut f = fake.lock().unwrap();
        f.history.get_mut("D_ANN").unwrap().push(
            json!({"type": "message", "user": "U_ANN", "ts": "1700000007.000100", "text": "while you were away"}),
        );
        f.disconnect = true;
    }
    wait_or_tell("the catch-up", &path, || inbox_rows(&path).len() == 5, told(&fake)).await;
    assert_eq!(inbox_rows(&path)[4]["content"], "while you were away");
    assert_eq!(fake.lock().unwrap().connections, 2);
    let st = fleet.channel_status(&id);
    assert_eq!(st[0].0, "slack");
    assert_eq!(st[0].1.account.as_deref(), Some("@scout"));
    assert_eq!((st[0].1.received, st[0].1.sent, st[0].1.refused), (5, 1, 2), "{st:?}");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_forms_are_buttons_files_are_uploaded_and_slash_commands_arrive() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    let fake: Shared = Arc::new(Mutex::new(Fake::default()));
    let api_url = serve(fake.clone()).await;
    fake.lock().unwrap().queue.push_back(json!({"envelope_id": "c1", "type": "slash_commands", "payload": {
        "command": "/scout", "text": "plan lunch", "user_id": "U_ANN", "user_name": "ann", "channel_id": "C_OPS", "trigger_id": "T1"}}));
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    ok(&adf(d, &["files", "put", "a.adf", "menu.txt"], Some(b"pizza, sushi")));
    ok(&adf(d, &["adapters", "add", "a.adf", "slack", "--api-url", &api_url], Some(b"xoxb-T xapp-T")));
    let form = json!({"id": "lunch", "title": "Lunch", "render": "compact", "questions": [
        {"id": "q1", "text": "Where?", "type": "choice", "options": [{"id": "a", "label": "Pizza"}, {"id": "b", "label": "Sushi"}]},
        {"id": "q2", "text": "Anything else?", "type": "text"}]});
    let path = d.join("a.adf");
    let (n, p2) = (Arc::new(Mutex::new(0)), path.clone());
    let factory: ProviderFactory = Arc::new(move |_| {
        let (n, p, f) = (n.clone(), p2.clone(), form.clone());
        Ok(Arc::new(Scripted::new([]).with_fallback(move |_| {
            let mut n = n.lock().unwrap();
            *n += 1;
            let first = inbox_rows(&p).into_iter().next().unwrap();
            match *n {
                1 => Reply::Tools(vec![
                    ("msg_send".into(), json!({"parent_id": first["id"], "content": "Today's menu", "attachments": ["menu.txt"]})),
                    ("msg_send".into(), json!({"recipient": "slack:C_OPS", "content": f.to_string(), "content_type": "application/vnd.adf.form+json"})),
                    ("chat_info".into(), json!({"adapter": "slack", "chat_id": "C_OPS"})),
                ]),
                _ => Reply::Text("noted".into()),
            }
        })) as Arc<dyn adf::providers::Provider>)
    });
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let mut fleet = Fleet::new(Bus::new(), factory);
    fleet.load(&path).unwrap();
    wait_or_tell("the slash command", &path, || !inbox_rows(&path).is_empty(), told(&fake)).await;
    assert_eq!(inbox_rows(&path)[0]["content"], "/scout plan lunch");
    wait_or_tell("the upload and the form", &path, || fake.lock().unwrap().posted.len() >= 3, told(&fake)).await;
    let posted = fake.lock().unwrap().posted.clone();
    let up = posted.iter().find(|p| p["method"] == "files.completeUploadExternal").expect("an upload");
    assert_eq!((up["channel_id"].as_str(), up["initial_comment"].as_str()), (Some("C_OPS"), Some("Today's menu")));
    assert_eq!(up["bytes"], json!(["pizza, sushi"]));
    let buttons = posted.iter().find(|p| !p["blocks"].is_null()).expect("the form's buttons");
    assert_eq!(buttons["blocks"][2]["elements"][1]["action_id"], "f|lunch|q1|b", "{buttons}");
    let ask = posted.iter().find(|p| p["text"] == "Anything else? (reply in this thread)").unwrap();
    let ask_ts = ask["ts"].as_str().unwrap().to_string();
    // Ann presses Sushi and answers the free-text question in its thread; a
    // forged button for a form never sent goes nowhere.
    {
        let mut f = fake.lock().unwrap();
        let press = |env: &str, action: &str| {
            json!({"envelope_id": env, "type": "interactive", "payload": {"type": "block_actions",
            "user": {"id": "U_ANN", "username": "ann"}, "channel": {"id": "C_OPS"}, "message": {"ts": "1800000000.000002"},
            "actions": [{"action_id": action, "value": "b", "type": "button", "action_ts": format!("17.{env}")}]}})
        };
        f.queue.push_back(press("p1", "f|lunch|q1|b"));
        f.queue.push_back(press("p2", "f|payroll|q1|a"));
        let mut reply = message("r1", "C_OPS", "channel", "U_ANN", "1700000009.000100", "no onions");
        reply["payload"]["event"]["thread_ts"] = json!(ask_ts);
        f.queue.push_back(reply);
    }
    wait_or_tell("both answers", &path, || inbox_rows(&path).len() == 3, told(&fake)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answers: Vec<Value> = inbox_rows(&path)
        .iter()
        .filter_map(|r| serde_json::from_str::<Value>(r["context"].as_str()?).ok())
        .filter(|c| c["form_id"] == "lunch")
        .collect();
    assert_eq!(answers.len(), 2, "{answers:?} {:?}", inbox_rows(&path));
    assert!(answers.iter().any(|a| a["answer_id"] == "b" && a["answer_value"] == "Sushi"));
    assert!(answers.iter().any(|a| a["question_id"] == "q2" && a["answer_value"] == "no onions"));
    assert_eq!(inbox_rows(&path).len(), 3, "the forged press is not an answer");
    // chat_info asked Slack.
    let c = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let info: i64 =
        c.query_row("SELECT count(*) FROM adf_loop WHERE content_json LIKE '%ops talk%'", [], |r| r.get(0)).unwrap();
    assert!(info > 0, "chat_info answered with the channel's purpose");
    drop(c);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_slack_token_backs_off_with_the_cause() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    let fake: Shared = Arc::new(Mutex::new(Fake::default()));
    let api_url = serve(fake.clone()).await;
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    ok(&adf(d, &["adapters", "add", "a.adf", "slack", "--api-url", &api_url], Some(b"xoxb-REVOKED\nxapp-T\n")));
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let factory = quiet_model();
    let mut fleet = Fleet::new(Bus::new(), factory);
    fleet.load(&d.join("a.adf")).unwrap();
    let id = fleet.list()[0].id.clone();
    assert_eq!(backing_off(&fleet, &id).await, "auth.test: invalid_auth");
    assert_eq!(fleet.state(&id), "idle", "the agent keeps running");
    assert_eq!(fake.lock().unwrap().connections, 0, "no socket without a working bot token");
    fleet.shutdown().await;
}

/// A channel's messages pass the agent's inbox middleware like any other:
/// rewritten, or refused (logged, counted, never answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_messages_pass_the_inbox_middleware() {
    use adf::store::{Caller, Store};
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    let fake: Shared = Arc::new(Mutex::new(Fake::default()));
    let api_url = serve(fake.clone()).await;
    {
        let mut f = fake.lock().unwrap();
        f.queue.push_back(message("m1", "D_ANN", "im", "U_ANN", "1700000001.000100", "hello there"));
        f.queue.push_back(message("m2", "D_ANN", "im", "U_ANN", "1700000002.000100", "buy spam now"));
    }
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    ok(&adf(d, &["adapters", "add", "a.adf", "slack", "--api-url", &api_url], Some(b"xoxb-T xapp-T")));
    {
        let mut s = Store::open(d.join("a.adf")).unwrap();
        let code = "export function inbox({data}) {\n\
            if (String(data.payload.content).includes('spam')) return {reject: {code: 451, reason: 'no spam'}};\n\
            data.payload.content = String(data.payload.content).toUpperCase();\n\
            return {data};\n}\n";
        s.file_write(Caller::Owner, "mw.js", code.as_bytes(), &Default::default()).unwrap();
        s.file_set_authorized("mw.js", true).unwrap();
        s.config_set(Caller::Owner, "security.middleware", json!({"inbox": [{"lambda": "mw.js:inbox"}]})).unwrap();
        s.close().unwrap();
    }
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let path = d.join("a.adf");
    let mut fleet = Fleet::new(Bus::new(), quiet_model());
    fleet.load(&path).unwrap();
    let id = fleet.list()[0].id.clone();
    wait_or_tell("both acknowledged", &path, || fake.lock().unwrap().acks.len() >= 2, told(&fake)).await;
    wait_or_tell("the first", &path, || !inbox_rows(&path).is_empty(), told(&fake)).await;
    let rows = inbox_rows(&path);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["content"], "HELLO THERE", "rewritten by the middleware");
    let c = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let refused: String =
        c.query_row("SELECT message FROM adf_logs WHERE event = 'message_refused'", [], |r| r.get(0)).unwrap();
    assert!(refused.contains("rejected by inbox middleware: no spam"), "{refused}");
    assert_eq!(fleet.channel_status(&id)[0].1.refused, 1);
    drop(c);
    fleet.shutdown().await;
}
