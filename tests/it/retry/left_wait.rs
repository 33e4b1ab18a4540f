//! `x-should-retry: false` only where the gateway's attempts stood in for the SDK's retries:
//! not when the last upstream asked for a wait the gateway did not wait out (out of rotation,
//! or no room for it in the budget or the client's patience), and always when the wait asked
//! for runs past a budget the client set itself (audit AE 1 to 4).

use super::scripted::{answer, completion, rate_limited_after, scripted};
use super::*;

/// A gateway over `primary` and `backup` with `route`, each upstream given `extra`.
async fn gateway(primary: &str, backup: &str, route: &str, extra: &str) -> Running {
    let text = config(primary, backup, route, extra, extra);
    server::start(Config::from_toml(&text, "retry-test.toml").unwrap())
        .await
        .unwrap()
}

/// What the gateway's answer says of retrying, after its body was read.
async fn says(resp: http::Response<hyper::body::Incoming>) -> Option<String> {
    let says = resp
        .headers()
        .get("x-should-retry")
        .map(|v| v.to_str().unwrap().to_owned());
    read_body(resp.into_body()).await;
    says
}

fn calls(n: &std::sync::Arc<std::sync::atomic::AtomicUsize>) -> usize {
    n.load(std::sync::atomic::Ordering::SeqCst)
}

/// Audit AE 1: both keys of a balance group out of rotation, each answering 429 with
/// `Retry-After: 1`. Each is tried once (out of rotation: no retries), within the wait it asked
/// for, and nobody waits it out: the answer said not to retry, and the SDK lost a call it wins
/// after the wait. It leaves the retry to the SDK. Keys that fail without asking for a wait
/// (backoff-only 503s) still say not to: the SDK's retry would add nothing the gateway's
/// attempts did not.
#[tokio::test]
async fn keys_all_out_that_asked_for_a_wait_leave_the_retry_to_the_sdk() {
    let limited = rate_limited_after(Duration::ZERO, "1");
    let failing = answer(Duration::ZERO, "503 Service Unavailable", "");
    for (failure, expected) in [(limited, None), (failing, Some("false"))] {
        let (a, a_calls) = scripted(vec![failure.clone()]).await;
        let (b, b_calls) = scripted(vec![failure]).await;
        let gw = gateway(
            &a,
            &b,
            "retries = 1\nbalance_with = [\"backup\"]",
            "eject_after = 1\neject_for = \"30s\"",
        )
        .await;
        // The first request's failures take both keys out of rotation.
        let (resp, _c) = Conn::open(gw.addr)
            .await
            .send(chat_request(&[], false))
            .await;
        read_body(resp.into_body()).await;
        let before = calls(&a_calls) + calls(&b_calls);
        let (resp, _c) = Conn::open(gw.addr)
            .await
            .send(chat_request(&[], false))
            .await;
        let status = resp.status();
        assert_eq!(
            calls(&a_calls) + calls(&b_calls) - before,
            2,
            "each key once"
        );
        assert_eq!(says(resp).await.as_deref(), expected, "{status}");
        gw.shutdown().await;
    }
}

/// Audit AE 3: the client's read timeout (2 s, announced as the Python SDKs do) leaves room
/// for the first retry after a `Retry-After: 1`, not for the second: the SDK, whose timeout
/// is fresh on each of its retries, is left its retry, which the third answer (a 200) would
/// have won. It was told not to retry after two calls.
#[tokio::test]
async fn a_retry_cut_by_the_clients_patience_is_left_to_the_sdk() {
    let limited = rate_limited_after(Duration::ZERO, "1");
    let (url, asked) = scripted(vec![limited.clone(), limited, completion()]).await;
    let gw = gateway(&url, &url, "retries = 2", "").await;
    let (resp, _c) = Conn::open(gw.addr)
        .await
        .send(chat_request(&[("x-stainless-read-timeout", "2.0")], false))
        .await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    assert_eq!(says(resp).await, None);
    assert_eq!(
        calls(&asked),
        2,
        "the second retry did not fit the patience"
    );
}

/// The same with the route's budget (2 s, not the client's): the second retry's wait does not
/// fit what is left, and the SDK, whose next request has a budget of its own, is left the
/// retry that the gateway did not make.
#[tokio::test]
async fn a_retry_whose_wait_does_not_fit_the_routes_budget_is_left_to_the_sdk() {
    let limited = rate_limited_after(Duration::ZERO, "1");
    let (url, asked) = scripted(vec![limited.clone(), limited, completion()]).await;
    let gw = gateway(&url, &url, "retries = 2\nbudget = \"2s\"", "").await;
    let (resp, _c) = Conn::open(gw.addr)
        .await
        .send(chat_request(&[], false))
        .await;
    assert_eq!(resp.status(), 429);
    assert_eq!(says(resp).await, None);
    assert_eq!(calls(&asked), 2, "the second retry did not fit the budget");
}

/// Audit AE 4: a `Retry-After` longer than what is left of a budget the client set itself
/// says not to retry after a single attempt: the SDK's retry would come after the deadline
/// the client named (a 1 s budget took three calls and 4 s). With retries on the route it
/// says so too, though the retry not made left the wait (the deadline comes first). A budget
/// of the route's, or a wait that fits the client's, leaves the retry to the SDK.
#[tokio::test]
async fn a_wait_past_the_clients_own_budget_says_not_to_retry() {
    let cases: [(&str, Option<&str>, &str, Option<&str>); 4] = [
        ("", Some("1000"), "2", Some("false")),
        ("", Some("5000"), "2", None),
        ("", None, "10", None),
        ("retries = 2", Some("1000"), "2", Some("false")),
    ];
    for (route, budget, retry_after, expected) in cases {
        let (url, asked) = scripted(vec![rate_limited_after(Duration::ZERO, retry_after)]).await;
        let gw = gateway(&url, &url, route, "").await;
        let headers: Vec<_> = budget
            .map(|b| ("x-request-budget-ms", b))
            .into_iter()
            .collect();
        let (resp, _c) = Conn::open(gw.addr)
            .await
            .send(chat_request(&headers, false))
            .await;
        assert_eq!(resp.status(), 429);
        let case = format!("{route:?} budget {budget:?} retry-after {retry_after}");
        assert_eq!(says(resp).await.as_deref(), expected, "{case}");
        assert_eq!(calls(&asked), 1, "{case}");
        gw.shutdown().await;
    }
}

/// The rule still holds where the gateway's retries stood in for the SDK's: retries that
/// waited out each `Retry-After` and ran out, and retries after backoffs alone.
#[tokio::test]
async fn retries_that_waited_out_each_wait_say_not_to_retry() {
    let limited = rate_limited_after(Duration::ZERO, "0.3");
    let failing = answer(Duration::ZERO, "503 Service Unavailable", "");
    for (failure, n) in [(limited, 2), (failing, 3)] {
        let (url, asked) = scripted(vec![failure]).await;
        let route = format!("retries = {}", n - 1);
        let gw = gateway(&url, &url, &route, "").await;
        let (resp, _c) = Conn::open(gw.addr)
            .await
            .send(chat_request(&[], false))
            .await;
        let status = resp.status();
        assert_eq!(says(resp).await.as_deref(), Some("false"), "{status}");
        assert_eq!(calls(&asked), n, "{status}");
        gw.shutdown().await;
    }
}

/// An owed retry that no longer fits when its peer has failed (here: hung to the deadline of
/// the route's 1.2 s budget) leaves the wait its key asked for: the key's 429, kept, passes
/// through without `x-should-retry: false`, though two attempts were made.
#[tokio::test]
async fn an_owed_retry_that_no_longer_fits_leaves_the_wait_to_the_sdk() {
    let limited = rate_limited_after(Duration::ZERO, "1");
    let (a, a_calls) = scripted(vec![limited, completion()]).await;
    let (b, b_calls) = scripted(vec![vec![(Duration::from_secs(30), Vec::new())]]).await;
    let route = "retries = 1\nbalance_with = [\"backup\"]\nbudget = \"1200ms\"\n\
                 first_token_timeout = \"1200ms\"";
    let gw = gateway(&a, &b, route, "eject_after = 100").await;
    let (resp, _c) = Conn::open(gw.addr)
        .await
        .send(chat_request(&[], false))
        .await;
    assert_eq!(resp.status(), 429, "the key's answer, kept");
    assert_eq!(resp.headers()["retry-after"], "1");
    assert_eq!(says(resp).await, None);
    assert_eq!(
        (calls(&a_calls), calls(&b_calls)),
        (1, 1),
        "no owed retry made"
    );
}
