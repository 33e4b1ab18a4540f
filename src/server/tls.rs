//! TLS for the client listener: a rustls server config from PEM files, ALPN `h2` and
//! `http/1.1`, and optional client-certificate verification.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::pki_types::CertificateDer;
use rustls::server::WebPkiClientVerifier;

use crate::config::ServerTls;
use crate::server::x509::not_after;

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

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| file_err(key, path, format!("failed to read file: {e}")))
}

fn certs(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    crate::pem::certs(&read(key, path)?).map_err(|e| file_err(key, path, e))
}

/// The acceptor's config, and when its certificate expires.
pub struct ListenerTls {
    pub config: Arc<rustls::ServerConfig>,
    /// The leaf certificate's notAfter (`None` if it cannot be read from the DER, which
    /// rustls accepted all the same).
    pub expires: Option<SystemTime>,
}

/// Under this much validity left, start-up, reloads and `check` warn: a certificate renewed
/// on time (Let's Encrypt renews with 30 days left) never gets this close.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

impl ListenerTls {
    /// A warning when the certificate has expired, or expires within `EXPIRY_WARNING`.
    pub fn expiry_warning(&self, tls: &ServerTls, now: SystemTime) -> Option<String> {
        let expires = self.expires?;
        let at = humantime::format_rfc3339_seconds(expires);
        let path = tls.cert.display();
        match expires.duration_since(now) {
            Err(_) => Some(format!(
                "server.tls.cert {path} expired at {at}: clients will refuse it"
            )),
            Ok(left) if left < EXPIRY_WARNING => Some(format!(
                "server.tls.cert {path} expires at {at}, in {} days",
                left.as_secs() / 86_400
            )),
            Ok(_) => None,
        }
    }
}

/// Builds the acceptor's config. Called at start-up and on every reload, so a rotated
/// certificate is picked up without a restart.
pub fn server_config(tls: &ServerTls) -> Result<ListenerTls, TlsError> {
    let chain = certs("cert", &tls.cert)?;
    let expires = not_after(&chain[0]);
    let key = crate::pem::private_key(&read("key", &tls.key)?)
        .map_err(|e| file_err("key", &tls.key, e))?;
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
    Ok(ListenerTls {
        config: Arc::new(config),
        expires,
    })
}

/// The listener's acceptor, at start-up or on a reload, and when its certificate expires
/// (for the gauge, set once it serves); warns of a certificate that has expired or soon will.
pub fn acceptor(
    tls: &ServerTls,
) -> Result<(Arc<tokio_rustls::TlsAcceptor>, Option<SystemTime>), TlsError> {
    let listener = server_config(tls)?;
    if let Some(w) = listener.expiry_warning(tls, SystemTime::now()) {
        tracing::warn!("{w}");
    }
    let acceptor = Arc::new(tokio_rustls::TlsAcceptor::from(listener.config));
    Ok((acceptor, listener.expires))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expired_or_expiring_certificate_is_warned_of() {
        let tls = ServerTls {
            cert: "/etc/hourglass/tls.pem".into(),
            key: "/etc/hourglass/tls.key".into(),
            client_ca: None,
        };
        let at = |secs: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        let listener = |expires| ListenerTls {
            config: Arc::new(
                rustls::ServerConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_cert_resolver(Arc::new(rustls::server::ResolvesServerCertUsingSni::new())),
            ),
            expires,
        };
        let expires = at(1_804_118_400); // 2027-03-04T00:00:00Z
        let day = 86_400;
        assert_eq!(
            listener(Some(expires)).expiry_warning(&tls, at(1_804_118_400 + 1)),
            Some(
                "server.tls.cert /etc/hourglass/tls.pem expired at 2027-03-04T00:00:00Z: \
                 clients will refuse it"
                    .to_owned()
            )
        );
        assert_eq!(
            listener(Some(expires)).expiry_warning(&tls, at(1_804_118_400 - 3 * day - 5)),
            Some(
                "server.tls.cert /etc/hourglass/tls.pem expires at 2027-03-04T00:00:00Z, in 3 days"
                    .to_owned()
            )
        );
        assert_eq!(
            listener(Some(expires)).expiry_warning(&tls, at(1_804_118_400 - 15 * day)),
            None
        );
        assert_eq!(listener(None).expiry_warning(&tls, at(0)), None);
    }
}
