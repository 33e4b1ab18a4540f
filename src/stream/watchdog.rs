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
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::error::{BoxError, GatewayError, StreamErrorShape};
use crate::http::headers::strip_from_trailers;
use crate::provider::inspect::Inspector;
use crate::stream::limits::StreamLimits;
use crate::stream::observer::{Observer, StreamEnd};
use crate::stream::progress::Progress;
use crate::stream::reaper::{Reaped, ReapedBy, ReapedError};
use crate::stream::signal::{Signal, Waiter};
use crate::stream::timer::{recheck_at, Timer};

/// Why a stream whose framing ended cleanly failed all the same (see `Progress::ended_short`).
pub const ENDED_SHORT: &str = "the stream ended before the answer did";

/// Why a JSON document whose framing ended cleanly failed all the same: it ended inside a
/// value (see `Inspector::ended_short`).
pub const DOCUMENT_ENDED_SHORT: &str = "the JSON document ended before it was complete";

/// An event still incomplete after this many bytes is forwarded as it comes instead of held.
pub const MAX_HELD_EVENT: usize = 1 << 20;

/// An event of at most this many bytes that came in three pieces or more, of at most
/// `JOIN_PIECE` bytes on average, goes out as one frame (see `release_held`).
pub const JOIN_MAX: usize = 16 << 10;
pub const JOIN_PIECE: usize = 64;

/// How long the upstream's framing may take to end once the answer's final event came.
/// Servers end it with that event or in a write right behind it, so this covers a write and
/// a busy scheduler: a body that ends within it leaves its HTTP/1.1 connection to the pool
/// (dropped at the final event, it would be closed, as hyper hands over the body's end only
/// once the last frame was taken); one still open after it costs a new connection, never
/// the client a wait for the idle limit.
pub const END_GRACE: Duration = Duration::from_millis(250);

/// Whether the client's connection has taken the answer's end, where it can tell.
///
/// Over HTTP/2, hyper hands each frame to h2, which sends what the client's flow-control
/// window allows and keeps the rest; the body is done, and dropped with its record, once its
/// last frame was handed over, though most of a document may still wait in h2 (audit KC 1: a
/// 169 KB document was logged `ok` with every byte, then cut with 64 KB sent). But hyper
/// hands h2 a frame only once h2 has sent everything before it and has window for it, and
/// asks for the next frame only then. So the answer's last byte goes as a frame of its own,
/// and the body ends (and its record reports) when it is asked for a frame after that one:
/// the whole answer has gone out by then. One dropped before then was not delivered.
enum Delivery {
    /// Not tracked (HTTP/1: hyper drops a body framed by its length without asking again).
    Untracked,
    /// The answer's end has not come yet.
    Sending,
    /// The answer's last byte, held back to go out alone.
    Held(Bytes),
    /// The last byte was handed over; the next poll says h2 took it.
    Handed,
    /// Asked again after the last byte (or nothing held: the end came with no data).
    Delivered,
}

enum State {
    Streaming,
    /// A non-SSE body that must be aborted: the error is returned on the next poll. Boxed,
    /// as it is returned: inline it would size every open stream's body for this rare state.
    Failing(Box<GatewayError>),
    /// The upstream's trailers, the last frame, once what is ready has gone. Boxed for the
    /// same reason.
    Trailers(Box<HeaderMap>),
    Done,
}

/// What the body's size hint said when the watch began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Length {
    Unknown,
    Known,
    /// Exactly 0: the whole answer is its head.
    Zero,
}

pin_project! {
    pub struct WatchdogBody<B, O>
    where
        O: Observer,
    {
        #[pin]
        inner: Option<B>,
        // Boxed inside, so that the body is `Unpin` and can be read in place before it is
        // handed on (HTTP/1.0 answers are read whole to give them a length): one allocation
        // per stream, and the timer is still reset, never recreated.
        timer: Timer,
        limits: StreamLimits,
        // The last data event, from the first token on (`None` until then: before the first
        // token only the first-token limit applies, so a reasoning model may think in silence).
        last_progress: Option<Instant>,
        // Once the answer's final event came: when the upstream's framing must have ended,
        // the one limit left.
        end_by: Option<Instant>,
        // When bytes last went to the client, when its read timeout is known
        // (`StreamLimits::client_silence`): from the head on, any frame restarts its reads.
        // Moved as a frame is handed over (`hand_out`), never as one comes in: the bytes of a
        // half event held back reach no one, and a trickle of them must not keep the client
        // from hearing why it waits before its own timeout fires.
        last_out: Option<Instant>,
        // The limit (its due time) that was found expired late and given a turn to see
        // what the upstream sent meanwhile (`recheck_at`): once, so it fires next time.
        // Progress moves the due time, so a later stall gets its own look.
        rechecked: Option<Instant>,
        // Reads the body as it passes: where events end, what counts as a token and, when the
        // format is known, the usage and the provider's own errors.
        progress: Progress,
        sse: Option<Sse>,
        ready: VecDeque<Bytes>,
        state: State,
        // Whether the body has a length (its size hint is exact): its end can then be read
        // from the bytes left, before any END_STREAM. Known at the start, so that a stream
        // without one (the SSE case) asks nothing more per chunk.
        length: Length,
        observer: O,
        // Fires when the gateway gives up on in-flight streams at the end of its shutdown
        // grace; polled whenever the body waits, at the cost of an atomic load.
        shutdown: Option<Waiter>,
        // Asked when the body is dropped unfinished: whether the reaper took the upstream at
        // the deadline while nobody read.
        reaped: Option<ReapedBy>,
        delivery: Delivery,
    }

    impl<B, O> PinnedDrop for WatchdogBody<B, O>
    where
        O: Observer,
    {
        fn drop(this: Pin<&mut Self>) {
            // Before the observer itself is dropped (and reports), however the stream ended.
            let this = this.project();
            // What this stream added to its run's live count goes back: its call's end
            // counts what it really used.
            if let Some(run) = this.limits.run_tokens.as_mut() {
                if let Some(live) = &run.live {
                    live.sub(std::mem::take(&mut run.added));
                }
            }
            // An answer of length 0 is whole with its head: hyper writes `content-length: 0`
            // and never polls the body, which would otherwise look abandoned by the client.
            if matches!(this.state, State::Streaming)
                && *this.length == Length::Zero
                && this.sse.is_none()
            {
                this.observer.finish(StreamEnd::Complete);
            } else if let (State::Streaming, Some(why @ (Reaped::Deadline | Reaped::Shutdown))) =
                (&this.state, this.reaped.as_ref().and_then(ReapedBy::get))
            {
                // The client left without reading again after the reaper ended the upstream
                // call at the deadline or at the shutdown's cut: that ended the stream, as it
                // would have told a reader (`poll_frame`), not the client's departure (audit
                // AD 2: a client not reading at the cut was counted `origin="client"`).
                let err = match why {
                    Reaped::Shutdown => GatewayError::Shutdown,
                    _ => this.limits.deadline_error(),
                };
                let end = if this.progress.error_pending() {
                    StreamEnd::UpstreamErrorEvent
                } else if this.progress.answer_ended() {
                    whole_end(this.progress, err.code())
                } else {
                    StreamEnd::Cut(err)
                };
                this.observer.finish(end);
            } else if matches!(this.state, State::Streaming)
                && matches!(
                    this.reaped.as_ref().and_then(ReapedBy::get),
                    Some(Reaped::Stalled(_))
                )
            {
                // The client took nothing for `send_timeout` and left without reading again
                // (the usual end of such a stream): `send_timeout` ended it, as when it reads
                // again and finds it aborted (`poll_frame`), not the client's departure.
                this.observer.finish(StreamEnd::SendTimeout);
            } else if matches!(this.state, State::Streaming)
                && this.ready.is_empty()
                && this.progress.answer_ended()
                && !this.progress.error_pending()
            {
                // The client left with the answer whole, all of it handed over, while the
                // rest of the stream was still waited for: the upstream's framing after
                // `[DONE]` (`END_GRACE`), a usage chunk. Its leaving stopped only that rest,
                // as a limit would have, and cancelled nothing (audit XA 1). Over HTTP/2 the
                // answer's end is still confirmed below, as its last byte went alone.
                let end = whole_end(this.progress, GatewayError::ClientClosed.code());
                this.observer.finish(end);
            }
            if matches!(this.delivery, Delivery::Held(_) | Delivery::Handed) {
                // The connection ended before h2 took the answer's end.
                this.observer.undelivered();
            }
            if let Some(tokens) = this.progress.tokens() {
                this.observer.tokens(tokens);
                this.observer.tool_calls(this.progress.tool_calls());
            }
            this.observer.provider_error(this.progress.error_type());
        }
    }
}

impl<B, O> WatchdogBody<B, O>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    O: Observer,
{
    /// Watches `inner`, an SSE body (`is_sse`) or any other, of a format the gateway does
    /// not read; see [`WatchdogBody::with_inspector`].
    pub fn new(inner: B, is_sse: bool, limits: StreamLimits, observer: O) -> Self {
        Self::reading(inner, Progress::new(is_sse, None), limits, observer)
    }

    /// Watches `inner`, read by `progress` (which knows whether it is SSE and its format).
    pub fn reading(inner: B, progress: Progress, limits: StreamLimits, observer: O) -> Self {
        let last_out = limits.client_silence.map(|_| Instant::now());
        let first_due = match (limits.client_silence, last_out) {
            (Some(s), Some(at)) => limits.first_token_deadline.min(at + s),
            _ => limits.first_token_deadline,
        }
        .min(limits.deadline);
        let sse = progress.is_sse().then(|| Sse::new(progress.error_shape()));
        let length = match inner.size_hint().exact() {
            None => Length::Unknown,
            Some(0) => Length::Zero,
            Some(_) => Length::Known,
        };
        Self {
            inner: Some(inner),
            timer: Timer::new(first_due),
            limits,
            last_progress: None,
            end_by: None,
            last_out,
            rechecked: None,
            progress,
            sse,
            ready: VecDeque::new(),
            state: State::Streaming,
            length,
            observer,
            shutdown: None,
            reaped: None,
            delivery: Delivery::Untracked,
        }
    }

    /// The answer is over only once the client's connection took its end (see `Delivery`):
    /// for an HTTP/2 stream.
    pub fn confirm_delivery(&mut self) {
        self.delivery = Delivery::Sending;
    }

    /// Whether the answer's end is confirmed (`confirm_delivery`).
    pub fn confirms_delivery(&self) -> bool {
        !matches!(self.delivery, Delivery::Untracked)
    }

    /// Cuts the stream (origin `shutdown`, with the error event) when `signal` fires.
    pub fn watch_shutdown(&mut self, signal: &Signal) {
        self.shutdown = Some(signal.waiter());
    }

    /// Counts a stream whose client leaves after `reaped` says the reaper took the upstream
    /// at the deadline as ended by the deadline (see `stream::reaper`).
    pub fn watch_reaper(&mut self, reaped: ReapedBy) {
        self.reaped = Some(reaped);
    }

    /// Puts frames already read from this body back in front of what it yields next.
    pub fn unread(&mut self, frames: impl IntoIterator<Item = Bytes>) {
        let mut ready: VecDeque<Bytes> = frames.into_iter().collect();
        ready.append(&mut self.ready);
        self.ready = ready;
        // They are still to go out, and their end to be delivered.
        if self.confirms_delivery() {
            self.delivery = Delivery::Sending;
        }
    }

    /// The answer has no content (a HEAD's, a 204's, a 304's), whatever length its head gives:
    /// it is whole with its head.
    pub fn no_content(&mut self) {
        self.length = Length::Zero;
    }

    /// A limit or failure that cuts the stream ends it with an error (the `GatewayError`,
    /// boxed) rather than an SSE error event: for a body the gateway reads itself.
    pub fn fail_on_cut(&mut self) {
        if let Some(sse) = self.sse.as_mut() {
            sse.fail = true;
        }
    }

    /// The body is NDJSON (not SSE): a line incomplete at a frame's end is held as an SSE
    /// event is, and a cut ends the body with an error line of its own (Ollama's shape, see
    /// `StreamErrorShape::Line`) instead of aborting it, which left the client a broken body
    /// and no reason (audit WB 7). Its limits are those of any non-SSE body. The head must
    /// then give no length: the body may gain that line.
    pub fn ndjson_lines(&mut self) {
        if self.sse.is_none() {
            self.sse = Some(Sse::new(StreamErrorShape::Line));
        }
    }

    /// The reader of the body, to take what it gathered once the body is done.
    pub fn progress_mut(&mut self) -> &mut Progress {
        &mut self.progress
    }

    /// The limits the body is read under, to answer as they would a cut that came from
    /// elsewhere (a gateway further down the chain).
    pub fn limits(&self) -> &StreamLimits {
        &self.limits
    }

    /// The observer, to note what the caller did with the body (an answer sent instead).
    pub fn observer_mut(&mut self) -> &mut O {
        &mut self.observer
    }

    /// Reads the body with `inspector` (for a response whose format is known): on an SSE
    /// body the first token becomes the first event carrying model output, and the
    /// provider's data-only error event ends the stream as an `event: error` does.
    pub fn with_inspector(mut self, inspector: Option<Inspector>) -> Self {
        let sse = self.sse.as_ref().is_some_and(|s| !s.lines());
        self.progress = Progress::new(sse, inspector);
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
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let delivery = self.as_mut().project().delivery;
        match std::mem::replace(delivery, Delivery::Delivered) {
            // The answer's last byte, as a frame of its own.
            Delivery::Held(last) => {
                *delivery = Delivery::Handed;
                return Poll::Ready(Some(Ok(Frame::data(last))));
            }
            // Asked again after it: h2 has taken it, so everything before it went out
            // (the body's end, or its trailers, follow).
            Delivery::Handed | Delivery::Delivered => {}
            d @ (Delivery::Untracked | Delivery::Sending) => *delivery = d,
        }
        let polled = self.as_mut().poll_answer(cx);
        let this = self.project();
        if let (Delivery::Sending, Poll::Ready(Some(Ok(frame)))) = (&*this.delivery, &polled) {
            // The body's last frame, or the last of an answer that has ended: a client that
            // leaves while the rest of the stream is waited for had it whole only once h2
            // took its end (see `PinnedDrop`).
            let last = this.ready.is_empty()
                && (matches!(this.state, State::Done | State::Trailers(_))
                    || this.progress.answer_ended());
            if let (true, Some(data)) = (last, frame.data_ref()) {
                match data.len() {
                    0 => {}
                    // One byte in all: it is the last frame.
                    1 => *this.delivery = Delivery::Handed,
                    n => {
                        let mut data = data.clone();
                        *this.delivery = Delivery::Held(data.split_off(n - 1));
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
            && self.ready.is_empty()
            && !matches!(self.delivery, Delivery::Held(_) | Delivery::Handed)
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.inner, &self.sse) {
            // Only a raw body passes through byte for byte; an SSE body may gain an event.
            // What was read and given back (`unread`) is still to come.
            (Some(inner), None) => with_held(inner.size_hint(), &self.ready),
            _ => SizeHint::default(),
        }
    }
}

impl<B, O> WatchdogBody<B, O>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    O: Observer,
{
    /// The answer's frames, under the limits (what `poll_frame` is but for `Delivery`).
    fn poll_answer(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        // Every cut of the answer ends the same parts of this body.
        macro_rules! cut_here {
            ($err:expr) => {
                cut(
                    this.inner.as_mut(),
                    this.sse,
                    this.ready,
                    this.state,
                    this.observer,
                    this.progress,
                    $err,
                )
            };
        }
        // The shutdown's cut: seen by the body's own waiter, or as the reaper's error when it
        // took the upstream first (the client was not reading at the cut).
        macro_rules! shut_here {
            () => {{
                if this.progress.error_pending() {
                    end_after_error(this.inner.as_mut(), this.state, this.observer);
                } else if this.progress.answer_ended() {
                    end_whole(
                        this.inner.as_mut(),
                        this.sse,
                        this.state,
                        this.observer,
                        whole_end(this.progress, GatewayError::Shutdown.code()),
                    );
                } else {
                    cut_here!(GatewayError::Shutdown);
                }
                continue;
            }};
        }
        loop {
            if let Some(b) = this.ready.pop_front() {
                return hand_out(this.last_out, this.observer, b);
            }
            match std::mem::replace(this.state, State::Done) {
                State::Done => return Poll::Ready(None),
                State::Failing(e) => return Poll::Ready(Some(Err(e))),
                State::Trailers(t) => return Poll::Ready(Some(Ok(Frame::trailers(*t)))),
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
                        Err(frame) => {
                            // Trailers end the body, and hyper's servers drop it once they
                            // have them, without polling again: its end is judged now, as
                            // any end is, before anything held goes out. An answer cut short
                            // ends with the error event, which the trailers cannot follow.
                            let whole = end_of_body(
                                this.inner.as_mut(),
                                this.sse,
                                this.ready,
                                this.state,
                                this.observer,
                                this.progress,
                                this.limits,
                                *this.length,
                            );
                            if let (true, Ok(mut trailers)) = (whole, frame.into_trailers()) {
                                // HTTP/2 refuses to send a connection-specific field, and
                                // clients reset a stream whose trailers frame it: either
                                // way, a reset after a complete answer.
                                strip_from_trailers(&mut trailers);
                                if !trailers.is_empty() {
                                    *this.state = State::Trailers(Box::new(trailers));
                                }
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
                    // Over HTTP/2 the END_STREAM may follow in an empty frame of its own
                    // (Go's server sends one): the length, all of it read, says so first.
                    let sized = *this.length != Length::Unknown;
                    let ended = this.inner.as_ref().as_pin_ref().is_some_and(|b| {
                        b.is_end_stream() || (sized && b.size_hint().exact() == Some(0))
                    });
                    let mut read = this.progress.read(&data);
                    if this.sse.as_ref().is_some_and(Sse::lines) {
                        // An NDJSON body's records end at its line ends.
                        read.boundary = memchr::memrchr(b'\n', &data).map(|i| i + 1);
                    }
                    // An event the client did not ask for (UC 3: the usage chunk the gateway's
                    // `include_usage` added) goes no further. It is held until whole, as any
                    // event is, so it is dropped whole; one of which some part already went
                    // (past `MAX_HELD_EVENT`) passes.
                    let (data, read) = match (read.left_out, this.sse.as_mut()) {
                        (Some(event), Some(sse)) if event.start.is_some() || !sse.partial_sent => {
                            leave_out(sse, this.ready, data, read, event)
                        }
                        _ => (data, read),
                    };
                    if this.progress.ended_early() {
                        // `[DONE]` came before the answer ended (audit WB 1): the client's
                        // SDK stops reading at it, so an error written after it was never
                        // seen. The marker was left out above; what came before it is ready,
                        // and the error event goes in its place, the upstream closed now.
                        let err = GatewayError::UpstreamError {
                            upstream: this.limits.upstream.to_string(),
                            reason: ENDED_SHORT.to_owned(),
                        };
                        cut_here!(err);
                        continue;
                    }
                    if let Some(err) = run_tokens_spent(this.progress, this.limits) {
                        // The frame's whole events came and are paid for: they go out
                        // before the error event, as a ready frame wins over any limit.
                        // Only the half event after them is dropped.
                        if read.output {
                            mark_progress(
                                this.last_progress,
                                this.observer,
                                this.timer,
                                this.limits,
                            );
                        }
                        if let (Some(sse), Some(end)) = (this.sse.as_mut(), read.boundary) {
                            sse.partial_sent = false;
                            release_held(sse, this.ready, data.slice(..end));
                        }
                        cut_here!(err);
                        continue;
                    }
                    let Some(sse) = this.sse.as_mut() else {
                        // Any byte, but a document's leading whitespace (`Progress::read`).
                        if read.output {
                            mark_progress(
                                this.last_progress,
                                this.observer,
                                this.timer,
                                this.limits,
                            );
                        }
                        if ended {
                            this.inner.set(None);
                            this.observer.finish(StreamEnd::Complete);
                            *this.state = State::Done;
                        }
                        return hand_out(this.last_out, this.observer, data);
                    };
                    // The first token starts the idle limit; after it, every data event
                    // (output or not) moves it, keep-alives aside (`Read::events`).
                    if read.output || (read.events > 0 && this.last_progress.is_some()) {
                        mark_progress(this.last_progress, this.observer, this.timer, this.limits);
                    }
                    // Nothing of the answer is left to come, and the framing's end follows at
                    // once from any upstream worth pooling; one that holds the body open is
                    // not waited for until a limit calls the whole answer an error. Nor is the
                    // byte after the CR that ended the upstream's error event (an LF or not):
                    // worth a moment's wait, since it goes to the client, not the idle limit's.
                    if (this.end_by.is_none() && this.progress.answer_over())
                        || this.progress.error_pending()
                    {
                        let limits = &*this.limits;
                        let by = (Instant::now() + END_GRACE.min(limits.idle_timeout))
                            .min(limits.deadline);
                        *this.end_by = Some(by);
                        this.timer.reset(by);
                    }
                    if read.error_end.is_some() {
                        // The upstream's own error event ends the stream; Hourglass adds none
                        // of its own after it (see `error_field::pass`).
                        error_field::pass(
                            this.sse,
                            this.ready,
                            this.observer,
                            this.progress,
                            this.limits,
                            &data,
                            read,
                        );
                        this.inner.set(None);
                        this.observer.finish(StreamEnd::UpstreamErrorEvent);
                        *this.state = State::Done;
                        continue;
                    }
                    match read.boundary {
                        // The common case, a frame of whole events with nothing held
                        // before it, goes straight out (`ready` is always empty when the
                        // inner body is polled, unless an event was left out of it).
                        Some(end)
                            if end == data.len()
                                && end > 0
                                && sse.held.is_empty()
                                && this.ready.is_empty()
                                && !ended =>
                        {
                            sse.partial_sent = false;
                            return hand_out(this.last_out, this.observer, data);
                        }
                        Some(end) => {
                            sse.partial_sent = false;
                            if end == data.len() {
                                release_held(sse, this.ready, data);
                            } else {
                                release_held(sse, this.ready, data.slice(..end));
                                sse.held_len = data.len() - end;
                                sse.held.push(data.slice(end..));
                            }
                        }
                        // An event already past the limit goes on as it comes: held again,
                        // its rest would wait for another MiB (or its end).
                        None if sse.partial_sent => this.ready.push_back(data),
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
                        end_of_body(
                            this.inner.as_mut(),
                            this.sse,
                            this.ready,
                            this.state,
                            this.observer,
                            this.progress,
                            this.limits,
                            *this.length,
                        );
                    }
                }
                Poll::Ready(Some(Err(_))) if this.progress.error_pending() => {
                    // The client already has the upstream's error event whole; a failure
                    // while waiting to see whether an LF completes its line end adds nothing.
                    end_after_error(this.inner.as_mut(), this.state, this.observer);
                }
                Poll::Ready(Some(Err(e))) => {
                    let e: BoxError = e.into();
                    if let Some(ReapedError {
                        why: Reaped::Shutdown,
                        ..
                    }) = e.downcast_ref::<ReapedError>()
                    {
                        shut_here!();
                    }
                    if let Some(ReapedError {
                        why: Reaped::Stalled(_),
                        ..
                    }) = e.downcast_ref::<ReapedError>()
                    {
                        // The client took nothing for `send_timeout` and its upstream call is
                        // gone. It is aborted as an HTTP/1 client's connection is closed
                        // (an HTTP/2 stream is reset), and counted as that is (it was counted
                        // as the client's leaving).
                        this.inner.set(None);
                        *this.state = State::Done;
                        this.observer.finish(StreamEnd::SendTimeout);
                        return Poll::Ready(Some(Err(e)));
                    }
                    // Past the deadline, the deadline is why the upstream is gone (the reaper
                    // drops it there when nobody was reading).
                    let past = Instant::now() >= this.limits.deadline;
                    if this.progress.answer_ended() {
                        let code = if past {
                            this.limits.deadline_error().code()
                        } else {
                            "upstream_error"
                        };
                        let end = whole_end(this.progress, code);
                        end_whole(
                            this.inner.as_mut(),
                            this.sse,
                            this.state,
                            this.observer,
                            end,
                        );
                        continue;
                    }
                    let err = if past {
                        this.limits.deadline_error()
                    } else {
                        GatewayError::UpstreamError {
                            upstream: this.limits.upstream.to_string(),
                            reason: crate::error::with_causes(&*e),
                        }
                    };
                    cut_here!(err);
                }
                Poll::Ready(None) => {
                    end_of_body(
                        this.inner.as_mut(),
                        this.sse,
                        this.ready,
                        this.state,
                        this.observer,
                        this.progress,
                        this.limits,
                        *this.length,
                    );
                }
                Poll::Pending => {
                    if let Some(s) = this.shutdown.as_mut() {
                        if s.poll_fired(cx).is_ready() {
                            shut_here!();
                        }
                    }
                    if this.timer.poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    if this.progress.error_pending() {
                        // The upstream's error event went out whole; it sent no byte after
                        // its CR to say whether an LF follows. Never a second error event.
                        end_after_error(this.inner.as_mut(), this.state, this.observer);
                        continue;
                    }
                    let limits = &*this.limits;
                    let data_due = match (*this.end_by, *this.last_progress) {
                        (Some(by), _) => by,
                        (None, None) => limits.first_token_deadline,
                        (None, Some(t)) => t + limits.idle_timeout,
                    }
                    .min(limits.deadline);
                    // The client's own read timeout, which keep-alives satisfy too.
                    let client_due = match (*this.end_by, limits.client_silence, *this.last_out) {
                        (None, Some(s), Some(at)) => Some(at + s),
                        _ => None,
                    };
                    let due = client_due.map_or(data_due, |c| c.min(data_due));
                    let now = Instant::now();
                    if now < due {
                        // Progress moved the idle limit since the timer was armed.
                        this.timer.reset(due);
                        continue;
                    }
                    if now < limits.deadline && *this.rechecked != Some(due) {
                        if let Some(at) = recheck_at(due, now) {
                            // Checked late, the gateway itself stalled: what the upstream
                            // sent on time may wait in the socket for its connection's
                            // task, so that task gets a turn before the upstream is blamed.
                            *this.rechecked = Some(due);
                            this.timer.reset(at.min(limits.deadline));
                            continue;
                        }
                    }
                    // Whichever limit it is, the stream was silent: its HTTP/2 connection
                    // takes no new streams if it read nothing at all, from any stream, for
                    // the route's idle limit (audit RA 5). Asked before the body (and its
                    // place on the connection) is dropped below.
                    if let Some(connection) = &limits.connection {
                        connection.retire_if_silent(limits.idle_timeout);
                    }
                    let upstream = limits.upstream.to_string();
                    // The limit that ran out: the client's silence, when it was first.
                    let client_first = match limits.client_silence {
                        Some(s) if now < data_due => Some(s),
                        _ => None,
                    };
                    let err = if now >= limits.deadline {
                        limits.deadline_error()
                    } else if this.end_by.is_some() && !this.progress.answer_ended() {
                        // The final event came (`[DONE]`, `message_stop`) and the answer
                        // was not whole by it: short, as it would be had the framing ended.
                        GatewayError::UpstreamError {
                            upstream,
                            reason: ENDED_SHORT.to_owned(),
                        }
                    } else if this.last_progress.is_none() {
                        match client_first {
                            Some(s) => GatewayError::FirstTokenTimeout {
                                upstream,
                                after: s,
                                patience: true,
                            },
                            None => limits.first_token_error(),
                        }
                    } else {
                        GatewayError::IdleTimeout {
                            upstream,
                            after: client_first.unwrap_or(limits.idle_timeout),
                            patience: client_first.is_some(),
                        }
                    };
                    if this.progress.answer_ended() {
                        let end = whole_end(this.progress, err.code());
                        end_whole(
                            this.inner.as_mut(),
                            this.sse,
                            this.state,
                            this.observer,
                            end,
                        );
                        continue;
                    }
                    cut_here!(err);
                }
            }
        }
    }
}

/// Hands `data` to the client, whose reads it restarts. The one place bytes leave, so what
/// the observer is told here is exactly the client's body: what came in is more by the held
/// bytes a cut or the answer's end drops.
#[inline]
fn hand_out<O: Observer>(
    last_out: &mut Option<Instant>,
    observer: &mut O,
    data: Bytes,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    if let Some(at) = last_out.as_mut() {
        *at = Instant::now();
    }
    observer.handed(data.len());
    Poll::Ready(Some(Ok(Frame::data(data))))
}

/// A body's size hint with the bytes read ahead of it and held to be sent first (`held`).
pub fn with_held(inner: SizeHint, held: &VecDeque<Bytes>) -> SizeHint {
    let held: u64 = held.iter().map(|b| b.len() as u64).sum();
    let mut hint = SizeHint::new();
    hint.set_lower(inner.lower() + held);
    if let Some(upper) = inner.upper() {
        hint.set_upper(upper + held);
    }
    hint
}

/// Notes a data event. The first one moves the timer from the first-token limit to the idle
/// limit, which may be earlier, so it is re-armed now; later events only move the idle limit
/// later, which the timer catches up with lazily when it fires.
fn mark_progress<O: Observer>(
    last: &mut Option<Instant>,
    observer: &mut O,
    timer: &mut Timer,
    limits: &StreamLimits,
) {
    let now = Instant::now();
    if last.is_none() {
        observer.first_token(now);
        // The client's read timeout, restarted by this frame, may come before the idle
        // limit: the timer must not be late for it (later frames only move both on).
        let quiet = limits
            .client_silence
            .map_or(limits.idle_timeout, |s| s.min(limits.idle_timeout));
        timer.reset((now + quiet).min(limits.deadline));
    }
    *last = Some(now);
}

/// The upstream body ended by itself (its framing said so). An SSE stream that ended short
/// (half an event held, or an answer of a known format without its end) is an upstream
/// failure like a reset, never a silent truncation: the half event is dropped and the error
/// event follows. Otherwise what was held goes out and the stream is complete (or ended
/// with the upstream's error event, if one was still waiting for the byte after its CR).
/// Returns false when the stream was cut.
// The watchdog's own fields, as its projection hands them out.
#[allow(clippy::too_many_arguments)]
fn end_of_body<B: Body, O: Observer>(
    inner: Pin<&mut Option<B>>,
    sse: &mut Option<Sse>,
    ready: &mut VecDeque<Bytes>,
    state: &mut State,
    observer: &mut O,
    progress: &Progress,
    limits: &StreamLimits,
    length: Length,
) -> bool {
    if progress.error_pending() {
        flush_held(sse, ready);
        end_after_error(inner, state, observer);
        return true;
    }
    // hyper's HTTP/2 client reads an upstream's RST_STREAM or GOAWAY with NO_ERROR (or
    // CANCEL) as the body's end wherever it comes, and does not hold that end to the
    // content-length: a truncated answer went on as a whole one (RFC 9113 8.1: a response
    // is complete only with its END_STREAM). Its HTTP/1.1 client fails such a body itself.
    let missing = match length {
        Length::Known => inner
            .as_ref()
            .as_pin_ref()
            .and_then(|b| b.size_hint().exact())
            .unwrap_or(0),
        Length::Unknown | Length::Zero => 0,
    };
    if missing > 0 && !(sse.is_some() && progress.answer_ended()) {
        let err = GatewayError::UpstreamError {
            upstream: limits.upstream.to_string(),
            reason: format!("the answer ended {missing} bytes before its content-length"),
        };
        cut(inner, sse, ready, state, observer, progress, err);
        return false;
    }
    if progress.ended_short() {
        if sse.is_some() && progress.answer_ended() {
            // Ended cleanly, only without the stream's own end marker: nothing to say.
            end_whole(inner, sse, state, observer, StreamEnd::Complete);
            return true;
        }
        let reason = match sse {
            Some(sse) if !sse.lines() => ENDED_SHORT,
            _ => DOCUMENT_ENDED_SHORT,
        };
        let err = GatewayError::UpstreamError {
            upstream: limits.upstream.to_string(),
            reason: reason.to_owned(),
        };
        cut(inner, sse, ready, state, observer, progress, err);
        return false;
    }
    flush_held(sse, ready);
    let mut inner = inner;
    inner.set(None);
    observer.finish(StreamEnd::Complete);
    *state = State::Done;
    true
}

/// The answer had ended when something else stopped the stream (a limit, a failure, a
/// shutdown, the wait for the framing's end after the final event, half an event after it):
/// it ends whole, with no error after it, and counts as complete. What was held after the
/// answer's end is dropped, so the client never gets half an event; of one already past
/// `MAX_HELD_EVENT`, the client's parser drops the undispatched rest at the body's end.
fn end_whole<B, O: Observer>(
    mut inner: Pin<&mut Option<B>>,
    sse: &mut Option<Sse>,
    state: &mut State,
    observer: &mut O,
    end: StreamEnd,
) {
    inner.set(None);
    if let Some(sse) = sse {
        sse.held.clear();
        sse.held_len = 0;
        sse.partial_sent = false;
    }
    observer.finish(end);
    *state = State::Done;
}

/// How an answer that had ended ends when `code` (a limit, a failure, a shutdown) stopped
/// its stream: complete, with the code for the log, unless its final event had come and only
/// the framing's end was waited for, briefly: then nothing ended it but the answer itself.
fn whole_end(progress: &Progress, code: &'static str) -> StreamEnd {
    if progress.answer_over() {
        StreamEnd::Complete
    } else {
        StreamEnd::WholeThen(code)
    }
}

/// The upstream's error event went out, all but the answer to whether an LF follows the CR
/// that ended it: the stream ends on the next byte or when the body ends, and whatever ends
/// it, it ended with the upstream's error.
fn end_after_error<B, O: Observer>(
    mut inner: Pin<&mut Option<B>>,
    state: &mut State,
    observer: &mut O,
) {
    inner.set(None);
    observer.finish(StreamEnd::UpstreamErrorEvent);
    *state = State::Done;
}

/// The run's token limit, once what this answer used (the prompt as reported or estimated,
/// the completion as reported or estimated) passes what its run left it.
#[inline]
fn run_tokens_spent(progress: &Progress, limits: &mut StreamLimits) -> Option<GatewayError> {
    let run = limits.run_tokens.as_mut()?;
    // The usage that follows a whole answer (a Chat usage chunk) is spent already: a cut
    // would save nothing, and only turn a whole answer into an error.
    if progress.answer_ended() {
        return None;
    }
    let t = progress.tokens()?;
    let used = t
        .prompt()
        .unwrap_or(run.prompt_estimate)
        .saturating_add(t.completion().0);
    // The run's other streams use tokens too, beyond what they reserved (audit KE 1): what
    // this one used is added to the run's live count, and the run's total read back in the
    // same operation, only when it changed (one atomic operation a chunk at most).
    let run_over = match &run.live {
        Some(live) if used != run.added => {
            // Saturating both ways: a count wrapped past u64::MAX would read as tokens left.
            let total = if used > run.added {
                live.add(used - run.added)
            } else {
                live.sub(run.added - used)
            };
            run.added = used;
            total > run.limit
        }
        _ => false,
    };
    (used > run.allowance || run_over).then(|| GatewayError::RunTokensSpent {
        run: run.run.to_string(),
        limit: run.limit,
    })
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
    progress: &Progress,
    err: GatewayError,
) {
    inner.set(None);
    observer.finish(StreamEnd::Cut(err.clone()));
    match sse {
        Some(sse) if sse.fail => {
            sse.held.clear();
            sse.held_len = 0;
            *state = State::Failing(Box::new(err));
        }
        Some(sse) => {
            sse.held.clear();
            sse.held_len = 0;
            let mut written = 0;
            if std::mem::take(&mut sse.partial_sent) {
                // "\n\n" ends any line (even one whose CR already went out) and then the
                // block: the truncated event is dispatched as it stands, and the error event
                // that follows is one of its own. An NDJSON line needs only its end.
                let end: &'static [u8] = if sse.lines() { b"\n" } else { b"\n\n" };
                ready.push_back(Bytes::from_static(end));
                written += end.len();
            } else if progress.ends_in_blank_cr() {
                // The client's last byte is the CR of a blank line whose LF never came (a
                // CRLF upstream that stalled between them; audit PB 1). The LF goes first:
                // the standard reads it as the rest of that CRLF, so no line or event is
                // added, and readers that know only `\r\n\r\n`, `\n\n` and `\r\r` as block
                // ends (sseclient-py) see the block end instead of merging the last event
                // into the error event.
                ready.push_back(Bytes::from_static(b"\n"));
                written += 1;
            }
            let event = err.stream_error(sse.shape, progress.next_sequence_number());
            written += event.len();
            ready.push_back(event);
            // Written for the client, though no byte of the upstream's: the log line's
            // `bytes` counts them.
            observer.own_data(written);
            *state = State::Done;
        }
        None => *state = State::Failing(Box::new(err)),
    }
}

mod error_field;
mod held;
use held::{drop_event, flush_held, leave_out, release_held, Sse};
#[cfg(test)]
mod tests;
