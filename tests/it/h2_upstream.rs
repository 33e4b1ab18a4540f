//! HTTP/2 to the upstream (`http2 = "always"`: h2c prior knowledge to the fake). Many client
//! streams share one upstream connection, so cancelling one is a stream reset that must leave
//! the connection open for the others, a full connection makes the gateway open another, and
//! one client that stops reading must not hold back its neighbours on the shared connection.
//!
//! As in `cancel.rs`, the proof of "promptly" is the cause: every limit that is not under test
//! is 20 s or more and every scripted wait longer, so an upstream stream that ends within
//! `PROMPTLY` ended because of the cause the test set off.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Version};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::support::*;

mod connect;
mod silence;

/// BASE with limits far beyond `PROMPTLY`, HTTP/2 to the fake, and `keys` added to the
/// upstream.
fn config(keys: &str) -> String {
    BASE.replace("budget = \"10s\"", "budget = \"30s\"")
        .replace(
            "first_token_timeout = \"2s\"",
            "first_token_timeout = \"20s\"",
        )
        .replace("idle_timeout = \"1s\"", "idle_timeout = \"20s\"")
        .replace(
            "url = \"{FAKE}\"\n",
            &format!("url = \"{{FAKE}}\"\nhttp2 = \"always\"\n{keys}\n"),
        )
}

/// A gateway whose upstream is the h2c server at `up` (one of this file's own, not the fake).
async fn gateway_to(up: std::net::SocketAddr) -> Harness {
    Harness::with_config(&config("").replace("{FAKE}", &format!("http://{up}"))).await
}

/// Every request the fake saw came over HTTP/2, and on which connection each came.
fn conn_ids(h: &Harness) -> Vec<u64> {
    let requests = h.fake.requests();
    for r in &requests {
        assert_eq!(
            r.version,
            Version::HTTP_2,
            "{} came over {:?}",
            r.path,
            r.version
        );
    }
    requests.iter().map(|r| r.conn_id).collect()
}

/// The upstream connection is still open, and one more request completes on it.
async fn assert_connection_serves_another(h: &Harness, conn_id: u64) {
    let open = h.fake.connections();
    assert!(
        open[conn_id as usize].closed_at.is_none(),
        "the upstream connection was closed: {open:?}"
    );
    let (resp, _conn) = h
        .chat(&[("x-fake-chunks", "3"), ("x-fake-interval-ms", "1")])
        .await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(read.text().contains("[DONE]"), "{}", read.text());
    let ids = conn_ids(h);
    assert_eq!(
        ids.last(),
        Some(&conn_id),
        "not the same connection: {ids:?}"
    );
    assert_eq!(h.fake.connections().len(), 1, "{:?}", h.fake.connections());
}

/// Waits for request `index` at the fake to end and returns how long after `since` it did.
async fn upstream_stream_end(h: &Harness, index: usize, since: Instant) -> Duration {
    let record = h
        .fake
        .wait_request_finished(index, Duration::from_secs(10))
        .await
        .expect("the upstream stream ended");
    assert!(!record.completed, "the upstream stream ran to its end");
    record.finished_at.unwrap().saturating_duration_since(since)
}

#[tokio::test]
async fn a_client_leaving_mid_stream_resets_its_upstream_stream_and_keeps_the_connection() {
    let h = Harness::with_config(&config("")).await;
    let (resp, conn) = h
        .chat(&[("x-fake-freeze-after", "2"), ("x-fake-interval-ms", "5")])
        .await;
    let mut body = resp.into_body();
    let text = read_events(&mut body, 3).await;
    assert!(text.contains("tok2"), "{text}");
    let left = Instant::now();
    drop(body);
    conn.close();
    let delay = upstream_stream_end(&h, 0, left).await;
    eprintln!("h2 client left: upstream stream reset {delay:?} later");
    assert!(
        delay < PROMPTLY,
        "upstream stream ended {delay:?} after the client left"
    );
    assert_eq!(conn_ids(&h), [0]);
    assert_connection_serves_another(&h, 0).await;
    h.wait_requests("chat", 2.0).await;
    assert_eq!(
        h.metric("hourglass_cancellations_total{origin=\"client\",route=\"chat\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn a_full_connection_makes_the_gateway_open_another() {
    let h = Harness::with_config(&config("http2_max_streams_per_connection = 2")).await;
    // Five streams held open at once: each one's first token read before the next starts,
    // so all five are in flight together when the connections are counted.
    let mut held = Vec::new();
    for _ in 0..5 {
        let (resp, conn) = h
            .chat(&[("x-fake-freeze-after", "1"), ("x-fake-interval-ms", "1")])
            .await;
        let mut body = resp.into_body();
        read_events(&mut body, 1).await;
        held.push((body, conn));
    }
    let ids = conn_ids(&h);
    assert_eq!(ids, [0, 0, 1, 1, 2], "streams by upstream connection");
    assert_eq!(h.fake.connections().len(), 3);
    // All five leave: five stream resets, no connection closed.
    let left = Instant::now();
    drop(held);
    for i in 0..5 {
        let delay = upstream_stream_end(&h, i, left).await;
        assert!(
            delay < PROMPTLY,
            "stream {i} ended {delay:?} after its client left"
        );
    }
    assert_eq!(h.fake.open_connections(), 3, "{:?}", h.fake.connections());
    // A freed place on the first connection is taken before any other.
    let (resp, _conn) = h.chat(&[("x-fake-chunks", "2")]).await;
    read_body(resp.into_body()).await;
    assert_eq!(conn_ids(&h).last(), Some(&0));
}

/// An HTTP/2 client connection to the gateway whose streams get only the protocol's initial
/// 64 KiB window, so a body it does not read stops the gateway within that much.
async fn h2_client(h: &Harness) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(h.addr()).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

fn h2_chat(headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut req = chat_request(headers, true);
    *req.uri_mut() = "http://gateway/v1/chat/completions".parse().unwrap();
    req.headers_mut().remove("host");
    req
}

async fn send(
    sender: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> Response<Incoming> {
    let resp = sender.send_request(req).await.expect("response head");
    assert_eq!(resp.status(), 200);
    resp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_does_not_hold_back_its_neighbour_upstream() {
    // Small windows, so that the test's stalled stream fills them fast: 64 KiB per stream,
    // 1 MiB for the connection. A stalled stream can take only its own window of the
    // connection's; with the two equal it would take all of it and the neighbour would hang.
    let h = Harness::with_config(&config(
        "http2_stream_window = 65535\nhttp2_connection_window = 1048576",
    ))
    .await;
    // Stream A: as fast as the fake can write, on a client connection that never reads it.
    let mut stalled_client = h2_client(&h).await;
    let stalled = send(
        &mut stalled_client,
        h2_chat(&[("x-fake-chunks", "10000000"), ("x-fake-interval-ms", "0")]),
    )
    .await;
    // Time for A to fill the client's window, the gateway's buffers and its upstream window:
    // a few hundred KiB at the fake's full speed. Not an assertion: were A not stalled yet,
    // the test would pass without proving anything, never fail.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Stream B: a neighbour on another client connection, the same upstream connection.
    let mut neighbour_client = h2_client(&h).await;
    let neighbour = send(
        &mut neighbour_client,
        h2_chat(&[("x-fake-chunks", "50"), ("x-fake-interval-ms", "2")]),
    )
    .await;
    let read = tokio::time::timeout(Duration::from_secs(15), read_body(neighbour.into_body()))
        .await
        .expect("the neighbour stream was held back");
    assert!(read.error.is_none(), "{:?}", read.error);
    assert!(read.text().contains("tok50 ") && read.text().contains("[DONE]"));
    assert_eq!(
        conn_ids(&h),
        [0, 0],
        "both streams on one upstream connection"
    );
    let stalled_record = &h.fake.requests()[0];
    assert!(
        stalled_record.finished_at.is_none(),
        "the stalled stream is still open, held by flow control: {stalled_record:?}"
    );
    drop(stalled);
}

#[tokio::test]
async fn a_client_leaving_before_the_head_resets_its_upstream_stream_and_keeps_the_connection() {
    let h = Harness::with_config(&config("")).await;
    let conn = Conn::open(h.addr()).await;
    // The fake holds the head for 25 s: the gateway is still waiting for the response.
    let waiting = tokio::spawn(conn.send(chat_request(&[("x-fake-ttft-ms", "25000")], true)));
    assert!(h.fake.wait_for_requests(1, Duration::from_secs(10)).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let left = Instant::now();
    waiting.abort();
    let delay = upstream_stream_end(&h, 0, left).await;
    eprintln!("h2 client left before the head: upstream stream reset {delay:?} later");
    assert!(
        delay < PROMPTLY,
        "upstream stream ended {delay:?} after the client left"
    );
    assert_connection_serves_another(&h, 0).await;
}

/// An HTTP/2 upstream may end an answer with an empty DATA frame of its own carrying
/// END_STREAM (Go's server does, for bodies written in pieces). The answer's length says it
/// is whole at its last byte, where an HTTP/1.1 client's server stops reading it: it is
/// delivered in full and counted `ok`, not `cancelled` by the client.
#[tokio::test]
async fn an_answer_whose_end_comes_in_a_frame_of_its_own_is_complete() {
    const DOC: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[]}"#;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req: Request<Incoming>| async {
                    let (mut tx, body) =
                        http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(1);
                    tokio::spawn(async move {
                        tx.send_data(Bytes::from_static(DOC.as_bytes()))
                            .await
                            .unwrap();
                        // The data goes out in a frame of its own; END_STREAM follows alone.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        drop(tx);
                    });
                    Ok::<_, std::convert::Infallible>(
                        Response::builder()
                            .header("content-type", "application/json")
                            .header("content-length", DOC.len())
                            .body(body)
                            .unwrap(),
                    )
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    let h = gateway_to(up).await;
    for _ in 0..3 {
        let (resp, _c) = h.send(chat_request(&[], false)).await;
        assert_eq!(resp.status(), 200);
        let read = read_body(resp.into_body()).await;
        assert_eq!((read.text().as_str(), read.error), (DOC, None));
    }
    h.wait_requests("chat", 3.0).await;
    assert_eq!(
        h.metric("hourglass_requests_total{outcome=\"ok\",route=\"chat\"}")
            .await,
        3.0
    );
}

const ANSWER: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[]}"#;

/// An h2 server that answers every request with `ANSWER`, except the first `refuse` it sees
/// (counted across connections), which it resets with REFUSED_STREAM. Returns its address
/// and the count of requests it saw.
async fn refusing_upstream(
    refuse: usize,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(s).await else {
                    return;
                };
                while let Some(Ok((_req, mut respond))) = conn.accept().await {
                    if seen.fetch_add(1, Ordering::SeqCst) < refuse {
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                        continue;
                    }
                    let head = Response::builder()
                        .header("content-type", "application/json")
                        .body(())
                        .unwrap();
                    let mut body = respond.send_response(head, false).unwrap();
                    body.send_data(Bytes::from_static(ANSWER.as_bytes()), true)
                        .unwrap();
                }
            });
        }
    });
    (addr, count)
}

/// A stream the upstream refuses (REFUSED_STREAM: nothing of it was processed) is sent
/// again once by the gateway itself, on a route without retries, and the client gets the
/// answer; refused again, the client gets a 502 that says why, and it is not sent a third
/// time.
#[tokio::test]
async fn a_stream_the_upstream_refuses_is_sent_again_once() {
    use std::sync::atomic::Ordering;
    let (up, seen) = refusing_upstream(1).await;
    let h = gateway_to(up).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert_eq!((read.text().as_str(), read.error), (ANSWER, None));
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    let refused = "hourglass_retries_total{reason=\"refused\",route=\"chat\",upstream=\"fake\"}";
    assert_eq!(h.metric(refused).await, 1.0);

    let (up, seen) = refusing_upstream(usize::MAX).await;
    let h = gateway_to(up).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 502);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "upstream_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("REFUSED_STREAM"), "{message}");
    assert_eq!(seen.load(Ordering::SeqCst), 2, "sent twice, not more");
    assert_eq!(h.metric(refused).await, 1.0);
}

/// An h2 upstream whose first connection says GOAWAY (last stream 0, error `code`) to the
/// first request's HEADERS, speaking just enough HTTP/2 by hand for that, and stays open;
/// later connections go to a server that answers. Returns its address and the count of
/// connections it took.
async fn goaway_upstream(
    code: u32,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    first_connection_apart(move |s| {
        let mut goaway = vec![0, 0, 8, 7, 0, 0, 0, 0, 0];
        goaway.extend_from_slice(&[0; 4]);
        goaway.extend_from_slice(&code.to_be_bytes());
        speak_h2(s, goaway)
    })
    .await
}

/// Just enough HTTP/2 by hand: the server's SETTINGS, an ACK of the client's, and `answer`
/// to each request's HEADERS (nothing, when empty), until the client goes.
async fn speak_h2(mut s: TcpStream, answer: Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut preface = [0u8; 24];
    s.read_exact(&mut preface).await.unwrap();
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    loop {
        let mut head = [0u8; 9];
        if s.read_exact(&mut head).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        if s.read_exact(&mut payload).await.is_err() {
            return;
        }
        match head[3] {
            // SETTINGS without ACK: acknowledged.
            4 if head[4] & 1 == 0 => {
                s.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).await.unwrap();
            }
            1 if !answer.is_empty() => s.write_all(&answer).await.unwrap(),
            _ => {}
        }
    }
}

/// An h2 upstream whose first connection is served by `first` and whose later ones go to a
/// server that answers every request. Returns its address and the count of connections it
/// took.
async fn first_connection_apart<F, Fut>(
    first: F,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
)
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (answering, _) = refusing_upstream(0).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = connections.clone();
    tokio::spawn(async move {
        let mut first = Some(first);
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if let Some(serve) = first.take() {
                tokio::spawn(serve(s));
                continue;
            }
            let mut to = TcpStream::connect(answering).await.unwrap();
            tokio::spawn(async move {
                let _ = tokio::io::copy_bidirectional(&mut s, &mut to).await;
            });
        }
    });
    (up, connections)
}

/// An upstream that closes its connection gracefully (GOAWAY, NO_ERROR) below a request's
/// stream has processed nothing of it (a provider's front end rotating connections): the
/// request is sent again on a new connection and the client sees only the answer. A GOAWAY
/// with an error code says no such thing (h2 gives it to every stream of the connection,
/// processed or not): that request is not sent again on a route without retries.
#[tokio::test]
async fn a_request_a_graceful_goaway_left_out_is_sent_again_on_a_new_connection() {
    let refused = "hourglass_retries_total{reason=\"refused\",route=\"chat\",upstream=\"fake\"}";
    let (up, connections) = goaway_upstream(0).await;
    let h = gateway_to(up).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert_eq!((read.text().as_str(), read.error), (ANSWER, None));
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(h.metric(refused).await, 1.0);

    let (up, connections) = goaway_upstream(2).await;
    let h = gateway_to(up).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 502);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "upstream_error", "{body}");
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(!h.metrics_text().await.contains(refused));
}

/// An h2c upstream whose first connection is accepted and read but never answered, not even
/// with the server's SETTINGS (a hung front end, or a load balancer that lost the flow);
/// later connections go to a server that answers. Returns its address and the count of
/// connections it took.
async fn silent_first_connection() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use tokio::io::AsyncReadExt;
    first_connection_apart(|mut s| async move {
        let mut sink = [0u8; 4096];
        while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await
}

/// An HTTP/2 server's first frame is its SETTINGS (RFC 9113 §3.4); an upstream connection
/// that has sent none within `connect_timeout` is not connected. It is closed, the request
/// on it fails as a connect timeout (and so may be retried), and the next request gets a
/// new connection. Before, the silent connection stayed in the pool, and every request and
/// every retry on it waited out its first-token limit, until hyper's keep-alive ping gave
/// up about 50 s later.
#[tokio::test]
async fn an_http2_upstream_that_never_sends_its_settings_is_not_connected() {
    let (up, connections) = silent_first_connection().await;
    let h = gateway_to(up).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 504);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "connect_timeout", "{body}");
    let connect = "hourglass_cancellations_total{origin=\"connect\",route=\"chat\"}";
    assert_eq!(h.metric(connect).await, 1.0);
    // Audit RA 2: counted for the upstream too, as a connect that timed out.
    let timeout = "hourglass_upstream_connect_errors_total{reason=\"timeout\",upstream=\"fake\"}";
    assert_eq!(h.metric(timeout).await, 1.0);

    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert_eq!((read.text().as_str(), read.error), (ANSWER, None));
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// hyper writes a request before the server's SETTINGS come, so a request on a connection
/// whose server never spoke may have been delivered (and billed): it is not retried as a
/// connect failure, which is safe to send again, but as a first-token one, which the
/// operator chose knowing it was sent.
#[tokio::test]
async fn a_request_sent_to_a_silent_http2_server_is_retried_only_as_a_first_token_failure() {
    for (retry_on, sent) in [("[\"connect\"]", 1), ("[\"first_token\"]", 2)] {
        let (up, connections) = silent_first_connection().await;
        let toml = config("")
            .replace("{FAKE}", &format!("http://{up}"))
            .replace(
                "upstream = \"fake\"\n",
                &format!("upstream = \"fake\"\nretries = 1\nretry_on = {retry_on}\n"),
            );
        let h = Harness::with_config(&toml).await;
        let (resp, _c) = h.send(chat_request(&[], false)).await;
        let status = resp.status();
        let body = read_body(resp.into_body()).await;
        assert_eq!(
            connections.load(std::sync::atomic::Ordering::SeqCst),
            sent,
            "retry_on = {retry_on}: {status} {}",
            body.text()
        );
        if sent == 1 {
            assert_eq!(status, 504);
            let v: serde_json::Value = serde_json::from_str(&body.text()).unwrap();
            assert_eq!(v["error"]["code"], "connect_timeout", "{v}");
            let message = v["error"]["message"].as_str().unwrap();
            assert!(message.contains("SETTINGS"), "{message}");
        } else {
            assert_eq!(status, 200, "{}", body.text());
        }
    }
}

/// An h2 upstream that answers each request with an SSE head and one chunk, then resets
/// the stream with `reason`.
async fn resetting_upstream(reason: h2::Reason) -> std::net::SocketAddr {
    let chunk = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok1 \"}}]}\n\n";
    resetting_upstream_with(reason, "text/event-stream", None, chunk).await
}

/// An h2 upstream that answers each request with a head of `content_type` (and `length`),
/// then `chunk`, then resets the stream with `reason`.
async fn resetting_upstream_with(
    reason: h2::Reason,
    content_type: &'static str,
    length: Option<usize>,
    chunk: &'static str,
) -> std::net::SocketAddr {
    h2_answering(move |mut respond| {
        let mut head = Response::builder().header("content-type", content_type);
        if let Some(length) = length {
            head = head.header("content-length", length);
        }
        let mut body = respond
            .send_response(head.body(()).unwrap(), false)
            .unwrap();
        body.send_data(Bytes::from_static(chunk.as_bytes()), false)
            .unwrap();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            body.send_reset(reason);
        });
    })
    .await
}

/// An h2c upstream that hands every request's stream to `answer`.
async fn h2_answering(
    answer: impl Fn(h2::server::SendResponse<Bytes>) + Clone + Send + 'static,
) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(s).await else {
                    return;
                };
                while let Some(Ok((_req, respond))) = conn.accept().await {
                    answer(respond);
                }
            });
        }
    });
    addr
}

/// A stream the upstream resets mid-answer ends with an error event that says so, with the
/// reset's code, not only hyper's "error reading a body from connection".
#[tokio::test]
async fn a_reset_mid_stream_is_named_in_the_error_event() {
    let up = resetting_upstream(h2::Reason::INTERNAL_ERROR).await;
    let h = gateway_to(up).await;
    let (resp, _c) = h.send(chat_request(&[], true)).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    let error = read.error_event().expect("an error event");
    assert_eq!(error["code"], "upstream_error", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("error reading a body from connection")
            && message.contains("INTERNAL_ERROR"),
        "{message}"
    );
}

/// hyper's HTTP/2 client reads an upstream's `RST_STREAM` with `NO_ERROR` or `CANCEL` as the
/// body's end, wherever it comes (RFC 9113 8.1 allows it only after a complete answer). A
/// JSON document cut inside a value, or any body short of its `content-length`, is an
/// upstream failure all the same: the client's body is aborted (nothing else can tell it,
/// once the head went out) and the request counted as an error. Before, the short body went
/// out as a whole one, counted ok. (A document is read whole before its head goes: its
/// failure is a 502; a body that is no document is aborted.)
#[tokio::test]
async fn a_reset_with_no_error_mid_body_is_no_end_of_it() {
    let doc = r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"#;
    let other = "\n[[routes]]\nname = \"other\"\npath_prefix = \"/\"\nupstream = \"fake\"\n";
    for (reason, content_type, length, path) in [
        (
            h2::Reason::NO_ERROR,
            "application/json",
            None,
            "/v1/chat/completions",
        ),
        (
            h2::Reason::CANCEL,
            "application/json",
            None,
            "/v1/chat/completions",
        ),
        (
            h2::Reason::NO_ERROR,
            "application/json",
            Some(227),
            "/v1/chat/completions",
        ),
        (
            h2::Reason::NO_ERROR,
            "text/plain",
            Some(227),
            "/v1/audio/speech",
        ),
    ] {
        let up = resetting_upstream_with(reason, content_type, length, doc).await;
        let toml = format!("{}{other}", config("")).replace("{FAKE}", &format!("http://{up}"));
        let h = Harness::with_config(&toml).await;
        let mut req = chat_request(&[], false);
        *req.uri_mut() = path.parse().unwrap();
        let (resp, _c) = h.send(req).await;
        let case = format!("{reason:?} {content_type} {length:?}");
        let route = if path == "/v1/audio/speech" {
            "other"
        } else {
            "chat"
        };
        if route == "chat" {
            assert_eq!(resp.status(), 502, "{case}");
            let body = json_body(resp).await;
            assert_eq!(body["error"]["code"], "upstream_error", "{case}: {body}");
        } else {
            assert_eq!(resp.status(), 200, "{case}");
            let read = read_body(resp.into_body()).await;
            assert!(
                read.error.is_some(),
                "{case}: ended as if whole: {}",
                read.text()
            );
        }
        h.wait_requests(route, 1.0).await;
        let errors = h
            .metric(&format!(
                "hourglass_requests_total{{outcome=\"error\",route=\"{route}\"}}"
            ))
            .await;
        assert_eq!(errors, 1.0, "{case}");
    }
    // A whole document whose stream the upstream then resets with NO_ERROR is whole.
    let whole = r#"{"id":"c1","object":"chat.completion","choices":[]}"#;
    let up = resetting_upstream_with(h2::Reason::NO_ERROR, "application/json", None, whole).await;
    let h = gateway_to(up).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    let read = read_body(resp.into_body()).await;
    assert_eq!(read.error, None);
    assert_eq!(read.text(), whole);
}

/// A HEAD answer from an HTTP/2 upstream (a length, and END_STREAM on its head) is
/// delivered and counted ok. hyper never polls a HEAD answer's body, and its length (which
/// the h2 client's body reports as still to come) made it look abandoned: logged as the
/// client's cancel.
#[tokio::test]
async fn a_head_answer_from_an_http2_upstream_is_ok() {
    let up = h2_answering(|mut respond| {
        let head = Response::builder()
            .header("content-type", "application/json")
            .header("content-length", "265")
            .body(())
            .unwrap();
        let _ = respond.send_response(head, true);
    })
    .await;
    let h = gateway_to(up).await;
    heads_are_answered_ok(&h, &[("content-length", "265")]).await;
}

/// An h2 upstream whose first connection speaks HTTP/2 (its SETTINGS, acknowledged) and
/// then never answers a request, though the socket stays open: a peer gone silent behind a
/// dropped flow. Later connections go to a server that answers.
async fn silent_after_settings() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    first_connection_apart(|s| speak_h2(s, Vec::new())).await
}

/// A connection that took a request and sent no head within the first-token limit takes
/// no new streams: the next request opens a new connection and is answered. Before, every
/// request went to the silent connection and timed out there, for about 50 s, until
/// hyper's keep-alive ping gave up on it.
#[tokio::test]
async fn a_connection_that_went_silent_takes_no_new_streams() {
    let (up, connections) = silent_after_settings().await;
    let toml = config("")
        .replace("{FAKE}", &format!("http://{up}"))
        .replace(
            "first_token_timeout = \"20s\"",
            "first_token_timeout = \"300ms\"",
        );
    let h = Harness::with_config(&toml).await;
    // A client whose own timeout cut the wait short of the route's limit says nothing of
    // the connection: it is not retired for that (any client could make the gateway open a
    // connection a request).
    let (resp, _c) = h
        .send(chat_request(&[("x-stainless-read-timeout", "0.25")], true))
        .await;
    assert_eq!(resp.status(), 504);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "first_token_timeout", "{body}");
    let (resp, _c) = h.send(chat_request(&[], true)).await;
    assert_eq!(resp.status(), 504, "still the silent connection's");
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "first_token_timeout", "{body}");
    for _ in 0..3 {
        let (resp, _c) = h.send(chat_request(&[], true)).await;
        assert_eq!(resp.status(), 200);
        let read = read_body(resp.into_body()).await;
        assert_eq!(read.error, None);
    }
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// HTTP/2 has no reason phrase: a 529 from an HTTP/2 upstream reaches an HTTP/1.1 client as
/// `529 Overloaded`, not the `529 <none>` hyper writes for a status it has no phrase for.
#[tokio::test]
async fn a_status_without_a_standard_phrase_gets_one() {
    let h = Harness::with_config(&config("")).await;
    let (resp, _c) = h
        .send(chat_request(&[("x-fake-status", "529")], true))
        .await;
    assert_eq!(resp.status(), 529);
    let reason = reason_phrase(&resp);
    assert_eq!(reason.as_deref(), Some("Overloaded"));
}

/// An HTTP/2 upstream's answer head is held to the bounds an HTTP/1.1 one is (audit H):
/// 64 KiB (hyper's HTTP/2 default was 16 KiB, and a 17 KB field got a bare PROTOCOL_ERROR
/// message) and 100 fields (none were counted: 150 passed). Past 64 KiB the message says
/// what broke.
#[tokio::test]
async fn an_http2_answer_head_is_held_to_the_http1_bounds() {
    let up = h2_answering(|mut respond| {
        let head = |fields: usize, size: usize| {
            let mut b = Response::builder().header("content-type", "application/json");
            for i in 0..fields {
                b = b.header(format!("x-big-{i}"), "v".repeat(size));
            }
            b.body(()).unwrap()
        };
        // Which head: by the stream's id, the gateway's streams going out in order.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let head = match NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
            0 => head(1, 30_000),
            1 => head(150, 10),
            _ => head(1, 70_000),
        };
        if let Ok(mut body) = respond.send_response(head, false) {
            let _ = body.send_data(Bytes::from_static(ANSWER.as_bytes()), true);
        }
    })
    .await;
    let h = gateway_to(up).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200, "30 KB in one field");
    assert_eq!(read_body(resp.into_body()).await.text(), ANSWER);

    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 502, "150 fields");
    let message = json_body(resp).await["error"]["message"].to_string();
    assert!(
        message.contains("151 fields, more than the 100"),
        "{message}"
    );

    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 502, "70 KB");
    let message = json_body(resp).await["error"]["message"].to_string();
    assert!(message.contains("over 64 KiB"), "{message}");
}

/// An HTTP/2 upstream that closes its connection is said to have closed it, not h2's "broken
/// pipe" (audit H): before its head (a 502) and after it (the error event).
#[tokio::test]
async fn an_http2_upstream_closing_its_connection_is_named() {
    for stream in [false, true] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(s).await else {
                        return;
                    };
                    let Some(Ok((_req, mut respond))) = conn.accept().await else {
                        return;
                    };
                    if stream {
                        let head = Response::builder()
                            .header("content-type", "text/event-stream")
                            .body(())
                            .unwrap();
                        let mut body = respond.send_response(head, false).unwrap();
                        body.send_data(Bytes::from_static(b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok1 \"}}]}\n\n"), false).unwrap();
                        // Let the frames go out before the connection is dropped.
                        let _ =
                            tokio::time::timeout(Duration::from_millis(50), conn.accept()).await;
                    }
                    drop((conn, respond));
                });
            }
        });
        let h = gateway_to(up).await;
        let (resp, _c) = h.send(chat_request(&[], stream)).await;
        let message = if stream {
            assert_eq!(resp.status(), 200);
            let read = read_body(resp.into_body()).await;
            read.error_event().expect("an error event")["message"].to_string()
        } else {
            assert_eq!(resp.status(), 502);
            json_body(resp).await["error"]["message"].to_string()
        };
        assert!(
            message.contains("the upstream closed the connection")
                && !message.contains("broken pipe"),
            "stream {stream}: {message}"
        );
    }
}

/// An h2 server allowing one stream at a time: it takes the first request, says so on
/// `took`, and holds it until `go`, when it closes the connection gracefully (GOAWAY,
/// NO_ERROR) and only then answers it.
async fn one_stream_then_goaway(
    s: TcpStream,
    took: tokio::sync::oneshot::Sender<()>,
    go: tokio::sync::oneshot::Receiver<()>,
) {
    let mut conn = h2::server::Builder::new()
        .max_concurrent_streams(1)
        .handshake::<_, Bytes>(s)
        .await
        .unwrap();
    let Some(Ok((_req, mut respond))) = conn.accept().await else {
        return;
    };
    took.send(()).unwrap();
    tokio::select! {
        _ = go => {}
        // Nothing more may come while the only stream is taken; the test fails should it.
        _ = conn.accept() => return,
    }
    conn.graceful_shutdown();
    let head = Response::builder()
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let mut body = respond.send_response(head, false).unwrap();
    body.send_data(Bytes::from_static(ANSWER.as_bytes()), true)
        .unwrap();
    while let Some(Ok(_)) = conn.accept().await {}
}

/// A chat request, then `second` sent while the first holds the only stream of the one
/// connection the gateway may open; then the upstream closes that connection gracefully.
/// Returns the gateway, both answers (with their connections) and the count of upstream
/// connections.
async fn waiting_behind_goaway(
    second: Request<Full<Bytes>>,
) -> (
    Harness,
    [(Response<Incoming>, Conn); 2],
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let (took_tx, took) = tokio::sync::oneshot::channel();
    let (go, go_rx) = tokio::sync::oneshot::channel();
    let (up, connections) =
        first_connection_apart(move |s| one_stream_then_goaway(s, took_tx, go_rx)).await;
    // One connection at most: the second request waits on the first one for a stream.
    let h = Harness::with_config(
        &config("http2_max_connections = 1").replace("{FAKE}", &format!("http://{up}")),
    )
    .await;
    let waiting = async {
        took.await.unwrap();
        let send = h.send(second);
        tokio::pin!(send);
        // Its connection's only stream is taken: the request waits inside h2 for it.
        let early = tokio::time::timeout(Duration::from_millis(300), &mut send).await;
        assert!(early.is_err(), "answered while the only stream was taken");
        go.send(()).unwrap();
        send.await
    };
    let (first, second) = tokio::join!(h.send(chat_request(&[], false)), waiting);
    (h, [first, second], connections)
}

/// A request waiting on its HTTP/2 connection for a stream (the provider's limit reached)
/// when the provider closes that connection gracefully was never answered, and hyper cancels
/// it at once ("dispatch task is gone", audit Z1): like one the GOAWAY left out, it is sent
/// again on a new connection, and the client sees only the answer.
#[tokio::test]
async fn a_request_waiting_for_a_stream_when_the_connection_goes_away_is_sent_again() {
    let (h, answers, connections) = waiting_behind_goaway(chat_request(&[], false)).await;
    for (resp, _c) in answers {
        if resp.status() != 200 {
            panic!("{}: {}", resp.status(), json_body(resp).await);
        }
        let read = read_body(resp.into_body()).await;
        assert_eq!((read.text().as_str(), read.error), (ANSWER, None));
    }
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
    let refused = "hourglass_retries_total{reason=\"refused\",route=\"chat\",upstream=\"fake\"}";
    assert_eq!(h.metric(refused).await, 1.0);
}

/// The same wait for a request without a body is not sent again: its HEADERS frame carries
/// the whole request (END_STREAM), and h2 may have opened its stream in the very poll that
/// read the GOAWAY, so the upstream may have it (audit BB: a cancel ran twice). The client
/// is told in words, and no second connection is opened for it.
#[tokio::test]
async fn a_request_without_a_body_waiting_for_a_stream_is_not_sent_again() {
    let get = Request::get("/v1/chat/completions")
        .header("host", "gateway")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (h, [(first, _c1), (second, _c2)], connections) = waiting_behind_goaway(get).await;
    assert_eq!(first.status(), 200);
    read_body(first.into_body()).await;
    assert_eq!(second.status(), 502);
    let body = json_body(second).await;
    assert_eq!(body["error"]["code"], "upstream_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("closed its HTTP/2 connection (GOAWAY)")
            && message
                .ends_with("it may have reached the upstream whole, so it was not sent again"),
        "{message}"
    );
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
    let metrics = crate::support::admin_get(h.gw.admin_addr, "/metrics").await;
    // (`hourglass_upstream_connect_errors_total` has a `refused` series of its own, at 0.)
    assert!(
        !metrics.contains("hourglass_retries_total{reason=\"refused\""),
        "{metrics}"
    );
}

/// An h2 server that takes one stream at a time on each connection and answers only once it
/// has taken `together` requests, over any connections. Returns its address, the count of
/// connections and that of requests taken.
async fn one_stream_per_connection(
    together: usize,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tokio::sync::watch::Receiver<usize>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = connections.clone();
    let (taken, taken_rx) = tokio::sync::watch::channel(0usize);
    let watch = taken_rx.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (taken, mut all) = (taken.clone(), watch.clone());
            tokio::spawn(async move {
                let mut conn = h2::server::Builder::new()
                    .max_concurrent_streams(1)
                    .handshake::<_, Bytes>(s)
                    .await
                    .unwrap();
                while let Some(Ok((_req, mut respond))) = conn.accept().await {
                    taken.send_modify(|n| *n += 1);
                    let mut all = all.clone();
                    tokio::spawn(async move {
                        let _ = all.wait_for(|n| *n >= together).await;
                        let head = Response::builder()
                            .header("content-type", "application/json")
                            .body(())
                            .unwrap();
                        let mut body = respond.send_response(head, false).unwrap();
                        body.send_data(Bytes::from_static(ANSWER.as_bytes()), true)
                            .unwrap();
                    });
                }
                let _ = all.changed().await;
            });
        }
    });
    (addr, connections, taken_rx)
}

/// A provider that takes fewer streams per connection than the gateway's
/// `http2_max_streams_per_connection` (100 by default) says so in its SETTINGS: the gateway
/// opens another connection for the stream past it rather than queue it on the full one,
/// where a GOAWAY would lose it (audit Z2).
#[tokio::test]
async fn a_provider_s_lower_stream_limit_opens_another_connection() {
    let (up, connections, mut taken) = one_stream_per_connection(2).await;
    let h = gateway_to(up).await;
    let second = async {
        taken.wait_for(|n| *n >= 1).await.unwrap();
        // The first connection's SETTINGS came before its first stream was taken; a moment
        // more for the gateway to have read them.
        tokio::time::sleep(Duration::from_millis(100)).await;
        h.send(chat_request(&[], false)).await
    };
    let both = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(h.send(chat_request(&[], false)), second)
    })
    .await;
    let ((first, _c1), (second, _c2)) =
        both.expect("the second request waited behind the first on its connection");
    for resp in [first, second] {
        assert_eq!(resp.status(), 200);
        let read = read_body(resp.into_body()).await;
        assert_eq!((read.text().as_str(), read.error), (ANSWER, None));
    }
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// Audit MC 4: an h2c upstream that announces a stream window of 0 and never opens it. A
/// request body of one piece waits in h2 for window the upstream never gives: it is not
/// sent, so no first-token clock runs for it. Audit NA 1: but an upstream that takes none of
/// the body for the route's first-token limit is stalled: the attempt fails then, against
/// the upstream's health, and the fallback answers. (It waited the whole budget, 504.)
#[tokio::test]
async fn a_body_the_upstream_takes_none_of_is_a_stall_and_falls_back() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut conn = h2::server::Builder::new()
                    .initial_window_size(0)
                    .handshake::<_, Bytes>(s)
                    .await
                    .unwrap();
                let mut held = Vec::new();
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    if req.method() == http::Method::HEAD {
                        let head = Response::builder().status(200).body(()).unwrap();
                        respond.send_response(head, true).unwrap();
                    } else {
                        // Never answered, and its body never given window.
                        held.push((req, respond));
                    }
                }
            });
        }
    });
    let toml = config("")
        .replace(
            "first_token_timeout = \"20s\"",
            "first_token_timeout = \"300ms\"",
        )
        .replace(
            "url = \"{FAKE}\"\nhttp2",
            &format!("url = \"http://{up}\"\nhttp2"),
        )
        .replace(
            "upstream = \"fake\"\n",
            "upstream = \"fake\"\nfallbacks = [\"backup\"]\n",
        )
        .replacen(
            "[[routes]]",
            "[upstreams.backup]\nurl = \"{FAKE}\"\nauth = \"none\"\n\n[[routes]]",
            1,
        );
    let h = Harness::with_config(&toml).await;
    // The first request has the upstream's SETTINGS read (a window of 0) before the next.
    let head = Request::head("/v1/chat/completions")
        .header("host", "gateway")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (resp, _c) = h.send(head).await;
    assert_eq!(resp.status(), 200);
    let (resp, _c) = h
        .send(chat_request(&[("x-request-budget-ms", "1500")], true))
        .await;
    assert_eq!(resp.status(), 200, "the fallback answers");
    read_body(resp.into_body()).await;
    assert_eq!(h.fake.requests().len(), 1);
    let view: serde_json::Value =
        serde_json::from_str(&admin_get(h.gw.admin_addr, "/upstreams").await).unwrap();
    let primary = view["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "fake")
        .unwrap()
        .clone();
    assert_eq!(primary["failures_in_a_row"], 1, "{view}");
}
