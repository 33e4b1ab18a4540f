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

mod apis;
mod records;
mod shapes;
mod timing;

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

/// The events of the answer to one scripted POST, read to its end.
async fn events_of(
    client: &TestClient,
    fake: &FakeUpstream,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Vec<Sse> {
    let response = client
        .request(post(fake, path, body, headers))
        .await
        .unwrap();
    parse_sse(&text_of(response).await)
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
