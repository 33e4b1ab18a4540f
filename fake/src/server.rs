//! The accept loop and the connections it serves, with the socket wrapper that notices a
//! vanished peer.

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::records::{ConnectionRecord, Shared};
use crate::respond::handle;

/// The accepted socket, stamping `closed_at` on EOF/error and when hyper drops it.
pub(crate) struct RecordingIo {
    pub(crate) inner: TcpStream,
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: u64,
}

impl AsyncRead for RecordingIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let had_room = buf.remaining() > 0;
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        let eof = matches!(result, Poll::Ready(Ok(()))) && had_room && buf.filled().len() == before;
        if eof || matches!(result, Poll::Ready(Err(_))) {
            self.shared.connection_closed(self.id);
        }
        result
    }
}

impl RecordingIo {
    pub(crate) fn note<T>(&self, result: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        // A failed write (EPIPE, ECONNRESET) is as good a sign of a vanished peer as a read.
        if matches!(result, Poll::Ready(Err(_))) {
            self.shared.connection_closed(self.id);
        }
        result
    }
}

impl AsyncWrite for RecordingIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note(result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note(result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.note(result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Drop for RecordingIo {
    fn drop(&mut self) {
        self.shared.connection_closed(self.id);
    }
}

pub(crate) async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // EMFILE and friends: back off briefly instead of spinning on the error.
                tracing::warn!(%error, "fake upstream accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "fake upstream could not set TCP_NODELAY");
        }
        let opened_at = Instant::now();
        let id = if !shared.recording {
            // No record to find by it: its close has nothing to stamp.
            shared.next_conn_id.fetch_add(1, Ordering::Relaxed)
        } else {
            shared.update(|records| {
                let id = records.connections.len() as u64;
                let closed_at = None;
                records.connections.push(ConnectionRecord {
                    id,
                    peer,
                    opened_at,
                    closed_at,
                });
                id
            })
        };
        let io = RecordingIo {
            inner: stream,
            shared: shared.clone(),
            id,
        };
        tokio::spawn(serve_connection(io, shared.clone(), cancel.clone()));
    }
}

pub(crate) async fn serve_connection(
    io: RecordingIo,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let id = io.id;
    let service = service_fn(move |request| handle(shared.clone(), id, request));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's default of 200 streams per connection is too few for h2 benchmarks.
    builder.http2().max_concurrent_streams(10_000);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::select! {
        result = connection => {
            if let Err(error) = result {
                tracing::debug!(conn = id, %error, "fake upstream connection ended with an error");
            }
        }
        // Dropping the connection future drops the socket, which records the close.
        () = cancel.cancelled() => {}
    }
}
