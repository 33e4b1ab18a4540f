//! A Redis that answers with an error reply (out of memory, a read-only replica, a failed
//! save, an ACL that refuses the script), and the cancel tombstones a paused one leaves.

use super::{call, config, redis_and_fake, send};
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
        let toml = config(&fake, &redis.url(), on_error, "200ms")
            .replace("[server]\n", "[server]\nshutdown_grace = \"2s\"\n");
        let p = Process::spawn(&toml, &[], &[]).await;
        // The scripts loaded first, while Redis still has room.
        let (status, _, body) = send(&p, call(false, &[("x-run-id", "roomy")], 0)).await;
        assert_eq!(status, 200, "{body}");
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
        // The five admissions refused, and nothing more (the end of the first call may
        // land after the reset, and succeeds: its first write is an HDEL).
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
