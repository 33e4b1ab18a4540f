//! The `proxy` key and the environment's proxy rules (audit RA 1).

use super::{err, load, BASE};
use crate::config::ProxyEnv;

fn with_proxy(value: &str) -> String {
    BASE.replacen(
        "url = \"https://api.openai.com\"\n",
        &format!("url = \"https://api.openai.com\"\nproxy = \"{value}\"\n"),
        1,
    )
}

#[test]
fn a_proxy_it_cannot_use_is_refused_naming_the_key_with_its_password_masked() {
    for (value, why) in [
        ("https://u:hunter2@proxy.corp:3128", "only http:// proxies"),
        ("socks5://u:hunter2@proxy.corp:1080", "only http:// proxies"),
        ("http://u:hunter2@proxy.corp", "needs a host and a port"),
        ("http://u:hunter2@proxy.corp:3128/path", "no path or query"),
        ("proxy.corp:3128", "only http:// proxies"),
    ] {
        let e = err(&with_proxy(value));
        assert!(e.contains("upstreams.openai.proxy"), "{value}: {e}");
        assert!(e.contains(why), "{value}: {e}");
        assert!(!e.contains("hunter2"), "{value}: {e}");
    }
}

#[test]
fn check_shows_the_proxy_masked_or_none() {
    let d = load(&with_proxy("http://u:hunter2@proxy.corp:3128")).describe();
    assert!(d.contains(", proxy http://u:***@proxy.corp:3128"), "{d}");
    assert!(!d.contains("hunter2"), "{d}");
    let config = load(&with_proxy("http://u:hunter2@proxy.corp:3128"));
    assert!(!format!("{config:?}").contains("hunter2"));
    let d = load(&with_proxy("none")).describe();
    assert!(d.contains(", proxy none"), "{d}");
}

#[test]
fn the_environments_rules_pick_the_proxy_by_scheme_and_no_proxy() {
    let config = load(BASE);
    let up = &config.upstreams[0];
    let target = |env: &ProxyEnv, url: &str| {
        up.proxy
            .target(&url.parse().unwrap(), env)
            .unwrap()
            .map(|p| (p.uri.to_string(), p.shown, p.auth.is_some()))
    };
    let env = ProxyEnv::from_values(
        "",
        "http://plain:3128",
        "http://me:pw@secure:3129",
        "internal.example, 10.0.0.0/8",
    );
    assert_eq!(
        target(&env, "https://api.openai.com"),
        Some((
            "http://secure:3129/".to_owned(),
            "http://me:***@secure:3129".to_owned(),
            true
        ))
    );
    assert_eq!(
        target(&env, "http://api.example"),
        Some((
            "http://plain:3128/".to_owned(),
            "http://plain:3128".to_owned(),
            false
        ))
    );
    for direct in [
        "https://llm.internal.example",
        "https://internal.example:8443",
        "http://10.1.2.3:8000",
        "http://127.0.0.1:8000",
        "http://localhost:8000",
        "http://[::1]:8000",
    ] {
        assert_eq!(target(&env, direct), None, "{direct}");
    }
    // ALL_PROXY for either scheme; a SOCKS proxy is refused rather than ignored.
    let env = ProxyEnv::from_values("http://all:1", "", "", "");
    assert!(target(&env, "https://api.openai.com").is_some());
    let env = ProxyEnv::from_values("socks5://u:pw@all:1080", "", "", "");
    let e = up
        .proxy
        .target(&"https://api.openai.com".parse().unwrap(), &env)
        .unwrap_err();
    assert!(e.contains("socks5://u:***@all:1080"), "{e}");
    // No rules: direct.
    let env = ProxyEnv::from_values("", "", "", "");
    assert_eq!(target(&env, "https://api.openai.com"), None);
}

/// Audit QC 2: a lone `*` exempts every host, IPs included, as curl reads it; loopback is
/// recognised as `localhost.` and as an IPv4-mapped address too.
#[test]
fn no_proxy_star_and_every_loopback_spelling_go_direct() {
    let config = load(BASE);
    let up = &config.upstreams[0];
    let direct = |env: &ProxyEnv, url: &str| {
        up.proxy
            .target(&url.parse().unwrap(), env)
            .unwrap()
            .is_none()
    };
    let env = ProxyEnv::from_values("", "http://q:w@127.0.0.1:61619", "", "*");
    for url in [
        "http://10.1.2.3:61601",
        "http://[::ffff:127.0.0.1]:61601",
        "http://up.example.com",
    ] {
        assert!(direct(&env, url), "{url}");
    }
    let env = ProxyEnv::from_values("", "http://q:w@127.0.0.1:61619", "", "");
    for url in ["http://[::ffff:127.0.0.1]:61601", "http://localhost.:8000"] {
        assert!(direct(&env, url), "{url}");
    }
    assert!(!direct(&env, "http://10.1.2.3:61601"));
}

/// Audit QC 3: a variable the gateway cannot read is refused, naming it with its value
/// masked, rather than dropped (requests going direct) or read with another host.
#[test]
fn a_malformed_proxy_variable_is_refused_naming_it() {
    let config = load(BASE);
    let up = &config.upstreams[0];
    let url: http::Uri = "https://api.openai.com".parse().unwrap();
    for bad in [
        "http://u:pa ss@127.0.0.1:61619",
        "http://[::1:61619",
        "http://u:pa#ss@127.0.0.1:61619",
        "http://[::1%25lo]:61618",
        "http://h:0",
    ] {
        let env = ProxyEnv::from_values("", "", bad, "");
        let e = up.proxy.target(&url, &env).unwrap_err();
        assert!(e.contains("HTTPS_PROXY"), "{bad}: {e}");
        assert!(!e.contains("pa ss") && !e.contains("pa#ss"), "{bad}: {e}");
    }
    // Without a scheme it is http://, as curl reads it, and shown with its port.
    let env = ProxyEnv::from_values("", "", "127.0.0.1:61619", "");
    let p = up.proxy.target(&url, &env).unwrap().unwrap();
    assert_eq!(p.uri.to_string(), "http://127.0.0.1:61619/");
    assert_eq!(p.shown, "http://127.0.0.1:61619");
}

/// Audit QC 4: the `proxy` key takes no IPv6 zone id and no port 0 (each request would
/// fail as a DNS error).
#[test]
fn a_proxy_key_with_a_zone_id_or_port_zero_is_refused() {
    for (value, why) in [
        ("http://[::1%25lo]:61618", "zone id"),
        ("http://h:0", "1 to 65535"),
    ] {
        let e = err(&with_proxy(value));
        assert!(
            e.contains("upstreams.openai.proxy") && e.contains(why),
            "{value}: {e}"
        );
    }
}
