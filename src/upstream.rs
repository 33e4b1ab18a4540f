//! The client side: one pooled hyper client per upstream, with TLS (rustls, webpki roots plus
//! an optional `ca_file`), ALPN for HTTP/2, TCP_NODELAY, keep-alive, a connect timeout that
//! covers TCP and TLS together, and the upstream's credentials.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, AUTHORIZATION};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Uri};
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
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

type Connector = TimeoutConnector<HttpsConnector<HttpConnector>>;

pub struct Upstream {
    pub name: Arc<str>,
    pub config: Arc<UpstreamConfig>,
    /// The url's scheme and authority, and its path without a trailing slash (often empty),
    /// parsed once: every request's URI is put together from them.
    scheme: Scheme,
    authority: Authority,
    prefix: String,
    credential: Option<(HeaderName, HeaderValue)>,
    client: Client<Connector, Full<Bytes>>,
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
            .field(
                "base",
                &format_args!("{}://{}{}", self.scheme, self.authority, self.prefix),
            )
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
        let tls = tls_config(&config)?;
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
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(config.pool_idle_timeout)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .http2_keep_alive_while_idle(false)
            .build(connector);
        let credential = credential(&config)?;
        let url = &config.url;
        let scheme = url.scheme().cloned().unwrap_or(Scheme::HTTP);
        let authority = url
            .authority()
            .cloned()
            .expect("config::check_url admits only URLs with a host");
        let prefix = url.path().trim_end_matches('/').to_owned();
        Ok(Self {
            name,
            connect_bound: connect_timeout,
            ttft: TtftEstimate::new(config.expected_first_token),
            config,
            scheme,
            authority,
            prefix,
            credential,
            client,
        })
    }

    /// The upstream URI for a client request's path and query. Put together from parts: a
    /// `format!` and a parse of the whole URI cost four allocations per request.
    pub fn uri_for(&self, path_and_query: &PathAndQuery) -> Result<Uri, http::Error> {
        let path_and_query = if self.prefix.is_empty() {
            path_and_query.clone()
        } else {
            let mut joined =
                String::with_capacity(self.prefix.len() + path_and_query.as_str().len());
            joined.push_str(&self.prefix);
            joined.push_str(path_and_query.as_str());
            PathAndQuery::try_from(joined)?
        };
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path_and_query)
            .build()
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

    pub fn request(&self, req: http::Request<Full<Bytes>>) -> ResponseFuture {
        self.client.request(req)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn upstream(url: &str) -> Upstream {
        let toml = format!(
            "[upstreams.u]\nurl = \"{url}\"\nauth = \"none\"\n\n\
             [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n"
        );
        let config = Config::from_toml(&toml, "test").expect("config");
        Upstream::new(config.upstreams[0].clone(), Duration::from_secs(1)).expect("upstream")
    }

    #[test]
    fn the_upstream_uri_joins_the_base_path_and_the_request_target() {
        for (base, target, want) in [
            (
                "http://127.0.0.1:9",
                "/v1/chat?x=1",
                "http://127.0.0.1:9/v1/chat?x=1",
            ),
            (
                "http://127.0.0.1:9/",
                "/v1/chat",
                "http://127.0.0.1:9/v1/chat",
            ),
            (
                "https://example.com/openai/v1/",
                "/chat/completions?api-version=2",
                "https://example.com/openai/v1/chat/completions?api-version=2",
            ),
            (
                "https://example.com/openai",
                "/",
                "https://example.com/openai/",
            ),
        ] {
            let target: PathAndQuery = target.parse().expect("target");
            let uri = upstream(base).uri_for(&target).expect("uri");
            assert_eq!(uri.to_string(), want, "{base} + {target}");
        }
    }
}
