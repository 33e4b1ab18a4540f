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
