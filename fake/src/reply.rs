//! What an answer says, and how its events follow each other; the three APIs' shapes are in
//! `chat.rs`, `anthropic.rs` and `responses.rs`.
//!
//! Events are rendered lazily, one at a time, from a plan of a dozen segments ("N content
//! deltas", "the finish chunk of each choice", ...), so a long or frozen stream costs a few
//! words of memory rather than a queue of prepared JSON. The non-stream answer is built from
//! the same [`Answer`], which is what makes a stream and its whole answer agree.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::{anthropic, chat, monotonic_ns, responses};

/// The API a request spoke.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Api {
    Chat,
    Anthropic,
    /// The OpenAI Responses API (`POST /v1/responses`).
    Responses,
}

/// A scripted function call.
#[derive(Clone, Debug)]
pub(crate) struct Tool {
    pub(crate) name: String,
    /// `x-fake-tool-args`, as sent (a JSON object); `None`: `{"text":"tok1 ..."}`.
    pub(crate) arguments: Option<String>,
}

/// Everything a generated answer says, from the script and the request.
#[derive(Clone, Debug)]
pub(crate) struct Answer {
    pub(crate) api: Api,
    /// The core of every id (`chatcmpl-TAG`, `msg_TAG`, `call_TAG`, ...): `x-fake-id`, or a
    /// per-instance counter.
    pub(crate) tag: String,
    pub(crate) model: String,
    pub(crate) created: u64,
    pub(crate) prompt_tokens: usize,
    /// Answer tokens per choice (text, refusal, or pieces of the call's arguments).
    pub(crate) chunks: usize,
    /// Reasoning tokens before the answer, per choice.
    pub(crate) reasoning: usize,
    /// Chat `n`: choices, streamed interleaved.
    pub(crate) choices: usize,
    /// Chat `logprobs: true`: the `top_logprobs` asked for.
    pub(crate) logprobs: Option<usize>,
    /// Chat: the answer is a `refusal` instead of content.
    pub(crate) refusal: bool,
    /// Chat `stream_options.include_usage`: a last chunk with the usage.
    pub(crate) include_usage: bool,
    pub(crate) tool: Option<Tool>,
    /// Responses API: the request fields a `response` object echoes (`instructions`,
    /// `max_output_tokens`, `tools`, ...).
    pub(crate) echo: Value,
}

/// Which part of an answer a token belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Part {
    Reasoning,
    Answer,
}

impl Answer {
    /// Token `n` (from 1) of `part` in choice `choice`: `tok3 `, `think2 `, `tok3-1 `.
    pub(crate) fn token(&self, part: Part, n: usize, choice: usize) -> String {
        match (part, choice) {
            (Part::Reasoning, 0) => format!("think{n} "),
            (Part::Reasoning, c) => format!("think{n}-{c} "),
            (Part::Answer, 0) => format!("tok{n} "),
            (Part::Answer, c) => format!("tok{n}-{c} "),
        }
    }

    /// All the tokens of `part` in `choice`, joined.
    pub(crate) fn text(&self, part: Part, choice: usize) -> String {
        let count = match part {
            Part::Reasoning => self.reasoning,
            Part::Answer => self.chunks,
        };
        (1..=count).map(|n| self.token(part, n, choice)).collect()
    }

    /// The arguments of the scripted call, whole.
    pub(crate) fn arguments(&self, choice: usize) -> String {
        match self.tool.as_ref().and_then(|t| t.arguments.clone()) {
            Some(arguments) => arguments,
            None => json!({"text": self.text(Part::Answer, choice)}).to_string(),
        }
    }

    /// The piece of [`Answer::arguments`] content event `n` (from 1) streams: the pieces of
    /// all `chunks` events join into the whole.
    pub(crate) fn arguments_piece(&self, n: usize, choice: usize) -> String {
        if let Some(whole) = self.tool.as_ref().and_then(|t| t.arguments.as_deref()) {
            // Cut by characters, so a piece never splits one in two.
            let chars = whole.chars().count();
            let from = chars * (n - 1) / self.chunks;
            let to = chars * n / self.chunks;
            return whole.chars().skip(from).take(to - from).collect();
        }
        let mut piece = String::new();
        if n == 1 {
            piece.push_str("{\"text\":\"");
        }
        piece.push_str(&self.token(Part::Answer, n, choice));
        if n == self.chunks {
            piece.push_str("\"}");
        }
        piece
    }

    /// The arguments the opening event of a call carries: nothing when content events stream
    /// them, all of them when there are none.
    pub(crate) fn arguments_at_start(&self, choice: usize) -> String {
        if self.chunks == 0 {
            self.arguments(choice)
        } else {
            String::new()
        }
    }

    pub(crate) fn tool_name(&self) -> &str {
        self.tool.as_ref().map_or("", |t| t.name.as_str())
    }

    /// Tokens generated per choice: reasoning and answer.
    pub(crate) fn completion_tokens(&self) -> usize {
        self.reasoning + self.chunks
    }
}

/// Where an event sits in the stream, for the body's timing.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Framing,
    /// A token: it follows the interval and counts for freeze/disconnect.
    Content,
    /// The first closing event after the last token (the finish chunk, `content_block_stop`):
    /// it follows the interval too, as a provider's would.
    Closing,
}

/// One segment of a plan: `count` events of one sort.
pub(crate) type Segment<E> = (E, usize);

/// Finds event `i` of a plan: its segment's sort and its offset in the segment.
pub(crate) fn locate<E: Copy>(plan: &[Segment<E>], mut i: usize) -> Option<(E, usize)> {
    for &(event, count) in plan {
        if i < count {
            return Some((event, i));
        }
        i -= count;
    }
    None
}

fn total<E>(plan: &[Segment<E>]) -> usize {
    plan.iter().map(|(_, count)| count).sum()
}

pub(crate) enum Plan {
    Chat(Vec<Segment<chat::Event>>),
    Anthropic(Vec<Segment<anthropic::Event>>),
    Responses(Vec<Segment<responses::Event>>),
}

/// What one response body sends, event by event.
pub(crate) enum Reply {
    /// A generated stream.
    Stream {
        answer: Box<Answer>,
        plan: Plan,
        len: usize,
    },
    /// One body, sent whole (a non-stream answer, an error).
    Full(Bytes),
    /// Recorded events, every one a content event.
    Replay(Arc<[Bytes]>),
}

impl Reply {
    pub(crate) fn stream(answer: Answer) -> Reply {
        let plan = match answer.api {
            Api::Chat => Plan::Chat(chat::plan(&answer)),
            Api::Anthropic => Plan::Anthropic(anthropic::plan(&answer)),
            Api::Responses => Plan::Responses(responses::plan(&answer)),
        };
        let len = match &plan {
            Plan::Chat(p) => total(p),
            Plan::Anthropic(p) => total(p),
            Plan::Responses(p) => total(p),
        };
        Reply::Stream {
            answer: Box::new(answer),
            plan,
            len,
        }
    }

    /// The non-stream answer: one JSON document.
    pub(crate) fn whole(answer: &Answer) -> Reply {
        let value = match answer.api {
            Api::Chat => chat::whole(answer),
            Api::Anthropic => anthropic::whole(answer),
            Api::Responses => responses::whole(answer),
        };
        Reply::Full(Bytes::from(value.to_string()))
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Reply::Stream { len, .. } => *len,
            Reply::Full(_) => 1,
            Reply::Replay(events) => events.len(),
        }
    }

    pub(crate) fn kind(&self, i: usize) -> Kind {
        match self {
            Reply::Stream { plan, .. } => {
                let found = match plan {
                    Plan::Chat(p) => locate(p, i).map(|(e, at)| e.kind(at)),
                    Plan::Anthropic(p) => locate(p, i).map(|(e, at)| e.kind(at)),
                    Plan::Responses(p) => locate(p, i).map(|(e, at)| e.kind(at)),
                };
                found.unwrap_or(Kind::Framing)
            }
            Reply::Full(_) => Kind::Framing,
            Reply::Replay(_) => Kind::Content,
        }
    }

    /// Renders event `i`, stamping content events with the send time when asked.
    pub(crate) fn render(&self, i: usize, stamp: bool) -> Bytes {
        let (answer, plan) = match self {
            Reply::Full(bytes) => return bytes.clone(),
            Reply::Replay(events) => return events[i].clone(),
            Reply::Stream { answer, plan, .. } => (answer, plan),
        };
        let rendered = match plan {
            Plan::Chat(p) => locate(p, i).map(|(e, at)| chat::event(answer, e, at)),
            Plan::Anthropic(p) => locate(p, i).map(|(e, at)| anthropic::event(answer, e, at)),
            Plan::Responses(p) => locate(p, i).map(|(e, at)| responses::event(answer, e, i, at)),
        };
        let Some((name, data)) = rendered else {
            return Bytes::new();
        };
        let Some(mut data) = data else {
            return Bytes::from_static(b"data: [DONE]\n\n");
        };
        if stamp && self.kind(i) == Kind::Content {
            data["x_fake_sent_ns"] = monotonic_ns().into();
        }
        Bytes::from(match name {
            Some(name) => format!("event: {name}\ndata: {data}\n\n"),
            None => format!("data: {data}\n\n"),
        })
    }
}

/// An event as an API file renders it: its SSE `event:` name if it has one, and its data
/// (`None`: Chat's `[DONE]`).
pub(crate) type Rendered = (Option<&'static str>, Option<Value>);
