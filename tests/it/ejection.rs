//! Passive health: an upstream whose attempts keep failing is passed over for the next one of
//! a route's chain, so that requests stop spending their budgets on it, and a probe puts it
//! back once it answers again. Two fake providers behind one route; the primary's failures
//! are scripted on the fake itself, so the backup answers the same requests normally.

use std::time::Duration;

use crate::support::*;
use hourglass_fake::FakeUpstream;

fn config(
    primary: &FakeUpstream,
    backup: &FakeUpstream,
    primary_extra: &str,
    route: &str,
) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
budget = "5s"
first_token_timeout = "2s"

[upstreams.primary]
url = "{}"
auth = "none"
{primary_extra}

[upstreams.backup]
url = "{}"
auth = "none"
eject_after = 1

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "primary"
{route}
"#,
        primary.url(),
        backup.url()
    )
}

async fn fakes() -> (FakeUpstream, FakeUpstream) {
    let start = || FakeUpstream::start("127.0.0.1:0".parse().unwrap());
    (start().await.unwrap(), start().await.unwrap())
}

async fn chat(p: &Process) -> u16 {
    let (resp, _c) = Conn::open(p.addr)
        .await
        .send(chat_request(&[("x-fake-chunks", "2")], true))
        .await;
    let status = resp.status().as_u16();
    let read = read_body(resp.into_body()).await;
    if status == 200 {
        assert!(read.text().ends_with("data: [DONE]\n\n"), "{}", read.text());
    }
    status
}

#[tokio::test]
async fn a_failing_upstream_is_ejected_and_passed_over_for_the_fallback() {
    let (primary, backup) = fakes().await;
    primary.set_script(&[("x-fake-status", "503")]);
    let text = config(
        &primary,
        &backup,
        "eject_after = 3\neject_for = \"10m\"",
        "fallbacks = [\"backup\"]",
    );
    let p = Process::spawn(&text, &["--log-format", "json"], &[]).await;
    let series = |name: &str| format!("{name}{{upstream=\"primary\"}}");
    assert_eq!(
        metric(p.admin, &series("hourglass_upstream_ejected")).await,
        0.0
    );
    // Each of the first three fails on the primary and is served by the backup.
    for _ in 0..3 {
        assert_eq!(chat(&p).await, 200);
    }
    assert_eq!(primary.requests().len(), 3);
    assert_eq!(
        metric(p.admin, &series("hourglass_upstream_ejected")).await,
        1.0
    );
    assert_eq!(
        metric(p.admin, &series("hourglass_upstream_ejections_total")).await,
        1.0
    );
    // Out of rotation: the next ones go straight to the backup.
    for _ in 0..2 {
        assert_eq!(chat(&p).await, 200);
    }
    assert_eq!(primary.requests().len(), 3, "the primary was tried again");
    assert_eq!(backup.requests().len(), 5);
    assert_eq!(
        metric(
            p.admin,
            "hourglass_upstream_skipped_total{route=\"chat\",upstream=\"primary\"}"
        )
        .await,
        2.0
    );
    // No move from the primary is counted for requests that never tried it.
    assert_eq!(
        metric(
            p.admin,
            "hourglass_fallbacks_total{from=\"primary\",route=\"chat\",to=\"backup\"}"
        )
        .await,
        3.0
    );
    // The admin listener says why, and for how long.
    let view: serde_json::Value =
        serde_json::from_str(&admin_get(p.admin, "/upstreams").await).unwrap();
    let up = |name: &str| {
        view["upstreams"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {view}"))
            .clone()
    };
    let primary_view = up("primary");
    assert_eq!(primary_view["in_rotation"], false, "{view}");
    assert_eq!(primary_view["failures_in_a_row"], 3, "{view}");
    // Why it is out, in the words of the log's `attempts`: an outage and a rate limit look
    // alike without it (audit SC 5).
    assert_eq!(primary_view["last_failure"], "status_5xx", "{view}");
    assert_eq!(primary_view["eject_after"], 3, "{view}");
    assert_eq!(
        primary_view["routes"],
        serde_json::json!(["chat"]),
        "{view}"
    );
    let left = primary_view["ejected_for_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 600_000, "{view}");
    let backup_view = up("backup");
    assert_eq!(backup_view["in_rotation"], true, "{view}");
    assert!(backup_view["last_failure"].is_null(), "{view}");
    // Audit GC6: never ejected is null, not 0 (which says a probe may go); the url as
    // configured, with no `/` added.
    assert!(backup_view["ejected_for_ms"].is_null(), "{view}");
    assert_eq!(backup_view["url"], backup.url(), "{view}");
    assert_eq!(backup_view["in_flight"], 0, "{view}");
    // The backup answered gpt-test five times: it has an estimate of its own.
    assert!(
        backup_view["expected_first_token_ms"]["models"]["gpt-test"].is_u64(),
        "{view}"
    );
    let warned = p
        .json_lines(1, |v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("upstream out of rotation"))
        })
        .await;
    assert_eq!(warned.len(), 1, "the ejection was logged");
    assert_eq!(warned[0]["reason"], "status_5xx", "{}", warned[0]);
    let lines = p.request_lines(5).await;
    assert_eq!(lines.len(), 5);
    assert!(
        lines[..3].iter().all(|l| l.get("passed_over").is_none()),
        "{lines:?}"
    );
    for l in &lines[3..] {
        assert_eq!(l["passed_over"], "primary", "{l}");
        assert_eq!(l["upstream"], "backup", "{l}");
        assert_eq!(l["outcome"], "ok", "{l}");
    }
}

/// Ejection only reorders a chain: with no other upstream in rotation, the ejected one is
/// still tried, as it would be without ejection, and its own answer passes through.
#[tokio::test]
async fn an_ejected_upstream_is_still_tried_when_nothing_else_is_in_rotation() {
    let (primary, backup) = fakes().await;
    primary.set_script(&[("x-fake-status", "503")]);
    backup.set_script(&[("x-fake-status", "503")]);
    let text = config(
        &primary,
        &backup,
        "eject_after = 1\neject_for = \"10m\"",
        "fallbacks = [\"backup\"]",
    );
    let p = Process::spawn(&text, &[], &[]).await;
    for _ in 0..3 {
        assert_eq!(chat(&p).await, 503);
    }
    assert_eq!(primary.requests().len(), 3);
    assert_eq!(backup.requests().len(), 3);
    assert_eq!(
        metric(p.admin, "hourglass_upstream_ejected{upstream=\"backup\"}").await,
        1.0
    );
    assert_eq!(
        metric(
            p.admin,
            "hourglass_upstream_skipped_total{route=\"chat\",upstream=\"primary\"}"
        )
        .await,
        0.0
    );
}

/// An attempt begun before the ejection that answers during it does not end the ejection:
/// under load some attempt in flight always answered, and the upstream came back within
/// 200 ms of each "out of rotation for 2000ms" (audit GD F1).
#[tokio::test]
async fn an_answer_begun_before_the_ejection_does_not_end_it() {
    let (primary, backup) = fakes().await;
    primary.set_script(&[("x-fake-ttft-ms", "1000")]);
    let text = config(
        &primary,
        &backup,
        "eject_after = 1\neject_for = \"10m\"",
        "fallbacks = [\"backup\"]",
    );
    let p = Process::spawn(&text, &[], &[]).await;
    let slow = tokio::spawn({
        let addr = p.addr;
        async move {
            let (resp, _c) = Conn::open(addr)
                .await
                .send(chat_request(&[("x-fake-chunks", "2")], true))
                .await;
            let status = resp.status().as_u16();
            read_body(resp.into_body()).await;
            status
        }
    });
    assert!(primary.wait_for_requests(1, Duration::from_secs(5)).await);
    primary.set_script(&[("x-fake-status", "503")]);
    assert_eq!(chat(&p).await, 200);
    let ejected = || metric(p.admin, "hourglass_upstream_ejected{upstream=\"primary\"}");
    assert_eq!(ejected().await, 1.0);
    assert_eq!(
        slow.await.unwrap(),
        200,
        "the slow one was served by the primary"
    );
    assert_eq!(backup.requests().len(), 1);
    assert_eq!(ejected().await, 1.0, "the slow answer ended the ejection");
    primary.set_script(&[]);
    assert_eq!(chat(&p).await, 200);
    assert_eq!(primary.requests().len(), 2, "the primary was tried again");
}

/// Once its ejection is over, the next request probes the upstream; an answer puts it back
/// in rotation.
#[tokio::test]
async fn a_probe_that_succeeds_puts_the_upstream_back() {
    let (primary, backup) = fakes().await;
    primary.set_script(&[("x-fake-status", "500")]);
    let text = config(
        &primary,
        &backup,
        "eject_after = 1\neject_for = \"300ms\"",
        "fallbacks = [\"backup\"]",
    );
    let p = Process::spawn(&text, &[], &[]).await;
    assert_eq!(chat(&p).await, 200);
    assert_eq!(
        metric(p.admin, "hourglass_upstream_ejected{upstream=\"primary\"}").await,
        1.0
    );
    primary.set_script(&[]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(chat(&p).await, 200);
    assert_eq!(primary.requests().len(), 2);
    assert_eq!(backup.requests().len(), 1);
    assert_eq!(
        metric(p.admin, "hourglass_upstream_ejected{upstream=\"primary\"}").await,
        0.0
    );
    assert_eq!(
        metric(
            p.admin,
            "hourglass_upstream_ejections_total{upstream=\"primary\"}"
        )
        .await,
        1.0
    );
}

/// Answers that are the client's fault (4xx other than 429) say the upstream is up: they
/// never eject it.
#[tokio::test]
async fn client_errors_do_not_eject() {
    let (primary, backup) = fakes().await;
    primary.set_script(&[("x-fake-status", "400")]);
    let text = config(
        &primary,
        &backup,
        "eject_after = 1",
        "fallbacks = [\"backup\"]",
    );
    let p = Process::spawn(&text, &[], &[]).await;
    for _ in 0..3 {
        assert_eq!(chat(&p).await, 400);
    }
    assert_eq!(primary.requests().len(), 3);
    assert_eq!(backup.requests().len(), 0);
    assert_eq!(
        metric(p.admin, "hourglass_upstream_ejected{upstream=\"primary\"}").await,
        0.0
    );
}

/// A probe whose client leaves says nothing of the upstream: its turn goes to the next
/// request at once. It was held for another whole `eject_for`, and every request meanwhile
/// passed over an upstream that nobody was probing.
#[tokio::test]
async fn a_probe_whose_client_leaves_hands_its_turn_on() {
    let (primary, backup) = fakes().await;
    primary.set_script(&[("x-fake-status", "503")]);
    let text = config(
        &primary,
        &backup,
        "eject_after = 1\neject_for = \"1s\"",
        "fallbacks = [\"backup\"]",
    );
    let p = Process::spawn(&text, &[], &[]).await;
    assert_eq!(chat(&p).await, 200);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // The probe hangs before its first token, and its client gives up.
    primary.set_script(&[("x-fake-ttft-ms", "30000")]);
    let conn = Conn::open(p.addr).await;
    let pending = tokio::spawn(conn.send(chat_request(&[], true)));
    assert!(primary.wait_for_requests(2, Duration::from_secs(5)).await);
    pending.abort();
    let _ = pending.await;
    let probe_conn = primary.requests()[1].conn_id;
    assert!(primary
        .wait_closed(probe_conn, Duration::from_secs(5))
        .await
        .is_some());
    // The next request is the probe, well within the second the turn used to be held.
    primary.set_script(&[]);
    assert_eq!(chat(&p).await, 200);
    assert_eq!(
        primary.requests().len(),
        3,
        "the next request passed over the primary"
    );
    assert_eq!(
        metric(p.admin, "hourglass_upstream_ejected{upstream=\"primary\"}").await,
        0.0
    );
}

/// A probe holds its turn for as long as it may wait for its first token, even past
/// `eject_for`: the requests meanwhile go to the fallback, not to the upstream as more probes.
#[tokio::test]
async fn a_slow_probe_is_the_only_one() {
    let (primary, backup) = fakes().await;
    primary.set_script(&[("x-fake-ttft-ms", "30000")]);
    let text = config(
        &primary,
        &backup,
        "eject_after = 1\neject_for = \"200ms\"",
        "fallbacks = [\"backup\"]\nfirst_token_timeout = \"1s\"",
    );
    let p = Process::spawn(&text, &[], &[]).await;
    assert_eq!(chat(&p).await, 200);
    assert_eq!(
        metric(p.admin, "hourglass_upstream_ejected{upstream=\"primary\"}").await,
        1.0
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let probe = tokio::spawn({
        let addr = p.addr;
        async move {
            let (resp, _c) = Conn::open(addr)
                .await
                .send(chat_request(&[("x-fake-chunks", "2")], true))
                .await;
            resp.status().as_u16()
        }
    });
    assert!(primary.wait_for_requests(2, Duration::from_secs(5)).await);
    // Past `eject_for`, and the probe still waits for its first token.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let upstreams = admin_get(p.admin, "/upstreams").await;
    assert!(upstreams.contains("\"probing\":true"), "{upstreams}");
    assert_eq!(chat(&p).await, 200);
    assert_eq!(
        primary.requests().len(),
        2,
        "a second probe beside the first"
    );
    assert_eq!(
        probe.await.unwrap(),
        200,
        "the probe failed over to the backup"
    );
    assert_eq!(primary.requests().len(), 2);
    assert_eq!(backup.requests().len(), 3);
}

/// A hedged route does not hedge its primary's probe: the probe would lose to the hedge
/// whenever the primary is slower than `hedge_after`, say nothing, and the primary would
/// never come back, though it answered every time.
#[tokio::test]
async fn a_hedged_route_lets_its_primarys_probe_finish() {
    let (primary, backup) = fakes().await;
    primary.set_script(&[("x-fake-status", "503")]);
    let text = config(
        &primary,
        &backup,
        "eject_after = 1\neject_for = \"300ms\"",
        "fallbacks = [\"backup\"]\nhedge_after = \"100ms\"",
    );
    let p = Process::spawn(&text, &[], &[]).await;
    assert_eq!(chat(&p).await, 200);
    assert_eq!(backup.requests().len(), 1);
    // Healthy again, but slower than hedge_after.
    primary.set_script(&[("x-fake-ttft-ms", "500")]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(chat(&p).await, 200);
    assert_eq!(primary.requests().len(), 2);
    assert_eq!(backup.requests().len(), 1, "the probe was hedged");
    assert_eq!(
        metric(p.admin, "hourglass_upstream_ejected{upstream=\"primary\"}").await,
        0.0
    );
}

/// Across reloads: an upstream whose own settings did not change keeps its state even when
/// the connector is rebuilt (a route's `connect_timeout` changed); one whose settings changed
/// starts over, and an attempt still running on the upstream it replaced no longer writes the
/// gauge of the name.
#[tokio::test]
async fn reloads_keep_or_reset_the_state_and_the_gauge_follows_the_serving_upstream() {
    use hourglass::config::Config;
    let (primary, backup) = fakes().await;
    primary.set_script(&[("x-fake-status", "503")]);
    let dir = tempfile::Builder::new()
        .prefix("hourglass-ejection-")
        .tempdir()
        .unwrap();
    let path = dir.path().join("hourglass.toml");
    let write = |eject_for: &str, connect: &str| {
        let text = config(
            &primary,
            &backup,
            &format!("eject_after = 1\neject_for = \"{eject_for}\""),
            &format!("fallbacks = [\"backup\"]\nconnect_timeout = \"{connect}\""),
        );
        std::fs::write(&path, text).unwrap();
    };
    write("10m", "2s");
    let gw = hourglass::server::start_with_source(Config::load(&path).unwrap(), Some(path.clone()))
        .await
        .unwrap();
    let send = || async {
        let (resp, _c) = Conn::open(gw.addr)
            .await
            .send(chat_request(&[], true))
            .await;
        let status = resp.status().as_u16();
        read_body(resp.into_body()).await;
        status
    };
    let ejected = || {
        metric(
            gw.admin_addr,
            "hourglass_upstream_ejected{upstream=\"primary\"}",
        )
    };
    assert_eq!(send().await, 200);
    assert_eq!(ejected().await, 1.0);

    // Another connect bound rebuilds the connector; the upstream stays out of rotation.
    write("10m", "3s");
    gw.reload().await.unwrap();
    assert_eq!(ejected().await, 1.0);
    assert_eq!(send().await, 200);
    assert_eq!(
        primary.requests().len(),
        1,
        "the reload forgot the ejection"
    );

    // An attempt in flight on the upstream a reload replaces ejects that one, not the name.
    write("20m", "3s");
    gw.reload().await.unwrap();
    assert_eq!(ejected().await, 0.0);
    primary.set_script(&[("x-fake-status", "503"), ("x-fake-ttft-ms", "500")]);
    let in_flight = tokio::spawn({
        let addr = gw.addr;
        async move {
            let (resp, _c) = Conn::open(addr).await.send(chat_request(&[], true)).await;
            read_body(resp.into_body()).await;
        }
    });
    assert!(primary.wait_for_requests(2, Duration::from_secs(5)).await);
    write("30m", "3s");
    gw.reload().await.unwrap();
    in_flight.await.unwrap();
    assert_eq!(
        ejected().await,
        0.0,
        "a replaced upstream set the serving one's gauge"
    );
    assert_eq!(
        metric(
            gw.admin_addr,
            "hourglass_upstream_ejections_total{upstream=\"primary\"}"
        )
        .await,
        1.0
    );
}

/// A hedged route whose next upstream is out of rotation races the one after it, rather
/// than not hedging at all.
#[tokio::test]
async fn a_hedge_goes_to_the_next_upstream_in_rotation() {
    let start = || FakeUpstream::start("127.0.0.1:0".parse().unwrap());
    let (p, f1, f2) = (
        start().await.unwrap(),
        start().await.unwrap(),
        start().await.unwrap(),
    );
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
budget = "5s"
first_token_timeout = "2s"

[upstreams.p]
url = "{}"
auth = "none"

[upstreams.f1]
url = "{}"
auth = "none"
eject_after = 1
eject_for = "10m"

[upstreams.f2]
url = "{}"
auth = "none"

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "p"
fallbacks = ["f1", "f2"]
hedge_after = "100ms"
"#,
        p.url(),
        f1.url(),
        f2.url()
    );
    let p_proc = Process::spawn(&text, &[], &[]).await;
    // p and f1 fail: f2 answers, and f1 is out of rotation.
    p.set_script(&[("x-fake-status", "503")]);
    f1.set_script(&[("x-fake-status", "503")]);
    assert_eq!(chat(&p_proc).await, 200);
    assert_eq!(
        metric(p_proc.admin, "hourglass_upstream_ejected{upstream=\"f1\"}").await,
        1.0
    );
    // p answers again, but slower than hedge_after: the hedge races f2, and f2 wins.
    p.set_script(&[("x-fake-ttft-ms", "1000")]);
    assert_eq!(chat(&p_proc).await, 200);
    assert_eq!(f1.requests().len(), 1);
    assert_eq!(f2.requests().len(), 2, "no hedge was raced");
    assert_eq!(
        metric(
            p_proc.admin,
            "hourglass_hedges_total{route=\"chat\",winner=\"hedge\"}"
        )
        .await,
        1.0
    );
}

/// A primary and a backup it hedges to after 100 ms, the backup ejected (by one 503 of
/// each; the primary has five failures to go) and due for its probe: `eject_for` is 300 ms,
/// and 400 have passed. `settings` go beside `eject_for`. The first-token limit is 4 s.
async fn backup_due_for_a_probe(settings: &str) -> (FakeUpstream, FakeUpstream, Process) {
    let (primary, backup) = fakes().await;
    let text = config(
        &primary,
        &backup,
        "",
        "fallbacks = [\"backup\"]\nhedge_after = \"100ms\"",
    )
    // Room for a backup seeded with 3 s: a seed at or past the route's first-token limit is
    // refused (audit ME 1).
    .replace(
        "first_token_timeout = \"2s\"",
        "first_token_timeout = \"4s\"",
    )
    .replace(
        "eject_after = 1\n",
        &format!("eject_after = 1\neject_for = \"300ms\"\n{settings}"),
    );
    let p = Process::spawn(&text, &[], &[]).await;
    primary.set_script(&[("x-fake-status", "503")]);
    backup.set_script(&[("x-fake-status", "503")]);
    assert_eq!(chat(&p).await, 503);
    assert_eq!(
        metric(p.admin, "hourglass_upstream_ejected{upstream=\"backup\"}").await,
        1.0
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    (primary, backup, p)
}

/// A hedge to an upstream out of rotation is its probe: two requests that both judged it
/// due for one when they began do not both probe it when their hedges fire. The second
/// waits on its own primary.
#[tokio::test]
async fn two_hedges_do_not_both_probe_an_ejected_fallback() {
    let (primary, backup, p) = backup_due_for_a_probe("").await;
    // Both healthy, the primary slower than hedge_after and the backup slower still: the
    // first hedge to fire probes the backup, and its probe is in flight when the second fires.
    primary.set_script(&[("x-fake-ttft-ms", "600")]);
    backup.set_script(&[("x-fake-ttft-ms", "2000")]);
    let (a, b) = tokio::join!(chat(&p), chat(&p));
    assert_eq!((a, b), (200, 200));
    assert_eq!(primary.requests().len(), 3);
    assert_eq!(backup.requests().len(), 2, "both hedges probed the backup");
}

/// A hedge that is not sent (the budget no longer fits the fallback's first token) does not
/// take the ejected fallback's probe turn: the next request's hedge probes it.
#[tokio::test]
async fn a_hedge_that_does_not_fit_leaves_the_probe_to_the_next() {
    let (primary, backup, p) = backup_due_for_a_probe("expected_first_token = \"3s\"\n").await;
    primary.set_script(&[("x-fake-ttft-ms", "1500")]);
    backup.set_script(&[]);
    // Its hedge would need the backup's 3 s, and 3 s is all the budget there is.
    let short = tokio::spawn({
        let addr = p.addr;
        async move {
            let (resp, _c) = Conn::open(addr)
                .await
                .send(chat_request(
                    &[("x-fake-chunks", "2"), ("x-request-budget-ms", "3000")],
                    true,
                ))
                .await;
            resp.status().as_u16()
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(chat(&p).await, 200);
    assert_eq!(short.await.unwrap(), 200);
    assert_eq!(
        backup.requests().len(),
        2,
        "the second request's hedge did not probe the backup"
    );
    assert_eq!(
        metric(p.admin, "hourglass_upstream_ejected{upstream=\"backup\"}").await,
        0.0
    );
}

/// A first-token limit that the client's own timeout cut short (`x-stainless-read-timeout`)
/// says nothing of the upstream, as one cut for a fallback's room says nothing: any client
/// could otherwise eject an upstream that answers in time for everyone else.
#[tokio::test]
async fn a_wait_the_clients_timeout_cut_short_does_not_eject() {
    let (primary, backup) = fakes().await;
    primary.set_script(&[("x-fake-ttft-ms", "800")]);
    let text = config(&primary, &backup, "eject_after = 1", "");
    let p = Process::spawn(&text, &[], &[]).await;
    let (resp, _c) = Conn::open(p.addr)
        .await
        .send(chat_request(&[("x-stainless-read-timeout", "0.5")], true))
        .await;
    assert_eq!(resp.status(), 504);
    let e = json_body(resp).await;
    assert_eq!(e["error"]["code"], "first_token_timeout");
    let said = "within 450ms: the client's SDK stops waiting then";
    assert!(
        e["error"]["message"].as_str().unwrap().contains(said),
        "{e}"
    );
    assert_eq!(
        metric(p.admin, "hourglass_upstream_ejected{upstream=\"primary\"}").await,
        0.0
    );
    assert_eq!(chat(&p).await, 200, "in time for a client that waits");
}

/// Sets the soft open-file limit of process `pid` (util-linux `prlimit`): the gateway's alone,
/// never the shared test process's.
fn set_nofile(pid: u32, soft: &str) {
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={soft}:")])
        .status()
        .expect("prlimit (util-linux) runs");
    assert!(status.success(), "prlimit --nofile={soft}: {status}");
}

fn nofile(pid: u32) -> String {
    let out = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &pid.to_string(),
            "--nofile",
            "--raw",
            "--noheadings",
        ])
        .args(["--output", "SOFT"])
        .output()
        .expect("prlimit (util-linux) runs");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Audit CC3: the gateway out of descriptors cannot open an upstream connection. That says
/// nothing of the upstream: the client gets a 503 `overloaded` naming the gateway, with
/// Retry-After, no fallback is tried (its connect would need a descriptor too), and neither
/// upstream counts a failure, though one would eject either.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_gateway_out_of_descriptors_blames_no_upstream() {
    out_of_descriptors(false, "Too many open files").await;
    // Given by a host name (as every real provider is), the lookup fails first, in words
    // that say no more than for a name that does not exist (audit CF).
    out_of_descriptors(true, "the name lookup could open neither").await;
}

async fn out_of_descriptors(by_name: bool, said: &str) {
    let (primary, backup) = fakes().await;
    let mut text = config(
        &primary,
        &backup,
        "eject_after = 1",
        "fallbacks = [\"backup\"]",
    );
    if by_name {
        text = text.replace("http://127.0.0.1:", "http://localhost:");
        assert!(text.contains("localhost"), "{text}");
    }
    let p = Process::spawn(&text, &["--log-format", "json"], &[]).await;
    // A connection accepted while descriptors were left, and known to be served.
    let get = |path: &str| {
        http::Request::get(path)
            .header("host", "gateway")
            .body(http_body_util::Full::default())
            .unwrap()
    };
    let (resp, conn) = Conn::open(p.addr).await.send(get("/nowhere")).await;
    assert_eq!(resp.status(), 404);
    read_body(resp.into_body()).await;
    let limit = nofile(p.pid());
    // No descriptor can be opened: the next socket fails with EMFILE.
    set_nofile(p.pid(), "0");
    let (resp, conn) = conn.send(chat_request(&[], true)).await;
    let status = resp.status();
    let retry_after = resp.headers().get("retry-after").cloned();
    let body = json_body(resp).await;
    set_nofile(p.pid(), &limit);
    assert_eq!(status, 503, "{body}");
    assert_eq!(retry_after.as_ref().map(|v| v.to_str().unwrap()), Some("1"));
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    assert_message_starts(&body["error"], "the gateway has no file descriptor left");
    assert!(
        body["error"]["message"].as_str().unwrap().contains(said),
        "{body}"
    );
    let lines = p.request_lines(2).await;
    let line = &lines[1];
    let fields = line.get("fields").unwrap_or(line);
    assert_eq!(fields["origin"], "overloaded", "{line}");
    assert_eq!(fields["code"], "overloaded", "{line}");
    // One attempt: neither a retry nor the fallback was tried.
    assert!(fields.get("attempts").is_none(), "{line}");
    for upstream in ["primary", "backup"] {
        let series = format!("hourglass_upstream_ejected{{upstream=\"{upstream}\"}}");
        assert_eq!(metric(p.admin, &series).await, 0.0, "{upstream}");
    }
    assert_eq!(primary.requests().len(), 0);
    assert_eq!(backup.requests().len(), 0);
    // Descriptors back, the primary answers as before.
    drop(conn);
    let (resp, _conn) = Conn::open(p.addr).await.send(chat_request(&[], true)).await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    assert_eq!(primary.requests().len(), 1);
}

/// Audit RA 2: an attempt whose connection could not be made is counted for its upstream, by
/// why: a name that does not resolve, a refused port, a TLS handshake that failed. Before,
/// such a failure showed only in the route's `outcome="error"` until the upstream was ejected.
#[tokio::test]
async fn failed_connects_are_counted_per_upstream_by_kind() {
    let (_refusing, refused) = refused_addr();
    // A plain HTTP server spoken to over TLS: the handshake fails.
    let plain = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
budget = "10s"
first_token_timeout = "2s"
connect_timeout = "2s"

[upstreams.nx]
url = "http://no-such-host.invalid:{port}"
auth = "none"
eject_after = 0

[upstreams.refused]
url = "http://{refused}"
auth = "none"
eject_after = 0

[upstreams.plain]
url = "https://{plain}"
auth = "none"
eject_after = 0

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "nx"
fallbacks = ["refused", "plain"]
"#,
        port = refused.port(),
        plain = plain.addr(),
    );
    let config = hourglass::config::Config::from_toml(&text, "test.toml").unwrap();
    let gw = hourglass::server::start(config).await.unwrap();
    let sample = |upstream: &str, reason: &str| {
        format!("hourglass_upstream_connect_errors_total{{reason=\"{reason}\",upstream=\"{upstream}\"}}")
    };
    const REASONS: [&str; 5] = ["dns", "refused", "timeout", "tls", "other"];
    // Every upstream's series exist at zero before any attempt.
    for upstream in ["nx", "refused", "plain"] {
        for reason in REASONS {
            assert_eq!(metric(gw.admin_addr, &sample(upstream, reason)).await, 0.0);
        }
    }
    let (resp, _c) = Conn::open(gw.addr)
        .await
        .send(chat_request(&[], true))
        .await;
    assert_eq!(resp.status(), 502);
    let v = json_body(resp).await;
    assert_eq!(v["error"]["code"], "upstream_unavailable", "{v}");
    for (upstream, want) in [("nx", "dns"), ("refused", "refused"), ("plain", "tls")] {
        for reason in REASONS {
            assert_eq!(
                metric(gw.admin_addr, &sample(upstream, reason)).await,
                if reason == want { 1.0 } else { 0.0 },
                "{upstream} {reason}"
            );
        }
    }
}
