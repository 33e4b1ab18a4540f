//! A one-shot signal that many long-lived futures wait for (the server's drain, the cut at the
//! end of the shutdown grace), cheap to poll again and again.
//!
//! A stream's body and a client connection are polled once or twice per chunk, and whatever
//! they wait for besides is polled with them: a `CancellationToken`'s future takes the
//! token's mutex and the `Notify` lock on every poll, about 400 instructions a chunk, to say
//! again that nothing happened. A [`Waiter`] asks only an atomic flag and whether the task
//! polling it is the one it registered last; it registers (polls the token's future) only
//! when that task changed. The flag is set before the token wakes the registered tasks, so a
//! waiter woken by the signal always finds it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tokio_util::sync::{
    CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
};

/// The signal: fired once, by [`Signal::fire`] only (its token is not handed out, so nothing
/// can wake a waiter without setting the flag).
#[derive(Debug, Clone, Default)]
pub struct Signal(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    fired: AtomicBool,
    token: CancellationToken,
}

impl Signal {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn fire(&self) {
        self.0.fired.store(true, Ordering::Release);
        self.0.token.cancel();
    }

    pub fn is_fired(&self) -> bool {
        self.0.fired.load(Ordering::Acquire)
    }

    /// Completes once the signal has fired: for a task that waits for it once (`select!`).
    pub fn fired(&self) -> WaitForCancellationFuture<'_> {
        self.0.token.cancelled()
    }

    /// A waiter for a future that is polled many times (see the module's note).
    pub fn waiter(&self) -> Waiter {
        Waiter {
            signal: self.clone(),
            wait: None,
            waker: None,
        }
    }
}

/// Polled in another future's `poll`: ready once the signal has fired.
pub struct Waiter {
    signal: Signal,
    /// Created on the first poll; boxed because it is pinned and lives as long as the waiter.
    wait: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    /// The task the token wakes.
    waker: Option<Waker>,
}

impl Waiter {
    #[inline]
    pub fn poll_fired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.signal.is_fired() {
            return Poll::Ready(());
        }
        if self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            return Poll::Pending;
        }
        let wait = self
            .wait
            .get_or_insert_with(|| Box::pin(self.signal.0.token.clone().cancelled_owned()));
        if wait.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        self.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter")
            .field("fired", &self.signal.is_fired())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_waiter_polled_by_the_same_task_is_woken_and_then_ready() {
        let signal = Signal::new();
        let mut waiter = signal.waiter();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(waiter.poll_fired(&mut cx).is_pending());
        // Polled again by the same task: nothing registered anew, still pending.
        assert!(waiter.poll_fired(&mut cx).is_pending());
        signal.fire();
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "the registered task is woken"
        );
        assert!(waiter.poll_fired(&mut cx).is_ready());
    }

    #[test]
    fn a_waiter_moved_to_another_task_wakes_that_one() {
        let signal = Signal::new();
        let mut waiter = signal.waiter();
        let (a, b) = (
            Arc::new(Count(AtomicUsize::new(0))),
            Arc::new(Count(AtomicUsize::new(0))),
        );
        let (wa, wb) = (Waker::from(a.clone()), Waker::from(b.clone()));
        assert!(waiter
            .poll_fired(&mut Context::from_waker(&wa))
            .is_pending());
        assert!(waiter
            .poll_fired(&mut Context::from_waker(&wb))
            .is_pending());
        signal.fire();
        assert_eq!(b.0.load(Ordering::SeqCst), 1, "the last task is woken");
        assert!(waiter.poll_fired(&mut Context::from_waker(&wb)).is_ready());
    }

    #[test]
    fn a_waiter_made_after_the_signal_is_ready_at_once() {
        let signal = Signal::new();
        signal.fire();
        assert!(signal.is_fired());
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        assert!(signal
            .waiter()
            .poll_fired(&mut Context::from_waker(&waker))
            .is_ready());
    }
}
