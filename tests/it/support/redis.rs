//! A real Redis for the tests (Debian's `redis-server`, which `.ci/run` installs): started on
//! a free loopback port with persistence off, stopped by its PID.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Whether this test must be skipped for want of `redis-server`: on a machine without it, the
/// Redis cases say so on stderr and pass, so that `cargo test` works on a fresh checkout;
/// with `HOURGLASS_REQUIRE_REDIS=1` (as `.ci/run` sets) its absence fails them instead.
pub fn skip() -> bool {
    static INSTALLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let installed = *INSTALLED.get_or_init(|| {
        let installed = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !installed && !required() {
            // Past the test harness's capture, once: a skipped case must not pass unseen.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: the Redis run store cases (redis-server is not installed: apt-get install redis-server)"
            );
        }
        installed
    });
    if installed {
        return false;
    }
    assert!(
        !required(),
        "redis-server is not installed (apt-get install redis-server) and HOURGLASS_REQUIRE_REDIS is set"
    );
    true
}

pub struct RedisServer {
    child: Option<Child>,
    pub addr: SocketAddr,
}

fn free_port() -> u16 {
    // Bound and dropped at once; redis-server takes it a moment later.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

impl RedisServer {
    pub async fn start() -> RedisServer {
        Self::on(free_port()).await
    }

    /// On `port`: to start again where one was stopped.
    pub async fn on(port: u16) -> RedisServer {
        Self::with_args(port, &[]).await
    }

    /// With a password clients must give (`requirepass`).
    pub async fn with_password(password: &str) -> RedisServer {
        Self::with_args(free_port(), &["--requirepass", password]).await
    }

    /// A node of a Redis Cluster (`cluster-enabled`), its node file in `dir`, holding no slot
    /// until it is given some.
    pub async fn cluster_node(dir: &std::path::Path) -> RedisServer {
        let port = free_port();
        let nodes = dir.join(format!("nodes-{port}.conf"));
        Self::with_args(
            port,
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                nodes.to_str().unwrap(),
            ],
        )
        .await
    }

    /// One that also listens with TLS, its certificate (for `localhost` and 127.0.0.1) signed
    /// by a private CA: the server, the CA's PEM file (in `dir`) and the TLS port. Plain TCP
    /// stays open on `addr` for `query`.
    pub async fn with_tls(dir: &std::path::Path) -> (RedisServer, std::path::PathBuf, u16) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "hourglass test redis CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        let [ca_file, cert_file, key_file] =
            ["ca.pem", "redis.pem", "redis.key"].map(|f| dir.join(f));
        std::fs::write(&ca_file, ca.pem()).unwrap();
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        let tls_port = free_port();
        let server = Self::with_args(
            free_port(),
            &[
                "--tls-port",
                &tls_port.to_string(),
                "--tls-cert-file",
                cert_file.to_str().unwrap(),
                "--tls-key-file",
                key_file.to_str().unwrap(),
                "--tls-ca-cert-file",
                ca_file.to_str().unwrap(),
                "--tls-auth-clients",
                "no",
            ],
        )
        .await;
        (server, ca_file, tls_port)
    }

    async fn with_args(port: u16, extra: &[&str]) -> RedisServer {
        let child = Command::new("redis-server")
            .args(extra)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (apt-get install redis-server; .ci/run does)");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let server = RedisServer {
            child: Some(child),
            addr,
        };
        for _ in 0..200 {
            if server.ping().await {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("redis-server on {addr} did not answer PING");
    }

    pub fn url(&self) -> String {
        format!("redis://{}/0", self.addr)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    async fn ping(&self) -> bool {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(mut s) = tokio::net::TcpStream::connect(self.addr).await else {
            return false;
        };
        if s.write_all(b"PING\r\n").await.is_err() {
            return false;
        }
        // +PONG, or -NOAUTH from one with a password: up either way.
        let mut buf = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(1), s.read_exact(&mut buf)).await,
            Ok(Ok(_))
        ) && (buf[0] == b'+' || buf[0] == b'-')
    }

    /// Freezes it (SIGSTOP): connections stay open, commands wait unanswered, as in a long
    /// fork or a stalled host.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws it (SIGCONT): it runs what waited.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// One command, in Redis's inline form; its reply's first line.
    pub async fn query(&self, command: &str) -> String {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        s.write_all(format!("{command}\r\n").as_bytes())
            .await
            .unwrap();
        let mut line = String::new();
        tokio::io::BufReader::new(s)
            .read_line(&mut line)
            .await
            .unwrap();
        line.trim_end().to_owned()
    }

    /// One command given with `password` (`AUTH` first, on the same connection): the reply's
    /// first line.
    pub async fn query_as(&self, password: &str, command: &str) -> String {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        s.write_all(format!("AUTH {password}\r\n{command}\r\n").as_bytes())
            .await
            .unwrap();
        let mut lines = tokio::io::BufReader::new(s).lines();
        let auth = lines.next_line().await.unwrap().unwrap_or_default();
        assert_eq!(auth, "+OK", "AUTH {password}");
        lines.next_line().await.unwrap().unwrap_or_default()
    }

    /// Stops it (SIGKILL, by PID) and waits until it is gone.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `HOURGLASS_REQUIRE_REDIS` set to anything but empty or `0` (`=0` used to require it too).
fn required() -> bool {
    std::env::var("HOURGLASS_REQUIRE_REDIS").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A TCP proxy on a free loopback port to `target` that holds every read `delay` before it
/// passes it on, each direction on its own (a store far away, or queued behind others):
/// its address, and the task to abort to close it.
pub async fn delaying_proxy(
    target: SocketAddr,
    delay: Duration,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut pumps = tokio::task::JoinSet::new();
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(target).await else {
                continue;
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            pumps.spawn(delayed(client_read, server_write, delay));
            pumps.spawn(delayed(server_read, client_write, delay));
        }
    });
    (addr, task)
}

/// Copies `from` to `to`, each read written `delay` after it came, in order.
async fn delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            if tx
                .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    };
    tokio::join!(reader, writer);
}
