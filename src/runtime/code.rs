//! Agent code in the executor: the `sys_code` and `sys_lambda` tools, and
//! the `adf` proxy that code calls back through (runtime.md §7.3, §8.5).
//! Every call from code passes the dispatch order of the reference's call
//! handler: authorization stripping, restricted methods, authorized-only
//! methods, code-only methods (`code_execution.<m>`), excluded tools, the
//! declaration, `restricted`, `enabled`, `_async`, then the tool itself.
//! The caller's authorization travels with each call (`CodeCx`), so two
//! pieces of code never share privilege.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{Value, json};

use super::executor::Executor;
use crate::protocol::kind;
use crate::sandbox::{self, CallError, ModuleReq, Outcome, RunReq};
use crate::store::Caller;
use crate::store::tasks::NewTask;
use crate::tools::{self, Ctx, EXCLUDED_FROM_CODE, ToolOutput};

/// Who is calling from code.
#[derive(Debug, Clone)]
pub struct CodeCx {
    pub authorized: bool,
    /// The runtime's name for the caller: `sys_code`, `lambda:<path>:<fn>`.
    pub source: String,
    /// `path:fn` of the lambdas on the call stack (circular calls).
    pub chain: Vec<String>,
}

/// A system-scope lambda waiting to run.
#[derive(Debug, Clone)]
pub struct SystemJob {
    pub trigger: &'static str,
    /// `path/file.ts[:fn]`.
    pub lambda: String,
    /// The event object the lambda receives.
    pub event: Value,
    pub warm: bool,
    pub source: String,
}

/// Methods only code has, each switchable by `code_execution.<m>`.
const CODE_ONLY: &[&str] = &[
    "model_invoke",
    "sys_lambda",
    "task_resolve",
    "loop_inject",
    "identity_status",
    "get_identity",
    "set_identity",
    "emit_event",
    "attestation_list",
    "attestation_add",
    "attestation_issue",
    "doc_text",
    "doc_table",
    "zip_list",
    "zip_extract",
    "yaml_parse",
    "yaml_stringify",
];

/// How long unauthorized code waits for the owner on a protection denial.
pub const PROTECTION_WAIT: Duration = Duration::from_secs(20 * 60);

/// Tools the executor runs itself (code, network, messaging): async, their
/// input checked here against the tool's schema.
pub const CODE_TOOLS: &[&str] = &["sys_code", "sys_lambda", "sys_fetch", "msg_send", "agent_discover"];

fn err(code: &str, message: impl Into<String>) -> CallError {
    CallError::new(code, message)
}

/// Input that does not fit a code tool's schema, as the tool's error.
pub fn invalid_input(name: &str, input: &Value) -> Option<ToolOutput> {
    let def = tools::def(name)?;
    let mut clean = input.clone();
    if let Some(o) = clean.as_object_mut() {
        o.retain(|k, _| !tools::RESERVED.contains(&k.as_str()));
    }
    tools::schema::validate(&(def.schema)(), &clean)
        .err()
        .map(|m| ToolOutput::err(format!("Invalid input for tool \"{name}\": {m}")))
}

/// The proxy's view of an executor: serves calls for one piece of code.
struct Proxy<'a> {
    ex: &'a mut Executor,
    cx: CodeCx,
}

impl sandbox::Host for Proxy<'_> {
    fn call<'a>(&'a mut self, method: &'a str, args: Value) -> BoxFuture<'a, Result<Value, CallError>> {
        let cx = self.cx.clone();
        self.ex.code_call(cx, method, args)
    }
}

/// A value as tool text: strings as they are, anything else as JSON.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        v => serde_json::to_string_pretty(v).unwrap_or_default(),
    }
}

impl Executor {
    /// The timeout for a run: the `timeout` argument (at least 1 s, at most
    /// the agent's limit) or `limits.execution_timeout_ms`, never above
    /// 300 s.
    pub(crate) fn code_timeout(&mut self, asked: Option<u64>) -> Duration {
        let limit = self
            .store
            .config_value()
            .ok()
            .and_then(|c| c.pointer("/limits/execution_timeout_ms").and_then(Value::as_u64))
            .unwrap_or(60_000);
        let ms = asked.map(|t| t.clamp(1_000, limit.max(1_000))).unwrap_or(limit);
        Duration::from_millis(ms.min(sandbox::MAX_TIMEOUT_MS))
    }

    /// The `sys_code` tool: always unauthorized; state kept under
    /// `<agentId>:code` only when `clear_state` is false.
    pub(crate) async fn sys_code(&mut self, input: &Value) -> ToolOutput {
        let code = input["code"].as_str().unwrap_or("").to_string();
        let timeout = self.code_timeout(input["timeout"].as_u64());
        let id = format!("{}:code", self.agent_id());
        if input["clear_state"].as_bool() != Some(false) {
            sandbox::reset(&id);
        }
        let cx = CodeCx { authorized: false, source: "sys_code".into(), chain: Vec::new() };
        self.emit(kind::LAMBDA_STARTED, "sys_code", json!({"kind": "sys_code"}));
        let req = RunReq { code: Some(code), ..Default::default() };
        let result = sandbox::run(req, Some(&id), &mut Proxy { ex: self, cx }, timeout).await;
        let out = match result {
            Ok(o) => o,
            Err(e) => {
                sandbox::reset(&id);
                Outcome { error: Some(err(e.code(), e.to_string())), ..Default::default() }
            }
        };
        self.finish_async_calls().await;
        let ms = out.duration.as_millis() as u64;
        if let Some(e) = &out.error {
            let _ = self.log("error", "sys_code", "result", &e.message);
            self.emit(
                kind::LAMBDA_FAILED,
                "sys_code",
                json!({"kind": "sys_code", "duration_ms": ms, "error": e.message}),
            );
            let mut text = format!("Error: {}", e.message);
            if !out.logs.is_empty() {
                text.push_str(&format!("\nOutput:\n{}", out.logs.join("\n")));
            }
            return ToolOutput::err(text);
        }
        self.emit(kind::LAMBDA_COMPLETED, "sys_code", json!({"kind": "sys_code", "duration_ms": ms}));
        let mut parts = Vec::new();
        if let Some(v) = &out.value {
            parts.push(format!("Result: {}", shown(v)));
        }
        if !out.logs.is_empty() {
            parts.push(format!("Output:\n{}", out.logs.join("\n")));
        }
        if parts.is_empty() {
            return ToolOutput::ok("Code executed successfully (no output).");
        }
        ToolOutput::ok(parts.join("\n"))
    }

    /// The `sys_lambda` tool from the loop (the approval for an authorized
    /// target is the caller's business). Runs with the file's flag.
    pub(crate) async fn sys_lambda_tool(&mut self, input: &Value) -> ToolOutput {
        let source = input["source"].as_str().unwrap_or("").to_string();
        let args = input.get("args").cloned().unwrap_or_else(|| json!({}));
        let timeout = self.code_timeout(input["timeout"].as_u64());
        let (path, func) = sandbox::prepare::split_target(&source);
        let _ = self.log("info", "sys_lambda", "execute", &format!("{path}:{func}"));
        let out = self.lambda(path, func, args, None, Vec::new(), timeout, "sys_lambda", None).await;
        let text = match &out {
            Ok(o) => {
                let mut t = match &o.value {
                    Some(v) => shown(v),
                    None if o.logs.is_empty() => "Function executed successfully (no return value).".into(),
                    None => String::new(),
                };
                if !o.logs.is_empty() {
                    t.push_str(&format!("\nOutput:\n{}", o.logs.join("\n")));
                }
                t
            }
            Err(e) => format!("Error: {}", e.message),
        };
        let _ = self.log(if out.is_ok() { "info" } else { "error" }, "sys_lambda", "result", &text);
        match out {
            Ok(_) => ToolOutput::ok(text),
            Err(_) => ToolOutput::err(text),
        }
    }

    /// Whether a file exists and carries the `authorized` flag.
    pub(crate) fn file_authorized(&self, path: &str) -> bool {
        self.store.file_stat(path).ok().flatten().is_some_and(|f| f.authorized)
    }

    /// Run `path:func` with `args`. `as_authorized`: `None` runs with the
    /// file's flag; `Some(false)` forces unauthorized. A function's error is
    /// `Err` with its code.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lambda<'a>(
        &'a mut self,
        path: &'a str,
        func: &'a str,
        args: Value,
        as_authorized: Option<bool>,
        chain: Vec<String>,
        timeout: Duration,
        kind_name: &'static str,
        warm: Option<String>,
    ) -> BoxFuture<'a, Result<Outcome, CallError>> {
        Box::pin(async move {
            let key = format!("{path}:{func}");
            if chain.contains(&key) {
                return Err(err("CIRCULAR_CALL", format!("Circular lambda call: {} -> {key}", chain.join(" -> "))));
            }
            let (entry, bytes) = match self.store.file_read(path) {
                Ok(f) => f,
                Err(_) => return Err(err("NOT_FOUND", format!("File \"{path}\" not found in workspace files"))),
            };
            let text = String::from_utf8(bytes).map_err(|_| err("INVALID_INPUT", format!("\"{path}\" is not text")))?;
            let prepared = sandbox::prepare::module(path, &text).map_err(|e| err("FN_ERROR", e))?;
            let authorized = as_authorized.unwrap_or(true) && entry.authorized;
            let source = format!("lambda:{path}:{func}");
            let mut chain = chain;
            chain.push(key);
            let cx = CodeCx { authorized, source: source.clone(), chain };
            let started = json!({"lambda_path": path, "function_name": func, "kind": kind_name});
            self.emit(kind::LAMBDA_STARTED, &source, started);
            let req = RunReq {
                module: Some(ModuleReq {
                    path: path.to_string(),
                    hash: prepared.hash,
                    source: prepared.source,
                    function: func.to_string(),
                }),
                args,
                ..Default::default()
            };
            let result = sandbox::run(req, warm.as_deref(), &mut Proxy { ex: self, cx }, timeout).await;
            let out = match result {
                Ok(o) => o,
                Err(e) => Outcome { error: Some(err(e.code(), e.to_string())), ..Default::default() },
            };
            self.finish_async_calls().await;
            for l in &out.logs {
                let level = if l.starts_with("[error]") {
                    "error"
                } else if l.starts_with("[warn]") {
                    "warn"
                } else {
                    "info"
                };
                let _ = self.log(level, "lambda", &format!("{path}:{func}"), l);
            }
            let mut payload = json!({"lambda_path": path, "function_name": func, "kind": kind_name,
                "duration_ms": out.duration.as_millis() as u64});
            match &out.error {
                Some(e) => {
                    payload["error"] = json!(e.message);
                    self.emit(kind::LAMBDA_FAILED, &source, payload);
                    Err(e.clone())
                }
                None => {
                    self.emit(kind::LAMBDA_COMPLETED, &source, payload);
                    Ok(out)
                }
            }
        })
    }

    /// One `adf.<method>(args)` call from code (runtime.md §7.3).
    pub(crate) fn code_call<'a>(
        &'a mut self,
        cx: CodeCx,
        method: &'a str,
        mut args: Value,
    ) -> BoxFuture<'a, Result<Value, CallError>> {
        Box::pin(async move {
            let result = self.code_call_inner(&cx, method, &mut args).await;
            if let Err(e) = &result
                && e.code != "TOOL_ERROR"
            {
                let _ = self.log("warn", "adf_call", "call_rejected", &format!("{method}: {} {}", e.code, e.message));
            }
            result
        })
    }

    async fn code_call_inner(&mut self, cx: &CodeCx, method: &str, args: &mut Value) -> Result<Value, CallError> {
        if !args.is_object() {
            if args.is_null() {
                *args = json!({});
            } else {
                return Err(err("INVALID_INPUT", format!("adf.{method} takes one object argument")));
            }
        }
        let obj = args.as_object_mut().ok_or_else(|| err("INVALID_INPUT", "arguments must be an object"))?;
        if !cx.authorized {
            obj.remove("_authorized");
            obj.remove("_protection_override");
        }
        let cfg = self.store.config().map_err(|e| err("INTERNAL_ERROR", e.to_string()))?;
        if cfg.restricted_methods().iter().any(|m| m == method) && !cx.authorized {
            return Err(err("REQUIRES_AUTHORIZED_CODE", format!("\"{method}\" requires authorized code")));
        }
        match method {
            "authorize_file" | "set_meta_protection" | "set_file_protection" if !cx.authorized => {
                return Err(err("REQUIRES_AUTHORIZED_CODE", format!("\"{method}\" requires authorized code")));
            }
            "authorize_file" => {
                let path = obj.get("path").and_then(Value::as_str).unwrap_or("").to_string();
                if self.store.file_stat(&path).ok().flatten().is_none() {
                    return Err(err("NOT_FOUND", format!("File \"{path}\" not found")));
                }
                self.store.file_set_authorized(&path, true).map_err(|e| err("TOOL_ERROR", e.to_string()))?;
                return Ok(json!({"path": path, "authorized": true}));
            }
            "set_file_protection" => {
                let path = obj.get("path").and_then(Value::as_str).unwrap_or("").to_string();
                let level = obj.get("protection").and_then(Value::as_str).unwrap_or("");
                let level =
                    crate::store::files::Protection::parse(level).map_err(|e| err("INVALID_INPUT", e.to_string()))?;
                let caller = Caller::Agent { authorized: true, override_approved: false };
                self.store.file_set_protection(caller, &path, level).map_err(|e| err("TOOL_ERROR", e.to_string()))?;
                return Ok(json!({"path": path, "protection": level}));
            }
            "set_meta_protection" => {
                let key = obj.get("key").and_then(Value::as_str).unwrap_or("").to_string();
                let level = obj.get("protection").and_then(Value::as_str).unwrap_or("");
                let level = crate::store::meta::MetaProtection::parse(level)
                    .map_err(|e| err("INVALID_INPUT", e.to_string()))?;
                let Some(entry) = self.store.meta_get(&key).map_err(|e| err("INTERNAL_ERROR", e.to_string()))? else {
                    return Err(err("NOT_FOUND", format!("Meta key \"{key}\" not found")));
                };
                let caller = Caller::Agent { authorized: true, override_approved: false };
                self.store
                    .meta_set(caller, &key, &entry.value, Some(level))
                    .map_err(|e| err("TOOL_ERROR", e.to_string()))?;
                return Ok(json!({"key": key, "protection": level.as_str()}));
            }
            _ => {}
        }
        if CODE_ONLY.contains(&method) {
            let off = cfg.code_execution.as_ref().and_then(|c| c.extra.get(method)) == Some(&Value::Bool(false));
            if off {
                return Err(err("DISABLED", format!("\"{method}\" is disabled in code_execution config")));
            }
            return self.code_only(cx, method, args.clone()).await;
        }
        if EXCLUDED_FROM_CODE.contains(&method) {
            return Err(err("EXCLUDED_TOOL", format!("\"{method}\" cannot be called from code")));
        }
        if tools::def(method).is_none() {
            return Err(err("NOT_FOUND", format!("Unknown method: {method}")));
        }
        let direct_meta = cx.authorized && matches!(method, "sys_set_meta" | "sys_delete_meta");
        if !direct_meta {
            let Some(decl) = cfg.tool(method) else {
                return Err(err("DISABLED", format!("Tool \"{method}\" is not declared in agent config")));
            };
            if decl.is_restricted() && !cx.authorized {
                return Err(err(
                    "REQUIRES_AUTHORIZED_CODE",
                    format!("Tool \"{method}\" is restricted to authorized code"),
                ));
            }
            if !(decl.is_enabled() || decl.is_restricted() && cx.authorized) {
                return Err(err("DISABLED", format!("Tool \"{method}\" is disabled")));
            }
        }
        let is_async =
            matches!(args.get("_async"), Some(Value::Bool(true))) || args.get("_async") == Some(&json!("true"));
        if is_async {
            let task_id = self
                .store
                .task_create(&NewTask {
                    tool: method,
                    args,
                    status: "running",
                    origin: "lambda",
                    requires_authorization: false,
                    executor_managed: false,
                    approval_meta: None,
                })
                .map_err(|e| err("INTERNAL_ERROR", e.to_string()))?;
            self.task_event("task_create", &task_id, &cx.source);
            self.async_calls.push((task_id.clone(), method.to_string(), args.clone(), cx.clone()));
            return Ok(json!({"task_id": task_id, "status": "running", "tool": method}));
        }
        let mut out = self.code_tool(cx, method, args, false).await;
        if let Some(d) = out.denial.clone().filter(|_| out.is_error && !cx.authorized) {
            out = self.protection_approval(cx, method, args, d).await?;
        }
        if out.is_error {
            return Err(err("TOOL_ERROR", out.content));
        }
        Ok(Value::String(out.content))
    }

    /// A protection denial met by unauthorized code: ask the owner (20
    /// minutes, then denied); approved, the call runs once with the
    /// override (runtime.md §7.3 step 13).
    async fn protection_approval(
        &mut self,
        cx: &CodeCx,
        method: &str,
        args: &Value,
        d: crate::store::Denial,
    ) -> Result<ToolOutput, CallError> {
        let blocked = |feedback: Option<String>| {
            let mut m = format!(
                "\"{method}\" was blocked ({}: \"{}\" is {}) and the authorizer rejected the override.",
                d.kind, d.target, d.level
            );
            if let Some(f) = feedback.filter(|f| !f.is_empty()) {
                m.push_str(&format!(" Feedback: {f}"));
            }
            err("PROTECTION_DENIED", m)
        };
        let call_id = format!("code_{}", crate::store::create::nanoid(8));
        let ask = self.request_approval(method, &call_id, args, "protection", Some(d.clone()), None, &cx.source);
        let (task_id, decision) = match tokio::time::timeout(PROTECTION_WAIT, ask).await {
            Ok(r) => r.map_err(|e| err("INTERNAL_ERROR", e.to_string()))?,
            Err(_) => {
                let origin = format!("hil:{method}:{call_id}");
                if let Ok(tasks) = self.store.task_list(Some("pending_approval"))
                    && let Some(t) = tasks.iter().find(|t| t.origin.as_deref() == Some(origin.as_str()))
                {
                    let _ = self.store.task_set(&t.id, "denied", None, Some("Timed out"));
                    self.emit(
                        kind::HIL_RESOLVED,
                        &cx.source,
                        json!({"request_id": t.id, "task_id": t.id, "approved": false, "timed_out": true}),
                    );
                }
                return Err(blocked(Some("no answer within 20 minutes".into())));
            }
        };
        match decision {
            crate::runtime::executor::Decision::Approve { .. } => {
                let out = self.code_tool(cx, method, args, true).await;
                let (status, res, error) = if out.is_error {
                    ("failed", None, Some(out.content.as_str()))
                } else {
                    ("completed", Some("approved"), None)
                };
                let _ = self.store.task_set(&task_id, status, res, error);
                Ok(out)
            }
            crate::runtime::executor::Decision::Deny { feedback } => Err(blocked(feedback)),
            crate::runtime::executor::Decision::Defer => {
                let _ = self.store.task_set(&task_id, "denied", None, Some("No one could approve"));
                Err(blocked(Some("no one could approve it now".into())))
            }
        }
    }

    /// A declared tool run for code: code tools nest, others run on the file.
    pub(crate) async fn code_tool(
        &mut self,
        cx: &CodeCx,
        method: &str,
        args: &Value,
        override_approved: bool,
    ) -> ToolOutput {
        if CODE_TOOLS.contains(&method)
            && let Some(bad) = invalid_input(method, args)
        {
            return bad;
        }
        match method {
            // Inline code is never authorized, whoever runs it.
            "sys_code" => Box::pin(self.sys_code(args)).await,
            "sys_lambda" => match self.code_only(cx, method, args.clone()).await {
                Ok(v) => ToolOutput::ok(shown(&v)),
                Err(e) => ToolOutput::err(e.message),
            },
            "sys_fetch" => self.sys_fetch(args, Some(cx)).await,
            "msg_send" => self.msg_send(args).await,
            "agent_discover" => self.agent_discover(args).await,
            "sys_create_adf" => Box::pin(self.sys_create_adf(args)).await,
            "ws_connect" | "ws_disconnect" | "ws_connections" | "ws_send" => Box::pin(self.ws_tool(method, args)).await,
            "stream_bind" | "stream_unbind" | "stream_bindings" => Box::pin(self.stream_tool(method, args)).await,
            "compute_exec" | "fs_transfer" => Box::pin(self.compute_tool(method, args)).await,
            "browser" | "desktop" => Box::pin(self.computer_tool(method, args)).await,
            "adf_shell" => {
                let id = crate::store::create::nanoid(10);
                Box::pin(self.adf_shell(args, &id, false, cx.authorized)).await
            }
            _ => {
                let full = args.get("_full") == Some(&Value::Bool(true));
                let mut events: Vec<(&'static str, Value)> = Vec::new();
                let out = {
                    let mut emit = |k: &'static str, v: Value| events.push((k, v));
                    let caller = Caller::Agent { authorized: cx.authorized, override_approved };
                    let mut ctx = Ctx { store: &mut self.store, caller, from_code: true, full, emit: &mut emit };
                    tools::execute_guarded(&mut ctx, method, args)
                };
                for (k, v) in events {
                    self.emit(k, &cx.source, v);
                }
                out
            }
        }
    }

    async fn code_only(&mut self, cx: &CodeCx, method: &str, args: Value) -> Result<Value, CallError> {
        match method {
            "sys_lambda" => {
                let source = args.get("source").and_then(Value::as_str).unwrap_or("").to_string();
                if source.is_empty() {
                    return Err(err("INVALID_INPUT", "sys_lambda needs a source (\"path/file.ts:fn\")"));
                }
                let (path, func) = sandbox::prepare::split_target(&source);
                if !cx.authorized && self.file_authorized(path) {
                    return Err(err(
                        "REQUIRES_AUTHORIZED_CALLER",
                        format!("\"{path}\" is authorized code; unauthorized code cannot call it"),
                    ));
                }
                let timeout = self.code_timeout(args.get("timeout").and_then(Value::as_u64));
                let call_args = args.get("args").cloned().unwrap_or_else(|| json!({}));
                let out = self
                    .lambda(path, func, call_args, Some(cx.authorized), cx.chain.clone(), timeout, "sys_lambda", None)
                    .await?;
                Ok(out.value.unwrap_or(Value::Null))
            }
            "loop_inject" => match self.loop_inject(&args, &cx.source) {
                Ok(text) => Ok(json!(text)),
                Err(e) => Err(err(e.code, e.message)),
            },
            "emit_event" => {
                let ty = args.get("event_type").and_then(Value::as_str).unwrap_or("");
                if !ty.starts_with("custom.") || ty.len() <= 7 {
                    return Err(err("INVALID_EVENT_TYPE", "event_type must start with \"custom.\""));
                }
                let payload = args.get("payload").cloned().unwrap_or(Value::Null);
                self.emit_owned(ty.to_string(), &cx.source, payload);
                Ok(json!({"emitted": ty}))
            }
            "model_invoke" => self.model_invoke(cx, &args).await,
            "task_resolve" => self.task_resolve(cx, &args).await,
            "identity_status" | "get_identity" | "set_identity" | "attestation_list" | "attestation_add"
            | "attestation_issue" => self.identity_method(method, &args).map_err(|(c, m)| err(c, m)),
            m if super::docs_code::DOC_METHODS.contains(&m) => self.doc_method(cx, method, &args).await,
            _ => Err(err("NOT_CONFIGURED", format!("\"{method}\" is not available in this runtime yet"))),
        }
    }

    /// `adf.model_invoke`: one model call without tools or streaming;
    /// the text of the reply (runtime.md §7.3).
    async fn model_invoke(&mut self, cx: &CodeCx, args: &Value) -> Result<Value, CallError> {
        use crate::providers::{Message, ModelRequest, Role};
        let cfg = self.store.config_value().map_err(|e| err("INTERNAL_ERROR", e.to_string()))?;
        let blocks = |c: &Value| -> Result<Vec<Value>, CallError> {
            match c {
                Value::String(t) => Ok(vec![json!({"type": "text", "text": t})]),
                Value::Array(a) => a
                    .iter()
                    .map(|b| match b["type"].as_str() {
                        Some("text") => Ok(json!({"type": "text", "text": b["text"].as_str().unwrap_or("")})),
                        other => {
                            Err(err("INVALID_INPUT", format!("content blocks of type {other:?} are not supported")))
                        }
                    })
                    .collect(),
                _ => Err(err("INVALID_INPUT", "content must be a string or an array of blocks")),
            }
        };
        let mut system: Vec<String> = args["system"].as_str().map(|s| vec![s.to_string()]).unwrap_or_default();
        let mut messages = Vec::new();
        if let Some(list) = args["messages"].as_array() {
            for m in list {
                match m["role"].as_str() {
                    Some("system") if messages.is_empty() => {
                        for b in blocks(&m["content"])? {
                            system.push(b["text"].as_str().unwrap_or("").to_string());
                        }
                    }
                    Some("system") => return Err(err("INVALID_INPUT", "system messages must come first")),
                    Some(r @ ("user" | "assistant")) => messages.push(Message {
                        role: if r == "user" { Role::User } else { Role::Assistant },
                        content: blocks(&m["content"])?,
                    }),
                    other => return Err(err("INVALID_INPUT", format!("unknown role {other:?}"))),
                }
            }
        } else if let Some(p) = args["prompt"].as_str() {
            messages.push(Message { role: Role::User, content: blocks(&json!(p))? });
        }
        if messages.is_empty() {
            return Err(err("INVALID_INPUT", "model_invoke needs messages or a prompt"));
        }
        let model =
            args["model"].as_str().or(cfg.pointer("/model/model_id").and_then(Value::as_str)).unwrap_or("").to_string();
        let req = ModelRequest {
            model: model.clone(),
            system: system.join("\n\n").into(),
            messages: Arc::new(messages),
            tools: Default::default(),
            max_tokens: args["max_tokens"].as_u64().unwrap_or(4096),
            temperature: args["temperature"].as_f64().or(Some(0.7)),
            effort: None,
            reasoning_tokens: None,
            trailing: None,
        };
        // The same budgets as a turn's call: the worst case first.
        let budgets = self.budgets(&cfg);
        if !budgets.is_empty() {
            let chars: usize = req.system.len()
                + req.messages.iter().flat_map(|m| m.content.iter()).map(|c| c.to_string().len()).sum::<usize>();
            let over = self
                .check_budgets(budgets, &model, chars.div_ceil(4) as u64, req.max_tokens)
                .map_err(|e| err("INTERNAL_ERROR", e.to_string()))?;
            if let Some(e) = over {
                return Err(err("BUDGET_EXCEEDED", e.notice(&self.store.path().display().to_string())));
            }
        }
        let started = std::time::Instant::now();
        let provider = self.provider();
        let result = match provider.stream(req).await {
            Ok(st) => crate::providers::collect(st, provider.id(), |_| {}).await,
            Err(e) => Err(e),
        };
        let ms = started.elapsed().as_millis() as u64;
        match result {
            Ok(r) => {
                let payload = json!({"provider": provider.id(), "model": model, "input_tokens": r.usage.input,
                    "output_tokens": r.usage.output, "duration_ms": ms, "stop_reason": r.stop_reason,
                    "call_source": "model_invoke"});
                self.emit(kind::LLM_COMPLETED, &cx.source, payload);
                self.settle_spend(&cfg, &model, &r.usage, "model_invoke")
                    .map_err(|e| err("INTERNAL_ERROR", e.to_string()))?;
                let _ = self.log(
                    "info",
                    "model_invoke",
                    "llm_call",
                    &format!("{model}: {} in, {} out, {ms} ms", r.usage.input, r.usage.output),
                );
                let text = r.text();
                if text.trim().is_empty() {
                    return Err(err("MODEL_REFUSED", "the model returned no text"));
                }
                Ok(Value::String(text))
            }
            Err(e) => {
                self.emit(kind::LLM_FAILED, &cx.source, json!({"error": e.to_string(), "call_source": "model_invoke"}));
                Err(err("MODEL_ERROR", format!("model_invoke failed: {e}")))
            }
        }
    }

    /// `adf.task_resolve` for tasks no turn waits on (runtime.md §7.3).
    async fn task_resolve(&mut self, cx: &CodeCx, args: &Value) -> Result<Value, CallError> {
        let id = args["task_id"].as_str().unwrap_or("");
        let action = args["action"].as_str().unwrap_or("");
        let task = self
            .store
            .task_get(id)
            .map_err(|e| err("INTERNAL_ERROR", e.to_string()))?
            .ok_or_else(|| err("NOT_FOUND", format!("Task \"{id}\" not found")))?;
        if !matches!(task.status.as_str(), "pending" | "pending_approval") {
            return Err(err("INVALID_STATE", format!("Task \"{id}\" is {}, not pending", task.status)));
        }
        if args["requires_authorization"] == json!(true) {
            self.store.task_require_authorization(id).map_err(|e| err("INTERNAL_ERROR", e.to_string()))?;
        }
        let needs_auth = task.requires_authorization || args["requires_authorization"] == json!(true);
        let io = |e: crate::store::StoreError| err("INTERNAL_ERROR", e.to_string());
        match action {
            "pending_approval" => {
                self.store.task_set(id, "pending_approval", None, None).map_err(io)?;
                Ok(json!({"task_id": id, "status": "pending_approval"}))
            }
            "approve" | "deny" if needs_auth && !cx.authorized => {
                Err(err("REQUIRES_AUTHORIZED_CODE", format!("Task \"{id}\" requires authorized code to {action}")))
            }
            _ if task.executor_managed => Err(err(
                "INVALID_STATE",
                format!("Task \"{id}\" is waiting for the owner's answer in the agent's loop"),
            )),
            "deny" => {
                let reason = args["reason"].as_str().unwrap_or("Denied");
                self.store.task_set(id, "denied", None, Some(reason)).map_err(io)?;
                self.task_event("task_complete", id, &cx.source);
                Ok(json!({"task_id": id, "status": "denied", "reason": reason}))
            }
            "approve" => {
                self.store.task_set(id, "running", None, None).map_err(io)?;
                let input = args.get("modified_args").filter(|v| v.is_object()).cloned().unwrap_or(task.args.clone());
                let runner = CodeCx { authorized: false, ..cx.clone() };
                let out = Box::pin(self.code_tool(&runner, &task.tool, &input, false)).await;
                let (status, res, error) = out.task_outcome();
                self.store.task_set(id, status, res, error).map_err(io)?;
                self.task_event("task_complete", id, &cx.source);
                let mut v = json!({"task_id": id, "status": status});
                v[if out.is_error { "error" } else { "result" }] = json!(out.content);
                Ok(v)
            }
            other => {
                Err(err("INVALID_INPUT", format!("action must be approve, deny or pending_approval, not {other:?}")))
            }
        }
    }

    /// Run the system-scope lambdas queued here (an executor without a
    /// dispatcher): no model call, in every state but `off`.
    pub async fn run_system(&mut self) {
        while !self.system_queue.is_empty() {
            let jobs = std::mem::take(&mut self.system_queue);
            for job in jobs {
                let timeout = self.code_timeout(None);
                self.run_job(job.trigger, &job.lambda, job.event, job.warm, timeout).await;
            }
        }
    }

    /// Run one system-scope lambda with the file's authorization. A
    /// failure is logged, emitted (`lambda.failed`) and kept as the
    /// agent's last lambda error.
    pub(crate) async fn run_job(&mut self, trigger: &str, lambda: &str, event: Value, warm: bool, timeout: Duration) {
        if let Some(st) = self.dispatcher.as_ref().and_then(|d| d.state.lock().ok().map(|s| s.clone())) {
            self.state = st;
        }
        let (path, func) = sandbox::prepare::split_target(lambda);
        let warm = warm.then(|| format!("{}:lambda", self.agent_id()));
        self.in_logs_handler = trigger == "on_logs";
        let out = self.lambda(path, func, event, None, Vec::new(), timeout, "system_scope", warm).await;
        self.in_logs_handler = false;
        if let Err(e) = out {
            let _ = self.log("error", "trigger", "lambda_failed", &format!("{trigger} {lambda}: {}", e.message));
            self.last_lambda_error = Some(format!("{lambda}: {}", e.message));
        }
    }

    /// Run a shell target: a `.sh` file of the agent (with its flag) or a
    /// command line from config (unauthorized). A non-zero exit is a
    /// failure like a lambda's.
    pub(crate) async fn run_shell_job(&mut self, trigger: &str, target: &str, event: Value) {
        if let Some(st) = self.dispatcher.as_ref().and_then(|d| d.state.lock().ok().map(|s| s.clone())) {
            self.state = st;
        }
        let is_file = target.ends_with(".sh") && !target.contains(' ');
        let (src, authorized) = if is_file {
            match self.store.file_read_text(target) {
                Ok(t) => (t, self.file_authorized(target)),
                Err(_) => {
                    let msg = format!("File \"{target}\" not found in workspace files");
                    let _ = self.log("error", "trigger", "lambda_failed", &format!("{trigger} {target}: {msg}"));
                    self.last_lambda_error = Some(format!("{target}: {msg}"));
                    return;
                }
            }
        } else {
            (target.to_string(), false)
        };
        let name =
            self.store.config_value().ok().and_then(|c| c["name"].as_str().map(str::to_string)).unwrap_or_default();
        let env = super::shell::event_env(&event, &name, &self.state);
        let label = if is_file { target.to_string() } else { "command".to_string() };
        let source = format!("system:shell:{label}");
        let base = json!({"lambda_path": label, "function_name": "sh", "kind": "system_scope", "trigger": trigger});
        self.emit(kind::LAMBDA_STARTED, &source, base.clone());
        let started = std::time::Instant::now();
        let r = self.run_shell(&src, &env, authorized).await;
        let ms = started.elapsed().as_millis() as u64;
        let _ = self.log("info", "adf_shell", "execute", &format!("{label}: exit {} in {ms} ms", r.exit_code));
        let mut payload = base;
        payload["duration_ms"] = json!(ms);
        if r.exit_code == 0 {
            self.emit(kind::LAMBDA_COMPLETED, &source, payload);
        } else {
            let why = r.stderr.lines().next().unwrap_or("").to_string();
            let msg =
                format!("exit {}{}", r.exit_code, if why.is_empty() { String::new() } else { format!(": {why}") });
            payload["error"] = json!(msg);
            self.emit(kind::LAMBDA_FAILED, &source, payload);
            let _ = self.log("error", "trigger", "lambda_failed", &format!("{trigger} {label}: {msg}"));
            self.last_lambda_error = Some(format!("{label}: {msg}"));
        }
    }

    /// `_async` calls from code run when the code has finished; each ends
    /// its task (`completed`/`failed`).
    pub(crate) async fn finish_async_calls(&mut self) {
        while !self.async_calls.is_empty() {
            let calls = std::mem::take(&mut self.async_calls);
            for (task_id, method, args, cx) in calls {
                let out = Box::pin(self.code_tool(&cx, &method, &args, false)).await;
                let (status, res, error) = out.task_outcome();
                let _ = self.store.task_set(&task_id, status, res, error);
                self.task_event("task_complete", &task_id, &cx.source);
            }
        }
    }
}
