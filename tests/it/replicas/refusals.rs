//! A Redis that answers with an error reply (out of memory, a read-only replica, a failed
//! save, an ACL that refuses the script), and the cancel tombstones a paused one leaves.

use super::{call, config, redis_and_fake, run_state, send};
use crate::support::Process;

/// Redis's `INFO commandstats` line for `cmd` (`cmdstat_evalsha:calls=...`), or "".
async fn commandstat(conn: &mut redis::aio::MultiplexedConnection, cmd: &str) -> String {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find(|l| l.starts_with(&format!("cmdstat_{cmd}:")))
        .unwrap_or_default()
        .to_owned()
}

/// An admission Redis refused with an error reply (here OOM: `maxmemory 1`, noeviction, the
/// policy docs/deployment.md recommends) wrote nothing, so no cancel follows it (audit MD 1:
/// each such call sent cancel.lua, itself refused, again and again for a minute, logged a
/// WARN that its reservation would expire, and a shutdown waited on every one of them).
#[tokio::test]
async fn an_admission_redis_refused_sends_no_cancel_and_holds_no_shutdown() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for on_error in ["allow", "deny"] {
        // A timeout long enough that no call here times out on a busy machine (which
        // would rightly cancel): a refusal comes back at once.
        let toml = config(&fake, &redis.url(), on_error, "3s")
            .replace("[server]\n", "[server]\nshutdown_grace = \"2s\"\n");
        let p = Process::spawn(&toml, &[], &[]).await;
        // The scripts loaded first, while Redis still has room.
        let (status, _, body) = send(&p, call(false, &[("x-run-id", "roomy")], 0)).await;
        assert_eq!(status, 200, "{body}");
        // Its end lands in Redis a moment after the answer: waited for, so that it is not
        // refused under the OOM below (on a loaded machine it landed after the reset, its
        // first write past the HDEL refused: six failed calls counted, not five).
        let run = run_state(&p, "roomy", |u| u["in_flight"] == 0).await;
        assert_eq!(run["runs"][0]["used"]["in_flight"], 0, "{run}");
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg("1")
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
        let want = if on_error == "allow" { 200 } else { 503 };
        for i in 0..5 {
            let run = format!("oom-{on_error}-{i}");
            let (status, _, body) = send(&p, call(false, &[("x-run-id", &run)], 0)).await;
            assert_eq!(status, want, "{on_error}: {body}");
            if want == 503 {
                let message = body["error"]["message"].as_str().unwrap_or_default();
                assert!(message.contains("OOM"), "the refusal named: {body}");
            }
        }
        // A cancel would be sent at once, and again 100 ms later.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let stat = commandstat(&mut conn, "evalsha").await;
        // The five admissions refused, and nothing more.
        assert!(stat.ends_with(",failed_calls=5"), "{on_error}: {stat}");
        let (out, err) = p.stop().await;
        let text = out + &err;
        assert!(
            !text.contains("still unsent at shutdown"),
            "{on_error}: {text}"
        );
        assert!(!text.contains("gave up"), "{on_error}: {text}");
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg("0")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

/// The `x:` fields (cancel tombstones) of a run's hash in `redis`.
async fn tombstones(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<String> {
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    fields.into_iter().filter(|f| f.starts_with("x:")).collect()
}

/// A cancel's tombstone lives as long as its admission may still come (the run's ttl), then
/// is pruned by a later admission, as expired reservations are given back (audit MD 3: a
/// 10 s write pause left 1,898 of them in a run that lived on, and each of its admissions
/// read them all, at ten times the script time).
#[tokio::test]
async fn cancel_tombstones_are_pruned_once_no_admission_can_come() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let toml =
        config(&fake, &redis.url(), "deny", "200ms").replace("[runs]\n", "[runs]\nttl = \"1s\"\n");
    // A run long enough to outlive its tombstones.
    let toml = toml.replace("run_budget = \"1500ms\"", "run_budget = \"60s\"");
    let run = [("x-run-id", "tomb")];
    let p = Process::spawn(&toml, &[], &[]).await;
    let (status, _, body) = send(&p, call(false, &run, 0)).await;
    assert_eq!(status, 200, "{body}");
    // Calls that stop waiting on a frozen Redis: each cancels its admission, which lands
    // once Redis runs again.
    redis.pause();
    for turn in 1..4 {
        let (status, _, body) = send(&p, call(false, &run, turn)).await;
        assert_eq!(status, 503, "{body}");
    }
    redis.resume();
    let key = "hg:{-/tomb}";
    let mut waited = 0;
    while tombstones(&mut conn, key).await.len() < 3 {
        waited += 1;
        assert!(waited < 100, "the cancels landed");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The run goes on, past the tombstones' time (its ttl of 1 s, by Redis's clock).
    for turn in 4..10 {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let (status, _, body) = send(&p, call(false, &run, turn)).await;
        assert_eq!(status, 200, "{turn}: {body}");
    }
    assert_eq!(tombstones(&mut conn, key).await, Vec::<String>::new());
    p.stop().await;
}

/// An admission whose connection could not even be opened (nothing listening; a wrong CA or
/// password alike) never reached Redis, so no cancel follows it (audit SE 2: each refused
/// call left a cancel tried for a minute, a shutdown waited its whole grace for them, and a
/// Redis started within that minute got one EVALSHA and one tombstone per refused call).
#[tokio::test]
async fn an_admission_that_never_reached_redis_sends_no_cancel_and_holds_no_shutdown() {
    let Some((_redis, fake)) = redis_and_fake().await else {
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = format!("redis://127.0.0.1:{port}/0");
    let toml = config(&fake, &store, "deny", "3s")
        .replace("[server]\n", "[server]\nshutdown_grace = \"20s\"\n");
    let p = Process::spawn(&toml, &[], &[]).await;
    for turn in 0..3 {
        let (status, _, body) = send(&p, call(false, &[("x-run-id", "down")], turn)).await;
        assert_eq!(status, 503, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("refused"), "{body}");
    }
    // Redis comes back where the calls were refused: a cancel would be sent to it within
    // the second (tried 100 ms, then 200 ms, ... apart).
    let redis = crate::support::redis::RedisServer::on(port).await;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    assert_eq!(commandstat(&mut conn, "evalsha").await, "");
    assert_eq!(
        tombstones(&mut conn, "hg:{-/down}").await,
        Vec::<String>::new()
    );
    drop(redis);
    let (out, err) = p.stop().await;
    let text = out + &err;
    assert!(!text.contains("still unsent at shutdown"), "{text}");
}
