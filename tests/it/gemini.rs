//! Gemini's native stream (`:streamGenerateContent?alt=sse`) on routes whose upstream has no
//! `api` (break audit YB 1): its data-only error event is the upstream's error, before output
//! (failed over by its code) and after it (logged and counted), and the cut a gateway writes
//! in Gemini's shape is read so by another Hourglass in front of it.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;

const PATH: &str = "/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse";
const CHUNK: &str = "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hi\"}],\"role\": \"model\"}}],\"modelVersion\": \"gemini-2.0-flash\"}\r\n\r\n";
const LAST: &str = "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \" there\"}],\"role\": \"model\"},\"finishReason\": \"STOP\"}]}\r\n\r\n";

/// Gemini's own error event, with `code`.
fn error_event(code: u16, status: &str) -> String {
    format!(
        "data: {{\"error\": {{\"code\": {code}, \"message\": \"m{code}\", \"status\": \"{status}\"}}}}\r\n\r\n"
    )
}

/// An upstream that answers every request with a chunked SSE head and `events`, one HTTP/1.1
/// chunk each, then keeps the connection open (silent) for a minute.
async fn gemini_upstream(events: &[&str]) -> SocketAddr {
    let mut answer = vec![(
        Duration::ZERO,
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec(),
    )];
    for event in events {
        let mut frame = format!("{:x}\r\n", event.len()).into_bytes();
        frame.extend_from_slice(event.as_bytes());
        frame.extend_from_slice(b"\r\n");
        answer.push((Duration::from_millis(20), frame));
    }
    answer.push((Duration::from_secs(60), b"0\r\n\r\n".to_vec()));
    raw_upstream(answer).await
}

/// A gateway whose route `gemini` (`/v1beta/`) goes to `primary` (no `api`), with `route`
/// added to the route and `upstreams` beside it; the limits of `BASE` (first token 2 s, idle
/// 1 s) unless `limits` replaces them.
async fn gateway(primary: &str, route: &str, upstreams: &str, limits: Option<&str>) -> Harness {
    let mut toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
budget = "10s"
max_budget = "30s"
connect_timeout = "500ms"
{}

[upstreams.primary]
url = "{primary}"
auth = "none"
{upstreams}

[[routes]]
name = "gemini"
path_prefix = "/v1beta/"
upstream = "primary"
{route}
"#,
        limits.unwrap_or("first_token_timeout = \"2s\"\nidle_timeout = \"1s\"")
    );
    toml.push('\n');
    Harness::with_config(&toml).await
}

fn request() -> http::Request<http_body_util::Full<bytes::Bytes>> {
    http::Request::post(PATH)
        .header("host", "gateway")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            br#"{"contents":[{"parts":[{"text":"hi"}]}]}"#,
        )))
        .unwrap()
}

/// The next `n` bytes of `body`, however many frames carry them; fails after 10 s.
async fn next_bytes(body: &mut hyper::body::Incoming, n: usize) -> Vec<u8> {
    use http_body_util::BodyExt;
    let mut got = Vec::new();
    while got.len() < n {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("the bytes within 10 s")
            .expect("more frames")
            .expect("a frame");
        if let Ok(d) = frame.into_data() {
            got.extend_from_slice(&d);
        }
    }
    got
}

async fn outcome(h: &Harness, outcome: &str) -> f64 {
    h.metric(&format!(
        "hourglass_requests_total{{outcome=\"{outcome}\",route=\"gemini\"}}"
    ))
    .await
}

async fn stream_errors(h: &Harness, kind: &str) -> f64 {
    h.metric(&format!(
        "hourglass_upstream_stream_errors_total{{route=\"gemini\",type=\"{kind}\",upstream=\"primary\"}}"
    ))
    .await
}

async fn first_tokens(h: &Harness) -> f64 {
    h.metric("hourglass_time_to_first_token_seconds_count{route=\"gemini\",upstream=\"primary\"}")
        .await
}

/// An upstream's error event mid-stream ends the stream where it ends (nothing after it is
/// sent on), and the request is logged and counted as the upstream's error, typed by its code;
/// as the first event it is no first token either. Read as any stream of unknown format, it
/// was output: logged `ok`, counted nowhere, the error the first token.
#[tokio::test]
async fn a_gemini_error_event_is_the_upstreams_error_and_no_token() {
    let error = error_event(429, "RESOURCE_EXHAUSTED");
    for (events, tokens) in [
        (vec![CHUNK, error.as_str(), LAST], 1.0),
        (vec![error.as_str(), LAST], 0.0),
    ] {
        let up = gemini_upstream(&events).await;
        let h = gateway(&format!("http://{up}"), "", "", None).await;
        let (resp, _c) = h.send(request()).await;
        assert_eq!(resp.status(), 200);
        let read = read_body(resp.into_body()).await;
        assert_eq!(read.error, None);
        let end = events.iter().position(|e| *e == error).unwrap();
        assert_eq!(
            read.text(),
            events[..=end].concat(),
            "nothing after the error"
        );
        h.wait_requests("gemini", 1.0).await;
        assert_eq!(outcome(&h, "error").await, 1.0);
        assert_eq!(outcome(&h, "ok").await, 0.0);
        assert_eq!(stream_errors(&h, "rate_limit_error").await, 1.0);
        assert_eq!(first_tokens(&h).await, tokens, "{events:?}");
    }
}

/// Before any output, on a route with a fallback (its head held), Gemini's error event is
/// the upstream's answer to try again where its code says so: a 503 fails over, a 400 (the
/// request's fault) passes through to the client, the fallback never asked.
#[tokio::test]
async fn a_gemini_error_event_before_output_fails_over_by_its_code() {
    for (code, status, falls_back) in [
        (503, "UNAVAILABLE", true),
        (429, "RESOURCE_EXHAUSTED", true),
        (400, "INVALID_ARGUMENT", false),
    ] {
        let error = error_event(code, status);
        let up = gemini_upstream(&[error.as_str()]).await;
        let backup = gemini_upstream(&[CHUNK, LAST]).await;
        let h = gateway(
            &format!("http://{up}"),
            "fallbacks = [\"backup\"]",
            &format!("[upstreams.backup]\nurl = \"http://{backup}\"\nauth = \"none\""),
            None,
        )
        .await;
        let (resp, _c) = h.send(request()).await;
        assert_eq!(resp.status(), 200, "{code}");
        let mut body = resp.into_body();
        let fell_back =
            "hourglass_fallbacks_total{from=\"primary\",route=\"gemini\",to=\"backup\"}";
        if falls_back {
            // The backup's stream (kept open after it: the test reads what it needs).
            let want = format!("{CHUNK}{LAST}");
            let text = String::from_utf8(next_bytes(&mut body, want.len()).await).unwrap();
            assert_eq!(text, want, "{code}");
            assert_eq!(h.metric(fell_back).await, 1.0, "{code}");
        } else {
            let read = read_body(body).await;
            assert_eq!(read.text(), error, "{code}");
            assert_eq!(h.metric(fell_back).await, 0.0, "{code}");
            h.wait_requests("gemini", 1.0).await;
            assert_eq!(outcome(&h, "error").await, 1.0);
            assert_eq!(stream_errors(&h, "invalid_request_error").await, 1.0);
        }
    }
}

/// Two gateways chained, the inner one's limits the shorter: its cut of a Gemini stream, a
/// data-only event in Gemini's shape (which google-genai raises with its message), reaches
/// the client as it was written, and the front reads it as its upstream's error: logged and
/// counted as one, never `ok`, and no first token (where the first-token limit cut) nor a
/// token after the output (where the idle limit did). Read as output, the front logged `ok`
/// and took the error for its first token.
#[tokio::test]
async fn a_cut_down_the_chain_is_an_error_in_geminis_shape_at_the_front() {
    for (events, code, tokens) in [
        (vec![], "first_token_timeout", 0.0),
        (vec![CHUNK], "idle_timeout", 1.0),
    ] {
        let up = gemini_upstream(&events).await;
        let inner = gateway(&format!("http://{up}"), "", "", None).await;
        let front = gateway(
            &format!("http://{}", inner.addr()),
            "",
            "",
            Some("first_token_timeout = \"5s\"\nidle_timeout = \"3s\""),
        )
        .await;
        let (resp, _c) = front.send(request()).await;
        assert_eq!(resp.status(), 200, "{code}");
        let read = read_body(resp.into_body()).await;
        assert_eq!(read.error, None, "{code}");
        let text = read.text();
        let event = text
            .strip_prefix(&events.concat())
            .and_then(|rest| rest.strip_prefix("data: "))
            .and_then(|rest| rest.strip_suffix("\n\n"))
            .unwrap_or_else(|| panic!("{code}: one data-only event after the output: {text:?}"));
        let v: serde_json::Value = serde_json::from_str(event).unwrap();
        assert_eq!(v["error"]["code"], 504, "{v}");
        assert_eq!(v["error"]["status"], "DEADLINE_EXCEEDED", "{v}");
        assert_eq!(v["error"]["details"][0]["reason"], code, "{v}");
        front.wait_requests("gemini", 1.0).await;
        inner.wait_requests("gemini", 1.0).await;
        // The inner gateway cut it (a limit: counted as a cancellation); the front had its
        // upstream's error.
        assert_eq!(outcome(&inner, "cancelled").await, 1.0, "{code}");
        assert_eq!(outcome(&front, "error").await, 1.0, "{code}");
        assert_eq!(outcome(&front, "ok").await, 0.0, "{code}");
        assert_eq!(stream_errors(&front, "timeout_error").await, 1.0, "{code}");
        assert_eq!(first_tokens(&front).await, tokens, "{code}");
    }
}
