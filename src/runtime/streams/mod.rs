//! Stream bindings (issue 21, tools.md §10, format.md §7.2): bytes pumped
//! by the runtime between two endpoints (`endpoint.rs`) without waking the
//! model — `a` to `b`, and back when `bidirectional`. Imperative bindings
//! come from `stream_bind`; declarative ones from `stream_bindings` in the
//! config, made when the agent starts and retried (1 s doubling to 60 s)
//! while they cannot be, again after they end when `reconnect`. Each
//! binding reports its flow every `flow_summary_interval_ms` and ends at
//! its thresholds (`idle_timeout_ms`, `max_duration_ms`, `max_bytes`), when
//! an end closes, or by `stream_unbind`; every step is a `binding.*` event.

pub mod endpoint;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::protocol::Envelope;
use crate::runtime::mesh::{Mailbox, Mesh};

/// A binding's options (format.md §7.2), with the reference's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub idle_timeout: Option<Duration>,
    pub max_duration: Option<Duration>,
    pub max_bytes: Option<u64>,
    pub flow_interval: Duration,
    pub close_a_on_b_close: bool,
    pub close_b_on_a_close: bool,
    pub drain_timeout: Duration,
}

impl Options {
    pub fn of(v: &Value) -> Options {
        let ms = |k: &str| v[k].as_u64().filter(|n| *n > 0).map(Duration::from_millis);
        Options {
            idle_timeout: ms("idle_timeout_ms"),
            max_duration: ms("max_duration_ms"),
            max_bytes: v["max_bytes"].as_u64().filter(|n| *n > 0),
            flow_interval: ms("flow_summary_interval_ms")
                .unwrap_or(Duration::from_secs(1))
                .max(Duration::from_millis(100)),
            close_a_on_b_close: v["close_a_on_b_close"].as_bool().unwrap_or(true),
            close_b_on_a_close: v["close_b_on_a_close"].as_bool().unwrap_or(true),
            drain_timeout: ms("drain_timeout_ms").unwrap_or(Duration::from_secs(1)),
        }
    }
}

/// One binding, as listed.
pub struct Binding {
    pub id: String,
    pub agent_id: String,
    a: Mutex<Value>,
    b: Mutex<Value>,
    bidirectional: bool,
    /// `imperative` or `declarative`.
    origin: &'static str,
    declaration_id: Option<String>,
    status: Mutex<&'static str>,
    created_at: i64,
    a_to_b: AtomicU64,
    b_to_a: AtomicU64,
    dropped: AtomicU64,
    attempts: AtomicU64,
    last_error: Mutex<Option<String>>,
    stop: Mutex<Option<oneshot::Sender<&'static str>>>,
}

impl Binding {
    pub fn info(&self) -> Value {
        let mut v = json!({"binding_id": self.id, "a": *self.a.lock().unwrap_or_else(|p| p.into_inner()),
            "b": *self.b.lock().unwrap_or_else(|p| p.into_inner()), "bidirectional": self.bidirectional,
            "origin": self.origin, "status": *self.status.lock().unwrap_or_else(|p| p.into_inner()),
            "created_at": self.created_at, "bytes_a_to_b": self.a_to_b.load(Ordering::Relaxed),
            "bytes_b_to_a": self.b_to_a.load(Ordering::Relaxed)});
        if let Some(d) = &self.declaration_id {
            v["declaration_id"] = json!(d);
        }
        let dropped = self.dropped.load(Ordering::Relaxed);
        if dropped > 0 {
            v["frames_dropped"] = json!(dropped);
        }
        if self.origin == "declarative" {
            v["attempts"] = json!(self.attempts.load(Ordering::Relaxed));
            if let Some(e) = self.last_error.lock().ok().and_then(|e| e.clone()) {
                v["last_error"] = json!(e);
            }
        }
        v
    }

    fn set_status(&self, s: &'static str) {
        if let Ok(mut st) = self.status.lock() {
            *st = s;
        }
    }
}

/// The runtime's bindings.
#[derive(Default)]
pub struct Bindings {
    map: Mutex<HashMap<String, Arc<Binding>>>,
}

impl Bindings {
    pub fn of(&self, agent: &str) -> Vec<Arc<Binding>> {
        let mut v: Vec<Arc<Binding>> =
            self.map.lock().map(|m| m.values().filter(|b| b.agent_id == agent).cloned().collect()).unwrap_or_default();
        v.sort_by_key(|b| b.created_at);
        v
    }

    /// End a binding (`manual`); false when the agent has none by that id.
    pub fn unbind(&self, agent: &str, id: &str, reason: &'static str) -> bool {
        let b = self.map.lock().ok().and_then(|mut m| match m.get(id) {
            Some(b) if b.agent_id == agent => m.remove(id),
            _ => None,
        });
        match b {
            Some(b) => {
                if let Some(tx) = b.stop.lock().ok().and_then(|mut s| s.take()) {
                    let _ = tx.send(reason);
                }
                true
            }
            None => false,
        }
    }

    /// End every binding of an agent (it stopped).
    pub fn stop_agent(&self, agent: &str) {
        let ids: Vec<String> = self.of(agent).iter().map(|b| b.id.clone()).collect();
        for id in ids {
            self.unbind(agent, &id, "agent_stopped");
        }
    }

    fn insert(&self, b: Arc<Binding>) -> Result<(), String> {
        let mut m = self.map.lock().map_err(|_| "bindings poisoned")?;
        if m.contains_key(&b.id) {
            return Err(format!("Binding already exists: {}", b.id));
        }
        m.insert(b.id.clone(), b);
        Ok(())
    }

    fn forget(&self, b: &Arc<Binding>) {
        if let Ok(mut m) = self.map.lock()
            && m.get(&b.id).is_some_and(|x| Arc::ptr_eq(x, b))
        {
            m.remove(&b.id);
        }
    }
}

fn emit(mesh: &Mesh, agent: &str, ty: &'static str, payload: Value) {
    mesh.bus.publish(Envelope::new(ty, Some(agent), "system:stream_bind", payload));
}

/// What `stream_bind` and the config ask for.
pub struct Spec {
    pub a: Value,
    pub b: Value,
    pub bidirectional: bool,
    pub options: Value,
}

/// Check the shape of a binding before anything is opened.
fn check(spec: &Spec) -> Result<(), String> {
    for (side, e) in [("a", &spec.a), ("b", &spec.b)] {
        if !e.is_object() {
            return Err(format!("endpoint {side} must be an object with a kind"));
        }
    }
    if spec.b["kind"] == "umbilical" {
        return Err("umbilical endpoints are read-only and cannot appear as b".into());
    }
    if spec.bidirectional && spec.a["kind"] == "umbilical" {
        return Err("bidirectional bindings require both endpoints to be readable and writable".into());
    }
    Ok(())
}

/// Make a binding now (`stream_bind`): its id, or why it cannot be.
pub async fn bind(mesh: &Arc<Mesh>, mb: &Arc<Mailbox>, spec: Spec) -> Result<String, String> {
    check(&spec)?;
    let id = crate::store::create::nanoid(12);
    let gate = gate(mb)?;
    let b = new_binding(&id, &mb.id, &spec, "imperative", None);
    let (a_end, b_end) = open_both(mesh, &mb.id, &gate, &spec, &id).await?;
    mesh.bindings.insert(b.clone())?;
    created(mesh, &b, &spec);
    tokio::spawn(run(mesh.clone(), b, a_end, b_end, spec));
    Ok(id)
}

fn gate(mb: &Mailbox) -> Result<Value, String> {
    let cfg = mb.with_store(|s| s.config_value()).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    Ok(cfg["stream_bind"].clone())
}

fn new_binding(id: &str, agent: &str, spec: &Spec, origin: &'static str, decl: Option<String>) -> Arc<Binding> {
    let summary = |e: &Value| json!({"kind": e["kind"]});
    Arc::new(Binding {
        id: id.to_string(),
        agent_id: agent.to_string(),
        a: Mutex::new(summary(&spec.a)),
        b: Mutex::new(summary(&spec.b)),
        bidirectional: spec.bidirectional,
        origin,
        declaration_id: decl,
        status: Mutex::new(if origin == "declarative" { "pending" } else { "active" }),
        created_at: crate::store::now_ms(),
        a_to_b: AtomicU64::new(0),
        b_to_a: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
        attempts: AtomicU64::new(0),
        last_error: Mutex::new(None),
        stop: Mutex::new(None),
    })
}

async fn open_both(
    mesh: &Arc<Mesh>,
    agent: &str,
    gate: &Value,
    spec: &Spec,
    id: &str,
) -> Result<(endpoint::Opened, endpoint::Opened), String> {
    let a = endpoint::open(mesh, agent, gate, &spec.a, id, "a").await?;
    let b = match endpoint::open(mesh, agent, gate, &spec.b, id, "b").await {
        Ok(b) => b,
        Err(e) => {
            if let Some(s) = a.stop {
                let _ = s.send(());
            }
            return Err(e);
        }
    };
    if a.reader.is_none() {
        return Err("endpoint a is not readable".into());
    }
    if b.writer.is_none() {
        return Err("endpoint b is not writable".into());
    }
    if spec.bidirectional && (b.reader.is_none() || a.writer.is_none()) {
        return Err("bidirectional bindings require both endpoints to be readable and writable".into());
    }
    Ok((a, b))
}

fn created(mesh: &Mesh, b: &Binding, spec: &Spec) {
    let mut options = serde_json::Map::new();
    for (k, v) in spec.options.as_object().into_iter().flatten() {
        if !(v.is_null() || v == &json!(0) || v == &json!(false)) {
            options.insert(k.clone(), v.clone());
        }
    }
    emit(
        mesh,
        &b.agent_id,
        crate::protocol::kind::BINDING_CREATED,
        json!({"binding_id": b.id, "a": b.info()["a"], "b": b.info()["b"], "bidirectional": b.bidirectional,
            "origin": b.origin, "declaration_id": b.declaration_id, "options": options}),
    );
}

/// Pump until the binding ends; the reason it ended.
async fn run(mesh: Arc<Mesh>, b: Arc<Binding>, a: endpoint::Opened, e_b: endpoint::Opened, spec: Spec) -> &'static str {
    let opts = Options::of(&spec.options);
    if let Ok(mut x) = b.a.lock() {
        *x = a.summary.clone();
    }
    if let Ok(mut x) = b.b.lock() {
        *x = e_b.summary.clone();
    }
    b.set_status("active");
    let (stop_tx, mut stop_rx) = oneshot::channel();
    if let Ok(mut s) = b.stop.lock() {
        *s = Some(stop_tx);
    }
    let started = Instant::now();
    let last_flow = Arc::new(Mutex::new(Instant::now()));
    // One pump a direction; each says why it ended.
    let (ended_tx, mut ended_rx) = mpsc::channel::<(&'static str, &'static str, Option<String>)>(2);
    let pump = |mut from: endpoint::Reader, to: mpsc::Sender<Vec<u8>>, count: Arc<Binding>, dir: &'static str| {
        let (ended, flow) = (ended_tx.clone(), last_flow.clone());
        tokio::spawn(async move {
            let (src, dst) = if dir == "a_to_b" { ("source", "target") } else { ("target", "source") };
            let why = loop {
                match from.recv().await {
                    Some(Ok(chunk)) => {
                        let n = chunk.len() as u64;
                        if to.send(chunk).await.is_err() {
                            break (dst, "closed", None);
                        }
                        let c = if dir == "a_to_b" { &count.a_to_b } else { &count.b_to_a };
                        c.fetch_add(n, Ordering::Relaxed);
                        if let Ok(mut f) = flow.lock() {
                            *f = Instant::now();
                        }
                    }
                    Some(Err(e)) => break (src, "error", Some(e)),
                    None => break (src, "closed", None),
                }
            };
            let _ = ended.send(why).await;
        })
    };
    let endpoint::Opened { reader: a_reader, writer: a_writer, dropped: a_dropped, stop: a_stop, .. } = a;
    let endpoint::Opened { reader: b_reader, writer: b_writer, stop: b_stop, .. } = e_b;
    let (Some(a_reader), Some(b_writer)) = (a_reader, b_writer) else { return "source_error" };
    let mut pumps = vec![pump(a_reader, b_writer, b.clone(), "a_to_b")];
    if spec.bidirectional
        && let (Some(r), Some(w)) = (b_reader, a_writer)
    {
        pumps.push(pump(r, w, b.clone(), "b_to_a"));
    }
    drop(ended_tx);
    let mut tick = tokio::time::interval(opts.flow_interval);
    tick.tick().await;
    let summary = |status: &str| {
        json!({"binding_id": b.id, "bytes_a_to_b": b.a_to_b.load(Ordering::Relaxed), "bytes_b_to_a": b.b_to_a.load(Ordering::Relaxed),
            "frames_dropped": a_dropped.load(Ordering::Relaxed), "interval_ms": opts.flow_interval.as_millis() as u64, "status": status})
    };
    let reason: &'static str = loop {
        tokio::select! {
            r = &mut stop_rx => break r.unwrap_or("manual"),
            e = ended_rx.recv() => {
                let Some((side, how, err)) = e else { break "source_closed" };
                if let Some(err) = err {
                    emit(&mesh, &b.agent_id, crate::protocol::kind::BINDING_ERROR, json!({"binding_id": b.id, "endpoint": if side == "source" { "a" } else { "b" }, "error": err}));
                }
                break match (side, how) {
                    ("source", "error") => "source_error",
                    ("target", "error") => "target_error",
                    ("target", _) => "target_closed",
                    _ => "source_closed",
                };
            }
            _ = tick.tick() => {
                b.dropped.store(a_dropped.load(Ordering::Relaxed), Ordering::Relaxed);
                emit(&mesh, &b.agent_id, crate::protocol::kind::BINDING_FLOW_SUMMARY, summary("active"));
                let total = b.a_to_b.load(Ordering::Relaxed) + b.b_to_a.load(Ordering::Relaxed);
                let idle = last_flow.lock().map(|f| f.elapsed()).unwrap_or_default();
                let over = |name: &'static str, observed: u64, limit: u64| {
                    emit(&mesh, &b.agent_id, crate::protocol::kind::BINDING_THRESHOLD_EXCEEDED,
                        json!({"binding_id": b.id, "threshold": name, "observed": observed, "limit": limit}));
                };
                if let Some(max) = opts.max_bytes && total > max {
                    over("max_bytes", total, max);
                    break "threshold_exceeded:max_bytes";
                }
                if let Some(max) = opts.max_duration && started.elapsed() > max {
                    over("max_duration_ms", started.elapsed().as_millis() as u64, max.as_millis() as u64);
                    break "threshold_exceeded:max_duration_ms";
                }
                if let Some(max) = opts.idle_timeout && idle > max {
                    over("idle_timeout_ms", idle.as_millis() as u64, max.as_millis() as u64);
                    break "threshold_exceeded:idle_timeout_ms";
                }
            }
        }
    };
    b.set_status("draining");
    // What is in flight gets its moment, then the ends are closed.
    let drain = async {
        for p in &mut pumps {
            let _ = p.await;
        }
    };
    // Only an end that closed leaves bytes in flight worth waiting for.
    if reason.ends_with("_closed") {
        let _ = tokio::time::timeout(opts.drain_timeout, drain).await;
    }
    for p in &pumps {
        p.abort();
    }
    let close_a = !reason.starts_with("target_") || opts.close_a_on_b_close;
    let close_b = !reason.starts_with("source_") || opts.close_b_on_a_close;
    if close_a && let Some(s) = a_stop {
        let _ = s.send(());
    }
    if close_b && let Some(s) = b_stop {
        let _ = s.send(());
    }
    close_ws(&mesh, &b.agent_id, &spec.a, close_a);
    close_ws(&mesh, &b.agent_id, &spec.b, close_b);
    b.dropped.store(a_dropped.load(Ordering::Relaxed), Ordering::Relaxed);
    emit(&mesh, &b.agent_id, crate::protocol::kind::BINDING_FLOW_SUMMARY, summary("draining"));
    emit(
        &mesh,
        &b.agent_id,
        crate::protocol::kind::BINDING_TERMINATED,
        json!({"binding_id": b.id, "reason": reason, "origin": b.origin, "declaration_id": b.declaration_id,
            "bytes_a_to_b": b.a_to_b.load(Ordering::Relaxed), "bytes_b_to_a": b.b_to_a.load(Ordering::Relaxed),
            "frames_dropped": b.dropped.load(Ordering::Relaxed), "duration_ms": started.elapsed().as_millis() as u64}),
    );
    mesh.bindings.forget(&b);
    reason
}

/// A WebSocket end is closed with its binding (when its side is closed).
fn close_ws(mesh: &Mesh, agent: &str, e: &Value, close: bool) {
    if close
        && e["kind"] == "ws"
        && let Some(s) = e["connection_id"].as_str().and_then(|id| mesh.sockets.get(id))
        && s.agent_id == agent
    {
        s.close(1000, "stream binding ended");
    }
}

/// Make the agent's declared bindings (it started): each retried until it
/// can be made, and again after it ends when it says `reconnect`.
pub fn start_declared(mesh: &Arc<Mesh>, mb: &Arc<Mailbox>, cfg: &Value) {
    for d in cfg["stream_bindings"].as_array().into_iter().flatten() {
        let Some(id) = d["id"].as_str().filter(|s| !s.is_empty()).map(str::to_string) else {
            let _ = mb
                .with_store(|s| s.log("warn", "stream_bind", "declaration_invalid", "a stream binding without an id"));
            continue;
        };
        let spec = Spec {
            a: d["a"].clone(),
            b: d["b"].clone(),
            bidirectional: d["bidirectional"].as_bool().unwrap_or(false),
            options: d["options"].clone(),
        };
        if let Err(e) = check(&spec) {
            let _ = mb.with_store(|s| s.log("warn", "stream_bind", "declaration_invalid", &format!("{id}: {e}")));
            continue;
        }
        let reconnect = d["reconnect"].as_bool().unwrap_or(false);
        tokio::spawn(keep_declared(mesh.clone(), mb.clone(), id, spec, reconnect));
    }
}

async fn keep_declared(mesh: Arc<Mesh>, mb: Arc<Mailbox>, id: String, spec: Spec, reconnect: bool) {
    let b = new_binding(&id, &mb.id, &spec, "declarative", Some(id.clone()));
    if mesh.bindings.insert(b.clone()).is_err() {
        return;
    }
    let (stop_tx, mut stop_rx) = oneshot::channel();
    if let Ok(mut s) = b.stop.lock() {
        *s = Some(stop_tx);
    }
    created(&mesh, &b, &spec);
    let mut backoff = Duration::from_secs(1);
    loop {
        b.attempts.fetch_add(1, Ordering::Relaxed);
        let opened = match gate(&mb) {
            Ok(g) => open_both(&mesh, &mb.id, &g, &spec, &id).await,
            Err(e) => Err(e),
        };
        match opened {
            Ok((a, e_b)) => {
                emit(
                    &mesh,
                    &mb.id,
                    crate::protocol::kind::BINDING_MATERIALIZED,
                    json!({"binding_id": id, "declaration_id": id}),
                );
                if let Ok(mut e) = b.last_error.lock() {
                    *e = None;
                }
                backoff = Duration::from_secs(1);
                let spec2 = Spec {
                    a: spec.a.clone(),
                    b: spec.b.clone(),
                    bidirectional: spec.bidirectional,
                    options: spec.options.clone(),
                };
                // The running binding takes the stop while it runs.
                let reason = run(mesh.clone(), b.clone(), a, e_b, spec2).await;
                if !reconnect || matches!(reason, "manual" | "agent_stopped" | "declaration_removed") {
                    return;
                }
                // `run` forgot it: register it again and wait a second.
                let _ = mesh.bindings.insert(b.clone());
                b.set_status("pending");
                emit(
                    &mesh,
                    &mb.id,
                    crate::protocol::kind::BINDING_RECONNECTING,
                    json!({"binding_id": id, "declaration_id": id, "reason": reason}),
                );
                let (tx, rx) = oneshot::channel();
                if let Ok(mut s) = b.stop.lock() {
                    *s = Some(tx);
                }
                stop_rx = rx;
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = &mut stop_rx => { mesh.bindings.forget(&b); return; }
                }
            }
            Err(e) => {
                if let Ok(mut le) = b.last_error.lock() {
                    *le = Some(e.clone());
                }
                emit(
                    &mesh,
                    &mb.id,
                    crate::protocol::kind::BINDING_PENDING,
                    json!({"binding_id": id, "declaration_id": id, "reason": e}),
                );
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = &mut stop_rx => { mesh.bindings.forget(&b); return; }
                }
                backoff = (backoff * 2).min(Duration::from_secs(60));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_have_the_reference_defaults_and_shapes_are_checked() {
        let o = Options::of(&json!({}));
        assert_eq!((o.idle_timeout, o.max_duration, o.max_bytes), (None, None, None));
        assert_eq!(o.flow_interval, Duration::from_secs(1));
        assert!(o.close_a_on_b_close && o.close_b_on_a_close);
        let o = Options::of(&json!({"flow_summary_interval_ms": 10, "max_bytes": 5, "idle_timeout_ms": 0}));
        assert_eq!((o.flow_interval, o.max_bytes, o.idle_timeout), (Duration::from_millis(100), Some(5), None));
        let spec = |a: Value, b: Value, bi: bool| Spec { a, b, bidirectional: bi, options: json!({}) };
        assert!(
            check(&spec(json!({"kind": "tcp"}), json!({"kind": "umbilical"}), false))
                .unwrap_err()
                .contains("read-only")
        );
        assert!(
            check(&spec(json!({"kind": "umbilical"}), json!({"kind": "tcp"}), true))
                .unwrap_err()
                .contains("bidirectional")
        );
        assert!(check(&spec(json!("x"), json!({"kind": "tcp"}), false)).is_err());
        assert!(check(&spec(json!({"kind": "umbilical"}), json!({"kind": "tcp"}), false)).is_ok());
    }
}
