//! The command line as an operator meets it: `hourglass check` on good and bad files, and a
//! server that refuses to start on a bad one.

use std::path::PathBuf;
use std::process::{Command, Output};

fn hourglass(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(args)
        .env_remove("HOURGLASS_CONFIG")
        .output()
        .expect("the binary runs")
}

fn temp_config(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hourglass-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
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
    }
    // The example names its keys' variables; unset here, so check warns (and still passes).
    let out = hourglass(&["check", "--config", "config/hourglass.toml"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("OPENAI_API_KEY"), "{stderr}");
}

#[test]
fn check_reports_syntax_errors_with_file_line_and_column() {
    let path = temp_config(
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
    let path = temp_config(
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

#[test]
fn the_server_refuses_to_start_on_a_bad_config() {
    let path = temp_config(
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
