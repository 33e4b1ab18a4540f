//! Runs across replicas: two Hourglass processes share one Redis, and a run is one run
//! whichever replica its calls land on; Redis that goes away, comes back, or never answers.

use std::sync::Arc;
use std::time::Duration;

use crate::support::redis::RedisServer;
use crate::support::{json_body, read_body, Conn, Process};
use bytes::Bytes;
use hourglass_fake::FakeUpstream;
use http::Request;
use http_body_util::Full;
use tokio::time::Instant;

const CONFIG: &str = r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[runs]
store = "{STORE}"
store_timeout = "{STORE_TIMEOUT}"
on_store_error = "{ON_ERROR}"

[defaults]
budget = "10s"
connect_timeout = "500ms"
first_token_timeout = "5s"
idle_timeout = "5s"

[upstreams.fake]
url = "{FAKE}"
auth = "none"

[[routes]]
name = "agent"
path_prefix = "/v1/chat/completions"
upstream = "fake"
run_max_calls = 10
run_max_repeats = 3
run_budget = "1500ms"
run_max_budget = "60s"
"#;

fn config(fake: &FakeUpstream, store: &str, on_error: &str, timeout: &str) -> String {
    CONFIG
        .replace("{FAKE}", &fake.url())
        .replace("{STORE}", store)
        .replace("{ON_ERROR}", on_error)
        .replace("{STORE_TIMEOUT}", timeout)
}

fn call(stream: bool, headers: &[(&str, &str)], turn: usize) -> Request<Full<Bytes>> {
    let body = format!(
        r#"{{"model":"m","stream":{stream},"user":"turn {turn}","messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let mut b = Request::post("/v1/chat/completions")
        .header("host", "gateway")
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::from(body))).unwrap()
}

async fn send(p: &Process, req: Request<Full<Bytes>>) -> (u16, http::HeaderMap, serde_json::Value) {
    let (resp, _c) = Conn::open(p.addr).await.send(req).await;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, json_body(resp).await)
}

/// A Redis server and a fake provider for one test; None when Redis is not installed (the
/// test is then skipped, as `support::redis::skip` says).
async fn redis_and_fake() -> Option<(RedisServer, FakeUpstream)> {
    if crate::support::redis::skip() {
        return None;
    }
    let redis = RedisServer::start().await;
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    Some((redis, fake))
}

async fn two_replicas(
    fake: &FakeUpstream,
    redis: &RedisServer,
    on_error: &str,
) -> (Process, Process) {
    let toml = config(fake, &redis.url(), on_error, "200ms");
    let a = Process::spawn(&toml, &[], &[]).await;
    let b = Process::spawn(&toml, &[], &[]).await;
    (a, b)
}

#[tokio::test]
async fn fifty_calls_split_between_two_replicas_get_exactly_ten_upstream() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    // The store's timeout is not what this test is about: 200 ms turned a slow admission
    // into a 503 on a loaded machine (seen at load 10 on two cores).
    let toml = config(&fake, &redis.url(), "deny", "5s");
    let a = Process::spawn(&toml, &[], &[]).await;
    let b = Process::spawn(&toml, &[], &[]).await;
    let replicas = Arc::new([a, b]);
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let replicas = replicas.clone();
            tokio::spawn(async move {
                let run = [("x-run-id", "split"), ("x-run-budget-ms", "30000")];
                send(&replicas[i % 2], call(false, &run, i)).await.0
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((ok, refused), (10, 40), "{statuses:?}");
    assert_eq!(
        fake.requests().len(),
        10,
        "ten reached the provider, from both replicas"
    );
    for p in replicas.iter() {
        let served = crate::support::metric(
            p.admin,
            "hourglass_requests_total{outcome=\"ok\",route=\"agent\"}",
        )
        .await;
        let refused = crate::support::metric(
            p.admin,
            "hourglass_requests_total{outcome=\"error\",route=\"agent\"}",
        )
        .await;
        assert_eq!(served + refused, 25.0, "each replica took its half");
    }
}

#[tokio::test]
async fn the_deadline_set_by_a_call_to_one_replica_cuts_a_stream_on_the_other() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let (a, b) = two_replicas(&fake, &redis, "deny").await;
    let start = Instant::now();
    let (status, headers, _) = send(&a, call(false, &[("x-run-id", "dl")], 0)).await;
    assert_eq!(status, 200);
    assert!(headers.contains_key("x-run-remaining-ms"));
    let req = call(
        true,
        &[
            ("x-run-id", "dl"),
            ("x-fake-chunks", "100"),
            ("x-fake-interval-ms", "100"),
        ],
        1,
    );
    let (resp, _c) = Conn::open(b.addr).await.send(req).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    let error = read.error_event().expect("cut with why");
    assert_eq!(error["code"], "run_deadline_exceeded");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(8),
        "cut by the run's 1.5 s, not the call's 10 s: {took:?}"
    );
}

#[tokio::test]
async fn a_loop_seen_across_both_replicas_is_stopped() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let (a, b) = two_replicas(&fake, &redis, "deny").await;
    let tool = [
        ("x-run-id", "loop"),
        ("x-run-budget-ms", "30000"),
        ("x-fake-tool-call", "get_weather"),
    ];
    for (i, p) in [&a, &b, &a].into_iter().enumerate() {
        let (status, _, _) = send(p, call(false, &tool, i)).await;
        assert_eq!(status, 200);
        // The end of the call reaches Redis a moment after the answer.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, headers, body) = send(&b, call(false, &tool, 3)).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(headers["x-should-retry"], "false");
    assert_eq!(body["error"]["code"], "run_loop_detected");
    assert_eq!(fake.requests().len(), 3);
}

#[tokio::test]
async fn redis_going_away_allow_serves_deny_refuses_and_runs_resume_when_it_is_back() {
    if crate::support::redis::skip() {
        return;
    }
    let mut redis = RedisServer::start().await;
    let port = redis.port();
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let allow = Process::spawn(&config(&fake, &redis.url(), "allow", "200ms"), &[], &[]).await;
    let deny = Process::spawn(&config(&fake, &redis.url(), "deny", "200ms"), &[], &[]).await;
    let run = [("x-run-id", "gone"), ("x-run-budget-ms", "60000")];
    // Nine of the run's ten calls before Redis goes.
    for i in 0..9 {
        let p = if i % 2 == 0 { &allow } else { &deny };
        assert_eq!(send(p, call(false, &run, i)).await.0, 200);
    }
    redis.stop();
    for i in 0..3 {
        let (status, headers, _) = send(&allow, call(false, &run, 10 + i)).await;
        assert_eq!(status, 200, "allow serves without run limits");
        assert!(!headers.contains_key("x-run-calls-left"), "no run answered");
    }
    let (status, _, body) = send(&deny, call(false, &run, 20)).await;
    assert_eq!(status, 503);
    assert_eq!(body["error"]["code"], "run_store_unavailable");
    crate::support::assert_message_starts(&body["error"], "run store unavailable:");
    // A store that refuses the connection fails the call at once, saying so: no wait of
    // `store_timeout` for reconnections spaced wider than it.
    for i in 0..3 {
        let (status, _, body) = send(&deny, call(false, &run, 21 + i)).await;
        assert_eq!(status, 503);
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("refused") && !message.contains("did not answer"),
            "{message}"
        );
    }
    let errors = crate::support::metric(
        allow.admin,
        "hourglass_run_store_errors_total{op=\"admit\"}",
    )
    .await;
    assert!(errors >= 3.0, "{errors}");
    let ready = reqwest_like_get(allow.admin, "/readyz").await;
    assert!(
        ready.contains("on_store_error = allow") && ready.contains("unavailable"),
        "{ready}"
    );
    // Back, with the run as it was: one call left, then refused.
    let _redis = RedisServer::on(port).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut status = 0;
    let mut headers = http::HeaderMap::new();
    while Instant::now() < deadline {
        (status, headers, _) = send(&deny, call(false, &run, 30)).await;
        if status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The run's state lived in the Redis that was stopped, which keeps nothing (persistence
    // off): the run starts again, and is enforced again from there.
    assert_eq!(status, 200);
    assert_eq!(headers["x-run-calls-left"], "9");
    // Each replica reconnects on its own backoff: until `allow`'s store answers again, it
    // would serve the run's calls without limits and uncounted.
    let probe = [("x-run-id", "probe"), ("x-run-budget-ms", "60000")];
    let deadline = Instant::now() + Duration::from_secs(10);
    for turn in 60.. {
        let (_, headers, _) = send(&allow, call(false, &probe, turn)).await;
        if headers.contains_key("x-run-calls-left") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "`allow` never reached Redis again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..9 {
        assert_eq!(send(&allow, call(false, &run, 40 + i)).await.0, 200);
    }
    assert_eq!(
        send(&allow, call(false, &run, 50)).await.0,
        429,
        "enforced again"
    );
}

/// A `/runs/{id}` lookup the store fails is seen where a call's failure is: `/readyz` notes
/// the store unavailable and `hourglass_run_store_errors_total{op="find"}` counts it (audit
/// OB 3: the lookup answered 503 while `/readyz` said all was well and nothing counted).
#[tokio::test]
async fn a_failed_run_lookup_is_seen_by_readyz_and_the_metric() {
    if crate::support::redis::skip() {
        return;
    }
    let mut redis = RedisServer::start().await;
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let p = Process::spawn(&config(&fake, &redis.url(), "deny", "200ms"), &[], &[]).await;
    let find = "hourglass_run_store_errors_total{op=\"find\"}";
    assert_eq!(crate::support::metric(p.admin, find).await, 0.0, "at zero");
    redis.stop();
    let text = reqwest_like_get(p.admin, "/runs/lookup").await;
    let found: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(found["error"]["code"], "run_store_unavailable", "{text}");
    let ready = reqwest_like_get(p.admin, "/readyz").await;
    assert!(ready.contains("; unavailable "), "{ready}");
    assert_eq!(crate::support::metric(p.admin, find).await, 1.0);
    let admit = "hourglass_run_store_errors_total{op=\"admit\"}";
    assert_eq!(
        crate::support::metric(p.admin, admit).await,
        0.0,
        "no call was made"
    );
}

/// A store that accepts connections and never says a word; abort the handle to close it.
async fn silent_store() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = silent.accept().await {
            conns.push(c);
        }
    });
    (addr, held)
}

#[tokio::test]
async fn a_redis_that_never_answers_costs_a_call_its_store_timeout_not_its_budget() {
    let (addr, held) = silent_store().await;
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let url = format!("redis://{addr}/0");
    let deny = Process::spawn(&config(&fake, &url, "deny", "300ms"), &[], &[]).await;
    let start = Instant::now();
    let (status, _, body) = send(&deny, call(false, &[("x-run-id", "mute")], 0)).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    // A call whose budget is shorter than the store timeout is bounded by its budget.
    let allow = Process::spawn(&config(&fake, &url, "allow", "5s"), &[], &[]).await;
    let start = Instant::now();
    let (status, _, body) = send(
        &allow,
        call(
            false,
            &[("x-run-id", "mute"), ("x-request-budget-ms", "800")],
            1,
        ),
    )
    .await;
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "bounded by the 800 ms budget: {took:?}"
    );
    // Its budget, not the store, ran out: the call cannot fit the upstream any more. Not
    // served without run limits (a short budget must not be a way around them), and never
    // sent upstream.
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["error"]["code"], "insufficient_budget", "{body}");
    assert!(fake.requests().is_empty());
    held.abort();
}

/// The request log lines, as JSON, whose `fields` hold `key` = `value`.
fn log_lines_with(out: &str, key: &str, value: &str) -> Vec<serde_json::Value> {
    out.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        .filter(|v| v.get("fields").unwrap_or(v)[key] == value)
        .collect()
}

/// A call of a run whose store could not answer is still logged as a call of its run,
/// whether it was served without run limits, refused 503, or out of budget waiting:
/// before, all three logged `run_id: null`, and the escape from the run's limits had no
/// trace in the line.
#[tokio::test]
async fn a_call_the_store_could_not_admit_is_logged_with_its_run() {
    let (addr, held) = silent_store().await;
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let url = format!("redis://{addr}/0");
    let json = ["--log-format", "json"];
    for (on_error, timeout, budget, want) in [
        ("allow", "100ms", "30000", 200),
        ("deny", "100ms", "30000", 503),
        ("allow", "5s", "800", 504),
    ] {
        // A shutdown waits up to its grace for the cancel it cannot send.
        let toml = config(&fake, &url, on_error, timeout)
            .replace("[server]\n", "[server]\nshutdown_grace = \"1s\"\n");
        let p = Process::spawn(&toml, &json, &[]).await;
        let run = [("x-run-id", "unheard"), ("x-request-budget-ms", budget)];
        let (status, _, body) = send(&p, call(false, &run, 0)).await;
        assert_eq!(status, want, "{on_error}: {body}");
        let (stdout, stderr) = p.stop().await;
        let out = stdout + &stderr;
        assert!(
            out.contains("1 call ends or cancels still unsent at shutdown"),
            "the cancel given up on: {out}"
        );
        let lines = log_lines_with(&out, "run_id", "unheard");
        assert_eq!(lines.len(), 1, "{on_error}, {want}: {out}");
        let line = lines[0].get("fields").unwrap_or(&lines[0]);
        assert_eq!(line["status"], want, "{line}");
        // Only the call that was served says it was served without its run's limits.
        let unenforced = (want == 200).then_some("unenforced");
        assert_eq!(line["run_limits"].as_str(), unenforced, "{line}");
    }
    held.abort();
}

/// A GET on the admin listener, its body as text.
async fn reqwest_like_get(admin: std::net::SocketAddr, path: &str) -> String {
    crate::support::admin_get(admin, path).await
}

/// A replica killed mid-call never gives its call's reservation back: that one call's stays
/// (counted, in flight, its tokens reserved) and nothing more, and only until the run's keys
/// expire (ttl after the last admission plus that call's budget).
#[tokio::test]
async fn a_replica_that_dies_mid_call_leaves_only_that_calls_reservation_until_the_ttl() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let toml =
        config(&fake, &redis.url(), "deny", "200ms").replace("[runs]\n", "[runs]\nttl = \"1s\"\n");
    let a = Process::spawn(&toml, &[], &[]).await;
    let b = Process::spawn(&toml, &[], &[]).await;
    let held = call(
        true,
        &[
            ("x-run-id", "dies"),
            ("x-request-budget-ms", "1000"),
            ("x-fake-freeze-after", "1"),
        ],
        0,
    );
    let (resp, _c) = Conn::open(a.addr).await.send(held).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    crate::support::read_events(&mut body, 1).await;
    a.kill().await;
    let (status, headers, _) = send(
        &b,
        call(
            false,
            &[("x-run-id", "dies"), ("x-request-budget-ms", "1000")],
            1,
        ),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        headers["x-run-calls-left"], "8",
        "the dead call still counts"
    );
    // The live call gives its reservation back in the background, off the answer's path.
    let settle = Instant::now() + Duration::from_secs(5);
    let run = loop {
        let text = crate::support::admin_get(b.admin, "/runs/dies").await;
        let run: serde_json::Value = serde_json::from_str(&text).unwrap();
        if run["runs"][0]["used"]["in_flight"] == 1 || Instant::now() > settle {
            break run;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let used = &run["runs"][0]["used"];
    assert_eq!(used["calls"], 2, "{run}");
    assert_eq!(used["in_flight"], 1, "only the dead call: {run}");
    assert_eq!(used["tokens_reserved"], 1024, "only its reservation: {run}");
    // Gone with its keys: ttl (1 s) plus the last call's budget (1 s) after its admission.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = crate::support::admin_get(b.admin, "/runs/dies").await;
        if text.contains("\"no_run\"") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run's keys never expired: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A replica killed mid-call (audit GA 1): its call's reservation and in-flight slot are
/// given back once that call's budget and the time its end would be retried (here the 1 s
/// ttl) have passed, by the run's next admission on another replica; and a run that ended
/// meanwhile is counted then, where before it stayed "in flight" and was never counted.
#[tokio::test]
async fn a_replica_killed_mid_call_has_its_reservation_given_back_after_the_calls_budget() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let toml = with_tokens(config(&fake, &redis.url(), "deny", "200ms"))
        .replace("[runs]\n", "[runs]\nttl = \"1s\"\n")
        .replace("run_max_calls = 10", "run_max_calls = 2")
        .replace("run_budget = \"1500ms\"", "run_budget = \"60s\"");
    let a = Process::spawn(&toml, &[], &[]).await;
    let b = Process::spawn(&toml, &[], &[]).await;
    let run = [("x-run-id", "killed")];
    let mut held = run.to_vec();
    held.extend([
        ("x-request-budget-ms", "1000"),
        ("x-fake-freeze-after", "1"),
    ]);
    let (resp, _c) = Conn::open(a.addr).await.send(call(true, &held, 0)).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    crate::support::read_events(&mut body, 1).await;
    a.kill().await;
    // The survivors' calls keep the run's keys for 5 s past their budget, well past the
    // dead call's expiry (its 1 s budget plus the 1 s ttl).
    let mut alive = run.to_vec();
    alive.push(("x-request-budget-ms", "5000"));
    assert_eq!(send(&b, call(false, &alive, 1)).await.0, 200);
    let (status, _, body) = send(&b, call(false, &alive, 2)).await;
    assert_eq!(status, 429, "the run has made its 2 calls: {body}");
    let ended = "hourglass_runs_total{end=\"calls\",route=\"agent\"}";
    let counted = || async {
        crate::support::scrape(b.admin)
            .await
            .lines()
            .find_map(|l| l.strip_prefix(ended)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let state = run_state(&b, "killed", |u| u["in_flight"] == 1).await;
    assert_eq!(state["runs"][0]["used"]["tokens_reserved"], 500, "{state}");
    assert_eq!(counted().await, 0.0, "the dead call is in flight");
    let deadline = Instant::now() + Duration::from_secs(10);
    while counted().await == 0.0 {
        assert!(
            Instant::now() < deadline,
            "the run's end was never counted: {}",
            crate::support::admin_get(b.admin, "/runs/killed").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, _, body) = send(&b, call(false, &alive, 3)).await;
        assert_eq!(status, 429, "{body}");
    }
    let (status, _, _) = send(&b, call(false, &alive, 4)).await;
    assert_eq!(status, 429);
    assert_eq!(counted().await, 1.0, "counted once");
    let state = run_state(&b, "killed", |u| u["in_flight"] == 0).await;
    let used = &state["runs"][0]["used"];
    assert_eq!(used["in_flight"], 0, "{state}");
    assert_eq!(used["tokens_reserved"], 0, "{state}");
    assert_eq!(used["calls"], 2, "{state}");
}

/// What a killed replica leaves (or a store restored from an older snapshot holds): a
/// reservation whose end never comes. Driven as the store sends the scripts: the expired
/// reservation is given back by the next admission, which counts the ended run's end once;
/// one not yet expired is kept; the dead call's end, should it come after all, changes
/// nothing.
#[tokio::test]
async fn an_expired_reservation_is_given_back_by_the_runs_next_admission() {
    use redis::{Script, Value};
    let Some((redis, _fake)) = redis_and_fake().await else {
        return;
    };
    let client = redis::Client::open(redis.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut own = conn.clone();
    let admit_lua = Script::new(include_str!("../../src/runs/redis/admit.lua"));
    let finish_lua = Script::new(include_str!("../../src/runs/redis/finish.lua"));
    let int = |v: &Value| match v {
        Value::Int(n) => *n,
        other => panic!("{other:?}"),
    };
    // max_calls 2, max_tokens 1000, reserve 100, given back `life` ms after its arrival.
    let admit = |token: &'static str, life: u64| {
        let (script, mut conn) = (&admit_lua, conn.clone());
        async move {
            let reply: Vec<Value> = script
                .key("hg:{-/lost}")
                .arg("agent")
                .arg("")
                .arg("")
                .arg(2)
                .arg(1000)
                .arg("")
                .arg(100)
                .arg(100)
                .arg("")
                .arg("")
                .arg(100)
                .arg(0)
                .arg(60_000)
                .arg(token)
                .arg(life)
                .invoke_async(&mut conn)
                .await
                .unwrap();
            (int(&reply[0]), reply.get(1).map_or(-1, int))
        }
    };
    let finish = |token: &'static str| {
        let (script, mut conn) = (&finish_lua, conn.clone());
        async move {
            let reply: Vec<Value> = script
                .key("hg:{-/lost}")
                .arg(100)
                .arg(10)
                .arg("-")
                .arg("")
                .arg(60_000)
                .arg("")
                .arg(token)
                .invoke_async(&mut conn)
                .await
                .unwrap();
            reply.first().map_or(-1, int)
        }
    };
    let hash = || {
        let mut conn = conn.clone();
        async move {
            let h: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
                .arg("hg:{-/lost}")
                .query_async(&mut conn)
                .await
                .unwrap();
            let n = |k: &str| h.get(k).map_or(0, |v| v.parse::<i64>().unwrap());
            (n("calls"), n("in_flight"), n("reserved"), n("used"))
        }
    };
    // `dead` is never finished; `live` is; the third call ends the run with `dead` in flight.
    assert_eq!(admit("dead", 300).await.0, 1);
    assert_eq!(admit("live", 60_000).await.0, 1);
    assert_eq!(admit("third", 60_000).await, (0, 0), "ended, not counted");
    assert_eq!(finish("live").await, 0, "`dead` is still in flight");
    assert_eq!(hash().await, (2, 1, 100, 10));
    assert_eq!(admit("early", 60_000).await, (0, 0), "not expired yet");
    assert_eq!(hash().await, (2, 1, 100, 10));
    // Past its expiry by Redis's clock.
    let now = || async {
        let (s, us): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut own.clone())
            .await
            .unwrap();
        s * 1000 + us / 1000
    };
    let from = now().await;
    while now().await < from + 400 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        admit("next", 60_000).await,
        (0, 1),
        "the run's end, counted now"
    );
    assert_eq!(hash().await, (2, 0, 0, 10));
    assert_eq!(
        admit("next", 60_000).await,
        (0, 1),
        "sent again, it says so again"
    );
    assert_eq!(admit("after", 60_000).await, (0, 0), "counted once");
    assert_eq!(
        finish("dead").await,
        -1,
        "the dead call's late end gives nothing back"
    );
    assert_eq!(hash().await, (2, 0, 0, 10));
    let left: Vec<String> = redis::cmd("HKEYS")
        .arg("hg:{-/lost}")
        .query_async(&mut own)
        .await
        .unwrap();
    assert!(
        !left
            .iter()
            .any(|f| f.starts_with("p:") || f.starts_with("e:") || f == "reclaim"),
        "{left:?}"
    );
}

/// `toml` with a token budget on the run (100,000, 500 reserved a call): what a frozen
/// store would otherwise leave reserved shows.
fn with_tokens(toml: String) -> String {
    toml.replace(
        "run_max_calls = 10",
        "run_max_calls = 10\nrun_max_tokens = 100000\nrun_token_estimate = 500",
    )
}

/// The run's state in `p`'s store, once `settled` says it is what the test waits for (the
/// end of a call reaches a shared store a moment after its answer), or after 5 s.
async fn run_state(
    p: &Process,
    id: &str,
    settled: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = crate::support::admin_get(p.admin, &format!("/runs/{id}")).await;
        let run: serde_json::Value = serde_json::from_str(&text).unwrap();
        if settled(&run["runs"][0]["used"]) || Instant::now() > deadline {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Redis freezes (a long fork, a stalled host) while calls wait on it: each call stops
/// waiting at its store timeout, but its admission script was sent, and Redis runs it when
/// it thaws. What those admissions reserved is given back; `allow` served its calls (they
/// count), `deny` refused them (they do not).
#[tokio::test]
async fn admissions_redis_runs_after_the_call_stopped_waiting_are_given_back() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let toml = with_tokens(config(&fake, &redis.url(), "allow", "100ms"));
    let allow = Process::spawn(&toml, &[], &[]).await;
    let deny = Process::spawn(&toml.replace("\"allow\"", "\"deny\""), &[], &[]).await;
    for (p, id, served) in [(&allow, "thaw-allow", 200), (&deny, "thaw-deny", 503)] {
        let run = [("x-run-id", id), ("x-run-budget-ms", "60000")];
        assert_eq!(send(p, call(false, &run, 0)).await.0, 200);
        redis.pause();
        let (one, two, three) = tokio::join!(
            send(p, call(false, &run, 1)),
            send(p, call(false, &run, 2)),
            send(p, call(false, &run, 3)),
        );
        for (status, headers, body) in [one, two, three] {
            assert_eq!(status, served, "{body}");
            assert!(!headers.contains_key("x-run-calls-left"));
        }
        // Longer than the store connection's response timeout (500 ms): the manager gives
        // that connection up, and the scripts sent on it run on the thaw all the same.
        tokio::time::sleep(Duration::from_millis(800)).await;
        redis.resume();
        let calls = if served == 200 { 4 } else { 1 };
        let state = run_state(p, id, |u| {
            u["in_flight"] == 0 && u["tokens_reserved"] == 0 && u["calls"] == calls
        })
        .await;
        let used = &state["runs"][0]["used"];
        assert_eq!(used["tokens_reserved"], 0, "{state}");
        assert_eq!(used["in_flight"], 0, "{state}");
        assert_eq!(used["calls"], calls, "{state}");
    }
}

/// A call that ends while Redis is frozen still gives its reservation back: the end is sent
/// again once the store answers, not dropped with the first try (here also the first use of
/// `finish.lua`, whose EVALSHA is answered NOSCRIPT only on the thaw).
#[tokio::test]
async fn a_call_that_ends_while_redis_is_frozen_gives_its_reservation_back_on_the_thaw() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let toml = with_tokens(config(&fake, &redis.url(), "deny", "100ms"));
    let a = Process::spawn(&toml, &[], &[]).await;
    let req = call(
        true,
        &[
            ("x-run-id", "frozen-end"),
            ("x-run-budget-ms", "60000"),
            ("x-fake-chunks", "5"),
            ("x-fake-interval-ms", "50"),
        ],
        0,
    );
    let (resp, _c) = Conn::open(a.addr).await.send(req).await;
    assert_eq!(resp.status(), 200);
    redis.pause();
    let read = read_body(resp.into_body()).await;
    assert!(read.error_event().is_none(), "the stream is whole");
    // Past the store timeout (100 ms) and the connection's response timeout (500 ms).
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.resume();
    let state = run_state(&a, "frozen-end", |u| {
        u["in_flight"] == 0 && u["tokens_reserved"] == 0
    })
    .await;
    let used = &state["runs"][0]["used"];
    assert_eq!(used["in_flight"], 0, "{state}");
    assert_eq!(used["tokens_reserved"], 0, "{state}");
    assert_eq!(used["calls"], 1, "{state}");
    assert!(
        used["tokens"].as_u64().unwrap() > 0,
        "what it used: {state}"
    );
}

/// A gateway shut down (SIGTERM) while a call's end waits on a frozen Redis sends it once
/// Redis answers, before it exits (audit GA 2): before, the drain ended with the client's
/// connection, the end was dropped with the runtime, and the run kept the call in flight
/// and its reservation.
#[tokio::test]
async fn a_shutdown_waits_for_the_call_ends_the_store_has_not_answered() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let toml = with_tokens(config(&fake, &redis.url(), "deny", "100ms"));
    let a = Process::spawn(&toml, &[], &[]).await;
    let req = call(
        true,
        &[
            ("x-run-id", "shutdown-end"),
            ("x-run-budget-ms", "60000"),
            ("x-fake-chunks", "3"),
            ("x-fake-interval-ms", "20"),
        ],
        0,
    );
    let (resp, conn) = Conn::open(a.addr).await.send(req).await;
    assert_eq!(resp.status(), 200);
    redis.pause();
    let read = read_body(resp.into_body()).await;
    assert!(read.error_event().is_none(), "the stream is whole");
    drop(conn);
    let ((_, err), ()) = tokio::join!(a.stop(), async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        redis.resume();
    });
    assert!(!err.contains("still unsent at shutdown"), "{err}");
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let h: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg("hg:{-/shutdown-end}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(h["in_flight"], "0", "{h:?}");
    assert_eq!(h["reserved"], "0", "{h:?}");
    assert_ne!(h["used"], "0", "what it used: {h:?}");
}

/// A run's end is counted even when the calls that would count it stopped waiting for
/// Redis: the admission that ended the run with none in flight (its answer never read), and
/// the last call in flight of a run that a neighbour's refusal ended (it is given back by
/// cancel.lua, not finished by finish.lua).
#[tokio::test]
async fn a_runs_end_is_counted_when_the_calls_that_end_it_stopped_waiting_for_redis() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let toml = config(&fake, &redis.url(), "allow", "100ms")
        .replace("run_max_calls = 10", "run_max_calls = 1");
    let p = Process::spawn(&toml, &[], &[]).await;
    let ended = "hourglass_runs_total{end=\"calls\",route=\"agent\"}";
    let counted = |n: f64| {
        let admin = p.admin;
        async move {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let text = crate::support::scrape(admin).await;
                let seen = text
                    .lines()
                    .find_map(|l| l.strip_prefix(ended)?.trim().parse::<f64>().ok())
                    .unwrap_or(0.0);
                if seen >= n || Instant::now() > deadline {
                    return seen;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };

    // The run's one call is served and finished; the next is refused on the thaw, with
    // nobody left waiting for the refusal.
    let run = [("x-run-id", "late-refusal"), ("x-run-budget-ms", "60000")];
    assert_eq!(send(&p, call(false, &run, 0)).await.0, 200);
    redis.pause();
    let (status, _, body) = send(&p, call(false, &run, 1)).await;
    assert_eq!(status, 200, "served without run limits: {body}");
    // Past the store timeout (100 ms) and the connection's response timeout (500 ms).
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.resume();
    assert_eq!(counted(1.0).await, 1.0, "the refusal's end");

    // Both calls stop waiting; on the thaw the first is admitted, the second refused (the
    // run ends with the first in flight), and the first's cancel is its last call's end.
    let run = [("x-run-id", "late-last-call"), ("x-run-budget-ms", "60000")];
    redis.pause();
    let first = send(&p, call(false, &run, 0));
    let second = async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        send(&p, call(false, &run, 1)).await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!((first.0, second.0), (200, 200));
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.resume();
    let n = counted(2.0).await;
    let state = run_state(&p, "late-last-call", |u| u["in_flight"] == 0).await;
    assert_eq!(
        n, 2.0,
        "the end of the run whose call was given back: {state}"
    );
    let used = &state["runs"][0]["used"];
    assert_eq!(used["in_flight"], 0, "{state}");
    assert_eq!(used["calls"], 1, "{state}");
    assert_eq!(state["runs"][0]["ended"], "calls", "{state}");

    // The run ends while its one call streams (the next call is refused); that call ends
    // while Redis is frozen, and the answer of its finish.lua, run on the thaw, is lost with
    // the connection the store client gave up: the finish sent again counts the end.
    let run = [("x-run-id", "late-finish"), ("x-run-budget-ms", "60000")];
    let mut streamed = run.to_vec();
    streamed.extend([("x-fake-chunks", "5"), ("x-fake-interval-ms", "60")]);
    let (resp, _c) = Conn::open(p.addr)
        .await
        .send(call(true, &streamed, 0))
        .await;
    assert_eq!(resp.status(), 200);
    let (status, _, body) = send(&p, call(false, &run, 1)).await;
    assert_eq!(status, 429, "{body}");
    redis.pause();
    let read = read_body(resp.into_body()).await;
    assert!(read.error_event().is_none(), "the stream is whole");
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.resume();
    let n = counted(3.0).await;
    let state = run_state(&p, "late-finish", |u| u["in_flight"] == 0).await;
    assert_eq!(n, 3.0, "the end counted by the last call's finish: {state}");
    assert_eq!(state["runs"][0]["used"]["calls"], 1, "{state}");
}

/// A run is forgotten `ttl` after its last call: its keys expire then, not `ttl` plus the
/// budget the call had when it was admitted.
#[tokio::test]
async fn a_finished_runs_keys_live_ttl_after_its_last_call() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let toml =
        config(&fake, &redis.url(), "deny", "200ms").replace("[runs]\n", "[runs]\nttl = \"2s\"\n");
    let a = Process::spawn(&toml, &[], &[]).await;
    let run = [("x-run-id", "ttl"), ("x-request-budget-ms", "30000")];
    assert_eq!(send(&a, call(false, &run, 0)).await.0, 200);
    run_state(&a, "ttl", |u| u["in_flight"] == 0).await;
    let pttl: i64 = redis
        .query("PTTL hg:{-/ttl}")
        .await
        .trim_start_matches(':')
        .parse()
        .unwrap();
    assert!((1..=2000).contains(&pttl), "ttl, not ttl + 30 s: {pttl}");
}

/// An admission sent twice (redis.rs sends it again when the connection dropped under the
/// first, which Redis may still have run) admits the call once; one that comes after the
/// call's cancel admits nothing; a refusal that counted the run's end says so again. The
/// scripts are driven as the store sends them (argument layouts at the top of each).
#[tokio::test]
async fn an_admission_sent_twice_takes_once() {
    use redis::{Script, Value};
    let Some((redis, _fake)) = redis_and_fake().await else {
        return;
    };
    let client = redis::Client::open(redis.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut own = conn.clone();
    let admit_lua = Script::new(include_str!("../../src/runs/redis/admit.lua"));
    let finish_lua = Script::new(include_str!("../../src/runs/redis/finish.lua"));
    let cancel_lua = Script::new(include_str!("../../src/runs/redis/cancel.lua"));
    let int = |v: &Value| match v {
        Value::Int(n) => *n,
        other => panic!("{other:?}"),
    };
    // max_calls 1, max_tokens 1000, reserve 100; the answer's first two fields.
    let admit = |run: &'static str, token: &'static str| {
        let (script, mut conn) = (&admit_lua, conn.clone());
        async move {
            let reply: Vec<Value> = script
                .key(format!("hg:{{-/{run}}}"))
                .arg("agent")
                .arg("")
                .arg("")
                .arg(1)
                .arg(1000)
                .arg("")
                .arg(100)
                .arg(100)
                .arg("")
                .arg("")
                .arg(100)
                .arg(0)
                .arg(60_000)
                .arg(token)
                .invoke_async(&mut conn)
                .await
                .unwrap();
            (int(&reply[0]), reply.get(1).map_or(-1, int))
        }
    };
    let hash = |run: &str| {
        let mut conn = conn.clone();
        let key = format!("hg:{{-/{run}}}");
        async move {
            let h: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            let n = |k: &str| h.get(k).map_or(0, |v| v.parse::<i64>().unwrap());
            (n("calls"), n("in_flight"), n("reserved"), n("used"))
        }
    };
    // Twice, then its end: one call, none in flight, nothing reserved.
    assert_eq!(admit("twice", "t1").await.0, 1);
    assert_eq!(
        admit("twice", "t1").await.0,
        1,
        "the copy answers as the first"
    );
    let _: Vec<Value> = finish_lua
        .key("hg:{-/twice}")
        .arg(100)
        .arg(10)
        .arg("-")
        .arg("")
        .arg(60_000)
        .arg("")
        .arg("t1")
        .invoke_async(&mut own)
        .await
        .unwrap();
    assert_eq!(hash("twice").await, (1, 0, 0, 10));
    // Admitted, cancelled (never served), then the copy: refused as cancelled.
    assert_eq!(admit("late", "t2").await.0, 1);
    let _: Vec<Value> = cancel_lua
        .key("hg:{-/late}")
        .arg("t2")
        .arg("1")
        .arg(60_000)
        .invoke_async(&mut own)
        .await
        .unwrap();
    assert_eq!(
        admit("late", "t2").await.0,
        2,
        "the copy after the cancel admits nothing"
    );
    assert_eq!(hash("late").await, (0, 0, 0, 0));
    // Cancelled before its admission ever came, the run not yet made: the tombstone alone
    // (a field of the run's hash, the scripts' one key) turns it into a no-op, and the run's
    // next call still starts it afresh.
    let _: Vec<Value> = cancel_lua
        .key("hg:{-/early}")
        .arg("t5")
        .arg("1")
        .arg(60_000)
        .invoke_async(&mut own)
        .await
        .unwrap();
    assert_eq!(admit("early", "t5").await.0, 2);
    assert_eq!(admit("early", "t6").await.0, 1, "a fresh run");
    assert_eq!(hash("early").await, (1, 1, 100, 0));
    let ttl: i64 = redis::cmd("PTTL")
        .arg("hg:{-/early}")
        .query_async(&mut own)
        .await
        .unwrap();
    assert!(ttl > 0, "the tombstone's hash expires: {ttl}");
    // The refusal that ended a run with nothing in flight, sent twice: both say so, once
    // for the token that counts it.
    assert_eq!(admit("twice", "t3").await, (0, 1));
    assert_eq!(admit("twice", "t3").await, (0, 1));
    assert_eq!(
        admit("twice", "t4").await,
        (0, 0),
        "counted by t3, not again"
    );
}

/// A client that leaves while its call waits on a paused Redis drops the admission's
/// future: what the script reserves when Redis thaws is given back all the same, as for a
/// call that stopped waiting at its store timeout. Before, the run kept the call in flight
/// and its reservation until the key expired.
#[tokio::test]
async fn an_admission_the_client_left_is_given_back() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let toml = with_tokens(config(&fake, &redis.url(), "deny", "5s"));
    let p = Process::spawn(&toml, &[], &[]).await;
    let run = [("x-run-id", "left"), ("x-run-budget-ms", "60000")];
    assert_eq!(send(&p, call(false, &run, 0)).await.0, 200);
    redis.pause();
    let waiting = tokio::spawn(Conn::open(p.addr).await.send(call(false, &run, 1)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The client goes, its connection with it, while the admission waits on Redis.
    waiting.abort();
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.resume();
    let state = run_state(&p, "left", |u| {
        u["in_flight"] == 0 && u["tokens_reserved"] == 0
    })
    .await;
    let used = &state["runs"][0]["used"];
    assert_eq!(used["in_flight"], 0, "{state}");
    assert_eq!(used["tokens_reserved"], 0, "{state}");
    assert_eq!(used["calls"], 1, "only the call that was served: {state}");
}

/// The first look at a run after Redis restarted is answered: the command finds the old
/// connection broken (the manager reconnects only then) and is sent once more on the new
/// one, as an admission is. Before, each replica's first `/runs/{id}` was a 503 "broken
/// pipe" with Redis up.
#[tokio::test]
async fn the_first_look_at_a_run_after_redis_restarted_is_answered() {
    let Some((mut redis, fake)) = redis_and_fake().await else {
        return;
    };
    let port = redis.port();
    let p = Process::spawn(&config(&fake, &redis.url(), "deny", "1s"), &[], &[]).await;
    let run = [("x-run-id", "kept"), ("x-run-budget-ms", "60000")];
    assert_eq!(send(&p, call(false, &run, 0)).await.0, 200);
    assert!(reqwest_like_get(p.admin, "/runs/kept")
        .await
        .contains("\"calls\":1"));
    redis.stop();
    let _redis = RedisServer::on(port).await;
    // The restarted Redis keeps nothing (persistence off): no such run, said so.
    let found = reqwest_like_get(p.admin, "/runs/kept").await;
    assert!(found.contains("\"no_run\""), "{found}");
}

/// How replicas reach Redis: passwords, ACL users, a cluster, TLS.
mod connecting;
/// A run whose key is gone at a call's end.
mod lost;
/// A Redis that answers with an error, and the tombstones of cancels.
mod refusals;
/// A run's time against a Redis far away.
mod store_trip;
