//! Ends a stream's upstream call when nobody reads the stream: at the request's deadline, or
//! once the client has taken nothing for `send_timeout`.
//!
//! The watchdog enforces a request's limits whenever the client connection polls the
//! response body. A client that stops reading (a zero TCP window, a stalled HTTP/2 stream)
//! stops those polls: the connection cannot write, so it does not ask for more. The upstream
//! is then held by backpressure, which bounds memory, but without a poll no limit fires, so
//! the upstream call (still generating, still billed), its connection and the route's
//! admission slot would be held for as long as the client likes.
//!
//! The reaper closes that gap from outside the body. The upstream body is shared with one
//! task per gateway, which drops it (closing its connection or resetting its HTTP/2 stream,
//! and ending its in-flight count) together with the admission slot:
//! - at the request's deadline, if the stream is still open. When the client reads again, the
//!   watchdog finds the upstream gone after the deadline and ends the stream with
//!   `deadline_exceeded`, as it would have on time;
//! - when the body has handed a frame to the client's connection and has not been asked for
//!   the next one for `send_timeout`. On HTTP/1 the client connection's own `send_timeout`
//!   (`client_io`) closes the connection first; this is what covers an HTTP/2 stream whose
//!   client stops granting it window while the connection's other streams flow, which no
//!   socket-level timer can see. Should the client read again, the stream is aborted (an
//!   HTTP/2 `RST_STREAM` with `CANCEL`), as an HTTP/1 client finds its connection closed; the
//!   request counts as `origin="client"`.
//!
//! - at the end of the shutdown grace (the cut), every stream still open: the watchdog sees
//!   the cut only when polled, so a client not reading then (a full socket buffer, an HTTP/2
//!   stream without window) held its upstream call until the connections were closed two
//!   seconds later, and was counted as leaving (audit AD 2). A client that reads again gets
//!   the `shutdown` event.
//!
//! A stream whose upstream went at the deadline or the cut and whose client then leaves
//! without reading again was ended by the deadline (or the shutdown) all the same: the watchdog asks [`ReapedBy`] when it is
//! dropped unfinished, so that the request counts as `origin="deadline"`, not the client's.
//!
//! Over HTTP/2 the client's stream is reset only when hyper polls the reaped body, and hyper
//! polls no body of a connection whose client gives it no window at all (audit KA 1: httpx
//! never gives back what its abandoned streams were sent, and once that used up its 16 MiB,
//! every stream of the connection, fresh ones too, was held for minutes past its deadline).
//! So a reaped stream of an HTTP/2 connection counts on that connection as waiting for a
//! poll ([`Streams::unpolled`]) until it is polled or dropped; the connection's own watch
//! (`server::h2_stuck`) closes a connection that has one and has written nothing for
//! `send_timeout`. The count is touched at the reap and at the poll or drop after it only.
//!
//! The stall clock costs the stream's polls two plain writes under the lock they already take;
//! the task looks at each stream every quarter of `send_timeout`, so a stall is caught between
//! one and one and a quarter `send_timeout`s after the last poll.
//!
//! Why one task and not one per stream: a task per stream was a spawn, two polls and a wake
//! per request, and most of a kilobyte per open stream. The streams wait in one queue ordered
//! by when each is looked at next. A stream enters it when its body is made and leaves it when
//! the body is dropped, each under a lock held for a tree insert or removal, and neither wakes
//! the task unless the new stream is due before the task's next wake-up (a deadline shorter
//! than a quarter of `send_timeout`). tokio-util's `DelayQueue` wakes its task on an insert into
//! an empty queue and on the removal that empties it, which on a gateway that serves one
//! request at a time is the per-request wake this removes.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant};

use crate::http::conn::{ClientWrites, Streams, Unpolled};
use crate::stream::signal::Signal;

/// Stall checks per `send_timeout`.
const CHECKS: u32 = 4;

/// Where a stream waits in the queue: when it is looked at next, and its number (which keeps
/// two streams due at the same instant apart).
type Due = (Instant, u64);

/// One gateway's reaper: the queue of open streams and the task that looks at them.
#[derive(Clone)]
pub struct Reaper {
    wheel: Arc<Wheel>,
}

struct Wheel {
    /// How often a stream is looked at: a quarter of `send_timeout`.
    every: Duration,
    send_timeout: Duration,
    queue: Mutex<Queue>,
    /// A stream is due before the task's next wake-up.
    early: Notify,
    /// The task has been spawned (on the first stream, from within the runtime).
    started: AtomicBool,
    /// The shutdown's cut: every stream still open is reaped then, and any opened after.
    cut: Signal,
}

struct Queue {
    due: BTreeMap<Due, Weak<dyn Check>>,
    next_id: u64,
    /// When the task wakes next, once it runs.
    wakes: Option<Instant>,
}

/// What the task asks of a stream it finds due.
trait Check: Send + Sync {
    /// At `now`: the reason to drop the upstream, or when to look again (which the stream
    /// records as its place in the queue), or `None` once the body is gone.
    /// `cut`: the shutdown's cut has come, and every stream goes.
    fn check(&self, now: Instant, every: Duration, send_timeout: Duration, cut: bool) -> Verdict;
    fn reap(&self, why: Reaped);
    /// Why the reaper dropped the body, if it did.
    fn reaped(&self) -> Option<Reaped>;
}

enum Verdict {
    Again(Instant),
    Reap(Reaped),
    Gone,
}

impl Reaper {
    /// A reaper for streams whose client may take nothing for `send_timeout`, all of which
    /// go when `cut` fires. Its task starts with the first stream and ends once the reaper
    /// and all its streams are dropped.
    pub fn new(send_timeout: Duration, cut: Signal) -> Self {
        Self {
            wheel: Arc::new(Wheel {
                every: (send_timeout / CHECKS).max(Duration::from_millis(1)),
                send_timeout,
                queue: Mutex::new(Queue {
                    due: BTreeMap::new(),
                    next_id: 0,
                    wakes: None,
                }),
                early: Notify::new(),
                started: AtomicBool::new(false),
                cut,
            }),
        }
    }

    /// How long a client may take nothing before its stream's upstream is dropped.
    pub fn send_timeout(&self) -> Duration {
        self.wheel.send_timeout
    }

    /// Shares `body` (and `held`, what must go with it, such as the route's admission slot)
    /// with the reaper, which drops both at `deadline`, or once the client has taken nothing
    /// for `send_timeout`, unless the stream has ended by then. `writes`: the client
    /// connection's, when the stream is its only one (HTTP/1): room the client made on the
    /// socket is its reading too, though the connection has not asked for the next frame
    /// (hyper buffers up to 16 of them). `streams`: the client connection's, over HTTP/2, on
    /// which the stream counts as waiting for a poll once reaped. Must be called from within
    /// the runtime the reaper's task is to run on.
    pub fn guard<B, H>(
        &self,
        body: B,
        held: Option<H>,
        deadline: Instant,
        writes: Option<ClientWrites>,
        streams: Option<Streams>,
    ) -> Reapable<B, H>
    where
        B: Send + 'static,
        H: Send + 'static,
    {
        let wheel = &self.wheel;
        if !wheel.started.load(Ordering::Relaxed) && !wheel.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(turn_forever(wheel.clone()));
        }
        // Opened after the cut (a request whose head came just before it): due at once.
        let when = if wheel.cut.is_fired() {
            Instant::now()
        } else {
            (Instant::now() + wheel.every).min(deadline)
        };
        let mut queue = wheel.lock();
        let id = queue.next_id;
        queue.next_id += 1;
        let shared = Arc::new(Shared {
            upstream: Mutex::new(Upstream {
                body: Some(body),
                polls: 0,
                handed: false,
                reaped: None,
                seen: None,
                stalled: 0,
                due: (when, id),
                deadline,
                writes,
                streams,
                unpolled: None,
            }),
            held: Mutex::new(held),
            wheel: wheel.clone(),
        });
        let weak: Weak<dyn Check> = Arc::downgrade(&shared) as Weak<Shared<B, H>>;
        queue.due.insert((when, id), weak);
        if queue.wakes.is_none_or(|wakes| when < wakes) {
            queue.wakes = Some(when);
            drop(queue);
            wheel.early.notify_one();
        }
        Reapable { shared }
    }
}

impl Wheel {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Looks at every stream due by `now` (every stream, once `cut`), puts each one back at
    /// its next look or into `reap`, and returns when the task is to wake next.
    fn turn(&self, now: Instant, cut: bool, reap: &mut Vec<(Arc<dyn Check>, Reaped)>) -> Instant {
        let mut queue = self.lock();
        while let Some(entry) = queue.due.first_entry() {
            if entry.key().0 > now && !cut {
                break;
            }
            let ((_, id), stream) = entry.remove_entry();
            // A stream leaves the queue before its last reference goes, so this holds.
            let Some(stream) = stream.upgrade() else {
                continue;
            };
            match stream.check(now, self.every, self.send_timeout, cut) {
                Verdict::Again(when) => {
                    queue.due.insert((when, id), Arc::downgrade(&stream));
                }
                Verdict::Reap(why) => reap.push((stream, why)),
                Verdict::Gone => {}
            }
        }
        let wakes = queue
            .due
            .first_key_value()
            .map_or(now + self.every, |((when, _), _)| *when)
            .min(now + self.every);
        queue.wakes = Some(wakes);
        wakes
    }
}

async fn turn_forever(wheel: Arc<Wheel>) {
    let mut reap = Vec::new();
    let timer = sleep_until(Instant::now());
    tokio::pin!(timer);
    // Only this task holds the wheel: the reaper and all its streams are gone.
    while Arc::strong_count(&wheel) > 1 {
        let cut = wheel.cut.is_fired();
        let wakes = wheel.turn(Instant::now(), cut, &mut reap);
        // Dropped outside the queue's lock: dropping an upstream body does I/O bookkeeping.
        for (stream, why) in reap.drain(..) {
            stream.reap(why);
        }
        timer.as_mut().reset(wakes);
        tokio::select! {
            () = timer.as_mut() => {}
            () = wheel.early.notified() => {}
            () = wheel.cut.fired(), if !cut => {}
        }
    }
}

/// The upstream body, how far the client's connection has read it, and where the stream
/// waits in the reaper's queue.
struct Upstream<B> {
    body: Option<B>,
    /// Polls of the body so far.
    polls: u64,
    /// The last poll handed out a frame and no poll has come since: the client's connection
    /// holds a frame it has not made room for.
    handed: bool,
    /// Why the body is gone, once the reaper took it.
    reaped: Option<Reaped>,
    /// The polls at the reaper's last look, and for how many looks in a row a frame has been
    /// out with no poll since.
    seen: Option<u64>,
    stalled: u32,
    /// The stream's place in the reaper's queue. Changed only under the queue's lock too.
    due: Due,
    deadline: Instant,
    /// The client connection's writes, and their progress at the last look.
    writes: Option<ClientWrites>,
    /// The client connection's streams (HTTP/2), and this stream counted among them as
    /// reaped and not polled since.
    streams: Option<Streams>,
    unpolled: Option<Unpolled>,
}

/// What the body and the reaper share.
struct Shared<B, H> {
    upstream: Mutex<Upstream<B>>,
    /// What goes with the upstream call (the route's admission slot): dropped with it.
    held: Mutex<Option<H>>,
    wheel: Arc<Wheel>,
}

impl<B, H> Shared<B, H> {
    fn lock(&self) -> MutexGuard<'_, Upstream<B>> {
        self.upstream.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops the body and what is held with it, and returns the stream's place in the queue.
    fn take(&self, why: Option<Reaped>) -> Due {
        // Dropped outside the locks' scope: dropping an upstream body does I/O bookkeeping.
        let (body, due) = {
            let mut up = self.lock();
            if up.body.is_some() {
                up.reaped = why;
                // Reaped: the client's stream ends only once hyper polls it again.
                if why.is_some() {
                    up.unpolled = up.streams.as_ref().map(Streams::unpolled);
                }
            }
            if why.is_none() {
                // The body itself is dropped: it waits for no poll any more.
                up.unpolled = None;
            }
            (up.body.take(), up.due)
        };
        let held = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop((body, held));
        due
    }
}

impl<B: Send, H: Send> Check for Shared<B, H> {
    fn check(&self, now: Instant, every: Duration, send_timeout: Duration, cut: bool) -> Verdict {
        let mut up = self.lock();
        if up.body.is_none() {
            return Verdict::Gone;
        }
        if cut {
            return Verdict::Reap(Reaped::Shutdown);
        }
        if now >= up.deadline {
            return Verdict::Reap(Reaped::Deadline);
        }
        // Polls and the socket's progress together: either one moving is the client reading.
        let seen = up
            .polls
            .wrapping_add(up.writes.as_ref().map_or(0, ClientWrites::progress));
        up.stalled = if up.handed && up.seen == Some(seen) {
            up.stalled + 1
        } else {
            0
        };
        // The socket's progress is seen at the connection's own looks, up to a quarter of
        // send_timeout after the client read: one look more, or a client reading just inside
        // send_timeout could lose its upstream call (audit CF).
        let looks = if up.writes.is_some() {
            CHECKS + 1
        } else {
            CHECKS
        };
        if up.stalled >= looks {
            return Verdict::Reap(Reaped::Stalled(send_timeout));
        }
        up.seen = Some(seen);
        let when = (now + every).min(up.deadline);
        up.due.0 = when;
        Verdict::Again(when)
    }

    fn reap(&self, why: Reaped) {
        self.take(Some(why));
    }

    fn reaped(&self) -> Option<Reaped> {
        self.lock().reaped
    }
}

/// The upstream body, which the reaper may take away.
pub struct Reapable<B, H> {
    shared: Arc<Shared<B, H>>,
}

impl<B: Send + 'static, H: Send + 'static> Reapable<B, H> {
    /// A handle that tells, even once the body is dropped, whether and why the reaper took
    /// the upstream.
    pub fn reaped_by(&self) -> ReapedBy {
        ReapedBy(self.shared.clone())
    }
}

/// Whether and why the reaper took a stream's upstream (see [`Reapable::reaped_by`]).
#[derive(Clone)]
pub struct ReapedBy(Arc<dyn Check>);

impl ReapedBy {
    pub fn get(&self) -> Option<Reaped> {
        self.0.reaped()
    }
}

/// Why the reaper dropped the upstream body while nobody read the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Reaped {
    #[error("the request's deadline passed while the client was not reading")]
    Deadline,
    #[error("the client took nothing for send_timeout ({}ms)", .0.as_millis())]
    Stalled(Duration),
    #[error("the shutdown grace ended")]
    Shutdown,
}

/// The error a reaped body is read with. Its source is an HTTP/2 `CANCEL`: hyper resets the
/// client's stream with the code it finds among a body error's sources, else with
/// `INTERNAL_ERROR`, which clients read as a fault of the server; this stream was ended on
/// purpose, as no longer needed (RFC 9113 7).
#[derive(Debug, thiserror::Error)]
#[error("{why}")]
pub struct ReapedError {
    pub why: Reaped,
    #[source]
    cancel: h2::Error,
}

impl From<Reaped> for ReapedError {
    fn from(why: Reaped) -> Self {
        Self {
            why,
            cancel: h2::Reason::CANCEL.into(),
        }
    }
}

impl<B, H> Drop for Reapable<B, H> {
    fn drop(&mut self) {
        // The upstream call and the slot go now, not when the reaper next looks: a client
        // that left is cancelled upstream without waiting for another task, and the
        // in-flight gauge is down before the request's record (dropped after this) reports.
        let due = self.shared.take(None);
        // The body is gone, so a look the task takes meanwhile puts the stream back no more;
        // one it took before left it at `due`, which was read after.
        self.shared.wheel.lock().due.remove(&due);
    }
}

impl<B, H> Body for Reapable<B, H>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<crate::error::BoxError>,
{
    type Data = Bytes;
    type Error = crate::error::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut up = self.shared.lock();
        up.polls = up.polls.wrapping_add(1);
        let polled = match up.body.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            None => {
                // Polled at last: the stream is reset now (RST_STREAM needs no window).
                up.unpolled = None;
                let why = up.reaped.unwrap_or(Reaped::Deadline);
                Poll::Ready(Some(Err(ReapedError::from(why).into())))
            }
        };
        up.handed = matches!(polled, Poll::Ready(Some(Ok(_))));
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.shared
            .lock()
            .body
            .as_ref()
            .is_some_and(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.shared
            .lock()
            .body
            .as_ref()
            .map_or_else(SizeHint::default, Body::size_hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Channel};

    const HOUR: Duration = Duration::from_secs(3600);
    const SEND: Duration = Duration::from_millis(400);

    fn slot(slots: &Arc<tokio::sync::Semaphore>) -> tokio::sync::OwnedSemaphorePermit {
        slots.clone().try_acquire_owned().unwrap()
    }

    fn queued(reaper: &Reaper) -> usize {
        reaper.wheel.lock().due.len()
    }

    #[tokio::test(start_paused = true)]
    async fn an_unpolled_body_is_dropped_at_the_deadline_with_its_slot() {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(1);
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let reaper = Reaper::new(HOUR, Signal::new());
        let deadline = Instant::now() + Duration::from_millis(500);
        let mut body = reaper.guard(rx, Some(slot(&slots)), deadline, None, None);
        tx.send_data(Bytes::from_static(b"a")).await.unwrap();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"a");
        assert_eq!(slots.available_permits(), 0);

        // Nobody polls from here on; the deadline passes.
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(
            tx.send_data(Bytes::from_static(b"b")).await.is_err(),
            "upstream dropped"
        );
        assert_eq!(slots.available_permits(), 1, "slot freed");
        assert_eq!(queued(&reaper), 0, "the stream left the queue");
        let err = body.frame().await.unwrap().unwrap_err();
        let why = err.downcast_ref::<ReapedError>().map(|e| e.why);
        assert_eq!(why, Some(Reaped::Deadline));
    }

    /// Audit AD 2: at the shutdown's cut every stream still open loses its upstream at
    /// once, polled or not (a client not reading held it until its connection was closed),
    /// and one opened after the cut goes at once too; a later poll reads why.
    #[tokio::test(start_paused = true)]
    async fn the_cut_drops_every_open_upstream_at_once() {
        let cut = Signal::new();
        let reaper = Reaper::new(HOUR, cut.clone());
        let slots = Arc::new(tokio::sync::Semaphore::new(2));
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(1);
        let mut body = reaper.guard(rx, Some(slot(&slots)), Instant::now() + HOUR, None, None);
        tokio::time::sleep(Duration::from_millis(10)).await;
        cut.fire();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(
            tx.send_data(Bytes::from_static(b"a")).await.is_err(),
            "upstream dropped at the cut"
        );
        assert_eq!(slots.available_permits(), 2, "slot freed");
        assert_eq!(body.reaped_by().get(), Some(Reaped::Shutdown));
        let err = body.frame().await.unwrap().unwrap_err();
        let why = err.downcast_ref::<ReapedError>().map(|e| e.why);
        assert_eq!(why, Some(Reaped::Shutdown));

        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(1);
        let late = reaper.guard(rx, None::<()>, Instant::now() + HOUR, None, None);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(tx.send_data(Bytes::from_static(b"a")).await.is_err());
        assert_eq!(late.reaped_by().get(), Some(Reaped::Shutdown));
        assert_eq!(queued(&reaper), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_shorter_than_the_tasks_sleep_wakes_it_early() {
        let reaper = Reaper::new(HOUR, Signal::new());
        let (_tx1, rx1) = Channel::<Bytes, std::io::Error>::new(1);
        let (mut tx2, rx2) = Channel::<Bytes, std::io::Error>::new(1);
        let _long = reaper.guard(rx1, None::<()>, Instant::now() + HOUR, None, None);
        // The task is asleep until the first stream's look, a quarter of an hour away.
        tokio::time::sleep(Duration::from_millis(10)).await;
        let _short = reaper.guard(
            rx2,
            None::<()>,
            Instant::now() + Duration::from_millis(50),
            None,
            None,
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(
            tx2.send_data(Bytes::from_static(b"a")).await.is_err(),
            "the short stream's upstream is dropped at its deadline"
        );
        assert_eq!(queued(&reaper), 1, "the long one still waits");
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_body_drops_the_upstream_and_the_slot_at_once() {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(1);
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let reaper = Reaper::new(HOUR, Signal::new());
        let body = reaper.guard(
            rx,
            Some(slot(&slots)),
            Instant::now() + Duration::from_secs(600),
            None,
            None,
        );
        let shared = Arc::downgrade(&body.shared);
        drop(body);
        // No yield in between: the reaper task has not run.
        assert_eq!(slots.available_permits(), 1, "slot freed");
        assert_eq!(queued(&reaper), 0, "the stream left the queue");
        assert!(shared.upgrade().is_none(), "nothing holds the stream");
        assert!(
            tx.send_data(Bytes::from_static(b"a")).await.is_err(),
            "upstream dropped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_task_ends_once_the_reaper_and_its_streams_are_gone() {
        let reaper = Reaper::new(SEND, Signal::new());
        let (_tx, rx) = Channel::<Bytes, std::io::Error>::new(1);
        let body = reaper.guard(rx, None::<()>, Instant::now() + HOUR, None, None);
        let wheel = Arc::downgrade(&reaper.wheel);
        tokio::task::yield_now().await;
        drop(reaper);
        // A stream outlives its gateway's reaper (a reload replaced it): still looked at.
        tokio::time::sleep(SEND * 2).await;
        assert!(wheel.upgrade().is_some());
        drop(body);
        tokio::time::sleep(SEND).await;
        assert!(wheel.upgrade().is_none(), "the task let go of the queue");
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_the_client_never_makes_room_for_ends_the_upstream_after_send_timeout() {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(4);
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let reaper = Reaper::new(SEND, Signal::new());
        let mut body = reaper.guard(rx, Some(slot(&slots)), Instant::now() + HOUR, None, None);
        tx.send_data(Bytes::from_static(b"a")).await.unwrap();
        body.frame().await.unwrap().unwrap();

        // The frame is out and nobody asks for the next one: the client is not reading.
        tokio::time::sleep(SEND - Duration::from_millis(10)).await;
        assert_eq!(slots.available_permits(), 0, "not before send_timeout");
        tokio::time::sleep(SEND / CHECKS + Duration::from_millis(20)).await;
        assert_eq!(slots.available_permits(), 1, "slot freed");
        assert!(
            tx.send_data(Bytes::from_static(b"b")).await.is_err(),
            "upstream dropped"
        );
        let err = body.frame().await.unwrap().unwrap_err();
        let why = err.downcast_ref::<ReapedError>().map(|e| e.why);
        assert_eq!(why, Some(Reaped::Stalled(SEND)));
    }

    #[tokio::test(start_paused = true)]
    async fn streams_are_looked_at_on_their_own_clocks() {
        // Two stalled streams, the second opened half a send_timeout after the first: each is
        // reaped a send_timeout (and at most a quarter more) after its own last poll.
        let reaper = Reaper::new(SEND, Signal::new());
        let (mut tx1, rx1) = Channel::<Bytes, std::io::Error>::new(4);
        let (mut tx2, rx2) = Channel::<Bytes, std::io::Error>::new(4);
        let mut first = reaper.guard(rx1, None::<()>, Instant::now() + HOUR, None, None);
        tx1.send_data(Bytes::from_static(b"a")).await.unwrap();
        first.frame().await.unwrap().unwrap();
        tokio::time::sleep(SEND / 2).await;
        let mut second = reaper.guard(rx2, None::<()>, Instant::now() + HOUR, None, None);
        tx2.send_data(Bytes::from_static(b"a")).await.unwrap();
        second.frame().await.unwrap().unwrap();

        tokio::time::sleep(SEND * 3 / 4 + Duration::from_millis(10)).await;
        assert!(
            tx1.send_data(Bytes::from_static(b"b")).await.is_err(),
            "first reaped"
        );
        assert!(
            tx2.send_data(Bytes::from_static(b"b")).await.is_ok(),
            "second not yet"
        );
        tokio::time::sleep(SEND / 2).await;
        assert!(
            tx2.send_data(Bytes::from_static(b"c")).await.is_err(),
            "second reaped"
        );
        assert_eq!(queued(&reaper), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_upstream_or_a_slow_steady_reader_is_not_a_stall() {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(4);
        let reaper = Reaper::new(SEND, Signal::new());
        let body = reaper.guard(rx, None::<()>, Instant::now() + HOUR, None, None);
        tokio::pin!(body);
        // The client waits on a silent upstream: polled, nothing handed out.
        let waited = tokio::time::timeout(SEND * 5, body.frame()).await;
        assert!(waited.is_err(), "no frame came");
        // A client that takes each frame a little under send_timeout after the last.
        for _ in 0..10 {
            tx.send_data(Bytes::from_static(b"x")).await.unwrap();
            body.frame().await.unwrap().unwrap();
            tokio::time::sleep(SEND - Duration::from_millis(50)).await;
        }
        tx.send_data(Bytes::from_static(b"y")).await.unwrap();
        let last = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&last[..], b"y", "still streaming");
    }

    /// Over HTTP/2 a reaped stream counts on its connection as waiting for a poll until the
    /// body is polled (which resets the client's stream) or dropped; one never reaped, never.
    #[tokio::test(start_paused = true)]
    async fn a_reaped_stream_counts_on_its_connection_until_polled_or_dropped() {
        let reaper = Reaper::new(HOUR, Signal::new());
        let streams = crate::http::conn::Streams::default();
        let soon = || Instant::now() + Duration::from_millis(100);
        let (_tx1, rx1) = Channel::<Bytes, std::io::Error>::new(1);
        let (_tx2, rx2) = Channel::<Bytes, std::io::Error>::new(1);
        let (_tx3, rx3) = Channel::<Bytes, std::io::Error>::new(1);
        let mut polled = reaper.guard(rx1, None::<()>, soon(), None, Some(streams.clone()));
        let dropped = reaper.guard(rx2, None::<()>, soon(), None, Some(streams.clone()));
        let early = reaper.guard(rx3, None::<()>, soon(), None, Some(streams.clone()));
        drop(early);
        assert_eq!(streams.unpolled_now(), 0, "not reaped: not counted");
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(streams.unpolled_now(), 2);
        assert!(polled.frame().await.unwrap().is_err());
        assert_eq!(streams.unpolled_now(), 1);
        drop(dropped);
        assert_eq!(streams.unpolled_now(), 0);
        drop(polled);
        assert_eq!(streams.unpolled_now(), 0);
    }

    /// A stream whose client's reading shows only on its socket (HTTP/1: hyper holds frames
    /// it has not written), signalled a quarter late at worst: reads just inside
    /// send_timeout keep its upstream call; once they stop, it is reaped.
    #[tokio::test(start_paused = true)]
    async fn a_sockets_late_signal_of_reading_keeps_the_stream() {
        let (mut tx, rx) = Channel::<Bytes, std::io::Error>::new(4);
        let reaper = Reaper::new(SEND, Signal::new());
        let writes = ClientWrites::default();
        let body = reaper.guard(
            rx,
            None::<()>,
            Instant::now() + HOUR,
            Some(writes.clone()),
            None,
        );
        tokio::pin!(body);
        tx.send_data(Bytes::from_static(b"x")).await.unwrap();
        body.frame().await.unwrap().unwrap();
        // Signals a fifth over send_timeout apart: reads just inside it, seen late.
        for _ in 0..20 {
            tokio::time::sleep(SEND + SEND / 5).await;
            writes.progressed();
        }
        assert!(
            tx.send_data(Bytes::from_static(b"y")).await.is_ok(),
            "reaped"
        );
        tokio::time::sleep(SEND * 2).await;
        tokio::task::yield_now().await;
        assert!(
            tx.send_data(Bytes::from_static(b"z")).await.is_err(),
            "a client that stopped reading kept its upstream call"
        );
    }
}
