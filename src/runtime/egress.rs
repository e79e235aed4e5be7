//! The egress guard for agent HTTP (runtime.md §8.7): which addresses a
//! `sys_fetch` may reach. Hosts are classified after the WHATWG URL parser
//! has normalised loose IPv4 spellings (`2130706433`, `0x7f000001`, `127.1`),
//! loopback names are known without DNS, and any other name is resolved and
//! every address checked; the caller then connects to the checked address
//! only (no second lookup to rebind). Metadata/link-local and the daemon's
//! control port are refused even when the owner allows local fetch.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU16, Ordering};

use futures_util::future::BoxFuture;
use reqwest::Url;

/// The daemon's control port (default 7385), never reachable from agents.
static DAEMON_PORT: AtomicU16 = AtomicU16::new(crate::daemon::DEFAULT_PORT);

/// Record the port the daemon of this process listens on.
pub fn set_daemon_port(port: u16) {
    DAEMON_PORT.store(port, Ordering::Relaxed);
}

fn daemon_ports() -> [u16; 2] {
    [DAEMON_PORT.load(Ordering::Relaxed), crate::daemon::DEFAULT_PORT]
}

/// Why a target is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Blocked {
    #[error("Blocked: {0} is a link-local or cloud metadata address")]
    Metadata(IpAddr),
    #[error("Blocked: port {0} on loopback is the adf daemon's control API")]
    Daemon(u16),
    #[error(
        "Blocked: {0} is a private, loopback or reserved address (the owner can allow it with security.allow_local_fetch)"
    )]
    Private(IpAddr),
    #[error("Blocked: unsupported URL scheme \"{0}\" (http and https only)")]
    Scheme(String),
    #[error("Blocked: the URL has no host")]
    NoHost,
    #[error("Blocked: {0}")]
    Resolve(String),
}

fn v4_blocked(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    a == 0
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b))
        || (a == 169 && b == 254)
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || (a == 192 && b == 168)
        || (a == 198 && (b == 18 || b == 19))
        || a >= 224
}

/// The IPv4 address an IPv6 one stands for (mapped `::ffff:a.b.c.d`).
fn mapped(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    ip.to_ipv4_mapped()
}

fn is_metadata(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.octets()[..2] == [169, 254],
        IpAddr::V6(v6) => {
            mapped(v6).is_some_and(|v4| v4.octets()[..2] == [169, 254]) || (v6.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_unspecified(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unspecified() || mapped(v6).is_some_and(|v4| v4.is_loopback()),
    }
}

/// Private, loopback, CGNAT, link-local, multicast, reserved.
pub fn is_blocked(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4_blocked(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = mapped(v6) {
                return v4_blocked(v4);
            }
            let s0 = v6.segments()[0];
            v6.is_unspecified()
                || v6.is_loopback()
                || (s0 & 0xffc0) == 0xfe80
                || (s0 & 0xfe00) == 0xfc00
                || (s0 & 0xff00) == 0xff00
        }
    }
}

/// The policy for one resolved address.
pub fn check_addr(ip: IpAddr, port: u16, allow_local: bool) -> Result<(), Blocked> {
    if is_metadata(ip) {
        return Err(Blocked::Metadata(ip));
    }
    if is_loopback(ip) && daemon_ports().contains(&port) {
        return Err(Blocked::Daemon(port));
    }
    if allow_local || !is_blocked(ip) {
        return Ok(());
    }
    Err(Blocked::Private(ip))
}

/// Name resolution, replaceable in tests.
pub trait Resolve: Send + Sync {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>>;
}

/// The system resolver.
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// A checked target: the URL and the address to connect to (`None` for
/// an IP literal, which needs no pinning).
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub url: Url,
    pub pin: Option<(String, SocketAddr)>,
}

fn loopback_name(host: &str) -> bool {
    let h = host.trim_end_matches('.').to_ascii_lowercase();
    h == "localhost" || h == "localhost.localdomain" || h.ends_with(".localhost")
}

/// Check a URL: scheme, host class, every resolved address.
pub async fn check(url: &Url, allow_local: bool, resolver: &dyn Resolve) -> Result<Target, Blocked> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Blocked::Scheme(url.scheme().to_string()));
    }
    let port = url.port_or_known_default().unwrap_or(80);
    let host = url.host().ok_or(Blocked::NoHost)?;
    let ip = match host {
        url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        url::Host::Domain(d) if loopback_name(d) => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        url::Host::Domain(_) => None,
    };
    if let Some(ip) = ip {
        check_addr(ip, port, allow_local)?;
        let pin = match host {
            url::Host::Domain(d) => Some((d.to_string(), SocketAddr::new(ip, port))),
            _ => None,
        };
        return Ok(Target { url: url.clone(), pin });
    }
    let name = url.host_str().unwrap_or("").to_string();
    let addrs =
        resolver.resolve(&name, port).await.map_err(|e| Blocked::Resolve(format!("cannot resolve {name}: {e}")))?;
    let first = *addrs.first().ok_or_else(|| Blocked::Resolve(format!("{name} has no addresses")))?;
    for a in &addrs {
        check_addr(a.ip(), port, allow_local)?;
    }
    Ok(Target { url: url.clone(), pin: Some((name, first)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Vec<IpAddr>);
    impl Resolve for Fixed {
        fn resolve<'a>(&'a self, _: &'a str, port: u16) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
            let v = self.0.iter().map(|ip| SocketAddr::new(*ip, port)).collect();
            Box::pin(async move { Ok(v) })
        }
    }

    async fn verdict(url: &str, allow: bool) -> Result<Target, Blocked> {
        let public = Fixed(vec!["93.184.216.34".parse().unwrap()]);
        check(&Url::parse(url).unwrap(), allow, &public).await
    }

    #[tokio::test]
    async fn loopback_in_every_spelling_is_refused() {
        for u in [
            "http://127.0.0.1/",
            "http://localhost/",
            "http://LOCALHOST./x",
            "http://a.b.localhost/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://127.1/",
            "http://0177.0.0.1/",
            "http://0.0.0.0/",
            "http://[::]/",
            "http://10.0.0.1/",
            "http://100.64.0.1/",
            "http://172.16.5.4/",
            "http://192.168.1.1/",
            "http://198.18.0.1/",
            "http://224.0.0.1/",
            "http://[fc00::1]/",
        ] {
            let v = verdict(u, false).await;
            assert!(matches!(v, Err(Blocked::Private(_))), "{u}: {v:?}");
            assert!(verdict(u, true).await.is_ok(), "{u} with allow_local_fetch");
        }
    }

    #[tokio::test]
    async fn metadata_and_the_daemon_stay_refused_when_local_is_allowed() {
        for u in ["http://169.254.169.254/latest/meta-data", "http://[fe80::1]/", "http://[::ffff:169.254.169.254]/"] {
            assert!(matches!(verdict(u, true).await, Err(Blocked::Metadata(_))), "{u}");
        }
        for u in ["http://127.0.0.1:7385/agents", "http://localhost:7385/", "http://[::1]:7385/"] {
            assert!(matches!(verdict(u, true).await, Err(Blocked::Daemon(7385))), "{u}");
        }
        set_daemon_port(7999);
        assert!(matches!(verdict("http://127.0.0.1:7999/", true).await, Err(Blocked::Daemon(7999))));
        assert!(matches!(verdict("http://127.0.0.1:7385/", true).await, Err(Blocked::Daemon(7385))));
    }

    #[tokio::test]
    async fn names_are_checked_on_every_address() {
        let to_loop = Fixed(vec!["93.184.216.34".parse().unwrap(), "127.0.0.1".parse().unwrap()]);
        let u = Url::parse("https://public.example/").unwrap();
        assert!(matches!(check(&u, false, &to_loop).await, Err(Blocked::Private(_))));
        let ok = verdict("https://public.example/x", false).await.unwrap();
        assert_eq!(ok.pin.unwrap().1, "93.184.216.34:443".parse().unwrap());
        assert!(matches!(verdict("ftp://example.com/", false).await, Err(Blocked::Scheme(_))));
        assert!(matches!(verdict("file:///etc/passwd", true).await, Err(Blocked::Scheme(_))));
    }
}
