//! The OpenAI Responses API: the `response` from its events (output items, their content
//! parts and deltas, the status it completed with, usage).

use super::{append, raw, whole_json, Reasoning, Usage};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

#[derive(Debug, Default, Clone)]
pub(super) struct Responses {
    /// The response as `response.created` had it, then as the final event has it whole.
    response: Option<Map<String, Value>>,
    pub(super) done: bool,
    /// Output items by index, and whether their `response.output_item.done` came.
    items: Vec<(u64, Map<String, Value>, bool)>,
    /// The reasoning text and its summaries, for the usage of a cut answer.
    reasoning: Reasoning,
    pub(super) output: bool,
    /// Bytes of the answer so far: the deltas' text and the logprobs in `joined`.
    pub(super) text: usize,
    /// Bytes of logprobs joined from `output_text.delta`s, by output and content index:
    /// kept for a cut only. The part's `content_part.done`, its item's done and the final
    /// response repeat them all and replace them, so they stop counting then (audit QA 1).
    joined: Vec<(u64, u64, usize)>,
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
    annotation: Option<&'a RawValue>,
    #[serde(borrow)]
    delta: Option<std::borrow::Cow<'a, str>>,
    /// An `output_text.delta`'s tokens (with `include: ["message.output_text.logprobs"]`).
    #[serde(borrow)]
    logprobs: Option<&'a RawValue>,
}

impl Responses {
    /// Bytes of `text` the event being gathered may replace when it is read: the joined
    /// logprobs, which a part's or the answer's final event repeats whole. Counting both
    /// while it is gathered refused a whole answer at half of `max_response_body` (audit
    /// QA 1); they are let go once it is read (`supersede`).
    pub(super) fn replaceable(&self) -> usize {
        self.joined.iter().map(|(.., n)| n).sum()
    }

    /// The joined logprobs of the parts an event brought whole stop counting: those of
    /// `output_index` (all when `None`), of its `content_index` only when given.
    fn supersede(&mut self, output_index: Option<u64>, content_index: Option<u64>) {
        let text = &mut self.text;
        self.joined.retain(|&(o, c, n)| {
            let gone = output_index.is_none_or(|i| i == o) && content_index.is_none_or(|i| i == c);
            if gone {
                *text -= n;
            }
            !gone
        });
    }

    fn item(&mut self, index: u64) -> Option<&mut Map<String, Value>> {
        self.items
            .iter_mut()
            .find(|(i, ..)| *i == index)
            .map(|(_, m, _)| m)
    }

    pub(super) fn event(&mut self, data: &str) -> serde_json::Result<()> {
        match serde_json::from_str::<ResponsesEvent<'_>>(data) {
            Ok(ev) => {
                self.read(ev);
                Ok(())
            }
            // The API adds events, whose fields may have other shapes (a `delta` that is
            // no string): one of a kind this reader does not use is no fault, as long as it
            // is an event at all.
            Err(e) => match serde_json::from_str::<EventKind<'_>>(data) {
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
                | "response.content_part.done"
                | "response.reasoning_summary_part.added"
                | "response.reasoning_summary_part.done"
                | "response.output_text.annotation.added"
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
                    self.supersede(None, None);
                }
            }
            "response.output_item.added" | "response.output_item.done" => {
                if let Some(Value::Object(item)) = ev.item.map(raw) {
                    if item.get("type").and_then(Value::as_str) == Some("function_call") {
                        self.output = true;
                    }
                    let done = ev.kind == "response.output_item.done";
                    if done {
                        self.supersede(Some(ev.output_index), None);
                    }
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
            // A part as it ended: its text whole, with its annotations and logprobs, which
            // a partial answer otherwise lacks (the final response has them all).
            "response.content_part.done" | "response.reasoning_summary_part.done" => {
                let (key, index) = if ev.kind.contains("summary") {
                    ("summary", ev.summary_index)
                } else {
                    ("content", ev.content_index)
                };
                let Some(part) = ev.part.map(raw) else { return };
                if let Some(Value::Array(parts)) =
                    self.item(ev.output_index).and_then(|m| m.get_mut(key))
                {
                    if let Some(slot) = parts.get_mut(index as usize) {
                        *slot = part;
                    }
                }
                if key == "content" {
                    self.supersede(Some(ev.output_index), Some(index));
                }
            }
            // A citation as it came, before its part ended.
            "response.output_text.annotation.added" => {
                let Some(annotation) = ev.annotation.map(raw) else {
                    return;
                };
                if let Some(Value::Array(parts)) = self
                    .item(ev.output_index)
                    .and_then(|m| m.get_mut("content"))
                {
                    if let Some(Value::Object(p)) = parts.get_mut(ev.content_index as usize) {
                        if let Value::Array(a) = p.entry("annotations").or_insert_with(|| json!([]))
                        {
                            a.push(annotation);
                        }
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
                if kind.starts_with("response.reasoning") {
                    self.reasoning.add(&delta);
                }
                self.text += delta.len();
                // The delta's tokens, joined into its part's as a partial Chat choice joins
                // its chunks': a partial answer has no `content_part.done` with them all
                // (audit PA 3). Parsed only when there are some: most deltas carry none.
                let logprobs = ev
                    .logprobs
                    .map(RawValue::get)
                    .filter(|l| {
                        l.strip_prefix('[')
                            .is_some_and(|rest| rest.trim_start() != "]")
                    })
                    .and_then(|l| Some((l.len(), serde_json::from_str::<Vec<Value>>(l).ok()?)));
                let output_index = ev.output_index;
                let Some(m) = self.item(output_index) else {
                    return;
                };
                let mut kept = 0;
                if key.is_empty() {
                    append(m, field, &delta);
                } else if let Some(Value::Array(parts)) = m.get_mut(key) {
                    if let Some(Value::Object(p)) = parts.get_mut(index as usize) {
                        append(p, field, &delta);
                        if let Some((len, items)) = logprobs {
                            match p.entry("logprobs").or_insert_with(|| json!([])) {
                                Value::Array(a) => a.extend(items),
                                other => *other = Value::Array(items),
                            }
                            kept = len;
                        }
                    }
                }
                if kept > 0 {
                    self.text += kept;
                    match self
                        .joined
                        .iter_mut()
                        .find(|(o, c, _)| (*o, *c) == (output_index, index))
                    {
                        Some((.., n)) => *n += kept,
                        None => self.joined.push((output_index, index, kept)),
                    }
                }
            }
            _ => {}
        }
    }

    pub(super) fn document(self, cut: Option<Usage>) -> Option<Value> {
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
                        // Present whatever came: the SDKs' type requires it.
                        "output_tokens_details": {
                            "reasoning_tokens": self.reasoning.tokens(u.completion),
                        },
                        "total_tokens": u.prompt + u.completion,
                    }),
                );
            }
        }
        Some(Value::Object(response))
    }
}
