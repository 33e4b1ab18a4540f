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
//! its last stream ended (or, with none, after its accept); one whose client does not finish
//! the graceful close within another limit is dropped. The same
//! task starts the graceful shutdown when the server drains, and keeps the limit then: a
//! connection with no stream open for a limit since the drain began (a client that sent only
//! the preface, never acknowledges the PING, or went away) is dropped, as it holds no request
//! and would otherwise hold the whole shutdown for its grace.
//!
//! A stream's body is done when h2 has taken its last bytes, not when they went out: h2 sends
//! what the client's flow-control window allows, and keeps the rest. So the gateway's answers
//! hand h2 their last byte alone, and their record (and its [`Open`]) lives until h2 took it,
//! which it does only once everything before it went out (`stream::watchdog::Delivery`;
//! audit KC 1: a 169 KB document handed over whole, its client pausing 30 s, was cut at two
//! limits). An answer whose end comes only after its last frame was handed over (an SSE
//! stream whose upstream ends it in a frame of its own) cannot hold that frame back, and may
//! still be going out with no stream counted open, so a limit in which the connection wrote
//! DATA counts as activity too (audit Q: a 60 KB document read at 2 KB/s was cut after 8 KB
//! by the drain, after 18 KB by the idle limit). Only DATA: the frames a
//! client can have the gateway write without a stream (PING and SETTINGS acknowledgements,
//! WINDOW_UPDATE, GOAWAY) are no answer going out, and counted, a PING every 30 ms held an
//! idle connection for as long as the client liked (audit CC).
//!
//! The same looks close a connection that is stuck ([`Stuck`]): a stream waits past its limit
//! for a poll, and no DATA has gone out for `send_timeout` (audit KA 1).

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
use tokio::time::{sleep_until, Instant};

use crate::error::BoxError;
use crate::http::conn::Streams;
use crate::server::h2_stuck::Stuck;

/// The connection's socket, counting the DATA payload bytes written to it.
struct Counted<I> {
    io: I,
    frames: Frames,
    data: Arc<AtomicU64>,
}

impl<I> Counted<I> {
    fn wrote<'a>(&mut self, n: usize, bufs: impl IntoIterator<Item = &'a [u8]>) {
        let mut left = n;
        let mut data = 0;
        for buf in bufs {
            if left == 0 {
                break;
            }
            let taken = buf.len().min(left);
            data += self.frames.data_in(&buf[..taken]);
            left -= taken;
        }
        if data > 0 {
            self.data.fetch_add(data, Ordering::Relaxed);
        }
    }
}

/// The frame type of DATA (RFC 9113 6.1).
const DATA: u8 = 0;

/// Where the bytes written so far stand in the frames they make up: each a 9-byte header
/// (payload length in its first three bytes, type in its fourth) and its payload (RFC 9113
/// 4.1). The server writes nothing else (its preface is a SETTINGS frame).
#[derive(Default)]
struct Frames {
    header: [u8; 9],
    /// Bytes of the next frame's header written so far.
    have: usize,
    /// Payload bytes of the current frame still to come.
    left: usize,
    data: bool,
}

impl Frames {
    /// The DATA payload bytes among `bytes`, the next ones written.
    fn data_in(&mut self, mut bytes: &[u8]) -> u64 {
        let mut data = 0;
        while !bytes.is_empty() {
            if self.left > 0 {
                let n = bytes.len().min(self.left);
                if self.data {
                    data += n as u64;
                }
                self.left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (self.header.len() - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == self.header.len() {
                let h = self.header;
                self.have = 0;
                self.left = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                self.data = h[3] == DATA;
            }
        }
        data
    }
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
            self.wrote(n, [buf]);
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
            self.wrote(n, bufs.iter().map(|b| &**b));
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
/// open stream for `limit` (see the module's notes; the first look is a limit after `since`,
/// the connection's accept, as the wait for its preface or TLS handshake counts), or when
/// `drain` is cancelled. `watcher`
/// is the server's count of the connections it waits for when it drains: held until this
/// one ends. (hyper-util's own `watch` cannot be told to shut a connection down for any other
/// reason.) `stuck`: told at each look what the connection wrote, it also has the connection
/// shut down as the idle limit does.
#[allow(clippy::too_many_arguments)]
pub async fn serve<I, S, B, E>(
    builder: &http2::Builder<E>,
    io: I,
    service: impl FnOnce(Streams) -> S,
    limit: Duration,
    since: Instant,
    drain: Signal,
    watcher: Watcher,
    mut stuck: Stuck,
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
    let data = Arc::new(AtomicU64::new(0));
    let io = Counted {
        io,
        frames: Frames::default(),
        data: data.clone(),
    };
    let conn = builder.serve_connection(io, service(streams.clone()));
    tokio::pin!(conn);
    let timer = sleep_until(since + limit);
    tokio::pin!(timer);
    let (mut seen, mut seen_data) = (0, 0);
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
                let now_data = data.load(Ordering::Relaxed);
                let sending = now_data != seen_data;
                seen_data = now_data;
                let stuck_now = stuck.look(&streams, now_data);
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
                if stuck_now {
                    // Nothing can go out, and a stream waits past its limit for the poll that
                    // alone resets it: closed as an idle connection is, GOAWAY and dropped a
                    // limit later, which ends every stream (audit KA 1).
                    idle = true;
                    conn.as_mut().graceful_shutdown();
                    timer.as_mut().reset(Instant::now() + limit);
                    continue;
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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use std::convert::Infallible;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    const LIMIT: Duration = Duration::from_secs(3);

    /// Serves the server's end of an in-memory connection, each request answered `body` (its
    /// stream counted open until the answer is handed to h2); when it ended.
    fn serve_answering(io: DuplexStream, body: Bytes) -> tokio::task::JoinHandle<Instant> {
        tokio::spawn(async move {
            let mut builder = http2::Builder::new(TokioExecutor::new());
            builder.timer(TokioTimer::new());
            let graceful = hyper_util::server::graceful::GracefulShutdown::new();
            let service = |streams: Streams| {
                service_fn(move |_req| {
                    let open = streams.open();
                    let body = body.clone();
                    async move {
                        drop(open);
                        Ok::<_, Infallible>(http::Response::new(Full::new(body)))
                    }
                })
            };
            let _ = serve(
                &builder,
                TokioIo::new(io),
                service,
                LIMIT,
                Instant::now(),
                Signal::new(),
                graceful.watcher(),
                Stuck::new(
                    Duration::from_secs(60),
                    crate::http::conn::ClientWrites::default(),
                ),
            )
            .await;
            Instant::now()
        })
    }

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 0];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn only_data_payloads_count_however_the_writes_cut_the_frames() {
        let mut out = frame(4, 0, &[0; 6]); // SETTINGS
        out.extend(frame(DATA, 0, &[7; 300]));
        out.extend(frame(6, 1, &[0; 8])); // PING ACK
        out.extend(frame(DATA, 1, &[]));
        out.extend(frame(8, 0, &[0, 0, 1, 0])); // WINDOW_UPDATE
        out.extend(frame(DATA, 0, &[7; 5]));
        for cut in [1, 2, 5, 9, 10, 17, 4096] {
            let mut frames = Frames::default();
            let data: u64 = out.chunks(cut).map(|c| frames.data_in(c)).sum();
            assert_eq!(data, 305, "written {cut} bytes at a time");
        }
    }

    /// Audit CC: a client that opens no stream but PINGs often made the gateway write more than
    /// the old byte threshold in acknowledgements each limit, and held its connection (and a
    /// `max_connections` slot) for as long as it liked.
    #[tokio::test(start_paused = true)]
    async fn pings_do_not_keep_a_connection_with_no_stream_open() {
        let (client, server) = tokio::io::duplex(64 << 10);
        let start = Instant::now();
        let ended = serve_answering(server, Bytes::new());
        let (mut read, mut write) = tokio::io::split(client);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok(1..) = read.read(&mut buf).await {}
        });
        let pinger = tokio::spawn(async move {
            write.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
            write.write_all(&frame(4, 0, &[])).await?;
            loop {
                // Fifty a second: 150 acknowledgements, 2,550 bytes, a limit.
                tokio::time::sleep(Duration::from_millis(20)).await;
                write.write_all(&frame(6, 0, &[1; 8])).await?;
            }
            #[allow(unreachable_code)]
            Ok::<(), std::io::Error>(())
        });
        let ended = tokio::time::timeout(LIMIT * 10, ended)
            .await
            .expect("a connection that only PINGs was still open after ten limits")
            .unwrap();
        assert!(
            ended - start <= LIMIT * 2,
            "closed after {:?}",
            ended - start
        );
        pinger.abort();
    }

    /// What counting DATA is for: an answer whose body h2 took at once (its stream no longer
    /// open) still going out to a slow reader long after, past several limits, is not cut.
    #[tokio::test(start_paused = true)]
    async fn an_answer_still_going_out_keeps_its_connection() {
        const SIZE: usize = 128 << 10;
        let (client, server) = tokio::io::duplex(64 << 10);
        let ended = serve_answering(server, Bytes::from(vec![b'x'; SIZE]));
        let (mut client, conn) = h2::client::Builder::new()
            .initial_window_size(1024)
            .handshake::<_, Bytes>(client)
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = http::Request::get("http://localhost/").body(()).unwrap();
        let (response, _) = client.send_request(req, true).unwrap();
        let mut body = response.await.unwrap().into_body();
        let mut got = 0;
        let start = Instant::now();
        // 1 KiB every 100 ms: 12.8 s, more than four limits.
        while let Some(chunk) = body.data().await {
            let chunk = chunk.expect("the answer ends without an error");
            got += chunk.len();
            tokio::time::sleep(Duration::from_millis(100)).await;
            body.flow_control().release_capacity(chunk.len()).unwrap();
        }
        assert_eq!(got, SIZE);
        assert!(start.elapsed() > LIMIT * 4, "{:?}", start.elapsed());
        drop(client);
        tokio::time::timeout(LIMIT * 3, ended)
            .await
            .expect("closed once its answer is out")
            .unwrap();
    }
}
