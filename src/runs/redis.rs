//! The run store on Redis (or Valkey), shared by every replica behind a load balancer.
//!
//! A run is one hash, `hg:{SCOPE/ID}`: the braces are a hash tag, so Redis Cluster keeps all
//! of a run on one slot. Admission and the end of a call are each one Lua script run by its
//! SHA (`admit.lua`, `finish.lua`: the rules of `state.rs`, checked and applied in one step,
//! never a read followed by a write), with Redis's own clock (`TIME`) for every instant, so
//! replicas whose clocks differ agree on a run's deadline. Every key expires `ttl` after its
//! last call (longer while a call may still be in flight), so the store never grows without
//! bound. A replica that dies mid-call (or a store restored from an older snapshot, or an
//! end given up after its retries) leaves that call's reservation behind, with its expiry
//! (`e:TOKEN`): the call's budget plus the time its end is retried; the run's next admission
//! gives back the expired ones (the earliest expiry is kept in `reclaim`, so the hash is
//! looked through only once one has passed).
//!
//! Each admission carries a call token, and the run's hash holds `p:TOKEN` (what the call
//! reserved) until the call's end gives it back, once. A call that stops waiting for its
//! admission (the store slow, or its own budget spent) sends `cancel.lua`, which gives back
//! an admission already made, or leaves a tombstone (the field `x:TOKEN` of the run's hash)
//! that turns one still on its way into a no-op: a store that was only paused never keeps a
//! reservation nobody will give back. A tombstone lives the run's `ttl`, then a later
//! admission prunes it, as it gives back expired reservations. Every script names the run's
//! hash alone: in a cluster, a script of two keys with one missing is refused (TRYAGAIN) all
//! the while its slot migrates, which turned a run's calls into store errors for as long
//! (audit W). Each run holds its generation (`gen`, the token of the call that started it),
//! which every admitted call carries back to its end: a run lost from the store and started
//! over in the same key by a new call is told apart from the one the end's call was in, and
//! its loss counted (audit VC 6).
//!
//! One multiplexed connection (`ConnectionManager`), opened lazily and reopened by the next
//! command that needs it: a gateway starts while Redis is down, and its runs resume when
//! Redis is back.
//! With `store_cluster`, a cluster client instead (connected at first use, and made anew by
//! a command that finds its connection dropped): every script names its run's keys, one hash
//! tag, so it runs on the node of that slot.

mod errors;

pub use self::errors::StoreError;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, Script, ScriptInvocation, Value};
use tokio::time::Instant;

use crate::config::{RunLimits, MAX_RUN_TOKENS};
use crate::provider::tools::MAX_NAMES;
use crate::runs::id::RunKey;
use crate::runs::state::{
    Admitted, Answer, Call, Refusal, Repeat, RunEnd, RunOf, RunState, Used, View,
};
use crate::telemetry::log::{clipped, key_hex};

use self::errors::{acl_denial, dropped, never_sent, unreached};

const ADMIT_LUA: &str = include_str!("redis/admit.lua");
const FINISH_LUA: &str = include_str!("redis/finish.lua");
const CANCEL_LUA: &str = include_str!("redis/cancel.lua");

/// How commands reach the store.
enum Link {
    /// One server (or the primary of one with replicas).
    Single(Box<Single>),
    /// A Redis Cluster, connected at first use (a gateway starts while the cluster is down;
    /// a connection that failed is tried again by the next command).
    Cluster(Box<LazyCluster>),
}

/// One server's connection manager, and what makes a new one.
///
/// The manager reconnects by itself only after an I/O error: a connection refused its
/// password (rotated, or an ACL user made after the gateway started), or its database, is
/// kept with its error, which every later command then gets, and Redis never hears from the
/// gateway again until a restart (audit IE 1). So an error of any other kind (but a
/// redirection, which a new connection would get again) makes a new manager, at most once
/// a second: a store that still refuses costs one connection a second, and one that takes
/// the password again is used within that second.
struct Single {
    client: redis::Client,
    config: ConnectionManagerConfig,
    manager: arc_swap::ArcSwap<ConnectionManager>,
    /// When the manager was last made anew; held for a compare and a store, never across an
    /// await.
    renewed: std::sync::Mutex<Option<Instant>>,
}

/// How often at most `Single` makes a new manager, and `LazyCluster` tries to connect.
const RENEW_EVERY: Duration = Duration::from_secs(1);

impl Single {
    fn new(client: redis::Client, config: ConnectionManagerConfig) -> Result<Self, String> {
        let manager = Self::manager(&client, &config)?;
        Ok(Self {
            client,
            config,
            manager: arc_swap::ArcSwap::from_pointee(manager),
            renewed: std::sync::Mutex::new(None),
        })
    }

    fn manager(
        client: &redis::Client,
        config: &ConnectionManagerConfig,
    ) -> Result<ConnectionManager, String> {
        ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(|e| e.to_string())
    }

    /// After a command's error `e`: a new manager, if `e` is one the old one keeps.
    fn renew_after(&self, e: &redis::RedisError) {
        if e.is_io_error()
            || matches!(
                e.kind(),
                redis::ErrorKind::Server(
                    redis::ServerErrorKind::Moved | redis::ServerErrorKind::Ask
                )
            )
        {
            return;
        }
        {
            let mut renewed = self
                .renewed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if renewed.is_some_and(|at| at.elapsed() < RENEW_EVERY) {
                return;
            }
            *renewed = Some(Instant::now());
        }
        // Lazy: it connects at its first command. Commands under way keep the old one.
        if let Ok(manager) = Self::manager(&self.client, &self.config) {
            self.manager.store(Arc::new(manager));
        }
    }
}

struct LazyCluster {
    client: ClusterClient,
    /// The connection commands share: made by the first command, and made anew by one that
    /// found it dropped (see `RedisStore::reconnected`).
    conn: arc_swap::ArcSwapOption<Made>,
    /// Held while a connection is made, so that commands that find it missing or dropped
    /// together make one.
    connecting: tokio::sync::Mutex<()>,
    /// The last failed attempt to connect, and when: the next is made a second after it at
    /// the soonest, every command between given its error. Each attempt opens a connection to
    /// every node (and retries): a cluster that refused the password took 17,816 connections
    /// in 5 s from one gateway under load, and filled its ports with TIME_WAIT (audit JA 1).
    /// Held for a compare and a store, never across an await.
    failed: std::sync::Mutex<Option<(Instant, redis::RedisError)>>,
}

/// A cluster connection, and when it was made.
struct Made {
    at: Instant,
    conn: ClusterConnection,
}

impl LazyCluster {
    /// The shared connection; the first command makes it.
    async fn get(&self) -> redis::RedisResult<Arc<Made>> {
        match self.conn.load_full() {
            Some(conn) => Ok(conn),
            None => self.renew(None, false).await,
        }
    }

    /// A new connection in place of `stale` (`None`: none was made yet), unless another
    /// command made one since: then that one. After a `refused` connection too, unless the
    /// one there was made within the last second: a node that is down (until its replica
    /// takes over) refuses every command of its slots, and each would otherwise make a
    /// connection to every node.
    async fn renew(
        &self,
        stale: Option<&Arc<Made>>,
        refused: bool,
    ) -> redis::RedisResult<Arc<Made>> {
        let _one = self.connecting.lock().await;
        if let Some(current) = self.conn.load_full() {
            let young = refused && current.at.elapsed() < RENEW_EVERY;
            if young || stale.is_none_or(|stale| !Arc::ptr_eq(stale, &current)) {
                return Ok(current);
            }
        }
        let fresh = Arc::new(Made {
            at: Instant::now(),
            conn: self.connect().await?,
        });
        self.conn.store(Some(fresh.clone()));
        Ok(fresh)
    }

    async fn connect(&self) -> redis::RedisResult<ClusterConnection> {
        let failed = || {
            self.failed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if let Some((at, e)) = failed().as_ref() {
            if at.elapsed() < RENEW_EVERY {
                return Err(e.clone());
            }
        }
        let connected = self.client.get_async_connection().await;
        if let Err(e) = &connected {
            *failed() = Some((Instant::now(), e.clone()));
        }
        connected
    }
}

/// The connection one command takes (a clone: both kinds are handles to a shared one).
/// A cluster's keeps the shared one it was cloned from, to make a new one in its place.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection, Arc<Made>),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c, _) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c, _) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c, _) => c.get_db(),
        }
    }
}

pub struct RedisStore {
    link: Link,
    /// The last error a command met, and when (see `StoreError::Timeout`). Held for a store
    /// and a copy only, never across an await.
    last_error: std::sync::Mutex<Option<(Instant, String)>>,
    admit: Script,
    finish: Script,
    cancel: Script,
}

/// What an admission in Redis said.
pub enum RedisAdmission {
    /// Admitted into a run with these limits (the run's, fixed by the first of its calls'
    /// routes with run keys), the run's route, and its generation (the call's end gives it
    /// back to `finish`; empty for a run a previous release started and did not stamp).
    Admitted(Admitted, RunOf, Arc<str>, String),
    Refused {
        refusal: Refusal,
        view: View,
        /// This call ended the run (one replica sees it, once).
        ended: Option<Ended>,
        /// The run's route (the one that fixed its limits, else its first call's), whose refusals these are.
        route: Arc<str>,
    },
}

/// A run that ended, for its metrics.
pub struct Ended {
    pub route: Arc<str>,
    pub end: RunEnd,
    pub calls: u64,
    pub tokens: u64,
    pub age: Duration,
}

/// What a call's end found in the store (`finish.lua`).
pub enum Finished {
    /// Its reservation given back (or found given back already), and the run's end when
    /// this call counts it.
    Given(Option<Ended>),
    /// The run's key was gone (evicted, flushed, expired), or held a run started over in
    /// its place, and this call is the first of its run to find it so: the loss is this
    /// call's to count.
    Lost,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisStore")
    }
}

/// The run's hash.
pub fn key_of(key: &RunKey) -> String {
    match &key.scope {
        None => format!("hg:{{-/{}}}", key.id),
        Some(scope) => {
            let mut s = String::with_capacity(24 + key.id.len());
            s.push_str("hg:{");
            s.extend(key_hex(scope).map(char::from));
            s.push('/');
            s.push_str(&key.id);
            s.push('}');
            s
        }
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

/// A number of a script's reply: an integer, or one written as text (a refusal's). Read as
/// an integer first, exactly: through an f64 a count past 2^53 lost its last digits, and
/// one past i64::MAX read as i64::MAX (audit WD 3). A script of a previous release writes
/// some as Lua's `tostring` does (`1.2345678901235e+15`): read as the f64 they are.
fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        Value::BulkString(b) => std::str::from_utf8(b).ok().map_or(0, |s| {
            s.parse::<i64>()
                .unwrap_or_else(|_| s.parse::<f64>().map_or(0, |f| f as i64))
        }),
        _ => 0,
    }
}

/// A count of a script's reply, as `int` reads it, never below 0; u64 written as text too.
fn count(v: &Value) -> u64 {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or_else(|| int(v).max(0) as u64),
        _ => int(v).max(0) as u64,
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::Int(n) => n.to_string(),
        Value::SimpleString(s) => s.clone(),
        _ => String::new(),
    }
}

/// `-1` means none.
fn some(n: i64) -> Option<u64> {
    (n >= 0).then_some(n as u64)
}

/// The deadline `ms` after `from`; `-1`: none.
fn deadline_in(ms: i64, from: Instant) -> Option<Instant> {
    some(ms).map(|ms| from + Duration::from_millis(ms))
}

impl RedisStore {
    /// A store at `urls[0]` (`redis://` or `rediss://`); nothing is connected until it is
    /// used. `ca`: the PEM certificates a `rediss://` server's certificate must chain to,
    /// instead of the public roots.
    /// `cluster`: `urls` are nodes of a Redis Cluster, any one of which names the others:
    /// a gateway started while one is down finds the cluster through another (audit SE 3).
    pub fn new(
        urls: &[String],
        timeout: Duration,
        ca: Option<Vec<u8>>,
        cluster: bool,
    ) -> Result<Self, String> {
        let bound = timeout.max(Duration::from_millis(500));
        if cluster {
            let mut builder = ClusterClient::builder(urls.iter().map(String::as_str))
                .connection_timeout(bound)
                .response_timeout(bound)
                .retries(2);
            if let Some(root_cert) = ca {
                builder = builder.certs(redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root_cert),
                });
            }
            let client = builder.build().map_err(|e| e.to_string())?;
            return Ok(Self::with_link(Link::Cluster(Box::new(LazyCluster {
                client,
                conn: arc_swap::ArcSwapOption::empty(),
                connecting: tokio::sync::Mutex::new(()),
                failed: std::sync::Mutex::new(None),
            }))));
        }
        let url = urls.first().map_or("", String::as_str);
        let client = match ca {
            None => redis::Client::open(url),
            Some(root_cert) => redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root_cert),
                },
            ),
        }
        .map_err(|e| e.to_string())?;
        // One attempt to reconnect per command that finds the connection gone, no backoff:
        // retries 50 ms, then 100 ms apart outlast any `store_timeout` worth having, so a
        // store that refused at once held every call of a run for the whole timeout (audit
        // AB) where it can fail it at once, naming the refusal.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(bound))
            .set_response_timeout(Some(bound))
            .set_number_of_retries(0);
        Ok(Self::with_link(Link::Single(Box::new(Single::new(
            client, config,
        )?))))
    }

    fn with_link(link: Link) -> Self {
        Self {
            link,
            last_error: std::sync::Mutex::new(None),
            admit: Script::new(ADMIT_LUA),
            finish: Script::new(FINISH_LUA),
            cancel: Script::new(CANCEL_LUA),
        }
    }

    /// The connection for a command: the cluster's is made by the first.
    async fn conn(&self) -> redis::RedisResult<Conn> {
        match &self.link {
            Link::Single(c) => Ok(Conn::Single((**c.manager.load()).clone())),
            Link::Cluster(c) => c
                .get()
                .await
                .map(|made| Conn::Cluster(made.conn.clone(), made)),
        }
    }

    /// After `conn` was found dropped (Redis closed it while idle, its `timeout`, or
    /// restarted): a connection to send the command again on at once. One server's manager
    /// reconnects by itself on that error, and its clones follow. A cluster connection's
    /// own retries went to the same closed connection to the node (4 calls in 8 of a
    /// quiet run failed "broken pipe", or "No connections found", audit SE 1): a new one
    /// is made in its place, shared by the commands after it.
    async fn reconnected(&self, conn: &mut Conn, e: &redis::RedisError) -> redis::RedisResult<()> {
        if let (Link::Cluster(c), Conn::Cluster(_, stale)) = (&self.link, &*conn) {
            let made = c.renew(Some(stale), e.is_connection_refusal()).await?;
            *conn = Conn::Cluster(made.conn.clone(), made);
        }
        Ok(())
    }

    /// `e` of a command on this store. A redirection is named as a cluster's only when
    /// `store_cluster` is not set: a cluster client that still met one after its retries
    /// (a slot moving while a connection was made anew) is not a store set up wrong.
    fn error(&self, e: redis::RedisError) -> StoreError {
        match StoreError::from(e) {
            StoreError::Cluster(e) if matches!(self.link, Link::Cluster(_)) => {
                StoreError::Refused(e)
            }
            e => e,
        }
    }

    /// Admits `call` into the run `key` (starting it with `limits`, for `route`, if it is
    /// new, and fixing them if it has none yet: `RunState::take_limits`) as the call `token`; the key lives `expire` from now at least, and what the call
    /// reserves is given back `life` after its arrival if its end has not come by then.
    #[allow(clippy::too_many_arguments)]
    pub async fn admit(
        &self,
        key: &RunKey,
        route: &str,
        limits: &RunLimits,
        call: &Call,
        expire: Duration,
        life: Duration,
        token: &str,
    ) -> Result<RedisAdmission, StoreError> {
        let ms = |d: Duration| d.as_millis() as u64;
        let run = key_of(key);
        let mut invocation = self.admit.key(&run);
        invocation
            .arg(route)
            .arg(opt(limits.budget.map(ms)))
            .arg(opt(limits.max_budget.map(ms)))
            .arg(opt(limits.max_calls))
            .arg(opt(limits.max_tokens))
            .arg(opt(limits.max_repeats))
            .arg(limits.token_estimate)
            // Lua numbers are doubles: counts past 2^53 - 1 are held to it, as the limits
            // are at `check`, so that the script compares exactly (audit WD 3).
            .arg(call.reserve.min(MAX_RUN_TOKENS))
            .arg(opt(call.asked_budget.map(ms)))
            .arg(opt(call.request.map(|f| format!("{f:016x}"))))
            .arg(ms(call.need))
            .arg(ms(call.now.saturating_duration_since(call.at)))
            .arg(ms(expire))
            .arg(token)
            .arg(ms(life));
        // Sent again on a dropped connection (see `invoke`): a reply lost after the script
        // ran would admit the call twice; the write that failed never reached the store,
        // and that is the case a restart or an idle timeout makes. Whatever the second try
        // says, the first may have run: never `Refused`.
        let reply = self
            .invoke(&invocation, ("admit.lua", ADMIT_LUA))
            .await
            .map_err(|(e, again)| {
                if again {
                    StoreError::Failed(e.to_string())
                } else {
                    e
                }
            })?;
        // The script says the run's deadline as time after the call's arrival: counted from
        // the arrival here, so that neither the trip to Redis nor the one back is added to
        // the run (audit KD 1).
        let arrived = call.at;
        let at = |i: usize| reply.get(i).map_or(-1, int);
        if at(0) == 2 {
            return Err(StoreError::Failed("the call was cancelled".to_owned()));
        }
        if at(0) == 1 {
            return Ok(RedisAdmission::Admitted(
                Admitted {
                    view: View {
                        deadline: deadline_in(at(1), arrived),
                        calls_left: some(at(2)).map(|n| n as u32),
                        tokens_left: some(at(3)),
                    },
                    token_allowance: some(at(4)),
                    budget: some(at(5)).map(Duration::from_millis),
                    started: at(6) == 1,
                },
                RunOf {
                    max_tokens: some(at(7)),
                    stops_loops: some(at(8)).is_some(),
                },
                match reply.get(9).map(text).unwrap_or_default() {
                    r if r.is_empty() => Arc::from(route),
                    r => Arc::from(r),
                },
                reply.get(10).map(text).unwrap_or_default(),
            ));
        }
        let view = View {
            deadline: deadline_in(at(2), arrived),
            calls_left: some(at(3)).map(|n| n as u32),
            tokens_left: some(at(4)),
        };
        let s = |i: usize| reply.get(i).map(text).unwrap_or_default();
        let n = |i: usize| reply.get(i).map_or(0, count);
        let refusal = match s(9).as_str() {
            "deadline" => Refusal::Deadline {
                budget: Duration::from_millis(n(10)),
                left: Duration::from_millis(n(11)),
            },
            "calls" => Refusal::Calls {
                limit: n(10) as u32,
            },
            "tokens" => Refusal::Tokens {
                limit: n(10),
                used: n(11),
                reserved: n(12),
                asked: n(13),
            },
            "loop" => Refusal::Loop(Repeat {
                fingerprint: u64::from_str_radix(&s(10), 16).unwrap_or(0),
                tool: Some(clipped(&s(11), MAX_NAMES).to_owned()).filter(|t| !t.is_empty()),
                count: n(12) as u32,
            }),
            other => return Err(StoreError::Failed(format!("unexpected refusal {other:?}"))),
        };
        let run_route: Arc<str> = match s(5) {
            r if r.is_empty() => Arc::from(route),
            r => Arc::from(r),
        };
        let ended = (at(1) == 1).then(|| Ended {
            route: run_route.clone(),
            end: refusal.end(),
            calls: n(6),
            tokens: n(7),
            age: Duration::from_millis(n(8)),
        });
        Ok(RedisAdmission::Refused {
            refusal,
            view,
            ended,
            route: run_route,
        })
    }

    /// Runs `script`; if it found its connection dropped (Redis restarted, or closed it while
    /// idle: its `timeout`), once more at once on a new one, as the first command on a new
    /// connection, not as an outage. The error says whether it was the second try's after a
    /// first that may have run (one whose connection was never opened did not).
    /// `source`: the script's name and text, to name a command an ACL denies in it.
    async fn invoke(
        &self,
        script: &ScriptInvocation<'_>,
        source: (&str, &str),
    ) -> Result<Vec<Value>, (StoreError, bool)> {
        let mut conn = self.connected().await.map_err(|e| (unreached(e), false))?;
        let reply = self.invoke_on(&mut conn, script).await;
        reply.map_err(|(e, again)| match acl_denial(&e, source) {
            // Said so, but still `Failed`: a denied command may follow the script's writes.
            Some(denial) => (StoreError::Failed(denial), again),
            None => (e, again),
        })
    }

    /// What `invoke` sends, on `conn`.
    async fn invoke_on(
        &self,
        conn: &mut Conn,
        script: &ScriptInvocation<'_>,
    ) -> Result<Vec<Value>, (StoreError, bool)> {
        match self.noted(script.invoke_async(&mut *conn).await) {
            Err(e) if dropped(&e) => {
                let first_sent = !never_sent(&e);
                let again = match self.reconnected(conn, &e).await {
                    Ok(()) => script.invoke_async(&mut *conn).await,
                    Err(e) => Err(e),
                };
                self.noted(again).map_err(|e| (self.error(e), first_sent))
            }
            reply => reply.map_err(|e| (self.error(e), false)),
        }
    }

    /// Notes the error of a command's reply, if it is one; a reply clears it, so that a later
    /// timeout is not blamed on an error the store has recovered from.
    fn noted<T>(&self, reply: redis::RedisResult<T>) -> redis::RedisResult<T> {
        let mut last = self
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &reply {
            Err(e) => *last = Some((Instant::now(), e.to_string())),
            Ok(_) => *last = None,
        }
        drop(last);
        if let (Err(e), Link::Single(single)) = (&reply, &self.link) {
            single.renew_after(e);
        }
        reply
    }

    /// The connection for a command, its failure to connect noted (its success is not: the
    /// command's reply says whether the store answers).
    async fn connected(&self) -> redis::RedisResult<Conn> {
        match self.conn().await {
            Ok(conn) => Ok(conn),
            failed => self.noted(failed),
        }
    }

    /// A wait of `after` for the store that ran out, named with its recent error.
    pub fn timed_out(&self, after: Duration) -> StoreError {
        StoreError::Timeout(after, self.recent_error())
    }

    /// The last error a command met, if it came within the last minute.
    pub fn recent_error(&self) -> Option<String> {
        let last = self
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        last.as_ref()
            .filter(|(at, _)| at.elapsed() < Duration::from_secs(60))
            .map(|(_, e)| e.clone())
    }

    /// The end of the call `token`, admitted into the run at `key` of `generation` (as its
    /// admission said it) with `reserve` tokens.
    pub async fn finish(
        &self,
        key: &str,
        token: &str,
        generation: &str,
        reserve: u64,
        used: &Used,
        ttl: Duration,
    ) -> Result<Finished, StoreError> {
        let (answer, tool) = match &used.answer {
            Answer::Unread => (String::new(), ""),
            Answer::Plain => ("-".to_owned(), ""),
            // Bounded here too: whatever the answer's names, a run's key keeps its size.
            Answer::Tools(fp, tool) => (format!("{fp:016x}"), clipped(tool, MAX_NAMES)),
        };
        let mut invocation = self.finish.key(key);
        invocation
            // Held to 2^53 - 1 as at admission: Lua's doubles count exactly below it.
            .arg(reserve.min(MAX_RUN_TOKENS))
            .arg(used.tokens.min(MAX_RUN_TOKENS))
            .arg(answer)
            .arg(tool)
            .arg(ttl.as_millis() as u64)
            .arg(opt(used.request.map(|f| format!("{f:016x}"))))
            .arg(token)
            .arg(generation);
        // finish.lua gives back once: safe to send again.
        let reply = self
            .invoke(&invocation, ("finish.lua", FINISH_LUA))
            .await
            .map_err(|(e, _)| e)?;
        if reply.first().map(int) == Some(-1) {
            return Ok(Finished::Lost);
        }
        Ok(Finished::Given(ended_of(&reply)))
    }

    /// Cancels the admission of the call `token` into the run at `key`, made or yet to come
    /// (`cancel.lua`). `served`: the call went on without run limits, and counts as a call.
    /// The run's end when this call was the last one in flight of a run that had ended.
    pub async fn cancel(
        &self,
        key: &str,
        token: &str,
        served: bool,
        ttl: Duration,
    ) -> Result<Option<Ended>, StoreError> {
        let mut invocation = self.cancel.key(key);
        invocation
            .arg(token)
            .arg(u8::from(!served))
            .arg(ttl.as_millis() as u64);
        // cancel.lua is idempotent: safe to send again.
        let reply = self
            .invoke(&invocation, ("cancel.lua", CANCEL_LUA))
            .await
            .map_err(|(e, _)| e)?;
        Ok(reply.get(1..).and_then(ended_of))
    }

    /// The store's `maxmemory-policy`, from `INFO memory` (an ACL may deny it). Not `CONFIG
    /// GET`: a user allowed that may read every setting, passwords included.
    pub async fn eviction_policy(&self) -> Result<String, StoreError> {
        let mut conn = self.connected().await.map_err(unreached)?;
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.error(e))?;
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix("maxmemory_policy:"))
            .unwrap_or_default()
            .trim()
            .to_owned())
    }

    /// Every run with this id, whatever its scope (for the admin listener; a SCAN for the
    /// scoped ones).
    pub async fn find(&self, id: &str) -> Result<Vec<(RunKey, RunState)>, StoreError> {
        // As in `admit`: the first command after the store restarted, or closed the idle
        // connection, finds it broken: once more, on a new one. (A read: safe to repeat.)
        let mut conn = self.connected().await.map_err(unreached)?;
        let found = match self.noted(self.find_once(&mut conn, id).await) {
            Err(e) if dropped(&e) => match self.reconnected(&mut conn, &e).await {
                Ok(()) => self.noted(self.find_once(&mut conn, id).await),
                Err(e) => self.noted(Err(e)),
            },
            found => found,
        };
        found.map_err(|e| self.error(e))
    }

    async fn find_once(
        &self,
        conn: &mut Conn,
        id: &str,
    ) -> Result<Vec<(RunKey, RunState)>, redis::RedisError> {
        let escaped: String = id
            .chars()
            .flat_map(|c| match c {
                '*' | '?' | '[' | ']' | '\\' => vec!['\\', c],
                c => vec![c],
            })
            .collect();
        // The run without a scope is one known key, read first: on a Redis Cluster node that
        // does not hold it, that read is the MOVED that names the cluster. Runs scoped by a
        // client key (16 hex digits) need a SCAN, which reads the whole database.
        let unscoped = key_of(&RunKey {
            scope: None,
            id: Arc::from(id),
        });
        let mut keys: Vec<String> = Vec::new();
        let exists: bool = redis::cmd("EXISTS")
            .arg(&unscoped)
            .query_async(&mut *conn)
            .await?;
        if exists {
            keys.push(unscoped);
        }
        let pattern = format!("hg:{{{}/{escaped}}}", "[0-9a-f]".repeat(16));
        // A cluster's keys are spread over its primaries, each SCANned on its own.
        let nodes = match &mut *conn {
            Conn::Single(_) => vec![None],
            Conn::Cluster(c, _) => primaries(c).await?.into_iter().map(Some).collect(),
        };
        for node in nodes {
            let mut cursor: u64 = 0;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000);
                let (next, batch): (u64, Vec<String>) = match (&mut *conn, &node) {
                    (Conn::Cluster(c, _), Some((host, port))) => {
                        let at = SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port: *port,
                        };
                        let reply = c.route_command(scan, RoutingInfo::SingleNode(at)).await?;
                        redis::from_redis_value(reply)?
                    }
                    (conn, _) => scan.query_async(conn).await?,
                };
                keys.extend(batch);
                cursor = next;
                if cursor == 0 || keys.len() > 100 {
                    break;
                }
            }
        }
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut *conn).await?;
        let redis_now = secs * 1000 + micros / 1000;
        let now = Instant::now();
        let mut out = Vec::new();
        for k in keys {
            let Some(run_key) = parse_key(&k).filter(|r| &*r.id == id) else {
                continue;
            };
            let h: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
                .arg(&k)
                .query_async(&mut *conn)
                .await?;
            // Expired between the look and the read, or a tombstone with no run yet.
            if !h.contains_key("route") {
                continue;
            }
            out.push((run_key, state_of(&h, redis_now, now)));
        }
        Ok(out)
    }
}

/// The address of every primary of the cluster (`CLUSTER NODES`), where its keys are.
async fn primaries(conn: &mut ClusterConnection) -> redis::RedisResult<Vec<(String, u16)>> {
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(conn).await?;
    Ok(nodes
        .lines()
        .filter_map(|line| {
            // `ID HOST:PORT@CPORT[,HOSTNAME] FLAGS ...`
            let mut fields = line.split(' ');
            let addr = fields.nth(1)?;
            let flags = fields.next()?;
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                return None;
            }
            let (host, port) = addr.split(['@', ',']).next()?.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect())
}

/// `{ended_now, route, calls, used, age_ms, end}`, as `finish.lua` and `cancel.lua` answer:
/// the run's end, when this call's end is the one that counts it.
fn ended_of(reply: &[Value]) -> Option<Ended> {
    if reply.first().map(int) != Some(1) {
        return None;
    }
    let n = |i: usize| reply.get(i).map_or(0, int).max(0) as u64;
    let end = reply.get(5).map(text).unwrap_or_default();
    Some(Ended {
        route: Arc::from(reply.get(1).map(text).unwrap_or_default()),
        end: RunEnd::named(&end).unwrap_or(RunEnd::Tokens),
        calls: n(2),
        tokens: n(3),
        age: Duration::from_millis(n(4)),
    })
}

fn parse_key(k: &str) -> Option<RunKey> {
    let inner = k.strip_prefix("hg:{")?.strip_suffix('}')?;
    let (scope, id) = inner.split_once('/')?;
    let scope = if scope == "-" {
        None
    } else {
        let mut out = [0u8; 8];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(scope.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(out)
    };
    Some(RunKey {
        scope,
        id: Arc::from(id),
    })
}

/// The run as the admin listener shows it, its instants made local.
fn state_of(
    h: &std::collections::HashMap<String, String>,
    redis_now: u64,
    now: Instant,
) -> RunState {
    let num = |k: &str| {
        h.get(k)
            .and_then(|v| v.parse::<f64>().ok())
            .map(|f| f as u64)
    };
    let at = |ms: u64| {
        if ms >= redis_now {
            now + Duration::from_millis(ms - redis_now)
        } else {
            now.checked_sub(Duration::from_millis(redis_now - ms))
                .unwrap_or(now)
        }
    };
    let limits = RunLimits {
        budget: num("budget").map(Duration::from_millis),
        max_budget: num("max_budget").map(Duration::from_millis),
        max_calls: num("max_calls").map(|n| n as u32),
        max_tokens: num("max_tokens"),
        max_repeats: num("max_repeats").map(|n| n as u32),
        token_estimate: num("estimate").unwrap_or(0),
    };
    let mut run = RunState::new(
        Arc::from(h.get("route").map_or("", String::as_str)),
        limits,
        at(num("started").unwrap_or(redis_now)),
    );
    run.last_call = at(num("last").unwrap_or(redis_now));
    run.deadline = num("deadline").map(at);
    run.budget = num("run_budget").map(Duration::from_millis);
    run.calls = num("calls").unwrap_or(0) as u32;
    run.in_flight = num("in_flight").unwrap_or(0) as u32;
    run.tokens_used = num("used").unwrap_or(0);
    run.tokens_reserved = num("reserved").unwrap_or(0);
    // Reservations past their expiry that no admission has given back yet (admit.lua does):
    // shown as given back, as the run's next call will find them.
    for (field, at) in h {
        let Some(token) = field.strip_prefix("e:") else {
            continue;
        };
        let expired = at.parse::<u64>().is_ok_and(|at| at <= redis_now);
        if let Some(held) = h.get(&format!("p:{token}")).filter(|_| expired) {
            run.in_flight = run.in_flight.saturating_sub(1);
            run.tokens_reserved = run
                .tokens_reserved
                .saturating_sub(held.parse::<u64>().unwrap_or(0));
        }
    }
    run.answer = h.get("ans_fp").map(|fp| Repeat {
        fingerprint: u64::from_str_radix(fp, 16).unwrap_or(0),
        tool: h
            .get("ans_tool")
            .map(|t| clipped(t, MAX_NAMES).to_owned())
            .filter(|t| !t.is_empty()),
        count: num("ans_n").unwrap_or(0) as u32,
    });
    run.request = h.get("req_fp").map(|fp| Repeat {
        fingerprint: u64::from_str_radix(fp, 16).unwrap_or(0),
        tool: None,
        count: num("req_n").unwrap_or(0) as u32,
    });
    run.ended = h
        .get("ended")
        .and_then(|e| RunEnd::ALL.into_iter().find(|x| x.as_str() == e.as_str()));
    run
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store of `url` (one node) with `store_timeout` of `timeout_ms`.
    fn store_at(url: &str, timeout_ms: u64, cluster: bool) -> RedisStore {
        RedisStore::new(
            &[url.to_owned()],
            Duration::from_millis(timeout_ms),
            None,
            cluster,
        )
        .unwrap()
    }

    /// A `redis://` URL where nothing listens (a port just given back).
    fn closed_url() -> String {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("redis://{}/0", closed.local_addr().unwrap())
    }

    /// A timeout names the store's last error: a store that refuses the password, or cannot
    /// be reached, fails slower than `store_timeout` while its connection is tried again, and
    /// a timeout alone read as latency (an audit's wrong password did).
    #[tokio::test]
    async fn a_timeout_names_the_stores_last_error() {
        let url = closed_url();
        let store = store_at(&url, 50, false);
        let quiet = store.timed_out(Duration::from_millis(50));
        assert_eq!(
            quiet.to_string(),
            "the run store did not answer within 50ms"
        );
        assert!(store.find("r").await.is_err());
        let error = store.recent_error().expect("the refused connection, noted");
        let timeout = store.timed_out(Duration::from_millis(50));
        assert_eq!(
            timeout.to_string(),
            format!("the run store did not answer within 50ms (its last error: {error})")
        );
    }

    /// A cluster store whose connection failed tries again a second later at the soonest,
    /// every command between failing with that error at once: each attempt opens a
    /// connection to the node (and retries), and a cluster that refused the password took
    /// 17,816 connections in 5 s from one gateway under load (audit JA 1).
    #[tokio::test]
    async fn a_cluster_that_refused_is_tried_again_at_most_once_a_second() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("redis://{}/0", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            // Accepted and closed at once: a node that refuses every connection.
            while let Ok((conn, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::Relaxed);
                drop(conn);
            }
        });
        let store = store_at(&url, 50, true);
        assert!(store.find("r").await.is_err());
        let first = accepted.load(Ordering::Relaxed);
        assert!(first > 0, "the first command tried the node");
        for _ in 0..20 {
            assert!(store.find("r").await.is_err());
        }
        assert_eq!(
            accepted.load(Ordering::Relaxed),
            first,
            "no connection tried within the second"
        );
        tokio::time::sleep(RENEW_EVERY).await;
        assert!(store.find("r").await.is_err());
        assert!(
            accepted.load(Ordering::Relaxed) > first,
            "tried again after it"
        );
    }

    /// A store that answered since its last error is not blamed for it: a timeout 25 s after
    /// a recovery named the refused connection of before (an audit's paused Redis).
    #[tokio::test]
    async fn a_reply_clears_the_last_error() {
        let url = closed_url();
        let store = store_at(&url, 50, false);
        assert!(store.find("r").await.is_err());
        assert!(store.recent_error().is_some());
        store.noted(Ok(())).unwrap();
        assert_eq!(store.recent_error(), None);
        assert_eq!(
            store.timed_out(Duration::from_millis(50)).to_string(),
            "the run store did not answer within 50ms"
        );
    }

    /// A command whose connection could not be opened (refused, a password refused at
    /// connect, no connection to a cluster's node, a server certificate refused) was never
    /// sent: an admission that failed so needs no cancel (audit SE 2: each call refused by a
    /// stopped Redis left a cancel tried for a minute, and a tombstone once Redis was back).
    #[tokio::test]
    async fn what_never_reached_the_store_needs_no_undoing() {
        let url = closed_url();
        let store = store_at(&url, 500, false);
        let refused = store
            .cancel("hg:{-/r}", "t", false, Duration::from_secs(60))
            .await;
        let Err(refused) = refused else {
            panic!("nothing listens")
        };
        assert!(matches!(refused, StoreError::Unreached(_)), "{refused:?}");
        assert!(refused.to_string().contains("refused"), "{refused}");
        assert!(!refused.may_have_run());

        for kind in [
            redis::ErrorKind::AuthenticationFailed,
            redis::ErrorKind::ClusterConnectionNotFound,
        ] {
            let e = StoreError::from(redis::RedisError::from((kind, "at connect")));
            assert!(!e.may_have_run(), "{kind:?}: {e:?}");
        }

        // A server whose certificate no public root signed (a private CA not named in
        // `store_ca_file`).
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.key_pair.serialize_der()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let _ = acceptor.accept(conn).await;
            }
        });
        let url = format!("rediss://localhost:{port}/0");
        let store = store_at(&url, 500, false);
        let untrusted = store
            .cancel("hg:{-/r}", "t", false, Duration::from_secs(60))
            .await;
        let Err(untrusted) = untrusted else {
            panic!("the certificate is refused")
        };
        assert!(
            matches!(untrusted, StoreError::Unreached(_)),
            "{untrusted:?}"
        );
        assert!(!untrusted.may_have_run());
    }

    /// A redirection that a cluster client met after its retries (a slot moving while a
    /// connection was made anew) is no store missing `store_cluster`: `/runs/{id}` said
    /// "store_cluster is not set" of a store that had it (audit SE 1).
    #[tokio::test]
    async fn a_redirection_on_a_cluster_store_does_not_say_store_cluster_is_not_set() {
        let moved = || {
            redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::Moved),
                "An error was signalled by the server",
                "14629 127.0.0.1:61333".to_owned(),
            ))
        };
        let cluster = store_at("redis://127.0.0.1:1/0", 50, true);
        let e = cluster.error(moved());
        assert!(matches!(e, StoreError::Refused(_)), "{e:?}");
        assert!(e.to_string().contains("14629 127.0.0.1:61333"), "{e}");
        let single = store_at("redis://127.0.0.1:1/0", 50, false);
        assert!(matches!(single.error(moved()), StoreError::Cluster(_)));
    }
}
