//! TLS for the client listener: a rustls server config from PEM files, ALPN `h2` and
//! `http/1.1`, and optional client-certificate verification.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::config::ServerTls;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("server.tls.{key} {path}: {reason}")]
    File {
        key: &'static str,
        path: String,
        reason: String,
    },
    #[error("server.tls: {0}")]
    Config(String),
}

fn file_err(key: &'static str, path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        key,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn certs(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(key, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(key, path, e))?;
    if certs.is_empty() {
        return Err(file_err(key, path, "no PEM certificate found"));
    }
    Ok(certs)
}

/// Builds the acceptor's config. Called at start-up and on every reload, so a rotated
/// certificate is picked up without a restart.
pub fn server_config(tls: &ServerTls) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = certs("cert", &tls.cert)?;
    let key = PrivateKeyDer::from_pem_file(&tls.key).map_err(|e| match e {
        // Also what an encrypted key, or a certificate given as the key, reads as.
        rustls::pki_types::pem::Error::NoItemsFound => file_err(
            "key",
            &tls.key,
            "no unencrypted private key found (PEM \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \
             \"EC PRIVATE KEY\"); an encrypted key must be decrypted first",
        ),
        e => file_err("key", &tls.key, e),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &tls.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certs("client_ca", ca)? {
                roots.add(cert).map_err(|e| file_err("client_ca", ca, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| file_err("client_ca", ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("cert and key do not fit together: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Why a client's TLS handshake failed, as `hourglass_tls_handshake_failures_total` counts
/// it (`timeout` is counted where the handshake is timed).
pub fn handshake_failure(e: &std::io::Error) -> &'static str {
    use std::io::ErrorKind;
    let Some(tls) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return match e.kind() {
            ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
                "closed"
            }
            _ => "other",
        };
    };
    match tls {
        rustls::Error::NoCertificatesPresented | rustls::Error::InvalidCertificate(_) => {
            "client_certificate"
        }
        rustls::Error::AlertReceived(_) => "alert",
        rustls::Error::PeerIncompatible(_) | rustls::Error::NoApplicationProtocol => "incompatible",
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            "malformed"
        }
        _ => "other",
    }
}
