//! Property tests for the parsers that read hostile input: every budget header source
//! (DESIGN 3), and the config loader (never panics, and what it accepts is consistent). The
//! SSE scanner's split invariance is in `src/http/sse/tests.rs`, next to its reference parser.

use std::time::Duration;

use hourglass::budget::{
    BudgetRequest, BudgetSource, BUDGET_HEADER, ENVOY_EXPECTED, GRPC_TIMEOUT,
    STAINLESS_READ_TIMEOUT, STAINLESS_TIMEOUT,
};
use hourglass::config::{Config, Limits};
use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;
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
        first_token_timeout: Duration::from_secs(30).min(max_budget),
        idle_timeout: Duration::from_secs(20),
        reserve: Duration::ZERO,
        min_useful: Duration::from_millis(100),
    }
}

fn one(name: &'static str, value: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(name, HeaderValue::from_str(value).unwrap());
    h
}

/// Bytes a header value may hold on the wire (hyper refuses the others before us).
fn header_value() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        6 => prop::sample::select(b"0123456789".to_vec()),
        2 => prop::sample::select(b"HMSmun.-+eE, \t".to_vec()),
        1 => 0x20u8..=0x7e,
        1 => 0x80u8..=0xff,
    ];
    prop::collection::vec(byte, 0..24)
}

/// Any arrangement of the five headers, each absent, once or repeated.
fn headers() -> impl Strategy<Value = Vec<(usize, Vec<u8>)>> {
    prop::collection::vec((0..HEADERS.len(), header_value()), 0..6)
}

fn header_map(pairs: &[(usize, Vec<u8>)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (i, v) in pairs {
        if let Ok(v) = HeaderValue::from_bytes(v) {
            h.append(HEADERS[*i], v);
        }
    }
    h
}

fn ms_form(v: &str) -> bool {
    !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) && v.parse::<u64>().is_ok_and(|n| n > 0)
}

fn grpc_form(v: &str) -> bool {
    let Some((&unit, digits)) = v.as_bytes().split_last() else {
        return false;
    };
    (1..=8).contains(&digits.len())
        && digits.iter().all(u8::is_ascii_digit)
        && b"HMSmun".contains(&unit)
        && std::str::from_utf8(digits).unwrap().parse::<u64>().unwrap() > 0
}

/// `cases` per property, unless `PROPTEST_CASES` asks for another number (a deep run:
/// `PROPTEST_CASES=20000 cargo test`).
fn cases(cases: u32) -> ProptestConfig {
    let config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_some() {
        config
    } else {
        ProptestConfig { cases, ..config }
    }
}

proptest! {
    #![proptest_config(cases(2048))]

    /// Any well-formed millisecond count is taken as is (leading zeros included) and only
    /// ever clamped to `max_budget`, never refused or wrapped.
    #[test]
    fn millisecond_budgets_are_taken_and_clamped(
        n in 1u64..=u64::MAX,
        zeros in 0usize..3,
        envoy in any::<bool>(),
        max_s in 1u64..=31_557_600,
    ) {
        let name = if envoy { ENVOY_EXPECTED } else { BUDGET_HEADER };
        let text = format!("{}{n}", "0".repeat(zeros));
        let asked = BudgetRequest::from_headers(&one(name, &text)).unwrap();
        let max = Duration::from_secs(max_s);
        let now = Instant::now();
        let b = asked.resolve(&limits(max), now);
        let want = Duration::from_millis(n);
        prop_assert_eq!(b.total, want.min(max));
        prop_assert_eq!(b.clamped, want > max);
        prop_assert_eq!(b.deadline, now + b.total);
        let source = if envoy { BudgetSource::EnvoyExpected } else { BudgetSource::Header };
        prop_assert_eq!(b.source, source);
    }

    /// The gRPC form: 1 to 8 digits and a unit, converted exactly, down to the gateway's
    /// smallest budget of 1 ms.
    #[test]
    fn grpc_timeouts_are_converted_exactly(n in 1u64..=99_999_999, unit in 0usize..6) {
        let (u, d) = [
            ("H", Duration::from_secs(n * 3600)),
            ("M", Duration::from_secs(n * 60)),
            ("S", Duration::from_secs(n)),
            ("m", Duration::from_millis(n)),
            ("u", Duration::from_micros(n)),
            ("n", Duration::from_nanos(n)),
        ][unit];
        let asked = BudgetRequest::from_headers(&one(GRPC_TIMEOUT, &format!("{n}{u}"))).unwrap();
        let b = asked.resolve(&limits(Duration::from_secs(31_557_600)), Instant::now());
        let d = d.max(Duration::from_millis(1));
        prop_assert_eq!(b.total, d.min(Duration::from_secs(31_557_600)));
        prop_assert_eq!(b.source, BudgetSource::GrpcTimeout);
    }

    /// Whatever the headers, parsing never panics; it accepts exactly the well-formed,
    /// non-repeated values, with the documented precedence; a refusal names the header and
    /// stays small whatever was sent; the SDK patience headers never cause a refusal and
    /// only ever lower the watchdogs.
    #[test]
    fn any_budget_headers_parse_or_are_refused_cleanly(pairs in headers()) {
        let h = header_map(&pairs);
        let values = |name: &str| -> Vec<String> {
            h.get_all(name)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect()
        };
        let budget_headers = [(BUDGET_HEADER, false), (GRPC_TIMEOUT, true), (ENVOY_EXPECTED, false)];
        let acceptable = budget_headers.iter().all(|(name, grpc)| match values(name).as_slice() {
            [] => true,
            [v] => if *grpc { grpc_form(v) } else { ms_form(v) },
            _ => false,
        });
        match BudgetRequest::from_headers(&h) {
            Ok(asked) => {
                prop_assert!(acceptable, "accepted {:?}", h);
                let l = limits(Duration::from_secs(600));
                let b = asked.resolve(&l, Instant::now());
                prop_assert!(b.total <= l.max_budget && !b.total.is_zero());
                let expected = budget_headers
                    .iter()
                    .find(|(name, _)| h.contains_key(*name))
                    .map_or("config", |(name, _)| name);
                prop_assert_eq!(b.source.as_str(), expected);
                prop_assert!(b.first_token_timeout <= l.first_token_timeout);
                prop_assert!(b.idle_timeout <= l.idle_timeout);
            }
            Err(e) => {
                prop_assert!(!acceptable, "refused {:?}: {}", h, e);
                prop_assert_eq!(e.code(), "invalid_budget");
                prop_assert_eq!(e.status(), http::StatusCode::BAD_REQUEST);
                let msg = e.to_string();
                prop_assert!(budget_headers.iter().any(|(name, _)| msg.starts_with(name)), "{}", msg);
                prop_assert!(e.json_body().len() < 1024, "{}", msg);
            }
        }
    }

    /// The config loader never panics, whatever the text.
    #[test]
    fn config_loader_never_panics_on_any_text(text in ".{0,400}") {
        let _ = Config::from_toml(&text, "fuzz.toml");
    }

    /// Nor on text shaped like a config, with every key and plausible and implausible
    /// values; and what it accepts keeps its own invariants, describes and warns without
    /// panicking, and resolves any client budget without overflowing a deadline.
    #[test]
    fn config_loader_accepts_only_consistent_configs(text in config_text()) {
        let Ok(c) = Config::from_toml(&text, "fuzz.toml") else {
            return Ok(());
        };
        let _ = c.describe();
        let _ = c.warnings();
        prop_assert!(!c.routes.is_empty() && !c.upstreams.is_empty());
        for r in &c.routes {
            let l = &r.limits;
            prop_assert!(l.first_token_timeout <= l.budget && l.budget <= l.max_budget);
            prop_assert!(l.reserve.saturating_add(l.min_useful) < l.budget);
            prop_assert!(!l.connect_timeout.is_zero() && !l.idle_timeout.is_zero());
            prop_assert!(r.max_in_flight != Some(0));
            for v in ["1", "18446744073709551615"] {
                let asked = BudgetRequest::from_headers(&one(BUDGET_HEADER, v)).unwrap();
                let b = asked.resolve(l, Instant::now());
                let _ = (b.work_deadline(), b.forwarded_ms(Instant::now()));
            }
        }
    }
}

fn duration() -> impl Strategy<Value = String> {
    prop_oneof![
        20 => (1u64..2_000, prop::sample::select(vec!["ms", "s"]))
            .prop_map(|(n, u)| format!("\"{n}{u}\"")),
        1 => (0u64..100_000, prop::sample::select(vec!["ms", "s", "m", "h", "d", "y", "us", "ns"]))
            .prop_map(|(n, u)| format!("\"{n}{u}\"")),
        1 => prop::sample::select(vec![
            "\"\"", "\"0s\"", "\"-1s\"", "\"1.5s\"", "\"1s 500ms\"", "\"99999999999999999999h\"",
            "\"584942417355years\"", "\"1 year\"", "\"s\"", "5", "\"\u{1F600}\"",
        ]).prop_map(str::to_owned),
    ]
}

/// One of `valid` most of the time, one of `invalid` now and then.
fn pick(valid: &[&'static str], invalid: &[&'static str]) -> BoxedStrategy<String> {
    let valid = prop::sample::select(valid.to_vec()).prop_map(str::to_owned);
    if invalid.is_empty() {
        return valid.boxed();
    }
    let invalid = prop::sample::select(invalid.to_vec()).prop_map(str::to_owned);
    prop_oneof![10 => valid, 1 => invalid].boxed()
}

/// A value for `key`: usually one of its own type, sometimes anything at all.
fn value_for(key: &'static str) -> BoxedStrategy<String> {
    let typed = match key {
        "listen" | "admin_listen" => pick(
            &["\"127.0.0.1:0\"", "\"[::1]:0\"", "\"0.0.0.0:8080\""],
            &["\"localhost:80\"", "\"1.2.3.4\""],
        ),
        "max_request_body"
        | "max_connections"
        | "max_header_bytes"
        | "max_headers"
        | "http2_max_concurrent_streams"
        | "retries"
        | "max_in_flight" => pick(
            &["1", "3", "100", "8192", "65536", "1000000"],
            &["0", "4294967295", "18446744073709551615", "-1"],
        ),
        "url" => pick(
            &["\"http://127.0.0.1:1\"", "\"https://api.example.com/v1/\""],
            &[
                "\"ftp://x\"",
                "\"http://u:p@h\"",
                "\"http://h/?q\"",
                "\"http://\"",
            ],
        ),
        "api_key_env" | "client_keys_env" => pick(
            &["\"SOME_VAR\""],
            &["\"\"", "\"A=B\"", "\"sk-abcdefghijklmnopqrstuv\""],
        ),
        "api_key_file" | "client_keys_file" | "ca_file" => {
            pick(&["\"keys/k\"", "\"/nonexistent\""], &["\"\""])
        }
        "auth" => pick(&["\"bearer\"", "\"x-api-key\"", "\"none\""], &["\"basic\""]),
        "propagate_budget" => pick(&["true", "false"], &["1"]),
        "model" => pick(&["\"gpt-4o-mini\""], &["\"\""]),
        "name" => pick(&["\"r2\"", "\"r3\""], &["\"r\"", "\"\""]),
        "path_prefix" => pick(&["\"/v1\"", "\"/v1/chat/\""], &["\"v1\"", "\"\""]),
        "upstream" => pick(&["\"a\"", "\"b\""], &["\"missing\""]),
        "models" => pick(&["[\"gpt*\"]", "[\"*\", \"o?\"]", "[]"], &["[\"\"]"]),
        "retry_on" => pick(
            &[
                "[\"connect\", \"5xx\"]",
                "[]",
                "[\"429\", \"reset\", \"first_token\"]",
            ],
            &["[\"nope\"]"],
        ),
        "fallbacks" => pick(
            &["[\"b\"]"],
            &["[\"a\"]", "[\"b\", \"b\"]", "[\"missing\"]"],
        ),
        _ => duration().boxed(),
    };
    prop_oneof![30 => typed, 1 => scalar()].boxed()
}

fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "0",
            "1",
            "-1",
            "10",
            "1000000",
            "9223372036854775807",
            "18446744073709551616",
            "true",
            "\"\"",
            "\"x\"",
            "\"/\"",
            "\"127.0.0.1:0\"",
            "\"[::1]:0\"",
            "\"http://127.0.0.1:1\"",
            "\"https://u:p@h\"",
            "\"sk-abcdefghijklmnopqrstuv\"",
            "\"ANY_VAR\"",
            "[]",
            "[\"*\"]",
            "[\"connect\", \"5xx\"]",
            "[\"nope\"]",
            "\"bearer\"",
            "\"none\"",
            "\"x-api-key\"",
            "{}",
        ])
        .prop_map(str::to_owned),
        duration(),
    ]
}

const SERVER_KEYS: [&str; 9] = [
    "listen",
    "admin_listen",
    "max_request_body",
    "header_read_timeout",
    "shutdown_grace",
    "max_connections",
    "max_header_bytes",
    "max_headers",
    "http2_max_concurrent_streams",
];
const LIMIT_KEYS: [&str; 7] = [
    "budget",
    "max_budget",
    "connect_timeout",
    "first_token_timeout",
    "idle_timeout",
    "reserve",
    "min_useful",
];
const UPSTREAM_KEYS: [&str; 8] = [
    "url",
    "api_key_env",
    "api_key_file",
    "auth",
    "ca_file",
    "propagate_budget",
    "model",
    "expected_first_token",
];
const ROUTE_KEYS: [&str; 11] = [
    "name",
    "path_prefix",
    "upstream",
    "models",
    "retries",
    "retry_on",
    "fallbacks",
    "hedge_after",
    "max_in_flight",
    "client_keys_env",
    "client_keys_file",
];

fn table(keys: &'static [&'static str]) -> impl Strategy<Value = String> {
    let entry = prop::sample::select(keys).prop_flat_map(|k| (Just(k), value_for(k)));
    prop::collection::vec(entry, 0..4).prop_map(|kv| {
        let mut seen = std::collections::HashSet::new();
        kv.into_iter()
            .filter(|(k, _)| seen.insert(*k))
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect()
    })
}

/// A config that usually parses: a valid skeleton (one upstream `a`, one route to it) with
/// random keys of every table laid over it.
fn config_text() -> impl Strategy<Value = String> {
    let limits: Vec<&'static str> = LIMIT_KEYS.to_vec();
    let route_keys: Vec<&'static str> = ROUTE_KEYS
        .iter()
        .chain(LIMIT_KEYS.iter())
        .copied()
        .collect();
    let route_keys: &'static [&'static str] = Box::leak(route_keys.into_boxed_slice());
    let limits: &'static [&'static str] = Box::leak(limits.into_boxed_slice());
    (
        table(&SERVER_KEYS),
        table(limits),
        table(&UPSTREAM_KEYS),
        prop::collection::vec(table(route_keys), 0..3),
        any::<bool>(),
    )
        .prop_map(|(server, defaults, upstream, routes, skeleton)| {
            let mut out = format!(
                "[server]\n{server}\n[defaults]\n{defaults}\n[upstreams.b]\nurl = \"http://127.0.0.1:2\"\n\n[upstreams.a]\n"
            );
            if !upstream.contains("url =") {
                out.push_str("url = \"http://127.0.0.1:1\"\n");
            }
            out.push_str(&upstream);
            if skeleton || routes.is_empty() {
                out.push_str("\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"a\"\n");
            }
            for (i, r) in routes.iter().enumerate() {
                out.push_str("\n[[routes]]\n");
                // The required keys, unless the random ones set them.
                for (key, value) in [
                    ("name", format!("\"n{i}\"")),
                    ("path_prefix", "\"/v1/chat\"".to_owned()),
                    ("upstream", "\"b\"".to_owned()),
                ] {
                    if !r.contains(&format!("{key} =")) {
                        out.push_str(&format!("{key} = {value}\n"));
                    }
                }
                out.push_str(r);
            }
            out
        })
}
