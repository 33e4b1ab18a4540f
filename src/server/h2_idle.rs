//! An HTTP/2 client connection with no stream open is closed after `header_read_timeout`, as
//! an idle HTTP/1 keep-alive connection is.
//!
//! hyper's HTTP/1 server applies `header_read_timeout` between requests; its HTTP/2 server
//! has no such limit, and its keep-alive pings only find peers that are gone. So a client
//! that sent the preface and then nothing, or a connection whose last stream ended long ago,
//! held its socket (and a `max_connections` slot) for as long as it answered pings: an easy
//! slowloris over h2c or h2.
//!
//! Each request on such a connection carries a [`Streams`] handle in its extensions; the
//! request's record holds an [`Open`] from it until the response's body is done. The
//! connection's task looks every `header_read_timeout`: when no stream is open and none has
//! started or ended since its last look, it starts a graceful shutdown (GOAWAY, then close once
//! the client acknowledges a PING), so a connection is closed between one and two limits after
//! its last stream ended (or, with none, after its preface); one whose client does not finish
//! the graceful close within another limit is dropped. The same
//! task starts the graceful shutdown when the server drains, and keeps the limit then: a
//! connection with no stream open for a limit since the drain began (a client that sent only
//! the preface, never acknowledges the PING, or went away) is dropped, as it holds no request
//! and would otherwise hold the whole shutdown for its grace.
//!
//! A stream's body is done when h2 has taken its last bytes, not when they went out: h2 sends
//! what the client's flow-control window allows, and keeps the rest. A slow reader of a large
//! document still has its answer going out with no stream counted open, so a limit in which
//! the connection wrote more than `SENDING` bytes counts as activity too (audit Q: a 60 KB
//! document read at 2 KB/s was cut after 8 KB by the drain, after 18 KB by the idle limit).
//! The threshold keeps a client's PINGs (17 bytes an answer) from holding an idle connection.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::stream::signal::Signal;
use hyper::body::Body;
use hyper::rt::bounds::Http2ServerConnExec;
use hyper::rt::{Read, Write};
use hyper::server::conn::http2;
use hyper::service::HttpService;
use hyper_util::server::graceful::Watcher;
use tokio::time::{sleep, Instant};

use crate::error::BoxError;
use crate::http::conn::Streams;

/// Bytes written within one limit that show an answer still going out (see the notes).
const SENDING: u64 = 512;

/// The connection's socket, counting the bytes written to it.
struct Counted<I> {
    io: I,
    written: Arc<AtomicU64>,
}

impl<I: Read + Unpin> Read for Counted<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: Write + Unpin> Write for Counted<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.written.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.written.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Serves an HTTP/2 connection on `io` with the service `service` makes (given the handle its
/// requests count their streams with) until it ends: gracefully shut down once it has had no
/// open stream for `limit` (see the module's notes), or when `drain` is cancelled. `watcher`
/// is the server's count of the connections it waits for when it drains: held until this
/// one ends. (hyper-util's own `watch` cannot be told to shut a connection down for any other
/// reason.)
pub async fn serve<I, S, B, E>(
    builder: &http2::Builder<E>,
    io: I,
    service: impl FnOnce(Streams) -> S,
    limit: Duration,
    drain: Signal,
    watcher: Watcher,
) -> hyper::Result<()>
where
    S: HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    I: Read + Write + Unpin,
    B: Body + 'static,
    B::Error: Into<BoxError>,
    E: Http2ServerConnExec<S::Future, B> + Clone,
{
    let streams = Streams::default();
    let written = Arc::new(AtomicU64::new(0));
    let io = Counted {
        io,
        written: written.clone(),
    };
    let conn = builder.serve_connection(io, service(streams.clone()));
    tokio::pin!(conn);
    let timer = sleep(limit);
    tokio::pin!(timer);
    let (mut seen, mut seen_written) = (0, 0);
    // Idle: GOAWAY sent for the idle limit. Draining: GOAWAY sent for the server's drain.
    let (mut idle, mut draining) = (false, false);
    let served = loop {
        tokio::select! {
            r = conn.as_mut() => break r,
            () = drain.fired(), if !idle && !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
                // Counted from the drain: a connection is not dropped for the quiet before it.
                seen = streams.changes();
                timer.as_mut().reset(Instant::now() + limit);
            }
            () = timer.as_mut() => {
                let now_written = written.load(Ordering::Relaxed);
                let sending = now_written - seen_written > SENDING;
                seen_written = now_written;
                if sending {
                    // An answer h2 still holds is going out: not idle, whatever was said.
                    seen = streams.changes();
                    timer.as_mut().reset(Instant::now() + limit);
                    continue;
                }
                if idle {
                    // The graceful close waits for the client to acknowledge a PING; one that
                    // never does would hold the connection until the keep-alive timeout.
                    break Ok(());
                }
                let changes = streams.changes();
                if streams.open_now() == 0 && changes == seen && draining {
                    // Draining, and a limit with nothing open: the client has not finished
                    // the close and has no request left to wait for.
                    break Ok(());
                }
                if streams.open_now() == 0 && changes == seen {
                    idle = true;
                    conn.as_mut().graceful_shutdown();
                    timer.as_mut().reset(Instant::now() + limit);
                } else {
                    seen = changes;
                    timer.as_mut().reset(Instant::now() + limit);
                }
            }
        }
    };
    drop(watcher);
    served
}
