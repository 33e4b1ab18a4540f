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

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_rustls::MaybeHttpsStream;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

type Tls = MaybeHttpsStream<TokioIo<TcpStream>>;

/// An upstream connection's stream, as the connector made it.
pub struct UpstreamIo {
    stream: Stream,
    /// Until the server's first bytes arrive on an HTTP/2 connection: when they must.
    first_frame: Option<Pin<Box<Sleep>>>,
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

    /// Fails the connection's reads if the server has sent nothing by `deadline`.
    pub(super) fn expect_first_frame_by(&mut self, deadline: Instant) {
        self.first_frame = Some(Box::pin(tokio::time::sleep_until(deadline)));
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
        }
    }
}

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        match &self.stream {
            Stream::Plain(tcp) => tcp.connected(),
            // Marks the connection h2 when ALPN chose it.
            Stream::Tls(tls) => tls.connected(),
        }
    }
}

impl Read for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let read = match &mut this.stream {
            Stream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
        };
        let Some(deadline) = &mut this.first_frame else {
            return read;
        };
        if read.is_ready() {
            // Bytes, an end or an error: the server has spoken, or the read says why not.
            this.first_frame = None;
            return read;
        }
        if deadline.as_mut().poll(cx).is_ready() {
            this.first_frame = None;
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, NoFirstFrame)));
        }
        Poll::Pending
    }
}

impl Write for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(tcp) => tcp.is_write_vectored(),
            Stream::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_flush(cx),
        }
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

    #[test]
    fn a_plain_connection_is_not_sized_for_a_tls_session() {
        // 40 for a plain stream and the enum's tag, 8 for the first-frame timer's box.
        assert!(std::mem::size_of::<UpstreamIo>() <= 48);
        assert!(std::mem::size_of::<Tls>() > 512, "what the box saves");
    }
}
