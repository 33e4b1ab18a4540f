//! Reloading the configuration: on SIGHUP, when the file changes, or on request. A reload
//! builds a new routing table (reusing the upstreams whose settings did not change) and swaps
//! it in atomically; on any error the running config stays.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use crate::config::{scrub, Config};
use crate::gateway::Gateway;
use crate::server::running::Running;
use crate::server::shared::{ServerError, Shared};

impl Running {
    /// Re-reads the config file and swaps it in. On any error the running config stays.
    pub async fn reload(&self) -> Result<String, ServerError> {
        reload(&self.shared, &Cause::Requested).await
    }

    /// Swaps in a config built in memory (tests, embedders).
    pub async fn apply(&self, config: Config) -> Result<String, ServerError> {
        let _guard = self.shared.reloading.lock().await;
        let shared = self.shared.clone();
        blocking(move || apply(&shared, config, &Cause::Requested)).await
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
                let changed = changes(seen.as_ref(), now.as_ref(), shared.source.as_deref());
                if by_signal || !changed.is_empty() {
                    seen = now;
                    let cause = if by_signal {
                        Cause::Signal
                    } else {
                        Cause::Changed(changed)
                    };
                    let _ = reload(&shared, &cause).await;
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

/// What set a reload off, for its log line: an operator who renamed a CRL into place wants
/// to see that this reload is the one that read it.
#[derive(Debug)]
enum Cause {
    Signal,
    /// `Running::reload` or `Running::apply` (the admin listener, tests, embedders).
    Requested,
    /// The files whose contents changed (or came or went), the config file first.
    Changed(Vec<PathBuf>),
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Signal => f.write_str("SIGHUP"),
            Self::Requested => f.write_str("requested"),
            Self::Changed(files) => {
                f.write_str("changed: ")?;
                for (i, file) in files.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    // A key pasted where a path belongs is a file name here.
                    f.write_str(&scrub(&file.display().to_string()))?;
                }
                Ok(())
            }
        }
    }
}

/// The config file's bytes and a hash of each file it names, as one tick read them.
#[derive(Debug, PartialEq)]
struct Source {
    text: Vec<u8>,
    files: Vec<(PathBuf, Option<u64>)>,
}

/// The files that differ between two ticks: the config file (`path`) when its bytes do, then
/// each file named at both whose contents differ. A file named at one tick alone is the
/// config file's change, not its own: nothing was read from it before, or nothing will be.
fn changes(before: Option<&Source>, now: Option<&Source>, path: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if before.map(|s| &s.text) != now.map(|s| &s.text) {
        out.extend(path.map(Path::to_path_buf));
    }
    let a: &[_] = before.map_or(&[], |s| &s.files);
    let b: &[_] = now.map_or(&[], |s| &s.files);
    for (file, hash) in a {
        if b.iter().any(|(f, h)| f == file && h != hash) {
            out.push(file.clone());
        }
    }
    out
}

/// What the watcher compares from one tick to the next: the config file's bytes and a hash
/// of each file its text names (a config refused for what a key file holds is tried again
/// when that file is fixed). From the text alone: the running config names the same files
/// as its text (a test holds the two lists together), and a list that also took the running
/// config's would change when a reload swaps it, setting off a second reload for nothing.
/// Hashed: some files hold keys, which the watcher need not keep. A file that cannot be
/// read counts as a state of its own.
async fn read_source(shared: &Shared) -> Option<Source> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let path = shared.source.clone()?;
    let text = tokio::fs::read(&path).await.ok()?;
    // From the bytes just read: a second read could see another version of the file.
    let mut files = {
        let text = String::from_utf8_lossy(&text).into_owned();
        tokio::task::spawn_blocking(move || Config::files_named(&text, path.parent()))
            .await
            .unwrap_or_default()
    };
    files.sort_unstable();
    files.dedup();
    let mut hashes = Vec::with_capacity(files.len());
    for f in files {
        let hash = tokio::fs::read(&f).await.ok().map(|bytes| {
            let mut h = DefaultHasher::new();
            bytes.hash(&mut h);
            h.finish()
        });
        hashes.push((f, hash));
    }
    Some(Source {
        text,
        files: hashes,
    })
}

/// Runs `f` where blocking is allowed: a reload reads the config and every file it names
/// (keys, certificates, CAs), which may sit on a slow volume, and must not stall the
/// runtime's threads while it does.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

async fn reload(shared: &Arc<Shared>, cause: &Cause) -> Result<String, ServerError> {
    let _guard = shared.reloading.lock().await;
    let Some(path) = shared.source.clone() else {
        return Err(ServerError::NoSource);
    };
    let building = shared.clone();
    let why = cause.to_string();
    let result = blocking(move || {
        Config::load(&path)
            .map_err(ServerError::from)
            .and_then(|c| apply(&building, c, &why))
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
        tracing::error!(error = %e, serving = %serving, %cause, "config reload failed; the running config stays");
    }
    result
}

fn apply(shared: &Shared, config: Config, cause: &dyn fmt::Display) -> Result<String, ServerError> {
    let old = shared.gateway.load_full();
    let mut warnings: Vec<String> = shared
        .at_start
        .changed_by(&config.server)
        .into_iter()
        .chain(old.runs().config().restart_needed_for(&config.runs))
        .collect();
    let (tls, expires, crls_due, crls) = match &config.server.tls {
        Some(t) => {
            let loaded = crate::server::tls::acceptor(t)?;
            warnings.extend(loaded.warnings);
            if let Some(path) = &t.client_crl {
                let served = shared.crls.lock().unwrap_or_else(PoisonError::into_inner);
                warnings.extend(served.rolled_back(&loaded.crls, path));
            }
            (
                Some(loaded.acceptor),
                loaded.expires,
                loaded.crls_due,
                loaded.crls,
            )
        }
        None => (None, None, Vec::new(), Vec::new()),
    };
    let fingerprint = config.fingerprint.clone();
    let server = Arc::new(config.server.clone());
    let gateway = Gateway::new(
        Arc::new(config),
        &shared.metrics,
        Some(&old),
        shared.cut.clone(),
    )?;
    // Said only once the reload cannot fail: one that does changes nothing of what they say
    // (the listener stays as it is, the served CRL is not rolled back).
    warnings.extend(gateway.config().warnings());
    for w in &warnings {
        tracing::warn!("{w}");
    }
    shared.gateway.store(Arc::new(gateway));
    shared.gateway.load().took_over(&old);
    shared.tls.store(tls);
    shared
        .crls
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remember(crls);
    shared.metrics.tls_certificate_expires(expires);
    shared.metrics.tls_crls_due(&crls_due);
    shared.server.store(server);
    shared.metrics.reload(true);
    shared.metrics.config_loaded(&fingerprint);
    shared.health.set_detail(format!("config {fingerprint}"));
    tracing::info!(config = %fingerprint, %cause, "config reloaded");
    Ok(fingerprint)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(text: &str, files: &[(&str, Option<u64>)]) -> Source {
        Source {
            text: text.into(),
            files: files.iter().map(|(f, h)| (PathBuf::from(f), *h)).collect(),
        }
    }

    #[test]
    fn a_reload_names_the_files_that_changed() {
        let path = Some(Path::new("conf/hourglass.toml"));
        let before = source("a", &[("conf/ca.pem", Some(1)), ("conf/key", Some(2))]);
        let same = source("a", &[("conf/ca.pem", Some(1)), ("conf/key", Some(2))]);
        assert!(changes(Some(&before), Some(&same), path).is_empty());
        // A CA renamed into place; with the config's edit, a key file no longer named and a
        // CRL newly named, which are the edit's doing, not changes of their own.
        let after = source("b", &[("conf/ca.pem", Some(3)), ("conf/crl.pem", Some(4))]);
        let changed = changes(Some(&before), Some(&after), path);
        assert_eq!(
            Cause::Changed(changed).to_string(),
            "changed: conf/hourglass.toml, conf/ca.pem"
        );
        let rotated = source("a", &[("conf/ca.pem", Some(1)), ("conf/key", Some(5))]);
        assert_eq!(
            changes(Some(&before), Some(&rotated), path),
            [PathBuf::from("conf/key")]
        );
        // The config file unreadable, then back.
        assert_eq!(
            changes(None, Some(&before), path),
            [PathBuf::from("conf/hourglass.toml")]
        );
        // A key pasted where a file's path belongs is not repeated in the log.
        let pasted = Cause::Changed(vec![PathBuf::from(
            "conf/sk-proj-Q1w2E3r4T5y6U7i8O9p0AbCdEf",
        )]);
        assert!(!pasted.to_string().contains("Q1w2E3r4"), "{pasted}");
        assert_eq!(Cause::Signal.to_string(), "SIGHUP");
    }
}
