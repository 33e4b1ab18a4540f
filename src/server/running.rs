//! Starting the gateway: bind both listeners, build the first routing table, serve in the
//! background; and the handle that stops it.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use socket2::SockRef;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::gateway::Gateway;
use crate::server::admin::{Admin, Health, Scrape};
use crate::server::listen::{listener, local, serve_admin, serve_clients, tune, Spare};
use crate::server::shared::{AtStart, ServerError, Shared};
use crate::stream::signal::Signal;
use crate::telemetry::metrics::Metrics;

/// How long a shutdown waits at least, after the drain, for the run store's call ends (or
/// `shutdown_grace`, if shorter).
const SETTLE_AT_LEAST: std::time::Duration = std::time::Duration::from_secs(10);

/// A started gateway: its bound addresses and the handle that reloads and stops it.
pub struct Running {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub(super) shared: Arc<Shared>,
    pub(super) stop: Signal,
    /// The connections have drained: what is left is the wait for the run store.
    drained: Signal,
    /// Ends the wait for the run store at once.
    unsettle: Signal,
    task: JoinHandle<()>,
}

impl Running {
    /// Turns `/readyz` 503 and, after `drain_delay` (during which the client listener still
    /// accepts), stops accepting, lets in-flight requests finish for up to `shutdown_grace`, then cuts
    /// the rest (origin `shutdown`, each told with an error event or a 503); then waits for
    /// the run store's call ends still being sent (the rest of the grace, at least the grace
    /// or 10 s, whichever is shorter) and returns.
    pub async fn shutdown(self) {
        self.stop.fire();
        let _ = self.task.await;
    }

    /// Serves until a `signal()` completes, then shuts down gracefully; another `signal()`
    /// during `drain_delay` or the drain closes the listener and cuts what is still in flight
    /// at once, as the grace's end would, and
    /// one after the drain ends the wait for the run store at once (audit HA 4: it was
    /// ignored, and the process waited out the grace with nothing in flight).
    pub async fn serve_until<F: Future<Output = ()>>(self, mut signal: impl FnMut() -> F) {
        signal().await;
        tracing::info!("shutting down");
        let (cut, drained, unsettle) = (
            self.shared.cut.clone(),
            self.drained.clone(),
            self.unsettle.clone(),
        );
        let shutdown = self.shutdown();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                () = signal() => {
                    if drained.is_fired() {
                        tracing::warn!("another signal: ending the wait for the run store now");
                        unsettle.fire();
                    } else {
                        tracing::warn!("second signal: cutting the requests still in flight now");
                        cut.fire();
                    }
                }
            }
        }
    }
}

/// Binds both listeners and starts serving in the background. `source` is the file that
/// [`Running::reload`] re-reads.
pub async fn start_with_source(
    config: Config,
    source: Option<PathBuf>,
) -> Result<Running, ServerError> {
    let metrics = Arc::new(Metrics::new());
    let cut = Signal::new();
    let (tls, crls, tls_validity) = match &config.server.tls {
        Some(t) => {
            let loaded = crate::server::tls::acceptor(t)?;
            for w in &loaded.warnings {
                tracing::warn!("{w}");
            }
            metrics.tls_certificate_expires(loaded.expires);
            metrics.tls_crls_due(&loaded.crls_due);
            (Some(loaded.acceptor), loaded.crls, Some(loaded.validity))
        }
        None => (None, Vec::new(), None),
    };
    let fingerprint = config.fingerprint.clone();
    let server = Arc::new(config.server.clone());
    let gateway = Gateway::new(Arc::new(config), &metrics, None, cut.clone())?;
    let runs = gateway.runs().clone();
    let health = Arc::new(Health::default());
    let bind = |addr: SocketAddr, key: &'static str| {
        listener(addr).map_err(|source| ServerError::Bind { addr, key, source })
    };
    let listener = bind(server.listen, "listen")?;
    #[cfg(target_os = "linux")]
    tune(SockRef::from(&listener));
    let admin = bind(server.admin_listen, "admin_listen")?;
    // Before the client listener can take every descriptor.
    let spare = Spare::open();
    let addr = local(&listener);
    let admin_addr = local(&admin);
    metrics.config_loaded(&fingerprint);
    health.set_detail(format!("config {fingerprint}"));
    health.set_certificate(config_cert(&server).zip(tls_validity));
    let at_start = AtStart::of(&server);
    let shared = Arc::new(Shared {
        gateway: Arc::new(ArcSwap::from_pointee(gateway)),
        tls: ArcSwapOption::new(tls),
        server: ArcSwap::new(server),
        metrics: metrics.clone(),
        health: health.clone(),
        cut,
        source,
        reloading: tokio::sync::Mutex::new(()),
        crls: std::sync::Mutex::new(crate::server::tls::ServedCrls::new(crls)),
        tls_validity: std::sync::Mutex::new(tls_validity),
        tls_due: std::sync::Mutex::new(None),
        at_start,
    });
    let stop = Signal::new();
    let (drained, unsettle) = (Signal::new(), Signal::new());
    // The admin listener outlives the client one, so /readyz reports the drain.
    let admin_task = tokio::spawn(serve_admin(
        admin,
        Arc::new(Admin {
            metrics: metrics.clone(),
            health: health.clone(),
            runs: runs.clone(),
            gateway: shared.gateway.clone(),
            scrape: Scrape::default(),
        }),
        spare,
        shared.server.load_full(),
    ));
    let task = {
        let (shared, stop, runs) = (shared.clone(), stop.clone(), runs.clone());
        let (drained, unsettle) = (drained.clone(), unsettle.clone());
        tokio::spawn(async move {
            let left = serve_clients(listener, shared.clone(), stop).await;
            drained.fire();
            // The ends of the calls just drained are still on their way to a shared run
            // store: the rest of the grace to send them, and some time even when the drain
            // took all of it (calls cut at its end send theirs only then).
            let grace = shared.server.load().shutdown_grace;
            runs.settle(left.max(grace.min(SETTLE_AT_LEAST)), unsettle.fired())
                .await;
            admin_task.abort();
        })
    };
    health.set_ready(true);
    tracing::info!(%addr, %admin_addr, config = %fingerprint, "hourglass listening");
    Ok(Running {
        addr,
        admin_addr,
        metrics,
        health,
        shared,
        stop,
        drained,
        unsettle,
        task,
    })
}

/// [`start_with_source`] for a config that has no file to reload from.
pub async fn start(config: Config) -> Result<Running, ServerError> {
    start_with_source(config, None).await
}

/// The served certificate's file, as `/readyz` names it.
pub(super) fn config_cert(server: &crate::config::ServerConfig) -> Option<String> {
    let tls = server.tls.as_ref()?;
    Some(crate::config::scrub(&tls.cert.display().to_string()))
}
