//! The tool calls a model answered with, gathered as the answer passes (each SSE event's data,
//! or the whole JSON document), so that a run can tell the same tool call asked for again and
//! again. A call is its name and its arguments in canonical JSON (keys sorted, no whitespace,
//! strings by what they decode to, numbers as written: `canonical_json`), so that key order and
//! spacing never make two equal calls look different, nor f64 two different ones alike.
//!
//! | format | streamed | whole |
//! |---|---|---|
//! | Chat Completions | `choices[].delta.tool_calls[]`: `function.name`, `function.arguments` pieces (a custom tool's: `custom.name`, `custom.input`) | `choices[].message.tool_calls[]` |
//! | Messages | `content_block_start` of a `tool_use` block, then its `input_json_delta`s | `content[]` blocks of type `tool_use` (`input`) |
//! | Chat Completions, legacy | `choices[].delta.function_call` pieces | `choices[].message.function_call` |
//! | Responses | `response.output_item.added` of a `function_call`, its `function_call_arguments.delta`s (`.done` has them whole); of a `custom_tool_call`, its `custom_tool_call_input.delta`s; `computer_call`, `local_shell_call`, `shell_call` (named `computer`, `local_shell`, `shell`): their `action` | `output[]` items of those types |

use std::collections::HashMap;
use std::ops::Range;
use std::sync::LazyLock;

use memchr::memmem;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::http::sse::data_text;
use crate::provider::Format;

/// An event or document larger than this is not read for tool calls, nor an answer whose calls
/// come to more than this in all (names, ids and arguments, and `CALL_COST` each): the answer
/// then has no fingerprint (a loop of such answers is not seen, and nothing is held without
/// bound).
pub const MAX_GATHERED: usize = 4 << 20;

/// The most of an answer's tool names kept, in bytes: for the refusal's message, and in a run's
/// state (in memory or in Redis), whose size must not grow with the answer's.
pub const MAX_NAMES: usize = 200;

/// What a call holds beside its text: itself and its place in the indexes. Counted so that
/// a multitude of empty calls is bounded as well as a few large ones.
const CALL_COST: usize = std::mem::size_of::<ToolCall>() + 64;

#[derive(Debug, Clone)]
struct ToolCall {
    /// Where the call sits in the answer: its Chat choice (0 in the other formats) and its
    /// index in it (block or output index). A pair, not one number: both come from the
    /// upstream, and any packing of two into one overflows or collides for some of them.
    key: (u64, u64),
    /// A Chat call's id, which tells index-less calls apart (`chat_call_index`).
    id: Option<String>,
    /// The `index` the upstream gave a Chat call, which a reused one may differ from.
    given: Option<u64>,
    name: String,
    arguments: String,
}

impl ToolCall {
    fn size(&self) -> usize {
        CALL_COST + self.name.len() + self.arguments.len() + self.id.as_ref().map_or(0, String::len)
    }
}

/// Where a Chat choice's legacy `function_call` (one a choice, before tool calls) sits: after
/// any tool call of its choice.
const LEGACY: u64 = u64::MAX;

/// The tool calls of one answer.
#[derive(Debug, Clone)]
pub struct ToolCalls {
    format: Format,
    /// In the order they came.
    calls: Vec<ToolCall>,
    /// Where each call's key sits in `calls`: a delta finds its call without looking through
    /// all of them (an answer may bring thousands).
    at: HashMap<(u64, u64), usize>,
    /// By Chat choice: its last call (where in `calls`) and the index after its highest.
    choices: HashMap<u64, (usize, u64)>,
    /// What `calls` hold, by `ToolCall::size`: at most `MAX_GATHERED`.
    held: usize,
    /// The data of the event being read, or the whole document so far.
    buf: Vec<u8>,
    /// Something was too large to read: the answer gets no fingerprint.
    overflow: bool,
    /// Calls looked at to find the one a piece belongs to.
    #[cfg(test)]
    looked_at: usize,
}

impl ToolCalls {
    pub fn new(format: Format) -> Self {
        Self {
            format,
            calls: Vec::new(),
            at: HashMap::new(),
            choices: HashMap::new(),
            held: 0,
            buf: Vec::new(),
            overflow: false,
            #[cfg(test)]
            looked_at: 0,
        }
    }

    /// Too much to read: the answer gets no fingerprint, and what was gathered goes.
    fn give_up(&mut self) {
        self.overflow = true;
        self.calls = Vec::new();
        self.at = HashMap::new();
        self.choices = HashMap::new();
        self.held = 0;
        self.buf = Vec::new();
    }

    /// The next piece of the event's data (or of the document).
    #[inline]
    pub fn data(&mut self, piece: &[u8]) {
        if self.overflow {
            return;
        }
        if self.buf.len() + piece.len() > MAX_GATHERED {
            return self.give_up();
        }
        self.buf.extend_from_slice(piece);
    }

    /// The end of one `data` line of the event.
    pub fn line_end(&mut self) {
        self.data(b"\n");
    }

    /// The event whose data was gathered ended; `dispatched`: it had data.
    pub fn event_end(&mut self, dispatched: bool) {
        if dispatched && !self.overflow && mentions_a_tool(&self.buf) {
            let data = std::mem::take(&mut self.buf);
            // Read as a client that streams decodes it (audit UE 1: an invalid byte lost
            // the event, and the call its arguments).
            self.event(&data_text(&data));
            if !self.overflow {
                self.buf = data;
            }
        }
        self.buf.clear();
    }

    /// The whole document was gathered.
    pub fn document_end(&mut self) {
        if !self.overflow && mentions_a_tool(&self.buf) {
            let data = std::mem::take(&mut self.buf);
            self.document(&data);
        }
        self.buf = Vec::new();
    }

    /// The answer's tool calls in canonical form (`name`, NUL, canonical arguments, NUL, for
    /// each in order), and their names joined by commas (which no provider allows in a tool
    /// name), for the refusal's message: as many as fit in `MAX_NAMES`, then `+` and how many
    /// more there were (no provider allows `+` either); `None` when it asked for none.
    ///
    /// The calls are ordered by choice, then by the canonical call itself, not by the call's
    /// index: the parallel calls of one choice are a set of actions, and sampling often asks for
    /// the same ones in another order (audit KE 4: the same two calls at swapped indexes were no
    /// repeat). The names keep the answer's order, as the client saw them.
    pub fn canonical(&self) -> Option<(Vec<u8>, String)> {
        if self.overflow || self.calls.is_empty() {
            return None;
        }
        let mut calls: Vec<&ToolCall> = self.calls.iter().collect();
        calls.sort_by_key(|c| c.key);
        let names = names(&calls);
        let mut canon: Vec<(u64, &str, String)> = calls
            .iter()
            .map(|c| (c.key.0, c.name.as_str(), canonical_json(&c.arguments)))
            .collect();
        canon.sort_unstable();
        let mut out = Vec::new();
        for (_, name, arguments) in &canon {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
            out.extend_from_slice(arguments.as_bytes());
            out.push(0);
        }
        Some((out, names))
    }

    /// The call at `key` (a new one if none is), changed by `f`; past `MAX_GATHERED` in all,
    /// the answer's calls are given up.
    fn edit(&mut self, key: (u64, u64), f: impl FnOnce(&mut ToolCall)) {
        if self.overflow {
            return;
        }
        #[cfg(test)]
        {
            self.looked_at += 1;
        }
        let i = match self.at.get(&key) {
            Some(&i) => i,
            None => {
                let i = self.calls.len();
                self.calls.push(ToolCall {
                    key,
                    id: None,
                    given: None,
                    name: String::new(),
                    arguments: String::new(),
                });
                self.held += CALL_COST;
                self.at.insert(key, i);
                // A legacy call is no tool call the next delta may continue or follow.
                if key.1 != LEGACY {
                    let choice = self.choices.entry(key.0).or_insert((i, 0));
                    *choice = (i, choice.1.max(key.1.saturating_add(1)));
                }
                i
            }
        };
        let c = &mut self.calls[i];
        let before = c.size();
        f(c);
        self.held = self.held - before + c.size();
        if self.held > MAX_GATHERED {
            self.give_up();
        }
    }

    fn event(&mut self, data: &str) {
        match self.format {
            Format::Chat => {
                let Ok(chunk) = serde_json::from_str::<ChatChunk>(data) else {
                    return;
                };
                for choice in chunk.choices.unwrap_or_default() {
                    let Some(delta) = choice.delta else { continue };
                    if let Some(f) = delta.function_call {
                        self.edit((choice.index, LEGACY), |c| {
                            c.name.push_str(f.name.as_deref().unwrap_or_default());
                            c.arguments
                                .push_str(f.arguments.as_deref().unwrap_or_default());
                        });
                    }
                    let calls = delta.tool_calls.unwrap_or_default();
                    for tc in calls {
                        let (last, next) = match self.choices.get(&choice.index) {
                            Some(&(i, next)) => {
                                let c = &self.calls[i];
                                let last = LastCall {
                                    index: c.key.1,
                                    given: c.given,
                                    id: c.id.as_deref(),
                                    name: &c.name,
                                    arguments: &c.arguments,
                                };
                                (Some(last), next)
                            }
                            None => (None, 0),
                        };
                        let (name, arguments) = tc.call();
                        let index = chat_call_index(
                            tc.index,
                            tc.id.as_deref(),
                            name.as_deref(),
                            last,
                            next,
                        );
                        self.edit((choice.index, index), |c| {
                            c.given = tc.index;
                            // DashScope's `"id":""` on each later piece is no new id (audit
                            // ZB 2): the call keeps its own, as the document does.
                            if let Some(id) = tc.id.filter(|i| !i.is_empty()) {
                                c.id = Some(id);
                            }
                            if let Some(n) = name {
                                c.name.push_str(&n);
                            }
                            if let Some(a) = arguments {
                                c.arguments.push_str(&a);
                            }
                        });
                    }
                }
            }
            Format::Messages => {
                let Ok(ev) = serde_json::from_str::<MessagesEvent>(data) else {
                    return;
                };
                match (ev.kind.as_str(), ev.content_block, ev.delta) {
                    ("content_block_start", Some(b), _) if b.kind == "tool_use" => {
                        self.edit((0, ev.index), |c| {
                            c.name = b.name.unwrap_or_default();
                            // A start whose input is already whole (rare when streamed).
                            if let Some(input) = b.input.filter(|i| i.get() != "{}") {
                                c.arguments = input.get().to_owned();
                            }
                        });
                    }
                    ("content_block_delta", _, Some(d))
                        if d.kind == "input_json_delta" && self.at.contains_key(&(0, ev.index)) =>
                    {
                        self.edit((0, ev.index), |c| {
                            c.arguments.push_str(&d.partial_json.unwrap_or_default());
                        });
                    }
                    _ => {}
                }
            }
            Format::Responses => {
                let Ok(ev) = serde_json::from_str::<ResponsesEvent>(data) else {
                    return;
                };
                match ev.kind.as_str() {
                    "response.output_item.added" | "response.output_item.done" => {
                        if let Some((name, arguments)) = ev.item.and_then(ResponsesItem::call) {
                            self.edit((0, ev.output_index), |c| {
                                c.name = name;
                                if let Some(a) = arguments.filter(|a| !a.is_empty()) {
                                    c.arguments = a;
                                }
                            });
                        }
                    }
                    "response.function_call_arguments.delta"
                    | "response.custom_tool_call_input.delta" => {
                        self.edit((0, ev.output_index), |c| {
                            c.arguments.push_str(&ev.delta.unwrap_or_default());
                        });
                    }
                    "response.function_call_arguments.done" => {
                        if let Some(a) = ev.arguments {
                            self.edit((0, ev.output_index), |c| c.arguments = a);
                        }
                    }
                    "response.custom_tool_call_input.done" => {
                        if let Some(a) = ev.input {
                            self.edit((0, ev.output_index), |c| c.arguments = a);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn document(&mut self, data: &[u8]) {
        match self.format {
            Format::Chat => {
                let Ok(doc) = serde_json::from_slice::<ChatDocument>(data) else {
                    return;
                };
                for choice in doc.choices.unwrap_or_default() {
                    let Some(message) = choice.message else {
                        continue;
                    };
                    if let Some(f) = message.function_call {
                        self.edit((choice.index, LEGACY), |c| {
                            c.name = f.name.unwrap_or_default();
                            c.arguments = f.arguments.unwrap_or_default();
                        });
                    }
                    let calls = message.tool_calls.unwrap_or_default();
                    for (i, tc) in calls.into_iter().enumerate() {
                        let (name, arguments) = tc.call();
                        self.edit((choice.index, i as u64), |c| {
                            c.name = name.unwrap_or_default();
                            c.arguments = arguments.unwrap_or_default();
                        });
                    }
                }
            }
            Format::Messages => {
                let Ok(doc) = serde_json::from_slice::<MessagesDocument>(data) else {
                    return;
                };
                for (i, b) in doc.content.unwrap_or_default().into_iter().enumerate() {
                    if b.kind == "tool_use" {
                        self.edit((0, i as u64), |c| {
                            c.name = b.name.unwrap_or_default();
                            c.arguments = b.input.map(|v| v.get().to_owned()).unwrap_or_default();
                        });
                    }
                }
            }
            Format::Responses => {
                let Ok(doc) = serde_json::from_slice::<ResponsesDocument>(data) else {
                    return;
                };
                for (i, item) in doc.output.unwrap_or_default().into_iter().enumerate() {
                    if let Some((name, arguments)) = item.call() {
                        self.edit((0, i as u64), |c| {
                            c.name = name;
                            c.arguments = arguments.unwrap_or_default();
                        });
                    }
                }
            }
        }
    }
}

/// The calls' names joined by commas, within `MAX_NAMES`: see `ToolCalls::canonical`.
fn names(calls: &[&ToolCall]) -> String {
    // Room for ",+" and the count of the calls left out.
    const ROOM: usize = 22;
    let mut out = String::new();
    let mut kept = 0;
    for c in calls {
        let sep = usize::from(kept > 0);
        if out.len() + sep + c.name.len() > MAX_NAMES - ROOM {
            break;
        }
        if sep == 1 {
            out.push(',');
        }
        out.push_str(&c.name);
        kept += 1;
    }
    if kept == 0 {
        if let Some(first) = calls.first() {
            out.push_str(clip(&first.name, MAX_NAMES - ROOM - '…'.len_utf8()));
            out.push('…');
            kept = 1;
        }
    }
    if kept < calls.len() {
        out.push_str(&format!(",+{}", calls.len() - kept));
    }
    out
}

/// At most the first `max` bytes of `s`, cut where a character starts (`telemetry::log::clipped`
/// is a layer above).
fn clip(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The last Chat tool call of a choice, as far as it has come, for `chat_call_index`.
pub(crate) struct LastCall<'a> {
    pub index: u64,
    /// The `index` the upstream gave it (none: it gave none).
    pub given: Option<u64>,
    pub id: Option<&'a str>,
    pub name: &'a str,
    pub arguments: &'a str,
}

/// The index of the call a Chat tool-call delta continues or starts. OpenAI numbers every
/// call; some compatible servers (Gemini's OpenAI endpoint, ...) send each call whole in a
/// delta of its own and no `index`. Such a delta is a new call, not more of the last one,
/// when it brings an id other than the last call's, or a name while the last call has one
/// and whole JSON arguments; else it continues the last call (the first: 0). Others number
/// every call 0 (audit EB F9: `alpha` and `beta` were joined as `alphabeta`): a delta at the
/// last call's `index` that brings an id other than its id is a new call too, and the calls
/// after it keep their distance from the upstream's numbers.
pub(crate) fn chat_call_index(
    index: Option<u64>,
    id: Option<&str>,
    name: Option<&str>,
    last: Option<LastCall<'_>>,
    next: u64,
) -> u64 {
    let new_id = |last: &LastCall<'_>| id.is_some_and(|id| !id.is_empty() && last.id != Some(id));
    if let Some(i) = index {
        return match last {
            Some(last) if last.given == Some(i) => {
                if last.id.is_some() && new_id(&last) {
                    next
                } else {
                    last.index
                }
            }
            Some(last) => match last.given {
                Some(g) => i.saturating_add(last.index.saturating_sub(g)),
                None => i,
            },
            None => i,
        };
    }
    let Some(last) = last else { return 0 };
    let new_id = new_id(&last);
    let new_name = name.is_some_and(|n| !n.is_empty())
        && !last.name.is_empty()
        && serde_json::from_str::<serde::de::IgnoredAny>(last.arguments).is_ok();
    if new_id || (last.id.is_none() || id.is_none()) && new_name {
        next
    } else {
        last.index
    }
}

/// Most events carry no tool call: a look for the words that every tool call's shape has
/// spares them the parse.
fn mentions_a_tool(data: &[u8]) -> bool {
    // Built once: a finder's set-up costs more than a search through a short event.
    static WORDS: LazyLock<[memmem::Finder<'static>; 5]> = LazyLock::new(|| {
        [
            "tool",
            "function",
            "input_json",
            "computer_call",
            "shell_call",
        ]
        .map(memmem::Finder::new)
    });
    WORDS.iter().any(|w| w.find(data).is_some())
}

/// How deeply `canonical_json` reads nested arguments (serde_json's own limit for a `Value`):
/// deeper ones are compared as written, and the recursion stays bounded.
const MAX_DEPTH: usize = 128;

/// JSON with sorted keys (a key given twice counts once, with its last value, as in
/// serde_json's map) and no whitespace, strings by what they decode to; text that is not JSON,
/// or is nested deeper than `MAX_DEPTH`, trimmed, as it is.
///
/// Numbers (and `true`, `false`, `null`) keep their text: parsed into a `Value` they became an
/// f64 past i64/u64 or f64's precision, and different ids or amounts one call (audit SF 3:
/// `98765432109876543210` and `…211`). So `2.0` and `2` are different arguments, as they
/// always were. (serde_json's `arbitrary_precision` would keep them too, but for every `Value`
/// in the gateway.) serde_json checks the text is JSON, `Canon` reads it once and writes it
/// with its objects' members in order once (`Written`): a deep one is neither read nor copied
/// again at each level, so it costs in proportion to its size, not its size times its depth.
fn canonical_json(text: &str) -> String {
    if serde_json::from_str::<IgnoredAny>(text).is_ok() {
        let mut out = String::with_capacity(text.len());
        if (Canon { text, at: 0 }).value(MAX_DEPTH, &mut out).is_some() {
            return out;
        }
    }
    text.trim().to_owned()
}

/// Reads text already checked to be JSON, once, writing it canonical (`canonical_json`). Were
/// it not JSON after all, it would end in `None`, never loop or panic: each step takes a byte
/// at least or fails.
struct Canon<'a> {
    text: &'a str,
    at: usize,
}

impl Canon<'_> {
    /// The next byte after whitespace, not taken.
    fn peek(&mut self) -> u8 {
        let bytes = self.text.as_bytes();
        while bytes.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
        bytes.get(self.at).copied().unwrap_or_default()
    }

    /// Writes the value that starts here; `None` when it nests deeper than `depth`.
    fn value(&mut self, depth: usize, out: &mut String) -> Option<()> {
        let mut written = Written {
            text: String::with_capacity(self.text.len()),
            objects: Vec::new(),
        };
        self.read(depth, &mut written)?;
        written.emit(0..written.text.len(), 0, out);
        Some(())
    }

    /// Reads the value that starts here into `written`: its text canonical but for the order of
    /// its objects' members, which are noted there instead.
    fn read(&mut self, depth: usize, written: &mut Written) -> Option<()> {
        match self.peek() {
            b'{' => {
                let depth = depth.checked_sub(1)?;
                self.at += 1;
                // Noted before its members, so that the objects stay in the order they start.
                let index = written.objects.len();
                let start = written.text.len();
                written.objects.push(Object {
                    span: start..start,
                    members: Vec::new(),
                    after: index + 1,
                });
                written.text.push('{');
                let mut members = Vec::new();
                while self.peek() != b'}' {
                    let key = written.text.len();
                    push_string(self.string()?, &mut written.text)?;
                    let key = key..written.text.len();
                    self.peek();
                    self.at += 1; // the `:`
                    let (value, objects) = (written.text.len(), written.objects.len());
                    self.read(depth, written)?;
                    members.push(Member {
                        key,
                        value: value..written.text.len(),
                        objects,
                    });
                    if self.peek() == b',' {
                        self.at += 1;
                    }
                }
                self.at += 1;
                written.text.push('}');
                // By canonical key: one order for equal keys however they were escaped. Turned
                // round and sorted stably, a key given twice has its last value first, which
                // `dedup_by` keeps (as serde_json's map keeps the last).
                let text = &written.text;
                members.reverse();
                members.sort_by(|a, b| text[a.key.clone()].cmp(&text[b.key.clone()]));
                members.dedup_by(|a, b| text[a.key.clone()] == text[b.key.clone()]);
                written.objects[index] = Object {
                    span: start..written.text.len(),
                    members,
                    after: written.objects.len(),
                };
            }
            b'[' => {
                let depth = depth.checked_sub(1)?;
                self.at += 1;
                written.text.push('[');
                let mut first = true;
                while self.peek() != b']' {
                    if !std::mem::take(&mut first) {
                        written.text.push(',');
                    }
                    self.read(depth, written)?;
                    if self.peek() == b',' {
                        self.at += 1;
                    }
                }
                self.at += 1;
                written.text.push(']');
            }
            b'"' => push_string(self.string()?, &mut written.text)?,
            // A number or a literal, as written: it ends where the JSON around it goes on.
            _ => {
                let rest = self.text.get(self.at..)?;
                let end = rest
                    .find([',', '}', ']', ' ', '\t', '\n', '\r'])
                    .unwrap_or(rest.len());
                if end == 0 {
                    return None;
                }
                put(&mut written.text, &rest[..end]);
                self.at += end;
            }
        }
        Some(())
    }

    /// The string that starts here, as written, quotes and escapes included.
    fn string(&mut self) -> Option<&str> {
        let bytes = self.text.as_bytes();
        let start = self.at;
        let mut at = start + 1;
        loop {
            at += memchr::memchr2(b'"', b'\\', bytes.get(at..)?)?;
            if bytes[at] == b'"' {
                break;
            }
            at += 2; // an escape: its next byte is never the end
        }
        self.at = at + 1;
        self.text.get(start..self.at)
    }
}

/// A JSON string as written, written by what it decodes to, as serde_json writes it.
fn push_string(written: &str, out: &mut String) -> Option<()> {
    // Without an escape that is as it was written: serde_json escapes only `"`, `\` and
    // control characters, which JSON text cannot hold unescaped.
    if !written.contains('\\') {
        put(out, written);
        return Some(());
    }
    let decoded: String = serde_json::from_str(written).ok()?;
    put(out, &serde_json::to_string(&decoded).ok()?);
    Some(())
}

/// What `Canon` read, each value written once in the order it came: so that sorting an
/// object's members copies none of their text, and a member nested in many objects is copied
/// once more in all (`emit`), not once a level (audit TA 3: 127 objects around 4 MiB cost 50
/// times a flat one).
struct Written {
    /// The values canonical, but each object's members in the order given, without commas.
    text: String,
    /// The objects in `text`, in the order they start there.
    objects: Vec<Object>,
}

/// An object in `Written::text`: where it is, and its members there, sorted by key.
struct Object {
    span: Range<usize>,
    members: Vec<Member>,
    /// The index of the first object after this one and those nested in it.
    after: usize,
}

struct Member {
    key: Range<usize>,
    value: Range<usize>,
    /// The index of the first object in `value` or after it: `emit` goes from object to
    /// object by index (`Object::after`), never searching for one.
    objects: usize,
}

impl Written {
    /// Writes `range` of the text to `out`, each object in it with its members in order;
    /// `next` is the index of the first object in it or after it.
    fn emit(&self, range: Range<usize>, mut next: usize, out: &mut String) {
        let mut at = range.start;
        while let Some(object) = self.objects.get(next) {
            if object.span.start >= range.end {
                break;
            }
            put(out, &self.text[at..object.span.start]);
            out.push('{');
            for (i, member) in object.members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                put(out, &self.text[member.key.clone()]);
                out.push(':');
                self.emit(member.value.clone(), member.objects, out);
            }
            out.push('}');
            at = object.span.end;
            next = object.after;
        }
        put(out, &self.text[at..range.end]);
    }
}

/// Appends `s` to `out`: every text `canonical_json` copies goes through here, so that a test
/// can count the bytes and see their sum grow with the text, not with the text times its depth.
fn put(out: &mut String, s: &str) {
    #[cfg(test)]
    COPIED.with(|c| c.set(c.get() + s.len()));
    out.push_str(s);
}

#[cfg(test)]
thread_local! {
    /// The bytes `put` copied on this thread.
    static COPIED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[derive(Deserialize)]
struct ChatChunk {
    choices: Option<Vec<ChatChoiceDelta>>,
}

#[derive(Deserialize)]
struct ChatChoiceDelta {
    #[serde(default)]
    index: u64,
    delta: Option<ChatDelta>,
}

#[derive(Deserialize)]
struct ChatDelta {
    tool_calls: Option<Vec<ChatToolCall>>,
    function_call: Option<ChatFunction>,
}

#[derive(Deserialize)]
struct ChatToolCall {
    index: Option<u64>,
    id: Option<String>,
    function: Option<ChatFunction>,
    custom: Option<ChatCustom>,
}

impl ChatToolCall {
    /// Its name and arguments (or their pieces): a custom tool's (GPT-5) input stands for
    /// arguments, so that distinct custom calls never look alike (audit GB 1: all of them were
    /// tool `""` with arguments `""`, a loop after three).
    fn call(&self) -> (Option<String>, Option<String>) {
        call_of(self.function.as_ref(), self.custom.as_ref())
    }
}

fn call_of(
    function: Option<&ChatFunction>,
    custom: Option<&ChatCustom>,
) -> (Option<String>, Option<String>) {
    match (function, custom) {
        (Some(f), _) => (f.name.clone(), f.arguments.clone()),
        (None, Some(c)) => (c.name.clone(), c.input.clone()),
        (None, None) => (None, None),
    }
}

#[derive(Deserialize)]
struct ChatFunction {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct ChatCustom {
    name: Option<String>,
    input: Option<String>,
}

#[derive(Deserialize)]
struct ChatDocument {
    choices: Option<Vec<ChatChoiceMessage>>,
}

#[derive(Deserialize)]
struct ChatChoiceMessage {
    #[serde(default)]
    index: u64,
    message: Option<ChatMessage>,
}

#[derive(Deserialize)]
struct ChatMessage {
    tool_calls: Option<Vec<ChatWholeToolCall>>,
    function_call: Option<ChatFunction>,
}

#[derive(Deserialize)]
struct ChatWholeToolCall {
    function: Option<ChatFunction>,
    custom: Option<ChatCustom>,
}

impl ChatWholeToolCall {
    fn call(&self) -> (Option<String>, Option<String>) {
        call_of(self.function.as_ref(), self.custom.as_ref())
    }
}

#[derive(Deserialize)]
struct MessagesEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    index: u64,
    content_block: Option<MessagesBlock>,
    delta: Option<MessagesDelta>,
}

#[derive(Deserialize)]
struct MessagesBlock {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    input: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct MessagesDelta {
    #[serde(rename = "type", default)]
    kind: String,
    partial_json: Option<String>,
}

#[derive(Deserialize)]
struct MessagesDocument {
    content: Option<Vec<MessagesBlock>>,
}

#[derive(Deserialize)]
struct ResponsesEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    output_index: u64,
    item: Option<ResponsesItem>,
    delta: Option<String>,
    arguments: Option<String>,
    input: Option<String>,
}

#[derive(Deserialize)]
struct ResponsesItem {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    arguments: Option<String>,
    /// A custom tool call's (GPT-5) free-form input.
    input: Option<String>,
    /// What a computer-use or shell call asks to be done: its arguments.
    action: Option<Box<RawValue>>,
}

impl ResponsesItem {
    /// The call's name and arguments (or their first piece), if the item is a tool call:
    /// the built-in tools' calls are named after their tool.
    fn call(self) -> Option<(String, Option<String>)> {
        let action = || self.action.as_ref().map(|a| a.get().to_owned());
        let (name, arguments) = match self.kind.as_str() {
            "function_call" => (
                self.name.clone().unwrap_or_default(),
                self.arguments.clone(),
            ),
            "custom_tool_call" => (self.name.clone().unwrap_or_default(), self.input.clone()),
            "computer_call" => ("computer".to_owned(), action()),
            "local_shell_call" => ("local_shell".to_owned(), action()),
            "shell_call" => ("shell".to_owned(), action()),
            _ => return None,
        };
        Some((name, arguments))
    }
}

#[derive(Deserialize)]
struct ResponsesDocument {
    output: Option<Vec<ResponsesItem>>,
}

#[cfg(test)]
mod tests;
