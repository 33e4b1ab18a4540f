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
# Room for the seed (a run budget that had none is refused, audit NB 1); a client's
# x-run-budget-ms may shorten it below.
run_budget = "5s"

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
    the_run_deadline_cuts_a_stream_and_shrinks_every_calls_budget,
    a_client_run_budget_may_only_shorten_the_run,
    a_run_too_short_for_any_attempt_is_refused_as_the_runs_deadline,
    bad_run_headers_are_refused_and_never_forwarded,
    a_traceparent_names_the_run,
    one_clients_run_is_never_anothers,
    a_request_without_a_run_id_is_in_no_run,
    a_request_retried_after_a_failure_is_not_a_repeat,
    a_run_is_found_by_its_exact_id,
    a_call_that_never_reached_an_upstream_is_no_call_of_its_run,
    a_run_refused_past_its_deadline_lasted_its_budget,
    a_later_deadline_refusal_says_what_is_left_now,
    a_call_limit_reached_only_by_calls_given_back_ends_no_run,
    a_run_budget_past_a_year_is_a_year,
    a_runs_deadline_is_given_as_a_time,
    a_run_begun_on_a_route_without_run_keys_takes_the_first_limits_it_meets,
    a_run_that_ended_before_it_met_any_limits_takes_none,
    a_call_admitted_before_the_limits_leaves_the_streak_as_it_was,
);

/// The loop stop: the same tool calls, or the same request, again and again.
mod loops;

/// The token budget: reserved, reconciled, given back, and said.
mod tokens;

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
    // Bounds a hang, not a measure: under the whole suite's load (Redis servers of many tests
    // starting at once) a call's end took past 5 s to reach its store, and the next call was
    // judged without it (a loop stop's fourth call answered 200).
    let deadline = Instant::now() + Duration::from_secs(30);
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

/// The run (shortened by its client) leaves less than the upstream is known to need before
/// its first token: no attempt is made, and since the run's deadline is what bounds the call, the refusal is the run's,
/// which the SDKs do not retry (insufficient_budget, which they do, only spent the run).
async fn a_run_too_short_for_any_attempt_is_refused_as_the_runs_deadline(store: Store) {
    let (h, _keep) = harness(store).await;
    let (resp, _c) = h
        .send(call(
            "/slow",
            false,
            &[("x-run-id", "short"), ("x-run-budget-ms", "600")],
            "",
        ))
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

async fn a_request_without_a_run_id_is_in_no_run(store: Store) {
    let (h, _keep) = harness(store).await;
    for _ in 0..12 {
        let (resp, _c) = h.send(call("/calls", false, &[], "")).await;
        assert_eq!(resp.status(), 200);
        assert!(resp.headers().get("x-run-calls-left").is_none());
        json_body(resp).await;
    }
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

/// `GET /runs/{id}` gives the run's deadline (DESIGN §10: "limits, used, left, deadline") as
/// an RFC 3339 UTC time, `null` for a run without one; it gave only `left.remaining_ms`
/// (audit PE 5). The time is the one `remaining_ms` counts down to.
async fn a_runs_deadline_is_given_as_a_time(store: Store) {
    use std::time::SystemTime;
    let (h, _keep) = harness(store).await;
    let before = SystemTime::now();
    let (resp, _c) = h
        .send(call(
            "/ceiling",
            false,
            &[("x-run-id", "dated"), ("x-run-budget-ms", "3000")],
            "",
        ))
        .await;
    assert_eq!(resp.status(), 200);
    json_body(resp).await;
    let after = SystemTime::now();
    let run = run_json(&h, "dated").await;
    let entry = &run["runs"][0];
    let text = entry["deadline"]
        .as_str()
        .unwrap_or_else(|| panic!("{run}"));
    assert!(text.ends_with('Z'), "UTC: {text}");
    let deadline = humantime::parse_rfc3339(text).unwrap();
    // Fixed when the call arrived, between `before` and `after`; the slack is for the
    // instant's conversion to the wall clock and the text's whole milliseconds.
    let slack = Duration::from_secs(1);
    let budget = Duration::from_millis(3000);
    assert!(
        deadline + slack >= before + budget && deadline <= after + budget + slack,
        "{text}: {run}"
    );
    // A run with no deadline has none to give.
    let (resp, _c) = h
        .send(call("/plain", false, &[("x-run-id", "undated")], ""))
        .await;
    assert_eq!(resp.status(), 200);
    json_body(resp).await;
    let run = run_json(&h, "undated").await;
    assert!(run["runs"][0]["deadline"].is_null(), "{run}");
    assert!(
        run["runs"][0].as_object().unwrap().contains_key("deadline"),
        "{run}"
    );
    assert!(run["runs"][0]["left"]["remaining_ms"].is_null(), "{run}");
}

/// Audit SF 1: a run whose first call came on a route without run keys (an embedding, the
/// models listed, a planner on another route) took that route's limits, none, for good: eight
/// identical tool calls then passed a route with `run_max_repeats = 3`, and five a route with
/// `run_max_calls = 3`. The first call on a route that has run keys fixes the run's limits (and
/// names its route); the calls before it still count.
async fn a_run_begun_on_a_route_without_run_keys_takes_the_first_limits_it_meets(store: Store) {
    let (h, _keep) = harness(store).await;
    // The loop stop, after a call on "plain" (no run keys).
    let (resp, _c) = h
        .send(call("/plain", false, &[("x-run-id", "late-loop")], ""))
        .await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-run-calls-left").is_none());
    read_body(resp.into_body()).await;
    run_json(&h, "late-loop").await;
    let tool = [
        ("x-run-id", "late-loop"),
        ("x-fake-tool-call", "get_weather"),
    ];
    let mut statuses = Vec::new();
    for n in 0..5 {
        let turn = format!(r#","user":"turn {n}""#);
        let (resp, _c) = h.send(call("/loops", false, &tool, &turn)).await;
        statuses.push(resp.status().as_u16());
        read_body(resp.into_body()).await;
        // Each answer's tool calls counted before the next call (a shared store is told a
        // moment after the client).
        run_json(&h, "late-loop").await;
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let run = &run_json(&h, "late-loop").await["runs"][0];
    assert_eq!(run["route"], "loops", "{run}");
    assert_eq!(run["limits"]["max_repeats"], 3, "{run}");
    assert_eq!(run["used"]["calls"], 4, "the call on plain counts: {run}");
    assert_eq!(run["ended"], "loop", "{run}");
    // The call limit: the call on "plain" takes one of the two calls "scarce" gives a run.
    let (resp, _c) = h
        .send(call("/plain", false, &[("x-run-id", "late-calls")], ""))
        .await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    let calls = [("x-run-id", "late-calls")];
    let (resp, _c) = h.send(call("/scarce", false, &calls, "")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-run-calls-left"], "0");
    read_body(resp.into_body()).await;
    // Once fixed, the run's limits are the route's that fixed them, whatever route comes next.
    for route in ["/calls", "/scarce"] {
        let (resp, _c) = h.send(call(route, false, &calls, "")).await;
        assert_eq!(resp.status(), 429, "{route}");
        assert_eq!(json_body(resp).await["error"]["code"], "run_call_limit");
    }
    let run = &run_json(&h, "late-calls").await["runs"][0];
    assert_eq!(run["route"], "scarce", "{run}");
    assert_eq!(run["limits"]["max_calls"], 2, "{run}");
    // A run_budget taken so is the run's whole budget, from its first call (one deadline a
    // run); a shorter one its client asked for before stays.
    for (id, asked, budget) in [
        ("late-time", None, 1500),
        ("late-short", Some("1000"), 1000),
    ] {
        let mut headers = vec![("x-run-id", id)];
        headers.extend(asked.map(|ms| ("x-run-budget-ms", ms)));
        let (resp, _c) = h.send(call("/plain", false, &headers, "")).await;
        assert_eq!(resp.status(), 200);
        read_body(resp.into_body()).await;
        let (resp, _c) = h.send(call("/timed", false, &[("x-run-id", id)], "")).await;
        assert_eq!(resp.status(), 200);
        assert!(remaining_ms(&resp) <= budget, "{id}");
        read_body(resp.into_body()).await;
        let run = &run_json(&h, id).await["runs"][0];
        assert_eq!(run["limits"]["budget_ms"], budget, "{id}: {run}");
        assert_eq!(run["route"], "timed", "{id}: {run}");
    }
}

/// Audit TB 3: a run that ended on a route without run keys (its client's budget too short
/// for any call) took the limits of the next route its agent called, and that route's name:
/// its end was counted under one route, its later refusals under another, and a refusal
/// showed calls left it never had. An ended run keeps its route and limits.
async fn a_run_that_ended_before_it_met_any_limits_takes_none(store: Store) {
    let (h, _keep) = harness(store).await;
    let ended = [("x-run-id", "over"), ("x-run-budget-ms", "1")];
    let (resp, _c) = h.send(call("/plain", false, &ended, "")).await;
    assert_eq!(resp.status(), 504);
    assert_eq!(
        json_body(resp).await["error"]["code"],
        "run_deadline_exceeded"
    );
    let (resp, _c) = h
        .send(call("/loops", false, &[("x-run-id", "over")], ""))
        .await;
    assert_eq!(resp.status(), 504);
    assert!(resp.headers().get("x-run-calls-left").is_none());
    assert_eq!(
        json_body(resp).await["error"]["code"],
        "run_deadline_exceeded"
    );
    let run = &run_json(&h, "over").await["runs"][0];
    assert_eq!(run["ended"], "deadline", "{run}");
    assert_eq!(run["route"], "plain", "{run}");
    assert!(run["limits"]["max_repeats"].is_null(), "{run}");
}

/// Audit TB 1: a call admitted before its run had limits (a slow one on a route without run
/// keys) gathered no tool calls, and its end said "no tool call": the streak of identical tool
/// calls that calls on a limited route had built meanwhile was cleared, and six identical
/// answers passed `run_max_repeats = 3`. Such a call's end leaves the streak as it was.
async fn a_call_admitted_before_the_limits_leaves_the_streak_as_it_was(store: Store) {
    let (h, _keep) = harness(store).await;
    let slow = [
        ("x-run-id", "early"),
        ("x-fake-tool-call", "get_weather"),
        ("x-fake-ttft-ms", "3000"),
    ];
    let early = async {
        let (resp, _c) = h.send(call("/plain", false, &slow, "")).await;
        let status = resp.status();
        read_body(resp.into_body()).await;
        status
    };
    let tool = [("x-run-id", "early"), ("x-fake-tool-call", "get_weather")];
    let loops = async {
        let admitted = Instant::now() + Duration::from_secs(5);
        while h.fake.requests().is_empty() && Instant::now() < admitted {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(h.fake.requests().len(), 1, "the slow call is upstream");
        let mut statuses = Vec::new();
        for turn in 0..4 {
            if turn >= 2 {
                // Until no call of the run is in flight: the slow one has ended too, and a
                // shared store has been told of the last answer.
                run_json(&h, "early").await;
            }
            let extra = format!(r#","user":"turn {turn}""#);
            let (resp, _c) = h.send(call("/loops", false, &tool, &extra)).await;
            statuses.push(resp.status().as_u16());
            read_body(resp.into_body()).await;
        }
        statuses
    };
    let (early, statuses) = tokio::join!(early, loops);
    assert_eq!(early, 200);
    assert_eq!(statuses, [200, 200, 200, 429]);
}
