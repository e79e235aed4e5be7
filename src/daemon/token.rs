//! The daemon's bearer token: `ADF_DAEMON_TOKEN` when set, else a
//! per-install token minted once into `daemon-token` in the config folder
//! (mode 0600) that local clients read by themselves.

use std::io::Write;
use std::path::PathBuf;

pub fn token_path() -> PathBuf {
    crate::paths::config_dir().join("daemon-token")
}

/// The token from the environment, if set.
pub fn from_env() -> Option<String> {
    std::env::var("ADF_DAEMON_TOKEN").ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
}

/// The token a local client sends: the environment, else the token file.
pub fn for_client() -> Option<String> {
    from_env().or_else(|| std::fs::read_to_string(token_path()).ok().map(|t| t.trim().to_string()))
}

/// The daemon's token: the environment's, else the file's (minted if absent).
pub fn load_or_mint() -> Result<String, String> {
    if let Some(t) = from_env() {
        return Ok(t);
    }
    let path = token_path();
    if let Ok(t) = std::fs::read_to_string(&path) {
        let t = t.trim().to_string();
        if t.len() >= 32 {
            return Ok(t);
        }
    }
    let bytes: [u8; 32] = rand::random();
    let token = crate::identity::hex(&bytes);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(token.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(token)
}

/// Compare without leaking where the first difference is.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
