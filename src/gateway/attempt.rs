//! One attempt on one upstream: send the request, wait for the head under the connect and
//! first-token limits, and, when the route may still switch to another attempt, hold the
//! head until the first data event so that nothing reaches the client from an attempt that
//! could yet fail. Dropping an attempt's future (or its body) cancels it upstream.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::{capture_connection, CaptureConnection};
use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant};

use crate::admission::BodyHold;
use crate::budget::{names, Budget};
use crate::error::GatewayError;
use crate::gateway::template::Outgoing;
use crate::http::headers::{answer_framing_fault, answers_without_content, BodyShape};
use crate::provider::inspect::{gemini, Inspector};
use crate::provider::{ErrorType, Format};
use crate::stream::progress::Progress;
use crate::stream::timer::recheck_at;
use crate::stream::StreamLimits;
use crate::telemetry::metrics::{AnswerMetrics, InFlight};
use crate::upstream::{
    Abandon, ConnectTimedOut, ConnectWaitedFor, RequestBody, Sent, StreamSlot, Upstream,
};

/// What one attempt needs beyond the request itself.
pub struct Attempt<'a> {
    pub upstream: &'a Arc<Upstream>,
    pub budget: &'a Budget,
    /// This attempt's first-token limit: the route's, shortened to leave room for a fallback.
    pub first_token_timeout: Duration,
    /// When a fallback follows: the end of this attempt's waits that leaves the fallback its
    /// room.
    pub switch_by: Option<SwitchBy>,
    /// Hold a successful head until the first data event.
    pub hold: bool,
    pub in_flight: InFlight,
    /// Where the attempt's head is counted by its status class.
    pub answers: &'a AnswerMetrics,
}

/// When an attempt's waits end to leave the next upstream its room, and which of them do: only
/// a wait whose failure moves on to that upstream (its cause is in `retry_on`) is cut short
/// for it. Any other ends at the attempt's own limit, as its failure is the client's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchBy {
    pub at: Instant,
    /// The wait for a connection.
    pub connect: bool,
    /// The wait for the first token, once the request is sent.
    pub first_token: bool,
}

impl SwitchBy {
    fn end(switch: Option<Self>, wait: fn(&Self) -> bool, work_deadline: Instant) -> Instant {
        switch
            .filter(wait)
            .map_or(work_deadline, |s| s.at.min(work_deadline))
    }
}

/// An attempt that produced a response head (and, when held, its first data event).
pub struct Started {
    pub response: Response<UpstreamBody>,
    pub limits: StreamLimits,
    /// When the request's last byte was handed to a connection: the start of the first-token
    /// clock.
    pub sent_at: Instant,
    pub first_token_at: Option<Instant>,
    /// The first body byte, when it was read while the head was held.
    pub first_byte_at: Option<Instant>,
    /// The wire format of the exchange, when it is known (the upstream's `api` and the path).
    pub format: Option<Format>,
    /// What the answer's body is, read from its head.
    pub shape: BodyShape,
    /// The upstream was asked to stream on the client's behalf (`stream_upstream`).
    pub assembled: bool,
    /// The answer's usage-only chunk is the gateway's, not the client's (UC 3).
    pub hide_usage: bool,
    /// The answer is read for its usage only (a resumed background stream, VC 1).
    pub usage_only: bool,
    /// ... and a limit that cuts it after output came gives the client a partial answer.
    pub partial_answers: bool,
    /// The Chat choices the answer has (`n`), none of which may be missing at its end.
    pub choices: u8,
    /// The provider's own error event came before any output while the head was held (nothing
    /// has reached the client): its type, when the inspector could name it. An overload sent
    /// this way (Anthropic's `overloaded_error` on a 200) is retried like the status it stands
    /// for.
    pub error_event: Option<ErrorType>,
    /// The upstream whose URLs a batch answer's `results_url` may name, to be made the
    /// gateway's (see `names_results_urls`), and the path of the client's SDK base URL.
    pub results_urls: Option<(Arc<Upstream>, Arc<str>)>,
    /// The upstream that answered, whose `hide_headers` are dropped from the head where it
    /// goes out to the client, and not before: the gateway reads what it hides
    /// (`retry-after`, `x-should-retry`) as any head (audit VB 2).
    pub served_by: Arc<Upstream>,
}

impl<'a> Attempt<'a> {
    /// Not an `async fn`, and the request handed to the client before the future is made:
    /// an `async fn` would keep the request (and its other arguments) in its future twice
    /// over for its whole life, and this future sits inside every request's. (The client's
    /// future does nothing until it is polled.)
    pub fn run(self, out: Outgoing) -> impl Future<Output = Result<Started, GatewayError>> + 'a {
        let Outgoing {
            request: mut req,
            format,
            usage_only,
            assembled,
            hide_usage,
            partial_answers,
            choices,
            results_urls,
        } = out;
        let budget = self.budget;
        let upstream = self.upstream;
        // The waits of this attempt end by the deadline, or earlier to leave a fallback room.
        let work_deadline = budget.work_deadline();
        let connect_deadline = SwitchBy::end(self.switch_by, |s| s.connect, work_deadline);
        let wait_deadline = SwitchBy::end(self.switch_by, |s| s.first_token, work_deadline);
        // The head, and a held head's first token, by the client's patience too.
        let connect_wait = budget.head_wait_until(connect_deadline);
        let head_wait = budget.head_wait_until(wait_deadline);
        let now = Instant::now();
        // The request goes out as soon as hyper-util's pool has a connection for it, with the
        // budget header set here: the pool offers no point between the two. So the wait for a
        // connection ends where a request sent later would have less than `min_useful` left,
        // and the header leaves out the time a new connection takes (audit DC 1).
        let send_by = work_deadline
            .checked_sub(budget.min_useful)
            .unwrap_or(budget.arrival);
        if upstream.config.propagate_budget {
            req.headers_mut().insert(
                names::BUDGET.clone(),
                http::HeaderValue::from(budget.forwarded_ms(now)),
            );
        }
        // A request without a body goes whole in its HEADERS frame (END_STREAM): once that
        // left, the upstream may have run it, whatever hyper says of it after.
        let bodiless = req.body().is_empty();
        // A HEAD's answer has no content: nothing to hold to a first token, nor to end short.
        let head = req.method() == http::Method::HEAD;
        // RFC 9112 9.3.1.1: such a request may be sent again when its connection closed
        // before any answer (see `classify`). Only one of a safe method (GET, HEAD, OPTIONS):
        // a DELETE or PUT is idempotent, but the first one may have acted (audit NA 3).
        let resendable = bodiless && req.method().is_safe();
        // Gemini's native stream is read for its error event (break audit YB 1).
        let gemini = gemini::streams(req.uri().path());
        let (parts, body) = req.into_parts();
        let (body, sent) = RequestBody::new(body, upstream.may_speak_h2());
        let mut req = http::Request::from_parts(parts, body);
        let mut connection = capture_connection(&mut req);
        let (response, slot) = upstream.request(req);
        // While the body goes out only the deadline and the client's patience bound the
        // wait: an upstream cannot answer an upload it has not read, nor be blamed for it.
        let upload_wait = budget.head_wait_until(work_deadline);
        async move {
            tokio::pin!(response);
            // Until the answer's head: an attempt given up on (its limit, the client gone, a
            // lost hedge) ends its HTTP/1.1 connection, even one stuck writing the request.
            let mut unanswered = Unanswered(Some(connection.clone()));
            let timer = sleep_until(
                (now + budget.connect_timeout)
                    .min(connect_wait)
                    .min(send_by),
            );
            tokio::pin!(timer);
            let (mut body_sent, mut uploaded, taken) = match sent {
                Sent::WithTheHead => (None, true, None),
                Sent::Later(rx, taken) => (Some(rx), false, Some(taken)),
            };
            // While the body goes out: since when the upstream took none of it (from the
            // head). One that takes no piece for the route's first-token limit (cut, as that
            // wait is, to leave a fallback its room) is stalled, not slowly taking an upload:
            // the attempt fails, against its health, and the chain moves on (audit NA 1: an
            // HTTP/2 window kept shut held the whole budget, the fallback untried). One that
            // took some is taking it, however slowly (audit DA 1: an upstream that reads the
            // rest of a 12 MB upload after a pause is no first-token timeout).
            let stall_limit = budget.route_first_token_timeout;
            let mut took_none_since: Option<Instant> = None;
            let mut stalled = false;
            let mut connected = false;
            // The start of the first-token clock: the body's last byte handed to the
            // connection (DESIGN 4, "from request sent").
            let mut sent_at: Option<Instant> = None;
            // A limit found expired late, looking once more (`recheck_at`): when it was due.
            let mut rechecking: Option<Instant> = None;
            let result = loop {
                tokio::select! {
                    biased;
                    r = &mut response => break Ok(r),
                    _ = connection.wait_for_connection_metadata(), if !connected => {
                        connected = true;
                        rechecking = None;
                        match taken.as_ref().filter(|t| !uploaded && t.pieces() == 0) {
                            Some(_) => {
                                let at = Instant::now();
                                took_none_since = Some(at);
                                let check = (at + stall_limit).min(head_wait).min(upload_wait);
                                timer.as_mut().reset(check);
                            }
                            None => timer.as_mut().reset(upload_wait),
                        }
                    }
                    // Dropped unsent, the body will not go: the answer (or error) is next.
                    _ = async { body_sent.as_mut().expect("while not uploaded").await }, if !uploaded => {
                        uploaded = true;
                    }
                    () = &mut timer => {
                        if let (Some(_), Some(t), false) = (took_none_since, taken.as_ref(), uploaded) {
                            if timer.deadline() < upload_wait {
                                if t.pieces() == 0 {
                                    stalled = true;
                                    break Err(timer.deadline());
                                }
                                // It took some: an upload under way, until it is sent.
                                took_none_since = None;
                                timer.as_mut().reset(upload_wait);
                                continue;
                            }
                        }
                        if let Some(due) = rechecking.take() {
                            break Err(due);
                        }
                        let due = timer.deadline();
                        match recheck_at(due, Instant::now()) {
                            // The gateway stalled past the limit: a head (or connection)
                            // that came meanwhile waits for its connection's task. Not the
                            // deadline, which is absolute.
                            Some(at) if due < work_deadline => {
                                rechecking = Some(due);
                                timer.as_mut().reset(at.min(work_deadline));
                            }
                            _ => break Err(due),
                        }
                    }
                }
                if connected && uploaded && sent_at.is_none() {
                    let at = Instant::now();
                    sent_at = Some(at);
                    rechecking = None;
                    timer
                        .as_mut()
                        .reset((at + self.first_token_timeout).min(head_wait));
                }
            };
            let result = match result {
                Ok(result) => result,
                Err(fired) => {
                    // Not sent: what is left after the connect could not be useful.
                    if !connected && fired == send_by && fired < connect_wait {
                        return Err(budget.too_little(
                            Instant::now(),
                            budget.min_useful,
                            None,
                            false,
                        ));
                    }
                    if let (true, Some(since)) = (stalled, took_none_since) {
                        // The wait for the upload, cut at the first-token limit: a stall is
                        // held against the upstream as a first token that did not come.
                        return Err(GatewayError::FirstTokenTimeout {
                            upstream: upstream.name.to_string(),
                            after: Instant::now().saturating_duration_since(since),
                            patience: false,
                        });
                    }
                    let e = self.limit_error(connected, now, sent_at, fired);
                    if let GatewayError::ConnectTimeout { after, .. } = &e {
                        self.answers.connect_error("timeout");
                        // Before `response` drops: a connect this request was making ends
                        // with it, and so does the wait of any request waiting for it.
                        if !connected {
                            slot.connect_timed_out(*after);
                        }
                    }
                    // Sent, and not even a head for the route's whole first-token limit (not one
                    // a client's short timeout or a fallback's room cut): on a shared HTTP/2
                    // connection, the peer may be gone while the socket stays open, and every
                    // stream put on it would wait the same.
                    let waited_it_all = sent_at
                        .is_some_and(|at| Instant::now() >= at + budget.route_first_token_timeout);
                    if waited_it_all && matches!(e, GatewayError::FirstTokenTimeout { .. }) {
                        let h2 = connection
                            .connection_metadata()
                            .as_ref()
                            .is_some_and(|c| c.is_negotiated_h2());
                        slot.retire(h2);
                    }
                    return Err(e);
                }
            };
            // Answered with the body all sent: nothing to abandon. Answered before (an early
            // 413 or 401 from an upstream that then reads no more), the connection is
            // abandoned once the answer is done with (RFC 9112 9.6: stop sending a body the
            // server refused), as its body drops (audit EC).
            let sent_now = body_sent.as_mut().is_none_or(|rx| {
                !matches!(
                    rx.try_recv(),
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty)
                )
            });
            if uploaded || sent_now {
                unanswered.0 = None;
            }
            let response = result.map_err(|e| {
                let request = SentAs {
                    connected,
                    bodiless,
                    resendable: resendable && pooled_unanswered(&connection),
                };
                let waited = slot.connect_waited_for(&e);
                let error = classify(
                    upstream,
                    &e,
                    waited.as_deref(),
                    budget.connect_timeout,
                    request,
                );
                let cause: &(dyn std::error::Error + 'static) = match waited.as_deref() {
                    Some(w) => w,
                    None => &e,
                };
                if let Some(reason) = connect_failure(cause, &error) {
                    self.answers.connect_error(reason);
                }
                error
            })?;
            // Counted as it comes: whatever ends the attempt after its head (a held head's
            // first-token limit, a lost hedge, a bad framing) the upstream did answer it.
            self.answers.response(response.status().as_u16());
            // A head always comes over a connection; should its metadata not have been seen yet,
            // the head itself proves the request was sent.
            let sent_at = sent_at.unwrap_or_else(Instant::now);
            // A head that goes out at once starts the client's reads, which every byte sent
            // restarts (the watchdog's `client_silence`): its first token is bounded by the
            // route's limit. One held until that token, or until the whole answer, keeps the
            // client waiting for the head all along.
            let held = self.hold || assembled;
            let first_token_timeout = if held {
                self.first_token_timeout
            } else {
                budget.route_first_token_timeout
            };
            let first_token_deadline =
                (sent_at + first_token_timeout).min(if held { head_wait } else { wait_deadline });
            // What the first-token limit said to the client: the wait it gets, and whether
            // its own SDK's timeout set that.
            let first_token_timeout = first_token_deadline.saturating_duration_since(sent_at);
            let first_token_patience = held
                && budget
                    .head_by()
                    .is_some_and(|by| by <= first_token_deadline);
            // An answer assembled for a client that did not stream keeps that client silent
            // until it is whole: it ends (whole, partial or 504) before the client's SDK
            // gives up, when the SDK said when that is.
            // (The client's patience is its SDK's timeout, which the SDK retries like
            // any timeout: not a budget the client set.)
            let (deadline, total, reserve, client_budget, patience) = match budget.patience {
                Some(p) if assembled && budget.arrival + p < work_deadline => (
                    budget.arrival + p,
                    p.min(budget.total),
                    Duration::ZERO,
                    false,
                    true,
                ),
                _ => (
                    work_deadline,
                    budget.total,
                    budget.reserve,
                    budget.source.is_client(),
                    false,
                ),
            };
            let limits = StreamLimits {
                first_token_deadline,
                first_token_timeout,
                first_token_patience,
                idle_timeout: budget.idle_timeout,
                client_silence: budget.read_patience,
                deadline,
                budget: total,
                reserve,
                client_budget,
                patience,
                upstream: upstream.name.clone(),
                run: budget.run.clone().map(Box::new),
                run_tokens: None,
                // A limit that cuts the stream asks whether its HTTP/2 connection went
                // silent as a whole (audit RA 5).
                connection: slot.watch(
                    connection
                        .connection_metadata()
                        .as_ref()
                        .is_some_and(|c| c.is_negotiated_h2()),
                ),
            };
            let (mut parts, incoming) = response.into_parts();
            if let Some(reason) = answer_framing_fault(parts.status, &mut parts.headers) {
                // The body goes unread: its connection is closed, never pooled.
                return Err(GatewayError::UpstreamError {
                    upstream: upstream.name.to_string(),
                    reason,
                });
            }
            upstream.localize_locations(&mut parts.headers);
            let shape = BodyShape::of(&parts.headers);
            let mut body = UpstreamBody {
                prefix: VecDeque::new(),
                inner: Some(incoming),
                _call: Some(Call {
                    _in_flight: self.in_flight,
                    _stream: slot,
                    _unsent: unanswered,
                }),
            };
            let (mut first_token_at, mut first_byte_at, mut error_event) = (None, None, None);
            if self.hold && parts.status.is_success() {
                // An encoded answer is held to its first byte, as any body that is not SSE text.
                let is_sse =
                    shape.readable_sse() && !head && !answers_without_content(parts.status);
                // A JSON document's first token is its first byte other than whitespace
                // (`Progress::read`, audit WB 4).
                let is_json =
                    shape.readable && shape.json && !head && !answers_without_content(parts.status);
                let inspector = format
                    .filter(|_| is_sse || is_json)
                    .map(|f| Inspector::new(f, is_sse).with_choices(choices))
                    .map(|i| {
                        if usage_only {
                            i.reading_usage_only()
                        } else {
                            i
                        }
                    });
                // Boxed: only routes that may switch hold, and inline the hold's state would
                // grow every request's future by its size.
                (first_token_at, first_byte_at, error_event) = Box::pin(hold_until_first_token(
                    &mut body,
                    Progress::new(is_sse, inspector).gemini_errors(gemini),
                    &limits,
                ))
                .await?;
            }
            Ok(Started {
                response: Response::from_parts(parts, body),
                limits,
                sent_at,
                first_token_at,
                first_byte_at,
                format,
                shape,
                assembled,
                hide_usage,
                usage_only,
                partial_answers,
                choices,
                error_event,
                results_urls: results_urls.map(|base| (upstream.clone(), base)),
                served_by: upstream.clone(),
            })
        }
    }

    /// The error of the attempt's wait for its head ending at `fired`.
    /// `started`: the attempt's start; `sent_at`: when its body had gone, if it had.
    fn limit_error(
        &self,
        connected: bool,
        started: Instant,
        sent_at: Option<Instant>,
        fired: Instant,
    ) -> GatewayError {
        let upstream = self.upstream.name.to_string();
        let now = Instant::now();
        // The wait that ended was the client's: its SDK gives up then. (Its read timeout,
        // which may have cut `first_token_timeout`, is never shorter.)
        let patience = self.budget.head_by().is_some_and(|by| by <= fired);
        if now >= self.budget.work_deadline() {
            self.budget.deadline_error()
        } else if !connected {
            GatewayError::ConnectTimeout {
                upstream,
                proxy: self.upstream.proxy_shown().map(str::to_owned),
                // Cut short to leave a fallback room, the wait was less than the limit.
                after: self
                    .budget
                    .connect_timeout
                    .min(now.saturating_duration_since(started)),
                sent: false,
            }
        } else {
            // The first-token wait counts from the body's end (one that fired while the body
            // still went out waited for no token); the client's, like its SDK's own, from the
            // attempt's start.
            let waited_from = match sent_at {
                Some(_) if patience => started,
                Some(at) => at,
                None => now,
            };
            GatewayError::FirstTokenTimeout {
                upstream,
                // Cut short by the client's patience or a fallback's room, the wait was less.
                after: self
                    .first_token_timeout
                    .min(now.saturating_duration_since(waited_from)),
                patience,
            }
        }
    }
}

/// An attempt's connection while its answer's head has not come, or its request's body has
/// not all gone: dropped so, the attempt gave up on it, and an HTTP/1.1 connection is
/// abandoned ([`Abandon`]).
struct Unanswered(Option<CaptureConnection>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        let Some(connection) = self.0.take() else {
            return;
        };
        let mut extras = http::Extensions::new();
        match &*connection.connection_metadata() {
            Some(connected) => connected.get_extras(&mut extras),
            None => return,
        }
        if let Some(abandon) = extras.get::<Abandon>() {
            abandon.abandon();
        }
    }
}

/// When the first token came, when the first byte did, and the type of a provider error
/// event that came instead of any output.
type Held = (Option<Instant>, Option<Instant>, Option<ErrorType>);

/// Reads the body until its first token, as `progress` decides it, keeping what it read as
/// the body's prefix. Returns when that token and the first byte arrived; no token if the
/// body ended (or the provider's error event came) first.
async fn hold_until_first_token(
    body: &mut UpstreamBody,
    mut progress: Progress,
    limits: &StreamLimits,
) -> Result<Held, GatewayError> {
    let mut first_byte = None;
    let timer = sleep_until(limits.first_token_deadline.min(limits.deadline));
    tokio::pin!(timer);
    let mut rechecked = false;
    loop {
        let frame = tokio::select! {
            biased;
            // (A copy kept whole has no more: `Started::keep`.)
            f = async {
                match body.inner.as_mut() {
                    Some(inner) => inner.frame().await,
                    None => None,
                }
            } => f,
            () = &mut timer => {
                let now = Instant::now();
                let recheck = recheck_at(timer.deadline(), now).filter(|_| !rechecked);
                if let (Some(at), true) = (recheck, now < limits.deadline) {
                    // The gateway stalled past the limit: a token that came meanwhile waits
                    // for its connection's task, which gets a turn first.
                    rechecked = true;
                    timer.as_mut().reset(at.min(limits.deadline));
                    continue;
                }
                // As the watchdog does for a stream it cuts (audit RA 5).
                if let Some(connection) = &limits.connection {
                    connection.retire_if_silent(limits.idle_timeout);
                }
                if now >= limits.deadline {
                    return Err(limits.deadline_error());
                }
                return Err(limits.first_token_error());
            }
        };
        match frame {
            // Cut short before its first token (a preamble, then the end): the upstream
            // failed, and another attempt may yet answer.
            None if progress.ended_short() => {
                return Err(GatewayError::UpstreamError {
                    upstream: limits.upstream.to_string(),
                    reason: crate::stream::ENDED_SHORT.to_owned(),
                })
            }
            None => return Ok((None, first_byte, None)),
            Some(Err(e)) => {
                return Err(GatewayError::UpstreamError {
                    upstream: limits.upstream.to_string(),
                    reason: crate::error::with_causes(&e),
                })
            }
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if data.is_empty() {
                    continue;
                }
                let now = Instant::now();
                let byte_at = *first_byte.get_or_insert(now);
                let read = progress.read(&data);
                body.prefix.push_back(data);
                if read.output {
                    return Ok((Some(now), Some(byte_at), None));
                }
                // `[DONE]` before the answer began: short now, as the watchdog would cut it
                // (audit WB 1), not once the upstream closes or the first-token limit fires.
                if progress.ended_early() {
                    return Err(GatewayError::UpstreamError {
                        upstream: limits.upstream.to_string(),
                        reason: crate::stream::ENDED_SHORT.to_owned(),
                    });
                }
                // An error event whose end waits on the next byte (`error_pending`) is as much
                // the upstream's answer as one that ended.
                if read.error_end.is_some() || progress.error_pending() {
                    // The upstream's own error event: no token will come. It is the
                    // upstream's answer to pass through, unless its type says the route may
                    // try again (`retry::answer_cause`).
                    let kind = progress.error_type();
                    return Ok((None, Some(byte_at), Some(kind.unwrap_or(ErrorType::Other))));
                }
            }
        }
    }
}

pin_project! {
    /// The upstream's body, after whatever was read while the head was held, counted in
    /// flight (and as a stream on its upstream connection) until it is dropped.
    pub struct UpstreamBody {
        prefix: VecDeque<Bytes>,
        // None in a copy kept whole in `prefix`, its call over (`Started::keep`).
        #[pin]
        inner: Option<Incoming>,
        _call: Option<Call>,
    }
}

/// What an answer holds of its upstream call until its body is done with.
struct Call {
    _in_flight: InFlight,
    _stream: StreamSlot,
    // An answer that came before the request's body was all sent: its connection is
    // abandoned when the answer is done with.
    _unsent: Unanswered,
}

impl Started {
    /// A copy of this answer, whole, to pass through should the attempts after it end in an
    /// error of the gateway's own (`retry::run`): its head, and its body read to its end, at
    /// most `most` bytes and by `by` (none when it is longer or slower: an error body is a
    /// few hundred bytes, sent with its head). A provider's error event read while the head
    /// was held is whole in what was read; the rest of that stream is not waited for. The
    /// upstream call is over: its connection and its count in flight are let go now.
    ///
    /// The body's bytes are taken from `hold` (`response_body_memory`) before they are kept,
    /// and held until the copy is written to the client or dropped; none when the memory is
    /// full. Taken exactly, not in granules: an error body is a frame or two.
    pub async fn keep(mut self, most: usize, by: Instant, mut hold: BodyHold) -> Option<Started> {
        let body = self.response.body_mut();
        let mut read: usize = body.prefix.iter().map(Bytes::len).sum();
        hold.cover(read as u64).ok()?;
        if self.error_event.is_none() {
            let inner = body.inner.as_mut()?;
            while let Some(frame) = tokio::time::timeout_at(by, inner.frame()).await.ok()? {
                let Ok(data) = frame.ok()?.into_data() else {
                    continue;
                };
                read += data.len();
                if read > most {
                    return None;
                }
                hold.cover(read as u64).ok()?;
                body.prefix.push_back(data);
            }
        }
        // One piece that holds the bytes it took until its last clone goes.
        if read > 0 {
            let mut whole = Vec::with_capacity(read);
            for piece in body.prefix.drain(..) {
                whole.extend_from_slice(&piece);
            }
            body.prefix.push_back(hold.keep_with(Bytes::from(whole)));
        }
        body.inner = None;
        body._call = None;
        Some(self)
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.project();
        if let Some(b) = this.prefix.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        match this.inner.as_pin_mut() {
            Some(inner) => inner.poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_empty() && self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self
            .inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint);
        crate::stream::watchdog::with_held(inner, &self.prefix)
    }
}

/// What was known of a failed request when it failed (see `classify`).
struct SentAs {
    /// The request had been handed to a connection (its metadata was seen).
    connected: bool,
    /// The request had no body (it went whole in its head).
    bodiless: bool,
    /// Besides, its method is safe (GET, HEAD, OPTIONS), and it went out on a pooled
    /// HTTP/1.1 connection that read none of its answer (`pooled_unanswered`).
    resendable: bool,
}

/// The request went out on an HTTP/1.1 connection that had carried an earlier exchange, and
/// not a byte of its answer was read ([`Abandon`]'s counts): the stale pooled connection a
/// resend is for (audit MC 5). A new connection closed unanswered is an upstream that fails
/// (audit NA 2), and one that closed after part of the answer (a partial head, a `100
/// Continue`) may have processed the request (audit NA 3).
fn pooled_unanswered(connection: &CaptureConnection) -> bool {
    let mut extras = http::Extensions::new();
    match &*connection.connection_metadata() {
        Some(connected) => connected.get_extras(&mut extras),
        None => return false,
    }
    extras
        .get::<Abandon>()
        .is_some_and(|a| a.reused() && !a.answer_begun())
}

/// `waited`: the failure of another request's HTTP/2 connect this one waited for
/// (`StreamSlot::connect_waited_for`), which is then this request's failure too.
fn classify(
    upstream: &Upstream,
    e: &hyper_util::client::legacy::Error,
    waited: Option<&ConnectWaitedFor>,
    connect_timeout: Duration,
    request: SentAs,
) -> GatewayError {
    let SentAs {
        connected: sent,
        bodiless,
        resendable,
    } = request;
    let (cause, first): (&(dyn std::error::Error + 'static), _) = match waited {
        Some(w) => (w, Some(w as &(dyn std::error::Error + 'static))),
        None => (e, std::error::Error::source(e)),
    };
    // hyper-util's own message ("client error (Connect)") says nothing its sources do not.
    let reason = first.map_or_else(|| e.to_string(), crate::error::with_causes);
    let mut source = first;
    let mut timed_out = None;
    let mut refused = None;
    let certificate = crate::upstream::certificate_error(cause);
    let ours_refused = crate::upstream::client_certificate_refused(cause);
    let handshake_refused = crate::upstream::handshake_refused(cause);
    let mut no_h2 = false;
    let mut gone_away = false;
    while let Some(s) = source {
        no_h2 |= s.is::<crate::upstream::NoH2ByAlpn>();
        if let Some(h2) = s.downcast_ref::<h2::Error>() {
            refused = refused.or_else(|| unprocessed(h2));
        }
        // A pooled HTTP/1.1 connection that closed with nothing of the answer read (the
        // upstream's keep-alive timeout closed it as the request went out, audit MC 5): a
        // request of a safe method without a body may be sent again on a new connection
        // (RFC 9112 9.3.1.1), once, as one refused unprocessed is, and is held neither way
        // against the upstream. Never one with a body or of another method: the upstream may
        // have acted on it (9.3.1). Any other such close is a reset.
        if resendable
            && s.downcast_ref::<hyper::Error>()
                .is_some_and(hyper::Error::is_incomplete_message)
        {
            refused = refused.or(Some(CLOSED_UNANSWERED));
        }
        if s.downcast_ref::<hyper::Error>().is_some_and(dispatch_gone) {
            if bodiless {
                // h2 may have opened its stream, END_STREAM and all, in the poll that read
                // the GOAWAY: the upstream may have it whole (audit BB), so it is not sent
                // again, only said in words.
                gone_away = true;
            } else {
                refused = refused.or(Some(GONE_AWAY_WAITING));
            }
        }
        // Our own connector bound, or the TCP connect timeout beneath it (which may fire a
        // moment earlier): both mean the connect limit, not an unreachable upstream.
        if let Some(t) = s.downcast_ref::<ConnectTimedOut>() {
            timed_out = Some(t.0);
        } else if s
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            timed_out.get_or_insert(connect_timeout);
        }
        source = s.source();
    }
    let name = upstream.name.to_string();
    if let Some(e) = starved(e, &name, &reason) {
        return e;
    }
    if let Some(reason) = refused {
        GatewayError::UpstreamRefused {
            upstream: name,
            reason,
            unanswered: reason == CLOSED_UNANSWERED,
        }
    } else if let Some(after) = timed_out {
        GatewayError::ConnectTimeout {
            upstream: name,
            proxy: upstream.proxy_shown().map(str::to_owned),
            // Timed out on a connection the request went out on: the HTTP/2 server never
            // sent its SETTINGS (`upstream::io`), in the bound the connector gives them.
            after: if sent { upstream.connect_bound } else { after },
            sent,
        }
    } else if let Some(alert) = ours_refused {
        let reason = connecting(upstream, &reason);
        // Refused before the server read the request, and refused again on every attempt
        // until the certificate changes: a certificate failure, as one of theirs is.
        let reason = match &upstream.config.client_cert {
            None if alert == rustls::AlertDescription::CertificateRequired => format!(
                "{reason}: the upstream asks for a client certificate (the upstream's \
                 client_cert and client_cert_key)"
            ),
            None => reason,
            Some(c) => format!(
                "{reason}: the upstream refused the client certificate in {}",
                c.cert.display()
            ),
        };
        GatewayError::UpstreamUnavailable {
            upstream: name,
            reason,
            certificate: true,
        }
    } else if e.is_connect() {
        let reason = connecting(upstream, &reason);
        let problem = certificate
            .as_ref()
            .and_then(crate::pem::certificate_problem);
        let reason = match (&certificate, handshake_refused) {
            _ if problem.is_some() => format!(
                "{reason}: the upstream's certificate: {}",
                problem.unwrap_or_default()
            ),
            _ if crate::upstream::no_common_tls_version(cause) => format!(
                "{reason}: the upstream speaks no TLS version the gateway does (TLS 1.2 and \
                 1.3 only)"
            ),
            // rustls names this one by its enum variant alone.
            (Some(rustls::CertificateError::UnknownIssuer), _) => format!(
                "{reason}: the certificate's issuer is not among the trusted roots (a private \
                 CA goes in the upstream's ca_file)"
            ),
            (_, Some(rustls::AlertDescription::HandshakeFailure)) => format!(
                "{reason}: the upstream ended the TLS handshake, as a TLS 1.2 server refuses a \
                 client certificate or the lack of one ({}), or when no TLS version and cipher \
                 suite are in common",
                match &upstream.config.client_cert {
                    None => "the upstream has no client_cert".to_owned(),
                    Some(c) => format!("client_cert {}", c.cert.display()),
                }
            ),
            _ => reason,
        };
        // What fails the handshake this way fails every attempt on this upstream the same.
        GatewayError::UpstreamUnavailable {
            upstream: name,
            reason,
            certificate: certificate.is_some() || handshake_refused.is_some() || no_h2,
        }
    } else {
        GatewayError::UpstreamError {
            upstream: name,
            reason: if gone_away {
                format!(
                    "{GONE_AWAY_WAITING_BODILESS}; it may have reached the upstream whole, \
                     so it was not sent again"
                )
            } else {
                reason
            },
        }
    }
}

/// Why an attempt's connection could not be made, as
/// `hourglass_upstream_connect_errors_total` counts it (audit RA 2: a refused port or a name
/// that did not resolve showed in no per-upstream series). None where a connection was made,
/// or where the gateway's own want of descriptors or ports failed it (`Starved`, which is no
/// fault of the upstream's).
fn connect_failure(
    e: &(dyn std::error::Error + 'static),
    error: &GatewayError,
) -> Option<&'static str> {
    match error {
        GatewayError::ConnectTimeout { .. } => return Some("timeout"),
        GatewayError::UpstreamUnavailable { .. } => {}
        _ => return None,
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        // hyper-util's words for a failed lookup, as `lookup_starved` reads them.
        if s.to_string() == crate::upstream::LOOKUP_FAILED {
            return Some("dns");
        }
        if s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return Some("refused");
        }
        if s.is::<crate::upstream::NoH2ByAlpn>() {
            return Some("tls");
        }
        source = s.source();
    }
    Some(if crate::upstream::tls_failed(e) {
        "tls"
    } else {
        "other"
    })
}

/// A connect error's reason with what it was connecting to: hyper-util's says neither the
/// name that did not resolve nor where the connect was refused (audit GG 4).
///
/// Behind an egress proxy the proxy is named too: a tunnel it granted and then closed
/// fails inside it (a reset, a TLS handshake's EOF), and is no fault of the upstream's
/// that the message could show (audit QC 6).
fn connecting(upstream: &Upstream, reason: &str) -> String {
    match upstream.proxy_shown() {
        // (Not twice where the proxy's own error already names it.)
        Some(proxy) if !reason.contains(proxy) => format!(
            "connecting to {} through the egress proxy {proxy}: {reason}",
            upstream.target()
        ),
        _ => format!("connecting to {}: {reason}", upstream.target()),
    }
}

/// A connect that failed for want of the gateway's own descriptors or memory (a socket it
/// could not open): audit CC3 saw it answered 502 `upstream_unavailable`, and two healthy
/// upstreams ejected, under a local descriptor spike.
fn starved(
    e: &hyper_util::client::legacy::Error,
    upstream: &str,
    reason: &str,
) -> Option<GatewayError> {
    if let Some(starved) = crate::error::Starved::in_chain(e) {
        return Some(GatewayError::Starved {
            upstream: upstream.to_owned(),
            starved,
            reason: reason.to_owned(),
        });
    }
    let starved = lookup_starved(e)?;
    Some(GatewayError::Starved {
        upstream: upstream.to_owned(),
        starved,
        reason: format!("{reason} (the name lookup could open neither /etc/hosts nor a socket)"),
    })
}

/// A name lookup that failed while the gateway had no descriptor left. glibc's getaddrinfo
/// then says "Name or service not known", with no error number, as for a name that does not
/// exist: audit CF saw every upstream given by a host name (every real provider) blamed and
/// ejected. On a failed lookup (hyper-util's "dns error"), a socket opened and closed at once
/// tells whether descriptors are what was missing: one syscall pair, on that failure only.
fn lookup_starved(e: &(dyn std::error::Error + 'static)) -> Option<crate::error::Starved> {
    let mut source = Some(e);
    let mut lookup = false;
    while let Some(s) = source {
        lookup |= s.to_string() == crate::upstream::LOOKUP_FAILED;
        source = s.source();
    }
    if !lookup {
        return None;
    }
    match socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None) {
        Ok(_) => None,
        Err(e) => crate::error::Starved::of(&e),
    }
}

/// Why the upstream processed none of a stream it ended before its head (RFC 9113 §8.7),
/// when it says so: a reset with REFUSED_STREAM, or a GOAWAY that closed the connection
/// gracefully (NO_ERROR) below this stream's id. h2 gives a remote GOAWAY error only to the
/// streams above the GOAWAY's last stream id and to the streams opened after it, unless its
/// code is an error, when every stream of the connection gets it (and some may have been
/// processed): those are not taken for refused.
fn unprocessed(e: &h2::Error) -> Option<&'static str> {
    if !e.is_remote() {
        return None;
    }
    match e.reason() {
        Some(h2::Reason::REFUSED_STREAM) if e.is_reset() => Some("HTTP/2 REFUSED_STREAM"),
        Some(h2::Reason::NO_ERROR) if e.is_go_away() => {
            Some("HTTP/2 GOAWAY: the connection was closing")
        }
        _ => None,
    }
}

const CLOSED_UNANSWERED: &str = "a pooled HTTP/1.1 connection, closed before any of the \
     answer came; the request had no body and a safe method";
const GONE_AWAY_WAITING: &str = "HTTP/2 GOAWAY: the upstream closed its HTTP/2 connection while \
     the request waited for a stream";
const GONE_AWAY_WAITING_BODILESS: &str = "the upstream closed its HTTP/2 connection (GOAWAY) \
     while the request was being given a stream";

/// hyper's HTTP/2 client holds one request whose stream waits for a place under the peer's
/// `SETTINGS_MAX_CONCURRENT_STREAMS`; when the connection then goes away (any GOAWAY, even a
/// graceful one that would have let the stream finish), its dispatch task ends and drops
/// that request: h2 resets the stream (CANCEL) at once and the request's callback, dropped,
/// says "dispatch task is gone" (hyper 1.12 `proto/h2/client.rs`, `ClientTask::poll`). No
/// answer came, and the reset leaves nothing running upstream, so it is sent again as a
/// refused one is (audit Z1): a request with a body only, whose body h2 had not begun to
/// send (a request without one may have gone whole, see `classify`). HTTP/1.1 connections answer every request they hold with
/// their own error, and a runtime shutting down sends nothing again. hyper has no predicate
/// for this kind, only its words; the test in `tests/it/h2_upstream.rs` pins them.
fn dispatch_gone(e: &hyper::Error) -> bool {
    e.is_user()
        && e.to_string() == "dispatch task is gone"
        && std::error::Error::source(e)
            .is_some_and(|c| c.to_string() == "runtime dropped the dispatch task")
}

#[cfg(test)]
mod tests {
    use super::*;

    use http::Uri;
    use http_body_util::Empty;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::net::TcpStream;

    use crate::error::Starved;

    /// hyper-util's `ConnectError` as its connector makes it when `socket()` fails: a message
    /// whose source is the I/O error.
    #[derive(Debug, thiserror::Error)]
    #[error("tcp open error")]
    struct TcpOpenError(#[source] std::io::Error);

    /// A connector whose every connect fails with `errno`, boxed as the gateway's connector
    /// boxes its inner one's errors.
    #[derive(Clone)]
    struct Failing(i32);

    impl tower_service::Service<Uri> for Failing {
        type Response = TokioIo<TcpStream>;
        type Error = crate::error::BoxError;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Uri) -> Self::Future {
            let io = std::io::Error::from_raw_os_error(self.0);
            std::future::ready(Err(Box::new(TcpOpenError(io))))
        }
    }

    async fn connect_error(errno: i32) -> hyper_util::client::legacy::Error {
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .build::<_, Empty<Bytes>>(Failing(errno));
        let req = http::Request::get("http://127.0.0.1:9/").body(Empty::new());
        client.request(req.unwrap()).await.unwrap_err()
    }

    /// Audit CC3: out of descriptors (or memory), the gateway's connect is its own failure:
    /// a 503 `overloaded` that names the gateway, not the upstream's 502.
    #[tokio::test]
    async fn a_connect_the_gateway_had_no_descriptor_for_is_its_own_overload() {
        for (errno, want) in [
            (24, Starved::Descriptors),
            (23, Starved::Descriptors),
            (12, Starved::Memory),
            (libc::EADDRNOTAVAIL, Starved::Ports),
        ] {
            let e = connect_error(errno).await;
            assert!(e.is_connect());
            let classified = starved(&e, "u", &crate::error::with_causes(&e))
                .unwrap_or_else(|| panic!("{errno}: not starved"));
            assert!(
                matches!(classified, GatewayError::Starved { starved: s, .. } if s == want),
                "{errno}: {classified:?}"
            );
            assert_eq!(classified.code(), "overloaded");
            assert_eq!(classified.origin(), Some(crate::error::Origin::Overloaded));
            let answer = classified.response();
            assert_eq!(answer.status(), http::StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(answer.headers()[http::header::RETRY_AFTER], "1");
        }
        let message = starved(&connect_error(24).await, "u", "tcp open error")
            .unwrap()
            .to_string();
        assert!(
            message.starts_with("the gateway has no file descriptor left")
                && message.contains("upstream \"u\""),
            "{message}"
        );
        // Audit KF 4: out of local ports (EADDRNOTAVAIL), the connect is the gateway's own
        // shortage too, said as such, not a healthy upstream's 502 and ejection.
        let message = starved(
            &connect_error(libc::EADDRNOTAVAIL).await,
            "u",
            "tcp connect error",
        )
        .unwrap()
        .to_string();
        assert!(
            message.starts_with("the gateway has no local port left")
                && message.contains("upstream \"u\""),
            "{message}"
        );
        // The upstream's own refusal is still its failure.
        assert!(starved(&connect_error(111).await, "u", "refused").is_none());
    }
}
