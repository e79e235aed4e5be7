//! An in-process provider that replays scripted responses, with an optional
//! latency per call: the executor's tests and benchmarks run on it, through
//! the same trait and stream as the real providers.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;

use super::{EventStream, ModelEvent, ModelRequest, Provider, ProviderError, Usage};

/// One scripted reply.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Plain text (ends an interactive turn).
    Text(String),
    /// Tool calls: (name, input).
    Tools(Vec<(String, Value)>),
    /// A provider failure.
    Fail(ProviderError),
}

/// Builds a reply when the script has run out.
type Fallback = Box<dyn Fn(&ModelRequest) -> Reply + Send + Sync>;

pub struct Scripted {
    id: String,
    latency: Duration,
    replies: Mutex<VecDeque<Reply>>,
    /// Used when the script runs out.
    fallback: Option<Fallback>,
    calls: Mutex<Vec<ModelRequest>>,
    count: std::sync::atomic::AtomicUsize,
    record: bool,
}

impl Scripted {
    pub fn new(replies: impl IntoIterator<Item = Reply>) -> Self {
        Scripted {
            id: "scripted".into(),
            latency: Duration::ZERO,
            replies: Mutex::new(replies.into_iter().collect()),
            fallback: None,
            calls: Mutex::new(Vec::new()),
            count: std::sync::atomic::AtomicUsize::new(0),
            record: true,
        }
    }

    pub fn with_latency(mut self, d: Duration) -> Self {
        self.latency = d;
        self
    }

    pub fn with_fallback(mut self, f: impl Fn(&ModelRequest) -> Reply + Send + Sync + 'static) -> Self {
        self.fallback = Some(Box::new(f));
        self
    }

    /// Keep only a count of requests, not the requests (benchmarks).
    pub fn without_recording(mut self) -> Self {
        self.record = false;
        self
    }

    /// The requests seen so far.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    pub fn call_count(&self) -> usize {
        self.count.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Provider for Scripted {
    fn id(&self) -> &str {
        &self.id
    }

    fn stream(&self, req: ModelRequest) -> futures_util::future::BoxFuture<'_, Result<EventStream, ProviderError>> {
        Box::pin(async move {
            // The reply is taken when the request arrives, as a server
            // would: a call aborted while "thinking" still used it.
            let next = self.replies.lock().ok().and_then(|mut r| r.pop_front());
            let reply = match (next, &self.fallback) {
                (Some(r), _) => r,
                (None, Some(f)) => f(&req),
                (None, None) => Reply::Text("(script exhausted)".into()),
            };
            self.count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if self.record
                && let Ok(mut c) = self.calls.lock()
            {
                c.push(req);
            }
            // An instant model answers at once, as a resolved promise does
            // in the reference's mock (the scheduler's budget still lets
            // other tasks in on a long run of them).
            if self.latency.is_zero() {
                tokio::task::consume_budget().await;
            } else {
                tokio::time::sleep(self.latency).await;
            }
            let mut events = Vec::new();
            let stop = match reply {
                Reply::Fail(e) => return Err(e),
                Reply::Text(t) => {
                    // Several deltas, as a real stream would send.
                    let mid = t.char_indices().nth(t.chars().count() / 2).map(|(i, _)| i).unwrap_or(0);
                    events.push(ModelEvent::TextDelta(t[..mid].to_string()));
                    events.push(ModelEvent::TextDelta(t[mid..].to_string()));
                    "end_turn"
                }
                Reply::Tools(calls) => {
                    for (i, (name, input)) in calls.into_iter().enumerate() {
                        events.push(ModelEvent::ToolCall {
                            id: format!("toolu_{:06}", rand::random::<u32>() % 1_000_000 + i as u32),
                            name,
                            input,
                        });
                    }
                    "tool_use"
                }
            };
            events.push(ModelEvent::Usage(Usage { input: 100, output: 20, ..Default::default() }));
            events.push(ModelEvent::Stop(stop.into()));
            Ok(futures_util::stream::iter(events.into_iter().map(Ok)).boxed())
        })
    }
}
