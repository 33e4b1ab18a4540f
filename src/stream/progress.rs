//! What each piece of a response body means to the limits: which events it completes, whether
//! one carried model output (the first token, and from then on the idle clock), and where the
//! provider's own error event ended. Read once per piece, by the watchdog as the body streams
//! and by an attempt that holds its head until the first token: both decide the first token
//! here and nowhere else.

use crate::error::StreamErrorShape;
use crate::http::sse::{LeftOut, SseScanner};
use crate::provider::assemble::Assembler;
use crate::provider::inspect::gemini::GeminiErrors;
use crate::provider::inspect::ndjson::NdjsonEnd;
use crate::provider::inspect::{Inspector, Tokens};
use crate::provider::ErrorType;

/// The reader of one response body.
#[derive(Debug, Clone)]
pub struct Progress {
    reader: Reader,
    /// Gemini's native stream (`gemini_errors`), whatever reads it.
    gemini: bool,
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
    /// Gemini's native stream, of no format the upstream's `api` reads: events, and its
    /// data-only error event (see `provider::inspect::gemini`).
    Gemini(GeminiErrors),
    /// An NDJSON answer (Ollama's), read for its `"done": true` line: the answer's end.
    Lines(NdjsonEnd),
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
        Self {
            reader,
            gemini: false,
        }
    }

    /// Reads an SSE body of no known format as Gemini's native stream, for its error event,
    /// when `gemini` (its request's path says so: `gemini::streams`). Decided once per
    /// request: every other stream is read as before, at no cost.
    pub fn gemini_errors(mut self, gemini: bool) -> Self {
        if gemini && matches!(self.reader, Reader::Events(_)) {
            self.reader = Reader::Gemini(GeminiErrors::new());
        }
        self.gemini = gemini;
        self
    }

    /// Reads a body of no known format as NDJSON (`lines`: a 2xx `application/x-ndjson`
    /// answer), for the line that ends its answer (see `provider::inspect::ndjson`): once
    /// that line ended, the answer is whole, as an SSE answer is at its final event, and what
    /// stops the stream after it (the upstream holding its connection open, a limit) is no
    /// error (break audit YB 3). Every byte is still a token, as of any body that is not SSE.
    pub fn ndjson(mut self, lines: bool) -> Self {
        if lines
            && matches!(
                self.reader,
                Reader::Opaque {
                    inspector: None,
                    ..
                }
            )
        {
            self.reader = Reader::Lines(NdjsonEnd::new());
        }
        self
    }

    /// How a cut of this SSE body writes its error: in Gemini's shape on its native stream,
    /// which google-genai reads and a gateway in front reads as this one reads it (WB 6,
    /// break audit YB 1); else `event: error`.
    pub fn error_shape(&self) -> StreamErrorShape {
        if self.gemini {
            StreamErrorShape::Gemini
        } else {
            StreamErrorShape::Event
        }
    }

    /// The type of the provider's error event, when one came and its type is known (a
    /// format's error, typed by the inspector; Gemini's, by its code).
    pub fn error_type(&self) -> Option<ErrorType> {
        match &self.reader {
            Reader::Inspected(i) => i.tokens().error,
            Reader::Gemini(g) => g.error(),
            _ => None,
        }
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
            Reader::Gemini(g) => g.open_event(),
            Reader::Lines(_) => false,
        }
    }

    /// The SSE answer of a known format has ended (see `Inspector::answer_ended`), or the
    /// `"done": true` line of an NDJSON one (`ndjson`): nothing that cuts the stream now
    /// leaves it short.
    pub fn answer_ended(&self) -> bool {
        match &self.reader {
            Reader::Inspected(i) => i.answer_ended(),
            Reader::Lines(l) => l.over(),
            _ => false,
        }
    }

    /// The SSE answer of a known format had its end marker before it ended (see
    /// `Inspector::ended_early`): the stream is short now.
    pub fn ended_early(&self) -> bool {
        matches!(&self.reader, Reader::Inspected(i) if i.ended_early())
    }

    /// The SSE answer of a known format has had its final event (see
    /// `Inspector::answer_over`), or an NDJSON one its `"done": true` line.
    pub fn answer_over(&self) -> bool {
        match &self.reader {
            Reader::Inspected(i) => i.answer_over(),
            Reader::Lines(l) => l.over(),
            _ => false,
        }
    }

    pub fn is_sse(&self) -> bool {
        !matches!(self.reader, Reader::Opaque { .. } | Reader::Lines(_))
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
            Reader::Events(_) | Reader::Gemini(_) | Reader::Lines(_) => None,
            Reader::Inspected(i) => Some(i.tokens()),
        }
    }

    /// The provider's error event ended with the last piece's final byte, a CR: the next
    /// piece says whether an LF belongs to it (see `SseScanner::error_pending`).
    pub fn error_pending(&self) -> bool {
        match &self.reader {
            Reader::Opaque { .. } | Reader::Lines(_) => false,
            Reader::Events(s) => s.error_pending(),
            Reader::Inspected(i) => i.error_pending(),
            Reader::Gemini(g) => g.error_pending(),
        }
    }

    /// The SSE body so far ends in the CR of a blank line, perhaps half a CRLF (see
    /// `SseScanner::ends_in_blank_cr`).
    pub fn ends_in_blank_cr(&self) -> bool {
        match &self.reader {
            Reader::Opaque { .. } | Reader::Lines(_) => false,
            Reader::Events(s) => s.ends_in_blank_cr(),
            Reader::Inspected(i) => i.ends_in_blank_cr(),
            Reader::Gemini(g) => g.ends_in_blank_cr(),
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
            Reader::Gemini(g) => g.read(data),
            Reader::Lines(l) => {
                l.read(data);
                return Read {
                    output: !data.is_empty(),
                    ..Read::default()
                };
            }
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
