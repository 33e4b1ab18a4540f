//! Request smuggling probes over a raw socket: heads whose framing two parsers could read
//! differently. Each gets one 400, the connection is closed after it (so no byte of the
//! probe is read as a second request), and nothing reaches the upstream (its fake records no
//! request and no connection).
//!
//! Three forms are accepted on purpose, each read the one way the RFC allows, and pinned
//! down below: Content-Length next to chunked Transfer-Encoding (the coding wins, the length
//! is dropped, and the connection is closed after the answer, so nothing after the chunked
//! body is ever read), equal duplicate Content-Lengths (one length), and bare LF line ends
//! (RFC 9112 2.2; the head is re-serialised with CRLF when forwarded).

mod support;

use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PATH: &str = "/v1/chat/completions";

/// Sends `raw`, reads until the gateway closes the connection, and returns the status line
/// of every answer (the first one's, or how the connection ended without one, when only
/// one came).
async fn probe(h: &Harness, raw: &[u8]) -> String {
    let mut s = TcpStream::connect(h.addr()).await.unwrap();
    s.write_all(raw).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&got);
    let statuses: Vec<&str> = text.lines().filter(|l| l.starts_with("HTTP/1.")).collect();
    let mut out = match statuses.as_slice() {
        [] => "closed without an answer".to_owned(),
        many => many.join(" + "),
    };
    if read.is_err() {
        out.push_str(" (connection left open)");
    }
    out
}

fn head(lines: &str) -> Vec<u8> {
    format!("POST {PATH} HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n{lines}")
        .into_bytes()
}

/// A second request hidden after the first one's body, for probes whose framing could make
/// it one: it must never reach the upstream.
const SMUGGLED: &str = "GET /v1/smuggled HTTP/1.1\r\nhost: gateway\r\n\r\n";

/// Every probe that must be refused, with what it tries.
fn refused() -> Vec<(&'static str, Vec<u8>)> {
    let body = "{\"stream\":true}";
    let n = body.len();
    vec![
        (
            "two different content-lengths",
            head(&format!(
                "content-length: {n}\r\ncontent-length: {}\r\n\r\n{body}",
                n + 1
            )),
        ),
        (
            "content-length list",
            head(&format!("content-length: {n}, {n}\r\n\r\n{body}")),
        ),
        (
            "signed content-length",
            head(&format!("content-length: +{n}\r\n\r\n{body}")),
        ),
        ("negative content-length", head("content-length: -1\r\n\r\n")),
        (
            "content-length over 64 bits",
            head("content-length: 99999999999999999999999\r\n\r\n"),
        ),
        (
            "obs-fold continuation line",
            head(&format!(
                "x-folded: a\r\n b\r\ncontent-length: {n}\r\n\r\n{body}"
            )),
        ),
        (
            "obs-fold hiding transfer-encoding",
            head(&format!(
                "x-folded: a\r\n transfer-encoding: chunked\r\ncontent-length: {n}\r\n\r\n{body}"
            )),
        ),
        (
            "transfer-encoding folded onto the next line",
            head(&format!(
                "transfer-encoding:\r\n chunked\r\n\r\n{n:x}\r\n{body}\r\n0\r\n\r\n"
            )),
        ),
        (
            "bare LF then a header hidden behind a bare CR",
            head(&format!(
                "x-a: 1\nx-b: 2\rtransfer-encoding: chunked\r\ncontent-length: {n}\r\n\r\n{body}"
            )),
        ),
        (
            "bare CR inside a value",
            head(&format!(
                "x-a: 1\rtransfer-encoding: chunked\r\ncontent-length: {n}\r\n\r\n{body}"
            )),
        ),
        (
            "space before the colon",
            head(&format!("content-length : {n}\r\n\r\n{body}")),
        ),
        (
            "transfer-encoding other than chunked",
            head(&format!("transfer-encoding: gzip\r\n\r\n{body}")),
        ),
        (
            "chunked not last",
            head(&format!(
                "transfer-encoding: chunked, gzip\r\n\r\n{n:x}\r\n{body}\r\n0\r\n\r\n"
            )),
        ),
        (
            "transfer-encoding xchunked",
            head(&format!(
                "transfer-encoding: xchunked\r\ncontent-length: {n}\r\n\r\n{body}"
            )),
        ),
        (
            "chunk size overflowing 64 bits",
            head("transfer-encoding: chunked\r\n\r\nfffffffffffffffffff\r\nx\r\n0\r\n\r\n"),
        ),
        (
            "chunk size not hex",
            head("transfer-encoding: chunked\r\n\r\nzz\r\nx\r\n0\r\n\r\n"),
        ),
        (
            "NUL in a header value",
            head(&format!("x-a: a\0b\r\ncontent-length: {n}\r\n\r\n{body}")),
        ),
        (
            "space in a header name",
            head(&format!("x a: b\r\ncontent-length: {n}\r\n\r\n{body}")),
        ),
        (
            "two host headers",
            format!(
                "POST {PATH} HTTP/1.1\r\nhost: gateway\r\nhost: other\r\ncontent-length: {n}\r\n\r\n{body}"
            )
            .into_bytes(),
        ),
        (
            "no host header",
            format!("POST {PATH} HTTP/1.1\r\ncontent-length: {n}\r\n\r\n{body}").into_bytes(),
        ),
        // RFC 9112 3.2: an invalid Host value is a 400 like a missing or doubled one.
        (
            "host with a space",
            format!("POST {PATH} HTTP/1.1\r\nhost: a b\r\ncontent-length: {n}\r\n\r\n{body}")
                .into_bytes(),
        ),
        (
            "host with userinfo",
            format!(
                "POST {PATH} HTTP/1.1\r\nhost: user@gateway\r\ncontent-length: {n}\r\n\r\n{body}"
            )
            .into_bytes(),
        ),
        (
            "host with a path",
            format!(
                "POST {PATH} HTTP/1.1\r\nhost: gateway/x\r\ncontent-length: {n}\r\n\r\n{body}"
            )
            .into_bytes(),
        ),
        (
            "host with a port that is not a number",
            format!(
                "POST {PATH} HTTP/1.1\r\nhost: gateway:80x\r\ncontent-length: {n}\r\n\r\n{body}"
            )
            .into_bytes(),
        ),
        (
            "HTTP/1.0 with chunked",
            format!(
                "POST {PATH} HTTP/1.0\r\nhost: gateway\r\ntransfer-encoding: chunked\r\n\r\n{n:x}\r\n{body}\r\n0\r\n\r\n"
            )
            .into_bytes(),
        ),
        (
            "request line with two spaces",
            format!("POST  {PATH} HTTP/1.1\r\nhost: gateway\r\ncontent-length: {n}\r\n\r\n{body}")
                .into_bytes(),
        ),
        (
            "unknown HTTP version",
            format!("POST {PATH} HTTP/1.7\r\nhost: gateway\r\ncontent-length: {n}\r\n\r\n{body}")
                .into_bytes(),
        ),
    ]
}

#[tokio::test]
async fn smuggling_probes_get_400_and_are_never_forwarded() {
    let h = Harness::start().await;
    let mut report = Vec::new();
    for (name, raw) in refused() {
        let line = probe(&h, &raw).await;
        let forwarded = h.fake.requests().len();
        report.push(format!(
            "{name}: {line} (upstream requests so far: {forwarded})"
        ));
    }
    let report = report.join("\n");
    eprintln!("{report}");
    for line in report.lines() {
        let (_, answer) = line.split_once(": ").unwrap();
        assert_eq!(
            answer, "HTTP/1.1 400 Bad Request (upstream requests so far: 0)",
            "one 400, the connection closed after it, nothing forwarded\n\nall probes:\n{report}"
        );
    }
    assert!(h.fake.requests().is_empty(), "{report}");
    assert!(h.fake.connections().is_empty(), "{report}");
}

/// Content-Length next to Transfer-Encoding: hyper lets the coding win and drops the length
/// (RFC 9112 6.1), then closes the connection after its answer (6.3), so whatever a parser
/// that trusted the length would read next is never read at all.
#[tokio::test]
async fn content_length_with_chunked_is_read_as_chunked_and_nothing_after_it_is_read() {
    let h = Harness::start().await;
    let body = "{\"stream\":true}";
    let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    for (name, raw) in [
        (
            "content-length then transfer-encoding",
            head(&format!(
                "content-length: {}\r\ntransfer-encoding: chunked\r\n\r\n{chunked}{SMUGGLED}",
                chunked.len()
            )),
        ),
        (
            "transfer-encoding then a short content-length",
            head(&format!(
                "transfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n{chunked}{SMUGGLED}"
            )),
        ),
    ] {
        let before = h.fake.requests().len();
        assert_eq!(probe(&h, &raw).await, "HTTP/1.1 200 OK", "{name}");
        let requests = h.fake.requests();
        assert_eq!(requests.len(), before + 1, "{name}");
        let r = &requests[before];
        assert_eq!(&r.body[..], body.as_bytes(), "{name}");
        assert!(r.headers.get("transfer-encoding").is_none(), "{name}");
    }
    assert!(h
        .fake
        .requests()
        .iter()
        .all(|r| !r.path.contains("smuggled")));
}

/// Two equal Content-Lengths are one length (RFC 9110 8.6 lets a recipient merge them).
#[tokio::test]
async fn equal_content_lengths_are_one() {
    let h = Harness::start().await;
    let body = "{\"stream\":true}";
    let n = body.len();
    let raw = head(&format!(
        "content-length: {n}\r\ncontent-length: {n}\r\nconnection: close\r\n\r\n{body}"
    ));
    assert_eq!(probe(&h, &raw).await, "HTTP/1.1 200 OK");
    let requests = h.fake.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(&requests[0].body[..], body.as_bytes());
}

#[tokio::test]
async fn bare_lf_line_ends_are_read_as_line_ends_and_forwarded_as_crlf() {
    let h = Harness::start().await;
    let body = "{\"stream\":true}";
    let raw = format!(
        "POST {PATH} HTTP/1.1\nhost: gateway\nx-a: 1\nx-b: 2\r\ncontent-length: {}\nconnection: close\n\n{body}",
        body.len()
    );
    assert_eq!(probe(&h, raw.as_bytes()).await, "HTTP/1.1 200 OK");
    let requests = h.fake.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r.headers["x-a"], "1");
    assert_eq!(r.headers["x-b"], "2");
    assert_eq!(&r.body[..], body.as_bytes());
    for (name, value) in &r.headers {
        assert!(
            !value.as_bytes().contains(&b'\n') && !value.as_bytes().contains(&b'\r'),
            "{name}: {value:?}"
        );
    }
}

#[tokio::test]
async fn a_well_formed_request_is_forwarded_over_the_same_raw_client() {
    // The probe client itself works: a clean head with the same body is served.
    let h = Harness::start().await;
    let body = "{\"stream\":true}";
    let line = probe(
        &h,
        &head(&format!(
            "content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )),
    )
    .await;
    assert_eq!(line, "HTTP/1.1 200 OK");
    assert_eq!(h.fake.requests().len(), 1);
}
