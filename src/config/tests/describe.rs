//! What `hourglass check` prints: every resolved value in `describe`, and the warnings
//! about the environment and the file's layout.

use std::ffi::OsString;

use super::{load, BASE, FULL};

#[test]
fn describe_lists_every_resolved_value() {
    let c = load(FULL);
    let d = c.describe();
    for needle in [
        "config config/hourglass.toml",
        "listen: 0.0.0.0:8000",
        "admin_listen: 127.0.0.1:9100",
        "max_request_body: 2048 bytes",
        "header_read_timeout: 5s",
        "shutdown_grace: 1m",
        "drain_delay: 5s (accepting after a stop signal, /readyz 503)",
        "send_timeout: 20s",
        "max_connections: 500",
        "max_header_bytes: ",
        "max_headers: ",
        "http2_max_concurrent_streams: ",
        "tls: ",
        "(/metrics /healthz /readyz /runs/{id} /upstreams)",
    ] {
        assert!(d.contains(needle), "missing {needle:?} in:\n{d}");
    }
    let block = |name: &str| -> String {
        let start = d.find(&format!("route \"{name}\"\n")).unwrap();
        let rest = &d[start + 1..];
        let end = rest.find("\nroute \"").map_or(rest.len(), |i| i + 1);
        rest[..end].to_owned()
    };
    let reasoning = block("reasoning");
    for needle in [
        "path_prefix: /v1/chat/completions",
        "models: \"o3*\", \"gpt-5?\"",
        "upstream: openai (https://api.openai.com, auth bearer, api_key_env OPENAI_API_KEY, \
         ca_file config/certs/ca.pem, propagate_budget true, http2 auto (100 streams per \
         connection, stream window 131072, connection window 16777216))",
        "budget: 5m\n",
        "max_budget: 10m\n",
        "connect_timeout: 2s\n",
        "first_token_timeout: 2m\n",
        "idle_timeout: 20s\n",
        "reserve: 250ms\n",
        "min_useful: 100ms\n",
    ] {
        assert!(
            reasoning.contains(needle),
            "missing {needle:?} in:\n{reasoning}"
        );
    }
    let chat = block("chat");
    for needle in [
        "models: any",
        "budget: 8s\n",
        "first_token_timeout: 5s\n",
        "idle_timeout: 3s\n",
    ] {
        assert!(chat.contains(needle), "missing {needle:?} in:\n{chat}");
    }
    let messages = block("messages");
    for needle in [
        "path_prefix: /v1/messages",
        "upstream: anthropic (http://127.0.0.1:8089/anthropic, auth x-api-key, \
         api_key_env ANTHROPIC_API_KEY, propagate_budget false, http2 auto)",
        "budget: 45s\n",
        "first_token_timeout: 15s\n",
    ] {
        assert!(
            messages.contains(needle),
            "missing {needle:?} in:\n{messages}"
        );
    }
    // File order.
    let pos = |n: &str| d.find(&format!("route \"{n}\"")).unwrap();
    assert!(pos("reasoning") < pos("chat") && pos("chat") < pos("messages"));
}

#[test]
fn warnings_cover_environment_and_layout() {
    let text = format!(
        "{}\n[upstreams.spare]\nurl = \"http://127.0.0.1:1\"\napi_key_env = \"SPARE_KEY\"\n\
         auth = \"none\"\nca_file = \"/nonexistent/ca.pem\"\n\
         client_cert = \"/nonexistent/gw.pem\"\nclient_cert_key = \"/nonexistent/gw.key\"\n\n\
         [[routes]]\nname = \"late\"\npath_prefix = \"/v1/chat/completions/x\"\nupstream = \"openai\"\n",
        FULL.replace("ca_file = \"certs/ca.pem\"\n", "")
    );
    let c = load(&text);
    let env = |name: &str| match name {
        "ANTHROPIC_API_KEY" => Some(OsString::new()),
        _ => None,
    };
    let w = c.warnings_with(&env);
    assert_eq!(
        w,
        [
            "upstream \"openai\": api_key_env OPENAI_API_KEY is not set; the client's own credentials will be passed through",
            "upstream \"anthropic\": api_key_env ANTHROPIC_API_KEY is set but empty; the client's own credentials will be passed through",
            "upstream \"spare\": api_key_env SPARE_KEY is ignored because auth is \"none\"",
            "upstream \"spare\": ca_file is ignored because url http://127.0.0.1:1 uses http",
            "upstream \"spare\": client_cert is ignored because url http://127.0.0.1:1 uses http",
            "upstream \"spare\" is not used by any route",
            "route \"late\" is unreachable: route \"chat\" comes first and matches every request it would",
        ]
    );

    let set = |_: &str| Some(OsString::from("sk-test"));
    assert!(load(BASE)
        .warnings_with(&set)
        .iter()
        .all(|w| !w.contains("api_key_env")));
}

#[test]
fn describe_names_the_tls_files() {
    let tls = "[server.tls]\ncert = \"tls/cert.pem\"\nkey = \"/etc/tls.key\"\n";
    let d = load(&format!("{tls}\n{BASE}")).describe();
    assert!(
        d.contains("  tls: cert config/tls/cert.pem, key /etc/tls.key\n"),
        "{d}"
    );
    let d = load(&format!(
        "{tls}client_ca = \"tls/ca.pem\"\nclient_crl = \"tls/clients.crl\"\n\n{BASE}"
    ))
    .describe();
    assert!(
        d.contains(
            "  tls: cert config/tls/cert.pem, key /etc/tls.key, client_ca config/tls/ca.pem, \
             client_crl config/tls/clients.crl\n"
        ),
        "{d}"
    );
}

#[test]
fn an_upstream_used_only_as_a_fallback_is_used() {
    let text = format!("{BASE}\nfallbacks = [\"anthropic\"]\n");
    let set = |_: &str| Some(OsString::from("sk-test"));
    let w = load(&text).warnings_with(&set);
    assert!(
        !w.iter().any(|w| w.contains("not used by any route")),
        "{w:?}"
    );
}

/// An unset `store_password_env` stops the gateway at start, as an unset `client_keys_env`
/// does: `check` says so rather than passing the config.
#[test]
fn an_unset_store_password_variable_is_a_warning() {
    let text = format!(
        "[runs]\nstore = \"redis://127.0.0.1:6379/0\"\nstore_password_env = \"RUNS_PASS\"\n{BASE}"
    );
    let set = |name: &str| (name != "RUNS_PASS").then(|| OsString::from("sk-test"));
    let w = load(&text).warnings_with(&set);
    assert!(
        w.iter().any(|w| w
            == "runs: store_password_env RUNS_PASS is not set; the gateway will not start without the store's password"),
        "{w:?}"
    );
    let all = |_: &str| Some(OsString::from("sk-test"));
    assert!(!load(&text)
        .warnings_with(&all)
        .iter()
        .any(|w| w.contains("store_password_env")));
}

/// `max_runs` bounds the memory store only: set beside a Redis store, it would look like a
/// bound that nothing enforces.
#[test]
fn max_runs_beside_a_redis_store_is_a_warning() {
    let set = |_: &str| Some(OsString::from("sk-test"));
    let redis = "store = \"redis://127.0.0.1:6379/0\"\n";
    let warned = |runs: &str| {
        load(&format!("[runs]\n{runs}\n{BASE}"))
            .warnings_with(&set)
            .into_iter()
            .any(|w| w.contains("max_runs"))
    };
    assert!(warned(&format!("{redis}max_runs = 500")));
    assert!(!warned(redis));
    assert!(!warned("max_runs = 500"));
}

/// Under `http2 = "auto"` a plain `http://` upstream speaks HTTP/1.1 (h2c only by prior
/// knowledge, `always`), so its `http2_*` keys do nothing: said, rather than accepted in
/// silence (`never` makes them errors).
#[test]
fn http2_keys_on_a_plain_auto_upstream_are_a_warning() {
    let set = |_: &str| Some(OsString::from("sk-test"));
    let warned = |url: &str, keys: &str| {
        let text = BASE.replace(
            "url = \"https://api.openai.com\"",
            &format!("url = \"{url}\"\n{keys}"),
        );
        load(&text)
            .warnings_with(&set)
            .into_iter()
            .any(|w| w.contains("http2_* keys have no effect"))
    };
    let keys = "http2_max_streams_per_connection = 10";
    assert!(warned("http://127.0.0.1:9", keys));
    assert!(!warned("http://127.0.0.1:9", ""));
    assert!(!warned("https://api.openai.com", keys));
    assert!(!warned(
        "http://127.0.0.1:9",
        &format!("http2 = \"always\"\n{keys}")
    ));
}

#[test]
fn describe_shows_an_ejection_policy_other_than_the_default() {
    let with = |extra: &str| {
        load(&BASE.replace(
            "url = \"https://api.openai.com\"",
            &format!("url = \"https://api.openai.com\"\n{extra}"),
        ))
        .describe()
    };
    assert!(!with("").contains("eject"), "{}", with(""));
    let d = with("eject_after = 2\neject_for = \"1m\"");
    assert!(
        d.contains(", ejected for 1m after 2 failed attempts in a row,"),
        "{d}"
    );
    let d = with("eject_after = 0");
    assert!(d.contains(", never ejected,"), "{d}");
}

/// Audit QC 1: on a route whose attempts may rewrite the body, the body and its copy each
/// hold their share of `request_body_memory`, so a body over half of it is refused (413)
/// even by an idle gateway. `check` says so where the memory is less than twice the route's
/// largest body; a route that never rewrites, or a memory twice as large, is not warned of.
#[test]
fn a_rewriting_route_whose_body_and_copy_exceed_the_memory_is_a_warning() {
    let set = |_: &str| Some(OsString::from("sk-test"));
    let warnings = |memory: u64, route_keys: &str| {
        let text = format!(
            "[server]\nmax_request_body = 2097152\nrequest_body_memory = {memory}\n{BASE}{route_keys}\n"
        );
        load(&text)
            .warnings_with(&set)
            .into_iter()
            .filter(|w| w.contains("request_body_memory"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        warnings(2097152, "stream_upstream = true"),
        ["route \"chat\": request_body_memory (2097152) is less than twice its max_request_body (2097152), and its attempts may rewrite the body (an upstream's model or include_usage, stream_upstream), whose copy holds its own share: a body over about 1048576 bytes will be refused (413)"]
    );
    // The route's own limit is the one that counts.
    assert_eq!(
        warnings(
            4194304,
            "stream_upstream = true\nmax_request_body = 3000000"
        )
        .len(),
        1
    );
    assert!(warnings(4194304, "stream_upstream = true").is_empty());
    assert!(warnings(2097152, "").is_empty());
    let model = BASE.replace(
        "url = \"https://api.openai.com\"",
        "url = \"https://api.openai.com\"\nmodel = \"gpt-4o-mini\"",
    );
    let text =
        format!("[server]\nmax_request_body = 2097152\nrequest_body_memory = 2097152\n{model}");
    assert!(load(&text)
        .warnings_with(&set)
        .iter()
        .any(|w| w.starts_with("route \"chat\": request_body_memory (2097152)")));
}
