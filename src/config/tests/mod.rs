//! Tests of config loading, one file per topic; this file holds the shared fixtures: a
//! full example, a minimal valid config that tests extend, and the load helpers.

use std::time::Duration;

use super::Config;

mod describe;
mod egress;
mod invalid;
mod keys;
mod routing;
mod runs;
mod syntax;
mod valid;

const FULL: &str = r#"
[server]
listen = "0.0.0.0:8000"
admin_listen = "127.0.0.1:9100"
max_request_body = 2048
header_read_timeout = "5s"
shutdown_grace = "1m"
drain_delay = "5s"
send_timeout = "20s"
max_connections = 500

[defaults]
budget = "45s"
first_token_timeout = "15s"
reserve = "250ms"

[upstreams.openai]
url = "https://api.openai.com"
api_key_env = "OPENAI_API_KEY"
ca_file = "certs/ca.pem"

[upstreams.anthropic]
url = "http://127.0.0.1:8089/anthropic/"
api_key_env = "ANTHROPIC_API_KEY"
auth = "x-api-key"
propagate_budget = false

[[routes]]
name = "reasoning"
path_prefix = "/v1/chat/completions"
upstream = "openai"
models = ["o3*", "gpt-5?"]
budget = "5m"
first_token_timeout = "2m"

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "openai"
budget = "8s"
first_token_timeout = "5s"
idle_timeout = "3s"

[[routes]]
name = "messages"
path_prefix = "/v1/messages"
upstream = "anthropic"
"#;

/// Minimal valid config; tests append route keys or further tables.
const BASE: &str = r#"[upstreams.openai]
url = "https://api.openai.com"

[upstreams.anthropic]
url = "https://api.anthropic.com"
auth = "x-api-key"

[[routes]]
name = "chat"
path_prefix = "/v1/chat"
upstream = "openai"
"#;

fn load(text: &str) -> Config {
    match Config::from_toml(text, "config/hourglass.toml") {
        Ok(c) => c,
        Err(e) => panic!("expected a valid config, got: {e}"),
    }
}

fn err(text: &str) -> String {
    match Config::from_toml(text, "t.toml") {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

fn with_route_keys(keys: &str) -> String {
    format!("{BASE}{keys}\n")
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
