//! The LLM gateways users would pick instead of Hourglass (issue 25): LiteLLM's proxy and
//! Portkey's gateway, as targets beside nginx and haproxy. `scripts/bench.sh` installs them
//! under target/ (they are slow to install, so the quick run leaves them out unless named in
//! `--targets`); this file finds them, writes their configuration, starts them and checks that
//! they work at all before a run counts on them.
//!
//! Both are told to reach the fake provider as an OpenAI-compatible upstream. The fake is
//! scripted by `x-fake-*` request headers and the leave scenario finds a stream's upstream
//! connection by `x-bench-id`, so each peer is told to forward those headers: LiteLLM with
//! `forward_client_headers_to_llm_api` in `general_settings` (it forwards every `x-` header then), Portkey with its
//! `x-portkey-forward-headers` list. Portkey takes its whole route (provider, custom host,
//! key, timeout) from request headers, which the load generator adds through
//! [`extra_headers`] for a Portkey address.

use std::collections::HashMap;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{OnceLock, PoisonError, RwLock};
use std::time::Duration;

use crate::scenarios::{Ctx, Params, Setup};
use crate::targets::{Env, Limits, Target};

/// LiteLLM's master key, which every request to it carries.
const LITELLM_KEY: &str = "sk-hourglass-bench";

/// Where scripts/bench.sh installs them (relative to the crate root).
pub const LITELLM_VENV: &str = "target/litellm-venv";
pub const PORTKEY_DIR: &str = "target/portkey";
const PORTKEY_ENTRY: &str = "node_modules/@portkey-ai/gateway/build/start-server.js";

/// The `x-fake-*` and `x-bench-id` headers the harness sends: what Portkey must forward.
const FORWARD: &str = "x-bench-id,x-fake-chunks,x-fake-interval-ms,x-fake-timestamps,\
x-fake-headers-first,x-fake-freeze-after,x-fake-ttft-ms";

pub fn litellm_bin(root: &Path) -> Option<PathBuf> {
    Some(root.join(LITELLM_VENV).join("bin/litellm")).filter(|p| p.exists())
}

pub fn portkey_entry(root: &Path) -> Option<PathBuf> {
    Some(root.join(PORTKEY_DIR).join(PORTKEY_ENTRY)).filter(|p| p.exists())
}

pub fn node_bin() -> Option<PathBuf> {
    ["/usr/bin/node", "/usr/local/bin/node"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Why a target cannot run here, or `None` if it can be tried.
pub fn missing(env: &Env, t: Target) -> Option<String> {
    match t {
        Target::Litellm if env.litellm.is_none() => Some(format!(
            "LiteLLM is not installed in {LITELLM_VENV} (scripts/bench.sh installs it in a full \
             run, or when --targets names it)"
        )),
        Target::Portkey if env.portkey.is_none() => Some(format!(
            "Portkey is not installed in {PORTKEY_DIR} (scripts/bench.sh installs it in a full \
             run, or when --targets names it)"
        )),
        Target::Portkey if env.node.is_none() => Some("node is not installed".into()),
        _ => None,
    }
}

/// Starts the target once against a fresh fake and runs the warm-up (plain requests and one
/// stream): a peer that does not start or cannot stream is skipped with the reason, instead of
/// failing every scenario one by one.
pub async fn probe(env: &Env, t: Target) -> Result<(), String> {
    let ctx = Ctx {
        env: env.clone(),
        targets: Vec::new(),
        p: Params::quick(),
    };
    let setup = Setup::new(&ctx, t, Limits::RELAXED, "probe").await?;
    setup.stop().await;
    Ok(())
}

/// How long a target may take to listen: LiteLLM imports a great deal of Python first (about
/// 10-20 s on this machine, more while a compiler shares the core).
pub fn start_timeout(t: Target) -> Duration {
    match t {
        Target::Litellm => Duration::from_secs(120),
        Target::Portkey => Duration::from_secs(30),
        _ => Duration::from_secs(10),
    }
}

/// The first line of `litellm --version` costs seconds of imports: the version is read from
/// the installed packages' metadata instead.
pub fn versions(env: &Env) -> serde_json::Value {
    let litellm = env.litellm.as_ref().and_then(|bin| {
        let site = bin.parent()?.parent()?.join("lib");
        dist_version(&site, "litellm-")
    });
    let portkey = env.portkey.as_ref().map(|entry| {
        let modules = entry.ancestors().nth(4).unwrap_or(entry);
        let v = |pkg: &str| npm_version(&modules.join(pkg).join("package.json"));
        format!(
            "{} (@hono/node-server {})",
            v("@portkey-ai/gateway"),
            v("@hono/node-server")
        )
    });
    serde_json::json!({"litellm": litellm, "portkey": portkey})
}

fn dist_version(lib: &Path, prefix: &str) -> Option<String> {
    for py in fs::read_dir(lib).ok()?.flatten() {
        let site = py.path().join("site-packages");
        for e in fs::read_dir(&site).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(rest) = name.strip_prefix(prefix) {
                if let Some(v) = rest.strip_suffix(".dist-info") {
                    if v.starts_with(|c: char| c.is_ascii_digit()) {
                        return Some(v.to_owned());
                    }
                }
            }
        }
    }
    None
}

fn npm_version(package_json: &Path) -> String {
    fs::read_to_string(package_json)
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|v| v["version"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// LiteLLM's proxy: one model entry pointing at the fake as an OpenAI-compatible provider,
/// no database, one worker. Its per-request timeouts are set to the scenario's limit:
/// `stream_timeout` (streams) and `timeout` (other calls) become the OpenAI client's httpx
/// timeout, which is a connect, read (longest silence) and write timeout, not a total.
pub fn litellm_command(
    cmd: &mut Command,
    env: &Env,
    dir: &Path,
    addr: SocketAddr,
    upstream: SocketAddr,
    limits: Limits,
) -> Result<(), String> {
    let bin = env.litellm.as_ref().ok_or("LiteLLM is not installed")?;
    let secs = limits.idle.as_secs_f64();
    let config = format!(
        r#"# Generated by benches/gateway: the fake provider as an OpenAI-compatible model.
model_list:
  - model_name: bench
    litellm_params:
      model: openai/bench
      api_base: http://{upstream}/v1
      api_key: fake
      timeout: {secs}
      stream_timeout: {secs}
litellm_settings:
  request_timeout: {secs}
  # No retries: a retried timeout would hide what one limit does (and double the upstream
  # calls the leave scenario counts).
  num_retries: 0
  telemetry: false
router_settings:
  num_retries: 0
general_settings:
  # The fake is scripted by x-fake-* headers and streams are matched by x-bench-id: with
  # this LiteLLM forwards every client header that starts with `x-`.
  forward_client_headers_to_llm_api: true
  # It refuses to start without one; with no database the master key is the only key.
  master_key: {LITELLM_KEY}
"#
    );
    let path = dir.join("litellm.yaml");
    fs::write(&path, config).map_err(|e| format!("{}: {e}", path.display()))?;
    cmd.arg(bin)
        .arg("--config")
        .arg(&path)
        .arg("--host")
        .arg(addr.ip().to_string())
        .arg("--port")
        .arg(addr.port().to_string())
        .arg("--num_workers")
        .arg("1")
        // Its model price list would otherwise be fetched from the internet at start-up.
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("LITELLM_LOG", "ERROR")
        .env_remove("DATABASE_URL")
        .env("NO_DOCKER", "1");
    Ok(())
}

/// Portkey's gateway under node, headless (no log UI).
///
/// `--single-threaded` (V8's: no background compiler or GC threads): under the harness's
/// SCHED_FIFO on one core, node's main thread spins waiting for a V8 helper thread that a
/// FIFO thread of the same priority never lets run, and every upstream fetch hangs until
/// Portkey's own timeout (408 after 30 s). Pinned to one core those threads only share it.
pub fn portkey_command(cmd: &mut Command, env: &Env, addr: SocketAddr) -> Result<(), String> {
    let entry = env.portkey.as_ref().ok_or("Portkey is not installed")?;
    let node = env.node.as_ref().ok_or("node is not installed")?;
    cmd.arg(node)
        .arg("--single-threaded")
        .arg(entry)
        .arg(format!("--port={}", addr.port()))
        .arg("--headless");
    Ok(())
}

type Headers = Vec<(&'static str, String)>;

fn registry() -> &'static RwLock<HashMap<SocketAddr, Headers>> {
    static EXTRA: OnceLock<RwLock<HashMap<SocketAddr, Headers>>> = OnceLock::new();
    EXTRA.get_or_init(Default::default)
}

/// Records the headers every request to `addr` must carry for `target` (LiteLLM's key,
/// Portkey's route), or forgets them for any other target (a port may be reused by the next
/// gateway).
pub fn set_extra_headers(addr: SocketAddr, target: Target, upstream: SocketAddr, limits: Limits) {
    let mut map = registry().write().unwrap_or_else(PoisonError::into_inner);
    let headers = match target {
        Target::Litellm => vec![("authorization", format!("Bearer {LITELLM_KEY}"))],
        Target::Portkey => vec![
            ("x-portkey-provider", "openai".into()),
            ("x-portkey-custom-host", format!("http://{upstream}/v1")),
            ("authorization", "Bearer fake".into()),
            ("x-portkey-forward-headers", FORWARD.into()),
            // Portkey's only time limit: it aborts the upstream fetch when no response head
            // came within it (the timer is cleared once the head is in).
            (
                "x-portkey-request-timeout",
                limits.idle.as_millis().to_string(),
            ),
        ],
        _ => {
            map.remove(&addr);
            return;
        }
    };
    map.insert(addr, headers);
}

/// The extra headers of a request to `addr` (none unless it is LiteLLM or Portkey).
pub fn extra_headers(addr: SocketAddr) -> Headers {
    registry()
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&addr)
        .cloned()
        .unwrap_or_default()
}
