//! What each API answers: the event streams and documents of Chat Completions, Messages and
//! Responses, tool calls, models, unknown routes and bad input.

use super::*;

#[tokio::test]
async fn openai_stream_shape() {
    let fake = fake().await;
    let headers = [
        ("x-fake-chunks", "3"),
        ("x-fake-interval-ms", "1"),
        ("x-request-id", "req-7"),
    ];
    let response = h1()
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
    assert_eq!(response.headers()["x-request-id"], "req-7");
    let events = parse_sse(&text_of(response).await);
    assert_eq!(events.len(), 6, "{events:?}");
    assert!(events.iter().all(|e| e.event.is_none() && !e.comment));
    let role = json_of(&events[0]);
    assert_eq!(role["object"], "chat.completion.chunk");
    assert_eq!(role["model"], "gpt-test");
    assert!(role["id"].as_str().unwrap().starts_with("chatcmpl-fake-"));
    assert!(role["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(
        role["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(role["choices"][0]["finish_reason"], Value::Null);
    for (n, event) in events[1..4].iter().enumerate() {
        let chunk = json_of(event);
        assert_eq!(
            chunk["choices"][0]["delta"],
            json!({"content": format!("tok{} ", n + 1)})
        );
        assert_eq!(chunk["id"], role["id"]);
        assert!(chunk.get("x_fake_sent_ns").is_none());
    }
    let last = json_of(&events[4]);
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    // As OpenAI: the usage only when `stream_options.include_usage` asks for it.
    assert!(last.get("usage").is_none(), "{last}");
    assert_eq!(events[5].data, "[DONE]");
    let request = fake.wait_request_finished(0, PATIENCE).await.unwrap();
    assert!(request.completed);
}

#[tokio::test]
async fn anthropic_stream_shape() {
    let fake = fake().await;
    let headers = [("x-fake-chunks", "2"), ("x-fake-interval-ms", "1")];
    let response = h1()
        .request(post(&fake, "/v1/messages", MESSAGES, &headers))
        .await
        .unwrap();
    assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
    let events = parse_sse(&text_of(response).await);
    let names: Vec<_> = events.iter().map(|e| e.event.clone().unwrap()).collect();
    let expected = [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ];
    assert_eq!(names, expected);
    for event in &events {
        assert_eq!(json_of(event)["type"], event.event.as_deref().unwrap());
    }
    assert_eq!(json_of(&events[0])["message"]["model"], "claude-test");
    assert_eq!(
        json_of(&events[4])["delta"],
        json!({"type": "text_delta", "text": "tok2 "})
    );
    assert_eq!(json_of(&events[6])["delta"]["stop_reason"], "end_turn");
    assert_eq!(json_of(&events[6])["usage"]["output_tokens"], 2);
}

const RESPONSES: &str = r#"{"model":"gpt-test","stream":true,"input":"hi","instructions":"be brief","tools":[{"type":"function","name":"get_weather","parameters":{}}]}"#;
const RESPONSES_FULL: &str = r#"{"model":"gpt-test","input":"hi"}"#;

/// The Responses stream as OpenAI sends it: every event named by its `type`, numbered in
/// order, the text's deltas between the message item's and content part's added/done
/// events, and `response.completed` with the whole response and its usage.
#[tokio::test]
async fn responses_stream_shape() {
    let fake = fake().await;
    let headers = [("x-fake-chunks", "3"), ("x-fake-interval-ms", "1")];
    let response = h1()
        .request(post(&fake, "/v1/responses", RESPONSES, &headers))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
    let events = parse_sse(&text_of(response).await);
    let names: Vec<_> = events.iter().map(|e| e.event.clone().unwrap()).collect();
    let expected = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ];
    assert_eq!(names, expected);
    for (i, event) in events.iter().enumerate() {
        let data = json_of(event);
        assert_eq!(data["type"], event.event.as_deref().unwrap());
        assert_eq!(data["sequence_number"], i);
    }
    let created = json_of(&events[0])["response"].clone();
    assert_eq!(created["object"], "response");
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["model"], "gpt-test");
    assert_eq!(created["output"], json!([]));
    assert_eq!(created["instructions"], "be brief");
    assert_eq!(created["tools"][0]["name"], "get_weather");
    let id = created["id"].as_str().unwrap();
    assert!(id.starts_with("resp_fake_"), "{id}");
    let added = json_of(&events[2])["item"].clone();
    assert_eq!(added["type"], "message");
    assert_eq!(added["status"], "in_progress");
    let item_id = added["id"].as_str().unwrap();
    for event in &events[4..7] {
        let delta = json_of(event);
        assert_eq!(delta["item_id"], item_id);
        assert_eq!(delta["output_index"], 0);
        assert_eq!(delta["content_index"], 0);
        assert_eq!(delta["logprobs"], json!([]));
    }
    let deltas: String = events[4..7]
        .iter()
        .map(|e| json_of(e)["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(deltas, "tok1 tok2 tok3 ");
    assert_eq!(json_of(&events[7])["text"], "tok1 tok2 tok3 ");
    assert_eq!(json_of(&events[8])["part"]["text"], "tok1 tok2 tok3 ");
    assert_eq!(json_of(&events[9])["item"]["status"], "completed");
    let done = json_of(&events[10])["response"].clone();
    assert_eq!(done["id"], id);
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["id"], item_id);
    assert_eq!(
        done["output"][0]["content"][0],
        json!({"type": "output_text", "annotations": [], "logprobs": [], "text": "tok1 tok2 tok3 "})
    );
    assert_eq!(done["usage"]["output_tokens"], 3);
    let input = done["usage"]["input_tokens"].as_u64().unwrap();
    assert!(input >= 1);
    assert_eq!(done["usage"]["total_tokens"], input + 3);
    assert_eq!(
        done["usage"]["output_tokens_details"]["reasoning_tokens"],
        0
    );
    let request = fake.wait_request_finished(0, SECOND).await.unwrap();
    assert!(request.completed);
}

/// `x-fake-tool-call` in all three APIs: the arguments stream in the content events, and
/// their pieces join into the whole, which the closing events and the plain answers carry.
#[tokio::test]
async fn tool_calls_stream_their_arguments() {
    let fake = fake().await;
    let client = h1();
    let headers = [
        ("x-fake-chunks", "3"),
        ("x-fake-interval-ms", "1"),
        ("x-fake-tool-call", "get_weather"),
    ];
    let whole = r#"{"text":"tok1 tok2 tok3 "}"#;

    let events = events_of(&client, &fake, "/v1/responses", RESPONSES, &headers).await;
    let names: Vec<_> = events.iter().map(|e| e.event.clone().unwrap()).collect();
    let expected = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ];
    assert_eq!(names, expected);
    let item = json_of(&events[2])["item"].clone();
    assert_eq!(item["type"], "function_call");
    assert_eq!(item["name"], "get_weather");
    assert_eq!(item["arguments"], "");
    assert!(item["call_id"].as_str().unwrap().starts_with("call_fake_"));
    let pieces: String = events[3..6]
        .iter()
        .map(|e| {
            let d = json_of(e);
            assert_eq!(d["item_id"], item["id"]);
            d["delta"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(pieces, whole);
    assert_eq!(json_of(&events[6])["arguments"], whole);
    let done = json_of(&events[8])["response"].clone();
    assert_eq!(done["output"][0]["arguments"], whole);
    assert_eq!(done["output"][0]["status"], "completed");
    for (i, event) in events.iter().enumerate() {
        assert_eq!(json_of(event)["sequence_number"], i);
    }

    let events = events_of(&client, &fake, "/v1/chat/completions", CHAT, &headers).await;
    let first = json_of(&events[0])["choices"][0]["delta"].clone();
    assert_eq!(first["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(first["tool_calls"][0]["type"], "function");
    let pieces: String = events[1..4]
        .iter()
        .map(|e| {
            let d = json_of(e)["choices"][0]["delta"].clone();
            d["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(pieces, whole);
    assert_eq!(
        json_of(&events[4])["choices"][0]["finish_reason"],
        "tool_calls"
    );

    let events = events_of(&client, &fake, "/v1/messages", MESSAGES, &headers).await;
    let block = json_of(&events[1])["content_block"].clone();
    assert_eq!(block["type"], "tool_use");
    assert_eq!(block["name"], "get_weather");
    let pieces: String = events[3..6]
        .iter()
        .map(|e| {
            let d = json_of(e)["delta"].clone();
            assert_eq!(d["type"], "input_json_delta");
            d["partial_json"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(pieces, whole);
    assert_eq!(json_of(&events[7])["delta"]["stop_reason"], "tool_use");

    // Not streamed.
    let plain = |path, body| post(&fake, path, body, &headers);
    let text = text_of(
        client
            .request(plain("/v1/responses", RESPONSES_FULL))
            .await
            .unwrap(),
    )
    .await;
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["output"][0]["type"], "function_call");
    assert_eq!(r["output"][0]["arguments"], whole);
    let text = text_of(
        client
            .request(plain("/v1/chat/completions", CHAT_FULL))
            .await
            .unwrap(),
    )
    .await;
    let c: Value = serde_json::from_str(&text).unwrap();
    let call = &c["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["arguments"], whole);
    assert_eq!(c["choices"][0]["finish_reason"], "tool_calls");
    let text = text_of(
        client
            .request(plain("/v1/messages", MESSAGES_FULL))
            .await
            .unwrap(),
    )
    .await;
    let m: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(m["content"][0]["input"], json!({"text": "tok1 tok2 tok3 "}));
    assert_eq!(m["stop_reason"], "tool_use");

    // A name the APIs would not take is a script error.
    let bad = [("x-fake-tool-call", "get weather")];
    let response = client
        .request(post(&fake, "/v1/responses", RESPONSES, &bad))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}

/// `a+b` calls both in one answer, one after the other as the providers stream parallel
/// calls, each with its own id; `x-fake-tool-preamble` says some text before them.
#[tokio::test]
async fn parallel_calls_after_a_preamble_in_each_api() {
    let fake = fake().await;
    let client = h1();
    let headers = [
        ("x-fake-chunks", "2"),
        ("x-fake-interval-ms", "1"),
        ("x-fake-id", "p"),
        ("x-fake-tool-call", "get_weather+get_time"),
        ("x-fake-tool-preamble", "1"),
    ];
    let pieces = [r#"{"text":"tok1 "#, r#"tok2 "}"#];

    let events = events_of(&client, &fake, "/v1/chat/completions", CHAT, &headers).await;
    let deltas: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| json_of(e)["choices"][0]["delta"].clone())
        .collect();
    let opening = |index: usize, id: &str, name: &str| {
        json!({"tool_calls": [{"index": index, "id": id, "type": "function",
            "function": {"name": name, "arguments": ""}}]})
    };
    let piece = |index: usize, piece: &str| json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]});
    let expected = [
        json!({"role": "assistant", "content": ""}),
        json!({"content": "tok1 "}),
        opening(0, "call_p", "get_weather"),
        piece(0, pieces[0]),
        piece(0, pieces[1]),
        opening(1, "call_p-1", "get_time"),
        piece(1, pieces[0]),
        piece(1, pieces[1]),
        json!({}),
    ];
    assert_eq!(deltas, expected);
    let last = json_of(&events[events.len() - 2]);
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(events.last().unwrap().data, "[DONE]");

    let events = events_of(&client, &fake, "/v1/messages", MESSAGES, &headers).await;
    let seen: Vec<(String, Value, Value)> = events
        .iter()
        .map(|e| {
            let d = json_of(e);
            let what = if d["content_block"].is_object() {
                d["content_block"].clone()
            } else {
                d["delta"].clone()
            };
            (e.event.clone().unwrap(), d["index"].clone(), what)
        })
        .collect();
    let tool_use =
        |id: &str, name: &str| json!({"type": "tool_use", "id": id, "name": name, "input": {}});
    let input = |p: &str| json!({"type": "input_json_delta", "partial_json": p});
    let start = "content_block_start";
    let delta = "content_block_delta";
    let stop = "content_block_stop";
    let expected: Vec<(&str, Value, Value)> = vec![
        ("message_start", Value::Null, Value::Null),
        (start, json!(0), json!({"type": "text", "text": ""})),
        ("ping", Value::Null, Value::Null),
        (
            delta,
            json!(0),
            json!({"type": "text_delta", "text": "tok1 "}),
        ),
        (stop, json!(0), Value::Null),
        (start, json!(1), tool_use("toolu_p", "get_weather")),
        (delta, json!(1), input(pieces[0])),
        (delta, json!(1), input(pieces[1])),
        (stop, json!(1), Value::Null),
        (start, json!(2), tool_use("toolu_p-1", "get_time")),
        (delta, json!(2), input(pieces[0])),
        (delta, json!(2), input(pieces[1])),
        (stop, json!(2), Value::Null),
        (
            "message_delta",
            Value::Null,
            json!({"stop_reason": "tool_use", "stop_sequence": null}),
        ),
        ("message_stop", Value::Null, Value::Null),
    ];
    let expected: Vec<(String, Value, Value)> = expected
        .into_iter()
        .map(|(e, i, w)| (e.to_owned(), i, w))
        .collect();
    assert_eq!(seen, expected);

    let events = events_of(&client, &fake, "/v1/responses", RESPONSES, &headers).await;
    let seen: Vec<(String, Value, Value)> = events
        .iter()
        .map(|e| {
            let d = json_of(e);
            (
                e.event.clone().unwrap(),
                d["output_index"].clone(),
                d["delta"].clone(),
            )
        })
        .collect();
    let event = |name: &str, index: Value, delta: Value| (name.to_owned(), index, delta);
    let n = Value::Null;
    let args = "response.function_call_arguments.delta";
    let expected = vec![
        event("response.created", n.clone(), n.clone()),
        event("response.in_progress", n.clone(), n.clone()),
        event("response.output_item.added", json!(0), n.clone()),
        event("response.content_part.added", json!(0), n.clone()),
        event("response.output_text.delta", json!(0), json!("tok1 ")),
        event("response.output_text.done", json!(0), n.clone()),
        event("response.content_part.done", json!(0), n.clone()),
        event("response.output_item.done", json!(0), n.clone()),
        event("response.output_item.added", json!(1), n.clone()),
        event(args, json!(1), json!(pieces[0])),
        event(args, json!(1), json!(pieces[1])),
        event("response.function_call_arguments.done", json!(1), n.clone()),
        event("response.output_item.done", json!(1), n.clone()),
        event("response.output_item.added", json!(2), n.clone()),
        event(args, json!(2), json!(pieces[0])),
        event(args, json!(2), json!(pieces[1])),
        event("response.function_call_arguments.done", json!(2), n.clone()),
        event("response.output_item.done", json!(2), n.clone()),
        event("response.completed", n.clone(), n.clone()),
    ];
    assert_eq!(seen, expected);
    let output = json_of(events.last().unwrap())["response"]["output"].clone();
    let calls: Vec<(&str, &str, &str)> = output.as_array().unwrap()[1..]
        .iter()
        .map(|i| {
            let s = |k: &str| i[k].as_str().unwrap();
            (s("id"), s("call_id"), s("name"))
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("fc_p", "call_p", "get_weather"),
            ("fc_p-1", "call_p-1", "get_time")
        ]
    );
    assert_eq!(output[0]["content"][0]["text"], "tok1 ");
    // The preamble and both calls' pieces are generated tokens.
    let usage = &json_of(events.last().unwrap())["response"]["usage"];
    assert_eq!(usage["output_tokens"], 1 + 2 * 2);
}

#[tokio::test]
async fn non_stream_answers() {
    let fake = fake().await;
    let client = h1();
    let chunks = [("x-fake-chunks", "2")];
    let response = client
        .request(post(&fake, "/v1/chat/completions", CHAT_FULL, &chunks))
        .await
        .unwrap();
    assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
    assert!(response
        .headers()
        .contains_key(http::header::CONTENT_LENGTH));
    let chat: Value = serde_json::from_str(&text_of(response).await).unwrap();
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["choices"][0]["message"]["content"], "tok1 tok2 ");
    assert_eq!(chat["usage"]["completion_tokens"], 2);
    let response = client
        .request(post(&fake, "/v1/messages", MESSAGES_FULL, &chunks))
        .await
        .unwrap();
    let message: Value = serde_json::from_str(&text_of(response).await).unwrap();
    assert_eq!(message["type"], "message");
    assert_eq!(message["content"][0]["text"], "tok1 tok2 ");
    assert_eq!(message["usage"]["output_tokens"], 2);
    let response = client
        .request(post(&fake, "/v1/responses", RESPONSES_FULL, &chunks))
        .await
        .unwrap();
    assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
    let r: Value = serde_json::from_str(&text_of(response).await).unwrap();
    assert_eq!(r["object"], "response");
    assert_eq!(r["status"], "completed");
    assert_eq!(r["model"], "gpt-test");
    assert_eq!(r["output"][0]["type"], "message");
    assert_eq!(r["output"][0]["role"], "assistant");
    assert_eq!(r["output"][0]["content"][0]["text"], "tok1 tok2 ");
    // `output_text` is the SDKs' convenience, not a field on the wire.
    assert!(r.get("output_text").is_none());
    assert_eq!(r["usage"]["output_tokens"], 2);
    assert_eq!(r["tools"], json!([]));
}

#[tokio::test]
async fn models_unknown_routes_and_bad_json() {
    let fake = fake().await;
    let client = h1();
    let models = Request::get(format!("{}/v1/models", fake.url()))
        .body(Full::default())
        .unwrap();
    let response = client.request(models).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let list: Value = serde_json::from_str(&text_of(response).await).unwrap();
    assert_eq!(list["data"][0]["id"], "fake-model");
    let response = client
        .request(post(&fake, "/v2/nothing", "{}", &[]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/v2/nothing"));
    let response = client
        .request(post(&fake, "/v1/chat/completions", "{nope", &[]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn bad_script_headers_are_rejected_and_unknown_ones_ignored() {
    let fake = fake().await;
    let client = h1();
    for (name, value) in [
        ("x-fake-chunks", "abc"),
        ("x-fake-ttft-ms", "-5"),
        ("x-fake-status", "99"),
        ("x-fake-keepalive-kind", "shout"),
        ("x-fake-headers-first", "maybe"),
        ("x-fake-reasoning", "many"),
        ("x-fake-refusal", "yes"),
        ("x-fake-id", "a b"),
        ("x-fake-id", "a,b"),
        ("x-fake-tool-call", "a,,b"),
        ("x-fake-tool-call", "a+,b"),
        ("x-fake-tool-call", "a++b"),
        ("x-fake-tool-preamble", "some"),
        ("x-fake-tool-args", "[1,2]"),
        ("x-fake-tool-args", "{nope"),
    ] {
        let response = client
            .request(post(&fake, "/v1/chat/completions", CHAT, &[(name, value)]))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{name}");
        let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(name) && message.contains(value),
            "{message}"
        );
    }
    let headers = [("x-fake-whatever", "zzz"), ("x-fake-interval-ms", "1")];
    let response = client
        .request(post(&fake, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}
