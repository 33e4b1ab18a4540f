//! Micro-benchmarks of the per-chunk hot path, in memory (no sockets):
//!
//! - `sse_scan`: the SSE event scanner's throughput on a realistic OpenAI stream, fed as a
//!   gateway sees it (one event per frame), in odd-sized pieces, and whole; plus an
//!   Anthropic stream.
//! - `watchdog`: the watchdog body's overhead per frame, against polling the same in-memory
//!   body directly (`baseline`), for SSE with whole events per frame, SSE with frames that
//!   split events (the hold path), and a non-SSE body.
//! - `inspect`: the response inspector (first token, usage, errors) on the same streams, one
//!   event per frame as the watchdog feeds it, and on a non-streaming JSON answer.
//! - `metrics`: taking a copy of a route's metric handles, which every request does.
//!
//! `cargo bench --bench hotpath` (criterion; `-- --quick` for a fast pass).

use std::collections::VecDeque;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use hourglass::http::sse::SseScanner;
use hourglass::stream::{Observer, StreamEnd, StreamLimits, WatchdogBody};
use http_body::{Body, Frame};
use tokio::time::Instant;

/// `n` chat.completion.chunk events shaped like OpenAI's (ids, fingerprint, logprobs and all),
/// with token-sized deltas, then the finish chunk and `[DONE]`.
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
    let mut events = Vec::with_capacity(n + 3);
    let head = r#"{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_eb9dce56a8","choices":[{"index":0,"delta":"#;
    events.push(
        format!("data: {head}{{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n")
            .into_bytes(),
    );
    for i in 0..n {
        let w = words[i % words.len()];
        events.push(
            format!("data: {head}{{\"content\":\"{w}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n")
                .into_bytes(),
        );
    }
    events.push(
        format!("data: {head}{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}]}}\n\n")
            .into_bytes(),
    );
    events.push(b"data: [DONE]\n\n".to_vec());
    events
}

/// An Anthropic Messages stream: named events, a ping, text deltas.
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
    events.push(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_vec());
    events
}

fn sse_scan(c: &mut Criterion) {
    let events = openai_stream(1000);
    let whole: Vec<u8> = events.concat();
    let mut g = c.benchmark_group("sse_scan");
    g.throughput(Throughput::Bytes(whole.len() as u64));
    g.bench_function("openai/event_per_frame", |b| {
        b.iter(|| {
            let mut sc = SseScanner::new();
            let mut progress = 0;
            for e in &events {
                progress += sc.scan(black_box(e)).progress;
            }
            assert_eq!(progress, 1003, "role, 1000 tokens, finish, [DONE]");
            progress
        })
    });
    g.bench_function("openai/frames_of_1500_bytes", |b| {
        b.iter(|| {
            let mut sc = SseScanner::new();
            let mut progress = 0;
            for piece in whole.chunks(1500) {
                progress += sc.scan(black_box(piece)).progress;
            }
            progress
        })
    });
    g.bench_function("openai/whole_stream", |b| {
        b.iter(|| SseScanner::new().scan(black_box(&whole)).progress)
    });
    let anthropic: Vec<u8> = anthropic_stream(1000).concat();
    g.throughput(Throughput::Bytes(anthropic.len() as u64));
    g.bench_function("anthropic/whole_stream", |b| {
        b.iter(|| SseScanner::new().scan(black_box(&anthropic)).progress)
    });
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

/// Counts what the request record would (bytes, bytes sent, first token) and nothing else.
#[derive(Default)]
struct Tally {
    bytes: usize,
    sent: usize,
    first: Option<Instant>,
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

/// Polls a body to its end with a no-op waker; returns the frames and bytes seen.
fn drain<B: Body<Data = Bytes>>(body: B) -> (usize, usize) {
    let mut body = std::pin::pin!(body);
    let mut cx = Context::from_waker(Waker::noop());
    let (mut frames, mut bytes) = (0, 0);
    loop {
        match body.as_mut().poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(f))) => {
                frames += 1;
                bytes += f.data_ref().map_or(0, Bytes::len);
            }
            Poll::Ready(Some(Err(_))) => panic!("in-memory body failed"),
            Poll::Ready(None) => return (frames, bytes),
            Poll::Pending => panic!("in-memory body is never pending"),
        }
    }
}

fn watchdog(c: &mut Criterion) {
    // The watchdog's timer needs a runtime with time enabled; it is created, never fired.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let events: Vec<Bytes> = openai_stream(1000).into_iter().map(Bytes::from).collect();
    let total: usize = events.iter().map(Bytes::len).sum();
    let whole = Bytes::from(events.concat());
    // Frames cut every 100 bytes: most frames end mid-event, so the hold path is taken.
    let split: Vec<Bytes> = (0..whole.len())
        .step_by(100)
        .map(|i| whole.slice(i..(i + 100).min(whole.len())))
        .collect();

    let mut g = c.benchmark_group("watchdog");
    let frames = |v: &Vec<Bytes>| Frames(v.iter().cloned().collect());

    g.throughput(Throughput::Elements(events.len() as u64));
    g.bench_function("baseline/event_per_frame", |b| {
        b.iter_batched(|| frames(&events), drain, BatchSize::SmallInput)
    });
    g.bench_function("sse/event_per_frame", |b| {
        b.iter_batched(
            || WatchdogBody::new(frames(&events), true, limits(), Tally::default()),
            |body| {
                let seen = drain(body);
                assert_eq!(seen.1, total);
                seen
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("raw/event_per_frame", |b| {
        b.iter_batched(
            || WatchdogBody::new(frames(&events), false, limits(), Tally::default()),
            drain,
            BatchSize::SmallInput,
        )
    });
    g.throughput(Throughput::Elements(split.len() as u64));
    g.bench_function("baseline/split_frames", |b| {
        b.iter_batched(|| frames(&split), drain, BatchSize::SmallInput)
    });
    g.bench_function("sse/split_frames", |b| {
        b.iter_batched(
            || WatchdogBody::new(frames(&split), true, limits(), Tally::default()),
            |body| {
                let seen = drain(body);
                assert_eq!(seen.1, total);
                seen
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// A non-streaming Chat Completions answer as OpenAI shapes it: the inspector reads it for its
/// top-level `usage` only.
const CHAT_ANSWER: &[u8] = br#"{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion","created":1741570283,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"The image shows a wooden boardwalk path running through a lush green field or meadow.","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":1117,"completion_tokens":46,"total_tokens":1163,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_fc9f1d7035"}"#;

fn inspect(c: &mut Criterion) {
    use hourglass::provider::inspect::Inspector;
    use hourglass::provider::Format;
    let mut g = c.benchmark_group("inspect");
    for (name, format, events) in [
        ("openai/event_per_frame", Format::Chat, openai_stream(1000)),
        (
            "anthropic/event_per_frame",
            Format::Messages,
            anthropic_stream(1000),
        ),
    ] {
        let bytes: usize = events.iter().map(Vec::len).sum();
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut inspector = Inspector::new(format, true);
                let mut output = 0;
                for e in &events {
                    output += u32::from(inspector.feed(black_box(e)).output);
                }
                assert_eq!(output, 1000, "one output event per token");
                inspector.tokens()
            })
        });
    }
    g.throughput(Throughput::Bytes(CHAT_ANSWER.len() as u64));
    g.bench_function("openai/json_answer", |b| {
        b.iter(|| {
            let mut inspector = Inspector::new(Format::Chat, false);
            inspector.feed(black_box(CHAT_ANSWER));
            let t = inspector.tokens();
            assert_eq!((t.prompt(), t.completion), (Some(1117), Some(46)));
            t
        })
    });
    g.finish();
}

/// What a request does with its route's metric handles besides observing: the record takes
/// a copy of them (for the route its path selects, then for the one its model selects).
fn metrics(c: &mut Criterion) {
    let m = hourglass::telemetry::metrics::Metrics::new();
    let r = m.route("chat");
    c.bench_function("metrics/route_handles_clone_drop", |b| {
        b.iter(|| black_box(r.clone()))
    });
}

criterion_group!(benches, sse_scan, watchdog, inspect, metrics);
criterion_main!(benches);
