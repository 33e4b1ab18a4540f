//! Retries and hedges against upstreams written by hand: an upstream that says not to retry,
//! a fallback due for its probe, retries after a lost hedge, a chain that is all out, and the
//! shares of retries and hedges an upstream or route may spend.

use super::*;

/// An upstream written by hand that answers its `k`th connection with `answers[k]` (the last
/// one for any after), each piece after its delay, then closes; and how many requests it read.
pub(super) async fn scripted(
    answers: Vec<Vec<(Duration, Vec<u8>)>>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        let mut k = 0;
        while let Ok((mut s, _)) = listener.accept().await {
            let answer = answers[k.min(answers.len() - 1)].clone();
            k += 1;
            let seen = seen.clone();
            tokio::spawn(async move {
                s.set_nodelay(true).unwrap();
                read_request(&mut s).await;
                seen.fetch_add(1, Ordering::SeqCst);
                for (delay, piece) in answer {
                    tokio::time::sleep(delay).await;
                    if s.write_all(&piece).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, count)
}

/// A head and a two-byte body, sent at once after `delay`.
pub(super) fn answer(delay: Duration, status: &str, fields: &str) -> Vec<(Duration, Vec<u8>)> {
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{fields}\
         content-length: 2\r\nconnection: close\r\n\r\n{{}}"
    );
    vec![(delay, head.into_bytes())]
}

pub(super) fn completion() -> Vec<(Duration, Vec<u8>)> {
    let body = r#"{"id":"c1","object":"chat.completion","model":"gpt-test","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#;
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    vec![(Duration::ZERO, head.into_bytes())]
}

/// An upstream that answers `x-should-retry: false` (a provider, another Hourglass after its
/// own retries, this one looped back to itself) is not asked again: two chained gateways
/// made nine calls, a loop sixty before its 508 (audit Y1). A fallback is another upstream
/// and is still tried.
#[tokio::test]
async fn an_upstream_that_says_not_to_retry_is_asked_once() {
    let said_no = answer(
        Duration::ZERO,
        "500 Internal Server Error",
        "x-should-retry: False\r\n",
    );
    let (url, asked) = scripted(vec![said_no.clone()]).await;
    let p = pair_with("retries = 2\nretry_on = [\"5xx\"]", "", "", Some(url)).await;
    let (resp, _c) = p.chat(&[]).await;
    assert_eq!(resp.status(), 500, "the upstream's answer passes through");
    json_body(resp).await;
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
    p.wait_reported(1.0).await;
    assert_eq!(
        p.metric("hourglass_retries_total{reason=\"5xx\",route=\"chat\",upstream=\"primary\"}")
            .await,
        0.0
    );

    let (url, asked) = scripted(vec![said_no]).await;
    let p = pair_with("retries = 2\nfallbacks = [\"backup\"]", "", "", Some(url)).await;
    let (resp, _c) = p.chat(&[("x-fake-chunks", "2")]).await;
    assert_eq!(resp.status(), 200, "the fallback answers");
    read_body(resp.into_body()).await;
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(p.backup.requests().len(), 1);
}

/// The hedge's target is judged when the hedge fires, not when the request began: a fallback
/// out of rotation at the start and due for its probe by `hedge_after` is raced as that
/// probe. Judged at the start, the request waited its primary's whole first-token limit
/// (audit Y2).
#[tokio::test]
async fn a_fallback_due_for_its_probe_by_the_hedge_is_raced() {
    let p = pair(
        "fallbacks = [\"backup\"]\nhedge_after = \"2500ms\"\nbudget = \"30s\"\n\
         first_token_timeout = \"20s\"\n\n\
         [[routes]]\nname = \"direct\"\npath_prefix = \"/direct\"\nupstream = \"backup\"",
        "",
        "eject_after = 1\neject_for = \"2s\"",
    )
    .await;
    p.primary
        .set_script(&[("x-fake-ttft-ms", "25000"), ("x-fake-headers-first", "1")]);
    // One failure takes the backup out of rotation for 2 s.
    let mut direct = chat_request(&[("x-fake-status", "503")], true);
    *direct.uri_mut() = "/direct/v1/chat/completions".parse().unwrap();
    let (resp, _c) = Conn::open(p.gw.addr).await.send(direct).await;
    assert_eq!(resp.status(), 503);
    read_body(resp.into_body()).await;
    assert_eq!(
        p.metric("hourglass_upstream_ejected{upstream=\"backup\"}")
            .await,
        1.0
    );
    let start = Instant::now();
    let (resp, _c) = p.chat(&[("x-fake-chunks", "2")]).await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    // Far below the primary's 20 s limit: the hedge answered.
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    p.wait_reported(1.0).await;
    assert_eq!(
        p.metric("hourglass_hedges_total{route=\"chat\",winner=\"hedge\"}")
            .await,
        1.0
    );
    assert_eq!(
        p.metric("hourglass_upstream_ejected{upstream=\"backup\"}")
            .await,
        0.0,
        "the probe put it back"
    );
}

/// After a hedge both attempts lost, the primary's retry waits and counts by the primary's
/// own failure: the hedge's `retry-after: 30` (another provider's rate limit) cancelled the
/// primary's retry, and a retry after the primary's 503 was counted as a 429 (audit Y3).
#[tokio::test]
async fn a_retry_after_a_lost_hedge_goes_by_the_primarys_own_failure() {
    // With a wait no budget fits, and with none.
    for fields in ["retry-after: 30\r\n", ""] {
        let (primary, primary_asked) = scripted(vec![
            answer(Duration::from_millis(400), "503 Service Unavailable", ""),
            completion(),
        ])
        .await;
        // The hedge starts at 200 ms and fails last, at 1 s.
        let (backup, _) = scripted(vec![answer(
            Duration::from_millis(800),
            "429 Too Many Requests",
            fields,
        )])
        .await;
        let text = config(
            &primary,
            &backup,
            "retries = 1\nfallbacks = [\"backup\"]\nhedge_after = \"200ms\"\nbudget = \"10s\"\n\
             first_token_timeout = \"5s\"",
            "",
            "",
        );
        let gw = server::start(Config::from_toml(&text, "retry-test.toml").unwrap())
            .await
            .unwrap();
        let (resp, _c) = Conn::open(gw.addr)
            .await
            .send(chat_request(&[], false))
            .await;
        assert_eq!(
            resp.status(),
            200,
            "the primary's retry was made ({fields})"
        );
        read_body(resp.into_body()).await;
        assert_eq!(primary_asked.load(std::sync::atomic::Ordering::SeqCst), 2);
        let deadline = Instant::now() + Duration::from_secs(5);
        while metric(
            gw.admin_addr,
            "hourglass_requests_total{outcome=\"ok\",route=\"chat\"}",
        )
        .await
            < 1.0
        {
            assert!(Instant::now() < deadline, "the request was reported");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for (reason, n) in [("5xx", 1.0), ("429", 0.0)] {
            let sample = format!(
                "hourglass_retries_total{{reason=\"{reason}\",route=\"chat\",upstream=\"primary\"}}"
            );
            assert_eq!(
                metric(gw.admin_addr, &sample).await,
                n,
                "{sample} ({fields})"
            );
        }
    }
}

/// An upstream out of rotation that is tried only because no later one is in rotation gets
/// one attempt per request, no retries: with every upstream of the chain out, each request
/// ran its whole retry ladder on each of them (audit GD 3: five calls per client request).
/// Its answer leaves retrying to the client's SDK, as after any single attempt.
#[tokio::test]
async fn an_upstream_tried_only_because_the_whole_chain_is_out_is_not_retried() {
    let p = pair(
        "retries = 2\nretry_on = [\"5xx\"]",
        "eject_after = 2\neject_for = \"30s\"",
        "",
    )
    .await;
    p.primary.set_script(&[("x-fake-status", "503")]);
    // In rotation, then ejected by its second failure: no third attempt.
    let (resp, _c) = p.chat(&[]).await;
    assert_eq!(resp.status(), 503);
    read_body(resp.into_body()).await;
    assert_eq!(p.primary.requests().len(), 2);
    assert_eq!(
        p.metric("hourglass_upstream_ejected{upstream=\"primary\"}")
            .await,
        1.0
    );
    // Out of rotation, with nothing after it: tried once. One attempt made, retrying is
    // the SDK's, as on a route without retries (audit IA 2: the header gave the route
    // that retries one try where a route without retries got the SDK's three).
    let (resp, _c) = p.chat(&[]).await;
    assert_eq!(resp.status(), 503, "its own answer passes through");
    assert_eq!(resp.headers().get("x-should-retry"), None);
    read_body(resp.into_body()).await;
    assert_eq!(p.primary.requests().len(), 3);
    p.wait_reported(2.0).await;
    assert_eq!(
        p.metric("hourglass_retries_total{reason=\"5xx\",route=\"chat\",upstream=\"primary\"}")
            .await,
        1.0
    );
}

/// An upstream whose first `n` connections are each answered 503 once all `n` have come
/// (so that no retry starts before every first attempt is in), and whose later ones get no
/// answer; and how many requests it read.
async fn fails_together_then_hangs(
    n: usize,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let together = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    tokio::spawn(async move {
        let mut k = 0;
        while let Ok((mut s, _)) = listener.accept().await {
            let first = k < n;
            k += 1;
            let (seen, together) = (seen.clone(), together.clone());
            tokio::spawn(async move {
                read_request(&mut s).await;
                seen.fetch_add(1, Ordering::SeqCst);
                if !first {
                    // Held until the gateway gives up on it.
                    let _ = tokio::io::AsyncReadExt::read(&mut s, &mut [0u8; 1]).await;
                    return;
                }
                together.wait().await;
                let head = "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
                            content-length: 2\r\nconnection: close\r\n\r\n{}";
                let _ = s.write_all(head.as_bytes()).await;
            });
        }
    });
    (url, count)
}

/// Retries in flight on an upstream are kept to at most max(3, 20% of its attempts in
/// flight), counted from their backoff on: ten requests failing at once make three
/// retries, not ten, and the other seven pass the upstream's answer through at once, saying
/// not to retry (audit GD 3: 3x to 5.4x the client load on a failing upstream).
#[tokio::test]
async fn retries_beyond_the_upstreams_share_are_not_made() {
    const N: usize = 10;
    let (url, asked) = fails_together_then_hangs(N).await;
    // Never ejected: ten failures would take it out of rotation at the fifth, and a retry
    // refused for that is another matter (its answer leaves retrying to the SDK).
    let p = pair_with(
        "retries = 1\nretry_on = [\"5xx\"]",
        "eject_after = 0",
        "",
        Some(url),
    )
    .await;
    let addr = p.gw.addr;
    let (done, mut answers) = tokio::sync::mpsc::unbounded_channel();
    let clients: Vec<_> = (0..N)
        .map(|_| {
            let done = done.clone();
            tokio::spawn(async move {
                let (resp, _c) = Conn::open(addr).await.send(chat_request(&[], false)).await;
                let status = resp.status();
                let says = resp.headers().get("x-should-retry").cloned();
                read_body(resp.into_body()).await;
                let _ = done.send((status, says));
            })
        })
        .collect();
    // Seven answers come at once; the three retried wait out their first-token limit (2 s),
    // and the ten retried (without a share) all of them.
    for k in 0..N - 3 {
        let (status, says) = tokio::time::timeout(Duration::from_millis(1500), answers.recv())
            .await
            .unwrap_or_else(|_| panic!("{k} of {} answers came at once", N - 3))
            .unwrap();
        assert_eq!(status, 503, "the upstream's answer passes through");
        assert_eq!(says.as_ref().map(|v| v.as_bytes()), Some(&b"false"[..]));
    }
    // The seven answered will make no retry, the three retries none after theirs (retries
    // = 1): once the three are in (after their backoff), the count is final.
    let deadline = Instant::now() + Duration::from_secs(5);
    while asked.load(std::sync::atomic::Ordering::SeqCst) < N + 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::SeqCst),
        N + 3,
        "ten first attempts and three retries"
    );
    for c in clients {
        c.abort();
    }
}

/// Requests answered 429 together wait out their `Retry-After` without spending the
/// upstream's share of retries: a retry counts only from its attempt on. The six waits here
/// end apart, so no more than two retries are ever in flight, and all six are made. Counted
/// from the wait, three of six were refused (audit HA 1: 17 of 20 with `retry-after: 2`).
#[tokio::test]
async fn requests_waiting_out_a_retry_after_do_not_spend_the_share_of_retries() {
    const N: usize = 6;
    let mut answers: Vec<_> = (1..=N)
        .map(|k| {
            let fields = format!("retry-after-ms: {}\r\n", 300 * k);
            answer(Duration::ZERO, "429 Too Many Requests", &fields)
        })
        .collect();
    answers.push(completion());
    let (url, asked) = scripted(answers).await;
    // Never ejected: six 429s in a row would take it out of rotation, and its retries with it.
    let p = pair_with(
        "retries = 1\nretry_on = [\"429\"]",
        "eject_after = 0",
        "",
        Some(url),
    )
    .await;
    let addr = p.gw.addr;
    let clients: Vec<_> = (0..N)
        .map(|_| {
            tokio::spawn(async move {
                let (resp, _c) = Conn::open(addr).await.send(chat_request(&[], false)).await;
                let status = resp.status();
                read_body(resp.into_body()).await;
                status
            })
        })
        .collect();
    for c in clients {
        assert_eq!(c.await.unwrap(), 200, "every request's retry was made");
    }
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 2 * N);
    p.wait_reported(N as f64).await;
    assert_eq!(
        p.metric("hourglass_retries_total{reason=\"429\",route=\"chat\",upstream=\"primary\"}")
            .await,
        N as f64
    );
}

/// Hedges in flight on a route are kept to max(1, 10% of its requests in flight): ten slow
/// requests at once hedge once, not ten times (audit GD 4: 1962 of 2000 requests hedged on
/// an upstream slowed by load, 28% less throughput for it).
#[tokio::test]
async fn hedges_beyond_the_routes_share_are_not_sent() {
    const N: usize = 10;
    let p = std::sync::Arc::new(
        pair("fallbacks = [\"backup\"]\nhedge_after = \"100ms\"", "", "").await,
    );
    p.primary.set_script(&[("x-fake-ttft-ms", "1000")]);
    p.backup.set_script(&[("x-fake-ttft-ms", "1500")]);
    let clients: Vec<_> = (0..N)
        .map(|_| {
            let p = p.clone();
            tokio::spawn(async move {
                let (resp, _c) = p.chat(&[("x-fake-chunks", "2")]).await;
                assert_eq!(resp.status(), 200);
                read_body(resp.into_body()).await;
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(p.primary.requests().len(), N);
    assert_eq!(p.backup.requests().len(), 1, "one hedge for ten requests");
    p.wait_reported(N as f64).await;
    assert_eq!(
        p.metric("hourglass_hedges_total{route=\"chat\",winner=\"primary\"}")
            .await,
        1.0
    );
}

/// An upstream that answers the first request of each connection with `200` and keeps the
/// connection, then reads the next request on it and closes without answering (a keep-alive
/// timeout racing the request); and how many requests it read.
async fn closes_its_second(
    body: &'static str,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    answers_then(body, b"").await
}

/// As [`closes_its_second`], writing `second` (part of an answer, or nothing) before it
/// closes on the second request.
async fn answers_then(
    body: &'static str,
    second: &'static [u8],
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                s.set_nodelay(true).unwrap();
                read_request(&mut s).await;
                seen.fetch_add(1, Ordering::SeqCst);
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(head.as_bytes()).await.unwrap();
                read_request(&mut s).await;
                seen.fetch_add(1, Ordering::SeqCst);
                let _ = s.write_all(second).await;
            });
        }
    });
    (url, count)
}

/// Audit MC 5: a request without a body and of an idempotent method (`GET /v1/models`) on a
/// pooled HTTP/1.1 connection that the upstream closed without answering is sent again once
/// on a new connection (RFC 9112 9.3.1.1), on a route without `retries`, and counted as a
/// retry. It got a 502. A POST with a body is not (RFC 9112 9.3.1: it may have been seen).
#[tokio::test]
async fn an_idempotent_request_on_a_connection_closed_unanswered_is_sent_again() {
    use std::sync::atomic::Ordering;
    let (url, asked) = closes_its_second(r#"{"object":"list","data":[]}"#).await;
    // A catch-all route, as for the APIs besides the model calls.
    let backup = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let text = config(&url, &backup.url(), "", "", "").replace(
        "path_prefix = \"/v1/chat/completions\"",
        "path_prefix = \"/v1\"",
    );
    let gw = server::start(Config::from_toml(&text, "retry-test.toml").unwrap())
        .await
        .unwrap();
    let p = Pair {
        primary: FakeUpstream::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap(),
        backup,
        gw,
    };
    let get = || {
        http::Request::get("/v1/models")
            .header("host", "gateway")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    // One client connection: the gateway's pooled upstream connection is reused.
    let conn = Conn::open(p.gw.addr).await;
    let (resp, conn) = conn.send(get()).await;
    assert_eq!(resp.status(), 200);
    json_body(resp).await;
    let (resp, _conn) = conn.send(get()).await;
    assert_eq!(resp.status(), 200, "sent again on a new connection");
    json_body(resp).await;
    assert_eq!(asked.load(Ordering::SeqCst), 3);
    assert_eq!(
        p.metric("hourglass_retries_total{reason=\"refused\",route=\"chat\",upstream=\"primary\"}")
            .await,
        1.0
    );
    // A POST with a body on such a connection is not sent again.
    let (url, asked) = closes_its_second(r#"{"id":"c1","object":"chat.completion","model":"gpt-test","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#).await;
    let p = pair_with("", "", "", Some(url)).await;
    let conn = Conn::open(p.gw.addr).await;
    let (resp, conn) = conn.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    json_body(resp).await;
    let (resp, _conn) = conn.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 502);
    json_body(resp).await;
    assert_eq!(asked.load(Ordering::SeqCst), 2);
}

/// Audit OA 2: an attempt answered 429 (or 5xx) whose request the client left while the retry
/// waited out its `Retry-After` was in no log line: one attempt, so no `attempts`, and no
/// status, though `hourglass_upstream_responses_total` counted the answer. The log line names
/// an attempt that failed whenever the request ended otherwise.
#[tokio::test]
async fn an_answer_the_client_left_during_the_retry_wait_is_in_the_log_line() {
    use std::sync::atomic::Ordering;
    let busy = answer(
        Duration::ZERO,
        "429 Too Many Requests",
        "retry-after: 5\r\n",
    );
    let (url, asked) = scripted(vec![busy]).await;
    let text = config(
        &url,
        "http://127.0.0.1:9",
        "retries = 1\nbudget = \"30s\"",
        "",
        "",
    );
    let p = Process::spawn(&text, &["--log-format", "json"], &[]).await;
    let conn = Conn::open(p.addr).await;
    let pending = tokio::spawn(conn.send(chat_request(&[], false)));
    let start = Instant::now();
    while asked.load(Ordering::SeqCst) == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "never asked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Long enough for the 429 to be read; far less than the 5 s it asks to wait.
    tokio::time::sleep(Duration::from_millis(500)).await;
    pending.abort();
    let _ = pending.await;
    let fields = p.request_line().await;
    assert_eq!(fields["outcome"], "cancelled", "{fields}");
    let attempts = fields["attempts"].as_str().unwrap_or_default();
    assert!(attempts.starts_with("primary:status_429:"), "{fields}");
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "no retry after the client left"
    );
}

/// A gateway whose catch-all route `/v1` calls `url` (with `primary_extra`), `route` added.
async fn catch_all(url: &str, route: &str, primary_extra: &str) -> Pair {
    let backup = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let text = config(url, &backup.url(), route, primary_extra, "").replace(
        "path_prefix = \"/v1/chat/completions\"",
        "path_prefix = \"/v1\"",
    );
    let gw = server::start(Config::from_toml(&text, "retry-test.toml").unwrap())
        .await
        .unwrap();
    Pair {
        primary: FakeUpstream::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap(),
        backup,
        gw,
    }
}

fn bodiless(method: http::Method, path: &str) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "gateway")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap()
}

/// Audit NA 2: an upstream that closes every connection unanswered, a GET's too, is a
/// failing upstream: a first send on a new connection is no stale pooled one, so it is not
/// sent again and counts against the upstream's health like a reset, which ejects it after
/// `eject_after`. It stayed in rotation for GETs forever, each paying two sends.
#[tokio::test]
async fn an_upstream_that_closes_every_get_unanswered_is_ejected() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let asked = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = asked.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                read_request(&mut s).await;
                seen.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    let p = catch_all(&url, "fallbacks = [\"backup\"]", "eject_after = 2").await;
    for i in 1..=2 {
        let (resp, _c) = Conn::open(p.gw.addr)
            .await
            .send(bodiless(http::Method::GET, "/v1/models"))
            .await;
        assert_eq!(resp.status(), 200, "the fallback answers");
        json_body(resp).await;
        assert_eq!(asked.load(Ordering::SeqCst), i, "sent once");
    }
    let view: serde_json::Value =
        serde_json::from_str(&admin_get(p.gw.admin_addr, "/upstreams").await).unwrap();
    let primary = view["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "primary")
        .unwrap()
        .clone();
    assert_eq!(primary["in_rotation"], false, "{view}");
}

/// Audit NA 3: a pooled connection that closed after part of the answer came (a partial
/// head, a `100 Continue`) may have had its request processed, and so may a `DELETE`'s: none
/// is sent again, and the 502 does not say that nothing of it was processed.
#[tokio::test]
async fn a_request_whose_connection_closed_after_part_of_its_answer_is_not_sent_again() {
    use std::sync::atomic::Ordering;
    let list = r#"{"object":"list","data":[]}"#;
    for (case, second, method) in [
        (
            "partial head",
            &b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"[..],
            http::Method::GET,
        ),
        (
            "100 Continue",
            &b"HTTP/1.1 100 Continue\r\n\r\n"[..],
            http::Method::GET,
        ),
        ("DELETE", &b""[..], http::Method::DELETE),
    ] {
        let (url, asked) = answers_then(list, second).await;
        let p = catch_all(&url, "", "").await;
        let conn = Conn::open(p.gw.addr).await;
        let (resp, conn) = conn.send(bodiless(http::Method::GET, "/v1/models")).await;
        assert_eq!(resp.status(), 200, "{case}");
        json_body(resp).await;
        let (resp, _conn) = conn.send(bodiless(method, "/v1/models")).await;
        assert_eq!(resp.status(), 502, "{case}");
        let v = json_body(resp).await;
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            !message.contains("nothing of it was processed"),
            "{case}: {message}"
        );
        assert_eq!(asked.load(Ordering::SeqCst), 2, "{case}: not sent again");
    }
}

/// A retry that waits out a `Retry-After` is judged again when its wait ends: an upstream
/// ejected meanwhile is passed over for the fallback in rotation, as it would have been
/// before the wait, and no attempt begun as though it were in rotation ends its ejection.
/// Judged only before the wait, four requests of eight slept 4 s and then all retried the
/// ejected primary, and their answers put it back 2 s into a 10 s ejection (audit SC 1).
#[tokio::test]
async fn a_retry_whose_upstream_was_ejected_during_its_wait_goes_to_the_fallback() {
    let asked_later = answer(
        Duration::ZERO,
        "429 Too Many Requests",
        "retry-after: 1\r\n",
    );
    // Its third call would answer, and put it back in rotation.
    let (url, asked) = scripted(vec![asked_later.clone(), asked_later, completion()]).await;
    let p = std::sync::Arc::new(
        pair_with(
            "retries = 1\nfallbacks = [\"backup\"]",
            "eject_after = 2\neject_for = \"30s\"",
            "",
            Some(url),
        )
        .await,
    );
    let waits = {
        let p = p.clone();
        tokio::spawn(async move {
            let (resp, _c) = p.chat(&[("x-fake-chunks", "2")]).await;
            let status = resp.status();
            read_body(resp.into_body()).await;
            status
        })
    };
    // The first request's 429 is in (and reported): it waits out its second.
    let deadline = Instant::now() + Duration::from_secs(5);
    while asked.load(std::sync::atomic::Ordering::SeqCst) < 1 {
        assert!(
            Instant::now() < deadline,
            "the first request reached the primary"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The second's 429 ejects the primary: it goes on to the backup at once.
    let (resp, _c) = p.chat(&[("x-fake-chunks", "2")]).await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    assert_eq!(
        p.metric("hourglass_upstream_ejected{upstream=\"primary\"}")
            .await,
        1.0
    );
    assert_eq!(waits.await.unwrap(), 200);
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the ejected primary was retried"
    );
    assert_eq!(p.backup.requests().len(), 2);
    assert_eq!(
        p.metric("hourglass_upstream_ejected{upstream=\"primary\"}")
            .await,
        1.0,
        "still out of rotation"
    );
}

/// A provider's rate limit, with what it says of when to come back.
fn rate_limited() -> Vec<(Duration, Vec<u8>)> {
    rate_limited_after(Duration::ZERO, "1")
}

/// A provider's rate limit after `delay`, asking for a wait of `retry_after` seconds.
pub(super) fn rate_limited_after(delay: Duration, retry_after: &str) -> Vec<(Duration, Vec<u8>)> {
    let body = r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
    let head = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
         retry-after: {retry_after}\r\nx-ratelimit-remaining-requests: 0\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    vec![(delay, head.into_bytes())]
}

/// A primary's 429 is not lost when its fallback then fails in a way of the gateway's own
/// (a connect refused, a wait that spent the budget): the provider's answer, with its
/// `Retry-After`, passes through as it would had no fallback followed. It was replaced by a
/// 502 naming the fallback that said not to retry, or a 504 (audit SC 2).
#[tokio::test]
async fn a_429_is_passed_through_when_the_fallback_fails_on_its_own() {
    let (_refusing, refused) = closed_port();
    let (hanging, _) = scripted(vec![vec![(Duration::from_secs(30), Vec::new())]]).await;
    for (backup, budget) in [(refused, "5000"), (hanging, "1500")] {
        let (primary, asked) = scripted(vec![rate_limited()]).await;
        let text = config(&primary, &backup, "fallbacks = [\"backup\"]", "", "");
        let gw = server::start(Config::from_toml(&text, "retry-test.toml").unwrap())
            .await
            .unwrap();
        let (resp, _c) = Conn::open(gw.addr)
            .await
            .send(chat_request(&[("x-request-budget-ms", budget)], false))
            .await;
        assert_eq!(resp.status(), 429, "the provider's answer ({backup})");
        let headers = resp.headers().clone();
        assert_eq!(headers["retry-after"], "1", "{headers:?}");
        assert_eq!(
            headers["x-ratelimit-remaining-requests"], "0",
            "{headers:?}"
        );
        // Two attempts were made: the client's SDK is told the gateway retried.
        assert_eq!(headers["x-should-retry"], "false", "{headers:?}");
        let body = json_body(resp).await;
        assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}

/// On a hedged route a racer's answer is kept as one along the chain is (SC 2): a hedge's
/// 429 while the primary hangs to the deadline, and the primary's 429 while the hedge's
/// connect hangs, pass through with their `Retry-After`. The loser's answer was dropped in
/// the race, and the client got the gateway's 504 (audit VA 1).
#[tokio::test]
async fn a_racers_429_is_passed_through_when_the_race_ends_in_the_gateways_own_error() {
    let (hanging, _) = scripted(vec![vec![(Duration::from_secs(30), Vec::new())]]).await;
    let (limited_hedge, hedge_asked) =
        scripted(vec![rate_limited_after(Duration::ZERO, "3")]).await;
    let (limited_primary, primary_asked) =
        scripted(vec![rate_limited_after(Duration::from_millis(300), "3")]).await;
    let (_held, unaccepting) = hourglass_fake::never_accepting_listener().unwrap();
    let unaccepting = format!("http://{unaccepting}");
    // The primary hangs past the 1.5 s budget; the hedge, at 100 ms, answers 429 at once.
    // Then the primary's 429 at 300 ms, while the hedge's connect hangs to its 500 ms limit.
    let cases = [
        (&hanging, &limited_hedge, "1500", "the hedge's"),
        (&limited_primary, &unaccepting, "5000", "the primary's"),
    ];
    for (primary, backup, budget, whose) in cases {
        let route = "fallbacks = [\"backup\"]\nhedge_after = \"100ms\"";
        let text = config(primary, backup, route, "", "");
        let gw = server::start(Config::from_toml(&text, "retry-test.toml").unwrap())
            .await
            .unwrap();
        let (resp, _c) = Conn::open(gw.addr)
            .await
            .send(chat_request(&[("x-request-budget-ms", budget)], false))
            .await;
        assert_eq!(resp.status(), 429, "{whose} answer");
        let headers = resp.headers().clone();
        assert_eq!(headers["retry-after"], "3", "{whose}: {headers:?}");
        assert_eq!(headers["x-should-retry"], "false", "{whose}: {headers:?}");
        let body = json_body(resp).await;
        assert_eq!(
            body["error"]["code"], "rate_limit_exceeded",
            "{whose}: {body}"
        );
    }
    for asked in [hedge_asked, primary_asked] {
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}

/// Audit WC 1: `budget = 1s`, `min_useful = 100ms`, `retries = 1`; the upstream's 503 asks
/// for `retry-after-ms: 899`, which just fits after the first attempt's millisecond. A wait ends on the
/// millisecond tick after its instant, later by up to a millisecond, and the retry went out
/// with 98 or 99 ms left, below `min_useful`, which DESIGN says never reaches the upstream.
/// It is judged again after the wait: the upstream is asked once, and its 503 is the answer.
/// The clock is paused and set half a millisecond off a tick, so the wait ends late by that;
/// before the fix the retry went out with 99.5 ms left and the client got a 504 at the
/// deadline.
#[tokio::test(start_paused = true)]
async fn a_retry_that_no_longer_fits_after_its_wait_is_not_made() {
    let (url, asked) = scripted(vec![
        answer(
            Duration::ZERO,
            "503 Service Unavailable",
            "retry-after-ms: 899\r\n",
        ),
        completion(),
    ])
    .await;
    let p = pair_with(
        "retries = 1\nbudget = \"1s\"\nmin_useful = \"100ms\"\nfirst_token_timeout = \"900ms\"",
        "eject_after = 100",
        "",
        Some(url),
    )
    .await;
    tokio::time::advance(Duration::from_micros(500)).await;
    let (resp, _c) = p.chat(&[]).await;
    assert_eq!(resp.status(), 503, "the upstream's answer passes through");
    json_body(resp).await;
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
}
