//! `_async` from the model (conformance 57): `adf_shell`, `sys_code`,
//! `sys_lambda`, `sys_fetch` and `mcp_*` calls with `_async: true` become
//! task rows and run in the background on a sibling executor, so the turn
//! goes on; the model gets `{task_id, status, tool}` at once. A restricted
//! tool's task waits as `pending_approval` until the owner answers it
//! (the task's resolve route); each finished task fires `on_task_complete`
//! and shows in `task_get`/`adf tasks`. Other tools ignore `_async`.

use serde_json::{Value, json};

use super::code::CodeCx;
use super::executor::{Decision, Executor};
use crate::protocol::kind;
use crate::store::StoreError;
use crate::store::tasks::{NewTask, TERMINAL};
use crate::tools::ToolOutput;

/// Tools the model may run in the background.
pub fn async_capable(name: &str) -> bool {
    matches!(name, "adf_shell" | "sys_code" | "sys_lambda" | "sys_fetch") || name.starts_with("mcp_")
}

/// `_async: true` or `"true"`.
pub fn wants_async(input: &Value) -> bool {
    matches!(input.get("_async"), Some(Value::Bool(true))) || input.get("_async") == Some(&json!("true"))
}

const ORIGIN: &str = "async";

fn clean(input: &Value) -> Value {
    let mut v = input.clone();
    if let Some(o) = v.as_object_mut() {
        o.retain(|k, _| !k.starts_with('_'));
    }
    v
}

impl Executor {
    /// Start a background call from the loop: the task row, then the run
    /// (or the wait for approval).
    pub(crate) fn start_async(
        &mut self,
        name: &str,
        input: &Value,
        restricted: bool,
        source: &str,
    ) -> Result<ToolOutput, StoreError> {
        let args = clean(input);
        let status = if restricted { "pending_approval" } else { "running" };
        let task_id = self.store.task_create(&NewTask {
            tool: name,
            args: &args,
            status,
            origin: ORIGIN,
            requires_authorization: restricted,
            executor_managed: false,
            approval_meta: restricted.then_some(&json!({"reason": "restricted"})),
        })?;
        self.task_event("task_create", &task_id, source);
        if restricted {
            self.emit(
                kind::HIL_REQUESTED,
                source,
                json!({"request_id": task_id, "task_id": task_id, "tool": name, "reason": "restricted", "input": args}),
            );
        } else {
            self.launch(task_id.clone(), name.to_string(), args);
        }
        Ok(ToolOutput::json(&json!({"task_id": task_id, "status": status, "tool": name})))
    }

    /// Run a task's call on a sibling executor (in a fleet), or here when
    /// this executor stands alone.
    fn launch(&mut self, task_id: String, tool: String, args: Value) {
        match self.dispatcher.clone() {
            Some(d) => d.spawn_task(task_id, tool, args),
            None => {
                let cx = CodeCx { authorized: false, source: format!("task:{task_id}"), chain: Vec::new() };
                self.async_calls.push((task_id, tool, args, cx));
            }
        }
    }

    /// The body of a background task.
    pub(crate) async fn run_task(&mut self, task_id: &str, tool: &str, args: &Value) {
        if let Ok(Some(t)) = self.store.task_get(task_id)
            && TERMINAL.contains(&t.status.as_str())
        {
            return;
        }
        let cx = CodeCx { authorized: false, source: format!("task:{task_id}"), chain: Vec::new() };
        let out = Box::pin(self.code_tool(&cx, tool, args, false)).await;
        let (status, res, error) = out.task_outcome();
        // A task cancelled meanwhile (`kill`) keeps its status.
        if let Ok(Some(t)) = self.store.task_get(task_id)
            && TERMINAL.contains(&t.status.as_str())
        {
            return;
        }
        let _ = self.store.task_set(task_id, status, res, error);
        self.task_event("task_complete", task_id, &cx.source);
    }

    /// The owner's answer to a background task waiting for approval;
    /// false when `task_id` is not one (a paused turn's approval).
    pub(crate) fn answer_async(&mut self, task_id: &str, decision: &Decision) -> bool {
        let Ok(Some(t)) = self.store.task_get(task_id) else { return false };
        if t.origin.as_deref() != Some(ORIGIN) || t.status != "pending_approval" {
            return false;
        }
        match decision {
            Decision::Approve { .. } => {
                let _ = self.store.task_set(task_id, "running", None, None);
                self.emit(
                    kind::HIL_RESOLVED,
                    "system:owner",
                    json!({"request_id": task_id, "task_id": task_id, "approved": true}),
                );
                self.launch(task_id.to_string(), t.tool.clone(), t.args.clone());
            }
            Decision::Deny { feedback } => {
                let _ = self.store.task_set(task_id, "denied", None, Some(feedback.as_deref().unwrap_or("Rejected")));
                self.emit(
                    kind::HIL_RESOLVED,
                    "system:owner",
                    json!({"request_id": task_id, "task_id": task_id, "approved": false}),
                );
                self.task_event("task_complete", task_id, "system:owner");
            }
            Decision::Defer => return false,
        }
        true
    }
}
