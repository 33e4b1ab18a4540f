//! OpenAI Chat Completions: the `chat.completion` document from its chunks (choices,
//! content or its list of parts, refusal, reasoning, tool and function calls, audio,
//! annotations, logprobs, finish reasons, usage).

use super::{empty, empty_object, raw, whole_json, Reasoning, Usage};
use crate::provider::tools::{chat_call_index, LastCall};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

#[derive(Debug, Default, Clone)]
pub(super) struct Chat {
    head: Option<Map<String, Value>>,
    /// The head still lacks its id, model or created, and no chunk with a choice has come
    /// (Azure's first chunk, of prompt filter results, has `"id":""`, `"model":""`,
    /// `"created":0`): the next chunks are read whole, and fill in what it lacks.
    head_open: bool,
    choices: Vec<ChatChoice>,
    usage: Option<Value>,
    /// `usage` is a top-level one, which Groq's `x_groq.usage` never replaces.
    usage_root: bool,
    /// The `reasoning_content` / `reasoning` text, for a usage the provider did not send.
    reasoning: Reasoning,
    pub(super) output: bool,
    pub(super) text: usize,
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
    /// The choice's fields the document has no place of its own for (vLLM's `stop_reason`,
    /// OpenRouter's `native_finish_reason`), and the delta's (OpenRouter's
    /// `reasoning_details`, ...): gathered as the SDK's stream accumulator gathers them
    /// (`accumulate`), so that the document keeps what a client that streams keeps.
    extra: Map<String, Value>,
    message_extra: Map<String, Value>,
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
    /// The `index` the upstream gave it, which a reused one may differ from
    /// (`chat_call_index`).
    given: Option<u64>,
    id: Option<String>,
    kind: Option<String>,
    /// A custom tool's call (GPT-5): `custom.name`, its `input` joined in `arguments`, and
    /// no `function`.
    custom: bool,
    name: String,
    arguments: String,
    /// Gemini's `extra_content` (the thought signature its next turn needs), ...
    extra: Map<String, Value>,
}

/// A chunk after the first: the head (id, model, ...) is the first's, so only what changes
/// is read, with serde's fast skip over the rest.
#[derive(Deserialize)]
struct ChatChunk<'a> {
    #[serde(borrow)]
    choices: Option<Vec<ChunkChoice<'a>>>,
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
    #[serde(borrow)]
    x_groq: Option<XGroq<'a>>,
}

/// Groq's `x_groq`: its `usage` is the stream's when no top-level one was asked for.
#[derive(Deserialize)]
struct XGroq<'a> {
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
    /// Moonshot's (Kimi's) usage, sent in its last chunk's choice: the answer's, which its
    /// unstreamed answer has at the top level (audit ZB 6).
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
    #[serde(flatten)]
    extra: Map<String, Value>,
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
    #[serde(flatten)]
    extra: Map<String, Value>,
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

/// Adds fields the document has no place of its own for to `acc`, much as the OpenAI SDK's
/// stream accumulator does: objects merged, lists of objects with an `index` merged by it and
/// other lists extended, the strings of text fields joined; any other value as last sent
/// (`null` or an empty string never replaces one). Unlike the SDK's, a string that is no
/// text is not joined: OpenRouter repeats `"format":"anthropic-claude-v1"` in every
/// `reasoning_details` delta, which the SDK makes `anthropic-claude-v1anthropic-...`, and a
/// field sent whole in every chunk (Perplexity's) would grow with every chunk.
/// Returns the bytes added, for `max_response_body`.
fn accumulate(acc: &mut Map<String, Value>, delta: Map<String, Value>) -> usize {
    /// Fields whose string is a piece of text, as in the deltas the document knows.
    const TEXT: [&str; 8] = [
        "text",
        "content",
        "summary",
        "reasoning",
        "refusal",
        "thinking",
        "arguments",
        "transcript",
    ];
    let mut added = 0;
    for (k, v) in delta {
        match (acc.get_mut(&k), v) {
            (Some(_), Value::Null) => {}
            (Some(Value::String(_)), Value::String(b)) if b.is_empty() => {}
            (Some(Value::String(a)), Value::String(b)) if TEXT.contains(&k.as_str()) => {
                added += b.len();
                a.push_str(&b);
            }
            (Some(Value::Object(a)), Value::Object(b)) => added += accumulate(a, b),
            (Some(Value::Array(a)), Value::Array(b)) => {
                for entry in b {
                    let index = entry.get("index").and_then(Value::as_u64);
                    let same = index.and_then(|i| {
                        a.iter_mut()
                            .find(|e| e.get("index").and_then(Value::as_u64) == Some(i))
                    });
                    match (same, entry) {
                        (Some(Value::Object(e)), Value::Object(d)) => added += accumulate(e, d),
                        (_, entry) => {
                            added += entry.to_string().len();
                            a.push(entry);
                        }
                    }
                }
            }
            (_, v) => {
                added += v.to_string().len();
                acc.insert(k, v);
            }
        }
    }
    added
}

/// A finish reason that says none: compatible servers' `""` on every chunk but the last.
fn no_reason(reason: &str) -> bool {
    reason.is_empty() || reason == "null"
}

/// `extra`'s fields that `into` has no value for.
fn add_missing(into: &mut Map<String, Value>, extra: Map<String, Value>) {
    for (k, v) in extra {
        into.entry(k).or_insert(v);
    }
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
    /// Absent or `null` from some compatible servers (`chat_call_index`).
    #[serde(default)]
    index: Option<u64>,
    id: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(borrow)]
    function: Option<DeltaFunction<'a>>,
    #[serde(borrow)]
    custom: Option<DeltaCustom<'a>>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Deserialize)]
struct DeltaCustom<'a> {
    #[serde(borrow)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    input: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Deserialize)]
struct DeltaFunction<'a> {
    #[serde(borrow)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<std::borrow::Cow<'a, str>>,
}

impl Chat {
    /// The usage `used` for an answer whose usage chunk never came.
    pub(super) fn fill_missing_usage(&mut self, used: Usage) {
        if self.usage.is_none() && self.head.is_some() {
            self.usage = Some(self.counted(used));
        }
    }

    /// The usage `used`, as counted for an answer whose provider sent none: with the
    /// reasoning tokens among the completion's when reasoning came (an answer without has no
    /// `completion_tokens_details`, as from compatible servers).
    fn counted(&self, used: Usage) -> Value {
        let mut usage = json!({
            "prompt_tokens": used.prompt,
            "completion_tokens": used.completion,
            "total_tokens": used.prompt + used.completion,
        });
        if self.reasoning.seen() {
            usage["completion_tokens_details"] =
                json!({"reasoning_tokens": self.reasoning.tokens(used.completion)});
        }
        usage
    }

    pub(super) fn whole(&self) -> bool {
        self.ended() && self.usage.is_some()
    }

    /// Every choice that came finished: all that may follow is the usage chunk.
    pub(super) fn ended(&self) -> bool {
        !self.choices.is_empty() && self.choices.iter().all(|c| c.finish_reason.is_some())
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
    pub(super) fn event(&mut self, data: &str) -> serde_json::Result<()> {
        let first = self.head.is_none() || self.head_open;
        let (choices, usage, groq) = if first {
            // The first chunk: its head (id, object, created, model, system_fingerprint,
            // service_tier, Azure's prompt_filter_results, ...) is the document's, whatever
            // fields a provider adds; a field it left empty is taken from the next chunks,
            // while the head is open.
            let mut fields =
                serde_json::from_str::<std::collections::BTreeMap<&str, &RawValue>>(data)?;
            let choices = fields.remove("choices");
            let usage = fields.remove("usage");
            let groq = match fields.get("x_groq") {
                Some(x) => serde_json::from_str::<Option<XGroq<'_>>>(x.get())?,
                None => None,
            };
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
            (choices, usage, groq)
        } else {
            let chunk = serde_json::from_str::<ChatChunk<'_>>(data)?;
            (chunk.choices.unwrap_or_default(), chunk.usage, chunk.x_groq)
        };
        // A usage is an object: a `null` (the chunks before the last), or any other value,
        // is no count and never replaces one that came (audit VC 5).
        let real = |u: &&RawValue| u.get().trim_start().starts_with('{');
        if let Some(u) = usage.filter(real) {
            self.usage = Some(raw(u));
            self.usage_root = true;
        } else if let Some(u) = groq.and_then(|g| g.usage).filter(real) {
            if !self.usage_root {
                self.usage = Some(raw(u));
            }
        }
        let mut added = 0;
        let mut output = false;
        let mut reasoning = Reasoning::default();
        for c in choices {
            // As Groq's: a top-level usage wins.
            if let Some(u) = c.usage.filter(real) {
                if !self.usage_root {
                    self.usage = Some(raw(u));
                }
            }
            let choice = self.choice(c.index);
            // `""` (or koboldcpp's `"null"`) is no reason: the inspector reads it so too
            // (audit ZB 1).
            if let Some(reason) = c.finish_reason.filter(|r| !no_reason(r)) {
                choice.finish_reason = Some(reason);
            }
            if let Some(f) = c.content_filter_results.filter(|f| !empty_object(f)) {
                choice.content_filter_results = Some(raw(f));
            }
            added += accumulate(&mut choice.extra, c.extra);
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
            // An empty string never replaces what came: MiniMax sends `"role":""` after the
            // first delta, DashScope `"id":""` on every piece of a call (audit ZB 2). The
            // OpenAI SDK's accumulator joins such strings, so `""` leaves them as they were.
            if let Some(role) = delta.role.filter(|r| !r.is_empty()) {
                choice.role = Some(role);
            }
            if !delta.extra.is_empty() {
                output |= delta.extra.values().any(|v| !v.is_null() && v != "");
                added += accumulate(&mut choice.message_extra, delta.extra);
            }
            for tc in delta.tool_calls.unwrap_or_default() {
                let last = choice.tool_calls.last().map(|t| LastCall {
                    index: t.index,
                    given: t.given,
                    id: t.id.as_deref(),
                    name: &t.name,
                    arguments: &t.arguments,
                });
                let next = choice.tool_calls.iter().map(|t| t.index + 1).max();
                let name = match (&tc.function, &tc.custom) {
                    (Some(f), _) => f.name.as_deref(),
                    (None, Some(c)) => c.name.as_deref(),
                    (None, None) => None,
                };
                let index =
                    chat_call_index(tc.index, tc.id.as_deref(), name, last, next.unwrap_or(0));
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
                call.given = tc.index;
                if let Some(id) = tc.id.filter(|i| !i.is_empty()) {
                    call.id = Some(id);
                }
                if let Some(kind) = tc.kind.filter(|k| !k.is_empty()) {
                    call.kind = Some(kind);
                }
                added += accumulate(&mut call.extra, tc.extra);
                if let Some(f) = tc.function {
                    let name = f.name.unwrap_or_default();
                    let args = f.arguments.unwrap_or_default();
                    call.name.push_str(&name);
                    call.arguments.push_str(&args);
                    added += name.len() + args.len();
                    output = true;
                } else if let Some(c) = tc.custom {
                    let name = c.name.unwrap_or_default();
                    let input = c.input.unwrap_or_default();
                    call.custom = true;
                    call.name.push_str(&name);
                    call.arguments.push_str(&input);
                    added += name.len() + input.len();
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
                if let Some(id) = a.id.filter(|i| !i.is_empty()) {
                    audio.id = Some(id);
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
                if key.starts_with("reasoning") {
                    reasoning.add(&text);
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
        self.reasoning.join(reasoning);
        if !first && self.ended() {
            self.read_end_whole(data);
        }
        Ok(())
    }

    /// The chunks that end the answer (its finish reasons, then its usage) are read whole once
    /// more: members a provider sends only there (xAI's `citations`, a `system_fingerprint`
    /// the first chunk had `null`, which the OpenAI SDK's accumulator takes) are the
    /// document's, as last sent; named ones only lost them (audit UB 1). The head's identity
    /// stays the first chunk's (llama.cpp stamps each chunk's `created` anew). Only these
    /// chunks: reading every chunk whole would cost every chunk.
    fn read_end_whole(&mut self, data: &str) {
        let Ok(fields) = serde_json::from_str::<std::collections::BTreeMap<&str, &RawValue>>(data)
        else {
            return;
        };
        let head = self.head.get_or_insert_with(Map::new);
        for (k, v) in fields {
            let identity = matches!(k, "id" | "object" | "created" | "model");
            if matches!(k, "choices" | "usage" | "x_groq" | "obfuscation")
                || (identity && !head.get(k).is_none_or(empty))
            {
                continue;
            }
            let v = raw(v);
            // `null` (or `""`) never replaces what came.
            if !empty(&v) || !head.contains_key(k) {
                head.insert(k.to_owned(), v);
            }
        }
    }

    pub(super) fn document(self, cut: Option<Usage>) -> Option<Value> {
        // Chunks that held no choice (a head, Azure's prompt filter results) are no answer:
        // the provider's own document always has one.
        if self.choices.is_empty() {
            return None;
        }
        let counted = cut.map(|u| self.counted(u));
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
                        let mut call = if t.custom {
                            json!({
                                "id": t.id,
                                "type": t.kind.clone().unwrap_or_else(|| "custom".into()),
                                "custom": {"name": t.name, "input": t.arguments},
                            })
                        } else {
                            json!({
                                "id": t.id,
                                "type": t.kind.clone().unwrap_or_else(|| "function".into()),
                                "function": {"name": t.name, "arguments": t.arguments},
                            })
                        };
                        if let Value::Object(call) = &mut call {
                            add_missing(call, t.extra.clone());
                        }
                        call
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
                // Audio the cut left before its last piece (the one with `expires_at`):
                // unfinished, and without the expiry the SDKs' type requires.
                let audio = c.audio.filter(|a| {
                    cut.is_none() || c.finish_reason.is_some() || a.expires_at.is_some()
                });
                if let Some(a) = audio {
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
                add_missing(&mut message, c.message_extra);
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
                if let Value::Object(choice) = &mut choice {
                    add_missing(choice, c.extra);
                }
                choice
            })
            .collect();
        doc.insert("choices".into(), Value::Array(choices));
        // The provider's own usage (per-chunk counts, vLLM's) wins over the one counted.
        if let Some(usage) = self.usage.or(counted) {
            doc.insert("usage".into(), usage);
        }
        Some(Value::Object(doc))
    }
}
