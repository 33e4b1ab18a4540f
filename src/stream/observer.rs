//! What a stream tells the one who watches it (the request's record): its first token, its
//! data, what the inspector counted, and how it ended.

use tokio::time::Instant;

use crate::error::GatewayError;
use crate::provider::inspect::Tokens;
use crate::provider::ErrorType;

/// How a stream ended, as the watchdog saw it.
#[derive(Debug)]
pub enum StreamEnd {
    /// The upstream body ended cleanly.
    Complete,
    /// A limit fired or the upstream failed; the client was told.
    Cut(GatewayError),
    /// The answer was whole when `code` (a limit, a failure, a shutdown) stopped what was
    /// left of the stream (the framing's end, a usage chunk): complete, and the log says
    /// what ended it.
    WholeThen(&'static str),
    /// The upstream sent its own `event: error`; it was passed through and ended the stream.
    UpstreamErrorEvent,
    /// The client took nothing for `send_timeout`: the upstream call was ended and the
    /// stream is aborted (an HTTP/2 stream reset), as a client's connection is closed then.
    SendTimeout,
}

/// Told what happens on the stream. Dropping the observer without `finish` means the client
/// went away first.
pub trait Observer {
    /// The first event that carries model output (with a known format; otherwise the first
    /// data event, or the first byte of a non-SSE body).
    fn first_token(&mut self, at: Instant);
    /// Bytes of the upstream's body as they came, held or not.
    fn data(&mut self, len: usize);
    /// Bytes the gateway wrote itself (the error event that ends a cut stream): sent to the
    /// client, but no byte of the upstream's.
    fn own_data(&mut self, len: usize) {
        self.data(len);
    }
    /// Bytes handed to the client, the upstream's and the gateway's own: told as each frame
    /// leaves, so held bytes later dropped are never counted.
    fn handed(&mut self, len: usize);
    fn finish(&mut self, end: StreamEnd);
    /// The answer ended, but the client's connection ended before it took the answer's end:
    /// the client did not get it whole, however it ended for the upstream.
    fn undelivered(&mut self) {}
    /// What the inspector counted, told once when the body is dropped (only with one).
    fn tokens(&mut self, _tokens: Tokens) {}
    /// The type of the provider's error event, when one came and its type is known (told
    /// once when the body is dropped, with or without an inspector: Gemini's stream has none).
    fn provider_error(&mut self, _kind: Option<ErrorType>) {}
    /// The tool calls the answer asked for (canonical form, first name), told once when the
    /// body is dropped (only when they were gathered).
    fn tool_calls(&mut self, _calls: Option<(Vec<u8>, String)>) {}
}
