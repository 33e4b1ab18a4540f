//! An idle cut on an HTTP/2 upstream connection: the stream is reset and the connection kept
//! while it shows life (keep-alives, or frames for its other streams), and retired when it
//! read nothing at all for the idle limit (audit RA 5).

use super::*;

/// The provider is merely slow on this stream: it sends keep-alives, which the idle limit does
/// not count, but which show its connection alive (audit RA 5: a connection that read nothing
/// at all for the idle limit is retired, see below).
#[tokio::test]
async fn an_idle_cut_resets_the_upstream_stream_and_keeps_the_connection() {
    // The one short limit: the idle timeout under test.
    let h = Harness::with_config(
        &config("").replace("idle_timeout = \"20s\"", "idle_timeout = \"300ms\""),
    )
    .await;
    let (resp, _conn) = h
        .chat(&[
            ("x-fake-freeze-after", "2"),
            ("x-fake-interval-ms", "5"),
            ("x-fake-keepalive-ms", "50"),
        ])
        .await;
    let read = read_body(resp.into_body()).await;
    let cut = Instant::now();
    let error = read.error_event().expect("an error event ends the stream");
    assert_eq!(error["code"], "idle_timeout", "{error}");
    // The stream reset upstream is sent when the watchdog cut, just before the client saw the
    // error event; it must not be later than a moment after it.
    let record = h
        .fake
        .wait_request_finished(0, Duration::from_secs(10))
        .await
        .expect("the upstream stream ended");
    assert!(!record.completed);
    let after_cut = record.finished_at.unwrap().saturating_duration_since(cut);
    assert!(
        after_cut < PROMPTLY,
        "upstream stream ended {after_cut:?} after the cut"
    );
    assert_eq!(conn_ids(&h), [0]);
    assert_connection_serves_another(&h, 0).await;
    h.wait_requests("chat", 2.0).await;
    assert_eq!(
        h.metric("hourglass_cancellations_total{origin=\"idle\",route=\"chat\"}")
            .await,
        1.0
    );
}

/// A relay to `to` (set once known) that can be made to stop passing bytes on the
/// connections it has open, keeping their sockets: an HTTP/2 connection gone silent behind
/// a dropped flow or a stopped proxy. Returns its address, the count of connections it took,
/// and what freezes those open.
async fn freezable_relay(
    to: std::sync::Arc<std::sync::OnceLock<std::net::SocketAddr>>,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    impl Fn(),
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    type Freezes = std::sync::Arc<std::sync::Mutex<Vec<tokio::sync::watch::Sender<bool>>>>;
    /// Passes bytes on until frozen; then reads and writes nothing more, holding both halves.
    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut frozen: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = tokio::select! {
                _ = frozen.wait_for(|f| *f) => break,
                r = from.read(&mut buf) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
            };
            if *frozen.borrow() || to.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        std::future::pending::<()>().await;
        drop((from, to));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let freezes: Freezes = Default::default();
    let (count, open) = (connections.clone(), freezes.clone());
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let server = TcpStream::connect(*to.get().expect("the relay's target"))
                .await
                .unwrap();
            let (tx, rx) = tokio::sync::watch::channel(false);
            open.lock().unwrap().push(tx);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::spawn(pump(cr, sw, rx.clone()));
            tokio::spawn(pump(sr, cw, rx));
        }
    });
    let freeze = move || {
        for f in freezes.lock().unwrap().iter() {
            let _ = f.send(true);
        }
    };
    (addr, connections, freeze)
}

/// Audit RA 5: a stream cut by the idle limit on an HTTP/2 connection that read nothing at
/// all meanwhile (its peer gone silent: here a relay that stopped passing bytes) leaves that
/// connection out of service: the next request gets a new connection and its answer. Before,
/// it was put on the silent connection and waited out its first-token limit there (504
/// `first_token_timeout`); only that retired the connection.
#[tokio::test]
async fn an_idle_cut_on_a_connection_gone_silent_retires_it() {
    let target = std::sync::Arc::new(std::sync::OnceLock::new());
    let (relay, connections, freeze) = freezable_relay(target.clone()).await;
    // The idle limit under test; a first-token limit the next request could wait out.
    let toml = config("")
        .replace("idle_timeout = \"20s\"", "idle_timeout = \"300ms\"")
        .replace(
            "first_token_timeout = \"20s\"",
            "first_token_timeout = \"3s\"",
        )
        .replace("{FAKE}", &format!("http://{relay}"));
    let h = Harness::with_config(&toml).await;
    target
        .set(h.fake.url().trim_start_matches("http://").parse().unwrap())
        .unwrap();
    let (resp, _c) = h
        .chat(&[("x-fake-chunks", "100"), ("x-fake-interval-ms", "50")])
        .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let text = read_events(&mut body, 3).await;
    assert!(text.contains("tok2"), "{text}");
    freeze();
    let read = read_body(body).await;
    let error = read.error_event().expect("an error event ends the stream");
    assert_eq!(error["code"], "idle_timeout", "{error}");
    for _ in 0..2 {
        let (resp, _c) = h.chat(&[]).await;
        if resp.status() != 200 {
            panic!("{}: {}", resp.status(), json_body(resp).await);
        }
        let read = read_body(resp.into_body()).await;
        assert_eq!(read.error, None);
        assert!(read.text().contains("[DONE]"), "{}", read.text());
    }
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// Audit RA 5, the other side: a stream cut by the idle limit while its neighbour on the same
/// HTTP/2 connection still gets frames says its own provider call is slow, not that the
/// connection is gone: the connection stays in service.
#[tokio::test]
async fn an_idle_cut_keeps_a_connection_whose_other_streams_get_frames() {
    let h = Harness::with_config(
        &config("").replace("idle_timeout = \"20s\"", "idle_timeout = \"300ms\""),
    )
    .await;
    // The neighbour streams for about 2 s, a frame every 50 ms.
    let (resp, _c1) = h
        .chat(&[("x-fake-chunks", "40"), ("x-fake-interval-ms", "50")])
        .await;
    let mut neighbour = resp.into_body();
    read_events(&mut neighbour, 1).await;
    let (resp, _c2) = h
        .chat(&[("x-fake-freeze-after", "2"), ("x-fake-interval-ms", "5")])
        .await;
    let read = read_body(resp.into_body()).await;
    let error = read.error_event().expect("an error event ends the stream");
    assert_eq!(error["code"], "idle_timeout", "{error}");
    assert_eq!(conn_ids(&h), [0, 0]);
    assert_connection_serves_another(&h, 0).await;
    let read = read_body(neighbour).await;
    assert_eq!(read.error, None);
    assert!(read.text().contains("[DONE]"), "{}", read.text());
}
