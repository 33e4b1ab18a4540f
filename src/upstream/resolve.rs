//! Name lookups for the upstreams' connectors: one lookup in flight per name, whatever the
//! number of connects waiting on it.
//!
//! hyper-util's `GaiResolver` runs each `getaddrinfo` on tokio's blocking pool, which the
//! whole process shares (512 threads). A connect that gives up at its bound leaves its lookup
//! running on its thread for the resolver's own timeout (glibc: 5 s, twice, per nameserver),
//! and each new request to a name that never connects starts one more: audit GG 1 saw one
//! upstream's hung DNS fill the pool, so the lookups of every other upstream, `/metrics`
//! and reloads all queued behind it, and the fallbacks meant for it timed out too. Sharing
//! the lookup in flight holds one thread per name at a time. Nothing is kept once it ends:
//! the next connect looks the name up again, so DNS changes are followed at once.
//!
//! A lookup is joined only while it is young ([`JOIN_WITHIN`]): one slow `getaddrinfo` (a
//! lost UDP query waits glibc's 5 s before its retry) would otherwise fail every connect to
//! the name until it ended, long after the nameserver answered again (audit HC 1: four
//! requests sent after DNS had recovered all got 504 and ejected the upstream). An older one
//! runs on for those who joined it, and the next connect starts another: a name whose
//! lookups all hang holds at most one thread per `JOIN_WITHIN` of the resolver's timeout
//! (about ten with glibc's defaults).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};
use tokio::sync::watch;
use tokio::time::Instant;

/// A lookup's outcome, as every waiter on it gets it (an `io::Error` cannot be cloned).
type Outcome = Result<Arc<Vec<SocketAddr>>, Failed>;

/// What of a failed lookup's `io::Error` a waiter needs: its OS error where it has one (an
/// `EMFILE` is the gateway's own want, `error::Starved`), else its kind and words.
#[derive(Clone)]
struct Failed {
    os: Option<i32>,
    kind: io::ErrorKind,
    words: Arc<str>,
}

impl Failed {
    fn of(e: &io::Error) -> Self {
        Self {
            os: e.raw_os_error(),
            kind: e.kind(),
            words: Arc::from(e.to_string()),
        }
    }

    fn error(&self) -> io::Error {
        match self.os {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(self.kind, self.words.to_string()),
        }
    }
}

/// Shares each name's lookup in flight between all who ask for it meanwhile.
#[derive(Clone)]
pub struct SharedResolver<R = GaiResolver> {
    inner: R,
    in_flight: Arc<InFlight>,
}

/// How long a lookup in flight is joined by the connects that want its name: a healthy one
/// ends in milliseconds.
const JOIN_WITHIN: Duration = Duration::from_secs(1);

/// Each name's youngest lookup in flight: when it started, and its answer to come.
type InFlight = Mutex<HashMap<Name, Lookup>>;

struct Lookup {
    started: Instant,
    answer: watch::Receiver<Option<Outcome>>,
}

impl SharedResolver {
    /// The one every upstream uses: upstreams of one provider (several keys, or the old and
    /// new upstream across a reload) share a host, and the blocking pool is the process's.
    pub fn process() -> Self {
        static PROCESS: LazyLock<SharedResolver> =
            LazyLock::new(|| SharedResolver::with(GaiResolver::new()));
        PROCESS.clone()
    }
}

impl<R> SharedResolver<R> {
    /// Over another resolver (the tests give it one whose lookups block).
    pub fn with(inner: R) -> Self {
        Self {
            inner,
            in_flight: Arc::default(),
        }
    }
}

impl<R> tower_service::Service<Name> for SharedResolver<R>
where
    R: tower_service::Service<Name> + Clone + Send + 'static,
    R::Response: Iterator<Item = SocketAddr>,
    R::Error: Into<io::Error>,
    R::Future: Send + 'static,
{
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Each lookup is started by `call` on a clone of the inner resolver, made ready there.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let mut waiting = {
            let mut in_flight = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            match in_flight.get(&name) {
                Some(lookup) if now.duration_since(lookup.started) < JOIN_WITHIN => {
                    lookup.answer.clone()
                }
                _ => {
                    let (tx, rx) = watch::channel(None);
                    let lookup = Lookup {
                        started: now,
                        answer: rx.clone(),
                    };
                    in_flight.insert(name.clone(), lookup);
                    // Its own task: the lookup runs to its end even when every connect
                    // waiting on it gave up, so that no second one starts meanwhile.
                    tokio::spawn(look_up(
                        self.inner.clone(),
                        name,
                        tx,
                        Arc::clone(&self.in_flight),
                    ));
                    rx
                }
            }
        };
        Box::pin(async move {
            let outcome = waiting
                .wait_for(Option::is_some)
                .await
                .map_err(|_| io::Error::other("the name lookup ended without an answer"))?
                .clone();
            match outcome {
                Some(Ok(addrs)) => Ok(Arc::unwrap_or_clone(addrs).into_iter()),
                Some(Err(failed)) => Err(failed.error()),
                None => Err(io::Error::other("the name lookup ended without an answer")),
            }
        })
    }
}

async fn look_up<R>(
    mut inner: R,
    name: Name,
    tx: watch::Sender<Option<Outcome>>,
    in_flight: Arc<InFlight>,
) where
    R: tower_service::Service<Name>,
    R::Response: Iterator<Item = SocketAddr>,
    R::Error: Into<io::Error>,
{
    // Leaves the map however this ends (a lookup that panicked must not leave its name
    // answered "no answer" for good).
    let leave = Leave {
        in_flight: &in_flight,
        name: &name,
        answer: &tx,
    };
    let outcome: Outcome =
        match std::future::poll_fn(|cx| inner.poll_ready(cx).map_err(Into::into)).await {
            Ok(()) => match inner.call(name.clone()).await {
                Ok(addrs) => Ok(Arc::new(addrs.collect())),
                Err(e) => Err(Failed::of(&e.into())),
            },
            Err(e) => Err(Failed::of(&e)),
        };
    drop(leave);
    // No receiver left is fine: every connect waiting on it gave up.
    let _ = tx.send(Some(outcome));
}

struct Leave<'a> {
    in_flight: &'a InFlight,
    name: &'a Name,
    /// Which lookup this is: a younger one of the same name may have taken its place.
    answer: &'a watch::Sender<Option<Outcome>>,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if in_flight
            .get(self.name)
            .is_some_and(|lookup| lookup.answer.same_channel(&self.answer.subscribe()))
        {
            in_flight.remove(self.name);
        }
    }
}

#[cfg(test)]
#[path = "resolve_tests.rs"]
mod tests;
