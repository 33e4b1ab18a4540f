//! The scripted timing: injected statuses, the first-token wait, freezes, disconnects,
//! keep-alives and timestamps.

use super::*;

#[tokio::test]
async fn injected_status_after_ttft() {
    let fake = fake().await;
    let started = Instant::now();
    let headers = [("x-fake-status", "503"), ("x-fake-ttft-ms", "150")];
    let response = h1()
        .request(post(&fake, "/v1/messages", MESSAGES, &headers))
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
    // Anthropic's shape on its path, with its type for the status.
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "api_error");
    for (status, kind) in [("529", "overloaded_error"), ("403", "permission_error")] {
        let headers = [("x-fake-status", status)];
        let response = h1()
            .request(post(&fake, "/v1/messages", MESSAGES, &headers))
            .await
            .unwrap();
        assert_eq!(response.status().as_str(), status);
        let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
        assert_eq!(error["error"]["type"], kind);
    }
    // OpenAI's on the others.
    let headers = [("x-fake-status", "503")];
    let response = h1()
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
    assert_eq!(error["error"]["type"], "server_error");
}

/// The fake's own refusals on the Messages path are in Anthropic's shape too, as the real
/// API's are (audit U: a bad header or body got OpenAI's there).
#[tokio::test]
async fn refusals_on_the_messages_path_are_in_anthropics_shape() {
    let fake = fake().await;
    for (body, headers) in [("[1]", vec![]), (MESSAGES, vec![("x-fake-chunks", "many")])] {
        let response = h1()
            .request(post(&fake, "/v1/messages", body, &headers))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{body}");
        let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
        assert_eq!(error["type"], "error", "{error}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    }
    // OpenAI's on its own paths.
    let response = h1()
        .request(post(&fake, "/v1/chat/completions", "[1]", &[]))
        .await
        .unwrap();
    let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    assert!(error.get("type").is_none(), "{error}");
}

/// A status that is no error, or a non-streaming answer too large to build, is refused, not
/// obeyed. (A stream of any length is made as it goes.)
#[tokio::test]
async fn a_success_status_or_an_answer_too_large_to_build_is_refused() {
    let fake = fake().await;
    for header in [
        ("x-fake-status", "200"),
        ("x-fake-status", "302"),
        ("x-fake-chunks", "1000001"),
        ("x-fake-reasoning", "18446744073709551615"),
    ] {
        let response = h1()
            .request(post(&fake, "/v1/chat/completions", CHAT_FULL, &[header]))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{header:?}");
        let text = text_of(response).await;
        assert!(text.contains(header.0), "{text}");
    }
}

/// The counts a document is built of multiply: `n`, each token's `top_logprobs` and each
/// call's argument pieces count too, so no request makes a document past the bound
/// (audit U: 100,000 chunks with 20 top logprobs held 4 GB).
#[tokio::test]
async fn a_document_multiplied_past_the_bound_is_refused() {
    let fake = fake().await;
    for (body, headers) in [
        (
            r#"{"model":"m","logprobs":true,"top_logprobs":20,"messages":[]}"#,
            vec![("x-fake-chunks", "100000")],
        ),
        (
            r#"{"model":"m","n":128,"messages":[]}"#,
            vec![("x-fake-chunks", "10000")],
        ),
        (
            r#"{"model":"m","messages":[]}"#,
            vec![("x-fake-chunks", "600000"), ("x-fake-tool-call", "a+b")],
        ),
    ] {
        let response = h1()
            .request(post(&fake, "/v1/chat/completions", body, &headers))
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::BAD_REQUEST,
            "{body} {headers:?}"
        );
        let text = text_of(response).await;
        assert!(text.contains("more than the 1000000"), "{text}");
    }
    // Within the tokens, past the bytes (audit W): logprobs, and long arguments.
    let args = format!(r#"{{"blob":"{}"}}"#, "x".repeat(100_000));
    let calls = vec!["f"; 200].join("+");
    for (body, headers) in [
        (
            r#"{"model":"m","logprobs":true,"top_logprobs":19,"messages":[]}"#,
            vec![("x-fake-chunks", "50000")],
        ),
        (
            r#"{"model":"m","n":2,"messages":[]}"#,
            vec![
                ("x-fake-tool-call", calls.as_str()),
                ("x-fake-tool-args", args.as_str()),
            ],
        ),
    ] {
        let response = h1()
            .request(post(&fake, "/v1/chat/completions", body, &headers))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{body}");
        let text = text_of(response).await;
        assert!(text.contains("bytes a non-streaming answer"), "{text}");
    }
    // Within the bound, as before.
    let response = h1()
        .request(post(
            &fake,
            "/v1/chat/completions",
            r#"{"model":"m","n":2,"logprobs":true,"top_logprobs":2,"messages":[]}"#,
            &[("x-fake-chunks", "1000")],
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

/// A stream's counts multiply too: past 2^48 events they would wrap and the stream end
/// early, well framed, as if complete (audit GF 2: 2^64 - 1 chunks sent one token and no
/// `[DONE]`; `n` 2 of 2^63 none). Refused instead; at the bound, served.
#[tokio::test]
async fn a_stream_multiplied_past_its_bound_is_refused() {
    let fake = fake().await;
    for (path, body, chunks) in [
        (
            "/v1/chat/completions",
            r#"{"stream":true}"#,
            "18446744073709551615",
        ),
        (
            "/v1/chat/completions",
            r#"{"stream":true,"n":2}"#,
            "9223372036854775808",
        ),
        (
            "/v1/chat/completions",
            r#"{"stream":true,"n":2}"#,
            "140737488355329",
        ),
        ("/v1/messages", r#"{"stream":true}"#, "18446744073709551615"),
        ("/v1/responses", r#"{"stream":true}"#, "281474976710657"),
    ] {
        let headers = [("x-fake-chunks", chunks), ("x-fake-interval-ms", "0")];
        let response = h1()
            .request(post(&fake, path, body, &headers))
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::BAD_REQUEST,
            "{path} {body} {chunks}"
        );
        let text = text_of(response).await;
        assert!(text.contains("a stream may have"), "{text}");
    }
    let headers = [
        ("x-fake-chunks", "281474976710656"),
        ("x-fake-interval-ms", "0"),
    ];
    let response = h1()
        .request(post(
            &fake,
            "/v1/chat/completions",
            r#"{"stream":true}"#,
            &headers,
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn ttft_holds_back_the_head_unless_headers_first() {
    let fake = fake().await;
    let client = h1();
    let ttft = Duration::from_millis(300);
    let started = Instant::now();
    let headers = [("x-fake-ttft-ms", "300"), ("x-fake-interval-ms", "1")];
    let response = client
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    assert!(
        started.elapsed() >= ttft,
        "head after {:?}",
        started.elapsed()
    );
    let mut body = response.into_body();
    let frames = frames_until_quiet(&mut body, SECOND).await;
    // The data follows the head at once (well before a second ttft would have passed).
    assert!(frames[0].0.duration_since(started) < ttft * 2 + SECOND);

    // With the head first: a 1.5 s ttft, so "at once" has a second of room.
    let ttft = Duration::from_millis(1500);
    let started = Instant::now();
    let headers = [
        ("x-fake-ttft-ms", "1500"),
        ("x-fake-headers-first", "true"),
        ("x-fake-interval-ms", "1"),
    ];
    let response = client
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    assert!(
        started.elapsed() < SECOND,
        "head after {:?}",
        started.elapsed()
    );
    let mut body = response.into_body();
    let first = tokio::time::timeout(PATIENCE, body.frame())
        .await
        .expect("the first data within 5 s")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert!(started.elapsed() >= ttft);
    assert!(std::str::from_utf8(&first)
        .unwrap()
        .contains("\"role\":\"assistant\""));
}

#[tokio::test]
async fn freeze_after_holds_the_stream_open() {
    let fake = fake().await;
    let headers = [("x-fake-freeze-after", "2"), ("x-fake-interval-ms", "5")];
    let response = h1()
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    let mut body = response.into_body();
    let text: String = frames_until_quiet(&mut body, Duration::from_millis(300))
        .await
        .into_iter()
        .map(|f| f.1)
        .collect();
    let events = parse_sse(&text);
    assert_eq!(events.len(), 3, "role + 2 tokens, got {events:?}");
    assert!(text.contains("tok2 ") && !text.contains("tok3 ") && !text.contains("[DONE]"));
    assert!(!body.is_end_stream());
    assert_eq!(fake.open_connections(), 1);
    assert!(fake.requests()[0].finished_at.is_none());
}

#[tokio::test]
async fn disconnect_after_breaks_the_body() {
    // With no interval too: the tokens were written into hyper's buffer, and the abort
    // right behind them threw them away (curl saw no head at all).
    for interval in ["5", "0"] {
        for (version, client) in [(Version::HTTP_11, h1()), (Version::HTTP_2, h2())] {
            disconnect_after_two(version, client, interval).await;
        }
    }
}

async fn disconnect_after_two(version: Version, client: TestClient, interval: &str) {
    {
        let fake = fake().await;
        let headers = [
            ("x-fake-disconnect-after", "2"),
            ("x-fake-interval-ms", interval),
        ];
        let response = client
            .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
            .await
            .unwrap();
        let mut body = response.into_body();
        let mut text = String::new();
        let error = loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    text += std::str::from_utf8(&frame.into_data().unwrap()).unwrap()
                }
                Some(Err(error)) => break error,
                None => panic!("{version:?}: clean end after {text:?}"),
            }
        };
        assert!(
            text.contains("tok2 ") && !text.contains("tok3 "),
            "{text:?}"
        );
        // HTTP/1: the chunked body stops without its last chunk; h2: RST_STREAM.
        let expected = if version == Version::HTTP_2 {
            "Reset("
        } else {
            "UnexpectedEof"
        };
        assert!(
            format!("{error:?}").contains(expected),
            "{version:?}: {error:?}"
        );
        let request = fake.wait_request_finished(0, PATIENCE).await.unwrap();
        assert!(!request.completed);
        let open_after = usize::from(version == Version::HTTP_2);
        assert!(
            fake.wait_open_connections(open_after, PATIENCE).await,
            "{version:?}"
        );
    }
}

/// On a stream, `x-fake-disconnect-after: 0` aborts before the head: not a byte over
/// HTTP/1, a reset and no response over HTTP/2. (A document still gets its head: it has no
/// content events, and a count of 0 stops it before the body.)
#[tokio::test]
async fn disconnect_after_zero_on_a_stream_aborts_before_the_head() {
    let fake = fake().await;
    let mut stream = raw_post(&fake, &[("x-fake-disconnect-after", "0")]).await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut got))
        .await
        .expect("the connection is closed");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    let request = fake.wait_request_finished(0, PATIENCE).await.unwrap();
    assert!(!request.completed);

    let headers = [("x-fake-disconnect-after", "0")];
    let error = h2()
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .expect_err("no response");
    assert!(format!("{error:?}").contains("Reset("), "{error:?}");
}

#[tokio::test]
async fn keepalive_comments_during_headers_first_wait() {
    let fake = fake().await;
    let headers = [
        ("x-fake-headers-first", "1"),
        ("x-fake-ttft-ms", "250"),
        ("x-fake-keepalive-ms", "50"),
        ("x-fake-chunks", "1"),
        ("x-fake-interval-ms", "1"),
    ];
    let events = events_of(&h1(), &fake, "/v1/chat/completions", CHAT, &headers).await;
    let leading = events.iter().take_while(|e| e.comment).count();
    assert!((3..=5).contains(&leading), "{events:?}");
    assert!(
        events.iter().filter(|e| e.comment).count() == leading,
        "no keep-alive once data flows fast"
    );
    assert_eq!(events.last().unwrap().data, "[DONE]");
}

#[tokio::test]
async fn keepalive_pings_while_frozen() {
    let fake = fake().await;
    let headers = [
        ("x-fake-freeze-after", "1"),
        ("x-fake-keepalive-ms", "40"),
        ("x-fake-keepalive-kind", "ping"),
        ("x-fake-interval-ms", "1"),
    ];
    let response = h1()
        .request(post(&fake, "/v1/messages", MESSAGES, &headers))
        .await
        .unwrap();
    let mut body = response.into_body();
    // Read until four pings have come (however slowly a busy machine lets them), then
    // check they were not faster than every 40 ms.
    let started = Instant::now();
    let mut text = String::new();
    let pings = |text: &str| text.matches("event: ping\n").count();
    // The preamble holds a ping of its own, skipped below with the first four events.
    while pings(&text) < 5 || !text.ends_with("\n\n") {
        let frame = tokio::time::timeout(PATIENCE, body.frame())
            .await
            .unwrap_or_else(|_| panic!("not four pings in 5 s: {text:?}"));
        text += std::str::from_utf8(&frame.unwrap().unwrap().into_data().unwrap()).unwrap();
    }
    let events = parse_sse(&text);
    let pings = events
        .iter()
        .skip(4)
        .filter(|e| e.event.as_deref() == Some("ping"))
        .count();
    assert!(pings >= 4, "{events:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(40) * (pings as u32 - 1),
        "{pings} pings in {:?}",
        started.elapsed()
    );
    assert!(text.contains("event: ping\ndata: {\"type\":\"ping\"}\n\n"));
    assert!(!text.contains("tok2 "));
}

#[tokio::test]
async fn timestamps_mark_content_events() {
    let fake = fake().await;
    let headers = [
        ("x-fake-timestamps", "1"),
        ("x-fake-chunks", "3"),
        ("x-fake-interval-ms", "10"),
    ];
    let before = monotonic_ns();
    let events = events_of(&h1(), &fake, "/v1/chat/completions", CHAT, &headers).await;
    let after = monotonic_ns();
    let stamps: Vec<u64> = events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .filter_map(|e| json_of(e)["x_fake_sent_ns"].as_u64())
        .collect();
    assert_eq!(
        stamps.len(),
        3,
        "only content events carry stamps: {events:?}"
    );
    // In the order sent, within the call: the gaps themselves are the scheduler's (a tick
    // late under load is followed by one early, 6.6 ms apart at 10 ms), not the stamps'.
    assert!(stamps.windows(2).all(|w| w[1] > w[0]), "{stamps:?}");
    assert!(before < stamps[0] && stamps[2] <= after);
}

/// The preamble's tokens and every call's argument pieces are content events, counted in
/// order: with a preamble of 2 and 3 pieces a call, a freeze after 6 stops one piece into
/// the second of two parallel calls.
#[tokio::test]
async fn freeze_counts_the_preamble_and_every_calls_pieces() {
    let fake = fake().await;
    let headers = [
        ("x-fake-tool-call", "get_weather+get_time"),
        ("x-fake-tool-preamble", "2"),
        ("x-fake-chunks", "3"),
        ("x-fake-freeze-after", "6"),
        ("x-fake-interval-ms", "5"),
    ];
    let response = h1()
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    let mut body = response.into_body();
    let text: String = frames_until_quiet(&mut body, Duration::from_millis(300))
        .await
        .into_iter()
        .map(|f| f.1)
        .collect();
    let deltas: Vec<Value> = parse_sse(&text)
        .iter()
        .map(|e| json_of(e)["choices"][0]["delta"].clone())
        .collect();
    // The role, 2 tokens, the first call's opening and 3 pieces, the second's and 1 piece.
    assert_eq!(deltas.len(), 9, "{deltas:?}");
    assert_eq!(deltas[2]["content"], "tok2 ");
    assert_eq!(deltas[7]["tool_calls"][0]["function"]["name"], "get_time");
    assert_eq!(
        deltas[8]["tool_calls"][0],
        json!({"index": 1, "function": {"arguments": "{\"text\":\"tok1 "}})
    );
    assert!(!body.is_end_stream());
    assert!(fake.requests()[0].finished_at.is_none());
}
