//! A run's time against a Redis far away: the trip to the store and back is no time the run
//! gains (audit KD 1: with 150 ms each way, a 3 s run was cut at 3.30 s, and a call was
//! admitted and sent upstream after its run's deadline had passed).

use std::time::Duration;

use tokio::time::Instant;

use super::{call, config, redis_and_fake, send};
use crate::support::redis::delaying_proxy;
use crate::support::Process;

/// Each way to the store and back: longer than anything else a call of these tests spends,
/// so that a run's deadline late by it shows past any slack a loaded machine needs.
const LEG: Duration = Duration::from_millis(500);

/// A call of another run first: the replica's connection to Redis is made (a few trips
/// more), and the script loaded, before the call a test measures. Its run may well have
/// spent its 1.5 s on those trips: whether it was served is beside the point.
async fn warm(p: &Process) {
    let (status, _, body) = send(p, call(false, &[("x-run-id", "warm")], 0)).await;
    assert!(status == 200 || status == 504, "{status} {body}");
}

/// The run's deadline is its first call's arrival plus its budget (1.5 s on the route
/// `agent`), however long the admission took to come back from Redis: the answer's
/// `x-run-remaining-ms` plus the time the client waited for it is no more than the budget
/// (and some slack for the client's own side). It was the budget plus both legs.
#[tokio::test]
async fn the_trip_to_redis_does_not_lengthen_a_run() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let (far, proxy) = delaying_proxy(redis.addr, LEG).await;
    let p = Process::spawn(
        &config(&fake, &format!("redis://{far}/0"), "deny", "5s"),
        &[],
        &[],
    )
    .await;
    warm(&p).await;
    let start = Instant::now();
    let (status, headers, body) = send(&p, call(false, &[("x-run-id", "far")], 0)).await;
    let waited = start.elapsed();
    assert_eq!(status, 200, "{body}");
    assert!(waited >= 2 * LEG, "through the proxy: {waited:?}");
    let remaining: u64 = headers["x-run-remaining-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let slack = LEG.as_millis() as u64 * 4 / 5;
    assert!(
        remaining + waited.as_millis() as u64 <= 1500 + slack,
        "{remaining} ms left after {waited:?} of a 1500 ms run"
    );
    proxy.abort();
}

/// A call that arrives with less of its run left than the trip to Redis and back is not
/// sent upstream: by the time the admission is back, the run's deadline has passed. The run
/// starts on a replica next to Redis; the call comes to one a leg away, `LEG` into the run
/// at the soonest, so at most 1.5 s - `LEG` is left when it arrives and none by the time its
/// admission is back.
#[tokio::test]
async fn a_call_admitted_through_a_slow_store_is_not_sent_past_its_runs_deadline() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let (far, proxy) = delaying_proxy(redis.addr, LEG).await;
    let near = Process::spawn(&config(&fake, &redis.url(), "deny", "5s"), &[], &[]).await;
    let away = Process::spawn(
        &config(&fake, &format!("redis://{far}/0"), "deny", "5s"),
        &[],
        &[],
    )
    .await;
    warm(&away).await;
    let start = Instant::now();
    let (status, _, body) = send(&near, call(false, &[("x-run-id", "late")], 0)).await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep_until(start + LEG).await;
    let (status, _, body) = send(&away, call(false, &[("x-run-id", "late")], 1)).await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["error"]["code"], "run_deadline_exceeded", "{body}");
    let late: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.headers["x-run-id"] == "late")
        .collect();
    assert_eq!(late.len(), 1, "only the run's first call went upstream");
    proxy.abort();
}
