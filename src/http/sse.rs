//! Incremental, zero-copy scanner for `text/event-stream` bodies.
//!
//! The proxy forwards upstream SSE frames as they arrive, but it needs two facts about
//! them: where complete blocks end (so it can hold back a partial event) and whether real
//! events, not keep-alives, are being dispatched (progress). [`SseScanner`] answers both
//! by following the WHATWG "Interpreting an event stream" algorithm (HTML §9.2.6) byte for
//! byte, without ever copying the stream: classifying a line needs only its first few
//! bytes, so at most 24 bytes of a line that straddles two chunks are kept, and the rest
//! of every line is skipped with `memchr`.
//!
//! The scanner is the one reader of SSE lines in the gateway: what else needs an event's data
//! (the provider inspector, which reads tokens and usage from it) is an [`EventSink`] that
//! the scanner hands each `data` value to, in place, as it passes. It also hands it the value
//! of an `error` line, which the standard ignores: llama.cpp's server writes its error event
//! as a block of that field alone, and a sink that reads it may end the stream there (see
//! [`EventSink::error_field`]); a block with data is read as the standard reads it.
//!
//! Working on bytes instead of decoded text is exact here: the UTF-8 decoder the standard
//! mandates never swallows an ASCII byte into a replacement character, so line terminators,
//! colons and the ASCII field names and event types compare the same either way.

use std::borrow::Cow;

use memchr::memchr2;

/// The UTF-8 byte order mark, which the standard's decoder strips once at stream start.
pub(crate) const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// A leading BOM, matched across chunks at the start of a stream (here and in the response
/// inspector, which reads the same stream).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LeadingBom {
    matched: u8,
    /// Past the point where a BOM may still appear.
    settled: bool,
}

impl LeadingBom {
    pub(crate) fn settled(&self) -> bool {
        self.settled
    }

    /// Some BOM bytes matched, and the chunk ended before the rest could tell.
    pub(crate) fn partial(&self) -> bool {
        !self.settled && self.matched > 0
    }

    /// Consumes the part of a leading BOM at the start of `chunk`: how many bytes it used,
    /// and, when the BOM turned out broken, the bytes of it matched so far (possibly in
    /// earlier chunks), which are then ordinary content of the first line (the decoder
    /// turns them into U+FFFD). Stays unsettled only when the chunk ended mid-BOM.
    pub(crate) fn skip(&mut self, chunk: &[u8]) -> (usize, &'static [u8]) {
        let mut pos = 0;
        while let (Some(&got), Some(&want)) = (chunk.get(pos), BOM.get(usize::from(self.matched))) {
            if got != want {
                break;
            }
            pos += 1;
            self.matched += 1;
        }
        if usize::from(self.matched) == BOM.len() {
            self.settled = true;
        } else if pos < chunk.len() {
            self.settled = true;
            return (pos, &BOM[..usize::from(self.matched)]);
        }
        (pos, &[])
    }
}

/// An event's data as text, decoded as the standard decodes the stream: UTF-8, each invalid
/// sequence read as U+FFFD. A client that streams reads `A\xffB` as `A\u{FFFD}B` (WHATWG's
/// decoder, every SDK's); what the gateway reads from the same event (the document rebuilt
/// from it, its tool calls) must read that too, not refuse it (audit UE 1). Line ends and the
/// ASCII around the data decode alike either way, so an event decodes alone as it would in
/// the stream. Borrowed when the data is valid, as a provider's is: only a broken event is
/// copied.
pub fn data_text(data: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// OpenAI's end marker, which ends a stream where its event's data starts with it.
const DONE: &[u8; 6] = b"[DONE]";

/// Whether an event's data is OpenAI's end marker, followed as the data passes in pieces (a
/// line's end as `\n`). The one rule for every reading of a stream (audit UE 2): the data
/// starts with `[DONE]`, whatever follows (`[DONE]x`, or an empty `data:` line after it), as
/// openai-python (`startswith("[DONE]")`) and openai-node end a stream. A client that
/// streams stops there, so the document rebuilt from the stream must end there too, not read
/// the marker as a chunk it cannot parse.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EndMarker {
    /// Bytes of the data compared so far (at most `DONE`'s), and whether one differed.
    compared: u8,
    differed: bool,
}

impl EndMarker {
    /// The next piece of the event's data.
    #[inline]
    pub fn note(&mut self, piece: &[u8]) {
        let from = usize::from(self.compared);
        // Decided: nothing after the sixth byte, or after one that differed, changes it. Most
        // data differs at its first byte, so each later piece of a chunk costs one test.
        if self.differed || from == DONE.len() {
            return;
        }
        let n = piece.len().min(DONE.len() - from);
        // Byte by byte: at most six, cheaper than the call to `memcmp` a slice comparison
        // makes (once per data line, on the chunk path).
        self.differed = piece[..n].iter().zip(&DONE[from..]).any(|(a, b)| a != b);
        // `n` is at most 6.
        self.compared += n as u8;
    }

    /// The data so far starts with the marker.
    pub fn found(self) -> bool {
        usize::from(self.compared) == DONE.len() && !self.differed
    }

    /// Whether `data`, an event's whole data, is the end marker.
    pub fn is(data: &[u8]) -> bool {
        let mut m = EndMarker::default();
        m.note(data);
        m.found()
    }
}

/// How many leading bytes of a line are looked at (and kept, when the line straddles
/// chunks). A line classifies the same as its first `PREFIX` bytes would on their own, as
/// long as `PREFIX` exceeds the longest line whose end matters, `event: keepalive`: without
/// a colon in them the field name is longer than `data` or `event`, and with one, any
/// `event` value in them is already longer than `ping`, `error` or `keepalive`. So no length
/// needs tracking.
const PREFIX: usize = 24;
const _: () = assert!(PREFIX > b"event: keepalive".len());

/// The event type of a block, reduced to what the proxy cares about.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Any type other than the keep-alives or `error` (including the default `message`).
    #[default]
    Other,
    /// A keep-alive: Anthropic's `ping`, or the `keepalive` the OpenAI Responses API sends
    /// while a model thinks. Dispatched but not progress.
    Ping,
    /// An upstream error event: reported through [`Scan::error_end`].
    Error,
}

/// What a complete line means to the block it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    Blank,
    Data,
    Event(EventType),
    /// An `error` field: no WHATWG field, so it never makes a block dispatch, but its value
    /// goes to the sink (see [`EventSink::error_field`]).
    Error,
    /// Comments, `id`, `retry` and unknown fields: they never make a block dispatch.
    Ignored,
}

/// Reads the data of the events a scanner passes over. Every method is called in stream
/// order; a `data` line's value (after `data:` and one optional space) may come in several
/// pieces when it straddles chunks.
pub trait EventSink {
    /// The next piece of the value of a `data` line.
    fn data(&mut self, value: &[u8]);
    /// The end of a `data` line: the line feed that joins the values of one event.
    fn data_line_end(&mut self);
    /// A block ended at a blank line. `dispatched`: it had a `data` line, so the standard
    /// dispatches it; `kind`: its type. Returns true when the event is the provider's error,
    /// which ends the stream as an `event: error` does: nothing after it is scanned.
    fn end_event(&mut self, dispatched: bool, kind: EventType) -> bool;
    /// Asked at every blank line, after `end_event`: the event that just ended is to be left
    /// out of what the client gets (reported through [`Scan::left_out`]).
    #[inline]
    fn left_out(&mut self) -> bool {
        false
    }
    /// The next piece of the value of an `error` line, which llama.cpp's server writes as its
    /// error event inside a 200 stream (`error: {"code":400,...}`, a blank line, no `data`).
    /// The standard ignores a field it does not know, and so does every SDK; the sink may
    /// read it (see `error_block_end`). A line's end comes as `\n`.
    #[inline]
    fn error_field(&mut self, _value: &[u8]) {}
    /// A block that had an `error` line ended (after `end_event`); `dispatched`: it had a
    /// `data` line too, and the standard's reading stands (its data is the event). Returns
    /// true when the sink reads the block, without data, as the provider's error: it ends the
    /// stream as an `event: error` does, and is reported through [`Scan::error_field`].
    #[inline]
    fn error_block_end(&mut self, _dispatched: bool) -> bool {
        false
    }
}

/// The sink of a scan that needs only boundaries and progress.
impl EventSink for () {
    #[inline]
    fn data(&mut self, _: &[u8]) {}
    #[inline]
    fn data_line_end(&mut self) {}
    #[inline]
    fn end_event(&mut self, _: bool, _: EventType) -> bool {
        false
    }
}

/// The value of a `data` line starts this far into `body`, a whole line (or its first piece)
/// that starts a line, when the line is one: past `data:` and one space.
#[inline]
fn data_value(body: &[u8]) -> Option<usize> {
    body.starts_with(b"data:")
        .then(|| if body.get(5) == Some(&b' ') { 6 } else { 5 })
}

/// Incremental scanner of a `text/event-stream` body.
///
/// Feed it every chunk of the body, in order, with [`SseScanner::scan`]. It keeps only a
/// few bytes of state between calls (a line prefix of at most 16 bytes, a pending CR, the
/// BOM match and the open block's data/type flags), so it never allocates and never copies
/// the stream.
#[derive(Debug, Default, Clone)]
pub struct SseScanner {
    /// First bytes of the line in progress when it straddles chunks; `prefix_len == 0`
    /// means no line is in progress (or the line is a `data` line, see `data_line`). A prefix
    /// of five bytes or more never starts with `data:`.
    prefix: [u8; PREFIX],
    prefix_len: u8,
    /// In the value of a `data` line that straddles chunks: its rest goes to the sink.
    /// `Value` once past the optional space after the colon. (`Error`: of an `error` line.)
    data_line: DataLine,
    /// The previous chunk ended with a CR, so an LF starting the next chunk finishes that
    /// same CRLF terminator rather than ending an extra (blank) line. With `stopped`, that
    /// CR ended the error event (see [`Scan::error_end`]).
    pending_cr: bool,
    /// The pending CR ended a blank line, so its LF also finishes a block boundary.
    cr_was_blank: bool,
    /// ... the blank line of an event left out (see [`EventSink::left_out`]): its LF is the
    /// event's too, and is left out with it (audit VC 3: it reached the client alone).
    cr_left_out: bool,
    bom: LeadingBom,
    /// The open block has at least one `data` line, so it will dispatch.
    has_data: bool,
    kind: EventType,
    /// Some non-blank line belongs to the open block.
    block_open: bool,
    /// ... an `error` line among them (see [`EventSink::error_field`]).
    error_field: bool,
    /// An `error` event was dispatched; nothing after it is scanned.
    stopped: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum DataLine {
    #[default]
    None,
    /// Just after `data:`: one space may follow.
    Space,
    Value,
    /// The value of an `error` line, past its optional space or not (that space is the
    /// sink's to skip): rare, so it shares the `data` line's one test a chunk.
    Error,
}

/// What [`SseScanner::scan`] found in one chunk. Offsets are relative to that chunk.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// Offset in this chunk just past the last block boundary (the end of a blank line,
    /// i.e. the line terminator of an empty line), if the chunk contains one.
    ///
    /// When a blank line ends in a CR that is the last byte of a chunk, the boundary is
    /// reported right after that CR (the block is complete; waiting for a possible LF would
    /// stall CR-terminated streams). If the next chunk then starts with the LF completing
    /// that CRLF, the boundary is reported again just past the LF (offset 1).
    pub last_boundary: Option<usize>,
    /// Events dispatched in this chunk that count as progress: every dispatched event
    /// whose type is neither exactly `ping` or `keepalive` (keep-alives) nor `error`.
    pub progress: u32,
    /// Events dispatched in this chunk, keep-alives included (errors aside).
    pub dispatched: u32,
    /// If an event whose type is `error` was dispatched in this chunk: the offset just past
    /// the end of that event's terminating blank line. Scanning STOPS there: the rest of the
    /// chunk is not scanned, and the scanner must not be fed again afterwards (later calls
    /// return an empty `Scan`). `last_boundary` is then that same offset (`None` when it is
    /// 0: nothing of the chunk is the stream's).
    ///
    /// Unlike a boundary, the error's end is never reported at a CR that ends the chunk,
    /// because nothing after the error event is forwarded and the LF of a CRLF cut there
    /// would be lost: that chunk reports the boundary after the CR (the event is complete)
    /// but no `error_end`, and [`SseScanner::error_pending`] turns true. The next chunk then
    /// reports `error_end` `Some(1)` if it starts with the LF, else `Some(0)`; a body that
    /// ends first ended the event at the CR. So the offset never depends on the cuts.
    pub error_end: Option<usize>,
    /// The last event in this chunk that the sink asked to leave out (see
    /// [`EventSink::left_out`]), with those left out just before it, one after another; or
    /// the LF of a left-out event whose blank line's CR ended the chunk before.
    pub left_out: Option<LeftOut>,
    /// The error event at `error_end` came as a block with an `error` field and no data
    /// (see [`EventSink::error_block_end`]): where it lies, for a writer to put an event a
    /// client reads in its place. Its end is `error_end`, reported at once even at a CR that
    /// ends the chunk: the block is replaced, its line end with it.
    pub error_field: Option<LeftOut>,
}

/// Where an event to be left out lies in the chunk that ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeftOut {
    /// Where the event began in this chunk; `None` when it began in an earlier chunk (or at
    /// this one's start, its earlier chunks having ended at a boundary): its bytes before
    /// this chunk are those since the last boundary reported before it.
    pub start: Option<usize>,
    /// Just past its blank line (a boundary).
    pub end: usize,
}

impl SseScanner {
    /// A scanner positioned at the start of a stream (a leading BOM is still expected).
    pub fn new() -> Self {
        Self::default()
    }

    /// Scans the next chunk of the body and reports the block boundaries and dispatched
    /// events it completes. Chunks may split the stream anywhere, including inside a CRLF
    /// or the BOM; an empty chunk is a no-op.
    ///
    /// After a `Scan` with `error_end` set, the scanner is finished: do not feed it again.
    #[inline]
    pub fn scan(&mut self, chunk: &[u8]) -> Scan {
        self.scan_with(chunk, &mut ())
    }

    /// [`SseScanner::scan`], handing the events' data to `sink` as it passes. An event the
    /// sink calls the provider's error ends the scan as an `event: error` does.
    pub fn scan_with<S: EventSink>(&mut self, chunk: &[u8], sink: &mut S) -> Scan {
        let mut out = Scan::default();
        if chunk.is_empty() {
            return out;
        }
        if self.stopped {
            if std::mem::take(&mut self.pending_cr) {
                let lf = chunk[0] == b'\n';
                out.error_end = Some(usize::from(lf));
                out.last_boundary = lf.then_some(1);
            }
            return out;
        }
        let mut pos = 0;
        if !self.bom.settled() {
            let broken;
            (pos, broken) = self.bom.skip(chunk);
            self.push_prefix(broken);
            if !self.bom.settled() {
                return out;
            }
        }
        // Where the open block began in this chunk, once a boundary in it was passed.
        let mut block_start = None;
        if self.pending_cr {
            // `pending_cr` implies the BOM was settled before this chunk, so `pos` is 0.
            self.pending_cr = false;
            let left_out = std::mem::take(&mut self.cr_left_out);
            if chunk[0] == b'\n' {
                pos = 1;
                if self.cr_was_blank {
                    out.last_boundary = Some(1);
                    block_start = Some(1);
                    if left_out {
                        out.left_out = Some(LeftOut {
                            start: Some(0),
                            end: 1,
                        });
                    }
                }
            }
        }
        while pos < chunk.len() {
            let rest = &chunk[pos..];
            let found = find_eol(rest);
            if self.data_line != DataLine::None {
                // The rest of a `data` line begun in an earlier chunk.
                let mut value = &rest[..found.unwrap_or(rest.len())];
                if self.data_line == DataLine::Error {
                    // ... or of an `error` line: its value is the sink's whole.
                    sink.error_field(value);
                    let Some(i) = found else { break };
                    sink.error_field(b"\n");
                    self.data_line = DataLine::None;
                    pos = self.line_end(chunk, pos + i, false);
                    continue;
                }
                if self.data_line == DataLine::Space && !value.is_empty() {
                    if value[0] == b' ' {
                        value = &value[1..];
                    }
                    self.data_line = DataLine::Value;
                }
                if !value.is_empty() {
                    sink.data(value);
                }
                let Some(i) = found else { break };
                sink.data_line_end();
                self.data_line = DataLine::None;
                pos = self.line_end(chunk, pos + i, false);
                continue;
            }
            let Some(i) = found else {
                // A line that goes on in the next chunk: a `data` line hands over what it has
                // of its value; any other keeps its first bytes to be classified at its end.
                match self.data_start(rest) {
                    Some(at) => {
                        self.prefix_len = 0;
                        self.has_data = true;
                        self.block_open = true;
                        self.data_line = DataLine::Space;
                        let mut value = &rest[at..];
                        if !value.is_empty() {
                            if value[0] == b' ' {
                                value = &value[1..];
                            }
                            self.data_line = DataLine::Value;
                            if !value.is_empty() {
                                sink.data(value);
                            }
                        }
                    }
                    // An `error` line's value goes to the sink as it comes, as a `data`
                    // line's; anything else keeps its first bytes.
                    None => match self.field_start(rest, b"error:") {
                        Some(at) => {
                            self.prefix_len = 0;
                            self.error_field = true;
                            self.block_open = true;
                            self.data_line = DataLine::Error;
                            sink.error_field(&rest[at..]);
                        }
                        None => self.push_prefix(rest),
                    },
                }
                break;
            };
            let eol = pos + i;
            let body = &chunk[pos..eol];
            let line = if self.prefix_len == 0 {
                match data_value(body) {
                    Some(at) => {
                        sink.data(&body[at.min(body.len())..]);
                        Line::Data
                    }
                    None => {
                        let line = classify(&body[..body.len().min(PREFIX)]);
                        match line {
                            // `data` without a colon: an empty value.
                            Line::Data => sink.data(&[]),
                            // Past `error` and its colon, if it has one.
                            Line::Error => sink.error_field(body.get(6..).unwrap_or_default()),
                            _ => {}
                        }
                        line
                    }
                }
            } else {
                let line = match self.data_start(body) {
                    Some(at) => {
                        let value = &body[at..];
                        sink.data(value.strip_prefix(b" ").unwrap_or(value));
                        Line::Data
                    }
                    None => match self.field_start(body, b"error:") {
                        Some(at) => {
                            sink.error_field(&body[at..]);
                            Line::Error
                        }
                        None => {
                            self.push_prefix(body);
                            // `error` alone, without a colon, is an empty value.
                            classify(&self.prefix[..usize::from(self.prefix_len)])
                        }
                    },
                };
                self.prefix_len = 0;
                line
            };
            pos = self.line_end(chunk, eol, line == Line::Blank);
            match line {
                Line::Blank => {
                    out.last_boundary = Some(pos);
                    if let Some(field) = self.end_block(&mut out, sink) {
                        if field {
                            // Replaced for the client, line end and all: it ends here,
                            // whatever follows its CR.
                            self.pending_cr = false;
                            out.error_field = Some(LeftOut {
                                start: block_start,
                                end: pos,
                            });
                        }
                        // A CR ending the chunk may be half of a CRLF: the next chunk tells.
                        out.error_end = (!self.pending_cr).then_some(pos);
                        self.stopped = true;
                        return out;
                    }
                    let left_out = sink.left_out();
                    if left_out {
                        // Events left out one after another are one range: the first of
                        // two usage chunks in a frame reached the client (audit VC 4).
                        let start = match out.left_out {
                            Some(before) if Some(before.end) == block_start => before.start,
                            _ => block_start,
                        };
                        out.left_out = Some(LeftOut { start, end: pos });
                    }
                    // A CR ending the chunk may be half of a CRLF: its LF goes with the event.
                    self.cr_left_out = left_out && self.pending_cr;
                    block_start = Some(pos);
                }
                Line::Data => {
                    sink.data_line_end();
                    self.has_data = true;
                    self.block_open = true;
                }
                Line::Event(kind) => {
                    self.kind = kind;
                    self.block_open = true;
                }
                Line::Error => {
                    sink.error_field(b"\n");
                    self.error_field = true;
                    self.block_open = true;
                }
                Line::Ignored => self.block_open = true,
            }
        }
        out
    }

    /// Consumes the line terminator at `eol` (CR, LF, or CRLF, whose LF may come in the next
    /// chunk) and returns the offset past it.
    #[inline]
    fn line_end(&mut self, chunk: &[u8], eol: usize, blank: bool) -> usize {
        let mut pos = eol + 1;
        if chunk[eol] == b'\r' {
            match chunk.get(pos) {
                Some(b'\n') => pos += 1,
                Some(_) => {}
                None => {
                    self.pending_cr = true;
                    self.cr_was_blank = blank;
                }
            }
        }
        pos
    }

    /// Where the value starts in `piece`, the continuation of the line in `prefix`, when the
    /// two together start with `data:` (the offset just past the colon).
    #[inline]
    fn data_start(&self, piece: &[u8]) -> Option<usize> {
        self.field_start(piece, b"data:")
    }

    /// Where the value starts in `piece`, the continuation of the line in `prefix`, when the
    /// two together start with `field` (a field's name and its colon): just past the colon.
    #[inline]
    fn field_start(&self, piece: &[u8], field: &[u8]) -> Option<usize> {
        let have = usize::from(self.prefix_len);
        if have == 0 {
            return piece.starts_with(field).then_some(field.len());
        }
        // A prefix as long as the field is never its line's (it would have become one).
        if have >= field.len() || self.prefix[..have] != field[..have] {
            return None;
        }
        let need = field.len() - have;
        (piece.len() >= need && piece[..need] == field[have..]).then_some(need)
    }

    /// An error event ended with the last chunk's final byte, a CR: the next chunk's
    /// `error_end` says whether an LF belongs to it, and if the body ends first, the event
    /// ended at that CR.
    pub fn error_pending(&self) -> bool {
        self.stopped && self.pending_cr
    }

    /// The stream so far ends in a CR that ended a blank line: a block boundary whose LF, if
    /// it is a CRLF, has not come. A writer that appends events after it (the gateway's cut)
    /// writes that LF first: to the standard it completes the CRLF, so it is no extra line,
    /// and readers that know only `\r\n\r\n`, `\n\n` and `\r\r` as block ends (sseclient-py)
    /// then see the block end and do not merge the next event into it (audit PB 1).
    pub fn ends_in_blank_cr(&self) -> bool {
        !self.stopped && self.pending_cr && self.cr_was_blank
    }

    /// True when bytes have been seen since the last block boundary (a partial block is
    /// open). A complete leading BOM does not count; a partial one does, since it may turn
    /// out to be line content.
    pub fn in_block(&self) -> bool {
        self.block_open || self.prefix_len > 0 || self.bom.partial()
    }

    /// An event is open that would have dispatched had its blank line come: it has a `data`
    /// line, or is in one. (A block of comments, `id:` or `retry:` dispatches nothing.)
    pub fn open_event(&self) -> bool {
        !self.stopped
            && (self.has_data || matches!(self.data_line, DataLine::Space | DataLine::Value))
    }

    /// Appends the next bytes of the line in progress, keeping only its first `PREFIX`.
    fn push_prefix(&mut self, bytes: &[u8]) {
        let len = usize::from(self.prefix_len);
        let take = bytes.len().min(PREFIX - len);
        self.prefix[len..len + take].copy_from_slice(&bytes[..take]);
        // `len + take <= PREFIX`, which fits in a u8.
        self.prefix_len = (len + take) as u8;
    }

    /// Ends the open block at a blank line, counting its event if it dispatches. Returns
    /// `Some` when the dispatched event is an `error`, or one the sink calls the provider's
    /// (`Some(false)`), or a block of an `error` field and no data that the sink reads as the
    /// provider's error (`Some(true)`).
    fn end_block<S: EventSink>(&mut self, out: &mut Scan, sink: &mut S) -> Option<bool> {
        let dispatches = std::mem::take(&mut self.has_data);
        let kind = std::mem::take(&mut self.kind);
        self.block_open = false;
        let provider_error = sink.end_event(dispatches, kind);
        if std::mem::take(&mut self.error_field) && sink.error_block_end(dispatches) {
            return Some(true);
        }
        if !dispatches {
            return None;
        }
        match kind {
            EventType::Other => out.progress = out.progress.saturating_add(1),
            EventType::Ping => {}
            EventType::Error => return Some(false),
        }
        out.dispatched = out.dispatched.saturating_add(1);
        provider_error.then_some(false)
    }
}

/// Position of the next CR or LF. Checking the first byte before calling `memchr2` pays
/// off because every event ends with a blank line, which starts with its terminator.
#[inline]
fn find_eol(s: &[u8]) -> Option<usize> {
    match s.first() {
        Some(b'\n' | b'\r') => Some(0),
        _ => memchr2(b'\n', b'\r', s),
    }
}

/// Classifies a line from its first bytes `head` (at most `PREFIX` of them).
#[inline]
fn classify(head: &[u8]) -> Line {
    if head.starts_with(b"data:") {
        return Line::Data;
    }
    let (name, value) = match head.iter().position(|&b| b == b':') {
        Some(0) => return Line::Ignored,
        Some(colon) => (&head[..colon], &head[colon + 1..]),
        None if head.is_empty() => return Line::Blank,
        None => (head, &[][..]),
    };
    match name {
        b"data" => Line::Data,
        b"error" => Line::Error,
        b"event" => Line::Event(match value.strip_prefix(b" ").unwrap_or(value) {
            b"ping" | b"keepalive" => EventType::Ping,
            b"error" => EventType::Error,
            _ => EventType::Other,
        }),
        _ => Line::Ignored,
    }
}

#[cfg(test)]
pub(crate) mod tests;
