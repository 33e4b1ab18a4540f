//! Where an upstream's connections go out: straight to it, or through an HTTP CONNECT proxy
//! (`proxy`), by default the one the environment names as curl, httpx and the providers'
//! SDKs read it (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`, and lowercase).

use std::sync::OnceLock;

use http::{HeaderValue, Uri};
use hyper_util::client::proxy::matcher::Matcher;

use super::secrets::redacted_url;

/// An upstream's `proxy` key.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum EgressProxy {
    /// No key: as the process environment says.
    #[default]
    Env,
    /// `proxy = "none"`: straight to the upstream, whatever the environment says.
    Direct,
    /// `proxy = "http://[user:password@]host:port"`, checked at load.
    Url(String),
}

impl std::fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Env => f.write_str("Env"),
            Self::Direct => f.write_str("Direct"),
            // Never the proxy's password (a config is debug-printed by tests and panics).
            Self::Url(url) => write!(f, "Url({:?})", redacted_url(url)),
        }
    }
}

/// The proxy an upstream's connections go through.
#[derive(Clone)]
pub struct ProxyTarget {
    /// `http://host:port/`, without its userinfo.
    pub uri: Uri,
    /// `Proxy-Authorization` (Basic) from the URL's userinfo.
    pub auth: Option<HeaderValue>,
    /// As messages and `check` show it: its password masked.
    pub shown: String,
}

impl std::fmt::Debug for ProxyTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credential.
        f.write_str(&self.shown)
    }
}

/// The environment's proxy rules, as curl reads them.
pub struct ProxyEnv {
    /// `NO_PROXY` alone, as hyper-util's `Matcher` reads it (domains, IPs, CIDR); its proxy
    /// is a placeholder: it only says whether a host is exempt.
    no: Matcher,
    /// `NO_PROXY=*`: no proxy for any host. The matcher's `*` matches names only, so an IP
    /// upstream would still be proxied; curl exempts every host (audit QC 2).
    no_for_any: bool,
    /// Each variable set, by the name it was read from, with its value as given.
    all: Option<(&'static str, String)>,
    http: Option<(&'static str, String)>,
    https: Option<(&'static str, String)>,
}

impl ProxyEnv {
    /// The rules given as values (`NO_PROXY` in `no`): what tests use, since the process
    /// environment is shared by every test running at once.
    pub fn from_values(all: &str, http: &str, https: &str, no: &str) -> Self {
        Self::named(
            ("ALL_PROXY", all),
            ("HTTP_PROXY", http),
            ("HTTPS_PROXY", https),
            no,
        )
    }

    fn named(
        all: (&'static str, &str),
        http: (&'static str, &str),
        https: (&'static str, &str),
        no: &str,
    ) -> Self {
        let some = |(name, v): (&'static str, &str)| (!v.is_empty()).then(|| (name, v.to_owned()));
        Self {
            no: Matcher::builder()
                .all("http://exempt.invalid:1")
                .no(no)
                .build(),
            no_for_any: no.trim() == "*",
            all: some(all),
            http: some(http),
            https: some(https),
        }
    }

    /// The process environment's, read once, as hyper-util's `Matcher` reads it: upper case
    /// first, and none under CGI (`REQUEST_METHOD`, httpoxy).
    ///
    /// The library's own unit tests read none (`from_values` gives them theirs), so that a
    /// proxy set where they run does not change what they see.
    pub fn process() -> &'static Self {
        static ENV: OnceLock<ProxyEnv> = OnceLock::new();
        ENV.get_or_init(|| {
            if cfg!(test) || std::env::var_os("REQUEST_METHOD").is_some() {
                return Self::from_values("", "", "", "");
            }
            let var = |names: [&'static str; 2]| {
                names
                    .iter()
                    .find_map(|n| std::env::var(n).ok().map(|v| (*n, v)))
                    .unwrap_or((names[0], String::new()))
            };
            let (all, http, https) = (
                var(["ALL_PROXY", "all_proxy"]),
                var(["HTTP_PROXY", "http_proxy"]),
                var(["HTTPS_PROXY", "https_proxy"]),
            );
            Self::named(
                (all.0, &all.1),
                (http.0, &http.1),
                (https.0, &https.1),
                &var(["NO_PROXY", "no_proxy"]).1,
            )
        })
    }

    /// The proxy it sends `url` through, if any.
    fn for_url(&self, url: &Uri) -> Result<Option<ProxyTarget>, String> {
        let var = match url.scheme_str() {
            Some("https") => self.https.as_ref().or(self.all.as_ref()),
            _ => self.http.as_ref().or(self.all.as_ref()),
        };
        let Some((name, value)) = var else {
            return Ok(None);
        };
        // Parsed as the `proxy` key is, and refused as it is: the matcher would drop a value
        // it cannot read and send the upstream direct without a word, or read another host
        // than the one shown (audit QC 3). Checked before NO_PROXY, so that a typo shows at
        // `check` whichever upstreams it spares. Like curl, a value without a scheme is
        // http:// (`127.0.0.1:3128`).
        let value = if value.contains("://") {
            value.clone()
        } else {
            format!("http://{value}")
        };
        let target = proxy_target(&value)
            .map_err(|why| format!("the environment's {name} {:?} {why}", redacted_url(&value)))?;
        // A proxy elsewhere cannot reach this host's loopback: an upstream there (a sidecar,
        // a local model server) is never sent to the environment's proxy, as Go's
        // `ProxyFromEnvironment` does. Its own `proxy` key still can.
        if self.no_for_any || is_loopback(url) || self.no.intercept(url).is_none() {
            return Ok(None);
        }
        Ok(Some(target))
    }
}

fn is_loopback(url: &Uri) -> bool {
    let host = url.host().unwrap_or_default();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    // `localhost.` is the same name, fully qualified; `::ffff:127.0.0.1` is 127.0.0.1
    // (`is_loopback` is false for an IPv4-mapped address until made canonical).
    host.trim_end_matches('.').eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// Reads a proxy URL (the `proxy` key's, or an environment variable's): `http://`, a host
/// and a port the connector can use, no path. The error completes `"<url, masked>" …`.
fn proxy_target(value: &str) -> Result<ProxyTarget, String> {
    let shown = redacted_url(value);
    // http::Uri has no fragments: a `#` (in a password, say) makes readers disagree on
    // where the host starts, so the host shown would not be the one connected to.
    if value.contains('#') {
        return Err("has a '#' (percent-encode it in a password: %23)".to_owned());
    }
    let uri: Uri = value
        .parse()
        .map_err(|_| "is not a URL (\"http://host:port\")".to_owned())?;
    if uri.scheme_str() != Some("http") {
        return Err(
            "is not usable: only http:// proxies are supported (HTTP CONNECT; TLS to the \
             provider runs inside the tunnel)"
                .to_owned(),
        );
    }
    let Some(authority) = uri.authority().filter(|a| !a.host().is_empty()) else {
        return Err("needs a host and a port".to_owned());
    };
    // As `check_url` for an upstream's url (audit RA 3): the connector reads an IPv6 host
    // with no zone and looks it up as a name, failing every request as a "dns error".
    if authority.host().starts_with('[') && authority.host().contains('%') {
        return Err(
            "has an IPv6 zone id, which is not supported: use an address or a name that \
             needs none"
                .to_owned(),
        );
    }
    match authority.port_u16() {
        Some(0) | None => return Err("needs a host and a port (1 to 65535)".to_owned()),
        Some(_) => {}
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        return Err("has a path or query: a proxy URL has no path or query".to_owned());
    }
    // The matcher reads the userinfo into Basic credentials; it must agree on the host.
    let intercept = Matcher::builder()
        .all(value)
        .build()
        .intercept(&Uri::from_static("http://upstream.invalid/"))
        .filter(|i| {
            i.uri().host() == Some(authority.host()) && i.uri().port_u16() == authority.port_u16()
        })
        .ok_or_else(|| "has a user or password that cannot be read".to_owned())?;
    Ok(ProxyTarget {
        uri: intercept.uri().clone(),
        auth: intercept.basic_auth().cloned(),
        shown,
    })
}

impl EgressProxy {
    /// Reads the `proxy` key's value: "none", or an `http://` URL with a host and a port.
    pub(super) fn parse(value: &str) -> Result<Self, String> {
        if value == "none" {
            return Ok(Self::Direct);
        }
        proxy_target(value).map_err(|why| format!("{:?} {why}", redacted_url(value)))?;
        Ok(Self::Url(value.to_owned()))
    }

    /// The proxy an upstream at `url` connects through, if any: its own `proxy` key, else
    /// what `env` says (`NO_PROXY` included).
    pub fn target(&self, url: &Uri, env: &ProxyEnv) -> Result<Option<ProxyTarget>, String> {
        match self {
            Self::Direct => Ok(None),
            Self::Env => env.for_url(url),
            // Checked at load.
            Self::Url(value) => proxy_target(value).map(Some),
        }
    }
}
