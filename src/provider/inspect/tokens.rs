//! What a whole answer cost, as far as the inspector saw it, and where each count came from.

use crate::provider::ErrorType;

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

/// What a whole answer cost, as far as the inspector saw it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    /// Prompt tokens the provider reported (Anthropic's include cache reads and writes). Never
    /// estimated: a request body's size says little about its tokens (images, tool schemas).
    pub prompt: Option<u64>,
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
