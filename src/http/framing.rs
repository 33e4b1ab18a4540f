//! HTTP/1 request framing, followed as the client's bytes arrive, for the one fact hyper's
//! parser does not pass on: that a request head carried both `Content-Length` and
//! `Transfer-Encoding`.
//!
//! hyper 1 reads such a request as chunked (RFC 9112 6.1 lets the coding win), drops the
//! length from the headers it hands over (whichever line came first) and closes the
//! connection after the answer. RFC 9112 6.3 allows that, but the edges most trusted against
//! request smuggling refuse such a request outright (nginx since 1.21.1, Envoy by default),
//! and so does Hourglass: the service cannot see the dropped length, so it is seen here, on
//! the bytes on their way to hyper.
//!
//! [`FramingIo`] wraps the connection's read side and follows every byte read: request heads
//! line by line (a line that arrived whole is found with `memchr` and its name compared with
//! the two; one split across reads goes byte by byte, to the same result), then each body
//! exactly as hyper frames it (a length skipped in one step; chunk sizes, extensions and
//! trailers followed byte by byte, chunk data skipped), so that bytes in a body are never
//! taken for a head. It keeps no buffer and allocates nothing. A 650-byte head of the
//! openai-python SDK costs it about 2,100 instructions (callgrind), half of them in `memchr`;
//! a non-streaming request through the gateway costs about 98,000 in all. Heads are numbered as they complete; the
//! number of the first ambiguous one goes to [`Framing`], which the service asks once per
//! request, in order, since hyper serves a connection's requests one after another.
//!
//! When the bytes are not framing hyper would accept, the tracker stops: hyper answers 400
//! and closes the connection itself. It also stops after an ambiguous head, after which hyper
//! reads no further request on the connection. If the tracker and hyper could ever disagree,
//! the failure is safe either way: a missed head leaves hyper's own (permitted) reading, and a
//! head wrongly flagged would have to carry `Transfer-Encoding` to be refused (see
//! [`Framing::next_request_is_ambiguous`]).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use memchr::{memchr, memchr_iter};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Put on a request whose head carried both `Content-Length` and `Transfer-Encoding`.
#[derive(Debug, Clone, Copy)]
pub struct AmbiguousFraming;

/// What one connection's tracker found, read by its service. One connection task polls both
/// hyper's reads and the service, so relaxed ordering suffices.
#[derive(Debug, Default)]
pub struct Framing {
    /// The number (from 1) of the head that carried both headers; 0 for none.
    ambiguous: AtomicU64,
    /// Requests the service has been handed so far.
    served: AtomicU64,
    /// The bytes read so far end inside a message (a head, a body, or framing hyper
    /// refuses): a connection closed now leaves the client sending.
    mid_message: AtomicBool,
}

impl Framing {
    /// Whether the client's bytes so far end inside a message: closed now, the connection
    /// would leave the client sending (an answer made before the body was read, a head
    /// hyper refused).
    pub fn mid_message(&self) -> bool {
        self.mid_message.load(Ordering::Relaxed)
    }

    /// Called once for every request hyper hands the service, in order: whether its head
    /// carried both headers. hyper can only hand over a head it has read, through the
    /// tracker, so the answer is known by then.
    pub fn next_request_is_ambiguous(&self) -> bool {
        let n = self.served.fetch_add(1, Ordering::Relaxed) + 1;
        self.ambiguous.load(Ordering::Relaxed) == n
    }
}

const CONTENT_LENGTH: &[u8] = b"content-length";
const TRANSFER_ENCODING: &[u8] = b"transfer-encoding";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between messages: empty lines are skipped, as httparse does.
    Idle,
    /// The rest of a line that does not matter (the request line, most header lines).
    Skip,
    /// A header line's name, `at` bytes in; `cl`/`te`: those bytes still spell the start of
    /// `content-length` / `transfer-encoding`.
    Name {
        at: u8,
        cl: bool,
        te: bool,
    },
    /// A CR at the start of a line: the head ends at its LF.
    EmptyLineLf,
    /// A `Content-Length` value: its digits so far, and whether whitespace followed them.
    ContentLength {
        value: Option<u64>,
        done: bool,
    },
    /// A body of known length: bytes still to come.
    Body(u64),
    /// A chunked body, state for state as hyper's decoder reads it.
    ChunkSize {
        size: u64,
        digits: bool,
    },
    ChunkSizeLws {
        size: u64,
    },
    ChunkExtension {
        size: u64,
    },
    ChunkSizeLf {
        size: u64,
    },
    ChunkData(u64),
    ChunkDataCr,
    ChunkDataLf,
    /// After the last chunk's size line, and after each trailer line.
    TrailerStart,
    Trailer,
    TrailerLf,
    EndLf,
    /// Nothing more is followed (see the module documentation).
    Stopped,
}

/// The `Content-Length` lines of the head being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Length {
    None,
    /// One value (repeated lines all equal, which hyper merges).
    Value(u64),
    /// Lines hyper refuses (unless a `Transfer-Encoding` came first, when it ignores them):
    /// malformed, or two different values.
    Bad,
}

/// The framing tracker of one connection.
#[derive(Debug)]
struct Tracker {
    state: State,
    /// Heads completed so far.
    heads: u64,
    /// The current head's `Content-Length` lines, and whether it had `Transfer-Encoding`.
    length: Length,
    chunked: bool,
    /// Empty-line bytes (CR, LF) read between messages since the last other byte, in the
    /// current read: when the read ends between messages, its last `idle_run` bytes are
    /// such bytes, which a server ignores (RFC 9112 2.2).
    idle_run: usize,
}

impl Tracker {
    fn new() -> Tracker {
        Tracker {
            state: State::Idle,
            idle_run: 0,
            heads: 0,
            length: Length::None,
            chunked: false,
        }
    }

    const LINE_START: State = State::Name {
        at: 0,
        cl: true,
        te: true,
    };

    /// Follows `bytes`, the next ones read from the client. Returns the number of a head that
    /// carried both headers, when one completed in them.
    fn feed(&mut self, mut bytes: &[u8]) -> Option<u64> {
        use State::*;
        self.idle_run = 0;
        loop {
            if self.state == Stopped {
                return None;
            }
            if self.state != Idle {
                self.idle_run = 0;
            }
            if matches!(self.state, Name { at: 0, .. }) {
                // The usual case, a head that arrives whole: its header lines read one after
                // another, each found with `memchr`, here. A line split across reads takes
                // the byte-by-byte path below.
                let mut head_ended = false;
                let mut start = 0;
                for i in memchr_iter(b'\n', bytes) {
                    let line = &bytes[start..i];
                    start = i + 1;
                    match line {
                        [] | [b'\r'] => {
                            if let Some(n) = self.end_head() {
                                self.state = Stopped;
                                return Some(n);
                            }
                            head_ended = true;
                            break;
                        }
                        // A bare CR: httparse refuses the head.
                        [b'\r', ..] => {
                            self.state = Stopped;
                            return None;
                        }
                        line => self.header_line(line),
                    }
                }
                bytes = &bytes[start..];
                if bytes.is_empty() {
                    return None;
                }
                if head_ended {
                    continue;
                }
            }
            let (&b, rest) = bytes.split_first()?;
            // Most states take one byte; those that skip take more and say so.
            let mut taken = 1;
            self.state = match self.state {
                Idle => match b {
                    b'\r' | b'\n' => {
                        self.idle_run += 1;
                        Idle
                    }
                    _ => Skip,
                },
                Skip => match memchr(b'\n', bytes) {
                    Some(i) => {
                        taken = i + 1;
                        Self::LINE_START
                    }
                    None => {
                        taken = bytes.len();
                        Skip
                    }
                },
                Name { at: 0, .. } if b == b'\n' => match self.end_head() {
                    Some(n) => {
                        self.state = Stopped;
                        return Some(n);
                    }
                    None => self.state,
                },
                Name { at: 0, .. } if b == b'\r' => EmptyLineLf,
                EmptyLineLf if b == b'\n' => match self.end_head() {
                    Some(n) => {
                        self.state = Stopped;
                        return Some(n);
                    }
                    None => self.state,
                },
                EmptyLineLf => Stopped,
                Name { at, cl, te } => {
                    let i = usize::from(at);
                    if b == b':' {
                        if cl && i == CONTENT_LENGTH.len() {
                            ContentLength {
                                value: None,
                                done: false,
                            }
                        } else {
                            if te && i == TRANSFER_ENCODING.len() {
                                self.chunked = true;
                            }
                            Skip
                        }
                    } else if b == b'\n' {
                        // A line without a colon, which httparse refuses: hyper closes.
                        Self::LINE_START
                    } else {
                        let lower = b.to_ascii_lowercase();
                        let cl = cl && CONTENT_LENGTH.get(i) == Some(&lower);
                        let te = te && TRANSFER_ENCODING.get(i) == Some(&lower);
                        if cl || te {
                            Name { at: at + 1, cl, te }
                        } else {
                            // Not one of the two: skip to the line's end, this byte included.
                            taken = 0;
                            Skip
                        }
                    }
                }
                ContentLength { value, done } => {
                    let digit = u64::from(b.wrapping_sub(b'0'));
                    match b {
                        b' ' | b'\t' => ContentLength {
                            value,
                            done: value.is_some(),
                        },
                        b'0'..=b'9' if !done => {
                            match value
                                .unwrap_or(0)
                                .checked_mul(10)
                                .and_then(|v| v.checked_add(digit))
                            {
                                Some(v) => ContentLength {
                                    value: Some(v),
                                    done,
                                },
                                None => self.bad_length(),
                            }
                        }
                        b'\r' => ContentLength { value, done: true },
                        b'\n' => {
                            self.length = match (self.length, value) {
                                (Length::None, Some(v)) => Length::Value(v),
                                (Length::Value(l), Some(v)) if l == v => Length::Value(l),
                                _ => Length::Bad,
                            };
                            Self::LINE_START
                        }
                        // The rest of the line (this byte included) no longer matters.
                        _ => {
                            taken = 0;
                            self.bad_length()
                        }
                    }
                }
                Body(left) => {
                    let n = u64::try_from(bytes.len()).unwrap_or(u64::MAX).min(left);
                    taken = usize::try_from(n).unwrap_or(bytes.len());
                    if n == left {
                        Idle
                    } else {
                        Body(left - n)
                    }
                }
                ChunkSize { size, digits } => match (b as char).to_digit(16) {
                    Some(d) => match size.checked_mul(16) {
                        Some(s) => ChunkSize {
                            size: s + u64::from(d),
                            digits: true,
                        },
                        None => Stopped,
                    },
                    None if !digits => Stopped,
                    None => match b {
                        b' ' | b'\t' => ChunkSizeLws { size },
                        b';' => ChunkExtension { size },
                        b'\r' => ChunkSizeLf { size },
                        _ => Stopped,
                    },
                },
                ChunkSizeLws { size } => match b {
                    b' ' | b'\t' => ChunkSizeLws { size },
                    b';' => ChunkExtension { size },
                    b'\r' => ChunkSizeLf { size },
                    _ => Stopped,
                },
                ChunkExtension { size } => match b {
                    b'\r' => ChunkSizeLf { size },
                    b'\n' => Stopped,
                    _ => ChunkExtension { size },
                },
                ChunkSizeLf { size } => match (b, size) {
                    (b'\n', 0) => TrailerStart,
                    (b'\n', size) => ChunkData(size),
                    _ => Stopped,
                },
                ChunkData(left) => {
                    let n = u64::try_from(bytes.len()).unwrap_or(u64::MAX).min(left);
                    taken = usize::try_from(n).unwrap_or(bytes.len());
                    if n == left {
                        ChunkDataCr
                    } else {
                        ChunkData(left - n)
                    }
                }
                ChunkDataCr if b == b'\r' => ChunkDataLf,
                ChunkDataLf if b == b'\n' => ChunkSize {
                    size: 0,
                    digits: false,
                },
                ChunkDataCr | ChunkDataLf => Stopped,
                TrailerStart if b == b'\r' => EndLf,
                TrailerStart | Trailer => match memchr(b'\r', bytes) {
                    Some(i) => {
                        taken = i + 1;
                        TrailerLf
                    }
                    None => {
                        taken = bytes.len();
                        Trailer
                    }
                },
                TrailerLf if b == b'\n' => TrailerStart,
                EndLf if b == b'\n' => Idle,
                TrailerLf | EndLf => Stopped,
                Stopped => Stopped,
            };
            bytes = if taken == 1 { rest } else { &bytes[taken..] };
        }
    }

    /// A whole header line (without its LF), read as the byte-by-byte states would.
    fn header_line(&mut self, line: &[u8]) {
        // The colon where one of the two names would end: most lines are neither, and cost
        // two comparisons.
        let named = |name: &[u8]| {
            line.get(name.len()) == Some(&b':') && line[..name.len()].eq_ignore_ascii_case(name)
        };
        if named(CONTENT_LENGTH) {
            let value = &line[CONTENT_LENGTH.len() + 1..];
            let start = value
                .iter()
                .position(|&b| b != b' ' && b != b'\t')
                .unwrap_or(value.len());
            let end = value
                .iter()
                .rposition(|&b| !matches!(b, b' ' | b'\t' | b'\r'))
                .map_or(start, |i| i + 1);
            let digits = value.get(start..end).unwrap_or_default();
            let parsed = (!digits.is_empty() && digits.iter().all(u8::is_ascii_digit))
                .then(|| {
                    digits.iter().try_fold(0u64, |v, &d| {
                        v.checked_mul(10)?.checked_add(u64::from(d - b'0'))
                    })
                })
                .flatten();
            self.length = match (self.length, parsed) {
                (Length::None, Some(v)) => Length::Value(v),
                (Length::Value(l), Some(v)) if l == v => Length::Value(l),
                _ => Length::Bad,
            };
        } else if named(TRANSFER_ENCODING) {
            self.chunked = true;
        }
    }

    /// A `Content-Length` line hyper would refuse: noted, and the rest of the line skipped.
    fn bad_length(&mut self) -> State {
        self.length = Length::Bad;
        State::Skip
    }

    /// The blank line that ends a head: what its body is, or the head's number if it had
    /// both headers (any `Content-Length` line at all, even one hyper would not parse: after
    /// a `Transfer-Encoding` line it does not even look at it).
    fn end_head(&mut self) -> Option<u64> {
        self.heads += 1;
        let length = std::mem::replace(&mut self.length, Length::None);
        let chunked = std::mem::take(&mut self.chunked);
        self.state = match (chunked, length) {
            (true, Length::Value(_) | Length::Bad) => return Some(self.heads),
            // A coding other than chunked last is refused by hyper, which then closes.
            (true, Length::None) => State::ChunkSize {
                size: 0,
                digits: false,
            },
            (false, Length::Value(n)) if n > 0 => State::Body(n),
            (false, Length::Bad) => State::Stopped,
            (false, _) => State::Idle,
        };
        None
    }
}

/// An HTTP/1 connection's IO with its request framing followed (see the module
/// documentation). Writes pass straight through.
pub struct FramingIo<T> {
    inner: T,
    tracker: Tracker,
    framing: Arc<Framing>,
}

impl<T> FramingIo<T> {
    pub fn new(inner: T) -> (FramingIo<T>, Arc<Framing>) {
        let framing = Arc::new(Framing::default());
        let io = FramingIo {
            inner,
            tracker: Tracker::new(),
            framing: framing.clone(),
        };
        (io, framing)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FramingIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        loop {
            let r = Pin::new(&mut this.inner).poll_read(cx, buf);
            // hyper polls the read side while a response streams, to notice a client
            // leaving: those polls find nothing and cost a comparison here.
            let read = &buf.filled()[before..];
            if read.is_empty() {
                return r;
            }
            if let Some(n) = this.tracker.feed(read) {
                this.framing.ambiguous.store(n, Ordering::Relaxed);
            }
            this.framing
                .mid_message
                .store(this.tracker.state != State::Idle, Ordering::Relaxed);
            // Empty lines after a request (a CRLF some clients send after a body) are not
            // handed to hyper, which ignores them anyway: bytes waiting in its buffer stop
            // it from reading the socket while the answer streams, and so from noticing the
            // client leave, which must cancel the upstream.
            if this.tracker.state != State::Idle || this.tracker.idle_run == 0 {
                return r;
            }
            let keep = buf.filled().len() - this.tracker.idle_run.min(read.len());
            buf.set_filled(keep);
            if keep > before {
                return r;
            }
            // Nothing else came: read again rather than return nothing, which is the end.
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FramingIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Hands out its bytes `step` at a time.
    struct Trickle<'a>(&'a [u8], usize);

    impl AsyncRead for Trickle<'_> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let n = self.1.min(self.0.len()).min(buf.remaining());
            buf.put_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Poll::Ready(Ok(()))
        }
    }

    /// What hyper reads of `input` through the framing IO, `step` bytes a read.
    async fn through(input: &[u8], step: usize) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let (mut io, _) = FramingIo::new(Trickle(input, step));
        let mut out = Vec::new();
        io.read_to_end(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn empty_lines_after_a_request_are_not_handed_on() {
        let get = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n";
        let post = b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\nhi";
        let chunked =
            b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n";
        for step in [1, 2, 3, 7, 4096] {
            assert_eq!(through(&[&get[..], b"\r\n"].concat(), step).await, get);
            assert_eq!(
                through(&[&post[..], b"\r\n\r\n"].concat(), step).await,
                post
            );
            // The last CRLF of a chunked body is the body's own.
            assert_eq!(through(chunked, step).await, chunked);
            assert_eq!(
                through(&[&chunked[..], b"\n"].concat(), step).await,
                chunked
            );
            // Between two requests that came together, hyper skips them itself.
            let two = [&get[..], b"\r\n", &get[..]].concat();
            if step == 4096 {
                assert_eq!(through(&two, step).await, two);
            }
        }
    }

    /// Feeds `input` in the given pieces; returns the ambiguous head's number (or 0), the
    /// heads completed and whether the tracker stopped.
    fn run(input: &[u8], cuts: &[usize]) -> (u64, u64, bool) {
        let mut t = Tracker::new();
        let mut found = 0;
        let mut at = 0;
        let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(input.len())).collect();
        cuts.sort_unstable();
        cuts.push(input.len());
        for cut in cuts {
            if let Some(n) = t.feed(&input[at..cut]) {
                assert_eq!(found, 0, "a second ambiguous head");
                found = n;
            }
            at = cut;
        }
        (found, t.heads, t.state == State::Stopped)
    }

    /// Whole, and split at every byte.
    fn check(input: &str, expected: (u64, u64, bool)) {
        let input = input.as_bytes();
        assert_eq!(run(input, &[]), expected, "whole: {input:?}");
        let every: Vec<usize> = (1..input.len()).collect();
        assert_eq!(run(input, &every), expected, "byte by byte: {input:?}");
        for cut in 1..input.len() {
            assert_eq!(run(input, &[cut]), expected, "cut at {cut}: {input:?}");
        }
    }

    const PLAIN: &str = "POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\r\nhello";
    const CHUNKED: &str = "POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    const GET: &str = "GET /v1/models HTTP/1.1\r\nhost: g\r\n\r\n";

    #[test]
    fn requests_with_one_framing_header_are_counted_and_never_flagged() {
        check(PLAIN, (0, 1, false));
        check(CHUNKED, (0, 1, false));
        check(GET, (0, 1, false));
        check(&[PLAIN, CHUNKED, GET, PLAIN].concat(), (0, 4, false));
    }

    #[test]
    fn both_headers_flag_that_head_in_either_order_and_any_case() {
        for head in [
            "content-length: 3\r\ntransfer-encoding: chunked\r\n",
            "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
            "CONTENT-LENGTH:3\r\nTRANSFER-ENCODING:chunked\r\n",
            "transfer-encoding: chunked\r\ncontent-length: 999\r\n",
            // After a coding hyper does not even parse the length: still both headers.
            "transfer-encoding: chunked\r\ncontent-length: abc\r\n",
            "transfer-encoding: chunked\r\ncontent-length: 1, 2\r\n",
            "transfer-encoding: chunked\r\ncontent-length:\r\n",
        ] {
            let ambiguous =
                format!("POST / HTTP/1.1\r\nhost: g\r\n{head}\r\n3\r\nabc\r\n0\r\n\r\n");
            check(&ambiguous, (1, 1, true));
            // The third request on a connection: the number is that head's.
            check(&[PLAIN, CHUNKED, &ambiguous].concat(), (3, 3, true));
        }
    }

    #[test]
    fn bodies_that_look_like_heads_are_skipped() {
        let fake_head =
            "x\r\nGET / HTTP/1.1\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n";
        let sized = format!(
            "POST / HTTP/1.1\r\nhost: g\r\ncontent-length: {}\r\n\r\n{fake_head}",
            fake_head.len()
        );
        check(&[&sized, GET].concat(), (0, 2, false));
        let chunked = format!(
            "POST / HTTP/1.1\r\nhost: g\r\ntransfer-encoding: chunked\r\n\r\n{:x};ext=1\r\n{fake_head}\r\n0\r\nx-trailer: content-length: 5\r\n\r\n",
            fake_head.len()
        );
        check(&[&chunked, GET].concat(), (0, 2, false));
    }

    #[test]
    fn bare_lf_ends_and_empty_lines_between_messages_are_read_as_httparse_does() {
        let lf = "POST / HTTP/1.1\nhost: g\ncontent-length: 2\n\nhi";
        check(&[lf, "\r\n\n", lf].concat(), (0, 2, false));
        let lf_ambiguous =
            "POST / HTTP/1.1\nhost: g\ncontent-length: 2\ntransfer-encoding: chunked\n\n";
        check(&[lf, lf_ambiguous].concat(), (2, 2, true));
    }

    #[test]
    fn names_that_only_start_like_the_two_are_other_headers() {
        for name in [
            "content-lengthx",
            "x-content-length",
            "content-lengt",
            "transfer-encodings",
            "te",
        ] {
            let req = format!(
                "POST / HTTP/1.1\r\nhost: g\r\ncontent-length: 2\r\n{name}: chunked\r\n\r\nhi"
            );
            check(&[&req, GET].concat(), (0, 2, false));
        }
    }

    #[test]
    fn framing_hyper_refuses_stops_the_tracker() {
        for bad in [
            "POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 1 2\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: +1\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 99999999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n1\nx\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n1\r\nxy\r\n",
        ] {
            let (found, _, stopped) = run(bad.as_bytes(), &[]);
            assert_eq!((found, stopped), (0, true), "{bad:?}");
        }
    }

    #[test]
    fn the_service_is_told_for_the_right_request_only() {
        let framing = Framing::default();
        framing.ambiguous.store(2, Ordering::Relaxed);
        assert!(!framing.next_request_is_ambiguous());
        assert!(framing.next_request_is_ambiguous());
        assert!(!framing.next_request_is_ambiguous());
    }

    proptest! {
        /// However the bytes are cut into reads, the tracker finds the same thing.
        #[test]
        fn pieces_do_not_matter(
            picks in prop::collection::vec(0usize..4, 1..6),
            cuts in prop::collection::vec(0usize..600, 0..8),
        ) {
            let ambiguous = "POST / HTTP/1.1\r\nhost: g\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
            let parts = [PLAIN, CHUNKED, GET, ambiguous];
            let input: String = picks.iter().map(|&i| parts[i]).collect();
            let whole = run(input.as_bytes(), &[]);
            prop_assert_eq!(run(input.as_bytes(), &cuts), whole);
            let every: Vec<usize> = (1..input.len()).collect();
            prop_assert_eq!(run(input.as_bytes(), &every), whole);
        }

        /// Hostile bytes: no panic, and the same answer however they are cut.
        #[test]
        fn any_bytes_any_pieces(
            input in prop::collection::vec(
                prop::sample::select(b"\r\n: 0123456789abcdefABCDEF;\tcontent-length transfer-encoding chunked POST / HTTP/1.1 x".to_vec()),
                0..400,
            ),
            cuts in prop::collection::vec(0usize..400, 0..8),
        ) {
            let whole = run(&input, &[]);
            prop_assert_eq!(run(&input, &cuts), whole);
            // Byte by byte: no line is ever whole in one piece.
            let every: Vec<usize> = (1..input.len()).collect();
            prop_assert_eq!(run(&input, &every), whole);
        }
    }
}
