use std::future::Future;

use http::header::CONTENT_TYPE;
use http::{Method, Request, Response, StatusCode, Version};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

mod shapes;

type TestClient = Client<HttpConnector, Full<Bytes>>;

const CHAT: &str =
    r#"{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
const CHAT_FULL: &str = r#"{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}"#;
const MESSAGES: &str = r#"{"model":"claude-test","stream":true,"max_tokens":64,"messages":[]}"#;
const MESSAGES_FULL: &str = r#"{"model":"claude-test","max_tokens":64,"messages":[]}"#;
const SECOND: Duration = Duration::from_secs(1);
/// How long a wait for something that must happen may take on a busy machine.
const PATIENCE: Duration = Duration::from_secs(5);
/// How soon a vanished peer must be noticed. Generous for a loaded machine, and still
/// proof of the cause: the streams these tests leave are frozen, or 10 s from their head,
/// so nothing but the peer's going ends them this soon.
const PROMPT: Duration = Duration::from_secs(2);

async fn fake() -> FakeUpstream {
    FakeUpstream::start(([127, 0, 0, 1], 0).into())
        .await
        .unwrap()
}

fn h1() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

fn h2() -> TestClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

fn post(
    fake: &FakeUpstream,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Request<Full<Bytes>> {
    let mut builder = Request::post(format!("{}{path}", fake.url()));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap()
}

async fn text_of(response: Response<Incoming>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Reads body frames until none arrives for `quiet`, returning them with arrival times.
async fn frames_until_quiet(body: &mut Incoming, quiet: Duration) -> Vec<(Instant, String)> {
    let mut frames = Vec::new();
    while let Ok(Some(frame)) = tokio::time::timeout(quiet, body.frame()).await {
        if let Ok(data) = frame.unwrap().into_data() {
            frames.push((Instant::now(), String::from_utf8(data.to_vec()).unwrap()));
        }
    }
    frames
}

#[derive(Debug)]
struct Sse {
    event: Option<String>,
    data: String,
    comment: bool,
}

fn parse_sse(text: &str) -> Vec<Sse> {
    assert!(text.ends_with("\n\n"), "unterminated event in {text:?}");
    let blocks = text.split("\n\n").filter(|block| !block.is_empty());
    blocks
        .map(|block| {
            let mut sse = Sse {
                event: None,
                data: String::new(),
                comment: false,
            };
            for line in block.lines() {
                if let Some(name) = line.strip_prefix("event: ") {
                    sse.event = Some(name.to_owned());
                } else if let Some(data) = line.strip_prefix("data: ") {
                    sse.data = data.to_owned();
                } else {
                    assert!(line.starts_with(':'), "unexpected line {line:?}");
                    sse.comment = true;
                }
            }
            sse
        })
        .collect()
}

fn json_of(sse: &Sse) -> Value {
    serde_json::from_str(&sse.data).unwrap()
}

async fn raw_post(fake: &FakeUpstream, headers: &[(&str, &str)]) -> TcpStream {
    let mut stream = TcpStream::connect(fake.addr()).await.unwrap();
    let mut request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: fake\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        CHAT.len()
    );
    for (name, value) in headers {
        request += &format!("{name}: {value}\r\n");
    }
    request += "\r\n";
    request += CHAT;
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

async fn read_until(stream: &mut TcpStream, needle: &str) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(needle) {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(
            n > 0,
            "EOF before {needle:?}; got {:?}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(seen).unwrap()
}

/// Asserts the fake saw connection 0 close and dropped request 0's response within PROMPT.
async fn assert_noticed_promptly(fake: &FakeUpstream, closed_by_client: Instant) {
    let closed = fake
        .wait_closed(0, PATIENCE)
        .await
        .expect("close never noticed");
    let lag = closed.saturating_duration_since(closed_by_client);
    assert!(lag < PROMPT, "close noticed after {lag:?}");
    let request = fake
        .wait_request_finished(0, PATIENCE)
        .await
        .expect("response never dropped");
    assert!(!request.completed);
    let lag = request
        .finished_at
        .unwrap()
        .saturating_duration_since(closed_by_client);
    assert!(lag < PROMPT, "response dropped after {lag:?}");
    assert_eq!(fake.open_connections(), 0);
}

#[tokio::test]
async fn openai_stream_shape() {
    let fake = fake().await;
    let headers = [
        ("x-fake-chunks", "3"),
        ("x-fake-interval-ms", "1"),
        ("x-request-id", "req-7"),
    ];
    let response = h1()
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
    assert_eq!(response.headers()["x-request-id"], "req-7");
    let events = parse_sse(&text_of(response).await);
    assert_eq!(events.len(), 6, "{events:?}");
    assert!(events.iter().all(|e| e.event.is_none() && !e.comment));
    let role = json_of(&events[0]);
    assert_eq!(role["object"], "chat.completion.chunk");
    assert_eq!(role["model"], "gpt-test");
    assert!(role["id"].as_str().unwrap().starts_with("chatcmpl-fake-"));
    assert!(role["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(
        role["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(role["choices"][0]["finish_reason"], Value::Null);
    for (n, event) in events[1..4].iter().enumerate() {
        let chunk = json_of(event);
        assert_eq!(
            chunk["choices"][0]["delta"],
            json!({"content": format!("tok{} ", n + 1)})
        );
        assert_eq!(chunk["id"], role["id"]);
        assert!(chunk.get("x_fake_sent_ns").is_none());
    }
    let last = json_of(&events[4]);
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    // As OpenAI: the usage only when `stream_options.include_usage` asks for it.
    assert!(last.get("usage").is_none(), "{last}");
    assert_eq!(events[5].data, "[DONE]");
    let request = fake.wait_request_finished(0, PATIENCE).await.unwrap();
    assert!(request.completed);
}

#[tokio::test]
async fn anthropic_stream_shape() {
    let fake = fake().await;
    let headers = [("x-fake-chunks", "2"), ("x-fake-interval-ms", "1")];
    let response = h1()
        .request(post(&fake, "/v1/messages", MESSAGES, &headers))
        .await
        .unwrap();
    assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
    let events = parse_sse(&text_of(response).await);
    let names: Vec<_> = events.iter().map(|e| e.event.clone().unwrap()).collect();
    let expected = [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ];
    assert_eq!(names, expected);
    for event in &events {
        assert_eq!(json_of(event)["type"], event.event.as_deref().unwrap());
    }
    assert_eq!(json_of(&events[0])["message"]["model"], "claude-test");
    assert_eq!(
        json_of(&events[4])["delta"],
        json!({"type": "text_delta", "text": "tok2 "})
    );
    assert_eq!(json_of(&events[6])["delta"]["stop_reason"], "end_turn");
    assert_eq!(json_of(&events[6])["usage"]["output_tokens"], 2);
}

const RESPONSES: &str = r#"{"model":"gpt-test","stream":true,"input":"hi","instructions":"be brief","tools":[{"type":"function","name":"get_weather","parameters":{}}]}"#;
const RESPONSES_FULL: &str = r#"{"model":"gpt-test","input":"hi"}"#;

/// The Responses stream as OpenAI sends it: every event named by its `type`, numbered in
/// order, the text's deltas between the message item's and content part's added/done
/// events, and `response.completed` with the whole response and its usage.
#[tokio::test]
async fn responses_stream_shape() {
    let fake = fake().await;
    let headers = [("x-fake-chunks", "3"), ("x-fake-interval-ms", "1")];
    let response = h1()
        .request(post(&fake, "/v1/responses", RESPONSES, &headers))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
    let events = parse_sse(&text_of(response).await);
    let names: Vec<_> = events.iter().map(|e| e.event.clone().unwrap()).collect();
    let expected = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ];
    assert_eq!(names, expected);
    for (i, event) in events.iter().enumerate() {
        let data = json_of(event);
        assert_eq!(data["type"], event.event.as_deref().unwrap());
        assert_eq!(data["sequence_number"], i);
    }
    let created = json_of(&events[0])["response"].clone();
    assert_eq!(created["object"], "response");
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["model"], "gpt-test");
    assert_eq!(created["output"], json!([]));
    assert_eq!(created["instructions"], "be brief");
    assert_eq!(created["tools"][0]["name"], "get_weather");
    let id = created["id"].as_str().unwrap();
    assert!(id.starts_with("resp_fake_"), "{id}");
    let added = json_of(&events[2])["item"].clone();
    assert_eq!(added["type"], "message");
    assert_eq!(added["status"], "in_progress");
    let item_id = added["id"].as_str().unwrap();
    for event in &events[4..7] {
        let delta = json_of(event);
        assert_eq!(delta["item_id"], item_id);
        assert_eq!(delta["output_index"], 0);
        assert_eq!(delta["content_index"], 0);
        assert_eq!(delta["logprobs"], json!([]));
    }
    let deltas: String = events[4..7]
        .iter()
        .map(|e| json_of(e)["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(deltas, "tok1 tok2 tok3 ");
    assert_eq!(json_of(&events[7])["text"], "tok1 tok2 tok3 ");
    assert_eq!(json_of(&events[8])["part"]["text"], "tok1 tok2 tok3 ");
    assert_eq!(json_of(&events[9])["item"]["status"], "completed");
    let done = json_of(&events[10])["response"].clone();
    assert_eq!(done["id"], id);
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["id"], item_id);
    assert_eq!(
        done["output"][0]["content"][0],
        json!({"type": "output_text", "annotations": [], "logprobs": [], "text": "tok1 tok2 tok3 "})
    );
    assert_eq!(done["usage"]["output_tokens"], 3);
    let input = done["usage"]["input_tokens"].as_u64().unwrap();
    assert!(input >= 1);
    assert_eq!(done["usage"]["total_tokens"], input + 3);
    assert_eq!(
        done["usage"]["output_tokens_details"]["reasoning_tokens"],
        0
    );
    let request = fake.wait_request_finished(0, SECOND).await.unwrap();
    assert!(request.completed);
}

/// `x-fake-tool-call` in all three APIs: the arguments stream in the content events, and
/// their pieces join into the whole, which the closing events and the plain answers carry.
#[tokio::test]
async fn tool_calls_stream_their_arguments() {
    let fake = fake().await;
    let client = h1();
    let headers = [
        ("x-fake-chunks", "3"),
        ("x-fake-interval-ms", "1"),
        ("x-fake-tool-call", "get_weather"),
    ];
    let whole = r#"{"text":"tok1 tok2 tok3 "}"#;

    let response = client
        .request(post(&fake, "/v1/responses", RESPONSES, &headers))
        .await
        .unwrap();
    let events = parse_sse(&text_of(response).await);
    let names: Vec<_> = events.iter().map(|e| e.event.clone().unwrap()).collect();
    let expected = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ];
    assert_eq!(names, expected);
    let item = json_of(&events[2])["item"].clone();
    assert_eq!(item["type"], "function_call");
    assert_eq!(item["name"], "get_weather");
    assert_eq!(item["arguments"], "");
    assert!(item["call_id"].as_str().unwrap().starts_with("call_fake_"));
    let pieces: String = events[3..6]
        .iter()
        .map(|e| {
            let d = json_of(e);
            assert_eq!(d["item_id"], item["id"]);
            d["delta"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(pieces, whole);
    assert_eq!(json_of(&events[6])["arguments"], whole);
    let done = json_of(&events[8])["response"].clone();
    assert_eq!(done["output"][0]["arguments"], whole);
    assert_eq!(done["output"][0]["status"], "completed");
    for (i, event) in events.iter().enumerate() {
        assert_eq!(json_of(event)["sequence_number"], i);
    }

    let response = client
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    let events = parse_sse(&text_of(response).await);
    let first = json_of(&events[0])["choices"][0]["delta"].clone();
    assert_eq!(first["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(first["tool_calls"][0]["type"], "function");
    let pieces: String = events[1..4]
        .iter()
        .map(|e| {
            let d = json_of(e)["choices"][0]["delta"].clone();
            d["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(pieces, whole);
    assert_eq!(
        json_of(&events[4])["choices"][0]["finish_reason"],
        "tool_calls"
    );

    let response = client
        .request(post(&fake, "/v1/messages", MESSAGES, &headers))
        .await
        .unwrap();
    let events = parse_sse(&text_of(response).await);
    let block = json_of(&events[1])["content_block"].clone();
    assert_eq!(block["type"], "tool_use");
    assert_eq!(block["name"], "get_weather");
    let pieces: String = events[3..6]
        .iter()
        .map(|e| {
            let d = json_of(e)["delta"].clone();
            assert_eq!(d["type"], "input_json_delta");
            d["partial_json"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(pieces, whole);
    assert_eq!(json_of(&events[7])["delta"]["stop_reason"], "tool_use");

    // Not streamed.
    let plain = |path, body| post(&fake, path, body, &headers);
    let text = text_of(
        client
            .request(plain("/v1/responses", RESPONSES_FULL))
            .await
            .unwrap(),
    )
    .await;
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["output"][0]["type"], "function_call");
    assert_eq!(r["output"][0]["arguments"], whole);
    let text = text_of(
        client
            .request(plain("/v1/chat/completions", CHAT_FULL))
            .await
            .unwrap(),
    )
    .await;
    let c: Value = serde_json::from_str(&text).unwrap();
    let call = &c["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["arguments"], whole);
    assert_eq!(c["choices"][0]["finish_reason"], "tool_calls");
    let text = text_of(
        client
            .request(plain("/v1/messages", MESSAGES_FULL))
            .await
            .unwrap(),
    )
    .await;
    let m: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(m["content"][0]["input"], json!({"text": "tok1 tok2 tok3 "}));
    assert_eq!(m["stop_reason"], "tool_use");

    // A name the APIs would not take is a script error.
    let bad = [("x-fake-tool-call", "get weather")];
    let response = client
        .request(post(&fake, "/v1/responses", RESPONSES, &bad))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn non_stream_answers() {
    let fake = fake().await;
    let client = h1();
    let chunks = [("x-fake-chunks", "2")];
    let response = client
        .request(post(&fake, "/v1/chat/completions", CHAT_FULL, &chunks))
        .await
        .unwrap();
    assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
    assert!(response
        .headers()
        .contains_key(http::header::CONTENT_LENGTH));
    let chat: Value = serde_json::from_str(&text_of(response).await).unwrap();
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["choices"][0]["message"]["content"], "tok1 tok2 ");
    assert_eq!(chat["usage"]["completion_tokens"], 2);
    let response = client
        .request(post(&fake, "/v1/messages", MESSAGES_FULL, &chunks))
        .await
        .unwrap();
    let message: Value = serde_json::from_str(&text_of(response).await).unwrap();
    assert_eq!(message["type"], "message");
    assert_eq!(message["content"][0]["text"], "tok1 tok2 ");
    assert_eq!(message["usage"]["output_tokens"], 2);
    let response = client
        .request(post(&fake, "/v1/responses", RESPONSES_FULL, &chunks))
        .await
        .unwrap();
    assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
    let r: Value = serde_json::from_str(&text_of(response).await).unwrap();
    assert_eq!(r["object"], "response");
    assert_eq!(r["status"], "completed");
    assert_eq!(r["model"], "gpt-test");
    assert_eq!(r["output"][0]["type"], "message");
    assert_eq!(r["output"][0]["role"], "assistant");
    assert_eq!(r["output"][0]["content"][0]["text"], "tok1 tok2 ");
    // `output_text` is the SDKs' convenience, not a field on the wire.
    assert!(r.get("output_text").is_none());
    assert_eq!(r["usage"]["output_tokens"], 2);
    assert_eq!(r["tools"], json!([]));
}

#[tokio::test]
async fn models_unknown_routes_and_bad_json() {
    let fake = fake().await;
    let client = h1();
    let models = Request::get(format!("{}/v1/models", fake.url()))
        .body(Full::default())
        .unwrap();
    let response = client.request(models).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let list: Value = serde_json::from_str(&text_of(response).await).unwrap();
    assert_eq!(list["data"][0]["id"], "fake-model");
    let response = client
        .request(post(&fake, "/v2/nothing", "{}", &[]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/v2/nothing"));
    let response = client
        .request(post(&fake, "/v1/chat/completions", "{nope", &[]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn bad_script_headers_are_rejected_and_unknown_ones_ignored() {
    let fake = fake().await;
    let client = h1();
    for (name, value) in [
        ("x-fake-chunks", "abc"),
        ("x-fake-ttft-ms", "-5"),
        ("x-fake-status", "99"),
        ("x-fake-keepalive-kind", "shout"),
        ("x-fake-headers-first", "maybe"),
        ("x-fake-reasoning", "many"),
        ("x-fake-refusal", "yes"),
        ("x-fake-id", "a b"),
        ("x-fake-id", "a,b"),
        ("x-fake-tool-call", "a,,b"),
        ("x-fake-tool-args", "[1,2]"),
        ("x-fake-tool-args", "{nope"),
    ] {
        let response = client
            .request(post(&fake, "/v1/chat/completions", CHAT, &[(name, value)]))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{name}");
        let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(name) && message.contains(value),
            "{message}"
        );
    }
    let headers = [("x-fake-whatever", "zzz"), ("x-fake-interval-ms", "1")];
    let response = client
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

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
    assert_eq!(error["error"]["type"], "server_error");
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
    for (version, client) in [(Version::HTTP_11, h1()), (Version::HTTP_2, h2())] {
        let fake = fake().await;
        let headers = [
            ("x-fake-disconnect-after", "2"),
            ("x-fake-interval-ms", "5"),
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
    let response = h1()
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    let events = parse_sse(&text_of(response).await);
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
    let response = h1()
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    let events = parse_sse(&text_of(response).await);
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
    assert!(
        stamps.windows(2).all(|w| w[1] - w[0] >= 9_000_000),
        "{stamps:?}"
    );
    assert!(before < stamps[0] && stamps[2] <= after);
}

#[tokio::test]
async fn requests_and_connections_are_recorded() {
    let fake = fake().await;
    let client = h1();
    let headers = [("x-request-id", "abc"), ("x-fake-interval-ms", "1")];
    let response = client
        .request(post(&fake, "/v1/chat/completions?trace=1", CHAT, &headers))
        .await
        .unwrap();
    text_of(response).await;
    assert!(fake.wait_for_requests(1, PATIENCE).await);
    assert!(!fake.wait_for_requests(2, Duration::from_millis(50)).await);
    let request = &fake.requests()[0];
    assert_eq!(request.method, Method::POST);
    assert_eq!(request.path, "/v1/chat/completions?trace=1");
    assert_eq!(request.headers["x-request-id"], "abc");
    assert_eq!(request.body, CHAT.as_bytes());
    assert_eq!(request.version, Version::HTTP_11);
    assert_eq!(request.conn_id, 0);
    let connections = fake.connections();
    assert_eq!(connections.len(), 1);
    assert!(connections[0].peer.ip().is_loopback());
    assert!(connections[0].opened_at <= request.at);
    assert_eq!(fake.open_connections(), 1);
    drop(client);
    assert!(fake.wait_closed(0, PATIENCE).await.is_some());
    assert!(fake.wait_open_connections(0, PATIENCE).await);
}

#[tokio::test]
async fn shutdown_closes_everything() {
    let fake = fake().await;
    let _frozen = raw_post(&fake, &[("x-fake-freeze-after", "0")]).await;
    assert!(fake.wait_for_requests(1, PATIENCE).await);
    fake.shutdown();
    assert!(fake.wait_open_connections(0, PATIENCE).await);
    assert!(fake.wait_request_finished(0, PATIENCE).await.is_some());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(TcpStream::connect(fake.addr()).await.is_err());
}

#[tokio::test]
async fn h1_close_noticed_while_body_frozen() {
    let fake = fake().await;
    let mut stream = raw_post(
        &fake,
        &[("x-fake-freeze-after", "1"), ("x-fake-interval-ms", "5")],
    )
    .await;
    read_until(&mut stream, "tok1 ").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let closed_by_client = Instant::now();
    drop(stream);
    assert_noticed_promptly(&fake, closed_by_client).await;
}

#[tokio::test]
async fn h1_reset_noticed_while_body_frozen() {
    let fake = fake().await;
    let mut stream = raw_post(
        &fake,
        &[("x-fake-freeze-after", "1"), ("x-fake-interval-ms", "5")],
    )
    .await;
    read_until(&mut stream, "tok1 ").await;
    stream.set_zero_linger().unwrap();
    let closed_by_client = Instant::now();
    drop(stream);
    assert_noticed_promptly(&fake, closed_by_client).await;
}

/// hyper's default `half_close(false)` takes a client's FIN as "gone" even though the client
/// could still read; the gateway's server side behaves the same.
#[tokio::test]
async fn h1_half_close_counts_as_gone() {
    let fake = fake().await;
    let mut stream = raw_post(
        &fake,
        &[("x-fake-freeze-after", "1"), ("x-fake-interval-ms", "5")],
    )
    .await;
    read_until(&mut stream, "tok1 ").await;
    let closed_by_client = Instant::now();
    stream.shutdown().await.unwrap();
    assert_noticed_promptly(&fake, closed_by_client).await;
}

#[tokio::test]
async fn h1_close_noticed_during_headers_first_wait() {
    let fake = fake().await;
    let mut stream = raw_post(
        &fake,
        &[("x-fake-headers-first", "1"), ("x-fake-ttft-ms", "10000")],
    )
    .await;
    let head = read_until(&mut stream, "\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let closed_by_client = Instant::now();
    drop(stream);
    assert_noticed_promptly(&fake, closed_by_client).await;
}

#[tokio::test]
async fn h1_close_noticed_before_the_head() {
    let fake = fake().await;
    let stream = raw_post(&fake, &[("x-fake-ttft-ms", "10000")]).await;
    assert!(fake.wait_for_requests(1, PATIENCE).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let closed_by_client = Instant::now();
    drop(stream);
    assert_noticed_promptly(&fake, closed_by_client).await;
}

#[tokio::test]
async fn h2_reset_ends_a_frozen_body() {
    let fake = fake().await;
    let client = h2();
    let headers = [("x-fake-freeze-after", "1"), ("x-fake-interval-ms", "5")];
    let response = client
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    assert_eq!(response.version(), Version::HTTP_2);
    let mut body = response.into_body();
    let text: String = frames_until_quiet(&mut body, Duration::from_millis(100))
        .await
        .into_iter()
        .map(|f| f.1)
        .collect();
    assert!(text.contains("tok1 "));
    let dropped = Instant::now();
    drop(body);
    let request = fake
        .wait_request_finished(0, PATIENCE)
        .await
        .expect("body never dropped");
    assert!(!request.completed);
    assert_eq!(request.version, Version::HTTP_2);
    let lag = request
        .finished_at
        .unwrap()
        .saturating_duration_since(dropped);
    assert!(lag < PROMPT, "dropped after {lag:?}");
    // Only the stream was reset; the connection lives on until the client goes.
    assert_eq!(fake.open_connections(), 1);
    drop(client);
    assert!(fake.wait_open_connections(0, PATIENCE).await);
}

#[tokio::test]
async fn h2_reset_ends_a_pending_head() {
    let fake = fake().await;
    let client = h2();
    let pending = tokio::spawn(client.request(post(
        &fake,
        "/v1/chat/completions",
        CHAT,
        &[("x-fake-ttft-ms", "10000")],
    )));
    assert!(fake.wait_for_requests(1, PATIENCE).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let dropped = Instant::now();
    pending.abort();
    let request = fake
        .wait_request_finished(0, PATIENCE)
        .await
        .expect("service future never dropped");
    let lag = request
        .finished_at
        .unwrap()
        .saturating_duration_since(dropped);
    assert!(lag < PROMPT, "dropped after {lag:?}");
    assert_eq!(fake.open_connections(), 1);
}

#[tokio::test]
async fn many_concurrent_h2_streams() {
    let fake = fake().await;
    let client = h2();
    let headers = [
        ("x-fake-chunks", "3"),
        ("x-fake-interval-ms", "20"),
        ("x-fake-ttft-ms", "20"),
    ];
    let started = Instant::now();
    let streams = (0..2000).map(|_| {
        let request = client.request(post(&fake, "/v1/chat/completions", CHAT, &headers));
        async move { text_of(request.await.unwrap()).await }
    });
    let bodies = futures_join_all(streams).await;
    assert!(bodies.iter().all(|b| b.ends_with("data: [DONE]\n\n")));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(fake.requests().iter().all(|r| r.completed));
    assert_eq!(fake.connections().len(), 1);
}

/// `futures` is not a dependency; a JoinSet does the same for 'static futures.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<String>
where
    F: Future<Output = String> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for future in futures {
        set.spawn(future);
    }
    let mut out = Vec::new();
    while let Some(result) = set.join_next().await {
        out.push(result.unwrap());
    }
    out
}

#[tokio::test]
async fn never_accepting_listener_hangs_connects() {
    let (_guard, addr) = never_accepting_listener().unwrap();
    let attempt = tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await;
    assert!(attempt.is_err(), "connect finished: {attempt:?}");
}
