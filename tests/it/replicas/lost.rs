//! A run whose key is gone from Redis at a call's end: evicted under a `maxmemory-policy`
//! other than `noeviction`, flushed, or expired while an end waited on a store that was down.

use std::time::Duration;

use hyper::body::Incoming;
use hyper::Response;
use tokio::time::Instant;

use super::{call, config, redis_and_fake, send};
use crate::support::{metric, read_body, Conn, Process};

const LOST: &str = "hourglass_runs_total{end=\"lost\",route=\"agent\"}";

/// The run's key is deleted (as an eviction would) while two of its calls stream: their ends
/// find it gone. The run is counted once, `hourglass_runs_total{end="lost"}` under its route,
/// by the first end to find it so, with one WARN line naming it; the second end finds the
/// first's mark and counts nothing. An operator could not see that run state was lost: the
/// ends found nothing and said nothing (audit VA 3).
#[tokio::test]
async fn a_run_gone_at_a_calls_end_is_counted_once_and_warned_of() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let p = Process::spawn(&config(&fake, &redis.url(), "deny", "1s"), &[], &[]).await;
    assert_eq!(
        metric(p.admin, LOST).await,
        0.0,
        "the series starts at zero"
    );
    // Two calls of the run streaming at once, their ends 600 ms away.
    let slow = [
        ("x-run-id", "gone"),
        ("x-fake-chunks", "3"),
        ("x-fake-interval-ms", "200"),
    ];
    let streams = two_streams(&p, &slow).await;
    assert_eq!(redis.query("DEL hg:{-/gone}").await, ":1", "the run's key");
    for (resp, _c) in streams {
        let read = read_body(resp.into_body()).await;
        assert!(read.error_event().is_none(), "the streams are whole");
    }
    counted_lost_once(&p).await;
    warned_once_of(p, "hg:{-/gone}").await;
}

/// A field of the run `key`'s hash, as a number (`:N`; `:0` when missing).
async fn field(redis: &crate::support::redis::RedisServer, key: &str, f: &str) -> String {
    redis
        .query(&format!(
            "EVAL \"return tonumber(redis.call('HGET', KEYS[1], '{f}') or 0)\" 1 {key}"
        ))
        .await
}

/// The run's key is deleted while two of its calls stream, and a new call of the same run id
/// is admitted (and ends) before they do: it starts the run over in the same key, as agents
/// making parallel calls do. The streaming calls' ends find a key, but not their run: the loss
/// is counted once (`end="lost"`, one WARN), and the new run's counts are left as its own call
/// made them. The ends found the key, their reservations missing, and said nothing: the old
/// run's tokens and its loss vanished (audit VC 6).
#[tokio::test]
async fn a_run_lost_and_started_over_before_its_calls_end_is_counted_once() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let p = Process::spawn(&config(&fake, &redis.url(), "deny", "1s"), &[], &[]).await;
    let key = "hg:{-/renewed}";
    let slow = [
        ("x-run-id", "renewed"),
        ("x-fake-chunks", "10"),
        ("x-fake-interval-ms", "100"),
    ];
    let streams = two_streams(&p, &slow).await;
    assert_eq!(
        redis.query(&format!("DEL {key}")).await,
        ":1",
        "the run's key"
    );
    let again = [("x-run-id", "renewed")];
    let (status, _, body) = send(&p, call(false, &again, 2)).await;
    assert_eq!(status, 200, "{body}");
    // Its end reached the store: the new run has one call, none in flight.
    let deadline = Instant::now() + Duration::from_secs(5);
    while field(&redis, key, "in_flight").await != ":0" {
        assert!(Instant::now() < deadline, "the new call's end applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let used = field(&redis, key, "used").await;
    assert_ne!(used, ":0", "the new call's tokens counted");
    assert_eq!(field(&redis, key, "calls").await, ":1");
    for (resp, _c) in streams {
        let read = read_body(resp.into_body()).await;
        assert!(read.error_event().is_none(), "the streams are whole");
    }
    counted_lost_once(&p).await;
    assert_eq!(field(&redis, key, "calls").await, ":1", "the new run's");
    assert_eq!(field(&redis, key, "used").await, used, "the new run's");
    assert_eq!(field(&redis, key, "in_flight").await, ":0");
    assert_eq!(field(&redis, key, "reserved").await, ":0");
    warned_once_of(p, key).await;
}

/// Two calls of the run streaming at once, each on a connection of its own.
async fn two_streams(p: &Process, headers: &[(&str, &str)]) -> Vec<(Response<Incoming>, Conn)> {
    let mut streams = Vec::new();
    for turn in 0..2 {
        let (resp, c) = Conn::open(p.addr)
            .await
            .send(call(true, headers, turn))
            .await;
        assert_eq!(resp.status(), 200);
        streams.push((resp, c));
    }
    streams
}

/// The loss is counted, and stays counted once after both ends have reached the store (the
/// second finds the first's mark).
async fn counted_lost_once(p: &Process) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(p.admin, LOST).await < 1.0 {
        assert!(Instant::now() < deadline, "the lost run counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(metric(p.admin, LOST).await, 1.0, "counted once");
}

/// One WARN line names the run's `key` as gone from the store.
async fn warned_once_of(p: Process, key: &str) {
    let (stdout, stderr) = p.stop().await;
    let out = stdout + &stderr;
    let warned: Vec<_> = out
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(key))
        .collect();
    assert_eq!(warned.len(), 1, "{out}");
    assert!(warned[0].contains("gone from the store"), "{out}");
}
