//! The client listener's accept loop and connections: HTTP/1.1 and HTTP/2 on one port (ALPN
//! under TLS, the preface without), the socket tuning, the request handler that turns a
//! panic into a 500, and the admin listener's loop.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Response;
use http_body_util::{Either, Full};
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulConnection, GracefulShutdown, Watcher};
use pin_project_lite::pin_project;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::config::ServerConfig;
use crate::error::{GatewayError, Starved};
use crate::gateway::ProxyBody;
use crate::http::conn::{ClientConn, ClientWrites, Streams};
use crate::http::date;
use crate::http::framing::{AmbiguousFraming, Framing, FramingIo};
use crate::server::admin::Admin;
use crate::server::client_io::{ClientIo, First, Linger, RequestBody, Returned};
use crate::server::h2_stuck::Stuck;
use crate::server::head_timer::HeadTimer;
use crate::server::shared::Shared;
use crate::stream::signal::{Signal, Waiter};
use crate::telemetry::metrics::{accept_error_reason, Metrics};
use crate::telemetry::throttle::Throttle;

pub(super) fn local(l: &TcpListener) -> SocketAddr {
    l.local_addr().expect("a bound listener has an address")
}

/// Tokens are small writes that must leave at once; keep-alive finds peers that vanished
/// without a FIN, which the idle watchdog would otherwise be the only one to notice.
/// On Linux a connection accepted from a listener has the listener's settings, so it is
/// the listener that is tuned there, once, instead of each connection with four system
/// calls (the test below checks what an accepted connection gets).
/// The listen backlog of both listeners: connections whose handshake the kernel completed
/// and that wait to be accepted, past `max_connections` or while accepts fail for want of
/// descriptors. tokio's `TcpListener::bind` uses 128 (the standard library's), which let only
/// 128 clients wait and dropped the SYNs of the rest (audit KF 5: 400 clients at
/// `max_connections = 100`, 229 connected, the rest waited out SYN retransmits). nginx uses
/// 511, Go `net.core.somaxconn`; the kernel caps this at `net.core.somaxconn` (4,096 on Linux
/// since 5.4).
pub(super) const LISTEN_BACKLOG: u32 = 1024;

/// A listener on `addr` with [`LISTEN_BACKLOG`], bound as tokio's `TcpListener::bind` binds
/// (`SO_REUSEADDR`, so a restart binds while the old process's connections are in TIME_WAIT).
pub(super) fn listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

pub(super) fn tune(socket: SockRef<'_>) {
    let _ = socket.set_nodelay(true);
    let ka = TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(10));
    let _ = socket.set_tcp_keepalive(&ka);
}

/// hyper's HTTP/1 header limit when none is set (`DEFAULT_MAX_HEADERS` in its `role.rs`).
const HYPER_MAX_HEADERS: usize = 100;

/// hyper's HTTP/1 and HTTP/2 connection settings, from `[server]`.
struct Protocols {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
}

/// `accepted`: when the connection was, from which its first request head is timed; `fd`:
/// its socket, whose unread bytes a head's limit waits out.
fn protocols(server: &ServerConfig, accepted: Instant, fd: RawFd) -> Protocols {
    let mut h1 = http1::Builder::new();
    h1.timer(HeadTimer::new(
        accepted,
        server.header_read_timeout,
        server.send_timeout,
        fd,
    ))
    .header_read_timeout(server.header_read_timeout)
    // The head's own limit; the buffer's alone is not one (a read may fill the buffer
    // past it, and a head that arrives in large reads then passes).
    .max_header_size(server.max_header_bytes)
    .max_buf_size(server.max_header_bytes)
    .keep_alive(true);
    // Without a limit of its own hyper allows 100 headers in arrays on the stack; any limit
    // set, even 100, has it fill a vector of that many slots twice per request head parsed
    // (about 1,700 instructions a request). The same limit, then, is left to hyper.
    if server.max_headers != HYPER_MAX_HEADERS {
        h1.max_headers(server.max_headers);
    }
    Protocols {
        http1: h1,
        http2: http2_builder(server),
    }
}

/// hyper's HTTP/2 connection settings, from `[server]`: the client listener's, and the admin
/// listener's.
fn http2_builder(server: &ServerConfig) -> http2::Builder<TokioExecutor> {
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new())
        .max_concurrent_streams(server.http2_max_concurrent_streams)
        // Rapid-reset (CVE-2023-44487) and its variants: bound the resets a client can make us
        // process, and the streams it can open and abandon.
        .max_pending_accept_reset_streams(Some(50))
        .max_local_error_reset_streams(Some(256))
        // Twice the limit, which the handler holds requests to (`Gateway::forward`): a head
        // past the h2 crate's own bound gets its bare 431, which no log line or metric sees.
        .max_header_list_size(h2_header_list_bound(server.max_header_bytes))
        .keep_alive_interval(Some(Duration::from_secs(30)))
        // Every answer is dated by `http::date` (the handlers), which sends none when the
        // wall clock has no HTTP-date (before 1970): hyper's own would then format it and
        // panic, killing the answer (audit WD 4). HTTP/1 cannot be spared so: hyper renews
        // its date cache on every poll of a connection whether or not it writes the header,
        // and the clock must be set (docs/deployment.md).
        .auto_date_header(false);
    h2
}

/// What the h2 crate is told to accept of a header list: twice `max_header_bytes`.
fn h2_header_list_bound(max_header_bytes: usize) -> u32 {
    u32::try_from(max_header_bytes.saturating_mul(2)).unwrap_or(u32::MAX)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// How a client speaking HTTP/2 without TLS opens the connection (RFC 9113 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a cleartext client's first bytes say it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sniffed {
    Http(Protocol),
    /// A TLS handshake record (content type 22, version 3.x): a client given an `https://`
    /// URL for a listener without `[server.tls]`.
    Tls,
}

/// A fatal `handshake_failure` alert record (RFC 8446 6, 5.1): what a TLS client on the
/// plaintext listener is sent, which it reports as the server's refusal of the handshake.
/// hyper's bare HTTP 400 it read as a record of an unknown type ("wrong version number").
const HANDSHAKE_FAILURE_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28];

/// Which protocol a cleartext client speaks, from its first bytes (read into `first`, which
/// hyper then reads first): `None` when the client closed, or sent nothing that tells by `by`.
/// A TLS record's first two bytes tell a TLS client (no request line starts with 0x16).
/// Read, not peeked: a peek returns at once while bytes wait, so a client that sent part of
/// the preface had it polled until the limit, and its FIN behind them went unseen (audit CC).
///
/// Why not hyper-util's `auto` builder, which does the same: it waits for the bytes without
/// any limit (a client that connects and sends nothing held its connection, and a
/// `max_connections` slot, forever), and hands hyper those bytes alone in its first read,
/// which made hyper double its read buffer to 16 KiB on every connection (`ClientIo` hands
/// them with what the socket has besides).
async fn sniff(stream: &mut TcpStream, by: Instant, first: &mut First) -> Option<Sniffed> {
    use tokio::io::AsyncReadExt;
    let look = async {
        loop {
            let n = stream.read(first.room()).await.ok()?;
            if n == 0 {
                return None;
            }
            first.add(n);
            let got = first.got();
            match got {
                [0x16] => continue,
                [0x16, 0x03, ..] => return Some(Sniffed::Tls),
                _ => {}
            }
            if got != &PREFACE[..got.len()] {
                return Some(Sniffed::Http(Protocol::Http1));
            }
            if got.len() == PREFACE.len() {
                return Some(Sniffed::Http(Protocol::Http2));
            }
        }
    };
    tokio::time::timeout_at(by, look).await.ok().flatten()
}

/// The connection's first byte, once it comes; `None` if it closed first.
async fn first_byte(stream: &TcpStream) -> Option<u8> {
    let mut b = [0u8; 1];
    match stream.peek(&mut b).await {
        Ok(1) => Some(b[0]),
        _ => None,
    }
}

/// Answers a plain HTTP request made on the TLS listener with a 400 that says so, with the
/// request's `x-request-id` (the client's, when sane, as every answer has). Its head
/// is read first (up to its end, 16 KiB or a second); the close lingers as any answer's
/// made before the request was read does, so that it does not reset the connection under
/// the answer.
async fn answer_plain_http(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const MOST: usize = 16 << 10;
    let mut head = Vec::with_capacity(4096);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while head.len() < MOST && memchr::memmem::find(&head, b"\r\n\r\n").is_none() {
            match stream.read_buf(&mut head).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    let body = GatewayError::PlainHttpOnTls.json_body();
    // `request_id` keeps only visible ASCII: safe to write into the head as it is.
    let id = crate::http::headers::request_id(&head_fields(&head));
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         x-request-id: {id}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let sent = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(answer.as_bytes()).await?;
        stream.write_all(&body).await
    })
    .await;
    if matches!(sent, Ok(Ok(()))) {
        crate::server::client_io::linger_close(stream);
    }
}

/// Refuses a TLS client on the plaintext listener: a `handshake_failure` alert, then a
/// lingering close (its ClientHello is left unread, and a plain close would reset the
/// connection under the alert). Logged at most once a minute: a client misconfigured with
/// `https://` retries in a loop.
async fn refuse_tls(mut stream: TcpStream, peer: SocketAddr) {
    use tokio::io::AsyncWriteExt;
    static SAID: Throttle = Throttle::every(Duration::from_secs(60));
    if SAID.due() {
        tracing::info!(
            %peer,
            "a TLS client connected to the plaintext listener ([server.tls] is not set): \
             refused with a handshake_failure alert (counted in \
             hourglass_refused_heads_total{{reason=\"tls\"}}; said at most once a minute)"
        );
    }
    let sent = tokio::time::timeout(
        Duration::from_secs(1),
        stream.write_all(&HANDSHAKE_FAILURE_ALERT),
    )
    .await;
    if matches!(sent, Ok(Ok(()))) {
        crate::server::client_io::linger_close(stream);
    }
}

/// The `x-request-id` field of a raw HTTP/1 head (up to its end, or as much of it as came),
/// as a map `request_id` reads; nothing else of it is wanted.
fn head_fields(head: &[u8]) -> http::HeaderMap {
    let mut fields = http::HeaderMap::new();
    let end = memchr::memmem::find(head, b"\r\n\r\n").unwrap_or(head.len());
    for line in head[..end].split(|&b| b == b'\n').skip(1) {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if !name.eq_ignore_ascii_case(b"x-request-id") {
            continue;
        }
        if let Ok(value) = http::HeaderValue::from_bytes(value.trim_ascii()) {
            fields.append(crate::http::headers::REQUEST_ID, value);
        }
    }
    fields
}

/// CRL problems logged as warnings: at most one a minute, as a client retrying in a loop
/// would otherwise fill the log.
static CRL_WARNED: Throttle = Throttle::every(Duration::from_secs(60));

/// Serves until `stop` and `drain_delay` after it, then drains; what is left of
/// `shutdown_grace` once drained.
pub(super) async fn serve_clients(
    listener: TcpListener,
    shared: Arc<Shared>,
    stop: Signal,
) -> Duration {
    let graceful = GracefulShutdown::new();
    let initial = shared.server.load_full();
    let slots = initial.max_connections.map(|n| Arc::new(Semaphore::new(n)));
    // What the connections drain by: fired once the listener closes, not at `stop`, so that
    // during the delay the connections already open keep serving as well.
    let drain = Signal::new();
    let closing = close_after_delay(&shared, &stop);
    tokio::pin!(closing);
    loop {
        let permit = match &slots {
            Some(s) => tokio::select! {
                p = s.clone().acquire_owned() => Some(p.expect("semaphore is never closed")),
                () = &mut closing => break,
            },
            None => None,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    shared.metrics.accept_failed("clients", accept_error_reason(&e));
                    // Out of descriptors and the like: back off instead of spinning, and
                    // say so every few seconds, not at every try (20 lines a second).
                    static SAID: Throttle = Throttle::every(Duration::from_secs(5));
                    if SAID.due() {
                        tracing::warn!(
                            error = %e,
                            "accept failed; retried every 50ms (said at most every 5s)"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut closing => break,
        };
        #[cfg(not(target_os = "linux"))]
        tune(SockRef::from(&stream));
        let open = shared.metrics.client_connection();
        let shared = shared.clone();
        let watcher = graceful.watcher();
        let drain = drain.clone();
        tokio::spawn(async move {
            serve_connection(stream, peer, shared, watcher, drain).await;
            drop((permit, open));
        });
    }
    // Ready already false (`close_after_delay`); set again for a stop that came before it ran.
    shared.health.set_ready(false);
    drop(listener);
    drain.fire();
    let grace = shared.server.load().shutdown_grace;
    let began = tokio::time::Instant::now();
    let drained = graceful.shutdown();
    tokio::pin!(drained);
    tokio::select! {
        () = &mut drained => tracing::info!("all connections drained"),
        // Or cut before the grace's end (a second signal).
        () = cut_by(&shared, grace) => {
            shared.cut.fire();
            // Long enough for every cut stream to write its error event.
            tokio::select! {
                () = &mut drained => {}
                () = tokio::time::sleep(Duration::from_secs(2)) => {
                    tracing::warn!("connections still open after the cut; closing them");
                }
            }
        }
    }
    shared.cut.fire();
    grace.saturating_sub(began.elapsed())
}

/// Ends `drain_delay` after `stop`, during which `/readyz` answers 503 and the client listener
/// still accepts (audit PD 2): a load balancer polling `/readyz` takes the replica out of its
/// pool within a few checks, and until then the requests it sends are served rather than
/// refused at a closed port. A second signal (which fires the cut) ends the delay at once.
async fn close_after_delay(shared: &Shared, stop: &Signal) {
    stop.fired().await;
    shared.health.set_ready(false);
    // Read at the stop, as `shutdown_grace` is: a reload changes the next stop's.
    let delay = shared.server.load().drain_delay;
    if delay.is_zero() {
        return;
    }
    tracing::info!(
        ?delay,
        "stop signal: /readyz answers 503; still accepting clients for drain_delay, then draining"
    );
    tokio::select! {
        () = tokio::time::sleep(delay) => {
            tracing::info!("drain_delay over: the client listener closes, draining");
        }
        () = shared.cut.fired() => {
            tracing::warn!("second signal during drain_delay: the client listener closes now");
        }
    }
}

/// When the requests still in flight are cut: at the grace's end, or sooner if the cut is
/// fired from outside.
async fn cut_by(shared: &Shared, grace: Duration) {
    tokio::select! {
        () = tokio::time::sleep(grace) => {
            let in_flight = shared.metrics.requests_in_flight();
            if in_flight > 0 {
                tracing::warn!(
                    ?grace,
                    in_flight,
                    "shutdown grace elapsed: cutting the {in_flight} requests still in flight"
                );
            } else {
                tracing::warn!(
                    ?grace,
                    "shutdown grace elapsed with no request in flight: closing the connections still open"
                );
            }
        }
        () = shared.cut.fired() => {}
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    watcher: hyper_util::server::graceful::Watcher,
    drain: Signal,
) {
    let accepted = Instant::now();
    let server = shared.server.load_full();
    let writes = ClientWrites::default();
    // The service of this connection; over HTTP/2 its requests also count its open streams,
    // over HTTP/1 the framing of their heads is followed.
    let service = {
        let shared = shared.clone();
        let writes = writes.clone();
        let max_request_body = server.max_request_body;
        let drain = drain.clone();
        move |streams: Option<Streams>,
              framing: Option<Arc<Framing>>,
              certificate: Option<Arc<str>>| {
            let shared = shared.clone();
            let writes = writes.clone();
            // Over HTTP/2 a body answered early is read on, up to what one may be, until the
            // server drains.
            let linger = streams
                .is_some()
                .then(|| Linger::new(max_request_body, drain.clone(), peer.ip()));
            service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let mut req = req.map(|body| RequestBody::new(body, linger.clone()));
                if framing
                    .as_ref()
                    .is_some_and(|f| f.next_request_is_ambiguous())
                {
                    req.extensions_mut().insert(AmbiguousFraming);
                }
                // Each request keeps the routing table it started with, across reloads.
                let gateway = shared.gateway.load_full();
                // Boxed: hyper keeps the service future in a per-connection box that lives as
                // long as the connection, sized for the future (a few KiB of routing, retry and
                // attempt state). Behind our own box that is freed once the response head is
                // out.
                let client = ClientConn {
                    peer,
                    streams: streams.as_ref(),
                    certificate: certificate.as_ref(),
                    writes: Some(&writes),
                };
                Box::pin(Handler::new(shared.metrics.clone(), peer, || {
                    gateway.handle(req, Some(client))
                }))
            })
        }
    };
    let protocols = protocols(&server, accepted, stream.as_raw_fd());
    let result = match shared.tls.load_full() {
        Some(acceptor) => {
            // Boxed, as HTTP/2 is below: inline, the TLS and HTTP/2 states would size every
            // connection's task (cleartext HTTP/1 too) for the largest of them.
            let metrics = shared.metrics.clone();
            let tls = Box::pin(async move {
                let by = accepted + server.header_read_timeout;
                // A TLS client speaks first with a handshake record (0x16); a request line
                // starts with a method's capital letter. Such a client is told in HTTP, as
                // nginx does, instead of sent an alert it would read as garbage.
                let first = tokio::select! {
                    r = tokio::time::timeout_at(by, first_byte(&stream)) => r,
                    () = drain.fired() => return None,
                };
                if let Ok(Some(b'A'..=b'Z')) = first {
                    metrics.tls_handshake_failure("plain_http");
                    answer_plain_http(stream).await;
                    return None;
                }
                let (io, returned) = ClientIo::new(
                    stream,
                    First::default(),
                    server.send_timeout,
                    writes.clone(),
                );
                let handshake = tokio::time::timeout_at(by, acceptor.accept(io));
                // No request is in flight yet: a drain closes the connection at once rather
                // than wait out the handshake (a load balancer's probe would hold every
                // shutdown for the header-read timeout).
                let handshake = tokio::select! {
                    r = handshake => r,
                    () = drain.fired() => return None,
                };
                let tls_stream = match handshake {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        let reason = crate::server::tls::handshake_failure(&e);
                        if reason == "client_certificate" {
                            crate::server::client_cert::refused(peer, &e);
                        } else {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        }
                        if let Some(problem) = crate::server::tls::crl_problem(&e) {
                            if CRL_WARNED.due() {
                                tracing::warn!(%peer, error = %e, "{problem}");
                            }
                        }
                        metrics.tls_handshake_failure(reason);
                        return None;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        metrics.tls_handshake_failure("timeout");
                        return None;
                    }
                };
                // ALPN decides (RFC 9113 3.3): a client that did not choose h2 speaks
                // HTTP/1.1.
                let session = tls_stream.get_ref().1;
                let h2 = session.alpn_protocol() == Some(b"h2");
                // Read once a connection: every request on it names the same client.
                let certificate: Option<Arc<str>> = session
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .and_then(|leaf| crate::server::x509::subject(leaf))
                    .map(Arc::from);
                Some(if h2 {
                    // HTTP/2 keeps its own idle limit and drain (`idle`), not the watcher's.
                    crate::server::h2_idle::serve(
                        &protocols.http2,
                        TokioIo::new(tls_stream),
                        |streams| service(Some(streams), None, certificate),
                        server.header_read_timeout,
                        accepted,
                        drain,
                        watcher,
                        Stuck::new(server.send_timeout, writes.clone()),
                    )
                    .await
                } else {
                    let (io, framing) = FramingIo::new(tls_stream);
                    let connection = protocols.http1.serve_connection(
                        TokioIo::new(io),
                        service(None, Some(framing.clone()), certificate),
                    );
                    let result = Draining::new(connection, &drain, watcher).await;
                    linger_if_sending(&result, &framing, &returned);
                    // A head stalled part-way is counted as over cleartext, but closed without
                    // the 408: hyper drops the TLS session with the connection, and a 408 on
                    // the raw socket would be no TLS record.
                    if result.as_ref().is_err_and(hyper::Error::is_timeout) && framing.mid_message()
                    {
                        metrics.refused_head("header_timeout");
                    }
                    result
                })
            });
            let Some(result) = tls.await else { return };
            result
        }
        None => {
            // Closed, or nothing that tells within the header-read timeout: closed without
            // a word, as an idle connection may be (RFC 9112 9.6). So is one that has sent
            // nothing when the server drains, as hyper closes an idle keep-alive one.
            let mut stream = stream;
            let mut first = First::default();
            let protocol = tokio::select! {
                p = sniff(&mut stream, accepted + server.header_read_timeout, &mut first) => p,
                () = drain.fired() => None,
            };
            let protocol = match protocol {
                Some(Sniffed::Http(protocol)) => protocol,
                Some(Sniffed::Tls) => {
                    shared.metrics.refused_head("tls");
                    refuse_tls(stream, peer).await;
                    return;
                }
                None => return,
            };
            let (io, returned) = ClientIo::new(stream, first, server.send_timeout, writes.clone());
            let result = match protocol {
                Protocol::Http2 => {
                    Box::pin(crate::server::h2_idle::serve(
                        &protocols.http2,
                        TokioIo::new(io),
                        |streams| service(Some(streams), None, None),
                        server.header_read_timeout,
                        accepted,
                        drain,
                        watcher,
                        Stuck::new(server.send_timeout, writes.clone()),
                    ))
                    .await
                }
                Protocol::Http1 => {
                    let (io, framing) = FramingIo::new(io);
                    let connection = protocols.http1.serve_connection(
                        TokioIo::new(io),
                        service(None, Some(framing.clone()), None),
                    );
                    let result = Draining::new(connection, &drain, watcher).await;
                    linger_if_sending(&result, &framing, &returned);
                    result
                }
            };
            // hyper closes such a connection without a word; one stalled mid-head is told.
            if result.as_ref().is_err_and(hyper::Error::is_timeout)
                && returned.answer_stalled_head()
            {
                shared.metrics.refused_head("header_timeout");
            }
            result
        }
    };
    if let Err(e) = result {
        // hyper answers these heads itself: they never reach the handler or its log line.
        let refused = if e.is_parse_version_h2() {
            // The whole HTTP/2 preface, read by the HTTP/1 server: only over TLS, where the
            // client did not choose `h2` by ALPN (cleartext sniffs the preface first). RFC
            // 9113 3.3 has such a client refused; hyper closes without a word, so it is
            // counted and said here. No GOAWAY: that would take reading every such
            // connection's first bytes ahead of hyper, to close one a client misconfigured.
            static SAID: Throttle = Throttle::every(Duration::from_secs(60));
            if SAID.due() {
                tracing::info!(
                    %peer,
                    "HTTP/2 prior knowledge over TLS without ALPN h2 (curl --no-alpn \
                     --http2-prior-knowledge): refused, connection closed; a client speaks \
                     HTTP/2 over TLS by offering h2 in ALPN (said at most once a minute)"
                );
            }
            Some("h2_without_alpn")
        } else if e.is_parse_too_large() {
            Some("too_large")
        } else if e.is_parse() {
            Some("malformed")
        } else {
            None
        };
        if let Some(reason) = refused {
            shared.metrics.refused_head(reason);
        }
        tracing::debug!(%peer, error = %e, "client connection ended with an error");
    }
}

/// After an HTTP/1 connection ends: a lingering close when the client's bytes ended inside
/// a message, so it may still be sending (`Returned::linger`). Not after the header-read
/// timeout: that client is stalled, not sending.
fn linger_if_sending(result: &Result<(), hyper::Error>, framing: &Framing, returned: &Returned) {
    if framing.mid_message() && !result.as_ref().is_err_and(hyper::Error::is_timeout) {
        returned.linger();
    }
}

pin_project! {
    /// An HTTP/1 connection that shuts down gracefully (ends after the response in flight)
    /// once the server drains, holding the watcher the drain counts connections by until it
    /// ends. hyper-util's own `watch` does this with a future that takes two locks on every
    /// poll of the connection, once or twice per chunk a stream sends; the waiter asks an
    /// atomic flag.
    struct Draining<C> {
        #[pin]
        conn: C,
        drain: Option<Waiter>,
        _watcher: Watcher,
    }
}

impl<C> Draining<C> {
    fn new(conn: C, drain: &Signal, watcher: Watcher) -> Self {
        Self {
            conn,
            drain: Some(drain.waiter()),
            _watcher: watcher,
        }
    }
}

impl<C: GracefulConnection> Future for Draining<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Some(drain) = this.drain.as_mut() {
            if drain.poll_fired(cx).is_ready() {
                *this.drain = None;
                this.conn.as_mut().graceful_shutdown();
            }
        }
        this.conn.poll(cx)
    }
}

pin_project! {
    /// The request handler's future, with a panic (while it is made or polled) turned into a
    /// 500, so that one bad request cannot take its connection (or a worker) down with it.
    ///
    /// A future of its own rather than an `async` block around the handler: such a block
    /// keeps what it captures (the request) for its whole life next to the handler's own
    /// copy, and this is the box every request allocates.
    struct Handler<F> {
        #[pin]
        inner: Option<F>,
        // Why `inner` is `None`: the handler panicked before its future was made.
        panic: Option<String>,
        metrics: Arc<Metrics>,
        peer: SocketAddr,
    }
}

impl<F> Handler<F> {
    // Inlined, so that the handler's future is made in place: called out of line (as it was
    // once the service closure grew the framing check), the future was returned by `memcpy`,
    // 400 instructions a request (callgrind).
    #[inline(always)]
    fn new(metrics: Arc<Metrics>, peer: SocketAddr, make: impl FnOnce() -> F) -> Self {
        let (inner, panic) = match std::panic::catch_unwind(AssertUnwindSafe(make)) {
            Ok(f) => (Some(f), None),
            Err(payload) => (None, Some(panic_message(&*payload))),
        };
        Self {
            inner,
            panic,
            metrics,
            peer,
        }
    }
}

impl<F: Future<Output = Response<ProxyBody>>> Future for Handler<F> {
    type Output = Result<Response<ProxyBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let message = match this.inner.as_mut().as_pin_mut() {
            Some(inner) => match std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
                Ok(Poll::Ready(mut resp)) => {
                    // Dated here, not by hyper's cache, which a step back of the wall clock
                    // freezes (see `http::date`); an upstream's own Date stays.
                    date::insert_if_missing(resp.headers_mut());
                    return Poll::Ready(Ok(resp));
                }
                Ok(Poll::Pending) => return Poll::Pending,
                Err(payload) => {
                    // Not polled again, and dropped now rather than with the connection.
                    this.inner.set(None);
                    panic_message(&*payload)
                }
            },
            None => this.panic.take().unwrap_or_default(),
        };
        this.metrics.panicked();
        tracing::error!(peer = %this.peer, panic = %message, "request handler panicked");
        let mut resp = GatewayError::Internal
            .response()
            .map(|b| Either::Left(Full::new(b)));
        date::insert_if_missing(resp.headers_mut());
        Poll::Ready(Ok(resp))
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".to_string())
}

/// How long the admin listener waits for a request head (and, between requests, for the
/// next one).
const ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A descriptor kept for the admin listener: opened at start, given up to accept a probe or
/// a scrape when client connections (or upstream ones) hold every other descriptor, and taken
/// back once one is free (libev's and Node's trick for EMFILE). Without it, the probes went
/// unanswered at descriptor exhaustion and the kubelet's liveness probe restarted a pod that
/// was serving every stream it could (audit KF 1). Another task may take the descriptor
/// given up before the accept does; the accept then fails again and is retried.
#[derive(Clone)]
pub(super) struct Spare(Arc<std::sync::Mutex<Option<std::fs::File>>>);

impl Spare {
    pub(super) fn open() -> Self {
        Self(Arc::new(std::sync::Mutex::new(
            std::fs::File::open("/dev/null").ok(),
        )))
    }

    /// Takes a descriptor back, if it has none and one is free. Called as soon as an admin
    /// connection closed, whose descriptor is then the lowest free one, which the next open
    /// gets: the client listener, retrying every 50ms, would take it otherwise.
    fn refill(&self) {
        let mut spare = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if spare.is_none() {
            *spare = std::fs::File::open("/dev/null").ok();
        }
    }

    /// Gives its descriptor up: whether it had one.
    fn release(&self) -> bool {
        let mut spare = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        spare.take().is_some()
    }
}

/// Serves the admin listener: HTTP/1.1, and HTTP/2 with prior knowledge (h2c, told by the
/// preface as on the client listener), so that a load balancer whose checks speak the
/// protocol of its servers (haproxy's `proto h2`) is answered (audit PD 3: it got no byte, and
/// marked every replica down). Its HTTP/2 limits are the client listener's, as `server` had
/// them at start-up.
pub(super) async fn serve_admin(
    listener: TcpListener,
    admin: Arc<Admin>,
    spare: Spare,
    server: Arc<ServerConfig>,
) {
    let h2 = Arc::new(http2_builder(&server));
    let send_timeout = server.send_timeout;
    // The admin connections are no part of a drain (the listener outlives the client one,
    // and is aborted at the end): a watcher and a drain signal that nothing waits for.
    let (graceful, never) = (GracefulShutdown::new(), Signal::new());
    loop {
        spare.refill();
        let (stream, on_spare) = match listener.accept().await {
            Ok((stream, _)) => (stream, false),
            Err(e) => {
                admin
                    .metrics
                    .accept_failed("admin", accept_error_reason(&e));
                let starved = Starved::of(&e) == Some(Starved::Descriptors);
                // The connection that failed is still queued: accept it on the spare.
                let retried = if starved && spare.release() {
                    listener.accept().await.ok()
                } else {
                    None
                };
                match retried {
                    Some((stream, _)) => (stream, true),
                    None => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                }
            }
        };
        let (admin, spare, h2) = (admin.clone(), spare.clone(), h2.clone());
        let (watcher, never) = (graceful.watcher(), never.clone());
        tokio::spawn(async move {
            let accepted = Instant::now();
            // On the spare, an HTTP/2 connection is shut down gracefully (GOAWAY) once its
            // first request came, as an HTTP/1.1 one closes after it: a poller reusing its
            // connection held the one descriptor every other probe needs (audit QB 2).
            let first_request = Signal::new();
            let seen = first_request.clone();
            let svc = service_fn(move |req| {
                if on_spare {
                    seen.fire();
                }
                crate::server::admin::handle(req, admin.clone())
            });
            // A scraper's head arrives at once: one that does not is not left holding a
            // descriptor of the port the health probes depend on.
            let mut stream = stream;
            let mut first = First::default();
            let by = accepted + ADMIN_HEADER_READ_TIMEOUT;
            let protocol = sniff(&mut stream, by, &mut first).await;
            let (io, _) = ClientIo::new(stream, first, send_timeout, ClientWrites::default());
            match protocol {
                // A TLS client too: hyper refuses its handshake as a malformed head, as before.
                Some(Sniffed::Http(Protocol::Http1) | Sniffed::Tls) => {
                    let _ = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(ADMIN_HEADER_READ_TIMEOUT)
                        // On the spare, one request and close: a scraper's keep-alive
                        // connection would hold the one descriptor the next probe needs.
                        .keep_alive(!on_spare)
                        .serve_connection(TokioIo::new(io), svc)
                        .await;
                }
                // Closed when idle for the same limit as an HTTP/1.1 keep-alive one; on the
                // spare, after its first request too (shut down as a drain would, which
                // lets the streams already open finish).
                Some(Sniffed::Http(Protocol::Http2)) => {
                    let _ = crate::server::h2_idle::serve(
                        &h2,
                        TokioIo::new(io),
                        |_| svc,
                        ADMIN_HEADER_READ_TIMEOUT,
                        accepted,
                        if on_spare { first_request } else { never },
                        watcher,
                        Stuck::new(send_timeout, ClientWrites::default()),
                    )
                    .await;
                }
                // Closed, or silent for the head's limit.
                None => drop(io),
            }
            // The connection's descriptor is closed: keep it for the next probe.
            spare.refill();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panics_counted(metrics: &Metrics) -> String {
        metrics
            .encode()
            .lines()
            .find(|l| l.starts_with("hourglass_panics_total "))
            .unwrap_or("no panics line")
            .to_owned()
    }

    async fn answered<F: Future<Output = Response<ProxyBody>>>(
        make: impl FnOnce() -> F,
    ) -> (http::StatusCode, String) {
        let metrics = Arc::new(Metrics::new());
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let resp = Handler::new(metrics.clone(), peer, make).await.unwrap();
        (resp.status(), panics_counted(&metrics))
    }

    #[tokio::test]
    async fn a_handler_that_panics_while_made_or_polled_is_a_500_and_counted() {
        let ok = answered(|| async { Response::new(Either::Left(Full::default())) }).await;
        assert_eq!(
            ok,
            (http::StatusCode::OK, "hourglass_panics_total 0".into())
        );

        let made = answered(|| -> std::future::Ready<Response<ProxyBody>> { panic!("made") });
        let polled = answered(|| async {
            tokio::task::yield_now().await;
            panic!("polled")
        });
        for got in [made.await, polled.await] {
            assert_eq!(
                got,
                (
                    http::StatusCode::INTERNAL_SERVER_ERROR,
                    "hourglass_panics_total 1".into()
                )
            );
        }
    }

    /// Every answer leaves the handler dated by the wall clock of its making, not by hyper's
    /// per-thread cache, which a step back of the clock froze for as long (audit KD 2): the
    /// gateway's own (here a 401, and the 500 of a panic), and an upstream's without a
    /// `Date`; an upstream's `Date` stays.
    #[tokio::test]
    async fn every_answer_leaves_the_handler_dated_now() {
        async fn dated<F: Future<Output = Response<ProxyBody>>>(
            make: impl FnOnce() -> F,
        ) -> http::HeaderMap {
            let metrics = Arc::new(Metrics::new());
            let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
            let resp = Handler::new(metrics, peer, make).await.unwrap();
            resp.headers().clone()
        }
        let before = std::time::SystemTime::now() - Duration::from_secs(1);
        let own = dated(|| async {
            GatewayError::Unauthorized
                .response()
                .map(|b| Either::Left(Full::new(b)))
        })
        .await;
        let panicked =
            dated(|| -> std::future::Ready<Response<ProxyBody>> { panic!("made") }).await;
        let after = std::time::SystemTime::now();
        for headers in [own, panicked] {
            let date = headers.get(http::header::DATE).expect("dated");
            let at = httpdate::parse_http_date(date.to_str().unwrap()).unwrap();
            assert!(before <= at && at <= after, "{date:?}");
        }
        let upstreams = dated(|| async {
            let mut resp = Response::new(Either::Left(Full::default()));
            resp.headers_mut().insert(
                http::header::DATE,
                http::HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
            );
            resp
        })
        .await;
        assert_eq!(
            upstreams[http::header::DATE],
            "Wed, 21 Oct 2015 07:28:00 GMT"
        );
    }

    /// A connected pair on loopback: the client's end and the server's.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (client, accepted) =
            tokio::join!(TcpStream::connect(local(&listener)), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    /// Audit CC: a client that sent part of the preface and then its FIN was polled every 5 ms
    /// until the header-read timeout (a peek saw its bytes, never the FIN behind them).
    #[tokio::test(start_paused = true)]
    async fn a_fin_after_part_of_the_preface_is_seen_at_once() {
        use tokio::io::AsyncWriteExt;
        for sent in [&b"P"[..], b"PRI * HTTP/2.0\r\n", b""] {
            let (mut client, mut server) = pair().await;
            client.write_all(sent).await.unwrap();
            client.shutdown().await.unwrap();
            let start = Instant::now();
            let by = start + Duration::from_secs(10);
            let told = sniff(&mut server, by, &mut First::default()).await;
            assert_eq!(told, None, "{sent:?}");
            // The paused clock moves only when the runtime waits on a timer: none did.
            assert_eq!(start.elapsed(), Duration::ZERO, "{sent:?}");
        }
    }

    /// What `sniff` read, hyper reads first, with what follows it; a preface in pieces is
    /// waited for.
    #[tokio::test(start_paused = true)]
    async fn what_sniff_read_is_read_again_before_what_follows() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let cases: [(&[&[u8]], Protocol); 3] = [
            (&[b"GET / HTTP/1.1\r\n\r\n"], Protocol::Http1),
            (&[b"P", b"OST / HTTP/1.1\r\n\r\n"], Protocol::Http1),
            (
                &[b"PRI * HTTP/2.0\r\n", b"\r\nSM\r\n\r\n\0\0\0\x04"],
                Protocol::Http2,
            ),
        ];
        for (pieces, protocol) in cases {
            let (mut client, mut server) = pair().await;
            tokio::spawn(async move {
                for piece in pieces {
                    client.write_all(piece).await.unwrap();
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                client.shutdown().await.unwrap();
            });
            let mut first = First::default();
            let by = Instant::now() + Duration::from_secs(10);
            assert_eq!(
                sniff(&mut server, by, &mut first).await,
                Some(Sniffed::Http(protocol))
            );
            let (mut io, _) = ClientIo::new(
                server,
                first,
                Duration::from_secs(10),
                ClientWrites::default(),
            );
            let mut got = Vec::new();
            io.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, pieces.concat());
        }
    }

    /// Audit MB 2: a TLS record's start tells a TLS client, its two bytes in one read or
    /// two; 0x16 followed by anything else is HTTP/1's to refuse.
    #[tokio::test(start_paused = true)]
    async fn a_tls_record_is_told_from_http() {
        use tokio::io::AsyncWriteExt;
        let cases: [(&[&[u8]], Sniffed); 3] = [
            (&[b"\x16\x03\x01\x02\x00\x01"], Sniffed::Tls),
            (&[b"\x16", b"\x03\x03"], Sniffed::Tls),
            (&[b"\x16GET / HTTP/1.1\r\n"], Sniffed::Http(Protocol::Http1)),
        ];
        for (pieces, sniffed) in cases {
            let (mut client, mut server) = pair().await;
            tokio::spawn(async move {
                for piece in pieces {
                    client.write_all(piece).await.unwrap();
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            });
            let by = Instant::now() + Duration::from_secs(10);
            let told = sniff(&mut server, by, &mut First::default()).await;
            assert_eq!(told, Some(sniffed), "{pieces:?}");
        }
    }

    /// What `tune` relies on: the listener's settings are the accepted connection's.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn an_accepted_connection_has_the_listeners_tuning() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        tune(SockRef::from(&listener));
        let addr = local(&listener);
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (_client, (stream, _)) = (client.unwrap(), accepted.unwrap());
        let socket = SockRef::from(&stream);
        assert!(socket.nodelay().unwrap());
        assert!(socket.keepalive().unwrap());
        assert_eq!(socket.keepalive_time().unwrap(), Duration::from_secs(60));
        assert_eq!(
            socket.keepalive_interval().unwrap(),
            Duration::from_secs(10)
        );
    }
}
