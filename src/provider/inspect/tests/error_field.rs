//! llama.cpp's error event: a block with an `error` field and no data is the provider's
//! error, read whatever its value is; one with data is read as the standard reads it.

use super::*;
use crate::provider::inspect::error_field::MAX_ERROR_FIELD;

const CHUNK: &str = r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok0 "},"finish_reason":null}]}"#;
const VALUE: &str = r#"{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}"#;

/// Feeds `stream` cut at `k` to a Chat inspector that rebuilds the document: the offset the
/// error ended at (absolute), and the inspector.
fn read(stream: &str, k: usize, ins: Inspector) -> (Option<usize>, Inspector) {
    let mut ins = ins;
    let (a, b) = stream.as_bytes().split_at(k);
    let first = ins.feed(a);
    let end = match first.error_end {
        Some(e) => Some(e),
        None => ins.feed(b).error_end.map(|e| e + k),
    };
    (end, ins)
}

fn chat() -> Inspector {
    Inspector::new(Format::Chat, true).with_assembler(1 << 20)
}

/// After output, cut anywhere: the error ends the reading at its blank line, is counted by
/// its code (400: the request's error), and gives its message and, to the document rebuilt
/// from the stream, its value as the data-only error event's.
#[test]
fn an_error_field_after_output_is_the_providers_error() {
    let head = format!("{CHUNK}\n\n");
    let block = format!("error: {VALUE}\n\n");
    let stream = format!("{head}{block}data: [DONE]\n\n");
    for k in 0..=stream.len() {
        let (end, mut ins) = read(&stream, k, chat());
        assert_eq!(end, Some(head.len() + block.len()), "cut at {k}");
        let t = ins.tokens();
        assert_eq!(t.error, Some(ErrorType::InvalidRequest), "cut at {k}");
        assert_eq!(t.output_events, 1, "cut at {k}");
        assert_eq!(
            ins.error_field_message(),
            Some("the request exceeds the available context size")
        );
        let error = ins.take_assembler().unwrap().provider_error().cloned();
        let want: Value = serde_json::from_str(&format!("{{\"error\":{VALUE}}}")).unwrap();
        assert_eq!(error, Some(want), "cut at {k}");
    }
}

/// Any value gives the message (audit YC 2: a value that is no JSON was lost for a client that
/// did not stream): a JSON string, plain text, a value past what is kept (its first bytes,
/// said to be cut). Only a JSON object's type or code types it (a 503: an overload, retried).
#[test]
fn any_value_gives_the_message() {
    let long = "x".repeat(MAX_ERROR_FIELD + 10);
    // The space after the colon is one of the bytes kept.
    let cut = format!(
        "{}... (cut at {MAX_ERROR_FIELD} bytes)",
        &long[..MAX_ERROR_FIELD - 1]
    );
    for (value, message, kind) in [
        (r#""server busy""#, "server busy", ErrorType::Other),
        (
            "the model crashed: {oops}",
            "the model crashed: {oops}",
            ErrorType::Other,
        ),
        (
            r#"{"code":503,"message":"loading model"}"#,
            "loading model",
            ErrorType::Overloaded,
        ),
        (
            r#"{"message":"m","type":"rate_limit_error"}"#,
            "m",
            ErrorType::RateLimit,
        ),
        (&long, &cut, ErrorType::Other),
    ] {
        let stream = format!("error: {value}\n\ndata: [DONE]\n\n");
        let (end, mut ins) = read(&stream, 0, chat());
        assert_eq!(end, Some(value.len() + 9), "{message}");
        assert_eq!(ins.tokens().error, Some(kind), "{message}");
        assert_eq!(ins.error_field_message(), Some(message));
        let error = ins
            .take_assembler()
            .unwrap()
            .provider_error()
            .cloned()
            .unwrap();
        match &error["error"] {
            Value::String(m) => assert_eq!(m, message),
            e => assert_eq!(e["message"], message),
        }
    }
}

/// Audit YC 1: a block with data is the data's event, the field ignored; a stream read for
/// its usage only keeps the standard's reading, the field ignored there too.
#[test]
fn a_block_with_data_or_a_usage_only_reading_ignores_the_field() {
    let stream = format!("error: {VALUE}\n{CHUNK}\n\ndata: [DONE]\n\n");
    let (end, ins) = read(&stream, 0, chat());
    assert_eq!(end, None);
    assert_eq!(ins.tokens().error, None);
    assert_eq!(ins.tokens().output_events, 1, "the data delivered");
    assert_eq!(ins.error_field_message(), None);
    let stream = format!("error: {VALUE}\n\n");
    let usage_only = Inspector::new(Format::Responses, true).reading_usage_only();
    let (end, ins) = read(&stream, 0, usage_only);
    assert_eq!(end, None);
    assert_eq!(ins.tokens().error, None);
}
