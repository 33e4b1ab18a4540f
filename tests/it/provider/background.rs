//! Background responses (audit UC 4): the usage a resumed stream's `response.completed`
//! carries is counted, and calls that generate nothing (the `queued` acknowledgement of a
//! background `POST`, polls, `/cancel`, `DELETE`, a resume) take no time-to-first-token sample.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use super::tokens;

const RESUMED: &str = concat!(
    "event: response.created\n",
    "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"background\":true,\"usage\":null}}\n\n",
    "event: response.output_text.delta\n",
    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n",
    "event: response.completed\n",
    "data: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"background\":true,\"usage\":{\"input_tokens\":50,\"output_tokens\":120,\"output_tokens_details\":{\"reasoning_tokens\":64},\"total_tokens\":170}}}\n\n",
);

const QUEUED: &str =
    r#"{"id":"resp_1","object":"response","status":"queued","background":true,"usage":null}"#;

/// An upstream that answers every request with `content_type` and `body`, whole.
async fn upstream(content_type: &str, body: &str) -> SocketAddr {
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    raw_upstream(vec![(Duration::ZERO, answer.into_bytes())]).await
}

async fn gateway(up: SocketAddr) -> Harness {
    let toml = BASE.replace("{FAKE}", &format!("http://{up}"))
        + r#"
[[routes]]
name = "responses"
path_prefix = "/v1/responses"
upstream = "fake"
"#;
    Harness::with_config(&toml).await
}

fn request(method: &str, path: &str, body: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", "gateway")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap()
}

const TTFT: &str =
    "hourglass_time_to_first_token_seconds_count{route=\"responses\",upstream=\"fake\"}";

#[tokio::test]
async fn a_resumed_background_stream_counts_its_usage() {
    let h = gateway(upstream("text/event-stream", RESUMED).await).await;
    let (resp, _c) = h
        .send(request("GET", "/v1/responses/resp_1?stream=true", ""))
        .await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert_eq!(read.text(), RESUMED, "passed as it came");
    h.wait_requests("responses", 1.0).await;
    assert_eq!(
        h.metric(&tokens("responses", "prompt", "reported")).await,
        50.0
    );
    assert_eq!(
        h.metric(&tokens("responses", "completion", "reported"))
            .await,
        120.0
    );
    assert_eq!(h.metric(TTFT).await, 0.0, "a resume generates nothing");
    // Polled, the stored response is a document read again: not counted.
    let (resp, _c) = h.send(request("GET", "/v1/responses/resp_1", "")).await;
    read_body(resp.into_body()).await;
    h.wait_requests("responses", 2.0).await;
    assert_eq!(
        h.metric(&tokens("responses", "completion", "reported"))
            .await,
        120.0
    );
}

#[tokio::test]
async fn calls_that_generate_nothing_take_no_first_token_sample() {
    let h = gateway(upstream("application/json", QUEUED).await).await;
    let calls = [
        (
            "POST",
            "/v1/responses",
            r#"{"model":"m","input":"hi","background":true}"#,
        ),
        ("GET", "/v1/responses/resp_1", ""),
        ("POST", "/v1/responses/resp_1/cancel", ""),
        ("DELETE", "/v1/responses/resp_1", ""),
    ];
    for (i, (method, path, body)) in calls.iter().enumerate() {
        let (resp, _c) = h.send(request(method, path, body)).await;
        assert_eq!(resp.status(), 200, "{method} {path}");
        read_body(resp.into_body()).await;
        h.wait_requests("responses", (i + 1) as f64).await;
        assert_eq!(h.metric(TTFT).await, 0.0, "{method} {path}");
    }
    // A call of the model, background streamed or not, takes one.
    for (n, body) in [
        (1.0, r#"{"model":"m","input":"hi"}"#),
        (
            2.0,
            r#"{"model":"m","input":"hi","background":true,"stream":true}"#,
        ),
    ] {
        let (resp, _c) = h.send(request("POST", "/v1/responses", body)).await;
        read_body(resp.into_body()).await;
        h.wait_requests("responses", 4.0 + n).await;
        assert_eq!(h.metric(TTFT).await, n, "{body}");
    }
}

/// A gateway whose `/v1/responses` route allows 1 s to the first token (10 s between events).
async fn gateway_with_first_token_limit(up: SocketAddr) -> Harness {
    let toml = BASE.replace("{FAKE}", &format!("http://{up}"))
        + r#"
[[routes]]
name = "responses"
path_prefix = "/v1/responses"
upstream = "fake"
first_token_timeout = "1s"
idle_timeout = "10s"
"#;
    Harness::with_config(&toml).await
}

/// An event stream's head, its body delimited by the connection's close.
const STREAM_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";

const OK: &str = "hourglass_requests_total{outcome=\"ok\",route=\"responses\"}";

/// Audit VC 1: a resumed background stream asks the model nothing; one of a response that
/// reasons silently (nothing after `response.in_progress` for longer than the route's
/// `first_token_timeout`) runs on to its end, as before UC 4, and its usage is counted.
/// Before the fix: cut at 1 s with a `first_token_timeout` error event, counted `detached`.
#[tokio::test(start_paused = true)]
async fn a_resumed_stream_that_reasons_silently_is_not_cut_at_the_first_token_limit() {
    let split = RESUMED.find("event: response.output_text.delta").unwrap();
    let (head, rest) = RESUMED.split_at(split);
    let up = raw_upstream(vec![
        (Duration::ZERO, format!("{STREAM_HEAD}{head}").into_bytes()),
        (Duration::from_secs(3), rest.as_bytes().to_vec()),
    ])
    .await;
    let h = gateway_with_first_token_limit(up).await;
    let (resp, _c) = h
        .send(request("GET", "/v1/responses/resp_1?stream=true", ""))
        .await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert_eq!(read.text(), RESUMED, "passed whole, as it came");
    h.wait_requests("responses", 1.0).await;
    assert_eq!(h.metric(OK).await, 1.0);
    assert_eq!(
        h.metric(&tokens("responses", "prompt", "reported")).await,
        50.0
    );
}

/// Audit VC 2: a resumed stream that ends cleanly without `response.completed` (a cancelled
/// response; `starting_after` at or past the last event gives an empty stream) is a normal
/// end, passed as it came and counted `ok`, as before UC 4. Before the fix: an injected
/// "the stream ended before the answer did" error event, counted an `error`.
#[tokio::test(start_paused = true)]
async fn a_resumed_stream_that_ends_without_a_terminal_event_passes() {
    let cut = RESUMED.find("event: response.completed").unwrap();
    for (n, body) in [(1.0, &RESUMED[..cut]), (2.0, "")] {
        let up = raw_upstream(vec![(
            Duration::ZERO,
            format!("{STREAM_HEAD}{body}").into_bytes(),
        )])
        .await;
        let h = gateway_with_first_token_limit(up).await;
        let (resp, _c) = h
            .send(request("GET", "/v1/responses/resp_1?stream=true", ""))
            .await;
        assert_eq!(resp.status(), 200, "{body:?}");
        let read = read_body(resp.into_body()).await;
        assert_eq!(read.text(), body, "passed as it came");
        h.wait_requests("responses", 1.0).await;
        assert_eq!(h.metric(OK).await, 1.0, "case {n}: {body:?}");
    }
}
