//! Streaming fidelity: byte-exact pass-through of a long, oddly chunked SSE stream, no
//! coalescing of events that arrived apart, and content codings kept out of what is read.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// An upstream that answers one request with the given chunks (HTTP/1.1 chunked), each after
/// its delay. Written by hand so the test controls the exact bytes and frame boundaries.
async fn scripted_upstream(chunks: Vec<(Duration, Vec<u8>)>) -> SocketAddr {
    scripted_upstream_with("", chunks).await.0
}

/// `scripted_upstream` whose answer head also carries `extra` (whole lines, each ending in
/// CRLF, which may replace the SSE content type); the receiver gets the request it read (head
/// and body), lowercased.
async fn scripted_upstream_with(
    extra: &'static str,
    chunks: Vec<(Duration, Vec<u8>)>,
) -> (SocketAddr, tokio::sync::oneshot::Receiver<String>) {
    let (seen, seen_rx) = tokio::sync::oneshot::channel();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        let _ = seen.send(read_request(&mut s).await);
        let mut buf = [0u8; 4096];
        // `extra` may name its own content type.
        let kind = if extra.contains("content-type:") {
            ""
        } else {
            "content-type: text/event-stream\r\n"
        };
        let head = format!("HTTP/1.1 200 OK\r\n{kind}transfer-encoding: chunked\r\n{extra}\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        for (delay, chunk) in chunks {
            tokio::time::sleep(delay).await;
            let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
            frame.extend_from_slice(&chunk);
            frame.extend_from_slice(b"\r\n");
            if s.write_all(&frame).await.is_err() {
                return;
            }
        }
        let _ = s.write_all(b"0\r\n\r\n").await;
        let _ = s.read(&mut buf).await;
    });
    (addr, seen_rx)
}

/// An SSE upstream that writes each chunk the test sends, as one HTTP/1.1 chunk, the moment
/// it is sent; dropping the sender ends the body. For order assertions that hold on a busy
/// machine: "the client has the first event before the second is even written".
async fn stepped_upstream() -> (SocketAddr, tokio::sync::mpsc::UnboundedSender<Vec<u8>>) {
    stepped_upstream_of("text/event-stream").await
}

/// `stepped_upstream` answering with content type `kind`.
async fn stepped_upstream_of(
    kind: &'static str,
) -> (SocketAddr, tokio::sync::mpsc::UnboundedSender<Vec<u8>>) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        read_request(&mut s).await;
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        while let Some(chunk) = rx.recv().await {
            let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
            frame.extend_from_slice(&chunk);
            frame.extend_from_slice(b"\r\n");
            if s.write_all(&frame).await.is_err() {
                return;
            }
        }
        let _ = s.write_all(b"0\r\n\r\n").await;
        let mut buf = [0u8; 64];
        let _ = s.read(&mut buf).await;
    });
    (addr, tx)
}

/// The next `n` bytes of `body`, however many frames carry them; fails after 10 s.
async fn next_bytes(body: &mut hyper::body::Incoming, n: usize) -> Vec<u8> {
    use http_body_util::BodyExt;
    let mut got = Vec::new();
    while got.len() < n {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .unwrap_or_else(|_| panic!("only {:?} after 10 s", String::from_utf8_lossy(&got)))
            .expect("more frames")
            .expect("a frame");
        if let Ok(d) = frame.into_data() {
            got.extend_from_slice(&d);
        }
    }
    got
}

/// A small deterministic generator, so a failure reproduces.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_sse(rng: &mut Lcg, events: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let ends: [&[u8]; 3] = [b"\n", b"\r\n", b"\r"];
    for i in 0..events {
        let eol = ends[rng.below(3) as usize];
        match rng.below(10) {
            0 => {
                out.extend_from_slice(b": keep-alive");
                out.extend_from_slice(eol);
            }
            1 => {
                out.extend_from_slice(format!("id: {i}").as_bytes());
                out.extend_from_slice(eol);
            }
            _ => {}
        }
        let lines = 1 + rng.below(3);
        for _ in 0..lines {
            out.extend_from_slice(b"data: ");
            for _ in 0..rng.below(300) {
                // Printable ASCII and multi-byte UTF-8, never a line break.
                match rng.below(20) {
                    0 => out.extend_from_slice("é".as_bytes()),
                    1 => out.extend_from_slice("✓".as_bytes()),
                    _ => out.push(b' ' + rng.below(94) as u8),
                }
            }
            out.extend_from_slice(eol);
        }
        out.extend_from_slice(eol);
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

#[tokio::test]
async fn long_random_stream_passes_byte_exact() {
    let mut rng = Lcg(0x5eed);
    let stream = random_sse(&mut rng, 2000);
    let mut chunks = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        let n = (1 + rng.below(700) as usize).min(stream.len() - at);
        let delay = Duration::from_millis(if rng.below(50) == 0 { 2 } else { 0 });
        chunks.push((delay, stream[at..at + n].to_vec()));
        at += n;
    }
    let up = scripted_upstream(chunks).await;
    let h = Harness::with_config(&BASE.replace("{FAKE}", &format!("http://{up}"))).await;
    let (resp, _c) = h.chat(&[]).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(read.error.is_none());
    assert_eq!(read.bytes.len(), stream.len());
    assert!(read.bytes == stream, "bytes differ");
}

/// No event waits for the next: each reaches the client before the upstream even writes
/// the next one (order, not a stopwatch, so a busy machine cannot blur it), as a frame of
/// its own.
#[tokio::test]
async fn events_that_arrive_apart_leave_apart() {
    let (up, tx) = stepped_upstream().await;
    let h = Harness::with_config(&BASE.replace("{FAKE}", &format!("http://{up}"))).await;
    let (resp, _c) = h.chat(&[]).await;
    let mut body = resp.into_body();
    for i in 0..10 {
        let event = format!("data: {{\"n\":{i}}}\n\n").into_bytes();
        tx.send(event.clone()).unwrap();
        assert_eq!(next_bytes(&mut body, event.len()).await, event, "event {i}");
    }
    drop(tx);
    let read = read_body(body).await;
    assert!(
        read.bytes.is_empty() && read.error.is_none(),
        "{}",
        read.text()
    );
}

/// Nothing of an event reaches the client before its blank line was written upstream, and
/// then all of it does, before the next event is written.
#[tokio::test]
async fn an_event_split_across_frames_is_held_until_complete() {
    use http_body_util::BodyExt;
    let (up, tx) = stepped_upstream().await;
    let h = Harness::with_config(&BASE.replace("{FAKE}", &format!("http://{up}"))).await;
    let (resp, _c) = h.chat(&[]).await;
    let mut body = resp.into_body();
    tx.send(b"data: {\"a\":".to_vec()).unwrap();
    tx.send(b"1}\n".to_vec()).unwrap();
    // Held: 300 ms and not a byte (a gateway that forwarded it would have long since).
    let early = tokio::time::timeout(Duration::from_millis(300), body.frame()).await;
    assert!(early.is_err(), "part of an event went out: {early:?}");
    tx.send(b"\n".to_vec()).unwrap();
    let first = b"data: {\"a\":1}\n\n";
    assert_eq!(next_bytes(&mut body, first.len()).await, first);
    tx.send(b"data: x\n\n".to_vec()).unwrap();
    assert_eq!(next_bytes(&mut body, 9).await, b"data: x\n\n");
    drop(tx);
    assert!(read_body(body).await.bytes.is_empty());
}

/// The events a WHATWG parser dispatches from `stream` (the gateway's own scanner, the same
/// algorithm), with their types: `error` for the gateway's error event, `message` otherwise.
fn whatwg_events(stream: &[u8]) -> Vec<(String, &'static str)> {
    use hourglass::http::sse::{EventSink, EventType, SseScanner};
    #[derive(Default)]
    struct Events {
        data: Vec<u8>,
        out: Vec<(String, &'static str)>,
    }
    impl EventSink for Events {
        fn data(&mut self, value: &[u8]) {
            self.data.extend_from_slice(value);
        }
        fn data_line_end(&mut self) {
            self.data.push(b'\n');
        }
        fn end_event(&mut self, dispatched: bool, kind: EventType) -> bool {
            let data = std::mem::take(&mut self.data);
            if dispatched {
                let kind = if kind == EventType::Error {
                    "error"
                } else {
                    "message"
                };
                self.out
                    .push((String::from_utf8_lossy(&data).into_owned(), kind));
            }
            false
        }
    }
    let mut events = Events::default();
    SseScanner::new().scan_with(stream, &mut events);
    events.out
}

/// Audit PB 1: an upstream that frames with CRLF and stalls between the CR and the LF of the
/// blank line that ends an event. The cut's error event must not follow that lone CR: valid
/// SSE, but readers that know only `\r\n\r\n`, `\n\n` and `\r\r` as block ends (sseclient-py)
/// merged the last token into the error event, whose data then no longer parsed. An LF first
/// completes the CRLF: a WHATWG parser reads the same events as without it, and nothing more.
#[tokio::test]
async fn a_cut_after_a_lone_cr_completes_the_crlf_before_its_error_event() {
    let (up, tx) = stepped_upstream().await;
    let h = Harness::with_config(&BASE.replace("{FAKE}", &format!("http://{up}"))).await;
    let (resp, _c) = h.chat(&[]).await;
    assert_eq!(resp.status(), 200);
    let first = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t1 \"}}]}\r\n\r\n";
    let last = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t9 \"}}]}\r\n\r";
    tx.send(first.to_vec()).unwrap();
    tx.send(last.to_vec()).unwrap();
    // Then silence (the sender is kept): the idle limit cuts the stream.
    let read = read_body(resp.into_body()).await;
    drop(tx);
    assert!(read.error.is_none(), "{:?}", read.error);
    let text = read.text();
    let sent = [&first[..], &last[..]].concat();
    let rest = read
        .bytes
        .strip_prefix(&sent[..])
        .unwrap_or_else(|| panic!("the events did not go out as they came: {text:?}"));
    assert!(
        rest.starts_with(b"\nevent: error\n"),
        "the error event does not start with the LF that completes the CRLF: {text:?}"
    );
    // A reader that splits blocks at `\r\n\r\n`, `\n\n` or `\r\r` only (sseclient-py) finds
    // the last token's block whole, and the error event on its own.
    let blocks: Vec<&str> = text
        .split("\r\n\r\n")
        .flat_map(|b| b.split("\n\n"))
        .filter(|b| !b.is_empty())
        .collect();
    assert_eq!(blocks.len(), 3, "{blocks:?}");
    assert!(blocks[1].ends_with("\"t9 \"}}]}"), "{blocks:?}");
    // A WHATWG parser: both tokens, then the error event, nothing merged or added.
    let events = whatwg_events(&read.bytes);
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[0].1, "message");
    assert!(events[1].0.contains("\"t9 \"") && events[1].1 == "message");
    assert_eq!(events[2].1, "error");
    let error: serde_json::Value = serde_json::from_str(&events[2].0).expect("error is JSON");
    assert_eq!(error["error"]["code"], "idle_timeout");
    assert_eq!(read.error_event().unwrap()["code"], "idle_timeout");
}

#[tokio::test]
async fn a_complete_non_streaming_answer_is_ok_and_its_upstream_connection_reused() {
    let h = Harness::start().await;
    for _ in 0..2 {
        let (resp, _c) = h.send(chat_request(&[], false)).await;
        assert_eq!(resp.status(), 200);
        assert!(resp.headers().get("content-length").is_some());
        let read = read_body(resp.into_body()).await;
        assert!(read.error.is_none());
        let v: serde_json::Value = serde_json::from_slice(&read.bytes).unwrap();
        assert_eq!(v["object"], "chat.completion");
    }
    h.wait_requests("chat", 2.0).await;
    assert_eq!(
        h.metric("hourglass_requests_total{outcome=\"ok\",route=\"chat\"}")
            .await,
        2.0
    );
    assert_eq!(
        h.metric("hourglass_cancellations_total{origin=\"client\",route=\"chat\"}")
            .await,
        0.0
    );
    // The first answer ended cleanly, so its connection went back to the pool.
    let reqs = h.fake.requests();
    assert_eq!(reqs[0].conn_id, reqs[1].conn_id);
}

#[tokio::test]
async fn an_idle_upstream_connection_is_closed_after_pool_idle_timeout() {
    let config = BASE.replacen(
        "auth = \"bearer\"\n",
        "auth = \"bearer\"\npool_idle_timeout = \"300ms\"\n",
        1,
    );
    let h = Harness::with_config(&config).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    assert!(read_body(resp.into_body()).await.error.is_none());
    // Pooled, then closed by the gateway once idle for the limit (the pool looks once per
    // limit, so between 300 and 600 ms): an upstream with a longer keep-alive never gets
    // to close it under a request.
    assert!(
        h.fake
            .wait_open_connections(0, Duration::from_secs(3))
            .await,
        "the idle upstream connection is still open"
    );
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    let reqs = h.fake.requests();
    assert_ne!(reqs[0].conn_id, reqs[1].conn_id);
}

#[tokio::test]
async fn an_answer_that_is_read_is_asked_for_unencoded_whatever_the_client_accepts() {
    let asked = |head: &str| -> Vec<String> {
        head.lines()
            .filter_map(|l| l.strip_prefix("accept-encoding:"))
            .map(|v| v.trim().to_owned())
            .collect()
    };
    let (up, seen) =
        scripted_upstream_with("", vec![(Duration::ZERO, b"data: {}\n\n".to_vec())]).await;
    let (other, other_seen) =
        scripted_upstream_with("", vec![(Duration::ZERO, b"{}".to_vec())]).await;
    let config = format!(
        "{}\n[upstreams.other]\nurl = \"http://{other}\"\nauth = \"none\"\n\n\
         [[routes]]\nname = \"embeddings\"\npath_prefix = \"/v1/embeddings\"\nupstream = \"other\"\n",
        BASE.replace("{FAKE}", &format!("http://{up}"))
    );
    let h = Harness::with_config(&config).await;
    // What httpx (the OpenAI and Anthropic Python SDKs) sends.
    let (resp, _c) = h
        .chat(&[
            ("accept-encoding", "gzip, deflate, br, zstd"),
            ("via", "1.1 edge"),
        ])
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(read_body(resp.into_body()).await.text(), "data: {}\n\n");
    let head = seen.await.unwrap();
    assert_eq!(asked(&head), ["identity"], "{head}");
    // RFC 9110 7.6.3: the gateway names itself after the intermediaries before it.
    let via: Vec<&str> = head
        .lines()
        .filter_map(|l| l.strip_prefix("via:"))
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    assert_eq!(via, ["1.1 edge", "1.1 hourglass"], "{head}");
    // A path whose answers are not read (an `auto` upstream's embeddings) keeps the client's
    // codings: a large answer then crosses the network compressed.
    let req = http::Request::post("/v1/embeddings")
        .header("host", "gateway")
        .header("accept-encoding", "gzip")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            b"{\"input\":\"x\"}",
        )))
        .unwrap();
    let (resp, _c) = h.send(req).await;
    assert_eq!(resp.status(), 200);
    let head = other_seen.await.unwrap();
    assert_eq!(asked(&head), ["gzip"], "{head}");
}

#[tokio::test]
async fn an_answer_encoded_anyway_passes_opaque_and_a_limit_aborts_it() {
    // Not SSE text: gzip's magic, a blank line, bytes that are not UTF-8, and no event that
    // SSE would dispatch. Then silence past the idle limit (1 s). Also on a route that holds
    // the head until the first token, which for an opaque body is its first byte.
    let first = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\n\n\xff\xfe".to_vec();
    let second = b"\x00\x80data: x".to_vec();
    for route in ["", "retries = 1\nretry_on = [\"first_token\"]"] {
        let (up, _seen) = scripted_upstream_with(
            "content-encoding: gzip\r\n",
            vec![
                (Duration::ZERO, first.clone()),
                (Duration::from_millis(50), second.clone()),
                (Duration::from_secs(30), b"never".to_vec()),
            ],
        )
        .await;
        let config = BASE.replace("{FAKE}", &format!("http://{up}")).replacen(
            "upstream = \"fake\"\n",
            &format!("upstream = \"fake\"\n{route}\n"),
            1,
        );
        let h = Harness::with_config(&config).await;
        let (resp, _c) = h.chat(&[]).await;
        assert_eq!(resp.status(), 200, "{route}");
        assert_eq!(resp.headers()["content-encoding"], "gzip");
        let read = read_body(resp.into_body()).await;
        // Byte for byte what the upstream sent, nothing added: an error event inside a gzip
        // stream would break the client's decoder. The limit is told by aborting the body
        // instead, as for any body that is not SSE text.
        assert_eq!(
            read.bytes,
            [first.clone(), second.clone()].concat(),
            "{route}"
        );
        assert!(read.error.is_some(), "the body ended cleanly ({route})");
        // The first byte was the first token: the idle limit ended it, not the first-token
        // limit that no SSE event would ever have satisfied.
        h.wait_requests("chat", 1.0).await;
        assert_eq!(
            h.metric(r#"hourglass_cancellations_total{origin="idle",route="chat"}"#)
                .await,
            1.0,
            "{route}"
        );
    }
}

#[tokio::test]
async fn an_encoded_request_body_is_refused_only_where_the_gateway_reads_it() {
    // A route that picks by model, and an upstream that rewrites the model: both must read
    // the body, so an encoded one is refused before anything reaches the upstream.
    for (what, from, to) in [
        (
            "models",
            "upstream = \"fake\"\n",
            "upstream = \"fake\"\nmodels = [\"gpt-*\"]\n",
        ),
        (
            "model rewrite",
            "auth = \"bearer\"\n",
            "auth = \"bearer\"\nmodel = \"other\"\n",
        ),
    ] {
        let (up, seen) =
            scripted_upstream_with("", vec![(Duration::ZERO, b"data: {}\n\n".to_vec())]).await;
        let config = BASE
            .replace("{FAKE}", &format!("http://{up}"))
            .replacen(from, to, 1);
        let h = Harness::with_config(&config).await;
        let (resp, _c) = h
            .chat(&[("content-encoding", "gzip"), ("x-which", "encoded")])
            .await;
        assert_eq!(resp.status(), 415, "{what}");
        assert_eq!(resp.headers()["accept-encoding"], "identity");
        let body = json_body(resp).await;
        assert_eq!(body["error"]["code"], "unsupported_encoding");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("content-encoding") && message.contains("\"gzip\""),
            "{message}"
        );
        // `identity` is no coding at all: that request is forwarded, and it is the first the
        // upstream sees.
        let (resp, _c) = h
            .chat(&[("content-encoding", "identity"), ("x-which", "plain")])
            .await;
        assert_eq!(resp.status(), 200, "{what}");
        let seen = seen.await.unwrap();
        assert!(seen.contains("x-which: plain"), "{what}: {seen}");
    }
    // A route that reads nothing of the body forwards it as it is, coding and all.
    let (up, seen) =
        scripted_upstream_with("", vec![(Duration::ZERO, b"data: {}\n\n".to_vec())]).await;
    let h = Harness::with_config(&BASE.replace("{FAKE}", &format!("http://{up}"))).await;
    let req = http::Request::post("/v1/chat/completions")
        .header("host", "gateway")
        .header("content-encoding", "gzip")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            b"\x1f\x8b COMPRESSED",
        )))
        .unwrap();
    let (resp, _c) = h.send(req).await;
    assert_eq!(resp.status(), 200);
    let seen = seen.await.unwrap();
    assert!(seen.contains("\r\ncontent-encoding: gzip\r\n"), "{seen}");
    assert!(
        seen.ends_with("\r\n\r\n\u{1f}\u{fffd} compressed"),
        "{seen:?}"
    );
}

/// An HTTP/1.0 exchange through a gateway whose upstream answers as `scripted_upstream_with`
/// does: the gateway (for its metrics), then status, head and body.
async fn http10_through(
    extra: &'static str,
    chunks: Vec<(Duration, Vec<u8>)>,
) -> (Harness, u16, String, Vec<u8>) {
    let (up, _) = scripted_upstream_with(extra, chunks).await;
    let h = Harness::with_config(&BASE.replace("{FAKE}", &format!("http://{up}"))).await;
    let (status, head, body) = http10(h.addr()).await;
    (h, status, head, body)
}

/// An HTTP/1.0 exchange on a raw socket, read to the connection's end: status, head, body.
async fn http10(addr: SocketAddr) -> (u16, String, Vec<u8>) {
    let body = r#"{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}"#;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.0\r\nhost: gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8_lossy(&out[..end]).to_lowercase();
    let status = head[9..12].parse().unwrap();
    (status, head, out[end + 4..].to_vec())
}

#[tokio::test]
async fn an_http10_client_gets_a_json_answer_with_a_length_or_an_error() {
    const JSON: &str = "content-type: application/json\r\n";
    // HTTP/1.0 has no chunked coding: without a length, the end of the connection is the end
    // of the body, and an abort would look whole.
    let (_h, status, head, body) = http10_through(
        JSON,
        vec![
            (Duration::ZERO, b"{\"choices\":".to_vec()),
            (Duration::from_millis(50), b"[]}".to_vec()),
        ],
    )
    .await;
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("\r\ncontent-length: 14"), "{head}");
    assert_eq!(body, b"{\"choices\":[]}");

    // Half an answer, then silence past the idle limit: the error, not the half.
    let (h, status, head, body) = http10_through(
        JSON,
        vec![
            (Duration::ZERO, b"{\"choices\":".to_vec()),
            (Duration::from_secs(30), b"[]}".to_vec()),
        ],
    )
    .await;
    assert_eq!(status, 504, "{head}");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "idle_timeout");
    h.wait_requests("chat", 1.0).await;
    assert_eq!(
        h.metric(r#"hourglass_cancellations_total{origin="idle",route="chat"}"#)
            .await,
        1.0
    );

    // Anything but a JSON document may be a stream (NDJSON here): never held back, so the
    // client has the first line before the limit ends it with the connection, after a line
    // that names the limit (audit WB 7).
    let (_h, status, head, body) = http10_through(
        "content-type: application/x-ndjson\r\n",
        vec![
            (Duration::ZERO, b"{\"n\":1}\n".to_vec()),
            (Duration::from_secs(30), b"{\"n\":2}\n".to_vec()),
        ],
    )
    .await;
    assert_eq!(status, 200, "{head}");
    assert!(!head.contains("content-length"), "{head}");
    let body = String::from_utf8(body).unwrap();
    let error = body.strip_prefix("{\"n\":1}\n").unwrap();
    assert!(error.starts_with("{\"error\":\"idle timeout"), "{body}");

    // So is a JSON array (audit WB 5: Gemini's streamed answer), its head saying the
    // connection ends the body.
    let (_h, status, head, body) = http10_through(
        JSON,
        vec![
            (Duration::ZERO, b" [{\"n\":1}\n".to_vec()),
            (Duration::from_secs(30), b",{\"n\":2}]".to_vec()),
        ],
    )
    .await;
    assert_eq!(status, 200, "{head}");
    assert!(!head.contains("content-length"), "{head}");
    assert!(head.contains("\r\nconnection: close"), "{head}");
    assert_eq!(body, b" [{\"n\":1}\n");

    // Longer than the gateway reads ahead: it goes out as it comes, every byte of it.
    let big = vec![b'x'; hourglass::gateway::LENGTH_CAP / 4];
    let (_h, status, head, body) = http10_through(
        JSON,
        (0..6).map(|_| (Duration::ZERO, big.clone())).collect(),
    )
    .await;
    assert_eq!(status, 200, "{head}");
    assert!(!head.contains("content-length"), "{head}");
    assert_eq!(body.len(), big.len() * 6);
}

/// The time to first token and to first byte are observed when they come, not when the
/// stream ends: a minute-long stream held its latency back until its end (audit L2). Once
/// each, on a route that streams the head at once and on one that holds it for the token.
#[tokio::test]
async fn first_token_and_first_byte_are_observed_when_they_come_and_once() {
    let chat = "path_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n";
    let base = BASE.replace("idle_timeout = \"1s\"", "idle_timeout = \"30s\"")
        + "\n[upstreams.fake2]\nurl = \"{FAKE}\"\nauth = \"none\"\n";
    let held = base.replace(chat, &format!("{chat}fallbacks = [\"fake2\"]\n"));
    assert_ne!(base, held);
    for (route, toml) in [("plain", base.clone()), ("held", held)] {
        let h = Harness::with_config(&toml).await;
        let (resp, conn) = h.chat(&[("x-fake-freeze-after", "1")]).await;
        assert_eq!(resp.status(), 200, "{route}");
        let mut body = resp.into_body();
        let text = read_events(&mut body, 2).await;
        assert!(text.contains("tok1"), "{route}: {text}");
        let ttft = "hourglass_time_to_first_token_seconds_count{route=\"chat\",upstream=\"fake\"}";
        let ttfb = "hourglass_time_to_first_byte_seconds_count{route=\"chat\",upstream=\"fake\"}";
        // The stream is still open: its first token and byte are in, the request is not.
        assert_eq!(
            h.metric("hourglass_requests_in_flight{route=\"chat\"}")
                .await,
            1.0,
            "{route}"
        );
        assert_eq!(h.metric(ttft).await, 1.0, "{route}: TTFT before the end");
        assert_eq!(h.metric(ttfb).await, 1.0, "{route}: TTFB before the end");
        drop(body);
        conn.close();
        h.wait_requests("chat", 1.0).await;
        assert_eq!(h.metric(ttft).await, 1.0, "{route}: TTFT once");
        assert_eq!(h.metric(ttfb).await, 1.0, "{route}: TTFB once");
    }
}

/// A gateway in front of `up` whose upstream names its api (`openai`), as configuration.md
/// tells Azure users to, with a route for Gemini's native paths; and the request for
/// Gemini's streamed array (`:streamGenerateContent` without `alt=sse`).
async fn named_api_gemini(
    up: SocketAddr,
) -> (Harness, http::Request<http_body_util::Full<bytes::Bytes>>) {
    let toml = BASE.replace("{FAKE}", &format!("http://{up}")).replace(
        "auth = \"bearer\"\n",
        "auth = \"bearer\"\napi = \"openai\"\n",
    )
        + "\n[[routes]]\nname = \"gemini\"\npath_prefix = \"/v1beta/\"\nupstream = \"fake\"\n";
    let h = Harness::with_config(&toml).await;
    let req = http::Request::post("/v1beta/models/gemini-2.0-flash:streamGenerateContent")
        .header("host", "gateway")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            br#"{"contents":[{"parts":[{"text":"hi"}]}]}"#,
        )))
        .unwrap();
    (h, req)
}

/// Audit WB 5: with `api = "openai"` every path has a format, and a 2xx JSON answer in a
/// known format was held whole before its head went: Gemini's streamed JSON array reached
/// the client only at its end. An array (after any JSON whitespace) is no document of
/// these APIs: it streams as it comes, each element before the upstream writes the next.
#[tokio::test]
async fn a_json_array_streamed_piece_by_piece_is_never_held() {
    let (up, tx) = stepped_upstream_of("application/json").await;
    let (h, req) = named_api_gemini(up).await;
    let pieces: [&[u8]; 4] = [
        b"\r\n",
        b"[{\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"tok0 \"}]}}]}\r\n",
        b",\r\n{\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"tok1 \"}]}}]}\r\n",
        b",\r\n{\"usageMetadata\":{\"promptTokenCount\":3}}\r\n",
    ];
    // Sent before the request, so that a gateway that holds the body waits for the rest.
    tx.send(pieces[0].to_vec()).unwrap();
    tx.send(pieces[1].to_vec()).unwrap();
    let (resp, _c) = h.send(req).await;
    assert_eq!(resp.status(), 200, "the head goes before the array ends");
    assert_eq!(resp.headers().get("content-length"), None);
    let mut body = resp.into_body();
    let first = pieces[0].len() + pieces[1].len();
    assert_eq!(next_bytes(&mut body, first).await, pieces[..2].concat());
    for piece in &pieces[2..] {
        tx.send(piece.to_vec()).unwrap();
        assert_eq!(next_bytes(&mut body, piece.len()).await, *piece);
    }
    tx.send(b"]".to_vec()).unwrap();
    drop(tx);
    let read = read_body(body).await;
    assert_eq!((read.text(), read.error), ("]".to_owned(), None));
    h.wait_requests("gemini", 1.0).await;
    assert_eq!(
        h.metric(r#"hourglass_requests_total{outcome="ok",route="gemini"}"#)
            .await,
        1.0
    );
}

/// Audit WB 5: held whole, a streamed array cut by the idle limit was answered 504 and the
/// elements that had arrived were lost. Streamed, they reach the client, and the cut is an
/// abort (DESIGN 6: a non-SSE body that cannot be completed never looks whole).
#[tokio::test]
async fn an_idle_cut_of_a_streamed_json_array_keeps_the_elements_sent() {
    let (up, tx) = stepped_upstream_of("application/json").await;
    let (h, req) = named_api_gemini(up).await;
    let sent = b"[{\"candidates\":[]}\r\n,\r\n{\"candidates\":[]}\r\n";
    tx.send(sent.to_vec()).unwrap();
    // Then silence past the idle limit (1 s), the connection kept open.
    let (resp, _c) = h.send(req).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert_eq!(read.bytes, &sent[..]);
    assert!(
        read.error.is_some(),
        "an abort, never a body that looks whole"
    );
    h.wait_requests("gemini", 1.0).await;
    assert_eq!(
        h.metric(r#"hourglass_cancellations_total{origin="idle",route="gemini"}"#)
            .await,
        1.0
    );
    drop(tx);
}

/// Audit WB 6: google-genai reads every line of a native Gemini stream that is not `data: `
/// as raw JSON, so the gateway's `event: error` line raised "Failed to parse response as
/// JSON" and the limit that fired was never named. On a `:streamGenerateContent` stream a
/// cut is written as Gemini writes its own errors: one data-only event, `{"error":{"code",
/// "message","status"}}` with a numeric code, which the SDK raises as the error it names
/// (and a gateway in front of this one reads as its upstream's error: `gemini.rs`, YB 1).
#[tokio::test]
async fn a_cut_gemini_stream_ends_with_an_error_in_geminis_shape() {
    let (up, tx) = stepped_upstream().await;
    let toml = BASE.replace("{FAKE}", &format!("http://{up}"))
        + "\n[[routes]]\nname = \"gemini\"\npath_prefix = \"/v1beta/\"\nupstream = \"fake\"\n";
    let h = Harness::with_config(&toml).await;
    let chunk = "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"tok0 \"}]}}]}\r\n\r\n";
    tx.send(chunk.as_bytes().to_vec()).unwrap();
    let req = http::Request::post("/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse")
        .header("host", "gateway")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    // Then silence past the idle limit (1 s).
    let (resp, _c) = h.send(req).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert_eq!(read.error, None);
    let text = read.text();
    let rest = text
        .strip_prefix(chunk)
        .unwrap_or_else(|| panic!("{text:?}"));
    assert!(!rest.contains("event:"), "{rest:?}");
    let data = rest
        .strip_prefix("data: ")
        .and_then(|d| d.strip_suffix("\n\n"))
        .unwrap_or_else(|| panic!("one data-only event: {rest:?}"));
    let v: serde_json::Value = serde_json::from_str(data).unwrap();
    assert_eq!(v["error"]["code"], 504, "{v}");
    assert_eq!(v["error"]["status"], "DEADLINE_EXCEEDED", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("idle timeout"),
        "{v}"
    );
    drop(tx);
}

/// Audit WB 7: a limit that cut an NDJSON stream (Ollama's `/api/chat`) left the client a
/// broken body and no reason. It ends with one line in Ollama's own error shape, which
/// ollama-python raises as `ResponseError` with the text; a line incomplete when the limit
/// fired is dropped, never left half before it.
#[tokio::test]
async fn a_cut_ndjson_stream_ends_with_an_error_line() {
    let (up, tx) = stepped_upstream_of("application/x-ndjson").await;
    let toml = BASE.replace("{FAKE}", &format!("http://{up}"))
        + "\n[[routes]]\nname = \"ollama\"\npath_prefix = \"/api/\"\nupstream = \"fake\"\n";
    let h = Harness::with_config(&toml).await;
    let lines = "{\"message\":{\"content\":\"tok0 \"},\"done\":false}\n";
    tx.send(lines.as_bytes().to_vec()).unwrap();
    tx.send(b"{\"message\":{\"cont".to_vec()).unwrap();
    let req = http::Request::post("/api/chat")
        .header("host", "gateway")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            br#"{"model":"m","messages":[]}"#,
        )))
        .unwrap();
    // Then silence past the idle limit (1 s).
    let (resp, _c) = h.send(req).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert_eq!(read.error, None, "{}", read.text());
    let text = read.text();
    let rest = text
        .strip_prefix(lines)
        .unwrap_or_else(|| panic!("{text:?}"));
    let line = rest
        .strip_suffix('\n')
        .unwrap_or_else(|| panic!("{rest:?}"));
    assert!(!line.contains('\n'), "one line: {rest:?}");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert!(
        v["error"].as_str().unwrap().starts_with("idle timeout"),
        "{v}"
    );
    assert_eq!(v["code"], "idle_timeout", "{v}");
    drop(tx);
}
