//! The Prometheus registry and the typed handles the request path uses. Nothing else in the
//! crate touches `prometheus` directly. Label handles are resolved once per route and upstream
//! when the gateway is built, so a request never does a label lookup.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
pub use prometheus::{Histogram, IntGauge};

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::error::Origin;

/// How many log lines the process has dropped, for a log writer that drops lines rather than
/// block the runtime when its reader falls behind (set once, by the binary).
static LOG_LINES_DROPPED: OnceLock<Box<dyn Fn() -> u64 + Send + Sync>> = OnceLock::new();

/// Makes `hourglass_log_lines_dropped_total` read `dropped`. Only the first call counts.
pub fn count_dropped_log_lines(dropped: impl Fn() -> u64 + Send + Sync + 'static) {
    let _ = LOG_LINES_DROPPED.set(Box::new(dropped));
}

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
    600.0,
];
const BUDGET_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
const RATIO_BUCKETS: &[f64] = &[0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0];

/// The `reason`s of `hourglass_tls_handshake_failures_total`.
pub const TLS_HANDSHAKE_FAILURES: [&str; 8] = [
    "timeout",
    "client_certificate",
    "alert",
    "incompatible",
    "plain_http",
    "malformed",
    "closed",
    "other",
];

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    cancellations: IntCounterVec,
    detached: IntCounterVec,
    budget: HistogramVec,
    margin: HistogramVec,
    used_ratio: HistogramVec,
    duration: HistogramVec,
    ttft: HistogramVec,
    ttfb: HistogramVec,
    tokens: IntCounterVec,
    tokens_cancelled: IntCounterVec,
    stream_errors: IntCounterVec,
    responses: IntCounterVec,
    connect_errors: IntCounterVec,
    in_flight: IntGaugeVec,
    requests_in_flight: IntGaugeVec,
    client_connections: IntGauge,
    accept_errors: IntCounterVec,
    open_fds: IntGauge,
    max_fds: IntGauge,
    client_requests: IntCounterVec,
    client_tokens: IntCounterVec,
    retries: IntCounterVec,
    fallbacks: IntCounterVec,
    hedges: IntCounterVec,
    ejections: IntCounterVec,
    ejected: IntGaugeVec,
    skipped: IntCounterVec,
    attempts: HistogramVec,
    reloads: IntCounterVec,
    config_info: IntGaugeVec,
    panics: IntCounter,
    refused_heads: IntCounterVec,
    tls_handshake_failures: IntCounterVec,
    tls_expiry: IntGaugeVec,
    tls_crl_due: IntGaugeVec,
    tls_pending: IntGaugeVec,
    runs: RunMetrics,
    stream_upstream: IntCounterVec,
    partial_answers: IntCounterVec,
    log_lines_dropped: IntCounter,
    /// Two scrapes at once must not both add what the counter is behind.
    log_catch_up: Mutex<()>,
}

/// Pre-resolved handles for one route, shared: every request takes a copy (once for the route
/// its path selects, again for the one its model selects), and with the handles behind one
/// `Arc` that copy is one reference count instead of one per handle plus a `Vec`.
#[derive(Clone)]
pub struct RouteMetrics(Arc<RouteHandles>);

impl std::ops::Deref for RouteMetrics {
    type Target = RouteHandles;

    fn deref(&self) -> &RouteHandles {
        &self.0
    }
}

/// The handles of one route; reached through [`RouteMetrics`].
pub struct RouteHandles {
    pub ok: IntCounter,
    pub error: IntCounter,
    pub cancelled: IntCounter,
    cancellations: Vec<IntCounter>,
    /// Requests whose detached call's connection was closed (outcome `detached`), and the
    /// same by who closed it (`Origin::CLOSES`).
    pub detached: IntCounter,
    detached_by: Vec<(Origin, IntCounter)>,
    pub budget: Histogram,
    pub margin: Histogram,
    pub used_ratio: Histogram,
    pub duration: Histogram,
    pub attempts: Histogram,
    tokens_cancelled: Vec<IntCounter>,
    /// Requests the upstream was asked to stream for a client that did not.
    pub stream_upstream: IntCounter,
    partial_answers: IntCounterVec,
    /// Requests attributed to the route and not yet reported.
    pub in_flight: IntGauge,
    client_requests: IntCounterVec,
    client_tokens: IntCounterVec,
    route: Arc<str>,
}

impl RouteMetrics {
    /// Whether both are the handles of one route's series (the same build of them).
    pub fn same(&self, other: &RouteMetrics) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A client connection, counted in `hourglass_client_connections` until it is dropped.
pub struct OpenConnection(IntGauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Pre-resolved handles for what the answers of one (route, upstream) pair cost.
pub struct AnswerMetrics {
    pub ttfb: Histogram,
    pub prompt_reported: IntCounter,
    pub completion_reported: IntCounter,
    pub completion_estimated: IntCounter,
    stream_errors: IntCounterVec,
    /// Answers by status class, in `RESPONSE_CLASSES` order.
    responses: [IntCounter; 6],
    connect_errors: IntCounterVec,
    route: Arc<str>,
    upstream: Arc<str>,
}

impl AnswerMetrics {
    /// Counts one mid-stream provider error. Rare, so the label lookup happens here rather
    /// than creating a series per type up front.
    pub fn stream_error(&self, kind: &str) {
        self.stream_errors
            .with_label_values(&[&*self.route, &*self.upstream, kind])
            .inc();
    }

    /// Counts an attempt's answer by its status class, so that an upstream answering 5xx
    /// (which the gateway passes on as the answer, outcome `ok`) shows as such. By its real
    /// class (audit MC 3): a 1xx head that reaches here (a 101 the gateway refuses) is no
    /// success, and a status HTTP does not define (600 and up, which the gateway refuses
    /// too) is no provider's 5xx.
    pub fn response(&self, status: u16) {
        let class = match status {
            ..200 => 0,
            200..300 => 1,
            300..400 => 2,
            400..500 => 3,
            500..600 => 4,
            _ => 5,
        };
        self.responses[class].inc();
    }

    /// Counts an attempt whose connection to the upstream could not be made: `reason` is one
    /// of [`CONNECT_ERRORS`]. Once per failed attempt, never per chunk, so the label lookup
    /// happens here.
    pub fn connect_error(&self, reason: &'static str) {
        debug_assert!(CONNECT_ERRORS.contains(&reason), "{reason}");
        self.connect_errors
            .with_label_values(&[&*self.upstream, reason])
            .inc();
    }
}

/// The `reason` label values of `hourglass_upstream_connect_errors_total`.
pub const CONNECT_ERRORS: [&str; 5] = ["dns", "refused", "timeout", "tls", "other"];

/// The `class` label values of `hourglass_upstream_responses_total`, in `AnswerMetrics` order.
/// `other`: a status outside the 100 to 599 that HTTP defines.
const RESPONSE_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "other"];

/// The `end` of `hourglass_runs_total` for a run the Redis store lost (its key evicted,
/// flushed or expired under a call): no end of the run's own, which left no state to end.
pub const RUN_LOST: &str = "lost";

/// What runs report: how many are held, how they end, what they are refused, and what a
/// whole run cost when it ends. Touched per run and per refusal, never per chunk.
#[derive(Clone)]
pub struct RunMetrics {
    pub active: IntGauge,
    ends: IntCounterVec,
    refusals: IntCounterVec,
    calls: HistogramVec,
    tokens: HistogramVec,
    duration: HistogramVec,
    store_errors: IntCounterVec,
}

impl RunMetrics {
    /// Creates a route's run series at zero, so dashboards see them before the first run.
    pub fn init(&self, route: &str, ends: &[&str], reasons: &[&str]) {
        for end in ends {
            self.ends.with_label_values(&[route, end]);
        }
        for reason in reasons {
            self.refusals.with_label_values(&[route, reason]);
        }
        for h in [&self.calls, &self.tokens, &self.duration] {
            h.with_label_values(&[route]);
        }
    }

    /// A run started on `route` ended, for `end`, having made `calls` calls that used
    /// `tokens` tokens over `duration` seconds.
    pub fn ended(&self, route: &str, end: &str, calls: u64, tokens: u64, duration: f64) {
        self.ends.with_label_values(&[route, end]).inc();
        self.calls.with_label_values(&[route]).observe(calls as f64);
        self.tokens
            .with_label_values(&[route])
            .observe(tokens as f64);
        self.duration.with_label_values(&[route]).observe(duration);
    }

    pub fn refused(&self, route: &str, reason: &str) {
        self.refusals.with_label_values(&[route, reason]).inc();
    }

    /// A run on `route` was gone from the shared store at a call's end (`RUN_LOST`): counted
    /// as an end, without the histograms, as what it used is gone with it.
    pub fn lost(&self, route: &str) {
        self.ends.with_label_values(&[route, RUN_LOST]).inc();
    }

    /// A call to the run store failed or timed out (`op`: admit, finish).
    pub fn store_error(&self, op: &str) {
        self.store_errors.with_label_values(&[op]).inc();
    }
}

/// Counts one upstream call in flight from creation to drop.
pub struct InFlight(IntGauge);

impl InFlight {
    pub fn new(gauge: &IntGauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl RouteHandles {
    pub fn cancellation(&self, origin: Origin) -> &IntCounter {
        &self.cancellations[origin as usize]
    }

    /// Where a detached call closed by `origin` is counted; `None` for an origin that never
    /// closes one (see `Origin::CLOSES`).
    pub fn detached_by(&self, origin: Origin) -> Option<&IntCounter> {
        self.detached_by
            .iter()
            .find_map(|(o, c)| (*o == origin).then_some(c))
    }

    /// A partial answer was sent because `origin` cut the stream.
    pub fn partial_answer(&self, origin: Origin) {
        self.partial_answers
            .with_label_values(&[&*self.route, origin.as_str()])
            .inc();
    }

    /// What a request of `client` (on a route with client keys) came to. The series are
    /// looked up here, not resolved ahead: the clients are known only as they come.
    pub fn client_usage(
        &self,
        client: &str,
        outcome: &str,
        prompt: Option<u64>,
        completion: Option<(u64, &str)>,
    ) {
        let route = &*self.route;
        self.client_requests
            .with_label_values(&[route, client, outcome])
            .inc();
        if let Some(n) = prompt {
            self.client_tokens
                .with_label_values(&[route, client, "prompt", "reported"])
                .inc_by(n);
        }
        if let Some((n, source)) = completion {
            self.client_tokens
                .with_label_values(&[route, client, "completion", source])
                .inc_by(n);
        }
    }

    /// Completion tokens streamed to requests that were then cancelled by `origin`.
    pub fn tokens_cancelled(&self, origin: Origin) -> &IntCounter {
        &self.tokens_cancelled[origin as usize]
    }
}

/// The route label for requests that matched no route: a name config keeps from routes.
pub use crate::config::NO_ROUTE;

/// Registers `metric` with `registry` and hands it back.
fn registered<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: Result<M, prometheus::Error>,
) -> M {
    let metric = metric.expect("valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric");
    metric
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            registered(&registry, IntCounterVec::new(Opts::new(name, help), labels))
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            registered(&registry, IntGaugeVec::new(Opts::new(name, help), labels))
        };
        let histogram = |name: &str, help: &str, labels: &[&str], buckets: &[f64]| {
            registered(
                &registry,
                HistogramVec::new(
                    HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                    labels,
                ),
            )
        };
        let requests = counter(
            "hourglass_requests_total",
            "Requests finished, by route and outcome (ok, error, cancelled, detached).",
            &["route", "outcome"],
        );
        let detached = counter(
            "hourglass_detached_total",
            "Detached calls (OpenAI background responses and their resumed streams, which run on at the provider) whose connection was closed, by route and who closed it; not cancellations.",
            &["route", "origin"],
        );
        let cancellations = counter(
            "hourglass_cancellations_total",
            "Requests cancelled, by route and the one origin of the cancellation.",
            &["route", "origin"],
        );
        let budget = histogram(
            "hourglass_budget_seconds",
            "Budget given to each request.",
            &["route"],
            BUDGET_BUCKETS,
        );
        let margin = histogram(
            "hourglass_budget_margin_seconds",
            "Budget left when a response completed.",
            &["route"],
            LATENCY_BUCKETS,
        );
        let used_ratio = histogram(
            "hourglass_budget_used_ratio",
            "Elapsed time divided by budget, for every request that had one (see docs/metrics.md).",
            &["route"],
            RATIO_BUCKETS,
        );
        let duration = histogram(
            "hourglass_request_duration_seconds",
            "Time from request head to the end of the response.",
            &["route"],
            LATENCY_BUCKETS,
        );
        let ttft = histogram(
            "hourglass_time_to_first_token_seconds",
            "Time from request head to the first event carrying model output (with a known API; else the first data event, or the first body byte for non-SSE).",
            &["route", "upstream"],
            LATENCY_BUCKETS,
        );
        let ttfb = histogram(
            "hourglass_time_to_first_byte_seconds",
            "Time from request head to the first byte of the upstream's response body.",
            &["route", "upstream"],
            LATENCY_BUCKETS,
        );
        let tokens = counter(
            "hourglass_tokens_total",
            "Tokens of answers, by kind (prompt, completion) and source (reported by the provider, or estimated from the deltas seen).",
            &["route", "upstream", "kind", "source"],
        );
        let tokens_cancelled = counter(
            "hourglass_tokens_cancelled_total",
            "Completion tokens streamed to requests that were then cancelled, by the origin of the cancellation.",
            &["route", "origin"],
        );
        let stream_errors = counter(
            "hourglass_upstream_stream_errors_total",
            "Errors the provider sent in the middle of a stream (passed through), by their type.",
            &["route", "upstream", "type"],
        );
        let responses = counter(
            "hourglass_upstream_responses_total",
            "Answers upstreams gave to attempts (each attempt's head, retried or not), by status class.",
            &["route", "upstream", "class"],
        );
        let connect_errors = counter(
            "hourglass_upstream_connect_errors_total",
            "Attempts whose connection to the upstream could not be made, by reason: dns (the name did not resolve), refused, timeout (connect_timeout, or the server's first HTTP/2 frame), tls (the handshake failed), other.",
            &["upstream", "reason"],
        );
        let in_flight = gauge(
            "hourglass_upstream_requests_in_flight",
            "Upstream requests started and not yet finished or cancelled.",
            &["upstream"],
        );
        let requests_in_flight = gauge(
            "hourglass_requests_in_flight",
            "Client requests being served (from the choice of their route to the end of their answer), by route.",
            &["route"],
        );
        let client_connections = registered(
            &registry,
            IntGauge::new(
                "hourglass_client_connections",
                "Client connections open on the client listener, TLS handshakes included.",
            ),
        );
        let accept_errors = counter(
            "hourglass_accept_errors_total",
            "Failed accepts by listener (clients, admin) and reason (descriptors: the open-file limit reached; memory; other). A listener retries every 50ms.",
            &["listener", "reason"],
        );
        for listener in ["clients", "admin"] {
            for reason in ACCEPT_ERRORS {
                accept_errors.with_label_values(&[listener, reason]);
            }
        }
        let open_fds = registered(
            &registry,
            IntGauge::new(
                "process_open_fds",
                "Open file descriptors, counted at each scrape (Linux); the limit when even the count found none left.",
            ),
        );
        let max_fds = registered(
            &registry,
            IntGauge::new(
                "process_max_fds",
                "The open-file limit (soft RLIMIT_NOFILE), read at each scrape (Linux).",
            ),
        );
        let client_requests = counter(
            "hourglass_client_requests_total",
            "Requests on routes with client keys, by the client their key names (its name in the key file, else the start of the key's SHA-256) and outcome.",
            &["route", "client", "outcome"],
        );
        let client_tokens = counter(
            "hourglass_client_tokens_total",
            "Tokens of requests on routes with client keys, by client, kind (prompt, completion) and source (reported, estimated).",
            &["route", "client", "kind", "source"],
        );
        let retries = counter(
            "hourglass_retries_total",
            "Extra attempts on the same upstream, by the failure that caused them.",
            &["route", "upstream", "reason"],
        );
        let fallbacks = counter(
            "hourglass_fallbacks_total",
            "Moves from one upstream to the next in a route's fallback chain.",
            &["route", "from", "to"],
        );
        let hedges = counter(
            "hourglass_hedges_total",
            "Hedged requests (a fallback started in parallel), by which attempt won (none: neither).",
            &["route", "winner"],
        );
        let ejections = counter(
            "hourglass_upstream_ejections_total",
            "Times an upstream was taken out of rotation: its attempts failed eject_after times in a row (a failed probe keeps it out and is not counted again).",
            &["upstream"],
        );
        let ejected = gauge(
            "hourglass_upstream_ejected",
            "1 while an upstream is out of rotation: from its ejection until a probe succeeds.",
            &["upstream"],
        );
        let skipped = counter(
            "hourglass_upstream_skipped_total",
            "Attempts not made on an upstream out of rotation, passed over for the next upstream of the route's chain.",
            &["route", "upstream"],
        );
        let attempts = histogram(
            "hourglass_attempts",
            "Upstream attempts made for one request.",
            &["route"],
            &[0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
        );
        let reloads = counter(
            "hourglass_config_reloads_total",
            "Configuration reloads, by result (ok, error).",
            &["result"],
        );
        for result in ["ok", "error"] {
            reloads.with_label_values(&[result]);
        }
        let config_info = gauge(
            "hourglass_config_info",
            "The configuration being served: 1 for the hash of the loaded file.",
            &["hash"],
        );
        let panics = registered(
            &registry,
            IntCounter::new(
                "hourglass_panics_total",
                "Request handlers that panicked (a bug; the process keeps serving).",
            ),
        );
        let refused_heads = registered(
            &registry,
            IntCounterVec::new(
                Opts::new(
                    "hourglass_refused_heads_total",
                    "Client request heads refused before they became requests (no log line): \
                 malformed (a bare 400), too_large (431), header_timeout (408), tls (a TLS \
                 client on the plaintext listener, sent a handshake_failure alert), \
                 h2_without_alpn (HTTP/2 prior knowledge over TLS without ALPN h2, closed).",
                ),
                &["reason"],
            ),
        );
        for reason in [
            "malformed",
            "too_large",
            "header_timeout",
            "tls",
            "h2_without_alpn",
        ] {
            refused_heads.with_label_values(&[reason]);
        }
        let tls_handshake_failures = registered(
            &registry,
            IntCounterVec::new(
                Opts::new(
                    "hourglass_tls_handshake_failures_total",
                    "Client connections whose TLS handshake failed (no request): timeout (none \
                 within header_read_timeout), client_certificate (missing or refused; logged \
                 as client certificate refused), alert (the client refused the handshake, \
                 often this gateway's certificate), incompatible (no common version, cipher or ALPN protocol), \
                 plain_http (answered 400 plain_http_on_tls), malformed (not TLS), closed \
                 (the client left), other.",
                ),
                &["reason"],
            ),
        );
        for reason in TLS_HANDSHAKE_FAILURES {
            tls_handshake_failures.with_label_values(&[reason]);
        }
        let tls_expiry = gauge(
            "hourglass_tls_certificate_expiry_timestamp_seconds",
            "When the client listener's certificate ([server.tls] cert) expires, in Unix \
                 seconds; set at start-up and on every reload, absent without TLS.",
            &["listener"],
        );
        let tls_crl_due = gauge(
            "hourglass_tls_crl_next_update_timestamp_seconds",
            "When each [server.tls] client_crl CRL is due to be replaced (its nextUpdate), in \
                 Unix seconds, by issuer; set at start-up and on every reload.",
            &["issuer"],
        );
        let tls_pending = gauge(
            "hourglass_tls_certificate_pending_timestamp_seconds",
            "A [server.tls] cert file whose certificate is held back for its dates \
                 (not_yet_valid, expired) while the served one is valid: when it is tried \
                 again (its notBefore, or the served one's notAfter), in Unix seconds; \
                 absent otherwise.",
            &["listener", "reason"],
        );
        let log_lines_dropped = registered(
            &registry,
            IntCounter::new(
                "hourglass_log_lines_dropped_total",
                "Log lines dropped because the log's reader fell behind (the gateway never waits \
             on its log) or its output failed (a closed pipe).",
            ),
        );
        let runs_active = registered(&registry, IntGauge::new(
            "hourglass_runs_active",
            "Runs held in this gateway's memory store; 0 with a shared store (Redis holds those runs).",
        ));
        let runs = RunMetrics {
            active: runs_active,
            ends: counter(
                "hourglass_runs_total",
                "Runs that ended, by the route that fixed their limits (else their first call's) and how they ended (expired, deadline, calls, tokens, loop, evicted; lost: a Redis run found gone at a call's end, not in the run histograms).",
                &["route", "end"],
            ),
            refusals: counter(
                "hourglass_run_refusals_total",
                "Calls a run refused, by the run's route and the limit (deadline, calls, tokens, loop).",
                &["route", "reason"],
            ),
            calls: histogram(
                "hourglass_run_calls",
                "Calls a run made, observed when it ends.",
                &["route"],
                &[1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0],
            ),
            tokens: histogram(
                "hourglass_run_tokens",
                "Tokens (prompt and completion, reported or estimated) a run used, observed when it ends.",
                &["route"],
                &[
                    100.0, 1_000.0, 5_000.0, 10_000.0, 50_000.0, 100_000.0, 500_000.0,
                    1_000_000.0, 5_000_000.0,
                ],
            ),
            duration: histogram(
                "hourglass_run_duration_seconds",
                "Time from a run's first call to its end.",
                &["route"],
                LATENCY_BUCKETS,
            ),
            store_errors: counter(
                "hourglass_run_store_errors_total",
                "Calls to the run store that failed or took longer than store_timeout, by operation: admit (the call was then served without run limits, on_store_error = allow, or refused, deny), finish (a call's end, sent again until the store answers), find (an admin /runs/{id} lookup, answered 503).",
                &["op"],
            ),
        };
        for op in ["admit", "finish", "find"] {
            runs.store_errors.with_label_values(&[op]);
        }
        let stream_upstream = counter(
            "hourglass_stream_upstream_total",
            "Requests of clients that did not stream whose upstream answered with a stream (stream_upstream), read under the idle limit into one document, a partial answer or an error.",
            &["route"],
        );
        let partial_answers = counter(
            "hourglass_partial_answers_total",
            "Answers a limit cut after output came, sent as partial answers (partial_answers), by the limit's origin.",
            &["route", "origin"],
        );
        let metrics = Self {
            registry,
            runs,
            stream_upstream,
            partial_answers,
            log_lines_dropped,
            log_catch_up: Mutex::new(()),
            reloads,
            config_info,
            panics,
            refused_heads,
            tls_handshake_failures,
            tls_expiry,
            tls_crl_due,
            tls_pending,
            requests,
            cancellations,
            detached,
            budget,
            margin,
            used_ratio,
            duration,
            ttft,
            ttfb,
            tokens,
            tokens_cancelled,
            stream_errors,
            responses,
            connect_errors,
            in_flight,
            requests_in_flight,
            client_connections,
            accept_errors,
            open_fds,
            max_fds,
            client_requests,
            client_tokens,
            retries,
            fallbacks,
            hedges,
            ejections,
            ejected,
            skipped,
            attempts,
        };
        // The limit, read while a descriptor is free to read it: the first scrape may come
        // when none is.
        metrics.count_descriptors();
        metrics
    }

    /// Resolves (and so creates at zero) every series of one route, so dashboards see the
    /// route before its first request.
    pub fn route(&self, route: &str) -> RouteMetrics {
        RouteMetrics(Arc::new(RouteHandles {
            ok: self.requests.with_label_values(&[route, "ok"]),
            error: self.requests.with_label_values(&[route, "error"]),
            cancelled: self.requests.with_label_values(&[route, "cancelled"]),
            detached: self.requests.with_label_values(&[route, "detached"]),
            detached_by: Origin::CLOSES
                .iter()
                .map(|&o| (o, self.detached.with_label_values(&[route, o.as_str()])))
                .collect(),
            cancellations: Origin::ALL
                .iter()
                .map(|o| self.cancellations.with_label_values(&[route, o.as_str()]))
                .collect(),
            budget: self.budget.with_label_values(&[route]),
            margin: self.margin.with_label_values(&[route]),
            used_ratio: self.used_ratio.with_label_values(&[route]),
            duration: self.duration.with_label_values(&[route]),
            attempts: self.attempts.with_label_values(&[route]),
            tokens_cancelled: Origin::ALL
                .iter()
                .map(|o| {
                    self.tokens_cancelled
                        .with_label_values(&[route, o.as_str()])
                })
                .collect(),
            stream_upstream: self.stream_upstream.with_label_values(&[route]),
            partial_answers: self.partial_answers.clone(),
            in_flight: self.requests_in_flight.with_label_values(&[route]),
            client_requests: self.client_requests.clone(),
            client_tokens: self.client_tokens.clone(),
            route: Arc::from(route),
        }))
    }

    /// Client requests in flight on every route (`hourglass_requests_in_flight` summed).
    pub fn requests_in_flight(&self) -> i64 {
        use prometheus::core::Collector;
        self.requests_in_flight
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .map(|m| m.get_gauge().get_value() as i64)
            .sum()
    }

    /// Open client connections: one more for as long as the value lives.
    pub fn client_connection(&self) -> OpenConnection {
        self.client_connections.inc();
        OpenConnection(self.client_connections.clone())
    }

    /// The answer handles of one (route, upstream) pair; the token series exist from then on.
    pub fn answer(&self, route: &str, upstream: &str) -> AnswerMetrics {
        let tokens = |kind, source| {
            self.tokens
                .with_label_values(&[route, upstream, kind, source])
        };
        AnswerMetrics {
            ttfb: self.ttfb.with_label_values(&[route, upstream]),
            prompt_reported: tokens("prompt", "reported"),
            completion_reported: tokens("completion", "reported"),
            completion_estimated: tokens("completion", "estimated"),
            stream_errors: self.stream_errors.clone(),
            responses: RESPONSE_CLASSES
                .map(|class| self.responses.with_label_values(&[route, upstream, class])),
            connect_errors: self.connect_errors.clone(),
            route: Arc::from(route),
            upstream: Arc::from(upstream),
        }
    }

    /// Time-to-first-token handle for one (route, upstream) pair.
    pub fn ttft(&self, route: &str, upstream: &str) -> Histogram {
        self.ttft.with_label_values(&[route, upstream])
    }

    pub fn in_flight(&self, upstream: &str) -> IntGauge {
        self.in_flight.with_label_values(&[upstream])
    }

    /// Creates the retry/fallback/hedge series of a route at zero, so dashboards can plot
    /// rates before the first event. The first `group` upstreams of `chain` are balanced:
    /// a request may start at any of them and go on to any other, then to the fallbacks.
    pub fn init_policy(
        &self,
        route: &str,
        chain: &[&str],
        group: usize,
        retry_reasons: &[&str],
        hedged: bool,
    ) {
        for up in chain {
            for reason in retry_reasons {
                self.retries.with_label_values(&[route, up, reason]);
            }
        }
        // Any later upstream of a request's chain may be the next tried: those between may
        // be out of rotation, or not fit what is left of the budget.
        let (members, fallbacks) = chain.split_at(group.min(chain.len()));
        for (i, from) in chain.iter().enumerate() {
            let later: Vec<&&str> = if i < members.len() {
                members
                    .iter()
                    .filter(|to| *to != from)
                    .chain(fallbacks)
                    .collect()
            } else {
                chain[i + 1..].iter().collect()
            };
            for to in &later {
                self.fallbacks.with_label_values(&[route, from, to]);
            }
            // Only an upstream with another after it is ever passed over.
            if !later.is_empty() {
                self.skipped.with_label_values(&[route, from]);
            }
        }
        if hedged {
            for winner in ["primary", "hedge", "none"] {
                self.hedges.with_label_values(&[route, winner]);
            }
        }
    }

    // The policy counters are touched only when an attempt fails or a hedge resolves, so a
    // label lookup there costs nothing on the streaming path.
    pub fn retry(&self, route: &str, upstream: &str, reason: &str) {
        self.retries
            .with_label_values(&[route, upstream, reason])
            .inc();
    }

    pub fn fallback(&self, route: &str, from: &str, to: &str) {
        self.fallbacks.with_label_values(&[route, from, to]).inc();
    }

    /// Sets an upstream's ejection gauge to its state (a new config's upstreams: reused ones
    /// keep theirs, new ones start in rotation), creating its series (its connect errors'
    /// too, at zero).
    pub fn set_ejected(&self, upstream: &str, out: bool) {
        self.ejections.with_label_values(&[upstream]);
        for reason in CONNECT_ERRORS {
            self.connect_errors.with_label_values(&[upstream, reason]);
        }
        self.ejected
            .with_label_values(&[upstream])
            .set(i64::from(out));
    }

    /// An upstream was taken out of rotation.
    pub fn ejection(&self, upstream: &str) {
        self.ejections.with_label_values(&[upstream]).inc();
        self.set_ejected(upstream, true);
    }

    pub fn skipped(&self, route: &str, upstream: &str) {
        self.skipped.with_label_values(&[route, upstream]).inc();
    }

    pub fn reload(&self, ok: bool) {
        self.reloads
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
    }

    /// Marks `fingerprint` as the configuration being served (and no other).
    pub fn config_loaded(&self, fingerprint: &str) {
        self.config_info.reset();
        self.config_info.with_label_values(&[fingerprint]).set(1);
    }

    /// Creates a route's partial-answer series at zero (routes with `partial_answers`).
    /// The series of a route's clients, at zero: a counter that first appears with its
    /// first request's value loses that value to `rate()` and `increase()`, and those are
    /// what a client is billed from.
    pub fn init_clients(&self, route: &str, clients: &[String]) {
        for client in clients {
            for outcome in ["ok", "error", "cancelled", "detached"] {
                self.client_requests
                    .with_label_values(&[route, client, outcome]);
            }
            for (kind, source) in [
                ("prompt", "reported"),
                ("completion", "reported"),
                ("completion", "estimated"),
            ] {
                self.client_tokens
                    .with_label_values(&[route, client, kind, source]);
            }
        }
    }

    pub fn init_partial(&self, route: &str) {
        for origin in [
            Origin::Deadline,
            Origin::Idle,
            Origin::RunDeadline,
            Origin::RunTokens,
        ] {
            self.partial_answers
                .with_label_values(&[route, origin.as_str()]);
        }
    }

    pub fn runs(&self) -> &RunMetrics {
        &self.runs
    }

    /// An accept on `listener` (`clients` or `admin`) failed: `reason` is one of
    /// [`ACCEPT_ERRORS`].
    pub fn accept_failed(&self, listener: &'static str, reason: &'static str) {
        self.accept_errors
            .with_label_values(&[listener, reason])
            .inc();
    }

    pub fn panicked(&self) {
        self.panics.inc();
    }

    /// A client head refused before it became a request: `reason` is one of the five the
    /// metric's help names.
    pub fn refused_head(&self, reason: &'static str) {
        self.refused_heads.with_label_values(&[reason]).inc();
    }

    /// A client connection's TLS handshake failed: `reason` is one of
    /// `TLS_HANDSHAKE_FAILURES`.
    pub fn tls_handshake_failure(&self, reason: &'static str) {
        self.tls_handshake_failures
            .with_label_values(&[reason])
            .inc();
    }

    /// The listener certificate's expiry, or none (no TLS, or a notAfter that could not be
    /// read): the series goes.
    pub fn tls_certificate_expires(&self, at: Option<std::time::SystemTime>) {
        let secs = at.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        match secs {
            Some(s) => self
                .tls_expiry
                .with_label_values(&["client"])
                .set(i64::try_from(s.as_secs()).unwrap_or(i64::MAX)),
            None => {
                let _ = self.tls_expiry.remove_label_values(&["client"]);
            }
        }
    }

    /// A listener certificate held back for its dates (`not_yet_valid`, `expired`), and when
    /// it is tried again; `None` (none held back) removes the series.
    pub fn tls_certificate_pending(&self, held: Option<(&str, Option<std::time::SystemTime>)>) {
        self.tls_pending.reset();
        if let Some((reason, at)) = held {
            let secs = at
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .unwrap_or_default();
            self.tls_pending
                .with_label_values(&["client", reason])
                .set(i64::try_from(secs.as_secs()).unwrap_or(i64::MAX));
        }
    }

    /// The CRLs' nextUpdate by issuer: the series of CRLs no longer in the file go.
    pub fn tls_crls_due(&self, due: &[(String, std::time::SystemTime)]) {
        self.tls_crl_due.reset();
        for (issuer, at) in due {
            let secs = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            self.tls_crl_due
                .with_label_values(&[issuer])
                .set(i64::try_from(secs.as_secs()).unwrap_or(i64::MAX));
        }
    }

    pub fn hedge(&self, route: &str, winner: &str) {
        self.hedges.with_label_values(&[route, winner]).inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        if let Some(dropped) = LOG_LINES_DROPPED.get() {
            // The writer keeps the running total; the counter catches up at each scrape.
            let _one = self
                .log_catch_up
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let behind = dropped().saturating_sub(self.log_lines_dropped.get());
            self.log_lines_dropped.inc_by(behind);
        }
        self.count_descriptors();
        let mut out = Vec::with_capacity(16 * 1024);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

impl Metrics {
    /// `process_open_fds` and `process_max_fds`, read at the scrape only (audit KF 1: at
    /// descriptor exhaustion nothing showed it). Reading takes a descriptor: when none is
    /// left (EMFILE, ENFILE), every one the limit allows is open, and that is what is said.
    /// Off Linux (no `/proc`) both stay 0.
    fn count_descriptors(&self) {
        let max = std::fs::read_to_string("/proc/self/limits").map(|limits| {
            limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l["Max open files".len()..].split_whitespace().next())
                .and_then(|soft| soft.parse::<i64>().ok())
        });
        match max {
            Ok(Some(max)) => self.max_fds.set(max),
            Ok(None) => {}
            Err(e) if crate::error::Starved::of(&e).is_some() => {
                self.open_fds.set(self.max_fds.get());
                return;
            }
            Err(_) => return,
        }
        match std::fs::read_dir("/proc/self/fd") {
            // Less the one the listing itself holds.
            Ok(dir) => self
                .open_fds
                .set(i64::try_from(dir.count()).unwrap_or(i64::MAX) - 1),
            Err(e) if crate::error::Starved::of(&e).is_some() => {
                self.open_fds.set(self.max_fds.get())
            }
            Err(_) => {}
        }
    }
}

/// The reasons of `hourglass_accept_errors_total`.
pub const ACCEPT_ERRORS: [&str; 3] = ["descriptors", "memory", "other"];

/// The reason an accept failed, as `hourglass_accept_errors_total` counts it.
pub fn accept_error_reason(e: &std::io::Error) -> &'static str {
    match crate::error::Starved::of(e) {
        Some(crate::error::Starved::Descriptors) => "descriptors",
        Some(crate::error::Starved::Memory) => "memory",
        _ => "other",
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pair a request can go between exists from start-up: a member to any other
    /// member or any fallback, a fallback to any after it (those between may be passed over,
    /// out of rotation, or not fit the budget). Every upstream but the last may be skipped.
    #[test]
    fn every_fallback_a_chain_can_make_exists_at_zero() {
        let m = Metrics::new();
        m.init_policy("chat", &["a", "b", "f1", "f2"], 2, &[], false);
        let text = m.encode();
        let series = |name: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.starts_with(name))
                .map(|l| l.trim_start_matches(name).replace("route=\"chat\",", ""))
                .collect()
        };
        assert_eq!(
            series("hourglass_fallbacks_total"),
            [
                "{from=\"a\",to=\"b\"} 0",
                "{from=\"a\",to=\"f1\"} 0",
                "{from=\"a\",to=\"f2\"} 0",
                "{from=\"b\",to=\"a\"} 0",
                "{from=\"b\",to=\"f1\"} 0",
                "{from=\"b\",to=\"f2\"} 0",
                "{from=\"f1\",to=\"f2\"} 0",
            ]
        );
        assert_eq!(
            series("hourglass_upstream_skipped_total"),
            [
                "{upstream=\"a\"} 0",
                "{upstream=\"b\"} 0",
                "{upstream=\"f1\"} 0"
            ]
        );
    }

    /// The shutdown warning's count: every route's requests in flight.
    #[test]
    fn requests_in_flight_sums_every_route() {
        let m = Metrics::new();
        assert_eq!(m.requests_in_flight(), 0);
        let (chat, messages) = (m.route("chat"), m.route("messages"));
        chat.in_flight.inc();
        chat.in_flight.inc();
        messages.in_flight.inc();
        assert_eq!(m.requests_in_flight(), 3);
        chat.in_flight.dec();
        assert_eq!(m.requests_in_flight(), 2);
    }

    #[test]
    fn route_series_exist_at_zero_with_contract_names() {
        let m = Metrics::new();
        let r = m.route("chat");
        m.ttft("chat", "openai");
        let answer = m.answer("chat", "openai");
        answer.stream_error("overloaded_error");
        answer.response(503);
        // Audit MC 3: a refused 101 was counted as 2xx, a 600 as 5xx.
        answer.response(101);
        answer.response(600);
        answer.response(999);
        m.in_flight("openai");
        r.cancellation(Origin::Idle).inc();
        let text = m.encode();
        for needle in [
            "hourglass_requests_total{outcome=\"ok\",route=\"chat\"} 0",
            "hourglass_cancellations_total{origin=\"idle\",route=\"chat\"} 1",
            "hourglass_cancellations_total{origin=\"client\",route=\"chat\"} 0",
            "hourglass_requests_total{outcome=\"detached\",route=\"chat\"} 0",
            "hourglass_detached_total{origin=\"client\",route=\"chat\"} 0",
            "hourglass_detached_total{origin=\"first_token\",route=\"chat\"} 0",
            "hourglass_budget_seconds_bucket{route=\"chat\",le=\"+Inf\"} 0",
            "hourglass_time_to_first_token_seconds_count{route=\"chat\",upstream=\"openai\"} 0",
            "hourglass_time_to_first_byte_seconds_count{route=\"chat\",upstream=\"openai\"} 0",
            "hourglass_tokens_total{kind=\"completion\",route=\"chat\",source=\"estimated\",upstream=\"openai\"} 0",
            "hourglass_tokens_total{kind=\"prompt\",route=\"chat\",source=\"reported\",upstream=\"openai\"} 0",
            "hourglass_tokens_cancelled_total{origin=\"client\",route=\"chat\"} 0",
            "hourglass_upstream_requests_in_flight{upstream=\"openai\"} 0",
            "# HELP hourglass_budget_margin_seconds",
            "# TYPE hourglass_budget_used_ratio histogram",
            "hourglass_upstream_stream_errors_total{route=\"chat\",type=\"overloaded_error\",upstream=\"openai\"} 1",
            "hourglass_upstream_responses_total{class=\"2xx\",route=\"chat\",upstream=\"openai\"} 0",
            "hourglass_upstream_responses_total{class=\"5xx\",route=\"chat\",upstream=\"openai\"} 1",
            "hourglass_upstream_responses_total{class=\"1xx\",route=\"chat\",upstream=\"openai\"} 1",
            "hourglass_upstream_responses_total{class=\"other\",route=\"chat\",upstream=\"openai\"} 2",
            "hourglass_upstream_responses_total{class=\"4xx\",route=\"chat\",upstream=\"openai\"} 0",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }

    /// The only test in this binary that sets the process-wide source of dropped lines.
    #[test]
    fn dropped_log_lines_are_counted_once_per_line_across_scrapes() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static DROPPED: AtomicU64 = AtomicU64::new(0);
        count_dropped_log_lines(|| DROPPED.load(Ordering::Relaxed));
        let m = Metrics::new();
        assert!(m.encode().contains("hourglass_log_lines_dropped_total 0\n"));
        DROPPED.store(7, Ordering::Relaxed);
        assert!(m.encode().contains("hourglass_log_lines_dropped_total 7\n"));
        assert!(m.encode().contains("hourglass_log_lines_dropped_total 7\n"));
        DROPPED.store(9, Ordering::Relaxed);
        assert!(m.encode().contains("hourglass_log_lines_dropped_total 9\n"));
    }
}
