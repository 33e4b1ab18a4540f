//! What the config file and the files it names may be: regular files (a symlink to one, as
//! Kubernetes mounts them, is one) of at most 16 MiB. A FIFO or a device in a named file's
//! place is refused at once, naming the key, the path and what it is; the config itself may
//! come from a pipe (`--config <(envsubst < tmpl.toml)`), read once.

use std::process::Stdio;
use std::time::{Duration, Instant};

use super::*;

/// A FIFO made at `path`.
fn mkfifo(path: &std::path::Path) {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

/// Runs the binary with `args`; its exit code and stderr, or a panic naming `what` when it
/// has not exited within 30 s (generous: the point is that it does not wait for good).
fn run_bounded(args: &[&str], what: &str) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(args)
        .env_remove("HOURGLASS_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Audit ME 2: a FIFO where the config names a file hung `check` (waiting for a writer) and
/// start-up (which then ignored SIGTERM: only `kill -9` ended it). Both now refuse it at
/// once, naming the key, the path and what it is.
#[test]
fn a_named_file_that_is_a_fifo_is_refused_at_once() {
    let dir = tempfile::Builder::new()
        .prefix("hourglass-cli-fifo-")
        .tempdir()
        .unwrap();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let f = fifo.display().to_string();
    let (port, admin) = (free_port(), free_port());
    let config = |head: &str, upstream: &str, route: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\
             {head}\n\n[upstreams.up]\nurl = \"https://127.0.0.1:9\"\n{upstream}\n\n\
             [[routes]]\nname = \"chat\"\npath_prefix = \"/\"\nupstream = \"up\"\n{route}\n"
        )
    };
    let path = dir.path().join("fifo.toml");
    let cases = [
        (
            "api_key_file",
            config("", &format!("api_key_file = {f:?}"), ""),
        ),
        (
            "ca_file",
            config("", &format!("auth = \"none\"\nca_file = {f:?}"), ""),
        ),
        (
            "client_keys_file",
            config("", "auth = \"none\"", &format!("client_keys_file = {f:?}")),
        ),
        (
            "server.tls.cert",
            config(
                &format!("[server.tls]\ncert = {f:?}\nkey = {f:?}"),
                "auth = \"none\"",
                "",
            ),
        ),
        (
            "store_ca_file",
            format!(
                "[runs]\nstore = \"rediss://127.0.0.1:1/0\"\nstore_ca_file = {f:?}\n\n{}",
                config("", "auth = \"none\"", "")
            ),
        ),
    ];
    for (key, text) in cases {
        std::fs::write(&path, text).unwrap();
        let (code, stderr) = run_bounded(
            &["check", "--config", path.to_str().unwrap()],
            &format!("check, {key} a FIFO"),
        );
        assert_eq!(code, Some(1), "{key}: {stderr}");
        assert!(
            stderr.contains(key)
                && stderr.contains(&f)
                && stderr.contains("a FIFO, not a regular file"),
            "{key}: {stderr}"
        );
    }
    // The gateway itself: refused before it serves, not waiting for good.
    std::fs::write(&path, config("", &format!("api_key_file = {f:?}"), "")).unwrap();
    let (code, stderr) = run_bounded(
        &["--config", path.to_str().unwrap()],
        "the gateway, api_key_file a FIFO",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("api_key_file {f}"))
            && stderr.contains("a FIFO, not a regular file"),
        "{stderr}"
    );
}

/// Audit ME 2: a named file was read whole however large (`/dev/zero` as a `ca_file` until
/// memory ran out). A file over 16 MiB is refused, saying so; the config file too.
#[test]
fn a_named_file_larger_than_16_mib_is_refused() {
    let dir = tempfile::Builder::new()
        .prefix("hourglass-cli-large-")
        .tempdir()
        .unwrap();
    // Sparse: no disk is spent on it.
    let large = dir.path().join("large.key");
    std::fs::File::create(&large)
        .unwrap()
        .set_len((16 << 20) + 1)
        .unwrap();
    let l = large.display().to_string();
    let path = dir.path().join("large.toml");
    std::fs::write(
        &path,
        format!(
            "[upstreams.up]\nurl = \"http://127.0.0.1:9\"\napi_key_file = {l:?}\n\n\
             [[routes]]\nname = \"chat\"\npath_prefix = \"/\"\nupstream = \"up\"\n"
        ),
    )
    .unwrap();
    let (code, stderr) = run_bounded(&["check", "--config", path.to_str().unwrap()], "check");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("api_key_file {l}")) && stderr.contains("larger than 16 MiB"),
        "{stderr}"
    );
    // The config file itself.
    let (code, stderr) = run_bounded(&["check", "--config", &l], "check of a large config");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&l) && stderr.contains("larger than 16 MiB"),
        "{stderr}"
    );
}
