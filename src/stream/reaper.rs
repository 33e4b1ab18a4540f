//! Ends a stream's upstream call when nobody reads the stream: at the request's deadline, or
//! once the client has taken nothing for `send_timeout`.
//!
//! The watchdog enforces a request's limits whenever the client connection polls the
//! response body. A client that stops reading (a zero TCP window, a stalled HTTP/2 stream)
//! stops those polls: the connection cannot write, so it does not ask for more. The upstream
//! is then held by backpressure, which bounds memory, but without a poll no limit fires, so
//! the upstream call (still generating, still billed), its connection and the route's
//! admission slot would be held for as long as the client likes.
//!
//! The reaper closes that gap from outside the body. The upstream body is shared with a small
//! task that drops it (closing its connection or resetting its HTTP/2 stream, and ending its
//! in-flight count) together with the admission slot:
//! - at the request's deadline, if the stream is still open. When the client reads again, the
//!   watchdog finds the upstream gone after the deadline and ends the stream with
//!   `deadline_exceeded`, as it would have on time;
//! - when the body has handed a frame to the client's connection and has not been asked for
//!   the next one for `send_timeout`. On HTTP/1 the client connection's own `send_timeout`
//!   (`client_io`) closes the connection first; this is what covers an HTTP/2 stream whose
//!   client stops granting it window while the connection's other streams flow, which no
//!   socket-level timer can see. Should the client read again, the stream is aborted (an
//!   HTTP/2 `RST_STREAM`), as an HTTP/1 client finds its connection closed; the request
//!   counts as `origin="client"`.
//!
//! The stall clock costs the stream's polls two plain writes under the lock they already take;
//! the task looks at them every quarter of `send_timeout`, so a stall is caught between one and
//! one and a quarter `send_timeout`s after the last poll.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant};

/// The upstream body, and how far the client's connection has read it.
struct Upstream<B> {
    body: Option<B>,
    /// Polls of the body so far.
    polls: u64,
    /// The last poll handed out a frame and no poll has come since: the client's connection
    /// holds a frame it has not made room for.
    handed: bool,
    /// Why the body is gone, once the reaper took it.
    reaped: Option<Reaped>,
}

/// What the body and its reaper share.
struct Shared<B, H> {
    upstream: Mutex<Upstream<B>>,
    /// What goes with the upstream call (the route's admission slot): dropped with it.
    held: Mutex<Option<H>>,
    /// The body was dropped: the reaper has nothing left to do.
    done: Notify,
}

impl<B, H> Shared<B, H> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Upstream<B>> {
        self.upstream.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn reap(&self, why: Option<Reaped>) {
        // Dropped outside the locks' scope: dropping an upstream body does I/O bookkeeping.
        let body = {
            let mut up = self.lock();
            if up.body.is_some() {
                up.reaped = why;
            }
            up.body.take()
        };
        let held = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop((body, held));
    }

    /// The polls so far, and whether a frame is out that the client has not made room for.
    fn progress(&self) -> (u64, bool) {
        let up = self.lock();
        (up.polls, up.handed)
    }
}

/// The upstream body, which the reaper may take away.
pub struct Reapable<B, H> {
    shared: Arc<Shared<B, H>>,
}

/// Why the reaper dropped the upstream body while nobody read the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Reaped {
    #[error("the request's deadline passed while the client was not reading")]
    Deadline,
    #[error("the client took nothing for send_timeout ({}ms)", .0.as_millis())]
    Stalled(Duration),
}

/// Stall checks per `send_timeout`.
const CHECKS: u32 = 4;

/// Shares `body` (and `held`, what must go with it, such as the route's admission slot) with a
/// task that drops both at `deadline`, or once the client has taken nothing for
/// `send_timeout`, unless the stream has ended by then.
pub fn guard<B, H>(
    body: B,
    held: Option<H>,
    deadline: Instant,
    send_timeout: Duration,
) -> Reapable<B, H>
where
    B: Send + 'static,
    H: Send + 'static,
{
    let shared = Arc::new(Shared {
        upstream: Mutex::new(Upstream {
            body: Some(body),
            polls: 0,
            handed: false,
            reaped: None,
        }),
        held: Mutex::new(held),
        done: Notify::new(),
    });
    let reaper = shared.clone();
    let every = (send_timeout / CHECKS).max(Duration::from_millis(1));
    tokio::spawn(async move {
        let timer = sleep_until((Instant::now() + every).min(deadline));
        tokio::pin!(timer);
        // The polls seen at the last check, and for how many checks in a row a frame has been
        // out with no poll since.
        let (mut seen, mut stalled) = (None, 0);
        loop {
            tokio::select! {
                biased;
                () = reaper.done.notified() => return,
                () = timer.as_mut() => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return reaper.reap(Some(Reaped::Deadline));
            }
            let (polls, handed) = reaper.progress();
            stalled = if handed && seen == Some(polls) {
                stalled + 1
            } else {
                0
            };
            if stalled >= CHECKS {
                return reaper.reap(Some(Reaped::Stalled(send_timeout)));
            }
            seen = Some(polls);
            timer.as_mut().reset((now + every).min(deadline));
        }
    });
    Reapable { shared }
}

impl<B, H> Drop for Reapable<B, H> {
    fn drop(&mut self) {
        // The upstream call and the slot go now, not when the reaper task next runs: a
        // client that left is cancelled upstream without waiting for another task, and the
        // in-flight gauge is down before the request's record (dropped after this) reports.
        self.shared.reap(None);
        // `notify_one` stores a permit, so a reaper that has not started waiting yet still
        // sees it.
        self.shared.done.notify_one();
    }
}

impl<B, H> Body for Reapable<B, H>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<crate::error::BoxError>,
{
    type Data = Bytes;
    type Error = crate::error::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut up = self.shared.lock();
        up.polls = up.polls.wrapping_add(1);
        let polled = match up.body.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            None => Poll::Ready(Some(Err(up.reaped.unwrap_or(Reaped::Deadline).into()))),
        };
        up.handed = matches!(polled, Poll::Ready(Some(Ok(_))));
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.shared
            .lock()
            .body
            .as_ref()
            .is_some_and(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.shared
            .lock()
            .body
            .as_ref()
            .map_or_else(SizeHint::default, Body::size_hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Channel};

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test(start_paused = true)]
    async fn an_unpolled_body_is_dropped_at_the_deadline_with_its_slot() {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(1);
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let slot = slots.clone().try_acquire_owned().unwrap();
        let mut body = guard(
            rx,
            Some(slot),
            Instant::now() + Duration::from_millis(500),
            HOUR,
        );
        tx.send_data(Bytes::from_static(b"a")).await.unwrap();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"a");
        assert_eq!(slots.available_permits(), 0);

        // Nobody polls from here on; the deadline passes.
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(
            tx.send_data(Bytes::from_static(b"b")).await.is_err(),
            "upstream dropped"
        );
        assert_eq!(slots.available_permits(), 1, "slot freed");
        let err = body.frame().await.unwrap().unwrap_err();
        assert_eq!(err.downcast_ref::<Reaped>(), Some(&Reaped::Deadline));
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_body_drops_the_upstream_and_the_slot_at_once() {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(1);
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let slot = slots.clone().try_acquire_owned().unwrap();
        let body = guard(
            rx,
            Some(slot),
            Instant::now() + Duration::from_secs(600),
            HOUR,
        );
        drop(body);
        // No yield in between: the reaper task has not run.
        assert_eq!(slots.available_permits(), 1, "slot freed");
        assert!(
            tx.send_data(Bytes::from_static(b"a")).await.is_err(),
            "upstream dropped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_ends_first_stops_its_reaper() {
        let (tx, rx) = Channel::<Bytes, std::io::Error>::new(1);
        let body = guard(
            rx,
            None::<()>,
            Instant::now() + Duration::from_secs(600),
            HOUR,
        );
        let shared = Arc::downgrade(&body.shared);
        drop(body);
        drop(tx);
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert!(shared.upgrade().is_none(), "the reaper task let go at once");
    }
    const SEND: Duration = Duration::from_millis(400);

    #[tokio::test(start_paused = true)]
    async fn a_frame_the_client_never_makes_room_for_ends_the_upstream_after_send_timeout() {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(4);
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let slot = slots.clone().try_acquire_owned().unwrap();
        let mut body = guard(rx, Some(slot), Instant::now() + HOUR, SEND);
        tx.send_data(Bytes::from_static(b"a")).await.unwrap();
        body.frame().await.unwrap().unwrap();

        // The frame is out and nobody asks for the next one: the client is not reading.
        tokio::time::sleep(SEND - Duration::from_millis(10)).await;
        assert_eq!(slots.available_permits(), 0, "not before send_timeout");
        tokio::time::sleep(SEND / CHECKS + Duration::from_millis(20)).await;
        assert_eq!(slots.available_permits(), 1, "slot freed");
        assert!(
            tx.send_data(Bytes::from_static(b"b")).await.is_err(),
            "upstream dropped"
        );
        let err = body.frame().await.unwrap().unwrap_err();
        assert_eq!(err.downcast_ref::<Reaped>(), Some(&Reaped::Stalled(SEND)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_upstream_or_a_slow_steady_reader_is_not_a_stall() {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(4);
        let body = guard(rx, None::<()>, Instant::now() + HOUR, SEND);
        tokio::pin!(body);
        // The client waits on a silent upstream: polled, nothing handed out.
        let waited = tokio::time::timeout(SEND * 5, body.frame()).await;
        assert!(waited.is_err(), "no frame came");
        // A client that takes each frame a little under send_timeout after the last.
        for _ in 0..10 {
            tx.send_data(Bytes::from_static(b"x")).await.unwrap();
            body.frame().await.unwrap().unwrap();
            tokio::time::sleep(SEND - Duration::from_millis(50)).await;
        }
        tx.send_data(Bytes::from_static(b"y")).await.unwrap();
        let last = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&last[..], b"y", "still streaming");
    }
}
