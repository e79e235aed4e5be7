//! `GET /events`: the event stream as server-sent events (spec/daemon.md
//! §5). `: connected` first; then the ring replayed from `since` (or the
//! `Last-Event-ID` a reconnecting client sends), then live events; a
//! heartbeat comment every 30 s; a `gap` event when the client asked for a
//! cursor older than the ring holds, or fell behind while connected.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::json;

use super::routes::Q;
use super::{ApiError, AppState};
use crate::runtime::bus::{Filter, Item};

/// At most this much of a stream goes out as one chunk: what is ready when
/// a client is written to goes together (one write and one chunk header
/// instead of one per event), without holding a slow client's backlog.
const BATCH_BYTES: usize = 64 * 1024;

/// Append one SSE frame for an item of the bus.
pub fn push_frame(out: &mut String, item: &Item) {
    use std::fmt::Write;
    // Writing into a String cannot fail.
    let _ = match item {
        Item::Event(e) => write!(out, "id: {}\nevent: {}\ndata: {}\n\n", e.cursor, e.event.event_type, e.json()),
        Item::Lagged { missed } => {
            write!(out, "event: gap\ndata: {}\n\n", json!({"reason": "lagged", "missed": missed}))
        }
        Item::Gap { since: requested, oldest } => write!(
            out,
            "event: gap\ndata: {}\n\n",
            json!({"reason": "replay_window", "requested_since": requested, "oldest_cursor": oldest})
        ),
    };
}

/// Whether a `loop=NAME` stream leaves this item out.
fn other_loop(only_loop: Option<&str>, item: &Item) -> bool {
    match (only_loop, item) {
        (Some(l), Item::Event(e)) => e.event.payload.get("loop").and_then(|v| v.as_str()).unwrap_or("main") != l,
        _ => false,
    }
}

/// `GET /agents/:id/events`: one agent's stream (the fleet's, filtered).
pub async fn agent_events(
    State(s): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: HeaderMap,
    Query(mut q): Q,
) -> Result<Response, ApiError> {
    let (id, _) = s.agent(&id).await?;
    q.insert("agentId".into(), id);
    events(State(s), headers, Query(q)).await
}

pub async fn events(State(s): State<AppState>, headers: HeaderMap, Query(q): Q) -> Result<Response, ApiError> {
    let since = match q.get("since") {
        Some(_) => Some(super::routes::int(&q, "since", 0, 0, super::routes::MAX_SAFE)? as u64),
        None => headers
            .get("last-event-id")
            .and_then(|h| h.to_str().ok())
            .map(|v| {
                v.parse::<u64>().map_err(|_| ApiError::bad(format!("Last-Event-ID must be an integer, got \"{v}\"")))
            })
            .transpose()?,
    };
    let agent_id = match q.get("agentId") {
        Some(a) => Some(s.agent(a).await.map(|(id, _)| id).unwrap_or_else(|_| a.clone())),
        None => None,
    };
    let types: Vec<String> = q
        .get("types")
        .map(|t| t.split(',').map(str::trim).filter(|t| !t.is_empty()).map(String::from).collect())
        .unwrap_or_default();
    // Absent `since` replays the whole ring, as the reference does.
    let sub = s.bus.subscribe(Some(since.unwrap_or(0)), Filter { agent_id, types });
    let heartbeat = s.heartbeat;
    let closing = s.closing.clone();
    // One loop's events (`loop=NAME`; `main` is the events no side loop tagged).
    let only_loop: Option<Arc<str>> = q.get("loop").map(|l| Arc::from(l.as_str()));
    let stream = futures_util::stream::unfold((sub, true, closing), move |(mut sub, first, mut closing)| {
        let only_loop = only_loop.clone();
        async move {
            if first {
                return Some((": connected\n\n".to_string(), (sub, false, closing)));
            }
            loop {
                if *closing.borrow() {
                    return None;
                }
                tokio::select! {
                    r = tokio::time::timeout(heartbeat, sub.next()) => match r {
                        Ok(Some(item)) => {
                            if other_loop(only_loop.as_deref(), &item) {
                                continue;
                            }
                            let mut out = String::with_capacity(512);
                            push_frame(&mut out, &item);
                            // Whatever else is ready goes in the same chunk.
                            while out.len() < BATCH_BYTES {
                                match sub.try_next() {
                                    Some(item) if other_loop(only_loop.as_deref(), &item) => {}
                                    Some(item) => push_frame(&mut out, &item),
                                    None => break,
                                }
                            }
                            return Some((out, (sub, false, closing)));
                        }
                        Ok(None) => return None,
                        Err(_) => {
                            return Some((format!(": heartbeat {}\n\n", crate::store::now_ms()), (sub, false, closing)));
                        }
                    },
                    // The daemon is shutting down: end the stream.
                    _ = closing.changed() => return None,
                }
            }
        }
    })
    .map(Ok::<_, Infallible>);
    let mut resp = axum::body::Body::from_stream(stream).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, no-transform"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Envelope;
    use crate::runtime::bus::Bus;

    #[test]
    fn frames_append_and_a_loop_stream_keeps_its_own() {
        let bus = Bus::new();
        bus.publish(Envelope::new("turn.completed", Some("a"), "agent:a", json!({"loop": "research"})));
        bus.publish(Envelope::new("turn.completed", Some("a"), "agent:a", json!({})));
        let mut sub = bus.subscribe(Some(0), Filter::default());
        let (side, main) = (sub.try_next().unwrap(), sub.try_next().unwrap());
        let mut out = String::new();
        push_frame(&mut out, &side);
        push_frame(&mut out, &main);
        push_frame(&mut out, &Item::Lagged { missed: 3 });
        assert!(out.starts_with("id: 1\nevent: turn.completed\ndata: {"), "{out}");
        assert_eq!(out.matches("\n\n").count(), 3);
        assert!(out.ends_with("event: gap\ndata: {\"reason\":\"lagged\",\"missed\":3}\n\n"), "{out}");
        assert!(!other_loop(Some("research"), &side) && other_loop(Some("research"), &main));
        assert!(other_loop(Some("main"), &side) && !other_loop(Some("main"), &main));
        assert!(!other_loop(None, &side) && !other_loop(Some("x"), &Item::Lagged { missed: 1 }));
    }
}
