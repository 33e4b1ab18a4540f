//! Spreading an upstream's HTTP/2 streams over more than one connection.
//!
//! hyper-util's legacy `Client` keeps one HTTP/2 connection per host and, past the server's
//! `SETTINGS_MAX_CONCURRENT_STREAMS`, queues new streams on it (hyper#2197, #3623: by RFC 9113
//! 9.1 it never opens a second); it exposes no stream counts either. So the pool counts for
//! itself: it holds *lanes*, each a `Client` of its own (and so, for HTTP/2, one connection of
//! its own) with the number of streams in flight on it. A request takes the first lane with
//! room, or a new lane when all are full (up to `http2_max_connections`; past it the least
//! loaded). A lane's room is `http2_max_streams_per_connection`, or the server's own
//! `SETTINGS_MAX_CONCURRENT_STREAMS` when its connection announced less (read in `io.rs`):
//! hyper would queue the streams past it on the connection, where a GOAWAY loses them. The count is held by a [`StreamSlot`] that the attempt keeps in the response
//! body, so a stream counts until its body is dropped, which is also when hyper resets it.
//!
//! Lanes are kept while they work: a lane nobody uses holds no connection once
//! `pool_idle_timeout` has passed, and since the first lane with room always wins, load
//! gathers on the first lanes and the later ones go idle. Their number is bounded by the
//! peak concurrency divided by the streams per connection.
//!
//! A lane whose HTTP/2 connection took a request and gave no answer head within the route's
//! whole first-token limit is *retired* ([`StreamSlot::retire`]): on a multiplexed
//! connection, a peer that went silent (a dropped flow, a hung front end) would otherwise take
//! every new stream and time each out, until hyper's keep-alive ping gives up on it. A
//! retired lane takes no new streams, and its connection closes once the streams still on it
//! end (the last one's slot drops the lane's client, whose pool holds the connection, and
//! with it the connection; left to `pool_idle_timeout`, a retired first lane replaced while
//! the new one had room stayed open for it); until then it counts against `http2_max_connections`, so a fresh lane replaces it
//! only below that cap, or when no other lane can take streams (then the cap is passed by
//! the connections still draining). A slow but healthy connection costs one new connection a
//! first-token timeout at most.
//!
//! A stream that got its head and then fell silent is watched by its body's limits instead
//! ([`ConnectionWatch`]): when a limit cuts it (idle, first token, deadline), its connection
//! is retired if it read nothing at all, from any stream, for the route's whole idle limit
//! (audit RA 5: a stream cut by `idle_timeout` left its silent connection in service, and
//! the next request waited out its first-token limit there). A connection whose other
//! streams still get frames, or whose provider sends this stream keep-alives while it is
//! slow, stays; so does one whose provider answered hyper's keep-alive PING (sent after 30 s
//! without a frame) within an idle limit longer than that. A provider silent on its only
//! stream for a shorter idle limit cannot be told from a dead peer: its connection goes, for
//! the price of a new one. The lane's HTTP/2 connection stamps each read (`io::LastRead`),
//! so the question costs the streams nothing until a limit fires.
//!
//! An upstream that cannot speak HTTP/2 (`http2 = "never"`, or `auto` over plain http) has
//! one lane with no limit: HTTP/1.1 pools a connection per request in flight anyway. Under
//! `auto` over TLS the provider may still choose HTTP/1.1 by ALPN; lanes then only split the
//! idle HTTP/1.1 connections into a few pools, which costs nothing but some reuse.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use hyper_util::client::legacy::{Builder, Client, ResponseFuture};
use tokio::time::Instant;

use super::connect::{ConnectFailures, ConnectWaitedFor, Connector};
use super::io::LastRead;
use super::request_body::RequestBody;

type HttpClient = Client<Connector, RequestBody>;

/// The lanes of one upstream.
pub(super) struct Lanes {
    /// Always there: every request of an HTTP/1.1 upstream, and the first of an HTTP/2 one.
    /// Replaced (under `more`'s lock) when it is retired.
    first: ArcSwap<Lane>,
    /// Lanes opened when every earlier one was full. Locked only to look through or add to
    /// the list, never across an await.
    more: Mutex<Vec<Arc<Lane>>>,
    /// Streams per lane; `usize::MAX` when the upstream does not speak HTTP/2.
    max_streams: usize,
    /// HTTP/2 whatever ALPN says (`http2 = "always"`, h2c included): no connection of this
    /// upstream is an HTTP/1.1 one.
    h2_only: bool,
    /// Lanes at most, `first` included.
    max_lanes: usize,
    /// What makes another lane's client.
    builder: Builder,
    connector: Connector,
}

struct Lane {
    /// `None` once the lane is retired and its last stream has ended.
    client: ArcSwapOption<HttpClient>,
    streams: AtomicUsize,
    /// Takes no more streams (see the module's notes).
    retired: AtomicBool,
    /// The streams its server takes at once, as its connection's SETTINGS said (before
    /// that, as another lane's did; `usize::MAX` until one did), where that is below
    /// `http2_max_streams_per_connection`.
    peer_streams: Arc<AtomicUsize>,
    /// When its HTTP/2 connection last read anything.
    last_read: Arc<LastRead>,
    /// Its connects that failed (`connect.rs`).
    failures: Arc<ConnectFailures>,
}

/// One stream's place on its lane, given back when dropped.
pub struct StreamSlot {
    lane: Arc<Lane>,
    /// The lanes may hold HTTP/2 connections.
    multiplexed: bool,
    h2_only: bool,
    /// The lane's failed connects when the request was handed to it.
    failures_seen: u64,
}

impl StreamSlot {
    /// The request's connect limit fired before it had a connection (`after`): any request
    /// waiting for the connect it drops is told that connect timed out.
    pub fn connect_timed_out(&self, after: Duration) {
        if self.h2_only {
            self.lane.failures.note_timeout(after);
        }
    }

    /// What failed the connect this request waited for, where that is why it failed:
    /// hyper-util's pool, which makes one HTTP/2 connection at a time, let go of its waiters
    /// ("request was canceled") as a connect of the lane failed meanwhile (audit SB 1). None
    /// for any other error, and where no connect failed (the request that was making it went
    /// away, or hyper's own handshake failed after the connector's work).
    pub fn connect_waited_for(
        &self,
        e: &hyper_util::client::legacy::Error,
    ) -> Option<Arc<ConnectWaitedFor>> {
        use hyper_util::client::legacy::pool;
        let waited = e.is_connect()
            && std::error::Error::source(e)
                .and_then(|s| s.downcast_ref::<pool::Error>())
                .is_some_and(|p| matches!(p, pool::Error::CheckoutNoLongerWanted));
        waited
            .then(|| self.lane.failures.since(self.failures_seen))
            .flatten()
    }

    /// The stream's connection took the request and sent no answer head in time: no new
    /// stream goes to it. `negotiated_h2`: the connection chose HTTP/2 by ALPN. Only where
    /// streams share a connection: an HTTP/1.1 connection that timed out is closed with its
    /// request anyway, and retiring its lane would throw away the idle ones pooled with it
    /// (`http2 = "auto"` to a provider that chose HTTP/1.1).
    pub fn retire(&self, negotiated_h2: bool) {
        if self.multiplexed && (negotiated_h2 || self.h2_only) {
            self.lane.retired.store(true, Ordering::Release);
        }
    }

    /// What the stream's answer body watches its connection with, once the head came: only
    /// where streams share it (as [`StreamSlot::retire`]).
    pub fn watch(&self, negotiated_h2: bool) -> Option<ConnectionWatch> {
        (self.multiplexed && (negotiated_h2 || self.h2_only)).then(|| ConnectionWatch {
            lane: Arc::clone(&self.lane),
        })
    }
}

/// The HTTP/2 connection an answer streams on, as its limits see it: when one of them cuts
/// the stream, the connection takes no new streams if it was silent too (see the module's
/// notes).
#[derive(Clone)]
pub struct ConnectionWatch {
    lane: Arc<Lane>,
}

impl ConnectionWatch {
    /// A limit cut the stream: the connection is retired if it has read nothing for
    /// `silence` (the route's idle limit). Called before the stream's body (and slot) is
    /// dropped, whose drop then lets go of the retired lane's connection if it was the last.
    pub fn retire_if_silent(&self, silence: Duration) {
        let Some(last) = self.lane.last_read.at() else {
            return;
        };
        if Instant::now().saturating_duration_since(last) >= silence {
            self.lane.retired.store(true, Ordering::Release);
        }
    }
}

impl std::fmt::Debug for ConnectionWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionWatch")
            .field("last_read", &self.lane.last_read.at())
            .finish_non_exhaustive()
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let before = self.lane.streams.fetch_sub(1, Ordering::AcqRel);
        if before == 1 && self.lane.is_retired() {
            self.lane.client.store(None);
        }
    }
}

impl std::fmt::Debug for StreamSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamSlot").finish_non_exhaustive()
    }
}

impl Lane {
    fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    fn streams(&self) -> usize {
        self.streams.load(Ordering::Acquire)
    }

    fn new(builder: &Builder, connector: &Connector) -> Arc<Lane> {
        let connector = connector.for_lane();
        Arc::new(Lane {
            peer_streams: Arc::clone(&connector.peer_streams),
            last_read: Arc::clone(&connector.last_read),
            failures: Arc::clone(&connector.failures),
            client: ArcSwapOption::from_pointee(builder.build(connector)),
            streams: AtomicUsize::new(0),
            retired: AtomicBool::new(false),
        })
    }

    /// Takes a place if the lane has one. A compare-and-swap, not a load then an add: two
    /// requests that both saw the last place free must not both take it.
    fn try_take(&self, max: usize) -> bool {
        if self.retired.load(Ordering::Acquire) {
            return false;
        }
        // A stream past the server's own limit would wait inside h2 on this connection, and
        // be lost with it should the server close it (audit Z2): another lane takes it.
        // A server that takes none for now (0) still gets one, which waits.
        let max = max.min(self.peer_streams.load(Ordering::Acquire).max(1));
        self.streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }
}

impl Lanes {
    /// `max_streams` is `None` for an upstream that does not speak HTTP/2.
    pub(super) fn new(
        builder: Builder,
        connector: Connector,
        max_streams: Option<u32>,
        max_connections: Option<u32>,
        h2_only: bool,
    ) -> Lanes {
        let as_usize = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        Lanes {
            first: ArcSwap::new(Lane::new(&builder, &connector)),
            more: Mutex::new(Vec::new()),
            max_streams: max_streams.map_or(usize::MAX, as_usize),
            h2_only,
            max_lanes: match max_streams {
                None => 1,
                Some(_) => max_connections.map_or(usize::MAX, as_usize),
            },
            builder,
            connector,
        }
    }

    /// Sends `req` on the first lane with room. The slot must live as long as the response
    /// body: it is what says the stream is still open.
    pub(super) fn request(&self, req: http::Request<RequestBody>) -> (ResponseFuture, StreamSlot) {
        loop {
            let slot = self.slot();
            // A lane retired while this request took its place may have let its client go
            // as its last other stream ended: the request takes another.
            let client = slot.lane.client.load();
            if let Some(client) = client.as_ref() {
                return (client.request(req), slot);
            }
        }
    }

    /// The lanes may hold HTTP/2 connections: the upstream may speak HTTP/2.
    pub(super) fn multiplexed(&self) -> bool {
        self.max_streams != usize::MAX
    }

    fn slot(&self) -> StreamSlot {
        let lane = self.take();
        StreamSlot {
            failures_seen: lane.failures.count(),
            lane,
            multiplexed: self.multiplexed(),
            h2_only: self.h2_only,
        }
    }

    fn take(&self) -> Arc<Lane> {
        {
            let first = self.first.load();
            if first.try_take(self.max_streams) {
                return Arc::clone(&first);
            }
        }
        let mut more = self.more.lock().unwrap_or_else(PoisonError::into_inner);
        // A retired lane whose streams have all ended goes, and its connection with it.
        more.retain(|l| !l.is_retired() || l.streams() > 0);
        let old = self.first.load_full();
        if old.is_retired() {
            let draining = old.streams() > 0;
            let open = more.len() + usize::from(draining);
            if open < self.max_lanes || !more.iter().any(|l| !l.is_retired()) {
                if draining {
                    more.push(old);
                }
                self.first.store(Lane::new(&self.builder, &self.connector));
            }
        }
        let first = self.first.load_full();
        if first.try_take(self.max_streams) {
            return first;
        }
        if let Some(lane) = more.iter().find(|l| l.try_take(self.max_streams)) {
            return lane.clone();
        }
        let lane = if 1 + more.len() < self.max_lanes {
            let lane = Lane::new(&self.builder, &self.connector);
            more.push(lane.clone());
            lane
        } else {
            // Every connection allowed is full: the least loaded that takes streams takes
            // one more, which hyper queues on it should the server's own limit be reached.
            // (There is one: a retired first lane is replaced when no other takes streams.)
            std::iter::once(&first)
                .chain(more.iter())
                .filter(|l| !l.is_retired())
                .min_by_key(|l| l.streams())
                .unwrap_or(&first)
                .clone()
        };
        lane.streams.fetch_add(1, Ordering::AcqRel);
        lane
    }

    /// Streams in flight on each lane, first lane first (for tests and the curious).
    #[cfg(test)]
    fn counts(&self) -> Vec<usize> {
        let more = self.more.lock().unwrap_or_else(PoisonError::into_inner);
        std::iter::once(&self.first.load_full())
            .chain(more.iter())
            .map(|l| l.streams.load(Ordering::Acquire))
            .collect()
    }
}

#[cfg(test)]
#[path = "h2_pool_tests.rs"]
mod tests;
