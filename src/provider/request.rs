//! What the gateway reads from a request body in a provider's format: the `model` that picks
//! a route, and the most output tokens the call may take (what a run reserves for it).
//! Each read is one pass of serde over the body that borrows and skips everything else.

use std::borrow::Cow;

/// The body's top-level `model`, when it is a JSON object that names one.
pub fn model_of(body: &[u8]) -> Option<Cow<'_, str>> {
    #[derive(serde::Deserialize)]
    struct ModelOnly<'a> {
        #[serde(borrow)]
        model: Option<Cow<'a, str>>,
    }
    serde_json::from_slice::<ModelOnly<'_>>(body)
        .ok()
        .and_then(|m| m.model)
}

/// The most output tokens the request asks for: `max_completion_tokens` or `max_tokens`
/// (OpenAI Chat Completions, times its `n` choices, each of which may take the limit),
/// `max_tokens` (Anthropic Messages), `max_output_tokens` (OpenAI Responses). `None` when it
/// names none (or the body is not JSON).
pub fn max_output_tokens(body: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Limits {
        max_tokens: Option<u64>,
        max_completion_tokens: Option<u64>,
        max_output_tokens: Option<u64>,
        n: Option<u64>,
    }
    let l = serde_json::from_slice::<Limits>(body).ok()?;
    let each = l
        .max_completion_tokens
        .or(l.max_output_tokens)
        .or(l.max_tokens)?;
    Some(each.saturating_mul(l.n.unwrap_or(1).max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_limit_of_each_api() {
        let read = |b: &str| max_output_tokens(b.as_bytes());
        assert_eq!(read(r#"{"model":"m","max_tokens":300}"#), Some(300));
        assert_eq!(
            read(r#"{"max_tokens":300,"max_completion_tokens":50}"#),
            Some(50)
        );
        assert_eq!(read(r#"{"input":"hi","max_output_tokens":70}"#), Some(70));
        // Chat's n choices may each take the limit.
        assert_eq!(read(r#"{"n":2,"max_tokens":140}"#), Some(280));
        assert_eq!(read(r#"{"n":1,"max_completion_tokens":140}"#), Some(140));
        assert_eq!(read(r#"{"model":"m","messages":[{"max_tokens":9}]}"#), None);
        assert_eq!(read(r#"{"max_tokens":null}"#), None);
        assert_eq!(
            read(r#"{"max_tokens":-1}"#),
            None,
            "not a count: no reservation of its own"
        );
        assert_eq!(read("not json"), None);
        assert_eq!(
            model_of(br#"{"model":"gpt-x","max_tokens":3}"#).as_deref(),
            Some("gpt-x")
        );
    }
}
