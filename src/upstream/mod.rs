//! The client side: pooled hyper clients per upstream, with TLS (rustls, webpki roots plus
//! an optional `ca_file`), HTTP/2 by ALPN or prior knowledge (`http2`) spread over as many
//! connections as `http2_max_streams_per_connection` asks (`h2_pool.rs`), TCP_NODELAY,
//! keep-alive, a connect timeout that covers the name lookup, TCP and TLS together, one
//! lookup in flight per name (`resolve.rs`), and the upstream's credentials.

pub mod connect;
mod credential;
mod egress;
pub mod error;
pub mod estimate;
mod h2_pool;
pub mod health;
mod io;
mod request_body;
pub mod resolve;
pub mod throttle;
mod tls;

pub use self::connect::{
    ConnectTimedOut, ConnectWaitedFor, NoH2ByAlpn, TimeoutConnector, LOOKUP_FAILED,
};
pub use self::error::UpstreamBuildError;
pub use self::h2_pool::{ConnectionWatch, StreamSlot};
pub use self::io::Abandon;
pub use self::request_body::{RequestBody, Sent};
pub use self::tls::{
    certificate_error, client_certificate_refused, handshake_refused, no_common_tls_version,
    tls_failed,
};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::{TokioExecutor, TokioTimer};

use self::credential::credential;
use self::egress::EgressConnector;
use self::estimate::TtftEstimates;
use self::h2_pool::Lanes;
use self::health::Health;
use self::resolve::SharedResolver;
use self::throttle::Throttle;
use self::tls::{tls_config, TlsFiles};
use crate::config::{Http2Mode, ProxyEnv, ProxyTarget, UpstreamConfig};
use crate::http::client_steering::{
    strip_account_selectors, strip_credentials, strip_peer_steering, without_query_key,
    OPENAI_ORGANIZATION, OPENAI_PROJECT,
};
use crate::http::headers::{present, split_port};
use crate::provider::Format;

/// The most an HTTP/1.1 upstream connection buffers of what it reads.
const UPSTREAM_READ_BUFFER: usize = 64 * 1024;

pub struct Upstream {
    pub name: Arc<str>,
    pub config: Arc<UpstreamConfig>,
    /// The url's scheme and authority, and its path without a trailing slash (often empty),
    /// parsed once: every request's URI is put together from them.
    scheme: Scheme,
    authority: Authority,
    prefix: String,
    credential: Option<(HeaderName, HeaderValue)>,
    /// The account its key acts for (`organization`, `project`), sent beside the key.
    account: Vec<(HeaderName, HeaderValue)>,
    /// The TLS files its TLS config was built from.
    tls_files: TlsFiles,
    clients: Lanes,
    /// What an attempt here is expected to take until its first token, by model.
    /// Shared with the upstream that replaces this one when a reload changes only what
    /// the connector is built from (see `inherit`).
    pub ttft: Arc<TtftEstimates>,
    /// Whether its attempts have been failing: out of rotation if so (`health.rs`).
    pub health: Arc<Health>,
    /// Its retries in flight, kept to a share of its attempts (`throttle.rs`).
    pub retries: Arc<Throttle>,
    /// A reload replaced it: attempts still running here no longer speak for its name.
    retired: AtomicBool,
    /// The connector's own connect bound (a reload reuses this upstream only if unchanged).
    pub connect_bound: Duration,
    /// The egress proxy its connections go through, if any.
    proxy: Option<Arc<ProxyTarget>>,
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
    /// The model this upstream is asked for: its own `model`, else the one the client named;
    /// none where the client named none, whose body the `model` rewrite leaves as it came (a
    /// GET, an upload: such a call asks for no model, and teaches no model's estimate).
    pub fn model_for<'a>(&'a self, asked: Option<&'a str>) -> Option<&'a str> {
        asked.map(|asked| self.config.model.as_deref().unwrap_or(asked))
    }

    /// Takes over what `old` learned (its estimates, its health): the upstream this one
    /// replaces has the same settings, and only its connect bound, its key or its TLS files
    /// changed, none of which makes the upstream answer differently.
    pub fn inherit(mut self, old: &Upstream) -> Self {
        self.ttft = old.ttft.clone();
        self.health = old.health.clone();
        self.retries = old.retries.clone();
        self
    }

    /// A reload replaced this upstream (with another, or with none).
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    /// What an attempt here, for the client's model, is expected to take until its first
    /// token.
    pub fn expected_ttft(&self, asked: Option<&str>) -> Duration {
        self.ttft.get(self.model_for(asked))
    }

    /// Teaches the estimate of the model asked for: its first token came `took` after the
    /// request was sent.
    pub fn observe_first_token(&self, asked: Option<&str>, took: Duration) {
        self.ttft.observe(self.model_for(asked), took);
    }

    /// Teaches the estimate of the model asked for that its first token takes at least
    /// `after`: a first-token limit fired.
    pub fn observe_first_token_bound(&self, asked: Option<&str>, after: Duration) {
        self.ttft.observe_bound(self.model_for(asked), after);
    }

    /// `connect_timeout` is the longest any route allows this upstream; each request also
    /// bounds its own connect by what is left of its budget.
    pub fn new(
        config: Arc<UpstreamConfig>,
        connect_timeout: Duration,
    ) -> Result<Self, UpstreamBuildError> {
        Self::with_proxy_env(config, connect_timeout, ProxyEnv::process())
    }

    /// As `new`, with the proxy rules `env` gives in place of the process environment's
    /// (tests: the environment is shared by every test running at once).
    pub fn with_proxy_env(
        config: Arc<UpstreamConfig>,
        connect_timeout: Duration,
        env: &ProxyEnv,
    ) -> Result<Self, UpstreamBuildError> {
        let name: Arc<str> = Arc::from(config.name.as_str());
        let (tls, tls_files) = tls_config(&config)?;
        let proxy = config
            .proxy
            .target(&config.url, env)
            .map_err(|reason| UpstreamBuildError::Proxy {
                upstream: config.name.clone(),
                reason,
            })?
            .map(Arc::new);
        let mut http = HttpConnector::new_with_resolver(SharedResolver::process());
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_keepalive(Some(Duration::from_secs(30)));
        http.set_connect_timeout(Some(connect_timeout));
        let http = EgressConnector {
            tcp: http,
            proxy: proxy.clone(),
        };
        let h2 = &config.http2;
        // What ALPN offers: the protocols the mode allows. (Plain http:// connections are
        // not negotiated: `http2_only` below is what makes those speak h2c.)
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let https = match h2.mode {
            Http2Mode::Auto => https.enable_http1().enable_http2().wrap_connector(http),
            Http2Mode::Always => https.enable_http2().wrap_connector(http),
            Http2Mode::Never => https.enable_http1().wrap_connector(http),
        };
        let connector = TimeoutConnector::new(https, connect_timeout, h2.mode);
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(config.pool_idle_timeout)
            // Read when the upstream is built (at start, after the limit was raised, and at
            // each reload that builds it anew).
            .pool_max_idle_per_host(crate::descriptors::idle_per_upstream())
            .http2_only(h2.mode == Http2Mode::Always)
            .http2_initial_stream_window_size(h2.stream_window)
            .http2_initial_connection_window_size(h2.connection_window)
            // Fixed windows: hyper's adaptive window would grow a stalled stream's window
            // past `http2_stream_window`, the bound that keeps it from its neighbours.
            .http2_adaptive_window(false)
            // hyper's HTTP/1 read buffer grows to about 400 KiB when reads fill it, which a
            // fast upstream behind a client that stopped reading does: held for the whole
            // stall (measured: 361 KiB of RSS a stalled stream). 64 KiB still reads a large
            // JSON answer in few calls, and a response head is far smaller.
            .http1_max_buf_size(UPSTREAM_READ_BUFFER)
            // The same bound on an HTTP/2 head (hyper's default is 16 KiB). h2 resets the
            // stream past it, and past four times it ends the whole connection.
            .http2_max_header_list_size(UPSTREAM_READ_BUFFER as u32)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .http2_keep_alive_while_idle(false);
        let https_url = config.url.scheme() == Some(&Scheme::HTTPS);
        let max_streams = h2.used(https_url).then_some(h2.max_streams_per_connection);
        let clients = Lanes::new(
            builder,
            connector,
            max_streams,
            h2.max_connections,
            h2.mode == Http2Mode::Always,
        );
        let credential = credential(&config)?;
        // Checked at load: visible ASCII, which every header value takes.
        let account = [
            (OPENAI_ORGANIZATION, &config.organization),
            (OPENAI_PROJECT, &config.project),
        ]
        .into_iter()
        .filter_map(|(name, value)| {
            let value = HeaderValue::from_str(value.as_deref()?).ok()?;
            Some((name, value))
        })
        .collect();
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
            ttft: Arc::new(TtftEstimates::new(config.expected_first_token)),
            health: Arc::new(Health::new(config.ejection)),
            retries: Arc::new(Throttle::retries()),
            retired: AtomicBool::new(false),
            config,
            scheme,
            authority,
            prefix,
            credential,
            account,
            tls_files,
            clients,
            proxy,
        })
    }

    /// The egress proxy its connections go through, as messages show it (masked).
    pub fn proxy_shown(&self) -> Option<&str> {
        self.proxy.as_deref().map(|p| p.shown.as_str())
    }

    /// The format of a request to the client's `path` here when it is a call of the API
    /// itself (`Format::call` on the path the upstream is sent, its url's own prefix first).
    pub fn call_format(&self, path: &str) -> Option<Format> {
        if self.prefix.is_empty() {
            Format::call(self.config.api, path)
        } else {
            Format::call(self.config.api, &format!("{}{path}", self.prefix))
        }
    }

    /// Whether a request to the client's `path` with a body of `body_len` bytes asks this
    /// upstream's model for anything: a call of the API itself (`call_format`) with a body.
    /// What else it serves (embeddings, moderations, files, audio, a count of tokens, a
    /// stored response polled, a list of models) asks none: such a call says nothing of a
    /// run's loop of tool calls (audit MA 1), and is charged none of its tokens (audit PC 5).
    /// A compaction (`Format::compaction`) asks the model too.
    pub fn asks_model(&self, path: &str, body_len: u64) -> bool {
        if body_len == 0 {
            return false;
        }
        let api = self.config.api;
        let asks = |path: &str| Format::call(api, path).is_some() || Format::compaction(api, path);
        if self.prefix.is_empty() {
            asks(path)
        } else {
            asks(&format!("{}{path}", self.prefix))
        }
    }

    /// The upstream URI for a client request's path and query. Put together from parts: a
    /// `format!` and a parse of the whole URI cost four allocations per request.
    /// Where the gateway sends its own key, a client's `?key=` is left out of the query,
    /// as its key headers are (`without_query_key`, audit WA 2).
    pub fn uri_for(&self, path_and_query: &PathAndQuery) -> Result<Uri, http::Error> {
        let scrubbed;
        let path_and_query = match path_and_query
            .query()
            .filter(|_| self.credential.is_some())
            .and_then(without_query_key)
        {
            Some(query) => {
                let path = path_and_query.path();
                scrubbed = PathAndQuery::try_from(match query.is_empty() {
                    true => path.to_owned(),
                    false => format!("{path}?{query}"),
                })?;
                &scrubbed
            }
            None => path_and_query,
        };
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

    /// The host and port its connections go to, as a connect error names them.
    pub fn target(&self) -> String {
        let port = self
            .authority
            .port_u16()
            .unwrap_or(match self.scheme.as_str() {
                "https" => 443,
                _ => 80,
            });
        format!("{}:{port}", self.authority.host())
    }

    pub fn has_credential(&self) -> bool {
        self.credential.is_some()
    }

    /// Whether the key this upstream was built with is still the one its source holds: a
    /// reload that reuses this upstream must not keep sending a rotated key.
    pub fn credential_is_current(&self) -> bool {
        matches!(credential(&self.config), Ok(c) if c == self.credential)
    }

    /// Whether its TLS files still hold what its TLS config was built from: a CA added to
    /// its `ca_file` or taken out of it, or a client certificate renewed in place, needs a
    /// new upstream.
    pub fn tls_files_are_current(&self) -> bool {
        TlsFiles::now(&self.config).is_ok_and(|now| now == self.tls_files)
    }

    /// Replaces whatever credentials the client sent with the upstream's own, and drops the
    /// client's choice of the account that key acts for (`ACCOUNT_SELECTORS`) and of where
    /// a peer gateway sends it (`steers_peer`). Without a configured key the client's own
    /// headers pass through untouched: its key, its account, its choice of host. Then sets
    /// the upstream's `headers`.
    pub fn apply_credentials(&self, headers: &mut HeaderMap) {
        if let Some((name, value)) = &self.credential {
            strip_credentials(headers);
            strip_account_selectors(headers);
            strip_peer_steering(headers);
            headers.insert(name.clone(), value.clone());
            for (name, value) in &self.account {
                headers.insert(name.clone(), value.clone());
            }
        }
        // The operator's `headers`, with a key or without: theirs replace the client's
        // (audit UD 1: what pins Portkey's provider once the client's is dropped).
        for (name, value) in &self.config.set_headers {
            headers.insert(name.clone(), value.clone());
        }
    }

    /// Drops from an answer's head what the upstream's `hide_headers` names (audit UD 2:
    /// LiteLLM's `x-litellm-model-api-base` told clients the provider's address behind it).
    /// Called where the answer's head goes out to the client (a kept copy's too), before the
    /// gateway adds its own headers: only the client's view changes, as with nginx's
    /// `proxy_hide_header`; the gateway still reads the whole head (audit VB 2: hidden
    /// `retry-after` and `x-should-retry` were ignored by its retries), and none of the
    /// gateway's own headers is ever hidden.
    pub fn hide_headers(&self, headers: &mut HeaderMap) {
        crate::config::hide(headers, &self.config.hide_headers);
    }

    /// Rewrites an answer's `Location` and `Content-Location` that name this upstream's
    /// origin (its url's scheme, host and port, a default port left out or not) into a
    /// reference on the gateway, as nginx's `proxy_redirect default` does: a client that
    /// followed the upstream's own URL (an origin builds one from the `Host` the gateway
    /// sends, which is the upstream's) went past the gateway, its keys and its limits, and
    /// learned the upstream's address. The gateway forwards a client's path after the url's
    /// base path, so a URL under that base path maps back to the client's path; any other on
    /// the same origin has no path on the gateway that maps to it, and goes as the path it
    /// names. Either is an absolute-path reference, which the client resolves against the
    /// gateway URL it asked (RFC 9110 10.2.2, 8.7). Another origin's URL goes unchanged.
    pub fn localize_locations(&self, headers: &mut HeaderMap) {
        use http::header::{CONTENT_LOCATION, LOCATION};
        for (name, here) in [LOCATION, CONTENT_LOCATION]
            .into_iter()
            .zip(present(headers, [&LOCATION, &CONTENT_LOCATION]))
        {
            if !here {
                continue;
            }
            let lines: Vec<HeaderValue> = headers
                .get_all(&name)
                .iter()
                .map(|v| {
                    self.local_reference(v.as_bytes())
                        .unwrap_or_else(|| v.clone())
                })
                .collect();
            headers.remove(&name);
            for line in lines {
                headers.append(name.clone(), line);
            }
        }
    }

    /// `url` as an absolute-path reference on the gateway, when it is an absolute URL on
    /// this upstream's origin (see `localize_locations`).
    fn local_reference(&self, url: &[u8]) -> Option<HeaderValue> {
        HeaderValue::from_bytes(&self.local_target(url)?).ok()
    }

    /// `url` made the gateway's as `localize_locations` makes a `Location`: for a URL an
    /// answer's body names (a batch's `results_url`), which a client fetches as it is.
    pub fn local_url(&self, url: &str) -> Option<String> {
        String::from_utf8(self.local_target(url.as_bytes())?).ok()
    }

    fn local_target(&self, url: &[u8]) -> Option<Vec<u8>> {
        let colon = url.iter().position(|&b| b == b':')?;
        let (scheme, rest) = (&url[..colon], url[colon + 1..].strip_prefix(b"//")?);
        if !scheme.eq_ignore_ascii_case(self.scheme.as_str().as_bytes()) {
            return None;
        }
        let end = rest
            .iter()
            .position(|b| matches!(b, b'/' | b'?' | b'#'))
            .unwrap_or(rest.len());
        let (authority, target) = rest.split_at(end);
        // Userinfo names another origin than the bare host for no reader that matters here,
        // but a URL with a credential in it is no redirect of this upstream's to rewrite.
        if authority.contains(&b'@') {
            return None;
        }
        let default = if self.scheme == Scheme::HTTPS {
            443
        } else {
            80
        };
        let (host, digits) = split_port(authority);
        let port = match digits {
            [] => default,
            d => std::str::from_utf8(d).ok()?.parse::<u16>().ok()?,
        };
        if !host.eq_ignore_ascii_case(self.authority.host().as_bytes())
            || port != self.authority.port_u16().unwrap_or(default)
        {
            return None;
        }
        // The client's path is what follows the base path, up to a segment's end.
        let target = match target.strip_prefix(self.prefix.as_bytes()) {
            Some(after)
                if !self.prefix.is_empty()
                    && matches!(after.first(), None | Some(b'/' | b'?' | b'#')) =>
            {
                after
            }
            _ => target,
        };
        let mut reference = Vec::with_capacity(target.len() + 1);
        if !target.starts_with(b"/") {
            reference.push(b'/');
        }
        reference.extend_from_slice(target);
        // `//host/...` (and `/\host`, which browsers read alike) is a reference to another
        // host (RFC 3986 4.2): left as the upstream sent it, on its own origin, rather than
        // made an open redirect (audit JB 2).
        if matches!(reference.get(1), Some(b'/' | b'\\')) {
            return None;
        }
        Some(reference)
    }

    /// Whether a request may go over HTTP/2 (`http2 = "always"`, or `auto` over TLS, where
    /// ALPN decides): its body may then wait for the stream's window (`request_body`).
    pub fn may_speak_h2(&self) -> bool {
        self.clients.multiplexed()
    }

    /// Sends `req`; the slot counts the stream on its connection and must be kept as long
    /// as the response body.
    pub fn request(&self, req: http::Request<RequestBody>) -> (ResponseFuture, StreamSlot) {
        self.clients.request(req)
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

    /// Audit IC 2: a FastAPI upstream's redirect (`redirect_slashes`), built from the Host
    /// the gateway sent, named the upstream; a client that followed it went past the gateway.
    #[test]
    fn a_location_on_the_upstreams_origin_becomes_the_gateways() {
        let rewritten = |base: &str, location: &'static str| {
            let mut h = HeaderMap::new();
            h.append(http::header::LOCATION, HeaderValue::from_static(location));
            h.append(
                http::header::CONTENT_LOCATION,
                HeaderValue::from_static(location),
            );
            upstream(base).localize_locations(&mut h);
            let l = h[http::header::LOCATION].to_str().unwrap().to_owned();
            assert_eq!(
                h[http::header::CONTENT_LOCATION],
                l.as_str(),
                "{base} {location}"
            );
            l
        };
        for (base, location, want) in [
            (
                "http://127.0.0.1:55873",
                "http://127.0.0.1:55873/v1/chat/completions",
                "/v1/chat/completions",
            ),
            (
                "http://Up.Example",
                "HTTP://up.example:80/v1/x?a=1#f",
                "/v1/x?a=1#f",
            ),
            (
                "https://up.example:443/",
                "https://up.example/v1/x",
                "/v1/x",
            ),
            ("http://[::1]:9", "http://[::1]:9", "/"),
            ("http://up:9", "http://up:9?page=2", "/?page=2"),
            // The base path is the gateway's root.
            (
                "https://example.com/openai/v1",
                "https://example.com/openai/v1/chat/completions",
                "/chat/completions",
            ),
            (
                "https://example.com/openai/v1/",
                "https://example.com/openai/v1",
                "/",
            ),
            // No client path maps to it: the path it names, on the gateway.
            (
                "https://example.com/openai/v1",
                "https://example.com/openai/v10/x",
                "/openai/v10/x",
            ),
            (
                "https://example.com/openai",
                "https://example.com/login",
                "/login",
            ),
            // Other origins, and references already relative, go unchanged.
            ("http://up:9", "http://up:10/v1", "http://up:10/v1"),
            ("http://up:9", "https://up:9/v1", "https://up:9/v1"),
            ("https://up", "http://up/v1", "http://up/v1"),
            ("http://up:9", "http://other:9/v1", "http://other:9/v1"),
            ("http://up:9", "http://u@up:9/v1", "http://u@up:9/v1"),
            ("http://up:9", "/v1/chat", "/v1/chat"),
            ("http://up:9", "v1/chat", "v1/chat"),
            ("http://up:9", "//up:9/v1", "//up:9/v1"),
            // A path that would read as another host once the origin is gone stays on the
            // upstream's origin (audit JB 2).
            (
                "http://up:9",
                "http://up:9//evil.example/x",
                "http://up:9//evil.example/x",
            ),
            (
                "http://up:9/base",
                "http://up:9/base//evil.example/x",
                "http://up:9/base//evil.example/x",
            ),
            (
                "http://up:9/base",
                "http://up:9/base/\\evil.example/x",
                "http://up:9/base/\\evil.example/x",
            ),
        ] {
            assert_eq!(rewritten(base, location), want, "{base} {location}");
        }
        let mut none = HeaderMap::new();
        upstream("http://up:9").localize_locations(&mut none);
        assert!(none.is_empty());
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
