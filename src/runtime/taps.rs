//! Event taps (`umbilical_taps`, daemon.md §5.3, issue 21): a lambda
//! subscribed to its agent's event stream. Each tap names the event types
//! it wants (exact, `family.*` or `*`; a wildcard only with
//! `allow_wildcard`), may add a `when` expression over `event`, and is
//! protected from feeding on itself: events whose source is its own lambda
//! are skipped (`exclude_own_origin`, on by default) and it gets at most
//! `max_rate_per_sec` events a second (100; the rest are dropped and
//! logged). The lambda gets the envelope `{seq, event_type, timestamp,
//! source, agent_id, payload}` in a warm realm of its own, so module state
//! survives between events. Taps are read when the agent starts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::bus::{Filter, Item, type_matches};
use super::mesh::{Mailbox, Mesh};
use crate::sandbox;

/// One tap, read from the config.
#[derive(Debug, Clone, PartialEq)]
pub struct Tap {
    pub name: String,
    pub lambda: String,
    /// `lambda:<file>:<fn>`: the source of its own events.
    own: String,
    types: Vec<String>,
    when: Option<String>,
    exclude_own: bool,
    rate: f64,
}

fn wildcard(t: &str) -> bool {
    t == "*" || t.ends_with(".*")
}

/// The agent's taps, and why any were left out.
pub fn read(cfg: &Value) -> (Vec<Tap>, Vec<String>) {
    let (mut taps, mut skipped) = (Vec::new(), Vec::new());
    for t in cfg["umbilical_taps"].as_array().into_iter().flatten() {
        let name = t["name"].as_str().unwrap_or_default().to_string();
        let lambda = t["lambda"].as_str().unwrap_or_default().to_string();
        if name.is_empty() || lambda.is_empty() {
            skipped.push(format!("tap {name:?}: a tap needs a name and a lambda"));
            continue;
        }
        let types: Vec<String> = match t["filter"]["event_types"].as_array() {
            Some(a) => a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
            None => vec!["*".into()],
        };
        let any = types.is_empty() || types.iter().any(|t| wildcard(t));
        if any && t["filter"]["allow_wildcard"] != true {
            skipped.push(format!(
                "tap {name:?} uses wildcard event_types ({}) but allow_wildcard is not true",
                if types.is_empty() { "none listed".to_string() } else { types.join(", ") }
            ));
            continue;
        }
        let (path, func) = sandbox::prepare::split_target(&lambda);
        taps.push(Tap {
            own: format!("lambda:{path}:{func}"),
            name,
            lambda,
            types: if types.is_empty() { vec!["*".into()] } else { types },
            when: t["filter"]["when"].as_str().filter(|w| !w.trim().is_empty()).map(str::to_string),
            exclude_own: t["exclude_own_origin"].as_bool().unwrap_or(true),
            rate: t["max_rate_per_sec"].as_f64().filter(|r| *r > 0.0).unwrap_or(100.0),
        });
    }
    (taps, skipped)
}

impl Tap {
    /// Its type filter and loop protection (`when` is judged after).
    pub fn wants(&self, e: &crate::protocol::Envelope) -> bool {
        if self.exclude_own && e.source == self.own {
            return false;
        }
        self.types.iter().any(|t| type_matches(t, &e.event_type))
    }
}

/// How often a throttled tap's drops are logged.
const THROTTLE_NOTE: Duration = Duration::from_secs(10);

/// A token bucket: `rate` a second, as many at once.
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn take(&mut self, rate: f64) -> bool {
        self.tokens = (self.tokens + self.at.elapsed().as_secs_f64() * rate).min(rate);
        self.at = Instant::now();
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Start the agent's taps (it started); a running set is replaced.
pub fn start(mesh: &Arc<Mesh>, mb: &Arc<Mailbox>, cfg: &Value) {
    let (taps, skipped) = read(cfg);
    for s in &skipped {
        let _ = mb.with_store(|st| st.log("warn", "tap", "register_failed", s));
    }
    if taps.is_empty() {
        mesh.stop_taps(&mb.id);
        return;
    }
    let task = tokio::spawn(run(mesh.clone(), mb.clone(), taps));
    mesh.set_taps(&mb.id, task.abort_handle());
}

async fn run(mesh: Arc<Mesh>, mb: Arc<Mailbox>, taps: Vec<Tap>) {
    let filter = Filter { agent_id: Some(mb.id.clone()), types: Vec::new() };
    let mut sub = mesh.bus.subscribe(Some(mesh.bus.cursor()), filter);
    let mut buckets: Vec<Bucket> = taps.iter().map(|t| Bucket { tokens: t.rate, at: Instant::now() }).collect();
    // Drops since the last word about them, and when that was.
    let mut dropped = vec![0u64; taps.len()];
    let mut said: Vec<Option<Instant>> = vec![None; taps.len()];
    while let Some(item) = sub.next().await {
        let e = match item {
            Item::Event(e) => e,
            Item::Lagged { missed } => {
                let _ = mb.with_store(|s| s.log("warn", "tap", "lagged", &format!("{missed} events went by unseen")));
                continue;
            }
            Item::Gap { .. } => continue,
        };
        for (i, tap) in taps.iter().enumerate() {
            if !tap.wants(&e.event) {
                continue;
            }
            if !buckets[i].take(tap.rate) {
                dropped[i] += 1;
                // Said at most every ten seconds, with the count.
                if said[i].is_none_or(|t| t.elapsed() >= THROTTLE_NOTE) {
                    let n = std::mem::take(&mut dropped[i]);
                    said[i] = Some(Instant::now());
                    let _ = mb.with_store(|s| {
                        s.log(
                            "warn",
                            "tap",
                            "rate_limited",
                            &format!("Tap {} throttled: {} events/sec exceeded ({n} dropped)", tap.name, tap.rate),
                        )
                    });
                }
                continue;
            }
            let event = serde_json::to_value(&e.event).unwrap_or(Value::Null);
            if let Some(w) = &tap.when
                && !when(&mb.id, tap, w, &event).await
            {
                continue;
            }
            fire(&mb, tap, event).await;
        }
    }
}

/// Judge a tap's `when` (a JavaScript expression over `event`) in a warm
/// realm of its own; anything but a truthy answer is false.
async fn when(agent: &str, tap: &Tap, expr: &str, event: &Value) -> bool {
    let source = format!("export function when(event) {{ return Boolean({expr}); }}\n");
    let path = format!("tap-{}-when.js", tap.name);
    let Ok(prepared) = sandbox::prepare::module(&path, &source) else { return false };
    let req = sandbox::RunReq {
        module: Some(sandbox::ModuleReq {
            path,
            hash: prepared.hash,
            source: prepared.source,
            function: "when".into(),
        }),
        args: event.clone(),
        ..Default::default()
    };
    let warm = format!("{agent}:tap:{}:when", tap.name);
    match sandbox::run(req, Some(&warm), &mut sandbox::NoHost, Duration::from_secs(1)).await {
        Ok(o) => o.error.is_none() && o.value == Some(Value::Bool(true)),
        Err(_) => false,
    }
}

/// Run the tap's lambda on one event (the agent's admission and runners).
async fn fire(mb: &Arc<Mailbox>, tap: &Tap, event: Value) {
    let Ok(_permit) = mb.serving.admit.acquire().await else { return };
    let Some(mut runner) = mb.serving.take_runner().or_else(|| (mb.runner)()) else { return };
    let (path, func) = sandbox::prepare::split_target(&tap.lambda);
    let timeout = runner.code_timeout(None);
    let warm = Some(format!("{}:tap:{}", mb.id, tap.name));
    if let Err(e) = runner.lambda(path, func, event, None, Vec::new(), timeout, "tap", warm).await {
        let _ = runner.log("warn", "tap", "dispatch_error", &format!("Tap {} handler threw: {}", tap.name, e.message));
    }
    mb.serving.give_back(runner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Envelope;
    use serde_json::json;

    #[test]
    fn taps_are_read_with_wildcards_opted_in_and_their_own_events_skipped() {
        let cfg = json!({"umbilical_taps": [
            {"name": "files", "lambda": "taps.ts:on", "filter": {"event_types": ["file.written", "tool.completed"]}},
            {"name": "all", "lambda": "taps.ts", "filter": {"event_types": ["*"], "allow_wildcard": true}, "max_rate_per_sec": 5},
            {"name": "sloppy", "lambda": "taps.ts:x", "filter": {"event_types": ["tool.*"]}},
            {"name": "nothing", "lambda": "taps.ts:x"},
            {"name": "", "lambda": "taps.ts:x"},
        ]});
        let (taps, skipped) = read(&cfg);
        assert_eq!(taps.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["files", "all"]);
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        assert!(skipped[0].contains("allow_wildcard"));
        let ev = |ty: &'static str, source: &str| Envelope::new(ty, Some("a"), source, json!({}));
        assert!(taps[0].wants(&ev("file.written", "agent:t1")));
        assert!(taps[0].wants(&ev("tool.completed", "agent:t1")));
        assert!(!taps[0].wants(&ev("turn.completed", "agent:t1")));
        assert!(!taps[0].wants(&ev("tool.failed", "agent:t1")));
        assert!(!taps[0].wants(&ev("file.written", "lambda:taps.ts:on")), "its own events");
        assert!(taps[1].wants(&ev("turn.completed", "x")));
        assert!(!taps[1].wants(&ev("lambda.completed", "lambda:taps.ts:main")), "`taps.ts` is `taps.ts:main`");
        assert_eq!(taps[1].rate, 5.0);
        let mut b = Bucket { tokens: 2.0, at: Instant::now() };
        assert!(b.take(2.0) && b.take(2.0) && !b.take(2.0));
    }
}
