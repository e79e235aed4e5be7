//! One agent's executor: the turn loop of runtime.md §2. A trigger message
//! goes into the loop; the model is called with the advertised tools; tool
//! calls are gated (enabled, restricted → approval, protection → override
//! approval), run, and answered in one row; the turn ends on plain text
//! (interactive), a state change, or a failure. Everything is a loop row
//! or an event; the turn checkpoint in meta makes a crash visible later.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{Value, json};

mod adapters;
mod budget;
mod compaction;
mod compute;
mod computer;
mod events;
mod gate;
mod mcp;
pub(crate) mod media;
mod owner;
mod park;
mod recovery;
mod request;
pub mod side;
mod skills;
pub mod snapshot;
mod streams;
mod timers;
mod turn;
mod ws;

use events::SEQ_KEY;
use recovery::CHECKPOINT;
pub use recovery::INTERRUPTED_MARK;
pub(crate) use request::advertised_tools;
use request::{CachedConfig, PromptCache};

use super::bus::Bus;
use super::inject::{self, InjectError, InjectQueue, Injection};
use super::prompt;
use crate::protocol::kind;
use crate::providers::{ModelEvent, Provider, Usage};
use crate::store::loop_rows::{LoopRow, NewLoopRow};
use crate::store::template::Snapshot;
use crate::store::{Denial, Store, StoreError};

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
        let agent_id = store.with_config(|c| c.get("id").and_then(Value::as_str).unwrap_or("").to_string())?;
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

    /// Give the file back (the executor is done).
    pub fn store_into(self) -> Store {
        self.store
    }

    /// Resolve `sys_fetch` names with `r` (tests point names anywhere).
    pub fn set_resolver(&mut self, r: Arc<dyn super::egress::Resolve>) {
        self.resolver = r;
    }

    /// Whether `on_start` has anything to do (a write).
    pub(crate) fn has_start_work(&self) -> bool {
        self.seq_later || self.snapshot_on_start
    }

    /// Make this executor what a runtime runs for a loaded agent
    /// (`Fleet::load`, and the benchmarks that stand for it): what a crash
    /// left is settled now, and the session's first write (the runtime
    /// snapshot and the event counter's block, which begin the WAL with its
    /// syncs) waits for the actor's start (`on_start`): after the load's
    /// answer, before any turn.
    pub(crate) fn prepare_loaded(&mut self) -> Result<(), StoreError> {
        self.recover()?;
        self.snapshot_on_start = true;
        self.seq_later = true;
        // Loaded agents mostly wait: keep only what the next turn needs.
        self.store.release_memory();
        Ok(())
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
            .with_config(|c| c.pointer("/limits/suspend_timeout_ms").and_then(Value::as_u64))
            .ok()
            .flatten()
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

    /// Append an owner/system notice to the loop.
    pub fn note(&mut self, text: &str) -> Result<i64, StoreError> {
        self.user_text(text)
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

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_string() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

/// Run large synchronous work (archiving a whole loop) without stalling
/// the other tasks of a multi-threaded runtime.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}
