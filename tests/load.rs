//! Zombies under load: hundreds of clients leave a frozen upstream at once; every upstream
//! call they started is closed promptly, and the gateway keeps serving meanwhile.

#[path = "it/support/mod.rs"]
mod support;

use std::collections::HashSet;
use std::time::Duration;

use support::*;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_abandoned_streams_leave_no_zombies() {
    const N: usize = 500;
    // Limits far beyond the test's length (30 s from the last stream's start at the
    // least): every stream must end by its client leaving, within 5 s on a busy machine.
    let h = Harness::with_config(
        &BASE
            .replace("idle_timeout = \"1s\"", "idle_timeout = \"60s\"")
            .replace("budget = \"10s\"", "budget = \"30s\""),
    )
    .await;
    let mut open = Vec::with_capacity(N);
    for chunk in 0..N / 50 {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..50 {
            let addr = h.addr();
            set.spawn(async move {
                let conn = Conn::open(addr).await;
                let req = chat_request(
                    &[("x-fake-freeze-after", "1"), ("x-fake-interval-ms", "1")],
                    true,
                );
                let (resp, conn) = conn.send(req).await;
                let mut body = resp.into_body();
                read_events(&mut body, 2).await;
                (body, conn)
            });
        }
        while let Some(r) = set.join_next().await {
            open.push(r.unwrap());
        }
        assert_eq!(open.len(), (chunk + 1) * 50);
    }
    assert!(h.fake.wait_for_requests(N, Duration::from_secs(10)).await);
    let frozen: HashSet<u64> = h.fake.requests().iter().map(|r| r.conn_id).collect();
    assert_eq!(frozen.len(), N, "one upstream connection per stream");

    // A healthy request while 500 streams hang.
    let (resp, _c) = h.chat(&[("x-fake-chunks", "3")]).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(read.text().ends_with("data: [DONE]\n\n"));

    let left = Instant::now();
    drop(open);
    let deadline = left + Duration::from_secs(5);
    loop {
        let still_open = h
            .fake
            .connections()
            .iter()
            .filter(|c| frozen.contains(&c.id) && c.closed_at.is_none())
            .count();
        if still_open == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{still_open} upstream connections still open 5 s after the clients left"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let slowest = h
        .fake
        .connections()
        .iter()
        .filter(|c| frozen.contains(&c.id))
        .map(|c| c.closed_at.unwrap().saturating_duration_since(left))
        .max()
        .unwrap();
    eprintln!("500 abandoned streams: last upstream close {slowest:?} after the clients left");
    h.wait_requests("chat", (N + 1) as f64).await;
    assert_eq!(
        h.metric("hourglass_cancellations_total{origin=\"client\",route=\"chat\"}")
            .await,
        N as f64
    );
    assert_eq!(
        h.metric("hourglass_upstream_requests_in_flight{upstream=\"fake\"}")
            .await,
        0.0
    );
}
