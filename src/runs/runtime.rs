//! The gateway's runs: the store they live in (this process's memory, or Redis shared by
//! every replica), the metrics they report, and the admission that turns a run's refusal,
//! or a store that cannot answer, into the client's answer.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::{OnStoreError, RunLimits, RunStore, RunsConfig};
use crate::error::GatewayError;
use crate::runs::call::{InRedis, RunCall, Ticket};
use crate::runs::id::RunKey;
use crate::runs::memory::{Ends, MemoryStore};
use crate::runs::redis::{key_of, RedisAdmission, RedisStore};
use crate::runs::shared::Shared;
use crate::runs::state::{Call, Refusal, RunEnd, RunOf, RunState, View};
use crate::telemetry::metrics::RunMetrics;
use crate::telemetry::throttle::Throttle;

/// How a call joined its run.
#[derive(Debug)]
pub enum Joined {
    /// Boxed: the call is large, and passed on at once.
    Call(Box<RunCall>),
    /// The store could not answer, and `on_store_error = "allow"`: the call is served
    /// without run limits.
    Unlimited,
    /// The store had not answered when the call's own budget had no more to give it than
    /// the upstream call needs: the call cannot be made (not the store's failure).
    OutOfTime,
}

/// An admission sent to the store and not yet answered, given back if dropped unanswered.
struct Abandoned {
    shared: Option<Arc<Shared>>,
    key: String,
    token: String,
}

impl Abandoned {
    /// The wait ended: the caller decides what becomes of the admission.
    fn disarm(mut self) {
        self.shared = None;
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        // Dropped with its task when a runtime shuts down: nothing to spawn on then, and
        // the reservation expires (admit.lua gives it back).
        if tokio::runtime::Handle::try_current().is_ok() {
            let (key, token) = (
                std::mem::take(&mut self.key),
                std::mem::take(&mut self.token),
            );
            shared.cancel_later(key, token, false);
        }
    }
}

pub struct Runs {
    /// The `[runs]` table this was made with; reloads keep the runs, and so this table.
    config: RunsConfig,
    store: Store,
    metrics: RunMetrics,
    sweeper: Option<JoinHandle<()>>,
}

enum Store {
    Memory(Arc<MemoryStore>),
    Redis(Arc<Shared>),
}

/// Reports each run's end to the metrics, once.
struct Reporter(RunMetrics);

impl Ends for Reporter {
    fn ended(&self, run: &RunState, end: RunEnd, now: Instant) {
        self.0.ended(
            &run.route,
            end.as_str(),
            u64::from(run.calls),
            run.tokens_used,
            run.ended_at(end, now)
                .saturating_duration_since(run.started)
                .as_secs_f64(),
        );
    }

    fn held(&self, runs: usize) {
        self.0.active.set(runs as i64);
    }
}

impl Runs {
    /// The runs of a gateway, kept across reloads. With the memory store, spawns the task
    /// that forgets expired runs when no call comes to do it (so it must be called within
    /// the runtime).
    pub fn new(config: &RunsConfig, metrics: &RunMetrics) -> Result<Arc<Self>, String> {
        let store = match &config.store {
            RunStore::Memory => Store::Memory(Arc::new(MemoryStore::new(
                config.max_runs,
                config.ttl,
                Arc::new(Reporter(metrics.clone())),
            ))),
            RunStore::Redis(url) => Store::Redis(Arc::new(Shared {
                store: RedisStore::new(
                    &store_urls(&with_password(url, config)?, config)?,
                    config.store_timeout,
                    store_ca(config)?,
                    config.store_cluster,
                )
                .map_err(|e| format!("runs: store: {e}"))?,
                shown: crate::config::redacted_url(url),
                ttl: config.ttl,
                timeout: config.store_timeout,
                on_error: config.on_store_error,
                metrics: metrics.clone(),
                last_warning: Throttle::every(Duration::from_secs(1)),
                gave_up: AtomicU64::new(0),
                gave_up_warning: Throttle::every(crate::runs::shared::GAVE_UP_EVERY),
                last_error: Mutex::new(None),
                nonce: crate::runs::shared::nonce(),
                calls: AtomicU64::new(0),
                pending: tokio_util::task::TaskTracker::new(),
                policy_read: std::sync::atomic::AtomicBool::new(false),
                evicting: Mutex::new(None),
            })),
        };
        Ok(Arc::new_cyclic(|me: &Weak<Runs>| {
            let sweeper = matches!(store, Store::Memory(_)).then(|| {
                let me = me.clone();
                let every =
                    (config.ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(10));
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(every);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tick.tick().await;
                        let Some(runs) = me.upgrade() else { return };
                        if let Store::Memory(m) = &runs.store {
                            m.expire(Instant::now());
                        }
                    }
                })
            });
            Runs {
                config: config.clone(),
                store,
                metrics: metrics.clone(),
                sweeper,
            }
        }))
    }

    /// The `[runs]` table these runs were made with, which reloads do not change.
    pub fn config(&self) -> &RunsConfig {
        &self.config
    }

    /// Admits one call of the run `key` on `route` (a run that has no limits yet takes its
    /// `limits`: `RunState::take_limits`), by
    /// `bound` at the latest (past it, the call's budget cannot fit the upstream call).
    /// `Err`: the client's answer, with what the run has left when the run refused it.
    pub async fn admit(
        &self,
        key: &RunKey,
        route: &Arc<str>,
        limits: &RunLimits,
        call: &Call,
        bound: Instant,
        call_budget: Duration,
    ) -> Result<Joined, (GatewayError, Option<View>)> {
        match &self.store {
            Store::Memory(store) => {
                let (entry, result) = store.admit(key, route, limits, call);
                let (run_limits, run_route) = {
                    let r = entry.lock().unwrap_or_else(|p| p.into_inner());
                    (r.limits, r.route.clone())
                };
                match result {
                    Ok(admitted) => Ok(Joined::Call(Box::new(RunCall::new(
                        Ticket::Memory(store.clone(), entry),
                        call,
                        key.id.clone(),
                        admitted,
                        RunOf {
                            max_tokens: run_limits.max_tokens,
                            stops_loops: run_limits.max_repeats.is_some(),
                        },
                        (run_route, self.metrics.clone()),
                    )))),
                    Err((refusal, view)) => {
                        self.metrics.refused(&run_route, refusal.reason());
                        Err((refusal_error(&key.id, refusal), Some(view)))
                    }
                }
            }
            Store::Redis(shared) => {
                self.admit_shared(shared, key, route, limits, call, bound, call_budget)
                    .await
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn admit_shared(
        &self,
        shared: &Arc<Shared>,
        key: &RunKey,
        route: &Arc<str>,
        limits: &RunLimits,
        call: &Call,
        bound: Instant,
        call_budget: Duration,
    ) -> Result<Joined, (GatewayError, Option<View>)> {
        let left = bound.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Joined::OutOfTime);
        }
        // The call's own budget, not the store, is what runs out first.
        let budget_bound = left < shared.timeout;
        let wait = shared.timeout.min(left);
        let expire = shared.ttl + call_budget;
        let token = shared.token();
        // Until the store answers or the wait ends, this call may be dropped (its client
        // left): the admission script may still run, so it is given back then too.
        let abandoned = Abandoned {
            shared: Some(shared.clone()),
            key: key_of(key),
            token: token.clone(),
        };
        let answer = tokio::time::timeout(
            wait,
            shared.store.admit(
                key,
                route,
                limits,
                call,
                expire,
                shared.reservation_life(call_budget),
                &token,
            ),
        )
        .await;
        abandoned.disarm();
        let answer = match answer {
            Ok(answer) => answer,
            Err(_) if budget_bound => {
                shared.cancel_later(key_of(key), token, false);
                return Ok(Joined::OutOfTime);
            }
            Err(_) => Err(shared.store.timed_out(wait)),
        };
        if answer.is_ok() {
            shared.read_policy_once();
        }
        match answer {
            Ok(RedisAdmission::Admitted(admitted, run, run_route, generation)) => {
                Ok(Joined::Call(Box::new(RunCall::new(
                    Ticket::Redis(
                        shared.clone(),
                        Box::new(InRedis {
                            key: key_of(key),
                            token,
                            generation,
                        }),
                    ),
                    call,
                    key.id.clone(),
                    admitted,
                    run,
                    (run_route, self.metrics.clone()),
                ))))
            }
            Ok(RedisAdmission::Refused {
                refusal,
                view,
                ended,
                route: run_route,
            }) => {
                self.metrics.refused(&run_route, refusal.reason());
                if let Some(mut e) = ended {
                    // Refused past its deadline, the run ended at that deadline, not when
                    // this late call came (as the memory store counts it: `ended_at`).
                    if let Refusal::Deadline { budget, .. } = &refusal {
                        e.age = e.age.min(*budget);
                    }
                    shared.report(&e);
                }
                Err((refusal_error(&key.id, refusal), Some(view)))
            }
            Err(e) => {
                shared.failed("admit", &e);
                // A timeout, a dropped connection, a script failed midway: the script may
                // have run or may still, so what it took is given back, or it is made a
                // no-op (cancel.lua, idempotent, sent until answered). An error reply given
                // before its first write (OOM, READONLY, ...) left nothing to cancel, and a
                // cancel would be refused alike for as long (audit MD 1); nor did one whose
                // connection was never opened (audit SE 2).
                if e.may_have_run() {
                    let served = shared.on_error == OnStoreError::Allow;
                    shared.cancel_later(key_of(key), token, served);
                }
                match shared.on_error {
                    OnStoreError::Allow => Ok(Joined::Unlimited),
                    OnStoreError::Deny => Err((
                        GatewayError::RunStoreUnavailable {
                            reason: format!("{} ({})", e, shared.shown),
                        },
                        None,
                    )),
                }
            }
        }
    }

    /// Every run with this id (one per client key scope), for the admin listener.
    pub async fn find(&self, id: &str) -> Result<Vec<(RunKey, RunState)>, String> {
        match &self.store {
            Store::Memory(m) => Ok(m.find(id)),
            Store::Redis(shared) => {
                tokio::time::timeout(Duration::from_secs(2), shared.store.find(id))
                    .await
                    .unwrap_or_else(|_| Err(shared.store.timed_out(Duration::from_secs(2))))
                    // As a call's 503 says it: the limit's name first, the store's last.
                    .map_err(|e| {
                        // Seen by `/readyz` and the metric as a call's failure is: an
                        // operator asking why a run was refused learns the store is down
                        // there too (audit OB 3).
                        shared.failed("find", &e);
                        GatewayError::RunStoreUnavailable {
                            reason: format!("{e} ({})", shared.shown),
                        }
                        .to_string()
                    })
            }
        }
    }

    /// At shutdown, once the connections have drained: waits up to `within` for the run
    /// store's ends and cancels still being sent (a store slow just then would otherwise
    /// keep those calls' reservations until they expire), or until `stop`; and says how many
    /// it gave up on.
    pub async fn settle(&self, within: Duration, stop: impl std::future::Future<Output = ()>) {
        let Store::Redis(shared) = &self.store else {
            return;
        };
        let unsent = shared.settle(within, stop).await;
        if unsent > 0 {
            tracing::warn!(
                store = %shared.shown,
                unsent,
                ?within,
                "run store: {unsent} call ends or cancels still unsent at shutdown; their reservations are given back when they expire"
            );
        }
    }

    /// Where runs are kept and how the store is doing, for /readyz.
    pub fn describe(&self) -> String {
        match &self.store {
            Store::Memory(_) => "runs: memory".to_owned(),
            Store::Redis(s) => {
                let policy = match s.on_error {
                    OnStoreError::Allow => "allow",
                    OnStoreError::Deny => "deny",
                };
                let last = s
                    .last_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                let evicting = s
                    .evicting
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .map(|p| format!("; maxmemory-policy {p} may evict runs (use noeviction)"))
                    .unwrap_or_default();
                match last {
                    Some((at, e)) if at.elapsed() < Duration::from_secs(30) => format!(
                        "runs: {} (on_store_error = {policy}){evicting}; unavailable {}s ago: {e}",
                        s.shown,
                        at.elapsed().as_secs()
                    ),
                    _ => format!("runs: {} (on_store_error = {policy}){evicting}", s.shown),
                }
            }
        }
    }

    /// Creates a route's run series at zero.
    pub fn init_metrics(&self, route: &str) {
        let mut ends: Vec<&str> = RunEnd::ALL.iter().map(|e| e.as_str()).collect();
        ends.push(crate::telemetry::metrics::RUN_LOST);
        self.metrics
            .init(route, &ends, &["deadline", "calls", "tokens", "loop"]);
    }
}

impl Drop for Runs {
    fn drop(&mut self) {
        if let Some(s) = self.sweeper.take() {
            s.abort();
        }
    }
}

/// The certificates of `store_ca_file`, when one is named, read as start-up and `check` read
/// them: a file without one would leave nothing trusted, and every command failing.
pub fn store_ca(config: &RunsConfig) -> Result<Option<Vec<u8>>, String> {
    let Some(path) = &config.store_ca_file else {
        return Ok(None);
    };
    let failed = |e: String| format!("runs: store_ca_file {}: {e}", path.display());
    let pem =
        crate::config::file::read(path).map_err(|e| failed(format!("failed to read file: {e}")))?;
    crate::pem::certs(&pem).map_err(failed)?;
    Ok(Some(pem))
}

/// The store URL with the password of `store_password_env` in it, when one is named.
/// `url` (the store, with its password), then the other cluster nodes that `store_nodes`
/// names, each reached as it is.
fn store_urls(url: &str, config: &RunsConfig) -> Result<Vec<String>, String> {
    let mut urls = vec![url.to_owned()];
    for node in &config.store_nodes {
        urls.push(crate::config::node_url(url, node)?);
    }
    Ok(urls)
}

fn with_password(url: &str, config: &RunsConfig) -> Result<String, String> {
    let Some(var) = &config.store_password_env else {
        return Ok(url.to_owned());
    };
    let password = std::env::var(var).map_err(|e| {
        format!(
            "runs: store_password_env {}: {e}",
            crate::config::var_shown(var)
        )
    })?;
    Ok(credentials(url, &password))
}

/// `url` with `password` as the variable holds it: trimmed, as provider keys are (a secret
/// made with `--from-file` or `echo pw > file` ends in a newline, and a Redis password cannot),
/// beside the URL's username if it names an ACL user.
fn credentials(url: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
    // Percent-encoded: a password may hold any byte the URL syntax reserves.
    let encoded: String = password
        .trim()
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect();
    // The config refuses a URL with a password of its own beside the variable: a userinfo
    // here is a username.
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((user, _)) => {
            let host = &rest[user.len() + 1..];
            format!("{scheme}://{user}:{encoded}@{host}")
        }
        None => format!("{scheme}://:{encoded}@{rest}"),
    }
}

fn refusal_error(id: &str, refusal: Refusal) -> GatewayError {
    let run = id.to_owned();
    match refusal {
        Refusal::Deadline { budget, left } => GatewayError::RunDeadlineExceeded {
            run,
            budget,
            left,
            reserve: Duration::ZERO,
            need: None,
        },
        Refusal::Calls { limit } => GatewayError::RunCallLimit { run, limit },
        Refusal::Tokens {
            limit,
            used,
            reserved,
            asked,
        } => GatewayError::RunTokenLimit {
            run,
            limit,
            used,
            reserved,
            asked,
        },
        Refusal::Loop(r) => GatewayError::RunLoopDetected {
            run,
            tool: r.tool,
            count: r.count,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::metrics::Metrics;

    /// The line of `text` (a scrape) that starts with `name`.
    fn sample(text: &str, name: &str) -> String {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .to_owned()
    }

    /// A password from the environment is trimmed as provider keys are (a Kubernetes secret
    /// made `--from-file` ends in a newline, which AUTH refused), and goes beside the URL's
    /// ACL username when it names one.
    #[test]
    fn a_password_from_the_environment_is_trimmed_and_joins_an_acl_username() {
        assert_eq!(
            credentials("redis://127.0.0.1:6379/0", "S3cr3t:p@ss/w0rd#x\n"),
            "redis://:S3cr3t%3Ap%40ss%2Fw0rd%23x@127.0.0.1:6379/0"
        );
        assert_eq!(
            credentials("rediss://hguser@redis.internal:6380/2", " UserPw!42\r\n"),
            "rediss://hguser:UserPw%2142@redis.internal:6380/2"
        );
        // An `@` past the host is not a username's.
        assert_eq!(
            credentials("redis://h:6379/0?client_name=a@b", "pw"),
            "redis://:pw@h:6379/0?client_name=a@b"
        );
    }

    fn memory_runs(metrics: &Metrics) -> Arc<Runs> {
        Runs::new(
            &RunsConfig {
                ttl: Duration::from_secs(60),
                max_runs: 10,
                store: crate::config::RunStore::Memory,
                store_password_env: None,
                store_ca_file: None,
                store_cluster: false,
                store_nodes: Vec::new(),
                store_timeout: Duration::from_millis(50),
                on_store_error: crate::config::OnStoreError::Allow,
            },
            metrics.runs(),
        )
        .unwrap()
    }

    fn call(now: Instant) -> Call {
        Call {
            reserve: 0,
            asked_budget: None,
            request: None,
            at: now,
            now,
            need: Duration::ZERO,
        }
    }

    /// A call of the run `id` on route `r` under `limits`, admitted now (the test fails
    /// otherwise), its deadline far off.
    async fn admitted(runs: &Runs, id: &str, limits: &RunLimits) -> RunCall {
        let key = RunKey {
            scope: None,
            id: id.into(),
        };
        let far = Instant::now() + Duration::from_secs(600);
        let joined = runs
            .admit(
                &key,
                &"r".into(),
                limits,
                &call(Instant::now()),
                far,
                Duration::ZERO,
            )
            .await
            .unwrap();
        let Joined::Call(admitted) = joined else {
            panic!("admitted: {joined:?}")
        };
        *admitted
    }

    /// A run that stops calling is forgotten `ttl` later, by a sweep: it lasted from its
    /// first call to the end of its last, not until it was forgotten (which added the whole
    /// `ttl` and the sweep's lag, and put every run past the histogram's last bucket).
    #[tokio::test(start_paused = true)]
    async fn an_expired_run_lasted_until_its_last_call_ended() {
        let metrics = Metrics::new();
        let runs = memory_runs(&metrics);
        for _ in 0..2 {
            let mut admitted = admitted(&runs, "d", &RunLimits::UNLIMITED).await;
            admitted.sent();
            tokio::time::advance(Duration::from_secs(3)).await;
            drop(admitted);
        }
        // Past the ttl and a sweep or two.
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(
            runs.find("d").await.unwrap_or_default().is_empty(),
            "forgotten"
        );
        let text = metrics.encode();
        let sample = |name: &str| sample(&text, name);
        assert_eq!(
            sample("hourglass_run_duration_seconds_sum{route=\"r\"}"),
            "hourglass_run_duration_seconds_sum{route=\"r\"} 6"
        );
        assert!(sample("hourglass_runs_total{end=\"expired\",route=\"r\"}").ends_with(" 1"));
    }

    /// A run that simply stops calling, with a budget shorter than the ttl: it lasted its
    /// calls, not its whole budget, and it expired, for nothing ever met its deadline.
    #[tokio::test(start_paused = true)]
    async fn a_run_that_stopped_calling_before_its_deadline_expired_when_its_last_call_ended() {
        let metrics = Metrics::new();
        let runs = memory_runs(&metrics);
        runs.init_metrics("r");
        let limits = RunLimits {
            budget: Some(Duration::from_secs(3)),
            ..RunLimits::UNLIMITED
        };
        for _ in 0..2 {
            let mut admitted = admitted(&runs, "quick", &limits).await;
            admitted.sent();
            tokio::time::advance(Duration::from_millis(1)).await;
            drop(admitted);
        }
        // Past the deadline, the ttl and a sweep or two.
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(runs.find("quick").await.unwrap_or_default().is_empty());
        let text = metrics.encode();
        let sample = |name: &str| sample(&text, name);
        assert_eq!(
            sample("hourglass_run_duration_seconds_sum{route=\"r\"}"),
            "hourglass_run_duration_seconds_sum{route=\"r\"} 0.002"
        );
        assert!(sample("hourglass_runs_total{end=\"expired\",route=\"r\"}").ends_with(" 1"));
        assert!(sample("hourglass_runs_total{end=\"deadline\",route=\"r\"}").ends_with(" 0"));
    }

    /// A call refused before it was sent, its run's time left too short for its upstream,
    /// is no call of its run, but the run met its deadline: so it ended, once forgotten.
    #[tokio::test(start_paused = true)]
    async fn a_run_whose_call_did_not_fit_its_time_left_ended_by_its_deadline() {
        let metrics = Metrics::new();
        let runs = memory_runs(&metrics);
        runs.init_metrics("r");
        let limits = RunLimits {
            budget: Some(Duration::from_millis(600)),
            ..RunLimits::UNLIMITED
        };
        let admitted = admitted(&runs, "short", &limits).await;
        admitted.finish(&crate::runs::state::Used {
            run_deadline: true,
            ..Default::default()
        });
        assert_eq!(runs.find("short").await.unwrap()[0].1.calls, 0);
        tokio::time::sleep(Duration::from_secs(100)).await;
        let text = metrics.encode();
        assert!(
            text.contains("hourglass_runs_total{end=\"deadline\",route=\"r\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("hourglass_run_duration_seconds_sum{route=\"r\"} 0.6"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_call_that_panics_gives_its_reservation_back() {
        let metrics = Metrics::new();
        let runs = memory_runs(&metrics);
        let key = RunKey {
            scope: None,
            id: "p".into(),
        };
        let limits = RunLimits {
            max_tokens: Some(1000),
            ..RunLimits::UNLIMITED
        };
        let now = Instant::now();
        let call = Call {
            reserve: 400,
            asked_budget: None,
            request: None,
            at: now,
            now,
            need: Duration::ZERO,
        };
        let far = now + Duration::from_secs(60);
        let admitted = runs
            .admit(
                &key,
                &"r".into(),
                &limits,
                &call,
                far,
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        let Joined::Call(mut admitted) = admitted else {
            panic!("admitted: {admitted:?}")
        };
        // Sent: it counts as a call of the run however it ends.
        admitted.sent();
        assert_eq!(runs.find("p").await.unwrap()[0].1.tokens_reserved, 400);
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _held = admitted;
            panic!("a bug in the handler");
        }));
        assert!(unwound.is_err());
        let run = &runs.find("p").await.unwrap()[0].1;
        assert_eq!((run.tokens_reserved, run.in_flight, run.calls), (0, 0, 1));
    }
}
