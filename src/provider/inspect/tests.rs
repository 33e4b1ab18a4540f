use super::*;
use serde_json::Value;

mod properties;

/// How a provider's error event is typed: its named type, its numeric code, a failed response.
mod errors;

/// The usage a stream reports, and the usage chunk left out of the client's stream.
mod usage;

/// llama.cpp's error event, a block of an `error` field and no data (audit WB 2).
mod error_field;

const CHAT: &str = include_str!("../../../tests/fixtures/openai_chat.sse");
const CHAT_ERROR: &str = include_str!("../../../tests/fixtures/openai_chat_error.sse");
const MESSAGES: &str = include_str!("../../../tests/fixtures/anthropic_messages.sse");
const MESSAGES_ERROR: &str = include_str!("../../../tests/fixtures/anthropic_messages_error.sse");
const RESPONSES: &str = include_str!("../../../tests/fixtures/openai_responses.sse");
const RESPONSES_ERROR: &str = include_str!("../../../tests/fixtures/openai_responses_error.sse");
const FIXTURES: [(Format, &str); 6] = [
    (Format::Chat, CHAT),
    (Format::Chat, CHAT_ERROR),
    (Format::Messages, MESSAGES),
    (Format::Messages, MESSAGES_ERROR),
    (Format::Responses, RESPONSES),
    (Format::Responses, RESPONSES_ERROR),
];

/// What feeding a whole stream found, in absolute offsets.
#[derive(Debug, PartialEq)]
struct Run {
    tokens: Tokens,
    /// The pieces (by end offset) in which an output event completed.
    output_in: Vec<usize>,
    error_end: Option<usize>,
}

/// Feeds `stream` cut at `cuts` (offsets, any order, duplicates allowed).
fn run(format: Format, stream: &[u8], sse: bool, cuts: &[usize]) -> Run {
    let mut edges: Vec<usize> = cuts.iter().copied().chain([0, stream.len()]).collect();
    edges.sort_unstable();
    edges.dedup();
    let mut ins = Inspector::new(format, sse);
    let mut out = Run {
        tokens: Tokens::default(),
        output_in: Vec::new(),
        error_end: None,
    };
    for w in edges.windows(2) {
        let found = ins.feed(&stream[w[0]..w[1]]);
        if found.output {
            out.output_in.push(w[1]);
        }
        if let Some(e) = found.error_end {
            assert!(out.error_end.is_none(), "one error end");
            out.error_end = Some(w[0] + e);
        }
    }
    if ins.error_pending() {
        // The body ended just after the CR that ended the error event.
        assert!(out.error_end.is_none(), "one error end");
        out.error_end = Some(stream.len());
    }
    out.tokens = ins.tokens();
    out
}

/// The events of an LF-only fixture with the offset just past each.
fn events(stream: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut at = 0;
    for ev in stream.split_inclusive("\n\n") {
        at += ev.len();
        out.push((at, ev));
    }
    out
}

/// A plain serde reading of the same rules, event by event, for cross-checking.
fn reference(format: Format, stream: &str) -> Run {
    let mut t = Tokens::default();
    let mut output_in = Vec::new();
    let mut error_end = None;
    for (end, ev) in events(stream) {
        let data: Vec<&str> = ev
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        if data.is_empty() {
            continue;
        }
        let data = data.join("\n");
        let Ok(v) = serde_json::from_str::<Value>(&data) else {
            if data != "[DONE]" {
                output_in.push(end);
            }
            continue;
        };
        let name = |x: &Value| x.as_str().and_then(|s| ErrorType::parse(s.as_bytes()));
        let e = &v["error"];
        if e.is_object() || v["type"] == "error" {
            let ty = name(&e["type"]).or(name(&e["code"])).or(name(&v["code"]));
            t.error = Some(ty.unwrap_or(ErrorType::Other));
            error_end = Some(end);
            break;
        }
        let ty = v["type"].as_str().unwrap_or_default();
        let (recognised, output, bytes) = match format {
            Format::Chat if v["choices"].is_array() => {
                let (mut out, mut bytes) = (false, 0);
                for c in v["choices"].as_array().into_iter().flatten() {
                    let d = &c["delta"];
                    for (k, x) in d.as_object().into_iter().flatten() {
                        if k != "role" {
                            out |= non_empty(x);
                            bytes += x.as_str().map_or(0, escaped_len);
                        }
                    }
                    let calls = d["tool_calls"].as_array().into_iter().flatten();
                    for f in calls.map(|x| &x["function"]).chain([&d["function_call"]]) {
                        for k in ["name", "arguments"] {
                            bytes += f[k].as_str().map_or(0, escaped_len);
                        }
                    }
                    out |= non_empty(&c["text"]);
                    bytes += c["text"].as_str().map_or(0, escaped_len);
                }
                (true, out, bytes)
            }
            Format::Messages if ty == "content_block_delta" => {
                let (mut out, mut bytes) = (false, 0);
                for (k, x) in v["delta"].as_object().into_iter().flatten() {
                    if k != "type" && k != "signature" {
                        out |= non_empty(x);
                        bytes += x.as_str().map_or(0, escaped_len);
                    }
                }
                (true, out, bytes)
            }
            Format::Messages if ty == "content_block_start" => {
                let b = &v["content_block"];
                let mut bytes = 0;
                for k in ["text", "thinking"] {
                    bytes += b[k].as_str().map_or(0, escaped_len);
                }
                let other = !matches!(b["type"].as_str(), Some("text" | "thinking"));
                (true, other || bytes > 0, bytes)
            }
            Format::Messages => {
                let framing = [
                    "message_start",
                    "message_delta",
                    "message_stop",
                    "content_block_stop",
                    "ping",
                ];
                (framing.contains(&ty), false, 0)
            }
            Format::Responses if ty == "response.image_generation_call.partial_image" => {
                (true, true, 0)
            }
            // A whole item is output when nothing was before it (see `Kind::Item`).
            Format::Responses if ty == "response.output_item.done" => {
                let item = &v["item"];
                let mut bytes = item["arguments"].as_str().map_or(0, escaped_len);
                for part in item["content"].as_array().into_iter().flatten() {
                    for k in ["text", "refusal"] {
                        bytes += part[k].as_str().map_or(0, escaped_len);
                    }
                }
                (true, t.output_events == 0 && bytes > 0, bytes)
            }
            Format::Responses if ty.starts_with("response.") => {
                let d = v["delta"].as_str().unwrap_or_default();
                (
                    true,
                    ty.ends_with(".delta") && !d.is_empty(),
                    escaped_len(d),
                )
            }
            _ => (false, false, 0),
        };
        if !recognised {
            output_in.push(end);
        } else if output {
            t.output_events += 1;
            t.output_bytes += bytes as u64;
            output_in.push(end);
        }
        // Each part of the prompt as the last usage that named it said.
        let prompt = |t: &mut Tokens, u: &Value| {
            let parts = [
                ("prompt_tokens", PromptPart::Input),
                ("input_tokens", PromptPart::Input),
                ("cache_creation_input_tokens", PromptPart::CacheWrite),
                ("cache_read_input_tokens", PromptPart::CacheRead),
            ];
            for (key, part) in parts {
                if let Some(n) = u[key].as_u64() {
                    t.set_prompt_part(part, n);
                }
            }
        };
        let completion = |u: &Value| {
            u["completion_tokens"]
                .as_u64()
                .or(u["output_tokens"].as_u64())
        };
        for u in [&v["usage"], &v["response"]["usage"]] {
            if u.is_object() {
                prompt(&mut t, u);
                t.completion = completion(u).or(t.completion);
            }
        }
        if v["message"]["usage"].is_object() {
            prompt(&mut t, &v["message"]["usage"]);
        }
        if v["response"]["error"].is_object() {
            let ty = name(&v["response"]["error"]["code"]);
            t.error.get_or_insert(ty.unwrap_or(ErrorType::Other));
        }
    }
    Run {
        tokens: t,
        output_in,
        error_end,
    }
}

fn non_empty(v: &Value) -> bool {
    match v {
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => false,
    }
}

fn escaped_len(s: &str) -> usize {
    serde_json::to_string(s).unwrap().len() - 2
}

#[test]
fn chat_completions_reasoning_tools_and_usage() {
    let got = run(Format::Chat, CHAT.as_bytes(), true, &[]);
    // 6 reasoning deltas, 5 content deltas, the tool call's name and 5 argument pieces; the
    // role preamble (`"content":""`), the finish chunk and the usage chunk are not output.
    assert_eq!(got.tokens.output_events, 17);
    assert_eq!(got.tokens.prompt(), Some(184));
    assert_eq!(got.tokens.completion, Some(62));
    assert_eq!(got.tokens.error, None);
    assert_eq!(got.error_end, None);
    assert_eq!(got.tokens.completion(), (62, Source::Reported));
}

#[test]
fn anthropic_thinking_text_tool_use_and_usage() {
    let cuts: Vec<usize> = (0..MESSAGES.len()).collect();
    let got = run(Format::Messages, MESSAGES.as_bytes(), true, &cuts);
    // 4 thinking deltas, 3 text deltas, the tool_use block start and 3 non-empty
    // partial_json pieces; message_start, pings, the signature and empty deltas are not.
    assert_eq!(got.tokens.output_events, 11);
    // input + cache writes + cache reads; message_start's output_tokens is a placeholder.
    assert_eq!(got.tokens.prompt(), Some(472 + 2048));
    assert_eq!(got.tokens.completion, Some(89));
    let evs = events(MESSAGES);
    assert_eq!(got.output_in[0], evs[3].0, "the first thinking delta");
}

#[test]
fn responses_api_summary_function_call_text_and_usage() {
    let cuts: Vec<usize> = (0..RESPONSES.len()).collect();
    let got = run(Format::Responses, RESPONSES.as_bytes(), true, &cuts);
    assert_eq!(got.tokens.output_events, 4 + 2 + 5);
    assert_eq!(got.tokens.prompt(), Some(75));
    assert_eq!(got.tokens.completion, Some(214));
    let evs = events(RESPONSES);
    assert_eq!(
        got.output_in[0], evs[4].0,
        "response.created etc. are not output"
    );
}

#[test]
fn mid_stream_errors_end_the_reading_at_their_event() {
    for (format, stream, ty, outputs) in [
        (Format::Chat, CHAT_ERROR, ErrorType::Server, 5),
        (Format::Messages, MESSAGES_ERROR, ErrorType::Overloaded, 2),
        (Format::Responses, RESPONSES_ERROR, ErrorType::Server, 3),
    ] {
        let got = run(format, stream.as_bytes(), true, &[]);
        let end = stream
            .find("event: error")
            .or(stream.find("data: {\"error\""))
            .unwrap();
        let end = end + stream[end..].find("\n\n").unwrap() + 2;
        assert_eq!(got.error_end, Some(end), "{stream}");
        assert_eq!(got.tokens.error, Some(ty));
        assert_eq!(got.tokens.output_events, outputs);
        assert_eq!(got.tokens.completion, None);
        let (n, source) = got.tokens.completion();
        assert_eq!(source, Source::Estimated);
        assert!(n >= outputs, "{n}");
    }
    // Anthropic reported its prompt before the error.
    assert_eq!(
        run(Format::Messages, MESSAGES_ERROR.as_bytes(), true, &[])
            .tokens
            .prompt(),
        Some(2520)
    );
}

/// Anthropic's `message_delta` may repeat the usage (cumulative) and leave the cache counts
/// out of it: each count stands as the last usage that named it said, as Anthropic's SDK
/// accumulates them, so message_start's cache writes and reads are not lost.
#[test]
fn a_later_usage_replaces_only_the_counts_it_names() {
    let stream = |delta_usage: &str| {
        format!(
            concat!(
                "event: message_start\n",
                "data: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":25,\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":1000,\"output_tokens\":1}}}}}}\n\n",
                "event: content_block_start\n",
                "data: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n",
                "event: content_block_delta\n",
                "data: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"Hello\"}}}}\n\n",
                "event: message_delta\n",
                "data: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\",\"stop_sequence\":null}},\"usage\":{}}}\n\n",
                "event: message_stop\n",
                "data: {{\"type\":\"message_stop\"}}\n\n",
            ),
            delta_usage
        )
    };
    for (usage, prompt) in [
        (r#"{"output_tokens":12}"#, 1125),
        (r#"{"input_tokens":25,"output_tokens":12}"#, 1125),
        (
            r#"{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":12}"#,
            1125,
        ),
        (
            r#"{"input_tokens":30,"cache_read_input_tokens":0,"output_tokens":12}"#,
            130,
        ),
    ] {
        let stream = stream(usage);
        let cuts: Vec<usize> = (0..stream.len()).step_by(7).collect();
        for cuts in [&[][..], &cuts[..]] {
            let got = run(Format::Messages, stream.as_bytes(), true, cuts);
            assert_eq!(got.tokens.prompt(), Some(prompt), "{usage}");
            assert_eq!(got.tokens.completion, Some(12), "{usage}");
        }
    }
}

#[test]
fn an_error_ending_a_piece_in_a_cr_ends_where_the_next_byte_says() {
    // A data-only Chat error, so only the inspector knows it is one.
    let head: &[u8] = b"data: {\"error\":{\"type\":\"server_error\"}}\r\n\r";
    let mut ins = Inspector::new(Format::Chat, true);
    assert_eq!(ins.feed(head), Found::default());
    assert!(ins.error_pending());
    assert_eq!(ins.tokens().error, Some(ErrorType::Server));
    let found = ins.feed(b"\ndata: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n");
    assert_eq!(found.error_end, Some(1));
    assert!(!found.output && !ins.error_pending());
    assert_eq!(ins.feed(b"\n"), Found::default());
    // A lone CR ended it: the next piece is none of it.
    let mut ins = Inspector::new(Format::Chat, true);
    ins.feed(b"data: {\"error\":{}}\r\r");
    assert_eq!(ins.feed(b"\r").error_end, Some(0));
    // Whole, it ends past the LF.
    let whole = run(Format::Chat, &[head, b"\n"].concat(), true, &[]);
    assert_eq!(whole.error_end, Some(head.len() + 1));
    assert_eq!(
        run(Format::Chat, &[head, b"\n"].concat(), true, &[head.len()]),
        whole
    );
}

#[test]
fn a_garbage_value_is_skipped_the_same_however_it_is_cut() {
    // Found by `any_bytes_any_cuts`: a scalar cut by a piece boundary used to end there, so
    // the rest of it was read as structure (here an `error` object that whole is skipped).
    for stream in [
        "data: {\"error\":x:\"y\"{\"type\":\"server_error\"}}\n\n",
        "data: {\"error\":nul:\"y\"{\"type\":\"server_error\"}}\n\n",
        "data: {\"error\":12:\"y\"{\"type\":\"server_error\"}}\n\n",
    ] {
        let whole = run(Format::Chat, stream.as_bytes(), true, &[]);
        assert_eq!(whole.tokens.error, None, "{stream}");
        let cuts: Vec<usize> = (0..=stream.len()).collect();
        for k in 0..=stream.len() {
            assert_eq!(
                run(Format::Chat, stream.as_bytes(), true, &[k]),
                whole,
                "{stream} at {k}"
            );
        }
        assert_eq!(
            run(Format::Chat, stream.as_bytes(), true, &cuts),
            whole,
            "{stream}"
        );
    }
}

#[test]
fn fixtures_match_the_reference_reader() {
    for (format, f) in FIXTURES {
        let cuts: Vec<usize> = (0..=f.len()).collect();
        assert_eq!(
            run(format, f.as_bytes(), true, &cuts),
            reference(format, f),
            "{f}"
        );
    }
}

#[test]
fn every_split_point_reads_the_same() {
    for (format, f) in FIXTURES {
        let s = f.as_bytes();
        let whole = run(format, s, true, &[]);
        let per_byte = run(format, s, true, &(0..=s.len()).collect::<Vec<_>>());
        for cut in 1..s.len() {
            let got = run(format, s, true, &[cut]);
            assert_eq!(got.tokens, whole.tokens, "cut at {cut}");
            assert_eq!(got.error_end, whole.error_end, "cut at {cut}");
            // The piece holding an output event's last byte reports it.
            let expect: Vec<usize> = [cut, s.len()]
                .into_iter()
                .filter(|&end| {
                    let start = if end == cut { 0 } else { cut };
                    per_byte.output_in.iter().any(|&e| e > start && e <= end)
                })
                .collect();
            assert_eq!(got.output_in, expect, "cut at {cut}");
        }
        assert_eq!(per_byte.tokens, whole.tokens);
        assert_eq!(per_byte.error_end, whole.error_end);
    }
}

#[test]
fn cr_and_crlf_line_ends_and_a_bom() {
    for (format, f) in FIXTURES {
        let whole = run(format, f.as_bytes(), true, &[]);
        let per_byte = run(
            format,
            f.as_bytes(),
            true,
            &(0..=f.len()).collect::<Vec<_>>(),
        );
        for eol in ["\r\n", "\r"] {
            let s = f.replace('\n', eol);
            let scale = |v: usize| v + f[..v].matches('\n').count() * (eol.len() - 1);
            for (cuts, lf) in [
                (vec![], &whole),
                ((0..=s.len()).collect::<Vec<_>>(), &per_byte),
            ] {
                let got = run(format, s.as_bytes(), true, &cuts);
                assert_eq!(got.tokens, whole.tokens, "{eol:?}");
                // The error event ends past its whole line end, however the CRLF is cut.
                assert_eq!(got.error_end, whole.error_end.map(scale), "{eol:?}");
                // Other events complete at a CRLF blank line's CR when the cut falls there.
                let crlf = eol == "\r\n";
                let past_lf = |v: usize| v + usize::from(crlf && s.as_bytes()[v - 1] == b'\r');
                let ends: Vec<usize> = lf.output_in.iter().map(|&v| scale(v)).collect();
                let got_ends: Vec<usize> = got.output_in.iter().map(|&v| past_lf(v)).collect();
                assert_eq!(got_ends, ends, "{eol:?}");
            }
        }
        let with_bom = format!("\u{feff}{f}");
        for cuts in [vec![], vec![1], vec![2], vec![1, 2, 3]] {
            assert_eq!(
                run(format, with_bom.as_bytes(), true, &cuts).tokens,
                whole.tokens,
                "{cuts:?}"
            );
        }
    }
    // A broken BOM spoils the first line only.
    let s = "\u{feff}data: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n";
    let broken = [&s.as_bytes()[..2], &s.as_bytes()[3..], &s.as_bytes()[3..]].concat();
    let got = run(Format::Responses, &broken, true, &[1]);
    assert_eq!(got.tokens.output_events, 1);
}

#[test]
fn non_streaming_bodies_report_their_usage() {
    for (format, body, prompt, completion) in [
        (
            Format::Chat,
            include_str!("../../../tests/fixtures/openai_chat.json"),
            19,
            10,
        ),
        (
            Format::Messages,
            include_str!("../../../tests/fixtures/anthropic_message.json"),
            121,
            14,
        ),
        (
            Format::Responses,
            include_str!("../../../tests/fixtures/openai_responses.json"),
            75,
            214,
        ),
    ] {
        for cuts in [vec![], (0..=body.len()).collect::<Vec<_>>()] {
            let got = run(format, body.as_bytes(), false, &cuts);
            assert_eq!(got.tokens.prompt(), Some(prompt), "{body}");
            assert_eq!(got.tokens.completion, Some(completion), "{body}");
            assert!(got.output_in.is_empty() && got.error_end.is_none());
        }
    }
}

#[test]
fn shapes_that_are_not_output() {
    use Format::*;
    let cases = [
        (
            Chat,
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
        ),
        (
            Chat,
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":""}}]}"#,
        ),
        (
            Chat,
            r#"{"choices":[{"index":0,"delta":{"content":null,"refusal":null,"tool_calls":null}}]}"#,
        ),
        (
            Chat,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[],"reasoning_details":[],"audio":{}}}]}"#,
        ),
        (
            Chat,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        ),
        (
            Chat,
            r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
        ),
        (
            Chat,
            r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"non-stream"}}]}"#,
        ),
        (Chat, "[DONE]"),
        (
            Messages,
            r#"{"type":"message_start","message":{"content":[{"type":"text","text":"x"}]}}"#,
        ),
        (
            Messages,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
        (
            Messages,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
        ),
        (
            Messages,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"abc"}}"#,
        ),
        (
            Messages,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}"#,
        ),
        (
            Messages,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}"#,
        ),
        (Messages, r#"{"type":"content_block_stop","index":0}"#),
        (Messages, r#"{"type": "ping"}"#),
        (
            Responses,
            r#"{"type":"response.output_text.done","text":"full text"}"#,
        ),
        (
            Responses,
            r#"{"type":"response.created","response":{"output":[{"content":[{"text":"x"}]}],"usage":null}}"#,
        ),
        (
            Responses,
            r#"{"type":"response.output_text.delta","delta":""}"#,
        ),
        (
            Responses,
            r#"{"delta":"x","type":"response.output_item.added"}"#,
        ),
    ];
    for (format, data) in cases {
        let s = format!("data: {data}\n\n");
        let got = run(format, s.as_bytes(), true, &[]);
        assert_eq!(got.tokens.output_events, 0, "{data}");
        assert!(got.output_in.is_empty(), "{data}");
    }
}

#[test]
fn shapes_that_are_output() {
    use Format::*;
    let cases = [
        (Chat, r#"{"choices":[{"index":0,"delta":{"content":"a"}}]}"#),
        (
            Chat,
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"a"}}]}"#,
        ),
        (
            Chat,
            r#"{"choices":[{"index":0,"delta":{"reasoning":"a"}}]}"#,
        ),
        (
            Chat,
            r#"{"choices":[{"index":0,"delta":{"refusal":"no"}}]}"#,
        ),
        (
            Chat,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":""}}]}}]}"#,
        ),
        (
            Chat,
            r#"{"choices":[{"index":0,"delta":{"function_call":{"name":"f"}}}]}"#,
        ),
        (
            Chat,
            r#"{"choices":[{"index":0,"delta":{"audio":{"id":"audio_1","transcript":"Hi"}}}]}"#,
        ),
        (
            Chat,
            r#"{"choices":[{"index":0,"delta":{"reasoning_details":[{"type":"reasoning.text","text":"x"}]}}]}"#,
        ),
        (
            Chat,
            r#"{"choices":[{"index":0,"delta":{"some_new_field":"x"}}]}"#,
        ),
        // Mistral's reasoning models: content as a list of parts.
        (
            Chat,
            r#"{"choices":[{"index":0,"delta":{"content":[{"type":"thinking","thinking":[{"type":"text","text":"a"}]}]}}]}"#,
        ),
        (
            Chat,
            r#"{"choices":[{"index":1,"delta":{}},{"index":0,"delta":{"content":"second choice"}}]}"#,
        ),
        (Chat, r#"{"choices":[{"text":" legacy","index":0}]}"#),
        (
            Messages,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}"#,
        ),
        (
            Messages,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"redacted_thinking","data":"x"}}"#,
        ),
        (
            Messages,
            r#"{"delta":{"type":"text_delta","text":"a"},"type":"content_block_delta","index":0}"#,
        ),
        (
            Messages,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"citations_delta","citation":{"cited_text":"x"}}}"#,
        ),
        (
            Responses,
            r#"{"type":"response.refusal.delta","delta":"no"}"#,
        ),
        (
            Responses,
            r#"{"delta":"late type","type":"response.function_call_arguments.delta"}"#,
        ),
        // Whitespace anywhere JSON allows it, and the key order turned around.
        (
            Chat,
            "{ \"choices\" : [ { \"delta\" : { \"content\" : \"a\" } , \"index\" : 0 } ] }",
        ),
    ];
    for (format, data) in cases {
        let s = format!("data:{data}\n\n");
        assert_eq!(
            run(format, s.as_bytes(), true, &[]).tokens.output_events,
            1,
            "{data}"
        );
    }
}

#[test]
fn shapes_it_does_not_know_count_as_tokens_but_not_as_output() {
    use Format::*;
    // An unfamiliar event is a token for the first-token limit (as before formats were
    // known), so a stream Hourglass cannot read is never starved; the estimate ignores it.
    for (format, data) in [
        (Chat, r#"{"n":1}"#),
        (
            Chat,
            r#"{"type":"content_block_delta","delta":{"text":"x"}}"#,
        ),
        (Messages, r#"{"choices":[{"delta":{"content":"x"}}]}"#),
        (Messages, r#"{"type":"some_future_event"}"#),
        (Responses, r#"{"type":"some_future_event","delta":"x"}"#),
        (Responses, "plain text"),
        (Chat, "DONE"),
    ] {
        let s = format!("data: {data}\n\n");
        let got = run(format, s.as_bytes(), true, &[]);
        assert_eq!(got.output_in, vec![s.len()], "{data}");
        assert_eq!(got.tokens.output_events, 0, "{data}");
    }
}

/// A Responses output event.
const AFTER: &str = "data: {\"type\":\"response.output_text.delta\",\"delta\":\"after\"}\n\n";

#[test]
fn errors_by_shape() {
    let cases = [
        // OpenAI-compatible providers: a top-level error object, type or code.
        (
            r#"{"error":{"message":"m","type":"rate_limit_error","code":null}}"#,
            Some(ErrorType::RateLimit),
        ),
        (
            r#"{"error":{"message":"m","code":"rate_limit_exceeded"}}"#,
            Some(ErrorType::RateLimit),
        ),
        // A numeric code is the HTTP status (audit GB 6).
        (
            r#"{"error":{"message":"m","code":502}}"#,
            Some(ErrorType::Server),
        ),
        (r#"{"error":{"type":"brand_new_kind","message":"m"}}"#, None),
        // Another Hourglass further down a chain.
        (
            r#"{"type":"error","error":{"type":"timeout_error","code":"idle_timeout","message":"m"}}"#,
            Some(ErrorType::Timeout),
        ),
        (
            r#"{"type":"error","code":"insufficient_quota","message":"m"}"#,
            Some(ErrorType::InsufficientQuota),
        ),
        // Compatible servers' errors that are no error object (audit S): TGI's and
        // llama.cpp's string, vLLM's `object`.
        (r#"{"error":"model overloaded, retry later"}"#, None),
        (
            r#"{"error":"Input validation error","error_type":"validation"}"#,
            Some(ErrorType::InvalidRequest),
        ),
        (
            r#"{"error":"Model is overloaded","error_type":"overloaded"}"#,
            Some(ErrorType::Overloaded),
        ),
        (
            r#"{"object":"error","message":"boom","type":"BadRequestError","param":null,"code":400}"#,
            Some(ErrorType::InvalidRequest),
        ),
        (
            r#"{"object":"error","message":"busy","type":"ServiceUnavailableError","param":null,"code":503}"#,
            Some(ErrorType::Overloaded),
        ),
        // LiteLLM's code, an HTTP status as a string.
        (
            r#"{"error":{"message":"m","type":"None","code":"429"}}"#,
            Some(ErrorType::RateLimit),
        ),
    ];
    for (data, ty) in cases {
        let s = format!("data: {data}\n\n{AFTER}");
        let got = run(Format::Responses, s.as_bytes(), true, &[]);
        assert_eq!(
            got.tokens.error,
            Some(ty.unwrap_or(ErrorType::Other)),
            "{data}"
        );
        assert_eq!(got.error_end, Some(data.len() + 8), "{data}");
        assert_eq!(
            got.tokens.output_events, 0,
            "nothing after the error is read"
        );
    }
    // `error: null` does not end the stream.
    for data in [
        r#"{"choices":[],"error":null}"#,
        r#"{"choices":[],"error":""}"#,
        r#"{"object":"chat.completion.chunk","choices":[]}"#,
    ] {
        let s = format!("data: {data}\n\n{AFTER}");
        let got = run(Format::Responses, s.as_bytes(), true, &[]);
        assert_eq!(got.error_end, None, "{data}");
        assert_eq!(got.tokens.output_events, 1, "{data}");
    }
    let failed = r#"data: {"type":"response.failed","response":{"error":{"code":"server_error"}}}"#;
    assert_eq!(
        run(
            Format::Responses,
            format!("{failed}\n\n").as_bytes(),
            true,
            &[]
        )
        .tokens
        .error,
        Some(ErrorType::Server)
    );
}

#[test]
fn sse_framing_details() {
    // Several data lines are one event; the line break between them is JSON whitespace.
    let s = "data: {\"choices\":[{\"delta\":\ndata: {\"content\":\"a\"}}],\ndata: \"usage\":{\"prompt_tokens\":7\ndata: ,\"completion_tokens\":9}}\n\n";
    let got = run(Format::Chat, s.as_bytes(), true, &[]);
    assert_eq!(got.tokens.output_events, 1);
    assert_eq!(
        (got.tokens.prompt(), got.tokens.completion),
        (Some(7), Some(9))
    );
    // Comments, ids, event names and unknown fields are not data; a block without data does
    // not dispatch, and what it held is forgotten.
    let s = format!(": keep-alive\nid: 1\nevent: x\nretry: 5\ndat: {{\"delta\":\"x\"}}\n\n{AFTER}");
    let got = run(Format::Responses, s.as_bytes(), true, &[]);
    assert_eq!(got.tokens.output_events, 1);
    assert_eq!(got.output_in, vec![s.len()]);
    // `data` without a colon is an empty value, which dispatches (and is no known shape).
    let got = run(Format::Chat, b"data\n\n", true, &[]);
    assert_eq!((got.tokens, got.output_in), (Tokens::default(), vec![6]));
    // `event: ping` is a keep-alive whatever its data; `event: error` is an error whatever
    // its data; the last `event` line of a block wins, as in `sse`.
    for format in [Format::Chat, Format::Messages, Format::Responses] {
        let s = "event: ping\ndata: {\"type\": \"ping\"}\n\nevent:ping\ndata: x\n\n";
        let cuts: Vec<usize> = (0..=s.len()).collect();
        for cuts in [&[][..], &cuts[..]] {
            let got = run(format, s.as_bytes(), true, cuts);
            assert!(got.output_in.is_empty(), "{format:?}");
        }
        let s = "event: pings\ndata: x\n\nevent: ping\nevent: x\ndata: x\n\n";
        assert_eq!(run(format, s.as_bytes(), true, &[]).output_in.len(), 1);
        let s = "event: error\ndata: boom\n\ndata: x\n\n";
        let got = run(format, s.as_bytes(), true, &[8]);
        assert_eq!(got.error_end, Some(25));
        assert_eq!(got.tokens.error, Some(ErrorType::Other));
        let s = "event: errors\ndata: x\n\n";
        assert_eq!(run(format, s.as_bytes(), true, &[]).error_end, None);
    }
    // A usage number split anywhere, and one that is not a plain integer.
    let s = "data: {\"usage\":{\"prompt_tokens\":12345,\"completion_tokens\":1.5e3}}\n\n";
    for cut in 0..s.len() {
        let got = run(Format::Chat, s.as_bytes(), true, &[cut]);
        assert_eq!(
            (got.tokens.prompt(), got.tokens.completion),
            (Some(12345), None)
        );
    }
}

#[test]
fn escaped_and_deep_json_does_not_confuse_it() {
    // A key spelled with an escape is not that key; quotes and braces inside strings are text.
    let s =
        r#"data: {"us\u0061ge":{"prompt_tokens":5},"choices":[{"delta":{"content":"a \"}]}\\"}}]}"#;
    let got = run(Format::Chat, format!("{s}\n\n").as_bytes(), true, &[]);
    assert_eq!(got.tokens.output_events, 1);
    assert_eq!(got.tokens.prompt(), None);
    assert_eq!(got.tokens.output_bytes, r#"a \"}]}\\"#.len() as u64);
    // Nesting deeper than what is tracked stays balanced.
    let deep = "[".repeat(40) + &"]".repeat(40);
    let s = format!(
        "data: {{\"x\":{deep},\"usage\":{{\"input_tokens\":3,\"d\":{{\"a\":{{\"b\":{{\"input_tokens\":99}}}}}}}}}}\n\n"
    );
    assert_eq!(
        run(Format::Chat, s.as_bytes(), true, &[]).tokens.prompt(),
        Some(3)
    );
}

#[test]
fn the_estimate() {
    let t = Tokens {
        output_events: 10,
        output_bytes: 20,
        ..Tokens::default()
    };
    assert_eq!(
        t.completion(),
        (10, Source::Estimated),
        "one per event at least"
    );
    let t = Tokens {
        output_events: 3,
        output_bytes: 401,
        ..Tokens::default()
    };
    assert_eq!(t.estimated_completion(), 101, "four bytes a token");
}

/// Every piece's findings and the final count of an inspector fed `stream` cut at `cuts`,
/// and whether the stream, ending there, ended short.
fn pieces(ins: Inspector, stream: &[u8], cuts: &[usize]) -> (Vec<Found>, Tokens, bool) {
    let mut ins = ins;
    let mut edges: Vec<usize> = cuts.iter().copied().chain([0, stream.len()]).collect();
    edges.sort_unstable();
    edges.dedup();
    let found = edges
        .windows(2)
        .map(|w| ins.feed(&stream[w[0]..w[1]]))
        .collect();
    (found, ins.tokens(), ins.ended_short())
}

/// A Chat answer with several choices ends when every choice that appeared has its
/// `finish_reason` (or `[DONE]` comes), not at the first one's.
#[test]
fn a_chat_answer_ends_when_every_choice_has_finished() {
    let chunk = |index: u32, delta: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":{index},\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let short = |stream: &[String], shapes: bool| {
        let ins = Inspector::new(Format::Chat, true);
        let ins = if shapes { ins } else { ins.without_shapes() };
        pieces(ins, stream.concat().as_bytes(), &[]).2
    };
    let both = |i: u32| {
        [
            chunk(0, r#"{"content":"a"}"#, "null"),
            chunk(i, r#"{"content":"b"}"#, "null"),
            chunk(0, r#"{"content":"c"}"#, "null"),
            chunk(i, r#"{"content":"d"}"#, "null"),
            chunk(0, "{}", r#""stop""#),
        ]
    };
    for shapes in [true, false] {
        let mut stream = both(1).to_vec();
        assert!(short(&stream, shapes), "choice 1 never finished");
        stream.push(chunk(1, "{}", r#""length""#));
        assert!(!short(&stream, shapes), "both finished");
        let mut stream = both(1).to_vec();
        stream.push("data: [DONE]\n\n".into());
        assert!(!short(&stream, shapes), "[DONE] ends it whatever came");
        // One choice past the masks (index 64 and more): any finish ends it, as before.
        assert!(!short(&both(70), shapes));
        assert!(!short(
            &both(63)[..]
                .iter()
                .chain([&chunk(63, "{}", r#""stop""#)])
                .cloned()
                .collect::<Vec<_>>(),
            shapes
        ));
        assert!(short(&both(63), shapes));
        // Two choices in one chunk, the second (by its index, wherever the key is)
        // unfinished.
        let two = r#"data: {"choices":[{"finish_reason":"stop","delta":{},"index":0},{"delta":{"content":"x"},"index":2,"finish_reason":null}]}"#;
        assert!(short(&[format!("{two}\n\n")], shapes));
        let single = [
            chunk(0, r#"{"content":"a"}"#, "null"),
            chunk(0, "{}", r#""stop""#),
        ];
        assert!(!short(&single, shapes), "one choice, finished");
        // The request asked for `n` choices: one that never appeared has not finished.
        let of = |n: u8, stream: &[String]| {
            let ins = Inspector::new(Format::Chat, true).with_choices(n);
            let ins = if shapes { ins } else { ins.without_shapes() };
            pieces(ins, stream.concat().as_bytes(), &[]).2
        };
        assert!(of(2, &single), "choice 1 never began");
        assert!(!of(1, &single));
        let mut both = single.to_vec();
        both.push(chunk(1, "{}", r#""stop""#));
        assert!(!of(2, &both));
        assert!(of(3, &both));
        // n past the masks: the 64 choices they hold, as for one that appeared there.
        assert!(of(64, &both));
        let all: Vec<String> = (0..64).map(|i| chunk(i, "{}", r#""stop""#)).collect();
        assert!(!of(64, &all));
    }
}

#[test]
fn it_stays_small() {
    // It lives inline in every stream's watchdog body (a stream costs ~25 KiB in all); the
    // stream's shape is boxed beside it. (Both grew by 40 bytes or so for the masks of the
    // Chat choices seen and finished, which say when an answer of several choices ended; the
    // inspector by 8 more for the prompt's parts, kept apart so that a later usage that
    // names only some of them does not lose the others; its scanner by 8 for the longer line
    // prefix that tells `event: keepalive`; by 8 when whether the answer began moved into
    // the reader, which alone tells `[DONE]` and keep-alives from the answer's events.)
    let size = std::mem::size_of::<Inspector>();
    assert!(size <= 328, "{size} bytes");
    let shape = std::mem::size_of::<Shape>();
    assert!(shape <= 344, "{shape} bytes");
}

/// A Messages answer has ended once `message_delta` brings its `stop_reason`, as a Chat
/// choice has at its `finish_reason`: what may follow (`message_stop`) adds nothing, so a
/// stream that stops there is whole, as an assembled answer then is. Its final event is still
/// `message_stop`.
#[test]
fn a_messages_answer_ends_at_its_stop_reason() {
    let head = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    );
    let mut ins = Inspector::new(Format::Messages, true);
    ins.read(head.as_bytes());
    assert!(!ins.answer_ended() && ins.ended_short());
    // A null stop_reason is no end.
    ins.read(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null,\"stop_sequence\":null},\"usage\":{\"output_tokens\":2}}\n\n");
    assert!(!ins.answer_ended());
    ins.read(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":2}}\n\n");
    assert!(ins.answer_ended() && !ins.ended_short());
    assert!(!ins.answer_over());
    ins.read(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    assert!(ins.answer_over());
}

/// Audit KE 2: Responses output that comes outside `*.delta` events is output. A partial image
/// always is; an `output_item.done` whose item carries output (a message's text, a call's
/// arguments) is when no output came before it (after deltas it repeats them, and its bytes
/// would count twice in the estimate). The reference reader says the same.
#[test]
fn responses_output_outside_deltas_is_output() {
    let ev = |data: &str| format!("data: {data}\n\n");
    let image = ev(
        r#"{"type":"response.image_generation_call.partial_image","output_index":0,"item_id":"ig_1","partial_image_index":0,"partial_image_b64":"iVBORw0KGgo="}"#,
    );
    let message = ev(
        r#"{"type":"response.output_item.done","output_index":0,"item":{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","annotations":[],"text":"Hello"}]}}"#,
    );
    let call = ev(
        r#"{"type":"response.output_item.done","output_index":0,"item":{"type":"function_call","name":"f","arguments":"{\"a\":1}","call_id":"c"}}"#,
    );
    let empty = ev(
        r#"{"type":"response.output_item.done","output_index":0,"item":{"type":"message","content":[]}}"#,
    );
    let added = ev(
        r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","name":"f","arguments":""}}"#,
    );
    let delta = ev(r#"{"type":"response.output_text.delta","delta":"Hello"}"#);
    for (stream, events, bytes) in [
        (image.clone(), 1, 0),
        (format!("{added}{image}{image}"), 2, 0),
        (message.clone(), 1, 5),
        (call.clone(), 1, 9),
        (format!("{added}{call}"), 1, 9),
        (empty.clone(), 0, 0),
        // After its deltas, the whole item is no more output.
        (format!("{delta}{message}"), 1, 5),
    ] {
        let cuts: Vec<usize> = (0..=stream.len()).collect();
        let got = run(Format::Responses, stream.as_bytes(), true, &cuts);
        assert_eq!(got.tokens.output_events, events, "{stream}");
        assert_eq!(got.tokens.output_bytes, bytes, "{stream}");
        assert_eq!(got.output_in.is_empty(), events == 0, "{stream}");
        assert_eq!(got, reference(Format::Responses, &stream), "{stream}");
        // Read whole, and with shapes: the same.
        let whole = run(Format::Responses, stream.as_bytes(), true, &[]);
        assert_eq!(whole.tokens, got.tokens, "{stream}");
    }
}

/// Audit MC 1: a stream of a known format that ends before any event of its answer (empty,
/// comments, `event: ping`) ended short, as one cut after its preamble does: it passed as a
/// whole, empty answer. An event of a shape the reader does not know begins an answer all the
/// same, which then ends as it ends.
#[test]
fn a_stream_that_ends_before_its_answer_began_ended_short() {
    for format in [Format::Chat, Format::Messages, Format::Responses] {
        for body in [
            "",
            ": ping\n\n",
            ": ping\n\n: keep-alive\n\n",
            "event: ping\ndata: {\"type\":\"ping\"}\n\n",
            "id: 1\n\nretry: 10\n\n",
            // The end marker, or a keep-alive without its `event:` line, begins no answer
            // (audit NA 5), on Chat too.
            "data: [DONE]\n\n",
            "data: {\"type\":\"ping\"}\n\n",
            "data: {\"type\":\"ping\"}\n\ndata: [DONE]\n\n",
        ] {
            let mut ins = Inspector::new(format, true);
            let short = pieces(ins.clone(), body.as_bytes(), &[]).2;
            assert!(short, "{format:?}: {body:?}");
            ins.feed(body.as_bytes());
            assert!(!ins.answer_ended(), "{format:?}: {body:?}");
            // A keep-alive is no output, nor progress for the idle limit.
            let mut ins = Inspector::new(format, true);
            let (scan, output) = ins.read(b"data: {\"type\":\"ping\"}\n\n");
            assert!(!output && scan.progress == 0, "{format:?}");
        }
        let unknown = "data: {\"something\":\"else\"}\n\n";
        assert!(
            !pieces(Inspector::new(format, true), unknown.as_bytes(), &[]).2,
            "{format:?}"
        );
        // A JSON document is not an event stream: its empty body is read as before.
        assert!(!Inspector::new(format, false).ended_short(), "{format:?}");
    }
}

/// Audit ZB 1: sglang, older Ollama and koboldcpp send `"finish_reason":""` (koboldcpp
/// `"null"`) on every chunk before the last. That is no reason, as the SDKs read it: the
/// answer has not ended, so a stream that stops there ended short; the chunk with a reason
/// ends it. Read whole or byte by byte, with shapes or without.
#[test]
fn an_empty_finish_reason_is_no_end() {
    let chunk = |delta: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    for none in [r#""""#, r#""null""#] {
        let start = [
            chunk(r#"{"role":"assistant","content":"The answer is"}"#, none),
            chunk(r#"{"content":" forty"}"#, none),
            chunk(r#"{"content":" two"}"#, none),
        ]
        .concat();
        let end = format!("{start}{}", chunk("{}", r#""stop""#));
        for shapes in [true, false] {
            let ins = Inspector::new(Format::Chat, true);
            let ins = if shapes { ins } else { ins.without_shapes() };
            for (stream, short) in [(&start, true), (&end, false)] {
                let cuts: Vec<usize> = (0..stream.len()).collect();
                for cuts in [&[][..], &cuts[..]] {
                    let (_, _, ended_short) = pieces(ins.clone(), stream.as_bytes(), cuts);
                    assert_eq!(ended_short, short, "{none} {shapes} {stream}");
                }
                let mut whole = ins.clone();
                whole.feed(stream.as_bytes());
                assert_eq!(whole.answer_ended(), !short, "{none} {shapes}");
            }
        }
    }
}
