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
    let child = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(args)
        .env_remove("HOURGLASS_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = exited(child, what);
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

/// Audit ME 4: a config from a pipe (`--config <(envsubst < tmpl.toml)`) served, and a
/// second later the watcher read the pipe again, found it empty and logged a failed reload
/// that `/readyz` showed for the process's life; every SIGHUP added one. A config that is
/// not a regular file is read once and not watched, and a SIGHUP says it cannot be read
/// again, failing nothing.
#[test]
fn a_config_from_a_pipe_is_read_once_and_not_watched() {
    let (port, admin) = (free_port(), free_port());
    let (dir, path) = temp_config(
        "tmpl.toml",
        &format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\
             shutdown_grace = \"1s\"\n\n[upstreams.u]\nurl = \"http://127.0.0.1:9\"\nauth = \"none\"\n\n\
             [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n"
        ),
    );
    let log = dir.path().join("log");
    // bash's process substitution, as an operator would write it.
    let mut child = Command::new("bash")
        .args([
            "-c",
            "exec \"$0\" --config <(cat \"$1\")",
            env!("CARGO_BIN_EXE_hourglass"),
            path.to_str().unwrap(),
        ])
        .env_remove("HOURGLASS_CONFIG")
        .env("RUST_LOG", "info")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let reload_errors = || {
        http_get(admin, "/metrics").and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("hourglass_config_reloads_total{result=\"error\"} "))
                .map(|n| n.trim().to_owned())
        })
    };
    wait_for(
        || http_get(admin, "/readyz").is_some_and(|r| r.starts_with("HTTP/1.1 200")),
        "readiness",
    );
    // Past the watcher's first ticks (one a second), had it any.
    std::thread::sleep(Duration::from_millis(2500));
    let errors_before = reload_errors();
    let ready_before = http_get(admin, "/readyz").unwrap_or_default();
    Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !read().contains("cannot be read again") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let errors_after = reload_errors();
    let ready_after = http_get(admin, "/readyz").unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    let text = read();
    assert_eq!(errors_before.as_deref(), Some("0"), "{text}");
    assert!(
        !ready_before.contains("last reload failed"),
        "{ready_before}"
    );
    let hangup = text
        .lines()
        .find(|l| l.contains("cannot be read again"))
        .unwrap_or_else(|| panic!("no word of the SIGHUP\n{text}"));
    assert!(hangup.contains("WARN"), "{hangup}");
    assert_eq!(errors_after.as_deref(), Some("0"), "{text}");
    assert!(
        ready_after.starts_with("HTTP/1.1 200") && !ready_after.contains("last reload failed"),
        "{ready_after}"
    );
}

/// Audit ME 4 (and ME 2's start-up hang): a config that is a pipe no one writes to is
/// waited for, as `cat` would; a SIGTERM meanwhile ends the process at once (the gateway,
/// which takes SIGTERM over before it reads its config, ignored it while it waited).
#[test]
fn a_sigterm_while_a_config_pipe_is_waited_for_ends_the_process() {
    let dir = tempfile::Builder::new()
        .prefix("hourglass-cli-pipe-")
        .tempdir()
        .unwrap();
    let fifo = dir.path().join("config");
    mkfifo(&fifo);
    let child = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["--config", fifo.to_str().unwrap()])
        .env_remove("HOURGLASS_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once SIGTERM is caught (bit 15 of SigCgt), the gateway has taken it over, and the
    // config's read follows.
    let caught = || {
        std::fs::read_to_string(format!("/proc/{}/status", child.id()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .is_some_and(|mask| mask & (1 << 14) != 0)
    };
    wait_for(caught, "SIGTERM taken over");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let out = exited(child, "still waiting for the pipe after SIGTERM");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("stopped while waiting for the config"),
        "{stderr}"
    );
}

/// Audit NB 2: a config from a pipe has no folder of its own. Its relative paths were
/// resolved against `/dev/fd` (`<(...)`) or `/dev` (`/dev/stdin`): `check` warned of
/// `api_key_file /dev/fd/key: No such file` and exited 0, and start-up failed on it. They
/// are resolved against the working directory, and a missing file's message says so.
#[test]
fn a_piped_configs_relative_paths_are_resolved_against_the_working_directory() {
    use std::os::unix::fs::PermissionsExt;
    let (port, admin) = (free_port(), free_port());
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\n\
         [upstreams.e]\nurl = \"http://127.0.0.1:9\"\napi_key_file = \"key\"\n\n\
         [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"e\"\n"
    );
    let (dir, path) = temp_config("gw.toml", &text);
    let key = dir.path().join("key");
    std::fs::write(&key, "sk-test\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let empty = tempfile::Builder::new()
        .prefix("hourglass-cli-cwd-")
        .tempdir()
        .unwrap();
    let bin = env!("CARGO_BIN_EXE_hourglass");
    // `script` run by bash in `cwd`, with $0 the binary and $1 the config file.
    let bash = |cwd: &std::path::Path, script: &str| {
        let out = Command::new("timeout")
            .args(["30", "bash", "-c", script, bin, path.to_str().unwrap()])
            .current_dir(cwd)
            .env_remove("HOURGLASS_CONFIG")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let found = format!("api_key_file {}", key.display());
    for script in [
        "exec \"$0\" check --config <(cat \"$1\")",
        "exec \"$0\" check --config /dev/stdin < \"$1\"",
        "cat \"$1\" | \"$0\" check --config /dev/stdin",
    ] {
        let (code, stdout, stderr) = bash(dir.path(), script);
        assert_eq!(code, Some(0), "{script}: {stderr}");
        assert!(!stderr.contains("No such file"), "{script}: {stderr}");
        assert!(stdout.contains(&found), "{script}: {stdout}");
    }
    // Elsewhere, the file is missing, and the message says where it was looked for, and why.
    let cwd = empty.path().display().to_string();
    let why = format!(
        "(the config is not a regular file, so its relative paths are resolved against the \
         working directory, {cwd})"
    );
    let (code, _, stderr) = bash(empty.path(), "exec \"$0\" check --config <(cat \"$1\")");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("api_key_file {cwd}/key: No such file")) && stderr.contains(&why),
        "{stderr}"
    );
    let (code, _, stderr) = bash(empty.path(), "exec \"$0\" --config <(cat \"$1\")");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{cwd}/key: No such file")) && stderr.contains(&why),
        "{stderr}"
    );
    // A config that is a file still names files beside itself, wherever it is run from.
    let (code, stdout, stderr) = bash(empty.path(), "exec \"$0\" check --config \"$1\"");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains(&found), "{stdout}");
}

/// The child's output once it exits; killed, and the test failed naming `what`, if it is
/// still running 30 s on (a gateway waiting on a FIFO would never exit by itself).
fn exited(mut child: std::process::Child, what: &str) -> std::process::Output {
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}
