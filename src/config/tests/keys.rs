//! Admission limits, client keys and provider key files: how they resolve, how they fail,
//! and that a key written into the file is warned about and never repeated.

use std::ffi::OsString;
use std::path::PathBuf;

use super::{err, load, with_route_keys, BASE};
use crate::config::{looks_like_secret, ClientAuth};

#[test]
fn admission_and_client_key_settings_resolve() {
    let c = load(&with_route_keys(
        "max_in_flight = 8\nclient_keys_env = \"CHAT_KEYS\"\nclient_keys_file = \"keys/chat\"",
    ));
    let r = &c.routes[0];
    assert_eq!(r.max_in_flight, Some(8));
    assert_eq!(
        r.client_auth,
        Some(ClientAuth {
            env: Some("CHAT_KEYS".into()),
            file: Some(PathBuf::from("config/keys/chat")),
        })
    );
    let d = c.describe();
    assert!(d.contains("  max_in_flight: 8\n"), "{d}");
    assert!(
        d.contains("  client keys: client_keys_env CHAT_KEYS, client_keys_file config/keys/chat\n"),
        "{d}"
    );
    let open = load(BASE);
    assert_eq!(open.routes[0].max_in_flight, None);
    assert_eq!(open.routes[0].client_auth, None);
}

#[test]
fn admission_and_client_key_errors_name_route_and_key() {
    assert_eq!(
        err(&with_route_keys("max_in_flight = 0")),
        "t.toml: route \"chat\": max_in_flight must be greater than 0 (omit it for no limit)"
    );
    assert_eq!(
        err(&with_route_keys("max_in_flight = 2000000")),
        "t.toml: route \"chat\": max_in_flight (2000000) must be at most 1000000"
    );
    assert_eq!(
        err(&with_route_keys("client_keys_env = \"\"")),
        "t.toml: route \"chat\": client_keys_env \"\" is not a valid environment variable name"
    );
    assert_eq!(
        err(&with_route_keys("client_keys_file = \"\"")),
        "t.toml: route \"chat\": client_keys_file must not be empty"
    );
}

#[test]
fn provider_key_file_is_resolved_and_exclusive_with_the_variable() {
    let c = load(&BASE.replace(
        "url = \"https://api.openai.com\"\n",
        "url = \"https://api.openai.com\"\napi_key_file = \"secrets/openai\"\n",
    ));
    assert_eq!(
        c.upstreams[0].api_key_file,
        Some(PathBuf::from("config/secrets/openai"))
    );
    assert!(c
        .describe()
        .contains(", api_key_file config/secrets/openai"));
    assert_eq!(
        err(&BASE.replace(
            "url = \"https://api.openai.com\"\n",
            "url = \"https://api.openai.com\"\napi_key_env = \"K\"\napi_key_file = \"k\"\n",
        )),
        "t.toml: upstream \"openai\": api_key_env and api_key_file are both set; use one"
    );
}

/// Audit PC 4: the account the gateway's key acts for is the operator's to pin.
#[test]
fn the_account_of_the_provider_key_is_pinned_beside_a_key_alone() {
    let pinned = |extra: &str| {
        BASE.replace(
            "url = \"https://api.openai.com\"\n",
            &format!("url = \"https://api.openai.com\"\n{extra}"),
        )
    };
    let c = load(&pinned(
        "api_key_env = \"K\"\norganization = \"org-abc\"\nproject = \"proj_1\"\n",
    ));
    assert_eq!(c.upstreams[0].organization.as_deref(), Some("org-abc"));
    assert_eq!(c.upstreams[0].project.as_deref(), Some("proj_1"));
    assert!(c
        .describe()
        .contains(", organization org-abc, project proj_1"));
    assert_eq!(
        err(&pinned("organization = \"org-abc\"\n")),
        "t.toml: upstream \"openai\": organization names the account the upstream's key acts \
         for, but the gateway sends no key here: set api_key_env or api_key_file"
    );
    assert_eq!(
        err(&pinned(
            "api_key_env = \"K\"\nauth = \"none\"\nproject = \"proj_1\"\n"
        )),
        "t.toml: upstream \"openai\": project names the account the upstream's key acts for, \
         but the gateway sends no key here: set api_key_env or api_key_file"
    );
    for bad in ["", "org abc", "org-\u{e9}"] {
        assert_eq!(
            err(&pinned(&format!(
                "api_key_env = \"K\"\norganization = \"{bad}\"\n"
            ))),
            "t.toml: upstream \"openai\": organization must be an id such as org-... or \
             proj_... (visible ASCII, no spaces)",
            "{bad:?}"
        );
    }
}

#[test]
fn inlined_keys_are_warned_about_and_never_repeated() {
    const CANARY: &str = "sk-proj-CANARY0123456789abcdefXYZ";
    let text = BASE.replace(
        "url = \"https://api.openai.com\"\n",
        &format!("url = \"https://api.openai.com\"\napi_key_env = \"{CANARY}\"\n"),
    ) + "models = [\"gpt-4o\", \"AbCdEfGhIjKlMnOpQrStUvWxYz0123456789\"]\n";
    let c = load(&text);
    let w = c.warnings_with(&|_| None);
    assert_eq!(
        &w[..2],
        [
            "routes[0].models[1] looks like an inlined API key; keep keys out of the config file (use api_key_env or api_key_file)",
            "upstreams.openai.api_key_env looks like an inlined API key; keep keys out of the config file (use api_key_env or api_key_file)",
        ]
    );
    let d = c.describe();
    let all = format!("{w:?}{d}{c:?}");
    // Debug of the config holds the raw setting; warnings and describe must not.
    assert!(!format!("{w:?}{d}").contains("CANARY"), "{all}");
    assert!(
        d.contains("api_key_env (a name not shown: it may be the secret itself)"),
        "{d}"
    );
    // An invalid variable name is refused without echoing what looks like a key.
    let e = err(&BASE.replace(
        "url = \"https://api.openai.com\"\n",
        "url = \"https://api.openai.com\"\napi_key_env = \"sk-ant-api03-abc=def0123456789\"\n",
    ));
    assert!(!e.contains("abc=def"), "{e}");
    // Ordinary names, model names and URLs are not keys.
    for ok in [
        "OPENAI_API_KEY",
        "gpt-4o-mini-2024-07-18",
        "claude-3-5-sonnet-20241022",
        "https://api.openai.com/v1",
        "accounts/fireworks/models/llama-v3p1-405b-instruct",
        "/v1/chat/completions",
        "Llama-4-Maverick-17B-128E-Instruct-FP8",
        "meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8",
        "DeepSeek-R1-Distill-Llama-70B-FP8-dynamic",
        "Qwen2.5-Coder-32B-Instruct-AWQ",
    ] {
        assert!(!looks_like_secret(ok), "{ok}");
    }
    for key in [
        "sk-abcdefghijklmnop",
        "sk-ant-api03-xxxxxxxxxxxx",
        "xai-0123456789abcdef",
        "AIzaSyD-0123456789abcdefghijkl",
        "fw_3ZkQ9pL2xV7mN4rT8wYb6cJd",
        "3f9a1c0e5b7d4e2a8c6b1d0f9e8a7c6b",
    ] {
        assert!(looks_like_secret(key), "{key}");
    }
}

/// A key pasted into an upstream URL's path is masked where the URL is shown, and warned of
/// as a key written into any other value is: `check` printed `https://api.openai.com/v1/***`
/// and nothing told the operator to move the key (audit PE 3). Only the surer signs count in
/// a URL (a key's prefix, or a long run mixing digits and both cases), since a path holds ids
/// (a Cloudflare account's 32 hex digits) that are no keys.
#[test]
fn a_key_in_an_upstream_url_is_warned_about() {
    const KEY: &str = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef012345";
    let warned = "upstreams.openai.url looks like it holds an inlined API key (masked where the \
                  URL is shown); keep keys out of the config file (use api_key_env or \
                  api_key_file)";
    for url in [
        format!("https://api.openai.com/v1/{KEY}"),
        format!("https://api.openai.com/{KEY}/v1"),
        "https://api.openai.com/v1/AbCdEfGhIjKlMnOpQrStUvWxYz0123456789".to_owned(),
    ] {
        let c = load(&BASE.replace(
            "url = \"https://api.openai.com\"\n",
            &format!("url = {url:?}\n"),
        ));
        let w = c.warnings_with(&|_| None);
        assert!(w.iter().any(|w| w == warned), "{url}: {w:?}");
        assert!(
            !format!("{w:?}{}", c.describe()).contains("ABCDEFGH"),
            "{w:?}"
        );
    }
    // Ids in a path, and model names, are not keys.
    for url in [
        "https://gateway.ai.cloudflare.com/v1/3f9a1c0e5b7d4e2a8c6b1d0f9e8a7c6b/my-gateway/openai",
        "https://api.fireworks.ai/inference/v1/accounts/fireworks/models/llama-v3p1-405b-instruct",
        "https://x.openai.azure.com/openai/deployments/gpt-4o-mini-2024-07-18",
        "https://h/v1/models/Llama-4-Maverick-17B-128E-Instruct-FP8",
    ] {
        let c = load(&BASE.replace(
            "url = \"https://api.openai.com\"\n",
            &format!("url = {url:?}\n"),
        ));
        let w = c.warnings_with(&|_| None);
        assert!(!w.iter().any(|w| w.contains("inlined")), "{url}: {w:?}");
    }
}

#[test]
fn key_sources_are_checked_by_warnings() {
    let dir = tempfile::Builder::new()
        .prefix("hourglass-cfg-keys-")
        .tempdir()
        .unwrap();
    let key = dir.path().join("openai.key");
    std::fs::write(&key, "sk-test\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let text = BASE.replace(
        "url = \"https://api.openai.com\"\n",
        &format!(
            "url = \"https://api.openai.com\"\napi_key_file = \"{}\"\n",
            key.display()
        ),
    ) + "client_keys_env = \"CHAT_KEYS\"\nclient_keys_file = \"/nonexistent/keys\"\n\n\
         [[routes]]\nname = \"msgs\"\npath_prefix = \"/v1/messages\"\nupstream = \"anthropic\"\n\
         client_keys_env = \"MSG_KEYS\"\n";
    let c = load(&text);
    let w = c.warnings_with(&|name| (name == "MSG_KEYS").then(OsString::new));
    let expect_mode = if cfg!(unix) {
        vec![format!(
            "upstream \"openai\": api_key_file {} is open to every user (mode 644); chmod 600 it",
            key.display()
        )]
    } else {
        vec![]
    };
    let mut expected = expect_mode;
    expected.extend([
        "route \"chat\": client_keys_env CHAT_KEYS is not set; the gateway will not start without the route's keys".to_owned(),
        "route \"chat\": client_keys_file /nonexistent/keys: No such file or directory (os error 2); the gateway will not start without it".to_owned(),
        "route \"msgs\": clients authenticate with their gateway keys, which are never passed on, and upstream \"anthropic\" has no key of its own".to_owned(),
    ]);
    assert_eq!(w, expected);
    dir.close().unwrap();
}

/// The files the watcher follows for a refused config (read from the text) are the files a
/// loaded config names: the two lists are written apart, and must not drift.
#[test]
fn the_files_named_by_the_text_are_the_files_of_the_config() {
    let text = with_route_keys("client_keys_file = \"keys/chat\"")
        .replace(
            "url = \"https://api.openai.com\"\n",
            "url = \"https://api.openai.com\"\napi_key_file = \"secrets/openai\"\nca_file = \"ca.pem\"\n",
        )
;
    // An upstream under auth "none" reads no key file: a change to it is no reason to reload.
    let text = format!(
        "[server.tls]\ncert = \"tls/cert.pem\"\nkey = \"tls/key.pem\"\nclient_ca = \"tls/ca.pem\"\n\
         client_crl = \"tls/clients.crl\"\n\n{text}\n[upstreams.local]\nurl = \"http://127.0.0.1:8000\"\n\
         auth = \"none\"\napi_key_file = \"secrets/local\"\n"
    );
    let c = load(&text);
    let mut from_config: Vec<PathBuf> = c.files().into_iter().map(PathBuf::from).collect();
    from_config.sort_unstable();
    assert_eq!(from_config.len(), 7, "{from_config:?}");
    assert!(from_config.contains(&PathBuf::from("config/tls/clients.crl")));
    assert!(!from_config.contains(&PathBuf::from("config/secrets/local")));
    let from_text = crate::config::Config::files_named(&text, Some(std::path::Path::new("config")));
    assert_eq!(from_text, from_config);
}

/// Every upstream a route may send its requests to needs a key of its own when its clients
/// use gateway keys: those balanced with its upstream take their share of requests, and
/// its fallbacks take the rest, each answering 401 without one.
#[test]
fn every_upstream_of_a_route_with_client_keys_is_checked_for_a_key() {
    let text = format!(
        "{BASE}client_keys_env = \"CHAT_KEYS\"\nbalance_with = [\"spare\"]\n\
         fallbacks = [\"backup\"]\n\n\
         [upstreams.spare]\nurl = \"https://spare.example\"\n\n\
         [upstreams.backup]\nurl = \"https://backup.example\"\napi_key_env = \"BACKUP_KEY\"\n"
    )
    .replace(
        "url = \"https://api.openai.com\"\n",
        "url = \"https://api.openai.com\"\napi_key_env = \"OPENAI_KEY\"\n",
    );
    let c = load(&text);
    let w = c.warnings_with(&|_| Some(OsString::from("set")));
    assert_eq!(
        w,
        [
            "upstream \"anthropic\" is not used by any route",
            "route \"chat\": clients authenticate with their gateway keys, which are never passed on, and upstream \"spare\" has no key of its own",
        ]
    );
}

/// A named key that the environment does not hold is no key either: on a route whose
/// clients use gateway keys nothing is passed on in its place, so the upstream answers 401.
/// Where clients' own credentials do pass through, the warning says so, and only there.
#[cfg(unix)]
#[test]
fn a_key_variable_unset_or_empty_is_no_key_on_a_route_with_client_keys() {
    let text = format!(
        "{BASE}client_keys_env = \"CHAT_KEYS\"\nfallbacks = [\"backup\"]\n\n\
         [upstreams.backup]\nurl = \"https://backup.example\"\napi_key_env = \"BACKUP_KEY\"\n\n\
         [upstreams.shared]\nurl = \"https://shared.example\"\napi_key_env = \"SHARED_KEY\"\n\n\
         [upstreams.idle]\nurl = \"https://idle.example\"\napi_key_env = \"IDLE_KEY\"\n\n\
         [[routes]]\nname = \"open\"\npath_prefix = \"/v1/open\"\nupstream = \"shared\"\n\n\
         [[routes]]\nname = \"msgs\"\npath_prefix = \"/v1/messages\"\nupstream = \"anthropic\"\n\
         fallbacks = [\"shared\"]\nclient_keys_env = \"CHAT_KEYS\"\n"
    )
    .replace(
        "url = \"https://api.openai.com\"\n",
        "url = \"https://api.openai.com\"\napi_key_env = \"OPENAI_KEY\"\n",
    )
    .replace(
        "auth = \"x-api-key\"\n",
        "auth = \"x-api-key\"\napi_key_env = \"ANTHROPIC_KEY\"\n",
    );
    let c = load(&text);
    let env = |name: &str| match name {
        "CHAT_KEYS" => Some(OsString::from("set")),
        "BACKUP_KEY" => Some(OsString::from("  ")),
        // As std::env::var reads it, no key at all.
        "ANTHROPIC_KEY" => Some(std::os::unix::ffi::OsStringExt::from_vec(vec![0xff, 0xfe])),
        _ => None,
    };
    assert_eq!(
        c.warnings_with(&env),
        [
            "upstream \"shared\": api_key_env SHARED_KEY is not set; the client's own credentials will be passed through",
            "upstream \"idle\" is not used by any route",
            "route \"chat\": clients authenticate with their gateway keys, which are never passed on, and upstream \"openai\" has no key of its own: api_key_env OPENAI_KEY is not set",
            "route \"chat\": clients authenticate with their gateway keys, which are never passed on, and upstream \"backup\" has no key of its own: api_key_env BACKUP_KEY is set but empty",
            "route \"msgs\": clients authenticate with their gateway keys, which are never passed on, and upstream \"anthropic\" has no key of its own: api_key_env ANTHROPIC_KEY is set but not valid UTF-8",
            "route \"msgs\": clients authenticate with their gateway keys, which are never passed on, and upstream \"shared\" has no key of its own: api_key_env SHARED_KEY is not set",
        ]
    );
}

/// `check` shows a key source that `auth = "none"` leaves unread as ignored, as its warning
/// says, not as a key the upstream is sent.
#[test]
fn a_key_source_under_auth_none_is_shown_as_ignored() {
    let text = BASE.replace(
        "url = \"https://api.openai.com\"\n",
        "url = \"https://api.openai.com\"\nauth = \"none\"\napi_key_file = \"secrets/openai\"\n",
    );
    let d = load(&text).describe();
    assert!(
        d.contains(
            "upstream: openai (https://api.openai.com, auth none, api_key_file config/secrets/openai (ignored), "
        ),
        "{d}"
    );
    let keyed = BASE.replace(
        "url = \"https://api.openai.com\"\n",
        "url = \"https://api.openai.com\"\napi_key_env = \"K\"\n",
    );
    let d = load(&keyed).describe();
    assert!(d.contains("auth bearer, api_key_env K, "), "{d}");
    assert!(!d.contains("(ignored)"), "{d}");
}

/// Audit PC 3 (a): a route may raise or lower `[server] max_request_body` (Files and audio
/// uploads are far larger than a chat body); `check` prints it.
#[test]
fn a_route_sets_its_own_max_request_body() {
    let c = load(&with_route_keys("max_request_body = 104857600"));
    assert_eq!(c.routes[0].max_request_body, Some(104_857_600));
    let d = c.describe();
    assert!(d.contains("  max_request_body: 104857600 bytes\n"), "{d}");
    assert_eq!(load(BASE).routes[0].max_request_body, None);
}

/// ... never 0, and never more than the bodies' memory, which could not hold it; the error
/// names the route by its index and key, and the value.
#[test]
fn a_routes_max_request_body_errors_name_route_key_and_value() {
    assert_eq!(
        err(&with_route_keys("max_request_body = 0")),
        "t.toml: routes[0].max_request_body must be greater than 0 (omit it for [server] max_request_body)"
    );
    assert_eq!(
        err(&with_route_keys("max_request_body = 300000000")),
        "t.toml: routes[0].max_request_body (300000000) must be at most [server] request_body_memory (268435456), or no body of that size could be read"
    );
}

/// Audit VB 3: `check` masks the `headers` values whose names look like a credential's (a
/// peer gateway's own key beside the provider's), and shows the others.
#[test]
fn check_masks_header_values_whose_names_look_secret() {
    let c = load(&BASE.replace(
        "url = \"https://api.openai.com\"\n",
        "url = \"https://api.openai.com\"\napi_key_env = \"K\"\nheaders = { \
         \"x-bt-api-key\" = \"bt-SECRET\", \"x-kong-api-key\" = \"kong-SECRET\", \
         \"cookie\" = \"session=SECRET\", \"x-peer-token\" = \"t-SECRET\", \
         \"x-session-id\" = \"s-SECRET\", \"x-db-password\" = \"p-SECRET\", \
         \"x-team\" = \"blue\" }\n",
    ));
    let shown = c.describe();
    assert!(!shown.contains("SECRET"), "{shown}");
    for name in [
        "x-bt-api-key",
        "x-kong-api-key",
        "cookie",
        "x-peer-token",
        "x-session-id",
        "x-db-password",
    ] {
        assert!(
            shown.contains(&format!("header {name}: ***")),
            "{name}: {shown}"
        );
    }
    assert!(shown.contains("header x-team: blue"), "{shown}");
}

/// Audit UD 1 and UD 2: an upstream's `headers` and `hide_headers` load checked, and `check`
/// shows them (the value of a header that may carry a peer's credentials masked).
#[test]
fn an_upstreams_headers_and_hidden_headers_are_checked_and_shown() {
    let with = |extra: &str| {
        BASE.replace(
            "url = \"https://api.openai.com\"\n",
            &format!("url = \"https://api.openai.com\"\n{extra}"),
        )
    };
    let c = load(&with(
        "api_key_env = \"K\"\nheaders = { \"x-portkey-provider\" = \"openai\", \
         \"x-portkey-virtual-key\" = \"vk-1\" }\nhide_headers = [\"x-litellm-*\", \"server\"]\n",
    ));
    let shown = c.describe();
    assert!(
        shown.contains(
            ", header x-portkey-provider: openai, header x-portkey-virtual-key: ***, \
             hide_headers x-litellm-* server"
        ),
        "{shown}"
    );
    assert_eq!(
        err(&with("headers = { \"Authorization\" = \"Bearer x\" }\n")),
        "t.toml: upstream \"openai\": headers: authorization cannot be set here: the gateway \
         sends the upstream's key itself (api_key_env, api_key_file, auth)"
    );
    assert_eq!(
        err(&with("hide_headers = [\"content-*\"]\n")),
        "t.toml: upstream \"openai\": hide_headers: content-* would hide content-type, which \
         the gateway reads the answer's body by"
    );
}

/// Audit WB 3: Azure OpenAI's and Gemini's key headers are `auth` modes, shown by `check`;
/// `headers` still refuses them, and says which `auth` sends the key there.
#[test]
fn azure_and_gemini_key_headers_are_auth_modes() {
    let with = |extra: &str| {
        BASE.replace(
            "url = \"https://api.openai.com\"\n",
            &format!("url = \"https://api.openai.com\"\n{extra}"),
        )
    };
    for auth in ["api-key", "x-goog-api-key"] {
        let c = load(&with(&format!(
            "api_key_env = \"AZURE_KEY\"\nauth = \"{auth}\"\n"
        )));
        let shown = c.describe();
        assert!(
            shown.contains(&format!(
                "openai (https://api.openai.com, auth {auth}, api_key_env AZURE_KEY"
            )),
            "{shown}"
        );
        assert_eq!(
            err(&with(&format!("headers = {{ \"{auth}\" = \"k\" }}\n"))),
            format!(
                "t.toml: upstream \"openai\": headers: {auth} cannot be set here: the gateway \
                 sends the upstream's key itself: set api_key_env or api_key_file, and auth = \"{auth}\""
            )
        );
    }
}
