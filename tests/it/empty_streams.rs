//! A 2xx event stream of a known API (Chat Completions, Messages, Responses) that ends before
//! any event of its answer (audit MC 1): an empty body, chunked or close-delimited, or one of
//! comments or pings alone (or `data: [DONE]` alone, audit NA 5). The answer never began, so it is a truncation like any other: a
//! streaming client gets `event: error`, the request and the upstream's health count it as a
//! failure, and on a route that holds the head until the first token a fallback answers
//! instead. Before, each passed as an empty 200 logged `ok`, and no fallback was tried.

use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use hourglass::config::Config;
use hourglass::server::{self, Running};
use hourglass_fake::FakeUpstream;
use http_body_util::Full;
use hyper::Request;
use tokio::time::Instant;

const CONFIG: &str = r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
budget = "5s"
max_budget = "30s"
connect_timeout = "500ms"
first_token_timeout = "2s"
idle_timeout = "1s"

[upstreams.primary]
url = "{PRIMARY}"
auth = "none"

[upstreams.backup]
url = "{BACKUP}"
auth = "none"

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "primary"
{ROUTE}

[[routes]]
name = "messages"
path_prefix = "/v1/messages"
upstream = "primary"
{ROUTE}

[[routes]]
name = "responses"
path_prefix = "/v1/responses"
upstream = "primary"
{ROUTE}

[[routes]]
name = "other"
path_prefix = "/v1/other"
upstream = "primary"
{ROUTE}
"#;

/// The calls whose streams the gateway reads, by route name, path and streaming body.
const APIS: [(&str, &str, &str); 3] = [
    (
        "chat",
        "/v1/chat/completions",
        r#"{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    ),
    (
        "messages",
        "/v1/messages",
        r#"{"model":"claude-test","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#,
    ),
    (
        "responses",
        "/v1/responses",
        r#"{"model":"gpt-test","stream":true,"input":"hi"}"#,
    ),
];

const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n";

/// A chunked event stream of `body` (one chunk, if any), ended cleanly.
fn chunked(body: &str) -> Vec<u8> {
    let mut out = format!("{SSE_HEAD}transfer-encoding: chunked\r\n\r\n");
    if !body.is_empty() {
        out.push_str(&format!("{:x}\r\n{body}\r\n", body.len()));
    }
    out.push_str("0\r\n\r\n");
    out.into_bytes()
}

/// The clean ends of an answer that never began, by name.
fn ends() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("empty chunked", chunked("")),
        // No length and no chunks: the body ends where the upstream closes.
        ("close-delimited", format!("{SSE_HEAD}\r\n").into_bytes()),
        ("comments", chunked(": ping\n\n: keep-alive\n\n")),
        (
            "event: ping",
            chunked("event: ping\ndata: {\"type\":\"ping\"}\n\n"),
        ),
        // Neither the end marker nor a keep-alive without its `event:` line begins an answer
        // (audit NA 5: both passed as an empty 200 to a streaming client, on Chat).
        ("[DONE] alone", chunked("data: [DONE]\n\n")),
        ("data-only ping", chunked("data: {\"type\":\"ping\"}\n\n")),
    ]
}

struct Gateway {
    backup: FakeUpstream,
    gw: Running,
}

/// A gateway whose routes (`route` added to each) all call an upstream that answers every
/// request with `answer` and closes.
async fn gateway(answer: Vec<u8>, route: &str) -> Gateway {
    let primary = raw_upstream(vec![(Duration::ZERO, answer)]).await;
    let backup = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let text = CONFIG
        .replace("{PRIMARY}", &format!("http://{primary}"))
        .replace("{BACKUP}", &backup.url())
        .replace("{ROUTE}", route);
    let config = Config::from_toml(&text, "empty-streams.toml").unwrap();
    let gw = server::start(config).await.unwrap();
    Gateway { backup, gw }
}

impl Gateway {
    async fn call(&self, path: &str, body: &str) -> (http::StatusCode, Read) {
        let req = Request::post(path)
            .header("host", "gateway")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let (resp, _c) = Conn::open(self.gw.addr).await.send(req).await;
        (resp.status(), read_body(resp.into_body()).await)
    }

    /// The count of `route`'s requests with `outcome`, once the request is reported.
    async fn outcome(&self, route: &str, outcome: &str) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut total = 0.0;
            for o in ["ok", "error", "cancelled"] {
                total += metric(
                    self.gw.admin_addr,
                    &format!("hourglass_requests_total{{outcome=\"{o}\",route=\"{route}\"}}"),
                )
                .await;
            }
            if total >= 1.0 {
                break;
            }
            assert!(Instant::now() < deadline, "route {route}: not reported");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        metric(
            self.gw.admin_addr,
            &format!("hourglass_requests_total{{outcome=\"{outcome}\",route=\"{route}\"}}"),
        )
        .await
    }

    async fn failures_in_a_row(&self, upstream: &str) -> u64 {
        let view: serde_json::Value =
            serde_json::from_str(&admin_get(self.gw.admin_addr, "/upstreams").await).unwrap();
        view["upstreams"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["name"] == upstream)
            .unwrap()["failures_in_a_row"]
            .as_u64()
            .unwrap()
    }
}

/// Without a retry or a fallback the head has gone when the stream ends: the client's stream
/// ends with `event: error`, and the request is an error. (The upstream's health was judged
/// by its head, as for any stream that fails after it.)
#[tokio::test]
async fn a_stream_that_ends_before_its_answer_began_ends_with_an_error_event() {
    for (end, answer) in ends() {
        for (route, path, body) in APIS {
            let g = gateway(answer.clone(), "").await;
            let (status, read) = g.call(path, body).await;
            let case = format!("{route}, {end}: {}", read.text());
            assert_eq!(status, 200, "{case}");
            assert!(read.error.is_none(), "{case}: {:?}", read.error);
            let error = read.error_event().unwrap_or_else(|| panic!("{case}"));
            assert_eq!(error["code"], "upstream_error", "{case}");
            assert!(
                error["message"]
                    .as_str()
                    .unwrap()
                    .contains("the stream ended before the answer did"),
                "{case}"
            );
            assert_eq!(g.outcome(route, "error").await, 1.0, "{case}");
        }
    }
}

/// With a retry and no fallback the head is held: each attempt fails and counts against the
/// upstream, and when none is left the client gets the 502 a `stream_upstream` route gives.
#[tokio::test]
async fn a_stream_that_ends_before_its_answer_began_is_retried() {
    for (end, answer) in ends() {
        for (route, path, body) in APIS {
            let g = gateway(answer.clone(), "retries = 1").await;
            let (status, read) = g.call(path, body).await;
            let case = format!("{route}, {end}: {}", read.text());
            assert_eq!(status, 502, "{case}");
            let v: serde_json::Value = serde_json::from_slice(&read.bytes).expect(&case);
            assert_eq!(v["error"]["code"], "upstream_error", "{case}");
            assert_eq!(g.outcome(route, "error").await, 1.0, "{case}");
            assert_eq!(g.failures_in_a_row("primary").await, 2, "{case}");
        }
    }
}

/// On a route with a fallback the head is held until the first token: the empty answer is a
/// failed attempt, and the fallback answers the client with a whole stream.
#[tokio::test]
async fn a_stream_that_ends_before_its_answer_began_falls_back() {
    for (end, answer) in ends() {
        for (route, path, body) in APIS {
            let g = gateway(answer.clone(), "fallbacks = [\"backup\"]").await;
            let (status, read) = g.call(path, body).await;
            let case = format!("{route}, {end}: {}", read.text());
            assert_eq!(status, 200, "{case}");
            assert!(
                read.error.is_none() && read.error_event().is_none(),
                "{case}"
            );
            assert!(!read.bytes.is_empty(), "{case}");
            assert_eq!(g.backup.requests().len(), 1, "{case}");
            assert_eq!(g.outcome(route, "ok").await, 1.0, "{case}");
            assert_eq!(
                metric(
                    g.gw.admin_addr,
                    &format!(
                        "hourglass_fallbacks_total{{from=\"primary\",route=\"{route}\",to=\"backup\"}}"
                    )
                )
                .await,
                1.0,
                "{case}"
            );
            assert_eq!(g.failures_in_a_row("primary").await, 1, "{case}");
        }
    }
}

/// A stream of an API the gateway does not read (a path of no known call) ends as it ends.
#[tokio::test]
async fn an_empty_stream_of_an_unknown_api_ends_as_it_ends() {
    for (end, answer) in ends() {
        let g = gateway(answer, "").await;
        let (status, read) = g.call("/v1/other", "{}").await;
        let case = format!("{end}: {}", read.text());
        assert_eq!(status, 200, "{case}");
        assert!(
            read.error.is_none() && read.error_event().is_none(),
            "{case}"
        );
        assert_eq!(g.outcome("other", "ok").await, 1.0, "{case}");
        assert_eq!(g.failures_in_a_row("primary").await, 0, "{case}");
    }
}

/// A 205 Reset Content has no content (RFC 9110 15.3.6), whatever its content-type says: it
/// is not an answer that could end short, and it goes out as it came, empty (audit NA 4),
/// whether its head passes at once or is held for a retry.
#[tokio::test]
async fn a_205_is_answered_without_content() {
    let answer = b"HTTP/1.1 205 Reset Content\r\ncontent-type: text/event-stream\r\n\
                   content-length: 0\r\nconnection: close\r\n\r\n"
        .to_vec();
    for route_extra in ["", "retries = 1"] {
        for (route, path, body) in APIS {
            let g = gateway(answer.clone(), route_extra).await;
            let (status, read) = g.call(path, body).await;
            let case = format!("{route}, {route_extra:?}: {}", read.text());
            assert_eq!(status, 205, "{case}");
            assert!(read.error.is_none(), "{case}: {:?}", read.error);
            assert!(read.bytes.is_empty(), "{case}");
            assert_eq!(g.outcome(route, "ok").await, 1.0, "{case}");
            assert_eq!(g.failures_in_a_row("primary").await, 0, "{case}");
        }
    }
}

/// The Chat streams of audit WB 1 that end with `data: [DONE]` before their answer began: a
/// role-only chunk and an OpenRouter comment (case A), and llama.cpp's `error:` line (case B).
/// openai-python and openai-node stop reading at `[DONE]`, so an error written after it was
/// never seen, and each SDK reported an empty success. The marker is held back and the
/// error event takes its place: it comes, and no `[DONE]` before it.
#[tokio::test]
async fn an_end_marker_before_the_answer_began_gives_way_to_the_error_event() {
    let cases = [
        (
            "A: role chunk, comment, [DONE]",
            "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\
             \"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n\
             : OPENROUTER PROCESSING\n\ndata: [DONE]\n\n",
        ),
        (
            "B: llama.cpp error line, [DONE]",
            "error: {\"code\":400,\"message\":\"the request exceeds the available context size\",\
             \"type\":\"exceed_context_size_error\"}\n\ndata: [DONE]\n\n",
        ),
    ];
    let (_, path, body) = APIS[0];
    for (case, stream) in cases {
        let g = gateway(chunked(stream), "").await;
        let (status, read) = g.call(path, body).await;
        let text = read.text();
        let case = format!("{case}: {text:?}");
        assert_eq!(status, 200, "{case}");
        assert!(read.error.is_none(), "{case}: {:?}", read.error);
        let at = text
            .find("event: error\n")
            .unwrap_or_else(|| panic!("{case}"));
        assert!(!text[..at].contains("[DONE]"), "{case}");
        assert!(read.error_event().is_some(), "{case}");
        assert_eq!(g.outcome("chat", "error").await, 1.0, "{case}");
    }
}
