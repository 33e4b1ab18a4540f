//! The two readings of one stream agree (audit UE): what a client that streams reads from the
//! events (decoded as the SSE standard decodes them, ended by `[DONE]` as the OpenAI SDKs end
//! it) is what the document rebuilt for one that does not stream holds.

use super::*;

/// The stream read as the gateway reads it, in pieces of 5 bytes, and its document.
fn rebuilt(format: Format, stream: &[u8]) -> Result<Value, AssembleError> {
    let mut inspector = Inspector::new(format, true).with_assembler(1 << 20);
    for piece in stream.chunks(5) {
        inspector.feed(piece);
    }
    assert!(inspector.answer_over(), "the stream ended its answer");
    let a = inspector.take_assembler().expect("made with one");
    Ok(serde_json::from_slice(&a.finish(None)?).unwrap())
}

const CHAT_END: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\n";

/// Audit UE 1: one invalid UTF-8 byte in a delta passes to a client that streams, whose
/// decoder (WHATWG's, every SDK's) reads it as U+FFFD; the rebuilt document was a 502
/// (serde_json refuses invalid UTF-8). It reads the same U+FFFD now, in every format.
#[test]
fn an_invalid_utf8_byte_in_an_event_is_read_as_the_standard_decodes_it() {
    let chat = [
        &b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"A\xffB\"},\"finish_reason\":null}]}\n\n"[..],
        CHAT_END,
        b"data: [DONE]\n\n",
    ]
    .concat();
    let d = rebuilt(Format::Chat, &chat).expect("a document");
    assert_eq!(d["choices"][0]["message"]["content"], "A\u{FFFD}B");
    assert_eq!(d["usage"]["completion_tokens"], 1);

    // A truncated sequence (`e2 82`) is one U+FFFD, as the standard's decoder makes it.
    let messages = [
        &b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n"[..],
        b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"A\xe2\x82B\"}}\n\n",
        b"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n",
        b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    ]
    .concat();
    let d = rebuilt(Format::Messages, &messages).expect("a document");
    assert_eq!(d["content"][0]["text"], "A\u{FFFD}B");

    let responses = [
        &b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"m1\",\"output_index\":0,\"content_index\":0,\"delta\":\"A\xffB\"}\n\n"[..],
        b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"id\":\"m1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"A\xffB\"}]}],\"usage\":{\"input_tokens\":3,\"output_tokens\":1,\"total_tokens\":4}}}\n\n",
    ]
    .concat();
    let d = rebuilt(Format::Responses, &responses).expect("a document");
    assert_eq!(d["output"][0]["content"][0]["text"], "A\u{FFFD}B");
}

/// Audit UE 2: an event whose data starts with `[DONE]` ends the stream for a client that
/// streams (the inspector, as openai-python's `startswith("[DONE]")`); the rebuilt document
/// read `[DONE]x` or `[DONE]` followed by an empty `data:` line as a chunk, and a whole
/// answer became a 502. Both readings take it as the end marker now.
#[test]
fn an_end_marker_with_more_after_it_ends_a_whole_answer() {
    for last in [
        &b"data: [DONE]x\n\n"[..],
        b"data: [DONE]\ndata:\n\n",
        b"data:[DONE] \n\n",
    ] {
        let chat = [
            &b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n"[..],
            CHAT_END,
            last,
        ]
        .concat();
        let d = rebuilt(Format::Chat, &chat).expect("a document");
        assert_eq!(d["choices"][0]["message"]["content"], "Hi");
        assert_eq!(d["choices"][0]["finish_reason"], "stop");
    }
}
