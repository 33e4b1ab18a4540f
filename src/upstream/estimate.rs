//! What an attempt on an upstream is expected to take until its first token: the estimate
//! that decides whether an attempt still fits a request's remaining budget. One per model the
//! upstream serves: a reasoning model's first token can take a minute where a small model's
//! takes 300 ms, and one estimate for both would refuse the small model's short budgets.
//! A request that names no model has none to learn from: see `TtftEstimates`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{OnceLock, PoisonError, RwLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Told when an estimate rose by a notable part, so that requests waiting for a route's slot
/// ask again whether their attempt still fits: they sleep to the latest time they may leave,
/// not waking every 100 ms each (audit HA 3: 10,000 queued requests took 27% of a core doing
/// nothing). One for all upstreams: a rise is rare next to the waits it saves, and a waiter
/// woken for another upstream's only sleeps again.
static ROSE: Notify = Notify::const_new();

/// What waiters on an estimate listen to: see `ROSE`.
pub fn rose() -> &'static Notify {
    &ROSE
}

/// A rise smaller than this part of the estimate last told of, or than `NOTABLE_RISE_SECS`,
/// wakes nobody: many small rises in a row add up and are told, and the slot's grant checks
/// the estimate of that moment. The floor keeps the jitter of a fast upstream's first
/// tokens (1 ms, then 1.2 ms) from waking every waiter on each answer.
const NOTABLE_RISE: f64 = 1.0 / 16.0;
const NOTABLE_RISE_SECS: f64 = 0.01;

/// A per-upstream estimate of time to first token: a decaying high quantile of recent
/// observations. It rises quickly towards a slow observation and sinks slowly after fast
/// ones (an asymmetric moving average whose equilibrium sits near the 90th percentile), so
/// one lucky answer does not make a slow upstream look cheap.
///
/// It also forgets with time: between observations it returns, with a half-life of
/// `HALF_LIFE`, to its seed (`expected_first_token`, or zero: unknown, which lets every
/// attempt through). The estimate keeps requests whose budget it says cannot fit from ever
/// reaching the upstream, so those requests teach it nothing: without forgetting, one hung
/// generation would shut out every shorter budget for good, however fast the upstream is
/// again.
#[derive(Debug, Default)]
pub struct TtftEstimate {
    /// Seconds as `f64` bits. Updates race benignly: an estimate, not an account.
    bits: AtomicU64,
    /// The seed, seconds as `f64` bits: what the estimate returns to.
    seed: AtomicU64,
    /// When it was last observed: ms since `epoch()`.
    at: AtomicU64,
    /// How many times it was observed, stopping at `u32::MAX`: a full table keeps the
    /// models in use over names seen once.
    seen: AtomicU32,
    /// The estimate last told of by `ROSE` (or that it sank to since), seconds as `f64` bits.
    told: AtomicU64,
}

const RISE: f64 = 0.3;
const SINK: f64 = 0.03;
/// How fast an estimate returns to its seed without observations.
pub const HALF_LIFE: Duration = Duration::from_secs(30);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl TtftEstimate {
    pub fn new(seed: Option<Duration>) -> Self {
        let s = Self::default();
        if let Some(d) = seed {
            s.seed.store(d.as_secs_f64().to_bits(), Ordering::Relaxed);
            s.set(d.as_secs_f64(), Instant::now());
        }
        s
    }

    fn set(&self, secs: f64, now: Instant) {
        self.bits.store(secs.to_bits(), Ordering::Relaxed);
        let ms = now.saturating_duration_since(epoch()).as_millis() as u64;
        self.at.store(ms, Ordering::Relaxed);
    }

    /// The estimate went from `before` (as it stood, gone back towards its seed) to
    /// `after`: a notable rise over what was last told, or over what it had sunk to since,
    /// is told.
    fn tell(&self, before: f64, after: f64) -> bool {
        let told = f64::from_bits(self.told.load(Ordering::Relaxed)).min(before);
        let notable = after > told * (1.0 + NOTABLE_RISE) && after - told >= NOTABLE_RISE_SECS;
        if notable {
            ROSE.notify_waiters();
        }
        let told = if notable { after } else { told.min(after) };
        self.told.store(told.to_bits(), Ordering::Relaxed);
        notable
    }

    /// The estimate at `now`, in seconds: the last one, gone back towards the seed by the
    /// half-lives since it was set.
    fn secs(&self, now: Instant) -> f64 {
        let q = f64::from_bits(self.bits.load(Ordering::Relaxed));
        let seed = f64::from_bits(self.seed.load(Ordering::Relaxed));
        let since = now.saturating_duration_since(epoch()).as_millis() as u64;
        let idle = since.saturating_sub(self.at.load(Ordering::Relaxed));
        if idle == 0 || q == seed {
            return q;
        }
        let kept = (-(idle as f64) / HALF_LIFE.as_millis() as f64 * std::f64::consts::LN_2).exp();
        seed + (q - seed) * kept
    }

    pub fn get(&self) -> Duration {
        Duration::from_secs_f64(self.secs(Instant::now()).max(0.0))
    }

    fn count(&self) {
        // An `Err` is the count at its cap, where it stays.
        let _ = self
            .seen
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1));
    }

    /// One observed time to first token.
    pub fn observe(&self, d: Duration) {
        self.count();
        let now = Instant::now();
        let x = d.as_secs_f64();
        let q = self.secs(now);
        let next = if q <= 0.0 {
            x
        } else if x > q {
            q + RISE * (x - q)
        } else {
            q + SINK * (x - q)
        };
        self.set(next, now);
        let _ = self.tell(q, next);
    }

    /// A first-token limit of `d` fired before the first token: it takes at least that
    /// long, by how much more nobody knows. The estimate rises towards it as towards a slow
    /// observation (from zero when unknown: one hung generation is not the upstream's
    /// measure); a bound below the estimate says nothing.
    pub fn observe_bound(&self, d: Duration) {
        self.count();
        let now = Instant::now();
        let x = d.as_secs_f64();
        let q = self.secs(now).max(0.0);
        if x > q {
            let next = q + RISE * (x - q);
            self.set(next, now);
            let _ = self.tell(q, next);
        }
    }
}

/// Models an upstream keeps an estimate of their own for. Providers serve dozens; past this,
/// a new model takes the place of the one observed fewest times (of those, least recently),
/// so that clients naming made-up models can neither grow the table nor keep a real model
/// from an estimate of its own for good (a table that only filled would do both), and names
/// seen once take each other's place, not that of a model in use (audit EB F5: 64 made-up
/// names evicted a model observed a second before, by least recent alone).
pub const MAX_MODELS: usize = 64;

/// The longest model name that gets an estimate of its own, in bytes. No provider's names come
/// near it; a longer one is the client's, and is taken as naming no model, so that what the
/// table holds is bounded whatever the clients send.
pub const MAX_MODEL_NAME: usize = 256;

/// An upstream's estimates, by the model the upstream is asked for. A model gets its own at
/// its first observation (the upstream answered for it, or made it wait out a first-token
/// limit: a model it refuses at once is never observed). Until then what is expected is the
/// seed, `expected_first_token`.
///
/// A request that names no model (a GET, a multipart upload or transcription, a batch
/// created) is expected to take the seed, always: it neither teaches nor reads a learned
/// estimate. Such requests have nothing in common: the models listed answer in a
/// millisecond where a transcription takes a minute, and one estimate learned from all of
/// them refused every short budget among them with 504 `insufficient_budget` after a few slow
/// ones, for as long as they kept coming (audit PC 2: four 6 s transcriptions shut
/// `/v1/models`, `/v1/files/{id}` and `/v1/batches/{id}` to 4 s budgets). Their own
/// watchdogs still bound them.
#[derive(Debug)]
pub struct TtftEstimates {
    seed: Option<Duration>,
    /// A handful of models in practice, at most `MAX_MODELS`: searched in order, which costs
    /// less than hashing the name.
    models: RwLock<Vec<(Box<str>, TtftEstimate)>>,
}

impl TtftEstimates {
    pub fn new(seed: Option<Duration>) -> Self {
        Self {
            seed,
            models: RwLock::default(),
        }
    }

    /// What an attempt for `model` is expected to take until its first token.
    pub fn get(&self, model: Option<&str>) -> Duration {
        let Some(model) = model.filter(|m| m.len() <= MAX_MODEL_NAME) else {
            return self.seed.unwrap_or_default();
        };
        let models = self.models.read().unwrap_or_else(PoisonError::into_inner);
        match find(&models, model) {
            Some(e) => e.get(),
            None => self.seed.unwrap_or_default(),
        }
    }

    /// One observed time to first token of `model`.
    pub fn observe(&self, model: Option<&str>, d: Duration) {
        self.with(model, |e| e.observe(d));
    }

    /// A first-token limit of `d` fired for `model`: see [`TtftEstimate::observe_bound`].
    pub fn observe_bound(&self, model: Option<&str>, d: Duration) {
        self.with(model, |e| e.observe_bound(d));
    }

    fn with(&self, model: Option<&str>, f: impl FnOnce(&TtftEstimate)) {
        // Naming no model, it teaches nothing (see `TtftEstimates`).
        let Some(model) = model.filter(|m| m.len() <= MAX_MODEL_NAME) else {
            return;
        };
        {
            let models = self.models.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(e) = find(&models, model) {
                return f(e);
            }
        }
        let mut models = self.models.write().unwrap_or_else(PoisonError::into_inner);
        // Another thread may have added it between the two locks.
        if let Some(e) = find(&models, model) {
            return f(e);
        }
        let entry = (model.into(), TtftEstimate::new(self.seed));
        let i = if models.len() < MAX_MODELS {
            models.push(entry);
            models.len() - 1
        } else {
            // The least observed has taught least; of those, the least recently observed has
            // gone furthest back to its seed, what a model without an entry expects.
            let i = models
                .iter()
                .enumerate()
                .min_by_key(|(_, (_, e))| {
                    (e.seen.load(Ordering::Relaxed), e.at.load(Ordering::Relaxed))
                })
                .map_or(0, |(i, _)| i);
            models[i] = entry;
            i
        };
        f(&models[i].1);
    }
}

impl TtftEstimates {
    /// Every estimate as it stands: the models with their own, then what requests that name
    /// no model (or one longer than `MAX_MODEL_NAME`) expect, the seed.
    pub fn snapshot(&self) -> (Vec<(String, Duration)>, Duration) {
        let models = self.models.read().unwrap_or_else(PoisonError::into_inner);
        let each = models
            .iter()
            .map(|(m, e)| (m.to_string(), e.get()))
            .collect();
        (each, self.get(None))
    }
}

fn find<'a>(models: &'a [(Box<str>, TtftEstimate)], model: &str) -> Option<&'a TtftEstimate> {
    models.iter().find(|(m, _)| **m == *model).map(|(_, e)| e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests waiting for a slot are woken by a notable rise only: not by a small one, nor
    /// by a fall; small rises add up, and a rise counts from what the estimate sank to.
    #[test]
    fn a_notable_rise_is_told_to_the_requests_waiting_on_estimates() {
        let e = TtftEstimate::new(Some(Duration::from_secs(1)));
        assert!(e.tell(1.0, 1.3));
        assert!(!e.tell(1.3, 1.31), "a rise of 10 ms");
        assert!(!e.tell(1.31, 0.6), "a fall");
        assert!(!e.tell(0.6, 0.62));
        assert!(!e.tell(0.62, 0.635));
        assert!(e.tell(0.635, 0.65), "three small rises: 8% over 0.6 s");
        // Gone back towards its seed without observations, from 0.65 s to 0.2 s.
        assert!(e.tell(0.2, 0.4));
        // A fast upstream's jitter: 1 ms to 1.5 ms is half again, but no waiter's matter.
        let fast = TtftEstimate::new(None);
        assert!(!fast.tell(0.0, 0.001));
        assert!(!fast.tell(0.001, 0.0015));
        assert!(fast.tell(0.0015, 0.02));
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn estimate_is_seeded_then_tracks_a_high_quantile() {
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

    #[tokio::test(start_paused = true)]
    async fn without_observations_it_returns_to_its_seed() {
        let e = TtftEstimate::new(None);
        e.observe(ms(4000));
        tokio::time::advance(HALF_LIFE).await;
        let half = e.get();
        assert!(half > ms(1990) && half < ms(2010), "{half:?}");
        tokio::time::advance(HALF_LIFE * 9).await;
        assert!(e.get() < ms(10), "{:?}", e.get());
        let seeded = TtftEstimate::new(Some(ms(1000)));
        seeded.observe(ms(5000));
        tokio::time::advance(HALF_LIFE * 10).await;
        let back = seeded.get();
        assert!(back > ms(1000) && back < ms(1010), "{back:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_limit_that_fired_is_a_bound_not_a_measure() {
        let e = TtftEstimate::new(None);
        // One hung generation, cut by a 5 s first-token limit: not a 5 s estimate.
        e.observe_bound(ms(5000));
        assert_eq!(e.get(), ms(1500));
        e.observe_bound(ms(5000));
        let twice = e.get();
        assert!(
            twice > ms(2540) && twice < ms(2560),
            "a pattern of them is: {twice:?}"
        );
        // A bound below the estimate says nothing.
        e.observe_bound(ms(100));
        assert_eq!(e.get(), twice);
    }

    #[tokio::test(start_paused = true)]
    async fn each_model_has_its_own_estimate() {
        let e = TtftEstimates::new(None);
        e.observe(Some("o3"), ms(20_000));
        e.observe(Some("gpt-4o-mini"), ms(300));
        assert_eq!(e.get(Some("o3")), ms(20_000));
        assert_eq!(e.get(Some("gpt-4o-mini")), ms(300));
        assert_eq!(e.get(Some("gpt-5")), Duration::ZERO, "unknown");
        e.observe_bound(Some("gpt-5"), ms(5000));
        assert_eq!(e.get(Some("gpt-5")), ms(1500));
        assert_eq!(
            e.get(Some("gpt-4o-mini")),
            ms(300),
            "untouched by the others"
        );
        assert_eq!(e.get(None), Duration::ZERO);
        // A model not yet seen, and a request that names none, expect the seed; a model's
        // own estimate starts from it.
        let seeded = TtftEstimates::new(Some(ms(800)));
        seeded.observe(Some("o3"), ms(20_000));
        assert_eq!(seeded.get(Some("o3")), ms(6560));
        assert_eq!(seeded.get(Some("gpt-5")), ms(800));
        assert_eq!(seeded.get(None), ms(800));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_table_gives_a_new_model_the_place_of_the_least_recently_observed() {
        let e = TtftEstimates::new(None);
        e.observe(Some("o3-slow"), ms(3000));
        tokio::time::advance(ms(1)).await;
        // Squatted: every other place taken by a made-up model.
        for i in 1..MAX_MODELS {
            e.observe(Some(&format!("junk{i}")), ms(3000));
        }
        tokio::time::advance(ms(1)).await;
        e.observe(Some("o3-slow"), ms(3000));
        assert_eq!(e.get(Some("fast-mini")), Duration::ZERO, "not yet seen");
        e.observe(Some("fast-mini"), ms(100));
        assert_eq!(
            e.get(Some("fast-mini")),
            ms(100),
            "its own, not a shared one"
        );
        assert!(e.get(Some("o3-slow")) > ms(2990), "observed lately: kept");
        assert_eq!(e.get(Some("junk1")), Duration::ZERO, "the oldest: gone");
        assert_eq!(e.get(None), Duration::ZERO, "untouched");
        assert_eq!(e.models.read().unwrap().len(), MAX_MODELS);
    }

    /// Audit EB F5: a burst of made-up names evicted a model in steady use.
    #[tokio::test(start_paused = true)]
    async fn made_up_names_take_each_others_place_not_a_model_in_use() {
        let e = TtftEstimates::new(None);
        for _ in 0..10 {
            e.observe(Some("real"), ms(1250));
        }
        for i in 1..MAX_MODELS {
            tokio::time::advance(ms(1)).await;
            e.observe(Some(&format!("junk{i}")), ms(50));
        }
        for i in MAX_MODELS..MAX_MODELS * 2 {
            tokio::time::advance(ms(1)).await;
            e.observe(Some(&format!("junk{i}")), ms(50));
            // Gone back towards its seed a little in the 128 ms, not to it.
            let real = e.get(Some("real"));
            assert!(real > ms(1240), "kept past junk{i}: {real:?}");
        }
        assert_eq!(e.models.read().unwrap().len(), MAX_MODELS);
        let last = format!("junk{}", MAX_MODELS * 2 - 1);
        assert_eq!(e.get(Some(&last)), ms(50), "the newest has its own");
        assert_eq!(
            e.get(Some("junk1")),
            Duration::ZERO,
            "the oldest seen once: gone"
        );
    }

    /// Audit PC 2: slow transcriptions (no model) made every other call naming none (the
    /// models listed, a file retrieved) expect their time, and refused short budgets.
    #[tokio::test(start_paused = true)]
    async fn requests_naming_no_model_neither_teach_nor_read_an_estimate() {
        let e = TtftEstimates::new(None);
        for _ in 0..4 {
            e.observe(None, ms(6000));
        }
        e.observe_bound(None, ms(60_000));
        assert_eq!(e.get(None), Duration::ZERO, "unknown: no obstacle");
        assert!(e.models.read().unwrap().is_empty());
        assert_eq!(e.snapshot().1, Duration::ZERO);
        e.observe(Some("gpt-4o"), ms(300));
        e.observe(None, ms(6000));
        assert_eq!(e.get(Some("gpt-4o")), ms(300), "a model's is its own");
        // Seeded, they expect the seed: what the operator said the upstream takes.
        let seeded = TtftEstimates::new(Some(ms(800)));
        seeded.observe(None, ms(6000));
        assert_eq!(seeded.get(None), ms(800));
        assert_eq!(seeded.snapshot().1, ms(800));
    }

    #[test]
    fn the_count_of_observations_stops_at_its_cap() {
        let e = TtftEstimate::new(None);
        e.seen.store(u32::MAX - 1, Ordering::Relaxed);
        e.observe(ms(10));
        e.observe_bound(ms(10));
        assert_eq!(e.seen.load(Ordering::Relaxed), u32::MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn a_name_too_long_is_never_learned_and_the_table_stays_bounded() {
        let e = TtftEstimates::new(None);
        let long = "A".repeat(MAX_MODEL_NAME + 1);
        e.observe(Some(&long), ms(4000));
        assert!(e.models.read().unwrap().is_empty());
        assert_eq!(
            e.get(Some(&long)),
            Duration::ZERO,
            "as naming none: the seed"
        );
        assert_eq!(e.get(None), Duration::ZERO);
        assert_eq!(e.get(Some("m")), Duration::ZERO);
        // However many and however long the names, the table holds at most this many bytes.
        for i in 0..MAX_MODELS * 4 {
            let name = format!("{i:04}{}", "B".repeat(MAX_MODEL_NAME * (i % 3)));
            e.observe(Some(&name), ms(100));
        }
        let models = e.models.read().unwrap();
        assert_eq!(models.len(), MAX_MODELS);
        let bytes: usize = models.iter().map(|(m, _)| m.len()).sum();
        assert!(bytes <= MAX_MODELS * MAX_MODEL_NAME, "{bytes}");
        let (snapshot, _) = {
            drop(models);
            e.snapshot()
        };
        assert!(snapshot.iter().all(|(m, _)| m.len() <= MAX_MODEL_NAME));
    }
}
