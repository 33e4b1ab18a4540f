//! What two readings of one stream must agree on: any bytes cut anywhere read alike (and
//! never panic), and an event read by the shape of the one before (`shape`) finds what the
//! tokenizer finds in it, whatever changed between them.

use super::*;
use crate::http::sse::tests::cases;
use proptest::prelude::*;

proptest! {
    #![proptest_config(cases(256))]

    /// Whatever the bytes and however they are cut, the inspector neither panics nor
    /// depends on where the cuts fall.
    #[test]
    fn any_bytes_any_cuts(
        pieces in prop::collection::vec(
            prop_oneof![
                3 => prop::sample::select(vec![
                    "data: ", "data:", "\n", "\r", "\r\n", "\n\n", "{", "}", "[", "]", "\"", "\\",
                    ":", ",", "\"choices\"", "\"delta\"", "\"content\"", "\"usage\"", "\"error\"",
                    "\"type\"", "\"error\"", "\"prompt_tokens\"", "12", "\"x\"", " ", "event: error\n",
                ]).prop_map(|s| s.as_bytes().to_vec()),
                1 => prop::collection::vec(any::<u8>(), 0..8),
            ],
            0..80,
        ),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
        sse in any::<bool>(),
        format in prop::sample::select(vec![Format::Chat, Format::Messages, Format::Responses]),
    ) {
        let s: Vec<u8> = pieces.concat();
        let cuts: Vec<usize> = cuts.iter().map(|i| i.index(s.len() + 1)).collect();
        let whole = run(format, &s, sse, &[]);
        let split = run(format, &s, sse, &cuts);
        prop_assert_eq!(whole.tokens, split.tokens);
        prop_assert_eq!(whole.error_end, split.error_end);
    }

    /// An event read by the shape of the one before finds what the tokenizer finds in it,
    /// piece by piece, however the stream is cut and whatever changed between its events.
    #[test]
    fn shapes_read_what_the_tokenizer_reads(
        events in prop::collection::vec(
            (
                0u8..9,
                prop::collection::vec(
                    prop::sample::select(vec![
                        "a", "tok ", "", "\\\"", "\\\\", "\\n", "\\u00e9", "é", "{", "}", "[", "]",
                        ",", ":", "\\", "\"",
                    ]),
                    0..6,
                ),
                0u32..64,
                any::<bool>(),
            ),
            1..24,
        ),
        repeat in 1usize..4,
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        format in prop::sample::select(vec![Format::Chat, Format::Messages, Format::Responses]),
        tools in any::<bool>(),
    ) {
        let stream: String = events
            .iter()
            .flat_map(|(variant, text, n, alt)| {
                let text = text.concat();
                // Runs of the same event, as a stream's are.
                std::iter::repeat_n(repeating_event(format, *variant, &text, *n, *alt), repeat)
            })
            .collect();
        let s = stream.as_bytes();
        let cuts: Vec<usize> = cuts.iter().map(|i| i.index(s.len() + 1)).collect();
        let make = || {
            let ins = Inspector::new(format, true);
            if tools { ins.with_tool_calls() } else { ins }
        };
        for cuts in [&[][..], &cuts[..]] {
            let (found, tokens, short) = pieces(make(), s, cuts);
            let (want, want_tokens, want_short) = pieces(make().without_shapes(), s, cuts);
            prop_assert_eq!(found, want);
            prop_assert_eq!(tokens, want_tokens);
            prop_assert_eq!(short, want_short);
        }
    }
}

/// Each of these events read after each other: a value turned from a string to a scalar or
/// back, an output string emptied or nulled, a key renamed, a bracket moved: whatever the
/// shape of the first, the second finds what the tokenizer finds.
#[test]
fn any_event_after_any_other_reads_the_same_by_shape() {
    let events = [
        r#"{"id":"a","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}"#,
        r#"{"id":"a","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}"#,
        r#"{"id":"a","choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}"#,
        r#"{"id":"a","choices":[{"index":0,"delta":{"content":null},"finish_reason":null}]}"#,
        r#"{"id":"a","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"a"}]}"#,
        r#"{"id":"a","choices":[{"index":0,"delta":{"content":"a"b\"},"finish_reason":1}]}"#,
        r#"{"id":"a","choices":[{"index":0,"delta":{"contenu":"a"},"finish_reason":null}]}"#,
        r#"{"id":"a","choices":[{"index":0,"delta":{"role":"a"},"finish_reason":null}]}"#,
        r#"{"id":"a","choices":[{"index":0,"delta":{"role":"a","content":"a"}}]}"#,
        r#"{"id":"a","choices":[{"index":0,"delta":{"audio":{"id":"a"}},"finish_reason":null}]}"#,
        r#"{"id":"a","choices":[{"index":0,"delta":{"audio":{}},"finish_reason":null}]}"#,
        r#"{"id":{"a":1},"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}"#,
        r#"{"id":"a","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
        r#"{"id":"a","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#,
        r#"{"id":"a","choices":[],"usage":null}"#,
        r#"{"id":"a","error":{"type":"server_error"}}"#,
        r#"{"id":"a","error":null}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":""}}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","text":""}}"#,
        r#"{"type":"response.output_text.delta","sequence_number":1,"delta":"a"}"#,
        r#"{"type":"response.output_text.delta","sequence_number":"a","delta":"a"}"#,
        r#"{"type":"response.output_text.delta","sequence_number":2,"delta":null}"#,
        r#"{"type":"response.created","sequence_number":2,"delta":"a"}"#,
        r#"["a",1,null]"#,
        r#"["a","b",null]"#,
        r#"1"#,
        r#"null"#,
        r#""a""#,
        r#"[DONE]"#,
    ];
    for format in [Format::Chat, Format::Messages, Format::Responses] {
        for a in events {
            for b in events {
                let stream = format!("data: {a}\n\ndata: {b}\n\ndata: {b}\n\n");
                let s = stream.as_bytes();
                let got = pieces(Inspector::new(format, true), s, &[]);
                let want = pieces(Inspector::new(format, true).without_shapes(), s, &[]);
                assert_eq!(got, want, "{format:?}: {a} then {b}");
            }
        }
    }
}

/// The events of the fixtures, each repeated: every second one is read by its shape, and
/// what is found is what the tokenizer finds.
#[test]
fn repeated_fixture_events_read_the_same_by_shape() {
    for (format, stream) in FIXTURES {
        let doubled: String = events(stream)
            .into_iter()
            .flat_map(|(_, ev)| [ev, ev])
            .collect();
        let (found, tokens, short) = pieces(Inspector::new(format, true), doubled.as_bytes(), &[]);
        let (want, want_tokens, want_short) = pieces(
            Inspector::new(format, true).without_shapes(),
            doubled.as_bytes(),
            &[],
        );
        assert_eq!(found, want, "{format:?}");
        assert_eq!(tokens, want_tokens, "{format:?}");
        assert_eq!(short, want_short, "{format:?}");
    }
}

/// One event of a stream that mostly repeats itself, as providers' streams do, with what
/// changes between events drawn: the text (escapes, quotes, nothing), numbers, `null` for a
/// string, another key, usage, errors, comments, a second data line.
fn repeating_event(format: Format, variant: u8, text: &str, n: u32, alt: bool) -> String {
    let data = match (format, variant % 8) {
        (Format::Chat, 0..=3) => format!(
            r#"{{"id":"chatcmpl-{}","object":"chat.completion.chunk","created":17000,"model":"m","choices":[{{"index":0,"delta":{{"content":"{text}"}},"logprobs":null,"finish_reason":null}}],"obfuscation":"{}"}}"#,
            if alt { "b" } else { "a" },
            &"xyzw"[..(n % 4) as usize]
        ),
        (Format::Chat, 4) => format!(
            r#"{{"id":"chatcmpl-a","choices":[{{"index":{n},"delta":{{"role":"assistant","content":{}}},"finish_reason":{}}}]}}"#,
            if alt {
                "null".to_string()
            } else {
                format!(r#""{text}""#)
            },
            if n % 2 == 1 { r#""stop""# } else { "null" }
        ),
        (Format::Chat, 5) => format!(
            r#"{{"id":"chatcmpl-a","choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":"{text}"}}}}]}}}}]}}"#
        ),
        (Format::Chat, 6) => format!(
            r#"{{"id":"chatcmpl-a","choices":[],"usage":{{"prompt_tokens":{n},"completion_tokens":{}}}}}"#,
            n / 2
        ),
        (Format::Messages, 0..=4) => format!(
            r#"{{"type":"content_block_delta","index":{},"delta":{{"type":"{}","{}":"{text}"}}}}"#,
            n % 3,
            if alt { "thinking_delta" } else { "text_delta" },
            if alt { "thinking" } else { "text" }
        ),
        (Format::Messages, 5) => r#"{"type": "ping"}"#.to_string(),
        (Format::Messages, 6) => format!(
            r#"{{"type":"message_delta","delta":{{"stop_reason":"end_turn"}},"usage":{{"output_tokens":{n}}}}}"#
        ),
        (Format::Responses, 0..=4) => format!(
            r#"{{"type":"response.output_text.delta","sequence_number":{n},"item_id":"msg_{}","output_index":0,"content_index":0,"delta":"{text}","logprobs":[]}}"#,
            u8::from(alt)
        ),
        (Format::Responses, 5) => format!(
            r#"{{"type":"response.completed","response":{{"usage":{{"input_tokens":{n},"output_tokens":3}}}}}}"#
        ),
        (Format::Responses, 6) => format!(
            r#"{{"type":"response.{}","sequence_number":{n}}}"#,
            if alt {
                "in_progress"
            } else {
                "output_text.done"
            }
        ),
        (_, _) if alt => r#"{"error":{"type":"overloaded_error","message":"busy"}}"#.to_string(),
        (_, _) => format!(r#"{{"id":"x","choices":[{{"delta":{{"content":"{text}"}}}}]}}{text}"#),
    };
    match n % 16 {
        0 => format!(": keep-alive\ndata: {data}\n\n"),
        1 => format!("data: {data}\ndata: {data}\n\n"),
        2 => format!("event: error\ndata: {data}\n\n"),
        3 => "data: [DONE]\n\n".to_string(),
        _ => format!("data: {data}\n\n"),
    }
}
