//! An HTTP/2 client connection on which nothing can go out any more is closed, so that its
//! streams end.
//!
//! A stream ends for its client when hyper polls its body and finds the end, or the error
//! that resets it. hyper polls a stream's body only while the stream has flow-control window
//! for it, and every stream draws on the connection's window too. A client that gives
//! nothing back (httpx, for the DATA of the streams it abandoned: audit KA 1) closes that
//! window to every stream of the connection, fresh ones too: their upstream calls end at
//! their deadlines (`stream::reaper`), but the client's streams are never reset, and the
//! requests were neither counted nor logged until the client left (104 of them, 8 minutes,
//! with 20 s budgets). The gateway's keep-alive PING every 30 s, which such a client answers,
//! kept its read timeout from firing. hyper can reset no stream from outside its poll, and
//! the connection's window is h2's own, not seen from here.
//!
//! What is seen: the reaper counts, per connection, the streams whose limit it fired while
//! hyper was not polling them, until hyper polls them again ([`Streams::unpolled_now`]); and
//! `h2_idle` counts the DATA the connection writes. A connection all of whose open streams
//! are such streams, and that has written no DATA for `send_timeout`, is stuck: nothing
//! reaches the client, as on an HTTP/1 connection whose client reads nothing for
//! `send_timeout`, and it is closed alike. Not before all are: a stream waiting for its
//! answer writes nothing either, having nothing yet, and closing the connection under it cut
//! a healthy request (audit LA 1). Without window every stream is reaped at its deadline,
//! so the connection ends by its streams' latest deadline (and `send_timeout`) at most.
//! `h2_idle` sends GOAWAY and drops it a `header_read_timeout` later unless DATA flows again
//! meanwhile; dropped, it ends every stream, each counted as its limit (`deadline`,
//! `send_timeout`); a stream opened after the look counts as `send_timeout`, the gateway's
//! closing of the connection, as on HTTP/1.
//!
//! A connection whose other streams still flow writes DATA, and is not closed: there a
//! stream its client gives no window of its own stays reaped and unreset until the client
//! reads it or leaves (hyper offers nothing more), as `docs/security.md` says.

use std::time::Duration;

use tokio::time::Instant;

use crate::http::conn::{ClientWrites, Streams};

/// Watches one HTTP/2 connection for being stuck; looked at by `h2_idle` at each of its
/// looks.
pub struct Stuck {
    send_timeout: Duration,
    /// The connection's writes, marked cut when it is closed as stuck: its requests that end
    /// with it and not by a limit of their own then count as `send_timeout`'s.
    writes: ClientWrites,
    /// The DATA bytes written at the last look, and when they last moved (or when the watch
    /// began).
    data: u64,
    wrote: Instant,
}

impl Stuck {
    pub fn new(send_timeout: Duration, writes: ClientWrites) -> Self {
        Self {
            send_timeout,
            writes,
            data: 0,
            wrote: Instant::now(),
        }
    }

    /// At a look, with `data` the connection's DATA bytes written so far: whether it is
    /// stuck. It then counts as cut, to be closed. DATA that moved since the last look counts
    /// from this one (late, never early).
    pub fn look(&mut self, streams: &Streams, data: u64) -> bool {
        let now = Instant::now();
        if data != self.data {
            self.data = data;
            self.wrote = now;
        }
        // Every open stream reaped and unpolled: a stream still waiting for its answer also
        // writes nothing, for want of anything to write, and a connection closed under it
        // cut a healthy request (audit LA 1). Without window every stream is reaped in time,
        // each at its deadline, so the connection still ends, at the latest one's.
        let unpolled = streams.unpolled_now();
        let stuck =
            unpolled > 0 && unpolled >= streams.open_now() && now - self.wrote >= self.send_timeout;
        if stuck {
            self.writes.cut();
        }
        stuck
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Channel;
    use hyper::server::conn::http2;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use std::sync::{Arc, Mutex};
    use tokio::io::DuplexStream;

    use crate::http::conn::Open;
    use crate::stream::reaper::Reaper;
    use crate::stream::signal::Signal;

    const LIMIT: Duration = Duration::from_secs(1);
    const SEND: Duration = Duration::from_secs(2);

    type Sender = http_body_util::channel::Sender<Bytes, std::io::Error>;

    /// Serves the server's end of an in-memory connection through `h2_idle`, each request
    /// answered 200 with a body the test writes (the next sender on `bodies`), shared with a
    /// reaper as the gateway's are, under the budget its `budget-ms` field gives. Its stream
    /// counts open until the connection ends, as a request's record holds it until its body
    /// is dropped. When the connection ended, and whether it was cut as stuck.
    fn serve(
        io: DuplexStream,
        bodies: tokio::sync::mpsc::UnboundedSender<Sender>,
    ) -> tokio::task::JoinHandle<(Instant, bool)> {
        tokio::spawn(async move {
            let mut builder = http2::Builder::new(TokioExecutor::new());
            builder.timer(TokioTimer::new());
            let graceful = hyper_util::server::graceful::GracefulShutdown::new();
            let reaper = Reaper::new(SEND, Signal::new());
            let writes = ClientWrites::default();
            let held: Arc<Mutex<Vec<Open>>> = Arc::default();
            let service = |streams: Streams| {
                service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let budget = req
                        .headers()
                        .get("budget-ms")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .map_or(Duration::from_secs(3600), Duration::from_millis);
                    let open = streams.open();
                    let conn = open.streams();
                    held.lock().unwrap().push(open);
                    let (tx, rx) = Channel::<Bytes, std::io::Error>::new(4);
                    bodies.send(tx).unwrap();
                    let body =
                        reaper.guard(rx, None::<()>, Instant::now() + budget, None, Some(conn));
                    async move { Ok::<_, std::convert::Infallible>(http::Response::new(body)) }
                })
            };
            let _ = crate::server::h2_idle::serve(
                &builder,
                TokioIo::new(io),
                service,
                LIMIT,
                Instant::now(),
                Signal::new(),
                graceful.watcher(),
                Stuck::new(SEND, writes.clone()),
            )
            .await;
            (Instant::now(), writes.was_cut())
        })
    }

    fn request(budget_ms: u64) -> http::Request<()> {
        http::Request::get("http://localhost/")
            .header("budget-ms", budget_ms)
            .body(())
            .unwrap()
    }

    /// Audit KA 1: one stream takes the connection's whole window (65,535 bytes, never given
    /// back); another, with a shorter budget, gets its head and nothing more. Their deadlines
    /// pass, and the connection, which can write nothing, is closed.
    #[tokio::test(start_paused = true)]
    async fn a_connection_without_window_is_closed_once_a_stream_waits_past_its_limit() {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (bodies_tx, mut bodies) = tokio::sync::mpsc::unbounded_channel();
        let ended = serve(server, bodies_tx);
        let start = Instant::now();
        let (mut client, conn) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .handshake::<_, Bytes>(client)
            .await
            .unwrap();
        tokio::spawn(conn);

        let (big, _) = client.send_request(request(1_000), true).unwrap();
        let mut big_tx = bodies.recv().await.unwrap();
        let mut big = big.await.unwrap().into_body();
        big_tx
            .send_data(Bytes::from(vec![b'x'; 70_000]))
            .await
            .unwrap();
        let mut got = 0;
        while got < 65_535 {
            got += big.data().await.unwrap().unwrap().len();
        }

        let (short, _) = client.send_request(request(500), true).unwrap();
        let mut short_tx = bodies.recv().await.unwrap();
        let short = short.await.unwrap();
        assert_eq!(short.status(), 200);
        short_tx
            .send_data(Bytes::from_static(b"never sent"))
            .await
            .unwrap();

        let (at, cut) = tokio::time::timeout(SEND * 10, ended)
            .await
            .expect("a connection with no window held a stream past its deadline")
            .unwrap();
        // No DATA for send_timeout with a reaped stream, seen at a look, then GOAWAY and a
        // limit for the client to close.
        assert!(
            at - start <= SEND + LIMIT * 3,
            "closed after {:?}",
            at - start
        );
        assert!(cut, "its requests count as send_timeout's");
        drop((big, short));
    }

    /// A served connection whose streams get 1 KiB of window each (the connection its default
    /// 65,535 bytes), and on it a stream with a 500 ms budget sent its window's worth, read
    /// and not given back, then a frame hyper holds for want of window (and so polls the body
    /// no more): reaped at its deadline.
    struct Stalled {
        ended: tokio::task::JoinHandle<(Instant, bool)>,
        client: h2::client::SendRequest<Bytes>,
        bodies: tokio::sync::mpsc::UnboundedReceiver<Sender>,
        stalled: h2::RecvStream,
        first: Bytes,
        /// The stalled stream's upstream end, held open.
        _tx: Sender,
    }

    async fn stalled_beside_others() -> Stalled {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (bodies_tx, mut bodies) = tokio::sync::mpsc::unbounded_channel();
        let ended = serve(server, bodies_tx);
        let (mut client, conn) = h2::client::Builder::new()
            .initial_window_size(1024)
            .handshake::<_, Bytes>(client)
            .await
            .unwrap();
        tokio::spawn(conn);
        let (stalled, _) = client.send_request(request(500), true).unwrap();
        let mut tx = bodies.recv().await.unwrap();
        let mut stalled = stalled.await.unwrap().into_body();
        tx.send_data(Bytes::from(vec![b'x'; 1024])).await.unwrap();
        let first = stalled.data().await.unwrap().unwrap();
        tx.send_data(Bytes::from(vec![b'y'; 300])).await.unwrap();
        Stalled {
            ended,
            client,
            bodies,
            stalled,
            first,
            _tx: tx,
        }
    }

    /// One stream its client gives no window, reaped, while another flows: the connection
    /// writes DATA and stays, and the reaped stream is reset once its client reads it.
    #[tokio::test(start_paused = true)]
    async fn a_stream_without_window_does_not_close_a_connection_whose_others_flow() {
        let Stalled {
            ended,
            mut client,
            mut bodies,
            mut stalled,
            first,
            _tx,
        } = stalled_beside_others().await;

        // Another stream, read all along. 300 bytes a frame: h2's client counts frames under
        // 256 bytes against a budget.
        let (flowing, _) = client.send_request(request(3_600_000), true).unwrap();
        let mut flowing_tx = bodies.recv().await.unwrap();
        let mut flowing = flowing.await.unwrap().into_body();
        tokio::spawn(async move {
            while flowing_tx
                .send_data(Bytes::from(vec![b't'; 300]))
                .await
                .is_ok()
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let reader = tokio::spawn(async move {
            while let Some(Ok(chunk)) = flowing.data().await {
                flowing
                    .flow_control()
                    .release_capacity(chunk.len())
                    .unwrap();
            }
        });

        // Five send_timeouts past the stalled stream's deadline: still open.
        tokio::time::sleep(SEND * 5).await;
        assert!(!ended.is_finished(), "closed while a stream flowed");

        // Read again, the stalled stream finds its upstream gone: reset with CANCEL (which
        // drops the frame h2 held for it).
        stalled
            .flow_control()
            .release_capacity(first.len())
            .unwrap();
        let end = loop {
            match stalled.data().await {
                Some(Ok(chunk)) => stalled
                    .flow_control()
                    .release_capacity(chunk.len())
                    .unwrap(),
                Some(Err(e)) => break e.reason(),
                None => break None,
            }
        };
        assert_eq!(end, Some(h2::Reason::CANCEL));
        assert!(!ended.is_finished());
        assert!(!reader.is_finished(), "the other stream still flows");
    }

    /// Audit LA 1: one stream past its limit and never polled again, another waiting for its
    /// answer (a slow first token, a long document): the connection writes nothing because
    /// the second has nothing yet, not because it cannot. It stays open, and the waiting
    /// stream gets its answer when it comes.
    #[tokio::test(start_paused = true)]
    async fn a_stream_waiting_for_its_answer_keeps_a_connection_with_a_reaped_one() {
        let Stalled {
            ended,
            mut client,
            mut bodies,
            stalled: _stalled,
            first: _,
            _tx,
        } = stalled_beside_others().await;

        // The other's head came; its first token takes five send_timeouts.
        let (waiting, _) = client.send_request(request(3_600_000), true).unwrap();
        let mut waiting_tx = bodies.recv().await.unwrap();
        let mut waiting = waiting.await.unwrap().into_body();
        tokio::time::sleep(SEND * 5).await;
        assert!(
            !ended.is_finished(),
            "closed while a stream waited for its answer"
        );
        waiting_tx
            .send_data(Bytes::from_static(b"at last"))
            .await
            .unwrap();
        assert_eq!(&waiting.data().await.unwrap().unwrap()[..], b"at last");
    }
}
