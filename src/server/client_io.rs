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
//! One timer per connection, made the first time a write stalls and reset (not recreated)
//! at every later stall; a write that makes progress disarms it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};

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
    static SLOTS: Semaphore = Semaphore::const_new(LINGERING);
    let Ok(slot) = SLOTS.try_acquire() else {
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
/// many sockets may linger at once.
const LINGER_QUIET: Duration = Duration::from_secs(2);
const LINGER_MOST: Duration = Duration::from_secs(30);
const LINGERING: usize = 1024;

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
    stalled: bool,
}

impl ClientIo {
    /// `first`: what was read of the socket before (hyper reads it first).
    pub fn new(
        socket: TcpStream,
        first: First,
        send_timeout: Duration,
    ) -> (ClientIo, Arc<Returned>) {
        let returned = Arc::new(Returned::default());
        let io = ClientIo {
            socket: Some(socket),
            first,
            returned: returned.clone(),
            send_timeout,
            stall: None,
            stalled: false,
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
    /// the writes stalled, then the error that makes hyper close the connection.
    fn poll_stall<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let timeout = self.send_timeout;
        let sleep = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if !self.stalled {
            self.stalled = true;
            sleep.as_mut().reset(Instant::now() + timeout);
        }
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing for send_timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn wrote<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => self.poll_stall(cx),
            ready => {
                self.stalled = false;
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
        this.wrote(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = this.socket().poll_write_vectored(cx, bufs);
        this.wrote(cx, r)
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
