//! The client's socket as hyper sees it: a `TcpStream` that also
//! - remembers whether the client has sent bytes since our last write, so that at a
//!   header-read timeout a stalled request (answered 408) can be told from an idle keep-alive
//!   (closed without a word), and hands the socket back when hyper is done with it, so the
//!   408 can be written without holding a second descriptor per connection;
//! - gives up on a client that has not read for `send_timeout` while we have bytes for it
//!   (nginx's `send_timeout`). The reaper ends such a stream's upstream call (after the same
//!   `send_timeout` without a read, or at its deadline); this ends the client connection
//!   itself, which would otherwise sit on its socket buffers for as long as the client likes;
//! - hands hyper first the bytes the connection's protocol was told by ([`First`]), read
//!   before hyper had the socket.
//!
//! Over HTTP/2 a request body answered early is read on ([`RequestBody`]), as an HTTP/1
//! connection lingers.
//!
//! One timer per connection, made the first time a write stalls and reset (not recreated)
//! at every later stall; a write that makes progress disarms it. A client that reads, however
//! slowly, makes progress: Linux wakes a blocked writer only once half of its queued bytes
//! have drained (2.8 MB queued for a 1 KB/s reader: audit CC4 saw such a reader cut at
//! `send_timeout` while it read). So every quarter of `send_timeout` the bytes the socket holds
//! unacknowledged (`SIOCOUTQ`) are read: fewer than at the last look is the client's reading
//! ([`ClientWrites`], which the reaper reads too). Where they cannot be read (not Linux), the
//! stalled write is tried on the socket itself, and room the client made is its reading.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::{Instant, Sleep};

use crate::http::conn::ClientWrites;
use crate::stream::signal::Signal;

/// What the connection task keeps of a socket it gave to hyper.
#[derive(Default)]
pub struct Returned {
    mid_request: AtomicBool,
    socket: Mutex<Option<TcpStream>>,
}

impl Returned {
    /// After hyper's header-read timeout: tells a client that stalled part-way through a
    /// request head why its connection is closing. An idle keep-alive connection is closed
    /// without a word, as RFC 9112 9.6 allows. Whether the 408 was sent.
    pub fn answer_stalled_head(&self) -> bool {
        let socket = self
            .socket
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(socket) = socket.filter(|_| self.mid_request.load(Ordering::Relaxed)) {
            // A fresh 56-byte write to an otherwise idle socket: the send buffer takes it.
            let _ = socket.try_write(
                b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            );
            let _ = socket2::SockRef::from(&socket).shutdown(std::net::Shutdown::Both);
            return true;
        }
        false
    }

    /// RFC 9112 9.6: closes a connection whose client may still be sending (an answer made
    /// before its body was read, a head hyper refused) by half-closing it and reading what
    /// comes until the client closes, goes quiet for `LINGER_QUIET`, or `LINGER_MOST` has
    /// passed. Closed at once with unread bytes, the socket would send a reset, which makes
    /// the client's writes fail and may erase the answer still in its buffers: a front proxy
    /// then answers its own 502 instead of ours.
    ///
    /// In a task of its own, so that the connection's `max_connections` slot is free at once
    /// (a client trickling bytes must not hold one for `LINGER_MOST`); at most `LINGERING`
    /// sockets linger at a time, and past that one is closed as before.
    pub fn linger(&self) {
        let socket = self
            .socket
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(socket) = socket {
            linger_close(socket);
        }
    }
}

/// The lingering close of [`Returned::linger`], for any socket whose client may still be
/// sending once it has its answer.
pub fn linger_close(mut socket: TcpStream) {
    // hyper has usually sent its FIN already; a second shutdown changes nothing.
    let _ = socket2::SockRef::from(&socket).shutdown(std::net::Shutdown::Write);
    let Ok(slot) = LINGER_SLOTS.try_acquire() else {
        return;
    };
    tokio::spawn(async move {
        let _slot = slot;
        let end = Instant::now() + LINGER_MOST;
        // On the heap: rare, and the task stays small.
        let mut buf = vec![0u8; 16 << 10];
        loop {
            let quiet = (Instant::now() + LINGER_QUIET).min(end);
            match tokio::time::timeout_at(quiet, socket.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
        }
    });
}

/// How long a lingering close waits for more of what the client is sending, and how long it
/// lingers in all (nginx's `lingering_timeout` is 5 s, its `lingering_time` 30 s), and how
/// many sockets (and, apart, HTTP/2 request bodies) may linger at once.
const LINGER_QUIET: Duration = Duration::from_secs(2);
const LINGER_MOST: Duration = Duration::from_secs(30);
const LINGERING: usize = 1024;

/// HTTP/2 request bodies one connection may have lingering at once: a client waiting for its
/// early answer has one or two; without a share of its own, one connection's 1,024 trickling
/// streams took every slot and everyone else's answers were reset again (audit HB1).
const LINGERING_PER_CONNECTION: usize = 8;

/// HTTP/2 request bodies one client address may have lingering at once, over all its
/// connections: with a share per connection only, 128 connections of one client took every
/// slot (audit HC2). Clients behind one proxy address share it.
const LINGERING_PER_ADDRESS: u32 = 64;

/// Lingering HTTP/1 sockets.
static LINGER_SLOTS: Semaphore = Semaphore::const_new(LINGERING);

/// Lingering HTTP/2 request bodies: apart from the sockets', so that neither kind can take the
/// other's (HTTP/2 streams are far cheaper to open than connections).
static H2_LINGER_SLOTS: Semaphore = Semaphore::const_new(LINGERING);

/// The HTTP/2 bodies lingering now per client address; an address with none has no entry.
/// A `BTreeMap` because it can be made in a `static`; it holds at most `LINGERING` entries.
static H2_LINGERING_BY_ADDRESS: Mutex<BTreeMap<IpAddr, u32>> = Mutex::new(BTreeMap::new());

/// Counts one more body lingering for `peer`, if its address has room.
fn address_enter(peer: IpAddr) -> bool {
    let mut by = H2_LINGERING_BY_ADDRESS
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let n = by.entry(peer).or_insert(0);
    if *n >= LINGERING_PER_ADDRESS {
        return false;
    }
    *n += 1;
    true
}

fn address_leave(peer: IpAddr) {
    let mut by = H2_LINGERING_BY_ADDRESS
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let std::collections::btree_map::Entry::Occupied(mut n) = by.entry(peer) {
        *n.get_mut() -= 1;
        if *n.get() == 0 {
            n.remove();
        }
    }
}

/// What the request bodies of one HTTP/2 connection share to linger ([`RequestBody`]).
#[derive(Clone)]
pub struct Linger(Arc<LingerShare>);

struct LingerShare {
    /// The bytes a lingering read may take.
    most: u64,
    /// This connection's bodies lingering now.
    lingering: AtomicUsize,
    /// The client's address, whose share the bodies count in too.
    peer: IpAddr,
    /// The server's drain: a lingering read holds no request, and must not hold the shutdown
    /// (audit HB2: one trickling upload held it for the whole `shutdown_grace`).
    drain: Signal,
}

impl Linger {
    /// `most`: the bytes one lingering read may take (what a request body may be); `peer`:
    /// the client's address.
    pub fn new(most: u64, drain: Signal, peer: IpAddr) -> Linger {
        Linger(Arc::new(LingerShare {
            most,
            lingering: AtomicUsize::new(0),
            // An IPv4 client of a dual-stack listener is seen as `::ffff:a.b.c.d`: the same
            // client as over IPv4.
            peer: peer.to_canonical(),
            drain,
        }))
    }

    /// Room for one more lingering body, if the connection, its client's address and the
    /// process all have it.
    fn enter(&self) -> Option<Lingering> {
        let share = &self.0;
        share
            .lingering
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < LINGERING_PER_CONNECTION).then_some(n + 1)
            })
            .ok()?;
        // Counted first, so that the guard gives the count back whether or not a slot is had.
        let mut lingering = Lingering {
            share: share.clone(),
            address: false,
            _slot: None,
        };
        lingering.address = address_enter(share.peer);
        if !lingering.address {
            return None;
        }
        lingering._slot = Some(H2_LINGER_SLOTS.try_acquire().ok()?);
        Some(lingering)
    }
}

/// One lingering body's place in its connection's count, its address's and the process's
/// slots.
struct Lingering {
    share: Arc<LingerShare>,
    /// Whether it is counted in its address's share.
    address: bool,
    _slot: Option<SemaphorePermit<'static>>,
}

impl Drop for Lingering {
    fn drop(&mut self) {
        self.share.lingering.fetch_sub(1, Ordering::AcqRel);
        if self.address {
            address_leave(self.share.peer);
        }
    }
}

/// A client's request body. Over HTTP/2, one dropped before its end (an answer made before it
/// was read: 404, 401, 413, an invalid budget) is read on in a task of its own, as an HTTP/1
/// connection lingers ([`linger_close`]): dropped at once, h2 ends the stream with
/// RST_STREAM(NO_ERROR) while the client is still sending, which RFC 9113 8.1 allows but
/// curl 7.88 takes as a stream error and loses the answer with it (audit GC1: 13 of 20 early
/// answers). Read on, the stream ends with both sides' END_STREAM. The read ends at the
/// body's end or error, after `LINGER_QUIET` with nothing, `LINGER_MOST` in all, past
/// `most` bytes, or when the server drains; then the body is dropped (and reset) as before.
/// Past `LINGERING_PER_CONNECTION` of its connection, `LINGERING_PER_ADDRESS` of its client's
/// address, or `LINGERING` in the process, dropped at once.
pub struct RequestBody {
    /// `None` once dropped.
    inner: Option<Incoming>,
    /// `None` over HTTP/1, whose connection lingers.
    linger: Option<Linger>,
}

impl RequestBody {
    pub fn new(inner: Incoming, linger: Option<Linger>) -> RequestBody {
        RequestBody {
            inner: Some(inner),
            linger,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut().inner.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        let (Some(linger), Some(body)) = (self.linger.take(), self.inner.take()) else {
            return;
        };
        if body.is_end_stream() || linger.0.drain.is_fired() {
            return;
        }
        // Dropped as the runtime shuts down: there is no one left to answer.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some(lingering) = linger.enter() else {
            return;
        };
        runtime.spawn(async move {
            let share = lingering.share.clone();
            let _lingering = lingering;
            tokio::select! {
                () = read_on(body, share.most) => {}
                () = share.drain.fired() => {}
            }
        });
    }
}

/// Reads `body` until its end or error, `LINGER_QUIET` with nothing, `LINGER_MOST` in all, or
/// past `most` bytes.
async fn read_on(mut body: Incoming, most: u64) {
    let mut left = most;
    let end = Instant::now() + LINGER_MOST;
    loop {
        let quiet = (Instant::now() + LINGER_QUIET).min(end);
        match tokio::time::timeout_at(quiet, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, Bytes::len) as u64;
                let Some(l) = left.checked_sub(n) else { return };
                left = l;
            }
            _ => return,
        }
    }
}

/// The client's first bytes, read to tell its protocol, for hyper to read first: up to the
/// length of the HTTP/2 preface.
#[derive(Default)]
pub struct First {
    bytes: [u8; 24],
    /// `bytes[at..end]` are still to be read.
    at: u8,
    end: u8,
}

impl First {
    /// The bytes come so far.
    pub fn got(&self) -> &[u8] {
        &self.bytes[..usize::from(self.end)]
    }

    /// Room for more, to be read into and then [`First::add`]ed.
    pub fn room(&mut self) -> &mut [u8] {
        &mut self.bytes[usize::from(self.end)..]
    }

    pub fn add(&mut self, n: usize) {
        let end = usize::from(self.end) + n;
        assert!(
            end <= self.bytes.len(),
            "more bytes added than there was room for"
        );
        // At most the 24 bytes' length, checked above.
        self.end = end as u8;
    }

    fn give(&mut self, buf: &mut ReadBuf<'_>) {
        let left = &self.bytes[usize::from(self.at)..usize::from(self.end)];
        let n = left.len().min(buf.remaining());
        buf.put_slice(&left[..n]);
        // At most the 24 bytes' length.
        self.at += n as u8;
    }

    fn is_given(&self) -> bool {
        self.at == self.end
    }
}

pub struct ClientIo {
    /// `None` only once dropped: the socket goes back to [`Returned`].
    socket: Option<TcpStream>,
    first: First,
    returned: Arc<Returned>,
    send_timeout: Duration,
    stall: Option<Pin<Box<Sleep>>>,
    /// When the writes stalled (or last saw the client read), while they are.
    stalled: Option<Instant>,
    /// The bytes the socket held unacknowledged at the stall's last look.
    unacked: Option<u64>,
    writes: ClientWrites,
}

/// Looks at a stalled write per `send_timeout`.
pub(super) const STALL_CHECKS: u32 = 4;

impl ClientIo {
    /// `first`: what was read of the socket before (hyper reads it first). `writes`: what
    /// the socket tells the connection's requests of their client's reading.
    pub fn new(
        socket: TcpStream,
        first: First,
        send_timeout: Duration,
        writes: ClientWrites,
    ) -> (ClientIo, Arc<Returned>) {
        let returned = Arc::new(Returned::default());
        let io = ClientIo {
            socket: Some(socket),
            first,
            returned: returned.clone(),
            send_timeout,
            stall: None,
            stalled: None,
            unacked: None,
            writes,
        };
        (io, returned)
    }

    fn socket(&mut self) -> Pin<&mut TcpStream> {
        Pin::new(
            self.socket
                .as_mut()
                .expect("the socket leaves only when the ClientIo is dropped"),
        )
    }

    /// Called when a write could not proceed: pending until `send_timeout` has passed since
    /// the writes stalled with no room made by the client, then the error that makes hyper
    /// close the connection. Every quarter of it, the socket's unacknowledged bytes are
    /// looked at, or else `write` tries the stalled write on the socket itself.
    fn poll_stall(
        &mut self,
        cx: &mut Context<'_>,
        write: impl Fn(socket2::SockRef<'_>) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        let check = (self.send_timeout / STALL_CHECKS).max(Duration::from_millis(1));
        let now = Instant::now();
        let mut since = *self.stalled.get_or_insert(now);
        let sleep = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(check)));
        if since == now {
            sleep.as_mut().reset(now + check);
            self.unacked = self.socket.as_ref().and_then(unacked);
        }
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let socket = self
                .socket
                .as_ref()
                .expect("the socket leaves only when the ClientIo is dropped");
            let held = unacked(socket);
            // Where the acknowledged bytes cannot be read, room the client made is its reading.
            // (Where they can, room is not: the kernel grows a socket's send buffer on its own,
            // which kept a client that read nothing from ever being cut.)
            if held.is_none() {
                match write(socket2::SockRef::from(socket)) {
                    Ok(n) if n > 0 => return self.wrote(cx, Poll::Ready(Ok(n)), write),
                    Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Poll::Ready(Err(e)),
                    _ => {}
                }
            }
            let now = Instant::now();
            if held
                .zip(self.unacked)
                .is_some_and(|(held, before)| held < before)
            {
                // Acknowledged since the last look: the client read, too little yet to make
                // room for a segment. Counted from now, the latest it can have read: dated
                // at the last look, a read was up to a quarter of send_timeout older than it
                // was, and a client reading every 0.8 send_timeout was cut (audit CF). One
                // that stops is cut up to a quarter late instead.
                since = now;
                self.stalled = Some(now);
                self.writes.progressed();
            }
            self.unacked = held;
            if now >= since + self.send_timeout {
                self.writes.cut();
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client read nothing for send_timeout",
                )));
            }
            sleep
                .as_mut()
                .reset((now + check).min(since + self.send_timeout));
        }
    }

    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<usize>>,
        write: impl Fn(socket2::SockRef<'_>) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        match r {
            Poll::Pending => self.poll_stall(cx, write),
            ready => {
                // However the stalled write went out, the client made room for it.
                if self.stalled.take().is_some() && matches!(ready, Poll::Ready(Ok(n)) if n > 0) {
                    self.writes.progressed();
                }
                self.returned.mid_request.store(false, Ordering::Relaxed);
                ready
            }
        }
    }
}

impl Drop for ClientIo {
    fn drop(&mut self) {
        *self
            .returned
            .socket
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = self.socket.take();
    }
}

impl AsyncRead for ClientIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = if this.first.is_given() {
            this.socket().poll_read(cx, buf)
        } else {
            this.first.give(buf);
            // With what the socket has besides, in the same read: hyper sizes its read buffer
            // by its reads, and a first read of those few bytes alone has it double the
            // buffer (to 16 KiB) for the rest of the head. An error here is left to the next
            // read (or its end of file), as the bytes given must be returned now.
            if this.first.is_given() && buf.remaining() > 0 {
                let _ = this.socket().poll_read(cx, buf);
            }
            Poll::Ready(Ok(()))
        };
        if buf.filled().len() > before {
            this.returned.mid_request.store(true, Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = this.socket().poll_write(cx, buf);
        this.wrote(cx, r, |s| s.send(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = this.socket().poll_write_vectored(cx, bufs);
        this.wrote(cx, r, |s| s.send_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.socket.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().socket().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().socket().poll_shutdown(cx)
    }
}

/// The bytes `socket` holds that its peer has not acknowledged (Linux `SIOCOUTQ`): they fall
/// with every byte the client reads, where a write may wait for a segment's room.
fn unacked(socket: &TcpStream) -> Option<u64> {
    use std::os::fd::AsRawFd;
    unacked_by(socket.as_raw_fd())
}

/// [`unacked`], of the socket open as `fd`.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub(super) fn unacked_by(fd: std::os::fd::RawFd) -> Option<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one int through the pointer, which outlives the
    // call. Given a descriptor that is not (or no longer) a socket's, it fails or reads
    // another socket's count; it touches no memory of ours but `n`.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
    (r == 0).then(|| u64::try_from(n).unwrap_or(0))
}

#[cfg(not(target_os = "linux"))]
pub(super) fn unacked_by(_: std::os::fd::RawFd) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpSocket};

    const SEND_TIMEOUT: Duration = Duration::from_secs(1);

    /// The tests that take the process's HTTP/2 lingering slots, one at a time.
    static H2_SLOTS_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// Audit HB1: HTTP/2 bodies and HTTP/1 sockets lingered on one set of slots, so HTTP/2
    /// streams (cheap to open, 256 a connection) could take every HTTP/1 socket's. With every
    /// HTTP/2 slot taken, a socket still lingers: the client's bytes after its answer are
    /// read, not answered with a reset.
    #[tokio::test]
    async fn an_http1_socket_lingers_while_http2_bodies_hold_every_slot() {
        let _alone = H2_SLOTS_TESTS.lock().await;
        let _all = H2_LINGER_SLOTS
            .try_acquire_many(LINGERING as u32)
            .expect("no HTTP/2 body lingers in these tests");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        linger_close(server);
        let mut buf = [0u8; 16];
        assert_eq!(client.read(&mut buf).await.unwrap(), 0, "the server's FIN");
        // The rest of an upload: read by a lingering socket, reset by a closed one.
        client.write_all(&[b' '; 1000]).await.unwrap();
        // A round trip on loopback: a reset would have come back by now.
        tokio::time::sleep(LINGER_QUIET / 8).await;
        let more = client.write_all(&[b' '; 1000]).await;
        assert!(more.is_ok(), "not lingering: {more:?}");
    }

    /// Audit HB1: past its share, a connection's next body is not taken to linger, and the
    /// share is given back as its lingering reads end.
    #[test]
    fn a_connection_lingers_on_at_most_its_share() {
        let _alone = H2_SLOTS_TESTS.blocking_lock();
        let peer = IpAddr::from([192, 0, 2, 1]);
        let linger = Linger::new(1 << 20, Signal::new(), peer);
        let held: Vec<Lingering> = (0..LINGERING_PER_CONNECTION)
            .map(|_| linger.enter().expect("within the share"))
            .collect();
        assert!(linger.enter().is_none(), "past the share");
        // Another connection has its own.
        assert!(Linger::new(1 << 20, Signal::new(), peer).enter().is_some());
        drop(held);
        assert!(linger.enter().is_some(), "given back");
    }

    /// Audit HC2: 128 connections of one client, 8 bodies each, took all 1,024 slots and
    /// every other client's early answers were reset again. An address lingers on at most
    /// its share over all its connections; another address still lingers, and the share is
    /// given back (the address's entry gone) as the reads end.
    #[test]
    fn an_address_lingers_on_at_most_its_share() {
        let _alone = H2_SLOTS_TESTS.blocking_lock();
        let peer = IpAddr::from([192, 0, 2, 2]);
        let connections = LINGERING_PER_ADDRESS as usize / LINGERING_PER_CONNECTION;
        let held: Vec<Lingering> = (0..connections)
            .flat_map(|_| {
                let linger = Linger::new(1 << 20, Signal::new(), peer);
                (0..LINGERING_PER_CONNECTION)
                    .map(|_| linger.enter().expect("within the share"))
                    .collect::<Vec<_>>()
            })
            .collect();
        let more = Linger::new(1 << 20, Signal::new(), peer);
        assert!(more.enter().is_none(), "past the address's share");
        // The same client over a dual-stack listener.
        let mapped = IpAddr::from([0, 0, 0, 0, 0, 0xffff, 0xc000, 0x0202]);
        assert!(Linger::new(1 << 20, Signal::new(), mapped)
            .enter()
            .is_none());
        let other = Linger::new(1 << 20, Signal::new(), IpAddr::from([192, 0, 2, 3]));
        assert!(other.enter().is_some(), "another address has its own");
        drop(held);
        assert!(more.enter().is_some(), "given back");
        let by = H2_LINGERING_BY_ADDRESS.lock().unwrap();
        assert!(!by.contains_key(&peer), "no entry at zero: {by:?}");
    }

    /// A client with a 4 KiB receive buffer, and a task writing to it through a `ClientIo`
    /// as fast as it takes, until `send_timeout` cuts it. The server's send buffer is far
    /// larger than what the reader takes per send_timeout: its half drains in seconds (as the
    /// audit's 2.8 MB did in minutes).
    async fn writing_to_a_slow_client() -> (
        TcpStream,
        tokio::task::JoinHandle<io::Result<()>>,
        ClientWrites,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpSocket::new_v4().unwrap();
        client.set_recv_buffer_size(4096).unwrap();
        let client = client
            .connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        socket2::SockRef::from(&server)
            .set_send_buffer_size(1 << 20)
            .unwrap();
        let writes = ClientWrites::default();
        let (mut io, _returned) =
            ClientIo::new(server, First::default(), SEND_TIMEOUT, writes.clone());
        let writer = tokio::spawn(async move {
            let chunk = vec![b'x'; 64 << 10];
            loop {
                io.write_all(&chunk).await?;
            }
        });
        (client, writer, writes)
    }

    /// Audit CC4: a client reading a fast stream slowly, through a small receive buffer, is
    /// never cut by `send_timeout` while it reads, though Linux would not wake the blocked
    /// writer until half of its send buffer had drained (seconds at this rate); once it stops
    /// reading, it is cut, and the connection says the gateway cut it.
    #[tokio::test]
    async fn a_slow_reader_is_not_cut_while_it_reads_and_is_once_it_stops() {
        let (mut client, writer, writes) = writing_to_a_slow_client().await;
        // 2000 bytes every 50 ms (40 KB/s) for four send_timeouts.
        let reading_until = Instant::now() + 4 * SEND_TIMEOUT;
        let mut buf = [0u8; 2000];
        let mut read = 0;
        while Instant::now() < reading_until {
            read += client.read(&mut buf).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(
                !writer.is_finished(),
                "cut while reading, after {read} bytes"
            );
        }
        assert!(!writes.was_cut());
        assert!(writes.progress() > 0);
        // It stops reading: cut after about one send_timeout, well within ten.
        let cut = tokio::time::timeout(10 * SEND_TIMEOUT, writer)
            .await
            .expect("cut once it stopped reading")
            .unwrap()
            .unwrap_err();
        assert_eq!(cut.kind(), io::ErrorKind::TimedOut, "{cut}");
        assert!(writes.was_cut());
    }

    /// Audit CF: a client that empties its buffer every 0.8 send_timeout was cut: its read,
    /// seen at a look, was dated at the look before, up to a quarter of send_timeout too
    /// early. (The clock is paused; the socket is real: the reads' acknowledgements are in the
    /// kernel at once.)
    #[tokio::test(start_paused = true)]
    async fn a_reader_just_inside_send_timeout_is_never_cut() {
        let (mut client, writer, writes) = writing_to_a_slow_client().await;
        let mut buf = vec![0u8; 64 << 10];
        for i in 0..40 {
            tokio::time::sleep(SEND_TIMEOUT * 4 / 5).await;
            // What the buffer holds, at once: the window opens as it empties.
            let read = client.read(&mut buf).await.unwrap();
            assert!(read > 0);
            assert!(!writer.is_finished(), "cut after {i} reads");
        }
        assert!(!writes.was_cut());
        // Stopped: cut within a quarter more than send_timeout.
        let cut = tokio::time::timeout(SEND_TIMEOUT * 3 / 2, writer)
            .await
            .expect("cut once it stopped reading")
            .unwrap()
            .unwrap_err();
        assert_eq!(cut.kind(), io::ErrorKind::TimedOut, "{cut}");
    }
}
