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
mod compaction;
mod compute;
mod computer;
mod gate;
mod mcp;
pub(crate) mod media;
mod owner;
mod park;
mod request;
pub mod side;
mod skills;
pub mod snapshot;
mod streams;
mod ws;

use gate::{Gate, limit, read_guard, strip_reserved};
pub(crate) use request::advertised_tools;
use request::{CachedConfig, PromptCache};

use super::bus::Bus;
use super::inject::{self, InjectError, InjectQueue, Injection};
use super::prompt;
use crate::protocol::{Envelope, kind};
use crate::providers::{ErrorKind, ModelEvent, ModelRequest, Provider, ProviderError, Response, Usage};
use crate::store::loop_rows::{LoopRow, NewLoopRow};
use crate::store::meta::MetaProtection;
use crate::store::template::Snapshot;
use crate::store::{Denial, Store, StoreError};
use crate::tools;

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

    /// Whether `on_start` has anything to do (a write).
    pub(crate) fn has_start_work(&self) -> bool {
        self.seq_later || self.snapshot_on_start
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
        self.store.hold_view(false);
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
        self.store.hold_view(false);
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
            // The reads up to the model call share one answer to "did
            // another connection commit?" (`Store::hold_view`); a
            // compaction lets go of it before it waits on its model.
            self.store.hold_view(true);
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
            let request = self.request(&cached);
            self.store.hold_view(false);
            let request = request?;
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

pub use compaction::compact_threshold;

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

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_string() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
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
