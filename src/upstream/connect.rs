//! Connecting to an upstream: TLS (rustls with webpki roots plus an optional `ca_file`) and a
//! bound on the whole connect, TCP and TLS together.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::config::UpstreamConfig;
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

pub(super) fn tls_config(
    config: &UpstreamConfig,
) -> Result<rustls::ClientConfig, UpstreamBuildError> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = &config.ca_file {
        let ca_err = |reason: String| UpstreamBuildError::CaFile {
            upstream: config.name.clone(),
            path: path.display().to_string(),
            reason,
        };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| ca_err(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ca_err(e.to_string()))?;
        if certs.is_empty() {
            return Err(ca_err("no PEM certificate found".into()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| ca_err(e.to_string()))?;
        }
    }
    // An explicit provider: the process-wide default is ambiguous when more than one crypto
    // backend ends up in the dependency graph.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
        .map_err(|e| UpstreamBuildError::Tls {
            upstream: config.name.clone(),
            reason: e.to_string(),
        })
}

/// Bounds the whole connector call, TCP and TLS together (hyper-util's own connect timeout
/// covers TCP only).
#[derive(Clone)]
pub struct TimeoutConnector<C> {
    pub(super) inner: C,
    pub(super) timeout: Duration,
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
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r.map(Into::into).map_err(Into::into),
                Err(_) => Err(Box::new(ConnectTimedOut(timeout)) as BoxError),
            }
        })
    }
}
