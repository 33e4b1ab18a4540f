//! Graceful shutdown: streams finish within the drain and the rest are cut with an event,
//! idle and lingering connections do not hold it up, and a second signal cuts at once.

use super::*;

#[tokio::test]
async fn shutdown_lets_streams_finish_then_cuts_the_rest_with_an_event() {
    let h = Harness::with_config(
        &BASE
            .replace("[server]\n", "[server]\nshutdown_grace = \"2s\"\n")
            .replace("idle_timeout = \"1s\"", "idle_timeout = \"20s\""),
    )
    .await;
    let (short, c1) = h
        .chat(&[("x-fake-chunks", "10"), ("x-fake-interval-ms", "30")])
        .await;
    let (frozen, c2) = h.chat(&[("x-fake-freeze-after", "1")]).await;
    let short = tokio::spawn(async move { (read_body(short.into_body()).await, c1) });
    let frozen = tokio::spawn(async move { (read_body(frozen.into_body()).await, c2) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let admin = h.gw.admin_addr;
    let addr = h.gw.addr;
    let start = Instant::now();
    let Harness { gw, fake } = h;
    let metrics = gw.metrics.clone();
    let health = gw.health.clone();
    let stopping = tokio::spawn(gw.shutdown());
    // Draining: /readyz turns 503 and new connections are refused (waited for, not slept:
    // the shutdown task may be slow to run on a busy machine).
    let deadline = Instant::now() + Duration::from_secs(5);
    while health.is_ready() || TcpStream::connect(addr).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "still ready or accepting 5 s after shutdown began"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (short, _) = short.await.unwrap();
    assert!(
        short.text().ends_with("data: [DONE]\n\n"),
        "the stream within grace finished"
    );
    let (frozen, _) = frozen.await.unwrap();
    let cut_at = start.elapsed();
    assert_eq!(
        frozen.error_event().expect("an error event")["code"],
        "shutdown"
    );
    assert!(
        // Cut by the 2 s grace, not by anything else (idle is 20 s, the budget 10 s).
        cut_at >= Duration::from_secs(2) && cut_at < Duration::from_secs(8),
        "{cut_at:?}"
    );
    stopping.await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(9),
        "shutdown returned"
    );
    let text = metrics.encode();
    assert!(
        text.contains("hourglass_cancellations_total{origin=\"shutdown\",route=\"chat\"} 1"),
        "{text}"
    );
    assert!(text.contains("hourglass_requests_total{outcome=\"ok\",route=\"chat\"} 1"));
    let _ = (admin, fake);
}

/// A connection that has sent nothing (a load balancer's TCP probe, a client's pool opened
/// ahead) is no request in flight: a drain closes it at once, over cleartext and before a
/// TLS handshake, instead of waiting out the grace or the header-read timeout (both 60 s).
#[tokio::test]
async fn shutdown_does_not_wait_for_connections_that_sent_nothing() {
    for tls in [false, true] {
        let c = certs("silent-conns");
        let toml = if tls {
            tls_config_toml(&c, false)
        } else {
            BASE.to_owned()
        };
        let h = Harness::with_config(&toml.replace(
            "[server]\n",
            "[server]\nshutdown_grace = \"60s\"\nheader_read_timeout = \"60s\"\n",
        ))
        .await;
        let mut silent = Vec::new();
        for _ in 0..3 {
            silent.push(TcpStream::connect(h.gw.addr).await.unwrap());
        }
        // The connections are accepted before the drain begins.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Harness { gw, fake } = h;
        tokio::time::timeout(Duration::from_secs(20), gw.shutdown())
            .await
            .unwrap_or_else(|_| panic!("tls {tls}: shutdown waited for silent connections"));
        for mut s in silent {
            let mut buf = [0u8; 1];
            let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
                .await
                .expect("closed")
                .unwrap_or(0);
            assert_eq!(n, 0, "tls {tls}: closed without a word");
        }
        drop(fake);
    }
}

/// An HTTP/2 connection with no stream open is no request in flight either: one whose client
/// never finishes the drain's graceful close (it sent only the preface, or over TLS chose `h2`
/// and then nothing, so it acknowledges no PING) is dropped a `header_read_timeout` into the
/// drain, instead of holding the shutdown for its whole grace (a minute here: the 20 s wait
/// is a hang's limit, not a measure).
#[tokio::test]
async fn shutdown_does_not_wait_for_an_http2_connection_that_never_finishes_the_close() {
    for tls in [false, true] {
        let c = certs("h2-silent-conns");
        let toml = if tls {
            tls_config_toml(&c, false)
        } else {
            BASE.to_owned()
        };
        let h = Harness::with_config(&toml.replace(
            "[server]\n",
            "[server]\nshutdown_grace = \"60s\"\nheader_read_timeout = \"1s\"\n",
        ))
        .await;
        let mut conn: Box<dyn tokio::io::AsyncRead + Unpin> = if tls {
            Box::new(tls_client(h.gw.addr, &c, b"h2", false).await.unwrap())
        } else {
            let mut s = TcpStream::connect(h.gw.addr).await.unwrap();
            s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                .await
                .unwrap();
            Box::new(s)
        };
        // Taken for HTTP/2 before the drain begins.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Harness { gw, fake } = h;
        tokio::time::timeout(Duration::from_secs(20), gw.shutdown())
            .await
            .unwrap_or_else(|_| panic!("tls {tls}: shutdown waited for an idle h2 connection"));
        // Closed: whatever the server wrote (its SETTINGS, the GOAWAY), then the end.
        let mut buf = [0u8; 1024];
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            while let Ok(1..) = conn.read(&mut buf).await {}
        })
        .await;
        assert!(ended.is_ok(), "tls {tls}: the connection is closed");
        drop(fake);
    }
}

/// Audit HB2: an HTTP/2 request body read on after its early answer (lingering up to 30 s
/// while the client trickles) held the shutdown for the whole grace, with no request in
/// flight. Lingering reads end when the server drains (a minute of grace and of header-read
/// timeout here: the 20 s wait is a hang's limit, not a measure).
#[tokio::test]
async fn shutdown_does_not_wait_for_a_lingering_http2_body() {
    let h = Harness::with_config(&BASE.replace(
        "[server]\n",
        "[server]\nshutdown_grace = \"60s\"\nheader_read_timeout = \"60s\"\n",
    ))
    .await;
    let tcp = TcpStream::connect(h.gw.addr).await.unwrap();
    let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::post(format!("http://{}/nowhere", h.gw.addr))
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (response, mut send) = client.send_request(req, false).unwrap();
    assert_eq!(response.await.unwrap().status(), 404);
    // The rest of the body, a byte every 100 ms, for as long as the stream takes it.
    let trickle = tokio::spawn(async move {
        loop {
            if send.send_data(Bytes::from_static(b" "), false).is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let reset =
                std::future::poll_fn(|cx| std::task::Poll::Ready(send.poll_reset(cx))).await;
            if reset.is_ready() {
                return;
            }
        }
    });
    // Lingering by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!trickle.is_finished(), "the body was read on");
    let Harness { gw, fake } = h;
    tokio::time::timeout(Duration::from_secs(20), gw.shutdown())
        .await
        .expect("shutdown waited for a lingering body");
    tokio::time::timeout(Duration::from_secs(5), trickle)
        .await
        .expect("the stream ended")
        .unwrap();
    drop((client, conn, fake));
}

/// An idle keep-alive HTTP/1 connection is closed as soon as the server drains, and one with
/// a request in flight gets its answer first and then is closed, so shutdown waits for
/// neither for its grace (one minute here: the 5 s waits below are a hang's limit, not a
/// measure).
#[tokio::test]
async fn draining_closes_idle_keep_alive_connections_and_lets_the_busy_one_answer_first() {
    // Nor does the idle connection end by the header-read limit (one minute too).
    let h = Harness::with_config(&BASE.replace(
        "[server]\n",
        "[server]\nshutdown_grace = \"60s\"\nheader_read_timeout = \"60s\"\n",
    ))
    .await;
    let mut idle = TcpStream::connect(h.gw.addr).await.unwrap();
    let request = |extra: &str| {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    idle.write_all(request("").as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 16 * 1024];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    // One whose answer takes 300 ms, asked before the drain and answered after it.
    let mut busy = TcpStream::connect(h.gw.addr).await.unwrap();
    busy.write_all(request("x-fake-ttft-ms: 300\r\n").as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let Harness { gw, fake } = h;
    let start = Instant::now();
    let stopping = tokio::spawn(gw.shutdown());
    // The idle connection ends without another byte.
    let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf))
        .await
        .expect("the idle connection is closed at the drain")
        .unwrap();
    assert_eq!(n, 0, "{}", String::from_utf8_lossy(&buf[..n]));
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), busy.read_to_end(&mut answer))
        .await
        .expect("the busy connection is closed after its answer")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("chat.completion"), "{answer}");
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .expect("shutdown does not wait for its grace")
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(30));
    drop(fake);
}

/// A second signal during the drain cuts what is still in flight at once, as the grace's end
/// would (each stream told, origin `shutdown`), instead of being ignored until the grace
/// (here 10 minutes) is over: an operator who presses Ctrl-C twice means it.
#[tokio::test]
async fn a_second_signal_during_the_drain_cuts_at_once() {
    let h = Harness::with_config(
        &BASE
            .replace("[server]\n", "[server]\nshutdown_grace = \"10m\"\n")
            .replace("idle_timeout = \"1s\"", "idle_timeout = \"20s\""),
    )
    .await;
    let (frozen, c) = h.chat(&[("x-fake-freeze-after", "1")]).await;
    let frozen = tokio::spawn(async move { (read_body(frozen.into_body()).await, c) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let Harness { gw, fake: _fake } = h;
    let signals = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let sender = signals.clone();
    let serving = tokio::spawn(gw.serve_until(move || {
        let signals = signals.clone();
        async move {
            signals.acquire().await.expect("open").forget();
        }
    }));
    sender.add_permits(1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!frozen.is_finished(), "the grace is 10 minutes");
    sender.add_permits(1);
    let (frozen, _) = tokio::time::timeout(Duration::from_secs(20), frozen)
        .await
        .expect("cut by the second signal")
        .unwrap();
    assert_eq!(
        frozen.error_event().expect("an error event")["code"],
        "shutdown"
    );
    tokio::time::timeout(Duration::from_secs(20), serving)
        .await
        .expect("shutdown returned")
        .unwrap();
}

/// Audit PD 2: `/readyz` turned 503 at the same instant the client listener closed, so a load
/// balancer polling it always sent some requests to the closed port. With `drain_delay`,
/// `/readyz` is 503 at once while a new connection is still accepted and served; a second
/// signal ends the delay (here ten minutes) at once, and the listener then refuses.
#[tokio::test]
async fn drain_delay_keeps_serving_new_connections_while_readyz_is_503() {
    let h = Harness::with_config(&BASE.replace(
        "[server]\n",
        "[server]\ndrain_delay = \"10m\"\nshutdown_grace = \"10m\"\n",
    ))
    .await;
    let (addr, admin) = (h.gw.addr, h.gw.admin_addr);
    let Harness { gw, fake: _fake } = h;
    let health = gw.health.clone();
    let signals = Arc::new(tokio::sync::Semaphore::new(0));
    let sender = signals.clone();
    let serving = tokio::spawn(gw.serve_until(move || {
        let signals = signals.clone();
        async move {
            signals.acquire().await.expect("open").forget();
        }
    }));
    sender.add_permits(1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while health.is_ready() {
        assert!(
            Instant::now() < deadline,
            "still ready 5 s after the signal"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let readyz = admin_get(admin, "/readyz").await;
    assert!(readyz.starts_with("not ready"), "{readyz}");
    // A connection made after /readyz turned 503 is served in full.
    let conn = Conn::open(addr).await;
    let (resp, _conn) = conn.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    let body = read_body(resp.into_body()).await.text();
    assert!(body.contains("chat.completion"), "{body}");
    assert!(!serving.is_finished(), "the delay is ten minutes");
    // The second signal does not wait out the delay: the listener closes and the shutdown
    // ends (the 20 s bounds a hang, not a measure).
    sender.add_permits(1);
    tokio::time::timeout(Duration::from_secs(20), serving)
        .await
        .expect("shutdown returned without waiting out the delay")
        .unwrap();
    assert!(TcpStream::connect(addr).await.is_err(), "refused after");
}

/// The delay ends on its own: then the listener refuses, and the drain goes on as without it.
#[tokio::test]
async fn drain_delay_ends_on_its_own_and_then_the_listener_refuses() {
    let h =
        Harness::with_config(&BASE.replace("[server]\n", "[server]\ndrain_delay = \"300ms\"\n"))
            .await;
    let addr = h.gw.addr;
    let Harness { gw, fake: _fake } = h;
    let health = gw.health.clone();
    let stopping = tokio::spawn(gw.shutdown());
    let deadline = Instant::now() + Duration::from_secs(10);
    while health.is_ready() || TcpStream::connect(addr).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "still accepting 10 s after the stop"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::timeout(Duration::from_secs(20), stopping)
        .await
        .expect("shutdown returned")
        .unwrap();
}

/// Audit AD 2: a client not reading at the grace's end (its socket buffer full) was not cut
/// there: the watchdog sees the cut only when polled, so its upstream call went on until the
/// connections were closed two seconds later, and it was counted `origin="client"`. Now its
/// upstream goes at the cut, it counts once as `shutdown`, and a client that reads again
/// before its connection is closed gets the `shutdown` event.
#[tokio::test]
async fn a_client_not_reading_at_the_cut_loses_its_upstream_there_and_counts_as_shutdown() {
    let h = Harness::with_config(
        &BASE
            .replace("[server]\n", "[server]\nshutdown_grace = \"1s\"\n")
            .replace("idle_timeout = \"1s\"", "idle_timeout = \"20s\""),
    )
    .await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut client = socket.connect(h.gw.addr).await.unwrap();
    let body = r#"{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-type: application/json\r\n\
         x-fake-chunks: 1000000\r\nx-fake-interval-ms: 0\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(head.as_bytes()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.fake.connections().is_empty() {
        assert!(Instant::now() < deadline, "never sent upstream");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The client reads nothing: the buffers between it and the upstream fill (the gateway's
    // socket buffer grows to a few MB; the fake fills it in about a second).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let Harness { gw, fake } = h;
    let metrics = gw.metrics.clone();
    let stopping = tokio::spawn(gw.shutdown());
    let conn = fake.connections()[0].id;
    fake.wait_closed(conn, Duration::from_secs(10))
        .await
        .expect("the upstream connection was closed");
    // At the cut, not at the connections' close two seconds later: the client's connection
    // is still open, and reading again it gets the event that says why its stream ended.
    assert!(
        !stopping.is_finished(),
        "closed only when the gateway ended"
    );
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got);
    let tail = &text[text.len().saturating_sub(400)..];
    assert!(
        tail.contains("event: error") && tail.contains("\"code\":\"shutdown\""),
        "{tail}"
    );
    stopping.await.unwrap();
    let text = metrics.encode();
    assert!(
        text.contains("hourglass_cancellations_total{origin=\"shutdown\",route=\"chat\"} 1"),
        "{text}"
    );
    assert!(
        !text.contains("hourglass_cancellations_total{origin=\"client\",route=\"chat\"} 1"),
        "{text}"
    );
}
