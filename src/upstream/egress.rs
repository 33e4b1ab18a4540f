//! The first hop of a connection: TCP straight to the upstream, or to its egress proxy and
//! through an HTTP CONNECT tunnel to the upstream (`proxy`, or the environment's
//! `HTTPS_PROXY` and the rest: `config::EgressProxy`). TLS to the provider, SNI and ALPN
//! included, then runs inside the tunnel (`hyper_rustls` wraps this connector), and the
//! connect bound (`connect.rs`) covers the tunnel's setup too.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::ProxyTarget;
use crate::error::BoxError;
use crate::upstream::resolve::SharedResolver;

/// The most of a proxy's answer to CONNECT read before its end (as hyper-util's `Tunnel`).
const MAX_PROXY_HEAD: usize = 8 * 1024;

/// The egress proxy answered CONNECT with another status than 2xx: 407 (it wants
/// credentials, or refused the ones in the proxy URL), 403 (its policy), 502 (it could not
/// reach the upstream). The attempt failed to connect, and says which proxy refused.
#[derive(Debug, thiserror::Error)]
#[error("the egress proxy {proxy} refused the CONNECT tunnel: {status}")]
pub struct ProxyRefused {
    pub proxy: String,
    pub status: http::StatusCode,
}

/// The egress proxy could not be reached, or ended the tunnel's setup.
#[derive(Debug, thiserror::Error)]
#[error("the egress proxy {proxy}: {why}")]
pub struct ProxyFailed {
    pub proxy: String,
    pub why: String,
    #[source]
    pub source: Option<BoxError>,
}

#[derive(Clone)]
pub struct EgressConnector {
    pub(super) tcp: HttpConnector<SharedResolver>,
    pub(super) proxy: Option<Arc<ProxyTarget>>,
}

impl tower_service::Service<Uri> for EgressConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.tcp.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let Some(proxy) = self.proxy.clone() else {
            let fut = self.tcp.call(dst);
            return Box::pin(async move { fut.await.map_err(Into::into) });
        };
        let fut = self.tcp.call(proxy.uri.clone());
        Box::pin(async move {
            let failed = |why: &str, source: Option<BoxError>| -> BoxError {
                Box::new(ProxyFailed {
                    proxy: proxy.shown.clone(),
                    why: why.to_owned(),
                    source,
                })
            };
            let io = fut
                .await
                .map_err(|e| failed("could not connect", Some(e.into())))?;
            let mut tcp = io.into_inner();
            let host = dst.host().ok_or_else(|| failed("no upstream host", None))?;
            let port = dst.port_u16().unwrap_or(match dst.scheme_str() {
                Some("https") => 443,
                _ => 80,
            });
            tunnel(&mut tcp, host, port, &proxy)
                .await
                .map_err(|e| match e {
                    Tunnel::Refused(status) => Box::new(ProxyRefused {
                        proxy: proxy.shown.clone(),
                        status,
                    }) as BoxError,
                    Tunnel::Io(e) => failed("the CONNECT tunnel's setup failed", Some(e.into())),
                    Tunnel::Bad(why) => failed(why, None),
                })?;
            Ok(TokioIo::new(tcp))
        })
    }
}

enum Tunnel {
    Refused(http::StatusCode),
    Io(std::io::Error),
    Bad(&'static str),
}

/// Asks the proxy for a tunnel to `host:port` and reads its answer's head; on 2xx the
/// connection is the tunnel. hyper-util's `Tunnel` does the same but tells no status but
/// 407 apart, and an operator needs to know a 403 from a 502.
async fn tunnel(
    tcp: &mut TcpStream,
    host: &str,
    port: u16,
    proxy: &ProxyTarget,
) -> Result<(), Tunnel> {
    // An IPv6 host keeps its brackets from the URI (`[::1]:443`), as CONNECT wants it.
    let mut head = format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n");
    if let Some(auth) = &proxy.auth {
        head.push_str("Proxy-Authorization: ");
        head.push_str(auth.to_str().map_err(|_| Tunnel::Bad("bad credentials"))?);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes()).await.map_err(Tunnel::Io)?;
    // Read byte-wise up to the head's end: the provider's TLS follows at once, and a byte
    // read past the head would be lost to it. (One small head per connection.)
    let mut got = Vec::with_capacity(256);
    while !got.ends_with(b"\r\n\r\n") {
        if got.len() >= MAX_PROXY_HEAD {
            return Err(Tunnel::Bad("its answer to CONNECT has no end"));
        }
        let b = tcp.read_u8().await.map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                Tunnel::Bad("it closed the connection before answering CONNECT")
            }
            _ => Tunnel::Io(e),
        })?;
        got.push(b);
    }
    let status =
        connect_status(&got).ok_or(Tunnel::Bad("its answer to CONNECT is not HTTP/1.x"))?;
    if status.is_success() {
        Ok(())
    } else {
        Err(Tunnel::Refused(status))
    }
}

/// The status of a proxy's answer to CONNECT: `HTTP/1.0` or `HTTP/1.1`, SP, three digits,
/// then SP (a reason) or the line's end (RFC 9112 4). Read strictly: a line that only
/// starts like one (`HTTP/1.1 2000 OK`) is not a 200, and the tunnel fails naming the proxy.
fn connect_status(head: &[u8]) -> Option<http::StatusCode> {
    let rest = head
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| head.strip_prefix(b"HTTP/1.0 "))?;
    let (code, after) = rest.split_at_checked(3)?;
    if !code.iter().all(u8::is_ascii_digit)
        || !(after.starts_with(b" ") || after.starts_with(b"\r\n"))
    {
        return None;
    }
    http::StatusCode::from_bytes(code).ok()
}

#[cfg(test)]
mod tests {
    use super::connect_status;

    /// Audit QC 5: the status line is `HTTP/1.x SP 3DIGIT SP reason CRLF` (RFC 9112 4);
    /// `HTTP/1.1 2000 OK` is not a 200.
    #[test]
    fn a_connect_status_line_is_read_strictly() {
        for (head, status) in [
            (
                &b"HTTP/1.1 200 Connection established\r\n\r\n"[..],
                Some(200),
            ),
            (b"HTTP/1.0 200 OK\r\n\r\n", Some(200)),
            (b"HTTP/1.1 200\r\n\r\n", Some(200)),
            (
                b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n",
                Some(407),
            ),
            (b"HTTP/1.1 2000 OK\r\n\r\n", None),
            (b"HTTP/1.1 200OK\r\n\r\n", None),
            (b"HTTP/1.9 200 OK\r\n\r\n", None),
            (b"HTTP/1.1  200 OK\r\n\r\n", None),
            (b"HTTP/1.1 20 OK\r\n\r\n", None),
        ] {
            assert_eq!(
                connect_status(head).map(|s| s.as_u16()),
                status,
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
    }
}
