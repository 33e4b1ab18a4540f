//! The one log line per request (target `hourglass::request`), and its access-log form when
//! that format is on. Plain data in, so that the log knows nothing of the request path.

use std::time::Duration;

use http::Method;

use crate::telemetry::access::{ClientInfo, Line};

/// Everything the line says about one request.
pub struct RequestLog<'a> {
    pub request_id: &'a str,
    /// The run the request is a call of.
    pub run_id: Option<&'a str>,
    pub method: &'a Method,
    /// The path alone: a query string may carry a key (`?key=` is how Gemini takes one).
    pub path: &'a str,
    pub route: Option<&'a str>,
    pub upstream: Option<&'a str>,
    pub budget: Option<Duration>,
    pub budget_source: Option<&'static str>,
    pub budget_clamped: Option<bool>,
    pub elapsed: Duration,
    pub margin: Option<Duration>,
    pub ttfb: Option<Duration>,
    pub ttft: Option<Duration>,
    pub prompt_tokens: Option<u64>,
    /// With where the count came from (`reported` or `estimated`).
    pub completion_tokens: Option<(u64, &'static str)>,
    pub stream_error: Option<&'static str>,
    pub bytes: u64,
    pub status: Option<u16>,
    pub outcome: &'static str,
    pub origin: Option<&'static str>,
    pub code: Option<&'static str>,
    /// Every attempt, in order, when there was more than one.
    pub attempts: Option<&'a str>,
    /// Who asked: only kept when the access log is on.
    pub client: Option<&'a ClientInfo>,
}

/// Whole microseconds: the nearest double to a three-decimal number prints as just that in
/// the text format ("6826.474", not "6826.4743069999995"); JSON rounds it the same. (Through
/// u64: a u128 to f64 conversion is a software routine.)
fn ms(d: Duration) -> f64 {
    let micros = d
        .as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(d.subsec_micros()));
    micros as f64 / 1000.0
}

impl RequestLog<'_> {
    pub fn emit(&self) {
        tracing::info!(
            target: "hourglass::request",
            request_id = self.request_id,
            run_id = self.run_id,
            method = self.method.as_str(),
            path = self.path,
            route = self.route,
            upstream = self.upstream,
            budget_ms = self.budget.map(|b| b.as_millis() as u64),
            budget_source = self.budget_source,
            budget_clamped = self.budget_clamped,
            elapsed_ms = ms(self.elapsed),
            margin_ms = self.margin.map(ms),
            ttfb_ms = self.ttfb.map(ms),
            ttft_ms = self.ttft.map(ms),
            prompt_tokens = self.prompt_tokens,
            completion_tokens = self.completion_tokens.map(|c| c.0),
            tokens_source = self.completion_tokens.map(|c| c.1),
            stream_error = self.stream_error,
            bytes = self.bytes,
            status = self.status,
            outcome = self.outcome,
            origin = self.origin,
            code = self.code,
            attempts = self.attempts,
            "request"
        );
        if let Some(client) = self.client {
            let line = Line {
                client,
                method: self.method,
                path: self.path,
                status: self.status,
                bytes: self.bytes,
                request_id: self.request_id,
                route: self.route,
                elapsed: self.elapsed,
                outcome: self.outcome,
                origin: self.origin,
            }
            .render();
            tracing::info!(target: "hourglass::access", "{line}");
        }
    }
}
