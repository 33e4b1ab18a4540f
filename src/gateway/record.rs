//! How one request ended, and the record that reports it. A `RequestRecord` travels with the
//! request (handler, then response body); whoever drops it last reports it, exactly once. A
//! record dropped before anyone said how the request ended was abandoned by the client: that
//! is how client disconnects are counted, at any phase, without a separate signal.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use tokio::time::Instant;

use crate::auth::ClientId;
use crate::budget::{Budget, BudgetSource};
use crate::error::{GatewayError, Origin};
use crate::gateway::routes::ChainEntry;
use crate::provider::inspect::{Source, Tokens};
use crate::provider::{may_generate, ErrorType};
use crate::runs::state::View;
use crate::runs::{Answer, RunCall, Used};
use crate::stream::limits::RunTokens;
use crate::stream::{Observer, StreamEnd};
use crate::telemetry::log::{
    clipped, clipped_path, RequestLog, CERT_MAX, ERROR_MAX, HEADER_MAX, MODEL_MAX,
};
use crate::telemetry::metrics::{AnswerMetrics, Histogram, RouteMetrics};
use crate::upstream::Upstream;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Ok,
    Error(&'static str),
    Cancelled(Origin),
    /// A detached call's connection was closed by this origin once the call was sent: an
    /// OpenAI background response runs on at the provider, so nothing was cancelled.
    Detached(Origin),
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
            End::Detached(_) => "detached",
        }
    }
}

/// One upstream attempt, for the log line.
/// An extra attempt not made to spare its upstream, as the log line's `throttled` names it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Throttled {
    /// A retry of an upstream out of rotation, tried only because nothing later in the
    /// chain was in rotation.
    RetryOutOfRotation = 1,
    /// A retry past its upstream's share of retries in flight.
    RetryBudget = 2,
    /// A hedge past its route's share of hedges (of its requests, or in flight).
    HedgeBudget = 4,
}

impl Throttled {
    const ALL: [Throttled; 3] = [
        Throttled::RetryOutOfRotation,
        Throttled::RetryBudget,
        Throttled::HedgeBudget,
    ];
    /// Held back retries after which the client's SDK should not retry in the gateway's
    /// place. Not `RetryOutOfRotation`: that request made its one attempt, as on a route
    /// without retries, and saying so gave the route that retries one try where one without
    /// retries got the SDK's three (audit IA 2).
    const RETRIES: u8 = Throttled::RetryBudget as u8;

    pub fn as_str(self) -> &'static str {
        match self {
            Throttled::RetryOutOfRotation => "retry_out_of_rotation",
            Throttled::RetryBudget => "retry_budget",
            Throttled::HedgeBudget => "hedge_budget",
        }
    }
}

struct AttemptLog {
    upstream: Arc<str>,
    /// How it ended; `None` while it runs (the request may end first: the client left, the
    /// shutdown grace ran out), and then it is logged with the request's end.
    outcome: Option<&'static str>,
    started: Instant,
    took: Duration,
}

/// What the log line and the metrics read of the request's budget: a fifth of the `Budget`
/// (which every open stream's record would otherwise carry whole).
#[derive(Debug, Clone, Copy)]
struct BudgetNote {
    deadline: Instant,
    total: Duration,
    source: BudgetSource,
    clamped: bool,
}

/// Everything the log line and the metrics need about one request.
pub struct RequestRecord {
    pub id: Arc<str>,
    method: Method,
    path: String,
    /// The path as the log carries it, when it is too long to carry whole.
    logged_path: Option<Box<str>>,
    arrival: Instant,
    route: Option<Arc<str>>,
    upstream: Option<Arc<Upstream>>,
    /// The model the client named: whose first-token estimate the upstream's answer teaches.
    model: Option<Arc<str>>,
    /// A background response created without a stream (`set_background`).
    background: bool,
    metrics: RouteMetrics,
    ttft_metric: Option<Histogram>,
    answer_metrics: Option<Arc<AnswerMetrics>>,
    /// When the winning attempt's request was sent: the start of its first-token clock,
    /// which feeds the upstream's learned estimate.
    sent_at: Option<Instant>,
    budget: Option<BudgetNote>,
    status: Option<u16>,
    first_token_at: Option<Instant>,
    first_byte_at: Option<Instant>,
    /// The time to first token / first byte went into its histogram: each is observed when
    /// it comes (a minute-long stream must not hold its latency back until it ends), or at
    /// the end should it come before its histogram was known; once either way.
    ttft_observed: bool,
    ttfb_observed: bool,
    /// What the stream's inspector counted (only for a known format).
    tokens: Option<Tokens>,
    /// The type of the provider's error event, as its reader typed it (Gemini's stream too,
    /// which has no inspector).
    provider_error: Option<ErrorType>,
    bytes: u64,
    /// The bytes of the client's body (the access line's size): what the gateway handed
    /// over, as it streamed or in one piece, which on an assembled answer is not what came
    /// from the upstream, and on a request the client left before its answer is none.
    sent: u64,
    /// The bytes of the upstream's answer handed to the client (`sent` less the gateway's
    /// own): what an answer that was not read is charged to its run by.
    answer_bytes: u64,
    /// The gateway reads the upstream's body itself before it answers (an assembled answer,
    /// a document read whole): what it reads is not yet the client's body.
    read_whole: bool,
    /// The call outlives its connection (`provider::background`).
    detached: bool,
    code: Option<&'static str>,
    /// The message that went with `code`.
    error: Option<Box<str>>,
    end: Option<End>,
    attempts: Vec<AttemptLog>,
    /// The upstreams passed over as out of rotation (`upstream::health`).
    passed_over: Vec<Arc<str>>,
    /// The extra attempts not made to spare an upstream (`Throttled` bits).
    throttled: u8,
    /// The last upstream answer asked for a wait that the gateway did not wait out
    /// (`left_wait`).
    left_wait: bool,
    /// The route's admission slot, freed when the request is reported.
    slot: Option<crate::admission::Slot>,
    /// Only kept when the access log is on.
    client: Option<Box<crate::telemetry::access::ClientInfo>>,
    /// Who the client is: the key its route accepted, the certificate its connection
    /// presented.
    client_id: Option<ClientId>,
    client_cert: Option<Arc<str>>,
    /// Over HTTP/2, this request's stream, counted as open for the connection's idle limit
    /// until the answer is done (`idle`).
    _stream: Option<crate::http::conn::Open>,
    /// What the client connection's socket tells of its client's reading.
    writes: Option<crate::http::conn::ClientWrites>,
    /// The run the request is a call of (boxed: most requests are in none).
    run: Option<Box<RunPart>>,
    request_bytes: u64,
    /// An HTTP/1 request body not (yet) read to its end: hyper closes such a connection
    /// after the answer, so an answer made now says `connection: close`.
    body_unread: bool,
}

/// What a call used of its run's tokens: prompt and completion, the prompt estimated from
/// the request body when the answer reported none (OpenAI's stream without `include_usage`
/// still sent its prompt). A successful call of a generation API whose answer went unread
/// (`unread`: the bytes of it handed to the client; an encoded answer) is estimated whole, a
/// token for every 4 bytes of request and of answer: counted as 0 it left such runs without
/// a token limit (audit DA 2). Any other unread answer is charged nothing: its bytes are not
/// tokens (an embedding's floats) or cost none (Anthropic's count_tokens, audit EB F2).
fn run_tokens_used(tokens: Option<Tokens>, request_bytes: u64, unread: Option<u64>) -> u64 {
    match tokens {
        Some(t) => t
            .prompt()
            .unwrap_or(request_bytes.div_ceil(4))
            .saturating_add(t.completion().0),
        None => unread.map_or(0, |answer| {
            request_bytes.div_ceil(4).saturating_add(answer.div_ceil(4))
        }),
    }
}

/// A call's part in its run.
struct RunPart {
    id: Arc<str>,
    /// Admitted: given back (what the call used) when the record reports.
    call: Option<RunCall>,
    /// What the run has left, as the answer's `x-run-*` headers say; none when the run's
    /// store could not say.
    view: Option<View>,
    /// The tool calls the answer asked for, read to its end.
    answer: Option<(u64, String)>,
    /// Served without the run's limits: its store could not answer.
    unenforced: bool,
    /// A partial answer, whose `answer` is the calls its document handed out (`handed_calls`).
    partial: bool,
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
            logged_path: clipped_path(&path).map(String::into_boxed_str),
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
            ttft_observed: false,
            ttfb_observed: false,
            tokens: None,
            provider_error: None,
            bytes: 0,
            sent: 0,
            answer_bytes: 0,
            read_whole: false,
            detached: false,
            code: None,
            end: None,
            attempts: Vec::new(),
            passed_over: Vec::new(),
            throttled: 0,
            left_wait: false,
            slot: None,
            client: None,
            client_id: None,
            client_cert: None,
            _stream: None,
            writes: None,
            run: None,
            request_bytes: 0,
            body_unread: false,
            model: None,
            background: false,
            error: None,
        }
    }

    pub fn set_body_unread(&mut self, unread: bool) {
        self.body_unread = unread;
    }

    pub fn body_unread(&self) -> bool {
        self.body_unread
    }

    /// How many bytes the request's body had (a partial answer's prompt estimate).
    pub fn set_request_bytes(&mut self, n: usize) {
        self.request_bytes = n as u64;
    }

    /// The call outlives its connection: a close once it was sent is counted `detached`.
    pub fn set_detached(&mut self) {
        self.detached = true;
    }

    pub fn request_bytes(&self) -> u64 {
        self.request_bytes
    }

    /// The name of the upstream whose answer this is, once one answered.
    pub fn upstream_name(&self) -> Option<String> {
        self.upstream.as_ref().map(|u| u.name.to_string())
    }

    /// The upstream was asked to stream for a client that did not.
    pub fn note_stream_upstream(&self) {
        self.metrics.stream_upstream.inc();
    }

    /// A partial answer was sent because `origin` cut the stream.
    pub fn note_partial(&self, origin: Origin) {
        self.metrics.partial_answer(origin);
    }

    /// A partial answer handed out these whole tool calls (`None`: none), read from its
    /// document: they are its answer for the run's loop stop, not the stream's calls, which
    /// hold the one the cut left half-written and the document dropped (audit ZB 5).
    pub fn handed_calls(&mut self, calls: Option<(Vec<u8>, String)>) {
        if let Some(run) = self.run.as_mut() {
            run.answer = calls.map(|(canon, name)| (crate::runs::fingerprint::of(&canon), name));
            run.partial = true;
        }
    }

    /// The request is an admitted call of a run.
    pub fn join_run(&mut self, call: RunCall) {
        self.run = Some(Box::new(RunPart {
            id: call.id.clone(),
            view: Some(call.admitted.view),
            call: Some(call),
            answer: None,
            unenforced: false,
            partial: false,
        }));
    }

    /// The request names run `id` and is served without its limits: the run's store could
    /// not answer (`on_store_error = "allow"`).
    pub fn unenforced_run(&mut self, id: Arc<str>) {
        self.named_run(id, None);
        if let Some(run) = self.run.as_mut() {
            run.unenforced = true;
        }
    }

    /// The request names run `id` and was not admitted to it: the run refused it (`view`
    /// is then what the run has left), or its store could not answer.
    pub fn named_run(&mut self, id: Arc<str>, view: Option<View>) {
        // The log's budget is what the call had: its own, or what its run had left.
        if let (Some(b), Some(deadline)) = (self.budget.as_mut(), view.and_then(|v| v.deadline)) {
            if deadline < b.deadline {
                b.deadline = deadline;
                b.total = deadline.saturating_duration_since(self.arrival);
                b.source = BudgetSource::Run;
            }
        }
        self.run = Some(Box::new(RunPart {
            id,
            call: None,
            view,
            answer: None,
            unenforced: false,
            partial: false,
        }));
    }

    /// Whether the answer's tool calls are to be gathered: its run stops loops.
    pub fn wants_tool_calls(&self) -> bool {
        self.run
            .as_ref()
            .and_then(|r| r.call.as_ref())
            .is_some_and(|c| c.stops_loops())
    }

    /// What the request's run has left, for the answer's headers.
    pub fn run_view(&self) -> Option<View> {
        let run = self.run.as_ref()?;
        let mut view = run.view?;
        // Answered before any attempt started: the call is withdrawn, and what admission
        // counted for it is the run's again.
        if let Some(call) = run.call.as_ref().filter(|c| !c.was_sent()) {
            view.calls_left = view.calls_left.map(|n| n.saturating_add(1));
            view.tokens_left = view.tokens_left.map(|n| n.saturating_add(call.reserve()));
        }
        Some(view)
    }

    /// What the run has left once this call's tokens are known (`tokens`, read from an
    /// answer the gateway assembled before sending its head): its reservation replaced by
    /// what it used, none left when the run's tokens ran out (`spent`). The run's other calls
    /// as they are now where the store can say without a round trip (memory: audit SF 2);
    /// in Redis, as admission saw them.
    pub fn run_view_after(&self, tokens: Option<Tokens>, spent: bool) -> Option<View> {
        let run = self.run.as_ref()?;
        let mut view = run.view?;
        if let Some(call) = &run.call {
            let used = self.run_tokens_used(tokens, None);
            view.tokens_left = call.tokens_left_after(used).unwrap_or_else(|| {
                view.tokens_left
                    .map(|left| left.saturating_add(call.reserve()).saturating_sub(used))
            });
            if spent {
                view.tokens_left = view.tokens_left.map(|_| 0);
            }
        }
        Some(view)
    }

    /// Whether the call asked the model for anything, as the upstream that answered it
    /// reads its path ([`Upstream::asks_model`]): a call that did not reserves none of its
    /// run's tokens (`gateway::run::join`) and is charged none, whatever usage its answer
    /// reports (an `api = "openai"` upstream reads an embedding's; audit PC 5).
    fn asks_model(&self) -> bool {
        self.upstream
            .as_ref()
            .is_some_and(|u| u.asks_model(&self.path, self.request_bytes))
    }

    /// What the call used of its run's tokens: see `run_tokens_used`, and none for a call
    /// that asked the model nothing.
    fn run_tokens_used(&self, tokens: Option<Tokens>, unread: Option<u64>) -> u64 {
        if self.asks_model() {
            run_tokens_used(tokens, self.request_bytes, unread)
        } else {
            0
        }
    }

    /// The token limit the answer streams under, when its run has one and the call asked
    /// the model (no other is charged tokens).
    pub fn run_tokens(&self) -> Option<RunTokens> {
        if !self.asks_model() {
            return None;
        }
        let call = self.run.as_ref()?.call.as_ref()?;
        Some(RunTokens {
            run: call.id.clone(),
            limit: call.limit_tokens()?,
            allowance: call.admitted.token_allowance?,
            prompt_estimate: self.request_bytes.div_ceil(4),
            live: call.live(),
            added: 0,
        })
    }

    /// Who asked, for the access log (ignored when it is off).
    pub fn hold_stream(&mut self, stream: Option<crate::http::conn::Open>) {
        self._stream = stream;
    }

    /// Whether the request came on an HTTP/2 stream.
    pub fn over_http2(&self) -> bool {
        self._stream.is_some()
    }

    /// The streams of the HTTP/2 connection this request came on.
    pub fn connection_streams(&self) -> Option<crate::http::conn::Streams> {
        self._stream.as_ref().map(crate::http::conn::Open::streams)
    }

    pub fn set_writes(&mut self, writes: Option<crate::http::conn::ClientWrites>) {
        self.writes = writes;
    }

    /// The connection's writes when this request is the connection's one stream (HTTP/1):
    /// what the socket takes is then this stream's.
    pub fn connection_writes(&self) -> Option<&crate::http::conn::ClientWrites> {
        self.writes.as_ref().filter(|_| self._stream.is_none())
    }

    pub fn set_client(
        &mut self,
        addr: Option<std::net::SocketAddr>,
        headers: &http::HeaderMap,
        version: http::Version,
    ) {
        if crate::telemetry::access::enabled() {
            // Not UTF-8 (a Latin-1 user agent): logged as near as it reads, not dropped.
            let text = |name| {
                headers.get(name).map(|v: &http::HeaderValue| {
                    clipped(&String::from_utf8_lossy(v.as_bytes()), HEADER_MAX).to_owned()
                })
            };
            self.client = Some(Box::new(crate::telemetry::access::ClientInfo {
                addr,
                user_agent: text(http::header::USER_AGENT),
                referer: text(http::header::REFERER),
                version,
                at: std::time::SystemTime::now(),
            }));
        }
    }

    pub fn set_client_id(&mut self, client: Option<ClientId>) {
        self.client_id = client;
    }

    pub fn set_client_cert(&mut self, subject: Option<Arc<str>>) {
        self.client_cert = subject;
    }

    /// The route the request is attributed to; the first call counts it in flight there,
    /// a later one moves it. (A request that never gets one, unrouted or refused at once,
    /// is not counted: it is over as soon as it came.)
    pub fn set_route(&mut self, route: Arc<str>, metrics: RouteMetrics) {
        if self.route.is_none() {
            metrics.in_flight.inc();
        } else if !self.metrics.same(&metrics) {
            self.metrics.in_flight.dec();
            metrics.in_flight.inc();
        }
        self.route = Some(route);
        self.metrics = metrics;
    }

    /// The body named a model no candidate route serves: the request is no route's after
    /// all, and is counted under `none` (`metrics`), not the route its path first picked.
    pub fn unroute(&mut self, metrics: RouteMetrics) {
        if self.route.take().is_some() {
            self.metrics.in_flight.dec();
        }
        self.metrics = metrics;
        // The candidates' budget bounded the body's read; no route's budget applies.
        self.budget = None;
    }

    pub fn set_model(&mut self, model: Option<Arc<str>>) {
        self.model = model;
    }

    /// The request creates a background response without a stream (see `may_generate`).
    pub fn set_background(&mut self, background: bool) {
        self.background = background;
    }

    /// Whether the call may have the model generate (`provider::may_generate`): only such a
    /// call's first token is one, for the histogram and the upstream's estimate (audit UC 4:
    /// every poll, `/cancel` and `DELETE` of a stored response, and a background response's
    /// `queued` acknowledgement, was a sample).
    fn may_generate(&self) -> bool {
        may_generate(&self.method, &self.path, self.background)
    }

    /// The upstream whose answer the client gets (the last attempt, or the hedge winner): when
    /// its request was sent, and its first body byte if it was read while the head was held.
    pub fn set_upstream(
        &mut self,
        entry: &ChainEntry,
        sent_at: Instant,
        first_byte_at: Option<Instant>,
    ) {
        self.upstream = Some(entry.upstream.clone());
        self.ttft_metric = Some(entry.ttft.clone());
        self.answer_metrics = Some(entry.answer.clone());
        self.sent_at = Some(sent_at);
        if let Some(at) = first_byte_at {
            self.first_byte_at.get_or_insert(at);
        }
        self.observe_ttfb();
    }

    /// Observes the time to first token, once, when both it and its histogram are known.
    fn observe_ttft(&mut self) {
        if let (false, Some(at), Some(h), true) = (
            self.ttft_observed,
            self.first_token_at,
            &self.ttft_metric,
            self.may_generate(),
        ) {
            h.observe((at - self.arrival).as_secs_f64());
            self.ttft_observed = true;
        }
    }

    /// As `observe_ttft`, for the first byte.
    fn observe_ttfb(&mut self) {
        if let (false, Some(at), Some(a)) =
            (self.ttfb_observed, self.first_byte_at, &self.answer_metrics)
        {
            a.ttfb.observe((at - self.arrival).as_secs_f64());
            self.ttfb_observed = true;
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

    pub fn set_budget(&mut self, budget: &Budget) {
        self.budget = Some(BudgetNote {
            deadline: budget.deadline,
            total: budget.total,
            source: budget.source,
            clamped: budget.clamped,
        });
    }

    /// The request is a HEAD: its answer has no body.
    pub fn is_head(&self) -> bool {
        self.method == Method::HEAD
    }

    /// Counts the bytes of an answer the gateway wrote itself (its JSON error) in the log's
    /// `bytes`, and not as a first byte, which is the upstream's. A HEAD answer sends none.
    pub fn own_bytes(&mut self, len: usize) {
        if self.method != Method::HEAD {
            self.bytes += len as u64;
            self.sent += len as u64;
        }
    }

    /// Whether the gateway reads the upstream's body itself, before it answers (`read_whole`).
    pub fn read_whole(&mut self, whole: bool) {
        self.read_whole = whole;
    }

    /// The gateway hands the client `len` bytes of its body in one piece: what it read of
    /// the upstream's (`read_whole`), or the document it assembled from it.
    pub fn sent_whole(&mut self, len: usize) {
        if self.method != Method::HEAD {
            self.sent += len as u64;
            self.answer_bytes += len as u64;
        }
    }

    /// The gateway's own answer of `was` bytes, already counted, went out as `now` bytes
    /// instead (an error answer whose body became the provider's error object).
    pub fn own_bytes_replaced(&mut self, was: usize, now: usize) {
        if self.method != Method::HEAD {
            self.bytes = self.bytes.saturating_sub(was as u64) + now as u64;
            self.sent = self.sent.saturating_sub(was as u64) + now as u64;
        }
    }

    /// The gateway made more than one attempt (retries, fallbacks or a hedge), or held a
    /// retry back for its upstream's share of retries: either way the client's SDK should
    /// not retry in its place.
    pub fn retried(&self) -> bool {
        self.attempts.len() > 1 || self.throttled & Throttled::RETRIES != 0
    }

    /// An extra attempt was not made to spare its upstream.
    pub fn throttled(&mut self, why: Throttled) {
        self.throttled |= why as u8;
    }

    /// The retry walk broke off its upstream's retries (out of rotation, or no room in the
    /// budget or the client's patience) with the retry for the wait that upstream `asked`
    /// for not made. Such attempts did not stand in for the SDK's retry, which waits it out
    /// (audit AE 1 to 3: the SDK told not to retry lost calls the same SDK won alone). Until
    /// the next attempt, which clears it: it speaks of the answer the chain ended on.
    pub fn left_wait(&mut self, asked: bool) {
        self.left_wait |= asked;
    }

    /// See `left_wait`.
    pub fn left_a_wait(&self) -> bool {
        self.left_wait
    }

    /// What is left of a budget the client's own headers set (the rule of `deadline_error`),
    /// at `now`; `None` for a budget of the route's, or a run's.
    pub fn client_budget_left(&self, now: Instant) -> Option<Duration> {
        self.budget
            .filter(|b| b.source.is_client())
            .map(|b| b.deadline.saturating_duration_since(now))
    }

    pub fn set_status(&mut self, status: u16) {
        self.status = Some(status);
    }

    /// Notes an attempt as it starts, so that the log lists attempts in the order they
    /// started and one still running when the request ends is counted and logged too.
    /// `current`: it is now the attempt the request waits on (not one started beside
    /// another, as a hedge), and the log names its upstream should the request end before
    /// any answered. Returns its place, for [`RequestRecord::attempt`].
    pub fn attempt_started(
        &mut self,
        entry: &ChainEntry,
        started: Instant,
        current: bool,
    ) -> usize {
        if current || self.upstream.is_none() {
            self.upstream = Some(entry.upstream.clone());
        }
        self.left_wait = false;
        if let Some(call) = self.run.as_mut().and_then(|r| r.call.as_mut()) {
            call.sent();
        }
        // Most requests make one attempt: room for one, not the four a first push makes, held
        // for as long as the stream is open.
        if self.attempts.capacity() == 0 {
            self.attempts.reserve_exact(1);
        }
        self.attempts.push(AttemptLog {
            upstream: entry.upstream.name.clone(),
            outcome: None,
            started,
            took: Duration::ZERO,
        });
        self.attempts.len() - 1
    }

    /// Notes how attempt `index` ended: how its answer began (`ok`, `status_5xx`,
    /// `hedge_loser`, ...) or why it failed. A first-token limit that fired teaches the
    /// upstream's estimate that its first token takes at least that long.
    pub fn attempt(
        &mut self,
        entry: &ChainEntry,
        index: usize,
        outcome: Result<&'static str, &GatewayError>,
    ) {
        if let Err(GatewayError::FirstTokenTimeout { after, .. }) = outcome {
            entry
                .upstream
                .observe_first_token_bound(self.model.as_deref(), *after);
        }
        // The log line names the upstream that failed when none answered (an answer's is
        // set with it; a hedge's loser never replaces the winner).
        if outcome.is_err() {
            self.upstream = Some(entry.upstream.clone());
        }
        if let Some(a) = self.attempts.get_mut(index) {
            a.outcome = Some(outcome.unwrap_or_else(GatewayError::code));
            a.took = Instant::now().saturating_duration_since(a.started);
        }
    }

    /// An attempt on `upstream` was not made: it is out of rotation.
    pub fn passed_over(&mut self, upstream: &Arc<str>) {
        if !self.passed_over.contains(upstream) {
            self.passed_over.push(upstream.clone());
        }
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
        // What the client was told, for the operator: which certificate check, which
        // header, which limit (the code alone does not say).
        let mut message = e.to_string();
        message.truncate(clipped(&message, ERROR_MAX).len());
        self.error = Some(message.into_boxed_str());
    }

    pub fn complete(&mut self) {
        self.end = Some(End::Ok);
    }

    /// The answer was whole when `code` stopped the rest of its stream: it counts as
    /// delivered, and the log line keeps the code.
    pub fn complete_then(&mut self, code: &'static str) {
        self.code = Some(code);
        self.end = Some(End::Ok);
    }

    fn report(&mut self) {
        let now = Instant::now();
        // Both were observed when they came; these only catch one that came before its
        // histogram was known.
        self.observe_ttft();
        self.observe_ttfb();
        // Dropped unfinished: the client left, or the gateway closed its connection for
        // reading nothing (audit CC4: that was logged as the client's leaving).
        let end = self.end.unwrap_or_else(|| {
            let cut = self.writes.as_ref().is_some_and(|w| w.was_cut());
            End::Cancelled(if cut {
                Origin::SendTimeout
            } else {
                Origin::Client
            })
        });
        // A detached call that was sent (an attempt started: whether it reached the upstream
        // cannot be told) goes on at the provider: its close cancelled nothing (audit UC 2).
        let end = match end {
            End::Cancelled(o)
                if self.detached && !self.attempts.is_empty() && Origin::CLOSES.contains(&o) =>
            {
                End::Detached(o)
            }
            end => end,
        };
        // Only a call that asked the model (`asks_model`) is charged by bytes when its
        // answer went unread, and only its answer says which tool calls the model asked for.
        let status = self.status.unwrap_or(0);
        let generation = self.asks_model();
        let unread = ((200..300).contains(&status) && generation).then_some(self.answer_bytes);
        let tokens = self.run_tokens_used(self.tokens, unread);
        if let Some(run) = self.run.as_mut() {
            if let Some(call) = run.call.take() {
                let answered = end == End::Ok;
                // A partial answer (a cut) that handed out whole calls a client may act on
                // is an answer of them; one that handed out none leaves the streak as it was
                // (audit ZB 5).
                let handed = answered || (run.partial && run.answer.is_some());
                let request = call.request();
                // A call admitted before its run had limits did not gather its tool calls
                // (audit TB 1): that it found none says nothing, and must not break the streak.
                let gathered = call.stops_loops();
                call.finish(&Used {
                    tokens,
                    // Only a successful answer of a call of the model, read to its end,
                    // says which tool calls it asked for, or that it asked for none. A call
                    // that asked the model nothing (a stored response polled, an embedding,
                    // a count of tokens) says neither: the streak stands (audit MA 1: an
                    // agent whose tool embedded between steps was never stopped).
                    answer: match run.answer.take() {
                        _ if !handed
                            || !(200..300).contains(&status)
                            || !generation
                            || !gathered =>
                        {
                            Answer::Unread
                        }
                        Some((fp, tool)) => Answer::Tools(fp, tool),
                        None => Answer::Plain,
                    },
                    // What a client retries (a 5xx, 408, 409, 429, or a cut) is not the
                    // agent asking again.
                    request: request
                        .filter(|_| answered && !matches!(status, 0 | 408 | 409 | 429 | 500..)),
                    run_deadline: matches!(
                        end,
                        End::Cancelled(Origin::RunDeadline) | End::Detached(Origin::RunDeadline)
                    ),
                });
            }
        }
        let m = &self.metrics;
        match end {
            End::Ok => m.ok.inc(),
            End::Error(_) => m.error.inc(),
            End::Cancelled(origin) => {
                m.cancelled.inc();
                m.cancellation(origin).inc();
            }
            End::Detached(origin) => {
                m.detached.inc();
                if let Some(c) = m.detached_by(origin) {
                    c.inc();
                }
            }
        }
        let completion = self.tokens.map(|t| t.completion());
        // Per client on the routes that name clients: not under `none` (a model no route
        // serves), whose series would exist for no key file.
        if let (Some(c), Some(_)) = (&self.client_id, &self.route) {
            m.client_usage(
                &c.label(),
                end.outcome(),
                self.tokens.and_then(|t| t.prompt()),
                completion.map(|(n, s)| (n, s.as_str())),
            );
        }
        let elapsed = now - self.arrival;
        m.duration.observe(elapsed.as_secs_f64());
        if self.route.is_some() {
            m.attempts.observe(self.attempts.len() as f64);
        }
        // Only a token of a 2xx answer is noted (`first_token`), whatever ended the request
        // after it: an assembled answer cut by a limit had its first token all the same.
        // As the histogram: a call in which the model generates nothing (a count of tokens,
        // a stored response read) has a first byte, not a first token (audit ZD 3).
        let ttft = self
            .first_token_at
            .filter(|_| self.ttft_observed)
            .map(|t| t - self.arrival);
        let ttfb = self.first_byte_at.map(|t| t - self.arrival);
        if let Some(a) = &self.answer_metrics {
            if let Some(p) = self.tokens.and_then(|t| t.prompt()) {
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
        // A call refused because its run's deadline had passed got no time at all: no
        // budget in either histogram (a ratio of it would be no number), so both count the
        // same requests.
        if let Some(b) = self.budget.as_ref().filter(|b| !b.total.is_zero()) {
            m.budget.observe(b.total.as_secs_f64());
            m.used_ratio
                .observe(elapsed.as_secs_f64() / b.total.as_secs_f64());
            if end == End::Ok {
                // Never negative: an overrun shows in used_ratio > 1, not as a negative margin.
                let left = b.deadline.saturating_duration_since(now);
                m.margin.observe(left.as_secs_f64());
                margin = Some(left);
            }
        }
        let origin = match end {
            End::Cancelled(o) | End::Detached(o) => Some(o.as_str()),
            _ => None,
        };
        let code = match end {
            End::Cancelled(Origin::Client) | End::Detached(Origin::Client) => Some("client_closed"),
            End::Cancelled(Origin::SendTimeout) | End::Detached(Origin::SendTimeout) => {
                Some("send_timeout")
            }
            End::Error(c) => Some(c),
            _ => self.code,
        };
        // "openai:connect_timeout:512ms,backup:ok:1203ms": every attempt, in order; one still
        // running ended with the request. A lone attempt is named too when it failed and the
        // request was then cancelled for another reason (the client left while a retry waited out
        // the 429's `Retry-After`): the line has no status then, and the answer was the
        // upstream's (audit OA 2).
        let lone_failure = matches!(end, End::Cancelled(_) | End::Detached(_))
            && self
                .attempts
                .first()
                .is_some_and(|a| a.outcome.is_some_and(|o| o != "ok" && Some(o) != code));
        let attempts = (self.attempts.len() > 1 || lone_failure).then(|| {
            self.attempts
                .iter()
                .map(|a| {
                    let (outcome, took) = match a.outcome {
                        Some(o) => (o, a.took),
                        None => (code.unwrap_or("cancelled"), now - a.started),
                    };
                    format!("{}:{}:{}ms", a.upstream, outcome, took.as_millis())
                })
                .collect::<Vec<_>>()
                .join(",")
        });
        let passed_over = (!self.passed_over.is_empty()).then(|| self.passed_over.join(","));
        let throttled = (self.throttled != 0).then(|| {
            Throttled::ALL
                .iter()
                .filter(|t| self.throttled & **t as u8 != 0)
                .map(|t| t.as_str())
                .collect::<Vec<_>>()
                .join(",")
        });
        RequestLog {
            request_id: &self.id,
            run_id: self.run.as_ref().map(|r| &*r.id),
            run_limits: self
                .run
                .as_ref()
                .is_some_and(|r| r.unenforced)
                .then_some("unenforced"),
            method: &self.method,
            path: self.logged_path.as_deref().unwrap_or(&self.path),
            client_key: self.client_id.as_ref().map(|c| c.key),
            client_name: self.client_id.as_ref().and_then(|c| c.name.as_deref()),
            client_cert: self.client_cert.as_deref().map(|c| clipped(c, CERT_MAX)),
            route: self.route.as_deref(),
            upstream: self.upstream.as_ref().map(|u| &*u.name),
            model: match &self.upstream {
                Some(u) => u.model_for(self.model.as_deref()),
                None => self.model.as_deref(),
            }
            .map(|m| clipped(m, MODEL_MAX)),
            budget: self.budget.as_ref().map(|b| b.total),
            budget_source: self.budget.as_ref().map(|b| b.source.as_str()),
            budget_clamped: self.budget.as_ref().map(|b| b.clamped),
            elapsed,
            margin,
            ttfb,
            // As in the histogram: an error body's first byte is no token.
            ttft,
            prompt_tokens: self.tokens.and_then(|t| t.prompt()),
            completion_tokens: completion.map(|(n, source)| (n, source.as_str())),
            stream_error: self.stream_error().map(ErrorType::as_str),
            bytes: self.bytes,
            body_bytes: self.sent,
            status: self.status,
            outcome: end.outcome(),
            origin,
            code,
            error: self.error.as_deref(),
            attempts: attempts.as_deref(),
            passed_over: passed_over.as_deref(),
            throttled: throttled.as_deref(),
            client: self.client.as_deref(),
        }
        .emit();
    }
}

impl RequestRecord {
    /// The provider's own mid-stream error: the type the inspector (or Gemini's reader)
    /// read, or `other` for an error event it could not name (or that came on a stream of
    /// unknown format).
    fn stream_error(&self) -> Option<ErrorType> {
        self.tokens
            .and_then(|t| t.error)
            .or(self.provider_error)
            .or_else(|| (self.code == Some("upstream_error_event")).then_some(ErrorType::Other))
    }
}

impl Observer for RequestRecord {
    fn first_token(&mut self, at: Instant) {
        // An error body's first byte is no token: it would pull the histogram down with the
        // answers that had none. The status is the answer's head's, or none yet where the
        // head waits (held for a fallback, or for the assembled document).
        let answered = self.status.is_none_or(|s| (200..300).contains(&s));
        if self.first_token_at.is_none() && answered {
            self.first_token_at = Some(at);
            if let (Some(up), Some(sent), true) =
                (&self.upstream, self.sent_at, self.may_generate())
            {
                up.observe_first_token(self.model.as_deref(), at.saturating_duration_since(sent));
            }
            self.observe_ttft();
        }
    }

    fn data(&mut self, len: usize) {
        if self.first_byte_at.is_none() {
            self.first_byte_at = Some(Instant::now());
            self.observe_ttfb();
        }
        self.bytes += len as u64;
    }

    fn own_data(&mut self, len: usize) {
        if self.method != Method::HEAD {
            self.bytes += len as u64;
        }
    }

    /// The client's body as it streams, unless the gateway reads it whole first
    /// (`read_whole`, which counts what it hands over with `sent_whole`).
    fn handed(&mut self, len: usize) {
        if !self.read_whole {
            self.sent += len as u64;
            self.answer_bytes += len as u64;
        }
    }

    fn tokens(&mut self, tokens: Tokens) {
        self.tokens = Some(tokens);
    }

    fn provider_error(&mut self, kind: Option<ErrorType>) {
        self.provider_error = kind;
    }

    /// Not `ok` with every byte (audit KC 1): reported as a request dropped unfinished, the
    /// client's leaving or the gateway's cut of its connection (`report`).
    fn undelivered(&mut self) {
        if self.end == Some(End::Ok) {
            self.end = None;
        }
    }

    fn tool_calls(&mut self, calls: Option<(Vec<u8>, String)>) {
        if let Some(run) = self.run.as_mut().filter(|r| !r.partial) {
            run.answer = calls.map(|(canon, name)| (crate::runs::fingerprint::of(&canon), name));
        }
    }

    fn finish(&mut self, end: StreamEnd) {
        match end {
            StreamEnd::Complete => self.complete(),
            StreamEnd::WholeThen(code) => self.complete_then(code),
            StreamEnd::Cut(e) => {
                // The head went out before the first token (the upstream sent it early):
                // the limit that fired is a bound all the same.
                if let (GatewayError::FirstTokenTimeout { after, .. }, Some(up)) =
                    (&e, &self.upstream)
                {
                    up.observe_first_token_bound(self.model.as_deref(), *after);
                }
                self.fail(&e)
            }
            StreamEnd::UpstreamErrorEvent => {
                self.code = Some("upstream_error_event");
                self.end = Some(End::Error("upstream_error_event"));
            }
            StreamEnd::SendTimeout => self.end = Some(End::Cancelled(Origin::SendTimeout)),
        }
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        self.report();
        if self.route.is_some() {
            self.metrics.in_flight.dec();
        }
    }
}
