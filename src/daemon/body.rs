//! Request bodies and error answers at the edge of the control API. A body
//! is read here, whole, before any handler sees it: a declared length over
//! the limit is answered 413 at once (a client that declared 1 GB and sent
//! 64 KB used to hold its connection with no answer), one that grows past
//! it while arriving is 413 too, and one that stops arriving is 408 after
//! the body timeout. Every error answer leaves as `{error, code?}` JSON,
//! including those axum writes itself as plain text or an empty body
//! (unknown routes, methods a route does not serve, rejected extractors),
//! and closes the connection when the request came with a body.

use std::sync::Arc;

use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::ApiError;
use super::conn::Limits;

fn too_large(max: usize) -> Response {
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("the request body is over the limit of {max} bytes"))
        .with_code("BODY_TOO_LARGE")
        .into_response()
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

/// Read the body within the limits, or answer 413 / 408 / 400.
pub async fn read_body(State(limits): State<Arc<Limits>>, req: Request, next: Next) -> Response {
    // A whole agent file, streamed to disk by its route with limits of its own.
    if req.uri().path() == super::moves::IMPORT {
        return next.run(req).await;
    }
    if declared_length(req.headers()).is_some_and(|n| n > limits.max_body as u64) {
        return too_large(limits.max_body);
    }
    if req.body().is_end_stream() {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let read = tokio::time::timeout(limits.body_timeout, Limited::new(body, limits.max_body).collect()).await;
    let bytes = match read {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => return too_large(limits.max_body),
        Ok(Err(e)) => {
            return ApiError::bad(format!("the request body could not be read: {e}"))
                .with_code("BAD_BODY")
                .into_response();
        }
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive within {} ms", limits.body_timeout.as_millis()),
            )
            .with_code("BODY_TIMEOUT")
            .into_response();
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

fn is_json(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/json"))
}

/// Turn error answers that are not JSON (axum's own) into `{error, code}`.
/// An error answer to a request that came with a body also closes the
/// connection: the body may be left unread (refused by its declared length,
/// by the guard, or cut off), so the client must not send its next request
/// on it (it would find the connection closed under it).
pub async fn json_errors(req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let had_body = !req.body().is_end_stream();
    let mut resp = next.run(req).await;
    let status = resp.status();
    if had_body && (status.is_client_error() || status.is_server_error()) {
        resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if !(status.is_client_error() || status.is_server_error()) || is_json(resp.headers()) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = match axum::body::to_bytes(body, 64 << 10).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_string(),
        Err(_) => String::new(),
    };
    let allow = parts.headers.get(header::ALLOW).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let (error, code) = match status {
        StatusCode::NOT_FOUND => (format!("no route {method} {path}"), Some("NO_ROUTE")),
        StatusCode::METHOD_NOT_ALLOWED => {
            (format!("{method} is not served on {path} (allowed: {allow})"), Some("METHOD_NOT_ALLOWED"))
        }
        StatusCode::PAYLOAD_TOO_LARGE => (text.clone(), Some("BODY_TOO_LARGE")),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (text.clone(), Some("UNSUPPORTED_MEDIA_TYPE")),
        StatusCode::REQUEST_TIMEOUT => (text.clone(), Some("TIMEOUT")),
        _ => (text.clone(), None),
    };
    let error = if error.is_empty() { status.canonical_reason().unwrap_or("error").to_string() } else { error };
    let mut v = serde_json::json!({"error": error});
    if let Some(c) = code {
        v["code"] = serde_json::json!(c);
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Response::from_parts(parts, Body::from(v.to_string()))
}
