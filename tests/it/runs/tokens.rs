//! Runs' token budget (`run_max_tokens`): reserved before each call, reconciled with the
//! usage after it, given back however the call ends, a stream past it cut, a document past
//! it delivered and counted, and what the run has left said on every answer. On both stores.

use super::*;

on_both_stores!(
    tokens_are_reserved_before_the_call_and_reconciled_after,
    a_call_without_a_body_reserves_no_tokens,
    a_reservation_comes_back_however_the_call_ends,
    a_stream_past_the_runs_tokens_is_cut,
    a_call_on_another_route_is_held_to_the_runs_tokens,
    a_document_past_the_runs_tokens_is_delivered_and_counted,
    a_stream_that_reports_no_usage_counts_its_prompt,
    an_assembled_answer_says_what_the_run_has_left_when_it_is_sent,
    an_unread_answer_counts_against_the_runs_tokens,
    a_documents_head_says_what_the_run_has_left_with_its_usage,
    a_call_that_asks_no_model_reserves_and_is_charged_nothing,
    a_token_refusal_names_large_numbers_exactly,
);

async fn tokens_are_reserved_before_the_call_and_reconciled_after(store: Store) {
    let (h, _keep) = harness(store).await;
    // Held open: its 60-token reservation stands while the second call asks for 60 more.
    let (first, _c1) = h
        .send(call(
            "/tokens",
            true,
            &[
                ("x-run-id", "tok"),
                ("x-fake-chunks", "2"),
                ("x-fake-interval-ms", "300"),
            ],
            "",
        ))
        .await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["x-run-tokens-left"], "40");
    let (second, _c2) = h
        .send(call("/tokens", false, &[("x-run-id", "tok")], ""))
        .await;
    assert_eq!(second.status(), 429);
    let body = json_body(second).await;
    assert_eq!(body["error"]["code"], "run_token_limit");
    crate::support::assert_message_starts(
        &body["error"],
        "run token limit: run \"tok\" has used 0 of its 100 tokens and calls in flight hold 60; this call would reserve 60",
    );
    // A call that asks for less fits beside it.
    let (third, _c3) = h
        .send(call(
            "/tokens",
            false,
            &[("x-run-id", "tok")],
            r#","max_tokens":30"#,
        ))
        .await;
    assert_eq!(third.status(), 200);
    json_body(third).await;
    read_body(first.into_body()).await;
    h.wait_requests("tokens", 3.0).await;
    // Each call's reservation became what it used (the fake reports its usage).
    let run = run_json(&h, "tok").await;
    let used = run["runs"][0]["used"]["tokens"].as_u64().unwrap();
    assert!(used > 0 && used < 60, "reconciled to what was used: {run}");
    assert_eq!(run["runs"][0]["used"]["tokens_reserved"], 0, "{run}");
    assert_eq!(run["runs"][0]["used"]["calls"], 2);
}

/// A call without a body (a stored response fetched, the models listed) generates nothing:
/// it reserves no tokens, so a run whose calls in flight hold its tokens still serves it.
async fn a_call_without_a_body_reserves_no_tokens(store: Store) {
    let (h, _keep) = harness(store).await;
    let (first, _c1) = h
        .send(call(
            "/tokens",
            true,
            &[
                ("x-run-id", "get"),
                ("x-fake-chunks", "2"),
                ("x-fake-interval-ms", "300"),
            ],
            "",
        ))
        .await;
    assert_eq!(first.headers()["x-run-tokens-left"], "40");
    let get = Request::get("/v1/responses/resp_1")
        .header("host", "gateway")
        .header("x-run-id", "get")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (resp, _c) = h.send(get).await;
    assert_ne!(resp.status(), 429);
    assert_eq!(resp.headers()["x-run-tokens-left"], "40");
    read_body(resp.into_body()).await;
    read_body(first.into_body()).await;
    let run = run_json(&h, "get").await;
    assert_eq!(run["runs"][0]["used"]["calls"], 2, "{run}");
    assert_eq!(run["runs"][0]["used"]["tokens_reserved"], 0, "{run}");
}

async fn a_reservation_comes_back_however_the_call_ends(store: Store) {
    let (h, _keep) = harness(store).await;
    let reserved = |run: &serde_json::Value| run["runs"][0]["used"]["tokens_reserved"].clone();
    // Completed.
    let (resp, _c) = h
        .send(call(
            "/tokens",
            false,
            &[("x-run-id", "ends")],
            r#","max_tokens":10"#,
        ))
        .await;
    json_body(resp).await;
    // The client leaves mid-stream.
    let (resp, c) = h
        .send(call(
            "/tokens",
            true,
            &[
                ("x-run-id", "ends"),
                ("x-fake-chunks", "50"),
                ("x-fake-interval-ms", "200"),
            ],
            r#","max_tokens":10"#,
        ))
        .await;
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    drop(body);
    c.close();
    // Cut by the idle limit (a frozen upstream).
    let (resp, _c) = h
        .send(call(
            "/tokens",
            true,
            &[
                ("x-run-id", "ends"),
                ("x-fake-freeze-after", "1"),
                ("x-request-budget-ms", "800"),
            ],
            r#","max_tokens":10"#,
        ))
        .await;
    let read = read_body(resp.into_body()).await;
    assert!(read.error_event().is_some());
    h.wait_requests("tokens", 3.0).await;
    let run = run_json(&h, "ends").await;
    assert_eq!(reserved(&run), 0, "{run}");
    assert_eq!(run["runs"][0]["used"]["in_flight"], 0);
    assert_eq!(run["runs"][0]["used"]["calls"], 3);
}

async fn a_stream_past_the_runs_tokens_is_cut(store: Store) {
    let (h, _keep) = harness(store).await;
    // Reserves 5 of the run's 100; the other 95 are free, so it may use 100 in all.
    let (resp, _c) = h
        .send(call(
            "/tokens",
            true,
            &[
                ("x-run-id", "spend"),
                ("x-fake-chunks", "400"),
                ("x-fake-interval-ms", "1"),
            ],
            r#","max_tokens":5"#,
        ))
        .await;
    let read = read_body(resp.into_body()).await;
    let error = read.error_event().expect("cut with why");
    assert_eq!(error["code"], "run_token_limit");
    crate::support::assert_message_starts(
        &error,
        "run token limit: run \"spend\" reached its 100 tokens",
    );
    h.wait_requests("tokens", 1.0).await;
    assert_eq!(
        h.metric("hourglass_cancellations_total{origin=\"run_tokens\",route=\"tokens\"}")
            .await,
        1.0
    );
}

/// The run's limits are the route's that started it: a call on a route without run keys
/// reserves its own `max_tokens` and is cut when the run's tokens run out.
async fn a_call_on_another_route_is_held_to_the_runs_tokens(store: Store) {
    let (h, _keep) = harness(store).await;
    let (resp, _c) = h
        .send(call(
            "/tokens",
            false,
            &[("x-run-id", "cross")],
            r#","max_tokens":5"#,
        ))
        .await;
    assert_eq!(resp.status(), 200);
    json_body(resp).await;
    let (resp, _c) = h
        .send(call(
            "/plain",
            true,
            &[
                ("x-run-id", "cross"),
                ("x-fake-chunks", "400"),
                ("x-fake-interval-ms", "1"),
            ],
            r#","max_tokens":5"#,
        ))
        .await;
    assert_eq!(resp.status(), 200, "reserved its own 5, not an estimate");
    let left: u64 = resp.headers()["x-run-tokens-left"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        left <= 90,
        "the run's tokens, less both reservations: {left}"
    );
    let read = read_body(resp.into_body()).await;
    let error = read.error_event().expect("cut with why");
    assert_eq!(error["code"], "run_token_limit", "{error}");
    h.wait_requests("plain", 1.0).await;
    assert_eq!(
        h.metric("hourglass_cancellations_total{origin=\"run_tokens\",route=\"plain\"}")
            .await,
        1.0
    );
    // Refused from now on, and counted as the run's route's refusal.
    let (resp, _c) = h
        .send(call("/plain", false, &[("x-run-id", "cross")], ""))
        .await;
    assert_eq!(resp.status(), 429);
    assert_eq!(json_body(resp).await["error"]["code"], "run_token_limit");
    assert_eq!(
        h.metric("hourglass_run_refusals_total{reason=\"tokens\",route=\"tokens\"}")
            .await,
        1.0
    );
}

/// A document's usage is read when it has all arrived, paid for: it is delivered whole, and
/// what it used counts against the run, which refuses the next call.
async fn a_document_past_the_runs_tokens_is_delivered_and_counted(store: Store) {
    let (h, _keep) = harness(store).await;
    let (resp, _c) = h
        .send(call(
            "/tokens",
            false,
            &[("x-run-id", "doc"), ("x-fake-chunks", "300")],
            r#","max_tokens":5"#,
        ))
        .await;
    assert_eq!(resp.status(), 200);
    let body = json_body(resp).await;
    assert!(
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("tok300"),
        "{body}"
    );
    h.wait_requests("tokens", 1.0).await;
    let run = run_json(&h, "doc").await;
    assert!(
        run["runs"][0]["used"]["tokens"].as_u64().unwrap() > 100,
        "{run}"
    );
    let used = run["runs"][0]["used"]["tokens"].as_u64().unwrap();
    // Every later call is refused, each told what it would have reserved (not what the
    // refusal that ended the run recorded).
    for (max, reserve) in [("", 60), (r#","max_tokens":10"#, 10)] {
        let (resp, _c) = h
            .send(call("/tokens", false, &[("x-run-id", "doc")], max))
            .await;
        assert_eq!(resp.status(), 429);
        let body = json_body(resp).await;
        assert_eq!(body["error"]["code"], "run_token_limit");
        crate::support::assert_message_starts(
            &body["error"],
            &format!(
                "run token limit: run \"doc\" has used {used} of its 100 tokens and calls in flight hold 0; this call would reserve {reserve}"
            ),
        );
    }
}

/// OpenAI's streams report no usage unless asked (`stream_options.include_usage`): the
/// prompt still counts, estimated from the request body (a token for every 4 bytes).
async fn a_stream_that_reports_no_usage_counts_its_prompt(store: Store) {
    let (h, _keep) = harness(store).await;
    let long = "word ".repeat(800);
    let (resp, _c) = h
        .send(call(
            "/wide",
            true,
            &[("x-run-id", "prompt"), ("x-fake-chunks", "3")],
            &format!(r#","max_tokens":10,"user":"{long}""#),
        ))
        .await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(read.error_event().is_none());
    h.wait_requests("wide", 1.0).await;
    let run = run_json(&h, "prompt").await;
    let used = run["runs"][0]["used"]["tokens"].as_u64().unwrap();
    assert!(
        (1000..1200).contains(&used),
        "4,000 bytes of prompt, 3 tokens: {run}"
    );
}

/// A client that does not stream, on a `stream_upstream` route, gets its head when the whole
/// answer has come: its `x-run-*` headers say what the run has left then, the time the
/// generation took spent and the call's reservation replaced by what it used, not what
/// admission saw.
async fn an_assembled_answer_says_what_the_run_has_left_when_it_is_sent(store: Store) {
    let (h, _keep) = harness(store).await;
    let headers = [
        ("x-run-id", "assembled-heads"),
        ("x-run-budget-ms", "20000"),
        ("x-fake-chunks", "5"),
        ("x-fake-interval-ms", "100"),
    ];
    let (resp, _c) = h.send(call("assembled", false, &headers, "")).await;
    assert_eq!(resp.status(), 200);
    let remaining = remaining_ms(&resp);
    assert!(
        remaining <= 19_600,
        "the generation's time is spent: {remaining}"
    );
    let left: u64 = resp.headers()["x-run-tokens-left"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let run = run_json(&h, "assembled-heads").await;
    assert_eq!(
        run["runs"][0]["left"]["tokens"],
        left,
        "the run, once the call is back: {run}; answer: {}",
        String::from_utf8_lossy(&body)
    );
    assert!(
        left > 99_000,
        "the 1000-token reservation is given back: {left}"
    );

    // So does an error answered in place of the document, after the upstream's head came:
    // here the call's budget ran out after some output.
    let cut = [
        ("x-run-id", "assembled-cut"),
        ("x-request-budget-ms", "700"),
        ("x-fake-chunks", "50"),
        ("x-fake-interval-ms", "100"),
    ];
    let (resp, _c) = h.send(call("assembled", false, &cut, "")).await;
    assert_eq!(resp.status(), 504);
    let left: u64 = resp.headers()["x-run-tokens-left"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "deadline_exceeded", "{body}");
    h.wait_requests("assembled", 2.0).await;
    let run = run_json(&h, "assembled-cut").await;
    assert_eq!(run["runs"][0]["left"]["tokens"], left, "{run}");
    assert!(left > 99_000, "{left}");
}

/// An answer the gateway does not read: `body` (SSE) from a hand-written upstream, sent
/// `encoding` when one is given.
fn unread_answer(body: &str, encoding: Option<&str>) -> Vec<(Duration, Vec<u8>)> {
    let coding = encoding.map_or_else(String::new, |c| format!("content-encoding: {c}\r\n"));
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n{coding}content-length: {}\r\n\
         connection: close\r\n\r\n",
        body.len()
    );
    vec![(Duration::ZERO, [head.as_bytes(), body.as_bytes()].concat())]
}

/// Audit DA 2: a call of a generation API whose answer is not read (encoded) was charged its
/// run 0 tokens, so `run_max_tokens` never stopped such a run; it is now charged a token for
/// every 4 bytes of request and answer. Audit EB F2: only such a call: legacy completions,
/// embeddings and Anthropic's count_tokens (free) are charged nothing.
async fn an_unread_answer_counts_against_the_runs_tokens(store: Store) {
    // 400 bytes of answer: 100 tokens.
    let answer = format!("data: {}\n\n", "x".repeat(392));
    assert_eq!(answer.len(), 400);
    let legacy = raw_upstream(unread_answer(&answer, None)).await;
    let gzip = raw_upstream(unread_answer(&answer, Some("gzip"))).await;
    let (redis, url) = run_store(store).await;
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[runs]
store = "{url}"

[upstreams.legacy]
url = "http://{legacy}"
auth = "none"

[upstreams.anthropic]
url = "http://{legacy}"
auth = "none"
api = "anthropic"

[upstreams.gzip]
url = "http://{gzip}"
auth = "none"

[[routes]]
name = "legacy"
path_prefix = "/v1/completions"
upstream = "legacy"
run_max_tokens = 300

[[routes]]
name = "embeddings"
path_prefix = "/v1/embeddings"
upstream = "legacy"
run_max_tokens = 300

[[routes]]
name = "count_tokens"
path_prefix = "/v1/messages/count_tokens"
upstream = "anthropic"
run_max_tokens = 300

[[routes]]
name = "gzip"
path_prefix = "/v1/chat/completions"
upstream = "gzip"
run_max_tokens = 300
"#
    );
    let h = Harness::with_config(&config).await;
    for (path, run, charged) in [
        ("/v1/completions", "legacy", false),
        ("/v1/embeddings", "embeddings", false),
        ("/v1/messages/count_tokens", "count_tokens", false),
        ("/v1/chat/completions", "gzip", true),
    ] {
        // 400 bytes of request: 100 tokens more.
        let body = format!(
            r#"{{"model":"m","stream":true,"max_tokens":50,"prompt":"{}"}}"#,
            "p".repeat(345)
        );
        assert_eq!(body.len(), 400);
        let request = || {
            Request::post(path)
                .header("host", "gateway")
                .header("content-type", "application/json")
                .header("accept-encoding", "gzip")
                .header("x-run-id", run)
                .body(Full::new(Bytes::from(body.clone())))
                .unwrap()
        };
        let (resp, _c) = h.send(request()).await;
        assert_eq!(resp.status(), 200, "{run}");
        assert_eq!(read_body(resp.into_body()).await.text(), answer);
        h.wait_requests(run, 1.0).await;
        let used = run_json(&h, run).await;
        let tokens = if charged { 200 } else { 0 };
        assert_eq!(used["runs"][0]["used"]["tokens"], tokens, "{run}: {used}");
        // 100 tokens left: the next call (reserving its `max_tokens`) goes, and leaves none.
        let (resp, _c) = h.send(request()).await;
        assert_eq!(resp.status(), 200, "{run}");
        read_body(resp.into_body()).await;
        h.wait_requests(run, 2.0).await;
        let (resp, _c) = h.send(request()).await;
        if charged {
            assert_eq!(resp.status(), 429, "{run}");
            assert_eq!(json_body(resp).await["error"]["code"], "run_token_limit");
        } else {
            assert_eq!(resp.status(), 200, "{run}");
            read_body(resp.into_body()).await;
            h.wait_requests(run, 3.0).await;
            let used = run_json(&h, run).await;
            assert_eq!(used["runs"][0]["used"]["tokens"], 0, "{run}: {used}");
        }
    }
    drop(redis);
}

fn tokens_left<B>(resp: &http::Response<B>) -> u64 {
    resp.headers()["x-run-tokens-left"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// A JSON document the client did not stream is read whole before its head goes out: the
/// head says what the run has left with what the call used, as `/runs` does once the call
/// is back. So does an error passed through, which uses none. Both said the call's whole
/// reservation was still held (audit IA 3: 2000 for a call that used 17 of 3000 tokens).
async fn a_documents_head_says_what_the_run_has_left_with_its_usage(store: Store) {
    let (h, _keep) = harness(store).await;
    let max = r#","max_tokens":1000"#;
    let (resp, _c) = h
        .send(call("wide", false, &[("x-run-id", "doc-head")], max))
        .await;
    assert_eq!(resp.status(), 200);
    let left = tokens_left(&resp);
    json_body(resp).await;
    let run = run_json(&h, "doc-head").await;
    assert_eq!(run["runs"][0]["left"]["tokens"], left, "{run}");
    assert!(
        left > 99_000,
        "the 1000-token reservation is given back: {left}"
    );

    let failed = [("x-run-id", "error-head"), ("x-fake-status", "503")];
    let (resp, _c) = h.send(call("wide", false, &failed, max)).await;
    assert_eq!(resp.status(), 503);
    let left = tokens_left(&resp);
    read_body(resp.into_body()).await;
    let run = run_json(&h, "error-head").await;
    assert_eq!(run["runs"][0]["left"]["tokens"], left, "{run}");
    assert_eq!(left, 100_000);
}

/// Audit PC 5: embeddings, moderations, file uploads and transcriptions were refused by
/// `run_max_tokens` ("would reserve 1024": the route's `run_token_estimate`), though nothing
/// ever charges them; on an `api = "openai"` upstream an embedding was also charged its
/// reported usage (5 tokens). A call that asks the model nothing (not a call of a generation
/// API, the classification loops use: audit MA 1) reserves and is charged nothing, on every
/// `api`; it still counts as a call of its run. A call of the model still reserves.
async fn a_call_that_asks_no_model_reserves_and_is_charged_nothing(store: Store) {
    let doc = r#"{"object":"list","data":[],"usage":{"prompt_tokens":5,"total_tokens":5}}"#;
    let up = raw_upstream(vec![(
        Duration::ZERO,
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{doc}",
            doc.len()
        )
        .into_bytes(),
    )])
    .await;
    let (redis, url) = run_store(store).await;
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[runs]
store = "{url}"

[upstreams.auto]
url = "http://{up}"
auth = "none"

[upstreams.openai]
url = "http://{up}"
auth = "none"
api = "openai"

[[routes]]
name = "openai"
path_prefix = "/o/v1"
upstream = "openai"
run_max_tokens = 1000
run_max_calls = 100

[[routes]]
name = "auto"
path_prefix = "/v1"
upstream = "auto"
run_max_tokens = 1000
run_max_calls = 100
"#
    );
    let h = Harness::with_config(&config).await;
    let json = "application/json";
    let multipart = "multipart/form-data; boundary=b";
    let upload = "--b\r\ncontent-disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nabc\r\n--b--\r\n";
    for (base, route) in [("", "auto"), ("/o", "openai")] {
        let run = format!("no-model{base}");
        for (path, kind, body) in [
            ("/v1/embeddings", json, r#"{"model":"e","input":"hi"}"#),
            ("/v1/moderations", json, r#"{"input":"hi"}"#),
            ("/v1/files", multipart, upload),
            ("/v1/audio/transcriptions", multipart, upload),
        ] {
            let req = Request::post(format!("{base}{path}"))
                .header("host", "gateway")
                .header("content-type", kind)
                .header("x-run-id", &run)
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            let (resp, _c) = h.send(req).await;
            assert_eq!(resp.status(), 200, "{base}{path}");
            assert_eq!(tokens_left(&resp), 1000, "{base}{path}");
            read_body(resp.into_body()).await;
        }
        h.wait_requests(route, 4.0).await;
        let used = run_json(&h, &run).await;
        assert_eq!(used["runs"][0]["used"]["tokens"], 0, "{run}: {used}");
        assert_eq!(used["runs"][0]["used"]["calls"], 4, "{run}: {used}");
        // A call of the model reserves its `max_tokens` as ever.
        let req = Request::post(format!("{base}/v1/chat/completions"))
            .header("host", "gateway")
            .header("content-type", json)
            .header("x-run-id", &run)
            .body(Full::new(Bytes::from_static(
                br#"{"model":"m","messages":[],"max_tokens":1001}"#,
            )))
            .unwrap();
        let (resp, _c) = h.send(req).await;
        assert_eq!(resp.status(), 429, "{run}");
        assert_eq!(json_body(resp).await["error"]["code"], "run_token_limit");
    }
    drop(redis);
}

/// Audit SF 2: a document's (and an assembled answer's) head, written once the answer is
/// complete, said what the run had left from what admission saw of the run's other calls:
/// five concurrent calls said 2100 ... 1700 tokens left, and `/runs` then 500. It says what the
/// run has left once this call is back, the other calls' ends since its admission counted, as
/// `GET /runs/{id}` shows. The memory store's (a Redis run's is read at admission only: see
/// docs/lifecycle.md).
#[tokio::test]
async fn a_documents_head_counts_what_the_runs_other_calls_used_meanwhile() {
    let (h, _keep) = harness(Store::Memory).await;
    let h = std::sync::Arc::new(h);
    let in_flight = |run: &serde_json::Value| run["runs"][0]["used"]["in_flight"].clone();
    for route in ["wide", "assembled"] {
        let id: &'static str = if route == "wide" {
            "meanwhile-doc"
        } else {
            "meanwhile-assembled"
        };
        let max = r#","max_tokens":100"#;
        let slow = tokio::spawn({
            let h = h.clone();
            async move {
                let headers = [("x-run-id", id), ("x-fake-ttft-ms", "1500")];
                let (resp, _c) = h.send(call(route, false, &headers, max)).await;
                assert_eq!(resp.status(), 200);
                let left = tokens_left(&resp);
                json_body(resp).await;
                left
            }
        });
        // Admitted first, it waits for its answer while another call of the run comes and
        // goes.
        let bound = Instant::now() + Duration::from_secs(5);
        while in_flight(&run_json_now(&h, id).await) != 1 {
            assert!(Instant::now() < bound, "{route}: the slow call never came");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (resp, _c) = h.send(call(route, false, &[("x-run-id", id)], max)).await;
        assert_eq!(resp.status(), 200);
        json_body(resp).await;
        let run = run_json_now(&h, id).await;
        assert_eq!(
            in_flight(&run),
            1,
            "{route}: the other's end is counted: {run}"
        );
        assert!(
            !slow.is_finished(),
            "{route}: the slow call is answered after the other's end"
        );
        let left = slow.await.unwrap();
        let run = run_json(&h, id).await;
        assert_eq!(run["runs"][0]["left"]["tokens"], left, "{route}: {run}");
    }
}

/// Audit WD 3: the Redis store wrote a refusal's numbers with Lua's `tostring` (14
/// significant digits) and read them back through an f64 cast to i64: a reservation of
/// 1234567890123456 read 1234567890123500, u64::MAX read i64::MAX. Both stores now name
/// the same exact numbers, a reservation past 2^53 - 1 (the most the Redis store's Lua
/// numbers hold exactly, and the most `run_max_tokens` may be) read as that.
async fn a_token_refusal_names_large_numbers_exactly(store: Store) {
    let (h, _keep) = harness(store).await;
    for (asked, reserves) in [
        ("1234567890123456", "1234567890123456"),
        ("123456789012345678", "9007199254740991"),
        ("1e20", "9007199254740991"),
    ] {
        let id = format!("big-{asked}");
        let extra = format!(r#","max_tokens":{asked}"#);
        let (resp, _c) = h
            .send(call("/tokens", false, &[("x-run-id", &id)], &extra))
            .await;
        assert_eq!(resp.status(), 429);
        let body = json_body(resp).await;
        crate::support::assert_message_starts(
            &body["error"],
            &format!(
                "run token limit: run \"{id}\" has used 0 of its 100 tokens and calls in flight hold 0; this call would reserve {reserves}"
            ),
        );
    }
}

/// Audit ZD 1: OpenAI's `POST /v1/responses/compact` is a model pass over the conversation
/// that reports its usage, but its path is below `/responses`, where a stored response is
/// read: it reserved nothing and was charged nothing (three compactions of 43,000 tokens each
/// left a run of 1,500 with 1,500), and no token metric counted it. It is read as a Responses
/// call: reserved, charged its reported usage, counted. Its count of input tokens
/// (`/responses/input_tokens`) still asks the model nothing.
#[tokio::test]
async fn a_compaction_is_charged_its_reported_usage() {
    let doc = r#"{"id":"cmp_1","object":"response.compaction","output":[],"usage":{"input_tokens":40000,"input_tokens_details":{"cached_tokens":30000},"output_tokens":3000,"output_tokens_details":{"reasoning_tokens":2000},"total_tokens":43000}}"#;
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{doc}",
        doc.len()
    );
    let up = raw_upstream(vec![(Duration::ZERO, answer.into_bytes())]).await;
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[upstreams.openai]
url = "http://{up}"
auth = "none"
api = "openai"

[[routes]]
name = "responses"
path_prefix = "/v1"
upstream = "openai"
run_max_tokens = 50000
run_token_estimate = 1000
"#
    );
    let h = Harness::with_config(&config).await;
    let call = |path: &str| {
        Request::post(path)
            .header("host", "gateway")
            .header("content-type", "application/json")
            .header("x-run-id", "compacting")
            .body(Full::new(Bytes::from_static(
                br#"{"model":"gpt-5.1","input":[{"role":"user","content":"a long conversation"}]}"#,
            )))
            .unwrap()
    };
    // A count of input tokens: no reservation, no charge.
    let (resp, _c) = h.send(call("/v1/responses/input_tokens")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(tokens_left(&resp), 50_000);
    read_body(resp.into_body()).await;
    // The compaction reserves the route's estimate ...
    let (resp, _c) = h.send(call("/v1/responses/compact")).await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    h.wait_requests("responses", 2.0).await;
    // ... and is charged what it reported.
    let run = run_json(&h, "compacting").await;
    assert_eq!(run["runs"][0]["used"]["tokens"], 43_000, "{run}");
    assert_eq!(run["runs"][0]["used"]["calls"], 2, "{run}");
    let prompt = h
        .metric(
            "hourglass_tokens_total{kind=\"prompt\",route=\"responses\",source=\"reported\",upstream=\"openai\"}",
        )
        .await;
    assert_eq!(prompt, 40_000.0);
    // The 7,000 left fit a second one's reservation; the third finds the run spent.
    let (resp, _c) = h.send(call("/v1/responses/compact")).await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    let (resp, _c) = h.send(call("/v1/responses/compact")).await;
    assert_eq!(resp.status(), 429, "the run's tokens are spent");
}
