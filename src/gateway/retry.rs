//! Retries, fallbacks and hedging that spend one budget. Before each attempt the remaining
//! budget must fit what an attempt on that upstream is expected to take (its learned time to
//! first token, at least `min_useful`); an attempt that does not fit is not made. Nothing is
//! retried once a byte reached the client (a route that may switch holds the head until the
//! first data event), and nothing at all after the client left (dropping the handler drops
//! every attempt in flight). An OpenAI background response is sent once: only a connect that
//! failed (and so sent nothing) moves on (`provider::background`).

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};
use tokio::time::{sleep, sleep_until, Instant};

use crate::admission::BodyMemory;
use crate::budget::Budget;
use crate::config::{RetryCause, RetryOn};
use crate::error::{GatewayError, Uploading};
use crate::gateway::attempt::{Attempt, Started, SwitchBy};
use crate::gateway::balance::Order;
use crate::gateway::record::{RequestRecord, Throttled};
use crate::gateway::routes::{ChainEntry, RouteRuntime};
use crate::gateway::template::Template;
use crate::provider::background::Detached;
use crate::provider::ErrorType;
use crate::telemetry::metrics::InFlight;
use crate::telemetry::metrics::Metrics;
use crate::upstream::health::{Change, Probe, Since, Verdict};
use crate::upstream::throttle::Waiting;

mod race;
use race::{hedge, Race};

/// The last thing an attempt produced, returned when no further attempt is made.
enum Last {
    None,
    /// An upstream answer with a retryable status (kept to pass through unchanged).
    Answer(Box<Started>),
    Error(GatewayError),
}

/// What an upstream's own last failure says of retrying it. A hedge's two failures come
/// from two upstreams: the retry of the primary waits and counts by the primary's.
#[derive(Clone, Copy, Default)]
struct Own {
    cause: Option<RetryCause>,
    retry_after: Option<Duration>,
    /// The upstream said not to (`x-should-retry: false`).
    no_retry: bool,
}

impl Own {
    fn of(result: Result<&Started, &GatewayError>) -> Own {
        match result {
            // Only an answer that may be retried has its headers read: not every request's.
            Ok(s) => match answer_cause(s) {
                None => Own::default(),
                cause => {
                    let headers = s.response.headers();
                    Own {
                        cause,
                        retry_after: retry_after(headers),
                        no_retry: says_no_retry(headers),
                    }
                }
            },
            Err(e) => Own {
                cause: error_cause(e),
                ..Own::default()
            },
        }
    }
}

/// A retry whose upstream asked for a wait (a `Retry-After` longer than the backoff), owed
/// when the walk moved on from that upstream to a balance peer: made after the peers, before
/// the fallbacks, when its attempt (what is left of the wait included) still fits.
struct Owed<'a> {
    /// The upstream's place in the chain, and the retry's number on it: an upstream has no
    /// more attempts for owing one.
    i: usize,
    n: u32,
    /// When the wait (spread as any `Retry-After` wait is) ends.
    ready: Instant,
    /// The upstream's own failure the retry is for: its reason and wait.
    own: Own,
    /// The request counts among those waiting to retry the upstream (`Throttle::wait`).
    waiting: Waiting<'a>,
}

/// The retry owed that is ready first.
fn first_ready(owed: &[Owed<'_>]) -> Option<usize> {
    (0..owed.len()).min_by_key(|&k| owed[k].ready)
}

/// The first place of the chain from `k` on that no hedge raced.
fn unraced(mut k: usize, raced: &[usize]) -> usize {
    while raced.contains(&k) {
        k += 1;
    }
    k
}

/// `x-should-retry: false`, which the OpenAI and Anthropic SDKs obey and Hourglass itself
/// sends after its own retries: an upstream that says so (a provider, or another Hourglass
/// down a chain of gateways, or this one looped back to itself) is not asked again, or each
/// layer's retries would multiply the calls (audit Y1: two chained gateways made nine, a
/// loop sixty before its 508).
fn says_no_retry(headers: &HeaderMap) -> bool {
    headers
        .get("x-should-retry")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("false"))
}

/// `answers`: the memory answers held before their heads share (`response_body_memory`),
/// which a copy of an answer kept while a later attempt runs takes its bytes from.
pub async fn run(
    metrics: &Metrics,
    route: &RouteRuntime,
    template: &Template,
    budget: &Budget,
    record: &mut RequestRecord,
    answers: &BodyMemory,
) -> Result<Started, GatewayError> {
    let policy = &route.route.policy;
    // A background response is never sent twice: OpenAI runs (and bills) each one it
    // received until it is cancelled by its id, and closing a connection cancels nothing
    // (audit UC 1). Only a failed connect, which sent nothing, may move on; it is never hedged.
    // Nor one whose body the gateway does not read, which the provider may read as one (VB 1).
    let retry_on = match template.detached {
        Some(d) if d.creates() => policy.retry_on.only(RetryCause::Connect),
        _ => policy.retry_on,
    };
    let mut last = Last::None;
    // A copy of the last upstream answer that the next attempt replaced, passed through
    // should the chain end in an error of the gateway's own.
    let mut kept = Kept {
        memory: answers,
        answer: None,
    };
    // The last failure of the upstream being retried.
    let mut own = Own::default();
    let mut previous: Option<usize> = None;
    // The upstreams raced beside the primary, which the chain does not try again.
    let mut raced: Vec<usize> = Vec::new();
    // The fallback whose room the last attempt's cut wait kept, when that wait ended it.
    // When the cut fires late (a busy machine wakes its timer late), the room it left is
    // short by as much, and the fallback must not lose the attempt the cut was for: it
    // needs only `min_useful`.
    let mut room_kept_for: Option<usize> = None;
    let chain = Order::of(route, Instant::now());
    // Each request of a hedged route adds to its share of hedges, hedged or not.
    if policy.hedge_after.is_some() {
        route.hedges.request();
    }
    // The balance group leads the chain: `chain[..group]`, then the fallbacks.
    let group = 1 + policy.balanced.len();
    // The retries a wait was asked for that the walk moved on from to a balance peer.
    let mut owed: Vec<Owed<'_>> = Vec::new();
    // The next upstream of the chain the walk has not reached.
    let mut cursor = 0;
    // A peer failed in a way nothing moves on from (an answer or error not retried): only
    // the retries owed before it are still made.
    let mut only_owed = false;
    'chain: loop {
        // The next of the chain, but before the fallbacks (and at the chain's end) the
        // retries owed, the one ready first first.
        cursor = unraced(cursor, &raced);
        let (i, from, mut resumed) =
            if !only_owed && cursor < route.chain.len() && (cursor < group || owed.is_empty()) {
                cursor += 1;
                (cursor - 1, 0, None)
            } else if let Some(k) = first_ready(&owed) {
                let o = owed.swap_remove(k);
                own = o.own;
                (o.i, o.n, Some((o.ready, o.waiting)))
            } else {
                break;
            };
        let Some(entry) = chain.get(i) else {
            break;
        };
        for n in from..=policy.retries {
            let now = Instant::now();
            // The ejection the attempt is judged under, read before it is judged: one judged
            // in rotation that starts after an ejection tells of the upstream before it, and
            // does not end that ejection (`Health::report`).
            let mut began = entry.upstream.health.since();
            let Turn::Go(mut probe) = turn(chain, i, template, budget, now) else {
                metrics.skipped(&route.name, &entry.upstream.name);
                record.passed_over(&entry.upstream.name);
                break;
            };
            // Out of rotation and tried only because nothing later is: once is enough. Its
            // retries would only add to the load that ejected it, on every request while the
            // whole chain is out (audit GD 3: five calls for each client's one).
            let backoff = if n > 0 { backoff(n) } else { Duration::ZERO };
            // The upstream asked for the wait (a `Retry-After` longer than the backoff): a
            // retry not made for it leaves the wait to the client's SDK (`left_wait`).
            let asked =
                n > 0 && (resumed.is_some() || own.retry_after.is_some_and(|a| a > backoff));
            if n > 0 && probe.is_none() && entry.upstream.health.is_out() {
                record.throttled(Throttled::RetryOutOfRotation);
                record.left_wait(asked);
                break;
            }
            let need = if room_kept_for == Some(i) && n == 0 {
                budget.min_useful
            } else {
                template
                    .expected_ttft(&entry.upstream)
                    .max(budget.min_useful)
            };
            // Where the walk goes after this upstream (its retries apart), and what is left
            // to wait there: a balance peer not tried yet, else the owed retry ready first,
            // else the next of the chain; and, for a next of the chain, its place.
            let after = unraced(cursor, &raced);
            let (next, next_at) = if after < group || owed.is_empty() {
                (chain.get(after).map(|e| (e, Duration::ZERO)), Some(after))
            } else {
                let next = first_ready(&owed).and_then(|k| {
                    let o = &owed[k];
                    Some((chain.get(o.i)?, o.ready.saturating_duration_since(now)))
                });
                (next, None)
            };
            // A retry leaves room for the fallback after it: a failing upstream may not spend
            // the turn of a healthy one.
            let room = match next {
                Some((next, left)) if n > 0 => fallback_room(template, budget, next) + left,
                _ => Duration::ZERO,
            };
            let mut wait = Duration::ZERO;
            if n > 0 {
                let fits = budget.usable(now).saturating_sub(need + room);
                wait = match &resumed {
                    // An owed retry waits what is left of the wait it was owed after.
                    Some((ready, _)) => ready.saturating_duration_since(now),
                    None => retry_wait(own.retry_after, backoff, fastrand::f64(), fits),
                };
                // A wait asked for with a balance peer in rotation not tried yet (or other
                // retries owed, which may be ready sooner) is not idled away: the walk moves
                // on, and owes this retry, made after the peers and before the fallbacks when
                // it still fits. Waiting beside an idle peer cost the request the whole wait
                // (audit SC 3); moving on without the retry gave it up for good, and when the
                // peer asked for a longer wait the request ended on the peer's 429 where this
                // upstream's retry would have answered (audit TA 1). A peer out of rotation
                // is no reason to move on: it would be tried ahead of a retry in rotation.
                let fits_now = budget.usable(now) >= need + wait
                    && budget.head_by().is_none_or(|by| now + need + wait <= by);
                let peer = (after..group).any(|k| {
                    !raced.contains(&k)
                        && chain
                            .get(k)
                            .is_some_and(|e| e.upstream.health.available(now))
                });
                // Nor does a retry of the upstream's own go ahead of a retry owed that is
                // due before it: a peer that hung to its first-token limit made the owed
                // retry, due long since, wait for its own retry's hang too (audit YA 2).
                let due = owed.iter().any(|o| o.ready <= now + wait);
                if resumed.is_none() && fits_now && ((asked && (peer || !owed.is_empty())) || due) {
                    tracing::debug!(?wait, "retry owed after the balance peers");
                    owed.push(Owed {
                        i,
                        n,
                        ready: now + wait,
                        own,
                        waiting: entry.upstream.retries.wait(),
                    });
                    break;
                }
                if let Some(c) = own.cause {
                    tracing::debug!(reason = c.as_str(), ?wait, "retrying");
                }
            }
            if budget.usable(now) < need + wait + room {
                // Retry-After, backoff or the estimate does not fit: on to the next upstream.
                record.left_wait(asked);
                break;
            }
            // Nor does an attempt after the first start past the client's patience: its
            // head could not reach the client in time.
            let first = i == 0 && n == 0;
            if !first && budget.head_by().is_some_and(|by| now + need + wait > by) {
                record.left_wait(asked);
                break;
            }
            let _retry = if n > 0 {
                let throttle = &entry.upstream.retries;
                let attempts = || usize::try_from(entry.in_flight.get()).unwrap_or(0);
                let retry = if asked {
                    // Asked to come back later, a retry counts against its upstream's share
                    // from its attempt on, judged when its wait ends; while it waits it only
                    // adds to the base (`throttle.rs`). An owed retry has waited so since
                    // the walk moved on from it.
                    let waiting = match resumed.take() {
                        Some((_, waiting)) => waiting,
                        None => throttle.wait(),
                    };
                    sleep(wait).await;
                    throttle.take_after_wait(waiting, attempts())
                } else {
                    // A backoff's counts from its wait on: attempts that fail at once are
                    // seldom in flight together, and counted from the attempt alone, a storm
                    // of 503s got three calls for each client's one again (audit HA 1).
                    let retry = throttle.take_beside_waiting(attempts());
                    if retry.is_some() && !wait.is_zero() {
                        sleep(wait).await;
                    }
                    retry
                };
                let Some(retry) = retry else {
                    record.throttled(Throttled::RetryBudget);
                    break;
                };
                Some(retry)
            } else {
                None
            };
            // A wait ends a little after its instant (a timer fires on the millisecond after
            // it): a retry that no longer fits what is left is not made, its upstream's answer
            // kept. Judged only before the wait, a retry that just fit was sent with 98 ms
            // left of a 100 ms `min_useful` (audit WC 1), against DESIGN's "never contacted".
            if n > 0 && !wait.is_zero() && budget.usable(Instant::now()) < need {
                record.left_wait(asked);
                break;
            }
            // Ejected while the retry waited (by other requests' failures): judged again, by
            // the rule it was judged by before the wait. Judged only before it, requests that
            // waited out a `Retry-After` all retried the ejected upstream while the fallback
            // was in rotation, and their answers ended the ejection (audit SC 1).
            if n > 0 && probe.is_none() && entry.upstream.health.is_out() {
                began = entry.upstream.health.since();
                match turn(chain, i, template, budget, Instant::now()) {
                    Turn::Go(Some(p)) => probe = Some(p),
                    Turn::Go(None) => {
                        record.throttled(Throttled::RetryOutOfRotation);
                        record.left_wait(asked);
                        break;
                    }
                    Turn::PassOver => {
                        metrics.skipped(&route.name, &entry.upstream.name);
                        record.passed_over(&entry.upstream.name);
                        break;
                    }
                }
            }
            // The attempt is made: what it replaces is dropped (and so cancelled) now, all but
            // a copy of an upstream answer. Should the attempts after it end in the gateway's
            // own error (a fallback refused, one that hung to the deadline), the provider's
            // 429 and its `Retry-After` are the better answer: they were lost for a 502 that
            // said not to retry, or a 504 (audit SC 2).
            if let Last::Answer(started) = std::mem::replace(&mut last, Last::None) {
                kept.keep(Ok(*started)).await;
            }
            if n > 0 {
                metrics.retry(
                    &route.name,
                    &entry.upstream.name,
                    own.cause.map_or("other", RetryCause::as_str),
                );
            } else if let Some(p) = previous {
                metrics.fallback(&route.name, &chain[p].upstream.name, &entry.upstream.name);
            }
            previous = Some(i);
            // The race is with the next upstream in rotation, judged when the hedge fires.
            // Not while the primary is on probation: a probe that lost the race would say
            // nothing, and a primary slower than `hedge_after` would never come back.
            // Nor a detached call (a background response, or its stream resumed): the
            // loser's close would stop nothing, and a resume's two reads wait on one response.
            let hedges = policy.hedge_after.is_some()
                && template.detached.is_none()
                && i == 0
                && n == 0
                && route.chain.len() > 1
                && !entry.upstream.health.is_out();
            // The waits of the attempt cut short to keep the next upstream its room.
            let mut switch_by = None;
            let outcome = if hedges {
                // A race that can start keeps the route's limit (the fallback is raced, not
                // waited for); with no upstream after it in rotation now, the primary is cut
                // as any first attempt, in case none is back when the hedge fires.
                let (ft, cut) =
                    if (1..route.chain.len()).any(|k| chain[k].upstream.health.available(now)) {
                        (budget.first_token_timeout, None)
                    } else {
                        first_token_limit(template, budget, retry_on, next)
                    };
                // Boxed: a hedge holds two attempts, and inline it would more than
                // double the size of every request's future, which is moved whole
                // (memcpy) several times per request on routes that never hedge.
                // An answer a racer failed with is kept as one the chain moved on from.
                let Race {
                    outcome,
                    raced: hedged,
                    primary,
                } = Box::pin(hedge(
                    metrics, route, chain, template, budget, record, ft, cut, &mut kept,
                ))
                .await;
                raced = hedged;
                own = primary.unwrap_or_else(|| Own::of(outcome.as_ref().map(|(s, _)| s)));
                // The cut counts only where it alone ended the request's wait.
                if raced.is_empty() {
                    switch_by = cut;
                }
                // A move on along the chain is from the last upstream raced.
                if let Some(&last) = raced.last() {
                    previous = Some(last);
                }
                outcome
            } else {
                let ft;
                (ft, switch_by) = first_token_limit(template, budget, retry_on, next);
                let outcome = single(
                    metrics,
                    route,
                    entry,
                    template,
                    budget,
                    record,
                    ft,
                    switch_by,
                    (probe, began),
                )
                .await;
                own = Own::of(outcome.as_ref());
                outcome.map(|s| (s, i))
            };
            // The fallback keeps the room of a wait that was cut and ended the attempt; any
            // other end (a 5xx, a wait left whole) leaves it to fit as any attempt does.
            room_kept_for = match &outcome {
                Err(e) if ended_by_cut(switch_by, e) => next_at,
                _ => None,
            };
            match outcome {
                Ok((started, winner)) => {
                    if answer_cause(&started).is_some_and(|c| retry_on.contains(c)) {
                        last = Last::Answer(Box::new(started));
                        // Told not to ask this upstream again: on to the next, as after
                        // any failure of this status that no retry is left for.
                        if own.no_retry {
                            break;
                        }
                        continue;
                    }
                    // A peer's failure that nothing moves on from does not end the walk
                    // before the retries owed to the keys before it: a peer's 401 (its key
                    // revoked) ended the request while the key that asked for a wait would
                    // have answered (audit YA 1).
                    // An error event before any output (a 200's `authentication_error`,
                    // llama.cpp's 400) is such a failure too (break audit ZC 4).
                    let failed = started.response.status().is_client_error()
                        || started.response.status().is_server_error()
                        || started.error_event.is_some();
                    if failed && !owed.is_empty() {
                        last = Last::Answer(Box::new(started));
                        only_owed = true;
                        break;
                    }
                    record.set_upstream(&chain[winner], started.sent_at, started.first_byte_at);
                    if let Some(at) = started.first_token_at {
                        crate::stream::Observer::first_token(record, at);
                    }
                    return Ok(started);
                }
                Err(error) => {
                    let retryable = error_cause(&error).is_some_and(|c| retry_on.contains(c));
                    if !retryable {
                        last = Last::Error(error);
                        if owed.is_empty() {
                            break 'chain;
                        }
                        only_owed = true;
                        break;
                    }
                    // A certificate that failed fails every retry here the same way: on to
                    // the fallback, if any.
                    let certificate = matches!(
                        error,
                        GatewayError::UpstreamUnavailable {
                            certificate: true,
                            ..
                        }
                    );
                    last = Last::Error(error);
                    if certificate {
                        break;
                    }
                }
            }
        }
    }
    let last = match (last, kept.answer) {
        (Last::Error(e), Some(answer)) if gateways_own(&e) => Last::Answer(answer),
        (last, _) => last,
    };
    match last {
        Last::Answer(started) => {
            // No attempt was left to make: the upstream's own answer passes through.
            let entry = chain
                .iter()
                .find(|e| e.upstream.name == started.limits.upstream)
                .unwrap_or(&chain[0]);
            record.set_upstream(entry, started.sent_at, started.first_byte_at);
            Ok(*started)
        }
        Last::Error(e) => Err(e),
        // No attempt fitted what was left. Without a run, the time went on attempts (or on
        // waiting), and a new request gets a new budget; with one, the run's time is gone.
        Last::None => {
            let upstream = &chain[0].upstream;
            let expected = template.expected_ttft(upstream);
            let need = expected.max(budget.min_useful);
            let e = budget.too_little(
                Instant::now(),
                need,
                (expected > budget.min_useful).then(|| {
                    (
                        &*upstream.name,
                        upstream.model_for(template.model.as_deref()),
                    )
                }),
                false,
            );
            // No attempt made, and the call fit when the request came: the client's upload
            // spent its room (audit ZA 2).
            if previous.is_none() && budget.spent_uploading(need) {
                let len = template.body.len() as u64;
                return Err(e.spent_uploading(Uploading {
                    received: len,
                    length: Some(len),
                }));
            }
            Err(e)
        }
    }
}

/// The longest a kept answer's body is waited for (see `Started::keep`), and its most bytes.
/// Error bodies come with their heads: one that does not is not kept, and costs the next
/// attempt no more than this.
const KEPT_BODY_WAIT: Duration = Duration::from_millis(100);
const KEPT_BODY_MOST: usize = 64 * 1024;

/// The copy of the latest upstream answer that a later attempt replaced, to pass through
/// should the chain end in an error of the gateway's own (audit SC 2), with its bytes held in
/// the memory answers share: up to 64 KiB a request while the later attempt runs, which was
/// outside that bound (audit VA 2).
struct Kept<'a> {
    memory: &'a BodyMemory,
    answer: Option<Box<Started>>,
}

impl Kept<'_> {
    /// Keeps a copy of `result` when it is an upstream answer, which the next attempt (or a
    /// racer still running) is about to replace: the later answer replaces an earlier one,
    /// the providers' latest word on when to come back. One that cannot be kept (its body
    /// too long or too slow, or the memory full) leaves the earlier one. Whatever else the
    /// result holds is dropped, and so its upstream call ended.
    async fn keep(&mut self, result: Result<Started, GatewayError>) {
        if let Ok(started) = result {
            let by = Instant::now() + KEPT_BODY_WAIT;
            let hold = self.memory.hold();
            if let Some(copy) = started.keep(KEPT_BODY_MOST, by, hold).await {
                self.answer = Some(Box::new(copy));
            }
        }
    }
}

/// Whether `e`, ending a chain after an upstream's answer was replaced, is the gateway's
/// account of a later attempt (a failed or hung connect, a first token late, a reset, the
/// deadline spent waiting), which that answer passes through in place of. The deadline too:
/// the provider said when to come back, where a 504 says only that time ran out. Not a
/// client that left, a shutdown, or the gateway's own want of memory or descriptors.
fn gateways_own(e: &GatewayError) -> bool {
    error_cause(e).is_some() || matches!(e, GatewayError::DeadlineExceeded { .. })
}

/// Exponential backoff with jitter before retry `n` (1-based) on the same upstream: 100 ms,
/// 200 ms, 400 ms ... capped at 2 s, each scaled by a random factor in [0.5, 1) so that
/// clients failing together do not retry together.
pub fn backoff(n: u32) -> Duration {
    let base = Duration::from_millis(100) * 2u32.saturating_pow(n.saturating_sub(1).min(5));
    base.min(Duration::from_secs(2))
        .mul_f64(0.5 + fastrand::f64() * 0.5)
}

/// The most a `Retry-After` wait is spread by, as a share of it.
const RETRY_AFTER_SPREAD: f64 = 0.2;

/// The most a `Retry-After` wait is spread by, however long.
const RETRY_AFTER_SPREAD_MAX: Duration = Duration::from_secs(1);

/// The share of the budget's time to spare past the asked wait (`fits - asked`) that the
/// spread may take: the rest is the answer's, whose time after its first token no estimate
/// holds.
const RETRY_AFTER_SPREAD_OF_SPARE: u32 = 4;

/// The wait before a retry: its `backoff`, or the upstream's `Retry-After` when longer, then
/// spread by a random part (`spread` in [0, 1)) of at most a fifth more of it, 1 s, and a
/// quarter of what the budget `fits` past it. The backoff has its own jitter; a bare
/// `Retry-After` sent every client refused together back together (audit GD 6: two waves of
/// 200 calls, each within 100 ms). RFC 9110 10.2.3 makes it a minimum, so waiting longer is
/// allowed. Taking all the budget past the asked wait, the spread left the retry only its
/// first token's time, and answers that take longer were cut (audit HA 2: two of three
/// retries after `retry-after: 15` in a 20 s budget, each answering in 4 s).
fn retry_wait(
    retry_after: Option<Duration>,
    backoff: Duration,
    spread: f64,
    fits: Duration,
) -> Duration {
    match retry_after {
        Some(asked) if asked > backoff => {
            let most = asked
                .mul_f64(RETRY_AFTER_SPREAD)
                .min(RETRY_AFTER_SPREAD_MAX)
                .min(fits.saturating_sub(asked) / RETRY_AFTER_SPREAD_OF_SPARE);
            asked + most.mul_f64(spread.clamp(0.0, 1.0))
        }
        _ => backoff,
    }
}

/// What the upstream asked us to wait before trying again: OpenAI's `retry-after-ms`, or
/// `retry-after` in seconds or as an HTTP-date (RFC 9110 10.2.3).
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    retry_after_at(headers, SystemTime::now())
}

fn retry_after_at(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let get = |name: &str| Some(headers.get(name)?.to_str().ok()?.trim());
    let seconds = |v: &str| v.parse::<f64>().ok();
    let d = match get("retry-after-ms").and_then(seconds) {
        Some(ms) => ms / 1000.0,
        None => {
            let v = get("retry-after")?;
            match seconds(v) {
                Some(s) => s,
                None => {
                    let at = httpdate::parse_http_date(v).ok()?;
                    // Measured against the upstream's own clock when it sends one: its
                    // clock and ours may disagree by more than the wait it asks for.
                    let from = get("date")
                        .and_then(|d| httpdate::parse_http_date(d).ok())
                        .unwrap_or(now);
                    at.duration_since(from).unwrap_or_default().as_secs_f64()
                }
            }
        }
    };
    // A day or more (or forever) is a wait no budget fits: the upstream is not asked again
    // at once, as a missing value would have it (audit O: a quota that resets tomorrow got
    // every retry within 0.2 s).
    if d >= LONGEST_RETRY_AFTER.as_secs_f64() {
        return Some(LONGEST_RETRY_AFTER);
    }
    (d >= 0.0).then(|| Duration::from_secs_f64(d))
}

/// What a longer `retry-after` counts as.
const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(86_400);

/// Time the switch itself takes (timer wake-up, dropping the loser, building the next
/// request), kept on top of the fallback's estimate so that the fallback still fits when the
/// shortened limit fires.
const SWITCH_SLACK: Duration = Duration::from_millis(50);

/// What an attempt on `next` needs of the budget, the switch to it included.
fn fallback_room(template: &Template, budget: &Budget, next: &ChainEntry) -> Duration {
    template
        .expected_ttft(&next.upstream)
        .max(budget.min_useful)
        + SWITCH_SLACK
}

/// The first-token limit of an attempt, and when its waits end at the latest: the route's
/// limit, and no end of their own, unless a fallback follows, when they are cut so that what
/// remains still fits an attempt on that fallback (`next`, with the wait left before it: an
/// owed retry's). A connect that hangs spends the
/// fallback's turn as surely as a first token that does. Only a wait whose failure moves on
/// (`retry_on`) is cut: the others' failures are the client's answer, fallback or not.
fn first_token_limit(
    template: &Template,
    budget: &Budget,
    retry_on: RetryOn,
    next: Option<(&ChainEntry, Duration)>,
) -> (Duration, Option<SwitchBy>) {
    let ft = budget.first_token_timeout;
    let connect = retry_on.contains(RetryCause::Connect);
    let first_token = retry_on.contains(RetryCause::FirstToken);
    let Some((next, waits)) = next.filter(|_| connect || first_token) else {
        return (ft, None);
    };
    let now = Instant::now();
    // The fallback's head must come by the client's patience too.
    let usable = budget.usable(now).min(
        budget
            .head_by()
            .map_or(Duration::MAX, |by| by.saturating_duration_since(now)),
    );
    match usable.checked_sub(fallback_room(template, budget, next) + waits) {
        Some(left) if left >= budget.min_useful && left < usable => {
            let ft = if first_token { ft.min(left) } else { ft };
            let switch = SwitchBy {
                at: now + left,
                connect,
                first_token,
            };
            (ft, Some(switch))
        }
        _ => (ft, None),
    }
}

/// Whether `error` is the end of a wait that `switch_by` cut short: the connect's, or the
/// first token's (a connection that never spoke once the request was on it is that wait too).
fn ended_by_cut(switch_by: Option<SwitchBy>, error: &GatewayError) -> bool {
    let Some(s) = switch_by else {
        return false;
    };
    match error {
        GatewayError::ConnectTimeout { sent: false, .. } => s.connect,
        GatewayError::ConnectTimeout { sent: true, .. }
        | GatewayError::FirstTokenTimeout { .. } => s.first_token,
        _ => false,
    }
}

/// Why an answer may be retried: its status, or the provider's error event that came in
/// place of any output while its head was held (an overload or a server error as a 5xx, a
/// rate limit as a 429; a bad request is the client's and passes through).
fn answer_cause(started: &Started) -> Option<RetryCause> {
    status_cause(started.response.status()).or_else(|| match started.error_event? {
        ErrorType::Overloaded | ErrorType::Api | ErrorType::Server | ErrorType::Timeout => {
            Some(RetryCause::Status5xx)
        }
        // As the 429 status it comes with when not sent as an event.
        ErrorType::RateLimit | ErrorType::InsufficientQuota => Some(RetryCause::Status429),
        _ => None,
    })
}

fn status_cause(status: StatusCode) -> Option<RetryCause> {
    if status == StatusCode::TOO_MANY_REQUESTS {
        Some(RetryCause::Status429)
    } else if status.is_server_error() {
        Some(RetryCause::Status5xx)
    } else {
        None
    }
}

fn error_cause(e: &GatewayError) -> Option<RetryCause> {
    match e {
        // Sent on a connection whose server never spoke, the request may have been
        // processed: a retry is the operator's first-token choice, not a safe connect one.
        GatewayError::ConnectTimeout { sent: true, .. } => Some(RetryCause::FirstToken),
        GatewayError::ConnectTimeout { .. } | GatewayError::UpstreamUnavailable { .. } => {
            Some(RetryCause::Connect)
        }
        GatewayError::FirstTokenTimeout { .. } => Some(RetryCause::FirstToken),
        GatewayError::UpstreamError { .. } | GatewayError::UpstreamRefused { .. } => {
            Some(RetryCause::Reset)
        }
        // The gateway's own want of descriptors says nothing of the upstream, and a retry or
        // a fallback would need a descriptor too: the client is told to try again later.
        GatewayError::Starved { .. } => None,
        _ => None,
    }
}

/// Whether the attempt on the `i`th upstream of the chain is made.
enum Turn<'a> {
    /// It is, as the upstream's probe when it is out of rotation and its turn to be probed
    /// came (the guard ends the turn with the attempt, or hands it on if none is made).
    Go(Option<Probe<'a>>),
    /// It is not: the upstream is out of rotation and a later upstream of the chain is in
    /// it, with an attempt there that still fits the budget.
    PassOver,
}

/// Where no later upstream is in rotation, an upstream out of it is tried all the same, as
/// though nothing were ejected. The probe's turn is claimed here, where the upstream is
/// judged, not when the attempt starts: judged available by two requests at once, it would
/// be probed by both.
fn turn<'a>(
    chain: Order<'a>,
    i: usize,
    template: &Template,
    budget: &Budget,
    now: Instant,
) -> Turn<'a> {
    // `get`, not indexing: the probe borrows the route's chain, not this order of it.
    let Some(entry) = chain.get(i) else {
        return Turn::Go(None);
    };
    let health = &entry.upstream.health;
    let probe = health.attempt(now, longest_wait(budget, now));
    if probe.is_some() || !health.is_out() {
        return Turn::Go(probe);
    }
    let later = chain.iter().skip(i + 1).any(|e| {
        // One the budget no longer fits would be passed over in turn, and the request
        // refused for want of time that the ejected upstream might have had.
        e.upstream.health.available(now)
            && budget.usable(now) >= template.expected_ttft(&e.upstream).max(budget.min_useful)
    });
    if later {
        Turn::PassOver
    } else {
        Turn::Go(None)
    }
}

/// The longest an attempt started at `now` may wait for its answer: a probe holds its turn
/// that long. The route's own limits bound it (a shortened first-token wait only ends sooner).
fn longest_wait(budget: &Budget, now: Instant) -> Duration {
    (budget.connect_timeout + budget.first_token_timeout).min(budget.usable(now))
}

/// A connect that takes this long is no healthy upstream's, even where the budget cut the
/// wait below `connect_timeout` (connects take milliseconds, a TLS handshake across an
/// ocean a few hundred).
const SLOW_CONNECT: Duration = Duration::from_secs(1);

/// What an attempt showed of its upstream's health: an answer that would be retried (a 5xx,
/// a 429, the provider's error event of that kind) and the failures that retries are made
/// for count against it; a stream refused unprocessed (the upstream rotating its
/// connections), a client gone or a budget spent do not. Nor does a first-token limit cut
/// short to leave a fallback its room or to answer before the client gives up: heavy-tailed
/// first tokens miss a short wait now and then, and one request's short budget must not take
/// the upstream from requests with time to wait.
fn verdict(result: &Result<Started, GatewayError>, budget: &Budget) -> Verdict {
    match result {
        Ok(s) if answer_cause(s).is_some() => Verdict::Failed(answer_outcome(s)),
        Ok(_) => Verdict::Healthy,
        Err(GatewayError::UpstreamRefused { .. }) => Verdict::Neither,
        Err(GatewayError::ConnectTimeout { after, .. })
            if *after < budget.connect_timeout.min(SLOW_CONNECT) =>
        {
            Verdict::Neither
        }
        Err(GatewayError::FirstTokenTimeout { after, .. })
            if *after < budget.route_first_token_timeout =>
        {
            Verdict::Neither
        }
        Err(e) if error_cause(e).is_some() => Verdict::Failed(e.code()),
        Err(_) => Verdict::Neither,
    }
}

fn attempt<'a>(
    entry: &'a ChainEntry,
    route: &RouteRuntime,
    template: &Template,
    budget: &'a Budget,
    first_token_timeout: Duration,
    switch_by: Option<SwitchBy>,
) -> Attempt<'a> {
    Attempt {
        upstream: &entry.upstream,
        budget,
        first_token_timeout,
        switch_by,
        // A background response is not sent again, so nothing is gained by holding its
        // head: it and the first events (`response.created` names the response to resume
        // or cancel) pass as they come, and a limit after them is an error event. So for one
        // that may be background (VB 1): with no second attempt, holding gains nothing.
        hold: route.route.policy.holds_head() && !template.detached.is_some_and(Detached::creates),
        in_flight: InFlight::new(&entry.in_flight),
        answers: &entry.answer,
    }
}

/// One attempt, noted in the record. An attempt the upstream refused unprocessed (HTTP/2
/// REFUSED_STREAM, or left out by a GOAWAY: a provider's front end rotates its connections)
/// is sent again once, at once, whatever the route's retries, when the budget still fits an
/// attempt: RFC 9113 §8.7 makes that safe, and a client should not see a 502 for a
/// connection the upstream chose to close.
#[allow(clippy::too_many_arguments)]
async fn single(
    metrics: &Metrics,
    route: &RouteRuntime,
    entry: &ChainEntry,
    template: &Template,
    budget: &Budget,
    record: &mut RequestRecord,
    first_token_timeout: Duration,
    switch_by: Option<SwitchBy>,
    // The probe's turn, held until the attempt (and a resend of it) has reported, or
    // dropped with it; and the ejection the attempt was judged under (`Health::since`).
    (probe, began): (Option<Probe<'_>>, Since),
) -> Result<Started, GatewayError> {
    let mut sent_again = false;
    loop {
        let out = template.request_for(&entry.upstream)?;
        let now = Instant::now();
        let index = record.attempt_started(entry, now, true);
        let mut result = attempt(
            entry,
            route,
            template,
            budget,
            first_token_timeout,
            switch_by,
        )
        .run(out)
        .await;
        // Sent again, and closed unanswered again: no stale connection but an upstream that
        // fails, counted against its health like a reset and not sent a third time (audit
        // NA 2: one that closed every GET stayed in rotation, each request sent twice).
        if let Err(GatewayError::UpstreamRefused {
            upstream,
            unanswered: true,
            ..
        }) = &mut result
        {
            if sent_again {
                result = Err(GatewayError::UpstreamError {
                    upstream: std::mem::take(upstream),
                    reason: "closed its connection without answering the request, and again \
                             when it was sent again"
                        .to_owned(),
                });
            }
        }
        note(
            metrics,
            budget,
            entry,
            (probe.as_ref(), began),
            record,
            index,
            &result,
        );
        let need = template
            .expected_ttft(&entry.upstream)
            .max(budget.min_useful);
        match result {
            Err(GatewayError::UpstreamRefused { .. })
                if !sent_again && budget.usable(Instant::now()) >= need =>
            {
                metrics.retry(&route.name, &entry.upstream.name, "refused");
                sent_again = true;
            }
            result => return result,
        }
    }
}

fn note(
    metrics: &Metrics,
    budget: &Budget,
    entry: &ChainEntry,
    // The attempt's probe turn, and the ejection it began under.
    (probe, began): (Option<&Probe<'_>>, Since),
    record: &mut RequestRecord,
    index: usize,
    result: &Result<Started, GatewayError>,
) {
    let upstream = &entry.upstream;
    let verdict = verdict(result, budget);
    let change = upstream
        .health
        .report(verdict, Instant::now(), probe, began);
    // An upstream a reload replaced still hears from the attempts it had begun, but its
    // name's series belong to the upstream now serving.
    match change.filter(|_| !upstream.is_retired()) {
        Some(Change::Ejected) => {
            // How the attempt that ejected it failed: a key at its rate limit (`status_429`)
            // and a provider down (`connect_timeout`, `status_5xx`) otherwise look alike
            // (audit SC 5).
            let reason = match verdict {
                Verdict::Failed(how) => how,
                _ => "other",
            };
            tracing::warn!(
                upstream = &*upstream.name,
                reason,
                "upstream out of rotation for {}ms after {} failed attempts in a row (the last: {})",
                upstream.config.ejection.duration.as_millis(),
                upstream.config.ejection.after,
                reason,
            );
            metrics.ejection(&upstream.name);
        }
        Some(Change::Restored) => {
            tracing::info!(upstream = &*upstream.name, "upstream back in rotation");
            metrics.set_ejected(&upstream.name, false);
        }
        None => {}
    }
    let outcome = result.as_ref().map(answer_outcome);
    record.attempt(entry, index, outcome);
}

/// An answer as the request log's `attempts` names it.
fn answer_outcome(s: &Started) -> &'static str {
    if s.error_event.is_some() {
        "error_event"
    } else if s.response.status().is_success() {
        "ok"
    } else {
        match status_cause(s.response.status()) {
            Some(RetryCause::Status429) => "status_429",
            Some(_) => "status_5xx",
            None => "status_4xx",
        }
    }
}

#[cfg(test)]
mod tests;
