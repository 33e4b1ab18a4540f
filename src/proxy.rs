//! The request path: route, budget, read the body, forward, and hand the upstream's body to
//! the watchdog. Everything before the response head is decided here; everything after it by
//! the watchdog body.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::capture_connection;
use tokio::time::{sleep_until, timeout_at, Instant};

use crate::budget::{Budget, BudgetRequest, BUDGET_HEADER, INBOUND_BUDGET_HEADERS};
use crate::config::{Config, Route};
use crate::error::GatewayError;
use crate::metrics::{Metrics, RouteMetrics, NO_ROUTE};
use crate::outcome::RequestRecord;
use crate::upstream::{ConnectTimedOut, Upstream, UpstreamBuildError};
use crate::watchdog::{BoxError, StreamLimits, WatchdogBody};

pub type ProxyBody = Either<Full<Bytes>, WatchdogBody<Incoming, RequestRecord>>;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Connection-level headers (RFC 9110 section 7.6.1) that never cross a proxy.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

struct RouteRuntime {
    route: Route,
    name: Arc<str>,
    upstream: Arc<Upstream>,
    metrics: RouteMetrics,
}

/// The routing table with its upstream clients and metric handles, built once per config.
pub struct Gateway {
    config: Arc<Config>,
    routes: Vec<RouteRuntime>,
    no_route: RouteMetrics,
}

/// What the head phase hands to the body phase.
struct Forwarded {
    response: Response<Incoming>,
    limits: StreamLimits,
}

impl Gateway {
    pub fn new(config: Arc<Config>, metrics: &Metrics) -> Result<Self, UpstreamBuildError> {
        let mut upstreams: Vec<Arc<Upstream>> = Vec::new();
        for up in &config.upstreams {
            // The connector's own bound is the longest any route allows; each request bounds
            // its connect by its own limit and budget as well.
            let connect = config
                .routes
                .iter()
                .filter(|r| r.upstream.name == up.name)
                .map(|r| r.limits.connect_timeout)
                .max()
                .unwrap_or(std::time::Duration::from_secs(10));
            upstreams.push(Arc::new(Upstream::new(up.clone(), connect)?));
        }
        let routes = config
            .routes
            .iter()
            .map(|r| {
                let upstream = upstreams
                    .iter()
                    .find(|u| *u.name == r.upstream.name)
                    .expect("config checks that every route names a known upstream")
                    .clone();
                RouteRuntime {
                    route: r.clone(),
                    name: Arc::from(r.name.as_str()),
                    metrics: metrics.route(&r.name, &upstream.name),
                    upstream,
                }
            })
            .collect();
        Ok(Self {
            config,
            routes,
            no_route: metrics.route(NO_ROUTE, NO_ROUTE),
        })
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// Serves one client request. Never fails: every failure becomes the contracted answer.
    pub async fn handle<B>(self: Arc<Self>, req: Request<B>) -> Response<ProxyBody>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let arrival = Instant::now();
        let id = request_id(req.headers());
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let mut record = RequestRecord::new(
            id.clone(),
            req.method().clone(),
            path,
            arrival,
            self.no_route.clone(),
        );
        match self.forward(req, arrival, &id, &mut record).await {
            Ok(fwd) => {
                let (mut parts, body) = fwd.response.into_parts();
                let is_sse = is_event_stream(&parts.headers);
                strip_hop_by_hop(&mut parts.headers);
                if is_sse {
                    // The body may gain an error event, so its length is not the upstream's.
                    parts.headers.remove(header::CONTENT_LENGTH);
                    parts
                        .headers
                        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                    parts.headers.insert(
                        HeaderName::from_static("x-accel-buffering"),
                        HeaderValue::from_static("no"),
                    );
                }
                insert_request_id(&mut parts.headers, &id);
                record.set_status(parts.status.as_u16());
                let body = WatchdogBody::new(body, is_sse, fwd.limits, record);
                Response::from_parts(parts, Either::Right(body))
            }
            Err(e) => {
                record.set_status(e.status().as_u16());
                record.fail(&e);
                let mut resp = e.response().map(|b| Either::Left(Full::new(b)));
                insert_request_id(resp.headers_mut(), &id);
                resp
            }
        }
    }

    async fn forward<B>(
        &self,
        req: Request<B>,
        arrival: Instant,
        id: &str,
        record: &mut RequestRecord,
    ) -> Result<Forwarded, GatewayError>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let path = req.uri().path().to_string();
        let candidates: Vec<&RouteRuntime> = self
            .routes
            .iter()
            .filter(|r| r.route.matches_path(&path))
            .collect();
        let Some(first) = candidates.first() else {
            return Err(GatewayError::NoRoute { path, model: None });
        };
        // Until the body names the model, a request is attributed to the route it would take
        // without one (the first that does not filter on models), or else the first candidate.
        let tentative = candidates
            .iter()
            .find(|r| !r.route.needs_model())
            .unwrap_or(first);
        record.set_route(
            tentative.name.clone(),
            tentative.upstream.name.clone(),
            tentative.metrics.clone(),
        );
        let asked = BudgetRequest::from_headers(req.headers())?;

        // Until the body names the model, the widest budget among the candidates bounds the
        // body read; the chosen route's own budget is then resolved from the same arrival.
        let provisional = candidates
            .iter()
            .map(|r| asked.resolve(&r.route.limits, arrival))
            .max_by_key(|b| b.deadline)
            .expect("candidates is not empty");
        record.set_budget(provisional.clone());
        provisional.ensure_useful(Instant::now())?;

        let (parts, body) = req.into_parts();
        let limit = self.config.server.max_request_body;
        if let Some(len) = content_length(&parts.headers) {
            if len > limit {
                return Err(GatewayError::BodyTooLarge { limit });
            }
        }
        let body = read_body(body, limit, &provisional).await?;

        let route = if first.route.needs_model() {
            let model = model_of(&body);
            candidates
                .iter()
                .find(|r| r.route.matches(&path, model.as_deref()))
                .copied()
                .ok_or_else(|| GatewayError::NoRoute {
                    path: path.clone(),
                    model: model.map(Cow::into_owned),
                })?
        } else {
            first
        };
        record.set_route(
            route.name.clone(),
            route.upstream.name.clone(),
            route.metrics.clone(),
        );
        let budget = asked.resolve(&route.route.limits, arrival);
        record.set_budget(budget.clone());
        budget.ensure_useful(Instant::now())?;

        let upstream = &route.upstream;
        let uri = upstream
            .uri_for(parts.uri.path_and_query().map_or("/", |p| p.as_str()))
            .map_err(|e| GatewayError::BadRequest {
                message: format!("request target cannot be forwarded: {e}"),
            })?;
        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers);
        for h in INBOUND_BUDGET_HEADERS {
            headers.remove(h);
        }
        headers.remove(header::HOST);
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::EXPECT);
        upstream.apply_credentials(&mut headers);
        insert_request_id(&mut headers, id);
        let mut up_req = Request::builder()
            .method(parts.method)
            .uri(uri)
            .body(Full::new(body))
            .map_err(|e| GatewayError::BadRequest {
                message: format!("request cannot be forwarded: {e}"),
            })?;
        *up_req.headers_mut() = headers;
        send(upstream, up_req, &budget, record).await
    }
}

/// Sends the request and waits for the response head under the connect limit, then the
/// first-token limit (counted from the moment a connection carries the request), both capped
/// by the deadline. Dropping the response future on a limit (or with the whole handler, when
/// the client goes away) is what cancels the upstream call.
async fn send(
    upstream: &Arc<Upstream>,
    mut req: Request<Full<Bytes>>,
    budget: &Budget,
    record: &mut RequestRecord,
) -> Result<Forwarded, GatewayError> {
    let work_deadline = budget.work_deadline();
    let now = Instant::now();
    if upstream.config.propagate_budget {
        req.headers_mut()
            .insert(BUDGET_HEADER, HeaderValue::from(budget.forwarded_ms(now)));
    }
    let mut connection = capture_connection(&mut req);
    record.upstream_started();
    let response = upstream.request(req);
    tokio::pin!(response);
    let timer = sleep_until((now + budget.connect_timeout).min(work_deadline));
    tokio::pin!(timer);
    let mut first_token_deadline: Option<Instant> = None;
    let result = loop {
        tokio::select! {
            biased;
            r = &mut response => break r,
            _ = connection.wait_for_connection_metadata(), if first_token_deadline.is_none() => {
                let at = (Instant::now() + budget.first_token_timeout).min(work_deadline);
                first_token_deadline = Some(at);
                timer.as_mut().reset(at);
            }
            () = &mut timer => {
                let now = Instant::now();
                return Err(if now >= work_deadline {
                    GatewayError::DeadlineExceeded { budget: budget.total }
                } else if first_token_deadline.is_none() {
                    GatewayError::ConnectTimeout { upstream: upstream.name.to_string(), after: budget.connect_timeout }
                } else {
                    GatewayError::FirstTokenTimeout { upstream: upstream.name.to_string(), after: budget.first_token_timeout }
                });
            }
        }
    };
    let response = result.map_err(|e| classify(upstream, &e, budget.connect_timeout))?;
    let first_token_deadline = first_token_deadline
        .unwrap_or_else(|| (Instant::now() + budget.first_token_timeout).min(work_deadline));
    Ok(Forwarded {
        response,
        limits: StreamLimits {
            first_token_deadline,
            first_token_timeout: budget.first_token_timeout,
            idle_timeout: budget.idle_timeout,
            deadline: work_deadline,
            budget: budget.total,
            upstream: upstream.name.clone(),
        },
    })
}

fn classify(
    upstream: &Upstream,
    e: &hyper_util::client::legacy::Error,
    upstream_connect_timeout: std::time::Duration,
) -> GatewayError {
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
            timed_out.get_or_insert(upstream_connect_timeout);
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
        GatewayError::ConnectTimeout {
            upstream: name,
            after,
        }
    } else if e.is_connect() {
        GatewayError::UpstreamUnavailable {
            upstream: name,
            reason,
        }
    } else {
        GatewayError::UpstreamError {
            upstream: name,
            reason,
        }
    }
}

async fn read_body<B>(body: B, limit: u64, budget: &Budget) -> Result<Bytes, GatewayError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let limited = Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX));
    match timeout_at(budget.work_deadline(), limited.collect()).await {
        Err(_) => Err(GatewayError::DeadlineExceeded {
            budget: budget.total,
        }),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                Err(GatewayError::BodyTooLarge { limit })
            } else {
                Err(GatewayError::BadRequest {
                    message: format!("request body could not be read: {e}"),
                })
            }
        }
    }
}

fn model_of(body: &Bytes) -> Option<Cow<'_, str>> {
    #[derive(serde::Deserialize)]
    struct ModelOnly<'a> {
        #[serde(borrow)]
        model: Option<Cow<'a, str>>,
    }
    serde_json::from_slice::<ModelOnly<'_>>(body)
        .ok()
        .and_then(|m| m.model)
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(n);
    }
    headers.remove(header::UPGRADE);
}

/// Keeps a client's request id when it is a sane token, so logs correlate across hops;
/// otherwise makes one.
fn request_id(headers: &HeaderMap) -> Arc<str> {
    headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(Arc::from)
        .unwrap_or_else(|| Arc::from(uuid::Uuid::new_v4().simple().to_string()))
}

fn insert_request_id(headers: &mut HeaderMap, id: &str) {
    if let Ok(v) = HeaderValue::from_str(id) {
        headers.insert(REQUEST_ID, v);
    }
}
