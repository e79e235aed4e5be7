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

/// One SSE frame for an item of the bus.
pub fn frame(item: &Item) -> String {
    match item {
        Item::Event(e) => format!("id: {}\nevent: {}\ndata: {}\n\n", e.cursor, e.event.event_type, e.json()),
        Item::Lagged { missed } => {
            format!("event: gap\ndata: {}\n\n", json!({"reason": "lagged", "missed": missed}))
        }
        Item::Gap { since: requested, oldest } => format!(
            "event: gap\ndata: {}\n\n",
            json!({"reason": "replay_window", "requested_since": requested, "oldest_cursor": oldest})
        ),
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
                            if let (Some(l), Item::Event(e)) = (&only_loop, &item) {
                                let tagged = e.event.payload.get("loop").and_then(|v| v.as_str()).unwrap_or("main");
                                if tagged != &**l {
                                    continue;
                                }
                            }
                            return Some((frame(&item), (sub, false, closing)));
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
