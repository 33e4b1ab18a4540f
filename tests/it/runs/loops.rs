//! Runs' loop stop (`run_max_repeats`): the same tool calls the model answered with (OpenAI
//! `tool_calls`, Anthropic `tool_use`, the Responses API's function calls, streamed or not,
//! in parallel or not, in any order), or the same request sent again and again, stop the run;
//! other calls or other arguments are another answer. On both stores, as the rest.

use super::*;

on_both_stores!(
    the_same_tool_call_three_times_stops_the_run_naming_the_tool,
    the_same_parallel_calls_three_times_stop_the_run_naming_every_tool,
    other_parallel_calls_or_arguments_are_another_answer_and_another_order_is_not,
    the_same_request_sent_again_and_again_is_stopped_too,
    a_run_started_where_loops_stop_stops_repeats_on_every_route,
    calls_without_a_body_are_neither_repeats_nor_break_a_streak,
    a_loop_of_many_long_named_calls_keeps_and_names_a_bounded_part,
    distinct_chat_custom_tool_calls_are_no_loop,
    custom_and_legacy_calls_asked_again_and_again_stop_the_run,
    calls_that_ask_the_model_nothing_neither_break_nor_extend_a_streak,
);

async fn the_same_tool_call_three_times_stops_the_run_naming_the_tool(store: Store) {
    let (h, _keep) = harness(store).await;
    let tool = [("x-run-id", "loop1"), ("x-fake-tool-call", "get_weather")];
    // Streamed and not, the same call each time: key order and the stream's pieces differ,
    // the call does not.
    for stream in [true, false, true] {
        let (resp, _c) = h.send(call("/loops", stream, &tool, "")).await;
        assert_eq!(resp.status(), 200);
        read_body(resp.into_body()).await;
    }
    h.wait_requests("loops", 3.0).await;
    // Every answer's tool calls are counted (a shared store is told a moment later).
    run_json(&h, "loop1").await;
    let (resp, _c) = h.send(call("/loops", false, &tool, "")).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["x-should-retry"], "false");
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "run_loop_detected");
    crate::support::assert_message_starts(
        &body["error"],
        "run loop detected: run \"loop1\": the model asked for tool \"get_weather\" with the same arguments 3 times in a row",
    );
    assert_eq!(
        h.fake.requests().len(),
        3,
        "the fourth never reached the provider"
    );
    // A run whose answers change tool is not a loop (its requests differ, as an agent's
    // grow with each tool result).
    for n in 0..5 {
        let name = if n % 2 == 0 { "search" } else { "open" };
        let headers = [("x-run-id", "loop2"), ("x-fake-tool-call", name)];
        let turn = format!(r#","user":"turn {n}""#);
        let (resp, _c) = h.send(call("/loops", false, &headers, &turn)).await;
        assert_eq!(resp.status(), 200, "call {n}");
        read_body(resp.into_body()).await;
    }
}

/// A request of turn `n` of a run (each turn's body differs, as an agent's grows, so only
/// the answers can repeat) on `api`'s path.
fn turn(api: &str, n: usize, stream: bool, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let (path, body) = match api {
        "chat" => return call("/loops", stream, headers, &format!(r#","user":"turn {n}""#)),
        "messages" => (
            "/v1/messages",
            format!(
                r#"{{"model":"m","max_tokens":100,"stream":{stream},"messages":[{{"role":"user","content":"turn {n}"}}]}}"#
            ),
        ),
        _ => (
            "/v1/responses",
            format!(r#"{{"model":"m","stream":{stream},"input":"turn {n}"}}"#),
        ),
    };
    let mut b = Request::post(path)
        .header("host", "gateway")
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::from(body))).unwrap()
}

/// Two calls in one answer, after some text, asked for again and again: the answer's
/// fingerprint is both calls (names and arguments), on all three APIs, streamed or not; the
/// refusal names the first call's tool (the message names one tool, see `ToolCalls::canonical`).
async fn the_same_parallel_calls_three_times_stop_the_run_naming_every_tool(store: Store) {
    let (h, _keep) = harness(store).await;
    for (api, route) in [
        ("chat", "loops"),
        ("messages", "loops-messages"),
        ("responses", "loops-responses"),
    ] {
        let run = format!("par-{api}");
        let headers = [
            ("x-run-id", run.as_str()),
            ("x-fake-tool-call", "get_weather+get_time"),
            ("x-fake-tool-preamble", "2"),
            ("x-fake-interval-ms", "1"),
        ];
        for (n, stream) in [true, false, true].into_iter().enumerate() {
            let (resp, _c) = h.send(turn(api, n, stream, &headers)).await;
            assert_eq!(resp.status(), 200, "{api} call {n}");
            read_body(resp.into_body()).await;
        }
        h.wait_requests(route, 3.0).await;
        run_json(&h, &run).await;
        let before = h.fake.requests().len();
        let (resp, _c) = h.send(turn(api, 3, false, &headers)).await;
        assert_eq!(resp.status(), 429, "{api}");
        let body = json_body(resp).await;
        assert_eq!(body["error"]["code"], "run_loop_detected", "{api}");
        crate::support::assert_message_starts(
            &body["error"],
            &format!("run loop detected: run \"{run}\": the model asked for tools \"get_weather\" and \"get_time\" with the same arguments 3 times in a row"),
        );
        assert_eq!(h.fake.requests().len(), before, "{api}: never forwarded");
    }
}

/// The fingerprint is of the set of calls, with their arguments in canonical JSON: another
/// second call, or other arguments, are another answer (no loop in five calls), while the same
/// arguments with their keys reordered and spaced, or the same calls at swapped indexes (audit
/// KE 4: sampling reorders parallel calls), are the same answer.
async fn other_parallel_calls_or_arguments_are_another_answer_and_another_order_is_not(
    store: Store,
) {
    let (h, _keep) = harness(store).await;
    let paris = r#"{"city":"Paris","days":1}"#;
    let scripts: [(&str, [(&str, &str); 2]); 2] = [
        // The first call the same every time: the second counts too.
        (
            "second",
            [
                ("get_weather+get_time", paris),
                ("get_weather+get_news", paris),
            ],
        ),
        (
            "arguments",
            [
                ("get_weather+get_time", paris),
                ("get_weather+get_time", r#"{"city":"Rome","days":1}"#),
            ],
        ),
    ];
    for (run, alternate) in scripts {
        for n in 0..5 {
            let (calls, args) = alternate[n % 2];
            let headers = [
                ("x-run-id", run),
                ("x-fake-tool-call", calls),
                ("x-fake-tool-args", args),
            ];
            let (resp, _c) = h.send(turn("chat", n, n % 2 == 0, &headers)).await;
            assert_eq!(resp.status(), 200, "{run}: call {n}");
            read_body(resp.into_body()).await;
            // A shared store is told of a call's end a moment after the client saw it.
            run_json(&h, run).await;
        }
    }
    let spaced = r#"{ "days": 1, "city": "Paris" }"#;
    let alike: [(&str, [(&str, &str); 2]); 2] = [
        (
            "respaced",
            [
                ("get_weather+get_time", paris),
                ("get_weather+get_time", spaced),
            ],
        ),
        (
            "reordered",
            [
                ("get_weather+get_time", paris),
                ("get_time+get_weather", paris),
            ],
        ),
    ];
    for (run, alternate) in alike {
        for n in 0..3 {
            let (calls, args) = alternate[n % 2];
            let headers = [
                ("x-run-id", run),
                ("x-fake-tool-call", calls),
                ("x-fake-tool-args", args),
            ];
            let (resp, _c) = h.send(turn("chat", n, n % 2 == 1, &headers)).await;
            assert_eq!(resp.status(), 200, "{run}: call {n}");
            read_body(resp.into_body()).await;
            run_json(&h, run).await;
        }
        let headers = [("x-run-id", run), ("x-fake-tool-call", "get_weather")];
        let (resp, _c) = h.send(turn("chat", 3, false, &headers)).await;
        assert_eq!(resp.status(), 429, "{run}");
        assert_eq!(
            json_body(resp).await["error"]["code"],
            "run_loop_detected",
            "{run}"
        );
    }
}

async fn the_same_request_sent_again_and_again_is_stopped_too(store: Store) {
    let (h, _keep) = harness(store).await;
    for _ in 0..3 {
        let (resp, _c) = h
            .send(call("/loops", false, &[("x-run-id", "again")], ""))
            .await;
        assert_eq!(resp.status(), 200);
        json_body(resp).await;
        // A shared store is told of a call's end a moment after the client saw it.
        run_json(&h, "again").await;
    }
    let (resp, _c) = h
        .send(call("/loops", false, &[("x-run-id", "again")], ""))
        .await;
    assert_eq!(resp.status(), 429);
    let body = json_body(resp).await;
    crate::support::assert_message_starts(
        &body["error"],
        "run loop detected: run \"again\": the same request came 3 times in a row",
    );
}

/// A run keeps the limits of the route that started it, its loop stop too: the same request
/// sent again and again on a route without `run_max_repeats` is stopped as on its own.
async fn a_run_started_where_loops_stop_stops_repeats_on_every_route(store: Store) {
    let (h, _keep) = harness(store).await;
    let (resp, _c) = h
        .send(call("/loops", false, &[("x-run-id", "elsewhere")], ""))
        .await;
    assert_eq!(resp.status(), 200);
    json_body(resp).await;
    run_json(&h, "elsewhere").await;
    for _ in 0..3 {
        let (resp, _c) = h
            .send(call("/plain", false, &[("x-run-id", "elsewhere")], ""))
            .await;
        assert_eq!(resp.status(), 200);
        json_body(resp).await;
        run_json(&h, "elsewhere").await;
    }
    let (resp, _c) = h
        .send(call("/plain", false, &[("x-run-id", "elsewhere")], ""))
        .await;
    assert_eq!(resp.status(), 429);
    let body = json_body(resp).await;
    crate::support::assert_message_starts(
        &body["error"],
        "run loop detected: run \"elsewhere\": the same request came 3 times in a row",
    );
}

/// A call without a body (polling a stored response, listing models) asks the model for
/// nothing: it is neither the same request again (every such call would be, whatever its
/// path), nor an answer that breaks a streak of the same tool call.
async fn calls_without_a_body_are_neither_repeats_nor_break_a_streak(store: Store) {
    let (h, _keep) = harness(store).await;
    let tool = [("x-run-id", "poll"), ("x-fake-tool-call", "get_weather")];
    for n in 0..2 {
        let (resp, _c) = h.send(turn("chat", n, false, &tool)).await;
        assert_eq!(resp.status(), 200, "call {n}");
        json_body(resp).await;
    }
    for path in [
        "/v1/responses/resp_1",
        "/v1/responses/resp_1",
        "/v1/responses/resp_2",
        "/v1/responses/resp_1",
        "/v1/responses/resp_3",
    ] {
        let get = Request::get(path)
            .header("host", "gateway")
            .header("x-run-id", "poll")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let (resp, _c) = h.send(get).await;
        assert_ne!(resp.status(), 429, "GET {path} is no repeat");
        read_body(resp.into_body()).await;
        run_json(&h, "poll").await;
    }
    // The streak of the same tool call went on through the polls.
    let (resp, _c) = h.send(turn("chat", 2, false, &tool)).await;
    assert_eq!(resp.status(), 200);
    json_body(resp).await;
    h.wait_requests("loops", 3.0).await;
    run_json(&h, "poll").await;
    let (resp, _c) = h.send(turn("chat", 3, false, &tool)).await;
    assert_eq!(resp.status(), 429);
    let body = json_body(resp).await;
    crate::support::assert_message_starts(
        &body["error"],
        "run loop detected: run \"poll\": the model asked for tool \"get_weather\" with the same arguments 3 times in a row",
    );
}

/// 100 parallel calls with 64-character names, three times (audit DD F3: every run kept all
/// the names, 26 KB for 400, in memory and in Redis, and the refusal repeated them): the run
/// keeps, and the refusal names, the first few and how many more.
async fn a_loop_of_many_long_named_calls_keeps_and_names_a_bounded_part(store: Store) {
    let (h, keep) = harness(store).await;
    let names: Vec<String> = (0..100)
        .map(|i| format!("{i:03}{}", "n".repeat(61)))
        .collect();
    let calls = names.join("+");
    let headers = [
        ("x-run-id", "many"),
        ("x-fake-tool-call", calls.as_str()),
        ("x-fake-interval-ms", "0"),
    ];
    for stream in [true, false, true] {
        let (resp, _c) = h.send(call("/loops", stream, &headers, "")).await;
        assert_eq!(resp.status(), 200);
        read_body(resp.into_body()).await;
    }
    h.wait_requests("loops", 3.0).await;
    let run = run_json(&h, "many").await;
    let kept = run["runs"][0]["repeats"]["answer"]["tool"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(kept.len() <= 200, "{}", kept.len());
    assert!(kept.starts_with(&names[0]), "{kept}");
    if let Some(redis) = &keep.1 {
        let stored = redis.query("HSTRLEN hg:{-/many} ans_tool").await;
        let stored: usize = stored.trim_start_matches(':').parse().unwrap();
        assert!(stored > 0 && stored <= 200, "{stored}");
    }
    let (resp, _c) = h.send(call("/loops", false, &headers, "")).await;
    assert_eq!(resp.status(), 429);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "run_loop_detected");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.len() < 600, "{}", message.len());
    assert!(
        message.contains(&format!("\"{}\", \"{}\" and 98 more", names[0], names[1])),
        "{message}"
    );
}

/// An upstream written by hand that answers its n-th connection with `answers[n]` (the last
/// one ever after): each a whole HTTP/1.1 answer of `content_type`, closing the connection.
async fn answers_in_turn(content_type: &str, answers: Vec<String>) -> std::net::SocketAddr {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answers: Vec<Vec<u8>> = answers
        .into_iter()
        .map(|body| {
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        })
        .collect();
    let next = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let n = next.fetch_add(1, Ordering::SeqCst).min(answers.len() - 1);
            let answer = answers[n].clone();
            tokio::spawn(async move {
                crate::support::read_request(&mut s).await;
                let _ = s.write_all(&answer).await;
            });
        }
    });
    addr
}

/// The gateway on `store` with one route (`path`, `run_max_repeats = 3`) to `upstream`.
async fn one_route(store: Store, upstream: std::net::SocketAddr, path: &str) -> (Harness, Keep) {
    let (redis, url) = run_store(store).await;
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[runs]
store = "{url}"

[upstreams.up]
url = "http://{upstream}"
auth = "none"

[[routes]]
name = "up"
path_prefix = "{path}"
upstream = "up"
run_max_repeats = 3
"#
    );
    (Harness::with_config(&config).await, redis)
}

type Keep = Option<RedisServer>;

/// Sends `body` to `path` as run `run` `n` times (waiting for each call to be counted), and
/// gives back the statuses.
async fn statuses(h: &Harness, path: &str, run: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for i in 0..n {
        let body = format!(r#"{{"model":"m","input":"turn {i}","messages":[]}}"#);
        let req = Request::post(path)
            .header("host", "gateway")
            .header("content-type", "application/json")
            .header("x-run-id", run)
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let (resp, _c) = h.send(req).await;
        out.push(resp.status().as_u16());
        read_body(resp.into_body()).await;
        if out.last() == Some(&200) {
            h.wait_requests("up", (i + 1) as f64).await;
            run_json(h, run).await;
        }
    }
    out
}

/// Audit GB 1: GPT-5 custom tool calls in Chat Completions (`custom`, no `function`) were all
/// tool `""` with arguments `""`: three distinct calls ended the run as a loop. Distinct
/// inputs are distinct calls; the same input is still a repeat.
async fn distinct_chat_custom_tool_calls_are_no_loop(store: Store) {
    let custom = |input: &str| {
        format!(
            r#"{{"id":"c","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":null,"tool_calls":[{{"id":"call_{input}","type":"custom","custom":{{"name":"code_exec","input":"print({input})"}}}}]}},"finish_reason":"tool_calls"}}]}}"#
        )
    };
    let distinct = answers_in_turn(
        "application/json",
        (0..4).map(|i| custom(&i.to_string())).collect(),
    )
    .await;
    let (h, _keep) = one_route(store, distinct, "/v1/chat/completions").await;
    assert_eq!(
        statuses(&h, "/v1/chat/completions", "k1", 4).await,
        [200; 4]
    );
    let same = answers_in_turn("application/json", vec![custom("7")]).await;
    let (h, _keep) = one_route(store, same, "/v1/chat/completions").await;
    assert_eq!(
        statuses(&h, "/v1/chat/completions", "k2", 4).await,
        [200, 200, 200, 429]
    );
}

/// Audit GB 5: a Responses custom tool call (`custom_tool_call`) and a Chat legacy
/// `function_call`, the same one answered again and again, were never seen: four calls, four
/// 200s. The fourth is now refused, as for any other call.
async fn custom_and_legacy_calls_asked_again_and_again_stop_the_run(store: Store) {
    let custom = r#"{"id":"r","object":"response","status":"completed","output":[{"type":"custom_tool_call","id":"ctc_1","call_id":"call_1","name":"code_exec","input":"print(0)"}]}"#;
    let legacy = r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":null,"function_call":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},"finish_reason":"function_call"}]}"#;
    for (path, answer) in [("/v1/responses", custom), ("/v1/chat/completions", legacy)] {
        let up = answers_in_turn("application/json", vec![answer.to_owned()]).await;
        let (h, _keep) = one_route(store, up, path).await;
        assert_eq!(
            statuses(&h, path, "k3", 4).await,
            [200, 200, 200, 429],
            "{path}"
        );
    }
}

/// Audit MA 1: an agent whose tool embeds its input, or counts its tokens, between steps (the
/// same tool call each step) was never stopped: the embeddings or count_tokens answer, which
/// has no tool call, broke the streak, and the run went on to `run_max_calls`. A call that is
/// no call of a model's API asks the model nothing: like a call without a body, it neither
/// breaks the streak nor extends it, and it is a call of its run.
async fn calls_that_ask_the_model_nothing_neither_break_nor_extend_a_streak(store: Store) {
    let embedding = r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":"e","usage":{"prompt_tokens":3,"total_tokens":3}}"#;
    let side = answers_in_turn("application/json", vec![embedding.to_owned()]).await;
    let count = answers_in_turn("application/json", vec![r#"{"input_tokens":12}"#.into()]).await;
    let (redis, url) = run_store(store).await;
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[runs]
store = "{url}"

[upstreams.fake]
url = "{{FAKE}}"
auth = "none"

[upstreams.side]
url = "http://{side}"
auth = "none"

[upstreams.count]
url = "http://{count}"
auth = "none"
api = "anthropic"

[[routes]]
name = "embeddings"
path_prefix = "/v1/embeddings"
upstream = "side"

[[routes]]
name = "count_tokens"
path_prefix = "/v1/messages/count_tokens"
upstream = "count"

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "fake"
run_max_repeats = 3
run_max_calls = 40

[[routes]]
name = "messages"
path_prefix = "/v1/messages"
upstream = "fake"
run_max_repeats = 3
run_max_calls = 40
"#
    );
    let h = Harness::with_config(&config).await;
    let _keep = redis;
    let post = |path: &str, run: &str, body: String| {
        Request::post(path)
            .header("host", "gateway")
            .header("content-type", "application/json")
            .header("x-run-id", run)
            .header("x-fake-tool-call", "search")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    let embed = |run: &str, n: usize| {
        post(
            "/v1/embeddings",
            run,
            format!(r#"{{"model":"e","input":"step {n}"}}"#),
        )
    };
    let count_tokens = |run: &str, n: usize| {
        post(
            "/v1/messages/count_tokens",
            run,
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"step {n}"}}]}}"#),
        )
    };
    for (api, path) in [
        ("chat", "/v1/chat/completions"),
        ("messages", "/v1/messages"),
    ] {
        let run = format!("side-{api}");
        let step = |n: usize| {
            let body = if api == "chat" {
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"step {n}"}}]}}"#)
            } else {
                format!(
                    r#"{{"model":"m","max_tokens":100,"messages":[{{"role":"user","content":"step {n}"}}]}}"#
                )
            };
            post(path, &run, body)
        };
        // Each step: the model asks for the same tool call, and the tool embeds, then counts
        // its tokens (twice), between the model's answers.
        for n in 0..3 {
            let (resp, _c) = h.send(step(n)).await;
            assert_eq!(resp.status(), 200, "{api}: step {n}");
            read_body(resp.into_body()).await;
            // A shared store is told of a call's end a moment after the client saw it.
            run_json(&h, &run).await;
            if n == 2 {
                break;
            }
            for side in [embed(&run, n), count_tokens(&run, n), count_tokens(&run, n)] {
                let (resp, _c) = h.send(side).await;
                assert_eq!(resp.status(), 200, "{api}: side call of step {n}");
                read_body(resp.into_body()).await;
                let state = run_json(&h, &run).await;
                let answer = &state["runs"][0]["repeats"]["answer"];
                assert_eq!(answer["count"], n + 1, "{api}: {state}");
            }
        }
        let state = run_json(&h, &run).await;
        let runs = &state["runs"][0];
        // Side calls are calls of their run.
        assert_eq!(runs["used"]["calls"], 9, "{api}: {state}");
        assert_eq!(runs["repeats"]["answer"]["count"], 3, "{api}: {state}");
        // The run's next call is refused, whatever it is: the tool's embedding as the
        // model's next step.
        let before = h.fake.requests().len();
        for next in [embed(&run, 2), step(3)] {
            let (resp, _c) = h.send(next).await;
            assert_eq!(resp.status(), 429, "{api}");
            let body = json_body(resp).await;
            crate::support::assert_message_starts(
                &body["error"],
                &format!("run loop detected: run \"{run}\": the model asked for tool \"search\" with the same arguments 3 times in a row"),
            );
        }
        assert_eq!(h.fake.requests().len(), before, "{api}: never forwarded");
    }
}

/// Audit ZB 5: a partial answer (`partial_answers`, cut by the idle limit) hands out the
/// whole tool calls it holds, which an agent may run: the same whole call in answer after
/// answer is a loop, stopped at the fourth call as with whole answers. The call the cut left
/// half-written, dropped from the document, is no part of the answer; a partial answer that
/// hands out no call leaves the streak as it was.
#[tokio::test]
async fn whole_calls_in_partial_answers_count_toward_the_loop_stop() {
    let (_redis, url) = run_store(Store::Memory).await;
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[runs]
store = "{url}"

[upstreams.fake]
url = "{{FAKE}}"
auth = "none"

[[routes]]
name = "partial"
path_prefix = "/v1/chat/completions"
upstream = "fake"
stream_upstream = true
partial_answers = true
idle_timeout = "300ms"
run_max_repeats = 3
"#
    );
    let h = Harness::with_config(&config).await;
    // A word, then two parallel calls of two pieces each; silent one piece into the second
    // (after 4 content events), or into the first (after 2).
    let send = |run: &'static str, n: usize, freeze: &'static str| {
        let h = &h;
        async move {
            let headers = [
                ("x-run-id", run),
                ("x-fake-tool-call", "get_weather+get_time"),
                ("x-fake-tool-args", r#"{"city":"Paris"}"#),
                ("x-fake-chunks", "2"),
                ("x-fake-tool-preamble", "1"),
                ("x-fake-freeze-after", freeze),
            ];
            let turn = format!(r#","user":"turn {n}""#);
            let (resp, _c) = h.send(call("/partial", false, &headers, &turn)).await;
            let status = resp.status().as_u16();
            let partial = resp.headers().get("x-hourglass-partial").cloned();
            let body = json_body(resp).await;
            (status, partial, body)
        }
    };
    let mut seen = 0.0;
    for n in 0..3 {
        let (status, partial, body) = send("handed", n, "4").await;
        assert_eq!(status, 200, "call {n}: {body}");
        assert_eq!(partial.unwrap(), "idle_timeout");
        let calls = &body["choices"][0]["message"]["tool_calls"];
        assert_eq!(calls.as_array().map(Vec::len), Some(1), "{body}");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        seen += 1.0;
        h.wait_requests("partial", seen).await;
        run_json(&h, "handed").await;
    }
    let (status, _, body) = send("handed", 3, "4").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "run_loop_detected");
    // Cut inside the first call: its text alone is handed out, no call, and no streak.
    for n in 0..4 {
        let (status, partial, body) = send("nothing", n, "2").await;
        assert_eq!(status, 200, "call {n}: {body}");
        assert_eq!(partial.unwrap(), "idle_timeout");
        let message = &body["choices"][0]["message"];
        assert!(message.get("tool_calls").is_none(), "{body}");
        seen += 1.0;
        h.wait_requests("partial", seen).await;
        run_json(&h, "nothing").await;
    }
}
