//! Files that parse but do not check out: each error names the file, the route or upstream
//! and the key, and says which values are inherited.

use super::{err, load, secs, with_route_keys, BASE};

#[test]
fn first_token_timeout_over_budget() {
    assert_eq!(
        err(&with_route_keys(
            "budget = \"8s\"\nfirst_token_timeout = \"40s\""
        )),
        "t.toml: route \"chat\": first_token_timeout (40s) must not exceed budget (8s)"
    );
}

#[test]
fn inherited_values_are_pointed_out() {
    assert_eq!(
        err(&with_route_keys("budget = \"8s\"")),
        "t.toml: route \"chat\": first_token_timeout (30s) must not exceed budget (8s); \
         first_token_timeout is inherited from [defaults]"
    );
    assert_eq!(
        err(&with_route_keys(
            "budget = \"100ms\"\nfirst_token_timeout = \"100ms\""
        )),
        "t.toml: route \"chat\": reserve + min_useful (0s + 100ms = 100ms) must be less than \
         budget (100ms); reserve and min_useful are inherited from [defaults]"
    );
}

#[test]
fn unknown_upstream_lists_known_ones_sorted() {
    let text = BASE.replace("upstream = \"openai\"", "upstream = \"anthropc\"");
    assert_eq!(
        err(&text),
        "t.toml: route \"chat\": upstream \"anthropc\" is not defined (known: anthropic, openai)"
    );
}

#[test]
fn upstream_url_errors() {
    let cases = [
        ("ftp://x", "must use http or https"),
        ("api.openai.com", "must use http or https"),
        ("http://:80", "must include a host"),
        ("http://a/v1?x=1", "must not have a query string"),
        ("http://a/v1#top", "must not have a fragment"),
        (
            "https://user:pw@a",
            "must not contain credentials (use api_key_env)",
        ),
        ("http://a b", "is not a valid URL: invalid uri character"),
        (
            "http://a:99999",
            "has port \"99999\", which is not a TCP port (1 to 65535)",
        ),
        (
            "http://a:65536/v1",
            "has port \"65536\", which is not a TCP port (1 to 65535)",
        ),
        (
            "http://a:abc",
            "has port \"abc\", which is not a TCP port (1 to 65535)",
        ),
        (
            "http://a:",
            "has port \"\", which is not a TCP port (1 to 65535)",
        ),
        (
            "http://a:0",
            "has port \"0\", which is not a TCP port (1 to 65535)",
        ),
        (
            "http://[::1]:70000",
            "has port \"70000\", which is not a TCP port (1 to 65535)",
        ),
        // The connector reads an IPv6 host with no zone, looks `::1%lo` up as a name and
        // fails every request as a "dns error" (audit RA 3).
        (
            "http://[::1%25lo]:8000",
            "has an IPv6 zone id (\"%25lo\"), which is not supported: use an address or a name that needs none",
        ),
        (
            "http://[fe80::1%eth0]/v1",
            "has an IPv6 zone id (\"%eth0\"), which is not supported: use an address or a name that needs none",
        ),
    ];
    for (url, why) in cases {
        let text = BASE.replace("https://api.openai.com", url);
        // A password is never repeated, even to say it should not be there; nor is a query's
        // value (audit OB 2).
        let shown = url.replace(":pw@", ":***@").replace("?x=1", "?x=***");
        assert_eq!(
            err(&text),
            format!("t.toml: upstream \"openai\": url \"{shown}\" {why}")
        );
    }
    let text = BASE.replace("url = \"https://api.openai.com\"", "api_key_env = \"K\"");
    assert_eq!(err(&text), "t.toml: upstream \"openai\": url is required");
}

#[test]
fn pool_idle_timeout_defaults_to_90s_and_must_not_be_zero() {
    assert_eq!(load(BASE).upstreams[0].pool_idle_timeout, secs(90));
    let set = |v: &str| {
        BASE.replace(
            "url = \"https://api.openai.com\"",
            &format!("url = \"https://api.openai.com\"\npool_idle_timeout = \"{v}\""),
        )
    };
    assert_eq!(load(&set("4s")).upstreams[0].pool_idle_timeout, secs(4));
    assert_eq!(
        err(&set("0s")),
        "t.toml: upstream \"openai\": pool_idle_timeout must be greater than 0"
    );
}

#[test]
fn ejection_defaults_to_5_failures_for_10s_and_is_checked() {
    let e = load(BASE).upstreams[0].ejection;
    assert_eq!((e.after, e.duration), (5, secs(10)));
    let set = |extra: &str| {
        BASE.replace(
            "url = \"https://api.openai.com\"",
            &format!("url = \"https://api.openai.com\"\n{extra}"),
        )
    };
    let e = load(&set("eject_after = 0\neject_for = \"1m\"")).upstreams[0].ejection;
    assert_eq!((e.after, e.duration), (0, secs(60)));
    assert_eq!(
        err(&set("eject_after = 1001")),
        "t.toml: upstream \"openai\": eject_after must be at most 1000 (0 never ejects), got 1001"
    );
    assert_eq!(
        err(&set("eject_for = \"0ms\"")),
        "t.toml: upstream \"openai\": eject_for must be greater than 0; to never eject, set \
         eject_after = 0"
    );
    // How long an ejection lasts does not matter where none happens.
    let e = load(&set("eject_after = 0\neject_for = \"0s\"")).upstreams[0].ejection;
    assert_eq!(e.after, 0);
    assert!(err(&set("eject_after = -1")).contains("eject_after"));
}

#[test]
fn upstream_url_path_prefix_is_kept_without_trailing_slash() {
    for (given, path) in [
        ("http://127.0.0.1:8089/openai", "/openai"),
        ("http://127.0.0.1:8089/openai/", "/openai"),
        ("http://127.0.0.1:8089/", "/"),
        ("http://127.0.0.1:8089//", "/"),
        ("http://127.0.0.1:8089", "/"),
    ] {
        let c = load(&BASE.replace("https://api.openai.com", given));
        assert_eq!(c.upstreams[0].url.path(), path, "{given}");
        assert_eq!(c.upstreams[0].url.authority().unwrap(), "127.0.0.1:8089");
    }
}

#[test]
fn other_upstream_errors() {
    let text = BASE.replace(
        "url = \"https://api.openai.com\"",
        "url = \"https://api.openai.com\"\napi_key_env = \"\"",
    );
    assert_eq!(
        err(&text),
        "t.toml: upstream \"openai\": api_key_env \"\" is not a valid environment variable name"
    );
    let text = BASE.replace(
        "url = \"https://api.openai.com\"",
        "url = \"https://api.openai.com\"\nca_file = \"\"",
    );
    assert_eq!(
        err(&text),
        "t.toml: upstream \"openai\": ca_file must not be empty"
    );
    for (keys, want) in [
        (
            "trust_public_roots = false",
            "trust_public_roots = false needs a ca_file: nothing would be trusted",
        ),
        (
            "client_cert = \"c.pem\"",
            "client_cert needs client_cert_key, the certificate's private key",
        ),
        (
            "client_cert_key = \"c.key\"",
            "client_cert_key needs client_cert, the certificate it is the key of",
        ),
        (
            "client_cert = \"\"\nclient_cert_key = \"c.key\"",
            "client_cert must not be empty",
        ),
    ] {
        let text = BASE.replace(
            "url = \"https://api.openai.com\"",
            &format!("url = \"https://api.openai.com\"\n{keys}"),
        );
        assert_eq!(err(&text), format!("t.toml: upstream \"openai\": {want}"));
    }
    let text = format!("{BASE}[upstreams.\"\"]\nurl = \"http://a\"\n");
    assert_eq!(
        err(&text),
        "t.toml: upstreams: an upstream name must not be empty"
    );
}

#[test]
fn no_upstreams_and_no_routes() {
    assert_eq!(
        err("[[routes]]\nname = \"chat\"\npath_prefix = \"/\"\nupstream = \"x\"\n"),
        "t.toml: no upstreams defined: at least one [upstreams.NAME] table is required"
    );
    assert_eq!(
        err(""),
        "t.toml: no upstreams defined: at least one [upstreams.NAME] table is required"
    );
    assert_eq!(
        err("[upstreams.openai]\nurl = \"https://api.openai.com\"\n"),
        "t.toml: no routes defined: at least one [[routes]] entry is required"
    );
}

#[test]
fn route_identity_errors() {
    let dup = format!(
        "{BASE}\n[[routes]]\nname = \"other\"\npath_prefix = \"/a\"\nupstream = \"openai\"\n\n\
         [[routes]]\nname = \"chat\"\npath_prefix = \"/b\"\nupstream = \"openai\"\n"
    );
    assert_eq!(
        err(&dup),
        "t.toml: routes[2]: name \"chat\" is already used by routes[0]; route names must be unique"
    );
    let unnamed = format!("{BASE}\n[[routes]]\npath_prefix = \"/a\"\nupstream = \"openai\"\n");
    assert_eq!(err(&unnamed), "t.toml: routes[1]: name is required");
    let empty = format!("{BASE}\n[[routes]]\nname = \"\"\npath_prefix = \"/a\"\n");
    assert_eq!(err(&empty), "t.toml: routes[1]: name must not be empty");
    // Audit ME 5: a name of spaces only is no name either (and it becomes a metric label).
    let blank = format!("{BASE}\n[[routes]]\nname = \" \\t \"\npath_prefix = \"/a\"\n");
    assert_eq!(
        err(&blank),
        "t.toml: routes[1]: name \" \\t \" is only whitespace; route names must not be blank"
    );
    let reserved = format!("{BASE}\n[[routes]]\nname = \"none\"\npath_prefix = \"/a\"\n");
    assert_eq!(
        err(&reserved),
        "t.toml: routes[1]: name \"none\" is reserved: the metrics count requests that match no route as route=\"none\""
    );
    let no_prefix = format!("{BASE}\n[[routes]]\nname = \"x\"\nupstream = \"openai\"\n");
    assert_eq!(
        err(&no_prefix),
        "t.toml: route \"x\": path_prefix is required"
    );
    let no_upstream = format!("{BASE}\n[[routes]]\nname = \"x\"\npath_prefix = \"/x\"\n");
    assert_eq!(
        err(&no_upstream),
        "t.toml: route \"x\": upstream is required"
    );
    let text = BASE.replace("path_prefix = \"/v1/chat\"", "path_prefix = \"v1/chat\"");
    assert_eq!(
        err(&text),
        "t.toml: route \"chat\": path_prefix \"v1/chat\" must start with \"/\""
    );
    // Prefixes no request path can match, since paths are matched as routing reads them.
    for (prefix, why) in [
        ("/a?x=1", "routes match the path alone, never its query"),
        ("/h#x", "routes match the path alone, never its fragment"),
        ("/g h", "' ' never comes unencoded in a request's path"),
        ("/é", "'é' never comes unencoded in a request's path"),
        ("/lt<b", "'<' never comes unencoded in a request's path"),
        ("/bt`b", "'`' never comes unencoded in a request's path"),
        ("/c/./d", "a `.` or `..` segment are refused"),
        ("/c/%2e%2e/d", "a `.` or `..` segment are refused"),
        ("/b//c", "write that"),
        ("/d%2Fe", "matched as \"/d/e\" is spelled"),
        ("/%65f", "matched as \"/ef\" is spelled"),
        ("/caf%c3%a9", "matched as \"/caf%C3%A9\" is spelled"),
    ] {
        let text = BASE.replace(
            "path_prefix = \"/v1/chat\"",
            &format!("path_prefix = {prefix:?}"),
        );
        let e = err(&text);
        assert!(
            e.starts_with(&format!(
                "t.toml: route \"chat\": path_prefix {prefix:?} can never match a request: "
            )) && e.contains(why),
            "{prefix}: {e}"
        );
    }
    // What requests do send is kept.
    for prefix in [
        "/",
        "/v1/",
        "/v1/chat%20x",
        "/v1/caf%C3%A9",
        "/openai/deployments/gpt-4o:chat",
    ] {
        load(&BASE.replace(
            "path_prefix = \"/v1/chat\"",
            &format!("path_prefix = {prefix:?}"),
        ));
    }
}

#[test]
fn empty_model_glob() {
    assert_eq!(
        err(&with_route_keys("models = [\"o3*\", \"\"]")),
        "t.toml: route \"chat\": models[1] is empty; use \"*\" to match any model"
    );
    assert_eq!(
        err(&with_route_keys("models = []")),
        "t.toml: route \"chat\": models is empty; omit it (or use [\"*\"]) to match any model"
    );
}

#[test]
fn route_limit_errors() {
    let cases = [
        (
            "budget = \"0s\"",
            "budget must be greater than 0",
        ),
        (
            "budget = \"8s\"\nmax_budget = \"5s\"\nfirst_token_timeout = \"1s\"",
            "budget (8s) must not exceed max_budget (5s)",
        ),
        (
            "budget = \"10m 1s\"",
            "budget (10m 1s) must not exceed max_budget (10m); max_budget is inherited from [defaults]",
        ),
        (
            "budget = \"1s\"\nfirst_token_timeout = \"1s\"\nreserve = \"900ms\"\nmin_useful = \"100ms\"",
            "reserve + min_useful (900ms + 100ms = 1s) must be less than budget (1s)",
        ),
        (
            "connect_timeout = \"0ms\"",
            "connect_timeout (0s) must be at least 10ms",
        ),
        (
            "first_token_timeout = \"0s\"",
            "first_token_timeout (0s) must be at least 10ms",
        ),
        ("idle_timeout = \"0s\"", "idle_timeout (0s) must be at least 10ms"),
        (
            "retries = 3\nretry_on = []",
            "retry_on is empty, so retries (3) would never be tried; name the failures that \
             may be tried again (connect, first_token, 5xx, 429, reset), or drop retries (3)",
        ),
        (
            "fallbacks = [\"anthropic\"]\nretry_on = []",
            "retry_on is empty, so fallbacks would never be tried; name the failures that may \
             be tried again (connect, first_token, 5xx, 429, reset), or drop fallbacks",
        ),
        // Audit ME 5: a cause named twice is a typo for another one, most likely.
        (
            "retry_on = [\"5xx\", \"connect\", \"5xx\"]",
            "retry_on[2] (\"5xx\") is already in retry_on[0]; name each failure once",
        ),
    ];
    for (keys, message) in cases {
        assert_eq!(
            err(&with_route_keys(keys)),
            format!("t.toml: route \"chat\": {message}"),
            "{keys}"
        );
    }
    // Nothing to try again is no error: an empty list with neither.
    load(&with_route_keys("retry_on = []"));
}

#[test]
fn defaults_are_checked_themselves() {
    let cases = [
        ("budget = \"0s\"", "budget must be greater than 0"),
        (
            "budget = \"8s\"\nmax_budget = \"5s\"",
            "budget (8s) must not exceed max_budget (5s)",
        ),
        (
            "first_token_timeout = \"2m\"",
            "first_token_timeout (2m) must not exceed budget (1m)",
        ),
        (
            "reserve = \"1m\"",
            "reserve + min_useful (1m + 100ms = 1m 100ms) must be less than budget (1m)",
        ),
        (
            "idle_timeout = \"0s\"",
            "idle_timeout (0s) must be at least 10ms",
        ),
    ];
    for (keys, message) in cases {
        let text = format!("[defaults]\n{keys}\n{BASE}");
        assert_eq!(err(&text), format!("t.toml: defaults: {message}"), "{keys}");
    }
}

#[test]
fn route_override_can_repair_nothing_in_defaults() {
    // Defaults are validated even if every route overrides the bad key,
    // because a route added later would silently inherit it.
    let text = format!("[defaults]\nbudget = \"0s\"\n{BASE}budget = \"5s\"\n");
    assert_eq!(
        err(&text),
        "t.toml: defaults: budget must be greater than 0"
    );
}

#[test]
fn server_errors() {
    let cases = [
        (
            "max_request_body = 0",
            "max_request_body must be greater than 0",
        ),
        (
            "request_body_memory = 1024",
            "request_body_memory (1024) must be at least max_request_body (10485760), or no body of the largest size could be read",
        ),
        (
            "response_body_memory = 1048575",
            "response_body_memory (1048575) must be at least max_response_body (16777216) and 1048576 (the most of a JSON document read whole), or no answer of the largest size could be held",
        ),
        (
            "max_response_body = 1000\nresponse_body_memory = 1048575",
            "response_body_memory (1048575) must be at least max_response_body (1000) and 1048576 (the most of a JSON document read whole), or no answer of the largest size could be held",
        ),
        (
            "max_connections = 0",
            "max_connections must be greater than 0 (omit it for no limit)",
        ),
        (
            "max_connections = 2000000000000",
            "max_connections (2000000000000) must be at most 1000000",
        ),
        (
            "max_headers = 5000",
            "max_headers (5000) must be at most 1000",
        ),
        ("max_headers = 0", "max_headers must be greater than 0"),
        (
            "http2_max_concurrent_streams = 0",
            "http2_max_concurrent_streams must be greater than 0",
        ),
        (
            "send_timeout = \"0s\"",
            "send_timeout (0s) must be at least 10ms",
        ),
        // Audit ME 5: a client-side limit this short closes every connection at once.
        (
            "send_timeout = \"9ms\"",
            "send_timeout (9ms) must be at least 10ms",
        ),
        (
            "drain_delay = \"11m\"",
            "drain_delay (11m) must be at most 10m (it is how long a load balancer takes to \
             see /readyz turn 503: a few health-check intervals)",
        ),
        (
            "header_read_timeout = \"0s\"",
            "header_read_timeout (0s) must be at least 10ms",
        ),
        // Audit ME 5: a client-side limit this short closes every connection at once.
        (
            "header_read_timeout = \"9ms\"",
            "header_read_timeout (9ms) must be at least 10ms",
        ),
        (
            "listen = \"127.0.0.1:9000\"\nadmin_listen = \"127.0.0.1:9000\"",
            "listen and admin_listen must differ (both are 127.0.0.1:9000)",
        ),
        // One of them on every address, the other's included: bound second, it failed at
        // start-up while `check` passed (audit P).
        (
            "listen = \"127.0.0.1:9000\"\nadmin_listen = \"0.0.0.0:9000\"",
            "listen (127.0.0.1:9000) and admin_listen (0.0.0.0:9000) share a port, and one of \
             them listens on every address, the other's included; give them different ports",
        ),
        (
            "listen = \"[::]:9000\"\nadmin_listen = \"127.0.0.1:9000\"",
            "listen ([::]:9000) and admin_listen (127.0.0.1:9000) share a port, and one of \
             them listens on every address, the other's included; give them different ports",
        ),
        // An IPv4-mapped IPv6 address binds its IPv4 address: `check` passed these and
        // start-up failed (audit IB 5).
        (
            "listen = \"127.0.0.1:9000\"\nadmin_listen = \"[::ffff:127.0.0.1]:9000\"",
            "listen (127.0.0.1:9000) and admin_listen ([::ffff:127.0.0.1]:9000) are one \
             address (an IPv4-mapped IPv6 address is its IPv4 address); give them different ports",
        ),
        (
            "listen = \"0.0.0.0:9000\"\nadmin_listen = \"[::ffff:127.0.0.1]:9000\"",
            "listen (0.0.0.0:9000) and admin_listen ([::ffff:127.0.0.1]:9000) share a port, and \
             one of them listens on every address, the other's included; give them different ports",
        ),
        (
            "listen = \"[::ffff:0.0.0.0]:9000\"\nadmin_listen = \"127.0.0.1:9000\"",
            "listen ([::ffff:0.0.0.0]:9000) and admin_listen (127.0.0.1:9000) share a port, and \
             one of them listens on every address, the other's included; give them different ports",
        ),
    ];
    for (keys, message) in cases {
        let text = format!("[server]\n{keys}\n{BASE}");
        assert_eq!(err(&text), format!("t.toml: server: {message}"), "{keys}");
    }
}

/// A CRL revokes certificates of `client_ca`: without it no certificate is asked for, and
/// the CRL would look like protection that is not there.
#[test]
fn client_crl_needs_client_ca() {
    let text = format!(
        "[server.tls]\ncert = \"tls.pem\"\nkey = \"tls.key\"\nclient_crl = \"clients.crl\"\n\n{BASE}"
    );
    assert_eq!(
        err(&text),
        "t.toml: server.tls: client_crl needs client_ca (the CAs whose certificates it revokes)"
    );
}

#[test]
fn absurd_durations_are_refused_at_load() {
    let e = err(&format!(
        "[defaults]\nmax_budget = \"500000000years\"\n{BASE}"
    ));
    assert!(e.contains("longer than the maximum of 1 year"), "{e}");
    load(&format!("[defaults]\nmax_budget = \"365days\"\n{BASE}"));
}

#[test]
fn http2_defaults_keep_every_stalled_stream_inside_the_connection_window() {
    let h2 = load(BASE).upstreams[0].http2;
    assert_eq!(h2, crate::config::Http2Config::default());
    assert_eq!(h2.mode, crate::config::Http2Mode::Auto);
    assert!(
        u64::from(h2.max_streams_per_connection) * u64::from(h2.stream_window)
            <= u64::from(h2.connection_window)
    );
    assert!(h2.warning().is_none());
}

/// The warning counts the stalled clients that close the connection window: each holds at
/// most one stream window, so it takes the quotient rounded up (two of 65,535 against
/// 100,000, where one leaves 34,465 for the others).
#[test]
fn the_stalled_streams_warning_counts_the_clients_that_close_the_window() {
    let warning = |stream: u32, connection: u32| {
        let mut h2 = crate::config::Http2Config::default();
        (h2.stream_window, h2.connection_window) = (stream, connection);
        h2.warning().expect("a window below 100 streams' warns")
    };
    let w = warning(65_535, 100_000);
    assert!(w.contains(": 2 clients that stop reading"), "{w}");
    let w = warning(1 << 20, 4 << 20);
    assert!(w.contains(": 4 clients that stop reading"), "{w}");
    let w = warning(1 << 20, 1 << 20);
    assert!(w.contains(": 1 client that stops reading"), "{w}");
}

#[test]
fn http2_keys_load_and_refuse_nonsense_naming_key_and_value() {
    let set = |keys: &str| {
        BASE.replace(
            "url = \"https://api.openai.com\"",
            &format!("url = \"https://api.openai.com\"\n{keys}"),
        )
    };
    let h2 = load(&set(
        "http2 = \"always\"\nhttp2_max_streams_per_connection = 2\nhttp2_max_connections = 3\n\
         http2_stream_window = 65535\nhttp2_connection_window = 1048576",
    ))
    .upstreams[0]
        .http2;
    assert_eq!(h2.mode, crate::config::Http2Mode::Always);
    assert_eq!(
        (
            h2.max_streams_per_connection,
            h2.max_connections,
            h2.stream_window,
            h2.connection_window
        ),
        (2, Some(3), 65535, 1048576)
    );
    // A stream window above the default connection window raises the default with it.
    let h2 = load(&set("http2_stream_window = 33554432")).upstreams[0].http2;
    assert_eq!(h2.connection_window, 33554432);
    let up = "t.toml: upstream \"openai\": ";
    for (keys, want) in [
        (
            "http2_max_streams_per_connection = 0",
            "http2_max_streams_per_connection (0) must be between 1 and 1073741824",
        ),
        (
            "http2_max_connections = 0",
            "http2_max_connections (0) must be between 1 and 65535",
        ),
        (
            "http2_stream_window = 1000",
            "http2_stream_window (1000) must be between 65535 and 2147483647",
        ),
        (
            "http2_connection_window = 4294967296",
            "http2_connection_window (4294967296) must be between 65535 and 2147483647",
        ),
        (
            "http2_stream_window = 1048576\nhttp2_connection_window = 524288",
            "http2_connection_window (524288) must not be less than http2_stream_window \
             (1048576): one stream would close the connection's window to every other",
        ),
        (
            "http2 = \"never\"\nhttp2_stream_window = 1048576",
            "http2_stream_window has no effect with http2 = \"never\"",
        ),
    ] {
        assert_eq!(err(&set(keys)), format!("{up}{want}"), "{keys}");
    }
    let bad = err(&set("http2 = \"sometimes\""));
    assert!(
        bad.contains("unknown variant `sometimes`") && bad.contains("`always`"),
        "{bad}"
    );
}

#[test]
fn a_connection_window_that_stalled_streams_can_fill_is_warned_about() {
    let text = BASE.replace(
        "url = \"https://api.openai.com\"",
        "url = \"https://api.openai.com\"\nhttp2_stream_window = 1048576\n\
         http2_connection_window = 4194304",
    );
    let warnings = load(&text).warnings_with(&|_| Some("k".into()));
    assert!(
        warnings.iter().any(|w| w.starts_with(
            "upstream \"openai\": http2_connection_window (4194304) is less than \
             http2_max_streams_per_connection × http2_stream_window (104857600): 4 clients"
        )),
        "{warnings:?}"
    );
}

/// Audit K4: the file is not interpolated, so a shell-style reference is a name never set;
/// it is refused naming the key, and the name to write (plainly no key, so shown).
#[test]
fn a_shell_style_variable_reference_is_refused() {
    for var in ["$OPENAI_API_KEY", "${OPENAI_API_KEY}"] {
        let text = BASE.replace(
            "url = \"https://api.openai.com\"",
            &format!("url = \"https://api.openai.com\"\napi_key_env = {var:?}"),
        );
        assert_eq!(
            err(&text),
            format!(
                "t.toml: upstream \"openai\": api_key_env {var:?} is a shell-style reference, but \
                 the file is not interpolated: write the variable's name without `$` (\"OPENAI_API_KEY\")"
            )
        );
    }
    let message = err(&with_route_keys("client_keys_env = \"${HG_KEYS}\""));
    assert!(
        message
            .starts_with("t.toml: route \"chat\": client_keys_env \"${HG_KEYS}\" is a shell-style"),
        "{message}"
    );
    let message = err(&format!(
        "[runs]\nstore = \"redis://redis:6379/0\"\nstore_password_env = \"$REDIS_PASSWORD\"\n{BASE}"
    ));
    assert!(
        message
            .starts_with("t.toml: runs: store_password_env \"$REDIS_PASSWORD\" is a shell-style")
            && message.ends_with("(\"REDIS_PASSWORD\")"),
        "{message}"
    );
}

/// Audit ME 1: an upstream's `expected_first_token` at or past the first-token limit of a
/// route that calls it (its own upstream, one balanced with it, a fallback) is refused, as
/// `hedge_after` is: no first token is observed later than that limit, so the estimate could
/// never come down, and every request with the route's budget was refused 504
/// `insufficient_budget` however fast the upstream answered.
#[test]
fn an_expected_first_token_a_route_could_never_see_is_refused() {
    // `route` replaces the route's `upstream = "openai"` line.
    let seeded = |seed: &str, route: &str| {
        BASE.replace(
            "auth = \"x-api-key\"\n",
            &format!("auth = \"x-api-key\"\nexpected_first_token = \"{seed}\"\n"),
        )
        .replace("upstream = \"openai\"\n", route)
    };
    let limits = "budget = \"8s\"\nfirst_token_timeout = \"5s\"\n";
    let tail = "no first token is observed later than that, so the estimate could never \
                come down, and every request with the route's budget would be refused \
                (504 insufficient_budget)";
    for (seed, route) in [
        ("9s", format!("upstream = \"anthropic\"\n{limits}")),
        (
            "5s",
            format!("upstream = \"openai\"\nfallbacks = [\"anthropic\"]\n{limits}"),
        ),
        (
            "6s",
            format!("upstream = \"openai\"\nbalance_with = [\"anthropic\"]\n{limits}"),
        ),
    ] {
        assert_eq!(
            err(&seeded(seed, &route)),
            format!(
                "t.toml: route \"chat\": upstream \"anthropic\" has expected_first_token \
                 ({seed}), which must be less than the route's first_token_timeout (5s): {tail}"
            ),
            "{route}"
        );
    }
    // Inherited from [defaults] (30 s), and the room a reserve leaves of the budget.
    assert_eq!(
        err(&seeded(
            "30s",
            "upstream = \"openai\"\nfallbacks = [\"anthropic\"]\n"
        )),
        format!(
            "t.toml: route \"chat\": upstream \"anthropic\" has expected_first_token (30s), \
             which must be less than the route's first_token_timeout (30s): {tail}"
        )
    );
    assert_eq!(
        err(&seeded(
            "7s",
            "upstream = \"openai\"\nfallbacks = [\"anthropic\"]\nbudget = \"10s\"\nfirst_token_timeout = \"9s\"\nreserve = \"3s\"\n"
        )),
        format!(
            "t.toml: route \"chat\": upstream \"anthropic\" has expected_first_token (7s), \
             which must be less than the route's budget less its reserve (10s - 3s = 7s): {tail}"
        )
    );
    // Below every limit, and on an upstream the route does not call, it stands.
    load(&seeded(
        "4999ms",
        &format!("upstream = \"openai\"\nfallbacks = [\"anthropic\"]\n{limits}"),
    ));
    load(&seeded("1m", &format!("upstream = \"openai\"\n{limits}")));
}

/// Audit NB 1: a seed at or past the room a route's run budget leaves (`run_budget`, or the
/// `run_max_budget` a client's run budget is clamped to) passed, and every call with a run id
/// was then refused 504 `run_deadline_exceeded` however fast the upstream answered.
#[test]
fn an_expected_first_token_past_a_routes_run_budget_is_refused() {
    let seeded = |seed: &str, route: &str| {
        BASE.replace(
            "auth = \"x-api-key\"\n",
            &format!("auth = \"x-api-key\"\nexpected_first_token = \"{seed}\"\n"),
        )
        .replace("upstream = \"openai\"\n", route)
    };
    let limits = "budget = \"8s\"\nfirst_token_timeout = \"8s\"\n";
    let tail = "no first token is observed later than that, so the estimate could never \
                come down, and every call of a run would be refused (504 run_deadline_exceeded)";
    assert_eq!(
        err(&seeded(
            "7s",
            &format!("upstream = \"anthropic\"\n{limits}run_budget = \"5s\"\n")
        )),
        format!(
            "t.toml: route \"chat\": upstream \"anthropic\" has expected_first_token (7s), \
             which must be less than the route's run_budget (5s): {tail}"
        )
    );
    assert_eq!(
        err(&seeded(
            "4s",
            &format!(
                "upstream = \"openai\"\nfallbacks = [\"anthropic\"]\n{limits}reserve = \"1s\"\nrun_max_budget = \"5s\"\n"
            )
        )),
        format!(
            "t.toml: route \"chat\": upstream \"anthropic\" has expected_first_token (4s), \
             which must be less than the route's run_max_budget less its reserve \
             (5s - 1s = 4s): {tail}"
        )
    );
    // Inherited from [defaults], the key says so.
    assert_eq!(
        err(&format!(
            "[defaults]\nrun_budget = \"6s\"\n\n{}",
            seeded("6s", &format!("upstream = \"anthropic\"\n{limits}"))
        )),
        format!(
            "t.toml: route \"chat\": upstream \"anthropic\" has expected_first_token (6s), \
             which must be less than the route's run_budget (6s, inherited from [defaults]): {tail}"
        )
    );
    // Below it, it stands.
    load(&seeded(
        "4999ms",
        &format!("upstream = \"anthropic\"\n{limits}run_budget = \"5s\"\n"),
    ));
}

/// Audit NB 3: the route timeouts were checked only for > 0, so `connect_timeout = "1ns"`
/// or `first_token_timeout = "1ns"` passed, and requests failed "within 0ms". They have the
/// floor ME 5 gave the client timeouts, in routes and in [defaults].
#[test]
fn route_timeouts_under_10ms_are_refused() {
    for key in ["connect_timeout", "first_token_timeout", "idle_timeout"] {
        for (value, shown) in [("1ns", "1ns"), ("9999us", "9ms 999us"), ("0s", "0s")] {
            let keys = format!("{key} = \"{value}\"");
            assert_eq!(
                err(&with_route_keys(&keys)),
                format!("t.toml: route \"chat\": {key} ({shown}) must be at least 10ms"),
                "{keys}"
            );
            assert_eq!(
                err(&format!("[defaults]\n{keys}\n{BASE}")),
                format!("t.toml: defaults: {key} ({shown}) must be at least 10ms"),
                "{keys}"
            );
        }
        load(&with_route_keys(&format!("{key} = \"10ms\"")));
    }
}

/// Audit NB 6: a name of a zero-width space passed the blank check (`str::trim` keeps
/// U+200B), and "chat" beside "chat " gave two metric labels that look the same. Names with
/// whitespace at either end, or with an invisible character, are refused, the name escaped.
#[test]
fn names_that_look_blank_or_like_another_are_refused() {
    let route = |name: &str| {
        err(&format!(
            "{BASE}\n[[routes]]\nname = \"{name}\"\npath_prefix = \"/a\"\nupstream = \"openai\"\n"
        ))
    };
    let invisible = "holds an invisible character (a format or control character, or a \
                     line separator), so it could look blank, or like another name";
    for (name, shown, code) in [
        ("\\u200B", "\"\\u{200b}\"", "U+200B"),
        ("chat\\u2060", "\"chat\\u{2060}\"", "U+2060"),
        ("\\uFEFFchat", "\"\\u{feff}chat\"", "U+FEFF"),
        ("ch\\u00ADat", "\"ch\\u{ad}at\"", "U+00AD"),
        ("a\\u202Eb", "\"a\\u{202e}b\"", "U+202E"),
        ("a\\u0007b", "\"a\\u{7}b\"", "U+0007"),
        // Audit AG 1: every log line of the route split where `splitlines()` reads them.
        ("a\\u2028b", "\"a\\u{2028}b\"", "U+2028"),
        ("a\\u2029b", "\"a\\u{2029}b\"", "U+2029"),
    ] {
        assert_eq!(
            route(name),
            format!("t.toml: routes[1]: name {shown} {invisible} ({code})"),
            "{name}"
        );
    }
    // Break audit AH 5: default ignorables the list left out (shown as `{:?}` shows them).
    for (name, raw, code) in [
        ("a\\u061Cb", "a\u{61c}b", "U+061C"),
        ("a\\u3164b", "a\u{3164}b", "U+3164"),
        ("a\\U000E0041b", "a\u{e0041}b", "U+E0041"),
    ] {
        assert_eq!(
            route(name),
            format!("t.toml: routes[1]: name {raw:?} {invisible} ({code})"),
            "{name}"
        );
    }
    let ends = "begins or ends with whitespace, so it could look like another name";
    assert_eq!(
        route("chat "),
        format!("t.toml: routes[1]: name \"chat \" {ends}")
    );
    assert_eq!(
        route("\\u00A0chat"),
        format!("t.toml: routes[1]: name \"\\u{{a0}}chat\" {ends}")
    );
    // Upstream names alike.
    let upstream = |name: &str| {
        err(&BASE.replace(
            "[upstreams.anthropic]",
            &format!(
                "[upstreams.\"{name}\"]\nurl = \"https://x.example\"\n\n[upstreams.anthropic]"
            ),
        ))
    };
    assert_eq!(
        upstream("openai "),
        format!("t.toml: upstreams: upstream name \"openai \" {ends}")
    );
    assert_eq!(
        upstream("\\u200B"),
        format!("t.toml: upstreams: upstream name \"\\u{{200b}}\" {invisible} (U+200B)")
    );
    // Spaces inside a name are a name's own.
    load(&format!(
        "{BASE}\n[[routes]]\nname = \"chat two\"\npath_prefix = \"/a\"\nupstream = \"openai\"\n"
    ));
}
