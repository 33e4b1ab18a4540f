//! What `hourglass check` and startup print about a loaded config: [`Config::warnings`]
//! (non-fatal problems, from the environment and the file system too) and
//! [`Config::describe`] (every resolved value).

use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::routing::shadows;
use super::secrets::{redacted_url, var_shown};
use super::{
    AuthMode, Config, Ejection, Http2Config, Http2Mode, OnStoreError, RunIdSource, RunStore,
    UpstreamConfig, DEFAULT_POOL_IDLE_TIMEOUT,
};
use crate::provider::Api;

/// Ends every warning of a start-up failure ([`Config::stops_start_up`]).
pub const WILL_NOT_START: &str = "the gateway will not start without";

impl Config {
    /// Non-fatal problems worth showing at startup and in `hourglass check`:
    /// missing API key variables, settings that will be ignored, unused
    /// upstreams, unreadable CA files and unreachable routes. Reads the
    /// process environment and the file system, so call it when those are
    /// final.
    /// Whether a warning of [`Config::warnings`] (or of `check`'s own reading of the TLS
    /// files) names something start-up refuses: a key file or CA missing here, a variable
    /// not set. `check` warns of them (a CI machine may lack the secrets), `check --strict`
    /// fails on them.
    pub fn stops_start_up(warning: &str) -> bool {
        warning.contains(WILL_NOT_START)
    }

    pub fn warnings(&self) -> Vec<String> {
        self.warnings_with(&|name| std::env::var_os(name))
            .iter()
            .map(
                |w| match missing_file_note(self.relative_to_cwd.as_deref(), w) {
                    Some(note) => format!("{w} {note}"),
                    None => w.clone(),
                },
            )
            .map(|w| super::secrets::scrub(&w))
            .collect()
    }

    pub(super) fn warnings_with(&self, env: &dyn Fn(&str) -> Option<OsString>) -> Vec<String> {
        let mut out = self.inlined_secrets.clone();
        // Whether the key can be read at all is said where the TLS files are read.
        if let Some(tls) = &self.server.tls {
            if let Ok(meta) = std::fs::metadata(&tls.key) {
                open_to_all_warning("server.tls.key", &tls.key, &meta, &mut out);
            }
        }
        for up in &self.upstreams {
            let name = &up.name;
            // A fallback is a use too.
            let users = || {
                self.routes
                    .iter()
                    .filter(|r| r.chain().any(|f| Arc::ptr_eq(f, up)))
            };
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
            if let Some(var) = &up.api_key_env {
                let shown = var_shown(var);
                if up.auth == AuthMode::None {
                    out.push(format!(
                        "upstream {name:?}: api_key_env {shown} is ignored because auth is \"none\""
                    ));
                } else if let Some(problem) = key_var_problem(var, env) {
                    // Where every route using the upstream takes gateway keys, nothing passes
                    // through: those routes' own warnings say what happens instead. An
                    // upstream no route uses is warned of as such.
                    if users().any(|r| r.client_auth.is_none()) {
                        out.push(format!(
                            "upstream {name:?}: api_key_env {shown} {problem}; the client's own credentials will be passed through"
                        ));
                    }
                }
            }
            // TLS files: ignored beside an http:// url, else needed at start-up (the key
            // kept from other users too).
            let http = up.url.scheme_str() == Some("http");
            let cert = up.client_cert.as_ref();
            for (field, path) in [
                ("ca_file", up.ca_file.as_deref()),
                ("client_cert", cert.map(|c| c.cert.as_path())),
            ] {
                match path {
                    None => {}
                    Some(_) if http => out.push(format!(
                        "upstream {name:?}: {field} is ignored because url {} uses http",
                        up.url_text()
                    )),
                    Some(p) => {
                        if let Err(e) = std::fs::metadata(p) {
                            out.push(missing_file(&format!("upstream {name:?}: {field}"), p, &e));
                        }
                    }
                }
            }
            if let Some(key) = cert.map(|c| c.key.as_path()).filter(|_| !http) {
                secret_file_warnings(
                    &format!("upstream {name:?}: client_cert_key"),
                    key,
                    &mut out,
                );
            }
            let https = up.url.scheme_str() == Some("https");
            let untouched = Http2Config {
                mode: up.http2.mode,
                ..Http2Config::default()
            };
            if !up.http2.used(https) && up.http2.mode == Http2Mode::Auto && up.http2 != untouched {
                out.push(format!(
                    "upstream {name:?}: its http2_* keys have no effect: an http:// upstream under \
                     http2 = \"auto\" speaks HTTP/1.1 (http2 = \"always\" speaks h2c)"
                ));
            } else if let Some(w) = up.http2.warning() {
                out.push(format!("upstream {name:?}: {w}"));
            }
            if is_own_listen(&up.url, self.server.listen) {
                out.push(format!(
                    "upstream {name:?}: url {} is this gateway's own listen address \
                     (server.listen {}): requests sent to it come back to the gateway, a loop",
                    up.url_text(),
                    self.server.listen
                ));
            }
            if users().next().is_none() {
                out.push(format!("upstream {name:?} is not used by any route"));
            }
        }
        if matches!(self.runs.store, RunStore::Redis(_))
            && self.runs.max_runs != super::runs::DEFAULT_RUNS.max_runs
        {
            out.push(format!(
                "runs: max_runs ({}) bounds the memory store only; Redis holds runs until their ttl",
                self.runs.max_runs
            ));
        }
        if let Some(var) = &self.runs.store_password_env {
            if env(var).is_none() {
                out.push(format!(
                    "runs: store_password_env {} is not set; {WILL_NOT_START} the store's password",
                    var_shown(var)
                ));
            }
        }
        if let Some(path) = &self.runs.store_ca_file {
            if let Err(e) = super::file::probe(path) {
                out.push(format!(
                    "runs: store_ca_file {}: {e}; {WILL_NOT_START} it",
                    path.display()
                ));
            }
        }
        for r in &self.routes {
            let Some(auth) = &r.client_auth else { continue };
            let label = format!("route {:?}", r.name);
            if let Some(var) = &auth.env {
                if env(var).is_none() {
                    out.push(format!(
                        "{label}: client_keys_env {} is not set; {WILL_NOT_START} the route's keys",
                        var_shown(var)
                    ));
                }
            }
            if let Some(path) = &auth.file {
                secret_file_warnings(&format!("{label}: client_keys_file"), path, &mut out);
            }
            // Every upstream the route may send to: balanced ones take a share of its
            // requests, fallbacks the rest, and each without a key answers 401.
            for up in r.chain() {
                if up.auth == AuthMode::None
                    || (up.api_key_env.is_none() && up.api_key_file.is_none())
                {
                    out.push(format!(
                        "{label}: clients authenticate with their gateway keys, which are never passed on, and upstream {:?} has no key of its own",
                        up.name
                    ));
                } else if let Some((var, problem)) = up
                    .api_key_env
                    .as_ref()
                    .filter(|_| up.api_key_file.is_none())
                    .and_then(|v| Some((v, key_var_problem(v, env)?)))
                {
                    out.push(format!(
                        "{label}: clients authenticate with their gateway keys, which are never passed on, and upstream {:?} has no key of its own: api_key_env {} {problem}",
                        up.name,
                        var_shown(var)
                    ));
                }
            }
        }
        // An attempt that rewrites the body sends a copy, which holds its own share of the
        // memory beside the body's: a body over half of it is then refused whatever else is in
        // flight (413, audit QC 1). Warned of rather than refused: such a config served
        // smaller bodies before, and still does.
        let memory = self.server.request_body_memory;
        for r in &self.routes {
            let largest = r.max_request_body.unwrap_or(self.server.max_request_body);
            let rewrites =
                r.stream_upstream || r.chain().any(|u| u.model.is_some() || u.include_usage);
            if rewrites && memory < largest.saturating_mul(2) {
                out.push(format!(
                    "route {:?}: request_body_memory ({memory}) is less than twice its max_request_body ({largest}), and its attempts may rewrite the body (an upstream's model or include_usage, stream_upstream), whose copy holds its own share: a body over about {} bytes will be refused (413)",
                    r.name,
                    memory / 2
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
            "  admin_listen: {} (/metrics /healthz /readyz /runs/{{id}} /upstreams)",
            s.admin_listen
        );
        let _ = writeln!(out, "  max_request_body: {} bytes", s.max_request_body);
        let _ = writeln!(
            out,
            "  request_body_memory: {} bytes (all request bodies being received or forwarded at once)",
            s.request_body_memory
        );
        let _ = writeln!(out, "  max_response_body: {} bytes", s.max_response_body);
        let _ = writeln!(
            out,
            "  response_body_memory: {} bytes (all answers held before their heads at once)",
            s.response_body_memory
        );
        let _ = writeln!(out, "  header_read_timeout: {}", hd(s.header_read_timeout));
        let _ = writeln!(out, "  shutdown_grace: {}", hd(s.shutdown_grace));
        let _ = writeln!(
            out,
            "  drain_delay: {} (accepting after a stop signal, /readyz 503)",
            hd(s.drain_delay)
        );
        let _ = writeln!(out, "  send_timeout: {}", hd(s.send_timeout));
        let max_connections = s
            .max_connections
            .map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
        let _ = writeln!(out, "  max_connections: {max_connections}");
        let _ = writeln!(out, "  max_header_bytes: {} bytes", s.max_header_bytes);
        let _ = writeln!(out, "  max_headers: {}", s.max_headers);
        let _ = writeln!(
            out,
            "  http2_max_concurrent_streams: {}",
            s.http2_max_concurrent_streams
        );
        match &s.tls {
            None => {
                let _ = writeln!(out, "  tls: off");
            }
            Some(t) => {
                let _ = write!(
                    out,
                    "  tls: cert {}, key {}",
                    t.cert.display(),
                    t.key.display()
                );
                if let Some(ca) = &t.client_ca {
                    let _ = write!(out, ", client_ca {}", ca.display());
                }
                if let Some(crl) = &t.client_crl {
                    let _ = write!(out, ", client_crl {}", crl.display());
                }
                let _ = writeln!(out);
            }
        }
        let runs = &self.runs;
        let store = match &runs.store {
            RunStore::Memory => "memory".to_owned(),
            RunStore::Redis(url) => {
                let mut s = match &runs.store_password_env {
                    Some(var) => {
                        format!("{} (password from {})", redacted_url(url), var_shown(var))
                    }
                    None => redacted_url(url),
                };
                if runs.store_cluster {
                    s.push_str(" (Redis Cluster)");
                }
                if !runs.store_nodes.is_empty() {
                    s.push_str(&format!(" (also {})", runs.store_nodes.join(", ")));
                }
                if let Some(ca) = &runs.store_ca_file {
                    s.push_str(&format!(" (CA from {})", ca.display()));
                }
                s
            }
        };
        let _ = writeln!(
            out,
            "runs\n  store: {store} (store_timeout {}, on_store_error {})\n  ttl: {}\n  max_runs: {}",
            hd(runs.store_timeout),
            match runs.on_store_error {
                OnStoreError::Allow => "allow",
                OnStoreError::Deny => "deny",
            },
            hd(runs.ttl),
            runs.max_runs
        );
        for r in &self.routes {
            let l = &r.limits;
            let _ = writeln!(out, "route {:?}", r.name);
            let _ = writeln!(out, "  path_prefix: {}", r.path_prefix);
            if r.models.is_empty() {
                let _ = writeln!(out, "  models: any");
            } else {
                let globs: Vec<String> = r.models.iter().map(|m| format!("{m:?}")).collect();
                let _ = writeln!(out, "  models: {}", globs.join(", "));
            }
            out.push_str("  upstream: ");
            write_upstream(&mut out, &r.upstream);
            out.push('\n');
            let p = &r.policy;
            let _ = writeln!(out, "  retries: {} on {}", p.retries, p.retry_on);
            // Each with its details as the route's own: each serves some of its requests.
            let members = |out: &mut String, ups: &[Arc<UpstreamConfig>]| {
                for up in ups {
                    out.push_str("    ");
                    write_upstream(out, up);
                    out.push('\n');
                }
            };
            if !p.balanced.is_empty() {
                let names: Vec<&str> = p.balanced.iter().map(|f| f.name.as_str()).collect();
                let _ = writeln!(
                    out,
                    "  balance_with: {} (each request starts at the least busy)",
                    names.join(", ")
                );
                members(&mut out, &p.balanced);
            }
            if !p.fallbacks.is_empty() {
                let names: Vec<&str> = p.fallbacks.iter().map(|f| f.name.as_str()).collect();
                let _ = writeln!(out, "  fallbacks: {}", names.join(" -> "));
                members(&mut out, &p.fallbacks);
            }
            if let Some(h) = p.hedge_after {
                let _ = writeln!(out, "  hedge_after: {}", hd(h));
            }
            if let Some(n) = r.max_in_flight {
                let _ = writeln!(out, "  max_in_flight: {n}");
            }
            if let Some(n) = r.max_request_body {
                let _ = writeln!(out, "  max_request_body: {n} bytes");
            }
            if let Some(auth) = &r.client_auth {
                let mut from = Vec::new();
                if let Some(var) = &auth.env {
                    from.push(format!("client_keys_env {}", var_shown(var)));
                }
                if let Some(path) = &auth.file {
                    from.push(format!("client_keys_file {}", path.display()));
                }
                let _ = writeln!(out, "  client keys: {}", from.join(", "));
            }
            if r.stream_upstream {
                let partial = if r.partial_answers {
                    ", partial_answers"
                } else {
                    ""
                };
                let _ = writeln!(out, "  stream_upstream: true{partial}");
            }
            let rl = &r.run_limits;
            if rl.any() {
                let mut parts = vec![format!("id from {}", r.run_id.header_name())];
                if let Some(b) = rl.budget {
                    parts.push(format!("run_budget {}", hd(b)));
                }
                if let Some(b) = rl.max_budget {
                    parts.push(format!("run_max_budget {}", hd(b)));
                }
                if let Some(n) = rl.max_calls {
                    parts.push(format!("run_max_calls {n}"));
                }
                if let Some(n) = rl.max_tokens {
                    parts.push(format!(
                        "run_max_tokens {n} (run_token_estimate {})",
                        rl.token_estimate
                    ));
                }
                if let Some(n) = rl.max_repeats {
                    parts.push(format!("run_max_repeats {n}"));
                }
                let _ = writeln!(out, "  runs: {}", parts.join(", "));
            } else if r.run_id != RunIdSource::default() {
                // Counted as runs without limits of their own: the header still names them.
                let _ = writeln!(out, "  runs: id from {}", r.run_id.header_name());
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
        super::secrets::scrub(&out)
    }
}

/// A file of secrets that cannot be read makes startup fail; one others may read is a
/// leak waiting to happen.
/// Whether `url` reaches the gateway's own `listen` address (audit ME 5: a certain loop,
/// each request coming back until refused 508 `loop_detected`). Judged from the address
/// alone: an unspecified `listen` (every address) counts loopback names and addresses only,
/// since the machine's other addresses are not known here; port 0 is never one.
/// Audit NB 4: judged by the parsed address, not its spelling: a name or form the resolver
/// takes for a loopback or unspecified address (`localhost.`, `127.1`, `0.0.0.0`) counts.
fn is_own_listen(url: &http::Uri, listen: std::net::SocketAddr) -> bool {
    use std::net::IpAddr;
    let default_port = match url.scheme_str() {
        Some("https") => 443,
        _ => 80,
    };
    if listen.port() == 0 || url.port_u16().unwrap_or(default_port) != listen.port() {
        return false;
    }
    let Some(host) = url.host() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let listen_ip = listen.ip().to_canonical();
    // `localhost` (with or without the root's dot) is every loopback address at once.
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.eq_ignore_ascii_case("localhost") {
        return listen_ip.is_unspecified() || listen_ip.is_loopback();
    }
    let Some(ip) = host
        .parse::<IpAddr>()
        .ok()
        .or_else(|| inet_aton(host).map(IpAddr::V4))
        .map(|ip| ip.to_canonical())
    else {
        return false;
    };
    if ip == listen_ip {
        return true;
    }
    if listen_ip.is_unspecified() {
        return ip.is_loopback() || ip.is_unspecified();
    }
    // Linux connects to an unspecified address as to the loopback one of its family.
    ip.is_unspecified()
        && match ip {
            IpAddr::V4(_) => listen_ip == IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => listen_ip == IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        }
}

/// An IPv4 address in the forms `inet_aton` (and so glibc's resolver) also takes: one to
/// four parts, decimal, octal (`0` first) or hex (`0x`), the last filling the bytes left
/// (`127.1` is 127.0.0.1, `2130706433` too). Only what is all digits and dots is tried.
fn inet_aton(host: &str) -> Option<std::net::Ipv4Addr> {
    let parts: Vec<u32> = host
        .split('.')
        .map(|p| {
            let (digits, radix) = match p.get(..2) {
                Some("0x" | "0X") => (&p[2..], 16),
                _ if p.len() > 1 && p.starts_with('0') => (&p[1..], 8),
                _ => (p, 10),
            };
            u32::from_str_radix(digits, radix).ok()
        })
        .collect::<Option<_>>()?;
    let (last, head) = parts.split_last()?;
    if head.len() > 3 || head.iter().any(|&p| p > 255) {
        return None;
    }
    // The last part fills the bytes the others leave.
    let room = 8 * (4 - head.len() as u32);
    if room < 32 && *last >= 1 << room {
        return None;
    }
    let value = head
        .iter()
        .enumerate()
        .fold(*last, |v, (i, &p)| v | p << (24 - 8 * i as u32));
    Some(std::net::Ipv4Addr::from(value))
}

fn secret_file_warnings(label: &str, path: &Path, out: &mut Vec<String>) {
    match std::fs::metadata(path) {
        Err(e) => out.push(missing_file(label, path, &e)),
        Ok(meta) => open_to_all_warning(label, path, &meta, out),
    }
}

/// Audit NB 2: why a file named relative to a config that is no regular file (a pipe) was
/// looked for in `relative_to_cwd` (the working directory), for a message that says a file
/// is missing; `None` for other messages, or a config that is a file.
pub fn missing_file_note(relative_to_cwd: Option<&Path>, message: &str) -> Option<String> {
    let dir = relative_to_cwd?;
    let missing = std::io::Error::from(std::io::ErrorKind::NotFound).to_string();
    let missing = message.contains("(os error 2)") || message.contains(&missing);
    missing.then(|| {
        format!(
            "(the config is not a regular file, so its relative paths are resolved \
             against the working directory, {})",
            dir.display()
        )
    })
}

/// A file start-up needs that cannot be read here (it may be mounted only where the gateway
/// runs: a warning, not an error).
fn missing_file(label: &str, path: &Path, e: &std::io::Error) -> String {
    format!("{label} {}: {e}; {WILL_NOT_START} it", path.display())
}

fn open_to_all_warning(label: &str, path: &Path, meta: &std::fs::Metadata, out: &mut Vec<String>) {
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
    let _ = (label, path, meta);
}

/// What is wrong with an `api_key_env` variable as the gateway reads it (trimmed), if
/// anything: either way the upstream gets no key of the gateway's.
fn key_var_problem(var: &str, env: &dyn Fn(&str) -> Option<OsString>) -> Option<&'static str> {
    let Some(value) = env(var) else {
        return Some("is not set");
    };
    match value.to_str() {
        None => Some("is set but not valid UTF-8"),
        Some(v) if v.trim().is_empty() => Some("is set but empty"),
        Some(_) => None,
    }
}

/// humantime formatting, so messages echo durations the way they are written.
pub(super) fn hd(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

/// One upstream as `check` shows it: its name, then what it resolved to in parentheses.
fn write_upstream(out: &mut String, up: &UpstreamConfig) {
    use std::fmt::Write as _;
    let _ = write!(out, "{} ({}, auth {}", up.name, up.url_text(), up.auth);
    // Read by nothing under auth "none": shown, since the file names it, but as such.
    let ignored = if up.auth == AuthMode::None {
        " (ignored)"
    } else {
        ""
    };
    if let Some(var) = &up.api_key_env {
        let var = var_shown(var);
        let _ = write!(out, ", api_key_env {var}{ignored}");
    }
    if let Some(path) = &up.api_key_file {
        let _ = write!(out, ", api_key_file {}{ignored}", path.display());
    }
    if let Some(ca) = &up.ca_file {
        let _ = write!(out, ", ca_file {}", ca.display());
        if !up.trust_public_roots {
            out.push_str(" alone (trust_public_roots false)");
        }
    }
    if let Some(org) = &up.organization {
        let _ = write!(out, ", organization {org}");
    }
    if let Some(project) = &up.project {
        let _ = write!(out, ", project {project}");
    }
    // Shown, values too: they are not secrets by design (a key goes in api_key_env). Those
    // of a header that may carry a peer's credentials or account (`steers_peer`: Portkey's
    // virtual key, config, AWS secret) are masked all the same, and so are those whose name
    // looks like a secret's: a peer gateway's own key beside the provider's (Kong's
    // `x-kong-api-key`, Braintrust's `x-bt-api-key`) can only be set here, and `check`'s
    // output lands in CI logs (audit VB 3).
    for (name, value) in &up.set_headers {
        let masked = (crate::http::client_steering::steers_peer(name)
            && *name != "x-portkey-provider")
            || looks_secret(name.as_str());
        let value = if masked {
            "***"
        } else {
            value.to_str().unwrap_or("?")
        };
        let _ = write!(out, ", header {name}: {value}");
    }
    if !up.hide_headers.is_empty() {
        let shown: Vec<String> = up.hide_headers.iter().map(|p| p.to_string()).collect();
        let _ = write!(out, ", hide_headers {}", shown.join(" "));
    }
    if let Some(c) = &up.client_cert {
        let _ = write!(out, ", client_cert {}", c.cert.display());
    }
    // Which proxy its connections go through: an operator behind one needs to see that the
    // environment's was taken, or passed over (NO_PROXY, `proxy = "none"`).
    match (
        &up.proxy,
        up.proxy.target(&up.url, super::ProxyEnv::process()),
    ) {
        (super::EgressProxy::Direct, _) => out.push_str(", proxy none"),
        (super::EgressProxy::Url(_), Ok(Some(p))) => {
            let _ = write!(out, ", proxy {}", p.shown);
        }
        (_, Ok(Some(p))) => {
            let _ = write!(out, ", proxy {} (from the environment)", p.shown);
        }
        (_, Ok(None)) => {}
        (_, Err(e)) => {
            let _ = write!(out, ", proxy: {e}");
        }
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
    } else if !up.assembled_usage {
        let _ = write!(out, ", include_usage false");
    }
    if up.pool_idle_timeout != DEFAULT_POOL_IDLE_TIMEOUT {
        let _ = write!(out, ", pool_idle_timeout {}", hd(up.pool_idle_timeout));
    }
    if up.ejection.after == 0 {
        out.push_str(", never ejected");
    } else if up.ejection != Ejection::default() {
        let _ = write!(
            out,
            ", ejected for {} after {} failed attempts in a row",
            hd(up.ejection.duration),
            up.ejection.after
        );
    }
    let h2 = &up.http2;
    let _ = write!(out, ", http2 {}", h2.mode);
    if h2.used(up.url.scheme_str() == Some("https")) {
        let _ = write!(
            out,
            " ({} streams per connection, stream window {}, connection window {}",
            h2.max_streams_per_connection, h2.stream_window, h2.connection_window
        );
        if let Some(n) = h2.max_connections {
            let _ = write!(out, ", at most {n} connections");
        }
        out.push(')');
    }
    out.push(')');
}

/// A header name that suggests its value is a credential: it contains `key`, `token`,
/// `secret`, `auth`, `password`, `credential` or `session`, or it is `cookie` (names are
/// lowercase). `check` shows such a value as `***` (audit VB 3). Portkey's own prefix is
/// not read: its `key` would mask `x-portkey-provider`, which is no secret.
fn looks_secret(name: &str) -> bool {
    let name = name.strip_prefix("x-portkey-").unwrap_or(name);
    name == "cookie"
        || [
            "key",
            "token",
            "secret",
            "auth",
            "password",
            "credential",
            "session",
        ]
        .iter()
        .any(|part| name.contains(part))
}
