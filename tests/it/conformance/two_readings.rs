//! One request, two readings: what the upstream receives against what the client sent (audit
//! WA). Trailers of a request body are dropped (and said so), a client's `?key=` never rides
//! beside the gateway's key, the call rewrites (`stream_upstream`, `include_usage`) apply to
//! a `POST` only, and repeated `Cookie` lines reach the upstream as one.

use super::*;
use http_body_util::Full;

/// What the fake upstream received last: method, path and query, headers, body.
fn last(h: &Harness) -> hourglass_fake::RequestRecord {
    h.fake.requests().pop().expect("the upstream got a request")
}

/// Audit WA 1: a request's trailers end its body; the gateway reads the body whole and
/// forwards it with a `content-length`, so the trailer fields go nowhere (RFC 9112 7.1.2
/// lets a recipient that removes the chunked coding discard them). Documented in
/// lifecycle.md; pinned here for HTTP/1.1 chunked bodies and HTTP/2 trailing HEADERS.
#[tokio::test]
async fn request_trailers_are_dropped_over_http1_and_http2() {
    use http_body_util::BodyExt as _;
    let h = Harness::start().await;
    let body = r#"{"model":"x","messages":[]}"#;
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
         te: trailers\r\ntrailer: x-checksum\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n\
         {:x}\r\n{body}\r\n0\r\nx-checksum: sha256=abc\r\n\r\n",
        body.len()
    );
    let (answer, _) = raw_exchange(h.addr(), raw.as_bytes(), |_| false).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let seen = last(&h);
    assert_eq!(&seen.body[..], body.as_bytes());
    assert_eq!(seen.headers["content-length"], body.len().to_string());
    assert!(
        !seen.headers.contains_key("x-checksum"),
        "{:?}",
        seen.headers
    );
    assert!(!seen.headers.contains_key("trailer"), "{:?}", seen.headers);

    // HTTP/2: HEADERS, DATA, then a trailing HEADERS.
    let tcp = TcpStream::connect(h.addr()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-checksum", http::HeaderValue::from_static("sha256=abc"));
    let req = http::Request::post("http://gateway/v1/chat/completions")
        .header("content-type", "application/json")
        .body(
            Full::new(bytes::Bytes::from_static(body.as_bytes())).with_trailers(
                std::future::ready(Some(Ok::<_, std::convert::Infallible>(trailers))),
            ),
        )
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let seen = last(&h);
    assert_eq!(seen.version, http::Version::HTTP_11);
    assert_eq!(&seen.body[..], body.as_bytes());
    assert!(
        !seen.headers.contains_key("x-checksum"),
        "{:?}",
        seen.headers
    );
}

/// A gateway whose `fake` upstream sends the operator's key from a file.
async fn keyed() -> (Harness, tempfile::TempDir) {
    let dir = temp_dir("two-readings");
    let key = dir.path().join("upstream-key");
    std::fs::write(&key, "sk-operator-key-000000000000").unwrap();
    let cfg = BASE.replace(
        "api_key_env = \"HOURGLASS_TEST_KEY_UNSET\"",
        &format!("api_key_file = {:?}", key.display().to_string()),
    );
    (Harness::with_config(&cfg).await, dir)
}

fn chat_at(target: &str) -> http::Request<Full<bytes::Bytes>> {
    let mut req = chat_request(&[("authorization", "Bearer client")], false);
    *req.uri_mut() = target.parse().unwrap();
    req
}

/// Audit WA 2: Google's APIs take a key from `?key=` as from `x-goog-api-key`. Where the
/// gateway sends its own key, the client's went beside it in the query. Now every `key`
/// parameter (also percent-encoded in its name) is dropped, the rest of the query kept
/// byte-exact; where the gateway sends no key, the query passes as it came.
#[tokio::test]
async fn a_client_key_in_the_query_never_rides_beside_the_gateways() {
    let (h, _dir) = keyed().await;
    for (target, forwarded) in [
        (
            "/v1/chat/completions?key=CLIENT-KEY",
            "/v1/chat/completions",
        ),
        (
            "/v1/chat/completions?alt=sse&key=CLIENT-KEY&x=%c3%a9",
            "/v1/chat/completions?alt=sse&x=%c3%a9",
        ),
        (
            "/v1/chat/completions?k%65y=A&keys=1&monkey=2&a&&key&b=key",
            "/v1/chat/completions?keys=1&monkey=2&a&&b=key",
        ),
        ("/v1/chat/completions?", "/v1/chat/completions?"),
        ("/v1/chat/completions?x=1", "/v1/chat/completions?x=1"),
    ] {
        let (resp, _c) = h.send(chat_at(target)).await;
        assert_eq!(resp.status(), 200, "{target}");
        let seen = last(&h);
        assert_eq!(seen.path, forwarded, "{target}");
        assert_eq!(
            seen.headers["authorization"], "Bearer sk-operator-key-000000000000",
            "{target}"
        );
    }

    // No key of the gateway's: the client's own key, in the query too, is the one sent.
    let h = Harness::start().await;
    let target = "/v1/chat/completions?key=CLIENT-KEY&alt=sse";
    let (resp, _c) = h.send(chat_at(target)).await;
    assert_eq!(resp.status(), 200);
    let seen = last(&h);
    assert_eq!(seen.path, target);
    assert_eq!(seen.headers["authorization"], "Bearer client");
}

const CALLS: &str = r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
budget = "10s"
first_token_timeout = "2s"
idle_timeout = "1s"

[upstreams.fake]
url = "{FAKE}"
auth = "none"

[upstreams.counted]
url = "{FAKE}"
auth = "none"
include_usage = true
model = "pinned"

[[routes]]
name = "watched"
path_prefix = "/v1/chat/completions"
upstream = "fake"
stream_upstream = true

[[routes]]
name = "counted"
path_prefix = "/u/v1/chat/completions"
upstream = "counted"
"#;

/// Audit WA 3: `stream_upstream` and `include_usage` rewrote the body of any method on a
/// call's path: `GET /v1/chat/completions` (OpenAI's list of stored completions) with a body
/// went up as a stream, and its answer was assembled as one. They are rewrites of a call,
/// which is a `POST`; other methods keep their body. The model pin is the operator's for
/// every body, whatever the method (a pin a method could skip would be no pin).
#[tokio::test]
async fn only_a_post_is_rewritten_as_a_call() {
    let h = Harness::with_config(CALLS).await;
    let send = |method: http::Method, path: &'static str, body: &'static str| {
        http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "gateway")
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    let body = r#"{"model":"x","metadata":null}"#;
    for method in [
        http::Method::GET,
        http::Method::PUT,
        http::Method::PATCH,
        http::Method::DELETE,
    ] {
        let (_resp, _c) = h
            .send(send(method.clone(), "/v1/chat/completions?limit=1", body))
            .await;
        let seen = last(&h);
        assert_eq!(seen.method, method);
        assert_eq!(
            std::str::from_utf8(&seen.body).unwrap(),
            body,
            "{method}: not asked to stream"
        );
        let (_resp, _c) = h
            .send(send(
                method.clone(),
                "/u/v1/chat/completions",
                r#"{"model":"x","stream":true}"#,
            ))
            .await;
        let seen = last(&h);
        assert_eq!(
            std::str::from_utf8(&seen.body).unwrap(),
            r#"{"model":"pinned","stream":true}"#,
            "{method}: pinned, no usage asked"
        );
    }
    // A POST is the call, rewritten as before.
    let (resp, _c) = h
        .send(send(http::Method::POST, "/v1/chat/completions", body))
        .await;
    assert_eq!(resp.status(), 200);
    let seen = last(&h);
    assert!(
        std::str::from_utf8(&seen.body)
            .unwrap()
            .starts_with(r#"{"stream":true,"model":"x""#),
        "{:?}",
        seen.body
    );
    let (resp, _c) = h
        .send(send(
            http::Method::POST,
            "/u/v1/chat/completions",
            r#"{"model":"x","stream":true}"#,
        ))
        .await;
    // (The fake serves no `/u/...`: its 404 passes; what it received is the point.)
    assert_eq!(resp.status(), 404);
    let seen = last(&h);
    assert_eq!(
        std::str::from_utf8(&seen.body).unwrap(),
        r#"{"model":"pinned","stream":true,"stream_options":{"include_usage":true}}"#
    );
}

/// Audit WA 5: an HTTP/1.1 client's repeated `Cookie` lines reached the upstream as two
/// lines, of which a framework that reads one field (Starlette's `headers.get("cookie")`)
/// saw the first only; joined with "; " as HTTP/2 crumbs are (RFC 6265 5.4: one `Cookie`).
/// Of two `X-Request-Id` lines the first is the request's id (forwarded and echoed), the
/// others are dropped (documented).
#[tokio::test]
async fn an_http1_clients_cookie_lines_reach_the_upstream_as_one() {
    let h = Harness::start().await;
    let body = r#"{"model":"x","messages":[]}"#;
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
         cookie: a=1\r\nx-request-id: first\r\ncookie: b=2\r\nx-request-id: second\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let (answer, _) = raw_exchange(h.addr(), raw.as_bytes(), |_| false).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("x-request-id: first\r\n"), "{answer}");
    let seen = last(&h);
    let cookies: Vec<_> = seen.headers.get_all("cookie").iter().collect();
    assert_eq!(cookies, ["a=1; b=2"]);
    let ids: Vec<_> = seen.headers.get_all("x-request-id").iter().collect();
    assert_eq!(ids, ["first"]);
}

/// Audit WA 4: a lone surrogate escape in a member name was refused with 400 "unexpected end
/// of hex escape", the same escape in a value passed. Both pass now, the model pinned.
#[tokio::test]
async fn a_lone_surrogate_in_a_member_name_passes_pinned() {
    let h = Harness::with_config(CALLS).await;
    for body in [
        r#"{"model":"pin-a","\ud800":1}"#,
        r#"{"model":"pin-a","x":"\ud800"}"#,
    ] {
        let req = http::Request::post("/u/v1/chat/completions")
            .header("host", "gateway")
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from_static(body.as_bytes())))
            .unwrap();
        let (resp, _c) = h.send(req).await;
        // (The fake serves no `/u/...`: its 404 passes; what it received is the point.)
        assert_eq!(resp.status(), 404, "{body}");
        let seen = last(&h);
        assert_eq!(
            std::str::from_utf8(&seen.body).unwrap(),
            body.replace("pin-a", "pinned"),
            "{body}"
        );
    }
}
