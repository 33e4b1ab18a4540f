//! What a whole answer cost, as far as the inspector saw it, and where each count came from.

use crate::provider::ErrorType;

/// The most tokens one answer's usage may report of a part (the input, cache writes, cache
/// reads, the completion): a count above it, up to a number past 64 bits, is read as this.
/// No answer comes near it (2^40, a thousand times the largest context windows), and the
/// sums of such counts (a prompt's parts, a counter's total over 2^24 answers, a run's
/// tokens) stay far from u64::MAX, where an `AtomicU64` counter wraps and goes down (audit
/// WD 1).
pub const MAX_REPORTED_TOKENS: u64 = 1 << 40;

/// Where the provider's token counts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Reported,
    Estimated,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reported => "reported",
            Self::Estimated => "estimated",
        }
    }
}

/// A part of the prompt as a provider reports it: Anthropic counts its input, cache writes and
/// cache reads apart (the prompt is their sum); OpenAI's `prompt_tokens` and `input_tokens`
/// are all input (the cached tokens are counted within them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptPart {
    Input = 0,
    CacheWrite = 1,
    CacheRead = 2,
}

/// What a whole answer cost, as far as the inspector saw it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    /// Prompt tokens the provider reported, by part (`PromptPart` as the index): each as the
    /// last usage that named it said, since a later usage (Anthropic's `message_delta`) may
    /// repeat some and leave the others out. Bit `i` of `prompt_seen`: part `i` was reported.
    /// Never estimated: a request body's size says little about its tokens (images, tool
    /// schemas). Kept as a mask beside an array, not three `Option`s: this lives in every
    /// stream's inspector.
    pub(super) prompt: [u64; 3],
    pub(super) prompt_seen: u8,
    /// Completion tokens the provider reported (reasoning/thinking included).
    pub completion: Option<u64>,
    /// Events that carried model output.
    pub output_events: u64,
    /// Bytes of streamed output text (content, reasoning, tool arguments), as escaped JSON.
    pub output_bytes: u64,
    /// The provider's mid-stream error, if it sent one.
    pub error: Option<ErrorType>,
}

impl Tokens {
    /// Prompt tokens the provider reported: the sum of the parts it reported (Anthropic's
    /// input, cache writes and cache reads), `None` when it reported none.
    pub fn prompt(&self) -> Option<u64> {
        (self.prompt_seen != 0).then(|| {
            self.prompt
                .iter()
                .fold(0u64, |sum, &n| sum.saturating_add(n))
        })
    }

    /// One part of the prompt, if the provider reported it.
    pub fn prompt_part(&self, part: PromptPart) -> Option<u64> {
        let i = part as usize;
        (self.prompt_seen & (1 << i) != 0).then_some(self.prompt[i])
    }

    /// A usage reported `n` tokens of `part`: what it said last stands.
    pub fn set_prompt_part(&mut self, part: PromptPart, n: u64) {
        let i = part as usize;
        self.prompt[i] = n;
        self.prompt_seen |= 1 << i;
    }

    /// An estimate of the completion tokens from the deltas seen: about four bytes of text per
    /// token, and at least one per output event (OpenAI streams about one token per chunk).
    pub fn estimated_completion(&self) -> u64 {
        self.output_events.max(self.output_bytes.div_ceil(4))
    }

    /// Completion tokens: the provider's count if it reported one, else the estimate.
    pub fn completion(&self) -> (u64, Source) {
        match self.completion {
            Some(n) => (n, Source::Reported),
            None => (self.estimated_completion(), Source::Estimated),
        }
    }
}
