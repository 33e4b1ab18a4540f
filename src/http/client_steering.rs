//! The headers a client may not send upstream: those that carry a key, pick the account a
//! key acts for or where a peer gateway sends it (none of which may ride beside a key the
//! gateway sends), and those that have an upstream serve another path or method than the
//! request line's (never). Which of them a route removes is decided in `upstream` and
//! `gateway::forward`; `carries_credentials` says which values are never logged.

use http::header::{self, HeaderMap, HeaderName};

use super::headers::{present, API_KEY, X_API_KEY, X_GOOG_API_KEY};

/// Every header a provider, or a proxy or gateway in front of one, reads a key from:
/// OpenAI's and Anthropic's, Azure OpenAI's `api-key`, Google's `x-goog-api-key`, Azure API
/// Management's, LiteLLM's (which it prefers to `Authorization`), Cloudflare AI Gateway's and
/// Portkey's. When the gateway sends its own key, or keeps a keyed route's key from the
/// upstream, none of the client's may ride along: the upstream could bill the one it
/// prefers, and the client's key for this gateway would reach a third party.
pub const CREDENTIALS: [HeaderName; 8] = [
    header::AUTHORIZATION,
    X_API_KEY,
    API_KEY,
    X_GOOG_API_KEY,
    HeaderName::from_static("ocp-apim-subscription-key"),
    HeaderName::from_static("x-litellm-api-key"),
    HeaderName::from_static("cf-aig-authorization"),
    HeaderName::from_static("x-portkey-api-key"),
];

/// Removes every header in `CREDENTIALS`, looking up only those present (most requests carry
/// one).
pub fn strip_credentials(headers: &mut HeaderMap) {
    for (name, _) in CREDENTIALS
        .iter()
        .zip(present(headers, CREDENTIALS.each_ref()))
        .filter(|(_, p)| *p)
    {
        headers.remove(name);
    }
}

/// The headers that pick which account a key acts for, where one key may act for several:
/// OpenAI's organization and project (a user key or a multi-project key) and Google's quota
/// and billing project. Beside a key the gateway injects they are the operator's to choose,
/// never the client's: a client holding only a gateway key could otherwise read another
/// project's files and batches and bill another organization (audit PC 4). Azure's resource
/// and Anthropic's workspace follow the URL and the key, which the client cannot pick.
pub const ACCOUNT_SELECTORS: [HeaderName; 3] = [
    OPENAI_ORGANIZATION,
    OPENAI_PROJECT,
    HeaderName::from_static("x-goog-user-project"),
];
/// What an upstream's `organization` sets.
pub const OPENAI_ORGANIZATION: HeaderName = HeaderName::from_static("openai-organization");
/// What an upstream's `project` sets.
pub const OPENAI_PROJECT: HeaderName = HeaderName::from_static("openai-project");

/// Removes every header in `ACCOUNT_SELECTORS` (looking up only those present, as
/// `strip_credentials` does).
pub fn strip_account_selectors(headers: &mut HeaderMap) {
    for (name, _) in ACCOUNT_SELECTORS
        .iter()
        .zip(present(headers, ACCOUNT_SELECTORS.each_ref()))
        .filter(|(_, p)| *p)
    {
        headers.remove(name);
    }
}

/// Whether a header picks where a peer gateway in front of a provider sends the key it is
/// given, or which credentials or account it uses there: Portkey's provider (which picks
/// the provider's host: `groq` is api.groq.com, `azure-openai` an Azure resource anyone may
/// register), custom host, config (which can carry a host and keys), virtual key, and the
/// headers of its clouds and providers that
/// name a host, a region, an account or credentials; Helicone's target URL and provider, its
/// older Azure base URL and its fallbacks (each a URL with headers); and LiteLLM's `x-pass-`
/// form of a header the gateway removes itself (LiteLLM sends `x-pass-NAME` on as `NAME`).
/// Beside a key the gateway injects these are the operator's to set, in the peer's own
/// config, never the client's: a client holding only a gateway key had Portkey send the
/// operator's provider key to a host of its choosing (audit SA 2), or, by naming another
/// provider, to that provider's host (audit UD 1); the operator pins it with the upstream's
/// `headers`. Those that pick no host, account or key (Portkey's trace id,
/// metadata, cache; Helicone's properties) pass.
pub fn steers_peer(name: &HeaderName) -> bool {
    let name = name.as_str();
    if let Some(rest) = name.strip_prefix("x-portkey-") {
        return matches!(
            rest,
            "provider"
                | "custom-host"
                | "config"
                | "virtual-key"
                | "openai-organization"
                | "openai-project"
                | "huggingface-base-url"
                | "workers-ai-account-id"
                | "fireworks-account-id"
                | "snowflake-account"
        ) || ["azure-", "aws-", "amz-", "vertex-", "oracle-"]
            .iter()
            .any(|cloud| rest.starts_with(cloud));
    }
    if let Some(rest) = name.strip_prefix("helicone-") {
        return matches!(
            rest,
            "target-url" | "target-provider" | "openai-api-base" | "fallbacks"
        );
    }
    if let Some(rest) = name.strip_prefix("x-pass-") {
        return HeaderName::from_bytes(rest.as_bytes())
            .is_ok_and(|n| CREDENTIALS.contains(&n) || ACCOUNT_SELECTORS.contains(&n));
    }
    false
}

/// Removes every header `steers_peer` names. One pass over the names finds them (most
/// requests carry none); they are removed by name after it.
pub fn strip_peer_steering(headers: &mut HeaderMap) {
    if !headers.keys().any(steers_peer) {
        return;
    }
    let steering: Vec<HeaderName> = headers.keys().filter(|n| steers_peer(n)).cloned().collect();
    for name in steering {
        headers.remove(name);
    }
}

/// Headers with which some stacks serve another path or method than the request line's:
/// IIS URL Rewrite and older Symfony read `X-Original-URL` and `X-Rewrite-URL`, and
/// method-override middleware (Express's, Rails', Google's APIs) `X-HTTP-Method-Override`,
/// `X-HTTP-Method` and `X-Method-Override`. The gateway routes, limits and logs a request by
/// its request line, so an upstream that read one would serve a path or method the route
/// never exposed, with the route's key (audit SA 3). Removed on every route.
pub const REWRITES: [HeaderName; 5] = [
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// Removes every header in `REWRITES` (looking up only those present, as
/// `strip_credentials` does).
pub fn strip_rewrites(headers: &mut HeaderMap) {
    for (name, _) in REWRITES
        .iter()
        .zip(present(headers, REWRITES.each_ref()))
        .filter(|(_, p)| *p)
    {
        headers.remove(name);
    }
}

/// Whether a header carries a credential of some kind: a key (`CREDENTIALS`), a proxy's
/// credentials or a cookie. Such a header's value must never be logged or shown.
pub fn carries_credentials(name: &HeaderName) -> bool {
    CREDENTIALS.contains(name) || *name == header::PROXY_AUTHORIZATION || *name == header::COOKIE
}

/// A query without its `key` parameters: Google's APIs (Gemini, and its OpenAI-compatible
/// endpoint) take an API key from `?key=` as from `x-goog-api-key`, so where the gateway sends
/// its own key a client's must not ride beside it there either (audit WA 2). A name is read
/// as a server decodes it (`k%65y` is `key`); every other byte of the query is kept as it
/// came, separators too. `None` when the query has no such parameter (no allocation, as for
/// nearly every request); `Some("")` when nothing is left of it.
pub fn without_query_key(query: &str) -> Option<String> {
    let is_key = |pair: &&str| {
        let name = pair.split('=').next().unwrap_or_default();
        name == "key" || (name.contains('%') && percent_decoded(name) == b"key")
    };
    if !query.split('&').any(|pair| is_key(&pair)) {
        return None;
    }
    let kept: Vec<&str> = query.split('&').filter(|pair| !is_key(pair)).collect();
    Some(kept.join("&"))
}

/// `text` with its `%XX` escapes decoded (a `%` not followed by two hex digits kept as is).
fn percent_decoded(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = bytes
            .get(at + 1..at + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[at], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                at += 3;
            }
            (b, _) => {
                out.push(b);
                at += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    /// Audit SA 2.
    #[test]
    fn only_headers_that_steer_a_peer_gateway_are_named() {
        for name in [
            "x-portkey-custom-host",
            "x-portkey-config",
            "x-portkey-virtual-key",
            "x-portkey-azure-resource-name",
            "x-portkey-azure-foundry-url",
            "x-portkey-aws-access-key-id",
            "x-portkey-amz-server-side-encryption-aws-kms-key-id",
            "x-portkey-vertex-region",
            "x-portkey-oracle-region",
            "x-portkey-openai-project",
            "x-portkey-huggingface-base-url",
            "helicone-target-url",
            "helicone-target-provider",
            "helicone-openai-api-base",
            "helicone-fallbacks",
            "x-pass-authorization",
            "x-pass-x-api-key",
            "x-pass-openai-organization",
            // Audit UD 1: the provider picks the host.
            "x-portkey-provider",
        ] {
            assert!(steers_peer(&HeaderName::from_static(name)), "{name}");
        }
        for name in [
            "x-portkey-trace-id",
            "x-portkey-metadata",
            "x-portkey-cache",
            "x-portkey-forward-headers",
            "x-portkey-api-key",
            "x-portkey-",
            "helicone-auth",
            "helicone-property-app",
            "x-pass-anthropic-beta",
            "x-pass-",
            "authorization",
            "openai-organization",
            "content-type",
        ] {
            assert!(!steers_peer(&HeaderName::from_static(name)), "{name}");
        }
        let mut h = HeaderMap::new();
        h.append(
            "x-portkey-custom-host",
            HeaderValue::from_static("http://a"),
        );
        h.append(
            "x-portkey-custom-host",
            HeaderValue::from_static("http://b"),
        );
        h.append("x-portkey-trace-id", HeaderValue::from_static("t-1"));
        strip_peer_steering(&mut h);
        assert_eq!(h.keys().collect::<Vec<_>>(), ["x-portkey-trace-id"]);
    }

    /// Audit WA 2.
    #[test]
    fn a_key_parameter_is_dropped_from_a_query_and_nothing_else() {
        for (query, left) in [
            ("key=CLIENT", Some("")),
            ("alt=sse&key=CLIENT&x=%c3%a9", Some("alt=sse&x=%c3%a9")),
            ("key", Some("")),
            ("key=a&key=b", Some("")),
            ("k%65y=A&keys=1", Some("keys=1")),
            ("%6B%65%79=A&a&&b=key", Some("a&&b=key")),
            ("a&&key=1&", Some("a&&")),
            ("keys=1&monkey=2&Key=3&x=key", None),
            ("%zz&%", None),
            ("", None),
        ] {
            assert_eq!(without_query_key(query).as_deref(), left, "{query}");
        }
    }
}
