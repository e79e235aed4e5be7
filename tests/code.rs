//! Agent code through the executor, on real files and real sandbox
//! workers: `sys_code`, `sys_lambda`, the `adf` proxy's gate (conformance
//! 32 and 35), authorized code, and `sys_fetch` with its egress guard
//! (conformance 40) and fetch middleware against a real local server.

mod common;

use std::sync::Arc;

use adf::providers::scripted::{Reply, Scripted};
use adf::runtime::bus::Bus;
use adf::runtime::executor::{Absent, ApprovalRequest, Decision, Executor, Owner};
use adf::store::files::WriteOptions;
use adf::store::{Caller, NewAgent, Store};
use common::tool_results;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};

fn agent(dir: &std::path::Path, cfg: &[(&str, Value)]) -> Store {
    let (mut s, _) = Store::create(
        dir.join("a.adf"),
        &NewAgent { provider: Some("scripted"), model: Some("m"), ..Default::default() },
    )
    .unwrap();
    for (k, v) in cfg {
        s.config_set(Caller::Owner, k, v.clone()).unwrap();
    }
    s
}

fn file(s: &mut Store, path: &str, text: &str, authorized: bool) {
    s.file_write(Caller::Owner, path, text.as_bytes(), &WriteOptions::default()).unwrap();
    if authorized {
        s.file_set_authorized(path, true).unwrap();
    }
}

/// An owner who approves everything.
struct Yes;

impl Owner for Yes {
    fn approve<'a>(&'a self, _: &'a ApprovalRequest) -> BoxFuture<'a, Decision> {
        Box::pin(async { Decision::Approve { always: false } })
    }
    fn answer<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async { None })
    }
}

/// `origin/event message` of every log row.
fn logs(s: &Store) -> Vec<String> {
    let (_, rows) = s.owner_query("SELECT origin || '/' || event || ' ' || message AS l FROM adf_logs").unwrap();
    rows.iter().map(|r| r["l"].as_str().unwrap_or("").to_string()).collect()
}

/// Run one tool call through a turn and return its result (text, error).
async fn call_with(store: Store, owner: Arc<dyn Owner>, name: &str, input: Value) -> (String, bool, Executor) {
    let provider = Arc::new(Scripted::new(vec![Reply::Tools(vec![(name.into(), input)]), Reply::Text("done".into())]));
    let mut ex = Executor::new(store, provider, Bus::new(), owner).unwrap();
    ex.chat("go").await.unwrap();
    let (text, err) = tool_results(&ex.store).pop().expect("a tool result");
    (text, err, ex)
}

async fn call(store: Store, name: &str, input: Value) -> (String, bool, Executor) {
    call_with(store, Arc::new(Absent), name, input).await
}

async fn code(store: Store, src: &str) -> (String, bool, Executor) {
    call(store, "sys_code", json!({"code": src})).await
}

#[tokio::test]
async fn sys_code_uses_tools_through_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let src = "await adf.fs_write({mode: 'write', path: 'notes/x.md', content: 'hello'});\n\
               const f = await adf.fs_read({path: 'notes/x.md'});\n\
               console.log('read', f.content.length);\n\
               return f.content.toUpperCase();";
    let (text, err, ex) = code(agent(dir.path(), &[]), src).await;
    assert!(!err, "{text}");
    assert_eq!(text, "Result: HELLO\nOutput:\nread 5");
    assert_eq!(ex.store.file_read_text("notes/x.md").unwrap(), "hello");
    let (text, err, _) = code(agent(tempfile::tempdir().unwrap().path(), &[]), "let x = 1;").await;
    assert_eq!((text.as_str(), err), ("Code executed successfully (no output).", false));
    let (text, err, ex) = code(ex.store_into(), "throw new Error('boom')").await;
    assert_eq!((text.as_str(), err), ("Error: Error: boom", true));
    assert!(logs(&ex.store).iter().any(|l| l.starts_with("sys_code/result") && l.contains("boom")));
}

#[tokio::test]
async fn p32_excluded_tools_from_code() {
    let dir = tempfile::tempdir().unwrap();
    let src = "const out = [];\n\
               for (const m of ['loop_compact', 'loop_clear', 'say', 'ask']) {\n\
                 try { await adf[m]({}); out.push(m + ':ran'); } catch (e) { out.push(m + ':' + e.code); }\n\
               }\n\
               return out.join(',');";
    let (text, _, _) = code(agent(dir.path(), &[]), src).await;
    assert_eq!(text, "Result: loop_compact:EXCLUDED_TOOL,loop_clear:EXCLUDED_TOOL,say:EXCLUDED_TOOL,ask:EXCLUDED_TOOL");
}

#[tokio::test]
async fn the_gate_refuses_what_the_matrix_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let s = agent(dir.path(), &[("tools.fs_delete.enabled", json!(false))]);
    let src = "const r = {};\n\
               for (const [m, a] of [['sys_update_config', {path: 'description', value: 'x'}], ['attestation_issue', {}], \
                 ['fs_delete', {path: 'x'}], ['no_such_tool', {}], ['authorize_file', {path: 'mind.md'}], ['adf_shell', {command: 'ls'}]]) {\n\
                 try { await adf[m](a); r[m] = 'ran'; } catch (e) { r[m] = e.code; }\n\
               }\n\
               return r;";
    let (text, _, _) = code(s, src).await;
    let v: Value = serde_json::from_str(text.strip_prefix("Result: ").unwrap()).unwrap();
    assert_eq!(
        v,
        json!({"sys_update_config": "REQUIRES_AUTHORIZED_CODE", "attestation_issue": "REQUIRES_AUTHORIZED_CODE",
               "fs_delete": "DISABLED", "no_such_tool": "NOT_FOUND", "authorize_file": "REQUIRES_AUTHORIZED_CODE",
               "adf_shell": "DISABLED"})
    );
}

#[tokio::test]
async fn p35_authorization_follows_the_file_and_never_reaches_inline_code() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path(), &[("code_execution.restricted_methods", json!([]))]);
    // An authorized lambda may use a restricted tool; the sys_code it runs
    // may not, and neither may unauthorized code calling it.
    file(
        &mut s,
        "lib/admin.js",
        "export async function main(args) {\n\
           await adf.sys_update_config({path: 'description', value: args.d});\n\
           let inner;\n\
           try { await adf.sys_code({code: \"await adf.sys_update_config({path: 'description', value: 'inner'})\"}); inner = 'ran'; }\n\
           catch (e) { inner = e.message; }\n\
           return {inner};\n\
         }\n",
        true,
    );
    file(
        &mut s,
        "lib/plain.js",
        "export function main() { return adf.sys_lambda({source: 'lib/admin.js', args: {d: 'x'}}); }\n",
        false,
    );
    let src = "const a = await adf.sys_lambda({source: 'lib/admin.js', args: {d: 'from code'}}).catch(e => e.code);\n\
               const b = await adf.sys_lambda({source: 'lib/plain.js'}).catch(e => e.code);\n\
               return [a, b];";
    let (text, _, ex) = code(s, src).await;
    assert_eq!(text, "Result: [\n  \"REQUIRES_AUTHORIZED_CALLER\",\n  \"REQUIRES_AUTHORIZED_CALLER\"\n]");
    assert_ne!(ex.store.config_value().unwrap()["description"], json!("from code"));

    // From the loop an authorized target needs approval; approved, it runs
    // authorized, and its inline code is still refused.
    let (text, err, ex) = call_with(
        ex.store_into(),
        Arc::new(Yes),
        "sys_lambda",
        json!({"source": "lib/admin.js", "args": {"d": "approved"}}),
    )
    .await;
    assert!(!err, "{text}");
    assert!(text.contains("REQUIRES_AUTHORIZED_CODE") || text.contains("restricted"), "{text}");
    assert_eq!(ex.store.config_value().unwrap()["description"], json!("approved"));
    let tasks = ex.store.task_list(None).unwrap();
    assert!(tasks.iter().any(|t| t.tool == "sys_lambda" && t.status == "completed"), "{tasks:?}");

    // Editing the file clears its flag: the same call is now refused.
    let mut s = ex.store_into();
    s.file_write(
        Caller::AGENT,
        "lib/admin.js",
        b"export async function main(args) { return adf.sys_update_config({path: 'description', value: 'edited'}); }\n",
        &WriteOptions::default(),
    )
    .unwrap();
    let (text, err, ex) = call(s, "sys_lambda", json!({"source": "lib/admin.js:main"})).await;
    assert!(err, "{text}");
    assert!(text.contains("restricted to authorized code"), "{text}");
    assert_eq!(ex.store.config_value().unwrap()["description"], json!("approved"));
}

#[tokio::test]
async fn lambdas_typescript_circular_calls_and_async_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path(), &[]);
    file(
        &mut s,
        "lib/calc.ts",
        "interface In { a: number; b: number }\nexport function add(x: In): number { return x.a + x.b; }\n",
        false,
    );
    file(&mut s, "lib/a.js", "export function main() { return adf.sys_lambda({source: 'lib/b.js'}); }\n", false);
    file(&mut s, "lib/b.js", "export function main() { return adf.sys_lambda({source: 'lib/a.js'}); }\n", false);
    let (text, err, ex) = call(s, "sys_lambda", json!({"source": "lib/calc.ts:add", "args": {"a": 2, "b": 40}})).await;
    assert_eq!((text.as_str(), err), ("42", false));
    let (text, err, ex) = call(ex.store_into(), "sys_lambda", json!({"source": "lib/a.js"})).await;
    assert!(err && text.contains("CIRCULAR_CALL") || text.contains("Circular lambda call"), "{text}");
    let (text, err, ex) = call(ex.store_into(), "sys_lambda", json!({"source": "lib/missing.js"})).await;
    assert_eq!((text.as_str(), err), ("Error: File \"lib/missing.js\" not found in workspace files", true));
    let src = "const t = await adf.fs_write({mode: 'write', path: 'bg.txt', content: 'later', _async: true}); return t.status;";
    let (text, _, ex) = code(ex.store_into(), src).await;
    assert_eq!(text, "Result: running");
    assert_eq!(ex.store.file_read_text("bg.txt").unwrap(), "later");
    let tasks = ex.store.task_list(None).unwrap();
    assert!(
        tasks.iter().any(|t| t.tool == "fs_write" && t.status == "completed" && t.origin.as_deref() == Some("lambda"))
    );
}

/// A local HTTP server: `/ok`, `/to?u=…` (302 to u), `/hops/N` (N more
/// redirects).
async fn server() -> std::net::SocketAddr {
    use axum::extract::{Path, Query};
    use axum::response::{IntoResponse, Redirect};
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/ok", get(|| async { "fine" }))
        .route(
            "/bin",
            get(|| async {
                ([(axum::http::header::CONTENT_TYPE, "application/octet-stream")], vec![0u8, 1, 2, 250, 255])
            }),
        )
        .route(
            "/to",
            get(|Query(q): Query<std::collections::HashMap<String, String>>| async move {
                Redirect::to(&q["u"]).into_response()
            }),
        )
        .route(
            "/hops/{n}",
            get(|Path(n): Path<u32>| async move { Redirect::to(&format!("/hops/{}", n + 1)).into_response() }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

struct ToLoopback;
impl adf::runtime::egress::Resolve for ToLoopback {
    fn resolve<'a>(&'a self, _: &'a str, port: u16) -> BoxFuture<'a, std::io::Result<Vec<std::net::SocketAddr>>> {
        Box::pin(async move { Ok(vec![std::net::SocketAddr::from(([127, 0, 0, 1], port))]) })
    }
}

async fn fetch(store: Store, args: Value) -> (String, bool, Executor) {
    let provider =
        Arc::new(Scripted::new(vec![Reply::Tools(vec![("sys_fetch".into(), args)]), Reply::Text("done".into())]));
    let mut ex = Executor::new(store, provider, Bus::new(), Arc::new(Absent)).unwrap();
    ex.set_resolver(Arc::new(ToLoopback));
    ex.chat("go").await.unwrap();
    let (text, err) = tool_results(&ex.store).pop().unwrap();
    (text, err, ex)
}

#[tokio::test]
async fn p40_sys_fetch_egress_guard() {
    let addr = server().await;
    let dir = tempfile::tempdir().unwrap();
    let ok = format!("http://{addr}/ok");
    // Loopback refused by default, in any spelling, and through DNS.
    for u in [
        ok.clone(),
        format!("http://localhost:{}/ok", addr.port()),
        format!("http://2130706433:{}/ok", addr.port()),
        format!("http://[::ffff:127.0.0.1]:{}/ok", addr.port()),
        format!("http://public-looking.example:{}/ok", addr.port()),
        "http://10.0.0.1/".into(),
        "http://100.64.0.1/".into(),
        "http://0.0.0.0/".into(),
    ] {
        let (text, err, ex) = fetch(agent(dir.path(), &[]), json!({"url": u})).await;
        assert!(err && text.contains("Blocked"), "{u}: {text}");
        drop(ex);
        std::fs::remove_file(dir.path().join("a.adf")).unwrap();
    }
    // Allowed by the owner: the local server answers.
    let local = [("security.allow_local_fetch", json!(true))];
    let (text, err, ex) = fetch(agent(dir.path(), &local), json!({"url": ok})).await;
    assert!(!err, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((v["status"].clone(), v["body"].clone()), (json!(200), json!("fine")));
    // Still refused: metadata, the daemon's port, a redirect to metadata,
    // more than five redirects.
    let mut store = ex.store_into();
    for (u, why) in [
        ("http://169.254.169.254/latest/meta-data".to_string(), "metadata"),
        ("http://127.0.0.1:7385/agents".to_string(), "control API"),
        (format!("http://{addr}/to?u=http://169.254.169.254/"), "metadata"),
        (format!("http://{addr}/hops/0"), "Too many redirects"),
    ] {
        let (text, err, ex) = fetch(store, json!({"url": u})).await;
        assert!(err && text.contains(why), "{u}: {text}");
        store = ex.store_into();
    }
    let (text, err, _) = fetch(store, json!({"url": format!("http://{addr}/to?u=/ok")})).await;
    assert!(!err && text.contains("fine"), "{text}");
}

#[tokio::test]
async fn fetch_middleware_rewrites_and_rejects() {
    let addr = server().await;
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(
        dir.path(),
        &[
            ("security.allow_local_fetch", json!(true)),
            ("security.fetch_middleware", json!([{"lambda": "mw/fetch.js:check"}])),
        ],
    );
    file(
        &mut s,
        "mw/fetch.js",
        "export function check({point, data}) {\n\
           if (data.url.includes('forbidden')) return {reject: {code: 403, reason: 'not there'}};\n\
           return {data: {...data, url: data.url.replace('/rewrite-me', '/ok')}};\n\
         }\n",
        true,
    );
    let (text, err, ex) = fetch(s, json!({"url": format!("http://{addr}/rewrite-me")})).await;
    assert!(!err && text.contains("fine"), "{text}");
    let (text, err, ex) = fetch(ex.store_into(), json!({"url": format!("http://{addr}/forbidden")})).await;
    assert!(err && text.contains("not there"), "{text}");
    // An unauthorized middleware file is skipped with a warning.
    let mut s = ex.store_into();
    s.file_write(
        Caller::AGENT,
        "mw/fetch.js",
        b"export function check() { return {reject: {code: 1, reason: 'x'}}; }\n",
        &WriteOptions::default(),
    )
    .unwrap();
    let (text, err, ex) = fetch(s, json!({"url": format!("http://{addr}/ok")})).await;
    assert!(!err && text.contains("fine"), "{text}");
    assert!(logs(&ex.store).iter().any(|l| l.starts_with("middleware/skipped_unauthorized")), "{:?}", logs(&ex.store));
}

#[tokio::test]
async fn model_invoke_and_task_resolve_from_code() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path(), &[]);
    let task = s
        .task_create(&adf::store::tasks::NewTask {
            tool: "fs_write",
            args: &json!({"mode": "write", "path": "approved.txt", "content": "yes"}),
            status: "pending_approval",
            origin: "lambda",
            requires_authorization: true,
            executor_managed: false,
            approval_meta: None,
        })
        .unwrap();
    file(
        &mut s,
        "lib/ops.js",
        &format!(
            "export async function main() {{ return adf.task_resolve({{task_id: '{task}', action: 'approve'}}); }}\n"
        ),
        true,
    );
    let src = format!(
        "const said = await adf.model_invoke({{prompt: 'Say hi', system: 'Be brief'}});\n\
         const refused = await adf.task_resolve({{task_id: '{task}', action: 'approve'}}).catch(e => e.code);\n\
         const parked = await adf.task_resolve({{task_id: '{task}', action: 'pending_approval'}});\n\
         const missing = await adf.task_resolve({{task_id: 'task_nope', action: 'deny'}}).catch(e => e.code);\n\
         return {{said, refused, parked: parked.status, missing}};"
    );
    let provider = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![("sys_code".into(), json!({"code": src}))]),
        Reply::Text("hi there".into()),
        Reply::Tools(vec![("sys_lambda".into(), json!({"source": "lib/ops.js"}))]),
        Reply::Text("done".into()),
    ]));
    let mut ex = Executor::new(s, provider.clone(), Bus::new(), Arc::new(Yes)).unwrap();
    ex.chat("go").await.unwrap();
    let results: Vec<String> = tool_results(&ex.store).into_iter().map(|(t, _)| t).collect();
    let v: Value = serde_json::from_str(results[0].strip_prefix("Result: ").unwrap()).unwrap();
    assert_eq!(
        v,
        json!({"said": "hi there", "refused": "REQUIRES_AUTHORIZED_CODE", "parked": "pending_approval", "missing": "NOT_FOUND"})
    );
    let req = &provider.requests()[1];
    assert_eq!(&*req.system, "Be brief");
    assert!(req.tools.is_empty());
    // The authorized lambda (approved from the loop) may approve it: the tool runs.
    assert!(results[1].contains("\"status\": \"completed\""), "{}", results[1]);
    assert_eq!(ex.store.file_read_text("approved.txt").unwrap(), "yes");
    assert_eq!(ex.store.task_get(&task).unwrap().unwrap().status, "completed");
}

#[tokio::test]
async fn a_protection_denial_from_code_asks_the_owner() {
    struct Says(Decision);
    impl Owner for Says {
        fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, Decision> {
            assert_eq!(req.reason, "protection");
            let d = self.0.clone();
            Box::pin(async move { d })
        }
        fn answer<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Option<String>> {
            Box::pin(async { None })
        }
    }
    let src = "return await adf.fs_delete({path: 'README.md'}).then(() => 'deleted', e => e.code + ' ' + e.message)";
    let dir = tempfile::tempdir().unwrap();
    let on = [("tools.fs_delete.enabled", json!(true))];
    let (text, _, ex) = call_with(
        agent(dir.path(), &on),
        Arc::new(Says(Decision::Deny { feedback: Some("keep it".into()) })),
        "sys_code",
        json!({"code": src}),
    )
    .await;
    assert_eq!(
        text,
        "Result: PROTECTION_DENIED \"fs_delete\" was blocked (file_protection: \"README.md\" is no_delete) and the authorizer rejected the override. Feedback: keep it"
    );
    assert!(ex.store.file_stat("README.md").unwrap().is_some());
    let (text, _, ex) = call(ex.store_into(), "sys_code", json!({"code": src})).await;
    assert!(text.starts_with("Result: PROTECTION_DENIED"), "nobody to ask: {text}");
    let (text, _, ex) = call_with(
        ex.store_into(),
        Arc::new(Says(Decision::Approve { always: false })),
        "sys_code",
        json!({"code": src}),
    )
    .await;
    assert_eq!(text, "Result: deleted");
    assert!(ex.store.file_stat("README.md").unwrap().is_none());
    let done = ex.store.task_list(Some("completed")).unwrap();
    assert!(done.iter().any(|t| t.tool == "fs_delete" && t.origin.as_deref().is_some_and(|o| o.starts_with("hil:fs_delete:code_"))));
}

#[tokio::test]
async fn allow_local_fetch_is_the_owners_even_for_authorized_code() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path(), &[]);
    file(
        &mut s,
        "lib/open.js",
        "export async function main() { return adf.sys_update_config({path: 'security.allow_local_fetch', value: true}).catch(e => e.code + ' ' + e.message); }\n",
        true,
    );
    let provider = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![("sys_lambda".into(), json!({"source": "lib/open.js"}))]),
        Reply::Text("done".into()),
    ]));
    struct Yes;
    impl Owner for Yes {
        fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, Decision> {
            assert_eq!(req.reason, "restricted", "only the authorized lambda is approved, never the lock");
            Box::pin(async { Decision::Approve { always: false } })
        }
        fn answer<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Option<String>> {
            Box::pin(async { None })
        }
    }
    let mut ex = Executor::new(s, provider, Bus::new(), Arc::new(Yes)).unwrap();
    ex.chat("go").await.unwrap();
    assert_ne!(ex.store.config_value().unwrap()["security"]["allow_local_fetch"], json!(true));
    // The owner sets it.
    ex.store.config_set(Caller::Owner, "security.allow_local_fetch", json!(true)).unwrap();
    assert_eq!(ex.store.config_value().unwrap()["security"]["allow_local_fetch"], json!(true));
}

#[tokio::test]
async fn sys_code_keeps_state_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![("sys_code".into(), json!({"code": "var kept = 41; globalThis.kept2 = 1;"}))]),
        Reply::Tools(vec![("sys_code".into(), json!({"code": "kept + kept2", "clear_state": false}))]),
        Reply::Tools(vec![("sys_code".into(), json!({"code": "typeof kept"}))]),
        Reply::Text("done".into()),
    ]));
    let mut ex = Executor::new(agent(dir.path(), &[]), provider, Bus::new(), Arc::new(Absent)).unwrap();
    ex.chat("go").await.unwrap();
    let results: Vec<String> = tool_results(&ex.store).into_iter().map(|(t, _)| t).collect();
    assert_eq!(results[1..], ["Result: 42".to_string(), "Result: undefined".to_string()]);
}

#[tokio::test]
async fn authorized_code_sets_protection_and_authorizes_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = agent(dir.path(), &[]);
    s.meta_set(Caller::Owner, "budget", "10", None).unwrap();
    file(&mut s, "notes.md", "n", false);
    file(&mut s, "lib/helper.js", "export function main() { return 1; }\n", false);
    file(
        &mut s,
        "lib/admin.js",
        "export async function main() {\n\
           await adf.set_file_protection({path: 'notes.md', protection: 'read_only'});\n\
           await adf.set_meta_protection({key: 'budget', protection: 'increment'});\n\
           await adf.authorize_file({path: 'lib/helper.js'});\n\
           return [await adf.set_meta_protection({key: 'nope', protection: 'readonly'}).catch(e => e.code),\n\
                   await adf.authorize_file({path: 'missing.js'}).catch(e => e.code)];\n\
         }\n",
        true,
    );
    let src = "return [await adf.set_file_protection({path: 'notes.md', protection: 'none'}).catch(e => e.code)]";
    let (text, _, ex) = code(s, src).await;
    assert_eq!(text, "Result: [\n  \"REQUIRES_AUTHORIZED_CODE\"\n]");
    let (text, err, ex) =
        call_with(ex.store_into(), Arc::new(Yes), "sys_lambda", json!({"source": "lib/admin.js"})).await;
    assert!(!err, "{text}");
    assert_eq!(text, "[\n  \"NOT_FOUND\",\n  \"NOT_FOUND\"\n]");
    let f = ex.store.file_stat("notes.md").unwrap().unwrap();
    assert_eq!(f.protection, adf::store::files::Protection::ReadOnly);
    assert_eq!(ex.store.meta_get("budget").unwrap().unwrap().protection.as_str(), "increment");
    assert!(ex.store.file_stat("lib/helper.js").unwrap().unwrap().authorized);
}

#[tokio::test]
async fn bytes_cross_as_uint8array() {
    let addr = server().await;
    let dir = tempfile::tempdir().unwrap();
    let s = agent(dir.path(), &[("security.allow_local_fetch", json!(true))]);
    let src = format!(
        "await adf.fs_write({{mode: 'write', path: 'blob.bin', content: new Uint8Array([0, 1, 2, 250, 255, 7, 8])}});\n\
         const r = await adf.sys_fetch({{url: 'http://{addr}/bin'}});\n\
         return [r.body instanceof Uint8Array, Array.from(r.body)];"
    );
    let provider = Arc::new(Scripted::new(vec![
        Reply::Tools(vec![("sys_code".into(), json!({"code": src}))]),
        Reply::Text("done".into()),
    ]));
    let mut ex = Executor::new(s, provider, Bus::new(), Arc::new(Absent)).unwrap();
    ex.chat("go").await.unwrap();
    let (_, bytes) = ex.store.file_read("blob.bin").unwrap();
    assert_eq!(bytes, vec![0, 1, 2, 250, 255, 7, 8]);
    let (last, _) = tool_results(&ex.store).pop().unwrap();
    assert_eq!(json!(last), json!("Result: [\n  true,\n  [\n    0,\n    1,\n    2,\n    250,\n    255\n  ]\n]"));
}

#[tokio::test]
async fn full_lifts_the_row_cap_for_code_only() {
    let dir = tempfile::tempdir().unwrap();
    let s = agent(dir.path(), &[("tools.db_execute.enabled", json!(true))]);
    let src = "await adf.db_execute({sql: 'CREATE TABLE local_n (x INTEGER)'});\n\
               await adf.db_execute({sql: 'INSERT INTO local_n(x) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 600) SELECT x FROM c'});\n\
               const capped = await adf.db_query({sql: 'SELECT x FROM local_n'});\n\
               const full = await adf.db_query({sql: 'SELECT x FROM local_n', _full: true});\n\
               const rows = (r) => (typeof r === 'string' ? r : JSON.stringify(r)).split('\"x\"').length - 1;\n\
               return [rows(capped), rows(full)];";
    let (text, err, _) = code(s, src).await;
    assert!(!err, "{text}");
    assert_eq!(text, "Result: [\n  500,\n  600\n]");
}
