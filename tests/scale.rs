//! Ten thousand concurrent streams through the real binary, with clients leaving at random.
//!
//! The gateway runs as a child process (`hourglass --config`), so its memory and descriptors
//! are its own; the fake provider and the clients run here. Clients are a mix of HTTP/1.1
//! connections and HTTP/2 streams over a few connections: ten thousand HTTP/1.1 clients would
//! need twenty thousand descriptors in the gateway alone (one client and one upstream socket
//! each), and this machine allows 20000 per process. Every stream still has its own upstream
//! connection, so the gateway holds ten thousand of those.
//!
//! The upstream is a minimal streaming server whose tokens wait for the test's signal: every
//! stream is opened (head and first event) and held, however long opening them all takes on
//! a busy machine; then tokens flow on all of them at once and 30% of the clients leave at
//! random moments. Checked: the clients that stay see no error and get their whole stream;
//! once the leavers are gone, the upstream connections still open are exactly the streams
//! still in flight; every request is counted once, with one origin; the gateway's memory
//! stays bounded.
//!
//! `HOURGLASS_SCALE_STREAMS` changes the number of streams (default 10000).

#[path = "it/support/mod.rs"]
mod support;

use std::net::{SocketAddr, TcpListener as StdListener};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Channel;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::{sleep, Instant};

/// Share of the streams carried over HTTP/2 (the rest are one HTTP/1.1 connection each).
const H2_SHARE: f64 = 0.7;
const STREAMS_PER_H2_CONN: usize = 100;
/// Tokens per stream and the gap between them: long enough for every stream to be open
/// at once, with tokens still flowing, when the leavers leave.
const CHUNKS: usize = 15;
const INTERVAL_MS: u64 = 2000;

struct Gateway {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start_gateway(fake: SocketAddr, dir: &std::path::Path) -> Gateway {
    let (port, admin_port) = (free_port(), free_port());
    let config = dir.join("scale.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[server]
listen = "127.0.0.1:{port}"
admin_listen = "127.0.0.1:{admin_port}"
shutdown_grace = "1s"
# The HTTP/2 connections are all opened first and their streams started over a minute: with
# the default 10 s an HTTP/2 connection with no stream open yet is closed (src/idle.rs).
header_read_timeout = "300s"

[defaults]
budget = "300s"
max_budget = "300s"
connect_timeout = "20s"
first_token_timeout = "120s"
idle_timeout = "120s"

[upstreams.fake]
url = "http://{fake}"

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "fake"
"#
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("gateway.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("the gateway starts");
    let gw = Gateway {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        admin: SocketAddr::from(([127, 0, 0, 1], admin_port)),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(gw.admin).await.is_err() || TcpStream::connect(gw.addr).await.is_err()
    {
        assert!(Instant::now() < deadline, "the gateway did not come up");
        sleep(Duration::from_millis(50)).await;
    }
    gw
}

async fn metric(admin: SocketAddr, sample: &str) -> f64 {
    let conn = Conn::open(admin).await;
    let req = Request::get("/metrics")
        .header("host", "admin")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (resp, _c) = conn.send(req).await;
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(sample).and_then(|r| r.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Established TCP connections from 127.0.0.1 to 127.0.0.1:`port`, seen from the `port`
/// side: the fake's side of the upstream connections the gateway still holds open. (Other
/// processes on this machine have sockets too; only this exact address pair counts.)
fn established_on(port: u16) -> usize {
    let local = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1] == local && f[2].starts_with("0100007F:") && f[3] == "01"
        })
        .count()
}

fn chat(stream: bool) -> Request<Full<Bytes>> {
    chat_request(&[], stream)
}

/// What the upstream saw of its streams.
#[derive(Default)]
struct Upstream {
    requests: AtomicUsize,
    completed: AtomicUsize,
    /// Streams whose peer (the gateway) went away before their end.
    cut: AtomicUsize,
}

/// An SSE upstream: each answer is a head and a first event at once, then, once `go` is
/// set, CHUNKS events INTERVAL_MS apart and `[DONE]`.
async fn upstream(go: watch::Receiver<bool>) -> (SocketAddr, Arc<Upstream>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Upstream::default());
    let stats = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (go, stats) = (go.clone(), stats.clone());
            let svc = service_fn(move |_req: Request<hyper::body::Incoming>| {
                let (mut go, stats) = (go.clone(), stats.clone());
                stats.requests.fetch_add(1, Ordering::Relaxed);
                let (mut tx, body) = Channel::<Bytes, std::convert::Infallible>::new(4);
                tokio::spawn(async move {
                    let event = |i: usize| {
                        Bytes::from(format!(
                            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"tok{i} \"}}}}]}}\n\n"
                        ))
                    };
                    let mut ok = tx.send_data(event(0)).await.is_ok();
                    let _ = go.wait_for(|g| *g).await;
                    for i in 1..=CHUNKS {
                        if !ok {
                            break;
                        }
                        sleep(Duration::from_millis(INTERVAL_MS)).await;
                        ok = tx.send_data(event(i)).await.is_ok();
                    }
                    let done = Bytes::from_static(b"data: [DONE]\n\n");
                    if ok && tx.send_data(done).await.is_ok() {
                        stats.completed.fetch_add(1, Ordering::Relaxed);
                    } else {
                        stats.cut.fetch_add(1, Ordering::Relaxed);
                    }
                });
                async move {
                    Ok::<_, std::convert::Infallible>(
                        Response::builder()
                            .header("content-type", "text/event-stream")
                            .body(body)
                            .unwrap(),
                    )
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// How one stream ended, from its client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Left,
    Complete,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_streams_with_clients_leaving_at_random() {
    let n: usize = std::env::var("HOURGLASS_SCALE_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let dir = tempfile::Builder::new()
        .prefix("hourglass-scale-")
        .tempdir()
        .unwrap();
    let (go, go_rx) = watch::channel(false);
    let (fake_addr, fake) = upstream(go_rx.clone()).await;
    let gw = start_gateway(fake_addr, dir.path()).await;
    let pid = gw.child.id();
    let rss_idle = status_kib(pid, "VmRSS:");

    let n_h2 = (n as f64 * H2_SHARE) as usize;
    let n_h1 = n - n_h2;
    let mut h2_conns = Vec::new();
    // The HTTP/2 connections are driven by a runtime of their own, so that answering the
    // gateway's keep-alive pings never waits behind the ten thousand other tasks here.
    let h2_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for _ in 0..n_h2.div_ceil(STREAMS_PER_H2_CONN) {
        let addr = gw.addr;
        let send = h2_runtime
            .spawn(async move {
                let stream = TcpStream::connect(addr).await.unwrap();
                let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                    .initial_stream_window_size(256 * 1024)
                    .handshake::<_, Full<Bytes>>(TokioIo::new(stream))
                    .await
                    .unwrap();
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        eprintln!("HTTP/2 client connection failed: {e:?}");
                    }
                });
                send
            })
            .await
            .unwrap();
        h2_conns.push(send);
    }

    let opened = Arc::new(AtomicUsize::new(0));
    let left = Arc::new(AtomicUsize::new(0));
    let opening = Arc::new(Semaphore::new(500));
    let mut tasks = tokio::task::JoinSet::new();
    let mut rng = fastrand::Rng::with_seed(5);
    let mut leavers = 0;
    let start = Instant::now();
    for i in 0..n {
        let leaves = rng.f64() < 0.3;
        leavers += usize::from(leaves);
        let leave_after = Duration::from_millis(rng.u64(0..4000));
        let h2 = (i < n_h2).then(|| h2_conns[i / STREAMS_PER_H2_CONN].clone());
        let (addr, opened, left, opening) =
            (gw.addr, opened.clone(), left.clone(), opening.clone());
        let mut go = go_rx.clone();
        tasks.spawn(async move {
            let permit = opening.acquire_owned().await.unwrap();
            // Keep the HTTP/1 connection (if any) for as long as the stream lives.
            let (resp, conn) = match h2 {
                Some(mut send) => {
                    let mut req = chat(true);
                    *req.uri_mut() = format!("http://{addr}/v1/chat/completions")
                        .parse()
                        .unwrap();
                    req.headers_mut().remove("host");
                    (send.send_request(req).await.expect("h2 head"), None)
                }
                None => {
                    let (resp, conn) = Conn::open(addr).await.send(chat(true)).await;
                    (resp, Some(conn))
                }
            };
            assert_eq!(resp.status(), 200);
            let mut body = resp.into_body();
            let mut text = read_events(&mut body, 1).await;
            drop(permit);
            opened.fetch_add(1, Ordering::Relaxed);
            let _ = go.wait_for(|g| *g).await;
            if leaves {
                sleep(leave_after).await;
                drop(body);
                drop(conn);
                left.fetch_add(1, Ordering::Relaxed);
                return (Ended::Left, String::new());
            }
            loop {
                match body.frame().await {
                    None => break,
                    Some(Ok(f)) => {
                        if let Ok(d) = f.into_data() {
                            text.push_str(&String::from_utf8_lossy(&d));
                        }
                    }
                    Some(Err(e)) => panic!("a staying client got an error: {e:?}"),
                }
            }
            drop(conn);
            (Ended::Complete, text)
        });
    }

    // Every stream open at once.
    while opened.load(Ordering::Relaxed) < n {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "only {} of {n} streams opened after {:?}",
            opened.load(Ordering::Relaxed),
            start.elapsed()
        );
        sleep(Duration::from_millis(100)).await;
    }
    let ramp = start.elapsed();
    let in_flight_all = metric(
        gw.admin,
        "hourglass_upstream_requests_in_flight{upstream=\"fake\"}",
    )
    .await;
    let upstream_all = established_on(fake_addr.port());
    let rss_all = status_kib(pid, "VmRSS:");
    let fds_all = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    assert_eq!(in_flight_all, n as f64, "every stream in flight at once");
    assert!(
        (n..n + 32).contains(&upstream_all),
        "{upstream_all} upstream connections for {n} streams"
    );

    // Tokens flow on every stream; clients leave at random over the next 4 s.
    go.send_replace(true);
    let go_at = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(60);
    while left.load(Ordering::Relaxed) < leavers {
        assert!(Instant::now() < deadline, "the leavers did not leave");
        sleep(Duration::from_millis(100)).await;
    }
    let all_left = go_at.elapsed();
    let staying = n - leavers;
    // The leavers' upstream connections close; the stayers' stay, one each.
    let settle = Instant::now() + Duration::from_secs(30);
    let (in_flight, serving, upstream) = loop {
        let in_flight = metric(
            gw.admin,
            "hourglass_upstream_requests_in_flight{upstream=\"fake\"}",
        )
        .await;
        // A cut stream is noticed upstream at its next write, at most one interval later.
        let serving = fake.requests.load(Ordering::Relaxed)
            - fake.completed.load(Ordering::Relaxed)
            - fake.cut.load(Ordering::Relaxed);
        let upstream = established_on(fake_addr.port());
        if (in_flight, serving) == (staying as f64, staying) || Instant::now() > settle {
            break (in_flight, serving, upstream);
        }
        sleep(Duration::from_millis(100)).await;
    };
    let checked_at = go_at.elapsed();
    assert_eq!(
        fake.completed.load(Ordering::Relaxed),
        0,
        "checked after streams began to end ({checked_at:?}), too late to compare"
    );
    assert_eq!(
        in_flight, staying as f64,
        "in flight after the leavers left"
    );
    assert_eq!(
        serving, staying,
        "the upstream serves exactly the streams still open"
    );
    // One connection per open stream, plus at most a few idle in the pool (the pool may
    // open a spare one while a request waits).
    assert!(
        (staying..staying + 32).contains(&upstream),
        "{upstream} upstream connections for {staying} open streams"
    );

    // The rest run to their end, without an error.
    let mut complete = 0;
    while let Some(r) = tasks.join_next().await {
        let (ended, text) = r.expect("no client task failed");
        if ended == Ended::Complete {
            assert!(
                text.ends_with("data: [DONE]\n\n"),
                "{}",
                &text[text.len().saturating_sub(200)..]
            );
            assert!(!text.contains("event: error"));
            complete += 1;
        }
    }
    assert_eq!(complete, staying);
    let rss_peak = status_kib(pid, "VmHWM:");
    let settle = Instant::now() + Duration::from_secs(10);
    loop {
        let ok = metric(
            gw.admin,
            "hourglass_requests_total{outcome=\"ok\",route=\"chat\"}",
        )
        .await;
        let cancelled = metric(
            gw.admin,
            "hourglass_requests_total{outcome=\"cancelled\",route=\"chat\"}",
        )
        .await;
        if ok + cancelled >= n as f64 || Instant::now() > settle {
            let errors = metric(
                gw.admin,
                "hourglass_requests_total{outcome=\"error\",route=\"chat\"}",
            )
            .await;
            let client = metric(
                gw.admin,
                "hourglass_cancellations_total{origin=\"client\",route=\"chat\"}",
            )
            .await;
            assert_eq!(
                (ok, cancelled, errors),
                (staying as f64, leavers as f64, 0.0)
            );
            assert_eq!(
                client, leavers as f64,
                "every leaver counted once, as a client cancel"
            );
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        metric(
            gw.admin,
            "hourglass_upstream_requests_in_flight{upstream=\"fake\"}"
        )
        .await,
        0.0
    );
    assert_eq!(
        fake.requests.load(Ordering::Relaxed),
        n,
        "one upstream request per stream"
    );
    let settle = Instant::now() + Duration::from_secs(10);
    while fake.completed.load(Ordering::Relaxed) + fake.cut.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < settle, "upstream streams still running");
        sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(fake.completed.load(Ordering::Relaxed), staying);
    assert_eq!(
        fake.cut.load(Ordering::Relaxed),
        leavers,
        "exactly the leavers' upstream calls were cut"
    );

    eprintln!(
        "{n} streams ({n_h1} HTTP/1.1 connections, {n_h2} HTTP/2 streams on {} connections): \
         all open after {ramp:?}; gateway RSS {} MiB idle, {} MiB with all open, peak {} MiB \
         ({} KiB per stream), {fds_all} descriptors; {leavers} clients left within {all_left:?} of \
         the first token; {checked_at:?} after it, {upstream} upstream connections were open for \
         {staying} streams; all {staying} completed cleanly after {:?}",
        h2_conns.len(),
        rss_idle >> 10,
        rss_all >> 10,
        rss_peak >> 10,
        (rss_all.saturating_sub(rss_idle)) / n as u64,
        start.elapsed(),
    );
    // Bounded: a few tens of KiB per stream (buffers of two connections and the stream's
    // state), not the stream's bytes.
    let per_stream_kib = rss_peak.saturating_sub(rss_idle) / n as u64;
    assert!(per_stream_kib < 160, "{per_stream_kib} KiB per stream");
    h2_runtime.shutdown_background();
    drop(gw);
}
