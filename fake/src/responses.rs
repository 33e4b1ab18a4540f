//! OpenAI Responses: the `response.*` event stream and the `response` object.
//!
//! Every event is named by its `type` and numbered (`sequence_number`). Output items follow
//! each other: with reasoning, a `reasoning` item whose summary text streams
//! (`response.reasoning_summary_text.delta`); then the assistant `message` (its
//! `output_text` part), or one `function_call` item per call (their arguments), after a
//! `message` when a preamble comes first. `response.completed` carries the whole response,
//! the same object the non-stream answer is.

use serde_json::{json, Value};

use crate::answer::{Answer, Kind, Part, Rendered, Segment};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Item {
    Reasoning,
    Message,
    /// The `function_call` item of call k.
    Call(usize),
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    Created,
    InProgress,
    ItemAdded(Item),
    /// The content part (message) or summary part (reasoning) begins.
    PartAdded(Item),
    Delta(Item),
    /// `output_text.done`, `reasoning_summary_text.done`, `function_call_arguments.done`.
    TextDone(Item),
    PartDone(Item),
    ItemDone(Item),
    Completed,
}

impl Event {
    pub(crate) fn kind(self, a: &Answer, _at: usize) -> Kind {
        match self {
            Event::Delta(_) => Kind::Content,
            // Only the last item's text closes the answer: the others end mid-stream.
            Event::TextDone(item) if items(a).last() == Some(&item) => Kind::Closing,
            _ => Kind::Framing,
        }
    }
}

/// The output items, in order: their position is their `output_index`.
fn items(a: &Answer) -> Vec<Item> {
    let mut items = Vec::with_capacity(2 + a.calls.len());
    if a.reasoning > 0 {
        items.push(Item::Reasoning);
    }
    if a.calls.is_empty() || a.preamble > 0 {
        items.push(Item::Message);
    }
    items.extend((0..a.calls.len()).map(Item::Call));
    items
}

fn output_index(a: &Answer, item: Item) -> usize {
    items(a).iter().position(|&i| i == item).unwrap_or(0)
}

pub(crate) fn plan(a: &Answer) -> Vec<Segment<Event>> {
    let mut plan = vec![(Event::Created, 1), (Event::InProgress, 1)];
    for item in items(a) {
        let parts = usize::from(!matches!(item, Item::Call(_)));
        let deltas = match item {
            Item::Reasoning => a.reasoning,
            Item::Message => a.text_tokens(),
            Item::Call(_) => a.chunks,
        };
        plan.extend([
            (Event::ItemAdded(item), 1),
            (Event::PartAdded(item), parts),
            (Event::Delta(item), deltas),
            (Event::TextDone(item), 1),
            (Event::PartDone(item), parts),
            (Event::ItemDone(item), 1),
        ]);
    }
    plan.push((Event::Completed, 1));
    plan
}

fn item_id(a: &Answer, item: Item) -> String {
    match item {
        Item::Reasoning => format!("rs_{}", a.tag),
        Item::Message => format!("msg_{}", a.tag),
        Item::Call(k) => a.call_tag("fc", 0, k),
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text})
}

fn summary_text(text: &str) -> Value {
    json!({"type": "summary_text", "text": text})
}

/// An output item, as `output_item.added` (not `done`) or `.done` and the response carry it.
fn output_item(a: &Answer, item: Item, done: bool) -> Value {
    let status = if done { "completed" } else { "in_progress" };
    let id = item_id(a, item);
    match item {
        Item::Reasoning => {
            let summary = if done {
                json!([summary_text(&a.text(Part::Reasoning, 0))])
            } else {
                json!([])
            };
            json!({"id": id, "type": "reasoning", "summary": summary})
        }
        Item::Call(k) => json!({"id": id, "type": "function_call", "status": status,
            "arguments": if done { a.arguments(0) } else { String::new() },
            "call_id": a.call_tag("call", 0, k), "name": a.call_name(k)}),
        Item::Message => {
            let content = if done {
                json!([output_text(&a.text(Part::Answer, 0))])
            } else {
                json!([])
            };
            json!({"id": id, "type": "message", "status": status, "content": content,
                "role": "assistant"})
        }
    }
}

/// The `response` object: `response.created` and `response.in_progress` carry it in
/// progress, `response.completed` and the non-stream answer completed.
fn response_object(a: &Answer, completed: bool) -> Value {
    let (status, output, usage, completed_at) = if completed {
        let (prompt, completion) = (a.prompt_tokens, a.completion_tokens());
        let usage = json!({"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": a.reasoning},
            "total_tokens": prompt + completion});
        let output: Vec<Value> = items(a)
            .into_iter()
            .map(|item| output_item(a, item, true))
            .collect();
        ("completed", json!(output), usage, json!(a.created))
    } else {
        ("in_progress", json!([]), Value::Null, Value::Null)
    };
    let echo = |name: &str, default: Value| a.echo.get(name).cloned().unwrap_or(default);
    json!({"id": format!("resp_{}", a.tag), "object": "response",
        "created_at": a.created, "status": status, "background": false,
        "completed_at": completed_at, "error": null, "incomplete_details": null,
        "instructions": echo("instructions", Value::Null),
        "max_output_tokens": echo("max_output_tokens", Value::Null), "max_tool_calls": null,
        "model": a.model, "output": output, "parallel_tool_calls": true,
        "previous_response_id": echo("previous_response_id", Value::Null),
        "reasoning": {"effort": null, "summary": null}, "service_tier": "default",
        "store": echo("store", json!(true)), "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": echo("tool_choice", json!("auto")), "tools": echo("tools", json!([])),
        "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled", "usage": usage,
        "user": null, "metadata": echo("metadata", json!({}))})
}

/// Event `i` of the stream (`at` into its segment): its `type` and data.
pub(crate) fn event(a: &Answer, event: Event, i: usize, at: usize) -> Rendered {
    let at_item =
        |item: Item| json!({"item_id": item_id(a, item), "output_index": output_index(a, item)});
    let with = |mut base: Value, extra: Value| {
        if let (Value::Object(base), Value::Object(extra)) = (&mut base, extra) {
            base.extend(extra);
        }
        base
    };
    let (ty, data) = match event {
        Event::Created => (
            "response.created",
            json!({"response": response_object(a, false)}),
        ),
        Event::InProgress => (
            "response.in_progress",
            json!({"response": response_object(a, false)}),
        ),
        Event::ItemAdded(item) => (
            "response.output_item.added",
            json!({"output_index": output_index(a, item), "item": output_item(a, item, false)}),
        ),
        Event::ItemDone(item) => (
            "response.output_item.done",
            json!({"output_index": output_index(a, item), "item": output_item(a, item, true)}),
        ),
        Event::PartAdded(Item::Reasoning) => (
            "response.reasoning_summary_part.added",
            with(
                at_item(Item::Reasoning),
                json!({"summary_index": 0, "part": summary_text("")}),
            ),
        ),
        Event::PartDone(Item::Reasoning) => (
            "response.reasoning_summary_part.done",
            with(
                at_item(Item::Reasoning),
                json!({"summary_index": 0,
                    "part": summary_text(&a.text(Part::Reasoning, 0))}),
            ),
        ),
        Event::PartAdded(item) => (
            "response.content_part.added",
            with(
                at_item(item),
                json!({"content_index": 0, "part": output_text("")}),
            ),
        ),
        Event::PartDone(item) => (
            "response.content_part.done",
            with(
                at_item(item),
                json!({"content_index": 0, "part": output_text(&a.text(Part::Answer, 0))}),
            ),
        ),
        Event::Delta(Item::Reasoning) => (
            "response.reasoning_summary_text.delta",
            with(
                at_item(Item::Reasoning),
                json!({"summary_index": 0, "delta": a.token(Part::Reasoning, at + 1, 0)}),
            ),
        ),
        Event::Delta(Item::Message) => (
            "response.output_text.delta",
            with(
                at_item(Item::Message),
                json!({"content_index": 0, "delta": a.token(Part::Answer, at + 1, 0),
                    "logprobs": []}),
            ),
        ),
        Event::Delta(Item::Call(k)) => (
            "response.function_call_arguments.delta",
            with(
                at_item(Item::Call(k)),
                json!({"delta": a.arguments_piece(at + 1, 0)}),
            ),
        ),
        Event::TextDone(Item::Reasoning) => (
            "response.reasoning_summary_text.done",
            with(
                at_item(Item::Reasoning),
                json!({"summary_index": 0, "text": a.text(Part::Reasoning, 0)}),
            ),
        ),
        Event::TextDone(Item::Message) => (
            "response.output_text.done",
            with(
                at_item(Item::Message),
                json!({"content_index": 0, "text": a.text(Part::Answer, 0), "logprobs": []}),
            ),
        ),
        Event::TextDone(Item::Call(k)) => (
            "response.function_call_arguments.done",
            with(at_item(Item::Call(k)), json!({"arguments": a.arguments(0)})),
        ),
        Event::Completed => (
            "response.completed",
            json!({"response": response_object(a, true)}),
        ),
    };
    let mut data = data;
    data["type"] = ty.into();
    data["sequence_number"] = i.into();
    (Some(ty), Some(data))
}

pub(crate) fn whole(a: &Answer) -> Value {
    response_object(a, true)
}
