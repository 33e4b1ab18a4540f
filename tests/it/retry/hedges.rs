//! Hedges down a chain of three: a hedge that loses at once hands the race on to the next
//! upstream of the chain.

use super::*;

/// A chain of three, `primary` -> `backup` -> `third`, with `route` under the route's
/// `fallbacks`, logging JSON; `third` answers as its own model.
async fn chain_of_three(route: &str) -> (Process, [FakeUpstream; 3]) {
    let start = || FakeUpstream::start("127.0.0.1:0".parse().unwrap());
    let ups = [
        start().await.unwrap(),
        start().await.unwrap(),
        start().await.unwrap(),
    ];
    let text = format!(
        "{}\n[upstreams.third]\nurl = \"{}\"\nauth = \"none\"\nmodel = \"third-model\"\n",
        config(
            &ups[0].url(),
            &ups[1].url(),
            &format!("fallbacks = [\"backup\", \"third\"]\n{route}"),
            "",
            "",
        ),
        ups[2].url(),
    );
    let p = Process::spawn(&text, &["--log-format", "json"], &[]).await;
    (p, ups)
}

/// A hedge that fails at once (a 503) leaves the rest of the chain its turn: the next
/// upstream is raced against the primary still running. The primary, hedged, keeps the
/// route's whole first-token limit, and the request waited on it alone for all of it; the
/// third upstream was never tried, and a route that answered 200 without `hedge_after`
/// answered 504 with it (audit MF 1).
#[tokio::test]
async fn a_hedge_that_fails_at_once_hands_the_race_to_the_next_upstream() {
    // The budget leaves nothing for the third once the primary's 2 s limit is spent.
    let (p, [primary, backup, third]) =
        chain_of_three("hedge_after = \"200ms\"\nbudget = \"2050ms\"").await;
    primary.set_script(&[("x-fake-ttft-ms", "25000"), ("x-fake-headers-first", "1")]);
    backup.set_script(&[("x-fake-status", "503")]);
    let (resp, _c) = Conn::open(p.addr)
        .await
        .send(chat_request(&[("x-fake-chunks", "2")], true))
        .await;
    assert_eq!(resp.status(), 200, "the third upstream answers");
    let won_at = Instant::now();
    let read = read_body(resp.into_body()).await;
    assert!(
        read.text().contains("\"model\":\"third-model\""),
        "{}",
        read.text()
    );
    assert_eq!(read.text().matches("[DONE]").count(), 1, "{}", read.text());
    // The primary lost the race and was cancelled with the win.
    let closed = primary
        .wait_closed(primary.connections()[0].id, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(closed.saturating_duration_since(won_at) < PROMPTLY);
    for (up, n) in [(&primary, 1), (&backup, 1), (&third, 1)] {
        assert_eq!(up.requests().len(), n);
    }
    let fields = p.request_line().await;
    let attempts = fields["attempts"].as_str().unwrap_or_default();
    assert!(
        attempts.starts_with("primary:hedge_loser:")
            && attempts.contains(",backup:status_5xx:")
            && attempts.contains(",third:ok:"),
        "{fields}"
    );
    assert_eq!(fields["upstream"], "third", "{fields}");
    for (sample, n) in [
        (
            "hourglass_hedges_total{route=\"chat\",winner=\"hedge\"}",
            1.0,
        ),
        (
            "hourglass_hedges_total{route=\"chat\",winner=\"none\"}",
            0.0,
        ),
        (
            "hourglass_cancellations_total{origin=\"hedge_loser\",route=\"chat\"}",
            1.0,
        ),
        (
            "hourglass_fallbacks_total{from=\"backup\",route=\"chat\",to=\"third\"}",
            1.0,
        ),
        ("hourglass_attempts_sum{route=\"chat\"}", 3.0),
        (
            "hourglass_requests_total{outcome=\"ok\",route=\"chat\"}",
            1.0,
        ),
    ] {
        assert_eq!(metric(p.admin, sample).await, n, "{sample}");
    }
}

/// The requests a route hedges are kept to a share of its requests, not only its races at
/// once: a race ends with the fallback's first token, so with a fast fallback the share of
/// races in flight came back at once, and most slow requests were hedged (audit MF 2: 44 of
/// 75 under steady load, 38 of 40 in a burst). Eight clients asking in turn, 40 requests in
/// all, each slow at its primary, the backup answering at once: at most the 3 hedges banked
/// and a tenth of the 40.
#[tokio::test]
async fn a_fast_fallback_is_hedged_to_for_a_share_of_the_requests() {
    const LANES: usize = 8;
    const EACH: usize = 5;
    const N: usize = LANES * EACH;
    let p =
        std::sync::Arc::new(pair("fallbacks = [\"backup\"]\nhedge_after = \"50ms\"", "", "").await);
    p.primary.set_script(&[("x-fake-ttft-ms", "400")]);
    let clients: Vec<_> = (0..LANES)
        .map(|_| {
            let p = p.clone();
            tokio::spawn(async move {
                for _ in 0..EACH {
                    let (resp, _c) = p.chat(&[("x-fake-chunks", "2")]).await;
                    assert_eq!(resp.status(), 200);
                    read_body(resp.into_body()).await;
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    p.wait_reported(N as f64).await;
    let hedged = p.backup.requests().len();
    assert!((1..=3 + N / 10).contains(&hedged), "{hedged} of {N} hedged");
    let mut counted = 0.0;
    for winner in ["primary", "hedge", "none"] {
        let sample = format!("hourglass_hedges_total{{route=\"chat\",winner=\"{winner}\"}}");
        counted += p.metric(&sample).await;
    }
    assert_eq!(counted, hedged as f64);
}
