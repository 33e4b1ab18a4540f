//! Reading a provider's answer as it passes, without buffering it: which events carry model
//! output (the first token), the token usage the provider reports, an estimate of the output
//! when it reports none, and the provider's own mid-stream errors.
//!
//! [`Inspector`] is fed the body's bytes in whatever pieces they arrive, like `sse`'s scanner,
//! and keeps 248 bytes of state: where it is in the current SSE line, and a small JSON
//! tokenizer (`json`) that tracks only the path of keys that matter (`choices[].delta`,
//! `usage.output_tokens`, `error.type`, ...). String ends are found eight bytes at a time and
//! then with `memchr`; only keys on those paths, and the few values it needs to name (`type`,
//! `code`), are compared, straight from the frame (a string split across frames keeps its
//! first 64 bytes). Usage numbers are read digit by digit, so nothing is parsed into a
//! `serde_json::Value` and nothing is allocated.
//!
//! An event is model output when it is recognised as such:
//!
//! | format | recognised by | model output | usage | error |
//! |---|---|---|---|---|
//! | Chat Completions | a top-level `choices` array | a `choices[].delta` field other than `role` that is non-empty (`content`, `reasoning_content`, `reasoning`, `refusal`, `tool_calls`, `audio`, ...), or legacy `choices[].text` | top-level `usage.{prompt,completion}_tokens` | a top-level `error` object |
//! | Messages | its `type` | `content_block_delta` with a non-empty field besides `type`/`signature`; `content_block_start` of a block other than an empty text or thinking one (`tool_use`, ...) | `message.usage.input_tokens` + cache tokens (prompt), `usage.output_tokens` | `type: "error"`, `error.type` |
//! | Responses | a `type` starting `response.` | a `response.*.delta` event with a non-empty `delta` | `response.usage.{input,output}_tokens` | `type: "error"` (`code`); `response.failed` (`response.error.code`: counted, the stream is not cut) |
//!
//! So role-only preambles (`"content":""`), `message_start`, pings, `content_block_stop`,
//! `response.created` and `data: [DONE]` are not tokens. An event that is not recognised at
//! all (a provider shape Hourglass does not know) counts as a token, as every data event did
//! before formats were known, so an unfamiliar stream cannot starve the first-token limit.
//! Non-streaming JSON bodies are read the same way, for their top-level `usage` only.

use memchr::memchr2;

use self::json::Json;

use crate::provider::{ErrorType, Format};
use crate::sse::LeadingBom;

/// What one call to [`Inspector::feed`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// An event carrying model output was completed in this piece.
    pub output: bool,
    /// The provider's own error event ended at this offset of the piece (just past its blank
    /// line). The inspector stops there: nothing after it is read.
    pub error_end: Option<usize>,
}

/// Where the provider's token counts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Reported,
    Estimated,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reported => "reported",
            Self::Estimated => "estimated",
        }
    }
}

/// What a whole answer cost, as far as the inspector saw it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    /// Prompt tokens the provider reported (Anthropic's include cache reads and writes). Never
    /// estimated: a request body's size says little about its tokens (images, tool schemas).
    pub prompt: Option<u64>,
    /// Completion tokens the provider reported (reasoning/thinking included).
    pub completion: Option<u64>,
    /// Events that carried model output.
    pub output_events: u64,
    /// Bytes of streamed output text (content, reasoning, tool arguments), as escaped JSON.
    pub output_bytes: u64,
    /// The provider's mid-stream error, if it sent one.
    pub error: Option<ErrorType>,
}

impl Tokens {
    /// An estimate of the completion tokens from the deltas seen: about four bytes of text per
    /// token, and at least one per output event (OpenAI streams about one token per chunk).
    pub fn estimated_completion(&self) -> u64 {
        self.output_events.max(self.output_bytes.div_ceil(4))
    }

    /// Completion tokens: the provider's count if it reported one, else the estimate.
    pub fn completion(&self) -> (u64, Source) {
        match self.completion {
            Some(n) => (n, Source::Reported),
            None => (self.estimated_completion(), Source::Estimated),
        }
    }
}

/// Incremental reader of one response body (an SSE stream or a JSON document).
#[derive(Debug, Clone)]
pub struct Inspector {
    format: Format,
    sse: bool,
    line: Line,
    /// The previous piece ended with a CR: an LF starting the next one belongs to it.
    pending_cr: bool,
    bom: LeadingBom,
    /// The open event has a `data` line, so it dispatches at its blank line.
    has_data: bool,
    /// An error event was read; nothing after it is.
    stopped: bool,
    json: Json,
    event: Event,
    tokens: Tokens,
}

/// Where the inspector is in the current SSE line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    Start,
    /// This many bytes of `data` matched as the field name.
    Field(u8),
    /// Just after `data:`: one space may follow.
    DataSpace,
    /// In the value of a `data` line: fed to the JSON reader.
    Data,
    /// This many bytes of `event` matched as the field name.
    EventField(u8),
    /// Just after `event:`: one space may follow.
    EventSpace,
    /// In the value of an `event` line: compared with `ping` and `error`.
    EventValue,
    /// A comment or another field: skipped to its end.
    Skip,
}

/// What the event being read says, decided when it dispatches.
#[derive(Debug, Default, Clone, Copy)]
struct Event {
    /// Something that is model output if the event's shape says so (a non-empty delta).
    output: bool,
    output_bytes: u64,
    /// A top-level `choices` array: a Chat Completions chunk.
    choices: bool,
    /// What the top-level `type` names.
    kind: Kind,
    /// How many bytes of the data matched `[DONE]` from its start, and whether all did.
    done_seen: u8,
    done_ok: bool,
    /// The event's type (its last `event` line) is `ping`: a keep-alive, as for `sse`.
    ping: bool,
    /// The value of the `event` line being read: its length so far, and whether it can
    /// still be `ping` or `error`.
    type_len: u8,
    type_ping: bool,
    type_error: bool,
    /// A top-level `error` object, or `"type": "error"`: the provider's error event.
    error: bool,
    /// An error nested in the answer (`response.failed`): counted, not an end.
    nested_error: bool,
    error_type: Option<ErrorType>,
    error_code: Option<ErrorType>,
    /// A top-level `code` (the Responses API's error event names its type there).
    root_code: Option<ErrorType>,
}

/// The top-level `type` of an Anthropic or Responses event.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Kind {
    #[default]
    None,
    Error,
    /// `content_block_delta`, `content_block_start`, `response.*.delta`: output when what
    /// they carry is not empty.
    Content,
    /// The other events of these formats: framing, never output.
    Framing,
    /// A type this reader does not know.
    Unknown,
}

fn event_kind(name: &[u8]) -> Kind {
    match name {
        b"error" => Kind::Error,
        b"content_block_delta" | b"content_block_start" => Kind::Content,
        b"message_start" | b"message_delta" | b"message_stop" | b"content_block_stop" | b"ping" => {
            Kind::Framing
        }
        n if n.starts_with(b"response.") && n.ends_with(b".delta") => Kind::Content,
        n if n.starts_with(b"response.") => Kind::Framing,
        _ => Kind::Unknown,
    }
}

impl Event {
    /// Follows whether the event's data is `[DONE]` (the end marker of OpenAI streams).
    #[inline]
    fn note_done(&mut self, data: &[u8]) {
        if self.done_seen == 0 {
            self.done_ok = true;
        }
        for &b in data.iter().take(usize::from(6 - self.done_seen.min(6))) {
            self.done_ok &= b == b"[DONE]"[usize::from(self.done_seen)];
            self.done_seen += 1;
        }
    }
}

impl Inspector {
    /// An inspector of an answer in `format`: an SSE stream (`sse`) or a JSON document.
    pub fn new(format: Format, sse: bool) -> Self {
        Self {
            format,
            sse,
            line: Line::Start,
            pending_cr: false,
            bom: LeadingBom::default(),
            has_data: false,
            stopped: false,
            json: Json::default(),
            event: Event::default(),
            tokens: Tokens::default(),
        }
    }

    /// What has been counted so far.
    pub fn tokens(&self) -> Tokens {
        self.tokens
    }

    /// Reads the next piece of the body. Pieces may split it anywhere.
    pub fn feed(&mut self, chunk: &[u8]) -> Found {
        let mut out = Found::default();
        if self.stopped || chunk.is_empty() {
            return out;
        }
        if !self.sse {
            self.json.feed(chunk, &mut self.event, &mut self.tokens);
            return out;
        }
        let mut pos = 0;
        if !self.bom.settled() {
            let broken;
            (pos, broken) = self.bom.skip(chunk);
            if !broken.is_empty() {
                // Content of the first line, which no field name starts with.
                self.line = Line::Skip;
            }
            if !self.bom.settled() {
                return out;
            }
        }
        if self.pending_cr && pos < chunk.len() {
            self.pending_cr = false;
            if chunk[pos] == b'\n' {
                pos += 1;
            }
        }
        while pos < chunk.len() {
            match self.line {
                Line::Start => match chunk[pos] {
                    b'\n' | b'\r' => {
                        pos = self.line_end(chunk, pos);
                        if self.end_event(pos, &mut out) {
                            return out;
                        }
                    }
                    // A whole field name in this piece (nearly always) is taken at once;
                    // else byte by byte, as a name split across pieces must be.
                    b'd' if chunk[pos..].starts_with(b"data:") => {
                        self.has_data = true;
                        self.line = Line::DataSpace;
                        pos += 5;
                    }
                    b'e' if chunk[pos..].starts_with(b"event:") => {
                        self.line = Line::EventSpace;
                        pos += 6;
                    }
                    b'd' => self.line = Line::Field(0),
                    b'e' => self.line = Line::EventField(0),
                    _ => self.line = Line::Skip,
                },
                Line::EventField(n) => {
                    let b = chunk[pos];
                    let n = usize::from(n);
                    if n < 5 {
                        if b == b"event"[n] {
                            self.line = Line::EventField(n as u8 + 1);
                            pos += 1;
                        } else {
                            self.line = Line::Skip;
                        }
                    } else if b == b':' {
                        self.line = Line::EventSpace;
                        pos += 1;
                    } else if b == b'\n' || b == b'\r' {
                        // `event` without a colon: the default type.
                        (self.event.ping, self.event.type_error) = (false, false);
                        pos = self.line_end(chunk, pos);
                    } else {
                        self.line = Line::Skip;
                    }
                }
                Line::EventSpace => {
                    if chunk[pos] == b' ' {
                        pos += 1;
                    }
                    let ev = &mut self.event;
                    (ev.type_len, ev.type_ping, ev.type_error) = (0, true, true);
                    self.line = Line::EventValue;
                }
                Line::EventValue => {
                    let rest = &chunk[pos..];
                    let eol = find_eol(rest);
                    let ev = &mut self.event;
                    for &b in &rest[..eol.unwrap_or(rest.len())] {
                        let i = usize::from(ev.type_len);
                        ev.type_ping &= b"ping".get(i) == Some(&b);
                        ev.type_error &= b"error".get(i) == Some(&b);
                        ev.type_len = ev.type_len.saturating_add(1);
                        if !ev.type_ping && !ev.type_error {
                            break;
                        }
                    }
                    match eol {
                        None => pos = chunk.len(),
                        Some(i) => {
                            ev.ping = ev.type_ping && ev.type_len == 4;
                            ev.type_error &= ev.type_len == 5;
                            pos = self.line_end(chunk, pos + i);
                        }
                    }
                }
                Line::Field(n) => {
                    let b = chunk[pos];
                    let n = usize::from(n);
                    if n < 4 {
                        if b == b"data"[n] {
                            self.line = Line::Field(n as u8 + 1);
                            pos += 1;
                        } else {
                            self.line = Line::Skip;
                        }
                    } else if b == b':' {
                        self.has_data = true;
                        self.line = Line::DataSpace;
                        pos += 1;
                    } else if b == b'\n' || b == b'\r' {
                        // `data` without a colon: an empty value, which still dispatches.
                        self.has_data = true;
                        pos = self.line_end(chunk, pos);
                    } else {
                        self.line = Line::Skip;
                    }
                }
                Line::DataSpace => {
                    if chunk[pos] == b' ' {
                        pos += 1;
                    }
                    self.line = Line::Data;
                }
                Line::Data => {
                    let rest = &chunk[pos..];
                    let (data, eol) = match find_eol(rest) {
                        None => (rest, None),
                        Some(i) => (&rest[..i], Some(pos + i)),
                    };
                    self.event.note_done(data);
                    self.json.feed(data, &mut self.event, &mut self.tokens);
                    match eol {
                        None => pos = chunk.len(),
                        Some(at) => {
                            self.json.line_break();
                            self.event.note_done(b"\n");
                            pos = self.line_end(chunk, at);
                        }
                    }
                }
                Line::Skip => match find_eol(&chunk[pos..]) {
                    None => pos = chunk.len(),
                    Some(i) => pos = self.line_end(chunk, pos + i),
                },
            }
        }
        out
    }

    /// Consumes the line terminator at `at` (CR, LF or CRLF) and returns the offset past it.
    fn line_end(&mut self, chunk: &[u8], at: usize) -> usize {
        self.line = Line::Start;
        let next = at + 1;
        if chunk[at] == b'\r' {
            match chunk.get(next) {
                Some(b'\n') => return next + 1,
                Some(_) => {}
                None => self.pending_cr = true,
            }
        }
        next
    }

    /// A blank line at `at` ends the open event. Returns true when it was the provider's
    /// error, which ends the reading.
    fn end_event(&mut self, at: usize, out: &mut Found) -> bool {
        let ev = std::mem::take(&mut self.event);
        let dispatched = std::mem::take(&mut self.has_data);
        self.json.reset();
        if !dispatched {
            return false;
        }
        if ev.ping {
            return false;
        }
        let named = ev.error_type.or(ev.error_code).or(ev.root_code);
        let ev = Event {
            error: ev.error || ev.type_error,
            ..ev
        };
        let t = &mut self.tokens;
        // What the event is, when it is recognised; `None` when it is not.
        let output = match (self.format, ev.kind) {
            _ if ev.error => Some(false),
            (Format::Chat, _) if ev.choices => Some(ev.output),
            (Format::Messages | Format::Responses, Kind::Content) => Some(ev.output),
            (Format::Messages | Format::Responses, Kind::Framing | Kind::Error) => Some(false),
            _ if ev.done_seen == 6 && ev.done_ok => Some(false),
            _ => None,
        };
        match output {
            Some(true) => {
                t.output_events += 1;
                t.output_bytes = t.output_bytes.saturating_add(ev.output_bytes);
                out.output = true;
            }
            Some(false) => {}
            // Not a shape this reader knows: a token, as any data event would be.
            None => out.output = true,
        }
        if ev.error {
            t.error = Some(named.unwrap_or(ErrorType::Other));
            out.error_end = Some(at);
            self.stopped = true;
            return true;
        }
        if ev.nested_error {
            t.error.get_or_insert(named.unwrap_or(ErrorType::Other));
        }
        false
    }
}

#[inline]
fn find_eol(s: &[u8]) -> Option<usize> {
    memchr2(b'\n', b'\r', s)
}

mod json;

#[cfg(test)]
mod tests;
