//! What OpenAI-compatible servers send that OpenAI does not: empty strings where OpenAI has
//! `null` or nothing.

use super::*;

/// A chunk of choice 0 as sglang, older Ollama and koboldcpp send it: `"finish_reason":""`.
fn chunk(delta: &str, finish: &str) -> String {
    format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
    )
}

const USAGE: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n";

/// Audit ZB 1: an empty finish reason (or koboldcpp's `"null"`) is none, as the SDKs read it:
/// the answer has not ended, so a cut is a cut and a partial answer is flagged as one; the
/// chunk with a reason ends it.
#[test]
fn an_empty_finish_reason_does_not_end_the_answer() {
    for none in [r#""""#, r#""null""#] {
        let start = [
            chunk(r#"{"role":"assistant","content":"The answer is"}"#, none),
            chunk(r#"{"content":" forty"}"#, none),
        ]
        .concat();
        let a = assemble(Format::Chat, &start, None, 1 << 20);
        assert!(!a.ended() && !a.whole(), "{none}");
        let cut = Usage {
            prompt: 3,
            completion: 2,
        };
        let d = doc(Format::Chat, &start, Some((start.len(), cut)));
        assert_eq!(d["choices"][0]["finish_reason"], "length", "{none}");
        assert_eq!(d["choices"][0]["message"]["content"], "The answer is forty");

        let whole = format!("{start}{}{USAGE}", chunk("{}", r#""stop""#));
        let a = assemble(Format::Chat, &whole, None, 1 << 20);
        assert!(a.ended() && a.whole(), "{none}");
        let d = doc(Format::Chat, &whole, None);
        assert_eq!(d["choices"][0]["finish_reason"], "stop", "{none}");
        assert_eq!(d["usage"]["completion_tokens"], 2);
    }
}
