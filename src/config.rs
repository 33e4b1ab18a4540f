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

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::provider::Api;

// ---------------------------------------------------------------------------
// Checked, public types
// ---------------------------------------------------------------------------

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
    /// How long a client may take to send its request headers (default 10s), and how long a
    /// connection may sit idle: an HTTP/1 keep-alive between requests, an HTTP/2 connection
    /// with no stream open (`idle`). Never zero.
    pub header_read_timeout: Duration,
    /// How long in-flight requests get to finish on shutdown (default 30s).
    pub shutdown_grace: Duration,
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
}

/// How the proxy presents the upstream API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// `Authorization: Bearer <key>` (OpenAI style). The default.
    Bearer,
    /// `x-api-key: <key>` (Anthropic style).
    XApiKey,
    /// The proxy adds no credentials of its own.
    None,
}

impl fmt::Display for AuthMode {
    /// Formats as the spelling used in the config file.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AuthMode::Bearer => "bearer",
            AuthMode::XApiKey => "x-api-key",
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
    /// Extra CA bundle (PEM) to trust; relative paths are already resolved
    /// against the config file's directory.
    pub ca_file: Option<PathBuf>,
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
    /// How long an idle connection to this upstream is kept for reuse. Set it below the
    /// upstream's own keep-alive limit (uvicorn's default is 5 s), so that the gateway, not
    /// the upstream, closes it: a request sent on a connection the upstream closes in the
    /// same instant fails.
    pub pool_idle_timeout: Duration,
}

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
    /// Where the keys clients must present come from (`client_keys_env`,
    /// `client_keys_file`); `None` means the route is open.
    pub client_auth: Option<ClientAuth>,
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
    /// Upstreams tried in order after the route's own.
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
            || (self.retries > 0 && self.retry_on.contains(RetryCause::FirstToken))
    }
}

impl Route {
    /// Whether a request for `path` (which may carry a `?query`) with body
    /// model `model` belongs to this route.
    ///
    /// The prefix only matches on a segment boundary, so that `/v1/chat` does
    /// not capture `/v1/chatter`: the path must equal the prefix, or continue
    /// it with `/` or `?`, or the prefix itself must end in `/`. So
    /// `/v1/chat` matches `/v1/chat`, `/v1/chat/x` and `/v1/chat?x` but not
    /// `/v1/chatter`; `/v1/chat/` matches `/v1/chat/x` but not `/v1/chat`.
    ///
    /// When [`Route::models`] is non-empty the model must be present and match
    /// at least one glob; a request without a model then never matches.
    pub fn matches(&self, path: &str, model: Option<&str>) -> bool {
        if !prefix_matches(&self.path_prefix, path) {
            return false;
        }
        if self.models.is_empty() {
            return true;
        }
        match model {
            Some(model) => self.models.iter().any(|glob| glob_match(glob, model)),
            None => false,
        }
    }

    /// Whether the path alone could select this route (its models aside): the routes the
    /// router must consider before it has read the body.
    pub fn matches_path(&self, path: &str) -> bool {
        prefix_matches(&self.path_prefix, path)
    }

    /// Whether [`Route::matches`] depends on the body's model, i.e. whether the
    /// router must read and parse the body before it can decide on this route.
    pub fn needs_model(&self) -> bool {
        !self.models.is_empty()
    }
}

fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with(['/', '?']),
        None => false,
    }
}

/// Case-sensitive glob match of the whole of `text` against `pattern`, where
/// `*` matches any run of characters (including none), `?` exactly one
/// character, and everything else itself. There is no escaping: model names
/// do not contain `*` or `?`.
///
/// Runs in O(len(pattern) × len(text)) time without recursion or allocation,
/// because patterns come from config but text comes from clients.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    // Byte offsets, always on char boundaries because they only ever advance
    // by `len_utf8` of the char found there.
    let (mut p, mut t) = (0usize, 0usize);
    // Where to resume after the most recent `*`: pattern offset just past it,
    // and the text offset it is currently assumed to have consumed up to.
    // Only the latest star needs remembering: whatever extra text an earlier
    // star might absorb, the later star can absorb instead, so backtracking
    // further never finds a match this misses. That is what keeps it linear
    // in the number of stars rather than exponential.
    let mut resume: Option<(usize, usize)> = None;
    while let Some(tc) = text[t..].chars().next() {
        match pattern[p..].chars().next() {
            Some('*') => {
                p += 1;
                resume = Some((p, t));
                continue;
            }
            Some(pc) if pc == '?' || pc == tc => {
                p += pc.len_utf8();
                t += tc.len_utf8();
                continue;
            }
            _ => {}
        }
        match resume {
            Some((star_p, star_t)) => {
                // Let the star swallow one more character and retry.
                let swallowed = text[star_t..].chars().next().map_or(1, char::len_utf8);
                p = star_p;
                t = star_t + swallowed;
                resume = Some((star_p, t));
            }
            None => return false,
        }
    }
    pattern[p..].chars().all(|c| c == '*')
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

impl Config {
    /// Reads and validates the config file at `path`. Relative `ca_file`s are
    /// resolved against the file's directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let source = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: source.clone(),
            source: e,
        })?;
        parse(&text, &source, path.parent())
    }

    /// Validates config text that did not come from [`Config::load`] (embedded
    /// configs, tests). `source` names it in messages; relative `ca_file`s are
    /// resolved against `Path::new(source).parent()`.
    pub fn from_toml(text: &str, source: &str) -> Result<Config, ConfigError> {
        parse(text, source, Path::new(source).parent())
    }

    /// Non-fatal problems worth showing at startup and in `hourglass check`:
    /// missing API key variables, settings that will be ignored, unused
    /// upstreams, unreadable CA files and unreachable routes. Reads the
    /// process environment and the file system, so call it when those are
    /// final.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings_with(&|name| std::env::var_os(name))
    }

    fn warnings_with(&self, env: &dyn Fn(&str) -> Option<OsString>) -> Vec<String> {
        let mut out = self.inlined_secrets.clone();
        for up in &self.upstreams {
            let name = &up.name;
            if let Some(path) = &up.api_key_file {
                if up.auth == AuthMode::None {
                    out.push(format!(
                        "upstream {name:?}: api_key_file is ignored because auth is \"none\""
                    ));
                } else {
                    secret_file_warnings(
                        &format!("upstream {name:?}: api_key_file"),
                        path,
                        &mut out,
                    );
                }
            }
            if let Some(var) = up.api_key_env.as_ref().filter(|v| !looks_like_secret(v)) {
                if up.auth == AuthMode::None {
                    out.push(format!(
                        "upstream {name:?}: api_key_env {var} is ignored because auth is \"none\""
                    ));
                } else {
                    match env(var) {
                        None => out.push(format!(
                            "upstream {name:?}: api_key_env {var} is not set; the client's own credentials will be passed through"
                        )),
                        Some(v) if v.is_empty() => {
                            out.push(format!("upstream {name:?}: api_key_env {var} is set but empty"))
                        }
                        Some(_) => {}
                    }
                }
            }
            if let Some(ca) = &up.ca_file {
                if up.url.scheme_str() == Some("http") {
                    out.push(format!(
                        "upstream {name:?}: ca_file is ignored because url {} uses http",
                        up.url
                    ));
                } else if let Err(e) = std::fs::metadata(ca) {
                    out.push(format!("upstream {name:?}: ca_file {}: {e}", ca.display()));
                }
            }
            if !self.routes.iter().any(|r| Arc::ptr_eq(&r.upstream, up)) {
                out.push(format!("upstream {name:?} is not used by any route"));
            }
        }
        for r in &self.routes {
            let Some(auth) = &r.client_auth else { continue };
            let label = format!("route {:?}", r.name);
            if let Some(var) = auth.env.as_ref().filter(|v| !looks_like_secret(v)) {
                if env(var).is_none() {
                    out.push(format!(
                        "{label}: client_keys_env {var} is not set; the gateway will not start without the route's keys"
                    ));
                }
            }
            if let Some(path) = &auth.file {
                secret_file_warnings(&format!("{label}: client_keys_file"), path, &mut out);
            }
            let up = &r.upstream;
            if up.auth == AuthMode::None || (up.api_key_env.is_none() && up.api_key_file.is_none())
            {
                out.push(format!(
                    "{label}: clients authenticate with their gateway keys, which are never passed on, and upstream {:?} has no key of its own",
                    up.name
                ));
            }
        }
        for (i, later) in self.routes.iter().enumerate() {
            if let Some(earlier) = self.routes[..i].iter().find(|e| shadows(e, later)) {
                out.push(format!(
                    "route {:?} is unreachable: route {:?} comes first and matches every request it would",
                    later.name, earlier.name
                ));
            }
        }
        out
    }

    /// Human-readable summary of what was resolved, for `hourglass check`:
    /// server settings, then one block per route in file (= match) order with
    /// its models, upstream and every limit after inheritance.
    pub fn describe(&self) -> String {
        use std::fmt::Write as _;
        let s = &self.server;
        let mut out = String::new();
        // Writing to a String cannot fail, hence the ignored results.
        let _ = writeln!(out, "config {}", self.source);
        let _ = writeln!(out, "server");
        let _ = writeln!(out, "  listen: {} (clients)", s.listen);
        let _ = writeln!(
            out,
            "  admin_listen: {} (/metrics /healthz /readyz)",
            s.admin_listen
        );
        let _ = writeln!(out, "  max_request_body: {} bytes", s.max_request_body);
        let _ = writeln!(out, "  header_read_timeout: {}", hd(s.header_read_timeout));
        let _ = writeln!(out, "  shutdown_grace: {}", hd(s.shutdown_grace));
        let _ = writeln!(out, "  send_timeout: {}", hd(s.send_timeout));
        let max_connections = s
            .max_connections
            .map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
        let _ = writeln!(out, "  max_connections: {max_connections}");
        for r in &self.routes {
            let up = &r.upstream;
            let l = &r.limits;
            let _ = writeln!(out, "route {:?}", r.name);
            let _ = writeln!(out, "  path_prefix: {}", r.path_prefix);
            if r.models.is_empty() {
                let _ = writeln!(out, "  models: any");
            } else {
                let globs: Vec<String> = r.models.iter().map(|m| format!("{m:?}")).collect();
                let _ = writeln!(out, "  models: {}", globs.join(", "));
            }
            let _ = write!(out, "  upstream: {} ({}, auth {}", up.name, up.url, up.auth);
            if let Some(var) = &up.api_key_env {
                let var = if looks_like_secret(var) {
                    "(not shown: looks like a key)"
                } else {
                    var
                };
                let _ = write!(out, ", api_key_env {var}");
            }
            if let Some(path) = &up.api_key_file {
                let _ = write!(out, ", api_key_file {}", path.display());
            }
            if let Some(ca) = &up.ca_file {
                let _ = write!(out, ", ca_file {}", ca.display());
            }
            let _ = write!(out, ", propagate_budget {}", up.propagate_budget);
            if let Some(m) = &up.model {
                let _ = write!(out, ", model {m:?}");
            }
            if let Some(e) = up.expected_first_token {
                let _ = write!(out, ", expected_first_token {}", hd(e));
            }
            if up.api != Api::Auto {
                let _ = write!(out, ", api {}", up.api);
            }
            if up.include_usage {
                let _ = write!(out, ", include_usage true");
            }
            if up.pool_idle_timeout != DEFAULT_POOL_IDLE_TIMEOUT {
                let _ = write!(out, ", pool_idle_timeout {}", hd(up.pool_idle_timeout));
            }
            let _ = writeln!(out, ")");
            let p = &r.policy;
            let _ = writeln!(out, "  retries: {} on {}", p.retries, p.retry_on);
            if !p.fallbacks.is_empty() {
                let names: Vec<&str> = p.fallbacks.iter().map(|f| f.name.as_str()).collect();
                let _ = writeln!(out, "  fallbacks: {}", names.join(" -> "));
            }
            if let Some(h) = p.hedge_after {
                let _ = writeln!(out, "  hedge_after: {}", hd(h));
            }
            if let Some(n) = r.max_in_flight {
                let _ = writeln!(out, "  max_in_flight: {n}");
            }
            if let Some(auth) = &r.client_auth {
                let mut from = Vec::new();
                if let Some(var) = &auth.env {
                    from.push(format!(
                        "client_keys_env {}",
                        if looks_like_secret(var) {
                            "(not shown)"
                        } else {
                            var
                        }
                    ));
                }
                if let Some(path) = &auth.file {
                    from.push(format!("client_keys_file {}", path.display()));
                }
                let _ = writeln!(out, "  client keys: {}", from.join(", "));
            }
            for (key, value) in [
                ("budget", l.budget),
                ("max_budget", l.max_budget),
                ("connect_timeout", l.connect_timeout),
                ("first_token_timeout", l.first_token_timeout),
                ("idle_timeout", l.idle_timeout),
                ("reserve", l.reserve),
                ("min_useful", l.min_useful),
            ] {
                let _ = writeln!(out, "  {key}: {}", hd(value));
            }
        }
        out
    }
}

/// A file of secrets that cannot be read makes startup fail; one others may read is a
/// leak waiting to happen.
fn secret_file_warnings(label: &str, path: &Path, out: &mut Vec<String>) {
    match std::fs::metadata(path) {
        Err(e) => out.push(format!(
            "{label} {}: {e}; the gateway will not start without it",
            path.display()
        )),
        Ok(meta) => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = meta.permissions().mode() & 0o777;
                if mode & 0o007 != 0 {
                    out.push(format!(
                        "{label} {} is open to every user (mode {mode:03o}); chmod 600 it",
                        path.display()
                    ));
                }
            }
            #[cfg(not(unix))]
            let _ = meta;
        }
    }
}

/// Whether `earlier` catches every request `later` could, making `later`
/// dead under first-match routing. Conservative: only flags certain cases.
fn shadows(earlier: &Route, later: &Route) -> bool {
    // If the earlier prefix accepts the later prefix itself, it accepts every
    // path the later one does: the boundary the later prefix needs lies past
    // the earlier prefix's end.
    if !prefix_matches(&earlier.path_prefix, &later.path_prefix) {
        return false;
    }
    if earlier.models.is_empty() {
        return true;
    }
    // A model-less later route also takes requests without a model, which a
    // model-filtered earlier route never does.
    !later.models.is_empty()
        && later
            .models
            .iter()
            .all(|g| earlier.models.iter().any(|e| e == "*" || e == g))
}

/// humantime formatting, so messages echo durations the way they are written.
fn hd(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

// ---------------------------------------------------------------------------
// Raw, file-shaped types
// ---------------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    defaults: RawLimits,
    #[serde(default)]
    upstreams: RawUpstreams,
    #[serde(default)]
    routes: Vec<RawRoute>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [server] table")]
struct RawServer {
    listen: Option<RawSocketAddr>,
    admin_listen: Option<RawSocketAddr>,
    max_request_body: Option<u64>,
    header_read_timeout: Option<RawDuration>,
    shutdown_grace: Option<RawDuration>,
    send_timeout: Option<RawDuration>,
    max_connections: Option<usize>,
    max_header_bytes: Option<usize>,
    max_headers: Option<usize>,
    http2_max_concurrent_streams: Option<u32>,
    tls: Option<RawTls>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [server.tls] table")]
struct RawTls {
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
}

/// The limit keys, as written in `[defaults]` or (via [`RawRoute::overrides`])
/// in a route. `None` means "inherit".
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [defaults] table")]
struct RawLimits {
    budget: Option<RawDuration>,
    max_budget: Option<RawDuration>,
    connect_timeout: Option<RawDuration>,
    first_token_timeout: Option<RawDuration>,
    idle_timeout: Option<RawDuration>,
    reserve: Option<RawDuration>,
    min_useful: Option<RawDuration>,
}

impl RawLimits {
    fn resolve(&self, base: &Limits) -> Limits {
        let pick = |v: Option<RawDuration>, d: Duration| v.map_or(d, |v| v.0);
        Limits {
            budget: pick(self.budget, base.budget),
            max_budget: pick(self.max_budget, base.max_budget),
            connect_timeout: pick(self.connect_timeout, base.connect_timeout),
            first_token_timeout: pick(self.first_token_timeout, base.first_token_timeout),
            idle_timeout: pick(self.idle_timeout, base.idle_timeout),
            reserve: pick(self.reserve, base.reserve),
            min_useful: pick(self.min_useful, base.min_useful),
        }
    }

    fn is_set(&self, key: &str) -> bool {
        match key {
            "budget" => self.budget.is_some(),
            "max_budget" => self.max_budget.is_some(),
            "connect_timeout" => self.connect_timeout.is_some(),
            "first_token_timeout" => self.first_token_timeout.is_some(),
            "idle_timeout" => self.idle_timeout.is_some(),
            "reserve" => self.reserve.is_some(),
            "min_useful" => self.min_useful.is_some(),
            _ => false,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum RawAuth {
    Bearer,
    XApiKey,
    None,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "an [upstreams.NAME] table")]
struct RawUpstream {
    url: Option<String>,
    api_key_env: Option<String>,
    api_key_file: Option<PathBuf>,
    auth: Option<RawAuth>,
    ca_file: Option<PathBuf>,
    propagate_budget: Option<bool>,
    model: Option<String>,
    expected_first_token: Option<RawDuration>,
    api: Option<RawApi>,
    include_usage: Option<bool>,
    pool_idle_timeout: Option<RawDuration>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
enum RawApi {
    #[serde(rename = "openai")]
    OpenAi,
    #[serde(rename = "anthropic")]
    Anthropic,
    #[serde(rename = "auto")]
    Auto,
}

/// `[upstreams.*]` kept in file order (a plain map would sort by name), so
/// that `Config::upstreams`, warnings and errors follow the file.
#[derive(Debug, Default)]
struct RawUpstreams(Vec<(String, RawUpstream)>);

impl<'de> Deserialize<'de> for RawUpstreams {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawUpstreams;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table of named upstreams, e.g. [upstreams.openai]")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                // TOML itself rejects duplicate keys, so no check here.
                while let Some((k, v)) = map.next_entry::<String, RawUpstream>()? {
                    out.push((k, v));
                }
                Ok(RawUpstreams(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Route keys are spelled out rather than `#[serde(flatten)]`ing `RawLimits`,
/// because serde cannot combine `flatten` with `deny_unknown_fields`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [[routes]] table")]
struct RawRoute {
    name: Option<String>,
    path_prefix: Option<String>,
    upstream: Option<String>,
    models: Option<Vec<String>>,
    retries: Option<u32>,
    retry_on: Option<Vec<RawRetryCause>>,
    fallbacks: Option<Vec<String>>,
    hedge_after: Option<RawDuration>,
    max_in_flight: Option<usize>,
    client_keys_env: Option<String>,
    client_keys_file: Option<PathBuf>,
    budget: Option<RawDuration>,
    max_budget: Option<RawDuration>,
    connect_timeout: Option<RawDuration>,
    first_token_timeout: Option<RawDuration>,
    idle_timeout: Option<RawDuration>,
    reserve: Option<RawDuration>,
    min_useful: Option<RawDuration>,
}

impl RawRoute {
    fn overrides(&self) -> RawLimits {
        RawLimits {
            budget: self.budget,
            max_budget: self.max_budget,
            connect_timeout: self.connect_timeout,
            first_token_timeout: self.first_token_timeout,
            idle_timeout: self.idle_timeout,
            reserve: self.reserve,
            min_useful: self.min_useful,
        }
    }
}

/// No duration in the file may exceed this (humantime's year is 365.25 days).
const MAX_DURATION: Duration = Duration::from_secs(31_557_600);

/// A humantime duration string. Hand-rolled rather than `humantime_serde` so
/// the error quotes the value and says why humantime rejected it.
#[derive(Debug, Clone, Copy)]
struct RawDuration(Duration);

#[derive(Debug, Clone, Copy, Deserialize)]
enum RawRetryCause {
    #[serde(rename = "connect")]
    Connect,
    #[serde(rename = "first_token")]
    FirstToken,
    #[serde(rename = "5xx")]
    Status5xx,
    #[serde(rename = "429")]
    Status429,
    #[serde(rename = "reset")]
    Reset,
}

impl From<RawRetryCause> for RetryCause {
    fn from(r: RawRetryCause) -> Self {
        match r {
            RawRetryCause::Connect => RetryCause::Connect,
            RawRetryCause::FirstToken => RetryCause::FirstToken,
            RawRetryCause::Status5xx => RetryCause::Status5xx,
            RawRetryCause::Status429 => RetryCause::Status429,
            RawRetryCause::Reset => RetryCause::Reset,
        }
    }
}

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"250ms\", \"8s\" or \"10m\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                let d = humantime::parse_duration(v)
                    .map_err(|e| E::custom(format!("invalid duration {v:?}: {e}")))?;
                // Deadlines are instants: an absurd duration would overflow them at run time.
                if d > MAX_DURATION {
                    return Err(E::custom(format!(
                        "invalid duration {v:?}: longer than the maximum of 1 year"
                    )));
                }
                Ok(RawDuration(d))
            }
        }
        d.deserialize_str(V)
    }
}

/// A socket address string, with an error that says what form is expected
/// (host names are not accepted: binding must not depend on DNS).
#[derive(Debug, Clone, Copy)]
struct RawSocketAddr(SocketAddr);

impl<'de> Deserialize<'de> for RawSocketAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawSocketAddr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an IP:port string such as \"127.0.0.1:8080\" or \"[::1]:8080\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                v.parse().map(RawSocketAddr).map_err(|_| {
                    E::custom(format!(
                        "invalid socket address {v:?}: expected IP:port such as \"127.0.0.1:8080\""
                    ))
                })
            }
        }
        d.deserialize_str(V)
    }
}

// ---------------------------------------------------------------------------
// Raw -> checked
// ---------------------------------------------------------------------------

const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    8080,
));
const DEFAULT_ADMIN_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    9090,
));
const DEFAULT_MAX_REQUEST_BODY: u64 = 10 * 1024 * 1024;
const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

const DEFAULT_LIMITS: Limits = Limits {
    budget: Duration::from_secs(60),
    max_budget: Duration::from_secs(600),
    connect_timeout: Duration::from_secs(2),
    first_token_timeout: Duration::from_secs(30),
    idle_timeout: Duration::from_secs(20),
    reserve: Duration::ZERO,
    min_useful: Duration::from_millis(100),
};

fn parse(text: &str, source: &str, base_dir: Option<&Path>) -> Result<Config, ConfigError> {
    let raw: RawConfig = toml::from_str(text).map_err(|e| syntax_error(text, source, &e))?;
    let mut config = build(raw, source, base_dir).map_err(|message| ConfigError::Invalid {
        source_name: source.to_owned(),
        message,
    })?;
    config.fingerprint = fingerprint(text);
    config.inlined_secrets = inlined_secrets(text);
    Ok(config)
}

/// FNV-1a of the text: stable across builds and platforms, unlike std's hasher.
fn fingerprint(text: &str) -> String {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

fn syntax_error(text: &str, source: &str, err: &toml::de::Error) -> ConfigError {
    // `message()` is already free of the snippet and caret that Display adds.
    // Some parser messages span lines ("invalid array\nexpected `]`"); keep
    // the Display to one line so it reads well in logs.
    let message = err
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(", ");
    match err.span() {
        Some(span) => {
            let (line, col) = line_col(text, span.start);
            ConfigError::Syntax {
                source_name: source.to_owned(),
                line,
                col,
                message,
            }
        }
        // Without a span there is no honest location to print.
        None => ConfigError::Invalid {
            source_name: source.to_owned(),
            message,
        },
    }
}

/// 1-based line and character column of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

/// Resolves and checks the raw tree. Errors are the message part of
/// [`ConfigError::Invalid`]; the first problem found wins, in file order:
/// server, upstreams, defaults, routes.
fn build(raw: RawConfig, source: &str, base_dir: Option<&Path>) -> Result<Config, String> {
    let server = build_server(&raw.server, base_dir)?;

    if raw.upstreams.0.is_empty() {
        return Err(
            "no upstreams defined: at least one [upstreams.NAME] table is required".to_owned(),
        );
    }
    let mut upstreams: Vec<Arc<UpstreamConfig>> = Vec::with_capacity(raw.upstreams.0.len());
    for (name, up) in raw.upstreams.0 {
        upstreams.push(Arc::new(build_upstream(name, up, base_dir)?));
    }

    let defaults = raw.defaults.resolve(&DEFAULT_LIMITS);
    check_limits(&defaults).map_err(|e| format!("defaults: {}", e.message))?;

    if raw.routes.is_empty() {
        return Err("no routes defined: at least one [[routes]] entry is required".to_owned());
    }
    let mut routes: Vec<Route> = Vec::with_capacity(raw.routes.len());
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (index, r) in raw.routes.into_iter().enumerate() {
        let route = build_route(index, r, &defaults, &upstreams, base_dir)?;
        if let Some(first) = seen.insert(route.name.clone(), index) {
            return Err(format!(
                "routes[{index}]: name {:?} is already used by routes[{first}]; route names must be unique",
                route.name
            ));
        }
        routes.push(route);
    }

    Ok(Config {
        server,
        upstreams,
        routes,
        source: source.to_owned(),
        fingerprint: String::new(),
        inlined_secrets: Vec::new(),
    })
}

fn build_server(raw: &RawServer, base_dir: Option<&Path>) -> Result<ServerConfig, String> {
    let resolve = |p: &Path| match base_dir {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p.to_path_buf(),
    };
    let tls = match &raw.tls {
        None => None,
        Some(t) => {
            let need = |v: &Option<PathBuf>, key: &str| match v {
                Some(p) if !p.as_os_str().is_empty() => Ok(resolve(p)),
                _ => Err(format!("server.tls: {key} is required (a PEM file)")),
            };
            Some(ServerTls {
                cert: need(&t.cert, "cert")?,
                key: need(&t.key, "key")?,
                client_ca: t.client_ca.as_deref().map(resolve),
            })
        }
    };
    let server = ServerConfig {
        max_header_bytes: raw.max_header_bytes.unwrap_or(64 * 1024),
        max_headers: raw.max_headers.unwrap_or(100),
        http2_max_concurrent_streams: raw.http2_max_concurrent_streams.unwrap_or(256),
        tls,
        listen: raw.listen.map_or(DEFAULT_LISTEN, |a| a.0),
        admin_listen: raw.admin_listen.map_or(DEFAULT_ADMIN_LISTEN, |a| a.0),
        max_request_body: raw.max_request_body.unwrap_or(DEFAULT_MAX_REQUEST_BODY),
        header_read_timeout: raw
            .header_read_timeout
            .map_or(DEFAULT_HEADER_READ_TIMEOUT, |d| d.0),
        shutdown_grace: raw.shutdown_grace.map_or(DEFAULT_SHUTDOWN_GRACE, |d| d.0),
        send_timeout: raw.send_timeout.map_or(DEFAULT_SEND_TIMEOUT, |d| d.0),
        max_connections: raw.max_connections,
    };
    if server.max_request_body == 0 {
        return Err("server: max_request_body must be greater than 0".to_owned());
    }
    if server.header_read_timeout.is_zero() {
        return Err("server: header_read_timeout must be greater than 0".to_owned());
    }
    if server.send_timeout.is_zero() {
        return Err("server: send_timeout must be greater than 0".to_owned());
    }
    // hyper needs room for at least one 8 KiB read.
    if server.max_header_bytes < 8192 {
        return Err(format!(
            "server: max_header_bytes ({}) must be at least 8192",
            server.max_header_bytes
        ));
    }
    if server.max_headers == 0 || server.http2_max_concurrent_streams == 0 {
        return Err(
            "server: max_headers and http2_max_concurrent_streams must be greater than 0"
                .to_owned(),
        );
    }
    if server.max_connections == Some(0) {
        return Err(
            "server: max_connections must be greater than 0 (omit it for no limit)".to_owned(),
        );
    }
    if let Some(n) = server.max_connections.filter(|&n| n > MAX_CONNECTIONS) {
        return Err(format!(
            "server: max_connections ({n}) must be at most {MAX_CONNECTIONS}"
        ));
    }
    // hyper sizes a header array per request from this: a huge value is memory, not safety.
    if server.max_headers > MAX_HEADERS {
        return Err(format!(
            "server: max_headers ({}) must be at most {MAX_HEADERS}",
            server.max_headers
        ));
    }
    // Both listeners would fail to bind at startup; say so now instead (port 0 picks two ports).
    if server.listen == server.admin_listen && server.listen.port() != 0 {
        return Err(format!(
            "server: listen and admin_listen must differ (both are {})",
            server.listen
        ));
    }
    Ok(server)
}

fn build_upstream(
    name: String,
    raw: RawUpstream,
    base_dir: Option<&Path>,
) -> Result<UpstreamConfig, String> {
    if name.is_empty() {
        return Err("upstreams: an upstream name must not be empty".to_owned());
    }
    let label = format!("upstream {name:?}");
    let url_text = raw.url.ok_or_else(|| format!("{label}: url is required"))?;
    let url = check_url(&url_text).map_err(|why| format!("{label}: url {url_text:?} {why}"))?;

    if let Some(var) = &raw.api_key_env {
        check_env_name(var).map_err(|why| format!("{label}: api_key_env {why}"))?;
    }
    if raw.api_key_env.is_some() && raw.api_key_file.is_some() {
        return Err(format!(
            "{label}: api_key_env and api_key_file are both set; use one"
        ));
    }
    let api_key_file = match raw.api_key_file {
        Some(p) if p.as_os_str().is_empty() => {
            return Err(format!("{label}: api_key_file must not be empty"));
        }
        other => other.map(|p| resolve_path(p, base_dir)),
    };
    let ca_file = match raw.ca_file {
        Some(p) if p.as_os_str().is_empty() => {
            return Err(format!("{label}: ca_file must not be empty"));
        }
        Some(p) if p.is_relative() => Some(match base_dir {
            Some(dir) => dir.join(p),
            None => p,
        }),
        other => other,
    };
    Ok(UpstreamConfig {
        name,
        url,
        api_key_env: raw.api_key_env,
        api_key_file,
        auth: match raw.auth {
            None | Some(RawAuth::Bearer) => AuthMode::Bearer,
            Some(RawAuth::XApiKey) => AuthMode::XApiKey,
            Some(RawAuth::None) => AuthMode::None,
        },
        ca_file,
        propagate_budget: raw.propagate_budget.unwrap_or(true),
        model: match raw.model {
            Some(m) if m.is_empty() => return Err(format!("{label}: model must not be empty")),
            other => other,
        },
        expected_first_token: match raw.expected_first_token {
            Some(d) if d.0.is_zero() => {
                return Err(format!(
                    "{label}: expected_first_token must be greater than 0"
                ))
            }
            other => other.map(|d| d.0),
        },
        api: match raw.api {
            None | Some(RawApi::Auto) => Api::Auto,
            Some(RawApi::OpenAi) => Api::OpenAi,
            Some(RawApi::Anthropic) => Api::Anthropic,
        },
        include_usage: match (raw.include_usage, raw.api) {
            (Some(true), Some(RawApi::Anthropic)) => {
                return Err(format!(
                    "{label}: include_usage asks OpenAI chat streams for their usage, but api is \"anthropic\" (Anthropic always reports it)"
                ))
            }
            (v, _) => v.unwrap_or(false),
        },
        pool_idle_timeout: match raw.pool_idle_timeout {
            Some(d) if d.0.is_zero() => {
                return Err(format!("{label}: pool_idle_timeout must be greater than 0"))
            }
            other => other.map_or(DEFAULT_POOL_IDLE_TIMEOUT, |d| d.0),
        },
    })
}

/// Checks an environment variable name; the error completes the sentence
/// `api_key_env …` (or `client_keys_env …`) and never echoes what looks like a key.
fn check_env_name(var: &str) -> Result<(), String> {
    // std::env lookups cannot represent these names; reject them here rather than have
    // the key silently never found.
    if var.is_empty() || var.contains(['=', '\0']) {
        return Err(format!(
            "{} is not a valid environment variable name",
            shown(var)
        ));
    }
    Ok(())
}

fn resolve_path(p: PathBuf, base_dir: Option<&Path>) -> PathBuf {
    match base_dir {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p,
    }
}

/// Whether a string from the config looks like a credential rather than the name of one:
/// a known provider key prefix, or a long random-looking token (letters of both cases and
/// digits, no separators that names, paths and URLs have).
pub fn looks_like_secret(v: &str) -> bool {
    const PREFIXES: [&str; 8] = [
        "sk-", "sk_", "rk-", "xai-", "gsk_", "AIza", "hf_", "Bearer ",
    ];
    if v.len() >= 12 && PREFIXES.iter().any(|p| v.starts_with(p)) {
        return true;
    }
    v.len() >= 32
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && v.bytes().any(|b| b.is_ascii_lowercase())
        && v.bytes().any(|b| b.is_ascii_uppercase())
        && v.bytes().any(|b| b.is_ascii_digit())
}

/// A config value as messages may show it: quoted, unless it looks like a key.
fn shown(v: &str) -> String {
    if looks_like_secret(v) {
        "(a value that looks like an API key, not shown)".to_owned()
    } else {
        format!("{v:?}")
    }
}

/// Warnings for string values anywhere in the file that look like inlined credentials.
/// Keys belong in the environment or a file (`api_key_env`, `api_key_file`,
/// `client_keys_env`, `client_keys_file`); the value itself is never repeated.
fn inlined_secrets(text: &str) -> Vec<String> {
    fn walk(path: &str, v: &toml::Value, out: &mut Vec<String>) {
        match v {
            toml::Value::String(s) if looks_like_secret(s) => out.push(format!(
                "{path} looks like an inlined API key; keep keys out of the config file (use api_key_env or api_key_file)"
            )),
            toml::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(&format!("{path}[{i}]"), item, out);
                }
            }
            toml::Value::Table(t) => {
                for (k, item) in t {
                    let sub = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                    walk(&sub, item, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Ok(table) = text.parse::<toml::Table>() {
        walk("", &toml::Value::Table(table), &mut out);
    }
    out
}

/// Parses and normalizes an upstream base URL; the error completes the
/// sentence `url "…" …`.
fn check_url(text: &str) -> Result<http::Uri, String> {
    // http::Uri has no notion of fragments, so catch them before it does
    // something surprising with the `#`.
    if text.contains('#') {
        return Err("must not have a fragment".to_owned());
    }
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("is not a valid URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err("must use http or https".to_owned()),
    }
    let authority = match uri.authority() {
        Some(a) if !a.host().is_empty() => a.clone(),
        _ => return Err("must include a host".to_owned()),
    };
    // The proxy sends its own credentials from api_key_env; userinfo in the
    // URL would otherwise be silently ignored.
    if authority.as_str().contains('@') {
        return Err("must not contain credentials (use api_key_env)".to_owned());
    }
    if uri.query().is_some() {
        return Err("must not have a query string".to_owned());
    }
    let path = uri.path();
    if path == "/" || !path.ends_with('/') {
        return Ok(uri);
    }
    let trimmed = match path.trim_end_matches('/') {
        "" => "/".to_owned(),
        t => t.to_owned(),
    };
    let mut parts = uri.into_parts();
    parts.path_and_query = Some(
        trimmed
            .parse()
            .map_err(|e| format!("is not a valid URL: {e}"))?,
    );
    http::Uri::from_parts(parts).map_err(|e| format!("is not a valid URL: {e}"))
}

fn build_route(
    index: usize,
    raw: RawRoute,
    defaults: &Limits,
    upstreams: &[Arc<UpstreamConfig>],
    base_dir: Option<&Path>,
) -> Result<Route, String> {
    let name = match raw.name.as_deref() {
        None => return Err(format!("routes[{index}]: name is required")),
        Some("") => return Err(format!("routes[{index}]: name must not be empty")),
        Some(n) => n.to_owned(),
    };
    let label = format!("route {name:?}");

    let path_prefix = raw
        .path_prefix
        .clone()
        .ok_or_else(|| format!("{label}: path_prefix is required"))?;
    if !path_prefix.starts_with('/') {
        return Err(format!(
            "{label}: path_prefix {path_prefix:?} must start with \"/\""
        ));
    }

    let upstream_name = raw
        .upstream
        .as_deref()
        .ok_or_else(|| format!("{label}: upstream is required"))?;
    let upstream = match upstreams.iter().find(|u| u.name == upstream_name) {
        Some(u) => Arc::clone(u),
        None => {
            let mut known: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
            known.sort_unstable();
            return Err(format!(
                "{label}: upstream {upstream_name:?} is not defined (known: {})",
                known.join(", ")
            ));
        }
    };

    let models = raw.models.clone().unwrap_or_default();
    if let Some(i) = models.iter().position(|m| m.is_empty()) {
        return Err(format!(
            "{label}: models[{i}] is empty; use \"*\" to match any model"
        ));
    }

    let overrides = raw.overrides();
    let limits = overrides.resolve(defaults);
    check_limits(&limits).map_err(|e| {
        // Name inherited values, or a complaint about a key the route never
        // set would be baffling.
        let inherited: Vec<&str> = e
            .keys
            .iter()
            .copied()
            .filter(|k| !overrides.is_set(k))
            .collect();
        match inherited.as_slice() {
            [] => format!("{label}: {}", e.message),
            [one] => format!("{label}: {}; {one} is inherited from [defaults]", e.message),
            many => format!(
                "{label}: {}; {} are inherited from [defaults]",
                e.message,
                many.join(" and ")
            ),
        }
    })?;

    let policy = build_policy(&label, &raw, &upstream, &limits, upstreams)?;
    let max_in_flight = match raw.max_in_flight {
        Some(0) => {
            return Err(format!(
                "{label}: max_in_flight must be greater than 0 (omit it for no limit)"
            ))
        }
        Some(n) if n > MAX_IN_FLIGHT => {
            return Err(format!(
                "{label}: max_in_flight ({n}) must be at most {MAX_IN_FLIGHT}"
            ))
        }
        other => other,
    };
    let client_auth =
        build_client_auth(&label, raw.client_keys_env, raw.client_keys_file, base_dir)?;
    Ok(Route {
        name,
        path_prefix,
        models,
        upstream,
        limits,
        policy,
        max_in_flight,
        client_auth,
    })
}

/// Far beyond any real route; keeps the admission semaphore within its bounds.
const MAX_IN_FLIGHT: usize = 1_000_000;
/// Far beyond any descriptor limit; keeps the connection semaphore within its bounds.
const MAX_CONNECTIONS: usize = 1_000_000;
/// Envoy's own ceiling for headers per request is 100 by default; 1000 leaves room.
const MAX_HEADERS: usize = 1000;

fn build_client_auth(
    label: &str,
    env: Option<String>,
    file: Option<PathBuf>,
    base_dir: Option<&Path>,
) -> Result<Option<ClientAuth>, String> {
    if let Some(var) = &env {
        check_env_name(var).map_err(|why| format!("{label}: client_keys_env {why}"))?;
    }
    let file = match file {
        Some(p) if p.as_os_str().is_empty() => {
            return Err(format!("{label}: client_keys_file must not be empty"));
        }
        other => other.map(|p| resolve_path(p, base_dir)),
    };
    if env.is_none() && file.is_none() {
        return Ok(None);
    }
    Ok(Some(ClientAuth { env, file }))
}

struct LimitsError {
    message: String,
    /// Keys whose values the message is about.
    keys: &'static [&'static str],
}

/// Retries are bounded so that a typo cannot turn one request into hundreds of calls.
const MAX_RETRIES: u32 = 10;

fn build_policy(
    label: &str,
    raw: &RawRoute,
    upstream: &Arc<UpstreamConfig>,
    limits: &Limits,
    upstreams: &[Arc<UpstreamConfig>],
) -> Result<Policy, String> {
    let retries = raw.retries.unwrap_or(0);
    if retries > MAX_RETRIES {
        return Err(format!(
            "{label}: retries ({retries}) must be at most {MAX_RETRIES}"
        ));
    }
    let retry_on = match &raw.retry_on {
        None => RetryOn::ALL,
        Some(list) => list
            .iter()
            .fold(RetryOn(0), |set, c| set.with(RetryCause::from(*c))),
    };
    let mut fallbacks: Vec<Arc<UpstreamConfig>> = Vec::new();
    for (i, name) in raw.fallbacks.iter().flatten().enumerate() {
        let Some(up) = upstreams.iter().find(|u| &u.name == name) else {
            let mut known: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
            known.sort_unstable();
            return Err(format!(
                "{label}: fallbacks[{i}] names upstream {name:?}, which is not defined (known: {})",
                known.join(", ")
            ));
        };
        if up.name == upstream.name || fallbacks.iter().any(|f| f.name == up.name) {
            return Err(format!(
                "{label}: fallbacks[{i}] ({name:?}) is already in the route's chain; each upstream is tried once (use retries for more attempts)"
            ));
        }
        fallbacks.push(Arc::clone(up));
    }
    let hedge_after = raw.hedge_after.map(|d| d.0);
    if let Some(h) = hedge_after {
        if fallbacks.is_empty() {
            return Err(format!(
                "{label}: hedge_after needs at least one upstream in fallbacks to hedge with"
            ));
        }
        if h.is_zero() || h >= limits.first_token_timeout {
            return Err(format!(
                "{label}: hedge_after ({}) must be greater than 0 and less than first_token_timeout ({})",
                hd(h),
                hd(limits.first_token_timeout)
            ));
        }
    }
    Ok(Policy {
        retries,
        retry_on,
        fallbacks,
        hedge_after,
    })
}

fn check_limits(l: &Limits) -> Result<(), LimitsError> {
    let fail = |keys: &'static [&'static str], message: String| Err(LimitsError { message, keys });
    let must_be_positive: [(&'static [&'static str], Duration); 4] = [
        (&["budget"], l.budget),
        (&["connect_timeout"], l.connect_timeout),
        (&["first_token_timeout"], l.first_token_timeout),
        (&["idle_timeout"], l.idle_timeout),
    ];
    for (keys, value) in must_be_positive {
        if value.is_zero() {
            return fail(keys, format!("{} must be greater than 0", keys.join("")));
        }
    }
    if l.budget > l.max_budget {
        return fail(
            &["budget", "max_budget"],
            format!(
                "budget ({}) must not exceed max_budget ({})",
                hd(l.budget),
                hd(l.max_budget)
            ),
        );
    }
    if l.first_token_timeout > l.budget {
        return fail(
            &["first_token_timeout", "budget"],
            format!(
                "first_token_timeout ({}) must not exceed budget ({})",
                hd(l.first_token_timeout),
                hd(l.budget)
            ),
        );
    }
    // Saturate: an absurd sum must fail the check, not wrap or panic.
    let held_back = l.reserve.saturating_add(l.min_useful);
    if held_back >= l.budget {
        return fail(
            &["reserve", "min_useful", "budget"],
            format!(
                "reserve + min_useful ({} + {} = {}) must be less than budget ({})",
                hd(l.reserve),
                hd(l.min_useful),
                hd(held_back),
                hd(l.budget)
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
[server]
listen = "0.0.0.0:8000"
admin_listen = "127.0.0.1:9100"
max_request_body = 2048
header_read_timeout = "5s"
shutdown_grace = "1m"
send_timeout = "20s"
max_connections = 500

[defaults]
budget = "45s"
first_token_timeout = "15s"
reserve = "250ms"

[upstreams.openai]
url = "https://api.openai.com"
api_key_env = "OPENAI_API_KEY"
ca_file = "certs/ca.pem"

[upstreams.anthropic]
url = "http://127.0.0.1:8089/anthropic/"
api_key_env = "ANTHROPIC_API_KEY"
auth = "x-api-key"
propagate_budget = false

[[routes]]
name = "reasoning"
path_prefix = "/v1/chat/completions"
upstream = "openai"
models = ["o3*", "gpt-5?"]
budget = "5m"
first_token_timeout = "2m"

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "openai"
budget = "8s"
first_token_timeout = "5s"
idle_timeout = "3s"

[[routes]]
name = "messages"
path_prefix = "/v1/messages"
upstream = "anthropic"
"#;

    /// Minimal valid config; tests append route keys or further tables.
    const BASE: &str = r#"[upstreams.openai]
url = "https://api.openai.com"

[upstreams.anthropic]
url = "https://api.anthropic.com"
auth = "x-api-key"

[[routes]]
name = "chat"
path_prefix = "/v1/chat"
upstream = "openai"
"#;

    fn load(text: &str) -> Config {
        match Config::from_toml(text, "config/hourglass.toml") {
            Ok(c) => c,
            Err(e) => panic!("expected a valid config, got: {e}"),
        }
    }

    fn err(text: &str) -> String {
        match Config::from_toml(text, "t.toml") {
            Ok(_) => panic!("expected an error for:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    fn with_route_keys(keys: &str) -> String {
        format!("{BASE}{keys}\n")
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    // --- valid configs -----------------------------------------------------

    #[test]
    fn full_example_resolves() {
        let c = load(FULL);
        assert_eq!(c.source, "config/hourglass.toml");
        assert_eq!(
            c.server,
            ServerConfig {
                listen: "0.0.0.0:8000".parse().unwrap(),
                admin_listen: "127.0.0.1:9100".parse().unwrap(),
                max_request_body: 2048,
                header_read_timeout: secs(5),
                shutdown_grace: secs(60),
                send_timeout: secs(20),
                max_connections: Some(500),
                max_header_bytes: 64 * 1024,
                max_headers: 100,
                http2_max_concurrent_streams: 256,
                tls: None,
            }
        );

        // File order, not alphabetical.
        let names: Vec<&str> = c.upstreams.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["openai", "anthropic"]);
        let openai = &c.upstreams[0];
        assert_eq!(openai.url, "https://api.openai.com/");
        assert_eq!(openai.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
        assert_eq!(openai.auth, AuthMode::Bearer);
        assert_eq!(
            openai.ca_file.as_deref(),
            Some(Path::new("config/certs/ca.pem"))
        );
        assert!(openai.propagate_budget);
        let anthropic = &c.upstreams[1];
        assert_eq!(anthropic.url.path(), "/anthropic", "trailing slash trimmed");
        assert_eq!(anthropic.auth, AuthMode::XApiKey);
        assert_eq!(anthropic.ca_file, None);
        assert!(!anthropic.propagate_budget);

        let names: Vec<&str> = c.routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["reasoning", "chat", "messages"]);
        let defaults = Limits {
            budget: secs(45),
            max_budget: secs(600),
            connect_timeout: secs(2),
            first_token_timeout: secs(15),
            idle_timeout: secs(20),
            reserve: Duration::from_millis(250),
            min_useful: Duration::from_millis(100),
        };

        let reasoning = &c.routes[0];
        assert_eq!(reasoning.models, ["o3*", "gpt-5?"]);
        assert!(reasoning.needs_model());
        assert!(Arc::ptr_eq(&reasoning.upstream, openai));
        assert_eq!(
            reasoning.limits,
            Limits {
                budget: secs(300),
                first_token_timeout: secs(120),
                ..defaults
            }
        );

        let chat = &c.routes[1];
        assert!(chat.models.is_empty());
        assert!(!chat.needs_model());
        assert!(Arc::ptr_eq(&chat.upstream, openai));
        assert_eq!(
            chat.limits,
            Limits {
                budget: secs(8),
                first_token_timeout: secs(5),
                idle_timeout: secs(3),
                ..defaults
            }
        );

        let messages = &c.routes[2];
        assert_eq!(messages.path_prefix, "/v1/messages");
        assert!(Arc::ptr_eq(&messages.upstream, anthropic));
        assert_eq!(messages.limits, defaults);
    }

    #[test]
    fn built_in_defaults_apply() {
        let c = load(BASE);
        assert_eq!(
            c.server,
            ServerConfig {
                listen: "127.0.0.1:8080".parse().unwrap(),
                admin_listen: "127.0.0.1:9090".parse().unwrap(),
                max_request_body: 10 * 1024 * 1024,
                header_read_timeout: secs(10),
                shutdown_grace: secs(30),
                send_timeout: secs(60),
                max_connections: None,
                max_header_bytes: 64 * 1024,
                max_headers: 100,
                http2_max_concurrent_streams: 256,
                tls: None,
            }
        );
        assert_eq!(
            c.routes[0].limits,
            Limits {
                budget: secs(60),
                max_budget: secs(600),
                connect_timeout: secs(2),
                first_token_timeout: secs(30),
                idle_timeout: secs(20),
                reserve: Duration::ZERO,
                min_useful: Duration::from_millis(100),
            }
        );
    }

    #[test]
    fn load_reads_file_and_resolves_ca_file_next_to_it() {
        let dir = tempfile::Builder::new()
            .prefix("hourglass-config-test-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("hourglass.toml");
        let text = BASE.replace(
            "url = \"https://api.openai.com\"",
            "url = \"https://api.openai.com\"\nca_file = \"ca.pem\"",
        );
        std::fs::write(&path, text).unwrap();
        let c = Config::load(&path).unwrap();
        assert_eq!(c.source, path.display().to_string());
        assert_eq!(c.upstreams[0].ca_file, Some(dir.path().join("ca.pem")));
        // The CA file does not exist yet: a warning, not an error.
        assert!(c.warnings().iter().any(|w| w.contains("ca_file")));
        std::fs::write(dir.path().join("ca.pem"), "pem").unwrap();
        assert!(!c.warnings().iter().any(|w| w.contains("ca_file")));
        dir.close().unwrap();
    }

    #[test]
    fn absolute_ca_file_is_kept() {
        let text = BASE.replace(
            "url = \"https://api.openai.com\"",
            "url = \"https://api.openai.com\"\nca_file = \"/etc/ssl/ca.pem\"",
        );
        let c = load(&text);
        assert_eq!(
            c.upstreams[0].ca_file.as_deref(),
            Some(Path::new("/etc/ssl/ca.pem"))
        );
    }

    #[test]
    fn io_error_names_the_path() {
        let path = std::env::temp_dir().join("hourglass-config-test-does-not-exist.toml");
        let e = Config::load(&path).unwrap_err();
        assert!(
            matches!(&e, ConfigError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
        );
        let shown = e.to_string();
        assert!(
            shown.starts_with(&format!("{}: ", path.display())),
            "{shown}"
        );
    }

    // --- Invalid errors ------------------------------------------------------

    #[test]
    fn first_token_timeout_over_budget() {
        assert_eq!(
            err(&with_route_keys(
                "budget = \"8s\"\nfirst_token_timeout = \"40s\""
            )),
            "t.toml: route \"chat\": first_token_timeout (40s) must not exceed budget (8s)"
        );
    }

    #[test]
    fn inherited_values_are_pointed_out() {
        assert_eq!(
            err(&with_route_keys("budget = \"8s\"")),
            "t.toml: route \"chat\": first_token_timeout (30s) must not exceed budget (8s); \
             first_token_timeout is inherited from [defaults]"
        );
        assert_eq!(
            err(&with_route_keys(
                "budget = \"100ms\"\nfirst_token_timeout = \"100ms\""
            )),
            "t.toml: route \"chat\": reserve + min_useful (0s + 100ms = 100ms) must be less than \
             budget (100ms); reserve and min_useful are inherited from [defaults]"
        );
    }

    #[test]
    fn unknown_upstream_lists_known_ones_sorted() {
        let text = BASE.replace("upstream = \"openai\"", "upstream = \"anthropc\"");
        assert_eq!(
            err(&text),
            "t.toml: route \"chat\": upstream \"anthropc\" is not defined (known: anthropic, openai)"
        );
    }

    #[test]
    fn upstream_url_errors() {
        let cases = [
            ("ftp://x", "must use http or https"),
            ("api.openai.com", "must use http or https"),
            ("http://:80", "must include a host"),
            ("http://a/v1?x=1", "must not have a query string"),
            ("http://a/v1#top", "must not have a fragment"),
            (
                "https://user:pw@a",
                "must not contain credentials (use api_key_env)",
            ),
            ("http://a b", "is not a valid URL: invalid uri character"),
        ];
        for (url, why) in cases {
            let text = BASE.replace("https://api.openai.com", url);
            assert_eq!(
                err(&text),
                format!("t.toml: upstream \"openai\": url \"{url}\" {why}")
            );
        }
        let text = BASE.replace("url = \"https://api.openai.com\"", "api_key_env = \"K\"");
        assert_eq!(err(&text), "t.toml: upstream \"openai\": url is required");
    }

    #[test]
    fn pool_idle_timeout_defaults_to_90s_and_must_not_be_zero() {
        assert_eq!(load(BASE).upstreams[0].pool_idle_timeout, secs(90));
        let set = |v: &str| {
            BASE.replace(
                "url = \"https://api.openai.com\"",
                &format!("url = \"https://api.openai.com\"\npool_idle_timeout = \"{v}\""),
            )
        };
        assert_eq!(load(&set("4s")).upstreams[0].pool_idle_timeout, secs(4));
        assert_eq!(
            err(&set("0s")),
            "t.toml: upstream \"openai\": pool_idle_timeout must be greater than 0"
        );
    }

    #[test]
    fn upstream_url_path_prefix_is_kept_without_trailing_slash() {
        for (given, path) in [
            ("http://127.0.0.1:8089/openai", "/openai"),
            ("http://127.0.0.1:8089/openai/", "/openai"),
            ("http://127.0.0.1:8089/", "/"),
            ("http://127.0.0.1:8089//", "/"),
            ("http://127.0.0.1:8089", "/"),
        ] {
            let c = load(&BASE.replace("https://api.openai.com", given));
            assert_eq!(c.upstreams[0].url.path(), path, "{given}");
            assert_eq!(c.upstreams[0].url.authority().unwrap(), "127.0.0.1:8089");
        }
    }

    #[test]
    fn other_upstream_errors() {
        let text = BASE.replace(
            "url = \"https://api.openai.com\"",
            "url = \"https://api.openai.com\"\napi_key_env = \"\"",
        );
        assert_eq!(
            err(&text),
            "t.toml: upstream \"openai\": api_key_env \"\" is not a valid environment variable name"
        );
        let text = BASE.replace(
            "url = \"https://api.openai.com\"",
            "url = \"https://api.openai.com\"\nca_file = \"\"",
        );
        assert_eq!(
            err(&text),
            "t.toml: upstream \"openai\": ca_file must not be empty"
        );
        let text = format!("{BASE}[upstreams.\"\"]\nurl = \"http://a\"\n");
        assert_eq!(
            err(&text),
            "t.toml: upstreams: an upstream name must not be empty"
        );
    }

    #[test]
    fn no_upstreams_and_no_routes() {
        assert_eq!(
            err("[[routes]]\nname = \"chat\"\npath_prefix = \"/\"\nupstream = \"x\"\n"),
            "t.toml: no upstreams defined: at least one [upstreams.NAME] table is required"
        );
        assert_eq!(
            err(""),
            "t.toml: no upstreams defined: at least one [upstreams.NAME] table is required"
        );
        assert_eq!(
            err("[upstreams.openai]\nurl = \"https://api.openai.com\"\n"),
            "t.toml: no routes defined: at least one [[routes]] entry is required"
        );
    }

    #[test]
    fn route_identity_errors() {
        let dup = format!(
            "{BASE}\n[[routes]]\nname = \"other\"\npath_prefix = \"/a\"\nupstream = \"openai\"\n\n\
             [[routes]]\nname = \"chat\"\npath_prefix = \"/b\"\nupstream = \"openai\"\n"
        );
        assert_eq!(
            err(&dup),
            "t.toml: routes[2]: name \"chat\" is already used by routes[0]; route names must be unique"
        );
        let unnamed = format!("{BASE}\n[[routes]]\npath_prefix = \"/a\"\nupstream = \"openai\"\n");
        assert_eq!(err(&unnamed), "t.toml: routes[1]: name is required");
        let empty = format!("{BASE}\n[[routes]]\nname = \"\"\npath_prefix = \"/a\"\n");
        assert_eq!(err(&empty), "t.toml: routes[1]: name must not be empty");
        let no_prefix = format!("{BASE}\n[[routes]]\nname = \"x\"\nupstream = \"openai\"\n");
        assert_eq!(
            err(&no_prefix),
            "t.toml: route \"x\": path_prefix is required"
        );
        let no_upstream = format!("{BASE}\n[[routes]]\nname = \"x\"\npath_prefix = \"/x\"\n");
        assert_eq!(
            err(&no_upstream),
            "t.toml: route \"x\": upstream is required"
        );
        let text = BASE.replace("path_prefix = \"/v1/chat\"", "path_prefix = \"v1/chat\"");
        assert_eq!(
            err(&text),
            "t.toml: route \"chat\": path_prefix \"v1/chat\" must start with \"/\""
        );
    }

    #[test]
    fn empty_model_glob() {
        assert_eq!(
            err(&with_route_keys("models = [\"o3*\", \"\"]")),
            "t.toml: route \"chat\": models[1] is empty; use \"*\" to match any model"
        );
    }

    #[test]
    fn route_limit_errors() {
        let cases = [
            (
                "budget = \"0s\"",
                "budget must be greater than 0",
            ),
            (
                "budget = \"8s\"\nmax_budget = \"5s\"\nfirst_token_timeout = \"1s\"",
                "budget (8s) must not exceed max_budget (5s)",
            ),
            (
                "budget = \"10m 1s\"",
                "budget (10m 1s) must not exceed max_budget (10m); max_budget is inherited from [defaults]",
            ),
            (
                "budget = \"1s\"\nfirst_token_timeout = \"1s\"\nreserve = \"900ms\"\nmin_useful = \"100ms\"",
                "reserve + min_useful (900ms + 100ms = 1s) must be less than budget (1s)",
            ),
            (
                "connect_timeout = \"0ms\"",
                "connect_timeout must be greater than 0",
            ),
            (
                "first_token_timeout = \"0s\"",
                "first_token_timeout must be greater than 0",
            ),
            ("idle_timeout = \"0s\"", "idle_timeout must be greater than 0"),
        ];
        for (keys, message) in cases {
            assert_eq!(
                err(&with_route_keys(keys)),
                format!("t.toml: route \"chat\": {message}"),
                "{keys}"
            );
        }
    }

    #[test]
    fn defaults_are_checked_themselves() {
        let cases = [
            ("budget = \"0s\"", "budget must be greater than 0"),
            (
                "budget = \"8s\"\nmax_budget = \"5s\"",
                "budget (8s) must not exceed max_budget (5s)",
            ),
            (
                "first_token_timeout = \"2m\"",
                "first_token_timeout (2m) must not exceed budget (1m)",
            ),
            (
                "reserve = \"1m\"",
                "reserve + min_useful (1m + 100ms = 1m 100ms) must be less than budget (1m)",
            ),
            (
                "idle_timeout = \"0s\"",
                "idle_timeout must be greater than 0",
            ),
        ];
        for (keys, message) in cases {
            let text = format!("[defaults]\n{keys}\n{BASE}");
            assert_eq!(err(&text), format!("t.toml: defaults: {message}"), "{keys}");
        }
    }

    #[test]
    fn route_override_can_repair_nothing_in_defaults() {
        // Defaults are validated even if every route overrides the bad key,
        // because a route added later would silently inherit it.
        let text = format!("[defaults]\nbudget = \"0s\"\n{BASE}budget = \"5s\"\n");
        assert_eq!(
            err(&text),
            "t.toml: defaults: budget must be greater than 0"
        );
    }

    #[test]
    fn server_errors() {
        let cases = [
            (
                "max_request_body = 0",
                "max_request_body must be greater than 0",
            ),
            (
                "max_connections = 0",
                "max_connections must be greater than 0 (omit it for no limit)",
            ),
            (
                "max_connections = 2000000000000",
                "max_connections (2000000000000) must be at most 1000000",
            ),
            (
                "max_headers = 5000",
                "max_headers (5000) must be at most 1000",
            ),
            (
                "send_timeout = \"0s\"",
                "send_timeout must be greater than 0",
            ),
            (
                "header_read_timeout = \"0s\"",
                "header_read_timeout must be greater than 0",
            ),
            (
                "listen = \"127.0.0.1:9000\"\nadmin_listen = \"127.0.0.1:9000\"",
                "listen and admin_listen must differ (both are 127.0.0.1:9000)",
            ),
        ];
        for (keys, message) in cases {
            let text = format!("[server]\n{keys}\n{BASE}");
            assert_eq!(err(&text), format!("t.toml: server: {message}"), "{keys}");
        }
    }

    // --- Syntax errors -------------------------------------------------------

    fn syntax(text: &str) -> (usize, usize, String) {
        match Config::from_toml(text, "t.toml") {
            Err(ConfigError::Syntax {
                source_name,
                line,
                col,
                message,
            }) => {
                assert_eq!(source_name, "t.toml");
                (line, col, message)
            }
            other => panic!("expected a syntax error, got {other:?}"),
        }
    }

    #[test]
    fn toml_syntax_error_location() {
        let text = format!("{BASE}budget = \"8s\n");
        let (line, col, message) = syntax(&text);
        assert_eq!((line, col), (12, 13), "{message}");
        assert!(
            !message.contains('\n') && !message.contains('^'),
            "{message}"
        );
        let shown = Config::from_toml(&text, "t.toml").unwrap_err().to_string();
        assert!(shown.starts_with("t.toml:12:13: "), "{shown}");
    }

    #[test]
    fn unknown_keys_are_located() {
        let (line, col, message) = syntax(&with_route_keys("  first_token_timout = \"5s\""));
        assert_eq!((line, col), (12, 3));
        assert!(
            message.starts_with("unknown field `first_token_timout`, expected one of"),
            "{message}"
        );

        let (line, col, message) = syntax(&format!(
            "[server]\nlisten = \"127.0.0.1:1\"\nport = 1\n{BASE}"
        ));
        assert_eq!((line, col), (3, 1));
        assert!(message.starts_with("unknown field `port`"), "{message}");

        let (line, col, _) = syntax(&format!("[defaults]\ntimeout = \"1s\"\n{BASE}"));
        assert_eq!((line, col), (2, 1));

        let (line, col, _) = syntax(&format!(
            "{BASE}[upstreams.extra]\nurl = \"http://a\"\nkey = \"k\"\n"
        ));
        assert_eq!((line, col), (14, 1));

        let (line, col, message) = syntax(&format!("routing = 1\n{BASE}"));
        assert_eq!((line, col), (1, 1));
        assert!(message.starts_with("unknown field `routing`"), "{message}");
    }

    #[test]
    fn bad_values_are_located() {
        let (line, col, message) = syntax(&with_route_keys("budget = \"8 parsecs\""));
        assert_eq!((line, col), (12, 10));
        assert!(
            message.starts_with("invalid duration \"8 parsecs\": unknown time unit"),
            "{message}"
        );

        let (line, col, message) = syntax(&with_route_keys("budget = 8"));
        assert_eq!((line, col), (12, 10));
        assert_eq!(
            message,
            "invalid type: integer `8`, expected a duration string such as \"250ms\", \"8s\" or \"10m\""
        );

        let (line, col, message) = syntax(&format!("[server]\nlisten = \"localhost:80\"\n{BASE}"));
        assert_eq!((line, col), (2, 10));
        assert_eq!(
            message,
            "invalid socket address \"localhost:80\": expected IP:port such as \"127.0.0.1:8080\""
        );

        let text = BASE.replace("auth = \"x-api-key\"", "auth = \"basic\"");
        let (line, col, message) = syntax(&text);
        assert_eq!((line, col), (6, 8));
        assert_eq!(
            message,
            "unknown variant `basic`, expected one of `bearer`, `x-api-key`, `none`"
        );
    }

    #[test]
    fn columns_count_characters_not_bytes() {
        assert_eq!(line_col("ab\ncé=x", 6), (2, 3));
        assert_eq!(line_col("", 0), (1, 1));
        assert_eq!(line_col("abc", 99), (1, 4));
        // Inside a multi-byte char: clamp back to its start.
        assert_eq!(line_col("é", 1), (1, 1));
    }

    // --- glob_match ----------------------------------------------------------

    #[test]
    fn glob_cases() {
        let yes = [
            ("o3*", "o3"),
            ("o3*", "o3-mini"),
            ("*mini", "gpt-4o-mini"),
            ("*mini", "mini"),
            ("gpt-?o", "gpt-4o"),
            ("*", ""),
            ("*", "anything"),
            ("", ""),
            ("a*b*c", "aXXbYYc"),
            ("*a*", "banana"),
            ("?", "é"),
            ("claude-*-4?", "claude-opus-45"),
            ("**", "x"),
        ];
        for (p, t) in yes {
            assert!(glob_match(p, t), "{p:?} should match {t:?}");
        }
        let no = [
            ("o3*", "gpt-o3"),
            ("*mini", "gpt-4o-mini-2024"),
            ("gpt-?o", "gpt-4"),
            ("gpt-?o", "gpt-45o"),
            ("", "x"),
            ("?", ""),
            ("?", "ab"),
            ("a*b*c", "aXXbYY"),
            ("O3*", "o3"),
        ];
        for (p, t) in no {
            assert!(!glob_match(p, t), "{p:?} should not match {t:?}");
        }
    }

    #[test]
    fn glob_has_no_pathological_case() {
        let long = "a".repeat(100_000);
        let started = std::time::Instant::now();
        assert!(!glob_match("a*a*a*a*a*b", &long));
        assert!(glob_match("a*a*a*a*a*a", &long));
        assert!(!glob_match(&"*a".repeat(50), &"a".repeat(49)));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    // --- Route::matches ------------------------------------------------------

    fn route(prefix: &str, models: &[&str]) -> Route {
        let c = load(BASE);
        Route {
            path_prefix: prefix.to_owned(),
            models: models.iter().map(|m| (*m).to_owned()).collect(),
            ..c.routes[0].clone()
        }
    }

    #[test]
    fn prefix_respects_segment_boundaries() {
        let r = route("/v1/chat", &[]);
        assert!(r.matches("/v1/chat", None));
        assert!(r.matches("/v1/chat/completions", None));
        assert!(r.matches("/v1/chat?stream=true", Some("gpt-4o")));
        assert!(!r.matches("/v1/chatter", None));
        assert!(!r.matches("/v1/cha", None));
        assert!(!r.matches("/v2/chat", None));

        let slash = route("/v1/chat/", &[]);
        assert!(slash.matches("/v1/chat/x", None));
        assert!(!slash.matches("/v1/chat", None));

        let root = route("/", &[]);
        assert!(root.matches("/", None));
        assert!(root.matches("/anything/at/all", None));
    }

    #[test]
    fn models_filter_requires_a_matching_model() {
        let r = route("/v1/chat", &["o3*", "gpt-5?"]);
        assert!(r.matches("/v1/chat", Some("o3-pro")));
        assert!(r.matches("/v1/chat", Some("gpt-5o")));
        assert!(!r.matches("/v1/chat", Some("gpt-4o")));
        assert!(!r.matches("/v1/chat", None));
        assert!(!r.matches("/v1/chatter", Some("o3")));
    }

    // --- describe & warnings -------------------------------------------------

    #[test]
    fn describe_lists_every_resolved_value() {
        let c = load(FULL);
        let d = c.describe();
        for needle in [
            "config config/hourglass.toml",
            "listen: 0.0.0.0:8000",
            "admin_listen: 127.0.0.1:9100",
            "max_request_body: 2048 bytes",
            "header_read_timeout: 5s",
            "shutdown_grace: 1m",
            "send_timeout: 20s",
            "max_connections: 500",
        ] {
            assert!(d.contains(needle), "missing {needle:?} in:\n{d}");
        }
        let block = |name: &str| -> String {
            let start = d.find(&format!("route \"{name}\"\n")).unwrap();
            let rest = &d[start + 1..];
            let end = rest.find("\nroute \"").map_or(rest.len(), |i| i + 1);
            rest[..end].to_owned()
        };
        let reasoning = block("reasoning");
        for needle in [
            "path_prefix: /v1/chat/completions",
            "models: \"o3*\", \"gpt-5?\"",
            "upstream: openai (https://api.openai.com/, auth bearer, api_key_env OPENAI_API_KEY, \
             ca_file config/certs/ca.pem, propagate_budget true)",
            "budget: 5m\n",
            "max_budget: 10m\n",
            "connect_timeout: 2s\n",
            "first_token_timeout: 2m\n",
            "idle_timeout: 20s\n",
            "reserve: 250ms\n",
            "min_useful: 100ms\n",
        ] {
            assert!(
                reasoning.contains(needle),
                "missing {needle:?} in:\n{reasoning}"
            );
        }
        let chat = block("chat");
        for needle in [
            "models: any",
            "budget: 8s\n",
            "first_token_timeout: 5s\n",
            "idle_timeout: 3s\n",
        ] {
            assert!(chat.contains(needle), "missing {needle:?} in:\n{chat}");
        }
        let messages = block("messages");
        for needle in [
            "path_prefix: /v1/messages",
            "upstream: anthropic (http://127.0.0.1:8089/anthropic, auth x-api-key, \
             api_key_env ANTHROPIC_API_KEY, propagate_budget false)",
            "budget: 45s\n",
            "first_token_timeout: 15s\n",
        ] {
            assert!(
                messages.contains(needle),
                "missing {needle:?} in:\n{messages}"
            );
        }
        // File order.
        let pos = |n: &str| d.find(&format!("route \"{n}\"")).unwrap();
        assert!(pos("reasoning") < pos("chat") && pos("chat") < pos("messages"));
    }

    #[test]
    fn warnings_cover_environment_and_layout() {
        let text = format!(
            "{}\n[upstreams.spare]\nurl = \"http://127.0.0.1:1\"\napi_key_env = \"SPARE_KEY\"\n\
             auth = \"none\"\nca_file = \"/nonexistent/ca.pem\"\n\n\
             [[routes]]\nname = \"late\"\npath_prefix = \"/v1/chat/completions/x\"\nupstream = \"openai\"\n",
            FULL.replace("ca_file = \"certs/ca.pem\"\n", "")
        );
        let c = load(&text);
        let env = |name: &str| match name {
            "ANTHROPIC_API_KEY" => Some(OsString::new()),
            _ => None,
        };
        let w = c.warnings_with(&env);
        assert_eq!(
            w,
            [
                "upstream \"openai\": api_key_env OPENAI_API_KEY is not set; the client's own credentials will be passed through",
                "upstream \"anthropic\": api_key_env ANTHROPIC_API_KEY is set but empty",
                "upstream \"spare\": api_key_env SPARE_KEY is ignored because auth is \"none\"",
                "upstream \"spare\": ca_file is ignored because url http://127.0.0.1:1/ uses http",
                "upstream \"spare\" is not used by any route",
                "route \"late\" is unreachable: route \"chat\" comes first and matches every request it would",
            ]
        );

        let set = |_: &str| Some(OsString::from("sk-test"));
        assert!(load(BASE)
            .warnings_with(&set)
            .iter()
            .all(|w| !w.contains("api_key_env")));
    }

    #[test]
    fn shadowing_considers_models() {
        let any = route("/v1", &[]);
        let o3 = route("/v1/chat", &["o3*"]);
        let o3_and_gpt = route("/v1/chat", &["o3*", "gpt*"]);
        let star = route("/v1/chat", &["*"]);
        assert!(shadows(&any, &o3));
        assert!(!shadows(&o3, &any));
        assert!(shadows(&o3_and_gpt, &o3));
        assert!(!shadows(&o3, &o3_and_gpt));
        assert!(shadows(&star, &o3_and_gpt));
        // A model-less route also serves requests without a model.
        assert!(!shadows(&star, &route("/v1/chat", &[])));
        assert!(!shadows(
            &route("/v1/chat", &[]),
            &route("/v1/chatter", &[])
        ));
    }

    #[test]
    fn errors_display_their_shape() {
        let e = ConfigError::Syntax {
            source_name: "a.toml".into(),
            line: 3,
            col: 7,
            message: "boom".into(),
        };
        assert_eq!(e.to_string(), "a.toml:3:7: boom");
        let e = ConfigError::Invalid {
            source_name: "a.toml".into(),
            message: "bad".into(),
        };
        assert_eq!(e.to_string(), "a.toml: bad");
    }
    // --- Admission, client keys and provider key files -----------------------

    #[test]
    fn admission_and_client_key_settings_resolve() {
        let c = load(&with_route_keys(
            "max_in_flight = 8\nclient_keys_env = \"CHAT_KEYS\"\nclient_keys_file = \"keys/chat\"",
        ));
        let r = &c.routes[0];
        assert_eq!(r.max_in_flight, Some(8));
        assert_eq!(
            r.client_auth,
            Some(ClientAuth {
                env: Some("CHAT_KEYS".into()),
                file: Some(PathBuf::from("config/keys/chat")),
            })
        );
        let d = c.describe();
        assert!(d.contains("  max_in_flight: 8\n"), "{d}");
        assert!(
            d.contains(
                "  client keys: client_keys_env CHAT_KEYS, client_keys_file config/keys/chat\n"
            ),
            "{d}"
        );
        let open = load(BASE);
        assert_eq!(open.routes[0].max_in_flight, None);
        assert_eq!(open.routes[0].client_auth, None);
    }

    #[test]
    fn admission_and_client_key_errors_name_route_and_key() {
        assert_eq!(
            err(&with_route_keys("max_in_flight = 0")),
            "t.toml: route \"chat\": max_in_flight must be greater than 0 (omit it for no limit)"
        );
        assert_eq!(
            err(&with_route_keys("max_in_flight = 2000000")),
            "t.toml: route \"chat\": max_in_flight (2000000) must be at most 1000000"
        );
        assert_eq!(
            err(&with_route_keys("client_keys_env = \"\"")),
            "t.toml: route \"chat\": client_keys_env \"\" is not a valid environment variable name"
        );
        assert_eq!(
            err(&with_route_keys("client_keys_file = \"\"")),
            "t.toml: route \"chat\": client_keys_file must not be empty"
        );
    }

    #[test]
    fn provider_key_file_is_resolved_and_exclusive_with_the_variable() {
        let c = load(&BASE.replace(
            "url = \"https://api.openai.com\"\n",
            "url = \"https://api.openai.com\"\napi_key_file = \"secrets/openai\"\n",
        ));
        assert_eq!(
            c.upstreams[0].api_key_file,
            Some(PathBuf::from("config/secrets/openai"))
        );
        assert!(c
            .describe()
            .contains(", api_key_file config/secrets/openai"));
        assert_eq!(
            err(&BASE.replace(
                "url = \"https://api.openai.com\"\n",
                "url = \"https://api.openai.com\"\napi_key_env = \"K\"\napi_key_file = \"k\"\n",
            )),
            "t.toml: upstream \"openai\": api_key_env and api_key_file are both set; use one"
        );
    }

    #[test]
    fn absurd_durations_are_refused_at_load() {
        let e = err(&format!(
            "[defaults]\nmax_budget = \"500000000years\"\n{BASE}"
        ));
        assert!(e.contains("longer than the maximum of 1 year"), "{e}");
        load(&format!("[defaults]\nmax_budget = \"365days\"\n{BASE}"));
    }

    #[test]
    fn inlined_keys_are_warned_about_and_never_repeated() {
        const CANARY: &str = "sk-proj-CANARY0123456789abcdefXYZ";
        let text = BASE.replace(
            "url = \"https://api.openai.com\"\n",
            &format!("url = \"https://api.openai.com\"\napi_key_env = \"{CANARY}\"\n"),
        ) + "models = [\"gpt-4o\", \"AbCdEfGhIjKlMnOpQrStUvWxYz0123456789\"]\n";
        let c = load(&text);
        let w = c.warnings_with(&|_| None);
        assert_eq!(
            &w[..2],
            [
                "routes[0].models[1] looks like an inlined API key; keep keys out of the config file (use api_key_env or api_key_file)",
                "upstreams.openai.api_key_env looks like an inlined API key; keep keys out of the config file (use api_key_env or api_key_file)",
            ]
        );
        let d = c.describe();
        let all = format!("{w:?}{d}{c:?}");
        // Debug of the config holds the raw setting; warnings and describe must not.
        assert!(!format!("{w:?}{d}").contains("CANARY"), "{all}");
        assert!(
            d.contains("api_key_env (not shown: looks like a key)"),
            "{d}"
        );
        // An invalid variable name is refused without echoing what looks like a key.
        let e = err(&BASE.replace(
            "url = \"https://api.openai.com\"\n",
            "url = \"https://api.openai.com\"\napi_key_env = \"sk-ant-api03-abc=def0123456789\"\n",
        ));
        assert!(!e.contains("abc=def"), "{e}");
        // Ordinary names, model names and URLs are not keys.
        for ok in [
            "OPENAI_API_KEY",
            "gpt-4o-mini-2024-07-18",
            "claude-3-5-sonnet-20241022",
            "https://api.openai.com/v1",
            "accounts/fireworks/models/llama-v3p1-405b-instruct",
            "/v1/chat/completions",
        ] {
            assert!(!looks_like_secret(ok), "{ok}");
        }
        for key in [
            "sk-abcdefghijklmnop",
            "sk-ant-api03-xxxxxxxxxxxx",
            "xai-0123456789abcdef",
            "AIzaSyD-0123456789abcdefghijkl",
        ] {
            assert!(looks_like_secret(key), "{key}");
        }
    }

    #[test]
    fn key_sources_are_checked_by_warnings() {
        let dir = tempfile::Builder::new()
            .prefix("hourglass-cfg-keys-")
            .tempdir()
            .unwrap();
        let key = dir.path().join("openai.key");
        std::fs::write(&key, "sk-test\n").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let text = BASE.replace(
            "url = \"https://api.openai.com\"\n",
            &format!(
                "url = \"https://api.openai.com\"\napi_key_file = \"{}\"\n",
                key.display()
            ),
        ) + "client_keys_env = \"CHAT_KEYS\"\nclient_keys_file = \"/nonexistent/keys\"\n\n\
             [[routes]]\nname = \"msgs\"\npath_prefix = \"/v1/messages\"\nupstream = \"anthropic\"\n\
             client_keys_env = \"MSG_KEYS\"\n";
        let c = load(&text);
        let w = c.warnings_with(&|name| (name == "MSG_KEYS").then(OsString::new));
        let expect_mode = if cfg!(unix) {
            vec![format!(
                "upstream \"openai\": api_key_file {} is open to every user (mode 644); chmod 600 it",
                key.display()
            )]
        } else {
            vec![]
        };
        let mut expected = expect_mode;
        expected.extend([
            "route \"chat\": client_keys_env CHAT_KEYS is not set; the gateway will not start without the route's keys".to_owned(),
            "route \"chat\": client_keys_file /nonexistent/keys: No such file or directory (os error 2); the gateway will not start without it".to_owned(),
            "route \"msgs\": clients authenticate with their gateway keys, which are never passed on, and upstream \"anthropic\" has no key of its own".to_owned(),
        ]);
        assert_eq!(w, expected);
        dir.close().unwrap();
    }
}
