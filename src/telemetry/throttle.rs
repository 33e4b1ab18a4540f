//! Log lines that something in a loop could repeat without end (a client retrying a refused
//! handshake, a run store that stays down): said at most once per period, the rest left to
//! the counters that count every one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// When a line was last said, shared by every task that may say it.
#[derive(Debug)]
pub struct Throttle {
    /// Milliseconds since the process's first look at the clock, plus one; 0 is never.
    last: AtomicU64,
    period_ms: u64,
}

impl Throttle {
    /// `const` so that a line's throttle can be a `static` beside the code that says it.
    pub const fn every(period: Duration) -> Throttle {
        Throttle {
            last: AtomicU64::new(0),
            period_ms: period.as_millis() as u64,
        }
    }

    /// Whether the line is due (the first time, or a whole period after it was last said),
    /// taking the turn if so: of tasks asking at once, one is told yes.
    pub fn due(&self) -> bool {
        static START: OnceLock<Instant> = OnceLock::new();
        self.due_at(START.get_or_init(Instant::now).elapsed())
    }

    /// As if never said: the next line is due (for tests, whose paused clock is not the
    /// one this reads).
    #[cfg(test)]
    pub fn reset_for_test(&self) {
        self.last.store(0, Ordering::Relaxed);
    }

    /// As [`Throttle::due`], at `now` since the process's start. The clock is monotonic and
    /// counts milliseconds, not calendar seconds: two lines are never less than a period
    /// apart, whatever second they fall in.
    fn due_at(&self, now: Duration) -> bool {
        let now = u64::try_from(now.as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1);
        let then = self.last.load(Ordering::Relaxed);
        (then == 0 || now >= then.saturating_add(self.period_ms))
            && self
                .last
                .compare_exchange(then, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_said_at_most_once_a_period() {
        let ms = Duration::from_millis;
        let t = Throttle::every(Duration::from_secs(1));
        assert!(t.due_at(ms(999)), "the first is said");
        // 1,001 ms is another calendar second, but only 2 ms later.
        assert!(!t.due_at(ms(1_001)));
        assert!(!t.due_at(ms(1_998)));
        assert!(t.due_at(ms(1_999)));
        assert!(!t.due_at(ms(2_000)));
        // At the clock's very start too.
        let t = Throttle::every(Duration::from_secs(60));
        assert!(t.due_at(ms(0)));
        assert!(!t.due_at(ms(59_999)));
        assert!(t.due_at(ms(60_000)));
    }

    #[test]
    fn of_tasks_asking_at_once_one_is_told_yes() {
        let t = Throttle::every(Duration::from_secs(1));
        let yes = std::thread::scope(|s| {
            let asks: Vec<_> = (0..8)
                .map(|_| s.spawn(|| t.due_at(Duration::from_millis(5))))
                .collect();
            asks.into_iter()
                .filter_map(|a| a.join().ok())
                .filter(|yes| *yes)
                .count()
        });
        assert_eq!(yes, 1);
    }
}
