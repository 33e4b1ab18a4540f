//! Connecting to an upstream: TCP, then TLS where the URL asks (its config is `tls.rs`), all
//! under one bound that also covers, for HTTP/2, the server's first frame.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::Connection;

use crate::config::Http2Mode;
use crate::error::BoxError;
use crate::upstream::egress::EgressConnector;
use crate::upstream::io::{LastRead, UpstreamIo};
use crate::upstream::tls::refused_h2;

/// What every upstream client connects through: TCP (through its egress proxy's CONNECT
/// tunnel where it has one), then TLS where the URL asks, all of it under one bound.
pub(crate) type Connector = TimeoutConnector<HttpsConnector<EgressConnector>>;

/// The connect step took longer than allowed. Mapped to `connect_timeout` by the proxy.
#[derive(Debug, thiserror::Error)]
#[error(
    "connect (name lookup, TCP, any egress proxy's tunnel, and TLS) did not finish within {0:?}"
)]
pub struct ConnectTimedOut(pub Duration);

/// `http2 = "always"` over TLS, and the provider's ALPN did not choose `h2`.
#[derive(Debug, thiserror::Error)]
#[error(
    "the upstream did not agree to HTTP/2 by ALPN (it offers only HTTP/1.1, or no ALPN), \
     and the upstream's `http2 = \"always\"` asks for h2 alone"
)]
pub struct NoH2ByAlpn(
    /// The TLS error, when the server refused the handshake for it (its alert says so).
    #[source]
    Option<BoxError>,
);

/// Bounds the whole connector call, name lookup, TCP and TLS together (hyper-util's own connect timeout
/// covers TCP only), and an HTTP/2 connection's wait for the server's first frame, which is
/// part of connecting: hyper's handshake does not wait for it, so without this bound a
/// server that accepted but never speaks would be pooled as a live connection, and every
/// request and retry sent on it would wait out its first-token limit.
///
/// Under `http2 = "auto"` over TLS it also makes one connection at a time per lane while the
/// upstream may speak HTTP/2 ([`Turns`]).
#[derive(Clone)]
pub struct TimeoutConnector<C> {
    pub(super) inner: C,
    pub(super) timeout: Duration,
    pub(super) http2: Http2Mode,
    /// The lane's turns to connect (each lane's client gets its own, [`Self::for_lane`]).
    pub(super) turns: Arc<Turns>,
    /// What ALPN chose last on this upstream, any lane: `ALPN_H1` ends the turns.
    pub(super) chose: Arc<AtomicU8>,
    /// The streams the lane's HTTP/2 server takes at once, as its last connection's SETTINGS
    /// said (`io.rs`).
    pub(super) peer_streams: Arc<AtomicUsize>,
    /// ... and as the last connection of any lane said (`usize::MAX` until one did): where a
    /// new lane starts, so that a burst that opens it does not queue past the provider's
    /// limit before its own connection's SETTINGS arrive.
    pub(super) peer_streams_seen: Arc<AtomicUsize>,
    /// When the lane's HTTP/2 connection last read (`io.rs`).
    pub(super) last_read: Arc<LastRead>,
    /// The lane's connects that failed, for the requests that waited for them.
    pub(super) failures: Arc<ConnectFailures>,
}

/// The connect a request waited for failed: hyper-util's pool makes one HTTP/2 connection at
/// a time per upstream, and a request that finds one being made waits for it instead of
/// connecting; when that connect fails, the pool tells its waiters no more than "request was
/// canceled" (audit SB 1: a cold burst to an upstream whose connects hung got one 504
/// `connect_timeout` and the rest 502 `upstream_unavailable`). Its source is a copy of what
/// failed that connect (errors cannot be cloned): a timeout, a failed name lookup, an I/O
/// error's kind, a TLS error, ALPN's refusal of h2, else its words.
#[derive(Debug, thiserror::Error)]
#[error("the HTTP/2 connection it waited for could not be made")]
pub struct ConnectWaitedFor(#[source] BoxError);

/// Words, where nothing in a failed connect's chain is copied.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Words(String);

/// A name lookup that failed, said as hyper-util says it ("dns error", which the count of
/// connect errors reads as `dns`), with its cause in words. Copied as an I/O error of kind
/// `Other`, it was counted `other` for the requests that waited for the connect (audit VA 4).
#[derive(Debug, thiserror::Error)]
#[error("{LOOKUP_FAILED}")]
struct LookupFailed(#[source] Option<Words>);

/// hyper-util's words for a failed name lookup (its `ConnectError`, which is not public).
pub const LOOKUP_FAILED: &str = "dns error";

impl ConnectWaitedFor {
    fn copy(e: &(dyn std::error::Error + 'static)) -> Self {
        let mut source = Some(e);
        while let Some(s) = source {
            let copy: Option<BoxError> = if let Some(t) = s.downcast_ref::<ConnectTimedOut>() {
                Some(Box::new(ConnectTimedOut(t.0)))
            } else if s.to_string() == LOOKUP_FAILED {
                let cause = s.source().map(|c| Words(crate::error::with_causes(c)));
                Some(Box::new(LookupFailed(cause)))
            } else if s.is::<NoH2ByAlpn>() {
                Some(Box::new(NoH2ByAlpn(None)))
            } else if let Some(tls) = s.downcast_ref::<rustls::Error>() {
                Some(Box::new(tls.clone()))
            } else {
                s.downcast_ref::<std::io::Error>().map(|io| {
                    Box::new(std::io::Error::new(io.kind(), crate::error::with_causes(e)))
                        as BoxError
                })
            };
            if let Some(copy) = copy {
                return Self(copy);
            }
            source = s.source();
        }
        Self(Box::new(Words(crate::error::with_causes(e))))
    }
}

/// A lane's failed connects: how many, and the last, noted by the connector before it gives
/// its error to hyper-util, and so before hyper-util lets the connect's waiters go.
#[derive(Default)]
pub struct ConnectFailures {
    count: AtomicU64,
    last: Mutex<Option<Arc<ConnectWaitedFor>>>,
}

impl ConnectFailures {
    fn note(&self, e: &(dyn std::error::Error + 'static)) {
        self.note_copy(ConnectWaitedFor::copy(e));
    }

    /// A request's own connect limit (`after`) fired before its connection came, and it
    /// is about to drop its connect, which hyper-util then ends with its waiters: that
    /// limit fires a moment before the connector's own bound, which it usually equals.
    pub(super) fn note_timeout(&self, after: Duration) {
        self.note_copy(ConnectWaitedFor(Box::new(ConnectTimedOut(after))));
    }

    fn note_copy(&self, copy: ConnectWaitedFor) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(copy));
        self.count.fetch_add(1, Ordering::AcqRel);
    }

    /// How many connects have failed: a request notes it when it starts, to know later
    /// whether one failed while it waited.
    pub(super) fn count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// The last failure, if one came after `seen` failures.
    pub(super) fn since(&self, seen: u64) -> Option<Arc<ConnectWaitedFor>> {
        if self.count() == seen {
            return None;
        }
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

const ALPN_UNKNOWN: u8 = 0;
const ALPN_H1: u8 = 1;
const ALPN_H2: u8 = 2;

/// hyper-util coalesces the connects of one host only when it knows the connection will be
/// HTTP/2 (`http2_only`); under `auto` it learns that from ALPN after the TLS handshake, so
/// every request that finds the pool empty makes a connection of its own, and all but one
/// are thrown away once ALPN says h2: a cold burst of 50 requests opened 50 TLS connections
/// to an HTTP/2 upstream, `http2_max_connections = 1` or not (audit L). So a lane connects
/// one at a time while the upstream may speak h2. A connect that waited its turn while
/// another made an h2 connection makes none: hyper-util hands its request that connection
/// from the pool (its checkout races the connect and wins), and finishes the connect in the
/// background, where it ends at the connect bound having opened nothing. (Should hyper's
/// own h2 handshake fail on the connection made, a request that waited gets a connect
/// timeout: there is no pooled connection to hand it.)
#[derive(Default)]
pub struct Turns {
    turn: tokio::sync::Mutex<()>,
    /// How many h2 connections this lane has made.
    h2_made: AtomicU64,
}

impl<C: Clone> TimeoutConnector<C> {
    pub(super) fn new(inner: C, timeout: Duration, http2: Http2Mode) -> Self {
        Self {
            inner,
            timeout,
            http2,
            turns: Arc::default(),
            chose: Arc::new(AtomicU8::new(ALPN_UNKNOWN)),
            peer_streams: Arc::new(AtomicUsize::new(usize::MAX)),
            peer_streams_seen: Arc::new(AtomicUsize::new(usize::MAX)),
            last_read: Arc::new(LastRead::new()),
            failures: Arc::default(),
        }
    }

    /// The connector of a new lane: turns, a stream limit and reads of its own, what ALPN
    /// chose shared.
    pub(super) fn for_lane(&self) -> Self {
        Self {
            turns: Arc::default(),
            last_read: Arc::new(LastRead::new()),
            failures: Arc::default(),
            peer_streams: Arc::new(AtomicUsize::new(
                self.peer_streams_seen.load(Ordering::Acquire),
            )),
            ..self.clone()
        }
    }
}

impl<C> tower_service::Service<Uri> for TimeoutConnector<C>
where
    C: tower_service::Service<Uri> + Clone + Send + 'static,
    C::Response: Into<UpstreamIo>,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
    type Response = UpstreamIo;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamIo, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (timeout, mode) = (self.timeout, self.http2);
        let turns = (mode == Http2Mode::Auto
            && uri.scheme() == Some(&http::uri::Scheme::HTTPS)
            && self.chose.load(Ordering::Acquire) != ALPN_H1)
            .then(|| Arc::clone(&self.turns));
        let chose = Arc::clone(&self.chose);
        let peer_streams = [
            Arc::clone(&self.peer_streams),
            Arc::clone(&self.peer_streams_seen),
        ];
        let last_read = Arc::clone(&self.last_read);
        // Only `http2 = "always"` has hyper-util's pool make one connection at a time before
        // the connect: under `auto` each request connects (`Turns`), and a turn's own
        // timeout there is no connect anyone waited for.
        let failures = (mode == Http2Mode::Always).then(|| Arc::clone(&self.failures));
        // Called once this connect has its turn: the inner connector's future may start
        // its work when made.
        let mut inner = self.inner.clone();
        let connect = async move {
            let by = tokio::time::Instant::now() + timeout;
            let _turn = match &turns {
                None => None,
                Some(turns) => {
                    let made = turns.h2_made.load(Ordering::Acquire);
                    let Ok(turn) = tokio::time::timeout_at(by, turns.turn.lock()).await else {
                        return Err(Box::new(ConnectTimedOut(timeout)) as BoxError);
                    };
                    if turns.h2_made.load(Ordering::Acquire) != made {
                        drop(turn);
                        tokio::time::sleep_until(by).await;
                        return Err(Box::new(ConnectTimedOut(timeout)) as BoxError);
                    }
                    // A handshake chose HTTP/1.1 while this one waited: one connection per
                    // request, made at once (audit Q: in single file, a cold burst to an
                    // HTTP/1.1 upstream had 31 of 50 connects time out and the upstream
                    // ejected).
                    if chose.load(Ordering::Acquire) == ALPN_H1 {
                        None
                    } else {
                        Some(turn)
                    }
                }
            };
            // The connect's own bound starts with it: a turn waited for is not its time.
            let by = tokio::time::Instant::now() + timeout;
            let fut = inner.call(uri);
            let mut io: UpstreamIo = match tokio::time::timeout_at(by, fut).await {
                Ok(Ok(io)) => io.into(),
                Ok(Err(e)) => {
                    let e: BoxError = e.into();
                    return Err(if mode == Http2Mode::Always && refused_h2(&*e) {
                        Box::new(NoH2ByAlpn(Some(e)))
                    } else {
                        e
                    });
                }
                Err(_) => return Err(Box::new(ConnectTimedOut(timeout)) as BoxError),
            };
            let h2 = if io.is_tls() {
                let h2 = io.connected().is_negotiated_h2();
                if mode == Http2Mode::Always && !h2 {
                    return Err(Box::new(NoH2ByAlpn(None)) as BoxError);
                }
                chose.store(if h2 { ALPN_H2 } else { ALPN_H1 }, Ordering::Release);
                if h2 {
                    if let Some(turns) = &turns {
                        turns.h2_made.fetch_add(1, Ordering::AcqRel);
                    }
                }
                h2
            } else {
                // Plain http:// speaks h2c only by prior knowledge.
                mode == Http2Mode::Always
            };
            if !h2 {
                io.abandonable();
            }
            if h2 {
                // A bound of its own from the connection being made: a connect that took
                // most of its bound must not leave the server no time to answer the
                // preface (one more round trip over h2c or TLS 1.2).
                io.expect_first_frame_by(
                    tokio::time::Instant::now() + timeout,
                    peer_streams,
                    last_read,
                );
            }
            Ok(io)
        };
        Box::pin(async move {
            let connected = connect.await;
            if let (Err(e), Some(failures)) = (&connected, &failures) {
                failures.note(&**e);
            }
            connected
        })
    }
}
