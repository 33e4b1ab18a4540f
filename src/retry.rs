//! Retries, fallbacks and hedging that spend one budget. Before each attempt the remaining
//! budget must fit what an attempt on that upstream is expected to take (its learned time to
//! first token, at least `min_useful`); an attempt that does not fit is not made. Nothing is
//! retried once a byte reached the client (a route that may switch holds the head until the
//! first data event), and nothing at all after the client left (dropping the handler drops
//! every attempt in flight).

use std::time::Duration;

use http::StatusCode;
use tokio::time::{sleep, sleep_until, Instant};

use crate::attempt::{Attempt, Failed, Started};
use crate::budget::Budget;
use crate::config::RetryCause;
use crate::error::GatewayError;
use crate::metrics::InFlight;
use crate::outcome::RequestRecord;
use crate::policy::{backoff, retry_after};
use crate::proxy::{ChainEntry, Gateway, RouteRuntime, Template};

/// The last thing an attempt produced, returned when no further attempt is made.
enum Last {
    None,
    /// An upstream answer with a retryable status (kept to pass through unchanged).
    Answer(Box<Started>, RetryCause),
    Error(GatewayError),
}

pub async fn run(
    gw: &Gateway,
    route: &RouteRuntime,
    template: &Template,
    budget: &Budget,
    record: &mut RequestRecord,
) -> Result<Started, GatewayError> {
    let policy = &route.route.policy;
    let mut last = Last::None;
    let mut previous: Option<usize> = None;
    let mut skip_hedge_target = false;
    for (i, entry) in route.chain.iter().enumerate() {
        if i == 1 && skip_hedge_target {
            continue;
        }
        for n in 0..=policy.retries {
            let now = Instant::now();
            let need = entry.upstream.ttft.get().max(budget.min_useful);
            let mut wait = Duration::ZERO;
            if n > 0 {
                let cause = match &last {
                    Last::Answer(started, cause) => {
                        wait = retry_after(started.response.headers()).unwrap_or_default();
                        Some(*cause)
                    }
                    Last::Error(_) => None,
                    Last::None => None,
                };
                wait = wait.max(backoff(n));
                if let Some(c) = cause {
                    tracing::debug!(reason = c.as_str(), ?wait, "retrying");
                }
            }
            if budget.usable(now) < need + wait {
                // Retry-After, backoff or the estimate does not fit: on to the next upstream.
                break;
            }
            if !wait.is_zero() {
                sleep(wait).await;
            }
            // The attempt is made: what it replaces is dropped (and so cancelled) now.
            let last_cause = match std::mem::replace(&mut last, Last::None) {
                Last::Answer(_, c) => Some(c),
                Last::Error(e) => error_cause(&e),
                Last::None => None,
            };
            if n > 0 {
                gw.metrics.retry(
                    &route.name,
                    &entry.upstream.name,
                    last_cause.map_or("other", RetryCause::as_str),
                );
            } else if let Some(p) = previous {
                gw.metrics.fallback(
                    &route.name,
                    &route.chain[p].upstream.name,
                    &entry.upstream.name,
                );
            }
            previous = Some(i);
            let outcome =
                if i == 0 && n == 0 && policy.hedge_after.is_some() && route.chain.len() > 1 {
                    // Boxed: a hedge holds two attempts, and inline it would more than
                    // double the size of every request's future, which is moved whole
                    // (memcpy) several times per request on routes that never hedge.
                    let (outcome, hedged) =
                        Box::pin(hedge(gw, route, template, budget, record)).await;
                    skip_hedge_target = hedged;
                    outcome
                } else {
                    let next = route.chain.get(i + 1).filter(|_| n == policy.retries);
                    let ft = first_token_limit(budget, next);
                    single(route, entry, template, budget, record, ft)
                        .await
                        .map(|s| (s, i))
                };
            match outcome {
                Ok((started, winner)) => {
                    let status = started.response.status();
                    if let Some(cause) =
                        status_cause(status).filter(|c| policy.retry_on.contains(*c))
                    {
                        last = Last::Answer(Box::new(started), cause);
                        continue;
                    }
                    record.set_upstream(&route.chain[winner], &started);
                    if let Some(at) = started.first_token_at {
                        crate::watchdog::Observer::first_token(record, at);
                    }
                    return Ok(started);
                }
                Err(error) => {
                    let retryable =
                        error_cause(&error).is_some_and(|c| policy.retry_on.contains(c));
                    if !retryable {
                        return Err(error);
                    }
                    last = Last::Error(error);
                }
            }
        }
    }
    match last {
        Last::Answer(started, _) => {
            // No attempt was left to make: the upstream's own answer passes through.
            let entry = route
                .chain
                .iter()
                .find(|e| e.upstream.name == started.limits.upstream)
                .unwrap_or(&route.chain[0]);
            record.set_upstream(entry, &started);
            Ok(*started)
        }
        Last::Error(e) => Err(e),
        Last::None => {
            let now = Instant::now();
            Err(GatewayError::InsufficientBudget {
                remaining: budget.deadline.saturating_duration_since(now),
                reserve: budget.reserve,
                min_useful: route.chain[0].upstream.ttft.get().max(budget.min_useful),
                // Spent on attempts (or on waiting): a new request gets a new budget.
                whole: false,
            })
        }
    }
}

/// Time the switch itself takes (timer wake-up, dropping the loser, building the next
/// request), kept on top of the fallback's estimate so that the fallback still fits when the
/// shortened limit fires.
const SWITCH_SLACK: Duration = Duration::from_millis(50);

/// The first-token limit of an attempt: the route's, shortened (when a fallback follows) so
/// that what remains still fits an attempt on that fallback.
fn first_token_limit(budget: &Budget, next: Option<&ChainEntry>) -> Duration {
    let ft = budget.first_token_timeout;
    let Some(next) = next else { return ft };
    let usable = budget.usable(Instant::now());
    let room = next.upstream.ttft.get().max(budget.min_useful) + SWITCH_SLACK;
    match usable.checked_sub(room) {
        Some(left) if left >= budget.min_useful => ft.min(left),
        _ => ft,
    }
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
        GatewayError::ConnectTimeout { .. } | GatewayError::UpstreamUnavailable { .. } => {
            Some(RetryCause::Connect)
        }
        GatewayError::FirstTokenTimeout { .. } => Some(RetryCause::FirstToken),
        GatewayError::UpstreamError { .. } => Some(RetryCause::Reset),
        _ => None,
    }
}

fn attempt<'a>(
    entry: &'a ChainEntry,
    route: &RouteRuntime,
    budget: &'a Budget,
    first_token_timeout: Duration,
) -> Attempt<'a> {
    Attempt {
        upstream: &entry.upstream,
        budget,
        first_token_timeout,
        hold: route.route.policy.holds_head(),
        in_flight: InFlight::new(&entry.in_flight),
    }
}

/// One attempt, noted in the record; a first-token failure also teaches the upstream's
/// estimate that its first token takes at least that long.
async fn single(
    route: &RouteRuntime,
    entry: &ChainEntry,
    template: &Template,
    budget: &Budget,
    record: &mut RequestRecord,
    first_token_timeout: Duration,
) -> Result<Started, GatewayError> {
    let started = Instant::now();
    let req = template.request_for(&entry.upstream)?;
    let result = attempt(entry, route, budget, first_token_timeout)
        .run(req)
        .await;
    note(entry, record, started, &result);
    result.map_err(|f| f.error)
}

fn note(
    entry: &ChainEntry,
    record: &mut RequestRecord,
    started: Instant,
    result: &Result<Started, Failed>,
) {
    let outcome = match result {
        Ok(s) if s.response.status().is_success() => "ok",
        Ok(s) => match status_cause(s.response.status()) {
            Some(RetryCause::Status429) => "status_429",
            Some(_) => "status_5xx",
            None => "status_4xx",
        },
        Err(f) => {
            if let GatewayError::FirstTokenTimeout { after, .. } = f.error {
                entry.upstream.ttft.observe(after);
            }
            f.error.code()
        }
    };
    record.attempt(&entry.upstream.name, outcome, started);
}

/// The first attempt of a hedged route: if it has produced no token by `hedge_after` and the
/// budget fits an attempt on the first fallback, that one starts in parallel; the first to
/// produce a data event wins and the other is dropped, which cancels it upstream. Returns the
/// outcome (with the winner's chain index) and whether the fallback was started.
async fn hedge(
    gw: &Gateway,
    route: &RouteRuntime,
    template: &Template,
    budget: &Budget,
    record: &mut RequestRecord,
) -> (Result<(Started, usize), GatewayError>, bool) {
    let hedge_after = route.route.policy.hedge_after.unwrap_or_default();
    let (primary_entry, hedge_entry) = (&route.chain[0], &route.chain[1]);
    let t0 = Instant::now();
    let req = match template.request_for(&primary_entry.upstream) {
        Ok(r) => r,
        Err(e) => return (Err(e), false),
    };
    let primary = attempt(primary_entry, route, budget, budget.first_token_timeout).run(req);
    tokio::pin!(primary);
    let fire = sleep_until(t0 + hedge_after);
    tokio::pin!(fire);
    tokio::select! {
        biased;
        r = &mut primary => {
            note(primary_entry, record, t0, &r);
            return (r.map(|s| (s, 0)).map_err(|f| f.error), false);
        }
        () = &mut fire => {}
    }
    let need = hedge_entry.upstream.ttft.get().max(budget.min_useful);
    let hreq = match template.request_for(&hedge_entry.upstream) {
        Ok(r) if budget.usable(Instant::now()) >= need => r,
        _ => {
            let r = primary.await;
            note(primary_entry, record, t0, &r);
            return (r.map(|s| (s, 0)).map_err(|f| f.error), false);
        }
    };
    let t1 = Instant::now();
    let hedged = attempt(hedge_entry, route, budget, budget.first_token_timeout).run(hreq);
    tokio::pin!(hedged);
    let policy = &route.route.policy;
    // An answer with a status the route would retry on is a failure here, not a win.
    let wins = |r: &Result<Started, Failed>| match r {
        Ok(s) => !status_cause(s.response.status()).is_some_and(|c| policy.retry_on.contains(c)),
        Err(_) => false,
    };
    let mut primary_done: Option<Result<Started, Failed>> = None;
    let mut hedge_done: Option<Result<Started, Failed>> = None;
    loop {
        tokio::select! {
            r = &mut primary, if primary_done.is_none() => {
                note(primary_entry, record, t0, &r);
                if wins(&r) {
                    if hedge_done.is_none() {
                        record.attempt(&hedge_entry.upstream.name, "hedge_loser", t1);
                        record.hedge_loser();
                    }
                    gw.metrics.hedge(&route.name, "primary");
                    return (r.map(|s| (s, 0)).map_err(|f| f.error), true);
                }
                primary_done = Some(r);
            }
            r = &mut hedged, if hedge_done.is_none() => {
                note(hedge_entry, record, t1, &r);
                if wins(&r) {
                    if primary_done.is_none() {
                        record.attempt(&primary_entry.upstream.name, "hedge_loser", t0);
                        record.hedge_loser();
                    }
                    gw.metrics.hedge(&route.name, "hedge");
                    return (r.map(|s| (s, 1)).map_err(|f| f.error), true);
                }
                hedge_done = Some(r);
            }
        }
        if primary_done.is_some() {
            if let Some(h) = hedge_done.take() {
                // Both failed: the later failure (the hedge's) is what the route goes on from.
                return (h.map(|s| (s, 1)).map_err(|f| f.error), true);
            }
        }
    }
}
