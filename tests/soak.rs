//! Soak: a bounded mixed load of good, slow, frozen, aborted, refused, overloaded and
//! failing streams, then the metrics reconciled against what the clients saw: every request
//! counted exactly once, under the outcome its client observed, and every cancellation with
//! the one origin its client was told (or, for clients that left, `client`).
//!
//! 10 seconds by default; `HOURGLASS_SOAK=1` runs it for 2 minutes
//! (`HOURGLASS_SOAK_SECS=N` for any other length).

#[path = "it/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use support::*;
use tokio::time::Instant;

const CLIENT_KEY: &str = "soak-client-key-0123456789";

/// Routes, chosen by the body's model: `limited` (`max_in_flight = 2`), `keyed` (client
/// keys, from a file in `dir`), and `chat` for the rest (the base limits, idle 500 ms, first
/// token 1 s).
fn config(dir: &std::path::Path) -> String {
    let keys = dir.join("keys");
    std::fs::write(&keys, CLIENT_KEY).unwrap();
    BASE.replace("first_token_timeout = \"2s\"", "first_token_timeout = \"1s\"")
        .replace("idle_timeout = \"1s\"", "idle_timeout = \"500ms\"")
        .replace(
            "[[routes]]\nname = \"chat\"",
            "[[routes]]\nname = \"limited\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n\
             models = [\"limited\"]\nmax_in_flight = 2\n\n\
             [[routes]]\nname = \"keyed\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n\
             models = [\"keyed\"]\nclient_keys_file = \"{KEYS_FILE}\"\n\n\
             [[routes]]\nname = \"chat\"",
        )
        .replace("{KEYS_FILE}", &keys.display().to_string())
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Good,
    Slow,
    Frozen,
    Aborted,
    BadBudget,
    TinyBudget,
    Deadline,
    FirstToken,
    UpstreamStatus,
    UpstreamDisconnect,
    NonStream,
    Limited,
    Unauthorized,
    Keyed,
}

const KINDS: [Kind; 14] = [
    Kind::Good,
    Kind::Slow,
    Kind::Frozen,
    Kind::Aborted,
    Kind::BadBudget,
    Kind::TinyBudget,
    Kind::Deadline,
    Kind::FirstToken,
    Kind::UpstreamStatus,
    Kind::UpstreamDisconnect,
    Kind::NonStream,
    Kind::Limited,
    Kind::Unauthorized,
    Kind::Keyed,
];

fn request(kind: Kind) -> (&'static str, Request<Full<Bytes>>) {
    let h: &[(&str, &str)] = match kind {
        Kind::Good => &[("x-fake-chunks", "5"), ("x-fake-interval-ms", "10")],
        Kind::Slow => &[("x-fake-chunks", "8"), ("x-fake-interval-ms", "200")],
        Kind::Frozen => &[("x-fake-freeze-after", "2"), ("x-fake-interval-ms", "10")],
        Kind::Aborted => &[("x-fake-chunks", "100000"), ("x-fake-interval-ms", "20")],
        Kind::BadBudget => &[("x-request-budget-ms", "-1")],
        Kind::TinyBudget => &[("x-request-budget-ms", "1")],
        Kind::Deadline => &[
            ("x-request-budget-ms", "800"),
            ("x-fake-chunks", "1000"),
            ("x-fake-interval-ms", "100"),
        ],
        Kind::FirstToken => &[("x-fake-ttft-ms", "3000")],
        Kind::UpstreamStatus => &[("x-fake-status", "500")],
        Kind::UpstreamDisconnect => &[
            ("x-fake-disconnect-after", "2"),
            ("x-fake-interval-ms", "10"),
        ],
        Kind::NonStream => &[("x-fake-chunks", "3")],
        Kind::Limited => &[
            ("x-request-budget-ms", "600"),
            ("x-fake-chunks", "3"),
            ("x-fake-interval-ms", "100"),
        ],
        Kind::Unauthorized => &[("authorization", "Bearer not-a-key-000000000")],
        Kind::Keyed => &[("x-api-key", CLIENT_KEY), ("x-fake-chunks", "2")],
    };
    let route = match kind {
        Kind::Limited => "limited",
        Kind::Unauthorized | Kind::Keyed => "keyed",
        _ => "chat",
    };
    let mut req = chat_request(h, !matches!(kind, Kind::NonStream));
    if route != "chat" {
        let body = format!(r#"{{"model":"{route}","stream":true}}"#);
        *req.body_mut() = Full::new(Bytes::from(body));
    }
    (route, req)
}

/// The (outcome, origin) a code the client was told stands for.
fn from_code(code: &str) -> (&'static str, &'static str) {
    match code {
        "insufficient_budget" => ("cancelled", "insufficient_budget"),
        "connect_timeout" => ("cancelled", "connect"),
        "first_token_timeout" => ("cancelled", "first_token"),
        "idle_timeout" => ("cancelled", "idle"),
        "deadline_exceeded" => ("cancelled", "deadline"),
        "overloaded" => ("cancelled", "overloaded"),
        "shutdown" => ("cancelled", "shutdown"),
        _ => ("error", "-"),
    }
}

/// Sends one request of `kind` and returns what its client saw, as the (outcome, origin)
/// the gateway must have counted.
async fn one(h: &Harness, kind: Kind) -> (&'static str, &'static str, &'static str) {
    let (route, req) = request(kind);
    let (resp, conn) = h.send(req).await;
    let status = resp.status();
    if let Kind::Aborted = kind {
        let mut body = resp.into_body();
        read_events(&mut body, 3).await;
        drop(body);
        conn.close();
        return (route, "cancelled", "client");
    }
    let read = read_body(resp.into_body()).await;
    assert!(
        read.error.is_none(),
        "{kind:?}: broken body {:?}",
        read.error
    );
    let (outcome, origin) = if status.is_success() {
        match read.error_event() {
            Some(e) => from_code(e["code"].as_str().unwrap()),
            None => ("ok", "-"),
        }
    } else if let Kind::UpstreamStatus = kind {
        // The upstream's own answer, passed through whole.
        assert_eq!(status, 500);
        ("ok", "-")
    } else {
        let v: serde_json::Value = serde_json::from_slice(&read.bytes)
            .unwrap_or_else(|e| panic!("{kind:?}: {status} not JSON ({e}): {}", read.text()));
        let code = v["error"]["code"].as_str();
        from_code(code.unwrap_or_else(|| panic!("{kind:?}: {status} {v}")))
    };
    (route, outcome, origin)
}

/// Requests seen by the clients, by (route, outcome, origin).
type Tally = BTreeMap<(&'static str, &'static str, &'static str), u64>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_reconciles_every_request_and_cancellation() {
    let secs: u64 = match std::env::var("HOURGLASS_SOAK_SECS").ok() {
        Some(v) => v
            .parse()
            .expect("HOURGLASS_SOAK_SECS is a number of seconds"),
        None if std::env::var_os("HOURGLASS_SOAK").is_some() => 120,
        None => 10,
    };
    let dir = tempfile::Builder::new()
        .prefix("hourglass-soak-")
        .tempdir()
        .unwrap();
    let h = Arc::new(Harness::with_config(&config(dir.path())).await);
    let seen: Arc<Mutex<Tally>> = Arc::default();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..24u64 {
        let (h, seen) = (h.clone(), seen.clone());
        workers.spawn(async move {
            let mut rng = fastrand::Rng::with_seed(w);
            let mut sent = 0u64;
            while Instant::now() < end {
                let kind = KINDS[rng.usize(..KINDS.len())];
                let key = one(&h, kind).await;
                *seen.lock().unwrap().entry(key).or_default() += 1;
                sent += 1;
            }
            sent
        });
    }
    let mut sent = 0;
    while let Some(n) = workers.join_next().await {
        sent += n.unwrap();
    }
    let seen = seen.lock().unwrap().clone();

    // Reports happen as bodies are dropped: wait until every request is in.
    let routes = ["chat", "limited", "keyed"];
    let deadline = Instant::now() + Duration::from_secs(10);
    let total = |text: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with("hourglass_requests_total{"))
            .filter(|l| routes.iter().any(|r| l.contains(&format!("route=\"{r}\""))))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    let text = loop {
        let text = h.metrics_text().await;
        if total(&text) >= sent as f64 || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let sample = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .map_or(0.0, |v| v.parse().unwrap())
    };

    let mut summary = Vec::new();
    assert_eq!(
        total(&text),
        sent as f64,
        "every request counted exactly once"
    );
    for route in routes {
        for outcome in ["ok", "error", "cancelled"] {
            let expected: u64 = seen
                .iter()
                .filter(|((r, o, _), _)| *r == route && *o == outcome)
                .map(|(_, n)| n)
                .sum();
            let got = sample(&format!(
                "hourglass_requests_total{{outcome=\"{outcome}\",route=\"{route}\"}}"
            ));
            assert_eq!(got, expected as f64, "{route} {outcome}");
            summary.push(format!("{route}/{outcome}={expected}"));
        }
        let mut origins_total = 0.0;
        for origin in [
            "client",
            "deadline",
            "first_token",
            "idle",
            "connect",
            "insufficient_budget",
            "shutdown",
            "overloaded",
        ] {
            let expected = seen
                .get(&(route, "cancelled", origin))
                .copied()
                .unwrap_or(0);
            let got = sample(&format!(
                "hourglass_cancellations_total{{origin=\"{origin}\",route=\"{route}\"}}"
            ));
            assert_eq!(got, expected as f64, "{route} cancelled by {origin}");
            origins_total += got;
            if expected > 0 {
                summary.push(format!("{route}:{origin}={expected}"));
            }
        }
        let cancelled = sample(&format!(
            "hourglass_requests_total{{outcome=\"cancelled\",route=\"{route}\"}}"
        ));
        assert_eq!(
            origins_total, cancelled,
            "{route}: every cancellation has exactly one origin"
        );
    }
    assert_eq!(
        sample("hourglass_upstream_requests_in_flight{upstream=\"fake\"}"),
        0.0
    );
    let upstream = h.fake.requests();
    let unfinished = upstream.iter().filter(|r| r.finished_at.is_none()).count();
    assert_eq!(unfinished, 0, "upstream calls still running at the end");
    eprintln!(
        "soak {secs}s: {sent} requests, {} upstream calls; {}",
        upstream.len(),
        summary.join(" ")
    );
}
