//! What the gateway knows of the client connection a request came on: who the peer is and,
//! over HTTP/2, how many of the connection's streams are open (for its idle limit) and how many
//! wait, ended by a limit, for hyper to poll them (for closing a stuck connection).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Handed by the server to the gateway with each request. (Not in the request's extensions:
/// the first extension allocates the request's map, and the value its own box.)
#[derive(Clone, Copy)]
pub struct ClientConn<'a> {
    pub peer: SocketAddr,
    /// Over HTTP/2, the streams of the connection; `None` over HTTP/1.
    pub streams: Option<&'a Streams>,
    /// The subject of the certificate the client presented over TLS, if it was asked for one.
    pub certificate: Option<&'a Arc<str>>,
    /// What the connection's socket tells of its client's reading.
    pub writes: Option<&'a ClientWrites>,
}

#[derive(Default)]
struct Writes {
    progress: AtomicU64,
    cut: AtomicBool,
}

/// What a client connection's socket (`server::client_io`) tells its requests of the client's
/// reading: a stalled write the client made room for, and whether the gateway closed the
/// connection for `send_timeout`. A slow reader's socket takes bytes long before hyper asks a
/// stream's body for more (hyper buffers up to 16 frames), so the reaper asks this too.
#[derive(Clone, Default)]
pub struct ClientWrites(Arc<Writes>);

impl ClientWrites {
    /// A write that had stalled went out: the client read.
    pub fn progressed(&self) {
        self.0.progress.fetch_add(1, Ordering::Relaxed);
    }

    /// Stalled writes that went out so far: unchanged between two looks means the client
    /// made no room in between.
    pub fn progress(&self) -> u64 {
        self.0.progress.load(Ordering::Relaxed)
    }

    /// The gateway is closing the connection: its client read nothing for `send_timeout`.
    pub fn cut(&self) {
        self.0.cut.store(true, Ordering::Relaxed);
    }

    pub fn was_cut(&self) -> bool {
        self.0.cut.load(Ordering::Relaxed)
    }
}

#[derive(Default)]
struct Activity {
    open: AtomicUsize,
    /// Streams started and ended so far: unchanged between two looks means nothing
    /// happened in between.
    changes: AtomicU64,
    /// Streams whose upstream call the reaper ended while hyper was not polling their body,
    /// and which it has not polled since (see [`Unpolled`]).
    unpolled: AtomicUsize,
}

/// The streams of one HTTP/2 connection, as its requests see it (in their extensions).
#[derive(Clone, Default)]
pub struct Streams(Arc<Activity>);

impl Streams {
    /// A stream has started; it counts as open until the returned guard is dropped.
    pub fn open(&self) -> Open {
        self.0.open.fetch_add(1, Ordering::Relaxed);
        self.0.changes.fetch_add(1, Ordering::Relaxed);
        Open(self.0.clone())
    }

    /// Streams open now.
    pub fn open_now(&self) -> usize {
        self.0.open.load(Ordering::Relaxed)
    }

    /// Streams started and ended so far: unchanged between two looks means nothing happened
    /// in between.
    pub fn changes(&self) -> u64 {
        self.0.changes.load(Ordering::Relaxed)
    }

    /// The reaper ended a stream's upstream call while hyper was not polling its body: the
    /// stream counts as waiting for a poll until the returned guard is dropped.
    pub fn unpolled(&self) -> Unpolled {
        self.0.unpolled.fetch_add(1, Ordering::Relaxed);
        Unpolled(self.0.clone())
    }

    /// Streams ended by a limit that still wait for hyper to poll them, which alone resets
    /// them for their client: on a connection whose client gives no window, never
    /// (`server::h2_stuck`).
    pub fn unpolled_now(&self) -> usize {
        self.0.unpolled.load(Ordering::Relaxed)
    }
}

/// One open stream of an HTTP/2 connection.
pub struct Open(Arc<Activity>);

impl Open {
    /// The streams of this stream's connection.
    pub fn streams(&self) -> Streams {
        Streams(self.0.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
        self.0.changes.fetch_add(1, Ordering::Relaxed);
    }
}

/// A stream whose upstream call the reaper ended, waiting for hyper to poll its body (and so
/// reset it for its client); dropped once polled, or once the body is dropped.
pub struct Unpolled(Arc<Activity>);

impl Drop for Unpolled {
    fn drop(&mut self) {
        self.0.unpolled.fetch_sub(1, Ordering::Relaxed);
    }
}
