//! How an answer's events follow each other; what it says is in `answer.rs`, the three APIs'
//! shapes in `chat.rs`, `anthropic.rs` and `responses.rs`.
//!
//! Events are rendered lazily, one at a time, from a plan of a dozen segments ("N content
//! deltas", "the finish chunk of each choice", ...), so a long or frozen stream costs a few
//! words of memory rather than a queue of prepared JSON. The non-stream answer is built from
//! the same [`Answer`], which is what makes a stream and its whole answer agree.

use std::sync::Arc;

use bytes::Bytes;

use crate::answer::{Answer, Api, Kind, Segment};
use crate::{anthropic, chat, monotonic_ns, responses};

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
            Reply::Stream { answer, plan, .. } => {
                let found = match plan {
                    Plan::Chat(p) => locate(p, i).map(|(e, at)| e.kind(answer, at)),
                    Plan::Anthropic(p) => locate(p, i).map(|(e, at)| e.kind(answer, at)),
                    Plan::Responses(p) => locate(p, i).map(|(e, at)| e.kind(answer, at)),
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
