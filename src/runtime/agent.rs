//! One loaded agent as an actor: a tokio task that owns the executor (and
//! so the file's writer) and takes commands from a channel. While a turn
//! runs it keeps listening: approvals and answers reach the waiting turn,
//! an owner message aborts the turn and starts a new one on the message,
//! a state change ends it. Every front end talks to agents this way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use super::executor::{ApprovalRequest, Decision, Executor, Owner, TurnEnd};

/// What an agent actor is asked to do.
#[derive(Debug)]
pub enum AgentCommand {
    Chat(String),
    /// An owner message whose turn takes this id (a client following it).
    ChatAs {
        text: String,
        turn_id: String,
    },
    Interrupt,
    Approve {
        task_id: String,
        always: bool,
    },
    Deny {
        task_id: String,
        feedback: Option<String>,
    },
    Answer {
        task_id: String,
        text: String,
    },
    /// `idle`, `hibernate` or `off`.
    SetState(String),
    /// Lift a suspension (`max_active_turns` reached): the turn goes on.
    Resume,
    /// Owner work on the agent's file (an edited file written back, a
    /// query): runs at once when no turn runs, else right after the turn.
    With(OwnerWork),
    /// Send an ALF message as this agent without a turn (`msg_send`'s
    /// input): an owner's or an MCP client's message from this identity.
    /// Queued behind a running turn.
    Send {
        input: serde_json::Value,
        reply: tokio::sync::oneshot::Sender<crate::tools::ToolOutput>,
    },
    /// An agent-scope trigger fired: wake the model with this message
    /// (queued behind a running turn).
    Wake {
        text: String,
        event_type: String,
    },
    /// An owner message to a side loop: a turn of that loop, queued behind
    /// a running turn (a side loop never interrupts another turn).
    LoopChat {
        name: String,
        text: String,
        turn_id: Option<String>,
    },
}

/// A side-loop turn waiting to run.
struct LoopRun {
    name: String,
    text: Option<String>,
    event_type: &'static str,
    turn_id: Option<String>,
}

/// A closure run on the actor's executor.
pub struct OwnerWork(pub Box<dyn FnOnce(&mut Executor) + Send>);

impl std::fmt::Debug for OwnerWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OwnerWork")
    }
}

/// Approvals and asks wait here for the owner's command.
#[derive(Default)]
pub struct Waiting {
    approvals: Mutex<HashMap<String, oneshot::Sender<Decision>>>,
    answers: Mutex<HashMap<String, oneshot::Sender<String>>>,
}

impl Owner for Waiting {
    fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, Decision> {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut m) = self.approvals.lock() {
            m.insert(req.task_id.clone(), tx);
        }
        // A dropped sender (turn aborted, actor gone) denies.
        Box::pin(async move { rx.await.unwrap_or(Decision::Deny { feedback: None }) })
    }

    fn answer<'a>(&'a self, task_id: &'a str, _question: &'a str) -> BoxFuture<'a, Option<String>> {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut m) = self.answers.lock() {
            m.insert(task_id.to_string(), tx);
        }
        Box::pin(async move { Some(rx.await.unwrap_or_default()) })
    }
}

impl Waiting {
    fn decide(&self, task_id: &str, d: Decision) -> bool {
        let tx = self.approvals.lock().ok().and_then(|mut m| m.remove(task_id));
        tx.map(|t| t.send(d).is_ok()).unwrap_or(false)
    }

    fn answer_ask(&self, task_id: &str, text: String) -> bool {
        let tx = self.answers.lock().ok().and_then(|mut m| m.remove(task_id));
        tx.map(|t| t.send(text).is_ok()).unwrap_or(false)
    }

    fn clear(&self) {
        if let Ok(mut m) = self.approvals.lock() {
            m.clear();
        }
        if let Ok(mut m) = self.answers.lock() {
            m.clear();
        }
    }
}

/// A running agent.
#[derive(Clone)]
pub struct AgentHandle {
    pub agent_id: String,
    tx: mpsc::UnboundedSender<AgentCommand>,
    /// The agent's system dispatch lanes, to say what waits in them.
    lanes: Option<std::sync::Weak<super::triggers::Dispatcher>>,
}

impl AgentHandle {
    /// Lanes with work waiting: (lane, running, queued).
    pub fn lane_waits(&self) -> Vec<(String, usize, usize)> {
        self.lanes.as_ref().and_then(std::sync::Weak::upgrade).map(|d| d.waiting()).unwrap_or_default()
    }

    /// A sender that does not keep the actor alive.
    pub fn weak(&self) -> mpsc::WeakUnboundedSender<AgentCommand> {
        self.tx.downgrade()
    }

    /// Send a command; false when the actor has stopped.
    pub fn send(&self, cmd: AgentCommand) -> bool {
        self.tx.send(cmd).is_ok()
    }
}

/// The owner to build an executor with, so its approvals go through the
/// actor's commands.
pub fn waiting_owner() -> Arc<Waiting> {
    Arc::new(Waiting::default())
}

/// Start the actor. `owner` must be the one the executor was built with.
/// The task ends when every handle is dropped, or the agent is turned off;
/// it returns the executor so the file can be closed.
pub fn spawn(ex: Executor, owner: Arc<Waiting>) -> (AgentHandle, tokio::task::JoinHandle<Executor>) {
    spawn_with(ex, owner, TIMER_TICK, Arc::new(AtomicBool::new(true)))
}

/// Checkpoint the WAL when the writes since the last one made it due
/// (`Store::defer_checkpoints`: the actor's connection makes none on its
/// own), off the async threads, as it syncs the file. Every kind of work
/// passes here, not only turns: owner writes between turns once grew the
/// WAL without bound (110 MB after a minute of `PUT`s) and left the kernel
/// to throttle the writes as dirty pages piled up.
pub(crate) fn checkpoint_if_due(ex: &mut Executor) {
    if ex.store.checkpoint_due() {
        let store = &mut ex.store;
        if let Err(e) = super::executor::blocking(|| store.checkpoint_if_due()) {
            let _ = ex.log("warn", "store", "checkpoint", &e.to_string());
        }
    }
}

/// The timer poll tick (runtime.md §6.2).
pub const TIMER_TICK: std::time::Duration = std::time::Duration::from_secs(5);

/// Quiet ticks after which an idle agent is parked: its caches dropped
/// and its file's connection closed until the next use (0–5 s after its
/// last work; opening again costs well under a millisecond).
pub const PARK_AFTER_TICKS: u32 = 1;

/// `spawn` with another timer tick (tests).
pub fn spawn_with_tick(
    ex: Executor,
    owner: Arc<Waiting>,
    tick: std::time::Duration,
) -> (AgentHandle, tokio::task::JoinHandle<Executor>) {
    spawn_with(ex, owner, tick, Arc::new(AtomicBool::new(true)))
}

/// `spawn`, loaded but not started unless `started` is set: a dormant
/// agent answers its owner but its timers wait until it is started
/// (`Resume`), which sets the flag.
pub fn spawn_with(
    mut ex: Executor,
    owner: Arc<Waiting>,
    tick: std::time::Duration,
    started: Arc<AtomicBool>,
) -> (AgentHandle, tokio::task::JoinHandle<Executor>) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let dispatcher = triggers_for(&mut ex, tx.downgrade());
    let handle =
        AgentHandle { agent_id: ex.agent_id().to_string(), tx, lanes: dispatcher.as_ref().map(Arc::downgrade) };
    let task = tokio::spawn(async move {
        // The start's write (the first of the session: a new WAL and its
        // syncs) waits with `block_in_place` on this thread, as a park
        // does: the async workers answering the load that spawned this
        // actor go on without it, and what it allocates comes from the
        // allocator arena this agent's turns and park use (200 idle agents
        // in `adf bench daemon`: 24-28 KB each with the write on a
        // blocking-pool thread, 23-25 KB here).
        if ex.has_start_work() {
            super::executor::blocking(|| ex.on_start());
        }
        let mut announced = false;
        let mut next: Option<String> = None;
        // The id chosen for the turn of `next`, if its sender chose one.
        let mut next_turn: Option<String> = None;
        let mut resume = false;
        // An approval given for a turn that paused before this actor ran.
        let mut paused: Option<(String, Decision)> = None;
        let mut timer_wakes: std::collections::VecDeque<(String, String)> = Default::default();
        let mut quiet_ticks: u32 = 0;
        let mut loop_runs: std::collections::VecDeque<LoopRun> = Default::default();
        // Turns each continuous loop took since it was last woken.
        let mut continuous: HashMap<String, u32> = HashMap::new();
        // Owner work that arrived during a turn.
        let mut deferred: Vec<OwnerWork> = Vec::new();
        let mut deferred_sends: Vec<(serde_json::Value, tokio::sync::oneshot::Sender<crate::tools::ToolOutput>)> =
            Vec::new();
        let mut ticker = tokio::time::interval(tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // A WAL checkpoint made due by the last work (a turn's commits,
            // the owner's writes) runs between pieces of work.
            checkpoint_if_due(&mut ex);
            let mut side: Option<LoopRun> = None;
            let (message, event_type) = match next.take() {
                Some(m) => {
                    ex.next_turn_id = next_turn.take();
                    (m, "chat")
                }
                None if std::mem::take(&mut resume) => (String::new(), "resume"),
                None if paused.is_some() => (String::new(), "approval"),
                None => match timer_wakes.pop_front() {
                    // A stale inbox wake (nothing unread any more) is skipped.
                    Some((_, ty)) if ty == "inbox" => match ex.inbox_wake_text() {
                        Some(t) => (t, "trigger"),
                        None => continue,
                    },
                    Some((w, ty)) => (
                        w,
                        match ty.as_str() {
                            "timer" => "timer",
                            "loop" => "loop",
                            _ => "trigger",
                        },
                    ),
                    None if !loop_runs.is_empty() && ex.state != "off" => match loop_runs.pop_front() {
                        Some(run) => {
                            let ty = run.event_type;
                            side = Some(run);
                            (String::new(), ty)
                        }
                        None => continue,
                    },
                    None => match tokio::select! {
                        cmd = rx.recv() => Some(cmd),
                        _ = ticker.tick() => None,
                    } {
                        None => {
                            let started_now = started.load(Ordering::Relaxed);
                            // A parked agent's tick reads no file unless a
                            // timer is due or another connection wrote.
                            if (announced || !started_now) && ex.parked_and_quiet(crate::store::now_ms()) {
                                continue;
                            }
                            if started_now && !announced {
                                announced = true;
                                ex.trigger(
                                    super::triggers::TriggerEvent {
                                        ty: "startup",
                                        source: "system:runtime".into(),
                                        data: serde_json::Value::Null,
                                    },
                                    false,
                                );
                            }
                            if started.load(Ordering::Relaxed)
                                && let Ok(w) = ex.fire_timers(crate::store::now_ms())
                            {
                                timer_wakes.extend(w.into_iter().map(|w| (w, "timer".to_string())));
                                ex.run_system().await;
                            }
                            if started.load(Ordering::Relaxed)
                                && !matches!(ex.state.as_str(), "off" | "hibernate" | "suspended")
                            {
                                for name in ex.due_loops(crate::store::now_ms()) {
                                    continuous.remove(&name);
                                    loop_runs.push_back(LoopRun {
                                        name,
                                        text: Some("[Scheduled run]".into()),
                                        event_type: "schedule",
                                        turn_id: None,
                                    });
                                }
                            }
                            quiet_ticks = quiet_ticks.saturating_add(1);
                            // Work a tick found (a timer's wake) runs first.
                            // The park checkpoints the file (two syncs)
                            // and closes it: the worker's other tasks move
                            // on while it waits (`block_in_place`, on this
                            // thread: what the park frees goes back to the
                            // allocator arena the turns use).
                            if quiet_ticks >= PARK_AFTER_TICKS
                                && timer_wakes.is_empty()
                                && loop_runs.is_empty()
                                && !ex.is_parked()
                            {
                                super::executor::blocking(|| ex.park());
                            }
                            continue;
                        }
                        Some(cmd) => match cmd {
                            None => break,
                            Some(AgentCommand::Chat(m)) => {
                                if ex.state == "off" {
                                    continue;
                                }
                                ex.trigger(chat_event(&m), true);
                                (m, "chat")
                            }
                            Some(AgentCommand::ChatAs { text, turn_id }) => {
                                if ex.state == "off" {
                                    continue;
                                }
                                ex.next_turn_id = Some(turn_id);
                                ex.trigger(chat_event(&text), true);
                                (text, "chat")
                            }
                            Some(AgentCommand::Wake { text, event_type }) => {
                                // Checked again now: the state may have moved.
                                let ok = super::triggers::agent_may_fire(
                                    &ex.state,
                                    if event_type == "timer" { "on_timer" } else { "" },
                                );
                                if !ok {
                                    continue;
                                }
                                if event_type == "inbox" {
                                    match ex.inbox_wake_text() {
                                        Some(t) => (t, "trigger"),
                                        None => continue,
                                    }
                                } else {
                                    (text, "trigger")
                                }
                            }
                            Some(AgentCommand::SetState(s)) => {
                                ex.interrupted("owner_state_transition", &s);
                                if s == "off" {
                                    break;
                                }
                                drop_backlog(&mut ex, &mut timer_wakes);
                                continue;
                            }
                            Some(AgentCommand::Approve { task_id, always }) => {
                                let d = Decision::Approve { always };
                                if !ex.answer_async(&task_id, &d) {
                                    paused = Some((task_id, d));
                                }
                                continue;
                            }
                            Some(AgentCommand::Deny { task_id, feedback }) => {
                                let d = Decision::Deny { feedback };
                                if !ex.answer_async(&task_id, &d) {
                                    paused = Some((task_id, d));
                                }
                                continue;
                            }
                            Some(AgentCommand::With(w)) => {
                                (w.0)(&mut ex);
                                continue;
                            }
                            Some(AgentCommand::Send { input, reply }) => {
                                let _ = reply.send(ex.msg_send(&input).await);
                                continue;
                            }
                            Some(AgentCommand::Resume) => {
                                started.store(true, Ordering::Relaxed);
                                continue;
                            }
                            Some(AgentCommand::LoopChat { name, text, turn_id }) => {
                                continuous.remove(&name);
                                loop_runs.push_back(LoopRun { name, text: Some(text), event_type: "chat", turn_id });
                                continue;
                            }
                            Some(_) => continue,
                        },
                    },
                },
            };
            // The owner's slash commands: `/idle`, `/hibernate` and `/stop`
            // are the agent's wherever they are typed; `/compact` and
            // `/clear` typed to main act here (a side loop's act in its
            // turn); anything else is a message.
            use super::slash::Slash;
            let typed = match &side {
                Some(r) => r.text.as_deref().filter(|_| r.event_type == "chat"),
                None => Some(message.as_str()).filter(|_| event_type == "chat"),
            };
            let slash = typed.map(super::slash::parse).unwrap_or(Slash::Text);
            let (message, event_type) = match slash {
                Slash::State(s) => {
                    ex.interrupted("owner_state_transition", s);
                    if s == "off" {
                        break;
                    }
                    drop_backlog(&mut ex, &mut timer_wakes);
                    continue;
                }
                Slash::Compact(keep) if side.is_none() => (keep.unwrap_or("").to_string(), "compact"),
                Slash::Clear if side.is_none() => {
                    if let Err(e) = ex.clear_loop_as_owner() {
                        let _ = ex.log("error", "owner", "clear_failed", &e.to_string());
                    }
                    continue;
                }
                _ => (message, event_type),
            };
            quiet_ticks = 0;
            // A side loop whose turn completed, to turn again if continuous.
            let mut continuing: Option<String> = None;
            let mut stop = false;
            let mut suspended = false;
            // How a dropped turn ended: (reason, state).
            let mut cut: Option<(&'static str, String)> = None;
            {
                let approval = if event_type == "approval" { paused.take() } else { None };
                // Boxed: the turn's state machine is large, and an idle
                // actor should not carry its space.
                let mut turn: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send + '_>> = match &side {
                    Some(run) => {
                        ex.next_turn_id = run.turn_id.clone();
                        Box::pin(ex.side_turn(&run.name, run.text.as_deref(), run.event_type))
                    }
                    None => Box::pin(ex.turn_for(&message, event_type, approval)),
                };
                loop {
                    tokio::select! {
                        end = &mut turn => {
                            match &end {
                                Ok(TurnEnd::State { state }) if state == "off" && side.is_none() => stop = true,
                                Ok(TurnEnd::Suspended) if side.is_none() => suspended = true,
                                _ => {}
                            }
                            if let Some(run) = &side {
                                continuing = matches!(end, Ok(TurnEnd::Completed { .. }) | Ok(TurnEnd::State { .. }))
                                    .then(|| run.name.clone());
                            }
                            break;
                        }
                        cmd = rx.recv() => match cmd {
                            None => {
                                cut = Some(("executor_stopped", "off".into()));
                                stop = true;
                                break;
                            }
                            Some(AgentCommand::Chat(m)) => {
                                next = Some(m);
                                next_turn = None;
                                cut = Some(("user_interrupt_restart", "active".into()));
                                break;
                            }
                            Some(AgentCommand::ChatAs { text, turn_id }) => {
                                next = Some(text);
                                next_turn = Some(turn_id);
                                cut = Some(("user_interrupt_restart", "active".into()));
                                break;
                            }
                            Some(AgentCommand::Interrupt) => {
                                cut = Some(("user_interrupt_restart", "idle".into()));
                                break;
                            }
                            Some(AgentCommand::SetState(s)) => {
                                stop = s == "off";
                                cut = Some(("owner_state_transition", s));
                                break;
                            }
                            Some(AgentCommand::Approve { task_id, always }) => {
                                owner.decide(&task_id, Decision::Approve { always });
                            }
                            Some(AgentCommand::Deny { task_id, feedback }) => {
                                owner.decide(&task_id, Decision::Deny { feedback });
                            }
                            Some(AgentCommand::Answer { task_id, text }) => {
                                owner.answer_ask(&task_id, text);
                            }
                            Some(AgentCommand::Resume) => {}
                            Some(AgentCommand::With(w)) => deferred.push(w),
                            Some(AgentCommand::Send { input, reply }) => deferred_sends.push((input, reply)),
                            Some(AgentCommand::LoopChat { name, text, turn_id }) => {
                                continuous.remove(&name);
                                loop_runs.push_back(LoopRun { name, text: Some(text), event_type: "chat", turn_id });
                            }
                            Some(AgentCommand::Wake { text, event_type }) => {
                                // Latest wins for inbox wakes: one wake covers a burst.
                                if event_type == "inbox" {
                                    timer_wakes.retain(|(_, t)| t != "inbox");
                                }
                                timer_wakes.push_back((text, event_type));
                            }
                        },
                    }
                }
            }
            // A side turn that was cut ends in its own loop, then main is
            // back in place for everything else.
            if side.is_some()
                && let Some((reason, _)) = &cut
            {
                ex.interrupted(reason, "idle");
            }
            ex.leave_side();
            if side.is_some() && cut.as_ref().is_some_and(|(r, _)| *r != "owner_state_transition") {
                cut = None;
            }
            queue_loop_wakes(&mut ex, &mut timer_wakes, &mut loop_runs, &mut continuous);
            // A continuous loop turns again up to its own turn limit; a
            // paused one (its budget spent, or the owner's pause) stops.
            if let Some(name) = continuing
                && let Some(def) = ex
                    .store
                    .loop_get(&name)
                    .ok()
                    .flatten()
                    .filter(|d| d.mode == crate::store::loops::LoopMode::Continuous && d.status != "paused")
            {
                let n = continuous.entry(name.clone()).or_insert(0);
                *n += 1;
                if *n < def.turn_limit() && !loop_runs.iter().any(|r| r.name == name) {
                    loop_runs.push_back(LoopRun {
                        name,
                        text: Some("[Continue toward your goal.]".into()),
                        event_type: "continue",
                        turn_id: None,
                    });
                }
            }
            for w in deferred.drain(..) {
                (w.0)(&mut ex);
            }
            for (input, reply) in deferred_sends.drain(..) {
                let _ = reply.send(ex.msg_send(&input).await);
            }
            // The turn future is gone: waiting approvals and asks with it.
            owner.clear();
            // Before a suspension's wait, too.
            checkpoint_if_due(&mut ex);
            if let Some((reason, state)) = cut {
                if reason == "owner_state_transition" {
                    let _ = ex.note(&format!("[System] Turn ended by owner; state set to {state}."));
                }
                ex.interrupted(reason, &state);
            }
            if suspended {
                // Wait for the owner: resume, a new message, a state change;
                // silence past `limits.suspend_timeout_ms` turns it off.
                let wait = ex.suspend_timeout();
                let deadline = tokio::time::sleep(wait);
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        _ = &mut deadline => { ex.suspension_refused(true); stop = true; break; }
                        cmd = rx.recv() => match cmd {
                            None => { stop = true; break; }
                            Some(AgentCommand::Resume) => { resume = true; break; }
                            Some(AgentCommand::Chat(m)) => {
                                ex.suspension_refused(false);
                                ex.revive();
                                next = Some(m);
                                next_turn = None;
                                break;
                            }
                            Some(AgentCommand::ChatAs { text, turn_id }) => {
                                ex.suspension_refused(false);
                                ex.revive();
                                next = Some(text);
                                next_turn = Some(turn_id);
                                break;
                            }
                            Some(AgentCommand::SetState(s)) => {
                                if s == "off" { ex.suspension_refused(false); stop = true; } else { ex.interrupted("owner_state_transition", &s); }
                                break;
                            }
                            Some(AgentCommand::With(w)) => {
                                (w.0)(&mut ex);
                                checkpoint_if_due(&mut ex);
                            }
                            Some(AgentCommand::Send { input, reply }) => {
                                let _ = reply.send(ex.msg_send(&input).await);
                            }
                            Some(_) => {}
                        },
                    }
                }
            }
            drop_backlog(&mut ex, &mut timer_wakes);
            if stop {
                break;
            }
        }
        if let Some(d) = &dispatcher {
            d.shutdown();
        }
        ex
    });
    (handle, task)
}

/// Wakes a turn asked for with `loop_send`: main's go with the other
/// wakes, a side loop's into the loop queue (once each).
fn queue_loop_wakes(
    ex: &mut Executor,
    wakes: &mut std::collections::VecDeque<(String, String)>,
    runs: &mut std::collections::VecDeque<LoopRun>,
    continuous: &mut HashMap<String, u32>,
) {
    for name in ex.take_loop_wakes() {
        if name == "main" {
            if !wakes.iter().any(|(_, t)| t == "loop") {
                wakes.push_back((String::new(), "loop".into()));
            }
        } else if !runs.iter().any(|r| r.name == name) {
            continuous.remove(&name);
            runs.push_back(LoopRun { name, text: None, event_type: "loop", turn_id: None });
        }
    }
}

/// Entering `hibernate` (or `off`, `suspended`) drops the queued
/// agent-scope wakes (runtime.md §1.2).
fn drop_backlog(ex: &mut Executor, queue: &mut std::collections::VecDeque<(String, String)>) {
    if queue.is_empty() || !matches!(ex.state.as_str(), "hibernate" | "off" | "suspended") {
        return;
    }
    let n = queue.len();
    queue.clear();
    ex.emit(
        crate::protocol::kind::TRIGGER_DROPPED,
        "system:runtime",
        serde_json::json!({"reason": "hibernate", "dropped": n}),
    );
}

/// The owner's chat as an event for `on_chat` system targets.
fn chat_event(text: &str) -> super::triggers::TriggerEvent {
    super::triggers::TriggerEvent {
        ty: "chat",
        source: "system:owner".into(),
        data: serde_json::json!({"message": {"role": "user", "content": [{"type": "text", "text": text}]}}),
    }
}

/// Give the executor its trigger dispatcher: runner executors on sibling
/// connections for system lambdas, and agent-scope wakes sent back to this
/// actor (weakly: the actor still ends when its handles are gone).
fn triggers_for(
    ex: &mut Executor,
    tx: mpsc::WeakUnboundedSender<AgentCommand>,
) -> Option<Arc<super::triggers::Dispatcher>> {
    if ex.store.is_read_only() {
        return None;
    }
    let path = ex.store.path().to_path_buf();
    let (provider, bus) = (ex.provider(), ex.bus());
    let wake = move |text: String, event_type: String| {
        if let Some(tx) = tx.upgrade() {
            let _ = tx.send(AgentCommand::Wake { text, event_type });
        }
    };
    let slot: Arc<Mutex<Option<std::sync::Weak<super::triggers::Dispatcher>>>> = Arc::new(Mutex::new(None));
    let slot2 = slot.clone();
    let factory = move || {
        let store = crate::store::Store::sibling(&path).ok()?;
        let mut runner = Executor::new(store, provider.clone(), bus.clone(), Arc::new(super::executor::Absent)).ok()?;
        if let Some(d) = slot2.lock().ok().and_then(|s| s.as_ref().and_then(std::sync::Weak::upgrade)) {
            runner.set_dispatcher(d);
        }
        Some(runner)
    };
    let d = super::triggers::Dispatcher::new(ex.agent_id().to_string(), ex.bus(), Box::new(factory), Box::new(wake));
    if let Ok(mut s) = slot.lock() {
        *s = Some(Arc::downgrade(&d));
    }
    if let Ok(mut st) = d.state.lock() {
        *st = ex.state.clone();
    }
    ex.set_dispatcher(d.clone());
    Some(d)
}
