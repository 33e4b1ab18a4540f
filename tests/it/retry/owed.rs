//! Retries owed across a balance group: a key that asks for a wait moves the walk on to a
//! free peer, and its retry is made after the peers and before the fallbacks, the one ready
//! first first (audits SC 3, TA 1, YA 1, YA 2).

use super::scripted::{answer, completion, rate_limited_after, scripted};
use super::*;

/// An upstream written by hand, as `scripted`, that writes `name` into `arrivals` as each
/// request it read comes in: the order of the calls across upstreams.
async fn scripted_named(
    name: &'static str,
    arrivals: &std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>,
    answers: Vec<Vec<(Duration, Vec<u8>)>>,
) -> String {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let arrivals = arrivals.clone();
    tokio::spawn(async move {
        let mut k = 0;
        while let Ok((mut s, _)) = listener.accept().await {
            let answer = answers[k.min(answers.len() - 1)].clone();
            k += 1;
            let arrivals = arrivals.clone();
            tokio::spawn(async move {
                s.set_nodelay(true).unwrap();
                read_request(&mut s).await;
                arrivals.lock().unwrap().push(name);
                for (delay, piece) in answer {
                    tokio::time::sleep(delay).await;
                    if s.write_all(&piece).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

type Arrivals = std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>;

/// A key, a, that asks for a 1 s wait (`Retry-After`) and then answers, and its balance peer
/// b that answers `b` (`retries = 1`): the gateway over both, and the order of their calls.
async fn limited_key_and_peer(b: Vec<Vec<(Duration, Vec<u8>)>>) -> (Running, Arrivals) {
    let arrivals = Arrivals::default();
    let a = scripted_named(
        "a",
        &arrivals,
        vec![rate_limited_after(Duration::ZERO, "1"), completion()],
    )
    .await;
    let b = scripted_named("b", &arrivals, b).await;
    let text = config(
        &a,
        &b,
        "retries = 1\nbalance_with = [\"backup\"]",
        "eject_after = 100",
        "eject_after = 100",
    );
    let gw = server::start(Config::from_toml(&text, "retry-test.toml").unwrap())
        .await
        .unwrap();
    (gw, arrivals)
}

/// A key that asks for a wait does not idle the request while a balance peer is free: the
/// request that starts on the limited key is answered by the peer at once, and the limited
/// key's retry, owed until then, is not needed (audit SC 3: it slept 2 s beside an idle
/// peer). Its retry was not given up either (TA 1, below; and the tests after it).
#[tokio::test]
async fn a_retry_after_on_a_balanced_key_moves_on_to_the_free_peer_first() {
    let (url, asked) = scripted(vec![
        answer(
            Duration::ZERO,
            "429 Too Many Requests",
            "retry-after: 2\r\n",
        ),
        completion(),
    ])
    .await;
    let p = pair_with(
        "retries = 1\nbalance_with = [\"backup\"]",
        "",
        "",
        Some(url),
    )
    .await;
    // Equals take turns: one of the two starts on the primary, the other on the backup.
    for k in 0..2 {
        let (resp, _c) = p.chat(&[("x-fake-chunks", "2")]).await;
        assert_eq!(resp.status(), 200, "request {k}");
        read_body(resp.into_body()).await;
    }
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the limited key was asked once: the peer answered before its retry was due"
    );
    assert_eq!(p.backup.requests().len(), 2, "the peer answered both");
    assert_eq!(
        p.metric("hourglass_fallbacks_total{from=\"primary\",route=\"chat\",to=\"backup\"}")
            .await,
        1.0
    );
    assert_eq!(
        p.metric("hourglass_retries_total{reason=\"429\",route=\"chat\",upstream=\"primary\"}")
            .await,
        0.0
    );
}

/// The retry a key's `Retry-After` owed is made once the peer it moved on to failed too: a
/// asks for a 1 s wait, b fails with a 500 (and its own retry, after a backoff, too), and
/// the request gets a's 200 from the owed retry, in that order of calls.
#[tokio::test]
async fn a_retry_owed_to_a_limited_key_is_made_after_its_peer_fails() {
    let failing = answer(Duration::ZERO, "500 Internal Server Error", "");
    let (gw, arrivals) = limited_key_and_peer(vec![failing]).await;
    // The first request of equals starts at the route's own upstream.
    let (resp, _c) = Conn::open(gw.addr)
        .await
        .send(chat_request(&[], false))
        .await;
    assert_eq!(resp.status(), 200);
    let body = json_body(resp).await;
    assert_eq!(body["id"], "c1", "a's answer: {body}");
    assert_eq!(
        *arrivals.lock().unwrap(),
        ["a", "b", "b", "a"],
        "the peer (and its own retry) before the retry a's wait owed; each upstream at most \
         retries + 1 times"
    );
    let m = |s: &'static str| metric(gw.admin_addr, s);
    assert_eq!(
        m("hourglass_fallbacks_total{from=\"primary\",route=\"chat\",to=\"backup\"}").await,
        1.0
    );
    assert_eq!(
        m("hourglass_retries_total{reason=\"5xx\",route=\"chat\",upstream=\"backup\"}").await,
        1.0
    );
    assert_eq!(
        m("hourglass_retries_total{reason=\"429\",route=\"chat\",upstream=\"primary\"}").await,
        1.0,
        "the owed retry counts as the retry it is"
    );
}

/// An owed retry that no longer fits the budget when its peer has failed is not made, and
/// the client gets the provider's answer kept from the limited key (its 429 and
/// `Retry-After`, SC 2's rule), not the gateway's own error of the peer. Here the peer hangs,
/// and the budget is too short to keep room for the owed retry in its wait (its first token
/// is not cut), so it hangs to the deadline.
#[tokio::test]
async fn an_owed_retry_that_no_longer_fits_leaves_the_kept_answer() {
    let hangs = vec![(Duration::from_secs(30), Vec::new())];
    let (gw, arrivals) = limited_key_and_peer(vec![hangs]).await;
    // 1.2 s: the owed retry (1 s wait, then 100 ms at least) fits when a asks for the wait,
    // but room for it in b's wait would leave b less than `min_useful`, so none is kept.
    let (resp, _c) = Conn::open(gw.addr)
        .await
        .send(chat_request(&[("x-request-budget-ms", "1200")], false))
        .await;
    assert_eq!(resp.status(), 429, "the provider's answer");
    let headers = resp.headers().clone();
    assert_eq!(headers["retry-after"], "1", "{headers:?}");
    // Its wait runs past the 1.2 s the client set itself (audit AE 4); with a budget of the
    // route's, the wait left would be the SDK's (`left_wait::an_owed_retry_that_no_longer_fits`).
    assert_eq!(headers["x-should-retry"], "false", "{headers:?}");
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    assert_eq!(*arrivals.lock().unwrap(), ["a", "b"], "no owed retry made");
}

/// A peer's wait is cut to keep the retry owed after it its room, as a fallback's is kept
/// (its wait left included): a hung peer does not spend the turn of the key that asked for a
/// wait. Without the cut, the peer would hang to the 1.8 s deadline and the client get the
/// 429.
#[tokio::test]
async fn a_hung_peer_leaves_the_owed_retry_its_room() {
    let hangs = vec![(Duration::from_secs(30), Vec::new())];
    let (gw, arrivals) = limited_key_and_peer(vec![hangs]).await;
    let (resp, _c) = Conn::open(gw.addr)
        .await
        .send(chat_request(&[("x-request-budget-ms", "1800")], false))
        .await;
    assert_eq!(resp.status(), 200);
    let body = json_body(resp).await;
    assert_eq!(body["id"], "c1", "a's answer: {body}");
    // b's first token is cut, and its own retry, which fits beside that room, too: a's
    // retry is not due yet when b's is made (one due goes first: YA 2, below).
    assert_eq!(*arrivals.lock().unwrap(), ["a", "b", "b", "a"]);
}

/// Audit YA 2: a retry owed to a key that asked for a 1 s wait is due long before its peer,
/// hung, reaches its 2 s first-token limit; it is made then, ahead of the peer's own retry,
/// which hung 2 s more first (the client waited 4 s for a's answer, not 2).
#[tokio::test]
async fn an_owed_retry_due_goes_before_the_peers_own_retry() {
    let hangs = vec![(Duration::from_secs(30), Vec::new())];
    let (gw, arrivals) = limited_key_and_peer(vec![hangs]).await;
    let (resp, _c) = Conn::open(gw.addr)
        .await
        .send(chat_request(&[("x-request-budget-ms", "10000")], false))
        .await;
    assert_eq!(resp.status(), 200);
    let body = json_body(resp).await;
    assert_eq!(body["id"], "c1", "a's answer: {body}");
    assert_eq!(*arrivals.lock().unwrap(), ["a", "b", "a"]);
    let m = |s: &'static str| metric(gw.admin_addr, s);
    assert_eq!(
        m("hourglass_retries_total{reason=\"429\",route=\"chat\",upstream=\"primary\"}").await,
        1.0
    );
    assert_eq!(
        m("hourglass_retries_total{reason=\"first_token\",route=\"chat\",upstream=\"backup\"}")
            .await,
        0.0,
        "b's own retry was not needed"
    );
}

/// Audit YA 1: a peer's failure that no retry or fallback follows (its 401: its key revoked;
/// a 400) ended the request before the retry owed to the key that asked for a wait, which
/// would have answered. The owed retry is still made, and its answer is the client's; were
/// it to fail, the peer's answer would be kept as any answer replaced is.
#[tokio::test]
async fn a_peers_failure_not_retried_leaves_the_owed_retry() {
    for status in ["401 Unauthorized", "400 Bad Request"] {
        let (gw, arrivals) = limited_key_and_peer(vec![answer(Duration::ZERO, status, "")]).await;
        let (resp, _c) = Conn::open(gw.addr)
            .await
            .send(chat_request(&[], false))
            .await;
        assert_eq!(resp.status(), 200, "{status}");
        let body = json_body(resp).await;
        assert_eq!(body["id"], "c1", "{status}: a's answer: {body}");
        assert_eq!(*arrivals.lock().unwrap(), ["a", "b", "a"], "{status}");
    }
}

/// Audit TA 1: `upstream = a`, `balance_with = [b]`, `retries = 1`; a always answers 429
/// `retry-after: 2`, b answers 429 `retry-after: 1` and then 200. A request that started on
/// b moved on to a at once (SC 3), waited out a's longer wait, and ended with a's 429: b's
/// retry, which would have answered, was never made. The retries owed to both keys are
/// made, the one ready first first, so both requests (one starts on each) get b's 200.
#[tokio::test]
async fn a_balance_peer_does_not_cost_the_retry_a_retry_after_was_owed() {
    let limited = |ra: &str| {
        answer(
            Duration::ZERO,
            "429 Too Many Requests",
            &format!("retry-after: {ra}\r\n"),
        )
    };
    let (a, _) = scripted(vec![limited("2")]).await;
    let (b, b_asked) = scripted(vec![limited("1"), completion(), limited("1"), completion()]).await;
    let text = config(
        &a,
        &b,
        "retries = 1\nbalance_with = [\"backup\"]",
        "eject_after = 100",
        "eject_after = 100",
    );
    let gw = server::start(Config::from_toml(&text, "retry-test.toml").unwrap())
        .await
        .unwrap();
    // Equals take turns: one of the two starts on a, the other on b.
    for k in 0..2 {
        let (resp, _c) = Conn::open(gw.addr)
            .await
            .send(chat_request(&[], false))
            .await;
        assert_eq!(resp.status(), 200, "request {k}");
        read_body(resp.into_body()).await;
    }
    assert_eq!(b_asked.load(std::sync::atomic::Ordering::SeqCst), 4);
}

/// Break audit ZC 4: a peer's failure told as an error event before any output (a 200, then
/// an `authentication_error`: its key revoked) ended the request before the retry owed, as its
/// 401 had before YA 1. Such an answer is the same failure: the owed retry is made.
#[tokio::test]
async fn a_peers_error_event_before_output_leaves_the_owed_retry() {
    let event = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"authentication_error\",\"message\":\"invalid x-api-key\"}}\n\n";
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{event}",
        event.len()
    );
    let (gw, arrivals) =
        limited_key_and_peer(vec![vec![(Duration::ZERO, head.into_bytes())]]).await;
    let (resp, _c) = Conn::open(gw.addr)
        .await
        .send(chat_request(&[], true))
        .await;
    assert_eq!(resp.status(), 200);
    let body = json_body(resp).await;
    assert_eq!(body["id"], "c1", "a's answer: {body}");
    assert_eq!(*arrivals.lock().unwrap(), ["a", "b", "a"]);
}
