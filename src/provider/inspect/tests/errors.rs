//! How a provider's error event in a stream is typed: by its named type, by its numeric
//! code (the HTTP status it stands for), and a Responses `response.failed` before output as
//! the error it carries.

use super::*;

/// Audit GB 3: a `response.failed` before any output is the provider's error event, of its
/// `error.code`, as an `error` event is (a `server_error` was neither failed over nor logged
/// as an error); after output it is counted and the stream goes on.
#[test]
fn a_response_failed_before_output_is_an_error_event() {
    let created = r#"data: {"type":"response.created","response":{"id":"r","status":"in_progress","error":null}}"#;
    let failed = r#"data: {"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"m"},"usage":null}}"#;
    let s = format!("{created}\n\n{failed}\n\n{AFTER}");
    let got = run(Format::Responses, s.as_bytes(), true, &[]);
    assert_eq!(got.tokens.error, Some(ErrorType::Server));
    assert_eq!(got.error_end, Some(created.len() + failed.len() + 4));
    assert_eq!(got.tokens.output_events, 0, "nothing after it is read");
    let delta = r#"data: {"type":"response.output_text.delta","output_index":0,"delta":"hi"}"#;
    let s = format!("{delta}\n\n{failed}\n\n{AFTER}");
    let got = run(Format::Responses, s.as_bytes(), true, &[]);
    assert_eq!(got.error_end, None);
    assert_eq!(got.tokens.error, Some(ErrorType::Server));
    assert_eq!(got.tokens.output_events, 2);
}

/// Audit HB6: a `response.failed` with no error object (`"error": null`, or none) before any
/// output passed as a success (no failover, logged `ok`); it is a server's error event.
#[test]
fn a_response_failed_without_an_error_is_an_error_event() {
    let created = r#"data: {"type":"response.created","response":{"id":"r","status":"in_progress","error":null}}"#;
    for failed in [
        r#"data: {"type":"response.failed","response":{"status":"failed","error":null,"usage":null}}"#,
        r#"data: {"type":"response.failed","response":{"status":"failed"}}"#,
    ] {
        let s = format!("{created}\n\n{failed}\n\n{AFTER}");
        let got = run(Format::Responses, s.as_bytes(), true, &[]);
        assert_eq!(got.tokens.error, Some(ErrorType::Server), "{failed}");
        assert_eq!(
            got.error_end,
            Some(created.len() + failed.len() + 4),
            "{failed}"
        );
    }
}

/// Audit HB3: a failed response's Responses API code (`invalid_prompt`) is the request's
/// error, not `other`.
#[test]
fn a_response_failed_with_a_client_code_is_an_invalid_request() {
    let failed = r#"data: {"type":"response.failed","response":{"status":"failed","error":{"code":"invalid_prompt","message":"bad prompt"}}}"#;
    let s = format!("{failed}\n\n{AFTER}");
    let got = run(Format::Responses, s.as_bytes(), true, &[]);
    assert_eq!(got.tokens.error, Some(ErrorType::InvalidRequest));
}

/// Audit HB5: an explicit, named `type` outranks a numeric `code` (an overload is failed
/// over; typed by its code 400 it was answered as the client's error).
#[test]
fn an_errors_named_type_outranks_its_numeric_code() {
    let data = r#"{"error":{"code":400,"type":"overloaded_error","message":"x"}}"#;
    let s = format!("data: {data}\n\n{AFTER}");
    let got = run(Format::Chat, s.as_bytes(), true, &[]);
    assert_eq!(got.tokens.error, Some(ErrorType::Overloaded));
}

/// Audit HC3a: a numeric code that is the provider's real status is not overruled by a
/// type of the same or a vaguer kind (a 429 is retried as a rate limit); a type outranks only
/// a generic 400 or 500.
#[test]
fn an_errors_numeric_code_outranks_a_type_that_says_less() {
    for (data, ty) in [
        (
            r#"{"object":"error","message":"The model is overloaded","type":"ServiceUnavailableError","param":null,"code":503}"#,
            ErrorType::Overloaded,
        ),
        (
            r#"{"error":{"code":503,"type":"server_error","message":"Service Unavailable"}}"#,
            ErrorType::Overloaded,
        ),
        (
            r#"{"error":{"code":429,"type":"invalid_request_error","message":"Rate limit reached"}}"#,
            ErrorType::RateLimit,
        ),
        (
            r#"{"error":{"code":500,"type":"rate_limit_error","message":"x"}}"#,
            ErrorType::RateLimit,
        ),
    ] {
        let s = format!("data: {data}\n\n{AFTER}");
        let got = run(Format::Chat, s.as_bytes(), true, &[]);
        assert_eq!(got.tokens.error, Some(ty), "{data}");
    }
}

/// Audit HC3b: a Responses `error` event whose own `code` is a number is typed by it, as its
/// answer is (a 429 is a rate limit, failed over), not `other`.
#[test]
fn a_responses_error_events_numeric_code_types_it() {
    let data =
        r#"{"type":"error","code":429,"message":"slow down","param":null,"sequence_number":1}"#;
    let s = format!("event: error\ndata: {data}\n\n{AFTER}");
    let got = run(Format::Responses, s.as_bytes(), true, &[]);
    assert_eq!(got.tokens.error, Some(ErrorType::RateLimit));
}

/// Audit GB 6: an error typed only by a numeric `code` (Gemini's, OpenRouter's) is typed as
/// the HTTP status it is, as the document rebuilt from the stream answers it: a 429 is a rate
/// limit (failed over), not `other`.
#[test]
fn an_error_with_a_numeric_code_is_typed_by_it() {
    for (data, ty) in [
        (
            r#"{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}"#,
            ErrorType::RateLimit,
        ),
        (r#"{"error":{"message":"m","code":502}}"#, ErrorType::Server),
        (
            r#"{"error":{"message":"m","code":503}}"#,
            ErrorType::Overloaded,
        ),
        (r#"{"error":{"message":"m","code":7}}"#, ErrorType::Other),
    ] {
        let s = format!("data: {data}\n\n{AFTER}");
        let got = run(Format::Chat, s.as_bytes(), true, &[]);
        assert_eq!(got.tokens.error, Some(ty), "{data}");
        assert_eq!(got.error_end, Some(data.len() + 8), "{data}");
    }
}
