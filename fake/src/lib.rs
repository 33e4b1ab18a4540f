//! A time-controllable fake LLM provider.
//!
//! Used by integration tests, `hourglass demo`, `hourglass fake-upstream --listen ADDR` and the
//! benchmarks. It speaks OpenAI's Chat Completions (`POST /v1/chat/completions`, `GET
//! /v1/models`) and Responses (`POST /v1/responses`: the `response.*` event stream, or the
//! `response` object) APIs and Anthropic's Messages (`POST /v1/messages`) over HTTP/1.1 and h2c
//! (prior knowledge) on one listener, and every request can script its own timing through
//! `x-fake-*` headers:
//!
//! | header | meaning |
//! | --- | --- |
//! | `x-fake-ttft-ms` (0) | delay before the first data event (non-stream: before the body) |
//! | `x-fake-headers-first` (`1`/`true`) | send the response head at once, delay only the data; by default the head leaves together with the first event |
//! | `x-fake-chunks` (5) | number of content tokens (`tok1 `, `tok2 `, ...) |
//! | `x-fake-interval-ms` (20) | gap before each content event and before the first closing event |
//! | `x-fake-freeze-after` N | after N content events write nothing more, holding the connection until the peer leaves |
//! | `x-fake-disconnect-after` N | after N content events abort the response (HTTP/1: connection closed without the final chunk; h2: RST_STREAM) |
//! | `x-fake-status` S | answer status S with an OpenAI-shaped error (after the ttft delay) |
//! | `x-fake-keepalive-ms` K | while the open stream is silent, write a keep-alive every K ms |
//! | `x-fake-keepalive-kind` | `comment` (`: keep-alive`) or `ping` (`event: ping`) |
//! | `x-fake-timestamps` (`1`) | content events carry `"x_fake_sent_ns"` from [`monotonic_ns`] |
//! | `x-fake-tool-call` NAME | answer with a call of function NAME instead of text: its arguments `{"text":"tok1 ..."}` stream in the content events (Chat `tool_calls` deltas, Anthropic `tool_use` + `input_json_delta`, Responses `function_call` + `response.function_call_arguments.delta`) |
//!
//! [`FakeUpstream::set_replay`] makes every `POST` answer with recorded events instead (real
//! providers' streams, kept as fixtures): the first after `x-fake-ttft-ms`, then one every
//! interval, each counting as a content event for `x-fake-freeze-after` and
//! `x-fake-disconnect-after`.
//!
//! Non-stream answers are a single event that is not a content event, so any freeze/disconnect
//! count stops them before the body. Unknown `x-fake-*` headers are ignored; malformed values get
//! a 400. Every connection and request is recorded for tests to assert on (see [`FakeUpstream`]).
//!
//! Close detection: the accepted socket is wrapped in an IO type that stamps
//! [`ConnectionRecord::closed_at`] on EOF or error and on drop. That suffices because hyper's
//! HTTP/1 server, once the request body is fully read, keeps a read pending while the service
//! future or the response body is pending, and treats EOF (with the default `half_close(false)`)
//! or a reset as the end of the connection, dropping both; h2 polls for RST_STREAM in both
//! states. The exception: bytes the client sent beyond the request (pipelining) stop hyper from
//! reading, and then a close is not noticed until a write fails. The tests below pin the
//! behaviour down, since the gateway relies on it too.

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

/// Nanoseconds on a process-wide monotonic clock; the clock of `x_fake_sent_ns`.
///
/// `libc`/`nix` are not dependencies, so this is not the raw `CLOCK_MONOTONIC` reading but
/// `std::time::Instant` (CLOCK_MONOTONIC on Linux) measured from an anchor taken on first use.
/// Values are therefore comparable only inside one process: a benchmark harness that runs the
/// fake in-process can subtract them from its own `monotonic_ns()` readings.
pub fn monotonic_ns() -> u64 {
    static ANCHOR: OnceLock<std::time::Instant> = OnceLock::new();
    let anchor = *ANCHOR.get_or_init(std::time::Instant::now);
    u64::try_from(anchor.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// One accepted TCP connection.
#[derive(Clone, Debug)]
pub struct ConnectionRecord {
    /// Sequential id, starting at 0; [`RequestRecord::conn_id`] refers to it.
    pub id: u64,
    /// The client's address.
    pub peer: SocketAddr,
    /// When the connection was accepted.
    pub opened_at: Instant,
    /// When the fake noticed the peer was gone (EOF or error on the socket, or the connection
    /// task ending); `None` while open.
    pub closed_at: Option<Instant>,
}

/// One request, recorded once its body has been read.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    /// The [`ConnectionRecord::id`] it arrived on.
    pub conn_id: u64,
    /// When the service started handling it.
    pub at: Instant,
    /// Request method.
    pub method: Method,
    /// Path and query.
    pub path: String,
    /// Request headers as received.
    pub headers: HeaderMap,
    /// The full request body.
    pub body: Bytes,
    /// HTTP version of the request.
    pub version: Version,
    /// When the response ended: its body finished, failed on purpose, or was dropped early (the
    /// peer went away or reset the stream while the head or body was pending).
    pub finished_at: Option<Instant>,
    /// True only if the response body ran to its normal end.
    pub completed: bool,
}

#[derive(Default)]
struct Records {
    connections: Vec<ConnectionRecord>,
    requests: Vec<RequestRecord>,
}

/// State shared by the handle, the accept loop, connections and response bodies.
struct Shared {
    records: Mutex<Records>,
    /// Bumped after every change so `wait_*` can sleep instead of polling.
    changed: watch::Sender<()>,
    next_reply_id: AtomicU64,
    /// Script headers this instance applies when a request does not carry them itself, so
    /// that two fakes behind one gateway can behave differently for the same request.
    script_defaults: Mutex<HeaderMap>,
    replay: Mutex<Option<Replay>>,
}

/// A recorded answer that [`FakeUpstream::set_replay`] plays back, one frame per event.
#[derive(Clone, Debug)]
pub struct Replay {
    /// `text/event-stream`, or `application/json` for a non-streaming body.
    pub content_type: &'static str,
    pub events: Arc<[Bytes]>,
    /// The gap before every event after the first.
    pub interval: Duration,
}

impl Replay {
    /// An SSE stream, cut into its events (each ending with its blank line).
    pub fn sse(stream: &str, interval: Duration) -> Replay {
        let events = stream
            .split_inclusive("\n\n")
            .map(|e| Bytes::copy_from_slice(e.as_bytes()))
            .collect();
        Replay {
            content_type: "text/event-stream",
            events,
            interval,
        }
    }

    /// A JSON body, sent whole.
    pub fn json(body: &str) -> Replay {
        Replay {
            content_type: "application/json",
            events: Arc::from([Bytes::copy_from_slice(body.as_bytes())]),
            interval: Duration::ZERO,
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Records> {
        // A panic elsewhere must not hide the records from the test that wants to report it.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update<R>(&self, change: impl FnOnce(&mut Records) -> R) -> R {
        let result = change(&mut self.lock());
        self.changed.send_replace(());
        result
    }

    fn connection_closed(&self, id: u64) {
        let now = Instant::now();
        self.update(|records| {
            let record = usize::try_from(id)
                .ok()
                .and_then(|i| records.connections.get_mut(i));
            if let Some(record) = record.filter(|c| c.closed_at.is_none()) {
                record.closed_at = Some(now);
            }
        });
    }

    /// Waits until `check` yields a value, re-checking after every change.
    async fn wait_until<T>(
        &self,
        timeout: Duration,
        mut check: impl FnMut(&Records) -> Option<T>,
    ) -> Option<T> {
        let deadline = Instant::now() + timeout;
        // Subscribing before checking means no change between the two can be missed.
        let mut changes = self.changed.subscribe();
        loop {
            let found = check(&self.lock());
            if found.is_some() {
                return found;
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return check(&self.lock());
            }
        }
    }
}

/// Marks a request finished exactly once: explicitly, or as abandoned when dropped first (which
/// is how a dropped service future or response body shows up).
struct Finisher {
    shared: Arc<Shared>,
    index: usize,
    done: bool,
}

impl Finisher {
    fn finish(&mut self, completed: bool) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let now = Instant::now();
        self.shared.update(|records| {
            if let Some(request) = records.requests.get_mut(self.index) {
                request.finished_at = Some(now);
                request.completed = completed;
            }
        });
    }
}

impl Drop for Finisher {
    fn drop(&mut self) {
        self.finish(false);
    }
}

/// The accepted socket, stamping `closed_at` on EOF/error and when hyper drops it.
struct RecordingIo {
    inner: TcpStream,
    shared: Arc<Shared>,
    id: u64,
}

impl AsyncRead for RecordingIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let had_room = buf.remaining() > 0;
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        let eof = matches!(result, Poll::Ready(Ok(()))) && had_room && buf.filled().len() == before;
        if eof || matches!(result, Poll::Ready(Err(_))) {
            self.shared.connection_closed(self.id);
        }
        result
    }
}

impl RecordingIo {
    fn note<T>(&self, result: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        // A failed write (EPIPE, ECONNRESET) is as good a sign of a vanished peer as a read.
        if matches!(result, Poll::Ready(Err(_))) {
            self.shared.connection_closed(self.id);
        }
        result
    }
}

impl AsyncWrite for RecordingIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note(result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note(result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.note(result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Drop for RecordingIo {
    fn drop(&mut self) {
        self.shared.connection_closed(self.id);
    }
}

/// A running fake provider. Dropping it (or [`FakeUpstream::shutdown`]) stops it.
pub struct FakeUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    cancel: CancellationToken,
}

impl FakeUpstream {
    /// Binds `addr` (port 0 picks a free port), spawns the accept loop and returns at once.
    pub async fn start(addr: SocketAddr) -> io::Result<FakeUpstream> {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        // A deep backlog so benchmarks opening thousands of connections at once don't hit SYN
        // retransmits (the kernel caps it at somaxconn anyway).
        let listener = socket.listen(4096)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            records: Mutex::new(Records::default()),
            changed: watch::Sender::new(()),
            next_reply_id: AtomicU64::new(1),
            script_defaults: Mutex::new(HeaderMap::new()),
            replay: Mutex::new(None),
        });
        let cancel = CancellationToken::new();
        tokio::spawn(accept_loop(listener, shared.clone(), cancel.clone()));
        Ok(FakeUpstream {
            addr,
            shared,
            cancel,
        })
    }

    /// Sets `x-fake-*` headers this instance behaves by whenever a request does not send
    /// them (a request's own headers win).
    pub fn set_script(&self, headers: &[(&str, &str)]) {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            if let (Ok(k), Ok(v)) = (
                http::header::HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                map.insert(k, v);
            }
        }
        *self
            .shared
            .script_defaults
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = map;
    }

    /// Answers every `POST` with `replay` (or, with `None`, generates answers again).
    pub fn set_replay(&self, replay: Option<Replay>) {
        *self
            .shared
            .replay
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = replay;
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:PORT` (an unspecified bind address becomes 127.0.0.1).
    pub fn url(&self) -> String {
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(Ipv4Addr::LOCALHOST.into());
        }
        format!("http://{addr}")
    }

    /// All connections accepted so far, in order.
    pub fn connections(&self) -> Vec<ConnectionRecord> {
        self.shared.lock().connections.clone()
    }

    /// All requests received so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.lock().requests.clone()
    }

    /// Number of connections not yet seen closed.
    pub fn open_connections(&self) -> usize {
        count_open(&self.shared.lock())
    }

    /// Waits until at least `n` requests were recorded; false on timeout.
    pub async fn wait_for_requests(&self, n: usize, timeout: Duration) -> bool {
        let ready = |r: &Records| (r.requests.len() >= n).then_some(());
        self.shared.wait_until(timeout, ready).await.is_some()
    }

    /// Waits until exactly `n` connections are open; false on timeout.
    pub async fn wait_open_connections(&self, n: usize, timeout: Duration) -> bool {
        let ready = |r: &Records| (count_open(r) == n).then_some(());
        self.shared.wait_until(timeout, ready).await.is_some()
    }

    /// Waits until connection `conn_id` is seen closed and returns when that happened.
    pub async fn wait_closed(&self, conn_id: u64, timeout: Duration) -> Option<Instant> {
        let index = usize::try_from(conn_id).ok()?;
        let closed = |r: &Records| r.connections.get(index).and_then(|c| c.closed_at);
        self.shared.wait_until(timeout, closed).await
    }

    /// Waits until request number `index` (0-based, as in [`FakeUpstream::requests`]) has
    /// finished, normally or not, and returns its record.
    pub async fn wait_request_finished(
        &self,
        index: usize,
        timeout: Duration,
    ) -> Option<RequestRecord> {
        let finished = |r: &Records| {
            r.requests
                .get(index)
                .filter(|q| q.finished_at.is_some())
                .cloned()
        };
        self.shared.wait_until(timeout, finished).await
    }

    /// Stops accepting and closes every open connection (like the provider process dying).
    pub fn shutdown(&self) {
        self.cancel.cancel();
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn count_open(records: &Records) -> usize {
    records
        .connections
        .iter()
        .filter(|c| c.closed_at.is_none())
        .count()
}

/// Runs a fake provider on `addr` until ctrl-c (the `fake-upstream` command).
pub async fn run(addr: SocketAddr) -> io::Result<()> {
    let fake = FakeUpstream::start(addr).await?;
    tracing::info!("fake upstream listening on http://{}", fake.addr());
    tokio::signal::ctrl_c().await?;
    fake.shutdown();
    Ok(())
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, cancel: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // EMFILE and friends: back off briefly instead of spinning on the error.
                tracing::warn!(%error, "fake upstream accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "fake upstream could not set TCP_NODELAY");
        }
        let opened_at = Instant::now();
        let id = shared.update(|records| {
            let id = records.connections.len() as u64;
            let closed_at = None;
            records.connections.push(ConnectionRecord {
                id,
                peer,
                opened_at,
                closed_at,
            });
            id
        });
        let io = RecordingIo {
            inner: stream,
            shared: shared.clone(),
            id,
        };
        tokio::spawn(serve_connection(io, shared.clone(), cancel.clone()));
    }
}

async fn serve_connection(io: RecordingIo, shared: Arc<Shared>, cancel: CancellationToken) {
    let id = io.id;
    let service = service_fn(move |request| handle(shared.clone(), id, request));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's default of 200 streams per connection is too few for h2 benchmarks.
    builder.http2().max_concurrent_streams(10_000);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::select! {
        result = connection => {
            if let Err(error) = result {
                tracing::debug!(conn = id, %error, "fake upstream connection ended with an error");
            }
        }
        // Dropping the connection future drops the socket, which records the close.
        () = cancel.cancelled() => {}
    }
}

async fn handle(
    shared: Arc<Shared>,
    conn_id: u64,
    request: Request<Incoming>,
) -> Result<Response<ScriptBody>, io::Error> {
    let at = Instant::now();
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map_err(io::Error::other)?.to_bytes();
    let index = shared.update(|records| {
        records.requests.push(RequestRecord {
            conn_id,
            at,
            method: parts.method.clone(),
            path: parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned(),
            headers: parts.headers.clone(),
            body: body.clone(),
            version: parts.version,
            finished_at: None,
            completed: false,
        });
        records.requests.len() - 1
    });
    let finisher = Finisher {
        shared: shared.clone(),
        index,
        done: false,
    };
    let mut response = respond(&shared, &parts, &body, finisher).await;
    if let Some(id) = parts.headers.get("x-request-id") {
        response.headers_mut().insert("x-request-id", id.clone());
    }
    Ok(response)
}

async fn respond(
    shared: &Shared,
    parts: &Parts,
    body: &Bytes,
    finisher: Finisher,
) -> Response<ScriptBody> {
    let mut headers = shared
        .script_defaults
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    for (k, v) in &parts.headers {
        headers.insert(k, v.clone());
    }
    let script = match Script::from_headers(&headers) {
        Ok(script) => script,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message, finisher),
    };
    if let Some(status) = script.status {
        pause(script.ttft).await;
        return error_response(status, "status injected by x-fake-status", finisher);
    }
    let replay = shared
        .replay
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    if let Some(replay) = replay.filter(|_| parts.method == Method::POST) {
        let mut script = script;
        script.interval = replay.interval;
        script.keepalive = None;
        let reply = Reply {
            chunks: replay.events.len(),
            shape: Shape::Replay(replay.events),
            ..Reply::full(Bytes::new())
        };
        let mut first_delay = script.ttft;
        if !script.headers_first {
            pause(std::mem::take(&mut first_delay)).await;
        }
        let mut response = Response::new(ScriptBody::new(reply, script, first_delay, finisher));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(replay.content_type));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return response;
    }
    let shape = match (&parts.method, parts.uri.path()) {
        (&Method::GET, "/v1/models") => {
            let models = json!({"object": "list", "data": [
                {"id": "fake-model", "object": "model", "created": 0, "owned_by": "hourglass"},
                {"id": "fake-model-large", "object": "model", "created": 0, "owned_by": "hourglass"},
            ]});
            return full_response(StatusCode::OK, models.to_string(), finisher);
        }
        (&Method::POST, "/v1/chat/completions") => Shape::OpenAi,
        (&Method::POST, "/v1/messages") => Shape::Anthropic,
        (&Method::POST, "/v1/responses") => Shape::Responses,
        (method, path) => {
            let message = format!("no route for {method} {path}");
            return error_response(StatusCode::NOT_FOUND, &message, finisher);
        }
    };
    let request: Value = match serde_json::from_slice(body) {
        Ok(value @ Value::Object(_)) => value,
        Ok(_) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "body is not a JSON object",
                finisher,
            )
        }
        Err(error) => {
            let message = format!("invalid JSON body: {error}");
            return error_response(StatusCode::BAD_REQUEST, &message, finisher);
        }
    };
    let field = |name: &str| request.get(name).cloned().unwrap_or(Value::Null);
    let stream = field("stream") == Value::Bool(true);
    let model = field("model").as_str().unwrap_or("fake-model").to_owned();
    // What a Responses `response` object repeats of its request.
    let echo = match shape {
        Shape::Responses => {
            let echoed = [
                "instructions",
                "max_output_tokens",
                "metadata",
                "previous_response_id",
                "store",
                "tool_choice",
                "tools",
            ];
            let fields = echoed
                .iter()
                .filter_map(|&k| Some((k.to_owned(), request.get(k)?.clone())));
            Value::Object(fields.collect())
        }
        _ => Value::Null,
    };
    let created = SystemTime::now().duration_since(UNIX_EPOCH);
    let reply = Reply {
        shape,
        id: shared.next_reply_id.fetch_add(1, Ordering::Relaxed),
        model,
        created: created.map_or(0, |d| d.as_secs()),
        // A rough estimate is enough for usage accounting tests.
        prompt_tokens: (body.len() / 4).max(1),
        chunks: script.chunks,
        tool: script.tool_call.clone(),
        echo,
    };
    let mut script = script;
    let (reply, content_type) = if stream {
        (reply, "text/event-stream")
    } else {
        // A single event with the whole answer, which a keep-alive would corrupt.
        script.keepalive = None;
        (Reply::full(reply.whole()), "application/json")
    };
    let mut first_delay = script.ttft;
    if !script.headers_first {
        // The head is only handed to hyper after the wait, so it leaves with the first event.
        pause(std::mem::take(&mut first_delay)).await;
    }
    let mut response = Response::new(ScriptBody::new(reply, script, first_delay, finisher));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

fn full_response(status: StatusCode, text: String, finisher: Finisher) -> Response<ScriptBody> {
    let body = ScriptBody::new(
        Reply::full(text),
        Script::default(),
        Duration::ZERO,
        finisher,
    );
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error_response(status: StatusCode, message: &str, finisher: Finisher) -> Response<ScriptBody> {
    let kind = match status.as_u16() {
        400 | 404 | 422 => "invalid_request_error",
        401 | 403 => "authentication_error",
        429 => "rate_limit_error",
        500..=599 => "server_error",
        _ => "api_error",
    };
    let error = json!({"error": {"message": message, "type": kind, "param": null, "code": null}});
    full_response(status, error.to_string(), finisher)
}

/// The per-request script, parsed from `x-fake-*` headers; `default()` is "no script at all".
#[derive(Default)]
struct Script {
    ttft: Duration,
    headers_first: bool,
    chunks: usize,
    interval: Duration,
    freeze_after: Option<usize>,
    disconnect_after: Option<usize>,
    status: Option<StatusCode>,
    keepalive: Option<Duration>,
    keepalive_ping: bool,
    timestamps: bool,
    tool_call: Option<String>,
}

impl Script {
    fn from_headers(headers: &HeaderMap) -> Result<Script, String> {
        let number = |name: &str| -> Result<Option<u64>, String> {
            let Some(value) = headers.get(name) else {
                return Ok(None);
            };
            let parsed = value.to_str().ok().and_then(|s| s.trim().parse().ok());
            parsed.map(Some).ok_or_else(|| invalid(name, value))
        };
        let count = |name: &str| -> Result<Option<usize>, String> {
            number(name)?
                .map(|n| usize::try_from(n).map_err(|_| format!("{name} is too large")))
                .transpose()
        };
        let flag = |name: &str| match headers.get(name).map(HeaderValue::as_bytes) {
            None | Some(b"0" | b"false") => Ok(false),
            Some(b"1" | b"true") => Ok(true),
            Some(_) => Err(invalid(name, &headers[name])),
        };
        let status = match number("x-fake-status")? {
            None => None,
            Some(code) => Some(
                u16::try_from(code)
                    .ok()
                    .filter(|code| (200..=599).contains(code))
                    .and_then(|code| StatusCode::from_u16(code).ok())
                    .ok_or_else(|| invalid("x-fake-status", &headers["x-fake-status"]))?,
            ),
        };
        let keepalive_ping = match headers
            .get("x-fake-keepalive-kind")
            .map(HeaderValue::as_bytes)
        {
            None | Some(b"comment") => false,
            Some(b"ping") => true,
            Some(_) => {
                return Err(invalid(
                    "x-fake-keepalive-kind",
                    &headers["x-fake-keepalive-kind"],
                ))
            }
        };
        // A function name as the APIs accept one.
        let tool_call = match headers.get("x-fake-tool-call") {
            None => None,
            Some(v) => {
                let name = v.to_str().ok().filter(|n| {
                    (1..=64).contains(&n.len())
                        && n.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                });
                Some(
                    name.ok_or_else(|| invalid("x-fake-tool-call", v))?
                        .to_owned(),
                )
            }
        };
        Ok(Script {
            tool_call,
            ttft: Duration::from_millis(number("x-fake-ttft-ms")?.unwrap_or(0)),
            headers_first: flag("x-fake-headers-first")?,
            chunks: count("x-fake-chunks")?.unwrap_or(5),
            interval: Duration::from_millis(number("x-fake-interval-ms")?.unwrap_or(20)),
            freeze_after: count("x-fake-freeze-after")?,
            disconnect_after: count("x-fake-disconnect-after")?,
            status,
            // 0 would mean a keep-alive storm; treat it as "off".
            keepalive: number("x-fake-keepalive-ms")?
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis),
            keepalive_ping,
            timestamps: flag("x-fake-timestamps")?,
        })
    }
}

fn invalid(name: &str, value: &HeaderValue) -> String {
    format!(
        "invalid value for {name}: {:?}",
        String::from_utf8_lossy(value.as_bytes())
    )
}

enum Shape {
    OpenAi,
    Anthropic,
    /// The OpenAI Responses API (`POST /v1/responses`).
    Responses,
    Full(Bytes),
    /// Recorded events, every one a content event.
    Replay(Arc<[Bytes]>),
}

/// What one response says. Events are rendered lazily, one at a time, so a long or frozen stream
/// costs a few words of memory rather than a queue of prepared JSON.
struct Reply {
    shape: Shape,
    id: u64,
    model: String,
    created: u64,
    prompt_tokens: usize,
    chunks: usize,
    /// `x-fake-tool-call`: the answer is a call of this function, whose arguments the content
    /// events stream, instead of text.
    tool: Option<String>,
    /// Responses API: the request fields a `response` object echoes (`instructions`,
    /// `max_output_tokens`, `tools`, ...).
    echo: Value,
}

/// Where an event sits in the stream.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Framing,
    Content(usize),
    /// Closing events that follow the interval (the finish chunk, `content_block_stop`).
    Closing,
}

impl Reply {
    fn full(text: impl Into<Bytes>) -> Reply {
        let shape = Shape::Full(text.into());
        Reply {
            shape,
            id: 0,
            model: String::new(),
            created: 0,
            prompt_tokens: 0,
            chunks: 0,
            tool: None,
            echo: Value::Null,
        }
    }

    fn len(&self) -> usize {
        match self.shape {
            Shape::OpenAi => self.chunks + 3,
            Shape::Anthropic => self.chunks + 6,
            // created, in_progress, item added, (part added,) N deltas, (text done, part
            // done,) or arguments done, item done, completed.
            Shape::Responses if self.tool.is_some() => self.chunks + 6,
            Shape::Responses => self.chunks + 8,
            Shape::Full(_) => 1,
            Shape::Replay(ref events) => events.len(),
        }
    }

    /// Leading framing events before the first content event.
    fn preamble(&self) -> usize {
        match self.shape {
            Shape::OpenAi => 1,
            Shape::Anthropic => 3,
            Shape::Responses if self.tool.is_some() => 3,
            Shape::Responses => 4,
            Shape::Full(_) => usize::MAX,
            Shape::Replay(_) => 0,
        }
    }

    fn kind(&self, i: usize) -> Kind {
        match i.checked_sub(self.preamble()) {
            Some(n) if n < self.chunks => Kind::Content(n + 1),
            Some(n) if n == self.chunks => Kind::Closing,
            _ => Kind::Framing,
        }
    }

    fn text(&self) -> String {
        (1..=self.chunks).map(|n| format!("tok{n} ")).collect()
    }

    /// The arguments of a scripted tool call, whole: `{"text":"tok1 tok2 "}`.
    fn arguments(&self) -> String {
        json!({"text": self.text()}).to_string()
    }

    /// The piece of [`Reply::arguments`] content event `n` (from 1) streams: the pieces of all
    /// `chunks` events join into the whole.
    fn arguments_piece(&self, n: usize) -> String {
        let mut piece = String::new();
        if n == 1 {
            piece.push_str("{\"text\":\"");
        }
        piece.push_str(&format!("tok{n} "));
        if n == self.chunks {
            piece.push_str("\"}");
        }
        piece
    }

    fn tool_name(&self) -> &str {
        self.tool.as_deref().unwrap_or_default()
    }

    fn usage(&self) -> Value {
        let (prompt, completion) = (self.prompt_tokens, self.chunks);
        json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
    }

    fn openai_chunk(&self, delta: Value, finish: Value) -> Value {
        json!({"id": format!("chatcmpl-fake-{}", self.id), "object": "chat.completion.chunk",
            "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    }

    fn openai_finish(&self) -> Value {
        json!(if self.tool.is_some() {
            "tool_calls"
        } else {
            "stop"
        })
    }

    fn anthropic_message(&self, content: Value, stop: Value, output_tokens: usize) -> Value {
        json!({"id": format!("msg_fake_{}", self.id), "type": "message", "role": "assistant",
            "model": self.model, "content": content, "stop_reason": stop, "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": output_tokens}})
    }

    fn anthropic_stop(&self) -> Value {
        json!(if self.tool.is_some() {
            "tool_use"
        } else {
            "end_turn"
        })
    }

    /// A Responses `response` object, as `response.created`, `response.completed` and the
    /// non-streaming answer carry it.
    fn response_object(&self, completed: bool) -> Value {
        let (status, output, usage, completed_at) = if completed {
            let (prompt, completion) = (self.prompt_tokens, self.chunks);
            let usage = json!({"input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion});
            (
                "completed",
                json!([self.output_item(true)]),
                usage,
                json!(self.created),
            )
        } else {
            ("in_progress", json!([]), Value::Null, Value::Null)
        };
        let echo = |name: &str, default: Value| self.echo.get(name).cloned().unwrap_or(default);
        json!({"id": format!("resp_fake_{}", self.id), "object": "response",
            "created_at": self.created, "status": status, "background": false,
            "completed_at": completed_at, "error": null, "incomplete_details": null,
            "instructions": echo("instructions", Value::Null),
            "max_output_tokens": echo("max_output_tokens", Value::Null), "max_tool_calls": null,
            "model": self.model, "output": output, "parallel_tool_calls": true,
            "previous_response_id": echo("previous_response_id", Value::Null),
            "reasoning": {"effort": null, "summary": null}, "service_tier": "default",
            "store": echo("store", json!(true)), "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": echo("tool_choice", json!("auto")), "tools": echo("tools", json!([])),
            "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled", "usage": usage,
            "user": null, "metadata": echo("metadata", json!({}))})
    }

    fn item_id(&self) -> String {
        match self.tool {
            Some(_) => format!("fc_fake_{}", self.id),
            None => format!("msg_fake_{}", self.id),
        }
    }

    /// The one output item: the assistant message, or the function call.
    fn output_item(&self, done: bool) -> Value {
        let status = if done { "completed" } else { "in_progress" };
        match self.tool {
            Some(_) => json!({"id": self.item_id(), "type": "function_call", "status": status,
                "arguments": if done { self.arguments() } else { String::new() },
                "call_id": format!("call_fake_{}", self.id), "name": self.tool_name()}),
            None => {
                let content = if done {
                    json!([self.output_text(&self.text())])
                } else {
                    json!([])
                };
                json!({"id": self.item_id(), "type": "message", "status": status,
                    "content": content, "role": "assistant"})
            }
        }
    }

    fn output_text(&self, text: &str) -> Value {
        json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text})
    }

    /// Responses event `i`: its `type` and data (`sequence_number` is the event's index).
    fn responses_event(&self, i: usize, kind: Kind) -> (&'static str, Value) {
        let item = self.item_id();
        let (ty, mut data) = match (kind, &self.tool) {
            (Kind::Content(n), Some(_)) => (
                "response.function_call_arguments.delta",
                json!({"item_id": item, "output_index": 0, "delta": self.arguments_piece(n)}),
            ),
            (Kind::Content(n), None) => (
                "response.output_text.delta",
                json!({"item_id": item, "output_index": 0, "content_index": 0,
                    "delta": format!("tok{n} "), "logprobs": []}),
            ),
            (Kind::Closing, Some(_)) => (
                "response.function_call_arguments.done",
                json!({"item_id": item, "output_index": 0, "arguments": self.arguments()}),
            ),
            (Kind::Closing, None) => (
                "response.output_text.done",
                json!({"item_id": item, "output_index": 0, "content_index": 0,
                    "text": self.text(), "logprobs": []}),
            ),
            (Kind::Framing, _) if i < 2 => {
                let ty = ["response.created", "response.in_progress"][i];
                (ty, json!({"response": self.response_object(false)}))
            }
            (Kind::Framing, _) if i == 2 => (
                "response.output_item.added",
                json!({"output_index": 0, "item": self.output_item(false)}),
            ),
            (Kind::Framing, None) if i == 3 => (
                "response.content_part.added",
                json!({"item_id": item, "output_index": 0, "content_index": 0,
                    "part": self.output_text("")}),
            ),
            (Kind::Framing, _) if i + 1 == self.len() => (
                "response.completed",
                json!({"response": self.response_object(true)}),
            ),
            (Kind::Framing, _) if i + 2 == self.len() => (
                "response.output_item.done",
                json!({"output_index": 0, "item": self.output_item(true)}),
            ),
            (Kind::Framing, _) => (
                "response.content_part.done",
                json!({"item_id": item, "output_index": 0, "content_index": 0,
                    "part": self.output_text(&self.text())}),
            ),
        };
        data["type"] = ty.into();
        data["sequence_number"] = i.into();
        (ty, data)
    }

    /// The non-stream answer.
    fn whole(&self) -> String {
        let text = self.text();
        let value = match (&self.shape, &self.tool) {
            (Shape::Responses, _) => self.response_object(true),
            (Shape::Anthropic, Some(name)) => self.anthropic_message(
                json!([{"type": "tool_use", "id": format!("toolu_fake_{}", self.id),
                    "name": name, "input": {"text": text}}]),
                self.anthropic_stop(),
                self.chunks,
            ),
            (Shape::Anthropic, None) => self.anthropic_message(
                json!([{"type": "text", "text": text}]),
                self.anthropic_stop(),
                self.chunks,
            ),
            (_, tool) => {
                let message = match tool {
                    Some(name) => json!({"role": "assistant", "content": null,
                        "tool_calls": [{"id": format!("call_fake_{}", self.id), "type": "function",
                            "function": {"name": name, "arguments": self.arguments()}}]}),
                    None => json!({"role": "assistant", "content": text}),
                };
                json!({"id": format!("chatcmpl-fake-{}", self.id), "object": "chat.completion",
                    "created": self.created, "model": self.model,
                    "choices": [{"index": 0, "message": message, "finish_reason": self.openai_finish()}],
                    "usage": self.usage()})
            }
        };
        value.to_string()
    }

    /// Renders event `i`, stamping content events with the send time when asked.
    fn render(&self, i: usize, stamp: bool) -> Bytes {
        let kind = self.kind(i);
        let tool = self.tool.is_some();
        let (event, mut data) = match (&self.shape, kind) {
            (Shape::Full(bytes), _) => return bytes.clone(),
            (Shape::Replay(events), _) => return events[i].clone(),
            (Shape::Responses, kind) => {
                let (ty, data) = self.responses_event(i, kind);
                (Some(ty), data)
            }
            (Shape::OpenAi, Kind::Content(n)) => {
                let delta = if tool {
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": self.arguments_piece(n)}}]})
                } else {
                    json!({"content": format!("tok{n} ")})
                };
                (None, self.openai_chunk(delta, Value::Null))
            }
            (Shape::OpenAi, Kind::Closing) => {
                let mut chunk = self.openai_chunk(json!({}), self.openai_finish());
                chunk["usage"] = self.usage();
                (None, chunk)
            }
            (Shape::OpenAi, Kind::Framing) if i == 0 => {
                let delta = if tool {
                    json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0,
                        "id": format!("call_fake_{}", self.id), "type": "function",
                        "function": {"name": self.tool_name(), "arguments": ""}}]})
                } else {
                    json!({"role": "assistant", "content": ""})
                };
                (None, self.openai_chunk(delta, Value::Null))
            }
            (Shape::OpenAi, Kind::Framing) => return Bytes::from_static(b"data: [DONE]\n\n"),
            (Shape::Anthropic, Kind::Content(n)) => {
                let delta = if tool {
                    json!({"type": "input_json_delta", "partial_json": self.arguments_piece(n)})
                } else {
                    json!({"type": "text_delta", "text": format!("tok{n} ")})
                };
                (
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": 0, "delta": delta}),
                )
            }
            (Shape::Anthropic, Kind::Closing) => (
                Some("content_block_stop"),
                json!({"type": "content_block_stop", "index": 0}),
            ),
            (Shape::Anthropic, Kind::Framing) => {
                let (name, value) = match i {
                    0 => (
                        "message_start",
                        json!({"type": "message_start", "message": self.anthropic_message(json!([]), Value::Null, 1)}),
                    ),
                    1 => {
                        let block = if tool {
                            json!({"type": "tool_use", "id": format!("toolu_fake_{}", self.id),
                                "name": self.tool_name(), "input": {}})
                        } else {
                            json!({"type": "text", "text": ""})
                        };
                        (
                            "content_block_start",
                            json!({"type": "content_block_start", "index": 0, "content_block": block}),
                        )
                    }
                    2 => ("ping", json!({"type": "ping"})),
                    _ if i + 1 < self.len() => (
                        "message_delta",
                        json!({"type": "message_delta", "delta": {"stop_reason": self.anthropic_stop(), "stop_sequence": null}, "usage": {"output_tokens": self.chunks}}),
                    ),
                    _ => ("message_stop", json!({"type": "message_stop"})),
                };
                (Some(name), value)
            }
        };
        if stamp && matches!(kind, Kind::Content(_)) {
            data["x_fake_sent_ns"] = monotonic_ns().into();
        }
        let data = data.to_string();
        Bytes::from(match event {
            Some(event) => format!("event: {event}\ndata: {data}\n\n"),
            None => format!("data: {data}\n\n"),
        })
    }
}

/// The response body: a state machine driven by hyper's polling, so a stream costs no task of
/// its own and everything (timer included) ends when hyper drops it.
struct ScriptBody {
    reply: Reply,
    script: Script,
    next: usize,
    content_sent: usize,
    /// When the next event is due.
    due: Instant,
    /// Last write of any kind, for spacing keep-alives.
    last_write: Instant,
    sleep: Pin<Box<Sleep>>,
    finisher: Finisher,
}

impl ScriptBody {
    fn new(reply: Reply, script: Script, first_delay: Duration, finisher: Finisher) -> ScriptBody {
        let now = Instant::now();
        let due = now + first_delay;
        let sleep = Box::pin(tokio::time::sleep_until(due));
        let (next, content_sent, last_write) = (0, 0, now);
        ScriptBody {
            reply,
            script,
            next,
            content_sent,
            due,
            last_write,
            sleep,
            finisher,
        }
    }

    fn keepalive_frame(&self) -> Bytes {
        Bytes::from_static(if self.script.keepalive_ping {
            b"event: ping\ndata: {\"type\":\"ping\"}\n\n"
        } else {
            b": keep-alive\n\n"
        })
    }
}

impl Body for ScriptBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        loop {
            if this.next >= this.reply.len() {
                this.finisher.finish(true);
                return Poll::Ready(None);
            }
            let now = Instant::now();
            let script = &this.script;
            let frozen = script.freeze_after.is_some_and(|n| this.content_sent >= n);
            if !frozen && this.due <= now {
                if script
                    .disconnect_after
                    .is_some_and(|n| this.content_sent >= n)
                {
                    this.next = usize::MAX;
                    this.finisher.finish(false);
                    let error =
                        io::Error::new(io::ErrorKind::ConnectionAborted, "x-fake-disconnect-after");
                    return Poll::Ready(Some(Err(error)));
                }
                let kind = this.reply.kind(this.next);
                let bytes = this.reply.render(this.next, script.timestamps);
                this.next += 1;
                if this.next >= this.reply.len() {
                    // hyper stops polling once `is_end_stream` says so, so finish here.
                    this.finisher.finish(true);
                }
                if let Kind::Content(_) = kind {
                    this.content_sent += 1;
                }
                let gap = matches!(this.reply.kind(this.next), Kind::Content(_) | Kind::Closing);
                this.due = now + if gap { script.interval } else { Duration::ZERO };
                this.last_write = now;
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            let keepalive_due = script.keepalive.map(|every| this.last_write + every);
            if keepalive_due.is_some_and(|due| due <= now) {
                this.last_write = now;
                return Poll::Ready(Some(Ok(Frame::data(this.keepalive_frame()))));
            }
            let wake = match (frozen, keepalive_due) {
                (false, Some(keepalive)) => keepalive.min(this.due),
                (false, None) => this.due,
                (true, Some(keepalive)) => keepalive,
                // Frozen for good: nothing will wake us, and hyper drops us when the peer leaves.
                (true, None) => return Poll::Pending,
            };
            if this.sleep.deadline() != wake {
                this.sleep.as_mut().reset(wake);
            }
            if this.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.next >= self.reply.len()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.reply.shape {
            Shape::Full(bytes) if self.next == 0 => SizeHint::with_exact(bytes.len() as u64),
            _ => SizeHint::default(),
        }
    }
}

/// `sleep(0)` still waits for the timer's next millisecond tick: a ttft of 0 must not.
async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

/// Guard for [`never_accepting_listener`]: keeps the listener and the sockets that fill its
/// accept queue alive. Dropping it frees the port.
pub struct NeverAccept {
    _listener: socket2::Socket,
    _fillers: Vec<socket2::Socket>,
}

/// A loopback listener that never accepts and whose backlog is full, so a TCP connect to it hangs
/// (for connect-timeout tests). Keep the returned guard alive while testing.
///
/// Linux drops SYNs to a listener whose accept queue is full, so the client keeps
/// retransmitting and its connect only fails by timeout. Blocks for up to ~100 ms while probing.
pub fn never_accepting_listener() -> io::Result<(NeverAccept, SocketAddr)> {
    use socket2::{Domain, Protocol, Socket, Type};
    let new_socket = || Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP));
    let listener = new_socket()?;
    listener.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())?;
    listener.listen(0)?;
    let addr = listener
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("listener has no inet address"))?;
    let mut fillers = Vec::new();
    // Loopback handshakes complete within the connect call, so a probe that is still pending
    // after 100 ms means the queue is full (backlog 0 usually holds exactly one connection).
    for _ in 0..64 {
        let filler = new_socket()?;
        let probe = filler.connect_timeout(&addr.into(), Duration::from_millis(100));
        fillers.push(filler);
        match probe {
            Ok(()) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
                ) =>
            {
                return Ok((
                    NeverAccept {
                        _listener: listener,
                        _fillers: fillers,
                    },
                    addr,
                ));
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("the accept queue never filled up"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::client::legacy::Client;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

    #[tokio::test]
    async fn openai_stream_shape() {
        let fake = fake().await;
        let headers = [
            ("x-fake-chunks", "3"),
            ("x-fake-interval-ms", "1"),
            ("x-request-id", "req-7"),
        ];
        let response = h1()
            .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
        assert_eq!(response.headers()["x-request-id"], "req-7");
        let events = parse_sse(&text_of(response).await);
        assert_eq!(events.len(), 6, "{events:?}");
        assert!(events.iter().all(|e| e.event.is_none() && !e.comment));
        let role = json_of(&events[0]);
        assert_eq!(role["object"], "chat.completion.chunk");
        assert_eq!(role["model"], "gpt-test");
        assert!(role["id"].as_str().unwrap().starts_with("chatcmpl-fake-"));
        assert!(role["created"].as_u64().unwrap() > 1_600_000_000);
        assert_eq!(
            role["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        assert_eq!(role["choices"][0]["finish_reason"], Value::Null);
        for (n, event) in events[1..4].iter().enumerate() {
            let chunk = json_of(event);
            assert_eq!(
                chunk["choices"][0]["delta"],
                json!({"content": format!("tok{} ", n + 1)})
            );
            assert_eq!(chunk["id"], role["id"]);
            assert!(chunk.get("x_fake_sent_ns").is_none());
        }
        let last = json_of(&events[4]);
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        assert_eq!(last["usage"]["completion_tokens"], 3);
        assert_eq!(events[5].data, "[DONE]");
        let request = fake.wait_request_finished(0, PATIENCE).await.unwrap();
        assert!(request.completed);
    }

    #[tokio::test]
    async fn anthropic_stream_shape() {
        let fake = fake().await;
        let headers = [("x-fake-chunks", "2"), ("x-fake-interval-ms", "1")];
        let response = h1()
            .request(post(&fake, "/v1/messages", MESSAGES, &headers))
            .await
            .unwrap();
        assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
        let events = parse_sse(&text_of(response).await);
        let names: Vec<_> = events.iter().map(|e| e.event.clone().unwrap()).collect();
        let expected = [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ];
        assert_eq!(names, expected);
        for event in &events {
            assert_eq!(json_of(event)["type"], event.event.as_deref().unwrap());
        }
        assert_eq!(json_of(&events[0])["message"]["model"], "claude-test");
        assert_eq!(
            json_of(&events[4])["delta"],
            json!({"type": "text_delta", "text": "tok2 "})
        );
        assert_eq!(json_of(&events[6])["delta"]["stop_reason"], "end_turn");
        assert_eq!(json_of(&events[6])["usage"]["output_tokens"], 2);
    }

    const RESPONSES: &str = r#"{"model":"gpt-test","stream":true,"input":"hi","instructions":"be brief","tools":[{"type":"function","name":"get_weather","parameters":{}}]}"#;
    const RESPONSES_FULL: &str = r#"{"model":"gpt-test","input":"hi"}"#;

    /// The Responses stream as OpenAI sends it: every event named by its `type`, numbered in
    /// order, the text's deltas between the message item's and content part's added/done
    /// events, and `response.completed` with the whole response and its usage.
    #[tokio::test]
    async fn responses_stream_shape() {
        let fake = fake().await;
        let headers = [("x-fake-chunks", "3"), ("x-fake-interval-ms", "1")];
        let response = h1()
            .request(post(&fake, "/v1/responses", RESPONSES, &headers))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
        let events = parse_sse(&text_of(response).await);
        let names: Vec<_> = events.iter().map(|e| e.event.clone().unwrap()).collect();
        let expected = [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ];
        assert_eq!(names, expected);
        for (i, event) in events.iter().enumerate() {
            let data = json_of(event);
            assert_eq!(data["type"], event.event.as_deref().unwrap());
            assert_eq!(data["sequence_number"], i);
        }
        let created = json_of(&events[0])["response"].clone();
        assert_eq!(created["object"], "response");
        assert_eq!(created["status"], "in_progress");
        assert_eq!(created["model"], "gpt-test");
        assert_eq!(created["output"], json!([]));
        assert_eq!(created["instructions"], "be brief");
        assert_eq!(created["tools"][0]["name"], "get_weather");
        let id = created["id"].as_str().unwrap();
        assert!(id.starts_with("resp_fake_"), "{id}");
        let added = json_of(&events[2])["item"].clone();
        assert_eq!(added["type"], "message");
        assert_eq!(added["status"], "in_progress");
        let item_id = added["id"].as_str().unwrap();
        for event in &events[4..7] {
            let delta = json_of(event);
            assert_eq!(delta["item_id"], item_id);
            assert_eq!(delta["output_index"], 0);
            assert_eq!(delta["content_index"], 0);
            assert_eq!(delta["logprobs"], json!([]));
        }
        let deltas: String = events[4..7]
            .iter()
            .map(|e| json_of(e)["delta"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(deltas, "tok1 tok2 tok3 ");
        assert_eq!(json_of(&events[7])["text"], "tok1 tok2 tok3 ");
        assert_eq!(json_of(&events[8])["part"]["text"], "tok1 tok2 tok3 ");
        assert_eq!(json_of(&events[9])["item"]["status"], "completed");
        let done = json_of(&events[10])["response"].clone();
        assert_eq!(done["id"], id);
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"][0]["id"], item_id);
        assert_eq!(
            done["output"][0]["content"][0],
            json!({"type": "output_text", "annotations": [], "logprobs": [], "text": "tok1 tok2 tok3 "})
        );
        assert_eq!(done["usage"]["output_tokens"], 3);
        let input = done["usage"]["input_tokens"].as_u64().unwrap();
        assert!(input >= 1);
        assert_eq!(done["usage"]["total_tokens"], input + 3);
        assert_eq!(
            done["usage"]["output_tokens_details"]["reasoning_tokens"],
            0
        );
        let request = fake.wait_request_finished(0, SECOND).await.unwrap();
        assert!(request.completed);
    }

    /// `x-fake-tool-call` in all three APIs: the arguments stream in the content events, and
    /// their pieces join into the whole, which the closing events and the plain answers carry.
    #[tokio::test]
    async fn tool_calls_stream_their_arguments() {
        let fake = fake().await;
        let client = h1();
        let headers = [
            ("x-fake-chunks", "3"),
            ("x-fake-interval-ms", "1"),
            ("x-fake-tool-call", "get_weather"),
        ];
        let whole = r#"{"text":"tok1 tok2 tok3 "}"#;

        let response = client
            .request(post(&fake, "/v1/responses", RESPONSES, &headers))
            .await
            .unwrap();
        let events = parse_sse(&text_of(response).await);
        let names: Vec<_> = events.iter().map(|e| e.event.clone().unwrap()).collect();
        let expected = [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ];
        assert_eq!(names, expected);
        let item = json_of(&events[2])["item"].clone();
        assert_eq!(item["type"], "function_call");
        assert_eq!(item["name"], "get_weather");
        assert_eq!(item["arguments"], "");
        assert!(item["call_id"].as_str().unwrap().starts_with("call_fake_"));
        let pieces: String = events[3..6]
            .iter()
            .map(|e| {
                let d = json_of(e);
                assert_eq!(d["item_id"], item["id"]);
                d["delta"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(pieces, whole);
        assert_eq!(json_of(&events[6])["arguments"], whole);
        let done = json_of(&events[8])["response"].clone();
        assert_eq!(done["output"][0]["arguments"], whole);
        assert_eq!(done["output"][0]["status"], "completed");
        for (i, event) in events.iter().enumerate() {
            assert_eq!(json_of(event)["sequence_number"], i);
        }

        let response = client
            .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
            .await
            .unwrap();
        let events = parse_sse(&text_of(response).await);
        let first = json_of(&events[0])["choices"][0]["delta"].clone();
        assert_eq!(first["tool_calls"][0]["function"]["name"], "get_weather");
        assert_eq!(first["tool_calls"][0]["type"], "function");
        let pieces: String = events[1..4]
            .iter()
            .map(|e| {
                let d = json_of(e)["choices"][0]["delta"].clone();
                d["tool_calls"][0]["function"]["arguments"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(pieces, whole);
        assert_eq!(
            json_of(&events[4])["choices"][0]["finish_reason"],
            "tool_calls"
        );

        let response = client
            .request(post(&fake, "/v1/messages", MESSAGES, &headers))
            .await
            .unwrap();
        let events = parse_sse(&text_of(response).await);
        let block = json_of(&events[1])["content_block"].clone();
        assert_eq!(block["type"], "tool_use");
        assert_eq!(block["name"], "get_weather");
        let pieces: String = events[3..6]
            .iter()
            .map(|e| {
                let d = json_of(e)["delta"].clone();
                assert_eq!(d["type"], "input_json_delta");
                d["partial_json"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(pieces, whole);
        assert_eq!(json_of(&events[7])["delta"]["stop_reason"], "tool_use");

        // Not streamed.
        let plain = |path, body| post(&fake, path, body, &headers);
        let text = text_of(
            client
                .request(plain("/v1/responses", RESPONSES_FULL))
                .await
                .unwrap(),
        )
        .await;
        let r: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(r["output"][0]["type"], "function_call");
        assert_eq!(r["output"][0]["arguments"], whole);
        let text = text_of(
            client
                .request(plain("/v1/chat/completions", CHAT_FULL))
                .await
                .unwrap(),
        )
        .await;
        let c: Value = serde_json::from_str(&text).unwrap();
        let call = &c["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["function"]["arguments"], whole);
        assert_eq!(c["choices"][0]["finish_reason"], "tool_calls");
        let text = text_of(
            client
                .request(plain("/v1/messages", MESSAGES_FULL))
                .await
                .unwrap(),
        )
        .await;
        let m: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(m["content"][0]["input"], json!({"text": "tok1 tok2 tok3 "}));
        assert_eq!(m["stop_reason"], "tool_use");

        // A name the APIs would not take is a script error.
        let bad = [("x-fake-tool-call", "get weather")];
        let response = client
            .request(post(&fake, "/v1/responses", RESPONSES, &bad))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn non_stream_answers() {
        let fake = fake().await;
        let client = h1();
        let chunks = [("x-fake-chunks", "2")];
        let response = client
            .request(post(&fake, "/v1/chat/completions", CHAT_FULL, &chunks))
            .await
            .unwrap();
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        assert!(response
            .headers()
            .contains_key(http::header::CONTENT_LENGTH));
        let chat: Value = serde_json::from_str(&text_of(response).await).unwrap();
        assert_eq!(chat["object"], "chat.completion");
        assert_eq!(chat["choices"][0]["message"]["content"], "tok1 tok2 ");
        assert_eq!(chat["usage"]["completion_tokens"], 2);
        let response = client
            .request(post(&fake, "/v1/messages", MESSAGES_FULL, &chunks))
            .await
            .unwrap();
        let message: Value = serde_json::from_str(&text_of(response).await).unwrap();
        assert_eq!(message["type"], "message");
        assert_eq!(message["content"][0]["text"], "tok1 tok2 ");
        assert_eq!(message["usage"]["output_tokens"], 2);
        let response = client
            .request(post(&fake, "/v1/responses", RESPONSES_FULL, &chunks))
            .await
            .unwrap();
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        let r: Value = serde_json::from_str(&text_of(response).await).unwrap();
        assert_eq!(r["object"], "response");
        assert_eq!(r["status"], "completed");
        assert_eq!(r["model"], "gpt-test");
        assert_eq!(r["output"][0]["type"], "message");
        assert_eq!(r["output"][0]["role"], "assistant");
        assert_eq!(r["output"][0]["content"][0]["text"], "tok1 tok2 ");
        // `output_text` is the SDKs' convenience, not a field on the wire.
        assert!(r.get("output_text").is_none());
        assert_eq!(r["usage"]["output_tokens"], 2);
        assert_eq!(r["tools"], json!([]));
    }

    #[tokio::test]
    async fn models_unknown_routes_and_bad_json() {
        let fake = fake().await;
        let client = h1();
        let models = Request::get(format!("{}/v1/models", fake.url()))
            .body(Full::default())
            .unwrap();
        let response = client.request(models).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let list: Value = serde_json::from_str(&text_of(response).await).unwrap();
        assert_eq!(list["data"][0]["id"], "fake-model");
        let response = client
            .request(post(&fake, "/v2/nothing", "{}", &[]))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
        assert!(error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v2/nothing"));
        let response = client
            .request(post(&fake, "/v1/chat/completions", "{nope", &[]))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error");
    }

    #[tokio::test]
    async fn bad_script_headers_are_rejected_and_unknown_ones_ignored() {
        let fake = fake().await;
        let client = h1();
        for (name, value) in [
            ("x-fake-chunks", "abc"),
            ("x-fake-ttft-ms", "-5"),
            ("x-fake-status", "99"),
            ("x-fake-keepalive-kind", "shout"),
            ("x-fake-headers-first", "maybe"),
        ] {
            let response = client
                .request(post(&fake, "/v1/chat/completions", CHAT, &[(name, value)]))
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{name}");
            let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
            let message = error["error"]["message"].as_str().unwrap();
            assert!(
                message.contains(name) && message.contains(value),
                "{message}"
            );
        }
        let headers = [("x-fake-whatever", "zzz"), ("x-fake-interval-ms", "1")];
        let response = client
            .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn injected_status_after_ttft() {
        let fake = fake().await;
        let started = Instant::now();
        let headers = [("x-fake-status", "503"), ("x-fake-ttft-ms", "150")];
        let response = h1()
            .request(post(&fake, "/v1/messages", MESSAGES, &headers))
            .await
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
        assert_eq!(error["error"]["type"], "server_error");
    }

    #[tokio::test]
    async fn ttft_holds_back_the_head_unless_headers_first() {
        let fake = fake().await;
        let client = h1();
        let ttft = Duration::from_millis(300);
        let started = Instant::now();
        let headers = [("x-fake-ttft-ms", "300"), ("x-fake-interval-ms", "1")];
        let response = client
            .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
            .await
            .unwrap();
        assert!(
            started.elapsed() >= ttft,
            "head after {:?}",
            started.elapsed()
        );
        let mut body = response.into_body();
        let frames = frames_until_quiet(&mut body, SECOND).await;
        // The data follows the head at once (well before a second ttft would have passed).
        assert!(frames[0].0.duration_since(started) < ttft * 2 + SECOND);

        // With the head first: a 1.5 s ttft, so "at once" has a second of room.
        let ttft = Duration::from_millis(1500);
        let started = Instant::now();
        let headers = [
            ("x-fake-ttft-ms", "1500"),
            ("x-fake-headers-first", "true"),
            ("x-fake-interval-ms", "1"),
        ];
        let response = client
            .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
            .await
            .unwrap();
        assert!(
            started.elapsed() < SECOND,
            "head after {:?}",
            started.elapsed()
        );
        let mut body = response.into_body();
        let first = tokio::time::timeout(PATIENCE, body.frame())
            .await
            .expect("the first data within 5 s")
            .unwrap()
            .unwrap()
            .into_data()
            .unwrap();
        assert!(started.elapsed() >= ttft);
        assert!(std::str::from_utf8(&first)
            .unwrap()
            .contains("\"role\":\"assistant\""));
    }

    #[tokio::test]
    async fn freeze_after_holds_the_stream_open() {
        let fake = fake().await;
        let headers = [("x-fake-freeze-after", "2"), ("x-fake-interval-ms", "5")];
        let response = h1()
            .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
            .await
            .unwrap();
        let mut body = response.into_body();
        let text: String = frames_until_quiet(&mut body, Duration::from_millis(300))
            .await
            .into_iter()
            .map(|f| f.1)
            .collect();
        let events = parse_sse(&text);
        assert_eq!(events.len(), 3, "role + 2 tokens, got {events:?}");
        assert!(text.contains("tok2 ") && !text.contains("tok3 ") && !text.contains("[DONE]"));
        assert!(!body.is_end_stream());
        assert_eq!(fake.open_connections(), 1);
        assert!(fake.requests()[0].finished_at.is_none());
    }

    #[tokio::test]
    async fn disconnect_after_breaks_the_body() {
        for (version, client) in [(Version::HTTP_11, h1()), (Version::HTTP_2, h2())] {
            let fake = fake().await;
            let headers = [
                ("x-fake-disconnect-after", "2"),
                ("x-fake-interval-ms", "5"),
            ];
            let response = client
                .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
                .await
                .unwrap();
            let mut body = response.into_body();
            let mut text = String::new();
            let error = loop {
                match body.frame().await {
                    Some(Ok(frame)) => {
                        text += std::str::from_utf8(&frame.into_data().unwrap()).unwrap()
                    }
                    Some(Err(error)) => break error,
                    None => panic!("{version:?}: clean end after {text:?}"),
                }
            };
            assert!(
                text.contains("tok2 ") && !text.contains("tok3 "),
                "{text:?}"
            );
            // HTTP/1: the chunked body stops without its last chunk; h2: RST_STREAM.
            let expected = if version == Version::HTTP_2 {
                "Reset("
            } else {
                "UnexpectedEof"
            };
            assert!(
                format!("{error:?}").contains(expected),
                "{version:?}: {error:?}"
            );
            let request = fake.wait_request_finished(0, PATIENCE).await.unwrap();
            assert!(!request.completed);
            let open_after = usize::from(version == Version::HTTP_2);
            assert!(
                fake.wait_open_connections(open_after, PATIENCE).await,
                "{version:?}"
            );
        }
    }

    #[tokio::test]
    async fn keepalive_comments_during_headers_first_wait() {
        let fake = fake().await;
        let headers = [
            ("x-fake-headers-first", "1"),
            ("x-fake-ttft-ms", "250"),
            ("x-fake-keepalive-ms", "50"),
            ("x-fake-chunks", "1"),
            ("x-fake-interval-ms", "1"),
        ];
        let response = h1()
            .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
            .await
            .unwrap();
        let events = parse_sse(&text_of(response).await);
        let leading = events.iter().take_while(|e| e.comment).count();
        assert!((3..=5).contains(&leading), "{events:?}");
        assert!(
            events.iter().filter(|e| e.comment).count() == leading,
            "no keep-alive once data flows fast"
        );
        assert_eq!(events.last().unwrap().data, "[DONE]");
    }

    #[tokio::test]
    async fn keepalive_pings_while_frozen() {
        let fake = fake().await;
        let headers = [
            ("x-fake-freeze-after", "1"),
            ("x-fake-keepalive-ms", "40"),
            ("x-fake-keepalive-kind", "ping"),
            ("x-fake-interval-ms", "1"),
        ];
        let response = h1()
            .request(post(&fake, "/v1/messages", MESSAGES, &headers))
            .await
            .unwrap();
        let mut body = response.into_body();
        // Read until four pings have come (however slowly a busy machine lets them), then
        // check they were not faster than every 40 ms.
        let started = Instant::now();
        let mut text = String::new();
        let pings = |text: &str| text.matches("event: ping\n").count();
        // The preamble holds a ping of its own, skipped below with the first four events.
        while pings(&text) < 5 || !text.ends_with("\n\n") {
            let frame = tokio::time::timeout(PATIENCE, body.frame())
                .await
                .unwrap_or_else(|_| panic!("not four pings in 5 s: {text:?}"));
            text += std::str::from_utf8(&frame.unwrap().unwrap().into_data().unwrap()).unwrap();
        }
        let events = parse_sse(&text);
        let pings = events
            .iter()
            .skip(4)
            .filter(|e| e.event.as_deref() == Some("ping"))
            .count();
        assert!(pings >= 4, "{events:?}");
        assert!(
            started.elapsed() >= Duration::from_millis(40) * (pings as u32 - 1),
            "{pings} pings in {:?}",
            started.elapsed()
        );
        assert!(text.contains("event: ping\ndata: {\"type\":\"ping\"}\n\n"));
        assert!(!text.contains("tok2 "));
    }

    #[tokio::test]
    async fn timestamps_mark_content_events() {
        let fake = fake().await;
        let headers = [
            ("x-fake-timestamps", "1"),
            ("x-fake-chunks", "3"),
            ("x-fake-interval-ms", "10"),
        ];
        let before = monotonic_ns();
        let response = h1()
            .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
            .await
            .unwrap();
        let events = parse_sse(&text_of(response).await);
        let after = monotonic_ns();
        let stamps: Vec<u64> = events
            .iter()
            .filter(|e| e.data != "[DONE]")
            .filter_map(|e| json_of(e)["x_fake_sent_ns"].as_u64())
            .collect();
        assert_eq!(
            stamps.len(),
            3,
            "only content events carry stamps: {events:?}"
        );
        assert!(
            stamps.windows(2).all(|w| w[1] - w[0] >= 9_000_000),
            "{stamps:?}"
        );
        assert!(before < stamps[0] && stamps[2] <= after);
    }

    #[tokio::test]
    async fn requests_and_connections_are_recorded() {
        let fake = fake().await;
        let client = h1();
        let headers = [("x-request-id", "abc"), ("x-fake-interval-ms", "1")];
        let response = client
            .request(post(&fake, "/v1/chat/completions?trace=1", CHAT, &headers))
            .await
            .unwrap();
        text_of(response).await;
        assert!(fake.wait_for_requests(1, PATIENCE).await);
        assert!(!fake.wait_for_requests(2, Duration::from_millis(50)).await);
        let request = &fake.requests()[0];
        assert_eq!(request.method, Method::POST);
        assert_eq!(request.path, "/v1/chat/completions?trace=1");
        assert_eq!(request.headers["x-request-id"], "abc");
        assert_eq!(request.body, CHAT.as_bytes());
        assert_eq!(request.version, Version::HTTP_11);
        assert_eq!(request.conn_id, 0);
        let connections = fake.connections();
        assert_eq!(connections.len(), 1);
        assert!(connections[0].peer.ip().is_loopback());
        assert!(connections[0].opened_at <= request.at);
        assert_eq!(fake.open_connections(), 1);
        drop(client);
        assert!(fake.wait_closed(0, PATIENCE).await.is_some());
        assert!(fake.wait_open_connections(0, PATIENCE).await);
    }

    #[tokio::test]
    async fn shutdown_closes_everything() {
        let fake = fake().await;
        let _frozen = raw_post(&fake, &[("x-fake-freeze-after", "0")]).await;
        assert!(fake.wait_for_requests(1, PATIENCE).await);
        fake.shutdown();
        assert!(fake.wait_open_connections(0, PATIENCE).await);
        assert!(fake.wait_request_finished(0, PATIENCE).await.is_some());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(TcpStream::connect(fake.addr()).await.is_err());
    }

    #[tokio::test]
    async fn h1_close_noticed_while_body_frozen() {
        let fake = fake().await;
        let mut stream = raw_post(
            &fake,
            &[("x-fake-freeze-after", "1"), ("x-fake-interval-ms", "5")],
        )
        .await;
        read_until(&mut stream, "tok1 ").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let closed_by_client = Instant::now();
        drop(stream);
        assert_noticed_promptly(&fake, closed_by_client).await;
    }

    #[tokio::test]
    async fn h1_reset_noticed_while_body_frozen() {
        let fake = fake().await;
        let mut stream = raw_post(
            &fake,
            &[("x-fake-freeze-after", "1"), ("x-fake-interval-ms", "5")],
        )
        .await;
        read_until(&mut stream, "tok1 ").await;
        stream.set_zero_linger().unwrap();
        let closed_by_client = Instant::now();
        drop(stream);
        assert_noticed_promptly(&fake, closed_by_client).await;
    }

    /// hyper's default `half_close(false)` takes a client's FIN as "gone" even though the client
    /// could still read; the gateway's server side behaves the same.
    #[tokio::test]
    async fn h1_half_close_counts_as_gone() {
        let fake = fake().await;
        let mut stream = raw_post(
            &fake,
            &[("x-fake-freeze-after", "1"), ("x-fake-interval-ms", "5")],
        )
        .await;
        read_until(&mut stream, "tok1 ").await;
        let closed_by_client = Instant::now();
        stream.shutdown().await.unwrap();
        assert_noticed_promptly(&fake, closed_by_client).await;
    }

    #[tokio::test]
    async fn h1_close_noticed_during_headers_first_wait() {
        let fake = fake().await;
        let mut stream = raw_post(
            &fake,
            &[("x-fake-headers-first", "1"), ("x-fake-ttft-ms", "10000")],
        )
        .await;
        let head = read_until(&mut stream, "\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let closed_by_client = Instant::now();
        drop(stream);
        assert_noticed_promptly(&fake, closed_by_client).await;
    }

    #[tokio::test]
    async fn h1_close_noticed_before_the_head() {
        let fake = fake().await;
        let stream = raw_post(&fake, &[("x-fake-ttft-ms", "10000")]).await;
        assert!(fake.wait_for_requests(1, PATIENCE).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let closed_by_client = Instant::now();
        drop(stream);
        assert_noticed_promptly(&fake, closed_by_client).await;
    }

    #[tokio::test]
    async fn h2_reset_ends_a_frozen_body() {
        let fake = fake().await;
        let client = h2();
        let headers = [("x-fake-freeze-after", "1"), ("x-fake-interval-ms", "5")];
        let response = client
            .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
            .await
            .unwrap();
        assert_eq!(response.version(), Version::HTTP_2);
        let mut body = response.into_body();
        let text: String = frames_until_quiet(&mut body, Duration::from_millis(100))
            .await
            .into_iter()
            .map(|f| f.1)
            .collect();
        assert!(text.contains("tok1 "));
        let dropped = Instant::now();
        drop(body);
        let request = fake
            .wait_request_finished(0, PATIENCE)
            .await
            .expect("body never dropped");
        assert!(!request.completed);
        assert_eq!(request.version, Version::HTTP_2);
        let lag = request
            .finished_at
            .unwrap()
            .saturating_duration_since(dropped);
        assert!(lag < PROMPT, "dropped after {lag:?}");
        // Only the stream was reset; the connection lives on until the client goes.
        assert_eq!(fake.open_connections(), 1);
        drop(client);
        assert!(fake.wait_open_connections(0, PATIENCE).await);
    }

    #[tokio::test]
    async fn h2_reset_ends_a_pending_head() {
        let fake = fake().await;
        let client = h2();
        let pending = tokio::spawn(client.request(post(
            &fake,
            "/v1/chat/completions",
            CHAT,
            &[("x-fake-ttft-ms", "10000")],
        )));
        assert!(fake.wait_for_requests(1, PATIENCE).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let dropped = Instant::now();
        pending.abort();
        let request = fake
            .wait_request_finished(0, PATIENCE)
            .await
            .expect("service future never dropped");
        let lag = request
            .finished_at
            .unwrap()
            .saturating_duration_since(dropped);
        assert!(lag < PROMPT, "dropped after {lag:?}");
        assert_eq!(fake.open_connections(), 1);
    }

    #[tokio::test]
    async fn many_concurrent_h2_streams() {
        let fake = fake().await;
        let client = h2();
        let headers = [
            ("x-fake-chunks", "3"),
            ("x-fake-interval-ms", "20"),
            ("x-fake-ttft-ms", "20"),
        ];
        let started = Instant::now();
        let streams = (0..2000).map(|_| {
            let request = client.request(post(&fake, "/v1/chat/completions", CHAT, &headers));
            async move { text_of(request.await.unwrap()).await }
        });
        let bodies = futures_join_all(streams).await;
        assert!(bodies.iter().all(|b| b.ends_with("data: [DONE]\n\n")));
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert!(fake.requests().iter().all(|r| r.completed));
        assert_eq!(fake.connections().len(), 1);
    }

    /// `futures` is not a dependency; a JoinSet does the same for 'static futures.
    async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<String>
    where
        F: Future<Output = String> + Send + 'static,
    {
        let mut set = tokio::task::JoinSet::new();
        for future in futures {
            set.spawn(future);
        }
        let mut out = Vec::new();
        while let Some(result) = set.join_next().await {
            out.push(result.unwrap());
        }
        out
    }

    #[tokio::test]
    async fn never_accepting_listener_hangs_connects() {
        let (_guard, addr) = never_accepting_listener().unwrap();
        let attempt =
            tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await;
        assert!(attempt.is_err(), "connect finished: {attempt:?}");
    }
}
