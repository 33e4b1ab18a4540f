//! The routing table: every route of a config with its chain of upstreams (its own, then its
//! fallbacks), their clients and metric handles, built once per config and kept across
//! reloads where nothing changed.

use std::sync::Arc;

use http::header::HeaderMap;

use crate::admission::{Admission, Bodies, BodyMemory};
use crate::auth::{ClientKeys, ClientKeysError};
use crate::config::{Config, RetryCause, Route};
use crate::gateway::hedges::Hedges;
use crate::gateway::template::Template;
use crate::runs::Runs;
use crate::stream::reaper::Reaper;
use crate::stream::signal::Signal;
use crate::telemetry::metrics::{
    AnswerMetrics, Histogram, IntGauge, Metrics, RouteMetrics, NO_ROUTE,
};
use crate::upstream::{Upstream, UpstreamBuildError};

/// Why a routing table could not be built from a config.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Upstream(#[from] UpstreamBuildError),
    #[error(transparent)]
    ClientKeys(#[from] ClientKeysError),
    #[error("{0}")]
    Runs(String),
}

/// One upstream of a route's chain (its own, then its fallbacks) with its metric handles.
pub struct ChainEntry {
    pub upstream: Arc<Upstream>,
    pub ttft: Histogram,
    pub in_flight: IntGauge,
    /// Time to first byte and the tokens of this upstream's answers on this route.
    pub answer: Arc<AnswerMetrics>,
}

pub struct RouteRuntime {
    pub route: Route,
    pub name: Arc<str>,
    /// Its own upstream, those balanced with it, its fallbacks (`Route::chain`).
    pub chain: Vec<ChainEntry>,
    /// Whose turn it is among balanced upstreams equally busy (`balance.rs`).
    pub turn: std::sync::atomic::AtomicUsize,
    pub metrics: RouteMetrics,
    /// The keys clients must present (`client_keys_*`), if any.
    pub keys: Option<ClientKeys>,
    /// The route's `max_in_flight` slots, if limited.
    pub admission: Option<Admission>,
    /// Its hedges, kept to a share of its requests and of its requests in flight
    /// (`gateway::hedges`).
    pub hedges: Arc<Hedges>,
    /// Whether a run this route's calls join may stop loops of repeated requests: some
    /// route of the config does, and a run keeps the limits of the first route with run keys
    /// that it met, so a call here is fingerprinted even when this route sets no `run_max_repeats`.
    pub fingerprint_requests: bool,
}

impl RouteRuntime {
    /// The least budget an attempt anywhere on the chain needs: what a request waiting for
    /// admission must still have when it gets its slot.
    pub(super) fn least_need(
        &self,
        template: &Template,
        min_useful: std::time::Duration,
    ) -> std::time::Duration {
        self.chain
            .iter()
            .map(|e| template.expected_ttft(&e.upstream).max(min_useful))
            .min()
            .unwrap_or(min_useful)
    }

    /// Whether this route would refuse `headers` for want of a client key.
    pub(super) fn refuses(&self, headers: &HeaderMap) -> bool {
        self.keys.as_ref().is_some_and(|k| !k.accepts(headers))
    }
}

/// The routing table with its upstream clients and metric handles, built once per config.
pub struct Gateway {
    pub(super) config: Arc<Config>,
    pub(super) routes: Vec<RouteRuntime>,
    /// Where requests that match no route are counted.
    pub(super) no_route: RouteMetrics,
    pub(super) metrics: Arc<Metrics>,
    /// Cancelled when in-flight requests must end (the shutdown grace is over).
    pub(super) shutdown: Signal,
    /// The runs, which outlive a reload: a new table takes them from the one it replaces.
    pub(super) runs: Arc<Runs>,
    /// Drops the upstream of a stream nobody reads (`stream::reaper`).
    pub(super) reaper: Reaper,
    /// What request bodies hold together (`request_body_memory`).
    pub(super) bodies: BodyMemory,
    /// What answers held before their heads hold together (`response_body_memory`).
    pub(super) answers: BodyMemory,
}

impl Gateway {
    /// The route a request on `path` (normalized for routing) is attributed to until its
    /// body names the model: the first candidate that does not filter on models, or else
    /// the first candidate (lifecycle step 4).
    pub(super) fn attributed(&self, path: &str) -> Option<&RouteRuntime> {
        let first = self.candidates(path).next()?;
        Some(
            self.candidates(path)
                .find(|r| !r.route.needs_model())
                .unwrap_or(first),
        )
    }

    /// The routes a request on `path` could be given, in order: those matching its path, up
    /// to the first that takes any model. Routes past that one can never take it, so they
    /// must not weigh in on what is decided before the body is read (a key refused by every
    /// route that could serve the request is refused before its body).
    pub(super) fn candidates<'a: 'p, 'p>(
        &'a self,
        path: &'p str,
    ) -> impl Iterator<Item = &'a RouteRuntime> + 'p {
        let mut open = false;
        self.routes
            .iter()
            .filter(move |r| r.route.matches_path(path))
            .take_while(move |r| {
                let reachable = !open;
                open = open || !r.route.needs_model();
                reachable
            })
    }

    /// Builds the routing table. Upstreams whose settings are unchanged in `previous` (the
    /// gateway a reload replaces) are reused with their connection pools and learned
    /// estimates. `shutdown` is cancelled when in-flight requests must end.
    pub fn new(
        config: Arc<Config>,
        metrics: &Arc<Metrics>,
        previous: Option<&Gateway>,
        shutdown: Signal,
    ) -> Result<Self, BuildError> {
        let mut upstreams: Vec<Arc<Upstream>> = Vec::new();
        for up in &config.upstreams {
            // The connector's own bound is the longest any route allows; each request bounds
            // its connect by its own limit and budget as well.
            let connect = config
                .routes
                .iter()
                .filter(|r| r.chain().any(|c| c.name == up.name))
                .map(|r| r.limits.connect_timeout)
                .max()
                .unwrap_or(std::time::Duration::from_secs(10));
            let same = previous.and_then(|g| {
                g.routes
                    .iter()
                    .flat_map(|r| r.chain.iter())
                    .map(|e| &e.upstream)
                    .find(|u| *u.config == **up && u.tls_files_are_current())
            });
            upstreams.push(match same {
                // A rotated key (same file, new contents) or another connect bound needs a
                // new connector, but nothing the old one learned is wrong for it. (A CA or
                // client certificate that changed may be what made it fail: it starts over.)
                Some(u) if u.connect_bound == connect && u.credential_is_current() => u.clone(),
                Some(u) => Arc::new(Upstream::new(up.clone(), connect)?.inherit(u)),
                None => Arc::new(Upstream::new(up.clone(), connect)?),
            });
        }
        for u in &upstreams {
            if previous.is_none() {
                metrics.set_ejected(&u.name, false);
            }
            // Said at start, and at a reload that adds a proxied upstream or changes its
            // proxy (audit QC 6): an operator behind a proxy sees which upstreams take it.
            let before = previous.map(|g| {
                g.routes
                    .iter()
                    .flat_map(|r| r.chain.iter())
                    .map(|e| &e.upstream)
                    .find(|p| p.name == u.name)
                    .and_then(|p| p.proxy_shown().map(str::to_owned))
            });
            if let Some(proxy) = u.proxy_shown() {
                if before.is_none_or(|b| b.as_deref() != Some(proxy)) {
                    tracing::info!(upstream = %u.name, %proxy, "upstream connects through an egress proxy (HTTP CONNECT)");
                }
            }
        }
        let find = |name: &str| {
            upstreams
                .iter()
                .find(|u| &*u.name == name)
                .expect("config checks that every route names known upstreams")
                .clone()
        };
        // Everything that can fail first: a reload refused for a route's keys must leave no
        // trace, not even that route's metric series.
        let keys = config
            .routes
            .iter()
            .map(|r| {
                r.client_auth
                    .as_ref()
                    .map(|a| ClientKeys::load(&r.name, a))
                    .transpose()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let stops_loops = config
            .routes
            .iter()
            .any(|r| r.run_limits.max_repeats.is_some());
        let routes: Vec<RouteRuntime> = config
            .routes
            .iter()
            .zip(keys)
            .map(|(r, keys)| {
                let names: Vec<&str> = r.chain().map(|c| c.name.as_str()).collect();
                let reasons: Vec<&str> = RetryCause::ALL
                    .iter()
                    .filter(|c| r.policy.retry_on.contains(**c))
                    .map(|c| c.as_str())
                    .collect();
                metrics.init_policy(
                    &r.name,
                    &names,
                    1 + r.policy.balanced.len(),
                    &reasons,
                    r.policy.hedge_after.is_some(),
                );
                // Across a reload, a route keeps its slots, and so counts the requests still
                // in flight on the old configuration; a changed limit is applied to them
                // once nothing can fail any more (below).
                // A limit taken away keeps its slots too, lifted (below): the requests waiting
                // for one go at once, and a limit put back later counts what is in flight.
                let same = previous.and_then(|g| g.routes.iter().find(|p| p.route.name == r.name));
                let carried = same.and_then(|p| p.admission.clone());
                // Its hedges still racing count against the new table's share as well, and
                // what it has spent of its share of requests stays spent.
                let hedges = same.map_or_else(|| Arc::new(Hedges::new()), |p| p.hedges.clone());
                let admission = match (r.max_in_flight, carried) {
                    (_, Some(a)) => Some(a),
                    (Some(n), None) => Some(Admission::new(Arc::from(r.name.as_str()), n)),
                    (None, None) => None,
                };
                RouteRuntime {
                    keys,
                    fingerprint_requests: stops_loops,
                    admission,
                    hedges,
                    turn: std::sync::atomic::AtomicUsize::new(0),
                    route: r.clone(),
                    name: Arc::from(r.name.as_str()),
                    metrics: metrics.route(&r.name),
                    chain: names
                        .iter()
                        .map(|n| ChainEntry {
                            upstream: find(n),
                            ttft: metrics.ttft(&r.name, n),
                            in_flight: metrics.in_flight(n),
                            answer: Arc::new(metrics.answer(&r.name, n)),
                        })
                        .collect(),
                }
            })
            .collect();
        // A reload keeps the runs: its `[runs]` changes are warned about where the reload's
        // other warnings are (`Runs::config`), once it has succeeded.
        let runs = match previous {
            Some(g) => g.runs.clone(),
            None => Runs::new(&config.runs, metrics.runs()).map_err(BuildError::Runs)?,
        };
        for r in config.routes.iter().filter(|r| r.run_limits.any()) {
            runs.init_metrics(&r.name);
        }
        for r in config.routes.iter().filter(|r| r.partial_answers) {
            metrics.init_partial(&r.name);
        }
        for r in &routes {
            if let Some(keys) = &r.keys {
                metrics.init_clients(&r.name, &keys.clients());
            }
        }
        // A reload that keeps `send_timeout` keeps the reaper (and its one task); streams
        // already open stay on the reaper they started with either way.
        let send_timeout = config.server.send_timeout;
        let reaper = previous
            .map(|g| g.reaper.clone())
            .filter(|r| r.send_timeout() == send_timeout)
            .unwrap_or_else(|| Reaper::new(send_timeout, shutdown.clone()));
        // The bodies' memory is one across reloads, resized in place: bodies held count
        // against the new limit (audit IB 2: a new memory beside the old let a second
        // limit's worth in).
        let body_memory = config.server.request_body_memory;
        let bodies = match previous {
            Some(g) => {
                g.bodies.resize(body_memory);
                g.bodies.clone()
            }
            None => BodyMemory::new(Bodies::Requests, body_memory),
        };
        // So is the answers' memory, for the same reason.
        let answer_memory = config.server.response_body_memory;
        let answers = match previous {
            Some(g) => {
                g.answers.resize(answer_memory);
                g.answers.clone()
            }
            None => BodyMemory::new(Bodies::Responses, answer_memory),
        };
        for (route, r) in routes.iter().zip(config.routes.iter()) {
            if let Some(a) = &route.admission {
                a.resize(r.max_in_flight.unwrap_or(crate::admission::LIFTED));
            }
        }
        Ok(Self {
            config,
            routes,
            no_route: metrics.route(NO_ROUTE),
            metrics: metrics.clone(),
            shutdown,
            runs,
            reaper,
            bodies,
            answers,
        })
    }

    /// The runs this gateway keeps (for the admin listener).
    pub fn runs(&self) -> &Arc<Runs> {
        &self.runs
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// Called once this table serves in place of `previous`: the upstreams it did not keep
    /// are retired, so that attempts still running there no longer write their names'
    /// series, and every upstream's ejection gauge says what the serving one's state is.
    pub fn took_over(&self, previous: &Gateway) {
        let kept = self.upstreams();
        for (old, ..) in previous.upstreams() {
            if !kept.iter().any(|(u, ..)| Arc::ptr_eq(u, old)) {
                old.retire();
                // A removed upstream's series stay exported (the old table may still be
                // serving its requests), but no longer say it is out of rotation.
                self.metrics.set_ejected(&old.name, false);
            }
        }
        for (u, ..) in kept {
            self.metrics.set_ejected(&u.name, u.health.is_out());
        }
    }

    /// Every upstream some route's chain uses, once, in the order routes first name them,
    /// with the names of those routes and its in-flight gauge.
    pub fn upstreams(&self) -> Vec<(&Arc<Upstream>, Vec<&str>, &IntGauge)> {
        let mut out: Vec<(&Arc<Upstream>, Vec<&str>, &IntGauge)> = Vec::new();
        for r in &self.routes {
            for e in &r.chain {
                match out.iter_mut().find(|(u, ..)| Arc::ptr_eq(u, &e.upstream)) {
                    Some((_, routes, _)) if !routes.contains(&&*r.name) => routes.push(&r.name),
                    Some(_) => {}
                    None => out.push((&e.upstream, vec![&r.name], &e.in_flight)),
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Gateway;
    use crate::stream::signal::Signal;
    use crate::telemetry::json::tests::Captured;

    fn config(proxy: &str) -> Arc<crate::config::Config> {
        let text = format!(
            "[upstreams.a]\nurl = \"http://api.example:9\"\nauth = \"none\"\n{proxy}\n\
             [[routes]]\nname = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"a\"\n"
        );
        Arc::new(crate::config::Config::from_toml(&text, "t.toml").unwrap())
    }

    /// Audit QC 6: a reload that gives an upstream a proxy, or another one, logs the line
    /// start-up logs; one that leaves it as it was does not.
    #[tokio::test(start_paused = true)]
    async fn a_reload_that_adds_or_changes_a_proxy_logs_it() {
        let metrics = Arc::new(super::Metrics::new());
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let direct = Gateway::new(config(""), &metrics, None, Signal::new()).unwrap();
            let one = "proxy = \"http://u:pw@proxy.one:3128\"";
            let first = Gateway::new(config(one), &metrics, Some(&direct), Signal::new()).unwrap();
            let same = Gateway::new(config(one), &metrics, Some(&first), Signal::new()).unwrap();
            let two = "proxy = \"http://proxy.two:3128\"";
            Gateway::new(config(two), &metrics, Some(&same), Signal::new()).unwrap();
        });
        let logged = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = logged
            .lines()
            .filter(|l| l.contains("egress proxy"))
            .collect();
        assert_eq!(lines.len(), 2, "{logged}");
        assert!(lines[0].contains("http://u:***@proxy.one:3128"), "{logged}");
        assert!(lines[1].contains("http://proxy.two:3128"), "{logged}");
        assert!(!logged.contains("pw@"), "{logged}");
    }
}
