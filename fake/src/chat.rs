//! OpenAI Chat Completions: the `chat.completion.chunk` stream and the `chat.completion`.
//!
//! Choices (`n`) stream interleaved, token by token; reasoning comes first as
//! `reasoning_content` (DeepSeek's and vLLM's convention: OpenAI's own Chat API streams none);
//! `stream_options.include_usage` adds the last chunk with no choices and the usage, and
//! `"usage": null` on every other chunk, as OpenAI sends them.
//!
//! Calls stream as OpenAI streams parallel ones: one after the other, each opened by a delta
//! with its `index`, `id` and `function.name` (the first in the role's delta when no text comes
//! before it), then its argument pieces under the same `index`.

use serde_json::{json, Map, Value};

use crate::answer::{Answer, Kind, Part, Rendered, Segment};

#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    /// Per choice: the role, and the first call's opening when no text precedes it.
    Role,
    Reasoning,
    /// Text: the answer, the refusal, or the preamble before the calls.
    Text,
    /// Per choice: call k's opening (id, name), unless the role's delta carried it.
    CallStart(usize),
    /// Call k's argument pieces.
    Arguments(usize),
    /// Per choice: the finish reason.
    Finish,
    Usage,
    Done,
}

impl Event {
    pub(crate) fn kind(self, _a: &Answer, at: usize) -> Kind {
        match self {
            Event::Reasoning | Event::Text | Event::Arguments(_) => Kind::Content,
            Event::Finish if at == 0 => Kind::Closing,
            _ => Kind::Framing,
        }
    }
}

pub(crate) fn plan(a: &Answer) -> Vec<Segment<Event>> {
    let n = a.choices;
    let mut plan = vec![
        (Event::Role, n),
        (Event::Reasoning, a.reasoning * n),
        (Event::Text, a.text_tokens() * n),
    ];
    for k in 0..a.calls.len() {
        let opened_by_role = k == 0 && first_call_in_role(a);
        plan.push((Event::CallStart(k), if opened_by_role { 0 } else { n }));
        plan.push((Event::Arguments(k), a.chunks * n));
    }
    plan.extend([
        (Event::Finish, n),
        (Event::Usage, usize::from(a.include_usage)),
        (Event::Done, 1),
    ]);
    plan
}

/// A call with nothing said before it opens in the role's delta, as OpenAI sends it; after a
/// preamble the role's delta opens the content instead.
fn first_call_in_role(a: &Answer) -> bool {
    is_call(a) && a.preamble == 0
}

fn id(a: &Answer) -> String {
    format!("chatcmpl-{}", a.tag)
}

/// The opening of call `k`: what its first delta carries (and, with `index`, the whole call
/// in the answer, once `arguments` holds all of them).
fn call_opening(a: &Answer, choice: usize, k: usize, arguments: String) -> Value {
    json!({"index": k, "id": a.call_tag("call", choice, k), "type": "function",
        "function": {"name": a.call_name(k), "arguments": arguments}})
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

/// Whether the answer calls functions (a refusal never does: it has no calls).
fn is_call(a: &Answer) -> bool {
    !a.calls.is_empty()
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
/// refusal, `null` when not asked for or for calls (a preamble included: kept simple).
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
            let delta = if first_call_in_role(a) {
                let call = call_opening(a, choice, 0, a.arguments_at_start(choice));
                json!({"role": "assistant", "content": null, "tool_calls": [call]})
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
        Event::CallStart(k) => {
            let call = call_opening(a, at, k, a.arguments_at_start(at));
            choice_chunk(
                a,
                at,
                json!({"tool_calls": [call]}),
                Value::Null,
                Value::Null,
            )
        }
        Event::Arguments(k) => {
            let (piece, choice) = (at / n + 1, at % n);
            let piece = a.arguments_piece(piece, choice);
            let delta = json!({"tool_calls": [{"index": k, "function": {"arguments": piece}}]});
            choice_chunk(a, choice, delta, Value::Null, Value::Null)
        }
        Event::Text => {
            let (token, choice) = (at / n + 1, at % n);
            let text = a.token(Part::Answer, token, choice);
            let delta = if a.refusal {
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
            if a.refusal {
                message["refusal"] = json!(text);
            } else if !text.is_empty() || !is_call(a) {
                message["content"] = json!(text);
            }
            if is_call(a) {
                let calls: Vec<Value> = (0..a.calls.len())
                    .map(|k| {
                        let mut call = call_opening(a, choice, k, a.arguments(choice));
                        // The index only tells stream deltas apart; the list's order says it.
                        if let Value::Object(call) = &mut call {
                            call.remove("index");
                        }
                        call
                    })
                    .collect();
                message["tool_calls"] = Value::Array(calls);
            }
            if a.reasoning > 0 {
                message["reasoning_content"] = json!(a.text(Part::Reasoning, choice));
            }
            let tokens = (1..=a.text_tokens()).map(|n| a.token(Part::Answer, n, choice));
            json!({"index": choice, "message": message, "logprobs": logprobs(a, tokens),
                "finish_reason": finish_reason(a)})
        })
        .collect();
    let mut doc = head(a, "chat.completion");
    doc.insert("choices".into(), Value::Array(choices));
    doc.insert("usage".into(), usage(a));
    Value::Object(doc)
}
