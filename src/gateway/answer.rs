//! The answer a client gets: the upstream's head made into ours (hop-by-hop headers out, SSE
//! told not to be buffered, the request id) and its body wrapped by the reaper and the
//! watchdog; or, when no head came, the contracted JSON error. HTTP/1.0 clients get JSON
//! documents with a length.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full};
use tokio::time::Instant;

use crate::admission::BodyHold;
use crate::error::{BoxError, GatewayError, FORWARDED_METHODS};
use crate::gateway::assembled::assembled;
use crate::gateway::body::{
    document, error_answer, no_retry_after_retries, ProxyBody, WatchedBody,
};
use crate::gateway::record::RequestRecord;
use crate::gateway::routes::Gateway;
use crate::http::conn::ClientConn;
use crate::http::headers::{
    answer_request_id, answers_without_content, insert_request_id, keep_reason_phrase, request_id,
    strip_hop_by_hop, uncached_event_stream,
};
use crate::http::hops::max_forwards;
use crate::http::path::{for_routing, has_dot_segment, normalized};
use crate::provider::batches::{anthropic_path, base_relative, localize_results_urls};
use crate::provider::inspect::{gemini, ndjson, Inspector};
use crate::runs::call::insert_headers as insert_run_headers;
use crate::stream::progress::Progress;
use crate::stream::WatchdogBody;
use crate::upstream::Upstream;

impl Gateway {
    /// Serves one client request. Never fails: every failure becomes the contracted answer.
    /// (Not an `async fn`, for the reason given at `forward`; what needs no waiting is done
    /// before the future is made.)
    pub fn handle<B>(
        self: Arc<Self>,
        req: Request<B>,
        client: Option<ClientConn<'_>>,
    ) -> impl Future<Output = Response<ProxyBody>>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let arrival = Instant::now();
        let id = request_id(req.headers());
        // The path alone: a query string may carry a key (`?key=` is how Gemini takes one).
        // A target with no path (`host:443`, refused) is logged as it was sent, as nginx does.
        let path = match req.uri().path() {
            "" => req.uri().to_string(),
            path => path.to_owned(),
        };
        let mut record = RequestRecord::new(
            id.clone(),
            req.method().clone(),
            path,
            arrival,
            self.no_route.clone(),
        );
        // Attributed now, not when the future first runs: a client that leaves right after
        // its head may have the future dropped unpolled, and was counted as route="none"
        // (audit O: 16 of 20). A path with a dot segment is refused before routing.
        if !has_dot_segment(req.uri().path()) {
            if let Some(r) = self.attributed(&for_routing(&normalized(req.uri().path()))) {
                record.set_route(r.name.clone(), r.metrics.clone());
            }
        }
        // Over HTTP/2 the stream counts as open until the record goes with the answer.
        record.hold_stream(client.and_then(|c| c.streams).map(|s| s.open()));
        record.set_client(client.map(|c| c.peer), req.headers(), req.version());
        record.set_writes(client.and_then(|c| c.writes).cloned());
        record.set_client_cert(client.and_then(|c| c.certificate).cloned());
        // HTTP/1.0 has no chunked coding, and a HEAD answer no body.
        let head = req.method() == Method::HEAD;
        let close_delimited = req.version() == Version::HTTP_10 && !head;
        // RFC 9110 7.6.2: an OPTIONS with no hops left is the gateway's to answer, with what
        // it forwards. (TRACE, the other method that reads the header, is refused.) So is
        // `OPTIONS *` (9.3.7), which asks about the server itself, not a resource upstream.
        let final_recipient = req.method() == Method::OPTIONS
            && (max_forwards(req.headers()) == Some(0) || req.uri().path() == "*");
        // A stream of Gemini's native API: read for its error event, and ended at a cut with
        // one in its shape, which its clients read (WB 6, break audit YB 1).
        let gemini_stream = gemini::streams(req.uri().path());
        // An NDJSON answer that ends at its `"done": true` line (Ollama's calls).
        let ends_at_done = ndjson::ends_at_done(req.uri().path());
        async move {
            if final_recipient {
                record.set_status(200);
                record.complete();
                let mut resp = Response::new(Either::Left(Full::new(Bytes::new())));
                resp.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static(FORWARDED_METHODS));
                resp.headers_mut()
                    .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
                insert_request_id(resp.headers_mut(), &id);
                return resp;
            }
            // A request still waiting for its head when the shutdown grace ends is answered too.
            let forwarded = tokio::select! {
                r = self.forward(req, arrival, &id, &mut record) => r,
                () = self.shutdown.fired() => Err(GatewayError::Shutdown),
            };
            match forwarded {
                Ok(started) => {
                    let (mut parts, body) = started.response.into_parts();
                    let shape = started.shape;
                    // What the operator hides is the client's view only (audit VB 2).
                    started.served_by.hide_headers(&mut parts.headers);
                    strip_hop_by_hop(&mut parts.headers);
                    // The upstream's alternative services are its origin's, not the gateway's:
                    // OpenAI's `alt-svc: h3=":443"` sent on would tell the client that the
                    // gateway serves HTTP/3 on port 443 (RFC 7838 2: it is about the origin
                    // that sent it).
                    parts.headers.remove(header::ALT_SVC);
                    keep_reason_phrase(parts.status, &mut parts.extensions);
                    // The version on the status line is the gateway's, not the upstream's
                    // (RFC 9110 6.2). hyper writes the one it is given to HTTP/1.1 clients:
                    // an HTTP/1.0 upstream's made it end a body without a length with the
                    // connection, where an abort looks like the end. With 1.1 it chunks such
                    // a body; to HTTP/1.0 clients it answers in 1.0 whatever it is given,
                    // and HTTP/2 has no status line.
                    parts.version = Version::HTTP_11;
                    let no_content = answers_without_content(parts.status);
                    // A 204 (or 1xx) never carries a length (RFC 9110 8.6), and a 205's content
                    // is none whatever its length said; a 304's, if the upstream sent one, is
                    // the 200's and stays.
                    if no_content && parts.status != StatusCode::NOT_MODIFIED {
                        parts.headers.remove(header::CONTENT_LENGTH);
                    }
                    // Asked to stream for a client that did not: answered with the document.
                    let assemble = started.assembled
                        && shape.readable_sse()
                        && parts.status.is_success()
                        && started.format.is_some();
                    // Asked to stream for a client that did not, the upstream answered with
                    // neither a stream the gateway can read nor a JSON document: the client
                    // would get bytes it never asked for (an event stream, or gzip), not the
                    // document it waits for.
                    if started.assembled
                        && started.format.is_some()
                        && parts.status.is_success()
                        && !no_content
                        && !assemble
                        && !(shape.json && shape.readable)
                    {
                        let what = match parts.headers.get(header::CONTENT_ENCODING) {
                            Some(coding) if !shape.readable => {
                                format!("in content-encoding {coding:?}")
                            }
                            _ => match parts.headers.get(header::CONTENT_TYPE) {
                                Some(t) => format!("of type {t:?}"),
                                None => "with no content-type".to_owned(),
                            },
                        };
                        let e = GatewayError::UpstreamError {
                            upstream: started.limits.upstream.to_string(),
                            reason: format!(
                                "asked to stream for a client that did not, it answered {what}: \
                                 no event stream the gateway can read into the one document"
                            ),
                        };
                        // The body goes unread: the upstream call ends here.
                        drop(body);
                        record.fail(&e);
                        return error_answer(&e, &mut record, &id);
                    }
                    // A non-2xx answer is the provider's, passed through unchanged (DESIGN
                    // 6): not an answer that can end short, and no place for an event of the
                    // gateway's. Its body is read as opaque bytes; only the limits apply.
                    // A HEAD answer's body is never sent (nor polled by hyper): no event can
                    // be added to it, and it is whole with its head.
                    let readable_sse = shape.readable_sse() && parts.status.is_success() && !head;
                    // A 2xx NDJSON stream (Ollama's) may gain an error line at a cut.
                    let lines = shape.ndjson
                        && shape.readable
                        && parts.status.is_success()
                        && !(head || no_content);
                    if lines {
                        parts.headers.remove(header::CONTENT_LENGTH);
                    }
                    if shape.event_stream && !assemble {
                        if readable_sse {
                            // The body may gain an error event: its length is not the upstream's.
                            parts.headers.remove(header::CONTENT_LENGTH);
                        }
                        uncached_event_stream(&mut parts.headers);
                        parts.headers.insert(
                            HeaderName::from_static("x-accel-buffering"),
                            HeaderValue::from_static("no"),
                        );
                    }
                    answer_request_id(&mut parts.headers, &id);
                    no_retry_after_retries(&mut parts.headers, parts.status, &record);
                    // A JSON answer in a known format is one document (these APIs stream as
                    // SSE), which arrives at once when it is ready: a 2xx one is read whole
                    // before its head goes (see `with_length`), unless it opens as an array. A provider's error answer
                    // passes through as it comes (DESIGN 6), its head at once.
                    let document = started.format.is_some()
                        && !shape.event_stream
                        && shape.readable
                        && shape.json;
                    // A batch's JSON names its results by the upstream's URL, which the
                    // SDK fetches as it is: read whole (up to `max_response_body`) to make
                    // it the gateway's.
                    let rewritten = started.results_urls.filter(|_| {
                        shape.json
                            && shape.readable
                            && !shape.event_stream
                            && parts.status.is_success()
                    });
                    // A HEAD's length is the one its GET would answer (RFC 9110 9.3.2), and
                    // the GET's rewritten document has a length of its own, which only its
                    // body would tell: the upstream's would misstate it, so none is said
                    // (audit PC 6).
                    if head && rewritten.is_some() {
                        parts.headers.remove(header::CONTENT_LENGTH);
                    }
                    let relocate = rewritten.filter(|_| !head);
                    let held =
                        (document && !head && parts.status.is_success()) || relocate.is_some();
                    // (An answer without content goes out by `without_content`, below.)
                    let read_first = !no_content
                        && (held
                            || (close_delimited
                                && document
                                && !parts.headers.contains_key(header::CONTENT_LENGTH)));
                    // What the run has left, with this call's use when it is known before the
                    // head: a document read first says it once read (`with_length`); an
                    // answer that is no success is charged no tokens (`RequestRecord::report`).
                    // Any other's reservation stands until its end (audit IA 3: a document's
                    // head said the whole reservation was held).
                    if !read_first {
                        let view = if parts.status.is_success() {
                            record.run_view()
                        } else {
                            record.run_view_after(None, false)
                        };
                        if let Some(view) = view {
                            insert_run_headers(&mut parts.headers, &view, Instant::now());
                        }
                    }
                    // An assembled answer's status is the document's (or its error's), and a
                    // held one's is the answer's once it goes: noted then, as a client that
                    // leaves before then got none.
                    if !(assemble || held) {
                        record.set_status(parts.status.as_u16());
                    }
                    // A successful answer in a known format is read as it passes: SSE for its
                    // tokens, usage and errors, JSON for its usage. One without content (a
                    // HEAD's, a 204's) has no answer to read, nor one that could end short.
                    let inspector = started
                        .format
                        .filter(|_| {
                            shape.readable
                                && parts.status.is_success()
                                && !(no_content || head)
                                && (shape.event_stream || shape.json)
                        })
                        .map(|format| {
                            let mut inspector = Inspector::new(format, shape.readable_sse())
                                .with_choices(started.choices);
                            if record.wants_tool_calls() {
                                inspector = inspector.with_tool_calls();
                            }
                            if started.hide_usage && !assemble {
                                inspector = inspector.hiding_usage();
                            }
                            if started.usage_only {
                                inspector = inspector.reading_usage_only();
                            }
                            if assemble {
                                let limit = self.config.server.max_response_body;
                                inspector = inspector
                                    .with_assembler(usize::try_from(limit).unwrap_or(usize::MAX));
                            }
                            inspector
                        });
                    // Past the deadline, or once the client has taken nothing for
                    // `send_timeout`, the upstream goes even if nobody polls the stream.
                    // Over HTTP/2, a stream so ended counts on its connection until hyper polls
                    // it again (`server::h2_stuck`).
                    let writes = record.connection_writes().cloned();
                    let body = self.reaper.guard(
                        body,
                        record.take_slot(),
                        started.limits.deadline,
                        writes,
                        record.connection_streams(),
                    );
                    let reaped = body.reaped_by();
                    let progress = Progress::new(readable_sse, inspector)
                        .gemini_errors(gemini_stream)
                        .ndjson(lines && ends_at_done);
                    let mut limits = started.limits;
                    // A stream is cut when its run's tokens run out; a JSON document has
                    // arrived, paid for, by the time its usage is read: it is delivered, and
                    // what it used counts against the run.
                    if shape.event_stream {
                        limits.run_tokens = record.run_tokens().map(Box::new);
                    }
                    let mut body = Box::new(WatchdogBody::reading(body, progress, limits, record));
                    // Over HTTP/2, h2 holds what the client's window does not take yet: the
                    // answer is over once h2 took its end, not once it was handed over.
                    if body.observer_mut().over_http2() {
                        body.confirm_delivery();
                    }
                    body.watch_shutdown(&self.shutdown);
                    body.watch_reaper(reaped);
                    if lines {
                        body.ndjson_lines();
                    }
                    // All boxed: they hold the body and more across their awaits, and inline
                    // they would size every request's future (moved whole a few times per
                    // request) for these rare answers.
                    if no_content || head {
                        body.no_content();
                        body.observer_mut().read_whole(true);
                        return Box::pin(without_content(parts, body, &id)).await;
                    }
                    // Held before its head goes, the answer takes its bytes from the memory
                    // answers share as it grows (`response_body_memory`).
                    if assemble {
                        body.fail_on_cut();
                        body.observer_mut().read_whole(true);
                        let partial = started.partial_answers;
                        let hold = self.answers.hold();
                        return Box::pin(assembled(parts, body, partial, &id, hold)).await;
                    }
                    if read_first {
                        body.observer_mut().read_whole(true);
                        let cap = match relocate {
                            Some(_) => usize::try_from(self.config.server.max_response_body)
                                .unwrap_or(usize::MAX),
                            None => LENGTH_CAP,
                        };
                        let hold = self.answers.hold();
                        let read = with_length(parts, body, &id, cap, relocate, hold);
                        return Box::pin(read).await.unwrap_or_else(|(mut parts, body)| {
                            as_it_comes(&mut parts, &body, close_delimited);
                            Response::from_parts(parts, Either::Right(body))
                        });
                    }
                    as_it_comes(&mut parts, &body, close_delimited);
                    Response::from_parts(parts, Either::Right(body))
                }
                // The client left while sending: counted as its cancel, with no status or
                // bytes. One that only half-closed may still read this, and learns what
                // every answer says, and that the connection ends.
                Err(e @ GatewayError::ClientClosed) => {
                    record.fail(&e);
                    let mut resp = e.response().map(|b| Either::Left(Full::new(b)));
                    insert_request_id(resp.headers_mut(), &id);
                    resp.headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                    resp
                }
                Err(e) => {
                    record.fail(&e);
                    error_answer(&e, &mut record, &id)
                }
            }
        }
    }
}

/// Readies the head of an answer whose body goes out as it comes. Only the connection's
/// close ends a body without a length for an HTTP/1.0 client (no chunked coding), so its head
/// must not promise keep-alive (RFC 9112 C.2.2). hyper judges from the answer's own version:
/// left at 1.1, it added `connection: keep-alive` for a client that asked for it, then
/// closed. At 1.0 and with `close`, it ends the connection.
fn as_it_comes(parts: &mut http::response::Parts, body: &WatchedBody, close_delimited: bool) {
    if close_delimited
        && !parts.headers.contains_key(header::CONTENT_LENGTH)
        && body.size_hint().exact().is_none()
    {
        parts.version = Version::HTTP_10;
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
}

/// A document is read whole before it is sent, up to this many bytes.
pub const LENGTH_CAP: usize = crate::config::DOCUMENT_READ_WHOLE as usize;

/// The answer for a JSON document in a known format: a 2xx one, or any to an HTTP/1.0 client
/// without a length of its own. It is read whole, with every limit still running, and sent
/// with its length; a limit or failure meanwhile becomes the JSON error answer instead. A
/// document comes at once when it is ready, so this costs it next to nothing; sent as it
/// came, a body that failed early reached the client with no status at all (hyper writes a
/// head with the body's first bytes and, polling on, the abort took both), and to HTTP/1.0,
/// which has no chunked coding, the abort that tells a failure looked like the end. One
/// longer than `LENGTH_CAP` goes out as it comes from there, an abort telling its failure.
/// Anything else (SSE, NDJSON, audio) is never held back: it streams as it comes. So does a
/// JSON array, told by its first byte that is not JSON whitespace: no call of these APIs
/// answers with one, and an upstream whose `api` is named gives every path a format, so
/// Gemini's `:streamGenerateContent` without `alt=sse` (an array whose elements come as
/// they are generated) was held whole, and a limit that cut it lost what had come (audit
/// WB 5). Such an answer, and one past `cap`, is handed back (`Err`) with what was read put
/// back in its body, to go out as it comes from there, an abort telling its failure.
///
/// `relocate`: the upstream whose URLs (or Anthropic's public ones) a batch's `results_url`
/// names, made the gateway's in the whole document; one longer than `cap` passes as it
/// comes, unchanged.
///
/// What is read takes its bytes from `hold`, the document's share of the memory answers held
/// before their heads share (`response_body_memory`), and keeps them until the document has
/// been written: one that does not fit is answered 503 `overloaded`, its upstream call
/// cancelled (audit KF 2: 100 documents stalled after 1 MB added 54 MB, under no bound).
async fn with_length(
    mut parts: http::response::Parts,
    mut body: Box<WatchedBody>,
    id: &str,
    cap: usize,
    relocate: Option<(Arc<Upstream>, Arc<str>)>,
    mut hold: BodyHold,
) -> Result<Response<ProxyBody>, (http::response::Parts, Box<WatchedBody>)> {
    // Most documents come in one frame: the list of the others is made only for a second.
    let mut first: Option<Bytes> = None;
    let mut rest: Vec<Bytes> = Vec::new();
    let mut len = 0;
    // The body's first byte that is not JSON whitespace, once one has come.
    let mut opening: Option<u8> = None;
    loop {
        match body.frame().await {
            None => break,
            // Trailers: HTTP/1.0 has no way to send them, and the APIs send none with a
            // document.
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                len += data.len();
                opening = opening.or_else(|| {
                    data.iter()
                        .copied()
                        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
                });
                match first {
                    None => first = Some(data),
                    Some(_) => rest.push(data),
                }
                // A batch's document (`relocate`) is an object whatever comes.
                let array = opening == Some(b'[') && relocate.is_none();
                if len > cap || array {
                    body.unread(first.into_iter().chain(rest));
                    // From here the client reads the body as it comes: what was read goes
                    // out first, and is counted as it does.
                    let record = body.observer_mut();
                    record.read_whole(false);
                    record.set_status(parts.status.as_u16());
                    // Its use is known only at its end: its reservation stands.
                    if let Some(view) = record.run_view() {
                        insert_run_headers(&mut parts.headers, &view, Instant::now());
                    }
                    return Err((parts, body));
                }
                if let Err(e) = hold.cover_in_granules(len as u64) {
                    // Dropped with the body on return: the upstream call ends here.
                    let record = body.observer_mut();
                    record.fail(&e);
                    return Ok(error_answer(&e, record, id));
                }
            }
            Some(Err(e)) => {
                // The watchdog ends a body it polls with a `GatewayError` and nothing else.
                let e = e
                    .downcast::<GatewayError>()
                    .map_or(GatewayError::Internal, |e| *e);
                // The watchdog has already noted how the body ended.
                return Ok(error_answer(&e, body.observer_mut(), id));
            }
        }
    }
    let mut whole = match first {
        None => Bytes::new(),
        Some(only) if rest.is_empty() => only,
        Some(first) => {
            let mut all = Vec::with_capacity(len);
            for piece in std::iter::once(&first).chain(&rest) {
                all.extend_from_slice(piece);
            }
            Bytes::from(all)
        }
    };
    if let Some((upstream, base)) = relocate {
        let local = |url: &str| {
            upstream
                .local_url(url)
                .map(|path| base_relative(path, &base))
                .or_else(|| anthropic_path(url))
        };
        if let Some(local) = localize_results_urls(&whole, local) {
            whole = local;
        }
    }
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(whole.len()));
    // Read whole, the document's usage is known (none for one that is no success, which no
    // inspector reads): the run's tokens with it, as they stand once the call is back.
    let tokens = body.progress_mut().tokens();
    let record = body.observer_mut();
    if let Some(view) = record.run_view_after(tokens, false) {
        insert_run_headers(&mut parts.headers, &view, Instant::now());
    }
    record.sent_whole(whole.len());
    record.set_status(parts.status.as_u16());
    Ok(Response::from_parts(
        parts,
        document(body, hold.keep_with(whole)),
    ))
}

/// The answer for a status without content (1xx, 204, 304), or to a HEAD (whose body hyper
/// never polls: unread, an upstream body with a length to come looked abandoned, logged as
/// the client's cancel). Over HTTP/2, hyper gives an
/// answer whose body has not ended a `content-length` from the body's size hint: `0` for the
/// upstream's empty body, which a 204 must never carry and which on a 304 would misstate the
/// 200's length (RFC 9110 8.6). So the upstream's body (empty: hyper's client reads none for
/// these statuses) is read to its end first, which also lets the watchdog note how it ended,
/// and the answer goes out with a body hyper knows is empty.
async fn without_content(
    parts: http::response::Parts,
    mut body: Box<WatchedBody>,
    id: &str,
) -> Response<ProxyBody> {
    while let Some(frame) = body.frame().await {
        if let Err(e) = frame {
            // As in `with_length`: the watchdog ends a body with a `GatewayError`, and has
            // noted how it ended.
            let e = e
                .downcast::<GatewayError>()
                .map_or(GatewayError::Internal, |e| *e);
            return error_answer(&e, body.observer_mut(), id);
        }
    }
    Response::from_parts(parts, Either::Left(Full::default()))
}
