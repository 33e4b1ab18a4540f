//! A client that reads slowly against an upstream that never stops producing: Hourglass
//! reads from the upstream only as fast as the client drains, so what sits between them is
//! bounded by socket and connection buffers, not by how much the upstream could send.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::time::{sleep, Instant};

/// The tests here measure this process's memory: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// In flight between the upstream's socket and the client's, at most: the kernel's socket
/// buffers on the two gateway sockets (a few MiB each at most with autotuning) plus hyper's
/// and the watchdog's own, which are small. Without backpressure it would be everything the
/// upstream wrote: hundreds of MiB per second over loopback.
const BOUND: u64 = 24 << 20;

/// An upstream that streams complete SSE events as fast as its socket takes them, forever,
/// counting what it managed to write.
async fn firehose() -> (SocketAddr, Arc<AtomicU64>) {
    let (addr, written, _) = firehose_counting_closes().await;
    (addr, written)
}

/// `firehose`, also counting the connections it saw closed by the gateway (a write failed).
async fn firehose_counting_closes() -> (SocketAddr, Arc<AtomicU64>, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let closes = Arc::new(AtomicU64::new(0));
    let (count, closed) = (written.clone(), closes.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let count = count.clone();
            let closed = closed.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let mut req = Vec::new();
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";
                if s.write_all(head).await.is_err() {
                    return;
                }
                let event = format!("data: {}\n\n", "x".repeat(1000));
                let block = event.repeat(16);
                loop {
                    if s.write_all(block.as_bytes()).await.is_err() {
                        closed.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    count.fetch_add(block.len() as u64, Ordering::Relaxed);
                }
            });
        }
    });
    (addr, written, closes)
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A client socket with a small receive buffer, so that what the client has not read stays
/// in the gateway's hands (where it must be bounded) rather than the client's kernel.
async fn small_client(addr: SocketAddr, budget_ms: u64) -> (TcpStream, Vec<u8>) {
    client_with_buffer(addr, budget_ms, 16 * 1024).await
}

async fn client_with_buffer(
    addr: SocketAddr,
    budget_ms: u64,
    recv_buffer: u32,
) -> (TcpStream, Vec<u8>) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(recv_buffer).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    let body = "{\"stream\":true}";
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-type: application/json\r\n\
         x-request-budget-ms: {budget_ms}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    (s, got)
}

/// How long after `start` the gateway's upstream call ended (its in-flight gauge back at 0),
/// failing with `why` past 10 s.
async fn upstream_ended(h: &Harness, start: Instant, why: &str) -> Duration {
    let deadline = start + Duration::from_secs(10);
    while h
        .metric("hourglass_upstream_requests_in_flight{upstream=\"fake\"}")
        .await
        != 0.0
    {
        assert!(Instant::now() < deadline, "{why}");
        sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

fn config(upstream: SocketAddr) -> String {
    BASE.replace("{FAKE}", &format!("http://{upstream}"))
        .replace("max_budget = \"30s\"", "max_budget = \"120s\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_stops_the_upstream() {
    let _serial = SERIAL.lock().await;
    let (up, written) = firehose().await;
    let h = Harness::with_config(&config(up)).await;
    let rss_before = rss_bytes();
    let (mut client, head) = small_client(h.addr(), 60_000).await;
    assert!(String::from_utf8_lossy(&head).starts_with("HTTP/1.1 200"));

    // The client reads nothing for 2 s. The upstream fills the buffers and then blocks.
    sleep(Duration::from_secs(1)).await;
    let at_1s = written.load(Ordering::Relaxed);
    sleep(Duration::from_secs(1)).await;
    let at_2s = written.load(Ordering::Relaxed);
    let rss_stalled = rss_bytes();
    eprintln!(
        "stalled client: upstream wrote {} KiB by 1 s, {} KiB by 2 s; RSS {} -> {} MiB",
        at_1s >> 10,
        at_2s >> 10,
        rss_before >> 20,
        rss_stalled >> 20
    );
    assert!(
        at_2s < BOUND,
        "{at_2s} bytes went out for a client that read none"
    );
    assert!(
        at_2s - at_1s < 2 << 20,
        "the upstream kept writing ({at_1s} -> {at_2s}) while the client read nothing"
    );
    assert!(
        rss_stalled.saturating_sub(rss_before) < BOUND,
        "RSS grew {} MiB",
        (rss_stalled - rss_before) >> 20
    );

    // The stream is alive: reading again lets the upstream go on.
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = 0u64;
    let deadline = Instant::now() + Duration::from_secs(10);
    while read < at_2s + (4 << 20) {
        let n = client.read(&mut buf).await.unwrap();
        assert!(n > 0, "the stream ended");
        read += n as u64;
        assert!(Instant::now() < deadline);
    }
    let later = written.load(Ordering::Relaxed);
    assert!(later > at_2s, "the upstream resumed");
    assert!(later - read < BOUND, "in flight: {}", later - read);
    drop(client);
    h.wait_requests("chat", 1.0).await;
    assert_eq!(cancelled(&h, "client").await, 1.0);
    assert_eq!(
        h.metric("hourglass_upstream_requests_in_flight{upstream=\"fake\"}")
            .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_steady_reader_keeps_the_gateway_bounded() {
    let _serial = SERIAL.lock().await;
    let (up, written) = firehose().await;
    let h = Harness::with_config(&config(up)).await;
    let rss_before = rss_bytes();
    let (mut client, _) = small_client(h.addr(), 60_000).await;
    // 64 KiB every 20 ms: about 3 MiB/s, far below what the upstream could send.
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = 0u64;
    let mut worst = 0u64;
    let mut rss_max = 0u64;
    for _ in 0..100 {
        let mut want = buf.len();
        while want > 0 {
            let n = client.read(&mut buf[..want]).await.unwrap();
            assert!(n > 0, "the stream ended");
            read += n as u64;
            want -= n;
        }
        worst = worst.max(written.load(Ordering::Relaxed).saturating_sub(read));
        rss_max = rss_max.max(rss_bytes());
        sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "slow reader: read {} MiB, at most {} KiB in flight, RSS {} -> at most {} MiB",
        read >> 20,
        worst >> 10,
        rss_before >> 20,
        rss_max >> 20
    );
    assert!(worst < BOUND, "{worst} bytes in flight");
    assert!(rss_max.saturating_sub(rss_before) < BOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_does_not_outlive_its_budget() {
    let _serial = SERIAL.lock().await;
    let (up, written) = firehose().await;
    let cfg = config(up).replace(
        "name = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n",
        "name = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\nmax_in_flight = 1\n",
    );
    let h = Harness::with_config(&cfg).await;
    let start = Instant::now();
    let (mut client, _) = small_client(h.addr(), 1500).await;
    // Not a byte read after the head. At the deadline the upstream call ends anyway: its
    // in-flight count drops and the route's only slot is free again.
    let ended = upstream_ended(&h, start, "the upstream call outlived its budget").await;
    assert!(
        ended >= Duration::from_millis(1500) && ended < Duration::from_secs(6),
        "ended after {ended:?}"
    );
    let stalled_at = written.load(Ordering::Relaxed);
    let (resp, _c) = h
        .chat(&[("x-request-budget-ms", "3000"), ("x-fake-chunks", "1")])
        .await;
    assert_eq!(resp.status(), 200, "the slot was given back");
    drop(resp);

    // When the client reads again, it gets what was already on its way and then the reason.
    let mut rest = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    tokio::time::timeout(Duration::from_secs(10), async {
        // The chunked body's last chunk.
        while !rest.ends_with(b"\r\n0\r\n\r\n") {
            let n = client.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the end of the body");
            rest.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the stream ends");
    let text = String::from_utf8_lossy(&rest);
    assert!(rest.len() as u64 <= stalled_at + (1 << 20));
    assert!(
        text.contains("event: error\r\n") || text.contains("event: error\n"),
        "{}",
        &text[text.len().saturating_sub(300)..]
    );
    assert!(text.contains("deadline_exceeded"));
    h.wait_requests("chat", 2.0).await;
    assert_eq!(cancelled(&h, "deadline").await, 1.0);
}

/// A client that stops reading and leaves after the reaper ended its upstream call at the
/// deadline, without reading again: the deadline ended the request, not the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_after_its_deadline_cut_the_upstream_counts_as_the_deadline() {
    let _serial = SERIAL.lock().await;
    let (up, _written) = firehose().await;
    let h = Harness::with_config(&config(up)).await;
    let start = Instant::now();
    let (client, _) = small_client(h.addr(), 1500).await;
    upstream_ended(&h, start, "the upstream call outlived its budget").await;
    drop(client);
    h.wait_requests("chat", 1.0).await;
    assert_eq!(cancelled(&h, "deadline").await, 1.0);
    assert_eq!(cancelled(&h, "client").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_for_send_timeout_is_disconnected() {
    let _serial = SERIAL.lock().await;
    let (up, _written) = firehose().await;
    let cfg = config(up).replace("[server]\n", "[server]\nsend_timeout = \"1s\"\n");
    let h = Harness::with_config(&cfg).await;
    let start = Instant::now();
    // A 60 s budget: only the send timeout can end this early.
    let (mut client, _) = small_client(h.addr(), 60_000).await;
    let ended = upstream_ended(
        &h,
        start,
        "a client that reads nothing held its stream past send_timeout",
    )
    .await;
    assert!(
        ended >= Duration::from_millis(1000) && ended < Duration::from_secs(6),
        "ended after {ended:?}"
    );
    // The connection is gone: reading drains what the kernels held, then ends.
    let mut buf = vec![0u8; 64 * 1024];
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match client.read(&mut buf).await {
                Ok(0) => return "eof",
                Ok(_) => {}
                Err(_) => return "reset",
            }
        }
    })
    .await
    .expect("the connection was closed, not left open");
    eprintln!("send_timeout: stream ended after {ended:?}; client saw {end}");
    h.wait_requests("chat", 1.0).await;
    // The gateway closed the connection: its cut, not the client's leaving (audit CC4).
    assert_eq!(
        cancelled(&h, "send_timeout").await,
        1.0,
        "a client that stopped reading is cut by send_timeout"
    );
}

/// Audit CC4: a client that reads a fast stream slowly but steadily (through a small receive
/// buffer, so the gateway's socket stays full) is neither disconnected nor has its upstream
/// call reaped for `send_timeout`; it is once it stops reading, and the request counts as
/// the gateway's `send_timeout`, not as the client leaving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_but_steady_reader_is_not_cut_by_send_timeout() {
    let _serial = SERIAL.lock().await;
    let (up, _written) = firehose().await;
    // 2 s: five times what the reader below takes to reopen its window, so that a loaded
    // machine's pauses do not look like a client that stopped.
    let cfg = config(up).replace("[server]\n", "[server]\nsend_timeout = \"2s\"\n");
    let h = Harness::with_config(&cfg).await;
    // A 4 KiB buffer: the client's kernel opens its window again every 2 to 4 KiB read.
    let (mut client, _) = client_with_buffer(h.addr(), 60_000, 4096).await;
    let in_flight = "hourglass_upstream_requests_in_flight{upstream=\"fake\"}";
    // 1000 bytes every 100 ms (10 KB/s) for three send_timeouts: slower than hyper hands the
    // socket one of the upstream's frames, which it holds 16 of.
    let reading_until = Instant::now() + Duration::from_secs(6);
    let mut buf = [0u8; 1000];
    while Instant::now() < reading_until {
        let n = client.read(&mut buf).await.unwrap();
        assert!(n > 0, "the connection was closed while the client read");
        sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        h.metric(in_flight).await,
        1.0,
        "the upstream call was reaped"
    );
    // It stops reading: the upstream call and the connection end.
    let start = Instant::now();
    upstream_ended(&h, start, "a client that stopped reading held its stream").await;
    h.wait_requests("chat", 1.0).await;
    assert_eq!(cancelled(&h, "send_timeout").await, 1.0);
    assert_eq!(cancelled(&h, "client").await, 0.0);
}

/// Audit UE 3: a client that reads a fast stream slowly but steadily (a 4 KiB receive buffer,
/// 16 KiB every 10 ms) past a short deadline. At the deadline the upstream call ends (its
/// in-flight count drops: the gateway stops reading it and closes it, though the client
/// still reads); the client then gets what was already between the two sockets, bounded by
/// buffers, not what the upstream could still send, and then the reason, `event: error`
/// `deadline_exceeded`, and the body's end. The audit's reader (1000 B every 10 ms) saw no end
/// in 10 s only because the socket buffers it was draining hold megabytes at that pace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_past_its_deadline_gets_what_was_sent_then_the_reason() {
    let _serial = SERIAL.lock().await;
    let (up, written, closes) = firehose_counting_closes().await;
    let h = Harness::with_config(&config(up)).await;
    let start = Instant::now();
    let (mut client, _) = client_with_buffer(h.addr(), 1500, 4096).await;
    let mut closed = None;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut ended = None;
    let mut at_end = 0;
    tokio::time::timeout(Duration::from_secs(60), async {
        while !got.ends_with(b"\r\n0\r\n\r\n") {
            let n = client.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the end of the body");
            got.extend_from_slice(&buf[..n]);
            if ended.is_none()
                && h.metric("hourglass_upstream_requests_in_flight{upstream=\"fake\"}")
                    .await
                    == 0.0
            {
                ended = Some(start.elapsed());
                at_end = got.len();
            }
            if closed.is_none() && closes.load(Ordering::Relaxed) > 0 {
                closed = Some(start.elapsed());
            }
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the stream ends");
    let ended = ended.expect("the upstream call ended while the client read");
    // (a) The upstream call ended at the deadline, not when the client caught up.
    assert!(
        ended >= Duration::from_millis(1500) && ended < Duration::from_secs(6),
        "ended after {ended:?}"
    );
    // The upstream connection itself was closed then, not left to wait for the client.
    let closed = closed.expect("the upstream connection was closed while the client read");
    assert!(closed < Duration::from_secs(6), "closed after {closed:?}");
    // (b) What came after it was already on its way: the upstream wrote no more once it
    // ended, and what the client read past that point is within the buffers' bound.
    let after = (got.len() - at_end) as u64;
    eprintln!(
        "slow reader past its deadline: upstream ended at {ended:?}, closed at {closed:?}, wrote {} KiB; client read {} KiB, {} KiB of it after the end",
        written.load(Ordering::Relaxed) >> 10,
        got.len() >> 10,
        after >> 10
    );
    assert!(after < BOUND, "{after} bytes after the upstream ended");
    assert!((got.len() as u64) <= written.load(Ordering::Relaxed) + (1 << 20));
    let text = String::from_utf8_lossy(&got[got.len().saturating_sub(2000)..]).into_owned();
    assert!(text.contains("event: error"), "{text}");
    assert!(text.contains("deadline_exceeded"), "{text}");
    h.wait_requests("chat", 1.0).await;
    assert_eq!(cancelled(&h, "deadline").await, 1.0);
}

/// HTTP/2: one stream whose client grants it no more window, while another stream on the same
/// connection keeps flowing. No socket-level timer can see this stall (the connection is busy),
/// so without a per-stream clock the first upstream call would run to the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_its_client_stops_reading_ends_at_send_timeout_while_others_flow() {
    use http_body_util::BodyExt;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let _serial = SERIAL.lock().await;
    let (up, _written) = firehose().await;
    let cfg = config(up).replace("[server]\n", "[server]\nsend_timeout = \"1s\"\n");
    let h = Harness::with_config(&cfg).await;
    let tcp = TcpStream::connect(h.addr()).await.unwrap();
    // No adaptive window: a stream's window is what its client gives back as it reads.
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(16 << 20)
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = || {
        let mut req = chat_request(&[("x-request-budget-ms", "60000")], true);
        *req.uri_mut() = "http://localhost/v1/chat/completions".parse().unwrap();
        req.headers_mut().remove("host");
        req
    };
    let start = Instant::now();
    // Stream A: its head is read, its body never.
    let stalled = sender.send_request(request()).await.unwrap();
    assert_eq!(stalled.status(), 200);
    // Stream B: read all along, so the connection never goes quiet.
    let flowing = sender.send_request(request()).await.unwrap();
    let mut flowing = flowing.into_body();
    let mut read = 0u64;
    let reader = async {
        loop {
            let frame = flowing.frame().await.expect("B ended").expect("B failed");
            read += frame.data_ref().map_or(0, |d| d.len() as u64);
            if h.metric("hourglass_upstream_requests_in_flight{upstream=\"fake\"}")
                .await
                == 1.0
            {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "A's upstream call still runs"
            );
        }
    };
    let ended = reader.await;
    assert!(
        ended >= Duration::from_millis(1000) && ended < Duration::from_secs(6),
        "A's upstream call ended after {ended:?}"
    );
    // B still streams.
    let more = flowing.frame().await.expect("B ended").expect("B failed");
    assert!(more.is_data());
    eprintln!(
        "h2 stall: A's upstream ended after {ended:?}; B read {} KiB by then",
        read >> 10
    );

    // A, read again, is reset: no silent end that looks whole. With CANCEL, an end made on
    // purpose (RFC 9113 7), not INTERNAL_ERROR, which clients take for a fault of the server.
    let mut body = stalled.into_body();
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match body.frame().await {
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    let mut source = std::error::Error::source(&e);
                    while let Some(s) = source {
                        if let Some(reason) =
                            s.downcast_ref::<h2::Error>().and_then(h2::Error::reason)
                        {
                            return format!("reset: {reason:?}");
                        }
                        source = s.source();
                    }
                    return format!("error: {e}");
                }
                None => return "clean end".to_owned(),
            }
        }
    })
    .await
    .expect("A ends once read");
    assert_eq!(end, "reset: CANCEL");
    drop(body);
    drop(flowing);
    h.wait_requests("chat", 2.0).await;
    // The stalled stream is send_timeout's, as an HTTP/1 client's closed connection is (it
    // was counted as the client's leaving); the one dropped here is the client's.
    assert_eq!(cancelled(&h, "send_timeout").await, 1.0);
    assert_eq!(cancelled(&h, "client").await, 1.0);
}

/// Audit KA 1: a client that never gives back its HTTP/2 *connection* window (httpx does not
/// for the streams it abandoned) stops every stream of the connection, fresh ones too: no
/// DATA can go out, so hyper polls no body, and a stream whose limit has fired, its upstream
/// call ended by the reaper, is reset only when polled. Such a connection, once every stream
/// on it waits past its limit (a stream still waiting for its answer keeps it open: audit LA
/// 1) and no DATA was written for `send_timeout`, is closed, so that each of its requests
/// ends, counted and logged as its own limit: the short stream's and the waiting one's
/// deadlines, the big one's `send_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_whose_client_gives_no_window_is_closed_past_a_fired_limit() {
    let _serial = SERIAL.lock().await;
    // A first token may take 20 s: the answer the third stream waits for does not begin.
    let h = Harness::with_config(
        &BASE
            .replace(
                "[server]\n",
                "[server]\nsend_timeout = \"1s\"\nheader_read_timeout = \"500ms\"\n",
            )
            .replace(
                "first_token_timeout = \"2s\"",
                "first_token_timeout = \"20s\"",
            )
            .replace("budget = \"10s\"", "budget = \"25s\""),
    )
    .await;
    let tcp = TcpStream::connect(h.addr()).await.unwrap();
    // Streams may take 1 MiB each, the connection 65,535 bytes (the default), and the client
    // never gives back any of it: the connection's window is what runs out.
    let (mut client, conn) = h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    let (closed_tx, closed) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = closed_tx.send(conn.await.map_err(|e| format!("{e:?}")));
    });
    let mut send = |budget: &str, fields: &[(&str, &str)]| {
        let mut req = http::Request::post(format!("http://{}/v1/chat/completions", h.addr()))
            .header("content-type", "application/json")
            .header("x-request-budget-ms", budget);
        for (k, v) in fields {
            req = req.header(*k, *v);
        }
        let (response, mut body) = client.send_request(req.body(()).unwrap(), false).unwrap();
        body.send_data(
            bytes::Bytes::from_static(
                br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
            ),
            true,
        )
        .unwrap();
        response
    };

    // A fast stream fills the connection's window: read (so h2 takes it), never released.
    let big = send(
        "30000",
        &[("x-fake-chunks", "5000"), ("x-fake-interval-ms", "0")],
    );
    let mut big = big.await.unwrap().into_body();
    let mut got = 0;
    while got < 65_535 {
        got += big.data().await.expect("more").expect("data").len();
    }
    // Then a short one, which gets its head (HEADERS take no window) and no byte more,
    // and one whose answer has not begun, and does not before its deadline.
    let short = send("1000", &[("x-fake-chunks", "3")]).await.unwrap();
    assert_eq!(short.status(), 200);
    let waiting = send("3000", &[("x-fake-ttft-ms", "20000")]);

    // The short stream's deadline passes, the big one's upstream goes at send_timeout, the
    // waiting one ends at its deadline, and no DATA can go out: the connection is closed.
    let end = tokio::time::timeout(Duration::from_secs(20), closed)
        .await
        .expect("a connection with no window held its streams past their limits")
        .unwrap();
    eprintln!("the stuck connection ended: {end:?}");
    h.wait_requests("chat", 3.0).await;
    assert_eq!(
        cancelled(&h, "deadline").await,
        2.0,
        "the short and the waiting stream's"
    );
    assert_eq!(cancelled(&h, "send_timeout").await, 1.0, "the big one's");
    assert_eq!(
        h.metric("hourglass_requests_in_flight{route=\"chat\"}")
            .await,
        0.0
    );
    drop((big, short, waiting));
}

/// The `chat` route's cancellations of `origin`.
async fn cancelled(h: &Harness, origin: &str) -> f64 {
    h.metric(&format!(
        "hourglass_cancellations_total{{origin=\"{origin}\",route=\"chat\"}}"
    ))
    .await
}
