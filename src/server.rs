//! Listeners, connection tasks and shutdown. The client listener speaks HTTP/1.1 and HTTP/2
//! (prior knowledge) on one port; the admin listener serves metrics and health.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, Health};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::proxy::Gateway;
use crate::upstream::UpstreamBuildError;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Upstream(#[from] UpstreamBuildError),
}

/// A started gateway: its bound addresses and the handle that stops it.
pub struct Running {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    /// Stops accepting, drains connections for up to `shutdown_grace`, then returns.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }

    /// Serves until `signal` completes, then shuts down gracefully.
    pub async fn serve_until(self, signal: impl Future<Output = ()>) {
        signal.await;
        tracing::info!("shutting down");
        self.shutdown().await;
    }
}

/// Binds both listeners and starts serving in the background.
pub async fn start(config: Config) -> Result<Running, ServerError> {
    let config = Arc::new(config);
    let metrics = Arc::new(Metrics::new());
    let gateway = Arc::new(Gateway::new(config.clone(), &metrics)?);
    let health = Arc::new(Health::default());
    let bind = |addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })
    };
    let listener = bind(config.server.listen).await?;
    let admin = bind(config.server.admin_listen).await?;
    let addr = local(&listener);
    let admin_addr = local(&admin);
    let shutdown = CancellationToken::new();

    // The admin listener outlives the client one, so /readyz reports the drain.
    let admin_task = tokio::spawn(serve_admin(admin, metrics.clone(), health.clone()));
    let task = {
        let (health, shutdown) = (health.clone(), shutdown.clone());
        tokio::spawn(async move {
            serve_clients(listener, gateway, config, health, shutdown).await;
            admin_task.abort();
        })
    };
    health.set_ready(true);
    tracing::info!(%addr, %admin_addr, "hourglass listening");
    Ok(Running {
        addr,
        admin_addr,
        metrics,
        health,
        shutdown,
        task,
    })
}

fn local(l: &TcpListener) -> SocketAddr {
    l.local_addr().expect("a bound listener has an address")
}

fn tune(stream: &TcpStream) {
    // Tokens are small writes that must leave at once; keep-alive finds peers that vanished
    // without a FIN, which the idle watchdog would otherwise be the only one to notice.
    let _ = stream.set_nodelay(true);
    let ka = TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(10));
    let _ = SockRef::from(stream).set_tcp_keepalive(&ka);
}

async fn serve_clients(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    config: Arc<Config>,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.server.header_read_timeout)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    let slots = config
        .server
        .max_connections
        .map(|n| Arc::new(Semaphore::new(n)));
    loop {
        let permit = match &slots {
            Some(s) => tokio::select! {
                p = s.clone().acquire_owned() => Some(p.expect("semaphore is never closed")),
                () = shutdown.cancelled() => break,
            },
            None => None,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        tune(&stream);
        let gw = gateway.clone();
        let svc = service_fn(move |req| {
            let gw = gw.clone();
            async move { Ok::<_, Infallible>(gw.handle(req).await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "client connection ended with an error");
            }
            drop(permit);
        });
    }
    health.set_ready(false);
    drop(listener);
    let grace = config.server.shutdown_grace;
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all connections drained"),
        () = tokio::time::sleep(grace) => tracing::warn!(?grace, "shutdown grace elapsed with connections still open"),
    }
}

async fn serve_admin(listener: TcpListener, metrics: Arc<Metrics>, health: Arc<Health>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (metrics, health) = (metrics.clone(), health.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req| admin::handle(req, metrics.clone(), health.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
