//! Gemini's native stream (`POST …/models/M:streamGenerateContent?alt=sse`), read for its
//! error events and nothing else.
//!
//! Its events are data-only JSON, and so is its error mid-stream: `data: {"error":{"code":429,
//! "message":"…","status":"RESOURCE_EXHAUSTED"}}`. Read as a stream of unknown format, that
//! event was output: the request logged `ok`, and the error was its first token (break audit
//! YB 1, where the event was the cut of another Hourglass further down a chain, written in
//! Gemini's shape for google-genai). Whether a request is such a stream is decided once, from
//! its path, whatever the upstream's `api` (a gateway in front of another knows none); no
//! other stream pays for this reading. Its text and usage are not read: every event but the
//! error is a token, as on any stream of unknown format.

use super::event::Event;
use super::json::Json;
use super::tokens::Tokens;
use crate::http::sse::{EventSink, EventType, Scan, SseScanner};
use crate::provider::ErrorType;

/// Whether a request to `path` (its query allowed) streams Gemini's native API.
pub fn streams(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or_default();
    path.ends_with(":streamGenerateContent")
}

/// The reader of one Gemini SSE stream: its events, and its error event.
#[derive(Debug, Clone, Default)]
pub struct GeminiErrors {
    scanner: SseScanner,
    sink: Sink,
}

#[derive(Debug, Clone, Default)]
struct Sink {
    /// The inspector's tokenizer, for the top-level `error` object and its numeric `code`;
    /// it skips everything under `candidates` and `usageMetadata` as containers it does not
    /// track.
    json: Json,
    event: Event,
    /// What the tokenizer counts besides (Gemini names no key it reads): never looked at.
    unread: Tokens,
    /// The error event came: its type, by its code.
    error: Option<ErrorType>,
}

impl EventSink for Sink {
    #[inline]
    fn data(&mut self, value: &[u8]) {
        self.json
            .feed(value, &mut self.event, &mut self.unread, &mut ());
    }

    #[inline]
    fn data_line_end(&mut self) {
        self.json.line_break();
    }

    fn end_event(&mut self, dispatched: bool, kind: EventType) -> bool {
        let ev = std::mem::take(&mut self.event);
        let code = self.json.error_status();
        self.json.reset();
        // `event: error` the scanner ends the stream at by itself; a keep-alive is none.
        if !(dispatched && kind == EventType::Other && ev.error_object) {
            return false;
        }
        // The code is the HTTP status Gemini answers the error with unstreamed (429, 503,
        // 400): typed as that status, so that before any output a route fails over on it
        // as on the status itself.
        self.error = Some(
            code.and_then(ErrorType::from_status)
                .unwrap_or(ErrorType::Other),
        );
        true
    }
}

impl GeminiErrors {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the next piece of the stream: what the scanner found, and whether an event other
    /// than a keep-alive or the error dispatched in it (the output of a stream whose text is
    /// not read). After the error event nothing is read.
    #[inline]
    pub fn read(&mut self, chunk: &[u8]) -> (Scan, bool) {
        let before = self.sink.error.is_some();
        let mut scan = self.scanner.scan_with(chunk, &mut self.sink);
        if !before && self.sink.error.is_some() {
            // The scanner counts a data-only event as progress; this one is no output.
            scan.progress = scan.progress.saturating_sub(1);
        }
        (scan, scan.progress > 0)
    }

    /// The provider's error event came: its type (by its `code`).
    pub fn error(&self) -> Option<ErrorType> {
        self.sink.error
    }

    /// See `SseScanner::error_pending`.
    pub fn error_pending(&self) -> bool {
        self.scanner.error_pending()
    }

    /// See `SseScanner::ends_in_blank_cr`.
    pub fn ends_in_blank_cr(&self) -> bool {
        self.scanner.ends_in_blank_cr()
    }

    /// See `SseScanner::open_event`.
    pub fn open_event(&self) -> bool {
        self.scanner.open_event()
    }
}

#[cfg(test)]
mod tests;
