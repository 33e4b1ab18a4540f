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
