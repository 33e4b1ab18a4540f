//! Each limit, one at a time, over real sockets: the client sees the contracted error, the
//! upstream connection is closed, and the metric counts the right origin exactly once.
//!
//! On a loaded machine a timer fires late, never early: each limit is checked not to fire
//! before its time (exact lower bounds), and to be the cause (its code and its origin), with
//! upper bounds and `PROMPTLY` far below the next thing that could end the request (every
//! other limit and scripted wait is 10 s or more away).

use std::time::Duration;

use crate::support::*;
use tokio::time::Instant;

const ORIGINS: [&str; 7] = [
    "client",
    "deadline",
    "first_token",
    "idle",
    "connect",
    "insufficient_budget",
    "shutdown",
];

/// Asserts that exactly one cancellation was counted on `route`, with `origin`.
async fn assert_one_cancellation(h: &Harness, route: &str, origin: &str) {
    h.wait_requests(route, 1.0).await;
    for o in ORIGINS {
        let v = h
            .metric(&format!(
                "hourglass_cancellations_total{{origin=\"{o}\",route=\"{route}\"}}"
            ))
            .await;
        assert_eq!(v, if o == origin { 1.0 } else { 0.0 }, "origin {o}");
    }
    let cancelled = h
        .metric(&format!(
            "hourglass_requests_total{{outcome=\"cancelled\",route=\"{route}\"}}"
        ))
        .await;
    assert_eq!(cancelled, 1.0);
}

#[tokio::test]
async fn connect_limit() {
    let (_guard, addr) = hourglass_fake::never_accepting_listener().unwrap();
    let cfg = BASE
        .replace("{FAKE}", &format!("http://{addr}"))
        .replace("connect_timeout = \"500ms\"", "connect_timeout = \"300ms\"");
    let h = Harness::with_config(&cfg).await;
    let start = Instant::now();
    let (resp, _c) = h.chat(&[]).await;
    let took = start.elapsed();
    assert_eq!(resp.status(), 504);
    let v = json_body(resp).await;
    assert_eq!(v["error"]["code"], "connect_timeout");
    assert_eq!(v["error"]["type"], "timeout_error");
    assert_message_starts(
        &v["error"],
        "connect timeout: upstream \"fake\" not connected (name lookup, TCP and TLS) within 300ms",
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_one_cancellation(&h, "chat", "connect").await;
}

/// A 10 s connect timeout and a 250 ms budget: the budget ends the connect, where a request
/// sent after it would have less than `min_useful` (100 ms) left. hyper-util's pool sends the
/// request the moment it has a connection, so the wait cannot run on to the deadline and
/// then decide not to send (audit DC 1: a connect that took 1 s sent a request with 89 ms
/// left, told it had 1099).
#[tokio::test]
async fn connect_limit_is_capped_by_the_budget() {
    let (_guard, addr) = hourglass_fake::never_accepting_listener().unwrap();
    let h = Harness::with_config(
        &BASE
            .replace("{FAKE}", &format!("http://{addr}"))
            .replace("connect_timeout = \"500ms\"", "connect_timeout = \"10s\""),
    )
    .await;
    let start = Instant::now();
    let (resp, _c) = h.chat(&[("x-request-budget-ms", "250")]).await;
    let took = start.elapsed();
    assert_eq!(resp.status(), 504);
    let v = json_body(resp).await;
    assert_eq!(v["error"]["code"], "insufficient_budget");
    assert_message_starts(&v["error"], "insufficient budget: ");
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_one_cancellation(&h, "chat", "insufficient_budget").await;
}

#[tokio::test]
async fn first_token_limit_before_the_head() {
    let h = Harness::with_config(&BASE.replace(
        "first_token_timeout = \"2s\"",
        "first_token_timeout = \"300ms\"",
    ))
    .await;
    let start = Instant::now();
    let (resp, _c) = h.chat(&[("x-fake-ttft-ms", "20000")]).await;
    let cut_at = Instant::now();
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_eq!(resp.status(), 504);
    let v = json_body(resp).await;
    assert_eq!(v["error"]["code"], "first_token_timeout");
    assert_message_starts(&v["error"], "first token timeout: upstream \"fake\"");
    let delay = upstream_close_delay(&h.fake, cut_at).await;
    assert!(delay < PROMPTLY, "upstream closed {delay:?} after the cut");
    assert_one_cancellation(&h, "chat", "first_token").await;
}

#[tokio::test]
async fn first_token_limit_after_the_head() {
    let h = Harness::with_config(&BASE.replace(
        "first_token_timeout = \"2s\"",
        "first_token_timeout = \"300ms\"",
    ))
    .await;
    let (resp, _c) = h
        .chat(&[
            ("x-fake-ttft-ms", "20000"),
            ("x-fake-headers-first", "1"),
            ("x-fake-keepalive-ms", "50"),
        ])
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["cache-control"], "no-cache");
    assert_eq!(resp.headers()["x-accel-buffering"], "no");
    let read = read_body(resp.into_body()).await;
    let cut_at = Instant::now();
    assert!(read.error.is_none(), "SSE ends cleanly: {:?}", read.error);
    let err = read.error_event().expect("an error event");
    assert_eq!(err["code"], "first_token_timeout");
    assert_eq!(err["type"], "timeout_error");
    assert_message_starts(&err, "first token timeout: upstream \"fake\"");
    // Keep-alives were forwarded but did not count as tokens.
    assert!(read.text().contains(": keep-alive\n\n"));
    assert_eq!(read.text().matches("event: error").count(), 1);
    let delay = upstream_close_delay(&h.fake, cut_at).await;
    assert!(delay < PROMPTLY, "{delay:?}");
    assert_one_cancellation(&h, "chat", "first_token").await;
}

#[tokio::test]
async fn idle_limit() {
    let h =
        Harness::with_config(&BASE.replace("idle_timeout = \"1s\"", "idle_timeout = \"300ms\""))
            .await;
    // From before the request: the last token left after it, and the limit fires 300 ms
    // after that at the earliest, however late this client reads.
    let start = Instant::now();
    let (resp, _c) = h
        .chat(&[
            ("x-fake-freeze-after", "3"),
            ("x-fake-interval-ms", "10"),
            ("x-fake-keepalive-ms", "50"),
            ("x-fake-keepalive-kind", "ping"),
        ])
        .await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    let cut_at = Instant::now();
    let took = cut_at - start;
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(read.error.is_none());
    let err = read.error_event().expect("error event");
    assert_eq!(err["code"], "idle_timeout");
    // LiteLLM shows only this message: it says which limit fired.
    assert_message_starts(&err, "idle timeout: upstream \"fake\" was silent for 300ms");
    // role chunk + 3 tokens arrived, each a whole event, then the single error event.
    let text = read.text();
    assert_eq!(text.matches("\"content\":\"tok").count(), 3, "{text}");
    assert!(text.ends_with("\n\n"));
    let delay = upstream_close_delay(&h.fake, cut_at).await;
    assert!(delay < PROMPTLY, "{delay:?}");
    assert_one_cancellation(&h, "chat", "idle").await;
}

#[tokio::test]
async fn total_deadline_caps_a_trickle() {
    // The worst upstream: a slow first token, then a trickle that never goes idle long enough
    // for the idle limit, and would outlast the budget. The whole request ends by its deadline.
    let h = Harness::start().await;
    let start = Instant::now();
    let (resp, _c) = h
        .chat(&[
            ("x-request-budget-ms", "1500"),
            ("x-fake-ttft-ms", "700"),
            ("x-fake-chunks", "1000"),
            ("x-fake-interval-ms", "100"),
        ])
        .await;
    let read = read_body(resp.into_body()).await;
    let total = start.elapsed();
    assert!(
        total >= Duration::from_millis(1500) && total < Duration::from_secs(5),
        "{total:?}"
    );
    let err = read.error_event().expect("error event");
    assert_eq!(err["code"], "deadline_exceeded");
    assert_message_starts(
        &err,
        "deadline exceeded: the request's budget of 1500ms is spent",
    );
    let delay = upstream_close_delay(&h.fake, start + total).await;
    assert!(delay < PROMPTLY, "{delay:?}");
    assert_one_cancellation(&h, "chat", "deadline").await;
}

/// With a reserve, the stream is cut that much before the budget's end, and the message
/// says so: "the budget of 1500ms is spent" read wrong at 1300 ms.
#[tokio::test]
async fn a_deadline_cut_before_the_reserve_names_it() {
    let h = Harness::with_config(&BASE.replace(
        "idle_timeout = \"1s\"",
        "idle_timeout = \"1s\"\nreserve = \"200ms\"",
    ))
    .await;
    let (resp, _c) = h
        .chat(&[
            ("x-request-budget-ms", "1500"),
            ("x-fake-chunks", "1000"),
            ("x-fake-interval-ms", "100"),
        ])
        .await;
    let read = read_body(resp.into_body()).await;
    let err = read.error_event().expect("error event");
    assert_eq!(err["code"], "deadline_exceeded");
    assert_message_starts(
        &err,
        "deadline exceeded: the request's budget of 1500ms is spent, all but the 200ms held \
         in reserve",
    );
    // The same for a run's deadline.
    let h = Harness::with_config(&BASE.replace(
        "idle_timeout = \"1s\"",
        "idle_timeout = \"1s\"\nreserve = \"200ms\"\nrun_budget = \"1500ms\"",
    ))
    .await;
    let (resp, _c) = h
        .chat(&[
            ("x-run-id", "reserved"),
            ("x-fake-chunks", "1000"),
            ("x-fake-interval-ms", "100"),
        ])
        .await;
    let read = read_body(resp.into_body()).await;
    let err = read.error_event().expect("error event");
    assert_eq!(err["code"], "run_deadline_exceeded");
    assert_message_starts(
        &err,
        "run deadline exceeded: run \"reserved\" has spent its budget of 1500ms, all but the \
         200ms held in reserve",
    );
}

/// A JSON document's head waits for its first byte: an upstream that sent its head early
/// and then nothing gets the limit's JSON error, not a 200 whose body is then aborted. (A
/// document cut after its first byte is aborted: see `conformance.rs`.)
#[tokio::test]
async fn a_document_cut_before_its_first_byte_is_the_limits_error() {
    let h =
        Harness::with_config(&BASE.replace("idle_timeout = \"1s\"", "idle_timeout = \"300ms\""))
            .await;
    let req = chat_request(
        &[("x-fake-ttft-ms", "5000"), ("x-fake-headers-first", "1")],
        false,
    );
    let (resp, _c) = h.send(req).await;
    assert_eq!(resp.status(), 504);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "first_token_timeout", "{body}");
}

/// Audit ID 1: the gateway stopped (SIGSTOP, as a CPU throttle, `docker pause` or swapping
/// would stall it) past a limit while the upstream answered on time: its bytes waited in
/// the gateway's socket. Each wait is checked: the head, a held head's first token, the
/// first token of a head sent at once, and the idle limit mid-stream. Every answer is whole,
/// and the upstream is not blamed (with `eject_after = 1`, one false failure would eject it).
#[tokio::test]
async fn a_gateway_stalled_past_a_limit_does_not_blame_an_upstream_that_answered_on_time() {
    let fake = hourglass_fake::FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
budget = "30s"
first_token_timeout = "1s"
idle_timeout = "1s"

[upstreams.fake]
url = "{}"
auth = "none"
eject_after = 1

[[routes]]
name = "held"
path_prefix = "/v1/chat/completions"
models = ["held"]
upstream = "fake"
retries = 1
retry_on = ["first_token"]

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "fake"
"#,
        fake.url()
    );
    let gw = Process::spawn(&toml, &[], &[]).await;
    let pid = gw.pid().to_string();
    let signal = |sig: &str| {
        let status = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap();
        assert!(status.success());
    };
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], u64);
    // The model (and so the route), the script, and how long after the request the stop.
    let cases: [Case; 4] = [
        ("gpt-test", &[("x-fake-ttft-ms", "300")], 0),
        (
            "held",
            &[("x-fake-ttft-ms", "300"), ("x-fake-headers-first", "1")],
            0,
        ),
        (
            "gpt-test",
            &[("x-fake-ttft-ms", "300"), ("x-fake-headers-first", "1")],
            0,
        ),
        ("gpt-test", &[("x-fake-interval-ms", "100")], 250),
    ];
    for (n, (model, headers, stop_after)) in cases.into_iter().enumerate() {
        let mut req = chat_request(headers, true);
        *req.body_mut() = http_body_util::Full::new(bytes::Bytes::from(format!(
            r#"{{"model":"{model}","stream":true}}"#
        )));
        req.headers_mut()
            .insert("x-fake-chunks", http::HeaderValue::from_static("8"));
        let addr = gw.addr;
        let call = tokio::spawn(async move {
            let (resp, _c) = Conn::open(addr).await.send(req).await;
            (resp.status(), read_body(resp.into_body()).await)
        });
        assert!(fake.wait_for_requests(n + 1, Duration::from_secs(10)).await);
        tokio::time::sleep(Duration::from_millis(stop_after)).await;
        // Past the 1 s limit, while the upstream answers.
        signal("-STOP");
        tokio::time::sleep(Duration::from_millis(1800)).await;
        signal("-CONT");
        let (status, read) = call.await.unwrap();
        assert_eq!(status, 200, "case {n}: {}", read.text());
        assert!(read.error_event().is_none(), "case {n}: {}", read.text());
        assert_eq!(read.data_lines().last().map(String::as_str), Some("[DONE]"));
        let tokens = read
            .data_lines()
            .iter()
            .filter(|l| l.contains(r#""content":"tok"#))
            .count();
        assert_eq!(tokens, 8, "case {n}: {}", read.text());
    }
    let upstreams = admin_get(gw.admin, "/upstreams").await;
    let v: serde_json::Value = serde_json::from_str(&upstreams).unwrap();
    let fake_health = &v["upstreams"][0];
    assert_eq!(fake_health["failures_in_a_row"], 0, "{upstreams}");
    assert_eq!(fake_health["in_rotation"], true, "{upstreams}");
    gw.stop().await;
}

/// DeepSeek keeps a queued request that does not stream alive with blank lines before its
/// JSON document (audit WB 4). They are JSON whitespace, not the answer: the first token of
/// a document of a known format is its first other byte, so the first-token limit still
/// fires while only blank lines come, and the first-token time is the document's, not the
/// first blank line's.
#[tokio::test]
async fn a_documents_leading_blank_lines_are_no_first_token() {
    let doc = r#"{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
    // A blank line every 100 ms, `blank` of them, then the document; the body ends at close.
    let answer = |blank: usize| {
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n";
        let mut pieces = vec![(Duration::ZERO, head.as_bytes().to_vec())];
        for _ in 0..blank {
            pieces.push((Duration::from_millis(100), b"\n".to_vec()));
        }
        pieces.push((Duration::from_millis(100), doc.as_bytes().to_vec()));
        pieces
    };
    // Blank lines for a second against a first-token limit of 300 ms.
    let up = raw_upstream(answer(10)).await;
    let cfg = BASE.replace("{FAKE}", &format!("http://{up}")).replace(
        "first_token_timeout = \"2s\"",
        "first_token_timeout = \"300ms\"",
    );
    let h = Harness::with_config(&cfg).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 504);
    let v = json_body(resp).await;
    assert_eq!(v["error"]["code"], "first_token_timeout", "{v}");
    assert_one_cancellation(&h, "chat", "first_token").await;
    // Blank lines for 300 ms, then the document (at 400 ms or later), within the limit.
    let up = raw_upstream(answer(3)).await;
    let h = Harness::with_config(&BASE.replace("{FAKE}", &format!("http://{up}"))).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    let v = json_body(resp).await;
    assert_eq!(v["choices"][0]["message"]["content"], "hi", "{v}");
    h.wait_requests("chat", 1.0).await;
    let ttft = h
        .metric("hourglass_time_to_first_token_seconds_sum{route=\"chat\",upstream=\"fake\"}")
        .await;
    assert!(ttft >= 0.4, "first token at {ttft}s, before the document");
}
