//! How one request ended, and the record that reports it. A `RequestRecord` travels with the
//! request (handler, then response body); whoever drops it last reports it, exactly once. A
//! record dropped before anyone said how the request ended was abandoned by the client: that
//! is how client disconnects are counted, at any phase, without a separate signal.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use tokio::time::Instant;

use crate::attempt::Started;
use crate::budget::Budget;
use crate::error::GatewayError;
use crate::inspect::{Source, Tokens};
use crate::metrics::{AnswerMetrics, Histogram, RouteMetrics};
use crate::provider::ErrorType;
use crate::proxy::ChainEntry;
use crate::upstream::Upstream;
use crate::watchdog::{Observer, StreamEnd};

/// Who cancelled a request. Each cancellation has exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Client = 0,
    Deadline,
    FirstToken,
    Idle,
    Connect,
    InsufficientBudget,
    Shutdown,
    /// The slower of two hedged attempts; an attempt cancelled, not a request.
    HedgeLoser,
    /// The route was at `max_in_flight` and the budget left no time to wait for a slot.
    Overloaded,
}

impl Origin {
    pub const ALL: [Origin; 9] = [
        Origin::Client,
        Origin::Deadline,
        Origin::FirstToken,
        Origin::Idle,
        Origin::Connect,
        Origin::InsufficientBudget,
        Origin::Shutdown,
        Origin::HedgeLoser,
        Origin::Overloaded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Deadline => "deadline",
            Self::FirstToken => "first_token",
            Self::Idle => "idle",
            Self::Connect => "connect",
            Self::InsufficientBudget => "insufficient_budget",
            Self::Shutdown => "shutdown",
            Self::HedgeLoser => "hedge_loser",
            Self::Overloaded => "overloaded",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Ok,
    Error(&'static str),
    Cancelled(Origin),
}

impl End {
    pub fn from_error(e: &GatewayError) -> Self {
        match e.origin() {
            Some(o) => End::Cancelled(o),
            None => End::Error(e.code()),
        }
    }

    fn outcome(self) -> &'static str {
        match self {
            End::Ok => "ok",
            End::Error(_) => "error",
            End::Cancelled(_) => "cancelled",
        }
    }
}

/// One upstream attempt, for the log line.
struct AttemptLog {
    upstream: Arc<str>,
    outcome: &'static str,
    took: Duration,
}

/// Everything the log line and the metrics need about one request.
pub struct RequestRecord {
    pub id: Arc<str>,
    method: Method,
    path: String,
    arrival: Instant,
    route: Option<Arc<str>>,
    upstream: Option<Arc<Upstream>>,
    metrics: RouteMetrics,
    ttft_metric: Option<Histogram>,
    answer_metrics: Option<Arc<AnswerMetrics>>,
    /// When the winning attempt's request was sent: the start of its first-token clock,
    /// which feeds the upstream's learned estimate.
    sent_at: Option<Instant>,
    budget: Option<Budget>,
    status: Option<u16>,
    first_token_at: Option<Instant>,
    first_byte_at: Option<Instant>,
    /// What the stream's inspector counted (only for a known format).
    tokens: Option<Tokens>,
    bytes: u64,
    code: Option<&'static str>,
    end: Option<End>,
    attempts: Vec<AttemptLog>,
    /// The route's admission slot, freed when the request is reported.
    slot: Option<crate::admission::Slot>,
    /// Only kept when the access log is on.
    client: Option<Box<crate::access::ClientInfo>>,
    /// Over HTTP/2, this request's stream, counted as open for the connection's idle limit
    /// until the answer is done (`idle`).
    _stream: Option<crate::idle::Open>,
}

impl RequestRecord {
    pub fn new(
        id: Arc<str>,
        method: Method,
        path: String,
        arrival: Instant,
        metrics: RouteMetrics,
    ) -> Self {
        Self {
            id,
            method,
            path,
            arrival,
            route: None,
            upstream: None,
            metrics,
            ttft_metric: None,
            answer_metrics: None,
            sent_at: None,
            budget: None,
            status: None,
            first_token_at: None,
            first_byte_at: None,
            tokens: None,
            bytes: 0,
            code: None,
            end: None,
            attempts: Vec::new(),
            slot: None,
            client: None,
            _stream: None,
        }
    }

    /// Who asked, for the access log (ignored when it is off).
    pub fn hold_stream(&mut self, stream: Option<crate::idle::Open>) {
        self._stream = stream;
    }

    pub fn set_client(
        &mut self,
        addr: Option<std::net::SocketAddr>,
        user_agent: Option<&str>,
        version: http::Version,
    ) {
        if crate::access::enabled() {
            self.client = Some(Box::new(crate::access::ClientInfo {
                addr,
                user_agent: user_agent.map(str::to_string),
                version,
                at: std::time::SystemTime::now(),
            }));
        }
    }

    pub fn set_route(&mut self, route: Arc<str>, metrics: RouteMetrics) {
        self.route = Some(route);
        self.metrics = metrics;
    }

    /// The upstream whose answer the client gets (the last attempt, or the hedge winner).
    pub fn set_upstream(&mut self, entry: &ChainEntry, started: &Started) {
        self.upstream = Some(entry.upstream.clone());
        self.ttft_metric = Some(entry.ttft.clone());
        self.answer_metrics = Some(entry.answer.clone());
        self.sent_at = Some(started.sent_at);
        if let Some(at) = started.first_byte_at {
            self.first_byte_at.get_or_insert(at);
        }
    }

    /// Holds the route's admission slot until the request ends.
    pub fn hold(&mut self, slot: crate::admission::Slot) {
        self.slot = Some(slot);
    }

    /// Hands the slot over to the stream (see `reaper`), which frees it when the stream
    /// ends or its deadline passes, whichever comes first.
    pub fn take_slot(&mut self) -> Option<crate::admission::Slot> {
        self.slot.take()
    }

    pub fn set_budget(&mut self, budget: Budget) {
        self.budget = Some(budget);
    }

    pub fn set_status(&mut self, status: u16) {
        self.status = Some(status);
    }

    /// Notes one attempt's result for the log line.
    pub fn attempt(&mut self, upstream: &Arc<str>, outcome: &'static str, started: Instant) {
        self.attempts.push(AttemptLog {
            upstream: upstream.clone(),
            outcome,
            took: Instant::now().saturating_duration_since(started),
        });
    }

    /// An attempt that lost a hedge race was cancelled: counted by origin, not as the
    /// request's outcome.
    pub fn hedge_loser(&self) {
        self.metrics.cancellation(Origin::HedgeLoser).inc();
    }

    /// Records a failure Hourglass answered itself (before or after the head).
    pub fn fail(&mut self, e: &GatewayError) {
        self.code = Some(e.code());
        self.end = Some(End::from_error(e));
    }

    pub fn complete(&mut self) {
        self.end = Some(End::Ok);
    }

    fn report(&mut self) {
        let now = Instant::now();
        let end = self.end.unwrap_or(End::Cancelled(Origin::Client));
        let m = &self.metrics;
        match end {
            End::Ok => m.ok.inc(),
            End::Error(_) => m.error.inc(),
            End::Cancelled(origin) => {
                m.cancelled.inc();
                m.cancellation(origin).inc();
            }
        }
        let elapsed = now - self.arrival;
        m.duration.observe(elapsed.as_secs_f64());
        if self.route.is_some() {
            m.attempts.observe(self.attempts.len() as f64);
        }
        let ttft = self.first_token_at.map(|t| t - self.arrival);
        if let (Some(t), Some(h)) = (ttft, &self.ttft_metric) {
            h.observe(t.as_secs_f64());
        }
        let ttfb = self.first_byte_at.map(|t| t - self.arrival);
        let completion = self.tokens.map(|t| t.completion());
        if let Some(a) = &self.answer_metrics {
            if let Some(t) = ttfb {
                a.ttfb.observe(t.as_secs_f64());
            }
            if let Some(p) = self.tokens.and_then(|t| t.prompt) {
                a.prompt_reported.inc_by(p);
            }
            match completion {
                Some((n, Source::Reported)) => a.completion_reported.inc_by(n),
                Some((n, Source::Estimated)) => a.completion_estimated.inc_by(n),
                None => {}
            }
            if let Some(kind) = self.stream_error() {
                a.stream_error(kind.as_str());
            }
        }
        if let (End::Cancelled(origin), Some((n, _))) = (end, completion) {
            m.tokens_cancelled(origin).inc_by(n);
        }
        let mut margin = None;
        if let Some(b) = &self.budget {
            m.budget.observe(b.total.as_secs_f64());
            if !b.total.is_zero() {
                m.used_ratio
                    .observe(elapsed.as_secs_f64() / b.total.as_secs_f64());
            }
            if end == End::Ok {
                // Never negative: an overrun shows in used_ratio > 1, not as a negative margin.
                let left = b.deadline.saturating_duration_since(now);
                m.margin.observe(left.as_secs_f64());
                margin = Some(left);
            }
        }
        let origin = match end {
            End::Cancelled(o) => Some(o.as_str()),
            _ => None,
        };
        let code = match end {
            End::Cancelled(Origin::Client) => Some("client_closed"),
            End::Error(c) => Some(c),
            _ => self.code,
        };
        // Whole microseconds: the nearest double to a three-decimal number prints as just that
        // in the text format ("6826.474", not "6826.4743069999995"); JSON rounds it the same.
        // (Through u64: a u128 to f64 conversion is a software routine.)
        let ms = |d: Duration| {
            let micros = d
                .as_secs()
                .saturating_mul(1_000_000)
                .saturating_add(u64::from(d.subsec_micros()));
            micros as f64 / 1000.0
        };
        // "openai:connect_timeout:512ms,backup:ok:1203ms": every attempt, in order.
        let attempts = (self.attempts.len() > 1).then(|| {
            self.attempts
                .iter()
                .map(|a| format!("{}:{}:{}ms", a.upstream, a.outcome, a.took.as_millis()))
                .collect::<Vec<_>>()
                .join(",")
        });
        tracing::info!(
            target: "hourglass::request",
            request_id = &*self.id,
            method = self.method.as_str(),
            path = self.path.as_str(),
            route = self.route.as_deref(),
            upstream = self.upstream.as_ref().map(|u| &*u.name),
            budget_ms = self.budget.as_ref().map(|b| b.total.as_millis() as u64),
            budget_source = self.budget.as_ref().map(|b| b.source.as_str()),
            budget_clamped = self.budget.as_ref().map(|b| b.clamped),
            elapsed_ms = ms(elapsed),
            margin_ms = margin.map(ms),
            ttfb_ms = ttfb.map(ms),
            ttft_ms = ttft.map(ms),
            prompt_tokens = self.tokens.and_then(|t| t.prompt),
            completion_tokens = completion.map(|c| c.0),
            tokens_source = completion.map(|c| c.1.as_str()),
            stream_error = self.stream_error().map(ErrorType::as_str),
            bytes = self.bytes,
            status = self.status,
            outcome = end.outcome(),
            origin,
            code,
            attempts = attempts.as_deref(),
            "request"
        );
        if let Some(client) = &self.client {
            let line = crate::access::Line {
                client,
                method: &self.method,
                path: &self.path,
                status: self.status,
                bytes: self.bytes,
                request_id: &self.id,
                route: self.route.as_deref(),
                elapsed,
                outcome: end.outcome(),
                origin,
            }
            .render();
            tracing::info!(target: "hourglass::access", "{line}");
        }
    }
}

impl RequestRecord {
    /// The provider's own mid-stream error: the type the inspector read, or `other` for an
    /// error event it could not name (or that came on a stream of unknown format).
    fn stream_error(&self) -> Option<ErrorType> {
        self.tokens
            .and_then(|t| t.error)
            .or_else(|| (self.code == Some("upstream_error_event")).then_some(ErrorType::Other))
    }
}

impl Observer for RequestRecord {
    fn first_token(&mut self, at: Instant) {
        if self.first_token_at.is_none() {
            self.first_token_at = Some(at);
            if let (Some(up), Some(sent)) = (&self.upstream, self.sent_at) {
                up.ttft.observe(at.saturating_duration_since(sent));
            }
        }
    }

    fn data(&mut self, len: usize) {
        if self.first_byte_at.is_none() {
            self.first_byte_at = Some(Instant::now());
        }
        self.bytes += len as u64;
    }

    fn tokens(&mut self, tokens: Tokens) {
        self.tokens = Some(tokens);
    }

    fn finish(&mut self, end: StreamEnd) {
        match end {
            StreamEnd::Complete => self.complete(),
            StreamEnd::Cut(e) => self.fail(&e),
            StreamEnd::UpstreamErrorEvent => {
                self.code = Some("upstream_error_event");
                self.end = Some(End::Error("upstream_error_event"));
            }
        }
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        self.report();
    }
}
