//! The ends of a stream binding (format.md §7.2 `stream_bindings`): a
//! WebSocket of the agent, a spawned process, a TCP socket, or the agent's
//! event stream (read only, as NDJSON). Each is opened into a reader (byte
//! chunks coming out) and a writer (byte chunks going in). The gates are
//! the owner's `stream_bind` config: TCP only with `allow_tcp_bind` and a
//! matching `tcp_allowlist` rule, host processes only with
//! `host_process_bind`, processes in the shared or the agent's own
//! container only with `container_shared_bind` / `container_isolated_bind`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::runtime::bus::{Filter, Item, type_matches};
use crate::runtime::mesh::Mesh;
use crate::runtime::mesh::ws::Frame;

/// Chunks out of an endpoint; `None` when it closed (with why, if it failed).
pub type Reader = mpsc::Receiver<Result<Vec<u8>, String>>;
/// Chunks into an endpoint.
pub type Writer = mpsc::Sender<Vec<u8>>;

/// An opened endpoint.
pub struct Opened {
    pub reader: Option<Reader>,
    pub writer: Option<Writer>,
    /// A short description for listings (no secrets, no env).
    pub summary: Value,
    /// Frames it dropped because its sink was slower (the event stream).
    pub dropped: Arc<AtomicU64>,
    /// Stops what runs behind it (a process is killed with its group).
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// A process in the shared or the agent's own container, as its user; its
/// group inside the container is killed when the binding ends.
async fn container_process(
    agent: &str,
    target: &crate::runtime::compute::Target,
    isolation: &str,
    argv: &[String],
    e: &Value,
) -> Result<Opened, String> {
    let env: Vec<(String, String)> = e["env"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
        .collect();
    let settings = crate::runtime::compute::Settings::load();
    let (mut child, stopper) =
        crate::runtime::compute::containers::get().spawn(&settings, agent, target, argv, &env).await?;
    let (stdout, stdin) = (child.stdout.take(), child.stdin.take());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        tokio::select! {
            _ = child.wait() => {}
            _ = stop_rx => {
                stopper.stop().await;
                let _ = child.kill().await;
            }
        }
    });
    Ok(Opened {
        reader: stdout.map(read_from),
        writer: stdin.map(write_to),
        summary: json!({"kind": "process", "isolation": isolation, "command": argv}),
        dropped: Default::default(),
        stop: Some(stop_tx),
    })
}

/// Is `host:port` allowed by the agent's `stream_bind.tcp_allowlist`?
/// Hosts are compared as the URL parser reads them (`*` is any host).
pub fn tcp_allowed(gate: &Value, host: &str, port: u16) -> Result<(), String> {
    if gate["allow_tcp_bind"] != true {
        return Err("TCP stream binding is not enabled for this agent".into());
    }
    let rules = gate["tcp_allowlist"].as_array().cloned().unwrap_or_default();
    if rules.is_empty() {
        return Err(format!(
            "TCP stream binding requires an explicit stream_bind.tcp_allowlist; allow_tcp_bind on its own denies every target. Add a rule for {host}:{port} (use host \"*\" to allow every host)."
        ));
    }
    let want = url::Host::parse(host).map_err(|e| format!("{host:?} is not a host: {e}"))?;
    let ok = rules.iter().any(|r| {
        let h = r["host"].as_str().unwrap_or_default();
        let host_ok = h == "*" || url::Host::parse(h).is_ok_and(|rule| rule == want);
        let port_ok = if let Some(p) = r["port"].as_u64() {
            p == u64::from(port)
        } else if let Some(ps) = r["ports"].as_array() {
            ps.iter().any(|p| p.as_u64() == Some(u64::from(port)))
        } else {
            let (lo, hi) = (r["min_port"].as_u64().unwrap_or(0), r["max_port"].as_u64().unwrap_or(65_535));
            (lo..=hi).contains(&u64::from(port))
        };
        host_ok && port_ok
    });
    if ok { Ok(()) } else { Err(format!("TCP binding target is not allow-listed: {host}:{port}")) }
}

/// Open `e` for the agent `agent`, under its `stream_bind` gates; `binding`
/// is the binding's id (its own events are kept off an event-stream end).
pub async fn open(
    mesh: &Arc<Mesh>,
    agent: &str,
    gate: &Value,
    e: &Value,
    binding: &str,
    side: &str,
) -> Result<Opened, String> {
    match e["kind"].as_str() {
        Some("tcp") => {
            let host = e["host"].as_str().filter(|h| !h.is_empty()).ok_or("a tcp endpoint needs a host")?;
            let port = e["port"]
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p > 0)
                .ok_or("a tcp endpoint needs a port 1 to 65535")?;
            tcp_allowed(gate, host, port)?;
            let s = tokio::time::timeout(
                std::time::Duration::from_secs(15),
                tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port)),
            )
            .await
            .map_err(|_| format!("connecting to {host}:{port} timed out"))?
            .map_err(|err| format!("cannot connect to {host}:{port}: {err}"))?;
            let (r, w) = s.into_split();
            Ok(Opened {
                reader: Some(read_from(r)),
                writer: Some(write_to(w)),
                summary: json!({"kind": "tcp", "host": host, "port": port}),
                dropped: Default::default(),
                stop: None,
            })
        }
        Some("process") => {
            let isolation = e["isolation"].as_str().unwrap_or("host");
            let argv: Vec<String> = e["command"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            let target = match isolation {
                "host" if gate["host_process_bind"] == true => None,
                "host" => return Err("Host process stream binding is not enabled for this agent".into()),
                "container_shared" if gate["container_shared_bind"] == true => {
                    Some(crate::runtime::compute::Target::Shared)
                }
                "container_isolated" if gate["container_isolated_bind"] == true => {
                    Some(crate::runtime::compute::Target::Isolated)
                }
                "container_shared" | "container_isolated" => {
                    return Err(format!(
                        "{isolation} process stream binding is not enabled for this agent (stream_bind.{isolation}_bind)"
                    ));
                }
                other => {
                    return Err(format!("unknown isolation {other:?} (host, container_shared or container_isolated)"));
                }
            };
            if argv.is_empty() {
                return Err("a process endpoint needs a command (a list, program first)".into());
            }
            if let Some(t) = target {
                return container_process(agent, &t, isolation, &argv, e).await;
            }
            let (prog, args) =
                argv.split_first().ok_or("a process endpoint needs a command (a list, program first)")?;
            let mut cmd = tokio::process::Command::new(prog);
            cmd.args(args)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null());
            // A clean environment: the runtime's secrets stay out.
            cmd.env_clear();
            for k in ["PATH", "HOME", "LANG", "TERM", "TZ"] {
                if let Ok(v) = std::env::var(k) {
                    cmd.env(k, v);
                }
            }
            for (k, v) in e["env"].as_object().into_iter().flatten() {
                if let Some(v) = v.as_str() {
                    cmd.env(k, v);
                }
            }
            if let Some(cwd) = e["cwd"].as_str() {
                cmd.current_dir(cwd);
            }
            cmd.kill_on_drop(true);
            #[cfg(unix)]
            cmd.process_group(0);
            let mut child = cmd.spawn().map_err(|err| format!("cannot start {prog}: {err}"))?;
            let (stdout, stdin) = (child.stdout.take(), child.stdin.take());
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let pid = child.id();
            tokio::spawn(async move {
                tokio::select! {
                    _ = child.wait() => {}
                    _ = stop_rx => {
                        #[cfg(unix)]
                        if let Some(pid) = pid {
                            // The whole group: what the command started goes too.
                            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
                        }
                        let _ = child.kill().await;
                    }
                }
            });
            Ok(Opened {
                reader: stdout.map(read_from),
                writer: stdin.map(write_to),
                summary: json!({"kind": "process", "isolation": "host", "command": argv}),
                dropped: Default::default(),
                stop: Some(stop_tx),
            })
        }
        Some("ws") => {
            let id = e["connection_id"].as_str().ok_or("a ws endpoint needs a connection_id")?;
            let sock = mesh.sockets.get(id).ok_or_else(|| format!("Connection not found: {id}"))?;
            if sock.agent_id != agent {
                return Err("WebSocket connection does not belong to this agent".into());
            }
            if !sock.ready() {
                return Err("Connection is not authenticated yet".into());
            }
            let reader = sock.bind().ok_or("Connection is already stream-bound")?;
            let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);
            let s2 = sock.clone();
            tokio::spawn(async move {
                while let Some(bytes) = rx.recv().await {
                    let f = match String::from_utf8(bytes) {
                        Ok(t) => Frame::Text(t),
                        Err(e) => Frame::Binary(e.into_bytes()),
                    };
                    if s2.send(f).await.is_err() {
                        break;
                    }
                }
            });
            Ok(Opened {
                reader: Some(reader),
                writer: Some(tx),
                summary: json!({"kind": "ws", "connection_id": id, "direction": sock.direction.as_str()}),
                dropped: Default::default(),
                stop: None,
            })
        }
        Some("umbilical") if side == "b" => Err("umbilical endpoints are read-only and cannot appear as b".into()),
        Some("umbilical") => {
            let filter = &e["filter"];
            let types: Vec<String> = filter["event_types"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            let wild = types.is_empty() || types.iter().any(|t| t == "*" || t.ends_with(".*"));
            if wild && filter["allow_wildcard"] != true {
                return Err(
                    "an umbilical endpoint with wildcard event_types (or none) needs filter.allow_wildcard: true"
                        .into(),
                );
            }
            let exclude: Vec<String> = filter["exclude_source"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            let rate = filter["max_rate_per_sec"].as_f64().filter(|r| *r > 0.0);
            let dropped = Arc::new(AtomicU64::new(0));
            let (tx, rx) = mpsc::channel(256);
            let mut sub = mesh
                .bus
                .subscribe(Some(mesh.bus.cursor()), Filter { agent_id: Some(agent.to_string()), types: Vec::new() });
            let (d2, binding) = (dropped.clone(), binding.to_string());
            tokio::spawn(async move {
                let (mut tokens, mut at) = (rate.unwrap_or(0.0), std::time::Instant::now());
                while let Some(item) = sub.next().await {
                    let Item::Event(ev) = item else { continue };
                    let e = &ev.event;
                    if e.payload["binding_id"].as_str() == Some(binding.as_str())
                        || exclude.iter().any(|s| e.source.starts_with(s.as_str()))
                        || !(types.is_empty() || types.iter().any(|t| type_matches(t, &e.event_type)))
                    {
                        continue;
                    }
                    if let Some(r) = rate {
                        tokens = (tokens + at.elapsed().as_secs_f64() * r).min(r);
                        at = std::time::Instant::now();
                        if tokens < 1.0 {
                            d2.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        tokens -= 1.0;
                    }
                    let mut line = serde_json::to_vec(e).unwrap_or_default();
                    line.push(b'\n');
                    // The event stream does not wait for a slow sink.
                    match tx.try_send(Ok(line)) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            d2.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => break,
                    }
                }
            });
            Ok(Opened { reader: Some(rx), writer: None, summary: json!({"kind": "umbilical"}), dropped, stop: None })
        }
        other => Err(format!("unknown endpoint kind {other:?} (ws, process, tcp or umbilical)")),
    }
}

/// A byte source as chunks.
fn read_from(mut r: impl tokio::io::AsyncRead + Unpin + Send + 'static) -> Reader {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 16 << 10];
        loop {
            match r.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => {
                    if tx.send(Ok(buf[..n].to_vec())).await.is_err() {
                        break;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e.to_string())).await;
                    break;
                }
            }
        }
    });
    rx
}

/// A byte sink fed with chunks.
fn write_to(mut w: impl tokio::io::AsyncWrite + Unpin + Send + 'static) -> Writer {
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
    tokio::spawn(async move {
        while let Some(b) = rx.recv().await {
            if w.write_all(&b).await.is_err() || w.flush().await.is_err() {
                break;
            }
        }
        let _ = w.shutdown().await;
    });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_targets_need_the_switch_and_a_rule() {
        let no = json!({});
        assert!(tcp_allowed(&no, "127.0.0.1", 80).unwrap_err().contains("not enabled"));
        let empty = json!({"allow_tcp_bind": true});
        assert!(tcp_allowed(&empty, "127.0.0.1", 80).unwrap_err().contains("explicit stream_bind.tcp_allowlist"));
        let g = json!({"allow_tcp_bind": true, "tcp_allowlist": [
            {"host": "127.0.0.1", "port": 6379},
            {"host": "db.internal", "ports": [5432, 5433]},
            {"host": "*", "min_port": 8000, "max_port": 8099}
        ]});
        assert!(tcp_allowed(&g, "127.0.0.1", 6379).is_ok());
        assert!(tcp_allowed(&g, "127.0.0.1", 6380).is_err());
        assert!(tcp_allowed(&g, "DB.Internal", 5433).is_ok(), "hosts as the URL parser reads them");
        assert!(tcp_allowed(&g, "db.internal", 5434).is_err());
        assert!(tcp_allowed(&g, "anything.example", 8080).is_ok());
        assert!(tcp_allowed(&g, "anything.example", 9000).unwrap_err().contains("not allow-listed"));
        assert!(tcp_allowed(&g, "0x7f.1", 6379).is_ok(), "127.0.0.1 however it is spelled");
    }
}
