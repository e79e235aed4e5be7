//! LAN discovery over mDNS (messaging.md §13): when an agent of this
//! runtime is `lan`, the runtime announces `_adf-runtime._tcp` as
//! `adf-<runtime_id>` on the mesh port (TXT `runtime_id`, `proto`,
//! `directory`, `runtime_did`) and browses for the others; each one found
//! joins the mesh's peers tagged `mdns` (their directories are read when an
//! agent asks `agent_discover` for `all`). Where multicast is unavailable
//! the daemon says so once and goes on without it.

use std::collections::HashMap;
use std::sync::Arc;

use mdns_sd::{ServiceDaemon, ServiceEvent, ServiceInfo};

use super::Mesh;
use super::peers::Sighting;

pub const SERVICE: &str = "_adf-runtime._tcp.local.";

/// The running announcer/browser; dropping it says goodbye.
pub struct Discovery {
    daemon: ServiceDaemon,
    fullname: String,
}

impl Drop for Discovery {
    fn drop(&mut self) {
        // Wait for the goodbye to be on the wire before the daemon stops
        // (a busy machine can take well over 100 ms to schedule it).
        if let Ok(rx) = self.daemon.unregister(&self.fullname) {
            let _ = rx.recv_timeout(std::time::Duration::from_secs(2));
        }
        let _ = self.daemon.shutdown();
    }
}

/// Is mDNS on (`"mdnsDiscovery": false` in settings.json turns it off, on
/// a network where multicast is unwelcome)?
pub fn enabled() -> bool {
    crate::providers::accounts::switched_on("mdnsDiscovery")
}

/// The peer URL of a resolved service, unless it is this runtime.
pub fn peer_url(own_runtime: &str, runtime_id: Option<&str>, v4: &[std::net::Ipv4Addr], port: u16) -> Option<String> {
    if runtime_id == Some(own_runtime) {
        return None;
    }
    let ip = v4.iter().find(|a| !a.is_loopback()).or(v4.first())?;
    Some(format!("http://{ip}:{port}"))
}

/// A service resolved to `url`. It resolves again as its addresses arrive
/// (loopback first, the LAN address later): the mesh keeps one peer per
/// service, the latest, so its goodbye removes all of it.
fn resolved(mesh: &Mesh, known: &mut HashMap<String, String>, fullname: &str, url: String, seen: Sighting<'_>) {
    mesh.with_peers(|t| t.upsert(&url, "mdns", seen));
    if let Some(old) = known.insert(fullname.to_string(), url.clone())
        && old != url
    {
        mesh.remove_peer(&old, "mdns");
    }
}

/// A service resolved: a peer, unless it is this runtime, with what its TXT
/// record says of it.
fn on_resolved(mesh: &Mesh, known: &mut HashMap<String, String>, own: &str, r: &mdns_sd::ResolvedService) {
    let id = r.get_property_val_str("runtime_id");
    let v4: Vec<_> = r.get_addresses_v4().into_iter().collect();
    if let Some(url) = peer_url(own, id, &v4, r.port) {
        let seen = Sighting {
            runtime_id: id,
            runtime_did: r.get_property_val_str("runtime_did"),
            host: Some(r.host.trim_end_matches('.')),
            at: Some(chrono::Utc::now().timestamp_millis()),
            // A TXT record proves nothing; the sweep asks over HTTP.
            did_proven: None,
        };
        resolved(mesh, known, &r.fullname, url, seen);
    }
}

/// Announce this runtime and browse for others. `Err` says why mDNS is
/// not available here.
pub fn start(mesh: Arc<Mesh>, port: u16) -> Result<Discovery, String> {
    let daemon = ServiceDaemon::new().map_err(|e| format!("mDNS unavailable: {e}"))?;
    let host = gethostname::gethostname().to_string_lossy().replace('.', "-");
    let mut props = vec![
        ("runtime_id".to_string(), mesh.runtime_id.clone()),
        ("proto".to_string(), "alf/0.2".to_string()),
        ("directory".to_string(), "/agents".to_string()),
    ];
    if let Some(d) = &mesh.runtime_did {
        props.push(("runtime_did".to_string(), d.clone()));
    }
    let instance = format!("adf-{}", mesh.runtime_id);
    let mut info = ServiceInfo::new(SERVICE, &instance, &format!("{host}.local."), (), port, &props[..])
        .map_err(|e| format!("mDNS service: {e}"))?
        .enable_addr_auto();
    info.set_requires_probe(false);
    let fullname = info.get_fullname().to_string();
    daemon.register(info).map_err(|e| format!("mDNS announce: {e}"))?;
    let rx = daemon.browse(SERVICE).map_err(|e| format!("mDNS browse: {e}"))?;
    let own = mesh.runtime_id.clone();
    let weak = Arc::downgrade(&mesh);
    std::thread::Builder::new()
        .name("adf-mdns".into())
        .spawn(move || {
            let mut known: HashMap<String, String> = Default::default();
            while let Ok(ev) = rx.recv() {
                let Some(mesh) = weak.upgrade() else { break };
                match ev {
                    ServiceEvent::ServiceResolved(r) => on_resolved(&mesh, &mut known, &own, &r),
                    ServiceEvent::ServiceRemoved(_, fullname) => {
                        if let Some(url) = known.remove(&fullname) {
                            mesh.remove_peer(&url, "mdns");
                        }
                    }
                    _ => {}
                }
            }
        })
        .map_err(|e| format!("mDNS thread: {e}"))?;
    Ok(Discovery { daemon, fullname })
}

/// Browse (without announcing) for `wait`, adding what answers to the
/// mesh's peers: `adf peers` when no daemon runs. `Err` says why mDNS is
/// not available here.
pub fn browse_for(mesh: &Mesh, wait: std::time::Duration) -> Result<(), String> {
    let daemon = ServiceDaemon::new().map_err(|e| format!("mDNS unavailable: {e}"))?;
    let rx = daemon.browse(SERVICE).map_err(|e| format!("mDNS browse: {e}"))?;
    let deadline = std::time::Instant::now() + wait;
    let mut known: HashMap<String, String> = Default::default();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(ServiceEvent::ServiceResolved(r)) => on_resolved(mesh, &mut known, &mesh.runtime_id, &r),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let _ = daemon.shutdown();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_that_resolves_again_stays_one_peer() {
        let mesh = Mesh::with_runtime(crate::runtime::bus::Bus::new(), Default::default(), ("me".into(), None));
        let mut known = HashMap::new();
        let name = "adf-you._adf-runtime._tcp.local.";
        let seen = || Sighting { runtime_id: Some("you"), ..Default::default() };
        resolved(&mesh, &mut known, name, "http://127.0.0.1:7295".into(), seen());
        resolved(&mesh, &mut known, name, "http://192.168.1.7:7295".into(), seen());
        resolved(&mesh, &mut known, name, "http://192.168.1.7:7295".into(), seen());
        assert_eq!(mesh.peers(), vec![("http://192.168.1.7:7295".to_string(), "mdns")]);
    }

    #[test]
    fn peers_skip_this_runtime_and_prefer_a_routable_address() {
        let lo = std::net::Ipv4Addr::new(127, 0, 0, 1);
        let lan = std::net::Ipv4Addr::new(192, 168, 1, 7);
        assert_eq!(peer_url("me", Some("me"), &[lan], 7295), None);
        assert_eq!(peer_url("me", Some("you"), &[lo, lan], 7295).as_deref(), Some("http://192.168.1.7:7295"));
        assert_eq!(peer_url("me", None, &[lo], 7296).as_deref(), Some("http://127.0.0.1:7296"));
        assert_eq!(peer_url("me", Some("you"), &[], 7295), None);
    }
}
