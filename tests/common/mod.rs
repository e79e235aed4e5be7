//! Helpers shared by the integration tests: temporary folders, copies of the
//! reference fixtures (never the originals), and running the real binary.

#![allow(dead_code)]

pub mod fake_provider;
pub mod hosts;
pub mod provider_rules;
pub mod pty;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A PNG of `w`×`h` whose pixel at (x, y) is `rgb(x, y)`.
pub fn png_of(w: u32, h: u32, rgb: impl Fn(u32, u32) -> [u8; 3]) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb(rgb(x, y)));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).expect("png");
    out.into_inner()
}

pub fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// `../shared/fixtures/reference` relative to the crate.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/reference")
}

/// A writable copy of a reference fixture in `dir`.
pub fn fixture_copy(dir: &Path, name: &str) -> PathBuf {
    let dst = dir.join(name);
    std::fs::copy(fixtures().join(name), &dst).expect("copy fixture");
    let mut perm = std::fs::metadata(&dst).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perm.set_readonly(false);
    std::fs::set_permissions(&dst, perm).unwrap();
    dst
}

/// Run `adf` with arguments (and optional stdin), in `cwd`, with `ADF_HOME`
/// pointed into a scratch folder.
pub fn adf(cwd: &Path, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_adf"));
    cmd.args(args)
        .current_dir(cwd)
        .env("ADF_HOME", cwd.join(".adf-home"))
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn adf");
    if let Some(input) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input).unwrap();
    }
    child.wait_with_output().expect("wait adf")
}

/// Run `adf` in `dir` with both providers pointed at a fake on `base`
/// (Anthropic at `base`, OpenAI-compatible at `base/v1`).
pub fn adf_with_providers(dir: &Path, base: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(args)
        .current_dir(dir)
        .env("ADF_HOME", dir.join(".adf-home"))
        .env("ANTHROPIC_API_KEY", "sk-test")
        .env("ANTHROPIC_BASE_URL", base)
        .env("OPENAI_API_KEY", "sk-o")
        .env("OPENAI_BASE_URL", format!("{base}/v1"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// The default tools with `names` enabled, visible and not restricted.
pub fn tools_enabled(names: &[&str]) -> serde_json::Value {
    let mut tools = adf::store::defaults::default_tools();
    for t in tools.as_array_mut().unwrap() {
        if names.iter().any(|n| t["name"] == *n) {
            t["enabled"] = serde_json::json!(true);
            t["visible"] = serde_json::json!(true);
            t["restricted"] = serde_json::json!(false);
        }
    }
    tools
}

/// Run `adf` in `cwd` with `ADF_HOME` set to `home` (its settings, its
/// fleet, its reviews).
pub fn adf_home(home: &Path, cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_adf"))
        .args(args)
        .current_dir(cwd)
        .env("ADF_HOME", home)
        .stdin(Stdio::null())
        .output()
        .expect("run adf")
}

pub fn ok(out: &Output) -> String {
    assert!(out.status.success(), "adf failed ({:?}): {}", out.status.code(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).expect("utf8 stdout")
}

/// Assert a failure with one line on stderr containing all of `needles`.
pub fn fails(out: &Output, needles: &[&str]) -> String {
    assert!(!out.status.success(), "expected failure, got: {}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(err.trim_end().lines().count(), 1, "one line expected: {err}");
    assert!(err.starts_with("adf: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "stderr {err:?} lacks {n:?}");
    }
    err
}

pub fn json(out: &Output) -> serde_json::Value {
    serde_json::from_str(&ok(out)).expect("json stdout")
}

/// All bytes of a file and its sidecars, to prove a failure changed nothing.
pub fn snapshot(path: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    ["", "-wal", "-shm", ".bak"]
        .iter()
        .map(|s| {
            let mut p = path.as_os_str().to_owned();
            p.push(s);
            (s.to_string(), std::fs::read(PathBuf::from(p)).ok())
        })
        .collect()
}

/// Wait for a daemon started on `fleet` to say where it listens (its
/// `.daemon.json`), and return that record.
pub fn daemon_info(fleet: &Path, within: std::time::Duration) -> serde_json::Value {
    let info = fleet.join(".daemon.json");
    let deadline = std::time::Instant::now() + within;
    while !info.exists() {
        assert!(std::time::Instant::now() < deadline, "the daemon did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Written whole by one call, but give the writer its moment.
    std::thread::sleep(std::time::Duration::from_millis(50));
    serde_json::from_str(&std::fs::read_to_string(&info).unwrap()).unwrap()
}

/// A child process killed (and reaped) when the test ends, a failing one
/// too: a daemon must not outlive the test that started it.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `adf daemon --port 0` for the fleet under `home` (extra arguments and
/// environment added), once it says where it listens: the child, its URL
/// and the token local clients use.
pub fn spawn_daemon(home: &Path, args: &[&str], env: &[(&str, &str)]) -> (std::process::Child, String, String) {
    let fleet = home.join("data/agents");
    // A daemon killed by an earlier step leaves its discovery file behind.
    let _ = std::fs::remove_file(fleet.join(".daemon.json"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_adf"));
    cmd.args(["daemon", "--port", "0"]).args(args).env("ADF_HOME", home).env_remove("ADF_DAEMON_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn adf daemon");
    let v = daemon_info(&fleet, std::time::Duration::from_secs(20));
    let token = std::fs::read_to_string(home.join("config/daemon-token")).expect("the daemon's token");
    (child, v["url"].as_str().unwrap_or_default().to_string(), token.trim().to_string())
}

/// Every tool result in the loop, in order: (text, is_error).
pub fn tool_results(s: &adf::store::Store) -> Vec<(String, bool)> {
    s.loop_rows(None)
        .unwrap()
        .iter()
        .flat_map(|r| r.content.as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "tool_result")
        .map(|b| (b["content"].as_str().unwrap_or("").to_string(), b["is_error"] == serde_json::json!(true)))
        .collect()
}

/// Wait until `f` holds (20 s at most, checked every 50 ms).
pub async fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `wait`, but a timeout says what the agent's file shows (its logs and its
/// loop, from `story`) and what `peer` says the other side saw, so a failure
/// on a loaded CI machine explains itself.
pub async fn wait_or_tell(what: &str, path: &Path, mut f: impl FnMut() -> bool, peer: impl FnOnce() -> String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !f() {
        if std::time::Instant::now() >= deadline {
            panic!("timed out waiting for {what}\n{}\n{}", story(path), peer());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// What an agent's file says happened: its logs and its loop (role and the
/// start of each row), read without taking the writer's lock.
pub fn story(path: &Path) -> String {
    let c = match rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY) {
        Ok(c) => c,
        Err(e) => return format!("({} could not be read: {e})", path.display()),
    };
    let rows = |sql: &str| -> Vec<String> {
        let Ok(mut st) = c.prepare(sql) else { return vec![format!("({sql} failed)")] };
        st.query_map([], |r| r.get(0)).map(|m| m.filter_map(Result::ok).collect()).unwrap_or_default()
    };
    let logs = rows("SELECT level || ' ' || origin || ' ' || event || ' ' || message FROM adf_logs");
    let turns = rows("SELECT role || ' ' || substr(content_json, 1, 200) FROM adf_loop ORDER BY seq");
    format!("logs {logs:#?}\nloop {turns:#?}")
}

/// An agent's inbox, oldest first: id, from, content, source_context,
/// attachments (channel tests).
pub fn inbox_rows(path: &Path) -> Vec<serde_json::Value> {
    let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut st = c
        .prepare("SELECT id, \"from\", content, source_context, attachments FROM adf_inbox ORDER BY sent_at, id")
        .unwrap();
    st.query_map([], |r| {
        Ok(serde_json::json!({"id": r.get::<_, String>(0)?, "from": r.get::<_, String>(1)?, "content": r.get::<_, String>(2)?,
            "context": r.get::<_, Option<String>>(3)?, "attachments": r.get::<_, Option<String>>(4)?}))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// A model that answers "ok" to everything.
pub fn quiet_model() -> adf::runtime::fleet::ProviderFactory {
    use adf::providers::scripted::{Reply, Scripted};
    std::sync::Arc::new(|_| {
        Ok(std::sync::Arc::new(Scripted::new([]).with_fallback(|_| Reply::Text("ok".into())))
            as std::sync::Arc<dyn adf::providers::Provider>)
    })
}

/// Wait until an agent's first channel backs off; its last error.
pub async fn backing_off(fleet: &adf::runtime::fleet::Fleet, id: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let st = fleet.channel_status(id);
        if let Some((_, s)) = st.first().filter(|(_, s)| s.state == "backing_off") {
            return s.last_error.clone().unwrap_or_default();
        }
        assert!(std::time::Instant::now() < deadline, "no back-off: {st:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The tool results a scripted model was sent in its `call`th request, in
/// order, each as JSON text.
pub fn sent_results(model: &adf::providers::scripted::Scripted, call: usize) -> Vec<String> {
    model.requests()[call]
        .messages
        .iter()
        .flat_map(|m| m.content.iter())
        .filter(|b| b["type"] == "tool_result")
        .map(|b| b["content"].to_string())
        .collect()
}

/// A provider factory that gives every agent this one scripted model.
pub fn model_factory(
    model: &std::sync::Arc<adf::providers::scripted::Scripted>,
) -> adf::runtime::fleet::ProviderFactory {
    let m = model.clone();
    std::sync::Arc::new(move |_| Ok(m.clone() as std::sync::Arc<dyn adf::providers::Provider>))
}

/// An owner who approves every call and keeps the names of the tools it
/// was asked about.
#[derive(Default)]
pub struct Approve(pub std::sync::Mutex<Vec<String>>);

impl adf::runtime::executor::Owner for Approve {
    fn approve<'a>(
        &'a self,
        req: &'a adf::runtime::executor::ApprovalRequest,
    ) -> futures_util::future::BoxFuture<'a, adf::runtime::executor::Decision> {
        if let Ok(mut l) = self.0.lock() {
            l.push(req.tool.clone());
        }
        Box::pin(async { adf::runtime::executor::Decision::Approve { always: false } })
    }
    fn answer<'a>(&'a self, _: &'a str, _: &'a str) -> futures_util::future::BoxFuture<'a, Option<String>> {
        Box::pin(async { None })
    }
}

/// A TCP server that keeps what it gets.
pub async fn collector(l: Option<tokio::net::TcpListener>) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
    let l = match l {
        Some(l) => l,
        None => tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    };
    let port = l.local_addr().unwrap().port();
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let g = got.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let g = g.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                while let Ok(n) = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await {
                    if n == 0 {
                        break;
                    }
                    g.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            });
        }
    });
    (port, got)
}

/// Enable and show the declared tools whose names `pick` takes (their
/// other flags, `restricted` among them, stay as they are).
pub fn enable_tools_where(cfg: &mut serde_json::Value, pick: impl Fn(&str) -> bool) {
    for t in cfg["tools"].as_array_mut().into_iter().flatten() {
        if t["name"].as_str().is_some_and(&pick) {
            t["enabled"] = serde_json::json!(true);
            t["visible"] = serde_json::json!(true);
        }
    }
}

/// A message from a key of the test's own, to `to`, signed (and
/// encrypted when `level` is 2).
pub fn message_from(key: &ed25519_dalek::SigningKey, to: &str, content: &str, level: u8) -> serde_json::Value {
    let from = adf::store::identity::did_key(&key.verifying_key());
    let id = adf::store::create::nanoid(20);
    let mut m = serde_json::json!({"version": "1.0", "network": "devnet", "id": id, "timestamp": adf::store::now_iso(),
        "from": from, "to": to, "reply_to": "http://127.0.0.1:9/agents/t/inbox", "meta": {},
        "payload": {"sender_alias": "tester", "parent_id": null, "content": content, "attachments": [],
            "sent_at": adf::store::now_iso()}});
    adf::identity::message::egress(&mut m, Some(key), level, true).unwrap();
    m
}
