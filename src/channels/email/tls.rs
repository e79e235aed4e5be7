//! TLS for the email servers: the platform's verifier (as reqwest and
//! lettre use here), plus the roots an account adds (`config.ca_pem`, for
//! a self-hosted server with its own CA). There is no switch to skip
//! verification.

use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// The certificates of a PEM bundle (at least one).
pub fn roots(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not a PEM certificate bundle ({e:?})"))?;
    if certs.is_empty() {
        return Err("no certificate in it (-----BEGIN CERTIFICATE-----)".into());
    }
    Ok(certs)
}

/// A client config that trusts the platform's roots and `extra`.
pub fn client_config(extra: Vec<CertificateDer<'static>>) -> Result<Arc<ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls_platform_verifier::Verifier::new_with_extra_roots(extra, provider.clone())
        .map_err(|e| format!("certificate roots: {e}"))?;
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// TLS over a connected socket, checking the certificate names `host`.
pub async fn wrap(config: &Arc<ClientConfig>, host: &str, tcp: TcpStream) -> Result<TlsStream<TcpStream>, String> {
    let name = ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: {e}"))?;
    TlsConnector::from(config.clone()).connect(name, tcp).await.map_err(|e| format!("TLS with {host}: {e}"))
}
