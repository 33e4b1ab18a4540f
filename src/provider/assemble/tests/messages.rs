//! The Messages assembler: tool_use blocks, what a cut leaves out of a partial answer,
//! and the fields a message keeps.

use super::*;

/// A tool_use block's start carries `"input":{}` whatever its input will be: cut before its
/// `content_block_stop`, the call was never finished, and a partial answer that presented
/// it (with empty arguments) would have an agent run a call the model never made. One that
/// was stopped keeps the input its start carried whole.
#[test]
fn a_tool_use_never_stopped_is_not_in_a_partial_answer() {
    let text = [
        MESSAGE_START,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"I'll delete the files."}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
    ];
    let start = r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"delete_files","input":{}}}"#;
    let empty = r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}"#;
    let stop = r#"{"type":"content_block_stop","index":1}"#;
    for tail in [&[start][..], &[start, empty][..]] {
        let d = cut_doc(Format::Messages, &sse(&[&text[..], tail].concat()));
        assert_eq!(blocks(&d), ["text"], "{tail:?}: {d}");
        assert_eq!(d["stop_reason"], "max_tokens");
    }
    // Stopped with no delta: its start's input was the whole of it.
    let d = cut_doc(
        Format::Messages,
        &sse(&[&text[..], &[start, stop]].concat()),
    );
    assert_eq!(blocks(&d), ["text", "tool_use:delete_files"], "{d}");
    assert_eq!(d["content"][1]["input"], json!({}));
}

/// The stop reason had come when the cut came (only `message_stop` was missing): it stands,
/// as a Chat choice that finished keeps its finish reason.
#[test]
fn a_stop_reason_that_came_before_the_cut_stands() {
    let d = cut_doc(Format::Messages, &sse(&messages_whole_but_its_end()));
    assert_eq!(d["stop_reason"], "tool_use", "{d}");
    assert_eq!(blocks(&d), ["text", "tool_use:get_weather"]);
    assert_eq!(d["usage"]["output_tokens"], 40);
}

/// Anthropic's compaction block (a beta) streams its summary in `compaction_delta`s: the
/// content joined, the opaque `encrypted_content` as last sent (the client must send it
/// back verbatim). A delta of a type not known yet has its string fields joined and its
/// other values taken, so a new beta's block is not emptied.
#[test]
fn compaction_and_unknown_deltas_are_kept() {
    let stop = r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":30}}"#;
    let stream = sse(&[
        MESSAGE_START,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"compaction","content":null}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"compaction_delta","content":"Summary of ","encrypted_content":"ENCold"}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"compaction_delta","content":"earlier turns.","encrypted_content":"ENCxyz"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"novelty","body":"","meta":null}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"novelty_delta","body":"a","meta":{"n":1}}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"novelty_delta","body":"b","meta":{"n":2}}}"#,
        r#"{"type":"content_block_stop","index":1}"#,
        stop,
        r#"{"type":"message_stop"}"#,
    ]);
    let d = doc(Format::Messages, &stream, None);
    assert_eq!(
        d["content"][0],
        json!({"type": "compaction", "content": "Summary of earlier turns.", "encrypted_content": "ENCxyz"})
    );
    assert_eq!(
        d["content"][1],
        json!({"type": "novelty", "body": "ab", "meta": {"n": 2}})
    );
}

/// A prompt read wholly from the cache reports `"input_tokens":0`: a count, not a gap. A
/// partial answer fills `input_tokens` only when it is absent, and so never counts the
/// cache reads twice (once in it, once in `cache_read_input_tokens`).
#[test]
fn a_partial_answer_fills_only_an_absent_input_count() {
    let stream = |usage: &str| {
        sse(&[
            &MESSAGE_START.replace(r#"{"input_tokens":50,"output_tokens":1}"#, usage),
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
        ])
    };
    let cut = |usage: &str, prompt: u64| {
        let s = stream(usage);
        let d = doc(
            Format::Messages,
            &s,
            Some((
                s.len(),
                Usage {
                    prompt,
                    completion: 2,
                },
            )),
        );
        d["usage"].clone()
    };
    let u = cut(
        r#"{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":1000,"output_tokens":1}"#,
        1000,
    );
    assert_eq!(u["input_tokens"], 0, "{u}");
    assert_eq!(u["cache_read_input_tokens"], 1000, "{u}");
    let u = cut(r#"{"output_tokens":1}"#, 40);
    assert_eq!(u["input_tokens"], 40, "absent: filled, {u}");
}

/// A Messages answer with one `tool_use` block whose input streams as `pieces`, stopped with
/// `tool_use`; `cut`: the stream ends before its stop reason (the block was stopped).
fn one_tool_use(pieces: &[&str], stop_reason: bool) -> String {
    let mut events = vec![
        MESSAGE_START.to_owned(),
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#
            .to_owned(),
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Ordering."}}"#
            .to_owned(),
        r#"{"type":"content_block_stop","index":0}"#.to_owned(),
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"order","input":{}}}"#
            .to_owned(),
    ];
    for p in pieces {
        events.push(
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": p}})
                .to_string(),
        );
    }
    events.push(r#"{"type":"content_block_stop","index":1}"#.to_owned());
    if stop_reason {
        events.push(r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":40}}"#.to_owned());
        events.push(r#"{"type":"message_stop"}"#.to_owned());
    }
    let events: Vec<&str> = events.iter().map(String::as_str).collect();
    sse(&events)
}

/// Audit PA 1: a tool_use block's input is the provider's JSON text as it wrote it, byte for
/// byte: an integer past 64 bits stays that integer (a `Value` made it a float), the keys keep
/// their order, and valid JSON a `Value` cannot hold (`1e400`, a lone surrogate escape) is
/// kept, not dropped with its whole tool call from an answer that looks whole.
#[test]
fn a_tool_uses_input_is_the_providers_text() {
    for input in [
        r#"{"sku": "A-1", "quantity": 2, "order_ref": 123456789012345678901234, "price": 19.999999999999999999, "amount": 1.10}"#,
        r#"{"x": 1e400}"#,
        r#"{"s": "\ud83d"}"#,
    ] {
        // In three pieces, cut anywhere.
        let (a, rest) = input.split_at(5);
        let (b, c) = rest.split_at(rest.len() / 2);
        let stream = one_tool_use(&["", a, b, c], true);
        let out = assemble(Format::Messages, &stream, None, 1 << 20)
            .finish(None)
            .unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.contains(&format!(r#""input":{input}"#)),
            "{input}: {out}"
        );
        assert!(out.contains(r#""stop_reason":"tool_use""#), "{out}");
    }
}

/// Audit PA 1: a stopped tool_use block whose input is no JSON at all, in an answer the
/// stream brought whole (its stop reason came), is not dropped from an answer given as whole
/// (200, no tool call, `stop_reason: "tool_use"`): the document fails, as one with an event
/// it cannot read does (a 502 for the client). Cut, the block is left out of the partial
/// answer, as a tool use cut mid-way is.
#[test]
fn a_whole_answers_tool_input_that_is_no_json_fails_the_document() {
    let stream = one_tool_use(&[r#"{"sku": "A-1", "#], true);
    match assemble(Format::Messages, &stream, None, 1 << 20).finish(None) {
        Err(AssembleError::Malformed(why)) => {
            assert!(why.contains("tool_use block 1"), "{why}");
            assert!(why.contains("no JSON the gateway can read"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    let d = cut_doc(
        Format::Messages,
        &one_tool_use(&[r#"{"sku": "A-1", "#], false),
    );
    assert_eq!(blocks(&d), ["text"], "{d}");
    assert_eq!(d["stop_reason"], "max_tokens");
}

/// Audit PA 2: a text block the cut left empty (right after its `content_block_start`) or
/// holding only whitespace is not in a partial answer: Anthropic never sends one, and
/// refuses the turn that holds one when an agent sends it back ("text content blocks must
/// be non-empty"). With nothing else kept, the cut has no partial answer (the limit's 504).
#[test]
fn a_text_block_the_cut_left_empty_is_not_in_a_partial_answer() {
    let thinking = [
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me think."}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQB"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
    ];
    let start =
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#;
    let space =
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":" \n"}}"#;
    for tail in [&[start][..], &[start, space][..]] {
        let d = cut_doc(
            Format::Messages,
            &sse(&[&[MESSAGE_START][..], &thinking, tail].concat()),
        );
        assert_eq!(blocks(&d), ["thinking"], "{tail:?}: {d}");
        assert_eq!(d["stop_reason"], "max_tokens");
    }
    let usage = Usage {
        prompt: 9,
        completion: 5,
    };
    let stream = sse(&[MESSAGE_START, start, space]);
    let a = assemble(Format::Messages, &stream, None, 1 << 20);
    assert!(a.has_output(), "whitespace is output as it came");
    assert_eq!(a.finish(Some(usage)), Err(AssembleError::Empty));
    // Text with something in it stays, its whitespace with it.
    let word =
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}"#;
    let d = cut_doc(Format::Messages, &sse(&[MESSAGE_START, start, space, word]));
    assert_eq!(
        d["content"],
        json!([{"type": "text", "text": " \nHi"}]),
        "{d}"
    );
    // A whole answer is the provider's, as it sent it.
    let stop = r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":1}}"#;
    let d = doc(
        Format::Messages,
        &sse(&[
            MESSAGE_START,
            start,
            r#"{"type":"content_block_stop","index":1}"#,
            stop,
        ]),
        None,
    );
    assert_eq!(d["content"], json!([{"type": "text", "text": ""}]), "{d}");
}

/// Audit UB 1: the context-management beta reports the edits it applied at the top level of
/// `message_delta` (`context_management`), beside `delta` and `usage`; the answer that did
/// not stream has it in the message, and so must the one rebuilt from a stream (the audit's
/// event, as the API sends it). The delta's `container` is kept with it.
#[test]
fn a_message_deltas_other_members_are_the_messages() {
    let stream = sse(&[
        MESSAGE_START,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null,"container":{"id":"container_1","expires_at":"2026-12-07T17:00:00Z"}},"usage":{"input_tokens":472,"cache_creation_input_tokens":1000,"cache_read_input_tokens":2000,"output_tokens":7},"context_management":{"applied_edits":[{"type":"clear_tool_uses_20250919","cleared_tool_uses":2,"cleared_input_tokens":5000}]}}"#,
        r#"{"type":"message_stop"}"#,
    ]);
    let d = doc(Format::Messages, &stream, None);
    assert_eq!(
        d["context_management"],
        json!({"applied_edits": [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": 5000}]}),
        "{d}"
    );
    assert_eq!(d["container"]["id"], "container_1", "{d}");
    assert_eq!(d["usage"]["cache_read_input_tokens"], 2000, "{d}");
    assert_eq!(d["usage"]["output_tokens"], 7, "{d}");
    assert_eq!(d["stop_reason"], "end_turn");
    assert!(d.get("type").is_some_and(|t| t == "message"), "{d}");
}

/// `input_transformations` (a beta) is final in `message_start`; a `message_delta` carries it
/// only after a fallback mid-stream, and then it replaces that one. A member sent `null`, or
/// not sent, leaves the message's as it was (as the SDK's accumulator does).
#[test]
fn a_message_deltas_member_replaces_message_starts_and_null_keeps_it() {
    let start = MESSAGE_START.replace(
        r#""content":[]"#,
        r#""content":[],"input_transformations":[{"type":"thinking_dropped","path":"messages.1.content.0","reason":"model_binding_mismatch"}],"container":{"id":"container_0"}"#,
    );
    let text = [
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
    ];
    let with = |delta: &str| {
        let mut events = vec![start.as_str()];
        events.extend(text);
        events.push(delta);
        doc(Format::Messages, &sse(&events), None)
    };
    let d = with(
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null,"container":null},"usage":{"output_tokens":7},"input_transformations":null,"context_management":null}"#,
    );
    assert_eq!(
        d["input_transformations"][0]["reason"], "model_binding_mismatch",
        "{d}"
    );
    assert_eq!(d["container"]["id"], "container_0", "{d}");
    assert_eq!(d["context_management"], Value::Null, "{d}");
    assert_eq!(d["stop_sequence"], Value::Null, "{d}");
    let d = with(
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":7},"input_transformations":[]}"#,
    );
    assert_eq!(d["input_transformations"], json!([]), "{d}");
}

/// A `fallback` block (a beta) marks where the model that declined gave way to the next: the
/// answer that did not stream names the model that served it, and so does the SDK's
/// accumulator (`model = block.to.model`). The block itself stays in the content.
#[test]
fn a_fallback_block_names_the_model_that_served_the_answer() {
    let fallback = r#"{"type":"content_block_start","index":0,"content_block":{"type":"fallback","from":{"model":"claude"},"to":{"model":"claude-sonnet-4-5-20250929"},"trigger":{"type":"refusal","category":null}}}"#;
    let stream = sse(&[
        MESSAGE_START,
        fallback,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"hi"}}"#,
        r#"{"type":"content_block_stop","index":1}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":7}}"#,
        r#"{"type":"message_stop"}"#,
    ]);
    let d = doc(Format::Messages, &stream, None);
    assert_eq!(d["model"], "claude-sonnet-4-5-20250929", "{d}");
    assert_eq!(blocks(&d), ["fallback", "text"], "{d}");
    assert_eq!(d["content"][0]["from"]["model"], "claude", "{d}");
}

/// Audit VC 5: a `message_delta`'s top-level members are the message's only where it has
/// none yet: a top-level `id`, `model`, `role` or `stop_reason` (the audit's event) never
/// overwrites what `message_start` and the delta gave, and a `usage` that is no object never
/// replaces the message's. The Anthropic SDK's accumulator takes only the delta, the usage
/// and the betas' `context_management` and `input_transformations` from this event.
#[test]
fn a_message_deltas_top_level_members_never_overwrite_the_messages() {
    let stream = sse(&[
        MESSAGE_START,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":7},"id":"msg_OTHER","model":"OTHER","role":"user","stop_reason":"bogus","stop_sequence":"bogus","content":[{"type":"text","text":"OTHER"}],"novelty":{"n":1}}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":5}"#,
        r#"{"type":"message_stop"}"#,
    ]);
    let d = doc(Format::Messages, &stream, None);
    assert_eq!(d["id"], "msg_1", "{d}");
    assert_eq!(d["model"], "claude", "{d}");
    assert_eq!(d["role"], "assistant", "{d}");
    assert_eq!(d["stop_reason"], "end_turn", "{d}");
    // The delta's `null` is the delta's: a top-level member never fills what it names.
    assert_eq!(d["stop_sequence"], Value::Null, "{d}");
    assert_eq!(d["content"], json!([{"type": "text", "text": "hi"}]), "{d}");
    assert_eq!(
        d["usage"],
        json!({"input_tokens": 50, "output_tokens": 7}),
        "{d}"
    );
    // A member the message has no value for is still taken (a beta's, not known yet).
    assert_eq!(d["novelty"], json!({"n": 1}), "{d}");
}

/// Audit ZB 3: Anthropic stopped by `max_tokens` inside a tool_use input ends the block and
/// says `stop_reason: "max_tokens"`. That is the provider's answer, as it gives it unstreamed,
/// not a malformed stream: a 200 with the block, its input what came whole of it (as the
/// SDK's accumulator reads it), never a 502 the SDK retries three times.
#[test]
fn a_tool_input_cut_by_max_tokens_is_the_answer() {
    let stream = one_tool_use(&[r#"{"path": "a.txt", "#, r#""content": "lorem ip"#], true).replace(
        r#""stop_reason":"tool_use""#,
        r#""stop_reason":"max_tokens""#,
    );
    let out = assemble(Format::Messages, &stream, None, 1 << 20)
        .finish(None)
        .unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(out.contains(r#""input":{"path": "a.txt"}"#), "{out}");
    let d: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(d["stop_reason"], "max_tokens");
    assert_eq!(blocks(&d), ["text", "tool_use:order"], "{d}");
    assert_eq!(d["content"][1]["id"], "toolu_1");
}

#[test]
fn what_came_whole_of_a_cut_json_text_is_closed() {
    use crate::provider::assemble::messages::closed_json;
    for (text, want) in [
        (r#"{"a": [1, 2"#, r#"{"a": [1]}"#),
        (r#"{"a": {"b": tr"#, r#"{"a": {}}"#),
        (r#"{"a": "x\""#, "{}"),
        (r#"{"a": 1, "b""#, r#"{"a": 1}"#),
        (r#"{"a": 1, "b":"#, r#"{"a": 1}"#),
        (r#"{"a": 1, "#, r#"{"a": 1}"#),
        (r#"{"a":{"b":1},"c":[true,"#, r#"{"a":{"b":1},"c":[true]}"#),
        (r#"{"é": "ü😀", "n": 12"#, r#"{"é": "ü😀"}"#),
        (r#"{"a": 12"#, "{}"),
        (r#"{"#, "{}"),
        ("not json", "{}"),
    ] {
        assert_eq!(closed_json(text).get(), want, "{text}");
    }
}

/// Audit ZB 4: a content block delta the reader cannot read (an emoji's surrogate pair split
/// across two events, as a server that slices UTF-16 writes it) fails the document, as in
/// Chat and Responses, never dropped from a 200 that looks whole. A type written with an
/// escape is read, and a delta of a kind not known here is merged whatever its fields hold.
#[test]
fn a_block_delta_that_cannot_be_read_fails_the_document() {
    let start =
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#;
    let end = [
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":9}}"#,
        r#"{"type":"message_stop"}"#,
    ];
    let text = |t: &str| {
        format!(
            r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{t}"}}}}"#
        )
    };
    let (a, b) = (text(r"smile \ud83d"), text(r"\ude00 and the rest."));
    let mut events = vec![MESSAGE_START, start, a.as_str(), b.as_str()];
    events.extend(end);
    match assemble(Format::Messages, &sse(&events), None, 1 << 20).finish(None) {
        Err(AssembleError::Malformed(why)) => {
            assert!(why.starts_with("event 3 of the stream is no "), "{why}")
        }
        other => panic!("{other:?}"),
    }
    let escaped = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text\u005fdelta","text":"Hi"}}"#;
    let mut events = vec![MESSAGE_START, start, escaped];
    events.extend(end);
    let d = doc(Format::Messages, &sse(&events), None);
    assert_eq!(d["content"][0]["text"], "Hi", "{d}");
    let future = [
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"future","text":null}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"future_delta","text":{"rich":true}}}"#,
    ];
    let mut events = vec![MESSAGE_START];
    events.extend(future);
    events.extend(end);
    let d = doc(Format::Messages, &sse(&events), None);
    assert_eq!(d["content"][0]["text"]["rich"], true, "{d}");
}
