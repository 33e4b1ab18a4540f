//! The body of a request to an upstream, which says when its last byte went to the connection:
//! the first-token clock starts then, not while a large upload (a transcription's audio, a
//! file) is still on its way.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;

/// How much of the body is handed to the connection at once. hyper takes a frame whenever its
/// write buffer has room (HTTP/1.1) or the stream has window (HTTP/2) and queues all of it:
/// the whole body as one frame would be "sent" the moment the connection is ready, however
/// slowly the upstream reads it. In pieces, the last one is taken when the rest has gone out
/// but for what hyper buffers (about 400 KiB on HTTP/1.1, the stream's window on HTTP/2).
const PIECE: usize = 64 * 1024;

/// The request's bytes, handed out a piece at a time, and the signal its end sends.
pub struct RequestBody {
    rest: Bytes,
    sent: Option<oneshot::Sender<()>>,
    /// Counts the pieces let go, for a body that is sent later.
    taken: Option<Taken>,
}

/// A body of one piece over HTTP/1.1 goes with the head, into hyper's buffer, as soon as the
/// connection takes the request: sent with it, and told by no signal (a channel per request
/// for what the connection tells anyway). Over HTTP/2 its DATA waits for the stream's window,
/// which the upstream may keep shut (audit MC 4): there it is sent when the last piece is.
pub enum Sent {
    WithTheHead,
    Later(BodySent, Taken),
}

/// How many of a body's pieces the connection has let go so far: an upstream that takes none
/// for the route's first-token limit after the head is stalled, not slowly taking an upload
/// (audit NA 1).
/// Read when the attempt looks, never waited on: a piece costs one atomic add.
#[derive(Clone, Default)]
pub struct Taken(Arc<AtomicUsize>);

impl Taken {
    pub fn pieces(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// Resolves once the body's last piece was taken by the connection (at once for an empty body,
/// which goes whole with the head). An error means the body was dropped before its end: the
/// request failed, or the answer came without it.
pub type BodySent = oneshot::Receiver<()>;

/// One piece of the body as hyper holds it. The last one carries the signal and sends it when
/// dropped: once its bytes went into the connection's write buffer (HTTP/1.1, or h2's codec
/// once the stream's window let them go), or the request was given up. hyper's HTTP/2 client
/// polls a body before the stream has any window (hyper 1.12; hyper#4003), and h2 queues the
/// piece until the window opens: that a piece was polled says nothing of its having gone.
#[derive(Debug)]
pub struct Piece {
    bytes: Bytes,
    last: Option<oneshot::Sender<()>>,
    taken: Option<Arc<AtomicUsize>>,
}

impl Buf for Piece {
    fn remaining(&self) -> usize {
        self.bytes.remaining()
    }

    fn chunk(&self) -> &[u8] {
        self.bytes.chunk()
    }

    fn advance(&mut self, n: usize) {
        self.bytes.advance(n);
    }

    // As `Bytes` does it, without a copy.
    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        self.bytes.copy_to_bytes(len)
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        if let Some(taken) = &self.taken {
            taken.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(tx) = self.last.take() {
            // The attempt may have ended already: nobody to tell.
            let _ = tx.send(());
        }
    }
}

impl RequestBody {
    /// `h2`: the request may go over HTTP/2 (the upstream may speak it). Only then does a
    /// body of one piece need the signal; an HTTP/1.1 upstream's requests make no channel.
    pub fn new(bytes: Bytes, h2: bool) -> (Self, Sent) {
        if bytes.is_empty() || (bytes.len() <= PIECE && !h2) {
            let body = Self {
                rest: bytes,
                sent: None,
                taken: None,
            };
            return (body, Sent::WithTheHead);
        }
        let (tx, rx) = oneshot::channel();
        let taken = Taken::default();
        let body = Self {
            rest: bytes,
            sent: Some(tx),
            taken: Some(taken.clone()),
        };
        (body, Sent::Later(rx, taken))
    }
}

impl Body for RequestBody {
    type Data = Piece;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Piece>, Infallible>>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            // Polled again at its end (it ended empty): nothing left to wait for.
            this.sent.take();
            return Poll::Ready(None);
        }
        let bytes = this.rest.split_to(PIECE.min(this.rest.len()));
        // hyper does not poll again a body that says it has ended.
        let last = if this.rest.is_empty() {
            this.sent.take()
        } else {
            None
        };
        let taken = this.taken.as_ref().map(|t| t.0.clone());
        Poll::Ready(Some(Ok(Frame::data(Piece { bytes, last, taken }))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    /// Exact, as `Full`'s: an HTTP/1.1 request keeps its `Content-Length`.
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn the_signal_comes_with_the_last_piece_and_not_before() {
        let (mut body, sent) = RequestBody::new(Bytes::from(vec![7u8; 2 * PIECE + 1]), false);
        let Sent::Later(mut sent, _) = sent else {
            panic!("a body of three pieces is sent after its head")
        };
        assert_eq!(body.size_hint().exact(), Some(2 * PIECE as u64 + 1));
        let mut got = Vec::new();
        for _ in 0..2 {
            let frame = body.frame().await.unwrap().unwrap();
            got.extend_from_slice(frame.into_data().unwrap().chunk());
            assert!(sent.try_recv().is_err(), "signalled before the end");
        }
        let last = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(last.remaining(), 1);
        assert!(body.is_end_stream());
        assert!(sent.try_recv().is_err(), "the last piece is held, not gone");
        let len = last.remaining();
        drop(last);
        assert!(sent.try_recv().is_ok());
        assert_eq!(got.len() + len, 2 * PIECE + 1);
    }

    #[tokio::test]
    async fn a_body_of_one_piece_is_sent_with_the_head() {
        for len in [0, 1, PIECE] {
            let (mut body, sent) = RequestBody::new(Bytes::from(vec![7u8; len]), false);
            assert!(matches!(sent, Sent::WithTheHead), "{len}");
            assert_eq!(body.size_hint().exact(), Some(len as u64));
            if len > 0 {
                let frame = body.frame().await.unwrap().unwrap();
                assert_eq!(frame.into_data().unwrap().remaining(), len);
            }
            assert!(body.is_end_stream());
        }
    }

    /// Audit MC 4: over HTTP/2 a body of one piece is polled before the stream has window,
    /// and h2 holds it until the window opens: it is sent when the piece is let go, not when
    /// hyper took it. An empty body goes whole in the HEADERS frame.
    #[tokio::test]
    async fn over_http2_a_body_of_one_piece_is_sent_when_the_piece_is_let_go() {
        let (_, sent) = RequestBody::new(Bytes::new(), true);
        assert!(matches!(sent, Sent::WithTheHead));
        let (mut body, sent) = RequestBody::new(Bytes::from_static(b"{}"), true);
        let Sent::Later(mut sent, _) = sent else {
            panic!("may wait for the stream's window")
        };
        let piece = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert!(body.is_end_stream());
        assert!(sent.try_recv().is_err(), "polled, and still held");
        drop(piece);
        assert!(sent.try_recv().is_ok());
    }
}
