//! The fuzz targets' bodies, shared by the libFuzzer entry points (`cargo +nightly fuzz run
//! NAME`) and the stable stand-alone runner (`cargo run --no-default-features --bin NAME`).
//! Each panics on any broken property, which is what a fuzzer reports.

use std::path::Path;
use std::time::Duration;

use hourglass::budget::{
    BudgetRequest, BUDGET_HEADER, ENVOY_EXPECTED, GRPC_TIMEOUT, STAINLESS_READ_TIMEOUT,
    STAINLESS_TIMEOUT,
};
use hourglass::config::{Config, Limits};
use hourglass::http::sse::SseScanner;
use http::{HeaderMap, HeaderValue};
use tokio::time::Instant;

const HEADERS: [&str; 5] = [
    BUDGET_HEADER,
    GRPC_TIMEOUT,
    ENVOY_EXPECTED,
    STAINLESS_TIMEOUT,
    STAINLESS_READ_TIMEOUT,
];

fn limits(max_budget: Duration) -> Limits {
    Limits {
        budget: max_budget.min(Duration::from_secs(60)),
        max_budget,
        connect_timeout: Duration::from_secs(2),
        first_token_timeout: max_budget.min(Duration::from_secs(30)),
        idle_timeout: Duration::from_secs(20),
        reserve: Duration::ZERO,
        min_useful: Duration::from_millis(100),
    }
}

/// Budget headers: the input is lines; each line's first byte picks one of the five headers
/// and the rest is its value. Parsing never panics, a refusal is small and names its header,
/// and what is accepted resolves within `max_budget` without overflowing a deadline.
pub fn budget_headers(data: &[u8]) {
    let mut headers = HeaderMap::new();
    for line in data.split(|b| *b == b'\n').take(8) {
        let Some((&pick, value)) = line.split_first() else {
            continue;
        };
        if let Ok(v) = HeaderValue::from_bytes(value) {
            headers.append(HEADERS[usize::from(pick) % HEADERS.len()], v);
        }
    }
    match BudgetRequest::from_headers(&headers) {
        Ok(asked) => {
            for max in [Duration::from_millis(1), Duration::from_secs(31_557_600)] {
                let now = Instant::now();
                let b = asked.resolve(&limits(max), now);
                assert!(b.total <= max && !b.total.is_zero(), "{b:?}");
                assert!(b.first_token_timeout <= limits(max).first_token_timeout);
                let _ = (b.work_deadline(), b.forwarded_ms(now), b.ensure_useful(now));
            }
        }
        Err(e) => {
            assert_eq!(e.code(), "invalid_budget");
            // The value is cut to 64 characters; escaped, one is at most 10 bytes.
            assert!(e.json_body().len() < 1024, "{e}");
            let msg = e.to_string();
            assert!(HEADERS[..3].iter().any(|h| msg.starts_with(h)), "{msg}");
        }
    }
}

/// What a scan of a whole stream reports, in absolute offsets.
#[derive(Debug, PartialEq, Eq)]
struct Summary {
    progress: u64,
    error_end: Option<usize>,
    last_boundary: Option<usize>,
    in_block: bool,
}

fn scan_in_pieces(stream: &[u8], cuts: &[usize]) -> Summary {
    let mut sc = SseScanner::new();
    let mut out = Summary {
        progress: 0,
        error_end: None,
        last_boundary: None,
        in_block: false,
    };
    let mut start = 0;
    // A blank line's CRLF cut between CR and LF is reported after the CR (the block is
    // complete; waiting for the LF would stall CR-only streams): it is the same boundary as
    // the one after the LF. The error event's end is exact (it waits for the next byte).
    let at = |offset: usize| {
        if stream[..offset].ends_with(b"\r") && stream.get(offset) == Some(&b'\n') {
            offset + 1
        } else {
            offset
        }
    };
    for &end in cuts.iter().chain(std::iter::once(&stream.len())) {
        let end = end.clamp(start, stream.len());
        let s = sc.scan(&stream[start..end]);
        out.progress += u64::from(s.progress);
        if let Some(b) = s.last_boundary {
            out.last_boundary = Some(out.last_boundary.unwrap_or(0).max(at(start + b)));
        }
        if let Some(e) = s.error_end {
            out.error_end = Some(start + e);
            break;
        }
        start = end;
    }
    if sc.error_pending() {
        // The body ended right after the CR that ended the error event.
        out.error_end = Some(stream.len());
    }
    out.in_block = out.error_end.is_none() && sc.in_block();
    out
}

/// SSE scanner: the first two bytes seed where the rest is cut; the stream scanned whole,
/// cut there and byte by byte must report the same events, error and boundaries.
pub fn sse_scanner(data: &[u8]) {
    let (seed, stream) = match data {
        [a, b, rest @ ..] => (u16::from_le_bytes([*a, *b]), rest),
        _ => (0, data),
    };
    let whole = scan_in_pieces(stream, &[]);
    let mut cuts = Vec::new();
    let mut x = u32::from(seed) | 1;
    let mut at = 0usize;
    while at < stream.len() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        at += 1 + (x as usize % 9);
        cuts.push(at);
    }
    assert_eq!(scan_in_pieces(stream, &cuts), whole, "cut at {cuts:?}");
    let every: Vec<usize> = (1..stream.len()).collect();
    assert_eq!(scan_in_pieces(stream, &every), whole, "byte by byte");
}

/// Config loader: any text loads or is refused, never panics; what loads describes itself,
/// warns, and resolves the largest client budget without overflowing a deadline.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(c) = Config::from_toml(&text, "fuzz.toml") else {
        return;
    };
    let _ = c.describe();
    let _ = c.warnings();
    let mut h = HeaderMap::new();
    h.insert(BUDGET_HEADER, HeaderValue::from(u64::MAX));
    let asked = BudgetRequest::from_headers(&h).expect("a valid budget");
    for r in &c.routes {
        let l = &r.limits;
        assert!(l.first_token_timeout <= l.budget && l.budget <= l.max_budget);
        let b = asked.resolve(l, Instant::now());
        let _ = b.work_deadline();
    }
}

/// The stable runner: replays the files (or directories of files) named on the command line;
/// with none, replays `fuzz/seeds/NAME` and then `HOURGLASS_FUZZ_ITERS` (default 20000)
/// random inputs built from the seeds, seeded by `HOURGLASS_FUZZ_SEED`.
pub fn standalone(name: &str, target: fn(&[u8])) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut inputs: Vec<Vec<u8>> = Vec::new();
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(name);
    let paths: Vec<std::path::PathBuf> = if args.is_empty() {
        vec![seeds]
    } else {
        args.iter().map(Into::into).collect()
    };
    for p in paths {
        collect(&p, &mut inputs);
    }
    for input in &inputs {
        target(input);
    }
    if !args.is_empty() {
        eprintln!("{name}: {} inputs replayed", inputs.len());
        return;
    }
    let iters: u64 = std::env::var("HOURGLASS_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let mut rng: u64 = std::env::var("HOURGLASS_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x9E37_79B9_7F4A_7C15)
        | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for _ in 0..iters {
        let mut input = if inputs.is_empty() {
            Vec::new()
        } else {
            inputs[next() as usize % inputs.len()].clone()
        };
        // A few mutations: flip, insert, delete, splice from another seed.
        for _ in 0..1 + next() % 8 {
            let len = input.len();
            match next() % 4 {
                0 if len > 0 => input[next() as usize % len] = next() as u8,
                1 => {
                    let at = if len == 0 {
                        0
                    } else {
                        next() as usize % (len + 1)
                    };
                    let byte = *b"\r\n:\0 data event{}[]=\"0123456789HMSmun"
                        .get(next() as usize % 38)
                        .unwrap_or(&b'x');
                    input.insert(at, byte);
                }
                2 if len > 0 => {
                    input.remove(next() as usize % len);
                }
                _ if !inputs.is_empty() => {
                    let other = &inputs[next() as usize % inputs.len()];
                    if !other.is_empty() {
                        let from = next() as usize % other.len();
                        let to = (from + 1 + next() as usize % 64).min(other.len());
                        let at = if len == 0 {
                            0
                        } else {
                            next() as usize % (len + 1)
                        };
                        input.splice(at..at, other[from..to].iter().copied());
                    }
                }
                _ => {}
            }
        }
        run_one(name, target, &input);
    }
    eprintln!(
        "{name}: {} seeds and {iters} random inputs, no failure",
        inputs.len()
    );
}

/// Runs one generated input; on a failure, saves it where `cargo fuzz` would
/// (`fuzz/artifacts/NAME/`) so that `cargo run --bin NAME -- FILE` replays it.
fn run_one(name: &str, target: fn(&[u8]), input: &[u8]) {
    if std::panic::catch_unwind(|| target(input)).is_err() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("artifacts")
            .join(name);
        let _ = std::fs::create_dir_all(&dir);
        let hash = input.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
        let file = dir.join(format!("crash-{hash:016x}"));
        let _ = std::fs::write(&file, input);
        panic!("{name}: failing input saved to {}", file.display());
    }
}

fn collect(path: &Path, out: &mut Vec<Vec<u8>>) {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        entries.sort();
        for p in entries {
            collect(&p, out);
        }
    } else if let Ok(bytes) = std::fs::read(path) {
        out.push(bytes);
    }
}
