//! The floor of the stack the guide mandates: the leanest reverse proxy hyper 1 and hyper-util
//! make, with none of Hourglass (no budget, watchdog, inspector, metrics, log line, routing).
//! Measured beside the gateways, it shows which part of a gap to nginx and haproxy is
//! Hourglass's own and which part any proxy built on hyper pays.
//!
//! The harness starts it by running its own binary again with `--bare-proxy MODE`, pinned to
//! the gateway core like the others. Two ways to reach the upstream:
//! - `pool`: hyper-util's legacy pooled client, as Hourglass uses it (the upstream connection
//!   runs in its own task; body chunks cross a channel to the client connection's task).
//! - `conn`: one `hyper::client::conn::http1` connection per client connection, driven in the
//!   client connection's own task (no pool, no second task: the least hyper can do).
//! - `h2`: HTTP/2 on both sides: h2c from the clients (`hyper::server::conn::http2`) and the
//!   pooled client with `http2_only` to the upstream, which puts every stream on one
//!   connection (the `bare-hyper-h2h2` target).
//!
//! `pool` and `conn` serve HTTP/1.1 only (`hyper::server::conn::http1`). All have TCP_NODELAY
//! on both sides and a current-thread runtime, and no time limits (they sit out the `limits`
//! scenario).

use std::net::SocketAddr;
use std::sync::Arc;

use http::uri::{PathAndQuery, Uri};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Pool,
    Conn,
    H2,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub fn run(mode: Mode, listen: SocketAddr, upstream: SocketAddr) -> Result<(), BoxError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind(listen).await?;
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        let client: Client<_, Incoming> = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .http2_only(mode == Mode::H2)
            .build(http);
        let authority: Arc<str> = upstream.to_string().into();
        loop {
            let (sock, _) = listener.accept().await?;
            let _ = sock.set_nodelay(true);
            match mode {
                Mode::Pool => {
                    tokio::spawn(serve_pooled(sock, client.clone(), authority.clone(), false));
                }
                Mode::Conn => {
                    tokio::spawn(serve_one_to_one(sock, upstream));
                }
                Mode::H2 => {
                    tokio::spawn(serve_pooled(sock, client.clone(), authority.clone(), true));
                }
            }
        }
    })
}

fn upstream_uri(authority: &str, req: &Request<Incoming>) -> Uri {
    let path = req.uri().path_and_query().map_or("/", PathAndQuery::as_str);
    Uri::builder()
        .scheme("http")
        .authority(authority)
        .path_and_query(path)
        .build()
        .expect("a socket address and a parsed path make a URI")
}

/// One client connection to the pooled client: HTTP/1.1, or h2c with prior knowledge (`h2`).
async fn serve_pooled(
    sock: TcpStream,
    client: Client<HttpConnector, Incoming>,
    auth: Arc<str>,
    h2: bool,
) {
    let svc = service_fn(move |mut req: Request<Incoming>| {
        let client = client.clone();
        let uri = upstream_uri(&auth, &req);
        *req.uri_mut() = uri;
        async move {
            let resp: Response<Incoming> = client.request(req).await?;
            Ok::<_, hyper_util::client::legacy::Error>(resp)
        }
    });
    let io = TokioIo::new(sock);
    let _ = if h2 {
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .serve_connection(io, svc)
            .await
    } else {
        hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .serve_connection(io, svc)
            .await
    };
}

async fn serve_one_to_one(sock: TcpStream, upstream: SocketAddr) {
    let Ok(up) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = up.set_nodelay(true);
    let Ok((sender, up_conn)) = hyper::client::conn::http1::handshake(TokioIo::new(up)).await
    else {
        return;
    };
    // HTTP/1 serves one request at a time, so the lock is never contended; it only lets the
    // service (an `Fn`) reach the one `SendRequest`, and is held until the request is queued.
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let svc = service_fn(move |req: Request<Incoming>| {
        let sender = sender.clone();
        async move {
            let sent = {
                let mut s = sender.lock().await;
                s.ready().await?;
                // The returned future borrows nothing: the lock ends here, before the wait.
                s.send_request(req)
            };
            sent.await
        }
    });
    let server = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(sock), svc);
    tokio::pin!(server);
    // Both connections in this one task; the upstream one is dropped (closed) with it when the
    // client's ends, which is what cancels an abandoned stream.
    tokio::select! {
        _ = &mut server => {}
        _ = up_conn => { let _ = server.await; }
    }
}
