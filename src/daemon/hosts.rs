//! The names a `Host` header may give this daemon (the guard against DNS
//! rebinding). On loopback: `127.0.0.1`, `localhost` and `[::1]` with the
//! port. Bound beyond loopback, also the machine's own addresses (every
//! interface's, from getifaddrs), its host name (and `NAME.local`, as mDNS
//! announces it), and whatever the owner lists with `--allow-host` — until
//! now such a daemon answered `403 Host … is not this daemon` to requests
//! made to the very address it listened on.

use std::net::IpAddr;

/// Whether an address (as given to `--host`) is loopback only.
pub fn is_loopback(host: &str) -> bool {
    matches!(host, "127.0.0.1" | "localhost" | "::1" | "[::1]")
}

/// `NAME:PORT`, bracketing IPv6 literals.
fn with_port(name: &str, port: u16) -> String {
    match name.parse::<IpAddr>() {
        Ok(IpAddr::V6(a)) => format!("[{a}]:{port}"),
        _ => format!("{name}:{port}"),
    }
}

/// Whether `NAME` already carries a port (`host:8080`, `[::1]:8080`).
fn has_port(name: &str) -> bool {
    if name.starts_with('[') {
        return name.contains("]:");
    }
    name.matches(':').count() == 1
}

/// The addresses of this machine's interfaces, loopback excluded.
pub fn interface_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    #[cfg(unix)]
    {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: getifaddrs fills a list we walk read-only and free once.
        unsafe {
            if libc::getifaddrs(&mut head) != 0 {
                return out;
            }
            let mut cur = head;
            while !cur.is_null() {
                let addr = (*cur).ifa_addr;
                if !addr.is_null() {
                    match i32::from((*addr).sa_family) {
                        libc::AF_INET => {
                            let a = &*(addr as *const libc::sockaddr_in);
                            out.push(IpAddr::from(a.sin_addr.s_addr.to_ne_bytes()));
                        }
                        libc::AF_INET6 => {
                            let a = &*(addr as *const libc::sockaddr_in6);
                            out.push(IpAddr::from(a.sin6_addr.s6_addr));
                        }
                        _ => {}
                    }
                }
                cur = (*cur).ifa_next;
            }
            libc::freeifaddrs(head);
        }
    }
    out.retain(|a| {
        // Link-local IPv6 needs a zone in a URL; no browser sends it as a Host.
        let link_local = matches!(a, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
        !a.is_loopback() && !a.is_unspecified() && !link_local
    });
    out.sort();
    out.dedup();
    out
}

/// Every `Host` header value (lowercase, with port) this daemon answers.
pub fn allowed(bind: &str, port: u16, extra: &[String]) -> Vec<String> {
    let mut names: Vec<String> = ["127.0.0.1", "localhost", "::1"].iter().map(|n| with_port(n, port)).collect();
    if !is_loopback(bind) {
        let bind = bind.trim_start_matches('[').trim_end_matches(']');
        if !bind.parse::<IpAddr>().is_ok_and(|a| a.is_unspecified()) {
            names.push(with_port(bind, port));
        }
        for a in interface_addresses() {
            names.push(with_port(&a.to_string(), port));
        }
        let host = gethostname::gethostname().to_string_lossy().to_string();
        if !host.is_empty() {
            let short = host.split('.').next().unwrap_or(&host).to_string();
            names.push(with_port(&host, port));
            names.push(with_port(&short, port));
            names.push(with_port(&format!("{short}.local"), port));
        }
    }
    for name in extra.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        names.push(if has_port(name) { name.to_string() } else { with_port(name, port) });
    }
    // A browser leaves the port out when it is the scheme's default.
    if port == 80 {
        let bare: Vec<String> = names.iter().filter_map(|n| n.strip_suffix(":80").map(str::to_string)).collect();
        names.extend(bare);
    }
    let mut names: Vec<String> = names.into_iter().map(|n| n.to_ascii_lowercase()).collect();
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_only_on_loopback() {
        assert_eq!(allowed("127.0.0.1", 7385, &[]), vec!["127.0.0.1:7385", "localhost:7385", "[::1]:7385"]);
    }

    #[test]
    fn allowed_hosts_take_the_port_unless_they_name_one() {
        let a = allowed("127.0.0.1", 7385, &["Box.LAN".into(), "proxy:8080".into(), "[fe80::1]:9".into()]);
        assert!(a.contains(&"box.lan:7385".to_string()), "{a:?}");
        assert!(a.contains(&"proxy:8080".to_string()), "{a:?}");
        assert!(a.contains(&"[fe80::1]:9".to_string()), "{a:?}");
        let v6 = allowed("127.0.0.1", 7385, &["fd00::5".into()]);
        assert!(v6.contains(&"[fd00::5]:7385".to_string()), "{v6:?}");
    }

    #[test]
    fn beyond_loopback_the_host_name_and_interfaces_are_allowed() {
        let a = allowed("0.0.0.0", 7385, &[]);
        let host = gethostname::gethostname().to_string_lossy().to_ascii_lowercase();
        assert!(a.contains(&format!("{host}:7385")), "{a:?}");
        for ip in interface_addresses() {
            assert!(a.contains(&with_port(&ip.to_string(), 7385)), "{a:?}");
        }
        assert!(!a.iter().any(|n| n.starts_with("0.0.0.0")), "{a:?}");
    }
}
