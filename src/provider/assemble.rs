//! Rebuilding the one JSON document a provider answers a request that did not stream, from
//! the events of the stream the gateway asked for instead (`stream_upstream`): the same ids,
//! model, content, refusal, reasoning / thinking (with Anthropic's signatures), tool calls
//! with their arguments joined, choices, logprobs, stop reasons and usage. And, when a limit
//! cuts the stream after output came, the partial answer: what was generated so far, marked
//! as cut for length, with the usage so far.
//!
//! Each event's data is gathered once (in a buffer reused from event to event) and its text
//! appended once to the answer being built; the answer is bounded by `limit` bytes.

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::http::sse::{data_text, EndMarker};
use crate::provider::Format;

mod chat;
mod messages;
mod responses;

use chat::Chat;
use messages::Messages;
use responses::Responses;

/// The most room the buffer of an event's data keeps for the next event.
const KEPT_ROOM: usize = 64 * 1024;

/// Why no document could be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssembleError {
    #[error("the answer is larger than max_response_body ({limit} bytes)")]
    TooLarge { limit: usize },
    #[error("the stream ended before its answer began")]
    Empty,
    /// An event could not be read: what it held is missing from the answer, which must not
    /// then be given as whole.
    #[error("{0}")]
    Malformed(String),
}

/// Tokens of a cut answer that its provider did not report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// The prompt's input tokens, without the cache reads and writes Anthropic counts apart
    /// (OpenAI's prompt tokens are all input).
    pub prompt: u64,
    pub completion: u64,
}

/// The reasoning text of an answer whose provider did not report its usage, to count its
/// tokens as the output's are counted (`Tokens::estimated_completion`): each event that
/// carried some at least one token, four bytes a token.
#[derive(Debug, Clone, Copy, Default)]
struct Reasoning {
    events: u64,
    bytes: u64,
}

impl Reasoning {
    fn add(&mut self, text: &str) {
        if !text.is_empty() {
            self.events += 1;
            self.bytes = self.bytes.saturating_add(text.len() as u64);
        }
    }

    fn join(&mut self, other: Reasoning) {
        self.events += other.events;
        self.bytes = self.bytes.saturating_add(other.bytes);
    }

    fn seen(self) -> bool {
        self.events > 0
    }

    /// Its tokens, part of the `completion` tokens and so never more.
    fn tokens(self, completion: u64) -> u64 {
        self.events.max(self.bytes.div_ceil(4)).min(completion)
    }
}

/// The answer being rebuilt from one stream.
#[derive(Debug, Clone)]
pub struct Assembler {
    format: Format,
    limit: usize,
    too_large: bool,
    buf: Vec<u8>,
    /// The provider's own error event, whole, if it sent one.
    error: Option<Value>,
    /// Events with data so far, to name the one that could not be read.
    events: u64,
    /// Why the first event that could not be read was not: the answer is then a 502.
    malformed: Option<String>,
    chat: Chat,
    messages: Messages,
    responses: Responses,
}

impl Assembler {
    pub fn new(format: Format, limit: usize) -> Self {
        Self {
            format,
            limit,
            too_large: false,
            buf: Vec::new(),
            error: None,
            events: 0,
            malformed: None,
            chat: Chat::default(),
            messages: Messages::default(),
            responses: Responses::default(),
        }
    }

    /// The next piece of the current event's data.
    #[inline]
    pub fn data(&mut self, piece: &[u8]) {
        if self.too_large {
            return;
        }
        if self.buf.len() + piece.len() + self.counted_len() > self.limit {
            self.too_large = true;
            self.buf = Vec::new();
            return;
        }
        self.buf.extend_from_slice(piece);
    }

    /// The end of one `data` line of the event.
    pub fn line_end(&mut self) {
        self.data(b"\n");
    }

    /// The event ended; `dispatched`: it had data; `error`: it is the provider's error event,
    /// as the inspector decides it (`event: error`, or a data-only error object: see
    /// `inspect`), so that what ends a stream for a streaming client is the same event that
    /// makes the error answer here.
    pub fn event_end(&mut self, dispatched: bool, error: bool) {
        let data = std::mem::take(&mut self.buf);
        if dispatched {
            self.events += 1;
        }
        if dispatched && !self.failed() {
            let bytes = trim_end_newline(&data);
            // Read as a client that streams decodes it (audit UE 1: one invalid byte, U+FFFD
            // to such a client, made the whole answer a 502 here).
            let text = data_text(bytes);
            if error {
                self.error = serde_json::from_str(&text).ok();
            } else if !text.is_empty() && !EndMarker::is(bytes) {
                // The end marker by the rule the inspector ends the stream by (audit UE 2:
                // `[DONE]x` ended a streaming client's answer and failed a whole one here).
                let read = match self.format {
                    Format::Chat => self.chat.event(&text),
                    Format::Messages => self.messages.event(&text),
                    Format::Responses => self.responses.event(&text),
                };
                // Not skipped: a document rebuilt without it would look whole and not be.
                // Its text is not quoted: it is the model's output, and may be long.
                if let Err(e) = read {
                    self.malformed = Some(format!(
                        "event {} of the stream is no {} event the gateway can read ({e})",
                        self.events,
                        match self.format {
                            Format::Chat => "Chat Completions",
                            Format::Messages => "Anthropic Messages",
                            Format::Responses => "Responses",
                        }
                    ));
                }
            }
        }
        // The buffer's room is reused by the next event; the room of one large event (a
        // long tool call's arguments in one piece) is let go rather than held while the
        // stream lasts beside the answer it went into.
        if data.capacity() <= KEPT_ROOM {
            self.buf = data;
            self.buf.clear();
        }
        if self.answer_len() > self.limit {
            self.too_large = true;
        }
    }

    /// The provider's error came as a block with an `error` field and no data (see
    /// `inspect::error_field`), read as the data-only error event `error` (`{"error":VALUE}`)
    /// would be by `event_end`.
    pub fn error_field(&mut self, error: Value) {
        if !self.failed() {
            self.error = Some(error);
        }
    }

    /// Bytes the answer holds so far, as its `limit` counts them: the event being gathered
    /// and the answer's text. What it takes from the memory answers share
    /// (`response_body_memory`) follows this.
    pub fn held(&self) -> usize {
        self.buf.len() + self.counted_len()
    }

    /// The answer's bytes as counted beside the event being gathered: without what that
    /// event may replace when read (a Responses part's joined logprobs, which its
    /// `content_part.done` and the final response repeat whole). Both live while it is
    /// gathered, an answer's memory then at most twice its limit for that event's time.
    fn counted_len(&self) -> usize {
        match self.format {
            Format::Responses => self.answer_len() - self.responses.replaceable(),
            _ => self.answer_len(),
        }
    }

    /// Bytes of text held by the answer so far (an upper bound of what it adds).
    fn answer_len(&self) -> usize {
        match self.format {
            Format::Chat => self.chat.text,
            Format::Messages => self.messages.text,
            Format::Responses => self.responses.text,
        }
    }

    /// Whether the answer can only end as an error: it passed its limit, or an event could
    /// not be read.
    pub fn failed(&self) -> bool {
        self.too_large || self.malformed.is_some()
    }

    /// The provider's own error event, if it sent one.
    pub fn provider_error(&self) -> Option<&Value> {
        self.error.as_ref()
    }

    /// Whether any model output arrived (text, reasoning, a tool call).
    pub fn format(&self) -> Format {
        self.format
    }

    pub fn has_output(&self) -> bool {
        match self.format {
            Format::Chat => self.chat.output,
            Format::Messages => self.messages.output,
            Format::Responses => self.responses.output,
        }
    }

    /// Whether the answer came whole, all but the stream's own end (`message_stop`, `[DONE]`,
    /// the close): Anthropic's stop reason came (after every block), every Chat choice
    /// finished and the usage that follows them came, the Responses answer completed. A cut
    /// then took nothing from it.
    pub fn whole(&self) -> bool {
        match self.format {
            Format::Chat => self.chat.whole(),
            Format::Messages => self.messages.whole(),
            Format::Responses => self.responses.done,
        }
    }

    /// Whether the answer has ended, though more of its stream may follow: `whole`, or a
    /// Chat answer whose every choice that came finished and whose usage chunk has not come
    /// yet. (Choices the request asked for that never came are the inspector's to tell:
    /// `Inspector::answer_ended`.)
    pub fn ended(&self) -> bool {
        match self.format {
            Format::Chat => self.chat.ended(),
            _ => self.whole(),
        }
    }

    /// Gives a Chat answer that ended without its usage chunk the usage `used`, counted or
    /// estimated as a partial answer's is. (Anthropic's and the Responses API's usage comes
    /// in the events that end their answers.)
    pub fn fill_missing_usage(&mut self, used: Usage) {
        if self.format == Format::Chat {
            self.chat.fill_missing_usage(used);
        }
    }

    /// The document the provider would have answered. `cut`: the stream was cut by a limit
    /// (with what it used so far, where the provider did not say): the partial answer.
    pub fn finish(self, cut: Option<Usage>) -> Result<Vec<u8>, AssembleError> {
        if let Some(why) = self.malformed {
            return Err(AssembleError::Malformed(why));
        }
        if self.too_large {
            return Err(AssembleError::TooLarge { limit: self.limit });
        }
        let (out, held) = match self.format {
            // Not a `Value`: a tool use's input is kept as the provider's text.
            Format::Messages => {
                let doc = self.messages.document(cut)?;
                (serde_json::to_vec(&doc), doc.holds_output())
            }
            Format::Chat | Format::Responses => {
                let doc = match self.format {
                    Format::Chat => self.chat.document(cut),
                    _ => self.responses.document(cut),
                }
                .ok_or(AssembleError::Empty)?;
                (serde_json::to_vec(&doc), holds_output(&doc))
            }
        };
        // A cut that kept nothing (a tool call cut mid-way is dropped, its arguments not
        // JSON) has no partial answer to give: an empty assistant turn is not one.
        if cut.is_some() && !held {
            return Err(AssembleError::Empty);
        }
        let out = out.expect("a JSON document serialises");
        if out.len() > self.limit {
            return Err(AssembleError::TooLarge { limit: self.limit });
        }
        Ok(out)
    }
}

/// Whether a document holds any model output: a Chat message's content, refusal, reasoning
/// or tool calls; a Responses output item. (A Messages document tells its own:
/// `messages::Document::holds_output`.)
fn holds_output(doc: &Value) -> bool {
    let non_empty = |v: &Value| match v {
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Null => false,
        _ => true,
    };
    if let Some(choices) = doc.get("choices").and_then(Value::as_array) {
        return choices.iter().any(|c| {
            c.get("message")
                .and_then(Value::as_object)
                .is_some_and(|m| m.iter().any(|(k, v)| k != "role" && non_empty(v)))
        });
    }
    doc.get("output").is_some_and(non_empty)
}

/// A head field a chunk left empty: `""`, `0`, `null`.
fn empty(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Number(n) => n.as_u64() == Some(0),
        Value::Null => true,
        _ => false,
    }
}

/// `null`, or an object with nothing in it.
fn empty_object(v: &RawValue) -> bool {
    let t = v.get().trim();
    t == "null"
        || t.strip_prefix('{')
            .and_then(|t| t.strip_suffix('}'))
            .is_some_and(|t| t.trim().is_empty())
}

fn trim_end_newline(data: &[u8]) -> &[u8] {
    data.strip_suffix(b"\n").unwrap_or(data)
}

fn raw(v: &RawValue) -> Value {
    serde_json::from_str(v.get()).unwrap_or(Value::Null)
}

/// Arguments that parse as JSON: a tool call cut mid-way has none and is dropped.
pub(super) fn whole_json(text: &str) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

fn append(block: &mut Map<String, Value>, key: &str, text: &str) {
    match block.get_mut(key) {
        Some(Value::String(s)) => s.push_str(text),
        _ => {
            block.insert(key.to_owned(), Value::String(text.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests;
