//! The request path: route, budget, read the body, then hand the request to the route's
//! attempt policy (`retry`) and the upstream's body to the watchdog. Everything before the
//! response head is decided here and in `retry`/`attempt`; everything after it by the
//! watchdog body.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Response, Uri, Version};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, Limited};
use tokio::time::{timeout_at, Instant};
use tokio_util::sync::CancellationToken;

use crate::admission::{strip_client_credentials, Admission, ClientKeys};
use crate::attempt::UpstreamBody;
use crate::budget::{names, Budget, BudgetRequest};
use crate::config::{Config, RetryCause, Route};
use crate::error::GatewayError;
use crate::headers::{
    check_framing, client_accept_encoding, content_coding, content_length, hops, insert_request_id,
    is_event_stream, is_json, request_id, strip_hop_by_hop, unsupported_encoding, via,
    websocket_upgrade, IDENTITY, MAX_HOPS,
};
use crate::inspect::Inspector;
use crate::metrics::{AnswerMetrics, Histogram, IntGauge, Metrics, RouteMetrics, NO_ROUTE};
use crate::outcome::RequestRecord;
use crate::policy::rewrite_model;
use crate::provider::{include_usage, Format};
use crate::reaper::Reapable;
use crate::upstream::{Upstream, UpstreamBuildError};
use crate::watchdog::{BoxError, WatchdogBody};

pub type ProxyBody = Either<Full<Bytes>, WatchdogBody<Reapable<UpstreamBody>, RequestRecord>>;

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
    pub chain: Vec<ChainEntry>,
    pub metrics: RouteMetrics,
    /// The keys clients must present (`client_keys_*`), if any.
    pub keys: Option<ClientKeys>,
    /// The route's `max_in_flight` slots, if limited.
    pub admission: Option<Admission>,
}

impl RouteRuntime {
    /// The least budget an attempt anywhere on the chain needs: what a request waiting for
    /// admission must still have when it gets its slot.
    fn least_need(&self, min_useful: std::time::Duration) -> std::time::Duration {
        self.chain
            .iter()
            .map(|e| e.upstream.ttft.get().max(min_useful))
            .min()
            .unwrap_or(min_useful)
    }

    /// Whether this route would refuse `headers` for want of a client key.
    fn refuses(&self, headers: &HeaderMap) -> bool {
        self.keys.as_ref().is_some_and(|k| !k.accepts(headers))
    }
}

/// The routing table with its upstream clients and metric handles, built once per config.
pub struct Gateway {
    config: Arc<Config>,
    routes: Vec<RouteRuntime>,
    no_route: RouteMetrics,
    pub(crate) metrics: Arc<Metrics>,
    shutdown: CancellationToken,
}

/// The request as every attempt sends it, less what differs per upstream (URI, credentials,
/// model, the forwarded budget).
pub struct Template {
    pub method: Method,
    pub path_and_query: PathAndQuery,
    /// With `Accept-Encoding: identity`, what an answer that is read needs.
    pub headers: HeaderMap,
    /// The client's own `Accept-Encoding`, for answers that are not read.
    pub accept_encoding: Option<HeaderValue>,
    pub body: Bytes,
}

impl Template {
    pub fn request_for(&self, upstream: &Upstream) -> Result<Request<Full<Bytes>>, GatewayError> {
        let uri: Uri =
            upstream
                .uri_for(&self.path_and_query)
                .map_err(|e| GatewayError::BadRequest {
                    message: format!("request target cannot be forwarded: {e}"),
                })?;
        let mut body = match &upstream.config.model {
            Some(model) => rewrite_model(&self.body, model).unwrap_or_else(|| self.body.clone()),
            None => self.body.clone(),
        };
        let format = Format::detect(upstream.config.api, uri.path());
        if upstream.config.include_usage && format == Some(Format::Chat) {
            if let Some(with_usage) = include_usage(&body) {
                body = with_usage;
            }
        }
        let mut req = Request::builder()
            .method(self.method.clone())
            .uri(uri)
            .body(Full::new(body))
            .map_err(|e| GatewayError::BadRequest {
                message: format!("request cannot be forwarded: {e}"),
            })?;
        *req.headers_mut() = self.headers.clone();
        if format.is_none() {
            // Not read, so passed opaque: it may come in any coding the client takes.
            match &self.accept_encoding {
                Some(v) => req.headers_mut().insert(header::ACCEPT_ENCODING, v.clone()),
                None => req.headers_mut().remove(header::ACCEPT_ENCODING),
            };
        }
        upstream.apply_credentials(req.headers_mut());
        Ok(req)
    }
}

impl Gateway {
    /// Builds the routing table. Upstreams whose settings are unchanged in `previous` (the
    /// gateway a reload replaces) are reused with their connection pools and learned
    /// estimates. `shutdown` is cancelled when in-flight requests must end.
    pub fn new(
        config: Arc<Config>,
        metrics: &Arc<Metrics>,
        previous: Option<&Gateway>,
        shutdown: CancellationToken,
    ) -> Result<Self, UpstreamBuildError> {
        let mut upstreams: Vec<Arc<Upstream>> = Vec::new();
        for up in &config.upstreams {
            // The connector's own bound is the longest any route allows; each request bounds
            // its connect by its own limit and budget as well.
            let connect = config
                .routes
                .iter()
                .filter(|r| {
                    r.upstream.name == up.name
                        || r.policy.fallbacks.iter().any(|f| f.name == up.name)
                })
                .map(|r| r.limits.connect_timeout)
                .max()
                .unwrap_or(std::time::Duration::from_secs(10));
            let reused = previous.and_then(|g| {
                g.routes
                    .iter()
                    .flat_map(|r| r.chain.iter())
                    .map(|e| &e.upstream)
                    // A rotated key (same file, new contents) needs a new upstream.
                    .find(|u| {
                        *u.config == **up && u.connect_bound == connect && u.credential_is_current()
                    })
                    .cloned()
            });
            upstreams.push(match reused {
                Some(u) => u,
                None => Arc::new(Upstream::new(up.clone(), connect)?),
            });
        }
        let find = |name: &str| {
            upstreams
                .iter()
                .find(|u| &*u.name == name)
                .expect("config checks that every route names known upstreams")
                .clone()
        };
        let routes = config
            .routes
            .iter()
            .map(|r| {
                let names: Vec<&str> = std::iter::once(r.upstream.name.as_str())
                    .chain(r.policy.fallbacks.iter().map(|f| f.name.as_str()))
                    .collect();
                let reasons: Vec<&str> = RetryCause::ALL
                    .iter()
                    .filter(|c| r.policy.retry_on.contains(**c))
                    .map(|c| c.as_str())
                    .collect();
                metrics.init_policy(&r.name, &names, &reasons, r.policy.hedge_after.is_some());
                let keys = r
                    .client_auth
                    .as_ref()
                    .map(|a| ClientKeys::load(&r.name, a))
                    .transpose()?;
                // Across a reload, a route keeps its slots (and so counts the requests still
                // in flight on the old configuration) unless its limit changed.
                let admission = r.max_in_flight.map(|n| {
                    previous
                        .and_then(|g| g.routes.iter().find(|p| p.route.name == r.name))
                        .and_then(|p| p.admission.clone())
                        .filter(|a| a.limit() == n)
                        .unwrap_or_else(|| Admission::new(Arc::from(r.name.as_str()), n))
                });
                Ok(RouteRuntime {
                    keys,
                    admission,
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
                })
            })
            .collect::<Result<Vec<_>, UpstreamBuildError>>()?;
        Ok(Self {
            config,
            routes,
            no_route: metrics.route(NO_ROUTE),
            metrics: metrics.clone(),
            shutdown,
        })
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// Serves one client request. Never fails: every failure becomes the contracted answer.
    /// (Not an `async fn`, for the reason given at `forward`; what needs no waiting is done
    /// before the future is made.)
    pub fn handle<B>(self: Arc<Self>, req: Request<B>) -> impl Future<Output = Response<ProxyBody>>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let arrival = Instant::now();
        let id = request_id(req.headers());
        // The path alone: a query string may carry a key (`?key=` is how Gemini takes one).
        let path = req.uri().path().to_string();
        let mut record = RequestRecord::new(
            id.clone(),
            req.method().clone(),
            path,
            arrival,
            self.no_route.clone(),
        );
        let client = req.extensions().get::<crate::server::ClientAddr>();
        // Over HTTP/2 the stream counts as open until the record goes with the answer.
        record.hold_stream(client.and_then(|c| c.1.as_ref()).map(|s| s.open()));
        record.set_client(
            client.map(|c| c.0),
            req.headers()
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok()),
            req.version(),
        );
        // HTTP/1.0 has no chunked coding, and a HEAD answer no body.
        let close_delimited = req.version() == Version::HTTP_10 && req.method() != Method::HEAD;
        async move {
            // A request still waiting for its head when the shutdown grace ends is answered too.
            let forwarded = tokio::select! {
                r = self.forward(req, arrival, &id, &mut record) => r,
                () = self.shutdown.cancelled() => Err(GatewayError::Shutdown),
            };
            match forwarded {
                Ok(started) => {
                    let (mut parts, body) = started.response.into_parts();
                    let is_sse = is_event_stream(&parts.headers);
                    // An upstream that encodes although asked not to is passed through opaque:
                    // its bytes are not SSE text, so nothing is read from them or added to them.
                    let readable = content_coding(&parts.headers).is_none();
                    strip_hop_by_hop(&mut parts.headers);
                    if is_sse {
                        if readable {
                            // The body may gain an error event: its length is not the upstream's.
                            parts.headers.remove(header::CONTENT_LENGTH);
                        }
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
                    // A JSON answer in a known format is one document (these APIs stream as
                    // SSE), which arrives at once when it is ready.
                    let document =
                        started.format.is_some() && !is_sse && readable && is_json(&parts.headers);
                    // A successful answer in a known format is read as it passes: SSE for its
                    // tokens, usage and errors, JSON for its usage.
                    let inspector = started
                        .format
                        .filter(|_| {
                            readable
                                && parts.status.is_success()
                                && (is_sse || is_json(&parts.headers))
                        })
                        .map(|format| Inspector::new(format, is_sse));
                    // Past the deadline, or once the client has taken nothing for
                    // `send_timeout`, the upstream goes even if nobody polls the stream.
                    let body = crate::reaper::guard(
                        body,
                        record.take_slot(),
                        started.limits.deadline,
                        self.config.server.send_timeout,
                    );
                    let body = WatchdogBody::new(body, is_sse && readable, started.limits, record)
                        .with_shutdown(&self.shutdown)
                        .with_inspector(inspector);
                    if close_delimited
                        && document
                        && !parts.headers.contains_key(header::CONTENT_LENGTH)
                        && !matches!(parts.status.as_u16(), 100..=199 | 204 | 304)
                    {
                        return with_length(parts, body, &id).await;
                    }
                    Response::from_parts(parts, Either::Right(body))
                }
                Err(e) => {
                    record.fail(&e);
                    error_answer(&e, &mut record, &id)
                }
            }
        }
    }

    /// Not an `async fn`, and the request taken apart before the future is made: an
    /// `async fn` stores its arguments twice (as arguments and as locals) for the whole life
    /// of a future that sits inside every request's.
    fn forward<'a, B>(
        &'a self,
        req: Request<B>,
        arrival: Instant,
        id: &'a str,
        record: &'a mut RequestRecord,
    ) -> impl Future<Output = Result<crate::attempt::Started, GatewayError>> + 'a
    where
        B: Body<Data = Bytes> + 'a,
        B::Error: Into<BoxError>,
    {
        let (
            http::request::Parts {
                method,
                uri,
                version,
                mut headers,
                ..
            },
            body,
        ) = req.into_parts();
        async move {
            check_framing(version, &headers)?;
            let path = uri.path().to_string();
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
            record.set_route(tentative.name.clone(), tentative.metrics.clone());
            // A chain that leads back into itself would otherwise recurse until file
            // descriptors run out, starving every other client.
            let hops = hops(&headers);
            if hops >= MAX_HOPS {
                return Err(GatewayError::LoopDetected { hops });
            }
            if let Some(v) = websocket_upgrade(&headers) {
                return Err(GatewayError::UpgradeUnsupported {
                    value: String::from_utf8_lossy(v.as_bytes()).into_owned(),
                });
            }
            // Before anything is read or parsed: a request that no candidate route would accept
            // is refused now (the chosen route checks again once the body names the model).
            if candidates.iter().all(|r| r.refuses(&headers)) {
                return Err(GatewayError::Unauthorized);
            }
            // A body in a content coding passes as it is, unless the gateway must read it: for
            // the model that picks the route (refused before reading it), or to rewrite the
            // model for an upstream of the chosen route.
            let encoded = content_coding(&headers).is_some();
            if encoded && first.route.needs_model() {
                return Err(unsupported_encoding(&headers));
            }
            let asked = BudgetRequest::from_headers(&headers)?;

            // Until the body names the model, the widest budget among the candidates bounds the
            // body read; the chosen route's own budget is then resolved from the same arrival.
            // (In a block of its own so that it is not kept in the future past the read.)
            let body = {
                let provisional = candidates
                    .iter()
                    .map(|r| asked.resolve(&r.route.limits, arrival))
                    .max_by_key(|b| b.deadline)
                    .expect("candidates is not empty");
                record.set_budget(provisional.clone());
                provisional.ensure_useful(Instant::now())?;
                let limit = self.config.server.max_request_body;
                if let Some(len) = content_length(&headers) {
                    if len > limit {
                        return Err(GatewayError::BodyTooLarge { limit });
                    }
                }
                read_body(body, limit, &provisional).await?
            };

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
            record.set_route(route.name.clone(), route.metrics.clone());
            if route.refuses(&headers) {
                return Err(GatewayError::Unauthorized);
            }
            if encoded
                && route
                    .chain
                    .iter()
                    .any(|e| e.upstream.config.model.is_some())
            {
                return Err(unsupported_encoding(&headers));
            }
            let budget = asked.resolve(&route.route.limits, arrival);
            record.set_budget(budget.clone());
            budget.ensure_useful(Instant::now())?;

            if route.keys.is_some() {
                // The client's key is this gateway's, never the upstream's.
                strip_client_credentials(&mut headers);
            }
            strip_hop_by_hop(&mut headers);
            for &h in &names::INBOUND {
                headers.remove(h);
            }
            headers.remove(header::HOST);
            headers.remove(header::CONTENT_LENGTH);
            headers.remove(header::EXPECT);
            // A gateway names itself in every request it forwards, after any intermediary
            // before it (RFC 9110 7.6.3).
            headers.append(header::VIA, via(version));
            // An answer in a known format is read as it passes (tokens, usage, errors), and an
            // encoded one cannot be. Clients ask for `gzip` by default (httpx, undici): against
            // a compressing upstream, a stream would look silent to the first-token limit and
            // an error event would corrupt it. Set here once rather than per attempt, where the
            // insert would grow every attempt's copy of the headers.
            let accept_encoding = client_accept_encoding(&headers);
            headers.insert(header::ACCEPT_ENCODING, IDENTITY);
            insert_request_id(&mut headers, id);
            let template = Template {
                method,
                path_and_query: uri
                    .path_and_query()
                    .cloned()
                    .unwrap_or_else(|| PathAndQuery::from_static("/")),
                headers,
                accept_encoding,
                body,
            };
            if let Some(admission) = &route.admission {
                let slot = admission
                    .admit(&budget, route.least_need(budget.min_useful))
                    .await?;
                record.hold(slot);
            }
            crate::retry::run(self, route, &template, &budget, record).await
        }
    }
}

/// The JSON error answer for `e`, noted in `record` as what the client was sent.
fn error_answer(e: &GatewayError, record: &mut RequestRecord, id: &str) -> Response<ProxyBody> {
    record.set_status(e.status().as_u16());
    let resp = e.response();
    crate::watchdog::Observer::data(record, resp.body().len());
    let mut resp = resp.map(|b| Either::Left(Full::new(b)));
    insert_request_id(resp.headers_mut(), id);
    resp
}

/// An answer to an HTTP/1.0 client is read whole before it is sent, up to this many bytes.
pub const LENGTH_CAP: usize = 1 << 20;

/// The answer to an HTTP/1.0 client, for a JSON document in a known format without a length of
/// its own. HTTP/1.0 has no chunked coding, so it would end with the connection, and the abort
/// that tells a failure would look like its end. It is read whole, with every limit still
/// running, and sent with its length; a limit or failure meanwhile becomes the JSON error
/// answer instead. One longer than `LENGTH_CAP` goes out as it comes, as before. Anything
/// else (SSE, NDJSON, audio, a JSON array streamed piece by piece) is never held back: it
/// streams as it comes, and an abort ends it as the connection's end.
async fn with_length(
    mut parts: http::response::Parts,
    mut body: WatchdogBody<Reapable<UpstreamBody>, RequestRecord>,
    id: &str,
) -> Response<ProxyBody> {
    let mut frames = Vec::new();
    let mut len = 0;
    loop {
        match body.frame().await {
            None => break,
            // Trailers: HTTP/1.0 has no way to send them.
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                len += data.len();
                frames.push(data);
                if len > LENGTH_CAP {
                    body.unread(frames);
                    return Response::from_parts(parts, Either::Right(body));
                }
            }
            Some(Err(e)) => {
                // The watchdog ends a body it polls with a `GatewayError` and nothing else.
                let e = e
                    .downcast::<GatewayError>()
                    .map_or(GatewayError::Internal, |e| *e);
                // The watchdog has already noted how the body ended.
                return error_answer(&e, body.observer_mut(), id);
            }
        }
    }
    let whole = match frames.len() {
        0 => Bytes::new(),
        1 => frames.pop().expect("one frame"),
        _ => Bytes::from(frames.concat()),
    };
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(whole.len()));
    Response::from_parts(parts, Either::Left(Full::new(whole)))
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
