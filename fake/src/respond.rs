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

use crate::body::{pause, ScriptBody};
use crate::records::{Finisher, RequestRecord, Shared};
use crate::reply::{Reply, Shape};
use crate::script::Script;

pub(crate) async fn handle(
    shared: Arc<Shared>,
    conn_id: u64,
    request: Request<Incoming>,
) -> Result<Response<ScriptBody>, io::Error> {
    let at = Instant::now();
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map_err(io::Error::other)?.to_bytes();
    let index = shared.update(|records| {
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
    });
    let finisher = Finisher {
        shared: shared.clone(),
        index,
        done: false,
    };
    let mut response = respond(&shared, &parts, &body, finisher).await;
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
) -> Response<ScriptBody> {
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
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message, finisher),
    };
    if let Some(status) = script.status {
        pause(script.ttft).await;
        return error_response(status, "status injected by x-fake-status", finisher);
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
        let reply = Reply {
            chunks: replay.events.len(),
            shape: Shape::Replay(replay.events),
            ..Reply::full(Bytes::new())
        };
        let mut first_delay = script.ttft;
        if !script.headers_first {
            pause(std::mem::take(&mut first_delay)).await;
        }
        let mut response = Response::new(ScriptBody::new(reply, script, first_delay, finisher));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(replay.content_type));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return response;
    }
    let shape = match (&parts.method, parts.uri.path()) {
        (&Method::GET, "/v1/models") => {
            let models = json!({"object": "list", "data": [
                {"id": "fake-model", "object": "model", "created": 0, "owned_by": "hourglass"},
                {"id": "fake-model-large", "object": "model", "created": 0, "owned_by": "hourglass"},
            ]});
            return full_response(StatusCode::OK, models.to_string(), finisher);
        }
        (&Method::POST, "/v1/chat/completions") => Shape::OpenAi,
        (&Method::POST, "/v1/messages") => Shape::Anthropic,
        (&Method::POST, "/v1/responses") => Shape::Responses,
        (method, path) => {
            let message = format!("no route for {method} {path}");
            return error_response(StatusCode::NOT_FOUND, &message, finisher);
        }
    };
    let request: Value = match serde_json::from_slice(body) {
        Ok(value @ Value::Object(_)) => value,
        Ok(_) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "body is not a JSON object",
                finisher,
            )
        }
        Err(error) => {
            let message = format!("invalid JSON body: {error}");
            return error_response(StatusCode::BAD_REQUEST, &message, finisher);
        }
    };
    let field = |name: &str| request.get(name).cloned().unwrap_or(Value::Null);
    let stream = field("stream") == Value::Bool(true);
    let model = field("model").as_str().unwrap_or("fake-model").to_owned();
    // What a Responses `response` object repeats of its request.
    let echo = match shape {
        Shape::Responses => {
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
    let created = SystemTime::now().duration_since(UNIX_EPOCH);
    let reply = Reply {
        shape,
        id: shared.next_reply_id.fetch_add(1, Ordering::Relaxed),
        model,
        created: created.map_or(0, |d| d.as_secs()),
        // A rough estimate is enough for usage accounting tests.
        prompt_tokens: (body.len() / 4).max(1),
        chunks: script.chunks,
        tool: script.tool_call.clone(),
        echo,
    };
    let mut script = script;
    let (reply, content_type) = if stream {
        (reply, "text/event-stream")
    } else {
        // A single event with the whole answer, which a keep-alive would corrupt.
        script.keepalive = None;
        (Reply::full(reply.whole()), "application/json")
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
    response
}

pub(crate) fn full_response(
    status: StatusCode,
    text: String,
    finisher: Finisher,
) -> Response<ScriptBody> {
    let body = ScriptBody::new(
        Reply::full(text),
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
