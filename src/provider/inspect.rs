//! Reading a provider's answer as it passes, without buffering it: which events carry model
//! output (the first token), the token usage the provider reports, an estimate of the output
//! when it reports none, and the provider's own mid-stream errors.
//!
//! [`Inspector`] is fed the body's bytes in whatever pieces they arrive. An SSE body's lines
//! are found by `http::sse`'s scanner, the one SSE parser of the gateway, which hands each
//! event's data to the inspector's small JSON tokenizer (`json`) as it passes; that tracks
//! only the path of keys that matter (`choices[].delta`,
//! `usage.output_tokens`, `error.type`, ...). String ends are found eight bytes at a time and
//! then with `memchr`; only keys on those paths, and the few values it needs to name (`type`,
//! `code`), are compared, straight from the frame (a string split across frames keeps its
//! first 48 bytes). Usage numbers are read digit by digit, so nothing is parsed into a
//! `serde_json::Value` and nothing is allocated.
//!
//! An event is model output when it is recognised as such:
//!
//! | format | recognised by | model output | usage | error |
//! |---|---|---|---|---|
//! | Chat Completions | a top-level `choices` array | a `choices[].delta` field other than `role` that is non-empty (`content`, `reasoning_content`, `reasoning`, `refusal`, `tool_calls`, `audio`, ...), or legacy `choices[].text` | top-level `usage.{prompt,completion}_tokens` (Groq's `x_groq.usage` when the chunk has no top-level one) | a top-level `error` object |
//! | Messages | its `type` | `content_block_delta` with a non-empty field besides `type`/`signature`; `content_block_start` of a block other than an empty text or thinking one (`tool_use`, ...) | `input_tokens` + cache writes + cache reads (prompt; each as the last `usage` that named it said), `usage.output_tokens` | `type: "error"`, `error.type` |
//! | Responses | a `type` starting `response.` | a `response.*.delta` event with a non-empty `delta` | `response.usage.{input,output}_tokens` | `type: "error"` (`code`); `response.failed` (`response.error.code`: before any output, the provider's error event; after, counted, and the stream passes as it is) |
//!
//! In every format, a block with an `error` field and no `data` line (llama.cpp's error event,
//! which the standard and the SDKs ignore) is the provider's error too (see `error_field`).
//!
//! So role-only preambles (`"content":""`), `message_start`, pings, `content_block_stop`,
//! `response.created` and `data: [DONE]` are not tokens. An event that is not recognised at
//! all (a provider shape Hourglass does not know) counts as a token, as every data event did
//! before formats were known, so an unfamiliar stream cannot starve the first-token limit.
//! Non-streaming JSON bodies are read the same way, for their top-level `usage` only.

use self::error_field::ErrorField;
use self::event::{Event, Kind};
use self::json::Json;
use self::shape::Shape;
pub use self::tokens::{PromptPart, Source, Tokens, MAX_REPORTED_TOKENS};

use crate::http::sse::{EventSink, EventType, Scan, SseScanner};
use crate::provider::assemble::Assembler;
use crate::provider::tools::ToolCalls;
use crate::provider::{error_type_of, ErrorType, Format};

mod error_field;
mod event;
pub mod gemini;
mod json;
pub mod ndjson;
mod shape;
mod tokens;

/// What one call to [`Inspector::feed`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// An event carrying model output was completed in this piece.
    pub output: bool,
    /// The provider's own error event ended at this offset of the piece (just past its blank
    /// line). The inspector stops there: nothing after it is read.
    pub error_end: Option<usize>,
}

/// Incremental reader of one response body (an SSE stream or a JSON document).
#[derive(Debug, Clone)]
pub struct Inspector {
    /// The lines of an SSE body; `None` for a JSON document.
    scanner: Option<SseScanner>,
    reader: Reader,
    /// The events dispatched so far, keep-alives included (the Responses API numbers its
    /// `keepalive` events too), errors aside. 32 bits: in the padding of the struct, and
    /// four billion events are no answer.
    dispatched: u32,
}

/// What the scanner hands each event's data to.
#[derive(Debug, Clone)]
struct Reader {
    format: Format,
    json: Json,
    event: Event,
    tokens: Tokens,
    /// An event carrying model output dispatched in the piece being read.
    output: bool,
    /// Keep-alives without their `event:` line (data-only `{"type":"ping"}`) dispatched in
    /// the piece being read, which the scanner, knowing keep-alives only by `event:`, counted
    /// as progress. 8 bits, in the struct's padding: past 255 in one piece (a flood, not a
    /// keep-alive) the rest count as progress.
    keepalives: u8,
    /// The last event read in full, to read the next ones by (see `shape`): boxed, and only
    /// for streams.
    shape: Option<Box<Shape>>,
    /// What few answers need besides (boxed: inline it would double the size of every
    /// stream's inspector).
    extra: Option<Box<Extra>>,
    /// An event of this format was recognised: the stream is the format's, and is expected
    /// to end as the format ends.
    recognised: bool,
    /// OpenAI's `[DONE]` was seen: the end, whatever came before it.
    done: bool,
    /// An event other than a keep-alive or `[DONE]` was dispatched, recognised or not, or
    /// the provider's error: the answer began. One that ends before then never did (audit
    /// MC 1); the end marker or a keep-alive alone is no answer either (audit NA 5), nor a
    /// Chat chunk of framing only (a role, an empty content, Azure's `prompt_filter_results`
    /// with no choice: audit WB 1).
    began: bool,
    /// An event that ends an answer was seen: a choice's `finish_reason`, a `message_delta`'s
    /// `stop_reason`, `message_stop`, `response.completed` (`incomplete`, `failed`).
    ended: bool,
    /// The event after which nothing of the answer follows (`message_stop`,
    /// `response.completed`, ...) was seen.
    over: bool,
    /// The Chat choices that appeared, by index (bit `i` for index `i`), and those that
    /// finished; `choices_wide`: one appeared whose index no bit holds.
    choices_seen: u64,
    choices_done: u64,
    choices_wide: bool,
    /// Chat's usage-only event (`choices: []` with a `usage`) is left out of the stream: the
    /// gateway asked for it, not the client (`include_usage`, audit UC 3).
    hide_usage: bool,
    /// The event that just ended is such an event (see `EventSink::left_out`).
    leave_out: bool,
    /// Read for the usage only (see `Inspector::reading_usage_only`): the answer's shape is
    /// not judged.
    usage_only: bool,
}

#[derive(Debug, Clone, Default)]
struct Extra {
    /// The answer's tool calls, gathered when a run looks for loops.
    tools: Option<ToolCalls>,
    /// The document being rebuilt from the stream, for a client that did not stream.
    assembler: Option<Assembler>,
    /// The `error` field of the open block, llama.cpp's error event (see `error_field`).
    error_field: Option<ErrorField>,
    /// The message of such an event, once one ended the stream: the client's error event
    /// says it (see `Inspector::error_field_message`).
    error_message: Option<String>,
}

impl Inspector {
    /// An inspector of an answer in `format`: an SSE stream (`sse`) or a JSON document.
    pub fn new(format: Format, sse: bool) -> Self {
        Self {
            scanner: sse.then(SseScanner::new),
            reader: Reader {
                format,
                json: Json::default(),
                event: Event::default(),
                tokens: Tokens::default(),
                output: false,
                keepalives: 0,
                shape: None,
                extra: None,
                recognised: false,
                done: false,
                began: false,
                ended: false,
                over: false,
                choices_seen: 0,
                choices_done: 0,
                choices_wide: false,
                hide_usage: false,
                leave_out: false,
                usage_only: false,
            },
            dispatched: 0,
        }
    }

    /// Reads every event with the tokenizer, none by its shape (see `shape`).
    #[cfg(test)]
    fn without_shapes(mut self) -> Self {
        self.reader.shape = Some(Box::new(Shape::off()));
        self
    }

    /// A Chat answer of `n` choices (at most 64, the masks' bits) has not ended until each
    /// has finished, those that have not appeared yet too: a stream cut after choice 0
    /// finished and before choice 1 began is short, not a whole answer of one choice.
    pub fn with_choices(mut self, n: u8) -> Self {
        if self.reader.format == Format::Chat {
            self.reader.choices_seen = u64::MAX >> (64 - u32::from(n.clamp(1, 64)));
        }
        self
    }

    /// Leaves a Chat stream's usage-only event (`"choices": []` with the `usage`) out of what
    /// the client gets, still reading its usage: the gateway added
    /// `stream_options.include_usage` to the request, and a client that did not ask for the
    /// event may index `choices[0]` of every chunk (audit UC 3). Other formats have no such
    /// event, and a JSON document none at all.
    pub fn hiding_usage(mut self) -> Self {
        self.reader.hide_usage = self.scanner.is_some() && self.reader.format == Format::Chat;
        self
    }

    /// Reads the stream for the usage it reports and nothing else, as a resumed background
    /// stream (`Format::resumed`) is read: it asks the model nothing, so it is held to the
    /// rules of a stream whose format is unknown, as it was before its usage was read (audit
    /// VC 1, VC 2). Any event that dispatches is progress towards the first-token limit (a
    /// response that reasons silently for minutes is still running, not stalled before its
    /// first token), and a stream that ends cleanly, with no terminal event, is not short (a
    /// cancelled response, `starting_after` at the last event, an empty stream). Only
    /// `event: error` ends the reading, as the scanner alone sees it.
    pub fn reading_usage_only(mut self) -> Self {
        self.reader.usage_only = true;
        self
    }

    /// Also gathers the tool calls the answer asks for (see `tools`).
    pub fn with_tool_calls(mut self) -> Self {
        let format = self.reader.format;
        self.reader.extra.get_or_insert_with(Default::default).tools = Some(ToolCalls::new(format));
        self
    }

    /// Also rebuilds the one document of the stream (see `assemble`), of at most `limit`
    /// bytes.
    pub fn with_assembler(mut self, limit: usize) -> Self {
        let format = self.reader.format;
        self.reader
            .extra
            .get_or_insert_with(Default::default)
            .assembler = Some(Assembler::new(format, limit));
        self
    }

    /// Whether the document being rebuilt can only end as an error (see `Assembler::failed`).
    pub fn answer_failed(&self) -> bool {
        self.reader
            .extra
            .as_ref()
            .and_then(|e| e.assembler.as_ref())
            .is_some_and(Assembler::failed)
    }

    /// Bytes the document being rebuilt holds so far (see `Assembler::held`); 0 without one.
    pub fn answer_held(&self) -> usize {
        self.reader
            .extra
            .as_ref()
            .and_then(|e| e.assembler.as_ref())
            .map_or(0, Assembler::held)
    }

    /// The document rebuilt so far, once: the body is done or cut.
    pub fn take_assembler(&mut self) -> Option<Assembler> {
        self.reader.extra.as_mut()?.assembler.take()
    }

    /// The tool calls the answer asked for, in canonical form, with their names:
    /// read once the body is done.
    pub fn tool_calls(&mut self) -> Option<(Vec<u8>, String)> {
        let tools = self.reader.extra.as_mut()?.tools.as_mut()?;
        if self.scanner.is_none() {
            tools.document_end();
        }
        tools.canonical()
    }

    /// An error event was read whose blank line ended the last piece with a CR: the next
    /// piece says whether an LF belongs to it, and if the body ends first, the event (and
    /// the body, as far as the client is concerned) ended at that CR.
    pub fn error_pending(&self) -> bool {
        self.scanner.as_ref().is_some_and(SseScanner::error_pending)
    }

    /// The stream so far ends in the CR of a blank line (see `SseScanner::ends_in_blank_cr`).
    pub fn ends_in_blank_cr(&self) -> bool {
        self.scanner
            .as_ref()
            .is_some_and(SseScanner::ends_in_blank_cr)
    }

    /// The stream ended short: an event was still open (it had data, and no blank line
    /// came to end it), no event of the answer came at all (an empty body, comments or
    /// pings alone: a 2xx answer of these APIs that never began is a truncation, not an
    /// empty success; audit MC 1), or the format's events were recognised and they did not
    /// end the answer (no `[DONE]`, `message_stop`, `response.completed`, and not every
    /// Chat choice that appeared has its `finish_reason`). For a stream that ended by
    /// itself. An event the reader does not recognise still begins an answer, which then
    /// ends as it ends, as a stream of a shape the gateway does not know always has. A JSON
    /// document is short when it ended inside a value: its framing said it ended (an HTTP/2
    /// `RST_STREAM(NO_ERROR)`, a connection's close where no length was given) before the
    /// document did.
    pub fn ended_short(&self) -> bool {
        match &self.scanner {
            Some(s) if self.reader.usage_only => s.open_event(),
            Some(s) => {
                let r = &self.reader;
                s.open_event() || !r.began || (r.recognised && !r.finished())
            }
            None => self.reader.json.open_value(),
        }
    }

    /// The answer has ended: the stream would not be short if it stopped here (see
    /// `ended_short`), though more of it may follow (a Chat usage chunk, `[DONE]`). An end
    /// marker before the answer began ends none (audit NA 5).
    pub fn answer_ended(&self) -> bool {
        let r = &self.reader;
        self.scanner.is_some() && !r.usage_only && r.began && r.recognised && r.finished()
    }

    /// The end marker (`[DONE]`) came, and the answer had not ended by it: it never began,
    /// or (for a document rebuilt from the stream) it is not whole. Nothing after the
    /// marker can make it whole, and a client that streams stops reading there (openai-python
    /// and openai-node ignore anything after it): the stream is short now, and the marker,
    /// left out of what the client gets (audit WB 1), gives way to the error event.
    pub fn ended_early(&self) -> bool {
        self.answer_over() && !self.answer_ended()
    }

    /// The event after which nothing of the answer follows has come: `[DONE]`,
    /// `message_stop`, `response.completed` (`incomplete`, `failed`). A Chat choice's
    /// `finish_reason` is not one: the usage chunk comes after it.
    pub fn answer_over(&self) -> bool {
        let r = &self.reader;
        self.scanner.is_some() && !r.usage_only && (r.done || r.over)
    }

    /// The `sequence_number` an event appended to this Responses stream takes: every event
    /// of the API carries one, from 0 up, and clients (the Vercel AI SDK) refuse an error
    /// event without it. `None` for other formats, whose events carry none.
    pub fn next_sequence_number(&self) -> Option<u64> {
        (self.scanner.is_some() && self.reader.format == Format::Responses)
            .then_some(u64::from(self.dispatched))
    }

    /// The provider's message, when its error came as a block with an `error` field and no
    /// data (see `error_field`): a client skips that block, so it is told in an event of the
    /// gateway's.
    pub fn error_field_message(&self) -> Option<&str> {
        self.reader.extra.as_ref()?.error_message.as_deref()
    }

    /// What has been counted so far.
    pub fn tokens(&self) -> Tokens {
        self.reader.tokens
    }

    /// Reads the next piece of the body. Pieces may split it anywhere.
    pub fn feed(&mut self, chunk: &[u8]) -> Found {
        let (scan, output) = self.read(chunk);
        Found {
            output,
            error_end: scan.error_end,
        }
    }

    /// Reads the next piece of the body: what the scanner found in it (empty for a JSON
    /// document), and whether an event carrying model output dispatched in it. `error_end`
    /// covers the provider's data-only error events as well as `event: error`.
    #[inline]
    pub fn read(&mut self, chunk: &[u8]) -> (Scan, bool) {
        let Some(scanner) = self.scanner.as_mut() else {
            let r = &mut self.reader;
            r.json.feed(chunk, &mut r.event, &mut r.tokens, &mut ());
            if let Some(t) = r.extra.as_mut().and_then(|e| e.tools.as_mut()) {
                t.data(chunk);
            }
            return (Scan::default(), false);
        };
        self.reader.output = false;
        self.reader.keepalives = 0;
        let mut scan = scanner.scan_with(chunk, &mut self.reader);
        self.dispatched = self.dispatched.saturating_add(scan.dispatched);
        if self.reader.usage_only {
            // Any event is progress, as the scanner counts it for a stream of unknown format.
            return (scan, scan.progress > 0);
        }
        // Progress is what the idle limit moves on: keep-alives are none, with their
        // `event:` line or without it.
        scan.progress = scan
            .progress
            .saturating_sub(u32::from(self.reader.keepalives));
        (scan, self.reader.output)
    }
}

impl EventSink for Reader {
    #[inline]
    fn data(&mut self, value: &[u8]) {
        self.event.note_done(value);
        if std::mem::replace(&mut self.event.data_read, true) {
            self.json
                .feed(value, &mut self.event, &mut self.tokens, &mut ());
        } else {
            let shape = self.shape.get_or_insert_with(Box::default);
            if shape.active() {
                shape.read(value, &mut self.json, &mut self.event, &mut self.tokens);
            } else {
                self.json
                    .feed(value, &mut self.event, &mut self.tokens, &mut ());
            }
        }
        if let Some(e) = self.extra.as_mut() {
            if let Some(t) = e.tools.as_mut() {
                t.data(value);
            }
            if let Some(a) = e.assembler.as_mut() {
                a.data(value);
            }
        }
    }

    #[inline]
    fn data_line_end(&mut self) {
        self.json.line_break();
        self.event.note_done(b"\n");
        if let Some(e) = self.extra.as_mut() {
            if let Some(t) = e.tools.as_mut() {
                t.line_end();
            }
            if let Some(a) = e.assembler.as_mut() {
                a.line_end();
            }
        }
    }

    fn end_event(&mut self, dispatched: bool, kind: EventType) -> bool {
        // Whether the event is the provider's error is decided here, once: the stream ends
        // at it, and the assembler answers with it.
        let error = Reader::end_event(self, dispatched, kind);
        if let Some(e) = self.extra.as_mut() {
            if let Some(t) = e.tools.as_mut() {
                t.event_end(dispatched && kind == EventType::Other);
            }
            if let Some(a) = e.assembler.as_mut() {
                a.event_end(dispatched && kind != EventType::Ping, error);
            }
        }
        error
    }

    #[inline]
    fn left_out(&mut self) -> bool {
        std::mem::take(&mut self.leave_out)
    }

    /// Gathered in the formats read; a stream read for its usage only keeps the standard's
    /// reading (only `event: error` ends it).
    fn error_field(&mut self, value: &[u8]) {
        if self.usage_only {
            return;
        }
        let extra = self.extra.get_or_insert_with(Default::default);
        extra
            .error_field
            .get_or_insert_with(Default::default)
            .push(value);
    }

    /// A block with data is read as the standard reads it: its data is the event, and the
    /// field is dropped (audit YC 1). One without is the provider's error, as a data-only
    /// error object is (`end_event`): it begins the answer, is counted by its type, and
    /// gives the document rebuilt from the stream its error.
    fn error_block_end(&mut self, dispatched: bool) -> bool {
        let Some(extra) = self.extra.as_mut() else {
            return false;
        };
        let Some(field) = extra.error_field.take() else {
            return false;
        };
        if dispatched {
            return false;
        }
        let read = field.read();
        if let Some(a) = extra.assembler.as_mut() {
            a.error_field(read.event);
        }
        extra.error_message = Some(read.message);
        self.began = true;
        self.recognised = true;
        self.tokens.error = Some(read.kind);
        true
    }
}

impl Reader {
    /// The answer ended: `[DONE]`, or an event that ends one and, for Chat, a finish reason
    /// for every choice that appeared (with a choice past the masks, any finish reason, as
    /// a single choice's). For a document rebuilt from the stream, only what makes it whole
    /// (see `Assembler::ended`) ends it, the end marker too: without a finish or stop reason
    /// it would go out as a 200 that looks whole (a null reason, an unfinished tool use
    /// dropped). A client that streams reads the reasons itself, and its stream passes as
    /// it came. One that can only fail (`Assembler::failed`) is left to say why.
    fn finished(&self) -> bool {
        let choices = self.choices_wide || self.choices_seen & !self.choices_done == 0;
        match self.extra.as_ref().and_then(|e| e.assembler.as_ref()) {
            // After `[DONE]`, the choices that appeared: a provider that ignores `n`
            // (Ollama, llama.cpp) answers one choice of the n asked for, and whole.
            Some(a) if !a.failed() => (self.done || (self.ended && choices)) && a.ended(),
            _ => self.done || (self.ended && choices),
        }
    }

    /// A blank line ends the open event. Returns true when it was the provider's error,
    /// which ends the reading.
    fn end_event(&mut self, dispatched: bool, kind: EventType) -> bool {
        let ev = std::mem::take(&mut self.event);
        let status = self.json.error_status();
        let usage = self.json.top_usage();
        self.json.reset();
        if !dispatched || kind == EventType::Ping {
            return false;
        }
        if self.usage_only {
            // The usage was read with the data. Nothing else is judged: the scanner itself
            // ends the stream at `event: error`, as it ends one of unknown format.
            return false;
        }
        // A numeric code is the HTTP status the provider answers the error with, as the
        // document rebuilt from the stream is answered (audit GB 6), unless a named type
        // says more than a generic status (audits HB5, HC3).
        let named = error_type_of(ev.error_type, status, ev.error_code.or(ev.root_code));
        let ev = Event {
            error: ev.error || kind == EventType::Error,
            ..ev
        };
        // A keep-alive without its `event:` line (`event: ping` never gets here): the scanner
        // counted it as progress, which the idle limit must not see (audit KE 3). Chat has
        // none of its own, but a data-only `{"type":"ping"}` there is one all the same, not a
        // chunk of the answer (audit NA 5).
        let keepalive = ev.kind == Kind::KeepAlive && !ev.choices && !ev.error;
        let done = ev.done.found();
        // The end marker and keep-alives say nothing of the answer: any other event begins
        // it, the provider's error too (audit NA 5: `data: [DONE]` alone passed as a whole
        // empty answer to a streaming client, and as a truncation rebuilt for one that did
        // not stream). A Chat chunk that carries no output, no finish reason and no error is
        // framing too (audit WB 1: a role chunk, then `[DONE]`, reached both OpenAI SDKs as
        // a successful empty completion).
        let framing = self.format == Format::Chat
            && ev.choices
            && !(ev.is_output() || ev.finished || ev.error || ev.nested_error);
        self.began |= !(keepalive || done || framing);
        if keepalive {
            self.keepalives = self.keepalives.saturating_add(1);
            // No output, and on Chat no sign of the format: it is read by its chunks.
            if self.format == Format::Chat {
                return false;
            }
        }
        // A chunk of no choice that carries the usage is the one `include_usage` adds: read,
        // and left out when the gateway asked for it. (Azure's first chunk, `choices: []`
        // with `prompt_filter_results` and no usage, is not it, and passes.)
        self.leave_out = self.hide_usage
            && ev.choices
            && ev.choices_seen == 0
            && !ev.choices_wide
            && usage
            && !ev.error;
        // What the event is, when it is recognised; `None` when it is not.
        let output = match (self.format, ev.kind) {
            _ if ev.error => Some(false),
            (Format::Chat, _) if ev.choices => Some(ev.is_output()),
            (Format::Messages | Format::Responses, Kind::Content) => Some(ev.is_output()),
            (Format::Messages | Format::Responses, Kind::Output) => Some(true),
            (Format::Messages | Format::Responses, Kind::Item) => {
                Some(self.tokens.output_events == 0 && ev.is_output())
            }
            (
                Format::Messages | Format::Responses,
                Kind::Framing | Kind::Error | Kind::KeepAlive,
            ) => Some(false),
            _ if done => Some(false),
            _ => None,
        };
        if output.is_some() {
            self.recognised = true;
        }
        self.done |= done;
        self.ended |= ev.finished;
        self.over |= ev.last;
        self.choices_seen |= ev.choices_seen;
        self.choices_done |= ev.choices_done;
        self.choices_wide |= ev.choices_wide;
        // An end marker the answer did not end by (`Inspector::ended_early`) is left out:
        // the error event takes its place, where a client that streams still reads it.
        if done && !(self.began && self.finished()) {
            self.leave_out = true;
        }
        match output {
            Some(true) => {
                let t = &mut self.tokens;
                t.output_events += 1;
                t.output_bytes = t.output_bytes.saturating_add(ev.output_bytes);
                self.output = true;
            }
            Some(false) => {}
            // Not a shape this reader knows: a token, as any data event would be.
            None => self.output = true,
        }
        let t = &mut self.tokens;
        if ev.error {
            t.error = Some(named.unwrap_or(ErrorType::Other));
            return true;
        }
        // A failed response with no error object (`"error": null`) failed all the same
        // (audit HB6): a server error, not a success.
        if ev.nested_error || ev.failed {
            let kind = named.unwrap_or(if ev.nested_error {
                ErrorType::Other
            } else {
                ErrorType::Server
            });
            // Before any output a failed response is the provider's error as much as an
            // `error` event is (audit GB 3: a `server_error` was neither failed over nor
            // logged as an error); after some, the client has what came, and the stream
            // passes as it is.
            if t.output_events == 0 {
                t.error = Some(kind);
                return true;
            }
            t.error.get_or_insert(kind);
        }
        false
    }
}

#[cfg(test)]
mod tests;
