use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The turn to probe an ejected upstream is claimed where the upstream is judged: while
/// one request holds it, the others pass the upstream over; once it is handed on, the next
/// takes it. (Judged first and claimed when the attempt started, two requests judging at
/// once both went to the upstream.)
#[tokio::test(start_paused = true)]
async fn the_probes_turn_is_claimed_where_the_upstream_is_judged() {
    let text = r#"
[upstreams.a]
url = "http://127.0.0.1:9"
auth = "none"
eject_after = 1
eject_for = "10s"

[upstreams.b]
url = "http://127.0.0.1:9"
auth = "none"
eject_after = 1

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "a"
fallbacks = ["b"]
"#;
    let config = std::sync::Arc::new(crate::config::Config::from_toml(text, "t.toml").unwrap());
    let metrics = std::sync::Arc::new(Metrics::new());
    let gateway =
        crate::gateway::Gateway::new(config, &metrics, None, crate::stream::signal::Signal::new())
            .unwrap();
    let route = &gateway.routes[0];
    let template = Template {
        method: http::Method::POST,
        path_and_query: http::uri::PathAndQuery::from_static("/v1/chat/completions"),
        headers: HeaderMap::new(),
        accept_encoding: None,
        body: bytes::Bytes::new(),
        bodies: crate::admission::BodyMemory::new(crate::admission::Bodies::Requests, 1 << 20),
        stream_upstream: false,
        partial_answers: false,
        model: None,
        choices: None,
        detached: None,
        generates: true,
    };
    let budget = crate::budget::BudgetRequest::from_headers(&HeaderMap::new())
        .unwrap()
        .resolve(&crate::config::DEFAULT_LIMITS, Instant::now());
    let chain = Order::of(route, Instant::now());
    let (a, b) = (&chain[0].upstream.health, &chain[1].upstream.health);
    let judge = || turn(chain, 0, &template, &budget, Instant::now());
    let is_probe = |t: &Turn<'_>| matches!(t, Turn::Go(Some(_)));

    assert!(matches!(judge(), Turn::Go(None)), "in rotation: no probe");
    a.report(
        Verdict::Failed("status_5xx"),
        Instant::now(),
        None,
        a.since(),
    );
    assert!(matches!(judge(), Turn::PassOver), "ejected, b in rotation");
    tokio::time::advance(Duration::from_secs(10)).await;
    let first = judge();
    assert!(is_probe(&first), "the ejection is over: this one probes");
    assert!(matches!(judge(), Turn::PassOver), "the turn is taken");
    assert!(matches!(judge(), Turn::PassOver), "the turn is taken");
    drop(first);
    let second = judge();
    assert!(is_probe(&second), "handed on");
    // With nothing later in rotation, the upstream is tried all the same.
    b.report(
        Verdict::Failed("status_5xx"),
        Instant::now(),
        None,
        b.since(),
    );
    assert!(matches!(judge(), Turn::Go(None)));
    drop(second);
}

#[tokio::test(start_paused = true)]
async fn what_counts_against_an_upstreams_health() {
    // connect 2s, first token 30s.
    let budget = crate::budget::BudgetRequest::from_headers(&HeaderMap::new())
        .unwrap()
        .resolve(&crate::config::DEFAULT_LIMITS, Instant::now());
    let up = || "u".to_owned();
    let v = |e: GatewayError| verdict(&Err(e), &budget);
    let connect = |after, sent| GatewayError::ConnectTimeout {
        upstream: up(),
        proxy: None,
        after,
        sent,
    };
    assert!(matches!(
        v(connect(Duration::from_secs(2), false)),
        Verdict::Failed(_)
    ));
    assert!(matches!(
        v(connect(Duration::from_secs(2), true)),
        Verdict::Failed(_)
    ));
    // Cut short by the budget, still slower than any healthy connect.
    assert!(matches!(
        v(connect(Duration::from_secs(1), false)),
        Verdict::Failed(_)
    ));
    assert_eq!(v(connect(ms(300), false)), Verdict::Neither);
    let first_token = |after| GatewayError::FirstTokenTimeout {
        upstream: up(),
        after,
        patience: false,
    };
    assert!(matches!(
        v(first_token(Duration::from_secs(30))),
        Verdict::Failed(_)
    ));
    assert_eq!(v(first_token(Duration::from_secs(12))), Verdict::Neither);
    for failed in [
        GatewayError::UpstreamUnavailable {
            upstream: up(),
            reason: "refused".into(),
            certificate: false,
        },
        GatewayError::UpstreamError {
            upstream: up(),
            reason: "reset".into(),
        },
    ] {
        assert!(matches!(v(failed), Verdict::Failed(_)));
    }
    for neither in [
        GatewayError::UpstreamRefused {
            upstream: up(),
            reason: "REFUSED_STREAM",
            unanswered: false,
        },
        GatewayError::ClientClosed,
        GatewayError::Starved {
            upstream: up(),
            starved: crate::error::Starved::Descriptors,
            reason: "tcp open error: Too many open files (os error 24)".into(),
        },
        GatewayError::DeadlineExceeded {
            budget: Duration::from_secs(60),
            reserve: Duration::ZERO,
            client_budget: false,
            patience: false,
            uploading: None,
        },
    ] {
        assert_eq!(v(neither), Verdict::Neither);
    }
}

/// The fallback keeps the room of a cut wait only when that wait is what ended the
/// attempt: a 5xx, a reset or a wait left whole say nothing of the cut.
#[tokio::test(start_paused = true)]
async fn a_fallbacks_room_is_kept_only_by_the_cut_wait_that_ended_the_attempt() {
    let switch = |connect, first_token| {
        Some(SwitchBy {
            at: Instant::now(),
            connect,
            first_token,
        })
    };
    let connect = GatewayError::ConnectTimeout {
        upstream: "a".into(),
        proxy: None,
        after: ms(500),
        sent: false,
    };
    let silent = GatewayError::ConnectTimeout {
        upstream: "a".into(),
        proxy: None,
        after: ms(500),
        sent: true,
    };
    let first_token = GatewayError::FirstTokenTimeout {
        upstream: "a".into(),
        after: ms(500),
        patience: false,
    };
    let reset = GatewayError::UpstreamError {
        upstream: "a".into(),
        reason: "reset".into(),
    };
    assert!(ended_by_cut(switch(true, false), &connect));
    assert!(!ended_by_cut(switch(false, true), &connect));
    for e in [&silent, &first_token] {
        assert!(ended_by_cut(switch(false, true), e));
        assert!(!ended_by_cut(switch(true, false), e));
    }
    assert!(!ended_by_cut(switch(true, true), &reset));
    assert!(!ended_by_cut(None, &first_token));
}

#[test]
fn backoff_grows_with_jitter_and_a_cap() {
    for _ in 0..100 {
        let b1 = backoff(1);
        assert!(b1 >= ms(50) && b1 < ms(100), "{b1:?}");
        let b3 = backoff(3);
        assert!(b3 >= ms(200) && b3 < ms(400), "{b3:?}");
        assert!(backoff(30) <= Duration::from_secs(2));
    }
}

/// A `Retry-After` longer than the backoff is the least wait, spread by up to a fifth
/// more so that clients refused together do not come back together; the spread takes
/// only a share of what the budget has past the wait asked for.
#[test]
fn a_retry_after_wait_is_spread_above_what_was_asked() {
    let roomy = Duration::from_secs(60);
    let s = Duration::from_secs(1);
    assert_eq!(retry_wait(Some(s), ms(80), 0.0, roomy), s);
    assert_eq!(retry_wait(Some(s), ms(80), 0.5, roomy), ms(1100));
    // Spread out, a herd of retries is no longer one instant.
    let waits: std::collections::BTreeSet<Duration> = (0..10)
        .map(|k| retry_wait(Some(s), ms(80), f64::from(k) / 10.0, roomy))
        .collect();
    assert_eq!(waits.len(), 10);
    assert_eq!(waits.last(), Some(&ms(1180)));
    // Only a quarter of what the budget has past the wait asked for: the rest is the
    // answer's time after its first token.
    assert_eq!(retry_wait(Some(s), ms(80), 0.5, ms(1200)), ms(1025));
    assert_eq!(retry_wait(Some(s), ms(80), 0.9, ms(900)), s);
    // At most 1 s, however long the wait asked.
    let minute = Duration::from_secs(60);
    assert_eq!(
        retry_wait(Some(minute), ms(80), 0.5, minute * 10),
        minute + ms(500)
    );
    // The backoff, jittered already, when longer or nothing was asked.
    assert_eq!(retry_wait(Some(ms(50)), ms(80), 0.9, roomy), ms(80));
    assert_eq!(retry_wait(None, ms(80), 0.9, roomy), ms(80));
}

/// The audit's case: a 20 s budget, `min_useful` 100 ms and a first attempt of 16 ms
/// leave a retry 19.884 s. After `retry-after: 15` the spread takes at most 1 s (not the
/// 4.884 s it took), and the answer keeps the 3.884 s past the wait it needs.
#[test]
fn the_spread_of_a_retry_after_wait_leaves_the_answer_its_time() {
    let fits = ms(19_884);
    let asked = Duration::from_secs(15);
    for k in 0..100 {
        let wait = retry_wait(Some(asked), ms(80), f64::from(k) / 100.0, fits);
        assert!(wait >= asked);
        assert!(wait - asked < Duration::from_secs(1), "{wait:?}");
        assert!(fits - wait > ms(3_884), "{wait:?}");
    }
    // Close to the budget's end, a quarter of what is left: 100 ms of 400 ms.
    let late = retry_wait(Some(asked), ms(80), 0.99, asked + ms(400));
    assert!(late > asked && late < asked + ms(100), "{late:?}");
}

#[test]
fn retry_after_forms() {
    let mut h = HeaderMap::new();
    assert_eq!(retry_after(&h), None);
    h.insert("retry-after", "2".parse().unwrap());
    assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
    h.insert("retry-after-ms", "350".parse().unwrap());
    assert_eq!(retry_after(&h), Some(ms(350)));
}

#[test]
fn retry_after_as_a_date() {
    let now = httpdate::parse_http_date("Wed, 21 Oct 2026 07:28:00 GMT").unwrap();
    let mut h = HeaderMap::new();
    h.insert(
        "retry-after",
        "Wed, 21 Oct 2026 07:28:03 GMT".parse().unwrap(),
    );
    assert_eq!(retry_after_at(&h, now), Some(Duration::from_secs(3)));
    // A date already past asks for no wait.
    h.insert(
        "retry-after",
        "Wed, 21 Oct 2026 07:27:00 GMT".parse().unwrap(),
    );
    assert_eq!(retry_after_at(&h, now), Some(Duration::ZERO));
    // The upstream's Date is the clock the date is read against.
    h.insert(
        "retry-after",
        "Wed, 21 Oct 2026 09:00:05 GMT".parse().unwrap(),
    );
    h.insert("date", "Wed, 21 Oct 2026 09:00:00 GMT".parse().unwrap());
    assert_eq!(retry_after_at(&h, now), Some(Duration::from_secs(5)));
    // Not a date, nor a number: no wait asked.
    h.insert("retry-after", "soon".parse().unwrap());
    assert_eq!(retry_after_at(&h, now), None);
    // More than a day away is a wait no budget fits, never none.
    h.remove("date");
    h.insert(
        "retry-after",
        "Fri, 23 Oct 2026 07:28:00 GMT".parse().unwrap(),
    );
    assert_eq!(retry_after_at(&h, now), Some(LONGEST_RETRY_AFTER));
    for (name, v) in [
        ("retry-after", "100000"),
        ("retry-after", "inf"),
        ("retry-after-ms", "90000000"),
    ] {
        let mut h = HeaderMap::new();
        h.insert(name, v.parse().unwrap());
        assert_eq!(retry_after_at(&h, now), Some(LONGEST_RETRY_AFTER), "{v}");
    }
    for v in ["NaN", "-5"] {
        let mut h = HeaderMap::new();
        h.insert("retry-after", v.parse().unwrap());
        assert_eq!(retry_after_at(&h, now), None, "{v}");
    }
}
