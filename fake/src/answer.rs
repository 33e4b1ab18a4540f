//! What an answer says (the script and the request made into [`Answer`]), and the vocabulary
//! the three APIs' files (`chat.rs`, `anthropic.rs`, `responses.rs`) plan and render it in.

use serde_json::{json, Value};

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

/// An event as an API file renders it: its SSE `event:` name if it has one, and its data
/// (`None`: Chat's `[DONE]`).
pub(crate) type Rendered = (Option<&'static str>, Option<Value>);
