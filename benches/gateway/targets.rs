//! The gateways under test, each a separate process pinned to its own core: how they are
//! configured, started, measured (/proc) and stopped.

use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use crate::lineup::{Env, Limits, Target};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A running gateway process.
pub struct Gateway {
    pub target: Target,
    pub addr: SocketAddr,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl Gateway {
    pub async fn start(
        env: &Env,
        target: Target,
        upstream: SocketAddr,
        limits: Limits,
        label: &str,
    ) -> Result<Gateway, String> {
        let port = free_port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let dir = env.run_dir.join(format!("{label}-{}", target.name()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut cmd = Command::new("taskset");
        cmd.arg("-c").arg(env.gateway_core.to_string());
        // For profiling: HOURGLASS_BENCH_WRAP="valgrind --tool=massif" (or a perf record
        // command line ending in `--`) runs the gateway under that tool.
        if let Ok(wrap) = std::env::var("HOURGLASS_BENCH_WRAP") {
            cmd.args(wrap.split_whitespace());
        }
        let ms = limits.idle.as_millis();
        match target {
            Target::Direct | Target::DirectH2 => unreachable!("the direct target has no gateway"),
            Target::Hourglass
            | Target::HourglassMt
            | Target::HourglassH2
            | Target::HourglassH2H2 => {
                let http2 = if matches!(target, Target::HourglassH2 | Target::HourglassH2H2) {
                    "always"
                } else {
                    "auto"
                };
                let config = hourglass_config(addr, free_port(), upstream, ms, http2);
                let path = dir.join("hourglass.toml");
                write(&path, &config)?;
                cmd.arg(&env.hourglass)
                    .arg("--config")
                    .arg(&path)
                    .arg("--log-format")
                    .arg("json");
                let workers = if target != Target::HourglassMt {
                    "1"
                } else {
                    "2"
                };
                cmd.arg("--workers").arg(workers);
                cmd.env_remove("HOURGLASS_WORKERS").env_remove("RUST_LOG");
            }
            Target::BarePool | Target::BareConn | Target::BareH2H2 => {
                let mode = match target {
                    Target::BarePool => "pool",
                    Target::BareConn => "conn",
                    _ => "h2",
                };
                cmd.arg(&env.harness)
                    .arg("--bare-proxy")
                    .arg(mode)
                    .arg("--bare-listen")
                    .arg(addr.to_string())
                    .arg("--bare-upstream")
                    .arg(upstream.to_string());
            }
            Target::Nginx => {
                let bin = env.nginx.as_ref().ok_or("nginx is not installed")?;
                let path = dir.join("nginx.conf");
                write(&path, &nginx_config(&dir, addr, upstream, ms))?;
                cmd.arg(bin)
                    .arg("-p")
                    .arg(&dir)
                    .arg("-e")
                    .arg(dir.join("error.log"))
                    .arg("-c")
                    .arg(&path);
            }
            Target::Haproxy | Target::HaproxyH2H2 => {
                let bin = env.haproxy.as_ref().ok_or("haproxy is not installed")?;
                let path = dir.join("haproxy.cfg");
                // haproxy wants about two descriptors per connection and refuses to start
                // when the open-files limit cannot hold maxconn of them.
                let maxconn = (env.nofile.saturating_sub(100) / 2).clamp(1000, 50_000);
                let h2 = target == Target::HaproxyH2H2;
                write(&path, &haproxy_config(addr, upstream, ms, maxconn, h2))?;
                cmd.arg(bin).arg("-db").arg("-f").arg(&path);
            }
            Target::Litellm => {
                crate::peers::litellm_command(&mut cmd, env, &dir, addr, upstream, limits)?;
            }
            Target::Portkey => crate::peers::portkey_command(&mut cmd, env, addr)?,
        }
        crate::peers::set_extra_headers(addr, target, upstream, limits);
        let log = fs::File::create(dir.join("stdout-stderr.log")).map_err(|e| e.to_string())?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
        let child = cmd
            .spawn()
            .map_err(|e| format!("{}: cannot start: {e}", target.name()))?;
        let mut gw = Gateway {
            target,
            addr,
            dir,
            child: Some(child),
        };
        gw.wait_ready().await?;
        Ok(gw)
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        // A profiler (HOURGLASS_BENCH_WRAP) can take many seconds to start the gateway.
        let wrapped = std::env::var_os("HOURGLASS_BENCH_WRAP").is_some();
        let limit = crate::peers::start_timeout(self.target).max(if wrapped {
            Duration::from_secs(120)
        } else {
            Duration::ZERO
        });
        let deadline = Instant::now() + limit;
        loop {
            if tokio::net::TcpStream::connect(self.addr).await.is_ok() {
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() > deadline {
                let log =
                    fs::read_to_string(self.dir.join("stdout-stderr.log")).unwrap_or_default();
                let err = fs::read_to_string(self.dir.join("error.log")).unwrap_or_default();
                return Err(format!(
                    "{} did not start listening on {} ({:?}):\n{log}{err}",
                    self.target.name(),
                    self.addr,
                    exited
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The process and its descendants (nginx's worker).
    pub fn pids(&self) -> Vec<u32> {
        process_tree(self.pid())
    }

    /// Resident memory of the whole process tree, KiB.
    pub fn rss_kib(&self) -> u64 {
        self.pids().into_iter().map(rss_kib).sum()
    }

    pub fn cpu(&self) -> Cpu {
        self.pids()
            .into_iter()
            .map(Cpu::of)
            .fold(Cpu::default(), |a, b| a + b)
    }

    /// SIGTERM, a short grace, then SIGKILL for whatever is left of the tree.
    pub async fn stop(mut self) {
        let pids = self.pids();
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal("TERM", child.id());
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        for pid in pids {
            if Path::new(&format!("/proc/{pid}")).exists() {
                signal("KILL", pid);
            }
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pids = process_tree(child.id());
            let _ = child.kill();
            let _ = child.wait();
            for pid in pids {
                signal("KILL", pid);
            }
        }
    }
}

fn signal(sig: &str, pid: u32) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

fn hourglass_config(
    addr: SocketAddr,
    admin: u16,
    upstream: SocketAddr,
    idle_ms: u128,
    http2: &str,
) -> String {
    format!(
        r#"# Generated by benches/gateway: one route to the fake provider.
[server]
listen = "{addr}"
admin_listen = "127.0.0.1:{admin}"
shutdown_grace = "1s"

[defaults]
budget = "10m"
max_budget = "10m"
connect_timeout = "2s"
first_token_timeout = "{idle_ms}ms"
idle_timeout = "{idle_ms}ms"

[upstreams.fake]
url = "http://{upstream}"
auth = "none"
http2 = "{http2}"

[[routes]]
name = "bench"
path_prefix = "/v1"
upstream = "fake"
"#
    )
}

fn nginx_config(dir: &Path, addr: SocketAddr, upstream: SocketAddr, idle_ms: u128) -> String {
    let d = dir.display();
    format!(
        r#"# Generated by benches/gateway: the setup the issue prescribes (one worker, no proxy
# buffering, HTTP/1.1 keep-alive to the upstream, the read timeout as the idle limit).
worker_processes 1;
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{
    worker_connections 65535;
}}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    keepalive_requests 10000000;
    keepalive_timeout 75s;
    upstream fake {{
        server {upstream};
        keepalive 1024;
        keepalive_requests 10000000;
        keepalive_timeout 75s;
    }}
    server {{
        listen {addr} backlog=4096;
        location / {{
            proxy_pass http://fake;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_connect_timeout 2s;
            proxy_read_timeout {idle_ms}ms;
            proxy_send_timeout {idle_ms}ms;
        }}
    }}
}}
"#
    )
}

/// `h2`: HTTP/2 on both sides, h2c from the clients (`bind ... proto h2`) and to the fake
/// (`server ... proto h2`); everything else the same.
fn haproxy_config(
    addr: SocketAddr,
    upstream: SocketAddr,
    idle_ms: u128,
    maxconn: u64,
    h2: bool,
) -> String {
    let proto = if h2 { " proto h2" } else { "" };
    let reuse = if h2 { "always" } else { "safe" };
    format!(
        r#"# Generated by benches/gateway: one thread, http-no-delay (without it haproxy coalesces
# small SSE writes), keep-alive to the server, `timeout server` as the idle limit. No `log`
# line: haproxy logs nothing without a log target.
global
    nbthread 1
    maxconn {maxconn}

defaults
    mode http
    maxconn {maxconn}
    option http-no-delay
    option http-keep-alive
    http-reuse {reuse}
    option abortonclose
    timeout connect 2s
    timeout client 60s
    timeout server {idle_ms}ms
    timeout http-keep-alive 75s

frontend fe
    bind {addr}{proto}
    default_backend be

backend be
    server fake {upstream}{proto}
"#
    )
}

/// `pid` and all its descendants, found through /proc/*/stat.
pub fn process_tree(pid: u32) -> Vec<u32> {
    if pid == 0 {
        return Vec::new();
    }
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(stat) = read_stat(p) {
                if let Some(ppid) = stat.get(1).and_then(|s| s.parse().ok()) {
                    parents.push((p, ppid));
                }
            }
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    tree
}

/// The fields of /proc/PID/stat after the command name, starting with the state (field 3).
fn read_stat(pid: u32) -> Option<Vec<String>> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &text[text.rfind(')')? + 2..];
    Some(after.split(' ').map(str::to_owned).collect())
}

pub fn rss_kib(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time of a process: user and system from /proc/PID/stat (clock ticks, which include
/// exited threads) and the nanosecond total of its live threads from schedstat.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub user_ticks: u64,
    pub sys_ticks: u64,
    pub run_ns: u64,
}

impl Cpu {
    pub fn of(pid: u32) -> Cpu {
        let stat = read_stat(pid).unwrap_or_default();
        // utime and stime are fields 14 and 15; index 0 here is field 3.
        let field = |i: usize| stat.get(i - 3).and_then(|s| s.parse().ok()).unwrap_or(0);
        let mut run_ns = 0;
        if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
            for t in tasks.flatten() {
                let path = t.path().join("schedstat");
                run_ns += fs::read_to_string(path)
                    .ok()
                    .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
                    .unwrap_or(0u64);
            }
        }
        Cpu {
            user_ticks: field(14),
            sys_ticks: field(15),
            run_ns,
        }
    }

    pub fn this_process() -> Cpu {
        Cpu::of(std::process::id())
    }

    pub fn since(self, before: Cpu) -> Cpu {
        Cpu {
            user_ticks: self.user_ticks.saturating_sub(before.user_ticks),
            sys_ticks: self.sys_ticks.saturating_sub(before.sys_ticks),
            run_ns: self.run_ns.saturating_sub(before.run_ns),
        }
    }

    /// User and system time in ms (10 ms resolution).
    pub fn user_sys_ms(self) -> (f64, f64) {
        let tick_ms = 1000.0 / clock_ticks_per_sec() as f64;
        (
            self.user_ticks as f64 * tick_ms,
            self.sys_ticks as f64 * tick_ms,
        )
    }
}

impl std::ops::Add for Cpu {
    type Output = Cpu;
    fn add(self, o: Cpu) -> Cpu {
        Cpu {
            user_ticks: self.user_ticks + o.user_ticks,
            sys_ticks: self.sys_ticks + o.sys_ticks,
            run_ns: self.run_ns + o.run_ns,
        }
    }
}

fn clock_ticks_per_sec() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100)
    })
}

/// The first line of a peer's version output, for the record.
pub fn version_of(bin: &Path, arg: &str) -> String {
    Command::new(bin)
        .arg(arg)
        .output()
        .ok()
        .map(|o| {
            let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&o.stderr));
            text.lines().next().unwrap_or_default().trim().to_owned()
        })
        .unwrap_or_default()
}
