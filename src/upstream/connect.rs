//! Connecting to an upstream: TCP, then TLS where the URL asks (its config is `tls.rs`), all
//! under one bound that also covers, for HTTP/2, the server's first frame.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connection, HttpConnector};

use crate::config::Http2Mode;
use crate::error::BoxError;
use crate::upstream::io::UpstreamIo;
use crate::upstream::tls::refused_h2;

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
