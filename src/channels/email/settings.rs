//! Where an email account's servers are: the IMAP and SMTP host, port and
//! TLS mode (`adapters.email.config.imap` / `.smtp`), guessed from the
//! address's provider when not given (Gmail, iCloud, Outlook, Fastmail,
//! Yahoo; `imap.<domain>` / `smtp.<domain>` otherwise), and the check of a
//! connect request (`channels::connect`). TLS is never off: implicit TLS
//! (`imaps://`, `smtps://`, ports 993 and 465) or STARTTLS (`imap://`,
//! `smtp://`), which refuses a server that does not offer it.

use std::fmt;

use serde_json::{Value, json};

/// One server of an account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub host: String,
    pub port: u16,
    /// TLS from the first byte; else STARTTLS (required).
    pub implicit_tls: bool,
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = if self.implicit_tls { "TLS" } else { "STARTTLS" };
        write!(f, "{}:{} {mode}", self.host, self.port)
    }
}

impl Server {
    fn new(host: &str, port: u16) -> Server {
        Server { host: host.to_string(), port, implicit_tls: matches!(port, 993 | 465) }
    }

    /// From config (`{host, port, tls: "implicit"|"starttls"}`).
    pub fn of(v: &Value) -> Option<Server> {
        let host = v["host"].as_str().filter(|h| !h.is_empty())?;
        let port = u16::try_from(v["port"].as_u64()?).ok()?;
        let mut s = Server::new(host, port);
        match v["tls"].as_str() {
            Some("implicit") => s.implicit_tls = true,
            Some("starttls") => s.implicit_tls = false,
            _ => {}
        }
        Some(s)
    }

    pub fn to_json(&self) -> Value {
        json!({"host": self.host, "port": self.port, "tls": if self.implicit_tls { "implicit" } else { "starttls" }})
    }

    /// `imaps://host[:993]` (implicit TLS) or `imap://host[:143]`
    /// (STARTTLS); `smtps://`/`smtp://` (465, 587) for `proto` smtp.
    pub fn parse_url(u: &str, proto: &str) -> Result<Server, String> {
        let url = url::Url::parse(u).map_err(|e| format!("{u:?} is not a URL: {e}"))?;
        let (implicit, default_port) = match (proto, url.scheme()) {
            ("imap", "imaps") => (true, 993),
            ("imap", "imap") => (false, 143),
            ("smtp", "smtps") => (true, 465),
            ("smtp", "smtp") => (false, 587),
            (p, other) => {
                return Err(format!("{u:?}: use {p}s://host:port (TLS) or {p}://host:port (STARTTLS), not {other}://"));
            }
        };
        let host = url.host_str().filter(|h| !h.is_empty()).ok_or_else(|| format!("{u:?} names no host"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if !matches!(url.path(), "" | "/") || url.query().is_some() || !url.username().is_empty() {
            return Err(format!("{u:?}: only a host and a port (credentials come from stdin)"));
        }
        Ok(Server { host: host.to_string(), port: url.port().unwrap_or(default_port), implicit_tls: implicit })
    }
}

/// A provider: its domains, its IMAP and its SMTP server.
type Provider = (&'static [&'static str], (&'static str, u16), (&'static str, u16));

/// The servers (IMAP, SMTP) an address's provider uses.
pub fn auto_settings(address: &str) -> (Server, Server) {
    let domain = address.rsplit_once('@').map(|(_, d)| d.to_ascii_lowercase()).unwrap_or_default();
    let known: &[Provider] = &[
        (&["gmail.com", "googlemail.com"], ("imap.gmail.com", 993), ("smtp.gmail.com", 465)),
        (&["icloud.com", "me.com", "mac.com"], ("imap.mail.me.com", 993), ("smtp.mail.me.com", 587)),
        (&["outlook.com", "hotmail.com", "live.com"], ("outlook.office365.com", 993), ("smtp.office365.com", 587)),
        (&["fastmail.com", "fastmail.fm"], ("imap.fastmail.com", 993), ("smtp.fastmail.com", 465)),
        (&["yahoo.com"], ("imap.mail.yahoo.com", 993), ("smtp.mail.yahoo.com", 465)),
    ];
    for (domains, imap, smtp) in known {
        if domains.contains(&domain.as_str()) {
            return (Server::new(imap.0, imap.1), Server::new(smtp.0, smtp.1));
        }
    }
    (Server::new(&format!("imap.{domain}"), 993), Server::new(&format!("smtp.{domain}"), 465))
}

/// Is this an email address (`name@domain`, as SMTP takes it)?
pub fn check_address(a: &str) -> Result<String, String> {
    let a = a.trim();
    a.parse::<lettre::Address>().map_err(|e| format!("{a:?} is not an email address ({e})"))?;
    Ok(a.to_string())
}

/// Check a connect request against the config set before: the config to
/// write (`address`, `imap`, `smtp`, `ca_pem`, and what was set before)
/// and the login name to seal.
pub fn settings(input: &Value, before: &Value) -> Result<(Value, String), String> {
    let address = input["address"]
        .as_str()
        .or(before["address"].as_str())
        .filter(|a| !a.trim().is_empty())
        .ok_or("an email channel needs its address (--address ann@example.org)")?;
    let address = check_address(address)?;
    let (auto_imap, auto_smtp) = auto_settings(&address);
    let imap = match input["imap"].as_str().or(input["api_url"].as_str()) {
        Some(u) => Server::parse_url(u, "imap").map_err(|e| format!("imap {e}"))?,
        None => Server::of(&before["imap"]).unwrap_or(auto_imap),
    };
    let smtp = match input["smtp"].as_str() {
        Some(u) => Server::parse_url(u, "smtp").map_err(|e| format!("smtp {e}"))?,
        None => Server::of(&before["smtp"]).unwrap_or(auto_smtp),
    };
    let mut config = before.as_object().cloned().unwrap_or_default();
    config.insert("address".into(), address.clone().into());
    config.insert("imap".into(), imap.to_json());
    config.insert("smtp".into(), smtp.to_json());
    if let Some(pem) = input["ca_pem"].as_str() {
        super::tls::roots(pem.as_bytes()).map_err(|e| format!("ca_pem: {e}"))?;
        config.insert("ca_pem".into(), pem.into());
    }
    let username = input["username"].as_str().map(str::trim).filter(|u| !u.is_empty()).unwrap_or(&address);
    Ok((Value::Object(config), username.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers_are_known_by_domain_and_urls_say_the_tls_mode() {
        let (i, s) = auto_settings("Ann@GMail.com");
        assert_eq!((i.to_string(), s.to_string()), ("imap.gmail.com:993 TLS".into(), "smtp.gmail.com:465 TLS".into()));
        let (i, s) = auto_settings("bob@icloud.com");
        assert_eq!((i.host.as_str(), s.to_string()), ("imap.mail.me.com", "smtp.mail.me.com:587 STARTTLS".into()));
        assert_eq!(auto_settings("c@hotmail.com").0.host, "outlook.office365.com");
        assert_eq!(auto_settings("c@fastmail.fm").1.host, "smtp.fastmail.com");
        assert_eq!(auto_settings("c@yahoo.com").0.host, "imap.mail.yahoo.com");
        assert_eq!(auto_settings("c@example.org").0.to_string(), "imap.example.org:993 TLS");
        let u = Server::parse_url("imap://127.0.0.1:10143", "imap").unwrap();
        assert_eq!((u.port, u.implicit_tls), (10143, false));
        assert_eq!(Server::parse_url("smtps://mail.example.org", "smtp").unwrap().port, 465);
        assert!(Server::parse_url("http://x", "imap").unwrap_err().contains("imaps://host:port"));
        assert!(Server::parse_url("imaps://u:p@x", "imap").unwrap_err().contains("only a host"));
        assert_eq!(Server::of(&u.to_json()), Some(u));
    }

    #[test]
    fn a_connect_request_is_checked_and_keeps_what_was_set() {
        let before = json!({"poll_interval": 5000, "imap": {"host": "old", "port": 993}});
        let (cfg, user) =
            settings(&json!({"address": "ann@example.org", "smtp": "smtp://127.0.0.1:2525"}), &before).unwrap();
        assert_eq!(user, "ann@example.org", "the login defaults to the address");
        assert_eq!(cfg["poll_interval"], 5000);
        assert_eq!(cfg["imap"]["host"], "old");
        assert_eq!(cfg["smtp"], json!({"host": "127.0.0.1", "port": 2525, "tls": "starttls"}));
        assert!(settings(&json!({}), &json!({})).unwrap_err().contains("needs its address"));
        assert!(settings(&json!({"address": "not an address"}), &json!({})).unwrap_err().contains("not an email"));
        assert!(settings(&json!({"address": "a@b.c", "ca_pem": "junk"}), &json!({})).unwrap_err().contains("ca_pem"));
    }
}
