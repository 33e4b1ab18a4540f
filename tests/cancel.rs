//! A client that goes away cancels the upstream call at once, whatever phase it is in, even
//! while the upstream is silent.

mod support;

use std::time::Duration;

use support::*;
use tokio::time::Instant;

const PROMPT: Duration = Duration::from_millis(100);

async fn assert_client_cancel_counted(h: &Harness) {
    h.wait_requests("chat", 1.0).await;
    let v = h
        .metric("hourglass_cancellations_total{origin=\"client\",route=\"chat\"}")
        .await;
    assert_eq!(v, 1.0);
    let inflight = h
        .metric("hourglass_upstream_requests_in_flight{upstream=\"fake\"}")
        .await;
    assert_eq!(inflight, 0.0);
}

#[tokio::test]
async fn client_leaves_mid_stream_while_upstream_is_frozen() {
    let h = Harness::start().await;
    let (resp, conn) = h
        .chat(&[("x-fake-freeze-after", "2"), ("x-fake-interval-ms", "5")])
        .await;
    let mut body = resp.into_body();
    let text = read_events(&mut body, 3).await;
    assert!(text.contains("tok2"), "{text}");
    // The upstream is now frozen: nothing flows in either direction.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let left = Instant::now();
    drop(body);
    conn.close();
    let delay = upstream_close_delay(&h.fake, left).await;
    eprintln!("mid-stream, frozen upstream: upstream closed {delay:?} after the client left");
    assert!(
        delay < PROMPT,
        "upstream closed {delay:?} after the client left"
    );
    assert_client_cancel_counted(&h).await;
}

#[tokio::test]
async fn client_leaves_mid_stream_while_tokens_flow() {
    let h = Harness::start().await;
    let (resp, conn) = h
        .chat(&[("x-fake-chunks", "100000"), ("x-fake-interval-ms", "2")])
        .await;
    let mut body = resp.into_body();
    read_events(&mut body, 10).await;
    let left = Instant::now();
    drop(body);
    conn.close();
    let delay = upstream_close_delay(&h.fake, left).await;
    eprintln!("mid-stream, tokens flowing: upstream closed {delay:?} after the client left");
    assert!(delay < PROMPT, "{delay:?}");
    assert_client_cancel_counted(&h).await;
}

#[tokio::test]
async fn client_leaves_while_waiting_for_the_first_token() {
    let h = Harness::start().await;
    let (resp, conn) = h
        .chat(&[("x-fake-ttft-ms", "1500"), ("x-fake-headers-first", "1")])
        .await;
    assert_eq!(resp.status(), 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let left = Instant::now();
    drop(resp);
    conn.close();
    let delay = upstream_close_delay(&h.fake, left).await;
    eprintln!("waiting for the first token: upstream closed {delay:?} after the client left");
    assert!(delay < PROMPT, "{delay:?}");
    assert_client_cancel_counted(&h).await;
}

#[tokio::test]
async fn client_leaves_before_the_response_head() {
    let h = Harness::start().await;
    let conn = Conn::open(h.addr()).await;
    let req = chat_request(&[("x-fake-ttft-ms", "1500")], true);
    let pending = tokio::spawn(async move {
        let _ = conn.send(req).await;
    });
    assert!(h.fake.wait_for_requests(1, Duration::from_secs(2)).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let left = Instant::now();
    pending.abort();
    let _ = pending.await;
    let delay = upstream_close_delay(&h.fake, left).await;
    eprintln!("before the head: upstream closed {delay:?} after the client left");
    assert!(delay < PROMPT, "{delay:?}");
    assert_client_cancel_counted(&h).await;
}
