//! One agent's executor: the turn loop of runtime.md §2. A trigger message
//! goes into the loop; the model is called with the advertised tools; tool
//! calls are gated (enabled, restricted → approval, protection → override
//! approval), run, and answered in one row; the turn ends on plain text
//! (interactive), a state change, or a failure. Everything is a loop row
//! or an event; the turn checkpoint in meta makes a crash visible later.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use serde_json::{Value, json};

mod adapters;
mod budget;
mod compute;
mod computer;
mod mcp;
pub(crate) mod media;
mod owner;
mod park;
pub mod side;
mod skills;
pub mod snapshot;
mod streams;
mod ws;

use super::bus::Bus;
use super::inject::{self, InjectError, InjectQueue, Injection};
use super::prompt;
use crate::protocol::{Envelope, kind};
use crate::providers::{ErrorKind, ModelEvent, ModelRequest, Provider, ProviderError, Response, ToolSpec, Usage};
use crate::store::config::AgentConfig;
use crate::store::loop_rows::{LoopRow, NewLoopRow};
use crate::store::meta::MetaProtection;
use crate::store::tasks::NewTask;
use crate::store::template::Snapshot;
use crate::store::{Caller, Denial, Store, StoreError};
use crate::tools::{self, Ctx, ToolOutput};

const CHECKPOINT: &str = "adf_runtime_turn_checkpoint";
const SEQ_KEY: &str = "runtime_umbilical_next_seq";
const SEQ_BLOCK: u64 = 1000;

/// The owner's answer to an approval request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Approve {
        always: bool,
    },
    Deny {
        feedback: Option<String>,
    },
    /// Nobody can answer now: leave the task pending and pause the turn.
    Defer,
}

/// What the owner is asked to approve.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRequest {
    pub task_id: String,
    pub tool: String,
    pub input: Value,
    /// `restricted` or `protection`.
    pub reason: &'static str,
    pub denial: Option<Denial>,
    /// The model's stated `_reason`.
    pub justification: Option<String>,
}

/// How the executor reaches the owner (terminal, TUI, daemon).
pub trait Owner: Send + Sync {
    fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, Decision>;
    /// `None`: nobody can answer now.
    fn answer<'a>(&'a self, task_id: &'a str, question: &'a str) -> BoxFuture<'a, Option<String>>;
}

/// An owner who is never there: approvals and asks wait as rows.
pub struct Absent;

impl Owner for Absent {
    fn approve<'a>(&'a self, _: &'a ApprovalRequest) -> BoxFuture<'a, Decision> {
        Box::pin(async { Decision::Defer })
    }
    fn answer<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async { None })
    }
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnEnd {
    /// The model replied (interactive) or the loop finished.
    Completed { text: String },
    /// The agent chose a state (`sys_set_state`).
    State { state: String },
    /// Waiting for the owner on this task.
    AwaitingOwner { task_id: String },
    /// `max_active_turns` was reached.
    Suspended,
    /// The provider failed; `state` is where the agent went.
    Failed { error: String, state: &'static str },
}

/// Receives streamed text and reasoning deltas.
type DeltaSink = Box<dyn FnMut(&ModelEvent) + Send>;

/// The executor of one agent.
/// A file change as the triggers first see it: the path, what happened,
/// who did it (`Executor::file_trigger` adds the rest for a taker).
fn file_change(path: &str, operation: &str, source: &str) -> super::triggers::TriggerEvent {
    super::triggers::TriggerEvent {
        ty: "file_change",
        source: source.to_string(),
        data: json!({"path": path, "operation": operation, "diff": null}),
    }
}

pub struct Executor {
    pub store: Store,
    /// Record the runtime snapshot (a write) as the actor starts, before
    /// anything it is sent: a load does not wait for it.
    pub(crate) snapshot_on_start: bool,
    /// Number events without writing the counter until the actor starts
    /// (`Store::meta_reserve_later`): a load then answers before any write.
    pub(crate) seq_later: bool,
    /// The id the next turn takes (a client that asked for the chat chose
    /// it, so it can follow the turn's events); else one is made.
    pub next_turn_id: Option<String>,
    /// Reply text of the model call in flight, so an interrupted turn
    /// keeps what was already shown (cleared when the call ends).
    partial: String,
    provider: Arc<dyn Provider>,
    bus: Arc<Bus>,
    owner: Arc<dyn Owner>,
    agent_id: String,
    seq_next: u64,
    seq_limit: u64,
    snapshot: Snapshot,
    /// The system prompt as last built and what it was built from; the
    /// knowledge key is checked once a turn.
    prompt: Option<PromptCache>,
    knowledge_checked: bool,
    /// What the executor needs to know of the session without keeping its
    /// rows: read once, then kept up to date as rows are appended (the
    /// file stays the truth; compaction and clears read it again).
    session: Option<Session>,
    transcript: prompt::Transcript,
    /// Live MCP connections by server name, opened at the first call.
    mcp: crate::mcp::servers::Servers,
    /// A price list set by hand (else settings.json's, via the ledger).
    prices: Arc<crate::providers::prices::Prices>,
    /// The app-wide usage ledger and the fleet budget, when this process
    /// keeps one.
    ledger: Option<Arc<crate::ledger::Ledger>>,
    /// The running call's worst case, held against the fleet budget.
    fleet_hold: Option<crate::ledger::Reservation>,
    /// A decision given before its approval is asked again (resuming a
    /// paused turn): (origin, task id, decision).
    preset: Option<(String, String, Decision)>,
    /// What was last written as `[Context: …]` rows, and the warning tier
    /// reached this session.
    context_hash: Option<u64>,
    last_dynamic: Option<String>,
    warned: u8,
    /// The turn in progress: (id, started at).
    current: Option<(String, i64, String)>,
    /// The turn checkpoint as last set; `cp_pending` when it is still to
    /// be written (with the next loop row), `cp_final` when the turn's
    /// closing checkpoint already went with its last row.
    cp: Option<Value>,
    cp_pending: bool,
    cp_final: bool,
    /// Unread inbox messages at an inbox revision.
    unread: Option<(u64, u64)>,
    /// Set when the actor parked the agent (closed its connection).
    parked: Option<park::Parked>,
    /// The parsed config and advertised tools, refreshed when the config
    /// revision changes.
    cfg: Option<Arc<CachedConfig>>,
    /// The memory-flush grace turn was given since the last compaction.
    flush_done: bool,
    /// `error`, `idle`, … as last set by a turn.
    pub state: String,
    on_delta: Option<DeltaSink>,
    /// `loop_inject` context waiting for the next model boundary.
    inject: InjectQueue,
    /// Publish `turn.delta` events (`umbilical.stream_deltas`, or a
    /// front end that renders streams).
    stream_deltas: bool,
    /// `_async` calls from code, run when that code has finished.
    pub(crate) async_calls: Vec<(String, String, Value, super::code::CodeCx)>,
    /// System-scope lambdas queued by timers, run by `run_system`.
    pub(crate) system_queue: Vec<super::code::SystemJob>,
    /// The last system lambda's failure, for the agent's card.
    pub last_lambda_error: Option<String>,
    /// An `on_logs` handler runs here: its own log rows do not fire it.
    pub(crate) in_logs_handler: bool,
    /// The agent's trigger machinery (absent: triggers other than timers
    /// are not evaluated, as in a bare executor).
    pub(crate) dispatcher: Option<Arc<super::triggers::Dispatcher>>,
    /// Name resolution for `sys_fetch` (replaced in tests).
    pub(crate) resolver: Arc<dyn super::egress::Resolve>,
    /// The runtime's mesh (messaging), when the agent is in a fleet.
    pub(crate) mesh: Option<Arc<super::mesh::Mesh>>,
    /// Side loops: the one running, the others' state, wakes asked for.
    pub(crate) loops: side::Loops,
}

fn iso(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|d| d.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}

fn elapsed(ms: i64) -> String {
    let m = ms.max(0) / 60_000;
    match (m / 60, m % 60) {
        (0, 0) => format!("{}s", ms.max(0) / 1000),
        (0, m) => format!("{m}m"),
        (h, m) => format!("{h}h {m}m"),
    }
}

impl Executor {
    pub fn new(
        store: Store,
        provider: Arc<dyn Provider>,
        bus: Arc<Bus>,
        owner: Arc<dyn Owner>,
    ) -> Result<Self, StoreError> {
        let mut store = store;
        // Checkpoints run between turns (the actor), never inside a commit.
        store.defer_checkpoints()?;
        let cfg = store.config_value()?;
        let agent_id = cfg.get("id").and_then(Value::as_str).unwrap_or("").to_string();
        Ok(Executor {
            store,
            snapshot_on_start: false,
            seq_later: false,
            next_turn_id: None,
            partial: String::new(),
            provider,
            bus,
            owner,
            agent_id,
            seq_next: 0,
            seq_limit: 0,
            snapshot: Snapshot::new(),
            prompt: None,
            knowledge_checked: false,
            session: None,
            transcript: prompt::Transcript::default(),
            mcp: Default::default(),
            flush_done: false,
            cfg: None,
            current: None,
            cp: None,
            cp_pending: false,
            cp_final: false,
            unread: None,
            parked: None,
            loops: Default::default(),
            prices: Default::default(),
            ledger: crate::ledger::global(),
            fleet_hold: None,
            context_hash: None,
            preset: None,
            last_dynamic: None,
            warned: 0,
            state: "idle".into(),
            on_delta: None,
            inject: InjectQueue::default(),
            stream_deltas: false,
            async_calls: Vec::new(),
            system_queue: Vec::new(),
            last_lambda_error: None,
            dispatcher: None,
            in_logs_handler: false,
            resolver: Arc::new(super::egress::SystemResolver),
            mesh: None,
        })
    }

    /// Price calls with the owner's price list.
    pub fn set_prices(&mut self, prices: crate::providers::prices::Prices) {
        self.prices = Arc::new(prices);
    }

    /// Record calls in this ledger and check its fleet budget (by default
    /// the process's own, when it keeps one).
    pub fn set_ledger(&mut self, ledger: Option<Arc<crate::ledger::Ledger>>) {
        self.ledger = ledger;
    }

    /// Receive text and reasoning deltas as they stream.
    pub fn on_delta(&mut self, f: impl FnMut(&ModelEvent) + Send + 'static) {
        self.on_delta = Some(Box::new(f));
    }

    /// Publish text and reasoning deltas as `turn.delta` events.
    pub fn stream_deltas(&mut self, on: bool) {
        self.stream_deltas = on;
    }

    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    pub fn provider(&self) -> Arc<dyn Provider> {
        self.provider.clone()
    }

    pub fn bus(&self) -> Arc<Bus> {
        self.bus.clone()
    }

    /// Evaluate triggers through `d` (the actor sets this).
    pub fn set_dispatcher(&mut self, d: Arc<super::triggers::Dispatcher>) {
        self.dispatcher = Some(d);
    }

    pub fn dispatcher(&self) -> Option<&Arc<super::triggers::Dispatcher>> {
        self.dispatcher.as_ref()
    }

    /// Offer an event to the triggers; `system_only` leaves agent-scope
    /// targets to the caller (a chat already wakes the agent).
    pub fn trigger(&mut self, ev: super::triggers::TriggerEvent, system_only: bool) {
        if let Some((d, dispatches)) = self.dispatches(&ev) {
            self.fire(&d, dispatches, system_only, &ev.source);
        }
    }

    /// What the agent's triggers make of `ev`, when it has a dispatcher and
    /// something takes it.
    fn dispatches(
        &self,
        ev: &super::triggers::TriggerEvent,
    ) -> Option<(Arc<super::triggers::Dispatcher>, Vec<super::triggers::Dispatch>)> {
        let d = self.dispatcher.clone()?;
        // The parsed config when a turn has built it; otherwise the raw
        // document, so an idle agent does not build (and keep) the
        // turn's view of its config just to look at its triggers.
        let rev = self.store.config_rev();
        let dispatches = match &self.cfg {
            Some(c) if c.rev == rev => super::triggers::evaluate(&c.value, &self.state, ev),
            _ => self.store.with_config(|v| super::triggers::evaluate(v, &self.state, ev)).ok()?,
        };
        (!dispatches.is_empty()).then_some((d, dispatches))
    }

    fn fire(
        &mut self,
        d: &super::triggers::Dispatcher,
        dispatches: Vec<super::triggers::Dispatch>,
        system_only: bool,
        source: &str,
    ) {
        for dispatch in dispatches {
            if system_only && !dispatch.system {
                continue;
            }
            let payload = json!({"trigger_type": dispatch.trigger, "scope": if dispatch.system { "system" } else { "agent" },
                "target_lambda": dispatch.lambda});
            if dispatch.system || matches!(dispatch.timing, super::triggers::Timing::Now) {
                self.emit(kind::TRIGGER_FIRED, source, payload);
            }
            d.submit(dispatch);
        }
    }

    /// Write a log row and offer it to `on_logs` (rows written while an
    /// `on_logs` handler runs do not fire it again).
    pub fn log(&mut self, level: &str, origin: &str, event: &str, message: &str) -> Result<(), StoreError> {
        self.store.log(level, origin, event, message)?;
        if self.dispatcher.is_some() && !self.in_logs_handler {
            let entry = json!({"level": level, "origin": origin, "event": event, "target": null, "message": message,
                "created_at": crate::store::now_ms()});
            let source =
                self.current.as_ref().map(|c| format!("agent:{}", c.0)).unwrap_or_else(|| "system:runtime".into());
            self.trigger(
                super::triggers::TriggerEvent { ty: "log_entry", source, data: json!({"entry": entry}) },
                false,
            );
        }
        Ok(())
    }

    /// Offer a task to `on_task_create` / `on_task_complete`.
    pub(crate) fn task_event(&mut self, ty: &'static str, task_id: &str, source: &str) {
        if self.dispatcher.is_none() {
            return;
        }
        let Ok(Some(t)) = self.store.task_get(task_id) else { return };
        let task = serde_json::to_value(&t).unwrap_or(Value::Null);
        self.trigger(
            super::triggers::TriggerEvent { ty, source: source.to_string(), data: json!({"task": task}) },
            false,
        );
    }

    /// Give the file back (the executor is done).
    pub fn store_into(self) -> Store {
        self.store
    }

    /// Resolve `sys_fetch` names with `r` (tests point names anywhere).
    pub fn set_resolver(&mut self, r: Arc<dyn super::egress::Resolve>) {
        self.resolver = r;
    }

    /// Publish an event with the next per-agent seq (reserved in blocks
    /// persisted to meta, so numbering never goes back after a restart).
    pub fn emit(&mut self, ty: &'static str, source: &str, payload: Value) {
        let e = Envelope::new(ty, Some(&self.agent_id), source, payload);
        self.publish(e);
    }

    /// `emit` for a type chosen at run time (`custom.*` from code).
    pub fn emit_owned(&mut self, ty: String, source: &str, payload: Value) {
        let mut e = Envelope::new("", Some(&self.agent_id), source, payload);
        e.event_type = std::borrow::Cow::Owned(ty);
        self.publish(e);
    }

    /// What the actor does first (`snapshot_on_start`).
    pub(crate) fn on_start(&mut self) {
        if std::mem::take(&mut self.seq_later)
            && let Err(e) = self.store.meta_reserve_settle(SEQ_KEY)
        {
            let _ = self.log("warn", "fleet", "event_seq", &e.to_string());
        }
        if !std::mem::take(&mut self.snapshot_on_start) {
            return;
        }
        if let Err(e) = self.record_runtime_snapshot() {
            let _ = self.log("warn", "fleet", "runtime_snapshot", &e.to_string());
        }
        // What the snapshot read is not kept: the agent was loaded to wait.
        self.store.release_memory();
    }

    fn publish(&mut self, mut e: Envelope) {
        if let Some(side) = &self.loops.side
            && let Some(o) = e.payload.as_object_mut()
        {
            o.entry("loop").or_insert_with(|| Value::String(side.def.name.clone()));
        }
        let before = e.payload.as_object_mut().and_then(|o| o.remove("_before"));
        let trig = match &*e.event_type {
            kind::FILE_WRITTEN | kind::FILE_DELETED if self.dispatcher.is_some() => {
                let op = if e.event_type == kind::FILE_DELETED {
                    "deleted"
                } else {
                    e.payload["operation"].as_str().unwrap_or("modified")
                };
                // What the dispatch carries (stat, diff) is read only when
                // a trigger takes the change: its filter needs the path.
                Some(file_change(e.payload["path"].as_str().unwrap_or(""), op, &e.source))
            }
            kind::LLM_COMPLETED if self.dispatcher.is_some() => {
                let mut data = e.payload.clone();
                data["source"] = e.payload["call_source"].clone();
                Some(super::triggers::TriggerEvent { ty: "llm_call", source: e.source.clone(), data })
            }
            kind::AGENT_STATE_CHANGED => {
                if let (Some(d), Some(st)) = (&self.dispatcher, e.payload["state"].as_str())
                    && let Ok(mut s) = d.state.lock()
                {
                    *s = st.to_string();
                }
                None
            }
            _ => None,
        };
        self.publish_only(e);
        if let Some(t) = trig {
            if t.ty == "file_change" {
                self.file_trigger(t, before);
            } else {
                self.trigger(t, false);
            }
        }
    }

    /// Whether a change to `path` by `source` would fire a trigger.
    pub(crate) fn file_change_wanted(&self, path: &str, source: &str) -> bool {
        self.dispatches(&file_change(path, "modified", source)).is_some()
    }

    /// A file change offered to the triggers; what a dispatch carries
    /// beyond the path is read only when one takes it.
    fn file_trigger(&mut self, mut ev: super::triggers::TriggerEvent, before: Option<Value>) {
        let Some((d, mut dispatches)) = self.dispatches(&ev) else { return };
        let path = ev.data["path"].as_str().unwrap_or("").to_string();
        if let Some(b) = before.as_ref().and_then(Value::as_str)
            && let Ok(now) = self.store.file_read_text(&path)
        {
            ev.data["diff"] = json!(super::diff::unified(&path, Some(b), &now));
            ev.data["_before"] = json!(b);
        }
        if let Some(f) = self.store.file_stat(&path).ok().flatten() {
            let data = &mut ev.data;
            data["mime_type"] = json!(f.mime_type);
            data["size"] = json!(f.size);
            data["protection"] = json!(f.protection);
            data["authorized"] = json!(f.authorized);
            data["created_at"] = json!(f.created_at);
            data["updated_at"] = json!(f.updated_at);
        }
        for dispatch in &mut dispatches {
            dispatch.event = ev.clone();
        }
        self.fire(&d, dispatches, false, &ev.source);
    }

    fn publish_only(&mut self, mut e: Envelope) {
        if self.seq_next >= self.seq_limit {
            // Blocks are reserved atomically: runner executors on sibling
            // connections number the same agent's events.
            let start = if self.seq_later {
                self.store.meta_reserve_later(SEQ_KEY, SEQ_BLOCK, self.seq_next)
            } else {
                self.store.meta_reserve(SEQ_KEY, SEQ_BLOCK, self.seq_next)
            };
            let start = start.unwrap_or(self.seq_next.max(1));
            self.seq_limit = start + SEQ_BLOCK;
            self.seq_next = start;
        }
        e.seq = self.seq_next;
        self.seq_next += 1;
        self.bus.publish(e);
    }

    fn checkpoint(&mut self, v: &Value) {
        self.cp = Some(v.clone());
        self.cp_pending = false;
        // The file's checkpoint is the main loop's; a side loop's stays here.
        if self.loops.side.is_some() {
            return;
        }
        let _ = self.store.set_system_meta(CHECKPOINT, &v.to_string(), MetaProtection::Readonly);
    }

    fn append(
        &mut self,
        role: &str,
        content: &Value,
        model: Option<&str>,
        tokens: Option<&Value>,
    ) -> Result<i64, StoreError> {
        let cp = if std::mem::take(&mut self.cp_pending) { self.cp.clone() } else { None };
        self.append_cp(role, content, model, tokens, cp)
    }

    /// Append a row, with the checkpoint `cp` (if any) in the same commit.
    fn append_cp(
        &mut self,
        role: &str,
        content: &Value,
        model: Option<&str>,
        tokens: Option<&Value>,
        cp: Option<Value>,
    ) -> Result<i64, StoreError> {
        self.cp_pending = false;
        let new = NewLoopRow { role, content, model, tokens, ord: None };
        let row = match &self.loops.side {
            Some(side) => self.store.side_append_row(&side.def.name, &new)?,
            None => {
                let text = cp.as_ref().and_then(|v| serde_json::to_string(v).ok());
                self.store.loop_append_row_with(&new, text.as_deref().map(|t| (CHECKPOINT, t)))?
            }
        };
        if cp.is_some() {
            self.cp = cp;
        }
        if let Some(s) = self.session.as_mut() {
            s.add(&row);
            self.transcript.push(&row);
        }
        Ok(row.seq)
    }

    /// The session summary, read from the file the first time.
    fn session(&mut self) -> Result<&Session, StoreError> {
        if self.session.is_none() {
            let rows = self.loop_rows()?;
            let mut s = Session::default();
            for r in &rows {
                s.add(r);
            }
            self.transcript.rebuild(&rows);
            // Keyed injections are state: the latest of each key is queued
            // again; what was pending in memory comes after and wins.
            let pending = self.inject.drain();
            for r in &rows {
                if let Some(inj) = prompt::context_text(r).and_then(|t| inject::parse_keyed(t, r.seq)) {
                    self.inject.push(inj);
                }
            }
            for inj in pending {
                self.inject.push(inj);
            }
            self.session = Some(s);
        }
        Ok(self.session.get_or_insert_with(Session::default))
    }

    /// The running loop's rows.
    fn loop_rows(&self) -> Result<Vec<LoopRow>, StoreError> {
        match &self.loops.side {
            Some(side) => self.store.side_rows(&side.def.name),
            None => self.store.loop_rows(None),
        }
    }

    /// `loop_replace` on the running loop.
    fn replace_rows(
        &mut self,
        remove: &[LoopRow],
        archive: bool,
        insert: Option<&NewLoopRow<'_>>,
    ) -> Result<Option<i64>, StoreError> {
        let store = &mut self.store;
        match &self.loops.side {
            Some(side) => blocking(|| store.side_replace(&side.def.name, remove, archive, insert)),
            None => blocking(|| store.loop_replace(remove, archive, insert)),
        }
    }

    fn user_text(&mut self, text: &str) -> Result<i64, StoreError> {
        self.append("user", &json!([{"type": "text", "text": text}]), None, None)
    }

    /// On load: a turn left `in_progress` means the last process died in
    /// it. Tell the agent (start, last progress, now, elapsed; the trigger
    /// was not replayed), fail running tasks, cancel executor-managed
    /// approvals (runtime.md §9.3).
    pub fn recover(&mut self) -> Result<bool, StoreError> {
        let mut recovered = false;
        let raw = self.store.meta_get(CHECKPOINT)?.map(|m| m.value);
        if let Some(raw) = raw {
            let now = crate::store::now_ms();
            match serde_json::from_str::<Value>(&raw) {
                Ok(cp) if cp["status"] == "in_progress" => {
                    let started = cp["started_at"].as_i64().unwrap_or(now);
                    let updated = cp["updated_at"].as_i64().unwrap_or(started);
                    let notice = format!(
                        "[System] The previous run of this agent stopped in the middle of a turn (scope {}, turn {}, trigger {}). \
                         It started at {} and last made progress at {}; it is now {}, {} after it started. \
                         The trigger of that turn was NOT replayed: check what was done, and account for the gap in anything time-sensitive.",
                        cp["scope"].as_str().unwrap_or("agent"),
                        cp["id"].as_str().unwrap_or("?"),
                        cp["event_type"].as_str().unwrap_or("?"),
                        iso(started),
                        iso(updated),
                        iso(now),
                        elapsed(now - started)
                    );
                    // Calls that never returned are answered first, so the
                    // history stays one the providers accept: every call
                    // followed by its result, results before any text.
                    self.answer_dangling(INTERRUPTED_BY_STOP)?;
                    self.user_text(&notice)?;
                    let mut cp = cp;
                    cp["status"] = json!("interrupted");
                    cp["replay"] = json!("not_replayed");
                    cp["reason"] = json!("stale_checkpoint_recovered_on_load");
                    cp["updated_at"] = json!(now);
                    self.checkpoint(&cp);
                    self.log("warn", "executor", "turn_checkpoint_recovered", &notice)?;
                    self.emit(kind::LOOP_RECOVERED, "system:executor", json!({"reason": "stale_checkpoint"}));
                    recovered = true;
                }
                Ok(_) => {}
                Err(_) => {
                    self.answer_dangling(INTERRUPTED_BY_STOP)?;
                    self.user_text(&format!(
                        "[System] A turn-progress record of this agent could not be read, so it may have stopped mid-turn \
                         at an unknown time (now {}). Nothing was replayed.",
                        iso(now)
                    ))?;
                    self.checkpoint(
                        &json!({"status": "interrupted", "reason": "malformed_checkpoint", "updated_at": now}),
                    );
                    self.emit(kind::LOOP_RECOVERED, "system:executor", json!({"reason": "malformed_checkpoint"}));
                    recovered = true;
                }
            }
        }
        let mut running = 0;
        let mut cancelled = 0;
        for t in self.store.task_list(None)? {
            if t.status == "running" {
                self.store.task_set(
                    &t.id,
                    "failed",
                    None,
                    Some("The runtime stopped while this task ran; outcome unknown."),
                )?;
                running += 1;
            } else if t.status == "pending_approval" && t.executor_managed && recovered {
                self.store.task_set(
                    &t.id,
                    "cancelled",
                    None,
                    Some("The turn waiting on this approval ended with the runtime."),
                )?;
                self.emit(
                    kind::HIL_RESOLVED,
                    "system:executor",
                    json!({"request_id": t.id, "task_id": t.id, "approved": false, "orphaned": true}),
                );
                cancelled += 1;
            }
        }
        if running + cancelled > 0 {
            self.emit(
                kind::LOOP_RECOVERED,
                "system:executor",
                json!({"reason": "orphaned_tasks", "running": running, "awaiting_approval": cancelled}),
            );
        }
        Ok(recovered || running + cancelled > 0)
    }

    /// Close a turn that was paused on the owner: pending approvals are
    /// denied and unanswered calls get placeholders, as an interrupt does.
    fn settle_dangling(&mut self) -> Result<(), StoreError> {
        let uses = self.session()?.pending.clone();
        for (id, name) in uses {
            for t in self.store.task_list(Some("pending_approval"))? {
                if t.origin.as_deref() == Some(&format!("hil:{name}:{id}")) {
                    self.store.task_set(&t.id, "denied", None, Some("Rejected"))?;
                    self.emit(
                        kind::HIL_RESOLVED,
                        "system:executor",
                        json!({"request_id": t.id, "task_id": t.id, "approved": false}),
                    );
                }
            }
        }
        self.answer_dangling("[Tool execution cancelled — user interrupted the turn]")
    }

    /// Answer the calls of the last assistant row that have no result yet
    /// with `text` (an error result each), in one row.
    fn answer_dangling(&mut self, text: &str) -> Result<(), StoreError> {
        let uses = self.session()?.pending.clone();
        if uses.is_empty() {
            return Ok(());
        }
        let results: Vec<Value> = uses
            .iter()
            .map(|(id, _)| json!({"type": "tool_result", "tool_use_id": id, "content": text, "is_error": true}))
            .collect();
        self.append("user", &Value::Array(results), None, None)?;
        Ok(())
    }

    /// Run one turn started by an owner chat message.
    pub async fn chat(&mut self, text: &str) -> Result<TurnEnd, StoreError> {
        self.wake(text, "chat").await
    }

    /// Run one agent-scope turn for a trigger (`chat`, `timer`, …) whose
    /// message goes into the loop first.
    pub async fn wake(&mut self, text: &str, event_type: &str) -> Result<TurnEnd, StoreError> {
        if event_type == "chat" {
            let text = self.expand_skill(text).into_owned();
            return self.turn(Some(&text), event_type).await;
        }
        self.turn(Some(text), event_type).await
    }

    /// `wake` for a message, `resume` for an empty one with event `resume`.
    /// The actor's entry: `resume`, a paused approval, or a wake.
    pub async fn turn_for(
        &mut self,
        text: &str,
        event_type: &str,
        approval: Option<(String, Decision)>,
    ) -> Result<TurnEnd, StoreError> {
        match (event_type, approval) {
            ("resume", _) => self.resume().await,
            ("compact", _) => self.owner_compact(Some(text).filter(|t| !t.is_empty())).await,
            // Another loop's mail woke main: it is read at the boundary.
            ("loop", _) if self.store.loop_mail_waiting("main")? == 0 => Ok(TurnEnd::Completed { text: String::new() }),
            ("loop", _) => self.turn(None, "loop").await,
            (_, Some((task_id, decision))) => self.resume_paused(&task_id, decision).await,
            _ => self.wake(text, event_type).await,
        }
    }

    /// `limits.suspend_timeout_ms`, default 20 minutes.
    pub fn suspend_timeout(&self) -> Duration {
        let ms = self
            .store
            .config_value()
            .ok()
            .and_then(|c| c.pointer("/limits/suspend_timeout_ms").and_then(Value::as_u64))
            .unwrap_or(1_200_000);
        Duration::from_millis(ms)
    }

    /// Back from `off` to `idle` (an owner message after a refused
    /// suspension restarts the agent).
    pub fn revive(&mut self) {
        self.set_state("idle");
    }

    /// Continue after a suspension the owner lifted: a new turn on the loop
    /// as it stands (the call counter starts again at 0).
    pub async fn resume(&mut self) -> Result<TurnEnd, StoreError> {
        self.emit(kind::SUSPEND_RESOLVED, "system:executor", json!({"resumed": true}));
        self.turn(None, "resume").await
    }

    /// The owner did not lift a suspension (or refused): the agent goes off.
    pub fn suspension_refused(&mut self, timed_out: bool) {
        let mut p = json!({"resumed": false});
        if timed_out {
            p["timed_out"] = json!(true);
        }
        self.emit(kind::SUSPEND_RESOLVED, "system:executor", p);
        self.set_state("off");
    }

    async fn turn(&mut self, text: Option<&str>, event_type: &str) -> Result<TurnEnd, StoreError> {
        self.turn_with(text, event_type, &[]).await
    }

    async fn turn_with(
        &mut self,
        text: Option<&str>,
        event_type: &str,
        resume_calls: &[Value],
    ) -> Result<TurnEnd, StoreError> {
        if resume_calls.is_empty() {
            self.settle_dangling()?;
        }
        self.knowledge_checked = false;
        let turn_id = self.next_turn_id.take().unwrap_or_else(|| format!("turn_{}", crate::store::create::nanoid(10)));
        let now = crate::store::now_ms();
        let cp = json!({"id": turn_id, "status": "in_progress", "started_at": now, "updated_at": now,
            "event_type": event_type, "scope": "agent", "replay": "not_attempted"});
        self.current = Some((turn_id.clone(), now, event_type.to_string()));
        self.cp_final = false;
        match text {
            // The checkpoint goes in with the turn's first row: one commit.
            Some(text) => {
                self.cp = Some(cp);
                self.cp_pending = true;
                self.user_text(text)?;
            }
            None => self.checkpoint(&cp),
        }
        self.set_state("active");
        let end = self.run_loop(&turn_id, resume_calls).await;
        self.current = None;
        let end = match end {
            Ok(e) => e,
            Err(e) => {
                self.finish_checkpoint(&turn_id, now, event_type, "failed", Some("turn_error"));
                self.set_state("error");
                let _ = self.log("error", "executor", "turn_error", &e.to_string());
                return Err(e);
            }
        };
        let (status, reason, state) = match &end {
            TurnEnd::Completed { .. } => ("completed", None, "idle".to_string()),
            TurnEnd::State { state } => ("completed", None, state.clone()),
            TurnEnd::AwaitingOwner { .. } => ("awaiting_owner", None, "idle".to_string()),
            TurnEnd::Suspended => ("interrupted", Some("suspended"), "suspended".to_string()),
            TurnEnd::Failed { state, .. } => ("failed", Some("provider_error"), state.to_string()),
        };
        if !std::mem::take(&mut self.cp_final) {
            self.finish_checkpoint(&turn_id, now, event_type, status, reason);
        }
        let content = match &end {
            TurnEnd::Completed { text } => text.clone(),
            _ => String::new(),
        };
        self.emit(
            kind::TURN_COMPLETED,
            &format!("agent:{turn_id}"),
            json!({"filePath": self.store.path().display().to_string(), "content": content, "targetState": state}),
        );
        self.set_state(&state);
        Ok(end)
    }

    /// Settle the timers that are due and return the wake messages of those
    /// that fire for the agent scope now (runtime.md §6.2): `on_timer` must
    /// be enabled with a target of that scope, and the state must allow it
    /// (not `suspended`, `error` or `off`). System-scope fires queue the
    /// timer's own lambda for `run_system` (every state but `off`).
    pub fn fire_timers(&mut self, now: i64) -> Result<Vec<String>, StoreError> {
        let fired = self.store.timers_settle_due(now)?;
        if fired.is_empty() {
            return Ok(Vec::new());
        }
        let cfg = self.store.config_value()?;
        let on_timer = cfg.pointer("/triggers/on_timer");
        let enabled = on_timer.and_then(|t| t.get("enabled")).and_then(Value::as_bool).unwrap_or(false);
        let has_target = |scope: &str| {
            on_timer
                .and_then(|t| t.get("targets"))
                .and_then(Value::as_array)
                .is_some_and(|ts| ts.iter().any(|t| t["scope"] == scope))
        };
        let agent_ok = !matches!(self.state.as_str(), "suspended" | "error" | "off");
        let mut wakes = Vec::new();
        for f in fired {
            if !enabled {
                continue;
            }
            for scope in &f.scope {
                if !has_target(scope) {
                    continue;
                }
                let payload =
                    json!({"timer_id": f.id, "scope": scope, "run_count": f.run_count, "scheduled_at": f.scheduled_at});
                match scope.as_str() {
                    "agent" if agent_ok => {
                        self.emit(kind::TIMER_FIRED, "system:timer", payload);
                        wakes.push(match &f.payload {
                            Some(p) if !p.is_empty() => format!("A scheduled timer has fired.\nPayload: {p}"),
                            _ => "A scheduled timer has fired.\nCheck your mind for context on what to do next.".into(),
                        });
                    }
                    "system" if self.state != "off" => {
                        self.emit(kind::TIMER_FIRED, "system:timer", payload);
                        let Some(lambda) = f.lambda.clone().filter(|l| !l.is_empty()) else {
                            let _ = self.log(
                                "warn",
                                "timer",
                                "no_lambda",
                                &format!("timer {} fired for the system scope but has no lambda", f.id),
                            );
                            continue;
                        };
                        let timer = json!({"id": f.id, "scope": f.scope, "payload": f.payload, "lambda": lambda,
                            "run_count": f.run_count, "last_fired_at": now, "next_wake_at": f.next});
                        let event = json!({"id": crate::store::create::nanoid(16), "type": "timer", "source": "system:timer",
                            "time": iso(now), "data": {"timer": timer}});
                        self.emit(
                            kind::TRIGGER_FIRED,
                            "system:timer",
                            json!({"trigger_type": "on_timer", "scope": "system", "target_lambda": lambda}),
                        );
                        let job = super::code::SystemJob {
                            trigger: "on_timer",
                            lambda,
                            event,
                            warm: f.warm,
                            source: "system:timer".into(),
                        };
                        match &self.dispatcher {
                            Some(d) => d.submit_job(job),
                            None => self.system_queue.push(job),
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(wakes)
    }

    /// Append an owner/system notice to the loop.
    pub fn note(&mut self, text: &str) -> Result<i64, StoreError> {
        self.user_text(text)
    }

    /// After a running turn was dropped (an owner interrupt or state
    /// change): mark its checkpoint `interrupted` and say so on the bus.
    /// Calls left without results are answered when the next turn starts.
    pub fn interrupted(&mut self, reason: &str, state: &str) {
        // What the model had written when the turn was cut stays in the
        // loop, marked, so the owner and the model both see it.
        let partial = std::mem::take(&mut self.partial);
        if !partial.trim().is_empty() {
            let text = format!("{partial}{INTERRUPTED_MARK}");
            let _ = self.append("assistant", &json!([{"type": "text", "text": text}]), None, None);
        }
        if let Some((id, started, event_type)) = self.current.take() {
            self.finish_checkpoint(&id, started, &event_type, "interrupted", Some(reason));
            self.emit(
                kind::TURN_COMPLETED,
                &format!("agent:{id}"),
                json!({"filePath": self.store.path().display().to_string(), "content": "", "targetState": state, "interrupted": true}),
            );
        }
        self.set_state(state);
    }

    fn finish_checkpoint(&mut self, id: &str, started: i64, event_type: &str, status: &str, reason: Option<&str>) {
        let cp = closing(id, started, event_type, status, reason);
        self.checkpoint(&cp);
    }

    /// The closing checkpoint of the turn in progress.
    fn closing_checkpoint(&self, status: &str, reason: Option<&str>) -> Option<Value> {
        let (id, started, event_type) = self.current.as_ref()?;
        Some(closing(id, *started, event_type, status, reason))
    }

    /// The current checkpoint with `updated_at` now (progress made), to be
    /// written with the row that made it.
    fn touched_checkpoint(&mut self) -> Option<Value> {
        let mut cp = match self.cp.take() {
            Some(cp) => cp,
            None if self.loops.side.is_some() => return None,
            None => self.store.meta_get(CHECKPOINT).ok().flatten().and_then(|m| serde_json::from_str(&m.value).ok())?,
        };
        cp["updated_at"] = json!(crate::store::now_ms());
        Some(cp)
    }

    fn set_state(&mut self, state: &str) {
        if self.set_side_status(state) {
            return;
        }
        if self.state != state {
            self.state = state.to_string();
            self.emit(
                kind::AGENT_STATE_CHANGED,
                "system:executor",
                json!({"filePath": self.store.path().display().to_string(), "state": state}),
            );
        }
    }

    async fn run_loop(&mut self, turn_id: &str, resume_calls: &[Value]) -> Result<TurnEnd, StoreError> {
        let source = format!("agent:{turn_id}");
        let mut active_turns: u64 = 0;
        let mut narration = 0;
        let mut image_recovery = false;
        if !resume_calls.is_empty() {
            let cached = self.config()?;
            if let Some(e) = self.answer(resume_calls, &cached, &source).await? {
                return Ok(e);
            }
        }
        loop {
            // Let other agents run between steps once this task has used
            // its share of the scheduler's budget (the SQLite work here is
            // short but never awaits). A plain yield on every step made an
            // instant turn wait for the scheduler to come round, often on
            // another thread.
            tokio::task::consume_budget().await;
            let cached = self.config()?;
            let (cfg, typed) = (&cached.value, &cached.typed);
            let max_turns = typed.limits.as_ref().and_then(|l| l.max_active_turns).flatten();
            if let Some(max) = max_turns
                && active_turns >= max
            {
                self.emit(kind::SUSPEND_REQUESTED, &source, json!({"reason": "max_active_turns"}));
                return Ok(TurnEnd::Suspended);
            }
            active_turns += 1;
            self.compaction_check(cfg, &source).await?;
            let request = self.request(&cached)?;
            if let Some(over) = self.over_budget(&cached, &request)? {
                return self.budget_stop(&over, &source);
            }
            let model_id = request.model.clone();
            let response = match self.call(cfg, request, &source).await {
                Ok(r) => r,
                // A provider that cannot take the images: once a turn, send
                // the conversation again without them (runtime.md §1.4).
                Err(e) if e.kind == ErrorKind::Structural && self.transcript.has_media() && !image_recovery => {
                    image_recovery = true;
                    self.log("warn", "executor", "turn_error", &clip(&e.to_string(), 300))?;
                    self.transcript.strip_media();
                    self.user_text(&media::recovery_notice(&e.message))?;
                    continue;
                }
                Err(e) if image_recovery && e.kind != ErrorKind::Auth => {
                    self.log("warn", "executor", "image_recovery_followup_error", &clip(&e.to_string(), 300))?;
                    self.user_text(&media::recovery_failed_notice(&e.message))?;
                    return Ok(TurnEnd::Failed { error: e.to_string(), state: "idle" });
                }
                Err(e) => {
                    let state = match e.kind {
                        ErrorKind::Transient => "idle",
                        _ => "error",
                    };
                    let event = if e.kind == ErrorKind::Auth {
                        "provider_credentials_invalid"
                    } else if state == "idle" {
                        "provider_error"
                    } else {
                        "turn_error"
                    };
                    let level = if state == "idle" { "warn" } else { "error" };
                    self.log(level, "executor", event, &e.to_string())?;
                    return Ok(TurnEnd::Failed { error: e.to_string(), state });
                }
            };
            self.settle_spend(cfg, &model_id, &response.usage, "turn")?;
            let tokens = usage_json(&response.usage);
            let model = typed.model.as_ref().and_then(|m| m.model_id.clone()).unwrap_or_default();
            let calls: Vec<Value> = response.tool_calls().cloned().collect();
            let text = response.text();
            let content = Value::Array(response.content);
            if calls.is_empty() && !prompt::is_autonomous(cfg) {
                // The turn ends with this row: its closing checkpoint goes
                // in the same commit.
                let cp = self.closing_checkpoint("completed", None);
                let closed = cp.is_some();
                self.append_cp("assistant", &content, Some(&model), Some(&tokens), cp)?;
                self.cp_final = closed;
                return Ok(TurnEnd::Completed { text });
            }
            let cp = self.touched_checkpoint();
            self.append_cp("assistant", &content, Some(&model), Some(&tokens), cp)?;
            if calls.is_empty() {
                narration += 1;
                if narration >= 4 {
                    self.log("warn", "executor", "narration_loop_break", "4 replies in a row without a tool call")?;
                    return Ok(TurnEnd::Completed { text });
                }
                let nudge = if narration == 1 {
                    "[Continue working autonomously according to your instructions. Control your state with sys_set_state().]"
                } else {
                    "[You replied without calling a tool again. Call a tool to make progress, or yield with sys_set_state(\"idle\").]"
                };
                self.user_text(nudge)?;
                continue;
            }
            narration = 0;
            if let Some(e) = self.answer(&calls, &cached, &source).await? {
                return Ok(e);
            }
        }
    }

    /// Run one assistant step's tool calls in order and answer them in one
    /// row; `Some` when the turn ends here (a state, `respond`, a pause, an
    /// emptied loop).
    async fn answer(
        &mut self,
        calls: &[Value],
        cached: &CachedConfig,
        source: &str,
    ) -> Result<Option<TurnEnd>, StoreError> {
        let (cfg, typed) = (&cached.value, &cached.typed);
        let mut results = Vec::new();
        let mut signals = Vec::new();
        let mut end: Option<TurnEnd> = None;
        let mut media = Vec::new();
        for call in calls {
            let id = call["id"].as_str().unwrap_or("").to_string();
            let name = call["name"].as_str().unwrap_or("").to_string();
            let input = call["input"].clone();
            self.emit(kind::TOOL_STARTED, source, json!({"name": name, "id": id, "input": event_preview(&input)}));
            let out = match self.gate_and_run(cfg, typed, &id, &name, &input, source).await? {
                Gate::Done(out) => out,
                Gate::Paused(task_id) => {
                    if !results.is_empty() {
                        self.append("user", &Value::Array(results), None, None)?;
                    }
                    return Ok(Some(TurnEnd::AwaitingOwner { task_id }));
                }
            };
            let mut out = out;
            if name == "sys_fetch" && !out.is_error {
                self.keep_fetched_media(&input, &mut out).await;
            }
            // What the raw result showed, before the guards rewrite it.
            if !out.is_error {
                let m = self.media_for(cfg, &name, &out.content);
                if !m.is_empty() {
                    media.push((id.clone(), m));
                }
            }
            let mut out = limit(typed, &name, read_guard(typed, &name, &input, out));
            if let Some(sig) = out.signal.take() {
                signals.push(sig);
            }
            let ty = if out.is_error { kind::TOOL_FAILED } else { kind::TOOL_COMPLETED };
            self.emit(
                ty,
                source,
                json!({"name": name, "id": id, "result": clip(&out.content, EVENT_TEXT), "isError": out.is_error}),
            );
            self.trigger(
                super::triggers::TriggerEvent {
                    ty: "tool_call",
                    source: source.to_string(),
                    data: json!({"toolName": name, "args": strip_reserved(&input), "origin": "agent", "isError": out.is_error}),
                },
                false,
            );
            let mut block = json!({"type": "tool_result", "tool_use_id": id, "content": out.content});
            if out.is_error {
                block["is_error"] = json!(true);
            }
            results.push(block);
            if let Some(s) = out.target_state {
                end = Some(TurnEnd::State { state: s });
            } else if out.end_turn && end.is_none() {
                end = Some(TurnEnd::Completed { text: input["message"].as_str().unwrap_or("").to_string() });
            }
        }
        let cp = self.touched_checkpoint();
        self.append_cp("user", &Value::Array(results), None, None, cp)?;
        for (id, blocks) in media {
            self.transcript.attach_media(&id, blocks);
        }
        // Background calls of a bare executor (no fleet to run them on).
        self.finish_async_calls().await;
        for signal in signals {
            match signal {
                tools::Signal::Compact { instructions } => {
                    self.compact(cfg, instructions.as_deref(), 2, "voluntary loop_compact".into(), source).await?;
                }
                tools::Signal::Clear { start, end: stop } => {
                    if self.clear(cfg, start, stop, source)? {
                        // An empty loop has nothing left to answer.
                        return Ok(Some(TurnEnd::Completed { text: String::new() }));
                    }
                }
            }
        }
        Ok(end)
    }

    /// Tokens in context: the last call's input + output, else an estimate.
    fn token_count(&mut self) -> Result<u64, StoreError> {
        let s = self.session()?;
        Ok(s.last_tokens.unwrap_or(s.chars / 4))
    }

    /// Compaction at the top of an iteration (runtime.md §4): the first
    /// crossing gives a memory-flush grace turn, the next one compacts; the
    /// pre-flight guard compacts before sending when the session grew past
    /// the bound since the last call.
    async fn compaction_check(&mut self, cfg: &Value, source: &str) -> Result<(), StoreError> {
        let threshold = compact_threshold(cfg);
        let count = self.token_count()?;
        if count >= threshold {
            if !self.flush_done {
                self.flush_done = true;
                self.user_text(MEMORY_FLUSH)?;
                self.emit(kind::CONTEXT_INJECTED, source, json!({"category": "memory_flush", "origin": "executor"}));
                return Ok(());
            }
            return self.compact(cfg, None, 0, format!("auto: {count} >= {threshold}"), source).await;
        }
        let est = count.max(self.session()?.chars / 4);
        let bound = if self.flush_done { (threshold + 30_000).min(threshold * 13 / 10) } else { threshold };
        if est >= bound {
            return self.compact(cfg, None, 0, format!("preflight: {est} >= {bound}"), source).await;
        }
        Ok(())
    }

    /// Summarise the session into one `[Loop Compacted]` row, keeping the
    /// last `preserve` rows after it (their seqs unchanged).
    async fn compact(
        &mut self,
        cfg: &Value,
        instructions: Option<&str>,
        preserve: usize,
        reason: String,
        source: &str,
    ) -> Result<(), StoreError> {
        let rows = self.loop_rows()?;
        let keep_from = rows.len().saturating_sub(preserve);
        let (summarise, kept) = rows.split_at(keep_from);
        if summarise.is_empty() {
            return Ok(());
        }
        let transcript = transcript_text(summarise);
        let mut ask = format!(
            "Here is a conversation transcript with {} entries. Produce a concise briefing that lets the agent continue: \
             goals, decisions, facts learned, work done, open questions and next steps. Keep [S<seq>] citations.",
            summarise.len()
        );
        if let Some(i) = instructions.filter(|i| !i.trim().is_empty()) {
            ask.push_str(&format!("\n\n<compaction_instructions>\n{i}\n</compaction_instructions>"));
        }
        ask.push_str(&format!("\n\n<transcript>\n{transcript}\n</transcript>"));
        let model = cfg.pointer("/model/model_id").and_then(Value::as_str).unwrap_or("").to_string();
        let req = ModelRequest {
            model: model.clone(),
            system: COMPACTION_PROMPT.into(),
            messages: Arc::new(vec![crate::providers::Message {
                role: crate::providers::Role::User,
                content: vec![json!({"type": "text", "text": ask})],
            }]),
            tools: Default::default(),
            max_tokens: 2048,
            temperature: Some(0.3),
            effort: None,
            reasoning_tokens: None,
            trailing: None,
        };
        let started = Instant::now();
        let provider = self.provider.clone();
        let result = match provider.stream(req).await {
            Ok(st) => crate::providers::collect(st, provider.id(), |_| {}).await,
            Err(e) => Err(e),
        };
        let (summary, tokens) = match &result {
            Ok(r) if r.text().trim().is_empty() => {
                ("(Summary generation produced empty output.)".to_string(), Some(usage_json(&r.usage)))
            }
            Ok(r) => (r.text(), Some(usage_json(&r.usage))),
            Err(_) => ("(Summary generation failed.)".to_string(), None),
        };
        if let Ok(r) = &result {
            self.settle_spend(cfg, &model, &r.usage, "compaction")?;
        }
        let ev = if result.is_ok() { kind::LLM_COMPLETED } else { kind::LLM_FAILED };
        self.emit(
            ev,
            source,
            json!({"provider": provider.id(), "model": model, "duration_ms": started.elapsed().as_millis() as u64,
            "call_source": "compaction"}),
        );
        let audited = crate::store::config::audit_enabled(cfg, "loop");
        let head = if audited { "[Loop Compacted, audited]" } else { "[Loop Compacted]" };
        let text = format!("{head} {summary}\n\n---\n{COMPACTION_FOOTER}");
        let ord = kept.iter().map(|r| r.ord.unwrap_or(r.seq)).min().map(|k| k - 1);
        let content = json!([{"type": "text", "text": text}]);
        self.replace_rows(
            summarise,
            audited,
            Some(&NewLoopRow { role: "user", content: &content, model: Some(&model), tokens: tokens.as_ref(), ord }),
        )?;
        self.reset_session();
        let new_count = self.session()?.chars / 4;
        self.emit(kind::LOOP_COMPACTED, source, json!({"reason": reason, "new_token_count": new_count}));
        Ok(())
    }

    /// `loop_clear`: a Python-style slice of the rows in display order
    /// (`end` exclusive, negative indices count from the end), or all rows.
    /// Returns true when the loop is now empty.
    fn clear(&mut self, cfg: &Value, start: Option<i64>, end: Option<i64>, source: &str) -> Result<bool, StoreError> {
        let rows = self.loop_rows()?;
        let n = rows.len() as i64;
        let norm = |i: i64| if i < 0 { (n + i).max(0) } else { i.min(n) };
        let (a, b) = (norm(start.unwrap_or(0)), norm(end.unwrap_or(n)));
        let remove = if a < b { &rows[a as usize..b as usize] } else { &rows[..0] };
        let audited = crate::store::config::audit_enabled(cfg, "loop");
        self.replace_rows(remove, audited, None)?;
        self.reset_session();
        self.emit(kind::LOOP_CLEARED, source, json!({"method": "clear"}));
        Ok(self.session()?.rows == 0)
    }

    /// `loop_inject` from code (runtime.md §7.3): write the context row now
    /// and queue it for the next model boundary. `origin` is the runtime's
    /// name for the caller (`lambda:<file>`, `code`, …), never the caller's.
    pub fn loop_inject(&mut self, args: &Value, origin: &str) -> Result<String, InjectError> {
        let c = self.config().map_err(|e| InjectError { code: "INTERNAL_ERROR", message: e.to_string() })?;
        let disabled =
            c.typed.code_execution.as_ref().and_then(|ce| ce.extra.get("loop_inject")) == Some(&Value::Bool(false));
        if disabled {
            return Err(InjectError {
                code: "DISABLED",
                message: "\"loop_inject\" is disabled in code_execution config".into(),
            });
        }
        let max = c.typed.limits.as_ref().and_then(|l| l.max_tool_result_tokens).unwrap_or(16_000).max(1) as usize;
        let (text, key) = inject::build(args, max * 3, origin)?;
        self.session().map_err(|e| InjectError { code: "INTERNAL_ERROR", message: e.to_string() })?;
        let seq = self
            .user_text(&text)
            .map_err(|e| InjectError { code: "INTERNAL_ERROR", message: format!("loop_inject failed: {e}") })?;
        let category = args["category"].as_str().unwrap_or("loop_inject").to_string();
        let chars = args["content"].as_str().map_or(0, |s| s.chars().count());
        self.inject.push(Injection { text: text.clone(), key: key.clone(), seq });
        self.emit(
            kind::CONTEXT_INJECTED,
            "system:executor",
            json!({"category": category, "origin": origin, "key": key, "content": text, "delivery": "next_boundary"}),
        );
        Ok(format!("Queued {category} context for the next model boundary ({chars} chars)."))
    }

    /// The injection queue, for code that runs outside a turn.
    pub fn inject_queue(&self) -> InjectQueue {
        self.inject.clone()
    }

    /// Whether the in-memory caches are loaded (for tests and diagnostics).
    pub fn is_loaded(&self) -> bool {
        self.session.is_some()
    }

    fn reset_session(&mut self) {
        self.session = None;
        self.warned = 0;
        self.context_hash = None;
        self.transcript.reset();
        self.snapshot.reset();
        self.prompt = None;
        self.flush_done = false;
    }

    /// Dynamic instructions for the next call (runtime.md §3.2): unread
    /// inbox hint, one-shot context warnings before compaction, the idle
    /// reminder of autonomous agents. Each part can be switched off in
    /// `context.dynamic_instructions`.
    fn dynamic_instructions(&mut self, cfg: &Value) -> Result<Option<String>, StoreError> {
        let on = |k: &str| cfg["context"]["dynamic_instructions"][k].as_bool() != Some(false);
        let mut parts = Vec::new();
        if on("inbox_hints") && cfg["messaging"]["inbox_mode"].as_bool() != Some(false) {
            // Counted again only when the inbox changed.
            let rev = self.store.rev(crate::store::revs::Table::Inbox);
            let unread = match self.unread {
                Some((r, n)) if r == rev => n,
                _ => {
                    let n = self.store.inbox_unread().unwrap_or(0);
                    self.unread = Some((rev, n));
                    n
                }
            };
            if unread > 0 {
                parts.push(format!(
                    "You have {unread} unread message(s) in your inbox. Use msg_list and msg_read to read them."
                ));
            }
        }
        if on("context_warning") {
            let threshold = compact_threshold(cfg);
            let left = threshold.saturating_sub(self.token_count()?);
            if left > 0 && left <= 5_000 && self.warned < 2 {
                self.warned = 2;
                parts.push(format!("Context almost full: about {left} tokens left before your loop is compacted. Save what matters to your mind files now."));
            } else if left > 5_000 && left <= 15_000 && self.warned < 1 {
                self.warned = 1;
                parts.push(format!("Context filling up: about {left} tokens left before your loop is compacted. Consider saving what matters to your mind files."));
            }
        }
        if on("idle_reminder") && prompt::is_autonomous(cfg) {
            parts.push("When you have nothing left to do, call sys_set_state(\"idle\") to rest.".to_string());
        }
        Ok((!parts.is_empty()).then(|| parts.join("\n\n")))
    }

    /// `[Context: …]` rows (audit only, never replayed): the system prompt
    /// and the dynamic instructions, written when they change.
    fn record_context(&mut self, system: &str, hash: u64, dynamic: Option<&str>) -> Result<(), StoreError> {
        if self.context_hash != Some(hash) {
            self.context_hash = Some(hash);
            self.user_text(&format!("[Context: system_prompt]\n{system}"))?;
            self.emit(
                kind::CONTEXT_INJECTED,
                "system:executor",
                json!({"category": "system_prompt", "bytes": system.len()}),
            );
        }
        if let Some(d) = dynamic
            && self.last_dynamic.as_deref() != Some(d)
        {
            self.last_dynamic = Some(d.to_string());
            self.user_text(&format!("[Context: dynamic_instructions]\n{d}"))?;
            self.emit(
                kind::CONTEXT_INJECTED,
                "system:executor",
                json!({"category": "dynamic_instructions", "bytes": d.len()}),
            );
        }
        Ok(())
    }

    /// The parsed config, the typed view and the advertised tools.
    fn config(&mut self) -> Result<Arc<CachedConfig>, StoreError> {
        let main = self.main_config()?;
        Ok(if self.loops.side.is_some() { self.side_config(main) } else { main })
    }

    /// The main loop's config: the parsed file config and the tools it
    /// advertises (with `loop_send` and `loop_list` once the agent has side
    /// loops or may make them, unless the config declares them itself).
    fn main_config(&mut self) -> Result<Arc<CachedConfig>, StoreError> {
        let rev = self.store.config_rev() ^ self.store.rev(crate::store::revs::Table::Loops).rotate_left(17);
        if let Some(c) = &self.cfg
            && c.rev == rev
        {
            return Ok(c.clone());
        }
        let mut value = self.store.config_value()?;
        if side::manages_loops(&value) || !self.store.loops_list()?.is_empty() {
            side::declare_loop_tools(&mut value);
        }
        let typed = AgentConfig::from_value(&value).unwrap_or_default();
        let tools = advertised_tools(&value, &typed);
        let changed = self.cfg.is_some();
        let c = Arc::new(CachedConfig::new(rev, value, typed, tools));
        self.cfg = Some(c.clone());
        // A config change may change what the runtime applies.
        if changed && let Err(e) = self.record_runtime_snapshot() {
            self.log("warn", "executor", "runtime_snapshot", &e.to_string())?;
        }
        Ok(c)
    }

    /// The system prompt for this request: rebuilt only when the config
    /// revision changed or (checked once a turn) the agent's files or the
    /// fleet's skills folder did. With it, its hash for `record_context`.
    fn system_prompt(&mut self, c: &CachedConfig) -> (Arc<str>, u64) {
        use crate::knowledge::skills;
        let key = match &self.prompt {
            Some(p) if self.knowledge_checked => p.knowledge_key,
            _ => {
                self.knowledge_checked = true;
                (self.store.rev(crate::store::revs::Table::Files), skills::fleet_signature(&skills::fleet_root()))
            }
        };
        if let Some(p) = &self.prompt
            && p.cfg_rev == c.rev
            && p.knowledge_key == key
        {
            return (p.system.clone(), p.hash);
        }
        let knowledge = prompt::knowledge_sections(&self.store, &c.value);
        let mut system = prompt::system_prompt(&self.store, &c.value, &mut self.snapshot, knowledge.as_deref());
        if let Some(section) = self.side_prompt() {
            system.push_str("\n\n");
            system.push_str(&section);
        }
        let system: Arc<str> = system.into();
        let hash = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            system.hash(&mut h);
            h.finish()
        };
        self.prompt = Some(PromptCache { cfg_rev: c.rev, knowledge_key: key, system: system.clone(), hash });
        (system, hash)
    }

    /// The provider request for the current loop.
    fn request(&mut self, c: &CachedConfig) -> Result<ModelRequest, StoreError> {
        let (cfg, typed) = (&c.value, &c.typed);
        let (system, hash) = self.system_prompt(c);
        self.session()?;
        self.drain_loop_mail()?;
        for inj in self.inject.drain() {
            self.transcript.push_injection(&inj.text);
        }
        let messages = self.transcript.view();
        let model = typed.model.clone().unwrap_or_default();
        let effort = cfg["model"]["reasoning"]["effort"].as_str().and_then(crate::providers::Effort::parse);
        let reasoning_tokens = (cfg["model"]["reasoning"]["enabled"] == true)
            .then(|| cfg["model"]["reasoning"]["max_tokens"].as_u64())
            .flatten();
        let trailing = self.dynamic_instructions(cfg)?;
        self.record_context(&system, hash, trailing.as_deref())?;
        Ok(ModelRequest {
            model: model.model_id.unwrap_or_default(),
            trailing,
            system,
            messages,
            tools: c.tools.clone(),
            max_tokens: model.max_tokens.flatten().unwrap_or(4096),
            temperature: model.temperature.flatten(),
            effort,
            reasoning_tokens,
        })
    }

    /// One model call, with backoff retries for transient failures
    /// (`recovery`: 5 attempts, 15 s doubling, capped at 300 s, ±20 %).
    async fn call(&mut self, cfg: &Value, req: ModelRequest, source: &str) -> Result<Response, ProviderError> {
        let r = |k: &str, d: u64| cfg["recovery"][k].as_u64().unwrap_or(d);
        let auto = cfg["recovery"]["auto_retry"].as_bool().unwrap_or(true);
        let (max_attempts, base, max_delay) =
            (r("max_attempts", 5), r("base_delay_ms", 15_000), r("max_delay_ms", 300_000));
        let mut attempt = 0u64;
        loop {
            attempt += 1;
            let started = Instant::now();
            let mut on_delta = self.on_delta.take();
            let provider = self.provider.clone();
            let result = match provider.stream(req.clone()).await {
                Ok(stream) => {
                    let deltas = self.stream_deltas;
                    crate::providers::collect(stream, provider.id(), |e| {
                        if let Some(f) = on_delta.as_mut() {
                            f(e);
                        }
                        if let ModelEvent::TextDelta(t) = e {
                            self.partial.push_str(t);
                        }
                        if deltas {
                            let (k, text) = match e {
                                ModelEvent::TextDelta(t) => ("text", t),
                                ModelEvent::ReasoningDelta(t) => ("thinking", t),
                                _ => return,
                            };
                            self.emit(kind::TURN_DELTA, source, json!({"kind": k, "text": text}));
                        }
                    })
                    .await
                }
                Err(e) => Err(e),
            };
            self.on_delta = on_delta;
            self.partial.clear();
            let ms = started.elapsed().as_millis() as u64;
            match result {
                Ok(resp) => {
                    let mut payload = json!({
                        "provider": self.provider.id(), "model": req.model,
                        "input_tokens": resp.usage.input, "output_tokens": resp.usage.output,
                        "cache_read_tokens": resp.usage.cache_read, "cache_write_tokens": resp.usage.cache_write,
                        "reasoning_tokens": resp.usage.reasoning, "duration_ms": ms,
                        "stop_reason": resp.stop_reason, "call_source": "turn"});
                    if let Some((c, from)) =
                        crate::providers::prices::priced(&self.price_list(), &req.model, &resp.usage)
                    {
                        payload["cost_usd"] = json!(c);
                        payload["cost_source"] = json!(from);
                    }
                    self.emit(kind::LLM_COMPLETED, source, payload);
                    return Ok(resp);
                }
                Err(e) => {
                    self.emit(
                        kind::LLM_FAILED,
                        source,
                        json!({"provider": self.provider.id(), "model": req.model,
                        "duration_ms": ms, "stop_reason": "error", "error": e.message, "call_source": "turn"}),
                    );
                    if e.kind != ErrorKind::Transient || !auto || attempt >= max_attempts {
                        return Err(e);
                    }
                    let exp = base.saturating_mul(1u64 << (attempt - 1).min(20)).min(max_delay);
                    let jitter = 0.8 + rand::random::<f64>() * 0.4;
                    let mut delay = (exp as f64 * jitter) as u64;
                    if let Some(ra) = e.retry_after {
                        delay = delay.max(ra.as_millis() as u64).min(max_delay);
                    }
                    let _ = self.log(
                        "warn",
                        "executor",
                        "provider_error",
                        &format!("{e} (retry {attempt}/{max_attempts} in {delay} ms)"),
                    );
                    self.emit(
                        kind::PROVIDER_RETRY_SCHEDULED,
                        source,
                        json!({"attempt": attempt, "max_attempts": max_attempts,
                        "delay_ms": delay, "next_retry_at": crate::store::now_ms() + delay as i64}),
                    );
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    self.emit(
                        kind::PROVIDER_RETRY_STARTED,
                        source,
                        json!({"attempt": attempt + 1, "max_attempts": max_attempts}),
                    );
                }
            }
        }
    }

    /// Gating of one call from the loop (runtime.md §2.1, §8).
    async fn gate_and_run(
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
        if super::background::async_capable(name) && super::background::wants_async(&input) {
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
    async fn run_any(&mut self, name: &str, input: &Value) -> ToolOutput {
        if super::code::CODE_TOOLS.contains(&name)
            && let Some(bad) = super::code::invalid_input(name, input)
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

    fn record_decision(&mut self, task_id: &str, decision: &Decision, source: &str) -> Result<(), StoreError> {
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
    async fn after_protection(
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

    async fn ask(&mut self, input: &Value, id: &str, source: &str) -> Result<Gate, StoreError> {
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
    fn approve_always(&mut self, cfg: &Value, name: &str) -> Result<(), StoreError> {
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
const MSG_GATED: [&str; 5] = ["msg_send", "agent_discover", "msg_list", "msg_read", "msg_update"];

enum Gate {
    Done(ToolOutput),
    Paused(String),
}

fn strip_reserved(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        for k in tools::RESERVED {
            o.remove(*k);
        }
    }
    v
}

/// The `tokens` JSON of a loop row.
pub fn usage_json(u: &Usage) -> Value {
    let mut t = json!({"input": u.input, "output": u.output});
    if let Some(c) = u.cache_read {
        t["cache_read"] = json!(c);
    }
    if let Some(c) = u.cache_write {
        t["cache_write"] = json!(c);
    }
    if let Some(r) = u.reasoning {
        t["reasoning"] = json!(r);
    }
    t
}

/// Tool-result limits for the model's context (runtime.md §9.1).
/// `fs_read` for the model (runtime.md §9.1): text over
/// `max_file_read_tokens` is cut at whole lines with a footer saying how to
/// read on; a whole file over 300 lines shows its first 50 and how to read
/// the rest; binary content is named. The JSON stays; only `content` moves.
fn read_guard(cfg: &AgentConfig, name: &str, input: &Value, mut out: ToolOutput) -> ToolOutput {
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

fn limit(cfg: &AgentConfig, name: &str, mut out: ToolOutput) -> ToolOutput {
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

/// The default compaction threshold in tokens.
pub const DEFAULT_COMPACT_THRESHOLD: u64 = 100_000;

/// `context.compact_threshold`, then legacy `model.compact_threshold`.
/// The tools a config advertises to the model: enabled and visible,
/// runnable in this build, the messaging ones only when it receives.
pub(crate) fn advertised_tools(value: &Value, typed: &AgentConfig) -> Vec<ToolSpec> {
    let (decls, _) = typed.effective_tools();
    let receive = value["messaging"]["receive"].as_bool().unwrap_or(true);
    decls
        .iter()
        .filter(|d| d.is_enabled() && d.is_visible())
        .filter(|d| receive || !MSG_GATED.contains(&d.name.as_str()))
        .filter_map(|d| {
            if d.name.starts_with("mcp_") {
                return mcp::advertised(value, &d.name);
            }
            let def = tools::def(&d.name)?;
            Some(ToolSpec {
                name: d.name.clone(),
                description: def.description.into(),
                input_schema: tools::advertised_schema(&d.name)?,
            })
        })
        .collect()
}

pub fn compact_threshold(cfg: &Value) -> u64 {
    cfg["context"]["compact_threshold"]
        .as_u64()
        .or_else(|| cfg["model"]["compact_threshold"].as_u64())
        .unwrap_or(DEFAULT_COMPACT_THRESHOLD)
}

/// What the executor tracks of the loop instead of holding its rows.
#[derive(Debug, Default)]
struct Session {
    rows: usize,
    /// Characters of content, for the 4-characters-a-token estimate.
    chars: u64,
    /// `input + output` of the last assistant row.
    last_tokens: Option<u64>,
    /// Tool calls of the last assistant row not answered yet: (id, name).
    pending: Vec<(String, String)>,
}

impl Session {
    fn add(&mut self, r: &LoopRow) {
        self.rows += 1;
        if prompt::is_context_row(r) {
            return;
        }
        self.chars += r.content.to_string().len() as u64;
        let blocks = r.content.as_array().map(Vec::as_slice).unwrap_or_default();
        if r.role == "assistant" {
            if let Some(t) = r.tokens.as_ref()
                && let Some(i) = t.get("input").and_then(Value::as_u64)
            {
                self.last_tokens = Some(i + t.get("output").and_then(Value::as_u64).unwrap_or(0));
            }
            self.pending = blocks
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| (b["id"].as_str().unwrap_or("").to_string(), b["name"].as_str().unwrap_or("").to_string()))
                .collect();
        } else {
            for b in blocks.iter().filter(|b| b["type"] == "tool_result") {
                self.pending.retain(|(id, _)| b["tool_use_id"].as_str() != Some(id.as_str()));
            }
        }
    }
}

/// Ends the kept text of a reply an interrupt cut short.
pub const INTERRUPTED_MARK: &str = "\n\n[interrupted]";

/// The result of a call the runtime stopped in the middle of.
const INTERRUPTED_BY_STOP: &str =
    "[Tool execution interrupted — the runtime stopped before this call returned; its outcome is unknown]";

/// A plain user message (not a `[Context: …]` row): the model must see it.
const MEMORY_FLUSH: &str = "Context is about to be compacted: your context is nearly full. \
Before that happens, write anything you need to keep to mind.md (one line each) or to pages under mind/ \
with an entry in mind/log.md, citing the messages it came from as [S<seq>]. Then continue.";

const COMPACTION_PROMPT: &str = "You compress an agent's working conversation into a briefing it will continue \
from. Be concrete and complete about state, decisions and open questions; drop chatter.";

const COMPACTION_FOOTER: &str = "Your loop was compacted: the briefing above is what survived of the earlier \
conversation, open questions included. Continue from it.";

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_string() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

/// The transcript the summariser reads (last 100 000 characters).
fn transcript_text(rows: &[LoopRow]) -> String {
    let mut out = String::new();
    for r in rows {
        out.push_str(&format!("[{} S{}] ", r.role.to_uppercase(), r.seq));
        for b in r.content.as_array().into_iter().flatten() {
            match b["type"].as_str() {
                Some("text") => out.push_str(b["text"].as_str().unwrap_or("")),
                Some("tool_use") => out.push_str(&format!(
                    "[Called {}({})]",
                    b["name"].as_str().unwrap_or(""),
                    clip(&b["input"].to_string(), 200)
                )),
                Some("tool_result") => {
                    let c = match &b["content"] {
                        Value::String(s) => s.clone(),
                        v => v.to_string(),
                    };
                    out.push_str(&format!("[Result: {}]", clip(&c, 300)));
                }
                Some("thinking") => {
                    out.push_str(&format!("[Thinking: {}]", clip(b["thinking"].as_str().unwrap_or(""), 200)))
                }
                _ => {}
            }
            out.push(' ');
        }
        out.push('\n');
    }
    let n = out.chars().count();
    if n > 100_000 { out.chars().skip(n - 100_000).collect() } else { out }
}

/// A turn's closing checkpoint.
fn closing(id: &str, started: i64, event_type: &str, status: &str, reason: Option<&str>) -> Value {
    let now = crate::store::now_ms();
    let mut cp = json!({"id": id, "status": status, "started_at": started, "updated_at": now,
        "completed_at": now, "event_type": event_type, "scope": "agent", "replay": "not_replayed"});
    if let Some(r) = reason {
        cp["reason"] = json!(r);
    }
    cp
}

/// The config as the executor uses it, for one config revision.
struct CachedConfig {
    rev: u64,
    value: Value,
    typed: AgentConfig,
    tools: Arc<Vec<ToolSpec>>,
    /// Characters of the advertised tools (name, description, schema),
    /// for a budget's estimate of a request without serialising it.
    tool_chars: usize,
}

impl CachedConfig {
    fn new(rev: u64, value: Value, typed: AgentConfig, tools: Vec<ToolSpec>) -> Self {
        let tool_chars =
            tools.iter().map(|t| t.name.len() + t.description.len() + t.input_schema.to_string().len()).sum();
        CachedConfig { rev, value, typed, tools: Arc::new(tools), tool_chars }
    }
}

/// The system prompt of the current session, kept while the config
/// revision and the knowledge sections' sources stay the same (the
/// template snapshot is fixed for a session, and a reset drops this).
struct PromptCache {
    cfg_rev: u64,
    knowledge_key: (u64, u64),
    system: Arc<str>,
    hash: u64,
}

/// Run large synchronous work (archiving a whole loop) without stalling
/// the other tasks of a multi-threaded runtime.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Events keep previews, not payloads: the bus ring holds a thousand of
/// them and every subscriber gets a copy.
const EVENT_TEXT: usize = 4000;

/// A tool input for an event: as is when small, else a truncated preview.
fn event_preview(v: &Value) -> Value {
    let text = v.to_string();
    if text.len() <= EVENT_TEXT {
        return v.clone();
    }
    json!({"_truncated": true, "preview": clip(&text, EVENT_TEXT)})
}
