//! The same scripted output, streamed and not, in every shape: each stream, assembled naively
//! here (the way a client library would), is the answer the same request gets unstreamed.

use std::collections::BTreeMap;

use serde_json::Map;

use super::*;

const QUICK: [(&str, &str); 3] = [
    ("x-fake-id", "same"),
    ("x-fake-chunks", "3"),
    ("x-fake-interval-ms", "0"),
];

async fn ask(fake: &FakeUpstream, path: &str, body: &Value, headers: &[(&str, &str)]) -> String {
    let all: Vec<(&str, &str)> = QUICK.iter().chain(headers).copied().collect();
    let response = h1()
        .request(post(fake, path, &body.to_string(), &all))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    text_of(response).await
}

/// The request streamed (Chat: with the usage chunk) and not: the events and the document.
async fn both(
    fake: &FakeUpstream,
    path: &str,
    body: Value,
    headers: &[(&str, &str)],
) -> (Vec<Sse>, Value) {
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    if path == "/v1/chat/completions" {
        streamed["stream_options"] = json!({"include_usage": true});
    }
    let events = parse_sse(&ask(fake, path, &streamed, headers).await);
    let whole = serde_json::from_str(&ask(fake, path, &body, headers).await).unwrap();
    (events, whole)
}

fn append(into: &mut Map<String, Value>, key: &str, text: &str) {
    match into.get_mut(key) {
        Some(Value::String(s)) => s.push_str(text),
        _ => {
            into.insert(key.into(), json!(text));
        }
    }
}

#[derive(Default)]
struct ChatChoice {
    message: Map<String, Value>,
    calls: BTreeMap<u64, Map<String, Value>>,
    logprobs: Option<Map<String, Value>>,
    finish: Value,
}

fn chat_assembled(events: &[Sse]) -> Value {
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(json_of).collect();
    let mut doc = chunks[0].as_object().unwrap().clone();
    doc.remove("choices");
    doc.remove("usage");
    doc.insert("object".into(), json!("chat.completion"));
    let mut choices: BTreeMap<u64, ChatChoice> = BTreeMap::new();
    let mut usage = Value::Null;
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        if !chunk["usage"].is_null() {
            usage = chunk["usage"].clone();
        }
        for c in chunk["choices"].as_array().unwrap() {
            let choice = choices.entry(c["index"].as_u64().unwrap()).or_default();
            for (key, value) in c["delta"].as_object().unwrap() {
                match (key.as_str(), value) {
                    ("tool_calls", Value::Array(calls)) => {
                        for call in calls {
                            let into = choice
                                .calls
                                .entry(call["index"].as_u64().unwrap())
                                .or_default();
                            for key in ["id", "type"] {
                                if let Some(v) = call.get(key) {
                                    into.insert(key.into(), v.clone());
                                }
                            }
                            let f = into.entry("function").or_insert(json!({}));
                            for key in ["name", "arguments"] {
                                if let Some(Value::String(piece)) = call["function"].get(key) {
                                    append(f.as_object_mut().unwrap(), key, piece);
                                }
                            }
                        }
                    }
                    ("role", role) => {
                        choice.message.insert("role".into(), role.clone());
                    }
                    (key, Value::String(text)) => append(&mut choice.message, key, text),
                    _ => {}
                }
            }
            if let Value::Object(lp) = &c["logprobs"] {
                let into = choice.logprobs.get_or_insert_with(Map::new);
                for (key, value) in lp {
                    match (into.get_mut(key), value) {
                        (Some(Value::Array(a)), Value::Array(more)) => a.extend(more.clone()),
                        _ => {
                            into.insert(key.clone(), value.clone());
                        }
                    }
                }
            }
            if !c["finish_reason"].is_null() {
                choice.finish = c["finish_reason"].clone();
            }
        }
    }
    let choices: Vec<Value> = choices
        .into_iter()
        .map(|(index, c)| {
            let mut message = c.message;
            for key in ["content", "refusal"] {
                message.entry(key).or_insert(Value::Null);
            }
            message.insert("annotations".into(), json!([]));
            if !c.calls.is_empty() {
                let calls = c.calls.into_values().map(Value::Object).collect();
                message.insert("tool_calls".into(), Value::Array(calls));
            }
            json!({"index": index, "message": message,
                "logprobs": c.logprobs.map_or(Value::Null, Value::Object),
                "finish_reason": c.finish})
        })
        .collect();
    doc.insert("choices".into(), Value::Array(choices));
    doc.insert("usage".into(), usage);
    Value::Object(doc)
}

fn messages_assembled(events: &[Sse]) -> Value {
    let mut message = Map::new();
    let mut blocks: BTreeMap<u64, Map<String, Value>> = BTreeMap::new();
    let mut json_input: BTreeMap<u64, String> = BTreeMap::new();
    for event in events {
        let data = json_of(event);
        assert_eq!(data["type"], event.event.as_deref().unwrap());
        let index = data["index"].as_u64().unwrap_or(0);
        match event.event.as_deref().unwrap() {
            "message_start" => message = data["message"].as_object().unwrap().clone(),
            "content_block_start" => {
                blocks.insert(index, data["content_block"].as_object().unwrap().clone());
            }
            "content_block_delta" => {
                let block = blocks.get_mut(&index).unwrap();
                let delta = &data["delta"];
                let (key, text) = match delta["type"].as_str().unwrap() {
                    "text_delta" => ("text", &delta["text"]),
                    "thinking_delta" => ("thinking", &delta["thinking"]),
                    "signature_delta" => ("signature", &delta["signature"]),
                    "input_json_delta" => {
                        let piece = delta["partial_json"].as_str().unwrap();
                        json_input.entry(index).or_default().push_str(piece);
                        continue;
                    }
                    other => panic!("unexpected delta {other}"),
                };
                append(block, key, text.as_str().unwrap());
            }
            "content_block_stop" => {
                if let Some(text) = json_input.remove(&index) {
                    let input = serde_json::from_str(&text).unwrap();
                    blocks
                        .get_mut(&index)
                        .unwrap()
                        .insert("input".into(), input);
                }
            }
            "message_delta" => {
                for (k, v) in data["delta"].as_object().unwrap() {
                    message.insert(k.clone(), v.clone());
                }
                let usage = message["usage"].as_object_mut().unwrap();
                for (k, v) in data["usage"].as_object().unwrap() {
                    usage.insert(k.clone(), v.clone());
                }
            }
            "ping" | "message_stop" => {}
            other => panic!("unexpected event {other}"),
        }
    }
    let content = blocks.into_values().map(Value::Object).collect();
    message.insert("content".into(), Value::Array(content));
    Value::Object(message)
}

/// The Responses stream, checked two ways: `response.completed` is the whole answer, and the
/// output items rebuilt from their deltas are its output.
fn responses_assembled(events: &[Sse]) -> Value {
    let mut items: BTreeMap<u64, Value> = BTreeMap::new();
    let mut completed = Value::Null;
    for (i, event) in events.iter().enumerate() {
        let data = json_of(event);
        assert_eq!(data["type"], event.event.as_deref().unwrap());
        assert_eq!(data["sequence_number"], i);
        let index = data["output_index"].as_u64().unwrap_or(0);
        let delta = data["delta"].as_str().unwrap_or_default();
        match event.event.as_deref().unwrap() {
            "response.output_item.added" => {
                items.insert(index, data["item"].clone());
            }
            "response.content_part.added" => {
                let parts = items.get_mut(&index).unwrap()["content"].as_array_mut();
                parts.unwrap().push(data["part"].clone());
            }
            "response.reasoning_summary_part.added" => {
                let parts = items.get_mut(&index).unwrap()["summary"].as_array_mut();
                parts.unwrap().push(data["part"].clone());
            }
            "response.output_text.delta" => {
                let item = items.get_mut(&index).unwrap();
                let part = &mut item["content"][data["content_index"].as_u64().unwrap() as usize];
                append(part.as_object_mut().unwrap(), "text", delta);
            }
            "response.reasoning_summary_text.delta" => {
                let item = items.get_mut(&index).unwrap();
                let part = &mut item["summary"][data["summary_index"].as_u64().unwrap() as usize];
                append(part.as_object_mut().unwrap(), "text", delta);
            }
            "response.function_call_arguments.delta" => {
                let item = items.get_mut(&index).unwrap().as_object_mut().unwrap();
                append(item, "arguments", delta);
            }
            "response.output_item.done" => {
                let item = items.get_mut(&index).unwrap();
                if item.get("status").is_some() {
                    item["status"] = data["item"]["status"].clone();
                }
                assert_eq!(*item, data["item"], "the deltas join into the item");
            }
            "response.completed" => completed = data["response"].clone(),
            _ => {}
        }
    }
    let output: Vec<Value> = items.into_values().collect();
    assert_eq!(completed["output"], json!(output));
    completed
}

const CHAT_PATH: &str = "/v1/chat/completions";

fn chat_body(extra: Value) -> Value {
    let mut body = json!({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test]
async fn chat_streams_what_it_answers_in_every_shape() {
    let fake = fake().await;
    let args = r#"{"city":"Paris","days":[1,2],"note":"ünï"}"#;
    type Case<'a> = (&'a str, Value, &'a [(&'a str, &'a str)]);
    let cases: [Case; 11] = [
        ("text", json!({}), &[]),
        (
            "parallel calls",
            json!({}),
            &[("x-fake-tool-call", "get_weather+get_time")],
        ),
        (
            "a preamble, then parallel calls with arguments",
            json!({}),
            &[
                ("x-fake-tool-call", "get_weather+get_time"),
                ("x-fake-tool-args", args),
                ("x-fake-tool-preamble", "2"),
            ],
        ),
        (
            "reasoning, a preamble and parallel calls in two choices",
            json!({"n": 2}),
            &[
                ("x-fake-reasoning", "1"),
                ("x-fake-tool-call", "f+g+h"),
                ("x-fake-tool-preamble", "2"),
            ],
        ),
        (
            "tool call",
            json!({}),
            &[("x-fake-tool-call", "get_weather")],
        ),
        (
            "tool call with arguments",
            json!({}),
            &[
                ("x-fake-tool-call", "get_weather"),
                ("x-fake-tool-args", args),
            ],
        ),
        ("n=2", json!({"n": 2}), &[]),
        (
            "logprobs",
            json!({"logprobs": true, "top_logprobs": 2}),
            &[],
        ),
        (
            "refusal with logprobs",
            json!({"logprobs": true}),
            &[("x-fake-refusal", "1")],
        ),
        ("reasoning", json!({}), &[("x-fake-reasoning", "2")]),
        (
            "reasoning, two choices, calls",
            json!({"n": 2}),
            &[("x-fake-reasoning", "2"), ("x-fake-tool-call", "f")],
        ),
    ];
    for (name, extra, headers) in cases {
        let (events, whole) = both(&fake, CHAT_PATH, chat_body(extra), headers).await;
        assert_eq!(chat_assembled(&events), whole, "{name}");
        assert_eq!(whole["id"], "chatcmpl-same", "{name}");
        assert_eq!(whole["created"], 1_700_000_000, "{name}");
    }
}

#[tokio::test]
async fn chat_shapes_say_what_was_asked_for() {
    let fake = fake().await;
    let doc = |text: String| serde_json::from_str::<Value>(&text).unwrap();
    let two = doc(ask(&fake, CHAT_PATH, &chat_body(json!({"n": 2})), &[]).await);
    assert_eq!(two["choices"][1]["index"], 1);
    assert_eq!(
        two["choices"][1]["message"]["content"],
        "tok1-1 tok2-1 tok3-1 "
    );
    assert_eq!(two["usage"]["completion_tokens"], 6);

    let body = chat_body(json!({"logprobs": true, "top_logprobs": 2}));
    let lp = doc(ask(&fake, CHAT_PATH, &body, &[]).await);
    let entries = lp["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[1]["token"], "tok2 ");
    assert_eq!(entries[1]["bytes"], json!(b"tok2 ".to_vec()));
    assert_eq!(entries[1]["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(entries[1]["top_logprobs"][0]["token"], "tok2 ");
    let plain = doc(ask(&fake, CHAT_PATH, &chat_body(json!({})), &[]).await);
    assert_eq!(plain["choices"][0]["logprobs"], Value::Null);

    let refusal = doc(ask(
        &fake,
        CHAT_PATH,
        &chat_body(json!({})),
        &[("x-fake-refusal", "1")],
    )
    .await);
    let message = &refusal["choices"][0]["message"];
    assert_eq!(message["content"], Value::Null);
    assert_eq!(message["refusal"], "tok1 tok2 tok3 ");

    let headers = [("x-fake-reasoning", "2")];
    let reasoning = doc(ask(&fake, CHAT_PATH, &chat_body(json!({})), &headers).await);
    let message = &reasoning["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "think1 think2 ");
    assert_eq!(message["content"], "tok1 tok2 tok3 ");
    assert_eq!(reasoning["usage"]["completion_tokens"], 5);
    assert_eq!(
        reasoning["usage"]["completion_tokens_details"]["reasoning_tokens"],
        2
    );

    // Without include_usage no chunk has a usage; with it, the last before [DONE] has it
    // and no choices, and every other says `"usage": null`.
    let stream = chat_body(json!({"stream": true}));
    let events = parse_sse(&ask(&fake, CHAT_PATH, &stream, &[]).await);
    assert!(events[..events.len() - 1]
        .iter()
        .all(|e| json_of(e).get("usage").is_none()));
    let stream = chat_body(json!({"stream": true, "stream_options": {"include_usage": true}}));
    let events = parse_sse(&ask(&fake, CHAT_PATH, &stream, &[]).await);
    let last = json_of(&events[events.len() - 2]);
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 3);
    assert!(json_of(&events[0])["usage"].is_null());

    // n=2 interleaves: choice 0's token, then choice 1's.
    let stream = chat_body(json!({"stream": true, "n": 2}));
    let events = parse_sse(&ask(&fake, CHAT_PATH, &stream, &[]).await);
    let indexes: Vec<u64> = events[..events.len() - 1]
        .iter()
        .map(|e| json_of(e)["choices"][0]["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
}

#[tokio::test]
async fn messages_stream_what_they_answer_in_every_shape() {
    let fake = fake().await;
    let body = json!({"model": "claude-test", "max_tokens": 64, "messages": []});
    let args = r#"{"city":"Paris"}"#;
    let cases: [(&str, &[(&str, &str)]); 8] = [
        ("text", &[]),
        ("tool_use", &[("x-fake-tool-call", "get_weather")]),
        (
            "parallel tool_use",
            &[("x-fake-tool-call", "get_weather+get_time")],
        ),
        (
            "text, then parallel tool_use",
            &[
                ("x-fake-tool-call", "get_weather+get_time"),
                ("x-fake-tool-preamble", "2"),
                ("x-fake-tool-args", args),
            ],
        ),
        (
            "thinking, text, then parallel tool_use with the input at the start",
            &[
                ("x-fake-reasoning", "2"),
                ("x-fake-tool-call", "f+g"),
                ("x-fake-tool-preamble", "1"),
                ("x-fake-chunks", "0"),
            ],
        ),
        (
            "tool_use with arguments",
            &[
                ("x-fake-tool-call", "get_weather"),
                ("x-fake-tool-args", args),
            ],
        ),
        ("thinking", &[("x-fake-reasoning", "2")]),
        (
            "thinking, then tool_use",
            &[("x-fake-reasoning", "2"), ("x-fake-tool-call", "f")],
        ),
    ];
    for (name, headers) in cases {
        let (events, whole) = both(&fake, "/v1/messages", body.clone(), headers).await;
        assert_eq!(messages_assembled(&events), whole, "{name}");
        assert_eq!(whole["id"], "msg_same", "{name}");
    }
    let headers = [("x-fake-reasoning", "2")];
    let (events, whole) = both(&fake, "/v1/messages", body, &headers).await;
    let names: Vec<_> = events.iter().map(|e| e.event.clone().unwrap()).collect();
    let expected = [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ];
    assert_eq!(names, expected);
    assert_eq!(json_of(&events[5])["delta"]["type"], "signature_delta");
    assert_eq!(
        whole["content"][0],
        json!({"type": "thinking", "thinking": "think1 think2 ",
            "signature": "fake-signature-same"})
    );
    assert_eq!(whole["content"][1]["text"], "tok1 tok2 tok3 ");
    assert_eq!(whole["usage"]["output_tokens"], 5);
}

#[tokio::test]
async fn responses_stream_what_they_answer_in_every_shape() {
    let fake = fake().await;
    let body = json!({"model": "gpt-test", "input": "hi", "instructions": "be brief"});
    let cases: [(&str, &[(&str, &str)]); 7] = [
        ("text", &[]),
        ("function_call", &[("x-fake-tool-call", "get_weather")]),
        (
            "parallel function_calls",
            &[("x-fake-tool-call", "get_weather+get_time")],
        ),
        (
            "a message, then parallel function_calls",
            &[
                ("x-fake-tool-call", "get_weather+get_time"),
                ("x-fake-tool-preamble", "2"),
            ],
        ),
        (
            "reasoning, a message, then three calls with arguments",
            &[
                ("x-fake-reasoning", "2"),
                ("x-fake-tool-call", "f+g+h"),
                ("x-fake-tool-preamble", "1"),
                ("x-fake-tool-args", r#"{"q":"x"}"#),
            ],
        ),
        ("reasoning", &[("x-fake-reasoning", "2")]),
        (
            "reasoning, then a call with arguments",
            &[
                ("x-fake-reasoning", "2"),
                ("x-fake-tool-call", "f"),
                ("x-fake-tool-args", r#"{"q":"x"}"#),
            ],
        ),
    ];
    for (name, headers) in cases {
        let (events, whole) = both(&fake, "/v1/responses", body.clone(), headers).await;
        assert_eq!(responses_assembled(&events), whole, "{name}");
        assert_eq!(whole["id"], "resp_same", "{name}");
        assert_eq!(whole["created_at"], 1_700_000_000, "{name}");
    }
    let headers = [("x-fake-reasoning", "2")];
    let (events, whole) = both(&fake, "/v1/responses", body, &headers).await;
    let names: Vec<_> = events.iter().map(|e| e.event.clone().unwrap()).collect();
    assert_eq!(
        names[2..8],
        [
            "response.output_item.added",
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_text.done",
            "response.reasoning_summary_part.done",
        ]
    );
    assert_eq!(
        whole["output"][0],
        json!({"id": "rs_same", "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "think1 think2 "}]})
    );
    assert_eq!(whole["output"][1]["content"][0]["text"], "tok1 tok2 tok3 ");
    assert_eq!(
        whole["usage"]["output_tokens_details"]["reasoning_tokens"],
        2
    );
}

/// A comma-separated `x-fake-tool-call` calls one turn per tool result the request already
/// holds, then answers text; one name (or one turn of parallel calls) is called every time.
/// A turn of parallel calls (`a+b`) is answered once the request holds a result for each.
#[tokio::test]
async fn tool_call_sequences_follow_the_tool_results() {
    let fake = fake().await;
    let called = |text: String, path: &str| -> Vec<String> {
        let v: Value = serde_json::from_str(&text).unwrap();
        let (list, name) = match path {
            CHAT_PATH => (&v["choices"][0]["message"]["tool_calls"], "/function/name"),
            "/v1/messages" => (&v["content"], "/name"),
            _ => (&v["output"], "/name"),
        };
        let list = list.as_array().map(Vec::as_slice).unwrap_or_default();
        list.iter()
            .filter_map(|call| call.pointer(name)?.as_str().map(str::to_owned))
            .collect()
    };
    let chat = |results: usize| {
        let mut messages = vec![json!({"role": "user", "content": "hi"})];
        for i in 0..results {
            messages.push(json!({"role": "assistant", "tool_calls": []}));
            messages.push(json!({"role": "tool", "tool_call_id": i.to_string(), "content": "ok"}));
        }
        json!({"model": "m", "messages": messages})
    };
    let messages = |results: usize| {
        let blocks: Vec<Value> = (0..results)
            .map(|i| json!({"type": "tool_result", "tool_use_id": i.to_string(), "content": "ok"}))
            .collect();
        json!({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": blocks}]})
    };
    let responses = |results: usize| {
        let mut input = vec![json!({"role": "user", "content": "hi"})];
        for i in 0..results {
            input.push(
                json!({"type": "function_call_output", "call_id": i.to_string(),
                "output": "ok"}),
            );
        }
        json!({"model": "m", "input": input})
    };
    let bodies: [(&str, &dyn Fn(usize) -> Value); 3] = [
        (CHAT_PATH, &chat),
        ("/v1/messages", &messages),
        ("/v1/responses", &responses),
    ];
    let scripts: [(&str, [&[&str]; 4]); 4] = [
        ("search,fetch", [&["search"], &["fetch"], &[], &[]]),
        ("search", [&["search"]; 4]),
        (
            "search+fetch,summarize",
            [
                &["search", "fetch"],
                &["search", "fetch"],
                &["summarize"],
                &[],
            ],
        ),
        ("search+fetch", [&["search", "fetch"]; 4]),
    ];
    for (path, body) in bodies {
        for (script, expected) in scripts {
            for (results, want) in expected.into_iter().enumerate() {
                let headers = [("x-fake-tool-call", script)];
                let text = ask(&fake, path, &body(results), &headers).await;
                assert_eq!(called(text, path), want, "{path} {script} after {results}");
            }
        }
    }
}

#[tokio::test]
async fn bad_request_parameters_are_rejected() {
    let fake = fake().await;
    for body in [
        json!({"n": 0}),
        json!({"n": "2"}),
        json!({"top_logprobs": 99}),
    ] {
        let response = h1()
            .request(post(
                &fake,
                CHAT_PATH,
                &chat_body(body.clone()).to_string(),
                &[],
            ))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{body}");
        let error: Value = serde_json::from_str(&text_of(response).await).unwrap();
        let key = body.as_object().unwrap().keys().next().unwrap().clone();
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(&key), "{message}");
    }
}
