//! What reading the provider's format costs on the hot path, measured in one run against the
//! same path without it (figures on these machines move 15% between runs; within one run
//! they compare):
//!
//! - `inspect`: the SSE scanner alone, the inspector alone and both, over a realistic OpenAI
//!   chat stream (one event per frame), an Anthropic stream and the recorded Responses
//!   fixture.
//! - `watchdog`: the watchdog body per frame with no inspector (the path before issue 7, and
//!   still the path of unknown formats) and with one, for whole events per frame and for
//!   frames that split events.
//!
//! `cargo bench --bench provider` (`-- --quick` for a fast pass).

use std::collections::VecDeque;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use hourglass::http::sse::SseScanner;
use hourglass::provider::inspect::{Inspector, Tokens};
use hourglass::provider::Format;
use hourglass::stream::{Observer, StreamEnd, StreamLimits, WatchdogBody};
use http_body::{Body, Frame};
use tokio::time::Instant;

/// `n` chat.completion.chunk events shaped like OpenAI's, with token-sized deltas, then the
/// finish chunk, the usage chunk and `[DONE]` (as `benches/hotpath.rs` has them, plus usage).
fn openai_stream(n: usize) -> Vec<Vec<u8>> {
    let words = [
        "The",
        " quick",
        " brown",
        " fox",
        " jumps",
        " over",
        " the",
        " lazy",
        " dog",
        ".",
        " It",
        "'s",
        " a",
        " pang",
        "ram",
        ",",
        " containing",
        " every",
        " letter",
        "\\n",
    ];
    let head = r#"{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":"#;
    let mut events = vec![format!(
        "data: {head}{{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
    )
    .into_bytes()];
    for i in 0..n {
        let w = words[i % words.len()];
        events.push(
            format!("data: {head}{{\"content\":\"{w}\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n")
                .into_bytes(),
        );
    }
    events.push(
        format!(
            "data: {head}{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}],\"usage\":null}}\n\n"
        )
        .into_bytes(),
    );
    events.push(
        br#"data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-2024-08-06","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":1000,"total_tokens":1019}}

"#
        .to_vec(),
    );
    events.push(b"data: [DONE]\n\n".to_vec());
    events
}

/// An Anthropic Messages stream: named events, a ping, text deltas, usage.
fn anthropic_stream(n: usize) -> Vec<Vec<u8>> {
    let mut events = vec![
        b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01XFDUDYJgAACzvnptvVoYEL\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-20250514\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n".to_vec(),
        b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n".to_vec(),
        b"event: ping\ndata: {\"type\": \"ping\"}\n\n".to_vec(),
    ];
    for i in 0..n {
        events.push(
            format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\" token{i}\"}}}}\n\n")
                .into_bytes(),
        );
    }
    events.push(
        b"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
            .to_vec(),
    );
    events.push(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":1000}}\n\n".to_vec());
    events.push(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_vec());
    events
}

fn responses_stream() -> Vec<Vec<u8>> {
    include_str!("../tests/fixtures/openai_responses.sse")
        .split_inclusive("\n\n")
        .map(|e| e.as_bytes().to_vec())
        .collect()
}

fn inspect(c: &mut Criterion) {
    let mut g = c.benchmark_group("inspect");
    for (name, format, events) in [
        ("openai", Format::Chat, openai_stream(1000)),
        ("anthropic", Format::Messages, anthropic_stream(1000)),
        ("responses", Format::Responses, responses_stream()),
    ] {
        let bytes: usize = events.iter().map(Vec::len).sum();
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function(format!("{name}/scanner"), |b| {
            b.iter(|| {
                let mut sc = SseScanner::new();
                events
                    .iter()
                    .map(|e| sc.scan(black_box(e)).progress)
                    .sum::<u32>()
            })
        });
        g.bench_function(format!("{name}/inspector"), |b| {
            b.iter(|| {
                let mut i = Inspector::new(format, true);
                for e in &events {
                    black_box(i.feed(black_box(e)));
                }
                i.tokens()
            })
        });
        g.bench_function(format!("{name}/scanner+inspector"), |b| {
            b.iter(|| {
                let mut sc = SseScanner::new();
                let mut i = Inspector::new(format, true);
                for e in &events {
                    black_box(sc.scan(black_box(e)));
                    black_box(i.feed(e));
                }
                i.tokens()
            })
        });
    }
    g.finish();
}

/// An in-memory body that yields its frames and then ends; never pending.
struct Frames(VecDeque<Bytes>);

impl Body for Frames {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

/// Counts what the request record would, and takes the token counts.
#[derive(Default)]
struct Tally {
    bytes: usize,
    sent: usize,
    first: Option<Instant>,
    tokens: Option<Tokens>,
}

impl Observer for Tally {
    fn first_token(&mut self, at: Instant) {
        self.first = Some(at);
    }
    fn data(&mut self, len: usize) {
        self.bytes += len;
    }
    fn handed(&mut self, len: usize) {
        self.sent += len;
    }
    fn finish(&mut self, end: StreamEnd) {
        black_box(end);
    }
    fn tokens(&mut self, tokens: Tokens) {
        self.tokens = Some(black_box(tokens));
    }
}

fn limits() -> StreamLimits {
    let far = Instant::now() + Duration::from_secs(3600);
    StreamLimits {
        first_token_deadline: far,
        first_token_timeout: Duration::from_secs(3600),
        first_token_patience: false,
        idle_timeout: Duration::from_secs(3600),
        client_silence: None,
        deadline: far,
        budget: Duration::from_secs(3600),
        reserve: Duration::ZERO,
        client_budget: false,
        patience: false,
        upstream: Arc::from("bench"),
        run: None,
        run_tokens: None,
        connection: None,
    }
}

fn drain<B: Body<Data = Bytes>>(body: B) -> usize {
    let mut body = std::pin::pin!(body);
    let mut cx = Context::from_waker(Waker::noop());
    let mut bytes = 0;
    loop {
        match body.as_mut().poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(f))) => bytes += f.data_ref().map_or(0, Bytes::len),
            Poll::Ready(Some(Err(_))) => panic!("in-memory body failed"),
            Poll::Ready(None) => return bytes,
            Poll::Pending => panic!("in-memory body is never pending"),
        }
    }
}

fn watchdog(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let mut g = c.benchmark_group("watchdog");
    for (name, format, events) in [
        ("openai", Format::Chat, openai_stream(1000)),
        ("anthropic", Format::Messages, anthropic_stream(1000)),
    ] {
        let events: Vec<Bytes> = events.into_iter().map(Bytes::from).collect();
        let whole = Bytes::from(events.concat());
        let split: Vec<Bytes> = (0..whole.len())
            .step_by(100)
            .map(|i| whole.slice(i..(i + 100).min(whole.len())))
            .collect();
        for (shape, frames) in [("event_per_frame", &events), ("split_frames", &split)] {
            g.throughput(Throughput::Elements(frames.len() as u64));
            let body = || Frames(frames.iter().cloned().collect());
            g.bench_function(format!("{name}/{shape}/without_inspector"), |b| {
                b.iter_batched(
                    || WatchdogBody::new(body(), true, limits(), Tally::default()),
                    drain,
                    BatchSize::SmallInput,
                )
            });
            g.bench_function(format!("{name}/{shape}/with_inspector"), |b| {
                b.iter_batched(
                    || {
                        WatchdogBody::new(body(), true, limits(), Tally::default())
                            .with_inspector(Some(Inspector::new(format, true)))
                    },
                    drain,
                    BatchSize::SmallInput,
                )
            });
        }
    }
    g.finish();
}

criterion_group!(benches, inspect, watchdog);
criterion_main!(benches);
