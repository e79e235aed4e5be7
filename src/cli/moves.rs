//! `adf move AGENT --to REMOTE` (issue 23): the file is the agent, so this
//! stops it here, sends the file to the remote's daemon (which checks it,
//! places it and starts it), and asks the daemon here to relay what still
//! arrives at the agent's old inbox address (`daemon/moves.rs`). The DID is
//! the file's and travels with it. Nothing is lost on the way: if the far
//! side refuses the file, the agent is started here again; the file here
//! is kept as `<file>.moved`.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use reqwest::Method;
use serde_json::{Value, json};

use super::held;
use super::output::Out;
use crate::client::Client;
use crate::client::remotes;

/// The agent's bytes as one consistent file: the file itself when it
/// stands alone, else a copy SQLite makes of it with its WAL (read only).
fn snapshot(path: &Path) -> anyhow::Result<Vec<u8>> {
    if let Some(h) = crate::store::current_holder(path) {
        anyhow::bail!("{}: held by pid {} on {} (stop it first)", path.display(), h.pid, h.host);
    }
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    if std::fs::metadata(PathBuf::from(wal)).map_or(true, |m| m.len() == 0) {
        return std::fs::read(path).with_context(|| path.display().to_string());
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let copy = dir.join(format!(".move-{}.adf", crate::store::create::nanoid(8)));
    let made = (|| -> rusqlite::Result<()> {
        let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        c.execute("VACUUM INTO ?1", [copy.to_string_lossy()])?;
        Ok(())
    })();
    let bytes = made.map_err(|e| anyhow!("{}: {e}", path.display())).and_then(|()| Ok(std::fs::read(&copy)?));
    let _ = std::fs::remove_file(&copy);
    bytes
}

/// The agent file's DID and handle, read only.
fn identity(path: &Path) -> anyhow::Result<(String, String)> {
    let store = super::output::open_for_read(path)?;
    let meta = |k: &str| store.meta_get(k).ok().flatten().map(|m| m.value).unwrap_or_default();
    let (did, handle) = (meta("adf_did"), meta("adf_handle"));
    super::output::close(store)?;
    Ok((did, handle))
}

/// The agent's inbox address on the remote: its mesh port, reached at the
/// remote's host name.
async fn new_address(dst: &Client, remote: &remotes::Remote, handle: &str) -> Option<String> {
    let mesh = dst.get(&["whoami"]).await.ok()?["mesh"].as_str()?.to_string();
    let port = url::Url::parse(&mesh).ok()?.port()?;
    let host = url::Url::parse(&remote.url).ok()?.host_str()?.to_string();
    Some(format!("http://{host}:{port}/agents/{handle}/inbox"))
}

pub fn run(out: &Out, url: Option<&str>, agent: &str, to: &str) -> anyhow::Result<u8> {
    let remote =
        remotes::pick(&[to.to_string()])?.into_iter().next().ok_or_else(|| anyhow!("no remote named {to:?}"))?;
    // Where the agent runs now: the daemon (or app) that holds its file,
    // else the fleet's daemon by name, else nowhere (a file at rest).
    let as_path = Path::new(agent);
    let (src, id): (Option<Client>, String) = if as_path.is_file() {
        match held::holder_api(as_path) {
            Some(via) => (Some(via.client), via.agent),
            None => (None, String::new()),
        }
    } else {
        (Some(Client::find(url)), agent.to_string())
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (path, id) = match &src {
        Some(c) => {
            let list = rt.block_on(c.get(&["agents"]))?;
            let a = list
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| a["id"] == id.as_str() || a["name"] == id.as_str() || a["handle"] == id.as_str())
                .ok_or_else(|| anyhow!("{agent}: no such agent on the daemon at {}", c.base))?;
            (
                PathBuf::from(a["filePath"].as_str().unwrap_or_default()),
                a["id"].as_str().unwrap_or_default().to_string(),
            )
        }
        None => (as_path.to_path_buf(), String::new()),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // The far side first: a remote that cannot be reached stops nothing.
    let conn = remote.connect()?;
    let dst = conn.client();
    rt.block_on(dst.get(&["whoami"])).map_err(|e| anyhow!("{agent} was not moved: remote {}: {e}", remote.name))?;
    if let Some(c) = &src {
        stop(&rt, c, &id, &path)?;
    }
    let restart = |why: anyhow::Error| -> anyhow::Error {
        if let Some(c) = &src {
            let back = rt.block_on(c.post(&["agents", "load"], &json!({"filePath": path})));
            return match back {
                Ok(_) => anyhow!("{agent} was not moved: {why}; it runs here again"),
                Err(e) => anyhow!(
                    "{agent} was not moved: {why}; starting it here again failed too ({e}): `adf start {agent}`"
                ),
            };
        }
        anyhow!("{agent} was not moved: {why}; the file here is untouched")
    };
    let (did, handle) = match identity(&path) {
        Ok(x) => x,
        Err(e) => return Err(restart(e)),
    };
    let bytes = match snapshot(&path) {
        Ok(b) => b,
        Err(e) => return Err(restart(e)),
    };
    let sent = rt.block_on(async {
        let u = dst.url(&["agents", "import"], &[("name", &name)])?;
        let r = dst
            .request(Method::POST, u)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(bytes)
            .send()
            .await
            .map_err(|e| anyhow!("{} did not take it ({})", remote.name, crate::client::root_cause(&e)))?;
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            anyhow::bail!("{} refused it: {}", remote.name, v["error"].as_str().unwrap_or(status.as_str()));
        }
        Ok::<_, anyhow::Error>(v)
    });
    let placed = match sent {
        Ok(v) => v,
        Err(e) => return Err(restart(e)),
    };
    // It runs there: the old address relays, the file here steps aside.
    let address = rt.block_on(new_address(&dst, &remote, &handle));
    let kept = match (&src, &address) {
        (Some(c), Some(to)) => {
            let body = json!({"handle": handle, "did": did, "to": to, "filePath": path});
            match rt.block_on(c.post(&["agents", "forwards"], &body)) {
                Ok(v) => v["keptAs"].as_str().map(PathBuf::from),
                Err(e) => {
                    // It runs there: the file here must not start again
                    // (one agent, one DID, one place), relay or not.
                    let kept = crate::daemon::moves::keep_aside(&path).map_err(|k| anyhow!("{}", k.error));
                    anyhow::bail!(
                        "{agent} now runs on {}, but the daemon here keeps no forward for it ({e}); {}",
                        remote.name,
                        match kept {
                            Ok(k) => format!("the file here is kept as {}", k.display()),
                            Err(k) => format!("set the file here aside by hand: {k}"),
                        }
                    );
                }
            }
        }
        _ => Some(crate::daemon::moves::keep_aside(&path).map_err(|e| anyhow!("{}", e.error))?),
    };
    let report = json!({"moved": agent, "to": remote.name, "id": placed["id"], "did": did,
        "filePath": placed["filePath"], "relayFrom": src.as_ref().and(address.as_ref()), "keptAs": kept});
    if out.json {
        out.json(&report)?;
    } else {
        out.line(format!(
            "{agent} moved to {} as {} ({did})",
            remote.name,
            placed["filePath"].as_str().unwrap_or("?")
        ))?;
        match (&src, &address) {
            (Some(_), Some(a)) => out.line(format!("its old inbox address relays to {a}"))?,
            (Some(_), None) => out.line("no relay: the remote's mesh server is off")?,
            (None, _) => out.line("no relay: no daemon ran it here")?,
        }
        if let Some(k) = &kept {
            out.line(format!("the file here is kept as {}", k.display()))?;
        }
    }
    Ok(0)
}

/// Stop the agent where it runs: its file is then at rest.
fn stop(rt: &tokio::runtime::Runtime, c: &Client, id: &str, path: &Path) -> anyhow::Result<()> {
    rt.block_on(c.post(&["agents", id, "stop"], &json!({})))?;
    // The holder lets go of the file as the agent stops.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while crate::store::current_holder(path).is_some() {
        if std::time::Instant::now() > deadline {
            anyhow::bail!("{}: still held 10 s after the agent stopped", path.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}
