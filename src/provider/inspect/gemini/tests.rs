//! Break audit YB 1: Gemini's error event read from its native stream, in any pieces.

use super::*;

const CHUNK: &str = "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hi\"}],\"role\": \"model\"}}],\"usageMetadata\": {\"promptTokenCount\": 3},\"modelVersion\": \"gemini-2.0-flash\"}\r\n\r\n";
const ERROR: &str = "data: {\"error\": {\"code\": 429, \"message\": \"Resource has been exhausted\", \"status\": \"RESOURCE_EXHAUSTED\"}}\r\n\r\n";

/// Everything a stream's pieces said, read whole.
struct Got {
    output_at: Vec<usize>,
    error_end: Option<usize>,
    error: Option<ErrorType>,
}

/// Reads `stream` cut at `cuts` (offsets), as a body's frames would bring it.
fn read(stream: &str, cuts: &[usize]) -> Got {
    let mut g = GeminiErrors::new();
    let (mut output_at, mut error_end, mut from) = (Vec::new(), None, 0);
    let bytes = stream.as_bytes();
    for &to in cuts.iter().chain(std::iter::once(&bytes.len())) {
        let (scan, output) = g.read(&bytes[from..to]);
        if output {
            output_at.push(from);
        }
        if let (None, Some(end)) = (error_end, scan.error_end) {
            error_end = Some(from + end);
            break;
        }
        from = to;
    }
    Got {
        output_at,
        error_end,
        error: g.error(),
    }
}

#[test]
fn the_paths_of_geminis_native_stream() {
    assert!(streams(
        "/v1beta/models/gemini-2.0-flash:streamGenerateContent"
    ));
    assert!(streams("/v1/models/m:streamGenerateContent?alt=sse&key=k"));
    assert!(!streams("/v1beta/models/m:generateContent"));
    assert!(!streams("/v1/chat/completions"));
    assert!(!streams("/x?q=:streamGenerateContent"));
}

/// The error event, whole or split anywhere, ends the stream at its blank line, typed by its
/// code; it is no output, and the chunks before it are.
#[test]
fn an_error_event_is_read_in_any_pieces_and_is_no_output() {
    let stream = format!("{CHUNK}{ERROR}data: {{\"candidates\": []}}\r\n\r\n");
    let end = CHUNK.len() + ERROR.len();
    let whole = read(&stream, &[]);
    assert_eq!(whole.error_end, Some(end));
    assert_eq!(whole.error, Some(ErrorType::RateLimit));
    assert_eq!(whole.output_at, vec![0], "one piece: the chunk's output");
    for cut in 1..stream.len() {
        let got = read(&stream, &[cut]);
        assert_eq!(got.error_end, Some(end), "cut at {cut}");
        assert_eq!(got.error, Some(ErrorType::RateLimit), "cut at {cut}");
        // Output in the piece that completed the chunk (its blank line's CR does), never in
        // one that held only the error.
        let chunk_done = if cut >= CHUNK.len() - 1 { 0 } else { cut };
        assert_eq!(got.output_at, vec![chunk_done], "cut at {cut}");
    }
    // Before any output: no output at all.
    let alone = read(ERROR, &[]);
    assert_eq!(
        (alone.error_end, alone.output_at.len()),
        (Some(ERROR.len()), 0)
    );
}

/// The code types the error as the status it is: a 503 an overload, a 500 a server error,
/// a 400 the request's, a 504 a timeout; without a code, `other`. A data line per line of a
/// pretty-printed error is one event all the same.
#[test]
fn the_code_gives_the_type() {
    for (code, ty) in [
        ("503", ErrorType::Overloaded),
        ("500", ErrorType::Server),
        ("400", ErrorType::InvalidRequest),
        ("504", ErrorType::Timeout),
        ("403", ErrorType::Permission),
    ] {
        let event = format!(
            "data: {{\n data:   \"error\": {{\n data:     \"code\": {code},\n data:     \"status\": \"X\"\n data:   }}\n data: }}\n\n"
        )
        .replace("\n data:", "\ndata:");
        let got = read(&event, &[]);
        assert_eq!(got.error, Some(ty), "{event}");
        assert_eq!(got.error_end, Some(event.len()), "{event}");
    }
    let got = read("data: {\"error\": {\"message\": \"m\"}}\n\n", &[]);
    assert_eq!(got.error, Some(ErrorType::Other));
}

/// Only a data-only event whose top-level `error` is an object is the error: an `error`
/// string, one nested in a candidate, or `event: error` (which the scanner ends the stream
/// at by itself) are not read as Gemini's; a keep-alive comment is no output.
#[test]
fn only_a_top_level_error_object_is_the_error_event() {
    for event in [
        "data: {\"error\": \"text\"}\n\n",
        "data: {\"candidates\": [{\"error\": {\"code\": 500}}]}\n\n",
        "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"{\\\"error\\\": {}}\"}]}}]}\n\n",
    ] {
        let got = read(event, &[]);
        assert_eq!((got.error, got.error_end), (None, None), "{event}");
        assert_eq!(got.output_at, vec![0], "{event}");
    }
    let got = read("event: error\ndata: {\"error\": {\"code\": 429}}\n\n", &[]);
    assert_eq!(got.error, None);
    assert!(got.error_end.is_some());
    assert!(got.output_at.is_empty());
    let got = read(": keep-alive\n\n", &[]);
    assert!(got.output_at.is_empty() && got.error_end.is_none());
}
