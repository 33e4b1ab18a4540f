//! Hourglass against nginx, haproxy, a direct connection and a bare hyper proxy, side by side
//! (issue 3).
//!
//! `scripts/bench.sh` is the front door (it installs the peers and the plotting venv); this
//! binary is `cargo bench --bench gateway -- [--quick] [--out DIR] [--targets a,b]
//! [--scenarios a,b]`.
//!
//! Layout of a run: this process (the load generator and the fake provider, in-process so
//! that the fake's `x_fake_sent_ns` stamps and the client's receive times read the same
//! clock) is pinned to the first allowed core; each gateway is a separate process pinned to
//! the last one, started fresh for every scenario and target. Scenarios and their targets
//! are in `scenarios.rs`, the table and the verdicts in `report.rs`.

mod bare;
mod client;
mod h2client;
mod lineup;
mod peers;
mod report;
mod scenarios;
mod stats;
mod targets;

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use serde_json::json;

use lineup::{Env, Limits, Target};
use scenarios::{Ctx, Params, Setup};

const SCENARIOS: [&str; 6] = ["nonstream", "streams", "leave", "memory", "limits", "cpu"];

/// Hourglass against nginx, haproxy, a direct connection and a bare hyper proxy
/// (`scripts/bench.sh` runs this).
#[derive(clap::Parser)]
#[command(bin_name = "cargo bench --bench gateway --")]
struct Args {
    /// A short smoke run: seconds, no verdicts.
    #[arg(long)]
    quick: bool,
    /// Where the results go (default: bench-results/, or target/bench-quick/ or
    /// target/bench-partial/ for a quick or partial run).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Which targets to measure (default: all: direct, hourglass, hourglass-mt, nginx,
    /// haproxy, bare-hyper, bare-hyper-conn, litellm, portkey; hourglass-h2 and the targets
    /// with HTTP/2 clients, hourglass-h2h2, haproxy-h2h2, bare-hyper-h2h2 and direct-h2, only
    /// by name; a quick run leaves out litellm and portkey unless named); the direct
    /// connection is always added (added latency is measured against it).
    #[arg(long, value_delimiter = ',', value_parser = target)]
    targets: Vec<Target>,
    /// Which scenarios to run (default: all).
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(SCENARIOS))]
    scenarios: Vec<String>,
    /// Passed by `cargo bench` to every bench binary.
    #[arg(long, hide = true)]
    bench: bool,
    /// Run as the bare hyper proxy target instead (the harness starts itself this way).
    #[arg(long, hide = true, value_enum, requires_all = ["bare_listen", "bare_upstream"])]
    bare_proxy: Option<bare::Mode>,
    #[arg(long, hide = true)]
    bare_listen: Option<std::net::SocketAddr>,
    #[arg(long, hide = true)]
    bare_upstream: Option<std::net::SocketAddr>,
}

fn target(name: &str) -> Result<Target, String> {
    Target::from_name(name.trim()).ok_or_else(|| {
        format!(
            "{name:?} is not a target (one of: {})",
            Target::ALL
                .into_iter()
                .chain(Target::EXTRA)
                .map(Target::name)
                .collect::<Vec<_>>()
                .join(",")
        )
    })
}

fn parse_args() -> Args {
    let mut args = <Args as clap::Parser>::parse();
    if args.targets.is_empty() {
        // LiteLLM and Portkey take minutes to install and seconds to start: the quick run
        // (CI's smoke run) measures them only when asked.
        args.targets = Target::ALL
            .into_iter()
            .filter(|t| !(args.quick && t.is_llm_peer()))
            .collect();
    }
    if args.scenarios.is_empty() {
        args.scenarios = SCENARIOS.map(String::from).to_vec();
    }
    if !args.targets.contains(&Target::Direct) {
        args.targets.insert(0, Target::Direct);
    }
    args
}

fn proc_status_field(name: &str) -> Option<String> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(name))
                .map(|l| l[name.len()..].trim().to_owned())
        })
}

/// CPUs this process may run on, from a list like `0-1,4`.
fn allowed_cpus() -> Vec<usize> {
    let list = proc_status_field("Cpus_allowed_list:").unwrap_or_default();
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    cpus.extend(a..=b);
                }
            }
            None => cpus.extend(part.parse::<usize>().ok()),
        }
    }
    cpus
}

fn nofile_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(1024)
}

const PINNED: &str = "HOURGLASS_BENCH_PINNED";

/// Re-executes this binary under `taskset` on the load core (first allowed CPU), with a
/// real-time (or at least the highest) priority and the open-files soft limit raised to the
/// hard one; the gateway core (last allowed CPU) is passed along.
fn pin_self(load: usize, gateway: usize) {
    if std::env::var_os(PINNED).is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    // `prlimit --nofile=HARD` sets the soft limit to the hard one (the most an unprivileged
    // process, or one without CAP_SYS_RESOURCE, may have).
    let hard = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(4).map(str::to_owned))
        })
        .unwrap_or_else(|| "1024".into());
    // A real-time priority too where allowed (SCHED_FIFO, inherited by the gateways), else
    // nice -20: on a shared machine, background work (a compiler on the gateway's core)
    // otherwise adds milliseconds to whatever it preempts. Every target is treated the same.
    let rt = Command::new("chrt")
        .args(["-f", "20", "true"])
        .status()
        .is_ok_and(|s| s.success());
    let sched: &[&str] = if rt {
        &["chrt", "-f", "20"]
    } else {
        &["nice", "-n", "-20"]
    };
    let err = Command::new(sched[0])
        .args(&sched[1..])
        .arg("prlimit")
        .arg(format!("--nofile={hard}:{hard}"))
        .arg("--")
        .arg("taskset")
        .arg("-c")
        .arg(load.to_string())
        .arg(exe)
        .args(args)
        .env(PINNED, gateway.to_string())
        .exec();
    eprintln!("[bench] cannot pin with chrt/nice, prlimit, taskset ({err}); running unpinned");
}

/// This process's scheduling policy as /proc shows it (field 41 of stat: 0 normal, 1 FIFO).
fn scheduling() -> String {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    // After the command name, field 3 is index 0: priority is field 18, nice 19, policy 41.
    let get = |n: usize| fields.get(n - 3).copied().unwrap_or("?");
    match get(41) {
        "1" => format!("SCHED_FIFO, priority {}", get(40)),
        "0" => format!("SCHED_OTHER, nice {}", get(19)),
        p => format!("policy {p}"),
    }
}

fn find_bin(name: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

fn git_rev() -> String {
    Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn machine() -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':').map(|(_, v)| v.trim().to_owned()))
        })
        .unwrap_or_default();
    let mem_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let debian = std::fs::read_to_string("/etc/debian_version").unwrap_or_default();
    json!({
        "cpu": cpu,
        // Online CPUs, not this (pinned) process's share of them.
        "cpus": std::fs::read_to_string("/proc/cpuinfo")
            .map_or(0, |s| s.lines().filter(|l| l.starts_with("processor")).count()),
        "memory_gib": (mem_kib as f64 / 1048576.0 * 10.0).round() / 10.0,
        "kernel": kernel.trim(),
        "debian": debian.trim(),
    })
}

fn main() -> ExitCode {
    let args = parse_args();
    if let (Some(mode), Some(listen), Some(upstream)) =
        (args.bare_proxy, args.bare_listen, args.bare_upstream)
    {
        return match bare::run(mode, listen, upstream) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bare proxy: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let cpus = allowed_cpus();
    let (load_core, gateway_core) = match std::env::var(PINNED) {
        Ok(g) => (cpus.first().copied().unwrap_or(0), g.parse().unwrap_or(0)),
        Err(_) => {
            let load = cpus.first().copied().unwrap_or(0);
            let gw = cpus.last().copied().unwrap_or(0);
            if load == gw {
                eprintln!("[bench] only one CPU: the gateways share it with the load generator");
            }
            pin_self(load, gw);
            (load, gw)
        }
    };
    let quick = args.quick;
    // Only a full run of everything lands in bench-results/ (the committed results).
    let partial = Target::ALL.iter().any(|t| !args.targets.contains(t))
        || args.scenarios.len() < SCENARIOS.len();
    // The run's size (quick or full) and, for a full-size run, whether it measured every target
    // and scenario: the results' header says which, so a partial run is not taken for a full one.
    let mode = match (quick, partial) {
        (true, _) => "quick",
        (false, true) => "partial",
        (false, false) => "full",
    };
    let out_dir = args.out.clone().unwrap_or_else(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        if quick {
            root.join("target/bench-quick")
        } else if partial {
            root.join("target/bench-partial")
        } else {
            root.join("bench-results")
        }
    });
    let run_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-run");
    let _ = std::fs::remove_dir_all(&run_dir);
    if let Err(e) = std::fs::create_dir_all(&run_dir).and(std::fs::create_dir_all(&out_dir)) {
        eprintln!("[bench] cannot create {}: {e}", out_dir.display());
        return ExitCode::FAILURE;
    }
    let nofile = nofile_limit();
    let env = Env {
        hourglass: PathBuf::from(env!("CARGO_BIN_EXE_hourglass")),
        harness: match std::env::current_exe() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("[bench] cannot find this binary ({e}): the bare proxies need it");
                return ExitCode::FAILURE;
            }
        },
        nginx: find_bin("nginx"),
        haproxy: find_bin("haproxy"),
        litellm: peers::litellm_bin(Path::new(env!("CARGO_MANIFEST_DIR"))),
        portkey: peers::portkey_entry(Path::new(env!("CARGO_MANIFEST_DIR"))),
        node: peers::node_bin(),
        gateway_core,
        run_dir,
        nofile,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut targets = args.targets.clone();
    let mut skipped = Vec::new();
    targets.retain(|&t| {
        if let Some(why) = env.missing(t) {
            eprintln!("[bench] {}: skipped: {why}", t.name());
            skipped.push(json!({"target": t.name(), "reason": why}));
            return false;
        }
        if !env.available(t) {
            eprintln!(
                "[bench] {} is not installed: skipped (scripts/bench.sh installs it)",
                t.name()
            );
            skipped.push(json!({"target": t.name(), "reason": "not installed"}));
            return false;
        }
        // An installed LLM gateway may still fail to start or to stream: find out once, and
        // skip it with the reason rather than fail every scenario.
        if t.is_llm_peer() {
            eprintln!("[bench] {}: checking that it starts and streams", t.name());
            if let Err(why) = runtime.block_on(probe(&env, t)) {
                eprintln!("[bench] {}: skipped: {why}", t.name());
                skipped.push(json!({"target": t.name(), "reason": why}));
                return false;
            }
        }
        true
    });
    let p = if quick {
        Params::quick()
    } else {
        Params::full(nofile)
    };
    // Only those measured: the table names the versions of the targets it shows.
    let llm_versions = peers::versions(&env);
    let llm_version =
        |t: Target| Some(llm_versions[t.name()].clone()).filter(|_| targets.contains(&t));
    let versions = json!({
        "hourglass": git_rev(),
        "nginx": env.nginx.as_deref().map(|b| targets::version_of(b, "-v")),
        "haproxy": env.haproxy.as_deref().map(|b| targets::version_of(b, "-v")),
        "litellm": llm_version(Target::Litellm),
        "portkey": llm_version(Target::Portkey),
        "rustc": option_env!("RUSTC_VERSION").unwrap_or(""),
    });
    eprintln!(
        "[bench] {} run: load generator + fake on CPU {load_core}, gateways on CPU {gateway_core}, \
         open-files limit {nofile}; targets: {}",
        mode,
        targets.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
    );
    let ctx = Ctx { env, targets, p };
    let started = Instant::now();
    let mut results = serde_json::Map::new();
    // The HTTP/2 client exists only in the memory and leave scenarios: the others leave the
    // targets that need it out.
    let h1_ctx = Ctx {
        env: ctx.env.clone(),
        targets: ctx
            .targets
            .iter()
            .copied()
            .filter(|t| !t.h2_clients())
            .collect(),
        p: ctx.p.clone(),
    };
    runtime.block_on(async {
        for s in &args.scenarios {
            let t0 = Instant::now();
            if !matches!(s.as_str(), "memory" | "leave") {
                for t in ctx.targets.iter().filter(|t| t.h2_clients()) {
                    eprintln!(
                        "[bench] {s}: {} left out (HTTP/2 clients only in memory and leave)",
                        t.name()
                    );
                }
            }
            let v = match s.as_str() {
                "nonstream" => scenarios::nonstream(&h1_ctx).await,
                "streams" => scenarios::streams(&h1_ctx).await,
                "leave" => scenarios::leave(&ctx).await,
                "memory" => scenarios::memory(&ctx).await,
                "limits" => scenarios::limits(&h1_ctx).await,
                "cpu" => scenarios::cpu(&h1_ctx).await,
                _ => unreachable!("checked in parse_args"),
            };
            eprintln!("[bench] {s}: {:.1} s", t0.elapsed().as_secs_f64());
            results.insert(s.clone(), v);
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let doc = json!({
        "meta": {
            "mode": mode,
            "duration_s": elapsed,
            "machine": machine(),
            "load_core": load_core,
            "gateway_core": gateway_core,
            "nofile_limit": nofile,
            "scheduling": scheduling(),
            "targets": ctx.targets.iter().map(|t| t.name()).collect::<Vec<_>>(),
            "skipped": skipped,
            "versions": versions,
            "date": Command::new("date").arg("-u").arg("+%Y-%m-%d %H:%M UTC").output().ok()
                .and_then(|o| String::from_utf8(o.stdout).ok()).map(|s| s.trim().to_owned()),
        },
        "scenarios": results,
    });
    let markdown = report::markdown(&doc, !quick);
    let json_path = out_dir.join("results.json");
    let md_path = out_dir.join("results.md");
    let text = stats::to_json_text(&doc);
    if let Err(e) = std::fs::write(&json_path, text).and(std::fs::write(&md_path, &markdown)) {
        eprintln!("[bench] cannot write results: {e}");
        return ExitCode::FAILURE;
    }
    println!("{markdown}");
    let failures = failures(&doc["scenarios"], "");
    for f in &failures {
        eprintln!("[bench] FAILED: {f}");
    }
    eprintln!(
        "[bench] done in {elapsed:.0} s: {} and {}",
        json_path.display(),
        md_path.display()
    );
    // A target that could not be measured fails the run (and so the CI smoke run).
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Every `"error": "..."` the scenarios recorded, with where it was.
fn failures(v: &serde_json::Value, at: &str) -> Vec<String> {
    match v {
        serde_json::Value::Object(map) => map
            .iter()
            .flat_map(|(k, v)| match (k.as_str(), v) {
                ("error", serde_json::Value::String(e)) => vec![format!("{at}: {e}")],
                _ => failures(v, &format!("{at}/{k}")),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Starts the target once against a fresh fake and runs the warm-up (plain requests and one
/// stream): a peer that does not start or cannot stream is skipped with the reason, instead of
/// failing every scenario one by one.
async fn probe(env: &Env, t: Target) -> Result<(), String> {
    let ctx = Ctx {
        env: env.clone(),
        targets: Vec::new(),
        p: Params::quick(),
    };
    let setup = Setup::new(&ctx, t, Limits::RELAXED, "probe").await?;
    setup.stop().await;
    Ok(())
}
