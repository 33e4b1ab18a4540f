//! Rebuilding the one JSON document a provider answers a request that did not stream, from
//! the events of the stream the gateway asked for instead (`stream_upstream`): the same ids,
//! model, content, refusal, reasoning / thinking (with Anthropic's signatures), tool calls
//! with their arguments joined, choices, logprobs, stop reasons and usage. And, when a limit
//! cuts the stream after output came, the partial answer: what was generated so far, marked
//! as cut for length, with the usage so far.
//!
//! Each event's data is gathered once (in a buffer reused from event to event) and its text
//! appended once to the answer being built; the answer is bounded by `limit` bytes.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::provider::Format;

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
        if self.buf.len() + piece.len() + self.answer_len() > self.limit {
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
            let text = trim_end_newline(&data);
            if error {
                self.error = serde_json::from_slice(text).ok();
            } else if text != b"[DONE]" && !text.is_empty() {
                let read = match self.format {
                    Format::Chat => self.chat.event(text),
                    Format::Messages => self.messages.event(text),
                    Format::Responses => self.responses.event(text),
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
        // The buffer's room is reused by the next event.
        self.buf = data;
        self.buf.clear();
        if self.answer_len() > self.limit {
            self.too_large = true;
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

    /// Gives a Chat answer that ended without its usage chunk the usage `used`, counted or
    /// estimated as a partial answer's is. (Anthropic's and the Responses API's usage comes
    /// in the events that end their answers.)
    pub fn fill_missing_usage(&mut self, used: Usage) {
        if self.format == Format::Chat && self.chat.usage.is_none() && self.chat.head.is_some() {
            self.chat.usage = Some(json!({
                "prompt_tokens": used.prompt,
                "completion_tokens": used.completion,
                "total_tokens": used.prompt + used.completion,
            }));
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
        let doc = match self.format {
            Format::Chat => self.chat.document(cut),
            Format::Messages => self.messages.document(cut),
            Format::Responses => self.responses.document(cut),
        }
        .ok_or(AssembleError::Empty)?;
        // A cut that kept nothing (a tool call cut mid-way is dropped, its arguments not
        // JSON) has no partial answer to give: an empty assistant turn is not one.
        if cut.is_some() && !holds_output(&doc) {
            return Err(AssembleError::Empty);
        }
        let out = serde_json::to_vec(&doc).expect("a JSON value serialises");
        if out.len() > self.limit {
            return Err(AssembleError::TooLarge { limit: self.limit });
        }
        Ok(out)
    }
}

/// Whether a document holds any model output: a Chat message's content, refusal, reasoning
/// or tool calls; a Messages content block; a Responses output item.
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
    ["content", "output"]
        .iter()
        .any(|k| doc.get(k).is_some_and(non_empty))
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
fn whole_json(text: &str) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

// ---- OpenAI Chat Completions -------------------------------------------------------------

#[derive(Debug, Default, Clone)]
struct Chat {
    head: Option<Map<String, Value>>,
    /// The head still lacks its id, model or created, and no chunk with a choice has come
    /// (Azure's first chunk, of prompt filter results, has `"id":""`, `"model":""`,
    /// `"created":0`): the next chunks are read whole, and fill in what it lacks.
    head_open: bool,
    choices: Vec<ChatChoice>,
    usage: Option<Value>,
    output: bool,
    text: usize,
}

#[derive(Debug, Default, Clone)]
struct ChatChoice {
    index: u64,
    role: Option<String>,
    /// `content`, `refusal`, `reasoning_content`, `reasoning`: the string fields joined.
    fields: Vec<(String, String)>,
    tool_calls: Vec<ChatToolCall>,
    /// The legacy `function_call` (before tool calls): its name and arguments joined.
    function_call: Option<(String, String)>,
    /// Audio output: its id and expiry as last sent, its transcript and data joined.
    audio: Option<ChatAudio>,
    /// Annotations (`url_citation`, ...), in the order they came.
    annotations: Vec<Value>,
    /// `content` as a list of parts, once a chunk sent it so (Mistral's reasoning models:
    /// `thinking` and `text` parts); adjacent parts of one type joined.
    parts: Vec<Value>,
    /// Azure's content filter results, as last sent with something in them (its last chunk
    /// has an empty object).
    content_filter_results: Option<Value>,
    /// `content` and `refusal` entries, each `None` until a chunk carried a list of them, so
    /// that one the provider never sent stays `null` (a refusal has no content logprobs).
    logprobs: Option<(Entries, Entries)>,
    finish_reason: Option<String>,
}

/// Logprobs entries of one kind, `None` until a chunk carried a list of them.
type Entries = Option<Vec<Value>>;

#[derive(Debug, Default, Clone)]
struct ChatAudio {
    id: Option<String>,
    expires_at: Option<Value>,
    transcript: String,
    data: String,
}

#[derive(Debug, Default, Clone)]
struct ChatToolCall {
    index: u64,
    id: Option<String>,
    kind: Option<String>,
    name: String,
    arguments: String,
}

/// A chunk after the first: the head (id, model, ...) is the first's, so only what changes
/// is read, with serde's fast skip over the rest.
#[derive(Deserialize)]
struct ChatChunk<'a> {
    #[serde(borrow)]
    choices: Option<Vec<ChunkChoice<'a>>>,
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ChunkChoice<'a> {
    #[serde(default)]
    index: u64,
    #[serde(borrow)]
    delta: Option<ChatDelta<'a>>,
    #[serde(borrow)]
    logprobs: Option<&'a RawValue>,
    finish_reason: Option<String>,
    #[serde(borrow)]
    content_filter_results: Option<&'a RawValue>,
}

/// The string fields of a delta the document joins: OpenAI's content and refusal, and the
/// reasoning that compatible providers stream (DeepSeek and vLLM's `reasoning_content`,
/// OpenRouter's `reasoning`).
#[derive(Deserialize)]
struct ChatDelta<'a> {
    role: Option<String>,
    #[serde(borrow)]
    content: Option<DeltaContent<'a>>,
    #[serde(borrow)]
    refusal: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    reasoning_content: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    reasoning: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<DeltaToolCall<'a>>>,
    #[serde(borrow)]
    function_call: Option<DeltaFunction<'a>>,
    #[serde(borrow)]
    audio: Option<DeltaAudio<'a>>,
    #[serde(borrow)]
    annotations: Option<&'a RawValue>,
}

/// A delta's `content`: text, or (Mistral's reasoning models) a list of parts.
#[derive(Deserialize)]
#[serde(untagged)]
enum DeltaContent<'a> {
    Text(#[serde(borrow)] std::borrow::Cow<'a, str>),
    Parts(Vec<Value>),
}

/// Adds `part` to `parts`, joined to the last one when both are text, or both thinking.
fn push_part(parts: &mut Vec<Value>, part: Value) {
    if let Some(last) = parts.last_mut() {
        let kind = part.get("type").and_then(Value::as_str);
        if kind.is_some() && last.get("type").and_then(Value::as_str) == kind {
            if let (Some("text"), Some(Value::String(a)), Some(Value::String(b))) =
                (kind, last.get_mut("text"), part.get("text"))
            {
                a.push_str(b);
                return;
            }
            if let (Some("thinking"), Some(Value::Array(a)), Some(Value::Array(b))) =
                (kind, last.get_mut("thinking"), part.get("thinking"))
            {
                for p in b.clone() {
                    push_part(a, p);
                }
                return;
            }
        }
    }
    parts.push(part);
}

/// A piece of audio output: the id first, then the transcript and the (base64) data in
/// pieces, and the expiry.
#[derive(Deserialize)]
struct DeltaAudio<'a> {
    id: Option<String>,
    #[serde(borrow)]
    expires_at: Option<&'a RawValue>,
    #[serde(borrow)]
    transcript: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    data: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Deserialize)]
struct DeltaToolCall<'a> {
    /// `null` from some compatible servers: the first call's.
    #[serde(default)]
    index: Option<u64>,
    id: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(borrow)]
    function: Option<DeltaFunction<'a>>,
}

#[derive(Deserialize)]
struct DeltaFunction<'a> {
    #[serde(borrow)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<std::borrow::Cow<'a, str>>,
}

impl Chat {
    fn whole(&self) -> bool {
        !self.choices.is_empty()
            && self.choices.iter().all(|c| c.finish_reason.is_some())
            && self.usage.is_some()
    }

    fn choice(&mut self, index: u64) -> &mut ChatChoice {
        let i = match self.choices.iter().position(|c| c.index == index) {
            Some(i) => i,
            None => {
                self.choices.push(ChatChoice {
                    index,
                    ..ChatChoice::default()
                });
                self.choices.len() - 1
            }
        };
        &mut self.choices[i]
    }

    /// Reads one chunk (never the provider's error object: the inspector tells those apart).
    fn event(&mut self, data: &[u8]) -> serde_json::Result<()> {
        let (choices, usage) = if self.head.is_none() || self.head_open {
            // The first chunk: its head (id, object, created, model, system_fingerprint,
            // service_tier, Azure's prompt_filter_results, ...) is the document's, whatever
            // fields a provider adds; a field it left empty is taken from the next chunks,
            // while the head is open.
            let mut fields =
                serde_json::from_slice::<std::collections::BTreeMap<&str, &RawValue>>(data)?;
            let choices = fields.remove("choices");
            let usage = fields.remove("usage");
            // OpenAI's random padding of each chunk (`stream_options.include_obfuscation`):
            // no answer that did not stream has it.
            fields.remove("obfuscation");
            let head = self.head.get_or_insert_with(Map::new);
            for (k, v) in fields {
                if head.get(k).is_none_or(empty) {
                    head.insert(k.to_owned(), raw(v));
                }
            }
            let choices: Vec<ChunkChoice<'_>> = choices
                .filter(|c| c.get() != "null")
                .map(|c| serde_json::from_str(c.get()))
                .transpose()?
                .unwrap_or_default();
            self.head_open = choices.is_empty()
                && ["id", "model", "created"]
                    .iter()
                    .any(|k| head.get(*k).is_none_or(empty));
            (choices, usage)
        } else {
            let chunk = serde_json::from_slice::<ChatChunk<'_>>(data)?;
            (chunk.choices.unwrap_or_default(), chunk.usage)
        };
        if let Some(u) = usage.filter(|u| u.get() != "null") {
            self.usage = Some(raw(u));
        }
        let mut added = 0;
        let mut output = false;
        for c in choices {
            let choice = self.choice(c.index);
            if let Some(reason) = c.finish_reason {
                choice.finish_reason = Some(reason);
            }
            if let Some(f) = c.content_filter_results.filter(|f| !empty_object(f)) {
                choice.content_filter_results = Some(raw(f));
            }
            if let Some(lp) = c.logprobs.filter(|l| l.get() != "null") {
                let mut lp = raw(lp);
                let (content, refusal) = choice.logprobs.get_or_insert_with(Default::default);
                for (key, into) in [("content", content), ("refusal", refusal)] {
                    // Moved, not copied: the entries are parsed once, into the answer.
                    if let Some(Value::Array(items)) = lp.get_mut(key).map(Value::take) {
                        into.get_or_insert_with(Vec::new).extend(items);
                    }
                }
            }
            let Some(delta) = c.delta else { continue };
            if delta.role.is_some() {
                choice.role = delta.role;
            }
            for tc in delta.tool_calls.unwrap_or_default() {
                let index = tc.index.unwrap_or(0);
                let call = match choice.tool_calls.iter().position(|t| t.index == index) {
                    Some(i) => &mut choice.tool_calls[i],
                    None => {
                        choice.tool_calls.push(ChatToolCall {
                            index,
                            ..ChatToolCall::default()
                        });
                        choice.tool_calls.last_mut().expect("pushed")
                    }
                };
                if tc.id.is_some() {
                    call.id = tc.id;
                }
                if tc.kind.is_some() {
                    call.kind = tc.kind;
                }
                if let Some(f) = tc.function {
                    let name = f.name.unwrap_or_default();
                    let args = f.arguments.unwrap_or_default();
                    call.name.push_str(&name);
                    call.arguments.push_str(&args);
                    added += name.len() + args.len();
                    output = true;
                }
            }
            if let Some(f) = delta.function_call {
                let (name, args) = choice.function_call.get_or_insert_with(Default::default);
                let (n, a) = (f.name.unwrap_or_default(), f.arguments.unwrap_or_default());
                name.push_str(&n);
                args.push_str(&a);
                added += n.len() + a.len();
                output = true;
            }
            if let Some(a) = delta.audio {
                let audio = choice.audio.get_or_insert_with(Default::default);
                if a.id.is_some() {
                    audio.id = a.id;
                }
                if let Some(e) = a.expires_at.filter(|e| e.get() != "null") {
                    audio.expires_at = Some(raw(e));
                }
                for (into, piece) in [
                    (&mut audio.transcript, a.transcript),
                    (&mut audio.data, a.data),
                ] {
                    let piece = piece.unwrap_or_default();
                    into.push_str(&piece);
                    added += piece.len();
                    output |= !piece.is_empty();
                }
            }
            if let Some(list) = delta.annotations {
                if let Ok(items) = serde_json::from_str::<Vec<Value>>(list.get()) {
                    added += list.get().len();
                    choice.annotations.extend(items);
                }
            }
            let content = match delta.content {
                Some(DeltaContent::Parts(list)) => {
                    // Text that came as a string before the first list is its first part.
                    if choice.parts.is_empty() {
                        if let Some(i) = choice.fields.iter().position(|(k, _)| k == "content") {
                            let (_, text) = choice.fields.remove(i);
                            if !text.is_empty() {
                                choice.parts.push(json!({"type": "text", "text": text}));
                            }
                        }
                    }
                    for part in list {
                        added += part.to_string().len();
                        output = true;
                        push_part(&mut choice.parts, part);
                    }
                    None
                }
                Some(DeltaContent::Text(text)) if !choice.parts.is_empty() => {
                    if !text.is_empty() {
                        added += text.len();
                        output = true;
                        push_part(&mut choice.parts, json!({"type": "text", "text": text}));
                    }
                    None
                }
                Some(DeltaContent::Text(text)) => Some(text),
                None => None,
            };
            // A string field: appended once; `null` leaves it as it was.
            for (key, text) in [
                ("content", content),
                ("refusal", delta.refusal),
                ("reasoning_content", delta.reasoning_content),
                ("reasoning", delta.reasoning),
            ] {
                let Some(text) = text else { continue };
                if !text.is_empty() {
                    output = true;
                }
                added += text.len();
                match choice.fields.iter_mut().find(|(k, _)| k == key) {
                    Some((_, s)) => s.push_str(&text),
                    None => choice.fields.push((key.to_owned(), text.into_owned())),
                }
            }
        }
        self.text += added;
        self.output |= output;
        Ok(())
    }

    fn document(self, cut: Option<Usage>) -> Option<Value> {
        let mut doc = self.head?;
        doc.insert("object".into(), json!("chat.completion"));
        let mut choices: Vec<ChatChoice> = self.choices;
        choices.sort_by_key(|c| c.index);
        let choices: Vec<Value> = choices
            .into_iter()
            .map(|c| {
                let mut message = Map::new();
                message.insert(
                    "role".into(),
                    json!(c.role.unwrap_or_else(|| "assistant".into())),
                );
                let field = |k: &str| {
                    c.fields
                        .iter()
                        .find(|(f, _)| f == k)
                        .map(|(_, v)| v.clone())
                };
                let content = if c.parts.is_empty() {
                    field("content").map_or(Value::Null, Value::String)
                } else {
                    Value::Array(c.parts.clone())
                };
                message.insert("content".into(), content);
                message.insert(
                    "refusal".into(),
                    field("refusal").map_or(Value::Null, Value::String),
                );
                for (k, v) in &c.fields {
                    if k != "content" && k != "refusal" {
                        message.insert(k.clone(), json!(v));
                    }
                }
                let calls: Vec<Value> = c
                    .tool_calls
                    .iter()
                    .filter(|t| cut.is_none() || whole_json(&t.arguments))
                    .map(|t| {
                        json!({
                            "id": t.id,
                            "type": t.kind.clone().unwrap_or_else(|| "function".into()),
                            "function": {"name": t.name, "arguments": t.arguments},
                        })
                    })
                    .collect();
                if !calls.is_empty() {
                    message.insert("tool_calls".into(), Value::Array(calls));
                }
                if let Some((name, arguments)) = c.function_call {
                    if cut.is_none() || whole_json(&arguments) {
                        message.insert(
                            "function_call".into(),
                            json!({"name": name, "arguments": arguments}),
                        );
                    }
                }
                if let Some(a) = c.audio {
                    message.insert(
                        "audio".into(),
                        json!({
                            "id": a.id,
                            "data": a.data,
                            "expires_at": a.expires_at,
                            "transcript": a.transcript,
                        }),
                    );
                }
                message.insert("annotations".into(), Value::Array(c.annotations));
                let logprobs = match c.logprobs {
                    None => Value::Null,
                    Some((content, refusal)) => json!({"content": content, "refusal": refusal}),
                };
                // A choice that finished before the cut keeps its own reason.
                let finish = match (c.finish_reason, cut) {
                    (Some(r), _) => json!(r),
                    (None, Some(_)) => json!("length"),
                    (None, None) => Value::Null,
                };
                let mut choice = json!({
                    "index": c.index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                });
                if let Some(f) = c.content_filter_results {
                    choice["content_filter_results"] = f;
                }
                choice
            })
            .collect();
        doc.insert("choices".into(), Value::Array(choices));
        let usage = match (self.usage, cut) {
            (Some(u), _) => u,
            (None, Some(u)) => json!({
                "prompt_tokens": u.prompt,
                "completion_tokens": u.completion,
                "total_tokens": u.prompt + u.completion,
            }),
            (None, None) => Value::Null,
        };
        if !usage.is_null() {
            doc.insert("usage".into(), usage);
        }
        Some(Value::Object(doc))
    }
}

// ---- Anthropic Messages ------------------------------------------------------------------

#[derive(Debug, Default, Clone)]
struct Messages {
    message: Option<Map<String, Value>>,
    blocks: Vec<Block>,
    output: bool,
    text: usize,
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
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct BlockDelta<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
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

fn append(block: &mut Map<String, Value>, key: &str, text: &str) {
    match block.get_mut(key) {
        Some(Value::String(s)) => s.push_str(text),
        _ => {
            block.insert(key.to_owned(), Value::String(text.to_owned()));
        }
    }
}

/// The fields of a delta read as a whole into its block: strings joined, as every delta
/// Anthropic streams joins its text (the names in `taken` are taken as last sent instead),
/// other values as last sent; `type`, and `null`s, left out. Returns how many bytes it added
/// (an upper bound). Only deltas without a reader of their own come here: their rare cost
/// (a parse into values) is not that of text deltas.
fn merge(block: &mut Map<String, Value>, delta: &RawValue, taken: &[&str]) -> usize {
    let Ok(fields) = serde_json::from_str::<Map<String, Value>>(delta.get()) else {
        return 0;
    };
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
    added
}

impl Messages {
    fn whole(&self) -> bool {
        self.message
            .as_ref()
            .is_some_and(|m| m.get("stop_reason").is_some_and(|r| !r.is_null()))
    }

    fn event(&mut self, data: &[u8]) -> serde_json::Result<()> {
        self.read(serde_json::from_slice::<MessagesEvent<'_>>(data)?);
        Ok(())
    }

    fn read(&mut self, ev: MessagesEvent<'_>) {
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
                let Some((raw_delta, d)) = ev.delta.and_then(|raw| {
                    let d = serde_json::from_str::<BlockDelta<'_>>(raw.get()).ok()?;
                    Some((raw, d))
                }) else {
                    return;
                };
                let Some(Block {
                    fields: block,
                    json,
                    ..
                }) = self.blocks.iter_mut().find(|b| b.index == ev.index)
                else {
                    return;
                };
                let mut added = 0;
                match d.kind {
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
                    "compaction_delta" => added = merge(block, raw_delta, &["encrypted_content"]),
                    // A delta this reader does not know yet (a new beta): merged as the known
                    // ones are, rather than lost.
                    _ => added = merge(block, raw_delta, &[]),
                }
                if added > 0 && d.kind != "signature_delta" {
                    self.output = true;
                }
                self.text += added;
            }
            "message_delta" => {
                let Some(m) = self.message.as_mut() else {
                    return;
                };
                if let Some(Value::Object(delta)) = ev.delta.map(raw) {
                    for (k, v) in delta {
                        m.insert(k, v);
                    }
                }
                if let Some(Value::Object(usage)) = ev.usage.map(raw) {
                    let into = m
                        .entry("usage")
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let Value::Object(u) = into {
                        for (k, v) in usage {
                            if !v.is_null() {
                                u.insert(k, v);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }

    fn document(self, cut: Option<Usage>) -> Option<Value> {
        let mut message = self.message?;
        let mut blocks = self.blocks;
        blocks.sort_by_key(|b| b.index);
        let content: Vec<Value> = blocks
            .into_iter()
            .filter_map(|block| {
                let Block {
                    fields: mut b,
                    json,
                    stopped,
                    ..
                } = block;
                // A thinking block the cut left without its signature: Anthropic never returns
                // one, and an agent that sends it back as its turn is refused (400). Dropped,
                // as a tool call cut mid-way is.
                let unsigned = b.get("type").and_then(Value::as_str) == Some("thinking")
                    && b.get("signature")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty);
                if cut.is_some() && unsigned {
                    return None;
                }
                if let Some(text) = json {
                    // A tool use the cut left before its stop was never finished, whatever
                    // its input looks like so far: an agent would run a call never made.
                    if cut.is_some() && !stopped {
                        return None;
                    }
                    let input = if text.trim().is_empty() {
                        // Streamed with its input whole at the start (or none at all).
                        b.remove("input").unwrap_or_else(|| json!({}))
                    } else {
                        match serde_json::from_str::<Value>(&text) {
                            Ok(v) => v,
                            // Cut mid-way: never sent half-written.
                            Err(_) => return None,
                        }
                    };
                    b.insert("input".into(), input);
                }
                Some(Value::Object(b))
            })
            .collect();
        message.insert("content".into(), Value::Array(content));
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
        Some(Value::Object(message))
    }
}

// ---- OpenAI Responses --------------------------------------------------------------------

#[derive(Debug, Default, Clone)]
struct Responses {
    /// The response as `response.created` had it, then as the final event has it whole.
    response: Option<Map<String, Value>>,
    done: bool,
    /// Output items by index, and whether their `response.output_item.done` came.
    items: Vec<(u64, Map<String, Value>, bool)>,
    output: bool,
    text: usize,
}

/// Only an event's type.
#[derive(Deserialize)]
struct EventKind<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
}

#[derive(Deserialize)]
struct ResponsesEvent<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(default)]
    output_index: u64,
    #[serde(default)]
    content_index: u64,
    #[serde(default)]
    summary_index: u64,
    #[serde(borrow)]
    response: Option<&'a RawValue>,
    #[serde(borrow)]
    item: Option<&'a RawValue>,
    #[serde(borrow)]
    part: Option<&'a RawValue>,
    #[serde(borrow)]
    delta: Option<std::borrow::Cow<'a, str>>,
}

impl Responses {
    fn item(&mut self, index: u64) -> Option<&mut Map<String, Value>> {
        self.items
            .iter_mut()
            .find(|(i, ..)| *i == index)
            .map(|(_, m, _)| m)
    }

    fn event(&mut self, data: &[u8]) -> serde_json::Result<()> {
        match serde_json::from_slice::<ResponsesEvent<'_>>(data) {
            Ok(ev) => {
                self.read(ev);
                Ok(())
            }
            // The API adds events, whose fields may have other shapes (a `delta` that is
            // no string): one of a kind this reader does not use is no fault, as long as it
            // is an event at all.
            Err(e) => match serde_json::from_slice::<EventKind<'_>>(data) {
                Ok(k) if !Self::reads(&k.kind) => Ok(()),
                _ => Err(e),
            },
        }
    }

    /// Whether events of `kind` hold anything of the document.
    fn reads(kind: &str) -> bool {
        matches!(
            kind,
            "response.created"
                | "response.in_progress"
                | "response.completed"
                | "response.incomplete"
                | "response.failed"
                | "response.output_item.added"
                | "response.output_item.done"
                | "response.content_part.added"
                | "response.reasoning_summary_part.added"
                | "response.output_text.delta"
                | "response.refusal.delta"
                | "response.reasoning_summary_text.delta"
                | "response.reasoning_text.delta"
                | "response.function_call_arguments.delta"
        )
    }

    fn read(&mut self, ev: ResponsesEvent<'_>) {
        match ev.kind {
            "response.created" | "response.in_progress" if self.response.is_none() => {
                if let Some(Value::Object(r)) = ev.response.map(raw) {
                    self.response = Some(r);
                }
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                if let Some(Value::Object(r)) = ev.response.map(raw) {
                    self.response = Some(r);
                    self.done = true;
                }
            }
            "response.output_item.added" | "response.output_item.done" => {
                if let Some(Value::Object(item)) = ev.item.map(raw) {
                    if item.get("type").and_then(Value::as_str) == Some("function_call") {
                        self.output = true;
                    }
                    let done = ev.kind == "response.output_item.done";
                    match self.items.iter_mut().find(|(i, ..)| *i == ev.output_index) {
                        Some(slot) => *slot = (ev.output_index, item, done || slot.2),
                        None => self.items.push((ev.output_index, item, done)),
                    }
                }
            }
            "response.content_part.added" | "response.reasoning_summary_part.added" => {
                let key = if ev.kind.contains("summary") {
                    "summary"
                } else {
                    "content"
                };
                let Some(part) = ev.part.map(raw) else { return };
                if let Some(m) = self.item(ev.output_index) {
                    if let Value::Array(a) = m.entry(key).or_insert_with(|| json!([])) {
                        a.push(part);
                    }
                }
            }
            kind if kind.ends_with(".delta") => {
                let Some(delta) = ev.delta else { return };
                let (key, index, field) = match kind {
                    "response.output_text.delta" => ("content", ev.content_index, "text"),
                    "response.refusal.delta" => ("content", ev.content_index, "refusal"),
                    "response.reasoning_summary_text.delta" => {
                        ("summary", ev.summary_index, "text")
                    }
                    "response.reasoning_text.delta" => ("content", ev.content_index, "text"),
                    "response.function_call_arguments.delta" => ("", 0, "arguments"),
                    _ => return,
                };
                if !delta.is_empty() {
                    self.output = true;
                }
                self.text += delta.len();
                let Some(m) = self.item(ev.output_index) else {
                    return;
                };
                if key.is_empty() {
                    append(m, field, &delta);
                } else if let Some(Value::Array(parts)) = m.get_mut(key) {
                    if let Some(Value::Object(p)) = parts.get_mut(index as usize) {
                        append(p, field, &delta);
                    }
                }
            }
            _ => {}
        }
    }

    fn document(self, cut: Option<Usage>) -> Option<Value> {
        let mut response = self.response?;
        if self.done && cut.is_none() {
            return Some(Value::Object(response));
        }
        let mut items = self.items;
        items.sort_by_key(|(i, ..)| *i);
        let output: Vec<Value> = items
            .into_iter()
            .filter(|(_, m, done)| {
                let kind = m.get("type").and_then(Value::as_str).unwrap_or_default();
                // A call (`function_call`, `custom_tool_call`, ...) the cut left before its
                // item was done was never finished, whatever its arguments or input look
                // like so far: an agent would run a call never made.
                if cut.is_some() && !done && kind.ends_with("_call") {
                    return false;
                }
                // A reasoning item comes whole (its `encrypted_content`) only with its done
                // item: without it, an agent sending `output` back as input (`store: false`)
                // would send one it cannot replay, as a thinking block without its signature.
                if cut.is_some() && !done && kind == "reasoning" {
                    return false;
                }
                kind != "function_call"
                    || m.get("arguments")
                        .and_then(Value::as_str)
                        .is_some_and(whole_json)
            })
            .map(|(_, mut m, _)| {
                // An item the cut left unfinished is incomplete, as the response is.
                if cut.is_some() && m.get("status").and_then(Value::as_str) == Some("in_progress") {
                    m.insert("status".into(), json!("incomplete"));
                }
                Value::Object(m)
            })
            .collect();
        response.insert("output".into(), Value::Array(output));
        if let Some(u) = cut {
            response.insert("status".into(), json!("incomplete"));
            response.insert(
                "incomplete_details".into(),
                json!({"reason": "max_output_tokens"}),
            );
            if response.get("usage").is_none_or(Value::is_null) {
                response.insert(
                    "usage".into(),
                    json!({
                        "input_tokens": u.prompt,
                        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                        "output_tokens": u.completion,
                        "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": u.prompt + u.completion,
                    }),
                );
            }
        }
        Some(Value::Object(response))
    }
}

#[cfg(test)]
mod tests;
