//! OAuth for HTTP MCP servers that require it, through the SDK's OAuth
//! client (`rmcp`'s auth: metadata discovery from the server's 401
//! challenge, dynamic client registration, PKCE). The sign-in listens on a
//! loopback port for the browser's redirect and prints the URL to open, so
//! a user on SSH opens it on their own machine and, when the redirect cannot
//! reach this one, pastes the address it landed on. The tokens are sealed
//! in the agent's credentials as `mcp:<server>:oauth`, pinned to the
//! server's URL (a config pointing the server elsewhere never gets them),
//! and tokens the SDK refreshes are sealed again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rmcp::transport::auth::{
    AuthClient, AuthError, AuthorizationManager, AuthorizationRequest, CredentialStore, OAuthState, StoredCredentials,
};
use serde_json::{Value, json};
use std::sync::RwLock;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// The key of a server's sealed tokens (`mcp:<server>:oauth`).
pub const KEY: &str = "oauth";

/// How long a sign-in waits for the browser.
const SIGN_IN_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// The sealed form: the tokens and the URL they belong to.
pub fn seal_text(url: &str, creds: &StoredCredentials) -> String {
    json!({"url": url, "credentials": creds}).to_string()
}

/// The tokens of a sealed text, if they belong to `url`.
pub fn unseal(text: &str, url: &str) -> Option<StoredCredentials> {
    let v: Value = serde_json::from_str(text).ok()?;
    if v["url"].as_str()? != url {
        return None;
    }
    serde_json::from_value(v["credentials"].clone()).ok()
}

/// A credential store the SDK reads and refreshes; `changed` says a
/// refresh happened (the caller seals the new tokens).
#[derive(Clone, Default)]
pub struct Tokens {
    creds: Arc<RwLock<Option<StoredCredentials>>>,
    changed: Arc<AtomicBool>,
}

impl Tokens {
    pub fn new(creds: StoredCredentials) -> Tokens {
        Tokens { creds: Arc::new(RwLock::new(Some(creds))), changed: Arc::default() }
    }

    /// The tokens, when the SDK replaced them since the last call.
    pub fn refreshed(&self) -> Option<StoredCredentials> {
        if self.changed.swap(false, Ordering::Relaxed) { self.creds.read().ok()?.clone() } else { None }
    }
}

#[async_trait::async_trait]
impl CredentialStore for Tokens {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        Ok(self.creds.read().map(|c| c.clone()).unwrap_or_default())
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        if let Ok(mut c) = self.creds.write() {
            *c = Some(credentials);
        }
        self.changed.store(true, Ordering::Relaxed);
        Ok(())
    }

    async fn clear(&self) -> Result<(), AuthError> {
        if let Ok(mut c) = self.creds.write() {
            *c = None;
        }
        self.changed.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// An HTTP client for the MCP endpoint that sends the access token and
/// refreshes it when it runs out.
pub async fn authorized(
    url: &str,
    http: reqwest::Client,
    tokens: Tokens,
) -> Result<AuthClient<reqwest::Client>, String> {
    let mut manager = AuthorizationManager::new(url).await.map_err(|e| format!("OAuth: {e}"))?;
    manager.with_client(http.clone()).map_err(|e| format!("OAuth: {e}"))?;
    manager.set_credential_store(tokens);
    if !manager.initialize_from_store().await.map_err(|e| format!("OAuth: {e}"))? {
        return Err("OAuth: no tokens are stored for this server; sign in again (adf mcp login)".into());
    }
    Ok(AuthClient::new(http, manager))
}

/// The server's `WWW-Authenticate` challenge, asked with an unauthorized
/// `initialize` (it names the metadata and the scope to request).
async fn challenge(url: &str, http: &reqwest::Client) -> Option<String> {
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "adf", "version": env!("CARGO_PKG_VERSION")}}});
    let r = http.post(url).header("accept", "application/json, text/event-stream").json(&body).send().await.ok()?;
    if r.status() != reqwest::StatusCode::UNAUTHORIZED {
        return None;
    }
    r.headers().get(reqwest::header::WWW_AUTHENTICATE)?.to_str().ok().map(str::to_string)
}

/// How the authorization URL reaches a person.
pub enum Approver<'a> {
    /// Print it and wait for the browser's redirect on the loopback port,
    /// or for the address it landed on pasted on stdin.
    Person(&'a mut dyn FnMut(&str)),
    /// Follow it without a browser (an authorization server that approves
    /// at once, as the MCP conformance suite's does).
    Headless,
}

/// Sign in to `url`: the tokens to seal.
pub async fn sign_in(url: &str, approver: Approver<'_>) -> Result<StoredCredentials, String> {
    let http = crate::providers::client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("OAuth: {e}"))?;
    let listener =
        tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.map_err(|e| format!("OAuth: loopback port: {e}"))?;
    let redirect = format!("http://127.0.0.1:{}/callback", listener.local_addr().map_err(|e| e.to_string())?.port());
    let mut state = OAuthState::new(url, None).await.map_err(|e| format!("OAuth: {e}"))?;
    let mut request = AuthorizationRequest::new(&redirect).with_client_name("adf").with_initial_scope_selection();
    if let Some(c) = challenge(url, &http).await {
        request = request.with_challenge(c);
    }
    state.start_authorization(request).await.map_err(|e| format!("OAuth: {e}"))?;
    let auth_url = state.get_authorization_url().await.map_err(|e| format!("OAuth: {e}"))?;
    let landed = match approver {
        Approver::Headless => {
            let r = http.get(&auth_url).send().await.map_err(|e| format!("OAuth: authorization: {e}"))?;
            r.headers()
                .get(reqwest::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .map(str::to_string)
                .ok_or_else(|| format!("OAuth: the authorization server answered {} without a redirect", r.status()))?
        }
        Approver::Person(tell) => {
            tell(&auth_url);
            tokio::time::timeout(SIGN_IN_WAIT, wait_for_redirect(&listener, &redirect))
                .await
                .map_err(|_| format!("OAuth: no sign-in within {} s", SIGN_IN_WAIT.as_secs()))??
        }
    };
    state.handle_callback_url(&landed).await.map_err(|e| format!("OAuth: {e}"))?;
    let (client_id, token) = state.get_credentials().await.map_err(|e| format!("OAuth: {e}"))?;
    let token = token.ok_or("OAuth: the server gave no token")?;
    let scopes: Vec<String> = serde_json::to_value(&token)
        .ok()
        .and_then(|v| v["scope"].as_str().map(|s| s.split_whitespace().map(str::to_string).collect()))
        .unwrap_or_default();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).ok();
    Ok(StoredCredentials::new(client_id, Some(token), scopes, now))
}

/// The address the browser was sent back to: from the loopback listener,
/// or pasted on stdin (a browser on another machine).
async fn wait_for_redirect(listener: &tokio::net::TcpListener, redirect: &str) -> Result<String, String> {
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    // No stdin (closed, not a terminal): only the browser can answer.
    let mut stdin_open = true;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((mut sock, _)) = accepted else { continue };
                let mut buf = vec![0u8; 8192];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let path = head.lines().next().and_then(|l| l.split_whitespace().nth(1)).unwrap_or("").to_string();
                if !path.starts_with("/callback") {
                    let _ = sock.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n").await;
                    continue;
                }
                let page = "<!doctype html><title>adf</title><p>Signed in. You can close this tab.</p>";
                let _ = sock
                    .write_all(format!("HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\r\n{page}", page.len()).as_bytes())
                    .await;
                let base = redirect.trim_end_matches("/callback");
                return Ok(format!("{base}{path}"));
            }
            line = stdin.next_line(), if stdin_open => {
                match line {
                    Ok(Some(l)) if l.contains("code=") => return Ok(l.trim().to_string()),
                    Ok(Some(_)) => continue,
                    _ => stdin_open = false,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The browser's redirect reaches the loopback listener: other paths
    /// are refused, the callback's address comes back whole and the
    /// browser is told it may close the tab.
    #[tokio::test]
    async fn the_loopback_callback_takes_the_browser_redirect() {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let redirect = format!("http://127.0.0.1:{port}/callback");
        let browser = tokio::spawn(async move {
            let get = |path: &'static str| async move {
                let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                s.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await.unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).await.unwrap();
                out
            };
            let stray = get("/favicon.ico").await;
            let page = get("/callback?code=abc&state=xyz&iss=https%3A%2F%2Fauth.example").await;
            (stray, page)
        });
        let landed = tokio::time::timeout(std::time::Duration::from_secs(10), wait_for_redirect(&listener, &redirect))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(landed, format!("{redirect}?code=abc&state=xyz&iss=https%3A%2F%2Fauth.example"));
        let (stray, page) = browser.await.unwrap();
        assert!(stray.starts_with("HTTP/1.1 404"), "{stray}");
        assert!(page.starts_with("HTTP/1.1 200") && page.contains("Signed in"), "{page}");
    }

    #[test]
    fn tokens_are_pinned_to_their_url() {
        let c = StoredCredentials::new("client-1".into(), None, vec!["read".into()], Some(1));
        let text = seal_text("https://mcp.example.com/mcp", &c);
        assert_eq!(unseal(&text, "https://mcp.example.com/mcp").map(|c| c.client_id), Some("client-1".into()));
        assert!(unseal(&text, "https://evil.example.com/mcp").is_none(), "another URL never gets them");
        assert!(unseal("not json", "https://mcp.example.com/mcp").is_none());
    }
}
