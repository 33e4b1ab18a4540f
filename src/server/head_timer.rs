//! hyper's HTTP/1 timer, which it uses for one thing: a request head's `header_read_timeout`.
//! Two departures from a plain timer, each from an audit:
//! - The connection's first head is timed from its accept. hyper starts a head's limit at
//!   `now()` as it begins to read the head, and before the first one the connection has
//!   already waited under the same limit, for its first bytes or its TLS handshake (audit CC:
//!   a head had up to two limits). Later heads, and the idle time between requests, get the
//!   whole limit each.
//! - A head's limit does not run out while the client still reads the answer before it.
//!   hyper begins reading the next head as soon as an answer is written, and the socket's
//!   send buffer may hold megabytes of it: a client that read it slowly found its keep-alive
//!   connection closed the moment it had read it all (audit CF). While the socket holds bytes
//!   the client has not acknowledged, and their count falls within every `send_timeout`, the
//!   limit waits; once they are out, the client has a whole limit for its next head.

use std::future::Future;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioTimer;
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::server::client_io::{unacked_by, STALL_CHECKS};

pub(super) struct HeadTimer {
    accepted: std::time::Instant,
    first: AtomicBool,
    limit: Duration,
    send_timeout: Duration,
    /// The connection's socket. The timer and its sleeps belong to hyper's connection, which
    /// owns the socket: they are polled only while it is open.
    fd: RawFd,
}

impl HeadTimer {
    /// `limit`: the `header_read_timeout` hyper is given; `fd`: the connection's socket.
    pub(super) fn new(
        accepted: Instant,
        limit: Duration,
        send_timeout: Duration,
        fd: RawFd,
    ) -> Self {
        Self {
            accepted: accepted.into_std(),
            first: AtomicBool::new(true),
            limit,
            send_timeout,
            fd,
        }
    }
}

impl hyper::rt::Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        TokioTimer::new().sleep(duration)
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(HeadSleep {
            sleep: tokio::time::sleep_until(deadline.into()),
            limit: self.limit,
            send_timeout: self.send_timeout,
            fd: self.fd,
            draining: None,
        })
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: std::time::Instant) {
        match sleep.as_mut().downcast_mut_pin::<HeadSleep>() {
            Some(head) => {
                let head = head.project();
                *head.draining = None;
                head.sleep.reset(new_deadline.into());
            }
            None => *sleep = self.sleep_until(new_deadline),
        }
    }

    fn now(&self) -> std::time::Instant {
        // hyper asks once a head, when it starts reading it (its only use of `now` over HTTP/1).
        if self.first.swap(false, Ordering::Relaxed) {
            self.accepted
        } else {
            Instant::now().into_std()
        }
    }
}

/// The answer still leaving when a head's limit ran out.
#[derive(Clone, Copy)]
struct Draining {
    /// Bytes the client had not acknowledged at the last look.
    held: u64,
    /// When they were last seen to fall.
    read_at: Instant,
}

pin_project! {
    /// A head's limit, which waits out the client's reading of the answer before it.
    struct HeadSleep {
        #[pin]
        sleep: tokio::time::Sleep,
        limit: Duration,
        send_timeout: Duration,
        fd: RawFd,
        draining: Option<Draining>,
    }
}

impl Future for HeadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        loop {
            std::task::ready!(this.sleep.as_mut().poll(cx));
            let now = Instant::now();
            match unacked_by(*this.fd).filter(|held| *held > 0) {
                Some(held) => {
                    let d = this.draining.get_or_insert(Draining { held, read_at: now });
                    if held < d.held {
                        *d = Draining { held, read_at: now };
                    }
                    d.held = held;
                    // A client that has stopped reading is closed as a stalled write would
                    // be (`server::client_io`).
                    let stop = d.read_at + *this.send_timeout;
                    if now >= stop {
                        return Poll::Ready(());
                    }
                    let check = (*this.send_timeout / STALL_CHECKS).max(Duration::from_millis(1));
                    this.sleep.as_mut().reset((now + check).min(stop));
                }
                // The answer is out: from now, the whole limit for the next head.
                None if this.draining.take().is_some() => {
                    this.sleep.as_mut().reset(now + *this.limit);
                }
                None => return Poll::Ready(()),
            }
        }
    }
}

impl hyper::rt::Sleep for HeadSleep {}
