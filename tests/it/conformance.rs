//! HTTP conformance of what crosses the gateway: the answer's framing and version are the
//! gateway's own, whatever the upstream sent (RFC 9112 6.3, RFC 9110 6.2), answers that have
//! no content carry no length (RFC 9110 8.6), a request target means one path, and the header
//! limit holds over HTTP/2 as over HTTP/1.1.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;

/// A gateway whose one upstream is at `up`.
async fn through(up: SocketAddr) -> Harness {
    Harness::with_config(&BASE.replace("{FAKE}", &format!("http://{up}"))).await
}

fn now(bytes: &[u8]) -> Vec<(Duration, Vec<u8>)> {
    vec![(Duration::ZERO, bytes.to_vec())]
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
