//! The watchdog body: wraps the upstream response body on its way to the client and enforces
//! the first-token, idle and total limits on it.
//!
//! The inner body is polled first; the timer only when the inner body is pending, so a frame
//! that is ready always wins over a limit that fires at the same moment. One `Sleep` serves all
//! three limits: it is set to the earliest of them and, rather than being reset on every data
//! event, it is re-armed lazily when it fires early (the idle limit moved on since it was set).
//! When a limit fires, the upstream body is dropped at once (which closes the upstream
//! connection or resets the HTTP/2 stream) and the client is told why: an SSE `event: error`
//! after the last complete event, or an aborted body for anything else.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::error::GatewayError;
use crate::inspect::{Inspector, Tokens};
use crate::reaper::Reaped;
use crate::sse::SseScanner;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An event still incomplete after this many bytes is forwarded as it comes instead of held.
pub const MAX_HELD_EVENT: usize = 1 << 20;

/// How a stream ended, as the watchdog saw it.
#[derive(Debug)]
pub enum StreamEnd {
    /// The upstream body ended cleanly.
    Complete,
    /// A limit fired or the upstream failed; the client was told.
    Cut(GatewayError),
    /// The upstream sent its own `event: error`; it was passed through and ended the stream.
    UpstreamErrorEvent,
}

/// Told what happens on the stream. Dropping the observer without `finish` means the client
/// went away first.
pub trait Observer {
    /// The first event that carries model output (with a known format; otherwise the first
    /// data event, or the first byte of a non-SSE body).
    fn first_token(&mut self, at: Instant);
    fn data(&mut self, len: usize);
    fn finish(&mut self, end: StreamEnd);
    /// What the inspector counted, told once when the body is dropped (only with one).
    fn tokens(&mut self, _tokens: Tokens) {}
}

/// The limits of one stream, as absolute instants fixed before the head arrived.
#[derive(Debug, Clone)]
pub struct StreamLimits {
    /// Request sent + first-token limit: the first data event must arrive before this.
    pub first_token_deadline: Instant,
    pub first_token_timeout: Duration,
    /// Longest silence between data events once streaming.
    pub idle_timeout: Duration,
    /// The request's deadline less its reserve.
    pub deadline: Instant,
    /// The request's whole budget, for the error message.
    pub budget: Duration,
    pub upstream: Arc<str>,
}

struct Sse {
    scanner: SseScanner,
    /// The bytes of an event not yet complete, as the frames that carried them.
    held: Vec<Bytes>,
    held_len: usize,
    /// Part of the open event already went to the client (it outgrew `MAX_HELD_EVENT`), so
    /// an error event must first end that event's line and block to parse on its own.
    partial_sent: bool,
}

enum State {
    Streaming,
    /// A non-SSE body that must be aborted: the error is returned on the next poll.
    Failing(GatewayError),
    Done,
}

pin_project! {
    pub struct WatchdogBody<B, O>
    where
        O: Observer,
    {
        #[pin]
        inner: Option<B>,
        // Boxed, so that the body is `Unpin` and can be read in place before it is handed on
        // (HTTP/1.0 answers are read whole to give them a length): one allocation per stream,
        // and the timer is still reset, never recreated.
        timer: Pin<Box<Sleep>>,
        limits: StreamLimits,
        // The last data event, from the first token on (`None` until then: before the first
        // token only the first-token limit applies, so a reasoning model may think in silence).
        last_progress: Option<Instant>,
        // Reads the provider's format as it passes, when it is known: what counts as a token,
        // the usage, the provider's own errors.
        inspect: Option<Inspector>,
        sse: Option<Sse>,
        ready: VecDeque<Bytes>,
        state: State,
        observer: O,
        // Fires when the gateway gives up on in-flight streams at the end of its shutdown
        // grace. Boxed because it lives only on streams, not per chunk.
        shutdown: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    }

    impl<B, O> PinnedDrop for WatchdogBody<B, O>
    where
        O: Observer,
    {
        fn drop(this: Pin<&mut Self>) {
            // Before the observer itself is dropped (and reports), however the stream ended.
            let this = this.project();
            if let Some(inspect) = this.inspect.as_ref() {
                this.observer.tokens(inspect.tokens());
            }
        }
    }
}

impl<B, O> WatchdogBody<B, O>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    O: Observer,
{
    pub fn new(inner: B, is_sse: bool, limits: StreamLimits, observer: O) -> Self {
        let first_due = limits.first_token_deadline.min(limits.deadline);
        Self {
            inner: Some(inner),
            timer: Box::pin(sleep_until(first_due)),
            limits,
            last_progress: None,
            inspect: None,
            sse: is_sse.then(|| Sse {
                scanner: SseScanner::new(),
                held: Vec::new(),
                held_len: 0,
                partial_sent: false,
            }),
            ready: VecDeque::new(),
            state: State::Streaming,
            observer,
            shutdown: None,
        }
    }

    /// Cuts the stream (origin `shutdown`, with the error event) when `token` is cancelled.
    pub fn with_shutdown(mut self, token: &CancellationToken) -> Self {
        self.shutdown = Some(Box::pin(token.clone().cancelled_owned()));
        self
    }

    /// Puts frames already read from this body back in front of what it yields next.
    pub fn unread(&mut self, frames: impl IntoIterator<Item = Bytes>) {
        let mut ready: VecDeque<Bytes> = frames.into_iter().collect();
        ready.append(&mut self.ready);
        self.ready = ready;
    }

    /// The observer, to note what the caller did with the body (an answer sent instead).
    pub fn observer_mut(&mut self) -> &mut O {
        &mut self.observer
    }

    /// Reads the body with `inspector` (for a response whose format is known): on an SSE
    /// body the first token becomes the first event carrying model output, and the
    /// provider's data-only error event ends the stream as an `event: error` does.
    pub fn with_inspector(mut self, inspector: Option<Inspector>) -> Self {
        self.inspect = inspector;
        self
    }
}

impl<B, O> Body for WatchdogBody<B, O>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    O: Observer,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        loop {
            if let Some(b) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            match std::mem::replace(this.state, State::Done) {
                State::Done => return Poll::Ready(None),
                State::Failing(e) => return Poll::Ready(Some(Err(Box::new(e)))),
                State::Streaming => *this.state = State::Streaming,
            }
            let Some(inner) = this.inner.as_mut().as_pin_mut() else {
                *this.state = State::Done;
                continue;
            };
            match inner.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let data = match frame.into_data() {
                        Ok(data) => data,
                        Err(trailers) => {
                            // Trailers end a body; whatever was held goes out before them.
                            flush_held(this.sse, this.ready);
                            if this.ready.is_empty() {
                                return Poll::Ready(Some(Ok(trailers)));
                            }
                            continue;
                        }
                    };
                    if data.is_empty() {
                        continue;
                    }
                    this.observer.data(data.len());
                    // A body framed by content-length is not polled again after its last
                    // byte, so its end must be noticed here, or it would look abandoned.
                    let ended = this
                        .inner
                        .as_ref()
                        .as_pin_ref()
                        .is_some_and(|b| b.is_end_stream());
                    let Some(sse) = this.sse.as_mut() else {
                        if let Some(inspect) = this.inspect.as_mut() {
                            inspect.feed(&data);
                        }
                        mark_progress(
                            this.last_progress,
                            this.observer,
                            this.timer.as_mut(),
                            this.limits,
                        );
                        if ended {
                            this.inner.set(None);
                            this.observer.finish(StreamEnd::Complete);
                            *this.state = State::Done;
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    };
                    let scan = sse.scanner.scan(&data);
                    let (output, error_end) = match this.inspect.as_mut() {
                        None => (scan.progress > 0, scan.error_end),
                        Some(inspect) => {
                            let found = inspect.feed(&data[..scan.error_end.unwrap_or(data.len())]);
                            (found.output, found.error_end.or(scan.error_end))
                        }
                    };
                    // The first token starts the idle limit; after it, every data event
                    // (output or not) moves it.
                    if output || (scan.progress > 0 && this.last_progress.is_some()) {
                        mark_progress(
                            this.last_progress,
                            this.observer,
                            this.timer.as_mut(),
                            this.limits,
                        );
                    }
                    if let Some(end) = error_end {
                        // The upstream's own error event is passed through and ends the
                        // stream; Hourglass adds none of its own after it.
                        flush_held(this.sse, this.ready);
                        this.ready.push_back(data.slice(..end));
                        this.inner.set(None);
                        this.observer.finish(StreamEnd::UpstreamErrorEvent);
                        *this.state = State::Done;
                        continue;
                    }
                    match scan.last_boundary {
                        // The common case, a frame of whole events with nothing held
                        // before it, goes straight out (`ready` is always empty when the
                        // inner body is polled).
                        Some(end) if end == data.len() && sse.held.is_empty() && !ended => {
                            debug_assert!(this.ready.is_empty());
                            sse.partial_sent = false;
                            return Poll::Ready(Some(Ok(Frame::data(data))));
                        }
                        Some(end) => {
                            flush_held(this.sse, this.ready);
                            let sse = this.sse.as_mut().expect("checked above");
                            sse.partial_sent = false;
                            if end == data.len() {
                                this.ready.push_back(data);
                            } else {
                                if end > 0 {
                                    this.ready.push_back(data.slice(..end));
                                }
                                sse.held_len = data.len() - end;
                                sse.held.push(data.slice(end..));
                            }
                        }
                        None => {
                            sse.held_len += data.len();
                            sse.held.push(data);
                            if sse.held_len > MAX_HELD_EVENT {
                                sse.partial_sent = true;
                                flush_held(this.sse, this.ready);
                            }
                        }
                    }
                    if ended {
                        flush_held(this.sse, this.ready);
                        this.inner.set(None);
                        this.observer.finish(StreamEnd::Complete);
                        *this.state = State::Done;
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    let e: BoxError = e.into();
                    if let Some(Reaped::Stalled(_)) = e.downcast_ref::<Reaped>() {
                        // The client took nothing for `send_timeout` and its upstream call is
                        // gone. It is aborted as an HTTP/1 client's connection is closed
                        // (an HTTP/2 stream is reset); without `finish`, the record counts it
                        // as the client's.
                        this.inner.set(None);
                        *this.state = State::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                    // Past the deadline, the deadline is why the upstream is gone (the reaper
                    // drops it there when nobody was reading).
                    let err = if Instant::now() >= this.limits.deadline {
                        GatewayError::DeadlineExceeded {
                            budget: this.limits.budget,
                        }
                    } else {
                        GatewayError::UpstreamError {
                            upstream: this.limits.upstream.to_string(),
                            reason: e.to_string(),
                        }
                    };
                    cut(
                        this.inner.as_mut(),
                        this.sse,
                        this.ready,
                        this.state,
                        this.observer,
                        err,
                    );
                }
                Poll::Ready(None) => {
                    // A clean end: an incomplete trailing event is forwarded as is (the
                    // client's parser discards it, exactly as it would have without us).
                    flush_held(this.sse, this.ready);
                    this.inner.set(None);
                    this.observer.finish(StreamEnd::Complete);
                    *this.state = State::Done;
                }
                Poll::Pending => {
                    if let Some(s) = this.shutdown.as_mut() {
                        if s.as_mut().poll(cx).is_ready() {
                            cut(
                                this.inner.as_mut(),
                                this.sse,
                                this.ready,
                                this.state,
                                this.observer,
                                GatewayError::Shutdown,
                            );
                            continue;
                        }
                    }
                    if this.timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let limits = &*this.limits;
                    let due = match *this.last_progress {
                        None => limits.first_token_deadline,
                        Some(t) => t + limits.idle_timeout,
                    }
                    .min(limits.deadline);
                    let now = Instant::now();
                    if now < due {
                        // Progress moved the idle limit since the timer was armed.
                        this.timer.as_mut().reset(due);
                        continue;
                    }
                    let upstream = limits.upstream.to_string();
                    let err = if now >= limits.deadline {
                        GatewayError::DeadlineExceeded {
                            budget: limits.budget,
                        }
                    } else if this.last_progress.is_none() {
                        GatewayError::FirstTokenTimeout {
                            upstream,
                            after: limits.first_token_timeout,
                        }
                    } else {
                        GatewayError::IdleTimeout {
                            upstream,
                            after: limits.idle_timeout,
                        }
                    };
                    cut(
                        this.inner.as_mut(),
                        this.sse,
                        this.ready,
                        this.state,
                        this.observer,
                        err,
                    );
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done) && self.ready.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.inner, &self.sse) {
            // Only a raw body passes through byte for byte; an SSE body may gain an event.
            (Some(inner), None) => inner.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

/// Notes a data event. The first one moves the timer from the first-token limit to the idle
/// limit, which may be earlier, so it is re-armed now; later events only move the idle limit
/// later, which the timer catches up with lazily when it fires.
fn mark_progress<O: Observer>(
    last: &mut Option<Instant>,
    observer: &mut O,
    timer: Pin<&mut Sleep>,
    limits: &StreamLimits,
) {
    let now = Instant::now();
    if last.is_none() {
        observer.first_token(now);
        timer.reset((now + limits.idle_timeout).min(limits.deadline));
    }
    *last = Some(now);
}

fn flush_held(sse: &mut Option<Sse>, ready: &mut VecDeque<Bytes>) {
    if let Some(sse) = sse {
        ready.extend(sse.held.drain(..));
        sse.held_len = 0;
    }
}

/// Ends the stream because of `err`: the upstream body is dropped now (that is what closes
/// the upstream connection), a held partial event is discarded so that the error event that
/// follows parses on its own, and the observer learns the cause.
fn cut<B, O: Observer>(
    mut inner: Pin<&mut Option<B>>,
    sse: &mut Option<Sse>,
    ready: &mut VecDeque<Bytes>,
    state: &mut State,
    observer: &mut O,
    err: GatewayError,
) {
    inner.set(None);
    observer.finish(StreamEnd::Cut(err.clone()));
    match sse {
        Some(sse) => {
            sse.held.clear();
            sse.held_len = 0;
            if std::mem::take(&mut sse.partial_sent) {
                // "\n\n" ends any line (even one whose CR already went out) and then the
                // block: the truncated event is dispatched as it stands, and the error event
                // that follows is one of its own.
                ready.push_back(Bytes::from_static(b"\n\n"));
            }
            ready.push_back(err.sse_event());
            *state = State::Done;
        }
        None => *state = State::Failing(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Channel};
    use std::sync::Mutex;

    #[derive(Default, Debug)]
    struct Seen {
        first_token: Option<Instant>,
        bytes: usize,
        end: Option<String>,
        dropped: bool,
        tokens: Option<Tokens>,
    }

    #[derive(Clone, Default)]
    struct Probe(Arc<Mutex<Seen>>);

    impl Observer for Probe {
        fn first_token(&mut self, at: Instant) {
            self.0.lock().unwrap().first_token.get_or_insert(at);
        }
        fn data(&mut self, len: usize) {
            self.0.lock().unwrap().bytes += len;
        }
        fn tokens(&mut self, tokens: Tokens) {
            let mut seen = self.0.lock().unwrap();
            assert!(seen.tokens.is_none(), "tokens told twice");
            seen.tokens = Some(tokens);
        }

        fn finish(&mut self, end: StreamEnd) {
            let s = match end {
                StreamEnd::Complete => "complete".to_string(),
                StreamEnd::Cut(e) => e.code().to_string(),
                StreamEnd::UpstreamErrorEvent => "upstream_error_event".to_string(),
            };
            let mut seen = self.0.lock().unwrap();
            assert!(seen.end.is_none(), "finish called twice");
            seen.end = Some(s);
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            if let Ok(mut s) = self.0.lock() {
                s.dropped = true;
            }
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn limits(first: u64, idle: u64, total: u64) -> StreamLimits {
        let now = Instant::now();
        StreamLimits {
            first_token_deadline: now + ms(first),
            first_token_timeout: ms(first),
            idle_timeout: ms(idle),
            deadline: now + ms(total),
            budget: ms(total),
            upstream: Arc::from("up"),
        }
    }

    type Sender = http_body_util::channel::Sender<Bytes, std::io::Error>;
    type TestBody = Pin<Box<WatchdogBody<Channel<Bytes, std::io::Error>, Probe>>>;

    fn body(sse: bool, l: StreamLimits) -> (Sender, TestBody, Probe) {
        let (tx, rx) = Channel::<Bytes, std::io::Error>::new(64);
        let probe = Probe::default();
        (
            tx,
            Box::pin(WatchdogBody::new(rx, sse, l, probe.clone())),
            probe,
        )
    }

    /// Collects frames until the body ends; returns the data and whether it ended in an error.
    async fn drain<B: Body<Data = Bytes, Error = BoxError> + Unpin>(
        b: &mut B,
    ) -> (Vec<u8>, Option<String>) {
        let mut out = Vec::new();
        while let Some(f) = b.frame().await {
            match f {
                Ok(f) => out.extend_from_slice(&f.into_data().unwrap_or_default()),
                Err(e) => return (out, Some(e.to_string())),
            }
        }
        (out, None)
    }

    fn feeder(mut tx: Sender, script: Vec<(u64, &'static str)>) -> tokio::task::JoinHandle<Sender> {
        tokio::spawn(async move {
            for (delay, chunk) in script {
                tokio::time::sleep(ms(delay)).await;
                if tx
                    .send_data(Bytes::from_static(chunk.as_bytes()))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            tx
        })
    }

    #[tokio::test(start_paused = true)]
    async fn passes_complete_events_and_ends_cleanly() {
        let (tx, mut b, probe) = body(true, limits(1000, 1000, 10_000));
        let start = Instant::now();
        let t = feeder(
            tx,
            vec![(10, "data: a\n\n"), (10, "data: b\n\ndata: c\n\n")],
        );
        // The feeder's sender is dropped when it is done: the body's clean end.
        tokio::spawn(async move { drop(t.await) });
        let (out, err) = drain(&mut b).await;
        assert_eq!(out, b"data: a\n\ndata: b\n\ndata: c\n\n");
        assert!(err.is_none());
        let seen = probe.0.lock().unwrap();
        assert_eq!(seen.end.as_deref(), Some("complete"));
        assert_eq!(seen.first_token, Some(start + ms(10)));
        assert_eq!(seen.bytes, out.len());
    }

    #[tokio::test(start_paused = true)]
    async fn first_token_limit_fires_and_says_so() {
        let (tx, mut b, probe) = body(true, limits(500, 1000, 10_000));
        // Keep-alives are not tokens: they are forwarded but do not satisfy the limit.
        let t = feeder(
            tx,
            vec![(100, ": ping\n\n"), (100, "event: ping\ndata: {}\n\n")],
        );
        let start = Instant::now();
        let (out, err) = drain(&mut b).await;
        assert!(err.is_none(), "SSE ends cleanly with an event");
        assert_eq!(Instant::now() - start, ms(500));
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(": ping\n\nevent: ping\ndata: {}\n\nevent: error\ndata: "),
            "{text}"
        );
        assert!(text.contains("\"code\":\"first_token_timeout\""));
        assert_eq!(
            probe.0.lock().unwrap().end.as_deref(),
            Some("first_token_timeout")
        );
        assert!(probe.0.lock().unwrap().first_token.is_none());
        // The upstream body was dropped when the limit fired, not later.
        let mut tx = t.await.unwrap();
        assert!(tx.send_data(Bytes::from_static(b"x")).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn idle_limit_counts_only_data_events_and_drops_partial_event() {
        let (tx, mut b, probe) = body(true, limits(1000, 300, 10_000));
        let t = feeder(
            tx,
            vec![
                (10, "data: 1\n\n"),
                (200, "data: 2\n\n"),
                (200, ": keep-alive\n\n"),
                (50, "data: partial-with"),
            ],
        );
        let start = Instant::now();
        let (out, err) = drain(&mut b).await;
        assert!(err.is_none());
        // Last progress at 210 ms; keep-alive at 410 does not move the idle limit.
        assert_eq!(Instant::now() - start, ms(510));
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("partial"), "{text}");
        assert!(
            text.starts_with("data: 1\n\ndata: 2\n\n: keep-alive\n\nevent: error\n"),
            "{text}"
        );
        assert!(text.contains("\"code\":\"idle_timeout\""));
        assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("idle_timeout"));
        drop(t);
    }

    #[tokio::test(start_paused = true)]
    async fn total_deadline_beats_a_trickle() {
        let (tx, mut b, probe) = body(true, limits(1000, 1000, 2000));
        let script = (0..100).map(|_| (150, "data: t\n\n")).collect();
        let t = feeder(tx, script);
        let start = Instant::now();
        let (out, _) = drain(&mut b).await;
        assert_eq!(Instant::now() - start, ms(2000));
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with("\n\n"));
        assert!(text.contains("\"code\":\"deadline_exceeded\""));
        assert_eq!(text.matches("event: error").count(), 1);
        assert_eq!(
            probe.0.lock().unwrap().end.as_deref(),
            Some("deadline_exceeded")
        );
        drop(t);
    }

    #[tokio::test(start_paused = true)]
    async fn partial_events_are_held_until_complete() {
        let (mut tx, mut b, _probe) = body(true, limits(1000, 1000, 10_000));
        tx.send_data(Bytes::from_static(b"data: one\n\ndata: tw"))
            .await
            .unwrap();
        let f = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&f[..], b"data: one\n\n");
        // Nothing more is ready: the partial event is held.
        assert!(futures_poll_once(&mut b).await.is_none());
        tx.send_data(Bytes::from_static(b"o\n\ndata: thr"))
            .await
            .unwrap();
        let a = b.frame().await.unwrap().unwrap().into_data().unwrap();
        let c = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!([&a[..], &c[..]].concat(), b"data: two\n\n");
    }

    async fn futures_poll_once<B: Body + Unpin>(b: &mut B) -> Option<()> {
        std::future::poll_fn(|cx| match Pin::new(&mut *b).poll_frame(cx) {
            Poll::Pending => Poll::Ready(None),
            Poll::Ready(_) => Poll::Ready(Some(())),
        })
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn upstream_error_event_passes_through_and_ends() {
        let (tx, mut b, probe) = body(true, limits(1000, 1000, 10_000));
        let t = feeder(
            tx,
            vec![(
                5,
                "data: a\n\nevent: error\ndata: {\"type\":\"error\"}\n\ndata: never\n\n",
            )],
        );
        let (out, err) = drain(&mut b).await;
        assert!(err.is_none());
        assert_eq!(
            out,
            b"data: a\n\nevent: error\ndata: {\"type\":\"error\"}\n\n"
        );
        assert_eq!(
            probe.0.lock().unwrap().end.as_deref(),
            Some("upstream_error_event")
        );
        drop(t);
    }

    #[tokio::test(start_paused = true)]
    async fn upstream_failure_mid_sse_becomes_error_event() {
        let (mut tx, mut b, probe) = body(true, limits(1000, 1000, 10_000));
        tx.send_data(Bytes::from_static(b"data: a\n\ndata: half"))
            .await
            .unwrap();
        tx.abort(std::io::Error::other("connection reset"));
        let (out, err) = drain(&mut b).await;
        assert!(err.is_none());
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("data: a\n\nevent: error\n"), "{text}");
        assert!(text.contains("\"code\":\"upstream_error\""));
        assert_eq!(
            probe.0.lock().unwrap().end.as_deref(),
            Some("upstream_error")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn non_sse_body_is_aborted_not_truncated() {
        let (tx, mut b, probe) = body(false, limits(1000, 200, 10_000));
        let t = feeder(tx, vec![(10, "{\"partial\":")]);
        let (out, err) = drain(&mut b).await;
        assert_eq!(out, b"{\"partial\":");
        assert!(err.unwrap().contains("silent for 200ms"));
        assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("idle_timeout"));
        drop(t);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_knows_its_end_completes_on_its_last_byte() {
        // Like a content-length response: hyper stops polling after the last byte.
        let inner = http_body_util::Full::new(Bytes::from_static(b"{\"ok\":true}"));
        let probe = Probe::default();
        let mut b = Box::pin(WatchdogBody::new(
            inner,
            false,
            limits(1000, 1000, 10_000),
            probe.clone(),
        ));
        let f = b.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), &b"{\"ok\":true}"[..]);
        assert!(b.is_end_stream());
        drop(b);
        assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("complete"));
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_cuts_a_silent_stream_with_its_own_event() {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(64);
        let probe = Probe::default();
        let token = CancellationToken::new();
        let mut b = Box::pin(
            WatchdogBody::new(rx, true, limits(1000, 5000, 10_000), probe.clone())
                .with_shutdown(&token),
        );
        tx.send_data(Bytes::from_static(b"data: a\n\n"))
            .await
            .unwrap();
        let first = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"data: a\n\n");
        let t = token.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ms(100)).await;
            t.cancel();
        });
        let (out, err) = drain(&mut b).await;
        assert!(err.is_none());
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("event: error\n"), "{text}");
        assert!(text.contains("\"code\":\"shutdown\""));
        assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("shutdown"));
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn an_sse_body_that_knows_its_end_completes_on_its_last_event() {
        // An SSE answer framed by content-length: hyper stops polling after the last byte,
        // which here ends exactly on an event boundary (the fast path).
        let inner = http_body_util::Full::new(Bytes::from_static(b"data: a\n\ndata: [DONE]\n\n"));
        let probe = Probe::default();
        let mut b = Box::pin(WatchdogBody::new(
            inner,
            true,
            limits(1000, 1000, 10_000),
            probe.clone(),
        ));
        let f = b.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), &b"data: a\n\ndata: [DONE]\n\n"[..]);
        assert!(b.is_end_stream());
        drop(b);
        assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("complete"));
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_body_is_a_client_cancel() {
        let (mut tx, b, probe) = body(true, limits(1000, 1000, 10_000));
        drop(b);
        {
            let s = probe.0.lock().unwrap();
            assert!(
                s.end.is_none(),
                "no end recorded: the record calls it a client cancel"
            );
            assert!(s.dropped);
        }
        assert!(tx.send_data(Bytes::from_static(b"x")).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stalls_for_send_timeout_is_aborted_as_a_client_cancel() {
        let send_timeout = ms(400);
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(4);
        let reapable = crate::reaper::guard(rx, None, Instant::now() + ms(60_000), send_timeout);
        let probe = Probe::default();
        let mut b = Box::pin(WatchdogBody::new(
            reapable,
            true,
            limits(1000, 1000, 60_000),
            probe.clone(),
        ));
        tx.send_data(Bytes::from_static(b"data: a\n\n"))
            .await
            .unwrap();
        assert_eq!(
            &b.frame().await.unwrap().unwrap().into_data().unwrap()[..],
            b"data: a\n\n"
        );
        // The client takes nothing more; well within the idle limit, the upstream goes.
        tokio::time::sleep(send_timeout * 2).await;
        assert!(
            tx.send_data(Bytes::from_static(b"data: b\n\n"))
                .await
                .is_err(),
            "upstream dropped"
        );
        // Reading again finds the stream aborted, with no error event and no end of its own.
        let err = b.frame().await.unwrap().unwrap_err();
        assert!(err.to_string().contains("send_timeout"), "{err}");
        assert!(b.frame().await.is_none());
        drop(b);
        let s = probe.0.lock().unwrap();
        assert!(s.end.is_none(), "counted as the client's");
        assert!(s.dropped);
    }

    #[tokio::test(start_paused = true)]
    async fn oversized_event_is_forwarded_as_it_comes() {
        let (mut tx, mut b, _probe) = body(true, limits(1000, 1000, 10_000));
        let big = Bytes::from(vec![b'x'; MAX_HELD_EVENT + 1]);
        tx.send_data(Bytes::from_static(b"data: ")).await.unwrap();
        tx.send_data(big).await.unwrap();
        let a = b.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&a[..], b"data: ");
    }

    #[tokio::test(start_paused = true)]
    async fn a_limit_after_part_of_an_oversized_event_went_out_still_gives_a_parseable_error() {
        let (mut tx, mut b, probe) = body(true, limits(1000, 1000, 10_000));
        tx.send_data(Bytes::from_static(b"data: ")).await.unwrap();
        tx.send_data(Bytes::from(vec![b'x'; MAX_HELD_EVENT + 1]))
            .await
            .unwrap();
        // The event never ends; the first-token limit fires.
        let (out, err) = drain(&mut b).await;
        assert!(err.is_none());
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("data: xxx"));
        let (partial, error) = text.split_once("\n\n").expect("the open event is ended");
        assert_eq!(partial.len(), 6 + MAX_HELD_EVENT + 1);
        assert!(error.starts_with("event: error\ndata: "), "{error}");
        assert!(error.contains("first_token_timeout"));
        assert_eq!(
            probe.0.lock().unwrap().end.as_deref(),
            Some("first_token_timeout")
        );
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_partial_event_is_dropped_without_an_extra_blank_line() {
        let (mut tx, mut b, _probe) = body(true, limits(1000, 1000, 10_000));
        tx.send_data(Bytes::from_static(b"data: a\n\ndata: par"))
            .await
            .unwrap();
        let (out, _) = drain(&mut b).await;
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("data: a\n\nevent: error\n"), "{text}");
        drop(tx);
    }

    fn chat_body(l: StreamLimits) -> (Sender, TestBody, Probe) {
        let (tx, rx) = Channel::<Bytes, std::io::Error>::new(64);
        let probe = Probe::default();
        let inspector = Inspector::new(crate::provider::Format::Chat, true);
        let body = WatchdogBody::new(rx, true, l, probe.clone()).with_inspector(Some(inspector));
        (tx, Box::pin(body), probe)
    }

    const ROLE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
    const CONTENT: &str =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n";

    #[tokio::test(start_paused = true)]
    async fn with_a_known_format_the_first_token_is_the_first_output() {
        // The role preamble comes at once, the first content after 300 ms: that is the first
        // token, and the idle limit (100 ms) does not apply before it.
        let (tx, mut b, probe) = chat_body(limits(500, 100, 10_000));
        let start = Instant::now();
        let t = feeder(
            tx,
            vec![(10, ROLE), (290, CONTENT), (50, "data: [DONE]\n\n")],
        );
        tokio::spawn(async move { drop(t.await) });
        let (out, err) = drain(&mut b).await;
        assert!(err.is_none());
        assert_eq!(out, [ROLE, CONTENT, "data: [DONE]\n\n"].concat().as_bytes());
        drop(b);
        let seen = probe.0.lock().unwrap();
        assert_eq!(seen.end.as_deref(), Some("complete"));
        assert_eq!(seen.first_token, Some(start + ms(300)));
        let tokens = seen.tokens.expect("told on drop");
        assert_eq!((tokens.output_events, tokens.completion), (1, None));
    }

    #[tokio::test(start_paused = true)]
    async fn a_preamble_alone_does_not_satisfy_the_first_token_limit() {
        let (tx, mut b, probe) = chat_body(limits(500, 100, 10_000));
        let t = feeder(tx, vec![(10, ROLE)]);
        let start = Instant::now();
        let (out, _) = drain(&mut b).await;
        assert_eq!(Instant::now() - start, ms(500));
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(ROLE), "{text}");
        assert!(text.contains("\"code\":\"first_token_timeout\""));
        assert_eq!(
            probe.0.lock().unwrap().end.as_deref(),
            Some("first_token_timeout")
        );
        drop(t);
    }

    #[tokio::test(start_paused = true)]
    async fn after_the_first_token_any_data_event_moves_the_idle_limit() {
        let (tx, mut b, probe) = chat_body(limits(500, 100, 10_000));
        // Content, then non-output events 80 ms apart (each within the idle limit).
        let t = feeder(tx, vec![(10, CONTENT), (80, ROLE), (80, ROLE), (80, ROLE)]);
        let start = Instant::now();
        let (_, _) = drain(&mut b).await;
        assert_eq!(
            Instant::now() - start,
            ms(350),
            "idle counted from the last event"
        );
        assert_eq!(probe.0.lock().unwrap().end.as_deref(), Some("idle_timeout"));
        drop(t);
    }

    #[tokio::test(start_paused = true)]
    async fn an_openai_error_data_event_ends_the_stream_like_an_error_event() {
        let (tx, mut b, probe) = chat_body(limits(1000, 1000, 10_000));
        let error = "data: {\"error\":{\"message\":\"m\",\"type\":\"server_error\"}}\n\n";
        let chunk: &'static str =
            Box::leak(format!("{CONTENT}{error}data: never\n\n").into_boxed_str());
        let t = feeder(tx, vec![(5, chunk)]);
        let (out, err) = drain(&mut b).await;
        assert!(err.is_none());
        assert_eq!(
            out,
            [CONTENT, error].concat().as_bytes(),
            "nothing added, nothing after"
        );
        drop(b);
        let seen = probe.0.lock().unwrap();
        assert_eq!(seen.end.as_deref(), Some("upstream_error_event"));
        assert_eq!(
            seen.tokens.and_then(|t| t.error),
            Some(crate::provider::ErrorType::Server)
        );
        drop(t);
    }

    #[tokio::test(start_paused = true)]
    async fn a_json_body_is_read_for_its_usage() {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(64);
        let probe = Probe::default();
        let inspector = Inspector::new(crate::provider::Format::Messages, false);
        let mut b = Box::pin(
            WatchdogBody::new(rx, false, limits(1000, 1000, 10_000), probe.clone())
                .with_inspector(Some(inspector)),
        );
        for piece in [
            "{\"usage\":{\"input_",
            "tokens\":12,\"output_tokens\":3",
            "}}",
        ] {
            tx.send_data(Bytes::from_static(piece.as_bytes()))
                .await
                .unwrap();
        }
        drop(tx);
        drain(&mut b).await;
        drop(b);
        let t = probe.0.lock().unwrap().tokens.unwrap();
        assert_eq!((t.prompt, t.completion), (Some(12), Some(3)));
    }
}
