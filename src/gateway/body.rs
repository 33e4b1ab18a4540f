//! The body of every answer the gateway gives: its own JSON (an error, an assembled
//! document, an HTTP/1.0 answer read whole), or the upstream's body under watch.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::Response;
use http_body_util::{Either, Full};
use tokio::time::Instant;

use crate::error::GatewayError;
use crate::gateway::attempt::UpstreamBody;
use crate::gateway::record::RequestRecord;
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

/// The JSON error answer for `e`, noted in `record` as what the client was sent.
pub(super) fn error_answer(
    e: &GatewayError,
    record: &mut RequestRecord,
    id: &str,
) -> Response<ProxyBody> {
    record.set_status(e.status().as_u16());
    let resp = e.response();
    record.own_bytes(resp.body().len());
    let mut resp = resp.map(|b| Either::Left(Full::new(b)));
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
