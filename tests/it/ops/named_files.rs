//! The reload watcher and files that are not regular files (audit ME 2): a FIFO swapped in
//! where the config names a file, or in the config's own place, fails its reload where it is
//! seen and keeps the running config; the watcher goes on, and a good file reloads.

use super::*;

/// A FIFO made at `path`.
fn mkfifo(path: &std::path::Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

/// Audit ME 2: a FIFO swapped in for an `api_key_file` had the watcher wait for a writer
/// for good: no reload after it, by edit or SIGHUP, and nothing said so (no log, no count,
/// `/readyz` still ready). Now its reload fails visibly, and the file fixed (with an edit)
/// reloads; so for the config file itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_swapped_in_fails_its_reload_visibly_and_a_good_file_reloads() {
    let dir = temp_dir("fifo-swap");
    let key = dir.path().join("up.key");
    std::fs::write(&key, "sk-first-0123456789\n").unwrap();
    let path = dir.path().join("hourglass.toml");
    let text = BASE.replace("{FAKE}", "http://127.0.0.1:9").replace(
        "api_key_env = \"HOURGLASS_TEST_KEY_UNSET\"",
        &format!("api_key_file = {:?}", key.display().to_string()),
    );
    std::fs::write(&path, &text).unwrap();
    let gw = server::start_with_source(Config::load(&path).unwrap(), Some(path.clone()))
        .await
        .unwrap();
    gw.watch_config(Duration::from_millis(50));
    let wait_for = |result: &'static str, n: usize| {
        let gw = &gw;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while reloads(gw, result) != n {
                assert!(
                    Instant::now() < deadline,
                    "never {n} {result} reloads:\n{}",
                    gw.metrics.encode()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    std::fs::remove_file(&key).unwrap();
    mkfifo(&key);
    wait_for("error", 1).await;
    let ready = admin_get(gw.admin_addr, "/readyz").await;
    assert!(
        ready.contains("last reload failed") && ready.contains("a FIFO, not a regular file"),
        "{ready}"
    );
    // Fixed, with an edit beside it: one reload, of both.
    std::fs::remove_file(&key).unwrap();
    std::fs::write(&key, "sk-second-0123456789\n").unwrap();
    let edited = text.replace("budget = \"10s\"", "budget = \"12s\"");
    std::fs::write(&path, &edited).unwrap();
    wait_for("ok", 1).await;
    let ready = admin_get(gw.admin_addr, "/readyz").await;
    assert!(!ready.contains("last reload failed"), "{ready}");

    // The config file itself swapped for a FIFO: refused the same way, then put back.
    std::fs::remove_file(&path).unwrap();
    mkfifo(&path);
    wait_for("error", 2).await;
    let ready = admin_get(gw.admin_addr, "/readyz").await;
    assert!(ready.contains("a FIFO, not a regular file"), "{ready}");
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, &text).unwrap();
    wait_for("ok", 2).await;
    gw.shutdown().await;
}
