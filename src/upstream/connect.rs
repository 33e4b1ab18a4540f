//! Connecting to an upstream: TLS (rustls with webpki roots plus an optional `ca_file`) and a
//! bound on the whole connect: TCP, TLS and, for HTTP/2, the server's first frame.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::{Http2Mode, UpstreamConfig};
use crate::error::BoxError;
use crate::upstream::error::UpstreamBuildError;
use crate::upstream::io::UpstreamIo;

/// What every upstream client connects through: TCP, then TLS where the URL asks, all of it
/// under one bound.
pub(crate) type Connector = TimeoutConnector<HttpsConnector<HttpConnector>>;

/// The connect step took longer than allowed. Mapped to `connect_timeout` by the proxy.
#[derive(Debug, thiserror::Error)]
#[error("connect (TCP and TLS) did not finish within {0:?}")]
pub struct ConnectTimedOut(pub Duration);

/// `http2 = "always"` over TLS, and the provider's ALPN did not choose `h2`.
#[derive(Debug, thiserror::Error)]
#[error(
    "the upstream did not agree to HTTP/2 by ALPN (it offers only HTTP/1.1, or no ALPN), \
     and the upstream's `http2 = \"always\"` asks for h2 alone"
)]
pub struct NoH2ByAlpn(
    /// The TLS error, when the server refused the handshake for it (its alert says so).
    #[source]
    Option<BoxError>,
);

/// The TLS files of an upstream as they were read: its `ca_file`, and its `client_cert` and
/// `client_cert_key`. A reload compares them with the files' contents then: a CA added or
/// revoked, or a client certificate renewed, in the same files needs a new config. The key
/// is kept as a digest only.
#[derive(PartialEq, Eq)]
pub(super) struct TlsFiles {
    ca: Option<Vec<u8>>,
    cert: Option<Vec<u8>>,
    key: Option<[u8; 32]>,
}

/// What the files hold now, with the read error of the first that cannot be read. Files
/// beside an http:// url are ignored (`check` says so), not read.
pub(super) fn tls_files(
    config: &UpstreamConfig,
) -> Result<(TlsFiles, Option<Vec<u8>>), UpstreamBuildError> {
    let https = config.url.scheme() == Some(&http::uri::Scheme::HTTPS);
    let read = |field: &'static str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| UpstreamBuildError::TlsFile {
            upstream: config.name.clone(),
            field,
            path: path.display().to_string(),
            reason: format!("failed to read file: {e}"),
        })
    };
    let ca = match config.ca_file.as_deref().filter(|_| https) {
        Some(p) => Some(read("ca_file", p)?),
        None => None,
    };
    let (cert, key) = match config.client_cert.as_ref().filter(|_| https) {
        Some(c) => (
            Some(read("client_cert", &c.cert)?),
            Some(read("client_cert_key", &c.key)?),
        ),
        None => (None, None),
    };
    let digest = key.as_deref().map(|k| {
        let mut d = [0u8; 32];
        d.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, k).as_ref());
        d
    });
    Ok((
        TlsFiles {
            ca,
            cert,
            key: digest,
        },
        key,
    ))
}

/// The TLS client config, and the files it was built from.
pub(super) fn tls_config(
    config: &UpstreamConfig,
) -> Result<(rustls::ClientConfig, TlsFiles), UpstreamBuildError> {
    let (files, key_pem) = tls_files(config)?;
    let file_err = |field: &'static str, reason: String| {
        let path = match field {
            "ca_file" => config.ca_file.as_deref(),
            "client_cert" => config.client_cert.as_ref().map(|c| c.cert.as_path()),
            _ => config.client_cert.as_ref().map(|c| c.key.as_path()),
        };
        UpstreamBuildError::TlsFile {
            upstream: config.name.clone(),
            field,
            path: path.map(|p| p.display().to_string()).unwrap_or_default(),
            reason,
        }
    };
    let roots = roots(config, &files).map_err(|e| file_err("ca_file", e))?;
    let identity = match (&files.cert, &key_pem) {
        (Some(cert), Some(key)) => {
            let chain = pem_certs(cert).map_err(|e| file_err("client_cert", e))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                file_err(
                    "client_cert_key",
                    match e {
                        rustls::pki_types::pem::Error::NoItemsFound => {
                            "no unencrypted private key found (PEM \"PRIVATE KEY\", \"RSA PRIVATE \
                             KEY\" or \"EC PRIVATE KEY\")"
                                .to_owned()
                        }
                        e => e.to_string(),
                    },
                )
            })?;
            Some((chain, key))
        }
        _ => None,
    };
    // An explicit provider: the process-wide default is ambiguous when more than one crypto
    // backend ends up in the dependency graph.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls_err = |e: rustls::Error| UpstreamBuildError::Tls {
        upstream: config.name.clone(),
        reason: e.to_string(),
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?
        .with_root_certificates(roots);
    let tls = match identity {
        None => builder.with_no_client_auth(),
        // Also where a key that is not the certificate's is caught.
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| file_err("client_cert_key", e.to_string()))?,
    };
    Ok((tls, files))
}

/// The roots an upstream's certificate must chain to: the bundled public ones (unless
/// `trust_public_roots = false`) and those of its `ca_file`.
fn roots(config: &UpstreamConfig, files: &TlsFiles) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    if config.trust_public_roots {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    if let Some(pem) = &files.ca {
        for cert in pem_certs(pem)? {
            roots.add(cert).map_err(|e| e.to_string())?;
        }
    }
    Ok(roots)
}

/// The certificates of a PEM file; none is an error.
fn pem_certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no PEM certificate found".into());
    }
    Ok(certs)
}

/// Whether the TLS handshake failed because the server has none of the protocols offered
/// by ALPN (RFC 7301 §3.2's `no_application_protocol` alert).
fn refused_h2(e: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(rustls::Error::AlertReceived(alert)) = e.downcast_ref::<rustls::Error>() {
        return *alert == rustls::AlertDescription::NoApplicationProtocol;
    }
    // hyper-rustls wraps tokio-rustls's io::Error in another, and an io::Error's `source`
    // skips the error it wraps: its inner error is reached by `get_ref` only.
    if let Some(inner) = e
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
    {
        return refused_h2(inner);
    }
    e.source().is_some_and(refused_h2)
}

/// The upstream's certificate failed this gateway's checks (expired, another name, an
/// issuer not trusted): the same every time until the certificate or `ca_file` changes.
pub fn certificate_error(
    e: &(dyn std::error::Error + 'static),
) -> Option<rustls::CertificateError> {
    if let Some(rustls::Error::InvalidCertificate(c)) = e.downcast_ref::<rustls::Error>() {
        return Some(c.clone());
    }
    // As in `refused_h2`: an io::Error's inner error is reached by `get_ref` only.
    if let Some(inner) = e
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
    {
        return certificate_error(inner);
    }
    e.source().and_then(certificate_error)
}

/// The upstream refused this gateway's client certificate, or the lack of one, with a TLS
/// alert. Under TLS 1.3 the alert comes after the client's handshake is over, so it reaches
/// a request already written; the server has read none of it.
pub fn client_certificate_refused(
    e: &(dyn std::error::Error + 'static),
) -> Option<rustls::AlertDescription> {
    use rustls::AlertDescription as A;
    const ABOUT_OURS: [A; 7] = [
        A::CertificateRequired,
        A::BadCertificate,
        A::UnsupportedCertificate,
        A::CertificateRevoked,
        A::CertificateExpired,
        A::CertificateUnknown,
        A::UnknownCA,
    ];
    if let Some(rustls::Error::AlertReceived(alert)) = e.downcast_ref::<rustls::Error>() {
        return ABOUT_OURS.contains(alert).then_some(*alert);
    }
    if let Some(inner) = e
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
    {
        // An alert read with the response (under TLS 1.3, after the handshake) reaches us
        // as an IO error holding only rustls's words for it, not the rustls error.
        if let Some(name) = inner.to_string().strip_prefix("received fatal alert: ") {
            return ABOUT_OURS.into_iter().find(|a| format!("{a:?}") == name);
        }
        return client_certificate_refused(inner);
    }
    e.source().and_then(client_certificate_refused)
}

/// Bounds the whole connector call, TCP and TLS together (hyper-util's own connect timeout
/// covers TCP only), and an HTTP/2 connection's wait for the server's first frame, which is
/// part of connecting: hyper's handshake does not wait for it, so without this bound a
/// server that accepted but never speaks would be pooled as a live connection, and every
/// request and retry sent on it would wait out its first-token limit.
#[derive(Clone)]
pub struct TimeoutConnector<C> {
    pub(super) inner: C,
    pub(super) timeout: Duration,
    pub(super) http2: Http2Mode,
}

impl<C> tower_service::Service<Uri> for TimeoutConnector<C>
where
    C: tower_service::Service<Uri>,
    C::Response: Into<UpstreamIo>,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
    type Response = UpstreamIo;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamIo, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let fut = self.inner.call(uri);
        let (timeout, mode) = (self.timeout, self.http2);
        Box::pin(async move {
            let by = tokio::time::Instant::now() + timeout;
            let mut io: UpstreamIo = match tokio::time::timeout_at(by, fut).await {
                Ok(Ok(io)) => io.into(),
                Ok(Err(e)) => {
                    let e: BoxError = e.into();
                    return Err(if mode == Http2Mode::Always && refused_h2(&*e) {
                        Box::new(NoH2ByAlpn(Some(e)))
                    } else {
                        e
                    });
                }
                Err(_) => return Err(Box::new(ConnectTimedOut(timeout)) as BoxError),
            };
            let h2 = if io.is_tls() {
                let h2 = io.connected().is_negotiated_h2();
                if mode == Http2Mode::Always && !h2 {
                    return Err(Box::new(NoH2ByAlpn(None)) as BoxError);
                }
                h2
            } else {
                // Plain http:// speaks h2c only by prior knowledge.
                mode == Http2Mode::Always
            };
            if h2 {
                // A bound of its own from the connection being made: a connect that took
                // most of its bound must not leave the server no time to answer the
                // preface (one more round trip over h2c or TLS 1.2).
                io.expect_first_frame_by(tokio::time::Instant::now() + timeout);
            }
            Ok(io)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// An upstream with a `ca_file` holding one CA, trusting the public roots or not.
    fn roots_of(public: bool) -> usize {
        let dir = tempfile::Builder::new()
            .prefix("hourglass-roots-")
            .tempdir()
            .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, params.self_signed(&key).unwrap().pem()).unwrap();
        let toml = format!(
            "[upstreams.u]\nurl = \"https://models.internal\"\nauth = \"none\"\n\
             ca_file = {:?}\ntrust_public_roots = {public}\n\n\
             [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n",
            ca.display().to_string()
        );
        let config = Config::from_toml(&toml, "test").expect("config");
        let upstream = &config.upstreams[0];
        let (files, _) = tls_files(upstream).unwrap();
        roots(upstream, &files).unwrap().len()
    }

    #[test]
    fn a_ca_file_alone_is_trusted_when_public_roots_are_not() {
        assert_eq!(roots_of(false), 1);
        assert_eq!(roots_of(true), webpki_roots::TLS_SERVER_ROOTS.len() + 1);
    }
}
