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
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::capture_connection;
use pin_project_lite::pin_project;
use tokio::time::{sleep_until, Instant};

use crate::budget::{names, Budget};
use crate::config::RetryCause;
use crate::error::GatewayError;
use crate::inspect::Inspector;
use crate::metrics::InFlight;
use crate::provider::Format;
use crate::sse::SseScanner;
use crate::upstream::{ConnectTimedOut, Upstream};
use crate::watchdog::StreamLimits;

/// What one attempt needs beyond the request itself.
pub struct Attempt<'a> {
    pub upstream: &'a Arc<Upstream>,
    pub budget: &'a Budget,
    /// This attempt's first-token limit: the route's, shortened to leave room for a fallback.
    pub first_token_timeout: Duration,
    /// Hold a successful head until the first data event.
    pub hold: bool,
    pub in_flight: InFlight,
}

/// An attempt that produced a response head (and, when held, its first data event).
pub struct Started {
    pub response: Response<UpstreamBody>,
    pub limits: StreamLimits,
    /// When the request was handed to a connection: the start of the first-token clock.
    pub sent_at: Instant,
    pub first_token_at: Option<Instant>,
    /// The first body byte, when it was read while the head was held.
    pub first_byte_at: Option<Instant>,
    /// The wire format of the exchange, when it is known (the upstream's `api` and the path).
    pub format: Option<Format>,
}

/// An attempt that failed before anything reached the client.
#[derive(Debug)]
pub struct Failed {
    pub error: GatewayError,
    /// What kind of failure it was, for `retry_on`; `None` when no retry could help.
    pub cause: Option<RetryCause>,
    pub sent_at: Option<Instant>,
}

impl<'a> Attempt<'a> {
    /// Not an `async fn`, and the request handed to the client before the future is made:
    /// an `async fn` would keep the request (and its other arguments) in its future twice
    /// over for its whole life, and this future sits inside every request's. (The client's
    /// future does nothing until it is polled.)
    pub fn run(
        self,
        mut req: Request<Full<Bytes>>,
    ) -> impl Future<Output = Result<Started, Failed>> + 'a {
        let budget = self.budget;
        let upstream = self.upstream;
        let format = Format::detect(upstream.config.api, req.uri().path());
        let work_deadline = budget.work_deadline();
        let now = Instant::now();
        if upstream.config.propagate_budget {
            req.headers_mut().insert(
                names::BUDGET.clone(),
                http::HeaderValue::from(budget.forwarded_ms(now)),
            );
        }
        let mut connection = capture_connection(&mut req);
        let response = upstream.request(req);
        async move {
            tokio::pin!(response);
            let timer = sleep_until((now + budget.connect_timeout).min(work_deadline));
            tokio::pin!(timer);
            let mut sent_at: Option<Instant> = None;
            let fail = |error: GatewayError, cause, sent_at| Failed {
                error,
                cause,
                sent_at,
            };
            let result = loop {
                tokio::select! {
                    biased;
                    r = &mut response => break r,
                    _ = connection.wait_for_connection_metadata(), if sent_at.is_none() => {
                        let at = Instant::now();
                        sent_at = Some(at);
                        timer.as_mut().reset((at + self.first_token_timeout).min(work_deadline));
                    }
                    () = &mut timer => {
                        let (error, cause) = self.limit_error(sent_at.is_some());
                        return Err(fail(error, cause, sent_at));
                    }
                }
            };
            let response = result.map_err(|e| {
                let (error, cause) = classify(upstream, &e, budget.connect_timeout);
                fail(error, cause, sent_at)
            })?;
            // A head always comes over a connection; should its metadata not have been seen yet,
            // the head itself proves the request was sent.
            let sent_at = sent_at.unwrap_or_else(Instant::now);
            let first_token_deadline = (sent_at + self.first_token_timeout).min(work_deadline);
            let limits = StreamLimits {
                first_token_deadline,
                first_token_timeout: self.first_token_timeout,
                idle_timeout: budget.idle_timeout,
                deadline: work_deadline,
                budget: budget.total,
                upstream: upstream.name.clone(),
            };
            let (parts, incoming) = response.into_parts();
            let mut body = UpstreamBody {
                prefix: VecDeque::new(),
                inner: incoming,
                _in_flight: self.in_flight,
            };
            let (mut first_token_at, mut first_byte_at) = (None, None);
            if self.hold && parts.status.is_success() {
                // An encoded answer is held to its first byte, as any body that is not SSE text.
                let is_sse = crate::headers::is_readable_event_stream(&parts.headers);
                let inspector = format.filter(|_| is_sse).map(|f| Inspector::new(f, true));
                // Boxed: only routes that may switch hold, and inline the hold's state would
                // grow every request's future by its size.
                match Box::pin(hold_until_first_token(
                    &mut body, is_sse, inspector, &limits,
                ))
                .await
                {
                    Ok((token, byte)) => (first_token_at, first_byte_at) = (token, byte),
                    Err(error) => {
                        let cause = match error {
                            GatewayError::FirstTokenTimeout { .. } => Some(RetryCause::FirstToken),
                            GatewayError::UpstreamError { .. } => Some(RetryCause::Reset),
                            _ => None,
                        };
                        return Err(fail(error, cause, Some(sent_at)));
                    }
                }
            }
            Ok(Started {
                response: Response::from_parts(parts, body),
                limits,
                sent_at,
                first_token_at,
                first_byte_at,
                format,
            })
        }
    }

    fn limit_error(&self, connected: bool) -> (GatewayError, Option<RetryCause>) {
        let upstream = self.upstream.name.to_string();
        if Instant::now() >= self.budget.work_deadline() {
            (
                GatewayError::DeadlineExceeded {
                    budget: self.budget.total,
                },
                None,
            )
        } else if !connected {
            (
                GatewayError::ConnectTimeout {
                    upstream,
                    after: self.budget.connect_timeout,
                },
                Some(RetryCause::Connect),
            )
        } else {
            (
                GatewayError::FirstTokenTimeout {
                    upstream,
                    after: self.first_token_timeout,
                },
                Some(RetryCause::FirstToken),
            )
        }
    }
}

/// Reads the body until its first token (SSE: the first event carrying model output when an
/// `inspector` knows the format, else the first data event) or first byte (anything else),
/// keeping what it read as the body's prefix. Returns when that token and the first byte
/// arrived; no token if the body ended (or the provider's error event came) first.
async fn hold_until_first_token(
    body: &mut UpstreamBody,
    is_sse: bool,
    mut inspector: Option<Inspector>,
    limits: &StreamLimits,
) -> Result<(Option<Instant>, Option<Instant>), GatewayError> {
    let mut scanner = SseScanner::new();
    let mut first_byte = None;
    let timer = sleep_until(limits.first_token_deadline.min(limits.deadline));
    tokio::pin!(timer);
    loop {
        let frame = tokio::select! {
            biased;
            f = body.inner.frame() => f,
            () = &mut timer => {
                return Err(if Instant::now() >= limits.deadline {
                    GatewayError::DeadlineExceeded { budget: limits.budget }
                } else {
                    GatewayError::FirstTokenTimeout {
                        upstream: limits.upstream.to_string(),
                        after: limits.first_token_timeout,
                    }
                });
            }
        };
        match frame {
            None => return Ok((None, first_byte)),
            Some(Err(e)) => {
                return Err(GatewayError::UpstreamError {
                    upstream: limits.upstream.to_string(),
                    reason: e.to_string(),
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
                if !is_sse {
                    body.prefix.push_back(data);
                    return Ok((Some(now), Some(byte_at)));
                }
                let scan = scanner.scan(&data);
                let (output, error) = match inspector.as_mut() {
                    None => (scan.progress > 0, scan.error_end.is_some()),
                    Some(i) => {
                        let found = i.feed(&data[..scan.error_end.unwrap_or(data.len())]);
                        let error = found.error_end.is_some() || scan.error_end.is_some();
                        (found.output, error)
                    }
                };
                body.prefix.push_back(data);
                if output {
                    return Ok((Some(now), Some(byte_at)));
                }
                if error {
                    // The upstream's own error event: no token will come, but it is the
                    // upstream's answer to pass through, not ours to retry.
                    return Ok((None, Some(byte_at)));
                }
            }
        }
    }
}

pin_project! {
    /// The upstream's body, after whatever was read while the head was held, counted in
    /// flight until it is dropped.
    pub struct UpstreamBody {
        prefix: VecDeque<Bytes>,
        #[pin]
        inner: Incoming,
        _in_flight: InFlight,
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
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let held: u64 = self.prefix.iter().map(|b| b.len() as u64).sum();
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + held);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + held);
        }
        hint
    }
}

fn classify(
    upstream: &Upstream,
    e: &hyper_util::client::legacy::Error,
    connect_timeout: Duration,
) -> (GatewayError, Option<RetryCause>) {
    let mut reason = String::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    let mut timed_out = None;
    while let Some(s) = source {
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
        if !reason.is_empty() {
            reason.push_str(": ");
        }
        reason.push_str(&s.to_string());
        source = s.source();
    }
    if reason.is_empty() {
        reason = e.to_string();
    }
    let name = upstream.name.to_string();
    if let Some(after) = timed_out {
        (
            GatewayError::ConnectTimeout {
                upstream: name,
                after,
            },
            Some(RetryCause::Connect),
        )
    } else if e.is_connect() {
        (
            GatewayError::UpstreamUnavailable {
                upstream: name,
                reason,
            },
            Some(RetryCause::Connect),
        )
    } else {
        (
            GatewayError::UpstreamError {
                upstream: name,
                reason,
            },
            Some(RetryCause::Reset),
        )
    }
}
