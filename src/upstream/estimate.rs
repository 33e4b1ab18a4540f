//! What an attempt on an upstream is expected to take until its first token: the estimate
//! that decides whether an attempt still fits a request's remaining budget.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A per-upstream estimate of time to first token: a decaying high quantile of recent
/// observations. It rises quickly towards a slow observation and sinks slowly after fast
/// ones (an asymmetric moving average whose equilibrium sits near the 90th percentile), so
/// one lucky answer does not make a slow upstream look cheap. Seeded from the upstream's
/// `expected_first_token`; zero (unknown) until then, which lets every attempt through.
#[derive(Debug, Default)]
pub struct TtftEstimate {
    /// Seconds as `f64` bits. Updates race benignly: an estimate, not an account.
    bits: AtomicU64,
}

const RISE: f64 = 0.3;
const SINK: f64 = 0.03;

impl TtftEstimate {
    pub fn new(seed: Option<Duration>) -> Self {
        let s = Self::default();
        if let Some(d) = seed {
            s.set(d.as_secs_f64());
        }
        s
    }

    fn set(&self, secs: f64) {
        self.bits.store(secs.to_bits(), Ordering::Relaxed);
    }

    fn secs(&self) -> f64 {
        f64::from_bits(self.bits.load(Ordering::Relaxed))
    }

    pub fn get(&self) -> Duration {
        Duration::from_secs_f64(self.secs().max(0.0))
    }

    /// One observed time to first token (or a lower bound of it, when the limit fired first).
    pub fn observe(&self, d: Duration) {
        let x = d.as_secs_f64();
        let q = self.secs();
        let next = if q <= 0.0 {
            x
        } else if x > q {
            q + RISE * (x - q)
        } else {
            q + SINK * (x - q)
        };
        self.set(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn estimate_is_seeded_then_tracks_a_high_quantile() {
        let e = TtftEstimate::new(None);
        assert_eq!(e.get(), Duration::ZERO);
        e.observe(ms(200));
        assert_eq!(e.get(), ms(200));
        // Mostly 100 ms with one in ten at 1 s: the estimate settles well above the median.
        for i in 0..2000 {
            e.observe(if i % 10 == 0 { ms(1000) } else { ms(100) });
        }
        let q = e.get();
        assert!(q > ms(300) && q < ms(1000), "{q:?}");
        let seeded = TtftEstimate::new(Some(ms(1500)));
        assert_eq!(seeded.get(), ms(1500));
        seeded.observe(ms(100));
        assert!(
            seeded.get() < ms(1500) && seeded.get() > ms(1400),
            "sinks slowly"
        );
        seeded.observe(ms(5000));
        assert!(seeded.get() > ms(2500), "rises fast");
    }
}
