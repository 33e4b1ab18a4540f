//! Anthropic Messages: the `message_start` ... `message_stop` stream and the `message`.
//!
//! With reasoning, a `thinking` block comes first: its `thinking_delta`s, then one
//! `signature_delta`, as Claude's extended thinking streams it. The answer block follows: text,
//! or a `tool_use` whose input streams as `input_json_delta`s.

use serde_json::{json, Value};

use crate::answer::{Answer, Kind, Part, Rendered, Segment};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Block {
    Thinking,
    Text,
    Tool,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    MessageStart,
    BlockStart(Block),
    Ping,
    Delta(Block),
    Signature,
    BlockStop(Block),
    MessageDelta,
    MessageStop,
}

impl Event {
    pub(crate) fn kind(self, _at: usize) -> Kind {
        match self {
            Event::Delta(_) => Kind::Content,
            // The answer block's stop is the last: the thinking block's ends mid-stream.
            Event::BlockStop(Block::Text | Block::Tool) => Kind::Closing,
            _ => Kind::Framing,
        }
    }
}

fn answer_block(a: &Answer) -> Block {
    if a.tool.is_some() {
        Block::Tool
    } else {
        Block::Text
    }
}

fn index(a: &Answer, block: Block) -> usize {
    usize::from(block != Block::Thinking && a.reasoning > 0)
}

pub(crate) fn plan(a: &Answer) -> Vec<Segment<Event>> {
    let answer = answer_block(a);
    let mut plan = vec![(Event::MessageStart, 1)];
    if a.reasoning > 0 {
        plan.extend([
            (Event::BlockStart(Block::Thinking), 1),
            (Event::Ping, 1),
            (Event::Delta(Block::Thinking), a.reasoning),
            (Event::Signature, 1),
            (Event::BlockStop(Block::Thinking), 1),
            (Event::BlockStart(answer), 1),
        ]);
    } else {
        plan.extend([(Event::BlockStart(answer), 1), (Event::Ping, 1)]);
    }
    plan.extend([
        (Event::Delta(answer), a.chunks),
        (Event::BlockStop(answer), 1),
        (Event::MessageDelta, 1),
        (Event::MessageStop, 1),
    ]);
    plan
}

fn signature(a: &Answer) -> String {
    format!("fake-signature-{}", a.tag)
}

fn tool_id(a: &Answer) -> String {
    format!("toolu_{}", a.tag)
}

fn stop_reason(a: &Answer) -> &'static str {
    if a.tool.is_some() {
        "tool_use"
    } else {
        "end_turn"
    }
}

fn message(a: &Answer, content: Value, stop: Value, output_tokens: usize) -> Value {
    json!({"id": format!("msg_{}", a.tag), "type": "message", "role": "assistant",
        "model": a.model, "content": content, "stop_reason": stop, "stop_sequence": null,
        "usage": {"input_tokens": a.prompt_tokens, "output_tokens": output_tokens}})
}

/// The tool call's input, whole: `x-fake-tool-args` was checked to be a JSON object.
fn input(a: &Answer) -> Value {
    serde_json::from_str(&a.arguments(0)).unwrap_or_else(|_| json!({}))
}

pub(crate) fn event(a: &Answer, event: Event, at: usize) -> Rendered {
    let (name, value) = match event {
        Event::MessageStart => (
            "message_start",
            json!({"type": "message_start", "message": message(a, json!([]), Value::Null, 1)}),
        ),
        Event::BlockStart(block) => {
            let content = match block {
                Block::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                Block::Text => json!({"type": "text", "text": ""}),
                // With no content events to stream it, the input comes whole at the start.
                Block::Tool if a.chunks == 0 => json!({"type": "tool_use", "id": tool_id(a),
                    "name": a.tool_name(), "input": input(a)}),
                Block::Tool => json!({"type": "tool_use", "id": tool_id(a),
                    "name": a.tool_name(), "input": {}}),
            };
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": index(a, block),
                    "content_block": content}),
            )
        }
        Event::Ping => ("ping", json!({"type": "ping"})),
        Event::Delta(block) => {
            let n = at + 1;
            let delta = match block {
                Block::Thinking => json!({"type": "thinking_delta",
                    "thinking": a.token(Part::Reasoning, n, 0)}),
                Block::Text => json!({"type": "text_delta", "text": a.token(Part::Answer, n, 0)}),
                Block::Tool => json!({"type": "input_json_delta",
                    "partial_json": a.arguments_piece(n, 0)}),
            };
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index(a, block), "delta": delta}),
            )
        }
        Event::Signature => (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index(a, Block::Thinking),
                "delta": {"type": "signature_delta", "signature": signature(a)}}),
        ),
        Event::BlockStop(block) => (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index(a, block)}),
        ),
        Event::MessageDelta => (
            "message_delta",
            json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason(a), "stop_sequence": null},
                "usage": {"output_tokens": a.completion_tokens()}}),
        ),
        Event::MessageStop => ("message_stop", json!({"type": "message_stop"})),
    };
    (Some(name), Some(value))
}

pub(crate) fn whole(a: &Answer) -> Value {
    let mut content = Vec::new();
    if a.reasoning > 0 {
        content.push(
            json!({"type": "thinking", "thinking": a.text(Part::Reasoning, 0),
            "signature": signature(a)}),
        );
    }
    content.push(match answer_block(a) {
        Block::Tool => json!({"type": "tool_use", "id": tool_id(a), "name": a.tool_name(),
            "input": input(a)}),
        _ => json!({"type": "text", "text": a.text(Part::Answer, 0)}),
    });
    message(
        a,
        Value::Array(content),
        json!(stop_reason(a)),
        a.completion_tokens(),
    )
}
