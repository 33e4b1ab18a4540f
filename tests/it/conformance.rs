//! HTTP conformance of what crosses the gateway: the answer's framing and version are the
//! gateway's own, whatever the upstream sent (RFC 9112 6.3, RFC 9110 6.2), answers that have
//! no content carry no length (RFC 9110 8.6), a request target means one path, and the header
//! limit holds over HTTP/2 as over HTTP/1.1.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod early_answers;
mod request_targets;
mod two_readings;

/// A gateway whose one upstream is at `up`.
async fn through(up: SocketAddr) -> Harness {
    Harness::with_config(&BASE.replace("{FAKE}", &format!("http://{up}"))).await
}

fn now(bytes: &[u8]) -> Vec<(Duration, Vec<u8>)> {
    vec![(Duration::ZERO, bytes.to_vec())]
}

/// Sends `raw` on a fresh connection and reads until `done` holds for what came, the
/// gateway closes, or 3 s pass: what came, and whether the gateway closed.
async fn raw_exchange(
    addr: SocketAddr,
    raw: &[u8],
    done: impl Fn(&[u8]) -> bool,
) -> (String, bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut closed = false;
    let _ = tokio::time::timeout(Duration::from_secs(3), async {
        while !done(&got) {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    closed = true;
                    break;
                }
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

fn chat_bytes(version: &str) -> Vec<u8> {
    let body = r#"{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}"#;
    format!(
        "POST /v1/chat/completions {version}\r\nhost: gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// RFC 9112 6.3: a coding overrides a length, and an intermediary must remove the length
/// before forwarding. Left in, the length cut the body short for HTTP/1.1 clients (on a
/// connection kept alive, so the cut looked whole) and was a PROTOCOL_ERROR over HTTP/2.
#[tokio::test]
async fn an_upstream_length_beside_a_transfer_coding_is_not_forwarded() {
    let up = raw_upstream(now(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 3\r\n\
          transfer-encoding: chunked\r\nconnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ))
    .await;
    let h = through(up).await;

    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("content-length"), None, "{resp:?}");
    let read = read_body(resp.into_body()).await;
    assert_eq!((read.text().as_str(), read.error), ("hello", None));

    let resp = h2_send(h.addr(), chat_request(&[], false)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("content-length"), None, "{resp:?}");
    let read = read_body(resp.into_body()).await;
    assert_eq!((read.text().as_str(), read.error), ("hello", None));
}

/// RFC 9110 6.2: the gateway sends its own HTTP-version. An HTTP/1.0 upstream's answer
/// reaches an HTTP/1.1 client as HTTP/1.1, chunked (it has no length), on a connection
/// that stays usable; an HTTP/1.0 client still gets HTTP/1.0 (hyper downgrades for it).
#[tokio::test]
async fn an_http10_upstreams_answer_goes_out_in_the_clients_version() {
    let up = raw_upstream(now(
        b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nhello",
    ))
    .await;
    let h = through(up).await;

    // Two requests on one connection: the first answer ends by its framing, not the close.
    let two = [chat_bytes("HTTP/1.1"), chat_bytes("HTTP/1.1")].concat();
    let (text, _) = raw_exchange(h.addr(), &two, |got| {
        String::from_utf8_lossy(got)
            .matches("\r\n0\r\n\r\n")
            .count()
            == 2
    })
    .await;
    let answers: Vec<&str> = text.split("HTTP/1.").skip(1).collect();
    assert_eq!(answers.len(), 2, "{text}");
    for answer in answers {
        assert!(answer.starts_with("1 200 OK\r\n"), "{text}");
        let lower = answer.to_ascii_lowercase();
        assert!(
            lower.contains("\r\ntransfer-encoding: chunked\r\n"),
            "{text}"
        );
        assert!(lower.ends_with("\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), "{text}");
    }

    let (text, closed) = raw_exchange(h.addr(), &chat_bytes("HTTP/1.0"), |_| false).await;
    assert!(closed, "{text}");
    assert!(text.starts_with("HTTP/1.0 200 OK\r\n"), "{text}");
    assert!(
        !text.to_ascii_lowercase().contains("transfer-encoding"),
        "{text}"
    );
    assert!(text.ends_with("\r\n\r\nhello"), "{text}");
}

/// DESIGN 6: a body that cannot be completed never reaches the client short and
/// whole-looking. An HTTP/1.0 upstream's JSON has no length; sent on in HTTP/1.0, its end
/// was the connection's, so the idle limit's abort looked like the end of the document. A
/// document is read whole before its head goes: the limit is the JSON error.
#[tokio::test]
async fn a_json_answer_an_http10_upstream_never_finished_is_the_limits_error() {
    let up = raw_upstream(vec![
        (
            Duration::ZERO,
            b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{\"choices\":".to_vec(),
        ),
        // Far past the idle limit (1 s).
        (Duration::from_secs(30), b"[]}".to_vec()),
    ])
    .await;
    let h = through(up).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 504);
    assert_eq!(resp.version(), http::Version::HTTP_11);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "idle_timeout", "{body}");
    h.wait_requests("chat", 1.0).await;
    assert_eq!(
        h.metric(r#"hourglass_cancellations_total{origin="idle",route="chat"}"#)
            .await,
        1.0
    );
}

/// A JSON document in a known format whose framing ended cleanly inside it (an HTTP/1.0
/// upstream's close, which cannot tell a cut from the end; chunked framing ended early) is
/// an upstream failure, never a short document that looks whole: read whole before its head
/// goes, it is a 502 for HTTP/1.1 and HTTP/1.0 clients alike, counted as an error.
#[tokio::test]
async fn a_json_document_whose_framing_ended_inside_it_is_no_answer() {
    let cut = "{\"id\":\"c1\",\"object\":\"chat.completion\"";
    for answer in [
        format!("HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{cut}"),
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\
             transfer-encoding: chunked\r\n\r\n{:x}\r\n{cut}\r\n0\r\n\r\n",
            cut.len()
        ),
    ] {
        let h = through(raw_upstream(now(answer.as_bytes())).await).await;
        let (resp, _c) = h.send(chat_request(&[], false)).await;
        assert_eq!(resp.status(), 502, "{answer:?}");
        let body = json_body(resp).await;
        assert_eq!(body["error"]["code"], "upstream_error", "{body}");
        let (text, _) = raw_exchange(h.addr(), &chat_bytes("HTTP/1.0"), |_| false).await;
        assert!(text.starts_with("HTTP/1.0 502 Bad Gateway\r\n"), "{text}");
        assert!(
            text.contains("the JSON document ended before it was complete"),
            "{text}"
        );
        h.wait_requests("chat", 2.0).await;
        assert_eq!(
            h.metric(r#"hourglass_requests_total{outcome="error",route="chat"}"#)
                .await,
            2.0,
            "{answer:?}"
        );
    }
    // Whole, it is the answer (the HTTP/1.0 upstream's close ends it).
    let whole = format!("HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{cut}}}");
    let h = through(raw_upstream(now(whole.as_bytes())).await).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    let read = read_body(resp.into_body()).await;
    assert_eq!((read.text(), read.error), (format!("{cut}}}"), None));
}

/// RFC 9110 8.6: no Content-Length in a 204, whether the upstream sent one or not, over
/// HTTP/1.1 and HTTP/2 (where hyper adds one from the body's size unless the body is known
/// to be empty); none added to a 304 either.
#[tokio::test]
async fn answers_without_content_carry_no_content_length() {
    for head in [
        "HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n",
        "HTTP/1.1 204 No Content\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\nconnection: close\r\n\r\n",
    ] {
        let status = head[9..12].parse::<u16>().unwrap();
        let h = through(raw_upstream(now(head.as_bytes())).await).await;
        let (resp, _c) = h.send(chat_request(&[], false)).await;
        assert_eq!(resp.status(), status, "{head:?}");
        assert_eq!(
            resp.headers().get("content-length"),
            None,
            "HTTP/1.1 {head:?}"
        );
        let resp = h2_send(h.addr(), chat_request(&[], false)).await.unwrap();
        assert_eq!(resp.status(), status, "{head:?}");
        assert_eq!(
            resp.headers().get("content-length"),
            None,
            "HTTP/2 {head:?}"
        );
        let read = read_body(resp.into_body()).await;
        assert_eq!((read.bytes.len(), read.error), (0, None), "{head:?}");
        h.wait_requests("chat", 2.0).await;
        assert_eq!(
            h.metric(r#"hourglass_requests_total{outcome="ok",route="chat"}"#)
                .await,
            2.0,
            "{head:?}"
        );
    }
}

/// A chat request over HTTP/2 with `n` header fields in all (its length set, so that no
/// client adds one).
fn with_fields(n: usize) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let mut req = chat_request(&[], false);
    let len = hyper::body::Body::size_hint(req.body()).exact().unwrap();
    let headers = req.headers_mut();
    headers.remove("host");
    headers.insert("content-length", len.into());
    let mut i = 0;
    while headers.len() < n {
        headers.append(
            http::HeaderName::try_from(format!("x-pad-{i}")).unwrap(),
            "1".parse().unwrap(),
        );
        i += 1;
    }
    req
}

/// Audit KC 4: an HTTP/2 client may send its cookie as one field per crumb (RFC 9113 8.2.3),
/// which the gateway joins into the one field the upstream gets: 150 crumbs were refused 431
/// `too_many_headers` as 150 fields. They count as one; other fields still count each.
#[tokio::test]
async fn http2_cookie_crumbs_count_as_one_header_field() {
    let h = Harness::with_config(&BASE.replace("[server]\n", "[server]\nmax_headers = 50\n")).await;
    let mut req = with_fields(50);
    req.headers_mut().remove("x-pad-0");
    for i in 0..150 {
        req.headers_mut()
            .append("cookie", format!("c{i}={i}").parse().unwrap());
    }
    let resp = h2_send(h.addr(), req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let got = h.fake.requests();
    let cookies: Vec<_> = got[0].headers.get_all("cookie").iter().collect();
    assert_eq!(cookies.len(), 1, "joined into one field upstream");
    assert!(cookies[0].to_str().unwrap().ends_with("c149=149"));
    // One field more than the limit, the crumbs as one: refused.
    let mut req = with_fields(50);
    req.headers_mut().append("cookie", "a=1".parse().unwrap());
    req.headers_mut().append("cookie", "b=2".parse().unwrap());
    let resp = h2_send(h.addr(), req).await.unwrap();
    assert_eq!(resp.status(), 431);
    assert_eq!(h.fake.requests().len(), 1);
}

/// `[server] max_headers` holds over HTTP/2 as hyper holds it over HTTP/1.1: an HTTP/2
/// request with more fields gets 431 with the contract's JSON, naming the count and the
/// limit, and nothing is forwarded. (A limit below the fake provider's own 100, so that what
/// the gateway forwards, its own fields added, is not refused there.)
#[tokio::test]
async fn http2_requests_have_the_header_limit_of_http1() {
    let h = Harness::with_config(&BASE.replace("[server]\n", "[server]\nmax_headers = 50\n")).await;
    let resp = h2_send(h.addr(), with_fields(50)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(h.fake.requests().len(), 1);
    for n in [51, 150] {
        let resp = h2_send(h.addr(), with_fields(n)).await.unwrap();
        assert_eq!(resp.status(), 431, "{n}");
        let v = json_body(resp).await;
        assert_eq!(v["error"]["code"], "too_many_headers", "{n}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{n}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("{n} header fields")) && message.contains("max_headers (50)"),
            "{message}"
        );
    }
    assert_eq!(h.fake.requests().len(), 1);
    // The same limit over HTTP/1.1, where hyper enforces it.
    let mut req = with_fields(51);
    req.headers_mut().remove("x-pad-0");
    req.headers_mut().insert("host", "gateway".parse().unwrap());
    let (resp, _c) = h.send(req).await;
    assert_eq!(resp.status(), 431);
}

/// The answer's `x-request-id` is the gateway's (the client's, when it sent one), as on every
/// answer; a provider's own id (OpenAI's `req_...`, what its support asks for, and what the
/// OpenAI SDK shows as `_request_id`) is kept beside it, on errors passed through as on 200s.
#[tokio::test]
async fn the_providers_request_id_is_kept_beside_the_gateways() {
    for status in ["200 OK", "529 Overloaded"] {
        let up = raw_upstream(now(format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\nx-request-id: req_oai_1\r\n\
                 content-length: 2\r\nconnection: close\r\n\r\n{{}}"
        )
        .as_bytes()))
        .await;
        let h = through(up).await;
        let (resp, _c) = h
            .send(chat_request(&[("x-request-id", "mine")], false))
            .await;
        assert_eq!(resp.headers()["x-request-id"], "mine", "{status}");
        assert_eq!(
            resp.headers()["x-upstream-request-id"],
            "req_oai_1",
            "{status}"
        );
    }
    // An upstream that echoes the gateway's id has none of its own.
    let up = raw_upstream(now(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-request-id: mine\r\n\
          content-length: 2\r\nconnection: close\r\n\r\n{}",
    ))
    .await;
    let h = through(up).await;
    let (resp, _c) = h
        .send(chat_request(&[("x-request-id", "mine")], false))
        .await;
    assert_eq!(resp.headers()["x-request-id"], "mine");
    assert!(resp.headers().get("x-upstream-request-id").is_none());
}

/// An answer of length 0 (a 200 or a 404 with `content-length: 0`) is whole with its head:
/// hyper never polls its body, and it was counted as abandoned by the client
/// (`cancelled`, origin `client`). It is `ok`, over HTTP/1.1 and HTTP/2.
#[tokio::test]
async fn an_empty_answer_is_delivered_not_abandoned() {
    for status in ["200 OK", "404 Not Found"] {
        let up = raw_upstream(now(format!(
            "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )
        .as_bytes()))
        .await;
        let h = through(up).await;
        let (resp, _c) = h.send(chat_request(&[], false)).await;
        assert_eq!(resp.status().as_str(), &status[..3]);
        let read = read_body(resp.into_body()).await;
        assert_eq!((read.text().as_str(), read.error), ("", None));
        let resp = h2_send(h.addr(), chat_request(&[], false)).await.unwrap();
        assert_eq!(resp.status().as_str(), &status[..3]);
        let read = read_body(resp.into_body()).await;
        assert_eq!((read.text().as_str(), read.error), ("", None));
        h.wait_requests("chat", 2.0).await;
        assert_eq!(
            h.metric("hourglass_requests_total{outcome=\"ok\",route=\"chat\"}")
                .await,
            2.0,
            "{status}: {}",
            h.metrics_text().await
        );
    }
}

/// A HEAD answer has a length and no body (RFC 9110 9.3.2): hyper never polls its body,
/// and it was counted as abandoned by the client. It is `ok`, with the length kept; the same
/// for an event stream's head, to which no event can be added.
#[tokio::test]
async fn a_head_answer_is_delivered_not_abandoned() {
    for (answer, fields) in [
        (
            &b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\
               connection: close\r\n\r\n"[..],
            &[("content-length", "5")][..],
        ),
        (
            &b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
               transfer-encoding: chunked\r\nconnection: close\r\n\r\n"[..],
            // A stream's length is unknown: a HEAD that said one would misstate the GET's.
            &[
                ("content-type", "text/event-stream"),
                ("content-length", ""),
            ][..],
        ),
    ] {
        let h = through(raw_upstream(now(answer)).await).await;
        heads_are_answered_ok(&h, fields).await;
    }
}

/// A document that comes in several pieces is sent whole, with its length, byte for byte.
#[tokio::test]
async fn a_document_in_pieces_goes_out_whole_with_its_length() {
    let pieces = [
        r#"{"id":"c1","#,
        r#""object":"chat.completion","#,
        r#""choices":[]}"#,
    ];
    let doc = pieces.concat();
    let mut answer = vec![(
        Duration::ZERO,
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n",
            doc.len()
        )
        .into_bytes(),
    )];
    answer.extend(
        pieces
            .iter()
            .map(|p| (Duration::from_millis(20), p.as_bytes().to_vec())),
    );
    let h = through(raw_upstream(answer).await).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-length"],
        doc.len().to_string().as_str()
    );
    let read = read_body(resp.into_body()).await;
    assert_eq!((read.text(), read.error), (doc, None));
}

/// The gateway's own answer to a HEAD has the length its GET's would have and no body:
/// over HTTP/2 hyper sent the body it was given, which clients take for a PROTOCOL_ERROR.
#[tokio::test]
async fn the_gateways_own_answer_to_a_head_has_no_body() {
    let h = Harness::start().await;
    let head = || {
        http::Request::head("/nowhere")
            .header("host", "gateway")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    let (h1, _c) = h.send(head()).await;
    let h2 = h2_send(h.addr(), head()).await.unwrap();
    for resp in [h1, h2] {
        assert_eq!(resp.status(), 404);
        let length: usize = resp.headers()["content-length"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(length > 0, "{resp:?}");
        let read = read_body(resp.into_body()).await;
        assert_eq!((read.bytes.len(), read.error), (0, None));
    }
}

/// A provider's error answer passes through as it comes, its head at once (DESIGN 6): one
/// whose body is slow keeps its status and its `retry-after`, never turned into the
/// gateway's first-token error while the body is awaited.
#[tokio::test]
async fn a_providers_error_answer_goes_out_at_once() {
    let up = raw_upstream(vec![
        (
            Duration::ZERO,
            b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
              retry-after: 7\r\ncontent-length: 2\r\nconnection: close\r\n\r\n"
                .to_vec(),
        ),
        // Past the first-token limit (2 s).
        (Duration::from_millis(2500), b"{}".to_vec()),
    ])
    .await;
    let h = through(up).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "7");
}

/// HTTP/2 carries a cookie as one field per crumb; the HTTP/1.1 upstream gets one `cookie`
/// line, the crumbs joined with "; " (RFC 9113 8.2.3).
#[tokio::test]
async fn an_http2_clients_cookie_crumbs_reach_the_upstream_as_one_line() {
    let h = Harness::start().await;
    let mut req = chat_request(&[], false);
    req.headers_mut()
        .append("cookie", http::HeaderValue::from_static("a=1"));
    req.headers_mut()
        .append("cookie", http::HeaderValue::from_static("b=2"));
    let resp = h2_send(h.addr(), req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let seen = h.fake.requests();
    let cookies: Vec<_> = seen[0].headers.get_all("cookie").iter().collect();
    assert_eq!(cookies, ["a=1; b=2"]);
}

/// RFC 9112 6.1: a server sends no transfer coding but chunked unless the request's `TE`
/// asked for one (the gateway's asks for none), and a proxy that does not decode a coding
/// must not drop it. Dropped with the hop-by-hop `transfer-encoding`, the gzip bytes reached
/// the client as if they were the SSE text, logged `ok`.
#[tokio::test]
async fn an_upstream_transfer_coding_other_than_chunked_is_a_bad_gateway() {
    for head in [
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: gzip, chunked\r\n\
         connection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: gzip\r\n\
         connection: close\r\n\r\nabc",
    ] {
        let h = through(raw_upstream(now(head.as_bytes())).await).await;
        let (resp, _c) = h.send(chat_request(&[], true)).await;
        assert_eq!(resp.status(), 502, "{head:?}");
        let body = json_body(resp).await;
        assert_eq!(body["error"]["code"], "upstream_error", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("gzip"), "{message}");
    }
}

/// RFC 9110 15.2.2: a server switches protocols only when the request asked to (the
/// gateway's never do). Passed on, the 101 lost its `Upgrade` as hop-by-hop and the client
/// got a 101 and then nothing, logged `ok`.
#[tokio::test]
async fn an_unrequested_switch_of_protocols_is_a_bad_gateway() {
    let h = through(
        raw_upstream(now(
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
        ))
        .await,
    )
    .await;
    let (resp, _c) = h.send(chat_request(&[], true)).await;
    assert_eq!(resp.status(), 502);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "upstream_error", "{body}");
}

/// A JSON document whose body fails on its first read (a chunk size that is no number) is
/// a 502 with the gateway's JSON error: nothing had reached the client. Before, hyper wrote
/// the head with the body's first bytes, so the abort took the head too: an HTTP/1.1
/// client got an empty reply, an HTTP/2 one a reset, and neither a status.
#[tokio::test]
async fn a_document_that_fails_on_its_first_read_is_a_bad_gateway() {
    let h = through(
        raw_upstream(now(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
              transfer-encoding: chunked\r\nconnection: close\r\n\r\nzz\r\n",
        ))
        .await,
    )
    .await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 502);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "upstream_error", "{body}");
    let resp = h2_send(h.addr(), chat_request(&[], false)).await.unwrap();
    assert_eq!(resp.status(), 502);
    h.wait_requests("chat", 2.0).await;
    assert_eq!(
        h.metric(r#"hourglass_requests_total{outcome="error",route="chat"}"#)
            .await,
        2.0
    );
}

/// RFC 9110 15: a status outside 100 to 599 is no HTTP status (hyper's client takes any
/// three digits). Passed on, clients read it as a 5xx while the log and metrics called the
/// request ok.
#[tokio::test]
async fn a_status_outside_what_http_defines_is_a_bad_gateway() {
    for status in ["600", "799", "999"] {
        let head =
            format!("HTTP/1.1 {status} Odd\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        let h = through(raw_upstream(now(head.as_bytes())).await).await;
        let (resp, _c) = h.send(chat_request(&[], false)).await;
        assert_eq!(resp.status(), 502, "{status}");
        let body = json_body(resp).await;
        assert_eq!(body["error"]["code"], "upstream_error", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("status {status}")), "{message}");
    }
}

/// RFC 9110 8.6: a recipient may take a list of one repeated length as that length, and a
/// sender must not forward a `Content-Length` that does not match its grammar (one number).
#[tokio::test]
async fn a_repeated_upstream_length_goes_out_as_one_number() {
    let h = through(
        raw_upstream(now(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5, 5\r\n\
              connection: close\r\n\r\nhello",
        ))
        .await,
    )
    .await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers().get("content-length").map(|v| v.as_bytes()),
        Some(&b"5"[..]),
        "{resp:?}"
    );
    let read = read_body(resp.into_body()).await;
    assert_eq!((read.text().as_str(), read.error), ("hello", None));
}

/// Heads hyper refuses itself (its bare 400 and 431) never become requests, so they have no
/// log line; they are counted, so a client sending them is seen on the dashboard.
#[tokio::test]
async fn heads_hyper_refuses_are_counted() {
    let h = Harness::start().await;
    let (text, _) = raw_exchange(h.addr(), b"GARBAGE\r\n\r\n", |g| !g.is_empty()).await;
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    let big = format!(
        "GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(70_000)
    );
    let (text, _) = raw_exchange(h.addr(), big.as_bytes(), |g| !g.is_empty()).await;
    assert!(text.starts_with("HTTP/1.1 431"), "{text}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let malformed = h
            .metric("hourglass_refused_heads_total{reason=\"malformed\"}")
            .await;
        let too_large = h
            .metric("hourglass_refused_heads_total{reason=\"too_large\"}")
            .await;
        if (malformed, too_large) == (1.0, 1.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{malformed} {too_large}: {}",
            h.metrics_text().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = h.metrics_text().await;
    assert!(
        text.contains("hourglass_refused_heads_total{reason=\"header_timeout\"} 0"),
        "{text}"
    );
}

/// RFC 9110 7.6.2: an OPTIONS with `Max-Forwards: 0` is answered by the gateway as its
/// final recipient (with the methods it forwards) and never forwarded; above 0 it is
/// forwarded with one hop less.
#[tokio::test]
async fn options_reads_and_updates_max_forwards() {
    let h = Harness::start().await;
    let options = |max: &str| {
        http::Request::builder()
            .method(http::Method::OPTIONS)
            .uri("/v1/chat/completions")
            .header("host", "g")
            .header("max-forwards", max)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    let (resp, _c) = h.send(options("0")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["allow"],
        "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
    );
    assert!(resp.headers().contains_key("x-request-id"));
    assert!(h.fake.requests().is_empty(), "not forwarded");
    for (given, forwarded) in [("5", "4"), ("1", "0"), ("x", "x")] {
        let (resp, _c) = h.send(options(given)).await;
        read_body(resp.into_body()).await;
        let requests = h.fake.requests();
        let sent = &requests.last().expect("forwarded").headers;
        assert_eq!(
            sent.get("max-forwards").map(|v| v.to_str().unwrap()),
            Some(forwarded),
            "{given}"
        );
    }
}

/// RFC 9110 8.6: a user agent sends `Content-Length` in a POST even when it is 0, and some
/// origins answer 411 without it (a batch's cancel, in the OpenAI and Anthropic SDKs, is an
/// empty POST). hyper sends no length for an empty body, so the gateway's own length, which
/// it drops to let the body's decide, left the upstream's request with none at all: over
/// HTTP/1.1 from a client that sent `content-length: 0`, and over HTTP/2.
#[tokio::test]
async fn an_empty_post_keeps_its_zero_length() {
    let h = Harness::start().await;
    let empty = |method: &str| {
        http::Request::builder()
            .method(method)
            .uri("/v1/messages/batches/b1/cancel")
            .header("host", "gateway")
            .header("content-length", "0")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    let (resp, _c) = h.send(empty("POST")).await;
    let _ = read_body(resp.into_body()).await;
    let resp = h2_send(h.addr(), empty("POST")).await.unwrap();
    let _ = read_body(resp.into_body()).await;
    let get = http::Request::get("/v1/messages/batches/b1")
        .header("host", "gateway")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let (resp, _c) = h.send(get).await;
    let _ = read_body(resp.into_body()).await;
    let seen = h.fake.requests();
    assert_eq!(seen.len(), 3);
    for r in &seen[..2] {
        assert_eq!(
            r.headers.get("content-length").map(|v| v.to_str().unwrap()),
            Some("0"),
            "{:?}",
            r.headers
        );
        assert!(r.headers.get("transfer-encoding").is_none());
    }
    // A GET, whose method anticipates no content, gets no length (RFC 9110 8.6).
    assert!(
        seen[2].headers.get("content-length").is_none(),
        "{:?}",
        seen[2].headers
    );
}

/// An upstream status without a standard reason phrase (Anthropic's 529) keeps the phrase
/// the upstream gave it: hyper writes `<none>` for a status it has no phrase for.
#[tokio::test]
async fn a_nonstandard_status_keeps_its_reason_phrase() {
    let up = raw_upstream(now(
        b"HTTP/1.1 529 Site Overloaded\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
    ))
    .await;
    let h = through(up).await;
    let (resp, _c) = h.chat(&[]).await;
    assert_eq!(resp.status(), 529);
    let reason = reason_phrase(&resp);
    assert_eq!(reason.as_deref(), Some("Site Overloaded"));
    // An upstream served by hyper writes hyper's own `<none>`: that is no phrase.
    let h = Harness::start().await;
    let (resp, _c) = h.chat(&[("x-fake-status", "529")]).await;
    assert_eq!(resp.status(), 529);
    let reason = reason_phrase(&resp);
    assert_eq!(reason.as_deref(), Some("Overloaded"));
}

/// RFC 7838 2: an `Alt-Svc` field speaks for the origin that sent it. The provider's
/// (`h3=":443"`, as OpenAI sends) passed on would tell the client that the gateway serves
/// HTTP/3 on port 443 (audit M). The fields beside it pass.
#[tokio::test]
async fn the_upstreams_alt_svc_is_not_passed_on() {
    let up = raw_upstream(now(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nalt-svc: h3=\":443\"; ma=86400\r\n\
          x-request-id: up-1\r\ncontent-length: 5\r\n\r\nhello",
    ))
    .await;
    let h = through(up).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("alt-svc"), None, "{resp:?}");
    assert_eq!(resp.headers()["x-upstream-request-id"], "up-1", "{resp:?}");
    assert_eq!(read_body(resp.into_body()).await.text(), "hello");
}

/// Audit IC 2: a FastAPI upstream's redirect (`redirect_slashes`), built from the Host the
/// gateway sent, named the upstream itself; the OpenAI SDK followed it past the gateway.
/// Both `Location` and `Content-Location` on the upstream's origin become paths on the
/// gateway; another origin's URL passes as it came.
#[tokio::test]
async fn an_upstreams_own_url_in_location_is_made_the_gateways() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    drop(listener);
    let redirect = |location: String| {
        format!(
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: {location}\r\n\
             content-location: {location}\r\ncontent-length: 0\r\n\r\n"
        )
        .into_bytes()
    };
    for (location, want) in [
        (
            format!("http://{up}/v1/chat/completions"),
            "/v1/chat/completions".to_owned(),
        ),
        (
            format!("http://localhost:{}/v1/chat/completions?a=1", up.port()),
            format!("http://localhost:{}/v1/chat/completions?a=1", up.port()),
        ),
        (
            "https://auth.example/login".to_owned(),
            "https://auth.example/login".to_owned(),
        ),
    ] {
        let listener = tokio::net::TcpListener::bind(up).await.unwrap();
        let answer = redirect(location.clone());
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(&answer).await;
            let _ = s.shutdown().await;
        });
        let h = through(up).await;
        let req = http::Request::post("/v1/chat/completions/")
            .header("host", "gateway")
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(
                br#"{"model":"m","messages":[]}"#,
            )))
            .unwrap();
        let (resp, _c) = h.send(req).await;
        assert_eq!(resp.status(), 307, "{location}");
        assert_eq!(resp.headers()["location"], want.as_str(), "{location}");
        assert_eq!(
            resp.headers()["content-location"],
            want.as_str(),
            "{location}"
        );
    }
}

/// Audit IF 2: Anthropic's batch names its results by the provider's URL, which the SDK's
/// `batches.results()` fetched as it was: past the gateway, with the gateway client's key.
/// A batch's `results_url` (and each listed batch's) on the upstream's origin, or on
/// Anthropic's (which an upstream in front of Anthropic passes on), becomes the path on the
/// gateway, the document's length with it; another origin's passes unchanged, and the
/// results themselves (JSONL) pass as they come.
#[tokio::test]
async fn a_batchs_results_url_on_the_upstream_is_made_the_gateways() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let req = read_request(&mut s).await;
            let target = req.split(' ').nth(1).unwrap_or_default().to_owned();
            let batch = |id: &str, url: String| {
                format!(r#"{{"id":"{id}","type":"message_batch","results_url":"{url}"}}"#)
            };
            let (kind, doc) = if target.ends_with("/results") {
                ("application/binary", "{\"custom_id\":\"a\"}\n".to_owned())
            } else if target.contains("msgbatch_z") {
                // Behind a client base URL with a path (`/z`), which the upstream sees too.
                (
                    "application/json",
                    batch(
                        "msgbatch_z",
                        format!("http://{up}/z/v1/messages/batches/msgbatch_z/results"),
                    ),
                )
            } else if target.contains("msgbatch_1") {
                (
                    "application/json",
                    batch(
                        "msgbatch_1",
                        format!("http://{up}/v1/messages/batches/msgbatch_1/results"),
                    ),
                )
            } else {
                let mine = batch("b", format!("http://{up}/v1/messages/batches/b/results"));
                let public = batch("c", "https://api.anthropic.com/v1/c/results".to_owned());
                let other = batch("d", "https://other.example/v1/d/results".to_owned());
                (
                    "application/json",
                    format!(r#"{{"data":[{mine},{public},{other}],"has_more":false}}"#),
                )
            };
            seen_tx.send(req).unwrap();
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{doc}",
                doc.len()
            );
            let _ = s.write_all(answer.as_bytes()).await;
        }
    });
    let h = Harness::with_config(&format!(
        "{}\n[[routes]]\nname = \"prefixed\"\npath_prefix = \"/z/v1/messages\"\nupstream = \"fake\"\n",
        BASE.replace("{FAKE}", &format!("http://{up}"))
    ))
    .await;
    let get = |path: &str| {
        http::Request::get(path)
            .header("host", "gateway")
            .header("accept-encoding", "gzip")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    for (path, want) in [
        (
            "/v1/messages/batches/msgbatch_1",
            r#"{"id":"msgbatch_1","type":"message_batch","results_url":"/v1/messages/batches/msgbatch_1/results"}"#
                .to_owned(),
        ),
        (
            "/v1/messages/batches?limit=2",
            r#"{"data":[{"id":"b","type":"message_batch","results_url":"/v1/messages/batches/b/results"},{"id":"c","type":"message_batch","results_url":"/v1/c/results"},{"id":"d","type":"message_batch","results_url":"https://other.example/v1/d/results"}],"has_more":false}"#
                .to_owned(),
        ),
        (
            "/v1/messages/batches/msgbatch_1/results",
            "{\"custom_id\":\"a\"}\n".to_owned(),
        ),
        // The SDK joins the path to its base URL's (`/z`): it must not name `/z` itself, or
        // the download goes to `/z/z/v1/...` (audit JB 3).
        (
            "/z/v1/messages/batches/msgbatch_z",
            r#"{"id":"msgbatch_z","type":"message_batch","results_url":"/v1/messages/batches/msgbatch_z/results"}"#
                .to_owned(),
        ),
    ] {
        let (resp, _c) = h.send(get(path)).await;
        assert_eq!(resp.status(), 200, "{path}");
        let length = resp.headers()["content-length"].clone();
        let body = read_body(resp.into_body()).await.text();
        assert_eq!(body, want, "{path}");
        assert_eq!(length, body.len().to_string().as_str(), "{path}");
        // Read, so asked for in no coding; the results are the client's to take in its own.
        let req = seen.recv().await.unwrap();
        let identity = req.contains("accept-encoding: identity");
        assert_eq!(identity, !path.ends_with("/results"), "{path}: {req}");
    }
}

/// Audit PC 6: a HEAD of a batch answered the upstream's Content-Length (157) where a GET
/// of it answers its rewritten document's (135): RFC 9110 9.3.2 makes a HEAD's length the
/// one GET would send, which the gateway cannot know without the body, so it says none.
/// A HEAD of what the gateway passes unchanged keeps the upstream's.
#[tokio::test]
async fn a_head_of_a_batch_whose_get_is_rewritten_says_no_length() {
    let up = raw_upstream(now(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 157\r\n\
          connection: close\r\n\r\n",
    ))
    .await;
    let h = through(up).await;
    for (path, length) in [
        ("/v1/messages/batches/msgbatch_01", None),
        ("/v1/messages/batches?limit=2", None),
        ("/v1/messages/batches/msgbatch_01/results", Some("157")),
        ("/v1/messages/models", Some("157")),
    ] {
        let req = http::Request::head(path)
            .header("host", "gateway")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let (resp, _c) = h.send(req).await;
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(
            resp.headers()
                .get("content-length")
                .map(|v| v.to_str().unwrap()),
            length,
            "{path}"
        );
    }
}

/// Audit IC 5: an event stream's `Cache-Control: no-store, private` was replaced by
/// `no-cache`, which lets a shared cache store a user's answer.
#[tokio::test]
async fn an_event_streams_stronger_cache_control_is_kept() {
    for (theirs, want) in [
        ("cache-control: no-store, private\r\n", "no-store, private"),
        ("cache-control: private\r\n", "private, no-cache"),
        ("", "no-cache"),
    ] {
        let body = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
        let up = raw_upstream(now(format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n{theirs}\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes()))
        .await;
        let h = through(up).await;
        let (resp, _c) = h.send(chat_request(&[], true)).await;
        assert_eq!(resp.status(), 200, "{theirs}");
        let all: Vec<_> = resp.headers().get_all("cache-control").iter().collect();
        assert_eq!(all, [want], "{theirs}");
    }
}

/// Audit IC 6: an upstream's second `x-request-id` and its own `x-upstream-request-id` (the
/// id of the provider behind it, which that provider's support asks for) were lost.
#[tokio::test]
async fn every_request_id_of_the_upstream_is_kept() {
    let up = raw_upstream(now(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-request-id: up1\r\n\
          x-request-id: up2\r\nx-upstream-request-id: deeper\r\ncontent-length: 2\r\n\
          connection: close\r\n\r\n{}",
    ))
    .await;
    let h = through(up).await;
    let (resp, _c) = h
        .send(chat_request(&[("x-request-id", "mine")], false))
        .await;
    assert_eq!(resp.headers()["x-request-id"], "mine");
    let kept: Vec<_> = resp
        .headers()
        .get_all("x-upstream-request-id")
        .iter()
        .collect();
    assert_eq!(kept, ["deeper", "up1", "up2"]);
}

/// Audit IC 3: an HTTP/2 head past `max_header_bytes` got the h2 crate's bare 431, with no
/// log line, no metric and no request id. It gets the contract's JSON 431 and counts as a
/// refused request; the connection serves on.
#[tokio::test]
async fn an_http2_head_past_max_header_bytes_gets_the_json_431() {
    let h = Harness::start().await;
    let errors = "hourglass_requests_total{outcome=\"error\",route=\"chat\"}";
    let before = h.metric(errors).await;
    let long = "a".repeat(70_000);
    for _ in 0..3 {
        let mut req = chat_request(&[], false);
        req.headers_mut()
            .insert("x-long", http::HeaderValue::from_str(&long).unwrap());
        let resp = h2_send(h.addr(), req).await.unwrap();
        assert_eq!(resp.status(), 431);
        assert!(resp.headers().contains_key("x-request-id"), "{resp:?}");
        let v = json_body(resp).await;
        assert_eq!(v["error"]["code"], "head_too_large");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("max_header_bytes (65536)"), "{message}");
    }
    assert_eq!(h.metric(errors).await - before, 3.0);
    assert!(h.fake.requests().is_empty());
    // Under the limit, the same request is served.
    let resp = h2_send(h.addr(), chat_request(&[], false)).await.unwrap();
    assert_eq!(resp.status(), 200);
}

/// Audit ID 2, RFC 9112 C.2.2: an HTTP/1.0 connection persists only with a body that ends by
/// its length. An event stream to an HTTP/1.0 client has none (no chunked coding) and ends
/// when the connection closes, so its head says `connection: close`, even to a client that
/// asked to keep the connection alive; it said `keep-alive`, then closed.
#[tokio::test]
async fn an_http10_event_stream_says_its_connection_closes() {
    let h = Harness::start().await;
    let body = r#"{"model":"m","stream":true}"#;
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.0\r\nhost: gateway\r\nconnection: keep-alive\r\n\
         x-fake-chunks: 2\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let (text, closed) = raw_exchange(h.addr(), raw.as_bytes(), |_| false).await;
    assert!(closed, "{text}");
    assert!(text.starts_with("HTTP/1.0 200 OK\r\n"), "{text}");
    let (head, rest) = text.split_once("\r\n\r\n").expect("a whole head");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("\r\nconnection: close"), "{head}");
    assert!(!head.contains("keep-alive"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    assert!(rest.ends_with("data: [DONE]\n\n"), "{rest}");
}

/// Audit WD 4: hyper's HTTP/2 dating is off (with a clock before 1970 it panicked on every
/// answer the gateway made, once `http::date` sends no Date there): every answer over h2c
/// still carries one Date, the gateway's, on the client and the admin listener alike.
#[tokio::test]
async fn h2_answers_carry_one_date_without_hyper_s() {
    let h = Harness::start().await;
    let proxied = h2_send(h.addr(), chat_request(&[], false)).await.unwrap();
    let made = h2_send(
        h.addr(),
        http::Request::get("/nothing")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await
    .unwrap();
    let admin = h2_send(
        h.gw.admin_addr,
        http::Request::get("/healthz")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await
    .unwrap();
    for (what, resp) in [("proxied", proxied), ("made", made), ("admin", admin)] {
        let dates: Vec<_> = resp.headers().get_all("date").iter().collect();
        assert_eq!(dates.len(), 1, "{what}: {:?}", resp.headers());
        let at = httpdate::parse_http_date(dates[0].to_str().unwrap()).unwrap();
        let off = std::time::SystemTime::now()
            .duration_since(at)
            .unwrap_or_default();
        assert!(off < Duration::from_secs(5), "{what}: dated now: {dates:?}");
    }
}
