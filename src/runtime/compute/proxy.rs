//! The browser's way out (issue 22): a forward proxy on loopback that every
//! connection of the agent's Chromium goes through (`--proxy-server`, with
//! loopback no longer bypassed), so the egress guard of `sys_fetch` decides
//! each one: pages, subresources, WebSockets, workers, service workers and
//! frames alike, which the DevTools protocol's request interception does
//! not all see. The proxy connects to the address the guard checked, so a
//! name cannot be re-resolved elsewhere between the check and the
//! connection (DNS rebinding). `CONNECT` is tunnelled; a plain-HTTP request
//! is sent on in origin form with `Connection: close`, one request to a
//! connection, so a kept-alive connection cannot carry a request for
//! another host past the check. What it refuses gets a 403 and is listed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::runtime::egress::{self, Resolve};

/// A request head larger than this is refused.
const HEAD_CAP: usize = 64 << 10;

pub struct Proxy {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Refusals, shared with the browser session that reports them.
pub type Blocked = Arc<Mutex<Vec<String>>>;

fn note(blocked: &Blocked, what: String) {
    if let Ok(mut l) = blocked.lock()
        && l.len() < 100
    {
        l.push(what);
    }
}

/// Start a proxy on a free loopback port.
pub async fn start(allow_local: bool, resolver: Arc<dyn Resolve>, blocked: Blocked) -> Result<Proxy, String> {
    let l = TcpListener::bind("127.0.0.1:0").await.map_err(|e| format!("the browser's proxy cannot listen: {e}"))?;
    let port = l.local_addr().map_err(|e| e.to_string())?.port();
    let task = tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let (resolver, blocked) = (resolver.clone(), blocked.clone());
            tokio::spawn(async move {
                let _ = serve(c, allow_local, resolver.as_ref(), &blocked).await;
            });
        }
    });
    Ok(Proxy { port, task })
}

/// The head of a request: its bytes up to the blank line, and what came
/// after it.
async fn head(c: &mut TcpStream) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), c.read(&mut chunk))
            .await
            .map_err(|_| "no request head in 30 s".to_string())?
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed before a request".into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(i + 4);
            return Ok((buf, rest));
        }
        if buf.len() > HEAD_CAP {
            return Err("request head too large".into());
        }
    }
}

async fn refuse(c: &mut TcpStream, status: &str, why: &str) {
    let body = format!("refused by adf's egress guard: {why}\n");
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = c.write_all(msg.as_bytes()).await;
}

/// Where the guard lets this URL go: the checked address to connect to.
/// A refusal is listed for the agent, a name that does not resolve only
/// answered (the browser's own background lookups would fill the list).
async fn checked(
    url: &url::Url,
    allow_local: bool,
    resolver: &dyn Resolve,
    blocked: &Blocked,
) -> Result<SocketAddr, String> {
    let t = match egress::check(url, allow_local, resolver).await {
        Ok(t) => t,
        Err(e) => {
            if !matches!(e, egress::Blocked::Resolve(_)) {
                note(blocked, format!("{}: {e}", url.as_str().trim_end_matches('/')));
            }
            return Err(e.to_string());
        }
    };
    if let Some((_, a)) = t.pin {
        return Ok(a);
    }
    let port = url.port_or_known_default().unwrap_or(80);
    let ip =
        url.host_str().unwrap_or_default().trim_matches(['[', ']']).parse().map_err(|_| "no address".to_string())?;
    Ok(SocketAddr::new(ip, port))
}

/// A connection to where `url` points, as the guard checked it; `None`
/// once the client has been told why not (403, or 502 when it does not
/// answer).
async fn upstream(
    c: &mut TcpStream,
    url: &url::Url,
    allow_local: bool,
    resolver: &dyn Resolve,
    blocked: &Blocked,
) -> Option<TcpStream> {
    let addr = match checked(url, allow_local, resolver, blocked).await {
        Ok(a) => a,
        Err(why) => {
            refuse(c, "403 Forbidden", &why).await;
            return None;
        }
    };
    match tokio::time::timeout(Duration::from_secs(15), TcpStream::connect(addr)).await {
        Ok(Ok(u)) => Some(u),
        _ => {
            refuse(c, "502 Bad Gateway", &format!("{} did not answer", url.host_str().unwrap_or(""))).await;
            None
        }
    }
}

async fn serve(mut c: TcpStream, allow_local: bool, resolver: &dyn Resolve, blocked: &Blocked) -> Result<(), String> {
    let (head, rest) = head(&mut c).await?;
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split(' ');
    let (method, target, version) =
        (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if !version.starts_with("HTTP/1.") {
        refuse(&mut c, "400 Bad Request", "not an HTTP/1 request").await;
        return Ok(());
    }
    if method == "CONNECT" {
        // host:port, as a URL so the guard reads the host as the URL parser does.
        let url = match url::Url::parse(&format!("https://{target}/")) {
            Ok(u) if u.port_or_known_default().is_some() => u,
            _ => {
                refuse(&mut c, "400 Bad Request", &format!("{target} is not host:port")).await;
                return Ok(());
            }
        };
        let Some(mut up) = upstream(&mut c, &url, allow_local, resolver, blocked).await else { return Ok(()) };
        c.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n").await.map_err(|e| e.to_string())?;
        if !rest.is_empty() {
            up.write_all(&rest).await.map_err(|e| e.to_string())?;
        }
        let _ = tokio::io::copy_bidirectional(&mut c, &mut up).await;
        return Ok(());
    }
    let url = match url::Url::parse(target) {
        Ok(u) if u.scheme() == "http" => u,
        _ => {
            refuse(&mut c, "400 Bad Request", &format!("{target} is not an absolute http URL")).await;
            return Ok(());
        }
    };
    let Some(mut up) = upstream(&mut c, &url, allow_local, resolver, blocked).await else { return Ok(()) };
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let mut out = format!("{method} {path} {version}\r\n");
    for h in lines.filter(|l| !l.is_empty()) {
        let name = h.split(':').next().unwrap_or("").trim().to_ascii_lowercase();
        if matches!(name.as_str(), "proxy-connection" | "connection" | "keep-alive" | "proxy-authorization") {
            continue;
        }
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    up.write_all(out.as_bytes()).await.map_err(|e| e.to_string())?;
    if !rest.is_empty() {
        up.write_all(&rest).await.map_err(|e| e.to_string())?;
    }
    let _ = tokio::io::copy_bidirectional(&mut c, &mut up).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn origin() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let first = req.lines().next().unwrap_or("").to_string();
                    let close = req.contains("Connection: close");
                    let body = format!("{first}|close={close}");
                    let _ = s
                        .write_all(
                            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len()).as_bytes(),
                        )
                        .await;
                });
            }
        });
        a
    }

    async fn ask(port: u16, req: String) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn the_proxy_passes_what_the_guard_allows_and_refuses_the_rest() {
        let o = origin().await;
        let blocked: Blocked = Arc::default();
        let open = start(true, Arc::new(egress::SystemResolver), blocked.clone()).await.unwrap();
        // Plain HTTP goes on in origin form, one request a connection.
        let r = ask(
            open.port,
            format!("GET http://{o}/a?b=1 HTTP/1.1\r\nHost: {o}\r\nProxy-Connection: keep-alive\r\n\r\n"),
        )
        .await;
        assert!(r.contains("GET /a?b=1 HTTP/1.1|close=true"), "{r}");
        // CONNECT is tunnelled.
        let mut s = TcpStream::connect(("127.0.0.1", open.port)).await.unwrap();
        s.write_all(format!("CONNECT {o} HTTP/1.1\r\nHost: {o}\r\n\r\n").as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 39];
        s.read_exact(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200 Connection Established"));
        s.write_all(b"GET /t HTTP/1.1\r\n\r\n").await.unwrap();
        let mut out = vec![0u8; 256];
        let n = s.read(&mut out).await.unwrap();
        assert!(String::from_utf8_lossy(&out[..n]).contains("GET /t HTTP/1.1"));
        // The metadata address is refused even with local access.
        let r = ask(open.port, "CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n".into()).await;
        assert!(r.starts_with("HTTP/1.1 403") && r.contains("metadata"), "{r}");
        // Without local access, loopback is refused, in any spelling.
        let closed = start(false, Arc::new(egress::SystemResolver), blocked.clone()).await.unwrap();
        for t in
            [format!("CONNECT {o} HTTP/1.1\r\n\r\n"), format!("GET http://0x7f000001:{}/ HTTP/1.1\r\n\r\n", o.port())]
        {
            let r = ask(closed.port, t).await;
            assert!(r.starts_with("HTTP/1.1 403"), "{r}");
        }
        let r = ask(closed.port, "GET /relative HTTP/1.1\r\n\r\n".into()).await;
        assert!(r.starts_with("HTTP/1.1 400"), "{r}");
        assert_eq!(blocked.lock().unwrap().len(), 3, "{:?}", blocked.lock().unwrap());
    }
}
