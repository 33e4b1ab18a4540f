//! The answer of a call whose upstream was asked to stream for a client that did not
//! (`stream_upstream`): the stream is read to its end under every limit, as any stream is,
//! while the reader rebuilds the one JSON document the provider would have sent; a limit
//! that cuts it after output came gives, with `partial_answers`, what was generated.

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::response::Parts;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use tokio::time::Instant;

use crate::admission::BodyHold;
use crate::error::{GatewayError, Origin};
use crate::gateway::body::{document, error_answer, ProxyBody, WatchedBody};
use crate::gateway::record::RequestRecord;
use crate::http::headers::carry_provider_headers;
use crate::provider::assemble::{AssembleError, Usage};
use crate::provider::inspect::{PromptPart, Tokens};
use crate::provider::tools::ToolCalls;
use crate::provider::ErrorType;
use crate::runs::call::insert_headers as insert_run_headers;
use crate::stream::{Observer, StreamLimits};

/// Set on a partial answer: the code of the limit that cut it.
pub static PARTIAL: HeaderName = HeaderName::from_static("x-hourglass-partial");

/// The limits whose cut leaves a partial answer worth sending; any other failure (a reset,
/// a shutdown) is an error whatever came before it.
fn leaves_partial(e: &GatewayError) -> Option<Origin> {
    match e.origin()? {
        o @ (Origin::Deadline | Origin::Idle | Origin::RunDeadline | Origin::RunTokens) => Some(o),
        _ => None,
    }
}

/// A limit of a Hourglass further down the chain (DESIGN 3.6: its budget is shorter, so its
/// limit usually fires first) that ended the stream with its error event
/// (`GatewayError::sse_event`), as this gateway's own cut of that kind: the code the partial
/// answer names, the limit's origin, and whether the answer says `x-should-retry: false`.
/// The first-token limit is not here: before output, its event is answered as this
/// gateway's own first-token cut is, a 504 that leaves the retry to the SDK.
struct ChainCut {
    code: &'static str,
    origin: Origin,
    no_retry: bool,
}

fn chain_cut(error: &serde_json::Value, limits: &StreamLimits) -> Option<ChainCut> {
    let inner = error.get("error")?;
    let kind = inner.get("type")?.as_str()?;
    let (code, origin, no_retry) = match (kind, inner.get("code")?.as_str()?) {
        ("timeout_error", "idle_timeout") => ("idle_timeout", Origin::Idle, false),
        // The inner gateway's budget is the one this gateway forwarded, so its event cannot
        // say whether the client set it: this gateway's own deadline says what a retry gets.
        ("timeout_error", "deadline_exceeded") => (
            "deadline_exceeded",
            Origin::Deadline,
            limits.deadline_error().tells_not_to_retry(),
        ),
        // A run's limits hold for a retry too.
        ("timeout_error", "run_deadline_exceeded") => {
            ("run_deadline_exceeded", Origin::RunDeadline, true)
        }
        ("rate_limit_error", "run_token_limit") => ("run_token_limit", Origin::RunTokens, true),
        _ => return None,
    };
    Some(ChainCut {
        code,
        origin,
        no_retry,
    })
}

/// The error answered in place of the upstream's answer, whose head came: it keeps what that
/// head said of the provider (its request id, its rate limits), as the document would have.
/// Its head goes out now, not when the upstream's came: what the run has left counts what
/// this call used (`tokens`), as a document's head does.
fn after_head(
    e: &GatewayError,
    record: &mut RequestRecord,
    id: &str,
    head: &Parts,
    tokens: Option<Tokens>,
) -> Response<ProxyBody> {
    let mut resp = error_answer(e, record, id);
    let spent = e.origin() == Some(Origin::RunTokens);
    if let Some(view) = record.run_view_after(tokens, spent) {
        insert_run_headers(resp.headers_mut(), &view, Instant::now());
    }
    carry_provider_headers(&head.headers, resp.headers_mut());
    resp
}

/// The status the provider answers the error it sent as an event with when it is asked
/// without streaming, which the client's SDK maps to its exception: Anthropic's overload is a
/// 529 (`OverloadedError`, which it retries), a rate limit a 429, a bad request a 400. An
/// error the gateway cannot name stays a 502.
fn provider_status(error: &serde_json::Value) -> StatusCode {
    let named = |v: &serde_json::Value| v.as_str().and_then(|s| ErrorType::parse(s.as_bytes()));
    let inner = error.get("error").unwrap_or(error);
    let typed = named(&inner["type"]);
    // vLLM's `{"object":"error",...,"code":503}` carries its HTTP status.
    if let Some(code) = crate::provider::status_of_code(typed, inner["code"].as_u64()) {
        return StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
    }
    let kind = typed
        .or_else(|| named(&inner["code"]))
        .or_else(|| named(&error["error_type"]));
    let code = match kind {
        Some(ErrorType::Overloaded) => 529,
        Some(ErrorType::RateLimit | ErrorType::InsufficientQuota) => 429,
        Some(ErrorType::InvalidRequest) => 400,
        Some(ErrorType::Authentication) => 401,
        Some(ErrorType::Billing) => 402,
        Some(ErrorType::Permission) => 403,
        Some(ErrorType::NotFound) => 404,
        Some(ErrorType::RequestTooLarge) => 413,
        Some(ErrorType::Api | ErrorType::Server) => 500,
        Some(ErrorType::Timeout) => 504,
        Some(ErrorType::Other) | None => 502,
    };
    StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY)
}

/// The provider's error as the body it answers errors with when not streaming. Chat's and
/// Anthropic's error events already are that body; the Responses stream's
/// (`{"type":"error","code":..,"message":..,"param":..,"sequence_number":..}`) is put in
/// OpenAI's envelope, `{"error":{"message","type","param","code"}}`, which is what the SDK
/// reads `type`, `code` and `param` from.
/// A compatible server's error that is a string (`{"error":"..."}`: TGI, llama.cpp) gets
/// the envelope too, its text as the message, so that the SDK shows it.
fn error_body(error: &serde_json::Value) -> std::borrow::Cow<'_, serde_json::Value> {
    if let Some(serde_json::Value::String(message)) = error.get("error") {
        return std::borrow::Cow::Owned(serde_json::json!({"error": {
            "message": message,
            "type": error.get("error_type").unwrap_or(&serde_json::Value::Null),
            "param": null,
            "code": null,
        }}));
    }
    // A whole chunk with an `error` member (OpenRouter's mid-stream error): its error alone,
    // as no unstreamed error has a chunk's `object` and `choices` (audit GB 8).
    if let (Some(inner), Some(_)) = (error.get("error"), error.get("choices")) {
        return std::borrow::Cow::Owned(serde_json::json!({ "error": inner }));
    }
    if error.get("error").is_some() || error.get("message").is_none() {
        return std::borrow::Cow::Borrowed(error);
    }
    let code = &error["code"];
    // The Responses event's `type` is "error" itself; vLLM's names the kind. A code names
    // the OpenAI type it is of (`invalid_prompt`: `invalid_request_error`), not itself; one
    // the gateway cannot name is answered 502, a server's error (audit HB3).
    let own_type = error["type"].as_str().filter(|t| *t != "error");
    let kind = own_type.or_else(|| {
        let named = match code {
            serde_json::Value::String(c) => ErrorType::parse(c.as_bytes()),
            c => c.as_u64().and_then(ErrorType::from_status),
        };
        Some(named.unwrap_or(ErrorType::Server).as_str())
    });
    std::borrow::Cow::Owned(serde_json::json!({"error": {
        "message": error["message"],
        "type": kind,
        "param": error.get("param").unwrap_or(&serde_json::Value::Null),
        "code": code,
    }}))
}

/// A Responses `response.failed` that came before any output is the provider's error event
/// (see `provider::inspect`): its error is `response.error`, `{"code","message"}` as the
/// `error` event's, and answered as that one is. One with no error object (`"error": null`)
/// failed all the same, and is answered as a server's error that says so (audit HB6).
fn failed_response_error(event: &serde_json::Value) -> std::borrow::Cow<'_, serde_json::Value> {
    if event["type"] != "response.failed" {
        return std::borrow::Cow::Borrowed(event);
    }
    match event.pointer("/response/error") {
        Some(e) if e.is_object() => std::borrow::Cow::Borrowed(e),
        _ => std::borrow::Cow::Owned(serde_json::json!({
            "code": null,
            "message": "the response failed, and the provider gave no error",
        })),
    }
}

/// The provider's error event, answered as the provider answers that error to a client that
/// does not stream: its object, whole, with its status (`no_retry`: and `x-should-retry:
/// false`, for a chained gateway's limit that this gateway's own would say it for).
fn provider_error_answer(
    error: &serde_json::Value,
    no_retry: bool,
    record: &mut RequestRecord,
    id: &str,
    head: &Parts,
    tokens: Option<Tokens>,
) -> Response<ProxyBody> {
    let error = &*failed_response_error(error);
    let e = GatewayError::UpstreamError {
        upstream: record.upstream_name().unwrap_or_default(),
        reason: "the provider sent an error event".into(),
    };
    let mut resp = after_head(&e, record, id, head, tokens);
    let status = provider_status(error);
    *resp.status_mut() = status;
    crate::http::headers::keep_reason_phrase(status, resp.extensions_mut());
    record.set_status(status.as_u16());
    if no_retry {
        resp.headers_mut().insert(
            HeaderName::from_static("x-should-retry"),
            HeaderValue::from_static("false"),
        );
    }
    let body = Bytes::from(error_body(error).to_string());
    let replaced = http_body::Body::size_hint(resp.body()).exact().unwrap_or(0);
    record.own_bytes_replaced(replaced as usize, body.len());
    *resp.body_mut() = Either::Left(Full::new(body));
    resp.headers_mut().remove(header::CONTENT_LENGTH);
    resp
}

/// The answer takes the bytes its document holds from `hold`, its share of the memory
/// answers held before their heads share (`response_body_memory`), as they grow, and keeps
/// them until the document has been written. One that does not fit is answered 503
/// `overloaded`, its upstream call cancelled: each answer bounded only by
/// `max_response_body`, 100 of them aborted a gateway limited to 900 MB (audit KF 2).
pub(super) async fn assembled(
    mut parts: Parts,
    mut body: Box<WatchedBody>,
    partial_answers: bool,
    id: &str,
    mut hold: BodyHold,
) -> Response<ProxyBody> {
    body.observer_mut().note_stream_upstream();
    let mut cut = None;
    // The frames themselves are not kept: the reader has rebuilt the document as they passed.
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(_)) => {
                // Past max_response_body, or past an event it could not read, the answer
                // can only be a 502: the upstream is stopped now (the body dropped) rather
                // than read, and paid for, to its end.
                if body.progress_mut().answer_failed() {
                    break;
                }
                let held = body.progress_mut().answer_held() as u64;
                if let Err(e) = hold.cover_in_granules(held) {
                    // Whatever came, the client is told of the memory, not given a part: a
                    // partial answer would look like the model's own stop. Dropped with the
                    // body on return, the upstream call ends here.
                    let tokens = body.progress_mut().tokens();
                    let record = body.observer_mut();
                    record.fail(&e);
                    return after_head(&e, record, id, &parts, tokens);
                }
            }
            Some(Err(e)) => {
                // The watchdog ends a body it polls with a `GatewayError` and nothing else.
                cut = Some(
                    e.downcast::<GatewayError>()
                        .map_or(GatewayError::Internal, |e| *e),
                );
                break;
            }
        }
    }
    let tokens = body.progress_mut().tokens();
    // The inspector's end, which knows the Chat choices the request asked for (`n`), those
    // that never came too.
    let answer_ended = body.progress_mut().answer_ended();
    let Some(mut assembler) = body.progress_mut().take_assembler() else {
        return after_head(
            &GatewayError::Internal,
            body.observer_mut(),
            id,
            &parts,
            tokens,
        );
    };
    // An error event after the whole answer took nothing from it: answered as an error, it
    // would be retried by the SDK and the finished generation paid for twice.
    let ended = answer_ended && assembler.ended();
    let provider_error = assembler.provider_error().filter(|_| !ended).cloned();
    // A chained gateway's limit is this gateway's own cut of that kind (audit KB 1): with
    // output, and `partial_answers`, what was generated; otherwise the error event, with
    // the `x-should-retry` this gateway's own cut would give.
    let chained = provider_error
        .as_ref()
        .and_then(|error| chain_cut(&failed_response_error(error), body.limits()));
    let chained_partial = chained
        .as_ref()
        .filter(|_| partial_answers && assembler.has_output())
        .map(|c| (c.code, c.origin));
    let no_retry = chained.is_some_and(|c| c.no_retry);
    let record = body.observer_mut();
    if let Some(error) = provider_error
        .as_ref()
        .filter(|_| chained_partial.is_none())
    {
        // The provider's own error, as it would have answered it: its object, whole.
        return provider_error_answer(error, no_retry, record, id, &parts, tokens);
    }
    // All that was missing was the stream's own end (see `Assembler::whole`): the answer is
    // whole, and answered as such, whatever ended the stream (a limit, the provider's error
    // event); the log keeps the code of what did.
    if (cut.is_some() && ended && assembler.whole())
        || (ended && assembler.provider_error().is_some())
    {
        match cut.take() {
            Some(e) => record.complete_then(e.code()),
            None => record.complete(),
        }
    }
    let partial = match &cut {
        None => chained_partial,
        Some(e) => match leaves_partial(e) {
            Some(origin) if partial_answers && assembler.has_output() => Some((e.code(), origin)),
            _ => return after_head(e, record, id, &parts, tokens),
        },
    };
    let used = Usage {
        // The input alone, never a total with the cache tokens that the usage reports apart;
        // estimated only when the provider reported no part of its prompt.
        prompt: match tokens {
            Some(t) if t.prompt().is_some() => t.prompt_part(PromptPart::Input).unwrap_or(0),
            _ => record.request_bytes().div_ceil(4),
        },
        completion: tokens.map_or(0, |t| t.completion().0),
    };
    if partial.is_none() {
        // A Chat answer whose every choice finished ends there for the watchdog, whether or
        // not the usage chunk that follows came (a limit, or a provider that ignores
        // `include_usage`): the document still has the usage the provider's would have.
        assembler.fill_missing_usage(used);
    }
    let format = assembler.format();
    let doc = match assembler.finish(partial.map(|_| used)) {
        Ok(doc) => doc,
        // Nothing kept of what came (a tool call cut mid-way): the cut, as with no output.
        Err(AssembleError::Empty) if partial.is_some() => {
            // A chained gateway's cut: its error event, as with no output.
            if let Some(error) = &provider_error {
                return provider_error_answer(error, no_retry, record, id, &parts, tokens);
            }
            let e = cut.unwrap_or(GatewayError::Internal);
            return after_head(&e, record, id, &parts, tokens);
        }
        Err(e) => {
            let e = GatewayError::UpstreamError {
                upstream: record.upstream_name().unwrap_or_default(),
                reason: e.to_string(),
            };
            // The stream itself may have ended well: what the client gets is the error.
            record.fail(&e);
            return after_head(&e, record, id, &parts, tokens);
        }
    };
    if let Some((code, origin)) = partial {
        record.note_partial(origin);
        if record.wants_tool_calls() {
            // The whole calls it hands out, not those of the stream it was cut from.
            let mut calls = ToolCalls::new(format);
            calls.data(&doc);
            calls.document_end();
            record.handed_calls(calls.canonical());
        }
        parts
            .headers
            .insert(PARTIAL.clone(), HeaderValue::from_static(code));
    }
    // The head goes out now, not when the upstream's came: what the run has left is read
    // again, with what this call used.
    let spent = matches!(partial, Some((_, Origin::RunTokens)));
    if let Some(view) = record.run_view_after(tokens, spent) {
        insert_run_headers(&mut parts.headers, &view, Instant::now());
    }
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(doc.len()));
    record.set_status(parts.status.as_u16());
    Observer::data(record, 0);
    record.sent_whole(doc.len());
    let doc = hold.keep_with(Bytes::from(doc));
    Response::from_parts(parts, document(body, doc))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Audit GB 8: OpenRouter's mid-stream error is a whole chunk with an `error` member; a
    /// client that did not stream got that chunk as the error body. It gets the error alone;
    /// Anthropic's error event (its `type` beside `error`) is its body as it is.
    #[test]
    fn an_error_chunk_answers_with_its_error_alone() {
        let chunk = serde_json::json!({
            "id": "cmpl-abc123", "object": "chat.completion.chunk", "created": 1,
            "model": "openai/gpt-4o", "provider": "openai",
            "error": {"code": "server_error", "message": "Provider disconnected"},
            "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
        });
        assert_eq!(
            *error_body(&chunk),
            serde_json::json!({"error": {"code": "server_error", "message": "Provider disconnected"}})
        );
        assert_eq!(provider_status(&chunk), StatusCode::INTERNAL_SERVER_ERROR);
        let anthropic = serde_json::json!({"type": "error", "error": {"type": "overloaded_error", "message": "m"}});
        assert_eq!(*error_body(&anthropic), anthropic);
    }

    /// Audit KB 1: only a Hourglass limit's event (its type and code as
    /// `GatewayError::sse_event` writes them) is a chained gateway's cut; a provider's
    /// error, a timeout among them, stays the provider's. A deadline says not to retry as
    /// this gateway's own would: when its budget is the client's.
    #[test]
    fn only_a_gateway_limits_event_is_a_chained_cut() {
        let limits = |client_budget| StreamLimits {
            first_token_deadline: Instant::now(),
            first_token_timeout: std::time::Duration::from_secs(1),
            first_token_patience: false,
            idle_timeout: std::time::Duration::from_secs(1),
            client_silence: None,
            deadline: Instant::now(),
            budget: std::time::Duration::from_secs(1),
            reserve: std::time::Duration::ZERO,
            client_budget,
            patience: false,
            upstream: "inner".into(),
            run: None,
            run_tokens: None,
            connection: None,
        };
        let event = |e: &GatewayError| -> serde_json::Value {
            let text = String::from_utf8(e.sse_event(None).to_vec()).unwrap();
            serde_json::from_str(text.lines().nth(1).unwrap().strip_prefix("data: ").unwrap())
                .unwrap()
        };
        let idle = GatewayError::IdleTimeout {
            upstream: "fake".into(),
            after: std::time::Duration::from_millis(600),
            patience: false,
        };
        let cut = chain_cut(&event(&idle), &limits(true)).unwrap();
        assert_eq!(
            (cut.code, cut.origin, cut.no_retry),
            ("idle_timeout", Origin::Idle, false)
        );
        let deadline = limits(false).deadline_error();
        for client_budget in [false, true] {
            let cut = chain_cut(&event(&deadline), &limits(client_budget)).unwrap();
            assert_eq!(
                (cut.code, cut.origin),
                ("deadline_exceeded", Origin::Deadline)
            );
            assert_eq!(cut.no_retry, client_budget);
        }
        let spent = GatewayError::RunTokensSpent {
            run: "r".into(),
            limit: 10,
        };
        let cut = chain_cut(&event(&spent), &limits(false)).unwrap();
        assert_eq!((cut.origin, cut.no_retry), (Origin::RunTokens, true));
        for provider in [
            serde_json::json!({"type": "error", "error": {"type": "overloaded_error", "message": "m"}}),
            serde_json::json!({"error": {"type": "timeout_error", "message": "m", "code": null}}),
            serde_json::json!({"error": {"type": "server_error", "code": "idle_timeout"}}),
            serde_json::json!({"type": "error", "code": "deadline_exceeded", "message": "m"}),
        ] {
            assert!(chain_cut(&provider, &limits(true)).is_none(), "{provider}");
        }
    }

    /// The status and envelope a non-streaming client gets for `event`, the error the
    /// assembler kept.
    fn answered(event: &serde_json::Value) -> (StatusCode, serde_json::Value) {
        let error = failed_response_error(event);
        (provider_status(&error), error_body(&error).into_owned())
    }

    fn failed(error: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"type": "response.failed", "sequence_number": 3,
            "response": {"id": "resp_1", "object": "response", "status": "failed", "error": error}})
    }

    /// Audit HB3: a failed response whose code is one of the Responses API's client errors
    /// (`invalid_prompt`, the image errors) was answered 502, a retryable server error, with
    /// the code copied as the envelope's `type`. It is a 400 of `invalid_request_error`.
    #[test]
    fn a_failed_responses_code_is_answered_with_its_status_and_openai_type() {
        for (code, status, ty) in [
            ("invalid_prompt", 400, "invalid_request_error"),
            ("invalid_base64_image", 400, "invalid_request_error"),
            ("image_too_large", 400, "invalid_request_error"),
            ("failed_to_download_image", 400, "invalid_request_error"),
            ("rate_limit_exceeded", 429, "rate_limit_error"),
            ("server_error", 500, "server_error"),
            ("vector_store_timeout", 504, "timeout_error"),
            ("weird_code_x", 502, "server_error"),
        ] {
            let (got, body) = answered(&failed(
                serde_json::json!({"code": code, "message": "bad prompt"}),
            ));
            assert_eq!(got.as_u16(), status, "{code}");
            assert_eq!(
                body,
                serde_json::json!({"error": {"message": "bad prompt", "type": ty, "param": null, "code": code}}),
                "{code}"
            );
        }
    }

    /// Audit HB5: an explicit, named `type` outranks a numeric `code`.
    #[test]
    fn an_errors_named_type_outranks_its_numeric_code() {
        let error =
            serde_json::json!({"error": {"code": 400, "type": "overloaded_error", "message": "x"}});
        assert_eq!(provider_status(&error).as_u16(), 529);
        // A type that names nothing leaves the code to say.
        let error = serde_json::json!({"error": {"code": 429, "type": "whatever", "message": "x"}});
        assert_eq!(provider_status(&error).as_u16(), 429);
    }

    /// Audit HC3a: HB5 let any named type outrank the code, so errors whose numeric code is
    /// the provider's real status were answered as another (vLLM's 503 as Anthropic's 529, a
    /// 429 as a 400). The code is the status; a type outranks only a generic 400 or 500.
    #[test]
    fn a_numeric_code_is_the_status_unless_generic() {
        for (error, status) in [
            (
                serde_json::json!({"object": "error", "message": "The model is overloaded",
                    "type": "ServiceUnavailableError", "param": null, "code": 503}),
                503,
            ),
            (
                serde_json::json!({"error": {"code": 503, "type": "server_error", "message": "m"}}),
                503,
            ),
            (
                serde_json::json!({"error": {"code": 429, "type": "invalid_request_error", "message": "m"}}),
                429,
            ),
            (
                serde_json::json!({"error": {"code": 500, "type": "rate_limit_error", "message": "m"}}),
                429,
            ),
            (
                serde_json::json!({"type": "error", "code": 429, "message": "slow down", "param": null}),
                429,
            ),
        ] {
            assert_eq!(provider_status(&error).as_u16(), status, "{error}");
        }
    }

    /// Audit HB6: a failed response with `"error": null` passed as a success; it is a
    /// server's error, answered 502 in OpenAI's envelope.
    #[test]
    fn a_failed_response_without_an_error_is_a_502() {
        for error in [serde_json::Value::Null, serde_json::json!("gone")] {
            let (status, body) = answered(&failed(error.clone()));
            assert_eq!(status, StatusCode::BAD_GATEWAY, "{error}");
            assert_eq!(body["error"]["type"], "server_error", "{error}");
            assert!(body["error"]["message"].is_string(), "{error}");
        }
    }
}
