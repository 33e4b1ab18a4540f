//! What one event says, as the inspector reads it: filled in by the JSON reader as its data
//! passes and decided when the event dispatches.

use crate::http::sse::EndMarker;
use crate::provider::ErrorType;

/// What the event being read says, decided when it dispatches.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Event {
    /// Something that is model output if the event's shape says so (a non-empty delta),
    /// besides the output strings, whose bytes `output_bytes` counts.
    pub(super) output: bool,
    pub(super) output_bytes: u64,
    /// A piece of the event's data has been read (the next is not its first).
    pub(super) data_read: bool,
    /// A top-level `choices` array: a Chat Completions chunk.
    pub(super) choices: bool,
    /// What the top-level `type` names.
    pub(super) kind: Kind,
    /// Whether the data is OpenAI's end marker (`sse::EndMarker`: the rule the document
    /// rebuilt from the stream ends by too).
    pub(super) done: EndMarker,
    /// The answer's end: a choice's non-null `finish_reason`, a `message_delta`'s
    /// `stop_reason`, `message_stop`, or a `response.completed` (`incomplete`, `failed`).
    pub(super) finished: bool,
    /// The event after which nothing of the answer follows: `message_stop`,
    /// `response.completed` (`incomplete`, `failed`).
    pub(super) last: bool,
    /// The Chat choices the event carried, by index (bit `i` for index `i` below 64), and
    /// those of them with a non-null `finish_reason`; `choices_wide`: it carried one whose
    /// index no bit holds (64 or more, or not a plain integer).
    pub(super) choices_seen: u64,
    pub(super) choices_done: u64,
    pub(super) choices_wide: bool,
    /// A top-level `error` object, or `"type": "error"`: the provider's error event.
    pub(super) error: bool,
    /// The top-level `error` is an object (Gemini's error event is only that: see `gemini`).
    pub(super) error_object: bool,
    /// An error nested in the answer (`response.failed`): counted, not an end.
    pub(super) nested_error: bool,
    /// A `response.failed`, with or without an error object.
    pub(super) failed: bool,
    pub(super) error_type: Option<ErrorType>,
    pub(super) error_code: Option<ErrorType>,
    /// A top-level `code` (the Responses API's error event names its type there).
    pub(super) root_code: Option<ErrorType>,
}

/// The top-level `type` of an Anthropic or Responses event.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    #[default]
    None,
    Error,
    /// `content_block_delta`, `content_block_start`, `response.*.delta`: output when what
    /// they carry is not empty.
    Content,
    /// `response.image_generation_call.partial_image`: output whatever it carries (a partial
    /// image is model output, and the image's events have no delta; audit KE 2).
    Output,
    /// `response.output_item.done`: output when its item carries output (a message's text, a
    /// call's arguments) and no output event came before it, for an item may come whole without
    /// deltas (audit KE 2); after its deltas it only repeats them.
    Item,
    /// `ping`, `keepalive`: framing, and a keep-alive for the idle limit too, should it come
    /// without its `event:` line (the scanner takes one with it for a keep-alive; audit KE 3).
    KeepAlive,
    /// The other events of these formats: framing, never output.
    Framing,
    /// A type this reader does not know.
    Unknown,
}

pub(super) fn event_kind(name: &[u8]) -> Kind {
    match name {
        b"error" => Kind::Error,
        b"content_block_delta" | b"content_block_start" => Kind::Content,
        // `keepalive`: the Responses API's heartbeat.
        b"ping" | b"keepalive" => Kind::KeepAlive,
        b"message_start" | b"message_delta" | b"message_stop" | b"content_block_stop" => {
            Kind::Framing
        }
        b"response.image_generation_call.partial_image" => Kind::Output,
        b"response.output_item.done" => Kind::Item,
        n if n.starts_with(b"response.") && n.ends_with(b".delta") => Kind::Content,
        n if n.starts_with(b"response.") => Kind::Framing,
        _ => Kind::Unknown,
    }
}

impl Event {
    /// Whether the event carries model output, if its shape says it is output at all: a
    /// non-empty output string, or a part of a delta that is output whatever its length.
    #[inline]
    pub(super) fn is_output(&self) -> bool {
        self.output || self.output_bytes > 0
    }

    /// Follows whether the event's data is `[DONE]` (the end marker of OpenAI streams).
    #[inline]
    pub(super) fn note_done(&mut self, data: &[u8]) {
        self.done.note(data);
    }
}
