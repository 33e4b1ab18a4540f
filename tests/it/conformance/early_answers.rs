//! Answers made before a request's body was read: they say the connection closes, and the
//! connection lingers to read the rest (HTTP/1.1 half-close, HTTP/2 reading instead of a
//! reset) so that the client's buffers keep the answer (RFC 9112 9.6, 9.3).

use super::*;

/// An answer made before the request's body was read says `connection: close`: hyper does
/// not read the rest of it and closes the connection after the answer, and a client that
/// sent its next request on that connection in the meantime would lose it (RFC 9112 9.6,
/// 9.3). An answer made once the body was read leaves the connection open for the next.
#[tokio::test]
async fn an_answer_made_before_the_body_was_read_says_the_connection_closes() {
    let h = Harness::start().await;
    let head = |path: &str, extra: &str, length: usize| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
             {extra}content-length: {length}\r\n\r\n{}",
            "x".repeat(1000)
        )
        .into_bytes()
    };
    let ended = |got: &[u8]| got.windows(4).any(|w| w == b"}\n\r\n") || got.ends_with(b"}");
    for (raw, status) in [
        (head("/nope", "", 1_000_000), "HTTP/1.1 404 "),
        (
            head(
                "/v1/chat/completions",
                "x-request-budget-ms: abc\r\n",
                1_000_000,
            ),
            "HTTP/1.1 400 ",
        ),
        (
            head(
                "/v1/chat/completions",
                "x-request-budget-ms: 1\r\n",
                1_000_000,
            ),
            "HTTP/1.1 504 ",
        ),
        (
            head("/v1/chat/completions", "", 100_000_000),
            "HTTP/1.1 413 ",
        ),
    ] {
        let (text, closed) = raw_exchange(h.addr(), &raw, |_| false).await;
        assert!(text.starts_with(status), "{text}");
        let (answer_head, _) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            answer_head
                .to_ascii_lowercase()
                .contains("\r\nconnection: close"),
            "{answer_head}"
        );
        assert!(closed, "closed after the answer: {text}");
    }
    // Read whole, then refused: the connection carries the next request.
    let bad = "{not json";
    let mut raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{bad}",
        bad.len()
    )
    .into_bytes();
    raw.extend_from_slice(&chat_bytes("HTTP/1.1"));
    let two = |got: &[u8]| {
        let text = String::from_utf8_lossy(got);
        text.matches("HTTP/1.1 ").count() == 2 && ended(got)
    };
    let (text, _) = raw_exchange(h.addr(), &raw, two).await;
    assert!(text.starts_with("HTTP/1.1 400 "), "{text}");
    assert!(
        !text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    assert!(text.contains("HTTP/1.1 200 OK"), "the next request: {text}");
}

/// RFC 9112 9.6: a server that closes with part of a request body still on its way keeps
/// reading for a while before it closes, or the reset its close sends when bytes arrive
/// erases the answer in the client's buffers. A front proxy writing the rest of the body
/// (nginx with `proxy_request_buffering off`) got EPIPE and answered its own 502 in 75 to 98
/// of 100 early error answers. The gateway now half-closes and reads the rest.
#[tokio::test]
async fn an_early_answer_is_followed_by_a_lingering_close() {
    let h = Harness::start().await;
    let size = 2 << 20;
    let mut s = TcpStream::connect(h.addr()).await.unwrap();
    s.write_all(
        format!(
            "POST /nowhere HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {size}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let chunk = vec![b' '; 64 << 10];
    s.write_all(&chunk).await.unwrap();
    // The answer comes before the body is read.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\"no_route\"") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("an answer")
            .expect("readable");
        assert!(n > 0, "closed before the answer");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 404"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The rest of the body is taken, not refused with a reset.
    let mut sent = chunk.len();
    while sent < size {
        s.write_all(&chunk)
            .await
            .unwrap_or_else(|e| panic!("after {sent} bytes: {e}"));
        sent += chunk.len();
    }
    // And the gateway's close is a FIN, once it has read what came.
    s.shutdown().await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("closed")
        .expect("a clean close");
    assert_eq!(n, 0);
}

/// Audit GC1: over HTTP/2 an answer made before the request body was read (404, an invalid
/// budget's 400) was followed at once by RST_STREAM(NO_ERROR) while the client was still
/// sending: RFC 9113 8.1 allows it, but curl 7.88 took it as a stream error and lost the
/// answer in 13 of 20 tries. The gateway now reads on what the client sends, as an HTTP/1
/// connection lingers, and the stream ends with both sides' END_STREAM.
#[tokio::test]
async fn an_h2_early_answer_reads_the_rest_of_the_body_instead_of_a_reset() {
    let h = Harness::start().await;
    for (path, budget, status) in [
        ("/nowhere", "60000", 404),
        ("/v1/chat/completions", "abc", 400),
    ] {
        let tcp = TcpStream::connect(h.addr()).await.unwrap();
        let (mut client, mut conn) = h2::client::handshake(tcp).await.unwrap();
        let mut ping = conn.ping_pong().expect("the connection's ping");
        tokio::spawn(conn);
        let req = http::Request::post(format!("http://{}{path}", h.addr()))
            .header("content-type", "application/json")
            .header("x-request-budget-ms", budget)
            .body(())
            .unwrap();
        let (response, mut send) = client.send_request(req, false).unwrap();
        // The head alone: the answer comes before any of the body.
        let response = response.await.unwrap();
        assert_eq!(response.status(), status, "{path}");
        let mut body = response.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.expect("the answer whole");
            body.flow_control().release_capacity(chunk.len()).unwrap();
            got.extend_from_slice(&chunk);
        }
        let error: serde_json::Value = serde_json::from_slice(&got).expect("the JSON error");
        assert!(error["error"]["code"].is_string(), "{error}");
        // A round trip after the answer: a reset sent with it has come by now.
        ping.ping(h2::Ping::opaque()).await.unwrap();
        let reset = std::future::poll_fn(|cx| std::task::Poll::Ready(send.poll_reset(cx))).await;
        assert!(
            reset.is_pending(),
            "{path}: reset after the answer: {reset:?}"
        );
        // Three times the stream's initial window: it gets through only as the gateway reads.
        let mut left = 3 * 65_535;
        while left > 0 {
            send.reserve_capacity(left);
            let room = tokio::time::timeout(
                Duration::from_secs(5),
                std::future::poll_fn(|cx| send.poll_capacity(cx)),
            )
            .await
            .unwrap_or_else(|_| panic!("{path}: no window with {left} bytes to send"))
            .unwrap_or_else(|| panic!("{path}: the stream ended with {left} bytes to send"))
            .unwrap_or_else(|e| panic!("{path}: {e} with {left} bytes to send"));
            let n = room.min(left);
            send.send_data(vec![b' '; n].into(), n == left).unwrap();
            left -= n;
        }
        ping.ping(h2::Ping::opaque()).await.unwrap();
        let reset = std::future::poll_fn(|cx| std::task::Poll::Ready(send.poll_reset(cx))).await;
        assert!(
            reset.is_pending(),
            "{path}: reset after the body: {reset:?}"
        );
    }
}

/// Audit HB1: the lingering reads of one HTTP/2 connection took every process-wide slot
/// (1,024 trickling streams on 4 connections), and every other client's early answer was
/// reset again. A connection now lingers on at most 8 bodies at once; past that its streams
/// are reset at once, as before.
#[tokio::test]
async fn one_h2_connection_lingers_on_at_most_eight_bodies() {
    let h = Harness::start().await;
    let tcp = TcpStream::connect(h.addr()).await.unwrap();
    let (mut client, mut conn) = h2::client::handshake(tcp).await.unwrap();
    let mut ping = conn.ping_pong().expect("the connection's ping");
    tokio::spawn(conn);
    let mut sends = Vec::new();
    for _ in 0..12 {
        let req = http::Request::post(format!("http://{}/nowhere", h.addr()))
            .header("content-type", "application/json")
            .body(())
            .unwrap();
        let (response, send) = client.send_request(req, false).unwrap();
        let response = response.await.unwrap();
        assert_eq!(response.status(), 404);
        sends.push(send);
        // A byte on each stream still open, so that none goes quiet while the others start.
        for send in &mut sends {
            let _ = send.send_data(bytes::Bytes::from_static(b" "), false);
        }
    }
    // A round trip after the last answer: a reset sent with it has come by now.
    ping.ping(h2::Ping::opaque()).await.unwrap();
    let mut reset = Vec::new();
    for send in &mut sends {
        let r = std::future::poll_fn(|cx| std::task::Poll::Ready(send.poll_reset(cx))).await;
        reset.push(r.is_ready());
    }
    let expected: Vec<bool> = (0..12).map(|i| i >= 8).collect();
    assert_eq!(reset, expected, "which streams were reset");
}

/// A lingering socket does not hold a `max_connections` slot: with one slot, a client that
/// got its early answer and keeps its connection open (lingering for up to 2 s of quiet)
/// does not keep the next client waiting.
#[tokio::test]
async fn a_lingering_connection_leaves_its_slot_free() {
    let h =
        Harness::with_config(&BASE.replace("[server]\n", "[server]\nmax_connections = 1\n")).await;
    let mut a = TcpStream::connect(h.addr()).await.unwrap();
    a.write_all(b"POST /nowhere HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n{")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\"no_route\"") {
        let n = a.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    // The gateway has closed its side, and lingers reading what `a` may still send.
    let n = a.read(&mut buf).await.unwrap();
    assert_eq!(n, 0, "the answer is followed by the gateway's FIN");
    // Well within `a`'s 2 s of quiet lingering: had it kept the slot, the next connection
    // would not be accepted before that ends.
    let (resp, _c) = tokio::time::timeout(Duration::from_secs(1), h.send(chat_request(&[], false)))
        .await
        .expect("served while the other connection lingers");
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    // `a` is still being read from: served while it lingered.
    a.write_all(b"more of the body").await.unwrap();
}

/// A client that half-closes before its body is whole has left as far as the request goes
/// (logged `client_closed`, no status); what it may still read says so like every answer:
/// with the request id, and `connection: close`, since nothing more comes on it.
#[tokio::test]
async fn a_body_cut_by_a_half_close_is_answered_with_its_request_id() {
    let h = Harness::start().await;
    let mut s = TcpStream::connect(h.addr()).await.unwrap();
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-type: application/json\r\n\
          x-request-id: cut-body-1\r\ncontent-length: 100\r\n\r\n{\"model\":\"m\",",
    )
    .await
    .unwrap();
    s.shutdown().await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
        .await
        .expect("the connection ends")
        .unwrap();
    let text = String::from_utf8_lossy(&got).to_lowercase();
    if !text.is_empty() {
        assert!(text.contains("x-request-id: cut-body-1"), "{text}");
        assert!(text.contains("connection: close"), "{text}");
        assert!(text.contains("\"code\":\"client_closed\""), "{text}");
    }
    h.wait_requests("chat", 1.0).await;
    assert!(h.fake.requests().is_empty());
}
