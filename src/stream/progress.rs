//! What each piece of a response body means to the limits: which events it completes, whether
//! one carried model output (the first token, and from then on the idle clock), and where the
//! provider's own error event ended. Read once per piece, by the watchdog as the body streams
//! and by an attempt that holds its head until the first token: both decide the first token
//! here and nowhere else.

use crate::http::sse::{LeftOut, SseScanner};
use crate::provider::assemble::Assembler;
use crate::provider::inspect::{Inspector, Tokens};

/// The reader of one response body.
#[derive(Debug, Clone)]
pub struct Progress {
    reader: Reader,
}

#[derive(Debug, Clone)]
enum Reader {
    /// Anything but SSE text; a known format (JSON) is still read for its usage. `leading`:
    /// a JSON document of a known format whose first byte other than whitespace has not come
    /// (see `read`).
    Opaque {
        inspector: Option<Inspector>,
        leading: bool,
    },
    /// SSE of a format the gateway does not know: events only.
    Events(SseScanner),
    /// SSE of a known format: the inspector reads the events' data as the scanner passes.
    Inspected(Inspector),
}

/// What one piece of the body held.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// Model output arrived: an event that carries some (with a known format), any event
    /// that dispatches (an SSE body of unknown format), or any byte (any other body).
    pub output: bool,
    /// SSE events dispatched in this piece other than keep-alives and errors: `event: ping`
    /// or `keepalive`, and, with a known format, the same sent data only (`{"type":"ping"}`).
    pub events: u32,
    /// Offset just past the last complete SSE event in the piece.
    pub boundary: Option<usize>,
    /// The provider's own error event (`event: error`, or a data-only error object that the
    /// inspector recognises) ended at this offset; nothing after it is read.
    pub error_end: Option<usize>,
    /// An event the inspector leaves out of what the client gets ended in this piece (see
    /// `Inspector::hiding_usage`).
    pub left_out: Option<LeftOut>,
    /// The provider's error at `error_end` came as a block with an `error` field and no data,
    /// which clients skip: where it lies, to put an event they read in its place (see
    /// `SseScanner`'s `Scan::error_field`).
    pub error_field: Option<LeftOut>,
}

impl Progress {
    /// A reader of an SSE body (`sse`) or any other, with the inspector of its format when
    /// that is known (made for the same kind of body).
    pub fn new(sse: bool, inspector: Option<Inspector>) -> Self {
        let reader = match (sse, inspector) {
            (false, inspector) => Reader::Opaque {
                leading: inspector.is_some(),
                inspector,
            },
            (true, None) => Reader::Events(SseScanner::new()),
            (true, Some(inspector)) => Reader::Inspected(inspector),
        };
        Self { reader }
    }

    /// The body that just ended by itself ended short: an SSE body with half an event, or
    /// (a known format) without the event that ends an answer; a JSON document of a known
    /// format inside a value. See `Inspector::ended_short`.
    pub fn ended_short(&self) -> bool {
        match &self.reader {
            Reader::Opaque { inspector, .. } => {
                inspector.as_ref().is_some_and(Inspector::ended_short)
            }
            Reader::Events(s) => s.open_event(),
            Reader::Inspected(i) => i.ended_short(),
        }
    }

    /// The SSE answer of a known format has ended (see `Inspector::answer_ended`): nothing
    /// that cuts the stream now leaves it short.
    pub fn answer_ended(&self) -> bool {
        matches!(&self.reader, Reader::Inspected(i) if i.answer_ended())
    }

    /// The SSE answer of a known format had its end marker before it ended (see
    /// `Inspector::ended_early`): the stream is short now.
    pub fn ended_early(&self) -> bool {
        matches!(&self.reader, Reader::Inspected(i) if i.ended_early())
    }

    /// The SSE answer of a known format has had its final event (see
    /// `Inspector::answer_over`).
    pub fn answer_over(&self) -> bool {
        matches!(&self.reader, Reader::Inspected(i) if i.answer_over())
    }

    pub fn is_sse(&self) -> bool {
        !matches!(self.reader, Reader::Opaque { .. })
    }

    /// The `sequence_number` of an event appended to a Responses stream (see
    /// `Inspector::next_sequence_number`).
    pub fn next_sequence_number(&self) -> Option<u64> {
        match &self.reader {
            Reader::Inspected(i) => i.next_sequence_number(),
            _ => None,
        }
    }

    /// The provider's message of an error that came as an `error` field (see
    /// `Inspector::error_field_message`).
    pub fn error_field_message(&self) -> Option<&str> {
        match &self.reader {
            Reader::Inspected(i) => i.error_field_message(),
            _ => None,
        }
    }

    /// What the inspector counted so far, when the format is known.
    pub fn tokens(&self) -> Option<Tokens> {
        match &self.reader {
            Reader::Opaque { inspector, .. } => inspector.as_ref().map(Inspector::tokens),
            Reader::Events(_) => None,
            Reader::Inspected(i) => Some(i.tokens()),
        }
    }

    /// The provider's error event ended with the last piece's final byte, a CR: the next
    /// piece says whether an LF belongs to it (see `SseScanner::error_pending`).
    pub fn error_pending(&self) -> bool {
        match &self.reader {
            Reader::Opaque { .. } => false,
            Reader::Events(s) => s.error_pending(),
            Reader::Inspected(i) => i.error_pending(),
        }
    }

    /// The SSE body so far ends in the CR of a blank line, perhaps half a CRLF (see
    /// `SseScanner::ends_in_blank_cr`).
    pub fn ends_in_blank_cr(&self) -> bool {
        match &self.reader {
            Reader::Opaque { .. } => false,
            Reader::Events(s) => s.ends_in_blank_cr(),
            Reader::Inspected(i) => i.ends_in_blank_cr(),
        }
    }

    /// Whether the document rebuilt from the stream can only end as an error.
    pub fn answer_failed(&self) -> bool {
        match &self.reader {
            Reader::Inspected(i) => i.answer_failed(),
            _ => false,
        }
    }

    /// Bytes the document rebuilt from the stream holds so far; 0 without one.
    pub fn answer_held(&self) -> usize {
        match &self.reader {
            Reader::Inspected(i) => i.answer_held(),
            _ => 0,
        }
    }

    /// The document rebuilt from the stream, when its inspector rebuilds one.
    pub fn take_assembler(&mut self) -> Option<Assembler> {
        match &mut self.reader {
            Reader::Inspected(i) => i.take_assembler(),
            _ => None,
        }
    }

    /// The tool calls the answer asked for, when its inspector gathers them.
    pub fn tool_calls(&mut self) -> Option<(Vec<u8>, String)> {
        match &mut self.reader {
            Reader::Opaque {
                inspector: Some(i), ..
            }
            | Reader::Inspected(i) => i.tool_calls(),
            _ => None,
        }
    }

    /// Reads the next piece of the body. Pieces may split it anywhere.
    #[inline]
    pub fn read(&mut self, data: &[u8]) -> Read {
        let (scan, output) = match &mut self.reader {
            Reader::Opaque { inspector, leading } => {
                if let Some(inspector) = inspector {
                    inspector.feed(data);
                }
                // A JSON document of a known format begins at its first byte other than
                // JSON whitespace: DeepSeek sends blank lines while a request that does not
                // stream waits in its queue (audit WB 4), and they are no more the first
                // token than an SSE comment is. Once it began, every byte is.
                if *leading {
                    *leading = data
                        .iter()
                        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
                }
                return Read {
                    output: !(data.is_empty() || *leading),
                    ..Read::default()
                };
            }
            Reader::Events(scanner) => {
                let scan = scanner.scan(data);
                (scan, scan.progress > 0)
            }
            Reader::Inspected(inspector) => inspector.read(data),
        };
        Read {
            output,
            events: scan.progress,
            boundary: scan.last_boundary,
            error_end: scan.error_end,
            left_out: scan.left_out,
            error_field: scan.error_field,
        }
    }
}
