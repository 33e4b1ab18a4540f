//! Valid configs: every key resolves, built-in defaults apply, and paths are anchored at the
//! config file.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::{load, secs, BASE, FULL};
use crate::config::{AuthMode, ClientCert, Config, ConfigError, Limits, ServerConfig};

#[test]
fn full_example_resolves() {
    let c = load(FULL);
    assert_eq!(c.source, "config/hourglass.toml");
    assert_eq!(
        c.server,
        ServerConfig {
            listen: "0.0.0.0:8000".parse().unwrap(),
            admin_listen: "127.0.0.1:9100".parse().unwrap(),
            max_request_body: 2048,
            max_response_body: 16 * 1024 * 1024,
            request_body_memory: 256 * 1024 * 1024,
            response_body_memory: 256 * 1024 * 1024,
            header_read_timeout: secs(5),
            shutdown_grace: secs(60),
            drain_delay: secs(5),
            send_timeout: secs(20),
            max_connections: Some(500),
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            http2_max_concurrent_streams: 256,
            tls: None,
        }
    );

    // File order, not alphabetical.
    let names: Vec<&str> = c.upstreams.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["openai", "anthropic"]);
    let openai = &c.upstreams[0];
    assert_eq!(openai.url, "https://api.openai.com/");
    assert_eq!(openai.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
    assert_eq!(openai.auth, AuthMode::Bearer);
    assert_eq!(
        openai.ca_file.as_deref(),
        Some(Path::new("config/certs/ca.pem"))
    );
    assert!(openai.propagate_budget);
    let anthropic = &c.upstreams[1];
    assert_eq!(anthropic.url.path(), "/anthropic", "trailing slash trimmed");
    assert_eq!(anthropic.auth, AuthMode::XApiKey);
    assert_eq!(anthropic.ca_file, None);
    assert!(!anthropic.propagate_budget);

    let names: Vec<&str> = c.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["reasoning", "chat", "messages"]);
    let defaults = Limits {
        budget: secs(45),
        max_budget: secs(600),
        connect_timeout: secs(2),
        first_token_timeout: secs(15),
        idle_timeout: secs(20),
        reserve: Duration::from_millis(250),
        min_useful: Duration::from_millis(100),
    };

    let reasoning = &c.routes[0];
    assert_eq!(reasoning.models, ["o3*", "gpt-5?"]);
    assert!(reasoning.needs_model());
    assert!(Arc::ptr_eq(&reasoning.upstream, openai));
    assert_eq!(
        reasoning.limits,
        Limits {
            budget: secs(300),
            first_token_timeout: secs(120),
            ..defaults
        }
    );

    let chat = &c.routes[1];
    assert!(chat.models.is_empty());
    assert!(!chat.needs_model());
    assert!(Arc::ptr_eq(&chat.upstream, openai));
    assert_eq!(
        chat.limits,
        Limits {
            budget: secs(8),
            first_token_timeout: secs(5),
            idle_timeout: secs(3),
            ..defaults
        }
    );

    let messages = &c.routes[2];
    assert_eq!(messages.path_prefix, "/v1/messages");
    assert!(Arc::ptr_eq(&messages.upstream, anthropic));
    assert_eq!(messages.limits, defaults);
}

#[test]
fn built_in_defaults_apply() {
    let c = load(BASE);
    assert_eq!(
        c.server,
        ServerConfig {
            listen: "127.0.0.1:8080".parse().unwrap(),
            admin_listen: "127.0.0.1:9090".parse().unwrap(),
            max_request_body: 10 * 1024 * 1024,
            max_response_body: 16 * 1024 * 1024,
            request_body_memory: 256 * 1024 * 1024,
            response_body_memory: 256 * 1024 * 1024,
            header_read_timeout: secs(10),
            shutdown_grace: secs(30),
            drain_delay: Duration::ZERO,
            send_timeout: secs(60),
            max_connections: None,
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            http2_max_concurrent_streams: 256,
            tls: None,
        }
    );
    assert_eq!(
        c.routes[0].limits,
        Limits {
            budget: secs(60),
            max_budget: secs(600),
            connect_timeout: secs(2),
            first_token_timeout: secs(30),
            idle_timeout: secs(20),
            reserve: Duration::ZERO,
            min_useful: Duration::from_millis(100),
        }
    );
}

#[test]
fn load_reads_file_and_resolves_ca_file_next_to_it() {
    let dir = tempfile::Builder::new()
        .prefix("hourglass-config-test-")
        .tempdir()
        .unwrap();
    let path = dir.path().join("hourglass.toml");
    let text = BASE.replace(
        "url = \"https://api.openai.com\"",
        "url = \"https://api.openai.com\"\nca_file = \"ca.pem\"",
    );
    std::fs::write(&path, text).unwrap();
    let c = Config::load(&path).unwrap();
    assert_eq!(c.source, path.display().to_string());
    assert_eq!(c.upstreams[0].ca_file, Some(dir.path().join("ca.pem")));
    // The CA file does not exist yet: a warning, not an error.
    assert!(c.warnings().iter().any(|w| w.contains("ca_file")));
    std::fs::write(dir.path().join("ca.pem"), "pem").unwrap();
    assert!(!c.warnings().iter().any(|w| w.contains("ca_file")));
    dir.close().unwrap();
}

#[test]
fn a_client_certificate_is_read_next_to_the_config_and_its_key_kept_private() {
    let dir = tempfile::Builder::new()
        .prefix("hourglass-config-test-")
        .tempdir()
        .unwrap();
    let path = dir.path().join("hourglass.toml");
    let text = BASE.replace(
        "url = \"https://api.openai.com\"",
        "url = \"https://api.openai.com\"\nclient_cert = \"tls/gw.pem\"\nclient_cert_key = \"/etc/gw.key\"",
    );
    std::fs::write(&path, text).unwrap();
    let c = Config::load(&path).unwrap();
    assert_eq!(
        c.upstreams[0].client_cert,
        Some(ClientCert {
            cert: dir.path().join("tls/gw.pem"),
            key: "/etc/gw.key".into(),
        })
    );
    assert!(c.describe().contains(&format!(
        "client_cert {}",
        dir.path().join("tls/gw.pem").display()
    )));
    let files = c.files();
    assert!(files.contains(&dir.path().join("tls/gw.pem").as_path()));
    assert!(files.contains(&Path::new("/etc/gw.key")));
    let w = c.warnings();
    assert!(
        w.iter()
            .any(|w| w.contains("client_cert ") && w.contains("will not start")),
        "{w:?}"
    );
    assert!(
        w.iter().any(|w| w.contains("client_cert_key /etc/gw.key")),
        "{w:?}"
    );

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("/etc/gw.key", "gw.key");
        std::fs::write(&path, text).unwrap();
        std::fs::create_dir(dir.path().join("tls")).unwrap();
        std::fs::write(dir.path().join("tls/gw.pem"), "pem").unwrap();
        let key = dir.path().join("gw.key");
        std::fs::write(&key, "key").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let w = Config::load(&path).unwrap().warnings();
        let openai: Vec<&String> = w.iter().filter(|w| w.contains("\"openai\"")).collect();
        assert_eq!(
            openai,
            [&format!(
                "upstream \"openai\": client_cert_key {} is open to every user (mode 644); chmod 600 it",
                key.display()
            )]
        );
    }
    dir.close().unwrap();
}

#[test]
fn absolute_ca_file_is_kept() {
    let text = BASE.replace(
        "url = \"https://api.openai.com\"",
        "url = \"https://api.openai.com\"\nca_file = \"/etc/ssl/ca.pem\"",
    );
    let c = load(&text);
    assert_eq!(
        c.upstreams[0].ca_file.as_deref(),
        Some(Path::new("/etc/ssl/ca.pem"))
    );
}

#[test]
fn io_error_names_the_path() {
    let path = std::env::temp_dir().join("hourglass-config-test-does-not-exist.toml");
    let e = Config::load(&path).unwrap_err();
    assert!(
        matches!(&e, ConfigError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    );
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!("{}: ", path.display())),
        "{shown}"
    );
}

/// Audit ME 5: an upstream whose url is the gateway's own `listen` address is a certain loop
/// (each request came back until it was refused 508 `loop_detected`): `check` and start-up
/// warn of it. Another port, another host, or a `listen` on port 0 are no loop.
#[test]
fn an_upstream_at_the_gateways_own_listen_address_is_warned_of() {
    let warned = |listen: &str, url: &str| {
        let text = format!("[server]\nlisten = \"{listen}\"\n{BASE}")
            .replace("https://api.openai.com", url);
        load(&text)
            .warnings()
            .into_iter()
            .filter(|w| w.contains("own listen address"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        warned("127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
        [
            "upstream \"openai\": url http://127.0.0.1:8000/v1 is this gateway's own listen \
          address (server.listen 127.0.0.1:8000): requests sent to it come back to the \
          gateway, a loop"
        ]
    );
    for (listen, url) in [
        ("0.0.0.0:8000", "http://localhost:8000"),
        ("0.0.0.0:443", "https://127.0.0.1"),
        ("[::]:8000", "http://[::1]:8000"),
        ("127.0.0.1:80", "http://LOCALHOST"),
        ("[::ffff:127.0.0.1]:8000", "http://127.0.0.1:8000"),
    ] {
        assert_eq!(warned(listen, url).len(), 1, "{listen} {url}");
    }
    for (listen, url) in [
        ("127.0.0.1:8000", "http://127.0.0.1:8001"),
        ("127.0.0.1:8000", "http://10.0.0.1:8000"),
        ("127.0.0.1:80", "https://127.0.0.1"),
        ("127.0.0.1:0", "http://127.0.0.1:80"),
        ("10.0.0.2:8000", "http://localhost:8000"),
    ] {
        assert!(warned(listen, url).is_empty(), "{listen} {url}");
    }
}

/// Audit NB 4: the self-loop warning compared names and addresses as strings, and missed
/// forms that reach the listener: `0.0.0.0` (which Linux connects to 127.0.0.1, or `::` to
/// `::1`), `127.1` and other inet_aton forms, any 127.0.0.0/8 address under an
/// every-address listen, `localhost.` with its root dot, `[::1]` on a `::1` listen.
#[test]
fn every_form_of_a_loopback_or_unspecified_address_is_judged_by_the_address() {
    let warned = |listen: &str, url: &str| {
        let text = format!("[server]\nlisten = \"{listen}\"\n{BASE}")
            .replace("https://api.openai.com", url);
        load(&text)
            .warnings()
            .into_iter()
            .any(|w| w.contains("own listen address"))
    };
    for (listen, url) in [
        ("127.0.0.1:8000", "http://0.0.0.0:8000"),
        ("127.0.0.1:8000", "http://127.1:8000"),
        ("127.0.0.1:8000", "http://0x7f.1:8000"),
        ("127.0.0.1:8000", "http://2130706433:8000"),
        ("0.0.0.0:8000", "http://127.0.0.2:8000"),
        ("0.0.0.0:8000", "http://127.1.2.3:8000"),
        ("127.0.0.1:8000", "http://localhost.:8000"),
        ("0.0.0.0:8000", "http://LocalHost.:8000"),
        ("[::1]:8000", "http://[::1]:8000"),
        ("[::1]:8000", "http://localhost:8000"),
        ("[::1]:8000", "http://[::]:8000"),
        ("[::]:8000", "http://[::1]:8000"),
        ("[::]:8000", "http://0.0.0.0:8000"),
    ] {
        assert!(warned(listen, url), "{listen} {url}");
    }
    for (listen, url) in [
        // Another loopback address than the one listened on is refused, not a loop.
        ("127.0.0.1:8000", "http://127.0.0.2:8000"),
        ("127.0.0.2:8000", "http://0.0.0.0:8000"),
        ("10.0.0.2:8000", "http://0.0.0.0:8000"),
        ("10.0.0.2:8000", "http://localhost.:8000"),
        ("127.0.0.1:8000", "http://localhost.example:8000"),
        ("127.0.0.1:8000", "http://127.1:8001"),
    ] {
        assert!(!warned(listen, url), "{listen} {url}");
    }
}
