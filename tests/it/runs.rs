//! Runs end to end: one budget, a call limit, a token budget and a loop stop across the calls
//! that carry one run id, against the fake provider over loopback. Every test runs twice,
//! once on each run store (`memory`, and `redis` on a real redis-server): the same suite
//! holds both to the same rules.

use std::time::Duration;

use crate::support::redis::RedisServer;
use crate::support::{json_body, raw_upstream, read_body, Harness};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;

const CONFIG: &str = r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[runs]
store = "{STORE}"
store_timeout = "2s"

[defaults]
budget = "10s"
max_budget = "30s"
connect_timeout = "500ms"
first_token_timeout = "5s"
idle_timeout = "5s"

[upstreams.fake]
url = "{FAKE}"
auth = "none"

# Known to take a second to its first token: no attempt fits less.
[upstreams.slow]
url = "{FAKE}"
auth = "none"
expected_first_token = "1s"

[[routes]]
name = "calls"
path_prefix = "/v1/chat/completions"
models = ["calls"]
upstream = "fake"
run_max_calls = 10

[[routes]]
name = "loops"
path_prefix = "/v1/chat/completions"
models = ["loops"]
upstream = "fake"
run_max_repeats = 3

# The same loop stop for the other two APIs (every model: no other route takes their paths).
[[routes]]
name = "loops-messages"
path_prefix = "/v1/messages"
upstream = "fake"
run_max_repeats = 3

[[routes]]
name = "loops-responses"
path_prefix = "/v1/responses"
upstream = "fake"
run_max_repeats = 3

[[routes]]
name = "tokens"
path_prefix = "/v1/chat/completions"
models = ["tokens"]
upstream = "fake"
run_max_tokens = 100
run_token_estimate = 60

# No run limits of its own: a call of a run started elsewhere is held to that run's.
# One call at a time: the rest wait for the slot, or are refused.
[[routes]]
name = "busy"
path_prefix = "/v1/chat/completions"
models = ["busy"]
upstream = "fake"
max_in_flight = 1
run_max_calls = 10
run_max_tokens = 100000
run_token_estimate = 100

# One call at a time, and two calls a run.
[[routes]]
name = "scarce"
path_prefix = "/v1/chat/completions"
models = ["scarce"]
upstream = "fake"
max_in_flight = 1
run_max_calls = 2

[[routes]]
name = "plain"
path_prefix = "/v1/chat/completions"
models = ["plain"]
upstream = "fake"

[[routes]]
name = "wide"
path_prefix = "/v1/chat/completions"
models = ["wide"]
upstream = "fake"
run_max_tokens = 100000

# Streams upstream for clients that do not: the answer's head goes out at its end.
[[routes]]
name = "assembled"
path_prefix = "/v1/chat/completions"
models = ["assembled"]
upstream = "fake"
stream_upstream = true
run_max_tokens = 100000
run_token_estimate = 1000
run_max_budget = "30s"

[[routes]]
name = "timed"
path_prefix = "/v1/chat/completions"
models = ["timed"]
upstream = "fake"
run_budget = "1500ms"
run_max_budget = "3s"

[[routes]]
name = "slow"
path_prefix = "/v1/chat/completions"
models = ["slow"]
upstream = "slow"
run_budget = "600ms"

[[routes]]
name = "ceiling"
path_prefix = "/v1/chat/completions"
models = ["ceiling"]
upstream = "fake"
run_max_budget = "3s"

[[routes]]
name = "traced"
path_prefix = "/v1/chat/completions"
models = ["traced"]
upstream = "fake"
run_id_header = "traceparent"
run_max_calls = 1

[[routes]]
name = "keyed"
path_prefix = "/v1/chat/completions"
models = ["keyed"]
upstream = "fake"
run_max_calls = 1
client_keys_file = "{KEYS}"
"#;

const KEY_A: &str = "hg-run-key-aaaaaaaaaaaa";
const KEY_B: &str = "hg-run-key-bbbbbbbbbbbb";

#[derive(Clone, Copy)]
enum Store {
    Memory,
    Redis,
}

/// The gateway on `store`; what the test must keep alive with it (the keys, a redis-server).
/// The run store `store` names: a Redis server of its own (kept while it is held), and the
/// `store` URL of the config.
async fn run_store(store: Store) -> (Option<RedisServer>, String) {
    let redis = match store {
        Store::Memory => None,
        Store::Redis => Some(RedisServer::start().await),
    };
    let url = redis
        .as_ref()
        .map_or_else(|| "memory".to_owned(), RedisServer::url);
    (redis, url)
}

async fn harness(store: Store) -> (Harness, (tempfile::TempDir, Option<RedisServer>)) {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, format!("{KEY_A}\n{KEY_B}\n")).unwrap();
    let (redis, url) = run_store(store).await;
    let config = CONFIG
        .replace("{KEYS}", keys.to_str().unwrap())
        .replace("{STORE}", &url);
    (Harness::with_config(&config).await, (dir, redis))
}

/// Each named case, as a test on each store.
macro_rules! on_both_stores {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test]
            async fn $case() {
                super::$case(super::Store::Memory).await
            })*
        }
        mod redis {
            $(#[tokio::test]
            async fn $case() {
                if crate::support::redis::skip() {
                    return;
                }
                super::$case(super::Store::Redis).await
            })*
        }
    };
}

on_both_stores!(
    fifty_concurrent_calls_of_a_run_with_ten_calls_get_exactly_ten_upstream,
    tokens_are_reserved_before_the_call_and_reconciled_after,
    the_run_deadline_cuts_a_stream_and_shrinks_every_calls_budget,
    a_client_run_budget_may_only_shorten_the_run,
    a_run_too_short_for_any_attempt_is_refused_as_the_runs_deadline,
    bad_run_headers_are_refused_and_never_forwarded,
    a_traceparent_names_the_run,
    one_clients_run_is_never_anothers,
    a_reservation_comes_back_however_the_call_ends,
    a_stream_past_the_runs_tokens_is_cut,
    a_request_without_a_run_id_is_in_no_run,
    a_call_on_another_route_is_held_to_the_runs_tokens,
    a_document_past_the_runs_tokens_is_delivered_and_counted,
    a_stream_that_reports_no_usage_counts_its_prompt,
    a_request_retried_after_a_failure_is_not_a_repeat,
    a_run_is_found_by_its_exact_id,
    an_assembled_answer_says_what_the_run_has_left_when_it_is_sent,
    a_call_that_never_reached_an_upstream_is_no_call_of_its_run,
    a_run_refused_past_its_deadline_lasted_its_budget,
    a_later_deadline_refusal_says_what_is_left_now,
    a_call_without_a_body_reserves_no_tokens,
    a_call_limit_reached_only_by_calls_given_back_ends_no_run,
    an_unread_answer_counts_against_the_runs_tokens,
    a_documents_head_says_what_the_run_has_left_with_its_usage,
    a_run_budget_past_a_year_is_a_year,
);

/// The loop stop: the same tool calls, or the same request, again and again.
mod loops;

/// A Chat Completions request to the route `route` (each route takes one model).
fn call(route: &str, stream: bool, headers: &[(&str, &str)], extra: &str) -> Request<Full<Bytes>> {
    let model = route.trim_start_matches('/');
    let body = format!(
        r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#
    );
    let mut b = Request::post("/v1/chat/completions")
        .header("host", "gateway")
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::from(body))).unwrap()
}

/// `GET /runs/{id}` once no call of the run is in flight any more: a shared store is told of
/// a call's end a moment after the client saw it.
async fn run_json(h: &Harness, id: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let run = run_json_now(h, id).await;
        let settled = run["runs"]
            .as_array()
            .is_some_and(|r| r.iter().all(|r| r["used"]["in_flight"] == 0));
        if settled || Instant::now() > deadline {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn run_json_now(h: &Harness, id: &str) -> serde_json::Value {
    let text = crate::support::admin_get(h.gw.admin_addr, &format!("/runs/{id}")).await;
    serde_json::from_str(&text).unwrap()
}

/// What the answer says the run has left, in ms.
fn remaining_ms<B>(resp: &http::Response<B>) -> u64 {
    resp.headers()["x-run-remaining-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

async fn fifty_concurrent_calls_of_a_run_with_ten_calls_get_exactly_ten_upstream(store: Store) {
    let (h, _keep) = harness(store).await;
    let h = std::sync::Arc::new(h);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move {
                let (resp, _c) = h
                    .send(call("/calls", false, &[("x-run-id", "r50")], ""))
                    .await;
                let status = resp.status().as_u16();
                let retry = resp
                    .headers()
                    .get("x-should-retry")
                    .map(|v| v.to_str().unwrap().to_owned());
                let left = resp
                    .headers()
                    .get("x-run-calls-left")
                    .map(|v| v.to_str().unwrap().parse::<u32>().unwrap());
                let body = json_body(resp).await;
                (status, retry, left, body)
            })
        })
        .collect();
    let mut ok = 0;
    let mut lefts = Vec::new();
    for t in tasks {
        let (status, retry, left, body) = t.await.unwrap();
        match status {
            200 => {
                ok += 1;
                lefts.push(left.expect("an answer of the run says what is left"));
            }
            429 => {
                assert_eq!(body["error"]["code"], "run_call_limit", "{body}");
                assert_eq!(retry.as_deref(), Some("false"));
                assert_eq!(left, Some(0));
                crate::support::assert_message_starts(
                    &body["error"],
                    "run call limit: run \"r50\" has made its 10 calls",
                );
            }
            s => panic!("status {s}: {body}"),
        }
    }
    assert_eq!(ok, 10);
    lefts.sort_unstable();
    assert_eq!(lefts, (0..10).collect::<Vec<_>>(), "each call counted once");
    assert_eq!(
        h.fake.requests().len(),
        10,
        "exactly ten reached the provider"
    );
    h.wait_requests("calls", 50.0).await;
    assert_eq!(
        h.metric("hourglass_run_refusals_total{reason=\"calls\",route=\"calls\"}")
            .await,
        40.0
    );
    let run = run_json(&h, "r50").await;
    // Counted once its ten calls are back, with what they used: a moment after the last
    // of them reached a shared store.
    let deadline = Instant::now() + Duration::from_secs(5);
    while h
        .metric("hourglass_runs_total{end=\"calls\",route=\"calls\"}")
        .await
        < 1.0
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        h.metric("hourglass_runs_total{end=\"calls\",route=\"calls\"}")
            .await,
        1.0
    );
    let tokens = run["runs"][0]["used"]["tokens"].as_u64().unwrap();
    assert!(tokens > 0, "{run}");
    assert_eq!(
        h.metric("hourglass_run_tokens_sum{route=\"calls\"}").await,
        tokens as f64,
        "the run's tokens, not what it had used when the 11th call was refused"
    );
    assert_eq!(
        h.metric("hourglass_run_calls_sum{route=\"calls\"}").await,
        10.0
    );
    assert_eq!(run["runs"][0]["used"]["calls"], 10);
    assert_eq!(run["runs"][0]["left"]["calls"], 0);
    assert_eq!(run["runs"][0]["ended"], "calls");
    assert_eq!(
        run["runs"][0]["used"]["in_flight"], 0,
        "every reservation came back"
    );
}

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

async fn the_run_deadline_cuts_a_stream_and_shrinks_every_calls_budget(store: Store) {
    let (h, _keep) = harness(store).await;
    let start = Instant::now();
    let (resp, _c) = h
        .send(call("/timed", false, &[("x-run-id", "t1")], ""))
        .await;
    assert_eq!(resp.status(), 200);
    let remaining = remaining_ms(&resp);
    assert!(remaining <= 1500 && remaining > 0, "{remaining}");
    json_body(resp).await;
    // A call asking for a long budget of its own still ends with the run.
    let (resp, _c) = h
        .send(call(
            "/timed",
            true,
            &[
                ("x-run-id", "t1"),
                ("x-request-budget-ms", "20000"),
                ("x-fake-chunks", "100"),
                ("x-fake-interval-ms", "100"),
            ],
            "",
        ))
        .await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    let error = read.error_event().expect("the stream ends with why");
    assert_eq!(error["code"], "run_deadline_exceeded");
    crate::support::assert_message_starts(&error, "run deadline exceeded: run \"t1\"");
    assert!(start.elapsed() >= Duration::from_millis(1500));
    // What was forwarded was the run's time left, not the call's 20 s.
    let forwarded: u64 = h.fake.requests()[1].headers["x-request-budget-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(forwarded < 1500, "forwarded {forwarded}");
    h.wait_requests("timed", 2.0).await;
    assert_eq!(
        h.metric("hourglass_cancellations_total{origin=\"run_deadline\",route=\"timed\"}")
            .await,
        1.0
    );
    let deadline_ends = "hourglass_runs_total{end=\"deadline\",route=\"timed\"}";
    if matches!(store, Store::Memory) {
        // The cut ended the run by its deadline, though no later call may come. (Redis
        // counts only what a call sees: the refusal below.)
        assert_eq!(h.metric(deadline_ends).await, 1.0);
    }
    // Past it, a call is refused before the provider sees it.
    let (resp, _c) = h
        .send(call("/timed", false, &[("x-run-id", "t1")], ""))
        .await;
    assert_eq!(resp.status(), 504);
    assert_eq!(resp.headers()["x-should-retry"], "false");
    assert_eq!(
        json_body(resp).await["error"]["code"],
        "run_deadline_exceeded"
    );
    assert_eq!(h.fake.requests().len(), 2);
    if matches!(store, Store::Memory) {
        assert_eq!(h.metric(deadline_ends).await, 1.0, "counted once");
    }
}

/// A run that made its call and came back after its deadline ended at that deadline: its
/// duration is its budget, not the time until the late call (on both stores alike).
async fn a_run_refused_past_its_deadline_lasted_its_budget(store: Store) {
    let (h, _keep) = harness(store).await;
    let headers = [("x-run-id", "late"), ("x-run-budget-ms", "300")];
    let (resp, _c) = h.send(call("/timed", false, &headers, "")).await;
    assert_eq!(resp.status(), 200);
    json_body(resp).await;
    h.wait_requests("timed", 1.0).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (resp, _c) = h
        .send(call("/timed", false, &[("x-run-id", "late")], ""))
        .await;
    assert_eq!(resp.status(), 504);
    json_body(resp).await;
    assert_eq!(
        h.metric("hourglass_runs_total{end=\"deadline\",route=\"timed\"}")
            .await,
        1.0
    );
    let lasted = h
        .metric("hourglass_run_duration_seconds_sum{route=\"timed\"}")
        .await;
    assert!((lasted - 0.3).abs() < 1e-9, "lasted {lasted}s");
}

/// A refusal that ended the run is given again to every later call, with the time left as
/// it is then, not as it was at the first refusal.
async fn a_later_deadline_refusal_says_what_is_left_now(store: Store) {
    let (h, _keep) = harness(store).await;
    // Less than `min_useful` from the start: refused with time still left.
    let short = [("x-run-id", "late"), ("x-run-budget-ms", "60")];
    let (resp, _c) = h.send(call("/timed", false, &short, "")).await;
    assert_eq!(resp.status(), 504);
    json_body(resp).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (resp, _c) = h
        .send(call("/timed", false, &[("x-run-id", "late")], ""))
        .await;
    assert_eq!(resp.status(), 504);
    assert_eq!(remaining_ms(&resp), 0);
    let body = json_body(resp).await;
    crate::support::assert_message_starts(
        &body["error"],
        "run deadline exceeded: run \"late\" has spent its budget of 60ms",
    );
}

async fn a_client_run_budget_may_only_shorten_the_run(store: Store) {
    let (h, _keep) = harness(store).await;
    let (resp, _c) = h
        .send(call(
            "/timed",
            false,
            &[("x-run-id", "t2"), ("x-run-budget-ms", "60000")],
            "",
        ))
        .await;
    let remaining = remaining_ms(&resp);
    assert!(
        (1..=1500).contains(&remaining),
        "the route's run_budget, which a client may only shorten: {remaining}"
    );
    json_body(resp).await;
    let (resp, _c) = h
        .send(call(
            "/timed",
            false,
            &[("x-run-id", "t2"), ("x-run-budget-ms", "400")],
            "",
        ))
        .await;
    let remaining = remaining_ms(&resp);
    assert!(remaining <= 400, "shortened: {remaining}");
    json_body(resp).await;
    // Where the route sets no run_budget, the client's is the run's, up to run_max_budget.
    let (resp, _c) = h
        .send(call(
            "/ceiling",
            false,
            &[("x-run-id", "t3"), ("x-run-budget-ms", "60000")],
            "",
        ))
        .await;
    let remaining = remaining_ms(&resp);
    assert!(
        (1501..=3000).contains(&remaining),
        "clamped by run_max_budget: {remaining}"
    );
    json_body(resp).await;
    // The run's deadline reaches the upstream in x-request-budget-ms, never the client's ask.
    for r in h.fake.requests() {
        assert!(
            !r.headers.contains_key("x-run-budget-ms"),
            "{:?}",
            r.headers
        );
        assert!(r.headers.contains_key("x-run-id"));
    }
}

/// The run leaves less than the upstream is known to need before its first token: no attempt
/// is made, and since the run's deadline is what bounds the call, the refusal is the run's,
/// which the SDKs do not retry (insufficient_budget, which they do, only spent the run).
async fn a_run_too_short_for_any_attempt_is_refused_as_the_runs_deadline(store: Store) {
    let (h, _keep) = harness(store).await;
    let (resp, _c) = h
        .send(call("/slow", false, &[("x-run-id", "short")], ""))
        .await;
    assert_eq!(resp.status(), 504);
    assert_eq!(resp.headers()["x-should-retry"], "false");
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "run_deadline_exceeded", "{body}");
    crate::support::assert_message_starts(&body["error"], "run deadline exceeded:");
    // Why a run with time left cannot fit the call (audit DC 3: the message said only "less
    // than a call needs", and the refusal was missing from the run's refusals).
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("less than a call needs (at least 1000ms): upstream \"slow\" is expected to take 1000ms to its first token"),
        "{message}"
    );
    assert!(h.fake.requests().is_empty(), "never reached the provider");
    h.wait_requests("slow", 1.0).await;
    assert_eq!(
        h.metric("hourglass_run_refusals_total{reason=\"deadline\",route=\"slow\"}")
            .await,
        1.0
    );
}

async fn bad_run_headers_are_refused_and_never_forwarded(store: Store) {
    let (h, _keep) = harness(store).await;
    for (header, value, code) in [
        ("x-run-id", "has space", "invalid_run_id"),
        ("x-run-budget-ms", "soon", "invalid_budget"),
        ("x-run-budget-ms", "0", "invalid_budget"),
    ] {
        let mut headers = vec![(header, value)];
        if header != "x-run-id" {
            headers.push(("x-run-id", "ok-id"));
        }
        let (resp, _c) = h.send(call("/calls", false, &headers, "")).await;
        assert_eq!(resp.status(), 400, "{header}: {value}");
        let body = json_body(resp).await;
        assert_eq!(body["error"]["code"], code);
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(header) && message.contains(value),
            "{message}"
        );
    }
    let (resp, _c) = h
        .send(call(
            "/traced",
            false,
            &[("traceparent", "00-nothex-x-01")],
            "",
        ))
        .await;
    assert_eq!(resp.status(), 400);
    assert_eq!(json_body(resp).await["error"]["code"], "invalid_run_id");
    // Without a run id too: its client meant a run, and is told its budget is malformed.
    let (resp, _c) = h
        .send(call("/calls", false, &[("x-run-budget-ms", "abc")], ""))
        .await;
    assert_eq!(resp.status(), 400);
    assert_eq!(json_body(resp).await["error"]["code"], "invalid_budget");
    assert!(h.fake.requests().is_empty());
}

async fn a_traceparent_names_the_run(store: Store) {
    let (h, _keep) = harness(store).await;
    let tp1 = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    // Another span of the same trace: the same run.
    let tp2 = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01";
    let (resp, _c) = h
        .send(call("/traced", false, &[("traceparent", tp1)], ""))
        .await;
    assert_eq!(resp.status(), 200);
    json_body(resp).await;
    let (resp, _c) = h
        .send(call("/traced", false, &[("traceparent", tp2)], ""))
        .await;
    assert_eq!(resp.status(), 429);
    let run = run_json(&h, "4bf92f3577b34da6a3ce929d0e0e4736").await;
    assert_eq!(run["runs"][0]["route"], "traced");
}

async fn one_clients_run_is_never_anothers(store: Store) {
    let (h, _keep) = harness(store).await;
    for key in [KEY_A, KEY_B] {
        let auth = format!("Bearer {key}");
        let (resp, _c) = h
            .send(call(
                "/keyed",
                false,
                &[("x-run-id", "shared"), ("authorization", &auth)],
                "",
            ))
            .await;
        assert_eq!(
            resp.status(),
            200,
            "each client's first call of its own run"
        );
        json_body(resp).await;
    }
    let auth = format!("Bearer {KEY_A}");
    let (resp, _c) = h
        .send(call(
            "/keyed",
            false,
            &[("x-run-id", "shared"), ("authorization", &auth)],
            "",
        ))
        .await;
    assert_eq!(resp.status(), 429);
    let run = run_json(&h, "shared").await;
    assert_eq!(run["runs"].as_array().unwrap().len(), 2);
    let text = run.to_string();
    assert!(!text.contains(KEY_A) && !text.contains(KEY_B), "{text}");
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

async fn a_request_without_a_run_id_is_in_no_run(store: Store) {
    let (h, _keep) = harness(store).await;
    for _ in 0..12 {
        let (resp, _c) = h.send(call("/calls", false, &[], "")).await;
        assert_eq!(resp.status(), 200);
        assert!(resp.headers().get("x-run-calls-left").is_none());
        json_body(resp).await;
    }
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

/// An SDK retries a 5xx or a 429 with the same body: a retry, not the agent asking again.
async fn a_request_retried_after_a_failure_is_not_a_repeat(store: Store) {
    let (h, _keep) = harness(store).await;
    for _ in 0..5 {
        let (resp, _c) = h
            .send(call(
                "/loops",
                false,
                &[("x-run-id", "retried"), ("x-fake-status", "503")],
                "",
            ))
            .await;
        assert_eq!(resp.status(), 503);
        json_body(resp).await;
    }
    for _ in 0..3 {
        let (resp, _c) = h
            .send(call("/loops", false, &[("x-run-id", "retried")], ""))
            .await;
        assert_eq!(resp.status(), 200);
        json_body(resp).await;
        h.wait_requests("loops", 1.0).await;
        run_json(&h, "retried").await;
    }
    // Answered three times: the fourth is the loop.
    let (resp, _c) = h
        .send(call("/loops", false, &[("x-run-id", "retried")], ""))
        .await;
    assert_eq!(resp.status(), 429);
    assert_eq!(json_body(resp).await["error"]["code"], "run_loop_detected");
}

async fn a_run_is_found_by_its_exact_id(store: Store) {
    let (h, _keep) = harness(store).await;
    let (resp, _c) = h
        .send(call("/calls", false, &[("x-run-id", "a/b")], ""))
        .await;
    json_body(resp).await;
    h.wait_requests("calls", 1.0).await;
    assert_eq!(
        run_json(&h, "a/b").await["runs"].as_array().unwrap().len(),
        1
    );
    let other = run_json_now(&h, "b").await;
    assert_eq!(other["runs"].as_array().map_or(0, Vec::len), 0, "{other}");
    // Ids holding `?`, `#` or `%` are asked for percent-encoded, as a path carries them.
    for (id, path) in [("job?1", "job%3F1"), ("a#b", "a%23b"), ("p%41", "p%2541")] {
        let (resp, _c) = h.send(call("/calls", false, &[("x-run-id", id)], "")).await;
        json_body(resp).await;
        let run = run_json(&h, path).await;
        assert_eq!(run["id"], id, "{path}: {run}");
        assert_eq!(
            run["runs"].as_array().map_or(0, Vec::len),
            1,
            "{path}: {run}"
        );
    }
    let none = run_json_now(&h, "p%41").await;
    assert_eq!(none["error"]["code"], "no_run");
    // In the shape of every error body.
    assert_eq!(none["error"]["type"], "not_found_error");
    assert_eq!(none["type"], "error");
    // What no run id can be is said so, not looked for.
    let long = "x".repeat(129);
    for path in ["", "a%20b", "caf%C3%A9", long.as_str()] {
        let error = run_json_now(&h, path).await;
        assert_eq!(error["error"]["code"], "invalid_run_id", "{path}: {error}");
        assert_eq!(error["type"], "error", "every error body's shape: {error}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("1 to 128 visible ASCII"), "{message}");
    }
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

/// A call refused for the route's `max_in_flight` (503 `overloaded`), or whose client left
/// while it waited for a slot, never reached an upstream: like a call refused for its own
/// budget, it is no call of its run and holds none of its tokens, and the refusal's headers
/// say so. Before, each used a run call (the SDKs' two retries of a 503: three), so
/// overload alone could end a run.
async fn a_call_that_never_reached_an_upstream_is_no_call_of_its_run(store: Store) {
    let (h, _keep) = harness(store).await;
    let (holder, _c) = h
        .send(call(
            "/busy",
            true,
            &[("x-fake-chunks", "2"), ("x-fake-interval-ms", "1500")],
            "",
        ))
        .await;
    assert_eq!(holder.status(), 200);
    let run = [("x-run-id", "queued"), ("x-request-budget-ms", "400")];
    let (refused, _c) = h.send(call("/busy", false, &run, "")).await;
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["x-run-calls-left"], "10");
    assert_eq!(refused.headers()["x-run-tokens-left"], "100000");
    assert_eq!(json_body(refused).await["error"]["code"], "overloaded");
    let gateway = h.gw.addr;
    let waiting = tokio::spawn(async move {
        crate::support::Conn::open(gateway)
            .await
            .send(call("/busy", false, &[("x-run-id", "queued")], ""))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    waiting.abort();
    read_body(holder.into_body()).await;
    let run = run_json(&h, "queued").await;
    let used = &run["runs"][0]["used"];
    assert_eq!(used["calls"], 0, "{run}");
    assert_eq!(used["tokens_reserved"], 0, "{run}");
    assert_eq!(
        h.fake.requests().len(),
        1,
        "only the holder reached the upstream"
    );
}

/// Calls admitted beside each other took the run's last calls, and a third was refused for
/// want of one; then the two never reached the upstream and gave their calls back. The run
/// has its calls again: the refusal that saw it full did not end it (audit BA: with Redis
/// paused, queued admissions ran before their cancels and ended a run of one call).
async fn a_call_limit_reached_only_by_calls_given_back_ends_no_run(store: Store) {
    let (h, _keep) = harness(store).await;
    let (holder, _c) = h
        .send(call(
            "/scarce",
            true,
            &[("x-fake-chunks", "2"), ("x-fake-interval-ms", "1500")],
            "",
        ))
        .await;
    assert_eq!(holder.status(), 200);
    let run = [("x-run-id", "given-back"), ("x-request-budget-ms", "500")];
    let (a, b, c) = tokio::join!(
        h.send(call("/scarce", false, &run, "")),
        h.send(call("/scarce", false, &run, "")),
        h.send(call("/scarce", false, &run, "")),
    );
    let mut codes = Vec::new();
    for (resp, _c) in [a, b, c] {
        let status = resp.status();
        codes.push((status, json_body(resp).await["error"]["code"].clone()));
    }
    codes.sort_by_key(|(s, _)| *s);
    assert_eq!(codes[0].0, 429, "{codes:?}");
    assert_eq!(codes[0].1, "run_call_limit", "{codes:?}");
    assert!(
        codes[1..]
            .iter()
            .all(|(s, c)| *s == 503 && c == "overloaded"),
        "{codes:?}"
    );
    read_body(holder.into_body()).await;
    let left = run_json(&h, "given-back").await;
    assert_eq!(left["runs"][0]["used"]["calls"], 0, "{left}");
    let (resp, _c) = h
        .send(call("/scarce", false, &[("x-run-id", "given-back")], ""))
        .await;
    assert_eq!(resp.status(), 200, "{}", json_body(resp).await);
    assert_eq!(resp.headers()["x-run-calls-left"], "1");
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

/// A route with no run limit takes the client's `x-run-budget-ms` as it is, up to the year
/// any duration of the config is held to: both stores then say the same. Unbounded, Redis
/// read 2^64 - 1 ms as a Lua double, turned negative as an integer, and no
/// `x-run-remaining-ms` came back, where memory said 18446744073709551614 (audit KD 3).
async fn a_run_budget_past_a_year_is_a_year(store: Store) {
    const YEAR_MS: u64 = 31_557_600_000;
    let (h, _keep) = harness(store).await;
    for (turn, asked) in ["18446744073709551615", "9223372036854775807"]
        .into_iter()
        .enumerate()
    {
        let (resp, _c) = h
            .send(call(
                "/plain",
                false,
                &[("x-run-id", "forever"), ("x-run-budget-ms", asked)],
                "",
            ))
            .await;
        assert_eq!(resp.status(), 200);
        let remaining = remaining_ms(&resp);
        assert!(
            (YEAR_MS - 60_000..=YEAR_MS).contains(&remaining),
            "call {turn}, asked {asked}: {remaining}"
        );
        json_body(resp).await;
    }
    let run = run_json(&h, "forever").await;
    let left = run["runs"][0]["left"]["remaining_ms"].as_u64().unwrap();
    assert!((YEAR_MS - 60_000..=YEAR_MS).contains(&left), "{run}");
}
