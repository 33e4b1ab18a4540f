//! The keys of runs (one budget across the calls of an agent run): the limits a route gives
//! the runs it starts, inherited from `[defaults]` like the time limits, and the `[runs]`
//! table that says where runs are kept and for how long.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::HeaderName;

use super::raw::{RawLimits, RawOnStoreError, RawRuns};

/// Where a route reads the run id from (`run_id_header`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunIdSource {
    /// A header whose whole value is the id (`x-run-id`, `x-session-id`, ...).
    Header(HeaderName),
    /// The trace-id of a W3C `traceparent` (`00-<trace-id>-<parent-id>-<flags>`).
    TraceParent,
}

impl RunIdSource {
    pub const DEFAULT: &'static str = "x-run-id";

    pub fn header_name(&self) -> &str {
        match self {
            Self::Header(h) => h.as_str(),
            Self::TraceParent => "traceparent",
        }
    }
}

impl Default for RunIdSource {
    fn default() -> Self {
        Self::Header(HeaderName::from_static(Self::DEFAULT))
    }
}

/// What a run started on a route may spend; each limit is optional (`None`: unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    /// Time for the whole run (`run_budget`), when the client names none.
    pub budget: Option<Duration>,
    /// Ceiling for a client's `x-run-budget-ms` (`run_max_budget`).
    pub max_budget: Option<Duration>,
    pub max_calls: Option<u32>,
    /// Prompt and completion tokens, reported or estimated.
    pub max_tokens: Option<u64>,
    /// The same tool call (or request) this many times in a row stops the run.
    pub max_repeats: Option<u32>,
    /// Tokens reserved for a call that names no `max_tokens` of its own.
    pub token_estimate: u64,
}

/// `run_token_estimate` when a route names none.
pub const DEFAULT_TOKEN_ESTIMATE: u64 = 1024;

/// The most tokens a run may be limited to, or one call reserve: 2^53 - 1, the largest
/// count the Redis store's Lua numbers (doubles) hold exactly. Past it 2^53 and 2^53 + 1
/// compared equal there, and the Redis store admitted calls the memory store refused
/// (audit WD 3); one bound for both stores keeps them to one rule.
pub const MAX_RUN_TOKENS: u64 = (1 << 53) - 1;

impl RunLimits {
    pub const UNLIMITED: RunLimits = RunLimits {
        budget: None,
        max_budget: None,
        max_calls: None,
        max_tokens: None,
        max_repeats: None,
        token_estimate: DEFAULT_TOKEN_ESTIMATE,
    };

    /// Whether any limit is set; a route without one only counts the runs it sees.
    pub fn any(&self) -> bool {
        self.budget.is_some()
            || self.max_budget.is_some()
            || self.max_calls.is_some()
            || self.max_tokens.is_some()
            || self.max_repeats.is_some()
    }
}

/// Where runs live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunStore {
    /// In this process (the default): enough for one replica.
    Memory,
    /// Redis or Valkey at this URL (`redis://` or `rediss://`), shared by every replica.
    Redis(String),
}

/// What a call does when the run store cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStoreError {
    /// Serve it without run limits (counted in `hourglass_run_store_errors_total`).
    Allow,
    /// Answer 503 `run_store_unavailable`.
    Deny,
}

/// The `[runs]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunsConfig {
    /// A run is forgotten this long after its last call (default 10m).
    pub ttl: Duration,
    /// At most this many runs are held (default 100000); the least recently used goes first.
    pub max_runs: usize,
    pub store: RunStore,
    /// An environment variable holding the store's password (read at start-up, so that no
    /// secret sits in the file or a ConfigMap).
    pub store_password_env: Option<String>,
    /// The CA that signed a `rediss://` store's certificate (PEM), trusted instead of the
    /// public roots: a private Redis (Memorystore, a Helm chart's) has its own.
    pub store_ca_file: Option<PathBuf>,
    /// The store is a Redis Cluster: `store` is one of its nodes, and each run's script goes
    /// to the node of its slot.
    pub store_cluster: bool,
    /// More nodes of that cluster (`HOST:PORT`), reached as `store` is: any one of them that
    /// answers tells the gateway the cluster, so that it starts while `store`'s node is down.
    pub store_nodes: Vec<String>,
    /// The longest one call to the store may take (default 50ms); the request's remaining
    /// budget bounds it too.
    pub store_timeout: Duration,
    pub on_store_error: OnStoreError,
}

impl RunsConfig {
    /// The warning for a reload whose `[runs]` differs from `self`, the table the run store
    /// was made with (only a restart makes another), naming each key and the value that
    /// stays. Compared with the start, not the last reload: a reload back to the running
    /// values is no change, and a second reload of a changed value still is.
    pub fn restart_needed_for(&self, new: &RunsConfig) -> Option<String> {
        let d = |d: Duration| humantime::format_duration(d).to_string();
        let mut changed = Vec::new();
        if new.ttl != self.ttl {
            changed.push(format!("ttl ({} stays)", d(self.ttl)));
        }
        if new.max_runs != self.max_runs {
            changed.push(format!("max_runs ({} stays)", self.max_runs));
        }
        if new.store != self.store {
            let store = match &self.store {
                RunStore::Memory => "\"memory\"".to_owned(),
                RunStore::Redis(url) => format!("{:?}", super::secrets::redacted_url(url)),
            };
            changed.push(format!("store ({store} stays)"));
        }
        if new.store_password_env != self.store_password_env {
            changed.push(match &self.store_password_env {
                Some(var) => format!(
                    "store_password_env ({} stays)",
                    super::secrets::var_shown(var)
                ),
                None => "store_password_env (none stays)".to_owned(),
            });
        }
        if new.store_ca_file != self.store_ca_file {
            changed.push(match &self.store_ca_file {
                Some(p) => format!("store_ca_file ({} stays)", p.display()),
                None => "store_ca_file (none stays)".to_owned(),
            });
        }
        if new.store_cluster != self.store_cluster {
            changed.push(format!("store_cluster ({} stays)", self.store_cluster));
        }
        if new.store_nodes != self.store_nodes {
            changed.push(format!("store_nodes ({:?} stays)", self.store_nodes));
        }
        if new.store_timeout != self.store_timeout {
            changed.push(format!("store_timeout ({} stays)", d(self.store_timeout)));
        }
        if new.on_store_error != self.on_store_error {
            let kept = match self.on_store_error {
                OnStoreError::Allow => "allow",
                OnStoreError::Deny => "deny",
            };
            changed.push(format!("on_store_error (\"{kept}\" stays)"));
        }
        (!changed.is_empty()).then(|| {
            let verb = if changed.len() == 1 { "takes" } else { "take" };
            format!(
                "runs: {} {verb} effect only after a restart",
                changed.join(", ")
            )
        })
    }
}

pub(super) const DEFAULT_RUNS: RunsConfig = RunsConfig {
    ttl: Duration::from_secs(600),
    max_runs: 100_000,
    store: RunStore::Memory,
    store_password_env: None,
    store_ca_file: None,
    store_cluster: false,
    store_nodes: Vec::new(),
    store_timeout: Duration::from_millis(50),
    on_store_error: OnStoreError::Allow,
};

/// Far beyond what one process should hold; keeps the map's allocation sane.
const MAX_RUNS: usize = 10_000_000;

/// A `redis://` or `rediss://` URL as the Redis client reads it (host, port, database),
/// so that a URL the server would refuse at start is refused by `check` and by a reload.
fn check_store_url(url: &str) -> Result<(), String> {
    let shown = super::secrets::redacted_url(url);
    let rest = url.split_once("://").map_or("", |(_, r)| r);
    let host = rest.rsplit('@').next().unwrap_or_default();
    if host.is_empty() || host.starts_with('/') {
        return Err(format!("runs: store {shown:?} names no host"));
    }
    let parsed =
        url::Url::parse(url).map_err(|e| format!("runs: store {shown:?} is not a URL: {e}"))?;
    // As the client reads it: slashes trimmed at both ends.
    let db = parsed.path().trim_matches('/');
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Err(format!(
            "runs: store {shown:?}: database {db:?} is not a number"
        ));
    }
    // redis-rs's way to skip the certificate check, which this build leaves out: the client
    // would refuse it at its first command, with run limits off under `allow` meanwhile.
    if parsed.fragment() == Some("insecure") {
        return Err(format!(
            "runs: store {shown:?}: #insecure (no certificate check) is not supported; \
             name the CA that signed the server's certificate in store_ca_file"
        ));
    }
    // Whatever else the client would refuse (its own query parameters, say).
    redis::IntoConnectionInfo::into_connection_info(url)
        .map(drop)
        .map_err(|e| format!("runs: store {shown:?}: {e}"))
}

/// The URL of the cluster node `node` (`HOST:PORT`, `[IPv6]:PORT`), reached as `store` is:
/// its scheme, user, password and database.
pub fn node_url(store: &str, node: &str) -> Result<String, String> {
    let refused = |why: &str| format!("runs: store_nodes {node:?}: {why}");
    let (host, port) = node
        .rsplit_once(':')
        .ok_or_else(|| refused("must be HOST:PORT"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| refused("its port is not a number"))?;
    if host.is_empty() || host.contains(['/', '@', '?', '#']) {
        return Err(refused("must be HOST:PORT"));
    }
    let mut url = url::Url::parse(store).map_err(|e| refused(&e.to_string()))?;
    url.set_host(Some(host))
        .map_err(|e| refused(&e.to_string()))?;
    url.set_port(Some(port))
        .map_err(|()| refused("its port cannot be set"))?;
    Ok(url.into())
}

/// An unsupported store value as messages show it: its scheme alone, as the rest may hold a
/// password in a form no redaction knows (`?pass=`, a URL missing a slash).
fn scheme_shown(value: &str) -> String {
    match value.split_once(':') {
        Some((scheme, _)) => format!("{:?}", format!("{scheme}:...")),
        None => super::secrets::shown(value),
    }
}

/// The userinfo of a store URL, if it has one (`user`, `user:password`, `:password`).
fn userinfo(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    authority.rsplit_once('@').map(|(u, _)| u)
}

pub(super) fn build_runs(raw: &RawRuns, base_dir: Option<&Path>) -> Result<RunsConfig, String> {
    let d = DEFAULT_RUNS;
    let ttl = raw.ttl.map_or(d.ttl, |t| t.0);
    if ttl.is_zero() {
        return Err("runs: ttl must be greater than 0".into());
    }
    let max_runs = raw.max_runs.unwrap_or(d.max_runs);
    if max_runs == 0 || max_runs > MAX_RUNS {
        return Err(format!(
            "runs: max_runs ({max_runs}) must be between 1 and {MAX_RUNS}"
        ));
    }
    // A URL's scheme is case-insensitive (RFC 3986 3.1): `Redis://` is `redis://`.
    let store = raw.store.as_deref().map(|s| match s.split_once("://") {
        Some((scheme, rest)) => format!("{}://{rest}", scheme.to_ascii_lowercase()),
        None => s.to_owned(),
    });
    let store = match store.as_deref() {
        None | Some("memory") => RunStore::Memory,
        Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => {
            check_store_url(url)?;
            RunStore::Redis(url.to_owned())
        }
        // Sentinel named as such, with what to use instead: a generic refusal left the
        // operator guessing whether a spelling was wrong (audit SE 7).
        Some(other)
            if other
                .split_once("://")
                .is_some_and(|(scheme, _)| scheme.split('+').any(|part| part == "sentinel")) =>
        {
            return Err(format!(
                "runs: store {}: Redis Sentinel is not supported: name the master by an \
                 address that follows it (a DNS name, a virtual IP or a Kubernetes Service \
                 that the failover moves), or use Redis Cluster (store_cluster = true)",
                scheme_shown(other)
            ))
        }
        Some(other) => {
            return Err(format!(
                "runs: store {} must be \"memory\" or a redis:// or rediss:// URL",
                scheme_shown(other)
            ))
        }
    };
    let store_password_env = raw.store_password_env.clone();
    if let Some(var) = &store_password_env {
        if let Some(why) = super::secrets::shell_reference_refused(var) {
            return Err(format!("runs: store_password_env {why}"));
        }
        let RunStore::Redis(url) = &store else {
            return Err("runs: store_password_env needs a redis:// or rediss:// store".into());
        };
        // A username alone (an ACL user) takes its password from the variable.
        if userinfo(url).is_some_and(|u| u.contains(':')) {
            return Err(format!(
                "runs: store_password_env {}: the store URL already has a password",
                super::secrets::var_shown(var)
            ));
        }
        if var.is_empty() || !var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            // Not a name: most likely the password itself, so it is not repeated.
            return Err(
                "runs: store_password_env is not a variable name (letters, digits and _; \
                 its value is not shown, in case it is the password itself)"
                    .into(),
            );
        }
    }
    let store_ca_file = match &raw.store_ca_file {
        None => None,
        Some(p) if p.as_os_str().is_empty() => {
            return Err("runs: store_ca_file must not be empty".into())
        }
        Some(p) => {
            if !matches!(&store, RunStore::Redis(url) if url.starts_with("rediss://")) {
                return Err(format!(
                    "runs: store_ca_file {:?} needs a rediss:// store",
                    p.display()
                ));
            }
            Some(match base_dir {
                Some(dir) if p.is_relative() => dir.join(p),
                _ => p.clone(),
            })
        }
    };
    let store_cluster = raw.store_cluster.unwrap_or(d.store_cluster);
    if store_cluster {
        let RunStore::Redis(url) = &store else {
            return Err("runs: store_cluster needs a redis:// or rediss:// store".into());
        };
        // Checked above: a URL whose database is a number, if it names one.
        let db = url::Url::parse(url)
            .map(|u| u.path().trim_matches('/').to_owned())
            .unwrap_or_default();
        if !db.is_empty() && db != "0" {
            return Err(format!(
                "runs: store {:?}: database {db} with store_cluster = true: a Redis Cluster has \
                 database 0 only",
                super::secrets::redacted_url(url)
            ));
        }
    }
    let store_nodes = raw.store_nodes.clone().unwrap_or_default();
    if let (Some(node), false) = (store_nodes.first(), store_cluster) {
        return Err(format!(
            "runs: store_nodes ({node:?}, ...) needs store_cluster = true: a single server has \
             no other nodes"
        ));
    }
    if let RunStore::Redis(url) = &store {
        for node in &store_nodes {
            check_store_url(&node_url(url, node)?)?;
        }
    }
    let store_timeout = raw.store_timeout.map_or(d.store_timeout, |t| t.0);
    if store_timeout.is_zero() {
        return Err("runs: store_timeout must be greater than 0".into());
    }
    let on_store_error = match raw.on_store_error {
        None => d.on_store_error,
        Some(RawOnStoreError::Allow) => OnStoreError::Allow,
        Some(RawOnStoreError::Deny) => OnStoreError::Deny,
    };
    Ok(RunsConfig {
        ttl,
        max_runs,
        store,
        store_password_env,
        store_ca_file,
        store_cluster,
        store_nodes,
        store_timeout,
        on_store_error,
    })
}

/// A route's run keys, its own over those of `[defaults]`.
pub(super) fn build_run_limits(
    label: &str,
    own: &RawLimits,
    defaults: &RawLimits,
) -> Result<(RunIdSource, RunLimits), String> {
    fn pick<T: Copy>(own: Option<T>, d: Option<T>) -> Option<T> {
        own.or(d)
    }
    // A value the route took from [defaults] is said to come from there, as the budget
    // keys' errors say.
    let from = |inherited: bool| {
        if inherited {
            " (inherited from [defaults])"
        } else {
            ""
        }
    };
    // A value and where it came from, in one pair of parentheses.
    let valued = |value: &dyn std::fmt::Display, inherited: bool| {
        if inherited {
            format!("({value}, inherited from [defaults])")
        } else {
            format!("({value})")
        }
    };
    let positive = |key: &str,
                    own: Option<u64>,
                    d: Option<u64>,
                    max: u64,
                    omitted: &str|
     -> Result<Option<u64>, String> {
        let inherited = own.is_none() && d.is_some();
        match own.or(d) {
            Some(0) => Err(format!(
                "{label}: {key}{} must be greater than 0 (omit it for {omitted})",
                from(inherited)
            )),
            Some(n) if n > max => Err(format!(
                "{label}: {key} {} must be at most {max}",
                valued(&n, inherited)
            )),
            other => Ok(other),
        }
    };
    let header = own
        .run_id_header
        .as_deref()
        .or(defaults.run_id_header.as_deref());
    let source = match header {
        None => RunIdSource::default(),
        Some(h) if h.eq_ignore_ascii_case("traceparent") => RunIdSource::TraceParent,
        Some(h) => match HeaderName::from_bytes(h.as_bytes()) {
            // A run id is logged, named in refusals and served by `/runs/{id}`: read from a
            // header that carries a key, it would publish the key.
            Ok(name) if crate::http::client_steering::carries_credentials(&name) => {
                return Err(format!(
                    "{label}: run_id_header {h:?}{} carries credentials, and a run id is \
                     logged and shown; name a header of its own (e.g. \"x-run-id\")",
                    from(own.run_id_header.is_none())
                ))
            }
            Ok(name) => RunIdSource::Header(name),
            Err(_) => {
                return Err(format!(
                    "{label}: run_id_header {h:?} is not a valid header name"
                ))
            }
        },
    };
    let budget = pick(own.run_budget, defaults.run_budget).map(|d| d.0);
    let max_budget = pick(own.run_max_budget, defaults.run_max_budget).map(|d| d.0);
    for (key, d, inherited) in [
        (
            "run_budget",
            budget,
            own.run_budget.is_none() && defaults.run_budget.is_some(),
        ),
        (
            "run_max_budget",
            max_budget,
            own.run_max_budget.is_none() && defaults.run_max_budget.is_some(),
        ),
    ] {
        if d.is_some_and(|d| d.is_zero()) {
            return Err(format!(
                "{label}: {key}{} must be greater than 0",
                from(inherited)
            ));
        }
    }
    if let (Some(b), Some(m)) = (budget, max_budget) {
        if b > m {
            return Err(format!(
                "{label}: run_budget {} must not exceed run_max_budget {}",
                valued(&humantime::format_duration(b), own.run_budget.is_none()),
                valued(&humantime::format_duration(m), own.run_max_budget.is_none()),
            ));
        }
    }
    let max_calls = positive(
        "run_max_calls",
        own.run_max_calls,
        defaults.run_max_calls,
        u64::from(u32::MAX),
        "no limit",
    )?;
    let max_tokens = positive(
        "run_max_tokens",
        own.run_max_tokens,
        defaults.run_max_tokens,
        MAX_RUN_TOKENS,
        "no limit",
    )?;
    let max_repeats = pick(own.run_max_repeats, defaults.run_max_repeats);
    if let Some(n) = max_repeats {
        // One would refuse the call after any tool call at all.
        if !(2..=1000).contains(&n) {
            return Err(format!(
                "{label}: run_max_repeats {} must be between 2 and 1000",
                valued(&n, own.run_max_repeats.is_none())
            ));
        }
    }
    let token_estimate = positive(
        "run_token_estimate",
        own.run_token_estimate,
        defaults.run_token_estimate,
        MAX_RUN_TOKENS,
        "the default, 1024",
    )?
    .unwrap_or(DEFAULT_TOKEN_ESTIMATE);
    Ok((
        source,
        RunLimits {
            budget,
            max_budget,
            // Checked against u32::MAX above.
            max_calls: max_calls.map(|n| n as u32),
            max_tokens,
            max_repeats: max_repeats.map(|n| n as u32),
            token_estimate,
        },
    ))
}
