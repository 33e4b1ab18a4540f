//! The scenarios of issue 3, each run against every target in turn with a fresh fake provider
//! and a fresh gateway process.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hourglass_fake::{monotonic_ns, FakeUpstream};
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tokio_util::sync::CancellationToken;

use crate::client::{request, Conn, End, EventTally, Step};
use crate::h2client::{self, STREAMS_PER_CONN};
use crate::lineup::{Env, Limits, Target};
use crate::stats::{cdf, ms, pct, summary};
use crate::targets::{Cpu, Gateway};

pub const CHAT: &str = "/v1/chat/completions";
const STREAM_BODY: &str =
    r#"{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
const PLAIN_BODY: &str = r#"{"model":"bench","messages":[{"role":"user","content":"hi"}]}"#;

/// Sizes and durations of every scenario; `quick()` is the CI smoke run.
#[derive(Clone, Debug)]
pub struct Params {
    pub s1_conns: usize,
    pub s1_rounds: usize,
    pub s1_warmup: Duration,
    pub s1_measure: Duration,
    pub s2_streams: usize,
    pub s2_chunks: usize,
    pub s2_interval_ms: u64,
    pub s2_rounds: usize,
    pub s3_streams: usize,
    /// Chunk interval of the streams that clients leave: slower than scenario 2's, so that
    /// the load core's own lag (the fake notices a close only when it is scheduled) stays
    /// small next to what is measured. The direct row shows that floor.
    pub s3_interval_ms: u64,
    pub s3_spread: Duration,
    pub s3_zombie_wait: Duration,
    pub s4_sizes: Vec<usize>,
    pub s4_interval_ms: u64,
    pub s5_streams: usize,
    pub s6_streams: usize,
    pub s6_chunks: usize,
    pub s6_interval_ms: u64,
}

impl Params {
    pub fn full(nofile: u64) -> Params {
        Params {
            s1_conns: 64,
            s1_rounds: 2,
            s1_warmup: Duration::from_secs(1),
            s1_measure: Duration::from_secs(3),
            s2_streams: 200,
            s2_chunks: 50,
            s2_interval_ms: 10,
            s2_rounds: 3,
            s3_streams: 200,
            s3_interval_ms: 50,
            s3_spread: Duration::from_millis(200),
            s3_zombie_wait: Duration::from_secs(2),
            s4_sizes: vec![2000, max_streams(nofile, 10_000)],
            s4_interval_ms: 1000,
            s5_streams: 20,
            s6_streams: 100,
            s6_chunks: 500,
            s6_interval_ms: 5,
        }
    }

    pub fn quick() -> Params {
        Params {
            s1_conns: 16,
            s1_rounds: 1,
            s1_warmup: Duration::from_millis(200),
            s1_measure: Duration::from_secs(1),
            s2_streams: 20,
            s2_chunks: 10,
            s2_interval_ms: 10,
            s2_rounds: 1,
            s3_streams: 20,
            s3_interval_ms: 50,
            s3_spread: Duration::from_millis(20),
            s3_zombie_wait: Duration::from_millis(300),
            s4_sizes: vec![200],
            s4_interval_ms: 100,
            s5_streams: 3,
            s6_streams: 20,
            s6_chunks: 50,
            s6_interval_ms: 5,
        }
    }
}

/// The most concurrent proxied streams the open-files limit allows: a proxied stream holds
/// two descriptors in the gateway (client and upstream side) and two in this process (the
/// client's socket and the fake's), plus some slack for listeners and logs.
pub fn max_streams(nofile: u64, want: usize) -> usize {
    let fit = nofile.saturating_sub(600) / 2;
    want.min(usize::try_from(fit).unwrap_or(usize::MAX))
}

pub struct Ctx {
    pub env: Env,
    pub targets: Vec<Target>,
    pub p: Params,
}

/// One target's fake provider and (unless direct) gateway process.
pub struct Setup {
    pub fake: FakeUpstream,
    pub gw: Option<Gateway>,
    pub addr: SocketAddr,
    /// The clients speak HTTP/2 (h2c, prior knowledge) to this target, many streams on one
    /// connection (`Target::h2_clients`); else HTTP/1.1, a connection per stream.
    pub h2: bool,
}

impl Setup {
    pub async fn new(
        ctx: &Ctx,
        target: Target,
        limits: Limits,
        label: &str,
    ) -> Result<Setup, String> {
        let fake = FakeUpstream::start(([127, 0, 0, 1], 0).into())
            .await
            .map_err(|e| format!("fake provider: {e}"))?;
        let gw = match target {
            t if t.is_direct() => None,
            t => Some(Gateway::start(&ctx.env, t, fake.addr(), limits, label).await?),
        };
        let addr = gw.as_ref().map_or(fake.addr(), |g| g.addr);
        let h2 = target.h2_clients();
        let setup = Setup { fake, gw, addr, h2 };
        setup.warm_up().await?;
        Ok(setup)
    }

    /// A few requests of each kind, so lazily built state (pools, buffers) exists before
    /// anything is measured, and a check that the path works at all.
    async fn warm_up(&self) -> Result<(), String> {
        if self.h2 {
            return self.warm_up_h2().await;
        }
        for _ in 0..5 {
            let (status, _) = plain_request(self.addr, &plain_req(self.addr, "warm"))
                .await
                .map_err(|e| format!("warm-up request: {e}"))?;
            if status != 200 {
                return Err(format!("warm-up request answered {status}"));
            }
        }
        let headers = stream_headers("warm", 3, 1);
        let out = run_stream(self.addr, &headers, 1).await;
        if out.status != 200 || out.tally.content.len() != 3 {
            return Err(format!(
                "warm-up stream: status {}, {} content events, error {:?}",
                out.status,
                out.tally.content.len(),
                out.err
            ));
        }
        Ok(())
    }

    /// The same over HTTP/2: the plain requests each on a new connection, the stream read
    /// to its end.
    async fn warm_up_h2(&self) -> Result<(), String> {
        let plain = [
            ("x-fake-chunks", "1".to_owned()),
            ("x-fake-headers-first", "1".into()),
            ("x-bench-id", "warm".into()),
        ];
        for _ in 0..5 {
            let req = h2client::request(self.addr, CHAT, &plain, PLAIN_BODY);
            let (status, _) = h2client::plain_request(self.addr, req)
                .await
                .map_err(|e| format!("warm-up request (h2): {e}"))?;
            if status != 200 {
                return Err(format!("warm-up request (h2) answered {status}"));
            }
        }
        let headers = stream_headers("warm", 3, 1);
        let r: std::io::Result<usize> = async {
            let mut sender = h2client::connect(self.addr).await?;
            let req = h2client::request(self.addr, CHAT, &headers, STREAM_BODY);
            let resp = h2client::send(&mut sender, req)
                .await?
                .await
                .map_err(std::io::Error::other)?;
            if resp.status() != 200 {
                return Err(std::io::Error::other(format!("status {}", resp.status())));
            }
            let mut reader = h2client::BodyReader::new(resp.into_body());
            let (mut tally, mut payload) = (EventTally::default(), Vec::new());
            loop {
                payload.clear();
                match reader.step(&mut payload).await? {
                    Step::Data { recv_ns } => tally.feed(&payload, recv_ns, u64::MAX),
                    Step::End { end, recv_ns } => {
                        tally.feed(&payload, recv_ns, u64::MAX);
                        if end != End::Clean {
                            return Err(std::io::Error::other("stream truncated"));
                        }
                        return Ok(tally.content.len());
                    }
                }
            }
        }
        .await;
        match r {
            Ok(3) => Ok(()),
            Ok(n) => Err(format!("warm-up stream (h2): {n} content events, not 3")),
            Err(e) => Err(format!("warm-up stream (h2): {e}")),
        }
    }

    pub fn cpu(&self) -> Option<Cpu> {
        self.gw.as_ref().map(Gateway::cpu)
    }

    pub async fn stop(self) {
        if let Some(gw) = self.gw {
            gw.stop().await;
        }
        self.fake.shutdown();
    }
}

fn plain_req(addr: SocketAddr, id: &str) -> Vec<u8> {
    request(
        addr,
        CHAT,
        &[
            ("x-fake-chunks", "1".into()),
            ("x-fake-headers-first", "1".into()),
            ("x-bench-id", id.into()),
        ],
        PLAIN_BODY,
    )
}

fn stream_headers(id: &str, chunks: usize, interval_ms: u64) -> Vec<(&'static str, String)> {
    vec![
        ("x-bench-id", id.to_owned()),
        ("x-fake-chunks", chunks.to_string()),
        ("x-fake-interval-ms", interval_ms.to_string()),
        ("x-fake-timestamps", "1".into()),
        // The head at once and the first event on the body's first poll. Without it the fake
        // waits for its time-to-first-token with a timer even when that is 0, which costs a
        // timer tick (about 1 ms) per request and would dominate the non-streaming latency.
        ("x-fake-headers-first", "1".into()),
    ]
}

fn without_headers_first(mut h: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
    h.retain(|(name, _)| *name != "x-fake-headers-first");
    h
}

/// One request on a new connection; the status and body length.
async fn plain_request(addr: SocketAddr, req: &[u8]) -> std::io::Result<(u16, usize)> {
    let mut conn = Conn::connect(addr).await?;
    conn.send(req).await?;
    let head = conn.read_head().await?;
    let mut body = Vec::new();
    let mut reader = conn.body(&head);
    loop {
        if let Step::End { .. } = reader.step(&mut body).await? {
            return Ok((head.status, body.len()));
        }
    }
}

/// What one streamed response looked like from the client.
#[derive(Debug, Default)]
pub struct StreamOut {
    pub status: u16,
    pub tally: EventTally,
    pub end: Option<End>,
    /// When the body ended (or the head of a non-200 answer arrived complete).
    pub end_ns: u64,
    /// When the request was written.
    pub sent_ns: u64,
    pub body: Vec<u8>,
    pub err: Option<String>,
}

/// Streams one request to its end. `min_gap_ms` is the spacing below which two content
/// events in one read do not count as coalesced.
async fn run_stream(addr: SocketAddr, headers: &[(&str, String)], min_gap_ms: u64) -> StreamOut {
    let mut out = StreamOut::default();
    let req = request(addr, CHAT, headers, STREAM_BODY);
    let r: std::io::Result<()> = async {
        let mut conn = Conn::connect(addr).await?;
        out.sent_ns = monotonic_ns();
        conn.send(&req).await?;
        let head = conn.read_head().await?;
        out.status = head.status;
        let mut reader = conn.body(&head);
        let mut payload = Vec::with_capacity(4096);
        let min_gap = min_gap_ms * 1_000_000 / 2;
        loop {
            payload.clear();
            let step = reader.step(&mut payload).await?;
            let (recv_ns, end) = match step {
                Step::Data { recv_ns } => (recv_ns, None),
                Step::End { end, recv_ns } => (recv_ns, Some(end)),
            };
            if out.status == 200 {
                out.tally.feed(&payload, recv_ns, min_gap);
            } else {
                out.body.extend_from_slice(&payload);
            }
            if let Some(end) = end {
                out.end = Some(end);
                out.end_ns = recv_ns;
                return Ok(());
            }
        }
    }
    .await;
    if let Err(e) = r {
        out.err = Some(e.to_string());
        out.end_ns = monotonic_ns();
    }
    out
}

/// `n` streams started evenly over one chunk interval (so chunk sends spread over the
/// interval instead of all falling on the same timer tick), each read to its end.
async fn stream_round(
    addr: SocketAddr,
    label: &str,
    n: usize,
    chunks: usize,
    interval_ms: u64,
) -> Vec<StreamOut> {
    let mut set = JoinSet::new();
    let start = Instant::now();
    for i in 0..n {
        let headers = stream_headers(&format!("{label}-{i}"), chunks, interval_ms);
        let at = start + Duration::from_micros(interval_ms * 1000 * i as u64 / n as u64);
        set.spawn(async move {
            sleep_until(at).await;
            run_stream(addr, &headers, interval_ms).await
        });
    }
    let mut outs = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        outs.push(r.expect("stream task"));
    }
    outs
}

fn log(msg: impl AsRef<str>) {
    eprintln!("[bench] {}", msg.as_ref());
}

/// Runs `f` against every target, starting and stopping a setup around each; failures are
/// recorded, not fatal.
macro_rules! each_target {
    ($ctx:expr, $limits:expr, $label:expr, |$t:ident, $setup:ident| $body:expr) => {{
        let mut results: Vec<(Target, Result<Value, String>)> = Vec::new();
        for &$t in &$ctx.targets {
            let label = format!("{}", $label);
            let r = match Setup::new($ctx, $t, $limits, &label).await {
                Ok($setup) => {
                    let v: Result<Value, String> = $body;
                    $setup.stop().await;
                    v
                }
                Err(e) => Err(e),
            };
            if let Err(e) = &r {
                log(format!("{label} / {}: FAILED: {e}", $t.name()));
            }
            results.push(($t, r));
        }
        results
    }};
}

fn by_target(results: Vec<(Target, Result<Value, String>)>) -> Value {
    let mut map = serde_json::Map::new();
    for (t, r) in results {
        map.insert(
            t.name().to_owned(),
            r.unwrap_or_else(|e| json!({"error": e})),
        );
    }
    Value::Object(map)
}

// ---------------------------------------------------------------------------------------
// 1. Non-streaming answers over keep-alive connections.

struct PlainRound {
    lat: Vec<u64>,
    errors: u64,
    body_len: usize,
}

async fn plain_round(
    addr: SocketAddr,
    conns: usize,
    warmup: Duration,
    measure: Duration,
) -> PlainRound {
    let measure_from = monotonic_ns() + warmup.as_nanos() as u64;
    let until = measure_from + measure.as_nanos() as u64;
    let mut set = JoinSet::new();
    for c in 0..conns {
        let req = plain_req(addr, &format!("plain-{c}"));
        set.spawn(async move {
            let mut lat = Vec::with_capacity(1 << 16);
            let (mut errors, mut body_len) = (0u64, 0);
            let mut conn: Option<Conn> = None;
            let mut body = Vec::with_capacity(1024);
            while monotonic_ns() < until {
                if conn.is_none() {
                    conn = Conn::connect(addr).await.ok();
                    if conn.is_none() {
                        errors += 1;
                        sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                }
                let c = conn.as_mut().expect("connected above");
                let t0 = monotonic_ns();
                let r: std::io::Result<bool> = async {
                    c.send(&req).await?;
                    let head = c.read_head().await?;
                    body.clear();
                    let mut reader = c.body(&head);
                    loop {
                        if let Step::End { end, .. } = reader.step(&mut body).await? {
                            return Ok(head.status == 200 && end == End::Clean);
                        }
                    }
                }
                .await;
                let t1 = monotonic_ns();
                match r {
                    Ok(true) => {
                        body_len = body.len();
                        if t0 >= measure_from && t1 <= until {
                            lat.push(t1 - t0);
                        }
                    }
                    _ => {
                        errors += 1;
                        conn = None;
                    }
                }
            }
            (lat, errors, body_len)
        });
    }
    let mut round = PlainRound {
        lat: Vec::new(),
        errors: 0,
        body_len: 0,
    };
    while let Some(r) = set.join_next().await {
        let (lat, errors, body_len) = r.expect("plain task");
        round.lat.extend(lat);
        round.errors += errors;
        round.body_len = round.body_len.max(body_len);
    }
    round
}

/// One target's non-streaming rounds, added up.
#[derive(Default)]
struct PlainAcc {
    lat: Vec<u64>,
    errors: u64,
    secs: f64,
    gw_cpu_s: f64,
    me_cpu_s: f64,
    body_len: usize,
    per_round: Vec<f64>,
}

pub async fn nonstream(ctx: &Ctx) -> Value {
    let p = &ctx.p;
    log(format!(
        "non-streaming: {} keep-alive connections, {} round(s) of {:?} after {:?} warm-up",
        p.s1_conns, p.s1_rounds, p.s1_measure, p.s1_warmup
    ));
    let mut acc: HashMap<&str, PlainAcc> = HashMap::new();
    let mut failed: Vec<(Target, Result<Value, String>)> = Vec::new();
    for round in 0..p.s1_rounds {
        let results = each_target!(
            ctx,
            Limits::RELAXED,
            format!("nonstream-r{round}"),
            |t, setup| {
                // Gateway CPU and this process's CPU over the measured window only.
                let gw_cpu0 = std::cell::Cell::new(None);
                let me_cpu0 = std::cell::Cell::new(Cpu::default());
                let sampler = async {
                    sleep(p.s1_warmup).await;
                    gw_cpu0.set(setup.cpu());
                    me_cpu0.set(Cpu::this_process());
                };
                let (r, ()) = tokio::join!(
                    plain_round(setup.addr, p.s1_conns, p.s1_warmup, p.s1_measure),
                    sampler
                );
                let gw_cpu = setup.cpu().zip(gw_cpu0.get()).map(|(b, a)| b.since(a));
                let me_cpu = Cpu::this_process().since(me_cpu0.get());
                let secs = p.s1_measure.as_secs_f64();
                let e = acc.entry(t.name()).or_default();
                e.errors += r.errors;
                e.secs += secs;
                e.gw_cpu_s += gw_cpu.map_or(0.0, |c| c.run_ns as f64 / 1e9);
                e.me_cpu_s += me_cpu.run_ns as f64 / 1e9;
                e.body_len = r.body_len;
                e.per_round.push(r.lat.len() as f64 / secs);
                e.lat.extend(r.lat);
                Ok(Value::Null)
            }
        );
        failed.extend(results.into_iter().filter(|(_, r)| r.is_err()));
    }
    let mut map = serde_json::Map::new();
    for (t, r) in failed {
        map.insert(t.name().into(), json!({"error": r.unwrap_err()}));
    }
    for (name, a) in acc {
        let PlainAcc {
            mut lat,
            errors,
            secs,
            gw_cpu_s,
            me_cpu_s,
            body_len,
            per_round,
        } = a;
        lat.sort_unstable();
        let n = lat.len() as f64;
        let rps = n / secs;
        map.insert(
            name.into(),
            json!({
                "requests": lat.len(),
                "errors": errors,
                "rps": rps,
                "rps_per_round": per_round,
                "latency": summary(&lat),
                "answer_bytes": body_len,
                "gateway_cpu_util": gw_cpu_s / secs,
                "gateway_cpu_us_per_request": if n > 0.0 { gw_cpu_s * 1e6 / n } else { 0.0 },
                "load_core_util": me_cpu_s / secs,
                "cdf": cdf(&lat),
            }),
        );
    }
    json!({
        "params": {"connections": p.s1_conns, "rounds": p.s1_rounds,
                   "measure_s": p.s1_measure.as_secs_f64(), "warmup_s": p.s1_warmup.as_secs_f64()},
        "targets": Value::Object(map),
    })
}

// ---------------------------------------------------------------------------------------
// 2. Concurrent streams: per-chunk one-way latency, coalescing (and CPU per chunk).

/// Each stream's first chunks, counted apart: the streams of a round start within one interval,
/// so these chunks wait behind the other streams' setup (accept, parse, route, connect), while
/// the rest measure what forwarding one chunk costs. Five is half a round's start-up at 10 ms.
pub const SETUP_CHUNKS: usize = 5;

pub async fn streams(ctx: &Ctx) -> Value {
    let p = &ctx.p;
    log(format!(
        "streaming: {} streams x {} chunks at {} ms, {} round(s)",
        p.s2_streams, p.s2_chunks, p.s2_interval_ms, p.s2_rounds
    ));
    #[derive(Default)]
    struct Acc {
        lat: Vec<u64>,
        /// The same latencies split: each stream's first `SETUP_CHUNKS`, and the rest.
        setup: Vec<u64>,
        steady: Vec<u64>,
        coalesced: u64,
        incomplete: u64,
        errors: Vec<String>,
        round_p99: Vec<f64>,
        gw_cpu_ns: u64,
        user_sys_ms: (f64, f64),
    }
    let mut acc: HashMap<&str, Acc> = HashMap::new();
    let mut failed = Vec::new();
    for round in 0..p.s2_rounds {
        let results = each_target!(
            ctx,
            Limits::RELAXED,
            format!("streams-r{round}"),
            |t, setup| {
                let before = setup.cpu();
                let outs =
                    stream_round(setup.addr, "s", p.s2_streams, p.s2_chunks, p.s2_interval_ms)
                        .await;
                let used = setup.cpu().zip(before).map(|(a, b)| a.since(b));
                let a = acc.entry(t.name()).or_default();
                let mut lat: Vec<u64> = Vec::new();
                for o in &outs {
                    for (i, &(s, r)) in o.tally.content.iter().enumerate() {
                        let l = r.saturating_sub(s);
                        lat.push(l);
                        if i < SETUP_CHUNKS {
                            a.setup.push(l);
                        } else {
                            a.steady.push(l);
                        }
                    }
                    a.coalesced += u64::from(o.tally.coalesced);
                    if o.tally.content.len() != p.s2_chunks || o.end != Some(End::Clean) {
                        a.incomplete += 1;
                    }
                    if let Some(e) = &o.err {
                        a.errors.push(e.clone());
                    }
                }
                lat.sort_unstable();
                a.round_p99.push(ms(pct(&lat, 99.0)));
                a.lat.extend(lat);
                if let Some(c) = used {
                    a.gw_cpu_ns += c.run_ns;
                    let (u, s) = c.user_sys_ms();
                    a.user_sys_ms.0 += u;
                    a.user_sys_ms.1 += s;
                }
                Ok(Value::Null)
            }
        );
        failed.extend(results.into_iter().filter(|(_, r)| r.is_err()));
    }
    let direct: Option<(u64, u64)> = acc.get("direct").map(|a| {
        let mut l = a.lat.clone();
        l.sort_unstable();
        (pct(&l, 50.0), pct(&l, 99.0))
    });
    let mut map = serde_json::Map::new();
    for (t, r) in failed {
        map.insert(t.name().into(), json!({"error": r.unwrap_err()}));
    }
    for (name, mut a) in acc {
        a.lat.sort_unstable();
        a.setup.sort_unstable();
        a.steady.sort_unstable();
        let (p50, p99) = (pct(&a.lat, 50.0), pct(&a.lat, 99.0));
        let chunks = a.lat.len() as f64;
        let mut v = json!({
            "latency": summary(&a.lat),
            "p99_per_round_ms": a.round_p99,
            "chunks": a.lat.len(),
            "coalesced": a.coalesced,
            "incomplete_streams": a.incomplete,
            "errors": a.errors.iter().take(5).collect::<Vec<_>>(),
            "cdf": cdf(&a.lat),
            "setup_chunks": SETUP_CHUNKS,
            "setup_latency": summary(&a.setup),
            "steady_latency": summary(&a.steady),
        });
        if let Some((d50, d99)) = direct {
            v["added_p50_ms"] = json!(ms(p50) - ms(d50));
            v["added_p99_ms"] = json!(ms(p99) - ms(d99));
        }
        if name != "direct" && chunks > 0.0 {
            v["gateway_cpu_ms_per_1000_chunks"] = json!(a.gw_cpu_ns as f64 / 1e6 / chunks * 1000.0);
            v["gateway_user_sys_ms"] = json!([a.user_sys_ms.0, a.user_sys_ms.1]);
        }
        map.insert(name.into(), v);
    }
    json!({
        "params": {"streams": p.s2_streams, "chunks": p.s2_chunks,
                   "interval_ms": p.s2_interval_ms, "rounds": p.s2_rounds},
        "targets": Value::Object(map),
    })
}

// ---------------------------------------------------------------------------------------
// 3. Clients that leave: client close -> upstream close, and zombies.

#[derive(Clone, Copy, Debug)]
pub enum Leave {
    MidStream,
    FrozenUpstream,
    BeforeFirstToken,
}

impl Leave {
    pub const ALL: [Leave; 3] = [
        Leave::MidStream,
        Leave::FrozenUpstream,
        Leave::BeforeFirstToken,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Leave::MidStream => "mid_stream",
            Leave::FrozenUpstream => "frozen_upstream",
            Leave::BeforeFirstToken => "before_first_token",
        }
    }

    fn headers(self, id: &str, interval_ms: u64) -> Vec<(&'static str, String)> {
        match self {
            // Long enough to outlive the measurement: still running 2 s later is a zombie.
            Leave::MidStream => stream_headers(id, 100_000, interval_ms),
            Leave::FrozenUpstream => {
                let mut h = stream_headers(id, 1000, interval_ms);
                h.push(("x-fake-freeze-after", "3".into()));
                h
            }
            Leave::BeforeFirstToken => {
                // The head is held too: the gateway is still waiting for the response.
                let mut h = without_headers_first(stream_headers(id, 10, 10));
                h.push(("x-fake-ttft-ms", "600000".into()));
                h
            }
        }
    }

    /// Content events to read before leaving.
    fn read_first(self) -> usize {
        match self {
            Leave::BeforeFirstToken => 0,
            _ => 3,
        }
    }
}

/// A stream the client is about to leave.
enum Held {
    /// HTTP/1.1: the connection, closed with a FIN.
    H1(Conn),
    /// HTTP/2 before the response head: dropping the response future resets the stream.
    H2Head(h2client::Pending),
    /// HTTP/2 mid-body: dropping the body resets the stream (`RST_STREAM(CANCEL)`); the
    /// connection stays open for the other streams.
    H2Body(h2client::BodyReader),
}

impl Held {
    /// Leaves the stream; returns when (after draining an HTTP/1.1 socket, so that the close
    /// sends a FIN, and just before the close or the drop that resets the stream).
    fn leave(self) -> Instant {
        match self {
            Held::H1(mut conn) => {
                conn.drain_nonblocking();
                let at = Instant::now();
                drop(conn);
                at
            }
            Held::H2Head(pending) => {
                let at = Instant::now();
                drop(pending);
                at
            }
            Held::H2Body(body) => {
                let at = Instant::now();
                drop(body);
                at
            }
        }
    }
}

/// A response body read one step at a time: HTTP/1.1 (one `read()`) or HTTP/2 (one frame).
trait StepBody {
    fn next_step<'a>(
        &'a mut self,
        out: &'a mut Vec<u8>,
    ) -> impl std::future::Future<Output = std::io::Result<Step>> + Send + 'a;
}

impl StepBody for crate::client::BodyReader<'_> {
    fn next_step<'a>(
        &'a mut self,
        out: &'a mut Vec<u8>,
    ) -> impl std::future::Future<Output = std::io::Result<Step>> + Send + 'a {
        self.step(out)
    }
}

impl StepBody for h2client::BodyReader {
    fn next_step<'a>(
        &'a mut self,
        out: &'a mut Vec<u8>,
    ) -> impl std::future::Future<Output = std::io::Result<Step>> + Send + 'a {
        self.step(out)
    }
}

/// Steps through a body until `content` content events arrived.
async fn read_content(reader: &mut impl StepBody, content: usize) -> std::io::Result<()> {
    let mut tally = EventTally::default();
    let mut payload = Vec::new();
    while tally.content.len() < content {
        payload.clear();
        match reader.next_step(&mut payload).await? {
            Step::Data { recv_ns } => tally.feed(&payload, recv_ns, u64::MAX),
            Step::End { .. } => return Err(std::io::Error::other("stream ended early")),
        }
    }
    Ok(())
}

/// Opens a stream and reads until `content` content events arrived; returns the open
/// connection (the rest of the body is left unread).
async fn open_and_read(
    addr: SocketAddr,
    headers: Vec<(&'static str, String)>,
    content: usize,
) -> std::io::Result<Held> {
    let mut conn = Conn::connect(addr).await?;
    conn.send(&request(addr, CHAT, &headers, STREAM_BODY))
        .await?;
    if content == 0 {
        return Ok(Held::H1(conn));
    }
    let head = conn.read_head().await?;
    if head.status != 200 {
        return Err(std::io::Error::other(format!("status {}", head.status)));
    }
    let mut reader = conn.body(&head);
    read_content(&mut reader, content).await?;
    Ok(Held::H1(conn))
}

/// The same as a stream on a shared HTTP/2 connection.
async fn open_and_read_h2(
    addr: SocketAddr,
    mut sender: h2client::Sender,
    headers: Vec<(&'static str, String)>,
    content: usize,
) -> std::io::Result<Held> {
    let req = h2client::request(addr, CHAT, &headers, STREAM_BODY);
    let pending = h2client::send(&mut sender, req).await?;
    if content == 0 {
        return Ok(Held::H2Head(pending));
    }
    let resp = pending.await.map_err(std::io::Error::other)?;
    if resp.status() != 200 {
        return Err(std::io::Error::other(format!("status {}", resp.status())));
    }
    let mut reader = h2client::BodyReader::new(resp.into_body());
    read_content(&mut reader, content).await?;
    Ok(Held::H2Body(reader))
}

/// The HTTP/2 client connections for `streams` streams when the target is measured over
/// HTTP/2 (STREAMS_PER_CONN a connection); none otherwise.
async fn h2_connections(setup: &Setup, streams: usize) -> Result<Vec<h2client::Sender>, String> {
    if !setup.h2 {
        return Ok(Vec::new());
    }
    h2client::connect_many(setup.addr, streams)
        .await
        .map_err(|e| format!("h2 connections: {e}"))
}

async fn leave_once(ctx: &Ctx, setup: &Setup, leave: Leave, label: &str) -> Result<Value, String> {
    let p = &ctx.p;
    let n = p.s3_streams;
    let base_requests = setup.fake.requests().len();
    // HTTP/2 clients: STREAMS_PER_CONN streams on each connection, kept open (with the
    // other streams on it) until the zombies are counted.
    let h2_conns = h2_connections(setup, n).await?;
    let mut set = JoinSet::new();
    for i in 0..n {
        let (addr, headers) = (
            setup.addr,
            leave.headers(&format!("{label}-{i}"), p.s3_interval_ms),
        );
        let content = leave.read_first();
        let sender = h2_conns.get(i / STREAMS_PER_CONN).cloned();
        set.spawn(async move {
            let held = match sender {
                None => open_and_read(addr, headers, content).await,
                Some(s) => open_and_read_h2(addr, s, headers, content).await,
            };
            (i, held)
        });
    }
    let mut conns: Vec<Option<Held>> = (0..n).map(|_| None).collect();
    let mut open_errors = Vec::new();
    let collect = async {
        while let Some(r) = set.join_next().await {
            match r.expect("open task") {
                (i, Ok(c)) => conns[i] = Some(c),
                (i, Err(e)) => open_errors.push(format!("stream {i}: {e}")),
            }
        }
    };
    if timeout(Duration::from_secs(30), collect).await.is_err() {
        return Err("streams did not open within 30 s".into());
    }
    // Every upstream call must be in flight before anyone leaves.
    let opened = conns.iter().filter(|c| c.is_some()).count();
    if !setup
        .fake
        .wait_for_requests(base_requests + opened, Duration::from_secs(10))
        .await
    {
        return Err("the upstream did not see every request".into());
    }
    if matches!(leave, Leave::BeforeFirstToken) {
        // Let the gateways settle into waiting for the head.
        sleep(Duration::from_millis(20)).await;
    }
    let start = Instant::now();
    let gap = p.s3_spread / n as u32;
    let mut closed_at: Vec<Option<Instant>> = vec![None; n];
    for (i, slot) in conns.iter_mut().enumerate() {
        let Some(held) = slot.take() else {
            continue;
        };
        sleep_until(start + gap * i as u32).await;
        closed_at[i] = Some(held.leave());
    }
    let last = closed_at.iter().flatten().max().copied().unwrap_or(start);
    sleep_until(last + p.s3_zombie_wait).await;
    let connections = setup.fake.connections();
    let requests = setup.fake.requests();
    // When the upstream saw each call cancelled. HTTP/1: its connection closed (a cancelled
    // call's connection is never reused). HTTP/2: its stream ended (a reset) while the
    // connection stays open for the other streams.
    let mut ended: HashMap<String, Option<Instant>> = HashMap::new();
    for r in &requests[base_requests..] {
        if let Some(id) = r.headers.get("x-bench-id").and_then(|v| v.to_str().ok()) {
            let at = if r.version == http::Version::HTTP_2 {
                r.finished_at
            } else {
                connections[r.conn_id as usize].closed_at
            };
            ended.insert(id.to_owned(), at);
        }
    }
    let (mut lat, mut zombies, mut early, mut missing) = (Vec::new(), 0, 0, 0);
    for (i, at) in closed_at.iter().enumerate() {
        let Some(at) = at else { continue };
        let Some(&upstream_end) = ended.get(&format!("{label}-{i}")) else {
            missing += 1;
            continue;
        };
        match upstream_end {
            None => zombies += 1,
            Some(c) if c < *at => early += 1,
            Some(c) => lat.push((c - *at).as_nanos() as u64),
        }
    }
    lat.sort_unstable();
    Ok(json!({
        "streams": n,
        "opened": opened,
        "open_errors": open_errors.iter().take(5).collect::<Vec<_>>(),
        "close_to_upstream_close": summary(&lat),
        "zombies": zombies,
        "upstream_closed_before_client": early,
        "not_matched": missing,
        "cdf": cdf(&lat),
    }))
}

pub async fn leave(ctx: &Ctx) -> Value {
    let p = &ctx.p;
    let mut out = serde_json::Map::new();
    for leave in Leave::ALL {
        log(format!(
            "clients leave ({}): {} streams, closes spread over {:?}, zombies counted {:?} later",
            leave.name(),
            p.s3_streams,
            p.s3_spread,
            p.s3_zombie_wait
        ));
        let label = format!("leave-{}", leave.name());
        let results = each_target!(ctx, Limits::RELAXED, &label, |t, setup| {
            leave_once(ctx, &setup, leave, &label).await
        });
        out.insert(leave.name().into(), by_target(results));
    }
    json!({
        "params": {"streams": p.s3_streams, "interval_ms": p.s3_interval_ms, "spread_ms": p.s3_spread.as_millis() as u64,
                   "zombie_wait_ms": p.s3_zombie_wait.as_millis() as u64},
        "kinds": Value::Object(out),
    })
}

// ---------------------------------------------------------------------------------------
// 4. Memory per concurrent slow stream.

/// Reads a held stream until `stop`; counts it `ready` once its first content event came.
async fn hold(
    reader: &mut impl StepBody,
    stop: &CancellationToken,
    ready: &AtomicUsize,
) -> std::io::Result<()> {
    let (mut tally, mut payload, mut counted) = (EventTally::default(), Vec::new(), false);
    loop {
        payload.clear();
        let step = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            s = reader.next_step(&mut payload) => s?,
        };
        match step {
            Step::Data { recv_ns } => tally.feed(&payload, recv_ns, u64::MAX),
            Step::End { .. } => return Err(std::io::Error::other("stream ended")),
        }
        if !counted && !tally.content.is_empty() {
            counted = true;
            ready.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn hold_streams(setup: &Setup, n: usize, interval_ms: u64) -> Result<Value, String> {
    let gw = setup.gw.as_ref().expect("memory is measured on gateways");
    sleep(Duration::from_millis(200)).await;
    let base = gw.rss_kib();
    let ready = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let gate = Arc::new(Semaphore::new(256));
    let mut set = JoinSet::new();
    let opened = Instant::now();
    // HTTP/2 clients: the connections first, STREAMS_PER_CONN streams on each (their cost
    // is in the per-stream figure, shared out).
    let h2_conns = h2_connections(setup, n).await?;
    for i in 0..n {
        let (addr, ready, failed, stop, gate) = (
            setup.addr,
            ready.clone(),
            failed.clone(),
            stop.clone(),
            gate.clone(),
        );
        let headers = stream_headers(&format!("mem-{i}"), 100_000, interval_ms);
        let sender = h2_conns.get(i / STREAMS_PER_CONN).cloned();
        set.spawn(async move {
            let r: std::io::Result<()> = async {
                let permit = gate.acquire_owned().await.expect("open semaphore");
                let status_err = |s| std::io::Error::other(format!("status {s}"));
                match sender {
                    None => {
                        let mut conn = Conn::connect(addr).await?;
                        conn.send(&request(addr, CHAT, &headers, STREAM_BODY))
                            .await?;
                        let head = conn.read_head().await?;
                        drop(permit);
                        if head.status != 200 {
                            return Err(status_err(head.status));
                        }
                        let mut reader = conn.body(&head);
                        hold(&mut reader, &stop, &ready).await
                    }
                    Some(mut sender) => {
                        let req = h2client::request(addr, CHAT, &headers, STREAM_BODY);
                        let resp = h2client::send(&mut sender, req)
                            .await?
                            .await
                            .map_err(std::io::Error::other)?;
                        drop(permit);
                        if resp.status() != 200 {
                            return Err(status_err(resp.status().as_u16()));
                        }
                        let mut reader = h2client::BodyReader::new(resp.into_body());
                        hold(&mut reader, &stop, &ready).await
                    }
                }
            }
            .await;
            if r.is_err() {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while ready.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed) < n
        && Instant::now() < deadline
    {
        sleep(Duration::from_millis(50)).await;
    }
    let ramp = opened.elapsed();
    let live = ready.load(Ordering::Relaxed);
    // Every stream has had a chunk; one more interval so that all of them are in their
    // steady state, then a few samples.
    sleep(Duration::from_millis(interval_ms.max(100))).await;
    let mut samples = Vec::new();
    for _ in 0..5 {
        samples.push(gw.rss_kib());
        sleep(Duration::from_millis(interval_ms.max(100) / 5)).await;
    }
    let upstream_open = setup.fake.open_connections();
    stop.cancel();
    while set.join_next().await.is_some() {}
    let client_conns = if setup.h2 { h2_conns.len() } else { n };
    drop(h2_conns);
    sleep(Duration::from_millis(500)).await;
    let after = gw.rss_kib();
    samples.sort_unstable();
    let peak = samples[samples.len() / 2];
    let per_stream = peak.saturating_sub(base) as f64 / live.max(1) as f64;
    Ok(json!({
        "streams": n,
        "live_streams": live,
        "failed_streams": failed.load(Ordering::Relaxed),
        "upstream_connections_open": upstream_open,
        "client_connections": client_conns,
        "client_protocol": if setup.h2 { "h2c" } else { "http/1.1" },
        "ramp_s": ramp.as_secs_f64(),
        "rss_base_kib": base,
        "rss_with_streams_kib": peak,
        "rss_after_close_kib": after,
        "rss_per_stream_kib": per_stream,
    }))
}

pub async fn memory(ctx: &Ctx) -> Value {
    let p = &ctx.p;
    let mut out = serde_json::Map::new();
    for &n in &p.s4_sizes {
        log(format!(
            "memory: {n} concurrent slow streams (a chunk every {} ms)",
            p.s4_interval_ms
        ));
        let gateways = Ctx {
            env: ctx.env.clone(),
            targets: ctx
                .targets
                .iter()
                .copied()
                .filter(|t| !t.is_direct())
                .collect(),
            p: p.clone(),
        };
        let results = each_target!(
            &gateways,
            Limits::RELAXED,
            format!("memory-{n}"),
            |t, setup| { hold_streams(&setup, n, p.s4_interval_ms).await }
        );
        out.insert(n.to_string(), by_target(results));
    }
    json!({
        "params": {"sizes": p.s4_sizes, "interval_ms": p.s4_interval_ms,
                   "nofile_limit": ctx.env.nofile},
        "sizes": Value::Object(out),
    })
}

// ---------------------------------------------------------------------------------------
// 5. Idle and first-token limits of 1 s.

#[derive(Clone, Copy, Debug)]
pub enum Silence {
    /// Three tokens, then nothing: the idle limit.
    Idle,
    /// The head at once, the first token never: the first-token limit after the head.
    FirstTokenHeadSent,
    /// Nothing at all, not even the head: the first-token limit before the head.
    FirstTokenHeadHeld,
}

impl Silence {
    pub fn name(self) -> &'static str {
        match self {
            Silence::Idle => "idle",
            Silence::FirstTokenHeadSent => "first_token_head_sent",
            Silence::FirstTokenHeadHeld => "first_token_head_held",
        }
    }

    fn headers(self, id: &str) -> Vec<(&'static str, String)> {
        let mut h = stream_headers(id, 100, 10);
        match self {
            Silence::Idle => h.push(("x-fake-freeze-after", "3".into())),
            Silence::FirstTokenHeadSent => h.push(("x-fake-ttft-ms", "600000".into())),
            Silence::FirstTokenHeadHeld => {
                h = without_headers_first(h);
                h.push(("x-fake-ttft-ms", "600000".into()));
            }
        }
        h
    }
}

pub const LIMIT: Duration = Duration::from_secs(1);

fn classify(o: &StreamOut) -> String {
    if let Some(e) = &o.err {
        return format!("client error: {e}");
    }
    if o.status != 200 {
        let text = String::from_utf8_lossy(&o.body);
        let code = ["first_token_timeout", "idle_timeout", "deadline_exceeded"]
            .into_iter()
            .find(|c| text.contains(c));
        return match code {
            Some(c) => format!("{} {c}", o.status),
            None => format!("{} (no error code)", o.status),
        };
    }
    match (&o.tally.error, o.end) {
        (Some((code, _)), _) => format!("event: error {code}"),
        (None, Some(End::Truncated)) => "truncated silently".into(),
        (None, Some(End::Clean)) => "ended cleanly, no error".into(),
        (None, None) => "no end".into(),
    }
}

async fn silence_once(setup: &Setup, kind: Silence, n: usize) -> Value {
    let mut set = JoinSet::new();
    for i in 0..n {
        let (addr, headers) = (setup.addr, kind.headers(&format!("{}-{i}", kind.name())));
        // Nothing a limit of 1 s should need; a target without a limit is cut off here.
        set.spawn(async move {
            timeout(LIMIT * 5, run_stream(addr, &headers, 10))
                .await
                .unwrap_or_else(|_| StreamOut {
                    err: Some("no end within 5 s".into()),
                    end_ns: monotonic_ns(),
                    ..StreamOut::default()
                })
        });
    }
    let mut took = Vec::new();
    let mut what: HashMap<String, usize> = HashMap::new();
    // One answer's body as the client got it, so that what a peer says (not only whether it
    // said a code we know) is on record.
    let mut example: Option<String> = None;
    while let Some(r) = set.join_next().await {
        let o = r.expect("silence task");
        // The silence starts at the last token the fake sent (idle) or when the request was
        // written (first token); it ends when the client sees the error event or the end.
        let from = match kind {
            Silence::Idle => o.tally.content.last().map_or(o.sent_ns, |&(s, _)| s),
            _ => o.sent_ns,
        };
        let seen = o.tally.error.as_ref().map_or(o.end_ns, |&(_, at)| at);
        if o.sent_ns > 0 {
            took.push(seen.saturating_sub(from));
        }
        *what.entry(classify(&o)).or_default() += 1;
        if example.is_none() && !o.body.is_empty() {
            example = Some(String::from_utf8_lossy(&o.body[..o.body.len().min(300)]).into());
        }
    }
    took.sort_unstable();
    json!({
        "streams": n,
        "end_seen_after": summary(&took),
        "what": what,
        "example_body": example,
    })
}

pub async fn limits(ctx: &Ctx) -> Value {
    let p = &ctx.p;
    log(format!(
        "limits of {LIMIT:?}: idle and first token, {} streams each",
        p.s5_streams
    ));
    let gateways = Ctx {
        env: ctx.env.clone(),
        targets: ctx
            .targets
            .iter()
            .copied()
            .filter(|&t| t.has_limits())
            .collect(),
        p: p.clone(),
    };
    let results = each_target!(&gateways, Limits { idle: LIMIT }, "limits", |t, setup| {
        let gw0 = setup.cpu();
        // The three kinds are independent and light: run them side by side.
        let (a, b, c) = tokio::join!(
            silence_once(&setup, Silence::Idle, p.s5_streams),
            silence_once(&setup, Silence::FirstTokenHeadSent, p.s5_streams),
            silence_once(&setup, Silence::FirstTokenHeadHeld, p.s5_streams),
        );
        let mut v = json!({ Silence::Idle.name(): a, Silence::FirstTokenHeadSent.name(): b,
                   Silence::FirstTokenHeadHeld.name(): c });
        // The streams start together and each costs the gateway its setup and its end, one
        // after the other on its core: how late the last end is follows this cost.
        if let Some(used) = setup.cpu().zip(gw0).map(|(a, b)| a.since(b)) {
            let streams = 3 * p.s5_streams.max(1);
            let (u, s) = used.user_sys_ms();
            let per = |ms: f64| ms * 1e3 / streams as f64;
            v["gateway_cpu_us_per_stream"] = json!(used.run_ns as f64 / 1e3 / streams as f64);
            v["gateway_user_sys_us_per_stream"] = json!([per(u), per(s)]);
        }
        Ok(v)
    });
    json!({
        "params": {"limit_ms": LIMIT.as_millis() as u64, "streams": p.s5_streams},
        "targets": by_target(results),
    })
}

// ---------------------------------------------------------------------------------------
// 6. CPU per 1,000 chunks forwarded.

pub async fn cpu(ctx: &Ctx) -> Value {
    let p = &ctx.p;
    log(format!(
        "CPU: {} streams x {} chunks at {} ms",
        p.s6_streams, p.s6_chunks, p.s6_interval_ms
    ));
    let results = each_target!(ctx, Limits::RELAXED, "cpu", |t, setup| {
        let (gw0, me0) = (setup.cpu(), Cpu::this_process());
        let t0 = Instant::now();
        let outs = stream_round(
            setup.addr,
            "cpu",
            p.s6_streams,
            p.s6_chunks,
            p.s6_interval_ms,
        )
        .await;
        let wall = t0.elapsed().as_secs_f64();
        let me = Cpu::this_process().since(me0);
        let chunks: usize = outs.iter().map(|o| o.tally.content.len()).sum();
        let events: u32 = outs.iter().map(|o| o.tally.events).sum();
        let mut v = json!({
            "chunks": chunks,
            "events": events,
            "wall_s": wall,
            "load_core_util": me.run_ns as f64 / 1e9 / wall,
        });
        if let Some(used) = setup.cpu().zip(gw0).map(|(a, b)| a.since(b)) {
            let (u, s) = used.user_sys_ms();
            let per = |x: f64| x / chunks.max(1) as f64 * 1000.0;
            v["gateway_cpu_ms"] = json!(used.run_ns as f64 / 1e6);
            v["gateway_user_ms"] = json!(u);
            v["gateway_sys_ms"] = json!(s);
            v["gateway_cpu_ms_per_1000_chunks"] = json!(per(used.run_ns as f64 / 1e6));
            v["gateway_user_sys_ms_per_1000_chunks"] = json!([per(u), per(s)]);
            v["gateway_cpu_util"] = json!(used.run_ns as f64 / 1e9 / wall);
        }
        Ok(v)
    });
    json!({
        "params": {"streams": p.s6_streams, "chunks": p.s6_chunks, "interval_ms": p.s6_interval_ms},
        "targets": by_target(results),
    })
}
