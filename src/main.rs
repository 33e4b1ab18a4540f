//! The `hourglass` command line: parse arguments, set up logging, load the config, run.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use hourglass::config::Config;
use hourglass_fake::FakeUpstream;

#[derive(Parser)]
#[command(
    name = "hourglass",
    version,
    about = "A budget-aware streaming gateway for LLM APIs"
)]
struct Cli {
    /// Configuration file (of the gateway, and of `check`).
    #[arg(
        long,
        env = "HOURGLASS_CONFIG",
        default_value = "config/hourglass.toml"
    )]
    config: PathBuf,
    /// Log format: `pretty` for people, `json` for log shippers.
    #[arg(long, value_enum, default_value_t = LogFormat::Pretty, global = true)]
    log_format: LogFormat,
    /// Runtime worker threads; 1 runs a single-threaded runtime (least latency on one core),
    /// the default when the process may use only one CPU.
    #[arg(long, env = "HOURGLASS_WORKERS", global = true,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    workers: Option<u16>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration file (`--config`) and print the resolved routes.
    Check {
        /// Configuration file to check [default: the gateway's `--config`, `$HOURGLASS_CONFIG`,
        /// then `config/hourglass.toml`].
        #[arg(long)]
        config: Option<PathBuf>,
        /// Fail (exit 1) where start-up would: a key, CA or certificate file missing here, a
        /// `client_keys_env` or `store_password_env` not set. Without it they are warnings
        /// (a CI machine may lack the secrets).
        #[arg(long)]
        strict: bool,
    },
    /// The gateway and a built-in fake provider in one process; no API key needed.
    Demo,
    /// The time-controllable fake provider, for rehearsing budgets.
    FakeUpstream {
        /// Address to serve on (IP:port)
        #[arg(long, default_value = "127.0.0.1:8089")]
        listen: SocketAddr,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Pretty,
    /// One JSON object per line, for log shippers.
    Json,
    /// Requests as NCSA combined-format lines on stdout; everything else on stderr.
    Access,
}

fn main() -> ExitCode {
    // A variable set but empty (a container env file or a chart that leaves it blank) is
    // no value: clap would read it as one and refuse every command, `--config` given or not,
    // `fake-upstream` too. Its argument then reads no variable.
    let mut command = Cli::command();
    for (arg, var) in [
        ("config", "HOURGLASS_CONFIG"),
        ("workers", "HOURGLASS_WORKERS"),
    ] {
        if std::env::var_os(var).is_some_and(|v| v.is_empty()) {
            command = command.mut_arg(arg, |a| a.env(None::<&str>));
        }
    }
    let matches = command.get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // `--config` belongs to the gateway and to `check`, so that the help of `demo` and
    // `fake-upstream` does not offer it. Before the command it is the parent's, so those two
    // must refuse one given there rather than ignore it. (HOURGLASS_CONFIG in the
    // environment is no request of this run's, and is left alone.)
    let config_given = matches.value_source("config") == Some(ValueSource::CommandLine);
    let refuse = |message: String| -> ! {
        Cli::command()
            .error(clap::error::ErrorKind::ArgumentConflict, message)
            .exit()
    };
    match &cli.command {
        Some(Command::Demo) if config_given => {
            refuse("`demo` reads no configuration file; drop --config".into())
        }
        Some(Command::FakeUpstream { .. }) if config_given => {
            refuse("`fake-upstream` reads no configuration file; drop --config".into())
        }
        // Before and after the command, the last would otherwise win unseen.
        Some(Command::Check {
            config: Some(_), ..
        }) if config_given => {
            refuse("--config is given more than once; give the one file to read".into())
        }
        _ => {}
    }
    // Held to the end of `main`: dropping them writes out the lines still queued.
    let _log = match init_tracing(cli.log_format) {
        Ok(guards) => guards,
        Err(e) => {
            eprintln!("hourglass: cannot start the log's thread: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(Command::Check { config, strict }) = &cli.command {
        return check(config.as_deref().unwrap_or(&cli.config), *strict);
    }
    // One usable CPU (a taskset, a cgroup quota of one core): the multi-thread scheduler
    // would only add hand-offs between threads that share that core (measured: +20 ms p99
    // per chunk and coalesced chunks at 200 streams), so run everything on one thread.
    let workers = cli.workers.map(usize::from).or_else(|| {
        std::thread::available_parallelism()
            .ok()
            .filter(|n| n.get() == 1)
            .map(|_| 1)
    });
    let runtime = match workers {
        Some(1) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Some(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
        None => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hourglass: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            Some(Command::Demo) => demo().await,
            Some(Command::FakeUpstream { listen }) => {
                ignore_hangups(hourglass::server::Hangups::register());
                match hourglass_fake::run(listen).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("hourglass fake-upstream: --listen {listen}: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Some(Command::Check { .. }) => unreachable!("handled before the runtime starts"),
            None => serve(&cli.config).await,
        }
    });
    // Dropping the runtime would wait for every blocking thread: a name lookup hung on a
    // nameserver holds one for the resolver's whole timeout (audit HC 4: exit 5-8 s after
    // SIGTERM, past the 2 s deployment.md promises). Nothing left there is ours to finish:
    // the log has threads of its own, written out when `_log` drops below.
    runtime.shutdown_timeout(std::time::Duration::from_millis(250));
    code
}

/// The output behind `stdio`, written without `Stdout`'s line buffer: the log's thread
/// batches lines itself, and must see how much of a batch each write took (a short write or
/// `EAGAIN` on a non-blocking pipe), which a buffer in between would hide.
fn unbuffered(stdio: impl std::os::fd::AsFd) -> std::io::Result<std::fs::File> {
    Ok(std::fs::File::from(stdio.as_fd().try_clone_to_owned()?))
}

/// The log goes through a thread of its own (`hourglass::telemetry::writer`), one per output: a
/// line is formatted where it is logged and queued, never written there. When 64 MiB of
/// lines wait for a reader that stopped reading, lines are dropped and counted
/// (`hourglass_log_lines_dropped_total`) rather than making the gateway wait.
fn init_tracing(format: LogFormat) -> std::io::Result<Vec<hourglass::telemetry::writer::LogGuard>> {
    use hourglass::telemetry::writer::{spawn, LogWriter};
    use tracing_subscriber::filter::{filter_fn, EnvFilter};
    use tracing_subscriber::prelude::*;
    let (stdout, guard) = spawn(unbuffered(std::io::stdout())?)?;
    let mut guards = vec![guard];
    let mut counted = vec![stdout.clone()];
    // A RUST_LOG the filter cannot read falls back to info, and says so once the log is up
    // (audit ME 5: `hourglass=loud` was set aside without a word). Unset is no error.
    let set_aside = match (
        EnvFilter::try_from_default_env(),
        std::env::var_os("RUST_LOG"),
    ) {
        (Err(e), Some(value)) => Some((value, e)),
        _ => None,
    };
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    match format {
        LogFormat::Json => {
            hourglass::telemetry::log::write_json_lines_to(stdout.clone());
            tracing_subscriber::fmt()
                .with_env_filter(filter())
                .event_format(hourglass::telemetry::json::JsonLines)
                .with_writer(stdout)
                .init();
        }
        LogFormat::Pretty => tracing_subscriber::fmt()
            .with_env_filter(filter())
            .with_ansi(std::io::stdout().is_terminal())
            .compact()
            .with_writer(stdout)
            .init(),
        LogFormat::Access => {
            hourglass::telemetry::access::enable();
            // The access line is the whole record: no timestamp, level or target around it.
            let access = tracing_subscriber::fmt::layer()
                .with_writer(stdout)
                .without_time()
                .with_level(false)
                .with_target(false)
                .with_ansi(false)
                .with_filter(filter_fn(|m| m.target() == "hourglass::access"));
            let (stderr, guard) = spawn(unbuffered(std::io::stderr())?)?;
            guards.push(guard);
            counted.push(stderr.clone());
            let rest = tracing_subscriber::fmt::layer()
                .with_writer(stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .compact()
                .with_filter(filter_fn(|m| {
                    !matches!(m.target(), "hourglass::access" | "hourglass::request")
                }))
                .with_filter(filter());
            tracing_subscriber::registry()
                .with(access)
                .with(rest)
                .init();
        }
    }
    if let Some((value, e)) = set_aside {
        tracing::warn!("RUST_LOG {value:?} is not a valid log filter ({e}); logging at info");
    }
    hourglass::telemetry::metrics::count_dropped_log_lines(move || {
        counted.iter().map(LogWriter::dropped).sum()
    });
    Ok(guards)
}

/// Under `strict`, what start-up refuses is an error, not a warning.
fn check(path: &Path, strict: bool) -> ExitCode {
    match Config::load(path) {
        Ok(config) => {
            let mut refused = false;
            let mut warn = |w: String| {
                if strict && Config::stops_start_up(&w) {
                    refused = true;
                    eprintln!("error: {w}");
                } else {
                    eprintln!("warning: {w}");
                }
            };
            for w in config.warnings() {
                warn(w);
            }
            // The TLS files are read here as start-up reads them: a key that does not fit its
            // certificate, or a file with no PEM in it, fails the check, not the deploy. A
            // file this machine cannot read (a secret mounted only where the gateway runs)
            // is a warning, as key files are. Every such file is named, not the first alone,
            // so that `--strict` as a deploy gate lists them in one run (audit PE 2), and so
            // is every file that is there but wrong (empty, a directory), whatever the others
            // are (audit QB 4).
            let mut tls_failed = false;
            if let Some(tls) = &config.server.tls {
                let files = [("cert", Some(&tls.cert)), ("key", Some(&tls.key))]
                    .into_iter()
                    .chain([
                        ("client_ca", tls.client_ca.as_ref()),
                        ("client_crl", tls.client_crl.as_ref()),
                    ])
                    .filter_map(|(key, p)| Some((key, p?)));
                let mut every_file_usable = true;
                for (key, p) in files {
                    // Probed, not opened: a FIFO's open waits for a writer (audit ME 2);
                    // the read refuses it, saying what it is.
                    if let Err(e) = hourglass::config::file::probe(p) {
                        every_file_usable = false;
                        warn(format!(
                            "server.tls.{key} {}: {e}; {} it",
                            p.display(),
                            hourglass::config::WILL_NOT_START
                        ));
                    } else if let Err(e) = hourglass::server::tls::file_problem(key, p) {
                        every_file_usable = false;
                        tls_failed = true;
                        eprintln!("{e}");
                    }
                }
                // What takes the files together (a key that fits its certificate, CRLs their
                // CAs signed) only when each is usable alone.
                if every_file_usable {
                    match hourglass::server::tls::server_config(tls) {
                        Err(e) => {
                            eprintln!("{e}");
                            tls_failed = true;
                        }
                        Ok(listener) => {
                            let now = std::time::SystemTime::now();
                            for w in listener.warnings(tls, now) {
                                warn(w);
                            }
                        }
                    }
                }
            }
            if tls_failed {
                return ExitCode::FAILURE;
            }
            let errors = hourglass::gateway::preflight::startup_errors(&config);
            for e in &errors {
                eprintln!("{e}");
            }
            if !errors.is_empty() || refused {
                return ExitCode::FAILURE;
            }
            print!("{}", config.describe());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(path: &Path) -> ExitCode {
    let signals = Signals::register();
    // The bytes start-up builds from are the watcher's baseline: an edit made while the
    // gateway starts (seconds, for a large config) is then a change to reload (audit IB 3).
    // A config that is a pipe waits for its writer, as `cat` would: a SIGTERM or Ctrl-C
    // meanwhile ends the process, which has served nothing (audit ME 4).
    let baseline = tokio::select! {
        baseline = hourglass::server::Baseline::read(path) => baseline,
        () = signals.stop.notified() => {
            eprintln!(
                "hourglass: stopped while waiting for the config {} to be written; nothing served",
                hourglass::config::scrub(&path.display().to_string())
            );
            return ExitCode::SUCCESS;
        }
    };
    let loaded = match baseline.text() {
        Some(bytes) => Config::from_file_bytes(path, bytes.to_vec()),
        None => Config::load(path),
    };
    let config = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    run(config, Some((path.to_path_buf(), baseline)), signals).await
}

/// Serves until SIGTERM or Ctrl-C; with a config file, reloads it on SIGHUP and on change.
async fn run(
    config: Config,
    source: Option<(PathBuf, hourglass::server::Baseline)>,
    signals: Signals,
) -> ExitCode {
    for w in config.warnings() {
        tracing::warn!("{w}");
    }
    let (path, baseline) = source.unzip();
    let Signals { stop, hangups } = signals;
    let relative_to_cwd = config.relative_to_cwd.clone();
    // Before any listener or connection takes a descriptor (audit KF 6).
    match hourglass::descriptors::raise_open_file_limit() {
        Ok(was) => {
            tracing::info!(
                soft_was = was.soft,
                soft = was.hard,
                hard = was.hard,
                "open-file limit (RLIMIT_NOFILE): {}",
                if was.soft < was.hard {
                    "soft raised to the hard limit"
                } else {
                    "soft already at the hard limit"
                }
            );
            // Known only here, where the limit is (audit ME 5).
            let max = config.server.max_connections;
            if let Some(w) = hourglass::descriptors::max_connections_warning(max, was.hard) {
                tracing::warn!("{w}");
            }
        }
        Err(e) => tracing::warn!("open-file limit (RLIMIT_NOFILE) left as it was: {e}"),
    }
    match hourglass::server::start_with_source(config, path.clone()).await {
        Ok(running) => {
            if path.is_some() {
                running.watch_config_from(std::time::Duration::from_secs(1), hangups, baseline);
            } else {
                ignore_hangups(hangups);
            }
            running
                .serve_until(move || {
                    let stop = stop.clone();
                    async move { stop.notified().await }
                })
                .await;
            ExitCode::SUCCESS
        }
        Err(e) => {
            // Start-up errors quote what the file named (a key file, a variable), which
            // may be a key pasted into the wrong field.
            let e = e.to_string();
            let note = hourglass::config::missing_file_note(relative_to_cwd.as_deref(), &e)
                .map_or_else(String::new, |n| format!(" {n}"));
            eprintln!("hourglass: {}{note}", hourglass::config::scrub(&e));
            ExitCode::FAILURE
        }
    }
}

async fn demo() -> ExitCode {
    let signals = Signals::register();
    let config = match Config::from_toml(hourglass::DEMO_CONFIG, "config/demo.toml (embedded)") {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(fake_addr) = config
        .upstreams
        .iter()
        .find(|u| u.name == "fake")
        .and_then(|u| u.url.authority())
        .and_then(|a| a.as_str().parse::<SocketAddr>().ok())
    else {
        eprintln!("the demo config needs an upstream \"fake\" with an IP:port url");
        return ExitCode::FAILURE;
    };
    let _fake = match FakeUpstream::start_unrecorded(fake_addr).await {
        Ok(f) => f,
        Err(e) => {
            eprintln!("hourglass demo: fake provider on {fake_addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let listen = config.server.listen;
    let admin = config.server.admin_listen;
    eprintln!(
        "Hourglass demo: gateway on http://{listen}, metrics on http://{admin}/metrics, \
         fake provider on http://{fake_addr}. Try:\n\n  \
         curl -N http://{listen}/v1/chat/completions -H 'content-type: application/json' \
         -d '{{\"model\":\"demo\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'\n"
    );
    run(config, None, signals).await
}

/// With no file to reload (the demo, the fake provider), a SIGHUP must not do what it does
/// by default: end the process at once, cutting every stream without a word to its client.
fn ignore_hangups(mut hangups: hourglass::server::Hangups) {
    tokio::spawn(async move {
        loop {
            hangups.next().await;
            tracing::info!("SIGHUP: this process has no config file to reload");
        }
    });
}

/// The signals the gateway answers, taken over from their default actions (which end the
/// process at once) before the config is read or a listener bound (audit IB 1: a signal
/// sent just after `/readyz` first said ready killed the process, cutting what it had
/// accepted without a word). A SIGTERM or Ctrl-C that comes during start-up is kept, and
/// starts the drain as soon as the gateway serves; a SIGHUP is kept for the watcher.
struct Signals {
    /// One permit per SIGTERM or SIGINT not yet taken: `serve_until` takes the first to
    /// drain, a second to cut.
    stop: std::sync::Arc<tokio::sync::Notify>,
    hangups: hourglass::server::Hangups,
}

impl Signals {
    fn register() -> Signals {
        let stop = std::sync::Arc::new(tokio::sync::Notify::new());
        let hangups = hourglass::server::Hangups::register();
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                (Ok(mut term), Ok(mut int)) => {
                    let stop = stop.clone();
                    tokio::spawn(async move {
                        loop {
                            tokio::select! {
                                _ = term.recv() => {},
                                _ = int.recv() => {},
                            }
                            stop.notify_one();
                        }
                    });
                }
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(
                        "cannot watch for SIGTERM and SIGINT: {e}; one would end the process"
                    );
                }
            }
        }
        #[cfg(not(unix))]
        {
            let stop = stop.clone();
            tokio::spawn(async move {
                while tokio::signal::ctrl_c().await.is_ok() {
                    stop.notify_one();
                }
            });
        }
        Signals { stop, hangups }
    }
}
