//! The JSON side of the inspector: a tokenizer that follows only the paths of keys that
//! matter (`choices[].delta`, `usage`, `error`, ...) through one document or one event's
//! data, in pieces, keeping a few dozen bytes of state.

use memchr::{memchr2, memchr3};

use super::event::{event_kind, Event, Kind};
use super::tokens::{PromptPart, Tokens, MAX_REPORTED_TOKENS};
use crate::provider::ErrorType;

/// Nesting levels whose meaning is tracked; anything deeper is ignored (but still balanced).
const MAX_DEPTH: usize = 8;
/// Leading bytes of a key or named value that are kept: longer than every name that matters.
/// The longest event type of the Responses API is 44 bytes; a longer type is not read whole
/// and counts as unknown.
const CAP: usize = 48;
const _: () = assert!(CAP >= b"response.image_generation_call.partial_image".len());
const _: () = assert!(CAP >= b"response.function_call_arguments.delta".len());

/// The meaning of a JSON container, from the path of keys that leads to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctx {
    Root,
    Choices,
    Choice,
    Delta,
    ToolCalls,
    ToolCall,
    ToolFunction,
    Usage,
    Message,
    /// `message.usage` of Anthropic's `message_start`: its prompt tokens only (its output
    /// count is a placeholder until `message_delta`).
    MessageUsage,
    Response,
    /// Groq's `x_groq`, whose `usage` is a stream's usage unless `include_usage` asked for
    /// a top-level one.
    XGroq,
    /// `x_groq.usage`, or Moonshot's `choices[i].usage`: the usage unless the event has a
    /// top-level one, which wins whatever their order, as in the document rebuilt from the
    /// stream (audit HB4).
    GroqUsage,
    ErrorRoot,
    ErrorNested,
    BlockDelta,
    ContentBlock,
    /// A container under a Chat delta (`audio`, `reasoning_details`, ...): output if not empty.
    Payload,
    /// The `item` of a Responses `output_item` event: its `arguments` are output.
    Item,
    /// `item.content`, and one part of it: its `text` or `refusal` is output.
    ItemParts,
    ItemPart,
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Other,
    Role,
    Signature,
    Choices,
    Delta,
    Message,
    Content,
    ReasoningContent,
    Reasoning,
    Refusal,
    ToolCalls,
    Function,
    FunctionCall,
    Name,
    Arguments,
    Text,
    Thinking,
    PartialJson,
    Type,
    Code,
    Error,
    Usage,
    Response,
    ContentBlock,
    PromptTokens,
    CompletionTokens,
    InputTokens,
    OutputTokens,
    CacheCreationInputTokens,
    CacheReadInputTokens,
    StopReason,
    FinishReason,
    Index,
    Object,
    ErrorType,
    XGroq,
    Item,
}

fn key(name: &[u8]) -> Key {
    match name {
        b"choices" => Key::Choices,
        b"role" => Key::Role,
        b"signature" => Key::Signature,
        b"delta" => Key::Delta,
        b"message" => Key::Message,
        b"content" => Key::Content,
        b"reasoning_content" => Key::ReasoningContent,
        b"reasoning" => Key::Reasoning,
        b"refusal" => Key::Refusal,
        b"tool_calls" => Key::ToolCalls,
        b"function" => Key::Function,
        b"function_call" => Key::FunctionCall,
        b"name" => Key::Name,
        b"arguments" => Key::Arguments,
        b"text" => Key::Text,
        b"thinking" => Key::Thinking,
        b"partial_json" => Key::PartialJson,
        b"type" => Key::Type,
        b"code" => Key::Code,
        b"error" => Key::Error,
        b"usage" => Key::Usage,
        b"response" => Key::Response,
        b"content_block" => Key::ContentBlock,
        b"prompt_tokens" => Key::PromptTokens,
        b"completion_tokens" => Key::CompletionTokens,
        b"input_tokens" => Key::InputTokens,
        b"output_tokens" => Key::OutputTokens,
        b"cache_creation_input_tokens" => Key::CacheCreationInputTokens,
        b"cache_read_input_tokens" => Key::CacheReadInputTokens,
        b"finish_reason" => Key::FinishReason,
        b"stop_reason" => Key::StopReason,
        b"index" => Key::Index,
        b"object" => Key::Object,
        b"error_type" => Key::ErrorType,
        b"x_groq" => Key::XGroq,
        b"item" => Key::Item,
        _ => Key::Other,
    }
}

/// The context of a container opened under `key` (or as an array element) inside `parent`.
fn child(parent: Ctx, key: Key, array: bool) -> Ctx {
    use Ctx::*;
    match (parent, key, array) {
        (Root, Key::Choices, true) => Choices,
        (Root, Key::Usage, false) => Usage,
        (Root, Key::Message, false) => Message,
        (Root, Key::Response, false) => Response,
        (Root, Key::XGroq, false) => XGroq,
        (XGroq, Key::Usage, false) => GroqUsage,
        // Moonshot's (Kimi's) usage, in its last chunk's choice: the same fallback (ZB 6).
        (Choice, Key::Usage, false) => GroqUsage,
        (Root, Key::Error, false) => ErrorRoot,
        (Root, Key::Delta, false) => BlockDelta,
        (Root, Key::ContentBlock, false) => ContentBlock,
        (Root, Key::Item, false) => Item,
        (Item, Key::Content, true) => ItemParts,
        (Choice, Key::Delta, false) => Delta,
        (Delta, Key::ToolCalls, true) => ToolCalls,
        (Delta, Key::FunctionCall, false) => ToolFunction,
        (Delta | BlockDelta, Key::Role | Key::Type | Key::Signature, _) => Other,
        (Delta | BlockDelta, _, _) => Payload,
        (ToolCall, Key::Function, false) => ToolFunction,
        (Message, Key::Usage, false) => MessageUsage,
        (Response, Key::Usage, false) => Usage,
        (Response, Key::Error, false) => ErrorNested,
        _ => Other,
    }
}

/// Told where the reader passed a value whose bytes do not matter to what it finds, only its
/// kind: a string it skips or counts, or a scalar it skips (see `shape`, which replays an
/// event from these). Addresses are of the piece being fed, so the hook costs nothing to
/// the reader that does not record (`()`).
pub(super) trait Holes {
    /// The content (between the quotes) of a string that is skipped, or counted as output
    /// (`output`), starting at address `at`.
    fn string(&mut self, at: usize, len: usize, output: bool);
    /// A number or literal skipped whole, starting at address `at`.
    fn scalar(&mut self, at: usize, len: usize);
}

impl Holes for () {
    #[inline(always)]
    fn string(&mut self, _: usize, _: usize, _: bool) {}
    #[inline(always)]
    fn scalar(&mut self, _: usize, _: usize) {}
}

/// What the string being read is to the reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Str {
    /// Not needed: skipped.
    Skip,
    /// Inside a delta's container: its presence makes the container non-empty.
    Payload,
    /// An object key: its name is kept.
    Key,
    /// Model output: its length is counted.
    Output,
    /// A value to name (`type`, `code`): its first bytes are kept.
    Named,
}

/// A JSON reader that follows only the paths that matter. Tolerates anything (a `[DONE]`,
/// garbage): it never fails, it just finds nothing.
#[derive(Debug, Clone)]
pub(super) struct Json {
    /// Nesting depth (u32: the reader must stay small; 4 billion levels never come).
    depth: u32,
    /// `ctx[d - 1]` is the context of the container at depth `d` (depths start at 1).
    ctx: [Ctx; MAX_DEPTH],
    /// Bit `d`: the container at depth `d` is an array.
    arrays: u32,
    /// The innermost container's context and whether it is an array: what `ctx[depth - 1]` and
    /// `arrays` say, kept by `open` and `close` because every token reads them. `Other`
    /// outside any tracked container (at depth 0 too): there only strings and brackets
    /// matter.
    cur: Ctx,
    cur_array: bool,
    /// The last key read in the innermost object.
    key: Key,
    /// The next string in the innermost object is a key.
    expect_key: bool,
    /// The next token is a value (after `:`, `[` or an array's `,`).
    value_pos: bool,
    in_str: Option<Str>,
    escaped: bool,
    /// The previous piece ended inside a scalar being skipped (a number or literal nothing
    /// needs, or garbage): the next one goes on skipping it to its delimiter.
    in_scalar: bool,
    cap: [u8; CAP],
    /// Bytes of the current string (escapes counted as written).
    str_len: u64,
    /// A number being read for a usage key, and whether it is still a plain integer.
    num: Option<(Key, u64, bool)>,
    /// Usage read in the open usage object, committed when it closes: the prompt's parts
    /// (`PromptPart` as the index), then the completion (`COMPLETION`); bit `i` of
    /// `usage_seen`: slot `i` was read. Each part is committed alone, so that a usage that
    /// names only some of them leaves the others as they were.
    usage: [u64; 4],
    usage_seen: u8,
    /// The event had a top-level (or `response.usage`) usage: `x_groq.usage` is then not read.
    top_usage: bool,
    /// The index of the Chat choice being read (`WIDE` when it is 64 or more, or not a
    /// plain integer; 0 until its `index` is read), and whether it has a finish reason:
    /// told to the event when the choice closes.
    choice: u8,
    choice_finished: bool,
    /// An error object's numeric `code` (Gemini's `{"error":{"code":429,...}}`, OpenRouter's),
    /// which types the error as the HTTP status it is.
    /// Past a `u16`, `u16::MAX`: no status either way; small, to keep the inspector inline.
    error_status: Option<u16>,
}

/// The slot of `Json::usage` that holds the completion, after the prompt's parts.
const COMPLETION: usize = 3;
const PROMPT_PARTS: [PromptPart; 3] = [
    PromptPart::Input,
    PromptPart::CacheWrite,
    PromptPart::CacheRead,
];

/// A choice index that no bit of a `u64` mask holds.
const WIDE: u8 = 64;

impl Default for Json {
    fn default() -> Self {
        Self {
            depth: 0,
            ctx: [Ctx::Other; MAX_DEPTH],
            arrays: 0,
            cur: Ctx::Other,
            cur_array: false,
            key: Key::Other,
            expect_key: false,
            value_pos: true,
            in_str: None,
            escaped: false,
            in_scalar: false,
            cap: [0; CAP],
            str_len: 0,
            num: None,
            usage: [0; 4],
            usage_seen: 0,
            top_usage: false,
            choice: 0,
            choice_finished: false,
            error_status: None,
        }
    }
}

impl Json {
    /// Ready for the next event's data (what `default` gives, without rewriting the buffers).
    pub(super) fn reset(&mut self) {
        self.depth = 0;
        self.enter();
        self.key = Key::Other;
        self.expect_key = false;
        self.value_pos = true;
        self.in_str = None;
        self.escaped = false;
        self.in_scalar = false;
        self.num = None;
        self.usage_seen = 0;
        self.top_usage = false;
        self.error_status = None;
    }

    /// The event had a top-level usage object (or the Responses `response.usage`); a
    /// `"usage": null` is none.
    pub(super) fn top_usage(&self) -> bool {
        self.top_usage
    }

    /// The numeric `code` of the event's error object, or the event's own (the Responses
    /// `error` event's), if it had one.
    pub(super) fn error_status(&self) -> Option<u64> {
        self.error_status.map(u64::from)
    }

    /// Whether the piece read last ended outside any value: back at depth 0, not in a string
    /// or number.
    pub(super) fn at_rest(&self) -> bool {
        self.depth == 0 && self.in_str.is_none() && self.num.is_none() && !self.escaped
    }

    /// Makes `cur` and `cur_array` describe the container at `depth`: the one place they are
    /// derived from `ctx` and `arrays`.
    fn enter(&mut self) {
        self.cur = match self.depth as usize {
            0 => Ctx::Other,
            d if d <= MAX_DEPTH => self.ctx[d - 1],
            _ => Ctx::Other,
        };
        self.cur_array = self.depth < 32 && self.arrays & (1 << self.depth) != 0;
    }

    /// Reads the next bytes of one document (or of one event's data), telling `holes` where
    /// the values that do not matter were.
    pub(super) fn feed<H: Holes>(
        &mut self,
        s: &[u8],
        ev: &mut Event,
        tokens: &mut Tokens,
        holes: &mut H,
    ) {
        // What the previous piece left open: a string or a usage number. Both are read to
        // their end where they start, so the loop below need not ask on every byte.
        let mut i = 0;
        if let Some(kind) = self.in_str {
            match self.string_rest(kind, s, ev) {
                Some(n) => i = n,
                None => return,
            }
        } else if self.num.is_some() {
            i = self.number_rest(s);
        } else if self.in_scalar {
            i = self.skip_scalar(s);
        }
        while i < s.len() {
            if self.cur == Ctx::Other {
                // Nothing matters here but strings and brackets: skip to the next one.
                match next_structural(&s[i..]) {
                    Some(j) => i += j,
                    None => return,
                }
            }
            let b = s[i];
            i += 1;
            match b {
                b'"' => match self.string(&s[i..], ev, holes) {
                    Some(n) => i += n,
                    None => return,
                },
                b'{' => self.open(false, ev),
                b'[' => self.open(true, ev),
                b'}' | b']' => self.close(tokens, ev),
                b':' => {
                    self.expect_key = false;
                    self.value_pos = true;
                }
                b',' => {
                    self.expect_key = !self.cur_array;
                    self.value_pos = self.cur_array;
                }
                b'0'..=b'9' if self.value_pos => {
                    self.value_pos = false;
                    if self.number_read() {
                        self.num = Some((self.key, u64::from(b - b'0'), true));
                        i += self.number_rest(&s[i..]);
                    } else {
                        // A number nothing needs: skip the rest of it at once.
                        let n = self.skip_scalar(&s[i..]);
                        holes.scalar(s[i - 1..].as_ptr() as usize, n + 1);
                        i += n;
                    }
                }
                b' ' | b'\t' | b'\n' | b'\r' => {}
                _ => {
                    if std::mem::take(&mut self.value_pos) {
                        let n = self.skip_scalar(&s[i..]);
                        holes.scalar(s[i - 1..].as_ptr() as usize, n + 1);
                        i += n;
                    }
                }
            }
        }
    }

    /// Whether a number here is read (a usage count, a choice's index), not skipped: then no
    /// shape has a hole for it, and an event with another number fits no shape that had this.
    #[inline(always)]
    fn number_read(&self) -> bool {
        match self.cur {
            Ctx::Usage | Ctx::MessageUsage | Ctx::GroqUsage => true,
            Ctx::Choice => self.key == Key::Index,
            Ctx::ErrorRoot | Ctx::ErrorNested => self.key == Key::Code,
            // The Responses `error` event's `code` (`{"type":"error","code":429,...}`).
            Ctx::Root => self.key == Key::Code,
            _ => false,
        }
    }

    /// Reads the digits of the open usage number from the start of `s`; returns how many
    /// bytes it took. A byte that cannot continue a number ends it (and is not taken).
    fn number_rest(&mut self, s: &[u8]) -> usize {
        let Some((key, mut n, mut plain)) = self.num else {
            return 0;
        };
        for (j, &b) in s.iter().enumerate() {
            match b {
                b'0'..=b'9' => n = n.saturating_mul(10).saturating_add(u64::from(b - b'0')),
                b'.' | b'e' | b'E' | b'+' | b'-' => plain = false,
                _ => {
                    self.num = Some((key, n, plain));
                    self.end_number();
                    return j;
                }
            }
        }
        self.num = Some((key, n, plain));
        s.len()
    }

    /// The end of a `data` line: a number at its very end is complete (and a line end ends
    /// any scalar).
    /// A value is still open: a container not closed, or a string not ended. At a JSON
    /// document's end, the document was cut short.
    pub(super) fn open_value(&self) -> bool {
        self.depth > 0 || self.in_str.is_some()
    }

    pub(super) fn line_break(&mut self) {
        if self.num.is_some() {
            self.end_number();
        }
        self.in_scalar = false;
    }

    /// Skips the rest of a scalar from the start of `s`, up to its delimiter (which is not
    /// taken); returns how much it took. One rule wherever a scalar starts, and it goes on
    /// in the next piece when `s` ends first, so what is skipped never depends on the cuts
    /// (it matters only for garbage: in JSON a scalar ends where the rule says).
    #[inline]
    fn skip_scalar(&mut self, s: &[u8]) -> usize {
        let n = skip_scalar(s);
        self.in_scalar = n == s.len();
        n
    }

    /// Reads a string whose opening quote was just read, from `rest` (what follows it):
    /// at once when it ends in `rest` without escapes (the common case: no copy), else byte
    /// run by byte run. Returns how much of `rest` it used, `None` when the piece ended
    /// inside the string.
    #[inline]
    fn string<H: Holes>(&mut self, rest: &[u8], ev: &mut Event, holes: &mut H) -> Option<usize> {
        let kind = self.str_kind();
        self.value_pos = false;
        if let Some(j) = string_end(rest) {
            if rest[j] == b'"' {
                let body = &rest[..j];
                match kind {
                    Str::Skip => holes.string(rest.as_ptr() as usize, j, false),
                    Str::Key => {
                        // No key that matters is longer than `CAP`: a longer one is `Other`.
                        self.key = key(body);
                        // A key is followed by its colon, and most values by nothing that
                        // matters: both are read now rather than on further turns.
                        if rest.get(j + 1) == Some(&b':') {
                            self.expect_key = false;
                            self.value_pos = true;
                            let value = j + 2;
                            return Some(value + self.skip_value(&rest[value..], holes));
                        }
                    }
                    _ => {
                        if kind == Str::Output {
                            holes.string(rest.as_ptr() as usize, j, true);
                        }
                        let name = if body.len() <= CAP { body } else { &[] };
                        self.end_str(kind, name, body.len() as u64, ev);
                    }
                }
                return Some(j + 1);
            }
        }
        self.in_str = Some(kind);
        self.str_len = 0;
        let used = self.string_rest(kind, rest, ev);
        if let (Some(n), Str::Skip | Str::Output) = (used, kind) {
            holes.string(rest.as_ptr() as usize, n - 1, kind == Str::Output);
        }
        used
    }

    /// Skips the value at the start of `s` when nothing needs it: a string the reader would
    /// skip (whole, without escapes) or a scalar outside usage, with the comma after it.
    /// Returns how many bytes it took; 0 leaves the value to the main loop.
    #[inline]
    fn skip_value<H: Holes>(&mut self, s: &[u8], holes: &mut H) -> usize {
        let taken = match s.first() {
            Some(b'"') if self.str_kind() == Str::Skip => match string_end(&s[1..]) {
                Some(j) if s[1 + j] == b'"' => {
                    holes.string(s[1..].as_ptr() as usize, j, false);
                    j + 2
                }
                _ => 0,
            },
            Some(b'0'..=b'9') if self.number_read() => 0,
            // Numbers and literals end where the main loop's `skip_scalar` would end them;
            // one that runs to the end of the piece is left to it, to go on in the next.
            Some(b'0'..=b'9' | b'-' | b'n' | b't' | b'f') => match skip_scalar(s) {
                n if n < s.len() => {
                    holes.scalar(s.as_ptr() as usize, n);
                    n
                }
                _ => 0,
            },
            _ => 0,
        };
        if taken == 0 {
            return 0;
        }
        self.value_pos = false;
        // And the comma after it, which nearly always follows at once.
        if s.get(taken) == Some(&b',') {
            self.expect_key = !self.cur_array;
            self.value_pos = self.cur_array;
            return taken + 1;
        }
        taken
    }

    /// Reads the open string (escapes and all) from the start of `s`: how much of `s` it
    /// used up to and with its closing quote, or `None` when `s` ended first.
    fn string_rest(&mut self, kind: Str, s: &[u8], ev: &mut Event) -> Option<usize> {
        let mut i = 0;
        loop {
            if self.escaped {
                if i == s.len() {
                    return None;
                }
                // The byte after a backslash is content; names never contain escapes.
                self.escaped = false;
                self.str_len += 1;
                if kind != Str::Output {
                    self.str_len = CAP as u64 + 1;
                }
                i += 1;
            }
            let rest = &s[i..];
            let Some(j) = string_end(rest) else {
                self.str_bytes(kind, rest);
                return None;
            };
            self.str_bytes(kind, &rest[..j]);
            i += j + 1;
            if rest[j] == b'\\' {
                self.escaped = true;
                self.str_len += 1;
            } else {
                self.in_str = None;
                self.end_split_str(kind, ev);
                return Some(i);
            }
        }
    }

    #[inline(always)]
    fn str_kind(&self) -> Str {
        let ctx = self.cur;
        if ctx == Ctx::Other {
            Str::Skip
        } else if ctx == Ctx::Payload {
            Str::Payload
        } else if self.expect_key && !self.cur_array {
            Str::Key
        } else {
            use Key::*;
            match (ctx, self.key) {
                (Ctx::Delta | Ctx::BlockDelta, Role | Type | Signature) => Str::Skip,
                // `message_delta`'s: the Messages answer's end, as a Chat finish reason.
                (Ctx::BlockDelta, StopReason) => Str::Named,
                (Ctx::Root, Delta)
                | (Ctx::Choice, Text)
                | (Ctx::Delta | Ctx::BlockDelta, _)
                | (Ctx::ToolFunction, Name | Arguments)
                | (Ctx::ContentBlock, Text | Thinking)
                | (Ctx::Item, Arguments)
                | (Ctx::ItemPart, Text | Refusal) => Str::Output,
                (Ctx::Root, Type | Code | Error | Object | ErrorType)
                | (Ctx::Choice, FinishReason)
                | (Ctx::ContentBlock, Type)
                | (Ctx::ErrorRoot | Ctx::ErrorNested, Type | Code) => Str::Named,
                _ => Str::Skip,
            }
        }
    }

    #[inline]
    fn str_bytes(&mut self, kind: Str, bytes: &[u8]) {
        if matches!(kind, Str::Key | Str::Named) {
            let have = self.str_len as usize;
            if have < CAP {
                let take = bytes.len().min(CAP - have);
                self.cap[have..have + take].copy_from_slice(&bytes[..take]);
            }
        }
        self.str_len = self.str_len.saturating_add(bytes.len() as u64);
    }

    /// The end of a string read byte run by byte run: its kept bytes, if it was short enough
    /// to be kept whole.
    fn end_split_str(&mut self, kind: Str, ev: &mut Event) {
        let (cap, len) = (self.cap, self.str_len);
        let name = if len as usize <= CAP {
            &cap[..len as usize]
        } else {
            &[]
        };
        self.end_str(kind, name, len, ev);
    }

    /// A string of `len` bytes has been read; `name` is all of it when it is at most `CAP`
    /// bytes without escapes, else empty (no name that matters is longer).
    fn end_str(&mut self, kind: Str, name: &[u8], len: u64, ev: &mut Event) {
        match kind {
            Str::Skip => {}
            Str::Payload => ev.output = true,
            Str::Key => self.key = key(name),
            // Non-empty output shows in `output_bytes` (see `Event::is_output`), so that a
            // replayed event (`shape`) can add its own.
            Str::Output => ev.output_bytes += len,
            Str::Named => {
                match (self.cur, self.key) {
                    (Ctx::Root, Key::Type) => {
                        // A name longer than kept is none of the known ones.
                        ev.kind = if name.is_empty() {
                            Kind::Unknown
                        } else {
                            event_kind(name)
                        };
                        if ev.kind == Kind::Error {
                            ev.error = true;
                        }
                        // vLLM's error object names its kind here.
                        if ev.kind == Kind::Unknown {
                            ev.error_type = ev.error_type.or(ErrorType::parse(name));
                        }
                        // The last event of an answer that ended as it should.
                        ev.last = matches!(
                            name,
                            b"message_stop"
                                | b"response.completed"
                                | b"response.incomplete"
                                | b"response.failed"
                        );
                        ev.finished |= ev.last;
                        ev.failed |= name == b"response.failed";
                    }
                    (Ctx::BlockDelta, Key::StopReason) => ev.finished = true,
                    // sglang, Ollama and koboldcpp (before their fixes) send `""` (koboldcpp
                    // `"null"`) on every chunk before the last: no reason, so no end, as the
                    // SDKs read it (audit ZB 1). A name too long to keep, or escaped, is one.
                    (Ctx::Choice, Key::FinishReason) => {
                        if len > 0 && name != b"null" {
                            ev.finished = true;
                            self.choice_finished = true;
                        }
                    }
                    (Ctx::Root, Key::Code) => ev.root_code = ErrorType::parse(name),
                    // The errors of compatible servers that are no error object: TGI's and
                    // llama.cpp's `{"error":"..."}`, vLLM's `{"object":"error",...}`.
                    (Ctx::Root, Key::Error) => ev.error |= len > 0,
                    (Ctx::Root, Key::Object) => ev.error |= name == b"error",
                    (Ctx::Root, Key::ErrorType) => ev.error_type = ErrorType::parse(name),
                    (Ctx::ContentBlock, _) => {
                        // A block that starts as anything but (empty) text or thinking: a
                        // tool call, redacted thinking, a server tool's result.
                        if !matches!(name, b"text" | b"thinking") {
                            ev.output = true;
                        }
                    }
                    (_, Key::Type) => ev.error_type = ErrorType::parse(name),
                    (_, _) => ev.error_code = ErrorType::parse(name),
                }
            }
        }
    }

    fn open(&mut self, array: bool, ev: &mut Event) {
        let ctx = match self.depth {
            0 if !array => Ctx::Root,
            0 => Ctx::Other,
            _ => {
                let parent = self.cur;
                if parent == Ctx::Payload {
                    ev.output = true;
                    Ctx::Other
                } else if self.cur_array {
                    match parent {
                        Ctx::Choices if !array => Ctx::Choice,
                        Ctx::ItemParts if !array => Ctx::ItemPart,
                        // A tool-call delta is model output, whatever it carries.
                        Ctx::ToolCalls if !array => {
                            ev.output = true;
                            Ctx::ToolCall
                        }
                        _ => Ctx::Other,
                    }
                } else {
                    child(parent, self.key, array)
                }
            }
        };
        match ctx {
            Ctx::ErrorRoot => {
                ev.error = true;
                ev.error_object = true;
            }
            Ctx::ErrorNested => ev.nested_error = true,
            Ctx::Choices => ev.choices = true,
            Ctx::Choice => {
                self.choice = 0;
                self.choice_finished = false;
            }
            _ => {}
        }
        self.depth = self.depth.saturating_add(1);
        if self.depth as usize <= MAX_DEPTH {
            self.ctx[self.depth as usize - 1] = ctx;
        }
        if self.depth < 32 {
            if array {
                self.arrays |= 1 << self.depth;
            } else {
                self.arrays &= !(1 << self.depth);
            }
        }
        self.enter();
        self.key = Key::Other;
        self.expect_key = !array;
        self.value_pos = array;
    }

    fn close(&mut self, tokens: &mut Tokens, ev: &mut Event) {
        if self.depth == 0 {
            return;
        }
        match self.cur {
            Ctx::Choice if self.choice < WIDE => {
                ev.choices_seen |= 1 << self.choice;
                if self.choice_finished {
                    ev.choices_done |= 1 << self.choice;
                }
            }
            Ctx::Choice => ev.choices_wide = true,
            Ctx::GroqUsage if self.top_usage => self.usage_seen = 0,
            ctx @ (Ctx::Usage | Ctx::MessageUsage | Ctx::GroqUsage) => {
                // A top-level usage read after `x_groq`'s replaces the counts it names.
                self.top_usage |= ctx == Ctx::Usage;
                let seen = std::mem::take(&mut self.usage_seen);
                for part in PROMPT_PARTS {
                    if seen & (1 << part as usize) != 0 {
                        tokens.set_prompt_part(part, self.usage[part as usize]);
                    }
                }
                // message_start's output count is a placeholder until message_delta.
                if ctx != Ctx::MessageUsage && seen & (1 << COMPLETION) != 0 {
                    tokens.completion = Some(self.usage[COMPLETION]);
                }
            }
            _ => {}
        }
        self.depth -= 1;
        self.enter();
        self.key = Key::Other;
        self.expect_key = false;
        self.value_pos = false;
    }

    fn end_number(&mut self) {
        let Some((key, n, plain)) = self.num.take() else {
            return;
        };
        if self.cur == Ctx::Choice {
            // `key` is `index` (the one number read in a choice).
            self.choice = if plain {
                n.min(u64::from(WIDE)) as u8
            } else {
                WIDE
            };
            return;
        }
        if !plain {
            return;
        }
        if matches!(self.cur, Ctx::ErrorRoot | Ctx::ErrorNested)
            || (self.cur == Ctx::Root && key == Key::Code)
        {
            self.error_status = Some(u16::try_from(n).unwrap_or(u16::MAX));
            return;
        }
        let slot = match key {
            Key::PromptTokens | Key::InputTokens => PromptPart::Input as usize,
            Key::CacheCreationInputTokens => PromptPart::CacheWrite as usize,
            Key::CacheReadInputTokens => PromptPart::CacheRead as usize,
            Key::CompletionTokens | Key::OutputTokens => COMPLETION,
            _ => return,
        };
        // Capped: a count past any answer's (up to one past 64 bits, read as u64::MAX) would
        // wrap the token counters it is added to, and the sums made of it (audit WD 1).
        self.usage[slot] = n.min(MAX_REPORTED_TOKENS);
        self.usage_seen |= 1 << slot;
    }
}

/// The end of a string's content: the next quote or backslash. Most strings in these streams
/// are short, where a plain loop beats `memchr`'s setup; longer ones go to `memchr`.
#[inline]
pub(super) fn string_end(s: &[u8]) -> Option<usize> {
    // Eight bytes at a time for the first sixteen: a byte equal to `"` or `\` turns into a
    // zero after the XOR, and the lowest set bit of the zero-byte mask is exact.
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let mut at = 0;
    while at < 16 {
        let Some(word) = s.get(at..at + 8) else {
            return s[at..]
                .iter()
                .position(|&b| b == b'"' || b == b'\\')
                .map(|j| at + j);
        };
        let w = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        let hit = zero(w ^ (ONES * u64::from(b'"'))) | zero(w ^ (ONES * u64::from(b'\\')));
        if hit != 0 {
            return Some(at + hit.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    memchr2(b'"', b'\\', &s[16..]).map(|j| j + 16)
}

/// The length of the rest of a number or literal (`null`, `true`, `false`).
#[inline]
pub(super) fn skip_scalar(s: &[u8]) -> usize {
    s.iter()
        .position(|&b| matches!(b, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'))
        .unwrap_or(s.len())
}

/// The next quote or bracket, in time linear in the distance to it. What lies between two of
/// them is nearly always short (a colon, a comma, a number), where a plain loop beats the
/// setup of two `memchr`s; a long run goes to them.
#[inline]
fn next_structural(s: &[u8]) -> Option<usize> {
    const NEAR: usize = 16;
    if let Some(i) = s
        .iter()
        .take(NEAR)
        .position(|b| matches!(b, b'"' | b'{' | b'[' | b'}' | b']'))
    {
        return Some(i);
    }
    let s = s.get(NEAR..)?;
    let open = memchr3(b'"', b'{', b'[', s);
    let close = memchr2(b'}', b']', &s[..open.unwrap_or(s.len())]);
    close.or(open).map(|i| i + NEAR)
}
