//! What an answer says, in each API's shape, rendered one event at a time.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::monotonic_ns;

pub(crate) enum Shape {
    OpenAi,
    Anthropic,
    /// The OpenAI Responses API (`POST /v1/responses`).
    Responses,
    Full(Bytes),
    /// Recorded events, every one a content event.
    Replay(Arc<[Bytes]>),
}

/// What one response says. Events are rendered lazily, one at a time, so a long or frozen stream
/// costs a few words of memory rather than a queue of prepared JSON.
pub(crate) struct Reply {
    pub(crate) shape: Shape,
    pub(crate) id: u64,
    pub(crate) model: String,
    pub(crate) created: u64,
    pub(crate) prompt_tokens: usize,
    pub(crate) chunks: usize,
    /// `x-fake-tool-call`: the answer is a call of this function, whose arguments the content
    /// events stream, instead of text.
    pub(crate) tool: Option<String>,
    /// Responses API: the request fields a `response` object echoes (`instructions`,
    /// `max_output_tokens`, `tools`, ...).
    pub(crate) echo: Value,
}

/// Where an event sits in the stream.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Framing,
    Content(usize),
    /// Closing events that follow the interval (the finish chunk, `content_block_stop`).
    Closing,
}

impl Reply {
    pub(crate) fn full(text: impl Into<Bytes>) -> Reply {
        let shape = Shape::Full(text.into());
        Reply {
            shape,
            id: 0,
            model: String::new(),
            created: 0,
            prompt_tokens: 0,
            chunks: 0,
            tool: None,
            echo: Value::Null,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self.shape {
            Shape::OpenAi => self.chunks + 3,
            Shape::Anthropic => self.chunks + 6,
            // created, in_progress, item added, (part added,) N deltas, (text done, part
            // done,) or arguments done, item done, completed.
            Shape::Responses if self.tool.is_some() => self.chunks + 6,
            Shape::Responses => self.chunks + 8,
            Shape::Full(_) => 1,
            Shape::Replay(ref events) => events.len(),
        }
    }

    /// Leading framing events before the first content event.
    pub(crate) fn preamble(&self) -> usize {
        match self.shape {
            Shape::OpenAi => 1,
            Shape::Anthropic => 3,
            Shape::Responses if self.tool.is_some() => 3,
            Shape::Responses => 4,
            Shape::Full(_) => usize::MAX,
            Shape::Replay(_) => 0,
        }
    }

    pub(crate) fn kind(&self, i: usize) -> Kind {
        match i.checked_sub(self.preamble()) {
            Some(n) if n < self.chunks => Kind::Content(n + 1),
            Some(n) if n == self.chunks => Kind::Closing,
            _ => Kind::Framing,
        }
    }

    pub(crate) fn text(&self) -> String {
        (1..=self.chunks).map(|n| format!("tok{n} ")).collect()
    }

    /// The arguments of a scripted tool call, whole: `{"text":"tok1 tok2 "}`.
    pub(crate) fn arguments(&self) -> String {
        json!({"text": self.text()}).to_string()
    }

    /// The piece of [`Reply::arguments`] content event `n` (from 1) streams: the pieces of all
    /// `chunks` events join into the whole.
    pub(crate) fn arguments_piece(&self, n: usize) -> String {
        let mut piece = String::new();
        if n == 1 {
            piece.push_str("{\"text\":\"");
        }
        piece.push_str(&format!("tok{n} "));
        if n == self.chunks {
            piece.push_str("\"}");
        }
        piece
    }

    pub(crate) fn tool_name(&self) -> &str {
        self.tool.as_deref().unwrap_or_default()
    }

    pub(crate) fn usage(&self) -> Value {
        let (prompt, completion) = (self.prompt_tokens, self.chunks);
        json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
    }

    pub(crate) fn openai_chunk(&self, delta: Value, finish: Value) -> Value {
        json!({"id": format!("chatcmpl-fake-{}", self.id), "object": "chat.completion.chunk",
            "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    }

    pub(crate) fn openai_finish(&self) -> Value {
        json!(if self.tool.is_some() {
            "tool_calls"
        } else {
            "stop"
        })
    }

    pub(crate) fn anthropic_message(
        &self,
        content: Value,
        stop: Value,
        output_tokens: usize,
    ) -> Value {
        json!({"id": format!("msg_fake_{}", self.id), "type": "message", "role": "assistant",
            "model": self.model, "content": content, "stop_reason": stop, "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": output_tokens}})
    }

    pub(crate) fn anthropic_stop(&self) -> Value {
        json!(if self.tool.is_some() {
            "tool_use"
        } else {
            "end_turn"
        })
    }

    /// A Responses `response` object, as `response.created`, `response.completed` and the
    /// non-streaming answer carry it.
    pub(crate) fn response_object(&self, completed: bool) -> Value {
        let (status, output, usage, completed_at) = if completed {
            let (prompt, completion) = (self.prompt_tokens, self.chunks);
            let usage = json!({"input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion});
            (
                "completed",
                json!([self.output_item(true)]),
                usage,
                json!(self.created),
            )
        } else {
            ("in_progress", json!([]), Value::Null, Value::Null)
        };
        let echo = |name: &str, default: Value| self.echo.get(name).cloned().unwrap_or(default);
        json!({"id": format!("resp_fake_{}", self.id), "object": "response",
            "created_at": self.created, "status": status, "background": false,
            "completed_at": completed_at, "error": null, "incomplete_details": null,
            "instructions": echo("instructions", Value::Null),
            "max_output_tokens": echo("max_output_tokens", Value::Null), "max_tool_calls": null,
            "model": self.model, "output": output, "parallel_tool_calls": true,
            "previous_response_id": echo("previous_response_id", Value::Null),
            "reasoning": {"effort": null, "summary": null}, "service_tier": "default",
            "store": echo("store", json!(true)), "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": echo("tool_choice", json!("auto")), "tools": echo("tools", json!([])),
            "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled", "usage": usage,
            "user": null, "metadata": echo("metadata", json!({}))})
    }

    pub(crate) fn item_id(&self) -> String {
        match self.tool {
            Some(_) => format!("fc_fake_{}", self.id),
            None => format!("msg_fake_{}", self.id),
        }
    }

    /// The one output item: the assistant message, or the function call.
    pub(crate) fn output_item(&self, done: bool) -> Value {
        let status = if done { "completed" } else { "in_progress" };
        match self.tool {
            Some(_) => json!({"id": self.item_id(), "type": "function_call", "status": status,
                "arguments": if done { self.arguments() } else { String::new() },
                "call_id": format!("call_fake_{}", self.id), "name": self.tool_name()}),
            None => {
                let content = if done {
                    json!([self.output_text(&self.text())])
                } else {
                    json!([])
                };
                json!({"id": self.item_id(), "type": "message", "status": status,
                    "content": content, "role": "assistant"})
            }
        }
    }

    pub(crate) fn output_text(&self, text: &str) -> Value {
        json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text})
    }

    /// Responses event `i`: its `type` and data (`sequence_number` is the event's index).
    pub(crate) fn responses_event(&self, i: usize, kind: Kind) -> (&'static str, Value) {
        let item = self.item_id();
        let (ty, mut data) = match (kind, &self.tool) {
            (Kind::Content(n), Some(_)) => (
                "response.function_call_arguments.delta",
                json!({"item_id": item, "output_index": 0, "delta": self.arguments_piece(n)}),
            ),
            (Kind::Content(n), None) => (
                "response.output_text.delta",
                json!({"item_id": item, "output_index": 0, "content_index": 0,
                    "delta": format!("tok{n} "), "logprobs": []}),
            ),
            (Kind::Closing, Some(_)) => (
                "response.function_call_arguments.done",
                json!({"item_id": item, "output_index": 0, "arguments": self.arguments()}),
            ),
            (Kind::Closing, None) => (
                "response.output_text.done",
                json!({"item_id": item, "output_index": 0, "content_index": 0,
                    "text": self.text(), "logprobs": []}),
            ),
            (Kind::Framing, _) if i < 2 => {
                let ty = ["response.created", "response.in_progress"][i];
                (ty, json!({"response": self.response_object(false)}))
            }
            (Kind::Framing, _) if i == 2 => (
                "response.output_item.added",
                json!({"output_index": 0, "item": self.output_item(false)}),
            ),
            (Kind::Framing, None) if i == 3 => (
                "response.content_part.added",
                json!({"item_id": item, "output_index": 0, "content_index": 0,
                    "part": self.output_text("")}),
            ),
            (Kind::Framing, _) if i + 1 == self.len() => (
                "response.completed",
                json!({"response": self.response_object(true)}),
            ),
            (Kind::Framing, _) if i + 2 == self.len() => (
                "response.output_item.done",
                json!({"output_index": 0, "item": self.output_item(true)}),
            ),
            (Kind::Framing, _) => (
                "response.content_part.done",
                json!({"item_id": item, "output_index": 0, "content_index": 0,
                    "part": self.output_text(&self.text())}),
            ),
        };
        data["type"] = ty.into();
        data["sequence_number"] = i.into();
        (ty, data)
    }

    /// The non-stream answer.
    pub(crate) fn whole(&self) -> String {
        let text = self.text();
        let value = match (&self.shape, &self.tool) {
            (Shape::Responses, _) => self.response_object(true),
            (Shape::Anthropic, Some(name)) => self.anthropic_message(
                json!([{"type": "tool_use", "id": format!("toolu_fake_{}", self.id),
                    "name": name, "input": {"text": text}}]),
                self.anthropic_stop(),
                self.chunks,
            ),
            (Shape::Anthropic, None) => self.anthropic_message(
                json!([{"type": "text", "text": text}]),
                self.anthropic_stop(),
                self.chunks,
            ),
            (_, tool) => {
                let message = match tool {
                    Some(name) => json!({"role": "assistant", "content": null,
                        "tool_calls": [{"id": format!("call_fake_{}", self.id), "type": "function",
                            "function": {"name": name, "arguments": self.arguments()}}]}),
                    None => json!({"role": "assistant", "content": text}),
                };
                json!({"id": format!("chatcmpl-fake-{}", self.id), "object": "chat.completion",
                    "created": self.created, "model": self.model,
                    "choices": [{"index": 0, "message": message, "finish_reason": self.openai_finish()}],
                    "usage": self.usage()})
            }
        };
        value.to_string()
    }

    /// Renders event `i`, stamping content events with the send time when asked.
    pub(crate) fn render(&self, i: usize, stamp: bool) -> Bytes {
        let kind = self.kind(i);
        let tool = self.tool.is_some();
        let (event, mut data) = match (&self.shape, kind) {
            (Shape::Full(bytes), _) => return bytes.clone(),
            (Shape::Replay(events), _) => return events[i].clone(),
            (Shape::Responses, kind) => {
                let (ty, data) = self.responses_event(i, kind);
                (Some(ty), data)
            }
            (Shape::OpenAi, Kind::Content(n)) => {
                let delta = if tool {
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": self.arguments_piece(n)}}]})
                } else {
                    json!({"content": format!("tok{n} ")})
                };
                (None, self.openai_chunk(delta, Value::Null))
            }
            (Shape::OpenAi, Kind::Closing) => {
                let mut chunk = self.openai_chunk(json!({}), self.openai_finish());
                chunk["usage"] = self.usage();
                (None, chunk)
            }
            (Shape::OpenAi, Kind::Framing) if i == 0 => {
                let delta = if tool {
                    json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0,
                        "id": format!("call_fake_{}", self.id), "type": "function",
                        "function": {"name": self.tool_name(), "arguments": ""}}]})
                } else {
                    json!({"role": "assistant", "content": ""})
                };
                (None, self.openai_chunk(delta, Value::Null))
            }
            (Shape::OpenAi, Kind::Framing) => return Bytes::from_static(b"data: [DONE]\n\n"),
            (Shape::Anthropic, Kind::Content(n)) => {
                let delta = if tool {
                    json!({"type": "input_json_delta", "partial_json": self.arguments_piece(n)})
                } else {
                    json!({"type": "text_delta", "text": format!("tok{n} ")})
                };
                (
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": 0, "delta": delta}),
                )
            }
            (Shape::Anthropic, Kind::Closing) => (
                Some("content_block_stop"),
                json!({"type": "content_block_stop", "index": 0}),
            ),
            (Shape::Anthropic, Kind::Framing) => {
                let (name, value) = match i {
                    0 => (
                        "message_start",
                        json!({"type": "message_start", "message": self.anthropic_message(json!([]), Value::Null, 1)}),
                    ),
                    1 => {
                        let block = if tool {
                            json!({"type": "tool_use", "id": format!("toolu_fake_{}", self.id),
                                "name": self.tool_name(), "input": {}})
                        } else {
                            json!({"type": "text", "text": ""})
                        };
                        (
                            "content_block_start",
                            json!({"type": "content_block_start", "index": 0, "content_block": block}),
                        )
                    }
                    2 => ("ping", json!({"type": "ping"})),
                    _ if i + 1 < self.len() => (
                        "message_delta",
                        json!({"type": "message_delta", "delta": {"stop_reason": self.anthropic_stop(), "stop_sequence": null}, "usage": {"output_tokens": self.chunks}}),
                    ),
                    _ => ("message_stop", json!({"type": "message_stop"})),
                };
                (Some(name), value)
            }
        };
        if stamp && matches!(kind, Kind::Content(_)) {
            data["x_fake_sent_ns"] = monotonic_ns().into();
        }
        let data = data.to_string();
        Bytes::from(match event {
            Some(event) => format!("event: {event}\ndata: {data}\n\n"),
            None => format!("data: {data}\n\n"),
        })
    }
}
