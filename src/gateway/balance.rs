//! Where a request starts on a route whose upstream is balanced with others (`balance_with`):
//! two deployments of one model, or one provider under two keys, to spread load and rate
//! limits. Each request starts at the least busy of them (fewest requests in flight there,
//! from every route) among those in rotation, the tied ones taking turns. Its chain is the route's
//! with that upstream moved to the front: the other balanced upstreams follow it as
//! fallbacks, then the route's own fallbacks. A route without `balance_with` keeps its chain.

use std::ops::Index;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::time::Instant;

use crate::gateway::routes::{ChainEntry, RouteRuntime};

/// One request's chain: the route's, with the upstream it starts at moved to the front.
#[derive(Clone, Copy)]
pub struct Order<'a> {
    chain: &'a [ChainEntry],
    first: usize,
}

impl<'a> Order<'a> {
    /// The order for a request arriving `now` on `route`.
    pub fn of(route: &'a RouteRuntime, now: Instant) -> Self {
        let first = match route.route.policy.balanced.len() {
            0 => 0,
            n => pick(&route.chain[..=n], &route.turn, now),
        };
        Self {
            chain: &route.chain,
            first,
        }
    }

    /// Where the `k`th upstream of this request's chain sits in the route's.
    fn slot(&self, k: usize) -> usize {
        match k {
            0 => self.first,
            k if k <= self.first => k - 1,
            k => k,
        }
    }

    pub fn get(&self, k: usize) -> Option<&'a ChainEntry> {
        (k < self.chain.len()).then(|| &self.chain[self.slot(k)])
    }

    pub fn iter(self) -> impl Iterator<Item = &'a ChainEntry> {
        (0..self.chain.len()).map(move |k| &self.chain[self.slot(k)])
    }
}

impl<'a> Index<usize> for Order<'a> {
    type Output = ChainEntry;

    fn index(&self, k: usize) -> &ChainEntry {
        &self.chain[self.slot(k)]
    }
}

/// The least busy of `members` in rotation (of all of them, when none is), the tied ones
/// taking turns among themselves: a turn counted over all members would hand the one after a
/// busier member every tie that starts at it.
fn pick(members: &[ChainEntry], turn: &AtomicUsize, now: Instant) -> usize {
    let any_in = members.iter().any(|e| e.upstream.health.available(now));
    let eligible = |e: &&ChainEntry| !any_in || e.upstream.health.available(now);
    let Some(least) = members
        .iter()
        .filter(eligible)
        .map(|e| e.in_flight.get())
        .min()
    else {
        return 0;
    };
    let tied = |e: &&ChainEntry| eligible(e) && e.in_flight.get() == least;
    let ties = members.iter().filter(tied).count();
    // Counts move under other requests between the two passes: then any least busy will do.
    let k = turn.fetch_add(1, Ordering::Relaxed) % ties.max(1);
    members
        .iter()
        .enumerate()
        .filter(|(_, e)| tied(e))
        .nth(k)
        .or_else(|| members.iter().enumerate().find(|(_, e)| eligible(e)))
        .map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_moves_to_the_front_and_the_rest_keep_their_order() {
        let slots = |first: usize, len: usize| -> Vec<usize> {
            let o = Order { chain: &[], first };
            (0..len).map(|k| o.slot(k)).collect()
        };
        assert_eq!(slots(0, 4), [0, 1, 2, 3]);
        assert_eq!(slots(1, 4), [1, 0, 2, 3]);
        assert_eq!(slots(2, 4), [2, 0, 1, 3]);
        assert_eq!(slots(3, 4), [3, 0, 1, 2]);
    }
}
