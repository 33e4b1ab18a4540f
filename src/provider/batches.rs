//! Anthropic's Message Batches name where their results are with an absolute URL on the
//! provider (`results_url`), which the SDK fetches as it is: past the gateway, with the
//! gateway client's key (audit IF 2). The answers that carry one, and the document with each
//! such URL made the gateway's, every other byte untouched.

use bytes::Bytes;
use http::Method;
use serde_json::value::RawValue;

use crate::provider::request::Members;
use crate::provider::Api;

/// Whether the answer to `method` on the upstream's `path` is a batch or a list of them:
/// create (`POST .../messages/batches`), list (`GET` the same), retrieve (`GET
/// .../messages/batches/{id}`) and cancel (`POST .../messages/batches/{id}/cancel`, which
/// answers the batch too). An OpenAI upstream has no such path; `auto` may be Anthropic.
/// A HEAD is the GET without its body (RFC 9110 9.3.2): it names them as the GET would,
/// though there is no body to rewrite, so that its answer says no length the GET would not
/// send (audit PC 6).
pub fn names_results_urls(api: Api, method: &Method, path: &str) -> bool {
    if api == Api::OpenAi || !matches!(*method, Method::GET | Method::HEAD | Method::POST) {
        return false;
    }
    let method = if *method == Method::HEAD {
        &Method::GET
    } else {
        method
    };
    let path = path.split('?').next().unwrap_or_default();
    let mut rest = path.trim_end_matches('/').rsplit('/');
    let (last, before, third, fourth) = (rest.next(), rest.next(), rest.next(), rest.next());
    let id = |s: Option<&str>| s.is_some_and(|s| !s.is_empty());
    match (last, before, third, fourth) {
        (Some("batches"), Some("messages"), ..) => true,
        (last, Some("batches"), Some("messages"), _) => *method == Method::GET && id(last),
        (Some("cancel"), last, Some("batches"), Some("messages")) => {
            *method == Method::POST && id(last)
        }
        _ => false,
    }
}

/// The path of the client SDK's base URL, from the path it asked for: what comes before
/// `/v1/messages/batches` (`/anthropic` for `/anthropic/v1/messages/batches/b`), else none.
pub fn sdk_base_path(path: &str) -> &str {
    path.find("/v1/messages/batches")
        .map_or("", |at| &path[..at])
}

/// `path`, a gateway path the client's `base` path begins, made relative to that base as the
/// Anthropic SDK joins a `results_url` path to its base URL's path (`base + path`): with a
/// base of `/z`, `/z/v1/x` is `/v1/x`, which the SDK makes `/z/v1/x` again (audit JB 3: it
/// asked for `/z/z/v1/x`).
pub fn base_relative(path: String, base: &str) -> String {
    match path.strip_prefix(base) {
        // Never `//host` or `/\host` (audit JB 2).
        Some(rest)
            if !base.is_empty()
                && rest.starts_with('/')
                && !matches!(rest.as_bytes().get(1), Some(b'/' | b'\\')) =>
        {
            rest.to_owned()
        }
        _ => path,
    }
}

/// `url` as the absolute path it names when it is on Anthropic's public origin
/// (`https://api.anthropic.com`, port 443 written or not). An upstream in front of Anthropic
/// (Cloudflare's or Portkey's gateway, a mock) passes Anthropic's own URLs on; fetched
/// through the gateway, the path goes to that upstream, which served the batch.
pub fn anthropic_path(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, target) = rest.split_at(end);
    let host = authority.strip_suffix(":443").unwrap_or(authority);
    if !host.eq_ignore_ascii_case("api.anthropic.com") {
        return None;
    }
    let path = match target.strip_prefix('/') {
        Some(_) => target.to_owned(),
        None => format!("/{target}"),
    };
    // `//host/...` or `/\host` would send the SDK to another host (audit JB 2).
    (!matches!(path.as_bytes().get(1), Some(b'/' | b'\\'))).then_some(path)
}

/// `doc` with its top-level `results_url`, and that of each object in its top-level `data`
/// array, replaced by what `localize` makes of it (the URL decoded from its JSON string).
/// `None` when nothing changes: not a JSON object, no such URL, or none `localize` takes.
pub fn localize_results_urls(
    doc: &[u8],
    localize: impl Fn(&str) -> Option<String>,
) -> Option<Bytes> {
    let members = Members::parse(doc)?;
    let mut urls: Vec<&RawValue> = Vec::new();
    // Named twice, it is read one way by one parser and another by the next: left alone.
    if let Ok(Some(url)) = members.get("results_url") {
        urls.push(url);
    }
    if let Ok(Some(data)) = members.get("data") {
        if let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(data.get()) {
            for item in items {
                if let Some(Ok(Some(url))) =
                    Members::parse(item.get().as_bytes()).map(|m| m.get("results_url"))
                {
                    urls.push(url);
                }
            }
        }
    }
    let at = |raw: &RawValue| raw.get().as_ptr() as usize - doc.as_ptr() as usize;
    // A top-level `results_url` may come after `data`.
    urls.sort_by_key(|raw| at(raw));
    let mut out: Vec<u8> = Vec::new();
    let mut copied = None;
    for raw in urls {
        let Ok(url) = serde_json::from_str::<String>(raw.get()) else {
            continue;
        };
        let Some(local) = localize(&url) else {
            continue;
        };
        let Ok(quoted) = serde_json::to_string(&local) else {
            continue;
        };
        let start = at(raw);
        if copied.is_none() {
            out.reserve(doc.len());
        }
        out.extend_from_slice(&doc[copied.unwrap_or(0)..start]);
        out.extend_from_slice(quoted.as_bytes());
        copied = Some(start + raw.get().len());
    }
    out.extend_from_slice(&doc[copied?..]);
    Some(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answers_that_name_results_urls() {
        for (api, method, path, want) in [
            (Api::Anthropic, Method::POST, "/v1/messages/batches", true),
            (
                Api::Anthropic,
                Method::GET,
                "/v1/messages/batches?limit=2",
                true,
            ),
            (
                Api::Auto,
                Method::GET,
                "/v1/messages/batches/msgbatch_1",
                true,
            ),
            (
                Api::Anthropic,
                Method::GET,
                "/messages/batches/msgbatch_1/",
                true,
            ),
            (
                Api::Anthropic,
                Method::POST,
                "/v1/messages/batches/b/cancel",
                true,
            ),
            // The results themselves (JSONL), a delete, and what is not a batch.
            (
                Api::Anthropic,
                Method::GET,
                "/v1/messages/batches/b/results",
                false,
            ),
            (
                Api::Anthropic,
                Method::DELETE,
                "/v1/messages/batches/b",
                false,
            ),
            (
                Api::Anthropic,
                Method::GET,
                "/v1/messages/batches/b/cancel",
                false,
            ),
            (
                Api::Anthropic,
                Method::POST,
                "/v1/messages/batches/b",
                false,
            ),
            (Api::Anthropic, Method::POST, "/v1/messages", false),
            (Api::Anthropic, Method::GET, "/v1/batches/b", false),
            (Api::OpenAi, Method::GET, "/v1/messages/batches/b", false),
            (Api::Anthropic, Method::HEAD, "/v1/messages/batches/b", true),
            (Api::Auto, Method::HEAD, "/v1/messages/batches", true),
            (
                Api::Anthropic,
                Method::HEAD,
                "/v1/messages/batches/b/cancel",
                false,
            ),
        ] {
            assert_eq!(
                names_results_urls(api, &method, path),
                want,
                "{method} {path}"
            );
        }
    }

    #[test]
    fn a_path_under_the_sdks_base_is_made_relative_to_it() {
        assert_eq!(sdk_base_path("/z/v1/messages/batches/b"), "/z");
        assert_eq!(sdk_base_path("/v1/messages/batches"), "");
        assert_eq!(sdk_base_path("/other/b"), "");
        let rel = |p: &str, base: &str| base_relative(p.to_owned(), base);
        assert_eq!(
            rel("/z/v1/messages/batches/b/results", "/z"),
            "/v1/messages/batches/b/results"
        );
        assert_eq!(
            rel("/v1/messages/batches/b/results", ""),
            "/v1/messages/batches/b/results"
        );
        // Not under the base: as it is.
        assert_eq!(rel("/zz/v1/x", "/z"), "/zz/v1/x");
        assert_eq!(rel("/z", "/z"), "/z");
        assert_eq!(rel("/z//evil.example/x", "/z"), "/z//evil.example/x");
    }

    #[test]
    fn anthropics_public_urls_are_the_paths_they_name() {
        for (url, want) in [
            (
                "https://api.anthropic.com/v1/messages/batches/b/results",
                Some("/v1/messages/batches/b/results"),
            ),
            ("HTTPS://API.Anthropic.com:443/v1/x?a=1", Some("/v1/x?a=1")),
            ("https://api.anthropic.com", Some("/")),
            ("https://api.anthropic.com?a", Some("/?a")),
            ("http://api.anthropic.com/v1/x", None),
            ("https://api.anthropic.com:8443/v1/x", None),
            ("https://api.anthropic.com.evil/v1/x", None),
            ("https://u@api.anthropic.com/v1/x", None),
            ("https://files.anthropic.com/v1/x", None),
            ("/v1/x", None),
            // Another host once the origin is gone (audit JB 2).
            ("https://api.anthropic.com//evil.example/r", None),
            ("https://api.anthropic.com/\\evil.example/r", None),
        ] {
            assert_eq!(anthropic_path(url).as_deref(), want, "{url}");
        }
    }

    #[test]
    fn results_urls_at_the_top_and_in_a_lists_data_are_localized() {
        let local = |u: &str| u.strip_prefix("https://up").map(str::to_owned);
        let one =
            br#"{"id":"b","results_url": "https:\/\/up/v1/messages/batches/b/results" ,"x":1}"#;
        assert_eq!(
            localize_results_urls(one, local).unwrap(),
            &br#"{"id":"b","results_url": "/v1/messages/batches/b/results" ,"x":1}"#[..]
        );
        let after = br#"{"data":[{"results_url":"https://up/a"}],"results_url":"https://up/b"}"#;
        assert_eq!(
            localize_results_urls(after, local).unwrap(),
            &br#"{"data":[{"results_url":"/a"}],"results_url":"/b"}"#[..]
        );
        let list =
            br#"{"data":[{"results_url":null},{"id":"c","results_url":"https://up/c/results"},
            {"results_url":"https://other/d"},{"results_url":"https://up/e"}],"has_more":false}"#;
        assert_eq!(
            localize_results_urls(list, local).unwrap(),
            &br#"{"data":[{"results_url":null},{"id":"c","results_url":"/c/results"},
            {"results_url":"https://other/d"},{"results_url":"/e"}],"has_more":false}"#[..]
        );
        for unchanged in [
            &br#"{"results_url":null}"#[..],
            br#"{"results_url":"https://other/x"}"#,
            br#"{"results_url":"https://up/a","results_url":"https://up/b"}"#,
            br#"{"nested":{"results_url":"https://up/a"}}"#,
            br#"["https://up/a"]"#,
            b"not json",
        ] {
            assert_eq!(localize_results_urls(unchanged, local), None);
        }
    }
}
