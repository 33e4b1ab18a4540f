//! Anthropic Messages: the `message_start` ... `message_stop` stream and the `message`.
//!
//! With reasoning, a `thinking` block comes first: its `thinking_delta`s, then one
//! `signature_delta`, as Claude's extended thinking streams it. The answer follows: a text
//! block, or the calls' `tool_use` blocks (after a text block when a preamble comes first),
//! one after the other, each input streaming as `input_json_delta`s.

use serde_json::{json, Value};

use crate::answer::{Answer, Kind, Part, Rendered, Segment};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Block {
    Thinking,
    Text,
    /// The `tool_use` block of call k.
    Tool(usize),
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
    pub(crate) fn kind(self, a: &Answer, _at: usize) -> Kind {
        match self {
            Event::Delta(_) => Kind::Content,
            // Only the last block's stop closes the answer: the others end mid-stream.
            Event::BlockStop(block) if blocks(a).last() == Some(&block) => Kind::Closing,
            _ => Kind::Framing,
        }
    }
}

/// The content blocks, in order: their position is their `index`.
fn blocks(a: &Answer) -> Vec<Block> {
    let mut blocks = Vec::with_capacity(2 + a.calls.len());
    if a.reasoning > 0 {
        blocks.push(Block::Thinking);
    }
    if a.calls.is_empty() || a.preamble > 0 {
        blocks.push(Block::Text);
    }
    blocks.extend((0..a.calls.len()).map(Block::Tool));
    blocks
}

fn index(a: &Answer, block: Block) -> usize {
    blocks(a).iter().position(|&b| b == block).unwrap_or(0)
}

pub(crate) fn plan(a: &Answer) -> Vec<Segment<Event>> {
    let mut plan = vec![(Event::MessageStart, 1)];
    for (i, block) in blocks(a).into_iter().enumerate() {
        let deltas = match block {
            Block::Thinking => a.reasoning,
            Block::Text => a.text_tokens(),
            Block::Tool(_) => a.chunks,
        };
        plan.extend([
            (Event::BlockStart(block), 1),
            // Anthropic pings once, after the first block's start.
            (Event::Ping, usize::from(i == 0)),
            (Event::Delta(block), deltas),
            (Event::Signature, usize::from(block == Block::Thinking)),
            (Event::BlockStop(block), 1),
        ]);
    }
    plan.extend([(Event::MessageDelta, 1), (Event::MessageStop, 1)]);
    plan
}

fn signature(a: &Answer) -> String {
    format!("fake-signature-{}", a.tag)
}

fn stop_reason(a: &Answer) -> &'static str {
    if !a.calls.is_empty() {
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

/// A call's input, whole: `x-fake-tool-args` was checked to be a JSON object.
fn input(a: &Answer) -> Value {
    serde_json::from_str(&a.arguments(0)).unwrap_or_else(|_| json!({}))
}

/// The `tool_use` block of call `k`, with its input (empty while deltas are to stream it).
fn tool_use(a: &Answer, k: usize, input: Value) -> Value {
    json!({"type": "tool_use", "id": a.call_tag("toolu", 0, k), "name": a.call_name(k),
        "input": input})
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
                Block::Tool(k) if a.chunks == 0 => tool_use(a, k, input(a)),
                Block::Tool(k) => tool_use(a, k, json!({})),
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
                Block::Tool(_) => json!({"type": "input_json_delta",
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
    let content: Vec<Value> = blocks(a)
        .into_iter()
        .map(|block| match block {
            Block::Thinking => json!({"type": "thinking", "thinking": a.text(Part::Reasoning, 0),
                "signature": signature(a)}),
            Block::Text => json!({"type": "text", "text": a.text(Part::Answer, 0)}),
            Block::Tool(k) => tool_use(a, k, input(a)),
        })
        .collect();
    message(
        a,
        Value::Array(content),
        json!(stop_reason(a)),
        a.completion_tokens(),
    )
}
