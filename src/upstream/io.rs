//! The byte stream of one upstream connection: plain TCP inline, a TLS session boxed.
//!
//! hyper-rustls's `MaybeHttpsStream` holds the rustls session inline, so it is 1,104 bytes
//! whichever it carries; a plain `http://` connection is 32. hyper keeps the stream inline in
//! every state of a connection: in each HTTP/1 connection's task for as long as the
//! connection lives (one per concurrent stream), and several times over in the future that
//! connects it. Boxing the TLS session costs one allocation per TLS handshake, next to the
//! handshake itself, and leaves a plain connection a kilobyte smaller (measured in
//! BENCHMARKS.md: memory per stream).
//!
//! An HTTP/2 connection also waits here for the server's first frame (its SETTINGS, RFC 9113
//! §3.4), for as long as a connect may take: hyper sends its requests without waiting for it,
//! so a read that fails is the only way to tell hyper that a silent server never connected.
//! The deadline is seen when h2 polls the read, which it does after its writes: a server that
//! also stops reading could hold it back by filling the socket's send buffer, which the
//! 64 KiB initial window of its requests' bodies makes unlikely.
//!
//! That first frame also says how many streams the server takes at once
//! (`SETTINGS_MAX_CONCURRENT_STREAMS`), which hyper keeps to itself: it is read on its way
//! to hyper and handed to the connection's lane (`h2_pool.rs`), which puts no more streams
//! on the connection than that (audit Z2). Only the first SETTINGS frame is read: providers'
//! front ends (nginx, haproxy, Envoy) announce their limit there and do not change it.
//!
//! Each read of an HTTP/2 connection is also stamped on its lane ([`LastRead`]): a limit
//! that cuts a silent stream asks whether the whole connection was silent too (audit RA 5).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use hyper::rt::{Read, ReadBuf, ReadBufCursor, Write};
use hyper_rustls::MaybeHttpsStream;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

type Tls = MaybeHttpsStream<TokioIo<TcpStream>>;

/// An upstream connection's stream, as the connector made it.
pub struct UpstreamIo {
    stream: Stream,
    /// An HTTP/2 connection's first frame, until it has been read. Boxed: a plain HTTP/1.1
    /// connection has none.
    first_frame: Option<Box<FirstFrame>>,
    /// An HTTP/1.1 connection's: how its request's attempt says it gave up on it.
    abandon: Option<Abandon>,
    /// An HTTP/2 connection's: where its reads are stamped.
    last_read: Option<Arc<LastRead>>,
}

/// When a lane's HTTP/2 connection last read anything from its server (a frame of any
/// stream, a PING's answer, a SETTINGS): what tells a connection gone silent (a dropped
/// flow, a hung front end, a stopped relay) from one stream's slow provider
/// (`h2_pool::ConnectionWatch`). One store per read by the connection's own task, and a
/// clock read, next to the read's system call: nothing per chunk, no lock.
pub(super) struct LastRead {
    /// What the stamps count from.
    epoch: Instant,
    /// Nanoseconds from `epoch` to the last read, plus one; 0 until the first.
    nanos: AtomicU64,
}

impl LastRead {
    pub(super) fn new() -> LastRead {
        LastRead {
            epoch: Instant::now(),
            nanos: AtomicU64::new(0),
        }
    }

    /// A read returned.
    pub(super) fn stamp(&self) {
        let since = Instant::now().saturating_duration_since(self.epoch);
        let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX - 1);
        self.nanos.store(nanos + 1, Ordering::Relaxed);
    }

    /// When the last read was; `None` before the first (no HTTP/2 connection read yet).
    pub(super) fn at(&self) -> Option<Instant> {
        match self.nanos.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.epoch + std::time::Duration::from_nanos(n - 1)),
        }
    }
}

/// How an attempt that gave up on its request before the answer's head ends the HTTP/1.1
/// connection it went on (found in the connection's `Connected` extras). hyper closes such a
/// connection once it notices, but not while it waits to write the request: an upload to an
/// upstream that stopped reading held its connection, its task and the body for as long as
/// the upstream kept the socket (audit EA). The connection's next write fails instead, and its
/// socket is reset, so that the upstream never gets whole a request nobody waits for.
#[derive(Clone, Default)]
pub struct Abandon(Arc<AbandonState>);

///
/// It also keeps what the attempt needs to tell a connection the upstream closed unanswered
/// (audits MC 5, NA 2, NA 3): whether the connection was used before its current request,
/// and whether any of that request's answer was read. hyper reports both a close with nothing
/// read and one inside a head (or after a `100 Continue`) as the same "connection closed
/// before message completed".
#[derive(Default)]
struct AbandonState {
    abandoned: AtomicBool,
    /// The connection's task, while its write waits.
    writer: Mutex<Option<Waker>>,
    /// Reads that returned (bytes, or the end) since the last write, up to 2. HTTP/1.1 writes
    /// a request, then reads its answer: a close that ends a read of no bytes leaves 1, and
    /// 2 means bytes of the answer came before it. Counted, not summed: a read's byte count
    /// is hyper's cursor's, which only unsafe code could read back.
    reads: AtomicU8,
    /// A read came before the last write began: the connection carried an earlier exchange,
    /// so its current request went out on a pooled connection.
    reused: AtomicBool,
}

impl Abandon {
    pub fn abandon(&self) {
        self.0.abandoned.store(true, Ordering::Release);
        let writer = self
            .0
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(w) = writer {
            w.wake();
        }
    }

    fn abandoned(&self) -> bool {
        self.0.abandoned.load(Ordering::Acquire)
    }

    /// The connection's request went out on it after an earlier exchange (it was pooled).
    pub fn reused(&self) -> bool {
        self.0.reused.load(Ordering::Relaxed)
    }

    /// Some of the current request's answer was read (see `reads`).
    pub fn answer_begun(&self) -> bool {
        self.0.reads.load(Ordering::Relaxed) >= 2
    }

    /// A read returned. Only the connection's task reads and writes: a load and a store.
    fn read(&self) {
        let reads = self.0.reads.load(Ordering::Relaxed);
        if reads < 2 {
            self.0.reads.store(reads + 1, Ordering::Relaxed);
        }
    }

    /// Bytes were written: after reads, a new request began.
    fn wrote(&self) {
        if self.0.reads.load(Ordering::Relaxed) > 0 {
            self.0.reads.store(0, Ordering::Relaxed);
            self.0.reused.store(true, Ordering::Relaxed);
        }
    }

    /// A write waits: wakes `waker` when abandoned. Whether it was already.
    fn waiting(&self, waker: &Waker) -> bool {
        *self.0.writer.lock().unwrap_or_else(PoisonError::into_inner) = Some(waker.clone());
        self.abandoned()
    }
}

struct FirstFrame {
    /// Until the server's first bytes arrive: when they must.
    deadline: Option<Pin<Box<Sleep>>>,
    scan: SettingsScan,
    /// Where the server's stream limit goes, once read: the lane's and the upstream's.
    peer_streams: [Arc<AtomicUsize>; 2],
}

/// The server's first frame, read as it comes: its 9-byte head, then one 6-byte setting at
/// a time (RFC 9113 §6.5 sets no bound on how many), so nothing more than those is kept.
#[derive(Default)]
struct SettingsScan {
    /// The head, or the setting, being read.
    seen: Vec<u8>,
    /// Once the head is read: the payload bytes still to come.
    left: Option<usize>,
    /// The last `SETTINGS_MAX_CONCURRENT_STREAMS` read (the last of one given twice holds).
    limit: Option<u32>,
}

const SETTINGS: u8 = 4;
const MAX_CONCURRENT_STREAMS: u16 = 3;

impl SettingsScan {
    /// Moves bytes from `bytes` into `seen` until it holds `want`; whether it does.
    fn fill(&mut self, want: usize, bytes: &mut &[u8]) -> bool {
        let take = (want - self.seen.len()).min(bytes.len());
        self.seen.extend_from_slice(&bytes[..take]);
        *bytes = &bytes[take..];
        self.seen.len() == want
    }

    /// Takes the next bytes the server sent. `None` while the first frame is not whole;
    /// then whether it set `SETTINGS_MAX_CONCURRENT_STREAMS`, and to what.
    fn feed(&mut self, mut bytes: &[u8]) -> Option<Option<u32>> {
        loop {
            let Some(left) = self.left else {
                if !self.fill(9, &mut bytes) {
                    return None;
                }
                let head = &self.seen;
                // Not a SETTINGS frame, or its ACK: a server that says nothing of its limit.
                if head[3] != SETTINGS || head[4] & 1 != 0 {
                    return Some(None);
                }
                let len =
                    usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
                self.left = Some(len);
                self.seen.clear();
                continue;
            };
            // A payload that is not whole settings ends in a part that is none.
            if left < 6 {
                return Some(self.limit);
            }
            if !self.fill(6, &mut bytes) {
                return None;
            }
            let s = &self.seen;
            if u16::from_be_bytes([s[0], s[1]]) == MAX_CONCURRENT_STREAMS {
                self.limit = Some(u32::from_be_bytes([s[2], s[3], s[4], s[5]]));
            }
            self.seen.clear();
            self.left = Some(left - 6);
        }
    }
}

enum Stream {
    Plain(TokioIo<TcpStream>),
    /// Always the `Https` case of the connector's stream, which also says what ALPN chose.
    Tls(Box<Tls>),
}

/// The server of an HTTP/2 connection sent nothing, not even its SETTINGS, by the connect
/// deadline. An `io::ErrorKind::TimedOut`, which the proxy maps to `connect_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the upstream sent no HTTP/2 SETTINGS by the end of its connect timeout")]
struct NoFirstFrame;

impl UpstreamIo {
    pub(super) fn is_tls(&self) -> bool {
        matches!(self.stream, Stream::Tls(_))
    }

    /// An HTTP/1.1 connection: its attempt may abandon it ([`Abandon`]).
    pub(super) fn abandonable(&mut self) {
        self.abandon = Some(Abandon::default());
    }

    fn tcp(&self) -> Option<&TcpStream> {
        match &self.stream {
            Stream::Plain(tcp) => Some(tcp.inner()),
            Stream::Tls(tls) => match &**tls {
                MaybeHttpsStream::Https(tls) => Some(tls.inner().get_ref().0.inner().inner()),
                MaybeHttpsStream::Http(tcp) => Some(tcp.inner()),
            },
        }
    }

    /// Before a write: the error that ends an abandoned connection, its socket set to reset
    /// when closed (the bytes it still holds are not sent).
    fn check_abandoned(&self) -> Option<io::Error> {
        if !self.abandon.as_ref().is_some_and(Abandon::abandoned) {
            return None;
        }
        if let Some(tcp) = self.tcp() {
            let _ = socket2::SockRef::from(tcp).set_linger(Some(std::time::Duration::ZERO));
        }
        Some(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the attempt gave up on its request before the answer came",
        ))
    }

    /// After a write of bytes (not a flush, which hyper also makes while it reads).
    fn wrote_bytes(&self, r: &Poll<io::Result<usize>>) {
        if let (Poll::Ready(Ok(1..)), Some(a)) = (r, &self.abandon) {
            a.wrote();
        }
    }

    /// After a write: one that waits is woken by an abandon, and fails then.
    fn wrote<T>(&self, cx: &Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match (&r, &self.abandon) {
            (Poll::Pending, Some(a)) if a.waiting(cx.waker()) => Poll::Ready(Err(self
                .check_abandoned()
                .unwrap_or_else(|| io::Error::from(io::ErrorKind::ConnectionAborted)))),
            _ => r,
        }
    }

    /// Fails the connection's reads if the server has sent nothing by `deadline`, puts
    /// the stream limit its first SETTINGS frame announces in both `peer_streams`, and
    /// stamps every read on `last_read`.
    pub(super) fn expect_first_frame_by(
        &mut self,
        deadline: Instant,
        peer_streams: [Arc<AtomicUsize>; 2],
        last_read: Arc<LastRead>,
    ) {
        self.last_read = Some(last_read);
        self.first_frame = Some(Box::new(FirstFrame {
            deadline: Some(Box::pin(tokio::time::sleep_until(deadline))),
            scan: SettingsScan::default(),
            peer_streams,
        }));
    }

    fn poll_read_inner(
        &mut self,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
        }
    }
}

impl From<Tls> for UpstreamIo {
    fn from(stream: Tls) -> Self {
        let stream = match stream {
            MaybeHttpsStream::Http(tcp) => Stream::Plain(tcp),
            tls => Stream::Tls(Box::new(tls)),
        };
        Self {
            stream,
            first_frame: None,
            abandon: None,
            last_read: None,
        }
    }
}

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        let connected = match &self.stream {
            Stream::Plain(tcp) => tcp.connected(),
            // Marks the connection h2 when ALPN chose it.
            Stream::Tls(tls) => tls.connected(),
        };
        match &self.abandon {
            Some(a) => connected.extra(a.clone()),
            None => connected,
        }
    }
}

impl Read for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.first_frame.is_none() || buf.remaining() == 0 {
            let asked = buf.remaining() > 0;
            let read = this.poll_read_inner(cx, buf);
            if let (Poll::Ready(Ok(())), true) = (&read, asked) {
                if let Some(a) = &this.abandon {
                    a.read();
                }
                if let Some(r) = &this.last_read {
                    r.stamp();
                }
            }
            return read;
        }
        // Read through a buffer of its own, to see the bytes on their way to hyper.
        let mut scratch = [0u8; 512];
        let n = buf.remaining().min(scratch.len());
        let mut own = ReadBuf::new(&mut scratch[..n]);
        let read = this.poll_read_inner(cx, own.unfilled());
        let Some(first) = &mut this.first_frame else {
            return read;
        };
        match read {
            Poll::Ready(Ok(())) => {
                if let Some(r) = &this.last_read {
                    r.stamp();
                }
                let got = own.filled();
                buf.put_slice(got);
                // Bytes or the end: the server has spoken, or never will.
                first.deadline = None;
                let done = if got.is_empty() {
                    Some(None)
                } else {
                    first.scan.feed(got)
                };
                if let Some(limit) = done {
                    if let Some(limit) = limit {
                        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
                        for to in &first.peer_streams {
                            to.store(limit, Ordering::Release);
                        }
                    }
                    this.first_frame = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => {
                this.first_frame = None;
                Poll::Ready(Err(e))
            }
            Poll::Pending => {
                if let Some(deadline) = &mut first.deadline {
                    if deadline.as_mut().poll(cx).is_ready() {
                        this.first_frame = None;
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            NoFirstFrame,
                        )));
                    }
                }
                Poll::Pending
            }
        }
    }
}

impl Write for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(e) = this.check_abandoned() {
            return Poll::Ready(Err(e));
        }
        let r = match &mut this.stream {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
        };
        this.wrote_bytes(&r);
        this.wrote(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(e) = this.check_abandoned() {
            return Poll::Ready(Err(e));
        }
        let r = match &mut this.stream {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_write_vectored(cx, bufs),
        };
        this.wrote_bytes(&r);
        this.wrote(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(tcp) => tcp.is_write_vectored(),
            Stream::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.check_abandoned() {
            return Poll::Ready(Err(e));
        }
        let r = match &mut this.stream {
            Stream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_flush(cx),
        };
        this.wrote(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(entries: &[(u16, u32)]) -> Vec<u8> {
        let len = u8::try_from(entries.len() * 6).unwrap();
        let mut frame = vec![0, 0, len, SETTINGS, 0, 0, 0, 0, 0];
        for (id, value) in entries {
            frame.extend_from_slice(&id.to_be_bytes());
            frame.extend_from_slice(&value.to_be_bytes());
        }
        frame
    }

    #[test]
    fn the_first_settings_frame_gives_the_stream_limit_in_any_pieces() {
        let mut frame = settings(&[(4, 65_535), (MAX_CONCURRENT_STREAMS, 2), (5, 16_384)]);
        // The next frame (a WINDOW_UPDATE) in the same read is not looked at.
        frame.extend_from_slice(&[0, 0, 4, 8, 0, 0, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(SettingsScan::default().feed(&frame), Some(Some(2)));
        for cut in 1..27 {
            let mut scan = SettingsScan::default();
            assert_eq!(scan.feed(&frame[..cut]), None, "cut at {cut}");
            assert_eq!(scan.feed(&frame[cut..]), Some(Some(2)), "cut at {cut}");
        }
        let mut scan = SettingsScan::default();
        let bytes = frame.iter().map(|b| scan.feed(&[*b])).find_map(|r| r);
        assert_eq!(bytes, Some(Some(2)));
    }

    #[test]
    fn a_first_frame_without_a_stream_limit_gives_none() {
        assert_eq!(
            SettingsScan::default().feed(&settings(&[(4, 1)])),
            Some(None)
        );
        assert_eq!(SettingsScan::default().feed(&settings(&[])), Some(None));
        // However many settings come first (audit BB: 120 unknown ones, 726 bytes).
        let many: Vec<(u16, u32)> = (0..200)
            .map(|i| (0x100 + i, 1))
            .chain([(MAX_CONCURRENT_STREAMS, 1)])
            .collect();
        let mut frame = vec![0, 0, 0, SETTINGS, 0, 0, 0, 0, 0];
        let len = many.len() * 6;
        frame[1] = (len >> 8) as u8;
        frame[2] = len as u8;
        for (id, value) in &many {
            frame.extend_from_slice(&id.to_be_bytes());
            frame.extend_from_slice(&value.to_be_bytes());
        }
        assert_eq!(SettingsScan::default().feed(&frame), Some(Some(1)));
        // Not SETTINGS (a server that is not HTTP/2: an HTTP/1.1 status line).
        assert_eq!(
            SettingsScan::default().feed(b"HTTP/1.1 400 Bad Request\r\n"),
            Some(None)
        );
    }

    #[test]
    fn a_plain_connection_is_not_sized_for_a_tls_session() {
        // 40 for a plain stream and the enum's tag, 8 for the first-frame timer's box, 8 for
        // an HTTP/1.1 connection's `Abandon`, 8 for an HTTP/2 one's `LastRead`.
        assert!(std::mem::size_of::<UpstreamIo>() <= 64);
        assert!(std::mem::size_of::<Tls>() > 512, "what the box saves");
    }
}
