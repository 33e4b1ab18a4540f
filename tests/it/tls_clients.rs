//! TLS clients: HTTP/2 and HTTP/1.1 over TLS, client certificates and CRLs, rotated
//! certificates, and failed handshakes counted by reason.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use hourglass::config::Config;
use hourglass::server;
use hourglass_fake::FakeUpstream;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
    DnType, IsCa, KeyIdMethod, KeyPair, RevokedCertParams, SerialNumber,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// A certificate rotated in place (cert-manager, a Secret update) leaves the config file as
/// it was: the watcher follows the files the config names too, and the new certificate is
/// served without a SIGHUP.
#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_signal() {
    let old = certs("rotate-old");
    let new = certs("rotate-new");
    let (gw, _fake) = from_a_file(&old, &tls_config_toml(&old, false)).await;
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

/// Audit DE 1: a renewal installed before its notBefore (or an expired certificate) is refused
/// by every client, so a reload does not put it in place of the valid pair served: it is held
/// back, named with its dates in a warning and by `/readyz` (audit MB 1: the rest of the
/// reload applies, and it is counted as the reload it is).
#[tokio::test]
async fn a_reload_keeps_a_valid_certificate_over_one_not_valid_yet() {
    let c = certs("not-yet-valid");
    let (gw, _fake) = from_a_file(&c, &tls_config_toml(&c, false)).await;
    renew(&c, |p| {
        p.not_before = rcgen::date_time_ymd(2090, 1, 1);
        p.not_after = rcgen::date_time_ymd(2091, 1, 1);
    });
    gw.reload().await.unwrap();
    assert!(tls_client(gw.addr, &c, b"http/1.1", false).await.is_ok());
    let ready = admin_get(gw.admin_addr, "/readyz").await;
    assert!(
        ready.contains("certificate pending: server.tls.cert ")
            && ready.contains("the certificate is not valid yet (valid from 2090-01-01T00:00:00Z")
            && ready.contains("tried again at 2090-01-01T00:00:01Z (its notBefore)"),
        "{ready}"
    );
    let metrics = gw.metrics.encode();
    // 2090-01-01T00:00:01Z.
    assert!(
        metrics.contains(
            "hourglass_tls_certificate_pending_timestamp_seconds{listener=\"client\",\
         reason=\"not_yet_valid\"} 3786912001"
        ),
        "{metrics}"
    );
    assert!(metrics.contains("hourglass_config_reloads_total{result=\"ok\"} 1"));
    gw.shutdown().await;
}

/// Audit EA 1: a renewal held back for being not valid yet is taken once it is, without a
/// change of its file (the watcher reloads only changed files, and the served certificate
/// expired behind the refusal).
#[tokio::test]
async fn a_certificate_refused_as_not_valid_yet_is_taken_once_it_is() {
    let c = certs("valid-soon");
    let (gw, _fake) = from_a_file(&c, &tls_config_toml(&c, false)).await;
    renew(&c, |p| {
        p.not_before = (std::time::SystemTime::now() + Duration::from_secs(2)).into();
        p.not_after = rcgen::date_time_ymd(2091, 1, 1);
    });
    gw.reload().await.unwrap();
    let ready = admin_get(gw.admin_addr, "/readyz").await;
    assert!(
        ready.contains("the certificate is not valid yet"),
        "{ready}"
    );
    gw.watch_config(Duration::from_millis(50));
    // 2091-01-01T00:00:00Z, the new certificate's notAfter.
    let taken =
        "hourglass_tls_certificate_expiry_timestamp_seconds{listener=\"client\"} 3818448000";
    let deadline = Instant::now() + Duration::from_secs(15);
    while !gw.metrics.encode().contains(taken) {
        assert!(Instant::now() < deadline, "the certificate was never taken");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(tls_client(gw.addr, &c, b"http/1.1", false).await.is_ok());
    assert!(gw
        .metrics
        .encode()
        .contains("hourglass_config_reloads_total{result=\"ok\"} 2"));
    gw.shutdown().await;
}

/// Audit MB 1: a renewal staged before its notBefore (as deployment.md allows) holds back
/// the certificate alone. The reload that finds it applies the rest, here a client key
/// removed from its file, which is refused at once; the old pair is served on, `/readyz` and
/// a gauge say a certificate is pending (not that the reload failed), and the watcher takes
/// the new one at its notBefore.
#[tokio::test]
async fn a_staged_certificate_keeps_the_old_pair_while_the_rest_of_the_reload_applies() {
    const TEAM_A: &str = "hg-client-key-team-a-0123456789";
    const TEAM_B: &str = "hg-client-key-team-b-0123456789";
    let c = certs("staged-renewal");
    let keys = c.dir.path().join("client-keys");
    std::fs::write(&keys, format!("team-a {TEAM_A}\nteam-b {TEAM_B}\n")).unwrap();
    let toml = tls_config_toml(&c, false).replacen(
        "upstream = \"fake\"\n",
        &format!(
            "upstream = \"fake\"\nclient_keys_file = {:?}\n",
            keys.display().to_string()
        ),
        1,
    );
    let (gw, _fake) = from_a_file(&c, &toml).await;
    let old = served_leaf(gw.addr, &c).await;
    assert_eq!(status_with_key(gw.addr, &c, TEAM_B).await, 200);

    renew(&c, |p| {
        p.not_before = (std::time::SystemTime::now() + Duration::from_secs(4)).into();
        p.not_after = rcgen::date_time_ymd(2091, 1, 1);
    });
    std::fs::write(&keys, format!("team-a {TEAM_A}\n")).unwrap();
    let reloaded = gw.reload().await;
    assert!(reloaded.is_ok(), "{reloaded:?}");
    assert_eq!(status_with_key(gw.addr, &c, TEAM_B).await, 401);
    assert_eq!(status_with_key(gw.addr, &c, TEAM_A).await, 200);
    assert_eq!(
        served_leaf(gw.addr, &c).await,
        old,
        "the old pair is served on"
    );
    let ready = admin_get(gw.admin_addr, "/readyz").await;
    assert!(
        ready.contains("; certificate pending: server.tls.cert "),
        "{ready}"
    );
    assert!(!ready.contains("last reload failed"), "{ready}");
    let metrics = gw.metrics.encode();
    assert!(
        metrics.contains("hourglass_tls_certificate_pending_timestamp_seconds{listener=\"client\",reason=\"not_yet_valid\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("hourglass_config_reloads_total{result=\"ok\"} 1"));

    // Taken at its notBefore by the watcher, the file unchanged since.
    gw.watch_config(Duration::from_millis(50));
    let deadline = Instant::now() + Duration::from_secs(20);
    while served_leaf(gw.addr, &c).await == old {
        assert!(
            Instant::now() < deadline,
            "the staged certificate was never taken"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready = admin_get(gw.admin_addr, "/readyz").await;
    assert!(!ready.contains("pending"), "{ready}");
    assert!(!gw
        .metrics
        .encode()
        .contains("hourglass_tls_certificate_pending_timestamp_seconds{"));
    assert_eq!(status_with_key(gw.addr, &c, TEAM_B).await, 401);
    gw.shutdown().await;
}

/// The leaf certificate the listener serves.
async fn served_leaf(addr: std::net::SocketAddr, c: &Certs) -> CertificateDer<'static> {
    let tls = tls_client(addr, c, b"http/1.1", false).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// The leaf certificate the listener serves, to a client presenting its certificate.
async fn served_leaf_to(addr: std::net::SocketAddr, c: &Certs) -> CertificateDer<'static> {
    let tls = tls_client(addr, c, b"http/1.1", true).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// The status of a chat request over TLS with this client key.
async fn status_with_key(addr: std::net::SocketAddr, c: &Certs, key: &str) -> http::StatusCode {
    let s = tls_client(addr, c, b"http/1.1", false).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    let bearer = format!("Bearer {key}");
    let resp = sender
        .send_request(chat_request(&[("authorization", &bearer)], false))
        .await
        .unwrap();
    resp.status()
}

/// Writes over `c`'s certificate another for its key, from its CA, dated by `dates`.
fn renew(c: &Certs, dates: impl FnOnce(&mut CertificateParams)) {
    let key = std::fs::read_to_string(c.dir.path().join("server.key")).unwrap();
    let key = KeyPair::from_pem(&key).unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    dates(&mut params);
    let cert = params.signed_by(&key, &c.ca, &c.ca_key).unwrap();
    std::fs::write(c.dir.path().join("server.pem"), cert.pem()).unwrap();
}

type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

pub(crate) struct Certs {
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

pub(crate) fn certs(tag: &str) -> Certs {
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

/// A gateway started from `toml` written to a file beside `c`'s certificates, so that it
/// reloads them, and the fake provider its routes name.
async fn from_a_file(c: &Certs, toml: &str) -> (server::Running, FakeUpstream) {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let path = c.dir.path().join("hourglass.toml");
    std::fs::write(&path, toml.replace("{FAKE}", &fake.url())).unwrap();
    let gw = server::start_with_source(Config::load(&path).unwrap(), Some(path))
        .await
        .unwrap();
    (gw, fake)
}

pub(crate) fn tls_config_toml(c: &Certs, client_ca: bool) -> String {
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

pub(crate) async fn tls_client(
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

/// Audit DE 5: `http/1.0` is a registered ALPN id (RFC 7301 6), and HTTP/1.0 is served: a
/// client offering only it is served by the HTTP/1 server, not refused at the handshake.
#[tokio::test]
async fn a_client_offering_alpn_http_1_0_alone_is_served() {
    let c = certs("tls-alpn-http10");
    let h = Harness::with_config(&tls_config_toml(&c, false)).await;
    let mut tls = tls_client(h.addr(), &c, b"http/1.0", false).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.0"[..]));
    tls.write_all(b"GET /no-route HTTP/1.0\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), tls.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "connection left open");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.0 404 "), "{text}");
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
    let c = certs("crl-reload");
    let leaked = c.client(2);
    let crl = c.write_crl(&[]);
    let (gw, _fake) = from_a_file(&c, &with_crl(&tls_config_toml(&c, true), &crl)).await;
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

/// Audit MB 1: a certificate held back for its dates holds back the certificate pair alone:
/// a CRL that revokes a client, changed by the same reload, is used at once.
#[tokio::test]
async fn a_new_crl_is_used_while_the_certificate_is_held_back() {
    let c = certs("crl-held-cert");
    let leaked = c.client(2);
    let crl = c.write_crl(&[]);
    let (gw, _fake) = from_a_file(&c, &with_crl(&tls_config_toml(&c, true), &crl)).await;
    let old = served_leaf_to(gw.addr, &c).await;
    assert_eq!(
        status_as(gw.addr, &c, &leaked).await,
        Some(http::StatusCode::OK)
    );
    renew(&c, |p| {
        p.not_before = rcgen::date_time_ymd(2090, 1, 1);
        p.not_after = rcgen::date_time_ymd(2091, 1, 1);
    });
    c.write_crl(&[2]);
    gw.reload().await.unwrap();
    assert_eq!(status_as(gw.addr, &c, &leaked).await, None);
    assert_eq!(
        status_as(gw.addr, &c, &c.client).await,
        Some(http::StatusCode::OK)
    );
    assert_eq!(
        served_leaf_to(gw.addr, &c).await,
        old,
        "the old pair is served on"
    );
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
/// a CA certificate presented as a client's, which is also said in words (`problem`). A
/// client that presents none, refused before any verifier runs, is logged all the same, with
/// no certificate.
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
    // webpki's bare name for it is said in words too (audit Z3); the others have their own.
    assert!(
        lines[0]["problem"]
            .as_str()
            .is_some_and(|p| p.starts_with("the certificate is a CA certificate")),
        "{}",
        lines[0]
    );
    assert!(lines[1].get("problem").is_none(), "{}", lines[1]);
    assert!(fake.requests().is_empty());
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
        .write_all(b"GET /v1/models HTTP/1.1\r\nhost: gateway\r\nx-request-id: plain-1\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    plain.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n")
            && answer.contains("\"code\":\"plain_http_on_tls\"")
            && answer.contains("use https://")
            && answer.contains("\r\nx-request-id: plain-1\r\n"),
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

/// Audit MB 2: a TLS client on the plaintext listener (an `https://` URL for a gateway
/// without `[server.tls]`) is told with a TLS alert it can read, not hyper's bare HTTP 400
/// (which it reads as a record of another version), and counted as such, not as a malformed
/// head.
#[tokio::test]
async fn a_tls_client_on_the_plaintext_listener_gets_an_alert_and_is_counted() {
    let c = certs("tls-on-plaintext");
    let h = Harness::start().await;
    let e = tls_client(h.addr(), &c, b"http/1.1", false)
        .await
        .expect_err("no TLS without [server.tls]");
    let alert = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    assert_eq!(
        alert,
        Some(&rustls::Error::AlertReceived(
            rustls::AlertDescription::HandshakeFailure
        )),
        "{e}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while h
        .metric("hourglass_refused_heads_total{reason=\"tls\"}")
        .await
        < 1.0
    {
        assert!(Instant::now() < deadline, "{}", h.metrics_text().await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        h.metric("hourglass_refused_heads_total{reason=\"malformed\"}")
            .await,
        0.0
    );
    // A byte that merely looks like a record's start is HTTP's to refuse, as before.
    let mut s = TcpStream::connect(h.addr()).await.unwrap();
    s.write_all(b"\x16GARBAGE\r\n\r\n").await.unwrap();
    let mut got = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(3), s.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got, b"HTTP/1.1 400");
}

/// Audit MB 3: HTTP/2 prior knowledge over TLS without ALPN `h2` (`curl --no-alpn
/// --http2-prior-knowledge`) is refused, as RFC 9113 3.3 has it, and no longer silently: the
/// connection is closed, counted and logged.
#[tokio::test]
async fn http2_prior_knowledge_over_tls_without_alpn_is_counted() {
    let c = certs("h2-without-alpn");
    let h = Harness::with_config(&tls_config_toml(&c, false)).await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(c.ca.der().clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(h.addr()).await.unwrap();
    let mut tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), None);
    // The preface and an empty SETTINGS frame.
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the connection is closed");
    let deadline = Instant::now() + Duration::from_secs(5);
    let sample = "hourglass_refused_heads_total{reason=\"h2_without_alpn\"}";
    while h.metric(sample).await < 1.0 {
        assert!(Instant::now() < deadline, "{}", h.metrics_text().await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        h.metric("hourglass_refused_heads_total{reason=\"malformed\"}")
            .await,
        0.0
    );
}
