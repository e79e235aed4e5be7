//! The one protocol shared by the terminal app, the daemon and the CLI:
//! `Command`s go in (imperative), `Envelope`s come out (facts), in the
//! umbilical envelope of spec/daemon.md §5.1 with its event type names.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Event type names of spec/daemon.md §5.2 that the runtime emits.
pub mod kind {
    pub const AGENT_LOADED: &str = "agent.loaded";
    pub const AGENT_UNLOADED: &str = "agent.unloaded";
    pub const AGENT_STATE_CHANGED: &str = "agent.state.changed";
    pub const AGENT_ERROR: &str = "agent.error";
    pub const TURN_COMPLETED: &str = "turn.completed";
    pub const TURN_DELTA: &str = "turn.delta";
    pub const TOOL_STARTED: &str = "tool.started";
    pub const TOOL_COMPLETED: &str = "tool.completed";
    pub const TOOL_FAILED: &str = "tool.failed";
    pub const LLM_COMPLETED: &str = "llm.completed";
    pub const LLM_FAILED: &str = "llm.failed";
    pub const LAMBDA_STARTED: &str = "lambda.started";
    pub const LAMBDA_COMPLETED: &str = "lambda.completed";
    pub const LAMBDA_FAILED: &str = "lambda.failed";
    pub const TRIGGER_FIRED: &str = "trigger.fired";
    pub const TRIGGER_DROPPED: &str = "trigger.dropped";
    pub const TIMER_FIRED: &str = "timer.fired";
    pub const FILE_READ: &str = "file.read";
    pub const FILE_WRITTEN: &str = "file.written";
    pub const FILE_DELETED: &str = "file.deleted";
    pub const DB_READ: &str = "db.read";
    pub const DB_WRITE: &str = "db.write";
    pub const HIL_REQUESTED: &str = "hil.requested";
    pub const HIL_RESOLVED: &str = "hil.resolved";
    pub const ASK_REQUESTED: &str = "ask.requested";
    pub const ASK_RESOLVED: &str = "ask.resolved";
    pub const SUSPEND_REQUESTED: &str = "suspend.requested";
    pub const SUSPEND_RESOLVED: &str = "suspend.resolved";
    pub const CONFIG_CHANGED: &str = "config.changed";
    pub const CONTEXT_INJECTED: &str = "context.injected";
    pub const LOOP_COMPACTED: &str = "loop.compacted";
    pub const LOOP_CLEARED: &str = "loop.cleared";
    pub const LOOP_RECOVERED: &str = "loop.recovered";
    /// A side loop's status changed (`loop` names it).
    pub const LOOP_STATE_CHANGED: &str = "loop.state.changed";
    /// `loop_send` delivered a message to another loop.
    pub const LOOP_MESSAGE_SENT: &str = "loop.message.sent";
    /// The built-in memory linter ran for a `lint` loop's scheduled run
    /// (`loop`, `summary`, `counts`).
    pub const LOOP_MEMORY_LINTED: &str = "loop.memory_linted";
    pub const PROVIDER_RETRY_SCHEDULED: &str = "provider.retry_scheduled";
    pub const PROVIDER_RETRY_STARTED: &str = "provider.retry_started";
    pub const PROVIDER_RETRY_CANCELLED: &str = "provider.retry_cancelled";
    pub const MESSAGE_RECEIVED: &str = "message.received";
    pub const MESSAGE_SENT: &str = "message.sent";
    pub const MESSAGE_DELIVERY_FAILED: &str = "message.delivery_failed";
    /// A WebSocket of an agent opened (past its handshake) or closed.
    pub const WS_OPENED: &str = "ws.opened";
    pub const WS_CLOSED: &str = "ws.closed";
    pub const WS_RECONNECTING: &str = "ws.reconnecting";
    /// Stream bindings (daemon.md §5.2).
    pub const BINDING_CREATED: &str = "binding.created";
    pub const BINDING_MATERIALIZED: &str = "binding.materialized";
    pub const BINDING_PENDING: &str = "binding.pending";
    pub const BINDING_RECONNECTING: &str = "binding.reconnecting";
    pub const BINDING_ERROR: &str = "binding.error";
    pub const BINDING_THRESHOLD_EXCEEDED: &str = "binding.threshold_exceeded";
    pub const BINDING_FLOW_SUMMARY: &str = "binding.flow_summary";
    pub const BINDING_TERMINATED: &str = "binding.terminated";
    pub const DAEMON_STARTED: &str = "daemon.started";
    pub const DAEMON_AUTOSTART_REPORT: &str = "daemon.autostart.report";

    /// Every family prefix a filter may name as `<prefix>.*`.
    pub const FAMILIES: &[&str] = &[
        "agent", "turn", "tool", "llm", "lambda", "trigger", "timer", "message", "file", "db", "ws", "binding",
        "adapter", "mcp", "daemon", "hil", "ask", "suspend", "config", "context", "loop", "provider", "custom",
    ];
}

/// The umbilical envelope: one observable fact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Per-agent monotonic sequence, persisted across restarts (0 for
    /// daemon-scope events).
    pub seq: u64,
    pub event_type: Cow<'static, str>,
    /// Epoch milliseconds.
    pub timestamp: i64,
    /// `agent:<turn-id>`, `lambda:<file>:<fn>`, `system:<subsystem>`.
    pub source: String,
    pub agent_id: Option<String>,
    pub payload: Value,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub sig: Option<String>,
}

impl Envelope {
    pub fn new(event_type: &'static str, agent_id: Option<&str>, source: impl Into<String>, payload: Value) -> Self {
        Envelope {
            seq: 0,
            event_type: Cow::Borrowed(event_type),
            timestamp: chrono::Utc::now().timestamp_millis(),
            source: source.into(),
            agent_id: agent_id.map(str::to_string),
            payload,
            sig: None,
        }
    }
}

/// What a client asks of the runtime. Every front end (TUI, daemon route,
/// CLI) maps onto these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    /// A message from the owner into a loop.
    SendChat {
        agent: String,
        #[serde(default = "main_loop")]
        r#loop: String,
        text: String,
    },
    /// Abort the running turn.
    Interrupt {
        agent: String,
    },
    /// Approve a pending approval; `always` lifts the gate for that tool.
    Approve {
        agent: String,
        task_id: String,
        #[serde(default)]
        always: bool,
    },
    /// Reject a pending approval, with feedback the model sees.
    Deny {
        agent: String,
        task_id: String,
        #[serde(default)]
        feedback: Option<String>,
    },
    /// Answer an `ask`.
    Answer {
        agent: String,
        request_id: String,
        text: String,
    },
    Start {
        agent: String,
    },
    Stop {
        agent: String,
    },
    SetState {
        agent: String,
        state: String,
    },
    /// Stop every agent at once.
    EmergencyStop,
}

fn main_loop() -> String {
    "main".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_wire_shape() {
        let mut e = Envelope::new(kind::TOOL_STARTED, Some("abc"), "agent:t1", serde_json::json!({"name": "fs_read"}));
        e.seq = 7;
        e.timestamp = 1;
        let s = serde_json::to_string(&e).unwrap();
        assert_eq!(
            s,
            r#"{"seq":7,"event_type":"tool.started","timestamp":1,"source":"agent:t1","agent_id":"abc","payload":{"name":"fs_read"}}"#
        );
        let back: Envelope = serde_json::from_str(&s).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn commands_round_trip() {
        let c: Command = serde_json::from_str(r#"{"command":"send_chat","agent":"a","text":"hi"}"#).unwrap();
        assert_eq!(c, Command::SendChat { agent: "a".into(), r#loop: "main".into(), text: "hi".into() });
        let d = Command::Deny { agent: "a".into(), task_id: "task_1".into(), feedback: Some("no".into()) };
        assert_eq!(serde_json::from_str::<Command>(&serde_json::to_string(&d).unwrap()).unwrap(), d);
    }
}
