//! The request as every attempt sends it: built once from the client's request, then made
//! into one upstream's request per attempt (its URI, credentials and body rewrites).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Uri};

use crate::admission::BodyMemory;
use crate::error::GatewayError;
use crate::provider::background::Detached;
use crate::provider::batches::{names_results_urls, sdk_base_path};
use crate::provider::rewrite::{include_usage, rewrite_model, stream_request};
use crate::provider::Format;
use crate::upstream::Upstream;

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
    /// The memory request bodies share (`request_body_memory`), which `body` already holds
    /// from: an attempt's rewritten copy of it takes its own share there.
    pub bodies: BodyMemory,
    /// Ask a known format's upstream to stream what the client did not (`stream_upstream`).
    pub stream_upstream: bool,
    /// A limit that cuts such an answer after output came gives the client a partial one.
    pub partial_answers: bool,
    /// The model the client named, which picks each upstream's estimate of its first token.
    pub model: Option<Arc<str>>,
    /// The Chat choices the client asked for (`n`).
    pub choices: Option<u64>,
    /// A call whose work goes on at the provider when its connection closes (an OpenAI
    /// background response, or its stream resumed).
    pub detached: Option<Detached>,
    /// The call may have the model generate (`provider::may_generate`).
    pub generates: bool,
}

impl Template {
    /// What an attempt on `upstream` is expected to take until its first token: nothing
    /// more than `min_useful` for a call in which the model generates nothing (a count of
    /// tokens, a stored response, a batch), answered in milliseconds. Held to its model's
    /// time to a generation's first token, a `count_tokens` of a thinking model was refused
    /// `insufficient_budget` with 1.5 s left (audit ZD 2); such calls take no sample of it
    /// either (audit UC 4).
    pub fn expected_ttft(&self, upstream: &Upstream) -> Duration {
        if self.generates {
            upstream.expected_ttft(self.model.as_deref())
        } else {
            Duration::ZERO
        }
    }
}

/// One upstream's request, and the wire format of the exchange when it is known (the
/// upstream's `api` and the path decide it, once per attempt).
pub struct Outgoing {
    /// Its body is wrapped by the attempt, which watches it go out.
    pub request: Request<Bytes>,
    pub format: Option<Format>,
    /// The upstream was asked to stream on the client's behalf: its stream is to be
    /// assembled into the one document the client expects.
    pub assembled: bool,
    /// The gateway added `stream_options.include_usage` to a streaming Chat request whose
    /// client did not ask for it: the usage-only chunk it brings is not the client's.
    pub hide_usage: bool,
    /// The answer is read for its usage only (a resumed background stream; see
    /// `Inspector::reading_usage_only`).
    pub usage_only: bool,
    pub partial_answers: bool,
    /// The Chat choices the answer has (`n`), at most 64 (see `Inspector::with_choices`).
    pub choices: u8,
    /// Its answer may name a batch's results by the upstream's URL, to be made the gateway's:
    /// then the client's path before `/v1/messages/batches`, the path of the SDK's base URL
    /// (see `base_relative`).
    pub results_urls: Option<Arc<str>>,
}

/// The most headers an attempt adds to the template's: the upstream's credential and the
/// forwarded budget.
const ATTEMPT_HEADERS: usize = 2;

impl Template {
    pub fn request_for(&self, upstream: &Upstream) -> Result<Outgoing, GatewayError> {
        let uri: Uri =
            upstream
                .uri_for(&self.path_and_query)
                .map_err(|e| GatewayError::BadRequest {
                    message: format!("request target cannot be forwarded: {e}"),
                })?;
        let rewritten = match &upstream.config.model {
            Some(model) => rewrite_model(&self.body, model)?,
            None => None,
        };
        // Whether `body` is a copy of the template's rather than its bytes.
        let mut copied = rewritten.is_some();
        let mut body = rewritten.unwrap_or_else(|| self.body.clone());
        // A background response streamed again is read for its usage too (audit UC 4).
        // It asks the model nothing, so it is read for that usage only: not held to the
        // first-token limit or the format's end (audit VC 1, VC 2).
        let detected = Format::detect(upstream.config.api, uri.path());
        let resumed = detected
            .is_none()
            .then(|| {
                (self.method == Method::GET)
                    .then(|| Format::resumed(upstream.config.api, uri.path(), uri.query()))
                    .flatten()
            })
            .flatten();
        let usage_only = resumed.is_some();
        let format = detected.or(resumed);
        let results_urls = names_results_urls(upstream.config.api, &self.method, uri.path())
            .then(|| Arc::from(sdk_base_path(self.path_and_query.path())));
        let mut assembled = false;
        let mut hide_usage = false;
        // The body rewrites of a call (asked to stream, asked for its usage) are made to a
        // `POST` only: that is what a call is. `GET /v1/chat/completions` lists stored
        // completions, and a body sent with it, or with a PUT, PATCH or DELETE, went up
        // rewritten and its answer was assembled as a stream's (audit WA 3). The model pin
        // above holds for every method: a pin that a method could skip would be none.
        let post = self.method == Method::POST;
        // Asked to stream only where it is a call of the API itself: the rest of it
        // (count_tokens, batches, embeddings) refuses a `stream` it never takes.
        let call = (self.stream_upstream && post)
            .then(|| Format::call(upstream.config.api, uri.path()))
            .flatten();
        if let Some(f) = call {
            if let Some(streamed) = stream_request(&body, f, upstream.config.assembled_usage)? {
                body = streamed;
                copied = true;
                assembled = true;
            }
        }
        if post && upstream.config.include_usage && format == Some(Format::Chat) {
            if let Some(with_usage) = include_usage(&body, false)? {
                body = with_usage;
                copied = true;
                // (A stream assembled into a document already asked: `stream_request`.)
                hide_usage = true;
            }
        }
        // A rewritten body is a copy beside the template's, alive until hyper has written it
        // (or longer, on a stalled upstream), and one per attempt in flight (a hedge, a
        // concurrent fallback): it holds its own share of the memory as the template's does,
        // taken without waiting, as `read_body` takes it, so no request waits for bytes it
        // holds itself. Uncounted, bodies on a route with `model =` or `stream_upstream` took
        // twice `request_body_memory` (audit QA 2).
        if copied {
            // Taken beside the template's own share: where the two are more than the whole
            // memory, no moment would ever have room, and a 503 "try again" would be
            // answered to every retry (audit QC 1). Refused for good instead.
            let (held, copy, limit) = (
                self.body.len() as u64,
                body.len() as u64,
                self.bodies.limit(),
            );
            if held.saturating_add(copy) > limit {
                return Err(GatewayError::BodyCopyTooLarge {
                    body: held,
                    copy,
                    limit,
                    upstream: upstream.config.name.clone(),
                });
            }
            let mut hold = self.bodies.hold();
            hold.cover(body.len() as u64)?;
            body = hold.keep_with(body);
        }
        let mut req = Request::builder()
            .method(self.method.clone())
            .uri(uri)
            .body(body)
            .map_err(|e| GatewayError::BadRequest {
                message: format!("request cannot be forwarded: {e}"),
            })?;
        // Made with room for what the attempt adds (the provider's key, the forwarded
        // budget) rather than cloned: a clone has none, and its first insert doubles it. hyper
        // keeps the map of the last request it sent on a connection to parse the answer's head
        // into, and that map then goes on to the client's connection, for as long as the
        // stream is open: doubled, it held 1,664 bytes of entries instead of 1,248 (about
        // 0.5 KiB of RSS per open stream in the harness).
        let headers = req.headers_mut();
        headers.reserve(self.headers.len() + ATTEMPT_HEADERS);
        for (name, value) in &self.headers {
            headers.append(name.clone(), value.clone());
        }
        if format.is_none() && results_urls.is_none() {
            // Not read, so passed opaque: it may come in any coding the client takes.
            match &self.accept_encoding {
                Some(v) => req.headers_mut().insert(header::ACCEPT_ENCODING, v.clone()),
                None => req.headers_mut().remove(header::ACCEPT_ENCODING),
            };
        }
        if req.body().is_empty()
            && matches!(self.method, Method::POST | Method::PUT | Method::PATCH)
        {
            // RFC 9110 8.6: a POST says its length even when it is 0, and some origins
            // answer 411 without one; hyper gives an empty body none.
            req.headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        }
        upstream.apply_credentials(req.headers_mut());
        Ok(Outgoing {
            request: req,
            format,
            usage_only,
            assembled,
            hide_usage,
            partial_answers: self.partial_answers,
            choices: self.choices.map_or(1, |n| n.clamp(1, 64) as u8),
            results_urls,
        })
    }
}
