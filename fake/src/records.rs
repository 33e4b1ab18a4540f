//! What the fake remembers of every connection and request, and the state its parts share.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Version};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::Replay;

/// One accepted TCP connection.
#[derive(Clone, Debug)]
pub struct ConnectionRecord {
    /// Sequential id, starting at 0; [`RequestRecord::conn_id`] refers to it.
    pub id: u64,
    /// The client's address.
    pub peer: SocketAddr,
    /// When the connection was accepted.
    pub opened_at: Instant,
    /// When the fake noticed the peer was gone (EOF or error on the socket, or the connection
    /// task ending); `None` while open.
    pub closed_at: Option<Instant>,
}

/// One request, recorded once its body has been read.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    /// The [`ConnectionRecord::id`] it arrived on.
    pub conn_id: u64,
    /// When the service started handling it.
    pub at: Instant,
    /// Request method.
    pub method: Method,
    /// Path and query.
    pub path: String,
    /// Request headers as received.
    pub headers: HeaderMap,
    /// The full request body.
    pub body: Bytes,
    /// HTTP version of the request.
    pub version: Version,
    /// When the response ended: its body finished, failed on purpose, or was dropped early (the
    /// peer went away or reset the stream while the head or body was pending).
    pub finished_at: Option<Instant>,
    /// True only if the response body ran to its normal end.
    pub completed: bool,
}

#[derive(Default)]
pub(crate) struct Records {
    pub(crate) connections: Vec<ConnectionRecord>,
    pub(crate) requests: Vec<RequestRecord>,
}

/// State shared by the handle, the accept loop, connections and response bodies.
pub(crate) struct Shared {
    pub(crate) records: Mutex<Records>,
    /// Bumped after every change so `wait_*` can sleep instead of polling.
    pub(crate) changed: watch::Sender<()>,
    pub(crate) next_reply_id: AtomicU64,
    /// Script headers this instance applies when a request does not carry them itself, so
    /// that two fakes behind one gateway can behave differently for the same request.
    pub(crate) script_defaults: Mutex<HeaderMap>,
    pub(crate) replay: Mutex<Option<Replay>>,
    /// Whether connections and requests are remembered: for the tests and benchmarks that
    /// read them, never for the `fake-upstream` command or the demo, which would otherwise
    /// keep every request (about 7 KB each) for as long as they run.
    pub(crate) recording: bool,
    /// The id of the next connection when none is recorded.
    pub(crate) next_conn_id: AtomicU64,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Records> {
        // A panic elsewhere must not hide the records from the test that wants to report it.
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn update<R>(&self, change: impl FnOnce(&mut Records) -> R) -> R {
        let result = change(&mut self.lock());
        self.changed.send_replace(());
        result
    }

    pub(crate) fn connection_closed(&self, id: u64) {
        let now = Instant::now();
        self.update(|records| {
            let record = usize::try_from(id)
                .ok()
                .and_then(|i| records.connections.get_mut(i));
            if let Some(record) = record.filter(|c| c.closed_at.is_none()) {
                record.closed_at = Some(now);
            }
        });
    }

    /// Waits until `check` yields a value, re-checking after every change.
    pub(crate) async fn wait_until<T>(
        &self,
        timeout: Duration,
        mut check: impl FnMut(&Records) -> Option<T>,
    ) -> Option<T> {
        let deadline = Instant::now() + timeout;
        // Subscribing before checking means no change between the two can be missed.
        let mut changes = self.changed.subscribe();
        loop {
            let found = check(&self.lock());
            if found.is_some() {
                return found;
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return check(&self.lock());
            }
        }
    }
}

/// Marks a request finished exactly once: explicitly, or as abandoned when dropped first (which
/// is how a dropped service future or response body shows up).
pub(crate) struct Finisher {
    pub(crate) shared: Arc<Shared>,
    pub(crate) index: usize,
    pub(crate) done: bool,
}

impl Finisher {
    pub(crate) fn finish(&mut self, completed: bool) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let now = Instant::now();
        self.shared.update(|records| {
            if let Some(request) = records.requests.get_mut(self.index) {
                request.finished_at = Some(now);
                request.completed = completed;
            }
        });
    }
}

impl Drop for Finisher {
    fn drop(&mut self) {
        self.finish(false);
    }
}
