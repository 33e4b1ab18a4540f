//! Operations: reload without dropping requests, graceful shutdown, TLS and HTTP/2 clients,
//! and the header-read timeout.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use hourglass::config::Config;
use hourglass::server;
use hourglass_fake::FakeUpstream;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
    DnType, IsCa, KeyIdMethod, KeyPair, RevokedCertParams, SerialNumber,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

fn temp_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("hourglass-ops-{tag}-"))
        .tempdir()
        .unwrap()
}

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

#[tokio::test]
async fn shutdown_lets_streams_finish_then_cuts_the_rest_with_an_event() {
    let h = Harness::with_config(
        &BASE
            .replace("[server]\n", "[server]\nshutdown_grace = \"2s\"\n")
            .replace("idle_timeout = \"1s\"", "idle_timeout = \"20s\""),
    )
    .await;
    let (short, c1) = h
        .chat(&[("x-fake-chunks", "10"), ("x-fake-interval-ms", "30")])
        .await;
    let (frozen, c2) = h.chat(&[("x-fake-freeze-after", "1")]).await;
    let short = tokio::spawn(async move { (read_body(short.into_body()).await, c1) });
    let frozen = tokio::spawn(async move { (read_body(frozen.into_body()).await, c2) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let admin = h.gw.admin_addr;
    let addr = h.gw.addr;
    let start = Instant::now();
    let Harness { gw, fake } = h;
    let metrics = gw.metrics.clone();
    let health = gw.health.clone();
    let stopping = tokio::spawn(gw.shutdown());
    // Draining: /readyz turns 503 and new connections are refused (waited for, not slept:
    // the shutdown task may be slow to run on a busy machine).
    let deadline = Instant::now() + Duration::from_secs(5);
    while health.is_ready() || TcpStream::connect(addr).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "still ready or accepting 5 s after shutdown began"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (short, _) = short.await.unwrap();
    assert!(
        short.text().ends_with("data: [DONE]\n\n"),
        "the stream within grace finished"
    );
    let (frozen, _) = frozen.await.unwrap();
    let cut_at = start.elapsed();
    assert_eq!(
        frozen.error_event().expect("an error event")["code"],
        "shutdown"
    );
    assert!(
        // Cut by the 2 s grace, not by anything else (idle is 20 s, the budget 10 s).
        cut_at >= Duration::from_secs(2) && cut_at < Duration::from_secs(8),
        "{cut_at:?}"
    );
    stopping.await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(9),
        "shutdown returned"
    );
    let text = metrics.encode();
    assert!(
        text.contains("hourglass_cancellations_total{origin=\"shutdown\",route=\"chat\"} 1"),
        "{text}"
    );
    assert!(text.contains("hourglass_requests_total{outcome=\"ok\",route=\"chat\"} 1"));
    let _ = (admin, fake);
}

/// A connection that has sent nothing (a load balancer's TCP probe, a client's pool opened
/// ahead) is no request in flight: a drain closes it at once, over cleartext and before a
/// TLS handshake, instead of waiting out the grace or the header-read timeout (both 60 s).
#[tokio::test]
async fn shutdown_does_not_wait_for_connections_that_sent_nothing() {
    for tls in [false, true] {
        let c = certs("silent-conns");
        let toml = if tls {
            tls_config_toml(&c, false)
        } else {
            BASE.to_owned()
        };
        let h = Harness::with_config(&toml.replace(
            "[server]\n",
            "[server]\nshutdown_grace = \"60s\"\nheader_read_timeout = \"60s\"\n",
        ))
        .await;
        let mut silent = Vec::new();
        for _ in 0..3 {
            silent.push(TcpStream::connect(h.gw.addr).await.unwrap());
        }
        // The connections are accepted before the drain begins.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Harness { gw, fake } = h;
        tokio::time::timeout(Duration::from_secs(20), gw.shutdown())
            .await
            .unwrap_or_else(|_| panic!("tls {tls}: shutdown waited for silent connections"));
        for mut s in silent {
            let mut buf = [0u8; 1];
            let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
                .await
                .expect("closed")
                .unwrap_or(0);
            assert_eq!(n, 0, "tls {tls}: closed without a word");
        }
        drop(fake);
    }
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
    }
}

/// A certificate rotated in place (cert-manager, a Secret update) leaves the config file as
/// it was: the watcher follows the files the config names too, and the new certificate is
/// served without a SIGHUP.
#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_signal() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let old = certs("rotate-old");
    let new = certs("rotate-new");
    let path = old.dir.path().join("hourglass.toml");
    std::fs::write(
        &path,
        tls_config_toml(&old, false).replace("{FAKE}", &fake.url()),
    )
    .unwrap();
    let gw = server::start_with_source(Config::load(&path).unwrap(), Some(path.clone()))
        .await
        .unwrap();
    gw.watch_config(Duration::from_millis(50));
    assert!(tls_client(gw.addr, &old, b"http/1.1", false).await.is_ok());
    assert!(tls_client(gw.addr, &new, b"http/1.1", false).await.is_err());
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The key first, then the certificate: between the two writes they do not fit, a
    // reload fails and the old pair stays; the second write heals it.
    for name in ["server.key", "server.pem"] {
        std::fs::copy(new.dir.path().join(name), old.dir.path().join(name)).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while tls_client(gw.addr, &new, b"http/1.1", false).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the rotated certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gw
        .metrics
        .encode()
        .contains("hourglass_config_reloads_total{result=\"ok\"} 1"));
    gw.shutdown().await;
}

type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

struct Certs {
    dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    ca_key: KeyPair,
    /// Serial 1, `CN=agent-7,O=Acme\, Inc.`.
    client: Identity,
}

impl Certs {
    /// Another client certificate the CA signed.
    fn client(&self, serial: u64) -> Identity {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["client".to_string()]).unwrap();
        params.serial_number = Some(SerialNumber::from(serial));
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        (
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
    }

    /// Writes `clients.crl`: the CA's CRL revoking these serials, valid for decades.
    fn write_crl(&self, revoked: &[u64]) -> std::path::PathBuf {
        let path = self.dir.path().join("clients.crl");
        std::fs::write(&path, self.crl(1, revoked)).unwrap();
        path
    }

    /// The CA's CRL number `number`, revoking these serials, in PEM.
    fn crl(&self, number: u64, revoked: &[u64]) -> String {
        let crl = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2020, 1, 1),
            next_update: rcgen::date_time_ymd(2090, 1, 1),
            crl_number: SerialNumber::from(number),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|&serial| RevokedCertParams {
                    serial_number: SerialNumber::from(serial),
                    revocation_time: rcgen::date_time_ymd(2020, 1, 1),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&self.ca, &self.ca_key)
        .unwrap();
        crl.pem().unwrap()
    }
}

fn certs(tag: &str) -> Certs {
    let dir = temp_dir(tag);
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&server_key, &ca, &ca_key)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let mut client = CertificateParams::new(vec!["client".to_string()]).unwrap();
    client.serial_number = Some(SerialNumber::from(1));
    client.distinguished_name = DistinguishedName::new();
    client
        .distinguished_name
        .push(DnType::OrganizationName, "Acme, Inc.");
    client
        .distinguished_name
        .push(DnType::CommonName, "agent-7");
    let client = client.signed_by(&client_key, &ca, &ca_key).unwrap();
    std::fs::write(dir.path().join("server.pem"), server.pem()).unwrap();
    std::fs::write(dir.path().join("server.key"), server_key.serialize_pem()).unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
    Certs {
        dir,
        ca,
        ca_key,
        client: (
            vec![client.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(client_key.serialize_der())),
        ),
    }
}

fn tls_config_toml(c: &Certs, client_ca: bool) -> String {
    let mut tls = format!(
        "[server.tls]\ncert = {:?}\nkey = {:?}\n",
        c.dir.path().join("server.pem").display().to_string(),
        c.dir.path().join("server.key").display().to_string()
    );
    if client_ca {
        tls.push_str(&format!(
            "client_ca = {:?}\n",
            c.dir.path().join("ca.pem").display().to_string()
        ));
    }
    BASE.replace("[defaults]\n", &format!("{tls}\n[defaults]\n"))
        .replace("idle_timeout = \"1s\"", "idle_timeout = \"20s\"")
}

async fn tls_client(
    addr: std::net::SocketAddr,
    c: &Certs,
    alpn: &[u8],
    with_cert: bool,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    tls_client_as(addr, c, alpn, with_cert.then_some(&c.client)).await
}

async fn tls_client_as(
    addr: std::net::SocketAddr,
    c: &Certs,
    alpn: &[u8],
    client: Option<&Identity>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(c.ca.der().clone()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match client {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await?;
    let mut s = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await?;
    // With client auth, a rejected certificate surfaces on the first read.
    s.flush().await?;
    Ok(s)
}

#[tokio::test]
async fn tls_clients_stream_over_http2_and_http1_and_cancel() {
    let c = certs("tls");
    let h = Harness::with_config(&tls_config_toml(&c, false)).await;

    // HTTP/2 over TLS (ALPN h2): stream, then reset mid-stream.
    let tls = tls_client(h.addr(), &c, b"h2", false).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = chat_request(&[("x-fake-chunks", "3")], true);
    *req.version_mut() = http::Version::HTTP_2;
    *req.uri_mut() = "https://localhost/v1/chat/completions".parse().unwrap();
    req.headers_mut().remove("host");
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"));

    let mut req = chat_request(&[("x-fake-freeze-after", "1")], true);
    *req.uri_mut() = "https://localhost/v1/chat/completions".parse().unwrap();
    req.headers_mut().remove("host");
    let resp = sender.send_request(req).await.unwrap();
    let mut body = resp.into_body();
    read_events(&mut body, 2).await;
    let frozen_conn = h.fake.requests().last().unwrap().conn_id;
    let left = Instant::now();
    drop(body); // RST_STREAM on the client's HTTP/2 connection, which stays open
    let closed = h
        .fake
        .wait_closed(frozen_conn, Duration::from_secs(5))
        .await
        .expect("upstream closed");
    // Idle is 20 s here: only the reset can close it this soon.
    assert!(closed.saturating_duration_since(left) < PROMPTLY);

    // HTTP/1.1 over TLS.
    let tls = tls_client(h.addr(), &c, b"http/1.1", false).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = sender
        .send_request(chat_request(&[("x-fake-chunks", "2")], true))
        .await
        .unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"));
}

/// Over TLS the framing tracker reads the decrypted bytes: Content-Length next to
/// Transfer-Encoding is refused there too (tests/smuggling.rs has the cleartext probes).
#[tokio::test]
async fn tls_http1_refuses_content_length_with_transfer_encoding() {
    let c = certs("tls-cl-te");
    let h = Harness::with_config(&tls_config_toml(&c, false)).await;
    let mut tls = tls_client(h.addr(), &c, b"http/1.1", false).await.unwrap();
    tls.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n\
          transfer-encoding: chunked\r\ncontent-length: 4\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), tls.read_to_end(&mut got)).await;
    // A peer that closes without close_notify is an error to rustls: what came is enough.
    assert!(read.is_ok(), "connection left open");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 400 "), "{text}");
    assert!(
        text.contains("both Content-Length and Transfer-Encoding are present"),
        "{text}"
    );
    assert!(h.fake.requests().is_empty());
}

#[tokio::test]
async fn client_certificates_are_required_when_client_ca_is_set() {
    let c = certs("mtls");
    let h = Harness::with_config(&tls_config_toml(&c, true)).await;
    let ok = tls_client(h.addr(), &c, b"http/1.1", true).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(ok))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = sender.send_request(chat_request(&[], true)).await.unwrap();
    assert_eq!(resp.status(), 200);
    // Without a certificate the handshake (or the first exchange) fails; nothing is forwarded.
    let before = h.fake.requests().len();
    if let Ok(s) = tls_client(h.addr(), &c, b"http/1.1", false).await {
        let r = hyper::client::conn::http1::handshake(TokioIo::new(s)).await;
        if let Ok((mut sender, conn)) = r {
            tokio::spawn(conn);
            assert!(sender.send_request(chat_request(&[], true)).await.is_err());
        }
    }
    assert_eq!(h.fake.requests().len(), before);
}

/// The status of a request made with this client certificate, `None` when the connection
/// is refused: under TLS 1.3 the client sends its certificate after the handshake is done on
/// its side, and learns of the refusal only from the alert it reads next.
async fn status_as(
    addr: std::net::SocketAddr,
    c: &Certs,
    client: &Identity,
) -> Option<http::StatusCode> {
    status_with(addr, c, Some(client)).await
}

/// A request's status over a TLS connection presenting `client`'s certificate, or none.
async fn status_with(
    addr: std::net::SocketAddr,
    c: &Certs,
    client: Option<&Identity>,
) -> Option<http::StatusCode> {
    let s = tls_client_as(addr, c, b"http/1.1", client).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .ok()?;
    tokio::spawn(conn);
    let resp = sender.send_request(chat_request(&[], false)).await.ok()?;
    Some(resp.status())
}

fn with_crl(toml: &str, crl: &std::path::Path) -> String {
    toml.replace(
        "client_ca = ",
        &format!("client_crl = {:?}\nclient_ca = ", crl.display().to_string()),
    )
}

/// A client certificate `client_crl` revokes is refused at the handshake, counted as a
/// refused client certificate, and forwards nothing; one the CRL does not list is served.
#[tokio::test]
async fn a_revoked_client_certificate_is_refused_at_the_handshake() {
    let c = certs("crl");
    let revoked = c.client(2);
    let crl = c.write_crl(&[2]);
    let h = Harness::with_config(&with_crl(&tls_config_toml(&c, true), &crl)).await;
    assert_eq!(
        status_as(h.addr(), &c, &c.client).await,
        Some(http::StatusCode::OK)
    );
    let served = h.fake.requests().len();
    assert_eq!(status_as(h.addr(), &c, &revoked).await, None);
    assert_eq!(h.fake.requests().len(), served);
    let refused = "hourglass_tls_handshake_failures_total{reason=\"client_certificate\"}";
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.metric(refused).await < 1.0 {
        assert!(Instant::now() < deadline, "the refusal was not counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(h.metric(refused).await, 1.0);
    // When the CRL is due (2090-01-01), for an alert before it lapses.
    assert_eq!(
        h.metric(
            "hourglass_tls_crl_next_update_timestamp_seconds{issuer=\"CN=rcgen self signed cert\"}"
        )
        .await,
        3_786_912_000.0
    );
}

/// Of two CRLs from the CA in the file, the newer revokes, before the older or after it.
/// rustls consults the first whose issuer matches: a newer CRL appended to the file
/// (`cat new.crl >> clients.crl`) revoked nothing it added, and nothing said so.
#[tokio::test]
async fn the_newest_of_two_crls_from_one_ca_revokes_wherever_it_is_in_the_file() {
    let c = certs("crl-two");
    let revoked = c.client(2);
    let (old, new) = (c.crl(1, &[]), c.crl(2, &[2]));
    for (name, pem) in [
        ("appended", format!("{old}{new}")),
        ("first", format!("{new}{old}")),
    ] {
        let path = c.dir.path().join(format!("{name}.crl"));
        std::fs::write(&path, pem).unwrap();
        let h = Harness::with_config(&with_crl(&tls_config_toml(&c, true), &path)).await;
        assert_eq!(status_as(h.addr(), &c, &revoked).await, None, "{name}");
        assert_eq!(
            status_as(h.addr(), &c, &c.client).await,
            Some(http::StatusCode::OK),
            "{name}"
        );
    }
}

/// A certificate revoked after start-up is refused once the watcher sees the new CRL, with
/// no signal and the config file untouched, as a rotated certificate is picked up.
#[tokio::test]
async fn a_certificate_revoked_in_a_new_crl_is_refused_without_a_signal() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = certs("crl-reload");
    let leaked = c.client(2);
    let crl = c.write_crl(&[]);
    let path = c.dir.path().join("hourglass.toml");
    std::fs::write(
        &path,
        with_crl(&tls_config_toml(&c, true), &crl).replace("{FAKE}", &fake.url()),
    )
    .unwrap();
    let gw = server::start_with_source(Config::load(&path).unwrap(), Some(path.clone()))
        .await
        .unwrap();
    gw.watch_config(Duration::from_millis(50));
    assert_eq!(
        status_as(gw.addr, &c, &leaked).await,
        Some(http::StatusCode::OK)
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.write_crl(&[2]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while status_as(gw.addr, &c, &leaked).await.is_some() {
        assert!(Instant::now() < deadline, "the new CRL was not picked up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        status_as(gw.addr, &c, &c.client).await,
        Some(http::StatusCode::OK)
    );
    assert!(gw
        .metrics
        .encode()
        .contains("hourglass_config_reloads_total{result=\"ok\"} 1"));
    gw.shutdown().await;
}

/// A refused client certificate is named in the log. A CRL older than the one served,
/// copied over it (from a backup, a stale mirror), lets the clients revoked in between back
/// in. The reload goes ahead (the file is the operator's, and a restart would serve it
/// anyway), and its warning names both CRLs; a reload that fails for another reason serves
/// on the newer one and warns of nothing.
#[tokio::test]
async fn a_crl_older_than_the_one_served_is_warned_of_on_reload() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = certs("crl-rollback");
    let leaked = c.client(2);
    let crl = c.dir.path().join("clients.crl");
    std::fs::write(&crl, c.crl(7, &[2])).unwrap();
    let p = Process::spawn(
        &with_crl(&tls_config_toml(&c, true), &crl).replace("{FAKE}", &fake.url()),
        &["--log-format", "json"],
        &[],
    )
    .await;
    assert_eq!(status_as(p.addr, &c, &leaked).await, None);
    // The refusal names the certificate, as the request lines name those let in, and the
    // peer that presented it.
    let refusal = refusals_logged(&p, 1).await.swap_remove(0);
    assert_eq!(
        refusal["client_cert"], "CN=rcgen self signed cert",
        "{refusal}"
    );
    assert!(
        refusal["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with("127.0.0.1:")),
        "{refusal}"
    );
    assert_eq!(refusal["serial"], "02", "{refusal}");
    assert_eq!(
        refusal["error"], "invalid peer certificate: Revoked",
        "{refusal}"
    );
    let reloads = |result: &'static str, n: u32| {
        let line = format!("hourglass_config_reloads_total{{result=\"{result}\"}} {n}");
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while scrape(p.admin).await.lines().all(|l| l != line) {
                assert!(Instant::now() < deadline, "never {line}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    // A config edit that cannot be served (its key file is missing), then number 5, from
    // before serial 2 was revoked, renamed into place: that reload fails too, and serves on
    // the CRL it would have rolled back, so no warning is said of it.
    let served = std::fs::read_to_string(&p.config).unwrap();
    let broken = served.replace(
        "api_key_env = \"HOURGLASS_TEST_KEY_UNSET\"",
        "api_key_file = \"/nonexistent/hourglass-test.key\"",
    );
    assert_ne!(broken, served);
    std::fs::write(&p.config, &broken).unwrap();
    reloads("error", 1).await;
    // With number 4 after it, which the reload says it ignores, when it serves.
    let staged = c.dir.path().join("clients.crl.new");
    std::fs::write(&staged, c.crl(5, &[]) + &c.crl(4, &[])).unwrap();
    std::fs::rename(&staged, &crl).unwrap();
    reloads("error", 2).await;
    assert_eq!(status_as(p.addr, &c, &leaked).await, None, "CRL 7 stays");
    // Mended: the reload goes ahead with CRL 5, and says what it undoes.
    std::fs::write(&p.config, &served).unwrap();
    reloads("ok", 1).await;
    assert_eq!(
        status_as(p.addr, &c, &leaked).await,
        Some(http::StatusCode::OK),
        "as the warning says"
    );
    let (stdout, stderr) = p.output();
    let warnings = stdout
        .lines()
        .chain(stderr.lines())
        .filter(|l| l.contains("is older than one this process served"))
        .collect::<Vec<_>>();
    assert_eq!(warnings.len(), 1, "{stdout}{stderr}");
    let ignored = stdout
        .lines()
        .chain(stderr.lines())
        .filter(|l| l.contains("holds more than one CRL"))
        .count();
    assert_eq!(
        ignored, 1,
        "said by the reload that serves it alone: {stdout}{stderr}"
    );
    assert!(
        warnings[0].contains("(number 5) is older than one this process served before (number 7)"),
        "{warnings:?}"
    );
}

/// The first `n` lines that logged a refused client certificate.
async fn refusals_logged(p: &Process, n: usize) -> Vec<serde_json::Value> {
    let lines = p
        .json_lines(n, |v| v["message"] == "client certificate refused")
        .await;
    assert_eq!(lines.len(), n, "{:?}", p.output());
    lines
}

/// Every refusal names the peer and the certificate it presented, whatever rustls's reason,
/// including those it gives as an `OtherError` (which never compares equal to itself): here
/// a CA certificate presented as a client's. A client that presents none, refused before any
/// verifier runs, is logged all the same, with no certificate.
#[tokio::test]
async fn every_refused_client_is_logged_with_its_address_and_certificate() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = certs("refusal-lines");
    let p = Process::spawn(
        &tls_config_toml(&c, true).replace("{FAKE}", &fake.url()),
        &["--log-format", "json"],
        // Every refusal, not one a second at info.
        &[("RUST_LOG", "info,hourglass::server::client_cert=debug")],
    )
    .await;
    let ca_as_client = {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.serial_number = Some(SerialNumber::from(0x7777));
        let cert = params.signed_by(&key, &c.ca, &c.ca_key).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (vec![cert.der().clone()], key)
    };
    let stranger = certs("refusal-lines-other-ca").client(0x55);
    for client in [Some(&ca_as_client), Some(&stranger), None] {
        assert_eq!(status_with(p.addr, &c, client).await, None);
    }
    let lines = refusals_logged(&p, 3).await;
    let said = |l: &serde_json::Value, key: &str| l.get(key).map(|v| v.to_string());
    for (line, serial, error) in [
        (&lines[0], Some("\"7777\""), "CaUsedAsEndEntity"),
        // Both CAs are named as rcgen names them: the chain's signature is what fails.
        (&lines[1], Some("\"55\""), "BadSignature"),
        (&lines[2], None, "peer sent no certificates"),
    ] {
        assert_eq!(said(line, "serial").as_deref(), serial, "{line}");
        assert_eq!(
            line.get("client_cert").is_some(),
            serial.is_some(),
            "{line}"
        );
        assert!(
            said(line, "error").is_some_and(|e| e.contains(error)),
            "{line}"
        );
        assert!(
            line["peer"]
                .as_str()
                .is_some_and(|p| p.starts_with("127.0.0.1:")),
            "{line}"
        );
    }
    assert!(fake.requests().is_empty());
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

/// Who made each call: the log line names the client's certificate (RFC 4514) and the key
/// its route accepted (its name in the key file, and the start of the key's SHA-256, never
/// the key); the client's requests and tokens are counted under its name.
#[tokio::test]
async fn the_log_line_names_the_clients_certificate_and_key() {
    let c = certs("mtls-log");
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    const KEY: &str = "hg-client-key-0123456789";
    let keys = c.dir.path().join("client-keys");
    std::fs::write(&keys, format!("team-a {KEY}\n")).unwrap();
    let toml = tls_config_toml(&c, true)
        .replace("{FAKE}", &fake.url())
        .replace(
            "path_prefix = \"/v1/chat/completions\"\n",
            &format!(
                "path_prefix = \"/v1/chat/completions\"\nclient_keys_file = {:?}\n",
                keys.display().to_string()
            ),
        );
    let p = Process::spawn(&toml, &["--log-format", "json"], &[]).await;
    // From start-up, so that rate() and increase() count the first request too.
    assert_eq!(
        metric(
            p.admin,
            "hourglass_client_requests_total{client=\"team-a\",outcome=\"ok\",route=\"chat\"}"
        )
        .await,
        0.0
    );
    for alpn in [&b"http/1.1"[..], b"h2"] {
        let tls = tls_client(p.addr, &c, alpn, true).await.unwrap();
        let mut req = chat_request(&[("authorization", &format!("Bearer {KEY}"))], true);
        let resp = if alpn == b"h2" {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            *req.uri_mut() = "https://localhost/v1/chat/completions".parse().unwrap();
            req.headers_mut().remove("host");
            sender.send_request(req).await.unwrap()
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .unwrap();
            tokio::spawn(conn);
            sender.send_request(req).await.unwrap()
        };
        assert_eq!(resp.status(), 200);
        read_body(resp.into_body()).await;
    }
    let lines = p.request_lines(2).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    let digest = ring::digest::digest(&ring::digest::SHA256, KEY.as_bytes());
    let hex: String = digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    for line in &lines {
        assert_eq!(line["client_cert"], "CN=agent-7,O=Acme\\, Inc.", "{line}");
        assert_eq!(line["client"], "team-a", "{line}");
        assert_eq!(line["client_key"], hex.as_str(), "{line}");
        assert!(!line.to_string().contains(KEY), "{line}");
    }
    assert_eq!(
        metric(
            p.admin,
            "hourglass_client_requests_total{client=\"team-a\",outcome=\"ok\",route=\"chat\"}"
        )
        .await,
        2.0
    );
    let completion = lines
        .iter()
        .map(|l| l["completion_tokens"].as_u64().unwrap())
        .sum::<u64>();
    let source = lines[0]["tokens_source"].as_str().unwrap();
    let tokens = metric(
        p.admin,
        &format!(
            "hourglass_client_tokens_total{{client=\"team-a\",kind=\"completion\",route=\"chat\",source=\"{source}\"}}"
        ),
    )
    .await;
    assert_eq!(tokens, completion as f64);
    p.stop().await;
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

#[tokio::test]
async fn an_h2c_client_reset_cancels_the_upstream() {
    let h = Harness::with_config(&BASE.replace("idle_timeout = \"1s\"", "idle_timeout = \"20s\""))
        .await;
    let tcp = TcpStream::connect(h.addr()).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = chat_request(&[("x-fake-freeze-after", "1")], true);
    *req.uri_mut() = "http://localhost/v1/chat/completions".parse().unwrap();
    req.headers_mut().remove("host");
    let resp = sender.send_request(req).await.unwrap();
    let mut body = resp.into_body();
    read_events(&mut body, 2).await;
    let left = Instant::now();
    drop(body);
    let delay = upstream_close_delay(&h.fake, left).await;
    assert!(delay < PROMPTLY, "{delay:?}");
    h.wait_requests("chat", 1.0).await;
    assert_eq!(
        h.metric("hourglass_cancellations_total{origin=\"client\",route=\"chat\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn a_client_stalling_mid_head_gets_408() {
    let h = Harness::with_config(
        &BASE.replace("[server]\n", "[server]\nheader_read_timeout = \"300ms\"\n"),
    )
    .await;
    let mut s = TcpStream::connect(h.addr()).await.unwrap();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let start = Instant::now();
    let mut buf = vec![0; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    assert!(start.elapsed() < Duration::from_secs(4));
    assert!(h.fake.requests().is_empty());
    // Counted, as hyper's other refusals are; an idle keep-alive connection closed at the
    // same timeout is not a refused head.
    let mut idle = TcpStream::connect(h.addr()).await.unwrap();
    let body = r#"{"model":"m"}"#;
    idle.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), idle.read_to_end(&mut got)).await;
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    assert_eq!(
        h.metric("hourglass_refused_heads_total{reason=\"header_timeout\"}")
            .await,
        1.0
    );
}

/// A connection that never says anything is not held past the header-read timeout (nor is
/// one that stops part-way through the HTTP/2 preface), and any `max_connections` slot it
/// held is free again.
#[tokio::test]
async fn a_client_that_sends_nothing_is_closed_at_the_header_read_timeout() {
    let h = Harness::with_config(&BASE.replace(
        "[server]\n",
        "[server]\nheader_read_timeout = \"300ms\"\nmax_connections = 2\n",
    ))
    .await;
    for sent in [&b""[..], b"PRI * HTTP/2.0\r\n"] {
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(h.addr()).await.unwrap();
            s.write_all(sent).await.unwrap();
            held.push(s);
        }
        let start = Instant::now();
        for s in &mut held {
            let mut buf = [0u8; 64];
            let read = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("{sent:?}: still open after 3 s"));
            // Closed without an answer (a reset when unread bytes were left behind).
            assert!(matches!(read, Ok(0) | Err(_)), "{sent:?}: {read:?}");
        }
        assert!(start.elapsed() < Duration::from_secs(2), "{sent:?}");
        // Both slots are free again: a real request is served.
        let (resp, _conn) = h.chat(&[]).await;
        assert_eq!(resp.status(), 200, "{sent:?}");
    }
    assert_eq!(h.fake.requests().len(), 2);
}

/// The HTTP/2 preface arriving in two pieces is still HTTP/2.
#[tokio::test]
async fn an_h2c_preface_split_across_writes_is_still_http2() {
    let h = Harness::start().await;
    let tcp = TcpStream::connect(h.addr()).await.unwrap();
    let io = SplitFirstWrite {
        inner: tcp,
        first: true,
        pause: None,
    };
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = chat_request(&[], false);
    *req.uri_mut() = "http://localhost/v1/chat/completions".parse().unwrap();
    req.headers_mut().remove("host");
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_2);
}

/// Sends the first 10 bytes of the first write alone, then nothing for 50 ms.
struct SplitFirstWrite {
    inner: TcpStream,
    first: bool,
    pause: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl tokio::io::AsyncRead for SplitFirstWrite {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for SplitFirstWrite {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if let Some(pause) = self.pause.as_mut() {
            std::task::ready!(std::future::Future::poll(pause.as_mut(), cx));
            self.pause = None;
        }
        if std::mem::take(&mut self.first) {
            self.pause = Some(Box::pin(tokio::time::sleep(Duration::from_millis(50))));
            let n = buf.len().min(10);
            return std::pin::Pin::new(&mut self.inner).poll_write(cx, &buf[..n]);
        }
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[tokio::test]
async fn oversized_heads_and_too_many_headers_get_431() {
    let h = Harness::start().await;
    for head in [
        format!(
            "GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
            "a".repeat(70_000)
        ),
        format!(
            "GET /v1/models HTTP/1.1\r\nhost: x\r\n{}\r\n",
            (0..120)
                .map(|i| format!("x-h{i}: v\r\n"))
                .collect::<String>()
        ),
    ] {
        let mut s = TcpStream::connect(h.addr()).await.unwrap();
        let _ = s.write_all(head.as_bytes()).await;
        let mut buf = vec![0; 1024];
        let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 431"),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
    }
    assert!(h.fake.requests().is_empty());
}

/// The default limit is 100 header lines, `host` included: the 100th is served, the 101st
/// refused.
#[tokio::test]
async fn the_default_header_limit_is_one_hundred() {
    let h = Harness::start().await;
    for (extra, refused) in [(99, false), (100, true)] {
        let head = format!(
            "GET /v1/models HTTP/1.1\r\nhost: x\r\n{}connection: close\r\n\r\n",
            (0..extra - 1)
                .map(|i| format!("x-h{i}: v\r\n"))
                .collect::<String>()
        );
        let mut s = TcpStream::connect(h.addr()).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        let mut buf = vec![0; 1024];
        let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        let text = String::from_utf8_lossy(&buf[..n]);
        assert_eq!(
            text.starts_with("HTTP/1.1 431"),
            refused,
            "{} headers: {text:?}",
            extra + 1
        );
        assert!(text.starts_with("HTTP/1.1 "), "{text:?}");
    }
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

/// An HTTP/2 connection with no stream open is closed (GOAWAY, then close) after the
/// header-read timeout, as an idle HTTP/1 keep-alive connection is: one that sent its preface
/// and then nothing, and one whose last stream has ended. A connection with a stream open
/// stays, however long the stream.
#[tokio::test]
async fn an_h2c_connection_with_no_stream_open_is_closed_after_the_header_read_timeout() {
    let h = Harness::with_config(&BASE.replace(
        "[server]\n",
        "[server]\nheader_read_timeout = \"300ms\"\nmax_connections = 1\n",
    ))
    .await;
    async fn connect(
        addr: std::net::SocketAddr,
    ) -> (
        hyper::client::conn::http2::SendRequest<Full<Bytes>>,
        tokio::sync::oneshot::Receiver<Instant>,
    ) {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .unwrap();
        let (closed_tx, closed) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let _ = conn.await;
            let _ = closed_tx.send(Instant::now());
        });
        (sender, closed)
    }
    let request = |headers: &[(&str, &str)]| {
        let mut req = chat_request(headers, true);
        *req.uri_mut() = "http://localhost/v1/chat/completions".parse().unwrap();
        req.headers_mut().remove("host");
        req
    };

    // The preface, then nothing.
    let start = Instant::now();
    let (_sender, closed) = connect(h.addr()).await;
    let at = tokio::time::timeout(Duration::from_secs(3), closed)
        .await
        .expect("an idle h2c connection was still open after 3 s")
        .unwrap();
    let idle = at - start;
    assert!(
        idle >= Duration::from_millis(250) && idle < Duration::from_millis(1500),
        "closed after {idle:?}"
    );

    // The preface and SETTINGS from a client that then reads nothing and answers no PING, so
    // never completes the graceful close: dropped a limit after its GOAWAY.
    let mut raw = TcpStream::connect(h.addr()).await.unwrap();
    raw.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let start = Instant::now();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = raw.read(&mut buf).await {
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("a client that ignores the GOAWAY's PING held the connection past 5 s");
    let held = start.elapsed();
    assert!(held < Duration::from_millis(2500), "closed after {held:?}");
    // A GOAWAY frame (type 7) was among what it was sent.
    let mut at = 0;
    let mut goaway = false;
    while at + 9 <= got.len() {
        let len =
            usize::from(got[at]) << 16 | usize::from(got[at + 1]) << 8 | usize::from(got[at + 2]);
        goaway |= got[at + 3] == 7;
        at += 9 + len;
    }
    assert!(goaway, "no GOAWAY in {got:?}");

    // A stream of 1.2 s, four limits long: the connection stays, and serves another after it.
    let (mut sender, mut closed) = connect(h.addr()).await;
    let resp = sender
        .send_request(request(&[
            ("x-fake-chunks", "12"),
            ("x-fake-interval-ms", "100"),
        ]))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("[DONE]"));
    assert!(closed.try_recv().is_err(), "closed while a stream was open");
    let resp = sender.send_request(request(&[])).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    let ended = Instant::now();
    // Then, with nothing open, it goes.
    let at = tokio::time::timeout(Duration::from_secs(3), closed)
        .await
        .expect("an h2c connection idle after its streams was still open after 3 s")
        .unwrap();
    let idle = at - ended;
    assert!(
        idle >= Duration::from_millis(250) && idle < Duration::from_millis(1500),
        "closed {idle:?} after its last stream"
    );
    // Its `max_connections` slot serves again.
    let (resp, _conn) = h.chat(&[]).await;
    assert_eq!(resp.status(), 200);
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

/// An idle keep-alive HTTP/1 connection is closed as soon as the server drains, and one with
/// a request in flight gets its answer first and then is closed, so shutdown waits for
/// neither for its grace (one minute here: the 5 s waits below are a hang's limit, not a
/// measure).
#[tokio::test]
async fn draining_closes_idle_keep_alive_connections_and_lets_the_busy_one_answer_first() {
    // Nor does the idle connection end by the header-read limit (one minute too).
    let h = Harness::with_config(&BASE.replace(
        "[server]\n",
        "[server]\nshutdown_grace = \"60s\"\nheader_read_timeout = \"60s\"\n",
    ))
    .await;
    let mut idle = TcpStream::connect(h.gw.addr).await.unwrap();
    let request = |extra: &str| {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    idle.write_all(request("").as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 16 * 1024];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    // One whose answer takes 300 ms, asked before the drain and answered after it.
    let mut busy = TcpStream::connect(h.gw.addr).await.unwrap();
    busy.write_all(request("x-fake-ttft-ms: 300\r\n").as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let Harness { gw, fake } = h;
    let start = Instant::now();
    let stopping = tokio::spawn(gw.shutdown());
    // The idle connection ends without another byte.
    let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf))
        .await
        .expect("the idle connection is closed at the drain")
        .unwrap();
    assert_eq!(n, 0, "{}", String::from_utf8_lossy(&buf[..n]));
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), busy.read_to_end(&mut answer))
        .await
        .expect("the busy connection is closed after its answer")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("chat.completion"), "{answer}");
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .expect("shutdown does not wait for its grace")
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(30));
    drop(fake);
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

/// A second signal during the drain cuts what is still in flight at once, as the grace's end
/// would (each stream told, origin `shutdown`), instead of being ignored until the grace
/// (here 10 minutes) is over: an operator who presses Ctrl-C twice means it.
#[tokio::test]
async fn a_second_signal_during_the_drain_cuts_at_once() {
    let h = Harness::with_config(
        &BASE
            .replace("[server]\n", "[server]\nshutdown_grace = \"10m\"\n")
            .replace("idle_timeout = \"1s\"", "idle_timeout = \"20s\""),
    )
    .await;
    let (frozen, c) = h.chat(&[("x-fake-freeze-after", "1")]).await;
    let frozen = tokio::spawn(async move { (read_body(frozen.into_body()).await, c) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let Harness { gw, fake: _fake } = h;
    let signals = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let sender = signals.clone();
    let serving = tokio::spawn(gw.serve_until(move || {
        let signals = signals.clone();
        async move {
            signals.acquire().await.expect("open").forget();
        }
    }));
    sender.add_permits(1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!frozen.is_finished(), "the grace is 10 minutes");
    sender.add_permits(1);
    let (frozen, _) = tokio::time::timeout(Duration::from_secs(20), frozen)
        .await
        .expect("cut by the second signal")
        .unwrap();
    assert_eq!(
        frozen.error_event().expect("an error event")["code"],
        "shutdown"
    );
    tokio::time::timeout(Duration::from_secs(20), serving)
        .await
        .expect("shutdown returned")
        .unwrap();
}

/// Over TLS, a head stalled part-way through for `header_read_timeout` is counted as it is
/// over cleartext (`hourglass_refused_heads_total{reason="header_timeout"}`); an idle
/// keep-alive connection is not. (It is closed without the 408: hyper drops the TLS
/// session with the connection.)
#[tokio::test]
async fn a_head_stalled_over_tls_is_counted() {
    let c = certs("stalled-tls-head");
    let h = Harness::with_config(
        &tls_config_toml(&c, false)
            .replace("[server]\n", "[server]\nheader_read_timeout = \"1s\"\n"),
    )
    .await;
    let sample = "hourglass_refused_heads_total{reason=\"header_timeout\"}";
    let mut idle = tls_client(h.gw.addr, &c, b"http/1.1", false).await.unwrap();
    let mut stalled = tls_client(h.gw.addr, &c, b"http/1.1", false).await.unwrap();
    stalled
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n")
        .await
        .unwrap();
    for s in [&mut idle, &mut stalled] {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "closed at the header-read timeout");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.metric(sample).await < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the stalled head was not counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        h.metric(sample).await,
        1.0,
        "the idle connection is not counted"
    );
}

/// Failed TLS handshakes make no request and no log line: the counter says how many failed,
/// and why (a client's missing certificate, a client refusing the gateway's, plain HTTP on
/// the TLS port, which is answered 400 in HTTP, bytes that are no TLS, a client gone, a
/// silent one), so an mTLS rollout or a certificate the clients do not trust shows on a
/// dashboard.
#[tokio::test]
async fn failed_tls_handshakes_are_counted_by_reason() {
    let c = certs("tls-failures");
    let h = Harness::with_config(
        &tls_config_toml(&c, true)
            .replace("[server]\n", "[server]\nheader_read_timeout = \"1s\"\n"),
    )
    .await;
    let count = |reason: &'static str| {
        let admin = h.gw.admin_addr;
        async move {
            metric(
                admin,
                &format!("hourglass_tls_handshake_failures_total{{reason=\"{reason}\"}}"),
            )
            .await
        }
    };
    // No client certificate where the listener asks for one.
    let mut no_cert = tls_client(h.addr(), &c, b"http/1.1", false).await;
    if let Ok(s) = no_cert.as_mut() {
        let _ = s.read(&mut [0u8; 1]).await;
    }
    // A client that does not trust the gateway's certificate (only the public roots).
    let strict = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    })
    .with_no_client_auth();
    let tcp = TcpStream::connect(h.addr()).await.unwrap();
    assert!(tokio_rustls::TlsConnector::from(Arc::new(strict))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .is_err());
    // Plain HTTP on the TLS port is told so, in HTTP (as nginx does).
    let mut plain = TcpStream::connect(h.addr()).await.unwrap();
    plain
        .write_all(b"GET /v1/models HTTP/1.1\r\nhost: gateway\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    plain.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n")
            && answer.contains("\"code\":\"plain_http_on_tls\"")
            && answer.contains("use https://"),
        "{answer}"
    );
    // Bytes that are neither TLS nor HTTP.
    let mut junk = TcpStream::connect(h.addr()).await.unwrap();
    junk.write_all(&[0u8, 1, 2, 3, 4, 5, 6, 7]).await.unwrap();
    let _ = junk.read_to_end(&mut Vec::new()).await;
    // A client that connects and leaves, and one that says nothing.
    drop(TcpStream::connect(h.addr()).await.unwrap());
    let mut silent = TcpStream::connect(h.addr()).await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut [0u8; 1])).await;

    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = [
            count("client_certificate").await,
            count("alert").await,
            count("plain_http").await,
            count("malformed").await,
            count("closed").await,
            count("timeout").await,
        ];
        if got == [1.0; 6] {
            break;
        }
        assert!(Instant::now() < deadline, "{got:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(count("other").await, 0.0);
    // The certificate's expiry, for an alert well before clients refuse it.
    let expiry = metric(
        h.gw.admin_addr,
        "hourglass_tls_certificate_expiry_timestamp_seconds{listener=\"client\"}",
    )
    .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(expiry > now, "{expiry}");
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
