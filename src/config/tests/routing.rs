//! Route matching: model globs, path prefixes on segment boundaries, and which routes an
//! earlier one makes unreachable.

use std::time::Duration;

use super::{err, load, BASE};
use crate::config::routing::shadows;
use crate::config::{glob_match, Route};

#[test]
fn glob_cases() {
    let yes = [
        ("o3*", "o3"),
        ("o3*", "o3-mini"),
        ("*mini", "gpt-4o-mini"),
        ("*mini", "mini"),
        ("gpt-?o", "gpt-4o"),
        ("*", ""),
        ("*", "anything"),
        ("", ""),
        ("a*b*c", "aXXbYYc"),
        ("*a*", "banana"),
        ("?", "é"),
        ("claude-*-4?", "claude-opus-45"),
        ("**", "x"),
    ];
    for (p, t) in yes {
        assert!(glob_match(p, t), "{p:?} should match {t:?}");
    }
    let no = [
        ("o3*", "gpt-o3"),
        ("*mini", "gpt-4o-mini-2024"),
        ("gpt-?o", "gpt-4"),
        ("gpt-?o", "gpt-45o"),
        ("", "x"),
        ("?", ""),
        ("?", "ab"),
        ("a*b*c", "aXXbYY"),
        ("O3*", "o3"),
    ];
    for (p, t) in no {
        assert!(!glob_match(p, t), "{p:?} should not match {t:?}");
    }
}

#[test]
fn glob_has_no_pathological_case() {
    let long = "a".repeat(100_000);
    let started = std::time::Instant::now();
    assert!(!glob_match("a*a*a*a*a*b", &long));
    assert!(glob_match("a*a*a*a*a*a", &long));
    assert!(!glob_match(&"*a".repeat(50), &"a".repeat(49)));
    assert!(started.elapsed() < Duration::from_secs(2));
}

fn route(prefix: &str, models: &[&str]) -> Route {
    let c = load(BASE);
    Route {
        path_prefix: prefix.to_owned(),
        models: models.iter().map(|m| (*m).to_owned()).collect(),
        ..c.routes[0].clone()
    }
}

#[test]
fn prefix_respects_segment_boundaries() {
    let r = route("/v1/chat", &[]);
    assert!(r.matches("/v1/chat", None));
    assert!(r.matches("/v1/chat/completions", None));
    assert!(r.matches("/v1/chat?stream=true", Some("gpt-4o")));
    assert!(!r.matches("/v1/chatter", None));
    assert!(!r.matches("/v1/cha", None));
    assert!(!r.matches("/v2/chat", None));

    let slash = route("/v1/chat/", &[]);
    assert!(slash.matches("/v1/chat/x", None));
    assert!(!slash.matches("/v1/chat", None));

    let root = route("/", &[]);
    assert!(root.matches("/", None));
    assert!(root.matches("/anything/at/all", None));
}

#[test]
fn models_filter_requires_a_matching_model() {
    let r = route("/v1/chat", &["o3*", "gpt-5?"]);
    assert!(r.matches("/v1/chat", Some("o3-pro")));
    assert!(r.matches("/v1/chat", Some("gpt-5o")));
    assert!(!r.matches("/v1/chat", Some("gpt-4o")));
    assert!(!r.matches("/v1/chat", None));
    assert!(!r.matches("/v1/chatter", Some("o3")));
}

#[test]
fn shadowing_considers_models() {
    let any = route("/v1", &[]);
    let o3 = route("/v1/chat", &["o3*"]);
    let o3_and_gpt = route("/v1/chat", &["o3*", "gpt*"]);
    let star = route("/v1/chat", &["*"]);
    assert!(shadows(&any, &o3));
    assert!(!shadows(&o3, &any));
    assert!(shadows(&o3_and_gpt, &o3));
    assert!(!shadows(&o3, &o3_and_gpt));
    assert!(shadows(&star, &o3_and_gpt));
    // A model-less route also serves requests without a model.
    assert!(!shadows(&star, &route("/v1/chat", &[])));
    assert!(!shadows(
        &route("/v1/chat", &[]),
        &route("/v1/chatter", &[])
    ));
}

/// A glob that takes every model a later route's glob takes makes it unreachable, not only
/// the same glob or `*`: `ft*` before `ftfb*` and `ftx` (the audit's config, which `check`
/// passed without a word).
#[test]
fn shadowing_reads_what_globs_cover() {
    let ft = route("/v1/chat", &["ft*"]);
    assert!(shadows(&ft, &route("/v1/chat", &["ftfb*"])));
    assert!(shadows(&ft, &route("/v1/chat", &["ftx"])));
    assert!(shadows(
        &ft,
        &route("/v1/chat/completions", &["ft-?", "ft"])
    ));
    assert!(!shadows(&ft, &route("/v1/chat", &["ftx", "gfb*"])));
    assert!(!shadows(&ft, &route("/v1/chat", &["f*"])));
    assert!(!shadows(&ft, &route("/v1/chat", &["*ft"])));
    let one = route("/v1/chat", &["gpt-?"]);
    assert!(shadows(&one, &route("/v1/chat", &["gpt-5"])));
    assert!(shadows(&one, &route("/v1/chat", &["gpt-?"])));
    assert!(!shadows(&one, &route("/v1/chat", &["gpt-*"])));
    assert!(!shadows(&one, &route("/v1/chat", &["gpt-??"])));
    let mid = route("/v1/chat", &["claude-*-4*"]);
    assert!(shadows(&mid, &route("/v1/chat", &["claude-sonnet-4-5"])));
    assert!(shadows(&mid, &route("/v1/chat", &["claude-*-4-5*"])));
    assert!(!shadows(&mid, &route("/v1/chat", &["claude-*"])));
}

#[test]
fn glob_covers_is_never_wider_than_matching() {
    use crate::config::routing::glob_covers;
    // Every model of a few shapes: when `wide` covers `narrow`, whatever `narrow` matches,
    // `wide` matches too.
    let globs = [
        "*", "a*", "*a", "a?", "?a", "a*b", "a?b", "ab", "a**", "*?*", "??", "a*a*",
    ];
    let models = [
        "", "a", "b", "ab", "ba", "aa", "abb", "aab", "axb", "abab", "bab",
    ];
    for wide in globs {
        for narrow in globs {
            if glob_covers(wide, narrow) {
                for m in models {
                    assert!(
                        !glob_match(narrow, m) || glob_match(wide, m),
                        "{wide:?} covers {narrow:?} but not {m:?}"
                    );
                }
            }
        }
    }
    assert!(glob_covers("a*", "a*b"));
    assert!(glob_covers("*", "a?"));
    assert!(!glob_covers("a?", "a*"));
}

#[test]
fn balance_with_joins_the_chain_once_and_may_be_hedged_with() {
    let three = format!(
        "{BASE}balance_with = [\"anthropic\"]\n\n[upstreams.backup]\nurl = \"https://b.example\"\n"
    );
    let text = three.replace(
        "balance_with = [\"anthropic\"]\n",
        "balance_with = [\"anthropic\"]\nfallbacks = [\"backup\"]\nhedge_after = \"1s\"\n",
    );
    let c = load(&text);
    let r = &c.routes[0];
    let chain: Vec<&str> = r.chain().map(|u| u.name.as_str()).collect();
    assert_eq!(chain, ["openai", "anthropic", "backup"]);
    assert_eq!(r.policy.balanced.len(), 1);
    assert!(r.policy.holds_head());
    let d = c.describe();
    assert!(
        d.contains("balance_with: anthropic (each request starts at the least busy)\n    anthropic (https://api.anthropic.com, auth x-api-key, propagate_budget"),
        "{d}"
    );
    // Every upstream of the chain is shown as the route's own is: each serves some requests.
    assert!(
        d.contains(
            "  fallbacks: backup\n    backup (https://b.example, auth bearer, propagate_budget"
        ),
        "{d}"
    );
    // Hedging needs another upstream, which balance_with gives.
    load(&format!(
        "{BASE}balance_with = [\"anthropic\"]\nhedge_after = \"1s\"\n"
    ));
    assert_eq!(
        err(&format!("{BASE}hedge_after = \"1s\"\n")),
        "t.toml: route \"chat\": hedge_after needs another upstream to hedge with, in fallbacks or balance_with"
    );
    assert_eq!(
        err(&format!("{BASE}balance_with = [\"openai\"]\n")),
        "t.toml: route \"chat\": balance_with[0] (\"openai\") is already in the route's chain; each upstream is tried once (use retries for more attempts)"
    );
    assert_eq!(
        err(&format!(
            "{BASE}balance_with = [\"anthropic\"]\nfallbacks = [\"anthropic\"]\n"
        )),
        "t.toml: route \"chat\": fallbacks[0] (\"anthropic\") is already in the route's chain; each upstream is tried once (use retries for more attempts)"
    );
    assert_eq!(
        err(&format!("{BASE}balance_with = [\"azure\"]\n")),
        "t.toml: route \"chat\": balance_with[0] names upstream \"azure\", which is not defined (known: anthropic, openai)"
    );
}
