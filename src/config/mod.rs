//! Hourglass configuration: the TOML file format, its defaults, and the checks
//! that turn it into a validated [`Config`].
//!
//! Loading happens in two stages. serde first parses the text into private
//! `Raw*` types that mirror the file one-to-one: every key is optional there, so
//! that defaults, inheritance and "is required" errors are phrased by us rather
//! than by serde, and every table denies unknown keys so typos fail loudly with
//! a `file:line:col`. The raw tree is then resolved (defaults merged into each
//! route, upstream names turned into shared [`UpstreamConfig`]s, relative paths
//! anchored at the config file) and cross-checked into the public types, which
//! are therefore always internally consistent: the rest of the proxy never
//! re-validates them.
//!
//! Routing is first-match in file order: the router walks [`Config::routes`]
//! and takes the first [`Route::matches`]. [`Config::warnings`] points out
//! routes that an earlier route makes unreachable.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::provider::Api;

mod build;
mod describe;
mod egress;
pub mod file;
mod http2;
mod locate;
mod peer_headers;
mod raw;
mod routing;
mod runs;
mod secrets;

pub use build::DEFAULT_LIMITS;

/// No duration in the file may exceed this (humantime's year is 365.25 days); nor a run's
/// budget a client asks for (`x-run-budget-ms`), so that every store holds the same.
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(31_557_600);
pub use describe::{missing_file_note, WILL_NOT_START};
pub use egress::{EgressProxy, ProxyEnv, ProxyTarget};
pub use http2::{Http2Config, Http2Mode};
pub use peer_headers::{hide, HidePattern};
pub use routing::glob_match;
pub use runs::{
    node_url, OnStoreError, RunIdSource, RunLimits, RunStore, RunsConfig, DEFAULT_TOKEN_ESTIMATE,
    MAX_RUN_TOKENS,
};
pub use secrets::looks_like_secret;
pub use secrets::redacted_url;
pub use secrets::{scrub, var_shown};

/// The route label of the requests that match no route, so no route may take the name.
pub const NO_ROUTE: &str = "none";

/// A 2xx JSON document in a known format is read whole before its head goes out up to this
/// many bytes (`gateway::LENGTH_CAP`): `response_body_memory` must hold one.
pub const DOCUMENT_READ_WHOLE: u64 = 1 << 20;

/// A fully resolved and validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listener and connection-level settings.
    pub server: ServerConfig,
    /// Every `[upstreams.NAME]` table, in file order. Routes share these same
    /// `Arc`s, so per-upstream state can be keyed by pointer or by name.
    pub upstreams: Vec<Arc<UpstreamConfig>>,
    /// Every `[[routes]]` entry in file order, which is also match order.
    pub routes: Vec<Route>,
    /// Name of the file (or embedded source) this was loaded from, used to
    /// prefix messages, e.g. `config/hourglass.toml`.
    pub source: String,
    /// A short hash of the config text: which config is loaded, for the info metric and
    /// the reload log.
    pub fingerprint: String,
    /// Where the file seems to hold a credential itself (named by key path, the value
    /// never repeated); reported by [`Config::warnings`].
    pub inlined_secrets: Vec<String>,
    /// The `[runs]` table.
    pub runs: RunsConfig,
    /// The working directory relative paths were resolved against, for a config that is no
    /// regular file (see [`base_dir`]); `None` when they were resolved against the config
    /// file's folder. A missing file's message says so.
    pub relative_to_cwd: Option<PathBuf>,
}

/// The folder the relative paths of the config at `path` are resolved against, and whether
/// that is the working directory. Audit NB 2: a config read from a pipe
/// (`--config <(envsubst < tmpl.toml)`, `/dev/stdin`) has no folder of its own, and
/// `/dev/fd/63`'s parent made `api_key_file = "key"` into `/dev/fd/key`; such a config's
/// relative paths are resolved against the working directory, as the shell that wrote
/// the pipe resolves its own.
pub fn base_dir(path: &Path) -> (Option<PathBuf>, bool) {
    // A descriptor's name (`/dev/stdin` redirected from a file is a regular file, but
    // `/dev` is not its folder) or anything else that is not a regular file.
    let descriptor = path == Path::new("/dev/stdin")
        || path.parent().is_some_and(|p| {
            p == Path::new("/dev/fd") || (p.starts_with("/proc") && p.ends_with("fd"))
        });
    let not_a_file = std::fs::metadata(path).is_ok_and(|m| !m.is_file());
    if descriptor || not_a_file {
        if let Ok(cwd) = std::env::current_dir() {
            return (Some(cwd), true);
        }
    }
    (path.parent().map(Path::to_path_buf), false)
}

/// The `[server]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Address clients connect to (default `127.0.0.1:8080`).
    pub listen: SocketAddr,
    /// Address serving `/metrics`, `/healthz` and `/readyz`
    /// (default `127.0.0.1:9090`); always different from `listen`.
    pub admin_listen: SocketAddr,
    /// Largest accepted request body in bytes (default 10 MiB); never zero.
    pub max_request_body: u64,
    /// Bytes that the request bodies being received, or read and waiting for a route's slot,
    /// may hold together (default 256 MiB); past it a request is answered 503 `overloaded`.
    /// At least `max_request_body`.
    pub request_body_memory: u64,
    /// Largest answer the gateway assembles from a stream for a client that did not stream
    /// (`stream_upstream`), in bytes (default 16 MiB); past it the client gets 502.
    pub max_response_body: u64,
    /// Bytes that the answers held before their heads go out (documents rebuilt from
    /// streams, JSON documents read whole) may hold together (default 256 MiB); past it an
    /// answer is given up, 503 `overloaded`. At least `max_response_body` and
    /// [`DOCUMENT_READ_WHOLE`].
    pub response_body_memory: u64,
    /// How long a client may take to send its request headers (default 10s), and how long a
    /// connection may sit idle: an HTTP/1 keep-alive between requests, an HTTP/2 connection
    /// with no stream open (`idle`). Never zero.
    pub header_read_timeout: Duration,
    /// How long in-flight requests get to finish on shutdown (default 30s).
    pub shutdown_grace: Duration,
    /// How long, after a shutdown signal, the client listener keeps accepting and serving
    /// while `/readyz` already answers 503 (default 0s), so that a load balancer polling
    /// `/readyz` takes the replica out before its port closes. At most 10 minutes.
    pub drain_delay: Duration,
    /// How long a write to a client may wait for the client to read (default 60s, like
    /// nginx's `send_timeout`); past it the connection is closed, and an HTTP/2 stream that its
    /// client gives no window for as long has its upstream call ended (`reaper`). Never zero.
    pub send_timeout: Duration,
    /// Cap on concurrent client connections; `None` means no limit. Never
    /// `Some(0)`.
    pub max_connections: Option<usize>,
    /// Largest request head (request line and headers) in bytes (default 64 KiB); larger
    /// heads get 431.
    pub max_header_bytes: usize,
    /// Most header fields in one request (default 100); more get 431.
    pub max_headers: usize,
    /// Concurrent streams one HTTP/2 client connection may open (default 256).
    pub http2_max_concurrent_streams: u32,
    /// TLS for the client listener (`[server.tls]`); `None` serves plain HTTP.
    pub tls: Option<ServerTls>,
}

/// `[server.tls]`: PEM files, relative paths resolved against the config file's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTls {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// Private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by one of these CAs.
    pub client_ca: Option<PathBuf>,
    /// CRLs (PEM or DER) of the `client_ca` CAs: a client certificate they revoke is refused.
    /// Only with `client_ca`.
    pub client_crl: Option<PathBuf>,
}

/// How the proxy presents the upstream API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// `Authorization: Bearer <key>` (OpenAI style). The default.
    Bearer,
    /// `x-api-key: <key>` (Anthropic style).
    XApiKey,
    /// `api-key: <key>` (Azure OpenAI, whose deployment paths take no other header).
    ApiKey,
    /// `x-goog-api-key: <key>` (native Gemini).
    GoogApiKey,
    /// The proxy adds no credentials of its own.
    None,
}

impl fmt::Display for AuthMode {
    /// Formats as the spelling used in the config file.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AuthMode::Bearer => "bearer",
            AuthMode::XApiKey => "x-api-key",
            AuthMode::ApiKey => "api-key",
            AuthMode::GoogApiKey => "x-goog-api-key",
            AuthMode::None => "none",
        })
    }
}

/// One `[upstreams.NAME]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// The table key, e.g. `openai`.
    pub name: String,
    /// Base URL: scheme `http` or `https`, a host, an optional path prefix and
    /// no query or fragment. The path never ends in `/` unless it is the root,
    /// so joining is `url.path().trim_end_matches('/')` followed by the request
    /// path.
    pub url: http::Uri,
    /// Environment variable holding the API key, if any. Read at startup, not
    /// here, so `hourglass check` works without secrets.
    pub api_key_env: Option<String>,
    /// File holding the API key (its whole content, trimmed), if any; never set together
    /// with `api_key_env`. Relative paths are resolved against the config file's
    /// directory. Read at startup, like the variable.
    pub api_key_file: Option<PathBuf>,
    /// How the key is sent.
    pub auth: AuthMode,
    /// The OpenAI organization and project the key acts for (`OpenAI-Organization`,
    /// `OpenAI-Project`), sent beside it; a client's own choice never is (audit PC 4).
    pub organization: Option<String>,
    pub project: Option<String>,
    /// Request headers set on every attempt here (`headers`), replacing any the client
    /// sent: what a peer gateway reads that the client may not choose beside the gateway's
    /// key, such as Portkey's provider (audit UD 1). Never one the gateway sets itself.
    pub set_headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Answer headers dropped from every answer here (`hide_headers`), before the gateway
    /// adds its own: a peer's internal ones, such as LiteLLM's `x-litellm-*` (audit UD 2).
    pub hide_headers: Vec<HidePattern>,
    /// Extra CA bundle (PEM) to trust; relative paths are already resolved
    /// against the config file's directory.
    pub ca_file: Option<PathBuf>,
    /// Whether the bundled public (webpki) roots are trusted beside `ca_file` (default
    /// true); false trusts the `ca_file` alone, as a private upstream is pinned to its CA.
    pub trust_public_roots: bool,
    /// The certificate this gateway presents to an upstream that asks for one (mutual TLS).
    pub client_cert: Option<ClientCert>,
    /// Whether to tell the upstream the remaining budget (default true).
    pub propagate_budget: bool,
    /// Rewrites the JSON body's `model` for this upstream (e.g. a smaller model on a
    /// fallback that must answer in the time left).
    pub model: Option<String>,
    /// Seed for the learned time-to-first-token estimate that decides whether an attempt
    /// on this upstream still fits a request's remaining budget.
    pub expected_first_token: Option<Duration>,
    /// The API this upstream speaks (default `auto`: known paths only), which decides what
    /// counts as a token and where usage is read.
    pub api: Api,
    /// Ask OpenAI chat streams for their usage (`stream_options.include_usage`).
    pub include_usage: bool,
    /// `stream_upstream` asks a Chat stream it assembles for its usage: unless
    /// `include_usage = false` is set, for providers that refuse `stream_options` (Mistral
    /// answers it 422).
    pub assembled_usage: bool,
    /// How long an idle connection to this upstream is kept for reuse. Set it below the
    /// upstream's own keep-alive limit (uvicorn's default is 5 s), so that the gateway, not
    /// the upstream, closes it: a request sent on a connection the upstream closes in the
    /// same instant fails.
    pub pool_idle_timeout: Duration,
    /// When failing attempts take this upstream out of its routes' rotation, and for how long.
    pub ejection: Ejection,
    /// Which HTTP version to speak, and how streams share HTTP/2 connections.
    pub http2: Http2Config,
    /// The HTTP CONNECT proxy its connections go through (`proxy`; by default the
    /// environment's, `HTTPS_PROXY` and the rest).
    pub proxy: EgressProxy,
}

/// An upstream's `client_cert` and `client_cert_key`: PEM files, paths already resolved
/// against the config file's directory. Read when the upstream is built, and again by each
/// reload, so a rotated pair needs no restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// The chain, leaf first.
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `eject_after` and `eject_for`: after this many failed attempts in a row an upstream is
/// passed over, while another upstream of a route's chain is in rotation, until `duration`
/// has gone by and one attempt (a probe) has succeeded again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ejection {
    /// Failed attempts in a row that eject the upstream; 0 never does.
    pub after: u32,
    /// How long an ejection lasts before the next attempt probes the upstream.
    pub duration: Duration,
}

impl Default for Ejection {
    fn default() -> Self {
        Self {
            after: 5,
            duration: Duration::from_secs(10),
        }
    }
}

/// The most `eject_after` may ask: past it, an ejection would need a failure rate no
/// outage would be mistaken for.
pub const MAX_EJECT_AFTER: u64 = 1000;

/// `pool_idle_timeout` when the upstream names none: hyper-util's own default.
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Time limits of one route after inheritance from `[defaults]`.
///
/// Invariants (checked at load): every timeout and the budget are non-zero,
/// `budget <= max_budget`, `first_token_timeout <= budget` and
/// `reserve + min_useful < budget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Total time a request gets when the client asks for nothing else.
    pub budget: Duration,
    /// Largest budget a client may ask for.
    pub max_budget: Duration,
    /// Time allowed to establish the upstream connection.
    pub connect_timeout: Duration,
    /// Time allowed until the first streamed token arrives.
    pub first_token_timeout: Duration,
    /// Longest allowed gap between streamed chunks.
    pub idle_timeout: Duration,
    /// Part of the budget held back for the proxy to finish the response.
    pub reserve: Duration,
    /// Below this much remaining budget an upstream attempt is not worth
    /// starting.
    pub min_useful: Duration,
}

/// One `[[routes]]` entry, with its upstream and limits resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Unique, non-empty name used in logs and metrics.
    pub name: String,
    /// Request path prefix; always starts with `/`. See [`Route::matches`] for
    /// the segment-boundary rule.
    pub path_prefix: String,
    /// Globs on the request body's `model`; empty means any request (with or
    /// without a model) matches. See [`glob_match`].
    pub models: Vec<String>,
    /// The upstream this route forwards to (shared with [`Config::upstreams`]).
    pub upstream: Arc<UpstreamConfig>,
    /// Limits after merging the route's overrides onto `[defaults]`.
    pub limits: Limits,
    /// Retries, fallbacks and hedging: how this route spends one budget on several
    /// attempts.
    pub policy: Policy,
    /// Most requests this route serves at once (`max_in_flight`); `None` means no limit.
    /// Never `Some(0)`.
    pub max_in_flight: Option<usize>,
    /// The largest request body this route takes (`max_request_body`), raising or lowering
    /// `[server] max_request_body`; `None`: the server's. Never `Some(0)`, never above
    /// `[server] request_body_memory`.
    pub max_request_body: Option<u64>,
    /// Ask the upstream to stream a request whose client did not (known formats only), so
    /// that the first-token and idle limits watch it, and answer with the one JSON document.
    pub stream_upstream: bool,
    /// With `stream_upstream`: a limit that cuts the answer after output came gives the
    /// client what was generated (200, `x-hourglass-partial`) instead of a 504.
    pub partial_answers: bool,
    /// Where the keys clients must present come from (`client_keys_env`,
    /// `client_keys_file`); `None` means the route is open.
    pub client_auth: Option<ClientAuth>,
    /// Where the run id is read from (`run_id_header`, default `x-run-id`).
    pub run_id: RunIdSource,
    /// What a run started on this route may spend.
    pub run_limits: RunLimits,
}

impl Route {
    /// Every upstream the route may try, in the order of its chain: its own, those balanced
    /// with it, then its fallbacks.
    pub fn chain(&self) -> impl Iterator<Item = &Arc<UpstreamConfig>> {
        std::iter::once(&self.upstream)
            .chain(&self.policy.balanced)
            .chain(&self.policy.fallbacks)
    }
}

/// The sources of a route's client keys. The keys themselves are read when the gateway is
/// built, never kept in the config (so `hourglass check` needs no secrets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAuth {
    /// An environment variable holding comma-separated keys.
    pub env: Option<String>,
    /// A file with one key per line (blank lines and `#` comments ignored); relative paths
    /// are resolved against the config file's directory.
    pub file: Option<PathBuf>,
}

/// A failure that may trigger a retry or a move to the next fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryCause {
    /// The connection could not be made (refused, DNS, TLS, connect timeout).
    Connect,
    /// No data event within the attempt's first-token limit.
    FirstToken,
    /// The upstream answered 5xx.
    Status5xx,
    /// The upstream answered 429.
    Status429,
    /// The upstream reset or broke the exchange before its response head.
    Reset,
}

impl RetryCause {
    /// Spelling in TOML and the `reason` label of `hourglass_retries_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::FirstToken => "first_token",
            Self::Status5xx => "5xx",
            Self::Status429 => "429",
            Self::Reset => "reset",
        }
    }

    pub const ALL: [RetryCause; 5] = [
        Self::Connect,
        Self::FirstToken,
        Self::Status5xx,
        Self::Status429,
        Self::Reset,
    ];
}

/// A set of [`RetryCause`]s.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RetryOn(u8);

impl RetryOn {
    pub const ALL: RetryOn = RetryOn(0b1_1111);

    pub fn contains(self, cause: RetryCause) -> bool {
        self.0 & (1 << cause as u8) != 0
    }

    /// The causes of `self` that are also `cause` (none, or that one).
    pub fn only(self, cause: RetryCause) -> Self {
        RetryOn(self.0 & (1 << cause as u8))
    }

    fn with(self, cause: RetryCause) -> Self {
        RetryOn(self.0 | (1 << cause as u8))
    }
}

impl fmt::Debug for RetryOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(
                RetryCause::ALL
                    .iter()
                    .filter(|c| self.contains(**c))
                    .map(|c| c.as_str()),
            )
            .finish()
    }
}

impl fmt::Display for RetryOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = RetryCause::ALL
            .iter()
            .filter(|c| self.contains(**c))
            .map(|c| c.as_str())
            .collect();
        write!(f, "[{}]", names.join(", "))
    }
}

/// How a route spends one budget on several attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Extra attempts on the same upstream (each upstream of the chain gets as many).
    pub retries: u32,
    /// The failures that trigger a retry or a move to the next fallback.
    pub retry_on: RetryOn,
    /// Upstreams that serve the route as well as its own (`balance_with`): each request
    /// starts at the least busy of them all, and the others follow it as fallbacks.
    pub balanced: Vec<Arc<UpstreamConfig>>,
    /// Upstreams tried in order after the route's own (and those balanced with it).
    pub fallbacks: Vec<Arc<UpstreamConfig>>,
    /// Start the first fallback in parallel when the first attempt has produced no token
    /// by then.
    pub hedge_after: Option<Duration>,
}

impl Policy {
    /// Whether the response head must be held until the first data event, so that a
    /// first-token failure can still become a retry or a switch instead of a stream that
    /// started and died.
    pub fn holds_head(&self) -> bool {
        !self.fallbacks.is_empty()
            || !self.balanced.is_empty()
            || (self.retries > 0 && self.retry_on.contains(RetryCause::FirstToken))
    }
}

/// Why a configuration could not be loaded. Display is a single line that
/// names the file and, where possible, the location or item at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The path as given.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The text is not valid TOML, or does not fit the schema (unknown key,
    /// wrong type, bad duration...).
    #[error("{source_name}:{line}:{col}: {message}")]
    Syntax {
        /// File name the text came from.
        source_name: String,
        /// 1-based line of the offending key or value.
        line: usize,
        /// 1-based column, counted in characters.
        col: usize,
        /// The parser's message, without its source snippet.
        message: String,
    },
    /// The file parsed but its values are inconsistent or incomplete.
    #[error("{source_name}: {message}")]
    Invalid {
        /// File name the text came from.
        source_name: String,
        /// What is wrong, naming the route or upstream, the key and values.
        message: String,
    },
}

impl UpstreamConfig {
    /// `url` as configured: `http::Uri` shows a URL with no path with a `/`, which the docs
    /// say is dropped.
    pub fn url_text(&self) -> String {
        let url = self.url.to_string();
        match url.strip_suffix('/') {
            Some(bare) if self.url.path() == "/" => bare.to_owned(),
            _ => url,
        }
    }
}

impl Config {
    /// Reads and validates the config file at `path` (start-up, `check`): a regular file
    /// or a pipe, read once ([`file::read_config`]). Relative `ca_file`s are resolved
    /// against the file's directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Self::load_with(path, file::read_config)
    }

    /// [`Config::load`] for a reload: the file must be a regular file, as every file it
    /// names ([`file::read`]), since a pipe read again is empty or waits for a writer.
    pub fn reread(path: &Path) -> Result<Config, ConfigError> {
        Self::load_with(path, file::read)
    }

    fn load_with(
        path: &Path,
        read: fn(&Path) -> std::io::Result<Vec<u8>>,
    ) -> Result<Config, ConfigError> {
        let bytes = read(path).map_err(|e| ConfigError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        Self::from_file_bytes(path, bytes)
    }

    /// As [`Config::load`], from the bytes of `path` already read: the file watcher builds
    /// the very bytes it saw settle, which a second read could find half rewritten. The
    /// files the config names are read as `load` reads them.
    pub fn from_file_bytes(path: &Path, bytes: Vec<u8>) -> Result<Config, ConfigError> {
        let source = path.display().to_string();
        // Said where, as any other fault of the text is (a key pasted from a document in
        // Latin-1, a file saved as UTF-16).
        let text = String::from_utf8(bytes).map_err(|e| {
            let at = e.utf8_error().valid_up_to();
            let valid = std::str::from_utf8(&e.as_bytes()[..at]).expect("valid up to there");
            let (line, col) = locate::line_col(valid, at);
            ConfigError::Syntax {
                source_name: source.clone(),
                line,
                col,
                message: format!(
                    "byte 0x{:02x} (offset {at}) is not UTF-8; a TOML file must be UTF-8",
                    e.as_bytes()[at]
                ),
            }
        })?;
        let (dir, cwd) = base_dir(path);
        let mut config = build::parse(&text, &source, dir.as_deref())?;
        config.relative_to_cwd = dir.filter(|_| cwd);
        Ok(config)
    }

    /// The files config `text` names (relative ones resolved against `base_dir`, the
    /// config file's folder), read from the text even when it is refused (see
    /// [`Config::files`]); empty when it does not parse.
    pub fn files_named(text: &str, base_dir: Option<&Path>) -> Vec<PathBuf> {
        build::files_named(text, base_dir)
    }

    /// Validates config text that did not come from [`Config::load`] (embedded
    /// configs, tests). `source` names it in messages; relative `ca_file`s are
    /// resolved against `Path::new(source).parent()`.
    pub fn from_toml(text: &str, source: &str) -> Result<Config, ConfigError> {
        build::parse(text, source, Path::new(source).parent())
    }

    /// Every file the config names and a reload re-reads: the TLS certificate, key, client
    /// CA and CRL, upstreams' key (unless `auth = "none"`) and CA files, routes' client key files. A change to one is
    /// a reason to reload, as a change to the config file is (a rotated certificate or key
    /// often leaves the config itself as it was).
    pub fn files(&self) -> Vec<&Path> {
        let mut out: Vec<&Path> = Vec::new();
        if let Some(tls) = &self.server.tls {
            out.extend([tls.cert.as_path(), tls.key.as_path()]);
            out.extend(tls.client_ca.as_deref());
            out.extend(tls.client_crl.as_deref());
        }
        for u in &self.upstreams {
            // Under auth "none" the key file is not read: not a reason to reload either.
            if u.auth != AuthMode::None {
                out.extend(u.api_key_file.as_deref());
            }
            out.extend(u.ca_file.as_deref());
            out.extend(
                u.client_cert
                    .iter()
                    .flat_map(|c| [c.cert.as_path(), c.key.as_path()]),
            );
        }
        for r in &self.routes {
            out.extend(r.client_auth.as_ref().and_then(|a| a.file.as_deref()));
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests;
