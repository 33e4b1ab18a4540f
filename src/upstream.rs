//! The client side of an upstream: its connections and its credentials.
//!
//! `http://` upstreams use `pool` (HTTP/1.1 connections driven by the requests' own tasks).
//! `https://` upstreams use hyper-util's pooled client, with TLS (rustls, webpki roots plus an
//! optional `ca_file`) and ALPN for HTTP/2. Both set TCP_NODELAY and keep-alive and bound the
//! connect step (TCP and TLS together).

mod pool;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, AUTHORIZATION};
use http::{HeaderMap, HeaderValue, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{capture_connection, CaptureConnection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::config::{AuthMode, UpstreamConfig};
use crate::policy::TtftEstimate;
use crate::watchdog::BoxError;

pub const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

#[derive(Debug, thiserror::Error)]
pub enum UpstreamBuildError {
    #[error("upstream {upstream:?}: ca_file {path}: {reason}")]
    CaFile {
        upstream: String,
        path: String,
        reason: String,
    },
    #[error("upstream {upstream:?}: url: {reason}")]
    Url { upstream: String, reason: String },
    #[error("upstream {upstream:?}: TLS setup: {reason}")]
    Tls { upstream: String, reason: String },
    #[error("upstream {upstream:?}: the key in {var} is not a valid header value")]
    BadKey { upstream: String, var: String },
    #[error("upstream {upstream:?}: api_key_file {path}: {reason}")]
    KeyFile {
        upstream: String,
        path: String,
        reason: String,
    },
    /// Not an upstream's, but checked when the gateway is built, with the upstreams: a
    /// route that asks clients for keys must not start open.
    #[error("route {route:?}: {reason}")]
    ClientKeys { route: String, reason: String },
}

/// The connect step took longer than allowed. Mapped to `connect_timeout` by the proxy.
#[derive(Debug, thiserror::Error)]
#[error("connect (TCP and TLS) did not finish within {0:?}")]
pub struct ConnectTimedOut(pub Duration);

/// An exchange with an upstream failed before its response head arrived.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// hyper-util's client (HTTPS upstreams); it tells connect errors apart itself.
    #[error(transparent)]
    Client(#[from] hyper_util::client::legacy::Error),
    /// No connection to the upstream could be made (`http://` upstreams).
    #[error("connect: {0}")]
    Connect(BoxError),
    /// The connection failed while the request was sent or the head awaited.
    #[error(transparent)]
    Exchange(#[from] hyper::Error),
}

impl ExchangeError {
    /// The connect step failed: nothing reached the upstream.
    pub fn is_connect(&self) -> bool {
        match self {
            Self::Client(e) => e.is_connect(),
            Self::Connect(_) => true,
            Self::Exchange(_) => false,
        }
    }

    /// The errors beneath this one's own message, outermost first.
    pub fn causes(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Client(e) => std::error::Error::source(e),
            Self::Connect(e) => Some(e.as_ref()),
            Self::Exchange(e) => Some(e),
        }
    }
}

type Connector = TimeoutConnector<HttpsConnector<HttpConnector>>;

enum Transport {
    Pool(pool::Pool),
    Client(Box<Client<Connector, Full<Bytes>>>),
}

pub struct Upstream {
    pub name: Arc<str>,
    pub config: Arc<UpstreamConfig>,
    /// What request URIs start with: the url's path without a trailing slash, after
    /// `scheme://authority` for hyper-util's client (the pool sends origin-form URIs).
    base: String,
    credential: Option<(HeaderName, HeaderValue)>,
    transport: Transport,
    /// What an attempt here is expected to take until its first token.
    pub ttft: TtftEstimate,
    /// The connector's own connect bound (a reload reuses this upstream only if unchanged).
    pub connect_bound: Duration,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credential.
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("base", &self.base)
            .field("has_credential", &self.credential.is_some())
            .finish()
    }
}

impl Upstream {
    /// `connect_timeout` is the longest any route allows this upstream; each request also
    /// bounds its own connect by what is left of its budget.
    pub fn new(
        config: Arc<UpstreamConfig>,
        connect_timeout: Duration,
    ) -> Result<Self, UpstreamBuildError> {
        let name: Arc<str> = Arc::from(config.name.as_str());
        let url = &config.url;
        let path = url.path().trim_end_matches('/');
        let (transport, base) = if url.scheme_str() == Some("http") {
            if config.ca_file.is_some() {
                // Unused over plain HTTP, but a broken one is still the operator's mistake.
                tls_config(&config)?;
            }
            let pool = pool::Pool::new(url, connect_timeout).map_err(|reason| {
                UpstreamBuildError::Url {
                    upstream: config.name.clone(),
                    reason,
                }
            })?;
            (Transport::Pool(pool), path.to_owned())
        } else {
            let base = format!(
                "{}://{}{path}",
                url.scheme_str().unwrap_or("https"),
                url.authority().map(|a| a.as_str()).unwrap_or_default(),
            );
            (
                Transport::Client(Box::new(https_client(&config, connect_timeout)?)),
                base,
            )
        };
        let credential = credential(&config)?;
        Ok(Self {
            name,
            connect_bound: connect_timeout,
            ttft: TtftEstimate::new(config.expected_first_token),
            config,
            base,
            credential,
            transport,
        })
    }

    /// The upstream URI for a client request's path and query.
    pub fn uri_for(&self, path_and_query: &str) -> Result<Uri, http::uri::InvalidUri> {
        format!("{}{}", self.base, path_and_query).parse()
    }

    pub fn has_credential(&self) -> bool {
        self.credential.is_some()
    }

    /// Whether the key this upstream was built with is still the one its source holds: a
    /// reload that reuses this upstream must not keep sending a rotated key.
    pub fn credential_is_current(&self) -> bool {
        matches!(credential(&self.config), Ok(c) if c == self.credential)
    }

    /// Replaces whatever credentials the client sent with the upstream's own. Without a
    /// configured key the client's own headers pass through untouched.
    pub fn apply_credentials(&self, headers: &mut HeaderMap) {
        if let Some((name, value)) = &self.credential {
            headers.remove(AUTHORIZATION);
            headers.remove(X_API_KEY);
            headers.insert(name.clone(), value.clone());
        }
    }

    pub fn request(&self, mut req: http::Request<Full<Bytes>>) -> ResponseFuture {
        match &self.transport {
            Transport::Pool(pool) => ResponseFuture::Pool(pool.send(req)),
            Transport::Client(client) => {
                let connection = capture_connection(&mut req);
                ResponseFuture::Client(client.request(req), connection)
            }
        }
    }

    /// Idle connections this upstream keeps (`http://` upstreams; 0 for the others).
    pub fn idle_connections(&self) -> usize {
        match &self.transport {
            Transport::Pool(pool) => pool.idle_count(),
            Transport::Client(_) => 0,
        }
    }
}

fn https_client(
    config: &UpstreamConfig,
    connect_timeout: Duration,
) -> Result<Client<Connector, Full<Bytes>>, UpstreamBuildError> {
    let tls = tls_config(config)?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_keepalive(Some(Duration::from_secs(30)));
    http.set_connect_timeout(Some(connect_timeout));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    let connector = TimeoutConnector {
        inner: https,
        timeout: connect_timeout,
    };
    Ok(Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .http2_keep_alive_while_idle(false)
        .build(connector))
}

/// A request on its way to the upstream, until its response head.
pub enum ResponseFuture {
    Pool(pool::Exchange),
    Client(
        hyper_util::client::legacy::ResponseFuture,
        CaptureConnection,
    ),
}

impl ResponseFuture {
    /// Whether the request has a connection, from which on its first-token clock runs.
    pub fn is_connected(&self) -> bool {
        match self {
            Self::Pool(exchange) => exchange.is_connected(),
            Self::Client(_, connection) => connection.connection_metadata().is_some(),
        }
    }
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<UpstreamIncoming>, ExchangeError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Self::Pool(exchange) => Pin::new(exchange)
                .poll(cx)
                .map_ok(|r| r.map(UpstreamIncoming::Pool)),
            Self::Client(fut, _) => Pin::new(fut)
                .poll(cx)
                .map_ok(|r| r.map(UpstreamIncoming::Client))
                .map_err(ExchangeError::Client),
        }
    }
}

/// An upstream response body, from whichever transport carried it.
pub enum UpstreamIncoming {
    Pool(pool::PooledBody),
    Client(Incoming),
}

impl Body for UpstreamIncoming {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            Self::Pool(body) => Pin::new(body).poll_frame(cx),
            Self::Client(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Pool(body) => body.is_end_stream(),
            Self::Client(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Pool(body) => body.size_hint(),
            Self::Client(body) => body.size_hint(),
        }
    }
}

/// The provider key, from `api_key_env` (unset or empty: none, the client's own
/// credentials pass through) or `api_key_file` (which must exist and hold a key).
fn read_key(config: &UpstreamConfig) -> Result<Option<(String, String)>, UpstreamBuildError> {
    if let Some(path) = &config.api_key_file {
        let file_err = |reason: String| UpstreamBuildError::KeyFile {
            upstream: config.name.clone(),
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
        let key = text.trim();
        if key.is_empty() {
            return Err(file_err("the file is empty".into()));
        }
        if key.contains(['\n', '\r']) {
            return Err(file_err("the file must hold exactly one key".into()));
        }
        return Ok(Some((
            key.to_owned(),
            format!("api_key_file {}", path.display()),
        )));
    }
    let Some(var) = &config.api_key_env else {
        return Ok(None);
    };
    let Ok(key) = std::env::var(var) else {
        return Ok(None);
    };
    let key = key.trim();
    if key.is_empty() {
        return Ok(None);
    }
    Ok(Some((key.to_owned(), var.clone())))
}

fn credential(
    config: &UpstreamConfig,
) -> Result<Option<(HeaderName, HeaderValue)>, UpstreamBuildError> {
    let Some((key, var)) = read_key(config)? else {
        return Ok(None);
    };
    let key = key.as_str();
    let bad = || UpstreamBuildError::BadKey {
        upstream: config.name.clone(),
        var: var.clone(),
    };
    let (name, mut value) = match config.auth {
        AuthMode::Bearer => (
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| bad())?,
        ),
        AuthMode::XApiKey => (X_API_KEY, HeaderValue::from_str(key).map_err(|_| bad())?),
        AuthMode::None => return Ok(None),
    };
    // Kept out of HPACK tables and printed as "Sensitive" by Debug.
    value.set_sensitive(true);
    Ok(Some((name, value)))
}

fn tls_config(config: &UpstreamConfig) -> Result<rustls::ClientConfig, UpstreamBuildError> {
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
    inner: C,
    timeout: Duration,
}

impl<C> tower_service::Service<Uri> for TimeoutConnector<C>
where
    C: tower_service::Service<Uri>,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let fut = self.inner.call(uri);
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r.map_err(Into::into),
                Err(_) => Err(Box::new(ConnectTimedOut(timeout)) as BoxError),
            }
        })
    }
}
