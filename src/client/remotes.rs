//! Named daemons on other machines (issue 23): `remotes` in settings.json,
//! each a name, the daemon's URL and where its token is: the environment's
//! `ADF_DAEMON_TOKEN_<NAME>` (the name upper-cased, `-` as `_`), else a
//! token file. `adf remote ls|add|rm` keeps the list; `--remote NAME` points
//! a command (or the app) at one of them. Tokens are never written into
//! settings.json.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::providers::accounts;

/// One remote as settings.json keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Remote {
    pub name: String,
    pub url: String,
    #[serde(rename = "tokenFile", default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The runtime that answered when it was added: a daemon at that
    /// address that answers as another runtime is refused.
    #[serde(rename = "runtimeId", default, skip_serializing_if = "Option::is_none")]
    pub runtime_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("{0}")]
    Settings(String),
    #[error(
        "remote name {0:?}: 1 to 32 of a-z, 0-9, - and _, starting with a letter or digit (\"all\" means every remote)"
    )]
    BadName(String),
    #[error("{url:?} is not a daemon URL ({why}): use http://host:port, https://host or ssh://[user@]host")]
    BadUrl { url: String, why: String },
    #[error("no remote named {0:?} (adf remote ls lists them)")]
    Unknown(String),
    #[error("a remote named {0:?} exists already (adf remote rm it first)")]
    Exists(String),
    #[error("{}: {why}", path.display())]
    TokenFile { path: PathBuf, why: String },
    #[error("remote {name}: {err}")]
    Ssh { name: String, err: super::ssh::SshError },
}

/// What asking a remote who it is can come to, besides an answer.
#[derive(Debug, thiserror::Error)]
pub enum Answer {
    /// It did not answer, or refused (a wrong token).
    #[error("{0}")]
    Failed(String),
    /// Another runtime answers at its address.
    #[error("{0}")]
    Impostor(String),
}

/// `[a-z0-9][a-z0-9_-]{0,31}`, not `all`.
pub fn check_name(name: &str) -> Result<(), RemoteError> {
    let ok = (1..=32).contains(&name.len())
        && name
            .bytes()
            .enumerate()
            .all(|(i, b)| b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && (b == b'-' || b == b'_')))
        && name != "all";
    if ok { Ok(()) } else { Err(RemoteError::BadName(name.to_string())) }
}

/// A daemon's base URL, as the URL parser reads it: http or https, a
/// host, no path, query or user; or `ssh://[user@]host[:port]`.
pub fn check_url(raw: &str) -> Result<String, RemoteError> {
    let bad = |why: &str| RemoteError::BadUrl { url: raw.to_string(), why: why.to_string() };
    let u = url::Url::parse(raw.trim()).map_err(|e| bad(&e.to_string()))?;
    if u.scheme() == "ssh" {
        super::ssh::destination(raw.trim()).map_err(|e| bad(&e.to_string()))?;
        return Ok(raw.trim().trim_end_matches('/').to_string());
    }
    if !matches!(u.scheme(), "http" | "https") {
        return Err(bad(&format!("the scheme is {}", u.scheme())));
    }
    let host = u.host_str().filter(|h| !h.is_empty()).ok_or_else(|| bad("no host"))?;
    if !matches!(u.path(), "" | "/") || u.query().is_some() || u.fragment().is_some() {
        return Err(bad("a path, query or fragment"));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(bad("a user name or password (the token goes in a file or the environment)"));
    }
    Ok(match u.port() {
        Some(p) => format!("{}://{host}:{p}", u.scheme()),
        None => format!("{}://{host}", u.scheme()),
    })
}

/// The environment variable that carries a remote's token.
pub fn token_var(name: &str) -> String {
    format!("ADF_DAEMON_TOKEN_{}", name.to_ascii_uppercase().replace('-', "_"))
}

/// Every remote in settings.json.
pub fn list() -> Result<Vec<Remote>, RemoteError> {
    let s = accounts::load().map_err(RemoteError::Settings)?;
    match s.extra.get("remotes") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
            RemoteError::Settings(format!(
                "{}: remotes is not a list of {{name, url, tokenFile}}: {e}",
                accounts::settings_path().display()
            ))
        }),
    }
}

fn save(list: &[Remote]) -> Result<(), RemoteError> {
    let mut s = accounts::load().map_err(RemoteError::Settings)?;
    let v = serde_json::to_value(list).map_err(|e| RemoteError::Settings(e.to_string()))?;
    s.extra.insert("remotes".into(), v);
    accounts::save(&s).map_err(RemoteError::Settings)
}

/// Add a remote; a bad name, URL or token file changes nothing.
pub fn add(name: &str, url: &str, token_file: Option<PathBuf>) -> Result<Remote, RemoteError> {
    check_name(name)?;
    let url = check_url(url)?;
    let token_file = match token_file {
        Some(p) => {
            let p = std::path::absolute(&p).unwrap_or(p);
            read_token(&p)?;
            Some(p)
        }
        None => None,
    };
    let mut all = list()?;
    if all.iter().any(|r| r.name == name) {
        return Err(RemoteError::Exists(name.to_string()));
    }
    let mut r = Remote { name: name.to_string(), url, token_file, runtime_id: None };
    r.runtime_id = r.answering_runtime();
    all.push(r.clone());
    save(&all)?;
    Ok(r)
}

/// Remove a remote by name.
pub fn remove(name: &str) -> Result<Remote, RemoteError> {
    let mut all = list()?;
    let i = all.iter().position(|r| r.name == name).ok_or_else(|| RemoteError::Unknown(name.to_string()))?;
    let r = all.remove(i);
    save(&all)?;
    Ok(r)
}

/// The remotes `--remote` names (`all`: every one), in the order given.
pub fn pick(names: &[String]) -> Result<Vec<Remote>, RemoteError> {
    let all = list()?;
    if names.iter().any(|n| n == "all") {
        return Ok(all);
    }
    let mut out: Vec<Remote> = Vec::new();
    for n in names {
        let r = all.iter().find(|r| r.name == *n).ok_or_else(|| RemoteError::Unknown(n.clone()))?;
        if !out.contains(r) {
            out.push(r.clone());
        }
    }
    Ok(out)
}

fn read_token(path: &std::path::Path) -> Result<String, RemoteError> {
    let t = std::fs::read_to_string(path)
        .map_err(|e| RemoteError::TokenFile { path: path.to_path_buf(), why: e.to_string() })?;
    let t = t.trim().to_string();
    if t.is_empty() || t.contains(char::is_whitespace) {
        return Err(RemoteError::TokenFile { path: path.to_path_buf(), why: "not one token on one line".into() });
    }
    Ok(t)
}

impl Remote {
    /// The token and where it came from: the environment first, then the
    /// token file; none when neither has one.
    pub fn token(&self) -> Result<Option<(String, String)>, RemoteError> {
        let var = token_var(&self.name);
        if let Some(t) = std::env::var(&var).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()) {
            return Ok(Some((t, var)));
        }
        match &self.token_file {
            Some(p) => Ok(Some((read_token(p)?, p.display().to_string()))),
            None => Ok(None),
        }
    }

    /// The runtime its daemon says it is, when it answers now.
    fn answering_runtime(&self) -> Option<String> {
        let conn = self.connect().ok()?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        let w = rt.block_on(conn.client().get(&["whoami"])).ok()?;
        w["runtime_id"].as_str().map(str::to_string)
    }

    /// Its daemon's `/whoami`, checked against the runtime it was added
    /// as.
    pub async fn whoami(&self, c: &super::Client) -> Result<Value, Answer> {
        let w = c.get(&["whoami"]).await.map_err(|e| Answer::Failed(e.to_string()))?;
        match (&self.runtime_id, w["runtime_id"].as_str()) {
            (Some(want), Some(got)) if want != got => Err(Answer::Impostor(format!(
                "{} answers as runtime {got}, not {want} it was added as (another fleet at that address?): check it, then adf remote rm {} and add it again",
                self.url, self.name
            ))),
            _ => Ok(w),
        }
    }

    /// Reach this remote's daemon: at its URL, or through an SSH tunnel
    /// (kept open as long as the connection is), with its token (an
    /// `ssh://` remote's from the far side unless set here).
    pub fn connect(&self) -> Result<Connection, RemoteError> {
        let token = self.token()?.map(|(t, _)| t);
        if !self.url.starts_with("ssh:") {
            let f = Fields { url: self.url.clone(), token, host: None };
            return Ok(Connection { f, _tunnel: None });
        }
        let t = super::ssh::open(&self.url).map_err(|err| RemoteError::Ssh { name: self.name.clone(), err })?;
        let f = Fields { url: t.url.clone(), token: token.or_else(|| t.token.clone()), host: Some(t.host.clone()) };
        Ok(Connection { f, _tunnel: Some(t) })
    }
}

/// Where and how to reach a remote daemon.
#[derive(Debug, Clone)]
pub struct Fields {
    pub url: String,
    pub token: Option<String>,
    /// The `Host` to send (the far daemon's own address, through a tunnel).
    pub host: Option<String>,
}

/// A way to a remote daemon (the tunnel, for an `ssh://` one, closes when
/// this is dropped).
pub struct Connection {
    f: Fields,
    _tunnel: Option<super::ssh::Tunnel>,
}

impl Connection {
    pub fn url(&self) -> &str {
        &self.f.url
    }

    pub fn clone_fields(&self) -> Fields {
        self.f.clone()
    }

    pub fn client(&self) -> super::Client {
        let mut c = super::Client::new(&self.f.url);
        c.token = self.f.token.clone();
        c.host = self.f.host.clone();
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_urls_are_checked() {
        for ok in ["home", "vps-1", "work_box", "9lives"] {
            check_name(ok).unwrap();
        }
        for bad in ["", "all", "Home", "-x", "a b", "a/b", &"x".repeat(33)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(check_url("http://10.0.0.2:7385/").unwrap(), "http://10.0.0.2:7385");
        assert_eq!(check_url("https://hub.example.org").unwrap(), "https://hub.example.org");
        assert_eq!(check_url("http://[fd00::1]:7385").unwrap(), "http://[fd00::1]:7385");
        assert_eq!(check_url("ssh://me@box:2222").unwrap(), "ssh://me@box:2222");
        for bad in
            ["10.0.0.2:7385", "ftp://x", "http://x/agents", "http://u:p@x:1", "http://x:1?q", "nonsense", "ssh://-oX"]
        {
            assert!(check_url(bad).is_err(), "{bad:?}");
        }
        assert_eq!(token_var("vps-1"), "ADF_DAEMON_TOKEN_VPS_1");
    }
}
