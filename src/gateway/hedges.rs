//! A route's hedges, kept to a share of its requests. Each request deposits a tenth of a
//! hedge and each hedge withdraws a whole one, with at most `BANKED` hedges saved up, so
//! that over any stretch of requests at most 10% of them (and the few banked) are hedged:
//! a quiet route hedges its rare slow request, and one whose usual latency passed
//! `hedge_after` hedges one request in ten, not all of them. That is gRPC's hedging throttle
//! and Finagle's retry budget, counted in requests rather than seconds.
//!
//! Beside it, the races at once stay within max(1, 10% of the requests in flight)
//! (`upstream::throttle`). That share alone bounded races in parallel, not requests hedged:
//! a race ends with the fallback's first token, so a fast fallback gave its place back at
//! once and most slow requests were hedged (audit MF 2: 44 of 75 under steady load).

use std::sync::atomic::{AtomicU32, Ordering};

use crate::upstream::throttle::{Extra, Throttle};

/// What one request deposits, in tenths of a hedge.
const PER_REQUEST: u32 = 1;

/// What one hedge withdraws: a whole hedge.
const HEDGE: u32 = 10;

/// The most a route saves up, in tenths: three hedges, and a new route starts with them.
const BANKED: u32 = 3 * HEDGE;

pub struct Hedges {
    /// Tenths of a hedge to spend.
    tenths: AtomicU32,
    /// Races at once.
    racing: Throttle,
}

impl Default for Hedges {
    fn default() -> Self {
        Self::new()
    }
}

impl Hedges {
    pub const fn new() -> Self {
        Self {
            tenths: AtomicU32::new(BANKED),
            racing: Throttle::hedges(),
        }
    }

    /// A request that may be hedged: it adds its tenth of a hedge.
    pub fn request(&self) {
        let _ = self
            .tenths
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                (t < BANKED).then(|| (t + PER_REQUEST).min(BANKED))
            });
    }

    /// A hedge beside `requests` in flight on the route, racing until the guard drops; none
    /// if the route's share of races at once or of requests hedged is spent. Each check is
    /// one atomic step: requests deciding at once never both take the last of either.
    pub fn take(&self, requests: usize) -> Option<Extra<'_>> {
        let racing = self.racing.take(requests)?;
        self.tenths
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                t.checked_sub(HEDGE)
            })
            .ok()?;
        Some(racing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Of requests each slow enough to hedge, one at a time (so that the races at once never
    /// bind): the three banked, then one in ten.
    #[test]
    fn hedges_are_kept_to_a_tenth_of_the_requests_and_three_banked() {
        let h = Hedges::new();
        let mut hedged = 0;
        for _ in 0..100 {
            h.request();
            hedged += usize::from(h.take(1).is_some());
        }
        // The first request's tenth found the bank full: 3 banked and 99 tenths.
        assert_eq!(hedged, 3 + 9);
        // Nothing is banked past three hedges, however long the route went without one.
        for _ in 0..1000 {
            h.request();
        }
        let held: Vec<_> = (0..3).map(|_| h.take(100).expect("banked")).collect();
        assert!(h.take(100).is_none(), "the fourth");
        drop(held);
    }

    /// A burst of 40 that all reach their hedge together: the races at once stay within a
    /// tenth of the requests in flight, and the requests hedged within the bank.
    #[test]
    fn a_burst_is_kept_to_its_races_at_once_and_its_share() {
        let h = Hedges::new();
        for _ in 0..40 {
            h.request();
        }
        let racing: Vec<_> = (0..40).filter_map(|_| h.take(40)).collect();
        assert_eq!(racing.len(), 3, "three banked, within the four at once");
        drop(racing);
        assert!(h.take(40).is_none(), "the races ended, the share is spent");
        let h = Hedges::new();
        let racing: Vec<_> = (0..3).filter_map(|_| h.take(5)).collect();
        assert_eq!(racing.len(), 1, "one race at once beside five requests");
        drop(racing);
        // A race refused for its place at once spends none of the share.
        assert_eq!(h.tenths.load(Ordering::Acquire), BANKED - HEDGE);
    }
}
