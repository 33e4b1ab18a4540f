//! Reloading the configuration: on SIGHUP, when the file changes, or on request. A reload
//! builds a new routing table (reusing the upstreams whose settings did not change) and swaps
//! it in atomically; on any error the running config stays.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use crate::config::{file, scrub, Config};
use crate::error::Starved;
use crate::gateway::Gateway;
use crate::server::running::Running;
use crate::server::shared::{ServerError, Shared};

impl Running {
    /// Re-reads the config file and swaps it in. On any error the running config stays.
    pub async fn reload(&self) -> Result<String, ServerError> {
        reload(&self.shared, &Cause::Requested, None).await
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
    /// every `poll`. A change is reloaded once two ticks in a row read it alike: a file
    /// written in place (`cp`, an editor, `cat >`) is caught half written by a tick, and
    /// what one tick sees of it is not what the operator meant. A tick that cannot read the
    /// files for want of descriptors or memory is no change: it is warned of and tried again;
    /// one that cannot read a file for good (no permission) reloads, to fail visibly. SIGHUP
    /// reloads at once. A config that is no regular file (a pipe, read once at start-up) is
    /// not watched, and a SIGHUP says it cannot be read again. Runs until shutdown.
    pub fn watch_config(&self, poll: Duration) {
        self.watch_config_from(poll, Hangups::register(), None);
    }

    /// [`Running::watch_config`] with SIGHUP taken over earlier (`hangups`: one that came
    /// since is reloaded at once) and the files as start-up read them (`baseline`): a change
    /// made while the gateway started is then reloaded at the first ticks (audit IB 3: a
    /// baseline read after start-up took it for applied). Without one, the files are read
    /// now.
    pub fn watch_config_from(&self, poll: Duration, hangups: Hangups, baseline: Option<Baseline>) {
        let shared = self.shared.clone();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut hangup = hangups.0;
            let path = shared.source.clone();
            let mut watch = Watch::default();
            if let Some(path) = &path {
                let regular = match &baseline {
                    Some(b) => b.regular,
                    None => file::is_regular(path),
                };
                if !regular {
                    // Audit ME 4: read again, a pipe (`--config <(envsubst < t.toml)`) is
                    // empty, or waits for a writer; each tick was a failed reload, and
                    // `/readyz` said so for good. It is read once, and not watched.
                    let file = scrub(&path.display().to_string());
                    tracing::info!(
                        config = %file,
                        "the config is not a regular file (a pipe, read once at start-up): it \
                         is not watched, and SIGHUP cannot read it again; restart to change it"
                    );
                    loop {
                        tokio::select! {
                            () = stop.fired() => return,
                            () = next_hangup(&mut hangup) => tracing::warn!(
                                config = %file,
                                "SIGHUP: the config is not a regular file (a pipe, read once at \
                                 start-up) and cannot be read again; the running config stays. \
                                 To change it, restart the gateway, or give --config a file"
                            ),
                        }
                    }
                }
                watch.applied = match baseline {
                    Some(b) => b.source,
                    None => read_source(path, file::read).await.ok(),
                };
            }
            let mut tick = tokio::time::interval(poll);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let by_signal = tokio::select! {
                    () = stop.fired() => return,
                    () = next_hangup(&mut hangup) => true,
                    _ = tick.tick() => false,
                };
                let Some(path) = &path else {
                    if by_signal {
                        let _ = reload(&shared, &Cause::Signal, None).await;
                    }
                    continue;
                };
                if !by_signal && certificate_due(&shared) {
                    let text = watch
                        .applied
                        .as_ref()
                        .filter(|s| s.error.is_none())
                        .map(|s| s.text.clone());
                    let _ = reload(&shared, &Cause::CertificateDue, text).await;
                    continue;
                }
                let read = read_source(path, file::read).await;
                if by_signal {
                    // Asked for now: what the file holds now is what the operator meant.
                    let text = read.ok().and_then(|now| watch.took(now));
                    let _ = reload(&shared, &Cause::Signal, text).await;
                    continue;
                }
                match read {
                    Ok(now) => {
                        if let Some(changed) = watch.saw(now, path) {
                            // An unreadable file is read by the reload, which says why.
                            let text = watch
                                .applied
                                .as_ref()
                                .filter(|s| s.error.is_none())
                                .map(|s| s.text.clone());
                            let _ = reload(&shared, &Cause::Changed(changed), text).await;
                        }
                    }
                    Err(e) => {
                        if watch.failed() {
                            let file = scrub(&e.path.display().to_string());
                            tracing::warn!(
                                file = %file,
                                error = %e.error,
                                "cannot read a file of the config to watch it (out of \
                                 descriptors or memory); the running config stays and the file \
                                 is read again next tick (warned once until it reads)"
                            );
                        }
                    }
                }
            }
        });
    }
}

/// Whether the time came to try again a certificate a reload held back for its dates (taken
/// once: a reload that holds it back again sets the next time).
fn certificate_due(shared: &Shared) -> bool {
    let mut due = shared
        .tls_due
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    due.take_if(|at| *at <= std::time::SystemTime::now())
        .is_some()
}

/// What the watcher knows from one tick to the next.
#[derive(Debug, Default)]
struct Watch {
    /// What the last reload was built from (or what the first tick read): a change is a
    /// difference from it.
    applied: Option<Source>,
    /// The tick before's read. A change is reloaded only when it matches: a file still being
    /// written differs from one tick to the next.
    last: Option<Source>,
    /// Reads are failing: warned of once per streak.
    failing: bool,
}

impl Watch {
    /// A tick read `now`: the files that changed when it is to be reloaded (then it is
    /// `applied`), `None` while nothing changed or the change is not yet settled.
    fn saw(&mut self, now: Source, path: &Path) -> Option<Vec<PathBuf>> {
        self.failing = false;
        if self.applied.as_ref() == Some(&now) || self.last.as_ref() != Some(&now) {
            self.last = Some(now);
            return None;
        }
        let changed = changes(self.applied.as_ref(), Some(&now), Some(path));
        self.applied = Some(now.clone());
        self.last = Some(now);
        Some(changed)
    }

    /// A reload asked for (SIGHUP) builds `now` whatever the ticks saw: its text.
    fn took(&mut self, now: Source) -> Option<Vec<u8>> {
        self.failing = false;
        let text = now.error.is_none().then(|| now.text.clone());
        self.applied = Some(now);
        self.last = self.applied.clone();
        text
    }

    /// A tick could not read: whether this starts a streak (the one to warn of).
    fn failed(&mut self) -> bool {
        !std::mem::replace(&mut self.failing, true)
    }
}

/// SIGHUP taken over from its default action, which ends the process. Registered before
/// the listeners bind (audit IB 1: a reloader or `systemctl reload` signalling the moment
/// the gateway was ready killed it); a signal that comes before the watcher first waits is
/// kept, and reloads then.
pub struct Hangups(Hangup);

impl Hangups {
    pub fn register() -> Hangups {
        Hangups(hangup_stream())
    }

    /// The next SIGHUP (never, where there are none to watch).
    pub async fn next(&mut self) {
        next_hangup(&mut self.0).await;
    }
}

/// The config file and the files it names as start-up read them: what the watcher compares
/// its first ticks with.
pub struct Baseline {
    source: Option<Source>,
    /// Whether the config was a regular file, which the watcher can read again; else a pipe,
    /// read once (audit ME 4).
    regular: bool,
}

impl Baseline {
    /// Reads `path` and the files its text names. A read that failed for want of
    /// descriptors or memory holds nothing: the watcher then reads its own baseline. A
    /// config that is a pipe is read (once) and waited for, as `Config::load` does.
    pub async fn read(path: &Path) -> Baseline {
        Baseline {
            regular: file::is_regular(path),
            source: read_source(path, file::read_config).await.ok(),
        }
    }

    /// The config's bytes, to build start-up from; `None` when the file could not be read
    /// (`Config::load` then says why).
    pub fn text(&self) -> Option<&[u8]> {
        self.source
            .as_ref()
            .filter(|s| s.error.is_none())
            .map(|s| &s.text[..])
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
    /// The time came when a certificate held back for its dates may be taken.
    CertificateDue,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Signal => f.write_str("SIGHUP"),
            Self::Requested => f.write_str("requested"),
            Self::CertificateDue => {
                f.write_str("the certificate a reload held back for its dates may be taken now")
            }
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
#[derive(Debug, Clone, PartialEq)]
struct Source {
    text: Vec<u8>,
    files: Vec<(PathBuf, Option<u64>)>,
    /// The config file could not be read, for good (no permission, a directory in its
    /// place): a state too, which a reload reads itself to fail with.
    error: Option<String>,
}

/// The files that differ between two ticks: the config file (`path`) when its bytes do, then
/// each file named at both whose contents differ. A file named at one tick alone is the
/// config file's change, not its own: nothing was read from it before, or nothing will be.
fn changes(before: Option<&Source>, now: Option<&Source>, path: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if before.map(|s| (&s.text, &s.error)) != now.map(|s| (&s.text, &s.error)) {
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

/// A tick's read that failed for want of descriptors or memory: it says nothing of what the
/// file holds.
#[derive(Debug)]
struct Unreadable {
    path: PathBuf,
    error: std::io::Error,
}

/// What the watcher compares from one tick to the next: the config file's bytes and a hash
/// of each file its text names (a config refused for what a key file holds is tried again
/// when that file is fixed). From the text alone: the running config names the same files
/// as its text (a test holds the two lists together), and a list that also took the running
/// config's would change when a reload swaps it, setting off a second reload for nothing.
/// Hashed: some files hold keys, which the watcher need not keep. A file that is not there
/// or cannot be read (no permission) is a state of its own (a key file removed, or left
/// readable by root alone by a rotation): the reload it sets off fails where it can be seen
/// (the error count, `/readyz`), where taking it for no state would keep every later edit
/// from being applied, unsaid. Only a failure that says nothing of the file (the process
/// out of descriptors, the host out of memory) is none. Every file is read as start-up and a
/// reload read it ([`file::read`]: `read` for the config), so no read waits (a FIFO) or is
/// unbounded (a device): SIGHUP shares the watcher's loop (audit ME 2). What such a file is
/// is a state of its own too, which the reload fails with.
async fn read_source(
    path: &Path,
    read: fn(&Path) -> std::io::Result<Vec<u8>>,
) -> Result<Source, Unreadable> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let owned = path.to_path_buf();
    let text = match blocking(move || read(&owned)).await {
        Ok(text) => text,
        Err(error) if passing(&error) => {
            return Err(Unreadable {
                path: path.to_path_buf(),
                error,
            })
        }
        Err(error) => {
            return Ok(Source {
                text: Vec::new(),
                files: Vec::new(),
                error: Some(error.to_string()),
            })
        }
    };
    // From the bytes just read: a second read could see another version of the file.
    let mut files = {
        let text = String::from_utf8_lossy(&text).into_owned();
        let (dir, _) = crate::config::base_dir(path);
        tokio::task::spawn_blocking(move || Config::files_named(&text, dir.as_deref()))
            .await
            .unwrap_or_default()
    };
    files.sort_unstable();
    files.dedup();
    let mut hashes = Vec::with_capacity(files.len());
    for f in files {
        let named = f.clone();
        let hash = match blocking(move || file::read(&named)).await {
            Ok(bytes) => {
                let mut h = DefaultHasher::new();
                bytes.hash(&mut h);
                Some(h.finish())
            }
            Err(error) if passing(&error) => return Err(Unreadable { path: f, error }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            // Its error as its contents: the reload reads the file and says why it failed.
            Err(e) => {
                let mut h = DefaultHasher::new();
                ("unreadable", e.to_string()).hash(&mut h);
                Some(h.finish())
            }
        };
        hashes.push((f, hash));
    }
    Ok(Source {
        text,
        files: hashes,
        error: None,
    })
}

/// A read that failed for want of descriptors or memory ([`Starved`]): it passes, and says
/// nothing of the file.
fn passing(e: &std::io::Error) -> bool {
    Starved::of(e).is_some()
}

/// Runs `f` where blocking is allowed: a reload reads the config and every file it names
/// (keys, certificates, CAs), which may sit on a slow volume, and must not stall the
/// runtime's threads while it does.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// Builds from `text` when the watcher read the file already (its bytes, not a second
/// read's), else reads the file.
async fn reload(
    shared: &Arc<Shared>,
    cause: &Cause,
    text: Option<Vec<u8>>,
) -> Result<String, ServerError> {
    let _guard = shared.reloading.lock().await;
    let Some(path) = shared.source.clone() else {
        return Err(ServerError::NoSource);
    };
    let building = shared.clone();
    let why = cause.to_string();
    let result = blocking(move || {
        match text {
            Some(bytes) => Config::from_file_bytes(&path, bytes),
            // A regular file only: a FIFO swapped in is refused, not waited on.
            None => Config::reread(&path),
        }
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
    // A file start-up would refuse is no reload either (audit IB 4: a `[runs]` that could
    // never start was taken with a warning, and the outage came at the next restart).
    if let Some(w) = config
        .warnings()
        .into_iter()
        .find(|w| Config::stops_start_up(w))
    {
        return Err(ServerError::WouldNotStart(w));
    }
    let old = shared.gateway.load_full();
    let mut warnings: Vec<String> = shared
        .at_start
        .changed_by(&config.server)
        .into_iter()
        .chain(old.runs().config().restart_needed_for(&config.runs))
        .collect();
    let mut held = None;
    let (tls, expires, validity, crls_due, crls) = match &config.server.tls {
        Some(t) => {
            let served = shared.tls.load_full();
            let serving = *shared
                .tls_validity
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // A certificate outside its dates is held back alone: the rest applies.
            let (loaded, h) =
                crate::server::tls::reload_acceptor(t, served.as_deref().zip(serving))?;
            warnings.extend(h.as_ref().map(|h| h.reason.clone()));
            held = h;
            warnings.extend(loaded.warnings);
            if let Some(path) = &t.client_crl {
                let served = shared.crls.lock().unwrap_or_else(PoisonError::into_inner);
                warnings.extend(served.rolled_back(&loaded.crls, path));
            }
            (
                Some(loaded.acceptor),
                loaded.expires,
                Some(loaded.validity),
                loaded.crls_due,
                loaded.crls,
            )
        }
        None => (None, None, None, Vec::new(), Vec::new()),
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
    // A certificate held back is tried again when it may be taken (the watcher reloads).
    *shared
        .tls_due
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = held.as_ref().and_then(|h| h.due);
    *shared
        .tls_validity
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = validity;
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
    shared
        .metrics
        .tls_certificate_pending(held.as_ref().map(|h| (h.state, h.due)));
    shared
        .health
        .set_certificate(super::running::config_cert(&shared.server.load()).zip(validity));
    // The reload applied: a certificate held back is said as pending, not as a failure.
    shared.health.set_detail(match &held {
        Some(h) => format!("config {fingerprint}; certificate pending: {}", h.reason),
        None => format!("config {fingerprint}"),
    });
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
            error: None,
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

    /// Audit K1: a file written in two parts across ticks is reloaded whole, once; the half
    /// the first tick read is never applied, although it is a valid config of its own.
    #[tokio::test]
    async fn a_file_written_in_two_parts_is_reloaded_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hourglass.toml");
        let whole = "[upstreams.a]\nurl = \"http://127.0.0.1:9\"\nauth = \"none\"\n\n\
                     [[routes]]\nname = \"a\"\npath_prefix = \"/a\"\nupstream = \"a\"\n\n\
                     [[routes]]\nname = \"b\"\npath_prefix = \"/b\"\nupstream = \"a\"\n";
        let half = &whole[..whole.rfind("\n[[routes]]").unwrap()];
        Config::from_toml(half, "half.toml").expect("the half is valid on its own");
        std::fs::write(&path, "").unwrap();
        let mut watch = Watch {
            applied: Some(read_source(&path, file::read).await.unwrap()),
            ..Watch::default()
        };
        let mut reloads = Vec::new();
        // One write per tick, then ticks with the file left alone.
        for write in [Some(half), Some(whole), None, None, None] {
            if let Some(text) = write {
                std::fs::write(&path, text).unwrap();
            }
            if let Some(changed) = watch.saw(read_source(&path, file::read).await.unwrap(), &path) {
                assert_eq!(changed, std::slice::from_ref(&path));
                reloads.push(watch.applied.as_ref().unwrap().text.clone());
            }
        }
        assert_eq!(reloads, [whole.as_bytes().to_vec()]);
        let config = Config::from_file_bytes(&path, reloads.remove(0)).unwrap();
        assert_eq!(config.routes.len(), 2);
    }

    /// Audit K1: `cp` truncates the file and then writes it; a tick between the two reads
    /// an empty file, which is not reloaded (it failed for naming no upstream), and the file
    /// written back as it was is no change at all.
    #[test]
    fn a_file_truncated_then_written_back_is_no_reload() {
        let path = Path::new("conf/hourglass.toml");
        let key = [("conf/key", Some(0))];
        let mut watch = Watch {
            applied: Some(source("a", &key)),
            ..Watch::default()
        };
        assert_eq!(watch.saw(source("", &[]), path), None);
        assert_eq!(watch.saw(source("a", &key), path), None);
        assert_eq!(watch.saw(source("a", &key), path), None);
        // A key file rotated is a change like the config's own, once it has settled.
        let rotated = [("conf/key", Some(1))];
        assert_eq!(watch.saw(source("a", &rotated), path), None);
        assert_eq!(
            watch.saw(source("a", &rotated), path),
            Some(vec![PathBuf::from("conf/key")])
        );
        assert_eq!(watch.saw(source("a", &rotated), path), None);
    }

    /// Audit M2: a tick that cannot read the file (out of descriptors) is no change: warned
    /// of once per streak, then the file read back as it was is no reload either.
    #[test]
    fn a_failed_read_is_no_change_and_is_warned_once_per_streak() {
        let path = Path::new("conf/hourglass.toml");
        let mut watch = Watch {
            applied: Some(source("a", &[])),
            ..Watch::default()
        };
        assert!(watch.failed(), "the first failure is warned of");
        assert!(!watch.failed(), "and not the next");
        assert_eq!(watch.saw(source("a", &[]), path), None);
        assert_eq!(watch.saw(source("a", &[]), path), None);
        assert!(watch.failed(), "a new streak is warned of again");
        // A change is reloaded once two reads see it alike, a failed one between them or not.
        assert_eq!(watch.saw(source("b", &[]), path), None);
        assert!(watch.failed());
        assert_eq!(
            watch.saw(source("b", &[]), path),
            Some(vec![path.to_path_buf()])
        );
    }

    /// Audit M2: what makes a tick's read fail is told apart from a named file's absence.
    #[tokio::test]
    async fn a_file_that_cannot_be_read_is_a_state_and_a_passing_failure_is_none() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        // A directory in the file's place: a state, which the reload reads to fail with.
        let read = read_source(&dir, file::read).await.unwrap();
        assert!(read.error.is_some() && read.text.is_empty());
        let path = dir.join("hourglass.toml");
        std::fs::write(&path, "[upstreams.a]\napi_key_file = \"gone.key\"\n").unwrap();
        let gone = read_source(&path, file::read).await.unwrap();
        assert_eq!(gone.files, [(dir.join("gone.key"), None)]);
        std::fs::create_dir_all(dir.join("gone.key")).unwrap();
        let unreadable = read_source(&path, file::read).await.unwrap();
        assert!(matches!(unreadable.files[..], [(_, Some(_))]));
        assert_eq!(
            changes(Some(&gone), Some(&unreadable), Some(&path)),
            [dir.join("gone.key")]
        );
        // Out of descriptors (EMFILE, ENFILE) or memory says nothing of the file.
        for errno in [24, 23, 12] {
            assert!(
                passing(&std::io::Error::from_raw_os_error(errno)),
                "{errno}"
            );
        }
        for errno in [13, 21, 2] {
            assert!(
                !passing(&std::io::Error::from_raw_os_error(errno)),
                "{errno}"
            );
        }
    }
}
