//! The sandbox's walls, on real worker processes: each hostile script must
//! fail safely (an error the runtime reports), and the next run must work.

use std::time::Duration;

use adf::sandbox::{self, CallError, Host, ModuleReq, NoHost, Outcome, RunReq, SandboxError};
use futures_util::future::BoxFuture;
use serde_json::{Value, json};

fn code(src: &str) -> RunReq {
    RunReq { code: Some(src.into()), ..Default::default() }
}

async fn run(src: &str) -> Result<Outcome, SandboxError> {
    sandbox::run(code(src), None, &mut NoHost, Duration::from_secs(10)).await
}

async fn value(src: &str) -> Value {
    let out = run(src).await.expect("runs");
    assert_eq!(out.error, None, "{src}");
    out.value.unwrap_or(Value::Null)
}

async fn js_error(src: &str) -> CallError {
    let out = run(src).await.expect("the worker survives");
    out.error.unwrap_or_else(|| panic!("{src} should fail, returned {:?}", out.value))
}

async fn still_healthy() {
    assert_eq!(value("6 * 7").await, json!(42));
}

#[tokio::test]
async fn values_statements_and_async_bodies() {
    assert_eq!(value("1 + 1").await, json!(2));
    assert_eq!(value("const a = [1, 2]; a.map(x => x * 2)").await, json!([2, 4]));
    assert_eq!(value("const r = await Promise.resolve(5); return r + 1;").await, json!(6));
    assert_eq!(value("await Promise.resolve('x')").await, json!("x"));
    assert_eq!(value("({a: {b: [true, null]}})").await, json!({"a": {"b": [true, null]}}));
    let out = run("console.log('hi', {n: 1}); console.warn('careful'); console.error('bad')").await.unwrap();
    assert_eq!(out.logs, vec!["hi {\"n\":1}", "[warn] careful", "[error] bad"]);
    let e = js_error("throw Object.assign(new Error('nope'), {code: 'MINE'})").await;
    assert_eq!(e, CallError::new("MINE", "Error: nope"));
}

#[tokio::test]
async fn an_endless_loop_is_stopped_and_the_sandbox_recovers() {
    let started = std::time::Instant::now();
    let out = sandbox::run(code("while (true) {}"), None, &mut NoHost, Duration::from_millis(1500)).await;
    match out {
        Err(SandboxError::Timeout(ms)) => assert_eq!(ms, 1500),
        Ok(o) => assert!(o.error.as_ref().is_some_and(|e| e.message.contains("loop")), "{o:?}"),
        Err(e) => panic!("unexpected {e}"),
    }
    assert!(started.elapsed() < Duration::from_secs(8));
    // In a promise job, where no loop counter helps: only the wall clock.
    let out = sandbox::run(
        code("await null; for (;;) { try { while (true) {} } catch (e) {} }"),
        None,
        &mut NoHost,
        Duration::from_millis(1000),
    )
    .await;
    assert!(out.is_err() || out.as_ref().is_ok_and(|o| o.error.is_some()), "{out:?}");
    still_healthy().await;
}

#[tokio::test]
async fn deep_recursion_cannot_be_caught() {
    let e = js_error("function f() { return f(); } f()").await;
    assert!(e.message.to_lowercase().contains("recursi") || e.message.contains("stack"), "{e:?}");
    let e = js_error("function f() { try { return f(); } catch (e) { return 'caught'; } } f()").await;
    assert!(e.message.to_lowercase().contains("recursi") || e.message.contains("stack"), "{e:?}");
    still_healthy().await;
}

#[tokio::test]
async fn a_huge_allocation_kills_only_the_worker() {
    let out = run("const a = []; while (true) { a.push(new Array(1e7).fill(1.5)); } a.length").await;
    match out {
        Err(SandboxError::Crashed(why)) => assert!(why.contains("memory") || why.contains("killed"), "{why}"),
        Err(SandboxError::Timeout(_)) => {}
        Ok(o) => assert!(o.error.is_some(), "{o:?}"),
        Err(e) => panic!("unexpected {e}"),
    }
    match run("'x'.repeat(2 ** 31).length").await {
        Err(SandboxError::Crashed(why)) => assert!(why.contains("memory"), "{why}"),
        Ok(o) => assert!(o.error.is_some_and(|e| e.message.contains("RangeError")), "{:?}", o.value),
        Err(e) => panic!("unexpected {e}"),
    }
    still_healthy().await;
}

#[tokio::test]
async fn no_dynamic_code() {
    for src in [
        "globalThis.constructor.constructor('return process')()",
        "eval('1 + 1')",
        "Function('return 1')()",
        "new Function('return this')()",
        "(async function(){}).constructor('return 1')",
        "(function*(){}).constructor('yield 1')",
    ] {
        let e = js_error(src).await;
        assert!(e.message.contains("disabled in the sandbox"), "{src}: {e:?}");
    }
}

#[tokio::test]
async fn built_ins_are_frozen_and_the_host_is_out_of_reach() {
    assert_eq!(value("Object.prototype.polluted = 1; ({}).polluted === undefined").await, json!(true));
    let e = js_error("'use strict'; Object.defineProperty(Object.prototype, 'x', {value: 1})").await;
    assert!(e.message.contains("TypeError"), "{e:?}");
    assert_eq!(value("Array.prototype.map = null; typeof [].map").await, json!("function"));
    assert_eq!(value("Object.isFrozen(Promise.prototype) && Object.isFrozen(JSON)").await, json!(true));
    assert_eq!(
        value("[typeof __host, typeof __log, typeof fetch, typeof XMLHttpRequest]").await,
        json!(["undefined", "undefined", "undefined", "undefined"])
    );
    assert_eq!(value("[JSON.stringify(process.env), process.cwd(), process.argv.length]").await, json!(["{}", "/", 0]));
    let e = js_error("require('fs')").await;
    assert!(e.message.contains("ReferenceError") && e.message.contains("import"), "{e:?}");
    let e = js_error("import fs from 'fs'; return fs.readFileSync('/etc/passwd')").await;
    assert!(e.message.contains("Cannot import \"fs\""), "{e:?}");
    let e = js_error("'use strict'; adf = null;").await;
    assert!(e.message.contains("TypeError") || e.message.contains("read"), "{e:?}");
    assert_eq!(value("delete globalThis.adf; typeof adf").await, json!("object"));
    let e = js_error("process.exit(1)").await;
    assert!(e.message.contains("not available"), "{e:?}");
}

#[tokio::test]
async fn warm_state_is_kept_under_an_id_and_cold_runs_start_clean() {
    let id = format!("test:{}", std::process::id());
    let mut host = NoHost;
    let t = Duration::from_secs(5);
    sandbox::run(code("var counter = 41"), Some(&id), &mut host, t).await.unwrap();
    let out = sandbox::run(code("counter + 1"), Some(&id), &mut host, t).await.unwrap();
    assert_eq!(out.value, Some(json!(42)));
    let out = sandbox::run(code("typeof counter"), None, &mut host, t).await.unwrap();
    assert_eq!(out.value, Some(json!("undefined")));
    sandbox::reset(&id);
    let out = sandbox::run(code("typeof counter"), Some(&id), &mut host, t).await.unwrap();
    assert_eq!(out.value, Some(json!("undefined")));
}

/// Records calls and answers `echo` with its arguments.
struct Echo(Vec<String>);

impl Host for Echo {
    fn call<'a>(&'a mut self, method: &'a str, args: Value) -> BoxFuture<'a, Result<Value, CallError>> {
        self.0.push(method.to_string());
        Box::pin(async move {
            match method {
                "echo" => Ok(json!(args.to_string())),
                "raw" => Ok(json!("plain text")),
                _ => Err(CallError::new("NOT_FOUND", format!("Unknown method {method}"))),
            }
        })
    }
}

#[tokio::test]
async fn the_adf_proxy_round_trips_json_and_throws_with_codes() {
    let mut host = Echo(Vec::new());
    let src = "const a = await adf.echo({n: 1, s: 'x'}); const b = await adf.raw(); \
               let c; try { await adf.nope({}); } catch (e) { c = [e.code, e.message]; } \
               return {a, b, c};";
    let out = sandbox::run(code(src), None, &mut host, Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        out.value,
        Some(json!({"a": {"n": 1, "s": "x"}, "b": "plain text", "c": ["NOT_FOUND", "Unknown method nope"]}))
    );
    assert_eq!(host.0, vec!["echo", "raw", "nope"]);
}

#[tokio::test]
async fn typescript_lambdas_export_functions() {
    let p = sandbox::prepare::module(
        "lib/calc.ts",
        "type In = { a: number; b: number };\nexport function add({ a, b }: In): number { return a + b; }\nexport async function main(x: In) { return { sum: add(x) }; }\n",
    )
    .unwrap();
    for (f, expect) in [("main", json!({"sum": 5})), ("add", json!(5))] {
        let req = RunReq {
            module: Some(ModuleReq {
                path: "lib/calc.ts".into(),
                hash: p.hash.clone(),
                source: p.source.clone(),
                function: f.into(),
            }),
            args: json!({"a": 2, "b": 3}),
            ..Default::default()
        };
        let out = sandbox::run(req, None, &mut NoHost, Duration::from_secs(5)).await.unwrap();
        assert_eq!(out.value, Some(expect));
    }
    let req = RunReq {
        module: Some(ModuleReq { path: "lib/calc.ts".into(), hash: p.hash, source: p.source, function: "nope".into() }),
        ..Default::default()
    };
    let out = sandbox::run(req, None, &mut NoHost, Duration::from_secs(5)).await.unwrap();
    assert!(out.error.unwrap().message.starts_with("Function \"nope\" not found in \"lib/calc.ts\""));
}
