//! How many at once: a route with `max_in_flight` serves at most that many requests at once.
//!
//! A request that finds the route full waits for a slot (first come, first served) only while
//! what would be left of its budget still fits an upstream attempt; past that point it is
//! answered 503 `overloaded` at once, instead of queueing past its deadline. The slot is held
//! until the response ends (it travels with the request's record).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{timeout_at, Instant};

use crate::budget::Budget;
use crate::error::GatewayError;

/// A route's slots for requests in flight.
#[derive(Clone)]
pub struct Admission {
    route: Arc<str>,
    limit: usize,
    slots: Arc<Semaphore>,
}

/// One request's slot; dropping it frees the slot.
pub type Slot = OwnedSemaphorePermit;

/// Kept on top of what an attempt needs when deciding how long a request may wait for a
/// slot: the slot must come early enough that the attempt still fits once it is made.
pub const ADMIT_SLACK: Duration = Duration::from_millis(50);

impl Admission {
    pub fn new(route: Arc<str>, limit: usize) -> Self {
        Self {
            route,
            limit,
            slots: Arc::new(Semaphore::new(limit)),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Requests being served now.
    pub fn in_flight(&self) -> usize {
        self.limit - self.slots.available_permits()
    }

    /// Takes a slot, waiting (in arrival order) only while a slot taken later would still
    /// leave `need` of the budget for the upstream; otherwise `overloaded`, at once.
    pub async fn admit(&self, budget: &Budget, need: Duration) -> Result<Slot, GatewayError> {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return Ok(slot);
        }
        let start = Instant::now();
        let latest = budget
            .work_deadline()
            .checked_sub(need + ADMIT_SLACK)
            .filter(|t| *t > start);
        let overloaded = |waited: Duration| GatewayError::Overloaded {
            route: self.route.to_string(),
            limit: self.limit,
            waited,
        };
        let Some(latest) = latest else {
            return Err(overloaded(Duration::ZERO));
        };
        match timeout_at(latest, self.slots.clone().acquire_owned()).await {
            Ok(Ok(slot)) => Ok(slot),
            // Timed out (or, never, the semaphore closed).
            _ => Err(overloaded(start.elapsed())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::BudgetRequest;
    use crate::config::Limits;
    use http::{HeaderMap, HeaderValue};

    fn budget(ms: u64) -> Budget {
        let limits = Limits {
            budget: Duration::from_secs(60),
            max_budget: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(2),
            first_token_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(20),
            reserve: Duration::ZERO,
            min_useful: Duration::from_millis(100),
        };
        let mut h = HeaderMap::new();
        h.insert("x-request-budget-ms", HeaderValue::from(ms));
        BudgetRequest::from_headers(&h)
            .unwrap()
            .resolve(&limits, Instant::now())
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_route_admits_in_order_while_the_budget_allows() {
        let adm = Admission::new("chat".into(), 1);
        let need = Duration::from_millis(100);
        let held = adm.admit(&budget(1000), need).await.unwrap();
        assert_eq!(adm.in_flight(), 1);

        // Waits up to 1000 - 100 - 50 ms; the slot frees at 300 ms.
        let waiter = {
            let adm = adm.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let slot = adm.admit(&budget(1000), need).await;
                (slot.is_ok(), t.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(held);
        let (ok, waited) = waiter.await.unwrap();
        assert!(ok);
        assert_eq!(waited, Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_route_refuses_when_the_budget_runs_out_and_at_once_when_none_is_left() {
        let adm = Admission::new("chat".into(), 1);
        let need = Duration::from_millis(100);
        let _held = adm.admit(&budget(10_000), need).await.unwrap();

        let t = Instant::now();
        let e = adm.admit(&budget(500), need).await.unwrap_err();
        assert_eq!(
            t.elapsed(),
            Duration::from_millis(350),
            "gave up when 100 ms (and the slack) were left"
        );
        assert_eq!(e.code(), "overloaded");
        assert_eq!(e.status(), http::StatusCode::SERVICE_UNAVAILABLE);

        let t = Instant::now();
        let e = adm.admit(&budget(100), need).await.unwrap_err();
        assert_eq!(
            t.elapsed(),
            Duration::ZERO,
            "nothing to wait with: refused at once"
        );
        assert_eq!(e.code(), "overloaded");
        assert_eq!(adm.in_flight(), 1);
    }
}
