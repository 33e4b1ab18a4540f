//! How replicas reach their Redis: a password from the environment (never logged), one
//! refused and then taken, an ACL user, a Redis Cluster with `store_cluster`, and `rediss://`
//! signed by a private CA.

use super::*;

#[tokio::test]
async fn a_password_from_the_environment_reaches_redis_and_never_the_log() {
    if crate::support::redis::skip() {
        return;
    }
    let password = "s3cret/pa:ss@word";
    let redis = RedisServer::with_password(password).await;
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let toml = config(&fake, &redis.url(), "deny", "1s").replace(
        "on_store_error = \"deny\"",
        "on_store_error = \"deny\"\nstore_password_env = \"HOURGLASS_TEST_REDIS_PASSWORD\"",
    );
    let p = Process::spawn(&toml, &[], &[("HOURGLASS_TEST_REDIS_PASSWORD", password)]).await;
    let (status, headers, body) = send(&p, call(false, &[("x-run-id", "pw")], 0)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["x-run-calls-left"], "9", "the run is in Redis");
    let (out, err) = p.stop().await;
    assert!(!out.contains(password) && !err.contains(password));
}

/// A store that refused the gateway's password (rotated, or an ACL user made after the
/// gateway started) is used again once it takes the password: the redis crate's connection
/// manager keeps a refused connection's error for good (it reconnects only after I/O errors),
/// which left every later call refused, or served without its run's limits, until a restart
/// (audit IE 1).
#[tokio::test]
async fn a_store_that_refused_the_password_is_used_again_once_it_takes_it() {
    if crate::support::redis::skip() {
        return;
    }
    let password = "right";
    let redis = RedisServer::with_password(password).await;
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let toml = config(&fake, &redis.url(), "deny", "1s").replace(
        "on_store_error = \"deny\"",
        "on_store_error = \"deny\"\nstore_password_env = \"HOURGLASS_TEST_REDIS_PASSWORD\"",
    );
    let p = Process::spawn(&toml, &[], &[("HOURGLASS_TEST_REDIS_PASSWORD", password)]).await;
    let (status, _, body) = send(&p, call(false, &[("x-run-id", "rotated")], 0)).await;
    assert_eq!(status, 200, "{body}");
    // Rotated, and the gateway's connection dropped: its next connection is refused.
    assert_eq!(
        redis
            .query_as(password, "CONFIG SET requirepass other")
            .await,
        "+OK"
    );
    redis
        .query_as("other", "CLIENT KILL TYPE normal SKIPME yes")
        .await;
    let (status, _, body) = send(&p, call(false, &[("x-run-id", "rotated")], 1)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "run_store_unavailable", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("uthentication")),
        "the refusal is named: {body}"
    );
    // Rotated back: the store takes the gateway's password again.
    assert_eq!(
        redis
            .query_as("other", &format!("CONFIG SET requirepass {password}"))
            .await,
        "+OK"
    );
    let until = Instant::now() + Duration::from_secs(10);
    let mut turn = 2;
    let (status, headers, body) = loop {
        let answer = send(&p, call(false, &[("x-run-id", "rotated")], turn)).await;
        if answer.0 == 200 || Instant::now() > until {
            break answer;
        }
        turn += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, 200, "the store is used again: {body}");
    assert!(
        headers.contains_key("x-run-calls-left"),
        "the run's limits are enforced again"
    );
    p.stop().await;
}

/// A two-node Redis Cluster, each node with half the slots, once each knows the other's.
async fn two_node_cluster(dir: &std::path::Path) -> (RedisServer, RedisServer) {
    let low = RedisServer::cluster_node(dir).await;
    let high = RedisServer::cluster_node(dir).await;
    assert_eq!(low.query("CLUSTER ADDSLOTSRANGE 0 8191").await, "+OK");
    assert_eq!(high.query("CLUSTER ADDSLOTSRANGE 8192 16383").await, "+OK");
    let meet = format!("CLUSTER MEET 127.0.0.1 {}", high.port());
    assert_eq!(low.query(&meet).await, "+OK");
    // Until both have met, a node answers CLUSTERDOWN for the other's slots; then MOVED.
    // `hg:{-/a}` is on slot 11976, `hg:{-/c}` on 3722.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(low.query("EXISTS hg:{-/a}").await.starts_with("-MOVED")
        && high.query("EXISTS hg:{-/c}").await.starts_with("-MOVED"))
    {
        assert!(Instant::now() < deadline, "the nodes never met");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (low, high)
}

/// A Redis Cluster as the store: without `store_cluster` its redirections are named (a run on
/// another node's slot was served without limits, as an outage); with it, every run is held
/// to its limits on the node of its slot, and `/runs/{id}` finds it there.
#[tokio::test]
async fn a_redis_cluster_holds_runs_on_every_node_with_store_cluster() {
    let Some((_plain, fake)) = redis_and_fake().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (low, high) = two_node_cluster(dir.path()).await;
    // Runs on both halves: each node holds some.
    for (node, id) in [(&low, "c"), (&high, "a")] {
        let slot = node.query(&format!("CLUSTER KEYSLOT hg:{{-/{id}}}")).await;
        let slot: u16 = slot.trim_start_matches(':').parse().unwrap();
        assert_eq!(slot < 8192, std::ptr::eq(node, &low), "{id}: {slot}");
    }

    let plain = Process::spawn(&config(&fake, &low.url(), "deny", "1s"), &[], &[]).await;
    let (status, _, body) = send(&plain, call(false, &[("x-run-id", "a")], 0)).await;
    assert_eq!(status, 503, "{body}");
    crate::support::assert_message_starts(
        &body["error"],
        "run store unavailable: the run store is a Redis Cluster, and [runs] store_cluster is not set: it answered",
    );
    let ready = reqwest_like_get(plain.admin, "/readyz").await;
    assert!(ready.contains("store_cluster is not set"), "{ready}");
    // `/runs/{id}` reads the run's own key first, so it meets the redirection too, and says
    // so as a call's 503 does.
    let text = reqwest_like_get(plain.admin, "/runs/a").await;
    let found: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(found["error"]["code"], "run_store_unavailable", "{text}");
    crate::support::assert_message_starts(
        &found["error"],
        "run store unavailable: the run store is a Redis Cluster",
    );

    let toml = config(&fake, &low.url(), "deny", "1s").replace(
        "on_store_error = \"deny\"",
        "on_store_error = \"deny\"\nstore_cluster = true",
    );
    let p = Process::spawn(&toml, &[], &[]).await;
    for id in ["a", "c"] {
        let run = [("x-run-id", id), ("x-run-budget-ms", "60000")];
        for turn in 0..10 {
            let (status, headers, body) = send(&p, call(false, &run, turn)).await;
            assert_eq!(status, 200, "{id} {turn}: {body}");
            let left = (9 - turn).to_string();
            assert_eq!(headers["x-run-calls-left"], left.as_str(), "{id}");
        }
        let (status, _, body) = send(&p, call(false, &run, 10)).await;
        assert_eq!(status, 429, "{id}: {body}");
        assert_eq!(body["error"]["code"], "run_call_limit", "{id}: {body}");
        let text = crate::support::admin_get(p.admin, &format!("/runs/{id}")).await;
        let found: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(found["runs"][0]["used"]["calls"], 10, "{id}: {text}");
    }
    assert_eq!(
        low.query("EXISTS hg:{-/c}").await,
        ":1",
        "c is on the low node"
    );
    assert_eq!(
        high.query("EXISTS hg:{-/a}").await,
        ":1",
        "a is on the high node"
    );
    // Runs of `a` scoped by client keys, one on each node (slots 1145 and 10777): every
    // primary is SCANned for them.
    for (node, scope) in [(&low, "0000000000000001"), (&high, "0000000000000003")] {
        let hset = format!("HSET hg:{{{scope}/a}} route agent calls 1");
        assert_eq!(node.query(&hset).await, ":2");
    }
    let text = crate::support::admin_get(p.admin, "/runs/a").await;
    let found: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(found["runs"].as_array().map(Vec::len), Some(3), "{text}");
}

/// `rediss://` to a Redis whose certificate a private CA signed (Memorystore's, a Helm
/// chart's): trusted through `store_ca_file`, where the public roots alone refused it.
#[tokio::test]
async fn a_rediss_store_signed_by_a_private_ca_is_trusted_through_store_ca_file() {
    let Some((_plain, fake)) = redis_and_fake().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_redis, ca, tls_port) = RedisServer::with_tls(dir.path()).await;
    let store = format!("rediss://localhost:{tls_port}/0");
    let toml = config(&fake, &store, "deny", "2s").replace(
        "on_store_error = \"deny\"",
        &format!(
            "on_store_error = \"deny\"\nstore_ca_file = {:?}",
            ca.to_str().unwrap()
        ),
    );
    let p = Process::spawn(&toml, &[], &[]).await;
    let (status, headers, body) = send(&p, call(false, &[("x-run-id", "tls")], 0)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["x-run-calls-left"], "9", "the run is in Redis");
}

/// An ACL user named in the URL, its password from `store_password_env`, trimmed of the
/// newline a secret made from a file ends in.
#[tokio::test]
async fn an_acl_user_with_a_password_from_the_environment_reaches_redis() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    assert_eq!(
        redis
            .query("ACL SETUSER hguser on >UserPw!42 ~hg:* +@all")
            .await,
        "+OK"
    );
    let store = format!("redis://hguser@{}/0", redis.addr);
    let toml = config(&fake, &store, "deny", "1s").replace(
        "on_store_error = \"deny\"",
        "on_store_error = \"deny\"\nstore_password_env = \"HOURGLASS_TEST_REDIS_PASSWORD\"",
    );
    let p = Process::spawn(
        &toml,
        &[],
        &[("HOURGLASS_TEST_REDIS_PASSWORD", "UserPw!42\n")],
    )
    .await;
    let (status, headers, body) = send(&p, call(false, &[("x-run-id", "acl")], 0)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers["x-run-calls-left"], "9", "the run is in Redis");
    let (out, err) = p.stop().await;
    assert!(!out.contains("UserPw!42") && !err.contains("UserPw!42"));
}

/// The ACL user of docs/deployment.md, as its `ACL SETUSER` line there says, with `password`.
fn documented_acl_user(password: &str) -> String {
    let doc = include_str!("../../../docs/deployment.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER hourglass "))
        .expect("docs/deployment.md has the ACL SETUSER line");
    line.replace(">PASSWORD", &format!(">{password}"))
}

/// The documented ACL user serves a run whose slot is migrating, as `redis-cli --cluster
/// reshard` leaves one (audit MD 2): the cluster client sends ASKING to the importing node,
/// and PING to each node it connects to, which the documented user lacked. Every new run of
/// a migrating slot failed 503 after the store timeout, its NOPERM never named.
#[tokio::test]
async fn the_documented_acl_user_serves_a_run_whose_slot_is_migrating() {
    let Some((_plain, fake)) = redis_and_fake().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (low, high) = two_node_cluster(dir.path()).await;
    for node in [&low, &high] {
        assert_eq!(node.query(&documented_acl_user("hgpass")).await, "+OK");
    }
    // `hg:{-/a}` is on slot 11976, the high node's: moving to the low one, as a reshard
    // does it (the importing side first).
    let myid = |n: &RedisServer| {
        let client = redis::Client::open(n.url()).unwrap();
        async move {
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let id: String = redis::cmd("CLUSTER")
                .arg("MYID")
                .query_async(&mut conn)
                .await
                .unwrap();
            id
        }
    };
    let (low_id, high_id) = (myid(&low).await, myid(&high).await);
    let importing = format!("CLUSTER SETSLOT 11976 IMPORTING {high_id}");
    assert_eq!(low.query(&importing).await, "+OK");
    let migrating = format!("CLUSTER SETSLOT 11976 MIGRATING {low_id}");
    assert_eq!(high.query(&migrating).await, "+OK");
    // A new run: the high node no longer holds the key, and asks that it be made on the
    // low one.
    assert!(high.query("EXISTS hg:{-/a}").await.starts_with("-ASK"));

    let store = format!("redis://hourglass@{}/0", low.addr);
    let toml = config(&fake, &store, "deny", "1s").replace(
        "on_store_error = \"deny\"",
        "on_store_error = \"deny\"\nstore_cluster = true\nstore_password_env = \"HOURGLASS_TEST_REDIS_PASSWORD\"",
    );
    let p = Process::spawn(&toml, &[], &[("HOURGLASS_TEST_REDIS_PASSWORD", "hgpass")]).await;
    let (status, _, body) = send(&p, call(false, &[("x-run-id", "a")], 0)).await;
    assert_eq!(status, 200, "{body}");
    // Made where it moves (the importing node shows it only to a client that says ASKING).
    let client = redis::Client::open(low.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (exists,): (u8,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("EXISTS")
        .arg("hg:{-/a}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 1);
    // Nothing the gateway sent was denied, on either node.
    for node in [&low, &high] {
        assert_eq!(node.query("ACL LOG").await, "*0", "{}", node.port());
    }
    p.stop().await;
}

/// A Redis Cluster store whose connections Redis closed while they were idle (its `timeout`,
/// here `CLIENT KILL`, which does the same to an idle connection) is connected anew by the
/// next command: the cluster client's own retries went to the same closed connection, and
/// 4 calls in 8 of a quiet run were 503 "broken pipe" under `deny`, or served past its
/// call limit under `allow` (audit SE 1). `/runs/{id}` is a command like a call's.
#[tokio::test]
async fn a_cluster_store_reconnects_after_redis_closed_its_idle_connections() {
    let Some((_plain, fake)) = redis_and_fake().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (low, high) = two_node_cluster(dir.path()).await;
    let toml = config(&fake, &low.url(), "deny", "1s").replace(
        "on_store_error = \"deny\"",
        "on_store_error = \"deny\"\nstore_cluster = true",
    );
    let p = Process::spawn(&toml, &[], &[]).await;
    let run = [("x-run-id", "a"), ("x-run-budget-ms", "60000")];
    for turn in 0..6 {
        let (status, headers, body) = send(&p, call(false, &run, turn)).await;
        assert_eq!(status, 200, "turn {turn}: {body}");
        assert_eq!(
            headers["x-run-calls-left"],
            (9 - turn).to_string().as_str(),
            "turn {turn}"
        );
        // The call's end lands before its connection goes.
        let until = Instant::now() + Duration::from_secs(5);
        let in_flight =
            "EVAL \"return tonumber(redis.call('HGET', KEYS[1], 'in_flight'))\" 1 hg:{-/a}";
        while high.query(in_flight).await != ":0" {
            assert!(Instant::now() < until, "the end of call {turn} landed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for node in [&low, &high] {
            let killed = node.query("CLIENT KILL TYPE normal SKIPME yes").await;
            assert!(killed.starts_with(':'), "{killed}");
        }
        let text = crate::support::admin_get(p.admin, "/runs/a").await;
        assert!(text.contains("\"runs\""), "turn {turn}: {text}");
        for node in [&low, &high] {
            node.query("CLIENT KILL TYPE normal SKIPME yes").await;
        }
    }
    p.stop().await;
}

/// A Redis Cluster store whose `store` node is down starts through another node that
/// `store_nodes` names (audit SE 3: with one seed, a gateway started while that one node was
/// down answered every run call 503 "Failed to create initial connections", however healthy
/// the rest of the cluster).
#[tokio::test]
async fn a_cluster_store_starts_through_another_node_while_its_first_is_down() {
    let Some((_plain, fake)) = redis_and_fake().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (low, high) = two_node_cluster(dir.path()).await;
    let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down_url = format!("redis://{}/0", down.local_addr().unwrap());
    drop(down);
    let toml = config(&fake, &down_url, "deny", "1s").replace(
        "on_store_error = \"deny\"",
        &format!(
            "on_store_error = \"deny\"\nstore_cluster = true\nstore_nodes = [\"127.0.0.1:{}\"]",
            low.port()
        ),
    );
    let p = Process::spawn(&toml, &[], &[]).await;
    for id in ["a", "c"] {
        let (status, headers, body) = send(&p, call(false, &[("x-run-id", id)], 0)).await;
        assert_eq!(status, 200, "{id}: {body}");
        assert_eq!(headers["x-run-calls-left"], "9", "{id}");
    }
    assert_eq!(high.query("EXISTS hg:{-/a}").await, ":1");
    p.stop().await;
}

/// A call's end that finds the connection Redis closed while the call ran (its `timeout`
/// for idle clients; here `CLIENT KILL`) is sent again at once on a new one, as an admission
/// is: no store error counted, no WARN that calls are refused (audit SE 4: every end of a
/// call longer than the timeout counted one, and `/readyz` showed it).
#[tokio::test]
async fn an_end_after_redis_closed_the_idle_connection_is_no_store_error() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let p = Process::spawn(&config(&fake, &redis.url(), "deny", "1s"), &[], &[]).await;
    let addr = p.addr;
    let slow = tokio::spawn(async move {
        let req = call(false, &[("x-run-id", "idle"), ("x-fake-ttft-ms", "800")], 0);
        let (resp, _c) = Conn::open(addr).await.send(req).await;
        resp.status().as_u16()
    });
    let in_flight =
        "EVAL \"return tonumber(redis.call('HGET', KEYS[1], 'in_flight'))\" 1 hg:{-/idle}";
    let until = Instant::now() + Duration::from_secs(5);
    while redis.query(in_flight).await != ":1" {
        assert!(Instant::now() < until, "the call was admitted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed = redis.query("CLIENT KILL TYPE normal SKIPME yes").await;
    assert!(killed.starts_with(':'), "{killed}");
    assert_eq!(slow.await.unwrap(), 200);
    while redis.query(in_flight).await != ":0" {
        assert!(Instant::now() < until, "the end landed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let finish = "hourglass_run_store_errors_total{op=\"finish\"}";
    assert_eq!(crate::support::metric(p.admin, finish).await, 0.0);
    let (out, err) = p.stop().await;
    assert!(!(out + &err).contains("run store unavailable"));
}

/// A command of the run store's script that the ACL user may not run is named in the 503
/// (audit SE 6: Redis says only "can't run this command ... on @user_script:30", and
/// docs/deployment.md promised the command named).
#[tokio::test]
async fn an_acl_denial_inside_the_script_names_the_command() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    let without_time = documented_acl_user("hgpass").replace(" +time", "");
    assert_eq!(redis.query(&without_time).await, "+OK");
    let store = format!("redis://hourglass@{}/0", redis.addr);
    let toml = config(&fake, &store, "deny", "1s").replace(
        "on_store_error = \"deny\"",
        "on_store_error = \"deny\"\nstore_password_env = \"HOURGLASS_TEST_REDIS_PASSWORD\"",
    );
    let p = Process::spawn(&toml, &[], &[("HOURGLASS_TEST_REDIS_PASSWORD", "hgpass")]).await;
    let (status, _, body) = send(&p, call(false, &[("x-run-id", "acl")], 0)).await;
    assert_eq!(status, 503, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("ACL"), "{message}");
    assert!(message.contains("TIME"), "{message}");
    assert!(message.contains("ACL LOG"), "{message}");
}

/// A Redis whose `maxmemory-policy` may evict run keys is warned of at the first admission,
/// and `/readyz` notes it (audit SE 5: a run evicted under `allkeys-lru` or `volatile-lru`
/// started over silently, with its limits fresh; nothing checked the policy the docs ask
/// for).
#[tokio::test]
async fn a_store_that_may_evict_runs_is_warned_of() {
    let Some((redis, fake)) = redis_and_fake().await else {
        return;
    };
    assert_eq!(
        redis
            .query("CONFIG SET maxmemory-policy volatile-lru")
            .await,
        "+OK"
    );
    let p = Process::spawn(&config(&fake, &redis.url(), "deny", "1s"), &[], &[]).await;
    let (status, _, body) = send(&p, call(false, &[("x-run-id", "ev")], 0)).await;
    assert_eq!(status, 200, "{body}");
    let until = Instant::now() + Duration::from_secs(5);
    let ready = loop {
        let ready = reqwest_like_get(p.admin, "/readyz").await;
        if ready.contains("maxmemory-policy") || Instant::now() > until {
            break ready;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(ready.contains("maxmemory-policy volatile-lru"), "{ready}");
    let (out, err) = p.stop().await;
    let text = out + &err;
    let warned = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("maxmemory-policy"))
        .count();
    assert_eq!(warned, 1, "{text}");
}
