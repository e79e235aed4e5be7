//! The built-in tool catalog: names, descriptions and JSON schemas (part of
//! the file contract), input validation, and dispatch to one file per
//! family. Tools run against the agent's `Store` as a given `Caller`;
//! gating (enabled, restricted, approvals) is the executor's job.

mod catalog;
mod db;
mod fs;
mod msg;
pub mod schema;
mod sys;
pub(crate) mod timers;

use serde_json::{Map, Value, json};

pub use catalog::{ToolDef, catalog, def};
pub use fs::DIFF_SOURCE_MAX;
pub(crate) use sys::redact;
pub use timers::next_cron;

use crate::store::{Caller, Denial, Store, StoreError};

/// What a tool call produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolOutput {
    pub content: String,
    pub is_error: bool,
    /// The turn ends after this call (`respond`, `sys_set_state`).
    pub end_turn: bool,
    /// A state the agent asked for (`sys_set_state`).
    pub target_state: Option<String>,
    /// A protection denial a human may override once.
    pub denial: Option<Denial>,
    /// A signal for the executor (`loop_compact`, `loop_clear`).
    pub signal: Option<Signal>,
}

/// Work only the executor can do, requested by a tool.
#[derive(Debug, Clone, PartialEq)]
pub enum Signal {
    Compact { instructions: Option<String> },
    Clear { start: Option<i64>, end: Option<i64> },
}

impl ToolOutput {
    pub fn ok(content: impl Into<String>) -> Self {
        ToolOutput { content: content.into(), ..Default::default() }
    }

    pub fn err(content: impl Into<String>) -> Self {
        ToolOutput { content: content.into(), is_error: true, ..Default::default() }
    }

    /// The task row's outcome of this result: (status, result, error).
    pub fn task_outcome(&self) -> (&'static str, Option<&str>, Option<&str>) {
        if self.is_error { ("failed", None, Some(&self.content)) } else { ("completed", Some(&self.content), None) }
    }

    pub fn json(v: &Value) -> Self {
        Self::ok(serde_json::to_string_pretty(v).unwrap_or_default())
    }

    /// A JSON answer that is an error (`{success:false, …}`).
    pub fn json_err(v: &Value) -> Self {
        Self::err(serde_json::to_string_pretty(v).unwrap_or_default())
    }
}

impl From<StoreError> for ToolOutput {
    fn from(e: StoreError) -> Self {
        let denial = e.denial().cloned();
        ToolOutput { content: e.to_string(), is_error: true, denial, ..Default::default() }
    }
}

/// Where a call runs.
pub struct Ctx<'a> {
    pub store: &'a mut Store,
    pub caller: Caller,
    /// Called from code (`adf.*`), not from the model: results are not
    /// capped for the model and binary content comes back as base64.
    pub from_code: bool,
    /// Lift output caps (`_full`, code only).
    pub full: bool,
    /// Observable facts (`file.written`, `db.read`…).
    pub emit: &'a mut dyn FnMut(&'static str, Value),
}

/// Tools whose work the executor does after the model's step, or that
/// talk to the owner: refused from `adf.*` code and the shell.
pub const EXCLUDED_FROM_CODE: &[&str] = &["loop_compact", "loop_clear", "say", "ask"];

impl Ctx<'_> {
    /// Mark a result produced under a human-approved protection override
    /// ("⚠ protection override"); `protected` says whether the target was.
    pub fn marked(&self, protected: bool, text: String) -> String {
        match self.caller {
            Caller::Agent { override_approved: true, .. } if protected => format!("{text}\n⚠ protection override"),
            _ => text,
        }
    }
}

/// Keys the runtime reserves: never part of a tool's own input.
pub const RESERVED: &[&str] = &["_reason", "_async", "_full", "_authorized", "_protection_override"];

/// Run one built-in tool. Unknown names, bad input and failures come back
/// as error results with the registry's messages.
pub fn execute(ctx: &mut Ctx<'_>, name: &str, input: &Value) -> ToolOutput {
    let Some(def) = def(name) else {
        return ToolOutput::err(format!("Unknown tool: {name}"));
    };
    if ctx.from_code && EXCLUDED_FROM_CODE.contains(&name) {
        return ToolOutput::err(format!(
            "EXCLUDED_TOOL: {name} cannot be called from code; only the model's loop can use it."
        ));
    }
    let Some(obj) = input.as_object() else {
        let shown: String = input.to_string().chars().take(200).collect();
        return ToolOutput::err(format!(
            "Invalid input for tool \"{name}\": arguments must be a JSON object, got {shown}"
        ));
    };
    let clean: Map<String, Value> =
        obj.iter().filter(|(k, _)| !RESERVED.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
    let clean = Value::Object(clean);
    if let Err(msg) = schema::validate(&(def.schema)(), &clean) {
        return ToolOutput::err(format!("Invalid input for tool \"{name}\": {msg}"));
    }
    match name {
        "fs_read" => fs::read(ctx, &clean),
        "fs_write" => fs::write(ctx, &clean),
        "fs_list" => fs::list(ctx, &clean),
        "fs_delete" => fs::delete(ctx, &clean),
        "db_query" => db::query(ctx, &clean),
        "db_execute" => db::execute(ctx, &clean),
        "sys_get_meta" => sys::get_meta(ctx, &clean),
        "sys_set_meta" => sys::set_meta(ctx, &clean),
        "sys_delete_meta" => sys::delete_meta(ctx, &clean),
        "sys_get_config" => sys::get_config(ctx, &clean),
        "sys_update_config" => sys::update_config(ctx, &clean),
        "sys_set_state" => sys::set_state(&clean),
        "sys_set_timer" => timers::set(ctx, &clean),
        "sys_list_timers" => timers::list(ctx, &clean),
        "sys_delete_timer" => timers::delete(ctx, &clean),
        "msg_list" => msg::list(ctx),
        "msg_read" => msg::read(ctx, &clean),
        "msg_update" => msg::update(ctx, &clean),
        "msg_delete" => msg::delete(ctx, &clean),
        "msg_send" | "agent_discover" | "ws_connect" | "ws_disconnect" | "ws_connections" | "ws_send"
        | "stream_bind" | "stream_unbind" | "stream_bindings" => {
            ToolOutput::err(format!("{name} needs the runtime's messaging; it cannot run here."))
        }
        "say" => ToolOutput::ok("ok"),
        "respond" => ToolOutput { content: "ok".into(), end_turn: true, ..Default::default() },
        "loop_compact" => ToolOutput {
            content: "Compaction requested; it runs when this step ends.".into(),
            signal: Some(Signal::Compact { instructions: clean["instructions"].as_str().map(str::to_string) }),
            ..Default::default()
        },
        "loop_clear" => ToolOutput {
            content: "Loop clear requested; it runs when this step ends.".into(),
            signal: Some(Signal::Clear { start: clean["start"].as_i64(), end: clean["end"].as_i64() }),
            ..Default::default()
        },
        "chat_info" => chat_info(&clean),
        "memory_cite" => match crate::store::cite::parse(clean["citation"].as_str().unwrap_or("")) {
            Ok(seq) => match ctx.store.cite(seq) {
                Ok(c) => ToolOutput::json(&serde_json::to_value(&c).unwrap_or_default()),
                Err(e) => e.into(),
            },
            Err(e) => ToolOutput::err(e),
        },
        "memory_lint" => {
            let stale_days = clean["stale_days"].as_u64().map(|d| d.min(36_500) as u32);
            let opts = crate::store::lint::LintOptions {
                stale_days: stale_days.unwrap_or(crate::store::lint::DEFAULT_STALE_DAYS),
            };
            match ctx.store.memory_lint(opts) {
                Ok(r) => ToolOutput::json(&serde_json::to_value(&r).unwrap_or_default()),
                Err(e) => e.into(),
            }
        }
        "fs_transfer" if clean["from"] == clean["to"] => ToolOutput::err(format!(
            "'from' and 'to' must be different (both are '{}').",
            clean["from"].as_str().unwrap_or_default()
        )),
        // `ask` is answered by the executor; reaching here means no one can.
        "ask" => ToolOutput::err("ask is answered by the runtime and cannot run here."),
        _ => ToolOutput::err(format!("Unknown tool: {name}")),
    }
}

/// Tools that ask the owner before every call even when their declaration
/// is not restricted (the file format's defaults leave them unrestricted):
/// the agent adding, restarting or removing its own MCP servers.
pub fn always_asks(name: &str) -> bool {
    matches!(name, "mcp_install" | "mcp_restart" | "mcp_uninstall" | "adapter_setup")
}

/// `chat_info` (tools.md §4) outside a fleet: no channel adapter runs
/// here, which is an answer, not an error (in a fleet the executor asks
/// the agent's adapter).
fn chat_info(input: &Value) -> ToolOutput {
    let adapter = input["adapter"].as_str().unwrap_or_default();
    ToolOutput::json(&json!({
        "supported": false,
        "reason": format!("no \"{adapter}\" channel adapter is connected to this agent"),
    }))
}

/// A panic inside a tool must not take the agent down.
pub fn execute_guarded(ctx: &mut Ctx<'_>, name: &str, input: &Value) -> ToolOutput {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| execute(ctx, name, input))) {
        Ok(out) => out,
        Err(_) => ToolOutput::err(format!("Tool \"{name}\" execution failed: internal error")),
    }
}

/// The schema advertised to the model: the tool's own plus `_reason` (and
/// `_async` for the async-capable tools). Built once per process and
/// shared: an agent's first turn and every config change rebuild their
/// tool list, and building some eighty schemas each time was a tenth of
/// a first turn.
pub fn advertised_schema(name: &str) -> Option<std::sync::Arc<Value>> {
    use std::collections::HashMap;
    use std::sync::{Arc, LazyLock, Mutex};
    static BUILT: LazyLock<Mutex<HashMap<&'static str, Arc<Value>>>> = LazyLock::new(Default::default);
    let d = def(name)?;
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    Some(built.entry(d.name).or_insert_with(|| Arc::new(build_schema(d))).clone())
}

fn build_schema(d: &ToolDef) -> Value {
    let mut s = (d.schema)();
    if let Some(props) = s.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert(
            "_reason".into(),
            json!({"type": "string", "description": "Why you are calling this tool, in about ten words."}),
        );
        if ["adf_shell", "sys_code", "sys_lambda", "sys_fetch"].contains(&d.name) || d.name.starts_with("mcp_") {
            props.insert("_async".into(), json!({"type": "boolean", "default": false}));
        }
    }
    s
}
