//! The event bus: every observable fact goes through here. Each envelope gets
//! a process-wide monotonic cursor and lands in a bounded ring for replay;
//! live delivery is a broadcast channel, so a slow subscriber never stalls
//! the runtime: it falls behind, and is told how many events it missed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::protocol::Envelope;

/// Envelopes kept for replay (spec: 1000).
pub const RING: usize = 1000;

/// An envelope with its bus cursor.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stamped {
    pub cursor: u64,
    pub event: Envelope,
    /// `{"cursor":…,"event":…}` serialised once, however many streams send it.
    #[serde(skip)]
    json: std::sync::OnceLock<String>,
}

impl PartialEq for Stamped {
    fn eq(&self, other: &Self) -> bool {
        self.cursor == other.cursor && self.event == other.event
    }
}

impl Stamped {
    /// The item as JSON (`{"cursor":…,"event":…}`), computed on first use.
    pub fn json(&self) -> &str {
        self.json.get_or_init(|| {
            let mut s = String::with_capacity(256);
            s.push_str("{\"cursor\":");
            s.push_str(&self.cursor.to_string());
            s.push_str(",\"event\":");
            s.push_str(&serde_json::to_string(&self.event).unwrap_or_else(|_| "null".into()));
            s.push('}');
            s
        })
    }
}

struct Ring {
    next: u64,
    items: VecDeque<Arc<Stamped>>,
}

/// The bus. Cheap to share behind an `Arc`.
pub struct Bus {
    ring: Mutex<Ring>,
    capacity: usize,
    tx: broadcast::Sender<Arc<Stamped>>,
}

/// Which events a subscriber wants.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this agent's events.
    pub agent_id: Option<String>,
    /// Exact types, `*`, or `<family>.*`; empty means everything.
    pub types: Vec<String>,
}

impl Filter {
    pub fn matches(&self, e: &Envelope) -> bool {
        if let Some(a) = &self.agent_id
            && e.agent_id.as_deref() != Some(a.as_str())
        {
            return false;
        }
        self.types.is_empty() || self.types.iter().any(|t| type_matches(t, &e.event_type))
    }
}

/// `*`, `family.*` or an exact type.
pub fn type_matches(pattern: &str, ty: &str) -> bool {
    match pattern.strip_suffix(".*") {
        _ if pattern == "*" => true,
        Some(prefix) => ty.len() > prefix.len() && ty.starts_with(prefix) && ty.as_bytes()[prefix.len()] == b'.',
        None => pattern == ty,
    }
}

/// What a subscription yields.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Event(Arc<Stamped>),
    /// The subscriber fell behind and `missed` events were skipped.
    Lagged {
        missed: u64,
    },
    /// The requested cursor is older than the ring holds: events between
    /// `since` and `oldest` are gone.
    Gap {
        since: u64,
        oldest: u64,
    },
}

impl Bus {
    pub fn new() -> Arc<Self> {
        Self::with_capacity(RING)
    }

    pub fn with_capacity(capacity: usize) -> Arc<Self> {
        let (tx, _) = broadcast::channel(capacity.max(16));
        Arc::new(Bus { ring: Mutex::new(Ring { next: 1, items: VecDeque::with_capacity(capacity) }), capacity, tx })
    }

    /// Publish one envelope; returns its cursor.
    pub fn publish(&self, event: Envelope) -> u64 {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let cursor = ring.next;
        ring.next += 1;
        let item = Arc::new(Stamped { cursor, event, json: std::sync::OnceLock::new() });
        if ring.items.len() == self.capacity {
            ring.items.pop_front();
        }
        ring.items.push_back(item.clone());
        // Sent under the lock so a new subscriber's backlog and live stream
        // neither overlap nor leave a hole. No receivers is fine.
        let _ = self.tx.send(item);
        cursor
    }

    /// The last cursor handed out (0 before any event).
    pub fn cursor(&self) -> u64 {
        self.ring.lock().map(|r| r.next - 1).unwrap_or(0)
    }

    /// Subscribe: replay ring entries after `since` (absent = the whole
    /// ring), then live events, all through `filter`.
    pub fn subscribe(&self, since: Option<u64>, filter: Filter) -> Subscription {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let since = since.unwrap_or(0);
        let oldest = ring.items.front().map(|i| i.cursor).unwrap_or(ring.next);
        let mut backlog: VecDeque<Item> = ring
            .items
            .iter()
            .filter(|i| i.cursor > since && filter.matches(&i.event))
            .cloned()
            .map(Item::Event)
            .collect();
        if since > 0 && since + 1 < oldest {
            backlog.push_front(Item::Gap { since, oldest });
        }
        let rx = self.tx.subscribe();
        Subscription { backlog, rx, filter }
    }
}

/// A live, filtered view of the bus.
pub struct Subscription {
    backlog: VecDeque<Item>,
    rx: broadcast::Receiver<Arc<Stamped>>,
    filter: Filter,
}

impl Subscription {
    /// The next item; `None` once the bus is gone.
    pub async fn next(&mut self) -> Option<Item> {
        if let Some(i) = self.backlog.pop_front() {
            return Some(i);
        }
        loop {
            let r = self.rx.recv().await.map_err(|e| match e {
                broadcast::error::RecvError::Lagged(n) => Some(n),
                broadcast::error::RecvError::Closed => None,
            });
            if let Some(item) = self.accept(r)? {
                return Some(item);
            }
        }
    }

    /// The next item if one is ready now.
    pub fn try_next(&mut self) -> Option<Item> {
        if let Some(i) = self.backlog.pop_front() {
            return Some(i);
        }
        loop {
            let r = self.rx.try_recv().map_err(|e| match e {
                broadcast::error::TryRecvError::Lagged(n) => Some(n),
                _ => None,
            });
            if let Some(item) = self.accept(r)? {
                return Some(item);
            }
        }
    }

    /// One receive through the filter: `None` ends the subscription (or
    /// nothing is ready), `Some(None)` skips a filtered-out event.
    fn accept(&self, r: Result<Arc<Stamped>, Option<u64>>) -> Option<Option<Item>> {
        match r {
            Ok(e) if self.filter.matches(&e.event) => Some(Some(Item::Event(e))),
            Ok(_) => Some(None),
            Err(Some(missed)) => Some(Some(Item::Lagged { missed })),
            Err(None) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Envelope, kind};

    fn ev(agent: &str, ty: &'static str) -> Envelope {
        Envelope::new(ty, Some(agent), "system:test", serde_json::json!({}))
    }

    #[test]
    fn patterns() {
        assert!(type_matches("*", "tool.started"));
        assert!(type_matches("tool.*", "tool.started"));
        assert!(!type_matches("tool.*", "tools.x"));
        assert!(!type_matches("tool.*", "tool"));
        assert!(type_matches("agent.*", "agent.state.changed"));
        assert!(type_matches("tool.started", "tool.started"));
        assert!(!type_matches("tool.started", "tool.completed"));
    }

    #[tokio::test]
    async fn replay_then_live_without_holes_or_duplicates() {
        let bus = Bus::with_capacity(100);
        for _ in 0..5 {
            bus.publish(ev("a", kind::TOOL_STARTED));
        }
        let mut sub = bus.subscribe(Some(2), Filter::default());
        bus.publish(ev("a", kind::TOOL_COMPLETED));
        let mut cursors = Vec::new();
        while let Some(Item::Event(e)) = sub.try_next() {
            cursors.push(e.cursor);
        }
        assert_eq!(cursors, [3, 4, 5, 6]);
        assert_eq!(bus.cursor(), 6);
    }

    #[tokio::test]
    async fn filters_by_agent_and_type() {
        let bus = Bus::new();
        let mut sub = bus.subscribe(None, Filter { agent_id: Some("b".into()), types: vec!["tool.*".into()] });
        bus.publish(ev("a", kind::TOOL_STARTED));
        bus.publish(ev("b", kind::FILE_READ));
        bus.publish(ev("b", kind::TOOL_FAILED));
        match sub.next().await.unwrap() {
            Item::Event(e) => assert_eq!((e.cursor, &*e.event.event_type), (3, "tool.failed")),
            other => panic!("{other:?}"),
        }
        assert!(sub.try_next().is_none());
    }

    #[tokio::test]
    async fn slow_subscriber_lags_and_is_told() {
        let bus = Bus::with_capacity(16);
        let mut sub = bus.subscribe(None, Filter::default());
        for _ in 0..40 {
            bus.publish(ev("a", kind::TOOL_STARTED));
        }
        match sub.next().await.unwrap() {
            Item::Lagged { missed } => assert_eq!(missed, 24),
            other => panic!("{other:?}"),
        }
        match sub.next().await.unwrap() {
            Item::Event(e) => assert_eq!(e.cursor, 25),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn too_old_a_cursor_is_marked() {
        let bus = Bus::with_capacity(10);
        for _ in 0..30 {
            bus.publish(ev("a", kind::TOOL_STARTED));
        }
        let mut sub = bus.subscribe(Some(5), Filter::default());
        assert_eq!(sub.try_next(), Some(Item::Gap { since: 5, oldest: 21 }));
        match sub.try_next() {
            Some(Item::Event(e)) => assert_eq!(e.cursor, 21),
            other => panic!("{other:?}"),
        }
    }
}
