//! Server-sent events from a provider response: the body stream split into
//! events by `eventsource-stream`, a read failure mid-stream reported as a
//! transient provider error.

use futures_util::{Stream, StreamExt};

use super::ProviderError;

/// One SSE event: its `event:` name (empty when absent) and `data:`.
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

pub fn events(provider: String, resp: reqwest::Response) -> impl Stream<Item = Result<SseEvent, ProviderError>> {
    use eventsource_stream::Eventsource;
    resp.bytes_stream().eventsource().map(move |r| match r {
        Ok(e) => Ok(SseEvent { event: e.event, data: e.data }),
        Err(e) => Err(ProviderError::new(
            &provider,
            super::ErrorKind::Transient,
            None,
            format!("the response stream broke: {e}"),
        )),
    })
}

/// Send a request and turn a non-2xx answer into a classified error.
pub async fn send(provider: &str, req: reqwest::RequestBuilder) -> Result<reqwest::Response, ProviderError> {
    let resp = req.send().await.map_err(|e| ProviderError::transport(provider, &e))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let retry = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(super::parse_retry_after);
    let body = resp.text().await.unwrap_or_default();
    Err(ProviderError::from_status(provider, status.as_u16(), &body, retry))
}

/// A provider's event parser: SSE events in, model events out.
pub trait Parser: Send + 'static {
    fn feed(&mut self, e: SseEvent) -> Result<Vec<super::ModelEvent>, ProviderError>;
    /// Called when the body ends; may complete a response that had no
    /// explicit terminator.
    fn end(&mut self) -> Vec<super::ModelEvent> {
        Vec::new()
    }
}

/// Turn an SSE body into a model event stream with `parser`.
pub fn parse(provider: &str, resp: reqwest::Response, parser: impl Parser) -> super::EventStream {
    use std::collections::VecDeque;
    let sse = events(provider.to_string(), resp).boxed();
    let state = (sse, parser, VecDeque::new(), false);
    futures_util::stream::unfold(state, |(mut sse, mut parser, mut pending, mut ended)| async move {
        loop {
            if let Some(e) = pending.pop_front() {
                return Some((Ok(e), (sse, parser, pending, ended)));
            }
            if ended {
                return None;
            }
            match sse.next().await {
                Some(Ok(e)) => match parser.feed(e) {
                    Ok(evs) => pending.extend(evs),
                    Err(err) => return Some((Err(err), (sse, parser, pending, true))),
                },
                Some(Err(err)) => return Some((Err(err), (sse, parser, pending, true))),
                None => {
                    ended = true;
                    pending.extend(parser.end());
                }
            }
        }
    })
    .boxed()
}
