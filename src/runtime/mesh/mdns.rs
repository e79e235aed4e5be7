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
fn resolved(mesh: &Mesh, known: &mut HashMap<String, String>, fullname: &str, url: String) {
    mesh.add_peer(&url, "mdns");
    if let Some(old) = known.insert(fullname.to_string(), url.clone())
        && old != url
    {
        mesh.remove_peer(&old, "mdns");
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
                    ServiceEvent::ServiceResolved(r) => {
                        let v4: Vec<_> = r.get_addresses_v4().into_iter().collect();
                        if let Some(url) = peer_url(&own, r.get_property_val_str("runtime_id"), &v4, r.port) {
                            resolved(&mesh, &mut known, &r.fullname, url);
                        }
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_that_resolves_again_stays_one_peer() {
        let mesh = Mesh::with_runtime(crate::runtime::bus::Bus::new(), Default::default(), ("me".into(), None));
        let mut known = HashMap::new();
        resolved(&mesh, &mut known, "adf-you._adf-runtime._tcp.local.", "http://127.0.0.1:7295".into());
        resolved(&mesh, &mut known, "adf-you._adf-runtime._tcp.local.", "http://192.168.1.7:7295".into());
        resolved(&mesh, &mut known, "adf-you._adf-runtime._tcp.local.", "http://192.168.1.7:7295".into());
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
