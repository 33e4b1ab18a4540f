//! Egress through an HTTP CONNECT proxy (audit RA 1): an upstream's `proxy` key, or the
//! environment's `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` as curl and the SDKs read them. The
//! proxy here reads the CONNECT head, answers it, and on 200 splices to the target on
//! 127.0.0.1. Tests that set the environment run the gateway as a process of its own: the
//! environment is the whole test binary's.

use std::sync::Mutex;

use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct ConnectProxy {
    addr: SocketAddr,
    /// The CONNECT heads it read, in order.
    heads: Arc<Mutex<Vec<String>>>,
}

impl ConnectProxy {
    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// A CONNECT proxy that answers every CONNECT with `answer` (a status line and headers,
/// without the blank line; none when empty), and splices a 2xx tunnel to the target's port on 127.0.0.1.
async fn connect_proxy(answer: &'static str) -> ConnectProxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = heads.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    match client.read_u8().await {
                        Ok(b) => head.push(b),
                        Err(_) => return,
                    }
                }
                let head = String::from_utf8(head).unwrap();
                let target = head.split(' ').nth(1).unwrap().to_owned();
                seen.lock().unwrap().push(head);
                if answer.is_empty() {
                    // Holds the CONNECT unanswered.
                    let _ = client.read_u8().await;
                    return;
                }
                let reply = format!("{answer}\r\n\r\n");
                client.write_all(reply.as_bytes()).await.unwrap();
                if !answer.starts_with("HTTP/1.1 200") {
                    return;
                }
                let port = target.rsplit_once(':').unwrap().1;
                // A target nothing listens on (a test of a tunnel closed after its 200):
                // the client's end is dropped, as a proxy whose dial failed late drops it.
                let Ok(mut upstream) = TcpStream::connect(format!("127.0.0.1:{port}")).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    ConnectProxy { addr, heads }
}

/// TLS to the provider runs inside the tunnel (the certificate checked for its host, ALPN
/// choosing h2), and the proxy URL's userinfo is sent as Basic `Proxy-Authorization`.
#[tokio::test]
async fn an_https_upstream_is_reached_over_http2_through_its_connect_proxy() {
    let tls = tls_fake(&[b"h2", b"http/1.1"]).await;
    let proxy = connect_proxy("HTTP/1.1 200 Connection established").await;
    let url = format!("https://localhost:{}", tls.relay.port());
    let keys = format!("proxy = \"http://user:p%40ss@{}\"\n", proxy.addr);
    let gw = server::start(config_with(&url, Some(&tls.ca_pem), &keys))
        .await
        .unwrap();
    let (status, body) = chat(gw.addr).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    assert_eq!(tls.fake.requests()[0].version, Version::HTTP_2);
    let heads = proxy.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    let target = format!("localhost:{}", tls.relay.port());
    assert!(
        heads[0].starts_with(&format!("CONNECT {target} HTTP/1.1\r\n")),
        "{}",
        heads[0]
    );
    // base64("user:p@ss"): the userinfo percent-decoded.
    assert!(
        heads[0].contains("Proxy-Authorization: Basic dXNlcjpwQHNz\r\n"),
        "{}",
        heads[0]
    );
}

/// A proxy that refuses the tunnel fails the connect with its name and status, not a "dns
/// error", and the failure is held against the upstream (`eject_after = 1` ejects it).
#[tokio::test]
async fn a_proxy_refusing_connect_is_a_502_that_names_it() {
    let proxy =
        connect_proxy("HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic")
            .await;
    let keys = format!(
        "eject_after = 1\nproxy = \"http://user:secret@{}\"\n",
        proxy.addr
    );
    let gw = server::start(config_with("https://localhost:9", None, &keys))
        .await
        .unwrap();
    let (_, message) = unavailable(gw.addr).await;
    let shown = format!("http://user:***@{}", proxy.addr);
    assert!(message.contains(&shown), "{message}");
    assert!(message.contains("407"), "{message}");
    assert!(!message.contains("secret"), "{message}");
    assert!(!message.contains("dns error"), "{message}");
    assert_eq!(proxy.heads().len(), 1);
    // Audit QC 6: `/upstreams` shows the upstream's proxy, masked.
    let view: serde_json::Value =
        serde_json::from_str(&admin_get(gw.admin_addr, "/upstreams").await).unwrap();
    assert_eq!(view["upstreams"][0]["proxy"], shown.as_str(), "{view}");
    assert!(!view.to_string().contains("secret"), "{view}");
    assert_eq!(
        metric(
            gw.admin_addr,
            "hourglass_upstream_ejected{upstream=\"fake\"}"
        )
        .await,
        1.0
    );
}

/// `connect_timeout` covers the tunnel's setup: a proxy that never answers CONNECT is a
/// connect timeout, not a request left waiting for its first token.
#[tokio::test]
async fn a_proxy_that_never_answers_connect_is_a_connect_timeout() {
    let proxy = connect_proxy("").await;
    let keys = format!("proxy = \"http://{}\"\n", proxy.addr);
    let gw = server::start(config_with("https://localhost:9", None, &keys))
        .await
        .unwrap();
    let (resp, _c) = Conn::open(gw.addr)
        .await
        .send(chat_request(&[], true))
        .await;
    assert_eq!(resp.status(), 504);
    let v = json_body(resp).await;
    assert_eq!(v["error"]["code"], "connect_timeout", "{v}");
    // Audit QC 6: the proxy is named, not taken for the upstream.
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("egress proxy http://{}", proxy.addr)),
        "{message}"
    );
    assert_eq!(proxy.heads().len(), 1);
}

/// The gateway as a process with `env` set, its upstream the fake provider over plain HTTP
/// named `host` (`keys` added to its table). A chat stream's status, what the proxy saw, and
/// what the process logged. (`fake.test` resolves nowhere: only the proxy reaches it.)
async fn through_env(
    env: &[(&str, &str)],
    host: &str,
    keys: &str,
) -> (http::StatusCode, Vec<String>, String) {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let proxy = connect_proxy("HTTP/1.1 200 Connection established").await;
    let proxy_url = format!("http://{}", proxy.addr);
    let env: Vec<(&str, &str)> = env
        .iter()
        .map(|&(k, v)| {
            (
                k,
                if v == "{PROXY}" {
                    proxy_url.as_str()
                } else {
                    v
                },
            )
        })
        .collect();
    let url = format!("http://{host}:{}", fake.addr().port());
    let toml = BASE
        .replace("{FAKE}", &url)
        .replace("auth = \"bearer\"", &format!("auth = \"bearer\"\n{keys}"));
    let gw = Process::spawn(&toml, &[], &env).await;
    let (status, _) = chat(gw.addr).await;
    let (out, err) = gw.stop().await;
    (status, proxy.heads(), format!("{out}{err}"))
}

/// The environment's proxy is used as curl uses it (`http_proxy` for an http:// upstream),
/// and start-up says which upstream goes through it.
#[tokio::test]
async fn the_environments_proxy_is_honoured() {
    let (status, heads, log) = through_env(&[("http_proxy", "{PROXY}")], "fake.test", "").await;
    assert_eq!(status, 200, "{log}");
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(heads[0].starts_with("CONNECT fake.test:"), "{}", heads[0]);
    assert!(log.contains("egress proxy"), "{log}");
}

/// `NO_PROXY`, `proxy = "none"` and a loopback upstream go straight to the upstream.
#[tokio::test]
async fn no_proxy_proxy_none_and_loopback_go_direct() {
    let (_, heads, _) = through_env(
        &[
            ("HTTP_PROXY", "{PROXY}"),
            ("NO_PROXY", "example.com, .test"),
        ],
        "fake.test",
        "",
    )
    .await;
    assert_eq!(heads, Vec::<String>::new());
    let (_, heads, log) = through_env(
        &[("HTTP_PROXY", "{PROXY}")],
        "fake.test",
        "proxy = \"none\"\n",
    )
    .await;
    assert_eq!(heads, Vec::<String>::new());
    assert!(!log.contains("egress proxy"), "{log}");
    let (status, heads, _) = through_env(&[("ALL_PROXY", "{PROXY}")], "127.0.0.1", "").await;
    assert_eq!(status, 200);
    assert_eq!(heads, Vec::<String>::new());
}

/// Audit QC 6: a proxy that grants the tunnel and then closes it (here: the upstream behind
/// it refuses) fails the TLS handshake inside the tunnel; the message names the proxy.
#[tokio::test]
async fn a_tunnel_closed_after_200_names_the_proxy() {
    let proxy = connect_proxy("HTTP/1.1 200 Connection established").await;
    let keys = format!("proxy = \"http://{}\"\n", proxy.addr);
    let gw = server::start(config_with("https://localhost:9", None, &keys))
        .await
        .unwrap();
    let (_, message) = unavailable(gw.addr).await;
    assert!(
        message.contains(&format!("through the egress proxy http://{}", proxy.addr)),
        "{message}"
    );
}
