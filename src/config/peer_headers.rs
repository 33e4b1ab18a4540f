//! An upstream's `headers` (request headers the operator sets, as nginx's
//! `proxy_set_header`) and `hide_headers` (answer headers dropped, as nginx's
//! `proxy_hide_header`), checked at load. Both exist for peer gateways behind Hourglass:
//! `headers` pins what a peer reads from the request where the client may no longer choose
//! it (Portkey's `x-portkey-provider` beside a key the gateway injects: audit UD 1), and
//! `hide_headers` drops a peer's internal answer headers (LiteLLM's
//! `x-litellm-model-api-base`, the address of the provider behind it: audit UD 2).

use std::collections::BTreeMap;
use std::fmt;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::http::client_steering::{ACCOUNT_SELECTORS, CREDENTIALS};
use crate::http::headers::is_hop_by_hop;

/// One `hide_headers` entry: an exact name, or a prefix (`x-litellm-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HidePattern {
    Name(HeaderName),
    Prefix(String),
}

impl HidePattern {
    pub fn matches(&self, name: &HeaderName) -> bool {
        match self {
            Self::Name(n) => n == name,
            Self::Prefix(p) => name.as_str().starts_with(p.as_str()),
        }
    }
}

impl fmt::Display for HidePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(n) => f.write_str(n.as_str()),
            Self::Prefix(p) => write!(f, "{p}*"),
        }
    }
}

/// Removes from an upstream's answer head every header a pattern matches. One pass over the
/// names finds them (most answers carry none).
pub fn hide(headers: &mut HeaderMap, patterns: &[HidePattern]) {
    let hidden = |n: &HeaderName| patterns.iter().any(|p| p.matches(n));
    if patterns.is_empty() || !headers.keys().any(hidden) {
        return;
    }
    let names: Vec<HeaderName> = headers.keys().filter(|n| hidden(n)).cloned().collect();
    for name in names {
        headers.remove(name);
    }
}

/// Why the gateway keeps a request header to itself: `None` where `headers` may set it.
fn set_by_gateway(name: &HeaderName) -> Option<&'static str> {
    if CREDENTIALS.contains(name) {
        // The two a provider reads its own key from name the `auth` that sends it there.
        return Some(match name.as_str() {
            "api-key" => {
                "the gateway sends the upstream's key itself: set api_key_env or \
                 api_key_file, and auth = \"api-key\""
            }
            "x-goog-api-key" => {
                "the gateway sends the upstream's key itself: set api_key_env or \
                 api_key_file, and auth = \"x-goog-api-key\""
            }
            _ => "the gateway sends the upstream's key itself (api_key_env, api_key_file, auth)",
        });
    }
    if ACCOUNT_SELECTORS.contains(name) {
        return Some(
            "it picks the account of the upstream's key: set organization or project \
             (or the key's own scope)",
        );
    }
    if *name == header::HOST {
        return Some("the gateway sends the upstream url's host");
    }
    if *name == header::CONTENT_LENGTH || *name == header::TRANSFER_ENCODING {
        return Some("it frames the request body, which the gateway does");
    }
    if is_hop_by_hop(name) || *name == header::EXPECT {
        return Some("it is about one connection, not the request (hop-by-hop)");
    }
    match name.as_str() {
        "x-request-budget-ms" => Some("the gateway sends the budget left (propagate_budget)"),
        "via" | "x-hourglass-hops" => Some("the gateway counts its own hops with it"),
        "x-request-id" => Some("the gateway sends its request id in it"),
        "accept-encoding" => Some("the gateway asks for what it can read"),
        _ => None,
    }
}

/// `headers`: names and values checked, lowercased, and refused where the gateway sets the
/// header itself. Values are shown by `hourglass check` (those of a header that may carry a
/// peer's credentials masked, see `describe`): a key goes in `api_key_env`, never here.
pub(super) fn set_headers(
    label: &str,
    raw: Option<BTreeMap<String, String>>,
) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut out: Vec<(HeaderName, HeaderValue)> = Vec::new();
    for (name, value) in raw.unwrap_or_default() {
        let parsed = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("{label}: headers: {name:?} is not a header name"))?;
        if let Some(why) = set_by_gateway(&parsed) {
            return Err(format!(
                "{label}: headers: {parsed} cannot be set here: {why}"
            ));
        }
        if out.iter().any(|(n, _)| *n == parsed) {
            return Err(format!(
                "{label}: headers: {parsed} is named twice (names are case-insensitive)"
            ));
        }
        // Visible ASCII and inner spaces: what every HTTP/1 and HTTP/2 peer takes.
        let value = value.trim();
        if !value.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
            return Err(format!(
                "{label}: headers: {parsed}'s value must be visible ASCII (spaces inside allowed)"
            ));
        }
        let value = HeaderValue::from_str(value)
            .map_err(|_| format!("{label}: headers: {parsed}'s value is not a header value"))?;
        out.push((parsed, value));
    }
    Ok(out)
}

/// The answer headers the gateway reads to deliver the body: hiding one would change how
/// the body is read, so no pattern may cover them.
const FRAMING: [HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
    header::TRANSFER_ENCODING,
];

/// `hide_headers`: exact names, or a prefix ending in `*`; none that covers a header the
/// body is read by. Those the gateway adds to answers itself (`x-request-id`, `x-run-*`,
/// `x-hourglass-partial`, `x-should-retry`, SSE's `cache-control`) are added after the
/// upstream's head is filtered: a pattern that names one hides only the upstream's own.
pub(super) fn hide_headers(
    label: &str,
    raw: Option<Vec<String>>,
) -> Result<Vec<HidePattern>, String> {
    let mut out = Vec::new();
    for entry in raw.unwrap_or_default() {
        let lower = entry.to_ascii_lowercase();
        // `*` is a character names may hold, but one inside an entry reads as a wildcard
        // this is not: only a trailing one is.
        if lower.trim_end_matches('*').contains('*') || lower.ends_with("**") {
            return Err(format!(
                "{label}: hide_headers: {entry:?} may hold only one *, at its end (as x-litellm-*)"
            ));
        }
        let pattern = match lower.strip_suffix('*') {
            Some(prefix) => {
                // A prefix is a header name's start: its characters are a name's.
                let valid = !prefix.is_empty() && HeaderName::from_bytes(prefix.as_bytes()).is_ok();
                if !valid {
                    return Err(format!(
                        "{label}: hide_headers: {entry:?} must be a header name, or the start \
                         of one followed by * (as x-litellm-*)"
                    ));
                }
                HidePattern::Prefix(prefix.to_owned())
            }
            None => HidePattern::Name(HeaderName::from_bytes(lower.as_bytes()).map_err(|_| {
                format!(
                    "{label}: hide_headers: {entry:?} must be a header name, or the start of \
                     one followed by * (as x-litellm-*)"
                )
            })?),
        };
        if let Some(framing) = FRAMING.iter().find(|n| pattern.matches(n)) {
            return Err(format!(
                "{label}: hide_headers: {pattern} would hide {framing}, which the gateway \
                 reads the answer's body by"
            ));
        }
        if !out.contains(&pattern) {
            out.push(pattern);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, &str)]) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
        let map = pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        set_headers("upstream \"u\"", Some(map))
    }

    /// Audit UD 1: the operator pins what a peer reads (Portkey's provider), never what the
    /// gateway sets itself.
    #[test]
    fn headers_take_names_and_values_the_gateway_does_not_set_itself() {
        let ok = set(&[
            ("X-Portkey-Provider", "openai"),
            ("x-portkey-trace-id", "a b"),
        ])
        .unwrap();
        assert_eq!(
            ok,
            [
                (
                    HeaderName::from_static("x-portkey-provider"),
                    HeaderValue::from_static("openai")
                ),
                (
                    HeaderName::from_static("x-portkey-trace-id"),
                    HeaderValue::from_static("a b")
                ),
            ]
        );
        for name in [
            "authorization",
            "x-api-key",
            "api-key",
            "x-portkey-api-key",
            "openai-organization",
            "host",
            "content-length",
            "transfer-encoding",
            "connection",
            "te",
            "proxy-authorization",
            "x-request-budget-ms",
            "via",
            "x-hourglass-hops",
        ] {
            let e = set(&[(name, "v")]).unwrap_err();
            assert!(e.contains("cannot be set here"), "{name}: {e}");
        }
        for (name, value) in [
            ("bad name", "v"),
            ("", "v"),
            ("x-a", "caf\u{e9}"),
            ("x-a", "a\u{7f}"),
            ("x-a", "a\tb"),
        ] {
            assert!(set(&[(name, value)]).is_err(), "{name:?} {value:?}");
        }
        let e = set(&[("X-A", "1"), ("x-a", "2")]).unwrap_err();
        assert!(e.contains("named twice"), "{e}");
    }

    /// Audit UD 2.
    #[test]
    fn hide_headers_take_names_and_prefixes_that_leave_the_body_readable() {
        let patterns = |v: &[&str]| {
            hide_headers(
                "upstream \"u\"",
                Some(v.iter().map(|s| s.to_string()).collect()),
            )
        };
        let p = patterns(&["X-LiteLLM-*", "x-litellm-version", "server"]).unwrap();
        assert_eq!(
            p,
            [
                HidePattern::Prefix("x-litellm-".into()),
                HidePattern::Name(HeaderName::from_static("x-litellm-version")),
                HidePattern::Name(HeaderName::from_static("server")),
            ]
        );
        assert_eq!(p[0].to_string(), "x-litellm-*");
        for bad in [
            "*",
            "content-type",
            "content-*",
            "c*",
            "Transfer-Encoding",
            "bad name",
            "x-a*b*",
            "",
        ] {
            assert!(patterns(&[bad]).is_err(), "{bad:?}");
        }
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("x-litellm-model-api-base", "http://127.0.0.1:9/v1"),
            ("x-litellm-key-spend", "0.0"),
            ("x-litellm-version", "1.108.7"),
            ("server", "uvicorn"),
            ("content-type", "application/json"),
            ("x-litellmx", "kept"),
        ] {
            h.append(n, HeaderValue::from_static(v));
        }
        hide(&mut h, &p);
        let mut left: Vec<_> = h.keys().map(|n| n.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "x-litellmx"]);
    }
}
