//! Channel adapters (issue 20) against a wire-level fake of Telegram's Bot
//! API on loopback: `getMe`, long-polling `getUpdates` that keeps updates
//! until a later call confirms them (its `offset`), `sendMessage` that
//! answers 429 with `retry_after` once. The agent runs in a real fleet with
//! a scripted model; its token is in its sealed credentials.

mod common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::fleet::{Fleet, ProviderFactory};
use axum::Json;
use axum::extract::{Path, State};
use common::*;
use serde_json::{Value, json};

#[derive(Default)]
struct Fake {
    /// Updates not yet confirmed.
    pending: VecDeque<Value>,
    sent: Vec<Value>,
    polls: usize,
    /// Answer the next sendMessage with 429 (retry after 1 s).
    throttle_once: bool,
    tokens: Vec<String>,
}

type Shared = Arc<Mutex<Fake>>;

/// The fleet reads the install from `ADF_HOME`: one test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn bot(State(f): State<Shared>, Path((token, method)): Path<(String, String)>, body: Json<Value>) -> Json<Value> {
    let token = token.trim_start_matches("bot").to_string();
    if token != "123:SECRET" {
        return Json(json!({"ok": false, "error_code": 401, "description": "Unauthorized"}));
    }
    match method.as_str() {
        "getMe" => Json(json!({"ok": true, "result": {"id": 123, "is_bot": true, "username": "scout_bot"}})),
        "getUpdates" => {
            // Confirm what came before the offset, as Telegram does.
            if let Some(o) = body["offset"].as_i64() {
                f.lock().unwrap().pending.retain(|u| u["update_id"].as_i64().unwrap() >= o);
            }
            let wait = body["timeout"].as_u64().unwrap_or(0).min(1);
            let deadline = Instant::now() + Duration::from_secs(wait);
            loop {
                {
                    let mut g = f.lock().unwrap();
                    g.polls += 1;
                    g.tokens.push(token.clone());
                    if !g.pending.is_empty() || Instant::now() >= deadline {
                        let batch: Vec<Value> = g.pending.iter().cloned().collect();
                        return Json(json!({"ok": true, "result": batch}));
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        "sendPoll" => {
            let mut g = f.lock().unwrap();
            g.sent.push(body.0.clone());
            let id = 1000 + g.sent.len();
            Json(json!({"ok": true, "result": {"message_id": id, "poll": {"id": format!("P{id}")}}}))
        }
        "answerCallbackQuery" => {
            f.lock().unwrap().sent.push(json!({"answered": body["callback_query_id"]}));
            Json(json!({"ok": true, "result": true}))
        }
        "getChat" => {
            Json(json!({"ok": true, "result": {"id": body["chat_id"], "type": "private", "first_name": "Ann"}}))
        }
        "getChatMemberCount" => Json(json!({"ok": true, "result": 2})),
        "getFile" => Json(json!({"ok": true, "result": {"file_id": body["file_id"], "file_path": "photos/p1.jpg"}})),
        "sendMessage" => {
            let mut g = f.lock().unwrap();
            if g.throttle_once {
                g.throttle_once = false;
                return Json(json!({"ok": false, "error_code": 429, "description": "Too Many Requests: retry after 1",
                    "parameters": {"retry_after": 1}}));
            }
            // As Telegram: HTML with a tag it does not know is refused.
            if body["parse_mode"] == "HTML" && !html_ok(body["text"].as_str().unwrap_or("")) {
                return Json(json!({"ok": false, "error_code": 400,
                    "description": "Bad Request: can't parse entities: Unsupported start tag"}));
            }
            g.sent.push(body.0.clone());
            let id = 1000 + g.sent.len();
            Json(json!({"ok": true, "result": {"message_id": id, "chat": {"id": body["chat_id"]}}}))
        }
        _ => Json(json!({"ok": false, "error_code": 404, "description": "Not Found"})),
    }
}

/// Telegram's HTML: only its tags; any other `<` must be escaped.
fn html_ok(text: &str) -> bool {
    const TAGS: [&str; 9] = ["b", "i", "s", "u", "code", "pre", "a", "blockquote", "tg-spoiler"];
    text.split('<').skip(1).all(|rest| {
        let name: String =
            rest.trim_start_matches('/').chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
        TAGS.contains(&name.as_str())
    })
}

/// Every Bot API call: a file upload (multipart, `sendPhoto`,
/// `sendDocument`) is checked as Telegram does and recorded with its
/// fields; anything else is JSON.
async fn entry(
    State(f): State<Shared>,
    Path((token, method)): Path<(String, String)>,
    req: axum::extract::Request,
) -> Json<Value> {
    use axum::extract::FromRequest;
    let multipart = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    if !multipart {
        let body = axum::body::to_bytes(req.into_body(), 1 << 20).await.unwrap_or_default();
        let v: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
        return bot(State(f), Path((token, method)), Json(v)).await;
    }
    if token != "bot123:SECRET" {
        return Json(json!({"ok": false, "error_code": 401, "description": "Unauthorized"}));
    }
    let mut mp = axum::extract::Multipart::from_request(req, &()).await.unwrap();
    let mut fields = serde_json::Map::new();
    while let Some(field) = mp.next_field().await.unwrap() {
        let name = field.name().unwrap_or("").to_string();
        let file = field.file_name().map(str::to_string);
        let ct = field.content_type().map(str::to_string);
        let bytes = field.bytes().await.unwrap();
        let v = match file {
            Some(file) => json!({"file_name": file, "content_type": ct, "data": String::from_utf8_lossy(&bytes)}),
            None => json!(String::from_utf8_lossy(&bytes)),
        };
        fields.insert(name, v);
    }
    let needs = match method.as_str() {
        "sendPhoto" => "photo",
        "sendDocument" => "document",
        _ => return Json(json!({"ok": false, "error_code": 404, "description": "Not Found"})),
    };
    if !fields.contains_key("chat_id") || !fields[needs].get("file_name").is_some_and(Value::is_string) {
        return Json(
            json!({"ok": false, "error_code": 400, "description": format!("Bad Request: there is no {needs} in the request")}),
        );
    }
    let mut g = f.lock().unwrap();
    fields.insert("method".into(), json!(method));
    g.sent.push(Value::Object(fields));
    let id = 1000 + g.sent.len();
    Json(json!({"ok": true, "result": {"message_id": id}}))
}

/// A file download (`/file/bot<token>/<path>`).
async fn file(Path((token, _dir, _name)): Path<(String, String, String)>) -> (axum::http::StatusCode, Vec<u8>) {
    if token != "bot123:SECRET" {
        return (axum::http::StatusCode::UNAUTHORIZED, Vec::new());
    }
    (axum::http::StatusCode::OK, b"\xff\xd8\xff fake jpeg bytes".to_vec())
}

async fn serve(f: Shared) -> String {
    let app = axum::Router::new()
        .route("/{token}/{method}", axum::routing::post(entry))
        .route("/file/{token}/{dir}/{name}", axum::routing::get(file))
        .with_state(f);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    format!("http://{addr}")
}

fn dm(update: i64, message: i64, from: (i64, &str), text: &str) -> Value {
    json!({"update_id": update, "message": {"message_id": message, "date": 1_764_547_200,
        "from": {"id": from.0, "username": from.1}, "chat": {"id": from.0, "type": "private"}, "text": text}})
}

fn group(update: i64, message: i64, text: &str, mention: bool) -> Value {
    let entities = if mention { json!([{"type": "mention", "offset": 0, "length": 10}]) } else { json!([]) };
    json!({"update_id": update, "message": {"message_id": message, "date": 1_764_547_200,
        "from": {"id": 77, "username": "carol"}, "chat": {"id": -100, "type": "supergroup", "title": "Ops"},
        "text": text, "entities": entities}})
}

/// A model that sends `form` to Ann's chat on its first call, then says
/// it noted the answers.
fn sends_once(form: Value) -> ProviderFactory {
    let once = Arc::new(Mutex::new(false));
    Arc::new(move |_| {
        let (o, f) = (once.clone(), form.clone());
        Ok(Arc::new(Scripted::new([]).with_fallback(move |_| {
            let mut done = o.lock().unwrap();
            if !*done {
                *done = true;
                return Reply::Tools(vec![(
                    "msg_send".into(),
                    json!({"recipient": "telegram:42", "content": f.to_string(), "content_type": "application/vnd.adf.form+json"}),
                )]);
            }
            Reply::Text("noted".into())
        })) as Arc<dyn adf::providers::Provider>)
    })
}

fn inbox(path: &std::path::Path) -> Vec<(String, String, String)> {
    let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut st = c.prepare("SELECT \"from\", content, source FROM adf_inbox ORDER BY received_at, id").unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().collect::<Result<_, _>>().unwrap()
}

/// What the fake saw, for a timed-out wait.
fn told(fake: &Shared) -> impl FnOnce() -> String + '_ {
    move || {
        let f = fake.lock().unwrap();
        format!("polls {} pending {:?}\nsent {:?}", f.polls, f.pending, f.sent)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_catches_up_admits_by_policy_replies_threaded_and_survives_a_429() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    let fake: Shared = Arc::new(Mutex::new(Fake { throttle_once: true, ..Default::default() }));
    let api = serve(fake.clone()).await;
    // What arrived while the agent was off: waiting on Telegram's side.
    {
        let mut f = fake.lock().unwrap();
        f.pending.push_back(dm(1, 10, (42, "ann"), "are you there?"));
        f.pending.push_back(dm(2, 11, (43, "bob"), "let me in"));
        f.pending.push_back(group(3, 12, "no mention here", false));
        f.pending.push_back(group(4, 13, "@scout_bot status please", true));
    }
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    // Bad input first: nothing changes.
    let before = snapshot(&d.join("a.adf"));
    fails(&adf(d, &["adapters", "add", "a.adf", "telegram", "--api-url", "ftp://x"], Some(b"t\n")), &["http or https"]);
    fails(&adf(d, &["adapters", "add", "a.adf", "telegram", "--dm", "allowlist"], Some(b"t\n")), &["--allow"]);
    fails(&adf(d, &["adapters", "add", "a.adf", "telegram"], Some(b"\n")), &["no telegram token"]);
    assert_eq!(snapshot(&d.join("a.adf")), before);
    ok(&adf(
        d,
        &[
            "adapters",
            "add",
            "a.adf",
            "telegram",
            "--api-url",
            &api,
            "--dm",
            "allowlist",
            "--allow",
            "@ann",
            "--group",
            "mention",
        ],
        Some(b"123:SECRET\n"),
    ));
    let ls = ok(&adf(d, &["adapters", "ls", "a.adf"], None));
    assert!(ls.contains("telegram") && ls.contains("allowlist") && !ls.contains("SECRET"), "{ls}");
    let raw = std::fs::read(d.join("a.adf")).unwrap();
    assert!(!raw.windows(6).any(|w| w == b"SECRET"), "the token is sealed, never in clear in the file");
    // Short polls for the test.
    ok(&adf(d, &["config", "set", "a.adf", "adapters.telegram.config.poll_timeout_s", "1"], None));

    // The model answers the batch by replying on the channel, threaded.
    let replied = Arc::new(Mutex::new(0usize));
    let r2 = replied.clone();
    let factory: ProviderFactory = Arc::new(move |_| {
        let r = r2.clone();
        Ok(Arc::new(Scripted::new([]).with_fallback(move |req| {
            let seen = serde_json::to_string(&*req.messages).unwrap_or_default();
            let mut n = r.lock().unwrap();
            if *n == 0 && seen.contains("unread") {
                *n += 1;
                // Reply to Ann by address; the model saw one wake.
                return Reply::Tools(vec![(
                    "msg_send".into(),
                    json!({"recipient": "telegram:42", "content": "**Here**, Ann: `a<b`."}),
                )]);
            }
            if *n == 1 {
                *n += 1;
                return Reply::Tools(vec![("chat_info".into(), json!({"adapter": "telegram", "chat_id": "42"}))]);
            }
            Reply::Text("done".into())
        })) as Arc<dyn adf::providers::Provider>)
    });
    let mut fleet = Fleet::new(Bus::new(), factory);
    let cfg_path = d.join("a.adf");
    // The fleet's process needs this test's install to open the token.
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    fleet.load(&cfg_path).unwrap();
    let id = fleet.list()[0].id.clone();
    let path = cfg_path.clone();
    wait_or_tell("the batch in the inbox", &path, || inbox(&path).len() >= 2, told(&fake)).await;
    let rows = inbox(&path);
    // One batch shares its arrival time: compare as a set.
    let mut from: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    from.sort();
    assert_eq!(
        from,
        ["telegram:-100", "telegram:42"],
        "Ann's DM and the mention; Bob and the unmentioned group refused"
    );
    assert!(rows.iter().all(|r| r.2 == "telegram"));
    wait_or_tell("the reply sent", &path, || !fake.lock().unwrap().sent.is_empty(), told(&fake)).await;
    let sent = fake.lock().unwrap().sent.clone();
    assert_eq!(
        (sent[0]["chat_id"].as_str(), sent[0]["text"].as_str(), sent[0]["parse_mode"].as_str()),
        (Some("42"), Some("<b>Here</b>, Ann: <code>a&lt;b</code>."), Some("HTML")),
        "Markdown as Telegram's HTML: {sent:?}"
    );
    let status = fleet.channel_status(&id);
    assert_eq!(status[0].0, "telegram");
    assert_eq!((status[0].1.received, status[0].1.sent, status[0].1.refused), (2, 1, 2), "{status:?}");
    assert_eq!(status[0].1.account.as_deref(), Some("@scout_bot"));
    // One wake for the batch that waited, not one per message.
    wait_or_tell(
        "the turn of the wake to end",
        &path,
        || {
            let c = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
            c.query_row("SELECT count(*) FROM adf_loop WHERE content_json LIKE '%\"done\"%'", [], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap()
                > 0
        },
        told(&fake),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    {
        let c = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let wakes: i64 = c
            .query_row("SELECT count(*) FROM adf_loop WHERE content_json LIKE '%Inbox notification%'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(wakes, 1, "the catch-up batch woke the agent once");
    }
    // chat_info asked the channel itself.
    wait_or_tell("chat_info", &path, || {
        let c = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let n: i64 = c
            .query_row(
                "SELECT count(*) FROM adf_loop WHERE content_json LIKE '%participant_count%' AND content_json LIKE '%Ann%'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        n > 0
    }, told(&fake))
    .await;
    // Files: a photo is imported into the agent's files; one over the
    // limit is recorded as skipped with why, never dropped silently.
    fake.lock().unwrap().pending.push_back(json!({"update_id": 6, "message": {"message_id": 15, "date": 1_764_547_200,
        "from": {"id": 42, "username": "ann"}, "chat": {"id": 42, "type": "private"}, "caption": "the whiteboard",
        "photo": [{"file_id": "small", "file_size": 10}, {"file_id": "big", "file_size": 22}]}}));
    fake.lock().unwrap().pending.push_back(json!({"update_id": 7, "message": {"message_id": 16, "date": 1_764_547_200,
        "from": {"id": 42, "username": "ann"}, "chat": {"id": 42, "type": "private"},
        "document": {"file_id": "huge", "file_name": "dump.bin", "file_size": 50_000_000u64}}}));
    wait_or_tell("the files", &path, || inbox(&path).len() == 4, told(&fake)).await;
    {
        let c = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let att: Vec<String> = c
            .prepare("SELECT attachments FROM adf_inbox WHERE attachments IS NOT NULL ORDER BY received_at")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let photo: Value = serde_json::from_str(&att[0]).unwrap();
        assert_eq!(photo[0]["transfer"], "imported", "{photo}");
        let p = photo[0]["path"].as_str().unwrap().to_string();
        assert!(p.starts_with("imported/telegram-42/photo_15"), "{p}");
        let bytes: Vec<u8> = c.query_row("SELECT content FROM adf_files WHERE path = ?1", [&p], |r| r.get(0)).unwrap();
        assert_eq!(&bytes[3..], b" fake jpeg bytes");
        let big: Value = serde_json::from_str(&att[1]).unwrap();
        assert_eq!(big[0]["skipped"], true, "{big}");
        assert!(big[0]["reason"].as_str().unwrap().contains("over the"), "{big}");
    }
    // Redelivery: the same update again is not a second inbox row.
    fake.lock().unwrap().pending.push_back(dm(1, 10, (42, "ann"), "are you there?"));
    fake.lock().unwrap().pending.push_back(dm(5, 14, (42, "ann"), "thanks"));
    wait_or_tell("the new message", &path, || inbox(&path).len() == 5, told(&fake)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(inbox(&path).len(), 5, "a redelivered update is not delivered twice");
    // Refusals are logged, never answered.
    let c = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let refused: i64 =
        c.query_row("SELECT count(*) FROM adf_logs WHERE event = 'message_refused'", [], |r| r.get(0)).unwrap();
    assert_eq!(refused, 2);
    assert!(fake.lock().unwrap().sent.iter().all(|m| m["chat_id"] != "43"), "Bob got no answer");
    drop(c);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_backs_off_with_the_cause_and_the_agent_keeps_running() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    let fake: Shared = Arc::new(Mutex::new(Fake::default()));
    let api = serve(fake.clone()).await;
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    ok(&adf(d, &["adapters", "add", "a.adf", "telegram", "--api-url", &api], Some(b"999:REVOKED\n")));
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let factory = quiet_model();
    let mut fleet = Fleet::new(Bus::new(), factory);
    fleet.load(&d.join("a.adf")).unwrap();
    let id = fleet.list()[0].id.clone();
    let err = backing_off(&fleet, &id).await;
    assert!(err.contains("Unauthorized") && err.contains("401"), "{err}");
    assert!(!err.contains("REVOKED"), "the token never shows: {err}");
    assert_eq!(fleet.state(&id), "idle", "the agent keeps running");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_goes_out_as_buttons_and_its_answers_come_back_as_messages() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    let fake: Shared = Arc::new(Mutex::new(Fake::default()));
    let api = serve(fake.clone()).await;
    fake.lock().unwrap().pending.push_back(dm(1, 10, (42, "ann"), "plan lunch"));
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    ok(&adf(d, &["adapters", "add", "a.adf", "telegram", "--api-url", &api], Some(b"123:SECRET\n")));
    ok(&adf(d, &["config", "set", "a.adf", "adapters.telegram.config.poll_timeout_s", "1"], None));
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let form = json!({"id": "lunch", "title": "Lunch", "render": "per_question", "questions": [
        {"id": "q1", "text": "Where?", "type": "choice", "options": [{"id": "a", "label": "Pizza"}, {"id": "b", "label": "Sushi"}]},
        {"id": "q2", "text": "Anything else?", "type": "text"}]});
    let factory = sends_once(form);
    let mut fleet = Fleet::new(Bus::new(), factory);
    let path = d.join("a.adf");
    fleet.load(&path).unwrap();
    wait_or_tell("the form's two messages", &path, || fake.lock().unwrap().sent.len() >= 2, told(&fake)).await;
    let sent = fake.lock().unwrap().sent.clone();
    assert!(sent[0]["text"].as_str().unwrap().starts_with("Lunch"), "{sent:?}");
    let buttons = &sent[0]["reply_markup"]["inline_keyboard"];
    assert_eq!(buttons[1][0], json!({"text": "Sushi", "callback_data": "f|lunch|q1|b"}), "{buttons}");
    assert_eq!(sent[1]["reply_markup"]["force_reply"], true, "the free-text question asks for a reply");
    // Ann presses Sushi and replies to the free-text question; a forged
    // button for a form never sent goes nowhere.
    {
        let mut f = fake.lock().unwrap();
        let chat = json!({"id": 42, "type": "private"});
        f.pending
            .push_back(json!({"update_id": 2, "callback_query": {"id": "cb1", "from": {"id": 42, "username": "ann"},
            "message": {"message_id": 1001, "chat": chat}, "data": "f|lunch|q1|b"}}));
        f.pending.push_back(
            json!({"update_id": 3, "callback_query": {"id": "cb2", "from": {"id": 66, "username": "mallory"},
            "message": {"message_id": 1001, "chat": chat}, "data": "f|payroll|q1|a"}}),
        );
        f.pending.push_back(json!({"update_id": 4, "message": {"message_id": 20, "date": 1_764_547_200,
            "from": {"id": 42, "username": "ann"}, "chat": chat, "text": "no onions",
            "reply_to_message": {"message_id": 1002}}}));
    }
    wait_or_tell("both answers", &path, || inbox(&path).len() == 3, told(&fake)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let answers: Vec<Value> = c
        .prepare("SELECT source_context FROM adf_inbox WHERE source_context LIKE '%form_id%' ORDER BY received_at")
        .unwrap()
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|s| serde_json::from_str(&s.unwrap()).unwrap())
        .collect();
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(
        (answers[0]["form_id"].as_str(), answers[0]["answer_id"].as_str(), answers[0]["answer_value"].as_str()),
        (Some("lunch"), Some("b"), Some("Sushi"))
    );
    assert_eq!(
        (answers[1]["question_id"].as_str(), answers[1]["answer_value"].as_str()),
        (Some("q2"), Some("no onions"))
    );
    assert_eq!(inbox(&path).len(), 3, "the forged button is not an answer");
    assert!(fake.lock().unwrap().sent.iter().any(|m| m["answered"] == "cb1"), "the button press was acknowledged");
    drop(c);
    fleet.shutdown().await;
}

/// Self-service setup: the agent stores its own bot token and switches the
/// channel on, after the owner approves it once; the token is sealed and
/// never repeated in the task row or the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_switches_a_channel_on_itself_after_one_approval() {
    use adf::runtime::executor::{ApprovalRequest, Decision, Executor, Owner};
    use futures_util::future::BoxFuture;
    struct Approves(Mutex<Vec<Value>>);
    impl Owner for Approves {
        fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, Decision> {
            self.0.lock().unwrap().push(json!({"tool": req.tool}));
            Box::pin(async { Decision::Approve { always: false } })
        }
        fn answer<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Option<String>> {
            Box::pin(async { None })
        }
    }
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    let fake: Shared = Arc::new(Mutex::new(Fake::default()));
    let api = serve(fake.clone()).await;
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    // The owner lets it (declared, not even restricted: it asks anyway).
    let raw = rusqlite::Connection::open(d.join("a.adf")).unwrap();
    raw.execute(
        "UPDATE adf_config SET config_json = json_insert(config_json, '$.tools[#]', json('{\"name\":\"adapter_setup\",\"enabled\":true}'))",
        [],
    )
    .unwrap();
    drop(raw);
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let inst = adf::identity::install::current().unwrap();
    let mut store = adf::store::Store::open(d.join("a.adf")).unwrap();
    store.unlock(&inst).unwrap();
    let provider = Arc::new(Scripted::new([
        Reply::Tools(vec![(
            "adapter_setup".into(),
            json!({"type": "telegram", "token": "123:SECRET", "dm": "all", "api_url": api}),
        )]),
        Reply::Text("I am on Telegram now.".into()),
    ]));
    let bus = Bus::new();
    let mut sub =
        bus.subscribe(None, adf::runtime::bus::Filter { agent_id: None, types: vec!["hil.requested".into()] });
    let owner = Arc::new(Approves(Mutex::new(Vec::new())));
    let mut ex = Executor::new(store, provider, bus.clone(), owner.clone()).unwrap();
    ex.chat("here is a bot token for you").await.unwrap();
    assert_eq!(owner.0.lock().unwrap().len(), 1, "asked once");
    let Some(adf::runtime::bus::Item::Event(e)) = sub.try_next() else { panic!("no hil.requested") };
    assert_eq!(e.event.payload["input"]["token"], "[secret]", "the event does not carry the token");
    let tasks = ex.store.task_list(None).unwrap();
    assert_eq!(tasks[0].args["token"], "[secret]", "nor the task row");
    let cfg = ex.store.config_value().unwrap();
    assert_eq!(cfg["adapters"]["telegram"]["enabled"], true);
    ex.store_into().close().unwrap();
    let bytes = std::fs::read(d.join("a.adf")).unwrap();
    let in_loop = bytes.windows(10).filter(|w| *w == b"123:SECRET").count();
    assert!(in_loop <= 1, "only the model's own call in the loop holds it, never a second copy");
    // Loaded, the channel connects with the sealed token.
    let factory = quiet_model();
    let mut fleet = Fleet::new(Bus::new(), factory);
    fleet.load(&d.join("a.adf")).unwrap();
    wait_or_tell(
        "the channel to poll with the sealed token",
        &d.join("a.adf"),
        || fake.lock().unwrap().tokens.iter().any(|t| t == "123:SECRET"),
        told(&fake),
    )
    .await;
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_rendered_as_a_poll_is_a_native_poll_and_votes_are_answers() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    let fake: Shared = Arc::new(Mutex::new(Fake::default()));
    let api = serve(fake.clone()).await;
    fake.lock().unwrap().pending.push_back(dm(1, 10, (42, "ann"), "vote please"));
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    ok(&adf(d, &["adapters", "add", "a.adf", "telegram", "--api-url", &api], Some(b"123:SECRET\n")));
    ok(&adf(d, &["config", "set", "a.adf", "adapters.telegram.config.poll_timeout_s", "1"], None));
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let form = json!({"id": "day", "render": "poll", "questions": [{"id": "q1", "text": "Which day?", "type": "choice",
        "options": [{"id": "mo", "label": "Monday"}, {"id": "tu", "label": "Tuesday"}, {"id": "we", "label": "Wednesday"}]}]});
    let factory = sends_once(form);
    let mut fleet = Fleet::new(Bus::new(), factory);
    let path = d.join("a.adf");
    fleet.load(&path).unwrap();
    wait_or_tell("the poll", &path, || !fake.lock().unwrap().sent.is_empty(), told(&fake)).await;
    let poll = fake.lock().unwrap().sent[0].clone();
    assert_eq!(poll["question"], "Which day?");
    assert_eq!(poll["options"][2], json!({"text": "Wednesday"}));
    assert_eq!(poll["is_anonymous"], false, "votes must say who voted");
    {
        let mut f = fake.lock().unwrap();
        f.pending.push_back(json!({"update_id": 2, "poll_answer": {"poll_id": "P1001", "user": {"id": 42, "username": "ann"}, "option_ids": [2]}}));
        f.pending.push_back(
            json!({"update_id": 3, "poll_answer": {"poll_id": "P9", "user": {"id": 42}, "option_ids": [0]}}),
        );
    }
    wait_or_tell("the vote", &path, || inbox(&path).len() == 2, told(&fake)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(inbox(&path).len(), 2, "a vote in a poll the bot did not send is nothing");
    let c = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let ctx: String = c
        .query_row("SELECT source_context FROM adf_inbox WHERE source_context LIKE '%form_id%'", [], |r| r.get(0))
        .unwrap();
    let ctx: Value = serde_json::from_str(&ctx).unwrap();
    assert_eq!((ctx["answer_id"].as_str(), ctx["answer_value"].as_str()), (Some("we"), Some("Wednesday")), "{ctx}");
    drop(c);
    fleet.shutdown().await;
}

/// A file a daemon holds: `adf adapters add` connects the channel through
/// the daemon's agent, which starts it at once; the route answers no token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_add_on_a_held_file_goes_through_the_daemon() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let home = dir.path().join("home");
    let agents = home.join("data/agents");
    std::fs::create_dir_all(&agents).unwrap();
    let fake: Shared = Arc::new(Mutex::new(Fake::default()));
    let api = serve(fake.clone()).await;
    ok(&adf_home(&home, &agents, &["new", "a.adf", "--provider", "anthropic", "--model", "m"]));
    let (mut daemon, url, token) = spawn_daemon(&home, &[], &[]);
    let (h, ag, a2) = (home.clone(), agents.clone(), api.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_adf"))
            .args(["adapters", "add", "a.adf", "telegram", "--api-url", &a2])
            .current_dir(&ag)
            .env("ADF_HOME", &h)
            .env("TELEGRAM_BOT_TOKEN", "123:SECRET")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = ok(&out);
    assert!(text.contains("through the process that holds it"), "{text}");
    let http = adf::providers::http_client();
    let get = |path: String| {
        let (http, url, token) = (http.clone(), url.clone(), token.clone());
        async move {
            let r = http.get(format!("{url}{path}")).bearer_auth(token).send().await.unwrap();
            r.json::<Value>().await.unwrap()
        }
    };
    wait_or_tell(
        "the daemon's channel to poll",
        &agents.join("a.adf"),
        || fake.lock().unwrap().tokens.iter().any(|t| t == "123:SECRET"),
        told(&fake),
    )
    .await;
    let v = get("/agents/a/adapters".into()).await;
    assert_eq!(v["adapters"][0]["kind"], "telegram", "{v}");
    assert!(!v.to_string().contains("SECRET"), "{v}");
    // Bad input: no token is a 400, and nothing changes.
    let r = http
        .post(format!("{url}/agents/a/adapters"))
        .bearer_auth(&token)
        .json(&json!({"type": "telegram"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    // Disconnected through the daemon too: the channel stops at once and
    // its token goes; a second time is a 404.
    let (h, ag) = (home.clone(), agents.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_adf"))
            .args(["adapters", "rm", "a.adf", "telegram"])
            .current_dir(&ag)
            .env("ADF_HOME", &h)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(ok(&out).contains("telegram disconnected and its credentials removed"));
    let v = get("/agents/a/adapters".into()).await;
    assert_eq!(v["adapters"], json!([]), "{v}");
    let r = http.delete(format!("{url}/agents/a/adapters/telegram")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // A long poll in flight on the fake's side ends within its 1 s.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let polls = fake.lock().unwrap().polls;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(fake.lock().unwrap().polls, polls, "no polling after the disconnect");
    let _ = daemon.kill();
    let _ = daemon.wait();
}

/// Files the agent sends go as a photo or a document, the text as the
/// first one's caption, threaded under the message replied to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_go_out_as_photos_and_documents_with_the_text_as_caption() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    let fake: Shared = Arc::new(Mutex::new(Fake::default()));
    let api = serve(fake.clone()).await;
    fake.lock().unwrap().pending.push_back(dm(1, 10, (42, "ann"), "send me the report"));
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    ok(&adf(d, &["files", "put", "a.adf", "out/report.pdf"], Some(b"%PDF-1.4 report")));
    ok(&adf(d, &["files", "put", "a.adf", "out/chart.png"], Some(b"\x89PNG chart")));
    ok(&adf(d, &["adapters", "add", "a.adf", "telegram", "--api-url", &api], Some(b"123:SECRET\n")));
    ok(&adf(d, &["config", "set", "a.adf", "adapters.telegram.config.poll_timeout_s", "1"], None));
    let path = d.join("a.adf");
    let once = Arc::new(Mutex::new(false));
    let (o2, p2) = (once.clone(), path.clone());
    let factory: ProviderFactory = Arc::new(move |_| {
        let (o, p) = (o2.clone(), p2.clone());
        Ok(Arc::new(Scripted::new([]).with_fallback(move |_| {
            let mut done = o.lock().unwrap();
            if !*done {
                *done = true;
                let c = rusqlite::Connection::open_with_flags(&p, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
                let id: String = c.query_row("SELECT id FROM adf_inbox", [], |r| r.get(0)).unwrap();
                return Reply::Tools(vec![(
                    "msg_send".into(),
                    json!({"parent_id": id, "content": "Here it is.", "attachments": ["out/report.pdf", "out/chart.png"]}),
                )]);
            }
            Reply::Text("sent".into())
        })) as Arc<dyn adf::providers::Provider>)
    });
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let mut fleet = Fleet::new(Bus::new(), factory);
    fleet.load(&path).unwrap();
    wait_or_tell("both files", &path, || fake.lock().unwrap().sent.len() >= 2, told(&fake)).await;
    let sent = fake.lock().unwrap().sent.clone();
    assert_eq!(sent[0]["method"], "sendDocument", "{sent:?}");
    assert_eq!(sent[0]["document"]["file_name"], "report.pdf");
    assert_eq!(sent[0]["document"]["data"], "%PDF-1.4 report");
    assert_eq!(sent[0]["caption"], "Here it is.");
    let reply: Value = serde_json::from_str(sent[0]["reply_parameters"].as_str().unwrap()).unwrap();
    assert_eq!(reply["message_id"], 10, "threaded under Ann's message");
    assert_eq!(sent[1]["method"], "sendPhoto");
    assert_eq!(sent[1]["photo"]["content_type"], "image/png");
    assert!(sent[1].get("caption").is_none(), "the text goes once");
    fleet.shutdown().await;
}
