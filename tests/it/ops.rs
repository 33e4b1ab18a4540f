//! Operations: reload without dropping requests, graceful shutdown and draining, methods the
//! gateway refuses, and gauges of what is open. TLS clients are in `tls_clients.rs`, client
//! connections (h2c, heads too slow or too large) in `client_conns.rs`.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use crate::tls_clients::{certs, tls_client, tls_config_toml};
use bytes::Bytes;
use hourglass::config::Config;
use hourglass::server;
use hourglass_fake::FakeUpstream;
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

mod named_files;
mod shutdown;

#[tokio::test]
async fn reload_under_load_drops_nothing_and_a_bad_file_changes_nothing() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = temp_dir("reload");
    let path = dir.path().join("hourglass.toml");
    let text = BASE.replace("{FAKE}", &fake.url());
    std::fs::write(&path, &text).unwrap();
    let config = Config::load(&path).unwrap();
    let first = config.fingerprint.clone();
    let gw = server::start_with_source(config, Some(path.clone()))
        .await
        .unwrap();
    let addr = gw.addr;

    // A long stream that started under the first config must finish under it, even after
    // its route disappears.
    let (long, long_conn) = Conn::open(addr)
        .await
        .send(chat_request(
            &[("x-fake-chunks", "30"), ("x-fake-interval-ms", "20")],
            true,
        ))
        .await;
    let long = tokio::spawn(async move {
        let r = read_body(long.into_body()).await;
        drop(long_conn);
        r
    });

    // Load: requests back to back on four workers while the config flips.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            let (mut ok, mut bad) = (0, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (resp, _c) = Conn::open(addr)
                    .await
                    .send(chat_request(&[("x-fake-chunks", "2")], true))
                    .await;
                let status = resp.status();
                let read = read_body(resp.into_body()).await;
                if status == 200 && read.text().ends_with("data: [DONE]\n\n") {
                    ok += 1;
                } else {
                    bad.push(format!("{status} {}", read.text()));
                }
            }
            (ok, bad)
        }));
    }
    for i in 0..5 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        let changed = text.replace("budget = \"10s\"", &format!("budget = \"{}s\"", 11 + i));
        std::fs::write(&path, changed).unwrap();
        gw.reload().await.expect("valid reload");
    }
    // A broken file: the running config stays, and says why.
    std::fs::write(&path, "[server\nlisten = ").unwrap();
    let err = gw.reload().await.unwrap_err().to_string();
    assert!(err.contains("hourglass.toml:1:"), "{err}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for w in workers {
        let (ok, bad) = w.await.unwrap();
        assert!(bad.is_empty(), "requests failed during reloads: {bad:?}");
        total += ok;
    }
    assert!(total > 10, "only {total} requests ran");
    let long = long.await.unwrap();
    assert!(long.text().ends_with("data: [DONE]\n\n"), "{}", long.text());

    let metrics = {
        let conn = Conn::open(gw.admin_addr).await;
        let req = http::Request::get("/metrics")
            .header("host", "a")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let (resp, _c) = conn.send(req).await;
        read_body(resp.into_body()).await.text()
    };
    assert!(
        metrics.contains("hourglass_config_reloads_total{result=\"ok\"} 5"),
        "{metrics}"
    );
    assert!(metrics.contains("hourglass_config_reloads_total{result=\"error\"} 1"));
    assert!(!metrics.contains(&format!("hourglass_config_info{{hash=\"{first}\"}} 1")));
    assert_eq!(
        metrics.matches("hourglass_config_info{").count(),
        1,
        "exactly one config is served"
    );

    // Removing the route: new requests get 404, nothing else breaks.
    let without = text.replace("[[routes]]\nname = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n", "");
    std::fs::write(&path, without).unwrap();
    gw.reload().await.unwrap();
    let (resp, _c) = Conn::open(addr).await.send(chat_request(&[], true)).await;
    assert_eq!(resp.status(), 404);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_changed_file_is_picked_up_by_the_watcher() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = temp_dir("watch");
    let path = dir.path().join("hourglass.toml");
    let text = BASE.replace("{FAKE}", &fake.url());
    std::fs::write(&path, &text).unwrap();
    let gw = server::start_with_source(Config::load(&path).unwrap(), Some(path.clone()))
        .await
        .unwrap();
    gw.watch_config(Duration::from_millis(50));
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::fs::write(&path, text.replace("budget = \"10s\"", "budget = \"12s\"")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if gw
            .metrics
            .encode()
            .contains("hourglass_config_reloads_total{result=\"ok\"} 1")
        {
            break;
        }
        assert!(Instant::now() < deadline, "the change was not picked up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A reload refused for what a file the new config names holds (a client key too short) is
/// tried again when that file is fixed, as the docs promise for "a file it names": the
/// watcher followed only the running config's files, so the fix went unseen until the config
/// file itself was touched.
#[tokio::test]
async fn a_reload_refused_for_a_named_file_is_tried_again_when_it_is_fixed() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = temp_dir("watch-keys");
    let path = dir.path().join("hourglass.toml");
    let keys = dir.path().join("keys.txt");
    let text = BASE.replace("{FAKE}", &fake.url());
    std::fs::write(&path, &text).unwrap();
    let gw = server::start_with_source(Config::load(&path).unwrap(), Some(path.clone()))
        .await
        .unwrap();
    gw.watch_config(Duration::from_millis(50));
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::fs::write(&keys, "short\n").unwrap();
    let keyed = format!(
        "{text}\n[[routes]]\nname = \"keyed\"\npath_prefix = \"/v1/keyed\"\nupstream = \"fake\"\n\
         client_keys_file = \"keys.txt\"\n"
    );
    std::fs::write(&path, keyed).unwrap();
    let wait_for = |want: &'static str| {
        let gw = &gw;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !gw.metrics.encode().contains(want) {
                assert!(Instant::now() < deadline, "never: {want}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_for("hourglass_config_reloads_total{result=\"error\"} 1").await;
    std::fs::write(&keys, "hg-a-client-key-long-enough-0001\n").unwrap();
    wait_for("hourglass_config_reloads_total{result=\"ok\"} 1").await;
}

/// The admin listener serves GET and HEAD; anything else is a 405 that says so (RFC 9110
/// 15.5.6: a 405 carries `Allow`).
#[tokio::test]
async fn the_admin_listeners_405_names_what_it_allows() {
    let h = Harness::start().await;
    for method in ["POST", "PUT", "DELETE", "OPTIONS"] {
        let req = http::Request::builder()
            .method(method)
            .uri("/metrics")
            .header("host", "admin")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let (resp, _c) = Conn::open(h.gw.admin_addr).await.send(req).await;
        assert_eq!(resp.status(), 405, "{method}");
        assert_eq!(resp.headers()["allow"], "GET, HEAD", "{method}");
        assert_eq!(resp.headers()["connection"], "close", "{method}");
        // The body says the same as the header.
        let body = read_body(resp.into_body()).await;
        assert_eq!(body.text(), "only GET and HEAD\n", "{method}");
    }
    // A CONNECT's tunnel bytes are never read as the next request (audit M: a pipelined
    // GET /metrics after one was served).
    let mut s = TcpStream::connect(h.gw.admin_addr).await.unwrap();
    s.write_all(
        b"CONNECT x:443 HTTP/1.1\r\nhost: x:443\r\n\r\nGET /metrics HTTP/1.1\r\nhost: a\r\n\r\n",
    )
    .await
    .unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut all))
        .await
        .expect("closed")
        .unwrap();
    let text = String::from_utf8_lossy(&all);
    assert!(text.starts_with("HTTP/1.1 405"), "{text}");
    assert_eq!(text.matches("HTTP/1.1").count(), 1, "{text}");
}

/// RFC 9112 3.2: an HTTP/1.1 request without Host, or with two, is a 400 on the admin
/// listener as on the client listener (audit OB 4: both were served 200), and the
/// connection is closed after it; HTTP/1.0 without Host and one Host are served.
#[tokio::test]
async fn the_admin_listener_refuses_heads_without_one_host() {
    let h = Harness::start().await;
    let exchange = |head: &'static [u8]| async move {
        let mut s = TcpStream::connect(h.gw.admin_addr).await.unwrap();
        s.write_all(head).await.unwrap();
        let mut all = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut all))
            .await
            .expect("closed")
            .unwrap();
        String::from_utf8_lossy(&all).into_owned()
    };
    for head in [
        &b"GET /healthz HTTP/1.1\r\n\r\nGET /healthz HTTP/1.1\r\nhost: a\r\n\r\n"[..],
        b"GET /metrics HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\nGET /healthz HTTP/1.1\r\nhost: a\r\n\r\n",
        b"GET /readyz HTTP/1.1\r\nhost: a b\r\n\r\n",
    ] {
        let text = exchange(head).await;
        assert!(text.starts_with("HTTP/1.1 400"), "{text}");
        assert!(text.contains("\"code\":\"invalid_request\""), "{text}");
        assert!(text.to_ascii_lowercase().contains("connection: close"), "{text}");
        // The pipelined request after it was never read.
        assert!(!text.contains("HTTP/1.1 200"), "{text}");
    }
    for head in [
        &b"GET /healthz HTTP/1.0\r\n\r\n"[..],
        b"GET /healthz HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    ] {
        let text = exchange(head).await;
        assert!(
            text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.0 200"),
            "{text}"
        );
        assert!(text.ends_with("ok\n"), "{text}");
    }
}

/// Audit PD 3: the admin listener answered nothing to an HTTP/2 prior-knowledge client (its
/// preface got no byte in 3 s), so haproxy's `proto h2` checks, which inherit the server's
/// protocol, marked every replica down. It speaks h2c as the client listener does, and
/// HTTP/1.1 as before, on one port.
#[tokio::test]
async fn the_admin_listener_speaks_http2_prior_knowledge() {
    let h = Harness::start().await;
    for path in ["/readyz", "/healthz", "/metrics"] {
        let req = http::Request::get(path)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = h2_send(h.gw.admin_addr, req)
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(resp.version(), http::Version::HTTP_2, "{path}");
        let body = read_body(resp.into_body()).await.text();
        assert!(!body.is_empty(), "{path}");
    }
    assert!(admin_get(h.gw.admin_addr, "/readyz")
        .await
        .starts_with("ready"));
}

/// Audit QB 1: a HEAD over h2c to the admin listener was answered with GET's body (HEADERS
/// without END_STREAM, then DATA), which h2 clients (curl, nghttp, Node, Go) fail as a
/// PROTOCOL_ERROR: a health checker sending HEAD over h2 failed every check. A HEAD answer
/// carries GET's status and fields, `content-length` included, and no body, on both
/// protocols.
#[tokio::test]
async fn a_head_to_the_admin_listener_has_gets_fields_and_no_body_on_both_protocols() {
    let h = Harness::start().await;
    for path in ["/healthz", "/readyz", "/nonexistent", "/runs/none"] {
        let get = h2_send(
            h.gw.admin_addr,
            http::Request::get(path)
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let (status, length) = (get.status(), get.headers()["content-length"].clone());
        let body = read_body(get.into_body()).await;
        assert_eq!(
            length.to_str().unwrap(),
            body.bytes.len().to_string(),
            "GET {path}"
        );

        let head = h2_send(
            h.gw.admin_addr,
            http::Request::head(path)
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("HEAD {path} over h2: {e}"));
        assert_eq!(head.status(), status, "HEAD {path} over h2");
        assert_eq!(
            head.headers().get("content-length"),
            Some(&length),
            "HEAD {path} over h2"
        );
        let read = read_body(head.into_body()).await;
        assert_eq!(
            (read.error, read.bytes.len()),
            (None, 0),
            "HEAD {path} over h2"
        );

        let mut tcp = tokio::net::TcpStream::connect(h.gw.admin_addr)
            .await
            .unwrap();
        tcp.write_all(
            format!("HEAD {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut raw = Vec::new();
        tcp.read_to_end(&mut raw).await.unwrap();
        let raw = String::from_utf8_lossy(&raw).to_lowercase();
        let (head, rest) = raw
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("{raw}"));
        assert!(
            head.starts_with(&format!("http/1.1 {}", status.as_u16())),
            "HEAD {path}: {raw}"
        );
        assert!(
            head.contains(&format!("content-length: {}", length.to_str().unwrap())),
            "HEAD {path}: {raw}"
        );
        assert_eq!(rest, "", "HEAD {path} over HTTP/1.1");
    }
}

/// Audit QB 5: over h2 the admin listener answered 200 to a request whose `host` named
/// another server than its `:authority`, which RFC 9113 8.3.1 makes malformed; the client
/// listener answers it 400, and the admin listener follows the client listener's Host rules
/// (audit OB 4).
#[tokio::test]
async fn the_admin_listener_refuses_an_h2_host_that_is_not_the_authority() {
    let h = Harness::start().await;
    let req = |host: &str| {
        http::Request::get("/readyz")
            .header("host", host)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    // h2_send_as_is sends `:authority: gateway`.
    let resp = h2_send_as_is(h.gw.admin_addr, req("other")).await.unwrap();
    assert_eq!(resp.status(), 400);
    let body = read_body(resp.into_body()).await.text();
    assert!(body.contains(":authority"), "{body}");
    let same = h2_send_as_is(h.gw.admin_addr, req("GATEWAY:80"))
        .await
        .unwrap();
    assert_eq!(same.status(), 200);
}

/// An edit that stops naming a file is one reload: the watcher's list of files comes from
/// the text alone, so swapping in the config that no longer names it changes nothing more.
#[tokio::test]
async fn an_edit_that_drops_a_file_is_one_reload() {
    let dir = temp_dir("drop-file");
    let key = dir.path().join("openai.key");
    std::fs::write(&key, "sk-test-0123456789abcdef\n").unwrap();
    let path = dir.path().join("hourglass.toml");
    let with_key = BASE.replace("{FAKE}", "http://127.0.0.1:9").replace(
        "api_key_env = \"HOURGLASS_TEST_KEY_UNSET\"",
        &format!("api_key_file = {:?}", key.display().to_string()),
    );
    std::fs::write(&path, &with_key).unwrap();
    let gw = server::start_with_source(Config::load(&path).unwrap(), Some(path.clone()))
        .await
        .unwrap();
    gw.watch_config(Duration::from_millis(20));
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::fs::write(&path, BASE.replace("{FAKE}", "http://127.0.0.1:9")).unwrap();
    let ok = |n: u32| format!("hourglass_config_reloads_total{{result=\"ok\"}} {n}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gw.metrics.encode().contains(&ok(1)) {
        assert!(Instant::now() < deadline, "the edit was not reloaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Many ticks later: no second reload for the file no longer named.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(gw.metrics.encode().contains(&ok(1)), "reloaded again");
    gw.shutdown().await;
}

/// A write to the watched file, given its path.
type Step = Box<dyn FnOnce(&std::path::Path)>;

/// The watcher at a 1 s tick under paused time, on a file that holds `first`; each of
/// `steps` is done half a tick after the one before (between two ticks), then ticks run.
async fn watched(first: &str, steps: Vec<Step>) -> (server::Running, tempfile::TempDir) {
    let dir = temp_dir("settle");
    let path = dir.path().join("hourglass.toml");
    std::fs::write(&path, first).unwrap();
    let gw = server::start_with_source(Config::load(&path).unwrap(), Some(path.clone()))
        .await
        .unwrap();
    gw.watch_config(Duration::from_secs(1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    for step in steps {
        step(&path);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    (gw, dir)
}

fn reloads(gw: &server::Running, result: &str) -> usize {
    let text = gw.metrics.encode();
    let sample = format!("hourglass_config_reloads_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&sample))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Audit K1: an edit written in two parts a tick apart (any writer that does not rename) is
/// applied whole, once: the first part alone, a valid config lacking a route, never serves.
#[tokio::test(start_paused = true)]
async fn a_file_written_in_two_parts_is_applied_whole() {
    let old = BASE.replace("{FAKE}", "http://127.0.0.1:9");
    let new = old.replace("budget = \"10s\"", "budget = \"12s\"");
    let half = new[..new.find("\n[[routes]]\nname = \"messages\"").unwrap()].to_owned();
    Config::from_toml(&half, "half.toml").expect("the first part is valid on its own");
    let rest = new[half.len()..].to_owned();
    let (gw, _dir) = watched(
        &old,
        vec![
            Box::new(move |p| std::fs::write(p, &half).unwrap()),
            Box::new(move |p| {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
                f.write_all(rest.as_bytes()).unwrap();
            }),
        ],
    )
    .await;
    let dir = temp_dir("settle-want");
    std::fs::write(dir.path().join("hourglass.toml"), &new).unwrap();
    let want = Config::load(&dir.path().join("hourglass.toml")).unwrap();
    assert_eq!(reloads(&gw, "ok"), 1, "{}", gw.metrics.encode());
    assert_eq!(reloads(&gw, "error"), 0);
    assert!(gw.metrics.encode().contains(&format!(
        "hourglass_config_info{{hash=\"{}\"}} 1",
        want.fingerprint
    )));
    gw.shutdown().await;
}

/// Audit K1: `cp` truncates, then writes; a tick between reads an empty file. That is no
/// failed reload, and the same content written back is no reload at all.
#[tokio::test(start_paused = true)]
async fn a_file_truncated_then_written_back_is_no_reload() {
    let text = BASE.replace("{FAKE}", "http://127.0.0.1:9");
    let back = text.clone();
    let (gw, _dir) = watched(
        &text,
        vec![
            Box::new(|p| std::fs::write(p, "").unwrap()),
            Box::new(move |p| std::fs::write(p, &back).unwrap()),
        ],
    )
    .await;
    assert_eq!(reloads(&gw, "error"), 0, "{}", gw.metrics.encode());
    assert_eq!(reloads(&gw, "ok"), 0);
    gw.shutdown().await;
}

/// Audit P (after M2): a file the config names that cannot be read for good (here a
/// directory in its place; also a key a rotation left readable by root alone) is a state:
/// its reload fails where it is seen, and the file read again is reloaded. Taken for a
/// passing failure (as running out of descriptors is), it kept every later edit from being
/// applied, unsaid.
#[tokio::test(start_paused = true)]
async fn a_named_file_that_cannot_be_read_fails_its_reload_visibly() {
    let keys = temp_dir("keys");
    let key = keys.path().join("up.key");
    std::fs::write(&key, "sk-one\n").unwrap();
    let text = BASE.replace("{FAKE}", "http://127.0.0.1:9").replace(
        "api_key_env = \"HOURGLASS_TEST_KEY_UNSET\"",
        &format!("api_key_file = {:?}", key.display().to_string()),
    );
    let edited = text.replace("budget = \"10s\"", "budget = \"12s\"");
    let (k1, k2) = (key.clone(), key.clone());
    let (gw, _dir) = watched(
        &text,
        vec![
            Box::new(move |_| {
                std::fs::remove_file(&k1).unwrap();
                std::fs::create_dir(&k1).unwrap();
            }),
            Box::new(|_| {}),
            Box::new(move |p| {
                std::fs::remove_dir(&k2).unwrap();
                std::fs::write(&k2, "sk-two\n").unwrap();
                std::fs::write(p, &edited).unwrap();
            }),
        ],
    )
    .await;
    assert_eq!(reloads(&gw, "error"), 1, "{}", gw.metrics.encode());
    assert_eq!(reloads(&gw, "ok"), 1, "the edit, once the key reads");
    gw.shutdown().await;
}

/// What is open right now: client connections, and requests by the route they were given
/// in the end (here the model's, not the one the path alone would pick).
#[tokio::test]
async fn open_connections_and_requests_are_gauges() {
    let cfg = BASE
        .replace("idle_timeout = \"1s\"", "idle_timeout = \"20s\"")
        .replace(
            "[[routes]]\nname = \"chat\"\n",
            "[[routes]]\nname = \"gpt\"\npath_prefix = \"/v1/chat/completions\"\n\
             models = [\"gpt-*\"]\nupstream = \"fake\"\n\n[[routes]]\nname = \"chat\"\n",
        );
    let h = Harness::with_config(&cfg).await;
    let gauges = || async {
        let text = h.metrics_text().await;
        let value = |sample: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("no {sample} in\n{text}"))
                .trim()
                .to_owned()
        };
        [
            value("hourglass_client_connections"),
            value("hourglass_requests_in_flight{route=\"gpt\"}"),
            value("hourglass_requests_in_flight{route=\"chat\"}"),
            value("hourglass_requests_in_flight{route=\"none\"}"),
        ]
    };
    let wait_for = |want: [&'static str; 4]| async move {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let now = gauges().await;
            if now == want {
                return;
            }
            assert!(Instant::now() < deadline, "{now:?}, not {want:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    assert_eq!(gauges().await, ["0", "0", "0", "0"]);
    let (resp, c) = Conn::open(h.addr())
        .await
        .send(chat_request(&[("x-fake-freeze-after", "1")], true))
        .await;
    let mut body = resp.into_body();
    read_events(&mut body, 1).await;
    let idle = TcpStream::connect(h.addr()).await.unwrap();
    wait_for(["2", "1", "0", "0"]).await;
    drop((body, c, idle));
    wait_for(["0", "0", "0", "0"]).await;
}

/// A request whose body names a model no route serves is no route's: counted under
/// `route="none"`, not the route its path picked before the body was read (audit V).
#[tokio::test]
async fn a_model_no_route_serves_is_counted_under_none() {
    let cfg = BASE.replace(
        "name = \"chat\"\npath_prefix = \"/v1/chat/completions\"\n",
        "name = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nmodels = [\"claude-*\"]\n",
    );
    let h = Harness::with_config(&cfg).await;
    let (resp, _c) = h.chat(&[]).await;
    assert_eq!(resp.status(), 404);
    h.wait_requests("none", 1.0).await;
    let text = h.metrics_text().await;
    for line in text.lines().filter(|l| l.contains("route=\"chat\"")) {
        assert!(
            line.starts_with('#') || line.ends_with(" 0") || line.contains("le=\""),
            "counted on the route its path picked: {line}"
        );
    }
    assert_eq!(
        h.metric("hourglass_requests_in_flight{route=\"none\"}")
            .await,
        0.0
    );

    // A body with no model to read: the message does not deny the path's routes (audit L).
    let form = hyper::Request::post("/v1/chat/completions")
        .header("host", "x")
        .body(Full::new(Bytes::from_static(b"model=claude-x")))
        .unwrap();
    let (resp, _c) = h.send(form).await;
    assert_eq!(resp.status(), 404);
    let message = json_body(resp).await["error"]["message"].to_string();
    assert!(message.contains("without a model in its body"), "{message}");
}

/// A provider key rotated in its file (same path, so the upstream's config is unchanged)
/// must be picked up by the next reload, not kept with the reused connection pool.
#[tokio::test]
async fn a_reload_picks_up_a_rotated_key_file() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = temp_dir("rotate");
    let key_file = dir.path().join("provider.key");
    std::fs::write(&key_file, "sk-old-key\n").unwrap();
    let path = dir.path().join("hourglass.toml");
    let text = BASE.replace("{FAKE}", &fake.url()).replace(
        "api_key_env = \"HOURGLASS_TEST_KEY_UNSET\"",
        &format!("api_key_file = \"{}\"", key_file.display()),
    );
    std::fs::write(&path, &text).unwrap();
    let gw = server::start_with_source(Config::load(&path).unwrap(), Some(path.clone()))
        .await
        .unwrap();
    let addr = gw.addr;
    let sent_key = |n: usize| {
        fake.requests()[n]
            .headers
            .get("authorization")
            .map(|v| v.to_str().unwrap().to_owned())
    };

    let (resp, _c) = Conn::open(addr).await.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    assert_eq!(sent_key(0).as_deref(), Some("Bearer sk-old-key"));

    // An unchanged file keeps the upstream (and its pool); a rotated one replaces it.
    gw.reload().await.unwrap();
    std::fs::write(&key_file, "sk-new-key\n").unwrap();
    gw.reload().await.unwrap();
    let (resp, _c) = Conn::open(addr).await.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 200);
    read_body(resp.into_body()).await;
    assert_eq!(sent_key(1).as_deref(), Some("Bearer sk-new-key"));
    gw.shutdown().await;
}

#[tokio::test]
async fn an_upstream_that_leads_back_into_the_gateway_is_a_loop_detected_within_ten_hops() {
    // The gateway's own address as its upstream: a misconfiguration one typo away.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // (The first `listen` is the server's; `admin_listen` stays on a port of its own.)
    let config = BASE
        .replacen(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{port}\""),
            1,
        )
        .replace("{FAKE}", &format!("http://127.0.0.1:{port}"));
    let h = Harness::with_config(&config).await;
    assert_eq!(h.addr().port(), port);
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    // The innermost hop's answer, passed back out through every hop before it.
    assert_eq!(resp.status(), 508);
    assert_eq!(resp.headers()["x-should-retry"], "false");
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "loop_detected");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("10 Hourglass gateways"), "{message}");
    // Ten hops forwarded, the eleventh refused; nothing else was held open.
    h.wait_requests("chat", 11.0).await;
    assert_eq!(
        h.metric(r#"hourglass_requests_total{outcome="error",route="chat"}"#)
            .await,
        1.0
    );
    assert_eq!(
        h.metric(r#"hourglass_upstream_requests_in_flight{upstream="fake"}"#)
            .await,
        0.0
    );
}

/// Audit KB 2: a loop through a peer that forwards only `x-` headers (LiteLLM drops `Via`)
/// made 932 hops in 37 s, none refused. Each gateway also counts itself in
/// `x-hourglass-hops`, which such a peer passes on: at the limit, the request is refused
/// without `Via` as with it, and never reaches the upstream.
#[tokio::test]
async fn the_gateways_own_hop_count_stops_a_loop_that_lost_its_via() {
    let h = Harness::start().await;
    let (resp, _c) = h.chat(&[("x-hourglass-hops", "10")]).await;
    assert_eq!(resp.status(), 508);
    assert_eq!(resp.headers()["x-should-retry"], "false");
    assert!(resp.headers().get("x-hourglass-hops").is_none());
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "loop_detected");
    assert!(h.fake.requests().is_empty());

    // Below the limit it is forwarded, counting this gateway; a value that is no count says
    // nothing (the Via count stands), and no hop header comes back to the client.
    for (sent, via, forwarded) in [
        (Some("3"), None, "4"),
        (None, None, "1"),
        (Some("x2"), Some("1.1 hourglass"), "2"),
    ] {
        let mut headers = vec![];
        if let Some(v) = sent {
            headers.push(("x-hourglass-hops", v));
        }
        if let Some(v) = via {
            headers.push(("via", v));
        }
        let (resp, _c) = h.send(chat_request(&headers, false)).await;
        assert_eq!(resp.status(), 200, "{sent:?}");
        assert!(resp.headers().get("x-hourglass-hops").is_none());
        read_body(resp.into_body()).await;
        let got = h.fake.requests().last().unwrap().headers["x-hourglass-hops"].clone();
        assert_eq!(got, forwarded, "{sent:?} {via:?}");
    }
}

/// A peer between the gateway and its upstream that forwards every request with its `Via`
/// removed, as LiteLLM does (it forwards only `x-` headers), to `target`.
async fn via_dropping_peer(target: std::net::SocketAddr) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let svc = hyper::service::service_fn(
                move |req: http::Request<hyper::body::Incoming>| async move {
                    let (mut parts, body) = req.into_parts();
                    parts.headers.remove(http::header::VIA);
                    let body = body.collect().await?.to_bytes();
                    let req = http::Request::from_parts(parts, Full::new(body));
                    let (resp, _c) = Conn::open(target).await.send(req).await;
                    let (parts, body) = resp.into_parts();
                    let body = body.collect().await?.to_bytes();
                    Ok::<_, hyper::Error>(http::Response::from_parts(parts, Full::new(body)))
                },
            );
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc),
            );
        }
    });
    addr
}

/// Audit KB 2, end to end: a gateway whose upstream leads back to it through a peer that
/// drops `Via` is stopped at the tenth hop, as without the peer.
#[tokio::test]
async fn a_loop_through_a_peer_that_drops_via_is_a_loop_detected_within_ten_hops() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let peer = via_dropping_peer(([127, 0, 0, 1], port).into()).await;
    let config = BASE
        .replacen(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{port}\""),
            1,
        )
        .replace("{FAKE}", &format!("http://{peer}"));
    let h = Harness::with_config(&config).await;
    let (resp, _c) = h.send(chat_request(&[], false)).await;
    assert_eq!(resp.status(), 508);
    let body = json_body(resp).await;
    assert_eq!(body["error"]["code"], "loop_detected");
    h.wait_requests("chat", 11.0).await;
}

#[tokio::test]
async fn a_websocket_upgrade_is_refused_and_never_forwarded_while_h2c_is_ignored() {
    let h = Harness::start().await;
    // What the OpenAI Realtime client sends (RFC 6455 4.1), on a path a route matches.
    let ws = "GET /v1/chat/completions?model=gpt-realtime HTTP/1.1\r\nhost: x\r\n\
              connection: Upgrade\r\nupgrade: WebSocket\r\nsec-websocket-version: 13\r\n\
              sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    let mut s = TcpStream::connect(h.addr()).await.unwrap();
    s.write_all(ws.as_bytes()).await.unwrap();
    let mut got = vec![0u8; 4096];
    let n = s.read(&mut got).await.unwrap();
    let text = String::from_utf8_lossy(&got[..n]).to_string();
    assert!(text.starts_with("HTTP/1.1 501 "), "{text}");
    assert!(text.contains("x-should-retry: false"), "{text}");
    let body: serde_json::Value =
        serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "upgrade_unsupported");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("\"WebSocket\""), "{message}");
    assert!(h.fake.requests().is_empty(), "forwarded to the provider");

    // curl's `--http2` on a cleartext URL asks for h2c this way: ignored, served as HTTP/1.1.
    let mut req = chat_request(&[("x-fake-chunks", "2")], false);
    req.headers_mut()
        .insert("connection", "Upgrade, HTTP2-Settings".parse().unwrap());
    req.headers_mut().insert("upgrade", "h2c".parse().unwrap());
    req.headers_mut().insert(
        "http2-settings",
        "AAMAAABkAAQAoAAAAAIAAAAA".parse().unwrap(),
    );
    let (resp, _c) = h.send(req).await;
    assert_eq!(resp.status(), 200);
    let seen = h.fake.requests();
    assert_eq!(seen.len(), 1);
    for name in ["upgrade", "http2-settings"] {
        assert!(!seen[0].headers.contains_key(name), "{name} forwarded");
    }
    h.wait_requests("chat", 2.0).await;
    assert_eq!(
        h.metric(r#"hourglass_requests_total{outcome="error",route="chat"}"#)
            .await,
        1.0
    );
}

/// A client that takes the gateway for a forward proxy (`HTTPS_PROXY` pointed at it) opens
/// with `CONNECT host:port`, whose authority-form target has no path. It is told in words
/// that the gateway opens no tunnels (405 naming the method, `Allow` listing what is served),
/// never `no_route` for path `""`; nothing is forwarded, and the connection is closed so that
/// the tunnel bytes such a client may already have sent are never read as a request.
#[tokio::test]
async fn connect_is_refused_with_405_naming_the_method_and_never_forwarded() {
    let h = Harness::start().await;
    let mut s = TcpStream::connect(h.addr()).await.unwrap();
    // What curl sends through `--proxy`, then the first bytes of a TLS ClientHello.
    s.write_all(
        b"CONNECT api.openai.com:443 HTTP/1.1\r\nhost: api.openai.com:443\r\n\
          user-agent: curl/8.5.0\r\nproxy-connection: Keep-Alive\r\n\r\n\x16\x03\x01\x02\x00\x01",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut got)).await;
    assert!(closed.is_ok(), "connection left open after the refusal");
    let text = String::from_utf8_lossy(&got).to_string();
    assert!(text.starts_with("HTTP/1.1 405 "), "{text}");
    assert_eq!(
        text.matches("HTTP/1.1 ").count(),
        1,
        "one answer only: {text}"
    );
    let head = text.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
    assert!(
        head.contains("\r\nallow: get, head, post, put, patch, delete, options"),
        "{head}"
    );
    assert!(head.contains("\r\nconnection: close"), "{head}");
    assert!(head.contains("\r\nx-should-retry: false"), "{head}");
    let body: serde_json::Value =
        serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("method CONNECT "), "{message}");
    assert!(!message.contains("no route"), "{message}");
    assert!(h.fake.requests().is_empty(), "forwarded to the provider");
    assert!(h.fake.connections().is_empty());
    // Counted as a refused request, under no route.
    h.wait_requests("none", 1.0).await;
    assert_eq!(
        h.metric(r#"hourglass_requests_total{outcome="error",route="none"}"#)
            .await,
        1.0
    );
}

/// TRACE is refused: an upstream that answers it echoes the request, and with it the provider
/// key the gateway adds (RFC 9110 9.3.8). So is any method the `Allow` list does not name,
/// over HTTP/1.1 and HTTP/2; nothing reaches the provider.
#[tokio::test]
async fn trace_and_methods_outside_allow_are_refused_and_never_forwarded() {
    let h = Harness::start().await;
    for method in ["TRACE", "FOO"] {
        let req = || {
            http::Request::builder()
                .method(method)
                .uri("/v1/chat/completions")
                .header("host", "gateway")
                .body(Full::new(Bytes::new()))
                .unwrap()
        };
        let (resp, _c) = h.send(req()).await;
        assert_eq!(resp.status(), 405, "{method}");
        assert_eq!(
            resp.headers()["allow"],
            "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
        );
        let body = json_body(resp).await;
        assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("method {method} ")),
            "{message}"
        );
        let resp = h2_send(h.addr(), req()).await.unwrap();
        assert_eq!(resp.status(), 405, "{method} over HTTP/2");
    }
    let message = {
        let req = http::Request::builder()
            .method("TRACE")
            .uri("/v1/chat/completions")
            .header("host", "gateway")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let (resp, _c) = h.send(req).await;
        json_body(resp).await["error"]["message"].to_string()
    };
    assert!(message.contains("provider key"), "{message}");
    assert!(h.fake.requests().is_empty(), "forwarded to the provider");
}

/// A reload that changes a route's `max_in_flight` keeps counting the requests still in
/// flight: raised from 2 to 3 with 2 streams open, one more is admitted, not three; lowered
/// back to 1, nobody is until the open streams are down to none.
#[tokio::test]
async fn a_reloaded_max_in_flight_counts_the_streams_still_open() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = temp_dir("admission");
    let path = dir.path().join("hourglass.toml");
    let with = |n: usize| {
        BASE.replace("{FAKE}", &fake.url()).replace(
            "name = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"",
            &format!(
                "name = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\nmax_in_flight = {n}"
            ),
        )
    };
    assert_ne!(with(2), with(3), "the route takes the limit");
    std::fs::write(&path, with(2)).unwrap();
    let gw = server::start_with_source(Config::load(&path).unwrap(), Some(path.clone()))
        .await
        .unwrap();
    let long = || {
        chat_request(
            &[("x-fake-chunks", "1000"), ("x-fake-interval-ms", "20")],
            true,
        )
    };
    let short = || chat_request(&[("x-request-budget-ms", "300")], false);
    let send = |req| async move { Conn::open(gw.addr).await.send(req).await };
    let mut open = Vec::new();
    for _ in 0..2 {
        let (resp, conn) = send(long()).await;
        assert_eq!(resp.status(), 200);
        open.push((resp, conn));
    }
    std::fs::write(&path, with(3)).unwrap();
    gw.reload().await.expect("valid reload");
    let (resp, conn) = send(long()).await;
    assert_eq!(resp.status(), 200, "one slot more");
    open.push((resp, conn));
    let (resp, _c) = send(short()).await;
    assert_eq!(resp.status(), 503, "three in flight of three");

    std::fs::write(&path, with(1)).unwrap();
    gw.reload().await.expect("valid reload");
    while open.len() > 1 {
        drop(open.pop());
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (resp, _c) = send(short()).await;
        assert_eq!(
            resp.status(),
            503,
            "{} still open of a limit of 1",
            open.len()
        );
    }
    drop(open.pop());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (resp, _c) = send(short()).await;
        if resp.status() == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A reload that takes `max_in_flight` away lets the requests waiting for a slot go at
/// once, and one that puts it back counts the requests still in flight: a waiting request
/// stayed queued until the stream before it ended, and a limit of 1 put back admitted a
/// second request beside the open one (audit P).
#[tokio::test]
async fn a_max_in_flight_taken_away_and_put_back_counts_what_is_in_flight() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = temp_dir("admission-lifted");
    let path = dir.path().join("hourglass.toml");
    let base = BASE
        .replace("{FAKE}", &fake.url())
        .replace("idle_timeout = \"1s\"", "idle_timeout = \"30s\"");
    let limited = base.replace(
        "name = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"",
        "name = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\nmax_in_flight = 1",
    );
    assert_ne!(limited, base);
    std::fs::write(&path, &limited).unwrap();
    let gw = server::start_with_source(Config::load(&path).unwrap(), Some(path.clone()))
        .await
        .unwrap();
    let long = || {
        chat_request(
            &[("x-fake-chunks", "1000"), ("x-fake-interval-ms", "20")],
            true,
        )
    };
    let addr = gw.addr;
    let (first, _c1) = Conn::open(addr).await.send(long()).await;
    assert_eq!(first.status(), 200);
    // Waits for the slot the first holds.
    let waiting = tokio::spawn(async move { Conn::open(addr).await.send(long()).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "the second waits for the slot");
    std::fs::write(&path, &base).unwrap();
    gw.reload().await.expect("valid reload");
    let (second, _c2) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting request goes once the limit is gone")
        .unwrap();
    assert_eq!(second.status(), 200);
    // Put back, the limit counts the two still open.
    std::fs::write(&path, &limited).unwrap();
    gw.reload().await.expect("valid reload");
    let (resp, _c) = Conn::open(addr)
        .await
        .send(chat_request(&[("x-request-budget-ms", "300")], false))
        .await;
    assert_eq!(resp.status(), 503, "two in flight of a limit of 1");
    drop((first, second));
}

/// A reload says which `[runs]` keys wait for a restart, measured against the table the
/// process started with (the run store it keeps): a second reload while a change waits
/// says so again, a reload back to the start says nothing. A reload refused for a route's
/// keys leaves no trace of that route, not even its metric series.
#[tokio::test]
async fn reloads_name_the_runs_keys_that_wait_and_a_refused_one_adds_no_series() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let start = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\n\
         [upstreams.fake]\nurl = \"{}\"\nauth = \"none\"\n\n\
         [[routes]]\nname = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n",
        fake.url()
    );
    let p = Process::spawn(&start, &["--log-format", "json"], &[]).await;
    let reloads = |result: &'static str, n: u32| {
        let line = format!("hourglass_config_reloads_total{{result=\"{result}\"}} {n}");
        let admin = p.admin;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while scrape(admin).await.lines().all(|l| l != line) {
                assert!(Instant::now() < deadline, "never {line}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let shorter = format!("{start}\n[runs]\nttl = \"5m\"\n");
    for (n, text) in [
        (1, shorter.clone()),
        (2, format!("{shorter}# an edit elsewhere\n")),
        (3, start.clone()),
    ] {
        std::fs::write(&p.config, text).unwrap();
        reloads("ok", n).await;
    }
    let ghost = format!(
        "{start}\n[[routes]]\nname = \"ghost\"\npath_prefix = \"/ghost\"\nupstream = \"fake\"\n\
         client_keys_file = \"/nonexistent/hourglass-ghost.keys\"\n"
    );
    std::fs::write(&p.config, ghost).unwrap();
    reloads("error", 1).await;
    let waiting = |v: &serde_json::Value| {
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("effect only after a restart"))
    };
    // Lines are written in order: once the refused reload's is out, every earlier one is.
    p.json_lines(1, |v| {
        v["message"] == "config reload failed; the running config stays"
    })
    .await;
    let warnings = p.json_lines(0, waiting).await;
    assert_eq!(warnings.len(), 2, "{:?}", p.output());
    for w in &warnings {
        assert_eq!(
            w["message"], "runs: ttl (10m stays) takes effect only after a restart",
            "{w}"
        );
    }
    let metrics = scrape(p.admin).await;
    assert!(!metrics.contains("route=\"ghost\""), "{metrics}");
}

/// Audit IB 4: a reload to a file start-up would refuse (here a `store_password_env` that is
/// not set) succeeded with a warning only, so the deployed file looked accepted and the
/// outage came at the next restart. It fails now as an unset `client_keys_env` does: counted
/// as an error, `/readyz` naming the key, the running config kept.
#[tokio::test]
async fn a_reload_start_up_would_refuse_fails() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = temp_dir("refused-runs");
    let path = dir.path().join("hourglass.toml");
    let text = BASE.replace("{FAKE}", &fake.url());
    std::fs::write(&path, &text).unwrap();
    let config = Config::load(&path).unwrap();
    let first = config.fingerprint.clone();
    let gw = server::start_with_source(config, Some(path.clone()))
        .await
        .unwrap();
    std::fs::write(
        &path,
        format!(
            "{text}\n[runs]\nstore = \"redis://127.0.0.1:9/0\"\n\
             store_password_env = \"HOURGLASS_IB4_UNSET_PASSWORD\"\n"
        ),
    )
    .unwrap();
    let e = gw.reload().await.unwrap_err().to_string();
    assert!(e.contains("store_password_env"), "{e}");
    assert_eq!(
        metric(
            gw.admin_addr,
            "hourglass_config_reloads_total{result=\"error\"}"
        )
        .await,
        1.0
    );
    let ready = admin_get(gw.admin_addr, "/readyz").await;
    assert!(ready.contains("last reload failed"), "{ready}");
    assert!(ready.contains("store_password_env"), "{ready}");
    assert!(ready.contains(&first), "{ready}");
    gw.shutdown().await;
}
