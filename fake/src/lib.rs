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
//! | `x-fake-status` S | answer status S (400 to 599) with an error (after the ttft delay): OpenAI's shape, Anthropic's on `/v1/messages` |
//! | `x-fake-keepalive-ms` K | while the open stream is silent, write a keep-alive every K ms |
//! | `x-fake-keepalive-kind` | `comment` (`: keep-alive`) or `ping` (`event: ping`) |
//! | `x-fake-timestamps` (`1`) | content events carry `"x_fake_sent_ns"` from [`monotonic_ns`] |
//! | `x-fake-tool-call` TURN[,TURN...] | answer with calls of functions instead of text: their arguments stream in the content events (Chat `tool_calls` deltas, Anthropic `tool_use` + `input_json_delta`, Responses `function_call` + `response.function_call_arguments.delta`). A turn is a name, or names joined by `+` that are called together in one answer (parallel calls: Chat `tool_calls` indexes 0, 1, ..., one Anthropic `tool_use` block or Responses `function_call` item each, one after the other, each with its own id). One turn: that answer every time (for loop tests); a list `a+b,c`: the turn by the number of tool results the request already holds (Chat `tool` messages, Anthropic `tool_result` blocks, Responses `function_call_output` items), a turn being answered once there is a result for each of its calls (`a+b` is answered again while only one came), and plain text past the list's end, so an agent finishes |
//! | `x-fake-tool-args` JSON | every call's arguments (a JSON object, else 400), each cut into `x-fake-chunks` pieces; default `{"text":"tok1 ..."}` |
//! | `x-fake-tool-preamble` N (0) | with calls, N text tokens (`tok1 `, ...) said before them: Chat `content` deltas, an Anthropic `text` block, a Responses `message` item; ignored when the answer is text |
//! | `x-fake-reasoning` N (0) | N reasoning tokens (`think1 `, ...) before the answer, content events too: Anthropic a `thinking` block (`thinking_delta`s, then a `signature_delta`; unstreamed, the block with its `signature`), Responses a `reasoning` item with summary text (`response.reasoning_summary_text.delta`), Chat a `reasoning_content` field (DeepSeek's and vLLM's convention; OpenAI's Chat API has none) |
//! | `x-fake-refusal` (`1`) | Chat: answer with a `refusal` instead of `content` (or of a scripted call); ignored by the other APIs |
//! | `x-fake-id` ID | fixes the ids (`chatcmpl-ID`, `msg_ID`, `resp_ID`, `call_ID`, ...; parallel call k > 0 `call_ID-k`) and `created`/`created_at`, so two answers compare equal as JSON |
//!
//! Content events, the ones `x-fake-interval-ms` spaces and `x-fake-freeze-after` and
//! `x-fake-disconnect-after` count, are the tokens: reasoning tokens, then text tokens (the
//! answer, or the preamble), then each call's `x-fake-chunks` argument pieces, call after call
//! (with Chat `n`, each of these per choice). The framing around them is not: a call's
//! opening delta, a block's start and stop, an item's added and done. So with a preamble of P
//! and C pieces a call, a freeze after P + C + k stops k pieces into the second call.
//! Usage counts the same tokens.
//!
//! From a Chat request body: `n` (choices, streamed interleaved, choice `k > 0` saying
//! `tok1-k `), `logprobs`/`top_logprobs` (a `logprobs.content` entry per answer token) and
//! `stream_options.include_usage` (the last chunk, with the usage; without it a stream
//! reports none, as OpenAI's). Usage and finish/stop reasons of a stream are those of the
//! same request unstreamed: every shape is the same scripted output, streamed or not.
//!
//! [`FakeUpstream::set_replay`] makes every `POST` answer with recorded events instead (real
//! providers' streams, kept as fixtures): the first after `x-fake-ttft-ms`, then one every
//! interval, each counting as a content event for `x-fake-freeze-after` and
//! `x-fake-disconnect-after`.
//!
//! Non-stream answers are one piece with no content events to count: a freeze or disconnect
//! count of 0 stops them before the body, and any other count lets the whole answer through.
//! On a stream, `x-fake-disconnect-after: 0` aborts before the head (at its time). Unknown `x-fake-*` headers are ignored; malformed values get
//! a 400. Every connection and request is recorded for tests to assert on (see [`FakeUpstream`]).
//!
//! Close detection: the accepted socket is wrapped in an IO type that stamps
//! [`ConnectionRecord::closed_at`] on EOF or error and on drop. That suffices because hyper's
//! HTTP/1 server, once the request body is fully read, keeps a read pending while the service
//! future or the response body is pending, and treats EOF (with the default `half_close(false)`)
//! or a reset as the end of the connection, dropping both; h2 polls for RST_STREAM in both
//! states. The exception: bytes the client sent beyond the request (pipelining) stop hyper from
//! reading, and then a close is not noticed until a write fails. The tests (`tests.rs`) pin the
//! behaviour down, since the gateway relies on it too.
//!
//! Where to read: `script.rs` (the headers), `respond.rs` (one request, from its record to its
//! answer), `reply.rs` (what the answer says, event by event) with `chat.rs`, `anthropic.rs`
//! and `responses.rs` (each API's shapes), `body.rs` (the timing),
//! `records.rs` and `server.rs` (what is remembered, and the close detection above),
//! `never_accept.rs`.

mod answer;
mod anthropic;
mod body;
mod chat;
mod never_accept;
mod records;
mod reply;
mod respond;
mod responses;
mod script;
mod server;
#[cfg(test)]
mod tests;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use tokio::net::TcpSocket;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use never_accept::{never_accepting_listener, NeverAccept};
pub use records::{ConnectionRecord, RequestRecord};
use records::{Records, Shared};

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

/// A running fake provider. Dropping it (or [`FakeUpstream::shutdown`]) stops it.
pub struct FakeUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    cancel: CancellationToken,
}

impl FakeUpstream {
    /// Binds `addr` (port 0 picks a free port), spawns the accept loop and returns at once.
    pub async fn start(addr: SocketAddr) -> io::Result<FakeUpstream> {
        Self::listen(addr, true).await
    }

    /// As `start`, remembering nothing of its connections and requests: what runs for as
    /// long as an operator likes (`fake-upstream`, the demo), where every request kept would
    /// grow the process for good. `connections`, `requests` and their waits see nothing.
    pub async fn start_unrecorded(addr: SocketAddr) -> io::Result<FakeUpstream> {
        Self::listen(addr, false).await
    }

    async fn listen(addr: SocketAddr, recording: bool) -> io::Result<FakeUpstream> {
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
            recording,
            next_conn_id: AtomicU64::new(0),
        });
        let cancel = CancellationToken::new();
        tokio::spawn(server::accept_loop(
            listener,
            shared.clone(),
            cancel.clone(),
        ));
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
    let fake = FakeUpstream::start_unrecorded(addr).await?;
    tracing::info!("fake upstream listening on http://{}", fake.addr());
    tokio::signal::ctrl_c().await?;
    fake.shutdown();
    Ok(())
}
