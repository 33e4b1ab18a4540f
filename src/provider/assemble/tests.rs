use super::*;
use crate::provider::inspect::Inspector;
use serde_json::json;

mod compatible;
mod decoding;
mod messages;

const CHAT: &str = include_str!("../../../tests/fixtures/openai_chat.sse");
const MESSAGES: &str = include_str!("../../../tests/fixtures/anthropic_messages.sse");
const RESPONSES: &str = include_str!("../../../tests/fixtures/openai_responses.sse");

/// The inspector reads the stream and hands its events to the assembler, as the gateway's
/// reader does: it decides which event is the provider's error.
fn assemble(format: Format, stream: &str, cut_at: Option<usize>, limit: usize) -> Assembler {
    let mut inspector = Inspector::new(format, true).with_assembler(limit);
    let bytes = &stream.as_bytes()[..cut_at.unwrap_or(stream.len())];
    // In pieces of 13 bytes: lines and events cut anywhere.
    for piece in bytes.chunks(13) {
        inspector.feed(piece);
    }
    inspector.take_assembler().expect("made with one")
}

fn doc(format: Format, stream: &str, cut: Option<(usize, Usage)>) -> Value {
    let a = assemble(format, stream, cut.map(|c| c.0), 1 << 20);
    serde_json::from_slice(&a.finish(cut.map(|c| c.1)).unwrap()).unwrap()
}

#[test]
fn a_chat_stream_becomes_its_chat_completion() {
    let d = doc(Format::Chat, CHAT, None);
    assert_eq!(d["id"], "chatcmpl-BxT4Jq8v1Yc2mZ0aQe7RkLd9WnHs3");
    assert_eq!(d["object"], "chat.completion");
    assert_eq!(d["created"], 1753891012);
    assert_eq!(d["model"], "deepseek-reasoner");
    assert_eq!(
        d["system_fingerprint"],
        "fp_7e73fd9a08_prod0623_fp8_kvcache"
    );
    let choice = &d["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    let reasoning = choice["message"]["reasoning_content"].as_str().unwrap();
    assert!(
        reasoning.starts_with("Okay, the user asks for"),
        "{reasoning}"
    );
    assert_eq!(
        choice["message"]["content"],
        "Let me check the weather in Paris for you."
    );
    assert_eq!(choice["message"]["refusal"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["id"], "call_0_5f4b1c2e-8f0a-4d53-9b1e-6a2f7c9d1e3b");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(
        call["function"]["arguments"],
        "{\"location\": \"Paris, France\", \"unit\": \"celsius\"}"
    );
    assert_eq!(choice["logprobs"], Value::Null);
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(d["usage"]["completion_tokens"], 62);
    assert_eq!(
        d["usage"]["completion_tokens_details"]["reasoning_tokens"],
        21
    );
}

/// OpenAI pads each chunk with a random `obfuscation` string: a streaming detail that the
/// unstreamed answer never has.
#[test]
fn the_chunks_obfuscation_is_not_in_the_document() {
    let chunk = |delta: &str, finish: &str, pad: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}],\"obfuscation\":\"{pad}\"}}\n\n"
        )
    };
    let stream = [
        chunk(r#"{"role":"assistant","content":""}"#, "null", "q8Zx"),
        chunk(r#"{"content":"Hi"}"#, "null", "Wm"),
        chunk("{}", r#""stop""#, "a1b2c3"),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let d = doc(Format::Chat, &stream, None);
    assert_eq!(d["choices"][0]["message"]["content"], "Hi");
    assert!(d.get("obfuscation").is_none(), "{d}");
}

/// Audit UB 1, Chat's alike: a provider may send top-level members only in the chunks that end
/// an answer (xAI's `citations` in its last chunk; a `system_fingerprint` that came `null`
/// at first, which the OpenAI SDK's accumulator takes from a later chunk). They are the
/// document's, as last sent; the head's identity (`id`, `created`, `model`) stays the first
/// chunk's (llama.cpp stamps each chunk's `created` anew).
#[test]
fn top_level_members_of_the_chunks_that_end_an_answer_are_the_documents() {
    let stream = sse(&[
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"grok-4","system_fingerprint":null,"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","created":2,"model":"grok-4","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","created":3,"model":"grok-4","system_fingerprint":null,"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6},"citations":["https://x.ai/a","https://x.ai/b"]}"#,
        "[DONE]",
    ]);
    let d = doc(Format::Chat, &stream, None);
    assert_eq!(
        d["citations"],
        json!(["https://x.ai/a", "https://x.ai/b"]),
        "{d}"
    );
    assert_eq!(d["system_fingerprint"], "fp_1", "{d}");
    assert_eq!(d["created"], 1, "{d}");
    assert_eq!(d["object"], "chat.completion", "{d}");
    assert_eq!(d["usage"]["total_tokens"], 6, "{d}");
    assert_eq!(d["choices"][0]["message"]["content"], "Hi");
}

#[test]
fn a_messages_stream_becomes_its_message() {
    let d = doc(Format::Messages, MESSAGES, None);
    assert_eq!(d["id"], "msg_01XkT9Qp3Vb7Lr2YcN8hWmFz");
    assert_eq!(d["type"], "message");
    assert_eq!(d["stop_reason"], "tool_use");
    let content = d["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "thinking");
    assert!(content[0]["thinking"]
        .as_str()
        .unwrap()
        .starts_with("The user wants the weather in Paris."));
    assert!(content[0]["signature"]
        .as_str()
        .unwrap()
        .starts_with("EqQBCgIYAhIM"));
    assert_eq!(content[1]["type"], "text");
    assert_eq!(content[2]["type"], "tool_use");
    assert_eq!(content[2]["name"], "get_weather");
    assert_eq!(
        content[2]["input"],
        json!({"location": "Paris, France", "unit": "celsius"})
    );
    // message_start's usage, with message_delta's output tokens over it.
    assert_eq!(d["usage"]["input_tokens"], 472);
    assert_eq!(d["usage"]["cache_read_input_tokens"], 2048);
    assert_eq!(d["usage"]["output_tokens"], 89);
}

#[test]
fn a_responses_stream_becomes_the_response_it_completed_with() {
    let d = doc(Format::Responses, RESPONSES, None);
    let completed = RESPONSES
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["type"] == "response.completed")
        .unwrap();
    assert_eq!(d, completed["response"]);
}

#[test]
fn a_cut_chat_stream_is_a_partial_answer_cut_for_length() {
    let cut = CHAT.find("\"arguments\":\"Paris, F").unwrap();
    let d = doc(
        Format::Chat,
        CHAT,
        Some((
            cut,
            Usage {
                prompt: 7,
                completion: 12,
            },
        )),
    );
    assert_eq!(d["choices"][0]["finish_reason"], "length");
    let message = &d["choices"][0]["message"];
    assert!(message["reasoning_content"].is_string());
    // The reasoning's tokens are among the completion's, and here all of them.
    assert_eq!(
        d["usage"],
        json!({"prompt_tokens": 7, "completion_tokens": 12, "total_tokens": 19,
               "completion_tokens_details": {"reasoning_tokens": 12}})
    );
    assert_eq!(
        message["content"],
        "Let me check the weather in Paris for you."
    );
    assert!(
        message.get("tool_calls").is_none(),
        "its arguments were cut: {message}"
    );
}

#[test]
fn a_tool_call_cut_mid_way_is_dropped_from_a_partial_answer() {
    let cut = MESSAGES.find("is, France").unwrap();
    let d = doc(
        Format::Messages,
        MESSAGES,
        Some((
            cut,
            Usage {
                prompt: 0,
                completion: 30,
            },
        )),
    );
    assert_eq!(d["stop_reason"], "max_tokens");
    let types: Vec<&str> = d["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        ["thinking", "text"],
        "the half-written tool_use is not sent"
    );
    assert_eq!(d["usage"]["input_tokens"], 472, "reported, not estimated");
    assert_eq!(d["usage"]["output_tokens"], 30);
}

/// A partial Responses answer keeps what had come of its parts: a citation added before the
/// cut (`response.output_text.annotation.added`), and a part that ended whole
/// (`response.content_part.done`: its annotations and logprobs).
#[test]
fn a_cut_responses_answer_keeps_its_parts_annotations() {
    let event = |data: &str| format!("event: x\ndata: {data}\n\n");
    let head = [
        r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null}}"#,
        r#"{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}"#,
        r#"{"type":"response.content_part.added","sequence_number":2,"output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}}"#,
        r#"{"type":"response.output_text.delta","sequence_number":3,"output_index":0,"content_index":0,"delta":"See {docs}."}"#,
        r#"{"type":"response.output_text.annotation.added","sequence_number":4,"output_index":0,"content_index":0,"annotation_index":0,"annotation":{"type":"url_citation","start_index":4,"end_index":10,"url":"https://example.com","title":"Docs"}}"#,
    ]
    .map(event)
    .concat();
    let usage = Usage {
        prompt: 5,
        completion: 3,
    };
    let d = doc(Format::Responses, &head, Some((head.len(), usage)));
    let part = &d["output"][0]["content"][0];
    assert_eq!(part["text"], "See {docs}.", "{d}");
    assert_eq!(part["annotations"][0]["url"], "https://example.com", "{d}");
    assert_eq!(part["annotations"].as_array().unwrap().len(), 1, "{d}");
    // The part's done event brings it whole: its annotations once, its logprobs.
    let done = event(
        r#"{"type":"response.content_part.done","sequence_number":5,"output_index":0,"content_index":0,"part":{"type":"output_text","text":"See {docs}.","annotations":[{"type":"url_citation","start_index":4,"end_index":10,"url":"https://example.com","title":"Docs"}],"logprobs":[{"token":"See","logprob":-0.1,"bytes":[83,101,101],"top_logprobs":[]}]}}"#,
    );
    let stream = format!("{head}{done}");
    let d = doc(Format::Responses, &stream, Some((stream.len(), usage)));
    let part = &d["output"][0]["content"][0];
    assert_eq!(part["annotations"].as_array().unwrap().len(), 1, "{d}");
    assert_eq!(part["logprobs"][0]["token"], "See", "{d}");
    assert_eq!(d["output"][0]["status"], "incomplete", "{d}");
}

#[test]
fn a_cut_responses_stream_is_incomplete() {
    let cut = RESPONSES.find("response.output_text.done").unwrap();
    let d = doc(
        Format::Responses,
        RESPONSES,
        Some((
            cut,
            Usage {
                prompt: 5,
                completion: 9,
            },
        )),
    );
    assert_eq!(d["status"], "incomplete");
    assert_eq!(d["incomplete_details"]["reason"], "max_output_tokens");
    let text: Vec<&str> = d["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap())
        .filter_map(|p| p["text"].as_str())
        .collect();
    assert!(!text.is_empty() && !text[0].is_empty(), "{d}");
    for item in d["output"].as_array().unwrap() {
        assert_ne!(item["status"], "in_progress", "cut, so incomplete: {item}");
    }
    let message = d["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "message")
        .unwrap();
    assert_eq!(message["status"], "incomplete");
}

/// Two choices, the first finished with "stop" before a limit cut the second: the first
/// keeps its own reason, only the cut one is "length".
#[test]
fn a_choice_that_finished_before_the_cut_keeps_its_reason() {
    let chunk = |index: u32, delta: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":{index},\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let stream = [
        chunk(0, r#"{"role":"assistant","content":"Yes"}"#, "null"),
        chunk(1, r#"{"role":"assistant","content":"Well, "}"#, "null"),
        chunk(0, "{}", r#""stop""#),
        chunk(1, r#"{"content":"it depends"}"#, "null"),
    ]
    .concat();
    let d = doc(
        Format::Chat,
        &stream,
        Some((
            stream.len(),
            Usage {
                prompt: 3,
                completion: 4,
            },
        )),
    );
    assert_eq!(d["choices"][0]["finish_reason"], "stop");
    assert_eq!(d["choices"][1]["finish_reason"], "length");
    assert_eq!(d["choices"][1]["message"]["content"], "Well, it depends");
}

#[test]
fn an_answer_past_the_limit_is_refused() {
    let a = assemble(Format::Chat, CHAT, None, 300);
    assert_eq!(a.finish(None), Err(AssembleError::TooLarge { limit: 300 }));
}

/// Audit KF 2: what an answer holds, which it takes from `response_body_memory`, is the
/// event being gathered and its text; the room a large event took is not kept beside the
/// text it went into.
#[test]
fn an_answer_holds_its_event_and_text_and_not_a_large_events_room() {
    let chunk = |content: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\"finish_reason\":null}}]}}\n\n"
        )
    };
    let mut inspector = Inspector::new(Format::Chat, true).with_assembler(1 << 20);
    let big = chunk(&"x".repeat(200_000));
    let (head, tail) = big.as_bytes().split_at(big.len() - 10);
    inspector.feed(head);
    assert_eq!(inspector.answer_held(), head.len() - "data: ".len());
    inspector.feed(tail);
    assert_eq!(inspector.answer_held(), 200_000, "the text alone");
    inspector.feed(chunk("y").as_bytes());
    let a = inspector.take_assembler().unwrap();
    assert_eq!(a.held(), 200_001);
    assert!(a.buf.capacity() <= KEPT_ROOM, "{}", a.buf.capacity());
}

#[test]
fn a_stream_with_no_answer_at_all_has_no_document() {
    let a = assemble(Format::Chat, ": keep-alive\n\n", None, 1 << 20);
    assert!(!a.has_output());
    assert_eq!(a.finish(None), Err(AssembleError::Empty));
}

#[test]
fn the_providers_error_event_is_kept_whole() {
    let a = assemble(
        Format::Messages,
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n",
        None,
        1 << 20,
    );
    assert_eq!(
        a.provider_error().unwrap()["error"]["type"],
        "overloaded_error"
    );
}

#[test]
fn an_openai_error_object_mid_stream_is_the_providers_error() {
    let a = assemble(
        Format::Chat,
        "data: {\"error\":{\"message\":\"m\",\"type\":\"server_error\"}}\n\n",
        None,
        1 << 20,
    );
    assert_eq!(a.provider_error().unwrap()["error"]["type"], "server_error");
}

/// A refusal streams logprobs under `refusal` only: the content logprobs it never sent stay
/// `null` in the document, as the provider's unstreamed answer has them.
#[test]
fn logprobs_a_stream_never_sent_stay_null() {
    let chunk = |delta: &str, logprobs: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":{logprobs},\"finish_reason\":null}}]}}\n\n"
        )
    };
    let entry =
        |t: &str| format!(r#"{{"token":"{t}","logprob":-0.5,"bytes":[],"top_logprobs":[]}}"#);
    let stream = [
        chunk(
            r#"{"role":"assistant","content":null,"refusal":""}"#,
            "null",
        ),
        chunk(
            r#"{"refusal":"No"}"#,
            &format!(r#"{{"content":null,"refusal":[{}]}}"#, entry("No")),
        ),
        chunk(
            r#"{"refusal":"pe"}"#,
            &format!(r#"{{"content":null,"refusal":[{}]}}"#, entry("pe")),
        ),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let d = doc(Format::Chat, &stream, None);
    let choice = &d["choices"][0];
    assert_eq!(choice["message"]["refusal"], "Nope");
    assert_eq!(choice["message"]["content"], Value::Null);
    assert_eq!(choice["logprobs"]["content"], Value::Null);
    let refusal = choice["logprobs"]["refusal"].as_array().unwrap();
    assert_eq!(refusal.len(), 2);
    assert_eq!(refusal[1]["token"], "pe");
}

/// Anthropic's and the Responses API's error events come as data alone too, without an
/// `event: error` line: the inspector ends the stream at them, and the assembler answers
/// with them, the same event for both.
#[test]
fn a_data_only_error_event_is_the_providers_error() {
    let messages = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}\n\n",
        "data: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
    );
    let a = assemble(Format::Messages, messages, None, 1 << 20);
    assert_eq!(
        a.provider_error().unwrap()["error"]["type"],
        "overloaded_error"
    );
    let responses = concat!(
        "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n",
        "data: {\"type\":\"response.output_item.added\",\"sequence_number\":1,\"output_index\":0,\"item\":{\"id\":\"msg_1\",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n",
        "data: {\"type\":\"error\",\"sequence_number\":2,\"code\":\"server_error\",\"message\":\"The server had an error\",\"param\":null}\n\n",
    );
    let a = assemble(Format::Responses, responses, None, 1 << 20);
    let e = a.provider_error().unwrap();
    assert_eq!(e["code"], "server_error");
    assert_eq!(e["message"], "The server had an error");
}

/// One chunk of a Chat stream with `delta` as given (and the finish reason), of choice 0.
fn chat_chunk(delta: &str, finish: &str) -> String {
    format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n"
    )
}

/// The legacy `function_call` (the `functions` parameter, before tools): its name and
/// arguments, split over chunks, are joined into the message, as OpenAI answers it.
#[test]
fn a_legacy_function_call_is_joined_into_the_message() {
    let stream = [
        chat_chunk(
            r#"{"role":"assistant","content":null,"function_call":{"name":"get_","arguments":""}}"#,
            "null",
        ),
        chat_chunk(r#"{"function_call":{"name":"weather"}}"#, "null"),
        chat_chunk(r#"{"function_call":{"arguments":"{\"city\":"}}"#, "null"),
        chat_chunk(r#"{"function_call":{"arguments":"\"Paris\"}"}}"#, "null"),
        chat_chunk("{}", r#""function_call""#),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let d = doc(Format::Chat, &stream, None);
    let choice = &d["choices"][0];
    assert_eq!(choice["finish_reason"], "function_call");
    assert_eq!(
        choice["message"]["function_call"],
        json!({"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"})
    );
    assert_eq!(choice["message"]["content"], Value::Null);
    assert!(choice["message"].get("tool_calls").is_none());
}

/// Audio output (its transcript and data in pieces) and annotations (a web search's
/// citations) are carried into the message, as the provider's unstreamed answer has them.
#[test]
fn audio_and_annotations_are_carried_into_the_message() {
    let citation = r#"{"type":"url_citation","url_citation":{"end_index":5,"start_index":0,"title":"P","url":"https://example.com/p"}}"#;
    let stream = [
        chat_chunk(
            r#"{"role":"assistant","content":null,"refusal":null,"audio":{"id":"audio_1","transcript":"Hel"}}"#,
            "null",
        ),
        chat_chunk(r#"{"audio":{"transcript":"lo."}}"#, "null"),
        chat_chunk(r#"{"audio":{"data":"UklG"}}"#, "null"),
        chat_chunk(r#"{"audio":{"data":"RiQA"}}"#, "null"),
        chat_chunk(
            r#"{"audio":{"id":"audio_1","expires_at":1729018505}}"#,
            "null",
        ),
        chat_chunk(&format!(r#"{{"annotations":[{citation}]}}"#), "null"),
        chat_chunk("{}", r#""stop""#),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let d = doc(Format::Chat, &stream, None);
    let message = &d["choices"][0]["message"];
    assert_eq!(
        message["audio"],
        json!({"id": "audio_1", "data": "UklGRiQA", "expires_at": 1729018505, "transcript": "Hello."})
    );
    assert_eq!(
        message["annotations"],
        json!([serde_json::from_str::<Value>(citation).unwrap()])
    );
    assert_eq!(message["content"], Value::Null);
}

/// Azure's stream opens with a chunk of prompt filter results whose id, model and created
/// are empty: the document takes them (and the system fingerprint) from the first chunk
/// that has them, and keeps the prompt filter results and each choice's content filter
/// results, as Azure's unstreamed answer has them.
#[test]
fn an_azure_stream_takes_its_head_from_the_chunks_that_have_it() {
    let safe = r#"{"hate":{"filtered":false,"severity":"safe"},"violence":{"filtered":false,"severity":"safe"}}"#;
    let chunk = |choice: &str| {
        format!(
            "data: {{\"choices\":[{choice}],\"created\":1727000000,\"id\":\"chatcmpl-A\",\"model\":\"gpt-4o-2024-05-13\",\"object\":\"chat.completion.chunk\",\"system_fingerprint\":\"fp_67802d9a6d\"}}\n\n"
        )
    };
    let stream = [
        format!(
            "data: {{\"choices\":[],\"created\":0,\"id\":\"\",\"model\":\"\",\"object\":\"\",\"prompt_filter_results\":[{{\"prompt_index\":0,\"content_filter_results\":{safe}}}]}}\n\n"
        ),
        chunk(r#"{"content_filter_results":{},"delta":{"content":"","role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}"#),
        chunk(&format!(r#"{{"content_filter_results":{safe},"delta":{{"content":"Hi"}},"finish_reason":null,"index":0,"logprobs":null}}"#)),
        chunk(r#"{"content_filter_results":{},"delta":{},"finish_reason":"stop","index":0,"logprobs":null}"#),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let d = doc(Format::Chat, &stream, None);
    assert_eq!(d["id"], "chatcmpl-A");
    assert_eq!(d["model"], "gpt-4o-2024-05-13");
    assert_eq!(d["created"], 1727000000);
    assert_eq!(d["object"], "chat.completion");
    assert_eq!(d["system_fingerprint"], "fp_67802d9a6d");
    let safe: Value = serde_json::from_str(safe).unwrap();
    assert_eq!(
        d["prompt_filter_results"],
        json!([{"prompt_index": 0, "content_filter_results": safe}])
    );
    let choice = &d["choices"][0];
    assert_eq!(choice["message"]["content"], "Hi");
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["content_filter_results"], safe);
}

/// The data lines of `events`, each an SSE event of its own.
fn sse(events: &[&str]) -> String {
    events.iter().map(|e| format!("data: {e}\n\n")).collect()
}

const MESSAGE_START: &str = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":50,"output_tokens":1}}}"#;

/// What a partial answer's `content` holds: each block's type, and a tool's name.
fn blocks(d: &Value) -> Vec<String> {
    d["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| match b["name"].as_str() {
            Some(name) => format!("{}:{name}", b["type"].as_str().unwrap()),
            None => b["type"].as_str().unwrap().to_owned(),
        })
        .collect()
}

fn cut_doc(format: Format, stream: &str) -> Value {
    let usage = Usage {
        prompt: 9,
        completion: 5,
    };
    doc(format, stream, Some((stream.len(), usage)))
}

/// A Responses call item is finished by its `response.output_item.done`: one the cut left
/// before it is not in the partial answer, whatever its arguments or input look like so far.
#[test]
fn a_responses_call_never_done_is_not_in_a_partial_answer() {
    let created = r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null}}"#;
    let message = [
        r#"{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}"#,
        r#"{"type":"response.content_part.added","sequence_number":2,"output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}"#,
        r#"{"type":"response.output_text.delta","sequence_number":3,"output_index":0,"content_index":0,"delta":"On it."}"#,
    ];
    let function = [
        r#"{"type":"response.output_item.added","sequence_number":4,"output_index":1,"item":{"id":"fc_1","type":"function_call","status":"in_progress","name":"delete_files","call_id":"call_1","arguments":""}}"#,
        r#"{"type":"response.function_call_arguments.delta","sequence_number":5,"output_index":1,"delta":"{\"path\":\"a\"}"}"#,
    ];
    let function_done = r#"{"type":"response.output_item.done","sequence_number":6,"output_index":1,"item":{"id":"fc_1","type":"function_call","status":"completed","name":"delete_files","call_id":"call_1","arguments":"{\"path\":\"a\"}"}}"#;
    let custom = r#"{"type":"response.output_item.added","sequence_number":7,"output_index":2,"item":{"id":"ctc_1","type":"custom_tool_call","status":"in_progress","name":"shell","call_id":"call_2","input":""}}"#;
    let types = |d: &Value| -> Vec<String> {
        d["output"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["type"].as_str().unwrap().to_owned())
            .collect()
    };
    let d = cut_doc(
        Format::Responses,
        &sse(&[&[created][..], &message, &function, &[custom]].concat()),
    );
    assert_eq!(types(&d), ["message"], "{d}");
    let d = cut_doc(
        Format::Responses,
        &sse(&[
            &[created][..],
            &message,
            &function,
            &[function_done, custom],
        ]
        .concat()),
    );
    assert_eq!(types(&d), ["message", "function_call"], "{d}");
    assert_eq!(d["output"][1]["status"], "completed");
}

/// A reasoning item the cut left before its `output_item.done` has no `encrypted_content`
/// (it comes with the done item): an agent that sends `output` back as its next input
/// (`store: false`) would send an item it cannot replay. Left out, as a partial Anthropic
/// answer leaves out a thinking block without its signature; a done one stays.
#[test]
fn a_reasoning_item_never_done_is_not_in_a_partial_answer() {
    let created = r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null}}"#;
    let reasoning = [
        r#"{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[],"encrypted_content":null}}"#,
        r#"{"type":"response.reasoning_summary_text.delta","sequence_number":2,"output_index":0,"summary_index":0,"delta":"**Plan** first I"}"#,
    ];
    let done = r#"{"type":"response.output_item.done","sequence_number":3,"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"**Plan** first I"}],"encrypted_content":"gAAA"}}"#;
    let message = [
        r#"{"type":"response.output_item.added","sequence_number":4,"output_index":1,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}"#,
        r#"{"type":"response.content_part.added","sequence_number":5,"output_index":1,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}"#,
        r#"{"type":"response.output_text.delta","sequence_number":6,"output_index":1,"content_index":0,"delta":"Hi"}"#,
    ];
    let d = cut_doc(
        Format::Responses,
        &sse(&[&[created][..], &reasoning, &message].concat()),
    );
    let output = d["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{d}");
    assert_eq!(output[0]["type"], "message", "{d}");
    let d = cut_doc(
        Format::Responses,
        &sse(&[&[created][..], &reasoning, &[done], &message].concat()),
    );
    assert_eq!(d["output"][0]["encrypted_content"], "gAAA", "{d}");
    assert_eq!(d["output"].as_array().unwrap().len(), 2, "{d}");
}

/// A complete Messages answer but for its `message_stop`: every block stopped and the stop
/// reason come.
fn messages_whole_but_its_end() -> Vec<&'static str> {
    vec![
        MESSAGE_START,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Checking."}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\":\"Paris\"}"}}"#,
        r#"{"type":"content_block_stop","index":1}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":40}}"#,
    ]
}

/// An answer is whole once all that is missing is the stream's own end: Anthropic's stop
/// reason came, every Chat choice finished and the usage after them came, the Responses
/// answer completed. Before that, it is not.
#[test]
fn an_answer_is_whole_once_only_its_end_is_missing() {
    let whole = |format: Format, stream: &str| assemble(format, stream, None, 1 << 20).whole();
    let mut events = messages_whole_but_its_end();
    assert!(whole(Format::Messages, &sse(&events)));
    events.pop();
    assert!(
        !whole(Format::Messages, &sse(&events)),
        "no stop reason yet"
    );

    let usage = r#"data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;
    let finished = [
        chat_chunk(r#"{"role":"assistant","content":"Hi"}"#, "null"),
        chat_chunk("{}", r#""stop""#),
    ]
    .concat();
    assert!(
        !whole(Format::Chat, &finished),
        "its usage is still to come"
    );
    assert!(whole(Format::Chat, &format!("{finished}{usage}\n\n")));
    let unfinished = chat_chunk(r#"{"role":"assistant","content":"Hi"}"#, "null");
    assert!(!whole(Format::Chat, &format!("{unfinished}{usage}\n\n")));

    let cut = RESPONSES.find("event: response.completed").unwrap();
    assert!(!whole(Format::Responses, &RESPONSES[..cut]));
    assert!(whole(Format::Responses, RESPONSES));
}

/// An event that cannot be read fails the document (a 502 for the client), naming it by
/// number; an event of a Responses kind the reader does not use is no fault whatever the
/// shape of its fields (the API adds events), and an event with empty data is skipped.
#[test]
fn an_event_that_cannot_be_read_fails_the_document() {
    let start = r#"{"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}"#;
    let done = r#"{"type":"response.completed","response":{"id":"resp_1","object":"response","status":"completed","output":[]}}"#;
    let unknown =
        r#"{"type":"response.mcp_call_arguments.delta","output_index":0,"delta":{"partial":true}}"#;
    let d = doc(
        Format::Responses,
        &(sse(&[start, unknown]) + "data:\n\n" + &sse(&[done])),
        None,
    );
    assert_eq!(d["status"], "completed");
    for (format, stream, n) in [
        (
            Format::Responses,
            sse(&[
                start,
                r#"{"type":"response.output_text.delta","delta":7}"#,
                done,
            ]),
            2,
        ),
        (Format::Responses, sse(&[start, "[1,2]", done]), 2),
        (
            Format::Messages,
            sse(&[
                MESSAGE_START,
                r#"{"type":"content_block_delta","index":0,"delta""#,
            ]),
            2,
        ),
        (
            Format::Chat,
            sse(&[
                "{\"id\":\"c\",\"choices\":[]}",
                "{\"choices\":[{\"index\":\"zero\"}]}",
            ]),
            2,
        ),
        (Format::Chat, sse(&["{\"id\":\"c\",\"choices\":7}"]), 1),
    ] {
        let a = assemble(format, &stream, None, 1 << 20);
        assert!(a.failed(), "{stream}");
        match a.finish(None) {
            Err(AssembleError::Malformed(why)) => {
                assert!(
                    why.starts_with(&format!("event {n} of the stream is no ")),
                    "{why}"
                )
            }
            other => panic!("{stream}: {other:?}"),
        }
    }
}

/// Mistral's reasoning models stream `content` as a list of parts (`thinking`, holding text
/// parts, then `text`), and its unstreamed answer has the list: parts of one type that come
/// one after the other are joined, and text that came as a string joins the list. A tool
/// call's `index` of `null` is the first call's.
#[test]
fn content_sent_as_parts_is_joined_into_a_list() {
    let chunk = |delta: &str, finish: &str| {
        format!(
            r#"{{"id":"c1","object":"chat.completion.chunk","created":1,"model":"magistral","choices":[{{"index":0,"delta":{delta},"finish_reason":{finish}}}]}}"#
        )
    };
    let thinking = |t: &str| {
        format!(
            r#"{{"content":[{{"type":"thinking","thinking":[{{"type":"text","text":"{t}"}}]}}]}}"#
        )
    };
    let events = [
        chunk(r#"{"role":"assistant","content":""}"#, "null"),
        chunk(&thinking("Let me "), "null"),
        chunk(&thinking("think."), "null"),
        chunk(
            r#"{"content":[{"type":"text","text":"The answer"}]}"#,
            "null",
        ),
        chunk(r#"{"content":" is 4."}"#, "null"),
        chunk(
            r#"{"tool_calls":[{"index":null,"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]}"#,
            "null",
        ),
        chunk("{}", r#""stop""#),
    ];
    let events: Vec<&str> = events.iter().map(String::as_str).collect();
    let d = doc(Format::Chat, &sse(&events), None);
    assert_eq!(
        d["choices"][0]["message"]["content"],
        serde_json::json!([
            {"type": "thinking", "thinking": [{"type": "text", "text": "Let me think."}]},
            {"type": "text", "text": "The answer is 4."},
        ]),
        "{d}"
    );
    assert_eq!(
        d["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "f"
    );
}

/// Parallel calls without `index` (Gemini's OpenAI endpoint: each whole in its own delta)
/// are two calls in the document, as in the provider's own (audit S).
#[test]
fn chat_calls_without_an_index_are_two_calls() {
    let stream = concat!(
        "data: {\"id\":\"g\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gemini\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"g\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gemini\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"arguments\":\"{\\\"tz\\\":\\\"CET\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"g\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gemini\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":9,\"total_tokens\":14}}\n\n",
        "data: [DONE]\n\n",
    );
    let d = doc(Format::Chat, stream, None);
    let calls = d["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{d}");
    assert_eq!(calls[0]["id"], "call_1");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
    assert_eq!(calls[1]["id"], "call_2");
    assert_eq!(calls[1]["function"]["name"], "get_time");
    assert_eq!(calls[1]["function"]["arguments"], "{\"tz\":\"CET\"}");
}

/// Parallel calls all at `index` 0 with their own ids (some OpenAI-compatible servers) are
/// two calls in the document, not one named `alphabeta` (audit EB F9).
#[test]
fn chat_calls_at_a_reused_index_are_two_calls() {
    let stream = concat!(
        "data: {\"id\":\"g\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"alpha\",\"arguments\":\"{}\"}},{\"index\":0,\"id\":\"call_b\",\"type\":\"function\",\"function\":{\"name\":\"beta\",\"arguments\":\"{}\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"g\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let d = doc(Format::Chat, stream, None);
    let calls = d["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{d}");
    assert_eq!(calls[0]["id"], "call_a");
    assert_eq!(calls[0]["function"]["name"], "alpha");
    assert_eq!(calls[1]["id"], "call_b");
    assert_eq!(calls[1]["function"]["name"], "beta");
}

/// Fields the document has no place of its own for are kept much as the OpenAI SDK's stream
/// accumulator keeps them for a client that streams (audit S), without its joining of
/// strings that are no text (audit Q: OpenRouter's repeated `format`): Gemini's tool-call
/// `extra_content` (the thought signature its next turn needs), OpenRouter's
/// `reasoning_details` (merged by `index`, text joined, the signature kept), vLLM's choice
/// `stop_reason`.
#[test]
fn chat_fields_without_a_place_are_kept_as_the_sdk_keeps_them() {
    let chunk = |choice: &str| {
        format!(
            "data: {{\"id\":\"o\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{choice}]}}\n\n"
        )
    };
    let stream = [
        chunk(r#"{"index":0,"delta":{"role":"assistant","reasoning":"Let me","reasoning_details":[{"type":"reasoning.text","text":"Let me","index":0,"format":"anthropic-claude-v1"}]},"finish_reason":null}"#),
        chunk(r#"{"index":0,"delta":{"reasoning":" think","reasoning_details":[{"type":"reasoning.text","text":" think","index":0,"format":"anthropic-claude-v1","signature":"EqQBsig=="}]},"finish_reason":null}"#),
        // Perplexity-style: a field sent whole again in a later chunk is not joined.
        chunk(r#"{"index":0,"delta":{},"finish_reason":null,"citations_note":"see [1]"}"#),
        chunk(r#"{"index":0,"delta":{},"finish_reason":null,"citations_note":"see [1]"}"#),
        chunk(r#"{"index":0,"delta":{"content":"Answer.","provider_specific_fields":null},"finish_reason":null}"#),
        chunk(r#"{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"},"extra_content":{"google":{"thought_signature":"CiQB0e2Kb-SIG"}}}]},"finish_reason":null}"#),
        chunk(r#"{"index":0,"delta":{},"finish_reason":"tool_calls","stop_reason":128009,"native_finish_reason":"STOP"}"#),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let d = doc(Format::Chat, &stream, None);
    let choice = &d["choices"][0];
    let message = &choice["message"];
    assert_eq!(message["content"], "Answer.");
    assert_eq!(message["reasoning"], "Let me think");
    assert_eq!(
        message["reasoning_details"],
        json!([{"type":"reasoning.text","text":"Let me think","index":0,"format":"anthropic-claude-v1","signature":"EqQBsig=="}])
    );
    assert_eq!(message["provider_specific_fields"], Value::Null);
    assert_eq!(
        message["tool_calls"][0]["extra_content"],
        json!({"google":{"thought_signature":"CiQB0e2Kb-SIG"}})
    );
    assert_eq!(message["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(choice["stop_reason"], 128009);
    assert_eq!(choice["citations_note"], "see [1]");
    assert_eq!(choice["native_finish_reason"], "STOP");
    assert_eq!(choice["finish_reason"], "tool_calls");
}

/// The usage of an answer whose provider sent none counts the reasoning that came as its
/// output is counted (an event at least a token, four bytes a token), never more than the
/// completion, rather than claiming none: Chat's `completion_tokens_details` only when
/// reasoning came; the Responses `output_tokens_details` always, as the SDKs' type requires
/// it. Reasoning left out of the answer (an item never done) was generated all the same.
#[test]
fn a_counted_usage_has_the_reasoning_tokens_that_came() {
    let usage = |completion| Usage {
        prompt: 9,
        completion,
    };
    let chat = [
        chat_chunk(
            r#"{"role":"assistant","reasoning_content":"think1 "}"#,
            "null",
        ),
        chat_chunk(r#"{"reasoning":"think2 "}"#, "null"),
        chat_chunk(r#"{"content":"tok1 "}"#, "null"),
    ]
    .concat();
    // 14 bytes of reasoning in 2 events: 4 tokens.
    let d = doc(Format::Chat, &chat, Some((chat.len(), usage(5))));
    assert_eq!(
        d["usage"],
        json!({"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14,
               "completion_tokens_details": {"reasoning_tokens": 4}})
    );
    let d = doc(Format::Chat, &chat, Some((chat.len(), usage(3))));
    assert_eq!(
        d["usage"]["completion_tokens_details"]["reasoning_tokens"],
        3
    );
    let whole = format!("{chat}{}", chat_chunk("{}", r#""stop""#));
    let mut a = assemble(Format::Chat, &whole, None, 1 << 20);
    a.fill_missing_usage(usage(5));
    let d: Value = serde_json::from_slice(&a.finish(None).unwrap()).unwrap();
    assert_eq!(
        d["usage"]["completion_tokens_details"]["reasoning_tokens"],
        4
    );
    let plain = chat_chunk(r#"{"role":"assistant","content":"tok1 "}"#, "null");
    let d = doc(Format::Chat, &plain, Some((plain.len(), usage(5))));
    assert!(d["usage"].get("completion_tokens_details").is_none(), "{d}");

    let created = r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null}}"#;
    let reasoning = [
        r#"{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[],"encrypted_content":null}}"#,
        r#"{"type":"response.reasoning_summary_text.delta","sequence_number":2,"output_index":0,"summary_index":0,"delta":"think1 "}"#,
        r#"{"type":"response.reasoning_text.delta","sequence_number":3,"output_index":0,"content_index":0,"delta":"think2 "}"#,
    ];
    let message = [
        r#"{"type":"response.output_item.added","sequence_number":4,"output_index":1,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}"#,
        r#"{"type":"response.content_part.added","sequence_number":5,"output_index":1,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}"#,
        r#"{"type":"response.output_text.delta","sequence_number":6,"output_index":1,"content_index":0,"delta":"tok1 "}"#,
    ];
    for (events, reasoning_tokens) in [
        (sse(&[&[created][..], &reasoning, &message].concat()), 4),
        (sse(&[&[created][..], &message].concat()), 0),
    ] {
        let d = doc(Format::Responses, &events, Some((events.len(), usage(5))));
        assert_eq!(
            d["usage"]["output_tokens_details"],
            json!({"reasoning_tokens": reasoning_tokens}),
            "{d}"
        );
        assert_eq!(d["usage"]["output_tokens"], 5, "{d}");
    }
}

/// Audio the cut left before its last piece, the one with `expires_at`, is unfinished: left
/// out of a partial answer (its `expires_at: null` fails the SDKs' type), and with nothing
/// else generated there is no partial answer. Audio that had its last piece stays.
#[test]
fn audio_the_cut_left_unfinished_is_not_in_a_partial_answer() {
    let start = chat_chunk(
        r#"{"role":"assistant","content":null,"audio":{"id":"audio_1","transcript":"Hel"}}"#,
        "null",
    );
    let last = chat_chunk(
        r#"{"audio":{"id":"audio_1","expires_at":1729018505}}"#,
        "null",
    );
    let text = chat_chunk(r#"{"content":"Hi"}"#, "null");
    let usage = Usage {
        prompt: 9,
        completion: 5,
    };
    let cut = format!("{start}{text}");
    let d = doc(Format::Chat, &cut, Some((cut.len(), usage)));
    let message = &d["choices"][0]["message"];
    assert!(message.get("audio").is_none(), "{d}");
    assert_eq!(message["content"], "Hi", "{d}");
    let a = assemble(Format::Chat, &start, None, 1 << 20);
    assert_eq!(a.finish(Some(usage)), Err(AssembleError::Empty));
    let whole = format!("{start}{last}");
    let d = doc(Format::Chat, &whole, Some((whole.len(), usage)));
    assert_eq!(
        d["choices"][0]["message"]["audio"]["expires_at"],
        1729018505
    );
}

/// Audit GB 4: Groq's usage comes under `x_groq.usage` in its last chunk: the document's
/// usage is it, not an estimate; a top-level `usage` (asked for by `include_usage`) wins.
#[test]
fn groqs_usage_is_the_documents() {
    let head = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"llama\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hello\"},\"finish_reason\":null}],\"x_groq\":{\"id\":\"req_01\"}}\n\n";
    let last = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"llama\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"x_groq\":{\"id\":\"req_01\",\"usage\":{\"prompt_tokens\":18,\"completion_tokens\":7,\"total_tokens\":25}}}\n\n";
    let stream = format!("{head}{last}data: [DONE]\n\n");
    let d = doc(Format::Chat, &stream, None);
    assert_eq!(d["usage"]["prompt_tokens"], 18, "{d}");
    assert_eq!(d["usage"]["completion_tokens"], 7, "{d}");
    let root = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":18,\"completion_tokens\":8,\"total_tokens\":26},\"x_groq\":{\"id\":\"req_01\",\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}}\n\n";
    let stream = format!("{head}{last}{root}data: [DONE]\n\n");
    let d = doc(Format::Chat, &stream, None);
    assert_eq!(d["usage"]["completion_tokens"], 8, "{d}");
}

/// Audit GB 7: a streamed custom tool call (GPT-5) is rebuilt with its `custom.input` pieces
/// joined, and no empty `function` beside it.
#[test]
fn a_custom_tool_calls_input_is_joined() {
    let chunk = |tc: &str| {
        format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-5\",\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{tc}]}},\"finish_reason\":null}}]}}\n\n"
        )
    };
    let stream = [
        chunk(r#"{"index":0,"id":"call_A","type":"custom","custom":{"name":"code_exec","input":""}}"#),
        chunk(r#"{"index":0,"custom":{"input":"print('hello"}}"#),
        chunk(r#"{"index":0,"custom":{"input":" world')"}}"#),
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-5\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n".to_owned(),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let d = doc(Format::Chat, &stream, None);
    assert_eq!(
        d["choices"][0]["message"]["tool_calls"],
        serde_json::json!([{"id":"call_A","type":"custom","custom":{"name":"code_exec","input":"print('hello world')"}}]),
        "{d}"
    );
}

/// Audit PA 3: a partial Responses message keeps the logprobs each
/// `response.output_text.delta` carried (its `content_part.done`, which has them all, never
/// came), as a partial Chat choice keeps its chunks'.
#[test]
fn a_cut_responses_message_keeps_its_deltas_logprobs() {
    let created = r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null}}"#;
    let stream = sse(&[
        created,
        r#"{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}"#,
        r#"{"type":"response.content_part.added","sequence_number":2,"output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}}"#,
        r#"{"type":"response.output_text.delta","sequence_number":3,"output_index":0,"content_index":0,"delta":"Hello","logprobs":[{"token":"Hello","logprob":-0.1,"bytes":[72,101,108,108,111],"top_logprobs":[]}]}"#,
        r#"{"type":"response.output_text.delta","sequence_number":4,"output_index":0,"content_index":0,"delta":",","logprobs":[]}"#,
        r#"{"type":"response.output_text.delta","sequence_number":5,"output_index":0,"content_index":0,"delta":" checking.","logprobs":[{"token":" checking","logprob":-0.5,"bytes":[32],"top_logprobs":[{"token":" checking","logprob":-0.5,"bytes":[32]}]},{"token":".","logprob":0,"bytes":[46],"top_logprobs":[]}]}"#,
    ]);
    let d = cut_doc(Format::Responses, &stream);
    let part = &d["output"][0]["content"][0];
    assert_eq!(part["text"], "Hello, checking.", "{d}");
    let tokens: Vec<&str> = part["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["token"].as_str().unwrap())
        .collect();
    assert_eq!(tokens, ["Hello", " checking", "."], "{d}");
    assert_eq!(part["logprobs"][1]["top_logprobs"][0]["logprob"], -0.5);
}

/// Audit QA 1: a whole Responses answer whose deltas carry logprobs counts them once against
/// `max_response_body`: its `output_text.done`, `content_part.done`, `output_item.done` and
/// `response.completed` repeat them all and replace the joined ones. Counted on top, they
/// refused an answer at half the limit, while its cut was served.
#[test]
fn a_whole_responses_answer_counts_its_deltas_logprobs_once() {
    let token = |i: usize| {
        format!(
            r#"{{"token":"t{i}","logprob":-0.5,"bytes":[116],"top_logprobs":[{}]}}"#,
            [r#"{"token":"alternative","logprob":-1.25,"bytes":[97,108,116]}"#; 6].join(",")
        )
    };
    let n = 60;
    let tokens: Vec<String> = (0..n).map(token).collect();
    let all = format!("[{}]", tokens.join(","));
    let text: String = (0..n).map(|i| format!("t{i}")).collect();
    let part =
        format!(r#"{{"type":"output_text","text":"{text}","annotations":[],"logprobs":{all}}}"#);
    let item = format!(
        r#"{{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{part}]}}"#
    );
    let mut events = vec![
        r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null}}"#.to_owned(),
        r#"{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}"#.to_owned(),
        r#"{"type":"response.content_part.added","sequence_number":2,"output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}}"#.to_owned(),
    ];
    events.extend(tokens.iter().enumerate().map(|(i, t)| {
        format!(
            r#"{{"type":"response.output_text.delta","sequence_number":{},"output_index":0,"content_index":0,"delta":"t{i}","logprobs":[{t}]}}"#,
            i + 3
        )
    }));
    let deltas = events.len();
    events.extend([
        format!(
            r#"{{"type":"response.output_text.done","sequence_number":900,"output_index":0,"content_index":0,"text":"{text}","logprobs":{all}}}"#
        ),
        format!(
            r#"{{"type":"response.content_part.done","sequence_number":901,"output_index":0,"content_index":0,"part":{part}}}"#
        ),
        format!(
            r#"{{"type":"response.output_item.done","sequence_number":902,"output_index":0,"item":{item}}}"#
        ),
        format!(
            r#"{{"type":"response.completed","sequence_number":903,"response":{{"id":"resp_1","object":"response","status":"completed","output":[{item}],"usage":{{"input_tokens":5,"output_tokens":{n},"total_tokens":{}}}}}}}"#,
            n + 5
        ),
    ]);
    let events: Vec<&str> = events.iter().map(String::as_str).collect();
    let whole = sse(&events);
    let answer = serde_json::to_vec(&doc(Format::Responses, &whole, None)).unwrap();
    // Between once and twice the answer, its logprobs (nearly all of it) fit once only.
    let limit = answer.len() * 3 / 2;
    let a = assemble(Format::Responses, &whole, None, limit);
    let d: Value = serde_json::from_slice(&a.finish(None).expect("fits the limit")).unwrap();
    assert_eq!(d["status"], "completed");
    assert_eq!(
        d["output"][0]["content"][0]["logprobs"]
            .as_array()
            .unwrap()
            .len(),
        n
    );
    // Its cut, under the same limit, still keeps the deltas' logprobs (audit PA 3).
    let cut = sse(&events[..deltas]);
    let a = assemble(Format::Responses, &cut, None, limit);
    let usage = Usage {
        prompt: 5,
        completion: n as u64,
    };
    let d: Value = serde_json::from_slice(&a.finish(Some(usage)).expect("fits")).unwrap();
    assert_eq!(d["status"], "incomplete");
    let part = &d["output"][0]["content"][0];
    assert_eq!(part["text"], text.as_str());
    assert_eq!(part["logprobs"].as_array().unwrap().len(), n, "{d}");
}

/// Audit VC 5, Chat's alike: the chunks that end an answer, read whole, never replace the
/// head's identity (the audit's final chunk), its choices, or its usage with one that is no
/// object.
#[test]
fn the_chunks_that_end_an_answer_keep_the_heads_identity() {
    let stream = sse(&[
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}"#,
        r#"{"id":"OTHER","object":"chat.completion.chunk","created":999,"model":"OTHERMODEL","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}"#,
        r#"{"id":"OTHER","object":"other","created":999,"model":"OTHERMODEL","choices":[],"usage":5}"#,
        "[DONE]",
    ]);
    let d = doc(Format::Chat, &stream, None);
    assert_eq!(d["id"], "c1", "{d}");
    assert_eq!(d["created"], 1, "{d}");
    assert_eq!(d["model"], "gpt", "{d}");
    assert_eq!(d["object"], "chat.completion", "{d}");
    assert_eq!(d["choices"][0]["message"]["content"], "Hi", "{d}");
    assert_eq!(d["usage"]["total_tokens"], 6, "{d}");
}
