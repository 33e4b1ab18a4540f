//! A stream's one timer, cheap to poll again and again.
//!
//! The watchdog polls its timer whenever the upstream body is pending, once or twice a chunk.
//! Polling a `Sleep` takes the task's cooperative budget and re-registers the waker with the
//! timer wheel (an atomic compare-and-swap and a waker comparison in the driver's entry),
//! about 200 instructions, to learn that a limit minutes away has not fired. This timer
//! polls its `Sleep` only when it was reset since, or when the task polling it changed;
//! otherwise it reads the entry's elapsed flag, which the driver sets before it wakes the
//! registered task.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::{sleep_until, Instant, Sleep};

/// A limit of the upstream's timing (first token, idle) found expired more than this after its
/// time: the gateway itself was not running (stopped, CPU-throttled, swapping), and what the
/// upstream sent meanwhile may sit unread in the socket, its connection's task not yet run.
pub const LATE: Duration = Duration::from_millis(50);

/// How long such a limit waits, once, for that task to hand over what came: a few turns of
/// a runtime that just woke up.
pub const RECHECK: Duration = Duration::from_millis(20);

/// When a limit due at `due`, found expired at `now`, looks once more at the upstream before
/// it fires: `None` when it was checked on time, and fires now. Only the upstream's own
/// limits ask: the deadline is absolute, however late the gateway noticed it.
#[inline]
pub fn recheck_at(due: Instant, now: Instant) -> Option<Instant> {
    (now.saturating_duration_since(due) > LATE).then(|| now + RECHECK)
}

pub struct Timer {
    // Boxed, so that the body holding it is `Unpin` (see the watchdog); reset, never
    // recreated.
    sleep: Pin<Box<Sleep>>,
    /// The task the `Sleep` is registered to wake, since its last reset.
    registered: Option<Waker>,
}

impl Timer {
    pub fn new(at: Instant) -> Self {
        Self {
            sleep: Box::pin(sleep_until(at)),
            registered: None,
        }
    }

    pub fn reset(&mut self, at: Instant) {
        self.sleep.as_mut().reset(at);
        self.registered = None;
    }

    #[inline]
    pub fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.sleep.is_elapsed()
            && self
                .registered
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
        {
            return Poll::Pending;
        }
        let polled = self.sleep.as_mut().poll(cx);
        if polled.is_pending() {
            self.registered = Some(cx.waker().clone());
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn it_fires_at_its_time_and_after_each_reset() {
        let start = Instant::now();
        let mut t = Timer::new(start + Duration::from_millis(100));
        poll_fn(|cx| t.poll(cx)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        t.reset(Instant::now() + Duration::from_millis(50));
        poll_fn(|cx| t.poll(cx)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(150));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_while_waiting_moves_the_wake() {
        let start = Instant::now();
        let mut t = Timer::new(start + Duration::from_secs(60));
        let mut first = true;
        poll_fn(|cx| {
            let p = t.poll(cx);
            if first {
                // Registered, then moved nearer: the second poll must register again.
                assert!(p.is_pending());
                assert!(t.poll(cx).is_pending());
                t.reset(Instant::now() + Duration::from_millis(10));
                first = false;
                return t.poll(cx);
            }
            p
        })
        .await;
        assert_eq!(start.elapsed(), Duration::from_millis(10));
    }
}
