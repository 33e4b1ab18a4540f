//! The byte stream of one upstream connection: plain TCP inline, a TLS session boxed.
//!
//! hyper-rustls's `MaybeHttpsStream` holds the rustls session inline, so it is 1,104 bytes
//! whichever it carries; a plain `http://` connection is 32. hyper keeps the stream inline in
//! every state of a connection: in each HTTP/1 connection's task for as long as the
//! connection lives (one per concurrent stream), and several times over in the future that
//! connects it. Boxing the TLS session costs one allocation per TLS handshake, next to the
//! handshake itself, and leaves a plain connection a kilobyte smaller (measured in
//! BENCHMARKS.md: memory per stream).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_rustls::MaybeHttpsStream;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

type Tls = MaybeHttpsStream<TokioIo<TcpStream>>;

/// An upstream connection's stream, as the connector made it.
pub enum UpstreamIo {
    Plain(TokioIo<TcpStream>),
    /// Always the `Https` case of the connector's stream, which also says what ALPN chose.
    Tls(Box<Tls>),
}

impl From<Tls> for UpstreamIo {
    fn from(stream: Tls) -> Self {
        match stream {
            MaybeHttpsStream::Http(tcp) => Self::Plain(tcp),
            tls => Self::Tls(Box::new(tls)),
        }
    }
}

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        match self {
            Self::Plain(tcp) => tcp.connected(),
            // Marks the connection h2 when ALPN chose it.
            Self::Tls(tls) => tls.connected(),
        }
    }
}

impl Read for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Self::Tls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
        }
    }
}

impl Write for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Self::Tls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Self::Tls(tls) => Pin::new(&mut **tls).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(tcp) => tcp.is_write_vectored(),
            Self::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Self::Tls(tls) => Pin::new(&mut **tls).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Self::Tls(tls) => Pin::new(&mut **tls).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_connection_is_not_sized_for_a_tls_session() {
        assert!(std::mem::size_of::<UpstreamIo>() <= 48);
        assert!(std::mem::size_of::<Tls>() > 512, "what the box saves");
    }
}
