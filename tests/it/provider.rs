//! Provider-aware streams: recorded OpenAI Chat Completions, Responses API and Anthropic
//! Messages streams (tests/fixtures/) replayed through the fake provider at a realistic pace,
//! checking what counts as the first token, the token accounting (reported, and estimated
//! when a stream is cut by any origin), mid-stream provider errors and `include_usage`.

use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use hourglass::provider::inspect::Inspector;
use hourglass::provider::Format;
use hourglass_fake::{FakeUpstream, Replay};
use http::Request;
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;

mod absurd_usage;
mod background;
mod usage_chunk;

const CHAT: &str = include_str!("../fixtures/openai_chat.sse");
const CHAT_ERROR: &str = include_str!("../fixtures/openai_chat_error.sse");
const MESSAGES: &str = include_str!("../fixtures/anthropic_messages.sse");
const MESSAGES_ERROR: &str = include_str!("../fixtures/anthropic_messages_error.sse");
const RESPONSES: &str = include_str!("../fixtures/openai_responses.sse");
const RESPONSES_ERROR: &str = include_str!("../fixtures/openai_responses_error.sse");

/// The test harness's config plus a Responses route and a route on a path no format is
/// known for.
fn config(extra_upstream: &str, extra: &str) -> String {
    BASE.replace(
        "auth = \"bearer\"\n",
        &format!("auth = \"bearer\"\n{extra_upstream}\n"),
    ) + r#"
[[routes]]
name = "responses"
path_prefix = "/v1/responses"
upstream = "fake"

[[routes]]
name = "custom"
path_prefix = "/custom"
upstream = "fake"
"# + extra
}

async fn harness(extra_upstream: &str) -> Harness {
    Harness::with_config(&config(extra_upstream, "")).await
}

fn post(path: &str, body: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::post(path)
        .header("host", "gateway")
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::from(body.to_owned()))).unwrap()
}

const STREAM_BODY: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"Weather in Paris?"}]}"#;

/// Where each fixture is served and under which route name.
fn route_of(format: Format) -> (&'static str, &'static str) {
    match format {
        Format::Chat => ("/v1/chat/completions", "chat"),
        Format::Messages => ("/v1/messages", "messages"),
        Format::Responses => ("/v1/responses", "responses"),
    }
}

/// What the inspector makes of the first `n` events of a fixture (what a stream cut after
/// them has cost): (prompt reported, completion estimate).
fn cost_of_first(format: Format, fixture: &str, n: usize) -> (Option<u64>, u64) {
    let mut i = Inspector::new(format, true);
    for e in fixture.split_inclusive("\n\n").take(n) {
        i.feed(e.as_bytes());
    }
    let t = i.tokens();
    (t.prompt(), t.estimated_completion())
}

fn tokens(route: &str, kind: &str, source: &str) -> String {
    format!("hourglass_tokens_total{{kind=\"{kind}\",route=\"{route}\",source=\"{source}\",upstream=\"fake\"}}")
}

fn hist_sum(name: &str, route: &str) -> String {
    format!("hourglass_{name}_seconds_sum{{route=\"{route}\",upstream=\"fake\"}}")
}

/// Replays `fixture` with `interval` between events (the first after `ttft`) and checks
/// that it arrives byte for byte, that the first token is the event at `first_output`
/// (not the first event or byte), and that the provider's usage is counted as reported.
async fn replay_whole(
    format: Format,
    fixture: &str,
    first_output: u32,
    prompt: f64,
    completion: f64,
) {
    let h = harness("").await;
    let interval = Duration::from_millis(40);
    h.fake.set_replay(Some(Replay::sse(fixture, interval)));
    let (path, route) = route_of(format);
    let (resp, _c) = h
        .send(post(path, STREAM_BODY, &[("x-fake-ttft-ms", "100")]))
        .await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(read.error.is_none());
    assert!(read.text() == fixture, "byte for byte");
    h.wait_requests(route, 1.0).await;
    let ttfb = h.metric(&hist_sum("time_to_first_byte", route)).await;
    let ttft = h.metric(&hist_sum("time_to_first_token", route)).await;
    assert!(
        ttfb >= 0.095,
        "first byte after the provider's 100ms: {ttfb}"
    );
    // The events before the first output (role preamble, message_start, pings,
    // response.created ...) do not count: the first token is `first_output` intervals later.
    let gap = ttft - ttfb;
    let expect = interval.as_secs_f64() * f64::from(first_output);
    assert!(
        gap >= expect - 0.02 && gap < expect + 0.5,
        "first token {gap}s after the first byte, expected about {expect}s"
    );
    assert_eq!(h.metric(&tokens(route, "prompt", "reported")).await, prompt);
    assert_eq!(
        h.metric(&tokens(route, "completion", "reported")).await,
        completion
    );
    assert_eq!(
        h.metric(&tokens(route, "completion", "estimated")).await,
        0.0
    );
    assert_eq!(
        h.metric(&format!(
            "hourglass_requests_total{{outcome=\"ok\",route=\"{route}\"}}"
        ))
        .await,
        1.0
    );
}

#[tokio::test]
async fn chat_completions_with_reasoning_tool_calls_and_usage() {
    // Role preamble first; reasoning_content from the second event.
    replay_whole(Format::Chat, CHAT, 1, 184.0, 62.0).await;
}

#[tokio::test]
async fn anthropic_messages_with_thinking_tool_use_pings_and_usage() {
    // message_start, content_block_start and a ping before the first thinking delta;
    // prompt = input + cache reads + cache writes.
    replay_whole(Format::Messages, MESSAGES, 3, 2520.0, 89.0).await;
}

#[tokio::test]
async fn responses_api_with_reasoning_summary_function_call_and_usage() {
    // created, in_progress, output_item.added and summary_part.added come first.
    replay_whole(Format::Responses, RESPONSES, 4, 75.0, 214.0).await;
}

#[tokio::test]
async fn events_split_across_frames_are_read_the_same() {
    // The same stream in 37-byte frames: the gateway holds partial events, the inspector
    // reads across the pieces.
    let h = harness("").await;
    let pieces: Vec<Bytes> = MESSAGES
        .as_bytes()
        .chunks(37)
        .map(Bytes::copy_from_slice)
        .collect();
    h.fake.set_replay(Some(Replay {
        content_type: "text/event-stream",
        events: pieces.into(),
        interval: Duration::from_millis(1),
    }));
    let (resp, _c) = h.send(post("/v1/messages", STREAM_BODY, &[])).await;
    let read = read_body(resp.into_body()).await;
    assert!(read.text() == MESSAGES);
    h.wait_requests("messages", 1.0).await;
    assert_eq!(
        h.metric(&tokens("messages", "prompt", "reported")).await,
        2520.0
    );
    assert_eq!(
        h.metric(&tokens("messages", "completion", "reported"))
            .await,
        89.0
    );
}

#[tokio::test]
async fn mid_stream_provider_errors_pass_through_end_the_stream_and_are_counted() {
    for (format, fixture, kind) in [
        (Format::Chat, CHAT_ERROR, "server_error"),
        (Format::Messages, MESSAGES_ERROR, "overloaded_error"),
        (Format::Responses, RESPONSES_ERROR, "server_error"),
    ] {
        let h = harness("").await;
        h.fake
            .set_replay(Some(Replay::sse(fixture, Duration::from_millis(10))));
        let (path, route) = route_of(format);
        let (resp, _c) = h.send(post(path, STREAM_BODY, &[])).await;
        let read = read_body(resp.into_body()).await;
        assert!(read.error.is_none());
        // Everything up to and including the provider's error event, unchanged; nothing
        // after it, and no error event of Hourglass's own.
        let at = fixture
            .find("event: error")
            .or(fixture.find("data: {\"error\""))
            .unwrap();
        let end = at + fixture[at..].find("\n\n").unwrap() + 2;
        assert!(read.text() == fixture[..end], "{route}: {}", read.text());
        h.wait_requests(route, 1.0).await;
        assert_eq!(
            h.metric(&format!(
                "hourglass_upstream_stream_errors_total{{route=\"{route}\",type=\"{kind}\",upstream=\"fake\"}}"
            ))
            .await,
            1.0
        );
        assert_eq!(
            h.metric(&format!(
                "hourglass_requests_total{{outcome=\"error\",route=\"{route}\"}}"
            ))
            .await,
            1.0
        );
        // No usage came: the output streamed before the error is estimated.
        let events = fixture[..end].matches("\n\n").count();
        let (prompt, estimate) = cost_of_first(format, fixture, events - 1);
        assert!(estimate > 0);
        assert_eq!(
            h.metric(&tokens(route, "completion", "estimated")).await,
            estimate as f64,
            "{route}"
        );
        assert_eq!(
            h.metric(&tokens(route, "prompt", "reported")).await,
            prompt.unwrap_or(0) as f64
        );
    }
}

#[tokio::test]
async fn non_streaming_answers_report_their_usage() {
    for (format, body, prompt, completion) in [
        (
            Format::Chat,
            include_str!("../fixtures/openai_chat.json"),
            19.0,
            10.0,
        ),
        (
            Format::Messages,
            include_str!("../fixtures/anthropic_message.json"),
            121.0,
            14.0,
        ),
        (
            Format::Responses,
            include_str!("../fixtures/openai_responses.json"),
            75.0,
            214.0,
        ),
    ] {
        let h = harness("").await;
        h.fake.set_replay(Some(Replay::json(body)));
        let (path, route) = route_of(format);
        let (resp, _c) = h.send(post(path, r#"{"model":"m"}"#, &[])).await;
        assert_eq!(resp.status(), 200);
        let got = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(got == body.as_bytes());
        h.wait_requests(route, 1.0).await;
        assert_eq!(h.metric(&tokens(route, "prompt", "reported")).await, prompt);
        assert_eq!(
            h.metric(&tokens(route, "completion", "reported")).await,
            completion
        );
    }
}

#[tokio::test]
async fn include_usage_is_asked_for_on_openai_chat_streams_only() {
    let h = harness("include_usage = true").await;
    let plain = r#"{"model":"m","stream":false,"messages":[]}"#;
    for (path, body) in [
        ("/v1/chat/completions", STREAM_BODY),
        ("/v1/chat/completions", plain),
        ("/v1/messages", STREAM_BODY),
    ] {
        let (resp, _c) = h.send(post(path, body, &[("x-fake-chunks", "1")])).await;
        read_body(resp.into_body()).await;
    }
    let bodies: Vec<Bytes> = h.fake.requests().into_iter().map(|r| r.body).collect();
    let want = format!(
        "{},\"stream_options\":{{\"include_usage\":true}}}}",
        &STREAM_BODY[..STREAM_BODY.len() - 1]
    );
    assert_eq!(bodies[0], want.as_bytes(), "added, nothing else changed");
    assert_eq!(bodies[1], plain.as_bytes(), "not a stream");
    assert_eq!(
        bodies[2],
        STREAM_BODY.as_bytes(),
        "not an OpenAI chat request"
    );
    // Off by default.
    let h = harness("").await;
    let (resp, _c) = h.send(post("/v1/chat/completions", STREAM_BODY, &[])).await;
    read_body(resp.into_body()).await;
    assert_eq!(h.fake.requests()[0].body, STREAM_BODY.as_bytes());
}

#[test]
fn api_and_include_usage_in_the_config() {
    use hourglass::config::Config;
    let load = |upstream: &str| {
        let text = config(upstream, "").replace("{FAKE}", "http://127.0.0.1:1");
        Config::from_toml(&text, "t.toml")
    };
    let c = load("api = \"openai\"\ninclude_usage = true").unwrap();
    assert_eq!(c.upstreams[0].api, hourglass::provider::Api::OpenAi);
    assert!(c.upstreams[0].include_usage);
    assert!(c.describe().contains(", api openai, include_usage true"));
    let c = load("").unwrap();
    assert_eq!(c.upstreams[0].api, hourglass::provider::Api::Auto);
    assert!(!c.upstreams[0].include_usage);
    assert!(c.upstreams[0].assembled_usage);
    assert!(!c.describe().contains("api "));
    assert!(!c.describe().contains("include_usage"));
    // Set false: `stream_upstream` does not ask for the usage either (Mistral refuses it).
    let c = load("include_usage = false").unwrap();
    assert!(!c.upstreams[0].include_usage && !c.upstreams[0].assembled_usage);
    assert!(c.describe().contains(", include_usage false"));
    assert_eq!(
        load("api = \"anthropic\"\ninclude_usage = true")
            .unwrap_err()
            .to_string(),
        "t.toml: upstream \"fake\": include_usage asks OpenAI chat streams for their usage, but api is \"anthropic\" (Anthropic always reports it)"
    );
    let err = load("api = \"gemini\"").unwrap_err().to_string();
    assert!(
        err.starts_with("t.toml:") && err.contains("unknown variant `gemini`"),
        "{err}"
    );
}

#[tokio::test]
async fn the_api_setting_decides_the_format_on_other_paths() {
    // /custom is no known path: with `auto` nothing is inspected and the first data event
    // (message_start) is the first token, as before; with `api = "anthropic"` the stream is
    // read as Messages.
    for (api, precise) in [("", false), ("api = \"anthropic\"", true)] {
        let h = harness(api).await;
        let interval = Duration::from_millis(40);
        h.fake.set_replay(Some(Replay::sse(MESSAGES, interval)));
        let (resp, _c) = h.send(post("/custom/stream", STREAM_BODY, &[])).await;
        let read = read_body(resp.into_body()).await;
        assert!(read.text() == MESSAGES);
        h.wait_requests("custom", 1.0).await;
        let gap = h.metric(&hist_sum("time_to_first_token", "custom")).await
            - h.metric(&hist_sum("time_to_first_byte", "custom")).await;
        let prompt = h.metric(&tokens("custom", "prompt", "reported")).await;
        if precise {
            assert!(gap >= 0.1, "{api}: {gap}");
            assert_eq!(prompt, 2520.0);
        } else {
            assert!(gap < 0.03, "{api}: {gap}");
            assert_eq!(prompt, 0.0);
        }
    }
}

#[tokio::test]
async fn preambles_and_pings_do_not_satisfy_the_first_token_limit() {
    // message_start, content_block_start and a ping, then silence: without a token the
    // first-token limit fires (the idle limit, shorter, does not apply before it).
    let h = Harness::with_config(
        &config("", "")
            .replace(
                "first_token_timeout = \"2s\"",
                "first_token_timeout = \"600ms\"",
            )
            .replace("idle_timeout = \"1s\"", "idle_timeout = \"200ms\""),
    )
    .await;
    h.fake
        .set_replay(Some(Replay::sse(MESSAGES, Duration::from_millis(20))));
    let start = Instant::now();
    let (resp, _c) = h
        .send(post(
            "/v1/messages",
            STREAM_BODY,
            &[("x-fake-freeze-after", "3")],
        ))
        .await;
    let read = read_body(resp.into_body()).await;
    let took = start.elapsed();
    assert_eq!(
        read.error_event().expect("an error event")["code"],
        "first_token_timeout"
    );
    assert!(
        took >= Duration::from_millis(600) && took < Duration::from_secs(5),
        "{took:?}"
    );
    h.wait_requests("messages", 1.0).await;
    assert_eq!(
        h.metric("hourglass_cancellations_total{origin=\"first_token\",route=\"messages\"}")
            .await,
        1.0
    );
    // The prompt was reported in message_start; no output was streamed.
    assert_eq!(
        h.metric(&tokens("messages", "prompt", "reported")).await,
        2520.0
    );
    assert_eq!(
        h.metric(&tokens("messages", "completion", "estimated"))
            .await,
        0.0
    );
    assert_eq!(
        h.metric("hourglass_tokens_cancelled_total{origin=\"first_token\",route=\"messages\"}")
            .await,
        0.0
    );
}

#[tokio::test]
async fn a_held_head_waits_for_output_not_for_framing() {
    // A route with a fallback holds the head until the first token. The primary sends
    // Anthropic's framing (message_start, a block start, a ping) and then stalls: that is no
    // token, so the route switches to the backup cleanly.
    let backup = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let text = config(
        "",
        &format!(
            "\n[upstreams.backup]\nurl = \"{}\"\nauth = \"none\"\n",
            backup.url()
        ),
    )
    .replace(
        "name = \"messages\"\npath_prefix = \"/v1/messages\"\nupstream = \"fake\"\n",
        "name = \"messages\"\npath_prefix = \"/v1/messages\"\nupstream = \"fake\"\nfallbacks = [\"backup\"]\nfirst_token_timeout = \"500ms\"\n",
    );
    let h = Harness::with_config(&text).await;
    h.fake
        .set_replay(Some(Replay::sse(MESSAGES, Duration::from_millis(10))));
    h.fake.set_script(&[("x-fake-freeze-after", "3")]);
    backup.set_replay(Some(Replay::sse(MESSAGES, Duration::from_millis(5))));
    let (resp, _c) = h.send(post("/v1/messages", STREAM_BODY, &[])).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(
        read.text() == MESSAGES,
        "the backup's stream, whole and alone"
    );
    assert_eq!(backup.requests().len(), 1);
    h.wait_requests("messages", 1.0).await;
    assert_eq!(
        h.metric("hourglass_fallbacks_total{from=\"fake\",route=\"messages\",to=\"backup\"}")
            .await,
        1.0
    );
}

/// One origin's cut of the Anthropic stream after its first `sent` events: the completion
/// streamed so far is estimated and counted as cancelled by that origin.
async fn assert_cut_cost(h: &Harness, origin: &str, sent: usize) {
    h.wait_requests("messages", 1.0).await;
    assert_eq!(
        h.metric(&format!(
            "hourglass_cancellations_total{{origin=\"{origin}\",route=\"messages\"}}"
        ))
        .await,
        1.0
    );
    let (prompt, estimate) = cost_of_first(Format::Messages, MESSAGES, sent);
    assert!(estimate > 0, "{origin}");
    assert_eq!(
        h.metric(&tokens("messages", "completion", "estimated"))
            .await,
        estimate as f64,
        "{origin}"
    );
    assert_eq!(
        h.metric(&format!(
            "hourglass_tokens_cancelled_total{{origin=\"{origin}\",route=\"messages\"}}"
        ))
        .await,
        estimate as f64,
        "{origin}"
    );
    assert_eq!(
        h.metric(&tokens("messages", "prompt", "reported")).await,
        prompt.unwrap() as f64
    );
    assert_eq!(
        h.metric(&tokens("messages", "completion", "reported"))
            .await,
        0.0
    );
}

/// Replays the Anthropic stream and stops it after `sent` events.
async fn frozen_after(sent: usize, tweak: impl Fn(String) -> String) -> Harness {
    let h = Harness::with_config(&tweak(config("", ""))).await;
    h.fake
        .set_replay(Some(Replay::sse(MESSAGES, Duration::from_millis(10))));
    h.fake
        .set_script(&[("x-fake-freeze-after", &sent.to_string())]);
    h
}

#[tokio::test]
async fn a_stream_cut_by_the_idle_limit_reports_its_estimate() {
    let h = frozen_after(8, |c| {
        c.replace("idle_timeout = \"1s\"", "idle_timeout = \"300ms\"")
    })
    .await;
    let (resp, _c) = h.send(post("/v1/messages", STREAM_BODY, &[])).await;
    let read = read_body(resp.into_body()).await;
    assert_eq!(read.error_event().unwrap()["code"], "idle_timeout");
    assert_cut_cost(&h, "idle", 8).await;
}

#[tokio::test]
async fn a_stream_cut_by_the_deadline_reports_its_estimate() {
    let h = frozen_after(8, |c| c).await;
    let (resp, _c) = h
        .send(post(
            "/v1/messages",
            STREAM_BODY,
            &[("x-request-budget-ms", "700")],
        ))
        .await;
    let read = read_body(resp.into_body()).await;
    assert_eq!(read.error_event().unwrap()["code"], "deadline_exceeded");
    assert_cut_cost(&h, "deadline", 8).await;
}

#[tokio::test]
async fn a_stream_cut_by_the_first_token_limit_reports_its_prompt() {
    // Framing only: nothing streamed, the prompt (from message_start) still counted.
    let h = frozen_after(3, |c| {
        c.replace(
            "first_token_timeout = \"2s\"",
            "first_token_timeout = \"300ms\"",
        )
    })
    .await;
    let (resp, _c) = h.send(post("/v1/messages", STREAM_BODY, &[])).await;
    let read = read_body(resp.into_body()).await;
    assert_eq!(read.error_event().unwrap()["code"], "first_token_timeout");
    h.wait_requests("messages", 1.0).await;
    assert_eq!(
        h.metric("hourglass_cancellations_total{origin=\"first_token\",route=\"messages\"}")
            .await,
        1.0
    );
    assert_eq!(
        h.metric(&tokens("messages", "prompt", "reported")).await,
        2520.0
    );
    assert_eq!(
        h.metric(&tokens("messages", "completion", "estimated"))
            .await,
        0.0
    );
}

#[tokio::test]
async fn a_stream_the_client_left_reports_its_estimate() {
    let h = frozen_after(10, |c| c).await;
    let (resp, c) = h.send(post("/v1/messages", STREAM_BODY, &[])).await;
    let mut body = resp.into_body();
    read_events(&mut body, 10).await;
    drop(body);
    c.close();
    assert_cut_cost(&h, "client", 10).await;
}

#[tokio::test]
async fn a_stream_cut_by_shutdown_reports_its_estimate() {
    let h = frozen_after(8, |c| {
        c.replace("[server]\n", "[server]\nshutdown_grace = \"200ms\"\n")
            .replace("idle_timeout = \"1s\"", "idle_timeout = \"20s\"")
    })
    .await;
    let (resp, _c) = h.send(post("/v1/messages", STREAM_BODY, &[])).await;
    let reader = tokio::spawn(read_body(resp.into_body()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let Harness { gw, fake } = h;
    let metrics = gw.metrics.clone();
    gw.shutdown().await;
    let read = reader.await.unwrap();
    assert_eq!(read.error_event().unwrap()["code"], "shutdown");
    let (prompt, estimate) = cost_of_first(Format::Messages, MESSAGES, 8);
    let text = metrics.encode();
    for line in [
        "hourglass_cancellations_total{origin=\"shutdown\",route=\"messages\"} 1".to_string(),
        format!(
            "hourglass_tokens_cancelled_total{{origin=\"shutdown\",route=\"messages\"}} {estimate}"
        ),
        format!(
            "{} {estimate}",
            tokens("messages", "completion", "estimated")
        ),
        format!(
            "{} {}",
            tokens("messages", "prompt", "reported"),
            prompt.unwrap()
        ),
    ] {
        assert!(text.contains(&line), "missing {line}");
    }
    drop(fake);
}

/// The fake provider's own Responses API (what `hourglass demo` serves to
/// `client.responses.create`), through a Responses route: the first token is the first
/// `response.output_text.delta` (or function-call arguments delta), not `response.created`,
/// usage comes from `response.completed` (or the `response` object), and an idle cut ends
/// the stream with one error event and an estimate.
#[tokio::test]
async fn the_fakes_responses_api_is_read_as_openais() {
    let h = harness("").await;
    let interval = Duration::from_millis(150);
    let body = r#"{"model":"demo","stream":true,"input":"hi"}"#;
    // The fake estimates a prompt from the body without its stream options, so that a
    // streamed call reports what the same call unstreamed does.
    let prompt = (r#"{"model":"demo","input":"hi"}"#.len() / 4) as f64;
    let script = [("x-fake-chunks", "4"), ("x-fake-interval-ms", "150")];
    for (i, tool) in [None, Some("get_weather")].into_iter().enumerate() {
        let mut headers = script.to_vec();
        headers.extend(tool.map(|t| ("x-fake-tool-call", t)));
        let (resp, _c) = h.send(post("/v1/responses", body, &headers)).await;
        assert_eq!(resp.status(), 200);
        let read = read_body(resp.into_body()).await;
        assert!(read.error.is_none());
        assert!(read.text().ends_with("\n\n"), "{}", read.text());
        assert!(
            read.text().contains("event: response.completed\n"),
            "{}",
            read.text()
        );
        let n = (i + 1) as f64;
        h.wait_requests("responses", n).await;
        // The preamble (created, in_progress, output_item.added, content_part.added) goes
        // out at once; the first delta one interval later is the first token.
        let ttfb = h.metric(&hist_sum("time_to_first_byte", "responses")).await;
        let ttft = h
            .metric(&hist_sum("time_to_first_token", "responses"))
            .await;
        // (Sums over the requests so far, each one interval.)
        let gap = ttft - ttfb;
        let expect = interval.as_secs_f64() * n;
        assert!(
            gap >= expect - 0.03 && gap < expect + 0.5,
            "{tool:?}: first tokens {gap}s after the first bytes, expected about {expect}s"
        );
        assert_eq!(
            h.metric(&tokens("responses", "prompt", "reported")).await,
            prompt * n
        );
        assert_eq!(
            h.metric(&tokens("responses", "completion", "reported"))
                .await,
            4.0 * n
        );
    }

    // Not streamed: the `response` object's usage.
    let plain = r#"{"model":"demo","input":"hi"}"#;
    let (resp, _c) = h
        .send(post("/v1/responses", plain, &[("x-fake-chunks", "3")]))
        .await;
    let v = json_body(resp).await;
    assert_eq!(v["object"], "response");
    assert_eq!(v["output"][0]["content"][0]["text"], "tok1 tok2 tok3 ");
    h.wait_requests("responses", 3.0).await;
    assert_eq!(
        h.metric(&tokens("responses", "completion", "reported"))
            .await,
        11.0
    );

    // Frozen after two deltas: the idle limit (1s here) cuts it with one error event.
    let (resp, _c) = h
        .send(post("/v1/responses", body, &[("x-fake-freeze-after", "2")]))
        .await;
    let read = read_body(resp.into_body()).await;
    let err = read.error_event().expect("an error event");
    assert_eq!(err["code"], "idle_timeout");
    assert_message_starts(&err, "idle timeout: ");
    assert_eq!(read.text().matches("event: error").count(), 1);
    assert!(!read.text().contains("response.completed"));
    // Numbered as the API numbers its events, the next number after the last one sent:
    // clients that check the number (the Vercel AI SDK) refused the event without it.
    let numbers: Vec<serde_json::Value> = read
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str::<serde_json::Value>(d).unwrap()["sequence_number"].clone())
        .collect();
    let (error, sent) = numbers.split_last().unwrap();
    assert!(sent.len() > 2, "{}", read.text());
    let sent: Vec<u64> = sent.iter().map(|n| n.as_u64().unwrap()).collect();
    assert_eq!(sent, (0..sent.len() as u64).collect::<Vec<_>>());
    assert_eq!(error.as_u64(), Some(sent.len() as u64), "{}", read.text());
    h.wait_requests("responses", 4.0).await;
    assert_eq!(
        h.metric(r#"hourglass_cancellations_total{origin="idle",route="responses"}"#)
            .await,
        1.0
    );
    assert!(
        h.metric(&tokens("responses", "completion", "estimated"))
            .await
            >= 2.0
    );
}

/// `hourglass demo`'s routes (config/demo.toml, embedded): `client.responses.create(model=
/// "demo", input="hi")`, streamed or not, is routed to the fake provider's Responses API,
/// not answered 404 `no_route`.
#[tokio::test]
async fn the_demo_routes_the_responses_api() {
    let demo = hourglass::DEMO_CONFIG
        .replace("\"http://127.0.0.1:8089\"", "\"{FAKE}\"")
        .replace("127.0.0.1:8080", "127.0.0.1:0")
        .replace("127.0.0.1:9090", "127.0.0.1:0");
    let h = Harness::with_config(&demo).await;
    let streamed = r#"{"model":"demo","input":"hi","stream":true}"#;
    let (resp, _c) = h.send(post("/v1/responses", streamed, &[])).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(
        read.text().starts_with("event: response.created\n"),
        "{}",
        read.text()
    );
    assert!(read.text().contains("event: response.completed\n"));
    let (resp, _c) = h
        .send(post(
            "/v1/responses",
            r#"{"model":"demo","input":"hi"}"#,
            &[],
        ))
        .await;
    assert_eq!(resp.status(), 200);
    let v = json_body(resp).await;
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    h.wait_requests("responses", 2.0).await;
    assert_eq!(
        h.metric(r#"hourglass_requests_total{outcome="ok",route="responses"}"#)
            .await,
        2.0
    );
}

/// A Responses stream through the gateway: `first`, then 12 `event: keepalive` 300 ms apart
/// (the ones OpenAI sends while a reasoning model thinks), then `last`.
async fn through_keepalives(first: &str, last: &str) -> (Harness, Read) {
    let mut stream = String::from(first);
    for n in 1..=12 {
        stream.push_str(&format!(
            "event: keepalive\ndata: {{\"type\":\"keepalive\",\"sequence_number\":{n}}}\n\n"
        ));
    }
    stream.push_str(last);
    let h = Harness::with_config(&config("", "")).await;
    h.fake
        .set_replay(Some(Replay::sse(&stream, Duration::from_millis(300))));
    let (resp, _c) = h
        .send(post(
            "/v1/responses",
            r#"{"model":"m","input":"hi","stream":true}"#,
            &[],
        ))
        .await;
    let read = read_body(resp.into_body()).await;
    (h, read)
}

/// The error event that ends a Responses stream takes the number after the last event's,
/// keep-alives counted: OpenAI numbers those too.
fn assert_error_numbered_next(read: &Read) {
    let numbers: Vec<u64> = read
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| {
            let v: serde_json::Value = serde_json::from_str(d).unwrap();
            v["sequence_number"].as_u64().expect("numbered")
        })
        .collect();
    let (error, sent) = numbers.split_last().unwrap();
    assert!(sent.len() > 1, "{}", read.text());
    assert_eq!(*error, sent.last().unwrap() + 1, "{}", read.text());
}

const TEXT_DELTA: &str = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":13,\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n";

/// OpenAI's Responses API sends `event: keepalive` while a reasoning model thinks. It is a
/// keep-alive, not a token: a think longer than the first-token limit is cut at that limit
/// (it was taken for the first token at the first heartbeat, and the stream ran on to the
/// deadline).
#[tokio::test]
async fn a_responses_keepalive_is_not_the_first_token() {
    let created = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n";
    let (h, read) = through_keepalives(created, TEXT_DELTA).await;
    let error = read.error_event().expect("an error event");
    assert_eq!(error["code"], "first_token_timeout", "{}", read.text());
    assert_error_numbered_next(&read);
    h.wait_requests("responses", 1.0).await;
    assert_eq!(
        h.metric("hourglass_cancellations_total{origin=\"first_token\",route=\"responses\"}")
            .await,
        1.0
    );
}

/// ... nor does it keep a stream alive past its idle limit once the answer has begun.
#[tokio::test]
async fn a_responses_keepalive_does_not_reset_the_idle_limit() {
    let (_h, read) = through_keepalives(TEXT_DELTA, "").await;
    let error = read.error_event().expect("an error event");
    assert_eq!(error["code"], "idle_timeout", "{}", read.text());
    assert_error_numbered_next(&read);
}

/// Audit SA 4: an upstream's `model` rewrote a string `model` only; a number, an object, an
/// array or `null` reached the upstream as the client sent it, unpinned. The upstream's
/// model replaces whatever value the body's top-level `model` has, and nothing else.
#[tokio::test]
async fn the_upstreams_model_replaces_a_model_of_any_type() {
    let h = harness("model = \"real-model\"").await;
    let values = [
        "\"gpt-4o\"",
        "123",
        "-1.5e3",
        r#"{"id":"gpt-4o","model":"x"}"#,
        r#"["a",{"b":[1]}]"#,
        "null",
        "true",
    ];
    for value in values {
        let body =
            format!(r#"{{"model" : {value},"messages":[{{"role":"user","content":"hi"}}]}}"#);
        let (resp, _c) = h.send(post("/v1/chat/completions", &body, &[])).await;
        assert_eq!(resp.status(), 200, "{value}");
        read_body(resp.into_body()).await;
        let sent = h.fake.requests().last().expect("forwarded").body.clone();
        assert_eq!(
            std::str::from_utf8(&sent).unwrap(),
            body.replace(value, "\"real-model\""),
            "{value}"
        );
    }
}
