//! The body of every answer the gateway gives: its own JSON (an error, an assembled
//! document, an HTTP/1.0 answer read whole), or the upstream's body under watch.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::Response;
use http_body::Body;
use http_body_util::{Either, Full};
use tokio::time::Instant;

use crate::error::GatewayError;
use crate::gateway::attempt::UpstreamBody;
use crate::gateway::record::RequestRecord;
use crate::gateway::retry::retry_after;
use crate::http::headers::insert_request_id;
use crate::runs::call::insert_headers as insert_run_headers;
use crate::stream::reaper::Reapable;
use crate::stream::WatchdogBody;

/// The upstream's body under watch, with the route's admission slot held beside it.
pub type WatchedBody = WatchdogBody<Reapable<UpstreamBody, crate::admission::Slot>, RequestRecord>;

/// The body of every answer. The watched body is boxed: inline it would make this type
/// (and every `Response` holding it) over a kilobyte, and an answer is moved by value about
/// ten times on its way into hyper, which keeps it in a box of its own per connection.
/// Boxing it took `memcpy` from 9,700 to 8,200 instructions a request (callgrind), for one
/// allocation more.
pub type ProxyBody = Either<Full<Bytes>, Box<WatchedBody>>;

/// The body for `doc`, a document the gateway made of `body`, read to its end. Over HTTP/2
/// it goes out through `body`, with the request's record, which reports once h2 has taken
/// the document's end (see `stream::watchdog::Delivery`): handed over in one piece, it was
/// reported `ok` at once, and a connection cut with most of it unsent said so too (audit KC
/// 1). Otherwise in one piece, the record reported now.
pub(super) fn document(mut body: Box<WatchedBody>, doc: Bytes) -> ProxyBody {
    if body.confirms_delivery() && body.is_end_stream() && !doc.is_empty() {
        body.unread([doc]);
        return Either::Right(body);
    }
    Either::Left(Full::new(doc))
}

/// `x-should-retry: false` on a failure the SDKs retry (408, 409, 429 or 5xx), where the
/// SDK's retry would only add calls or time:
/// - The gateway's own retries or fallbacks ended in it: the OpenAI and Anthropic SDKs retry
///   such answers twice by default, and each of their retries ran the route's whole chain
///   again (retries = 2: nine upstream calls, three of a run's calls, for one call of the
///   agent). Not when the last upstream asked for a wait the gateway did not wait out
///   (`RequestRecord::left_wait`): the SDK's retry after it is the one the gateway did not
///   make (audit AE 1 to 3).
/// - The answer asks for a wait longer than what is left of a budget the client set itself,
///   after any number of attempts: the SDK's retry would come past the deadline the client
///   named, as after a 504 `deadline_exceeded` (audit AE 4: a 1 s budget took 4 s and three
///   calls).
pub(super) fn no_retry_after_retries(
    headers: &mut http::HeaderMap,
    status: http::StatusCode,
    record: &RequestRecord,
) {
    use http::StatusCode as S;
    let sdks_retry = matches!(
        status,
        S::REQUEST_TIMEOUT | S::CONFLICT | S::TOO_MANY_REQUESTS
    ) || status.is_server_error();
    if !sdks_retry {
        return;
    }
    let past_deadline = || {
        record
            .client_budget_left(Instant::now())
            .is_some_and(|left| retry_after(headers).is_some_and(|wait| wait > left))
    };
    if (record.retried() && !record.left_a_wait()) || past_deadline() {
        headers.insert(
            http::HeaderName::from_static("x-should-retry"),
            HeaderValue::from_static("false"),
        );
    }
}

/// The JSON error answer for `e`, noted in `record` as what the client was sent.
pub(super) fn error_answer(
    e: &GatewayError,
    record: &mut RequestRecord,
    id: &str,
) -> Response<ProxyBody> {
    record.set_status(e.status().as_u16());
    let resp = e.response();
    record.own_bytes(resp.body().len());
    let mut resp = if record.is_head() {
        // The length a GET would have had, and no body: hyper sends an HTTP/2 HEAD answer
        // the body it is given, which the client takes for a PROTOCOL_ERROR.
        let (mut parts, body) = resp.into_parts();
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        Response::from_parts(parts, Either::Left(Full::default()))
    } else {
        resp.map(|b| Either::Left(Full::new(b)))
    };
    no_retry_after_retries(resp.headers_mut(), e.status(), record);
    if let Some(view) = record.run_view() {
        insert_run_headers(resp.headers_mut(), &view, Instant::now());
    }
    insert_request_id(resp.headers_mut(), id);
    // The rest of the body is still on its way: hyper will not read it, and closes the
    // connection after this answer. Said, so that no client sends its next request on a
    // connection about to close (a POST lost that way cannot safely be sent again).
    if record.body_unread() {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}
