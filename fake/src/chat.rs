//! OpenAI Chat Completions: the `chat.completion.chunk` stream and the `chat.completion`.
//!
//! Choices (`n`) stream interleaved, token by token; reasoning comes first as
//! `reasoning_content` (DeepSeek's and vLLM's convention: OpenAI's own Chat API streams none);
//! `stream_options.include_usage` adds the last chunk with no choices and the usage, and
//! `"usage": null` on every other chunk, as OpenAI sends them.

use serde_json::{json, Map, Value};

use crate::answer::{Answer, Kind, Part, Rendered, Segment};

#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    /// Per choice: the role, and the call's name.
    Role,
    Reasoning,
    Answer,
    /// Per choice: the finish reason.
    Finish,
    Usage,
    Done,
}

impl Event {
    pub(crate) fn kind(self, at: usize) -> Kind {
        match self {
            Event::Reasoning | Event::Answer => Kind::Content,
            Event::Finish if at == 0 => Kind::Closing,
            _ => Kind::Framing,
        }
    }
}

pub(crate) fn plan(a: &Answer) -> Vec<Segment<Event>> {
    let n = a.choices;
    vec![
        (Event::Role, n),
        (Event::Reasoning, a.reasoning * n),
        (Event::Answer, a.chunks * n),
        (Event::Finish, n),
        (Event::Usage, usize::from(a.include_usage)),
        (Event::Done, 1),
    ]
}

fn id(a: &Answer) -> String {
    format!("chatcmpl-{}", a.tag)
}

fn call_id(a: &Answer, choice: usize) -> String {
    match choice {
        0 => format!("call_{}", a.tag),
        c => format!("call_{}_{c}", a.tag),
    }
}

/// The fields every chunk and the whole answer share, in OpenAI's order.
fn head(a: &Answer, object: &str) -> Map<String, Value> {
    let mut head = Map::new();
    head.insert("id".into(), json!(id(a)));
    head.insert("object".into(), json!(object));
    head.insert("created".into(), json!(a.created));
    head.insert("model".into(), json!(a.model));
    head.insert("service_tier".into(), json!("default"));
    head.insert("system_fingerprint".into(), json!("fp_fake"));
    head
}

fn chunk(a: &Answer, choices: Value) -> Value {
    let mut chunk = head(a, "chat.completion.chunk");
    chunk.insert("choices".into(), choices);
    if a.include_usage {
        chunk.insert("usage".into(), Value::Null);
    }
    Value::Object(chunk)
}

fn choice_chunk(a: &Answer, choice: usize, delta: Value, logprobs: Value, finish: Value) -> Value {
    let choice = json!({"index": choice, "delta": delta, "logprobs": logprobs,
        "finish_reason": finish});
    chunk(a, json!([choice]))
}

/// Whether the answer is a call: a refusal is an answer without one.
fn is_call(a: &Answer) -> bool {
    a.tool.is_some() && !a.refusal
}

fn finish_reason(a: &Answer) -> &'static str {
    if is_call(a) {
        "tool_calls"
    } else {
        "stop"
    }
}

fn usage(a: &Answer) -> Value {
    let prompt = a.prompt_tokens;
    let completion = a.completion_tokens() * a.choices;
    let mut usage = json!({"prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion});
    if a.reasoning > 0 {
        usage["completion_tokens_details"] = json!({"reasoning_tokens": a.reasoning * a.choices});
    }
    usage
}

/// A logprobs entry for one token, with `top` alternatives (the token itself first).
fn logprob(token: &str, top: usize) -> Value {
    let entry = |token: &str, logprob: f64| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()});
    let mut chosen = entry(token, -0.25);
    let alternatives: Vec<Value> = (0..top)
        .map(|j| match j {
            0 => entry(token, -0.25),
            j => entry(&format!("alt{j}"), -0.25 - j as f64),
        })
        .collect();
    chosen["top_logprobs"] = Value::Array(alternatives);
    chosen
}

/// The `logprobs` of a choice whose answer tokens are `tokens`: under `refusal` for a
/// refusal, `null` when not asked for or for a call (which has no content tokens).
fn logprobs(a: &Answer, tokens: impl Iterator<Item = String>) -> Value {
    match a.logprobs {
        Some(top) if !is_call(a) => {
            let entries: Vec<Value> = tokens.map(|t| logprob(&t, top)).collect();
            if a.refusal {
                json!({"content": null, "refusal": entries})
            } else {
                json!({"content": entries, "refusal": null})
            }
        }
        _ => Value::Null,
    }
}

pub(crate) fn event(a: &Answer, event: Event, at: usize) -> Rendered {
    let n = a.choices;
    let value = match event {
        Event::Role => {
            let choice = at;
            let delta = if is_call(a) {
                json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0,
                    "id": call_id(a, choice), "type": "function",
                    "function": {"name": a.tool_name(), "arguments": a.arguments_at_start(choice)}}]})
            } else if a.refusal {
                json!({"role": "assistant", "content": null, "refusal": ""})
            } else {
                json!({"role": "assistant", "content": ""})
            };
            choice_chunk(a, choice, delta, Value::Null, Value::Null)
        }
        Event::Reasoning => {
            let (token, choice) = (at / n + 1, at % n);
            let delta = json!({"reasoning_content": a.token(Part::Reasoning, token, choice)});
            choice_chunk(a, choice, delta, Value::Null, Value::Null)
        }
        Event::Answer => {
            let (token, choice) = (at / n + 1, at % n);
            let text = a.token(Part::Answer, token, choice);
            let delta = if is_call(a) {
                let piece = a.arguments_piece(token, choice);
                json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            } else if a.refusal {
                json!({"refusal": text})
            } else {
                json!({"content": text})
            };
            let logprobs = logprobs(a, std::iter::once(text));
            choice_chunk(a, choice, delta, logprobs, Value::Null)
        }
        Event::Finish => choice_chunk(a, at, json!({}), Value::Null, json!(finish_reason(a))),
        Event::Usage => {
            let mut last = chunk(a, json!([]));
            last["usage"] = usage(a);
            last
        }
        Event::Done => return (None, None),
    };
    (None, Some(value))
}

pub(crate) fn whole(a: &Answer) -> Value {
    let choices: Vec<Value> = (0..a.choices)
        .map(|choice| {
            let text = a.text(Part::Answer, choice);
            let mut message = json!({"role": "assistant", "content": null, "refusal": null,
                "annotations": []});
            if is_call(a) {
                message["tool_calls"] = json!([{"id": call_id(a, choice), "type": "function",
                    "function": {"name": a.tool_name(), "arguments": a.arguments(choice)}}]);
            } else if a.refusal {
                message["refusal"] = json!(text);
            } else {
                message["content"] = json!(text);
            }
            if a.reasoning > 0 {
                message["reasoning_content"] = json!(a.text(Part::Reasoning, choice));
            }
            let tokens = (1..=a.chunks).map(|n| a.token(Part::Answer, n, choice));
            json!({"index": choice, "message": message, "logprobs": logprobs(a, tokens),
                "finish_reason": finish_reason(a)})
        })
        .collect();
    let mut doc = head(a, "chat.completion");
    doc.insert("choices".into(), Value::Array(choices));
    doc.insert("usage".into(), usage(a));
    Value::Object(doc)
}
