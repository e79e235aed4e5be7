//! Daemon tokens with a role (issue 19): besides the install's own token
//! (the owner's), the owner mints tokens for other people and programs:
//! `owner` (everything), `approver` (read, answer approvals and asks) and
//! `observer` (read only). Only a token's SHA-256 is kept, in
//! `tokens.json` in the config folder (mode 0600); the daemon reads that
//! file again when it changes, so `adf token rm` takes effect on the next
//! request. What a role may do is decided here from the route the request
//! matched and its method, nowhere else.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use axum::http::Method;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read only.
    Observer,
    /// Read, and answer approvals and asks.
    Approver,
    /// Everything.
    Owner,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Observer => "observer",
            Role::Approver => "approver",
            Role::Owner => "owner",
        }
    }

    /// A role by name, or an error naming the three.
    pub fn parse(s: &str) -> Result<Role, String> {
        match s {
            "observer" => Ok(Role::Observer),
            "approver" => Ok(Role::Approver),
            "owner" => Ok(Role::Owner),
            other => Err(format!("unknown role {other:?}: use owner, approver or observer")),
        }
    }

    /// May this role make a request with `method` to the route `pattern`
    /// (the router's path pattern, `/agents/{id}/tasks/{task}/resolve`)?
    pub fn allows(self, method: &Method, pattern: &str) -> bool {
        if self == Role::Owner || method == Method::GET || method == Method::HEAD {
            return true;
        }
        self == Role::Approver
            && method == Method::POST
            && matches!(pattern, "/agents/{id}/tasks/{task}/resolve" | "/agents/{id}/asks/{request}/respond")
    }
}

/// One minted token, as kept (its hash, never the token).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Minted {
    pub id: String,
    pub role: Role,
    pub sha256: String,
    #[serde(default)]
    pub label: String,
    pub created_at: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    #[serde(default)]
    tokens: Vec<Minted>,
}

pub fn tokens_path() -> PathBuf {
    crate::paths::config_dir().join("tokens.json")
}

fn digest(token: &str) -> String {
    crate::identity::hex(&Sha256::digest(token.as_bytes()))
}

fn read(path: &std::path::Path) -> Result<File, String> {
    match std::fs::read_to_string(path) {
        Ok(t) => serde_json::from_str(&t).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(File::default()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn write(path: &std::path::Path, f: &File) -> Result<(), String> {
    let text = serde_json::to_string_pretty(f).map_err(|e| e.to_string())?;
    crate::providers::accounts::write_private(path, &text)
}

/// Mint a token: returns what is kept and the token itself (shown once).
pub fn mint(role: Role, label: &str) -> Result<(Minted, String), String> {
    let path = tokens_path();
    let mut f = read(&path)?;
    let secret: [u8; 32] = rand::random();
    let token = format!("adf_{}_{}", &role.as_str()[..3], crate::identity::hex(&secret));
    let m = Minted {
        id: format!("t_{}", crate::store::create::nanoid(8)),
        role,
        sha256: digest(&token),
        label: label.to_string(),
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    };
    f.tokens.push(m.clone());
    write(&path, &f)?;
    Ok((m, token))
}

/// The minted tokens.
pub fn list() -> Result<Vec<Minted>, String> {
    Ok(read(&tokens_path())?.tokens)
}

/// Revoke a token by id; false when there is none.
pub fn remove(id: &str) -> Result<bool, String> {
    let path = tokens_path();
    let mut f = read(&path)?;
    let before = f.tokens.len();
    f.tokens.retain(|t| t.id != id);
    if f.tokens.len() == before {
        return Ok(false);
    }
    write(&path, &f)?;
    Ok(true)
}

/// A file's modification time and length: changed, read it again.
type Stamp = (SystemTime, u64);

/// The daemon's view of the minted tokens, read again when the file
/// changes.
#[derive(Default)]
pub struct Registry {
    path: Option<PathBuf>,
    cache: Mutex<(Option<Stamp>, Vec<Minted>)>,
}

impl Registry {
    pub fn new(path: PathBuf) -> Registry {
        Registry { path: Some(path), cache: Mutex::new((None, Vec::new())) }
    }

    /// The role of a presented token, if it is a minted one.
    pub fn role_of(&self, token: &str) -> Option<Role> {
        let path = self.path.as_ref()?;
        let stamp = std::fs::metadata(path).ok().and_then(|m| Some((m.modified().ok()?, m.len())));
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if stamp != c.0 || stamp.is_none() {
            // Unreadable or gone: no minted token is valid.
            *c = (stamp, read(path).map(|f| f.tokens).unwrap_or_default());
        }
        let d = digest(token);
        c.1.iter().find(|t| super::token::same(&t.sha256, &d)).map(|t| t.role)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_may_do_what_it_says_and_no_more() {
        let resolve = "/agents/{id}/tasks/{task}/resolve";
        for r in [Role::Observer, Role::Approver, Role::Owner] {
            assert!(r.allows(&Method::GET, "/agents/{id}/loop"));
        }
        assert!(!Role::Observer.allows(&Method::POST, resolve));
        assert!(Role::Approver.allows(&Method::POST, resolve));
        assert!(Role::Approver.allows(&Method::POST, "/agents/{id}/asks/{request}/respond"));
        assert!(!Role::Approver.allows(&Method::POST, "/agents/{id}/chat"));
        assert!(!Role::Approver.allows(&Method::PUT, "/agents/{id}/config"));
        assert!(!Role::Approver.allows(&Method::DELETE, "/agents/{id}/chat"));
        assert!(Role::Owner.allows(&Method::DELETE, "/agents/{id}/chat"));
        assert_eq!(Role::parse("approver"), Ok(Role::Approver));
        assert!(Role::parse("admin").unwrap_err().contains("use owner, approver or observer"));
    }

    #[test]
    fn the_registry_knows_a_minted_token_by_its_hash_and_forgets_a_revoked_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.json");
        let token = "adf_obs_0123";
        let f = File {
            tokens: vec![Minted {
                id: "t_1".into(),
                role: Role::Observer,
                sha256: digest(token),
                label: String::new(),
                created_at: String::new(),
            }],
        };
        write(&path, &f).unwrap();
        assert!(!std::fs::read_to_string(&path).unwrap().contains(token), "only the hash is kept");
        let reg = Registry::new(path.clone());
        assert_eq!(reg.role_of(token), Some(Role::Observer));
        assert_eq!(reg.role_of("adf_obs_0124"), None);
        std::thread::sleep(std::time::Duration::from_millis(20));
        write(&path, &File::default()).unwrap();
        assert_eq!(reg.role_of(token), None, "revoked");
    }
}
