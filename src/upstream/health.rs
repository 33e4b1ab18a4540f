//! Passive health: an upstream whose attempts keep failing is taken out of rotation, so that
//! the requests of a route with fallbacks stop spending their budgets on it (a connect that
//! hangs, a first token that never comes) before reaching an upstream that answers.
//!
//! After `eject_after` failed attempts in a row the upstream is ejected for `eject_for`.
//! Then one attempt at a time is let through as a probe: its success puts the upstream back,
//! its failure ejects it again. An ejected upstream is only ever passed over for another one
//! in rotation: the routes decide that (`gateway::retry`), and where no other is left they
//! try it anyway, so ejection changes the order of attempts and never refuses a request.
//!
//! Only what an attempt shows of the upstream counts: a failure is a connect that failed or
//! hung, a first token that did not come in time, a reset before the answer, a 5xx or 429
//! answer (or the provider's error event of that kind in place of output). A client that
//! left, a budget spent or a stream cut later say nothing of it.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use tokio::time::Instant;

use crate::config::Ejection;

/// What an attempt showed of the upstream's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    Failed,
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
    timing: Mutex<Timing>,
}

#[derive(Debug, Default)]
struct Timing {
    /// When the ejection ends and a probe may go.
    until: Option<Instant>,
    /// A probe in flight, and when its turn lapses if it never reports (its request was
    /// dropped before the attempt ended).
    probe: Option<Instant>,
}

impl Timing {
    /// The ejection is over and no probe holds the turn.
    fn may_probe(&self, now: Instant) -> bool {
        self.until.is_none_or(|u| now >= u) && self.probe.is_none_or(|lapse| now >= lapse)
    }
}

impl Health {
    pub fn new(policy: Ejection) -> Self {
        Self {
            policy,
            fails: AtomicU32::new(0),
            out: AtomicBool::new(false),
            timing: Mutex::new(Timing::default()),
        }
    }

    fn timing(&self) -> std::sync::MutexGuard<'_, Timing> {
        // Only plain fields are written under the lock: a panic cannot leave them torn.
        self.timing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether an attempt here would be made now: in rotation, or ejected long enough that
    /// a probe may go and none is in flight.
    pub fn available(&self, now: Instant) -> bool {
        if !self.out.load(Ordering::Relaxed) {
            return true;
        }
        self.timing().may_probe(now)
    }

    /// An attempt is being made: if the upstream is out of rotation and a probe may go, this
    /// attempt is it, for as long as the returned guard is held. Dropped before the attempt
    /// reported (its client left, it lost a hedge), the guard hands the turn to the next
    /// request.
    pub fn attempt(&self, now: Instant) -> Option<Probe<'_>> {
        if !self.out.load(Ordering::Relaxed) {
            return None;
        }
        let mut t = self.timing();
        if t.may_probe(now) {
            // A lapse as well, should a guard never drop (a request that hangs past every
            // limit): the turn passes on after one more ejection's length.
            let lapse = now + self.policy.duration;
            t.probe = Some(lapse);
            return Some(Probe {
                health: self,
                lapse,
            });
        }
        None
    }

    /// What an attempt here showed. Returns the change it made, if any.
    pub fn report(&self, verdict: Verdict, now: Instant) -> Option<Change> {
        match verdict {
            Verdict::Healthy => {
                if self.fails.load(Ordering::Relaxed) != 0 {
                    self.fails.store(0, Ordering::Relaxed);
                }
                if !self.out.load(Ordering::Relaxed) {
                    return None;
                }
                let mut t = self.timing();
                // Checked again under the lock: one change per ejection, whoever reports.
                if !self.out.swap(false, Ordering::Relaxed) {
                    return None;
                }
                *t = Timing::default();
                Some(Change::Restored)
            }
            Verdict::Failed => {
                let n = self.fails.fetch_add(1, Ordering::Relaxed).saturating_add(1);
                // Counted all the same (`/upstreams` shows it), but 0 never ejects.
                if self.policy.after == 0 {
                    return None;
                }
                let out = self.out.load(Ordering::Relaxed);
                if !out && n < self.policy.after {
                    return None;
                }
                let mut t = self.timing();
                // Out already: a failed probe (or an attempt that began before the ejection)
                // starts the wait again.
                t.until = Some(now + self.policy.duration);
                t.probe = None;
                (!self.out.swap(true, Ordering::Relaxed)).then_some(Change::Ejected)
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
        let (ejected_for, probing) = if out {
            let t = self.timing();
            (
                t.until.map(|u| u.saturating_duration_since(now)),
                t.probe.is_some_and(|lapse| now < lapse),
            )
        } else {
            (None, false)
        };
        HealthView {
            in_rotation: !out,
            failures_in_a_row: self.fails.load(Ordering::Relaxed),
            ejected_for,
            probing,
        }
    }
}

/// The turn of the one attempt that probes an upstream out of rotation (see
/// [`Health::attempt`]).
#[derive(Debug)]
pub struct Probe<'a> {
    health: &'a Health,
    lapse: Instant,
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        let mut t = self.health.timing();
        // Only this probe's own turn: a report may have ended it, and a later probe begun.
        if t.probe == Some(self.lapse) {
            t.probe = None;
        }
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
        assert_eq!(h.report(Verdict::Failed, now), None);
        assert_eq!(h.report(Verdict::Failed, now), None);
        assert_eq!(h.report(Verdict::Healthy, now), None);
        assert_eq!(h.report(Verdict::Failed, now), None);
        assert_eq!(h.report(Verdict::Failed, now), None);
        assert!(h.available(now));
        assert_eq!(h.report(Verdict::Failed, now), Some(Change::Ejected));
        assert!(!h.available(now));
        assert_eq!(
            h.view(now + Duration::from_secs(4)),
            HealthView {
                in_rotation: false,
                failures_in_a_row: 3,
                ejected_for: Some(Duration::from_secs(6)),
                probing: false,
            }
        );
        // More failures while out (attempts that began before) do not eject twice.
        assert_eq!(h.report(Verdict::Failed, now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn one_probe_at_a_time_after_the_ejection() {
        let h = health(1);
        let t0 = Instant::now();
        assert_eq!(h.report(Verdict::Failed, t0), Some(Change::Ejected));
        let later = t0 + Duration::from_secs(10);
        assert!(!h.available(later - Duration::from_millis(1)));
        assert!(h.available(later));
        let probe = h.attempt(later);
        assert!(probe.is_some());
        // The probe is in flight: nobody else goes.
        assert!(!h.available(later));
        assert!(h.view(later).probing);
        assert!(h.attempt(later).is_none());
        assert_eq!(h.report(Verdict::Healthy, later), Some(Change::Restored));
        drop(probe);
        assert!(h.available(later));
        assert!(!h.is_out());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_ejects_again_for_the_whole_time() {
        let h = health(2);
        let t0 = Instant::now();
        h.report(Verdict::Failed, t0);
        assert_eq!(h.report(Verdict::Failed, t0), Some(Change::Ejected));
        let t1 = t0 + Duration::from_secs(11);
        let _probe = h.attempt(t1);
        // One failure is enough on probation, and it is no new ejection for the counters.
        assert_eq!(h.report(Verdict::Failed, t1), None);
        assert!(!h.available(t1 + Duration::from_secs(9)));
        assert!(h.available(t1 + Duration::from_secs(10)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_dropped_before_it_reports_hands_its_turn_on() {
        let h = health(1);
        let t0 = Instant::now();
        h.report(Verdict::Failed, t0);
        let t1 = t0 + Duration::from_secs(10);
        let probe = h.attempt(t1);
        assert!(!h.available(t1));
        assert_eq!(h.report(Verdict::Neither, t1), None);
        assert!(
            !h.available(t1),
            "only the guard ends a probe that said nothing"
        );
        drop(probe);
        assert!(h.available(t1));
        // A guard that outlives its turn does not end the next probe's.
        let stale = h.attempt(t1);
        let t2 = t1 + Duration::from_secs(10);
        assert!(!h.available(t2 - Duration::from_millis(1)));
        assert!(
            h.available(t2),
            "the turn lapses after another ejection's length"
        );
        let next = h.attempt(t2);
        drop(stale);
        assert!(!h.available(t2));
        drop(next);
        assert!(h.available(t2));
    }

    #[tokio::test(start_paused = true)]
    async fn zero_never_ejects_but_still_counts() {
        let h = health(0);
        let now = Instant::now();
        for _ in 0..100 {
            assert_eq!(h.report(Verdict::Failed, now), None);
        }
        assert!(h.available(now));
        assert_eq!(h.view(now).failures_in_a_row, 100);
    }
}
