//! A call a run admitted. It holds its run's entry (no second lookup at its end; in Redis, its
//! key) and its token reservation, which it gives back however the call ends: told what the
//! call used, or dropped without a word (a panic, a path that forgot), when it gives it all
//! back. A call that never reached an upstream (refused for the route's `max_in_flight`, its
//! budget, or left by its client while it waited) is withdrawn: no call of its run at all,
//! as a call refused for its budget before admission is not.

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};
use tokio::time::Instant;

use crate::runs::memory::{Entry, MemoryStore};
use crate::runs::shared::Shared;
use crate::runs::state::{Admitted, Call, RunLive, RunOf, Used, View};
use crate::telemetry::metrics::RunMetrics;

/// Where the call's run is, to give its reservation back.
pub(super) enum Ticket {
    Memory(Arc<MemoryStore>, Entry),
    /// The store, and where the call is in it (boxed: this call is in every request's
    /// future that names a run).
    Redis(Arc<Shared>, Box<InRedis>),
}

/// Where a call is in the Redis store.
pub(super) struct InRedis {
    /// The run's key.
    pub(super) key: String,
    /// The call's token there.
    pub(super) token: String,
    /// The run's generation as the admission said it: the call's end tells by it its run
    /// from one started over in the same key after its own was lost (audit VC 6).
    pub(super) generation: String,
}

pub static REMAINING_MS: HeaderName = HeaderName::from_static("x-run-remaining-ms");
pub static CALLS_LEFT: HeaderName = HeaderName::from_static("x-run-calls-left");
pub static TOKENS_LEFT: HeaderName = HeaderName::from_static("x-run-tokens-left");

pub struct RunCall {
    ticket: Ticket,
    reserve: u64,
    pub id: Arc<str>,
    pub admitted: Admitted,
    limits_tokens: Option<u64>,
    stops_loops: bool,
    /// The request body's fingerprint, counted as a repeat if the call ends answered.
    request: Option<u64>,
    /// An attempt of it started: it counts as a call of its run.
    sent: bool,
    done: bool,
    /// The run's route, and where its refusals are counted: a call withdrawn because what
    /// the run has left cannot fit it is one the run refused, as at admission. (Boxed: this
    /// call is in every request's future that names a run.)
    refusals: Box<(Arc<str>, RunMetrics)>,
}

impl std::fmt::Debug for RunCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunCall")
            .field("id", &self.id)
            .field("reserve", &self.reserve)
            .field("admitted", &self.admitted)
            .finish()
    }
}

impl RunCall {
    /// A call admitted into a run whose limits are `limits` (the run's, which the first of
    /// its calls' routes with run keys fixed, not the route of this call).
    pub(super) fn new(
        ticket: Ticket,
        call: &Call,
        id: Arc<str>,
        admitted: Admitted,
        limits: RunOf,
        refusals: (Arc<str>, RunMetrics),
    ) -> Self {
        Self {
            ticket,
            reserve: call.reserve,
            id,
            admitted,
            limits_tokens: limits.max_tokens,
            stops_loops: limits.stops_loops,
            request: call.request,
            sent: false,
            done: false,
            refusals: Box::new(refusals),
        }
    }

    /// An attempt of the call started: from now on it is a call of its run however it ends.
    pub fn sent(&mut self) {
        self.sent = true;
    }

    /// Whether an attempt of the call started.
    pub fn was_sent(&self) -> bool {
        self.sent
    }

    /// The request body's fingerprint, when the run stops loops.
    pub fn request(&self) -> Option<u64> {
        self.request
    }

    /// Whether the run stops loops (so the answer's tool calls matter).
    pub fn stops_loops(&self) -> bool {
        self.stops_loops
    }

    /// The tokens the call reserved at admission.
    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// What the run has used, live, for its streams to read and add to as they go: the
    /// memory store's (a Redis run's is in Redis, too far for every chunk; see
    /// docs/lifecycle.md).
    pub fn live(&self) -> Option<Arc<RunLive>> {
        match &self.ticket {
            Ticket::Memory(_, entry) => Some(
                entry
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .live
                    .clone(),
            ),
            Ticket::Redis(..) => None,
        }
    }

    /// The run's token limit, if it has one.
    pub fn limit_tokens(&self) -> Option<u64> {
        self.limits_tokens
    }

    /// The tokens the run has left once this call is charged `used`, read now: the run's
    /// other calls that ended (or were admitted) since this one's admission counted, as `GET
    /// /runs/{id}` shows once the call is back (audit SF 2: five concurrent calls' heads said
    /// 2100 ... 1700 tokens left, the run 500). The memory store's, one short hold of the
    /// run's lock; `None` for a Redis run, which only a store round trip on the answer's
    /// path could read (its end is sent after the answer, in the background). The calls
    /// left stay as admission counted this call (a rate limit's `remaining`).
    pub fn tokens_left_after(&self, used: u64) -> Option<Option<u64>> {
        match &self.ticket {
            Ticket::Memory(_, entry) => Some(
                entry
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .tokens_left_after(self.reserve, used),
            ),
            Ticket::Redis(..) => None,
        }
    }

    /// The call ended having used `used`: its reservation becomes that.
    pub fn finish(mut self, used: &Used) {
        self.done = true;
        self.give_back(used);
    }

    fn give_back(&self, used: &Used) {
        if !self.sent {
            return self.withdraw(used.run_deadline);
        }
        match &self.ticket {
            Ticket::Memory(store, entry) => store.finish(entry, self.reserve, used, Instant::now()),
            // Not on the answer's path: the record reports without waiting for the store.
            Ticket::Redis(shared, at) => shared.finish_later(
                at.key.clone(),
                at.token.clone(),
                at.generation.clone(),
                self.reserve,
                used.clone(),
                self.refusals.0.clone(),
            ),
        }
    }
}

impl RunCall {
    /// No call of its run: its place and its reservation go back.
    fn withdraw(&self, run_deadline: bool) {
        if run_deadline {
            let (route, metrics) = &*self.refusals;
            metrics.refused(route, "deadline");
        }
        match &self.ticket {
            Ticket::Memory(store, entry) => {
                store.withdraw(entry, self.reserve, run_deadline, Instant::now())
            }
            // cancel.lua, as for an admission nobody waited for: never served.
            Ticket::Redis(shared, at) => {
                shared.cancel_later(at.key.clone(), at.token.clone(), false)
            }
        }
    }
}

impl Drop for RunCall {
    fn drop(&mut self) {
        if !self.done {
            self.give_back(&Used::default());
        }
    }
}

/// Writes what the run has left into an answer's headers: `x-run-remaining-ms` where the
/// run has a deadline, `x-run-calls-left` and `x-run-tokens-left` where those limits are set.
pub fn insert_headers(headers: &mut HeaderMap, view: &View, now: Instant) {
    if let Some(d) = view.deadline {
        let ms = d.saturating_duration_since(now).as_millis() as u64;
        headers.insert(REMAINING_MS.clone(), HeaderValue::from(ms));
    }
    if let Some(n) = view.calls_left {
        headers.insert(CALLS_LEFT.clone(), HeaderValue::from(n));
    }
    if let Some(n) = view.tokens_left {
        headers.insert(TOKENS_LEFT.clone(), HeaderValue::from(n));
    }
}
