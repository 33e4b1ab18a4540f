//! Running out of file descriptors: the open-file limit the process starts with, and what the
//! gateway still answers when its descriptors are all in use. These run the binary in a
//! process of its own, whose limit a test may set without touching its neighbours'.

use crate::support::*;
use hourglass_fake::FakeUpstream;

fn config(fake: &FakeUpstream) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\n\
         [upstreams.fake]\nurl = \"{}\"\nauth = \"none\"\n\n\
         [[routes]]\nname = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n",
        fake.url()
    )
}

/// The hard open-file limit of this (test) process, which a child's may not exceed.
fn hard_limit() -> u64 {
    hourglass::descriptors::open_file_limit().unwrap().hard
}

/// Audit KF 6: a soft limit below the hard one (systemd's default `LimitNOFILE=1024:524288`)
/// is raised to the hard one at start, and both are logged.
#[tokio::test]
async fn the_soft_open_file_limit_is_raised_to_the_hard_one_at_start() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let hard = hard_limit().min(8192);
    assert!(hard > 256, "this test needs a hard limit above 256: {hard}");
    let p = Process::spawn_with_nofile(&config(&fake), &[], &[], Some((256, hard))).await;
    assert_eq!(p.nofile(), (hard, hard));
    let (out, err) = p.output();
    let text = format!("{out}{err}");
    let line = text
        .lines()
        .find(|l| l.contains("open-file limit"))
        .unwrap_or_else(|| panic!("no open-file limit line:\n{text}"));
    assert!(
        line.contains("256") && line.contains(&hard.to_string()),
        "{line}"
    );
    p.stop().await;
}

/// Audit KF 1: client connections that take every descriptor the process may open left the
/// admin listener (the probes, `/metrics`) unanswered, and nothing but a log line said so. It
/// now answers on a descriptor kept for it, and `/metrics` counts the failed accepts and shows
/// the descriptors in use against the limit.
#[tokio::test]
async fn the_admin_listener_answers_when_client_connections_hold_every_descriptor() {
    let (_fake, p, held) = starved().await;
    // Several probes in a row, as the kubelet sends them, each answered.
    for path in ["/healthz", "/readyz", "/healthz"] {
        tokio::time::timeout(std::time::Duration::from_secs(5), admin_get(p.admin, path))
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer within 5 s at descriptor exhaustion"));
    }
    let text = tokio::time::timeout(std::time::Duration::from_secs(5), scrape(p.admin))
        .await
        .expect("/metrics: no answer within 5 s at descriptor exhaustion");
    let value = |name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
            .parse()
            .unwrap()
    };
    assert!(
        value("hourglass_accept_errors_total{listener=\"clients\",reason=\"descriptors\"}") > 0.0,
        "{text}"
    );
    assert_eq!(value("process_max_fds"), 64.0);
    assert_eq!(value("process_open_fds"), 64.0);
    drop(held);
    p.stop().await;
}

/// Audit KF 3: after a burst, the idle pooled connections to one upstream held nearly every
/// descriptor (each kept until the pool's reaper, up to twice `pool_idle_timeout`), and a
/// request for another upstream was answered 503 "no file descriptor left". The pool now
/// keeps at most a quarter of the open-file limit idle per upstream.
#[tokio::test]
async fn after_a_burst_the_idle_pool_leaves_descriptors_for_another_upstream() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\n\
         [defaults]\nbudget = \"30s\"\nfirst_token_timeout = \"20s\"\n\n\
         [upstreams.busy]\nurl = \"{0}\"\nauth = \"none\"\n\n\
         [upstreams.other]\nurl = \"{0}\"\nauth = \"none\"\n\n\
         [[routes]]\nname = \"busy\"\npath_prefix = \"/v1/chat/completions\"\n\
         models = [\"busy*\"]\nupstream = \"busy\"\n\n\
         [[routes]]\nname = \"other\"\npath_prefix = \"/v1/chat/completions\"\n\
         models = [\"other*\"]\nupstream = \"other\"\n",
        fake.url()
    );
    let p = Process::spawn_with_nofile(&toml, &[], &[], Some((96, 96))).await;
    let request = |model: &str, ttft: &str| {
        let body = format!(
            r#"{{"model":"{model}","stream":false,"messages":[{{"role":"user","content":"hi"}}]}}"#
        );
        http::Request::post("http://gateway/v1/chat/completions")
            .header("content-type", "application/json")
            .header("x-fake-ttft-ms", ttft)
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap()
    };
    // One HTTP/2 client connection, 100 streams at once: more upstream connections than the
    // process has descriptors (those past it are answered 503, as they should be).
    let tcp = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let mut burst = Vec::new();
    for _ in 0..100 {
        let mut sender = sender.clone();
        let req = request("busy-1", "500");
        burst.push(tokio::spawn(async move {
            let resp = sender.send_request(req).await.unwrap();
            let status = resp.status();
            let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
            status
        }));
    }
    let mut ok = 0;
    for b in burst {
        ok += usize::from(b.await.unwrap() == 200);
    }
    assert!(
        ok > 32,
        "the burst needs more connections than the idle cap: {ok} ok"
    );
    // The burst is over; another upstream needs one connection.
    let mut sender = sender.clone();
    let resp = sender.send_request(request("other-1", "0")).await.unwrap();
    let status = resp.status();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    p.stop().await;
}

/// Audit QB 2: an HTTP/2 connection accepted on the admin listener's spare descriptor kept it
/// for as long as its client polled (HTTP/1.1 closes after one request there), so while the
/// client connections held every other descriptor, each HTTP/1.1 probe failed. On the spare an
/// h2 connection serves its first request and is closed gracefully (GOAWAY).
#[tokio::test]
async fn an_h2_connection_on_the_admin_spare_is_closed_after_its_first_request() {
    let (_fake, p, held) = starved().await;
    // The first admin connection lands on the spare: an h2 poller.
    let tcp = tokio::net::TcpStream::connect(p.admin).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::get("http://admin/readyz")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(std::time::Duration::from_secs(5), sender.send_request(req))
        .await
        .expect("the first request on the spare answered within 5 s")
        .unwrap();
    assert_eq!(resp.status(), 200);
    let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
    // The server ends the connection (GOAWAY, then close), well before its 10 s idle limit
    // would have: the poller holds the spare no longer.
    tokio::time::timeout(std::time::Duration::from_secs(5), conn)
        .await
        .expect("the h2 connection on the spare still open 5 s after its first answer")
        .unwrap()
        .unwrap();
    // The next probe, over HTTP/1.1, is answered on the spare.
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        admin_get(p.admin, "/healthz"),
    )
    .await
    .expect("/healthz: no answer within 5 s after the h2 connection on the spare");
    drop(held);
    p.stop().await;
}

/// The gateway with 64 descriptors and 100 client connections that hold every one it may
/// open (the rest wait in the backlog), once it has logged that an accept failed; the
/// connections are held for a minute, not the default 10 s.
async fn starved() -> (FakeUpstream, Process, Vec<tokio::net::TcpStream>) {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let toml = config(&fake).replace("[server]\n", "[server]\nheader_read_timeout = \"60s\"\n");
    let p = Process::spawn_with_nofile(&toml, &[], &[], Some((64, 64))).await;
    let mut held = Vec::new();
    for _ in 0..100 {
        held.push(tokio::net::TcpStream::connect(p.addr).await.unwrap());
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (out, err) = p.output();
        if format!("{out}{err}").contains("accept failed") {
            return (fake, p, held);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the client listener never ran out of descriptors:\n{out}{err}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
