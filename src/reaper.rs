//! Ends a stream at its deadline even when nobody polls it.
//!
//! The watchdog enforces a request's limits whenever the client connection polls the
//! response body. A client that stops reading (a zero TCP window, a stalled HTTP/2 stream)
//! stops those polls: the connection cannot write, so it does not ask for more. The upstream
//! is then held by backpressure, which bounds memory, but without a poll no limit fires, so
//! the upstream call, its connection and the route's admission slot would be held for as long
//! as the client likes.
//!
//! The reaper closes that gap from outside the body. The upstream body is shared with a small
//! task that sleeps until the request's deadline; if the stream is still open then, the task
//! drops the upstream body (closing its connection or resetting its HTTP/2 stream, and
//! ending its in-flight count) and the admission slot. When the client reads again, the
//! watchdog finds the upstream gone after the deadline and ends the stream with
//! `deadline_exceeded`, as it would have on time.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant};

use crate::admission::Slot;

/// What the body and its reaper share.
struct Shared<B> {
    body: Mutex<Option<B>>,
    slot: Mutex<Option<Slot>>,
    /// The body was dropped: the reaper has nothing left to do.
    done: Notify,
}

impl<B> Shared<B> {
    fn reap(&self) {
        // Dropped outside the locks' scope: dropping an upstream body does I/O bookkeeping.
        let body = self
            .body
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let slot = self
            .slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop((body, slot));
    }
}

/// The upstream body, which the reaper may take away.
pub struct Reapable<B> {
    shared: Arc<Shared<B>>,
}

/// The upstream body was dropped at the request's deadline while nobody read the stream.
#[derive(Debug, thiserror::Error)]
#[error("the request's deadline passed while the client was not reading")]
pub struct Reaped;

/// Shares `body` (and the admission slot, if any) with a task that drops both at `deadline`
/// unless the stream has ended by then.
pub fn guard<B>(body: B, slot: Option<Slot>, deadline: Instant) -> Reapable<B>
where
    B: Send + 'static,
{
    let shared = Arc::new(Shared {
        body: Mutex::new(Some(body)),
        slot: Mutex::new(slot),
        done: Notify::new(),
    });
    let reaper = shared.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = sleep_until(deadline) => reaper.reap(),
            () = reaper.done.notified() => {}
        }
    });
    Reapable { shared }
}

impl<B> Drop for Reapable<B> {
    fn drop(&mut self) {
        // The upstream call and the slot go now, not when the reaper task next runs: a
        // client that left is cancelled upstream without waiting for another task, and the
        // in-flight gauge is down before the request's record (dropped after this) reports.
        self.shared.reap();
        // `notify_one` stores a permit, so a reaper that has not started waiting yet still
        // sees it.
        self.shared.done.notify_one();
    }
}

impl<B> Body for Reapable<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<crate::watchdog::BoxError>,
{
    type Data = Bytes;
    type Error = crate::watchdog::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut body = self
            .shared
            .body
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match body.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            None => Poll::Ready(Some(Err(Box::new(Reaped)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.shared
            .body
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.shared
            .body
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or_else(SizeHint::default, Body::size_hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Channel};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn an_unpolled_body_is_dropped_at_the_deadline_with_its_slot() {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(1);
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let slot = slots.clone().try_acquire_owned().unwrap();
        let mut body = guard(rx, Some(slot), Instant::now() + Duration::from_millis(500));
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
        assert!(err.is::<Reaped>());
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_body_drops_the_upstream_and_the_slot_at_once() {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(1);
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let slot = slots.clone().try_acquire_owned().unwrap();
        let body = guard(rx, Some(slot), Instant::now() + Duration::from_secs(600));
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
        let body = guard(rx, None, Instant::now() + Duration::from_secs(600));
        let shared = Arc::downgrade(&body.shared);
        drop(body);
        drop(tx);
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert!(shared.upgrade().is_none(), "the reaper task let go at once");
    }
}
