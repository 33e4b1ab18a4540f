//! Extra calls (retries, hedges) kept to a share of the calls they add to. Each request's
//! retries and hedge are bounded on their own, but not the sum over many requests: an
//! upstream failing under load got three to five times the clients' calls, and a hedge
//! fired on every request once the upstream's usual latency passed `hedge_after` (audit GD).
//! Envoy's retry budget and gRPC's hedging throttle bound that sum the same way: extra calls
//! in flight at most a share of the calls in flight, with a floor so that a quiet upstream
//! can still retry.
//!
//! A retry after a `Retry-After` counts only while its attempt is on the wire, and its
//! share is of the attempts in flight plus the requests waiting out such a wait (Envoy:
//! active plus pending). Counted from the start of the wait, a burst of 429s with
//! `Retry-After` spent the share on requests doing nothing while the attempts in flight,
//! its base, fell to none: 17 of 20 lost their retry (audit HA 1). A retry after a backoff
//! still counts from its wait on (see `gateway/retry.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};

pub struct Throttle {
    in_flight: AtomicUsize,
    /// Requests waiting to make an extra call (a retry's backoff or `Retry-After`).
    waiting: AtomicUsize,
    /// Extra calls always allowed in flight, however few calls are.
    floor: usize,
    percent: usize,
}

impl Throttle {
    /// An upstream's retries: at most 3, or 20% of its attempts in flight (Envoy's default
    /// retry budget).
    pub const fn retries() -> Self {
        Self::new(3, 20)
    }

    /// A route's hedges racing at once: at most 1, or 10% of its requests in flight. This
    /// bounds races in parallel only; the share of requests hedged is bounded by the route's
    /// hedge budget (`gateway/hedges.rs`), since a fast fallback frees its slot at once.
    pub const fn hedges() -> Self {
        Self::new(1, 10)
    }

    const fn new(floor: usize, percent: usize) -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            floor,
            percent,
        }
    }

    /// The most extra calls in flight beside `calls` in flight.
    pub fn limit(&self, calls: usize) -> usize {
        self.floor.max(calls.saturating_mul(self.percent) / 100)
    }

    /// An extra call beside `calls` in flight, counted until the guard drops; none if the
    /// share is spent. Checked and taken in one step: requests deciding at once never both
    /// take the last place.
    pub fn take(&self, calls: usize) -> Option<Extra<'_>> {
        let limit = self.limit(calls);
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Extra(self))
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// An extra call whose share is of `attempts` in flight plus the requests waiting to make
    /// one (Envoy's active + pending).
    pub fn take_beside_waiting(&self, attempts: usize) -> Option<Extra<'_>> {
        self.take(attempts.saturating_add(self.waiting.load(Ordering::Acquire)))
    }

    /// A request waiting to make an extra call, counted in the base of `take_after_wait`
    /// until the guard drops.
    pub fn wait(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Waiting(self)
    }

    /// The extra call of a request whose wait ends now: its share is of `attempts` in
    /// flight plus the requests still waiting, itself among them.
    pub fn take_after_wait(&self, waited: Waiting<'_>, attempts: usize) -> Option<Extra<'_>> {
        let extra = self.take_beside_waiting(attempts);
        drop(waited);
        extra
    }
}

/// One request waiting to make an extra call.
pub struct Waiting<'a>(&'a Throttle);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One extra call in flight.
pub struct Extra<'a>(&'a Throttle);

impl Drop for Extra<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_kept_to_three_or_a_fifth_of_the_attempts() {
        let t = Throttle::retries();
        assert_eq!(t.limit(0), 3);
        assert_eq!(t.limit(10), 3);
        assert_eq!(t.limit(19), 3);
        assert_eq!(t.limit(20), 4);
        assert_eq!(t.limit(101), 20);
        assert_eq!(t.limit(usize::MAX), usize::MAX / 100);
        let held: Vec<_> = (0..3)
            .map(|_| t.take(10).expect("within the floor"))
            .collect();
        assert!(t.take(10).is_none(), "the fourth beside 10 attempts");
        let fourth = t.take(20).expect("20 attempts allow four");
        assert!(t.take(20).is_none());
        assert_eq!(t.in_flight(), 4);
        drop(fourth);
        drop(held);
        assert_eq!(t.in_flight(), 0, "each guard gives its place back");
        assert!(t.take(0).is_some());
    }

    #[test]
    fn a_retry_counts_the_requests_waiting_to_retry_in_its_base() {
        let t = Throttle::retries();
        // Twenty requests wait out one `Retry-After` with no attempt in flight: a fifth of
        // them may retry at once, and their waits take no place.
        let mut waits: Vec<_> = (0..20).map(|_| t.wait()).collect();
        assert_eq!(t.in_flight(), 0, "a wait is not an extra call");
        let first = t.take_after_wait(waits.pop().unwrap(), 0).expect("4 of 20");
        // Each retry made is an attempt in flight, and no longer waiting: the base holds.
        let held: Vec<_> = (1..4)
            .map(|k| t.take_after_wait(waits.pop().unwrap(), k).expect("4 of 20"))
            .collect();
        assert_eq!(t.in_flight(), 4);
        assert!(
            t.take_after_wait(waits.pop().unwrap(), 4).is_none(),
            "4 retries in flight beside 4 attempts and 16 waiting"
        );
        assert_eq!(waits.len(), 15, "a refused wait is over too");
        drop((first, held));
        assert!(t.take_after_wait(waits.pop().unwrap(), 0).is_some());
        drop(waits);
        assert_eq!(t.waiting.load(Ordering::Acquire), 0);
    }

    #[test]
    fn hedges_are_kept_to_one_or_a_tenth_of_the_requests() {
        let t = Throttle::hedges();
        assert_eq!(t.limit(0), 1);
        assert_eq!(t.limit(19), 1);
        assert_eq!(t.limit(20), 2);
        assert_eq!(t.limit(1000), 100);
        let one = t.take(5).expect("the floor");
        assert!(t.take(5).is_none());
        drop(one);
        assert!(t.take(5).is_some());
    }
}
