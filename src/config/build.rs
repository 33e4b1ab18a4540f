//! Raw -> checked: the built-in defaults, and the checks that resolve the raw tree into a
//! [`Config`] (inheritance, upstream names, relative paths) or say what is wrong with it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::describe::hd;
use super::http2::build_http2;
use super::locate::syntax_error;
use super::raw::{RawApi, RawAuth, RawConfig, RawLimits, RawRoute, RawServer, RawUpstream};
use super::runs::{build_run_limits, build_runs};
use super::secrets::{inlined_secrets, scrub};
use super::{
    AuthMode, ClientAuth, ClientCert, Config, ConfigError, Ejection, Limits, Policy, RetryCause,
    RetryOn, Route, ServerConfig, ServerTls, UpstreamConfig, DEFAULT_POOL_IDLE_TIMEOUT,
    MAX_EJECT_AFTER,
};
use super::{DOCUMENT_READ_WHOLE, NO_ROUTE};
use crate::provider::Api;

const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    8080,
));
const DEFAULT_ADMIN_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    9090,
));
const DEFAULT_MAX_REQUEST_BODY: u64 = 10 * 1024 * 1024;
/// 25 bodies of the largest default size at once, or thousands of typical ones.
const DEFAULT_REQUEST_BODY_MEMORY: u64 = 256 * 1024 * 1024;
const DEFAULT_MAX_RESPONSE_BODY: u64 = 16 * 1024 * 1024;
const DEFAULT_RESPONSE_BODY_MEMORY: u64 = 256 * 1024 * 1024;
const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The limits of `[defaults]` before the file changes any.
pub const DEFAULT_LIMITS: Limits = Limits {
    budget: Duration::from_secs(60),
    max_budget: Duration::from_secs(600),
    connect_timeout: Duration::from_secs(2),
    first_token_timeout: Duration::from_secs(30),
    idle_timeout: Duration::from_secs(20),
    reserve: Duration::ZERO,
    min_useful: Duration::from_millis(100),
};

pub(super) fn parse(
    text: &str,
    source: &str,
    base_dir: Option<&Path>,
) -> Result<Config, ConfigError> {
    let raw: RawConfig = toml::from_str(text).map_err(|e| syntax_error(text, source, &e))?;
    let mut config = build(raw, source, base_dir).map_err(|message| ConfigError::Invalid {
        source_name: source.to_owned(),
        message: scrub(&message),
    })?;
    config.fingerprint = fingerprint(text);
    config.inlined_secrets = inlined_secrets(text);
    Ok(config)
}

/// The files config `text` names (as [`Config::files`] lists them), read from the text alone:
/// a config refused for what one of them holds names them too, and a fix to that file is a
/// reason to try again. Empty when the text does not parse.
pub(super) fn files_named(text: &str, base_dir: Option<&Path>) -> Vec<PathBuf> {
    let Ok(raw) = toml::from_str::<RawConfig>(text) else {
        return Vec::new();
    };
    let resolve = |p: &PathBuf| match base_dir {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p.clone(),
    };
    let mut out: Vec<PathBuf> = Vec::new();
    if let Some(t) = &raw.server.tls {
        out.extend(
            [&t.cert, &t.key, &t.client_ca, &t.client_crl]
                .into_iter()
                .flatten()
                .map(resolve),
        );
    }
    for (_, u) in &raw.upstreams.0 {
        // Unread under auth "none" (`Config::files`).
        let key_file = match u.auth {
            Some(RawAuth::None) => &None,
            _ => &u.api_key_file,
        };
        out.extend(
            [key_file, &u.ca_file, &u.client_cert, &u.client_cert_key]
                .into_iter()
                .flatten()
                .map(resolve),
        );
    }
    for r in &raw.routes {
        out.extend(r.client_keys_file.as_ref().map(resolve));
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// FNV-1a of the text: stable across builds and platforms, unlike std's hasher.
fn fingerprint(text: &str) -> String {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// Resolves and checks the raw tree. Errors are the message part of
/// [`ConfigError::Invalid`]; the first problem found wins, in file order:
/// server, upstreams, defaults, routes.
fn build(raw: RawConfig, source: &str, base_dir: Option<&Path>) -> Result<Config, String> {
    let server = build_server(&raw.server, base_dir)?;
    let runs = build_runs(&raw.runs, base_dir)?;

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
        let route = build_route(index, r, &defaults, &raw.defaults, &upstreams, base_dir)?;
        // Bodies share the one memory: a route's larger body could never be read whole.
        if let Some(n) = route
            .max_request_body
            .filter(|&n| n > server.request_body_memory)
        {
            return Err(format!(
                "routes[{index}].max_request_body ({n}) must be at most [server] request_body_memory ({}), or no body of that size could be read",
                server.request_body_memory
            ));
        }
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
        relative_to_cwd: None,
        runs,
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
            // A CRL only revokes: alone it would read as client certificates being checked
            // when none are asked for.
            if t.client_crl.is_some() && t.client_ca.is_none() {
                return Err("server.tls: client_crl needs client_ca (the CAs whose \
                            certificates it revokes)"
                    .to_owned());
            }
            Some(ServerTls {
                cert: need(&t.cert, "cert")?,
                key: need(&t.key, "key")?,
                client_ca: t.client_ca.as_deref().map(resolve),
                client_crl: t.client_crl.as_deref().map(resolve),
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
        max_response_body: raw.max_response_body.unwrap_or(DEFAULT_MAX_RESPONSE_BODY),
        request_body_memory: raw
            .request_body_memory
            .unwrap_or(DEFAULT_REQUEST_BODY_MEMORY),
        response_body_memory: raw
            .response_body_memory
            .unwrap_or(DEFAULT_RESPONSE_BODY_MEMORY),
        header_read_timeout: raw
            .header_read_timeout
            .map_or(DEFAULT_HEADER_READ_TIMEOUT, |d| d.0),
        shutdown_grace: raw.shutdown_grace.map_or(DEFAULT_SHUTDOWN_GRACE, |d| d.0),
        drain_delay: raw.drain_delay.map_or(Duration::ZERO, |d| d.0),
        send_timeout: raw.send_timeout.map_or(DEFAULT_SEND_TIMEOUT, |d| d.0),
        max_connections: raw.max_connections,
    };
    if server.max_request_body == 0 {
        return Err("server: max_request_body must be greater than 0".to_owned());
    }
    if server.request_body_memory < server.max_request_body {
        return Err(format!(
            "server: request_body_memory ({}) must be at least max_request_body ({}), or no body of the largest size could be read",
            server.request_body_memory, server.max_request_body
        ));
    }
    if server.max_response_body == 0 {
        return Err("server: max_response_body must be greater than 0".to_owned());
    }
    let largest_answer = server.max_response_body.max(DOCUMENT_READ_WHOLE);
    if server.response_body_memory < largest_answer {
        return Err(format!(
            "server: response_body_memory ({}) must be at least max_response_body ({}) and {DOCUMENT_READ_WHOLE} (the most of a JSON document read whole), or no answer of the largest size could be held",
            server.response_body_memory, server.max_response_body
        ));
    }
    // Audit ME 5: the limits on clients closed every connection at once when far shorter
    // than any network round trip (`header_read_timeout = "1ns"`).
    for (key, value) in [
        ("header_read_timeout", server.header_read_timeout),
        ("send_timeout", server.send_timeout),
    ] {
        if value < MIN_TIMEOUT {
            return Err(format!(
                "server: {key} ({}) must be at least {}",
                hd(value),
                hd(MIN_TIMEOUT)
            ));
        }
    }
    // Every stop waits this long before its drain even begins: a typo ("30m" for "30s")
    // would hold each rolling restart for half an hour.
    if server.drain_delay > MAX_DRAIN_DELAY {
        return Err(format!(
            "server: drain_delay ({}) must be at most {} (it is how long a load balancer \
             takes to see /readyz turn 503: a few health-check intervals)",
            hd(server.drain_delay),
            hd(MAX_DRAIN_DELAY)
        ));
    }
    // hyper needs room for at least one 8 KiB read.
    if server.max_header_bytes < 8192 {
        return Err(format!(
            "server: max_header_bytes ({}) must be at least 8192",
            server.max_header_bytes
        ));
    }
    for (key, zero) in [
        ("max_headers", server.max_headers == 0),
        (
            "http2_max_concurrent_streams",
            server.http2_max_concurrent_streams == 0,
        ),
    ] {
        if zero {
            return Err(format!("server: {key} must be greater than 0"));
        }
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
    if mapped_alike(server.listen, server.admin_listen) {
        return Err(format!(
            "server: listen ({}) and admin_listen ({}) are one address (an IPv4-mapped IPv6 \
             address is its IPv4 address); give them different ports",
            server.listen, server.admin_listen
        ));
    }
    if overlap(server.listen, server.admin_listen) {
        return Err(format!(
            "server: listen ({}) and admin_listen ({}) share a port, and one of them listens on \
             every address, the other's included; give them different ports",
            server.listen, server.admin_listen
        ));
    }
    Ok(server)
}

/// Two different addresses that cannot both be bound: one port, and one of them the
/// wildcard of the other's family (`[::]` takes IPv4 too, as Linux binds it by default).
/// An IPv4-mapped IPv6 address (`[::ffff:a.b.c.d]`) binds as its IPv4 address (audit IB 5).
fn overlap(a: std::net::SocketAddr, b: std::net::SocketAddr) -> bool {
    use std::net::IpAddr;
    if a.port() != b.port() || a.port() == 0 || a == b {
        return false;
    }
    let covers = |w: IpAddr, o: IpAddr| match w {
        IpAddr::V4(w) => w.is_unspecified() && o.is_ipv4(),
        IpAddr::V6(w) => w.is_unspecified(),
    };
    let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
    covers(x, y) || covers(y, x)
}

/// Two spellings of one address and port, one of them IPv4-mapped IPv6: both cannot bind.
fn mapped_alike(a: std::net::SocketAddr, b: std::net::SocketAddr) -> bool {
    a != b
        && a.port() == b.port()
        && a.port() != 0
        && a.ip().to_canonical() == b.ip().to_canonical()
}

/// Audit NB 6: a route or upstream name is a log field and a metric label. One made of an
/// invisible character (a zero-width space, which `str::trim` keeps) looked blank, and
/// "chat" beside "chat " looked like one name on a dashboard. The error completes
/// `name "…" …`.
fn check_name(name: &str) -> Result<(), String> {
    if let Some(c) = name.chars().find(|&c| crate::http::headers::invisible(c)) {
        return Err(format!(
            "holds an invisible character (a format or control character, or a line \
             separator), so it could look blank, or like another name (U+{:04X})",
            u32::from(c)
        ));
    }
    if name.trim() != name {
        return Err(
            "begins or ends with whitespace, so it could look like another name".to_owned(),
        );
    }
    Ok(())
}

fn build_upstream(
    name: String,
    raw: RawUpstream,
    base_dir: Option<&Path>,
) -> Result<UpstreamConfig, String> {
    if name.is_empty() {
        return Err("upstreams: an upstream name must not be empty".to_owned());
    }
    check_name(&name).map_err(|why| format!("upstreams: upstream name {name:?} {why}"))?;
    let label = format!("upstream {name:?}");
    let http2 = build_http2(&raw).map_err(|why| format!("{label}: {why}"))?;
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
        other => other.map(|p| resolve_path(p, base_dir)),
    };
    let trust_public_roots = raw.trust_public_roots.unwrap_or(true);
    if !trust_public_roots && ca_file.is_none() {
        return Err(format!(
            "{label}: trust_public_roots = false needs a ca_file: nothing would be trusted"
        ));
    }
    let client_cert = match (raw.client_cert, raw.client_cert_key) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            for (field, p) in [("client_cert", &cert), ("client_cert_key", &key)] {
                if p.as_os_str().is_empty() {
                    return Err(format!("{label}: {field} must not be empty"));
                }
            }
            Some(ClientCert {
                cert: resolve_path(cert, base_dir),
                key: resolve_path(key, base_dir),
            })
        }
        (Some(_), None) => {
            return Err(format!(
                "{label}: client_cert needs client_cert_key, the certificate's private key"
            ))
        }
        (None, Some(_)) => {
            return Err(format!(
                "{label}: client_cert_key needs client_cert, the certificate it is the key of"
            ))
        }
    };
    // Pins the account of the key the gateway sends: with no key of its own the client's
    // passes, with its own account.
    for (field, value) in [
        ("organization", &raw.organization),
        ("project", &raw.project),
    ] {
        let Some(value) = value else { continue };
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "{label}: {field} must be an id such as org-... or proj_... (visible ASCII, no spaces)"
            ));
        }
        let keyed = raw.api_key_env.is_some() || api_key_file.is_some();
        if !keyed || matches!(raw.auth, Some(RawAuth::None)) {
            return Err(format!(
                "{label}: {field} names the account the upstream's key acts for, but the \
                 gateway sends no key here: set api_key_env or api_key_file"
            ));
        }
    }
    let proxy = match raw.proxy.as_deref() {
        None => super::EgressProxy::Env,
        Some(v) => super::EgressProxy::parse(v)
            .map_err(|e| format!("{label}: upstreams.{name}.proxy {e}"))?,
    };
    Ok(UpstreamConfig {
        name,
        http2,
        proxy,
        url,
        api_key_env: raw.api_key_env,
        api_key_file,
        organization: raw.organization,
        project: raw.project,
        set_headers: super::peer_headers::set_headers(&label, raw.headers)?,
        hide_headers: super::peer_headers::hide_headers(&label, raw.hide_headers)?,
        auth: match raw.auth {
            None | Some(RawAuth::Bearer) => AuthMode::Bearer,
            Some(RawAuth::XApiKey) => AuthMode::XApiKey,
            Some(RawAuth::ApiKey) => AuthMode::ApiKey,
            Some(RawAuth::XGoogApiKey) => AuthMode::GoogApiKey,
            Some(RawAuth::None) => AuthMode::None,
        },
        ca_file,
        trust_public_roots,
        client_cert,
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
        assembled_usage: raw.include_usage != Some(false),
        pool_idle_timeout: match raw.pool_idle_timeout {
            Some(d) if d.0.is_zero() => {
                return Err(format!("{label}: pool_idle_timeout must be greater than 0"))
            }
            other => other.map_or(DEFAULT_POOL_IDLE_TIMEOUT, |d| d.0),
        },
        ejection: Ejection {
            after: match raw.eject_after {
                Some(n) if n > MAX_EJECT_AFTER => {
                    return Err(format!(
                        "{label}: eject_after must be at most {MAX_EJECT_AFTER} (0 never ejects), got {n}"
                    ))
                }
                Some(n) => n as u32,
                None => Ejection::default().after,
            },
            duration: match raw.eject_for {
                // Where nothing is ejected (eject_after = 0), how long it would last is moot.
                Some(d) if d.0.is_zero() && raw.eject_after != Some(0) => {
                    return Err(format!(
                        "{label}: eject_for must be greater than 0; to never eject, set \
                         eject_after = 0"
                    ))
                }
                Some(d) if !d.0.is_zero() => d.0,
                _ => Ejection::default().duration,
            },
        },
    })
}

/// Checks an environment variable name; the error completes the sentence
/// `api_key_env …` (or `client_keys_env …`) and never echoes what looks like a key.
fn check_env_name(var: &str) -> Result<(), String> {
    // std::env lookups cannot represent these names; reject them here rather than have
    // the key silently never found.
    if var.is_empty() {
        return Err("\"\" is not a valid environment variable name".into());
    }
    if let Some(why) = super::secrets::shell_reference_refused(var) {
        return Err(why);
    }
    if var.contains(['=', '\0']) {
        // Not a name: most likely the secret itself (base64 ends in `=`), not repeated.
        return Err(
            "is not a valid environment variable name (it holds `=` or NUL; its value is not \
             shown, in case it is the secret itself)"
                .into(),
        );
    }
    Ok(())
}

fn resolve_path(p: PathBuf, base_dir: Option<&Path>) -> PathBuf {
    match base_dir {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p,
    }
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
    // http::Uri takes an IPv6 zone id (`[fe80::1%25eth0]`, RFC 6874, or `%eth0`), but the
    // connector reads the host with no zone, looks it up as a name and fails every request
    // as a "dns error": refuse it here, naming it (audit RA 3).
    if let Some(zone) = authority
        .host()
        .strip_prefix('[')
        .and_then(|h| h.find('%').map(|i| &h[i..]))
    {
        let zone = zone.trim_end_matches(']');
        return Err(format!(
            "has an IPv6 zone id ({zone:?}), which is not supported: use an address or a name \
             that needs none"
        ));
    }
    // http::Uri keeps a port it cannot read as a u16 and reports none: the connect would
    // then go to the scheme's default port, or fail, without naming the mistake.
    if let Some(port) = authority.as_str()[authority.host().len()..].strip_prefix(':') {
        if !matches!(port.parse::<u16>(), Ok(p) if p > 0) {
            return Err(format!(
                "has port {port:?}, which is not a TCP port (1 to 65535)"
            ));
        }
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

/// A prefix is compared with request paths as routing reads them: without the query, made
/// ASCII by percent-encoding, dot segments refused, equivalent spellings made one
/// (`crate::http::path`). A prefix that is none of these would route nothing, silently.
fn check_path_prefix(prefix: &str) -> Result<(), String> {
    use crate::http::path::{for_routing, has_dot_segment, normalized};
    if let Some(c) = prefix.chars().find(|c| matches!(c, '?' | '#')) {
        return Err(format!(
            "routes match the path alone, never its {}",
            if c == '?' { "query" } else { "fragment" }
        ));
    }
    // Also those hyper refuses in a request target, answered 400 before any route.
    if let Some(c) = prefix.chars().find(|c| {
        !c.is_ascii() || c.is_ascii_whitespace() || c.is_ascii_control() || "<>`".contains(*c)
    }) {
        return Err(format!(
            "{c:?} never comes unencoded in a request's path; write it percent-encoded"
        ));
    }
    if has_dot_segment(prefix) {
        return Err("requests whose path has a `.` or `..` segment are refused".into());
    }
    let routed = for_routing(&normalized(prefix)).into_owned();
    if routed != prefix {
        return Err(format!(
            "request paths are matched as {routed:?} is spelled (unreserved characters \
             decoded, other escapes in upper case, encoded slashes and runs of `/` as one \
             `/`); write that"
        ));
    }
    Ok(())
}

fn build_route(
    index: usize,
    raw: RawRoute,
    defaults: &Limits,
    raw_defaults: &RawLimits,
    upstreams: &[Arc<UpstreamConfig>],
    base_dir: Option<&Path>,
) -> Result<Route, String> {
    let name = match raw.name.as_deref() {
        None => return Err(format!("routes[{index}]: name is required")),
        Some("") => return Err(format!("routes[{index}]: name must not be empty")),
        // Audit ME 5: blank in logs and as a metric label, and told apart from another
        // blank name only by counting spaces.
        Some(n) if n.trim().is_empty() => {
            return Err(format!(
                "routes[{index}]: name {n:?} is only whitespace; route names must not be blank"
            ))
        }
        // A route of that name would share its series with the requests that match none.
        Some(NO_ROUTE) => {
            return Err(format!(
                "routes[{index}]: name {NO_ROUTE:?} is reserved: the metrics count requests that match no route as route={NO_ROUTE:?}"
            ))
        }
        Some(n) => n.to_owned(),
    };
    check_name(&name).map_err(|why| format!("routes[{index}]: name {name:?} {why}"))?;
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
    check_path_prefix(&path_prefix).map_err(|why| {
        format!("{label}: path_prefix {path_prefix:?} can never match a request: {why}")
    })?;

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
    // An empty list reads as "no model" but would match every one: said rather than guessed.
    if raw.models.as_ref().is_some_and(Vec::is_empty) {
        return Err(format!(
            "{label}: models is empty; omit it (or use [\"*\"]) to match any model"
        ));
    }
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

    let (run_id, run_limits) = build_run_limits(&label, &overrides, raw_defaults)?;
    // The run budget that bounds every call of a run on this route: the route's
    // `run_budget` (a client may only shorten it), else the `run_max_budget` a client's
    // own is clamped to.
    let run_bound = [
        (
            "run_budget",
            run_limits.budget,
            overrides.run_budget.is_none(),
        ),
        (
            "run_max_budget",
            run_limits.max_budget,
            overrides.run_max_budget.is_none(),
        ),
    ]
    .into_iter()
    .find_map(|(key, d, inherited)| {
        d.map(|d| RunBound {
            key,
            budget: d,
            inherited,
        })
    });
    let policy = build_policy(&label, &raw, &upstream, &limits, run_bound, upstreams)?;
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
    if raw.max_request_body == Some(0) {
        return Err(format!(
            "routes[{index}].max_request_body must be greater than 0 (omit it for [server] max_request_body)"
        ));
    }
    let stream_upstream = raw.stream_upstream.unwrap_or(false);
    let partial_answers = raw.partial_answers.unwrap_or(false);
    if partial_answers && !stream_upstream {
        return Err(format!(
            "{label}: partial_answers needs stream_upstream = true (a client that streams gets every token as it comes)"
        ));
    }
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
        max_request_body: raw.max_request_body,
        stream_upstream,
        partial_answers,
        client_auth,
        run_id,
        run_limits,
    })
}

/// The shortest `header_read_timeout`, `send_timeout`, `connect_timeout`,
/// `first_token_timeout` or `idle_timeout`: below a round trip on any network a client or
/// an upstream could use, each fails connections and calls that are doing nothing wrong.
const MIN_TIMEOUT: Duration = Duration::from_millis(10);
/// Far beyond any real route; keeps the admission semaphore within its bounds.
const MAX_IN_FLIGHT: usize = 1_000_000;
/// Far beyond any descriptor limit; keeps the connection semaphore within its bounds.
const MAX_CONNECTIONS: usize = 1_000_000;
/// Envoy's own ceiling for headers per request is 100 by default; 1000 leaves room.
const MAX_HEADERS: usize = 1000;
/// The longest `[server] drain_delay`: load balancers see a replica's `/readyz` turn 503
/// within a few health-check intervals, seconds rather than minutes.
pub(super) const MAX_DRAIN_DELAY: Duration = Duration::from_secs(600);

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
    run_bound: Option<RunBound>,
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
        Some(list) => {
            let causes: Vec<RetryCause> = list.iter().map(|&c| RetryCause::from(c)).collect();
            // Audit ME 5: a cause named twice is most likely a typo for one left out.
            for (i, c) in causes.iter().enumerate() {
                if let Some(first) = causes[..i].iter().position(|f| f == c) {
                    return Err(format!(
                        "{label}: retry_on[{i}] ({:?}) is already in retry_on[{first}]; name each failure once",
                        c.as_str()
                    ));
                }
            }
            causes.into_iter().fold(RetryOn(0), |set, c| set.with(c))
        }
    };
    // One chain, each upstream in it once: the route's own, those balanced with it, the
    // fallbacks.
    let mut chain: Vec<Arc<UpstreamConfig>> = vec![Arc::clone(upstream)];
    let mut lists = Vec::new();
    for (key, names) in [
        ("balance_with", &raw.balance_with),
        ("fallbacks", &raw.fallbacks),
    ] {
        let mut list: Vec<Arc<UpstreamConfig>> = Vec::new();
        for (i, name) in names.iter().flatten().enumerate() {
            let Some(up) = upstreams.iter().find(|u| &u.name == name) else {
                let mut known: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
                known.sort_unstable();
                return Err(format!(
                    "{label}: {key}[{i}] names upstream {name:?}, which is not defined (known: {})",
                    known.join(", ")
                ));
            };
            if chain.iter().any(|c| c.name == up.name) {
                return Err(format!(
                    "{label}: {key}[{i}] ({name:?}) is already in the route's chain; each upstream is tried once (use retries for more attempts)"
                ));
            }
            chain.push(Arc::clone(up));
            list.push(Arc::clone(up));
        }
        lists.push(list);
    }
    let fallbacks = lists.pop().unwrap_or_default();
    let balanced = lists.pop().unwrap_or_default();
    check_seeds(label, &chain, limits, run_bound)?;
    if retry_on.0 == 0 && (retries > 0 || !fallbacks.is_empty()) {
        let what = match (retries > 0, fallbacks.is_empty()) {
            (true, true) => format!("retries ({retries})"),
            (false, _) => "fallbacks".to_owned(),
            (true, false) => format!("retries ({retries}) and fallbacks"),
        };
        return Err(format!(
            "{label}: retry_on is empty, so {what} would never be tried; name the failures \
             that may be tried again (connect, first_token, 5xx, 429, reset), or drop {what}"
        ));
    }
    let hedge_after = raw.hedge_after.map(|d| d.0);
    if let Some(h) = hedge_after {
        if fallbacks.is_empty() && balanced.is_empty() {
            return Err(format!(
                "{label}: hedge_after needs another upstream to hedge with, in fallbacks or balance_with"
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
        balanced,
        fallbacks,
        hedge_after,
    })
}

/// The run budget key that bounds every call of a run on a route, for `check_seeds`.
struct RunBound {
    key: &'static str,
    budget: Duration,
    /// Taken from `[defaults]`.
    inherited: bool,
}

/// Audit ME 1: an upstream's `expected_first_token` that a route calling it could never
/// see confirmed shuts the route out. An attempt is made only when the estimate fits what is
/// left of the budget after its reserve, and no first token is observed later than
/// `first_token_timeout`, while the estimate returns to its seed between observations: a
/// seed at or past either limit refused every request with the route's budget (504
/// `insufficient_budget`) however fast the upstream answered. Checked as `hedge_after` is.
/// Audit NB 1: a call of a run has at most the run's budget, so a seed at or past what the
/// route's run budget leaves after the reserve refused every call with a run id (504
/// `run_deadline_exceeded`), and a client may only shorten that budget.
fn check_seeds(
    label: &str,
    chain: &[Arc<UpstreamConfig>],
    limits: &Limits,
    run_bound: Option<RunBound>,
) -> Result<(), String> {
    let room = limits.budget.saturating_sub(limits.reserve);
    let mut refused =
        "every request with the route's budget would be refused (504 insufficient_budget)";
    let (mut limit, mut what) = if limits.first_token_timeout <= room {
        (
            limits.first_token_timeout,
            format!("first_token_timeout ({})", hd(limits.first_token_timeout)),
        )
    } else {
        (
            room,
            format!(
                "budget less its reserve ({} - {} = {})",
                hd(limits.budget),
                hd(limits.reserve),
                hd(room)
            ),
        )
    };
    if let Some(run) = run_bound {
        let run_room = run.budget.saturating_sub(limits.reserve);
        if run_room < limit {
            let from = if run.inherited {
                ", inherited from [defaults]"
            } else {
                ""
            };
            limit = run_room;
            what = if limits.reserve.is_zero() {
                format!("{} ({}{from})", run.key, hd(run.budget))
            } else {
                format!(
                    "{} less its reserve ({}{from} - {} = {})",
                    run.key,
                    hd(run.budget),
                    hd(limits.reserve),
                    hd(run_room)
                )
            };
            refused = "every call of a run would be refused (504 run_deadline_exceeded)";
        }
    }
    for up in chain {
        if let Some(seed) = up.expected_first_token.filter(|&s| s >= limit) {
            return Err(format!(
                "{label}: upstream {:?} has expected_first_token ({}), which must be less than \
                 the route's {what}: no first token is observed later than that, so the \
                 estimate could never come down, and {refused}",
                up.name,
                hd(seed)
            ));
        }
    }
    Ok(())
}

fn check_limits(l: &Limits) -> Result<(), LimitsError> {
    let fail = |keys: &'static [&'static str], message: String| Err(LimitsError { message, keys });
    if l.budget.is_zero() {
        return fail(&["budget"], "budget must be greater than 0".to_owned());
    }
    // Audit NB 3: as the client timeouts (ME 5), these failed every request "within 0ms"
    // when far shorter than any network round trip (`connect_timeout = "1ns"`).
    let timeouts: [(&'static [&'static str], Duration); 3] = [
        (&["connect_timeout"], l.connect_timeout),
        (&["first_token_timeout"], l.first_token_timeout),
        (&["idle_timeout"], l.idle_timeout),
    ];
    for (keys, value) in timeouts {
        if value < MIN_TIMEOUT {
            return fail(
                keys,
                format!(
                    "{} ({}) must be at least {}",
                    keys.join(""),
                    hd(value),
                    hd(MIN_TIMEOUT)
                ),
            );
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
