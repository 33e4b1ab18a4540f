//! Reading a provider's answer as it passes, without buffering it: which events carry model
//! output (the first token), the token usage the provider reports, an estimate of the output
//! when it reports none, and the provider's own mid-stream errors.
//!
//! [`Inspector`] is fed the body's bytes in whatever pieces they arrive, like `sse`'s scanner,
//! and keeps about two hundred bytes of state: where it is in the current SSE line, and a small
//! JSON tokenizer that tracks only the path of keys that matter (`choices[].delta`,
//! `usage.output_tokens`, `error.type`, ...). Strings are skipped with `memchr`; only keys on
//! those paths, and the few values it needs to name (`type`, `code`), are looked at, and only
//! their first 64 bytes are kept. Usage numbers are read digit by digit, so nothing is parsed
//! into a `serde_json::Value` and nothing is allocated.
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

use memchr::{memchr2, memchr3};

use crate::provider::{ErrorType, Format};

/// The UTF-8 byte order mark, stripped once at stream start (as `sse` does).
const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];
/// Nesting levels whose meaning is tracked; anything deeper is ignored (but still balanced).
const MAX_DEPTH: usize = 8;
/// Leading bytes of a key or named value that are kept: longer than every name that matters.
const CAP: usize = 64;
const _: () = assert!(CAP >= b"response.function_call_arguments.delta".len());

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
    started: bool,
    bom_matched: u8,
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
    ErrorRoot,
    ErrorNested,
    BlockDelta,
    ContentBlock,
    /// A container under a Chat delta (`audio`, `reasoning_details`, ...): output if not empty.
    Payload,
    Other,
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
        (Root, Key::Error, false) => ErrorRoot,
        (Root, Key::Delta, false) => BlockDelta,
        (Root, Key::ContentBlock, false) => ContentBlock,
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
struct Json {
    depth: usize,
    /// `ctx[d]` is the context of the container at depth `d` (1-based; `ctx[0]` unused).
    ctx: [Ctx; MAX_DEPTH + 1],
    /// Bit `d`: the container at depth `d` is an array.
    arrays: u32,
    /// The last key read in the innermost object.
    key: Key,
    /// The next string in the innermost object is a key.
    expect_key: bool,
    /// The next token is a value (after `:`, `[` or an array's `,`).
    value_pos: bool,
    in_str: Option<Str>,
    escaped: bool,
    cap: [u8; CAP],
    /// Bytes of the current string (escapes counted as written).
    str_len: u64,
    /// A number being read for a usage key, and whether it is still a plain integer.
    num: Option<(Key, u64, bool)>,
    /// Usage read in the open usage object, committed when it closes.
    prompt: Option<u64>,
    completion: Option<u64>,
    /// Outside any tracked container (`depth == 0` or an `Other` one): only strings and
    /// brackets matter.
    skip: bool,
}

impl Default for Json {
    fn default() -> Self {
        Self {
            depth: 0,
            ctx: [Ctx::Other; MAX_DEPTH + 1],
            arrays: 0,
            key: Key::Other,
            expect_key: false,
            value_pos: true,
            in_str: None,
            escaped: false,
            cap: [0; CAP],
            str_len: 0,
            num: None,
            prompt: None,
            completion: None,
            skip: true,
        }
    }
}

impl Json {
    /// Ready for the next event's data (what `default` gives, without rewriting the buffers).
    fn reset(&mut self) {
        self.depth = 0;
        self.key = Key::Other;
        self.expect_key = false;
        self.value_pos = true;
        self.in_str = None;
        self.escaped = false;
        self.num = None;
        self.prompt = None;
        self.completion = None;
        self.skip = true;
    }

    fn ctx(&self) -> Ctx {
        match self.depth {
            0 => Ctx::Other,
            d if d <= MAX_DEPTH => self.ctx[d],
            _ => Ctx::Other,
        }
    }

    fn in_array(&self) -> bool {
        self.depth < 32 && self.arrays & (1 << self.depth) != 0
    }

    /// Reads the next bytes of one document (or of one event's data).
    fn feed(&mut self, s: &[u8], ev: &mut Event, tokens: &mut Tokens) {
        let mut i = 0;
        while i < s.len() {
            if let Some(kind) = self.in_str {
                if self.escaped {
                    // The byte after a backslash is content; names never contain escapes.
                    self.escaped = false;
                    self.str_len += 1;
                    if kind != Str::Output {
                        self.str_len = CAP as u64 + 1;
                    }
                    i += 1;
                    continue;
                }
                let rest = &s[i..];
                match string_end(rest) {
                    None => {
                        self.str_bytes(kind, rest);
                        return;
                    }
                    Some(j) => {
                        self.str_bytes(kind, &rest[..j]);
                        i += j + 1;
                        if rest[j] == b'\\' {
                            self.escaped = true;
                            self.str_len += 1;
                        } else {
                            self.in_str = None;
                            self.end_split_str(kind, ev);
                        }
                    }
                }
                continue;
            }
            if self.skip {
                // Nothing matters here but strings and brackets: skip to the next one.
                match next_structural(&s[i..]) {
                    Some(j) => i += j,
                    None => return,
                }
            }
            let b = s[i];
            i += 1;
            if let Some((k, n, plain)) = self.num {
                match b {
                    b'0'..=b'9' => {
                        let n = n.saturating_mul(10).saturating_add(u64::from(b - b'0'));
                        self.num = Some((k, n, plain));
                        continue;
                    }
                    b'.' | b'e' | b'E' | b'+' | b'-' => {
                        self.num = Some((k, n, false));
                        continue;
                    }
                    _ => self.end_number(),
                }
            }
            match b {
                b'"' => i += self.start_str(&s[i..], ev),
                b'{' => self.open(false, ev),
                b'[' => self.open(true, ev),
                b'}' | b']' => self.close(tokens),
                b':' => {
                    self.expect_key = false;
                    self.value_pos = true;
                }
                b',' => {
                    let array = self.in_array();
                    self.expect_key = !array;
                    self.value_pos = array;
                }
                b'0'..=b'9' if self.value_pos => {
                    self.value_pos = false;
                    if matches!(self.ctx(), Ctx::Usage | Ctx::MessageUsage) {
                        self.num = Some((self.key, u64::from(b - b'0'), true));
                    } else {
                        // A number nothing needs: skip the rest of it at once.
                        i += skip_scalar(&s[i..]);
                    }
                }
                b' ' | b'\t' | b'\n' | b'\r' => {}
                _ => {
                    if std::mem::take(&mut self.value_pos) {
                        i += skip_scalar(&s[i..]);
                    }
                }
            }
        }
    }

    /// The end of a `data` line: a number at its very end is complete.
    fn line_break(&mut self) {
        if self.num.is_some() {
            self.end_number();
        }
    }

    /// Reads a string whose opening quote was just read, from `rest` (what follows it):
    /// at once when it ends in `rest` without escapes (the common case: no copy), else byte
    /// run by byte run. Returns how much of `rest` it used.
    #[inline]
    fn start_str(&mut self, rest: &[u8], ev: &mut Event) -> usize {
        let kind = self.str_kind();
        self.value_pos = false;
        if let Some(j) = string_end(rest) {
            if rest[j] == b'"' {
                let body = &rest[..j];
                let name = if body.len() <= CAP { body } else { &[] };
                self.end_str(kind, name, body.len() as u64, ev);
                // A key is followed by its colon: read it now rather than on another turn.
                if kind == Str::Key && rest.get(j + 1) == Some(&b':') {
                    self.expect_key = false;
                    self.value_pos = true;
                    return j + 2;
                }
                return j + 1;
            }
        }
        self.in_str = Some(kind);
        self.str_len = 0;
        0
    }

    fn str_kind(&self) -> Str {
        let ctx = self.ctx();
        if ctx == Ctx::Other {
            Str::Skip
        } else if ctx == Ctx::Payload {
            Str::Payload
        } else if self.expect_key && !self.in_array() {
            Str::Key
        } else {
            use Key::*;
            match (ctx, self.key) {
                (Ctx::Delta | Ctx::BlockDelta, Role | Type | Signature) => Str::Skip,
                (Ctx::Root, Delta)
                | (Ctx::Choice, Text)
                | (Ctx::Delta | Ctx::BlockDelta, _)
                | (Ctx::ToolFunction, Name | Arguments)
                | (Ctx::ContentBlock, Text | Thinking) => Str::Output,
                (Ctx::Root, Type | Code)
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
            Str::Output => {
                ev.output_bytes += len;
                if len > 0 {
                    ev.output = true;
                }
            }
            Str::Named => {
                match (self.ctx(), self.key) {
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
                    }
                    (Ctx::Root, Key::Code) => ev.root_code = ErrorType::parse(name),
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
                let parent = self.ctx();
                if parent == Ctx::Payload {
                    ev.output = true;
                    Ctx::Other
                } else if self.in_array() {
                    match parent {
                        Ctx::Choices if !array => Ctx::Choice,
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
            Ctx::ErrorRoot => ev.error = true,
            Ctx::ErrorNested => ev.nested_error = true,
            Ctx::Choices => ev.choices = true,
            _ => {}
        }
        self.depth += 1;
        if self.depth <= MAX_DEPTH {
            self.ctx[self.depth] = ctx;
        }
        self.skip = self.ctx() == Ctx::Other;
        if self.depth < 32 {
            if array {
                self.arrays |= 1 << self.depth;
            } else {
                self.arrays &= !(1 << self.depth);
            }
        }
        self.key = Key::Other;
        self.expect_key = !array;
        self.value_pos = array;
    }

    fn close(&mut self, tokens: &mut Tokens) {
        if self.depth == 0 {
            return;
        }
        match self.ctx() {
            Ctx::Usage => {
                if let Some(p) = self.prompt.take() {
                    tokens.prompt = Some(p);
                }
                if let Some(c) = self.completion.take() {
                    tokens.completion = Some(c);
                }
            }
            Ctx::MessageUsage => {
                if let Some(p) = self.prompt.take() {
                    tokens.prompt = Some(p);
                }
                self.completion = None;
            }
            _ => {}
        }
        self.depth -= 1;
        self.skip = self.ctx() == Ctx::Other;
        self.key = Key::Other;
        self.expect_key = false;
        self.value_pos = false;
    }

    fn end_number(&mut self) {
        let Some((key, n, plain)) = self.num.take() else {
            return;
        };
        if !plain {
            return;
        }
        match key {
            Key::PromptTokens
            | Key::InputTokens
            | Key::CacheCreationInputTokens
            | Key::CacheReadInputTokens => {
                self.prompt = Some(self.prompt.unwrap_or(0).saturating_add(n));
            }
            Key::CompletionTokens | Key::OutputTokens => self.completion = Some(n),
            _ => {}
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
            started: false,
            bom_matched: 0,
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
        if !self.started {
            pos = self.skip_bom(chunk);
            if !self.started {
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

    fn skip_bom(&mut self, chunk: &[u8]) -> usize {
        let mut pos = 0;
        while let (Some(&got), Some(&want)) =
            (chunk.get(pos), BOM.get(usize::from(self.bom_matched)))
        {
            if got != want {
                break;
            }
            pos += 1;
            self.bom_matched += 1;
        }
        if usize::from(self.bom_matched) == BOM.len() {
            self.started = true;
        } else if pos < chunk.len() {
            self.started = true;
            if self.bom_matched > 0 {
                // A broken BOM is content of the first line, which no field name starts with.
                self.line = Line::Skip;
            }
        }
        pos
    }
}

/// The end of a string's content: the next quote or backslash. Most strings in these streams
/// are short, where a plain loop beats `memchr`'s setup; longer ones go to `memchr`.
#[inline]
fn string_end(s: &[u8]) -> Option<usize> {
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
fn skip_scalar(s: &[u8]) -> usize {
    s.iter()
        .position(|&b| matches!(b, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'))
        .unwrap_or(s.len())
}

/// The next quote or bracket, in time linear in the distance to it.
#[inline]
fn next_structural(s: &[u8]) -> Option<usize> {
    let open = memchr3(b'"', b'{', b'[', s);
    let close = memchr2(b'}', b']', &s[..open.unwrap_or(s.len())]);
    close.or(open)
}

#[inline]
fn find_eol(s: &[u8]) -> Option<usize> {
    memchr2(b'\n', b'\r', s)
}

#[cfg(test)]
mod tests;
