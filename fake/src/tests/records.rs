//! What the fake records, and how soon it notices a peer that left (HTTP/1 close, reset and
//! half-close, HTTP/2 resets), which the gateway's cancellation tests rely on.

use super::*;

#[tokio::test]
async fn requests_and_connections_are_recorded() {
    let fake = fake().await;
    let client = h1();
    let headers = [("x-request-id", "abc"), ("x-fake-interval-ms", "1")];
    let response = client
        .request(post(&fake, "/v1/chat/completions?trace=1", CHAT, &headers))
        .await
        .unwrap();
    text_of(response).await;
    assert!(fake.wait_for_requests(1, PATIENCE).await);
    assert!(!fake.wait_for_requests(2, Duration::from_millis(50)).await);
    let request = &fake.requests()[0];
    assert_eq!(request.method, Method::POST);
    assert_eq!(request.path, "/v1/chat/completions?trace=1");
    assert_eq!(request.headers["x-request-id"], "abc");
    assert_eq!(request.body, CHAT.as_bytes());
    assert_eq!(request.version, Version::HTTP_11);
    assert_eq!(request.conn_id, 0);
    let connections = fake.connections();
    assert_eq!(connections.len(), 1);
    assert!(connections[0].peer.ip().is_loopback());
    assert!(connections[0].opened_at <= request.at);
    assert_eq!(fake.open_connections(), 1);
    drop(client);
    assert!(fake.wait_closed(0, PATIENCE).await.is_some());
    assert!(fake.wait_open_connections(0, PATIENCE).await);
}

#[tokio::test]
async fn shutdown_closes_everything() {
    let fake = fake().await;
    let _frozen = raw_post(&fake, &[("x-fake-freeze-after", "0")]).await;
    assert!(fake.wait_for_requests(1, PATIENCE).await);
    fake.shutdown();
    assert!(fake.wait_open_connections(0, PATIENCE).await);
    assert!(fake.wait_request_finished(0, PATIENCE).await.is_some());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(TcpStream::connect(fake.addr()).await.is_err());
}

#[tokio::test]
async fn h1_close_noticed_while_body_frozen() {
    let fake = fake().await;
    let mut stream = raw_post(
        &fake,
        &[("x-fake-freeze-after", "1"), ("x-fake-interval-ms", "5")],
    )
    .await;
    read_until(&mut stream, "tok1 ").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let closed_by_client = Instant::now();
    drop(stream);
    assert_noticed_promptly(&fake, closed_by_client).await;
}

#[tokio::test]
async fn h1_reset_noticed_while_body_frozen() {
    let fake = fake().await;
    let mut stream = raw_post(
        &fake,
        &[("x-fake-freeze-after", "1"), ("x-fake-interval-ms", "5")],
    )
    .await;
    read_until(&mut stream, "tok1 ").await;
    stream.set_zero_linger().unwrap();
    let closed_by_client = Instant::now();
    drop(stream);
    assert_noticed_promptly(&fake, closed_by_client).await;
}

/// hyper's default `half_close(false)` takes a client's FIN as "gone" even though the client
/// could still read; the gateway's server side behaves the same.
#[tokio::test]
async fn h1_half_close_counts_as_gone() {
    let fake = fake().await;
    let mut stream = raw_post(
        &fake,
        &[("x-fake-freeze-after", "1"), ("x-fake-interval-ms", "5")],
    )
    .await;
    read_until(&mut stream, "tok1 ").await;
    let closed_by_client = Instant::now();
    stream.shutdown().await.unwrap();
    assert_noticed_promptly(&fake, closed_by_client).await;
}

#[tokio::test]
async fn h1_close_noticed_during_headers_first_wait() {
    let fake = fake().await;
    let mut stream = raw_post(
        &fake,
        &[("x-fake-headers-first", "1"), ("x-fake-ttft-ms", "10000")],
    )
    .await;
    let head = read_until(&mut stream, "\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let closed_by_client = Instant::now();
    drop(stream);
    assert_noticed_promptly(&fake, closed_by_client).await;
}

#[tokio::test]
async fn h1_close_noticed_before_the_head() {
    let fake = fake().await;
    let stream = raw_post(&fake, &[("x-fake-ttft-ms", "10000")]).await;
    assert!(fake.wait_for_requests(1, PATIENCE).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let closed_by_client = Instant::now();
    drop(stream);
    assert_noticed_promptly(&fake, closed_by_client).await;
}

#[tokio::test]
async fn h2_reset_ends_a_frozen_body() {
    let fake = fake().await;
    let client = h2();
    let headers = [("x-fake-freeze-after", "1"), ("x-fake-interval-ms", "5")];
    let response = client
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    assert_eq!(response.version(), Version::HTTP_2);
    let mut body = response.into_body();
    let text: String = frames_until_quiet(&mut body, Duration::from_millis(100))
        .await
        .into_iter()
        .map(|f| f.1)
        .collect();
    assert!(text.contains("tok1 "));
    let dropped = Instant::now();
    drop(body);
    let request = fake
        .wait_request_finished(0, PATIENCE)
        .await
        .expect("body never dropped");
    assert!(!request.completed);
    assert_eq!(request.version, Version::HTTP_2);
    let lag = request
        .finished_at
        .unwrap()
        .saturating_duration_since(dropped);
    assert!(lag < PROMPT, "dropped after {lag:?}");
    // Only the stream was reset; the connection lives on until the client goes.
    assert_eq!(fake.open_connections(), 1);
    drop(client);
    assert!(fake.wait_open_connections(0, PATIENCE).await);
}

#[tokio::test]
async fn h2_reset_ends_a_pending_head() {
    let fake = fake().await;
    let client = h2();
    let pending = tokio::spawn(client.request(post(
        &fake,
        "/v1/chat/completions",
        CHAT,
        &[("x-fake-ttft-ms", "10000")],
    )));
    assert!(fake.wait_for_requests(1, PATIENCE).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let dropped = Instant::now();
    pending.abort();
    let request = fake
        .wait_request_finished(0, PATIENCE)
        .await
        .expect("service future never dropped");
    let lag = request
        .finished_at
        .unwrap()
        .saturating_duration_since(dropped);
    assert!(lag < PROMPT, "dropped after {lag:?}");
    assert_eq!(fake.open_connections(), 1);
}

#[tokio::test]
async fn many_concurrent_h2_streams() {
    let fake = fake().await;
    let client = h2();
    let headers = [
        ("x-fake-chunks", "3"),
        ("x-fake-interval-ms", "20"),
        ("x-fake-ttft-ms", "20"),
    ];
    let started = Instant::now();
    let streams = (0..2000).map(|_| {
        let request = client.request(post(&fake, "/v1/chat/completions", CHAT, &headers));
        async move { text_of(request.await.unwrap()).await }
    });
    let bodies = futures_join_all(streams).await;
    assert!(bodies.iter().all(|b| b.ends_with("data: [DONE]\n\n")));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(fake.requests().iter().all(|r| r.completed));
    assert_eq!(fake.connections().len(), 1);
}

/// `futures` is not a dependency; a JoinSet does the same for 'static futures.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<String>
where
    F: Future<Output = String> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for future in futures {
        set.spawn(future);
    }
    let mut out = Vec::new();
    while let Some(result) = set.join_next().await {
        out.push(result.unwrap());
    }
    out
}

#[tokio::test]
async fn never_accepting_listener_hangs_connects() {
    let (_guard, addr) = never_accepting_listener().unwrap();
    let attempt = tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await;
    assert!(attempt.is_err(), "connect finished: {attempt:?}");
}

/// The `fake-upstream` command and the demo run for as long as an operator likes: they
/// remember nothing, where every request was kept for good (audit U: 7 KB a request, 150 MB
/// after 20,000). Its answers are the same.
#[tokio::test]
async fn an_unrecorded_fake_answers_and_keeps_nothing() {
    let fake = FakeUpstream::start_unrecorded("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    for _ in 0..3 {
        let response = h1()
            .request(post(&fake, "/v1/chat/completions", CHAT, &[]))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(text_of(response).await.contains("[DONE]"));
    }
    assert!(fake.requests().is_empty());
    assert!(fake.connections().is_empty());
}
