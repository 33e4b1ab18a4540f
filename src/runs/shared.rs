//! What the calls of a Redis run store share: the client, the bounds of each store call, what
//! to do when the store fails, and the one place failures are counted and logged. Apart from
//! the runtime so that a call can give its reservation back without reaching up into it.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::config::OnStoreError;
use crate::runs::redis::{Finished, RedisStore, StoreError};
use crate::runs::state::Used;

use crate::telemetry::metrics::RunMetrics;
use crate::telemetry::throttle::Throttle;

/// How long the end or the cancel of a call is tried: a store down for longer lost its runs
/// or kept them; either way what the call reserved ends with the run's ttl.
const GIVE_BACK_FOR: Duration = Duration::from_secs(60);

/// How often at most the ends and cancels given up on are logged: a store that refuses
/// writes for a minute gives up on every call of that minute, a minute later.
pub(super) const GAVE_UP_EVERY: Duration = Duration::from_secs(10);

/// What the calls of a Redis store share.
pub struct Shared {
    pub(super) store: RedisStore,
    /// Shown by /readyz, never with a password.
    pub(super) shown: String,
    pub(super) ttl: Duration,
    pub(super) timeout: Duration,
    pub(super) on_error: OnStoreError,
    pub(super) metrics: RunMetrics,
    /// Store failures logged: at most one a second.
    pub(super) last_warning: Throttle,
    /// Ends and cancels given up on since that was last logged, and when it was.
    pub(super) gave_up: AtomicU64,
    pub(super) gave_up_warning: Throttle,
    /// The last failure, for /readyz.
    pub(super) last_error: Mutex<Option<(Instant, String)>>,
    /// This process's part of every call token, and its count of calls: a token names one
    /// call among every replica's.
    pub(super) nonce: u64,
    pub(super) calls: AtomicU64,
    /// The ends and cancels still being sent, which a shutdown waits for: dropped with the
    /// runtime, each would leave its call's reservation until it expires.
    pub(super) pending: TaskTracker,
    /// Whether the store's `maxmemory-policy` was read (once, after the first answer), and
    /// the policy if it may evict run keys: for /readyz.
    pub(super) policy_read: std::sync::atomic::AtomicBool,
    pub(super) evicting: Mutex<Option<String>>,
}

/// A number no other replica (nor this one started again) draws.
pub(super) fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

impl Shared {
    /// How long after its arrival a call's reservation is given back if its end never came
    /// (its replica was killed, the store restored from an older snapshot): once its budget
    /// is spent the call has ended, and its end is tried for `GIVE_BACK_FOR` more (each try
    /// up to `each`). No longer than `ttl` past the budget: a run with no other call would
    /// have been forgotten by then, and a short `ttl` gives a reservation back as soon.
    pub(super) fn reservation_life(&self, call_budget: Duration) -> Duration {
        let each = self.timeout.max(Duration::from_millis(500));
        call_budget + self.ttl.min(GIVE_BACK_FOR + each + Duration::from_secs(1))
    }

    /// Waits up to `within` for the ends and cancels still being sent (at shutdown, once no
    /// call is left to add one), or until `stop` (an operator's further signal). The number
    /// still unsent then.
    pub(super) async fn settle(&self, within: Duration, stop: impl Future<Output = ()>) -> usize {
        self.pending.close();
        tokio::select! {
            sent = tokio::time::timeout(within, self.pending.wait()) => {
                if sent.is_ok() {
                    return 0;
                }
            }
            () = stop => {}
        }
        self.pending.len()
    }

    /// A token for the next call's admission, unique across replicas.
    pub(super) fn token(&self) -> String {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{n:x}", self.nonce)
    }

    /// Reads the store's `maxmemory-policy` in the background, the first time the store
    /// answered: anything but `noeviction` may evict a run's key (each has a TTL, so the
    /// `volatile-*` policies as well), and the run then starts over silently with fresh
    /// limits (audit SE 5). Warned of once, and noted in /readyz. An ACL that denies
    /// `CONFIG GET` (the documented user's does) leaves one INFO line.
    pub(super) fn read_policy_once(self: &Arc<Self>) {
        if self.policy_read.swap(true, Ordering::Relaxed) {
            return;
        }
        let shared = self.clone();
        tokio::spawn(async move {
            match shared.store.eviction_policy().await {
                Ok(policy) if policy == "noeviction" => {}
                Ok(policy) => {
                    tracing::warn!(
                        store = %shared.shown,
                        policy,
                        "run store: Redis's maxmemory-policy {policy} may evict a run's key under memory pressure, and the run then starts over with fresh limits; set maxmemory-policy noeviction"
                    );
                    *shared.evicting.lock().unwrap_or_else(|p| p.into_inner()) = Some(policy);
                }
                Err(e) => tracing::info!(
                    store = %shared.shown,
                    error = %e,
                    "run store: could not read Redis's maxmemory-policy (runs need noeviction)"
                ),
            }
        });
    }

    pub(super) fn report(&self, e: &crate::runs::redis::Ended) {
        self.metrics.ended(
            &e.route,
            e.end.as_str(),
            e.calls,
            e.tokens,
            e.age.as_secs_f64(),
        );
    }

    pub(super) fn failed(&self, op: &str, e: &StoreError) {
        self.metrics.store_error(op);
        let now = Instant::now();
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some((now, e.to_string()));
        if self.last_warning.due() {
            // What the failure costs depends on the op: only an admission's refuses a call
            // or serves it unlimited; a call's end is sent again (audit SE 4: an end's
            // failure said calls were refused, and none was).
            let policy = match (op, self.on_error) {
                ("admit", OnStoreError::Allow) => {
                    "calls are served without run limits (on_store_error = allow)"
                }
                ("admit", OnStoreError::Deny) => {
                    "calls of runs are refused (on_store_error = deny)"
                }
                ("finish", _) => "a call's end is not applied yet, and is sent again",
                _ => "the admin's /runs lookup answered 503",
            };
            tracing::warn!(store = %self.shown, op, error = %e, "run store unavailable: {policy}");
        }
    }

    /// Gives a call's reservation back in the background (`finish.lua`, which gives back
    /// once, so it can be sent again). Tried like a cancel: a store that stalls for a moment
    /// just after the answer would otherwise keep the reservation, and the call in flight,
    /// until the run expires. `route` and `generation`: the run's, as its admission said them.
    pub(super) fn finish_later(
        self: &Arc<Self>,
        key: String,
        token: String,
        generation: String,
        reserve: u64,
        used: Used,
        route: Arc<str>,
    ) {
        let shared = self.clone();
        self.pending.spawn(async move {
            let finished = shared
                .until_answered(Some("finish"), &key, || {
                    shared
                        .store
                        .finish(&key, &token, &generation, reserve, &used, shared.ttl)
                })
                .await;
            match finished {
                Some(Finished::Given(Some(ended))) => shared.report(&ended),
                Some(Finished::Lost) => shared.lost(&route, &key),
                Some(Finished::Given(None)) | None => {}
            }
        });
    }

    /// The run at `key` (on `route`) was gone from the store at the end of one of its
    /// calls, which is the first to find it so (`finish.lua`): what it had used and how it
    /// ended are lost, and its next call starts it over with fresh limits. Counted under
    /// `hourglass_runs_total{end="lost"}` (without the histograms: its figures are gone) and
    /// warned of, once a run: an operator saw nothing of it (audit VA 3).
    fn lost(&self, route: &str, key: &str) {
        self.metrics.lost(route);
        tracing::warn!(
            store = %self.shown,
            run = key,
            route,
            "run store: run {key} was gone from the store at a call's end (evicted under Redis's maxmemory-policy, flushed, or expired): what it had used is lost, and its next call starts it over with fresh limits; run Redis with maxmemory-policy noeviction"
        );
    }

    /// Cancels, in the background, the admission of a call that stopped waiting for it. The
    /// script was sent: a store that was only slow runs it when it wakes, and what it
    /// reserved then would stay reserved, with nobody to give it back, for as long as the run
    /// lives. `served`: the call went on without run limits (it counts as a call, with
    /// nothing used that the run saw); else it counts nowhere.
    pub(super) fn cancel_later(self: &Arc<Self>, key: String, token: String, served: bool) {
        let shared = self.clone();
        self.pending.spawn(async move {
            let cancelled = shared
                .until_answered(None, &key, || {
                    shared.store.cancel(&key, &token, served, shared.ttl)
                })
                .await;
            if let Some(Some(ended)) = cancelled {
                shared.report(&ended);
            }
        });
    }

    /// Logs that the `op` (end or cancel) of a call of `run` was given up on: at most once
    /// per `GAVE_UP_EVERY`, with how many were given up on since the last line (this one
    /// included), naming the last.
    fn gave_up(&self, op: &str, run: &str) {
        self.gave_up.fetch_add(1, Ordering::Relaxed);
        if !self.gave_up_warning.due() {
            return;
        }
        let given_up = self.gave_up.swap(0, Ordering::Relaxed);
        tracing::warn!(
            store = %self.shown,
            run,
            op,
            given_up,
            "run store: gave up sending a call's {op} after {}s ({given_up} given up since the last such line, the last of run {run}); whatever those calls reserved is given back when it expires",
            GIVE_BACK_FOR.as_secs()
        );
    }

    /// Sends `op` (an idempotent script) until the store answers, with backoff, for at most
    /// `GIVE_BACK_FOR`. Each try waits at least 500 ms: a try cut short may leave its script
    /// half sent (EVALSHA answered NOSCRIPT, the SCRIPT LOAD never made), which is what a
    /// store that just stalled does to the first use of a script. The first failure counts
    /// under `op` (a cancel's does not: the admission it follows was counted). The answer,
    /// or none when given up: giving up is logged, naming the run (its key), whose
    /// reservation then stays until it expires.
    async fn until_answered<T, F, Fut>(&self, op: Option<&str>, run: &str, mut send: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let each = self.timeout.max(Duration::from_millis(500));
        let mut pause = Duration::from_millis(100);
        let give_up = Instant::now() + GIVE_BACK_FOR;
        let mut counted = false;
        loop {
            let done = tokio::time::timeout(each, send())
                .await
                .unwrap_or_else(|_| Err(self.store.timed_out(each)));
            match done {
                Ok(answer) => return Some(answer),
                Err(e) if !counted => {
                    if let Some(op) = op {
                        self.failed(op, &e);
                    }
                    counted = true;
                }
                Err(_) => {}
            }
            if Instant::now() + pause > give_up {
                self.gave_up(op.unwrap_or("cancel"), run);
                return None;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::json::tests::Captured;
    use crate::telemetry::metrics::Metrics;

    /// A store at a port nothing listens on.
    /// The log of this thread's tracing, captured while the guard lives.
    fn logged() -> (Captured, tracing::subscriber::DefaultGuard) {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        (out, tracing::subscriber::set_default(subscriber))
    }

    /// The whole log, and its "gave up" lines.
    fn gave_up_lines(out: &Captured) -> (String, Vec<String>) {
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines = text
            .lines()
            .filter(|l| l.contains("gave up"))
            .map(str::to_owned)
            .collect();
        (text, lines)
    }

    fn unreachable() -> Arc<Shared> {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("redis://{}/0", closed.local_addr().unwrap());
        drop(closed);
        let timeout = Duration::from_millis(50);
        Arc::new(Shared {
            store: RedisStore::new(std::slice::from_ref(&url), timeout, None, false).unwrap(),
            shown: url,
            ttl: Duration::from_secs(60),
            timeout,
            on_error: OnStoreError::Deny,
            metrics: Metrics::new().runs().clone(),
            last_warning: Throttle::every(Duration::from_secs(1)),
            gave_up: AtomicU64::new(0),
            gave_up_warning: Throttle::every(GAVE_UP_EVERY),
            last_error: Mutex::new(None),
            nonce: 1,
            calls: AtomicU64::new(0),
            pending: TaskTracker::new(),
            policy_read: std::sync::atomic::AtomicBool::new(false),
            evicting: Mutex::new(None),
        })
    }

    /// A store's answer that never comes: it fails.
    async fn down() -> Result<(), StoreError> {
        Err(StoreError::Failed("down".to_owned()))
    }

    /// An end given up on after its minute of tries says so, naming its run (audit GA 1: it
    /// was silent, and the run kept the call's reservation with no trace in the log).
    #[tokio::test(start_paused = true)]
    async fn an_end_given_up_on_is_logged_with_its_run() {
        let shared = unreachable();
        let (out, _log) = logged();
        let tries = AtomicU64::new(0);
        shared
            .until_answered(Some("finish"), "hg:{-/lost}", || {
                tries.fetch_add(1, Ordering::Relaxed);
                down()
            })
            .await;
        assert!(tries.load(Ordering::Relaxed) > 1, "tried again");
        let (text, gave_up) = gave_up_lines(&out);
        assert_eq!(gave_up.len(), 1, "{text}");
        assert!(gave_up[0].contains("WARN"), "{text}");
        assert!(gave_up[0].contains("hg:{-/lost}"), "{text}");
    }

    /// Ends and cancels given up on in a burst (a store refusing writes for a minute) are
    /// said in one line with their count, not one line each (audit MD 1: 7,239 lines for
    /// 7,239 calls).
    #[tokio::test(start_paused = true)]
    async fn ends_given_up_on_together_are_logged_once_with_their_count() {
        let shared = unreachable();
        let (out, _log) = logged();
        for run in ["hg:{-/a}", "hg:{-/b}", "hg:{-/c}"] {
            shared.until_answered(Some("finish"), run, down).await;
        }
        let (text, gave_up) = gave_up_lines(&out);
        assert_eq!(gave_up.len(), 1, "{text}");
        assert!(gave_up[0].contains("hg:{-/a}"), "{text}");
        // The next line, a period later, counts those it left unsaid.
        shared.gave_up_warning.reset_for_test();
        shared.until_answered(None, "hg:{-/d}", down).await;
        let (text, gave_up) = gave_up_lines(&out);
        assert_eq!(gave_up.len(), 2, "{text}");
        assert!(gave_up[1].contains("given_up=3"), "{text}");
        assert!(gave_up[1].contains("hg:{-/d}"), "{text}");
    }

    /// An end's failure is not said as an admission's: no call is refused for it (audit
    /// SE 4: "calls of runs are refused (on_store_error = deny)", for an end sent again).
    #[tokio::test]
    async fn an_ends_failure_does_not_say_calls_are_refused() {
        let shared = unreachable();
        let (out, _log) = logged();
        shared.failed("finish", &StoreError::Failed("broken pipe".to_owned()));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("op=\"finish\""), "{text}");
        assert!(!text.contains("refused"), "{text}");
        assert!(text.contains("sent again"), "{text}");
        shared.last_warning.reset_for_test();
        shared.failed("admit", &StoreError::Failed("broken pipe".to_owned()));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("calls of runs are refused"), "{text}");
    }

    /// A shutdown's wait for the ends still being sent is bounded, and says how many it
    /// left (audit GA 2).
    #[tokio::test(start_paused = true)]
    async fn the_wait_for_unsent_ends_is_bounded() {
        let shared = unreachable();
        shared.cancel_later("hg:{-/lost}".to_owned(), "t1".to_owned(), false);
        let forever = std::future::pending::<()>;
        assert_eq!(shared.settle(Duration::from_secs(10), forever()).await, 1);
        let shared = unreachable();
        assert_eq!(shared.settle(Duration::from_secs(10), forever()).await, 0);
    }

    /// A further signal ends the wait at once, and it still says how many it left: the
    /// process waited out the whole grace (30 s) after the second signal said it cut
    /// (audit HA 4).
    #[tokio::test(start_paused = true)]
    async fn a_further_signal_ends_the_wait_for_unsent_ends() {
        let shared = unreachable();
        shared.cancel_later("hg:{-/lost}".to_owned(), "t1".to_owned(), false);
        let t = Instant::now();
        let stop = tokio::time::sleep(Duration::from_secs(2));
        assert_eq!(shared.settle(Duration::from_secs(30), stop).await, 1);
        assert_eq!(t.elapsed(), Duration::from_secs(2));
    }
}
