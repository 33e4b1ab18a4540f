//! The load generator's HTTP/2 client, for the targets that clients reach over HTTP/2 (h2c
//! with prior knowledge, many streams multiplexed on one connection): hyper's
//! `client::conn::http2`, one connection task per connection.
//!
//! Only the `memory` and `leave` scenarios use it (`Target::h2_clients`). The HTTP/1.1 client
//! (`client.rs`) stays the one that times chunks: hyper hands HTTP/2 DATA frames out one by
//! one, so which of them arrived in one `read()` (coalescing) cannot be seen here.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;

use bytes::Bytes;
use hourglass_fake::monotonic_ns;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use crate::client::{End, Step};

/// How many streams the harness opens on one client connection: like the gateways' upstream
/// side (Hourglass's `http2_max_streams_per_connection` default), and haproxy's default
/// `tune.h2.max-concurrent-streams`, so that no stream waits for a slot.
pub const STREAMS_PER_CONN: usize = 100;

pub type Sender = http2::SendRequest<Full<Bytes>>;

/// A response on its way: the request is on the wire as soon as the connection task takes it;
/// dropping this before the head arrives resets the stream (`RST_STREAM(CANCEL)`).
pub type Pending = Pin<Box<dyn Future<Output = hyper::Result<Response<Incoming>>> + Send>>;

/// Opens one h2c connection (prior knowledge) and spawns its connection task, which ends when
/// the last `Sender` clone and every stream on it are dropped.
pub async fn connect(addr: SocketAddr) -> io::Result<Sender> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let (sender, conn) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .handshake(TokioIo::new(tcp))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// `n` streams' worth of connections, `STREAMS_PER_CONN` streams each: stream `i` goes on
/// `conns[i / STREAMS_PER_CONN]`.
pub async fn connect_many(addr: SocketAddr, streams: usize) -> io::Result<Vec<Sender>> {
    let mut conns = Vec::new();
    for _ in 0..streams.div_ceil(STREAMS_PER_CONN) {
        conns.push(connect(addr).await?);
    }
    Ok(conns)
}

/// One POST with a JSON body (the same headers as `client::request`).
pub fn request(
    host: SocketAddr,
    path: &str,
    headers: &[(&str, String)],
    body: &str,
) -> Request<Full<Bytes>> {
    let mut b =
        Request::post(format!("http://{host}{path}")).header("content-type", "application/json");
    for (name, value) in headers.iter().chain(&crate::peers::extra_headers(host)) {
        b = b.header(*name, value.as_str());
    }
    b.body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .expect("static names and ASCII values make a request")
}

/// Sends `req` on `sender` (waiting for a stream slot if the peer's limit is reached).
pub async fn send(sender: &mut Sender, req: Request<Full<Bytes>>) -> io::Result<Pending> {
    sender.ready().await.map_err(io::Error::other)?;
    Ok(Box::pin(sender.send_request(req)))
}

/// A response body read frame by frame, with the steps of `client::BodyReader`.
pub struct BodyReader {
    body: Incoming,
    done: bool,
}

impl BodyReader {
    pub fn new(body: Incoming) -> BodyReader {
        BodyReader { body, done: false }
    }

    /// Waits for the next frame and appends its data to `out`; a reset or a failed connection
    /// is a truncated end.
    pub async fn step(&mut self, out: &mut Vec<u8>) -> io::Result<Step> {
        if self.done {
            return Ok(Step::End {
                end: End::Clean,
                recv_ns: monotonic_ns(),
            });
        }
        loop {
            let frame = self.body.frame().await;
            let recv_ns = monotonic_ns();
            match frame {
                None => {
                    self.done = true;
                    return Ok(Step::End {
                        end: End::Clean,
                        recv_ns,
                    });
                }
                Some(Err(_)) => {
                    self.done = true;
                    return Ok(Step::End {
                        end: End::Truncated,
                        recv_ns,
                    });
                }
                Some(Ok(frame)) => {
                    // Trailers carry nothing the harness counts.
                    if let Ok(data) = frame.into_data() {
                        out.extend_from_slice(&data);
                        return Ok(Step::Data { recv_ns });
                    }
                }
            }
        }
    }
}

/// One request to its end on a fresh connection; the status and body length (the warm-up).
pub async fn plain_request(
    addr: SocketAddr,
    req: Request<Full<Bytes>>,
) -> io::Result<(u16, usize)> {
    let mut sender = connect(addr).await?;
    let resp = send(&mut sender, req)
        .await?
        .await
        .map_err(io::Error::other)?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(io::Error::other)?
        .to_bytes();
    Ok((status, body.len()))
}
