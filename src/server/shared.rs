//! What the accept loop, the connections and reloads share, and how starting or reloading
//! fails.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::stream::signal::Signal;
use arc_swap::{ArcSwap, ArcSwapOption};
use tokio_rustls::TlsAcceptor;

use crate::config::{ConfigError, ServerConfig};
use crate::gateway::Gateway;
use crate::server::admin::Health;
use crate::server::tls::TlsError;
use crate::telemetry::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Build(#[from] crate::gateway::BuildError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("no config file to reload from")]
    NoSource,
}

/// What the accept loop, the connections and reloads share.
pub(super) struct Shared {
    pub(super) gateway: ArcSwap<Gateway>,
    pub(super) tls: ArcSwapOption<TlsAcceptor>,
    pub(super) server: ArcSwap<ServerConfig>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) health: Arc<Health>,
    /// Fired when in-flight requests must end (shutdown grace over).
    pub(super) cut: Signal,
    /// The file reloads read; `None` for configs built in memory.
    pub(super) source: Option<PathBuf>,
    pub(super) reloading: tokio::sync::Mutex<()>,
}
