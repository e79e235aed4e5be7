//! The worker side: `adf __sandbox` runs agent JavaScript on boa in its own
//! process, so that the runtime can stop runaway code at any instruction
//! (kill), cap its memory (an address-space limit), and lose nothing but the
//! worker when it crashes. The environment is empty, the working folder is
//! `/`, and the realm offers no file, process or network API: the only door
//! out is `adf.*`, which the worker forwards to the runtime and waits on.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::rc::Rc;

use boa_engine::object::builtins::JsPromise;
use boa_engine::realm::Realm;
use boa_engine::{
    Context, JsError, JsObject, JsResult, JsString, JsValue, NativeFunction, Script, Source, context::HostHooks,
    js_string, object::builtins::JsFunction,
};
use serde_json::Value;

use super::wire::{CallError, FromWorker, RunReq, ToWorker};

/// Address space a worker may use.
pub const MEMORY_LIMIT: u64 = 1 << 30;
/// Iterations of one loop, calls deep, and VM stack values: bounds that
/// raise errors no `try` can catch.
const LOOP_LIMIT: u64 = 100_000_000;
const RECURSION_LIMIT: usize = 1_000;
const STACK_LIMIT: usize = 1 << 20;

const PRELUDE: &str = include_str!("prelude.js");

thread_local! {
    static LOGS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    static NEXT_CALL: RefCell<u64> = const { RefCell::new(0) };
}

/// `eval`, `Function`, and every other way of compiling a string at run
/// time are refused.
struct NoDynamicCode;

impl HostHooks for NoDynamicCode {
    fn ensure_can_compile_strings(
        &self,
        _realm: Realm,
        _parameters: &[JsString],
        _body: &JsString,
        _direct: bool,
        _context: &mut Context,
    ) -> JsResult<()> {
        Err(boa_engine::JsNativeError::eval()
            .with_message("code generation from strings is disabled in the sandbox (eval, Function)")
            .into())
    }
}

/// Entry point of `adf __sandbox`; never returns.
pub fn main() -> ! {
    limit_memory();
    // Deep native recursion inside the engine needs room; run on a thread
    // with a large stack.
    let worker = std::thread::Builder::new().stack_size(256 << 20).spawn(serve);
    let code = match worker.map(|h| h.join()) {
        Ok(Ok(())) => 0,
        _ => 70,
    };
    std::process::exit(code)
}

fn limit_memory() {
    let lim = libc::rlimit { rlim_cur: MEMORY_LIMIT + (256 << 20), rlim_max: MEMORY_LIMIT + (256 << 20) };
    // SAFETY: setrlimit only reads the struct we pass.
    unsafe {
        libc::setrlimit(libc::RLIMIT_AS, &lim);
    }
}

fn send(msg: &FromWorker) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, msg);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

fn read() -> Option<ToWorker> {
    let mut line = String::new();
    loop {
        line.clear();
        match std::io::stdin().lock().read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) if line.trim().is_empty() => continue,
            Ok(_) => return serde_json::from_str(&line).ok(),
        }
    }
}

struct Realmed {
    ctx: Context,
    modules: HashMap<String, JsObject>,
}

fn fresh() -> Result<Realmed, String> {
    let mut ctx = Context::builder().host_hooks(Rc::new(NoDynamicCode)).build().map_err(|e| e.to_string())?;
    let limits = ctx.runtime_limits_mut();
    limits.set_loop_iteration_limit(LOOP_LIMIT);
    limits.set_recursion_limit(RECURSION_LIMIT);
    limits.set_stack_size_limit(STACK_LIMIT);
    ctx.register_global_callable(js_string!("__host"), 2, NativeFunction::from_fn_ptr(host_call))
        .map_err(|e| e.to_string())?;
    ctx.register_global_callable(js_string!("__log"), 2, NativeFunction::from_fn_ptr(log))
        .map_err(|e| e.to_string())?;
    ctx.eval(Source::from_bytes(PRELUDE)).map_err(|e| e.to_string())?;
    Ok(Realmed { ctx, modules: HashMap::new() })
}

fn serve() {
    let mut spare = fresh().ok();
    let mut current: Option<Realmed> = None;
    send(&FromWorker::Ready);
    while let Some(msg) = read() {
        let ToWorker::Run(req) = msg else { continue };
        if req.fresh || current.is_none() {
            current = spare.take().or_else(|| fresh().ok());
        }
        let Some(realm) = current.as_mut() else {
            send(&done(req.id, Err(CallError::new("INTERNAL_ERROR", "the sandbox could not start")), Vec::new()));
            continue;
        };
        LOGS.with(|l| l.borrow_mut().clear());
        let result = run(realm, &req);
        let logs = LOGS.with(|l| std::mem::take(&mut *l.borrow_mut()));
        send(&done(req.id, result, logs));
        // Get the next cold realm ready while nobody waits.
        if spare.is_none() {
            spare = fresh().ok();
        }
    }
}

fn done(id: u64, result: Result<Option<Value>, CallError>, logs: Vec<String>) -> FromWorker {
    match result {
        Ok(value) => FromWorker::Done { id, value, error: None, logs },
        Err(e) => FromWorker::Done { id, value: None, error: Some(e), logs },
    }
}

fn run(realm: &mut Realmed, req: &RunReq) -> Result<Option<Value>, CallError> {
    let ctx = &mut realm.ctx;
    let value = if let Some(code) = &req.code {
        eval_code(ctx, code)?
    } else if let Some(m) = &req.module {
        let key = format!("{}\0{}", m.path, m.hash);
        let ns = match realm.modules.get(&key) {
            Some(ns) => ns.clone(),
            None => {
                let v = eval(ctx, &format!("(async () => {{\n{}\n}})()", m.source))?;
                let v = settle(ctx, v)?;
                let ns = v.as_object().ok_or_else(|| CallError::new("FN_ERROR", "the module did not load"))?;
                realm.modules.insert(key, ns.clone());
                ns
            }
        };
        let f = ns.get(JsString::from(m.function.as_str()), ctx).map_err(|e| js_error(ctx, e))?;
        let Some(f) = f.as_object().and_then(|o| JsFunction::from_object(o.clone())) else {
            return Err(CallError::new(
                "FN_ERROR",
                format!(
                    "Function \"{}\" not found in \"{}\". Export it (export function {}(args) {{ … }}).",
                    m.function, m.path, m.function
                ),
            ));
        };
        let arg = JsValue::from_json(&req.args, ctx).map_err(|e| js_error(ctx, e))?;
        f.call(&JsValue::undefined(), &[arg], ctx).map_err(|e| js_error(ctx, e))?
    } else {
        JsValue::undefined()
    };
    let value = settle(ctx, value)?;
    if value.is_undefined() {
        return Ok(None);
    }
    match value.to_json(ctx) {
        Ok(v) => Ok(v),
        Err(_) => Ok(Some(Value::String(value.display().to_string()))),
    }
}

/// Inline code: a script when it is one (its completion value is the
/// result, and its globals stay for a warm realm); otherwise the body of
/// an async function, returning the value of a lone expression.
fn eval_code(ctx: &mut Context, code: &str) -> Result<JsValue, CallError> {
    let code = &*super::prepare::code_imports(code);
    // A parsed script is evaluated as is: parsing declares its globals, so
    // it must not be parsed twice.
    if let Ok(script) = Script::parse(Source::from_bytes(code), None, ctx) {
        return script.evaluate(ctx).map_err(|e| js_error(ctx, e));
    }
    let trimmed = code.trim().trim_end_matches(';');
    let expr = format!("(async () => (\n{trimmed}\n))()");
    if let Ok(script) = Script::parse(Source::from_bytes(&expr), None, ctx) {
        return script.evaluate(ctx).map_err(|e| js_error(ctx, e));
    }
    eval(ctx, &format!("(async () => {{\n{code}\n}})()"))
}

fn eval(ctx: &mut Context, src: &str) -> Result<JsValue, CallError> {
    ctx.eval(Source::from_bytes(src)).map_err(|e| js_error(ctx, e))
}

/// Run pending jobs and unwrap a promise.
fn settle(ctx: &mut Context, v: JsValue) -> Result<JsValue, CallError> {
    ctx.run_jobs().map_err(|e| js_error(ctx, e))?;
    let Some(p) = v.as_object().and_then(|o| JsPromise::from_object(o.clone()).ok()) else {
        return Ok(v);
    };
    match p.state() {
        boa_engine::builtins::promise::PromiseState::Fulfilled(v) => Ok(v),
        boa_engine::builtins::promise::PromiseState::Rejected(e) => Err(js_error(ctx, JsError::from_opaque(e))),
        boa_engine::builtins::promise::PromiseState::Pending => {
            Err(CallError::new("FN_ERROR", "the code's promise never settled (nothing left to wait for)"))
        }
    }
}

/// A JS error as the runtime reports it: the message, and `code` when the
/// thrown value carries one.
fn js_error(ctx: &mut Context, e: JsError) -> CallError {
    if e.as_opaque().is_none() {
        return match e.try_native(ctx) {
            Ok(native) => CallError::new("FN_ERROR", first_lines(&format!("{}: {}", native.kind(), native.message()))),
            // Engine limits (loop, recursion, stack) are not JS values.
            Err(_) => CallError::new("FN_ERROR", first_lines(&e.to_string())),
        };
    }
    let v = e.into_opaque(ctx).unwrap_or_default();
    if let Some(o) = v.as_object() {
        let get = |ctx: &mut Context, k: &str| {
            let v = o.get(JsString::from(k), ctx).ok().filter(|v| !v.is_undefined())?;
            v.to_string(ctx).ok().map(|s| s.to_std_string_escaped())
        };
        let message = get(ctx, "message");
        let name = get(ctx, "name").unwrap_or_else(|| "Error".into());
        let code = get(ctx, "code").unwrap_or_else(|| "FN_ERROR".into());
        if let Some(m) = message {
            return CallError::new(&code, format!("{name}: {m}"));
        }
    }
    CallError::new("FN_ERROR", format!("Uncaught {}", v.display()))
}

/// An engine message without most of its stack.
fn first_lines(s: &str) -> String {
    let mut lines: Vec<&str> = s.lines().take(4).collect();
    if s.lines().count() > 4 {
        lines.push("    …");
    }
    lines.join("\n")
}

fn arg_string(args: &[JsValue], i: usize, ctx: &mut Context) -> JsResult<String> {
    Ok(args.get(i).cloned().unwrap_or_default().to_string(ctx)?.to_std_string_escaped())
}

/// `__host(name, json)`: forward an `adf.*` call and wait for the answer,
/// returned as JSON `{ok}` or `{err: {code, message}}`.
fn host_call(_: &JsValue, args: &[JsValue], ctx: &mut Context) -> JsResult<JsValue> {
    let method = arg_string(args, 0, ctx)?;
    let json = arg_string(args, 1, ctx)?;
    let args: Value = serde_json::from_str(&json).unwrap_or(Value::Null);
    let call = NEXT_CALL.with(|n| {
        let mut n = n.borrow_mut();
        *n += 1;
        *n
    });
    send(&FromWorker::Call { call, method, args });
    loop {
        match read() {
            None => std::process::exit(0),
            Some(ToWorker::Reply { call: c, ok, err }) if c == call => {
                let reply = match err {
                    Some(e) => serde_json::json!({"err": e}),
                    None => serde_json::json!({"ok": ok}),
                };
                return Ok(JsValue::from(JsString::from(reply.to_string().as_str())));
            }
            Some(_) => continue,
        }
    }
}

fn log(_: &JsValue, args: &[JsValue], ctx: &mut Context) -> JsResult<JsValue> {
    let level = arg_string(args, 0, ctx)?;
    let text = arg_string(args, 1, ctx)?;
    let line = match level.as_str() {
        "warn" => format!("[warn] {text}"),
        "error" => format!("[error] {text}"),
        _ => text,
    };
    LOGS.with(|l| l.borrow_mut().push(line));
    Ok(JsValue::undefined())
}
