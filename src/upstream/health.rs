//! Passive health: an upstream whose attempts keep failing is taken out of rotation, so that
//! the requests of a route with fallbacks stop spending their budgets on it (a connect that
//! hangs, a first token that never comes) before reaching an upstream that answers.
//!
//! After `eject_after` failed attempts in a row the upstream is ejected for `eject_for`.
//! Then one attempt at a time is let through as a probe: its success puts the upstream back,
//! its failure ejects it again. The probe holds its turn for as long as it may wait (a
//! first token slower than `eject_for` is no reason for a second probe beside it), and only
//! its own report ends the turn: an attempt that began before the ejection and fails late
//! restarts the ejection's wait without freeing the probe's turn, and one that answers late
//! says nothing (it tells of the upstream before it failed: under load some attempt in flight
//! always succeeds, and ended every ejection within 200 ms, audit GD F1). Only an attempt
//! begun during the ejection, the probe or one tried because nothing else was left, puts it
//! back. An ejected upstream is only ever passed over for another one
//! in rotation: the routes decide that (`gateway::retry`), and where no other is left they
//! try it anyway, so ejection changes the order of attempts and never refuses a request.
//!
//! Only what an attempt shows of the upstream counts: a failure is a connect that failed or
//! hung, a first token that did not come in time, a reset before the answer, a 5xx or 429
//! answer (or the provider's error event of that kind in place of output). A client that
//! left, a budget spent or a stream cut later say nothing of it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

use crate::config::Ejection;

/// What an attempt showed of the upstream's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    /// Failed, and how, in the words of the request log's `attempts` (`status_429`,
    /// `connect_timeout`, ...): shown with the ejection, since a rate limit and an outage
    /// otherwise look alike.
    Failed(&'static str),
    /// Said nothing either way (the client left, the budget ran out): a probe's turn is
    /// handed on.
    Neither,
}

/// A change of the upstream's state, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Ejected,
    Restored,
}

#[derive(Debug)]
pub struct Health {
    policy: Ejection,
    /// Failed attempts in a row.
    fails: AtomicU32,
    /// Out of rotation: ejected, or back on probation until a probe succeeds. Read without
    /// the lock, so that a healthy upstream costs a load per attempt.
    out: AtomicBool,
    /// Ejections so far: an attempt notes it when it begins ([`Health::since`]). Written
    /// under the lock.
    ejections: AtomicU64,
    timing: Mutex<Timing>,
}

/// The ejection an attempt began under, taken when it starts: an answer of one begun before
/// the upstream was ejected does not put it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Since(u64);

#[derive(Debug, Default)]
struct Timing {
    /// When the ejection ends and a probe may go.
    until: Option<Instant>,
    /// The probe in flight, if any.
    probe: Option<Turn>,
    /// Turns given so far, which tell one probe's from the next.
    turns: u64,
    /// How the last failed attempt failed.
    last_failure: Option<&'static str>,
}

/// A probe's turn: which one, and when it lapses should its guard never drop (a request that
/// hangs past every limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Turn {
    id: u64,
    lapse: Instant,
}

/// A turn lasts this much past the probe's longest wait: a timer on a busy machine fires late,
/// and the probe reports a moment after its wait ends.
const LAPSE_GRACE: Duration = Duration::from_secs(1);

impl Timing {
    /// The ejection is over and no probe holds the turn.
    fn may_probe(&self, now: Instant) -> bool {
        self.until.is_none_or(|u| now >= u) && self.probing(now).is_none()
    }

    fn probing(&self, now: Instant) -> Option<Turn> {
        self.probe.filter(|t| now < t.lapse)
    }

    /// Ends the turn of `probe`, and only its: a later probe may hold the turn now.
    fn end(&mut self, probe: &Probe<'_>) {
        if self.probe.is_some_and(|t| t.id == probe.id) {
            self.probe = None;
        }
    }
}

impl Health {
    pub fn new(policy: Ejection) -> Self {
        Self {
            policy,
            fails: AtomicU32::new(0),
            out: AtomicBool::new(false),
            ejections: AtomicU64::new(0),
            timing: Mutex::new(Timing::default()),
        }
    }

    fn timing(&self) -> std::sync::MutexGuard<'_, Timing> {
        // Only plain fields are written under the lock: a panic cannot leave them torn.
        self.timing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What an attempt judged now reports with: read when the attempt is judged (in rotation,
    /// its probe, or tried because nothing else is), before any wait. An attempt judged in
    /// rotation that starts after a `Retry-After` wait inside an ejection tells of the
    /// upstream before that ejection, and does not end it (audit SC 1).
    pub fn since(&self) -> Since {
        Since(self.ejections.load(Ordering::Relaxed))
    }

    /// Whether an attempt here would be made now: in rotation, or ejected long enough that
    /// a probe may go and none is in flight.
    pub fn available(&self, now: Instant) -> bool {
        if !self.out.load(Ordering::Relaxed) {
            return true;
        }
        self.timing().may_probe(now)
    }

    /// An attempt is being made that may wait up to `longest` for its answer (its connect
    /// and first-token limits, or what is left of its budget): if the upstream is out of
    /// rotation and a probe may go, this attempt is it, for as long as the returned guard is
    /// held. Dropped before the attempt reported (its client left, it lost a hedge), the
    /// guard hands the turn to the next request.
    pub fn attempt(&self, now: Instant, longest: Duration) -> Option<Probe<'_>> {
        if !self.out.load(Ordering::Relaxed) {
            return None;
        }
        let mut t = self.timing();
        if t.may_probe(now) {
            // A lapse as well, should a guard never drop: after the probe's longest wait
            // (it has reported by then), and never sooner than the old ejection's length.
            let lapse = now
                + self
                    .policy
                    .duration
                    .max(longest.saturating_add(LAPSE_GRACE));
            t.turns += 1;
            let id = t.turns;
            t.probe = Some(Turn { id, lapse });
            return Some(Probe { health: self, id });
        }
        None
    }

    /// What an attempt here showed; `by` is its probe's turn, if it was the probe, and
    /// `began` what [`Health::since`] said when it started. Returns the change it made, if any.
    pub fn report(
        &self,
        verdict: Verdict,
        now: Instant,
        by: Option<&Probe<'_>>,
        began: Since,
    ) -> Option<Change> {
        debug_assert!(by.is_none_or(|p| std::ptr::eq(p.health, self)));
        match verdict {
            Verdict::Healthy => {
                if !self.out.load(Ordering::Relaxed) {
                    if self.fails.load(Ordering::Relaxed) != 0 {
                        self.fails.store(0, Ordering::Relaxed);
                    }
                    return None;
                }
                let mut t = self.timing();
                // Begun before this ejection: its answer is older news than the failures.
                // (The probe began during it: its turn is claimed only while out.)
                if self.out.load(Ordering::Relaxed) && began != self.since() {
                    return None;
                }
                self.fails.store(0, Ordering::Relaxed);
                // Checked again under the lock: one change per ejection, whoever reports.
                if !self.out.swap(false, Ordering::Relaxed) {
                    return None;
                }
                // `turns` stays: a guard still held must not match a later ejection's probe.
                t.until = None;
                t.probe = None;
                Some(Change::Restored)
            }
            Verdict::Failed(how) => {
                let n = self.fails.fetch_add(1, Ordering::Relaxed).saturating_add(1);
                let mut t = self.timing();
                t.last_failure = Some(how);
                // Counted all the same (`/upstreams` shows it), but 0 never ejects.
                if self.policy.after == 0 {
                    return None;
                }
                let out = self.out.load(Ordering::Relaxed);
                if !out && n < self.policy.after {
                    return None;
                }
                // Out already: a failed probe (or an attempt that began before the ejection)
                // starts the wait again. Only the probe's own failure ends its turn: a probe
                // still waiting has yet to say what it found.
                t.until = Some(now + self.policy.duration);
                if let Some(probe) = by {
                    t.end(probe);
                }
                if self.out.swap(true, Ordering::Relaxed) {
                    return None;
                }
                self.ejections.fetch_add(1, Ordering::Relaxed);
                Some(Change::Ejected)
            }
            // A probe that says nothing hands its turn on when its guard drops.
            Verdict::Neither => None,
        }
    }

    /// Whether the upstream is out of rotation: ejected, or waiting for a probe to succeed.
    pub fn is_out(&self) -> bool {
        self.out.load(Ordering::Relaxed)
    }

    /// The state as the admin listener shows it.
    pub fn view(&self, now: Instant) -> HealthView {
        let out = self.is_out();
        let failures_in_a_row = self.fails.load(Ordering::Relaxed);
        let t = self.timing();
        let (ejected_for, probing) = if out {
            (
                t.until.map(|u| u.saturating_duration_since(now)),
                t.probing(now).is_some(),
            )
        } else {
            (None, false)
        };
        HealthView {
            in_rotation: !out,
            failures_in_a_row,
            ejected_for,
            probing,
            // Of the failures that count now: a success ends the run (without the lock).
            last_failure: t.last_failure.filter(|_| out || failures_in_a_row > 0),
        }
    }
}

/// The turn of the one attempt that probes an upstream out of rotation (see
/// [`Health::attempt`]).
#[derive(Debug)]
pub struct Probe<'a> {
    health: &'a Health,
    id: u64,
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        // Only this probe's own turn: a report may have ended it, and a later probe begun.
        self.health.timing().end(self);
    }
}

/// An upstream's health at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthView {
    pub in_rotation: bool,
    pub failures_in_a_row: u32,
    /// Out of rotation: what is left of the ejection (zero once a probe may go).
    pub ejected_for: Option<std::time::Duration>,
    /// A probe is in flight.
    pub probing: bool,
    /// How the last of the failures in a row (or that ejected it) failed.
    pub last_failure: Option<&'static str>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn health(after: u32) -> Health {
        Health::new(Ejection {
            after,
            duration: Duration::from_secs(10),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn failures_in_a_row_eject_and_a_success_between_them_forgives() {
        let h = health(3);
        let now = Instant::now();
        assert_eq!(
            h.report(Verdict::Failed("status_5xx"), now, None, h.since()),
            None
        );
        assert_eq!(
            h.report(Verdict::Failed("status_5xx"), now, None, h.since()),
            None
        );
        assert_eq!(h.report(Verdict::Healthy, now, None, h.since()), None);
        assert_eq!(
            h.report(Verdict::Failed("status_5xx"), now, None, h.since()),
            None
        );
        assert_eq!(
            h.report(Verdict::Failed("status_5xx"), now, None, h.since()),
            None
        );
        assert!(h.available(now));
        assert_eq!(
            h.report(Verdict::Failed("status_5xx"), now, None, h.since()),
            Some(Change::Ejected)
        );
        assert!(!h.available(now));
        assert_eq!(
            h.view(now + Duration::from_secs(4)),
            HealthView {
                in_rotation: false,
                failures_in_a_row: 3,
                ejected_for: Some(Duration::from_secs(6)),
                probing: false,
                last_failure: Some("status_5xx"),
            }
        );
        // More failures while out (attempts that began before) do not eject twice.
        assert_eq!(
            h.report(Verdict::Failed("status_5xx"), now, None, h.since()),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_probe_at_a_time_after_the_ejection() {
        let h = health(1);
        let t0 = Instant::now();
        assert_eq!(
            h.report(Verdict::Failed("status_5xx"), t0, None, h.since()),
            Some(Change::Ejected)
        );
        let later = t0 + Duration::from_secs(10);
        assert!(!h.available(later - Duration::from_millis(1)));
        assert!(h.available(later));
        let probe = h.attempt(later, Duration::ZERO);
        assert!(probe.is_some());
        // The probe is in flight: nobody else goes.
        assert!(!h.available(later));
        assert!(h.view(later).probing);
        assert!(h.attempt(later, Duration::ZERO).is_none());
        assert_eq!(
            h.report(Verdict::Healthy, later, probe.as_ref(), h.since()),
            Some(Change::Restored)
        );
        drop(probe);
        assert!(h.available(later));
        assert!(!h.is_out());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_ejects_again_for_the_whole_time() {
        let h = health(2);
        let t0 = Instant::now();
        h.report(Verdict::Failed("status_5xx"), t0, None, h.since());
        assert_eq!(
            h.report(Verdict::Failed("status_5xx"), t0, None, h.since()),
            Some(Change::Ejected)
        );
        let t1 = t0 + Duration::from_secs(11);
        let probe = h.attempt(t1, Duration::ZERO);
        // One failure is enough on probation, and it is no new ejection for the counters.
        assert_eq!(
            h.report(Verdict::Failed("status_5xx"), t1, probe.as_ref(), h.since()),
            None
        );
        assert!(!h.available(t1 + Duration::from_secs(9)));
        assert!(h.available(t1 + Duration::from_secs(10)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_dropped_before_it_reports_hands_its_turn_on() {
        let h = health(1);
        let t0 = Instant::now();
        h.report(Verdict::Failed("status_5xx"), t0, None, h.since());
        let t1 = t0 + Duration::from_secs(10);
        let probe = h.attempt(t1, Duration::ZERO);
        assert!(!h.available(t1));
        assert_eq!(h.report(Verdict::Neither, t1, None, h.since()), None);
        assert!(
            !h.available(t1),
            "only the guard ends a probe that said nothing"
        );
        drop(probe);
        assert!(h.available(t1));
        // A guard that outlives its turn does not end the next probe's.
        let stale = h.attempt(t1, Duration::ZERO);
        let t2 = t1 + Duration::from_secs(10);
        assert!(!h.available(t2 - Duration::from_millis(1)));
        assert!(
            h.available(t2),
            "the turn lapses after another ejection's length"
        );
        let next = h.attempt(t2, Duration::ZERO);
        drop(stale);
        assert!(!h.available(t2));
        drop(next);
        assert!(h.available(t2));
    }

    /// A probe waits as long as its limits let it: a first token slower than `eject_for` is
    /// no reason to send a second probe beside the first.
    #[tokio::test(start_paused = true)]
    async fn a_probe_holds_its_turn_for_its_longest_wait() {
        let h = health(1);
        let t0 = Instant::now();
        h.report(Verdict::Failed("status_5xx"), t0, None, h.since());
        let t1 = t0 + Duration::from_secs(10);
        let probe = h.attempt(t1, Duration::from_secs(30));
        assert!(probe.is_some());
        let waiting = t1 + Duration::from_secs(20);
        assert!(h.view(waiting).probing);
        assert!(!h.available(waiting), "a second probe beside the first");
        assert!(h.attempt(waiting, Duration::from_secs(30)).is_none());
        // The probe's first token never came: its failure ejects the upstream again, and the
        // next probe goes after the whole ejection.
        let failed = t1 + Duration::from_secs(30);
        assert_eq!(
            h.report(
                Verdict::Failed("status_5xx"),
                failed,
                probe.as_ref(),
                h.since()
            ),
            None
        );
        assert!(!h.view(failed).probing);
        assert!(!h.available(failed + Duration::from_secs(9)));
        assert!(h.available(failed + Duration::from_secs(10)));
        drop(probe);
        // A guard that never drops (a request hung past every limit) lapses in the end.
        let hung = h.attempt(failed + Duration::from_secs(10), Duration::from_secs(30));
        assert!(hung.is_some());
        let lapsed = failed + Duration::from_secs(10 + 30) + LAPSE_GRACE;
        assert!(!h.available(lapsed - Duration::from_millis(1)));
        assert!(h.available(lapsed));
    }

    /// An attempt that began before the ejection and fails while the probe waits restarts the
    /// ejection's wait; the probe keeps its turn until it reports itself.
    #[tokio::test(start_paused = true)]
    async fn only_the_probe_ends_its_own_turn() {
        let h = health(1);
        let t0 = Instant::now();
        h.report(Verdict::Failed("status_5xx"), t0, None, h.since());
        let t1 = t0 + Duration::from_secs(10);
        let probe = h.attempt(t1, Duration::from_secs(30));
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(
            h.report(Verdict::Failed("status_5xx"), t2, None, h.since()),
            None
        );
        assert!(h.view(t2).probing, "the probe is still in flight");
        let past = t2 + Duration::from_secs(10);
        assert!(
            !h.available(past),
            "a second probe while the first still waits"
        );
        // Its success puts the upstream back, ejection or not.
        assert_eq!(
            h.report(Verdict::Healthy, past, probe.as_ref(), h.since()),
            Some(Change::Restored)
        );
        assert!(h.available(past));
        // Ejected again, a stale guard does not end the new probe's turn.
        assert_eq!(
            h.report(Verdict::Failed("status_5xx"), past, None, h.since()),
            Some(Change::Ejected)
        );
        let t3 = past + Duration::from_secs(10);
        let next = h.attempt(t3, Duration::from_secs(30));
        assert!(next.is_some());
        drop(probe);
        assert!(h.view(t3).probing);
        assert!(!h.available(t3));
        drop(next);
        assert!(h.available(t3));
    }

    /// An attempt begun before the ejection that answers during it tells of the upstream
    /// before its failures: it ends nothing. Under load some attempt in flight always
    /// answered, and every ejection ended within 200 ms (audit GD F1).
    #[tokio::test(start_paused = true)]
    async fn an_answer_begun_before_the_ejection_does_not_end_it() {
        let h = health(3);
        let t0 = Instant::now();
        let slow = h.since();
        let t1 = t0 + Duration::from_millis(100);
        for _ in 0..2 {
            assert_eq!(
                h.report(Verdict::Failed("status_5xx"), t1, None, h.since()),
                None
            );
        }
        assert_eq!(
            h.report(Verdict::Failed("status_5xx"), t1, None, h.since()),
            Some(Change::Ejected)
        );
        let answered = t0 + Duration::from_secs(1);
        assert_eq!(h.report(Verdict::Healthy, answered, None, slow), None);
        assert_eq!(
            h.view(answered),
            HealthView {
                in_rotation: false,
                failures_in_a_row: 3,
                ejected_for: Some(Duration::from_millis(9100)),
                probing: false,
                last_failure: Some("status_5xx"),
            }
        );
        assert!(!h.available(answered));
        // The probe, once `eject_for` is over, puts it back.
        let due = t1 + Duration::from_secs(10);
        let probe = h.attempt(due, Duration::from_secs(30));
        assert!(probe.is_some());
        let began = h.since();
        assert_eq!(
            h.report(Verdict::Healthy, due, probe.as_ref(), began),
            Some(Change::Restored)
        );
        assert!(!h.is_out());
        assert_eq!(h.view(due).failures_in_a_row, 0);
    }

    /// With nothing else in rotation the upstream is tried all the same: such an attempt
    /// began during the ejection, and its answer puts the upstream back. One begun during an
    /// earlier ejection does not end the next.
    #[tokio::test(start_paused = true)]
    async fn an_answer_begun_during_the_ejection_ends_it() {
        let h = health(1);
        let t0 = Instant::now();
        assert_eq!(
            h.report(Verdict::Failed("status_5xx"), t0, None, h.since()),
            Some(Change::Ejected)
        );
        let tried = h.since();
        let earlier = h.since();
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(
            h.report(Verdict::Healthy, t1, None, tried),
            Some(Change::Restored)
        );
        assert_eq!(
            h.report(Verdict::Failed("status_5xx"), t1, None, h.since()),
            Some(Change::Ejected)
        );
        assert_eq!(h.report(Verdict::Healthy, t1, None, earlier), None);
        assert!(h.is_out());
    }

    #[tokio::test(start_paused = true)]
    async fn zero_never_ejects_but_still_counts() {
        let h = health(0);
        let now = Instant::now();
        for _ in 0..100 {
            assert_eq!(
                h.report(Verdict::Failed("status_5xx"), now, None, h.since()),
                None
            );
        }
        assert!(h.available(now));
        assert_eq!(h.view(now).failures_in_a_row, 100);
    }
}
