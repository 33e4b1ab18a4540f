//! Streams of OpenAI-compatible servers and Anthropic that an assembled answer
//! (`stream_upstream`) must read as the SDKs do: empty finish reasons, a tool input cut by
//! `max_tokens`, a string split inside a surrogate pair. The routes and helpers are
//! `stream_upstream.rs`'s.

use super::stream_upstream::{post, CONFIG};
use crate::support::{json_body, read_body, Harness};

/// A chunk of choice 0 as sglang, older Ollama and koboldcpp send it.
fn chunk(delta: &str, finish: &str) -> String {
    format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
    )
}

/// Audit ZB 1: with `"finish_reason":""` on every chunk, the first chunk no longer ends the
/// answer. A stream that breaks after two of them is a 502 (and an error event for a client
/// that streams), one that goes silent a partial answer flagged as one, not a 200 that looks
/// whole; the same stream ended by its `stop` chunk is the document.
#[tokio::test]
async fn an_empty_finish_reason_leaves_the_answer_open() {
    let start = [
        chunk(r#"{"role":"assistant","content":"The answer is"}"#, r#""""#),
        chunk(r#"{"content":" forty"}"#, r#""""#),
    ]
    .concat();
    let whole = format!(
        "{start}{}{}data: [DONE]\n\n",
        chunk(r#"{"content":" two"}"#, r#""""#),
        chunk("{}", r#""stop""#)
    );
    let ask = |model: &str, stream: bool| {
        format!(
            r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
        )
    };
    let h = Harness::with_config(CONFIG).await;
    let replay = || h.replay(&whole);
    // The upstream closes after two chunks.
    replay();
    let cut = [("x-fake-disconnect-after", "2")];
    let (resp, _c) = h
        .send(post("/v1/chat/completions", ask("watched", false), &cut))
        .await;
    assert_eq!(resp.status(), 502);
    assert_eq!(json_body(resp).await["error"]["code"], "upstream_error");
    replay();
    let (resp, _c) = h
        .send(post("/v1/chat/completions", ask("watched", true), &cut))
        .await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    let error = read.error_event();
    assert_eq!(
        error.map(|e| e["code"].clone()),
        Some("upstream_error".into()),
        "{}",
        read.text()
    );
    // Silent after two chunks, past the idle limit, on a route with partial answers.
    replay();
    let (resp, _c) = h
        .send(post(
            "/v1/chat/completions",
            ask("partial", false),
            &[("x-fake-freeze-after", "2")],
        ))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-hourglass-partial"], "idle_timeout");
    let doc = json_body(resp).await;
    assert_eq!(doc["choices"][0]["finish_reason"], "length", "{doc}");
    assert_eq!(
        doc["choices"][0]["message"]["content"],
        "The answer is forty"
    );
    // Whole: the reason of its last chunk.
    replay();
    let (resp, _c) = h
        .send(post("/v1/chat/completions", ask("watched", false), &[]))
        .await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-hourglass-partial").is_none());
    let doc = json_body(resp).await;
    assert_eq!(doc["choices"][0]["finish_reason"], "stop", "{doc}");
    assert_eq!(
        doc["choices"][0]["message"]["content"],
        "The answer is forty two"
    );
}

/// The events of an Anthropic answer, each its own SSE event.
fn messages(events: &[&str]) -> String {
    events.iter().map(|e| format!("data: {e}\n\n")).collect()
}

const MESSAGE_START: &str = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}"#;

const ASK: &str =
    r#"{"model":"claude","max_tokens":20,"messages":[{"role":"user","content":"hi"}]}"#;

/// Audit ZB 3: Anthropic stopped by `max_tokens` inside a tool_use input: a 200 with
/// `stop_reason: "max_tokens"` and the block, its input what came whole of it, from one
/// generation (it was a 502 that the SDK retried twice more).
#[tokio::test]
async fn a_tool_input_cut_by_max_tokens_is_answered_once() {
    let stream = messages(&[
        MESSAGE_START,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"write","input":{}}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"path\": \"a.txt\", \"content\": \"lorem ip"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":20}}"#,
        r#"{"type":"message_stop"}"#,
    ]);
    let h = Harness::with_config(CONFIG).await;
    h.replay(&stream);
    let (resp, _c) = h.send(post("/v1/messages", ASK.into(), &[])).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-hourglass-partial").is_none());
    let doc = json_body(resp).await;
    assert_eq!(doc["stop_reason"], "max_tokens", "{doc}");
    assert_eq!(doc["content"][0]["type"], "tool_use", "{doc}");
    assert_eq!(
        doc["content"][0]["input"],
        serde_json::json!({"path": "a.txt"})
    );
    assert_eq!(doc["usage"]["output_tokens"], 20);
    assert_eq!(h.fake.requests().len(), 1);
}

/// Audit ZB 4: an emoji's surrogate pair split across two text deltas cannot be read into the
/// document: a 502, as in Chat and Responses, not a 200 without the two deltas. A client that
/// streams gets the events as they came.
#[tokio::test]
async fn a_block_delta_that_cannot_be_read_is_a_502() {
    let text = |t: &str| {
        format!(
            r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{t}"}}}}"#
        )
    };
    let (a, b) = (text(r"smile \ud83d"), text(r"\ude00 and the rest."));
    let stream = messages(&[
        MESSAGE_START,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        &text("Hello "),
        &a,
        &b,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":9}}"#,
        r#"{"type":"message_stop"}"#,
    ]);
    let h = Harness::with_config(CONFIG).await;
    h.replay(&stream);
    let (resp, _c) = h.send(post("/v1/messages", ASK.into(), &[])).await;
    assert_eq!(resp.status(), 502);
    let error = json_body(resp).await;
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("event 4 of the stream"), "{error}");
    h.replay(&stream);
    let streamed = ASK.replacen('{', r#"{"stream":true,"#, 1);
    let (resp, _c) = h.send(post("/v1/messages", streamed, &[])).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(read.text().contains(r"smile \ud83d"), "{}", read.text());
    assert!(read.error_event().is_none(), "{}", read.text());
}
