//! Run keys: inherited from `[defaults]`, overridden per route, checked; and `[runs]`.

use super::*;
use crate::config::{OnStoreError, RunIdSource, RunLimits, RunStore, DEFAULT_TOKEN_ESTIMATE};

#[test]
fn without_run_keys_a_route_counts_runs_without_limits() {
    let c = load(BASE);
    let r = &c.routes[0];
    assert_eq!(r.run_id, RunIdSource::default());
    assert_eq!(r.run_limits, RunLimits::UNLIMITED);
    assert!(!r.run_limits.any());
    assert_eq!(c.runs.ttl, secs(600));
    assert_eq!(c.runs.max_runs, 100_000);
    assert_eq!(c.runs.store, RunStore::Memory);
    assert_eq!(c.runs.store_timeout, Duration::from_millis(50));
    assert_eq!(c.runs.on_store_error, OnStoreError::Allow);
}

#[test]
fn run_keys_are_inherited_and_overridden() {
    let text = format!(
        "[defaults]\nrun_budget = \"2m\"\nrun_max_calls = 20\nrun_id_header = \"x-session-id\"\n\
         [runs]\nttl = \"30s\"\nmax_runs = 10\nstore = \"redis://127.0.0.1:6379/2\"\n\
         store_timeout = \"20ms\"\non_store_error = \"deny\"\n{BASE}\
         run_max_calls = 5\nrun_max_tokens = 9000\nrun_max_repeats = 3\nrun_max_budget = \"5m\"\n\
         run_token_estimate = 200\n\n\
         [[routes]]\nname = \"traced\"\npath_prefix = \"/v1/messages\"\nupstream = \"anthropic\"\n\
         run_id_header = \"traceparent\"\n"
    );
    let c = load(&text);
    let chat = &c.routes[0];
    assert_eq!(
        chat.run_id,
        RunIdSource::Header(http::HeaderName::from_static("x-session-id"))
    );
    assert_eq!(
        chat.run_limits,
        RunLimits {
            budget: Some(secs(120)),
            max_budget: Some(secs(300)),
            max_calls: Some(5),
            max_tokens: Some(9000),
            max_repeats: Some(3),
            token_estimate: 200,
        }
    );
    let traced = &c.routes[1];
    assert_eq!(traced.run_id, RunIdSource::TraceParent);
    assert_eq!(traced.run_limits.max_calls, Some(20));
    assert_eq!(traced.run_limits.token_estimate, DEFAULT_TOKEN_ESTIMATE);
    assert_eq!(c.runs.ttl, secs(30));
    assert_eq!(c.runs.max_runs, 10);
    assert_eq!(
        c.runs.store,
        RunStore::Redis("redis://127.0.0.1:6379/2".into())
    );
    assert_eq!(c.runs.store_timeout, Duration::from_millis(20));
    assert_eq!(c.runs.on_store_error, OnStoreError::Deny);
}

#[test]
fn bad_run_keys_are_refused_naming_the_route_and_key() {
    for (keys, want) in [
        (
            "run_max_calls = 0",
            "route \"chat\": run_max_calls must be greater than 0",
        ),
        (
            "run_max_tokens = 0",
            "route \"chat\": run_max_tokens must be greater than 0",
        ),
        (
            "run_max_repeats = 1",
            "route \"chat\": run_max_repeats (1) must be between 2 and 1000",
        ),
        (
            "run_token_estimate = 0",
            "run_token_estimate must be greater than 0",
        ),
        (
            "run_budget = \"0s\"",
            "route \"chat\": run_budget must be greater than 0",
        ),
        (
            "run_budget = \"10m\"\nrun_max_budget = \"1m\"",
            "run_budget (10m) must not exceed run_max_budget (1m)",
        ),
        (
            "run_id_header = \"bad header\"",
            "run_id_header \"bad header\" is not a valid header name",
        ),
        // A run id is logged and shown: never from a header that carries a key.
        (
            "run_id_header = \"X-Api-Key\"",
            "run_id_header \"X-Api-Key\" carries credentials",
        ),
        (
            "run_id_header = \"authorization\"",
            "run_id_header \"authorization\" carries credentials",
        ),
        (
            "run_id_header = \"cookie\"",
            "run_id_header \"cookie\" carries credentials",
        ),
        (
            "run_id_header = \"Ocp-Apim-Subscription-Key\"",
            "run_id_header \"Ocp-Apim-Subscription-Key\" carries credentials",
        ),
        (
            "run_max_calls = 5000000000",
            "run_max_calls (5000000000) must be at most 4294967295",
        ),
        // Audit WD 3: past 2^53 the Redis store's Lua numbers are not exact (2^53 and
        // 2^53 + 1 compare equal there), and the two stores would enforce different limits.
        (
            "run_max_tokens = 9007199254740992",
            "run_max_tokens (9007199254740992) must be at most 9007199254740991",
        ),
        (
            "run_token_estimate = 9007199254740992",
            "run_token_estimate (9007199254740992) must be at most 9007199254740991",
        ),
        ("run_max_calls = \"5\"", "invalid type"),
        ("run_limit = 5", "unknown field `run_limit`"),
    ] {
        let e = err(&with_route_keys(keys));
        assert!(e.contains(want), "{keys}: {e}");
    }
    // Taken from [defaults]: said so.
    for (keys, want) in [
        (
            "run_budget = \"0s\"",
            "route \"chat\": run_budget (inherited from [defaults]) must be greater than 0",
        ),
        (
            "run_max_calls = 0",
            "route \"chat\": run_max_calls (inherited from [defaults]) must be greater than 0 (omit it for no limit)",
        ),
        (
            "run_token_estimate = 0",
            "run_token_estimate (inherited from [defaults]) must be greater than 0 (omit it for the default, 1024)",
        ),
        (
            "run_max_repeats = 1",
            "run_max_repeats (1, inherited from [defaults]) must be between 2 and 1000",
        ),
        (
            "run_budget = \"10m\"\nrun_max_budget = \"1m\"",
            "run_budget (10m, inherited from [defaults]) must not exceed run_max_budget (1m, inherited from [defaults])",
        ),
        // Audit GC6: the value and where it came from in one pair of parentheses.
        (
            "run_max_calls = 4294967296",
            "route \"chat\": run_max_calls (4294967296, inherited from [defaults]) must be at most 4294967295",
        ),
        (
            "run_id_header = \"x-litellm-api-key\"",
            "run_id_header \"x-litellm-api-key\" (inherited from [defaults]) carries credentials",
        ),
    ] {
        let e = err(&format!("[defaults]\n{keys}\n{BASE}"));
        assert!(e.contains(want), "{keys}: {e}");
    }
}

#[test]
fn a_bad_runs_table_is_refused() {
    for (table, want) in [
        ("ttl = \"0s\"", "runs: ttl must be greater than 0"),
        ("max_runs = 0", "runs: max_runs (0) must be between 1 and"),
        (
            "store = \"redis+sentinel://127.0.0.1:26379/mymaster\"",
            "runs: store \"redis+sentinel:...\": Redis Sentinel is not supported: name the \
             master by an address that follows it (a DNS name, a virtual IP or a Kubernetes \
             Service that the failover moves), or use Redis Cluster (store_cluster = true)",
        ),
        (
            "store = \"sentinel://s1:26379\"",
            "runs: store \"sentinel:...\": Redis Sentinel is not supported",
        ),
        (
            "store = \"postgres://x\"",
            "runs: store \"postgres:...\" must be \"memory\" or a redis:// or rediss:// URL",
        ),
        (
            "store = \"rediss://127.0.0.1:6380/0#insecure\"",
            "runs: store \"rediss://127.0.0.1:6380/0#insecure\": #insecure (no certificate \
             check) is not supported; name the CA that signed the server's certificate in \
             store_ca_file",
        ),
        (
            "store = \"redis://127.0.0.1:6379/0\"\nstore_ca_file = \"ca.pem\"",
            "runs: store_ca_file \"ca.pem\" needs a rediss:// store",
        ),
        (
            "store = \"rediss://127.0.0.1:6380/0\"\nstore_ca_file = \"\"",
            "runs: store_ca_file must not be empty",
        ),
        (
            "store_cluster = true",
            "runs: store_cluster needs a redis:// or rediss:// store",
        ),
        (
            "store = \"redis://u:pw@127.0.0.1:7000/2\"\nstore_cluster = true",
            "runs: store \"redis://u:***@127.0.0.1:7000/2\": database 2 with store_cluster = \
             true: a Redis Cluster has database 0 only",
        ),
        (
            "store = \"redis://\"",
            "runs: store \"redis://\" names no host",
        ),
        (
            "store = \"redis://10.0.0.1:6379\"\nstore_nodes = [\"10.0.0.2:6379\"]",
            "runs: store_nodes (\"10.0.0.2:6379\", ...) needs store_cluster = true",
        ),
        (
            "store = \"redis://10.0.0.1:6379\"\nstore_cluster = true\nstore_nodes = [\"10.0.0.2\"]",
            "runs: store_nodes \"10.0.0.2\": must be HOST:PORT",
        ),
        (
            "store = \"redis://10.0.0.1:6379\"\nstore_cluster = true\nstore_nodes = [\"redis://10.0.0.2:6379\"]",
            "runs: store_nodes \"redis://10.0.0.2:6379\": must be HOST:PORT",
        ),
        (
            "store = \"redis://127.0.0.1:notaport/0\"",
            "runs: store \"redis://127.0.0.1:notaport/0\" is not a URL: invalid port number",
        ),
        (
            "store = \"redis://127.0.0.1:99999/0\"",
            "runs: store \"redis://127.0.0.1:99999/0\" is not a URL: invalid port number",
        ),
        (
            "store = \"redis://u:hunter2@127.0.0.1:6379/abc\"",
            "runs: store \"redis://u:***@127.0.0.1:6379/abc\": database \"abc\" is not a number",
        ),
        (
            "store = \"redis://127.0.0.1:6379/1/2\"",
            "runs: store \"redis://127.0.0.1:6379/1/2\": database \"1/2\" is not a number",
        ),
        (
            "store_timeout = \"0ms\"",
            "runs: store_timeout must be greater than 0",
        ),
        ("on_store_error = \"maybe\"", "unknown variant `maybe`"),
        ("size = 3", "unknown field `size`"),
    ] {
        let e = err(&format!("[runs]\n{table}\n{BASE}"));
        assert!(e.contains(want), "{table}: {e}");
    }
}

#[test]
fn describe_shows_run_limits_and_hides_a_store_password() {
    let text = format!(
        "[runs]\nstore = \"rediss://hg:s3cret-pass@redis.internal:6380/1\"\n{BASE}\
         run_max_calls = 5\nrun_max_repeats = 3\n"
    );
    let d = load(&text).describe();
    assert!(
        d.contains("store: rediss://hg:***@redis.internal:6380/1"),
        "{d}"
    );
    assert!(!d.contains("s3cret"), "{d}");
    assert!(
        d.contains("runs: id from x-run-id, run_max_calls 5, run_max_repeats 3"),
        "{d}"
    );
}

#[test]
fn a_store_password_comes_from_the_environment_only() {
    let ok = load(&format!(
        "[runs]\nstore = \"redis://redis:6379/0\"\nstore_password_env = \"REDIS_PASSWORD\"\n{BASE}"
    ));
    assert_eq!(
        ok.runs.store_password_env.as_deref(),
        Some("REDIS_PASSWORD")
    );
    assert!(ok.describe().contains("(password from REDIS_PASSWORD)"));
    for (table, want) in [
        (
            "store_password_env = \"P\"",
            "needs a redis:// or rediss:// store",
        ),
        (
            "store = \"redis://:x@h:6379\"\nstore_password_env = \"P\"",
            "the store URL already has a password",
        ),
        (
            "store = \"redis://u:x@h:6379\"\nstore_password_env = \"P\"",
            "the store URL already has a password",
        ),
        (
            "store = \"redis://h:6379\"\nstore_password_env = \"A B\"",
            "is not a variable name",
        ),
    ] {
        let e = err(&format!("[runs]\n{table}\n{BASE}"));
        assert!(e.contains(want), "{table}: {e}");
    }
}

/// An ACL user named in the URL takes its password from the environment: managed Redis
/// (ElastiCache, Memorystore) needs both, and the password then stays out of the file.
#[test]
fn an_acl_username_takes_its_password_from_the_environment() {
    let c = load(&format!(
        "[runs]\nstore = \"redis://hguser@redis:6379/0\"\nstore_password_env = \"HG_REDIS_UPW\"\n{BASE}"
    ));
    assert_eq!(c.runs.store_password_env.as_deref(), Some("HG_REDIS_UPW"));
}

/// A URL's scheme is case-insensitive (RFC 3986 3.1; audit W: `Redis://` was refused).
#[test]
fn a_store_schemes_case_does_not_matter() {
    let c = load(&format!("[runs]\nstore = \"Redis://redis:6379/0\"\n{BASE}"));
    assert!(matches!(&c.runs.store, RunStore::Redis(u) if u == "redis://redis:6379/0"));
    let c = load(&format!(
        "[runs]\nstore = \"REDISS://redis:6380/0\"\n{BASE}"
    ));
    assert!(matches!(&c.runs.store, RunStore::Redis(u) if u == "rediss://redis:6380/0"));
}

/// A Redis Cluster is named as one, and `check` says so.
#[test]
fn a_cluster_store_is_named_as_one() {
    let c = load(&format!(
        "[runs]\nstore = \"redis://redis-0:6379\"\nstore_cluster = true\n{BASE}"
    ));
    assert!(c.runs.store_cluster);
    assert!(
        c.describe()
            .contains("store: redis://redis-0:6379 (Redis Cluster)"),
        "{}",
        c.describe()
    );
    assert!(!load(BASE).runs.store_cluster);
}

/// A cluster store may name more nodes (audit SE 3), each reached as `store` is: its
/// scheme, user and password.
#[test]
fn a_cluster_store_names_more_nodes_reached_as_its_first() {
    let c = load(&format!(
        "[runs]\nstore = \"rediss://hg:pw@redis-0:6379\"\nstore_cluster = true\n\
         store_nodes = [\"redis-1:6380\", \"[::1]:6381\"]\n{BASE}"
    ));
    assert_eq!(c.runs.store_nodes, ["redis-1:6380", "[::1]:6381"]);
    assert!(
        c.describe().contains("(also redis-1:6380, [::1]:6381)"),
        "{}",
        c.describe()
    );
    let url = |node: &str| crate::config::node_url("rediss://hg:pw@redis-0:6379", node).unwrap();
    assert_eq!(url("redis-1:6380"), "rediss://hg:pw@redis-1:6380");
    assert_eq!(url("[::1]:6381"), "rediss://hg:pw@[::1]:6381");
}

/// A `rediss://` store signed by a private CA names it, relative to the config file as an
/// upstream's `ca_file` is.
#[test]
fn a_store_ca_file_is_relative_to_the_config_file() {
    let c = load(&format!(
        "[runs]\nstore = \"rediss://redis.internal:6380/0\"\nstore_ca_file = \"certs/redis-ca.pem\"\n{BASE}"
    ));
    assert_eq!(
        c.runs.store_ca_file.as_deref(),
        Some(std::path::Path::new("config/certs/redis-ca.pem"))
    );
    assert!(
        c.describe()
            .contains("store: rediss://redis.internal:6380/0 (CA from config/certs/redis-ca.pem)"),
        "{}",
        c.describe()
    );
}

/// No form of a store URL prints its password: not redis-rs's `?pass=` for a socket, nor a
/// URL missing a slash (a typo), which only their scheme is shown of.
#[test]
fn a_store_password_is_never_printed_whatever_the_urls_form() {
    let pw = "correct-horse-battery-staple";
    for (store, want) in [
        (
            format!("redis+unix:///var/run/redis/redis.sock?pass={pw}"),
            "runs: store \"redis+unix:...\" must be",
        ),
        (
            format!("unix:///var/run/redis.sock?user=app&pass={pw}"),
            "runs: store \"unix:...\" must be",
        ),
        (
            format!("redis:/:{pw}@127.0.0.1:6379/0"),
            "runs: store \"redis:...\" must be",
        ),
        (
            format!("redis:{pw}@127.0.0.1"),
            "runs: store \"redis:...\" must be",
        ),
        (
            format!("redis://127.0.0.1:6379/x?password={pw}"),
            "runs: store \"redis://127.0.0.1:6379/x?password=***\": database \"x\"",
        ),
    ] {
        let e = err(&format!("[runs]\nstore = \"{store}\"\n{BASE}"));
        assert!(e.contains(want), "{store}: {e}");
        assert!(!e.contains(pw), "{store}: {e}");
    }
}

/// A reload keeps the run store made at start: its warning compares `[runs]` with that,
/// naming each changed key and the value that stays, so a reload back to the start is no
/// change and a second reload of a change still is.
#[test]
fn a_reload_names_the_runs_keys_that_wait_for_a_restart() {
    let start = load(BASE).runs;
    let runs = |table: &str| load(&format!("[runs]\n{table}\n{BASE}")).runs;
    assert_eq!(start.restart_needed_for(&load(BASE).runs), None);
    assert_eq!(start.restart_needed_for(&runs("ttl = \"10m\"")), None);
    assert_eq!(
        start.restart_needed_for(&runs("ttl = \"5m\"")).as_deref(),
        Some("runs: ttl (10m stays) takes effect only after a restart")
    );
    assert_eq!(
        start
            .restart_needed_for(&runs(
                "store = \"redis://u:pw@127.0.0.1:6379/0\"\nmax_runs = 5\non_store_error = \"deny\""
            ))
            .as_deref(),
        Some(
            "runs: max_runs (100000 stays), store (\"memory\" stays), on_store_error \
             (\"allow\" stays) take effect only after a restart"
        )
    );
    let redis = runs("store = \"redis://u:pw@127.0.0.1:6379/0\"\nstore_timeout = \"20ms\"");
    assert_eq!(
        redis.restart_needed_for(&load(BASE).runs).as_deref(),
        Some(
            "runs: store (\"redis://u:***@127.0.0.1:6379/0\" stays), store_timeout (20ms stays) \
             take effect only after a restart"
        )
    );
}
