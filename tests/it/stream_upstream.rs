//! Clients that do not stream, on routes with `stream_upstream`: the upstream is asked to
//! stream, the first-token and idle limits watch it, and the client gets the one document;
//! with `partial_answers`, what was generated when a limit cut it.

use std::time::Duration;

use crate::support::{json_body, reason_phrase, Harness};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;

const CONFIG: &str = r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
budget = "10s"
max_budget = "30s"
connect_timeout = "500ms"
first_token_timeout = "5s"
idle_timeout = "600ms"

[upstreams.fake]
url = "{FAKE}"
auth = "none"

[[routes]]
name = "plain"
path_prefix = "/v1/chat/completions"
models = ["plain"]
upstream = "fake"

[[routes]]
name = "watched"
path_prefix = "/v1/chat/completions"
models = ["watched"]
upstream = "fake"
stream_upstream = true

[[routes]]
name = "partial"
path_prefix = "/v1/chat/completions"
models = ["partial"]
upstream = "fake"
stream_upstream = true
partial_answers = true

[[routes]]
name = "others"
path_prefix = "/v1/embeddings"
upstream = "fake"
stream_upstream = true
partial_answers = true

[[routes]]
name = "messages"
path_prefix = "/v1/messages"
upstream = "fake"
stream_upstream = true
partial_answers = true

[[routes]]
name = "responses"
path_prefix = "/v1/responses"
upstream = "fake"
stream_upstream = true
partial_answers = true
"#;

fn post(path: &str, body: String, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::post(path)
        .header("host", "gateway")
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::from(body))).unwrap()
}

fn chat(model: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    post("/v1/chat/completions", body, headers)
}

fn forwarded_body(h: &Harness, i: usize) -> serde_json::Value {
    serde_json::from_slice(&h.fake.requests()[i].body).unwrap()
}

#[tokio::test]
async fn a_plain_call_is_sent_as_a_stream_and_answered_with_the_document() {
    let h = Harness::with_config(CONFIG).await;
    let (resp, _c) = h.send(chat("watched", &[("x-fake-chunks", "3")])).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert!(resp.headers().contains_key("content-length"));
    assert!(!resp.headers().contains_key("x-accel-buffering"));
    let doc = json_body(resp).await;
    assert_eq!(doc["object"], "chat.completion");
    assert_eq!(doc["choices"][0]["message"]["content"], "tok1 tok2 tok3 ");
    assert_eq!(doc["choices"][0]["finish_reason"], "stop");
    assert!(
        doc["usage"]["completion_tokens"].as_u64().is_some(),
        "{doc}"
    );
    let sent = forwarded_body(&h, 0);
    assert_eq!(sent["stream"], true);
    assert_eq!(sent["stream_options"]["include_usage"], true);
    h.wait_requests("watched", 1.0).await;
    assert_eq!(
        h.metric("hourglass_stream_upstream_total{route=\"watched\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn a_route_without_it_forwards_the_request_as_the_client_sent_it() {
    let h = Harness::with_config(CONFIG).await;
    let (resp, _c) = h.send(chat("plain", &[])).await;
    assert_eq!(resp.status(), 200);
    json_body(resp).await;
    assert!(forwarded_body(&h, 0).get("stream").is_none());
}

#[tokio::test]
async fn a_frozen_generation_fails_after_the_idle_limit_not_the_budget() {
    let h = Harness::with_config(CONFIG).await;
    let start = Instant::now();
    let (resp, _c) = h
        .send(chat(
            "watched",
            &[("x-fake-chunks", "10"), ("x-fake-freeze-after", "2")],
        ))
        .await;
    assert_eq!(resp.status(), 504);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "idle_timeout");
    crate::support::assert_message_starts(&body["error"], "idle timeout: upstream \"fake\"");
    // Its first token came, of a 200: counted as a streaming client's would be, though the
    // client's answer is a 504.
    assert_eq!(
        h.metric(
            "hourglass_time_to_first_token_seconds_count{route=\"watched\",upstream=\"fake\"}"
        )
        .await,
        1.0
    );
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(600) && took < Duration::from_secs(8),
        "the 10 s budget did not have to pass: {took:?}"
    );
}

#[tokio::test]
async fn a_deadline_mid_generation_returns_what_was_generated() {
    let h = Harness::with_config(CONFIG).await;
    let (resp, _c) = h
        .send(chat(
            "partial",
            &[
                ("x-request-budget-ms", "1000"),
                ("x-fake-chunks", "100"),
                ("x-fake-interval-ms", "100"),
            ],
        ))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-hourglass-partial"], "deadline_exceeded");
    let doc = json_body(resp).await;
    let choice = &doc["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    let text = choice["message"]["content"].as_str().unwrap();
    assert!(text.starts_with("tok1 tok2 "), "{text}");
    assert!(doc["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    h.wait_requests("partial", 1.0).await;
    assert_eq!(
        h.metric("hourglass_partial_answers_total{origin=\"deadline\",route=\"partial\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn with_no_output_yet_a_cut_is_the_usual_504() {
    let h = Harness::with_config(CONFIG).await;
    let (resp, _c) = h
        .send(chat(
            "partial",
            &[("x-request-budget-ms", "500"), ("x-fake-ttft-ms", "3000")],
        ))
        .await;
    assert_eq!(resp.status(), 504);
    assert!(resp.headers().get("x-hourglass-partial").is_none());
    assert_eq!(json_body(resp).await["error"]["code"], "deadline_exceeded");
}

/// A tool call cut mid-way is dropped from a partial answer (its arguments are not JSON):
/// with nothing else generated, there is no partial answer to give, on any of the three
/// APIs, and the cut is answered as with no output at all.
#[tokio::test]
async fn a_cut_that_leaves_only_half_a_tool_call_is_the_usual_504() {
    let h = Harness::with_config(CONFIG).await;
    let cut = [
        ("x-request-budget-ms", "800"),
        ("x-fake-tool-call", "get_weather"),
        ("x-fake-chunks", "50"),
        ("x-fake-interval-ms", "100"),
    ];
    let (resp, _c) = h.send(chat("partial", &cut)).await;
    assert_eq!(resp.status(), 504);
    assert!(resp.headers().get("x-hourglass-partial").is_none());
    assert_eq!(json_body(resp).await["error"]["code"], "deadline_exceeded");
    for (path, body) in [
        (
            "/v1/messages",
            r#"{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#,
        ),
        ("/v1/responses", r#"{"model":"gpt","input":"hi"}"#),
    ] {
        let (resp, _c) = h.send(post(path, body.into(), &cut)).await;
        assert_eq!(resp.status(), 504, "{path}");
        assert_eq!(
            json_body(resp).await["error"]["code"],
            "deadline_exceeded",
            "{path}"
        );
    }
}

/// An answer that said something, then called two tools at once, frozen one piece into the
/// second call's arguments: after the idle limit, each API's partial answer holds the text
/// and the first, whole call, never the unfinished second, and says it was cut.
#[tokio::test]
async fn a_partial_answer_keeps_the_text_and_the_whole_calls_of_parallel_calls() {
    let h = Harness::with_config(CONFIG).await;
    let args = r#"{"city":"Paris"}"#;
    // Content events: 2 preamble tokens, 3 pieces of the first call, 1 of the second.
    let frozen = [
        ("x-fake-id", "par"),
        ("x-fake-tool-call", "get_weather+get_time"),
        ("x-fake-tool-preamble", "2"),
        ("x-fake-tool-args", args),
        ("x-fake-chunks", "3"),
        ("x-fake-interval-ms", "10"),
        ("x-fake-freeze-after", "6"),
    ];
    let partial = |resp: &http::Response<hyper::body::Incoming>, api: &str| {
        assert_eq!(resp.status(), 200, "{api}");
        assert_eq!(
            resp.headers()["x-hourglass-partial"],
            "idle_timeout",
            "{api}"
        );
        assert_eq!(resp.headers()["content-type"], "application/json", "{api}");
    };

    let (resp, _c) = h.send(chat("partial", &frozen)).await;
    partial(&resp, "chat");
    let doc = json_body(resp).await;
    let choice = &doc["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{doc}");
    assert_eq!(choice["message"]["content"], "tok1 tok2 ", "{doc}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "the unfinished call is left out: {doc}");
    assert_eq!(calls[0]["id"], "call_par");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], args);
    assert!(
        doc["usage"]["completion_tokens"].as_u64().unwrap() > 0,
        "{doc}"
    );

    let body = r#"{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
    let (resp, _c) = h.send(post("/v1/messages", body.into(), &frozen)).await;
    partial(&resp, "messages");
    let doc = json_body(resp).await;
    assert_eq!(doc["stop_reason"], "max_tokens", "{doc}");
    let content = doc["content"].as_array().unwrap();
    assert_eq!(
        content.len(),
        2,
        "the unfinished tool_use is left out: {doc}"
    );
    assert_eq!(content[0]["type"], "text");
    assert_eq!(content[0]["text"], "tok1 tok2 ");
    assert_eq!(content[1]["type"], "tool_use");
    assert_eq!(content[1]["id"], "toolu_par");
    assert_eq!(content[1]["name"], "get_weather");
    assert_eq!(content[1]["input"], serde_json::json!({"city": "Paris"}));
    assert!(doc["usage"]["output_tokens"].as_u64().unwrap() > 0, "{doc}");

    let body = r#"{"model":"gpt","input":"hi"}"#;
    let (resp, _c) = h.send(post("/v1/responses", body.into(), &frozen)).await;
    partial(&resp, "responses");
    let doc = json_body(resp).await;
    assert_eq!(doc["status"], "incomplete", "{doc}");
    let output = doc["output"].as_array().unwrap();
    assert_eq!(
        output.len(),
        2,
        "the unfinished call item is left out: {doc}"
    );
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[0]["content"][0]["text"], "tok1 tok2 ");
    assert_eq!(output[1]["type"], "function_call");
    assert_eq!(output[1]["call_id"], "call_par");
    assert_eq!(output[1]["name"], "get_weather");
    assert_eq!(output[1]["arguments"], args);
    // Both items were done before the cut: neither is left `in_progress`.
    assert_eq!(output[0]["status"], "completed", "{doc}");
    assert_eq!(output[1]["status"], "completed", "{doc}");
    assert!(doc["usage"]["output_tokens"].as_u64().unwrap() > 0, "{doc}");
}

#[tokio::test]
async fn messages_and_responses_are_assembled_and_cut_the_same_way() {
    let h = Harness::with_config(CONFIG).await;
    let body = r#"{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
    let (resp, _c) = h
        .send(post("/v1/messages", body.into(), &[("x-fake-chunks", "2")]))
        .await;
    assert_eq!(resp.status(), 200);
    let doc = json_body(resp).await;
    assert_eq!(doc["type"], "message");
    assert_eq!(doc["content"][0]["text"], "tok1 tok2 ");
    assert_eq!(doc["stop_reason"], "end_turn");
    let (resp, _c) = h
        .send(post(
            "/v1/messages",
            body.into(),
            &[
                ("x-request-budget-ms", "800"),
                ("x-fake-chunks", "100"),
                ("x-fake-interval-ms", "100"),
            ],
        ))
        .await;
    assert_eq!(resp.headers()["x-hourglass-partial"], "deadline_exceeded");
    let doc = json_body(resp).await;
    assert_eq!(doc["stop_reason"], "max_tokens");

    let body = r#"{"model":"gpt","input":"hi"}"#;
    let (resp, _c) = h
        .send(post(
            "/v1/responses",
            body.into(),
            &[("x-fake-chunks", "2")],
        ))
        .await;
    assert_eq!(resp.status(), 200);
    let doc = json_body(resp).await;
    assert_eq!(doc["object"], "response");
    assert_eq!(doc["status"], "completed");
    let whole_usage = doc["usage"].clone();
    let (resp, _c) = h
        .send(post(
            "/v1/responses",
            body.into(),
            &[
                ("x-request-budget-ms", "800"),
                ("x-fake-chunks", "100"),
                ("x-fake-interval-ms", "100"),
            ],
        ))
        .await;
    assert_eq!(resp.headers()["x-hourglass-partial"], "deadline_exceeded");
    let doc = json_body(resp).await;
    assert_eq!(doc["status"], "incomplete");
    assert_eq!(doc["incomplete_details"]["reason"], "max_output_tokens");
    // The usage a cut answer is given has every field a whole one has (the SDKs' models
    // require them): the same keys at every level.
    fn keys(v: &serde_json::Value) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(o) = v.as_object() {
            for (k, inner) in o {
                out.push(k.clone());
                out.extend(keys(inner).into_iter().map(|i| format!("{k}.{i}")));
            }
        }
        out.sort();
        out
    }
    assert_eq!(keys(&doc["usage"]), keys(&whole_usage), "{}", doc["usage"]);
}

#[tokio::test]
async fn a_client_that_streams_itself_is_streamed_to_as_always() {
    let h = Harness::with_config(CONFIG).await;
    let body = r#"{"model":"watched","stream":true,"messages":[]}"#;
    let (resp, _c) = h
        .send(post(
            "/v1/chat/completions",
            body.into(),
            &[("x-fake-chunks", "2")],
        ))
        .await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(text.starts_with(b"data: "));
}

#[tokio::test]
async fn an_answer_past_max_response_body_is_a_502_and_stops_the_upstream_at_once() {
    let config = CONFIG.replace(
        "admin_listen = \"127.0.0.1:0\"\n",
        "admin_listen = \"127.0.0.1:0\"\nmax_response_body = 2048\n",
    );
    let h = Harness::with_config(&config).await;
    // Ten seconds of generation: read to its end, it would meet the 10 s deadline first.
    let (resp, _c) = h
        .send(chat(
            "watched",
            &[("x-fake-chunks", "10000"), ("x-fake-interval-ms", "1")],
        ))
        .await;
    assert_eq!(resp.status(), 502);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "upstream_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("max_response_body (2048 bytes)"),
        "{message}"
    );
    let conn = h.fake.connections()[0].id;
    h.fake
        .wait_closed(conn, Duration::from_secs(5))
        .await
        .expect("the upstream connection was closed, not read to its end");
    assert!(!h.fake.requests()[0].completed);
    h.wait_requests("watched", 1.0).await;
    assert_eq!(
        h.metric("hourglass_requests_total{outcome=\"error\",route=\"watched\"}")
            .await,
        1.0,
        "an error, though the stream was read without one"
    );
}

/// The fake asked directly without streaming, and through a `stream_upstream` route (which
/// streams it and assembles the stream): the same document, value for value.
async fn assert_same_answer(
    h: &Harness,
    name: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) {
    let mut all = vec![
        ("x-fake-id", "eq1"),
        ("x-fake-chunks", "3"),
        ("x-fake-interval-ms", "1"),
    ];
    all.extend_from_slice(headers);
    let (direct, _d) = crate::support::Conn::open(h.fake.addr())
        .await
        .send(post(path, body.into(), &all))
        .await;
    assert_eq!(direct.status(), 200, "{name}");
    let direct = json_body(direct).await;
    let (through, _c) = h.send(post(path, body.into(), &all)).await;
    assert_eq!(through.status(), 200, "{name}");
    assert!(
        through.headers().get("x-hourglass-partial").is_none(),
        "{name}"
    );
    let through = json_body(through).await;
    assert_eq!(through, direct, "{name}: through the gateway, then direct");
    let sent = serde_json::from_slice::<serde_json::Value>(
        h.fake.requests().last().unwrap().body.as_ref(),
    )
    .unwrap();
    assert_eq!(sent["stream"], true, "{name}: the gateway streamed it");
}

#[tokio::test]
async fn every_shape_is_assembled_into_the_document_the_provider_answers() {
    let h = Harness::with_config(CONFIG).await;
    let chat = |extra: &str| {
        format!(r#"{{"model":"watched","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#)
    };
    let call = [
        ("x-fake-tool-call", "get_weather"),
        ("x-fake-tool-args", r#"{"city":"Paris","days":[1,2]}"#),
    ];
    type Case<'a> = (&'a str, String, &'a [(&'a str, &'a str)]);
    let chat_cases: [Case; 7] = [
        ("chat text", chat(""), &[]),
        ("chat tool call", chat(""), &call),
        ("chat n=2", chat(r#","n":2"#), &[]),
        (
            "chat logprobs",
            chat(r#","logprobs":true,"top_logprobs":2"#),
            &[],
        ),
        ("chat refusal", chat(""), &[("x-fake-refusal", "1")]),
        (
            "chat refusal with logprobs",
            chat(r#","logprobs":true"#),
            &[("x-fake-refusal", "1")],
        ),
        ("chat reasoning", chat(""), &[("x-fake-reasoning", "2")]),
    ];
    for (name, body, headers) in chat_cases {
        assert_same_answer(&h, name, "/v1/chat/completions", &body, headers).await;
    }
    let messages =
        r#"{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
    let thinking = [("x-fake-reasoning", "2")];
    for (name, headers) in [
        ("anthropic text", &[][..]),
        ("anthropic tool_use", &call[..]),
        ("anthropic thinking with signature", &thinking[..]),
    ] {
        assert_same_answer(&h, name, "/v1/messages", messages, headers).await;
    }
    let responses = r#"{"model":"gpt","input":"hi","instructions":"be brief"}"#;
    for (name, headers) in [
        ("responses text", &[][..]),
        ("responses function_call", &call[..]),
        ("responses reasoning", &thinking[..]),
    ] {
        assert_same_answer(&h, name, "/v1/responses", responses, headers).await;
    }
}

#[tokio::test]
async fn requests_of_other_apis_are_never_changed() {
    let h = Harness::with_config(CONFIG).await;
    let body = r#"{"model":"e", "input":"hi"}"#;
    let (resp, _c) = h.send(post("/v1/embeddings", body.to_owned(), &[])).await;
    // The fake serves no embeddings: its own 404 passes through, as it came.
    assert_eq!(resp.status(), 404);
    json_body(resp).await;
    let sent = &h.fake.requests()[0];
    assert_eq!(&sent.body[..], body.as_bytes(), "forwarded byte for byte");
}

/// An upstream whose `api` is named reads every path in that API's format, but only its
/// calls (`/messages`, `/chat/completions`, `/responses`) are asked to stream: Anthropic
/// refuses a `stream` field on count_tokens and batches (400 "Extra inputs are not
/// permitted"), OpenAI's other endpoints have no stream to ask for.
#[tokio::test]
async fn on_a_named_api_only_its_calls_are_asked_to_stream() {
    let config = format!(
        "{CONFIG}{}",
        r#"
[upstreams.anthropic]
url = "{FAKE}"
auth = "none"
api = "anthropic"

[upstreams.openai]
url = "{FAKE}"
auth = "none"
api = "openai"

[[routes]]
name = "named_anthropic"
path_prefix = "/anthropic"
upstream = "anthropic"
stream_upstream = true
partial_answers = true

[[routes]]
name = "named_openai"
path_prefix = "/openai"
upstream = "openai"
stream_upstream = true
partial_answers = true
"#
    );
    let h = Harness::with_config(&config).await;
    let messages = r#"{"model":"claude","messages":[{"role":"user","content":"hi"}]}"#;
    let batch = r#"{"requests":[{"custom_id":"a","params":{"model":"claude","max_tokens":9,"messages":[]}}]}"#;
    let embedding = r#"{"model":"e","input":"hi"}"#;
    let untouched = [
        ("/anthropic/v1/messages/count_tokens", messages),
        ("/anthropic/v1/messages/batches", batch),
        ("/openai/v1/embeddings", embedding),
        ("/openai/v1/moderations", embedding),
        ("/openai/v1/completions", r#"{"model":"m","prompt":"hi"}"#),
    ];
    for (i, (path, body)) in untouched.iter().enumerate() {
        let (resp, _c) = h.send(post(path, (*body).to_owned(), &[])).await;
        // The fake serves none of these paths: its 404 passes through.
        assert_eq!(resp.status(), 404, "{path}");
        json_body(resp).await;
        let sent = &h.fake.requests()[i];
        assert_eq!(
            &sent.body[..],
            body.as_bytes(),
            "{path}: forwarded byte for byte"
        );
    }
    let calls = [
        "/anthropic/v1/messages",
        "/openai/v1/chat/completions",
        "/openai/v1/responses",
    ];
    for (i, path) in calls.iter().enumerate() {
        let (resp, _c) = h.send(post(path, messages.to_owned(), &[])).await;
        json_body(resp).await;
        let sent = forwarded_body(&h, untouched.len() + i);
        assert_eq!(sent["stream"], true, "{path}: a call, asked to stream");
    }
}

#[tokio::test]
async fn an_upstream_that_ignores_stream_and_answers_json_is_passed_through() {
    let h = Harness::with_config(CONFIG).await;
    let doc = include_str!("../fixtures/openai_chat.json");
    h.fake.set_replay(Some(hourglass_fake::Replay {
        content_type: "application/json",
        events: vec![Bytes::from_static(doc.as_bytes())].into(),
        interval: Duration::from_millis(1),
    }));
    let (resp, _c) = h.send(chat("watched", &[])).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert!(!resp.headers().contains_key("x-hourglass-partial"));
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        &body[..],
        doc.as_bytes(),
        "the provider's own document, as it came"
    );
    assert_eq!(
        forwarded_body(&h, 0)["stream"],
        true,
        "it was asked to stream"
    );
}

/// A provider's error event that comes as data alone (no `event: error` line), as Anthropic
/// and the Responses API may send it, is answered as `event: error` is: the provider's error
/// object, not a 200 with the text so far, with the status the provider gives that error when
/// asked without streaming (Anthropic's overload is a 529, which its SDK retries as
/// `OverloadedError`; a server error a 500).
#[tokio::test]
async fn a_data_only_error_event_is_answered_with_the_providers_error() {
    let messages_error =
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    let messages = format!(
        concat!(
            "event: message_start\n",
            "data: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":5,\"output_tokens\":1}}}}}}\n\n",
            "event: content_block_start\n",
            "data: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n",
            "event: content_block_delta\n",
            "data: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"Hello\"}}}}\n\n",
            "data: {}\n\n",
        ),
        messages_error
    );
    let responses_error = r#"{"type":"error","sequence_number":3,"code":"server_error","message":"The server had an error","param":null}"#;
    let responses = format!(
        concat!(
            "data: {{\"type\":\"response.created\",\"sequence_number\":0,\"response\":{{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}}}\n\n",
            "data: {{\"type\":\"response.output_item.added\",\"sequence_number\":1,\"output_index\":0,\"item\":{{\"id\":\"msg_1\",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}}}\n\n",
            "data: {{\"type\":\"response.content_part.added\",\"sequence_number\":2,\"output_index\":0,\"content_index\":0,\"part\":{{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}}}\n\n",
            "data: {{\"type\":\"response.output_text.delta\",\"sequence_number\":3,\"output_index\":0,\"content_index\":0,\"delta\":\"Hello\"}}\n\n",
            "data: {}\n\n",
        ),
        responses_error
    );
    for (route, path, body, stream, error, status) in [
        (
            "messages",
            "/v1/messages",
            r#"{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#,
            messages,
            messages_error,
            529,
        ),
        (
            "responses",
            "/v1/responses",
            r#"{"model":"gpt","input":"hi"}"#,
            responses,
            responses_error,
            500,
        ),
    ] {
        let h = Harness::with_config(CONFIG).await;
        h.fake.set_replay(Some(hourglass_fake::Replay::sse(
            &stream,
            Duration::from_millis(1),
        )));
        let (resp, _c) = h.send(post(path, body.into(), &[])).await;
        assert_eq!(resp.status(), status, "{route}");
        assert!(
            resp.headers().get("x-hourglass-partial").is_none(),
            "{route}"
        );
        // A status without a standard reason phrase gets one of its own: hyper writes
        // `529 <none>` otherwise. (hyper's client keeps a phrase only when it is not the
        // standard one.)
        let reason = reason_phrase(&resp);
        let want_reason = (status == 529).then(|| "Overloaded".to_owned());
        assert_eq!(reason, want_reason, "{route}");
        let got = json_body(resp).await;
        let want: serde_json::Value = serde_json::from_str(error).unwrap();
        if route == "responses" {
            // The Responses stream's error event, in the envelope OpenAI answers errors
            // with when not streaming (the SDK's `e.type`, `e.code`, `e.param`).
            assert_eq!(
                got,
                serde_json::json!({"error": {
                    "message": want["message"],
                    "type": "server_error",
                    "param": null,
                    "code": "server_error",
                }}),
                "{route}"
            );
        } else {
            assert_eq!(got, want, "{route}: the provider's error object, whole");
        }
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
}

/// An SDK that does not stream and says how long it waits (`x-stainless-timeout`, OpenAI's
/// and Anthropic's SDKs) sits silent through the whole assembled generation: the answer
/// ends before it gives up (at 90% of it, here 900 ms of 1 s), with what was generated on a
/// route with partial answers and as a 504 without, never a client that times out blind.
#[tokio::test]
async fn an_assembled_answer_ends_before_the_sdk_stops_waiting() {
    let h = Harness::with_config(CONFIG).await;
    let slow = [
        ("x-stainless-timeout", "1"),
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
    assert!(message.contains("900ms"), "{message}");
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
        h.wait_requests(route, 1.0).await;
        assert_eq!(
            h.metric(&format!(
                "hourglass_requests_total{{outcome=\"ok\",route=\"{route}\"}}"
            ))
            .await,
            1.0,
            "{route}"
        );
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
    let conn = crate::support::Conn::open(p.addr).await;
    let pending = tokio::spawn(conn.send(chat(
        "partial",
        &[("x-fake-chunks", "50"), ("x-fake-interval-ms", "100")],
    )));
    assert!(fake.wait_for_requests(1, Duration::from_secs(10)).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    pending.abort();
    let _ = pending.await;
    let line = p.request_line().await;
    assert_eq!(line["outcome"], "cancelled", "{line}");
    assert_eq!(line["origin"], "client", "{line}");
    assert_eq!(line.get("status"), None, "{line}");
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
