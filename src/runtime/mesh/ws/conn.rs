//! One WebSocket, either side (messaging.md §12): the mutual DID
//! handshake, then each frame to the route's lambda — `{type, connection_id,
//! remote_did, data, binary, timestamp}`, what it returns is sent back — or,
//! without a lambda, an ALF message into the inbox through the same ingress
//! as HTTP. Keepalive pings (no pong in 10 s: dead), a frame rate limit
//! (close 1008), `ws.opened` and `ws.closed` on the bus.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use super::{Frame, Socket, Wire};
use crate::identity::attest::{sign_str, verify_str};
use crate::protocol::{Envelope, kind};
use crate::runtime::mesh::ingress::{self, Origin};
use crate::runtime::mesh::{Mailbox, Mesh};

/// How long a handshake may take.
const AUTH_WAIT: Duration = Duration::from_secs(30);
/// A signed handshake's timestamp may be this far from our clock.
const CLOCK_SKEW_MS: i64 = 30_000;
/// No pong this long after a ping: the connection is dead.
const PONG_WAIT: Duration = Duration::from_secs(10);
/// Frames held while the handshake is pending.
const HELD_MAX: usize = 100;
/// Frames a connection may send each second by default (a route's
/// `max_frames_per_sec`), with a burst of as many again.
pub const RATE: f64 = 1000.0;

/// What a connection's frames go to.
#[derive(Debug, Clone, PartialEq)]
pub enum Handler {
    /// `file.ts:fn`.
    Lambda(String),
    /// ALF messages into the inbox.
    Inbox,
}

/// The lambda target that means the runtime's own handler: ALF messages
/// into the agent's inbox (a route's `lambda` is required by the format).
pub const INBOX: &str = "adf:inbox";

impl Handler {
    /// A route's or connection's `lambda`: [`INBOX`] (or none) is the inbox.
    pub fn of(lambda: &str) -> Handler {
        if lambda.is_empty() || lambda == INBOX { Handler::Inbox } else { Handler::Lambda(lambda.to_string()) }
    }
}

/// How an outbound connection authenticates (`auth`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Auth {
    /// When the agent has a key.
    Auto,
    Required,
    None,
}

impl Auth {
    pub fn parse(s: Option<&str>) -> Auth {
        match s {
            Some("required") => Auth::Required,
            Some("none") => Auth::None,
            _ => Auth::Auto,
        }
    }
}

/// Which side of the handshake we are.
#[derive(Debug, Clone)]
pub enum Role {
    /// The agent's route; `require`: the agent does not take unsigned
    /// peers (`security.allow_unsigned` is false).
    Server { require: bool },
    /// Our connection out; `expect`: the DID the server must prove.
    Client { auth: Auth, expect: Option<String> },
}

/// Everything a connection needs besides its frames.
pub struct Setup {
    pub mesh: Arc<Mesh>,
    pub mb: Arc<Mailbox>,
    pub sock: Arc<Socket>,
    pub handler: Handler,
    pub role: Role,
    pub keepalive: Duration,
    /// The peer's scope and address (ingress of inbox messages).
    pub scope: &'static str,
    pub peer: Option<IpAddr>,
    /// Extra fields of the lambda's `open` event (`url_params`, `headers`).
    pub open: Value,
    /// Told when the handshake is through.
    pub ready: Option<tokio::sync::oneshot::Sender<()>>,
    /// Frames the peer may send each second before it is closed (1008).
    pub rate: f64,
}

/// How a connection ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    pub code: u16,
    pub reason: String,
    /// It got past its handshake.
    pub opened: bool,
}

fn ended(code: u16, reason: impl Into<String>, opened: bool) -> Ended {
    Ended { code, reason: reason.into(), opened }
}

/// The agent's signing key and DID (read on the mailbox's connection).
async fn identity(mb: &Arc<Mailbox>) -> (Option<ed25519_dalek::SigningKey>, String) {
    let mb2 = mb.clone();
    let key = tokio::task::spawn_blocking(move || mb2.with_store(|s| s.signing_key().ok().flatten()).ok().flatten())
        .await
        .ok()
        .flatten();
    (key, mb.did())
}

fn nonce() -> String {
    let b: [u8; 32] = rand::random();
    crate::identity::hex(&b)
}

/// Check a client's `auth` frame: its DID, or why not.
fn check_auth(v: &Value) -> Result<(String, String, i64, bool), String> {
    let did = v["did"].as_str().filter(|d| !d.is_empty()).ok_or("Invalid client DID")?.to_string();
    let nonce = v["nonce"].as_str().unwrap_or_default().to_string();
    let ts = v["timestamp"].as_i64().unwrap_or(0);
    let Some(sig) = v["signature"].as_str() else { return Ok((did, nonce, ts, false)) };
    if (crate::store::now_ms() - ts).abs() > CLOCK_SKEW_MS {
        return Err("Timestamp out of range".into());
    }
    if crate::store::identity::did_public_key(&did).is_none() {
        return Err("Invalid client DID".into());
    }
    if !sig.starts_with("ed25519:") {
        return Err("Unsupported signature algorithm".into());
    }
    verify_str(&did, format!("{did}{nonce}{ts}").as_bytes(), sig).map_err(|_| "Invalid signature".to_string())?;
    Ok((did, nonce, ts, true))
}

/// Drive a connection until it ends.
pub async fn drive(mut s: Setup, mut wire: Wire) -> Ended {
    let (key, my_did) = identity(&s.mb).await;
    // The handshake.
    let mut held: VecDeque<Frame> = VecDeque::new();
    let auth_frame = |v: &Value| v["type"] == "auth";
    match &s.role {
        Role::Client { auth, expect } => {
            let signer = match (auth, &key) {
                (Auth::None, _) | (Auth::Auto, None) => None,
                (Auth::Required, None) => {
                    s.sock.close(4001, "Auth required but no private key");
                    return ended(4001, "Auth required but no private key", false);
                }
                (_, Some(k)) => Some(k),
            };
            if let Some(k) = signer {
                let (n, ts) = (nonce(), crate::store::now_ms());
                let sig = sign_str(k, format!("{my_did}{n}{ts}").as_bytes());
                s.sock.push(Frame::Text(
                    json!({"type": "auth", "did": my_did, "nonce": n, "timestamp": ts, "signature": sig}).to_string(),
                ));
                let deadline = tokio::time::Instant::now() + AUTH_WAIT;
                let result = loop {
                    match tokio::time::timeout_at(deadline, wire.rx.recv()).await {
                        Err(_) => break Err("Auth timeout".to_string()),
                        Ok(None) | Ok(Some(Frame::Close(..))) => break Err("closed during the handshake".into()),
                        Ok(Some(Frame::Text(t))) => match serde_json::from_str::<Value>(&t) {
                            Ok(v) if v["type"] == "auth_result" => break Ok(v),
                            _ if held.len() < HELD_MAX => held.push_back(Frame::Text(t)),
                            _ => {}
                        },
                        Ok(Some(f @ Frame::Binary(_))) if held.len() < HELD_MAX => held.push_back(f),
                        Ok(Some(_)) => {}
                    }
                };
                let verdict = result.and_then(|v| {
                    if v["success"] != true {
                        return Err(v["error"].as_str().unwrap_or("refused").to_string());
                    }
                    match (v["server_did"].as_str(), v["signature"].as_str()) {
                        (Some(sd), Some(sig)) if v["nonce"].as_str() == Some(n.as_str()) => {
                            verify_str(sd, format!("{sd}{n}{ts}").as_bytes(), sig)
                                .map_err(|_| "the server's signature does not verify".to_string())?;
                            Ok(Some(sd.to_string()))
                        }
                        _ => Ok(None),
                    }
                });
                let proved = match verdict {
                    Ok(p) => p,
                    Err(e) => {
                        s.sock.close(4001, "Auth failed");
                        return ended(4001, format!("Auth failed: {e}"), false);
                    }
                };
                match (expect, &proved) {
                    (Some(want), Some(got)) if want != got => {
                        s.sock.close(4001, "DID mismatch");
                        return ended(4001, format!("Auth failed: the server is {got}, not {want}"), false);
                    }
                    (Some(want), None) => {
                        s.sock.close(4001, "DID not proved");
                        return ended(4001, format!("Auth failed: the server did not prove it is {want}"), false);
                    }
                    _ => {}
                }
                if let Some(did) = proved {
                    s.sock.set_remote(&did, true);
                }
            }
        }
        Role::Server { require: true } => {
            let deadline = tokio::time::Instant::now() + AUTH_WAIT;
            loop {
                match tokio::time::timeout_at(deadline, wire.rx.recv()).await {
                    Err(_) => {
                        s.sock.close(4001, "Auth timeout");
                        return ended(4001, "Auth timeout", false);
                    }
                    Ok(None) | Ok(Some(Frame::Close(..))) => return ended(1006, "closed during the handshake", false),
                    Ok(Some(Frame::Text(t))) => match serde_json::from_str::<Value>(&t) {
                        Ok(v) if auth_frame(&v) => {
                            match check_auth(&v) {
                                Ok((did, n, ts, true)) => {
                                    answer_auth(&s.sock, key.as_ref(), &my_did, &n, ts);
                                    s.sock.set_remote(&did, true);
                                }
                                Ok(_) => return refuse_auth(&s.sock, "Invalid signature"),
                                Err(e) => return refuse_auth(&s.sock, &e),
                            }
                            break;
                        }
                        _ if held.len() < HELD_MAX => held.push_back(Frame::Text(t)),
                        _ => {
                            let _ = s.mb.with_store(|st| {
                                st.log(
                                    "warn",
                                    "ws",
                                    "held_dropped",
                                    "a frame before the handshake was dropped (100 held)",
                                )
                            });
                        }
                    },
                    Ok(Some(f @ Frame::Binary(_))) if held.len() < HELD_MAX => held.push_back(f),
                    Ok(Some(_)) => {}
                }
            }
        }
        Role::Server { require: false } => {}
    }
    s.sock.ready.store(true, Ordering::Relaxed);
    s.mesh.sockets.insert(s.sock.clone());
    if let Some(tx) = s.ready.take() {
        let _ = tx.send(());
    }
    let started = Instant::now();
    publish(
        &s,
        kind::WS_OPENED,
        json!({"connection_id": s.sock.id, "direction": s.sock.direction.as_str(),
        "remote_did": s.sock.remote_did(), "url_params": s.open["url_params"]}),
    );
    if let Handler::Lambda(_) = &s.handler {
        let mut ev = event(&s.sock, "open");
        if let (Some(e), Some(o)) = (ev.as_object_mut(), s.open.as_object()) {
            e.extend(o.clone());
        }
        dispatch(&s, ev).await;
    }
    let end = run(&s, &mut wire, held, key.as_ref(), &my_did).await;
    s.mesh.sockets.remove(&s.sock.id);
    s.sock.unbind();
    if let Handler::Lambda(_) = &s.handler {
        let mut ev = event(&s.sock, "close");
        ev["code"] = json!(end.code);
        ev["reason"] = json!(end.reason);
        dispatch(&s, ev).await;
    }
    publish(
        &s,
        kind::WS_CLOSED,
        json!({"connection_id": s.sock.id, "direction": s.sock.direction.as_str(),
        "remote_did": s.sock.remote_did(), "code": end.code, "reason": end.reason,
        "duration_ms": started.elapsed().as_millis() as u64}),
    );
    Ended { opened: true, ..end }
}

fn answer_auth(sock: &Socket, key: Option<&ed25519_dalek::SigningKey>, my_did: &str, n: &str, ts: i64) {
    let v = match key {
        Some(k) if !my_did.is_empty() => json!({"type": "auth_result", "success": true, "server_did": my_did,
            "nonce": n, "signature": sign_str(k, format!("{my_did}{n}{ts}").as_bytes())}),
        _ => json!({"type": "auth_result", "success": true}),
    };
    sock.push(Frame::Text(v.to_string()));
}

fn refuse_auth(sock: &Socket, why: &str) -> Ended {
    sock.push(Frame::Text(json!({"type": "auth_result", "success": false, "error": why}).to_string()));
    sock.close(4001, "Auth failed");
    ended(4001, format!("Auth failed: {why}"), false)
}

fn publish(s: &Setup, ty: &'static str, payload: Value) {
    s.mesh.bus.publish(Envelope::new(ty, Some(&s.sock.agent_id), "system:ws", payload));
}

fn event(sock: &Socket, ty: &str) -> Value {
    let did = sock.remote_did();
    json!({"type": ty, "connection_id": sock.id, "remote_did": if did.is_empty() { Value::Null } else { json!(did) },
        "timestamp": crate::store::now_ms()})
}

/// The frames after the handshake.
async fn run(
    s: &Setup,
    wire: &mut Wire,
    mut held: VecDeque<Frame>,
    key: Option<&ed25519_dalek::SigningKey>,
    my_did: &str,
) -> Ended {
    let rate = s.rate.max(1.0);
    let mut tokens = rate * 2.0;
    let mut refilled = Instant::now();
    let mut ping = tokio::time::interval(s.keepalive);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ping.tick().await;
    let mut awaiting_pong: Option<Instant> = None;
    // An unsigned peer may still name itself (first frame `auth`).
    let mut first = matches!(s.role, Role::Server { require: false });
    loop {
        let f = if let Some(f) = held.pop_front() {
            f
        } else {
            tokio::select! {
                biased;
                f = wire.rx.recv() => match f {
                    Some(f) => f,
                    None => return ended(1006, "connection lost", true),
                },
                // No pong within PONG_WAIT of a ping: the peer is gone. Not a
                // close of ours, so an outbound socket reconnects.
                _ = tokio::time::sleep_until(
                    tokio::time::Instant::from_std(awaiting_pong.unwrap_or_else(Instant::now) + PONG_WAIT)
                ), if awaiting_pong.is_some() => {
                    s.sock.drop_dead(1001, "Pong timeout");
                    return ended(1006, "Pong timeout", true);
                }
                _ = ping.tick() => {
                    s.sock.push(Frame::Ping(Vec::new()));
                    awaiting_pong.get_or_insert_with(Instant::now);
                    continue;
                }
            }
        };
        match f {
            Frame::Pong(_) => {
                awaiting_pong = None;
                continue;
            }
            Frame::Ping(_) => continue,
            Frame::Close(code, reason) => return ended(code, reason, true),
            Frame::Text(_) | Frame::Binary(_) => {}
        }
        // The rate limit: a token bucket.
        tokens = (tokens + refilled.elapsed().as_secs_f64() * rate).min(rate * 2.0);
        refilled = Instant::now();
        if tokens < 1.0 {
            s.sock.close(1008, "rate limit exceeded");
            let _ = s.mb.with_store(|st| {
                st.log(
                    "warn",
                    "ws",
                    "rate_limited",
                    &format!("{}: more than {rate} frames a second; closed", s.sock.id),
                )
            });
            return ended(1008, "rate limit exceeded", true);
        }
        tokens -= 1.0;
        awaiting_pong = None;
        s.sock.touch();
        if std::mem::take(&mut first)
            && let Frame::Text(t) = &f
            && let Ok(v) = serde_json::from_str::<Value>(t)
            && v["type"] == "auth"
        {
            // A peer of an agent that takes unsigned ones: a signed claim
            // is checked, an unsigned one stamped unverified.
            match check_auth(&v) {
                Ok((did, n, ts, verified)) => {
                    answer_auth(&s.sock, if verified { key } else { None }, my_did, &n, ts);
                    s.sock.set_remote(&did, verified);
                }
                Err(e) => return refuse_auth(&s.sock, &e),
            }
            continue;
        }
        // A stream binding has the socket: its bytes go there.
        if let Some(tx) = s.sock.bound_to() {
            let bytes = match f {
                Frame::Text(t) => t.into_bytes(),
                Frame::Binary(b) => b,
                _ => continue,
            };
            let _ = tx.send(Ok(bytes)).await;
            continue;
        }
        match &s.handler {
            Handler::Lambda(_) => {
                let mut ev = event(&s.sock, "message");
                match f {
                    Frame::Text(t) => {
                        ev["data"] = json!(t);
                        ev["binary"] = json!(false);
                    }
                    Frame::Binary(b) => {
                        ev["data"] = json!(base64::engine::general_purpose::STANDARD.encode(b));
                        ev["binary"] = json!(true);
                    }
                    _ => continue,
                }
                dispatch(s, ev).await;
            }
            Handler::Inbox => {
                let Frame::Text(t) = f else {
                    let _ = s.mb.with_store(|st| {
                        st.log("warn", "ws", "binary_dropped", &format!("{}: a binary frame has no inbox", s.sock.id))
                    });
                    continue;
                };
                let msg = match serde_json::from_str::<Value>(&t) {
                    Ok(v) if v["from"].is_string() && v["payload"].is_object() => v,
                    Ok(_) => {
                        s.sock.close(4003, "Invalid ALF message");
                        return ended(4003, "Invalid ALF message", true);
                    }
                    Err(_) => {
                        s.sock.close(4003, "Invalid JSON");
                        return ended(4003, "Invalid JSON", true);
                    }
                };
                if s.sock.verified() && msg["from"].as_str() != Some(s.sock.remote_did().as_str()) {
                    s.sock.close(4003, "From field mismatch");
                    return ended(4003, "From field mismatch", true);
                }
                let state = s.mesh.state_of(&s.mb.id);
                if let Err((r, _)) =
                    ingress::accept(state, s.mb.clone(), msg, Origin { scope: s.scope, peer: s.peer }).await
                {
                    let _ = s.mb.with_store(|st| {
                        st.log("warn", "ws", "ingress_refused", &format!("{}: {} {}", s.sock.id, r.status, r.error))
                    });
                }
            }
        }
    }
}

/// Run the connection's lambda on one event; what it returns goes back.
async fn dispatch(s: &Setup, ev: Value) {
    let Handler::Lambda(target) = &s.handler else { return };
    // The agent's routes and sockets share its admission: a flood on many
    // sockets queues here instead of starting a realm for each frame.
    let Ok(_permit) = s.mb.serving.admit.acquire().await else { return };
    let Some(mut runner) = s.mb.serving.take_runner().or_else(|| (s.mb.runner)()) else {
        return;
    };
    let (path, func) = crate::sandbox::prepare::split_target(target);
    let timeout = runner.code_timeout(None);
    let warm = Some(format!("{}:ws", s.sock.agent_id));
    let out = runner.lambda(path, func, ev, None, Vec::new(), timeout, "ws", warm).await;
    match out {
        Ok(o) => {
            let reply = match o.value {
                None | Some(Value::Null) => None,
                Some(Value::String(t)) => Some(Frame::Text(t)),
                Some(v) => Some(Frame::Text(v.to_string())),
            };
            if let Some(f) = reply
                && let Err(e) = s.sock.send(f).await
            {
                let _ = runner.log("warn", "ws", "reply_failed", &format!("{}: {e}", s.sock.id));
            }
        }
        Err(e) => {
            let _ = runner.log("warn", "ws", "lambda_failed", &format!("{} {target}: {}", s.sock.id, e.message));
        }
    }
    s.mb.serving.give_back(runner);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshakes_are_checked_strictly() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]);
        let did = crate::store::identity::did_key(&key.verifying_key());
        let ts = crate::store::now_ms();
        let signed = |did: &str, n: &str, ts: i64, k: &ed25519_dalek::SigningKey| {
            json!({"type": "auth", "did": did, "nonce": n, "timestamp": ts,
                "signature": sign_str(k, format!("{did}{n}{ts}").as_bytes())})
        };
        let ok = check_auth(&signed(&did, "ab", ts, &key)).unwrap();
        assert_eq!((ok.0.as_str(), ok.3), (did.as_str(), true));
        let other = ed25519_dalek::SigningKey::from_bytes(&[8u8; 32]);
        assert_eq!(check_auth(&signed(&did, "ab", ts, &other)).unwrap_err(), "Invalid signature");
        assert_eq!(check_auth(&signed(&did, "ab", ts - 31_000, &key)).unwrap_err(), "Timestamp out of range");
        assert_eq!(check_auth(&signed("did:web:x", "ab", ts, &key)).unwrap_err(), "Invalid client DID");
        let mut bad = signed(&did, "ab", ts, &key);
        bad["signature"] = json!("rsa:xyz");
        assert_eq!(check_auth(&bad).unwrap_err(), "Unsupported signature algorithm");
        // Unsigned: a claim, not a proof.
        let claim = check_auth(&json!({"type": "auth", "did": did})).unwrap();
        assert!(!claim.3);
        assert_eq!(Auth::parse(Some("required")), Auth::Required);
        assert_eq!(Auth::parse(None), Auth::Auto);
    }
}
