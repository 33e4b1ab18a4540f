//! Anthropic Messages: the `message` from its events (content blocks with their deltas,
//! thinking with its signature, tool use with its input joined, stop reason, usage).

use super::{append, raw, AssembleError, Usage};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

#[derive(Debug, Default, Clone)]
pub(super) struct Messages {
    message: Option<Map<String, Value>>,
    blocks: Vec<Block>,
    pub(super) output: bool,
    pub(super) text: usize,
}

/// One content block as it streams.
#[derive(Debug, Clone)]
struct Block {
    index: u64,
    fields: Map<String, Value>,
    /// A tool use's input JSON as it streams (`None` for any other block).
    json: Option<String>,
    /// Its `content_block_stop` came: a tool use is whole only then (its start carries
    /// `"input":{}` whatever its input will be).
    stopped: bool,
}

#[derive(Deserialize)]
struct MessagesEvent<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(default)]
    index: u64,
    #[serde(borrow)]
    message: Option<&'a RawValue>,
    #[serde(borrow)]
    content_block: Option<&'a RawValue>,
    #[serde(borrow)]
    delta: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct BlockDelta<'a> {
    /// `Cow`: a name with an escape in it is no fault either.
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    text: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    thinking: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    signature: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    partial_json: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    citation: Option<&'a RawValue>,
}

/// The fields of a delta read as a whole into its block: strings joined, as every delta
/// Anthropic streams joins its text (the names in `taken` are taken as last sent instead),
/// other values as last sent; `type`, and `null`s, left out. Returns how many bytes it added
/// (an upper bound). Only deltas without a reader of their own come here: their rare cost
/// (a parse into values) is not that of text deltas. One that cannot be read is an error, as
/// any event is: merged without it, the block would look whole and not be.
fn merge(
    block: &mut Map<String, Value>,
    delta: &RawValue,
    taken: &[&str],
) -> serde_json::Result<usize> {
    let fields = serde_json::from_str::<Map<String, Value>>(delta.get())?;
    let mut added = 0;
    for (k, v) in fields {
        match v {
            _ if k == "type" => {}
            Value::Null => {}
            Value::String(text) if !taken.contains(&k.as_str()) => {
                added += text.len();
                append(block, &k, &text);
            }
            Value::String(text) => {
                added += text.len();
                block.insert(k, Value::String(text));
            }
            v => {
                added += v.to_string().len();
                block.insert(k, v);
            }
        }
    }
    Ok(added)
}

/// The deltas `BlockDelta` reads the fields of; any other is merged (`merge`).
const READ_DELTAS: [&str; 5] = [
    "text_delta",
    "thinking_delta",
    "signature_delta",
    "input_json_delta",
    "citations_delta",
];

/// A delta's type alone.
#[derive(Deserialize)]
struct DeltaKind<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
}

/// `fields` into `into`, each as last sent; a `null` only where `into` has no such field: it
/// never replaces a value `message_start` gave (a `container`, `input_transformations`), as
/// in the SDK's accumulator.
fn last_sent(into: &mut Map<String, Value>, fields: impl IntoIterator<Item = (String, Value)>) {
    for (k, v) in fields {
        if !v.is_null() || !into.contains_key(&k) {
            into.insert(k, v);
        }
    }
}

impl Messages {
    pub(super) fn whole(&self) -> bool {
        self.message
            .as_ref()
            .is_some_and(|m| m.get("stop_reason").is_some_and(|r| !r.is_null()))
    }

    pub(super) fn event(&mut self, data: &str) -> serde_json::Result<()> {
        self.read(serde_json::from_str::<MessagesEvent<'_>>(data)?, data)
    }

    /// Reads `ev`, parsed from `data` (read whole again for `message_delta`).
    fn read(&mut self, ev: MessagesEvent<'_>, data: &str) -> serde_json::Result<()> {
        match ev.kind {
            "message_start" => {
                if let Some(Value::Object(m)) = ev.message.map(raw) {
                    self.message = Some(m);
                }
            }
            "content_block_start" => {
                if let Some(Value::Object(b)) = ev.content_block.map(raw) {
                    let is_tool = matches!(
                        b.get("type").and_then(Value::as_str),
                        Some("tool_use" | "server_tool_use" | "mcp_tool_use")
                    );
                    if is_tool {
                        self.output = true;
                    }
                    // A fallback block (a beta) marks where a model that declined gave way
                    // to the next: the message is that one's, as the unstreamed answer and
                    // the SDK's accumulator (`model = block.to.model`) name it (audit UB 1).
                    if b.get("type").and_then(Value::as_str) == Some("fallback") {
                        let to = b.get("to").and_then(|t| t.get("model")).cloned();
                        if let (Some(m), Some(to)) = (self.message.as_mut(), to) {
                            m.insert("model".into(), to);
                        }
                    }
                    self.blocks.push(Block {
                        index: ev.index,
                        fields: b,
                        json: is_tool.then(String::new),
                        stopped: false,
                    });
                }
            }
            "content_block_stop" => {
                if let Some(b) = self.blocks.iter_mut().find(|b| b.index == ev.index) {
                    b.stopped = true;
                }
            }
            "content_block_delta" => {
                let Some(raw_delta) = ev.delta else {
                    return Ok(());
                };
                // A delta that cannot be read (a lone surrogate escape: an emoji's pair split
                // across two events by a server that slices UTF-16) fails the document, as in
                // Chat and Responses (audit ZB 4): dropped, the answer looked whole. One of a
                // kind not read here is merged, whatever its fields hold.
                let d = match serde_json::from_str::<BlockDelta<'_>>(raw_delta.get()) {
                    Ok(d) => d,
                    Err(e) => match serde_json::from_str::<DeltaKind<'_>>(raw_delta.get()) {
                        Ok(k) if !READ_DELTAS.contains(&k.kind.as_ref()) => BlockDelta {
                            kind: k.kind,
                            text: None,
                            thinking: None,
                            signature: None,
                            partial_json: None,
                            citation: None,
                        },
                        _ => return Err(e),
                    },
                };
                let Some(Block {
                    fields: block,
                    json,
                    ..
                }) = self.blocks.iter_mut().find(|b| b.index == ev.index)
                else {
                    return Ok(());
                };
                let mut added = 0;
                match d.kind.as_ref() {
                    "text_delta" => {
                        let t = d.text.unwrap_or_default();
                        added = t.len();
                        append(block, "text", &t);
                    }
                    "thinking_delta" => {
                        let t = d.thinking.unwrap_or_default();
                        added = t.len();
                        append(block, "thinking", &t);
                    }
                    "signature_delta" => {
                        let t = d.signature.unwrap_or_default();
                        added = t.len();
                        append(block, "signature", &t);
                    }
                    "input_json_delta" => {
                        let t = d.partial_json.unwrap_or_default();
                        added = t.len();
                        json.get_or_insert_with(String::new).push_str(&t);
                    }
                    "citations_delta" => {
                        if let Some(c) = d.citation {
                            match block
                                .entry("citations")
                                .or_insert_with(|| Value::Array(Vec::new()))
                            {
                                Value::Array(a) => a.push(raw(c)),
                                other => *other = Value::Array(vec![raw(c)]),
                            }
                        }
                    }
                    // The opaque `encrypted_content` is sent whole, and must go back verbatim.
                    "compaction_delta" => {
                        added = merge(block, raw_delta, &["encrypted_content"])?;
                    }
                    // A delta this reader does not know yet (a new beta): merged as the known
                    // ones are, rather than lost.
                    _ => added = merge(block, raw_delta, &[])?,
                }
                if added > 0 && d.kind != "signature_delta" {
                    self.output = true;
                }
                self.text += added;
            }
            "message_delta" => {
                let Some(m) = self.message.as_mut() else {
                    return Ok(());
                };
                // Read whole (once an answer): besides `delta` and `usage`, its members are
                // the message's too, whatever a beta adds (`context_management`,
                // `input_transformations`): named ones only lost them (audit UB 1).
                let Ok(mut fields) = serde_json::from_str::<Map<String, Value>>(data) else {
                    return Ok(());
                };
                // The delta's members are the message's as last sent; a top-level member of
                // the same name never takes a delta's place (not even its `null`).
                if let Some(Value::Object(delta)) = fields.remove("delta") {
                    fields.retain(|k, _| !delta.contains_key(k));
                    last_sent(m, delta);
                }
                // Counts that came in `message_start` and not here stay as they were; a
                // `usage` that is no object is no count, and never replaces them (audit VC 5).
                if let Some(Value::Object(usage)) = fields.remove("usage") {
                    let into = m
                        .entry("usage")
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let Value::Object(u) = into {
                        last_sent(u, usage);
                    }
                }
                for (k, v) in fields {
                    match k.as_str() {
                        "type" | "content" => {}
                        // The betas that report here what they did (as the SDK's accumulator
                        // takes them): as last sent, a `null` keeping `message_start`'s.
                        "context_management" | "input_transformations" => last_sent(m, [(k, v)]),
                        // Any other only where the message has no value yet: a top-level
                        // `id`, `model`, `role` or `stop_reason` never overwrites what
                        // `message_start` and the delta gave (audit VC 5), while a member
                        // a new beta sends only here is kept.
                        _ => {
                            if m.get(&k).is_none_or(Value::is_null) {
                                m.insert(k, v);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    pub(super) fn document(self, cut: Option<Usage>) -> Result<Document, AssembleError> {
        let mut message = self.message.ok_or(AssembleError::Empty)?;
        // `message_start` carries `"content":[]`: the blocks take its place.
        message.remove("content");
        let truncated = matches!(
            message.get("stop_reason").and_then(Value::as_str),
            Some("max_tokens" | "model_context_window_exceeded")
        );
        let mut blocks = self.blocks;
        blocks.sort_by_key(|b| b.index);
        let mut content = Vec::with_capacity(blocks.len());
        for block in blocks {
            let Block {
                index,
                fields: mut b,
                json,
                stopped,
            } = block;
            let kind = b.get("type").and_then(Value::as_str);
            // A thinking block the cut left without its signature: Anthropic never returns
            // one, and an agent that sends it back as its turn is refused (400). Dropped,
            // as a tool call cut mid-way is.
            let unsigned = kind == Some("thinking")
                && b.get("signature")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty);
            // A text block the cut left empty (right after its start) or with only
            // whitespace so far: Anthropic never returns one, and refuses the turn that
            // holds one (400 "text content blocks must be non-empty") when an agent sends
            // it back (audit PA 2).
            let blank = kind == Some("text")
                && b.get("text")
                    .and_then(Value::as_str)
                    .is_none_or(|t| t.trim().is_empty());
            if cut.is_some() && (unsigned || blank) {
                continue;
            }
            let mut input = None;
            if let Some(text) = json {
                // A tool use the cut left before its stop was never finished, whatever
                // its input looks like so far: an agent would run a call never made.
                if cut.is_some() && !stopped {
                    continue;
                }
                if text.trim().is_empty() {
                    // Streamed with its input whole at the start (or none at all).
                    b.entry("input").or_insert_with(|| json!({}));
                } else if cut.is_none()
                    && truncated
                    && serde_json::from_str::<&RawValue>(&text).is_err()
                {
                    // The model ran out of tokens inside the call: Anthropic answers it so
                    // unstreamed, with `stop_reason: "max_tokens"`, and tells clients to
                    // raise `max_tokens` on it. The input is what came whole of it, as the
                    // SDK's accumulator reads it (audit ZB 3), never a 502 that the SDK
                    // would retry, paying for the same cut generation again.
                    b.remove("input");
                    input = Some(closed_json(&text));
                } else {
                    // Kept as the text the provider wrote, once checked to be JSON: a
                    // `Value` would turn an integer past 64 bits into a float, sort the
                    // keys, and refuse valid JSON it cannot hold (`1e400`) (audit PA 1).
                    match RawValue::from_string(text) {
                        Ok(raw) => {
                            b.remove("input");
                            input = Some(raw);
                        }
                        // Cut mid-way: never sent half-written.
                        Err(_) if cut.is_some() => continue,
                        // In an answer that came whole, the call cannot be left out: the
                        // document would look whole and not be (as with an event that
                        // cannot be read).
                        Err(e) => {
                            return Err(AssembleError::Malformed(format!(
                            "the input of {} block {index} is no JSON the gateway can read ({e})",
                            kind.unwrap_or("tool_use")
                        )))
                        }
                    }
                }
            }
            content.push(Content { fields: b, input });
        }
        if let Some(u) = cut {
            // A stop reason that came before the cut stands, as a finished Chat choice's
            // does: the model had ended its answer.
            if message.get("stop_reason").is_none_or(Value::is_null) {
                message.insert("stop_reason".into(), json!("max_tokens"));
                message.insert("stop_sequence".into(), Value::Null);
            }
            let usage = message
                .entry("usage")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = usage {
                // Only when absent: 0 is a count (a prompt read wholly from the cache).
                if m.get("input_tokens").is_none_or(Value::is_null) {
                    m.insert("input_tokens".into(), json!(u.prompt));
                }
                let reported = m.get("output_tokens").and_then(Value::as_u64).unwrap_or(0);
                m.insert("output_tokens".into(), json!(reported.max(u.completion)));
            }
        }
        Ok(Document { message, content })
    }
}

/// What came whole of a JSON text the model stopped writing: the text up to its last whole
/// value (a member without its value, a string or number cut mid-way, a comma left out), with
/// the objects and arrays still open closed, byte for byte otherwise; `{}` when not even that
/// reads. `{"path": "a.txt", "content": "lorem ip` is `{"path": "a.txt"}`, as the Anthropic
/// SDK's partial reading of the input gives it.
pub(super) fn closed_json(text: &str) -> Box<RawValue> {
    // The open containers' closers; the end of the last whole value (or opening) and how
    // many containers were open there.
    let mut open: Vec<u8> = Vec::new();
    let mut good: Option<(usize, usize)> = None;
    // In an object: the next string is a key.
    let mut key_next = false;
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' | b'[' => {
                open.push(if b[i] == b'{' { b'}' } else { b']' });
                key_next = b[i] == b'{';
                i += 1;
                good = Some((i, open.len()));
            }
            b'}' | b']' => {
                open.pop();
                i += 1;
                key_next = false;
                good = Some((i, open.len()));
            }
            b',' => {
                key_next = open.last() == Some(&b'}');
                i += 1;
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                if j >= b.len() {
                    break;
                }
                i = j + 1;
                if !std::mem::take(&mut key_next) {
                    good = Some((i, open.len()));
                }
            }
            c if c.is_ascii_whitespace() || c == b':' => i += 1,
            // A number or literal: whole only once something follows it.
            _ => {
                let j = i + b[i..]
                    .iter()
                    .position(|c| matches!(c, b',' | b'}' | b']') || c.is_ascii_whitespace())
                    .unwrap_or(b.len() - i);
                if j >= b.len() {
                    break;
                }
                i = j;
                good = Some((i, open.len()));
            }
        }
    }
    let closed = good.map(|(end, depth)| {
        let mut s = text[..end].to_owned();
        s.extend(
            open[..depth.min(open.len())]
                .iter()
                .rev()
                .map(|&c| c as char),
        );
        s
    });
    closed
        .and_then(|s| RawValue::from_string(s).ok())
        .unwrap_or_else(|| RawValue::from_string("{}".into()).expect("JSON"))
}

/// The message the provider would have answered: its fields, and its content blocks apart,
/// each tool use's input as the text the provider wrote.
pub(super) struct Document {
    /// Without `content`.
    message: Map<String, Value>,
    content: Vec<Content>,
}

/// One content block of the document: its fields, and a tool use's input as the provider's
/// JSON text (`None`: the block has no input streamed, or it is among `fields`).
struct Content {
    fields: Map<String, Value>,
    input: Option<Box<RawValue>>,
}

impl Document {
    /// Whether it holds any content block.
    pub(super) fn holds_output(&self) -> bool {
        !self.content.is_empty()
    }
}

impl Serialize for Document {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        With(&self.message, "content", &self.content).serialize(s)
    }
}

impl Serialize for Content {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.input {
            Some(input) => With(&self.fields, "input", input).serialize(s),
            None => self.fields.serialize(s),
        }
    }
}

/// A map serialised with one more entry, at the place the map's own order gives its key
/// (serde_json's `Map` keeps its keys sorted), so the document reads as a `Value` of it
/// would. The map must not hold the key.
struct With<'a, V>(&'a Map<String, Value>, &'static str, V);

impl<V: Serialize> Serialize for With<'_, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let With(map, key, value) = self;
        let mut out = s.serialize_map(Some(map.len() + 1))?;
        let mut pending = Some(value);
        for (k, v) in *map {
            if k.as_str() > *key {
                if let Some(value) = pending.take() {
                    out.serialize_entry(key, value)?;
                }
            }
            out.serialize_entry(k, v)?;
        }
        if let Some(value) = pending {
            out.serialize_entry(key, value)?;
        }
        out.end()
    }
}
