//! How many at once: a route with `max_in_flight` serves at most that many requests at once.
//!
//! A request that finds the route full waits for a slot (first come, first served) only while
//! what would be left of its budget still fits an upstream attempt (by the estimate of now,
//! not of its arrival); past that point it is answered 503 `overloaded` at once, instead of
//! queueing past its deadline. The slot is held
//! until the response ends (it travels with the request's record).
//!
//! Request bodies are bounded together as well ([`BodyMemory`]): they are read whole before
//! a slot is taken (the model that picks the route is in them), so slots alone bound none,
//! and each counts until its request's upstream call is done (a retry may resend it).
//! So are the answers the gateway holds before their heads go out (a document rebuilt from a
//! stream, a JSON document read whole), each of which may hold up to `max_response_body`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{sleep_until, Instant};

use crate::budget::Budget;
use crate::error::GatewayError;

/// The limit of a route whose `max_in_flight` a reload took away: no limit in effect, while
/// the slots still count what is in flight for a limit put back.
pub const LIFTED: usize = 1 << 32;

/// A route's slots for requests in flight. Clones share them: across a reload the route
/// keeps its slots, so the requests still in flight on the old configuration count against
/// the new limit.
#[derive(Clone)]
pub struct Admission {
    route: Arc<str>,
    inner: Arc<Inner>,
}

struct Inner {
    limit: AtomicUsize,
    slots: Arc<Semaphore>,
    /// Slots a lowered limit took away while they were held: forgotten, not given back, as
    /// they are freed.
    debt: Arc<AtomicUsize>,
}

/// One request's slot; dropping it frees the slot (or pays a lowered limit's debt).
pub struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    debt: Arc<AtomicUsize>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let owed = self
            .debt
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| d.checked_sub(1))
            .is_ok();
        if let (true, Some(permit)) = (owed, self.permit.take()) {
            permit.forget();
        }
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").finish_non_exhaustive()
    }
}

/// Kept on top of what an attempt needs when deciding how long a request may wait for a
/// slot: the slot must come early enough that the attempt still fits once it is made.
pub const ADMIT_SLACK: Duration = Duration::from_millis(50);

impl Admission {
    pub fn new(route: Arc<str>, limit: usize) -> Self {
        Self {
            route,
            inner: Arc::new(Inner {
                limit: AtomicUsize::new(limit),
                slots: Arc::new(Semaphore::new(limit)),
                debt: Arc::new(AtomicUsize::new(0)),
            }),
        }
    }

    pub fn limit(&self) -> usize {
        self.inner.limit.load(Ordering::Relaxed)
    }

    /// Requests being served now.
    pub fn in_flight(&self) -> usize {
        let i = &self.inner;
        (i.limit.load(Ordering::Relaxed) + i.debt.load(Ordering::Relaxed))
            .saturating_sub(i.slots.available_permits())
    }

    /// The limit becomes `limit` (a reload changed `max_in_flight`), for these slots and
    /// every clone of them. Raised: the new slots are free at once (after what a lowering
    /// still owes). Lowered: free slots go now, held ones as they are freed, so the route
    /// never serves more than the new limit once those end, and admits nobody before.
    pub fn resize(&self, limit: usize) {
        let i = &self.inner;
        let old = i.limit.swap(limit, Ordering::Relaxed);
        resize_permits(&i.slots, &i.debt, old, limit);
    }

    fn slot(&self, permit: OwnedSemaphorePermit) -> Slot {
        Slot {
            permit: Some(permit),
            debt: self.inner.debt.clone(),
        }
    }

    /// Takes a slot, waiting (in arrival order) only while a slot taken later would still
    /// leave `need()` of the budget for the upstream; otherwise `overloaded`, at once.
    ///
    /// `need` is asked again when `rose` says an estimate rose, when the latest time to
    /// leave comes, and when the slot comes: an upstream that slows down meanwhile raises it,
    /// and a request whose attempt no longer fits must leave the queue as overloaded, not
    /// take a slot to fail for want of budget (audit GD F2: 504 `insufficient_budget`
    /// without `Retry-After`, 370 ms after waiting was useless). Asked every 100 ms by every
    /// waiter instead, 10,000 queued requests took 27% of a core (audit HA 3).
    pub async fn admit(
        &self,
        budget: &Budget,
        need: impl Fn() -> Duration,
        rose: &Notify,
    ) -> Result<Slot, GatewayError> {
        let slots = &self.inner.slots;
        if let Ok(permit) = slots.clone().try_acquire_owned() {
            return Ok(self.slot(permit));
        }
        let start = Instant::now();
        // The head must reach the client before its SDK gives up too: a request that waited
        // past that got a slot for a client that was gone (audit O: a 504 connect_timeout
        // "within 0ms", counted as the upstream's, 1 s after an SDK's 2 s timeout).
        let end = budget.head_wait_until(budget.work_deadline());
        let latest = || end.checked_sub(need() + ADMIT_SLACK);
        let overloaded = |waited: Duration| GatewayError::Overloaded {
            route: self.route.to_string(),
            limit: self.limit(),
            waited,
        };
        if latest().is_none_or(|t| t <= start) {
            return Err(overloaded(Duration::ZERO));
        }
        // One acquire for the whole wait: dropping it would lose the request's place.
        let acquire = slots.clone().acquire_owned();
        tokio::pin!(acquire);
        loop {
            // Listening before `need` is read: a rise in between is not missed.
            let rise = rose.notified();
            tokio::pin!(rise);
            rise.as_mut().enable();
            let now = Instant::now();
            let Some(until) = latest().filter(|t| *t > now) else {
                return Err(overloaded(start.elapsed()));
            };
            tokio::select! {
                biased;
                permit = &mut acquire => {
                    // The semaphore is never closed.
                    let Ok(permit) = permit else {
                        return Err(overloaded(start.elapsed()));
                    };
                    // Dropped, the permit goes to the next in line.
                    if latest().is_some_and(|t| Instant::now() <= t) {
                        return Ok(self.slot(permit));
                    }
                    return Err(overloaded(start.elapsed()));
                }
                // Asked again: an estimate that sank since lets it wait longer.
                () = sleep_until(until) => {}
                () = &mut rise => {}
            }
        }
    }
}

/// The bytes that the bodies of one kind ([`Bodies`]) hold together: at most `[server]
/// request_body_memory` or `response_body_memory`. Taken as bytes arrive, never for bytes
/// only announced (audit SA 1: a `Content-Length` booked all its bytes before any came, and
/// 26 connections that sent 80 bytes between them held 256 MiB, refusing every other body
/// for up to `max_budget`), and never waited for: a body that does not fit is refused at
/// once, since bodies waiting for each other's bytes could all wait until their deadlines.
/// Clones share the bytes, and a reload resizes them in place.
#[derive(Clone)]
pub struct BodyMemory {
    bodies: Bodies,
    limit: Arc<AtomicU64>,
    bytes: Arc<Semaphore>,
    /// Bytes a lowered limit took back that bodies still held: given up as they let go.
    debt: Arc<AtomicUsize>,
}

/// The bodies a [`BodyMemory`] bounds, which the error of one it cannot take names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bodies {
    /// Request bodies being received, waiting for a slot, or kept for the attempts of a
    /// call in flight (which may resend them).
    Requests,
    /// Answers held before their heads go out: documents rebuilt from a stream
    /// (`stream_upstream`), JSON documents read whole. Each may hold up to
    /// `max_response_body`: together, without this, that times the requests in flight
    /// (audit KF 2: 100 rebuilt answers aborted a gateway limited to 900 MB).
    Responses,
}

/// What a body that grows piece by piece takes from its memory at a time
/// ([`BodyHold::cover_in_granules`]): one step on the shared semaphore per 64 KiB, not one
/// per piece.
pub const GRANULE: u64 = 64 * 1024;

/// One body's share of [`BodyMemory`], given back when dropped (less what a lowered limit
/// is still owed).
pub struct BodyHold {
    memory: BodyMemory,
    permit: Option<OwnedSemaphorePermit>,
    /// The limit when the hold was made: a reload that lowers the memory does not fail a
    /// body in flight that fits the memory it started under (audit AD 1).
    started: u64,
}

/// The permits a limit of `limit` bytes is: a semaphore holds at most `MAX_PERMITS`.
fn permits(limit: u64) -> usize {
    usize::try_from(limit).map_or(Semaphore::MAX_PERMITS, |l| l.min(Semaphore::MAX_PERMITS))
}

impl BodyMemory {
    pub fn new(bodies: Bodies, limit: u64) -> Self {
        Self {
            bodies,
            limit: Arc::new(AtomicU64::new(limit)),
            bytes: Arc::new(Semaphore::new(permits(limit))),
            debt: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Sets the limit for every clone, as [`Admission::resize`] does for slots (audit IB 2: a
    /// changed limit started a new, empty memory beside the old one, so bodies held under
    /// the old one did not count). Bodies held keep their bytes; raised, the new bytes are
    /// free at once (after what a lowering still owes); lowered, free bytes go now and held
    /// ones as they are let go, so new bodies are judged against the new limit, while bodies
    /// held before may still grow within the limit they started under ([`BodyHold::cover`]).
    pub fn resize(&self, limit: u64) {
        let i = self;
        let old = permits(i.limit.swap(limit, Ordering::Relaxed));
        resize_permits(&i.bytes, &i.debt, old, permits(limit));
    }

    /// A hold of nothing yet, for one body.
    pub fn hold(&self) -> BodyHold {
        BodyHold {
            memory: self.clone(),
            permit: None,
            started: self.limit(),
        }
    }
}

impl BodyHold {
    /// The bytes held.
    pub fn held(&self) -> u64 {
        self.permit.as_ref().map_or(0, |p| p.num_permits() as u64)
    }

    /// Makes the hold cover `received` bytes of a body that comes frame by frame and will
    /// be at most `most` bytes (its `Content-Length`, else its limit). Where it must grow, it
    /// grows to twice what it held, but never more than a sixteenth (at least a
    /// [`GRANULE`]) past `received`, nor past `most`: a body takes from the memory a few
    /// hundred times at most, not once a frame, and holds only about what it sent, however
    /// much it announced (audit SA 1). The step ahead is kept small because it is taken from
    /// the memory every body shares: a body without a `Content-Length` that held twice what
    /// it received refused others that fitted beside it by their bytes (audit TA 2: three
    /// chunked bodies of 1.3 MB, 503 in a memory of 4 MiB). Where the step no longer fits,
    /// `received` alone is taken; where that does not fit either, 503 `overloaded` as
    /// [`cover`](Self::cover). What it holds after is the room the body's buffer may have:
    /// each step at least a sixteenth more, so a buffer grown to it is copied a bounded
    /// number of times per byte, not once per frame.
    pub fn grow(&mut self, received: u64, most: u64) -> Result<(), GatewayError> {
        let held = self.held();
        if received <= held {
            return Ok(());
        }
        let ahead = (received / 16).max(GRANULE);
        let step = held
            .saturating_mul(2)
            .min(received.saturating_add(ahead))
            .min(most)
            .max(received);
        self.cover(step).or_else(|_| self.cover(received))
    }

    /// Gives back what is held past `bytes` (a body that ended short of the room it grew):
    /// what a lowered limit is still owed is paid from it first.
    pub fn shrink_to(&mut self, bytes: u64) {
        let Some(permit) = &mut self.permit else {
            return;
        };
        let keep = usize::try_from(bytes).unwrap_or(usize::MAX);
        if let Some(extra) = permit.num_permits().checked_sub(keep).filter(|&e| e > 0) {
            if let Some(extra) = permit.split(extra) {
                give_back(&self.memory, extra);
            }
        }
    }

    /// Makes the hold `total` bytes, or refuses (503 `overloaded`) if the memory has not
    /// that much free; a smaller total than held changes nothing. A hold made before a
    /// reload lowered the memory may still grow while all the bodies hold together no
    /// more than the limit it started under ([`overdraw`](Self::overdraw)).
    pub fn cover(&mut self, total: u64) -> Result<(), GatewayError> {
        let held = self.held();
        let Some(more) = total.checked_sub(held).filter(|&m| m > 0) else {
            return Ok(());
        };
        let limit = self.memory.limit();
        let full = || match self.memory.bodies {
            Bodies::Requests => GatewayError::BodyMemoryFull { limit },
            Bodies::Responses => GatewayError::ResponseMemoryFull { limit },
        };
        let permit = take(&self.memory.bytes, more)
            .or_else(|| self.overdraw(limit, more))
            .ok_or_else(full)?;
        match &mut self.permit {
            Some(held) => held.merge(permit),
            None => self.permit = Some(permit),
        }
        Ok(())
    }

    /// `more` bytes for a hold that started under a higher limit than `limit`, now in force,
    /// which the memory has not free: the missing permits are added and owed at once (the
    /// `debt` a lowering keeps), so they are forgotten as bytes come back and the memory
    /// still ends at `limit`. Allowed while the bytes held in all (`limit` less the free
    /// ones, plus what is owed) and `more` stay within the limit the hold started under:
    /// requests in flight keep the limits they started with, as per-request ones do.
    /// Only reached when a take failed, so the common path pays no more than before.
    fn overdraw(&self, limit: u64, more: u64) -> Option<OwnedSemaphorePermit> {
        if self.started <= limit {
            return None;
        }
        let m = &self.memory;
        let free = m.bytes.available_permits();
        let owed = m.debt.load(Ordering::Relaxed);
        let in_use = (permits(limit).saturating_sub(free) as u64).saturating_add(owed as u64);
        if in_use.saturating_add(more) > self.started {
            return None;
        }
        let missing = usize::try_from(more)
            .ok()?
            .saturating_sub(free)
            .min(Semaphore::MAX_PERMITS - free);
        // Owed before added, so no byte of them can go back to the memory for good. Another
        // body may take them before this one does: then the take fails and 503 as before,
        // and what was added is forgotten as the next bytes come back.
        m.debt.fetch_add(missing, Ordering::Relaxed);
        m.bytes.add_permits(missing);
        take(&m.bytes, more)
    }

    /// Makes the hold at least `total` bytes as [`cover`](Self::cover) does, in whole
    /// [`GRANULE`]s (never past the limit): a body that grows by small pieces takes from the
    /// memory once a granule, and is a comparison for the pieces in between. Where a granule
    /// no longer fits, `total` alone is taken.
    pub fn cover_in_granules(&mut self, total: u64) -> Result<(), GatewayError> {
        if total <= self.held() {
            return Ok(());
        }
        let granules = total.div_ceil(GRANULE).saturating_mul(GRANULE);
        let rounded = granules.min(self.memory.limit()).max(total);
        self.cover(rounded).or_else(|_| self.cover(total))
    }

    /// `data`, holding this share until the last of its clones is dropped: an answer counts
    /// against the memory until hyper has written it to the client (or the connection is
    /// gone), not only while it was gathered, or clients that read slowly could hold any
    /// number of them; a request body until the last attempt that could resend it is done.
    pub fn keep_with(self, data: Bytes) -> Bytes {
        struct Kept {
            data: Bytes,
            _hold: BodyHold,
        }
        impl AsRef<[u8]> for Kept {
            fn as_ref(&self) -> &[u8] {
                &self.data
            }
        }
        if self.permit.is_none() {
            return data;
        }
        Bytes::from_owner(Kept { data, _hold: self })
    }
}

/// `bytes` permits of `sem` as one permit, or none if they are not all free. tokio takes at
/// most `u32::MAX` at a time, so more are taken in steps of that (audit ME 3: a hold of 4 GiB
/// or more was refused as a full memory, 503 and `Retry-After`, for any `max_request_body`
/// above it). A step that does not fit drops the steps before it: they go back at once.
fn take(sem: &Arc<Semaphore>, bytes: u64) -> Option<OwnedSemaphorePermit> {
    let mut taken: Option<OwnedSemaphorePermit> = None;
    let mut left = bytes;
    while left > 0 {
        let step = u32::try_from(left).unwrap_or(u32::MAX);
        let permit = Arc::clone(sem).try_acquire_many_owned(step).ok()?;
        match &mut taken {
            Some(t) => t.merge(permit),
            None => taken = Some(permit),
        }
        left -= u64::from(step);
    }
    taken
}

impl Drop for BodyHold {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            give_back(&self.memory, permit);
        }
    }
}

/// Returns `permit`'s bytes to `memory`, less what a lowered limit is still owed, which is
/// forgotten instead.
fn give_back(memory: &BodyMemory, mut permit: OwnedSemaphorePermit) {
    let held = permit.num_permits();
    let mut owed = 0;
    let _ = memory
        .debt
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
            owed = d.min(held);
            (owed > 0).then_some(d - owed)
        });
    if let Some(paid) = permit.split(owed) {
        paid.forget();
    }
}

/// Moves `sem` from `old` permits to `new`, for every holder at once. Raised: the new
/// permits are free at once, after what a lowering still owes (`debt`). Lowered: free
/// permits go now, and held ones are owed, forgotten as they come back.
fn resize_permits(sem: &tokio::sync::Semaphore, debt: &AtomicUsize, old: usize, new: usize) {
    if new > old {
        let mut more = new - old;
        let _ = debt.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
            let paid = d.min(new - old);
            more = new - old - paid;
            Some(d - paid)
        });
        sem.add_permits(more);
    } else if new < old {
        let fewer = old - new;
        let gone = sem.forget_permits(fewer);
        debt.fetch_add(fewer - gone, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::BudgetRequest;
    use crate::config::Limits;
    use http::{HeaderMap, HeaderValue};

    /// No estimate rises here but the ones a test tells of itself.
    static QUIET: Notify = Notify::const_new();

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
        let held = adm.admit(&budget(1000), || need, &QUIET).await.unwrap();
        assert_eq!(adm.in_flight(), 1);

        // Waits up to 1000 - 100 - 50 ms; the slot frees at 300 ms.
        let waiter = {
            let adm = adm.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let slot = adm.admit(&budget(1000), || need, &QUIET).await;
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
        let _held = adm.admit(&budget(10_000), || need, &QUIET).await.unwrap();

        let t = Instant::now();
        let e = adm.admit(&budget(500), || need, &QUIET).await.unwrap_err();
        assert_eq!(
            t.elapsed(),
            Duration::from_millis(350),
            "gave up when 100 ms (and the slack) were left"
        );
        assert_eq!(e.code(), "overloaded");
        assert_eq!(e.status(), http::StatusCode::SERVICE_UNAVAILABLE);

        let t = Instant::now();
        let e = adm.admit(&budget(100), || need, &QUIET).await.unwrap_err();
        assert_eq!(
            t.elapsed(),
            Duration::ZERO,
            "nothing to wait with: refused at once"
        );
        assert_eq!(e.code(), "overloaded");
        assert_eq!(adm.in_flight(), 1);
    }

    /// An upstream that slows down while a request waits raises what its attempt needs: the
    /// request leaves the queue as overloaded as soon as a slot could no longer come in time,
    /// not when one frees and it has too little budget left to use it (audit GD F2).
    #[tokio::test(start_paused = true)]
    async fn a_waiting_request_leaves_once_the_rising_estimate_no_longer_fits() {
        use std::sync::atomic::AtomicU64;
        let adm = Admission::new("chat".into(), 1);
        let held = adm
            .admit(&budget(10_000), || Duration::from_millis(100), &QUIET)
            .await
            .unwrap();
        let need = Arc::new(AtomicU64::new(100));
        let rose = Arc::new(Notify::new());
        let waiter = {
            let (adm, need, rose) = (adm.clone(), need.clone(), rose.clone());
            tokio::spawn(async move {
                let t = Instant::now();
                let slot = adm
                    .admit(
                        &budget(2000),
                        || Duration::from_millis(need.load(Ordering::Relaxed)),
                        &rose,
                    )
                    .await;
                (slot.map(drop), t.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(600)).await;
        need.store(585, Ordering::Relaxed);
        rose.notify_waiters();
        // The slot frees at 1800 ms, with 200 ms of budget left: too late for 585 ms.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        drop(held);
        let (slot, waited) = waiter.await.unwrap();
        let e = slot.unwrap_err();
        assert_eq!(e.code(), "overloaded");
        assert_eq!(
            waited,
            Duration::from_millis(2000 - 585 - 50),
            "left when the slot could no longer come in time"
        );
        assert_eq!(adm.in_flight(), 0);
    }

    /// A slot that frees after the estimate rose past what is left is handed on, and the
    /// request refused as overloaded.
    #[tokio::test(start_paused = true)]
    async fn a_slot_granted_too_late_for_the_estimate_is_handed_on() {
        use std::sync::atomic::AtomicU64;
        let adm = Admission::new("chat".into(), 1);
        let held = adm
            .admit(&budget(10_000), || Duration::from_millis(100), &QUIET)
            .await
            .unwrap();
        let need = Arc::new(AtomicU64::new(100));
        let first = {
            let (adm, need) = (adm.clone(), need.clone());
            tokio::spawn(async move {
                adm.admit(
                    &budget(2000),
                    || Duration::from_millis(need.load(Ordering::Relaxed)),
                    &QUIET,
                )
                .await
                .map(drop)
            })
        };
        let second = {
            let adm = adm.clone();
            tokio::spawn(async move {
                let slot = adm
                    .admit(&budget(10_000), || Duration::from_millis(100), &QUIET)
                    .await;
                (slot.is_ok(), Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(1050)).await;
        let freed = Instant::now();
        need.store(1000, Ordering::Relaxed);
        drop(held);
        assert_eq!(first.await.unwrap().unwrap_err().code(), "overloaded");
        assert_eq!(
            second.await.unwrap(),
            (true, freed),
            "the slot went on at once"
        );
    }

    /// A waiting request sleeps to the latest time it may leave, asking its need again only
    /// when told of a rise: asked every 100 ms by each, 10,000 queued requests took 27% of
    /// a core doing nothing (audit HA 3).
    #[tokio::test(start_paused = true)]
    async fn a_waiting_request_asks_its_need_only_when_told_of_a_rise() {
        use std::sync::atomic::AtomicU64;
        let adm = Admission::new("chat".into(), 1);
        let held = adm
            .admit(&budget(60_000), || Duration::from_millis(100), &QUIET)
            .await
            .unwrap();
        let asked = Arc::new(AtomicU64::new(0));
        let rose = Arc::new(Notify::new());
        let waiter = {
            let (adm, asked, rose) = (adm.clone(), asked.clone(), rose.clone());
            tokio::spawn(async move {
                adm.admit(
                    &budget(60_000),
                    || {
                        asked.fetch_add(1, Ordering::Relaxed);
                        Duration::from_millis(100)
                    },
                    &rose,
                )
                .await
                .map(drop)
            })
        };
        tokio::time::sleep(Duration::from_secs(10)).await;
        let quiet = asked.load(Ordering::Relaxed);
        assert!(quiet <= 2, "asked {quiet} times in 10 s");
        rose.notify_waiters();
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(asked.load(Ordering::Relaxed), quiet + 1, "asked once more");
        drop(held);
        waiter.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_resized_route_counts_the_requests_already_in_flight() {
        let adm = Admission::new("chat".into(), 4);
        let need = Duration::from_millis(100);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(adm.admit(&budget(10_000), || need, &QUIET).await.unwrap());
        }
        // Lowered to 2 with 3 in flight: nobody more until two of them end.
        adm.resize(2);
        assert_eq!((adm.limit(), adm.in_flight()), (2, 3));
        assert!(adm.admit(&budget(100), || need, &QUIET).await.is_err());
        held.pop();
        assert!(
            adm.admit(&budget(100), || need, &QUIET).await.is_err(),
            "3 - 1 = 2: still full"
        );
        held.pop();
        let one = adm.admit(&budget(100), || need, &QUIET).await.unwrap();
        assert_eq!(adm.in_flight(), 2);
        assert!(adm.admit(&budget(100), || need, &QUIET).await.is_err());
        // Raised to 3 with 2 in flight: one more, not more.
        adm.resize(3);
        let two = adm.admit(&budget(100), || need, &QUIET).await.unwrap();
        assert!(adm.admit(&budget(100), || need, &QUIET).await.is_err());
        assert_eq!(adm.in_flight(), 3);
        // Lowered while full, then raised before the debt was paid: the debt goes first.
        adm.resize(1);
        adm.resize(2);
        drop(one);
        assert!(
            adm.admit(&budget(100), || need, &QUIET).await.is_err(),
            "2 still held of 2"
        );
        drop((two, held));
        let a = adm.admit(&budget(100), || need, &QUIET).await.unwrap();
        let b = adm.admit(&budget(100), || need, &QUIET).await.unwrap();
        assert!(adm.admit(&budget(100), || need, &QUIET).await.is_err());
        drop((a, b));
        assert_eq!(adm.in_flight(), 0);
    }

    #[test]
    fn bodies_hold_their_bytes_until_dropped_and_never_more_than_the_memory() {
        let memory = BodyMemory::new(Bodies::Requests, 100);
        let mut a = memory.hold();
        a.cover(60).unwrap();
        a.cover(40).unwrap();
        let mut b = memory.hold();
        b.cover(30).unwrap();
        let err = b.cover(41).unwrap_err();
        assert_eq!(err.code(), "overloaded");
        assert_eq!(err.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(err.to_string().contains("request_body_memory (100 bytes)"));
        // Refused, b still holds what it had: 30 + 60 of 100.
        b.cover(40).unwrap();
        assert!(memory.hold().cover(1).is_err());
        drop(a);
        let mut c = memory.hold();
        c.cover(60).unwrap();
        assert!(c.cover(61).is_err());
        assert!(memory.hold().cover(u64::from(u32::MAX) + 1).is_err());
    }

    /// Audit ME 3: a hold of 4 GiB or more (a `max_request_body` above it, and a
    /// `Content-Length` that says so) fits a memory that has the bytes free. It was refused
    /// as a full memory, 503 with `Retry-After: 1`, which the client would retry forever.
    #[test]
    fn holds_above_four_gib_fit_a_memory_that_has_them() {
        const GIB: u64 = 1 << 30;
        let memory = BodyMemory::new(Bodies::Requests, 8 * GIB);
        let free = || memory.bytes.available_permits() as u64;
        let mut a = memory.hold();
        a.cover(4 * GIB).unwrap();
        assert_eq!(a.held(), 4 * GIB);
        a.cover(5 * GIB + 1).unwrap();
        assert_eq!(free(), 3 * GIB - 1);
        // Refused, the other takes nothing: a partial grab goes back at once.
        assert!(memory.hold().cover(3 * GIB).is_err());
        assert_eq!(free(), 3 * GIB - 1);
        let mut b = memory.hold();
        b.cover(3 * GIB - 1).unwrap();
        drop(a);
        assert_eq!(free(), 5 * GIB + 1);
        drop(b);
        assert_eq!(free(), 8 * GIB);
        // A limit lowered while 6 GiB are held owes them back as they are let go.
        let mut c = memory.hold();
        c.cover(6 * GIB).unwrap();
        memory.resize(5 * GIB);
        drop(c);
        assert_eq!(free(), 5 * GIB);
    }

    /// Audit SA 1: a request body's hold grows with the bytes received, doubling (a few
    /// dozen steps for any body), never past the most it may be, and never for bytes only
    /// announced; where a step does not fit, what came alone is taken; past that, 503.
    #[test]
    fn a_body_holds_what_it_received_growing_in_doubling_steps() {
        let memory = BodyMemory::new(Bodies::Requests, 1000);
        let free = || memory.bytes.available_permits() as u64;
        let mut a = memory.hold();
        a.grow(1, 600).unwrap();
        assert_eq!(a.held(), 1, "one byte came of 600 announced");
        a.grow(2, 600).unwrap();
        a.grow(3, 600).unwrap();
        assert_eq!(a.held(), 4);
        a.grow(4, 600).unwrap();
        assert_eq!(a.held(), 4, "inside the step: nothing taken");
        a.grow(150, 600).unwrap();
        assert_eq!(a.held(), 150, "a frame past the doubled step: what came");
        a.grow(151, 600).unwrap();
        assert_eq!(a.held(), 300);
        a.grow(301, 600).unwrap();
        assert_eq!(a.held(), 600, "never past the most it may be");
        // 400 free: a step of 2 × 300 does not fit, what came does.
        let mut b = memory.hold();
        b.grow(300, 1000).unwrap();
        b.grow(301, 1000).unwrap();
        assert_eq!(b.held(), 301);
        assert_eq!(free(), 99);
        let err = b.grow(401, 1000).unwrap_err();
        assert_eq!(err.code(), "overloaded");
        assert!(err.to_string().contains("request_body_memory (1000 bytes)"));
        assert_eq!(b.held(), 301, "refused, it keeps what it had");
        // Ended short of its room: the rest goes back, and the debt of a lowered limit first.
        memory.resize(900);
        b.shrink_to(200);
        assert_eq!((b.held(), free()), (200, 100));
        drop((a, b));
        assert_eq!(free(), 900);
    }

    /// Audit TA 2: the step ahead of what came is a sixteenth of it (at least a granule),
    /// not what was held again: a body without a `Content-Length` (`most` = its limit) held
    /// up to twice what it received, and refused others that fitted by their bytes.
    #[test]
    fn a_growing_body_holds_little_more_than_it_received() {
        let memory = BodyMemory::new(Bodies::Requests, 64 << 20);
        let mut a = memory.hold();
        a.grow(600_000, 64 << 20).unwrap();
        assert_eq!(a.held(), 600_000);
        a.grow(600_001, 64 << 20).unwrap();
        assert_eq!(
            a.held(),
            600_001 + GRANULE,
            "a granule ahead, not 1,200,000"
        );
        a.grow(2_000_000, 64 << 20).unwrap();
        a.grow(2_000_001, 64 << 20).unwrap();
        assert_eq!(a.held(), 2_000_001 + 125_000, "a sixteenth ahead");
        let mut b = memory.hold();
        b.grow(1, 64 << 20).unwrap();
        b.grow(2, 64 << 20).unwrap();
        assert_eq!(b.held(), 2, "a small body still doubles");
        b.grow(3_000, 64 << 20).unwrap();
        b.grow(3_001, 64 << 20).unwrap();
        assert_eq!(b.held(), 6_000, "under a granule ahead: doubled");
    }

    /// Audit KF 2: answers take from their own memory in granules as they grow, are refused
    /// with an error naming `response_body_memory`, and hold their share until the bytes
    /// they became are dropped.
    #[test]
    fn answers_take_granules_and_keep_them_with_their_bytes() {
        let memory = BodyMemory::new(Bodies::Responses, 3 * GRANULE);
        let free = || memory.bytes.available_permits() as u64;
        let mut a = memory.hold();
        a.cover_in_granules(1).unwrap();
        assert_eq!(free(), 2 * GRANULE, "one granule for the first byte");
        a.cover_in_granules(GRANULE).unwrap();
        assert_eq!(
            free(),
            2 * GRANULE,
            "the rest of the granule took nothing more"
        );
        a.cover_in_granules(GRANULE + 1).unwrap();
        assert_eq!(free(), GRANULE);
        let mut b = memory.hold();
        b.cover(GRANULE / 2).unwrap();
        // A granule no longer fits: what is asked for alone is taken.
        a.cover_in_granules(2 * GRANULE + 10).unwrap();
        assert_eq!(free(), GRANULE / 2 - 10);
        let err = b.cover_in_granules(GRANULE).unwrap_err();
        assert_eq!(err.code(), "overloaded");
        assert_eq!(err.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            err.to_string()
                .contains(&format!("response_body_memory ({} bytes)", 3 * GRANULE)),
            "{err}"
        );
        drop(b);
        // Past the limit, one answer alone is refused too.
        assert!(memory.hold().cover_in_granules(3 * GRANULE + 1).is_err());

        // Kept with its bytes, the share comes back only when the last clone goes.
        let bytes = a.keep_with(Bytes::from_static(b"{}"));
        let copy = bytes.clone();
        drop(bytes);
        assert_eq!(free(), GRANULE - 10);
        assert_eq!(&copy[..], b"{}");
        drop(copy);
        assert_eq!(free(), 3 * GRANULE);
    }

    /// Audit AD 1: a reload that lowered a memory failed bodies in flight (uploads cut
    /// mid-way, rebuilt answers thrown away). A hold made before the lowering still grows
    /// while all the bodies hold together no more than the limit it started under; a new
    /// hold is judged against the new limit; and what the old holds took past it is
    /// forgotten as they let go, so the memory ends at the new limit.
    #[test]
    fn a_hold_made_before_a_lowering_grows_within_the_limit_it_started_under() {
        let memory = BodyMemory::new(Bodies::Requests, 1000);
        let free = || memory.bytes.available_permits() as u64;
        let mut a = memory.hold();
        let mut b = memory.hold();
        a.cover(300).unwrap();
        b.cover(300).unwrap();
        memory.resize(500);
        assert_eq!(free(), 0, "600 held of 500: 100 owed");
        a.cover(500).unwrap();
        b.cover(500).unwrap();
        assert_eq!(a.held() + b.held(), 1000);
        let err = a.cover(501).unwrap_err();
        assert!(err.to_string().contains("(500 bytes)"), "{err}");
        assert_eq!(a.held(), 500, "refused past the 1000 it started under");
        let err = memory.hold().cover(1).unwrap_err();
        assert_eq!(err.code(), "overloaded");
        drop(a);
        assert_eq!(free(), 0, "the 500 it held are owed");
        let mut c = memory.hold();
        assert!(
            c.cover(1).is_err(),
            "a new hold counts what the old ones hold"
        );
        drop(b);
        assert_eq!(free(), 500);
        c.cover(500).unwrap();
        assert!(c.cover(501).is_err(), "a new hold never past the new limit");
        drop(c);
        assert_eq!(free(), 500);
        assert_eq!(memory.debt.load(Ordering::Relaxed), 0);
    }

    /// Granules (answers) past a lowered limit: the same overdraft, and a raise after it
    /// pays what is owed before freeing new bytes.
    #[test]
    fn an_answer_held_before_a_lowering_keeps_growing_in_granules() {
        let memory = BodyMemory::new(Bodies::Responses, 4 * GRANULE);
        let free = || memory.bytes.available_permits() as u64;
        let mut a = memory.hold();
        a.cover_in_granules(GRANULE).unwrap();
        memory.resize(GRANULE);
        a.cover_in_granules(3 * GRANULE).unwrap();
        assert_eq!(a.held(), 3 * GRANULE);
        assert!(memory.hold().cover_in_granules(1).is_err());
        memory.resize(2 * GRANULE);
        assert_eq!(free(), 0, "3 granules held of 2");
        drop(a);
        assert_eq!(free(), 2 * GRANULE);
        assert_eq!(memory.debt.load(Ordering::Relaxed), 0);
    }
}
