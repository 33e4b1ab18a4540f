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
use rustls::pki_types::CertificateDer;

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

/// The contents of the upstream's `ca_file`, as they are now; `None` without one, or beside
/// an http:// url, where the file is ignored (`check` says so), not read.
pub(super) fn ca_pem(config: &UpstreamConfig) -> Option<std::io::Result<Vec<u8>>> {
    let https = config.url.scheme() == Some(&http::uri::Scheme::HTTPS);
    let path = config.ca_file.as_ref().filter(|_| https)?;
    Some(std::fs::read(path))
}

/// The TLS client config, and the `ca_file` contents it trusts (a reload compares them with
/// the file's: a CA added or revoked in the same file needs a new config).
pub(super) fn tls_config(
    config: &UpstreamConfig,
) -> Result<(rustls::ClientConfig, Option<Vec<u8>>), UpstreamBuildError> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let mut trusted = None;
    if let Some(read) = ca_pem(config) {
        let ca_err = |reason: String| UpstreamBuildError::CaFile {
            upstream: config.name.clone(),
            path: config
                .ca_file
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            reason,
        };
        let pem = read.map_err(|e| ca_err(format!("failed to read file: {e}")))?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ca_err(e.to_string()))?;
        if certs.is_empty() {
            return Err(ca_err("no PEM certificate found".into()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| ca_err(e.to_string()))?;
        }
        trusted = Some(pem);
    }
    // An explicit provider: the process-wide default is ambiguous when more than one crypto
    // backend ends up in the dependency graph.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map(|b| {
            (
                b.with_root_certificates(roots).with_no_client_auth(),
                trusted,
            )
        })
        .map_err(|e| UpstreamBuildError::Tls {
            upstream: config.name.clone(),
            reason: e.to_string(),
        })
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
