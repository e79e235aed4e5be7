//! Triggers (runtime.md §5): which targets an event fires, and how.
//! `evaluate` is the pure part: the trigger's filters, the self-change
//! rule, state gating, one dispatch per matching target. The `Dispatcher`
//! is the moving part, one per agent: timing modifiers (debounce, interval,
//! batch), and the system dispatch lanes — per `<trigger>:<lambda>`, one or
//! four at a time, 64 waiting, beyond that dropped and logged — running
//! lambdas on runner executors that write through sibling connections to
//! the file, so system work never waits for (or blocks) the agent's turn.
//! Agent-scope dispatches go to the agent's actor as wake messages.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::{Value, json};

use super::executor::Executor;
use crate::protocol::{Envelope, kind};

/// An event a trigger may fire on.
#[derive(Debug, Clone)]
pub struct TriggerEvent {
    /// `file_change`, `tool_call`, `llm_call`, `startup`, `chat`, `timer`…
    pub ty: &'static str,
    /// `agent:<turn>`, `lambda:<path>:<fn>`, `system:<subsystem>`.
    pub source: String,
    pub data: Value,
}

impl TriggerEvent {
    pub fn trigger_name(&self) -> String {
        match self.ty {
            "log_entry" => "on_logs".into(),
            t => format!("on_{t}"),
        }
    }

    /// The envelope a lambda receives.
    pub fn envelope(&self) -> Value {
        let time = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string();
        let mut e =
            json!({"id": crate::store::create::nanoid(16), "type": self.ty, "source": self.source, "time": time});
        if self.ty != "startup" {
            e["data"] = self.data.clone();
            if let Some(d) = e["data"].as_object_mut() {
                d.remove("_before");
            }
        }
        e
    }
}

/// One target's timing modifier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Timing {
    Now,
    Debounce(u64),
    Interval(u64),
    Batch { ms: u64, count: Option<usize> },
}

/// What one matching target asks for.
#[derive(Debug, Clone)]
pub struct Dispatch {
    pub trigger: String,
    pub index: usize,
    pub system: bool,
    /// System scope: `lambda` (path[:fn]) or `command`.
    pub lambda: Option<String>,
    pub command: Option<String>,
    pub warm: bool,
    pub timing: Timing,
    pub event: TriggerEvent,
}

/// `*` → `.*`, everything else literal, anchored (§5.3).
pub fn glob(pattern: &str, text: &str) -> bool {
    fn go(p: &[u8], t: &[u8]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some((b'*', rest)) => (0..=t.len()).any(|i| go(rest, &t[i..])),
            Some((c, rest)) => t.split_first().is_some_and(|(d, tr)| c == d && go(rest, tr)),
        }
    }
    go(pattern.as_bytes(), text.as_bytes())
}

fn strings(v: &Value) -> Vec<&str> {
    match v {
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        Value::String(s) => vec![s.as_str()],
        _ => Vec::new(),
    }
}

/// Whether a target's filter admits the event (§5.3, §5.5).
fn admits(ev: &TriggerEvent, filter: &Value, target: &Value) -> bool {
    let f = |k: &str| filter.get(k).filter(|v| !v.is_null());
    match ev.ty {
        "file_change" => {
            if let Some(w) = f("watch").and_then(Value::as_str)
                && !glob(w, ev.data["path"].as_str().unwrap_or(""))
            {
                return false;
            }
            let own = ev.source.starts_with("agent:") || ev.source.starts_with("lambda:");
            if own && f("include_self") != Some(&Value::Bool(true)) {
                return false;
            }
            // A lambda never receives its own change.
            if let Some(l) = target["lambda"].as_str() {
                let (path, func) = crate::sandbox::prepare::split_target(l);
                if ev.source == format!("lambda:{path}:{func}") {
                    return false;
                }
            }
            true
        }
        "inbox" => {
            let m = &ev.data["message"];
            f("source").and_then(Value::as_str).is_none_or(|s| m["source"].as_str() == Some(s))
                && f("sender").and_then(Value::as_str).is_none_or(|s| m["from"].as_str() == Some(s))
        }
        "outbox" => f("to").and_then(Value::as_str).is_none_or(|t| ev.data["message"]["to"].as_str() == Some(t)),
        "tool_call" | "task_create" | "task_complete" => {
            let tool = ev.data["toolName"].as_str().or(ev.data["task"]["tool"].as_str()).unwrap_or("");
            if let Some(ts) = f("tools")
                && !strings(ts).iter().any(|g| glob(g, tool))
            {
                return false;
            }
            if ev.ty == "task_complete"
                && let Some(st) = f("status").and_then(Value::as_str)
            {
                return ev.data["task"]["status"].as_str() == Some(st);
            }
            true
        }
        "log_entry" => {
            let e = &ev.data["entry"];
            let member = |k: &str, v: &str| f(k).is_none_or(|l| strings(l).contains(&v));
            let globbed = |k: &str, v: &str| f(k).is_none_or(|l| strings(l).iter().any(|g| glob(g, v)));
            member("level", e["level"].as_str().unwrap_or(""))
                && globbed("origin", e["origin"].as_str().unwrap_or(""))
                && globbed("event", e["event"].as_str().unwrap_or(""))
        }
        "llm_call" => {
            let member = |k: &str, v: &str| f(k).is_none_or(|l| strings(l).contains(&v));
            member("source", ev.data["source"].as_str().unwrap_or(""))
                && member("provider", ev.data["provider"].as_str().unwrap_or(""))
        }
        _ => true,
    }
}

/// Whether an agent-scope target may wake the model in `state` (§1.1).
pub fn agent_may_fire(state: &str, trigger: &str) -> bool {
    match state {
        "active" | "idle" => true,
        "hibernate" => trigger == "on_timer",
        _ => false,
    }
}

/// The dispatches an event causes (§5.2): one per matching target, system
/// targets first; `off` fires nothing.
pub fn evaluate(cfg: &Value, state: &str, ev: &TriggerEvent) -> Vec<Dispatch> {
    let name = ev.trigger_name();
    let Some(t) = cfg.get("triggers").and_then(|t| t.get(name.as_str())) else { return Vec::new() };
    if t["enabled"] != Value::Bool(true) || state == "off" {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (index, target) in t["targets"].as_array().map(Vec::as_slice).unwrap_or(&[]).iter().enumerate() {
        let system = target["scope"] == "system";
        if !system && (target["scope"] != "agent" || !agent_may_fire(state, &name)) {
            continue;
        }
        let filter = target.get("filter").cloned().unwrap_or(Value::Null);
        if !admits(ev, &filter, target) {
            continue;
        }
        let lambda = target["lambda"].as_str().map(str::to_string);
        let command = target["command"].as_str().map(str::to_string);
        if system && lambda.is_none() && command.is_none() {
            continue;
        }
        let ms = |k: &str| target[k].as_u64().filter(|m| *m > 0);
        let timing = if let Some(d) = ms("debounce_ms") {
            Timing::Debounce(d)
        } else if let Some(i) = ms("interval_ms") {
            Timing::Interval(i)
        } else if let Some(b) = ms("batch_ms") {
            Timing::Batch { ms: b, count: target["batch_count"].as_u64().map(|c| c as usize) }
        } else {
            Timing::Now
        };
        out.push(Dispatch {
            trigger: name.clone(),
            index,
            system,
            lambda,
            command,
            warm: target["warm"] == Value::Bool(true),
            timing,
            event: ev.clone(),
        });
    }
    out.sort_by_key(|d| !d.system);
    out
}

/// The wake message of an agent-scope dispatch (§5.6).
pub fn wake_text(events: &[TriggerEvent]) -> String {
    if events.len() > 1 {
        let mut types: Vec<&str> = events.iter().map(|e| e.ty).collect();
        types.dedup();
        return format!(
            "A batch of {} events fired: {}. Check your inbox/tasks for details.",
            events.len(),
            types.join(", ")
        );
    }
    let Some(e) = events.first() else { return String::new() };
    let d = &e.data;
    let s = |v: &Value| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
    match e.ty {
        "startup" => "Agent started. Review your mind for context and take any startup actions.".into(),
        "file_change" => {
            let mut m = format!("A file has been {}: {}", d["operation"].as_str().unwrap_or("modified"), s(&d["path"]));
            if let Some(diff) = d["diff"].as_str().filter(|x| !x.is_empty()) {
                m.push_str(&format!(
                    "\n\nChanges:\n\n{diff}\n\nUse fs_read to see the full file if you need more context."
                ));
            }
            m
        }
        "tool_call" => format!(
            "A tool call has been intercepted.\nTool: {}\nArgs: {}\nSee adf_tasks, and on_task_complete for its outcome.",
            s(&d["toolName"]),
            d["args"]
        ),
        "llm_call" => format!(
            "An LLM call completed.\nProvider: {}\nModel: {}\nSource: {}\nTokens: {} in, {} out\nLatency: {} ms\nStop reason: {}",
            s(&d["provider"]),
            s(&d["model"]),
            s(&d["source"]),
            d["input_tokens"],
            d["output_tokens"],
            d["duration_ms"],
            s(&d["stop_reason"])
        ),
        "log_entry" => {
            let x = &d["entry"];
            format!(
                "A log entry has been recorded.\nLevel: {}\nOrigin: {}\nEvent: {}\nTarget: {}\nMessage: {}",
                s(&x["level"]),
                s(&x["origin"]),
                s(&x["event"]),
                s(&x["target"]),
                s(&x["message"])
            )
        }
        "task_create" | "task_complete" => {
            let t = &d["task"];
            let mut m = format!(
                "{}\nTask ID: {}\nTool: {}\nStatus: {}",
                if e.ty == "task_create" { "A task has been created." } else { "A task has completed." },
                s(&t["id"]),
                s(&t["tool"]),
                s(&t["status"])
            );
            if let Some(r) = t["result"].as_str() {
                m.push_str(&format!("\nResult: {r}"));
            }
            if let Some(r) = t["error"].as_str() {
                m.push_str(&format!("\nError: {r}"));
            }
            if e.ty == "task_create"
                && (t["requires_authorization"] == json!(true) || t["requires_authorization"] == json!(1))
            {
                m.push_str("\nRequires authorized code to resolve.");
            }
            m
        }
        other => format!("A {other} event fired.\n{}", serde_json::to_string_pretty(d).unwrap_or_default()),
    }
}

/// The lane family of a trigger (§5.7): (concurrency, timeout cap).
pub fn lane_family(trigger: &str) -> (usize, Option<u64>) {
    match trigger {
        "on_llm_call" | "on_tool_call" | "on_logs" | "on_file_change" => (1, Some(30_000)),
        _ => (4, None),
    }
}

pub const LANE_QUEUE: usize = 64;

/// A lambda waiting in or running from a lane.
struct Job {
    lane: String,
    trigger: String,
    /// `path[:fn]`, a `.sh` path, or a command line (`shell`).
    lambda: String,
    shell: bool,
    warm: bool,
    event: Value,
}

#[derive(Default)]
struct Lane {
    running: usize,
    queue: VecDeque<Job>,
}

/// An open timing window for one `(trigger, target)`.
#[derive(Default)]
struct Window {
    generation: u64,
    /// Interval: the window is open (later events are dropped).
    open: bool,
    events: Vec<TriggerEvent>,
}

/// Builds a runner executor (on a sibling connection).
pub type RunnerFactory = Box<dyn Fn() -> Option<Executor> + Send + Sync>;

/// Per-agent trigger machinery shared by the agent's executors.
pub struct Dispatcher {
    agent_id: String,
    bus: Arc<super::bus::Bus>,
    lanes: Mutex<HashMap<String, Lane>>,
    windows: Mutex<HashMap<(String, usize), Window>>,
    runners: Mutex<Vec<Executor>>,
    factory: RunnerFactory,
    /// Agent-scope wakes: (message, event type).
    wake: Box<dyn Fn(String, String) + Send + Sync>,
    /// The agent's state as last published (runners gate on it).
    pub state: Mutex<String>,
    closed: std::sync::atomic::AtomicBool,
    me: Weak<Dispatcher>,
}

impl Dispatcher {
    /// Lanes with a queue: (lane, running, queued), longest queue first.
    pub fn waiting(&self) -> Vec<(String, usize, usize)> {
        let Ok(lanes) = self.lanes.lock() else { return Vec::new() };
        let mut out: Vec<(String, usize, usize)> = lanes
            .iter()
            .filter(|(_, l)| !l.queue.is_empty())
            .map(|(k, l)| (k.clone(), l.running, l.queue.len()))
            .collect();
        out.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
        out
    }

    pub fn new(
        agent_id: String,
        bus: Arc<super::bus::Bus>,
        factory: RunnerFactory,
        wake: Box<dyn Fn(String, String) + Send + Sync>,
    ) -> Arc<Dispatcher> {
        Arc::new_cyclic(|me| Dispatcher {
            agent_id,
            bus,
            lanes: Default::default(),
            windows: Default::default(),
            runners: Default::default(),
            factory,
            wake,
            state: Mutex::new("idle".into()),
            closed: Default::default(),
            me: me.clone(),
        })
    }

    /// Stop taking work and drop the idle runners (their connections).
    pub fn shutdown(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut r) = self.runners.lock() {
            r.clear();
        }
    }

    fn note(&self, ty: &'static str, payload: Value) {
        self.bus.publish(Envelope::new(ty, Some(&self.agent_id), "system:triggers", payload));
    }

    /// Take one dispatch: apply its timing, then run it.
    pub fn submit(&self, d: Dispatch) {
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let key = (d.trigger.clone(), d.index);
        match d.timing {
            Timing::Now => self.fire(&d, vec![d.event.clone()]),
            // The inbox exception (§5.4): the first message opens the
            // window, the fire comes at its end, the rest are absorbed.
            Timing::Interval(ms) if d.trigger == "on_inbox" => {
                let Ok(mut w) = self.windows.lock() else { return };
                let win = w.entry(key.clone()).or_default();
                win.events.push(d.event.clone());
                if win.open {
                    return;
                }
                win.open = true;
                win.generation += 1;
                let generation = win.generation;
                drop(w);
                self.later(ms, move |me| {
                    let events = match me.windows.lock() {
                        Ok(mut w) => match w.get_mut(&key) {
                            Some(win) if win.generation == generation => {
                                win.open = false;
                                std::mem::take(&mut win.events)
                            }
                            _ => return,
                        },
                        Err(_) => return,
                    };
                    // One wake (or one lambda call with the latest message).
                    if let Some(last) = events.last() {
                        me.fire(&d, vec![last.clone()]);
                    }
                });
            }
            Timing::Interval(ms) => {
                let Ok(mut w) = self.windows.lock() else { return };
                let win = w.entry(key.clone()).or_default();
                if win.open {
                    drop(w);
                    self.note(kind::TRIGGER_DROPPED, json!({"trigger_type": d.trigger, "reason": "interval"}));
                    return;
                }
                win.open = true;
                win.generation += 1;
                let generation = win.generation;
                drop(w);
                self.fire(&d, vec![d.event.clone()]);
                self.later(ms, move |me| {
                    if let Ok(mut w) = me.windows.lock()
                        && let Some(win) = w.get_mut(&key)
                        && win.generation == generation
                    {
                        win.open = false;
                    }
                });
            }
            Timing::Debounce(ms) => {
                let Ok(mut w) = self.windows.lock() else { return };
                let win = w.entry(key.clone()).or_default();
                win.generation += 1;
                let generation = win.generation;
                // The diff runs from the first change's old text.
                let first = win.events.first().and_then(|e| e.data.get("_before").cloned());
                let mut ev = d.event.clone();
                if let Some(b) = first {
                    ev.data["_before"] = b;
                }
                win.events = vec![ev];
                drop(w);
                self.later(ms, move |me| {
                    let mut events = match me.windows.lock() {
                        Ok(mut w) => match w.get_mut(&key) {
                            Some(win) if win.generation == generation => std::mem::take(&mut win.events),
                            _ => return,
                        },
                        Err(_) => return,
                    };
                    me.rediff(&mut events);
                    me.fire(&d, events);
                });
            }
            Timing::Batch { ms, count } => {
                let Ok(mut w) = self.windows.lock() else { return };
                let win = w.entry(key.clone()).or_default();
                win.events.push(d.event.clone());
                let first = win.events.len() == 1;
                if count.is_some_and(|c| win.events.len() >= c) {
                    win.generation += 1;
                    let events = std::mem::take(&mut win.events);
                    drop(w);
                    self.fire(&d, events);
                    return;
                }
                if !first {
                    return;
                }
                win.generation += 1;
                let generation = win.generation;
                drop(w);
                self.later(ms, move |me| {
                    let events = match me.windows.lock() {
                        Ok(mut w) => match w.get_mut(&key) {
                            Some(win) if win.generation == generation => std::mem::take(&mut win.events),
                            _ => return,
                        },
                        Err(_) => return,
                    };
                    if !events.is_empty() {
                        me.fire(&d, events);
                    }
                });
            }
        }
    }

    /// A debounced file change: its diff from the first old text to what
    /// the file holds now.
    fn rediff(&self, events: &mut [TriggerEvent]) {
        for ev in events.iter_mut().filter(|e| e.ty == "file_change") {
            let Some(before) = ev.data.get("_before").and_then(Value::as_str).map(str::to_string) else { continue };
            let path = ev.data["path"].as_str().unwrap_or("").to_string();
            if let Some(ex) = self.runner() {
                let now = ex.store.file_read_text(&path).ok();
                ev.data["diff"] = json!(now.and_then(|n| super::diff::unified(&path, Some(&before), &n)));
                self.give_back(ex);
            }
        }
    }

    fn later(&self, ms: u64, f: impl FnOnce(Arc<Dispatcher>) + Send + 'static) {
        let me = self.me.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            if let Some(me) = me.upgrade() {
                f(me);
            }
        });
    }

    fn fire(&self, d: &Dispatch, events: Vec<TriggerEvent>) {
        if !d.system {
            let ty = events.first().map(|e| e.ty).unwrap_or("trigger");
            (self.wake)(wake_text(&events), ty.to_string());
            return;
        }
        let (lambda, shell) = match (&d.lambda, &d.command) {
            (Some(l), _) => (l.clone(), l.ends_with(".sh")),
            (None, Some(c)) => (c.clone(), true),
            (None, None) => return,
        };
        let event = if events.len() == 1 {
            events[0].envelope()
        } else {
            json!({"events": events.iter().map(TriggerEvent::envelope).collect::<Vec<_>>(), "count": events.len(),
                   "scope": "system", "lambda": lambda, "warm": d.warm})
        };
        self.enqueue(Job {
            lane: format!("{}:{lambda}", d.trigger),
            trigger: d.trigger.clone(),
            lambda,
            shell,
            warm: d.warm,
            event,
        });
    }

    /// A timer's own lambda (timers carry their execution config).
    pub fn submit_job(&self, job: super::code::SystemJob) {
        let shell = job.lambda.ends_with(".sh");
        self.submit_system(job, shell);
    }

    /// A shell command line run in system scope (an injected event's
    /// `command`).
    pub fn submit_command(&self, job: super::code::SystemJob) {
        self.submit_system(job, true);
    }

    fn submit_system(&self, job: super::code::SystemJob, shell: bool) {
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        self.enqueue(Job {
            lane: format!("{}:{}", job.trigger, job.lambda),
            trigger: job.trigger.to_string(),
            shell,
            lambda: job.lambda,
            warm: job.warm,
            event: job.event,
        });
    }

    /// Put a job in its lane: run now if the lane has room, wait if the
    /// queue has, else drop it (logged, reported).
    fn enqueue(&self, job: Job) {
        let (cap, _) = lane_family(&job.trigger);
        let Ok(mut lanes) = self.lanes.lock() else { return };
        let lane = lanes.entry(job.lane.clone()).or_default();
        if lane.running < cap {
            lane.running += 1;
            drop(lanes);
            self.spawn_lane(job);
        } else if lane.queue.len() < LANE_QUEUE {
            lane.queue.push_back(job);
        } else {
            drop(lanes);
            self.note(
                kind::TRIGGER_DROPPED,
                json!({"trigger_type": job.trigger, "reason": "lane_full", "lane": job.lane, "dropped": 1}),
            );
            self.note(
                kind::LAMBDA_FAILED,
                json!({"lambda_path": job.lambda, "kind": "system_scope", "trigger": job.trigger,
                       "error": format!("dropped: lane {} has {} waiting", job.lane, LANE_QUEUE)}),
            );
            if let Some(mut ex) = self.runner() {
                let _ = ex.store.log(
                    "error",
                    "trigger",
                    "dispatch_dropped",
                    &format!("{}: the lane is full ({LANE_QUEUE} waiting); dispatch dropped", job.lane),
                );
                // A dropped timer fire is not lost: an exhausted timer is
                // due again on the next tick.
                if let Some(id) =
                    job.event.pointer("/data/timer/id").and_then(Value::as_i64).filter(|_| job.trigger == "on_timer")
                {
                    let _ = ex.store.timer_rewind(id, crate::store::now_ms());
                }
                self.give_back(ex);
            }
        }
    }

    fn runner(&self) -> Option<Executor> {
        self.runners.lock().ok().and_then(|mut r| r.pop()).or_else(|| (self.factory)())
    }

    fn give_back(&self, ex: Executor) {
        if !self.closed.load(std::sync::atomic::Ordering::Relaxed)
            && let Ok(mut r) = self.runners.lock()
            && r.len() < 8
        {
            r.push(ex);
        }
    }

    /// Run a background tool call (`_async` from the model) on a runner.
    pub fn spawn_task(&self, task_id: String, tool: String, args: Value) {
        let me = self.me.clone();
        tokio::spawn(async move {
            let Some(d) = me.upgrade() else { return };
            if let Some(mut ex) = d.runner() {
                ex.run_task(&task_id, &tool, &args).await;
                d.give_back(ex);
            }
        });
    }

    /// Run a lane's jobs until it is empty, on one runner.
    fn spawn_lane(&self, first: Job) {
        let me = self.me.clone();
        tokio::spawn(async move {
            let Some(d) = me.upgrade() else { return };
            let mut job = first;
            loop {
                if let Some(mut ex) = d.runner() {
                    let (_, cap_ms) = lane_family(&job.trigger);
                    let limit = ex.code_timeout(None);
                    let timeout = cap_ms.map(|c| limit.min(Duration::from_millis(c))).unwrap_or(limit);
                    if job.shell {
                        // Shell targets are exempt from the timeout (§5.7).
                        ex.run_shell_job(&job.trigger, &job.lambda, job.event.clone()).await;
                    } else {
                        ex.run_job(&job.trigger, &job.lambda, job.event.clone(), job.warm, timeout).await;
                    }
                    d.give_back(ex);
                }
                let next = d.lanes.lock().ok().and_then(|mut lanes| {
                    let lane = lanes.get_mut(&job.lane)?;
                    match lane.queue.pop_front() {
                        Some(j) => Some(j),
                        None => {
                            lane.running -= 1;
                            None
                        }
                    }
                });
                match next {
                    Some(j) => job = j,
                    None => return,
                }
            }
        });
    }

    /// Lane occupancy `(running, waiting)` (tests, status).
    pub fn lane(&self, key: &str) -> (usize, usize) {
        self.lanes.lock().ok().and_then(|l| l.get(key).map(|l| (l.running, l.queue.len()))).unwrap_or((0, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p29_lane_families() {
        for t in ["on_llm_call", "on_tool_call", "on_logs", "on_file_change"] {
            assert_eq!(lane_family(t), (1, Some(30_000)), "{t}");
        }
        for t in ["on_timer", "on_startup", "on_inbox", "on_outbox", "on_task_create", "on_task_complete", "on_chat"] {
            assert_eq!(lane_family(t), (4, None), "{t}");
        }
        assert_eq!(LANE_QUEUE, 64);
    }

    #[test]
    fn globs_are_anchored_with_literal_dots() {
        assert!(glob("README.*", "README.md"));
        assert!(!glob("README.*", "xREADME.md"));
        assert!(!glob("*.md", "a.mdx"));
        assert!(glob("notes/*", "notes/a/b.md"));
        assert!(glob("mcp_*", "mcp_github_search"));
        assert!(!glob("a.b", "axb"));
    }

    fn fc(source: &str, path: &str) -> TriggerEvent {
        TriggerEvent { ty: "file_change", source: source.into(), data: json!({"path": path, "operation": "modified"}) }
    }

    #[test]
    fn p30_own_changes_need_include_self_and_a_lambda_never_sees_its_own() {
        let cfg = |filter: Value| {
            json!({"triggers": {"on_file_change": {"enabled": true, "targets": [
                {"scope": "system", "lambda": "lib/w.js:on", "filter": filter},
                {"scope": "agent", "filter": filter}
            ]}}})
        };
        let plain = cfg(json!({"watch": "*.md"}));
        assert_eq!(evaluate(&plain, "idle", &fc("system:daemon", "a.md")).len(), 2, "owner writes always fire");
        assert!(evaluate(&plain, "idle", &fc("agent:turn_1", "a.md")).is_empty());
        assert!(evaluate(&plain, "idle", &fc("lambda:lib/x.js:main", "a.md")).is_empty());
        assert!(evaluate(&plain, "idle", &fc("system:daemon", "a.txt")).is_empty(), "watch glob");
        let own = cfg(json!({"watch": "*.md", "include_self": true}));
        assert_eq!(evaluate(&own, "idle", &fc("agent:turn_1", "a.md")).len(), 2);
        let d = evaluate(&own, "idle", &fc("lambda:lib/w.js:on", "a.md"));
        assert_eq!(d.len(), 1, "the lambda's own change reaches only the other target");
        assert!(!d[0].system);
    }

    #[test]
    fn p23_state_gating_and_system_first() {
        let cfg = json!({"triggers": {
            "on_tool_call": {"enabled": true, "targets": [{"scope": "agent"}, {"scope": "system", "lambda": "t.js"}]},
            "on_timer": {"enabled": true, "targets": [{"scope": "agent"}]}}});
        let ev = TriggerEvent { ty: "tool_call", source: "agent:t".into(), data: json!({"toolName": "fs_read"}) };
        let d = evaluate(&cfg, "idle", &ev);
        assert_eq!((d.len(), d[0].system), (2, true), "both, system first");
        for (state, n) in [("hibernate", 1), ("error", 1), ("suspended", 1), ("off", 0)] {
            let d = evaluate(&cfg, state, &ev);
            assert_eq!(d.len(), n, "{state}");
            assert!(d.iter().all(|d| d.system), "{state}: only system scope");
        }
        let timer = TriggerEvent { ty: "timer", source: "system:timer".into(), data: json!({}) };
        assert_eq!(evaluate(&cfg, "hibernate", &timer).len(), 1, "hibernate: on_timer still wakes");
        assert!(evaluate(&cfg, "error", &timer).is_empty());
    }

    #[test]
    fn inbox_and_outbox_filters() {
        let cfg = json!({"triggers": {
            "on_inbox": {"enabled": true, "targets": [{"scope": "system", "lambda": "a.js", "filter": {"source": "mesh", "sender": "did:key:z6MkA"}}]},
            "on_outbox": {"enabled": true, "targets": [{"scope": "system", "lambda": "a.js", "filter": {"to": "bob"}}]}}});
        let ev =
            |ty: &'static str, m: Value| TriggerEvent { ty, source: "system:mesh".into(), data: json!({"message": m}) };
        assert_eq!(evaluate(&cfg, "idle", &ev("inbox", json!({"source": "mesh", "from": "did:key:z6MkA"}))).len(), 1);
        assert!(
            evaluate(&cfg, "idle", &ev("inbox", json!({"source": "telegram", "from": "did:key:z6MkA"}))).is_empty()
        );
        assert!(evaluate(&cfg, "idle", &ev("inbox", json!({"source": "mesh", "from": "did:key:z6MkB"}))).is_empty());
        assert_eq!(evaluate(&cfg, "idle", &ev("outbox", json!({"to": "bob"}))).len(), 1);
        assert!(evaluate(&cfg, "idle", &ev("outbox", json!({"to": "eve"}))).is_empty());
    }

    #[test]
    fn filters_of_each_type() {
        let cfg = json!({"triggers": {
            "on_tool_call": {"enabled": true, "targets": [{"scope": "system", "lambda": "a.js", "filter": {"tools": ["fs_*"]}}]},
            "on_llm_call": {"enabled": true, "targets": [{"scope": "system", "lambda": "a.js", "filter": {"source": ["turn"]}}]},
            "on_logs": {"enabled": true, "targets": [{"scope": "system", "lambda": "a.js", "filter": {"level": ["error"], "origin": ["sys_*"]}}]},
            "on_task_complete": {"enabled": true, "targets": [{"scope": "system", "lambda": "a.js", "filter": {"status": "failed"}}]}}});
        let ev = |ty: &'static str, data: Value| TriggerEvent { ty, source: "agent:t".into(), data };
        assert_eq!(evaluate(&cfg, "idle", &ev("tool_call", json!({"toolName": "fs_write"}))).len(), 1);
        assert!(evaluate(&cfg, "idle", &ev("tool_call", json!({"toolName": "db_query"}))).is_empty());
        assert_eq!(evaluate(&cfg, "idle", &ev("llm_call", json!({"source": "turn"}))).len(), 1);
        assert!(evaluate(&cfg, "idle", &ev("llm_call", json!({"source": "compaction"}))).is_empty());
        let log = |l: &str, o: &str| ev("log_entry", json!({"entry": {"level": l, "origin": o}}));
        assert_eq!(evaluate(&cfg, "idle", &log("error", "sys_code")).len(), 1);
        assert!(evaluate(&cfg, "idle", &log("warn", "sys_code")).is_empty());
        assert!(evaluate(&cfg, "idle", &log("error", "executor")).is_empty());
        let task = |st: &str| ev("task_complete", json!({"task": {"tool": "x", "status": st}}));
        assert_eq!(evaluate(&cfg, "idle", &task("failed")).len(), 1);
        assert!(evaluate(&cfg, "idle", &task("completed")).is_empty());
    }
}
