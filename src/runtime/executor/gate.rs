//! Gating and running the tool calls of a step (runtime.md §2.1, §8):
//! whether a tool is enabled, restricted tools and protected writes held
//! for the owner's approval, `ask`, async starts, and what a result may
//! carry back into the loop (read guards and the size limit). The turn
//! loop hands each call to `gate_and_run` and answers with what it returns.

use serde_json::{Value, json};

use super::{ApprovalRequest, Decision, Executor, TurnEnd, adapters};
use crate::protocol::kind;
use crate::store::config::AgentConfig;
use crate::store::tasks::NewTask;
use crate::store::{Caller, Denial, StoreError};
use crate::tools::{self, Ctx, ToolOutput};

impl Executor {
    /// Gating of one call from the loop (runtime.md §2.1, §8).
    pub(super) async fn gate_and_run(
        &mut self,
        cfg: &Value,
        typed: &AgentConfig,
        id: &str,
        name: &str,
        input: &Value,
        source: &str,
    ) -> Result<Gate, StoreError> {
        let receive = cfg["messaging"]["receive"].as_bool().unwrap_or(true);
        let decl = typed.tool(name).filter(|d| d.is_enabled() && (receive || !MSG_GATED.contains(&name)));
        let Some(decl) = decl else {
            return Ok(Gate::Done(ToolOutput::err(format!(
                "Tool \"{name}\" is not enabled. Check your agent configuration to enable it."
            ))));
        };
        let mut input = input.clone();
        if let Some(obj) = input.as_object_mut() {
            for k in ["_full", "_authorized", "_protection_override"] {
                obj.remove(k);
            }
        }
        let justification = input.get("_reason").and_then(Value::as_str).map(str::to_string);
        // Installing, restarting or removing the agent's own tool servers is
        // always the owner's call, whatever the declaration says.
        let restricted = decl.is_restricted() || crate::tools::always_asks(name);
        if crate::runtime::background::async_capable(name) && crate::runtime::background::wants_async(&input) {
            return Ok(Gate::Done(self.start_async(name, &input, restricted, source)?));
        }
        if name == "ask" {
            return self.ask(&input, id, source).await;
        }
        if restricted {
            let (task_id, decision) =
                self.request_approval(name, id, &input, "restricted", None, justification, source).await?;
            match decision {
                Decision::Defer => return Ok(Gate::Paused(task_id)),
                Decision::Deny { feedback } => {
                    let mut msg = format!("Tool call \"{name}\" was rejected by authorizer.");
                    if let Some(f) = feedback.filter(|f| !f.is_empty()) {
                        msg.push_str(&format!(" Feedback: {f}"));
                    }
                    return Ok(Gate::Done(ToolOutput::err(msg)));
                }
                Decision::Approve { always } => {
                    if always && !decl.is_locked() {
                        self.approve_always(cfg, name)?;
                    }
                    let out = if name == "sys_lambda" {
                        self.sys_lambda_tool(&input).await
                    } else {
                        self.run_any(name, &input).await
                    };
                    let (status, res, err) = out.task_outcome();
                    self.store.task_set(&task_id, status, res, err)?;
                    return self.after_protection(name, &input, out, id, source).await;
                }
            }
        }
        // `sys_lambda` on an authorized file is approved like a restricted
        // tool (runtime.md §8.2 point 5); approved, it runs authorized.
        if name == "sys_lambda" {
            let target = input["source"].as_str().unwrap_or("");
            let (path, _) = crate::sandbox::prepare::split_target(target);
            if self.file_authorized(path) {
                let (task_id, decision) =
                    self.request_approval(name, id, &input, "restricted", None, justification, source).await?;
                return Ok(Gate::Done(match decision {
                    Decision::Defer => return Ok(Gate::Paused(task_id)),
                    Decision::Deny { feedback } => {
                        let mut msg = format!("Tool call \"{name}\" was rejected by authorizer.");
                        if let Some(f) = feedback.filter(|f| !f.is_empty()) {
                            msg.push_str(&format!(" Feedback: {f}"));
                        }
                        ToolOutput::err(msg)
                    }
                    Decision::Approve { .. } => {
                        let out = self.sys_lambda_tool(&input).await;
                        let (status, res, err) = out.task_outcome();
                        self.store.task_set(&task_id, status, res, err)?;
                        out
                    }
                }));
            }
        }
        let out = self.run_any(name, &input).await;
        self.after_protection(name, &input, out, id, source).await
    }

    /// A tool from the loop: code tools run here, the rest on the file.
    pub(super) async fn run_any(&mut self, name: &str, input: &Value) -> ToolOutput {
        if crate::runtime::code::CODE_TOOLS.contains(&name)
            && let Some(bad) = crate::runtime::code::invalid_input(name, input)
        {
            return bad;
        }
        match name {
            "sys_code" => self.sys_code(input).await,
            "sys_lambda" => {
                // From the loop only unauthorized files get here.
                let (path, _) = crate::sandbox::prepare::split_target(input["source"].as_str().unwrap_or(""));
                if self.file_authorized(path) {
                    return ToolOutput::err(format!("\"{path}\" is authorized code and needs approval"));
                }
                self.sys_lambda_tool(input).await
            }
            "sys_fetch" => self.sys_fetch(input, None).await,
            "msg_send" => self.msg_send(input).await,
            "chat_info" => self.chat_info(input).await,
            "adapter_setup" => self.adapter_setup(input).await,
            "agent_discover" => self.agent_discover(input).await,
            "adf_shell" => self.adf_shell(input, &crate::store::create::nanoid(10), true, false).await,
            "sys_create_adf" => self.sys_create_adf(input).await,
            "fs_read" => match self.fleet_skill_read(input) {
                Some(out) => out,
                None => self.run_tool(name, input, Caller::AGENT),
            },
            "mcp_install" => self.mcp_install_tool(input).await,
            "mcp_restart" => self.mcp_restart_tool(input).await,
            "mcp_uninstall" => self.mcp_uninstall_tool(input),
            "loop_send" | "loop_list" | "loop_manage" => self.loop_tool(name, input),
            "ws_connect" | "ws_disconnect" | "ws_connections" | "ws_send" => self.ws_tool(name, input).await,
            "stream_bind" | "stream_unbind" | "stream_bindings" => self.stream_tool(name, input).await,
            "compute_exec" | "fs_transfer" => self.compute_tool(name, input).await,
            "browser" | "desktop" => self.computer_tool(name, input).await,
            n if n.starts_with("mcp_") => self.mcp_call(n, input).await,
            _ => self.run_tool(name, input, Caller::AGENT),
        }
    }

    /// Open an approval: a `pending_approval` task (executor-managed,
    /// origin `hil:<tool>:<call id>`), `hil.requested`, the owner's answer,
    /// `hil.resolved`, and a denial recorded on the task.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn request_approval(
        &mut self,
        name: &str,
        id: &str,
        input: &Value,
        reason: &'static str,
        denial: Option<Denial>,
        justification: Option<String>,
        source: &str,
    ) -> Result<(String, Decision), StoreError> {
        let origin = format!("hil:{name}:{id}");
        if let Some((o, task_id, decision)) = self.preset.take() {
            if o == origin {
                self.record_decision(&task_id, &decision, source)?;
                return Ok((task_id, decision));
            }
            self.preset = Some((o, task_id, decision));
        }
        // A live grant the owner made ahead of time answers for them (a
        // restricted tool or a gated command; never a protection override).
        if matches!(reason, "restricted" | "shell_gate")
            && let Some(g) = self.store.grant_use(name, input)?
        {
            self.emit(
                kind::HIL_RESOLVED,
                source,
                json!({"request_id": format!("grant:{}", g.id), "tool": name, "approved": true, "grant": g.id}),
            );
            return Ok((format!("grant:{}", g.id), Decision::Approve { always: false }));
        }
        let mut meta = json!({"reason": reason});
        if let Some(d) = &denial {
            meta["protection"] = json!(d);
        }
        let shown = adapters::redacted(name, input);
        let task_id = self.store.task_create(&NewTask {
            tool: name,
            args: &shown,
            status: "pending_approval",
            origin: &format!("hil:{name}:{id}"),
            requires_authorization: true,
            executor_managed: true,
            approval_meta: Some(&meta),
        })?;
        self.task_event("task_create", &task_id, source);
        self.emit(
            kind::HIL_REQUESTED,
            source,
            json!({"request_id": task_id, "task_id": task_id, "tool": name, "reason": reason, "input": strip_reserved(&shown)}),
        );
        let req = ApprovalRequest {
            task_id: task_id.clone(),
            tool: name.into(),
            input: input.clone(),
            reason,
            denial,
            justification,
        };
        let decision = self.owner.approve(&req).await;
        self.record_decision(&task_id, &decision, source)?;
        Ok((task_id, decision))
    }

    pub(super) fn record_decision(
        &mut self,
        task_id: &str,
        decision: &Decision,
        source: &str,
    ) -> Result<(), StoreError> {
        match decision {
            Decision::Defer => {}
            Decision::Deny { feedback } => {
                self.store.task_set(task_id, "denied", None, Some(feedback.as_deref().unwrap_or("Rejected")))?;
                self.emit(
                    kind::HIL_RESOLVED,
                    source,
                    json!({"request_id": task_id, "task_id": task_id, "approved": false, "feedback": feedback}),
                );
            }
            Decision::Approve { .. } => {
                self.emit(
                    kind::HIL_RESOLVED,
                    source,
                    json!({"request_id": task_id, "task_id": task_id, "approved": true}),
                );
            }
        }
        Ok(())
    }

    /// Answer the approval a paused turn waits on (an `adf chat` that exited
    /// with status 3, a restart): the turn goes on from the call it stopped
    /// at, as if the owner had answered at the time.
    pub async fn resume_paused(&mut self, task_id: &str, decision: Decision) -> Result<TurnEnd, StoreError> {
        let task = self.store.task_get(task_id)?.ok_or_else(|| StoreError::Missing(format!("no task {task_id}")))?;
        let origin = task.origin.clone().unwrap_or_default();
        let waiting = self.session()?.pending.iter().any(|(id, name)| origin == format!("hil:{name}:{id}"));
        if task.status != "pending_approval" || !waiting {
            return Err(StoreError::Invalid(format!("task {task_id} is not waiting on a paused turn of this agent")));
        }
        let pending: Vec<String> = self.session()?.pending.iter().map(|(id, _)| id.clone()).collect();
        let rows = self.store.loop_rows(None)?;
        let calls: Vec<Value> = rows
            .iter()
            .rev()
            .find(|r| r.role == "assistant")
            .and_then(|r| r.content.as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|b| b["type"] == "tool_use" && b["id"].as_str().is_some_and(|id| pending.iter().any(|p| p == id)))
            .collect();
        self.preset = Some((origin, task_id.to_string(), decision));
        let end = self.turn_with(None, "approval", &calls).await;
        self.preset = None;
        end
    }

    /// A protection denial opens an override approval; approved, the call
    /// runs once more with the override (runtime.md §8.3).
    pub(super) async fn after_protection(
        &mut self,
        name: &str,
        input: &Value,
        out: ToolOutput,
        id: &str,
        source: &str,
    ) -> Result<Gate, StoreError> {
        let Some(denial) = out.denial.clone() else { return Ok(Gate::Done(out)) };
        let (task_id, decision) =
            self.request_approval(name, id, input, "protection", Some(denial.clone()), None, source).await?;
        match decision {
            Decision::Defer => Ok(Gate::Paused(task_id)),
            Decision::Deny { feedback } => {
                let kind = denial.kind;
                let mut msg = format!(
                    "Tool call \"{name}\" was blocked ({kind}: \"{}\" is {}) and the authorizer rejected the override.",
                    denial.target, denial.level
                );
                if let Some(f) = feedback.filter(|f| !f.is_empty()) {
                    msg.push_str(&format!(" Feedback: {f}"));
                }
                msg.push_str(" Do not retry.");
                Ok(Gate::Done(ToolOutput::err(msg)))
            }
            Decision::Approve { .. } => {
                let out = self.run_tool(name, input, Caller::Agent { authorized: false, override_approved: true });
                let (status, res, err) = if out.is_error {
                    ("failed", None, Some(out.content.clone()))
                } else {
                    ("completed", Some("approved".to_string()), None)
                };
                self.store.task_set(&task_id, status, res.as_deref(), err.as_deref())?;
                Ok(Gate::Done(out))
            }
        }
    }

    pub(super) async fn ask(&mut self, input: &Value, id: &str, source: &str) -> Result<Gate, StoreError> {
        let question = input["question"].as_str().unwrap_or("").to_string();
        if question.is_empty() {
            return Ok(Gate::Done(ToolOutput::err("Invalid input for tool \"ask\": \"question\" is required")));
        }
        let task_id = self.store.task_create(&NewTask {
            tool: "ask",
            args: &json!({"question": question}),
            status: "pending",
            origin: &format!("ask:{id}"),
            requires_authorization: false,
            executor_managed: true,
            approval_meta: None,
        })?;
        self.emit(kind::ASK_REQUESTED, source, json!({"request_id": task_id, "question": question}));
        match self.owner.answer(&task_id, &question).await {
            None => Ok(Gate::Paused(task_id)),
            Some(answer) => {
                self.store.task_set(&task_id, "completed", Some(&answer), None)?;
                let preview: String = answer.chars().take(200).collect();
                self.emit(
                    kind::ASK_RESOLVED,
                    source,
                    json!({"request_id": task_id, "has_response": !answer.is_empty(),
                    "response_length": answer.chars().count(), "preview": preview}),
                );
                Ok(Gate::Done(ToolOutput::ok(format!("Human answered: {answer}"))))
            }
        }
    }

    /// "Always approve": the declaration becomes `{enabled, restricted:false}`.
    pub(super) fn approve_always(&mut self, cfg: &Value, name: &str) -> Result<(), StoreError> {
        let mut next = cfg.clone();
        if let Some(Value::Array(tools)) = next.get_mut("tools") {
            for t in tools.iter_mut().filter(|t| t["name"] == name) {
                t["enabled"] = json!(true);
                t["restricted"] = json!(false);
            }
        }
        self.store.config_replace(next)
    }

    pub(crate) fn run_tool(&mut self, name: &str, input: &Value, caller: Caller) -> ToolOutput {
        let source = self.current.as_ref().map(|c| format!("agent:{}", c.0)).unwrap_or_else(|| "system:tools".into());
        let mut events: Vec<(&'static str, Value)> = Vec::new();
        let out = {
            let mut emit = |k: &'static str, v: Value| events.push((k, v));
            let mut ctx = Ctx { store: &mut self.store, caller, from_code: false, full: false, emit: &mut emit };
            tools::execute_guarded(&mut ctx, name, input)
        };
        for (k, v) in events {
            self.emit(k, &source, v);
        }
        out
    }
}

/// Tools withheld from the loop while `messaging.receive` is false.
pub(super) const MSG_GATED: [&str; 5] = ["msg_send", "agent_discover", "msg_list", "msg_read", "msg_update"];

pub(super) enum Gate {
    Done(ToolOutput),
    Paused(String),
}

pub(super) fn strip_reserved(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        for k in tools::RESERVED {
            o.remove(*k);
        }
    }
    v
}

/// `fs_read` for the model (runtime.md §9.1): text over
/// `max_file_read_tokens` is cut at whole lines with a footer saying how to
/// read on; a whole file over 300 lines shows its first 50 and how to read
/// the rest; binary content is named. The JSON stays; only `content` moves.
pub(super) fn read_guard(cfg: &AgentConfig, name: &str, input: &Value, mut out: ToolOutput) -> ToolOutput {
    if name != "fs_read" || out.is_error {
        return out;
    }
    let Ok(mut v) = serde_json::from_str::<Value>(&out.content) else { return out };
    let max = cfg.limits.as_ref().and_then(|l| l.max_file_read_tokens).unwrap_or(30_000) as usize;
    let size = |n: u64| match n {
        n if n >= 1 << 20 => format!("{:.1} MB", n as f64 / (1 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KB", n as f64 / 1024.0),
        n => format!("{n} bytes"),
    };
    let bytes = v["size"].as_u64().unwrap_or(0);
    let path = v["path"].as_str().unwrap_or("").to_string();
    let ranged = input.get("start_line").is_some() || input.get("end_line").is_some();
    let new = match &v["content"] {
        Value::String(text) => {
            let lines = text.lines().count();
            let tokens = text.chars().count() / 4;
            if tokens > max {
                let budget = max * 4;
                let mut kept = String::new();
                let mut n = 0;
                for l in text.split_inclusive('\n') {
                    if kept.len() + l.len() > budget {
                        break;
                    }
                    kept.push_str(l);
                    n += 1;
                }
                let from = input.get("start_line").and_then(Value::as_u64).unwrap_or(1) as usize;
                Some(format!(
                    "{kept}\n--- TRUNCATED at ~{max} tokens (file has {lines} lines, {}) ---\n\
                     Read on with fs_read start_line: {} (and end_line), or search with grep in adf_shell.",
                    size(bytes),
                    from + n
                ))
            } else if lines > 300 && !ranged {
                let first: String = text.split_inclusive('\n').take(50).collect();
                Some(format!(
                    "[Large file: {lines} lines, {}, ~{tokens} tokens]\nUse start_line/end_line to read the part you \
                     need. The first 50 lines:\n{first}",
                    size(bytes)
                ))
            } else {
                None
            }
        }
        Value::Null if !path.is_empty() => {
            let mime = v["mime_type"].as_str().unwrap_or("application/octet-stream").to_string();
            let kind = ["image", "audio", "video"].into_iter().find(|k| mime.starts_with(&format!("{k}/")));
            Some(match kind {
                Some(k) => format!("[{k}: {path} ({mime})]"),
                None => format!("[binary content: {path} ({mime}, {})]", size(bytes)),
            })
        }
        _ => None,
    };
    if let Some(c) = new {
        v["content"] = Value::String(c);
        out.content = serde_json::to_string_pretty(&v).unwrap_or(out.content);
    }
    out
}

/// Tool-result limits for the model's context (runtime.md §9.1): a result
/// past `max_tool_result_tokens` is replaced by a head and tail preview
/// (`max_tool_result_preview_chars`) and a note to narrow the request.
pub(super) fn limit(cfg: &AgentConfig, name: &str, mut out: ToolOutput) -> ToolOutput {
    let lim = cfg.limits.as_ref();
    let max_tokens = lim.and_then(|l| l.max_tool_result_tokens).unwrap_or(16_000) as usize;
    let preview =
        lim.and_then(|l| l.extra.get("max_tool_result_preview_chars")).and_then(Value::as_u64).unwrap_or(5_000)
            as usize;
    let chars = out.content.chars().count();
    if chars <= max_tokens * 3 {
        return out;
    }
    let approx = chars / 4;
    if approx <= max_tokens {
        return out;
    }
    let head: String = out.content.chars().take(preview / 2).collect();
    let tail: String = out.content.chars().skip(chars - preview / 2).collect();
    out.content = format!(
        "[TRUNCATED] Tool \"{name}\" returned ~{approx} tokens (limit: {max_tokens}). The full result was discarded; \
         narrow the request. Preview:\n{head}\n[… {} characters omitted …]\n{tail}",
        chars - 2 * (preview / 2)
    );
    out
}
