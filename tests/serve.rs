//! An agent's files on the web (issue 21): the mesh server on loopback
//! serves `public/` (index files, types, ETag and 304, byte ranges, a
//! folder redirected to its slash) and files matching the shared
//! patterns, refuses every way of naming a path outside them (`..`,
//! encoded or not, backslashes), answers 404 for the rest, and honours
//! the agent's visibility.

mod common;

use adf::runtime::bus::Bus;
use adf::runtime::fleet::Fleet;
use common::*;
use serde_json::json;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A raw request line, so nothing on the client side normalises the path.
async fn raw(addr: &str, target: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_and_shared_files_are_served_with_etags_and_ranges_and_nothing_else() {
    let _one = SERIAL.lock().await;
    let dir = tmp();
    let d = dir.path();
    ok(&adf(d, &["new", "site.adf", "--name", "site", "--provider", "anthropic", "--model", "m"], None));
    let put = |path: &str, body: &[u8]| ok(&adf(d, &["files", "put", "site.adf", path], Some(body)));
    put("public/index.html", b"<h1>Hello</h1>");
    put("public/app.js", b"console.log(1)");
    put("public/docs/index.html", b"docs home");
    put("notes/plan.md", b"# the plan: 0123456789");
    put("secret.md", b"do not serve");
    put("reports/q1.csv", b"a,b\n1,2\n");
    ok(&adf(
        d,
        &[
            "config",
            "set",
            "site.adf",
            "serving",
            &json!({"public": {"enabled": true}, "shared": {"enabled": true, "patterns": ["notes/*.md", "reports/*"]}, "api": []})
                .to_string(),
        ],
        None,
    ));
    unsafe { std::env::set_var("ADF_HOME", d.join(".adf-home")) };
    let factory = quiet_model();
    let mut fleet = Fleet::new(Bus::new(), factory);
    fleet.load(&d.join("site.adf")).unwrap();
    let addr = adf::runtime::mesh::server::serve(fleet.mesh.clone(), "127.0.0.1", 0).await.unwrap().to_string();
    let base = format!("http://{addr}/agents/site");
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let get = |path: &str| http.get(format!("{base}{path}"));

    // The site: the index, a script with its type, a folder's index, and a
    // folder without its slash redirected.
    let r = get("/").send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    let tag = r.headers()["etag"].to_str().unwrap().to_string();
    assert_eq!(r.text().await.unwrap(), "<h1>Hello</h1>");
    let r = get("/app.js").send().await.unwrap();
    assert!(r.headers()["content-type"].to_str().unwrap().contains("javascript"), "{:?}", r.headers());
    assert_eq!(get("/docs/").send().await.unwrap().text().await.unwrap(), "docs home");
    let r = get("/docs").send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["location"].to_str().unwrap()), (308, "/agents/site/docs/"));
    // ETag: the same file is 304; a changed file is not.
    let r = get("/").header("if-none-match", &tag).send().await.unwrap();
    assert_eq!(r.status(), 304);
    // (The fleet holds the file: changes go through its mailbox.)
    let id = fleet.list()[0].id.clone();
    let mb = fleet.mesh.find(&id).unwrap();
    mb.with_store(|s| {
        s.file_write(adf::store::Caller::Owner, "public/index.html", b"<h1>Hello again</h1>", &Default::default())
    })
    .unwrap()
    .unwrap();
    let r = get("/").header("if-none-match", &tag).send().await.unwrap();
    assert_eq!(r.status(), 200, "a changed file has a new ETag");
    // Ranges.
    let r = get("/notes/plan.md").header("range", "bytes=2-5").send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["content-range"].to_str().unwrap()), (206, "bytes 2-5/22"));
    assert_eq!(r.text().await.unwrap(), "the ");
    let r = get("/notes/plan.md").header("range", "bytes=-4").send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "6789");
    let r = get("/notes/plan.md").header("range", "bytes=99-").send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["content-range"].to_str().unwrap()), (416, "bytes */22"));
    // Shared by pattern; the rest is not there.
    assert_eq!(get("/reports/q1.csv").send().await.unwrap().status(), 200);
    assert_eq!(get("/secret.md").send().await.unwrap().status(), 404);
    assert_eq!(get("/notes/deep/x.md").send().await.unwrap().status(), 404, "`*` does not cross a folder");
    assert_eq!(get("/nothing.html").send().await.unwrap().status(), 404);
    // Every way of climbing out is refused, encoded or not.
    for target in [
        "/agents/site/../site/secret.md",
        "/agents/site/notes/..%2Fsecret.md",
        "/agents/site/%2e%2e/secret.md",
        "/agents/site/notes/%2E%2E/secret.md",
        "/agents/site/notes%5C..%5Csecret.md",
        "/agents/site/notes//plan.md",
    ] {
        let got = raw(&addr, target).await;
        assert!(!got.contains("do not serve"), "{target}: {got}");
        let status: u16 = got.split(' ').nth(1).unwrap().parse().unwrap();
        assert!(matches!(status, 400 | 404), "{target}: {got}");
    }
    // HEAD: the headers, no body.
    let r = http.head(format!("{base}/notes/plan.md")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["content-length"].to_str().unwrap()), (200, "22"));
    // The card and inbox routes are the agent's, not files.
    assert_eq!(get("/card").send().await.unwrap().status(), 200);
    // Visibility: an agent that is off serves nothing.
    mb.with_store(|s| s.config_set(adf::store::Caller::Owner, "messaging.visibility", json!("off"))).unwrap().unwrap();
    let r = get("/").send().await.unwrap();
    assert_eq!(r.status(), 403);
    fleet.shutdown().await;
}
