//! llama.cpp's error event (audit WB 2): its server writes an error inside a 200 stream as a
//! block with an `error:` field and no `data:` line, which every SDK skips as the WHATWG
//! reading does. Read by a real loopback upstream's stream: a client that streams gets the
//! gateway's `event: error` with the provider's message in its place, a client that did not
//! stream the provider's status and message; it is counted as the provider's error, and a 4xx
//! before output is not failed over. A block that also has data is read as the standard
//! reads it (audit YC 1), any value gives the message (YC 2), and a block past the 1 MiB hold
//! is cut and ends with the error event too (YC 3).

use std::time::Duration;

use http_body_util::BodyExt;
use tokio::time::Instant;

use crate::stream_upstream::{post, CONFIG};
use crate::support::{json_body, Harness};

const CHUNK: &str = r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"tok0 "},"finish_reason":null}]}"#;
const FINISH: &str = r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
const ERROR: &str = r#"{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}"#;
const MESSAGE: &str = "the request exceeds the available context size";

/// The routes of `stream_upstream`'s tests, and one that falls back to the same fake under
/// another name.
async fn harness() -> Harness {
    let config = format!(
        "{CONFIG}\n[upstreams.again]\nurl = \"{{FAKE}}\"\nauth = \"none\"\n\n\
         [[routes]]\nname = \"fallback\"\npath_prefix = \"/v1/chat/completions\"\n\
         models = [\"fallback\"]\nupstream = \"fake\"\nfallbacks = [\"again\"]\n"
    );
    Harness::with_config(&config).await
}

/// A streaming request on `model`'s route: its status and body.
async fn stream(h: &Harness, model: &str) -> (u16, String) {
    let body = format!(r#"{{"model":"{model}","stream":true,"messages":[]}}"#);
    let (resp, _c) = h.send(post("/v1/chat/completions", body, &[])).await;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The events a WHATWG parser dispatches from `body` (LF line ends): type and data.
fn events(body: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for block in body.split("\n\n") {
        let (mut kind, mut data) = (String::from("message"), None::<String>);
        for line in block.lines() {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => kind = value.to_owned(),
                "data" => match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => data = Some(value.to_owned()),
                },
                _ => {}
            }
        }
        if let Some(data) = data {
            out.push((kind, data));
        }
    }
    out
}

/// The gateway's error event, last of `body`'s events and alone of its kind: its error.
fn gateway_error(body: &str) -> serde_json::Value {
    let events = events(body);
    let (kind, data) = events.last().expect("an event");
    assert_eq!(kind, "error", "{body}");
    assert_eq!(events.iter().filter(|(k, _)| k == "error").count(), 1);
    let data: serde_json::Value = serde_json::from_str(data).unwrap();
    assert_eq!(data["type"], "error");
    assert_eq!(data["error"]["code"], "upstream_error", "{data}");
    data["error"].clone()
}

/// Waits until the metric `sample` reads `want` (recorded once the request's body is gone).
async fn counted(h: &Harness, sample: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.metric(sample).await != want {
        assert!(
            Instant::now() < deadline,
            "{sample} is not {want}: {}",
            h.metrics_text().await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// After output: the stream ended as a success for the SDK and was logged `ok`. Now the
/// block is replaced by the gateway's error event with the provider's message, nothing after
/// it, and the request is the provider's error (its type from the code, 400), outcome error.
#[tokio::test]
async fn after_output_the_client_reads_the_providers_error() {
    let h = harness().await;
    h.replay(&format!(
        "data: {CHUNK}\n\nerror: {ERROR}\n\ndata: [DONE]\n\n"
    ));
    let (status, body) = stream(&h, "plain").await;
    assert_eq!(status, 200);
    assert!(
        body.starts_with(&format!("data: {CHUNK}\n\nevent: error\n")),
        "{body}"
    );
    assert!(!body.contains("[DONE]") && !body.contains("exceed_context_size_error"));
    let error = gateway_error(&body);
    assert!(
        error["message"].as_str().unwrap().ends_with(MESSAGE),
        "{error}"
    );
    counted(
        &h,
        "hourglass_upstream_stream_errors_total{route=\"plain\",type=\"invalid_request_error\",upstream=\"fake\"}",
        1.0,
    )
    .await;
    counted(
        &h,
        "hourglass_requests_total{outcome=\"error\",route=\"plain\"}",
        1.0,
    )
    .await;
}

/// Before output, on a route with a fallback: a 400 is the provider's answer, not failed
/// over (the request was retried as a 5xx); a 503 in its code is failed over, as a 503 is.
#[tokio::test]
async fn before_output_a_4xx_is_not_failed_over_and_a_5xx_is() {
    let h = harness().await;
    h.replay(&format!("error: {ERROR}\n\ndata: [DONE]\n\n"));
    let before = h.fake.requests().len();
    let (status, body) = stream(&h, "fallback").await;
    assert_eq!(status, 200);
    assert_eq!(
        h.fake.requests().len() - before,
        1,
        "a 400 is not failed over"
    );
    assert!(body.starts_with("event: error\n"), "{body}");
    assert!(gateway_error(&body)["message"]
        .as_str()
        .unwrap()
        .ends_with(MESSAGE));
    h.replay("error: {\"code\":503,\"message\":\"loading model\"}\n\ndata: [DONE]\n\n");
    let before = h.fake.requests().len();
    let (_, body) = stream(&h, "fallback").await;
    assert_eq!(h.fake.requests().len() - before, 2, "a 503 is failed over");
    assert!(gateway_error(&body)["message"]
        .as_str()
        .unwrap()
        .ends_with("loading model"));
}

/// Audit YC 2: a value that is no JSON (or a JSON string) is the message, to a client that
/// streams and to one that did not (which got the gateway's 502 without it): no status in it,
/// so a 502, with the provider's words.
#[tokio::test]
async fn any_value_gives_the_message() {
    let h = harness().await;
    for (value, message) in [
        ("the model crashed: {oops}", "the model crashed: {oops}"),
        (r#""server busy""#, "server busy"),
    ] {
        h.replay(&format!("data: {CHUNK}\n\nerror: {value}\n\n"));
        let (_, body) = stream(&h, "plain").await;
        let error = gateway_error(&body);
        assert!(
            error["message"].as_str().unwrap().ends_with(message),
            "{error}"
        );
        let (resp, _c) = h.send(crate::stream_upstream::chat("watched", &[])).await;
        assert_eq!(resp.status(), 502, "{value}");
        let got = json_body(resp).await;
        assert_eq!(got["error"]["message"], message, "{got}");
    }
}

/// A client that did not stream gets the provider's status (its `code`) and its message,
/// after output as before it.
#[tokio::test]
async fn a_client_that_did_not_stream_gets_the_providers_status_and_message() {
    let h = harness().await;
    for head in [format!("data: {CHUNK}\n\n"), String::new()] {
        h.replay(&format!("{head}error: {ERROR}\n\ndata: [DONE]\n\n"));
        let (resp, _c) = h.send(crate::stream_upstream::chat("watched", &[])).await;
        assert_eq!(resp.status(), 400);
        let got = json_body(resp).await;
        assert_eq!(got["error"]["message"], MESSAGE, "{got}");
        assert_eq!(got["error"]["type"], "exceed_context_size_error", "{got}");
    }
}

/// Audit YC 1: a block with both an `error:` field and a `data:` line is read as the standard
/// reads it: its data is delivered, and the stream passes as it came, `ok`.
#[tokio::test]
async fn a_block_with_data_and_an_error_field_is_delivered() {
    let h = harness().await;
    let upstream = format!("error: {ERROR}\ndata: {CHUNK}\n\ndata: {FINISH}\n\ndata: [DONE]\n\n");
    h.replay(&upstream);
    let (status, body) = stream(&h, "plain").await;
    assert_eq!(status, 200);
    assert_eq!(body, upstream);
    counted(
        &h,
        "hourglass_requests_total{outcome=\"ok\",route=\"plain\"}",
        1.0,
    )
    .await;
}

/// Audit YC 3: a block past the 1 MiB an event is held for went out raw as it came, and the
/// client read a cut answer as a success while the log said error. Its part that went out
/// is ended (`\n\n`: a line of an unknown field, which dispatches nothing), the rest dropped,
/// and the gateway's error event follows: the client reads the error the log names.
#[tokio::test]
async fn a_block_past_the_hold_ends_with_the_error_event() {
    let h = harness().await;
    // Twice the hold: the upstream's frames (64 KiB at most) that take the block past it
    // cannot also bring its end, which would complete it (and replace it whole).
    let long = "x".repeat(2 * 1_048_576);
    let head = format!("data: {CHUNK}\n\n");
    h.replay(&format!(
        "{head}error: {{\"code\":400,\"message\":\"{long}\"}}\n\ndata: [DONE]\n\n"
    ));
    let (status, body) = stream(&h, "plain").await;
    assert_eq!(status, 200);
    // Part of the block went out before its end came; its end did not.
    assert!(body.starts_with(&format!("{head}error: {{\"code\":400")));
    assert!(!body.contains("xxxx\"}"), "the block's end was dropped");
    let events = events(&body);
    assert_eq!(events.len(), 2, "the chunk, then the error");
    assert_eq!(events[0].1, CHUNK);
    let error = gateway_error(&body);
    assert!(
        error["message"].as_str().unwrap().contains("xxxx"),
        "{error}"
    );
    assert!(body.ends_with("}\n\n") && !body.contains("[DONE]"));
    counted(
        &h,
        "hourglass_requests_total{outcome=\"error\",route=\"plain\"}",
        1.0,
    )
    .await;
}

/// Break audit ZC 2: a gateway in front of another read the inner one's event for a
/// llama.cpp 503 as an error of no kind (`upstream_error`), and did not fail it over as one
/// gateway does. The inner event carries the provider's kind (`overloaded_error`), which the
/// front reads as it reads the provider's own events: before output, it falls back.
#[tokio::test]
async fn a_503_block_down_the_chain_is_failed_over_at_the_front() {
    let inner = harness().await;
    inner.replay("error: {\"code\":503,\"message\":\"loading model\"}\n\ndata: [DONE]\n\n");
    let front = Harness::with_config(&format!(
        "{CONFIG}\n[upstreams.inner]\nurl = \"http://{}\"\nauth = \"none\"\n\
         model = \"plain\"\n\n\
         [[routes]]\nname = \"chained\"\npath_prefix = \"/v1/chat/completions\"\n\
         models = [\"chained\"]\nupstream = \"inner\"\nfallbacks = [\"fake\"]\n",
        inner.addr()
    ))
    .await;
    // The inner gateway's own event, as its client reads it.
    let (_, body) = stream(&inner, "plain").await;
    let error = gateway_error(&body);
    assert_eq!(error["type"], "overloaded_error", "{error}");
    // The front's upstream sends `chained` on as the inner gateway's `plain`.
    let (status, body) = stream(&front, "chained").await;
    assert_eq!(status, 200);
    assert!(!body.contains("event: error"), "{body}");
    assert!(body.contains("[DONE]"), "{body}");
    assert_eq!(front.fake.requests().len(), 1, "the fallback answered");
    counted(
        &front,
        "hourglass_fallbacks_total{from=\"inner\",route=\"chained\",to=\"fake\"}",
        1.0,
    )
    .await;
    // Break audit AH 1: a block of no kind the rules know (a 409, a text) was the inner's
    // `upstream_error`, which the front failed over as a broken upstream where one gateway
    // passes it on. It is `other`, passed on at the front too.
    for block in [r#"{"code":409,"message":"conflict"}"#, "just some text"] {
        inner.replay(&format!("error: {block}\n\ndata: [DONE]\n\n"));
        let (_, body) = stream(&inner, "plain").await;
        assert_eq!(gateway_error(&body)["type"], "other", "{block}");
        let (status, body) = stream(&front, "chained").await;
        assert_eq!(status, 200);
        assert_eq!(gateway_error(&body)["type"], "other", "{block}: {body}");
        assert_eq!(front.fake.requests().len(), 1, "{block}: not failed over");
    }
}
