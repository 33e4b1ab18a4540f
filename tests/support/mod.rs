//! Shared harness for integration tests: the fake provider and the gateway on loopback ports
//! chosen by the OS, and a raw HTTP/1.1 client whose connection a test can drop at will.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use hourglass::config::Config;
use hourglass::fake::FakeUpstream;
use hourglass::server::{self, Running};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;

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
            for outcome in ["ok", "error", "cancelled"] {
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
    let conn = Conn::open(admin).await;
    let req = Request::get("/metrics")
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
        .wait_closed(conns[0].id, Duration::from_secs(3))
        .await
        .expect("the upstream connection was closed");
    closed.saturating_duration_since(since)
}
