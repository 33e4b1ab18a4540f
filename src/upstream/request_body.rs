//! The body of a request to an upstream, which says when its last byte went to the connection:
//! the first-token clock starts then, not while a large upload (a transcription's audio, a
//! file) is still on its way.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
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
}

/// A body of one piece goes with the head, into hyper's buffer, as soon as the connection
/// takes the request: sent with it, and told by no signal (a channel per request for what the
/// connection tells anyway).
pub enum Sent {
    WithTheHead,
    Later(BodySent),
}

/// Resolves once the body's last piece was taken by the connection (at once for an empty body,
/// which goes whole with the head). An error means the body was dropped before its end: the
/// request failed, or the answer came without it.
pub type BodySent = oneshot::Receiver<()>;

impl RequestBody {
    pub fn new(bytes: Bytes) -> (Self, Sent) {
        if bytes.len() <= PIECE {
            let body = Self {
                rest: bytes,
                sent: None,
            };
            return (body, Sent::WithTheHead);
        }
        let (tx, rx) = oneshot::channel();
        let body = Self {
            rest: bytes,
            sent: Some(tx),
        };
        (body, Sent::Later(rx))
    }

    fn signal(&mut self) {
        if let Some(tx) = self.sent.take() {
            // The attempt may have ended already: nobody to tell.
            let _ = tx.send(());
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            this.signal();
            return Poll::Ready(None);
        }
        let piece = this.rest.split_to(PIECE.min(this.rest.len()));
        // hyper does not poll again a body that says it has ended.
        if this.rest.is_empty() {
            this.signal();
        }
        Poll::Ready(Some(Ok(Frame::data(piece))))
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
        let (mut body, sent) = RequestBody::new(Bytes::from(vec![7u8; 2 * PIECE + 1]));
        let Sent::Later(mut sent) = sent else {
            panic!("a body of three pieces is sent after its head")
        };
        assert_eq!(body.size_hint().exact(), Some(2 * PIECE as u64 + 1));
        let mut got = Vec::new();
        for _ in 0..2 {
            let frame = body.frame().await.unwrap().unwrap();
            got.extend_from_slice(&frame.into_data().unwrap());
            assert!(sent.try_recv().is_err(), "signalled before the end");
        }
        let last = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(last.len(), 1);
        assert!(body.is_end_stream());
        assert!(sent.try_recv().is_ok());
        assert_eq!(got.len() + last.len(), 2 * PIECE + 1);
    }

    #[tokio::test]
    async fn a_body_of_one_piece_is_sent_with_the_head() {
        for len in [0, 1, PIECE] {
            let (mut body, sent) = RequestBody::new(Bytes::from(vec![7u8; len]));
            assert!(matches!(sent, Sent::WithTheHead), "{len}");
            assert_eq!(body.size_hint().exact(), Some(len as u64));
            if len > 0 {
                let frame = body.frame().await.unwrap().unwrap();
                assert_eq!(frame.into_data().unwrap().len(), len);
            }
            assert!(body.is_end_stream());
        }
    }
}
