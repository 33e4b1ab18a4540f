//! The race of a hedged route's first attempt: the primary and, once it has no token by
//! `hedge_after`, the next upstream in rotation beside it; the first to produce a data event
//! wins and the other is dropped, which cancels it upstream.

use super::*;

/// Counts a hedge, once both attempts started, by who won when it ends: `none` too when the
/// request ended first (the client left, the shutdown grace ran out), which drops it.
struct HedgeTally<'a> {
    metrics: &'a Metrics,
    route: &'a str,
    winner: &'static str,
}

impl Drop for HedgeTally<'_> {
    fn drop(&mut self) {
        self.metrics.hedge(self.route, self.winner);
    }
}

/// How a hedged first attempt ended (`hedge`).
pub(super) struct Race {
    /// The outcome, with the winner's chain index.
    pub(super) outcome: Result<(Started, usize), GatewayError>,
    /// The chain indices raced beside the primary in the order they started (none if no
    /// hedge was started).
    pub(super) raced: Vec<usize>,
    /// The primary's own failure, when the outcome is not the primary's.
    pub(super) primary: Option<Own>,
}

/// The first attempt of a hedged route: if it has produced no token by `hedge_after` and the
/// budget fits an attempt on the next upstream of the chain in rotation then, that one starts
/// in parallel; the first to produce a data event wins and the other is dropped, which
/// cancels it upstream. A hedge that fails while the primary runs hands the race on to the
/// next upstream in rotation that fits. An upstream answer a racer failed with that is not
/// the outcome goes to `kept` (audit VA 1: a hedge's 429 was lost for the 504 of a primary
/// that hung to the deadline).
#[allow(clippy::too_many_arguments)]
pub(super) async fn hedge(
    metrics: &Metrics,
    route: &RouteRuntime,
    chain: Order<'_>,
    template: &Template,
    budget: &Budget,
    record: &mut RequestRecord,
    first_token_timeout: Duration,
    switch_by: Option<SwitchBy>,
    kept: &mut Kept<'_>,
) -> Race {
    let alone = |outcome: Result<Started, GatewayError>| Race {
        outcome: outcome.map(|s| (s, 0)),
        raced: Vec::new(),
        primary: None,
    };
    let hedge_after = route.route.policy.hedge_after.unwrap_or_default();
    let primary_entry = &chain[0];
    let t0 = Instant::now();
    let req = match template.request_for(&primary_entry.upstream) {
        Ok(out) => out,
        Err(e) => return alone(Err(e)),
    };
    let i0 = record.attempt_started(primary_entry, t0, true);
    let began0 = primary_entry.upstream.health.since();
    // Neither attempt's probe turn outlives this race: a loser's is handed on.
    let probe = primary_entry
        .upstream
        .health
        .attempt(t0, longest_wait(budget, t0));
    let primary = attempt(
        primary_entry,
        route,
        template,
        budget,
        first_token_timeout,
        switch_by,
    )
    .run(req);
    tokio::pin!(primary);
    let fire = sleep_until(t0 + hedge_after);
    tokio::pin!(fire);
    tokio::select! {
        biased;
        r = &mut primary => {
            note(metrics, budget, primary_entry, (probe.as_ref(), began0), record, i0, &r);
            return alone(r);
        }
        () = &mut fire => {}
    }
    // The target is judged now, not when the request began: an upstream back in rotation
    // (or due for its probe) since then is raced (audit Y2: a request begun during the
    // fallback's probe waited its primary's whole first-token limit). Out of rotation, it is
    // raced only as its probe. The turn is claimed last, by a hedge that will be sent: one
    // that does not fit would hold it while its primary runs, and keep the upstream from the
    // request that would probe it.
    let now = Instant::now();
    let to = (1..route.chain.len()).find(|&k| chain[k].upstream.health.available(now));
    let mut throttled = false;
    let sent = to.and_then(|to| {
        let upstream = &chain[to].upstream;
        let need = template.expected_ttft(upstream).max(budget.min_useful);
        if budget.usable(now) < need {
            return None;
        }
        // The route's share of hedges: of its requests, and of its requests in flight until
        // the race ends. Past it, the primary's usual latency is past `hedge_after`, and a
        // hedge would double the load for nothing (audit GD 4: 1962 of 2000 requests
        // hedged, 28% less throughput; MF 2: with a fast fallback, the races at once alone
        // still let 59% be hedged).
        let requests = usize::try_from(route.metrics.in_flight.get()).unwrap_or(0);
        let Some(share) = route.hedges.take(requests) else {
            throttled = true;
            return None;
        };
        let r = template.request_for(upstream).ok()?;
        let health = &upstream.health;
        let probe = health.attempt(now, longest_wait(budget, now));
        (probe.is_some() || !health.is_out()).then_some((to, r, probe, share))
    });
    if throttled {
        record.throttled(Throttled::HedgeBudget);
    }
    let Some((to, hreq, hedge_probe, _share)) = sent else {
        let r = primary.await;
        note(
            metrics,
            budget,
            primary_entry,
            (probe.as_ref(), began0),
            record,
            i0,
            &r,
        );
        return alone(r);
    };
    let mut tally = HedgeTally {
        metrics,
        route: &route.name,
        winner: "none",
    };
    // The attempt racing the primary: the hedge, then, each time it fails in a way the chain
    // moves on from, the next upstream in rotation. The request is past `hedge_after`, and
    // the primary keeps the route's whole limit (it was raced, not waited for): waiting on it
    // alone after a hedge lost in a millisecond spent the budget of the whole chain on it
    // (audit MF 1: a -> b -> c, a hung, b's 503 at once, 504 where no hedge gave c's 200).
    // One share of hedges covers the race: after the hedge, each is a fallback's turn.
    let mut racer = Racer::start(chain, to, record, hedge_probe);
    let mut raced = vec![to];
    let hedged = attempt(
        &chain[to],
        route,
        template,
        budget,
        budget.first_token_timeout,
        None,
    )
    .run(hreq);
    tokio::pin!(hedged);
    let policy = &route.route.policy;
    // An answer with a status the route would retry on is a failure here, not a win.
    let wins = |r: &Result<Started, GatewayError>| match r {
        Ok(s) => !answer_cause(s).is_some_and(|c| policy.retry_on.contains(c)),
        Err(_) => false,
    };
    // The primary failed while a racer runs.
    let mut primary_done = false;
    let mut primary_own = None;
    // The last racer failed while the primary runs.
    let mut racer_done = false;
    // A failure that is not the outcome is dropped, but an upstream answer's copy is kept,
    // as along the chain (`Kept::keep`). Kept while the other attempt waits unpolled: an
    // error body comes with its head, and the wait is 100 ms at most.
    let outcome = loop {
        tokio::select! {
            r = &mut primary, if !primary_done => {
                note(metrics, budget, primary_entry, (probe.as_ref(), began0), record, i0, &r);
                if wins(&r) {
                    if !racer_done {
                        record.attempt(&chain[racer.to], racer.index, Ok("hedge_loser"));
                        record.hedge_loser();
                    }
                    tally.winner = "primary";
                    break r.map(|s| (s, 0));
                }
                // Both failed: the later failure is what passes through if nothing follows;
                // a retry of the primary goes on from the primary's own.
                if racer_done {
                    break r.map(|s| (s, 0));
                }
                primary_own = Some(Own::of(r.as_ref()));
                primary_done = true;
                kept.keep(r).await;
            }
            r = &mut hedged, if !racer_done => {
                let entry = &chain[racer.to];
                note(metrics, budget, entry, (racer.probe.as_ref(), racer.began), record, racer.index, &r);
                if wins(&r) {
                    if !primary_done {
                        record.attempt(primary_entry, i0, Ok("hedge_loser"));
                        record.hedge_loser();
                    }
                    tally.winner = "hedge";
                    break r.map(|s| (s, racer.to));
                }
                // With the primary failed too, nothing races any more: the chain goes on
                // from here as after any attempt.
                if primary_done {
                    break r.map(|s| (s, racer.to));
                }
                // A failure the chain moves on from hands the race to the next upstream, if
                // an attempt on it fits what is left; any other, or none left, leaves the
                // primary to run alone.
                let moves_on = match &r {
                    Ok(_) => true,
                    Err(e) => error_cause(e).is_some_and(|c| policy.retry_on.contains(c)),
                };
                let next = moves_on
                    .then(|| next_racer(route, chain, racer.to, template, budget))
                    .flatten();
                let Some((to, req, next_probe)) = next else {
                    racer_done = true;
                    kept.keep(r).await;
                    continue;
                };
                metrics.fallback(&route.name, &entry.upstream.name, &chain[to].upstream.name);
                kept.keep(r).await;
                racer = Racer::start(chain, to, record, next_probe);
                raced.push(to);
                hedged.set(
                    attempt(&chain[to], route, template, budget, budget.first_token_timeout, None).run(req),
                );
            }
        }
    };
    Race {
        outcome,
        raced,
        primary: primary_own,
    }
}

/// The attempt racing a hedged primary: where it sits in the chain and in the record, and
/// what it reports its upstream's health under.
struct Racer<'a> {
    to: usize,
    index: usize,
    began: Since,
    // Held until the attempt has reported, or dropped with it.
    probe: Option<Probe<'a>>,
}

impl<'a> Racer<'a> {
    fn start(
        chain: Order<'a>,
        to: usize,
        record: &mut RequestRecord,
        probe: Option<Probe<'a>>,
    ) -> Self {
        let entry = &chain[to];
        // Beside the primary, which the log keeps naming until one of them answers.
        let index = record.attempt_started(entry, Instant::now(), false);
        Racer {
            to,
            index,
            began: entry.upstream.health.since(),
            probe,
        }
    }
}

/// The upstream a race goes on to once the racer at `after` failed: the next of the chain in
/// rotation now (or due for its probe, which it claims), when an attempt on it fits the budget
/// and its head the client's patience, as any fallback's must; with its request.
fn next_racer<'a>(
    route: &RouteRuntime,
    chain: Order<'a>,
    after: usize,
    template: &Template,
    budget: &Budget,
) -> Option<(usize, crate::gateway::template::Outgoing, Option<Probe<'a>>)> {
    let now = Instant::now();
    let to = (after + 1..route.chain.len()).find(|&k| chain[k].upstream.health.available(now))?;
    let upstream = &chain.get(to)?.upstream;
    let need = template.expected_ttft(upstream).max(budget.min_useful);
    if budget.usable(now) < need || budget.head_by().is_some_and(|by| now + need > by) {
        return None;
    }
    let req = template.request_for(upstream).ok()?;
    let health = &upstream.health;
    let probe = health.attempt(now, longest_wait(budget, now));
    (probe.is_some() || !health.is_out()).then_some((to, req, probe))
}
