//! Finding runtimes mDNS cannot reach (messaging.md §13). Multicast does
//! not cross WireGuard, so a runtime on the owner's tailnet never announces
//! itself here; it is reachable all the same. Every 45 s the sweep reads the
//! machine's own view of the tailnet (`tailscale status --json`, from the
//! local Tailscale daemon: no keys, no admin API), probes each online
//! peer's `GET /ping` on the mesh ports, and probes the manual `host:port`
//! entries of `settings.json` (`meshPeers`) the same way. A runtime that
//! answers joins the peer table (`peers.rs`); an address that refuses backs
//! off five minutes, one that times out or is unreachable 30 s; a tailnet
//! runtime missed by two sweeps in a row is expired. Tailnet addresses
//! (100.64/10) already classify as the `lan` tier (`classify`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use super::Mesh;
use super::peers::Sighting;

pub const EVERY: Duration = Duration::from_secs(45);
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(2500);
pub const REFUSED_BACKOFF: Duration = Duration::from_secs(5 * 60);
pub const TRANSIENT_BACKOFF: Duration = Duration::from_secs(30);
/// Sweeps in a row a tailnet runtime may be missed before it is expired.
pub const MISS_LIMIT: u32 = 2;
/// How long `tailscale status --json` may take.
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// An online machine of the tailnet.
#[derive(Debug, Clone, PartialEq)]
pub struct TailPeer {
    pub address: IpAddr,
    pub host: String,
}

/// The online peers in `tailscale status --json`, each by its IPv4 address
/// where it has one (100.64/10, which `classify` reads as LAN).
pub fn parse_status(text: &str) -> Result<Vec<TailPeer>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("tailscale status is not JSON: {e}"))?;
    let Some(peers) = v.get("Peer") else { return Ok(Vec::new()) };
    let Some(peers) = peers.as_object() else {
        return if peers.is_null() { Ok(Vec::new()) } else { Err("tailscale status: Peer is not an object".into()) };
    };
    let mut out = Vec::new();
    for p in peers.values() {
        if p["Online"] == false {
            continue;
        }
        let ips: Vec<IpAddr> = p["TailscaleIPs"]
            .as_array()
            .map(|a| a.iter().filter_map(|ip| ip.as_str()?.parse().ok()).collect())
            .unwrap_or_default();
        let Some(address) = ips.iter().find(|ip| ip.is_ipv4()).or(ips.first()).copied() else { continue };
        let host = [&p["HostName"], &p["DNSName"]]
            .iter()
            .find_map(|h| h.as_str().filter(|s| !s.is_empty()))
            .unwrap_or_default()
            .trim_end_matches('.')
            .to_string();
        out.push(TailPeer { address, host });
    }
    Ok(out)
}

/// A manual entry (`host`, `host:port`, `http://host:port`, `[v6]:port`) as
/// the mesh base URL it names, read by the URL parser; the mesh's default
/// port where none is written.
pub fn manual_url(raw: &str, default_port: u16) -> Result<String, String> {
    let raw = raw.trim();
    let with_scheme = if raw.contains("://") { raw.to_string() } else { format!("http://{raw}") };
    let u = url::Url::parse(&with_scheme).map_err(|e| format!("{raw:?} is not host:port ({e})"))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(format!("{raw:?}: a peer is reached over http or https, not {}", u.scheme()));
    }
    let host = u.host_str().filter(|h| !h.is_empty()).ok_or_else(|| format!("{raw:?} names no host"))?;
    if !matches!(u.path(), "" | "/") || u.query().is_some() || !u.username().is_empty() {
        return Err(format!("{raw:?}: a peer is host:port, without a path, query or user"));
    }
    Ok(format!("{}://{host}:{}", u.scheme(), u.port().unwrap_or(default_port)))
}

/// The manual entries of `settings.json` (`meshPeers`, or the reference's
/// `meshManualPeers`) and `ADF_MESH_PEERS` (comma-separated), as URLs;
/// entries that are not host:port are left out with why.
pub fn manual_peers(default_port: u16) -> (Vec<String>, Vec<String>) {
    let settings = crate::providers::accounts::load().ok();
    let mut raw: Vec<String> = Vec::new();
    if let Some(s) = &settings {
        for key in ["meshPeers", "meshManualPeers"] {
            if let Some(list) = s.extra.get(key).and_then(Value::as_array) {
                raw.extend(list.iter().filter_map(|v| v.as_str().map(str::to_string)));
            }
        }
    }
    if let Ok(env) = std::env::var("ADF_MESH_PEERS") {
        raw.extend(env.split(',').map(str::to_string));
    }
    let (mut urls, mut bad) = (Vec::new(), Vec::new());
    for r in raw.iter().filter(|r| !r.trim().is_empty()) {
        match manual_url(r, default_port) {
            Ok(u) if !urls.contains(&u) => urls.push(u),
            Ok(_) => {}
            Err(e) => bad.push(e),
        }
    }
    (urls, bad)
}

/// Is the tailnet sweep on (`"tailnetDiscovery": false` in settings.json
/// turns it off)?
fn tailnet_enabled() -> bool {
    crate::providers::accounts::switched_on("tailnetDiscovery")
}

/// What a runtime signs to prove it holds its DID's key: the probe's
/// nonce and its id.
pub fn proof_bytes(nonce: &str, runtime_id: &str) -> Vec<u8> {
    format!("adf-ping:{nonce}:{runtime_id}").into_bytes()
}

/// What a probe of `/ping` found.
#[derive(Debug, Clone, PartialEq)]
pub enum Probe {
    /// A runtime answered: its id and DID, and whether it proved it holds
    /// that DID's key (`None`: it sent no proof, as the reference does not).
    Runtime { id: String, did: Option<String>, proven: Option<bool> },
    /// Something is there, and it says no: nothing listens (connection
    /// refused) or what answers is not an adf runtime.
    Refused(String),
    /// No answer that proves anything: a timeout, an unreachable host.
    Transient(String),
}

/// Was this failure a refused connection? Read from the error's own
/// chain (the OS's answer), not its text.
fn refused(e: &reqwest::Error) -> bool {
    let mut src: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        src = s.source();
    }
    false
}

/// `GET <url>/ping?nonce=…`, within [`PROBE_TIMEOUT`]. A runtime that
/// names a DID and signs the nonce with a key that is not that DID's is
/// refused: it announces a DID it cannot sign for.
pub async fn probe(http: &reqwest::Client, url: &str) -> Probe {
    let nonce = crate::identity::hex(&rand::random::<[u8; 16]>());
    let resp = match http.get(format!("{url}/ping?nonce={nonce}")).timeout(PROBE_TIMEOUT).send().await {
        Ok(r) => r,
        Err(e) if refused(&e) => return Probe::Refused("connection refused".into()),
        Err(e) if e.is_timeout() => return Probe::Transient("timed out".into()),
        Err(e) => return Probe::Transient(format!("unreachable ({})", crate::client::root_cause(&e))),
    };
    let status = resp.status();
    if !status.is_success() {
        return Probe::Refused(format!("not an adf runtime (HTTP {})", status.as_u16()));
    }
    match resp.json::<Value>().await {
        Ok(v) => {
            let Some(id) = v["runtime_id"].as_str().filter(|s| !s.is_empty()) else {
                return Probe::Refused("not an adf runtime (no runtime_id in /ping)".into());
            };
            let did = v["runtime_did"].as_str().map(str::to_string);
            let proven = match (&did, v["proof"].as_str()) {
                (Some(d), Some(p)) => match crate::identity::attest::verify_str(d, &proof_bytes(&nonce, id), p) {
                    Ok(()) => Some(true),
                    Err(_) => return Probe::Refused(format!("announces {d}, which it cannot sign for")),
                },
                (None, Some(_)) => return Probe::Refused("a proof with no runtime_did".into()),
                _ => None,
            };
            Probe::Runtime { id: id.to_string(), did, proven }
        }
        Err(_) => Probe::Refused("not an adf runtime (/ping is not JSON)".into()),
    }
}

/// Where the `tailscale` command stands, as `adf peers` shows it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TailnetState {
    /// `off` (settings), `absent` (no tailscale command), `error`, `ok`.
    pub state: &'static str,
    pub detail: Option<String>,
    /// Online machines in the last status read.
    pub machines: usize,
}

/// The sweep's memory between runs.
#[derive(Default)]
pub struct Sweeper {
    /// The mesh ports to probe on tailnet machines (ours, and the default).
    ports: Vec<u16>,
    /// Addresses not to probe before the instant, and why.
    backoff: HashMap<String, (Instant, String)>,
    /// Tailnet runtimes by id: sweeps in a row they were missed.
    misses: HashMap<String, u32>,
    /// URLs that reached this runtime itself (never peers).
    own: std::collections::HashSet<String>,
    /// No tailscale command was found: look again after this.
    absent_until: Option<Instant>,
    pub tailnet: TailnetState,
    /// Manual entries that are not host:port, with why.
    pub bad_manual: Vec<String>,
    pub last_sweep: Option<i64>,
}

impl Sweeper {
    /// Probe the mesh's own port and the default one on tailnet machines.
    pub fn set_own_port(&mut self, port: u16) {
        self.ports = vec![port];
        if port != super::server::DEFAULT_PORT {
            self.ports.push(super::server::DEFAULT_PORT);
        }
    }

    async fn tailnet_peers(&mut self) -> Vec<TailPeer> {
        if !tailnet_enabled() {
            self.tailnet = TailnetState {
                state: "off",
                detail: Some("tailnetDiscovery is false in settings.json".into()),
                machines: 0,
            };
            return Vec::new();
        }
        if self.absent_until.is_some_and(|t| Instant::now() < t) {
            return Vec::new();
        }
        let run = tokio::process::Command::new("tailscale")
            .args(["status", "--json"])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = match tokio::time::timeout(STATUS_TIMEOUT, run).await {
            Err(_) => return self.tailnet_failed("tailscale status took over 5 s"),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                self.absent_until = Some(Instant::now() + REFUSED_BACKOFF);
                self.tailnet =
                    TailnetState { state: "absent", detail: Some("no tailscale command on PATH".into()), machines: 0 };
                return Vec::new();
            }
            Ok(Err(e)) => return self.tailnet_failed(&format!("tailscale: {e}")),
            Ok(Ok(o)) if !o.status.success() => {
                let err = String::from_utf8_lossy(&o.stderr);
                let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("no message").trim().to_string();
                return self.tailnet_failed(&format!("tailscale status failed ({}): {first}", o.status));
            }
            Ok(Ok(o)) => o,
        };
        self.absent_until = None;
        match parse_status(&String::from_utf8_lossy(&out.stdout)) {
            Ok(peers) => {
                self.tailnet = TailnetState { state: "ok", detail: None, machines: peers.len() };
                peers
            }
            Err(e) => self.tailnet_failed(&e),
        }
    }

    /// The addresses not probed until their back-off ends: url, why, and
    /// the seconds left.
    pub fn backing_off(&self) -> Vec<Value> {
        let now = Instant::now();
        let mut v: Vec<_> = self
            .backoff
            .iter()
            .filter(|(_, (t, _))| *t > now)
            .map(|(u, (t, why))| serde_json::json!({"url": u, "why": why, "seconds": (*t - now).as_secs()}))
            .collect();
        v.sort_by(|a, b| a["url"].as_str().cmp(&b["url"].as_str()));
        v
    }

    fn tailnet_failed(&mut self, why: &str) -> Vec<TailPeer> {
        self.tailnet = TailnetState { state: "error", detail: Some(why.to_string()), machines: 0 };
        Vec::new()
    }

    /// One sweep: read the sources, probe what is not backing off, and
    /// bring the mesh's peer table up to date.
    pub async fn sweep(&mut self, mesh: &Mesh) {
        let default_port = super::server::DEFAULT_PORT;
        let (manual, bad) = manual_peers(default_port);
        self.bad_manual = bad;
        // (url, source, host): manual first, so an address both list is manual.
        let mut targets: Vec<(String, &'static str, Option<String>)> =
            manual.iter().map(|u| (u.clone(), "manual", None)).collect();
        let ports = if self.ports.is_empty() { vec![default_port] } else { self.ports.clone() };
        for p in self.tailnet_peers().await {
            let host = match p.address {
                IpAddr::V6(v6) => format!("[{v6}]"),
                v4 => v4.to_string(),
            };
            for port in &ports {
                let url = format!("http://{host}:{port}");
                if !targets.iter().any(|(u, _, _)| *u == url) {
                    targets.push((url, "tailnet", Some(p.host.clone())));
                }
            }
        }
        // Manual entries no longer in the settings leave the table.
        mesh.with_peers(|t| {
            for row in t.list().iter().filter(|r| r.source == "manual" && !manual.contains(&r.url)) {
                t.remove(&row.url, "manual");
            }
            for u in manual.iter().filter(|u| !self.own.contains(*u)) {
                t.upsert(u, "manual", Sighting::default());
            }
        });
        let now = Instant::now();
        self.backoff.retain(|_, (t, _)| *t > now);
        let due: Vec<_> =
            targets.into_iter().filter(|(u, _, _)| self.backoff.get(u).is_none_or(|(t, _)| *t <= now)).collect();
        let probes =
            futures_util::future::join_all(due.iter().map(|(u, _, _)| async { probe(&mesh.http, u).await })).await;
        let at = chrono::Utc::now().timestamp_millis();
        let mut seen = Vec::new();
        for ((url, source, host), found) in due.iter().zip(probes) {
            let (wait, why) = match found {
                Probe::Runtime { id, .. } if id == mesh.runtime_id => {
                    // Ourselves (our own tailnet address, or a manual entry
                    // that points here): not a peer.
                    self.own.insert(url.clone());
                    self.backoff.insert(url.clone(), (now + REFUSED_BACKOFF, "this runtime".into()));
                    mesh.with_peers(|t| t.remove(url, source));
                    continue;
                }
                Probe::Runtime { id, did, proven } => {
                    self.backoff.remove(url);
                    if *source == "tailnet" {
                        seen.push(id.clone());
                    }
                    let s = Sighting {
                        runtime_id: Some(&id),
                        runtime_did: did.as_deref(),
                        host: host.as_deref(),
                        at: Some(at),
                        did_proven: proven,
                    };
                    mesh.with_peers(|t| t.upsert(url, source, s));
                    continue;
                }
                Probe::Refused(why) => (REFUSED_BACKOFF, why),
                Probe::Transient(why) => (TRANSIENT_BACKOFF, why),
            };
            // A manual entry stays listed, saying why it is quiet.
            if *source == "manual" {
                mesh.with_peers(|t| t.failed(url, source, &why));
            }
            self.backoff.insert(url.clone(), (now + wait, why));
        }
        self.check_mdns(mesh).await;
        // Tailnet runtimes missed too often are expired.
        for id in &seen {
            self.misses.insert(id.clone(), 0);
        }
        let known: Vec<String> =
            mesh.peer_rows().into_iter().filter(|r| r.source == "tailnet").filter_map(|r| r.runtime_id).collect();
        for id in known.iter().filter(|id| !seen.contains(id)) {
            let n = self.misses.entry(id.clone()).or_insert(0);
            *n += 1;
            if *n >= MISS_LIMIT {
                self.misses.remove(id);
                mesh.with_peers(|t| t.expire(id, "tailnet"));
            }
        }
        self.last_sweep = Some(at);
    }

    /// mDNS rows are what a multicast packet claimed, and they leave only
    /// with a goodbye, which a machine that moved never sends: each is
    /// probed like the others, so a dead one stops shadowing a live route,
    /// and its runtime proves the DID its TXT record named.
    async fn check_mdns(&mut self, mesh: &Mesh) {
        let rows: Vec<_> = mesh.peer_rows().into_iter().filter(|r| r.source == "mdns").collect();
        let probes = futures_util::future::join_all(rows.iter().map(|r| probe(&mesh.http, &r.url))).await;
        let at = chrono::Utc::now().timestamp_millis();
        for (r, found) in rows.iter().zip(probes) {
            let why = match found {
                Probe::Runtime { id, .. } if Some(&id) != r.runtime_id.as_ref() => {
                    "another runtime answers there now".to_string()
                }
                Probe::Runtime { did, .. } if r.runtime_did.is_some() && did != r.runtime_did => {
                    format!("its mDNS record named {}, /ping another DID", r.runtime_did.as_deref().unwrap_or(""))
                }
                Probe::Runtime { proven, .. } => {
                    let s = Sighting { at: Some(at), did_proven: proven, ..Default::default() };
                    mesh.with_peers(|t| t.upsert(&r.url, "mdns", s));
                    continue;
                }
                Probe::Refused(why) | Probe::Transient(why) => why,
            };
            mesh.with_peers(|t| t.failed(&r.url, "mdns", &why));
        }
    }
}

/// Sweep now, then every [`EVERY`], for as long as the mesh lives.
pub fn start(mesh: &std::sync::Arc<Mesh>, own_port: u16) {
    let weak = std::sync::Arc::downgrade(mesh);
    let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
    mesh.set_sweep_port(own_port);
    handle.spawn(async move {
        loop {
            let Some(mesh) = weak.upgrade() else { break };
            mesh.sweep_now().await;
            drop(mesh);
            tokio::time::sleep(EVERY).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lists_online_peers_by_their_ipv4_address() {
        let text = r#"{"Self":{"TailscaleIPs":["100.64.0.1"]},"Peer":{
            "nodekey:a":{"HostName":"box","DNSName":"box.tail1.ts.net.","TailscaleIPs":["fd7a:115c:a1e0::2","100.64.0.2"],"Online":true},
            "nodekey:b":{"HostName":"","DNSName":"laptop.tail1.ts.net.","TailscaleIPs":["100.64.0.3"],"Online":false},
            "nodekey:c":{"DNSName":"v6only.tail1.ts.net.","TailscaleIPs":["fd7a:115c:a1e0::4"]},
            "nodekey:d":{"HostName":"noaddr","TailscaleIPs":[]}}}"#;
        let mut got = parse_status(text).unwrap();
        got.sort_by_key(|p| p.host.clone());
        assert_eq!(
            got,
            vec![
                TailPeer { address: "100.64.0.2".parse().unwrap(), host: "box".into() },
                TailPeer { address: "fd7a:115c:a1e0::4".parse().unwrap(), host: "v6only.tail1.ts.net".into() },
            ]
        );
        assert_eq!(parse_status(r#"{"Peer":null}"#).unwrap(), vec![]);
        assert_eq!(parse_status(r#"{"BackendState":"Stopped"}"#).unwrap(), vec![]);
        assert!(parse_status("tailscaled is not running").unwrap_err().contains("not JSON"));
        assert!(parse_status(r#"{"Peer":[1]}"#).is_err());
    }

    #[test]
    fn manual_entries_are_read_by_the_url_parser() {
        assert_eq!(manual_url("box", 7295).unwrap(), "http://box:7295");
        assert_eq!(manual_url(" box:7400 ", 7295).unwrap(), "http://box:7400");
        assert_eq!(manual_url("http://10.0.0.2:7300/", 7295).unwrap(), "http://10.0.0.2:7300");
        assert_eq!(manual_url("https://hub.example.org", 7295).unwrap(), "https://hub.example.org:7295");
        assert_eq!(manual_url("[fd00::1]:7301", 7295).unwrap(), "http://[fd00::1]:7301");
        assert_eq!(manual_url("macbook.tail1.ts.net", 7295).unwrap(), "http://macbook.tail1.ts.net:7295");
        for bad in ["box:99999", "ftp://box", "box/agents", "user@box:1", "box:7295?x=1", "", "http://"] {
            assert!(manual_url(bad, 7295).is_err(), "{bad:?} taken");
        }
    }

    #[tokio::test]
    async fn probes_tell_a_runtime_a_refusal_and_a_stranger_apart() {
        use axum::routing::get;
        let app = axum::Router::new().route(
            "/ping",
            get(|| async { axum::Json(serde_json::json!({"runtime_id": "r1", "runtime_did": "did:key:z1"})) }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let runtime = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await });
        let stranger_app = axum::Router::new().route("/ping", get(|| async { "pong" }));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stranger = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, stranger_app).await });
        // A port nothing listens on: bound, then closed.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        // A runtime that proves its DID, and one that names a DID whose key
        // it does not hold.
        type Q = axum::extract::Query<std::collections::HashMap<String, String>>;
        let key = ed25519_dalek::SigningKey::from_bytes(&[3u8; 32]);
        let other = ed25519_dalek::SigningKey::from_bytes(&[4u8; 32]);
        let did = crate::store::identity::did_key(&key.verifying_key());
        let answer = move |signer: ed25519_dalek::SigningKey, did: String| {
            move |q: Q| async move {
                let proof = crate::identity::attest::sign_str(&signer, &proof_bytes(&q.0["nonce"], "r2"));
                axum::Json(serde_json::json!({"runtime_id": "r2", "runtime_did": did, "proof": proof}))
            }
        };
        let mut proving = Vec::new();
        for signer in [key.clone(), other] {
            let app = axum::Router::new().route("/ping", get(answer(signer, did.clone())));
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            proving.push(format!("http://{}", l.local_addr().unwrap()));
            tokio::spawn(async move { axum::serve(l, app).await });
        }
        let http = crate::providers::http_client();
        assert_eq!(
            probe(&http, &proving[0]).await,
            Probe::Runtime { id: "r2".into(), did: Some(did.clone()), proven: Some(true) }
        );
        assert_eq!(
            probe(&http, &proving[1]).await,
            Probe::Refused(format!("announces {did}, which it cannot sign for"))
        );
        assert_eq!(
            probe(&http, &runtime).await,
            Probe::Runtime { id: "r1".into(), did: Some("did:key:z1".into()), proven: None }
        );
        assert!(matches!(probe(&http, &stranger).await, Probe::Refused(w) if w.contains("not JSON")));
        assert_eq!(probe(&http, &closed).await, Probe::Refused("connection refused".into()));
    }
}
