//! Retries, fallbacks and hedging spend one budget: two fake providers behind one route.
//!
//! Timings are asserted as order and cause on a machine that may be busy: lower bounds are
//! exact (a limit never fires early), the winner and the reason come from the metrics, and
//! upper bounds stay far below the alternative they rule out (which is made seconds away).

use std::time::Duration;

use crate::support::*;
use hourglass::config::Config;
use hourglass::server::{self, Running};
use hourglass_fake::FakeUpstream;
use tokio::time::Instant;

mod background;
mod error_events;
mod hedges;
mod left_wait;
mod owed;
mod scripted;

struct Pair {
    primary: FakeUpstream,
    backup: FakeUpstream,
    gw: Running,
}

const CONFIG: &str = r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
budget = "5s"
max_budget = "30s"
connect_timeout = "500ms"
first_token_timeout = "2s"
idle_timeout = "1s"

[upstreams.primary]
url = "{PRIMARY}"
auth = "none"
{PRIMARY_EXTRA}

[upstreams.backup]
url = "{BACKUP}"
auth = "none"
{BACKUP_EXTRA}

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "primary"
{ROUTE}
"#;

fn config(
    primary: &str,
    backup: &str,
    route: &str,
    primary_extra: &str,
    backup_extra: &str,
) -> String {
    CONFIG
        .replace("{PRIMARY}", primary)
        .replace("{BACKUP}", backup)
        .replace("{PRIMARY_EXTRA}", primary_extra)
        .replace("{BACKUP_EXTRA}", backup_extra)
        .replace("{ROUTE}", route)
}

async fn pair(route: &str, primary_extra: &str, backup_extra: &str) -> Pair {
    pair_with(route, primary_extra, backup_extra, None).await
}

async fn pair_with(
    route: &str,
    primary_extra: &str,
    backup_extra: &str,
    primary_url: Option<String>,
) -> Pair {
    let primary = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let backup = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let text = config(
        &primary_url.unwrap_or_else(|| primary.url()),
        &backup.url(),
        route,
        primary_extra,
        backup_extra,
    );
    let config = Config::from_toml(&text, "retry-test.toml").unwrap();
    let gw = server::start(config).await.unwrap();
    Pair {
        primary,
        backup,
        gw,
    }
}

impl Pair {
    async fn chat(
        &self,
        headers: &[(&str, &str)],
    ) -> (http::Response<hyper::body::Incoming>, Conn) {
        Conn::open(self.gw.addr)
            .await
            .send(chat_request(headers, true))
            .await
    }

    async fn metric(&self, sample: &str) -> f64 {
        metric(self.gw.admin_addr, sample).await
    }

    async fn wait_reported(&self, n: f64) {
        self.wait_reported_on("chat", n).await
    }

    /// Waits until `n` requests on `route` are counted, whatever their outcome.
    async fn wait_reported_on(&self, route: &str, n: f64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut total = 0.0;
            for o in ["ok", "error", "cancelled", "detached"] {
                total += self
                    .metric(&format!(
                        "hourglass_requests_total{{outcome=\"{o}\",route=\"{route}\"}}"
                    ))
                    .await;
            }
            if total >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{total} of {n} requests reported"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A URL whose connects are refused, and the guard that keeps its port from other tests.
fn closed_port() -> (socket2::Socket, String) {
    let (guard, addr) = refused_addr();
    (guard, format!("http://{addr}"))
}

#[tokio::test]
async fn a_primary_that_refuses_connections_falls_back_within_budget() {
    let (_refusing, url) = closed_port();
    let p = pair_with("fallbacks = [\"backup\"]", "", "", Some(url)).await;
    let start = Instant::now();
    let (resp, _c) = p
        .chat(&[("x-request-budget-ms", "3000"), ("x-fake-chunks", "3")])
        .await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(read.text().ends_with("data: [DONE]\n\n"), "{}", read.text());
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(p.backup.requests().len(), 1);
    p.wait_reported(1.0).await;
    assert_eq!(
        p.metric("hourglass_fallbacks_total{from=\"primary\",route=\"chat\",to=\"backup\"}")
            .await,
        1.0
    );
    assert_eq!(
        p.metric("hourglass_requests_total{outcome=\"ok\",route=\"chat\"}")
            .await,
        1.0
    );
    assert_eq!(
        p.metric("hourglass_attempts_sum{route=\"chat\"}").await,
        2.0
    );
}

/// A failure of the gateway's own after its fallback failed too tells the SDKs not to run
/// the chain again; the same failure of a route that made one attempt leaves it to them.
#[tokio::test]
async fn a_failure_after_a_fallback_tells_sdks_not_to_retry() {
    let (_refusing, url) = closed_port();
    let (_refusing_too, backup) = closed_port();
    // With the fallback: two attempts. Without: one (the primary refused).
    for (route, says) in [("fallbacks = [\"backup\"]", Some("false")), ("", None)] {
        let toml = config(&url, &backup, route, "", "");
        let gw = server::start(Config::from_toml(&toml, "test.toml").unwrap())
            .await
            .unwrap();
        let (resp, _c) = Conn::open(gw.addr)
            .await
            .send(chat_request(&[], false))
            .await;
        assert_eq!(resp.status(), 502, "{route}");
        let should_retry = resp.headers().get("x-should-retry").cloned();
        assert_eq!(
            should_retry.as_ref().map(|v| v.to_str().unwrap()),
            says,
            "{route}"
        );
        let v = json_body(resp).await;
        assert_eq!(v["error"]["code"], "upstream_unavailable");
        // Audit GG 4: where the last attempt's connect was refused.
        let message = v["error"]["message"].as_str().unwrap();
        let (name, at) = match says {
            Some(_) => ("backup", &backup),
            None => ("primary", &url),
        };
        let at = at.trim_start_matches("http://");
        assert!(
            message.starts_with(&format!(
                "upstream \"{name}\" unavailable: connecting to {at}: tcp connect error"
            )),
            "{message}"
        );
        gw.shutdown().await;
    }
}

/// So does any status the SDKs retry (408, 409 as well as 429 and 5xx) when it ends a chain
/// of more than one attempt; a 400 after a fallback does not say it, the SDKs do not retry it.
#[tokio::test]
async fn a_status_the_sdks_retry_after_a_fallback_says_not_to() {
    let p = pair("fallbacks = [\"backup\"]", "", "").await;
    p.primary.set_script(&[("x-fake-status", "500")]);
    for (status, says) in [
        ("409", Some("false")),
        ("408", Some("false")),
        ("400", None),
    ] {
        p.backup.set_script(&[("x-fake-status", status)]);
        let (resp, _c) = p.chat(&[]).await;
        assert_eq!(resp.status().as_str(), status);
        assert_eq!(
            resp.headers()
                .get("x-should-retry")
                .map(|v| v.to_str().unwrap()),
            says,
            "{status}"
        );
        read_body(resp.into_body()).await;
    }
}

#[tokio::test]
async fn a_late_first_token_switches_to_the_fallback_and_leaves_it_room() {
    // The backup is expected to need 3 s to its first token, so with 5 s of budget the
    // primary gets 5000 - 3000 = 2000 ms for its own, not the route's 4 s.
    let p = pair(
        "fallbacks = [\"backup\"]\nfirst_token_timeout = \"4s\"",
        "",
        "expected_first_token = \"3s\"",
    )
    .await;
    p.primary
        .set_script(&[("x-fake-ttft-ms", "20000"), ("x-fake-headers-first", "1")]);
    p.backup.set_script(&[("x-fake-ttft-ms", "300")]);
    let start = Instant::now();
    let (resp, _c) = p.chat(&[("x-request-budget-ms", "5000")]).await;
    let head_at = start.elapsed();
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(read.error_event().is_none(), "{}", read.text());
    assert!(read.text().ends_with("data: [DONE]\n\n"));
    // The primary's stream was cut when its attempt's limit fired, ~2 s after it was sent:
    // never earlier (counted from before the request), and well before the route's 4 s
    // would have (counted from when the fake saw it).
    let primary_conn = p.primary.connections()[0].id;
    let cut = p
        .primary
        .wait_closed(primary_conn, Duration::from_secs(10))
        .await
        .expect("the primary's connection closed");
    assert!(
        cut - start >= Duration::from_millis(1900),
        "{:?}",
        cut - start
    );
    let primary_for = cut - p.primary.requests()[0].at;
    assert!(
        primary_for < Duration::from_millis(3500),
        "the primary had {primary_for:?}"
    );
    // The backup was asked only after that limit, and answered inside the budget.
    let asked = p.backup.requests()[0].at - start;
    assert!(asked >= Duration::from_millis(1900), "{asked:?}");
    assert!(head_at < Duration::from_secs(5), "{head_at:?}");
    p.wait_reported(1.0).await;
    assert_eq!(
        p.metric("hourglass_requests_total{outcome=\"ok\",route=\"chat\"}")
            .await,
        1.0
    );
}

/// The fallback's room is kept only by a wait whose end moves on to it. With `retry_on`
/// lacking `first_token`, a late first token is the client's 504 whatever the fallback, so
/// cutting it short for the fallback only failed answers that would have come in time.
#[tokio::test]
async fn a_first_token_that_retry_on_does_not_move_on_from_keeps_its_whole_limit() {
    let p = pair(
        "fallbacks = [\"backup\"]\nfirst_token_timeout = \"4s\"\nretry_on = [\"connect\", \"5xx\"]",
        "",
        "expected_first_token = \"3s\"",
    )
    .await;
    // Within the route's 4 s, and after the 2 s that the backup's room would leave.
    p.primary
        .set_script(&[("x-fake-ttft-ms", "2800"), ("x-fake-headers-first", "1")]);
    let (resp, _c) = p.chat(&[("x-request-budget-ms", "5000")]).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(read.error_event().is_none(), "{}", read.text());
    assert!(read.text().ends_with("data: [DONE]\n\n"), "{}", read.text());
    assert!(p.backup.requests().is_empty());
}

/// A late 5xx after a first-token wait left whole passes through when the fallback no
/// longer fits: only the room of a wait that was cut is kept for the fallback. (It went to
/// the fallback with what was left, which ran out: a 504 in place of the upstream's 503.)
#[tokio::test]
async fn a_late_5xx_after_an_uncut_wait_passes_through_when_the_fallback_does_not_fit() {
    let p = pair(
        "fallbacks = [\"backup\"]\nfirst_token_timeout = \"4s\"\nretry_on = [\"connect\", \"5xx\"]",
        "",
        "expected_first_token = \"3s\"",
    )
    .await;
    p.primary
        .set_script(&[("x-fake-status", "503"), ("x-fake-ttft-ms", "3500")]);
    let (resp, _c) = p.chat(&[("x-request-budget-ms", "5000")]).await;
    assert_eq!(resp.status(), 503);
    read_body(resp.into_body()).await;
    assert!(p.backup.requests().is_empty());
}

/// Nor is a connect cut short for a fallback that a connect failure does not move on to.
#[tokio::test]
async fn a_connect_that_retry_on_does_not_move_on_from_keeps_its_whole_limit() {
    let (_held, addr) = hourglass_fake::never_accepting_listener().unwrap();
    let p = pair_with(
        "fallbacks = [\"backup\"]\nconnect_timeout = \"1s\"\nretry_on = [\"first_token\"]",
        "",
        "expected_first_token = \"600ms\"",
        Some(format!("http://{addr}")),
    )
    .await;
    let start = Instant::now();
    let (resp, _c) = p.chat(&[("x-request-budget-ms", "1400")]).await;
    let took = start.elapsed();
    assert_eq!(resp.status(), 504);
    assert_eq!(json_body(resp).await["error"]["code"], "connect_timeout");
    // Its own 1 s, not the 0.75 s that the backup's room would leave.
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(p.backup.requests().is_empty());
}

#[tokio::test]
async fn a_late_first_token_without_a_fallback_is_a_504() {
    let p = pair("first_token_timeout = \"400ms\"", "", "").await;
    p.primary.set_script(&[("x-fake-ttft-ms", "20000")]);
    let start = Instant::now();
    let (resp, _c) = p.chat(&[]).await;
    assert_eq!(resp.status(), 504);
    assert_eq!(
        json_body(resp).await["error"]["code"],
        "first_token_timeout"
    );
    let took = start.elapsed();
    // Not before its limit; and not at the 5 s budget either (the code says which fired).
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert!(p.backup.requests().is_empty());
}

#[tokio::test]
async fn a_retry_that_does_not_fit_is_not_made() {
    let p = pair(
        "retries = 2\nretry_on = [\"5xx\"]",
        "expected_first_token = \"500ms\"",
        "",
    )
    .await;
    p.primary
        .set_script(&[("x-fake-status", "503"), ("x-fake-ttft-ms", "600")]);
    let (resp, _c) = p.chat(&[("x-request-budget-ms", "1000")]).await;
    // No time for another attempt: the upstream's own answer passes through.
    assert_eq!(resp.status(), 503);
    // One attempt: retrying is left to the client's SDK, as without the gateway.
    assert!(!resp.headers().contains_key("x-should-retry"));
    read_body(resp.into_body()).await;
    assert_eq!(p.primary.requests().len(), 1, "no second request was made");
}

#[tokio::test]
async fn a_retry_that_fits_is_made_and_counted() {
    let p = pair("retries = 2\nretry_on = [\"5xx\"]", "", "").await;
    p.primary.set_script(&[("x-fake-status", "500")]);
    let (resp, _c) = p.chat(&[("x-request-budget-ms", "5000")]).await;
    assert_eq!(resp.status(), 500, "the last answer passes through");
    // With a header of the gateway's: the retrying was done here, and the SDKs' own two
    // retries would each run the three attempts again.
    assert_eq!(resp.headers()["x-should-retry"], "false");
    read_body(resp.into_body()).await;
    assert_eq!(p.primary.requests().len(), 3);
    p.wait_reported(1.0).await;
    assert_eq!(
        p.metric("hourglass_retries_total{reason=\"5xx\",route=\"chat\",upstream=\"primary\"}")
            .await,
        2.0
    );
    // The answer passed through is the request's `ok` outcome; what the upstream answered
    // each attempt shows by status class.
    assert_eq!(
        p.metric(
            "hourglass_upstream_responses_total{class=\"5xx\",route=\"chat\",upstream=\"primary\"}"
        )
        .await,
        3.0
    );
    assert_eq!(
        p.metric(
            "hourglass_upstream_responses_total{class=\"2xx\",route=\"chat\",upstream=\"primary\"}"
        )
        .await,
        0.0
    );
}

#[tokio::test]
async fn no_retry_after_the_first_byte_reached_the_client() {
    for route in ["retries = 2", "retries = 2\nfallbacks = [\"backup\"]"] {
        let p = pair(route, "", "").await;
        p.primary.set_script(&[("x-fake-disconnect-after", "2")]);
        let (resp, _c) = p.chat(&[]).await;
        assert_eq!(resp.status(), 200);
        let read = read_body(resp.into_body()).await;
        assert_eq!(
            read.error_event().expect("error event")["code"],
            "upstream_error",
            "{route}"
        );
        assert_eq!(p.primary.requests().len(), 1, "{route}");
        assert!(p.backup.requests().is_empty(), "{route}");
    }
}

#[tokio::test]
async fn no_retry_after_the_client_left() {
    // Nothing but the client's leaving ends the primary's call within 20 s.
    let p = pair(
        "retries = 2\nfallbacks = [\"backup\"]\nbudget = \"30s\"\nfirst_token_timeout = \"20s\"",
        "",
        "",
    )
    .await;
    p.primary.set_script(&[("x-fake-ttft-ms", "25000")]);
    let conn = Conn::open(p.gw.addr).await;
    let pending = tokio::spawn(async move {
        let _ = conn.send(chat_request(&[], true)).await;
    });
    assert!(
        p.primary
            .wait_for_requests(1, Duration::from_secs(10))
            .await
    );
    let left = Instant::now();
    pending.abort();
    let _ = pending.await;
    let closed = p
        .primary
        .wait_closed(p.primary.connections()[0].id, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(closed.saturating_duration_since(left) < PROMPTLY);
    // Once reported, nothing more is tried.
    p.wait_reported(1.0).await;
    assert_eq!(p.primary.requests().len(), 1);
    assert!(p.backup.requests().is_empty());
    p.wait_reported(1.0).await;
    assert_eq!(
        p.metric("hourglass_cancellations_total{origin=\"client\",route=\"chat\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn hedging_the_faster_upstream_wins_and_the_loser_is_cancelled() {
    // The primary would take 25 s and no limit cuts it before 20 s: only the hedge can
    // answer early, and the metrics below say it did.
    let p = pair(
        "fallbacks = [\"backup\"]\nhedge_after = \"300ms\"\nbudget = \"30s\"\nfirst_token_timeout = \"20s\"",
        "",
        "model = \"small-fast\"",
    )
    .await;
    p.primary
        .set_script(&[("x-fake-ttft-ms", "25000"), ("x-fake-headers-first", "1")]);
    p.backup.set_script(&[("x-fake-ttft-ms", "100")]);
    let start = Instant::now();
    let (resp, _c) = p.chat(&[("x-fake-chunks", "3")]).await;
    let won_at = Instant::now();
    // Not before the hedge was due and the backup answered.
    assert!(
        start.elapsed() >= Duration::from_millis(400) && start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    let read = read_body(resp.into_body()).await;
    // Only the winner's bytes: the backup answers as the rewritten model.
    assert!(
        read.text().contains("\"model\":\"small-fast\""),
        "{}",
        read.text()
    );
    assert!(!read.text().contains("gpt-test"));
    let loser = p.primary.connections()[0].id;
    let closed = p
        .primary
        .wait_closed(loser, Duration::from_secs(10))
        .await
        .unwrap();
    let delay = closed.saturating_duration_since(won_at);
    assert!(delay < PROMPTLY, "loser closed {delay:?} after the win");
    p.wait_reported(1.0).await;
    assert_eq!(
        p.metric("hourglass_hedges_total{route=\"chat\",winner=\"hedge\"}")
            .await,
        1.0
    );
    assert_eq!(
        p.metric("hourglass_hedges_total{route=\"chat\",winner=\"primary\"}")
            .await,
        0.0
    );
    assert_eq!(
        p.metric("hourglass_cancellations_total{origin=\"hedge_loser\",route=\"chat\"}")
            .await,
        1.0
    );
    assert_eq!(
        p.metric("hourglass_requests_total{outcome=\"ok\",route=\"chat\"}")
            .await,
        1.0
    );
    assert_eq!(
        p.metric("hourglass_time_to_first_token_seconds_count{route=\"chat\",upstream=\"backup\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn hedging_the_primary_can_win_too() {
    let p = pair(
        "fallbacks = [\"backup\"]\nhedge_after = \"200ms\"\nbudget = \"30s\"\nfirst_token_timeout = \"20s\"",
        "",
        "",
    )
    .await;
    p.primary.set_script(&[("x-fake-ttft-ms", "500")]);
    p.backup
        .set_script(&[("x-fake-ttft-ms", "25000"), ("x-fake-headers-first", "1")]);
    let (resp, _c) = p.chat(&[]).await;
    let won_at = Instant::now();
    read_body(resp.into_body()).await;
    assert_eq!(p.backup.requests().len(), 1, "the hedge was started");
    let closed = p
        .backup
        .wait_closed(p.backup.connections()[0].id, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(closed.saturating_duration_since(won_at) < PROMPTLY);
    p.wait_reported(1.0).await;
    assert_eq!(
        p.metric("hourglass_hedges_total{route=\"chat\",winner=\"primary\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn the_model_rewrite_reaches_the_fallback_and_nothing_else_changes() {
    let (_refusing, url) = closed_port();
    let p = pair_with(
        "fallbacks = [\"backup\"]",
        "",
        "model = \"gpt-small\"",
        Some(url),
    )
    .await;
    let (resp, _c) = p.chat(&[]).await;
    read_body(resp.into_body()).await;
    let sent = chat_request(&[], true);
    let original = {
        use http_body_util::BodyExt;
        sent.into_body().collect().await.unwrap().to_bytes()
    };
    let got = &p.backup.requests()[0].body;
    let expected = String::from_utf8(original.to_vec())
        .unwrap()
        .replace("\"model\":\"gpt-test\"", "\"model\":\"gpt-small\"");
    assert_eq!(std::str::from_utf8(got).unwrap(), expected);
}

/// A primary that answers a role-only preamble and then ends its stream cleanly: no token
/// came, and the answer was cut short. The head is held until the first token on a route
/// with a fallback, so the fallback answers instead, and the client sees one whole stream.
#[tokio::test]
async fn a_primary_that_stops_after_its_preamble_falls_back() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let served = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 65536];
        let mut seen = Vec::new();
        // The head and a content-length body: enough to know the request is whole.
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") || !seen.ends_with(b"}") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0);
            seen.extend_from_slice(&buf[..n]);
        }
        let preamble = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n";
        let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        out.extend(format!("{:x}\r\n", preamble.len()).as_bytes());
        out.extend(preamble);
        out.extend(b"\r\n0\r\n\r\n");
        s.write_all(&out).await.unwrap();
        let _ = s.read(&mut buf).await;
    });
    let p = pair_with("fallbacks = [\"backup\"]", "", "", Some(url)).await;
    let (resp, _c) = p
        .chat(&[("x-request-budget-ms", "5000"), ("x-fake-chunks", "3")])
        .await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(read.error.is_none(), "{}", read.text());
    assert!(read.text().ends_with("data: [DONE]\n\n"), "{}", read.text());
    assert_eq!(p.backup.requests().len(), 1);
    p.wait_reported(1.0).await;
    assert_eq!(
        p.metric("hourglass_fallbacks_total{from=\"primary\",route=\"chat\",to=\"backup\"}")
            .await,
        1.0
    );
    served.abort();
}

/// A primary whose connects hang (a full backlog), one retry and a healthy fallback: the
/// connect waits are cut so that the fallback keeps its turn, and the retry is made only if
/// it leaves that turn too. Before, the first connect took its whole 1 s limit, the retry
/// the rest, and the fallback never came.
#[tokio::test]
async fn a_hanging_connect_leaves_the_fallback_its_turn() {
    let (_held, addr) = hourglass_fake::never_accepting_listener().unwrap();
    let p = pair_with(
        "retries = 1\nfallbacks = [\"backup\"]\nconnect_timeout = \"1s\"",
        "",
        "",
        Some(format!("http://{addr}")),
    )
    .await;
    let (resp, _c) = p
        .chat(&[("x-request-budget-ms", "1500"), ("x-fake-chunks", "3")])
        .await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body()).await;
    assert!(read.text().ends_with("data: [DONE]\n\n"), "{}", read.text());
    assert_eq!(p.backup.requests().len(), 1);
    p.wait_reported(1.0).await;
    assert_eq!(
        p.metric("hourglass_fallbacks_total{from=\"primary\",route=\"chat\",to=\"backup\"}")
            .await,
        1.0
    );
}

/// The log line lists a hedged request's attempts in the order they started, the primary
/// first, whichever ended first (it was completion order: the winning hedge came first).
#[tokio::test]
async fn a_hedged_requests_log_lists_the_primary_first() {
    let primary = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let backup = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let text = config(
        &primary.url(),
        &backup.url(),
        "fallbacks = [\"backup\"]\nhedge_after = \"200ms\"\nbudget = \"30s\"\nfirst_token_timeout = \"20s\"",
        "",
        "",
    );
    primary.set_script(&[("x-fake-ttft-ms", "25000"), ("x-fake-headers-first", "1")]);
    backup.set_script(&[("x-fake-ttft-ms", "50")]);
    let p = Process::spawn(&text, &["--log-format", "json"], &[]).await;
    let (resp, _c) = Conn::open(p.addr)
        .await
        .send(chat_request(&[("x-fake-chunks", "2")], true))
        .await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    let fields = p.request_line().await;
    let attempts = fields["attempts"].as_str().unwrap_or_default();
    assert!(
        attempts.starts_with("primary:hedge_loser:") && attempts.contains(",backup:ok:"),
        "{attempts}"
    );
}

/// A client that leaves once the backup is called, the primary answering as `primary`
/// says and the backup holding its first token past the client's stay; `settings` go beside
/// the route's fallback. The gateway (logging JSON) and its request line.
async fn left_while_the_backup_is_called(
    settings: &str,
    primary: &[(&str, &str)],
) -> (Process, serde_json::Value) {
    let start = || FakeUpstream::start("127.0.0.1:0".parse().unwrap());
    let (up, backup) = (start().await.unwrap(), start().await.unwrap());
    let text = config(
        &up.url(),
        &backup.url(),
        &format!(
            "fallbacks = [\"backup\"]\n{settings}\nbudget = \"30s\"\nfirst_token_timeout = \"20s\""
        ),
        "",
        "",
    );
    up.set_script(primary);
    backup.set_script(&[("x-fake-ttft-ms", "25000")]);
    let p = Process::spawn(&text, &["--log-format", "json"], &[]).await;
    let conn = Conn::open(p.addr).await;
    let pending = tokio::spawn(conn.send(chat_request(&[], true)));
    assert!(backup.wait_for_requests(1, Duration::from_secs(10)).await);
    pending.abort();
    let _ = pending.await;
    let fields = p.request_line().await;
    (p, fields)
}

/// Attempts still running when the request ends (here the client leaves during a hedge race)
/// are noted too: the attempts histogram counts both, and the log line names the upstream and
/// both attempts with how the request ended. They were noted only as they ended, which
/// these never did: 0 attempts, no upstream.
#[tokio::test]
async fn attempts_running_when_the_client_leaves_are_logged() {
    let (p, fields) =
        left_while_the_backup_is_called("hedge_after = \"100ms\"", &[("x-fake-ttft-ms", "25000")])
            .await;
    assert_eq!(fields["code"], "client_closed", "{fields}");
    assert_eq!(fields["upstream"], "primary", "{fields}");
    let attempts = fields["attempts"].as_str().unwrap_or_default();
    assert!(
        attempts.starts_with("primary:client_closed:")
            && attempts.contains(",backup:client_closed:"),
        "{fields}"
    );
    assert_eq!(
        metric(p.admin, "hourglass_attempts_sum{route=\"chat\"}").await,
        2.0
    );
}

/// A request that ends while its fallback runs (the primary answered 503) is logged under the
/// fallback's upstream, the one it was waiting on, not the primary's.
#[tokio::test]
async fn a_request_ended_during_its_fallback_names_the_fallback() {
    let (_p, fields) = left_while_the_backup_is_called("", &[("x-fake-status", "503")]).await;
    assert_eq!(fields["upstream"], "backup", "{fields}");
    let attempts = fields["attempts"].as_str().unwrap_or_default();
    assert!(
        attempts.starts_with("primary:status_5xx:") && attempts.contains(",backup:client_closed:"),
        "{fields}"
    );
}

/// A request refused because the upstream's expected time to its first token does not fit
/// what is left says whose estimate it was, and for which model: otherwise a client whose model answered in
/// 100 ms last time cannot tell why 1.5 s was not enough.
#[tokio::test]
async fn a_budget_refused_for_the_upstreams_expected_first_token_names_it() {
    // A seed past the route's first-token limit is refused (audit ME 1): the limit is raised.
    let p = pair(
        "first_token_timeout = \"4s\"",
        "expected_first_token = \"3s\"",
        "",
    )
    .await;
    let (resp, _c) = p.chat(&[("x-request-budget-ms", "1500")]).await;
    assert_eq!(resp.status(), 504);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "insufficient_budget", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.ends_with(
            "at least 3000ms is needed to call the upstream: upstream \"primary\" is expected to take 3000ms to its first token for model \"gpt-test\""
        ),
        "{message}"
    );
    assert!(p.primary.requests().is_empty());
}

/// The SDK's patience (`x-stainless-timeout`, less a margin) bounds the whole wait for the
/// head, not each attempt's: a route that holds the head for a fallback (or retries) must
/// answer its error before the client gives up, and never start an attempt past that mark.
/// Before, each attempt got the whole patience (2.7 s for a 3 s client): two slow upstreams
/// answered 504 after 5.4 s, long after the client had timed out blind.
#[tokio::test]
async fn the_sdks_patience_bounds_the_wait_for_the_head_across_attempts() {
    let p = pair(
        "fallbacks = [\"backup\"]\nfirst_token_timeout = \"10s\"\nbudget = \"20s\"",
        "",
        "",
    )
    .await;
    p.primary.set_script(&[("x-fake-ttft-ms", "20000")]);
    p.backup.set_script(&[("x-fake-ttft-ms", "20000")]);
    let start = Instant::now();
    let (resp, _c) = p.chat(&[("x-stainless-timeout", "3.0")]).await;
    let took = start.elapsed();
    assert_eq!(resp.status(), 504);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "first_token_timeout", "{body}");
    // What is left of the client's patience ended the fallback's wait, a span neither
    // the client nor the config spells: the message says whose it was (audit CE).
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("first token timeout: upstream \"backup\" sent no token within ")
            && message.contains("ms: the client's SDK stops waiting then"),
        "{message}"
    );
    // By the 2.7 s mark (3 s less its margin), and so before the client's 3 s.
    assert!(took < Duration::from_secs(3), "{took:?}");
    // The fallback was given its turn inside the mark, not after it.
    let backup = p.backup.requests();
    assert_eq!(backup.len(), 1);
    assert!(backup[0].at - start < Duration::from_millis(2700));
}

/// A hedge that neither attempt wins is counted (`winner="none"`), and the later failure is
/// what the client gets: the request was missing from `hourglass_hedges_total`, and the
/// hedge's answer was passed on even when the primary's came after it (audit O).
#[tokio::test]
async fn a_hedge_both_attempts_lose_is_counted_and_answered_by_the_later_failure() {
    let p = pair(
        "fallbacks = [\"backup\"]\nhedge_after = \"200ms\"\nbudget = \"30s\"\nfirst_token_timeout = \"20s\"",
        "",
        "",
    )
    .await;
    p.primary
        .set_script(&[("x-fake-status", "502"), ("x-fake-ttft-ms", "600")]);
    p.backup.set_script(&[("x-fake-status", "500")]);
    let (resp, _c) = p.chat(&[]).await;
    assert_eq!(resp.status(), 502);
    json_body(resp).await;
    assert_eq!(p.backup.requests().len(), 1, "the hedge was started");
    p.wait_reported(1.0).await;
    for (winner, n) in [("none", 1.0), ("primary", 0.0), ("hedge", 0.0)] {
        let sample = format!("hourglass_hedges_total{{route=\"chat\",winner=\"{winner}\"}}");
        assert_eq!(p.metric(&sample).await, n, "{sample}");
    }
}

/// A head held for the first token counts as the upstream's answer whatever ends the attempt
/// after it: two 200 heads with no token after them were missing from
/// `hourglass_upstream_responses_total`, which counted only the attempts that won (audit L1).
#[tokio::test]
async fn a_held_head_that_never_got_its_token_is_counted() {
    let p = pair(
        "fallbacks = [\"backup\"]\nfirst_token_timeout = \"300ms\"",
        "",
        "",
    )
    .await;
    for up in [&p.primary, &p.backup] {
        up.set_script(&[("x-fake-headers-first", "1"), ("x-fake-ttft-ms", "20000")]);
    }
    let (resp, _c) = p.chat(&[]).await;
    assert_eq!(resp.status(), 504);
    json_body(resp).await;
    p.wait_reported(1.0).await;
    for up in ["primary", "backup"] {
        let sample = format!(
            "hourglass_upstream_responses_total{{class=\"2xx\",route=\"chat\",upstream=\"{up}\"}}"
        );
        assert_eq!(p.metric(&sample).await, 1.0, "{sample}");
    }
}

/// A hedged request whose client left after both attempts started is counted too, with no
/// winner: it was missing from `hourglass_hedges_total`, whose sum is the hedged requests
/// (audit L4).
#[tokio::test]
async fn a_hedge_the_client_left_is_counted_without_a_winner() {
    let p = pair(
        "fallbacks = [\"backup\"]\nhedge_after = \"200ms\"\nbudget = \"30s\"\nfirst_token_timeout = \"20s\"",
        "",
        "",
    )
    .await;
    for up in [&p.primary, &p.backup] {
        up.set_script(&[("x-fake-ttft-ms", "25000"), ("x-fake-headers-first", "1")]);
    }
    let conn = Conn::open(p.gw.addr).await;
    let pending = tokio::spawn(conn.send(chat_request(&[], true)));
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.backup.requests().is_empty() {
        assert!(Instant::now() < deadline, "the hedge was started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pending.abort();
    p.wait_reported(1.0).await;
    for (winner, n) in [("none", 1.0), ("primary", 0.0), ("hedge", 0.0)] {
        let sample = format!("hourglass_hedges_total{{route=\"chat\",winner=\"{winner}\"}}");
        assert_eq!(p.metric(&sample).await, n, "{sample}");
    }
}

/// Audit PC 2: every request without a JSON `model` (GETs, multipart uploads and
/// transcriptions, batch creates) shared one learned first-token estimate per upstream: one
/// slow transcription made `/v1/models` and `/v1/files/{id}` (answered at once) fail fast with
/// 504 `insufficient_budget` for the next half-life. Calls that name no model have nothing in
/// common to learn from: they neither teach nor read a learned estimate, only the upstream's
/// seed (`expected_first_token`, here none), which `/upstreams` shows as `other`.
#[tokio::test]
async fn a_slow_call_naming_no_model_refuses_no_other() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let req = read_request(&mut s).await;
                if req.contains("transcriptions") {
                    tokio::time::sleep(Duration::from_millis(600)).await;
                }
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                          content-length: 2\r\nconnection: close\r\n\r\n{}",
                    )
                    .await;
            });
        }
    });
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[upstreams.openai]
url = "http://{up}"
auth = "none"

[[routes]]
name = "audio"
path_prefix = "/v1/audio"
upstream = "openai"

[[routes]]
name = "rest"
path_prefix = "/v1"
upstream = "openai"
"#
    );
    let h = Harness::with_config(&config).await;
    let upload = "--b\r\ncontent-disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nabc\r\n--b--\r\n";
    for _ in 0..2 {
        let req = http::Request::post("/v1/audio/transcriptions")
            .header("host", "gateway")
            .header("content-type", "multipart/form-data; boundary=b")
            .body(http_body_util::Full::new(bytes::Bytes::from(upload)))
            .unwrap();
        let (resp, _c) = h.send(req).await;
        assert_eq!(resp.status(), 200);
        read_body(resp.into_body()).await;
    }
    // 400 ms: less than the transcriptions took, far more than these take.
    for path in ["/v1/models", "/v1/files/file-abc", "/v1/batches/batch_1"] {
        let req = http::Request::get(path)
            .header("host", "gateway")
            .header("x-request-budget-ms", "400")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let (resp, _c) = h.send(req).await;
        assert_eq!(
            resp.status(),
            200,
            "{path}: {}",
            read_body(resp.into_body()).await.text()
        );
    }
    let text = admin_get(h.gw.admin_addr, "/upstreams").await;
    let view: serde_json::Value = serde_json::from_str(&text).unwrap();
    let estimates = &view["upstreams"][0]["expected_first_token_ms"];
    assert_eq!(estimates["other"], 0, "{estimates}");
}
