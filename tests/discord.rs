//! The Discord channel (issue 20) against a wire-level fake of Discord on
//! loopback, written from its public reference: REST (`/gateway/bot`,
//! messages with `message_reference`, multipart uploads with
//! `payload_json`, 429 with `retry_after`, interaction callbacks, command
//! registration) and the gateway over a WebSocket (hello, heartbeats that
//! must be acknowledged, identify checked against the token — close 4004
//! when wrong —, READY, dispatches with sequence numbers, reconnect (op 7)
//! and resume (op 6) replaying what was missed).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::fleet::{Fleet, ProviderFactory};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequest, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use common::*;
use serde_json::{Value, json};

const BASE_MS: u64 = 1_764_547_200_000;

/// A snowflake made `n` seconds after the test's base time.
fn flake(n: u64) -> String {
    (((BASE_MS + n * 1000) - 1_420_070_400_000) << 22).to_string()
}

#[derive(Default)]
struct Fake {
    addr: String,
    /// Dispatches (`t`, `d`) not yet sent, and every one sent, by sequence.
    queue: Vec<(String, Value)>,
    sent: Vec<(u64, String, Value)>,
    identifies: usize,
    resumes: Vec<u64>,
    reconnect: bool,
    posted: Vec<Value>,
    callbacks: Vec<Value>,
    commands: Vec<Value>,
    history: HashMap<String, Vec<Value>>,
    throttle_once: bool,
}

type Shared = Arc<Mutex<Fake>>;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn authed(h: &HeaderMap) -> bool {
    h.get("authorization").and_then(|v| v.to_str().ok()) == Some("Bot T0KEN")
}

fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, axum::Json(json!({"message": "401: Unauthorized", "code": 0}))).into_response()
}

async fn gateway_bot(State(f): State<Shared>, h: HeaderMap) -> Response {
    if !authed(&h) {
        return unauthorized();
    }
    let addr = f.lock().unwrap().addr.clone();
    axum::Json(json!({"url": format!("ws://{addr}/gateway"), "shards": 1})).into_response()
}

async fn messages(
    State(f): State<Shared>,
    Path(ch): Path<String>,
    h: HeaderMap,
    req: axum::extract::Request,
) -> Response {
    if !authed(&h) {
        return unauthorized();
    }
    let multipart =
        h.get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|c| c.starts_with("multipart/form-data"));
    let mut rec = if multipart {
        let mut mp = axum::extract::Multipart::from_request(req, &()).await.unwrap();
        let mut rec = json!({"files": []});
        while let Some(field) = mp.next_field().await.unwrap() {
            let name = field.name().unwrap_or("").to_string();
            let file = field.file_name().map(str::to_string);
            let bytes = field.bytes().await.unwrap();
            if name == "payload_json" {
                let p: Value = serde_json::from_slice(&bytes).unwrap();
                rec["payload"] = p;
            } else if let Some(file) = file {
                rec["files"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"field": name, "name": file, "data": String::from_utf8_lossy(&bytes)}));
            }
        }
        // As Discord: every file named in payload_json.attachments is there.
        let named = rec["payload"]["attachments"].as_array().map(Vec::len).unwrap_or(0);
        if named != rec["files"].as_array().unwrap().len() {
            return (StatusCode::BAD_REQUEST, axum::Json(json!({"message": "Invalid Form Body", "code": 50035})))
                .into_response();
        }
        rec
    } else {
        let body = axum::body::to_bytes(req.into_body(), 1 << 20).await.unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
        if v["content"].as_str().is_none_or(|c| c.is_empty() || c.chars().count() > 2000) && v["components"].is_null() {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"message": "Cannot send an empty message", "code": 50006})),
            )
                .into_response();
        }
        v
    };
    let mut g = f.lock().unwrap();
    if g.throttle_once {
        g.throttle_once = false;
        return (
            StatusCode::TOO_MANY_REQUESTS,
            axum::Json(json!({"message": "You are being rate limited.", "retry_after": 0.3, "global": false})),
        )
            .into_response();
    }
    let id = flake(1000 + g.posted.len() as u64);
    rec["channel"] = json!(ch);
    rec["id"] = json!(id);
    g.posted.push(rec);
    axum::Json(json!({"id": id, "channel_id": ch})).into_response()
}

async fn history(
    State(f): State<Shared>,
    Path(ch): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    h: HeaderMap,
) -> Response {
    if !authed(&h) {
        return unauthorized();
    }
    let after: u64 = q.get("after").and_then(|a| a.parse().ok()).unwrap_or(0);
    let g = f.lock().unwrap();
    let mut msgs: Vec<Value> = g
        .history
        .get(&ch)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m["id"].as_str().unwrap().parse::<u64>().unwrap() > after)
        .collect();
    msgs.reverse();
    axum::Json(json!(msgs)).into_response()
}

async fn channel(Path(ch): Path<String>, h: HeaderMap) -> Response {
    if !authed(&h) {
        return unauthorized();
    }
    let dm = ch.starts_with("9");
    axum::Json(json!({"id": ch, "type": if dm { 1 } else { 0 }, "name": if dm { Value::Null } else { json!("ops") },
        "topic": "ops talk", "guild_id": if dm { Value::Null } else { json!("G1") }}))
    .into_response()
}

async fn commands(State(f): State<Shared>, Path(app): Path<String>, h: HeaderMap, body: axum::Json<Value>) -> Response {
    if !authed(&h) || app != "APP1" {
        return unauthorized();
    }
    f.lock().unwrap().commands.push(body.0.clone());
    axum::Json(body.0).into_response()
}

async fn callback(
    State(f): State<Shared>,
    Path((id, token)): Path<(String, String)>,
    body: axum::Json<Value>,
) -> StatusCode {
    f.lock().unwrap().callbacks.push(json!({"id": id, "token": token, "body": body.0}));
    StatusCode::NO_CONTENT
}

async fn cdn(Path(name): Path<String>) -> String {
    format!("contents of {name}")
}

async fn gateway(State(f): State<Shared>, ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(move |s| pump(f, s))
}

async fn pump(f: Shared, mut s: WebSocket) {
    let send = |v: Value| Message::Text(v.to_string().into());
    let _ = s.send(send(json!({"op": 10, "d": {"heartbeat_interval": 500}}))).await;
    // Identify or resume first.
    let first: Value = match s.recv().await {
        Some(Ok(Message::Text(t))) => serde_json::from_str(&t).unwrap(),
        _ => return,
    };
    let token_ok = first["d"]["token"] == "T0KEN";
    if !token_ok {
        let _ = s.send(Message::Close(Some(CloseFrame { code: 4004, reason: "Authentication failed.".into() }))).await;
        return;
    }
    // What to send back, worked out before any await (the lock is not Send).
    let reply: Vec<Value> = {
        let mut g = f.lock().unwrap();
        match first["op"].as_u64() {
            Some(2) => {
                assert_eq!(first["d"]["intents"].as_u64().unwrap() & (1 << 15), 1 << 15, "message content asked for");
                g.identifies += 1;
                let seq = g.sent.len() as u64 + 1;
                let addr = g.addr.clone();
                g.sent.push((seq, "READY".into(), json!({})));
                vec![json!({"op": 0, "t": "READY", "s": seq, "d": {"session_id": "S1",
                    "resume_gateway_url": format!("ws://{addr}/gateway"), "user": {"id": "BOT", "username": "scout", "bot": true},
                    "application": {"id": "APP1"}}})]
            }
            Some(6) => {
                let from = first["d"]["seq"].as_u64().unwrap_or(0);
                g.resumes.push(from);
                let mut out: Vec<Value> = g
                    .sent
                    .iter()
                    .filter(|(n, _, _)| *n > from)
                    .map(|(n, t, d)| json!({"op": 0, "t": t, "s": n, "d": d}))
                    .collect();
                out.push(json!({"op": 0, "t": "RESUMED", "s": Value::Null, "d": {}}));
                out
            }
            _ => Vec::new(),
        }
    };
    if reply.is_empty() {
        return;
    }
    for v in reply {
        let _ = s.send(send(v)).await;
    }
    loop {
        let (next, reconnect) = {
            let mut g = f.lock().unwrap();
            let r = std::mem::take(&mut g.reconnect);
            let next = if r || g.queue.is_empty() { None } else { Some(g.queue.remove(0)) };
            if let Some((t, d)) = &next {
                let seq = g.sent.len() as u64 + 1;
                g.sent.push((seq, t.clone(), d.clone()));
            }
            (next.map(|(t, d)| (g.sent.len() as u64, t, d)), r)
        };
        if reconnect {
            let _ = s.send(send(json!({"op": 7, "d": null}))).await;
            return;
        }
        if let Some((seq, t, d)) = next {
            if s.send(send(json!({"op": 0, "t": t, "s": seq, "d": d}))).await.is_err() {
                return;
            }
            continue;
        }
        match tokio::time::timeout(Duration::from_millis(50), s.recv()).await {
            Ok(Some(Ok(Message::Text(t)))) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["op"] == 1 {
                    let _ = s.send(send(json!({"op": 11}))).await;
                }
            }
            Ok(Some(Ok(_))) | Err(_) => {}
            Ok(None) | Ok(Some(Err(_))) => return,
        }
    }
}

async fn serve(f: Shared) -> String {
    let app = axum::Router::new()
        .route("/api/gateway/bot", axum::routing::get(gateway_bot))
        .route("/api/channels/{ch}/messages", axum::routing::post(messages).get(history))
        .route("/api/channels/{ch}", axum::routing::get(channel))
        .route("/api/applications/{app}/commands", axum::routing::put(commands))
        .route("/api/interactions/{id}/{token}/callback", axum::routing::post(callback))
        .route("/cdn/{name}", axum::routing::get(cdn))
        .route("/gateway", axum::routing::get(gateway))
        .with_state(f.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    f.lock().unwrap().addr = addr.clone();
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    format!("http://{addr}/api")
}

/// A message: `n` seconds after the base time, in `channel` (a DM when it
/// starts with 9), by `user`.
fn msg(n: u64, channel: &str, user: (&str, &str), text: &str) -> Value {
    let mut d = json!({"id": flake(n), "type": 0, "channel_id": channel, "content": text,
        "author": {"id": user.0, "username": user.1}, "mentions": []});
    if !channel.starts_with('9') {
        d["guild_id"] = json!("G1");
    }
    d
}

/// What the fake saw, for a timed-out wait.
fn told(fake: &Shared) -> impl FnOnce() -> String + '_ {
    move || {
        let f = fake.lock().unwrap();
        format!(
            "identifies {} resumes {:?}\nposted {:?}\ncallbacks {:?}",
            f.identifies, f.resumes, f.posted, f.callbacks
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discord_admits_by_policy_replies_resumes_and_catches_up_after_a_restart() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    let fake: Shared = Arc::new(Mutex::new(Fake { throttle_once: true, ..Default::default() }));
    let api = serve(fake.clone()).await;
    {
        let mut f = fake.lock().unwrap();
        f.queue.push(("MESSAGE_CREATE".into(), msg(1, "901", ("U_ANN", "ann"), "hello")));
        f.queue.push(("MESSAGE_CREATE".into(), msg(2, "100", ("U_BOB", "bob"), "no mention")));
        let mut m = msg(3, "100", ("U_BOB", "bob"), "<@BOT> status?");
        m["mentions"] = json!([{"id": "BOT"}]);
        f.queue.push(("MESSAGE_CREATE".into(), m));
        let mut other = msg(4, "100", ("B2", "otherbot"), "<@BOT> beep");
        other["author"]["bot"] = json!(true);
        f.queue.push(("MESSAGE_CREATE".into(), other));
        let addr = f.addr.clone();
        let mut file = msg(5, "901", ("U_ANN", "ann"), "");
        file["attachments"] = json!([{"id": "A1", "filename": "notes.txt", "size": 30, "content_type": "text/plain",
            "url": format!("http://{addr}/cdn/notes.txt")}]);
        f.queue.push(("MESSAGE_CREATE".into(), file));
    }
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    fails(
        &adf(d, &["adapters", "add", "a.adf", "discord", "--api-url", "ftp://x"], Some(b"T0KEN\n")),
        &["http or https"],
    );
    ok(&adf(d, &["adapters", "add", "a.adf", "discord", "--api-url", &api, "--group", "mention"], Some(b"T0KEN\n")));
    let raw = std::fs::read(d.join("a.adf")).unwrap();
    assert!(!raw.windows(5).any(|w| w == b"T0KEN"), "the token is sealed");
    let path = d.join("a.adf");
    let (n, p2) = (Arc::new(Mutex::new(0)), path.clone());
    let factory: ProviderFactory = Arc::new(move |_| {
        let (n, p) = (n.clone(), p2.clone());
        Ok(Arc::new(Scripted::new([]).with_fallback(move |_| {
            let mut n = n.lock().unwrap();
            if *n == 0
                && let Some(ops) = inbox_rows(&p).into_iter().find(|r| r["from"] == "discord:100")
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
    wait_or_tell("three messages", &path, || inbox_rows(&path).len() == 3, told(&fake)).await;
    let rows = inbox_rows(&path);
    assert_eq!(rows[0]["content"], "hello");
    assert_eq!((rows[1]["from"].as_str(), rows[1]["content"].as_str()), (Some("discord:100"), Some("status?")));
    let att: Value = serde_json::from_str(rows[2]["attachments"].as_str().unwrap()).unwrap();
    assert_eq!(att[0]["transfer"], "imported", "{att}");
    assert_eq!(
        ok(&adf(d, &["files", "cat", "a.adf", att[0]["path"].as_str().unwrap()], None)),
        "contents of notes.txt"
    );
    // The slash command was registered for the application.
    wait_or_tell("the command", &path, || !fake.lock().unwrap().commands.is_empty(), told(&fake)).await;
    assert_eq!(fake.lock().unwrap().commands[0][0]["name"], "scout");
    // The reply, after a 429: a reply to the message.
    wait_or_tell("the reply", &path, || !fake.lock().unwrap().posted.is_empty(), told(&fake)).await;
    let post = fake.lock().unwrap().posted[0].clone();
    assert_eq!((post["channel"].as_str(), post["content"].as_str()), (Some("100"), Some("All green.")));
    assert_eq!(post["message_reference"]["message_id"], flake(3));

    // Reconnect: the session resumes from its sequence, and what was sent
    // meanwhile comes (a redelivered message is not a second row).
    {
        let mut f = fake.lock().unwrap();
        f.queue.push(("MESSAGE_CREATE".into(), msg(6, "901", ("U_ANN", "ann"), "after the resume")));
        f.queue.push(("MESSAGE_CREATE".into(), msg(1, "901", ("U_ANN", "ann"), "hello")));
        f.reconnect = true;
    }
    wait_or_tell("the resume", &path, || !fake.lock().unwrap().resumes.is_empty(), told(&fake)).await;
    wait_or_tell("the message after it", &path, || inbox_rows(&path).len() == 4, told(&fake)).await;
    assert_eq!(fake.lock().unwrap().identifies, 1, "resumed, not identified again");
    assert!(fake.lock().unwrap().resumes[0] >= 6, "from the last sequence seen");
    let st = fleet.channel_status(&id);
    assert_eq!(st[0].1.account.as_deref(), Some("@scout"));
    assert_eq!((st[0].1.received, st[0].1.sent, st[0].1.refused), (4, 1, 1), "{st:?}");
    fleet.shutdown().await;

    // Off, then on again: what arrived meanwhile is read back as one batch.
    fake.lock().unwrap().history.insert(
        "901".into(),
        vec![
            msg(6, "901", ("U_ANN", "ann"), "after the resume"),
            msg(8, "901", ("U_ANN", "ann"), "while you were off"),
        ],
    );
    let mut fleet = Fleet::new(Bus::new(), quiet_model());
    fleet.load(&path).unwrap();
    wait_or_tell("the catch-up", &path, || inbox_rows(&path).len() == 5, told(&fake)).await;
    assert_eq!(inbox_rows(&path)[4]["content"], "while you were off");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discord_forms_are_buttons_files_go_with_the_message_and_slash_commands_are_answered() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    let fake: Shared = Arc::new(Mutex::new(Fake::default()));
    let api = serve(fake.clone()).await;
    fake.lock().unwrap().queue.push((
        "INTERACTION_CREATE".into(),
        json!({"id": "I1", "token": "itok", "type": 2,
        "channel_id": "100", "guild_id": "G1", "member": {"user": {"id": "U_ANN", "username": "ann"}},
        "data": {"name": "scout", "options": [{"name": "prompt", "type": 3, "value": "plan lunch"}]}}),
    ));
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    ok(&adf(d, &["files", "put", "a.adf", "menu.txt"], Some(b"pizza, sushi")));
    ok(&adf(d, &["adapters", "add", "a.adf", "discord", "--api-url", &api], Some(b"T0KEN\n")));
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
            if *n == 1 {
                let first = inbox_rows(&p).into_iter().next().unwrap();
                return Reply::Tools(vec![
                    ("msg_send".into(), json!({"parent_id": first["id"], "content": "Today's menu", "attachments": ["menu.txt"]})),
                    ("msg_send".into(), json!({"recipient": "discord:100", "content": f.to_string(), "content_type": "application/vnd.adf.form+json"})),
                    ("chat_info".into(), json!({"adapter": "discord", "chat_id": "100"})),
                ]);
            }
            Reply::Text("noted".into())
        })) as Arc<dyn adf::providers::Provider>)
    });
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let mut fleet = Fleet::new(Bus::new(), factory);
    fleet.load(&path).unwrap();
    wait_or_tell("the command", &path, || !inbox_rows(&path).is_empty(), told(&fake)).await;
    assert_eq!(inbox_rows(&path)[0]["content"], "/scout plan lunch");
    wait_or_tell("its answer", &path, || !fake.lock().unwrap().callbacks.is_empty(), told(&fake)).await;
    assert_eq!(fake.lock().unwrap().callbacks[0]["body"]["type"], 4, "answered within Discord's 3 s");
    wait_or_tell("the file and the form", &path, || fake.lock().unwrap().posted.len() >= 3, told(&fake)).await;
    let posted = fake.lock().unwrap().posted.clone();
    let up = posted.iter().find(|p| p["files"].as_array().is_some_and(|f| !f.is_empty())).expect("an upload");
    assert_eq!(up["payload"]["content"], "Today's menu");
    assert_eq!(up["files"][0], json!({"field": "files[0]", "name": "menu.txt", "data": "pizza, sushi"}));
    let buttons = posted.iter().find(|p| !p["components"].is_null()).expect("the buttons");
    assert_eq!(buttons["components"][0]["components"][1]["custom_id"], "f|lunch|q1|b");
    let ask =
        posted.iter().find(|p| p["content"].as_str().is_some_and(|c| c.contains("(reply to this message)"))).unwrap();
    let ask_id = ask["id"].as_str().unwrap().to_string();
    {
        let mut f = fake.lock().unwrap();
        let press = |id: &str, custom: &str| {
            json!({"id": id, "token": "t", "type": 3, "channel_id": "100", "guild_id": "G1",
            "member": {"user": {"id": "U_ANN", "username": "ann"}}, "message": {"id": "M1"},
            "data": {"custom_id": custom, "component_type": 2}})
        };
        f.queue.push(("INTERACTION_CREATE".into(), press("I2", "f|lunch|q1|b")));
        f.queue.push(("INTERACTION_CREATE".into(), press("I3", "f|payroll|q1|a")));
        let mut reply = msg(20, "100", ("U_ANN", "ann"), "no onions");
        reply["message_reference"] = json!({"message_id": ask_id});
        f.queue.push(("MESSAGE_CREATE".into(), reply));
    }
    wait_or_tell("both answers", &path, || inbox_rows(&path).len() == 3, told(&fake)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answers: Vec<Value> = inbox_rows(&path)
        .iter()
        .filter_map(|r| serde_json::from_str::<Value>(r["context"].as_str()?).ok())
        .filter(|c| c["form_id"] == "lunch")
        .collect();
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert!(answers.iter().any(|a| a["answer_value"] == "Sushi"));
    assert!(answers.iter().any(|a| a["question_id"] == "q2" && a["answer_value"] == "no onions"));
    assert_eq!(inbox_rows(&path).len(), 3, "the forged press is not an answer");
    assert!(fake.lock().unwrap().callbacks.iter().any(|c| c["body"]["type"] == 6), "the press was acknowledged");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_discord_token_backs_off_with_the_cause() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    let fake: Shared = Arc::new(Mutex::new(Fake::default()));
    let api = serve(fake.clone()).await;
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    ok(&adf(d, &["adapters", "add", "a.adf", "discord", "--api-url", &api], Some(b"WRONG\n")));
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let mut fleet = Fleet::new(Bus::new(), quiet_model());
    fleet.load(&d.join("a.adf")).unwrap();
    let id = fleet.list()[0].id.clone();
    let e = backing_off(&fleet, &id).await;
    assert!(e.contains("401: Unauthorized") && !e.contains("WRONG"), "{e}");
    assert_eq!(fleet.state(&id), "idle");
    fleet.shutdown().await;
}
