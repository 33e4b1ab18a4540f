//! One request: recorded, its script read, and answered (replayed, scripted or an error).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::request::Parts;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::answer::{Answer, Api};
use crate::body::{pause, ScriptBody};
use crate::records::{Finisher, RequestRecord, Shared};
use crate::reply::Reply;
use crate::script::{Script, MAX_DOCUMENT_BYTES, MAX_DOCUMENT_TOKENS, MAX_STREAM_TOKENS};

pub(crate) async fn handle(
    shared: Arc<Shared>,
    conn_id: u64,
    request: Request<Incoming>,
) -> Result<Response<ScriptBody>, io::Error> {
    let at = Instant::now();
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map_err(io::Error::other)?.to_bytes();
    // A fake that does not record (`start_unrecorded`) keeps nothing of the request.
    let recording = shared.recording;
    let index = if !recording {
        usize::MAX
    } else {
        shared.update(|records| {
            records.requests.push(RequestRecord {
                conn_id,
                at,
                method: parts.method.clone(),
                path: parts
                    .uri
                    .path_and_query()
                    .map_or("/", |p| p.as_str())
                    .to_owned(),
                headers: parts.headers.clone(),
                body: body.clone(),
                version: parts.version,
                finished_at: None,
                completed: false,
            });
            records.requests.len() - 1
        })
    };
    let finisher = Finisher {
        shared: shared.clone(),
        index,
        done: !recording,
    };
    let mut response = respond(&shared, &parts, &body, finisher).await?;
    if let Some(id) = parts.headers.get("x-request-id") {
        response.headers_mut().insert("x-request-id", id.clone());
    }
    Ok(response)
}

pub(crate) async fn respond(
    shared: &Shared,
    parts: &Parts,
    body: &Bytes,
    finisher: Finisher,
) -> Result<Response<ScriptBody>, io::Error> {
    // A Messages client's errors in Anthropic's shape, as the real API sends them (its SDKs
    // map the type to exceptions); the others in OpenAI's.
    let anthropic = parts.uri.path().ends_with("/messages");
    let refuse = |status: StatusCode, message: &str, finisher: Finisher| {
        if anthropic {
            anthropic_error_response(status, message, finisher)
        } else {
            error_response(status, message, finisher)
        }
    };
    let mut headers = shared
        .script_defaults
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    for (k, v) in &parts.headers {
        headers.insert(k, v.clone());
    }
    let script = match Script::from_headers(&headers) {
        Ok(script) => script,
        Err(message) => return Ok(refuse(StatusCode::BAD_REQUEST, &message, finisher)),
    };
    if let Some(status) = script.status {
        pause(script.ttft).await;
        let message = "status injected by x-fake-status";
        return Ok(refuse(status, message, finisher));
    }
    let replay = shared
        .replay
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    if let Some(replay) = replay.filter(|_| parts.method == Method::POST) {
        let mut script = script;
        script.interval = replay.interval;
        script.keepalive = None;
        let reply = Reply::Replay(replay.events);
        if script.disconnect_after == Some(0) {
            return abort_before_head(&script, finisher).await;
        }
        let mut first_delay = script.ttft;
        if !script.headers_first {
            pause(std::mem::take(&mut first_delay)).await;
        }
        let mut response = Response::new(ScriptBody::new(reply, script, first_delay, finisher));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(replay.content_type));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(response);
    }
    let api = match (&parts.method, parts.uri.path()) {
        (&Method::GET, "/v1/models") => {
            let models = json!({"object": "list", "data": [
                {"id": "fake-model", "object": "model", "created": 0, "owned_by": "hourglass"},
                {"id": "fake-model-large", "object": "model", "created": 0, "owned_by": "hourglass"},
            ]});
            return Ok(full_response(StatusCode::OK, models.to_string(), finisher));
        }
        (&Method::POST, "/v1/chat/completions") => Api::Chat,
        (&Method::POST, "/v1/messages") => Api::Anthropic,
        (&Method::POST, "/v1/responses") => Api::Responses,
        (method, path) => {
            let message = format!("no route for {method} {path}");
            return Ok(refuse(StatusCode::NOT_FOUND, &message, finisher));
        }
    };
    let request: Value = match serde_json::from_slice(body) {
        Ok(value @ Value::Object(_)) => value,
        Ok(_) => {
            return Ok(refuse(
                StatusCode::BAD_REQUEST,
                "body is not a JSON object",
                finisher,
            ))
        }
        Err(error) => {
            let message = format!("invalid JSON body: {error}");
            return Ok(refuse(StatusCode::BAD_REQUEST, &message, finisher));
        }
    };
    let stream = request.get("stream") == Some(&Value::Bool(true));
    if !stream {
        if let Err(message) = script.check_document() {
            return Ok(refuse(StatusCode::BAD_REQUEST, &message, finisher));
        }
    }
    let answer = match answer(shared, api, &request, &script) {
        Ok(answer) => answer,
        Err(message) => return Ok(refuse(StatusCode::BAD_REQUEST, &message, finisher)),
    };
    if !stream && answer.document_pieces() > MAX_DOCUMENT_TOKENS as u128 {
        let message = format!(
            "the answer asked for ({} tokens, with n, top_logprobs and the calls each \
             multiplying them) is more than the {MAX_DOCUMENT_TOKENS} a non-streaming \
             answer may have",
            answer.document_pieces()
        );
        return Ok(refuse(StatusCode::BAD_REQUEST, &message, finisher));
    }
    if stream && answer.document_pieces() > MAX_STREAM_TOKENS {
        let message = format!(
            "the stream asked for ({} tokens, with n, top_logprobs and the calls each \
             multiplying them) is more than the {MAX_STREAM_TOKENS} a stream may have",
            answer.document_pieces()
        );
        return Ok(refuse(StatusCode::BAD_REQUEST, &message, finisher));
    }
    if !stream && answer.document_bytes() > MAX_DOCUMENT_BYTES as u128 {
        let message = format!(
            "the answer asked for (about {} bytes, with n, top_logprobs and the calls' \
             arguments) is larger than the {MAX_DOCUMENT_BYTES} bytes a non-streaming answer \
             may have",
            answer.document_bytes()
        );
        return Ok(refuse(StatusCode::BAD_REQUEST, &message, finisher));
    }
    if stream && script.disconnect_after == Some(0) {
        return abort_before_head(&script, finisher).await;
    }
    let mut script = script;
    let (reply, content_type) = if stream {
        (Reply::stream(answer), "text/event-stream")
    } else {
        // A single event with the whole answer, which a keep-alive would corrupt.
        script.keepalive = None;
        (Reply::whole(&answer), "application/json")
    };
    let mut first_delay = script.ttft;
    if !script.headers_first {
        // The head is only handed to hyper after the wait, so it leaves with the first event.
        pause(std::mem::take(&mut first_delay)).await;
    }
    let mut response = Response::new(ScriptBody::new(reply, script, first_delay, finisher));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

/// A stream's `x-fake-disconnect-after: 0`: no head at all, at the time the head was due.
/// The service's error makes hyper close an HTTP/1 connection without a byte and reset an
/// HTTP/2 stream (`INTERNAL_ERROR`); a body's error would come only after the head it went
/// out with.
async fn abort_before_head(
    script: &Script,
    mut finisher: Finisher,
) -> Result<Response<ScriptBody>, io::Error> {
    pause(script.ttft).await;
    finisher.finish(false);
    Err(io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "x-fake-disconnect-after: 0",
    ))
}

pub(crate) fn full_response(
    status: StatusCode,
    text: String,
    finisher: Finisher,
) -> Response<ScriptBody> {
    let body = ScriptBody::new(
        Reply::Full(Bytes::from(text)),
        Script::default(),
        Duration::ZERO,
        finisher,
    );
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

pub(crate) fn error_response(
    status: StatusCode,
    message: &str,
    finisher: Finisher,
) -> Response<ScriptBody> {
    let kind = match status.as_u16() {
        400 | 404 | 422 => "invalid_request_error",
        401 | 403 => "authentication_error",
        429 => "rate_limit_error",
        500..=599 => "server_error",
        _ => "api_error",
    };
    let error = json!({"error": {"message": message, "type": kind, "param": null, "code": null}});
    full_response(status, error.to_string(), finisher)
}

/// Anthropic's error shape, and its types by status (its SDKs map the type to exceptions):
/// what a Messages client sees from the real API.
pub(crate) fn anthropic_error_response(
    status: StatusCode,
    message: &str,
    finisher: Finisher,
) -> Response<ScriptBody> {
    let kind = match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    };
    let error = json!({"type": "error", "error": {"type": kind, "message": message}});
    full_response(status, error.to_string(), finisher)
}

/// What the answer to `request` says: its script, and what the request asks for (`n`,
/// `logprobs`, the usage chunk) or already holds (tool results).
fn answer(shared: &Shared, api: Api, request: &Value, script: &Script) -> Result<Answer, String> {
    let field = |name: &str| request.get(name).unwrap_or(&Value::Null);
    let model = field("model").as_str().unwrap_or("fake-model").to_owned();
    // What a Responses `response` object repeats of its request.
    let echo = match api {
        Api::Responses => {
            let echoed = [
                "instructions",
                "max_output_tokens",
                "metadata",
                "previous_response_id",
                "store",
                "tool_choice",
                "tools",
            ];
            let fields = echoed
                .iter()
                .filter_map(|&k| Some((k.to_owned(), request.get(k)?.clone())));
            Value::Object(fields.collect())
        }
        _ => Value::Null,
    };
    let (tag, created) = match &script.id {
        // A fixed id fixes the time too, so that two answers compare equal as JSON.
        Some(id) => (id.clone(), FIXED_CREATED),
        None => {
            let n = shared.next_reply_id.fetch_add(1, Ordering::Relaxed);
            let tag = match api {
                Api::Chat => format!("fake-{n}"),
                _ => format!("fake_{n}"),
            };
            let now = SystemTime::now().duration_since(UNIX_EPOCH);
            (tag, now.map_or(0, |d| d.as_secs()))
        }
    };
    let chat = api == Api::Chat;
    let choices = match field("n") {
        Value::Null => 1,
        n if chat => n
            .as_u64()
            .filter(|n| (1..=128).contains(n))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| format!("invalid value for n: {n}"))?,
        _ => 1,
    };
    let top = match field("top_logprobs") {
        Value::Null => 0,
        n => n
            .as_u64()
            .filter(|n| *n <= 20)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| format!("invalid value for top_logprobs: {n}"))?,
    };
    let logprobs = (chat && field("logprobs") == &Value::Bool(true)).then_some(top);
    let include_usage =
        chat && request.pointer("/stream_options/include_usage") == Some(&Value::Bool(true));
    let refusal = chat && script.refusal;
    // A refusal is said instead of any call.
    let calls = if refusal {
        Vec::new()
    } else {
        turn(&script.tool_calls, tool_results(api, request))
    };
    // A preamble is text before calls: without calls, the answer is all text anyway.
    let preamble = if calls.is_empty() {
        0
    } else {
        script.tool_preamble
    };
    Ok(Answer {
        api,
        tag,
        model,
        created,
        prompt_tokens: prompt_tokens(request),
        chunks: script.chunks,
        preamble,
        reasoning: script.reasoning,
        choices,
        logprobs,
        refusal,
        include_usage,
        calls,
        arguments: script.tool_args.clone(),
        echo,
    })
}

/// The calls of the turn an agent is at, having sent `results` tool results: one turn is
/// answered every time (a loop); of several, the first whose calls do not all have their
/// results yet (a turn of two parallel calls is done once two results came, and asked
/// again while only one has), and past the last, none: the answer is text, so that an
/// agent finishes.
fn turn(turns: &[Vec<String>], results: usize) -> Vec<String> {
    if let [one] = turns {
        return one.clone();
    }
    let mut answered = 0;
    for calls in turns {
        answered += calls.len();
        if results < answered {
            return calls.clone();
        }
    }
    Vec::new()
}

/// The `created` of an answer with a fixed `x-fake-id`: 2023-11-14, a plausible time.
const FIXED_CREATED: u64 = 1_700_000_000;

/// A rough estimate, enough for usage accounting tests, of the request without its stream
/// options: a call through a gateway that asked to stream reports what the direct one does.
fn prompt_tokens(request: &Value) -> usize {
    let mut without = request.clone();
    if let Value::Object(map) = &mut without {
        map.remove("stream");
        map.remove("stream_options");
    }
    (without.to_string().len() / 4).max(1)
}

/// The tool results the request already holds: Chat `tool` messages, Anthropic
/// `tool_result` blocks, Responses `function_call_output` items.
fn tool_results(api: Api, request: &Value) -> usize {
    let list = |key: &str| {
        request
            .get(key)
            .and_then(Value::as_array)
            .map(Vec::as_slice)
    };
    let is = |v: &Value, key: &str, want: &str| v.get(key).and_then(Value::as_str) == Some(want);
    match api {
        Api::Chat => list("messages")
            .unwrap_or_default()
            .iter()
            .filter(|m| is(m, "role", "tool"))
            .count(),
        Api::Anthropic => list("messages")
            .unwrap_or_default()
            .iter()
            .filter_map(|m| m.get("content").and_then(Value::as_array))
            .flatten()
            .filter(|b| is(b, "type", "tool_result"))
            .count(),
        Api::Responses => list("input")
            .unwrap_or_default()
            .iter()
            .filter(|i| is(i, "type", "function_call_output"))
            .count(),
    }
}
