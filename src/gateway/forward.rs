//! The request path up to the first attempt: refuse what must be refused (framing,
//! dot-segments, loops, upgrades, keys, encodings), pick the route (by path, then by the
//! body's model), fix the budget, read the body within it, build the template every attempt
//! sends, take an admission slot, and hand over to the route's attempts (`retry`).

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::{PathAndQuery, Scheme};
use http::{Method, Request};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use tokio::time::Instant;

use crate::admission::BodyMemory;
use crate::auth::strip_client_credentials;
use crate::budget::{names, Budget, BudgetRequest};
use crate::error::{BoxError, GatewayError, Uploading};
use crate::gateway::attempt::Started;
use crate::gateway::record::RequestRecord;
use crate::gateway::routes::{Gateway, RouteRuntime};
use crate::gateway::run::{self, InRun};
use crate::gateway::template::Template;
use crate::http::client_steering::strip_rewrites;
use crate::http::content_type::content_type_fault;
use crate::http::framing::AmbiguousFraming;
use crate::http::headers::{
    check_framing, client_accept_encoding, content_coding, content_length, header_list_size,
    host_not_authority, insert_request_id, join_cookies, present, strip_hop_by_hop,
    unsupported_encoding, websocket_upgrade, IDENTITY,
};
use crate::http::hops::{decrement_max_forwards, hops, via, HOURGLASS_HOPS, MAX_HOPS};
use crate::http::path::{for_routing, has_dot_segment, normalized};
use crate::provider::background::{detached, Detached};
use crate::provider::request::{head_of, Head, Unreadable};
use crate::provider::{may_generate, Format};

impl Gateway {
    /// Not an `async fn`, and the request taken apart before the future is made: an
    /// `async fn` stores its arguments twice (as arguments and as locals) for the whole life
    /// of a future that sits inside every request's.
    pub(super) fn forward<'a, B>(
        &'a self,
        req: Request<B>,
        arrival: Instant,
        id: &'a str,
        record: &'a mut RequestRecord,
    ) -> impl Future<Output = Result<Started, GatewayError>> + 'a
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
                extensions,
                ..
            },
            body,
        ) = req.into_parts();
        // hyper drops the Content-Length of a head that also had Transfer-Encoding; the
        // connection's framing tracker saw it (`http::framing`).
        let both_lengths = extensions.get::<AmbiguousFraming>().is_some();
        drop(extensions);
        // Until it is read, an HTTP/1 body keeps the connection from carrying another
        // request (HTTP/2 ends a stream on its own).
        record.set_body_unread(
            version < http::Version::HTTP_2
                && (content_length(&headers).is_some_and(|n| n > 0)
                    || headers.contains_key(header::TRANSFER_ENCODING)),
        );
        async move {
            // hyper holds HTTP/1 heads to this limit as it parses them; its HTTP/2 server
            // bounds only the bytes of the header list, so HTTP/2 requests are counted here
            // (`len` counts every field, repeated names included, as hyper's limit does).
            // But an HTTP/2 cookie may come as one field per crumb (RFC 9113 8.2.3), which are
            // one field to the upstream (`join_cookies`): counted so, they were 150 fields for
            // one cookie (audit KC 4). Their bytes still count, below.
            let limit = self.config.server.max_headers;
            let crumbs = match version {
                http::Version::HTTP_2 => headers.get_all(header::COOKIE).iter().count(),
                _ => 0,
            };
            let count = headers.len() - crumbs.saturating_sub(1);
            if count > limit {
                return Err(GatewayError::TooManyHeaders { count, limit });
            }
            // Its bytes too: the h2 crate's own bound, which answers a bare 431 that no log or
            // metric sees, is set above this one (`server::listen`).
            if version == http::Version::HTTP_2 {
                let limit = self.config.server.max_header_bytes;
                let bytes = header_list_size(&method, &uri, &headers);
                if bytes > limit {
                    return Err(GatewayError::HeadTooLarge { bytes, limit });
                }
            }
            // The methods of these APIs, which `Allow` names. CONNECT's authority-form target
            // has no path to route (said in words rather than "no route for path \"\""); a
            // TRACE would be echoed back by an upstream that answers it, with the provider
            // key the gateway added (RFC 9110 9.3.8); other methods no provider serves.
            if !matches!(
                method,
                Method::POST
                    | Method::GET
                    | Method::HEAD
                    | Method::PUT
                    | Method::PATCH
                    | Method::DELETE
                    | Method::OPTIONS
            ) {
                return Err(GatewayError::MethodNotAllowed {
                    method: method.to_string(),
                });
            }
            // RFC 9112 3.2: an authority-form target (`host:port`) is CONNECT's alone, and
            // the asterisk-form OPTIONS's (answered before this). Neither names a path.
            if !uri.path().starts_with('/') {
                return Err(GatewayError::BadRequest {
                    message: format!(
                        "request target {uri:?} is no path: a request names the path it asks \
                         for, such as /v1/chat/completions (RFC 9112 3.2)"
                    ),
                });
            }
            check_framing(version, &headers, both_lengths)?;
            // An HTTP/2 `:authority`, or an HTTP/1.1 absolute-form target, with userinfo:
            // RFC 9113 8.3.1 forbids the one, and RFC 9110 4.2.4 has a recipient treat the
            // other, from an untrusted source, as an error. Routed by its path alone, the
            // HTTP/1.1 one was forwarded where HTTP/2 refused it (audit SA 5).
            if let Some(authority) = uri.authority().filter(|a| a.as_str().contains('@')) {
                // Named by its host alone: userinfo is a credential, never logged.
                let (what, rule) = if version == http::Version::HTTP_2 {
                    (":authority", "an HTTP/2 request must not (RFC 9113 8.3.1)")
                } else {
                    ("the request target", "a request must not (RFC 9110 4.2.4)")
                };
                return Err(GatewayError::BadRequest {
                    message: format!(
                        "{what} for {:?} carries userinfo, which {rule}",
                        authority.host()
                    ),
                });
            }
            // The gateway serves http and https; an absolute-form `ftp://` target was served
            // as if it were either.
            if let Some(scheme) = uri
                .scheme()
                .filter(|s| **s != Scheme::HTTP && **s != Scheme::HTTPS)
            {
                return Err(GatewayError::BadRequest {
                    message: format!(
                        "request target scheme {:?} is neither http nor https, the schemes this \
                         gateway serves (RFC 9110 4.2)",
                        scheme.as_str()
                    ),
                });
            }
            if version == http::Version::HTTP_2 {
                if let Some((host, authority)) = host_not_authority(&uri, &headers) {
                    return Err(GatewayError::BadRequest {
                        message: format!(
                            "Host {host:?} names another server than :authority \
                             {authority:?}: an HTTP/2 request names one (RFC 9113 8.3.1)"
                        ),
                    });
                }
            }
            // Before routing: the prefix the route matched must be the path the upstream
            // serves.
            if has_dot_segment(uri.path()) {
                return Err(GatewayError::DotSegment {
                    path: uri.path().to_owned(),
                });
            }
            let forwarded = normalized(uri.path());
            let routed = for_routing(&forwarded);
            let path: &str = &routed;
            // Walked again where needed rather than collected: a prefix test per route costs
            // less than the vector's allocation.
            let candidates = || self.candidates(path);
            let (Some(first), Some(tentative)) = (candidates().next(), self.attributed(path))
            else {
                return Err(GatewayError::NoRoute {
                    path: uri.path().to_owned(),
                    model: None,
                    by_model: false,
                });
            };
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
            // The client, as the route the request is attributed to knows it: a request that
            // fails before its body picks the route (a bad budget header, a body too large) is
            // still its client's, in the log and in `hourglass_client_requests_total`.
            let early = tentative.keys.as_ref().map(|k| k.identify(&headers));
            if let Some(Some(client)) = &early {
                record.set_client_id(Some(client.clone()));
            }
            // Before anything is read or parsed: a request that no candidate route would accept
            // is refused now (the chosen route checks again once the body names the model).
            if matches!(early, Some(None)) && candidates().all(|r| r.refuses(&headers)) {
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
            let server_body_limit = self.config.server.max_request_body;

            // Until the body names the model, the widest budget among the candidates bounds the
            // body read; the chosen route's own budget is then resolved from the same arrival.
            // (In a block of its own so that it is not kept in the future past the read.)
            // The body holds its share of `request_body_memory` for as long as it lives: the
            // template keeps it for every attempt that may resend it (audit PC 1).
            let body = {
                let provisional = candidates()
                    .map(|r| asked.resolve(&r.route.limits, arrival))
                    // By what the upstream could use, not the deadline: candidates share a
                    // client's deadline, and one's reserve must not cut another's body read.
                    .max_by_key(|b| b.work_deadline())
                    .expect("candidates is not empty");
                record.set_budget(&provisional);
                // The widest budget may belong to a route that wants more of it (its reserve
                // and min_useful) than another candidate: refused now only when no candidate
                // could use what is left, in the words of the route the request is logged as.
                let now = Instant::now();
                if provisional.ensure_useful(now).is_err()
                    && !candidates().any(|r| {
                        asked
                            .resolve(&r.route.limits, arrival)
                            .ensure_useful(now)
                            .is_ok()
                    })
                {
                    let budget = asked.resolve(&tentative.route.limits, arrival);
                    record.set_budget(&budget);
                    budget.ensure_useful(now)?;
                }
                // As the budget: the largest body any candidate takes, until the body names
                // the model that picks one.
                let limit = candidates()
                    .map(|r| body_limit(r, server_body_limit))
                    .max_by_key(|l| l.bytes)
                    .expect("candidates is not empty");
                let length = content_length(&headers);
                if length.is_some_and(|len| len > limit.bytes) {
                    return Err(limit.too_large(length));
                }
                let quiet = self.config.server.header_read_timeout;
                let h2 = version == http::Version::HTTP_2;
                let read =
                    read_body(body, limit, length, h2, &self.bodies, quiet, &provisional).await?;
                record.set_body_unread(false);
                read
            };
            let body_read = Instant::now();

            // The model picks the route where routes filter on it, and the upstream's estimate
            // of its first token on every route. (A body in a content coding is no JSON: none.)
            let Head {
                model,
                choices,
                background,
                unreadable,
            } = head_of(&body)?;
            record.set_background(background);
            // A body in a content coding is read by no one here (and may open with a NUL).
            let unreadable = unreadable
                .or_else(|| {
                    content_type_fault(&headers)
                        .filter(|_| !body.is_empty())
                        .map(Unreadable)
                })
                .filter(|_| !encoded);
            if let Some(unreadable) = &unreadable {
                if first.route.needs_model() {
                    return Err(unreadable.clone().into());
                }
            }
            let route = if first.route.needs_model() {
                let Some(route) = candidates().find(|r| r.route.matches(path, model.as_deref()))
                else {
                    record.unroute(self.no_route.clone());
                    // The log says which model no route serves.
                    record.set_model(model.as_deref().map(Arc::from));
                    return Err(GatewayError::NoRoute {
                        path: uri.path().to_owned(),
                        model: model.as_deref().map(str::to_owned),
                        by_model: true,
                    });
                };
                route
            } else {
                first
            };
            let model: Option<Arc<str>> = model.as_deref().map(Arc::from);
            record.set_route(route.name.clone(), route.metrics.clone());
            record.set_model(model.clone());
            let client = match (&route.keys, early) {
                (Some(_), Some(Some(client))) if std::ptr::eq(route, tentative) => Some(client),
                (Some(keys), _) => keys.identify(&headers),
                (None, _) => None,
            };
            // Set either way: a route the model picked knows the client, or not, by its own keys.
            let refused = route.keys.is_some() && client.is_none();
            let client_key = client.as_ref().map(|c| c.key);
            record.set_client_id(client);
            if refused {
                return Err(GatewayError::Unauthorized);
            }
            // Read within the largest limit among the candidates: the route the model chose
            // may take less.
            let own = body_limit(route, server_body_limit);
            if body.len() as u64 > own.bytes {
                return Err(own.too_large(content_length(&headers)));
            }
            if encoded
                && route
                    .chain
                    .iter()
                    .any(|e| e.upstream.config.model.is_some())
            {
                return Err(unsupported_encoding(&headers));
            }
            // Where the gateway rewrites the model or reads the answer as the API's, the
            // provider must read the body as the gateway did.
            if let Some(unreadable) = unreadable {
                if route.chain.iter().any(|e| {
                    e.upstream.config.model.is_some()
                        || Format::detect(e.upstream.config.api, path).is_some()
                }) {
                    return Err(unreadable.into());
                }
            }
            record.set_request_bytes(body.len());
            // A body in a content coding is read by no one here.
            let readable = (!encoded).then_some(&body[..]);
            let detached = detached(&method, &forwarded, uri.query(), readable)?;
            if detached.is_some_and(Detached::runs_on) {
                record.set_detached();
            }
            let mut budget = asked.resolve(&route.route.limits, arrival);
            budget.body_read(body_read);
            record.set_budget(&budget);
            budget.ensure_useful(Instant::now()).map_err(|e| {
                // The chosen route's deadline passed before the body's last byte came (the
                // body was read within another candidate's), or what was left after it is
                // too little: its upload spent it.
                if budget.work_deadline() <= body_read || budget.spent_uploading(budget.min_useful)
                {
                    let len = body.len() as u64;
                    e.spent_uploading(Uploading {
                        received: len,
                        length: Some(len),
                    })
                } else {
                    e
                }
            })?;
            // After the call's own budget is checked, so that a call refused for it is not
            // counted against its run.
            match run::join(
                &self.runs,
                route,
                client_key,
                &headers,
                uri.path(),
                &body,
                &mut budget,
            )
            .await
            {
                Ok(InRun::Call(run)) => {
                    record.set_budget(&budget);
                    record.join_run(run);
                }
                Ok(InRun::Unenforced(id)) => record.unenforced_run(id),
                Ok(InRun::No) => {}
                Err(not) => {
                    if let Some(id) = not.run {
                        record.named_run(id, not.view);
                    }
                    return Err(not.error);
                }
            }

            if route.keys.is_some() {
                // The client's key is this gateway's, never the upstream's.
                strip_client_credentials(&mut headers);
            }
            strip_hop_by_hop(&mut headers);
            // The path and method routed are the ones the upstream serves.
            strip_rewrites(&mut headers);
            if method == Method::OPTIONS {
                decrement_max_forwards(&mut headers);
            }
            // One `Cookie` field toward the upstream (RFC 6265 5.4; RFC 9110 5.3: its values
            // are no list to join with commas): HTTP/2 crumbs, and the lines of an HTTP/1.1
            // client that sent several, of which a framework that reads one field
            // (Starlette's `headers.get("cookie")`) saw the first alone (audit WA 5).
            join_cookies(&mut headers);
            let [ms, grpc, envoy, run_ms] = names::INBOUND;
            let dropped = [
                ms,
                grpc,
                envoy,
                run_ms,
                &header::HOST,
                &header::CONTENT_LENGTH,
                &header::EXPECT,
            ];
            for (name, _) in dropped
                .iter()
                .zip(present(&headers, dropped))
                .filter(|(_, p)| *p)
            {
                headers.remove(*name);
            }
            // A gateway names itself in every request it forwards, after any intermediary
            // before it (RFC 9110 7.6.3).
            headers.append(header::VIA, via(version));
            // And counts itself where a peer that drops `Via` still passes it on (replacing
            // what came, which `hops` has read).
            headers.insert(HOURGLASS_HOPS.clone(), HeaderValue::from(hops + 1));
            // An answer in a known format is read as it passes (tokens, usage, errors), and an
            // encoded one cannot be. Clients ask for `gzip` by default (httpx, undici): against
            // a compressing upstream, a stream would look silent to the first-token limit and
            // an error event would corrupt it. Set here once rather than per attempt, where the
            // insert would grow every attempt's copy of the headers.
            let accept_encoding = client_accept_encoding(&headers);
            headers.insert(header::ACCEPT_ENCODING, IDENTITY);
            insert_request_id(&mut headers, id);
            let generates = may_generate(&method, &forwarded, background);
            let template = Template {
                method,
                path_and_query: match forwarded {
                    Cow::Borrowed(_) => uri
                        .path_and_query()
                        .cloned()
                        .unwrap_or_else(|| PathAndQuery::from_static("/")),
                    Cow::Owned(path) => {
                        let whole = match uri.query() {
                            Some(q) => format!("{path}?{q}"),
                            None => path,
                        };
                        PathAndQuery::try_from(whole).map_err(|e| GatewayError::BadRequest {
                            message: format!("request target cannot be forwarded: {e}"),
                        })?
                    }
                },
                headers,
                accept_encoding,
                body,
                bodies: self.bodies.clone(),
                stream_upstream: route.route.stream_upstream,
                partial_answers: route.route.partial_answers,
                model,
                choices,
                detached,
                generates,
            };
            if let Some(admission) = &route.admission {
                let slot = admission
                    .admit(
                        &budget,
                        || route.least_need(&template, budget.min_useful),
                        crate::upstream::estimate::rose(),
                    )
                    .await?;
                record.hold(slot);
                // The wait for the slot spent the budget (and the client's patience).
                budget.ensure_useful(Instant::now())?;
            }
            let answers = &self.answers;
            crate::gateway::retry::run(&self.metrics, route, &template, &budget, record, answers)
                .await
        }
    }
}

/// The whole body, at most `limit` bytes, read before the budget's work deadline, holding
/// its share of the bodies' memory as its bytes arrive (never for a declared `length` before
/// they do: audit SA 1, bodies announced and never sent held the whole memory), and, once
/// read, until the last clone of the bytes is dropped. The template keeps them for
/// every attempt (a retry or a fallback resends them) until the request's upstream call is
/// done: given back at admission, they stayed in memory, counted by nothing (audit PC 1: 50
/// uploads of 9 MiB held by a slow provider took 483 MB against a pool of 256 MiB). A hold
/// never waits for room, so a request cannot wait for bytes that it holds itself. A body that
/// falls silent for `quiet` (`header_read_timeout`) is cut as a stalled head is: otherwise it
/// held its connection and its memory for the whole budget.
async fn read_body<B>(
    body: B,
    limit: BodyLimit<'_>,
    length: Option<u64>,
    h2: bool,
    memory: &BodyMemory,
    quiet: Duration,
    budget: &Budget,
) -> Result<Bytes, GatewayError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut hold = memory.hold();
    // The hold grows with the bytes received, a little ahead of them, up to this (the `Content-
    // Length` was checked against the limit before any byte was read).
    let most = length.unwrap_or(limit.bytes);
    let mut body = std::pin::pin!(Limited::new(
        body,
        usize::try_from(limit.bytes).unwrap_or(usize::MAX)
    ));
    // Most bodies come in one frame: that one is kept as it came, without a copy.
    let mut first: Option<Bytes> = None;
    // The others are gathered here, with room for what the hold covers and no more: what
    // the body takes in memory is what it holds.
    let mut more: Vec<u8> = Vec::new();
    let mut total = 0u64;
    // One timer for the whole body: the silence it may keep, moved on by each frame, and
    // never past the budget's deadline.
    let deadline = budget.work_deadline();
    let due = || (Instant::now() + quiet).min(deadline);
    let timer = tokio::time::sleep_until(due());
    tokio::pin!(timer);
    loop {
        let frame = tokio::select! {
            // A frame that is there wins over the timer, as it does over every limit.
            biased;
            frame = body.frame() => frame,
            () = &mut timer => {
                return Err(if Instant::now() >= deadline {
                    budget.deadline_error().spent_uploading(Uploading {
                        received: total,
                        length,
                    })
                } else {
                    GatewayError::BodyTimeout { after: quiet }
                });
            }
        };
        let Some(frame) = frame else { break };
        timer.as_mut().reset(due());
        // A trailers frame is dropped: the body goes upstream whole, with a length and no
        // trailer section (RFC 9112 7.1.2; documented in lifecycle.md, audit WA 1).
        let Ok(data) = frame.map_err(|e| body_error(e, limit))?.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        total += data.len() as u64;
        // Refused here, the body is not read further: 503 `overloaded`.
        hold.grow(total, most)?;
        match &first {
            None => first = Some(data),
            Some(f) => {
                // `held >= total`: room to the hold at once, so that `extend_from_slice`
                // never grows the buffer past it (a no-op until the hold grows again).
                let room = usize::try_from(hold.held()).unwrap_or(usize::MAX);
                more.reserve_exact(room.saturating_sub(more.len()));
                if more.is_empty() {
                    more.extend_from_slice(f);
                }
                more.extend_from_slice(&data);
            }
        }
    }
    // hyper ends an HTTP/2 body at the client's RST_STREAM(NO_ERROR) as at its END_STREAM
    // (RFC 9113 8.1 lets a server so stop an upload it has answered; a client's reset
    // cancels its request): a body cut so went upstream as whole, with the length of what
    // came (audit ZA 1: 5,000 of a declared 100,000 bytes, answered 200). Short of its
    // `Content-Length` it is cut. Without one, the reset is already on the stream: one
    // yield lets hyper's stream task see it and drop this request before it is sent.
    if length.is_some_and(|len| total < len) {
        return Err(GatewayError::ClientClosed);
    }
    if h2 && length.is_none() {
        tokio::task::yield_now().await;
    }
    let whole = if more.is_empty() {
        first.unwrap_or_default()
    } else {
        // A body that ended short of the room it grew (no `Content-Length`) gives back the
        // rest, so that it holds what it is (a rewritten copy is judged against that).
        if hold.held() > total {
            more.shrink_to_fit();
            hold.shrink_to(total);
        }
        Bytes::from(more)
    };
    Ok(hold.keep_with(whole))
}

/// The largest body a request may send, and whose setting that is: the route's own
/// `max_request_body` (audit PC 3: Files and audio uploads, far above a chat body, got 413
/// under one listener-wide limit), else `[server] max_request_body`.
#[derive(Clone, Copy)]
struct BodyLimit<'a> {
    bytes: u64,
    /// The route whose own limit it is.
    route: Option<&'a str>,
}

impl BodyLimit<'_> {
    fn too_large(self, sent: Option<u64>) -> GatewayError {
        GatewayError::BodyTooLarge {
            limit: self.bytes,
            sent,
            route: self.route.map(str::to_owned),
        }
    }
}

fn body_limit(r: &RouteRuntime, server: u64) -> BodyLimit<'_> {
    match r.route.max_request_body {
        Some(bytes) => BodyLimit {
            bytes,
            route: Some(&r.route.name),
        },
        None => BodyLimit {
            bytes: server,
            route: None,
        },
    }
}

/// What a body that could not be read is to the client: too large, its own cancel, or
/// malformed.
fn body_error(e: BoxError, limit: BodyLimit<'_>) -> GatewayError {
    if e.downcast_ref::<http_body_util::LengthLimitError>()
        .is_some()
    {
        // Past the limit only without a Content-Length: one over it is refused before reading.
        limit.too_large(None)
    } else if client_left(&*e) {
        GatewayError::ClientClosed
    } else {
        GatewayError::BadRequest {
            message: format!("request body could not be read: {e}"),
        }
    }
}

/// Whether a request body failed because the client went away rather than because it was
/// malformed: hyper ends an HTTP/1 body cut short (by a length or chunks never completed)
/// with an `UnexpectedEof`, or the socket's own reset, and an HTTP/2 one with the client's
/// `RST_STREAM` or `GOAWAY`, or h2's own reset of a stream that broke its framing.
fn client_left(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
            ) {
                return true;
            }
        }
        if let Some(h2) = c.downcast_ref::<h2::Error>() {
            // Reset by the gateway's own HTTP/2 layer (`is_library`: DATA past the
            // content-length, or short of it): the stream is gone and no answer can reach
            // the client, which got the reset; logged as the client's other resets are.
            if ((h2.is_remote() || h2.is_library()) && (h2.is_reset() || h2.is_go_away()))
                || h2.is_io()
            {
                return true;
            }
        }
        if let Some(h) = c.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() {
                return true;
            }
        }
        cause = c.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Bodies;
    use crate::budget::BudgetRequest;
    use crate::config::Limits;
    use http_body_util::{BodyExt, Full};

    /// Audit ZA 1: a body that ends short of its `Content-Length` without an error (hyper's
    /// reading of an HTTP/2 client's `RST_STREAM(NO_ERROR)`) is the client's cancel, never a
    /// whole body; one that ends at its length is whole.
    #[tokio::test]
    async fn a_body_that_ends_short_of_its_length_is_cut() {
        let limits = Limits {
            budget: Duration::from_secs(10),
            max_budget: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(1),
            first_token_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            reserve: Duration::ZERO,
            min_useful: Duration::from_millis(100),
        };
        let budget = BudgetRequest::default().resolve(&limits, Instant::now());
        let memory = BodyMemory::new(Bodies::Requests, 1 << 20);
        let limit = BodyLimit {
            bytes: 1 << 20,
            route: None,
        };
        let quiet = Duration::from_secs(5);
        let body = || {
            Full::new(Bytes::from_static(b"{\"model\":\"m\"}"))
                .map_err(|e| -> BoxError { match e {} })
        };
        for h2 in [false, true] {
            let cut = read_body(body(), limit, Some(100), h2, &memory, quiet, &budget).await;
            assert!(matches!(cut, Err(GatewayError::ClientClosed)), "{cut:?}");
            let whole = read_body(body(), limit, Some(13), h2, &memory, quiet, &budget).await;
            assert_eq!(&whole.unwrap()[..], b"{\"model\":\"m\"}");
        }
    }
}
