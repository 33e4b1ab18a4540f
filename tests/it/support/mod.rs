//! Shared harness for integration tests: the fake provider and the gateway on loopback ports
//! chosen by the OS, and a raw HTTP/1.1 client whose connection a test can drop at will.
#![allow(dead_code)]

pub mod redis;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use hourglass::config::Config;
use hourglass::server::{self, Running};
use hourglass_fake::FakeUpstream;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How soon an effect must follow its cause on loopback sockets ("the upstream connection
/// closed after the client left"), however loaded the machine. Tests that use it keep every
/// other cause of the same effect (limits, scripted delays) at 10 s or more, so passing
/// within it still proves the cause: the bound only has to beat those, not the scheduler.
/// A directory of its own for one test's files, removed when dropped.
pub fn temp_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("hourglass-it-{tag}-"))
        .tempdir()
        .unwrap()
}

pub const PROMPTLY: Duration = Duration::from_secs(2);

pub struct Harness {
    pub fake: FakeUpstream,
    pub gw: Running,
}

/// A config whose `{FAKE}` is replaced by the fake provider's URL; listeners on port 0.
pub const BASE: &str = r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
budget = "10s"
max_budget = "30s"
connect_timeout = "500ms"
first_token_timeout = "2s"
idle_timeout = "1s"

[upstreams.fake]
url = "{FAKE}"
api_key_env = "HOURGLASS_TEST_KEY_UNSET"
auth = "bearer"

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "fake"

[[routes]]
name = "messages"
path_prefix = "/v1/messages"
upstream = "fake"
"#;

impl Harness {
    pub async fn start() -> Harness {
        Self::with_config(BASE).await
    }

    pub async fn with_config(toml: &str) -> Harness {
        let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
            .await
            .expect("fake provider starts");
        let text = toml.replace("{FAKE}", &fake.url());
        let config = Config::from_toml(&text, "test.toml").expect("test config is valid");
        let gw = server::start(config).await.expect("gateway starts");
        Harness { fake, gw }
    }

    pub fn addr(&self) -> SocketAddr {
        self.gw.addr
    }

    /// The fake provider answers the next requests with `stream`'s SSE events as they are,
    /// one a millisecond.
    pub fn replay(&self, stream: &str) {
        self.fake.set_replay(Some(hourglass_fake::Replay::sse(
            stream,
            Duration::from_millis(1),
        )));
    }

    /// Sends a request on a fresh connection and returns the response head.
    pub async fn send(&self, req: Request<Full<Bytes>>) -> (Response<Incoming>, Conn) {
        let conn = Conn::open(self.addr()).await;
        conn.send(req).await
    }

    pub async fn chat(&self, headers: &[(&str, &str)]) -> (Response<Incoming>, Conn) {
        self.send(chat_request(headers, true)).await
    }

    /// The value of one sample of the gateway's /metrics, e.g.
    /// `hourglass_cancellations_total{origin="idle",route="chat"}`.
    pub async fn metric(&self, sample: &str) -> f64 {
        metric(self.gw.admin_addr, sample).await
    }

    pub async fn metrics_text(&self) -> String {
        scrape(self.gw.admin_addr).await
    }

    /// Waits until the gateway has reported `n` requests in total for `route` (reports happen
    /// when a response body is dropped, a moment after the client saw the end).
    pub async fn wait_requests(&self, route: &str, n: f64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut total = 0.0;
            for outcome in ["ok", "error", "cancelled", "detached"] {
                total += self
                    .metric(&format!(
                        "hourglass_requests_total{{outcome=\"{outcome}\",route=\"{route}\"}}"
                    ))
                    .await;
            }
            if total >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "route {route}: {total} of {n} requests reported"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The admin listener's /metrics text.
pub async fn scrape(admin: SocketAddr) -> String {
    admin_get(admin, "/metrics").await
}

/// A GET of `path` on an admin listener: the body as text.
pub async fn admin_get(admin: SocketAddr, path: &str) -> String {
    let conn = Conn::open(admin).await;
    let req = Request::get(path)
        .header("host", "admin")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (resp, _conn) = conn.send(req).await;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// One sample's value from a live scrape; panics (showing the scrape) when it is missing.
pub async fn metric(admin: SocketAddr, sample: &str) -> f64 {
    let text = scrape(admin).await;
    text.lines()
        .find_map(|l| l.strip_prefix(sample).and_then(|r| r.strip_prefix(' ')))
        .map(|v| v.trim().parse().expect("numeric sample"))
        .unwrap_or_else(|| panic!("no sample {sample} in\n{text}"))
}

pub fn chat_request(headers: &[(&str, &str)], stream: bool) -> Request<Full<Bytes>> {
    let body = format!(
        r#"{{"model":"gpt-test","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let mut b = Request::post("/v1/chat/completions")
        .header("host", "gateway")
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::from(body))).unwrap()
}

/// One client connection. Dropping it (or calling `close`) closes the socket at once, which
/// is how tests play a client that goes away.
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    task: JoinHandle<()>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        Conn { sender, task }
    }

    pub async fn send(mut self, req: Request<Full<Bytes>>) -> (Response<Incoming>, Conn) {
        let resp = self.sender.send_request(req).await.expect("response head");
        (resp, self)
    }

    pub fn close(self) {
        drop(self);
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads a body to its end: the bytes, the frames' arrival times, and the error that ended it
/// if it did not end cleanly.
pub struct Read {
    pub bytes: Vec<u8>,
    pub frames: Vec<(Instant, Bytes)>,
    pub error: Option<String>,
}

impl Read {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// The `data:` payloads of every event, in order.
    pub fn data_lines(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
            .collect()
    }

    /// The parsed `error` object of the trailing `event: error`, if there is one.
    pub fn error_event(&self) -> Option<serde_json::Value> {
        let text = self.text();
        let at = text.find("event: error\n")?;
        let line = text[at..].lines().nth(1)?.strip_prefix("data: ")?;
        let v: serde_json::Value = serde_json::from_str(line).expect("error event is JSON");
        Some(v["error"].clone())
    }
}

pub async fn read_body(body: Incoming) -> Read {
    let mut body = body;
    let mut read = Read {
        bytes: Vec::new(),
        frames: Vec::new(),
        error: None,
    };
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    read.bytes.extend_from_slice(&d);
                    read.frames.push((Instant::now(), d));
                }
            }
            Some(Err(e)) => {
                read.error = Some(e.to_string());
                break;
            }
        }
    }
    read
}

/// Asserts that an error object's `message` starts with `start`: the limit that fired, named
/// in words (DESIGN 6), for clients that show the message and drop the code.
pub fn assert_message_starts(error: &serde_json::Value, start: &str) {
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(start),
        "message {message:?} does not start with {start:?} (error {error})"
    );
}

/// The reason phrase an HTTP/1.1 answer's status line carried, when it was not the
/// standard one (hyper's client keeps no other).
pub fn reason_phrase<B>(resp: &Response<B>) -> Option<String> {
    resp.extensions()
        .get::<hyper::ext::ReasonPhrase>()
        .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
}

pub async fn json_body(resp: Response<Incoming>) -> serde_json::Value {
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"))
}

/// Reads frames until `n` data events have arrived.
pub async fn read_events(body: &mut Incoming, n: usize) -> String {
    let mut text = String::new();
    while text.matches("\n\n").count() < n {
        let f = body.frame().await.expect("more frames").expect("frame");
        if let Ok(d) = f.into_data() {
            text.push_str(&String::from_utf8_lossy(&d));
        }
    }
    text
}

/// The fake provider's only connection, and how long after `since` it saw its peer go away.
pub async fn upstream_close_delay(fake: &FakeUpstream, since: Instant) -> Duration {
    let conns = fake.connections();
    assert_eq!(
        conns.len(),
        1,
        "expected one upstream connection: {conns:?}"
    );
    let closed = fake
        .wait_closed(conns[0].id, Duration::from_secs(5))
        .await
        .expect("the upstream connection was closed");
    closed.saturating_duration_since(since)
}

/// The `hourglass` binary serving a config of its own, in a process of its own: for what
/// only the process can show (its log formats, its stdout and stderr) and for what comes
/// from its environment, which a test must never change in this process with
/// `std::env::set_var` while other tests' gateways read theirs.
pub struct Process {
    child: tokio::process::Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    stdout: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    stderr: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
    /// The config file it serves (and reloads on change).
    pub config: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Process {
    /// Serves `toml` (its listeners on port 0) with the extra `args` and `env`; returns
    /// once the process has said where it listens.
    pub async fn spawn(toml: &str, args: &[&str], env: &[(&str, &str)]) -> Process {
        Self::spawn_with_nofile(toml, args, env, None).await
    }

    /// [`Process::spawn`] with the open-file limit (soft, hard) of the process set before it
    /// runs, as `prlimit --nofile` or systemd's `LimitNOFILE` sets it.
    pub async fn spawn_with_nofile(
        toml: &str,
        args: &[&str],
        env: &[(&str, &str)],
        nofile: Option<(u64, u64)>,
    ) -> Process {
        let dir = tempfile::Builder::new()
            .prefix("hourglass-process-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("hourglass.toml");
        std::fs::write(&path, toml).unwrap();
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_hourglass"));
        cmd.arg("--config")
            .arg(&path)
            .args(args)
            .env_remove("HOURGLASS_CONFIG")
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some((soft, hard)) = nofile {
            let limit = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            // SAFETY: between fork and exec, setrlimit is async-signal-safe and touches
            // only the child.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let mut child = cmd.spawn().expect("the binary runs");
        let (stdout, stderr) = (Default::default(), Default::default());
        let readers = vec![
            collect_into(child.stdout.take().unwrap(), &stdout),
            collect_into(child.stderr.take().unwrap(), &stderr),
        ];
        let mut p = Process {
            child,
            addr: ([0, 0, 0, 0], 0).into(),
            admin: ([0, 0, 0, 0], 0).into(),
            stdout,
            stderr,
            readers,
            config: path,
            _dir: dir,
        };
        // Generous: the machine may be busy building or running other tests.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (out, err) = p.output();
            let text = format!("{out}{err}");
            if let Some(line) = text.lines().find(|l| l.contains("hourglass listening")) {
                p.addr = field_addr(line, "addr");
                p.admin = field_addr(line, "admin_addr");
                return p;
            }
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!("hourglass exited ({status}) before listening:\n{text}");
            }
            assert!(
                Instant::now() < deadline,
                "hourglass never listened:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What the process wrote so far on stdout and stderr.
    pub fn output(&self) -> (String, String) {
        let text = |b: &std::sync::Mutex<Vec<u8>>| {
            String::from_utf8_lossy(&b.lock().unwrap()).into_owned()
        };
        (text(&self.stdout), text(&self.stderr))
    }

    /// The first `n` request log lines (`--log-format json`), waiting up to 5 s for them:
    /// a line is written as its request ends, after the client has its answer.
    pub async fn request_lines(&self, n: usize) -> Vec<serde_json::Value> {
        self.json_lines(n, |v| v.get("outcome").is_some()).await
    }

    /// The first request log line, which must come within 5 s.
    pub async fn request_line(&self) -> serde_json::Value {
        let mut lines = self.request_lines(1).await;
        assert!(!lines.is_empty(), "no request log line");
        lines.swap_remove(0)
    }

    /// The first `n` JSON log lines that `pick` picks, waiting up to 5 s for them (fewer
    /// when they do not come).
    pub async fn json_lines(
        &self,
        n: usize,
        pick: impl Fn(&serde_json::Value) -> bool,
    ) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (out, err) = self.output();
            let lines: Vec<serde_json::Value> = format!("{out}{err}")
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|v| pick(v))
                .collect();
            if lines.len() >= n || Instant::now() > deadline {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("still running")
    }

    /// The process's open-file limit (soft, hard), as `/proc/PID/limits` says.
    pub fn nofile(&self) -> (u64, u64) {
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", self.pid())).unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .expect("a Max open files line");
        let mut n = line["Max open files".len()..]
            .split_whitespace()
            .map(|v| v.parse::<u64>().unwrap_or(u64::MAX));
        (n.next().unwrap(), n.next().unwrap())
    }

    /// SIGKILL: the process dies at once, as a replica that crashes does, mid-call.
    pub async fn kill(mut self) {
        self.child.kill().await.expect("the process was killed");
    }

    /// SIGTERM, then everything it wrote on stdout and stderr once it has exited.
    pub async fn stop(mut self) -> (String, String) {
        let pid = self.child.id().expect("still running").to_string();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the process exits after SIGTERM")
            .unwrap();
        for r in std::mem::take(&mut self.readers) {
            r.await.unwrap();
        }
        let (out, err) = self.output();
        assert!(status.success(), "{status}\n{out}{err}");
        (out, err)
    }
}

fn collect_into(
    mut from: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    into: &std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
) -> JoinHandle<()> {
    let into = into.clone();
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 8192];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0 {
                break;
            }
            into.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    })
}

/// The address in field `name` of a log line, in any of the log formats: `name=ADDR` or
/// `"name":"ADDR"`.
fn field_addr(line: &str, name: &str) -> SocketAddr {
    for pat in [format!(" {name}="), format!("\"{name}\":\"")] {
        if let Some(at) = line.find(&pat) {
            let rest = &line[at + pat.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'))
                .unwrap_or(rest.len());
            return rest[..end]
                .parse()
                .unwrap_or_else(|e| panic!("{name} in {line:?}: {e}"));
        }
    }
    panic!("no {name} in {line:?}")
}

/// An address whose connects are refused, held so that no other test's listener can take
/// its port while the guard lives: a socket bound to it that never listens. (Binding a
/// listener to port 0 and dropping it frees the port for the next `bind(0)` in any test
/// running meanwhile.)
pub fn refused_addr() -> (socket2::Socket, SocketAddr) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    (socket, addr)
}

/// Reads one request's head and (small, content-length) body; returns them lowercased.
pub async fn read_request(s: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "the request ended early");
        req.extend_from_slice(&buf[..n]);
        if let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&req[..end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if req.len() >= end + 4 + len {
                return String::from_utf8_lossy(&req).to_lowercase();
            }
        }
    }
}

/// An upstream written by hand, for answers no well-behaved server gives (a length beside a
/// coding, an HTTP/1.0 status line): on every connection it reads one request, writes the
/// pieces of `answer`, each after its delay, and closes. Answers that would keep the
/// connection say `connection: close`, so the gateway never sends a second request on a
/// connection this closes.
pub async fn raw_upstream(answer: Vec<(Duration, Vec<u8>)>) -> SocketAddr {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                s.set_nodelay(true).unwrap();
                read_request(&mut s).await;
                for (delay, piece) in answer {
                    tokio::time::sleep(delay).await;
                    if s.write_all(&piece).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// One request over HTTP/2 (h2c, prior knowledge) on a connection of its own: the answer's
/// head, or how the stream ended without one. `req` names its path only; its `host` goes
/// (HTTP/2 carries the authority in `:authority`).
pub async fn h2_send(
    addr: SocketAddr,
    mut req: Request<Full<Bytes>>,
) -> Result<Response<Incoming>, String> {
    req.headers_mut().remove("host");
    h2_send_as_is(addr, req).await
}

/// [`h2_send`], with whatever header fields `req` has (a `host` too).
pub async fn h2_send_as_is(
    addr: SocketAddr,
    mut req: Request<Full<Bytes>>,
) -> Result<Response<Incoming>, String> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    *req.uri_mut() = format!("http://gateway{}", req.uri()).parse().unwrap();
    tokio::time::timeout(Duration::from_secs(5), sender.send_request(req))
        .await
        .expect("an answer or a reset within 5 s")
        .map_err(|e| format!("{e:?}"))
}

/// A HEAD on the chat path over HTTP/1.1 and over HTTP/2: both answered 200 with `fields`
/// (a value of "" says the field is absent), and both counted ok on the route `chat`, not as
/// the client's cancel (hyper never polls a HEAD answer's body).
pub async fn heads_are_answered_ok(h: &Harness, fields: &[(&str, &str)]) {
    let head = || {
        Request::head("/v1/chat/completions")
            .header("host", "gateway")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let (h1, _c) = h.send(head()).await;
    let h2 = h2_send(h.addr(), head()).await.unwrap();
    for resp in [&h1, &h2] {
        assert_eq!(resp.status(), 200);
        for (name, value) in fields {
            match *value {
                "" => assert_eq!(resp.headers().get(*name), None, "{resp:?}"),
                v => assert_eq!(resp.headers()[*name], v, "{resp:?}"),
            }
        }
    }
    h.wait_requests("chat", 2.0).await;
    assert_eq!(
        h.metric("hourglass_requests_total{outcome=\"ok\",route=\"chat\"}")
            .await,
        2.0,
        "{}",
        h.metrics_text().await
    );
}
