//! What a request may ask of the upstream beyond its route: a request target means one path
//! on the gateway's own scheme (no `.` or `..` segment, no userinfo, no other scheme, and a
//! path at all), and no header has the upstream serve another path or method than the one
//! routed (audit SA 3, SA 5).

use super::*;

/// A `.` or `..` segment (also percent-encoded) would be resolved by the upstream to another
/// path than the one the route matched: `/v1/chat/completions/../../files` took the chat
/// route, its key and its budget to the provider's `/v1/files`. Refused before routing.
#[tokio::test]
async fn paths_with_dot_segments_are_refused_before_routing() {
    let h = Harness::start().await;
    for path in [
        "/v1/chat/completions/../../files",
        "/raw/../v1/chat/completions",
        "/v1/chat/completions/./x",
        "/v1/chat/completions/..",
        "/v1/chat/completions/%2e%2E/x",
        "/v1/chat/completions/.%2e/x",
        "/v1/chat/completions/%2E./x",
        "/v1/chat/completions/%2e",
        "/v1/chat/completions/../..?q=1",
    ] {
        let req = http::Request::get(path)
            .header("host", "gateway")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let (resp, _c) = h.send(req).await;
        assert_eq!(resp.status(), 400, "{path}");
        let v = json_body(resp).await;
        assert_eq!(v["error"]["code"], "invalid_request", "{path}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{path}");
        let message = v["error"]["message"].as_str().unwrap();
        let bare = path.split('?').next().unwrap();
        assert!(message.contains(&format!("{bare:?}")), "{path}: {message}");
        assert!(
            !message.contains("q=1"),
            "the query is never repeated: {message}"
        );
    }
    assert!(h.fake.requests().is_empty(), "{:?}", h.fake.requests());
    // Dots that are not a whole segment are part of a name like any other; forwarded in
    // the one spelling of equivalent paths (`%2e` is `.`, `//` is `/`).
    for (path, forwarded) in [
        ("/v1/chat/completions/...", "/v1/chat/completions/..."),
        ("/v1/chat/completions/a..b", "/v1/chat/completions/a..b"),
        (
            "/v1/chat/completions/.well-known",
            "/v1/chat/completions/.well-known",
        ),
        ("/v1/chat/completions/%2e%2e%2e", "/v1/chat/completions/..."),
        ("/v1/chat/completions//x", "/v1/chat/completions/x"),
    ] {
        let before = h.fake.requests().len();
        let req = http::Request::get(path)
            .header("host", "gateway")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let _ = h.send(req).await;
        let requests = h.fake.requests();
        assert_eq!(requests.len(), before + 1, "{path}");
        assert_eq!(requests[before].path, forwarded, "{path}");
    }
}

/// Audit SA 3: `X-Original-URL`, `X-Rewrite-URL` and the method overrides reached the
/// upstream, where some stacks (IIS URL Rewrite, older Symfony; method-override middleware)
/// serve the path or method they name, not the one the gateway routed, with the route's key.
/// They are dropped on every route. The forwarding headers pass as the client sent them, and
/// the gateway adds none: the upstream is a third party, and the client's address is not its
/// to learn.
#[tokio::test]
async fn rewrite_and_override_headers_are_not_forwarded() {
    let h = Harness::start().await;
    let rewrites = [
        ("x-original-url", "/v1/files"),
        ("x-rewrite-url", "/v1/files"),
        ("x-http-method-override", "DELETE"),
        ("x-http-method", "DELETE"),
        ("x-method-override", "DELETE"),
    ];
    let forwarding = [
        ("x-forwarded-for", "10.0.0.1"),
        ("x-forwarded-host", "evil.example"),
        ("forwarded", "for=1.2.3.4;host=evil"),
    ];
    let all: Vec<_> = rewrites.iter().chain(&forwarding).copied().collect();
    let (resp, _c) = h.send(chat_request(&all, false)).await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    let seen = h.fake.requests();
    for (name, _) in rewrites {
        assert_eq!(seen[0].headers.get(name), None, "{name}");
    }
    for (name, value) in forwarding {
        let lines: Vec<_> = seen[0].headers.get_all(name).iter().collect();
        assert_eq!(lines, [value], "{name}");
        assert_eq!(seen[1].headers.get(name), None, "{name}: none added");
    }
}

/// RFC 9112 3.2: `OPTIONS *` asks about the server itself, so the gateway answers it (it was
/// 404 `no_route`), and an authority-form target on any method but CONNECT names no path:
/// 400 saying so, not 404 for path `""` (audit M). Neither is forwarded.
#[tokio::test]
async fn targets_that_name_no_path() {
    let h = Harness::start().await;
    let ended = |got: &[u8]| got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"}");
    let (text, _) = raw_exchange(
        h.addr(),
        b"OPTIONS * HTTP/1.1\r\nhost: g\r\nconnection: close\r\n\r\n",
        |_| false,
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("allow: get, head, post, put, patch, delete, options"),
        "{text}"
    );
    let (text, _) = raw_exchange(
        h.addr(),
        b"GET api.openai.com:443 HTTP/1.1\r\nhost: g\r\nconnection: close\r\n\r\n",
        ended,
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("\"code\":\"invalid_request\""), "{text}");
    assert!(text.contains("is no path"), "{text}");
    assert!(h.fake.requests().is_empty(), "nothing forwarded");
}

/// Audit SA 5: an absolute-form target with userinfo (`http://user:pass@host/...`) was
/// routed by its path and forwarded over HTTP/1.1, where HTTP/2 refuses the same authority;
/// an `ftp://` target was served as if it were http. RFC 9110 4.2.4 has a recipient treat
/// userinfo from an untrusted source as an error, and the gateway serves http(s) alone: 400
/// `invalid_request` for either, nothing forwarded, the userinfo never repeated.
#[tokio::test]
async fn absolute_targets_with_userinfo_or_another_scheme_are_refused() {
    let h = Harness::start().await;
    let body = r#"{"model":"gpt-test","messages":[]}"#;
    let ended = |got: &[u8]| got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"}");
    for (target, says) in [
        (
            "http://user:pass@evil.example/v1/chat/completions",
            "userinfo",
        ),
        ("https://user@gateway/v1/chat/completions", "userinfo"),
        ("ftp://evil.example/v1/chat/completions", "scheme"),
    ] {
        let raw = format!(
            "POST {target} HTTP/1.1\r\nhost: other\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let (text, _) = raw_exchange(h.addr(), raw.as_bytes(), ended).await;
        assert!(text.starts_with("HTTP/1.1 400"), "{target}: {text}");
        assert!(
            text.contains("\"code\":\"invalid_request\""),
            "{target}: {text}"
        );
        assert!(text.contains(says), "{target}: {text}");
        assert!(!text.contains("pass"), "{target}: {text}");
    }
    assert!(h.fake.requests().is_empty(), "nothing forwarded");
    // An absolute-form target of the gateway's schemes, without userinfo, is served.
    let raw = format!(
        "POST http://gateway/v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let (text, _) = raw_exchange(h.addr(), raw.as_bytes(), |_| false).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(h.fake.requests().len(), 1);
}
