//! A hostile upstream: resets, early closes, lying `Content-Length`s, malformed SSE, one
//! enormous line, heads that never finish. For each: the client gets the contracted error
//! (never a truncated body that looks complete), the gateway keeps serving others meanwhile,
//! the upstream connection is closed, the in-flight gauge returns to 0 and the request is
//! counted once.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// What the hostile upstream saw of one connection.
#[derive(Debug, Clone, Default)]
struct Seen {
    /// The script the request asked for (`x-evil`).
    script: String,
    /// When the gateway closed the connection (EOF or error while we read after the script).
    closed_at: Option<Instant>,
}

/// An HTTP/1.1 "server" written by hand, so each script controls every byte. The script is
/// named by the request's `x-evil` header.
struct Hostile {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    changed: watch::Receiver<()>,
}

const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// An SSE event the way the fake provider words its tokens.
/// The end of an OpenAI stream: without it (or a `finish_reason`), a stream that ends is
/// an answer cut short.
const DONE: &[u8] = b"data: [DONE]\n\n";
const FINISHED: &[u8] = b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
/// The finish reason with the answer's usage, in one event.
const FINISHED_USAGE: &[u8] = b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\
    \"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n";

fn event(i: usize) -> Vec<u8> {
    format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"tok{i} \"}}}}]}}\n\n").into_bytes()
}

/// Providers' errors sent as SSE with a non-2xx status, each without the blank line that
/// would end its event.
const SSE_400: &[u8] =
    b"data: {\"error\":{\"type\":\"invalid_request_error\",\"message\":\"context too long\"}}";
const SSE_500: &[u8] = b"data: {\"error\":{\"type\":\"server_error\",\"message\":\"boom\"}}\n";

/// The bytes of `MALFORMED`: nothing a client parser can use, then one good event.
const MALFORMED: &[u8] =
    b"\xEF\xBB\xBFgarbage without a colon\n:\n\0\0\0\xFF\xFE binary \x80\x81\n\
    data\rdata:\r\n\r\nevent: \n\nid: 7\nretry: x\n\n\xC3\x28 invalid utf-8\n\
    event: error\ndata-no: no\n\ndata: ok\n\n";

impl Hostile {
    async fn start() -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let (tx, changed) = watch::channel(());
        let tx = Arc::new(tx);
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    return;
                };
                s.set_nodelay(true).unwrap();
                let index = {
                    let mut seen = log.lock().unwrap();
                    seen.push(Seen::default());
                    seen.len() - 1
                };
                tokio::spawn(serve(s, index, log.clone(), tx.clone()));
            }
        });
        Hostile {
            addr,
            seen,
            changed,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until every connection the hostile upstream accepted has been closed by the
    /// gateway; returns how many there were.
    async fn all_closed(&self) -> usize {
        let mut changed = self.changed.clone();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let seen = self.seen();
            if seen.iter().all(|s| s.closed_at.is_some()) {
                return seen.len();
            }
            assert!(
                tokio::time::timeout_at(deadline, changed.changed())
                    .await
                    .is_ok(),
                "upstream connections left open: {seen:?}"
            );
        }
    }
}

/// Reads one request (head and content-length body); returns its `x-evil` script.
async fn read_request(s: &mut TcpStream) -> Option<String> {
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        req.extend_from_slice(&buf[..n]);
        let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&req[..end]).to_lowercase();
        let header = |name: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
        };
        let len: usize = header("content-length:").map_or(0, |v| v.parse().unwrap());
        if req.len() >= end + 4 + len {
            return Some(header("x-evil:").unwrap_or_default());
        }
    }
}

async fn serve(
    mut s: TcpStream,
    index: usize,
    seen: Arc<Mutex<Vec<Seen>>>,
    changed: Arc<watch::Sender<()>>,
) {
    // Keep-alive: a connection may carry more than one request (the pool reuses it).
    while let Some(script) = read_request(&mut s).await {
        seen.lock().unwrap()[index].script = script.clone();
        changed.send_replace(());
        if !run(&mut s, &script).await {
            break;
        }
    }
    // Whatever the script did, now wait for the gateway to close its side.
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    seen.lock().unwrap()[index].closed_at = Some(Instant::now());
    changed.send_replace(());
}

/// Plays one script. Returns true when the connection may carry another request; false
/// leaves it open, unread, until the gateway closes it.
async fn run(s: &mut TcpStream, script: &str) -> bool {
    match script {
        "ok" => {
            let body = b"{\"ok\":true}";
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(&[head.as_bytes(), body].concat()).await;
            true
        }
        // Framed whole (the last chunk comes), but the stream stops inside an event.
        "ends-mid-event" => {
            let mut out = SSE_HEAD.as_bytes().to_vec();
            out.extend(chunk(&event(1)));
            out.extend(chunk(b"data: {\"choices\":[{\"delta\":{\"content\":\"par"));
            out.extend(b"0\r\n\r\n");
            let _ = s.write_all(&out).await;
            true
        }
        // Framed whole, events whole, but the answer has no end: no `finish_reason`, no
        // `[DONE]`.
        "ends-without-its-end" => {
            let mut out = SSE_HEAD.as_bytes().to_vec();
            out.extend(chunk(&event(1)));
            out.extend(b"0\r\n\r\n");
            let _ = s.write_all(&out).await;
            true
        }
        // The same, ended by its `finish_reason` alone: complete (not every provider sends
        // `[DONE]`).
        "ends-with-finish-reason" => {
            let mut out = SSE_HEAD.as_bytes().to_vec();
            out.extend(chunk(&event(1)));
            out.extend(chunk(FINISHED));
            out.extend(b"0\r\n\r\n");
            let _ = s.write_all(&out).await;
            true
        }
        // Framed whole, ended by trailers: the answer has no end (two events, no
        // `finish_reason`, no `[DONE]`), the last one with half an event before them, or
        // it is whole, `[DONE]` and all (a hop-by-hop field among its trailers).
        "ends-at-trailers-without-its-end"
        | "ends-at-trailers-mid-event"
        | "ends-at-trailers-after-done" => {
            let mut out = SSE_HEAD.as_bytes().to_vec();
            out.extend(chunk(&event(1)));
            out.extend(chunk(&match script {
                "ends-at-trailers-without-its-end" => event(2),
                "ends-at-trailers-mid-event" => b"data: {\"partial".to_vec(),
                _ => DONE.to_vec(),
            }));
            out.extend(
                b"0\r\nx-tr: v1\r\nconnection: x-secret\r\nx-secret: s\r\ncontent-length: 5\r\n\
                  content-type: text/plain\r\nset-cookie: a=b\r\nhost: elsewhere\r\n\r\n",
            );
            let _ = s.write_all(&out).await;
            true
        }
        // A provider's error as an SSE body, refused with a non-2xx status: one `data:` line
        // and no blank line after it (framed by its length), or a line ended by one LF
        // (chunked).
        "sse-400-unended" | "sse-500-one-lf" => {
            let (status, body, framing) = if script == "sse-400-unended" {
                (
                    "400 Bad Request",
                    SSE_400,
                    format!("content-length: {}", SSE_400.len()),
                )
            } else {
                (
                    "500 Internal Server Error",
                    SSE_500,
                    "transfer-encoding: chunked".to_owned(),
                )
            };
            let mut out = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/event-stream\r\n{framing}\r\n\r\n"
            )
            .into_bytes();
            if script == "sse-400-unended" {
                out.extend(body);
            } else {
                out.extend(chunk(body));
                out.extend(b"0\r\n\r\n");
            }
            let _ = s.write_all(&out).await;
            true
        }
        // A whole answer, `[DONE]` and all, and then neither the last chunk nor a byte more,
        // the connection held open.
        "done-then-silent" => {
            let mut out = SSE_HEAD.as_bytes().to_vec();
            out.extend(chunk(&event(1)));
            out.extend(chunk(DONE));
            let _ = s.write_all(&out).await;
            false
        }
        // The same, and the last chunk a moment later, in a write of its own.
        "done-then-end-later" => {
            let mut out = SSE_HEAD.as_bytes().to_vec();
            out.extend(chunk(&event(1)));
            out.extend(chunk(DONE));
            let _ = s.write_all(&out).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = s.write_all(b"0\r\n\r\n").await;
            true
        }
        // The last content, then the finish reason with the usage and `[DONE]` in one
        // chunk, and the last chunk 100 ms later, in a write of its own (audit XA 1).
        "usage-done-then-end-later" => {
            let mut out = SSE_HEAD.as_bytes().to_vec();
            out.extend(chunk(&event(1)));
            out.extend(chunk(&[FINISHED_USAGE, DONE].concat()));
            let _ = s.write_all(&out).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = s.write_all(b"0\r\n\r\n").await;
            true
        }
        // Two events, then a TCP reset.
        "reset-mid-stream" => {
            let mut out = SSE_HEAD.as_bytes().to_vec();
            out.extend(chunk(&event(1)));
            out.extend(chunk(&event(2)));
            let _ = s.write_all(&out).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            socket2::SockRef::from(&*s)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
            let _ = s.shutdown().await;
            false
        }
        "reset-before-head" => {
            socket2::SockRef::from(&*s)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
            let _ = s.shutdown().await;
            false
        }
        "close-before-head" => {
            let _ = s.shutdown().await;
            false
        }
        // A JSON answer that promises 1000 bytes, sends 100 and closes cleanly (FIN).
        "short-body" => {
            let head =
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n";
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.write_all(&[b'x'; 100]).await;
            let _ = s.shutdown().await;
            false
        }
        // The same for a content-length SSE stream.
        "short-sse" => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 1000\r\n\r\n";
            let _ = s
                .write_all(&[head.as_bytes(), &event(1), &event(2)].concat())
                .await;
            let _ = s.shutdown().await;
            false
        }
        // A chunked stream that ends (FIN) without its last chunk.
        "chunked-eof" => {
            let mut out = SSE_HEAD.as_bytes().to_vec();
            out.extend(chunk(&event(1)));
            out.extend(chunk(&event(2)));
            let _ = s.write_all(&out).await;
            let _ = s.shutdown().await;
            false
        }
        // Says 10 bytes, sends 40: the extra 30 are garbage in front of the next answer.
        "content-length-too-small" => {
            let head =
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 10\r\n\r\n";
            let _ = s
                .write_all(&[head.as_bytes(), b"0123456789EXTRA-BYTES-NOT-IN-THE-ANSWER"].concat())
                .await;
            true
        }
        "content-length-invalid" => {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: abc\r\n\r\nhello")
                .await;
            false
        }
        "content-length-conflict" => {
            let _ = s
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 7\r\n\r\nhello",
                )
                .await;
            false
        }
        // Both framings: chunked wins (RFC 9112 6.3), and what is forwarded is the chunked body.
        "content-length-and-chunked" => {
            let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                content-length: 3\r\ntransfer-encoding: chunked\r\n\r\n"
                .to_vec();
            out.extend(chunk(&event(1)));
            out.extend(chunk(DONE));
            out.extend(b"0\r\n\r\n");
            let _ = s.write_all(&out).await;
            true
        }
        "malformed-sse" => {
            let mut out = SSE_HEAD.as_bytes().to_vec();
            // Split inside the CRLF, the BOM and the NULs, to exercise the scanner's state.
            for piece in MALFORMED.chunks(7) {
                out.extend(chunk(piece));
            }
            out.extend(b"0\r\n\r\n");
            let _ = s.write_all(&out).await;
            true
        }
        // Garbage that never makes an event: no token ever arrives.
        "malformed-sse-forever" => {
            let _ = s.write_all(SSE_HEAD.as_bytes()).await;
            loop {
                let junk = chunk(b"\0\xFF: not an event\nid: 1\nretry: 5\n\n");
                if s.write_all(&junk).await.is_err() {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // One event whose single line is 8 MiB long, then the end of the stream.
        "enormous-line" => {
            let mut out = SSE_HEAD.as_bytes().to_vec();
            out.extend(chunk(&event(1)));
            out.extend(chunk(b"data: "));
            let _ = s.write_all(&out).await;
            let block = chunk(&[b'a'; 64 * 1024]);
            for _ in 0..128 {
                if s.write_all(&block).await.is_err() {
                    return false;
                }
            }
            let mut end = chunk(b"\n\n");
            end.extend(chunk(&event(2)));
            end.extend(chunk(DONE));
            end.extend(b"0\r\n\r\n");
            let _ = s.write_all(&end).await;
            true
        }
        // A line that never ends: first token never comes.
        "enormous-line-forever" => {
            let mut out = SSE_HEAD.as_bytes().to_vec();
            out.extend(chunk(b": hello\n\ndata: "));
            let _ = s.write_all(&out).await;
            let block = chunk(&[b'a'; 64 * 1024]);
            loop {
                if s.write_all(&block).await.is_err() {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        // The status line and half a header, then nothing, forever.
        "unfinished-head" => {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/ev")
                .await;
            false
        }
        // Header lines forever, 40 KB at a time: past the head limit in a dozen writes, well
        // inside the first-token limit even on a loaded machine (at 2.5 KB a write, a busy
        // CI runner took longer than 600 ms, and the 502 became a first_token_timeout).
        "endless-head" => {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n").await;
            loop {
                if s.write_all(&b"x-pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".repeat(1024))
                    .await
                    .is_err()
                {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        // 1xx answers forever: never a final head.
        "informational-forever" => loop {
            if s.write_all(b"HTTP/1.1 102 Processing\r\n\r\n")
                .await
                .is_err()
            {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        },
        "not-http" => {
            let _ = s.write_all(b"SSH-2.0-OpenSSH_9.6\r\n\r\n").await;
            false
        }
        other => panic!("unknown script {other:?}"),
    }
}

/// Short first-token limit (the scripts that never make a token end by it); a long idle
/// limit, because one enormous line is one event however long it takes to pass.
fn config(hostile: &Hostile) -> String {
    BASE.replace(
        "first_token_timeout = \"2s\"",
        "first_token_timeout = \"600ms\"",
    )
    .replace("idle_timeout = \"1s\"", "idle_timeout = \"10s\"")
        + &format!(
            "\n[upstreams.hostile]\nurl = \"{}\"\n\n[[routes]]\nname = \"evil\"\npath_prefix = \"/evil\"\nupstream = \"hostile\"\n",
            hostile.url()
        )
}

fn evil(script: &str, stream: bool) -> Request<Full<Bytes>> {
    Request::post("/evil/v1/chat/completions")
        .header("host", "gateway")
        .header("content-type", "application/json")
        .header("x-evil", script)
        .body(Full::new(Bytes::from(format!(r#"{{"stream":{stream}}}"#))))
        .unwrap()
}

/// What the client saw.
struct Outcome {
    status: u16,
    headers: http::HeaderMap,
    read: Read,
}

impl Outcome {
    /// The JSON error code of an answer sent before the head.
    fn json_code(&self) -> String {
        let v: serde_json::Value = serde_json::from_slice(&self.read.bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.read.text()));
        v["error"]["code"].as_str().unwrap().to_owned()
    }

    /// The code of the trailing SSE error event; it must be the last thing in a body that
    /// ended cleanly, and parse as an event of its own.
    fn event_code(&self) -> String {
        assert!(self.read.error.is_none(), "{:?}", self.read.error);
        let text = self.read.text();
        assert!(text.ends_with("\n\n"), "{}", tail(&text));
        let last = text.trim_end_matches('\n');
        let last = &last[last.rfind("\n\n").map_or(0, |i| i + 2)..];
        assert!(last.starts_with("event: error\ndata: "), "{}", tail(&text));
        let v: serde_json::Value =
            serde_json::from_str(last.trim_start_matches("event: error\ndata: ")).unwrap();
        v["error"]["code"].as_str().unwrap().to_owned()
    }
}

fn tail(text: &str) -> &str {
    let mut at = text.len().saturating_sub(300);
    while !text.is_char_boundary(at) {
        at += 1;
    }
    &text[at..]
}

/// Sends the hostile request; while it runs, a healthy request on the other route must be
/// served in full. Then checks the aftermath: every hostile upstream connection closed, the
/// gauge at 0, the hostile request counted exactly once with `outcome`.
async fn survive(script: &str, stream: bool, outcome: &str) -> Outcome {
    let hostile = Hostile::start().await;
    let h = Harness::with_config(&config(&hostile)).await;
    let addr = h.addr();
    let req = evil(script, stream);
    let bad = tokio::spawn(async move {
        let conn = Conn::open(addr).await;
        let (resp, _conn) = conn.send(req).await;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        Outcome {
            status,
            headers,
            read: read_body(resp.into_body()).await,
        }
    });
    // The hostile request is in progress (or over) once its upstream saw it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while hostile.seen().iter().all(|s| s.script.is_empty()) {
        assert!(
            Instant::now() < deadline,
            "{script}: never reached upstream"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (resp, _c) = h
        .chat(&[("x-fake-chunks", "3"), ("x-fake-interval-ms", "1")])
        .await;
    assert_eq!(resp.status(), 200);
    let good = read_body(resp.into_body()).await;
    assert!(
        good.error.is_none() && good.text().ends_with("data: [DONE]\n\n"),
        "{script}: the healthy request suffered: {}",
        good.text()
    );

    let out = tokio::time::timeout(Duration::from_secs(10), bad)
        .await
        .unwrap_or_else(|_| panic!("{script}: the client never got an answer"))
        .unwrap();
    // An answer framed whole leaves its connection in the pool, healthy, even when what it
    // framed was an answer cut short (`ends-*`).
    let reusable = outcome == "ok" || script.starts_with("ends-");
    if reusable {
        // A complete answer leaves its connection in the pool, healthy: the next request
        // may go over it (or over a new one, if it is asked for before the pool has it back).
        let (resp, _c) = h.send(evil("ok", false)).await;
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.unwrap();
        assert!(hostile.seen().len() <= 2, "{script}: {:?}", hostile.seen());
    } else {
        hostile.all_closed().await;
    }
    let extra = f64::from(reusable);
    h.wait_requests("evil", 1.0 + extra).await;
    for o in ["ok", "error", "cancelled"] {
        let v = h
            .metric(&format!(
                "hourglass_requests_total{{outcome=\"{o}\",route=\"evil\"}}"
            ))
            .await;
        let expected = f64::from(o == outcome) + if o == "ok" { extra } else { 0.0 };
        assert_eq!(v, expected, "{script}: outcome {o}");
    }
    assert_eq!(
        h.metric("hourglass_upstream_requests_in_flight{upstream=\"hostile\"}")
            .await,
        0.0,
        "{script}"
    );
    out
}

#[tokio::test]
async fn upstream_reset_mid_stream_ends_with_an_error_event() {
    let out = survive("reset-mid-stream", true, "error").await;
    assert_eq!(out.status, 200);
    assert!(out.read.text().contains("tok2"));
    assert_eq!(out.event_code(), "upstream_error");
}

#[tokio::test]
async fn upstream_reset_before_its_head_is_a_502() {
    let out = survive("reset-before-head", true, "error").await;
    assert_eq!(out.status, 502);
    assert_eq!(out.json_code(), "upstream_error");
}

#[tokio::test]
async fn upstream_closing_before_its_head_is_a_502() {
    let out = survive("close-before-head", true, "error").await;
    assert_eq!(out.status, 502);
    assert_eq!(out.json_code(), "upstream_error");
}

/// A document is read whole before its head goes (up to 1 MiB): one the upstream left short
/// is the JSON error, never a short body that looks whole.
#[tokio::test]
async fn a_short_body_is_an_error_never_passed_off_as_complete() {
    let out = survive("short-body", false, "error").await;
    assert_eq!(out.status, 502);
    assert_eq!(out.json_code(), "upstream_error");
}

#[tokio::test]
async fn a_short_sse_stream_ends_with_an_error_event() {
    let out = survive("short-sse", true, "error").await;
    assert_eq!(out.status, 200);
    assert_eq!(out.event_code(), "upstream_error");
}

/// The stream's framing ended cleanly, inside an event: the half event is dropped (the
/// client never receives half an event) and the error event says the answer was cut.
#[tokio::test]
async fn a_stream_that_stops_inside_an_event_ends_with_an_error_event() {
    let out = survive("ends-mid-event", true, "error").await;
    assert_eq!(out.status, 200);
    assert_eq!(out.event_code(), "upstream_error");
    let after = out.read.bytes.strip_prefix(event(1).as_slice()).unwrap();
    assert!(
        after.starts_with(b"event: error\n"),
        "the half event never went out"
    );
}

#[tokio::test]
async fn an_answer_that_stops_without_its_end_ends_with_an_error_event() {
    let out = survive("ends-without-its-end", true, "error").await;
    assert_eq!(out.event_code(), "upstream_error");
    let after = out.read.bytes.strip_prefix(event(1).as_slice()).unwrap();
    assert!(after.starts_with(b"event: error\n"));
    let done = survive("ends-with-finish-reason", true, "ok").await;
    assert!(done.read.error.is_none());
    assert_eq!(done.read.bytes, [event(1), FINISHED.to_vec()].concat());
}

/// Trailers end a stream as its last chunk does: the answer must have ended by then, and
/// the half event before them is dropped, never glued to the error event.
#[tokio::test]
async fn an_answer_that_stops_at_its_trailers_without_its_end_ends_with_an_error_event() {
    let out = survive("ends-at-trailers-without-its-end", true, "error").await;
    assert_eq!(out.event_code(), "upstream_error");
    let after = out.read.bytes.strip_prefix(event(1).as_slice()).unwrap();
    let after = after.strip_prefix(event(2).as_slice()).unwrap();
    assert!(after.starts_with(b"event: error\n"));
    let out = survive("ends-at-trailers-mid-event", true, "error").await;
    assert_eq!(out.event_code(), "upstream_error");
    let after = out.read.bytes.strip_prefix(event(1).as_slice()).unwrap();
    assert!(
        after.starts_with(b"event: error\n"),
        "the half event never went out"
    );
}

/// A whole answer with trailers is delivered whole and counted `ok`, not as a client that
/// left. An HTTP/1.1 client gets no trailers (the gateway drops `Trailer` as hop-by-hop, and
/// hyper sends only fields it names); an HTTP/2 client gets them, less the hop-by-hop fields
/// and those no trailer may carry (RFC 9110 6.5.1: framing, routing, authentication, how to
/// process the content): a `content-length` trailer made curl and Node reset the stream
/// after a complete answer.
#[tokio::test]
async fn a_whole_answer_with_trailers_is_delivered_and_counted_ok() {
    let done = survive("ends-at-trailers-after-done", true, "ok").await;
    assert!(done.read.error.is_none());
    assert_eq!(done.read.bytes, [event(1), DONE.to_vec()].concat());

    let hostile = Hostile::start().await;
    let h = Harness::with_config(&config(&hostile)).await;
    let resp = h2_send(h.addr(), evil("ends-at-trailers-after-done", true))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap();
    let trailers = body.trailers().cloned().expect("trailers over HTTP/2");
    assert_eq!(trailers.get("x-tr").unwrap(), "v1");
    assert!(!trailers.contains_key("connection") && !trailers.contains_key("x-secret"));
    for name in ["content-length", "content-type", "set-cookie", "host"] {
        assert!(!trailers.contains_key(name), "{name}: {trailers:?}");
    }
    assert_eq!(body.to_bytes(), [event(1), DONE.to_vec()].concat());
    h.wait_requests("evil", 1.0).await;
    assert_eq!(
        h.metric("hourglass_requests_total{outcome=\"ok\",route=\"evil\"}")
            .await,
        1.0
    );
}

/// DESIGN 6: upstream non-2xx answers pass through unchanged. An SSE error body is the
/// provider's, not an answer that ended short: no event is held, none added, its length kept.
#[tokio::test]
async fn a_non_2xx_sse_body_passes_through_unchanged() {
    let out = survive("sse-400-unended", true, "ok").await;
    assert_eq!(out.status, 400);
    assert!(out.read.error.is_none());
    assert_eq!(out.read.bytes, SSE_400);
    let length = SSE_400.len().to_string();
    assert_eq!(out.headers.get("content-length").unwrap(), length.as_str());
    let out = survive("sse-500-one-lf", true, "ok").await;
    assert_eq!(out.status, 500);
    assert!(out.read.error.is_none());
    assert_eq!(out.read.bytes, SSE_500);
}

/// An upstream that holds its body open after `[DONE]` is not waited for until the idle
/// limit (10 s here) calls a whole answer an error: the client's body ends whole a moment
/// after `[DONE]`, the request counts `ok` and no cancellation, and the upstream connection,
/// whose body never ended, is closed rather than pooled.
#[tokio::test]
async fn an_upstream_silent_after_done_ends_the_answer_whole_and_is_closed() {
    let hostile = Hostile::start().await;
    let h = Harness::with_config(&config(&hostile)).await;
    let (resp, _c) = h.send(evil("done-then-silent", true)).await;
    assert_eq!(resp.status(), 200);
    let read = tokio::time::timeout(PROMPTLY, read_body(resp.into_body()))
        .await
        .expect("the body ended well before the idle limit");
    assert!(read.error.is_none());
    assert_eq!(read.bytes, [event(1), DONE.to_vec()].concat());
    assert_eq!(hostile.all_closed().await, 1);
    h.wait_requests("evil", 1.0).await;
    for (sample, value) in [
        (
            "hourglass_requests_total{outcome=\"ok\",route=\"evil\"}",
            1.0,
        ),
        (
            "hourglass_requests_total{outcome=\"cancelled\",route=\"evil\"}",
            0.0,
        ),
        (
            "hourglass_cancellations_total{origin=\"idle\",route=\"evil\"}",
            0.0,
        ),
        (
            "hourglass_cancellations_total{origin=\"client\",route=\"evil\"}",
            0.0,
        ),
        (
            "hourglass_upstream_requests_in_flight{upstream=\"hostile\"}",
            0.0,
        ),
    ] {
        assert_eq!(h.metric(sample).await, value, "{sample}");
    }
}

/// An upstream's last chunk often comes a moment after `[DONE]`, in a write of its own:
/// within the grace it is waited for, so the connection is not closed but pooled.
#[tokio::test]
async fn a_last_chunk_a_moment_after_done_keeps_its_connection() {
    let hostile = Hostile::start().await;
    let h = Harness::with_config(&config(&hostile)).await;
    let (resp, _c) = h.send(evil("done-then-end-later", true)).await;
    let read = read_body(resp.into_body()).await;
    assert!(read.error.is_none());
    assert_eq!(read.bytes, [event(1), DONE.to_vec()].concat());
    h.wait_requests("evil", 1.0).await;
    assert_eq!(
        h.metric("hourglass_requests_total{outcome=\"ok\",route=\"evil\"}")
            .await,
        1.0
    );
    // A gateway that let the upstream go at `[DONE]` closed it before the request was
    // reported; a pooled connection stays open for `pool_idle_timeout`.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        hostile.seen()[0].closed_at.is_none(),
        "{:?}",
        hostile.seen()
    );
}

/// Audit XA 1: a client that reads the answer to its `[DONE]` and leaves while the gateway
/// still waits (`END_GRACE`) for the upstream's framing, its last chunk a moment later or
/// never, had the whole answer: `ok`, no cancellation, no cancelled tokens. Over HTTP/1.1 it
/// closes its connection, over HTTP/2 it resets its stream (CANCEL).
#[tokio::test]
async fn a_client_that_leaves_at_done_while_the_framing_is_awaited_counts_ok() {
    let hostile = Hostile::start().await;
    let h = Harness::with_config(&config(&hostile)).await;
    let mut n = 0.0;
    for script in ["usage-done-then-end-later", "done-then-silent"] {
        for h2 in [false, true] {
            let (resp, conn) = if h2 {
                (h2_send(h.addr(), evil(script, true)).await.unwrap(), None)
            } else {
                let (resp, conn) = h.send(evil(script, true)).await;
                (resp, Some(conn))
            };
            assert_eq!(resp.status(), 200, "{script}, h2 {h2}");
            let mut body = resp.into_body();
            let mut text = Vec::new();
            while !text.ends_with(DONE) {
                let frame = body.frame().await.expect("more frames").expect("a frame");
                text.extend_from_slice(&frame.into_data().unwrap_or_default());
            }
            // Gone at `[DONE]`, as an SDK that stops there (or an aborted fetch) is.
            drop(body);
            drop(conn);
            n += 1.0;
            h.wait_requests("evil", n).await;
        }
    }
    for (sample, value) in [
        ("hourglass_requests_total{outcome=\"ok\",route=\"evil\"}", n),
        (
            "hourglass_requests_total{outcome=\"cancelled\",route=\"evil\"}",
            0.0,
        ),
        (
            "hourglass_cancellations_total{origin=\"client\",route=\"evil\"}",
            0.0,
        ),
        (
            "hourglass_tokens_cancelled_total{origin=\"client\",route=\"evil\"}",
            0.0,
        ),
        // Each upstream call was let go when its client left, as before.
        (
            "hourglass_upstream_requests_in_flight{upstream=\"hostile\"}",
            0.0,
        ),
    ] {
        assert_eq!(h.metric(sample).await, value, "{sample}");
    }
}

/// The same for a client that does not stream (`stream_upstream`): its document is written
/// only once the stream ended (here its last chunk 100 ms after `[DONE]`), and a client that
/// leaves once it has read it all, over HTTP/1.1 or HTTP/2, had it whole: `ok`.
#[tokio::test]
async fn a_client_that_leaves_after_its_assembled_document_counts_ok() {
    let hostile = Hostile::start().await;
    let toml = config(&hostile).replace(
        "path_prefix = \"/evil\"",
        "path_prefix = \"/evil\"\nstream_upstream = true",
    );
    let h = Harness::with_config(&toml).await;
    let mut n = 0.0;
    let script = "usage-done-then-end-later";
    for h2 in [false, true] {
        let (resp, conn) = if h2 {
            (h2_send(h.addr(), evil(script, false)).await.unwrap(), None)
        } else {
            let (resp, conn) = h.send(evil(script, false)).await;
            (resp, Some(conn))
        };
        assert_eq!(resp.status(), 200, "{script}, h2 {h2}");
        let length: usize = resp.headers()["content-length"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let mut body = resp.into_body();
        let mut doc = Vec::new();
        while doc.len() < length {
            let frame = body.frame().await.expect("more frames").expect("a frame");
            doc.extend_from_slice(&frame.into_data().unwrap_or_default());
        }
        let doc: serde_json::Value = serde_json::from_slice(&doc).unwrap();
        assert_eq!(doc["choices"][0]["finish_reason"], "stop", "{doc}");
        drop(body);
        drop(conn);
        n += 1.0;
        h.wait_requests("evil", n).await;
    }
    for (sample, value) in [
        ("hourglass_requests_total{outcome=\"ok\",route=\"evil\"}", n),
        (
            "hourglass_cancellations_total{origin=\"client\",route=\"evil\"}",
            0.0,
        ),
    ] {
        assert_eq!(h.metric(sample).await, value, "{sample}");
    }
}

#[tokio::test]
async fn a_chunked_stream_without_its_last_chunk_ends_with_an_error_event() {
    let out = survive("chunked-eof", true, "error").await;
    assert_eq!(out.event_code(), "upstream_error");
}

#[tokio::test]
async fn a_content_length_smaller_than_the_body_poisons_only_its_own_connection() {
    // The answer is the promised 10 bytes; the extra bytes must not become the next answer.
    let hostile = Hostile::start().await;
    let h = Harness::with_config(&config(&hostile)).await;
    for i in 0..3 {
        let (resp, _c) = h
            .send(evil(
                if i == 0 {
                    "content-length-too-small"
                } else {
                    "ok"
                },
                false,
            ))
            .await;
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let expected: &[u8] = if i == 0 {
            b"0123456789"
        } else {
            b"{\"ok\":true}"
        };
        assert_eq!(&body[..], expected, "answer {i}");
    }
    h.wait_requests("evil", 3.0).await;
    assert_eq!(
        h.metric("hourglass_requests_total{outcome=\"ok\",route=\"evil\"}")
            .await,
        3.0
    );
    let seen = hostile.seen();
    assert!(
        seen[0].closed_at.is_some() || seen.len() > 1,
        "the connection with stray bytes was not reused: {seen:?}"
    );
}

#[tokio::test]
async fn an_invalid_content_length_is_a_502() {
    let out = survive("content-length-invalid", false, "error").await;
    assert_eq!(out.status, 502);
    assert_eq!(out.json_code(), "upstream_error");
}

#[tokio::test]
async fn conflicting_content_lengths_are_a_502() {
    let out = survive("content-length-conflict", false, "error").await;
    assert_eq!(out.status, 502);
    assert_eq!(out.json_code(), "upstream_error");
}

#[tokio::test]
async fn content_length_with_chunked_framing_follows_the_chunks() {
    let out = survive("content-length-and-chunked", true, "ok").await;
    assert_eq!(out.status, 200);
    assert_eq!(out.read.bytes, [event(1), DONE.to_vec()].concat());
}

#[tokio::test]
async fn malformed_sse_passes_through_byte_exact() {
    let out = survive("malformed-sse", true, "ok").await;
    assert_eq!(out.status, 200);
    assert!(out.read.error.is_none());
    assert_eq!(out.read.bytes, MALFORMED);
}

#[tokio::test]
async fn sse_that_never_makes_an_event_hits_the_first_token_limit() {
    let out = survive("malformed-sse-forever", true, "cancelled").await;
    assert_eq!(out.status, 200);
    assert_eq!(out.event_code(), "first_token_timeout");
}

#[tokio::test]
async fn one_enormous_line_is_forwarded_whole() {
    let out = survive("enormous-line", true, "ok").await;
    assert!(out.read.error.is_none());
    let mut expected = event(1);
    expected.extend(b"data: ");
    expected.extend(vec![b'a'; 128 * 64 * 1024]);
    expected.extend(b"\n\n");
    expected.extend(event(2));
    expected.extend(DONE);
    assert!(out.read.bytes == expected, "{} bytes", out.read.bytes.len());
}

#[tokio::test]
async fn an_enormous_line_that_never_ends_is_cut_with_a_parseable_error_event() {
    let out = survive("enormous-line-forever", true, "cancelled").await;
    assert!(
        out.read.bytes.len() > 1 << 20,
        "{} bytes",
        out.read.bytes.len()
    );
    assert_eq!(out.event_code(), "first_token_timeout");
}

#[tokio::test]
async fn a_head_that_never_finishes_is_a_504() {
    let out = survive("unfinished-head", true, "cancelled").await;
    assert_eq!(out.status, 504);
    assert_eq!(out.json_code(), "first_token_timeout");
}

#[tokio::test]
async fn a_head_that_never_ends_is_refused() {
    let out = survive("endless-head", true, "error").await;
    assert_eq!(out.status, 502);
    assert_eq!(out.json_code(), "upstream_error");
}

#[tokio::test]
async fn informational_answers_forever_hit_the_first_token_limit() {
    let out = survive("informational-forever", true, "cancelled").await;
    assert_eq!(out.status, 504);
    assert_eq!(out.json_code(), "first_token_timeout");
}

#[tokio::test]
async fn an_upstream_that_is_not_http_is_a_502() {
    let out = survive("not-http", true, "error").await;
    assert_eq!(out.status, 502);
    assert_eq!(out.json_code(), "upstream_error");
}
