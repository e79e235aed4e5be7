//! The email channel (issue 20) against real servers on loopback: Dovecot
//! for IMAP (IDLE, STARTTLS on 10143, TLS on 10993) and an SMTP server on
//! aiosmtpd (STARTTLS on 10587, TLS on 10465) delivering through
//! dovecot-lda, all with certificates from a throw-away CA. `.ci/mail.sh`
//! starts them; these run with `ADF_MAIL_CA` naming the CA file. Users
//! ann, bob, cy and dee @adf.test, passwords `pw-<name>`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::fleet::{Fleet, ProviderFactory};
use common::*;
use futures_util::TryStreamExt;
use lettre::AsyncTransport;
use serde_json::{Value, json};

const IMAP: &str = "imap://127.0.0.1:10143";
const IMAPS: &str = "imaps://127.0.0.1:10993";
const SMTPS: &str = "smtps://127.0.0.1:10465";
const SMTP: &str = "smtp://127.0.0.1:10587";

/// The fleet reads the install from `ADF_HOME`, and the mailboxes are
/// shared: one test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ca() -> String {
    std::env::var("ADF_MAIL_CA").expect("ADF_MAIL_CA (run .ci/mail.sh DIR: it prints the CA file)")
}

type Session = async_imap::Session<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

/// Log in to Dovecot as `user` (TLS from the start).
async fn imap(user: &str) -> Session {
    use adf::channels::email::tls;
    let pem = std::fs::read(ca()).unwrap();
    let config = tls::client_config(tls::roots(&pem).unwrap()).unwrap();
    let tcp = tokio::net::TcpStream::connect("127.0.0.1:10993").await.unwrap();
    let stream = tls::wrap(&config, "127.0.0.1", tcp).await.unwrap();
    let mut client = async_imap::Client::new(stream);
    client.read_response().await.unwrap();
    let mut s = client.login(format!("{user}@adf.test"), format!("pw-{user}")).await.map_err(|(e, _)| e).unwrap();
    s.select("INBOX").await.unwrap();
    s
}

/// Every message in a mailbox, as its source.
async fn mailbox(user: &str) -> Vec<String> {
    let mut s = imap(user).await;
    let mbox = s.select("INBOX").await.unwrap();
    if mbox.exists == 0 {
        return Vec::new();
    }
    let f: Vec<_> = s.fetch("1:*", "BODY.PEEK[]").await.unwrap().try_collect().await.unwrap();
    let out = f.iter().filter_map(|m| m.body()).map(|b| String::from_utf8_lossy(b).to_string()).collect();
    s.logout().await.unwrap();
    out
}

async fn unseen(user: &str) -> usize {
    let mut s = imap(user).await;
    let n = s.search("UNSEEN").await.unwrap().len();
    s.logout().await.unwrap();
    n
}

/// Empty a mailbox (the servers outlive a test).
async fn empty(user: &str) {
    let mut s = imap(user).await;
    let mbox = s.select("INBOX").await.unwrap();
    if mbox.exists > 0 {
        let _: Vec<_> = s.store("1:*", "+FLAGS.SILENT (\\Deleted)").await.unwrap().try_collect().await.unwrap();
        let _: Vec<_> = s.expunge().await.unwrap().try_collect().await.unwrap();
    }
    s.logout().await.unwrap();
}

/// Send raw mail as `user` through the SMTP server (STARTTLS, AUTH).
async fn send(user: &str, to: &[&str], raw: &str) {
    use lettre::transport::smtp::authentication::Credentials;
    use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
    let pem = std::fs::read(ca()).unwrap();
    let tls = TlsParameters::builder("127.0.0.1".into())
        .add_root_certificate(Certificate::from_pem(&pem).unwrap())
        .build_rustls()
        .unwrap();
    let smtp = lettre::AsyncSmtpTransport::<lettre::Tokio1Executor>::builder_dangerous("127.0.0.1")
        .port(10587)
        .tls(Tls::Required(tls))
        .credentials(Credentials::new(format!("{user}@adf.test"), format!("pw-{user}")))
        .build();
    let from = format!("{user}@adf.test").parse().unwrap();
    let to: Vec<lettre::Address> = to.iter().map(|t| format!("{t}@adf.test").parse().unwrap()).collect();
    let env = lettre::address::Envelope::new(Some(from), to).unwrap();
    smtp.send_raw(&env, raw.replace('\n', "\r\n").as_bytes()).await.unwrap();
}

fn inbox(path: &std::path::Path) -> Vec<Value> {
    let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut st = c
        .prepare("SELECT id, \"from\", subject, content, attachments, source_context, thread_id FROM adf_inbox ORDER BY received_at, id")
        .unwrap();
    st.query_map([], |r| {
        Ok(json!({"id": r.get::<_, String>(0)?, "from": r.get::<_, String>(1)?, "subject": r.get::<_, Option<String>>(2)?,
            "content": r.get::<_, String>(3)?, "attachments": r.get::<_, Option<String>>(4)?,
            "context": r.get::<_, Option<String>>(5)?, "thread": r.get::<_, Option<String>>(6)?}))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

fn count(path: &std::path::Path, sql: &str) -> i64 {
    let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// Wait until `f` holds (20 s at most); a timeout says what the agent's
/// file shows (its logs and loop).
async fn wait(what: &str, path: &std::path::Path, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}\n{}", story(path));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn add(d: &std::path::Path, file: &str, password: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["adapters", "add", file, "email"];
    args.extend_from_slice(extra);
    adf(d, &args, Some(format!("{password}\n").as_bytes()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Dovecot and the SMTP server: see .ci/mail.sh and ADF_MAIL_CA"]
async fn email_catches_up_replies_threaded_with_copies_and_files_and_idles() {
    let _one = SERIAL.lock().await;
    for u in ["ann", "bob", "cy", "dee"] {
        empty(u).await;
    }
    let dir = tmp();
    let d = dir.path();
    // What arrived while the agent was off.
    send(
        "bob",
        &["ann", "cy"],
        "From: Bob <bob@adf.test>\nTo: ann@adf.test\nCc: cy@adf.test\nSubject: Lunch plans\nMessage-ID: <m1@adf.test>\n\
MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=XX\n\n--XX\nContent-Type: text/plain\n\nPizza or sushi?\n\
--XX\nContent-Type: text/plain; name=notes.txt\nContent-Disposition: attachment; filename=notes.txt\n\nbring cash\n--XX--\n",
    )
    .await;
    send(
        "bob",
        &["ann"],
        "From: bob@adf.test\nTo: ann@adf.test\nSubject: Agenda\nMessage-ID: <m2@adf.test>\nMIME-Version: 1.0\n\
Content-Type: text/html\n\n<html><body><h1>Agenda</h1><p>Item <b>one</b></p><script>x()</script></body></html>\n",
    )
    .await;
    send(
        "dee",
        &["ann"],
        "From: dee@adf.test\nTo: ann@adf.test\nSubject: let me in\nMessage-ID: <m3@adf.test>\n\nhi\n",
    )
    .await;

    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    ok(&adf(d, &["files", "put", "a.adf", "report.txt"], Some(b"the quarterly report\n")));
    ok(&add(
        d,
        "a.adf",
        "pw-ann",
        &[
            "--address",
            "ann@adf.test",
            "--imap",
            IMAP,
            "--smtp",
            SMTPS,
            "--ca-file",
            &ca(),
            "--dm",
            "allowlist",
            "--allow",
            "bob@adf.test",
            "--allow",
            "cy@adf.test",
        ],
    ));
    let ls = ok(&adf(d, &["adapters", "ls", "a.adf"], None));
    assert!(ls.contains("ann@adf.test (127.0.0.1:10143 STARTTLS)") && !ls.contains("pw-ann"), "{ls}");
    let raw = std::fs::read(d.join("a.adf")).unwrap();
    assert!(!raw.windows(6).any(|w| w == b"pw-ann"), "the password is sealed, never in clear in the file");
    // Only IDLE can bring mail within the test's waits.
    ok(&adf(d, &["config", "set", "a.adf", "adapters.email.config.poll_interval", "600000"], None));

    let path = d.join("a.adf");
    let replied = Arc::new(Mutex::new(false));
    let (r2, p2) = (replied.clone(), path.clone());
    let factory: ProviderFactory = Arc::new(move |_| {
        let (r, p) = (r2.clone(), p2.clone());
        Ok(Arc::new(Scripted::new([]).with_fallback(move |req| {
            let seen = serde_json::to_string(&*req.messages).unwrap_or_default();
            let mut done = r.lock().unwrap();
            if !*done && seen.contains("Inbox notification") {
                *done = true;
                let lunch = inbox(&p).into_iter().find(|m| m["subject"] == "Lunch plans").unwrap();
                return Reply::Tools(vec![(
                    "msg_send".into(),
                    json!({"parent_id": lunch["id"], "content": "Pizza at noon.", "attachments": ["report.txt", "missing.txt"],
                        "message_meta": {"reply_all": true, "bcc": "dee@adf.test"}}),
                )]);
            }
            Reply::Text("done".into())
        })) as Arc<dyn adf::providers::Provider>)
    });
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let mut fleet = Fleet::new(Bus::new(), factory);
    fleet.load(&path).unwrap();
    let id = fleet.list()[0].id.clone();

    let p = path.clone();
    wait("the batch in the inbox", &p, async || inbox(&p).len() >= 2).await;
    let rows = inbox(&path);
    assert_eq!(rows.len(), 2, "Bob's two; Dee is not on the allowlist: {rows:?}");
    // One batch: find each by its subject.
    let by = |subject: &str| rows.iter().find(|r| r["subject"] == subject).unwrap().clone();
    let lunch = &by("Lunch plans");
    assert_eq!((lunch["from"].as_str(), lunch["subject"].as_str()), (Some("email:bob@adf.test"), Some("Lunch plans")));
    assert_eq!(lunch["content"], "Pizza or sushi?");
    assert_eq!(lunch["thread"], "email:m1@adf.test");
    let ctx: Value = serde_json::from_str(lunch["context"].as_str().unwrap()).unwrap();
    assert_eq!((ctx["message_id"].as_str(), ctx["cc"].clone()), (Some("m1@adf.test"), json!(["cy@adf.test"])));
    let att: Value = serde_json::from_str(lunch["attachments"].as_str().unwrap()).unwrap();
    assert_eq!(att[0]["transfer"], "imported", "{att}");
    let imported = att[0]["path"].as_str().unwrap();
    let cat = ok(&adf(d, &["files", "cat", "a.adf", imported], None));
    assert_eq!(cat.trim(), "bring cash");
    let agenda = by("Agenda");
    let agenda = agenda["content"].as_str().unwrap();
    assert!(agenda.contains("Agenda") && agenda.contains("Item one"), "HTML read as text: {agenda}");
    assert!(!agenda.contains('<') && !agenda.contains("x()"), "no markup, no script: {agenda}");

    // The reply: threaded, to Bob, Cc the original's other recipient (not
    // the agent), Bcc Dee, the report attached.
    wait("the reply at Bob's", &p, async || !mailbox("bob").await.is_empty()).await;
    let got = mailbox("bob").await.remove(0);
    for needle in [
        "From: ann@adf.test",
        "To: bob@adf.test",
        "Cc: cy@adf.test",
        "Subject: Re: Lunch plans",
        "In-Reply-To: <m1@adf.test>",
        "References: <m1@adf.test>",
        "Pizza at noon.",
        "<p>Pizza at noon.</p>",
        "filename=\"report.txt\"",
    ] {
        assert!(got.contains(needle), "{needle:?} missing from:\n{got}");
    }
    assert!(!got.contains("Bcc"), "the blind copy is not in the headers");
    assert!(got.contains("dGhlIHF1YXJ0ZXJseSByZXBvcnQK") || got.contains("the quarterly report"), "{got}");
    wait("Cy's copy", &p, async || !mailbox("cy").await.iter().all(|m| !m.contains("Re: Lunch plans"))).await;
    wait("Dee's blind copy", &p, async || mailbox("dee").await.iter().any(|m| m.contains("Re: Lunch plans"))).await;
    let said = count(
        &path,
        "SELECT count(*) FROM adf_loop WHERE content_json LIKE '%with 1 attachment(s)%' AND content_json LIKE '%Not attached: missing.txt%'",
    );
    assert_eq!(said, 1, "the tool says what was attached and what was not");
    assert_eq!(unseen("ann").await, 0, "what is in the inbox is marked seen");
    // One wake for the batch that waited.
    let p = path.clone();
    wait("the turn to end", &p, async || {
        count(&p, "SELECT count(*) FROM adf_loop WHERE content_json LIKE '%\"done\"%'") > 0
    })
    .await;
    assert_eq!(count(&path, "SELECT count(*) FROM adf_loop WHERE content_json LIKE '%Inbox notification%'"), 1);
    assert_eq!(count(&path, "SELECT count(*) FROM adf_logs WHERE event = 'message_refused'"), 1);

    // New mail while connected comes by IDLE (polling is ten minutes).
    send(
        "cy",
        &["ann"],
        "From: cy@adf.test\nTo: ann@adf.test\nSubject: ping\nMessage-ID: <m4@adf.test>\n\nstill on?\n",
    )
    .await;
    let p = path.clone();
    wait("the IDLE delivery", &p, async || inbox(&p).len() == 3).await;
    // Redelivery: unseen again is not a second row.
    {
        let mut s = imap("ann").await;
        let _: Vec<_> = s.store("1:*", "-FLAGS (\\Seen)").await.unwrap().try_collect().await.unwrap();
        s.logout().await.unwrap();
    }
    wait("seen again", &p, async || unseen("ann").await == 0).await;
    assert_eq!(inbox(&path).len(), 3, "a redelivered message is not delivered twice");
    let st = fleet.channel_status(&id);
    assert_eq!(st[0].0, "email");
    assert_eq!(st[0].1.state, "connected", "{st:?}");
    // Dee's message, unseen again, is refused (and logged) again.
    assert_eq!((st[0].1.received, st[0].1.sent, st[0].1.refused), (3, 1, 2), "{st:?}");
    assert_eq!(st[0].1.account.as_deref(), Some("ann@adf.test"));
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Dovecot and the SMTP server: see .ci/mail.sh and ADF_MAIL_CA"]
async fn bad_settings_are_refused_and_a_failing_server_backs_off_with_its_cause() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    for f in ["a.adf", "b.adf", "c.adf"] {
        ok(&adf(d, &["new", f, "--provider", "anthropic", "--model", "m"], None));
    }
    let before = snapshot(&d.join("a.adf"));
    fails(&add(d, "a.adf", "pw", &[]), &["--address"]);
    fails(&add(d, "a.adf", "pw", &["--address", "not-an-address"]), &["not an email address"]);
    fails(&add(d, "a.adf", "pw", &["--address", "ann@adf.test", "--imap", "http://x"]), &["imaps://host:port"]);
    fails(&add(d, "a.adf", "pw", &["--address", "ann@adf.test", "--ca-file", "/nonexistent.pem"]), &["--ca-file"]);
    fails(&add(d, "a.adf", "", &["--address", "ann@adf.test"]), &["no email password on stdin"]);
    fails(&adf(d, &["adapters", "add", "a.adf", "telegram", "--address", "x@y.z"], Some(b"t\n")), &["email channel"]);
    assert_eq!(snapshot(&d.join("a.adf")), before, "nothing changed");

    // A wrong password, a closed port, and a certificate nobody vouches for.
    let ca = ca();
    let common = ["--address", "ann@adf.test", "--smtp", SMTP];
    ok(&add(d, "a.adf", "wrong-password", &[&common[..], &["--imap", IMAPS, "--ca-file", &ca]].concat()));
    ok(&add(d, "b.adf", "pw-ann", &[&common[..], &["--imap", "imaps://127.0.0.1:10999", "--ca-file", &ca]].concat()));
    ok(&add(d, "c.adf", "pw-ann", &[&common[..], &["--imap", IMAPS]].concat()));
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let factory: ProviderFactory = Arc::new(|_| {
        Ok(Arc::new(Scripted::new([]).with_fallback(|_| Reply::Text("ok".into()))) as Arc<dyn adf::providers::Provider>)
    });
    let mut fleet = Fleet::new(Bus::new(), factory);
    let mut ids = Vec::new();
    for f in ["a.adf", "b.adf", "c.adf"] {
        fleet.load(&d.join(f)).unwrap();
        ids.push(fleet.list().iter().find(|a| a.path.ends_with(f)).unwrap().id.clone());
    }
    let expect = [
        ("a.adf", vec!["IMAP login as ann@adf.test refused", "AUTHENTICATIONFAILED"]),
        ("b.adf", vec!["IMAP 127.0.0.1:10999 TLS", "refused"]),
        // A machine without system roots says that instead: the same refusal.
        ("c.adf", vec!["127.0.0.1"]),
    ];
    for (id, (file, needles)) in ids.iter().zip(expect) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let st = fleet.channel_status(id);
            if let Some((_, s)) = st.first().filter(|(_, s)| s.state == "backing_off") {
                let err = s.last_error.clone().unwrap_or_default();
                for n in &needles {
                    assert!(err.contains(n), "{file}: {n:?} not in {err:?}");
                }
                if file == "c.adf" {
                    assert!(err.contains("UnknownIssuer") || err.contains("No CA certificates"), "{err}");
                }
                assert!(!err.contains("wrong-password") && !err.contains("pw-ann"), "no password shows: {err}");
                break;
            }
            assert!(Instant::now() < deadline, "{file}: {st:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(fleet.state(id), "idle", "{file}: the agent keeps running");
    }
    let logged = count(&d.join("a.adf"), "SELECT count(*) FROM adf_logs WHERE event = 'email_error'");
    assert_eq!(logged, 1, "the cause is logged once, not once per retry");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Dovecot and the SMTP server: see .ci/mail.sh and ADF_MAIL_CA"]
async fn a_form_by_email_is_a_numbered_list_answered_by_reply_when_polling() {
    let _one = SERIAL.lock().await;
    for u in ["bob", "dee"] {
        empty(u).await;
    }
    let dir = tmp();
    let d = dir.path();
    send(
        "bob",
        &["dee"],
        "From: bob@adf.test\nTo: dee@adf.test\nSubject: Lunch\nMessage-ID: <f0@adf.test>\n\nplan lunch\n",
    )
    .await;
    ok(&adf(d, &["new", "a.adf", "--provider", "anthropic", "--model", "m"], None));
    ok(&add(d, "a.adf", "pw-dee", &["--address", "dee@adf.test", "--imap", IMAPS, "--smtp", SMTP, "--ca-file", &ca()]));
    // No IDLE: polled every second.
    ok(&adf(d, &["config", "set", "a.adf", "adapters.email.config.idle", "false"], None));
    ok(&adf(d, &["config", "set", "a.adf", "adapters.email.config.poll_interval", "1000"], None));
    ok(&adf(d, &["config", "set", "a.adf", "adapters.email.limits.max_message_size", "20000"], None));
    let form = json!({"id": "lunch", "title": "Lunch", "render": "compact", "questions": [
        {"id": "q1", "text": "Where?", "type": "choice", "options": [{"id": "a", "label": "Pizza"}, {"id": "b", "label": "Sushi"}]},
        {"id": "q2", "text": "Anything else?", "type": "text"}]});
    let path = d.join("a.adf");
    let once = Arc::new(Mutex::new(false));
    let (o2, p2) = (once.clone(), path.clone());
    let factory: ProviderFactory = Arc::new(move |_| {
        let (o, p, f) = (o2.clone(), p2.clone(), form.clone());
        Ok(Arc::new(Scripted::new([]).with_fallback(move |_| {
            let mut done = o.lock().unwrap();
            if !*done {
                *done = true;
                let first = inbox(&p).remove(0);
                return Reply::Tools(vec![(
                    "msg_send".into(),
                    json!({"parent_id": first["id"], "content": f.to_string(), "content_type": "application/vnd.adf.form+json"}),
                )]);
            }
            Reply::Text("noted".into())
        })) as Arc<dyn adf::providers::Provider>)
    });
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let mut fleet = Fleet::new(Bus::new(), factory);
    fleet.load(&path).unwrap();
    wait("the form at Bob's", &path, async || !mailbox("bob").await.is_empty()).await;
    let got = mailbox("bob").await.remove(0);
    assert!(got.contains("Subject: Re: Lunch") && got.contains("In-Reply-To: <f0@adf.test>"), "{got}");
    assert!(got.contains("1. Where?") && got.contains("b) Sushi") && got.contains("Reply with your answers"), "{got}");
    let form_id = got
        .lines()
        .find_map(|l| l.strip_prefix("Message-ID: <").map(|r| r.trim_end_matches('>').to_string()))
        .expect("a Message-ID");
    // A wrong answer, then a right one, each a reply quoting the form.
    for (n, body) in [(1, "1z"), (2, "1b, 2 no onions")] {
        send(
            "bob",
            &["dee"],
            &format!(
                "From: bob@adf.test\nTo: dee@adf.test\nSubject: Re: Lunch\nMessage-ID: <a{n}@adf.test>\n\
In-Reply-To: <{form_id}>\nReferences: <f0@adf.test> <{form_id}>\n\n{body}\n\nOn Tue, Bob wrote:\n> 1. Where?\n"
            ),
        )
        .await;
    }
    let p = path.clone();
    wait("both replies", &p, async || inbox(&p).len() == 3).await;
    let rows = inbox(&path);
    let content = |r: &Value| r["content"].as_str().unwrap_or("").to_string();
    let wrong = rows.iter().find(|r| content(r).contains("[not an answer to form lunch")).expect("the wrong answer");
    assert!(content(wrong).contains("question 1: it has no option z"), "{wrong}");
    let right = rows.iter().find(|r| content(r).starts_with("[form lunch]")).expect("the answer");
    assert_eq!(content(right), "[form lunch] Where?: Sushi; Anything else?: no onions");
    let ctx: Value = serde_json::from_str(right["context"].as_str().unwrap()).unwrap();
    assert_eq!(ctx["form_id"], "lunch");
    assert_eq!(ctx["answers"][0], json!({"question_id": "q1", "answer_id": "b", "answer_value": "Sushi"}));
    // Mail over the size limit: its headers, and a note saying so.
    let big = format!(
        "From: bob@adf.test\nTo: dee@adf.test\nSubject: dump\nMessage-ID: <big@adf.test>\n\n{}\n",
        format!("{}\n", "x".repeat(70)).repeat(900)
    );
    send("bob", &["dee"], &big).await;
    let p = path.clone();
    wait("the big one", &p, async || inbox(&p).len() == 4).await;
    let rows = inbox(&path);
    let big = rows.iter().find(|r| r["subject"] == "dump").expect("the big one's row");
    assert!(content(big).contains("over the 20000 byte limit: only its headers were read"), "{big}");
    assert_eq!(unseen("dee").await, 0);
    fleet.shutdown().await;
}
