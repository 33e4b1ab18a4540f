//! Large request bodies: the first-token clock starts once the body has gone out, so that an
//! upstream reading a long upload slowly is neither timed out for it nor blamed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hourglass::config::Config;
use hourglass::server;
use http::Request;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

/// Larger than everything the gateway's socket and hyper's buffers hold on loopback: the
/// upload waits on the upstream's reading.
const UPLOAD: usize = 12 * 1024 * 1024;

/// An upstream that reads a request's head, reads nothing more for `pause`, then reads the
/// body whole (setting `read_all`) and answers 200 at once, or, without `answer`, never.
async fn slow_reader(pause: Duration, answer: bool, read_all: Arc<AtomicBool>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let (end, len) = loop {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the request ended early");
            got.extend_from_slice(&buf[..n]);
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse().unwrap())
                    .expect("a content-length");
                break (end + 4, len);
            }
        };
        tokio::time::sleep(pause).await;
        let mut body = got.len() - end;
        while body < len {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the body ended early at {body} of {len}");
            body += n;
        }
        read_all.store(true, Ordering::SeqCst);
        if answer {
            let ok = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                      content-length: 2\r\nconnection: close\r\n\r\n{}";
            s.write_all(ok.as_bytes()).await.unwrap();
        }
        // Held open, unanswered, until the gateway lets go.
        let _ = s.read(&mut buf).await;
    });
    addr
}

async fn gateway(upstream: SocketAddr) -> server::Running {
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
max_request_body = 16777216

[defaults]
budget = "20s"
first_token_timeout = "1s"

[upstreams.slow]
url = "http://{upstream}"
auth = "none"

[[routes]]
name = "uploads"
path_prefix = "/"
upstream = "slow"
"#
    );
    let config = Config::from_toml(&toml, "test.toml").unwrap();
    server::start(config).await.unwrap()
}

async fn upload(gw: &server::Running) -> (u16, String) {
    let req = Request::post("/v1/audio/transcriptions")
        .header("host", "gateway")
        .header("content-type", "application/octet-stream")
        .body(Full::new(Bytes::from(vec![b'a'; UPLOAD])))
        .unwrap();
    let (resp, _c) = Conn::open(gw.addr).await.send(req).await;
    let status = resp.status().as_u16();
    (status, read_body(resp.into_body()).await.text())
}

async fn failures_in_a_row(gw: &server::Running) -> serde_json::Value {
    let view: serde_json::Value =
        serde_json::from_str(&admin_get(gw.admin_addr, "/upstreams").await).unwrap();
    view["upstreams"][0]["failures_in_a_row"].clone()
}

/// Audit DA 1: a 12 MB upload the upstream reads only after 3 s, past a first-token limit of
/// 1 s, was cut 504 `first_token_timeout` while still going out, and counted against the
/// upstream's health.
#[tokio::test]
async fn an_upload_read_slowly_is_not_a_first_token_timeout() {
    let read_all = Arc::new(AtomicBool::new(false));
    let up = slow_reader(Duration::from_secs(3), true, read_all.clone()).await;
    let gw = gateway(up).await;
    let (status, text) = upload(&gw).await;
    assert_eq!(status, 200, "{text}");
    assert!(read_all.load(Ordering::SeqCst));
    assert_eq!(failures_in_a_row(&gw).await, 0);
}

/// ... while an upstream that read the whole upload and then said nothing is still timed out,
/// from when the body went out, and blamed for it.
#[tokio::test]
async fn the_first_token_limit_runs_once_the_upload_is_sent() {
    let read_all = Arc::new(AtomicBool::new(false));
    let up = slow_reader(Duration::from_secs(3), false, read_all.clone()).await;
    let gw = gateway(up).await;
    let (status, text) = upload(&gw).await;
    assert_eq!(status, 504, "{text}");
    assert!(text.contains("first_token_timeout"), "{text}");
    // The limit fired after the upstream had the whole body.
    assert!(
        read_all.load(Ordering::SeqCst),
        "cut while uploading: {text}"
    );
    assert_eq!(failures_in_a_row(&gw).await, 1);
}

/// An upstream that reads a request's head, answers `answer` (if any) and reads nothing
/// more; the task ends when its connection is reset, which the socket holds as its pending
/// error (what it received stays readable before it).
async fn reads_only_the_head(
    answer: Option<&'static str>,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    let reset = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut head = vec![0u8; 16 * 1024];
        let n = s.read(&mut head).await.unwrap();
        assert!(n > 0, "a request came");
        if let Some(answer) = answer {
            s.write_all(answer.as_bytes()).await.unwrap();
        }
        loop {
            if let Ok(Some(_)) = s.take_error() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (up, reset)
}

async fn upload_with_budget(gw: &server::Running, budget_ms: &str) -> u16 {
    let req = Request::post("/v1/audio/transcriptions")
        .header("host", "gateway")
        .header("x-request-budget-ms", budget_ms)
        .body(Full::new(Bytes::from(vec![b'a'; UPLOAD])))
        .unwrap();
    let (resp, _c) = Conn::open(gw.addr).await.send(req).await;
    let status = resp.status().as_u16();
    read_body(resp.into_body()).await;
    status
}

/// Audit EA 2: an upload to an upstream that stopped reading, given up on (here at the
/// deadline), held its connection, its task and the body for as long as the upstream kept the
/// socket: hyper never noticed the cancel while its write waited. The connection is reset
/// instead (so the upstream never gets whole a request nobody waits for).
#[tokio::test]
async fn an_upload_given_up_on_ends_its_connection_though_the_upstream_reads_nothing() {
    let (up, reset) = reads_only_the_head(None).await;
    let gw = gateway(up).await;
    assert_eq!(upload_with_budget(&gw, "1000").await, 504);
    tokio::time::timeout(Duration::from_secs(5), reset)
        .await
        .expect("the upstream connection was reset")
        .unwrap();
}

/// Audit EC 1: an upstream that refuses an upload at once (413) and reads no more: the client
/// has the 413, and the connection, still writing the body, is reset once the answer is done
/// (RFC 9112 9.6), not held for as long as the upstream keeps the socket.
#[tokio::test]
async fn an_upload_answered_early_ends_its_connection() {
    let (up, reset) = reads_only_the_head(Some(
        "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\n\
         content-length: 2\r\n\r\n{}",
    ))
    .await;
    let gw = gateway(up).await;
    assert_eq!(upload_with_budget(&gw, "20000").await, 413);
    tokio::time::timeout(Duration::from_secs(5), reset)
        .await
        .expect("the upstream connection was reset")
        .unwrap();
}

/// An upstream that holds every request it reads (telling `got` of it) until `release` is
/// set, then answers it 200; requests read after that are answered at once.
async fn holding_upstream(
    got: tokio::sync::mpsc::UnboundedSender<()>,
    release: tokio::sync::watch::Receiver<bool>,
) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (got, mut release) = (got.clone(), release.clone());
            tokio::spawn(async move {
                loop {
                    read_request(&mut s).await;
                    let _ = got.send(());
                    let _ = release.wait_for(|r| *r).await;
                    let ok = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                              content-length: 2\r\n\r\n{}";
                    if s.write_all(ok.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Audit PC 1: a body stays in memory until the last attempt that could resend it is done,
/// and it counts against `request_body_memory` for as long. Its share was given back once the
/// request was admitted, before it went upstream: uploads held by a slow provider took 483 MB
/// against a pool of 256 MiB. Now the next body is refused (503 `overloaded`, `Retry-After`)
/// while the first is in flight, and admitted once it has ended.
#[tokio::test]
async fn a_body_in_flight_upstream_counts_against_request_body_memory() {
    let (got_tx, mut got) = tokio::sync::mpsc::unbounded_channel();
    let (release, released) = tokio::sync::watch::channel(false);
    let up = holding_upstream(got_tx, released).await;
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
max_request_body = 3000
request_body_memory = 4096

[defaults]
budget = "20s"
first_token_timeout = "10s"

[upstreams.held]
url = "http://{up}"
auth = "none"

[[routes]]
name = "uploads"
path_prefix = "/"
upstream = "held"
retries = 2
"#
    );
    let gw = server::start(Config::from_toml(&toml, "test.toml").unwrap())
        .await
        .unwrap();
    let send = |addr: SocketAddr| {
        let body = Bytes::from(vec![b'a'; 3000]);
        posted(
            addr,
            "/v1/audio/transcriptions",
            "application/octet-stream",
            body,
        )
    };
    // The first body goes upstream, and is held there.
    let first = tokio::spawn(send(gw.addr));
    got.recv().await.unwrap();

    // The second does not fit beside it: refused, and never forwarded.
    let (status, headers, text) = tokio::select! {
        second = send(gw.addr) => second,
        _ = got.recv() => panic!("a second body went upstream while the first was in flight"),
    };
    assert_eq!(status, 503, "{text}");
    assert_eq!(headers["retry-after"], "1");
    assert!(text.contains("\"code\":\"overloaded\""), "{text}");
    assert!(text.contains("request_body_memory (4096 bytes)"), "{text}");

    // The first ends: its bytes come back, and the next body is served.
    release.send(true).unwrap();
    let (status, _, text) = first.await.unwrap();
    assert_eq!(status, 200, "{text}");
    let (status, _, text) = send(gw.addr).await;
    assert_eq!(status, 200, "{text}");
}

/// Audit QA 2: an attempt whose upstream rewrites the body (here its `model`) sends a copy of
/// it, alive beside the template's until hyper has written it: on an upstream that reads
/// slowly or not at all, for as long as the call is in flight. Uncounted, bodies on such a
/// route took twice `request_body_memory`. The copy holds its share too: beside a first call
/// stalled upstream (its body and its copy), a second body that would fit beside the first's
/// body alone is refused, 503 `overloaded`, and never forwarded.
#[tokio::test]
async fn an_attempts_rewritten_body_counts_against_request_body_memory() {
    // An upstream that reads each request's first bytes, tells `got`, and reads no more.
    let (got_tx, mut got) = tokio::sync::mpsc::unbounded_channel();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = listener.accept().await {
            let mut head = vec![0u8; 16 * 1024];
            let _ = s.read(&mut head).await;
            let _ = got_tx.send(());
            held.push(s);
        }
    });
    // Two bodies, or one and its copy, with room to spare; not two and a copy.
    let toml = rewriting(up, UPLOAD + 1024, 2 * UPLOAD + UPLOAD / 2);
    let gw = server::start(Config::from_toml(&toml, "test.toml").unwrap())
        .await
        .unwrap();
    let send = |addr: SocketAddr| {
        let mut body = br#"{"model":"m","messages":[{"role":"user","content":""#.to_vec();
        body.resize(UPLOAD, b'a');
        body.extend_from_slice(br#""}]}"#);
        posted(
            addr,
            "/v1/chat/completions",
            "application/json",
            body.into(),
        )
    };
    // The first call's copy is larger than the sockets hold: it stays, unwritten.
    let first = tokio::spawn(send(gw.addr));
    got.recv().await.unwrap();

    let (status, headers, text) = tokio::select! {
        second = send(gw.addr) => second,
        _ = got.recv() => panic!("a second body went upstream beside the first and its copy"),
    };
    assert_eq!(status, 503, "{text}");
    assert_eq!(headers["retry-after"], "1");
    assert!(text.contains("\"code\":\"overloaded\""), "{text}");
    assert!(text.contains("request_body_memory"), "{text}");
    first.abort();
}

/// Audit QC 1: on a route whose attempts rewrite the body (an upstream's `model`), the body
/// and its copy each hold their share of `request_body_memory`. A body larger than half of it
/// could never be admitted, not even by an idle gateway: it was answered 503 `overloaded`,
/// "try again", `Retry-After: 1`, again and again. Now it is refused for good (413, naming
/// `request_body_memory` and the copy, `x-should-retry: false`), and never forwarded; a body
/// whose copy fits beside it is still served.
#[tokio::test]
async fn a_body_whose_copy_could_never_fit_is_refused_for_good() {
    let (got_tx, mut got) = tokio::sync::mpsc::unbounded_channel();
    let (_release, released) = tokio::sync::watch::channel(true);
    let up = holding_upstream(got_tx, released).await;
    const MEMORY: usize = 8192;
    let toml = rewriting(up, MEMORY, MEMORY);
    let gw = server::start(Config::from_toml(&toml, "test.toml").unwrap())
        .await
        .unwrap();
    let send = |addr: SocketAddr, size: usize| {
        let mut body = br#"{"model":"m","messages":[{"role":"user","content":""#.to_vec();
        body.resize(size, b'a');
        body.extend_from_slice(br#""}]}"#);
        posted(
            addr,
            "/v1/chat/completions",
            "application/json",
            body.into(),
        )
    };
    // Nothing else in flight, twice: the same answer, which says not to retry.
    for _ in 0..2 {
        let (status, headers, text) = send(gw.addr, MEMORY * 6 / 10).await;
        assert_eq!(status, 413, "{text}");
        assert_eq!(headers["x-should-retry"], "false", "{text}");
        assert!(!headers.contains_key("retry-after"), "{text}");
        assert!(text.contains("\"code\":\"body_too_large\""), "{text}");
        assert!(
            text.contains(&format!("request_body_memory ({MEMORY} bytes)")),
            "{text}"
        );
        assert!(text.contains("copy"), "{text}");
        assert!(got.try_recv().is_err(), "the body went upstream");
    }
    // One whose copy fits beside it goes upstream.
    let (status, _, text) = send(gw.addr, MEMORY * 4 / 10).await;
    assert_eq!(status, 200, "{text}");
    got.recv().await.unwrap();
}

/// Audit PC 3 (a): `max_request_body` per route. Files and audio uploads (512 MB, 25 MB at
/// the providers) got 413 under the one listener-wide limit a chat body wants. A route may
/// raise it (the body is read within the largest limit among the routes its path may take)
/// or lower it (checked again once the body's model picked the route); the 413 names the
/// setting that refused it.
#[tokio::test]
async fn a_route_raises_or_lowers_max_request_body() {
    let ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\
               connection: close\r\n\r\n{}"
        .to_vec();
    let up = raw_upstream(vec![(Duration::ZERO, ok)]).await;
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
max_request_body = 1000

[upstreams.up]
url = "http://{up}"
auth = "none"

[[routes]]
name = "files"
path_prefix = "/v1/files"
upstream = "up"
max_request_body = 5000

[[routes]]
name = "small"
path_prefix = "/v1/chat/completions"
models = ["small-*"]
upstream = "up"
max_request_body = 200

[[routes]]
name = "rest"
path_prefix = "/v1"
upstream = "up"
"#
    );
    let gw = server::start(Config::from_toml(&toml, "test.toml").unwrap())
        .await
        .unwrap();
    let send = |path: &'static str, body: Vec<u8>| {
        let addr = gw.addr;
        async move {
            let req = Request::post(path)
                .header("host", "gateway")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            let (resp, _c) = Conn::open(addr).await.send(req).await;
            let status = resp.status().as_u16();
            (status, read_body(resp.into_body()).await.text())
        }
    };
    let chat = |model: &str, size: usize| {
        let pad = "x".repeat(size - 30 - model.len());
        format!(r#"{{"model":"{model}","pad":"{pad}"}}"#).into_bytes()
    };

    // Raised: an upload past the server's limit, on the route that takes it.
    let (status, text) = send("/v1/files", vec![b'a'; 4000]).await;
    assert_eq!(status, 200, "{text}");
    let (status, text) = send("/v1/files", vec![b'a'; 6000]).await;
    assert_eq!(status, 413, "{text}");
    assert!(
        text.contains(r#"max_request_body of route \"files\" (5000 bytes)"#),
        "{text}"
    );
    // Elsewhere the server's limit holds.
    let (status, text) = send("/v1/embeddings", vec![b'a'; 4000]).await;
    assert_eq!(status, 413, "{text}");
    assert!(
        text.contains("[server] max_request_body (1000 bytes)"),
        "{text}"
    );

    // Lowered, for the route the model picks: read within the server's 1000, then refused.
    let (status, text) = send("/v1/chat/completions", chat("small-1", 500)).await;
    assert_eq!(status, 413, "{text}");
    assert!(
        text.contains(r#"max_request_body of route \"small\" (200 bytes)"#),
        "{text}"
    );
    let (status, text) = send("/v1/chat/completions", chat("big-1", 500)).await;
    assert_eq!(status, 200, "{text}");
}

/// POSTs `body` to `path` on a connection of its own: the status, the headers and the body.
async fn posted(
    addr: SocketAddr,
    path: &'static str,
    content_type: &'static str,
    body: Bytes,
) -> (u16, http::HeaderMap, String) {
    let req = Request::post(path)
        .header("host", "gateway")
        .header("content-type", content_type)
        .body(Full::new(body))
        .unwrap();
    let (resp, _c) = Conn::open(addr).await.send(req).await;
    let headers = resp.headers().clone();
    let status = resp.status().as_u16();
    (status, headers, read_body(resp.into_body()).await.text())
}

/// A gateway config whose one route sends everything to `up` through an upstream that rewrites
/// the body's `model` (so each attempt forwards a copy), with these body limits.
fn rewriting(up: impl std::fmt::Display, max_request_body: usize, memory: usize) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
max_request_body = {max_request_body}
request_body_memory = {memory}

[defaults]
budget = "20s"
first_token_timeout = "10s"

[upstreams.rewrites]
url = "http://{up}"
auth = "none"
model = "rewritten"

[[routes]]
name = "chat"
path_prefix = "/"
upstream = "rewrites"
"#
    )
}

/// Sends a chat request's head and the first half of its body, waits `pause`, sends the rest,
/// and returns the whole answer (the gateway closes the connection after an error answer).
async fn upload_in_two_halves(h: &Harness, pause: Duration) -> String {
    let body = br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#;
    let mut s = tokio::net::TcpStream::connect(h.addr()).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&body[..20]).await.unwrap();
    tokio::time::sleep(pause).await;
    s.write_all(&body[20..]).await.unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// Audit ZA 2: an upload that leaves the call less than it needs (`min_useful`, or the
/// upstream's expected first token) was a plain 504 `insufficient_budget` without
/// `x-should-retry: false`, and the OpenAI SDK sent the same upload three times (4.99 s for a
/// 3 s budget). The call fit when the request came: the upload spent its room, the same
/// upload would again, and the answer says so, as one the deadline cut mid-upload does (PC 3).
#[tokio::test]
async fn a_call_the_clients_upload_left_too_little_for_says_not_to_retry() {
    let route = "[[routes]]\nname = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n";
    // By `min_useful` (checked once the body is read), then by the upstream's expected
    // first token (checked before the attempt).
    let cases = [
        (
            "budget = \"1s\"\nfirst_token_timeout = \"900ms\"\nmin_useful = \"600ms\"\n",
            "",
        ),
        (
            "budget = \"1s\"\nfirst_token_timeout = \"900ms\"\nmin_useful = \"50ms\"\n",
            "expected_first_token = \"600ms\"\n",
        ),
    ];
    for (limits, upstream) in cases {
        let text = BASE.replace(route, &format!("{route}{limits}")).replace(
            "auth = \"bearer\"\n",
            &format!("auth = \"bearer\"\n{upstream}"),
        );
        let h = Harness::with_config(&text).await;
        let answer = upload_in_two_halves(&h, Duration::from_millis(600)).await;
        assert!(
            answer.starts_with("HTTP/1.1 504"),
            "{limits}{upstream}: {answer}"
        );
        assert!(
            answer.contains("\"code\":\"insufficient_budget\""),
            "{answer}"
        );
        assert!(answer.contains("x-should-retry: false"), "{answer}");
        assert!(
            answer.contains("the request body's upload (67 bytes) spent the rest"),
            "{answer}"
        );
        assert!(h.fake.requests().is_empty(), "never sent");
        // The same budget without the slow upload is called: the rule is the upload's.
        let answer = upload_in_two_halves(&h, Duration::ZERO).await;
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "{limits}{upstream}: {answer}"
        );
    }
}

/// Audit AD 1: a reload that lowered `request_body_memory` failed uploads in flight, 503
/// `overloaded` mid-upload, although they had been admitted to the larger memory. Now a body
/// that began before the lowering grows within the limit it started under, while a new body
/// of the same size is judged against the new limit and refused.
#[tokio::test]
async fn an_upload_in_flight_survives_a_reload_that_lowers_the_bodies_memory() {
    const SIZE: usize = 300_000;
    const SENT: usize = 100_000;
    let cfg = |memory: usize| {
        BASE.replace(
            "[server]\n",
            &format!("[server]\nmax_request_body = {SIZE}\nrequest_body_memory = {memory}\n"),
        )
    };
    let h = Harness::with_config(&cfg(1_000_000)).await;
    let pad = SIZE - r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"pad":""}"#.len();
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"pad":"{}"}}"#,
        "y".repeat(pad)
    );
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {SIZE}\r\n\r\n{body}"
    )
    .into_bytes();
    let head = request.len() - SIZE;
    // Three uploads a third of the way in: 300,000 bytes or more held, of 1,000,000.
    let mut uploads = Vec::new();
    for _ in 0..3 {
        let mut s = tokio::net::TcpStream::connect(h.addr()).await.unwrap();
        s.write_all(&request[..head + SENT]).await.unwrap();
        uploads.push(s);
    }
    // Let their bytes be read before the memory is lowered.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lowered = cfg(SIZE).replace("{FAKE}", &h.fake.url());
    h.gw.apply(Config::from_toml(&lowered, "test.toml").unwrap())
        .await
        .unwrap();

    // A new upload of the same size does not fit the lowered memory beside them.
    let mut new = tokio::net::TcpStream::connect(h.addr()).await.unwrap();
    let (mut reader, mut writer) = new.split();
    let (_, answer) = tokio::join!(writer.write_all(&request), async {
        let mut answer = Vec::new();
        let _ = reader.read_to_end(&mut answer).await;
        String::from_utf8_lossy(&answer).into_owned()
    });
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.contains(&format!("request_body_memory ({SIZE} bytes)")),
        "{answer}"
    );

    // The three in flight end their uploads, 900,000 bytes in all, and are served.
    for mut s in uploads {
        s.write_all(&request[head + SENT..]).await.unwrap();
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    assert_eq!(h.fake.requests().len(), 3);
}
