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
    matcher: Matcher,
    /// The variables' values, to show which one a proxy came from (masked).
    all: Option<String>,
    http: Option<String>,
    https: Option<String>,
}

impl ProxyEnv {
    /// The rules given as values (`NO_PROXY` in `no`): what tests use, since the process
    /// environment is shared by every test running at once.
    pub fn from_values(all: &str, http: &str, https: &str, no: &str) -> Self {
        let some = |v: &str| (!v.is_empty()).then(|| v.to_owned());
        Self {
            matcher: Matcher::builder()
                .all(all)
                .http(http)
                .https(https)
                .no(no)
                .build(),
            all: some(all),
            http: some(http),
            https: some(https),
        }
    }

    /// The process environment's, read once: hyper-util's `Matcher` reads the same
    /// variables (upper case first), and ignores them under CGI (`REQUEST_METHOD`, httpoxy).
    ///
    /// The library's own unit tests read none (`from_values` gives them theirs), so that a
    /// proxy set where they run does not change what they see.
    pub fn process() -> &'static Self {
        static ENV: OnceLock<ProxyEnv> = OnceLock::new();
        ENV.get_or_init(|| {
            if cfg!(test) {
                return Self::from_values("", "", "", "");
            }
            let var = |names: [&str; 2]| {
                names
                    .iter()
                    .find_map(|n| std::env::var(n).ok())
                    .unwrap_or_default()
            };
            let all = var(["ALL_PROXY", "all_proxy"]);
            let http = var(["HTTP_PROXY", "http_proxy"]);
            let https = var(["HTTPS_PROXY", "https_proxy"]);
            let mut env = Self::from_values(&all, &http, &https, "");
            env.matcher = Matcher::from_env();
            env
        })
    }

    /// The proxy it sends `url` through, if any.
    fn for_url(&self, url: &Uri) -> Result<Option<ProxyTarget>, String> {
        let Some(intercept) = self.matcher.intercept(url) else {
            return Ok(None);
        };
        // A proxy elsewhere cannot reach this host's loopback: an upstream there (a sidecar,
        // a local model server) is never sent to the environment's proxy, as Go's
        // `ProxyFromEnvironment` does. Its own `proxy` key still can.
        if is_loopback(url) {
            return Ok(None);
        }
        // Shown as the variable holds it, masked (the matcher's URI has lost the userinfo).
        let raw = match url.scheme_str() {
            Some("https") => self.https.as_ref().or(self.all.as_ref()),
            _ => self.http.as_ref().or(self.all.as_ref()),
        };
        let shown = raw.map_or_else(|| intercept.uri().to_string(), |r| redacted_url(r));
        if intercept.uri().scheme_str() != Some("http") {
            return Err(format!(
                "the environment's proxy {shown} is not an http:// proxy (only HTTP CONNECT \
                 proxies are supported; set the upstream's proxy key)"
            ));
        }
        Ok(Some(ProxyTarget {
            uri: intercept.uri().clone(),
            auth: intercept.basic_auth().cloned(),
            shown,
        }))
    }
}

fn is_loopback(url: &Uri) -> bool {
    let host = url.host().unwrap_or_default();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl EgressProxy {
    /// Reads the `proxy` key's value: "none", or an `http://` URL with a host and a port.
    pub(super) fn parse(value: &str) -> Result<Self, String> {
        if value == "none" {
            return Ok(Self::Direct);
        }
        let shown = redacted_url(value);
        let uri: Uri = value
            .parse()
            .map_err(|_| format!("{shown:?} is not a URL (\"http://host:port\" or \"none\")"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!(
                "{shown:?}: only http:// proxies are supported (HTTP CONNECT; TLS to the \
                 provider runs inside the tunnel), or \"none\""
            ));
        }
        if uri
            .authority()
            .is_none_or(|a| a.port_u16().is_none() || a.host().is_empty())
        {
            return Err(format!("{shown:?} needs a host and a port"));
        }
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(format!("{shown:?}: a proxy URL has no path or query"));
        }
        Ok(Self::Url(value.to_owned()))
    }

    /// The proxy an upstream at `url` connects through, if any: its own `proxy` key, else
    /// what `env` says (`NO_PROXY` included).
    pub fn target(&self, url: &Uri, env: &ProxyEnv) -> Result<Option<ProxyTarget>, String> {
        match self {
            Self::Direct => Ok(None),
            Self::Env => env.for_url(url),
            // Checked at load; the matcher parses the userinfo into Basic credentials.
            Self::Url(value) => {
                let env = ProxyEnv::from_values(value, "", "", "");
                let intercept = env
                    .matcher
                    .intercept(url)
                    .ok_or_else(|| "a proxy URL it cannot use".to_owned())?;
                Ok(Some(ProxyTarget {
                    uri: intercept.uri().clone(),
                    auth: intercept.basic_auth().cloned(),
                    shown: redacted_url(value),
                }))
            }
        }
    }
}
