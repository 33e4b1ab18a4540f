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
    /// Answer tokens per choice (text or refusal), or pieces of each call's arguments.
    pub(crate) chunks: usize,
    /// Text tokens before the calls, per choice (`x-fake-tool-preamble`); 0 without calls.
    pub(crate) preamble: usize,
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
    /// The functions this answer calls, in parallel; empty: the answer is text.
    pub(crate) calls: Vec<String>,
    /// `x-fake-tool-args`, as sent (a JSON object), for every call; `None`: `{"text":"tok1 ..."}`.
    pub(crate) arguments: Option<String>,
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

    /// The pieces a document of this answer is built of, each a token's few bytes: what the
    /// scripted counts become once multiplied by the request's `n`, the `top_logprobs` each
    /// token carries and the calls each argument piece goes to (audit U: 100,000 chunks
    /// with 20 top logprobs made a 131 MB document in 4 GB).
    pub(crate) fn document_pieces(&self) -> u128 {
        let per_choice = self.reasoning as u128
            + self.text_tokens() as u128
            + (self.chunks as u128) * (self.calls.len() as u128);
        let per_token = 1 + self.logprobs.map_or(0, |top| top as u128);
        per_choice * self.choices as u128 * per_token
    }

    /// About how many bytes a document of this answer has: a token's few bytes, each of its
    /// logprobs entries' (about 80), and every call's arguments as scripted, times `n`.
    /// Pieces alone do not bound it (audit W: 500 calls of 100 KB arguments made 400 MB
    /// of 4,000 pieces; 50,000 tokens with 19 top logprobs 62 MB in 1.8 GB).
    pub(crate) fn document_bytes(&self) -> u128 {
        let per_token = 12 + self.logprobs.map_or(0, |top| 80 * (1 + top as u128));
        let tokens = self.reasoning as u128 + self.text_tokens() as u128;
        let args = self.arguments.as_ref().map_or(0, |a| a.len() as u128);
        let calls = self.calls.len() as u128 * (args + 100 + 12 * self.chunks as u128);
        (tokens * per_token + calls) * self.choices as u128
    }

    /// The text tokens per choice: the whole answer without calls, the preamble with them.
    pub(crate) fn text_tokens(&self) -> usize {
        if self.calls.is_empty() {
            self.chunks
        } else {
            self.preamble
        }
    }

    /// All the tokens of `part` in `choice`, joined (for `Part::Answer`, the text).
    pub(crate) fn text(&self, part: Part, choice: usize) -> String {
        let count = match part {
            Part::Reasoning => self.reasoning,
            Part::Answer => self.text_tokens(),
        };
        (1..=count).map(|n| self.token(part, n, choice)).collect()
    }

    /// The arguments of every scripted call, whole.
    pub(crate) fn arguments(&self, choice: usize) -> String {
        match &self.arguments {
            Some(arguments) => arguments.clone(),
            None => {
                let text: String = (1..=self.chunks)
                    .map(|n| self.token(Part::Answer, n, choice))
                    .collect();
                json!({ "text": text }).to_string()
            }
        }
    }

    /// The piece of [`Answer::arguments`] content event `n` (from 1) streams: the pieces of
    /// all `chunks` events join into the whole.
    pub(crate) fn arguments_piece(&self, n: usize, choice: usize) -> String {
        if let Some(whole) = self.arguments.as_deref() {
            // Cut by characters, so a piece never splits one in two.
            let chars = whole.chars().count();
            // In u128: a stream may have up to MAX_STREAM_TOKENS pieces of a long argument.
            let at = |n: usize| (chars as u128 * n as u128 / self.chunks as u128) as usize;
            let (from, to) = (at(n - 1), at(n));
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

    /// The name of call `k` of the answer.
    pub(crate) fn call_name(&self, k: usize) -> &str {
        self.calls.get(k).map_or("", String::as_str)
    }

    /// The id of call `k` in `choice`, behind the API's prefix (`call_`, `toolu_`, `fc_`):
    /// the first call of the first choice keeps the bare tag, as before parallel calls.
    pub(crate) fn call_tag(&self, prefix: &str, choice: usize, k: usize) -> String {
        let mut id = format!("{prefix}_{}", self.tag);
        if choice > 0 {
            id.push_str(&format!("_{choice}"));
        }
        if k > 0 {
            id.push_str(&format!("-{k}"));
        }
        id
    }

    /// Tokens generated per choice: reasoning, text, and every call's argument pieces.
    pub(crate) fn completion_tokens(&self) -> usize {
        self.reasoning + self.text_tokens() + self.chunks * self.calls.len()
    }
}

/// Where an event sits in the stream, for the body's timing.
///
/// Content events are the tokens a client waits for: reasoning tokens, text tokens (the
/// answer, or the preamble before calls) and the pieces of each call's arguments. The
/// framing around them (a call's opening, a block's start, an item's added/done) is not.
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
