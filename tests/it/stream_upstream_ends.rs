//! How an assembled answer (`stream_upstream`, a client that does not stream) ends: whole,
//! whole but for the stream's own end, ended short, cut by a limit (partial, or the usual
//! error), or failed by what the upstream sent (an event that cannot be read, an answer that
//! is no stream, the provider's error); and what the client, the log and the metrics are
//! told in each case. The routes and helpers are `stream_upstream.rs`'s.

use std::time::Duration;

use super::stream_upstream::{chat, post, CONFIG};
use crate::support::{json_body, Harness};
use http_body_util::BodyExt;

/// An answer of two choices whose stream ends cleanly (no `[DONE]`) with one choice
/// finished and the other not has ended short: an upstream error, not a 200 that looks
/// whole. With both finished, it is the document.
#[tokio::test]
async fn a_stream_that_ends_before_every_choice_finished_ended_short() {
    let chunk = |index: u32, delta: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":{index},\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let start = [
        chunk(0, r#"{"role":"assistant","content":"Yes"}"#, "null"),
        chunk(1, r#"{"role":"assistant","content":"Well, "}"#, "null"),
        chunk(0, "{}", r#""stop""#),
        chunk(1, r#"{"content":"it"}"#, "null"),
    ]
    .concat();
    let body = r#"{"model":"watched","n":2,"messages":[{"role":"user","content":"hi"}]}"#;
    let h = Harness::with_config(CONFIG).await;
    h.fake.set_replay(Some(hourglass_fake::Replay::sse(
        &start,
        Duration::from_millis(1),
    )));
    let (resp, _c) = h.send(post("/v1/chat/completions", body.into(), &[])).await;
    assert_eq!(resp.status(), 502);
    let error = json_body(resp).await;
    assert_eq!(error["error"]["code"], "upstream_error");
    h.wait_requests("watched", 1.0).await;
    assert_eq!(
        h.metric("hourglass_requests_total{outcome=\"error\",route=\"watched\"}")
            .await,
        1.0
    );

    let whole = format!("{start}{}", chunk(1, "{}", r#""length""#));
    h.fake.set_replay(Some(hourglass_fake::Replay::sse(
        &whole,
        Duration::from_millis(1),
    )));
    let (resp, _c) = h.send(post("/v1/chat/completions", body.into(), &[])).await;
    assert_eq!(resp.status(), 200);
    let doc = json_body(resp).await;
    assert_eq!(doc["choices"][0]["finish_reason"], "stop");
    assert_eq!(doc["choices"][1]["finish_reason"], "length");
    assert_eq!(doc["choices"][1]["message"]["content"], "Well, it");

    // Choice 1 had not begun when the stream ended (or went silent past the idle limit):
    // the request's `n` says it was to come, so the answer is as short, for a client that
    // streams too. Without `n`, the one choice is the whole answer.
    let first_only = [
        chunk(0, r#"{"role":"assistant","content":"Yes"}"#, "null"),
        chunk(0, "{}", r#""stop""#),
    ]
    .concat();
    // The same with its usage chunk after it: still one choice of two.
    let usage = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\n";
    for stream in [first_only.clone(), format!("{first_only}{usage}")] {
        h.fake.set_replay(Some(hourglass_fake::Replay::sse(
            &stream,
            Duration::from_millis(1),
        )));
        let (resp, _c) = h.send(post("/v1/chat/completions", body.into(), &[])).await;
        assert_eq!(resp.status(), 502, "{stream}");
    }
    for (body, whole) in [
        (body.to_owned(), false),
        (body.replace(r#""n":2,"#, ""), true),
        (body.replace(r#""n":2,"#, r#""n":1,"#), true),
    ] {
        h.fake.set_replay(Some(hourglass_fake::Replay::sse(
            &first_only,
            Duration::from_millis(1),
        )));
        let (resp, _c) = h
            .send(post("/v1/chat/completions", body.clone(), &[]))
            .await;
        assert_eq!(resp.status(), if whole { 200 } else { 502 }, "{body}");
        h.fake.set_replay(Some(hourglass_fake::Replay::sse(
            &first_only,
            Duration::from_millis(1),
        )));
        let streamed = body.replacen('{', r#"{"stream":true,"#, 1);
        let (resp, _c) = h.send(post("/v1/chat/completions", streamed, &[])).await;
        assert_eq!(resp.status(), 200);
        let read = crate::support::read_body(resp.into_body()).await;
        match read.error_event() {
            Some(error) => {
                assert!(!whole, "{body}: {}", read.text());
                assert_eq!(error["code"], "upstream_error");
            }
            None => assert!(whole, "{body}: {}", read.text()),
        }
    }
    // Ended by `[DONE]`, the one choice of a provider that ignores `n` (Ollama, llama.cpp)
    // is its whole answer, as for a client that streams (audit N: a 502 after J1).
    let done = format!("{first_only}data: [DONE]\n\n");
    h.fake.set_replay(Some(hourglass_fake::Replay::sse(
        &done,
        Duration::from_millis(1),
    )));
    let (resp, _c) = h.send(post("/v1/chat/completions", body.into(), &[])).await;
    assert_eq!(resp.status(), 200);
    let doc = json_body(resp).await;
    assert_eq!(doc["choices"].as_array().map(Vec::len), Some(1), "{doc}");
    assert_eq!(doc["choices"][0]["finish_reason"], "stop");
}

/// An SDK that does not stream and says how long it waits (`x-stainless-timeout`, OpenAI's
/// and Anthropic's SDKs) sits silent through the whole assembled generation: the answer
/// ends before it gives up (at 90% of it, here 900 ms of 1 s), with what was generated on a
/// route with partial answers and as a 504 without, never a client that times out blind.
#[tokio::test]
async fn an_assembled_answer_ends_before_the_sdk_stops_waiting() {
    let h = Harness::with_config(CONFIG).await;
    let slow = [
        ("x-stainless-timeout", "1.0"),
        ("x-fake-chunks", "30"),
        ("x-fake-interval-ms", "100"),
    ];
    let start = tokio::time::Instant::now();
    let (resp, _c) = h.send(chat("partial", &slow)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-hourglass-partial"], "deadline_exceeded");
    let doc = json_body(resp).await;
    assert_eq!(doc["choices"][0]["finish_reason"], "length");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );

    let (resp, _c) = h.send(chat("watched", &slow)).await;
    assert_eq!(resp.status(), 504);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "deadline_exceeded", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    // What ran out is named: the client's own timeout, not the request's budget of 10 s.
    assert_eq!(
        message,
        "deadline exceeded: the answer was not whole 900ms after the request, when it had \
         to go out to reach the client before the timeout its SDK announced"
    );

    // A Node SDK's `1` is its timeout rounded down to the second; read as the 1 s it says
    // (a round timeout is the usual case, and the client must hear why before it leaves:
    // audit JA 2), the answer is cut at 900 ms as for an exact `1.0`.
    let node = [
        ("x-stainless-timeout", "1"),
        ("x-stainless-lang", "js"),
        ("x-fake-chunks", "30"),
        ("x-fake-interval-ms", "100"),
    ];
    let (resp, _c) = h.send(chat("watched", &node)).await;
    assert_eq!(resp.status(), 504);
    let body = json_body(resp).await;
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("deadline exceeded: the answer was not whole 900ms after"),
        "{message}"
    );
}

/// A thinking block the cut left before its signature is dropped from a partial Anthropic
/// answer (Anthropic never returns one unsigned, and sent back as the agent's turn it is
/// refused); with nothing else generated, the cut is the usual 504. A signed one is kept.
#[tokio::test]
async fn a_partial_answer_keeps_no_unsigned_thinking() {
    let h = Harness::with_config(CONFIG).await;
    let body = r#"{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
    let (resp, _c) = h
        .send(post(
            "/v1/messages",
            body.into(),
            &[("x-fake-reasoning", "5"), ("x-fake-freeze-after", "1")],
        ))
        .await;
    assert_eq!(resp.status(), 504);
    assert_eq!(json_body(resp).await["error"]["code"], "idle_timeout");

    let (resp, _c) = h
        .send(post(
            "/v1/messages",
            body.into(),
            &[
                ("x-fake-reasoning", "2"),
                ("x-fake-chunks", "100"),
                ("x-fake-interval-ms", "20"),
                ("x-fake-freeze-after", "6"),
            ],
        ))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-hourglass-partial"], "idle_timeout");
    let doc = json_body(resp).await;
    let content = doc["content"].as_array().unwrap();
    let thinking: Vec<_> = content.iter().filter(|b| b["type"] == "thinking").collect();
    assert_eq!(thinking.len(), 1, "{doc}");
    assert!(
        !thinking[0]["signature"].as_str().unwrap().is_empty(),
        "{doc}"
    );
    assert!(content.iter().any(|b| b["type"] == "text"), "{doc}");
}

/// An answer the upstream went silent after, with nothing missing but the stream's own end
/// (Anthropic's `message_stop` after the stop reason came, OpenAI's `[DONE]` after every
/// choice finished and the usage came), is whole: answered as complete, its stop reason as
/// the provider gave it, no `x-hourglass-partial`, counted as ok.
#[tokio::test]
async fn an_answer_whole_but_for_its_end_is_answered_as_complete() {
    let messages = [
        r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"city\":\"Paris\"}"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":12}}"#,
        r#"{"type":"message_stop"}"#,
    ];
    let chunk = |rest: &str| {
        format!(r#"{{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",{rest}}}"#)
    };
    let chat = [
        chunk(
            r#""choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]"#,
        ),
        chunk(r#""choices":[{"index":0,"delta":{},"finish_reason":"stop"}]"#),
        chunk(r#""choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}"#),
        "[DONE]".to_owned(),
    ];
    let sse =
        |events: &[&str]| -> String { events.iter().map(|e| format!("data: {e}\n\n")).collect() };
    let chat: Vec<&str> = chat.iter().map(String::as_str).collect();
    for (route, path, body, stream) in [
        (
            "messages",
            "/v1/messages",
            r#"{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#,
            sse(&messages),
        ),
        (
            "partial",
            "/v1/chat/completions",
            r#"{"model":"partial","messages":[{"role":"user","content":"hi"}]}"#,
            sse(&chat),
        ),
    ] {
        let h = Harness::with_config(CONFIG).await;
        h.fake.set_replay(Some(hourglass_fake::Replay::sse(
            &stream,
            Duration::from_millis(1),
        )));
        // Silent before its last event, past the 600 ms idle limit.
        let last = (stream.matches("\n\n").count() - 1).to_string();
        let (resp, _c) = h
            .send(post(path, body.into(), &[("x-fake-freeze-after", &last)]))
            .await;
        assert_eq!(resp.status(), 200, "{route}");
        assert!(
            resp.headers().get("x-hourglass-partial").is_none(),
            "{route}: whole, not partial"
        );
        let doc = json_body(resp).await;
        if route == "messages" {
            assert_eq!(doc["stop_reason"], "tool_use", "{doc}");
            assert_eq!(doc["content"][0]["input"]["city"], "Paris", "{doc}");
        } else {
            assert_eq!(doc["choices"][0]["finish_reason"], "stop", "{doc}");
            assert_eq!(doc["usage"]["total_tokens"], 4, "{doc}");
        }

        // The provider's error event in place of the stream's end took nothing from the
        // answer either: answered as an error, the SDK would retry (Anthropic's overload is
        // a 529) and the finished generation be paid for twice.
        let error = if route == "messages" {
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
        } else {
            "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"code\":null}}\n\n"
        };
        let cut = stream.trim_end().rfind("\n\n").unwrap() + 2;
        let errored = format!("{}{error}", &stream[..cut]);
        h.fake.set_replay(Some(hourglass_fake::Replay::sse(
            &errored,
            Duration::from_millis(1),
        )));
        let (resp, _c) = h.send(post(path, body.into(), &[])).await;
        assert_eq!(resp.status(), 200, "{route}: {errored}");
        let doc = json_body(resp).await;
        assert!(doc.get("error").is_none(), "{route}: {doc}");
        h.wait_requests(route, 2.0).await;
        assert_eq!(
            h.metric(&format!(
                "hourglass_requests_total{{outcome=\"ok\",route=\"{route}\"}}"
            ))
            .await,
            2.0,
            "{route}"
        );
        if route == "partial" {
            // Every choice finished, the usage chunk not come yet: the answer has ended, as
            // a streaming client's stream would (its usage then filled in).
            let finished = stream.find("\"finish_reason\":\"stop\"").unwrap();
            let at = finished + stream[finished..].find("\n\n").unwrap() + 2;
            let errored = format!("{}{error}", &stream[..at]);
            h.fake.set_replay(Some(hourglass_fake::Replay::sse(
                &errored,
                Duration::from_millis(1),
            )));
            let (resp, _c) = h.send(post(path, body.into(), &[])).await;
            assert_eq!(resp.status(), 200, "{errored}");
            let doc = json_body(resp).await;
            assert_eq!(doc["choices"][0]["finish_reason"], "stop", "{doc}");
            assert!(doc["usage"]["total_tokens"].as_u64().is_some(), "{doc}");
        }
        // Before the answer was whole, the error is the answer.
        let early = format!("{}{error}", &stream[..stream.find("\n\n").unwrap() + 2]);
        h.fake.set_replay(Some(hourglass_fake::Replay::sse(
            &early,
            Duration::from_millis(1),
        )));
        let (resp, _c) = h.send(post(path, body.into(), &[])).await;
        let want = if route == "messages" { 529 } else { 500 };
        assert_eq!(resp.status(), want, "{route}");
    }
}

/// A partial Anthropic answer whose prompt came from the cache: `input_tokens` is 0, or
/// not there, beside `cache_read_input_tokens`. The partial answer's usage never adds the
/// cache reads to `input_tokens` (they would be counted twice by a client that sums them).
#[tokio::test]
async fn a_partial_answer_counts_cache_reads_once() {
    for (usage, input) in [
        (
            r#"{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":1000,"output_tokens":1}"#,
            0,
        ),
        (r#"{"cache_read_input_tokens":1000,"output_tokens":1}"#, 0),
    ] {
        let stream = [
            format!(
                r#"{{"type":"message_start","message":{{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,"usage":{usage}}}}}"#
            ),
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.to_owned(),
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#.to_owned(),
            r#"{"type":"content_block_stop","index":0}"#.to_owned(),
        ]
        .iter()
        .map(|e| format!("data: {e}\n\n"))
        .collect::<String>();
        let h = Harness::with_config(CONFIG).await;
        h.fake.set_replay(Some(hourglass_fake::Replay::sse(
            &stream,
            Duration::from_millis(1),
        )));
        let body =
            r#"{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
        let (resp, _c) = h
            .send(post(
                "/v1/messages",
                body.into(),
                &[("x-fake-freeze-after", "3")],
            ))
            .await;
        assert_eq!(resp.status(), 200, "{usage}");
        assert_eq!(resp.headers()["x-hourglass-partial"], "idle_timeout");
        let doc = json_body(resp).await;
        assert_eq!(doc["usage"]["input_tokens"], input, "{usage}: {doc}");
        assert_eq!(doc["usage"]["cache_read_input_tokens"], 1000, "{usage}");
    }
}

/// The errors a `stream_upstream` call is answered with after the upstream's head came (the
/// provider's error event, a limit that cut the stream) keep what that head said of the
/// provider: its request id (Anthropic's `request-id`; an `x-request-id` of its own, kept
/// as `x-upstream-request-id`), which its support asks for, and its rate limits, which a
/// client paces itself by.
#[tokio::test]
async fn error_answers_after_the_head_keep_the_providers_ids_and_rate_limits() {
    let head = concat!(
        "HTTP/1.1 200 OK\r\n",
        "content-type: text/event-stream; charset=utf-8\r\n",
        "request-id: req_011CUpstream123\r\n",
        "x-request-id: req_upstream_7\r\n",
        "anthropic-ratelimit-requests-remaining: 49\r\n",
        "anthropic-ratelimit-tokens-reset: 2026-01-01T00:00:00Z\r\n",
        "x-ratelimit-remaining-tokens: 7\r\n",
        "connection: close\r\n\r\n",
    );
    let event = |e: &str| format!("data: {e}\n\n").into_bytes();
    let start = event(
        r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}"#,
    );
    let text = [
        event(r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#),
        event(r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}"#),
    ]
    .concat();
    let error = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n".to_vec();
    let silence = (Duration::from_secs(30), Vec::new());
    let now = |b: Vec<u8>| (Duration::ZERO, b);
    let cases = [
        (
            "provider error",
            vec![now(head.into()), now(start.clone()), now(error)],
            529,
        ),
        (
            "idle_timeout",
            vec![
                now(head.into()),
                now(start.clone()),
                now(text),
                silence.clone(),
            ],
            504,
        ),
        (
            "first_token_timeout",
            vec![now(head.into()), now(start), silence],
            504,
        ),
    ];
    for (name, answer, status) in cases {
        let up = crate::support::raw_upstream(answer).await;
        let config = format!(
            r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
budget = "10s"
first_token_timeout = "500ms"
idle_timeout = "300ms"

[upstreams.raw]
url = "http://{up}"
auth = "none"

[[routes]]
name = "messages"
path_prefix = "/v1/messages"
upstream = "raw"
stream_upstream = true
"#
        );
        let h = Harness::with_config(&config).await;
        let body =
            r#"{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
        let (resp, _c) = h.send(post("/v1/messages", body.into(), &[])).await;
        assert_eq!(resp.status(), status, "{name}");
        let headers = resp.headers().clone();
        for (header, value) in [
            ("request-id", "req_011CUpstream123"),
            ("x-upstream-request-id", "req_upstream_7"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-tokens-reset", "2026-01-01T00:00:00Z"),
            ("x-ratelimit-remaining-tokens", "7"),
        ] {
            assert_eq!(
                headers.get(header).map(|v| v.to_str().unwrap()),
                Some(value),
                "{name}: {header}"
            );
        }
        assert_eq!(headers["content-type"], "application/json", "{name}");
        let doc = json_body(resp).await;
        if status == 504 {
            assert_eq!(doc["error"]["code"], name, "{doc}");
        } else {
            assert_eq!(doc["error"]["type"], "overloaded_error", "{doc}");
        }
    }
}

/// The log's `bytes` (the upstream's bytes, and what the gateway wrote itself) of an answer
/// that is the provider's error object counts that object, the body the client got, not the
/// gateway's own error it replaced.
#[tokio::test]
async fn the_log_counts_the_bytes_of_the_providers_error_object() {
    let error = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    let stream = format!(
        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":5,\"output_tokens\":1}}}}}}\n\nevent: error\ndata: {error}\n\n"
    );
    let fake = hourglass_fake::FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    fake.set_replay(Some(hourglass_fake::Replay::sse(
        &stream,
        Duration::from_millis(1),
    )));
    let p = crate::support::Process::spawn(
        &CONFIG.replace("{FAKE}", &fake.url()),
        &["--log-format", "json"],
        &[],
    )
    .await;
    let body = r#"{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
    let (resp, _c) = crate::support::Conn::open(p.addr)
        .await
        .send(post("/v1/messages", body.into(), &[]))
        .await;
    assert_eq!(resp.status(), 529);
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    let (out, err) = p.stop().await;
    let line = format!("{out}{err}")
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        .map(|v| v.get("fields").cloned().unwrap_or(v))
        .find(|f| f.get("outcome").is_some())
        .expect("a request log line");
    assert_eq!(line["bytes"], stream.len() + got.len(), "{line}");
    assert_eq!(line["status"], 529, "{line}");
}

/// A client that leaves while its document is still being assembled got no answer: its log
/// line has no status (499 in the access format), as on any route that holds the head. The
/// upstream's 200 had been noted as the answer's status before the document was.
#[tokio::test]
async fn a_client_that_leaves_before_its_document_has_no_status() {
    let fake = hourglass_fake::FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let p = crate::support::Process::spawn(
        &CONFIG.replace("{FAKE}", &fake.url()),
        &["--log-format", "json"],
        &[],
    )
    .await;
    // Assembled; and a document not asked to stream, whose head waits for its first byte
    // (the upstream sent its head at once, its document 3 s later).
    let cases: [(&str, &[(&str, &str)]); 2] = [
        (
            "partial",
            &[("x-fake-chunks", "50"), ("x-fake-interval-ms", "100")],
        ),
        (
            "plain",
            &[("x-fake-ttft-ms", "3000"), ("x-fake-headers-first", "1")],
        ),
    ];
    for (i, (model, headers)) in cases.into_iter().enumerate() {
        let conn = crate::support::Conn::open(p.addr).await;
        let pending = tokio::spawn(conn.send(chat(model, headers)));
        assert!(fake.wait_for_requests(i + 1, Duration::from_secs(10)).await);
        tokio::time::sleep(Duration::from_millis(300)).await;
        pending.abort();
        let _ = pending.await;
        let line = p.request_lines(i + 1).await.swap_remove(i);
        assert_eq!(line["outcome"], "cancelled", "{line}");
        assert_eq!(line["origin"], "client", "{line}");
        assert_eq!(line.get("status"), None, "{model}: {line}");
    }
}

/// An event the gateway cannot read (not JSON, or cut short) is not skipped: a document
/// rebuilt without it would look whole and miss what it held. The answer is a 502 that
/// names the event, never the model's text, and the upstream is let go at once.
#[tokio::test]
async fn an_event_that_cannot_be_read_is_a_502_not_an_answer_without_it() {
    let chunk = |content: &str| {
        format!(
            r#"{{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{{"index":0,"delta":{{"content":"{content}"}},"finish_reason":null}}]}}"#
        )
    };
    let chat_end = [
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#.to_owned(),
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#.to_owned(),
        "[DONE]".to_owned(),
    ];
    let truncated = r#"{"id":"c1","choices":[{"index":0,"delta":{"content":"LOST"}"#.to_owned();
    let messages = |middle: &str| {
        vec![
            r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}"#.to_owned(),
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.to_owned(),
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"A"}}"#.to_owned(),
            middle.to_owned(),
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"B"}}"#.to_owned(),
            r#"{"type":"content_block_stop","index":0}"#.to_owned(),
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":3}}"#.to_owned(),
            r#"{"type":"message_stop"}"#.to_owned(),
        ]
    };
    let responses = vec![
        r#"{"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}"#.to_owned(),
        "{\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"A\"".to_owned(),
    ];
    let cases: Vec<(&str, &str, &str, Vec<String>, &str)> = vec![
        (
            "partial",
            "/v1/chat/completions",
            r#"{"model":"partial","messages":[{"role":"user","content":"hi"}]}"#,
            [
                vec![chunk("A"), truncated.clone(), chunk("B")],
                chat_end.to_vec(),
            ]
            .concat(),
            "event 2 of the stream is no Chat Completions event",
        ),
        (
            "watched",
            "/v1/chat/completions",
            r#"{"model":"watched","messages":[{"role":"user","content":"hi"}]}"#,
            [
                vec![chunk("A"), "not json at all".to_owned(), chunk("B")],
                chat_end.to_vec(),
            ]
            .concat(),
            "event 2 of the stream is no Chat Completions event",
        ),
        (
            "messages",
            "/v1/messages",
            r#"{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#,
            messages(
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"LO"#,
            ),
            "event 4 of the stream is no Anthropic Messages event",
        ),
        (
            "responses",
            "/v1/responses",
            r#"{"model":"m","input":"hi"}"#,
            responses,
            "event 2 of the stream is no Responses event",
        ),
    ];
    for (route, path, body, events, why) in cases {
        let h = Harness::with_config(CONFIG).await;
        let stream: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        h.fake.set_replay(Some(hourglass_fake::Replay::sse(
            &stream,
            Duration::from_millis(1),
        )));
        let (resp, _c) = h.send(post(path, body.into(), &[])).await;
        assert_eq!(resp.status(), 502, "{route}");
        let error = json_body(resp).await;
        assert_eq!(error["error"]["code"], "upstream_error", "{route}: {error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{route}: {message}");
        assert!(!message.contains("LO"), "{route}: {message}");
        h.wait_requests(route, 1.0).await;
        assert_eq!(
            h.metric(&format!(
                "hourglass_requests_total{{outcome=\"error\",route=\"{route}\"}}"
            ))
            .await,
            1.0,
            "{route}"
        );
    }
}

/// A Chat answer whose every choice finished is whole for the watchdog, and ends there
/// whether or not the usage chunk that follows comes: cut by the idle limit before it, or
/// from a provider that ignores `include_usage`. The document still has its usage, counted
/// or estimated, as the provider's unstreamed answer would (clients read
/// `usage.total_tokens`), on routes with and without partial answers.
#[tokio::test]
async fn a_chat_answer_without_its_usage_chunk_still_has_usage() {
    let chunk = |rest: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",{rest}}}\n\n"
        )
    };
    let answer = [
        chunk(r#""choices":[{"index":0,"delta":{"role":"assistant","content":"Hi there"},"finish_reason":null}]"#),
        chunk(r#""choices":[{"index":0,"delta":{},"finish_reason":"stop"}]"#),
    ]
    .concat();
    let usage =
        chunk(r#""choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}"#);
    for model in ["watched", "partial"] {
        let body =
            format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
        // Silent after the finish, past the 600 ms idle limit; then no usage at all.
        for (stream, freeze) in [
            (format!("{answer}{usage}data: [DONE]\n\n"), Some("2")),
            (format!("{answer}data: [DONE]\n\n"), None),
        ] {
            let h = Harness::with_config(CONFIG).await;
            h.fake.set_replay(Some(hourglass_fake::Replay::sse(
                &stream,
                Duration::from_millis(1),
            )));
            let headers: Vec<(&str, &str)> = freeze
                .map(|n| ("x-fake-freeze-after", n))
                .into_iter()
                .collect();
            let (resp, _c) = h
                .send(post("/v1/chat/completions", body.clone(), &headers))
                .await;
            assert_eq!(resp.status(), 200, "{model} {freeze:?}");
            assert!(resp.headers().get("x-hourglass-partial").is_none());
            let doc = json_body(resp).await;
            assert_eq!(doc["choices"][0]["message"]["content"], "Hi there", "{doc}");
            assert_eq!(doc["choices"][0]["finish_reason"], "stop", "{doc}");
            let total = doc["usage"]["total_tokens"].as_u64().unwrap_or(0);
            assert!(total > 0, "{model} {freeze:?}: {doc}");
            assert_eq!(
                doc["usage"]["prompt_tokens"].as_u64().unwrap_or(0)
                    + doc["usage"]["completion_tokens"].as_u64().unwrap_or(0),
                total,
                "{doc}"
            );
        }
    }
}

/// Asked to stream for a client that did not, an upstream that answers with an encoded
/// stream (it ignored `accept-encoding: identity`) or a body of no known type gives the
/// gateway nothing it can read into the document: the client, who waits for one JSON
/// document, gets a 502 that says what came, not those bytes passed on.
#[tokio::test]
async fn an_answer_that_cannot_be_read_into_the_document_is_a_502() {
    let sse = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    let head = |fields: &str, len: usize| {
        format!("HTTP/1.1 200 OK\r\n{fields}content-length: {len}\r\nconnection: close\r\n\r\n")
    };
    let gz = [0x1f_u8, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 1, 2, 3];
    for (answer, said) in [
        (
            [
                head(
                    "content-type: text/event-stream\r\ncontent-encoding: gzip\r\n",
                    gz.len(),
                )
                .into_bytes(),
                gz.to_vec(),
            ]
            .concat(),
            "in content-encoding \"gzip\"",
        ),
        (
            [head("", sse.len()).into_bytes(), sse.as_bytes().to_vec()].concat(),
            "with no content-type",
        ),
        (
            [
                head("content-type: text/plain\r\n", sse.len()).into_bytes(),
                sse.as_bytes().to_vec(),
            ]
            .concat(),
            "of type \"text/plain\"",
        ),
    ] {
        let up = crate::support::raw_upstream(vec![(Duration::ZERO, answer)]).await;
        let h = Harness::with_config(&CONFIG.replace("{FAKE}", &format!("http://{up}"))).await;
        let body = r#"{"model":"watched","messages":[{"role":"user","content":"hi"}]}"#;
        let (resp, _c) = h.send(post("/v1/chat/completions", body.into(), &[])).await;
        assert_eq!(resp.status(), 502, "{said}");
        let error = json_body(resp).await;
        assert_eq!(error["error"]["code"], "upstream_error", "{error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(said), "{message}");
    }
}

/// A stream that ends with its end marker (`[DONE]`, `message_stop`) before the answer was
/// whole (a Chat choice without its finish reason, no Anthropic stop reason, no Responses
/// `response.completed`) ended as short as one without the marker: 502, counted as an
/// error, even on a route with partial answers; never a 200 with a null stop reason (an
/// unfinished tool use dropped from it). Also when the upstream holds the stream open
/// after the marker. A client that streams gets the events as they came.
#[tokio::test]
async fn an_end_marker_before_the_answer_is_whole_ends_it_short() {
    let chat = [
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"finish_reason":null}]}"#,
        "[DONE]",
    ];
    let start = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}"#;
    let open_tool = [
        start,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"a\""}}"#,
        r#"{"type":"message_stop"}"#,
    ];
    let no_delta = [
        start,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_stop"}"#,
    ];
    let responses = [
        r#"{"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}"#,
        r#"{"type":"response.output_item.added","output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}"#,
        r#"{"type":"response.content_part.added","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}"#,
        r#"{"type":"response.output_text.delta","output_index":0,"content_index":0,"delta":"Hello"}"#,
        "[DONE]",
    ];
    let cases: [(&str, &str, &str, &[&str]); 4] = [
        (
            "partial",
            "/v1/chat/completions",
            r#"{"model":"partial","messages":[{"role":"user","content":"hi"}]}"#,
            &chat,
        ),
        (
            "messages",
            "/v1/messages",
            r#"{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#,
            &open_tool,
        ),
        (
            "messages",
            "/v1/messages",
            r#"{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#,
            &no_delta,
        ),
        (
            "responses",
            "/v1/responses",
            r#"{"model":"m","input":"hi"}"#,
            &responses,
        ),
    ];
    for (route, path, body, events) in cases {
        let stream: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        // The same, held open after the marker: the event after it never goes.
        let held = format!("{stream}: never sent\n\n");
        let freeze = events.len().to_string();
        let h = Harness::with_config(CONFIG).await;
        for (replay, headers) in [
            (&stream, vec![]),
            (&held, vec![("x-fake-freeze-after", freeze.as_str())]),
        ] {
            h.fake.set_replay(Some(hourglass_fake::Replay::sse(
                replay,
                Duration::from_millis(1),
            )));
            let (resp, _c) = h.send(post(path, body.into(), &headers)).await;
            assert_eq!(resp.status(), 502, "{route}: {replay}");
            assert!(resp.headers().get("x-hourglass-partial").is_none());
            let error = json_body(resp).await;
            assert_eq!(error["error"]["code"], "upstream_error", "{route}: {error}");
            let message = error["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("the stream ended before the answer did"),
                "{route}: {message}"
            );
        }
        h.wait_requests(route, 2.0).await;
        assert_eq!(
            h.metric(&format!(
                "hourglass_requests_total{{outcome=\"error\",route=\"{route}\"}}"
            ))
            .await,
            2.0,
            "{route}"
        );

        // A client that streams gets what the upstream sent, as it came.
        h.fake.set_replay(Some(hourglass_fake::Replay::sse(
            &stream,
            Duration::from_millis(1),
        )));
        let streamed = body.replacen('{', r#"{"stream":true,"#, 1);
        let (resp, _c) = h.send(post(path, streamed, &[])).await;
        assert_eq!(resp.status(), 200, "{route}");
        let read = crate::support::read_body(resp.into_body()).await;
        assert_eq!(read.text(), stream, "{route}");
    }
}

/// Audit UE 1, UE 2: the two readings of one stream agree. A stream with an invalid UTF-8
/// byte in a delta, or ended by `[DONE]` with more after it in its event, reaches a client
/// that streams as it came (a WHATWG decoder reads the byte as U+FFFD; openai-python ends at
/// data starting with `[DONE]`); the document rebuilt from it for one that does not stream
/// was a 502. It is the answer now, with the U+FFFD the streaming client reads.
#[tokio::test]
async fn a_stream_both_readings_take_alike_is_one_answer() {
    let chunk = |content: &[u8]| {
        [
            &br#"data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""#[..],
            content,
            br#""},"finish_reason":null}]}"#,
            b"\n\n",
        ]
        .concat()
    };
    let end = [
        &br#"data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#[..],
        b"\n\n",
        br#"data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#,
        b"\n\n",
    ]
    .concat();
    let h = Harness::with_config(CONFIG).await;
    let body = r#"{"model":"watched","messages":[{"role":"user","content":"hi"}]}"#;
    for (events, content) in [
        (
            vec![chunk(b"A\xffB"), end.clone(), b"data: [DONE]\n\n".to_vec()],
            "A\u{FFFD}B",
        ),
        (
            vec![chunk(b"Hi"), end.clone(), b"data: [DONE]x\n\n".to_vec()],
            "Hi",
        ),
        (
            vec![
                chunk(b"Hi"),
                end.clone(),
                b"data: [DONE]\ndata:\n\n".to_vec(),
            ],
            "Hi",
        ),
    ] {
        let stream = events.concat();
        let replay = || hourglass_fake::Replay {
            content_type: "text/event-stream",
            events: events
                .iter()
                .map(|e| bytes::Bytes::from(e.clone()))
                .collect(),
            interval: Duration::from_millis(1),
        };
        h.fake.set_replay(Some(replay()));
        let streamed = body.replacen('{', r#"{"stream":true,"#, 1);
        let (resp, _c) = h.send(post("/v1/chat/completions", streamed, &[])).await;
        assert_eq!(resp.status(), 200);
        let read = crate::support::read_body(resp.into_body()).await;
        assert_eq!(read.bytes, stream, "{content}: passed as it came");

        h.fake.set_replay(Some(replay()));
        let (resp, _c) = h.send(post("/v1/chat/completions", body.into(), &[])).await;
        assert_eq!(resp.status(), 200, "{content}");
        let doc = json_body(resp).await;
        assert_eq!(doc["choices"][0]["message"]["content"], content, "{doc}");
        assert_eq!(doc["choices"][0]["finish_reason"], "stop");
        assert_eq!(doc["usage"]["completion_tokens"], 1);
    }
    h.wait_requests("watched", 6.0).await;
    assert_eq!(
        h.metric("hourglass_requests_total{outcome=\"ok\",route=\"watched\"}")
            .await,
        6.0
    );
}
