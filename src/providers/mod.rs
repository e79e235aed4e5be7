//! Model providers behind one trait: a request in, a stream of model events
//! out (text and reasoning deltas, tool calls, usage, the stop reason).
//! Anthropic Messages and OpenAI chat completions (and every endpoint that
//! speaks either) stream over SSE; `scripted` is an in-process provider for
//! tests and benchmarks.

pub mod accounts;
pub mod anthropic;
pub mod openai;
pub mod prices;
pub mod scripted;
mod sse;
pub mod windows;

use std::time::Duration;

use futures_util::stream::BoxStream;
use serde::Serialize;
use serde_json::Value;

/// One message of the conversation, content as stored in loop rows
/// (provider-style blocks: text, tool_use, tool_result, thinking…).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
}

/// Whether a content block is a media block the runtime attached in
/// memory (`image_url`, `input_audio`, `video_url`, data URIs): each
/// provider turns them into its own parts.
pub fn is_media(b: &Value) -> bool {
    matches!(b["type"].as_str(), Some("image_url" | "input_audio" | "video_url"))
}

/// A tool as advertised to the model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// Shared: a built-in tool's schema is built once per process and
    /// every agent's tool list points at it.
    pub input_schema: std::sync::Arc<Value>,
}

impl ToolSpec {
    /// Bytes of the name, description and schema as JSON (a budget's or
    /// the context gauge's estimate), counted without building the text.
    pub fn chars(&self) -> usize {
        struct Count(usize);
        impl std::io::Write for Count {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0 += b.len();
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut n = Count(0);
        let _ = serde_json::to_writer(&mut n, &*self.input_schema);
        self.name.len() + self.description.len() + n.0
    }
}

/// One reasoning-effort setting, mapped per provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effort {
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
}

impl Effort {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "minimal" => Effort::Minimal,
            "low" => Effort::Low,
            "medium" => Effort::Medium,
            "high" => Effort::High,
            "xhigh" => Effort::Xhigh,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelRequest {
    pub model: String,
    /// Shared with the executor's prompt cache: built once per config
    /// revision and session, never copied per call.
    pub system: std::sync::Arc<str>,
    /// Shared with the executor's transcript, so a call does not copy the
    /// whole history.
    pub messages: std::sync::Arc<Vec<Message>>,
    /// The advertised tools, built once per config revision and shared.
    pub tools: std::sync::Arc<Vec<ToolSpec>>,
    pub max_tokens: u64,
    pub temperature: Option<f64>,
    pub effort: Option<Effort>,
    /// An explicit thinking budget (Anthropic), from `model.reasoning.max_tokens`.
    pub reasoning_tokens: Option<u64>,
    /// Dynamic instructions for this call only (never stored as a message):
    /// sent as a final user message, or added to the last one when that is
    /// already a user message.
    pub trailing: Option<String>,
}

impl ModelRequest {
    /// The messages as JSON with the trailing instructions in place.
    pub fn messages_json(&self) -> Value {
        let mut msgs = serde_json::to_value(&*self.messages).unwrap_or_else(|_| Value::Array(Vec::new()));
        if let (Some(t), Value::Array(list)) = (&self.trailing, &mut msgs) {
            let block = serde_json::json!({"type": "text", "text": t});
            match list.last_mut() {
                Some(last) if last["role"] == "user" => {
                    if let Some(c) = last.get_mut("content").and_then(Value::as_array_mut) {
                        c.push(block);
                    }
                }
                _ => list.push(serde_json::json!({"role": "user", "content": [block]})),
            }
        }
        msgs
    }
}

/// Token usage of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<u64>,
    /// What the provider says the call cost in US dollars (OpenRouter's
    /// `usage.cost`): it wins over the owner's price list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

impl Usage {
    /// Every token the call was billed for: input, output, cache reads and
    /// writes (what token budgets count).
    pub fn total(&self) -> u64 {
        self.input + self.output + self.cache_read.unwrap_or(0) + self.cache_write.unwrap_or(0)
    }

    /// Merge a later report into this one (providers report input and
    /// output at different points of the stream).
    pub fn merge(&mut self, other: Usage) {
        self.input = self.input.max(other.input);
        self.output = self.output.max(other.output);
        self.cache_read = other.cache_read.or(self.cache_read);
        self.cache_write = other.cache_write.or(self.cache_write);
        self.reasoning = other.reasoning.or(self.reasoning);
        self.cost = other.cost.or(self.cost);
    }
}

/// What a provider stream yields.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelEvent {
    TextDelta(String),
    ReasoningDelta(String),
    /// The opaque signature of a reasoning block (Anthropic).
    ReasoningSignature(String),
    ToolCall {
        id: String,
        name: String,
        input: Value,
    },
    Usage(Usage),
    /// The end of a complete response, with the provider's stop reason.
    Stop(String),
}

/// How a provider failure should be handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Credentials or billing: the agent goes to `error`.
    Auth,
    /// Rate limits, overload, 5xx, timeouts, cut streams: retry later.
    Transient,
    /// Anything else the provider refused (bad model, bad request).
    Structural,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{provider}: {message}")]
pub struct ProviderError {
    pub provider: String,
    pub kind: ErrorKind,
    pub status: Option<u16>,
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl ProviderError {
    pub fn new(provider: &str, kind: ErrorKind, status: Option<u16>, message: impl Into<String>) -> Self {
        ProviderError { provider: provider.to_string(), kind, status, message: message.into(), retry_after: None }
    }

    /// Classify an HTTP error response (spec runtime.md §1.4).
    pub fn from_status(provider: &str, status: u16, body: &str, retry_after: Option<Duration>) -> Self {
        let lower = body.to_ascii_lowercase();
        let auth_words = ["insufficient_quota", "invalid_api_key", "authentication_error", "billing_not_active"];
        // A server without the model's media support (llama.cpp answers
        // 500) will refuse the same request forever: not worth a retry.
        let no_media = ["image input is not supported", "mmproj", "does not support image"];
        let kind = if (401..=403).contains(&status) || auth_words.iter().any(|w| lower.contains(w)) {
            ErrorKind::Auth
        } else if no_media.iter().any(|w| lower.contains(w)) {
            ErrorKind::Structural
        } else if matches!(status, 408 | 429) || status >= 500 {
            ErrorKind::Transient
        } else {
            ErrorKind::Structural
        };
        let message = error_message(body).unwrap_or_else(|| body.chars().take(300).collect());
        ProviderError {
            provider: provider.to_string(),
            kind,
            status: Some(status),
            message: format!("HTTP {status}: {message}"),
            retry_after,
        }
    }

    /// A transport failure (connect, timeout, reset): transient.
    pub fn transport(provider: &str, e: &reqwest::Error) -> Self {
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(s) = src {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            src = s.source();
        }
        ProviderError::new(provider, ErrorKind::Transient, None, msg)
    }
}

/// The human message inside a provider's JSON error body.
fn error_message(body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    let e = v.get("error")?;
    e.get("message").and_then(Value::as_str).map(str::to_string).or_else(|| e.as_str().map(str::to_string))
}

/// `Retry-After`: seconds, or an HTTP date.
pub fn parse_retry_after(v: &str) -> Option<Duration> {
    if let Ok(secs) = v.trim().parse::<f64>() {
        return (secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let when = chrono::DateTime::parse_from_rfc2822(v.trim()).ok()?;
    let ms = when.timestamp_millis() - chrono::Utc::now().timestamp_millis();
    Some(Duration::from_millis(ms.max(0) as u64))
}

pub type EventStream = BoxStream<'static, Result<ModelEvent, ProviderError>>;

/// A model provider.
pub trait Provider: Send + Sync {
    /// The provider id (`anthropic`, `openai`, an account id…).
    fn id(&self) -> &str;
    /// Start one streaming call.
    fn stream(&self, req: ModelRequest) -> futures_util::future::BoxFuture<'_, Result<EventStream, ProviderError>>;
}

/// A whole response, assembled from a stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Response {
    /// Assistant content blocks in loop-row shape.
    pub content: Vec<Value>,
    pub usage: Usage,
    pub stop_reason: String,
}

impl Response {
    pub fn tool_calls(&self) -> impl Iterator<Item = &Value> {
        self.content.iter().filter(|b| b["type"] == "tool_use")
    }

    pub fn text(&self) -> String {
        self.content.iter().filter(|b| b["type"] == "text").filter_map(|b| b["text"].as_str()).collect()
    }
}

/// Collects model events into a `Response`. Only a stream that ended with
/// `Stop` yields one: a cut or malformed stream never becomes a turn.
#[derive(Debug, Default)]
pub struct Assembler {
    text: String,
    reasoning: String,
    signature: Option<String>,
    blocks: Vec<Value>,
    usage: Usage,
    stop: Option<String>,
}

impl Assembler {
    pub fn push(&mut self, e: ModelEvent) {
        match e {
            ModelEvent::TextDelta(t) => {
                self.flush_reasoning();
                self.text.push_str(&t);
            }
            ModelEvent::ReasoningDelta(t) => self.reasoning.push_str(&t),
            ModelEvent::ReasoningSignature(s) => self.signature = Some(s),
            ModelEvent::ToolCall { id, name, input } => {
                self.flush_reasoning();
                self.flush_text();
                self.blocks.push(serde_json::json!({"type": "tool_use", "id": id, "name": name, "input": input}));
            }
            ModelEvent::Usage(u) => self.usage.merge(u),
            ModelEvent::Stop(r) => self.stop = Some(r),
        }
    }

    fn flush_text(&mut self) {
        if !self.text.is_empty() {
            self.blocks.push(serde_json::json!({"type": "text", "text": std::mem::take(&mut self.text)}));
        }
    }

    fn flush_reasoning(&mut self) {
        if !self.reasoning.is_empty() || self.signature.is_some() {
            let mut b = serde_json::json!({"type": "thinking", "thinking": std::mem::take(&mut self.reasoning)});
            if let Some(s) = self.signature.take() {
                b["signature"] = Value::String(s);
            }
            self.blocks.push(b);
        }
    }

    /// The response, if the stream completed.
    pub fn finish(mut self) -> Option<Response> {
        let stop = self.stop.take()?;
        self.flush_reasoning();
        self.flush_text();
        Some(Response { content: self.blocks, usage: self.usage, stop_reason: stop })
    }
}

/// Run a stream to completion, calling `on_event` for each event (for live
/// deltas), and return the whole response.
pub async fn collect(
    mut stream: EventStream,
    provider: &str,
    mut on_event: impl FnMut(&ModelEvent),
) -> Result<Response, ProviderError> {
    use futures_util::StreamExt;
    let mut asm = Assembler::default();
    while let Some(e) = stream.next().await {
        let e = e?;
        on_event(&e);
        asm.push(e);
    }
    asm.finish().ok_or_else(|| {
        ProviderError::new(provider, ErrorKind::Transient, None, "the response stream ended before the model finished")
    })
}

/// The HTTP client of a provider, channel or daemon client: rustls with the
/// ring provider and the platform's roots ([`client_builder`]).
pub fn http_client() -> reqwest::Client {
    client_builder()
        .connect_timeout(Duration::from_secs(15))
        .read_timeout(Duration::from_secs(300))
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

/// A reqwest builder on the process's one TLS configuration. reqwest reads
/// the platform's CA roots afresh for every client it builds (some 150
/// certificates parsed from PEM: 3 ms, most of loading an agent); they are
/// read once here and shared, so an agent's provider, a fetch's client and
/// an MCP connection cost what their own state costs. A machine without a
/// readable root store gets reqwest's own attempt, and its error.
pub fn client_builder() -> reqwest::ClientBuilder {
    let b = reqwest::Client::builder();
    match tls_config() {
        Some(c) => b.tls_backend_preconfigured(c),
        None => b,
    }
}

/// The process's rustls client configuration, as reqwest makes its own:
/// every protocol version, the platform verifier, SNI, and ALPN offering
/// HTTP/2 then HTTP/1.1.
fn tls_config() -> Option<rustls::ClientConfig> {
    static CONFIG: std::sync::OnceLock<Option<rustls::ClientConfig>> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            install_crypto();
            let provider = rustls::crypto::CryptoProvider::get_default()?.clone();
            let verifier = rustls_platform_verifier::Verifier::new(provider.clone()).ok()?;
            let mut c = rustls::ClientConfig::builder_with_provider(provider)
                .with_protocol_versions(rustls::ALL_VERSIONS)
                .ok()?
                .dangerous()
                .with_custom_certificate_verifier(std::sync::Arc::new(verifier))
                .with_no_client_auth();
            c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            Some(c)
        })
        .clone()
}

/// Install the TLS crypto provider (ring) once per process, before any
/// client is built.
pub fn install_crypto() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The provider of an agent whose account is not set up: every call fails
/// with a structural error that says how to connect one, so the agent still
/// loads and its files, tables and events can be browsed.
pub struct Unconfigured {
    pub why: String,
}

impl Provider for Unconfigured {
    fn id(&self) -> &str {
        "unconfigured"
    }

    fn stream(&self, _req: ModelRequest) -> futures_util::future::BoxFuture<'_, Result<EventStream, ProviderError>> {
        let message = self.why.clone();
        Box::pin(async move {
            Err(ProviderError {
                provider: "unconfigured".into(),
                kind: ErrorKind::Structural,
                status: None,
                message,
                retry_after: None,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_schema_is_built_once_and_counted_as_sent() {
        // Every built-in tool: one shared schema per process, with the
        // runtime's `_reason` (and `_async` where calls may run in the
        // background), and a count equal to the text's length.
        for d in crate::tools::catalog().iter() {
            let a = crate::tools::advertised_schema(d.name).unwrap();
            let b = crate::tools::advertised_schema(d.name).unwrap();
            assert!(std::sync::Arc::ptr_eq(&a, &b), "{} built twice", d.name);
            assert!(a["properties"]["_reason"].is_object(), "{}", d.name);
            assert_eq!(
                a["properties"]["_async"].is_object(),
                (["adf_shell", "sys_code", "sys_lambda", "sys_fetch"].contains(&d.name) || d.name.starts_with("mcp_")),
                "{}",
                d.name
            );
            let t = ToolSpec { name: d.name.into(), description: d.description.into(), input_schema: a.clone() };
            assert_eq!(t.chars(), d.name.len() + d.description.len() + a.to_string().len(), "{}", d.name);
        }
        assert!(crate::tools::advertised_schema("no_such_tool").is_none());
        let odd = ToolSpec {
            name: "é".into(),
            description: "ü".into(),
            input_schema: std::sync::Arc::new(serde_json::json!({"d": "ß\n\"x\""})),
        };
        assert_eq!(odd.chars(), "é".len() + "ü".len() + odd.input_schema.to_string().len());
    }

    #[test]
    fn classification() {
        assert_eq!(ProviderError::from_status("p", 401, "{}", None).kind, ErrorKind::Auth);
        assert_eq!(
            ProviderError::from_status("p", 429, r#"{"error":{"code":"insufficient_quota","message":"x"}}"#, None).kind,
            ErrorKind::Auth
        );
        assert_eq!(ProviderError::from_status("p", 429, "{}", None).kind, ErrorKind::Transient);
        assert_eq!(ProviderError::from_status("p", 529, "{}", None).kind, ErrorKind::Transient);
        let e = ProviderError::from_status(
            "p",
            404,
            r#"{"error":{"type":"not_found_error","message":"model: nope"}}"#,
            None,
        );
        assert_eq!(e.kind, ErrorKind::Structural);
        assert_eq!(e.message, "HTTP 404: model: nope");
    }

    #[test]
    fn trailing_instructions_join_the_last_user_message() {
        let mut req = ModelRequest {
            model: "m".into(),
            system: "".into(),
            messages: std::sync::Arc::new(vec![Message {
                role: Role::User,
                content: vec![serde_json::json!({"type": "text", "text": "hi"})],
            }]),
            tools: Default::default(),
            max_tokens: 1,
            temperature: None,
            effort: None,
            reasoning_tokens: None,
            trailing: Some("note".into()),
        };
        let m = req.messages_json();
        assert_eq!(m.as_array().unwrap().len(), 1);
        assert_eq!(m[0]["content"][1]["text"], "note");
        req.messages = std::sync::Arc::new(vec![Message {
            role: Role::Assistant,
            content: vec![serde_json::json!({"type": "text", "text": "yo"})],
        }]);
        assert_eq!(req.messages_json()[1]["role"], "user");
    }

    #[test]
    fn retry_after() {
        assert_eq!(parse_retry_after("3"), Some(Duration::from_secs(3)));
        assert!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT").is_some());
        assert_eq!(parse_retry_after("soon"), None);
    }

    #[test]
    fn assembler_orders_blocks_and_needs_a_stop() {
        let mut a = Assembler::default();
        a.push(ModelEvent::ReasoningDelta("hmm".into()));
        a.push(ModelEvent::TextDelta("Hel".into()));
        a.push(ModelEvent::TextDelta("lo".into()));
        a.push(ModelEvent::ToolCall {
            id: "t1".into(),
            name: "fs_read".into(),
            input: serde_json::json!({"path": "a"}),
        });
        a.push(ModelEvent::Usage(Usage { input: 10, ..Default::default() }));
        a.push(ModelEvent::Usage(Usage { output: 5, ..Default::default() }));
        let mut cut = Assembler::default();
        cut.push(ModelEvent::TextDelta("partial".into()));
        assert!(cut.finish().is_none());
        a.push(ModelEvent::Stop("tool_use".into()));
        let r = a.finish().unwrap();
        let types: Vec<_> = r.content.iter().map(|b| b["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["thinking", "text", "tool_use"]);
        assert_eq!(r.text(), "Hello");
        assert_eq!((r.usage.input, r.usage.output), (10, 5));
    }

    /// A self-signed certificate for `localhost` (no platform trusts it).
    const SELF_SIGNED: &str = "-----BEGIN CERTIFICATE-----
MIIBlDCCATugAwIBAgIUYNiSQrwhwUOgoOcDmSjgaEmqvMIwCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJbG9jYWxob3N0MCAXDTI2MTIwNjE3MTkxOVoYDzIxMjYxMTEy
MTcxOTE5WjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAASlmZwi3iFkZmAwTlZYXtPPAuWHUSnMk2/KjI1sXnfrGztgduJDArZI
hkug3GXzCmsb46JNHgA32a09O+BHrSD+o2kwZzAdBgNVHQ4EFgQUQTQ/4r4P7n+w
ZaK0e3ulnfXI2aMwHwYDVR0jBBgwFoAUQTQ/4r4P7n+wZaK0e3ulnfXI2aMwDwYD
VR0TAQH/BAUwAwEB/zAUBgNVHREEDTALgglsb2NhbGhvc3QwCgYIKoZIzj0EAwID
RwAwRAIgMs1nUu+TbQrnp0uwgamdoOe4bn3pQskS4MUB3Yk/qVwCIGRIES2UGXOD
QOParlZAk3UHeZ4decCBrAgj7HKoS7Ix
-----END CERTIFICATE-----
";
    const SELF_SIGNED_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgWm11F2XvWu/PLlLV
godB6wZz7po8fXLTyA0S7agu542hRANCAASlmZwi3iFkZmAwTlZYXtPPAuWHUSnM
k2/KjI1sXnfrGztgduJDArZIhkug3GXzCmsb46JNHgA32a09O+BHrSD+
-----END PRIVATE KEY-----
";

    #[tokio::test]
    async fn the_shared_tls_config_checks_certificates_and_offers_h2_then_http1() {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        // A TLS server on loopback with a certificate no platform trusts:
        // it notes what the client's hello offers, then tries to finish.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        install_crypto();
        let server = std::sync::Arc::new(
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_single_cert(
                    vec![CertificateDer::from_pem_slice(SELF_SIGNED.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(SELF_SIGNED_KEY.as_bytes()).unwrap(),
                )
                .unwrap(),
        );
        let hello = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let start = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp).await.unwrap();
            let h = start.client_hello();
            let sni = h.server_name().map(str::to_string);
            let alpn: Vec<Vec<u8>> = h.alpn().map(|a| a.map(<[u8]>::to_vec).collect()).unwrap_or_default();
            let finished = start.into_stream(server).await.is_ok();
            (sni, alpn, finished)
        });
        // Two clients on the one configuration: the second is built the same.
        let _first = http_client();
        let err = http_client().get(format!("https://localhost:{port}/")).send().await.unwrap_err();
        let mut chain = String::new();
        let mut e: Option<&dyn std::error::Error> = Some(&err);
        while let Some(x) = e {
            chain.push_str(&format!("{x} / "));
            e = x.source();
        }
        assert!(
            chain.contains("UnknownIssuer") || chain.contains("certificate"),
            "refused for its certificate: {chain}"
        );
        let (sni, alpn, finished) = hello.await.unwrap();
        assert_eq!(sni.as_deref(), Some("localhost"), "SNI sent");
        assert_eq!(alpn, [b"h2".to_vec(), b"http/1.1".to_vec()], "ALPN as reqwest offers it");
        assert!(!finished, "the client must not complete a handshake with an untrusted certificate");
    }
}
