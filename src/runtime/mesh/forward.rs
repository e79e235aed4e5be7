//! Agents that moved to another host (`adf move`, issue 23): the mesh keeps
//! their old inbox address working. A message posted here for a handle or
//! DID that moved away is relayed, as it came, to the agent's new inbox,
//! and its answer (status and body) handed back, so a peer that still
//! holds the old address reaches the agent and sees what the new host
//! decided. The list is kept in the fleet's `.moved.json` by the daemon
//! (`daemon/moves.rs`).

use std::path::{Path, PathBuf};

use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// One agent that moved away: messages to its handle or DID go on to `to`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Forward {
    pub handle: String,
    pub did: String,
    /// The inbox address on its new host.
    pub to: String,
    #[serde(rename = "movedAt")]
    pub moved_at: String,
}

pub fn forwards_path(fleet_dir: &Path) -> PathBuf {
    fleet_dir.join(".moved.json")
}

/// The forwards kept for a fleet (none when the file is absent; one that
/// cannot be read is said once and relays nothing).
pub fn load_forwards(fleet_dir: &Path) -> Vec<Forward> {
    let path = forwards_path(fleet_dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
            eprintln!("adf daemon: {}: not a list of forwards ({e}); no moved agent is relayed", path.display());
            Vec::new()
        }),
        Err(_) => Vec::new(),
    }
}

/// Relay a message to where its agent went, and answer as that host did.
pub async fn relay(http: &reqwest::Client, to: &str, body: axum::body::Bytes) -> Response {
    let sent = http
        .post(to)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .timeout(std::time::Duration::from_secs(30))
        .body(body)
        .send()
        .await;
    match sent {
        Ok(r) => {
            let status =
                axum::http::StatusCode::from_u16(r.status().as_u16()).unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
            let text = r.bytes().await.unwrap_or_default();
            (status, [(axum::http::header::CONTENT_TYPE, "application/json")], text).into_response()
        }
        Err(e) => (
            axum::http::StatusCode::BAD_GATEWAY,
            axum::Json(serde_json::json!({
                "error": format!("this agent moved to {to}, which did not answer ({})", crate::client::root_cause(&e))
            })),
        )
            .into_response(),
    }
}
