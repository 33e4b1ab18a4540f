//! The time budget of one request. It is fixed once, when the request head is parsed, as an
//! absolute deadline; every later step (reading the body, connecting, waiting for tokens)
//! reads what is left of it instead of starting a clock of its own.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use tokio::time::Instant;

use crate::config::{Limits, MAX_DURATION};
use crate::error::{GatewayError, RunNeed};
use crate::http::headers::present;

pub const BUDGET_HEADER: &str = "x-request-budget-ms";
pub const GRPC_TIMEOUT: &str = "grpc-timeout";
pub const ENVOY_EXPECTED: &str = "x-envoy-expected-rq-timeout-ms";
/// Sent by the official OpenAI (Node) and Anthropic SDKs, seconds. Not a whole-request
/// deadline: Node's covers the wait for the response head, anthropic-python's is its httpx
/// read timeout. Either way, the longest wait the client sits through without data.
pub const STAINLESS_TIMEOUT: &str = "x-stainless-timeout";
/// Sent by the official Python SDKs: the longest silence the client tolerates, seconds.
pub const STAINLESS_READ_TIMEOUT: &str = "x-stainless-read-timeout";
/// What a client asks for its whole run (section 10 of the contract): it may only shorten it.
pub const RUN_BUDGET_HEADER: &str = "x-run-budget-ms";

/// The same names as `HeaderName`s, built at compile time: looking a header up by `&str`
/// parses and validates the name on every call (about 200 instructions each, nine times a
/// request). Statics, so that a name borrowed from one is `'static` (error messages keep it).
pub mod names {
    use http::HeaderName;

    pub static BUDGET: HeaderName = HeaderName::from_static(super::BUDGET_HEADER);
    pub static GRPC_TIMEOUT: HeaderName = HeaderName::from_static(super::GRPC_TIMEOUT);
    pub static ENVOY_EXPECTED: HeaderName = HeaderName::from_static(super::ENVOY_EXPECTED);
    pub static STAINLESS_TIMEOUT: HeaderName = HeaderName::from_static(super::STAINLESS_TIMEOUT);
    pub static STAINLESS_READ_TIMEOUT: HeaderName =
        HeaderName::from_static(super::STAINLESS_READ_TIMEOUT);
    pub static STAINLESS_LANG: HeaderName = HeaderName::from_static("x-stainless-lang");
    pub static RUN_BUDGET: HeaderName = HeaderName::from_static(super::RUN_BUDGET_HEADER);

    /// Headers that carry a budget into Hourglass; none is forwarded as received.
    pub static INBOUND: [&HeaderName; 4] = [&BUDGET, &GRPC_TIMEOUT, &ENVOY_EXPECTED, &RUN_BUDGET];
}

/// Where a request's budget came from, for the log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetSource {
    Header,
    GrpcTimeout,
    EnvoyExpected,
    Config,
    /// The call's run had less left than the call's own budget: the run's deadline bounds it.
    Run,
}

impl BudgetSource {
    /// The client's own headers set the budget.
    pub fn is_client(self) -> bool {
        matches!(self, Self::Header | Self::GrpcTimeout | Self::EnvoyExpected)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Header => BUDGET_HEADER,
            Self::GrpcTimeout => GRPC_TIMEOUT,
            Self::EnvoyExpected => ENVOY_EXPECTED,
            Self::Config => "config",
            Self::Run => "run",
        }
    }
}

/// A request's budget, as an absolute deadline plus the limits every decision needs.
#[derive(Debug, Clone)]
pub struct Budget {
    pub arrival: Instant,
    /// `arrival + total`: when the client's promise runs out.
    pub deadline: Instant,
    pub total: Duration,
    pub source: BudgetSource,
    /// The client asked for more than the route's `max_budget`.
    pub clamped: bool,
    pub reserve: Duration,
    pub min_useful: Duration,
    /// The wait for a first token while the client hears nothing: the route's limit,
    /// lowered below the client's own read timeout so the client hears our error first.
    pub first_token_timeout: Duration,
    /// The route's own first-token limit, before the client's read timeout lowered it: a
    /// wait cut short of it says nothing of the upstream's health or connection. Once a
    /// head went out, the first token is waited for this long (the client's reads are
    /// bounded by `read_patience`).
    pub route_first_token_timeout: Duration,
    /// The route's longest silence between data events.
    pub idle_timeout: Duration,
    /// The client's read timeout (less a margin), when its SDK announced one: the longest
    /// it sits through a silence in which no byte reaches it. Keep-alives the upstream
    /// sends do reach it, so this is measured on what goes out, apart from the route's
    /// limits, which only data events satisfy.
    pub read_patience: Option<Duration>,
    pub connect_timeout: Duration,
    /// The client's SDK patience (its timeout, less a margin), when it announced one: an
    /// answer the gateway assembles keeps the client silent for all of its generation, so
    /// that answer must be ready (or cut) by `arrival + patience`.
    pub patience: Option<Duration>,
    /// Where `patience` counts from: the arrival, or, for a read timeout, the request's
    /// last byte (`body_read`).
    patience_from: Instant,
    patience_after_body: bool,
    /// When the request's body was read whole (the arrival until it is).
    body_read_at: Instant,
    /// The call's run, when the run's deadline comes before the call's own: then every limit
    /// that reads the deadline names the run.
    pub run: Option<RunBound>,
}

/// The run whose deadline bounds a call.
#[derive(Debug, Clone)]
pub struct RunBound {
    pub id: Arc<str>,
    /// The run's whole budget, for messages.
    pub budget: Duration,
}

/// What the client asked for, read once from the request head so that a route chosen later
/// (after the body names the model) resolves the same request against its own limits.
#[derive(Debug, Clone, Default)]
pub struct BudgetRequest {
    asked: Option<(Duration, BudgetSource)>,
    /// The client's SDK patience: its wait for the head (an answer assembled for it is one
    /// silence until its end).
    patience: Option<Duration>,
    /// ... and its read timeout, which every byte sent restarts.
    read_patience: Option<Duration>,
    /// The patience is a read timeout, which starts once the request is sent (httpx's, in
    /// the Python SDKs), not a timeout over the whole exchange (the Node SDKs' fetch).
    patience_after_body: bool,
}

impl BudgetRequest {
    /// Reads every budget header. A malformed, zero, negative, duplicated or overflowing value
    /// in any of them is refused: a client that sent a budget must not be served on another.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, GatewayError> {
        // Most requests carry none of them: one pass over the names present instead of five
        // lookups that hash each name.
        let any = present(
            headers,
            [
                &names::BUDGET,
                &names::GRPC_TIMEOUT,
                &names::ENVOY_EXPECTED,
                &names::STAINLESS_TIMEOUT,
                &names::STAINLESS_READ_TIMEOUT,
            ],
        );
        if !any.contains(&true) {
            return Ok(Self::default());
        }
        let ms = single(headers, &names::BUDGET)?
            .map(|v| parse_millis(BUDGET_HEADER, v))
            .transpose()?;
        let grpc = single(headers, &names::GRPC_TIMEOUT)?
            .map(parse_grpc_timeout)
            .transpose()?;
        let envoy = single(headers, &names::ENVOY_EXPECTED)?
            .map(|v| parse_millis(ENVOY_EXPECTED, v))
            .transpose()?;
        let asked = ms
            .map(|d| (d, BudgetSource::Header))
            .or(grpc.map(|d| (d, BudgetSource::GrpcTimeout)))
            .or(envoy.map(|d| (d, BudgetSource::EnvoyExpected)));
        let min = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timeout = patience(headers, &names::STAINLESS_TIMEOUT, Whole::RoundedDown);
        let read_timeout = patience(headers, &names::STAINLESS_READ_TIMEOUT, Whole::Exact);
        // The Node SDKs' `x-stainless-timeout` is their wait for the head: once it has come
        // they wait as long as the stream lasts. anthropic-python's is its read timeout.
        let lang = headers
            .get(&names::STAINLESS_LANG)
            .map(HeaderValue::as_bytes);
        let node = lang == Some(b"js");
        // Only the Python SDKs' timeout is httpx's read timeout, which starts once the request
        // is sent; the Go, Java and Node SDKs' cover the whole exchange, upload and all
        // (audit JA 3: a Go client timed out blind, its wait counted from its upload's end).
        let python = lang == Some(b"python");
        Ok(Self {
            asked,
            patience: min(timeout, read_timeout),
            read_patience: min(if node { None } else { timeout }, read_timeout),
            patience_after_body: python,
        })
    }

    /// Resolves against a route's limits. `arrival` is when the head was parsed, so a route
    /// picked after reading the body still counts the body's time against the budget.
    pub fn resolve(&self, limits: &Limits, arrival: Instant) -> Budget {
        let (asked, source) = self.asked.unwrap_or((limits.budget, BudgetSource::Config));
        let clamped = asked > limits.max_budget;
        let total = asked.min(limits.max_budget);
        let silence = |d: Duration| self.read_patience.map_or(d, |cap| d.min(cap));
        Budget {
            arrival,
            deadline: arrival + total,
            total,
            source,
            clamped,
            reserve: limits.reserve,
            min_useful: limits.min_useful,
            first_token_timeout: silence(limits.first_token_timeout),
            route_first_token_timeout: limits.first_token_timeout,
            idle_timeout: limits.idle_timeout,
            read_patience: self.read_patience,
            connect_timeout: limits.connect_timeout,
            patience: self.patience,
            patience_from: arrival,
            patience_after_body: self.patience_after_body,
            body_read_at: arrival,
            run: None,
        }
    }
}

impl Budget {
    /// When work on the upstream must stop: the deadline less what is held back for after it.
    pub fn work_deadline(&self) -> Instant {
        self.deadline
            .checked_sub(self.reserve)
            .unwrap_or(self.arrival)
    }

    /// When the client's SDK gives up waiting for the head (its patience, less a margin),
    /// when it said: every attempt's wait for the head ends by then, however many attempts
    /// the route makes, so that the client reads our error rather than its own timeout.
    pub fn head_by(&self) -> Option<Instant> {
        self.patience.map(|p| self.patience_from + p)
    }

    /// The request's body was read whole at `at`: a read timeout (the Python SDKs') starts
    /// only then, as the client's wait for the head does, so an upload's time is not taken
    /// from it (audit IF 1: a 5 MiB upload at 500 KB/s with a 20 s timeout got a 504 the
    /// client would have waited for).
    pub fn body_read(&mut self, at: Instant) {
        self.body_read_at = at.max(self.arrival);
        if self.patience_after_body {
            self.patience_from = at.max(self.arrival);
        }
    }

    /// `end`, or the client's `head_by` when that comes first: where a wait for the head
    /// must end.
    pub fn head_wait_until(&self, end: Instant) -> Instant {
        self.head_by().map_or(end, |by| by.min(end))
    }

    /// Makes the call end by its run's deadline, when that comes first.
    pub fn bind_run(&mut self, id: Arc<str>, deadline: Instant, run_budget: Duration) {
        if deadline < self.deadline {
            self.deadline = deadline;
            self.total = deadline.saturating_duration_since(self.arrival);
            self.source = BudgetSource::Run;
            self.run = Some(RunBound {
                id,
                budget: run_budget,
            });
        }
    }

    /// The error of a deadline that passed: the call's, or its run's.
    pub fn deadline_error(&self) -> GatewayError {
        deadline_error(
            self.total,
            self.reserve,
            self.source.is_client(),
            self.run.as_ref(),
            Duration::ZERO,
        )
    }

    /// What the upstream may still spend at `now`.
    pub fn usable(&self, now: Instant) -> Duration {
        self.work_deadline().saturating_duration_since(now)
    }

    /// What a call could wait at `at`: the usable budget, or less where the client stops
    /// waiting for the head first.
    fn room_at(&self, at: Instant) -> Duration {
        let usable = self.usable(at);
        self.head_by()
            .map_or(usable, |by| usable.min(by.saturating_duration_since(at)))
    }

    /// Whether the client's own upload spent what a call needing `need` needed: it fit on
    /// arrival and no longer did once the body's last byte came. The same upload would
    /// spend it again: the answer says so, and not to retry (audit ZA 2).
    pub fn spent_uploading(&self, need: Duration) -> bool {
        self.body_read_at > self.arrival
            && self.room_at(self.arrival) >= need
            && self.room_at(self.body_read_at) < need
    }

    /// The fail-fast rule: with less than `min_useful` usable, the upstream is never called;
    /// nor when the client stops waiting for the answer's head sooner than that.
    pub fn ensure_useful(&self, now: Instant) -> Result<(), GatewayError> {
        if let (Some(by), Some(patience)) = (self.head_by(), self.patience) {
            let waits = by.saturating_duration_since(now);
            if waits < self.min_useful && waits < self.usable(now) {
                return Err(GatewayError::InsufficientBudget {
                    remaining: waits,
                    reserve: self.reserve,
                    min_useful: self.min_useful,
                    expected_by: None,
                    whole: patience <= self.min_useful,
                    patience: true,
                    uploading: None,
                });
            }
        }
        let usable = self.usable(now);
        if usable < self.min_useful || usable.is_zero() {
            // A budget of exactly reserve + min_useful is spent below it by the time any
            // check runs: too small from the start, too.
            let whole = self.total.saturating_sub(self.reserve) <= self.min_useful;
            // A budget that had room and is now over (a slow body, a long wait for a slot)
            // is a deadline that passed, as an attempt's would be, not one too small
            // (audit DC 5: "0ms of budget left" 200 ms after the deadline).
            if usable.is_zero() && !whole {
                return Err(self.deadline_error());
            }
            return Err(self.too_little(now, self.min_useful, None, whole));
        }
        Ok(())
    }

    /// The error of a call that cannot fit `needed` in what is left at `now`: the run's
    /// deadline exceeded when the run's deadline is what bounds the call (the same call of
    /// the same run fails the same way), else `insufficient_budget`. `whole`: the budget was
    /// too small from the start.
    /// `expected_by`: the upstream whose expected time to its first token is `needed`, and
    /// the model it is expected for.
    pub fn too_little(
        &self,
        now: Instant,
        needed: Duration,
        expected_by: Option<(&str, Option<&str>)>,
        whole: bool,
    ) -> GatewayError {
        let left = self.deadline.saturating_duration_since(now);
        if let Some(r) = self.run.as_ref() {
            // Past the deadline, what a call needs is beside the point.
            let short = !left.is_zero();
            return GatewayError::RunDeadlineExceeded {
                run: r.id.to_string(),
                budget: r.budget,
                left,
                reserve: self.reserve,
                need: short.then(|| {
                    Box::new(RunNeed {
                        needed,
                        expected_by: expected_by.map(|(u, m)| (u.to_owned(), m.map(str::to_owned))),
                    })
                }),
            };
        }
        GatewayError::InsufficientBudget {
            // What the message calls left after the reserve.
            remaining: self.usable(now),
            reserve: self.reserve,
            min_useful: needed,
            expected_by: expected_by.map(|(u, m)| (u.to_owned(), m.map(str::to_owned))),
            whole,
            patience: false,
            uploading: None,
        }
    }

    /// The value of `x-request-budget-ms` forwarded upstream: what is usable now, rounded
    /// down, at least 1, so a chain of gateways shrinks one budget.
    pub fn forwarded_ms(&self, now: Instant) -> u64 {
        (self.usable(now).as_millis() as u64).max(1)
    }
}

/// The run budget a request asks for (`x-run-budget-ms`), refused like any budget header when
/// malformed, and held to the year any duration of the config is: on a route with no run
/// limit it is the run's, and 2^63 ms or more overflowed Redis's integers (a Lua double made
/// negative), so that the Redis store said no time left where memory said 2^64 ms (audit KD 3).
pub fn run_budget(headers: &HeaderMap) -> Result<Option<Duration>, GatewayError> {
    Ok(single(headers, &names::RUN_BUDGET)?
        .map(|v| parse_millis(RUN_BUDGET_HEADER, v))
        .transpose()?
        .map(|asked| asked.min(MAX_DURATION)))
}

/// The error of a deadline: the call's own (`budget`), or its run's when `run` bounds it;
/// `left` is what remains of the run when too little does.
pub fn deadline_error(
    budget: Duration,
    reserve: Duration,
    client_budget: bool,
    run: Option<&RunBound>,
    left: Duration,
) -> GatewayError {
    match run {
        None => GatewayError::DeadlineExceeded {
            budget,
            reserve,
            client_budget,
            patience: false,
            uploading: None,
        },
        Some(r) => GatewayError::RunDeadlineExceeded {
            run: r.id.to_string(),
            budget: r.budget,
            left,
            reserve,
            need: None,
        },
    }
}

fn single<'a>(
    headers: &'a HeaderMap,
    key: &'static HeaderName,
) -> Result<Option<&'a str>, GatewayError> {
    let name = key.as_str();
    let mut values = headers.get_all(key).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        let all: Vec<String> = headers
            .get_all(key)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        return Err(invalid(name, &all.join(", "), "is given more than once"));
    }
    first.to_str().map(Some).map_err(|_| {
        invalid(
            name,
            &String::from_utf8_lossy(first.as_bytes()),
            "is not ASCII",
        )
    })
}

fn invalid(header: &'static str, value: &str, reason: &'static str) -> GatewayError {
    // Bounded so that a hostile header cannot make the error body large.
    let value: String = value.chars().take(64).collect();
    GatewayError::InvalidBudget {
        header,
        value,
        reason,
    }
}

fn parse_millis(header: &'static str, v: &str) -> Result<Duration, GatewayError> {
    let n = parse_positive(
        header,
        v,
        "must be a positive integer number of milliseconds",
    )?;
    Ok(Duration::from_millis(n))
}

/// Digits only: no sign, no exponent, no fraction, no spaces inside.
fn parse_positive(header: &'static str, v: &str, what: &'static str) -> Result<u64, GatewayError> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(header, v, what));
    }
    let n: u64 = v
        .parse()
        .map_err(|_| invalid(header, v, "does not fit in 64 bits"))?;
    if n == 0 {
        return Err(invalid(header, v, "must be greater than zero"));
    }
    Ok(n)
}

/// gRPC wire format: `TimeoutValue TimeoutUnit`, at most 8 digits, unit one of H M S m u n.
fn parse_grpc_timeout(v: &str) -> Result<Duration, GatewayError> {
    const WHAT: &str = "must be 1-8 digits followed by a unit (H, M, S, m, u, n)";
    let Some(unit) = v.bytes().last() else {
        return Err(invalid(GRPC_TIMEOUT, v, WHAT));
    };
    let digits = &v[..v.len() - 1];
    if digits.is_empty() || digits.len() > 8 {
        return Err(invalid(GRPC_TIMEOUT, v, WHAT));
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(GRPC_TIMEOUT, v, WHAT));
    }
    // At most 8 digits: always fits, and the error names the whole value.
    let n: u64 = digits.parse().map_err(|_| invalid(GRPC_TIMEOUT, v, WHAT))?;
    if n == 0 {
        return Err(invalid(GRPC_TIMEOUT, v, "must be greater than zero"));
    }
    let d = match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return Err(invalid(GRPC_TIMEOUT, v, WHAT)),
    };
    // The gateway counts in milliseconds: a legal sub-millisecond timeout is its smallest
    // budget, not one of a few nanoseconds, whose used ratio (elapsed / budget) came to
    // 43,000 for one request and swamped its route's mean (audit DC 4).
    Ok(d.max(Duration::from_millis(1)))
}

/// What a whole number of seconds (no decimal point) in an SDK timeout header means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Whole {
    /// The timeout itself (the Python SDKs' `x-stainless-read-timeout`: `str()` of the
    /// number they were given).
    Exact,
    /// A timeout rounded down to the second: the Node SDKs send `x-stainless-timeout` as
    /// `Math.trunc(ms / 1000)`, so `1` is a client that waits anywhere from 1 s to 1.999 s.
    /// Still read as the whole seconds it says, the bottom of that range: round timeouts
    /// (5,000 ms, the default 600,000) are the usual case, and only a patience below the
    /// client's real one lets it hear why its call ended. Read as the top of its second
    /// (audit IA 1's fix), a 5 s client sent `5` timed out blind at 5.0 s, the gateway's 504
    /// due at 5.4 s (audit JA 2); a 1.9 s client sent `1` is cut at 900 ms, with that 504.
    /// Only `0`, a timeout under a second, is read as the top of its second: as the bottom
    /// it would say nothing.
    RoundedDown,
}

/// Below a second's whole range: the top of what a truncated value may stand for.
const TRUNCATED_UP_TO: Duration = Duration::from_millis(999);

/// The SDKs' own timeouts, in (possibly fractional) seconds. They are hints, not requests:
/// an unreadable one is ignored rather than refused. The returned cap sits a little below the
/// client's limit (10%, at most 1 s) so that our error reaches the client before it gives up.
/// A `0` that may be a timeout under a second rounded down (`whole`) is taken at the top of
/// that second; a client that gives up sooner leaves, and its leaving cancels the upstream
/// call as without the header.
fn patience(headers: &HeaderMap, name: &HeaderName, whole: Whole) -> Option<Duration> {
    let mut values = headers.get_all(name).iter();
    // Sent twice, it cannot be told which the SDK keeps: no hint at all.
    let (Some(v), None) = (values.next(), values.next()) else {
        return None;
    };
    let v = v.to_str().ok()?.trim();
    let secs: f64 = v.parse().ok()?;
    let truncated = whole == Whole::RoundedDown && v.bytes().all(|b| b.is_ascii_digit());
    // A Node timeout under a second is sent as `0`.
    if !secs.is_finite() || secs < 0.0 || (secs == 0.0 && !truncated) || secs > 1e9 {
        return None;
    }
    let mut d = Duration::from_secs_f64(secs);
    if truncated && d.is_zero() {
        d = TRUNCATED_UP_TO;
    }
    let margin = (d / 10).min(Duration::from_secs(1));
    Some(d - margin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn limits() -> Limits {
        Limits {
            budget: Duration::from_secs(60),
            max_budget: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(2),
            first_token_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(20),
            reserve: Duration::from_millis(0),
            min_useful: Duration::from_millis(100),
        }
    }

    /// A run budget asked past the year any config duration is held to is a year (audit KD 3:
    /// 2^63 ms or more overflowed Redis's integers); one within it is as asked.
    #[test]
    fn a_run_budget_is_held_to_a_year() {
        for asked in ["18446744073709551615", "9223372036854775808", "31557600001"] {
            let h = headers(&[(RUN_BUDGET_HEADER, asked)]);
            assert_eq!(run_budget(&h).unwrap(), Some(MAX_DURATION), "{asked}");
        }
        let h = headers(&[(RUN_BUDGET_HEADER, "31557600000")]);
        assert_eq!(run_budget(&h).unwrap(), Some(MAX_DURATION));
        let h = headers(&[(RUN_BUDGET_HEADER, "1500")]);
        assert_eq!(run_budget(&h).unwrap(), Some(Duration::from_millis(1500)));
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn resolve(pairs: &[(&'static str, &str)]) -> Result<Budget, GatewayError> {
        let now = Instant::now();
        BudgetRequest::from_headers(&headers(pairs)).map(|r| r.resolve(&limits(), now))
    }

    #[tokio::test]
    async fn precedence_header_then_grpc_then_envoy_then_config() {
        let b = resolve(&[
            (BUDGET_HEADER, "1500"),
            (GRPC_TIMEOUT, "3S"),
            (ENVOY_EXPECTED, "4000"),
        ])
        .unwrap();
        assert_eq!(
            (b.total, b.source),
            (Duration::from_millis(1500), BudgetSource::Header)
        );
        let b = resolve(&[(GRPC_TIMEOUT, "3S"), (ENVOY_EXPECTED, "4000")]).unwrap();
        assert_eq!(
            (b.total, b.source),
            (Duration::from_secs(3), BudgetSource::GrpcTimeout)
        );
        let b = resolve(&[(ENVOY_EXPECTED, "4000")]).unwrap();
        assert_eq!(
            (b.total, b.source),
            (Duration::from_secs(4), BudgetSource::EnvoyExpected)
        );
        let b = resolve(&[]).unwrap();
        assert_eq!(
            (b.total, b.source),
            (Duration::from_secs(60), BudgetSource::Config)
        );
    }

    /// The log says where a call's budget came from: its run, when the run had less left.
    #[tokio::test]
    async fn a_run_that_shortens_the_budget_becomes_its_source() {
        let mut b = resolve(&[(BUDGET_HEADER, "5000")]).unwrap();
        b.bind_run(
            Arc::from("r"),
            b.arrival + Duration::from_secs(9),
            Duration::from_secs(9),
        );
        assert_eq!(
            (b.total, b.source),
            (Duration::from_secs(5), BudgetSource::Header)
        );
        b.bind_run(
            Arc::from("r"),
            b.arrival + Duration::from_secs(2),
            Duration::from_secs(9),
        );
        assert_eq!(
            (b.total, b.source),
            (Duration::from_secs(2), BudgetSource::Run)
        );
        assert_eq!(b.source.as_str(), "run");
    }

    #[tokio::test]
    async fn deadline_is_absolute_from_arrival() {
        let arrival = Instant::now();
        let b = BudgetRequest::from_headers(&headers(&[(BUDGET_HEADER, "2000")]))
            .unwrap()
            .resolve(&limits(), arrival);
        assert_eq!(b.deadline, arrival + Duration::from_secs(2));
    }

    #[tokio::test]
    async fn client_values_are_clamped_not_rejected() {
        let b = resolve(&[(BUDGET_HEADER, "99999999")]).unwrap();
        assert_eq!(b.total, Duration::from_secs(600));
        assert!(b.clamped);
        let b = resolve(&[(GRPC_TIMEOUT, "99999999H")]).unwrap();
        assert_eq!(b.total, Duration::from_secs(600));
    }

    #[tokio::test]
    async fn grpc_units() {
        for (v, d) in [
            (
                "1H",
                Duration::from_secs(3600).min(Duration::from_secs(600)),
            ),
            ("2M", Duration::from_secs(120)),
            ("7S", Duration::from_secs(7)),
            ("250m", Duration::from_millis(250)),
            ("250000u", Duration::from_millis(250)),
            ("25000000n", Duration::from_millis(25)),
            ("1n", Duration::from_millis(1)),
            ("999u", Duration::from_millis(1)),
            ("1500u", Duration::from_micros(1500)),
        ] {
            assert_eq!(resolve(&[(GRPC_TIMEOUT, v)]).unwrap().total, d, "{v}");
        }
    }

    #[test]
    fn every_bad_form_is_refused_naming_header_and_value() {
        let cases: &[(&'static str, &str, &str)] = &[
            (BUDGET_HEADER, "abc", "positive integer"),
            (BUDGET_HEADER, "0", "greater than zero"),
            (BUDGET_HEADER, "-5", "positive integer"),
            (BUDGET_HEADER, "1e3", "positive integer"),
            (BUDGET_HEADER, "1.5", "positive integer"),
            (BUDGET_HEADER, "+5", "positive integer"),
            (BUDGET_HEADER, "", "positive integer"),
            (BUDGET_HEADER, "99999999999999999999", "64 bits"),
            (ENVOY_EXPECTED, "soon", "positive integer"),
            (GRPC_TIMEOUT, "10", "unit"),
            (GRPC_TIMEOUT, "S", "unit"),
            (GRPC_TIMEOUT, "123456789S", "unit"),
            (GRPC_TIMEOUT, "0S", "greater than zero"),
            (GRPC_TIMEOUT, "5x", "unit"),
        ];
        for (h, v, why) in cases {
            let err = BudgetRequest::from_headers(&headers(&[(h, v)])).unwrap_err();
            assert_eq!(err.code(), "invalid_budget");
            let msg = err.to_string();
            assert!(msg.starts_with(h), "{msg}");
            assert!(msg.contains(&format!("{v:?}")), "{msg}");
            assert!(msg.contains(why), "{msg} should say {why}");
        }
    }

    #[test]
    fn duplicated_header_is_refused() {
        let err = BudgetRequest::from_headers(&headers(&[
            (BUDGET_HEADER, "100"),
            (BUDGET_HEADER, "200"),
        ]))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "x-request-budget-ms: \"100, 200\" is given more than once"
        );
    }

    /// A read timeout (the Python SDKs') starts once the request is sent; the Node SDKs'
    /// timeout covers the upload too.
    #[tokio::test(start_paused = true)]
    async fn a_read_timeout_counts_from_the_bodys_end_and_a_node_timeout_from_arrival() {
        let mut python = resolve(&[
            (STAINLESS_READ_TIMEOUT, "20"),
            ("x-stainless-lang", "python"),
        ])
        .unwrap();
        let mut node = resolve(&[(STAINLESS_TIMEOUT, "20.0"), ("x-stainless-lang", "js")]).unwrap();
        // The Go (and Java) SDKs' timeout covers the upload too (audit JA 3).
        let mut go = resolve(&[(STAINLESS_TIMEOUT, "20.0"), ("x-stainless-lang", "go")]).unwrap();
        let arrival = python.arrival;
        assert_eq!(python.head_by(), Some(arrival + Duration::from_secs(19)));
        tokio::time::advance(Duration::from_secs(15)).await;
        let sent = Instant::now();
        python.body_read(sent);
        node.body_read(sent);
        go.body_read(sent);
        assert_eq!(go.head_by(), Some(go.arrival + Duration::from_secs(19)));
        assert_eq!(python.head_by(), Some(sent + Duration::from_secs(19)));
        assert!(python.ensure_useful(sent).is_ok());
        assert_eq!(node.head_by(), Some(node.arrival + Duration::from_secs(19)));
        // The deadline is the budget's, from arrival, either way.
        assert_eq!(python.deadline, arrival + Duration::from_secs(60));
    }

    #[tokio::test]
    async fn stainless_patience_caps_watchdogs_below_the_client() {
        let b = resolve(&[(STAINLESS_READ_TIMEOUT, "5.0"), (STAINLESS_TIMEOUT, "600")]).unwrap();
        assert_eq!(b.first_token_timeout, Duration::from_millis(4500));
        assert_eq!(b.read_patience, Some(Duration::from_millis(4500)));
        assert_eq!(b.patience, Some(Duration::from_millis(4500)));
        // The route's idle limit is its own: the client's reads are bounded apart.
        assert_eq!(b.idle_timeout, Duration::from_secs(20));
        assert_eq!(b.total, Duration::from_secs(60));
        // Neither header is a whole-request deadline: a long healthy stream is not cut.
        let b = resolve(&[(STAINLESS_TIMEOUT, "12.0")]).unwrap();
        assert_eq!(b.total, Duration::from_secs(60));
        assert_eq!(b.first_token_timeout, Duration::from_millis(11_000));
        assert_eq!(b.read_patience, Some(Duration::from_millis(11_000)));
        // The Node SDKs' x-stainless-timeout is a wait for the head alone.
        let b = resolve(&[(STAINLESS_TIMEOUT, "12.0"), ("x-stainless-lang", "js")]).unwrap();
        assert_eq!(b.patience, Some(Duration::from_millis(11_000)));
        assert_eq!(b.read_patience, None);
        assert_eq!(b.first_token_timeout, Duration::from_secs(30));
        // Garbage from an SDK is ignored, never a reason to refuse the request.
        let b = resolve(&[(STAINLESS_TIMEOUT, "nan"), (STAINLESS_READ_TIMEOUT, "-1")]).unwrap();
        assert_eq!(b.total, Duration::from_secs(60));
        assert_eq!((b.patience, b.read_patience), (None, None));
    }

    /// The Node SDKs send `x-stainless-timeout` as `Math.trunc(ms / 1000)`: a whole number is
    /// read as the top of its second (less a millisecond), then less the margin; a decimal
    /// is exact. `x-stainless-read-timeout` (Python's `str()` of its number) is always exact,
    /// and anthropic-python sends it beside its whole `x-stainless-timeout`.
    #[tokio::test]
    async fn a_whole_stainless_timeout_is_read_as_the_top_of_its_second() {
        let js = |v| {
            resolve(&[(STAINLESS_TIMEOUT, v), ("x-stainless-lang", "js")])
                .unwrap()
                .patience
        };
        // The whole seconds it says, less 10%: below a round timeout's real end, so the
        // client hears why (audit JA 2: `5` read as 5.999 s fired after a 5 s client left).
        assert_eq!(js("1"), Some(Duration::from_millis(900)));
        assert_eq!(js("5"), Some(Duration::from_millis(4_500)));
        // A timeout under a second is sent as 0: the top of that second.
        assert_eq!(js("0"), Some(Duration::from_micros(899_100)));
        // The margin is at most a second.
        assert_eq!(js("600"), Some(Duration::from_secs(599)));
        assert_eq!(js("1.9").map(|d| d.as_millis()), Some(1_710));
        assert_eq!(js("0.0"), None);
        // anthropic-python: the read timeout, exact, is the tighter one.
        let b = resolve(&[(STAINLESS_TIMEOUT, "5"), (STAINLESS_READ_TIMEOUT, "5")]).unwrap();
        assert_eq!(b.patience, Some(Duration::from_millis(4_500)));
        assert_eq!(b.read_patience, Some(Duration::from_millis(4_500)));
        let b = resolve(&[(STAINLESS_READ_TIMEOUT, "0")]).unwrap();
        assert_eq!(b.patience, None);
    }

    /// A route's `min_useful` of 1,200 ms against a Node client that sent `1`: read as the
    /// 1 s it says (900 ms with the margin), it has no room, and is told so at once rather
    /// than timing out blind.
    #[tokio::test(start_paused = true)]
    async fn a_whole_second_timeout_below_min_useful_fails_fast() {
        let mut l = limits();
        l.min_useful = Duration::from_millis(1200);
        let arrival = Instant::now();
        let b = BudgetRequest::from_headers(&headers(&[
            (STAINLESS_TIMEOUT, "1"),
            ("x-stainless-lang", "js"),
        ]))
        .unwrap()
        .resolve(&l, arrival);
        assert!(matches!(
            b.ensure_useful(arrival),
            Err(GatewayError::InsufficientBudget { patience: true, .. })
        ));
        assert_eq!(b.head_by(), Some(arrival + Duration::from_millis(900)));
    }

    #[tokio::test(start_paused = true)]
    async fn fail_fast_and_forwarded_value() {
        let mut l = limits();
        l.reserve = Duration::from_millis(200);
        let arrival = Instant::now();
        let b = BudgetRequest::from_headers(&headers(&[(BUDGET_HEADER, "1000")]))
            .unwrap()
            .resolve(&l, arrival);
        assert_eq!(b.forwarded_ms(arrival), 800);
        assert!(b.ensure_useful(arrival).is_ok());
        tokio::time::advance(Duration::from_millis(750)).await;
        let err = b.ensure_useful(Instant::now()).unwrap_err();
        assert_eq!(err.code(), "insufficient_budget");
        assert_eq!(b.forwarded_ms(Instant::now()), 50);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(b.forwarded_ms(Instant::now()), 1);
        // Past the deadline, the budget is not too small: it is over.
        let err = b.ensure_useful(Instant::now()).unwrap_err();
        assert_eq!(err.code(), "deadline_exceeded");
    }

    /// A client whose SDK stops waiting sooner than `min_useful` (its read timeout of 10 ms)
    /// is refused as a budget that small is: the upstream would be called for an answer
    /// whose head could never reach it. It is told so, and told not to retry the same.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_waits_less_than_min_useful_fails_fast() {
        let b = resolve(&[("x-stainless-read-timeout", "0.01")]).unwrap();
        let err = b.ensure_useful(b.arrival).unwrap_err();
        assert_eq!(err.code(), "insufficient_budget");
        assert_eq!(
            err.to_string(),
            "insufficient budget: the client stops waiting for the answer 9ms from now (the \
             timeout its SDK announced in x-stainless-timeout or x-stainless-read-timeout, \
             less a margin); at least 100ms is needed to call the upstream"
        );
        assert_eq!(err.response().headers()["x-should-retry"], "false");
        // Sent twice, the hint is no hint.
        let b = resolve(&[
            ("x-stainless-read-timeout", "0.01"),
            ("x-stainless-read-timeout", "600"),
        ])
        .unwrap();
        assert!(b.ensure_useful(b.arrival).is_ok());
        // A second's patience is room enough, until it is spent.
        let b = resolve(&[("x-stainless-read-timeout", "1")]).unwrap();
        assert!(b.ensure_useful(b.arrival).is_ok());
        tokio::time::advance(Duration::from_millis(850)).await;
        let err = b.ensure_useful(Instant::now()).unwrap_err();
        assert!(err.to_string().contains("50ms from now"), "{err}");
        assert!(!err.response().headers().contains_key("x-should-retry"));
    }

    #[tokio::test]
    async fn one_millisecond_budget_is_never_useful() {
        let b = resolve(&[(BUDGET_HEADER, "1")]).unwrap();
        assert!(b.ensure_useful(b.arrival).is_err());
    }
}
