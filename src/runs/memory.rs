//! The embedded run store: every run in this process's memory, at most `max_runs` of them,
//! the one whose last admitted call is oldest dropped first, each forgotten `ttl` after its
//! last admitted call (a refusal moves nothing, as in Redis).
//!
//! One lock over the map, taken for a lookup and never across an await, and never for longer
//! than a few runs take: beside the map, an index of the scopes each id is held under answers
//! `/runs/{id}` without walking every run under the lock each admission takes (audit OB 1:
//! 14-21 ms a lookup at 100k runs, which every admission waited behind). Each run has a lock
//! of its own for its admissions and ends, so calls of different runs never wait on each
//! other's arithmetic. A call keeps its run's entry from admission to its end: one lookup a
//! call, and a second short hold of the map's lock to move its run up once it is admitted.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lru::LruCache;
use tokio::time::Instant;

use crate::config::RunLimits;
use crate::runs::id::RunKey;
use crate::runs::state::{Admitted, Call, Refusal, RunEnd, RunState, Used, View};

/// One run's entry, shared by the map and the calls in flight.
pub type Entry = Arc<Mutex<RunState>>;

/// Told when a run ends, once per run (for its metrics).
pub trait Ends: Send + Sync {
    fn ended(&self, run: &RunState, end: RunEnd, now: Instant);
    /// A run was started (`true`) or forgotten (`false`).
    fn held(&self, now_held: usize);
}

pub struct MemoryStore {
    runs: Mutex<Held>,
    ttl: Duration,
    ends: Arc<dyn Ends>,
}

/// The runs held, and by id the scopes they are held under: the map's every change (a run
/// added, pushed out at `max_runs`, taken by the sweep) goes through here, so the index is
/// that of the map. The end of a call touches neither.
struct Held {
    lru: LruCache<RunKey, Entry>,
    /// Most ids have one scope (none, or one client's): a few bytes a run.
    scopes: HashMap<Arc<str>, Vec<Option<[u8; 8]>>>,
}

impl Held {
    fn peek(&self, key: &RunKey) -> Option<&Entry> {
        self.lru.peek(key)
    }

    fn len(&self) -> usize {
        self.lru.len()
    }

    /// Adds the run `key`, and returns the one it pushed out at `max_runs` (or the entry it
    /// replaced, were `key` held).
    fn push(&mut self, key: RunKey, entry: Entry) -> Option<(RunKey, Entry)> {
        let (id, scope) = (key.id.clone(), key.scope);
        let out = self.lru.push(key, entry);
        match &out {
            Some((same, _)) if same.scope == scope && same.id == id => return out,
            Some((gone, _)) => self.unindex(gone),
            None => {}
        }
        self.scopes
            .entry(id)
            .or_insert_with(|| Vec::with_capacity(1))
            .push(scope);
        out
    }

    fn pop(&mut self, key: &RunKey) -> Option<Entry> {
        let entry = self.lru.pop(key)?;
        self.unindex(key);
        Some(entry)
    }

    fn pop_lru(&mut self) -> Option<(RunKey, Entry)> {
        let (key, entry) = self.lru.pop_lru()?;
        self.unindex(&key);
        Some((key, entry))
    }

    fn unindex(&mut self, key: &RunKey) {
        if let Some(scopes) = self.scopes.get_mut(&*key.id) {
            scopes.retain(|s| *s != key.scope);
            if scopes.is_empty() {
                self.scopes.remove(&*key.id);
            }
        }
    }

    /// The runs held under `id`, whatever their scope.
    fn with_id(&self, id: &str) -> Vec<(RunKey, Entry)> {
        let Some((id, scopes)) = self.scopes.get_key_value(id) else {
            return Vec::new();
        };
        scopes
            .iter()
            .filter_map(|&scope| {
                let key = RunKey {
                    scope,
                    id: id.clone(),
                };
                let entry = self.lru.peek(&key)?.clone();
                Some((key, entry))
            })
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How many of the least recently used runs one admission looks at for expiry: enough to keep
/// up with the calls that add runs, bounded so that no call pays for a large sweep.
const SWEEP_PER_CALL: usize = 4;

impl MemoryStore {
    pub fn new(max_runs: usize, ttl: Duration, ends: Arc<dyn Ends>) -> Self {
        let cap = NonZeroUsize::new(max_runs.max(1)).expect("at least one");
        Self {
            runs: Mutex::new(Held {
                lru: LruCache::new(cap),
                scopes: HashMap::new(),
            }),
            ttl,
            ends,
        }
    }

    /// Admits `call` into the run `key` (starting it if it is new), a call on `route`: a run
    /// whose limits are not fixed yet takes `route`'s, if it has any (`RunState::take_limits`).
    pub fn admit(
        &self,
        key: &RunKey,
        route: &Arc<str>,
        limits: &RunLimits,
        call: &Call,
    ) -> (Entry, Result<Admitted, (Refusal, View)>) {
        let now = call.now;
        let (entry, fresh, forgotten, held) = {
            let mut runs = lock(&self.runs);
            let mut forgotten: Vec<(Entry, RunEnd)> = self
                .sweep(&mut runs, now, SWEEP_PER_CALL)
                .into_iter()
                .map(|e| (e, RunEnd::Expired))
                .collect();
            // A peek: only an admitted call moves its run up (below), so that the order of
            // the map stays that of the runs' last admitted calls, which the sweep relies
            // on. A run refused again and again would otherwise never reach the sweep.
            let found = runs.peek(key).cloned();
            let (entry, fresh) = match found {
                Some(e) if !self.gone(&lock(&e), now) => (e, false),
                stale => {
                    // Past its ttl, though no sweep has reached it yet: forgotten now, so
                    // that the call starts a fresh run exactly `ttl` after the last one.
                    if let Some(old) = stale {
                        runs.pop(key);
                        forgotten.push((old, RunEnd::Expired));
                    }
                    // From the first call's arrival, as its deadline (and Redis) count.
                    let e = Arc::new(Mutex::new(RunState::new(route.clone(), *limits, call.at)));
                    if let Some((_, old)) = runs.push(key.clone(), e.clone()) {
                        forgotten.push((old, RunEnd::Evicted));
                    }
                    (e, true)
                }
            };
            (entry, fresh, forgotten, runs.len())
        };
        for (e, end) in forgotten {
            let mut run = lock(&e);
            let end = match end {
                RunEnd::Expired => run.end_when_forgotten(),
                end => end,
            };
            if let Some(end) = run.take_last_report(end) {
                self.ends.ended(&run, end, now);
            }
        }
        self.ends.held(held);
        let result = {
            let mut run = lock(&entry);
            run.take_limits(route, limits);
            let result = run.admit(call);
            if let Some(end) = run.take_report() {
                self.ends.ended(&run, end, now);
            }
            result
        };
        if result.is_ok() && !fresh {
            lock(&self.runs).lru.promote(key);
        }
        (entry, result)
    }

    /// The run is to be forgotten at `now`: its ttl has passed and no call of it is in flight.
    fn gone(&self, run: &RunState, now: Instant) -> bool {
        run.in_flight == 0 && now >= run.expires(self.ttl)
    }

    /// The end of a call admitted into `entry` with `reserve` tokens.
    pub fn finish(&self, entry: &Entry, reserve: u64, used: &Used, now: Instant) {
        self.settle(entry, now, |run| {
            run.finish(reserve, used);
            run.last_call = run.last_call.max(now);
        });
    }

    /// A call that never reached an upstream: no call of its run. `run_deadline`: it was
    /// refused for want of the run's time.
    pub fn withdraw(&self, entry: &Entry, reserve: u64, run_deadline: bool, now: Instant) {
        self.settle(entry, now, |run| run.withdraw(reserve, run_deadline));
    }

    /// A call of the run leaves it (`leave`); the run's end is counted if that was its last.
    fn settle(&self, entry: &Entry, now: Instant, leave: impl FnOnce(&mut RunState)) {
        let mut run = lock(entry);
        leave(&mut run);
        if let Some(end) = run.take_report() {
            self.ends.ended(&run, end, now);
        }
    }

    /// A copy of the run `key`, for the tests (the admin listener uses `find`).
    #[cfg(test)]
    pub fn get(&self, key: &RunKey) -> Option<RunState> {
        let entry = lock(&self.runs).peek(key).cloned()?;
        let run = lock(&entry).clone();
        Some(run)
    }

    /// How many ids the index holds, for the tests.
    #[cfg(test)]
    fn held_ids(&self) -> usize {
        lock(&self.runs).scopes.len()
    }

    /// Every run with this id, whatever its scope: from the index, as long whatever the
    /// number of runs held.
    pub fn find(&self, id: &str) -> Vec<(RunKey, RunState)> {
        let entries = lock(&self.runs).with_id(id);
        entries
            .into_iter()
            .map(|(k, e)| (k, lock(&e).clone()))
            .collect()
    }

    /// Forgets runs whose ttl has passed: called now and then (and by admissions, a few at a
    /// time), so that an idle gateway lets its runs go too.
    pub fn expire(&self, now: Instant) {
        let (expired, held) = {
            let mut runs = lock(&self.runs);
            let expired = self.sweep(&mut runs, now, usize::MAX);
            (expired, runs.len())
        };
        for e in expired {
            let mut run = lock(&e);
            let end = run.end_when_forgotten();
            if let Some(end) = run.take_last_report(end) {
                self.ends.ended(&run, end, now);
            }
        }
        self.ends.held(held);
    }

    /// Takes up to `most` expired runs off the least recently used end. A run there whose
    /// last call ended later (calls end without a lookup) goes back to the front.
    fn sweep(&self, runs: &mut Held, now: Instant, most: usize) -> Vec<Entry> {
        let mut out = Vec::new();
        let mut looked = 0;
        // Bounded by the runs held before the sweep: the map shortens with every run taken,
        // and a bound read again would stop halfway through a sweep of all.
        let most = most.min(runs.len());
        while looked < most {
            looked += 1;
            let Some((_, e)) = runs.lru.peek_lru() else {
                break;
            };
            let (expires, busy) = {
                let run = lock(e);
                (run.expires(self.ttl), run.in_flight > 0)
            };
            if now < expires && !busy {
                break;
            }
            let (key, e) = runs.pop_lru().expect("peeked");
            if busy || now < expires {
                runs.push(key, e);
            } else {
                out.push(e);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::state::Answer;

    #[derive(Default)]
    struct Seen(Mutex<Vec<(String, RunEnd)>>, std::sync::atomic::AtomicUsize);

    impl Ends for Seen {
        fn ended(&self, run: &RunState, end: RunEnd, _: Instant) {
            lock(&self.0).push((run.route.to_string(), end));
        }
        fn held(&self, n: usize) {
            self.1.store(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn key(id: &str) -> RunKey {
        RunKey {
            scope: None,
            id: id.into(),
        }
    }

    fn call(now: Instant) -> Call {
        Call {
            reserve: 10,
            asked_budget: None,
            request: None,
            at: now,
            now,
            need: Duration::ZERO,
        }
    }

    fn store(max: usize, ttl: Duration) -> (MemoryStore, Arc<Seen>) {
        let seen = Arc::new(Seen::default());
        (MemoryStore::new(max, ttl, seen.clone()), seen)
    }

    const LIMITS: RunLimits = RunLimits {
        max_calls: Some(10),
        ..RunLimits::UNLIMITED
    };

    #[test]
    fn fifty_threads_at_once_get_exactly_the_runs_ten_calls() {
        let (s, seen) = store(100, Duration::from_secs(600));
        let s = Arc::new(s);
        let route: Arc<str> = "chat".into();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let now = rt.block_on(async { Instant::now() });
        let admitted: Vec<Entry> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..50)
                .map(|_| {
                    let (s, route) = (s.clone(), route.clone());
                    scope.spawn(move || {
                        let (entry, result) = s.admit(&key("r"), &route, &LIMITS, &call(now));
                        result.is_ok().then_some(entry)
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(admitted.len(), 10);
        let run = s.get(&key("r")).unwrap();
        assert_eq!((run.calls, run.in_flight), (10, 10));
        assert!(
            lock(&seen.0).is_empty(),
            "ended, but counted only once its calls have used what they use"
        );
        let used = Used {
            tokens: 7,
            answer: Answer::Plain,
            ..Used::default()
        };
        for entry in &admitted {
            s.finish(entry, 10, &used, now);
        }
        assert_eq!(s.get(&key("r")).unwrap().tokens_used, 70);
        assert_eq!(
            *lock(&seen.0),
            [("chat".to_string(), RunEnd::Calls)],
            "ended once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_least_recently_used_run_makes_room_and_is_counted() {
        let (s, seen) = store(2, Duration::from_secs(600));
        let route: Arc<str> = "chat".into();
        let now = Instant::now();
        for id in ["a", "b", "a", "c"] {
            let _ = s.admit(&key(id), &route, &LIMITS, &call(now));
        }
        assert!(s.get(&key("b")).is_none(), "b was the least recently used");
        assert!(s.get(&key("a")).is_some() && s.get(&key("c")).is_some());
        assert_eq!(*lock(&seen.0), [("chat".to_string(), RunEnd::Evicted)]);
        assert_eq!(seen.1.load(std::sync::atomic::Ordering::Relaxed), 2);
    }

    /// A run that stopped calling long before its deadline never met it: forgotten after
    /// that deadline passed, it expired (its duration ended with its last call).
    #[tokio::test(start_paused = true)]
    async fn a_run_forgotten_after_its_deadline_passed_unmet_expired() {
        let ttl = Duration::from_secs(60);
        let (s, seen) = store(100, ttl);
        let route: Arc<str> = "chat".into();
        let limits = RunLimits {
            budget: Some(Duration::from_secs(5)),
            ..LIMITS
        };
        let t0 = Instant::now();
        let (run, _) = s.admit(&key("timed"), &route, &limits, &call(t0));
        s.finish(&run, 10, &Used::default(), t0);
        s.expire(t0 + ttl);
        assert!(s.get(&key("timed")).is_none());
        assert_eq!(*lock(&seen.0), [("chat".to_string(), RunEnd::Expired)]);
    }

    /// A call cut at the run's deadline ends the run there, counted as it ends: no later
    /// call need come to be refused for it.
    #[tokio::test(start_paused = true)]
    async fn a_call_cut_at_the_runs_deadline_ends_the_run_by_its_deadline() {
        let (s, seen) = store(100, Duration::from_secs(60));
        let route: Arc<str> = "chat".into();
        let limits = RunLimits {
            budget: Some(Duration::from_secs(5)),
            ..LIMITS
        };
        let t0 = Instant::now();
        let (run, _) = s.admit(&key("cut"), &route, &limits, &call(t0));
        let cut = Used {
            run_deadline: true,
            ..Used::default()
        };
        s.finish(&run, 10, &cut, t0 + Duration::from_secs(5));
        assert_eq!(*lock(&seen.0), [("chat".to_string(), RunEnd::Deadline)]);
    }

    #[tokio::test(start_paused = true)]
    async fn runs_are_forgotten_ttl_after_their_last_call_but_not_while_one_is_in_flight() {
        let ttl = Duration::from_secs(60);
        let (s, seen) = store(100, ttl);
        let route: Arc<str> = "chat".into();
        let t0 = Instant::now();
        let (idle, _) = s.admit(&key("idle"), &route, &LIMITS, &call(t0));
        s.finish(&idle, 10, &Used::default(), t0);
        let (busy, _) = s.admit(&key("busy"), &route, &LIMITS, &call(t0));
        s.expire(t0 + ttl - Duration::from_secs(1));
        assert!(s.get(&key("idle")).is_some(), "not yet");
        s.expire(t0 + ttl);
        assert!(s.get(&key("idle")).is_none(), "forgotten at its ttl");
        assert!(s.get(&key("busy")).is_some(), "a call is still in flight");
        s.finish(&busy, 10, &Used::default(), t0 + ttl * 2);
        s.expire(t0 + ttl * 3);
        assert!(
            s.get(&key("busy")).is_none(),
            "ttl after its last call ended"
        );
        assert_eq!(
            *lock(&seen.0),
            [
                ("chat".to_string(), RunEnd::Expired),
                ("chat".to_string(), RunEnd::Expired)
            ]
        );
        assert_eq!(seen.1.load(std::sync::atomic::Ordering::Relaxed), 0);
    }

    /// One `expire` forgets every run past its ttl, not about half of them: the sweep's bound
    /// was read again as each run it took made the map shorter.
    #[tokio::test(start_paused = true)]
    async fn one_expire_forgets_every_run_past_its_ttl() {
        let ttl = Duration::from_secs(60);
        let (s, seen) = store(100, ttl);
        let route: Arc<str> = "chat".into();
        let t0 = Instant::now();
        for i in 0..10 {
            let (run, _) = s.admit(&key(&format!("r{i}")), &route, &LIMITS, &call(t0));
            s.finish(&run, 10, &Used::default(), t0);
        }
        s.expire(t0 + ttl);
        assert_eq!(seen.1.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert_eq!(lock(&seen.0).len(), 10);
    }

    /// A call refused before it was sent for want of the run's time: no call of the run, and
    /// the run goes on (a call on a faster route may fit), but forgotten, it met its deadline.
    #[tokio::test(start_paused = true)]
    async fn a_run_short_of_time_for_a_call_is_forgotten_as_ended_by_its_deadline() {
        let ttl = Duration::from_secs(60);
        let (s, seen) = store(100, ttl);
        let route: Arc<str> = "chat".into();
        let limits = RunLimits {
            budget: Some(Duration::from_secs(5)),
            ..LIMITS
        };
        let t0 = Instant::now();
        let (run, _) = s.admit(&key("short"), &route, &limits, &call(t0));
        s.withdraw(&run, 10, true, t0);
        assert!(lock(&seen.0).is_empty(), "not ended");
        s.expire(t0 + ttl);
        assert_eq!(*lock(&seen.0), [("chat".to_string(), RunEnd::Deadline)]);
    }

    const ONE_CALL: RunLimits = RunLimits {
        max_calls: Some(1),
        ..RunLimits::UNLIMITED
    };

    /// A refusal does not make its run younger: the run is forgotten `ttl` after its last
    /// admitted call however often it was refused since, while other runs come and go (as
    /// Redis forgets it).
    #[tokio::test(start_paused = true)]
    async fn a_refused_run_is_forgotten_ttl_after_its_last_admitted_call() {
        let ttl = Duration::from_secs(2);
        let (s, _) = store(100, ttl);
        let route: Arc<str> = "chat".into();
        let t0 = Instant::now();
        let (stuck, admitted) = s.admit(&key("stuck"), &route, &ONE_CALL, &call(t0));
        assert!(admitted.is_ok());
        s.finish(&stuck, 10, &Used::default(), t0);
        let later = t0 + Duration::from_millis(500);
        let (other, _) = s.admit(&key("other"), &route, &LIMITS, &call(later));
        s.finish(&other, 10, &Used::default(), later);
        let refused = s.admit(
            &key("stuck"),
            &route,
            &ONE_CALL,
            &call(later + Duration::from_millis(500)),
        );
        assert!(refused.1.is_err());
        s.expire(t0 + ttl);
        assert!(s.get(&key("stuck")).is_none(), "forgotten at its ttl");
        assert!(s.get(&key("other")).is_some(), "not yet");
    }

    /// A call `ttl` after its run's last call starts a fresh run, also where the sweep (a few
    /// runs a call, and calls in flight ahead of it) has not reached the old one yet.
    #[tokio::test(start_paused = true)]
    async fn a_call_past_the_ttl_starts_a_fresh_run_before_a_sweep_reaches_the_old_one() {
        let ttl = Duration::from_secs(2);
        let (s, seen) = store(100, ttl);
        let route: Arc<str> = "chat".into();
        let t0 = Instant::now();
        let busy: Vec<Entry> = (0..SWEEP_PER_CALL)
            .map(|i| {
                s.admit(&key(&format!("busy-{i}")), &route, &LIMITS, &call(t0))
                    .0
            })
            .collect();
        let (old, _) = s.admit(&key("old"), &route, &ONE_CALL, &call(t0));
        s.finish(&old, 10, &Used::default(), t0);
        let (_, again) = s.admit(&key("old"), &route, &ONE_CALL, &call(t0 + ttl));
        assert!(again.is_ok_and(|a| a.started), "a fresh run");
        assert_eq!(*lock(&seen.0), [("chat".to_string(), RunEnd::Expired)]);
        assert_eq!(
            seen.1.load(std::sync::atomic::Ordering::Relaxed),
            busy.len() + 1
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_scoped_to_one_client_is_not_anothers() {
        let (s, _) = store(100, Duration::from_secs(600));
        let route: Arc<str> = "chat".into();
        let now = Instant::now();
        let mine = RunKey {
            scope: Some([1; 8]),
            id: "r".into(),
        };
        let theirs = RunKey {
            scope: Some([2; 8]),
            id: "r".into(),
        };
        let one_call = RunLimits {
            max_calls: Some(1),
            ..RunLimits::UNLIMITED
        };
        assert!(s.admit(&mine, &route, &one_call, &call(now)).1.is_ok());
        assert!(s.admit(&mine, &route, &one_call, &call(now)).1.is_err());
        assert!(s.admit(&theirs, &route, &one_call, &call(now)).1.is_ok());
        assert_eq!(s.find("r").len(), 2);
    }

    /// Audit OB 1: `find` looks an id up in an index of the runs held, kept with the map as
    /// runs come (unscoped, and scoped to clients under one id) and go (pushed out at
    /// `max_runs`, forgotten at their ttl, replaced by a fresh run): it finds what the map
    /// holds, no more and no less.
    #[tokio::test(start_paused = true)]
    async fn find_sees_exactly_the_runs_held_under_an_id_as_they_come_and_go() {
        let ttl = Duration::from_secs(60);
        let (s, _) = store(4, ttl);
        let route: Arc<str> = "chat".into();
        let t0 = Instant::now();
        let scoped = |n: u8, id: &str| RunKey {
            scope: Some([n; 8]),
            id: id.into(),
        };
        let found = |id: &str| {
            let mut keys: Vec<String> =
                s.find(id).into_iter().map(|(k, _)| k.to_string()).collect();
            keys.sort();
            keys
        };
        let admit = |k: &RunKey, at: Instant| {
            let (e, r) = s.admit(k, &route, &LIMITS, &call(at));
            assert!(r.is_ok());
            s.finish(&e, 10, &Used::default(), at);
        };
        admit(&key("r"), t0);
        admit(&scoped(1, "r"), t0);
        admit(&scoped(2, "r"), t0);
        admit(&key("x"), t0);
        assert_eq!(
            found("r"),
            ["k:0101010101010101/r", "k:0202020202020202/r", "r"]
        );
        assert_eq!(found("x"), ["x"]);
        assert!(found("nosuch").is_empty());
        // Calls of runs already held add nothing.
        admit(&scoped(1, "r"), t0);
        admit(&key("x"), t0);
        assert_eq!(found("r").len(), 3);
        // A fifth run pushes out the least recently used one: the unscoped "r".
        admit(&key("y"), t0 + Duration::from_secs(1));
        assert_eq!(found("r"), ["k:0101010101010101/r", "k:0202020202020202/r"]);
        assert_eq!(found("y"), ["y"]);
        // Forgotten at their ttl: every run but "y", then "y" too.
        s.expire(t0 + ttl);
        assert!(found("r").is_empty() && found("x").is_empty());
        assert_eq!(found("y"), ["y"]);
        // Past its ttl, called again: forgotten and started afresh, held once.
        admit(&scoped(1, "y"), t0 + ttl);
        admit(&key("y"), t0 + ttl + Duration::from_secs(1));
        assert_eq!(found("y"), ["k:0101010101010101/y", "y"]);
        s.expire(t0 + ttl * 3);
        assert!(found("y").is_empty());
        assert_eq!(s.held_ids(), 0, "no id is left in the index");
    }
}
