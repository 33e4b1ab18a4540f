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
    #[error("cannot listen on {addr} (server.{key}): {source}")]
    Bind {
        addr: SocketAddr,
        /// `listen` or `admin_listen`: the two may overlap (`0.0.0.0:P` and `127.0.0.1:P`).
        key: &'static str,
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
    /// A reload to a file start-up would refuse (`Config::stops_start_up`).
    #[error("{0}")]
    WouldNotStart(String),
}

/// What the accept loop, the connections and reloads share.
pub(super) struct Shared {
    /// Shared with the admin listener, which shows the upstreams of the table being served.
    pub(super) gateway: Arc<ArcSwap<Gateway>>,
    pub(super) tls: ArcSwapOption<TlsAcceptor>,
    pub(super) server: ArcSwap<ServerConfig>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) health: Arc<Health>,
    /// Fired when in-flight requests must end (shutdown grace over).
    pub(super) cut: Signal,
    /// The file reloads read; `None` for configs built in memory.
    pub(super) source: Option<PathBuf>,
    pub(super) reloading: tokio::sync::Mutex<()>,
    /// The newest client CRLs served, which a reload's must not be older than unwarned.
    pub(super) crls: std::sync::Mutex<crate::server::tls::ServedCrls>,
    /// When the served TLS certificate is valid (`None` without TLS): a reload's outside
    /// its dates does not replace one inside them.
    pub(super) tls_validity: std::sync::Mutex<Option<crate::server::tls::Validity>>,
    /// When a certificate a reload held back for its dates is to be tried again: when it
    /// becomes valid, or the one served runs out (the watcher reloads then).
    pub(super) tls_due: std::sync::Mutex<Option<std::time::SystemTime>>,
    /// What only a restart changes, as the process started with it.
    pub(super) at_start: AtStart,
}

/// The settings read once, when the client listener starts: the addresses bound and the
/// connection slots made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AtStart {
    listen: SocketAddr,
    admin_listen: SocketAddr,
    max_connections: Option<usize>,
}

impl AtStart {
    pub(super) fn of(server: &ServerConfig) -> AtStart {
        AtStart {
            listen: server.listen,
            admin_listen: server.admin_listen,
            max_connections: server.max_connections,
        }
    }

    /// The warning for a reload whose `[server]` changes what only a restart does. Compared
    /// with what the process started with, not with the config last loaded: a reload back to
    /// the running values is no change, and a second reload of a changed value still is.
    pub(super) fn changed_by(&self, server: &ServerConfig) -> Option<String> {
        let new = AtStart::of(server);
        let mut changed = Vec::new();
        if new.listen != self.listen {
            changed.push(format!("listen ({} stays)", self.listen));
        }
        if new.admin_listen != self.admin_listen {
            changed.push(format!("admin_listen ({} stays)", self.admin_listen));
        }
        if new.max_connections != self.max_connections {
            let running = self
                .max_connections
                .map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
            changed.push(format!("max_connections ({running} stays)"));
        }
        (!changed.is_empty()).then(|| {
            let verb = if changed.len() == 1 { "takes" } else { "take" };
            format!(
                "server: {} {verb} effect only after a restart",
                changed.join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_differs_from_the_start_needs_a_restart() {
        let config = |text: &str| {
            crate::config::Config::from_toml(
                &format!(
                    "[server]\n{text}\n[upstreams.u]\nurl = \"http://127.0.0.1:9\"\n\
                     auth = \"none\"\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n\
                     upstream = \"u\"\n"
                ),
                "t.toml",
            )
            .expect("config")
            .server
        };
        let start = AtStart::of(&config("listen = \"127.0.0.1:8080\""));
        assert_eq!(
            start.changed_by(&config("listen = \"127.0.0.1:8080\"")),
            None
        );
        assert_eq!(
            start.changed_by(&config("listen = \"127.0.0.1:9000\"\nmax_connections = 2")),
            Some(
                "server: listen (127.0.0.1:8080 stays), max_connections (unlimited stays) take \
                 effect only after a restart"
                    .to_owned()
            )
        );
    }
}
