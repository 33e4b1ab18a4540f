//! The command line as an operator meets it: `hourglass check` on good and bad files, and a
//! server that refuses to start on a bad one.

use std::path::PathBuf;
use std::process::{Command, Output};

mod check_files;
mod named_files;

fn hourglass(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(args)
        .env_remove("HOURGLASS_CONFIG")
        .output()
        .expect("the binary runs")
}

/// The file's path, and the guard that removes its directory when dropped.
fn temp_config(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("hourglass-cli-")
        .tempdir()
        .unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// An empty `HOURGLASS_CONFIG` or `HOURGLASS_WORKERS` (a template that leaves them blank)
/// is no value: every command, `--config` given or not, exited 2 naming a flag nobody typed
/// (audit P).
#[test]
fn empty_environment_variables_are_unset() {
    let run = |var: &str, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args(args)
            .env_remove("HOURGLASS_CONFIG")
            .env(var, "")
            .output()
            .expect("the binary runs")
    };
    for var in ["HOURGLASS_CONFIG", "HOURGLASS_WORKERS"] {
        let out = run(var, &["check", "--config", "config/demo.toml"]);
        assert!(
            out.status.success(),
            "{var}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = run(var, &["fake-upstream", "--help"]);
        assert!(out.status.success(), "{var}");
    }
    // Empty, the variable falls through to the default file.
    let out = run("HOURGLASS_CONFIG", &["check"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn check_prints_the_resolved_routes_of_the_shipped_configs() {
    for file in ["config/hourglass.toml", "config/demo.toml"] {
        let out = hourglass(&["check", "--config", file]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("chat"), "{stdout}");
        assert!(stdout.contains("first_token_timeout"), "{stdout}");
        // The OpenAI Responses API has a route of its own in both.
        assert!(
            stdout.contains("path_prefix: /v1/responses"),
            "{file}: {stdout}"
        );
    }
    // The example names its keys' variables; unset here, so check warns (and still passes).
    let out = hourglass(&["check", "--config", "config/hourglass.toml"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("OPENAI_API_KEY"), "{stderr}");
}

/// Audit IF 3: the shipped catch-all (`/v1`) inherits a 30 s first-token limit, and an
/// answer that is not an event stream has its first token at its first byte: a transcription
/// or an image generation that took longer was answered 504. Every shipped config with a
/// catch-all gives `/v1/audio` and `/v1/images` a longer limit of their own before it.
#[test]
fn the_shipped_catch_alls_leave_audio_and_images_a_longer_first_token() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = tempfile::tempdir().unwrap();
    // The Kubernetes config is the ConfigMap's block, indented four spaces.
    let configmap = std::fs::read_to_string(format!("{root}/deploy/k8s/configmap.yaml")).unwrap();
    let block: String = configmap
        .lines()
        .skip_while(|l| !l.ends_with("hourglass.toml: |"))
        .skip(1)
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    let k8s = dir.path().join("k8s.toml");
    std::fs::write(&k8s, block).unwrap();
    for file in [
        format!("{root}/config/hourglass.toml"),
        format!("{root}/docker/hourglass.toml"),
        k8s.display().to_string(),
    ] {
        let out = hourglass(&["check", "--config", &file]);
        assert!(out.status.success(), "{file}: {out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        // Each route's lines, by its path prefix, in file order.
        let routes: Vec<(&str, &str)> = stdout
            .split("route \"")
            .skip(1)
            .filter_map(|r| {
                let prefix = r.split("path_prefix: ").nth(1)?.lines().next()?;
                let ttft = r.split("first_token_timeout: ").nth(1)?.lines().next()?;
                Some((prefix, ttft))
            })
            .collect();
        let at = |prefix: &str| routes.iter().position(|(p, _)| *p == prefix);
        let catch_all = at("/v1").unwrap_or_else(|| panic!("{file}: {routes:?}"));
        assert_eq!(routes[catch_all].1, "30s", "{file}");
        for slow in ["/v1/audio", "/v1/images"] {
            let i = at(slow).unwrap_or_else(|| panic!("{file}: no {slow} route: {routes:?}"));
            assert!(i < catch_all, "{file}: {slow} after the catch-all");
            assert_eq!(routes[i].1, "2m", "{file}: {slow}");
        }
    }
}

#[test]
fn check_reports_syntax_errors_with_file_line_and_column() {
    let (_dir, path) = temp_config(
        "syntax.toml",
        "[server]\nlisten = \"127.0.0.1:8080\"\n\n[defaults]\nbudget = \"8s\"\nfirst_token_timout = \"5s\"\n",
    );
    let out = hourglass(&["check", "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!("{}:6:1:", path.display());
    assert!(stderr.starts_with(&expected), "{stderr}");
    assert!(stderr.contains("first_token_timout"), "{stderr}");
}

#[test]
fn check_names_the_route_and_key_of_a_semantic_error() {
    let (_dir, path) = temp_config(
        "semantic.toml",
        r#"
[upstreams.openai]
url = "https://api.openai.com"

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "openai"
budget = "8s"
first_token_timeout = "40s"
"#,
    );
    let out = hourglass(&["check", "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("route \"chat\""), "{stderr}");
    assert!(stderr.contains("first_token_timeout (40s)"), "{stderr}");
    assert!(stderr.contains("budget (8s)"), "{stderr}");
}

/// Audit ME 1: `check` passed an upstream's `expected_first_token` past the first-token
/// limit of the route calling it, and every request with the route's budget was then
/// refused 504 `insufficient_budget`.
#[test]
fn check_refuses_an_expected_first_token_past_the_routes_limit() {
    let (_dir, path) = temp_config(
        "seed.toml",
        r#"
[upstreams.fake]
url = "http://127.0.0.1:9"
expected_first_token = "9s"

[[routes]]
name = "chat"
path_prefix = "/v1"
upstream = "fake"
budget = "8s"
first_token_timeout = "5s"
"#,
    );
    let out = hourglass(&["check", "--config", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "route \"chat\": upstream \"fake\" has expected_first_token (9s), which must be \
             less than the route's first_token_timeout (5s)"
        ),
        "{stderr}"
    );
}

/// Audit ME 5: a `RUST_LOG` the filter cannot read fell back to `info` without a word; the
/// log now says which value was set aside.
#[test]
fn an_invalid_rust_log_is_named_in_a_warning() {
    let (_dir, path) = temp_config(
        "ok.toml",
        "[upstreams.u]\nurl = \"http://127.0.0.1:9\"\nauth = \"none\"\n\n\
         [[routes]]\nname = \"chat\"\npath_prefix = \"/v1\"\nupstream = \"u\"\n",
    );
    for value in ["hourglass=loud", "debug,,="] {
        let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args(["check", "--config", path.to_str().unwrap()])
            .env_remove("HOURGLASS_CONFIG")
            .env("RUST_LOG", value)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(0), "{text}");
        assert!(
            text.contains(&format!("RUST_LOG {value:?} is not a valid log filter")),
            "{value}: {text}"
        );
        assert!(text.contains("logging at info"), "{text}");
    }
    // A valid one says nothing of itself.
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["check", "--config", path.to_str().unwrap()])
        .env_remove("HOURGLASS_CONFIG")
        .env("RUST_LOG", "warn,hourglass=debug")
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("RUST_LOG"));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("RUST_LOG"));
}

#[test]
fn the_server_refuses_to_start_on_a_bad_config() {
    let (_dir, path) = temp_config(
        "bad.toml",
        "[[routes]]\nname = \"x\"\npath_prefix = \"/\"\nupstream = \"nowhere\"\n",
    );
    let out = hourglass(&["--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!String::from_utf8_lossy(&out.stderr).is_empty());
    let out = hourglass(&["--config", "/nonexistent/hourglass.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/hourglass.toml"));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// What an exited child wrote on stdout and stderr.
async fn outputs(child: &mut tokio::process::Child) -> (String, String) {
    use tokio::io::AsyncReadExt;
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let mut out = child.stdout.take().expect("stdout piped");
    let mut err = child.stderr.take().expect("stderr piped");
    out.read_to_string(&mut stdout).await.unwrap();
    err.read_to_string(&mut stderr).await.unwrap();
    (stdout, stderr)
}

fn wait_for(mut check: impl FnMut() -> bool, what: &str) {
    // Generous: CI machines run these next to other builds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_reloads_on_sighup_drains_on_sigterm_and_logs_json_without_secrets() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fake = hourglass_fake::FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let (port, admin) = (free_port(), free_port());
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
admin_listen = "127.0.0.1:{admin}"
shutdown_grace = "500ms"

[defaults]
idle_timeout = "20s"

[upstreams.fake]
url = "{}"
api_key_env = "HOURGLASS_CANARY_KEY"

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "fake"
"#,
        fake.url()
    );
    let (_dir, path) = temp_config("served.toml", &config);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["--config", path.to_str().unwrap(), "--log-format", "json"])
        .env("HOURGLASS_CANARY_KEY", "sk-canary-0123456789")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap().to_string();
    tokio::task::spawn_blocking(move || {
        wait_for(
            || http_get(admin, "/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200")),
            "readiness",
        )
    })
    .await
    .unwrap();

    // SIGHUP reloads even when the file did not change.
    std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap();
    tokio::task::spawn_blocking(move || {
        wait_for(
            || {
                http_get(admin, "/metrics")
                    .is_some_and(|m| m.contains("hourglass_config_reloads_total{result=\"ok\"} 1"))
            },
            "the SIGHUP reload",
        )
    })
    .await
    .unwrap();

    // A stream that will not finish within the grace period, then SIGTERM.
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let body = r#"{"model":"m","stream":true}"#;
    s.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             authorization: Bearer client-secret-key\r\nx-fake-freeze-after: 1\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("tok1") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("the stream ends")
            .unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("event: error"), "{text}");
    assert!(text.contains("\"code\":\"shutdown\""), "{text}");
    let status = tokio::time::timeout(std::time::Duration::from_secs(10), child.wait())
        .await
        .expect("the process exits")
        .unwrap();
    assert_eq!(status.code(), Some(0));

    let (stdout, stderr) = outputs(&mut child).await;
    let request_lines: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "hourglass::request")
        .collect();
    assert_eq!(request_lines.len(), 1, "{stdout}");
    assert_eq!(request_lines[0]["origin"], "shutdown");
    assert_eq!(request_lines[0]["route"], "chat");
    // The reload's line says what set it off.
    let reloaded = stdout
        .lines()
        .chain(stderr.lines())
        .find(|l| l.contains("config reloaded"))
        .unwrap_or_else(|| panic!("no reload line in {stdout}{stderr}"));
    assert!(reloaded.contains("\"cause\":\"SIGHUP\""), "{reloaded}");
    for secret in ["sk-canary-0123456789", "client-secret-key"] {
        assert!(
            !stdout.contains(secret) && !stderr.contains(secret),
            "{secret} leaked"
        );
    }
    // The upstream got the configured key, not the client's.
    let auth = fake.requests()[0].headers["authorization"].clone();
    assert_eq!(auth, "Bearer sk-canary-0123456789");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_mode_writes_combined_format_lines() {
    let fake = hourglass_fake::FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let (port, admin) = (free_port(), free_port());
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\n\
         [upstreams.fake]\nurl = \"{}\"\nauth = \"none\"\n\n\
         [[routes]]\nname = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n",
        fake.url()
    );
    let (_dir, path) = temp_config("access.toml", &config);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["--config", path.to_str().unwrap(), "--log-format", "access"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::task::spawn_blocking(move || {
        wait_for(|| http_get(admin, "/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200")), "readiness");
        // A bad budget: answered by Hourglass itself.
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nuser-agent: probe/1.0\r\nx-request-budget-ms: abc\r\n\
             content-length: 2\r\nconnection: close\r\n\r\n{{}}"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 400"));
    })
    .await
    .unwrap();
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    child.wait().await.unwrap();
    // Everything but the access lines goes to stderr, through its own log thread, all of it
    // written out by the time the process has exited.
    let (stdout, stderr) = outputs(&mut child).await;
    assert!(stderr.contains("hourglass listening"), "{stderr}");
    assert!(stderr.contains("shutting down"), "{stderr}");
    assert!(!stderr.contains("POST"), "{stderr}");
    let line = stdout.lines().next().expect("one access line");
    assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
    assert!(
        line.contains("] \"POST /v1/chat/completions HTTP/1.1\" 400 "),
        "{line}"
    );
    assert!(line.contains(" \"-\" \"probe/1.0\" request_id="), "{line}");
    assert!(
        line.contains("route=chat") && line.contains("outcome=error"),
        "{line}"
    );
    assert_eq!(
        stdout.lines().count(),
        1,
        "only access lines on stdout: {stdout}"
    );
}

/// The log has a thread of its own: with nobody reading the gateway's stdout (a full pipe, a
/// stalled log shipper) requests are still served, and every line comes out once the reader
/// is back. Written in place, the line of the request that filled the pipe would block the
/// runtime, and with it every connection.
#[test]
fn a_log_reader_that_stops_reading_does_not_stall_the_gateway() {
    use std::io::{Read, Write};
    let (port, admin) = (free_port(), free_port());
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\n\
         [upstreams.fake]\nurl = \"http://127.0.0.1:9\"\nauth = \"none\"\n\n\
         [[routes]]\nname = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n"
    );
    let (_dir, path) = temp_config("stalled-log.toml", &config);
    let child = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["--config", path.to_str().unwrap(), "--log-format", "json"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(
        || http_get(admin, "/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200")),
        "readiness",
    );
    // Each request's JSON line is a few hundred bytes: 600 of them are several times what a
    // pipe holds (64 KiB on Linux). A bad budget is answered by the gateway itself.
    const REQUESTS: usize = 600;
    for i in 0..REQUESTS {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        write!(
            s,
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-request-budget-ms: abc\r\n\
             content-length: 2\r\nconnection: close\r\n\r\n{{}}"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out)
            .unwrap_or_else(|e| panic!("request {i} of {REQUESTS} was not answered: {e}"));
        assert!(out.starts_with("HTTP/1.1 400"), "request {i}: {out}");
    }
    let metrics = http_get(admin, "/metrics").expect("metrics");
    assert!(
        metrics.contains("hourglass_log_lines_dropped_total 0"),
        "{metrics}"
    );
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    // Reading now lets the queued lines out; the process exits once they are written.
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let requests = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "hourglass::request")
        .count();
    assert_eq!(requests, REQUESTS);
}

#[test]
fn a_worker_count_of_zero_is_refused() {
    let out = hourglass(&["--workers", "0", "check", "--config", "config/demo.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("invalid value '0' for '--workers"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A key written into the wrong field is never repeated, whether the file is refused for it
/// (an error that quotes the value) or accepted with a warning (and the resolved listing):
/// errors reach the log and `/readyz` on a reload.
#[test]
fn check_never_repeats_a_key_written_into_the_wrong_field() {
    // An OpenAI-style key, and an Azure OpenAI one (lowercase hex, no prefix).
    for key in [
        "sk-proj-CANARYabcDEF0123456789ghijKLMNopqrSTUVwx",
        "3f9a1c0e5b7d4e2a8c6b1d0f9e8a7c6b",
    ] {
        never_repeated(key);
    }
    let route = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n";
    let (_dir, path) = temp_config(
        "store.toml",
        &format!("[runs]\nstore = \"redis://user:s3cret-pw@/0\"\n[upstreams.u]\nurl = \"http://127.0.0.1:1\"\n{route}"),
    );
    let out = hourglass(&["check", "--config", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("s3cret"), "{stderr}");
    assert!(stderr.contains("redis://user:***@"), "{stderr}");
    // Nor a key pasted where a variable's name belongs, though `=` makes it no name at all
    // (base64 padding).
    let (_dir, path) = temp_config(
        "padded.toml",
        &format!("[upstreams.u]\nurl = \"http://127.0.0.1:1\"\napi_key_env = \"dGhpc2lzYXNlY3JldGtleQ==\"\n{route}"),
    );
    let out = hourglass(&["check", "--config", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("api_key_env is not a valid environment variable name"),
        "{stderr}"
    );
    assert!(!stderr.contains("dGhpc2lz"), "{stderr}");
    // What is not a variable's name may be the password itself.
    let (_dir, path) = temp_config(
        "password.toml",
        &format!("[runs]\nstore = \"redis://127.0.0.1:1/0\"\nstore_password_env = \"hunter2!pass\"\n[upstreams.u]\nurl = \"http://127.0.0.1:1\"\n{route}"),
    );
    let out = hourglass(&["check", "--config", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("store_password_env is not a variable name"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
    // One that could be a variable's name but reads as a password is not echoed either,
    // by check or by the start-up that cannot find it.
    let (_dir, path) = temp_config(
        "password2.toml",
        &format!("[runs]\nstore = \"redis://127.0.0.1:1/0\"\nstore_password_env = \"Xk9pQ2vL7mN4rT8w\"\n[upstreams.u]\nurl = \"http://127.0.0.1:1\"\n{route}"),
    );
    for args in [&["check", "--config"][..], &["--config"][..]] {
        let out = hourglass(&[args, &[path.to_str().unwrap()]].concat());
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("store_password_env"), "{said}");
        assert!(!said.contains("Xk9pQ2vL7mN4rT8w"), "{args:?}: {said}");
    }
}

fn never_repeated(key: &str) {
    let route = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n";
    for (upstream, refused) in [
        (format!("url = \"http://{key}@127.0.0.1:1\""), true),
        (format!("url = \"http://127.0.0.1:1/?key={key}\""), true),
        (format!("url = \"{key}\""), true),
        (
            format!("url = \"http://127.0.0.1:1\"\nauth = \"{key}\""),
            true,
        ),
        (
            format!("url = \"http://127.0.0.1:1\"\napi_key_file = \"{key}\""),
            false,
        ),
        (
            format!("url = \"http://127.0.0.1:1\"\napi_key_env = \"{key}\""),
            false,
        ),
    ] {
        let (_dir, path) = temp_config("leak.toml", &format!("[upstreams.u]\n{upstream}\n{route}"));
        let out = hourglass(&["check", "--config", path.to_str().unwrap()]);
        assert_eq!(out.status.success(), !refused, "{upstream}");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!text.contains(&key[8..]), "{upstream}: {text}");
        assert!(text.contains("***") || !refused, "{upstream}: {text}");
    }
}

/// `--config` may come before the command too: `hourglass --config X check` checks X (it
/// once checked `config/hourglass.toml` and passed a broken X). The commands that read no
/// file refuse one rather than ignore it.
#[test]
fn config_before_the_command_is_the_file_checked() {
    let (_dir, path) = temp_config(
        "before.toml",
        "[defaults]\nbudget = \"bogus\"\n\n[upstreams.u]\nurl = \"http://127.0.0.1:1\"\n",
    );
    let path = path.to_str().unwrap();
    for args in [["--config", path, "check"], ["check", "--config", path]] {
        let out = hourglass(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(path) && stderr.contains("bogus"),
            "{stderr}"
        );
    }
    // Given before and after the command, neither is silently taken.
    let out = hourglass(&["--config", "config/demo.toml", "check", "--config", path]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("more than once"));
    for (args, want) in [
        (
            ["--config", path, "demo"],
            "`demo` reads no configuration file",
        ),
        (["demo", "--config", path], "unexpected argument '--config'"),
        (
            ["fake-upstream", "--config", path],
            "unexpected argument '--config'",
        ),
    ] {
        let out = hourglass(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
    // Nor do their helps offer it; `check`'s does.
    for (command, offered) in [("demo", false), ("fake-upstream", false), ("check", true)] {
        let out = hourglass(&[command, "--help"]);
        let help = String::from_utf8_lossy(&out.stdout);
        assert_eq!(help.contains("--config"), offered, "{command}: {help}");
    }
}

/// A port already taken says which of the two listeners could not have it: `listen =
/// "0.0.0.0:P"` and `admin_listen = "127.0.0.1:P"` pass `check`, and only one fails.
#[test]
fn a_taken_port_names_the_listener_that_wanted_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    for (key, listen, admin) in [
        ("listen", port, free_port()),
        ("admin_listen", free_port(), port),
    ] {
        let (_dir, path) = temp_config(
            "taken.toml",
            &format!(
                "[server]\nlisten = \"127.0.0.1:{listen}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\n\
                 [upstreams.u]\nurl = \"http://127.0.0.1:1\"\nauth = \"none\"\n\n\
                 [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n"
            ),
        );
        let out = hourglass(&["--config", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!("cannot listen on 127.0.0.1:{port} (server.{key})")),
            "{stderr}"
        );
    }
}

/// A file that is not UTF-8 is located as any other fault of the text: file, line, column.
#[test]
fn a_config_that_is_not_utf8_says_where() {
    let (_dir, path) = temp_config("latin1.toml", "");
    std::fs::write(&path, b"[server]\nlisten = \"127.0.0.1:0\"\n# caf\xe9\n").unwrap();
    let out = hourglass(&["check", "--config", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "{}:3:6: byte 0xe9 (offset 37) is not UTF-8",
            path.display()
        )),
        "{stderr}"
    );
}

/// The fake provider has no file to reload: a SIGHUP must not end it (its default action),
/// cutting the streams of a rehearsal without a word.
#[test]
fn the_fake_provider_survives_a_sighup() {
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["fake-upstream", "--listen", &format!("127.0.0.1:{port}")])
        .env_remove("HOURGLASS_CONFIG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let up = || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    wait_for(up, "the fake provider listening");
    std::process::Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let alive = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(alive, "the SIGHUP ended it");
}

/// Audit K3: what start-up refuses (a key file missing here, a variable not set) is a
/// warning to `check`, which exits 0 (a CI machine may lack the secrets), and an error to
/// `check --strict`, which exits 1 as start-up would.
#[test]
fn check_strict_fails_where_start_up_would() {
    let base = "[upstreams.up]\nurl = \"http://127.0.0.1:9\"\n{UP}\n\n\
                [[routes]]\nname = \"chat\"\npath_prefix = \"/\"\nupstream = \"up\"\n{ROUTE}\n";
    let unset = "HOURGLASS_TEST_CHECK_STRICT_UNSET";
    for (up, route, head, want) in [
        (
            "api_key_file = \"nope.key\"",
            "",
            "",
            "upstream \"up\": api_key_file",
        ),
        (
            "auth = \"none\"",
            "client_keys_file = \"nope.keys\"",
            "",
            "route \"chat\": client_keys_file",
        ),
        (
            "auth = \"none\"",
            &format!("client_keys_env = \"{unset}\""),
            "",
            "route \"chat\": client_keys_env",
        ),
        (
            "auth = \"none\"",
            "",
            &format!(
                "[runs]\nstore = \"redis://127.0.0.1:9/0\"\nstore_password_env = \"{unset}\"\n\n"
            ),
            "runs: store_password_env",
        ),
    ] {
        let text = format!(
            "{head}{}",
            base.replace("{UP}", up).replace("{ROUTE}", route)
        );
        let (_dir, path) = temp_config("strict.toml", &text);
        let path = path.to_str().unwrap();
        let out = hourglass(&["check", "--config", path]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{text}\n{stderr}");
        assert!(stderr.contains(&format!("warning: {want}")), "{stderr}");
        let out = hourglass(&["check", "--strict", "--config", path]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{text}\n{stderr}");
        assert!(
            stderr.contains(&format!("error: {want}"))
                && stderr.contains("the gateway will not start without"),
            "{stderr}"
        );
    }
    // What start-up accepts passes --strict, its warnings still warnings.
    let text = base
        .replace("{UP}", "auth = \"none\"")
        .replace("{ROUTE}", "");
    let (_dir, path) = temp_config("strict.toml", &text);
    let out = hourglass(&["check", "--strict", "--config", path.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The binary serving 1,000 routes (a second or more to build in a debug build), its log
/// written to a file; `act` is done (given the config file and the pid) the moment its
/// first warning (an unused upstream, logged once the config is read) is written, while
/// the routes are still being built. Returns the process, its log file, its admin port,
/// and the directory's guard.
fn during_start_up(
    act: impl FnOnce(&std::path::Path, u32),
) -> (std::process::Child, PathBuf, u16, tempfile::TempDir) {
    let (port, admin) = (free_port(), free_port());
    let mut config = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\
         shutdown_grace = \"1s\"\n\n[upstreams.u]\nurl = \"http://127.0.0.1:9\"\nauth = \"none\"\n\n\
         [upstreams.spare]\nurl = \"http://127.0.0.1:9\"\nauth = \"none\"\n\n"
    );
    for i in 0..1000 {
        config.push_str(&format!(
            "[[routes]]\nname = \"r{i}\"\npath_prefix = \"/r{i}/\"\nupstream = \"u\"\n\n"
        ));
    }
    let (dir, path) = temp_config("big.toml", &config);
    let log = dir.path().join("log");
    let child = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["--config", path.to_str().unwrap()])
        .env_remove("HOURGLASS_CONFIG")
        .env("RUST_LOG", "info")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for(
        || read().contains("is not used by any route"),
        "the warning",
    );
    assert!(
        !read().contains("hourglass listening"),
        "start-up was over before the signal: the test proves nothing\n{}",
        read()
    );
    act(&path, child.id());
    (child, log, admin, dir)
}

fn signalled_during_start_up(
    signal: &str,
) -> (std::process::Child, PathBuf, u16, tempfile::TempDir) {
    during_start_up(|_, pid| {
        std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .unwrap();
    })
}

/// Audit IB 3: the watcher took the file as it read it after start-up for the one applied,
/// so an edit made while the gateway started was never reloaded, and nothing said so. Its
/// baseline is now what start-up was built from: the edit is reloaded at the first ticks.
#[test]
fn an_edit_during_start_up_is_reloaded() {
    let (mut child, log, _admin, _dir) = during_start_up(|path, _| {
        let text = std::fs::read_to_string(path).unwrap();
        let edited = text.replacen(
            "upstream = \"u\"\n",
            "upstream = \"u\"\nbudget = \"33s\"\n",
            1,
        );
        assert_ne!(text, edited);
        std::fs::write(path, edited).unwrap();
    });
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !read().contains("config reloaded")
        && std::time::Instant::now() < deadline
        && child.try_wait().unwrap().is_none()
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let text = read();
    let reload = text
        .lines()
        .find(|l| l.contains("config reloaded"))
        .unwrap_or_else(|| panic!("the edit was never reloaded\n{text}"));
    assert!(reload.contains("cause=changed: "), "{reload}");
}

/// Audit IB 1: a SIGHUP while the gateway starts (a reloader sidecar, `systemctl reload`)
/// met its default action and killed the process. Now it is kept, and reloads the file once
/// the gateway serves.
#[test]
fn a_sighup_during_start_up_is_one_reload_once_serving() {
    let (mut child, log, admin, _dir) = signalled_during_start_up("HUP");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !read().contains("config reloaded")
        && std::time::Instant::now() < deadline
        && child.try_wait().unwrap().is_none()
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let ready = http_get(admin, "/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200"));
    let status = child.try_wait().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let text = read();
    assert_eq!(status, None, "it exited\n{text}");
    assert!(ready, "{text}");
    let reloads: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("config reloaded"))
        .collect();
    assert_eq!(reloads.len(), 1, "{text}");
    assert!(reloads[0].contains("cause=SIGHUP"), "{text}");
}

/// Audit IB 1: a SIGTERM while the gateway starts killed it (status -15, no drain). Now it
/// is kept: the gateway drains as soon as it serves and exits 0.
#[test]
fn a_sigterm_during_start_up_drains_and_exits_0() {
    let (mut child, log, _admin, _dir) = signalled_during_start_up("TERM");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("no exit within 30 s of SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}\n{text}");
    assert!(text.contains("shutting down"), "{text}");
}

/// Audit RA 1: `check` says which upstreams go through which egress proxy (the environment's
/// with its password masked, the key's, or none), and refuses a proxy it cannot use.
#[test]
fn check_shows_each_upstreams_egress_proxy() {
    let (_dir, path) = temp_config(
        "egress.toml",
        r#"
[upstreams.openai]
url = "https://api.openai.com"

[upstreams.internal]
url = "https://llm.corp.example"

[upstreams.direct]
url = "https://api.anthropic.com"
proxy = "none"

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "openai"
fallbacks = ["internal", "direct"]
"#,
    );
    let check = |proxy: &str| {
        Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args(["check", "--config", path.to_str().unwrap()])
            .env_remove("HOURGLASS_CONFIG")
            .env("HTTPS_PROXY", proxy)
            .env("NO_PROXY", "corp.example")
            .output()
            .expect("the binary runs")
    };
    let out = check("http://gw:hunter2@proxy.corp.example:3128");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let line = |name: &str| {
        stdout
            .lines()
            .find(|l| l.contains(&format!("{name} (https://")))
            .unwrap_or_else(|| panic!("no {name} in {stdout}"))
            .to_owned()
    };
    assert!(
        line("openai")
            .contains(", proxy http://gw:***@proxy.corp.example:3128 (from the environment)"),
        "{stdout}"
    );
    assert!(!line("internal").contains("proxy"), "{stdout}");
    assert!(line("direct").contains(", proxy none"), "{stdout}");
    assert!(!stdout.contains("hunter2"), "{stdout}");
    // A SOCKS proxy in the environment is refused, not passed over.
    let out = check("socks5://gw:hunter2@proxy.corp.example:1080");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("socks5://gw:***@proxy.corp.example:1080"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}
