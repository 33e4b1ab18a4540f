//! Clients that do not stream, on routes with `stream_upstream`: the upstream is asked to
//! stream, the first-token and idle limits watch it, and the client gets the one document;
//! with `partial_answers`, what was generated when a limit cut it.

use std::time::Duration;

use crate::support::{json_body, reason_phrase, Harness};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;

pub(super) const CONFIG: &str = r#"
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

pub(super) fn post(path: &str, body: String, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::post(path)
        .header("host", "gateway")
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::from(body))).unwrap()
}

pub(super) fn chat(model: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    post("/v1/chat/completions", body, headers)
}

fn forwarded_body(h: &Harness, i: usize) -> serde_json::Value {
    serde_json::from_slice(&h.fake.requests()[i].body).unwrap()
}

/// Audit GB 2: Mistral refuses `stream_options` (422 `extra_forbidden`), and every call a
/// `stream_upstream` route made to it failed. An upstream with `include_usage = false` is
/// asked to stream and for nothing else; the document's usage is then the estimate.
#[tokio::test]
async fn an_upstream_that_takes_no_stream_options_is_sent_none() {
    let config = CONFIG.replace(
        "[upstreams.fake]\nurl = \"{FAKE}\"\nauth = \"none\"\n",
        "[upstreams.fake]\nurl = \"{FAKE}\"\nauth = \"none\"\ninclude_usage = false\n",
    );
    assert_ne!(config, CONFIG);
    let h = Harness::with_config(&config).await;
    let (resp, _c) = h.send(chat("watched", &[("x-fake-chunks", "3")])).await;
    assert_eq!(resp.status(), 200);
    let doc = json_body(resp).await;
    assert_eq!(doc["choices"][0]["message"]["content"], "tok1 tok2 tok3 ");
    assert!(
        doc["usage"]["completion_tokens"].as_u64().is_some(),
        "{doc}"
    );
    let sent = forwarded_body(&h, 0);
    assert_eq!(sent["stream"], true);
    assert_eq!(sent.get("stream_options"), None, "{sent}");
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

/// Compatible servers' errors that are no error object (TGI's and llama.cpp's
/// `{"error":"..."}`, vLLM's `{"object":"error",...,"code":N}`) are the provider's error as
/// `{"error":{...}}` is (audit S): a client that does not stream gets the provider's message
/// with the status it names (502 when it names none), not a 200 `chat.completion` with no
/// choice or the gateway's "ended before the answer did"; a streaming client gets the event
/// and no second error after it. A stream that held no choice at all is no answer: 502.
#[tokio::test]
async fn compatible_servers_errors_and_choiceless_streams_are_no_answer() {
    let head = r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}"#;
    let tgi = r#"{"error":"model overloaded, retry later","error_type":"overloaded"}"#;
    let vllm =
        r#"{"object":"error","message":"boom","type":"BadRequestError","param":null,"code":400}"#;
    for (name, stream, status, message) in [
        (
            "tgi",
            format!("data: {head}\n\ndata: {tgi}\n\n"),
            529,
            "model overloaded, retry later",
        ),
        ("vllm", format!("data: {vllm}\n\n"), 400, "boom"),
    ] {
        let h = Harness::with_config(CONFIG).await;
        h.fake.set_replay(Some(hourglass_fake::Replay::sse(
            &stream,
            Duration::from_millis(1),
        )));
        let (resp, _c) = h.send(chat("watched", &[])).await;
        assert_eq!(resp.status(), status, "{name}");
        let got = json_body(resp).await;
        assert_eq!(got["error"]["message"], message, "{name}: {got}");
        // Streamed to the client: the provider's event ends the stream, nothing after it.
        let (resp, _c) = h
            .send(post(
                "/v1/chat/completions",
                r#"{"model":"plain","stream":true,"messages":[]}"#.into(),
                &[],
            ))
            .await;
        assert_eq!(resp.status(), 200, "{name}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            &body[..],
            stream.as_bytes(),
            "{name}: passed through as it came"
        );
    }
    // Chunks without a choice, then the end: no answer.
    let azure = r#"{"id":"","object":"","created":0,"model":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}],"choices":[]}"#;
    let h = Harness::with_config(CONFIG).await;
    h.fake.set_replay(Some(hourglass_fake::Replay::sse(
        &format!("data: {azure}\n\ndata: [DONE]\n\n"),
        Duration::from_millis(1),
    )));
    let (resp, _c) = h.send(chat("watched", &[])).await;
    assert_eq!(resp.status(), 502);
    let got = json_body(resp).await;
    assert_eq!(got["error"]["code"], "upstream_error", "{got}");
}

/// The access line's size is the bytes of the client's body, as the combined format's
/// readers take it: it was the upstream's (its SSE, three to six times the document the
/// client got on these routes), and a client that left before its answer, sent nothing, was
/// logged with what the upstream had sent (audit J2).
#[tokio::test]
async fn the_access_lines_size_is_what_the_clients_body_carried() {
    let (fake, p) = logging_access_lines().await;
    // The status and size of the `n`th access line, once it is written.
    let line = |n: usize| {
        let p = &p;
        async move {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let (out, _) = p.output();
                if let Some(l) = out.lines().nth(n) {
                    let after = l.split("HTTP/1.1\" ").nth(1).expect("a request line");
                    let mut f = after.split(' ');
                    let status: u16 = f.next().unwrap().parse().unwrap();
                    let size: u64 = f.next().unwrap().parse().unwrap();
                    return (status, size);
                }
                assert!(Instant::now() < deadline, "no access line {n}: {out}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let streamed = post(
        "/v1/chat/completions",
        r#"{"model":"plain","stream":true,"messages":[]}"#.to_owned(),
        &[("x-fake-chunks", "3")],
    );
    let cases = [
        ("assembled", chat("watched", &[("x-fake-chunks", "3")])),
        ("partial", chat("partial", &[("x-fake-freeze-after", "2")])),
        ("streamed", streamed),
    ];
    for (n, (case, req)) in cases.into_iter().enumerate() {
        let (resp, _c) = crate::support::Conn::open(p.addr).await.send(req).await;
        let status = resp.status().as_u16();
        let got = resp.into_body().collect().await.unwrap().to_bytes().len() as u64;
        assert!(got > 0, "{case}");
        assert_eq!(line(n).await, (status, got), "{case}");
    }
    // A client that leaves while its answer is assembled is sent no byte of it.
    let conn = crate::support::Conn::open(p.addr).await;
    let pending = tokio::spawn(conn.send(chat(
        "watched",
        &[("x-fake-chunks", "30"), ("x-fake-interval-ms", "100")],
    )));
    let deadline = Instant::now() + Duration::from_secs(5);
    while fake.requests().len() < 4 {
        assert!(Instant::now() < deadline, "the upstream got the request");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Some of the stream has come: it is not what the client got.
    tokio::time::sleep(Duration::from_millis(300)).await;
    pending.abort();
    assert_eq!(line(3).await, (499, 0));
}

/// The access line's size leaves out the held bytes the gateway dropped and the client
/// never got: half an event at a cut, a last event without its blank line after a whole
/// answer. They were counted as they came: 51 and 13 bytes more than the client's body here
/// (audit CB).
#[tokio::test]
async fn the_access_lines_size_leaves_out_the_held_bytes_dropped() {
    let (fake, p) = logging_access_lines().await;
    let chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    let finished =
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
    let half = r#"data: {"choices":[{"index":0,"delta":{"content":"cu"#;
    let sse = |frames: &[&str]| -> Option<Vec<Bytes>> {
        Some(
            frames
                .iter()
                .map(|f| Bytes::copy_from_slice(f.as_bytes()))
                .collect(),
        )
    };
    // A document past what the gateway reads ahead (`LENGTH_CAP`): what it read goes out
    // first, then the rest as it comes, each byte counted once.
    let pad = Bytes::from(vec![b'x'; hourglass::gateway::LENGTH_CAP / 2]);
    let big = [
        vec![Bytes::from_static(br#"{"choices":[],"pad":""#)],
        vec![pad; 3],
        vec![Bytes::from_static(br#""}"#)],
    ]
    .concat();
    let cases = [
        // Cut as the upstream ends: `upstream_error`.
        ("half event, then the end", sse(&[chunk, half]), None),
        // Cut by the idle limit, the upstream frozen before the event's rest.
        (
            "half event, then silence",
            sse(&[chunk, half, "\"}}]}\n\n"]),
            Some("2"),
        ),
        (
            "whole answer, then [DONE] without its blank line",
            sse(&[chunk, finished, "data: [DONE]\n"]),
            None,
        ),
        ("a document longer than read ahead", None, None),
    ];
    let mut sizes = Vec::new();
    for (n, (case, events, freeze)) in cases.into_iter().enumerate() {
        let stream = events.is_some();
        fake.set_replay(Some(hourglass_fake::Replay {
            content_type: if stream {
                "text/event-stream"
            } else {
                "application/json"
            },
            events: events.unwrap_or_else(|| big.clone()).into(),
            interval: Duration::from_millis(1),
        }));
        let mut headers = vec![];
        if let Some(after) = freeze {
            headers.push(("x-fake-freeze-after", after));
        }
        let req = post(
            "/v1/chat/completions",
            format!(r#"{{"model":"plain","stream":{stream},"messages":[]}}"#),
            &headers,
        );
        let (resp, _c) = crate::support::Conn::open(p.addr).await.send(req).await;
        assert_eq!(resp.status(), 200, "{case}");
        let got = resp.into_body().collect().await.unwrap().to_bytes();
        if stream {
            let text = String::from_utf8_lossy(&got);
            assert!(text.starts_with(chunk), "{case}: {text}");
            assert!(!text.contains("\"cu"), "{case}: {text}");
        } else {
            assert_eq!(got.len(), hourglass::gateway::LENGTH_CAP * 3 / 2 + 23);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let size = loop {
            let (out, _) = p.output();
            if let Some(l) = out.lines().nth(n) {
                let after = l.split("HTTP/1.1\" ").nth(1).expect("a request line");
                break after.split(' ').nth(1).unwrap().parse::<usize>().unwrap();
            }
            assert!(Instant::now() < deadline, "no access line {n}: {out}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        sizes.push((case, got.len(), size));
    }
    // (case, the client's body, the access line's size)
    assert!(sizes.iter().all(|(_, got, size)| got == size), "{sizes:?}");
}

/// A gateway process writing access lines, in front of a fake of its own.
async fn logging_access_lines() -> (hourglass_fake::FakeUpstream, crate::support::Process) {
    let fake = hourglass_fake::FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let p = crate::support::Process::spawn(
        &CONFIG.replace("{FAKE}", &fake.url()),
        &["--log-format", "access"],
        &[],
    )
    .await;
    (fake, p)
}

/// Audit PA 1: a client that does not stream gets an Anthropic tool_use input as the
/// provider wrote it (an integer past 64 bits, a number no float holds, the key order), not
/// re-read as floats, nor dropped with its whole call from a 200 that says `tool_use`; an
/// answer that came whole with an input that is no JSON is a 502, counted an error.
#[tokio::test]
async fn a_tool_uses_input_reaches_the_client_as_the_provider_wrote_it() {
    let stream = |input: &str| {
        let events = [
            r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}"#.to_owned(),
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"order","input":{}}}"#.to_owned(),
            serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": input}}).to_string(),
            r#"{"type":"content_block_stop","index":0}"#.to_owned(),
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":20}}"#.to_owned(),
            r#"{"type":"message_stop"}"#.to_owned(),
        ];
        events
            .iter()
            .map(|e| format!("data: {e}\n\n"))
            .collect::<String>()
    };
    let body = r#"{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
    let h = Harness::with_config(CONFIG).await;
    let input = r#"{"sku": "A-1", "order_ref": 123456789012345678901234, "x": 1e400}"#;
    h.fake.set_replay(Some(hourglass_fake::Replay::sse(
        &stream(input),
        Duration::from_millis(1),
    )));
    let (resp, _c) = h.send(post("/v1/messages", body.into(), &[])).await;
    assert_eq!(resp.status(), 200);
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    let got = String::from_utf8(got.to_vec()).unwrap();
    assert!(got.contains(&format!(r#""input":{input}"#)), "{got}");

    h.fake.set_replay(Some(hourglass_fake::Replay::sse(
        &stream(r#"{"sku": "A-1", "#),
        Duration::from_millis(1),
    )));
    let (resp, _c) = h.send(post("/v1/messages", body.into(), &[])).await;
    assert_eq!(resp.status(), 502);
    let got = json_body(resp).await;
    assert_eq!(got["error"]["code"], "upstream_error", "{got}");
    let message = got["error"]["message"].as_str().unwrap();
    assert!(message.contains("tool_use block 0"), "{message}");
    h.wait_requests("messages", 2.0).await;
    assert_eq!(
        h.metric("hourglass_requests_total{outcome=\"error\",route=\"messages\"}")
            .await,
        1.0
    );
}
