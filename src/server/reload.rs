//! Reloading the configuration: on SIGHUP, when the file changes, or on request. A reload
//! builds a new routing table (reusing the upstreams whose settings did not change) and swaps
//! it in atomically; on any error the running config stays.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{scrub, Config};
use crate::gateway::Gateway;
use crate::server::running::Running;
use crate::server::shared::{ServerError, Shared};

impl Running {
    /// Re-reads the config file and swaps it in. On any error the running config stays.
    pub async fn reload(&self) -> Result<String, ServerError> {
        reload(&self.shared).await
    }

    /// Swaps in a config built in memory (tests, embedders).
    pub async fn apply(&self, config: Config) -> Result<String, ServerError> {
        let _guard = self.shared.reloading.lock().await;
        let shared = self.shared.clone();
        blocking(move || apply(&shared, config)).await
    }

    /// Reloads on SIGHUP and whenever the config file's contents change, or those of a file
    /// it names (`Config::files` of the running config, and `Config::files_named` of the
    /// file's text, which a refused config names too: certificates, key files), checked
    /// every `poll`. Runs until shutdown.
    pub fn watch_config(&self, poll: Duration) {
        let shared = self.shared.clone();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut hangup = hangup_stream();
            let mut seen = read_source(&shared).await;
            let mut tick = tokio::time::interval(poll);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let by_signal = tokio::select! {
                    () = stop.fired() => return,
                    () = next_hangup(&mut hangup) => true,
                    _ = tick.tick() => false,
                };
                let now = read_source(&shared).await;
                if by_signal || now != seen {
                    seen = now;
                    let _ = reload(&shared).await;
                }
            }
        });
    }
}

#[cfg(unix)]
type Hangup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangup = Option<()>;

fn hangup_stream() -> Hangup {
    #[cfg(unix)]
    {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok()
    }
    #[cfg(not(unix))]
    {
        None
    }
}

async fn next_hangup(h: &mut Hangup) {
    #[cfg(unix)]
    if let Some(s) = h {
        s.recv().await;
        return;
    }
    let _ = h;
    std::future::pending::<()>().await;
}

/// What the watcher compares from one tick to the next: the config file's bytes and a hash
/// of each file the running config names, and each the file's text names (a config refused
/// for what a key file holds is tried again when that file is fixed). Hashed: some hold
/// keys, which the watcher need not keep. A file that cannot be read counts as a state of
/// its own.
async fn read_source(shared: &Shared) -> Option<(Vec<u8>, Vec<Option<u64>>)> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let path = shared.source.clone()?;
    let text = tokio::fs::read(&path).await.ok()?;
    let mut files: Vec<std::path::PathBuf> = shared
        .gateway
        .load()
        .config()
        .files()
        .into_iter()
        .map(Into::into)
        .collect();
    // From the bytes just read: a second read could see another version of the file.
    let named = {
        let text = String::from_utf8_lossy(&text).into_owned();
        tokio::task::spawn_blocking(move || Config::files_named(&text, path.parent()))
            .await
            .unwrap_or_default()
    };
    files.extend(named);
    files.sort_unstable();
    files.dedup();
    let mut hashes = Vec::with_capacity(files.len());
    for f in files {
        hashes.push(tokio::fs::read(&f).await.ok().map(|bytes| {
            let mut h = DefaultHasher::new();
            bytes.hash(&mut h);
            h.finish()
        }));
    }
    Some((text, hashes))
}

/// Runs `f` where blocking is allowed: a reload reads the config and every file it names
/// (keys, certificates, CAs), which may sit on a slow volume, and must not stall the
/// runtime's threads while it does.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

pub(super) async fn reload(shared: &Arc<Shared>) -> Result<String, ServerError> {
    let _guard = shared.reloading.lock().await;
    let Some(path) = shared.source.clone() else {
        return Err(ServerError::NoSource);
    };
    let building = shared.clone();
    let result = blocking(move || {
        Config::load(&path)
            .map_err(ServerError::from)
            .and_then(|c| apply(&building, c))
    })
    .await;
    if let Err(e) = &result {
        shared.metrics.reload(false);
        let serving = shared.gateway.load().config().fingerprint.clone();
        // Scrubbed here as well as where the config is parsed: the errors of building the
        // gateway (a key file, a CA file, a variable that is not set) quote what the file
        // named, which may be a key pasted into the wrong field.
        let e = scrub(&e.to_string());
        shared
            .health
            .set_detail(format!("config {serving}; last reload failed: {e}"));
        tracing::error!(error = %e, serving = %serving, "config reload failed; the running config stays");
    }
    result
}

pub(super) fn apply(shared: &Shared, config: Config) -> Result<String, ServerError> {
    let old = shared.gateway.load_full();
    if let Some(warning) = shared.at_start.changed_by(&config.server) {
        tracing::warn!("{warning}");
    }
    let (tls, expires, crls_due) = match &config.server.tls {
        Some(t) => {
            let loaded = crate::server::tls::acceptor(t)?;
            (Some(loaded.acceptor), loaded.expires, loaded.crls_due)
        }
        None => (None, None, Vec::new()),
    };
    let fingerprint = config.fingerprint.clone();
    let server = Arc::new(config.server.clone());
    let gateway = Gateway::new(
        Arc::new(config),
        &shared.metrics,
        Some(&old),
        shared.cut.clone(),
    )?;
    for w in gateway.config().warnings() {
        tracing::warn!("{w}");
    }
    shared.gateway.store(Arc::new(gateway));
    shared.gateway.load().took_over(&old);
    shared.tls.store(tls);
    shared.metrics.tls_certificate_expires(expires);
    shared.metrics.tls_crls_due(&crls_due);
    shared.server.store(server);
    shared.metrics.reload(true);
    shared.metrics.config_loaded(&fingerprint);
    shared.health.set_detail(format!("config {fingerprint}"));
    tracing::info!(config = %fingerprint, "config reloaded");
    Ok(fingerprint)
}
