//! Moving an agent between hosts (issue 23, `adf move`). The file is the
//! agent, so a move is: stop it here, send the file, start it there. The
//! receiving daemon takes the file whole (`POST /agents/import`: streamed
//! to a hidden file beside the fleet, checked as an agent file, linked into
//! place only if no file of that name is there, then reviewed and loaded);
//! the sending daemon keeps a forward for the agent's handle and DID
//! (`POST /agents/forwards`, kept in the fleet's `.moved.json`), so a peer
//! that still posts to the old inbox address is relayed to the new one.
//! Its file is kept beside the fleet as `<file>.moved`, never deleted.
//! The relaying itself is the mesh's (`runtime/mesh/forward.rs`).

use std::path::{Path, PathBuf};

use axum::Json;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use super::routes::{Q, body, field};
use super::{ApiError, ApiResult, AppState};
use crate::runtime::mesh::forward::{Forward, forwards_path};
use crate::store::Store;

/// What `POST /agents/forwards` takes, as its OpenAPI schema says it: a
/// handle, a `did:key` (base58btc), and an inbox address at a host name
/// or an IPv4 address.
pub const HANDLE: &str = "^[a-z0-9-]{1,64}$";
pub const DID_KEY: &str = "^did:key:z[1-9A-HJ-NP-Za-km-z]{1,100}$";
pub const INBOX_URL: &str = concat!(
    "^https?://(",
    "([a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?\\.){0,4}[a-z]([a-z0-9-]{0,20}[a-z0-9])?",
    "|((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])",
    ")(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?",
    "/agents/[a-z0-9-]{1,64}/inbox$"
);

type Pattern = std::sync::LazyLock<Option<regex::Regex>>;
static RE_HANDLE: Pattern = std::sync::LazyLock::new(|| regex::Regex::new(HANDLE).ok());
static RE_DID_KEY: Pattern = std::sync::LazyLock::new(|| regex::Regex::new(DID_KEY).ok());
static RE_INBOX_URL: Pattern = std::sync::LazyLock::new(|| regex::Regex::new(INBOX_URL).ok());

fn matches(re: &Pattern, s: &str) -> bool {
    re.as_ref().is_some_and(|r| r.is_match(s))
}

/// The route that reads its own body (the body layer's 2 MiB cap does not
/// apply to it).
pub const IMPORT: &str = "/agents/import";
/// The largest agent file a daemon takes in.
pub const MAX_IMPORT: u64 = 4 << 30;
/// The longest quiet gap while a file arrives.
const IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// A file name a daemon takes for an agent: `NAME.adf`, no folder, no
/// leading dot.
fn check_name(name: &str) -> Result<(), ApiError> {
    let ok = name.len() <= 128
        && name.ends_with(".adf")
        && name.len() > 4
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad(format!("name must be a file name like scout.adf (a-z, 0-9, . _ -), got {name:?}")))
    }
}

/// `POST /agents/import?name=NAME.adf`: the body is a whole agent file.
pub async fn import(State(s): State<AppState>, Query(q): Q, b: Body) -> ApiResult {
    let checked = match q.get("name") {
        None => Err(ApiError::bad("name is required (?name=scout.adf)")),
        Some(name) => check_name(name).map(|()| name.clone()),
    };
    let checked = checked.and_then(|name| {
        let dest = s.fleet_dir.join(&name);
        if dest.exists() { Err(exists(&dest)) } else { Ok((name, dest)) }
    });
    let (name, dest) = match checked {
        Ok(x) => x,
        Err(e) => {
            // Read what is already on its way, so the client hears why
            // instead of a connection cut while it still sends.
            drain(b).await;
            return Err(e);
        }
    };
    let tmp = s.fleet_dir.join(format!(".{name}.import-{}", crate::store::create::nanoid(8)));
    let got = receive(b, &tmp).await;
    let placed = match got {
        Ok(()) => tokio::task::spawn_blocking({
            let (tmp, dest) = (tmp.clone(), dest.clone());
            move || place(&tmp, &dest)
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))
        .and_then(|r| r),
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_file(&tmp);
    let id = placed?;
    let mut fleet = s.fleet.lock().await;
    if fleet.list().iter().any(|a| a.id == id) {
        drop(fleet);
        let _ = std::fs::remove_file(&dest);
        return Err(ApiError::new(StatusCode::CONFLICT, format!("agent {id} runs on this host already"))
            .with_code("AGENT_EXISTS"));
    }
    // The owner sent it: that is the review.
    crate::review::mark_reviewed(&id).map_err(ApiError::internal)?;
    let (info, _) = match fleet.load_config(&dest) {
        Ok(x) => x,
        Err(e) => {
            // Not started here: not left here either (it still runs, or
            // runs again, where it came from).
            let _ = std::fs::remove_file(&dest);
            return Err(ApiError::bad(e));
        }
    };
    Ok(Json(json!({"id": info.id, "handle": info.handle, "name": info.name, "filePath": info.path})))
}

/// Read and drop a refused body: up to 16 MiB within 5 s.
async fn drain(b: Body) {
    let mut stream = b.into_data_stream();
    let mut n = 0usize;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while let Ok(Some(Ok(c))) = tokio::time::timeout_at(deadline, stream.next()).await {
        n += c.len();
        if n > 16 << 20 {
            break;
        }
    }
}

fn exists(dest: &Path) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, format!("{} exists on this host already", dest.display()))
        .with_code("FILE_EXISTS")
}

/// The body into `tmp`, within [`MAX_IMPORT`] and [`IDLE`]; synced.
async fn receive(b: Body, tmp: &Path) -> Result<(), ApiError> {
    let mut f = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .await
        .map_err(|e| ApiError::internal(format!("{}: {e}", tmp.display())))?;
    let mut stream = b.into_data_stream();
    let mut n: u64 = 0;
    loop {
        let chunk = match tokio::time::timeout(IDLE, stream.next()).await {
            Err(_) => {
                return Err(ApiError::new(StatusCode::REQUEST_TIMEOUT, "the file stopped arriving for 30 s")
                    .with_code("BODY_TIMEOUT"));
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(ApiError::bad(format!("the file could not be read: {e}"))),
            Ok(Some(Ok(c))) => c,
        };
        n += chunk.len() as u64;
        if n > MAX_IMPORT {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the file is over the limit of {MAX_IMPORT} bytes"),
            )
            .with_code("BODY_TOO_LARGE"));
        }
        f.write_all(&chunk).await.map_err(|e| ApiError::internal(format!("{}: {e}", tmp.display())))?;
    }
    f.sync_all().await.map_err(|e| ApiError::internal(format!("{}: {e}", tmp.display())))?;
    Ok(())
}

/// Check `tmp` is a whole agent file and link it in as `dest` (never over
/// a file that is there); the agent's id.
fn place(tmp: &Path, dest: &Path) -> Result<String, ApiError> {
    let problems = crate::store::repair::check(tmp).map_err(|e| ApiError::bad(format!("not an agent file: {e}")))?;
    if !problems.is_empty() {
        return Err(ApiError::bad(format!("the file is damaged: {}", problems.join("; "))));
    }
    let id = {
        let store = Store::open_read_only(tmp).map_err(|e| ApiError::bad(format!("not an agent file: {e}")))?;
        let cfg = store.config_value().map_err(|e| ApiError::bad(format!("not an agent file: {e}")))?;
        cfg["id"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| ApiError::bad("the file's config has no id"))?
    };
    // The read-only open may leave nothing behind, but be sure.
    for s in ["-wal", "-shm"] {
        let mut p = tmp.as_os_str().to_owned();
        p.push(s);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
    std::fs::hard_link(tmp, dest).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            exists(dest)
        } else {
            ApiError::internal(format!("{}: {e}", dest.display()))
        }
    })?;
    if let Some(dir) = dest.parent()
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(id)
}

/// `GET /agents/forwards`: the agents that moved away from this host.
pub async fn list(State(s): State<AppState>) -> ApiResult {
    let mesh = s.fleet.lock().await.mesh.clone();
    Ok(Json(json!({"forwards": mesh.forwards()})))
}

/// `POST /agents/forwards {handle, did, to, filePath?}`: keep relaying
/// messages for an agent that moved; its old file (not loaded) is kept as
/// `<file>.moved`.
pub async fn add(State(s): State<AppState>, b: axum::body::Bytes) -> ApiResult {
    let v = body(&b)?;
    let (handle, did, to) = (field(&v, "handle")?, field(&v, "did")?, field(&v, "to")?);
    if !matches(&RE_HANDLE, handle) {
        return Err(ApiError::bad(format!("handle must be [a-z0-9-], 1 to 64 of them, got {handle:?}")));
    }
    if !matches(&RE_DID_KEY, did) {
        return Err(ApiError::bad(format!("did must be a did:key, got {did:?}")));
    }
    // As the schema says, and then as the URL parser reads it.
    if !matches(&RE_INBOX_URL, to) || url::Url::parse(to).is_err() {
        return Err(ApiError::bad(format!(
            "to must be an http(s) inbox address at a host name or IPv4 address (…/agents/<handle>/inbox), got {to:?}"
        )));
    }
    let fleet = s.fleet.lock().await;
    if fleet.list().iter().any(|a| a.handle == handle) {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("{handle} is loaded here: stop it first"))
            .with_code("AGENT_LOADED"));
    }
    // Only an agent file of this fleet steps aside, never any other file.
    let moved = match v.get("filePath") {
        None => None,
        Some(Value::String(p)) => {
            let p = Path::new(p);
            let fleet_dir = std::fs::canonicalize(&s.fleet_dir).unwrap_or_else(|_| s.fleet_dir.clone());
            let canon = std::fs::canonicalize(p).ok().filter(|c| c.is_file());
            let Some(canon) = canon else {
                return Err(ApiError::not_found(format!("no agent file at {}", p.display())));
            };
            if !canon.starts_with(&fleet_dir) || p.extension().is_none_or(|e| e != "adf") {
                return Err(ApiError::bad(format!(
                    "filePath must be an agent file of this fleet, got {}",
                    p.display()
                )));
            }
            Some(keep_aside(p)?)
        }
        Some(_) => return Err(ApiError::bad("filePath must be a string")),
    };
    let fwd = Forward {
        handle: handle.to_string(),
        did: did.to_string(),
        to: to.to_string(),
        moved_at: crate::store::now_iso(),
    };
    let mesh = fleet.mesh.clone();
    let mut all: Vec<Forward> =
        mesh.forwards().into_iter().filter(|f| f.handle != fwd.handle && f.did != fwd.did).collect();
    all.push(fwd);
    let text = serde_json::to_string_pretty(&all).map_err(|e| ApiError::internal(e.to_string()))?;
    crate::providers::accounts::write_private(&forwards_path(&s.fleet_dir), &text).map_err(ApiError::internal)?;
    mesh.set_forwards(all.clone());
    Ok(Json(json!({"forwards": all, "keptAs": moved})))
}

/// Rename an agent file out of the fleet's way (`.moved`, or
/// `.moved-<n>` when that is taken), sidecars with it.
pub fn keep_aside(path: &Path) -> Result<PathBuf, ApiError> {
    let mut n = 0;
    let target = loop {
        let mut t = path.as_os_str().to_owned();
        t.push(if n == 0 { ".moved".to_string() } else { format!(".moved-{n}") });
        let t = PathBuf::from(t);
        if !t.exists() {
            break t;
        }
        n += 1;
    };
    std::fs::rename(path, &target).map_err(|e| ApiError::internal(format!("{}: {e}", path.display())))?;
    for s in ["-wal", "-shm"] {
        let (mut from, mut to) = (path.as_os_str().to_owned(), target.as_os_str().to_owned());
        from.push(s);
        to.push(s);
        let _ = std::fs::rename(PathBuf::from(from), PathBuf::from(to));
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwards_take_what_their_schema_says() {
        for to in [
            "http://box/agents/a/inbox",
            "https://hub.tail0.ts.net:7295/agents/scout-2/inbox",
            "http://100.64.0.2:7295/agents/m/inbox",
        ] {
            assert!(matches(&RE_INBOX_URL, to), "{to}");
        }
        for to in [
            "http://box/agents/a/inbox?x",
            "http://BOX/agents/a/inbox",
            "http://1.2.3.4.5/agents/a/inbox",
            "http://box:70000/agents/a/inbox",
            "ftp://box/agents/a/inbox",
            "http://box/agents/a/outbox",
        ] {
            assert!(!matches(&RE_INBOX_URL, to), "{to}");
        }
        assert!(matches(&RE_DID_KEY, "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"));
        assert!(!matches(&RE_DID_KEY, "did:key:zt*") && !matches(&RE_DID_KEY, "did:key:z0OIl"));
        assert!(matches(&RE_HANDLE, "scout-2") && !matches(&RE_HANDLE, "Scout") && !matches(&RE_HANDLE, ""));
    }
}
