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

/// Audit ZB 2: DashScope repeats `"id":""` (and the type) on every later piece of a call,
/// MiniMax sends `"role":""` after the first delta: an empty string never replaces what came,
/// as in the OpenAI SDK's accumulator (which joins the strings), so each call keeps the id
/// its results must name.
#[test]
fn empty_strings_in_later_deltas_replace_nothing() {
    let stream = [
        chunk(r#"{"role":"assistant","content":null,"tool_calls":[{"id":"call_a1ad8367","type":"function","index":0,"function":{"name":"get_weather","arguments":""}}]}"#, "null"),
        chunk(r#"{"role":"","tool_calls":[{"id":"","type":"function","index":0,"function":{"arguments":"{\"city\": "}}]}"#, "null"),
        chunk(r#"{"tool_calls":[{"id":"","type":"","index":0,"function":{"arguments":"\"Paris\"}"}}]}"#, "null"),
        chunk(r#"{"tool_calls":[{"id":"call_b2be9478","type":"function","index":1,"function":{"name":"get_time","arguments":""}}]}"#, "null"),
        chunk(r#"{"role":"","tool_calls":[{"id":"","type":"function","index":1,"function":{"arguments":"{\"tz\": \"CET\"}"}}]}"#, "null"),
        chunk("{}", r#""tool_calls""#),
        USAGE.to_owned(),
    ]
    .concat();
    let d = doc(Format::Chat, &stream, None);
    let message = &d["choices"][0]["message"];
    assert_eq!(message["role"], "assistant", "{d}");
    let calls: Vec<(&str, &str, &str, &str)> = message["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap(),
                c["type"].as_str().unwrap(),
                c["function"]["name"].as_str().unwrap(),
                c["function"]["arguments"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            (
                "call_a1ad8367",
                "function",
                "get_weather",
                r#"{"city": "Paris"}"#
            ),
            ("call_b2be9478", "function", "get_time", r#"{"tz": "CET"}"#),
        ]
    );
    // An audio id, the same.
    let audio = [
        chunk(
            r#"{"role":"assistant","audio":{"id":"audio_1","transcript":"Hi"}}"#,
            "null",
        ),
        chunk(
            r#"{"audio":{"id":"","transcript":" there","expires_at":9}}"#,
            "null",
        ),
        chunk("{}", r#""stop""#),
        USAGE.to_owned(),
    ]
    .concat();
    let d = doc(Format::Chat, &audio, None);
    assert_eq!(d["choices"][0]["message"]["audio"]["id"], "audio_1", "{d}");
    assert_eq!(
        d["choices"][0]["message"]["audio"]["transcript"],
        "Hi there"
    );
}

/// Audit ZB 6: Moonshot (Kimi) sends the answer's usage in its last chunk's choice: it is the
/// document's top-level usage, as in Moonshot's unstreamed answer, not a field of the choice;
/// a top-level usage wins.
#[test]
fn moonshots_usage_in_the_choice_is_the_documents() {
    let kimi = r#"data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop","usage":{"prompt_tokens":812,"completion_tokens":5,"total_tokens":817,"cached_tokens":800}}]}"#;
    let stream = format!(
        "{}{kimi}\n\ndata: [DONE]\n\n",
        chunk(r#"{"role":"assistant","content":"Hi there"}"#, "null")
    );
    let d = doc(Format::Chat, &stream, None);
    assert_eq!(d["usage"]["prompt_tokens"], 812, "{d}");
    assert_eq!(d["usage"]["total_tokens"], 817, "{d}");
    assert_eq!(d["usage"]["cached_tokens"], 800, "{d}");
    assert!(d["choices"][0].get("usage").is_none(), "{d}");
    let stream = stream.replace("data: [DONE]", &format!("{USAGE}data: [DONE]"));
    let d = doc(Format::Chat, &stream, None);
    assert_eq!(d["usage"]["total_tokens"], 5, "{d}");
}
